/*
 * The NVFP4 operands of the 4-bit methods sage4 / vc4 (qvc_ops4 in
 * cuda_internal.h): qvc_ops4_alloc / free and qvc_prep4, with their
 * kernels.  qvi_quant_nvfp4_rows / _cols of the CPU, bit for bit.  The
 * per-head tensor scale g needs the amax of the whole prepared head first,
 * so each operand takes two launches: an amax pass (atomicMax of the float
 * bits: non-negative floats order like their bit patterns) and an encode
 * pass.  The rows are those of the 8-bit path (qk.cu's qk_row4: gathered,
 * smoothed, rotated), loaded here with a lane per channel (qk_row, below),
 * the layout of the NVFP4 groups of 16 channels; V reuses v_stats_kernel of v.cu (block means,
 * residual amax).  amax[bh*3 + slot], slot 0/1/2 = Q/K/V; g likewise.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "prep_common.cuh"

/* The per-lane channel constants of qk_row (K mean, Hadamard signs). */
template <int NC>
static __device__ __forceinline__ void qk_lane_consts(const qk_params &p, int bh, float *mu,
                                                      float *sg) {
    const int lane = threadIdx.x & 31, D = (int)p.x.D;
#pragma unroll
    for (int j = 0; j < NC; ++j) {
        const int c = lane + 32 * j;
        mu[j] = (p.mean && c < D) ? p.mean[(int64_t)bh * D + c] : 0.0f;
        sg[j] = (p.signs && c < D) ? p.signs[c] : 1.0f;
    }
}

/*
 * Row i of the block, as the CPU has it just before quantization: loaded,
 * smoothed (K), rotated (if hadamard).  Deterministic, so the two passes
 * of qk_quant_kernel see identical values.  Lane = channel lane + 32 j.
 */
template <int DT, int NC>
static __device__ __forceinline__ void qk_row(const qk_params &p, int64_t base, int bh, int i,
                                              const float *mu, const float *sg, float *x) {
    const int lane = threadIdx.x & 31, D = (int)p.x.D;
    const bool valid = i < p.n; /* warp-uniform */
    const int64_t row = valid ? base + src_row(p.perm, bh, p.n, i) * p.x.sn : 0;
#pragma unroll
    for (int j = 0; j < NC; ++j) {
        const int c = lane + 32 * j;
        x[j] = (valid && c < D) ? qvc_ld<DT>(p.x.data, row + c) : 0.0f;
    }
    if (!valid) return; /* padding rows stay +0 (a sign flip would give -0) */
    if (p.mean) {
#pragma unroll
        for (int j = 0; j < NC; ++j)
            if (lane + 32 * j < D) x[j] = __fsub_rn(x[j], mu[j]);
    }
    if (p.hadamard) {
#pragma unroll
        for (int j = 0; j < NC; ++j) x[j] = __fmul_rn(x[j], sg[j]);
        /* Strides 1..16 live across lanes: the lane without bit h holds a
         * (gets a + b), its partner holds b (gets a - b). */
        for (int h = 1; h < 32 && h < D; h <<= 1) {
#pragma unroll
            for (int j = 0; j < NC; ++j) {
                const float o = __shfl_xor_sync(FULL_MASK, x[j], h);
                x[j] = (lane & h) ? __fsub_rn(o, x[j]) : __fadd_rn(x[j], o);
            }
        }
        /* Strides 32 and 64 pair registers j and j + h/32. */
        if (D > 32) {
#pragma unroll
            for (int j = 0; j + 1 < NC; ++j)
                if (!(j & 1)) butterfly(x[j], x[j + 1]);
        }
        if (D > 64) {
#pragma unroll
            for (int j = 0; j + 2 < NC; ++j)
                if (!(j & 2)) butterfly(x[j], x[j + 2]);
        }
#pragma unroll
        for (int j = 0; j < NC; ++j) x[j] = __fmul_rn(x[j], p.had_scale);
    }
}

