/*
 * CPU reference of the dense methods: exact, bf16, fp8, sage8, vc8, sage4,
 * vc4 (each optionally +expcast / +hadamard), and the per-row online-softmax
 * engine that the draft kernel shares.  docs/NUMERICS.md states every
 * rounding and its paper equation; the GPU is checked against this file.
 */
#include "internal.h"

#include <float.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ engine */

/* E4M3 decode table: the hot loops decode every P and V code. */
static float e4m3_table[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;
static void e4m3_table_init(void) {
    for (int i = 0; i < 256; ++i) e4m3_table[i] = qva_e4m3_decode((uint8_t)i);
}
static const float *e4m3_lut(void) {
    pthread_once(&e4m3_once, e4m3_table_init);
    return e4m3_table;
}

/* E5M2 decode table (+expcast-e5m2's P codes). */
static float e5m2_table[256];
static pthread_once_t e5m2_once = PTHREAD_ONCE_INIT;
static void e5m2_table_init(void) {
    for (int i = 0; i < 256; ++i) e5m2_table[i] = qvi_e5m2_decode((uint8_t)i);
}

/* The decode table of the P codes of an expcast mode (V's stay E4M3). */
static const float *p_lut(int expcast) {
    if (expcast != QVA_EXPCAST_E5M2) return e4m3_lut();
    pthread_once(&e5m2_once, e5m2_table_init);
    return e5m2_table;
}

void qvi_row_init(qvi_row *r, float *acc, int d) {
    r->m = -INFINITY;
    r->l = 0.0f;
    r->acc = acc;
    r->d = d;
    r->nonfinite = 0;
    r->floor = 0.0f;
    r->floor_mean = NULL;
    memset(acc, 0, (size_t)d * sizeof *acc);
}

void qvi_row_raise_max(qvi_row *r, const float *s, int nk) {
    float mx = r->m;
    int bad = 0;
    for (int j = 0; j < nk; ++j) {
        if (s[j] > mx) mx = s[j];
        bad |= !(s[j] <= FLT_MAX); /* NaN or +inf: FP32 overflow */
    }
    r->nonfinite |= bad;
    if (!(mx > r->m)) return; /* unchanged (or still no key) */
    if (r->m != -INFINITY) {
        float alpha = exp2f(r->m - mx); /* VC Eq. 1 */
        r->l *= alpha;
        r->floor *= alpha;
        for (int c = 0; c < r->d; ++c) r->acc[c] *= alpha;
    }
    r->m = mx;
}

void qvi_scores_f32(const float *q, const float *K, int nk, int d,
                    float scale_log2, float *s) {
    for (int j = 0; j < nk; ++j) {
        const float *kj = K + (size_t)j * d;
        float acc = 0.0f;
        for (int c = 0; c < d; ++c) acc += q[c] * kj[c];
        s[j] = acc * scale_log2;
    }
}

void qvi_scores_i8(const int8_t *q, float dq, const int8_t *K, float dk,
                   int nk, int d, float scale_log2, float *s) {
    const float f = (dq * dk) * scale_log2;
    for (int j = 0; j < nk; ++j) {
        const int8_t *kj = K + (size_t)j * d;
        int32_t acc = 0;
        for (int c = 0; c < d; ++c) acc += (int32_t)q[c] * (int32_t)kj[c];
        s[j] = (float)acc * f;
    }
}

void qvi_scores_e4m3(const uint8_t *q, float dq, const uint8_t *K, float dk,
                     int nk, int d, float scale_log2, float *s) {
    const float f = (dq * dk) * scale_log2;
    const float *lut = e4m3_lut();
    for (int j = 0; j < nk; ++j) {
        const uint8_t *kj = K + (size_t)j * d;
        float acc = 0.0f; /* E4M3 x E4M3 products are exact in FP32 */
        for (int c = 0; c < d; ++c) acc += lut[q[c]] * lut[kj[c]];
        s[j] = acc * f;
    }
}

void qvi_pv_16(qvi_row *r, const float *s, const float *V, int nk,
               int use_f16) {
    if (r->m == -INFINITY) return;
    const int d = r->d;
    float part[128] = {0};
    float rowsum = 0.0f;
    for (int j = 0; j < nk; ++j) {
        if (s[j] == -INFINITY) continue;
        float p = exp2f(s[j] - r->m);
        rowsum += p; /* denominator from FP32 weights */
        float pr = use_f16 ? qva_round_f16(p) : qva_round_bf16(p);
        const float *vj = V + (size_t)j * d;
        for (int c = 0; c < d; ++c) part[c] += pr * vj[c];
    }
    r->l += rowsum;
    for (int c = 0; c < d; ++c) r->acc[c] += part[c];
}

float qvi_probs_e4m3(const float *s, float m, int nk, int expcast, int sum_codes,
                     uint8_t *pcodes, float *floor) {
    const float *plut = p_lut(expcast);
    const int floor_mass = floor && (expcast == QVA_EXPCAST_PAPER || expcast == QVA_EXPCAST_CENTRED);
    const float beta_up = qvi_expcast_beta(expcast) + 8.0f * QVI_FLOOR_BINADES;
    float rowsum = 0.0f, under = 0.0f;
    for (int j = 0; j < nk; ++j) {
        if (s[j] == -INFINITY) {
            pcodes[j] = 0;
            continue;
        }
        if (expcast == QVA_EXPCAST_E5M2) { /* the same code in E5M2 (NUMERICS §7) */
            pcodes[j] = qvi_expcast_e5m2(s[j] - m, QVI_EXPCAST5_BETA);
            rowsum += plut[pcodes[j]];
        } else if (expcast) { /* VC Eq. 7; the sum uses decoded codes (Prop. 3.1) */
            pcodes[j] = qva_expcast_e4m3_beta(s[j] - m, qvi_expcast_beta(expcast));
            if (floor_mass && pcodes[j] < QVI_P_NORMAL_CODE) { /* weighed 12 binades up */
                under += plut[qva_expcast_e4m3_beta(s[j] - m, beta_up)];
                pcodes[j] = 0;
            }
            rowsum += plut[pcodes[j]];
        } else { /* exp2 with the 8.807 offset, then cast (DA2 C.3) */
            float p = exp2f((s[j] - m) + QVI_SAGE_P_OFFSET);
            pcodes[j] = qva_e4m3_encode(p);
            rowsum += sum_codes ? plut[pcodes[j]] : p; /* QVA_P_SUM_CODES: as ExpCast */
        }
    }
    if (floor) *floor = ldexpf(under, -QVI_FLOOR_BINADES);
    return rowsum;
}

/* FP16 partial accumulator of DA2 Table 6, saturating at the largest
 * finite half instead of overflowing (see docs/NUMERICS.md). */
static float round_f16_sat(float x) {
    float r = qva_round_f16(x);
    if (r > 65504.0f) return 65504.0f;
    if (r < -65504.0f) return -65504.0f;
    return r;
}

float qvi_block_max(const float *s, int nk) {
    float mb = -INFINITY;
    for (int j = 0; j < nk; ++j)
        if (s[j] > mb) mb = s[j]; /* as fmaxf: a NaN score is not the max */
    return mb;
}

/* qvi_probs_e4m3 against the row max m, or (+pblock) against the block's
 * own max m_b with the block's weight *w = exp2f(m_b - m) (1 otherwise,
 * 0 for a block without keys, whose codes are then all 0): the codes, and
 * the row sum times *w. */
static float probs_e4m3_at(const float *s, float m, int nk, int expcast, int sum_codes,
                           int p_block, uint8_t *pc, float *floor, float *w) {
    const float mb = p_block ? qvi_block_max(s, nk) : m;
    if (mb == -INFINITY) {
        memset(pc, 0, (size_t)nk);
        if (floor) *floor = 0.0f;
        *w = 0.0f;
        return 0.0f;
    }
    *w = p_block ? exp2f(mb - m) : 1.0f;
    const float rowsum = qvi_probs_e4m3(s, mb, nk, expcast, sum_codes, pc, floor);
    return p_block ? rowsum * *w : rowsum;
}

void qvi_pv_e4m3(qvi_row *r, const float *s, const uint8_t *V, const uint8_t *Vlo,
                 float vscale, const float *mu, int nk, int expcast, int sum_codes,
                 int fp16_partial, int floor_mass, int p_block) {
    if (r->m == -INFINITY) return;
    const int d = r->d;
    uint8_t pc[QVI_BLOCK];
    float part[128] = {0};
    float under = 0.0f, w;
    float rowsum = probs_e4m3_at(s, r->m, nk, expcast, sum_codes, p_block, pc,
                                 floor_mass ? &under : NULL, &w);
    if (w == 0.0f) return; /* +pblock, a block without keys: nothing to add */
    const float *lut = e4m3_lut(), *plut = p_lut(expcast);
    for (int j = 0; j < nk; ++j) {
        if (!pc[j]) continue;
        float p = plut[pc[j]];
        const uint8_t *vj = V + (size_t)j * d;
        for (int c = 0; c < d; ++c) part[c] += p * lut[vj[c]];
        if (Vlo) { /* then the second digit: per channel hi, lo for each key */
            const uint8_t *wj = Vlo + (size_t)j * d;
            for (int c = 0; c < d; ++c) part[c] += p * lut[wj[c]];
        }
    }
    if (floor_mass) { /* the floor's keys take a mean: the block's, else the head's */
        rowsum += under;
        if (!mu) r->floor += under;
    }
    r->l += rowsum;
    const float wv = w * vscale;
    for (int c = 0; c < d; ++c) {
        float pc_c = fp16_partial ? round_f16_sat(part[c]) : part[c];
        r->acc[c] += pc_c * wv;
        if (mu) r->acc[c] += rowsum * mu[c]; /* VC Eq. 6: r_ij mu_j^T */
    }
}

float qvi_probs_u8(const float *s, float m, int nk, int sum_codes, uint8_t *u, float *rowsum) {
    const float mb = qvi_block_max(s, nk);
    int32_t usum = 0;
    float esum = 0.0f;
    for (int j = 0; j < nk; ++j) {
        const float e = exp2f(s[j] - mb) * 255.0f; /* in [0, 255]; NaN for a
                                                     non-finite score */
        u[j] = e >= 0.5f ? (uint8_t)rintf(e) : 0;
        usum += u[j];
        if (!sum_codes && s[j] != -INFINITY) esum += e; /* NaN stays NaN, as in l */
    }
    const float w = mb == -INFINITY ? 0.0f : exp2f(mb - m);
    /* usum <= 128 * 255: exact.  The FP32 sum keeps the keys coded 0 in l,
     * so the row does not lose its tail (the codes' sum drops it: sharper
     * rows, docs/NUMERICS.md §3). */
    *rowsum = (sum_codes ? (float)usum : esum) * w;
    return w;
}

void qvi_pv_u8i8(qvi_row *r, const float *s, const uint8_t *V, const float *mu, int nk,
                 int sum_codes) {
    if (r->m == -INFINITY) return;
    const int d = r->d;
    uint8_t u[QVI_BLOCK];
    int32_t part[128] = {0};
    float rowsum;
    const float w = qvi_probs_u8(s, r->m, nk, sum_codes, u, &rowsum);
    for (int j = 0; j < nk; ++j) {
        if (!u[j]) continue;
        const int8_t *vj = (const int8_t *)V + (size_t)j * d;
        for (int c = 0; c < d; ++c) part[c] += (int32_t)u[j] * vj[c];
    }
    /* |partial| <= 128 * 255 * 127 < 2^24: exact in FP32 */
    r->l += rowsum;
    for (int c = 0; c < d; ++c) {
        r->acc[c] += (float)part[c] * w;
        if (mu) r->acc[c] += rowsum * mu[c]; /* VC Eq. 6 */
    }
}

void qvi_pv_nvfp4(qvi_row *r, const float *s, const float *V, float vscale,
                  const float *mu, int nk) {
    if (r->m == -INFINITY) return;
    const int d = r->d;
    float p[QVI_BLOCK];
    float part[128] = {0};
    float rowsum = 0.0f;
    for (int j = 0; j < nk; ++j) {
        p[j] = s[j] == -INFINITY ? 0.0f : exp2f(s[j] - r->m);
        rowsum += p[j]; /* denominator before the NVFP4 conversion */
    }
    for (int j = 0; j < nk; j += 16) qva_nvfp4_quantize_probs16(p + j);
    for (int j = 0; j < nk; ++j) {
        if (p[j] == 0.0f) continue;
        const float *vj = V + (size_t)j * d;
        for (int c = 0; c < d; ++c) part[c] += p[j] * vj[c];
    }
    r->l += rowsum;
    for (int c = 0; c < d; ++c) {
        r->acc[c] += part[c] * vscale;
        if (mu) r->acc[c] += rowsum * mu[c];
    }
}

float qvi_row_finish(const qvi_row *r, int flags, const float *chan_scale,
                     float log2_amp, float *out) {
    if (!(isfinite(r->m) && r->l > 0.0f && isfinite(r->l)) ||
        ((flags & QVI_ROW_STRICT) && r->nonfinite)) {
        /* no retained key: zeros, LSE -inf; otherwise the arithmetic broke
         * (an overflowed score, a NaN): NaN, never a quiet zero */
        const int empty = !(flags & QVI_ROW_RETAINED);
        for (int c = 0; c < r->d; ++c) out[c] = empty ? 0.0f : NAN;
        return empty ? -INFINITY : NAN;
    }
    for (int c = 0; c < r->d; ++c) {
        const float a = r->floor_mean ? r->acc[c] + r->floor * r->floor_mean[c] : r->acc[c];
        out[c] = (a * (chan_scale ? chan_scale[c] : 1.0f)) / r->l;
    }
    return (r->m + log2f(r->l) - log2_amp) * 0.69314718055994531f;
}

/* ================================================================ operands */

void qvi_v8_free(qvi_v8 *x) {
    free(x->codes);
    free(x->codes_lo);
    free(x->chan_scale);
    free(x->mu_hat);
    memset(x, 0, sizeof *x);
}

/* Rows of v gathered by perm into dst[n_pad*d] (pad rows zero). */
static void gather_rows(const float *v, int n, int d, const int32_t *perm,
                        float *dst) {
    for (int i = 0; i < n; ++i)
        memcpy(dst + (size_t)i * d, v + (size_t)(perm ? perm[i] : i) * d,
               (size_t)d * sizeof *dst);
}

/* Block means over the valid rows (qvi_block_mean) and the residual in place. */
static void block_demean(float *x, int n, int d, int nblk, float *mu) {
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
    gather_rows(v, n, d, perm, x);
    if (demean) block_demean(x, n, d, out->nblk, out->mu_hat);
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

/* ================================================================ methods */

/* PATH_F32: the decomposition's FP32 engine (qvi_quant_mask other than
 * QVI_QUANT_ALL): every operand in FP32, dequantized where its bit is on. */
typedef enum path_kind { PATH_16, PATH_FP8, PATH_I8, PATH_FP4, PATH_F32 } path_kind;

/* One head's prepared operands. Q rows and K/V rows padded to QVI_BLOCK. */
typedef struct head_ops {
    path_kind kind;
    int nq, nk, nq_pad, nk_pad, d;
    int expcast;
    int sum_codes;         /* cfg->p_sum == QVA_P_SUM_CODES              */
    int floor_mass;        /* cfg->p_floor == QVA_P_FLOOR_MEAN           */
    int p_block;           /* cfg->p_max == QVA_P_MAX_BLOCK              */
    float *vbar;           /* +floormass without demeaning: fp16(mean of V
                              / scale_c) (PATH_I8), else NULL            */
    qva_v_code v_code;     /* PATH_I8: V's code (cfg->v_code)            */
    int use_f16;           /* 16-bit path in FP16 (f16 inputs), else BF16 */
    int strict;            /* check_finite: a NaN/+inf score fails the row */
    float scale_log2;
    float *qf, *kf, *vf;   /* PATH_16 (rounded) and PATH_FP4 (unscaled) */
    float gq, gk, gv;      /* NVFP4 tensor scales                      */
    float *mu4;            /* vc4 block means (FP16-rounded), or NULL  */
    qvi_i8 qi, ki;         /* PATH_I8                                  */
    int q_rows_per_scale;  /* PATH_I8: 1 or QVI_BLOCK (qva_q_granularity) */
    qvi_f8 q8, k8, v8b;    /* PATH_FP8                                 */
    qvi_v8 v8;             /* PATH_I8 values                           */
    float *lse_shift;      /* nq: LSE correction of K smoothing, or NULL */
    int mask;              /* qvi_quant_mask of the call                */
    path_kind codes_kind;  /* PATH_F32: the method's own path (its P)  */
    float *xq, *xk, *xv;   /* PATH_F32 operands (V: the residual for vc) */
    float *xmu;            /* PATH_F32 V-Smooth means, real units, or NULL */
    float *xvbar;          /* PATH_F32 vbar in real units, or NULL       */
} head_ops;

static void head_ops_free(head_ops *o) {
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

static int is_vsmooth(qva_method m) {
    return m == QVA_METHOD_VC8 || m == QVA_METHOD_VC4;
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

/* What a layer's calls carry to its next call, for one head: +kprev's K
 * means and +vprev's V channel scales.  use: the previous call's (NULL:
 * this call's own); next: where this call's go (NULL: not wanted). */
typedef struct carried {
    const float *kuse, *vuse;
    float *knext, *vnext;
    int v_blocks; /* +vsample: demeaning steps' scales from sampled blocks */
} carried;

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

/* Decides this call's permutation for a V-Smooth method: runs k-means on a
 * grouping step (or when no usable permutation is stored) and reports
 * whether to demean (steps inside the window).  VC §3.4, App. A.  The
 * state is K/V head (b, hk)'s: its query heads share the permutation. */
static qva_status vsmooth_perm(qva_context_t *ctx, const qva_config *cfg,
                               int64_t b, int64_t hk, const float *v, int n,
                               int d, const int32_t **perm, int *demean) {
    qva_step_action act = qva_schedule_action(&cfg->vsmooth, cfg->step, cfg->num_steps);
    qvi_vs_state *st = qvi_context_vs_state(ctx, cfg->layer, b, hk);
    if (!st) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "v-smooth state");
    const int k = cfg->vsmooth.clusters;
    int usable = st->perm && st->n == n && st->d == d && st->k == k;
    if (act == QVA_STEP_GROUP || !usable) {
        int warm = usable && cfg->vsmooth.warm_start;
        if (!usable) {
            free(st->perm);
            free(st->centroids);
            st->perm = malloc((size_t)n * sizeof *st->perm);
            st->centroids = malloc((size_t)k * d * sizeof *st->centroids);
            st->n = n;
            st->d = d;
            st->k = k;
        }
        int32_t *labels = malloc((size_t)n * sizeof *labels);
        if (!st->perm || !st->centroids || !labels) {
            free(labels);
            free(st->perm);
            free(st->centroids);
            st->perm = NULL;
            st->centroids = NULL;
            return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "v-smooth permutation");
        }
        qvi_kmeans(v, n, d, k, cfg->vsmooth.iters, warm, st->centroids, labels);
        qvi_stable_argsort_labels(labels, n, k, st->perm);
        free(labels);
        st->last_group_step = cfg->step;
    }
    *perm = st->perm;
    *demean = act != QVA_STEP_PLAIN;
    return QVA_OK;
}

static float *alloc_padded(int n_pad, int d) {
    return calloc((size_t)n_pad * d, sizeof(float));
}

/* NVFP4 operands of sage4/vc4; vc4 first demeans V (means added unscaled
 * at 4 bits, VC App. B). Takes ownership of nothing. */
static qva_status quantize_fp4(float *q, float *k, float *v, int demean,
                               head_ops *o) {
    const int d = o->d, nblk = o->nk_pad / QVI_BLOCK;
    if (demean) {
        o->mu4 = malloc((size_t)nblk * d * sizeof(float));
        if (!o->mu4) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "vc4 means");
        block_demean(v, o->nk, d, nblk, o->mu4);
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
static qva_status head_mean_hat(const float *v, head_ops *o) {
    o->vbar = malloc((size_t)o->d * sizeof(float));
    if (!o->vbar) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "mean of V");
    qvi_channel_mean(v, o->nk, o->d, o->vbar);
    for (int c = 0; c < o->d; ++c) o->vbar[c] = qva_round_f16(o->vbar[c] / o->v8.chan_scale[c]);
    return QVA_OK;
}

/* The 8- and 4-bit codes of the (already smoothed / rotated / permuted)
 * f32 operands. */
static qva_status quantize_codes(float *q, float *k, float *v, int demean,
                                 const carried *cs, head_ops *o) {
    const int d = o->d;
    if (o->kind == PATH_FP8) {
        qvi_quant_e4m3_blocks(q, o->nq_pad, d, &o->q8);
        qvi_quant_e4m3_blocks(k, o->nk_pad, d, &o->k8);
        qvi_quant_e4m3_blocks(v, o->nk_pad, d, &o->v8b);
        if (!o->q8.codes || !o->k8.codes || !o->v8b.codes)
            return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "fp8 operands");
        return QVA_OK;
    }
    if (o->kind == PATH_I8) {
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
                                     const float *v, int demean, head_ops *o) {
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
    if (demean) block_demean(o->xv, o->nk, o->d, nblk, o->xmu);
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
    const float *lut = e4m3_lut();
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
static void dequant_means(const head_ops *o, float *mu) {
    const int d = o->d, nblk = o->nk_pad / QVI_BLOCK;
    for (int j = 0; j < nblk; ++j)
        for (int c = 0; c < d; ++c)
            mu[(size_t)j * d + c] = o->codes_kind == PATH_I8
                                        ? o->v8.mu_hat[(size_t)j * d + c] * o->v8.chan_scale[c]
                                        : o->mu4[(size_t)j * d + c];
}

/* Overwrites the FP32 operand of every bit of the mask that is on with its
 * dequantized codes; P is quantized in the engine itself (fp32_probs). */
static void dequantize_masked(head_ops *o) {
    const int d = o->d, nq = o->nq_pad, nk = o->nk_pad;
    const size_t qn = (size_t)nq * d, kn = (size_t)nk * d;
    switch (o->codes_kind) {
    case PATH_I8:
        if (o->mask & QVI_QUANT_Q) dequant_i8(&o->qi, nq, d, o->xq);
        if (o->mask & QVI_QUANT_K) dequant_i8(&o->ki, nk, d, o->xk);
        if ((o->mask & QVI_QUANT_V) && o->v_code == QVA_V_INT8_PV)
            dequant_v_int8(o->v8.codes, o->v8.chan_scale, nk, d, o->xv);
        else if (o->mask & QVI_QUANT_V)
            dequant_e4m3(o->v8.codes, o->v8.codes_lo, NULL, o->v8.chan_scale, nk, d, o->xv);
        break;
    case PATH_FP8:
        if (o->mask & QVI_QUANT_Q) dequant_e4m3(o->q8.codes, NULL, o->q8.block_scale, NULL, nq, d, o->xq);
        if (o->mask & QVI_QUANT_K) dequant_e4m3(o->k8.codes, NULL, o->k8.block_scale, NULL, nk, d, o->xk);
        if (o->mask & QVI_QUANT_V)
            dequant_e4m3(o->v8b.codes, NULL, o->v8b.block_scale, NULL, nk, d, o->xv);
        break;
    default: /* PATH_FP4: unscaled reconstructions times the tensor scale */
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
 * runs on the FP32 engine (PATH_F32) instead of the codes. */
static qva_status quantize_ops(qva_dtype in_dtype, float *q, float *k,
                               float *v, int demean, const carried *cs, head_ops *o) {
    const int d = o->d;
    if (o->kind == PATH_16) { /* keep the rounded f32 buffers */
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
        o->kind = PATH_F32;
        dequantize_masked(o);
    }
    free(q);
    free(k);
    free(v);
    return st;
}

static path_kind method_path(qva_method m) {
    switch (m) {
    case QVA_METHOD_FP8: return PATH_FP8;
    case QVA_METHOD_SAGE8:
    case QVA_METHOD_VC8: return PATH_I8;
    case QVA_METHOD_SAGE4:
    case QVA_METHOD_VC4: return PATH_FP4;
    default: return PATH_16;
    }
}

/* Loads, permutes (perm: the V-Smooth order of the head's K/V, or NULL),
 * smooths, rotates and quantizes query head (b, h), which reads K/V head
 * (b, hk). */
static qva_status prepare_head(const qva_config *cfg, const qva_tensor *qt,
                               const qva_tensor *kt, const qva_tensor *vt, int64_t b,
                               int64_t h, int64_t hk, const int32_t *perm, int demean,
                               int mask, const carried *km, head_ops *o) {
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
    gather_rows(raw, o->nk, d, perm, v);
    qvi_load_head(kt, b, hk, raw);
    gather_rows(raw, o->nk, d, perm, k);
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

/* Scores of query row i against key block j; invalid keys -> -INFINITY. */
static void block_scores(const head_ops *o, int i, int j, float *s) {
    const int d = o->d, qb = i / QVI_BLOCK;
    const size_t qo = (size_t)i * d, ko = (size_t)j * QVI_BLOCK * d;
    switch (o->kind) {
    case PATH_16:
        qvi_scores_f32(o->qf + qo, o->kf + ko, QVI_BLOCK, d, o->scale_log2, s);
        break;
    case PATH_FP4:
        qvi_scores_f32(o->qf + qo, o->kf + ko, QVI_BLOCK, d,
                       (o->gq * o->gk) * o->scale_log2, s);
        break;
    case PATH_I8:
        qvi_scores_i8(o->qi.codes + qo, qvi_i8_row_scale(&o->qi, i), o->ki.codes + ko,
                      o->ki.scale[j], QVI_BLOCK, d, o->scale_log2, s);
        break;
    case PATH_FP8:
        qvi_scores_e4m3(o->q8.codes + qo, o->q8.block_scale[qb],
                        o->k8.codes + ko, o->k8.block_scale[j], QVI_BLOCK, d,
                        o->scale_log2, s);
        break;
    case PATH_F32:
        qvi_scores_f32(o->xq + qo, o->xk + ko, QVI_BLOCK, d, o->scale_log2, s);
        break;
    }
    for (int t = o->nk - j * QVI_BLOCK; t < QVI_BLOCK; ++t) s[t] = -INFINITY;
}

/* Probabilities of one key block on the FP32 engine into p; returns the
 * row sum that enters l and the V-Smooth restore.  P quantized: the
 * method's own codes (qvi_probs_e4m3, or NVFP4 after an FP32 row sum, as
 * qvi_pv_nvfp4); otherwise FP32 exp2(s - m) and their FP32 sum. */
static float fp32_probs(const head_ops *o, const float *s, float m, float *p, float *under) {
    *under = 0.0f;
    const int quant = (o->mask & QVI_QUANT_P) != 0;
    if (quant && o->codes_kind == PATH_I8 && o->v_code == QVA_V_INT8_PV) {
        uint8_t u[QVI_BLOCK];
        float rowsum;
        const float w = qvi_probs_u8(s, m, QVI_BLOCK, o->sum_codes, u, &rowsum);
        for (int j = 0; j < QVI_BLOCK; ++j) p[j] = (float)u[j] * w;
        return rowsum;
    }
    if (quant && o->codes_kind != PATH_FP4) {
        uint8_t pc[QVI_BLOCK];
        float w; /* as qvi_pv_e4m3 */
        const float rowsum = probs_e4m3_at(s, m, QVI_BLOCK, o->expcast, o->sum_codes,
                                           o->p_block, pc, o->floor_mass ? under : NULL, &w);
        const float *plut = p_lut(o->expcast);
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
static void fp32_pv(const head_ops *o, qvi_row *r, int j, const float *s) {
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

static void block_pv(const head_ops *o, qvi_row *r, int j, const float *s) {
    const size_t vo = (size_t)j * QVI_BLOCK * o->d;
    switch (o->kind) {
    case PATH_16: qvi_pv_16(r, s, o->vf + vo, QVI_BLOCK, o->use_f16); break;
    case PATH_FP4:
        qvi_pv_nvfp4(r, s, o->vf + vo, o->gv,
                     o->mu4 ? o->mu4 + (size_t)j * o->d : NULL, QVI_BLOCK);
        break;
    case PATH_I8:
        if (o->v_code == QVA_V_INT8_PV)
            qvi_pv_u8i8(r, s, o->v8.codes + vo,
                        o->v8.mu_hat ? o->v8.mu_hat + (size_t)j * o->d : NULL, QVI_BLOCK,
                        o->sum_codes);
        else
            qvi_pv_e4m3(r, s, o->v8.codes + vo, o->v8.codes_lo ? o->v8.codes_lo + vo : NULL,
                        1.0f, o->v8.mu_hat ? o->v8.mu_hat + (size_t)j * o->d : NULL,
                        QVI_BLOCK, o->expcast, o->sum_codes, 0, o->floor_mass, o->p_block);
        break;
    case PATH_FP8:
        qvi_pv_e4m3(r, s, o->v8b.codes + vo, NULL, o->v8b.block_scale[j], NULL,
                    QVI_BLOCK, o->expcast, o->sum_codes, 0, 0, 0);
        break;
    case PATH_F32: fp32_pv(o, r, j, s); break;
    }
}

static float path_log2_amp(const head_ops *o) {
    const path_kind p_kind = o->kind == PATH_F32 && (o->mask & QVI_QUANT_P) ? o->codes_kind
                                                                              : o->kind;
    if (p_kind == PATH_I8 && o->v_code == QVA_V_INT8_PV) return QVI_U8_LOG2_AMP;
    if (p_kind == PATH_I8 || p_kind == PATH_FP8)
        return qvi_p_log2_amp(o->expcast);
    return 0.0f;
}

/* The online recurrence of one query row over every key block. */
static float run_row(const head_ops *o, int i, float *out) {
    float acc[128], s[QVI_BLOCK];
    qvi_row r;
    qvi_row_init(&r, acc, o->d);
    r.floor_mean = o->kind == PATH_F32 ? o->xvbar : o->vbar;
    const int nblk = o->nk_pad / QVI_BLOCK;
    for (int j = 0; j < nblk; ++j) {
        block_scores(o, i, j, s);
        qvi_row_raise_max(&r, s, QVI_BLOCK);
        block_pv(o, &r, j, s);
    }
    const float *cs = o->kind == PATH_I8 ? o->v8.chan_scale : NULL;
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
                                 int mask, const carried *km, float *ob, float *lb) {
    head_ops o;
    qva_status st = prepare_head(cfg, qt, kt, vt, b, h, hk, perm, demean, mask, km, &o);
    if (st == QVA_OK) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < o.nq; ++i) {
            lb[i] = run_row(&o, i, ob + (size_t)i * o.d);
            if (o.lse_shift) lb[i] += o.lse_shift[i]; /* -inf stays -inf */
        }
    }
    head_ops_free(&o);
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

/* The V-Smooth permutation and demeaning of K/V head (b, hk) for this
 * call (perm NULL and no demeaning for the other methods). */
static qva_status kv_head_order(qva_context_t *ctx, const qva_config *cfg,
                                const qva_tensor *vt, int64_t b, int64_t hk,
                                const int32_t **perm, int *demean) {
    *perm = NULL;
    *demean = 0;
    if (!is_vsmooth(cfg->method)) return QVA_OK;
    const int nk = (int)vt->shape[2], d = (int)vt->shape[3];
    float *raw = malloc((size_t)nk * d * sizeof *raw);
    if (!raw) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "value head buffer");
    qvi_load_head(vt, b, hk, raw);
    qva_status st = vsmooth_perm(ctx, cfg, b, hk, raw, nk, d, perm, demean);
    free(raw);
    return st;
}

/* What the layer's previous call left for K/V head (b, hk): under +kprev
 * its K mean, under +vprev its V scales (into kuse / vuse where the state
 * holds d channels of it; else that use stays NULL: this call's own), and
 * where this call's go.  A call of another shape has already cleared the
 * layer's (qvi_context_carry_shape).  Nothing for other configs and
 * stateless calls (QVA_LAYER_NONE). */
static qva_status carried_of(qva_context_t *ctx, const qva_config *cfg, int64_t b, int64_t hk,
                             int d, float (*buf)[128], carried *cs) {
    memset(cs, 0, sizeof *cs);
    const int kp = cfg->k_mean == QVA_K_MEAN_PREVIOUS, vp = cfg->v_scale == QVA_V_SCALE_PREVIOUS;
    if (!(kp || vp) || cfg->layer == QVA_LAYER_NONE) return QVA_OK;
    const qvi_vs_state *st = qvi_context_vs_state(ctx, cfg->layer, b, hk);
    if (!st) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "layer state");
    if (kp && st->kmean_d == d) cs->kuse = memcpy(buf[0], st->kmean, (size_t)d * sizeof(float));
    if (vp && st->vscale_d == d) cs->vuse = memcpy(buf[1], st->vscale, (size_t)d * sizeof(float));
    if (kp) cs->knext = buf[2];
    if (vp) cs->vnext = buf[3];
    return QVA_OK;
}

/* Keeps x (d channels) for the layer's next call, or nothing when it is not
 * finite (a non-finite K or V): that call then uses its own, so one bad
 * call's NaN does not reach the calls after it. */
static void keep_finite(float *dst, int *dst_d, const float *x, int d) {
    *dst_d = d;
    for (int c = 0; c < d; ++c) {
        if (!isfinite(x[c])) *dst_d = 0;
        dst[c] = x[c];
    }
}

void qvi_v_sample_scales(const float *x, int n, int d, float *scale) {
    const int m = (int)QVA_STAT_COUNT(n);
    for (int c = 0; c < d; ++c) {
        float amax = 0.0f;
        for (int i = 0; i < m; ++i) amax = fmaxf(amax, fabsf(x[(size_t)QVA_STAT_ROW(i, n) * d + c]));
        scale[c] = scale_of_extremes(amax, 0.0f, QVI_V_E4M3_RANGE);
    }
}

/* +ksample / +vsample: this call's statistics of K/V head (b, hk) over
 * its sampled tokens (QVA_STAT_ROW, in the caller's token order): K's
 * channel mean (FP64 sums of QVA_STAT_CHUNK rows in sample order, summed
 * in chunk order, divided by the count, rounded to float: a device sums
 * the chunks side by side) and V's channel scales (qvi_v_sample_scales),
 * into kuse / vuse as if carried.  Nothing is kept for a next call. */
static qva_status sampled_of(const qva_config *cfg, const qva_tensor *k, const qva_tensor *v,
                             int64_t b, int64_t hk, float (*buf)[128], carried *cs) {
    const int ks = cfg->k_mean == QVA_K_MEAN_SAMPLE, vs = cfg->v_scale == QVA_V_SCALE_SAMPLE;
    if (!ks && !vs) return QVA_OK;
    const int n = (int)k->shape[2], d = (int)k->shape[3], m = (int)QVA_STAT_COUNT(n);
    float *raw = malloc((size_t)n * d * sizeof *raw);
    if (!raw) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "sampled statistics");
    if (ks) {
        qvi_load_head(k, b, hk, raw);
        for (int c = 0; c < d; ++c) {
            double s = 0.0;
            for (int i0 = 0; i0 < m; i0 += QVA_STAT_CHUNK) {
                double part = 0.0;
                for (int i = i0; i < m && i < i0 + QVA_STAT_CHUNK; ++i)
                    part += raw[(size_t)QVA_STAT_ROW(i, n) * d + c];
                s += part;
            }
            buf[0][c] = (float)(s / (double)m);
        }
        cs->kuse = buf[0];
    }
    if (vs) {
        qvi_load_head(v, b, hk, raw);
        qvi_v_sample_scales(raw, n, d, buf[1]);
        cs->vuse = buf[1];
        cs->v_blocks = 1;
    }
    free(raw);
    return QVA_OK;
}

static qva_status carried_store(qva_context_t *ctx, const qva_config *cfg, int64_t b, int64_t hk,
                                int d, const int64_t shape[3], const carried *cs) {
    qvi_vs_state *st = qvi_context_vs_state(ctx, cfg->layer, b, hk);
    if (!st) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "layer state");
    memcpy(st->carry_shape, shape, sizeof st->carry_shape); /* a new entry's */
    if (cs->knext) keep_finite(st->kmean, &st->kmean_d, cs->knext, d);
    if (cs->vnext) keep_finite(st->vscale, &st->vscale_d, cs->vnext, d);
    return QVA_OK;
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
    carried cs = {NULL, NULL, NULL, NULL, 0};
    const int64_t shape[3] = {q->shape[0], q->shape[1], k->shape[1]};
    if ((cfg->k_mean == QVA_K_MEAN_PREVIOUS || cfg->v_scale == QVA_V_SCALE_PREVIOUS) &&
        cfg->layer != QVA_LAYER_NONE)
        qvi_context_carry_shape(ctx, cfg->layer, shape);
    for (int64_t b = 0; b < q->shape[0] && st == QVA_OK; ++b)
        for (int64_t h = 0; h < q->shape[1] && st == QVA_OK; ++h) {
            const int64_t hk = h / group;
            if (h % group == 0 &&
                ((st = kv_head_order(ctx, cfg, v, b, hk, &perm, &demean)) != QVA_OK ||
                 (st = carried_of(ctx, cfg, b, hk, (int)d, buf, &cs)) != QVA_OK ||
                 (st = sampled_of(cfg, k, v, b, hk, buf, &cs)) != QVA_OK))
                break;
            /* the group's heads use one carried set; the last leaves the next */
            const int last = h % group == group - 1;
            const carried hcs = {cs.kuse, cs.vuse, last ? cs.knext : NULL, last ? cs.vnext : NULL,
                                 cs.v_blocks};
            st = cfg->method == QVA_METHOD_EXACT
                     ? exact_head(cfg, q, k, v, b, h, hk, ob, lb)
                     : quantized_head(cfg, q, k, v, b, h, hk, perm, demean, mask, &hcs, ob, lb);
            if (st == QVA_OK && (hcs.knext || hcs.vnext))
                st = carried_store(ctx, cfg, b, hk, (int)d, shape, &hcs);
            if (st == QVA_OK && cfg->check_finite)
                st = qvi_check_rows(ob, lse ? lb : NULL, nq, (int)d, b, h);
            if (st != QVA_OK) break;
            qvi_store_head(out, b, h, ob);
            if (lse) store_lse(lse, b, h, lb, nq);
        }
    free(ob), free(lb);
    return st;
}
