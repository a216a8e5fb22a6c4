/*
 * Error metrics and the value/probability statistics of the papers:
 * qva_compare (output fidelity), qva_vquant_stats_compute (VC Table 1 and
 * Eq. 5) and qva_expcast_tv (VC Proposition 3.1's total variation).
 *
 * All sums are FP64.  A non-finite output can never score well: it gets
 * the worst value of every metric (see qva_compare).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ compare */
typedef struct cmp_sums {
    double err2, ref2, out2, dot, max_abs, rmin, rmax;
    int bad; /* a NaN or Inf in out or ref */
} cmp_sums;

static void cmp_accumulate(const float *out, const float *ref, size_t n,
                           cmp_sums *s) {
    memset(s, 0, sizeof *s);
    s->rmin = INFINITY;
    s->rmax = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
        double o = out[i], r = ref[i], e = o - r;
        if (!isfinite(o) || !isfinite(r)) {
            s->bad = 1;
            continue;
        }
        s->err2 += e * e;
        s->ref2 += r * r;
        s->out2 += o * o;
        s->dot += o * r;
        if (fabs(e) > s->max_abs) s->max_abs = fabs(e);
        if (r < s->rmin) s->rmin = r;
        if (r > s->rmax) s->rmax = r;
    }
}

/* Worst value of each metric: +INF for the lower-is-better ones and -INF
 * for the higher-is-better ones, so that no comparison in either direction
 * can make the result look good (a NaN would fail "x > bad" tests). */
static void cmp_worst(qva_error_metrics *m) {
    m->rel_l2 = INFINITY;
    m->max_abs = INFINITY;
    m->cos_sim = -INFINITY;
    m->psnr_db = -INFINITY;
}

void qva_compare(const float *out, const float *ref, size_t n,
                 qva_error_metrics *m) {
    if (!m) return;
    if (n > 0 && (!out || !ref)) {
        cmp_worst(m);
        return;
    }
    cmp_sums s;
    cmp_accumulate(out, ref, n, &s);
    if (s.bad) {
        cmp_worst(m);
        return;
    }
    m->max_abs = s.max_abs;
    if (s.err2 == 0.0) { /* identical (or both empty): exact agreement */
        m->rel_l2 = 0.0;
        m->cos_sim = 1.0;
        m->psnr_db = INFINITY;
        return;
    }
    m->rel_l2 = s.ref2 > 0.0 ? sqrt(s.err2 / s.ref2) : INFINITY;
    double den = sqrt(s.out2) * sqrt(s.ref2);
    double cs = den > 0.0 ? s.dot / den : 0.0;
    m->cos_sim = cs > 1.0 ? 1.0 : (cs < -1.0 ? -1.0 : cs);
    double rmse = sqrt(s.err2 / (double)n), peak = s.rmax - s.rmin;
    /* a constant reference has no dynamic range: any error is -INF dB */
    m->psnr_db = peak > 0.0 ? 20.0 * log10(peak / rmse) : -INFINITY;
}

/* ------------------------------------------------------------ direction */
#define DIR_FN "qva_error_direction_compute"

static qva_status dir_check(const float *out, const float *ref, int64_t H, int64_t R,
                            const qva_tensor *v) {
    if (!out || !ref || !v || !v->data)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, DIR_FN ": out, ref, v and v's data must not "
                                                  "be NULL");
    if (v->device != QVA_DEVICE_CPU)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, DIR_FN ": v must be a CPU tensor");
    if (v->dtype != QVA_F32 && v->dtype != QVA_BF16 && v->dtype != QVA_F16)
        return qvi_fail(QVA_ERR_DTYPE, DIR_FN ": v's dtype %d is not f32, bf16 or f16",
                        (int)v->dtype);
    for (int i = 0; i < 4; ++i)
        if (v->shape[i] < 1)
            return qvi_fail(QVA_ERR_SHAPE, DIR_FN ": v's shape[%d] = %lld (need >= 1)", i,
                            (long long)v->shape[i]);
    if (H < 1 || R < 1 || H % v->shape[1])
        return qvi_fail(QVA_ERR_SHAPE, DIR_FN ": H = %lld, R = %lld: need R >= 1 and H a "
                        "positive multiple of v's %lld heads", (long long)H, (long long)R,
                        (long long)v->shape[1]);
    const int64_t B = v->shape[0], D = v->shape[3];
    if (H > INT64_MAX / B || R > INT64_MAX / (B * H) || D > INT64_MAX / (B * H * R) ||
        (uint64_t)(B * H * R * D) > SIZE_MAX / sizeof(float))
        return qvi_fail(QVA_ERR_SHAPE, DIR_FN ": B*H*R*D overflows");
    return QVA_OK;
}

/* v_bar[c] = the mean over the keys of V's head (b, hk), in FP64; 0 when
 * a value is not finite. */
