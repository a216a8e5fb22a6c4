/*
 * ExpCast's code arithmetic in the Hopper 8-bit kernel
 * (src/cuda/dense/attn8_ws.cuh, via common/hopper.cuh), in one header that the kernel and its CPU
 * test (tests/test_expcast_magic.c) both compile, so the test checks the
 * expressions the GPU runs (docs/NUMERICS.md §6, "The wgmma kernel's score
 * arithmetic").
 *
 *   qvi_expcast_bits   ExpCast's t = 8u + A rounded to an integer code
 *                      by the magic add (RNE, as rintf), clamped below at 0;
 *                      the code is the low byte of the result's bits (the
 *                      form the test checks against the reference; the
 *                      kernels run the saturating one below)
 *   qvi_expcast_c      the per-row constant A - 8m of the fused form
 *                      t = x * 8f + (A - 8m), one FMA per score
 *   qvi_expcast_ts     the saturating form of the same code: ts = t/128
 *                      from one FMA whose saturation to [0, 1] is the clamp,
 *   qvi_expcast_bits_sat  then ts + 2^16 rounds 128 ts to the code; the
 *                      same code as qvi_expcast_bits(t) with one
 *                      instruction (the max) fewer per score
 * A = 120 + beta is ExpCast's addend (qvi_expcast_addend): 119.65 with the
 * paper's beta, 119.55 with the centred one (qvattn.h, QVA_EXPCAST_BETA*).
 */
#ifndef QVATTN_EXPCAST_MAGIC_H
#define QVATTN_EXPCAST_MAGIC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define QVI_HD static __host__ __device__ __forceinline__
#else
#define QVI_HD static inline
#endif

/* Round-to-nearest adds that nvcc may never contract into an FMA (C11 in
 * ISO mode does not contract either). */
#ifdef __CUDA_ARCH__
#define QVI_ADD_RN(a, b) __fadd_rn((a), (b))
#else
#define QVI_ADD_RN(a, b) ((a) + (b))
#endif

#define QVI_MAGIC 12582912.0f /* 1.5 * 2^23: ulp 1 from 2^23 to 2^24 */

QVI_HD float qvi_bits_float(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}
QVI_HD uint32_t qvi_float_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* The addend 120 + beta, as the float qva_expcast_e4m3_beta computes it. */
QVI_HD float qvi_expcast_addend(float beta) { return 120.0f + beta; }

/* Bits whose low byte is the ExpCast E4M3 code of t (t <= 120.5; for
 * u <= 0, t <= A < 120).  t < 0, -inf and NaN give code 0. */
QVI_HD uint32_t qvi_expcast_bits(float t) {
    return qvi_float_bits(fmaxf(QVI_ADD_RN(t, QVI_MAGIC), QVI_MAGIC));
}

/* The reference argument: t = fma(8, u, A) with u = s - m. */
QVI_HD float qvi_expcast_t(float u, float add) { return fmaf(8.0f, u, add); }

/* The fused form's per-row constant, so that t = fma(x, 8f, c). */
QVI_HD float qvi_expcast_c(float m, float add) { return fmaf(-8.0f, m, add); }
/* +expcast-e5m2's constant A - 4m (four codes per doubling). */
QVI_HD float qvi_expcast5_c(float m, float add) { return fmaf(-4.0f, m, add); }

/* The saturating form.  With f16 = f/16 and c128 = c/128 (exact: powers of
 * two), fma(x, f16, c128) is t/128 rounded once, so exactly t/128 while
 * both terms and the result are normal floats.  Where one is not, t is
 * below 2^-119 or f below 2^-122 (c = A - 8m is 0 or above 2^-114, being
 * a difference of floats near 120 and 8m); then t and the computed ts both
 * round to c's own code, or to 0.  The saturation to [0, 1] sends t < 0,
 * -inf and NaN to 0, which is the clamp; t never reaches 128 (t <= A + an
 * ulp).  On [0, 1], ts + 2^16 has ulp 2^-7, so its low byte is 128 ts
 * rounded to nearest even: the magic add's code.  tests/test_expcast_magic.c
 * compares the two forms bit for bit. */
#define QVI_SAT_MAGIC 65536.0f /* 2^16: ulp 2^-7 on [2^16, 2^17) */

QVI_HD float qvi_sat01(float t) {
#ifdef __CUDA_ARCH__
    return __saturatef(t); /* folds into the FMA as FFMA.SAT */
#else
    return t > 0.0f ? (t < 1.0f ? t : 1.0f) : 0.0f; /* NaN -> 0, as .sat */
#endif
}

QVI_HD float qvi_expcast_ts(float x, float f16, float c128) {
    return qvi_sat01(fmaf(x, f16, c128));
}

QVI_HD uint32_t qvi_expcast_bits_sat(float ts) {
    return qvi_float_bits(QVI_ADD_RN(ts, QVI_SAT_MAGIC));
}

#endif
