/*
 * Bit-exact tests of the number formats in src/formats.c: E4M3, E2M1,
 * BF16/FP16 rounding, INT8, NVFP4 (DA2 Eq. 23-24), the Hadamard transform
 * and the internal block quantizers.  References are written differently
 * from the implementation (brute-force nearest search over the code table,
 * or a table of exactly decoded 16-bit values) so a shared mistake in the
 * rounding arithmetic cannot hide.
 */
#define TEST_RNG_SEED 0x243F6A8885A308D3ull
#include "check.h"
#include "internal.h"

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ helpers */


/* Any finite float, uniform over bit patterns (covers every binade). */
static float rng_any_finite_float(void) {
    for (;;) {
        uint32_t b = (uint32_t)rng_u64();
        float f;
        memcpy(&f, &b, sizeof f);
        if (isfinite(f))
            return f;
    }
}

/* Sign times 2^U(lo, hi): log-uniform magnitudes. */
static float rng_log_uniform(double lo, double hi) {
    double e = lo + (hi - lo) * rng_unit();
    double s = (rng_u64() & 1) ? -1.0 : 1.0;
    return (float)(s * exp2(e));
}

static int same_float(float a, float b) {
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0; /* distinguishes -0 and +0 */
}

/* ------------------------------------------------------------ E4M3 */

/* Brute force: the positive code whose value is nearest to |x| (ties to
 * the even code), 0x7E for |x| > 448, sign from signbit. */
static uint8_t e4m3_reference(float x) {
    if (isnan(x))
        return 0x7F;
    double a = fabs((double)x);
    unsigned best = 0x7E;
    if (a <= 448.0) {
        double best_d = INFINITY;
        for (unsigned c = 0; c <= 0x7E; ++c) {
            double d = fabs((double)qva_e4m3_decode((uint8_t)c) - a);
            if (d < best_d || (d == best_d && (c & 1u) == 0u)) {
                best_d = d;
                best = c;
            }
        }
    }
    return (uint8_t)(best | (signbit(x) ? 0x80u : 0u));
}

static void test_e4m3_decode_values(void) {
    CHECK(qva_e4m3_decode(0x00) == 0.0f && !signbit(qva_e4m3_decode(0x00)),
          "+0");
    CHECK(qva_e4m3_decode(0x80) == 0.0f && signbit(qva_e4m3_decode(0x80)),
          "-0");
    CHECK(qva_e4m3_decode(0x01) == 0x1p-9f, "min subnormal");
    CHECK(qva_e4m3_decode(0x07) == 7 * 0x1p-9f, "max subnormal");
    CHECK(qva_e4m3_decode(0x08) == 0x1p-6f, "min normal");
    CHECK(qva_e4m3_decode(0x38) == 1.0f, "one");
    CHECK(qva_e4m3_decode(0x6B) == 88.0f, "0x6B = 88");
    CHECK(qva_e4m3_decode(0x78) == 256.0f, "0x78 = 256");
    CHECK(qva_e4m3_decode(0x7E) == 448.0f, "max");
    CHECK(qva_e4m3_decode(0xFE) == -448.0f, "-max");
    CHECK(isnan(qva_e4m3_decode(0x7F)) && isnan(qva_e4m3_decode(0xFF)),
          "NaN codes");
    /* Strictly increasing over the positive finite codes. */
    for (unsigned c = 0; c < 0x7E; ++c)
        CHECK(qva_e4m3_decode((uint8_t)c) <
                  qva_e4m3_decode((uint8_t)(c + 1)),
              "monotone at %#x", c);
}

static void test_e4m3_roundtrip(void) {
    for (unsigned c = 0; c < 256; ++c) {
        float v = qva_e4m3_decode((uint8_t)c);
        uint8_t back = qva_e4m3_encode(v);
        uint8_t want = ((c & 0x7Fu) == 0x7Fu) ? 0x7F : (uint8_t)c;
        CHECK(back == want, "code %#x -> %g -> %#x", c, (double)v, back);
    }
}

/* Every midpoint between adjacent codes goes to the even code; one float
 * either side goes to the nearer code. */
static void test_e4m3_midpoints(void) {
    for (unsigned c = 0; c < 0x7E; ++c) {
        float lo = qva_e4m3_decode((uint8_t)c);
        float hi = qva_e4m3_decode((uint8_t)(c + 1));
        float mid = 0.5f * (lo + hi); /* exact: at most 5 significant bits */
        CHECK((double)mid == 0.5 * ((double)lo + (double)hi), "mid exact");
        unsigned even = (c & 1u) ? c + 1 : c;
        CHECK(qva_e4m3_encode(mid) == even, "mid %g -> %#x want %#x",
              (double)mid, qva_e4m3_encode(mid), even);
        CHECK(qva_e4m3_encode(-mid) == (even | 0x80u), "-mid %g",
              (double)mid);
        CHECK(qva_e4m3_encode(nextafterf(mid, 0.0f)) == c, "below mid %#x",
              c);
        CHECK(qva_e4m3_encode(nextafterf(mid, INFINITY)) == c + 1,
              "above mid %#x", c);
    }
}

