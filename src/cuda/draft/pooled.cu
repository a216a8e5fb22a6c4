/*
 * draft +pooled on the GPU (docs/DRAFT.md, "The skipped pairs, pooled";
 * beyond DraftAttention2): each region pair (a, b) the route skips enters
 * the rows of query region a as count_b keys at region b's mean key with
 * its mean value.  The CPU reference walks those keys last, inside the
 * row's online softmax; here an unfused pass after the phased kernel does
 * the same walk with its own running max and merges it into the kept part
 * through the LSE, so the phased kernels stay as they are:
 *
 *   producer  region b's mean key and value to shared memory, 16 regions
 *             at a time (the router's kavg, in its channel slots; V pooled
 *             here as the CPU pools it)
 *   mainloop  one thread per query row of region a: the score
 *             q16 . kavg_b * scale_log2 + log2(count_b) (the dot in four
 *             FMA chains, not the CPU's order), the running max,
 *             p = exp2(s - m) in FP32 for l and rounded to 16 bits for the
 *             value sum (the CPU's qvi_pv_16)
 *   epilogue  the kept part's O and LSE (what the phased kernel wrote) and
 *             the pooled part meet as two softmax partials: weights
 *             2^(L_k - M) and 2^(L_p - M), M their max
 *
 * The merge reads the kept O back in the output's dtype, so a 16-bit
 * output is rounded twice (within docs/NUMERICS.md §Tolerances' draft
 * entry).  Cost: 4 N R_skip D FLOPs per head on the FP32 pipe (about
 * 1/128 of dense attention's, at 1/15 of the tensor cores' rate), which is
 * why this is a pass for measuring the fidelity of +pooled and not yet a
 * fused phase (bench/RESULTS.md has its time).
 */
#include "common/device_util.cuh"
#include "draft_internal.h"

#define PL_TILE 16 /* key regions staged per shared-memory fill */

typedef struct pl_args {
    const uint16_t *q16;  /* [BH][n_pack][D] */
    const float *kavg;    /* [BH][R][D], qvc_dr_kslot channel order */
    const float *vavg;    /* [BH][R][D] */
    const uint8_t *prec;  /* [BH][R][R], 0 = skipped */
    const int32_t *count, *pack;
    int R, H;
    int64_t n_pack, prefix_pad;
    float scale_log2;
    void *out;
    int out_dtype;
    int64_t osb, osh, osn;
    float *lse; /* the kept part's LSE in, the whole row's out */
    int64_t lsb, lsh, lsn;
} pl_args;

template <int F16>
static __device__ __forceinline__ float pl_half(uint32_t bits) {
    if (F16) return __half2float(__ushort_as_half((unsigned short)bits));
    return __uint_as_float(bits << 16);
}

static __device__ __forceinline__ float pl_round16(float x, int f16) {
    return f16 ? __half2float(__float2half_rn(x)) : __bfloat162float(__float2bfloat16_rn(x));
}

static __device__ __forceinline__ float pl_load_out(const void *out, int dtype, int64_t off) {
    if (dtype == QVA_F32) return ((const float *)out)[off];
    if (dtype == QVA_BF16) return __bfloat162float(((const __nv_bfloat16 *)out)[off]);
    return __half2float(((const __half *)out)[off]);
}

/* The row's pooled softmax state (log2 domain, as the CPU's qvi_row). */
template <int D>
struct pl_row {
    float m, l;
    float acc[D];
};

/* Producer: regions b0 .. b0 + PL_TILE - 1 of head bh, the skipped ones. */
template <int D>
static __device__ __forceinline__ void pl_stage(const pl_args &p, int bh, int a, int b0,
                                                float (*ks)[D], float (*vs)[D], float *lg) {
    const int64_t hr = (int64_t)bh * p.R;
    for (int i = threadIdx.x; i < PL_TILE; i += blockDim.x) {
        const int b = b0 + i; /* -inf: not a skipped region */
        lg[i] = b < p.R && p.prec[(hr + a) * p.R + b] == 0 ? log2f((float)__ldg(p.count + b))
                                                          : -INFINITY;
    }
    for (int i = threadIdx.x; i < PL_TILE * D; i += blockDim.x) {
        const int t = i / D, c = i % D, b = b0 + t;
        const bool in = b < p.R;
        ks[t][c] = in ? __ldg(p.kavg + (hr + b) * D + qvc_dr_kslot(c, D)) : 0.0f;
        vs[t][c] = in ? __ldg(p.vavg + (hr + b) * D + c) : 0.0f;
    }
}

