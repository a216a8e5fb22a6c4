/*
 * CPU reference of the dense methods: exact, bf16, fp8, sage8, vc8, sage4,
 * vc4 and their options.  Heads in order, each prepared (head_ops.c) and
 * then run row by row over its key blocks on the row engine (row.c), or in
 * FP64 for exact; layer_state.c gives each head what its layer carries.
 * docs/NUMERICS.md states every rounding and its paper equation; the GPU
 * is checked against these files.
 */
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

/* Scores of query row i against key block j; invalid keys -> -INFINITY. */
static void block_scores(const qvi_head_ops *o, int i, int j, float *s) {
    const int d = o->d, qb = i / QVI_BLOCK;
    const size_t qo = (size_t)i * d, ko = (size_t)j * QVI_BLOCK * d;
    switch (o->kind) {
    case QVI_PATH_16:
        qvi_scores_f32(o->qf + qo, o->kf + ko, QVI_BLOCK, d, o->scale_log2, s);
        break;
    case QVI_PATH_FP4:
        qvi_scores_f32(o->qf + qo, o->kf + ko, QVI_BLOCK, d,
                       (o->gq * o->gk) * o->scale_log2, s);
        break;
    case QVI_PATH_I8:
        qvi_scores_i8(o->qi.codes + qo, qvi_i8_row_scale(&o->qi, i), o->ki.codes + ko,
                      o->ki.scale[j], QVI_BLOCK, d, o->scale_log2, s);
        break;
    case QVI_PATH_FP8:
        qvi_scores_e4m3(o->q8.codes + qo, o->q8.block_scale[qb],
                        o->k8.codes + ko, o->k8.block_scale[j], QVI_BLOCK, d,
                        o->scale_log2, s);
        break;
    case QVI_PATH_F32:
        qvi_scores_f32(o->xq + qo, o->xk + ko, QVI_BLOCK, d, o->scale_log2, s);
        break;
    }
    for (int t = o->nk - j * QVI_BLOCK; t < QVI_BLOCK; ++t) s[t] = -INFINITY;
}

/* Probabilities of one key block on the FP32 engine into p; returns the
 * row sum that enters l and the V-Smooth restore.  P quantized: the
 * method's own codes (qvi_probs_e4m3, or NVFP4 after an FP32 row sum, as
 * qvi_pv_nvfp4); otherwise FP32 exp2(s - m) and their FP32 sum. */
static float fp32_probs(const qvi_head_ops *o, const float *s, float m, float *p, float *under) {
    *under = 0.0f;
    const int quant = (o->mask & QVI_QUANT_P) != 0;
    if (quant && o->codes_kind == QVI_PATH_I8 && o->v_code == QVA_V_INT8_PV) {
        uint8_t u[QVI_BLOCK];
        float rowsum;
        const float w = qvi_probs_u8(s, m, QVI_BLOCK, o->sum_codes, u, &rowsum);
        for (int j = 0; j < QVI_BLOCK; ++j) p[j] = (float)u[j] * w;
        return rowsum;
    }
    if (quant && o->codes_kind != QVI_PATH_FP4) {
        uint8_t pc[QVI_BLOCK];
        float w; /* as qvi_pv_e4m3 */
        const float rowsum = qvi_probs_e4m3_at(s, m, QVI_BLOCK, o->expcast, o->sum_codes,
                                               o->p_block, pc, o->floor_mass ? under : NULL, &w);
        const float *plut = qvi_p_lut(o->expcast);
        for (int j = 0; j < QVI_BLOCK; ++j) p[j] = plut[pc[j]] * w;
        return rowsum;
    }
    float rowsum = 0.0f;
    for (int j = 0; j < QVI_BLOCK; ++j) {
        p[j] = s[j] == -INFINITY ? 0.0f : exp2f(s[j] - m);
        rowsum += p[j];
    }
    for (int j = 0; quant && j < QVI_BLOCK; j += 16) qva_nvfp4_quantize_probs16(p + j);
    return rowsum;
}

/* The FP32 engine's PV of key block j: FP32 partial over real-unit values,
 * then the V-Smooth restore rowsum * mu (VC Eq. 6) where there are means. */
