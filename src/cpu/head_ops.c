/*
 * One head's operands for the dense methods of the CPU reference: Q, K, V
 * loaded in the V-Smooth order, K smoothed (SageAttention; +kprev,
 * +ksample), Q and K rotated (+hadamard), then coded for the method's path
 * (16-bit, FP8, INT8 QK with qvi_v8 values, NVFP4), or kept in FP32 and
 * dequantized operand by operand for the decomposition (QVI_PATH_F32).
 */
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

void qvi_cpu_head_ops_free(qvi_head_ops *o) {
    free(o->qf);
    free(o->kf);
    free(o->vf);
    free(o->mu4);
    free(o->lse_shift);
    free(o->xq);
    free(o->xk);
    free(o->xv);
    free(o->xmu);
    free(o->vbar);
    free(o->xvbar);
    free(o->qi.codes);
    free(o->qi.scale);
    free(o->ki.codes);
    free(o->ki.scale);
    qvi_f8 *f8s[3] = {&o->q8, &o->k8, &o->v8b};
    for (int i = 0; i < 3; ++i) {
        free(f8s[i]->codes);
        free(f8s[i]->block_scale);
        free(f8s[i]->chan_scale);
    }
    qvi_v8_free(&o->v8);
}

static int smooths_k(qva_method m) {
    return m == QVA_METHOD_SAGE8 || m == QVA_METHOD_VC8 ||
           m == QVA_METHOD_SAGE4 || m == QVA_METHOD_VC4;
}

/* K smoothing (SageAttention): subtracting a vector `mean` from every key
 * (this call's channel mean, or +kprev's carried one) shifts every score of
 * query row i by the constant q_i . mean * sm_scale, which the softmax
 * ignores but the LSE does not; lse_shift[i] receives that constant (FP64
 * dot, natural-log units) so the returned LSE is the one of the unsmoothed
 * scores. */
static void smooth_k(float *k, int nk, const float *q, int nq, int d, float sm_scale,
                     const float *mean, float *lse_shift) {
    for (int i = 0; i < nk; ++i)
        for (int c = 0; c < d; ++c) k[(size_t)i * d + c] -= mean[c];
    for (int i = 0; i < nq; ++i) {
        double dot = 0.0;
        for (int c = 0; c < d; ++c) dot += (double)q[(size_t)i * d + c] * mean[c];
        lse_shift[i] = (float)(dot * sm_scale);
    }
}

/* +kprev: the K mean the layer's next call smooths with, from this call's
 * INT8 codes of the smoothed (and rotated) K: mean(K) = used + mean(K -
 * used), the second term as (sum over blocks of scale_b * the block's
 * exact integer code sums) / nk in FP64, block order, then rotated back
 * (the rotation's inverse: signs times the Hadamard transform) and added.
 * Integer sums have no order, so a device can make them where it codes K. */
static void next_k_mean(const qvi_i8 *ki, int nk, int d, const float *used,
                        const float *signs, float *next) {
    const int nblk = qvi_cdiv(nk, QVI_BLOCK);
    float corr[128]; /* next may be used */
    for (int c = 0; c < d; ++c) {
        double s = 0.0;
        for (int b = 0; b < nblk; ++b) {
            int32_t sum = 0;
            for (int r = b * QVI_BLOCK; r < (b + 1) * QVI_BLOCK; ++r) /* padding codes 0 */
                sum += ki->codes[(size_t)r * d + c];
            s += (double)ki->scale[b] * (double)sum;
        }
        corr[c] = (float)(s / (double)nk);
    }
    if (signs) {
        qva_hadamard(corr, d, NULL);
        for (int c = 0; c < d; ++c) corr[c] *= signs[c];
    }
    for (int c = 0; c < d; ++c) next[c] = used[c] + corr[c];
}

static void hadamard_rows(float *x, int n, int d, const float *signs) {
    for (int i = 0; i < n; ++i) qva_hadamard(x + (size_t)i * d, d, signs);
}

