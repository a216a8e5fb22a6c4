/*
 * The value operand of sage8 / vc8 (qvi_v8): V gathered in the V-Smooth
 * order, block means subtracted on demeaning steps (VC Eq. 6, App. B),
 * per-channel scales (this call's, +vprev's carried ones, or +vsample's
 * from sampled blocks) and the codes: one or two E4M3 digits, or INT8.
 */
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

void qvi_v8_free(qvi_v8 *x) {
    free(x->codes);
    free(x->codes_lo);
    free(x->chan_scale);
    free(x->mu_hat);
    memset(x, 0, sizeof *x);
}

void qvi_gather_rows(const float *v, int n, int d, const int32_t *perm,
                     float *dst) {
    for (int i = 0; i < n; ++i)
        memcpy(dst + (size_t)i * d, v + (size_t)(perm ? perm[i] : i) * d,
               (size_t)d * sizeof *dst);
}

void qvi_block_demean(float *x, int n, int d, int nblk, float *mu) {
    for (int j = 0; j < nblk; ++j) {
        int r0 = j * QVI_BLOCK, r1 = r0 + QVI_BLOCK < n ? r0 + QVI_BLOCK : n;
        for (int c = 0; c < d; ++c) {
            const float m = qvi_block_mean(x, n, d, r0, c);
            mu[(size_t)j * d + c] = m;
            for (int i = r0; i < r1; ++i) x[(size_t)i * d + c] -= m;
        }
    }
}

/* Channel c's largest |x| over rows [r0, r1) and largest |mu| over blocks
 * [j0, j1) (mu NULL: 0), into *amax and *mmax as running maxima (fmaxf:
 * NaN skipped, any order the same bits). */
static void channel_extremes(const float *x, int r0, int r1, int d, int c, const float *mu,
                             int j0, int j1, float *amax, float *mmax) {
    for (int i = r0; i < r1; ++i) *amax = fmaxf(*amax, fabsf(x[(size_t)i * d + c]));
    for (int j = j0; mu && j < j1; ++j) *mmax = fmaxf(*mmax, fabsf(mu[(size_t)j * d + c]));
}

/* amax/range, raised where needed so that the stored mean/scale fits FP16
 * with margin; 1 for an all-zero channel. */
static float scale_of_extremes(float amax, float mmax, float range) {
    const float s = fmaxf(amax / range, mmax / 32768.0f);
    return s > 0.0f ? s : 1.0f;
}

/* Per-channel scale amax/range (DA2 C.3: 2.25 for E4M3; 127 for INT8):
 * scale_of_extremes over every row and block mean. */
static float v_channel_scale(const float *x, int n, int d, int c,
                             const float *mu, int nblk, float range) {
    float amax = 0.0f, mmax = 0.0f;
    channel_extremes(x, 0, n, d, c, mu, 0, nblk, &amax, &mmax);
    return scale_of_extremes(amax, mmax, range);
}

/* INT8 code of x = value / scale, |x| <= 127 by the scale's choice; the
 * CUDA preparation's expression (a NaN value codes -127, as fmaxf gives,
 * where a plain comparison would leave NaN for an undefined cast). */
static uint8_t v_int8_code(float x) {
    return (uint8_t)(int8_t)fminf(fmaxf(rintf(x), -127.0f), 127.0f);
}

/* +vprev: whether the carried scales `use` serve this call's values x:
 * every channel's amax (fmaxf's: NaN skipped, as v_channel_scale's) over
 * its carried scale within E4M3's 448, so that every code is (the
 * quotient is monotone in |x|) and the carried scale changes nothing but
 * where the codes sit in E4M3's range.  One decision per head, from the
 * amax a device makes on the way. */
static int carried_scales_serve(const float *x, int n, int d, const float *use) {
    for (int c = 0; c < d; ++c) {
        float amax = 0.0f, mmax = 0.0f;
        channel_extremes(x, 0, n, d, c, NULL, 0, 0, &amax, &mmax);
        if (!(use[c] > 0.0f) || !isfinite(use[c]) || !(amax / use[c] <= 448.0f)) return 0;
    }
    return 1;
}

/* +vsample on a demeaning step: scale_of_extremes over the rows of the
 * QVA_STAT_BLOCK blocks of the residual x (n rows) and their means mu. */
static void sampled_block_scales(const float *x, int n, int d, const float *mu, int nblk,
                                 float *scale) {
    for (int c = 0; c < d; ++c) {
        float amax = 0.0f, mmax = 0.0f;
        for (int64_t i = 0; i < QVA_STAT_BLOCKS(nblk); ++i) {
            const int j = (int)QVA_STAT_BLOCK(i, nblk);
            const int r1 = (j + 1) * QVI_BLOCK < n ? (j + 1) * QVI_BLOCK : n;
            channel_extremes(x, j * QVI_BLOCK, r1, d, c, mu, j, j + 1, &amax, &mmax);
        }
        scale[c] = scale_of_extremes(amax, mmax, QVI_V_E4M3_RANGE);
    }
}