static void fp32_pv(const qvi_head_ops *o, qvi_row *r, int j, const float *s) {
    if (r->m == -INFINITY) return;
    const int d = o->d;
    const float *V = o->xv + (size_t)j * QVI_BLOCK * d;
    const float *mu = o->xmu ? o->xmu + (size_t)j * d : NULL;
    float p[QVI_BLOCK], part[128] = {0}, under;
    float rowsum = fp32_probs(o, s, r->m, p, &under);
    for (int t = 0; t < QVI_BLOCK; ++t) {
        if (p[t] == 0.0f) continue;
        for (int c = 0; c < d; ++c) part[c] += p[t] * V[(size_t)t * d + c];
    }
    if (o->floor_mass) { /* as qvi_pv_e4m3 (under is 0 where P is exact) */
        rowsum += under;
        if (!mu) r->floor += under;
    }
    r->l += rowsum;
    for (int c = 0; c < d; ++c) r->acc[c] += part[c] + (mu ? rowsum * mu[c] : 0.0f);
}

static void block_pv(const qvi_head_ops *o, qvi_row *r, int j, const float *s) {
    const size_t vo = (size_t)j * QVI_BLOCK * o->d;
    switch (o->kind) {
    case QVI_PATH_16: qvi_pv_16(r, s, o->vf + vo, QVI_BLOCK, o->use_f16); break;
    case QVI_PATH_FP4:
        qvi_pv_nvfp4(r, s, o->vf + vo, o->gv,
                     o->mu4 ? o->mu4 + (size_t)j * o->d : NULL, QVI_BLOCK);
        break;
    case QVI_PATH_I8:
        if (o->v_code == QVA_V_INT8_PV)
            qvi_pv_u8i8(r, s, o->v8.codes + vo,
                        o->v8.mu_hat ? o->v8.mu_hat + (size_t)j * o->d : NULL, QVI_BLOCK,
                        o->sum_codes);
        else
            qvi_pv_e4m3(r, s, o->v8.codes + vo, o->v8.codes_lo ? o->v8.codes_lo + vo : NULL,
                        1.0f, o->v8.mu_hat ? o->v8.mu_hat + (size_t)j * o->d : NULL,
                        QVI_BLOCK, o->expcast, o->sum_codes, 0, o->floor_mass, o->p_block);
        break;
    case QVI_PATH_FP8:
        qvi_pv_e4m3(r, s, o->v8b.codes + vo, NULL, o->v8b.block_scale[j], NULL,
                    QVI_BLOCK, o->expcast, o->sum_codes, 0, 0, 0);
        break;
    case QVI_PATH_F32: fp32_pv(o, r, j, s); break;
    }
}

static float path_log2_amp(const qvi_head_ops *o) {
    const qvi_path_kind p_kind = o->kind == QVI_PATH_F32 && (o->mask & QVI_QUANT_P) ? o->codes_kind
                                                                              : o->kind;
    if (p_kind == QVI_PATH_I8 && o->v_code == QVA_V_INT8_PV) return QVI_U8_LOG2_AMP;
    if (p_kind == QVI_PATH_I8 || p_kind == QVI_PATH_FP8)
        return qvi_p_log2_amp(o->expcast);
    return 0.0f;
}

/* The online recurrence of one query row over every key block. */
static float run_row(const qvi_head_ops *o, int i, float *out) {
    float acc[128], s[QVI_BLOCK];
    qvi_row r;
    qvi_row_init(&r, acc, o->d);
    r.floor_mean = o->kind == QVI_PATH_F32 ? o->xvbar : o->vbar;
    const int nblk = o->nk_pad / QVI_BLOCK;
    for (int j = 0; j < nblk; ++j) {
        block_scores(o, i, j, s);
        qvi_row_raise_max(&r, s, QVI_BLOCK);
        block_pv(o, &r, j, s);
    }
    const float *cs = o->kind == QVI_PATH_I8 ? o->v8.chan_scale : NULL;
    /* a dense row retains every key (N >= 1): it is never empty */
    return qvi_row_finish(&r, QVI_ROW_RETAINED | (o->strict ? QVI_ROW_STRICT : 0), cs,
                          path_log2_amp(o), out);
}

