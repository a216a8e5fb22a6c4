/*
 * DraftAttention2 router, the reference arithmetic: region pooling (DA2
 * Eq. 1, C.1), the draft map (Eq. 2) and the ranking with quotas
 * (Algorithm 1).  The CPU reference routes every head with these and the
 * CUDA router is checked against them bit for bit; docs/DRAFT.md §3
 * states every rounding step.
 */
#include "draft/router.h"
#include "draft/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ pooling */

void qvi_draft_pool(const float *x, const int32_t *count, int64_t R, int c,
                    int d, float *avg, float *mx) {
    for (int64_t r = 0; r < R; ++r) {
        const float *blk = x + r * c * d;
        int n = count[r];
        for (int ch = 0; ch < d; ++ch) {
            double s = 0.0; /* FP64 sum in path order */
            float m = blk[ch];
            for (int i = 0; i < n; ++i) {
                float v = blk[(int64_t)i * d + ch];
                s += (double)v;
                m = v > m ? v : m;
            }
            avg[r * d + ch] = (float)(s / (double)n);
            mx[r * d + ch] = m;
        }
    }
}

/* ------------------------------------------------------------ draft map */

/* Lane l adds the entries b = l, l + 32, ... in key order from +0; five
 * butterfly steps, o = 16, 8, 4, 2, 1, each replace every partial s_l by
 * s_l + s_(l xor o).  IEEE addition is commutative, so all 32 partials
 * end equal. */
double qvi_draft_warp_sum(const double *e, int64_t R) {
    double s[QVI_DRAFT_SUM_LANES], t[QVI_DRAFT_SUM_LANES];
    for (int l = 0; l < QVI_DRAFT_SUM_LANES; ++l) {
        s[l] = 0.0;
        for (int64_t b = l; b < R; b += QVI_DRAFT_SUM_LANES)
            s[l] += e[b];
    }
    for (int o = QVI_DRAFT_SUM_LANES / 2; o > 0; o >>= 1) {
        for (int l = 0; l < QVI_DRAFT_SUM_LANES; ++l)
            t[l] = s[l] + s[l ^ o];
        memcpy(s, t, sizeof s);
    }
    return s[0];
}

/* out[b] = softmax_b(dot(qa, k_b) * sm) for one query region, in FP64:
 * dot products in channel order, max subtracted, the sum in warp order. */
static void softmax_row_f64(const float *qa, const float *k, int64_t R, int d,
                            double sm, double *out) {
    double mx = -INFINITY;
    for (int64_t b = 0; b < R; ++b) {
        const float *kb = k + b * d;
        double dot = 0.0;
        for (int c = 0; c < d; ++c)
            dot += (double)qa[c] * (double)kb[c];
        out[b] = dot * sm;
        mx = out[b] > mx ? out[b] : mx;
    }
    for (int64_t b = 0; b < R; ++b)
        out[b] = exp(out[b] - mx);
    const double sum = qvi_draft_warp_sum(out, R);
    for (int64_t b = 0; b < R; ++b)
        out[b] /= sum;
}

qva_status qvi_draft_map(const float *qavg, const float *qmax,
                         const float *kavg, const float *kmax, int64_t R,
                         int d, float sm_scale, float lambda, float *A) {
    double sm = (double)sm_scale, lam = (double)lambda;
    double *pa = malloc(sizeof(double) * (size_t)(R > 0 ? R : 1) * 2);
    if (!pa)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft: map of %lld regions",
                        (long long)R);
    double *pm = pa + R;
    for (int64_t a = 0; a < R; ++a) {
        softmax_row_f64(qavg + a * d, kavg, R, d, sm, pa);
        softmax_row_f64(qmax + a * d, kmax, R, d, sm, pm);
        for (int64_t b = 0; b < R; ++b)
            A[a * R + b] = (float)((1.0 - lam) * pa[b] + lam * pm[b]);
    }
    free(pa);
    return QVA_OK;
}

/* ------------------------------------------------------------ ranking */

typedef struct ranked { float a; int64_t idx; } ranked;

/* Descending A, ties (and NaN, which sorts last) by ascending index:
 * a strict total order, so qsort's result is the stable argsort. */