static void round_rows16(float *x, size_t count, qva_dtype in_dtype) {
    for (size_t i = 0; i < count; ++i)
        x[i] = in_dtype == QVA_F16 ? qva_round_f16(x[i]) : qva_round_bf16(x[i]);
}

static float *alloc_padded(int n_pad, int d) {
    return calloc((size_t)n_pad * d, sizeof(float));
}

/* NVFP4 operands of sage4/vc4; vc4 first demeans V (means added unscaled
 * at 4 bits, VC App. B). Takes ownership of nothing. */
static qva_status quantize_fp4(float *q, float *k, float *v, int demean,
                               qvi_head_ops *o) {
    const int d = o->d, nblk = o->nk_pad / QVI_BLOCK;
    if (demean) {
        o->mu4 = malloc((size_t)nblk * d * sizeof(float));
        if (!o->mu4) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "vc4 means");
        qvi_block_demean(v, o->nk, d, nblk, o->mu4);
        for (size_t i = 0; i < (size_t)nblk * d; ++i) o->mu4[i] = qva_round_f16(o->mu4[i]);
    }
    o->qf = alloc_padded(o->nq_pad, d);
    o->kf = alloc_padded(o->nk_pad, d);
    o->vf = alloc_padded(o->nk_pad, d);
    if (!o->qf || !o->kf || !o->vf)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "nvfp4 operands");
    o->gq = qvi_quant_nvfp4_rows(q, o->nq_pad, d, o->qf);
    o->gk = qvi_quant_nvfp4_rows(k, o->nk_pad, d, o->kf);
    o->gv = qvi_quant_nvfp4_cols(v, o->nk_pad, d, o->vf);
    return QVA_OK;
}

/* +floormass without demeaning: the head's channel mean of V over its valid
 * rows in the V codes' units, stored as the block means are (VC App. B). */
static qva_status head_mean_hat(const float *v, qvi_head_ops *o) {
    o->vbar = malloc((size_t)o->d * sizeof(float));
    if (!o->vbar) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "mean of V");
    qvi_channel_mean(v, o->nk, o->d, o->vbar);
    for (int c = 0; c < o->d; ++c) o->vbar[c] = qva_round_f16(o->vbar[c] / o->v8.chan_scale[c]);
    return QVA_OK;
}

/* The 8- and 4-bit codes of the (already smoothed / rotated / permuted)
 * f32 operands. */
static qva_status quantize_codes(float *q, float *k, float *v, int demean,
                                 const qvi_carried *cs, qvi_head_ops *o) {
    const int d = o->d;
    if (o->kind == QVI_PATH_FP8) {
        qvi_quant_e4m3_blocks(q, o->nq_pad, d, &o->q8);
        qvi_quant_e4m3_blocks(k, o->nk_pad, d, &o->k8);
        qvi_quant_e4m3_blocks(v, o->nk_pad, d, &o->v8b);
        if (!o->q8.codes || !o->k8.codes || !o->v8b.codes)
            return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "fp8 operands");
        return QVA_OK;
    }
    if (o->kind == QVI_PATH_I8) {
        qvi_quant_i8(q, o->nq_pad, d, o->q_rows_per_scale, &o->qi);
        qvi_quant_i8(k, o->nk_pad, d, QVI_BLOCK, &o->ki);
        qva_status st = (!o->qi.codes || !o->ki.codes)
                            ? qvi_fail(QVA_ERR_OUT_OF_MEMORY, "int8 operands")
                            : qvi_v8_prepare_carried(v, o->nk, d, NULL, demean, o->v_code,
                                                     cs->vuse, cs->v_blocks, cs->vnext, &o->v8);
        if (st == QVA_OK && o->floor_mass && !demean) st = head_mean_hat(v, o);
        return st;
    }
    return quantize_fp4(q, k, v, demean, o);
}

