/*
 * qva_error_terms_compute: where a quantized method's error comes from.
 * The CPU reference runs the method with one operand quantized at a time
 * (qvi_quant_mask) and each run is scored against exact attention
 * (docs/NUMERICS.md, "Where the error comes from").  Core level: it calls
 * the CPU backend through qvi_cpu_run, as qva_attention does.
 */
#include "internal.h"
#include "checked.h"

#include <stdlib.h>
#include <string.h>

/* The runs, in the order of qva_error_terms' fields. */
static const int term_masks[] = {QVI_QUANT_ALL, QVI_QUANT_Q, QVI_QUANT_K, QVI_QUANT_P,
                                 QVI_QUANT_V,   QVI_QUANT_MU, 0};
#define NTERMS ((int)(sizeof term_masks / sizeof *term_masks))

static double *term_field(qva_error_terms *t, int i) {
    double *f[NTERMS] = {&t->full, &t->q, &t->k, &t->p, &t->v, &t->mu, &t->none};
    return f[i];
}

static qva_error_direction *dir_field(qva_error_term_directions *d, int i) {
    qva_error_direction *f[NTERMS] = {&d->full, &d->q, &d->k, &d->p, &d->v, &d->mu, &d->none};
    return f[i];
}

static void dirs_nan(qva_error_term_directions *d) {
    for (int i = 0; d && i < NTERMS; ++i) dir_field(d, i)->sharpen = dir_field(d, i)->cos = NAN;
}

static void terms_nan(qva_error_terms *t) {
    for (int i = 0; i < NTERMS; ++i) *term_field(t, i) = NAN;
}

qva_status qvi_check_on_cpu(const qva_tensor *q, const qva_tensor *k, const qva_tensor *v,
                            const char *func) {
    const qva_tensor *t[3] = {q, k, v};
    static const char *const name[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; ++i)
        if (t[i] && t[i]->device == QVA_DEVICE_CUDA)
            return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                            "%s runs the CPU reference: %s is on a CUDA device (copy "
                            "q, k and v to the host)", func, name[i]);
    return QVA_OK;
}

/* Why a method has no decomposition (include/qvattn.h). */
static qva_status check_decomposable(const qva_config *cfg) {
    switch (cfg->method) {
    case QVA_METHOD_EXACT:
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "exact quantizes nothing: there is no error to decompose "
                        "(decomposed: fp8, sage8, vc8, sage4, vc4)");
    case QVA_METHOD_BF16:
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "bf16 rounds Q, K, V and P to one 16-bit format, with no "
                        "quantizer of its own per operand: not decomposed "
                        "(decomposed: fp8, sage8, vc8, sage4, vc4)");
    case QVA_METHOD_DRAFT:
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "draft mixes skipped blocks with three precisions chosen "
                        "per block pair: not decomposed; decompose the dense "
                        "method of a phase (sage8, sage4) instead");
    default: return QVA_OK;
    }
}

static qva_status check_call(const qva_config *cfg, const qva_tensor *q,
                             const qva_tensor *k, const qva_tensor *v) {
    qva_status st = qvi_check_on_cpu(q, k, v, "qva_error_terms_compute");
    if (st == QVA_OK) st = qva_attention_check(QVA_DEVICE_CPU, cfg, q, k, v, NULL, NULL);
    if (st == QVA_OK) st = check_decomposable(cfg);
    return st;
}

/* One CPU run of cfg with mask into out (f32 HND, q's shape). */
static qva_status run_masked(qva_context_t *ctx, const qva_config *cfg, const qva_tensor *q,
                             const qva_tensor *k, const qva_tensor *v, float *out, int mask) {
    qva_tensor o = qva_tensor_hnd(out, QVA_F32, QVA_DEVICE_CPU, q->shape[0], q->shape[1],
                                  q->shape[2], q->shape[3]);
    qvi_context_lock(ctx);
    qva_status st = qvi_cpu_run(ctx, cfg, q, k, v, &o, NULL, mask);
    qvi_context_unlock(ctx);
    return st;
}

