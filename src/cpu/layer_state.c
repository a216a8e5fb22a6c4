/*
 * What a dense call of the CPU reference takes from its layer and leaves
 * to it, per K/V head: the V-Smooth permutation and whether to demean
 * (the schedule of VC §3.4, k-means on grouping steps), +kprev's K mean and
 * +vprev's V scales from the previous call, and +ksample / +vsample's
 * statistics from this call's sampled tokens.
 */
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

static int is_vsmooth(qva_method m) {
    return m == QVA_METHOD_VC8 || m == QVA_METHOD_VC4;
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

qva_status qvi_cpu_kv_head_order(qva_context_t *ctx, const qva_config *cfg,
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
qva_status qvi_cpu_carried_of(qva_context_t *ctx, const qva_config *cfg, int64_t b, int64_t hk,
                              int d, float (*buf)[128], qvi_carried *cs) {
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

/* +ksample / +vsample: this call's statistics of K/V head (b, hk) over
 * its sampled tokens (QVA_STAT_ROW, in the caller's token order): K's
 * channel mean (FP64 sums of QVA_STAT_CHUNK rows in sample order, summed
 * in chunk order, divided by the count, rounded to float: a device sums
 * the chunks side by side) and V's channel scales (qvi_v_sample_scales),
 * into kuse / vuse as if carried.  Nothing is kept for a next call. */
qva_status qvi_cpu_sampled_of(const qva_config *cfg, const qva_tensor *k, const qva_tensor *v,
                              int64_t b, int64_t hk, float (*buf)[128], qvi_carried *cs) {
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

qva_status qvi_cpu_carried_store(qva_context_t *ctx, const qva_config *cfg, int64_t b, int64_t hk,
                                 int d, const int64_t shape[3], const qvi_carried *cs) {
    qvi_vs_state *st = qvi_context_vs_state(ctx, cfg->layer, b, hk);
    if (!st) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "layer state");
    memcpy(st->carry_shape, shape, sizeof st->carry_shape); /* a new entry's */
    if (cs->knext) keep_finite(st->kmean, &st->kmean_d, cs->knext, d);
    if (cs->vnext) keep_finite(st->vscale, &st->vscale_d, cs->vnext, d);
    return QVA_OK;
}
