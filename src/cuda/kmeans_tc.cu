/*
 * The k-means assignment on the tensor cores, certified against the CPU's
 * distances (qvi_kmeans, src/cpu/kmeans.c: FP32 sums of (x - c)^2 in
 * channel order, no FMA, ties to the lower index), for bf16 V with k <= 32
 * centroids and D 64 or 128: the common V-Smooth call.
 *
 * Why: the exact assignment (kmeans.cu) is bound by its FP32 adds (3 per
 * token, centroid and channel); here the tensor cores give every
 * distance, and the few tokens whose nearest centroid those cannot decide
 * are redone the CPU's way.
 *
 * For a token x (bf16, so exact) and a centroid c (FP32, split c = hi +
 * mid + lo + r into bf16 parts, each the rounding of what the previous
 * left, |r| <= 2^-27 |c|):
 *   S_k = x . (hi + mid + lo)  mma.sync m16n8k16 bf16: per 16 channels the
 *                              three products chained from zero, the 8 (or
 *                              4) partials added in FP32 on the CUDA cores
 *   a_k = |x|^2 + |c_k|^2 - 2 S_k   (FP64; |x|^2, |c_k|^2 exact enough in FP64)
 * The products are exact.  Assuming, as for sm_90's BF16 MMA with FP32
 * accumulation, that an MMA aligns its 16 products and its C to the
 * largest of them with at least 24 bits and truncates (published models
 * of the tensor cores; FP8's narrower accumulator is another path), each
 * addend loses less than 2^-23 of the largest and the final normalisation
 * another 2^-23 of the sum: at most 18 units of 2^-23 of the addends'
 * absolute sum per MMA.  A 16-channel chain of three MMAs (C the previous
 * partial) then errs by at most 54 2^-23 (6.4e-6) of its products'
 * absolute sum, the FP32 adds of the partials by 8 2^-24 more, the split
 * by 2^-27: |S_k - x.c_k| is under 7e-6 |x||c_k|.  The bound used is 1e-5
 * (KMT_EPS_S), so
 *   |a_k - d_k| <= E = 2e-5 |x| max_k|c_k| + 1e-12 (|x|^2 + max_k|c_k|^2) + 1e-30
 * for the true squared distance d_k (the last term: bf16 or FP32 values the
 * tensor core may flush to zero).  The CPU's FP32 value d^_k is within
 * g d_k + s of d_k (g = 1e-5 >= (D + 3) 2^-24 for the subtraction, the
 * square and D sequential adds of non-negative terms; s = 1e-37 covers
 * squares that fall into the subnormals).  Let k1 be the least a_k (lowest
 * index on ties) and a2 the second least.  If
 *   (1 - g)(a2 - E) - (1 + g)(a_k1 + E) - 2 s > 0,
 * then d^_k1 < d^_k for every other k (the left side only grows with a_k),
 * so the CPU's strict-< scan ends at k1 whatever the order.  Otherwise (near
 * ties, non-finite values, magnitudes near FP32 overflow) the warp computes
 * the token's k distances exactly as the CPU does, one centroid per lane,
 * and lane 0 runs the CPU's scan over them.  On randomly drawn video-like V
 * about 0.3-1.3% of the tokens take that path (bench/NOTES.md).
 */
#include <stdint.h>

#include "common/device_util.cuh"
#include "common/mma_sync.cuh"

#define KMT_THREADS 256 /* 8 warps x 16 tokens */
#define KMT_TOKENS 128
#define KMT_K 32        /* centroids the tile holds (4 n-tiles of 8) */
#define KMT_PAD 8       /* bf16 per centroid row past D: 16 bytes, so the 8 rows a
                           B-fragment load touches fall in different banks */
#define KMT_EPS_S 1e-5  /* bound on |S_k - x.c_k| / (|x||c_k|), with room */
#define KMT_GAMMA 1e-5
#define KMT_SLOP 1e-37

/* A head's centroids as the assignment reads them, made once per pass by
 * km_cents_kernel and copied whole into each CTA's shared memory: the
 * three bf16 parts [3][KMT_K][D + KMT_PAD], the FP32 values for the exact
 * path (rows padded to D + 1 floats, so that 32 lanes reading one channel
 * of 32 centroids hit 32 banks), |c_k|^2 in FP64 and the largest |c_k|;
 * zero past k. */
template <int D>
struct __align__(16) kmt_cents {
    uint16_t part[3][KMT_K][D + KMT_PAD];
    float c[KMT_K][D + 1];
    double c2[KMT_K];
    double cmax;
};

/* One CTA per head: its centroids split (each remainder exact in FP32),
 * their squared norms in FP64 and the largest norm (rounded up, so that
 * the certificate's bound stays a bound). */
