/*
 * cfg.v_code = QVA_V_INT8_PV ("+i8pv", docs/NUMERICS.md §3, "The PV
 * product in integers") on the CPU reference:
 *  (a) V's codes: INT8 per channel at amax/127, each within half a step
 *      of the scaled (demeaned) value, the channel's amax at +-127;
 *  (b) P's codes: u = rint(255 exp2(s - m_b)) with m_b the block's own
 *      row max, so the block's largest key codes 255 whatever the running
 *      max, each weight u w / 255 within half a code step (times w) of
 *      exp2(s - m); masked and non-finite scores code 0; and one block's
 *      update of acc and l against a float64 evaluation of the same codes;
 *  (c) the method: on 384-token parts of the issue-15 presets
 *      video-global and video-local-clustered, sage8+i8pv and vc8+i8pv
 *      rel-L2 against exact attention at most 0.8x of sage8's and vc8's,
 *      with the decomposition's V term at most half of the E4M3 one and
 *      the Q term bit for bit the same;
 *  (d) parsing, naming and validation: sage8 and vc8 only, not with
 *      +expcast or +v2; the codes' sum by default, +fp32sum the FP32 sum;
 *  (e) +fp32sum: the block's row sum is the FP32 key-order sum of the
 *      weights before rounding, and on the same preset parts the output's
 *      lean toward sharper rows (the codes' sum drops every key coded 0
 *      from l) goes (vc8) or falls to a third (sage8), with less error.
 * CUDA runs +i8pv, with either row sum, at head dim 128
 * (cuda_test_choose.c); test_backend checks both against the CPU.
 */
#define TEST_RNG_SEED 0x18B7C0DE5EEDull
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "method_option.h"
#include "preset_rel_l2.h"

/* (a) ------------------------------------------------------------ V */
static void test_v_codes(void) {
    enum { N = 300, D = 32 };
    float *v = malloc((size_t)N * D * sizeof *v);
    for (size_t i = 0; i < (size_t)N * D; ++i)
        v[i] = (float)((i % D) * 0.05 + (2.0 * rng_unit() - 1.0) * exp(-4.0 * rng_unit()));
    for (int demean = 0; demean < 2; ++demean) {
        qvi_v8 x;
        CHECK(qvi_v8_prepare(v, N, D, NULL, demean, QVA_V_INT8_PV, &x) == QVA_OK, "prepare");
        CHECK(x.codes_lo == NULL, "one code per value");
        int off = 0, wide = 0;
        for (int c = 0; c < D; ++c) {
            int top = 0;
            for (int i = 0; i < N; ++i) {
                const size_t at = (size_t)i * D + c;
                double m = 0.0;
                if (demean) /* the block mean, as qvi_block_demean */
                    m = qvi_block_mean(v, N, D, i / QVI_BLOCK * QVI_BLOCK, c);
                const float xs = (float)((double)(float)(v[at] - (float)m)) / x.chan_scale[c];
                const int code = (int8_t)x.codes[at];
                if (fabs((double)xs - code) > 0.5 + 1e-6) ++off;
                if (code < -127 || code > 127) ++wide;
                if (abs(code) == 127) top = 1;
            }
            CHECK(top, "demean %d, channel %d: the amax codes +-127", demean, c);
        }
        CHECK(off == 0 && wide == 0, "demean %d: %d codes off by more than half a step, %d "
              "outside [-127, 127]", demean, off, wide);
        qvi_v8_free(&x);
    }
    free(v);
}

