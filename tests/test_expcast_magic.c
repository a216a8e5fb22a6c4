/*
 * The conversion-free score arithmetic of the Hopper kernel
 * (src/expcast_magic.h, compiled here exactly as the kernel compiles it):
 *  (a) the magic-add ExpCast code equals the reference qva_expcast_e4m3_beta
 *      on every u <= 0 tried (dense float grid plus edges), for the paper's
 *      beta and the centred one;
 *  (b) the fused form t = x * 8f + (A - 8m) that ws4 and later use
 *      moves a code by at most one step, and rarely: the measured rate is
 *      printed and bounded, for both betas;
 *  (c) the saturating form (ts = t/128 by one FMA saturated to [0, 1], code
 *      from ts + 2^16) gives the fused form's code bit for bit: on the
 *      kernel's score distribution, on exact rounding ties, and on the
 *      edges (masked -inf scores, NaN, zero, tiny and subnormal scales).
 */
#define TEST_RNG_SEED 0x2545F4914F6CDD1Dull
#include "check.h"
#include "expcast_magic.h"
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>

static uint8_t magic_code(float u, float beta) {
    return (uint8_t)(qvi_expcast_bits(qvi_expcast_t(u, qvi_expcast_addend(beta))) & 0xFFu);
}

static void test_code_equals_reference(float beta) {
    long n = 0, bad = 0;
    /* every float u in [-32, 0] whose bits are a multiple of 64 apart */
    for (uint32_t b = 0x80000000u; b <= qvi_float_bits(-32.0f); b += 64) {
        const float u = qvi_bits_float(b);
        const uint8_t ref = qva_expcast_e4m3_beta(u, beta);
        ++n;
        if (magic_code(u, beta) != ref) {
            if (bad++ < 3) fprintf(stderr, "  u = %.9g: %d vs %d\n", u, magic_code(u, beta), ref);
        }
    }
    CHECK(bad == 0, "beta %g: %ld of %ld u values give another code", (double)beta, bad, n);
    const float edges[] = {-0.0f, 0.0f, -1e-30f, -0.0435f, -0.04375f, -0.05625f, -0.06875f,
                           -14.94f, -14.95f, -14.956f, -15.0f, -1e30f, -INFINITY};
    for (size_t i = 0; i < sizeof edges / sizeof *edges; ++i)
        CHECK(magic_code(edges[i], beta) == qva_expcast_e4m3_beta(edges[i], beta),
              "beta %g, u = %g: %d vs %d", (double)beta, (double)edges[i],
              magic_code(edges[i], beta), qva_expcast_e4m3_beta(edges[i], beta));
    CHECK((qvi_expcast_bits(NAN) & 0xFFu) == 0, "NaN gives code 0");
}

/* The paper's addend is VC Eq. 7's 119.65 (the float 0x42EF4CCD). */
static void test_addends(void) {
    CHECK(qvi_expcast_addend(QVA_EXPCAST_BETA) == 119.65f, "paper addend %.9g",
          (double)qvi_expcast_addend(QVA_EXPCAST_BETA));
    CHECK(qvi_expcast_beta(QVA_EXPCAST_PAPER) == QVA_EXPCAST_BETA, "paper beta");
    CHECK(qvi_expcast_beta(QVA_EXPCAST_CENTRED) == QVA_EXPCAST_BETA_CENTRED, "centred beta");
}

/* Scores as the kernel sees them: an INT32 dot x, a scale f = dq*dk*log2e*
 * sm_scale, the row max m = x_max * f. */
static void test_fused_flip_rate(float beta) {
    const float add = qvi_expcast_addend(beta);
    const long n = 4000000;
    long flips = 0, worse = 0;
    for (long i = 0; i < n; ++i) {
        const float f = (float)exp(log(1e-5) + rng_unit() * (log(2e-3) - log(1e-5)));
        const int32_t xmax = (int32_t)(rng_u64() % (1u << 21)) - (1 << 20);
        /* the x whose u lies in [-16, 0], where codes are non-zero */
        const int32_t span = (int32_t)(16.0f / f) + 1;
        const int32_t x = xmax - (int32_t)(rng_u64() % (uint64_t)span);
        const float m = (float)xmax * f;
        const uint8_t ref = qva_expcast_e4m3_beta((float)x * f - m, beta);
        const uint8_t fused =
            (uint8_t)(qvi_expcast_bits(fmaf((float)x, 8.0f * f, qvi_expcast_c(m, add))) & 0xFFu);
        const int d = (int)fused - (int)ref;
        if (d) ++flips;
        if (d > 1 || d < -1) ++worse;
    }
    const double rate = (double)flips / (double)n;
    printf("fused ExpCast argument, beta %g: %ld of %ld codes (%.2e) one step from the reference\n",
           (double)beta, flips, n, rate);
    CHECK(worse == 0, "%ld codes more than one step off", worse);
    CHECK(rate < 1e-3, "flip rate %.3e (bound 1e-3)", rate);
}

