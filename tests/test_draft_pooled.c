/*
 * draft's +pooled (cfg.skip_fill = QVA_SKIP_POOLED, docs/DRAFT.md "The
 * skipped pairs, pooled"): each skipped video-region pair (a, b) enters
 * the rows of a as count_b keys at region b's mean key with its mean value.
 *  (a) parsing, naming and validation: draft only;
 *  (b) with no pair skipped the call is bit for bit the call without it;
 *  (c) on nearly uniform rows (the harness's last layers, where a route
 *      drops most of each row) the error against exact attention falls
 *      below half of the route's without it; on sharper rows it does not
 *      grow past 5%.
 * CUDA refuses it (cuda_test_choose.c).
 */
#define TEST_RNG_SEED 0x9001EDull
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "qvattn.h"
#include "method_option.h"

enum { H = 2, GT = 4, GH = 16, GW = 32, N = GT * GH * GW, D = 64 };

typedef struct call_case {
    float *q, *k, *v, *ref;
} call_case;

static qva_tensor hnd(float *x) { return qva_tensor_hnd(x, QVA_F32, QVA_DEVICE_CPU, 1, H, N, D); }

static void run(const char *method, const call_case *c, float *out) {
    qva_config cfg;
    qva_config_default(&cfg);
    CHECK(qva_config_set_method(&cfg, method) == QVA_OK, "%s: %s", method, qva_last_error());
    cfg.layer = QVA_LAYER_NONE;
    cfg.draft.grid_t = GT, cfg.draft.grid_h = GH, cfg.draft.grid_w = GW;
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context");
    const qva_tensor tq = hnd(c->q), tk = hnd(c->k), tv = hnd(c->v), to = hnd(out);
    CHECK(qva_attention(ctx, &cfg, &tq, &tk, &tv, &to, NULL) == QVA_OK, "%s: %s", method,
          qva_last_error());
    qva_context_free(ctx);
}

/* Random Q (times q_scale: small flattens every row), K, and V with a
 * common mean; ref is exact attention. */
static void make_case(call_case *c, double q_scale) {
    const size_t all = (size_t)H * N * D;
    c->q = malloc(all * sizeof(float)), c->k = malloc(all * sizeof(float));
    c->v = malloc(all * sizeof(float)), c->ref = malloc(all * sizeof(float));
    for (size_t i = 0; i < all; ++i) {
        c->q[i] = (float)(q_scale * rng_gauss());
        c->k[i] = (float)rng_gauss();
        c->v[i] = (float)(0.5 + rng_gauss());
    }
    run("exact", c, c->ref);
}

static void free_case(call_case *c) { free(c->q), free(c->k), free(c->v), free(c->ref); }

static double rel_l2(const float *out, const float *ref) {
    qva_error_metrics m;
    qva_compare(out, ref, (size_t)H * N * D, &m);
    return m.rel_l2;
}

/* method and method+pooled: their errors against exact attention */
static void pair(const call_case *c, const char *method, double *e_drop, double *e_pooled) {
    char name[96];
    snprintf(name, sizeof name, "%s+pooled", method);
    const size_t all = (size_t)H * N * D;
    float *a = malloc(all * sizeof *a), *b = malloc(all * sizeof *b);
    run(method, c, a), run(name, c, b);
    *e_drop = rel_l2(a, c->ref), *e_pooled = rel_l2(b, c->ref);
    printf("  %s %.5f, +pooled %.5f (%.2fx)\n", method, *e_drop, *e_pooled, *e_pooled / *e_drop);
    free(a), free(b);
}

/* (a) */
static void test_parse(void) {
    static const char *const ok[] = {"draft@85/0/0/15+pooled", "draft@p95+pooled",
                                     "draft@85/0/7.5/7.5+expcast+pooled"};
    static const char *const bad[] = {"vc8+pooled", "sage8+pooled", "bf16+pooled",
                                      "draft@85/0/0/15+pooled+pooled"};
    check_method_option(ok, sizeof ok / sizeof *ok, bad, sizeof bad / sizeof *bad,
                        offsetof(qva_config, skip_fill), QVA_SKIP_POOLED, QVA_SKIP_DROP,
                        "+pooled");
    qva_config c;
    qva_config_default(&c);
    CHECK(qva_config_set_method(&c, "vc8") == QVA_OK, "vc8");
    c.skip_fill = QVA_SKIP_POOLED;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "vc8 with skip_fill POOLED refused");
    c.skip_fill = 2;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "skip_fill 2 refused");
}

/* (b) */
static void test_nothing_skipped(void) {
    call_case c;
    make_case(&c, 1.0);
    const size_t all = (size_t)H * N * D;
    float *a = malloc(all * sizeof *a), *b = malloc(all * sizeof *b);
    run("draft@0/0/0/100", &c, a), run("draft@0/0/0/100+pooled", &c, b);
    CHECK(memcmp(a, b, all * sizeof *a) == 0, "no pair skipped: +pooled changes nothing");
    free(a), free(b);
    free_case(&c);
}

/* (c) */
static void test_errors(void) {
    double ed, ep;
    call_case c;
    make_case(&c, 0.1); /* nearly uniform rows */
    pair(&c, "draft@70/0/0/30", &ed, &ep);
    CHECK(ed > 0.05 && ep < 0.5 * ed, "flat rows: %.5f against %.5f", ep, ed);
    pair(&c, "draft@85/0/7.5/7.5+expcast", &ed, &ep);
    CHECK(ep < 0.5 * ed, "flat rows, INT8 phase: %.5f against %.5f", ep, ed);
    free_case(&c);
    make_case(&c, 1.0); /* random heads: sharper rows, no locality */
    pair(&c, "draft@70/0/0/30", &ed, &ep);
    CHECK(ep < 1.05 * ed, "sharper rows: %.5f against %.5f", ep, ed);
    free_case(&c);
}

int main(void) {
    test_parse();
    test_nothing_skipped();
    test_errors();
    return check_summary("test_draft_pooled");
}