/* Mainloop step: one pooled key (lg = log2 of its count) into the row:
 * the CPU's qvi_scores_f32 (+ lg), qvi_row_raise_max and qvi_pv_16. */
template <int D, int F16>
static __device__ __forceinline__ void pl_key(pl_row<D> &r, const uint32_t (&qh)[D / 2],
                                              const float *k, const float *v, float lg,
                                              float scale_log2) {
    /* four FMA chains, not the CPU's one sum in channel order: the one
     * chain made the pass latency-bound (the rounding stays within the
     * draft tolerance, test_backend) */
    float d4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < D / 2; c += 2) {
        d4[0] = __fmaf_rn(pl_half<F16>(qh[c] & 0xffffu), k[2 * c], d4[0]);
        d4[1] = __fmaf_rn(pl_half<F16>(qh[c] >> 16), k[2 * c + 1], d4[1]);
        d4[2] = __fmaf_rn(pl_half<F16>(qh[c + 1] & 0xffffu), k[2 * c + 2], d4[2]);
        d4[3] = __fmaf_rn(pl_half<F16>(qh[c + 1] >> 16), k[2 * c + 3], d4[3]);
    }
    const float dot = (d4[0] + d4[1]) + (d4[2] + d4[3]);
    const float s = __fadd_rn(__fmul_rn(dot, scale_log2), lg);
    if (s > r.m) {
        if (r.m != -INFINITY) {
            const float alpha = exp2f(r.m - s);
            r.l = __fmul_rn(r.l, alpha);
#pragma unroll
            for (int c = 0; c < D; ++c) r.acc[c] = __fmul_rn(r.acc[c], alpha);
        }
        r.m = s;
    }
    if (r.m == -INFINITY || s == -INFINITY) return;
    const float pw = exp2f(__fsub_rn(s, r.m));
    r.l = __fadd_rn(r.l, pw);
    const float pr = pl_round16(pw, F16);
#pragma unroll
    for (int c = 0; c < D; ++c) r.acc[c] = __fadd_rn(r.acc[c], __fmul_rn(pr, v[c]));
}

/* Epilogue: the kept part (O_k, L_k) and the pooled one merged. */
template <int D>
static __device__ __forceinline__ void pl_merge(const pl_args &p, const pl_row<D> &r, int bh,
                                                int64_t orig) {
    if (r.m == -INFINITY) return; /* nothing skipped: the kept part is the row */
    const int b = bh / p.H, h = bh % p.H;
    float *lse = p.lse + b * p.lsb + h * p.lsh + orig * p.lsn;
    const float lk = *lse * 1.44269504088896341f; /* natural -> log2 */
    const float lp = r.m + log2f(r.l);
    const float mx = fmaxf(lk, lp);                /* lk = -inf: an empty kept part */
    const float wk = exp2f(lk - mx), wp = exp2f(lp - mx), tot = wk + wp;
    const int64_t base = b * p.osb + h * p.osh + orig * p.osn;
    const float fk = wk / tot, fp = wp / (tot * r.l);
#pragma unroll
    for (int c = 0; c < D; ++c) {
        const float ok = fk == 0.0f ? 0.0f : pl_load_out(p.out, p.out_dtype, base + c);
        qvc_store_out(p.out, p.out_dtype, base + c, ok * fk + r.acc[c] * fp);
    }
    *lse = (mx + log2f(tot)) * 0.69314718055994531f;
}