template <int DT, int NC>
__global__ void __launch_bounds__(PREP_THREADS)
nvfp4_qk_amax_kernel(qk_params p, unsigned *amax, int slot) {
    __shared__ float red[PREP_WARPS];
    const int blk = blockIdx.x, bh = blockIdx.y, warp = threadIdx.x >> 5;
    const int64_t base = qvc_head_base(p.x, bh);
    const int r0 = blk * QVI_BLOCK + warp * ROWS_PER_WARP;
    float mu[NC], sg[NC];
    qk_lane_consts<NC>(p, bh, mu, sg);
    float m = 0.0f;
#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float x[NC];
        qk_row<DT, NC>(p, base, bh, r0 + r, mu, sg, x);
#pragma unroll
        for (int j = 0; j < NC; ++j) m = fmaxf(m, fabsf(x[j])); /* fmaxf skips NaN, as the CPU */
    }
    m = block_max(m, red);
    if (threadIdx.x == 0) atomicMax(amax + bh * 3 + slot, __float_as_uint(m));
}

/* One group of 16 (amax ga, over the lanes or rows of the group) given g,
 * as nvfp4_group() of the CPU: the scale code sc = e4m3(ga / (6.0f*g)),
 * sigma = its value, and the divisor g*sigma; *zero when sigma == 0, which
 * zeroes the group's codes. */
static __device__ __forceinline__ float nvfp4_group_scale(float ga, float g, uint32_t *sc,
                                                          bool *zero) {
    *sc = qvc_e4m3_code(__fdiv_rn(ga, __fmul_rn(6.0f, g)));
    const float sigma = qvc_e4m3_value(*sc);
    *zero = sigma == 0.0f;
    return __fmul_rn(g, sigma);
}

static __device__ __forceinline__ uint32_t nvfp4_code(float x, float denom, bool zero) {
    return zero ? 0u : qvc_e2m1_code(__fdiv_rn(x, denom));
}

/* Groups of 16 channels of each row: lanes 0-15 / 16-31 of register j form
 * one group (D is a multiple of 32). */
template <int DT, int NC>
__global__ void __launch_bounds__(PREP_THREADS)
nvfp4_qk_encode_kernel(qk_params p, const unsigned *amax, int slot, float *g_out,
                       uint8_t *codes, uint8_t *scodes) {
    const int blk = blockIdx.x, bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.x.D;
    const int64_t base = qvc_head_base(p.x, bh);
    const int r0 = blk * QVI_BLOCK + warp * ROWS_PER_WARP;
    const float g = qvc_nvfp4_tensor_scale(__uint_as_float(amax[bh * 3 + slot]));
    if (blk == 0 && threadIdx.x == 0) g_out[bh * 3 + slot] = g;
    float mu[NC], sg[NC];
    qk_lane_consts<NC>(p, bh, mu, sg);
#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float x[NC];
        qk_row<DT, NC>(p, base, bh, r0 + r, mu, sg, x);
        const int64_t row = (int64_t)bh * p.n_pad + r0 + r;
        uint8_t *crow = codes + row * (D / 2), *srow = scodes + row * (D / 16);
#pragma unroll
        for (int j = 0; j < NC; ++j) {
            const int c = lane + 32 * j;
            float ga = fabsf(x[j]);
#pragma unroll
            for (int o = 1; o < 16; o <<= 1) ga = fmaxf(ga, __shfl_xor_sync(FULL_MASK, ga, o));
            uint32_t sc;
            bool zero;
            const float denom = nvfp4_group_scale(ga, g, &sc, &zero);
            const uint32_t code = nvfp4_code(x[j], denom, zero);
            const uint32_t hi = __shfl_down_sync(FULL_MASK, code, 1);
            if (!(lane & 1)) crow[c >> 1] = (uint8_t)(code | (hi << 4));
            if (!(lane & 15)) srow[c >> 4] = (uint8_t)sc;
        }
    }
}