/* Whether the sampled scales `use` serve the whole residual x: every
 * channel's amax / scale <= 448 and every |mean| / scale <= 32768 (the
 * bounds the own scale keeps; the quotients are monotone). */
static int sampled_block_scales_serve(const float *x, int n, int d, const float *mu, int nblk,
                                      const float *use) {
    for (int c = 0; c < d; ++c) {
        float amax = 0.0f, mmax = 0.0f;
        channel_extremes(x, 0, n, d, c, mu, 0, nblk, &amax, &mmax);
        if (!isfinite(use[c]) || !(amax / use[c] <= 448.0f) || !(mmax / use[c] <= 32768.0f))
            return 0;
    }
    return 1;
}

qva_status qvi_v8_prepare(const float *v, int n, int d, const int32_t *perm,
                          int demean, qva_v_code code, qvi_v8 *out) {
    return qvi_v8_prepare_carried(v, n, d, perm, demean, code, NULL, 0, NULL, out);
}

qva_status qvi_v8_prepare_carried(const float *v, int n, int d, const int32_t *perm, int demean,
                                  qva_v_code code, const float *use, int sample_blocks,
                                  float *next, qvi_v8 *out) {
    const int digits = code == QVA_V_E4M3X2 ? 2 : 1, int8 = code == QVA_V_INT8_PV;
    memset(out, 0, sizeof *out);
    out->n = n;
    out->d = d;
    out->nblk = qvi_cdiv(n, QVI_BLOCK);
    out->n_pad = out->nblk * QVI_BLOCK;
    float *x = calloc((size_t)out->n_pad * d, sizeof *x);
    out->codes = calloc((size_t)out->n_pad * d, 1);
    out->codes_lo = digits == 2 ? calloc((size_t)out->n_pad * d, 1) : NULL;
    out->chan_scale = malloc((size_t)d * sizeof(float));
    out->mu_hat = demean ? malloc((size_t)out->nblk * d * sizeof(float)) : NULL;
    if (!x || !out->codes || !out->chan_scale || (demean && !out->mu_hat) ||
        (digits == 2 && !out->codes_lo)) {
        free(x);
        qvi_v8_free(out);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "value operand buffers");
    }
    qvi_gather_rows(v, n, d, perm, x);
    if (demean) qvi_block_demean(x, n, d, out->nblk, out->mu_hat);
    for (int c = 0; c < d; ++c)
        out->chan_scale[c] = v_channel_scale(x, n, d, c, out->mu_hat, out->nblk,
                                             int8 ? 127.0f : QVI_V_E4M3_RANGE);
    if (next) memcpy(next, out->chan_scale, (size_t)d * sizeof(float));
    /* carried scales: not on demeaning steps, which read V for its block
     * means anyway; sampled blocks: there, so that a device reads V once */
    if (use && !demean && carried_scales_serve(x, n, d, use))
        memcpy(out->chan_scale, use, (size_t)d * sizeof(float));
    if (sample_blocks && demean && code == QVA_V_E4M3) {
        float su[128];
        sampled_block_scales(x, n, d, out->mu_hat, out->nblk, su);
        if (sampled_block_scales_serve(x, n, d, out->mu_hat, out->nblk, su))
            memcpy(out->chan_scale, su, (size_t)d * sizeof(float));
    }
    for (int c = 0; c < d; ++c) {
        const float sc = out->chan_scale[c];
        for (int i = 0; i < n; ++i) {
            const float xs = x[(size_t)i * d + c] / sc;
            const uint8_t hi = int8 ? v_int8_code(xs) : qva_e4m3_encode(xs);
            out->codes[(size_t)i * d + c] = hi;
            /* the residual in the same units: |xs - hi| <= half of hi's step */
            if (out->codes_lo)
                out->codes_lo[(size_t)i * d + c] = qva_e4m3_encode(xs - qva_e4m3_decode(hi));
        }
        for (int j = 0; demean && j < out->nblk; ++j) /* App. B: mean / scale */
            out->mu_hat[(size_t)j * d + c] =
                qva_round_f16(out->mu_hat[(size_t)j * d + c] / sc);
    }
    free(x);
    return QVA_OK;
}

void qvi_v_sample_scales(const float *x, int n, int d, float *scale) {
    const int m = (int)QVA_STAT_COUNT(n);
    for (int c = 0; c < d; ++c) {
        float amax = 0.0f;
        for (int i = 0; i < m; ++i) amax = fmaxf(amax, fabsf(x[(size_t)QVA_STAT_ROW(i, n) * d + c]));
        scale[c] = scale_of_extremes(amax, 0.0f, QVI_V_E4M3_RANGE);
    }
}
