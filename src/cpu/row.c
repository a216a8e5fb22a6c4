/*
 * The per-row online-softmax engine of the CPU reference (internal.h, "row
 * engine"): a row's running max and sum, the scores of a key block in each
 * operand format, and its PV in each format with the V-Smooth restore.
 * The dense methods (attention.c) and the draft phases (draft.c) share it.
 * docs/NUMERICS.md states every rounding and its paper equation.
 */
#include "cpu_internal.h"

#include <float.h>
#include <pthread.h>
#include <string.h>

static float e4m3_table[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;
static void e4m3_table_init(void) {
    for (int i = 0; i < 256; ++i) e4m3_table[i] = qva_e4m3_decode((uint8_t)i);
}
const float *qvi_e4m3_lut(void) {
    pthread_once(&e4m3_once, e4m3_table_init);
    return e4m3_table;
}

/* E5M2 decode table (+expcast-e5m2's P codes). */
static float e5m2_table[256];
static pthread_once_t e5m2_once = PTHREAD_ONCE_INIT;
static void e5m2_table_init(void) {
    for (int i = 0; i < 256; ++i) e5m2_table[i] = qvi_e5m2_decode((uint8_t)i);
}

const float *qvi_p_lut(int expcast) {
    if (expcast != QVA_EXPCAST_E5M2) return qvi_e4m3_lut();
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
    const float *lut = qvi_e4m3_lut();
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
    const float *plut = qvi_p_lut(expcast);
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

/* +pblock's form of qvi_probs_e4m3 (cpu_internal.h). */
float qvi_probs_e4m3_at(const float *s, float m, int nk, int expcast, int sum_codes,
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
    float rowsum = qvi_probs_e4m3_at(s, r->m, nk, expcast, sum_codes, p_block, pc,
                                     floor_mass ? &under : NULL, &w);
    if (w == 0.0f) return; /* +pblock, a block without keys: nothing to add */
    const float *lut = qvi_e4m3_lut(), *plut = qvi_p_lut(expcast);
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