/* V: head amax from the per-block residual amax of v_stats_kernel, and
 * the vc4 means fp16(mu) (raw, not divided by a scale). Thread per (bh, c). */
__global__ void nvfp4_v_amax_kernel(int BH, int D, int nblk, const float *bmu, const float *bamax,
                                    unsigned *amax, float *mu) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)BH * D) return;
    const int bh = (int)(t / D), c = (int)(t % D);
    const int64_t o0 = (int64_t)bh * nblk * D + c;
    float m = 0.0f;
    for (int j = 0; j < nblk; ++j) {
        m = fmaxf(m, bamax[o0 + (int64_t)j * D]);
        if (mu) mu[o0 + (int64_t)j * D] = round_f16(bmu[o0 + (int64_t)j * D]);
    }
    atomicMax(amax + bh * 3 + 2, __float_as_uint(m));
}

/* V codes: one CTA per (128-key block, bh); a task is a pair of channels
 * (c, c+1) over a group of 16 keys, so it writes whole code bytes. */
template <int DT>
__global__ void __launch_bounds__(PREP_THREADS)
nvfp4_v_encode_kernel(qvc_view v, const int32_t *perm, int n, int nk_pad, int nblk, int demean,
                      const float *bmu, const unsigned *amax, float *g_out, uint8_t *codes,
                      uint8_t *scodes) {
    const int blk = blockIdx.x, bh = blockIdx.y, D = (int)v.D;
    const int64_t base = qvc_head_base(v, bh);
    const float g = qvc_nvfp4_tensor_scale(__uint_as_float(amax[bh * 3 + 2]));
    if (blk == 0 && threadIdx.x == 0) g_out[bh * 3 + 2] = g;
    const int pairs = D / 2;
    for (int t = threadIdx.x; t < (QVI_BLOCK / 16) * pairs; t += PREP_THREADS) {
        const int cp = t % pairs, grp = t / pairs, c = 2 * cp;
        const int i0 = blk * QVI_BLOCK + grp * 16;
        const float *m = bmu + ((int64_t)bh * nblk + blk) * D + c;
        const float m0 = demean ? m[0] : 0.0f, m1 = demean ? m[1] : 0.0f;
        float x0[16], x1[16];
        float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            const int i = i0 + u;
            x0[u] = x1[u] = 0.0f; /* padding keys stay +0, never demeaned */
            if (i < n) {
                const int64_t row = base + src_row(perm, bh, n, i) * v.sn;
                x0[u] = qvc_ld<DT>(v.data, row + c);
                x1[u] = qvc_ld<DT>(v.data, row + c + 1);
                if (demean) x0[u] = __fsub_rn(x0[u], m0), x1[u] = __fsub_rn(x1[u], m1);
            }
            a0 = fmaxf(a0, fabsf(x0[u]));
            a1 = fmaxf(a1, fabsf(x1[u]));
        }
        uint32_t s0, s1;
        bool z0, z1;
        const float d0 = nvfp4_group_scale(a0, g, &s0, &z0), d1 = nvfp4_group_scale(a1, g, &s1, &z1);
        uint8_t *crow = codes + ((int64_t)bh * nk_pad + i0) * (D / 2) + cp;
#pragma unroll
        for (int u = 0; u < 16; ++u)
            crow[(int64_t)u * (D / 2)] =
                (uint8_t)(nvfp4_code(x0[u], d0, z0) | (nvfp4_code(x1[u], d1, z1) << 4));
        uint8_t *srow = scodes + ((int64_t)bh * (nk_pad / 16) + blk * (QVI_BLOCK / 16) + grp) * D + c;
        srow[0] = (uint8_t)s0;
        srow[1] = (uint8_t)s1;
    }
}