/* FP64 two-pass softmax attention of one row: the ground truth.  A NaN
 * input reaching the row (check_finite = 0) makes it NaN by plain IEEE
 * propagation; FP64 scores of finite FP32 inputs never overflow. */
static float exact_row(const float *q, const float *k, const float *v, int nk,
                       int d, double scale, double *sbuf, float *out) {
    double mx = -INFINITY;
    for (int j = 0; j < nk; ++j) {
        double acc = 0.0;
        for (int c = 0; c < d; ++c) acc += (double)q[c] * k[(size_t)j * d + c];
        sbuf[j] = acc * scale;
        if (sbuf[j] > mx) mx = sbuf[j];
    }
    double l = 0.0, o[128] = {0};
    for (int j = 0; j < nk; ++j) {
        double p = exp(sbuf[j] - mx);
        l += p;
        for (int c = 0; c < d; ++c) o[c] += p * v[(size_t)j * d + c];
    }
    for (int c = 0; c < d; ++c) out[c] = (float)(o[c] / l);
    return (float)(mx + log(l));
}

static qva_status exact_head(const qva_config *cfg, const qva_tensor *qt,
                             const qva_tensor *kt, const qva_tensor *vt,
                             int64_t b, int64_t h, int64_t hk, float *ob, float *lb) {
    const int nq = (int)qt->shape[2], nk = (int)kt->shape[2], d = (int)qt->shape[3];
    float *q = malloc((size_t)nq * d * sizeof *q), *k = malloc((size_t)nk * d * sizeof *k),
          *v = malloc((size_t)nk * d * sizeof *v);
    int ok = q && k && v, no_sbuf = 0; /* a thread without its score buffer */
    if (ok) {
        qvi_load_head(qt, b, h, q);
        qvi_load_head(kt, b, hk, k);
        qvi_load_head(vt, b, hk, v);
        const double scale = qvi_sm_scale(cfg, d);
#pragma omp parallel
        {
            double *sbuf = malloc((size_t)nk * sizeof *sbuf);
            if (!sbuf) {
#pragma omp atomic write
                no_sbuf = 1;
            }
#pragma omp for schedule(static)
            for (int i = 0; i < nq; ++i)
                if (sbuf)
                    lb[i] = exact_row(q + (size_t)i * d, k, v, nk, d, scale, sbuf,
                                      ob + (size_t)i * d);
            free(sbuf);
        }
        ok = !no_sbuf;
    }
    free(q), free(k), free(v);
    return ok ? QVA_OK : qvi_fail(QVA_ERR_OUT_OF_MEMORY, "exact attention buffers");
}

static qva_status quantized_head(const qva_config *cfg, const qva_tensor *qt,
                                 const qva_tensor *kt, const qva_tensor *vt, int64_t b,
                                 int64_t h, int64_t hk, const int32_t *perm, int demean,
                                 int mask, const qvi_carried *km, float *ob, float *lb) {
    qvi_head_ops o;
    qva_status st = qvi_cpu_prepare_head(cfg, qt, kt, vt, b, h, hk, perm, demean, mask, km, &o);
    if (st == QVA_OK) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < o.nq; ++i) {
            lb[i] = run_row(&o, i, ob + (size_t)i * o.d);
            if (o.lse_shift) lb[i] += o.lse_shift[i]; /* -inf stays -inf */
        }
    }
    qvi_cpu_head_ops_free(&o);
    return st;
}

qva_status qvi_check_rows(const float *out, const float *lse, int64_t n, int d,
                          int64_t b, int64_t h) {
    for (int64_t i = 0; i < n; ++i) {
        const float *o = out + i * d;
        int c = 0;
        while (c < d && isfinite(o[c])) ++c;
        if (c < d)
            return qvi_fail(QVA_ERR_NONFINITE,
                            "output[%lld,%lld,%lld,%d] is %g although the inputs are finite: "
                            "the row's scores or sums overflow FP32 in this method "
                            "(scale q, k or v down, or use exact)",
                            (long long)b, (long long)h, (long long)i, c, (double)o[c]);
        if (lse && (isnan(lse[i]) || lse[i] == INFINITY))
            return qvi_fail(QVA_ERR_NONFINITE,
                            "LSE[%lld,%lld,%lld] is %g: the row's log-sum-exp overflows FP32 "
                            "(scale q or k down, or pass no LSE)",
                            (long long)b, (long long)h, (long long)i, (double)lse[i]);
    }
    return QVA_OK;
}

