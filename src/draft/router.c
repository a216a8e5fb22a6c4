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

/* out[b] = softmax_b(dot(qa, k_b) * sm) for one query region, in FP64:
 * dot products in channel order, max subtracted, sum in key order. */
static void softmax_row_f64(const float *qa, const float *k, int64_t R, int d,
                            double sm, double *out) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t b = 0; b < R; ++b) {
        const float *kb = k + b * d;
        double dot = 0.0;
        for (int c = 0; c < d; ++c)
            dot += (double)qa[c] * (double)kb[c];
        out[b] = dot * sm;
        mx = out[b] > mx ? out[b] : mx;
    }
    for (int64_t b = 0; b < R; ++b) {
        out[b] = exp(out[b] - mx);
        sum += out[b];
    }
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

qva_status qvi_draft_assign(const float *A, int64_t R, const int64_t quota[4],
                            uint8_t *prec) {
    int64_t M = R * R;
    if (quota[0] + quota[1] + quota[2] + quota[3] != M || quota[0] < 0 ||
        quota[1] < 0 || quota[2] < 0 || quota[3] < 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "draft: quotas do not sum to R^2 = %lld", (long long)M);
    ranked *rk = malloc(sizeof(ranked) * (size_t)(M > 0 ? M : 1));
    if (!rk)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft: ranking %lld pairs",
                        (long long)M);
    for (int64_t i = 0; i < M; ++i) {
        rk[i].a = A[i];
        rk[i].idx = i;
    }
    qsort(rk, (size_t)M, sizeof(ranked), cmp_ranked);
    int64_t e16 = quota[QVI_Q_16], e8 = e16 + quota[QVI_Q_8];
    int64_t e4 = e8 + quota[QVI_Q_4];
    for (int64_t k = 0; k < M; ++k)
        prec[rk[k].idx] = k < e16 ? 16 : k < e8 ? 8 : k < e4 ? 4 : 0;
    free(rk);
    return QVA_OK;
}