static void test_e4m3_edges(void) {
    const float sat[] = {448.0f, 448.5f, 449.0f, 463.99f, 464.0f, 480.0f,
                         1e9f,   FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof sat / sizeof sat[0]; ++i) {
        CHECK(qva_e4m3_encode(sat[i]) == 0x7E, "sat %g", (double)sat[i]);
        CHECK(qva_e4m3_encode(-sat[i]) == 0xFE, "sat -%g", (double)sat[i]);
    }
    CHECK(qva_e4m3_encode(NAN) == 0x7F, "NaN");
    CHECK(qva_e4m3_encode(-NAN) == 0x7F, "-NaN");
    CHECK(qva_e4m3_encode(0.0f) == 0x00, "+0");
    CHECK(qva_e4m3_encode(-0.0f) == 0x80, "-0");
    /* Subnormal range: quantum 2^-9. */
    CHECK(qva_e4m3_encode(0x1p-10f) == 0x00, "2^-10 ties to 0");
    CHECK(qva_e4m3_encode(nextafterf(0x1p-10f, 1.0f)) == 0x01, "> 2^-10");
    CHECK(qva_e4m3_encode(3 * 0x1p-10f) == 0x02, "1.5 q ties to 2 q");
    CHECK(qva_e4m3_encode(FLT_TRUE_MIN) == 0x00, "float denormal");
    CHECK(qva_e4m3_encode(-FLT_TRUE_MIN) == 0x80, "-float denormal");
    CHECK(qva_e4m3_encode(-1e-30f) == 0x80, "tiny negative -> -0");
    /* Subnormal-to-normal carry: 7.5 q ties to 8 q = 2^-6. */
    CHECK(qva_e4m3_encode(15 * 0x1p-10f) == 0x08, "carry into normal");
    CHECK(qva_e4m3_encode(0x1p-6f) == 0x08, "min normal");
    /* Mantissa carry into the next binade: 1.9375 ties to 2. */
    CHECK(qva_e4m3_encode(1.9375f) == 0x40, "carry to 2.0");
    CHECK(qva_e4m3_encode(1.9f) == 0x3F, "1.9 -> 1.875");
    CHECK(qva_e4m3_encode(432.0f) == 0x7E, "432 ties to 448 (even)");
    CHECK(qva_e4m3_encode(nextafterf(432.0f, 0.0f)) == 0x7D, "< 432");
}

static void test_e4m3_brute_force(void) {
    int bad = 0;
    for (int i = 0; i < 200000; ++i) {
        float x = (i & 1) ? rng_log_uniform(-12.0, 9.5)
                          : rng_any_finite_float();
        if (qva_e4m3_encode(x) != e4m3_reference(x) && bad++ == 0)
            fprintf(stderr, "first E4M3 mismatch at %a\n", (double)x);
    }
    CHECK(bad == 0, "%d E4M3 encodings differ from brute force", bad);
}

/* ------------------------------------------------------------ E2M1 */

static uint8_t e2m1_reference(float x) {
    if (isnan(x))
        return 0;
    double a = fabs((double)x);
    unsigned best = 7; /* beyond 6 every value saturates */
    double best_d = (a > 6.0) ? -1.0 : INFINITY;
    for (unsigned c = 0; c < 8; ++c) {
        double d = fabs((double)qva_e2m1_decode((uint8_t)c) - a);
        if (d < best_d || (d == best_d && (c & 1u) == 0u)) {
            best_d = d;
            best = c;
        }
    }
    return (uint8_t)(best | (signbit(x) ? 8u : 0u));
}

static void test_e2m1(void) {
    const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (unsigned c = 0; c < 16; ++c) {
        float v = qva_e2m1_decode((uint8_t)c);
        float want = (c & 8u) ? -mags[c & 7u] : mags[c & 7u];
        CHECK(same_float(v, want), "decode %#x = %g", c, (double)v);
        CHECK(qva_e2m1_encode(v) == c, "round trip %#x", c);
    }
    const struct { float x; uint8_t code; } ties[] = {
        {0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4},
        {2.5f, 4},  {3.5f, 6},  {5.0f, 6},
    };
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; ++i) {
        float x = ties[i].x;
        CHECK(qva_e2m1_encode(x) == ties[i].code, "tie %g", (double)x);
        CHECK(qva_e2m1_encode(-x) == (ties[i].code | 8u), "tie -%g",
              (double)x);
        CHECK(qva_e2m1_encode(nextafterf(x, 0.0f)) ==
                  e2m1_reference(nextafterf(x, 0.0f)),
              "below tie %g", (double)x);
        CHECK(qva_e2m1_encode(nextafterf(x, 9.0f)) ==
                  e2m1_reference(nextafterf(x, 9.0f)),
              "above tie %g", (double)x);
    }
    CHECK(qva_e2m1_encode(nextafterf(0.25f, 1.0f)) == 1, "> 0.25 -> 0.5");
    CHECK(qva_e2m1_encode(nextafterf(5.0f, 9.0f)) == 7, "> 5 -> 6");
    CHECK(qva_e2m1_encode(6.5f) == 7 && qva_e2m1_encode(1e30f) == 7 &&
              qva_e2m1_encode(INFINITY) == 7,
          "saturate to 6");
    CHECK(qva_e2m1_encode(-INFINITY) == 15, "saturate to -6");
    CHECK(qva_e2m1_encode(NAN) == 0, "NaN -> 0");
    CHECK(qva_e2m1_encode(-0.1f) == 8, "small negative keeps its sign");
    int bad = 0;
    for (int i = 0; i < 100000; ++i) {
        float x = (i & 1) ? rng_log_uniform(-4.0, 3.5)
                          : rng_any_finite_float();
        bad += qva_e2m1_encode(x) != e2m1_reference(x);
    }
    CHECK(bad == 0, "%d E2M1 encodings differ from brute force", bad);
}