static int has_means(qva_method m) {
    return m == QVA_METHOD_VC8 || m == QVA_METHOD_VC4;
}

/* The exact reference into ref, then every term against it (and its
 * error's direction, where dirs is given). */
static qva_status compute_terms(qva_context_t *ctx, const qva_config *cfg,
                                const qva_tensor *q, const qva_tensor *k,
                                const qva_tensor *v, float *ref, float *buf, size_t n,
                                qva_error_terms *terms, qva_error_term_directions *dirs) {
    qva_config exact = *cfg;
    exact.method = QVA_METHOD_EXACT;
    qva_status st = run_masked(ctx, &exact, q, k, v, ref, QVI_QUANT_ALL);
    for (int i = 0; i < NTERMS && st == QVA_OK; ++i) {
        if (term_masks[i] == QVI_QUANT_MU && !has_means(cfg->method)) continue;
        st = run_masked(ctx, cfg, q, k, v, buf, term_masks[i]);
        if (st != QVA_OK) break;
        qva_error_metrics m;
        qva_compare(buf, ref, n, &m);
        *term_field(terms, i) = m.rel_l2;
        /* buf and ref: f32 HND of q's shape.  A term whose output is not
         * finite keeps NaN directions (as its rel-L2 is +inf), and the call
         * goes on, as without directions. */
        if (dirs && qva_error_direction_compute(buf, ref, q->shape[1], q->shape[2], v,
                                                dir_field(dirs, i)) != QVA_OK)
            qvi_clear_error();
    }
    return st;
}

static qva_status terms_and_directions(const qva_config *cfg, const qva_tensor *q,
                                       const qva_tensor *k, const qva_tensor *v,
                                       qva_error_terms *terms, qva_error_term_directions *dirs) {
    qvi_clear_error();
    dirs_nan(dirs);
    if (!terms)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qva_error_terms_compute: terms is NULL");
    terms_nan(terms);
    qva_status st = check_call(cfg, q, k, v);
    if (st != QVA_OK) return st;
    qva_config c = *cfg; /* stateless, as QVA_LAYER_NONE in qva_attention */
    c.layer = QVA_LAYER_NONE;
    c.vsmooth.schedule = QVA_SCHEDULE_ALWAYS;
    c.vsmooth.warm_start = 0;
    int64_t elems; /* validated shapes: the product fits (QVA_MAX_TENSOR_BYTES) */
    if (!qvi_prod_i64(q->shape, 4, &elems) || (uint64_t)elems > SIZE_MAX / 2 / sizeof(float))
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "error terms: output too large");
    float *ref = malloc((size_t)elems * sizeof *ref), *buf = malloc((size_t)elems * sizeof *buf);
    qva_context_t *ctx = NULL;
    st = ref && buf ? qva_context_create(&ctx, QVA_DEVICE_CPU)
                    : qvi_fail(QVA_ERR_OUT_OF_MEMORY, "error terms: two outputs of %lld floats",
                               (long long)elems);
    if (st == QVA_OK) st = compute_terms(ctx, &c, q, k, v, ref, buf, (size_t)elems, terms, dirs);
    if (st != QVA_OK) terms_nan(terms), dirs_nan(dirs);
    qva_context_free(ctx);
    free(ref), free(buf);
    return st;
}

qva_status qva_error_terms_compute(const qva_config *cfg, const qva_tensor *q,
                                   const qva_tensor *k, const qva_tensor *v,
                                   qva_error_terms *terms) {
    return terms_and_directions(cfg, q, k, v, terms, NULL);
}

qva_status qva_error_terms_directions_compute(const qva_config *cfg, const qva_tensor *q,
                                              const qva_tensor *k, const qva_tensor *v,
                                              qva_error_terms *terms,
                                              qva_error_term_directions *dirs) {
    if (!dirs)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_error_terms_directions_compute: dirs is NULL");
    return terms_and_directions(cfg, q, k, v, terms, dirs);
}
