/*
 * The division-free E4M3 quotient of src/cuda/common/quant_code.cuh
 * (qvc_e4m3_quotient), written again here in C with the same operations
 * (one product by rcp = fl(1/s), two remainder steps by fmaf, the sign
 * from the product), against the reference qva_e4m3_encode(x / s).  The
 * device code is checked on the GPU by tests/cuda_test_codes.cu; this
 * test keeps the arithmetic argument of that header honest on any
 * machine, on the values V's codes meet:
 *   - every finite bf16 x with |x| <= amax against s = fl(amax / 2.25)
 *     (V's channel scale) and fl(amax / 448) (the fp8 block scale), for
 *     amax over every 31st positive bf16 and every bf16 significand in
 *     three binades; QVA_FULL_SWEEP=1 takes every bf16 amax (2e9 pairs,
 *     a minute or so);
 *   - random pairs over the whole range the header allows (s >= 2^-64,
 *     |x| <= 2^64 s), subnormal x, signed zeros and NaN included;
 *   - the one-step form (qvc_e4m3_quotient_in16) on its domain: the bf16
 *     pairs above and every f16 x against both scales of every 31st
 *     positive f16 amax (QVA_FULL_SWEEP=1: every one; with the bf16
 *     sweep 4.0e9 pairs).
 * It also counts where rounding the plain product x * rcp would differ,
 * so the sweep is shown to reach the cases that need the remainders.
 */
#define TEST_RNG_SEED 0x13198A2E03707344ull
#include "check.h"

#include <stdint.h>
#include <stdlib.h>

#include "expcast_magic.h" /* qvi_float_bits, qvi_bits_float */
#include "internal.h" /* qvi_f16_bits_to_float */
#include "qvattn.h"

/* A product rounded on its own (volatile: never fused into a later fma). */
static float mul_rn(float a, float b) {
    volatile float r = a * b;
    return r;
}

/* qvc_e4m3_quotient: fl(x / s) where |x / s| >= 2^-12, else a value that
 * codes to +-0 with x's sign. */
static float quotient(float x, float s, float rcp) {
    const float p = mul_rn(x, rcp);
    const float q1 = fmaf(fmaf(-s, p, x), rcp, p);
    const float q2 = fmaf(fmaf(-s, q1, x), rcp, q1);
    return qvi_bits_float((qvi_float_bits(q2) & 0x7FFFFFFFu) | (qvi_float_bits(p) & 0x80000000u));
}

/* qvc_e4m3_quotient_in16: q1 alone, with p's sign, for 16-bit x against
 * a scale of their own amax. */
static float quotient_in16(float x, float s, float rcp) {
    const float p = mul_rn(x, rcp);
    const float q1 = fmaf(fmaf(-s, p, x), rcp, p);
    return qvi_bits_float((qvi_float_bits(q1) & 0x7FFFFFFFu) | (qvi_float_bits(p) & 0x80000000u));
}

/* qvc_e4m3_fast_ok and the callers' bound on |x|. */
static int fast_ok(float x, float s, float rcp) {
    return s >= 0x1p-64f && isnormal(rcp) && !(fabsf(x) > 0x1p64f * s);
}

static long n_pairs, n_bad, n_naive, n_in16, n_in16_bad, n_q1_float;

/* in16: x is a bf16 or f16 value and s a scale of an amax >= |x|, the
 * domain of the one-step form, which is checked there too. */
static void one(float x, float s, int in16) {
    const float rcp = 1.0f / s;
    if (!fast_ok(x, s, rcp)) return;
    const uint8_t ref = qva_e4m3_encode(x / s);
    const uint8_t got = qva_e4m3_encode(quotient(x, s, rcp));
    ++n_pairs;
    n_naive += qva_e4m3_encode(mul_rn(x, rcp)) != ref;
    if (got != ref && n_bad++ < 8)
        fprintf(stderr, "x %a s %a: code %02x, reference %02x\n", x, s, got, ref);
    if (!in16) return;
    const float q1 = quotient_in16(x, s, rcp);
    ++n_in16;
    n_q1_float += fabsf(q1) != fabsf(x / s) && !isnan(q1);
    if (qva_e4m3_encode(q1) != ref && n_in16_bad++ < 8)
        fprintf(stderr, "one step: x %a s %a: code %02x, reference %02x\n", x, s,
                qva_e4m3_encode(q1), ref);
}

/* Every finite bf16 (f16: 0) x with |x| <= amax, against both scales of
 * amax. */
static void sweep_amax(float amax, int bf16) {
    const float s[2] = {amax / 2.25f, amax / 448.0f};
    for (uint32_t b = 0; b < 0x10000u; ++b) {
        const float x = bf16 ? qvi_bits_float(b << 16) : qvi_f16_bits_to_float((uint16_t)b);
        if (!(fabsf(x) <= amax)) continue; /* also NaN and infinities */
        one(x, s[0], 1);
        one(x, s[1], 1);
    }
}

static void random_pairs(long n) {
    const float specials[] = {0.0f, -0.0f, NAN, -NAN, 0x1p-149f, -0x1p-140f};
    for (long i = 0; i < n; ++i) {
        const float s = (float)exp2(-64.0 + 164.0 * rng_unit()) * (float)(1.0 + rng_unit());
        float x;
        switch (i % 4) {
        case 0: /* any finite float within the bound */
            x = qvi_bits_float((uint32_t)rng_u64());
            break;
        case 1: /* near the scale: E4M3's range */
            x = s * (float)ldexp(1.0 + rng_unit(), (int)(rng_unit() * 22.0) - 12);
            break;
        case 2: /* subnormal x */
            x = qvi_bits_float((uint32_t)rng_u64() & 0x807FFFFFu);
            break;
        default:
            x = specials[(rng_u64() >> 33) % 6];
        }
        if (isinf(x)) continue;
        one(x, s, 0);
    }
}

int main(void) {
    const char *full = getenv("QVA_FULL_SWEEP");
    const uint32_t stride = full && full[0] == '1' ? 1u : 31u;
    for (uint32_t a = 1; a < 0x7F80u; a += stride) sweep_amax(qvi_bits_float(a << 16), 1);
    for (int ex = -3; ex <= 9; ex += 6)
        for (int sig = 0; sig < 128; ++sig) sweep_amax(ldexpf(1.0f + sig / 128.0f, ex), 1);
    for (uint32_t a = 1; a < 0x7C00u; a += stride) sweep_amax(qvi_f16_bits_to_float((uint16_t)a), 0);
    random_pairs(2000000);
    printf("e4m3 quotient: %ld pairs, %ld differ from the reference; the plain product would "
           "differ in %ld\n", n_pairs, n_bad, n_naive);
    printf("one step on 16-bit values: %ld pairs, %ld codes differ; its quotient differs from "
           "fl(x / s) in %ld\n", n_in16, n_in16_bad, n_q1_float);
    CHECK(n_bad == 0, "%ld codes differ", n_bad);
    CHECK(n_in16_bad == 0, "one step: %ld codes differ", n_in16_bad);
    CHECK(n_q1_float > 0, "the one-step quotient was always exact: the check could not fail");
    CHECK(n_naive > 0, "no pair reached a rounding boundary");
    CHECK(n_pairs > 10000000, "only %ld pairs", n_pairs);
    return check_summary("test_e4m3_quotient");
}
