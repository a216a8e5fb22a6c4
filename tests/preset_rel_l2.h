/*
 * A method on a synthetic preset's tokens on the CPU reference, and its
 * rel-L2 against exact attention (used by test_v2.c and test_i8pv.c;
 * include after check.h and qvattn.h).
 */
#ifndef QVATTN_TEST_PRESET_REL_L2_H
#define QVATTN_TEST_PRESET_REL_L2_H

#include <stdlib.h>

/* `method` over the whole [B, H, n, D] case into out; whether it ran. */
static int run_method(const char *method, const qva_synthetic_spec *sp, const float *q,
                      const float *k, const float *v, float *out, int64_t n) {
    qva_config cfg;
    qva_config_default(&cfg);
    CHECK(qva_config_set_method(&cfg, method) == QVA_OK, "%s: %s", method, qva_last_error());
    cfg.layer = QVA_LAYER_NONE;
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context");
    const qva_tensor tq = qva_tensor_hnd((void *)q, QVA_F32, QVA_DEVICE_CPU, sp->B, sp->H, n, sp->D);
    const qva_tensor tk = qva_tensor_hnd((void *)k, QVA_F32, QVA_DEVICE_CPU, sp->B, sp->H, n, sp->D);
    const qva_tensor tv = qva_tensor_hnd((void *)v, QVA_F32, QVA_DEVICE_CPU, sp->B, sp->H, n, sp->D);
    const qva_tensor to = qva_tensor_hnd(out, QVA_F32, QVA_DEVICE_CPU, sp->B, sp->H, n, sp->D);
    const qva_status st = qva_attention(ctx, &cfg, &tq, &tk, &tv, &to, NULL);
    CHECK(st == QVA_OK, "%s: %s", method, qva_last_error());
    qva_context_free(ctx);
    return st == QVA_OK;
}

/* FP64 attention of the case into ref. */
static void exact_reference(const qva_synthetic_spec *sp, const float *q, const float *k,
                            const float *v, float *ref, int64_t n) {
    (void)run_method("exact", sp, q, k, v, ref, n);
}

/* The rel-L2 of `method` against ref (1 if it did not run). */
static double run_rel_l2(const char *method, const qva_synthetic_spec *sp, const float *q,
                         const float *k, const float *v, const float *ref, int64_t n) {
    const size_t all = (size_t)sp->B * sp->H * n * sp->D;
    float *o = calloc(all, sizeof *o);
    double rel = 1.0;
    if (run_method(method, sp, q, k, v, o, n)) {
        qva_error_metrics m;
        qva_compare(o, ref, all, &m);
        rel = m.rel_l2;
    }
    free(o);
    return rel;
}

/* A 384-token part of a preset (a 12 x 32 part of one frame, small enough
 * for CI under ASan), its q, k, v and their exact attention ref. */
typedef struct preset_case {
    qva_synthetic_spec sp;
    int64_t n;
    float *q, *k, *v, *ref;
} preset_case;

static void preset_case_make(const char *preset, preset_case *c) {
    CHECK(qva_synthetic_preset(preset, &c->sp) == QVA_OK, "%s", preset);
    c->sp.grid_t = 1;
    c->sp.grid_h = 12;
    c->n = (int64_t)c->sp.grid_t * c->sp.grid_h * c->sp.grid_w + c->sp.prefix_tokens;
    const size_t all = (size_t)c->sp.B * c->sp.H * c->n * c->sp.D;
    c->q = malloc(all * sizeof *c->q), c->k = malloc(all * sizeof *c->k);
    c->v = malloc(all * sizeof *c->v), c->ref = calloc(all, sizeof *c->ref);
    CHECK(qva_synthetic_generate(&c->sp, c->q, c->k, c->v) == QVA_OK, "%s", qva_last_error());
    exact_reference(&c->sp, c->q, c->k, c->v, c->ref, c->n);
}

static void preset_case_free(preset_case *c) {
    free(c->q), free(c->k), free(c->v), free(c->ref);
}

/* The rel-L2 of `method` on the case. */
static double case_rel_l2(const char *method, const preset_case *c) {
    return run_rel_l2(method, &c->sp, c->q, c->k, c->v, c->ref, c->n);
}

/* A stateless config of `method`, and head 0 of the case as CPU tensors. */
static qva_config case_config(const char *method) {
    qva_config cfg;
    qva_config_default(&cfg);
    CHECK(qva_config_set_method(&cfg, method) == QVA_OK, "%s", method);
    cfg.layer = QVA_LAYER_NONE;
    return cfg;
}

static qva_tensor case_head0(const preset_case *c, float *x) {
    return qva_tensor_hnd(x, QVA_F32, QVA_DEVICE_CPU, c->sp.B, 1, c->n, c->sp.D);
}

/* The decomposition's terms of `method` on head 0 of the case (the terms
 * cost seven calls each). */
static void case_terms(const char *method, const preset_case *c, qva_error_terms *t) {
    const qva_config cfg = case_config(method);
    const qva_tensor tq = case_head0(c, c->q), tk = case_head0(c, c->k), tv = case_head0(c, c->v);
    CHECK(qva_error_terms_compute(&cfg, &tq, &tk, &tv, t) == QVA_OK, "terms of %s: %s", method,
          qva_last_error());
}

/* case_terms, and the direction of each term's error. */
static void case_directions(const char *method, const preset_case *c, qva_error_terms *t,
                            qva_error_term_directions *g) {
    const qva_config cfg = case_config(method);
    const qva_tensor tq = case_head0(c, c->q), tk = case_head0(c, c->k), tv = case_head0(c, c->v);
    CHECK(qva_error_terms_directions_compute(&cfg, &tq, &tk, &tv, t, g) == QVA_OK,
          "directions of %s: %s", method, qva_last_error());
}

/* Where a V option's gain comes from: against `base`, the decomposition's
 * V term falls by at least `factor` and the Q term (the same Q codes)
 * does not move; d1, d2 receive both methods' terms. */
static void check_v_term_gain(const char *preset, const char *base, const char *method,
                              const preset_case *c, double factor, qva_error_terms *d1,
                              qva_error_terms *d2) {
    case_terms(base, c, d1);
    case_terms(method, c, d2);
    CHECK(d2->v <= d1->v / factor, "%s: V term %.5f with %s against %.5f", preset, d2->v, method,
          d1->v);
    CHECK(d2->q == d1->q, "%s: the Q term moved (%.6f, %.6f)", preset, d1->q, d2->q);
}

#endif