/* ------------------------------------------------ the decomposition's engine */

static float *copy_floats(const float *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    if (y) memcpy(y, x, n * sizeof *y);
    return y;
}

/* The FP32 operands the quantizers are about to see, kept for the FP32
 * engine before quantize_codes runs (quantize_fp4 demeans v in place).  A
 * V-Smooth value operand is split as qvi_v8_prepare / quantize_fp4 split it
 * (block_demean of the same rows): residual in xv, means in xmu. */
static qva_status keep_fp32_operands(const float *q, const float *k,
                                     const float *v, int demean, qvi_head_ops *o) {
    const size_t d = (size_t)o->d;
    const int nblk = o->nk_pad / QVI_BLOCK;
    o->xq = copy_floats(q, (size_t)o->nq_pad * d);
    o->xk = copy_floats(k, (size_t)o->nk_pad * d);
    o->xv = copy_floats(v, (size_t)o->nk_pad * d);
    o->xmu = demean ? malloc((size_t)nblk * d * sizeof(float)) : NULL;
    const int vbar = o->floor_mass && !demean;
    o->xvbar = vbar ? malloc(d * sizeof(float)) : NULL;
    if (!o->xq || !o->xk || !o->xv || (demean && !o->xmu) || (vbar && !o->xvbar))
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "decomposition operands");
    if (demean) qvi_block_demean(o->xv, o->nk, o->d, nblk, o->xmu);
    if (vbar) qvi_channel_mean(v, o->nk, o->d, o->xvbar);
    return QVA_OK;
}

/* x[i][c] = code * scale of row i's group (INT8, DA2 C.3). */
static void dequant_i8(const qvi_i8 *x, int n, int d, float *dst) {
    for (int i = 0; i < n; ++i)
        for (int c = 0; c < d; ++c)
            dst[(size_t)i * d + c] =
                (float)x->codes[(size_t)i * d + c] * qvi_i8_row_scale(x, i);
}

/* x[i][c] = e4m3(code) (+ e4m3(lo), V's second digit where lo is not
 * NULL) * scale of row i's block, times the channel scale (1 but for the
 * sage8/vc8 value operand). */
static void dequant_e4m3(const uint8_t *codes, const uint8_t *lo, const float *block_scale,
                         const float *chan_scale, int n, int d, float *dst) {
    const float *lut = qvi_e4m3_lut();
    for (int i = 0; i < n; ++i)
        for (int c = 0; c < d; ++c) {
            const size_t at = (size_t)i * d + c;
            dst[at] = (lo ? lut[codes[at]] + lut[lo[at]] : lut[codes[at]]) *
                      (block_scale ? block_scale[i / QVI_BLOCK] : 1.0f) *
                      (chan_scale ? chan_scale[c] : 1.0f);
        }
}

/* x[i][c] = int8 code * channel scale (QVA_V_INT8_PV). */
static void dequant_v_int8(const uint8_t *codes, const float *chan_scale, int n, int d,
                           float *dst) {
    for (int i = 0; i < n; ++i)
        for (int c = 0; c < d; ++c)
            dst[(size_t)i * d + c] = (float)(int8_t)codes[(size_t)i * d + c] * chan_scale[c];
}

static void scale_floats(const float *x, size_t n, float g, float *dst) {
    for (size_t i = 0; i < n; ++i) dst[i] = x[i] * g;
}

/* The V-Smooth means as the method restores them, in real units: vc8
 * stores fp16(mu / scale_c) (VC App. B), vc4 fp16(mu) unscaled. */
static void dequant_means(const qvi_head_ops *o, float *mu) {
    const int d = o->d, nblk = o->nk_pad / QVI_BLOCK;
    for (int j = 0; j < nblk; ++j)
        for (int c = 0; c < d; ++c)
            mu[(size_t)j * d + c] = o->codes_kind == QVI_PATH_I8
                                        ? o->v8.mu_hat[(size_t)j * d + c] * o->v8.chan_scale[c]
                                        : o->mu4[(size_t)j * d + c];
}