/* ------------------------------------------------------------ BF16/FP16 */

/* Exact value of a non-negative 16-bit float with the given field widths;
 * the all-ones exponent (Inf) is given the value 2^(emax+1), the grid
 * point IEEE RNE rounds towards on overflow. */
static double value16(unsigned bits, int ebits, int mbits) {
    int bias = (1 << (ebits - 1)) - 1;
    unsigned e = bits >> mbits, m = bits & ((1u << mbits) - 1u);
    if (e == 0)
        return ldexp((double)m, 1 - bias - mbits);
    return ldexp((double)((1u << mbits) + m), (int)e - bias - mbits);
}

/* Nearest 16-bit value by binary search over the bit patterns (ordered
 * like the values), ties to the even pattern, Inf past the top. */
static float round16_reference(float x, int ebits, int mbits) {
    if (isnan(x))
        return NAN;
    unsigned inf_bits = ((1u << ebits) - 1u) << mbits;
    double a = fabs((double)x);
    unsigned lo = 0, hi = inf_bits; /* value16(lo) <= a < value16(hi)? */
    if (a >= value16(inf_bits, ebits, mbits))
        return copysignf(INFINITY, x);
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (value16(mid, ebits, mbits) <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dl = a - value16(lo, ebits, mbits);
    double dh = value16(hi, ebits, mbits) - a;
    unsigned pick = (dl < dh || (dl == dh && (lo & 1u) == 0u)) ? lo : hi;
    float r = (pick == inf_bits) ? INFINITY
                                 : (float)value16(pick, ebits, mbits);
    return copysignf(r, x);
}

static void test_bf16(void) {
    CHECK(qva_round_bf16(1.0f + 0x1p-8f) == 1.0f, "tie to even down");
    CHECK(qva_round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f,
          "tie to even up");
    CHECK(qva_round_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f,
          "above tie");
    CHECK(qva_round_bf16(FLT_MAX) == INFINITY, "FLT_MAX overflows");
    CHECK(qva_round_bf16(0x1.fep127f) == 0x1.fep127f, "bf16 max stays");
    CHECK(qva_round_bf16(0x1.ffp127f) == INFINITY, "max + half ulp -> Inf");
    CHECK(qva_round_bf16(-0x1.ffp127f) == -INFINITY, "-Inf");
    CHECK(qva_round_bf16(INFINITY) == INFINITY, "Inf");
    CHECK(isnan(qva_round_bf16(NAN)), "NaN");
    CHECK(same_float(qva_round_bf16(-0.0f), -0.0f), "-0");
    CHECK(qva_round_bf16(0x1p-134f) == 0.0f, "half bf16 denormal ties to 0");
    CHECK(qva_round_bf16(0x1.8p-133f) == 0x1p-132f, "denormal tie to even");
    int bad = 0;
    for (int i = 0; i < 300000; ++i) {
        float x = rng_any_finite_float();
        bad += !same_float(qva_round_bf16(x), round16_reference(x, 8, 7));
    }
    CHECK(bad == 0, "%d bf16 roundings differ from reference", bad);
}

static void test_f16(void) {
    CHECK(qva_round_f16(65504.0f) == 65504.0f, "max half");
    CHECK(qva_round_f16(65519.0f) == 65504.0f, "below overflow tie");
    CHECK(qva_round_f16(65520.0f) == INFINITY, "overflow tie -> Inf");
    CHECK(qva_round_f16(-65520.0f) == -INFINITY, "-Inf");
    CHECK(qva_round_f16(1.0f + 0x1p-11f) == 1.0f, "tie down");
    CHECK(qva_round_f16(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f, "tie up");
    CHECK(qva_round_f16(0x1p-24f) == 0x1p-24f, "min subnormal");
    CHECK(qva_round_f16(0x1p-25f) == 0.0f, "half min subnormal -> 0");
    CHECK(qva_round_f16(nextafterf(0x1p-25f, 1.0f)) == 0x1p-24f, "> half");
    CHECK(qva_round_f16(3 * 0x1p-25f) == 0x1p-23f, "subnormal tie to even");
    CHECK(qva_round_f16(0x1p-14f - 0x1p-25f) == 0x1p-14f,
          "subnormal carries into normal");
    CHECK(same_float(qva_round_f16(-1e-30f), -0.0f), "tiny negative -> -0");
    CHECK(isnan(qva_round_f16(NAN)), "NaN");
    int bad = 0;
    /* Every half value, its neighbouring midpoints and one float either
     * side of them, then random floats. */
    for (unsigned b = 0; b < 0x7C00u; ++b) {
        float v = (float)value16(b, 5, 10);
        float m = (float)(0.5 * (value16(b, 5, 10) + value16(b + 1, 5, 10)));
        const float probes[] = {v, m, nextafterf(m, 0.0f),
                                nextafterf(m, INFINITY)};
        for (int k = 0; k < 4; ++k) {
            bad += !same_float(qva_round_f16(probes[k]),
                               round16_reference(probes[k], 5, 10));
            bad += !same_float(qva_round_f16(-probes[k]),
                               round16_reference(-probes[k], 5, 10));
        }
    }
    for (int i = 0; i < 300000; ++i) {
        float x = (i & 1) ? rng_log_uniform(-26.0, 17.0)
                          : rng_any_finite_float();
        bad += !same_float(qva_round_f16(x), round16_reference(x, 5, 10));
    }
    CHECK(bad == 0, "%d f16 roundings differ from reference", bad);
}

/* ------------------------------------------------------------ INT8 */

static void test_int8(void) {
    const struct { float x; int code; } cases[] = {
        {0.5f, 1},      {-0.5f, -1},    {1.5f, 2},        {2.5f, 3},
        {-2.5f, -3},    {0.49999997f, 0}, {126.5f, 127},  {-126.5f, -127},
        {127.4f, 127},  {200.0f, 127},  {-1e30f, -127},   {INFINITY, 127},
        {-INFINITY, -127}, {NAN, 0},    {-0.3f, 0},       {3.49f, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        CHECK(qva_int8_round(cases[i].x) == cases[i].code, "round(%g) = %d",
              (double)cases[i].x, qva_int8_round(cases[i].x));

    float x[6] = {1.0f, -2.54f, 0.5f, 2.0f, -0.01f, 0.0f};
    int8_t codes[6];
    float delta = qva_int8_quantize(x, 6, codes);
    float want = 2.54f / 127.0f + 1e-7f;
    CHECK(delta == want, "delta %.9g want %.9g", (double)delta, (double)want);
    CHECK(codes[1] == -127, "amax maps to -127 (got %d)", codes[1]);
    for (int i = 0; i < 6; ++i)
        CHECK(codes[i] == qva_int8_round(x[i] / want), "code %d", i);
    CHECK(codes[0] == 50 && codes[2] == 25 && codes[3] == 100 &&
              codes[4] == 0 && codes[5] == 0,
          "codes %d %d %d %d %d", codes[0], codes[2], codes[3], codes[4],
          codes[5]);
    float z[4] = {0, 0, -0.0f, 0};
    int8_t zc[4] = {1, 1, 1, 1};
    CHECK(qva_int8_quantize(z, 4, zc) == 1e-7f, "zero input delta = 1e-7");
    CHECK(zc[0] == 0 && zc[1] == 0 && zc[2] == 0 && zc[3] == 0, "zero codes");
}

/* ------------------------------------------------------------ NVFP4 */

static void test_nvfp4_hand_example(void) {
    /* g = 0.5, amax = 4.5: sigma = e4m3(4.5 / 3) = 1.5 (code 0x3C), so the
     * E2M1 input is x / 0.75. */
    const float x[16] = {4.5f,  -4.5f, 0.75f, 0.5f, 1.875f, 3.0f,
                         2.25f, 0.1875f, -0.9f, 3.75f, 3.76f, 1.2f,
                         0.0f,  -0.0f, 2.6f,  -3.3f};
    /* x/0.75 = 6, -6, 1, .667, 2.5 (tie), 4, 3, .25 (tie), -1.2, 5 (tie),
     * 5.01, 1.6, 0, -0, 3.47, -4.4 */
    const uint8_t want[16] = {7, 15, 2, 1, 4, 6, 5, 0,
                              10, 6, 7, 3, 0, 8, 5, 14};
    uint8_t codes[16], sc[1];
    qva_nvfp4_quantize(x, 16, 0.5f, codes, sc);
    CHECK(sc[0] == 0x3C, "scale code %#x", sc[0]);
    for (int i = 0; i < 16; ++i)
        CHECK(codes[i] == want[i], "code[%d] = %u want %u", i, codes[i],
              want[i]);
    float out[16];
    qva_nvfp4_dequantize(codes, sc, 16, 0.5f, out);
    for (int i = 0; i < 16; ++i)
        CHECK(out[i] == 0.75f * qva_e2m1_decode(want[i]), "dequant %d", i);
}

static void test_nvfp4_tensor_scale(void) {
    CHECK(qva_nvfp4_tensor_scale(2688.0f) == 1.0f, "2688 -> 1");
    CHECK(qva_nvfp4_tensor_scale(26.88f) == 26.88f / 2688.0f, "formula");
    CHECK(qva_nvfp4_tensor_scale(0.0f) == 1.0f, "zero -> 1");
    CHECK(qva_nvfp4_tensor_scale(INFINITY) == 1.0f, "Inf -> 1");
    CHECK(qva_nvfp4_tensor_scale(NAN) == 1.0f, "NaN -> 1");
    CHECK(qva_nvfp4_tensor_scale(-1.0f) == 1.0f, "negative -> 1");
    CHECK(qva_nvfp4_tensor_scale(FLT_TRUE_MIN) == 1.0f, "underflow -> 1");
}

/* Each element's reconstruction is a nearest point of the group's grid
 * {g sigma v}; the scale code is the E4M3 cast of amax/(6g). */
static void test_nvfp4_brute_force(void) {
    enum { NG = 64, N = NG * 16 };
    float x[N], out[N];
    uint8_t codes[N], sc[NG];
    int bad_scale = 0, bad_code = 0, bad_near = 0;
    for (int trial = 0; trial < 200; ++trial) {
        float amax = 0.0f;
        for (int gi = 0; gi < NG; ++gi) {
            double mag = exp2(-12.0 + 22.0 * rng_unit()); /* group spread */
            for (int i = 0; i < 16; ++i) {
                float v = (float)(mag * (2.0 * rng_unit() - 1.0));
                x[gi * 16 + i] = v;
                amax = fmaxf(amax, fabsf(v));
            }
        }
        float g = qva_nvfp4_tensor_scale(amax);
        qva_nvfp4_quantize(x, N, g, codes, sc);
        qva_nvfp4_dequantize(codes, sc, N, g, out);
        for (int gi = 0; gi < NG; ++gi) {
            float gmax = 0.0f;
            for (int i = 0; i < 16; ++i)
                gmax = fmaxf(gmax, fabsf(x[gi * 16 + i]));
            bad_scale += sc[gi] != qva_e4m3_encode(gmax / (6.0f * g));
            float sigma = qva_e4m3_decode(sc[gi]);
            for (int i = 0; i < 16; ++i) {
                int k = gi * 16 + i;
                if (sigma == 0.0f) {
                    bad_code += codes[k] != 0;
                    continue;
                }
                bad_code += codes[k] != e2m1_reference(x[k] / (g * sigma));
                /* Nearness in exact arithmetic on the grid; the slack
                 * (1e-6 of a grid step) absorbs the rounding of the
                 * float division x / (g sigma) near a tie. */
                double gs = (double)(g * sigma);
                double err =
                    fabs((double)x[k] - gs * qva_e2m1_decode(codes[k]));
                for (unsigned c = 0; c < 16; ++c) {
                    double alt = gs * qva_e2m1_decode((uint8_t)c);
                    bad_near += err > fabs((double)x[k] - alt) + 1e-6 * gs;
                }
                bad_code += out[k] != (g * sigma) * qva_e2m1_decode(codes[k]);
            }
        }
    }
    CHECK(bad_scale == 0, "%d group scale codes wrong", bad_scale);
    CHECK(bad_code == 0, "%d element codes wrong", bad_code);
    CHECK(bad_near == 0, "%d reconstructions not nearest", bad_near);
}

static void test_nvfp4_zero_groups(void) {
    float x[40] = {0};
    uint8_t codes[40], sc[3];
    memset(codes, 0xAA, sizeof codes);
    for (int i = 16; i < 32; ++i)
        x[i] = 1e-9f * (float)(i - 20); /* tiny: sigma rounds to 0 at g=1 */
    for (int i = 32; i < 40; ++i)
        x[i] = (float)(i - 35); /* a partial trailing group of 8 */
    qva_nvfp4_quantize(x, 40, 1.0f, codes, sc);
    CHECK(sc[0] == 0 && sc[1] == 0, "zero scales %#x %#x", sc[0], sc[1]);
    int nz = 0;
    for (int i = 0; i < 32; ++i)
        nz += codes[i] != 0;
    CHECK(nz == 0, "zero-scale groups coded as zero (%d nonzero)", nz);
    /* Partial group: amax 4 -> sigma = e4m3(4/6) = 0.6875, x/0.6875. */
    CHECK(sc[2] == qva_e4m3_encode(4.0f / 6.0f), "partial group scale");
    CHECK(qva_e4m3_decode(sc[2]) == 0.6875f, "sigma 0.6875");
    for (int i = 32; i < 40; ++i)
        CHECK(codes[i] == qva_e2m1_encode(x[i] / 0.6875f), "partial %d", i);
}

static void test_nvfp4_probs16(void) {
    float p[16] = {1.0f, 0.5f, 0.3f, 0.25f, 0.1f, 0.0f, 0.7f, 0.05f,
                   0.9f, 0.2f, 0.15f, 0.4f, 0.6f, 0.8f, 0.01f, 0.35f};
    float q[16];
    memcpy(q, p, sizeof p);
    qva_nvfp4_quantize_probs16(q);
    /* sigma = 448: p_hat = (1/6) e2m1(6p). */
    const float six_p_rounded[16] = {6, 3, 2, 1.5f, 0.5f, 0, 4, 0.5f,
                                     6, 1, 1, 2, 4, 4, 0, 2};
    for (int i = 0; i < 16; ++i) {
        float want = (448.0f / 2688.0f) * six_p_rounded[i];
        CHECK(q[i] == want, "p[%d]=%g -> %.9g want %.9g", i, (double)p[i],
              (double)q[i], (double)want);
    }
    float r[16] = {0.01f, 0.005f, 0.001f, 0.0004f};
    qva_nvfp4_quantize_probs16(r);
    /* 448 * 0.01 = 4.48 -> sigma 4.5; 2688 p / 4.5 = 5.97, 2.99, .597, .24 */
    const float want2[4] = {6, 3, 0.5f, 0};
    for (int i = 0; i < 4; ++i)
        CHECK(r[i] == (4.5f / 2688.0f) * want2[i], "small row %d: %.9g", i,
              (double)r[i]);
    for (int i = 4; i < 16; ++i)
        CHECK(r[i] == 0.0f, "zero stays zero");
    float t[16] = {1e-6f, 5e-7f};
    qva_nvfp4_quantize_probs16(t); /* 448e-6 < 2^-10: sigma = 0 */
    CHECK(t[0] == 0.0f && t[1] == 0.0f, "zero-scale group -> zeros");
}

/* ------------------------------------------------------------ Hadamard */

static int popcount_u(unsigned v) {
    int c = 0;
    for (; v; v &= v - 1)
        ++c;
    return c;
}

static void test_hadamard(void) {
    enum { NMAX = 256 };
    static float h[NMAX * NMAX];
    for (int n = 1; n <= NMAX; n *= 2) {
        double s = 1.0 / sqrt((double)n);
        int bad = 0;
        for (int j = 0; j < n; ++j) { /* column j = H e_j */
            float *col = h + (size_t)j * n;
            memset(col, 0, sizeof(float) * (size_t)n);
            col[j] = 1.0f;
            CHECK(qva_hadamard(col, n, NULL) == QVA_OK, "n=%d", n);
            for (int i = 0; i < n; ++i) {
                double want = (popcount_u((unsigned)(i & j)) & 1) ? -s : s;
                bad += fabs(col[i] - want) > 1e-7;
            }
        }
        CHECK(bad == 0, "n=%d: %d entries differ from Sylvester order", n,
              bad);
        /* H H = I: apply H to every column of H. */
        double worst = 0.0;
        for (int j = 0; j < n; ++j) {
            float *col = h + (size_t)j * n;
            qva_hadamard(col, n, NULL);
            for (int i = 0; i < n; ++i)
                worst = fmax(worst, fabs(col[i] - (i == j ? 1.0 : 0.0)));
        }
        CHECK(worst < 1e-5, "n=%d: |HH - I| = %g", n, worst);
    }
    /* Norm preservation and signs: H(s .* x). */
    float x[128], y[128], signs[128];
    double n2 = 0.0;
    for (int i = 0; i < 128; ++i) {
        x[i] = (float)(2.0 * rng_unit() - 1.0);
        signs[i] = (rng_u64() & 1) ? -1.0f : 1.0f;
        y[i] = x[i] * signs[i];
        n2 += (double)x[i] * x[i];
    }
    float xs[128];
    memcpy(xs, x, sizeof x);
    qva_hadamard(xs, 128, signs);
    qva_hadamard(y, 128, NULL);
    double m2 = 0.0;
    int same = 1;
    for (int i = 0; i < 128; ++i) {
        m2 += (double)xs[i] * xs[i];
        same &= xs[i] == y[i];
    }
    CHECK(same, "signs are applied before the transform");
    CHECK(fabs(m2 - n2) < 1e-5 * n2, "norm %g vs %g", m2, n2);
    const int bad_n[] = {0, 3, 6, -4, 100};
    for (size_t i = 0; i < sizeof bad_n / sizeof bad_n[0]; ++i)
        CHECK(qva_hadamard(x, bad_n[i], NULL) == QVA_ERR_INVALID_ARGUMENT,
              "n=%d rejected", bad_n[i]);
    CHECK(qva_hadamard(NULL, 4, NULL) == QVA_ERR_INVALID_ARGUMENT, "NULL x");
}

static void test_hadamard_signs(void) {
    qva_config cfg;
    memset(&cfg, 0, sizeof cfg);
    float s[64];
    qvi_hadamard_signs(&cfg, 64, s);
    int all_one = 1;
    for (int i = 0; i < 64; ++i)
        all_one &= s[i] == 1.0f;
    CHECK(all_one, "not randomized: all +1");
    qvi_hadamard_signs(NULL, 64, s);
    CHECK(s[0] == 1.0f && s[63] == 1.0f, "NULL cfg: all +1");

    /* Published splitmix64 outputs: seed 0 starts 0xE220A8397B1DCDAF (bit 63
     * set); seed 1234567 starts 6457827717110365317, 3203168211198807973,
     * 9817491932198370423, 4593380528125082431, 16408922859458223821. */
    cfg.hadamard_signs = 1;
    cfg.hadamard_seed = 0;
    qvi_hadamard_signs(&cfg, 1, s);
    CHECK(s[0] == -1.0f, "seed 0 first sign");
    cfg.hadamard_seed = 1234567;
    qvi_hadamard_signs(&cfg, 5, s);
    const float want[5] = {1, 1, -1, 1, -1};
    for (int i = 0; i < 5; ++i)
        CHECK(s[i] == want[i], "seed 1234567 sign %d", i);
    float a[128], b[128];
    cfg.hadamard_seed = 42;
    qvi_hadamard_signs(&cfg, 128, a);
    qvi_hadamard_signs(&cfg, 128, b);
    int neg = 0, equal = 1;
    for (int i = 0; i < 128; ++i) {
        CHECK(a[i] == 1.0f || a[i] == -1.0f, "entry %d is +-1", i);
        neg += a[i] < 0;
        equal &= a[i] == b[i];
    }
    CHECK(equal, "deterministic");
    CHECK(neg > 40 && neg < 88, "balanced signs (%d negative of 128)", neg);
    cfg.hadamard_seed = 43;
    qvi_hadamard_signs(&cfg, 128, b);
    int differ = 0;
    for (int i = 0; i < 128; ++i)
        differ += a[i] != b[i];
    CHECK(differ > 20, "seeds differ (%d)", differ);
}

/* ------------------------------------------------------------ operands */

static void test_channel_mean(void) {
    const float x[6] = {1, 10, 2, 20, 4, 31};
    float m[2];
    qvi_channel_mean(x, 3, 2, m);
    CHECK(m[0] == (float)(7.0 / 3.0) && m[1] == 61.0f / 3.0f, "means %g %g",
          (double)m[0], (double)m[1]);
    /* Two levels: each block's FP32 tree sum, then those sums in FP64 in
     * block order.  2^30 + 1 rounds to 2^30 in FP32 but not in FP64, so
     * blocks summing to 2^30, 1 and -2^30 give a mean of 1/384, not 0; in
     * one block the tree's FP32 adds lose the 1 (row 1 and row 2 are
     * leaves 1 and 2: (2^30 + 1) + -2^30 = 0). */
    static float three[384];
    three[0] = 0x1p30f;
    three[128] = 1.0f;
    three[256] = -0x1p30f;
    qvi_channel_mean(three, 384, 1, m);
    CHECK(m[0] == 1.0f / 384.0f, "block-ordered FP64 sum: %.9g", (double)m[0]);
    const float one[3] = {0x1p30f, 1.0f, -0x1p30f};
    qvi_channel_mean(one, 3, 1, m);
    CHECK(m[0] == 0.0f, "one block's FP32 tree: %.9g", (double)m[0]);
}

static void fill_random(float *x, size_t n, double scale) {
    for (size_t i = 0; i < n; ++i)
        x[i] = (float)(scale * (2.0 * rng_unit() - 1.0));
}

/* One INT8 scale per row (qva_q_granularity QVA_Q_PER_ROW): each row is
 * qva_int8_quantize of that row alone; zero rows get 1e-7 and codes 0. */
/* qvi_block_mean against the tree written out level by level (the leaves
 * as four-row chains, then pairs in index order), on values whose sum
 * rounds differently in row order, in a full block and a short last one
 * (rows past n read as +0, the count the valid rows). */
static void test_block_mean_tree(void) {
    enum { N = 128 + 77, D = 3 };
    float x[N * D];
    for (int i = 0; i < N * D; ++i) /* 2^24-scale values beside small ones */
        x[i] = (i % 7 == 0 ? 16777216.0f : 1.0f) * (float)(1 + (i * 37) % 11) * (i % 3 ? 1.0f : -1.0f) +
               0.125f * (float)(i % 5);
    int order_matters = 0;
    for (int r0 = 0; r0 < N; r0 += QVI_BLOCK)
        for (int c = 0; c < D; ++c) {
            float node[QVI_TREE_LEAVES], rows = 0.0f;
            for (int i = 0; i < QVI_TREE_LEAVES; ++i) {
                float p = 0.0f;
                for (int t = 0; t < 4; ++t) {
                    const int r = r0 + i + 32 * t;
                    const float v = r < N ? x[r * D + c] : 0.0f;
                    p = t == 0 ? v : p + v;
                }
                node[i] = p;
            }
            for (int w = QVI_TREE_LEAVES; w > 1; w /= 2)
                for (int k = 0; k < w / 2; ++k) node[k] = node[2 * k] + node[2 * k + 1];
            const int len = N - r0 < QVI_BLOCK ? N - r0 : QVI_BLOCK;
            for (int r = r0; r < r0 + len; ++r) rows += x[r * D + c];
            const float want = node[0] / (float)len, got = qvi_block_mean(x, N, D, r0, c);
            CHECK(memcmp(&want, &got, sizeof got) == 0, "block %d ch %d: tree %.9g, got %.9g",
                  r0 / QVI_BLOCK, c, (double)want, (double)got);
            order_matters += rows / (float)len != want;
        }
    CHECK(order_matters > 0, "the data tells the tree from the row order");
    for (int i = 0; i < N * D; ++i) x[i] = -0.375f; /* a constant block: its value */
    CHECK(qvi_block_mean(x, N, D, 128, 1) == -0.375f && qvi_block_mean(x, N, D, 0, 2) == -0.375f,
          "the mean of a constant block");
}

static void test_quant_rows(void) {
    enum { NP = QVI_BLOCK, D = 64 };
    static float x[NP * D];
    fill_random(x, (size_t)NP * D, 3.0);
    for (int r = 0; r < NP; ++r) /* rows of very different sizes */
        for (int c = 0; c < D; ++c) x[r * D + c] *= (float)(1 + r % 7) * (r % 5 ? 1.0f : 0.01f);
    memset(x + (size_t)(NP - 3) * D, 0, sizeof(float) * 3 * D);
    qvi_i8 q8;
    qvi_quant_i8(x, NP, D, 1, &q8);
    CHECK(q8.codes && q8.scale && q8.rows_per_scale == 1, "i8 rows allocation");
    if (q8.codes && q8.scale) {
        int bad_scale = 0, bad_codes = 0;
        for (int r = 0; r < NP; ++r) {
            int8_t ref[D];
            float dr = qva_int8_quantize(x + (size_t)r * D, D, ref);
            bad_scale += q8.scale[r] != dr || qvi_i8_row_scale(&q8, r) != dr;
            bad_codes += memcmp(ref, q8.codes + (size_t)r * D, D) != 0;
        }
        CHECK(bad_scale == 0 && bad_codes == 0, "per-row: %d scales, %d code rows differ",
              bad_scale, bad_codes);
        CHECK(q8.scale[NP - 1] == 1e-7f, "zero row delta %g", (double)q8.scale[NP - 1]);
        /* per row is never coarser than per block: the small rows keep
         * more of their codes' range */
        int8_t blk[NP * D];
        float db = qva_int8_quantize(x, (size_t)NP * D, blk);
        CHECK(q8.scale[5] < db, "row 5 scale %g not below the block's %g", (double)q8.scale[5],
              (double)db);
    }
    free(q8.codes);
    free(q8.scale);
}

static void test_quant_blocks(void) {
    enum { NP = 2 * QVI_BLOCK, D = 64 };
    static float x[NP * D], out[NP * D];
    fill_random(x, (size_t)QVI_BLOCK * D, 3.0);
    memset(x + (size_t)QVI_BLOCK * D, 0, sizeof(float) * QVI_BLOCK * D);

    qvi_i8 q8;
    qvi_quant_i8(x, NP, D, QVI_BLOCK, &q8);
    CHECK(q8.codes && q8.scale, "i8 allocation");
    if (q8.codes && q8.scale) {
        int8_t ref[QVI_BLOCK * D];
        float d0 = qva_int8_quantize(x, (size_t)QVI_BLOCK * D, ref);
        CHECK(q8.scale[0] == d0, "block 0 delta");
        CHECK(memcmp(ref, q8.codes, sizeof ref) == 0, "block 0 codes");
        CHECK(q8.scale[1] == 1e-7f, "zero block delta %g",
              (double)q8.scale[1]);
        int nz = 0;
        for (size_t i = (size_t)QVI_BLOCK * D; i < (size_t)NP * D; ++i)
            nz += q8.codes[i] != 0;
        CHECK(nz == 0, "zero block codes");
    }
    free(q8.codes);
    free(q8.scale);

    qvi_f8 f8;
    qvi_quant_e4m3_blocks(x, NP, D, &f8);
    CHECK(f8.codes && f8.block_scale && f8.chan_scale, "f8 allocation");
    if (f8.codes && f8.block_scale && f8.chan_scale) {
        float amax = 0.0f;
        for (size_t i = 0; i < (size_t)QVI_BLOCK * D; ++i)
            amax = fmaxf(amax, fabsf(x[i]));
        CHECK(f8.block_scale[0] == amax / 448.0f, "block scale");
        CHECK(f8.block_scale[1] == 1.0f, "zero block scale 1");
        int bad = 0;
        for (size_t i = 0; i < (size_t)NP * D; ++i) {
            float sc = f8.block_scale[i / ((size_t)QVI_BLOCK * D)];
            bad += f8.codes[i] != qva_e4m3_encode(x[i] / sc);
        }
        CHECK(bad == 0, "%d e4m3 block codes wrong", bad);
        for (int c = 0; c < D; ++c)
            CHECK(f8.chan_scale[c] == 1.0f, "chan scale %d", c);
    }
    free(f8.codes);
    free(f8.block_scale);
    free(f8.chan_scale);

    /* NVFP4 rows and columns against the public group quantizer. */
    fill_random(x, (size_t)NP * D, 5.0);
    for (int i = 0; i < D; ++i)
        x[(size_t)7 * D + i] *= 1e-3f; /* a small row, different sigma */
    float amax = 0.0f;
    for (size_t i = 0; i < (size_t)NP * D; ++i)
        amax = fmaxf(amax, fabsf(x[i]));
    float g = qvi_quant_nvfp4_rows(x, NP, D, out);
    CHECK(g == qva_nvfp4_tensor_scale(amax), "rows g");
    int bad = 0;
    for (int r = 0; r < NP; ++r) {
        uint8_t codes[D], sc[D / 16];
        qva_nvfp4_quantize(x + (size_t)r * D, D, g, codes, sc);
        for (int c = 0; c < D; ++c)
            bad += out[(size_t)r * D + c] !=
                   qva_e4m3_decode(sc[c / 16]) * qva_e2m1_decode(codes[c]);
    }
    CHECK(bad == 0, "%d nvfp4 row values wrong", bad);
    g = qvi_quant_nvfp4_cols(x, NP, D, out);
    CHECK(g == qva_nvfp4_tensor_scale(amax), "cols g");
    bad = 0;
    for (int c = 0; c < D; ++c) {
        float col[NP];
        uint8_t codes[NP], sc[NP / 16];
        for (int r = 0; r < NP; ++r)
            col[r] = x[(size_t)r * D + c];
        qva_nvfp4_quantize(col, NP, g, codes, sc);
        for (int r = 0; r < NP; ++r)
            bad += out[(size_t)r * D + c] !=
                   qva_e4m3_decode(sc[r / 16]) * qva_e2m1_decode(codes[r]);
    }
    CHECK(bad == 0, "%d nvfp4 column values wrong", bad);
}

int main(void) {
    test_e4m3_decode_values();
    test_e4m3_roundtrip();
    test_e4m3_midpoints();
    test_e4m3_edges();
    test_e4m3_brute_force();
    test_e2m1();
    test_bf16();
    test_f16();
    test_int8();
    test_nvfp4_hand_example();
    test_nvfp4_tensor_scale();
    test_nvfp4_brute_force();
    test_nvfp4_zero_groups();
    test_nvfp4_probs16();
    test_hadamard();
    test_hadamard_signs();
    test_channel_mean();
    test_block_mean_tree();
    test_quant_blocks();
    test_quant_rows();
    return check_summary("test_formats");
}
