/*
 * INT8 codes of one 16-bit row at a time, a lane holding 8 adjacent
 * channels (one 16-byte load), a row spread over D/8 adjacent lanes: the
 * Hadamard rotation and the per-row INT8 quantization of DA2 C.3, shared
 * by the Q and K preparation (prep/qk_plain.cu) and by the 8-bit
 * attention kernel, whose consumers make their Q tile's codes themselves
 * (dense/attn8_q.cuh).  The values are the CPU reference's bit for bit
 * (prep/prep_common.cuh says how: explicit _rn operations, qva_hadamard's
 * order of stages).
 */
#ifndef QVATTN_INT8_ROWS_CUH
#define QVATTN_INT8_ROWS_CUH

#include <math.h>
#include <stdint.h>

#include "common/device_util.cuh"
#include "common/quant_code.cuh"

#define ROW_CPL 8 /* channels per lane */

template <int D>
struct row_lanes {
    static constexpr int LPR = D / ROW_CPL; /* lanes per row; a power of two <= 32 */
};

/* The pair (a, b) -> (a + b, a - b) of qva_hadamard. */
static __device__ __forceinline__ void butterfly(float &a, float &b) {
    float s = __fadd_rn(a, b), d = __fsub_rn(a, b);
    a = s;
    b = d;
}

/* The Hadamard rotation's start within a lane of N adjacent channels: the
 * seeded signs (valid rows only: a padding row stays +0), then stages
 * h = 1 .. N/2 in qva_hadamard's order.  The stages across lanes follow in
 * the caller (row_rotate below, prep/qk.cu). */
template <int N>
static __device__ __forceinline__ void hadamard_in_lane(float *x, const float *sg, bool valid) {
    if (valid) {
#pragma unroll
        for (int e = 0; e < N; ++e) x[e] = __fmul_rn(x[e], sg[e]);
    }
#pragma unroll
    for (int h = 1; h < N; h <<= 1) {
#pragma unroll
        for (int e = 0; e < N; ++e)
            if (!(e & h)) butterfly(x[e], x[e + h]);
    }
}

/* qva_hadamard of the row (the lane's 8 channels sub*8 + e; +0 past n),
 * in its order of stages h = 1, 2, ... D/2: the signs, strides 1-4 within
 * the lane, strides 8 and up between lanes sub ^ h/8 (the lane without
 * that bit holds a and gets a + b, its partner a - b), then the scale.
 * Every lane of the warp calls it (the shuffles). */
template <int D>
static __device__ __forceinline__ void row_rotate(float had_scale, bool valid, const float *sg,
                                                  float *x) {
    const int sub = (threadIdx.x & 31) % row_lanes<D>::LPR;
    hadamard_in_lane<ROW_CPL>(x, sg, valid);
#pragma unroll
    for (int hl = 1; hl < row_lanes<D>::LPR; hl <<= 1) {
        /* o - x or x + o as one rounding of o + (+-1)x: the same value,
         * zeros' signs included, in one FFMA instead of two FADDs */
        const float side = (sub & hl) ? -1.0f : 1.0f;
#pragma unroll
        for (int e = 0; e < ROW_CPL; ++e) {
            const float o = __shfl_xor_sync(0xffffffffu, x[e], hl);
            x[e] = __fmaf_rn(side, x[e], o);
        }
    }
#pragma unroll
    for (int e = 0; e < ROW_CPL; ++e) x[e] = __fmul_rn(x[e], had_scale);
}

/* Max over a row's LPR lanes (xor offsets stay inside the row). */
template <int D>
static __device__ __forceinline__ float row_lanes_max(float x) {
#pragma unroll
    for (int o = row_lanes<D>::LPR / 2; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* The 8 codes of x (|x| <= the amax that made scale). */
static __device__ __forceinline__ uint2 row_codes8(const float *x, float scale, float rcp) {
    return make_uint2(qvc_int8_codes4_bounded(x, scale, rcp),
                      qvc_int8_codes4_bounded(x + 4, scale, rcp));
}

/* One query row with its own scale (DA2 C.3 over the row): the lane's 8
 * channels as loaded (u; +0 for a row past n, valid false), rotated if
 * rot (warp-uniform), their codes; *scale gets the row's scale in every
 * lane of the row. */
template <int DT, int D>
static __device__ __forceinline__ uint2 row_codes_own_scale(const uint4 &u, bool valid, bool rot,
                                                            float had_scale, const float *sg,
                                                            float *scale) {
    float x[ROW_CPL], amax = 0.0f;
    qvc_widen8<DT>(u, x);
    if (rot) row_rotate<D>(had_scale, valid, sg, x);
#pragma unroll
    for (int e = 0; e < ROW_CPL; ++e) amax = fmaxf(amax, fabsf(x[e]));
    *scale = qvc_int8_delta(row_lanes_max<D>(amax));
    return row_codes8(x, *scale, __frcp_rn(*scale));
}

#endif
