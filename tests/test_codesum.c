/*
 * cfg.p_sum = QVA_P_SUM_CODES ("+codesum", docs/NUMERICS.md §3, "The row
 * sum of an exp2 P") on the CPU reference:
 *  (a) with every value row the same vector v, the output of each query
 *      row is a convex combination of one coded row, so it is the same
 *      for every query row (FP32 rounding apart), while the FP32 row sum
 *      of the papers leaves a per-row factor sum(codes)/sum(exp2) on it;
 *  (b) parsing, naming and validation: +codesum is accepted on fp8,
 *      sage8 and vc8 without ExpCast, and refused elsewhere;
 * The CUDA chooser's refusal (no kernel yet) is in cuda_test_choose.c.
 */
#define TEST_RNG_SEED 0xC0DE5A11C0DE5A11ull
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "method_option.h"

#define B 1
#define H 2
#define N 384
#define D 64

/* Largest relative spread over the query rows of one head's output
 * channel c: max |o_i - o_0| / |o_0| over rows i and channels c. */
static double row_spread(const float *o) {
    double worst = 0.0;
    for (int h = 0; h < H; ++h) {
        const float *oh = o + (size_t)h * N * D;
        for (int c = 0; c < D; ++c) {
            const double ref = oh[c];
            for (int i = 1; i < N; ++i) {
                const double d = fabs(oh[(size_t)i * D + c] - ref) / fmax(fabs(ref), 1e-30);
                if (d > worst) worst = d;
            }
        }
    }
    return worst;
}

/* The output of method on random q, k and value rows all equal to one
 * vector per head (a channel offset well away from 0). */
static double spread_of(const char *method, const float *q, const float *k, const float *v) {
    qva_config cfg;
    qva_config_default(&cfg);
    CHECK(qva_config_set_method(&cfg, method) == QVA_OK, "%s: %s", method, qva_last_error());
    cfg.layer = QVA_LAYER_NONE;
    float *o = calloc((size_t)B * H * N * D, sizeof *o);
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context");
    qva_tensor tq = qva_tensor_hnd((void *)q, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor tk = qva_tensor_hnd((void *)k, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor tv = qva_tensor_hnd((void *)v, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor to = qva_tensor_hnd(o, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    const qva_status st = qva_attention(ctx, &cfg, &tq, &tk, &tv, &to, NULL);
    CHECK(st == QVA_OK, "%s: %s", method, qva_last_error());
    const double s = st == QVA_OK ? row_spread(o) : 1.0;
    qva_context_free(ctx);
    free(o);
    return s;
}

static void test_constant_values(void) {
    const size_t n = (size_t)B * H * N * D;
    float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; ++i) {
        q[i] = (float)(3.0 * (2.0 * rng_unit() - 1.0)); /* peaked rows: varied P codes */
        k[i] = (float)(2.0 * rng_unit() - 1.0);
    }
    for (int h = 0; h < H; ++h)
        for (int c = 0; c < D; ++c) {
            const float vc = (float)(1.0 + 2.0 * rng_unit()) * (c % 2 ? 1.0f : -1.0f);
            for (int i = 0; i < N; ++i) v[((size_t)h * N + i) * D + c] = vc;
        }
    static const char *const pairs[][2] = {
        {"sage8+nohadamard+fp32sum", "sage8+nohadamard"}, {"fp8", "fp8+codesum"},
        {"sage8+fp32sum", "sage8"}};
    for (size_t t = 0; t < sizeof pairs / sizeof *pairs; ++t) {
        const double plain = spread_of(pairs[t][0], q, k, v);
        const double codes = spread_of(pairs[t][1], q, k, v);
        /* FP32 partial sums over 384 keys: a few ulps */
        CHECK(codes <= 2e-6, "%s: query rows differ by %.3g with constant V", pairs[t][1], codes);
        /* the papers' FP32 sum keeps E4M3's per-row bias: the check can fail */
        CHECK(plain >= 1e-4, "%s: rows differ by only %.3g (the test would not see a lost "
                             "+codesum)", pairs[t][0], plain);
    }
    free(q), free(k), free(v);
}

static void test_parse(void) {
    /* (sage8 and vc8 sum their codes by default: test_core's
     * test_method_defaults; +fp32sum names the FP32 sum there) */
    static const char *const ok[] = {"fp8+codesum",
                                     "fp8+codesum+hadamard"};
    static const char *const bad[] = {"sage8+expcast+codesum", "vc8+codesum+expcast-centred",
                                      "bf16+codesum", "sage4+codesum", "exact+codesum",
                                      "draft@85/0/7.5/7.5+codesum", "sage8+codesum+codesum"};
    check_method_option(ok, sizeof ok / sizeof *ok, bad, sizeof bad / sizeof *bad,
                        offsetof(qva_config, p_sum), QVA_P_SUM_CODES, QVA_P_SUM_FP32, "+codesum");
    /* the struct field set by hand: validated by the call */
    qva_config c;
    qva_config_default(&c); /* vc8+expcast: ExpCast sums its codes already */
    c.p_sum = QVA_P_SUM_CODES;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "p_sum with expcast refused");
    c.expcast = QVA_EXPCAST_OFF;
    CHECK(option_call_check(&c) == QVA_OK, "vc8 + p_sum: %s", qva_last_error());
    c.p_sum = QVA_P_SUM_FP32;
    CHECK(option_call_check(&c) == QVA_OK, "vc8 + the FP32 sum: %s", qva_last_error());
    c.p_sum = 2;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "p_sum = 2 refused");
}

int main(void) {
    test_constant_values();
    test_parse();
    return check_summary("test_codesum");
}