/* Overwrites the FP32 operand of every bit of the mask that is on with its
 * dequantized codes; P is quantized in the engine itself (fp32_probs). */
static void dequantize_masked(qvi_head_ops *o) {
    const int d = o->d, nq = o->nq_pad, nk = o->nk_pad;
    const size_t qn = (size_t)nq * d, kn = (size_t)nk * d;
    switch (o->codes_kind) {
    case QVI_PATH_I8:
        if (o->mask & QVI_QUANT_Q) dequant_i8(&o->qi, nq, d, o->xq);
        if (o->mask & QVI_QUANT_K) dequant_i8(&o->ki, nk, d, o->xk);
        if ((o->mask & QVI_QUANT_V) && o->v_code == QVA_V_INT8_PV)
            dequant_v_int8(o->v8.codes, o->v8.chan_scale, nk, d, o->xv);
        else if (o->mask & QVI_QUANT_V)
            dequant_e4m3(o->v8.codes, o->v8.codes_lo, NULL, o->v8.chan_scale, nk, d, o->xv);
        break;
    case QVI_PATH_FP8:
        if (o->mask & QVI_QUANT_Q) dequant_e4m3(o->q8.codes, NULL, o->q8.block_scale, NULL, nq, d, o->xq);
        if (o->mask & QVI_QUANT_K) dequant_e4m3(o->k8.codes, NULL, o->k8.block_scale, NULL, nk, d, o->xk);
        if (o->mask & QVI_QUANT_V)
            dequant_e4m3(o->v8b.codes, NULL, o->v8b.block_scale, NULL, nk, d, o->xv);
        break;
    default: /* QVI_PATH_FP4: unscaled reconstructions times the tensor scale */
        if (o->mask & QVI_QUANT_Q) scale_floats(o->qf, qn, o->gq, o->xq);
        if (o->mask & QVI_QUANT_K) scale_floats(o->kf, kn, o->gk, o->xk);
        if (o->mask & QVI_QUANT_V) scale_floats(o->vf, kn, o->gv, o->xv);
        break;
    }
    if (o->xmu && (o->mask & QVI_QUANT_MU)) dequant_means(o, o->xmu);
    for (int c = 0; o->xvbar && (o->mask & QVI_QUANT_MU) && c < d; ++c)
        o->xvbar[c] = o->vbar[c] * o->v8.chan_scale[c];
}

/* Quantizes the (already smoothed / rotated / permuted) f32 operands.  Takes
 * ownership of q, k, v.  With a mask other than QVI_QUANT_ALL the head
 * runs on the FP32 engine (QVI_PATH_F32) instead of the codes. */
static qva_status quantize_ops(qva_dtype in_dtype, float *q, float *k,
                               float *v, int demean, const qvi_carried *cs, qvi_head_ops *o) {
    const int d = o->d;
    if (o->kind == QVI_PATH_16) { /* keep the rounded f32 buffers */
        round_rows16(q, (size_t)o->nq_pad * d, in_dtype);
        round_rows16(k, (size_t)o->nk_pad * d, in_dtype);
        round_rows16(v, (size_t)o->nk_pad * d, in_dtype);
        o->qf = q;
        o->kf = k;
        o->vf = v;
        return QVA_OK;
    }
    const int fp32_engine = o->mask != QVI_QUANT_ALL;
    qva_status st = fp32_engine ? keep_fp32_operands(q, k, v, demean, o) : QVA_OK;
    if (st == QVA_OK) st = quantize_codes(q, k, v, demean, cs, o);
    if (st == QVA_OK && fp32_engine) {
        o->codes_kind = o->kind;
        o->kind = QVI_PATH_F32;
        dequantize_masked(o);
    }
    free(q);
    free(k);
    free(v);
    return st;
}

