/*
 * 8-bit codes of quotients without a division per value, bit for bit the
 * codes of the reference's IEEE quotients.
 *
 * INT8 codes of x / delta with qva_int8_round's rule (src/cpu/formats.c:
 * NaN -> 0, clamp to +-127 first, then round half away from zero), four
 * values packed little-endian: the Q and K quantizers of the dense
 * preparation (prep/qk.cu) and of the draft (draft/prep.cu).
 *
 * The IEEE division per value (MUFU.RCP, refinement, the FCHK branch) and
 * roundf's conversion were most of those kernels' instructions.  Here the
 * quotient comes from one multiply p = x * rcp (rcp = 1/delta), rounded by
 * the magic-add (RNE), and the reference's own steps (__fdiv_rn, then
 * qvc_int8_round) run only where p could round differently:
 *   - p differs from the IEEE quotient fl(x / delta) by at most ~1.5 *
 *     2^-23 relative (rcp's and the product's roundings, plus the
 *     quotient's own): < 3.1e-5 wherever |p| < 127.25;
 *   - so where |p| < 127.25 and p lies more than 2^-13 from the nearest
 *     half-integer, both lie strictly inside one rounding interval, and
 *     RNE, round-half-away and the clamp at +-127 (an integer) give one
 *     code;
 *   - everything else (near a half-integer, |p| >= 127.25, NaN,
 *     infinities) takes the exact path.  delta = amax/127 + 1e-7 keeps
 *     |p| <= 127 for the values of its own row or block, so that path
 *     is rare (about 2^-12 of the values).
 * So the codes are the reference's bit for bit, not approximately.
 */
#ifndef QVATTN_CUDA_QUANT_CODE_CUH
#define QVATTN_CUDA_QUANT_CODE_CUH

#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "common/device_util.cuh"

/* qva_int8_round. */
static __device__ __forceinline__ int8_t qvc_int8_round(float y) {
    if (isnan(y)) return 0;
    if (y >= 127.0f) return 127;
    if (y <= -127.0f) return -127;
    return (int8_t)(int)roundf(y);
}

/* DA2 C.3's INT8 delta of a row or block with this amax: fl(fl(amax /
 * 127) + 1e-7), as qva_int8_quantize (src/cpu/formats.c) computes it. */
static __device__ __forceinline__ float qvc_int8_delta(float amax) {
    return __fadd_rn(__fdiv_rn(amax, 127.0f), 1e-7f);
}

#define QVC_INT8_MAGIC 12582912.0f /* 1.5 * 2^23: y + magic holds rint(y) in its low bits */
#define QVC_INT8_SAFE (0.5f - 1.0f / 8192.0f)

/* One value's fast code in the low byte of the result (the other bytes:
 * anything); *bad is set where the exact path must decide instead. */
static __device__ __forceinline__ uint32_t qvc_int8_code_fast(float x, float rcp, bool *bad) {
    const float p = __fmul_rn(x, rcp);
    const float m = __fadd_rn(p, QVC_INT8_MAGIC);
    const float f = __fsub_rn(p, __fsub_rn(m, QVC_INT8_MAGIC));
    /* |p| < 127.25 rounds to at most 127 (the clamp's value); NaN and
     * infinities fail both tests */
    *bad |= !(fabsf(f) < QVC_INT8_SAFE) || !(fabsf(p) < 127.25f);
    return __float_as_uint(m);
}

/* The exact path: qvc_int8_round(x_e / delta), packed.  Out of line, so
 * that the unrolled callers keep one copy of it and their registers. */
static __device__ __noinline__ uint32_t qvc_int8_codes4_exact(float x0, float x1, float x2,
                                                              float x3, float delta) {
    const float x[4] = {x0, x1, x2, x3};
    uint32_t w = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) w |= (uint32_t)(uint8_t)qvc_int8_round(__fdiv_rn(x[e], delta)) << (8 * e);
    return w;
}

/* qvc_int8_round(x[e] / delta) for e = 0..3, packed little-endian; rcp is
 * 1 / delta (any rounding: the bound above allows 2^-23 of error in it).
 * One rare branch for the four: a lane with a value near a boundary
 * recomputes all four exactly. */
static __device__ __forceinline__ uint32_t qvc_int8_codes4(const float *x, float delta, float rcp) {
    bool bad = false;
    const uint32_t c0 = qvc_int8_code_fast(x[0], rcp, &bad), c1 = qvc_int8_code_fast(x[1], rcp, &bad);
    const uint32_t c2 = qvc_int8_code_fast(x[2], rcp, &bad), c3 = qvc_int8_code_fast(x[3], rcp, &bad);
    if (__builtin_expect(bad, 0)) return qvc_int8_codes4_exact(x[0], x[1], x[2], x[3], delta);
    return __byte_perm(__byte_perm(c0, c1, 0x0040), __byte_perm(c2, c3, 0x0040), 0x5410);
}

