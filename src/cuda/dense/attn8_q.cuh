/*
 * The consumers' Q codes (qvc_ops.q_src): each warp of attn8_ws_128x128's
 * consumer warpgroups quantizes the 16 query rows its wgmma fragments
 * hold, from the caller's 16-bit Q, into the Q tile's 128-byte-swizzled
 * layout (the one TMA writes), and keeps its two rows' scales.  The codes
 * and scales are qvc_prep's (common/int8_rows.cuh, the same operations),
 * so the output is the same bits; what goes is the preparation's pass
 * over Q (it wrote the codes to memory for this kernel to read back).
 *
 * Geometry: a lane holds 8 channels of one row, 16 lanes a row, so a warp
 * step covers rows 2s and 2s + 1 of its 16 (lanes 0-15 and 16-31), eight
 * steps; every row's load is issued before the first is used.
 */
#ifndef QVATTN_ATTN8_Q_CUH
#define QVATTN_ATTN8_Q_CUH

#include "common/int8_rows.cuh"

#define A8Q_STEPS 8 /* 16 rows of a warp, 2 per step */

/* The codes of the warp's rows row_w .. row_w + 15 of head bh into tile
 * (their 16 x 128 bytes; tile is 1024-byte aligned up to a multiple of 8
 * rows, so row r's 16-byte chunk c sits at chunk c ^ (r & 7)); dq gets the
 * scales of the thread's rows g and g + 8 (g = lane / 4), as qvc_q_scales
 * gives them from qvc_prep's. */
template <int DT>
static __device__ __forceinline__ void attn8_q_rows(const qvc_q_src &qs, int bh, int row_w,
                                                    int nq, uint8_t *tile, float (&dq)[2]) {
    const int lane = threadIdx.x & 31, half = lane >> 4, c0 = (lane & 15) * ROW_CPL;
    const qvc_view &x = qs.x;
    const unsigned short *src = (const unsigned short *)x.data + qvc_head_base(x, bh) + c0;
    uint4 raw[A8Q_STEPS];
#pragma unroll
    for (int s = 0; s < A8Q_STEPS; ++s) {
        const int row = row_w + 2 * s + half;
        raw[s] = make_uint4(0u, 0u, 0u, 0u);
        if (row < nq) raw[s] = __ldg((const uint4 *)(src + (int64_t)row * x.sn));
    }
    float sg[ROW_CPL];
#pragma unroll
    for (int e = 0; e < ROW_CPL; ++e) sg[e] = qs.signs ? __ldg(qs.signs + c0 + e) : 1.0f;
    float sc[A8Q_STEPS];
#pragma unroll
    for (int s = 0; s < A8Q_STEPS; ++s) {
        const int r = 2 * s + half;
        const uint2 c = row_codes_own_scale<DT, 128>(raw[s], row_w + r < nq, qs.hadamard != 0,
                                                     qs.had_scale, sg, &sc[s]);
        *(uint2 *)(tile + r * 128 + ((((c0 >> 4) ^ (r & 7))) << 4) + (c0 & 15)) = c;
    }
    /* row g was step g / 2 in lanes (g & 1) * 16 ..; row g + 8 four steps later */
    const int g = lane >> 2;
#pragma unroll
    for (int s = 0; s < A8Q_STEPS; ++s) {
        const float lo = __shfl_sync(0xffffffffu, sc[s], 0), hi = __shfl_sync(0xffffffffu, sc[s], 16);
        if ((g >> 1) == s) dq[0] = (g & 1) ? hi : lo;
        if ((g >> 1) + 4 == s) dq[1] = (g & 1) ? hi : lo;
    }
}

/* The consumer warpgroup cw's Q tile (rows 64 cw ..) and the thread's
 * scales, ready for wgmma: every warp's rows, then the async proxy's view
 * of them, then the warpgroup's barrier (3 + cw, also the V-Smooth
 * restore's, which comes later on the same threads). */
static __device__ __forceinline__ void attn8_q_tile(const qvc_q_src &qs, int bh, int row_w, int nq,
                                                    uint8_t *tile, int cw, float (&dq)[2]) {
    if (qs.x.dtype == QVA_BF16)
        attn8_q_rows<QVA_BF16>(qs, bh, row_w, nq, tile, dq);
    else
        attn8_q_rows<QVA_F16>(qs, bh, row_w, nq, tile, dq);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_sync(3 + cw, 128);
}

#endif