template <int D>
__global__ void __launch_bounds__(KMT_THREADS)
km_cents_kernel(const float *cent, int k, kmt_cents<D> *out) {
    kmt_cents<D> &o = out[blockIdx.x];
    const float *cg = cent + (int64_t)blockIdx.x * k * D;
    __shared__ double c2[KMT_K];
    for (int e = threadIdx.x; e < KMT_K * D; e += KMT_THREADS) {
        const int j = e / D, c = e % D;
        float x = j < k ? cg[j * D + c] : 0.0f;
        o.c[j][c] = x;
#pragma unroll
        for (int p = 0; p < 3; ++p) {
            const uint16_t h = __bfloat16_as_ushort(__float2bfloat16_rn(x));
            o.part[p][j][c] = h;
            x = __fsub_rn(x, qvc_widen16<QVA_BF16>(h));
        }
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int j = warp; j < KMT_K; j += KMT_THREADS / 32) {
        double s = 0.0;
        for (int c = lane; c < D; c += 32) {
            const double x = j < k ? (double)cg[j * D + c] : 0.0;
            s += x * x;
        }
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) c2[j] = o.c2[j] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double m = 0.0;
        for (int j = 0; j < k; ++j) m = fmax(m, c2[j]); /* a NaN norm: its distances fail below */
        o.cmax = __dsqrt_ru(m);
    }
}

/* The CPU's label of token row (qvi_kmeans's assign_labels): one centroid
 * per lane, the FP32 sequential sum, then the strict-< scan in index order
 * on lane 0.  Every lane of the warp calls it. */
template <int D>
static __device__ int kmt_exact_label(const uint16_t *x, const kmt_cents<D> &sm, int k) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    if (lane < k) {
        const float *c = sm.c[lane];
#pragma unroll 8
        for (int i = 0; i < D; ++i) {
            const float t = __fsub_rn(qvc_ld<QVA_BF16>(x, i), c[i]);
            acc = __fadd_rn(acc, __fmul_rn(t, t));
        }
    }
    int best = 0;
    float bd = __shfl_sync(0xffffffffu, acc, 0);
    for (int j = 1; j < k; ++j) {
        const float d = __shfl_sync(0xffffffffu, acc, j);
        if (d < bd) { /* strict: ties (and a NaN first distance) keep the lower index */
            bd = d;
            best = j;
        }
    }
    return best;
}

template <int D>
__global__ void __launch_bounds__(KMT_THREADS)
km_assign_tc_kernel(qvc_view v, int k, const kmt_cents<D> *cents, uint32_t *keys) {
    constexpr int KC = D / 16;
    __shared__ kmt_cents<D> sm;
    const int bh = blockIdx.y, n = (int)v.N;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;

    /* ---- the warp's 16 tokens as A fragments, then the head's centroids
     * (their loads in flight together) */
    const int r0 = blockIdx.x * KMT_TOKENS + warp * 16 + g, r1 = r0 + 8;
    const uint16_t *xb = (const uint16_t *)v.data + qvc_head_base(v, bh);
    const uint16_t *x0 = xb + (int64_t)min(r0, n - 1) * v.sn, *x1 = xb + (int64_t)min(r1, n - 1) * v.sn;
    uint32_t a[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
        const int c = 16 * kc + 2 * tig;
        a[kc][0] = __ldg((const uint32_t *)(x0 + c));
        a[kc][1] = __ldg((const uint32_t *)(x1 + c));
        a[kc][2] = __ldg((const uint32_t *)(x0 + c + 8));
        a[kc][3] = __ldg((const uint32_t *)(x1 + c + 8));
    }
    {
        const uint4 *src = (const uint4 *)(cents + bh);
        uint4 *dst = (uint4 *)&sm;
        for (int e = threadIdx.x; e < (int)(sizeof(kmt_cents<D>) / 16); e += KMT_THREADS) dst[e] = __ldg(src + e);
    }
    __syncthreads();

    /* ---- S = x . (hi + mid + lo) for 4 n-tiles of 8 centroids: per 16
     * channels a chain of three MMAs from zero, added in FP32 */
    float s[4][4] = {};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        const int j = nt * 8 + g;
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
            const int c = 16 * kc + 2 * tig;
            float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int q = 0; q < 3; ++q)
                qvc_mma_bf16(p, a[kc], *(const uint32_t *)&sm.part[q][j][c],
                             *(const uint32_t *)&sm.part[q][j][c + 8]);
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = __fadd_rn(s[nt][e], p[e]);
        }
    }

    /* ---- |x|^2 of rows g and g + 8 (the quad holds each row's channels) */
    double x2[2] = {0.0, 0.0};
