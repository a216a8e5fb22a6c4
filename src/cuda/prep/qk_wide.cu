/*
 * qk-wide, a version under trial (qk_params.wide; the dev driver's
 * qvc_dev_kernels.qk_wide): rotated INT8 Q with one scale per row at head
 * dim 128, qk_plain_kernel's codes and scales bit for bit, at 32 channels
 * a lane instead of 8.
 *
 * Why: rotated Q is bound by its instruction issue (bench/NOTES.md, "The
 * tree and qk-pipe on the GPU"): 29.6 instructions a value, of which the
 * rotation's four shuffled stages are 8 and the row's scale, made by all
 * 16 lanes of a row, 4.3.  With 4 lanes a row, five of the seven stages
 * run in the lane's registers (one FADD a value each), two are shuffled
 * (SHFL + FFMA), and the row's max, scale and reciprocal are shared by 32
 * values: about 24 instructions a value.
 *
 * Layout: lane q = lane % 4 of a row holds the 16-byte chunks q + 4j (j =
 * 0..3) of the row, channels 8 (q + 4j) + e, so that each of its four
 * loads and code stores is 64 contiguous bytes a row across the row's 4
 * lanes.  In its registers x[8j + e], the row's stages h = 1, 2, 4 are
 * x's strides 1, 2, 4, stages 8 and 16 are lanes q ^ 1 and q ^ 2, and
 * stages 32 and 64 are x's strides 8 and 16: qva_hadamard's order of
 * stages, each butterfly the same two roundings.  A thread takes 2 rows
 * (row r0 and r0 + 64), a CTA of 256 threads a 128-row block.
 */
#include <math.h>
#include <stdint.h>

#include "common/quant_code.cuh"
#include "prep_common.cuh"

#define QKW_D 128
#define QKW_CPL 32                     /* channels a lane            */
#define QKW_LPR (QKW_D / QKW_CPL)      /* lanes a row: 4             */
#define QKW_RPW (32 / QKW_LPR)         /* rows a warp step: 8        */
#define QKW_RPC (QKW_RPW * PREP_WARPS) /* rows a CTA step: 64        */
#define QKW_STEPS (QVI_BLOCK / QKW_RPC) /* rows a thread: 2           */

/* Channel of the lane's value i = 8j + e. */
static __device__ __forceinline__ int qkw_channel(int q, int i) { return 8 * (q + 4 * (i >> 3)) + (i & 7); }

/* The in-lane stages of x whose strides are s0, 2 s0, ... < s1. */
static __device__ __forceinline__ void qkw_lane_stages(float *x, int s0, int s1) {
#pragma unroll
    for (int h = s0; h < s1; h <<= 1)
#pragma unroll
        for (int i = 0; i < QKW_CPL; ++i)
            if (!(i & h)) butterfly(x[i], x[i + h]);
}

/* qva_hadamard of the row (signs, where there are any, on valid rows
 * only, so that a padding row stays +0), then its scale; every lane of
 * the warp calls it. */
static __device__ __forceinline__ void qkw_rotate(float *x, const float *sg, bool sign, int q,
                                                  float had_scale) {
    if (sign) {
#pragma unroll
        for (int i = 0; i < QKW_CPL; ++i) x[i] = __fmul_rn(x[i], sg[i]);
    }
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

template <int DT>
__global__ void __launch_bounds__(PREP_THREADS, 2) qk_wide_kernel(qk_params p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, q = lane % QKW_LPR;
    const int bh = blockIdx.y;
    const int r0 = blockIdx.x * QVI_BLOCK + warp * QKW_RPW + lane / QKW_LPR;

    /* ---- producer: both rows' four chunks in flight at once */
    const unsigned short *x0 = (const unsigned short *)p.x.data + qvc_head_base(p.x, bh);
    uint4 raw[QKW_STEPS][4];
#pragma unroll
    for (int s = 0; s < QKW_STEPS; ++s) {
        const int r = r0 + s * QKW_RPC;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            raw[s][j] = r < p.n ? __ldg((const uint4 *)(x0 + (int64_t)r * p.x.sn + 8 * (q + 4 * j)))
                                : make_uint4(0u, 0u, 0u, 0u);
    }
    /* the signs of the lane's channels as four 32-byte runs; without
     * signs (+hadamard's unsigned form) none is multiplied */
    float sg[QKW_CPL];
    if (p.signs) {
#pragma unroll
        for (int j = 0; j < 4; ++j) plain_load8f(p.signs + qkw_channel(q, 8 * j), sg + 8 * j);
    }

    /* ---- each row: rotated, its scale from the row's 4 lanes, codes */
    float *scales = p.scale + (int64_t)bh * p.n_pad;
#pragma unroll
    for (int s = 0; s < QKW_STEPS; ++s) {
        const int r = r0 + s * QKW_RPC;
        float x[QKW_CPL];
#pragma unroll
        for (int j = 0; j < 4; ++j) qvc_widen8<DT>(raw[s][j], x + 8 * j);
        qkw_rotate(x, sg, p.signs && r < p.n, q, p.had_scale);
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < QKW_CPL; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
        for (int o = QKW_LPR / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
        const float scale = qvc_int8_delta(amax), rcp = __frcp_rn(scale);
        if (q == 0) scales[r] = scale;
        int8_t *codes = p.codes + ((int64_t)bh * p.n_pad + r) * QKW_D;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            *(uint2 *)(codes + 8 * (q + 4 * j)) =
                make_uint2(qvc_int8_codes4_bounded(x + 8 * j, scale, rcp),
                           qvc_int8_codes4_bounded(x + 8 * j + 4, scale, rcp));
    }
}

bool qvc_qk_wide_ok(const qk_params &p, int D) {
    return p.wide && D == QKW_D && p.hadamard && p.rows_per_scale == 1 && !p.perm && !p.mean &&
           qvc_qk_plain_ok(p, D);
}

void qvc_qk_wide_launch(const qk_params &p, dim3 grid, cudaStream_t st) {
    if (p.x.dtype == QVA_BF16)
        qk_wide_kernel<QVA_BF16><<<grid, PREP_THREADS, 0, st>>>(p);
    else
        qk_wide_kernel<QVA_F16><<<grid, PREP_THREADS, 0, st>>>(p);
}