/* (b) ------------------------------------------------------------ P */
static void test_p_codes(void) {
    float s[QVI_BLOCK];
    uint8_t u[QVI_BLOCK];
    for (int trial = 0; trial < 50; ++trial) {
        const float m = 3.0f + 10.0f * (float)rng_unit(); /* the running max, above the block's */
        for (int j = 0; j < QVI_BLOCK; ++j)
            s[j] = j % 17 == 5 ? -INFINITY : (float)(m - 1.0 - 12.0 * rng_unit());
        float rs, rs_f;
        const float w = qvi_probs_u8(s, m, QVI_BLOCK, 1, u, &rs);
        uint8_t u_f[QVI_BLOCK];
        CHECK(qvi_probs_u8(s, m, QVI_BLOCK, 0, u_f, &rs_f) == w && !memcmp(u, u_f, sizeof u),
              "trial %d: +fp32sum keeps w and the codes", trial);
        float mb = -INFINITY;
        for (int j = 0; j < QVI_BLOCK; ++j) mb = s[j] > mb ? s[j] : mb;
        CHECK(w == exp2f(mb - m), "trial %d: the block weight", trial);
        float esum = 0.0f; /* +fp32sum: the weights before rounding, FP32, key order */
        for (int j = 0; j < QVI_BLOCK; ++j)
            if (s[j] != -INFINITY) esum += exp2f(s[j] - mb) * 255.0f;
        CHECK(rs_f == esum * w, "trial %d: the FP32 row sum %.8g against %.8g", trial, rs_f,
              esum * w);
        int top = 0, bad = 0, usum = 0;
        for (int j = 0; j < QVI_BLOCK; ++j) usum += u[j];
        CHECK(rs == (float)usum * w, "trial %d: the row sum %.8g against %d codes' %.8g", trial,
              rs, usum, (float)usum * w);
        for (int j = 0; j < QVI_BLOCK; ++j) {
            if (s[j] == -INFINITY) {
                bad += u[j] != 0;
                continue;
            }
            top += s[j] == mb && u[j] == 255;
            const double exact = exp2((double)s[j] - m), coded = (double)u[j] * w / 255.0;
            /* half a step, and the FP32 rounding of exp2f and of the product
             * (a few 1e-5 of a step where the value sits on a tie) */
            if (fabs(coded - exact) > w * ((0.5 + 1e-3) / 255.0)) ++bad;
        }
        CHECK(top >= 1 && bad == 0, "trial %d: max coded 255 (%d), %d codes off", trial, top, bad);
    }
    for (int j = 0; j < QVI_BLOCK; ++j) s[j] = -INFINITY;
    float rs0;
    for (int sum_codes = 0; sum_codes < 2; ++sum_codes)
        CHECK(qvi_probs_u8(s, 0.0f, QVI_BLOCK, sum_codes, u, &rs0) == 0.0f && rs0 == 0.0f &&
                  u[0] == 0 && u[QVI_BLOCK - 1] == 0,
              "a block without keys (sum_codes %d)", sum_codes);
    s[0] = NAN, s[1] = 0.0f;
    (void)qvi_probs_u8(s, 0.0f, QVI_BLOCK, 1, u, &rs0);
    CHECK(u[0] == 0 && u[1] == 255, "a NaN score codes 0");
    (void)qvi_probs_u8(s, 0.0f, QVI_BLOCK, 0, u, &rs0);
    CHECK(isnan(rs0), "a NaN score makes the FP32 row sum NaN, as the row it reaches");

    /* one block's update against float64 sums of the same codes */
    enum { D = 64 };
    int8_t V[QVI_BLOCK * D];
    for (int i = 0; i < QVI_BLOCK * D; ++i) V[i] = (int8_t)(rng_unit() * 254.0 - 127.0);
    for (int j = 0; j < QVI_BLOCK; ++j) s[j] = (float)(-6.0 * rng_unit());
    float acc[D], mu[D];
    for (int c = 0; c < D; ++c) mu[c] = (float)(rng_unit() - 0.5);
    qvi_row r;
    qvi_row_init(&r, acc, D);
    qvi_row_raise_max(&r, s, QVI_BLOCK);
    r.m += 1.5f; /* a running max above this block's */
    qvi_pv_u8i8(&r, s, (const uint8_t *)V, mu, QVI_BLOCK, 1);
    float rs1;
    const float w = qvi_probs_u8(s, r.m, QVI_BLOCK, 1, u, &rs1);
    double usum = 0.0;
    for (int j = 0; j < QVI_BLOCK; ++j) usum += u[j];
    CHECK(fabs(r.l - usum * w) <= 1e-6 * usum * w && r.l == rs1, "l %.8g against %.8g", r.l,
          usum * w);
    int bad = 0;
    for (int c = 0; c < D; ++c) {
        double part = 0.0;
        for (int j = 0; j < QVI_BLOCK; ++j) part += (double)u[j] * V[j * D + c];
        const double want = part * w + usum * w * mu[c];
        if (fabs(acc[c] - want) > 1e-5 * (fabs(part * w) + fabs(usum * w * mu[c]))) ++bad;
    }
    CHECK(bad == 0, "%d channels of acc off", bad);
}

/* (c) ------------------------------------------------------------ method */
static void test_method(const char *preset) {
    preset_case c;
    preset_case_make(preset, &c);
    static const char *const pairs[][2] = {{"sage8", "sage8+i8pv"}, {"vc8", "vc8+i8pv"}};
    for (size_t t = 0; t < sizeof pairs / sizeof *pairs; ++t) {
        const double e4m3 = case_rel_l2(pairs[t][0], &c), ints = case_rel_l2(pairs[t][1], &c);
        printf("  %s: %s %.5f, %s %.5f (%.2fx)\n", preset, pairs[t][0], e4m3, pairs[t][1], ints,
               ints / e4m3);
        CHECK(ints <= 0.8 * e4m3, "%s: %s rel-L2 %.5f against %s %.5f", preset, pairs[t][1], ints,
              pairs[t][0], e4m3);
    }
    /* where the gain comes from: the V term; the Q codes are the same */
    qva_error_terms d1, d2;
    check_v_term_gain(preset, "vc8", "vc8+i8pv", &c, 2.0, &d1, &d2);
    printf("  %s head 0 terms: v %.5f -> %.5f, p %.5f -> %.5f\n", preset, d1.v, d2.v, d1.p, d2.p);
    preset_case_free(&c);
}