/*
 * The same codes where the caller knows |x| <= amax for the delta it passes
 * (delta = fl(fl(amax / 127) + 1e-7), computed from these very values, as
 * the Q rows and K blocks of qk_plain.cu are).  Then |x * rcp| <= 127 (1 +
 * 2^-22) < 127.25 for every finite x, so only the distance to a half-integer
 * is tested, and the product is not rounded on its own:
 *   m = fma(x, rcp, magic) holds r = rint(x * rcp), the exact product
 *   rounded once; r = m - magic exactly; f = fma(x, rcp, -r) is x * rcp - r
 *   within 2^-25.  Where |f| < QVC_INT8_SAFE, x * rcp and the IEEE quotient
 *   (within ~1.5 * 2^-23 * 127 of each other) lie strictly inside r's
 *   rounding interval, so r is the reference's code (|r| <= 127, no clamp).
 * NaN x gives NaN f; infinite x makes amax infinite, rcp 0 and x * rcp NaN;
 * both take the exact path.  Three FP32 operations and one compare per value
 * instead of four and two.
 */
static __device__ __forceinline__ uint32_t qvc_int8_code_bounded(float x, float rcp, bool *bad) {
    const float m = __fmaf_rn(x, rcp, QVC_INT8_MAGIC);
    const float f = __fmaf_rn(x, rcp, -__fsub_rn(m, QVC_INT8_MAGIC));
    *bad |= !(fabsf(f) < QVC_INT8_SAFE);
    return __float_as_uint(m);
}

static __device__ __forceinline__ uint32_t qvc_int8_codes4_bounded(const float *x, float delta,
                                                                   float rcp) {
    bool bad = false;
    const uint32_t c0 = qvc_int8_code_bounded(x[0], rcp, &bad), c1 = qvc_int8_code_bounded(x[1], rcp, &bad);
    const uint32_t c2 = qvc_int8_code_bounded(x[2], rcp, &bad), c3 = qvc_int8_code_bounded(x[3], rcp, &bad);
    if (__builtin_expect(bad, 0)) return qvc_int8_codes4_exact(x[0], x[1], x[2], x[3], delta);
    return __byte_perm(__byte_perm(c0, c1, 0x0040), __byte_perm(c2, c3, 0x0040), 0x5410);
}

/*
 * E4M3 codes (RNE, saturating to +-448: qva_e4m3_encode) of x / s: the V
 * codes (prep/v.cu) and E4M3 Q / K (prep/qk.cu).  With p = x * (1/s), the
 * IEEE quotient lies between lo = p (1 - 2^-21) and hi = p (1 + 2^-21)
 * (p is within 3 * 2^-24 relative of it, lo and hi at least 7 * 2^-24
 * away from p), and rounding to E4M3 is monotone: where lo and hi get the
 * same code, so does the quotient.  Where they do not (a rounding
 * boundary in between), the exact division decides.  This needs 1/s to
 * carry 2^-24 relative error at most, so s and 1/s must be normal floats:
 * fast says so (checked once per scale, qvc_e4m3_fast_ok).
 */
#define QVC_E4M3_LO 0.99999952316284180f /* 1 - 2^-21 */
#define QVC_E4M3_HI 1.00000047683715820f /* 1 + 2^-21 */

/* A normal float: biased exponent 1..254 (CUDA has no device isnormal;
 * the host's constexpr one folds to false in device code). */
static __device__ __forceinline__ bool qvc_is_normal(float v) {
    return ((__float_as_uint(v) >> 23) & 0xFFu) - 1u < 254u;
}

static __device__ __forceinline__ bool qvc_e4m3_fast_ok(float s, float rcp) {
    return qvc_is_normal(s) && qvc_is_normal(rcp);
}

/* Four E4M3 codes packed little-endian, two per conversion. */
static __device__ __forceinline__ uint32_t qvc_e4m3_pack4(float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return __byte_perm(lo, hi, 0x5410);
}

/* qvc_e4m3(x[e] / s[e]) for e = 0..3, packed little-endian; rcp[e] = 1/s[e];
 * fast: qvc_e4m3_fast_ok held for all four scales. */
static __device__ __forceinline__ uint32_t qvc_e4m3_codes4(const float *x, const float *s,
                                                           const float *rcp, bool fast) {
    if (fast) {
        float lo[4], hi[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = __fmul_rn(x[e], rcp[e]);
            lo[e] = __fmul_rn(p, QVC_E4M3_LO);
            hi[e] = __fmul_rn(p, QVC_E4M3_HI);
        }
        const uint32_t wl = qvc_e4m3_pack4(lo[0], lo[1], lo[2], lo[3]);
        if (__builtin_expect(wl == qvc_e4m3_pack4(hi[0], hi[1], hi[2], hi[3]), 1)) return wl;
    }
    uint32_t w = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) w |= qvc_e4m3_code(__fdiv_rn(x[e], s[e])) << (8 * e);
    return w;
}

#endif