static int head_mean(const qva_tensor *v, int64_t b, int64_t hk, double *v_bar) {
    const int64_t N = v->shape[2], D = v->shape[3];
    for (int64_t c = 0; c < D; ++c) v_bar[c] = 0.0;
    for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < D; ++c) {
            const double x = qvi_load_elem(v, qvi_offset(v, b, hk, n, c));
            if (!isfinite(x)) return 0;
            v_bar[c] += x;
        }
    for (int64_t c = 0; c < D; ++c) v_bar[c] /= (double)N;
    return 1;
}

qva_status qva_error_direction_compute(const float *out, const float *ref, int64_t H, int64_t R,
                                       const qva_tensor *v, qva_error_direction *dir) {
    if (!dir) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, DIR_FN ": dir is NULL");
    dir->sharpen = dir->cos = NAN;
    qva_status st = dir_check(out, ref, H, R, v);
    if (st != QVA_OK) return st;
    const int64_t B = v->shape[0], Hk = v->shape[1], D = v->shape[3], g = H / Hk;
    double *v_bar = malloc((size_t)D * sizeof *v_bar);
    if (!v_bar) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, DIR_FN ": %lld doubles", (long long)D);
    double ed = 0.0, dd = 0.0, ee = 0.0;
    for (int64_t b = 0; b < B && st == QVA_OK; ++b)
        for (int64_t h = 0; h < H && st == QVA_OK; ++h) {
            if (h % g == 0 && !head_mean(v, b, h / g, v_bar)) {
                st = qvi_fail(QVA_ERR_NONFINITE, DIR_FN ": NaN/Inf in v (b %lld, kv head %lld)",
                              (long long)b, (long long)(h / g));
                break;
            }
            const size_t base = (size_t)((b * H + h) * R) * (size_t)D;
            for (size_t i = 0; i < (size_t)(R * D); ++i) {
                const double o = out[base + i], f = ref[base + i];
                if (!isfinite(o) || !isfinite(f)) {
                    st = qvi_fail(QVA_ERR_NONFINITE, DIR_FN ": NaN/Inf in %s at element %zu",
                                  isfinite(o) ? "ref" : "out", base + i);
                    break;
                }
                const double e = o - f, d = f - v_bar[i % (size_t)D];
                ed += e * d, dd += d * d, ee += e * e;
            }
        }
    free(v_bar);
    if (st != QVA_OK) return st;
    /* no direction (ref is the uniform average) or no error: nothing along it */
    dir->sharpen = dd > 0.0 ? ed / dd : 0.0;
    dir->cos = dd > 0.0 && ee > 0.0 ? ed / sqrt(ee * dd) : 0.0;
    return QVA_OK;
}

/* ------------------------------------------------------------ V stats */
/* perm must be a permutation of [0, n): a bad index would read outside v. */
static qva_status check_perm(const int32_t *perm, int n) {
    unsigned char *seen = calloc((size_t)n, 1);
    if (!seen) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "permutation check");
    qva_status st = QVA_OK;
    for (int i = 0; i < n && st == QVA_OK; ++i) {
        int32_t p = perm[i];
        if (p < 0 || p >= n || seen[p])
            st = qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                          "perm is not a permutation of [0,%d): perm[%d] = %d",
                          n, i, (int)p);
        else
            seen[p] = 1;
    }
    free(seen);
    return st;
}

static const float *vrow(const float *v, int d, const int32_t *perm, int i) {
    return v + (size_t)(perm ? perm[i] : i) * d;
}

/*
 * Eq. 5: a block's mean removes n_j ||mu_j||^2 of its energy ||V_j||^2.
 * Blocks of zero energy have no share to speak of and are left out of the
 * average; the last block uses its valid rows only.
 */
static double energy_share(const float *v, int n, int d, const int32_t *perm,
                           int block, double *colsum) {
    double total = 0.0;
    int counted = 0;
    for (int r0 = 0; r0 < n; r0 += block) {
        int rows = n - r0 < block ? n - r0 : block;
        double energy = 0.0, mean2 = 0.0;
        for (int c = 0; c < d; ++c) colsum[c] = 0.0;
        for (int i = r0; i < r0 + rows; ++i) {
            const float *x = vrow(v, d, perm, i);
            for (int c = 0; c < d; ++c) {
                colsum[c] += x[c];
                energy += (double)x[c] * x[c];
            }
        }
        for (int c = 0; c < d; ++c) mean2 += colsum[c] * colsum[c];
        if (energy > 0.0) { /* rows*||mu||^2 = ||colsum||^2 / rows */
            total += mean2 / rows / energy;
            ++counted;
        }
    }
    return counted ? total / counted : 0.0;
}