static uint8_t fused_code(float x, float f, float c) {
    return (uint8_t)(qvi_expcast_bits(fmaf(x, 8.0f * f, c)) & 0xFFu);
}
static uint8_t sat_code(float x, float f, float c) {
    return (uint8_t)(qvi_expcast_bits_sat(qvi_expcast_ts(x, 0.0625f * f, 0.0078125f * c)) & 0xFFu);
}

static void test_sat_form(float beta) {
    const float add = qvi_expcast_addend(beta);
    long n = 0, bad = 0;
    /* the kernel's scores (test_fused_flip_rate's distribution) */
    for (long i = 0; i < 4000000; ++i, ++n) {
        const float f = (float)exp(log(1e-5) + rng_unit() * (log(2e-3) - log(1e-5)));
        const int32_t xmax = (int32_t)(rng_u64() % (1u << 21)) - (1 << 20);
        const int32_t span = (int32_t)(24.0f / f) + 1;
        const int32_t x = xmax - (int32_t)(rng_u64() % (uint64_t)span);
        const float c = qvi_expcast_c((float)xmax * f, add);
        if (fused_code((float)x, f, c) != sat_code((float)x, f, c)) ++bad;
    }
    /* exact ties: 8f = 1 and c = k + 1/2 put t on every half-integer up to
     * the largest t a row can reach (its max gives t = A < 120) */
    for (int k = -200; k <= 120; ++k)
        for (int32_t x = -300; x + k <= 119; ++x, ++n)
            if (fused_code((float)x, 0.125f, (float)k + 0.5f) != sat_code((float)x, 0.125f, (float)k + 0.5f))
                ++bad;
    /* edges: masked keys, NaN, zero and tiny scales, +-inf constants, where
     * t = x 8f + c stays at or below 120 (or is NaN) as in a row */
    const float fs[] = {0.0f, 1e-30f, 1e-37f, 1.2e-38f, 1e-40f, 1e-45f, 3e-4f, 1.0f, NAN, INFINITY};
    const float cs[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.5f, 2.5f, 119.5f, add, -3.0f, -INFINITY, NAN};
    const float xs[] = {0.0f, 1.0f, -1.0f, 4e6f, -4e6f, -INFINITY, NAN};
    for (size_t a = 0; a < sizeof fs / sizeof *fs; ++a)
        for (size_t b = 0; b < sizeof cs / sizeof *cs; ++b)
            for (size_t d = 0; d < sizeof xs / sizeof *xs; ++d) {
                const float t = fmaf(xs[d], 8.0f * fs[a], cs[b]);
                if (t > 120.0f) continue;
                ++n;
                if (fused_code(xs[d], fs[a], cs[b]) != sat_code(xs[d], fs[a], cs[b])) {
                    ++bad;
                    fprintf(stderr, "sat form: x %g f %g c %g: %u vs %u\n", (double)xs[d],
                            (double)fs[a], (double)cs[b], fused_code(xs[d], fs[a], cs[b]),
                            sat_code(xs[d], fs[a], cs[b]));
                }
            }
    printf("saturating ExpCast form, beta %g: %ld of %ld codes differ from the fused form\n",
           (double)beta, bad, n);
    CHECK(bad == 0, "%ld of %ld saturating codes differ", bad, n);
}

int main(void) {
    test_addends();
    test_code_equals_reference(QVA_EXPCAST_BETA);
    test_code_equals_reference(QVA_EXPCAST_BETA_CENTRED);
    test_fused_flip_rate(QVA_EXPCAST_BETA);
    test_fused_flip_rate(QVA_EXPCAST_BETA_CENTRED);
    test_sat_form(QVA_EXPCAST_BETA);
    test_sat_form(QVA_EXPCAST_BETA_CENTRED);
    return check_summary("test_expcast_magic");
}
