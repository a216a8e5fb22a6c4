/*
 * Q and K of the 8-bit methods: codes (INT8 or E4M3, qvc_prep_args
 * qk_format) with one scale per 128-row block (or, INT8 Q, per row), the rows as qk_row()
 * (prep_common.cuh) gives them: gathered by the permutation, smoothed by
 * the K channel mean, rotated.  Launched by qvc_prep (prep8.cu) through
 * qvc_prep_qk8.
 *
 *   qk_quant_kernel<DT,NC>  one CTA per (128-row block, bh) of Q or K:
 *                           8 warps x 16 rows, lane = channel (c = lane +
 *                           32 j, j < NC); gather, smooth, Hadamard
 *                           (shuffles for strides < 32, in registers for
 *                           32 and 64); pass 1 the block amax, pass 2
 *                           (rows re-read) the codes.
 *   qk_quant_rows_kernel<DT,NC>  the same CTAs, one INT8 scale per row:
 *                           one pass, a warp max per row.
 */
#include <math.h>
#include <stdint.h>

#include "prep_common.cuh"

/* qva_int8_round: clamp first, then round half away from zero (roundf). */
static __device__ __forceinline__ int8_t int8_round(float y) {
    if (isnan(y)) return 0;
    if (y >= 127.0f) return 127;
    if (y <= -127.0f) return -127;
    return (int8_t)(int)roundf(y);
}

/* Two passes over the block: the amax, then the codes.  The second pass
 * re-reads the rows (from L2) and recomputes them instead of holding the
 * block in registers, which keeps the kernel small enough for the
 * occupancy that hides the memory latency. */
template <int DT, int NC>
__global__ void __launch_bounds__(PREP_THREADS)
qk_quant_kernel(qk_params p) {
    __shared__ float red[PREP_WARPS];
    const int blk = blockIdx.x, bh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.x.D;
    const int64_t base = qvc_head_base(p.x, bh);
    const int r0 = blk * QVI_BLOCK + warp * ROWS_PER_WARP;

    float mu[NC], sg[NC];
    qk_lane_consts<NC>(p, bh, mu, sg);

    float amax = 0.0f;
#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float x[NC];
        qk_row<DT, NC>(p, base, bh, r0 + r, mu, sg, x);
#pragma unroll
        for (int j = 0; j < NC; ++j) amax = fmaxf(amax, fabsf(x[j]));
    }
    amax = block_max(amax, red);

    float scale;
    if (p.fmt == QVC_QK_INT8) {
        scale = __fadd_rn(__fdiv_rn(amax, 127.0f), 1e-7f); /* DA2 C.3 delta */
    } else {
        scale = __fdiv_rn(amax, 448.0f);
        if (!(scale > 0.0f) || !isfinite(scale)) scale = 1.0f;
    }
    if (threadIdx.x == 0)
        p.scale[(int64_t)bh * (p.n_pad / QVI_BLOCK) + blk] = scale;

#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float x[NC];
        qk_row<DT, NC>(p, base, bh, r0 + r, mu, sg, x);
        int8_t *dst = p.codes + ((int64_t)bh * p.n_pad + r0 + r) * D;
#pragma unroll
        for (int j = 0; j < NC; ++j) {
            const int c = lane + 32 * j;
            if (c >= D) continue;
            const float y = __fdiv_rn(x[j], scale);
            dst[c] = p.fmt == QVC_QK_INT8 ? int8_round(y) : (int8_t)e4m3(y);
        }
    }
}

/* INT8 with one scale per row: each warp's rows are whole in its lanes,
 * so one pass (a warp max per row, then the codes) suffices. */
template <int DT, int NC>
__global__ void __launch_bounds__(PREP_THREADS)
qk_quant_rows_kernel(qk_params p) {
    const int blk = blockIdx.x, bh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.x.D;
    const int64_t base = qvc_head_base(p.x, bh);
    const int r0 = blk * QVI_BLOCK + warp * ROWS_PER_WARP;

    float mu[NC], sg[NC];
    qk_lane_consts<NC>(p, bh, mu, sg);
#pragma unroll 2
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        float x[NC];
        qk_row<DT, NC>(p, base, bh, r0 + r, mu, sg, x);
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < NC; ++j) amax = fmaxf(amax, fabsf(x[j]));
        amax = warp_max(amax);
        const float scale = __fadd_rn(__fdiv_rn(amax, 127.0f), 1e-7f); /* DA2 C.3 delta */
        if (lane == 0) p.scale[(int64_t)bh * p.n_pad + r0 + r] = scale;
        int8_t *dst = p.codes + ((int64_t)bh * p.n_pad + r0 + r) * D;
#pragma unroll
        for (int j = 0; j < NC; ++j) {
            const int c = lane + 32 * j;
            if (c < D) dst[c] = int8_round(__fdiv_rn(x[j], scale));
        }
    }
}

template <int DT, int NC>
static void launch_qk_nc(const qk_params &p, dim3 grid, cudaStream_t st) {
    if (p.rows_per_scale == 1)
        qk_quant_rows_kernel<DT, NC><<<grid, PREP_THREADS, 0, st>>>(p);
    else
        qk_quant_kernel<DT, NC><<<grid, PREP_THREADS, 0, st>>>(p);
}

/* Head dims 64 and 128 only (the chooser's; others arrive zero-padded):
 * two instantiations per dtype instead of four. */
template <int DT>
static void launch_qk_dt(const qk_params &p, dim3 grid, int D, cudaStream_t st) {
    if (D == 64)
        launch_qk_nc<DT, 2>(p, grid, st);
    else
        launch_qk_nc<DT, 4>(p, grid, st);
}

qva_status qvc_prep_qk8(const qk_params &p, int BH, int D, cudaStream_t st, const char *what) {
    if (D != 64 && D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "%s: head dim %d (64 or 128)", what, D);
    if (p.rows_per_scale != QVI_BLOCK && !(p.rows_per_scale == 1 && p.fmt == QVC_QK_INT8))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "%s: rows_per_scale %d", what, p.rows_per_scale);
    dim3 grid(p.n_pad / QVI_BLOCK, BH);
    QVC_DISPATCH_DTYPE(p.x.dtype, launch_qk_dt<DT_>(p, grid, D, st));
    return qvc_launch_check(what);
}