/* (d) ------------------------------------------------------------ parsing */
static void test_parse(void) {
    static const char *const ok[] = {"sage8+i8pv", "vc8+i8pv", "vc8+hadamard+i8pv",
                                     "vc8+qblock+i8pv", "sage8+nohadamard+i8pv",
                                     "sage8+codesum+i8pv", "sage8+fp32sum+i8pv"};
    static const char *const bad[] = {"fp8+i8pv", "bf16+i8pv", "sage4+i8pv", "vc4+i8pv",
                                      "exact+i8pv", "draft@85/0/7.5/7.5+i8pv",
                                      "vc8+expcast+i8pv", "vc8+i8pv+expcast-centred",
                                      "sage8+v2+i8pv", "sage8+i8pv+i8pv",
                                      "sage8+fp32sum+codesum+i8pv"};
    check_method_option(ok, sizeof ok / sizeof *ok, bad, sizeof bad / sizeof *bad,
                        offsetof(qva_config, v_code), QVA_V_INT8_PV, QVA_V_E4M3, "+i8pv");
    static const char *const sums[][3] = {{"sage8+i8pv", "sage8+i8pv", "codes"},
                                          {"vc8+i8pv+fp32sum", "vc8+fp32sum+i8pv", "fp32"}};
    for (size_t i = 0; i < sizeof sums / sizeof *sums; ++i) {
        qva_config c;
        qva_config_default(&c);
        char name[96] = "";
        CHECK(qva_config_set_method(&c, sums[i][0]) == QVA_OK &&
                  c.p_sum == (sums[i][2][0] == 'c' ? QVA_P_SUM_CODES : QVA_P_SUM_FP32) &&
                  qva_config_method_name(&c, name, sizeof name) == QVA_OK &&
                  !strcmp(name, sums[i][1]),
              "%s sums the %s, named %s", sums[i][0], sums[i][2], name);
    }
    qva_config c;
    qva_config_default(&c);
    CHECK(qva_config_set_method(&c, "vc8+fp32sum") == QVA_OK, "vc8+fp32sum");
    c.v_code = QVA_V_INT8_PV;
    CHECK(option_call_check(&c) == QVA_OK, "vc8 + QVA_V_INT8_PV: %s", qva_last_error());
    c.p_sum = QVA_P_SUM_CODES;
    CHECK(option_call_check(&c) == QVA_OK, "with p_sum QVA_P_SUM_CODES: %s", qva_last_error());
    c.expcast = QVA_EXPCAST_PAPER;
    c.p_sum = QVA_P_SUM_FP32;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "with expcast refused");
    c.expcast = QVA_EXPCAST_OFF;
    CHECK(qva_config_set_method(&c, "fp8") == QVA_OK, "fp8");
    c.v_code = QVA_V_INT8_PV;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "fp8 with QVA_V_INT8_PV refused");
}

/* (e) ------------------------------------------------------------ +fp32sum */
static void test_fp32sum(const char *preset) {
    preset_case c;
    preset_case_make(preset, &c);
    static const char *const pairs[][2] = {{"sage8+i8pv", "sage8+fp32sum+i8pv"},
                                           {"vc8+i8pv", "vc8+fp32sum+i8pv"}};
    for (size_t t = 0; t < sizeof pairs / sizeof *pairs; ++t) {
        const double codes = case_rel_l2(pairs[t][0], &c), fp32 = case_rel_l2(pairs[t][1], &c);
        qva_error_terms d1, d2;
        qva_error_term_directions g1, g2;
        case_directions(pairs[t][0], &c, &d1, &g1);
        case_directions(pairs[t][1], &c, &d2, &g2);
        printf("  %s: %s %.5f (cos %+.3f), %s %.5f (cos %+.3f)\n", preset, pairs[t][0], codes,
               g1.full.cos, pairs[t][1], fp32, g2.full.cos);
        CHECK(fp32 <= codes, "%s: %s rel-L2 %.5f above %s's %.5f", preset, pairs[t][1], fp32,
              pairs[t][0], codes);
        /* the keys coded 0 now weigh in as V's mean: vc8's block means
         * (no lean left), sage8's channel mean over the sequence (a small
         * flat lean, cos about -0.1 here) */
        const double left = t == 1 ? 0.05 : 0.35 * g1.full.cos;
        CHECK(g1.full.cos > 0.2 && fabs(g2.full.cos) < left,
              "%s: the lean toward sharper rows, cos %+.3f with the codes' sum, %+.3f with "
              "+fp32sum (limit %.3f)", preset, g1.full.cos, g2.full.cos, left);
        CHECK(d2.q == d1.q && d2.v == d1.v, "%s: the Q and V terms moved", preset);
    }
    preset_case_free(&c);
}

int main(void) {
    test_v_codes();
    test_p_codes();
    test_parse();
    test_method("video-global");
    test_method("video-local-clustered");
    test_fp32sum("video-global");
    test_fp32sum("video-local-clustered");
    return check_summary("test_i8pv");
}