extern "C" qva_status qvc_ops4_alloc(qvc_ops4 *ops, int BH, int nq, int nk, int D, int with_mu) {
    if (!ops) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_ops4_alloc: ops is NULL");
    memset(ops, 0, sizeof *ops);
    if (BH < 1 || nq < 1 || nk < 1 || (D != 64 && D != 128))
        return qvi_fail(QVA_ERR_SHAPE, "qvc_ops4_alloc: bad shape BH=%d nq=%d nk=%d D=%d", BH, nq,
                        nk, D);
    ops->BH = BH;
    ops->nq = nq;
    ops->nk = nk;
    ops->D = D;
    ops->nq_pad = qvi_cdiv(nq, QVI_BLOCK) * QVI_BLOCK;
    ops->nk_pad = qvi_cdiv(nk, QVI_BLOCK) * QVI_BLOCK;
    ops->nblk = ops->nk_pad / QVI_BLOCK;
    const size_t bh = (size_t)BH, d = (size_t)D, nqp = (size_t)ops->nq_pad,
                 nkp = (size_t)ops->nk_pad;
    const qvc_alloc req[] = {
        {(void **)&ops->q, bh * nqp * d / 2},
        {(void **)&ops->q_sc, bh * nqp * d / 16},
        {(void **)&ops->k, bh * nkp * d / 2},
        {(void **)&ops->k_sc, bh * nkp * d / 16},
        {(void **)&ops->v, bh * nkp * d / 2},
        {(void **)&ops->v_sc, bh * (nkp / 16) * d},
        {(void **)&ops->g, bh * 3 * sizeof(float)},
        {(void **)&ops->mu, with_mu ? bh * (size_t)ops->nblk * d * sizeof(float) : 0},
    };
    qva_status st = qvc_malloc_all(req, sizeof req / sizeof req[0], "qvc_ops4_alloc: cudaMalloc");
    if (st != QVA_OK) qvc_ops4_free(ops);
    return st;
}

extern "C" void qvc_ops4_free(qvc_ops4 *ops) {
    if (!ops) return;
    void *ptrs[] = {ops->q, ops->q_sc, ops->k, ops->k_sc, ops->v, ops->v_sc, ops->g, ops->mu};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(ops, 0, sizeof *ops);
}

template <int DT>
static void launch_nvfp4_qk_dt(const qk_params &p, dim3 grid, int D, unsigned *amax, int slot,
                               float *g, uint8_t *codes, uint8_t *scodes, cudaStream_t st) {
    if (D == 64) {
        nvfp4_qk_amax_kernel<DT, 2><<<grid, PREP_THREADS, 0, st>>>(p, amax, slot);
        nvfp4_qk_encode_kernel<DT, 2><<<grid, PREP_THREADS, 0, st>>>(p, amax, slot, g, codes, scodes);
    } else {
        nvfp4_qk_amax_kernel<DT, 4><<<grid, PREP_THREADS, 0, st>>>(p, amax, slot);
        nvfp4_qk_encode_kernel<DT, 4><<<grid, PREP_THREADS, 0, st>>>(p, amax, slot, g, codes, scodes);
    }
}

/* Both passes of one Q or K operand (amax[bh*3 + slot] must be 0). */
static qva_status launch_nvfp4_qk(const qk_params &p, int BH, int D, unsigned *amax, int slot,
                                  float *g, uint8_t *codes, uint8_t *scodes, cudaStream_t st,
                                  const char *what) {
    dim3 grid(p.n_pad / QVI_BLOCK, BH);
    QVC_DISPATCH_DTYPE(p.x.dtype, launch_nvfp4_qk_dt<DT_>(p, grid, D, amax, slot, g, codes, scodes, st));
    return qvc_launch_check(what);
}

