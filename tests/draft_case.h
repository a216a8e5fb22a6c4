/* One draft problem for the adaptive-budget and LSE tests
 * (test_draft_adaptive.c, test_draft_lse.c): B = 1, H heads, a video grid
 * and a prefix, f32 [1,H,N,D] buffers, and the call through the CPU
 * reference's probe (src/cpu/draft.h), which can filter the route and
 * return it.  Include after check.h. */
#ifndef QVA_TEST_DRAFT_CASE_H
#define QVA_TEST_DRAFT_CASE_H

#include <stdlib.h>
#include <string.h>

#include "cpu/draft.h"

typedef struct dcase {
    int H, N, D, T, gh, gw, P;
    float *q, *k, *v; /* [H][N][D], zero until filled */
} dcase;

static dcase dcase_new(int H, int T, int gh, int gw, int P, int D) {
    dcase c = {H, P + T * gh * gw, D, T, gh, gw, P, NULL, NULL, NULL};
    size_t n = (size_t)H * c.N * D;
    c.q = calloc(n, sizeof(float));
    c.k = calloc(n, sizeof(float));
    c.v = calloc(n, sizeof(float));
    return c;
}

static void dcase_free(dcase *c) {
    free(c->q), free(c->k), free(c->v);
}

static size_t dcase_elems(const dcase *c) { return (size_t)c->H * c->N * c->D; }

/* Standard normal numbers, rounded to bf16 (the 16-bit phase then sees
 * the inputs exactly). */
static float dcase_normal(void) {
    double u = rng_unit() + 0x1p-54, w = rng_unit();
    return qva_round_bf16((float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w)));
}

static void dcase_fill_random(dcase *c) {
    for (size_t i = 0; i < dcase_elems(c); ++i) {
        c->q[i] = dcase_normal();
        c->k[i] = dcase_normal();
        c->v[i] = dcase_normal();
    }
}

/* The default config with `method` and the case's grid and prefix. */
static qva_config dcase_config(const dcase *c, const char *method) {
    qva_config cfg;
    qva_config_default(&cfg);
    qva_status st = qva_config_set_method(&cfg, method);
    CHECK(st == QVA_OK, "method %s: %s", method, qva_last_error());
    cfg.draft.grid_t = c->T;
    cfg.draft.grid_h = c->gh;
    cfg.draft.grid_w = c->gw;
    cfg.draft.prefix_tokens = c->P;
    return cfg;
}

/* The draft call on the CPU reference; out [H][N][D] and lse [H][N] (may
 * be NULL); probe NULL is the method as qva_attention runs it. */
static qva_status dcase_run(qva_context_t *ctx, const dcase *c, const qva_config *cfg,
                            float *out, float *lse, const qvi_draft_probe *probe) {
    qva_tensor q = qva_tensor_hnd(c->q, QVA_F32, QVA_DEVICE_CPU, 1, c->H, c->N, c->D);
    qva_tensor k = qva_tensor_hnd(c->k, QVA_F32, QVA_DEVICE_CPU, 1, c->H, c->N, c->D);
    qva_tensor v = qva_tensor_hnd(c->v, QVA_F32, QVA_DEVICE_CPU, 1, c->H, c->N, c->D);
    qva_tensor o = qva_tensor_hnd(out, QVA_F32, QVA_DEVICE_CPU, 1, c->H, c->N, c->D);
    qva_tensor l = qva_tensor_hnd(lse, QVA_F32, QVA_DEVICE_CPU, 1, c->H, c->N, 1);
    qva_status st = probe ? qvi_cpu_draft_probe(ctx, cfg, &q, &k, &v, &o, lse ? &l : NULL, probe)
                          : qva_attention(ctx, cfg, &q, &k, &v, &o, lse ? &l : NULL);
    CHECK(st == QVA_OK, "draft call: %s", qva_last_error());
    return st;
}

/* Video regions R of the case's grid (C = 128). */
static int64_t dcase_regions(const dcase *c) {
    return (int64_t)c->T * ((c->gh * c->gw + QVI_BLOCK - 1) / QVI_BLOCK);
}

#endif
