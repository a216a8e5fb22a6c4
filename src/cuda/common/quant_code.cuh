/*
 * 8-bit codes of quotients without a division per value, bit for bit the
 * codes of the reference's IEEE quotients.
 *
 * INT8 codes of x / delta with qva_int8_round's rule (src/formats.c:
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
 * 127) + 1e-7), as qva_int8_quantize (src/formats.c) computes it. */
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
 * codes (prep/v.cu, prep/v_plain.cu, draft/prep.cu) and E4M3 Q / K
 * (prep/qk.cu).  The reference rounds the IEEE quotient fl(x / s) to
 * E4M3, so the quotient itself is made exactly, without a division, from
 * rcp = fl(1/s) by two remainder steps (Markstein's; CUDA's own div.rn
 * body has the same shape):
 *     p  = fl(x * rcp)                 within 1.5 ulp of x/s
 *     q1 = fl(p  + fl(x - s p)  * rcp) within 1 ulp (the fma's rounding
 *                                      of the remainder costs < 2^-22 ulp)
 *     q2 = fl(q1 + (x - s q1)  * rcp)  the remainder now exact; with rcp
 *                                      within half an ulp of 1/s and q1
 *                                      within an ulp, q2 = fl(x / s)
 * That needs no underflow in the remainders: it holds for |x/s| >= 2^-12
 * when s >= 2^-64 (e_s + e_q >= -103).  Below 2^-12 both quotients code
 * to +-0, and q2 then takes p's sign (x's, also for x = -0 and for
 * products that flush to zero, where the fmas' exact zeros would be +0).
 * A NaN x gives a NaN p (the device's canonical one): code 0x7F as the
 * reference's.  Overflow is excluded by the caller: |x| <= 2^64 s, which
 * every caller's scale gives (s from an amax over its own values).
 *
 * Why not the bracket p (1 -+ 2^-21) with a division where its codes
 * differ: V's scale amax/2.25 with bf16 values puts x/s on an E4M3
 * midpoint (significand 27 = 3 * 9) for about 0.6% of the values, so the
 * division ran in more than half of a warp's groups of four.
 *
 * tests/test_e4m3_quotient.c runs the same arithmetic on the host
 * against qva_e4m3_encode(x / s) (with QVA_FULL_SWEEP=1: every bf16 x
 * against fl(amax/2.25) and fl(amax/448) for every bf16 amax, 2e9 pairs,
 * no difference); tests/cuda_test_codes.cu checks the device code on the
 * boundaries and on every bf16 value against V's scales.
 */
#define QVC_E4M3_MIN_SCALE 0x1p-64f

/* A normal float: biased exponent 1..254 (CUDA has no device isnormal;
 * the host's constexpr one folds to false in device code). */
static __device__ __forceinline__ bool qvc_is_normal(float v) {
    return ((__float_as_uint(v) >> 23) & 0xFFu) - 1u < 254u;
}

/* The scale conditions of the division-free path: s >= 2^-64 and 1/s
 * normal (so s <= 2^126).  The caller adds its bound on |x| (above). */
static __device__ __forceinline__ bool qvc_e4m3_fast_ok(float s, float rcp) {
    return s >= QVC_E4M3_MIN_SCALE && qvc_is_normal(rcp);
}

/* mag's magnitude with sgn's sign: one LOP3 ((a & ~m) | (b & m), lut
 * 0xD8), where the C expression compiles to two. */
static __device__ __forceinline__ float qvc_with_sign_of(float mag, float sgn) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xD8;"
        : "=r"(r)
        : "r"(__float_as_uint(mag)), "r"(__float_as_uint(sgn)), "r"(0x80000000u));
    return __uint_as_float(r);
}

/* fl(x / s) to the E4M3 rounding's needs (above): exact where
 * |x/s| >= 2^-12, +-0-coded with x's sign below. */
static __device__ __forceinline__ float qvc_e4m3_quotient(float x, float s, float rcp) {
    const float p = __fmul_rn(x, rcp);
    const float q1 = __fmaf_rn(__fmaf_rn(-s, p, x), rcp, p);
    return qvc_with_sign_of(__fmaf_rn(__fmaf_rn(-s, q1, x), rcp, q1), p);
}