/* ||Vhat - V'||^2 / ||V'||^2 with Vhat = (code + mu_hat) * chan_scale. */
static qva_status quant_rel_mse(const float *v, int n, int d,
                                const int32_t *perm, int demean,
                                double *rel) {
    qvi_v8 x;
    qva_status st = qvi_v8_prepare(v, n, d, perm, demean, QVA_V_E4M3, &x);
    if (st != QVA_OK) return st;
    double err = 0.0, energy = 0.0;
    for (int i = 0; i < n; ++i) {
        const float *row = vrow(v, d, perm, i);
        const uint8_t *code = x.codes + (size_t)i * d;
        const float *mu = x.mu_hat ? x.mu_hat + (size_t)(i / QVI_BLOCK) * d
                                   : NULL;
        for (int c = 0; c < d; ++c) {
            double hat = (double)qva_e4m3_decode(code[c]) + (mu ? mu[c] : 0.0);
            double e = hat * x.chan_scale[c] - row[c];
            err += e * e;
            energy += (double)row[c] * row[c];
        }
    }
    qvi_v8_free(&x);
    *rel = energy > 0.0 ? err / energy : (err > 0.0 ? INFINITY : 0.0);
    return QVA_OK;
}

static qva_status check_finite_rows(const float *v, size_t count,
                                    const char *what) {
    for (size_t i = 0; i < count; ++i)
        if (!isfinite(v[i]))
            return qvi_fail(QVA_ERR_NONFINITE, "%s[%zu] is not finite", what,
                            i);
    return QVA_OK;
}

qva_status qva_vquant_stats_compute(const float *v, int n, int d,
                                    const int32_t *perm, int block,
                                    qva_vquant_stats *st) {
    if (!v || !st || n <= 0 || d <= 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_vquant_stats_compute: NULL pointer or n, d <= 0");
    /* the value operand's demeaning block is fixed (B_v = 128) */
    if (block != QVI_BLOCK)
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "qva_vquant_stats_compute: block = %d, the 8-bit value "
                        "operand uses B_v = %d", block, QVI_BLOCK);
    qva_status s = check_finite_rows(v, (size_t)n * d, "v");
    if (s == QVA_OK && perm) s = check_perm(perm, n);
    if (s != QVA_OK) return s;
    double *colsum = malloc((size_t)d * sizeof *colsum);
    if (!colsum) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "vquant stats");
    st->energy_share = energy_share(v, n, d, perm, block, colsum);
    free(colsum);
    s = quant_rel_mse(v, n, d, perm, 1, &st->rel_mse);
    if (s == QVA_OK) s = quant_rel_mse(v, n, d, perm, 0, &st->rel_mse_plain);
    return s;
}

/* ------------------------------------------------------------ ExpCast TV */
#define LOG2E_F64 1.4426950408889634 /* QVI_LOG2E is its float rounding */

/* Total variation between exact softmax and normalized ExpCast codes of one
 * row; s holds the row's scaled scores (FP64), p and ph are scratch. */
static double row_tv(const double *s, int n, double *p, double *ph) {
    double m = -INFINITY, z = 0.0, zhat = 0.0;
    for (int j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
    for (int j = 0; j < n; ++j) {
        double u = (s[j] - m) * LOG2E_F64;
        p[j] = exp(s[j] - m);
        ph[j] = qva_e4m3_decode(qva_expcast_e4m3((float)u));
        z += p[j];
        zhat += ph[j];
    }
    /* z >= 1 and zhat >= 256: the row maximum (u = 0) encodes to 2^8 */
    double tv = 0.0;
    for (int j = 0; j < n; ++j) tv += fabs(p[j] / z - ph[j] / zhat);
    return 0.5 * tv;
}

qva_status qva_expcast_tv(const float *q, const float *k, int n, int d,
                          float sm_scale, int rows, double *mean_tv,
                          double *max_tv) {
    if (!q || !k || !mean_tv || !max_tv || n <= 0 || d <= 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_expcast_tv: NULL pointer or n, d <= 0");
    if (rows < 1 || rows > n)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_expcast_tv: rows = %d outside [1, %d]", rows, n);
    if (!(sm_scale >= 0.0f) || isinf(sm_scale))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_expcast_tv: sm_scale must be finite and >= 0");
    double scale = sm_scale > 0.0f ? sm_scale : 1.0 / sqrt((double)d);
    qva_status st = check_finite_rows(q, (size_t)rows * d, "q");
    if (st == QVA_OK) st = check_finite_rows(k, (size_t)n * d, "k");
    if (st != QVA_OK) return st;
    double *s = malloc(3 * (size_t)n * sizeof *s);
    if (!s) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "expcast tv scores");
    double sum = 0.0, worst = 0.0;
    for (int i = 0; i < rows; ++i) {
        const float *qi = q + (size_t)i * d;
        for (int j = 0; j < n; ++j) {
            const float *kj = k + (size_t)j * d;
            double dot = 0.0;
            for (int c = 0; c < d; ++c) dot += (double)qi[c] * kj[c];
            s[j] = dot * scale;
        }
        double tv = row_tv(s, n, s + n, s + 2 * (size_t)n);
        sum += tv;
        worst = tv > worst ? tv : worst;
    }
    free(s);
    *mean_tv = sum / rows;
    *max_tv = worst;
    return QVA_OK;
}