static int cmp_ranked(const void *pa, const void *pb) {
    const ranked *x = pa, *y = pb;
    int xn = isnan(x->a), yn = isnan(y->a);
    if (xn != yn)
        return xn - yn;
    if (!xn && x->a != y->a)
        return x->a > y->a ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* The stable descending argsort of M map values (*out: malloc'd). */
static qva_status rank_pairs(const float *A, int64_t M, ranked **out) {
    ranked *rk = malloc(sizeof(ranked) * (size_t)(M > 0 ? M : 1));
    if (!rk)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft: ranking %lld pairs",
                        (long long)M);
    for (int64_t i = 0; i < M; ++i) {
        rk[i].a = A[i];
        rk[i].idx = i;
    }
    qsort(rk, (size_t)M, sizeof(ranked), cmp_ranked);
    *out = rk;
    return QVA_OK;
}

/* Algorithm 1 on ranked pairs: the first quota[16] -> 16, and so on. */
static void assign_ranked(const ranked *rk, int64_t M, const int64_t quota[4],
                          uint8_t *prec) {
    int64_t e16 = quota[QVI_Q_16], e8 = e16 + quota[QVI_Q_8];
    int64_t e4 = e8 + quota[QVI_Q_4];
    for (int64_t k = 0; k < M; ++k)
        prec[rk[k].idx] = k < e16 ? 16 : k < e8 ? 8 : k < e4 ? 4 : 0;
}

static int quotas_valid(const int64_t quota[4], int64_t M) {
    return quota[0] + quota[1] + quota[2] + quota[3] == M && quota[0] >= 0 &&
           quota[1] >= 0 && quota[2] >= 0 && quota[3] >= 0;
}

qva_status qvi_draft_assign(const float *A, int64_t R, const int64_t quota[4],
                            uint8_t *prec) {
    int64_t M = R * R;
    if (!quotas_valid(quota, M))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: quotas do not sum to R^2 = %lld", (long long)M);
    ranked *rk = NULL;
    qva_status st = rank_pairs(A, M, &rk);
    if (st != QVA_OK)
        return st;
    assign_ranked(rk, M, quota, prec);
    free(rk);
    return QVA_OK;
}

/* ------------------------------------------------------------ MASS budget */

uint64_t qvi_draft_mass_weight(float a) {
    if (!(a > 0.0f)) /* NaN, zeros, negatives */
        return 0;
    if (a >= 1.0f)
        return QVI_DRAFT_MASS_ONE;
    /* a * 2^40 only moves the exponent: exact in FP64, floor exact too */
    return (uint64_t)floor(ldexp((double)a, 40));
}

/* K on ranked pairs (docs/DRAFT.md, "Adaptive budget"). */
static qva_status keep_ranked(const ranked *rk, int64_t M, int64_t mass_ppm,
                              int64_t keep_min, int64_t keep_max, int64_t *kept) {
    uint64_t total = 0;
    for (int64_t i = 0; i < M; ++i) { /* integer sum: any order gives it */
        const uint64_t w = qvi_draft_mass_weight(rk[i].a);
        if (w > UINT64_MAX - total)
            return qvi_fail(QVA_ERR_UNSUPPORTED,
                            "draft: the draft-map mass of %lld pairs overflows "
                            "64 bits (its rows should each sum to about 1)",
                            (long long)M);
        total += w;
    }
    const uint64_t target = qvi_draft_ppm_of(total, mass_ppm, 1);
    int64_t k = 0;
    for (uint64_t acc = 0; acc < target; ++k) /* target <= total: k <= M */
        acc += qvi_draft_mass_weight(rk[k].a);
    k = k > keep_min ? k : keep_min;
    *kept = k < keep_max ? k : keep_max; /* the cap wins over the floor */
    return QVA_OK;
}

static int mass_args_valid(int64_t M, int64_t ppm, int64_t lo, int64_t hi) {
    return M >= 0 && ppm >= 0 && ppm <= 1000000 && lo >= 0 && hi >= 0 && hi <= M;
}

qva_status qvi_draft_mass_keep(const float *A, int64_t M, int64_t mass_ppm,
                               int64_t keep_min, int64_t keep_max, int64_t *kept) {
    if (!mass_args_valid(M, mass_ppm, keep_min, keep_max))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: mass budget over %lld pairs: %lld ppm, keep "
                        "[%lld, %lld]",
                        (long long)M, (long long)mass_ppm, (long long)keep_min,
                        (long long)keep_max);
    ranked *rk = NULL;
    qva_status st = rank_pairs(A, M, &rk);
    if (st != QVA_OK)
        return st;
    st = keep_ranked(rk, M, mass_ppm, keep_min, keep_max, kept);
    free(rk);
    return st;
}

/* MASS: K from the ranking, split 4/8/16 by the largest remainders of
 * dp's fractions (frac_skip = 0, so nothing of K is skipped). */
static qva_status mass_quotas(const ranked *rk, int64_t M, const qva_draft_params *dp,
                              const qvi_draft_plan *p, int64_t quota[4]) {
    int64_t k;
    qva_status st = keep_ranked(rk, M, p->mass_ppm, p->keep_min, p->keep_max, &k);
    if (st == QVA_OK)
        st = qvi_draft_quotas(dp, k, quota);
    if (st == QVA_OK)
        quota[QVI_Q_SKIP] = M - k;
    return st;
}

qva_status qvi_draft_route_head(const float *A, int64_t R, const qva_draft_params *dp,
                                const qvi_draft_plan *plan, int64_t quota[4],
                                uint8_t *prec) {
    if (!plan->mass) { /* QUOTA: the fixed path, untouched */
        for (int i = 0; i < 4; ++i)
            quota[i] = plan->quota[i];
        return qvi_draft_assign(A, R, quota, prec);
    }
    const int64_t M = R * R;
    if (!mass_args_valid(M, plan->mass_ppm, plan->keep_min, plan->keep_max))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "draft: mass budget plan for %lld pairs",
                        (long long)M);
    ranked *rk = NULL;
    qva_status st = rank_pairs(A, M, &rk);
    if (st != QVA_OK)
        return st;
    st = mass_quotas(rk, M, dp, plan, quota);
    if (st == QVA_OK)
        assign_ranked(rk, M, quota, prec);
    free(rk);
    return st;
}
