/*
 * The pieces of prep/qk_wide.cu's kernels (its header comment says what
 * they do and why), kept apart so that a version under trial in dev/cuda
 * builds on them as the attention versions build on dense/attn8_ws.cuh:
 * the lane layout, the rotation's stages, the rows' loads and the codes'
 * stores at 32 channels a lane.
 */
#ifndef QVATTN_QK_WIDE_CUH
#define QVATTN_QK_WIDE_CUH

#include "common/quant_code.cuh"
#include "prep_common.cuh"

#define QKW_D 128
#define QKW_CPL 32                     /* channels a lane            */
#define QKW_LPR (QKW_D / QKW_CPL)      /* lanes a row: 4             */
#define QKW_RPW (32 / QKW_LPR)         /* rows a warp step: 8        */
#define QKW_RPC (QKW_RPW * PREP_WARPS) /* rows a CTA step: 64        */
#define QKW_STEPS (QVI_BLOCK / QKW_RPC) /* rows a thread: 2           */

/* The in-lane stages of x whose strides are s0, 2 s0, ... < s1. */
static __device__ __forceinline__ void qkw_lane_stages(float *x, int s0, int s1) {
#pragma unroll
    for (int h = s0; h < s1; h <<= 1)
#pragma unroll
        for (int i = 0; i < QKW_CPL; ++i)
            if (!(i & h)) butterfly(x[i], x[i + h]);
}

/* qva_hadamard's stages of the row (after its signs), then its scale;
 * every lane of the warp calls it (the shuffles). */
static __device__ __forceinline__ void qkw_stages(float *x, int q, float had_scale) {
    qkw_lane_stages(x, 1, 8);
#pragma unroll
    for (int hl = 1; hl < QKW_LPR; hl <<= 1) {
        /* o - x or x + o as one rounding of o + (+-1)x (qk_plain.cu) */
        const float side = (q & hl) ? -1.0f : 1.0f;
#pragma unroll
        for (int i = 0; i < QKW_CPL; ++i) x[i] = __fmaf_rn(side, x[i], __shfl_xor_sync(FULL_MASK, x[i], hl));
    }
    qkw_lane_stages(x, 8, QKW_CPL);
#pragma unroll
    for (int i = 0; i < QKW_CPL; ++i) x[i] = __fmul_rn(x[i], had_scale);
}

/* x less (SUB) or times the lane's 32 values of a 128-float shared array,
 * a chunk of 8 at a time, so that 8 registers hold them, not 32. */
template <bool SUB>
static __device__ __forceinline__ void qkw_chunks(const float *a, int q, float *x) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float4 u = ((const float4 *)a)[2 * (q + 4 * j)], w = ((const float4 *)a)[2 * (q + 4 * j) + 1];
        const float c[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) x[8 * j + e] = SUB ? __fsub_rn(x[8 * j + e], c[e]) : __fmul_rn(x[8 * j + e], c[e]);
    }
}

/* The lane's 8 codes of chunk j, from the row's scale and reciprocal. */
static __device__ __forceinline__ void qkw_store_codes(int8_t *row, int q, const float *x,
                                                       float scale, float rcp) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
        *(uint2 *)(row + 8 * (q + 4 * j)) = make_uint2(qvc_int8_codes4_bounded(x + 8 * j, scale, rcp),
                                                       qvc_int8_codes4_bounded(x + 8 * j + 4, scale, rcp));
}

/* Both rows' four chunks of the thread (rows src[s] of the head, +0 where
 * the block's row r0 + 64 s is past n), in flight at once. */
static __device__ __forceinline__ void qkw_load_rows(const qk_params &p, int bh, const int *src,
                                                     int r0, int q, uint4 (&raw)[QKW_STEPS][4]) {
    const unsigned short *x0 = (const unsigned short *)p.x.data + qvc_head_base(p.x, bh);
#pragma unroll
    for (int s = 0; s < QKW_STEPS; ++s)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            raw[s][j] = r0 + s * QKW_RPC < p.n
                            ? __ldg((const uint4 *)(x0 + (int64_t)src[s] * p.x.sn + 8 * (q + 4 * j)))
                            : make_uint4(0u, 0u, 0u, 0u);
}

#endif