#pragma unroll
    for (int kc = 0; kc < KC; ++kc)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const double lo = qvc_widen16<QVA_BF16>((uint16_t)(a[kc][e] & 0xFFFFu)),
                         hi = qvc_widen16<QVA_BF16>((uint16_t)(a[kc][e] >> 16));
            x2[e & 1] += lo * lo + hi * hi;
        }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        x2[i] += __shfl_xor_sync(0xffffffffu, x2[i], 1);
        x2[i] += __shfl_xor_sync(0xffffffffu, x2[i], 2);
    }

    /* ---- per row: the least a (lowest index on ties), the second least,
     * and whether they decide the CPU's label */
    const double cmax = sm.cmax;
    bool sure[2];
    int best[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        double b1 = INFINITY, b2 = INFINITY;
        int j1 = KMT_K;
        bool finite = true;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = nt * 8 + 2 * tig + e;
                if (j >= k) continue;
                const double d = x2[i] + sm.c2[j] - 2.0 * (double)s[nt][2 * i + e];
                finite &= isfinite(d);
                if (d < b1 || (d == b1 && j < j1)) {
                    b2 = b1;
                    b1 = d, j1 = j;
                } else if (d < b2) {
                    b2 = d;
                }
            }
        /* the quad's four column pairs */
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
            const double ob1 = __shfl_xor_sync(0xffffffffu, b1, o), ob2 = __shfl_xor_sync(0xffffffffu, b2, o);
            const int oj1 = __shfl_xor_sync(0xffffffffu, j1, o);
            finite &= __shfl_xor_sync(0xffffffffu, (int)finite, o) != 0;
            if (ob1 < b1 || (ob1 == b1 && oj1 < j1)) {
                b2 = fmin(b1, ob2);
                b1 = ob1, j1 = oj1;
            } else {
                b2 = fmin(b2, ob1);
            }
        }
        const double E = 2.0 * KMT_EPS_S * sqrt(x2[i]) * cmax + 1e-12 * (x2[i] + cmax * cmax) + 1e-30;
        const double gap = (1.0 - KMT_GAMMA) * (b2 - E) - (1.0 + KMT_GAMMA) * (b1 + E) - 2.0 * KMT_SLOP;
        /* a2 past 1e37: the CPU's FP32 sums may overflow; decide exactly */
        sure[i] = finite && isfinite(E) && b1 < 1e37 && (k == 1 || (gap > 0.0 && b2 < 1e37));
        best[i] = j1;
    }

    /* ---- labels: certified rows at once, the others the CPU's way */
    const int rows[2] = {r0, r1};
#pragma unroll
    for (int i = 0; i < 2; ++i)
        if (tig == 0 && rows[i] < n && sure[i]) keys[(int64_t)bh * n + rows[i]] = (uint32_t)bh * (uint32_t)k + (uint32_t)best[i];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        unsigned todo = __ballot_sync(0xffffffffu, tig == 0 && rows[i] < n && !sure[i]);
        while (todo) {
            const int src = __ffs(todo) - 1;
            todo &= todo - 1;
            const int row = __shfl_sync(0xffffffffu, rows[i], src);
            const int lab = kmt_exact_label<D>(xb + (int64_t)row * v.sn, sm, k);
            if (lane == 0) keys[(int64_t)bh * n + row] = (uint32_t)bh * (uint32_t)k + (uint32_t)lab;
        }
    }
}

extern "C" int qvc_km_assign_tc_ok(const qvc_view *v, int k) {
    return v->dtype == QVA_BF16 && k >= 1 && k <= KMT_K && (v->D == 64 || v->D == 128) &&
           qvc_view_vec_ok(v, 2);
}

template <int D>
static qva_status kmt_launch(const qvc_view *v, int BH, int k, const float *cent, uint32_t *keys,
                             cudaStream_t st) {
    kmt_cents<D> *cents = NULL;
    cudaError_t e = cudaMallocAsync((void **)&cents, (size_t)BH * sizeof(kmt_cents<D>), st);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "qvc_kmeans_perm: cudaMallocAsync");
    km_cents_kernel<D><<<BH, KMT_THREADS, 0, st>>>(cent, k, cents);
    qva_status r = qvc_launch_check("qvc_kmeans_perm: centroid parts");
    if (r == QVA_OK) {
        const dim3 grid((unsigned)qvi_cdiv((int)v->N, KMT_TOKENS), (unsigned)BH);
        km_assign_tc_kernel<D><<<grid, KMT_THREADS, 0, st>>>(*v, k, cents, keys);
        r = qvc_launch_check("qvc_kmeans_perm: assign (tensor cores)");
    }
    e = cudaFreeAsync(cents, st); /* stream-ordered: after the kernels */
    if (e != cudaSuccess && r == QVA_OK) r = qvc_cuda_fail(e, "qvc_kmeans_perm: cudaFreeAsync");
    return r;
}

extern "C" qva_status qvc_km_assign_tc(const qvc_view *v, int BH, int k, const float *cent,
                                       uint32_t *keys, cudaStream_t st) {
    return v->D == 64 ? kmt_launch<64>(v, BH, k, cent, keys, st)
                      : kmt_launch<128>(v, BH, k, cent, keys, st);
}