static qvi_path_kind method_path(qva_method m) {
    switch (m) {
    case QVA_METHOD_FP8: return QVI_PATH_FP8;
    case QVA_METHOD_SAGE8:
    case QVA_METHOD_VC8: return QVI_PATH_I8;
    case QVA_METHOD_SAGE4:
    case QVA_METHOD_VC4: return QVI_PATH_FP4;
    default: return QVI_PATH_16;
    }
}

/* Heads are prepared in their own copies: loaded, permuted, smoothed,
 * rotated, then coded (cpu_internal.h). */
qva_status qvi_cpu_prepare_head(const qva_config *cfg, const qva_tensor *qt,
                                const qva_tensor *kt, const qva_tensor *vt, int64_t b,
                                int64_t h, int64_t hk, const int32_t *perm, int demean,
                                int mask, const qvi_carried *km, qvi_head_ops *o) {
    memset(o, 0, sizeof *o);
    o->kind = method_path(cfg->method);
    o->mask = mask;
    o->nq = (int)qt->shape[2];
    o->nk = (int)kt->shape[2];
    o->d = (int)qt->shape[3];
    o->nq_pad = qvi_cdiv(o->nq, QVI_BLOCK) * QVI_BLOCK;
    o->nk_pad = qvi_cdiv(o->nk, QVI_BLOCK) * QVI_BLOCK;
    o->expcast = cfg->expcast;
    o->sum_codes = cfg->p_sum == QVA_P_SUM_CODES;
    o->floor_mass = cfg->p_floor == QVA_P_FLOOR_MEAN;
    o->p_block = cfg->p_max == QVA_P_MAX_BLOCK && qvi_p_max_applies(cfg);
    o->v_code = cfg->v_code;
    o->q_rows_per_scale = qvi_q_rows_per_scale(cfg);
    o->use_f16 = qt->dtype == QVA_F16;
    o->strict = cfg->check_finite != 0;
    o->scale_log2 = qvi_sm_scale(cfg, o->d) * QVI_LOG2E;
    const int d = o->d;
    float *q = alloc_padded(o->nq_pad, d), *k = alloc_padded(o->nk_pad, d),
          *v = alloc_padded(o->nk_pad, d), *raw = malloc((size_t)o->nk * d * sizeof(float));
    if (!q || !k || !v || !raw) {
        free(q), free(k), free(v), free(raw);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "head buffers");
    }
    qvi_load_head(qt, b, h, q);
    qvi_load_head(vt, b, hk, raw);
    qvi_gather_rows(raw, o->nk, d, perm, v);
    qvi_load_head(kt, b, hk, raw);
    qvi_gather_rows(raw, o->nk, d, perm, k);
    free(raw);
    if (smooths_k(cfg->method)) {
        o->lse_shift = malloc((size_t)o->nq * sizeof(float));
        if (!o->lse_shift) {
            free(q), free(k), free(v);
            return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "lse shift");
        }
        float own[128];
        if (!km->kuse) qvi_channel_mean(k, o->nk, d, own);
        smooth_k(k, o->nk, q, o->nq, d, qvi_sm_scale(cfg, d), km->kuse ? km->kuse : own,
                 o->lse_shift);
        if (km->knext) memcpy(km->knext, km->kuse ? km->kuse : own, (size_t)d * sizeof(float));
    }
    float signs[128];
    if (cfg->hadamard) {
        qvi_hadamard_signs(cfg, d, signs);
        hadamard_rows(q, o->nq, d, signs);
        hadamard_rows(k, o->nk, d, signs);
    }
    qva_status st = quantize_ops(qt->dtype, q, k, v, demean, km, o);
    if (st == QVA_OK && km->knext && o->ki.codes) /* km->knext holds the mean used */
        next_k_mean(&o->ki, o->nk, d, km->knext, cfg->hadamard ? signs : NULL, km->knext);
    return st;
}
