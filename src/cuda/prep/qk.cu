/*
 * Q and K of the 8-bit methods: codes (INT8 or E4M3, qvc_prep_args
 * qk_format) with one scale per 128-row block (or, INT8 Q, per row), the rows as qk_row4()
 * gives them: gathered by the permutation, smoothed by the K channel mean,
 * rotated.  Launched by qvc_prep (prep8.cu) through
 * qvc_prep_qk8.
 *
 *   qk_quant_kernel<DT,D>   one CTA per (128-row block, bh) of Q or K:
 *                           8 warps x 16 rows, a lane = 4 adjacent
 *                           channels (vector loads, 4-byte code stores);
 *                           gather, smooth, Hadamard (in registers for
 *                           strides 1 and 2, shuffles above); pass 1 the
 *                           block amax, pass 2 (rows re-read) the codes.
 *   qk_quant_rows_kernel<DT,D>  the same CTAs, one INT8 scale per row:
 *                           one pass, a max over each row's lanes.
 * INT8 from 16-bit inputs goes to qk_wide.cu (rotated, head dim 128) or
 * qk_plain.cu instead.
 */
#include <math.h>
#include <stdint.h>

#include "common/quant_code.cuh"
#include "prep_common.cuh"


/* The lane's channel constants (K mean, Hadamard signs) of qk_row4. */
template <int D>
static __device__ __forceinline__ void qk_consts4(const qk_params &p, int bh, float *mu, float *sg) {
    const int c0 = ((threadIdx.x & 31) % qk_geom<D>::LPR) * QK_CPL;
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e) {
        mu[e] = p.mean ? p.mean[(int64_t)bh * D + c0 + e] : 0.0f;
        sg[e] = p.signs ? p.signs[c0 + e] : 1.0f;
    }
}

/*
 * Row i, the lane's QK_CPL channels, as the CPU has it just before
 * quantization: loaded, smoothed (K), rotated (if hadamard).  Rows past n
 * are +0 (no sign flip, so no -0).  Every lane of the warp must call it
 * together (the Hadamard shuffles), valid row or not.
 */
template <int DT, int D>
static __device__ __forceinline__ void qk_row4(const qk_params &p, int64_t base, int bh, int i,
                                               const float *mu, const float *sg, float *x) {
    constexpr int LPR = qk_geom<D>::LPR;
    const int sub = (threadIdx.x & 31) % LPR;
    const bool valid = i < p.n;
    if (valid)
        prep_load4<DT>(p.x.data, base + src_row(p.perm, bh, p.n, i) * p.x.sn + sub * QK_CPL, p.vec,
                       x);
    else
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) x[e] = 0.0f;
    if (p.mean && valid) {
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) x[e] = __fsub_rn(x[e], mu[e]);
    }
    if (!p.hadamard) return;
    /* qva_hadamard's stages in its order, h = 1, 2, ... D/2: strides 1 and 2
     * pair registers of a lane, strides 4 and up pair lanes sub ^ h/4 (the
     * lane without that bit holds a and gets a + b, its partner a - b). */
    hadamard_in_lane<QK_CPL>(x, sg, valid);
#pragma unroll
    for (int hl = 1; hl < LPR; hl <<= 1) {
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) {
            const float o = __shfl_xor_sync(FULL_MASK, x[e], hl);
            x[e] = (sub & hl) ? __fsub_rn(o, x[e]) : __fadd_rn(x[e], o);
        }
    }
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e) x[e] = __fmul_rn(x[e], p.had_scale);
}

