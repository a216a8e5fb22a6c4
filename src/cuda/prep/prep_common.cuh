/*
 * Operand preparation on the device: load the strided user Q, K, V, apply
 * the permutation, K smoothing, the Hadamard rotation and V-Smooth block
 * demeaning, and quantize into the layouts of cuda_internal.h.  The files
 * of src/cuda/prep/, by role:
 *   qk.cu      Q and K as 8-bit codes (INT8 / E4M3) with block scales
 *   kmean.cu   the K channel mean of K smoothing (two-level FP64 sums)
 *   colsum.cu  exact FP64 column means of row lists (qvc_colsum_mean): the
 *              centroid update of kmeans.cu
 *   v.cu       V: block statistics, per-channel scales, E4M3 codes
 *   fp4.cu     the NVFP4 operands of sage4 / vc4 (qvc_prep4, qvc_ops4_*)
 *   prep8.cu   qvc_prep, qvc_ops_alloc / free, the LSE shift
 * This header holds the device helpers and constants that more than one of
 * them needs; prep_internal.h the host functions they call in each other.
 *
 * The values are those of the CPU reference (src/cpu/attention.c,
 * prepare_head / qvi_v8_prepare / quantize_ops, and the quantizers of
 * src/cpu/formats.c), bit for bit:
 *   - every float operation is written with an explicit _rn intrinsic, so
 *     nvcc can never contract a multiply and an add into an FMA the CPU
 *     does not form (the CPU is built -std=c11, which does not contract);
 *   - the FP64 sums (K channel mean, V block means) give the CPU's
 *     sequential sums exactly: V block means (128 rows) are summed
 *     sequentially in row order (v.cu); the K mean in 128-row blocks,
 *     then over blocks, as the CPU defines it (kmean.cu); the k-means
 *     centroid sums in parallel when the data certify that no partial sum
 *     can round, sequentially in the CPU's order otherwise (colsum.cu);
 *   - maxima are order-independent, so they use ordinary tree reductions.
 * The input dtype is a template parameter of every kernel, so unrolled
 * loops issue their loads back to back.
 */
#ifndef QVATTN_CUDA_PREP_COMMON_CUH
#define QVATTN_CUDA_PREP_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "common/device_util.cuh"
#include "prep_internal.h"

#define PREP_THREADS 256
#define PREP_WARPS (PREP_THREADS / 32)
#define ROWS_PER_WARP (QVI_BLOCK / PREP_WARPS) /* 16 */
#define FULL_MASK 0xffffffffu

/* Source row of logical row i (perm: [BH][n] or NULL). */
static __device__ __forceinline__ int64_t src_row(const int32_t *perm, int bh,
                                                  int n, int i) {
    return perm ? (int64_t)__ldg(perm + (int64_t)bh * n + i) : (int64_t)i;
}

static __device__ __forceinline__ float round_f16(float y) {
    return __half2float(__float2half_rn(y));
}

static __device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

/* Block-wide max of a PREP_THREADS CTA; every thread gets the result. */
static __device__ float block_max(float x, float *red /* [PREP_WARPS] */) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    x = warp_max(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < PREP_WARPS; ++w) m = fmaxf(m, red[w]);
    return m;
}

/* The pair (a, b) -> (a + b, a - b) of qva_hadamard. */
static __device__ __forceinline__ void butterfly(float &a, float &b) {
    float s = __fadd_rn(a, b), d = __fsub_rn(a, b);
    a = s;
    b = d;
}

/* The vectorized kernels (qk.cu, v.cu): a lane holds QK_CPL adjacent
 * channels of a row, so a row of D channels takes D / QK_CPL lanes (32 at
 * D 128, 16 at D 64) and one warp step covers 32 / that many rows.  Loads
 * are QK_CPL elements wide and codes leave 4 bytes per lane. */
#define QK_CPL 4
static_assert(QK_CPL == 4, "common/quant_code.cuh packs 4 codes per lane");
template <int D>
struct qk_geom {
    static constexpr int LPR = D / QK_CPL;               /* lanes per row  */
    static constexpr int RPS = 32 / LPR;                 /* rows per step  */
    static constexpr int STEPS = ROWS_PER_WARP / RPS;    /* steps per warp */
};

/* QK_CPL elements of a user view at off, widened exactly: one vector load
 * where vec (qvc_view_vec_ok(view, QK_CPL), checked once per launch), else
 * one by one (qvc_ld8's 4-wide twin, with a run-time flag). */
template <int DT>
static __device__ __forceinline__ void prep_load4(const void *data, int64_t off, int vec,
                                                  float *x) {
    if (vec) {
        if constexpr (DT == QVA_F32) {
            const float4 v = __ldg((const float4 *)((const float *)data + off));
            x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
        } else {
            const uint2 v = __ldg((const uint2 *)((const unsigned short *)data + off));
            const unsigned short h[4] = {(unsigned short)(v.x & 0xFFFFu), (unsigned short)(v.x >> 16),
                                         (unsigned short)(v.y & 0xFFFFu), (unsigned short)(v.y >> 16)};
#pragma unroll
            for (int e = 0; e < QK_CPL; ++e)
                x[e] = DT == QVA_BF16 ? __uint_as_float((unsigned)h[e] << 16)
                                      : __half2float(__ushort_as_half(h[e]));
        }
    } else {
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) x[e] = qvc_ld<DT>(data, off + e);
    }
}

/* FP64 sums, in row order, of a lane's QK_CPL channels c0.. over rows
 * r0 .. r0 + len - 1 of X[perm] (loads 8 rows ahead, then the ordered
 * adds): the per-block sums of the K mean (kmean.cu) and of V-Smooth's
 * block means (v.cu), bit for bit the CPU's sequential sums. */
template <int DT>
static __device__ __forceinline__ void block_colsum4(const qvc_view &x, const int32_t *perm, int bh,
                                                     int n, int64_t base, int r0, int len, int c0,
                                                     int vec, double *s) {
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e) s[e] = 0.0;
    for (int i = 0; i < len; i += 8) {
        float v[8][QK_CPL];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (i + u < len)
                prep_load4<DT>(x.data, base + src_row(perm, bh, n, r0 + i + u) * x.sn + c0, vec, v[u]);
            else
#pragma unroll
                for (int e = 0; e < QK_CPL; ++e) v[u][e] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
            if (i + u < len)
#pragma unroll
                for (int e = 0; e < QK_CPL; ++e) s[e] = __dadd_rn(s[e], (double)v[u][e]);
    }
}

/* The lane's block and channels when a 128-thread CTA's warps each take
 * 32 / LPR blocks (a row of D channels is LPR = D / QK_CPL lanes). */
template <int D>
struct block_lanes {
    static constexpr int PER_WARP = 32 / qk_geom<D>::LPR;
    static constexpr int PER_CTA = 4 * PER_WARP;
};

#endif