extern "C" qva_status qvc_prep4(const qvc_view *q, const qvc_view *k, const qvc_view *v,
                                const qvc_prep_args *a, qvc_ops4 *ops, cudaStream_t st) {
    qva_status s;
    if (!ops || !ops->q)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep4: NULL or unallocated ops");
    if ((s = qvc_prep_check_views("qvc_prep4", q, k, v, a, ops->BH, ops->nq, ops->nk, ops->D)))
        return s;
    const int D = ops->D, BH = ops->BH, nq = ops->nq, nk = ops->nk, nblk = ops->nblk;
    if (D != 64 && D != 128) return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep4: head dim %d", D);
    if (a->demean && !ops->mu)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep4: demean needs ops allocated with_mu");
    if (a->lse_shift && !a->smooth_k)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep4: lse_shift needs smooth_k");

    /* Temporaries: K channel mean [BH][D], V block means and residual
     * amax [BH][nblk][D], head amax [BH][3]; one stream-ordered block. */
    const size_t mean_b = align256((size_t)BH * D * sizeof(float));
    const size_t stat_b = align256((size_t)BH * nblk * D * sizeof(float));
    const size_t amax_b = align256((size_t)BH * 3 * sizeof(unsigned));
    char *tmp = NULL;
    cudaError_t e = cudaMallocAsync((void **)&tmp, mean_b + 2 * stat_b + amax_b, st);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "qvc_prep4: cudaMallocAsync");
    float *kmean = a->smooth_k ? (float *)tmp : NULL;
    float *bmu = (float *)(tmp + mean_b), *bamax = (float *)(tmp + mean_b + stat_b);
    unsigned *amax = (unsigned *)(tmp + mean_b + 2 * stat_b);
    s = QVA_OK;
    if ((e = cudaMemsetAsync(amax, 0, (size_t)BH * 3 * sizeof(unsigned), st)) != cudaSuccess)
        s = qvc_cuda_fail(e, "qvc_prep4: cudaMemsetAsync");

    qk_params p;
    memset(&p, 0, sizeof p);
    p.signs = a->had_signs;
    p.hadamard = a->hadamard;
    p.had_scale = (float)(1.0 / sqrt((double)D));

    /* Q: loaded (and rotated), no permutation, no smoothing. */
    p.x = *q;
    p.n = nq;
    p.n_pad = ops->nq_pad;
    if (s == QVA_OK)
        s = launch_nvfp4_qk(p, BH, D, amax, 0, ops->g, ops->q, ops->q_sc, st, "qvc_prep4: Q");

    /* K' = K[perm] minus its channel mean (and the LSE shift it causes),
     * then rotated. */
    if (s == QVA_OK) s = qvc_prep_ksmooth(q, k, a, nk, BH, kmean, qvc_block_ext{NULL, NULL}, NULL, st);
    if (s == QVA_OK) {
        p.x = *k;
        p.perm = a->perm;
        p.mean = kmean;
        p.n = nk;
        p.n_pad = ops->nk_pad;
        s = launch_nvfp4_qk(p, BH, D, amax, 1, ops->g, ops->k, ops->k_sc, st, "qvc_prep4: K");
    }

    /* V' = V[perm], block-demeaned for vc4; groups of 16 keys per channel. */
    if (s == QVA_OK) {
        s = qvc_prep_v_stats(v, a->perm, nk, nblk, BH, a->demean, bmu, bamax, st,
                             "qvc_prep4: V stats");
    }
    if (s == QVA_OK) {
        const int64_t t = (int64_t)BH * D;
        nvfp4_v_amax_kernel<<<(unsigned)((t + 127) / 128), 128, 0, st>>>(
            BH, D, nblk, bmu, bamax, amax, a->demean ? ops->mu : NULL);
        s = qvc_launch_check("qvc_prep4: V amax");
    }
    if (s == QVA_OK) {
        QVC_DISPATCH_DTYPE(v->dtype, (nvfp4_v_encode_kernel<DT_><<<dim3(nblk, BH), PREP_THREADS, 0, st>>>(
                                     *v, a->perm, nk, ops->nk_pad, nblk, a->demean, bmu, amax,
                                     ops->g, ops->v, ops->v_sc)));
        s = qvc_launch_check("qvc_prep4: V encode");
    }

    if ((e = cudaFreeAsync(tmp, st)) != cudaSuccess && s == QVA_OK)
        s = qvc_cuda_fail(e, "qvc_prep4: cudaFreeAsync");
    return s;
}