static void store_lse(const qva_tensor *lse, int64_t b, int64_t h,
                      const float *lb, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        ((float *)lse->data)[qvi_offset(lse, b, h, i, 0)] = lb[i];
}

qva_status qvi_cpu_attention(qva_context_t *ctx, const qva_config *cfg,
                             const qva_tensor *q, const qva_tensor *k,
                             const qva_tensor *v, const qva_tensor *out,
                             const qva_tensor *lse) {
    return qvi_cpu_attention_masked(ctx, cfg, q, k, v, out, lse, QVI_QUANT_ALL);
}

/* Heads in (b, h) order; query head h reads K/V head h / (H / H_kv),
 * whose V-Smooth order is decided once for its group. */
qva_status qvi_cpu_attention_masked(qva_context_t *ctx, const qva_config *cfg,
                                    const qva_tensor *q, const qva_tensor *k,
                                    const qva_tensor *v, const qva_tensor *out,
                                    const qva_tensor *lse, int mask) {
    const int64_t nq = q->shape[2], d = q->shape[3];
    const int64_t group = q->shape[1] / k->shape[1];
    float *ob = malloc((size_t)nq * d * sizeof *ob), *lb = malloc((size_t)nq * sizeof *lb);
    if (!ob || !lb) {
        free(ob), free(lb);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "output buffers");
    }
    qva_status st = QVA_OK;
    const int32_t *perm = NULL;
    int demean = 0;
    float buf[4][128];
    qvi_carried cs = {NULL, NULL, NULL, NULL, 0};
    const int64_t shape[3] = {q->shape[0], q->shape[1], k->shape[1]};
    if ((cfg->k_mean == QVA_K_MEAN_PREVIOUS || cfg->v_scale == QVA_V_SCALE_PREVIOUS) &&
        cfg->layer != QVA_LAYER_NONE)
        qvi_context_carry_shape(ctx, cfg->layer, shape);
    for (int64_t b = 0; b < q->shape[0] && st == QVA_OK; ++b)
        for (int64_t h = 0; h < q->shape[1] && st == QVA_OK; ++h) {
            const int64_t hk = h / group;
            if (h % group == 0 &&
                ((st = qvi_cpu_kv_head_order(ctx, cfg, v, b, hk, &perm, &demean)) != QVA_OK ||
                 (st = qvi_cpu_carried_of(ctx, cfg, b, hk, (int)d, buf, &cs)) != QVA_OK ||
                 (st = qvi_cpu_sampled_of(cfg, k, v, b, hk, buf, &cs)) != QVA_OK))
                break;
            /* the group's heads use one carried set; the last leaves the next */
            const int last = h % group == group - 1;
            const qvi_carried hcs = {cs.kuse, cs.vuse, last ? cs.knext : NULL, last ? cs.vnext : NULL,
                                 cs.v_blocks};
            st = cfg->method == QVA_METHOD_EXACT
                     ? exact_head(cfg, q, k, v, b, h, hk, ob, lb)
                     : quantized_head(cfg, q, k, v, b, h, hk, perm, demean, mask, &hcs, ob, lb);
            if (st == QVA_OK && (hcs.knext || hcs.vnext))
                st = qvi_cpu_carried_store(ctx, cfg, b, hk, (int)d, shape, &hcs);
            if (st == QVA_OK && cfg->check_finite)
                st = qvi_check_rows(ob, lse ? lb : NULL, nq, (int)d, b, h);
            if (st != QVA_OK) break;
            qvi_store_head(out, b, h, ob);
            if (lse) store_lse(lse, b, h, lb, nq);
        }
    free(ob), free(lb);
    return st;
}