/* Max over the LPR lanes of a row (xor offsets stay inside the row). */
template <int D>
static __device__ __forceinline__ float row_max(float x) {
#pragma unroll
    for (int o = qk_geom<D>::LPR / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

/* The lane's QK_CPL codes of y = x / scale, packed little-endian; rcp =
 * 1 / scale serves the fast paths of common/quant_code.cuh.  e4m3_fast:
 * the E4M3 path's conditions (the scale bounds the block's values unless
 * an infinite amax made it 1). */
static __device__ __forceinline__ uint32_t qk_codes4(const float *x, float scale, float rcp, int fmt,
                                                     bool e4m3_fast) {
    if (fmt == QVC_QK_INT8) return qvc_int8_codes4(x, scale, rcp);
    const float s4[4] = {scale, scale, scale, scale}, r4[4] = {rcp, rcp, rcp, rcp};
    return qvc_e4m3_codes4(x, s4, r4, e4m3_fast);
}

/* Two passes over the block: the amax, then the codes.  The second pass
 * re-reads the rows (from L2) and recomputes them instead of holding the
 * block in registers, which keeps the kernel small enough for the
 * occupancy that hides the memory latency. */
template <int DT, int D>
__global__ void __launch_bounds__(PREP_THREADS)
qk_quant_kernel(qk_params p) {
    using G = qk_geom<D>;
    __shared__ float red[PREP_WARPS];
    const int blk = blockIdx.x, bh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t base = qvc_head_base(p.x, bh);
    const int r0 = blk * QVI_BLOCK + warp * ROWS_PER_WARP + lane / G::LPR;

    float mu[QK_CPL], sg[QK_CPL];
    qk_consts4<D>(p, bh, mu, sg);

    float amax = 0.0f;
#pragma unroll 4
    for (int s = 0; s < G::STEPS; ++s) {
        float x[QK_CPL];
        qk_row4<DT, D>(p, base, bh, r0 + s * G::RPS, mu, sg, x);
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) amax = fmaxf(amax, fabsf(x[e]));
    }
    amax = block_max(amax, red);

    float scale;
    if (p.fmt == QVC_QK_INT8) {
        scale = qvc_int8_delta(amax);
    } else {
        scale = __fdiv_rn(amax, 448.0f);
        if (!(scale > 0.0f) || !isfinite(scale)) scale = 1.0f;
    }
    if (threadIdx.x == 0)
        p.scale[(int64_t)bh * (p.n_pad / QVI_BLOCK) + blk] = scale;
    const float rcp = __frcp_rn(scale);
    const bool e4m3_fast = qvc_e4m3_fast_ok(scale, rcp) && isfinite(amax);

    const int c0 = (lane % G::LPR) * QK_CPL;
#pragma unroll 4
    for (int s = 0; s < G::STEPS; ++s) {
        const int r = r0 + s * G::RPS;
        float x[QK_CPL];
        qk_row4<DT, D>(p, base, bh, r, mu, sg, x);
        *(uint32_t *)(p.codes + ((int64_t)bh * p.n_pad + r) * D + c0) = qk_codes4(x, scale, rcp, p.fmt, e4m3_fast);
    }
}

/* INT8 with one scale per row: each row is whole in its lanes, so one
 * pass (a max over the row's lanes, then the codes) suffices. */
template <int DT, int D>
__global__ void __launch_bounds__(PREP_THREADS)
qk_quant_rows_kernel(qk_params p) {
    using G = qk_geom<D>;
    const int blk = blockIdx.x, bh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t base = qvc_head_base(p.x, bh);
    const int r0 = blk * QVI_BLOCK + warp * ROWS_PER_WARP + lane / G::LPR;
    const int c0 = (lane % G::LPR) * QK_CPL;

    float mu[QK_CPL], sg[QK_CPL];
    qk_consts4<D>(p, bh, mu, sg);
#pragma unroll 4
    for (int s = 0; s < G::STEPS; ++s) {
        const int r = r0 + s * G::RPS;
        float x[QK_CPL];
        qk_row4<DT, D>(p, base, bh, r, mu, sg, x);
        float amax = 0.0f;
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) amax = fmaxf(amax, fabsf(x[e]));
        amax = row_max<D>(amax);
        const float scale = qvc_int8_delta(amax);
        if (c0 == 0) p.scale[(int64_t)bh * p.n_pad + r] = scale;
        *(uint32_t *)(p.codes + ((int64_t)bh * p.n_pad + r) * D + c0) =
            qvc_int8_codes4(x, scale, __frcp_rn(scale));
    }
}

template <int DT, int D>
static void launch_qk_d(const qk_params &p, dim3 grid, cudaStream_t st) {
    if (p.rows_per_scale == 1)
        qk_quant_rows_kernel<DT, D><<<grid, PREP_THREADS, 0, st>>>(p);
    else
        qk_quant_kernel<DT, D><<<grid, PREP_THREADS, 0, st>>>(p);
}

/* Head dims 64 and 128 only (the chooser's; others arrive zero-padded). */
template <int DT>
static void launch_qk_dt(const qk_params &p, dim3 grid, int D, cudaStream_t st) {
    if (D == 64)
        launch_qk_d<DT, 64>(p, grid, st);
    else
        launch_qk_d<DT, 128>(p, grid, st);
}

qva_status qvc_prep_qk8(const qk_params &p, int BH, int D, cudaStream_t st, const char *what) {
    if (D != 64 && D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "%s: head dim %d (64 or 128)", what, D);
    if (p.rows_per_scale != QVI_BLOCK && !(p.rows_per_scale == 1 && p.fmt == QVC_QK_INT8))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "%s: rows_per_scale %d", what, p.rows_per_scale);
    dim3 grid(p.n_pad / QVI_BLOCK, BH);
    if (p.dev_qk8 && p.dev_qk8(&p, BH, D, st)) return qvc_launch_check(what);
    if (qvc_qk_wide_ok(p, D)) {
        qvc_qk_wide_launch(p, grid, st);
        return qvc_launch_check(what);
    }
    if (qvc_qk_plain_ok(p, D)) {
        qvc_qk_plain_launch(p, grid, D, st);
        return qvc_launch_check(what);
    }
    if (p.csum) /* qvc_prep checks first (kprev_ok in prep8.cu); this only guards */
        return qvi_fail(QVA_ERR_UNSUPPORTED, "%s: +kprev's code sums need qk_plain.cu's K", what);
    qk_params pv = p;
    pv.vec = qvc_view_vec_ok(&p.x, QK_CPL);
    QVC_DISPATCH_DTYPE(p.x.dtype, launch_qk_dt<DT_>(pv, grid, D, st));
    return qvc_launch_check(what);
}