/* qvc_e4m3_quotient's q1 with p's sign, for the undemeaned codes of
 * 16-bit inputs only: x a bf16 or f16 value and s = fl(amax / 2.25) or
 * fl(amax / 448) with |x| <= amax (V's channel and block scales from the
 * values' own amax).  q1 may differ from fl(x / s) by an ulp, but a code
 * can differ only where that ulp straddles an E4M3 rounding boundary; no
 * such pair exists in that domain: tests/test_e4m3_quotient.c enumerates
 * it (QVA_FULL_SWEEP=1: every bf16 and f16 x against both scales of every
 * amax of its format, 4.0e9 pairs, 0 codes differ; a sample in CI) and
 * tests/cuda_test_codes.cu checks the device on every bf16 and f16 x
 * against sampled scales.  Two FFMAs per value fewer. */
static __device__ __forceinline__ float qvc_e4m3_quotient_in16(float x, float s, float rcp) {
    const float p = __fmul_rn(x, rcp);
    return qvc_with_sign_of(__fmaf_rn(__fmaf_rn(-s, p, x), rcp, p), p);
}

/* Four E4M3 codes packed little-endian, two per conversion (PTX's
 * e4m3x2 cvt puts its first operand in the upper byte).  Written in PTX
 * so that the two 16-bit halves join without the masks and byte
 * permutes the intrinsics' 16-bit results cost. */
static __device__ __forceinline__ uint32_t qvc_e4m3_pack4(float a, float b, float c, float d) {
    uint32_t w;
    asm("{\n\t.reg .b16 lo, hi;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
        "mov.b32 %0, {lo, hi};\n\t}"
        : "=r"(w)
        : "f"(a), "f"(b), "f"(c), "f"(d));
    return w;
}

/* qvc_e4m3(x[e] / s[e]) for e = 0..3, packed little-endian; rcp[e] = 1/s[e];
 * fast: qvc_e4m3_fast_ok held for all four scales and |x[e]| <= 2^64 s[e]
 * (or NaN); otherwise the IEEE division. */
static __device__ __forceinline__ uint32_t qvc_e4m3_codes4(const float *x, const float *s,
                                                           const float *rcp, bool fast) {
    if (fast)
        return qvc_e4m3_pack4(qvc_e4m3_quotient(x[0], s[0], rcp[0]), qvc_e4m3_quotient(x[1], s[1], rcp[1]),
                              qvc_e4m3_quotient(x[2], s[2], rcp[2]), qvc_e4m3_quotient(x[3], s[3], rcp[3]));
    uint32_t w = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) w |= qvc_e4m3_code(__fdiv_rn(x[e], s[e])) << (8 * e);
    return w;
}

/* V's two E4M3 digits (QVA_V_E4M3X2) of x[e] / s[e], e = 0..3, packed as
 * qvc_e4m3_codes4: hi the code of q = fl(x/s) (qvc_e4m3_codes4's codes),
 * lo the code of q - dec(hi), one FP32 subtraction, as qvi_v8_prepare.
 * Where the fast quotient is not exact (|q| < 2^-12) both codes are 0. */
static __device__ __forceinline__ void qvc_e4m3_digits4(const float *x, const float *s,
                                                        const float *rcp, bool fast,
                                                        uint32_t *hi, uint32_t *lo) {
    float q[4], r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
        q[e] = fast ? qvc_e4m3_quotient(x[e], s[e], rcp[e]) : __fdiv_rn(x[e], s[e]);
    *hi = qvc_e4m3_pack4(q[0], q[1], q[2], q[3]);
#pragma unroll
    for (int e = 0; e < 4; ++e) r[e] = __fsub_rn(q[e], qvc_e4m3_value((*hi >> (8 * e)) & 0xFFu));
    *lo = qvc_e4m3_pack4(r[0], r[1], r[2], r[3]);
}

/* qvc_e4m3_codes4 for the domain of qvc_e4m3_quotient_in16 (16-bit
 * inputs, undemeaned, a scale from their own amax). */
static __device__ __forceinline__ uint32_t qvc_e4m3_codes4_in16(const float *x, const float *s,
                                                                const float *rcp, bool fast) {
    if (fast)
        return qvc_e4m3_pack4(qvc_e4m3_quotient_in16(x[0], s[0], rcp[0]),
                              qvc_e4m3_quotient_in16(x[1], s[1], rcp[1]),
                              qvc_e4m3_quotient_in16(x[2], s[2], rcp[2]),
                              qvc_e4m3_quotient_in16(x[3], s[3], rcp[3]));
    return qvc_e4m3_codes4(x, s, rcp, false);
}

#endif