template <int D, int F16>
__global__ void __launch_bounds__(DG_KEYS) dg_pooled_kernel(pl_args p) {
    __shared__ float ks[PL_TILE][D], vs[PL_TILE][D];
    __shared__ float lg[PL_TILE];
    const int a = blockIdx.x, bh = blockIdx.y, i = threadIdx.x;
    const bool live = i < __ldg(p.count + a);
    const int64_t slot = p.prefix_pad + (int64_t)a * DG_KEYS + i;
    uint32_t qh[D / 2];
    const uint32_t *qg = (const uint32_t *)(p.q16 + ((int64_t)bh * p.n_pack + slot) * D);
#pragma unroll
    for (int c = 0; c < D / 2; ++c) qh[c] = live ? __ldg(qg + c) : 0u;
    pl_row<D> r;
    r.m = -INFINITY, r.l = 0.0f;
#pragma unroll
    for (int c = 0; c < D; ++c) r.acc[c] = 0.0f;
    for (int b0 = 0; b0 < p.R; b0 += PL_TILE) {
        __syncthreads(); /* the previous tile is consumed */
        pl_stage<D>(p, bh, a, b0, ks, vs, lg);
        __syncthreads();
        if (!live) continue;
        for (int t = 0; t < PL_TILE; ++t)
            if (lg[t] != -INFINITY) pl_key<D, F16>(r, qh, ks[t], vs[t], lg[t], p.scale_log2);
    }
    if (live) pl_merge<D>(p, r, bh, __ldg(p.pack + slot));
}

template <int D>
static void pl_launch(const pl_args &p, int BH, int f16, cudaStream_t st) {
    const dim3 grid((unsigned)p.R, (unsigned)BH);
    if (f16)
        dg_pooled_kernel<D, 1><<<grid, DG_KEYS, 0, st>>>(p);
    else
        dg_pooled_kernel<D, 0><<<grid, DG_KEYS, 0, st>>>(p);
}

void dg_pooled_free(dg_pooled_buf *b) {
    void *ptrs[] = {b->vavg, b->vmax, b->lse};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(b, 0, sizeof *b);
}

qva_status dg_pooled_ensure(dg_pooled_buf *b, int BH, int R, int D, int64_t n) {
    if (b->vavg && b->BH == BH && b->R == R && b->D == D && b->n == n) return QVA_OK;
    dg_pooled_free(b);
    const size_t rd = (size_t)BH * (size_t)R * (size_t)D * sizeof(float);
    cudaError_t e = cudaMalloc(&b->vavg, rd);
    if (e == cudaSuccess) e = cudaMalloc(&b->vmax, rd);
    if (e == cudaSuccess) e = cudaMalloc(&b->lse, (size_t)BH * (size_t)n * sizeof(float));
    if (e != cudaSuccess) {
        dg_pooled_free(b);
        return qvc_cuda_fail(e, "draft +pooled: buffers");
    }
    b->BH = BH, b->R = R, b->D = D, b->n = n;
    return QVA_OK;
}

qva_status dg_pooled_merge(const dg_pooled_buf *b, const qvc_view *v, const qvc_draft_layout *L,
                           const qvc_draft_route_buf *route, const dg_ops *ops,
                           const qvc_attn_args *a, int f16, cudaStream_t st) {
    if (!a->lse) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "draft +pooled: no kept-part LSE");
    qva_status r = qvc_draft_pool16(v, L, b->BH, b->vavg, b->vmax, 0, st);
    if (r != QVA_OK) return r;
    pl_args p;
    memset(&p, 0, sizeof p);
    p.q16 = ops->q16, p.kavg = route->kavg, p.vavg = b->vavg, p.prec = route->prec;
    p.count = L->count, p.pack = L->pack_to_orig;
    p.R = L->regions, p.H = a->H;
    p.n_pack = L->n_pack, p.prefix_pad = L->prefix_pad;
    p.scale_log2 = a->scale_log2;
    p.out = a->out, p.out_dtype = a->out_dtype;
    p.osb = a->osb, p.osh = a->osh, p.osn = a->osn;
    p.lse = a->lse, p.lsb = a->lsb, p.lsh = a->lsh, p.lsn = a->lsn;
    if (b->D == 64)
        pl_launch<64>(p, b->BH, f16, st);
    else
        pl_launch<128>(p, b->BH, f16, st);
    return qvc_launch_check("draft +pooled");
}
