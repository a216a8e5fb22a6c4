/*
 * qva_draft_report_compute and qva_draft_sweep_compute: how much of the
 * exact softmax attention mass a draft route keeps, beside the best route
 * of the same number of region pairs (docs/DRAFT.md, "Route quality").
 *
 * Per head, one FP64 pass over every (query row, key) pair gives both the
 * exact output (bit for bit the exact method's) and the mass of every
 * video-region pair.  Each point (a config) then routes the head with
 * src/draft/route.c -- the code the draft method itself routes with -- and
 * runs the method on the CPU reference (qvi_cpu_run, as qva_attention).
 * Core level, like src/decompose.c.
 */
#include "internal.h"
#include "draft/partition.h"
#include "draft/plan.h"
#include "draft/route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_POINTS 1000

/* What every head of a call shares. */
typedef struct rep_call {
    const qva_tensor *q, *k, *v;
    qva_config *pcfg;     /* one config per point: stateless, routed step */
    qvi_draft_plan *plan; /* the draft plan of each point                 */
    int64_t points;
    qvi_draft_layout lay;
    int64_t n, R, nv;     /* tokens, video regions, video tokens          */
    int d;
    double scale;         /* sm_scale as the exact method takes it        */
    int32_t *key_reg;     /* n: video region of each key, -1 for prefix   */
    qva_context_t *ctx;   /* the draft runs' (partition cache)            */
} rep_call;

/* A region pair and its exact mass (summed over the region's rows). */
typedef struct pair_mass {
    double m;
    int64_t idx; /* a*R + b */
} pair_mass;

/* Per-head buffers, reused from head to head. */
typedef struct rep_head {
    float *q, *k, *v;     /* n*d, f32 as loaded                           */
    float *qp, *kp;       /* n_pack*d, packed (the router's input)        */
    float *ref, *out;     /* n*d: exact and draft outputs                 */
    double *kt, *vd;      /* d*n: K transposed; n*d: V; FP64              */
    double *M;            /* R*R: pair masses, summed over rows           */
    double *pre;          /* R: prefix-key mass, summed over the rows     */
    pair_mass *order;     /* R*R, heaviest first                          */
    qvi_draft_route_buf rb;
} rep_head;

/* Per-point sums over heads, turned into a qva_draft_report at the end. */
typedef struct rep_sum {
    qva_draft_head_report s; /* sums of the shares and masses             */
    double ratio_min, err2, ref2;
    int64_t ratio_min_head;
    int bad;                 /* a non-finite output or reference          */
} rep_sum;

/* ------------------------------------------------------------ results */

static void head_nan(qva_draft_head_report *r) {
    memset(r, 0, sizeof *r);
    r->kept_share = r->prefix_mass = r->mass16 = r->mass8 = r->mass4 = NAN;
    r->router_mass = r->oracle_mass = r->ratio = r->rel_l2 = NAN;
}

static void report_nan(qva_draft_report *r) {
    memset(r, 0, sizeof *r);
    r->skip = r->kept_share = r->prefix_mass = r->mass16 = r->mass8 = NAN;
    r->mass4 = r->router_mass = r->oracle_mass = r->ratio = r->ratio_min = NAN;
    r->rel_l2 = NAN;
}

/* What a failed call leaves: every report NaN, and the heads' entries of
 * every point, bh = B*H of them each, once max_heads is checked (bh = 0
 * before). */
static void outputs_nan(qva_draft_report *reports, int64_t points,
                        qva_draft_head_report *heads, int64_t max_heads, int64_t bh) {
    for (int64_t i = 0; i < points; ++i) report_nan(&reports[i]);
    for (int64_t i = 0; heads && i < points; ++i)
        for (int64_t j = 0; j < bh; ++j) head_nan(&heads[i * max_heads + j]);
}

/* ------------------------------------------------------------ checks */

static qva_status check_args(const qva_config *cfg, const qva_tensor *q,
                             const qva_tensor *k, const qva_tensor *v,
                             qva_draft_head_report *heads, int64_t max_heads,
                             int64_t points, const char *func) {
    qva_status st = qvi_check_on_cpu(q, k, v, func);
    if (st == QVA_OK) st = qva_attention_check(QVA_DEVICE_CPU, cfg, q, k, v, NULL, NULL);
    if (st != QVA_OK) return st;
    if (cfg->method != QVA_METHOD_DRAFT) {
        char name[96] = "?";
        qva_config_method_name(cfg, name, sizeof name);
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "%s: method %s is not a draft config (draft@S0/S4/S8/S16)",
                        func, name);
    }
    const int64_t bh = q->shape[0] * q->shape[1]; /* validated: <= INT32_MAX */
    if (heads && max_heads < bh)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "%s: heads holds max_heads = %lld entries but q has B*H = %lld "
                        "heads", func, (long long)max_heads, (long long)bh);
    if (heads && max_heads > INT64_MAX / (int64_t)sizeof *heads / points)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "%s: max_heads = %lld entries per point cannot be addressed",
                        func, (long long)max_heads);
    return QVA_OK;
}

static qva_status check_skips(const double *skip, int64_t points) {
    if (!skip)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qva_draft_sweep_compute: skip is NULL");
    if (points < 1 || points > MAX_POINTS)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_draft_sweep_compute: points = %lld must be in [1, %d]",
                        (long long)points, MAX_POINTS);
    for (int64_t i = 0; i < points; ++i)
        if (!(skip[i] >= 0.0 && skip[i] <= 1.0))
            return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                            "qva_draft_sweep_compute: skip[%lld] = %g is outside [0, 1]",
                            (long long)i, skip[i]);
    return QVA_OK;
}

/* ------------------------------------------------------------ the call */

/* Point i's config: stateless and routed (no warm-up), with skip[i] and
 * cfg's split of the kept pairs when skip is given. */
static qva_config point_config(const qva_config *cfg, const double *skip, int64_t i) {
    qva_config c = *cfg;
    c.layer = QVA_LAYER_NONE;
    c.draft.dense_warmup_steps = 0; /* the report is of a routed step */
    if (!skip) return c;
    const qva_draft_params *p = &cfg->draft;
    double kept = (double)p->frac4 + (double)p->frac8 + (double)p->frac16;
    double f = 1.0 - skip[i];
    c.draft.frac_skip = (float)skip[i];
    c.draft.frac4 = kept > 0.0 ? (float)(p->frac4 / kept * f) : 0.0f;
    c.draft.frac8 = kept > 0.0 ? (float)(p->frac8 / kept * f) : 0.0f;
    c.draft.frac16 = kept > 0.0 ? (float)(p->frac16 / kept * f) : (float)f;
    return c;
}

static qva_status make_points(rep_call *C, const qva_config *cfg, const double *skip) {
    C->pcfg = malloc(sizeof *C->pcfg * (size_t)C->points);
    C->plan = malloc(sizeof *C->plan * (size_t)C->points);
    if (!C->pcfg || !C->plan)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft report: %lld configs",
                        (long long)C->points);
    qva_status st = QVA_OK;
    for (int64_t i = 0; i < C->points && st == QVA_OK; ++i) {
        C->pcfg[i] = point_config(cfg, skip, i);
        st = qvi_draft_plan_make(&C->pcfg[i], C->q, &C->plan[i]);
    }
    return st;
}

/* The packed layout of the grid and the region of every key. */
static qva_status make_layout(rep_call *C, const qva_draft_params *p) {
    const qvi_partition *part = NULL;
    qvi_partition *owned = NULL;
    qva_status st = qvi_draft_partition_get(NULL, p->grid_h, p->grid_w, p->capacity,
                                            &part, &owned);
    if (st == QVA_OK)
        st = qvi_draft_layout_build(part, p->grid_t, p->prefix_tokens, p->prefix_at_end,
                                    &C->lay);
    if (owned) qvi_draft_partition_release(owned);
    if (st != QVA_OK) return st;
    C->R = C->lay.regions;
    C->nv = C->n - p->prefix_tokens;
    C->key_reg = malloc(sizeof *C->key_reg * (size_t)C->n);
    if (!C->key_reg) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft report: key map");
    for (int64_t j = 0; j < C->n; ++j) {
        int64_t slot = C->lay.orig_to_pack[j];
        C->key_reg[j] = slot < C->lay.prefix_pad
                            ? -1 : (int32_t)((slot - C->lay.prefix_pad) / C->lay.c);
    }
    return QVA_OK;
}

static void call_free(rep_call *C) {
    free(C->pcfg), free(C->plan), free(C->key_reg);
    qvi_draft_layout_free(&C->lay);
    qva_context_free(C->ctx);
}

static qva_status call_init(rep_call *C, const qva_config *cfg, const qva_tensor *q,
                            const qva_tensor *k, const qva_tensor *v, const double *skip,
                            int64_t points) {
    memset(C, 0, sizeof *C);
    C->q = q, C->k = k, C->v = v;
    C->points = points;
    C->n = q->shape[2];
    C->d = (int)q->shape[3];
    C->scale = qvi_sm_scale(cfg, q->shape[3]);
    qva_status st = make_points(C, cfg, skip);
    if (st == QVA_OK) st = make_layout(C, &cfg->draft);
    if (st == QVA_OK) st = qva_context_create(&C->ctx, QVA_DEVICE_CPU);
    return st;
}

/* ------------------------------------------------------------ head buffers */

static void head_free(rep_head *H) {
    free(H->q), free(H->k), free(H->v), free(H->qp), free(H->kp);
    free(H->ref), free(H->out), free(H->kt), free(H->vd), free(H->M), free(H->pre), free(H->order);
    qvi_draft_route_buf_free(&H->rb);
    memset(H, 0, sizeof *H);
}

static qva_status head_alloc(const rep_call *C, rep_head *H) {
    memset(H, 0, sizeof *H);
    const size_t nd = (size_t)C->n * (size_t)C->d, rr = (size_t)(C->R * C->R);
    const size_t pd = (size_t)C->lay.n_pack * (size_t)C->d;
    H->q = malloc(nd * sizeof(float)), H->k = malloc(nd * sizeof(float));
    H->v = malloc(nd * sizeof(float)), H->ref = malloc(nd * sizeof(float));
    H->out = malloc(nd * sizeof(float)), H->kt = malloc(nd * sizeof(double));
    H->vd = malloc(nd * sizeof(double));
    H->qp = malloc(pd * sizeof(float)), H->kp = malloc(pd * sizeof(float));
    H->M = malloc(rr * sizeof(double)), H->order = malloc(rr * sizeof(pair_mass));
    H->pre = malloc((size_t)C->R * sizeof(double));
    qva_status st = qvi_draft_route_buf_alloc(C->R, C->d, &H->rb);
    if (st == QVA_OK && !(H->q && H->k && H->v && H->ref && H->out && H->kt && H->vd && H->qp &&
                          H->kp && H->M && H->order && H->pre))
        st = qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft report: buffers for N = %lld, D = %d",
                      (long long)C->n, C->d);
    if (st != QVA_OK) head_free(H);
    return st;
}

/* Query head (b, h) and its K/V head, f32; K (transposed) and V in FP64
 * for the exact pass, Q and K packed for the router. */
static void head_load(const rep_call *C, rep_head *H, int64_t b, int64_t h) {
    const int64_t hk = h / (C->q->shape[1] / C->k->shape[1]);
    qvi_load_head(C->q, b, h, H->q);
    qvi_load_head(C->k, b, hk, H->k);
    qvi_load_head(C->v, b, hk, H->v);
    for (int64_t j = 0; j < C->n; ++j)
        for (int c = 0; c < C->d; ++c)
            H->kt[(size_t)c * (size_t)C->n + (size_t)j] = (double)H->k[j * C->d + c];
    for (int64_t i = 0; i < C->n * C->d; ++i) H->vd[i] = (double)H->v[i];
    qvi_draft_pack(&C->lay, H->q, C->d, H->qp);
    qvi_draft_pack(&C->lay, H->k, C->d, H->kp);
}

/* ------------------------------------------------------------ exact pass */

/* The pass runs tiles of query rows, so each block of K^T and each row of
 * V is read once per tile rather than once per row; a block of keys keeps
 * the tile's scores in cache. */
enum { TILE_ROWS = 8, TILE_KEYS = 256 };

/* FP64 scores of the tile's rows against every key, in exact_row's
 * arithmetic (src/cpu/attention.c): each dot in channel order, then times
 * the scale.  Keys run innermost over transposed K, so the loop vectorizes
 * and every score is still the same sum, bit for bit.  s: nr rows of n. */
static void tile_scores(const rep_call *C, const rep_head *H, const int64_t *rows, int nr,
                        double *s) {
    const int64_t n = C->n;
    for (int64_t j0 = 0; j0 < n; j0 += TILE_KEYS) {
        const int64_t j1 = j0 + TILE_KEYS < n ? j0 + TILE_KEYS : n;
        for (int r = 0; r < nr; ++r)
            for (int64_t j = j0; j < j1; ++j) s[r * n + j] = 0.0;
        for (int c = 0; c < C->d; ++c) {
            const double *kc = H->kt + (size_t)c * (size_t)n;
            for (int r = 0; r < nr; ++r) {
                const double qc = (double)H->q[rows[r] * C->d + c];
                double *sr = s + r * n;
                for (int64_t j = j0; j < j1; ++j) sr[j] += qc * kc[j];
            }
        }
        for (int r = 0; r < nr; ++r)
            for (int64_t j = j0; j < j1; ++j) s[r * n + j] *= C->scale;
    }
}

/* Row by row in place: p_j = exp(s_j - max), l = sum p in key order. */
static void tile_softmax(double *s, int64_t n, int nr, double *l) {
    for (int r = 0; r < nr; ++r) {
        double *sr = s + r * n, mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < n; ++j)
            if (sr[j] > mx) mx = sr[j];
        for (int64_t j = 0; j < n; ++j) sum += sr[j] = exp(sr[j] - mx);
        l[r] = sum;
    }
}

/* The exact outputs sum_j p_j v_j / l into H->ref: FP64 in key order,
 * rounded to f32, as exact_row. */
static void tile_output(const rep_call *C, rep_head *H, const int64_t *rows, int nr,
                        const double *p, const double *l) {
    double o[TILE_ROWS][QVA_MAX_HEAD_DIM] = {{0}};
    const int d = C->d;
    for (int64_t j = 0; j < C->n; ++j) {
        const double *vj = H->vd + j * d;
        for (int r = 0; r < nr; ++r) {
            const double pr = p[r * C->n + j];
            for (int c = 0; c < d; ++c) o[r][c] += pr * vj[c];
        }
    }
    for (int r = 0; r < nr; ++r)
        for (int c = 0; c < d; ++c) H->ref[rows[r] * d + c] = (float)(o[r][c] / l[r]);
}

/* Exact rows: outputs into H->ref, probabilities left in s, sums in l. */
static void tile_exact(const rep_call *C, rep_head *H, const int64_t *rows, int nr,
                       double *s, double *l) {
    tile_scores(C, H, rows, nr, s);
    tile_softmax(s, C->n, nr, l);
    tile_output(C, H, rows, nr, s, l);
}

/* Adds one row's mass on each key region to mrow and on the prefix keys
 * to *pre: key-order sums per region (mb), each divided by l. */
static void row_mass(const rep_call *C, const double *p, double l, double *mb,
                     double *mrow, double *pre) {
    memset(mb, 0, sizeof *mb * (size_t)(C->R + 1));
    for (int64_t j = 0; j < C->n; ++j) mb[C->key_reg[j] + 1] += p[j];
    *pre += mb[0] / l;
    for (int64_t b = 0; b < C->R; ++b) mrow[b] += mb[b + 1] / l;
}

/* Video region a: its rows in path order, tile by tile, with their mass. */
static void region_rows(const rep_call *C, rep_head *H, int64_t a, double *s, double *mb) {
    const qvi_draft_layout *L = &C->lay;
    double *mrow = H->M + a * C->R, l[TILE_ROWS];
    int64_t rows[TILE_ROWS];
    memset(mrow, 0, sizeof *mrow * (size_t)C->R);
    H->pre[a] = 0.0;
    for (int i0 = 0; i0 < L->count[a]; i0 += TILE_ROWS) {
        const int nr = L->count[a] - i0 < TILE_ROWS ? L->count[a] - i0 : TILE_ROWS;
        for (int r = 0; r < nr; ++r) rows[r] = L->pack_to_orig[L->prefix_pad + a * L->c + i0 + r];
        tile_exact(C, H, rows, nr, s, l);
        for (int r = 0; r < nr; ++r) row_mass(C, s + r * C->n, l[r], mb, mrow, &H->pre[a]);
    }
}

/* Unit u of the pass: video region u, or the tile of prefix rows u - R
 * (exact outputs only: prefix rows hold no pair). */
static void pass_unit(const rep_call *C, rep_head *H, int64_t u, double *s, double *mb) {
    if (u < C->R) {
        region_rows(C, H, u, s, mb);
        return;
    }
    const int64_t p0 = (C->lay.prefix_at_end ? C->nv : 0) + (u - C->R) * TILE_ROWS;
    const int64_t p1 = C->lay.prefix_at_end ? C->n : C->lay.prefix;
    const int nr = p1 - p0 < TILE_ROWS ? (int)(p1 - p0) : TILE_ROWS;
    int64_t rows[TILE_ROWS];
    double l[TILE_ROWS];
    for (int r = 0; r < nr; ++r) rows[r] = p0 + r;
    tile_exact(C, H, rows, nr, s, l);
}

/* Every row of the head; units are independent and each sum has a fixed
 * order, so the result does not depend on the thread count. */
static qva_status exact_pass(const rep_call *C, rep_head *H) {
    const int64_t units = C->R + (C->lay.prefix + TILE_ROWS - 1) / TILE_ROWS;
    int no_buf = 0;
#pragma omp parallel
    {
        double *s = malloc(sizeof *s * (size_t)C->n * TILE_ROWS);
        double *mb = malloc(sizeof *mb * (size_t)(C->R + 1));
        if (!s || !mb) {
#pragma omp atomic write
            no_buf = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; ++u)
            if (s && mb) pass_unit(C, H, u, s, mb);
        free(s), free(mb);
    }
    return no_buf ? qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft report: row buffers") : QVA_OK;
}

/* Descending mass; ties (and NaN, from a NaN input under check_finite =
 * 0, last) by ascending pair index: a strict total order. */
static int cmp_pair(const void *pa, const void *pb) {
    const pair_mass *x = pa, *y = pb;
    const int xn = isnan(x->m), yn = isnan(y->m);
    if (xn != yn) return xn - yn;
    if (!xn && x->m != y->m) return x->m > y->m ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static void sort_pairs(const rep_call *C, rep_head *H) {
    const int64_t rr = C->R * C->R;
    for (int64_t i = 0; i < rr; ++i) H->order[i] = (pair_mass){H->M[i], i};
    qsort(H->order, (size_t)rr, sizeof *H->order, cmp_pair);
}

/* ------------------------------------------------------------ one point */

/* Kept counts and masses of the route in H->rb.prec against the oracle.
 * Both totals are summed in the same (heaviest-first) order, so a route
 * that keeps the oracle's pairs gets its mass bit for bit. */
static void route_masses(const rep_call *C, const rep_head *H, qva_draft_head_report *r) {
    const int64_t rr = C->R * C->R;
    double m16 = 0.0, m8 = 0.0, m4 = 0.0, kept = 0.0, top = 0.0, pre = 0.0;
    int64_t n16 = 0, n8 = 0, n4 = 0;
    for (int64_t t = 0; t < rr; ++t) {
        const pair_mass *pm = &H->order[t];
        switch (H->rb.prec[pm->idx]) {
        case 16: m16 += pm->m, ++n16; break;
        case 8: m8 += pm->m, ++n8; break;
        case 4: m4 += pm->m, ++n4; break;
        default: continue;
        }
        kept += pm->m;
    }
    for (int64_t t = 0; t < n16 + n8 + n4; ++t) top += H->order[t].m;
    for (int64_t a = 0; a < C->R; ++a) pre += H->pre[a];
    const double nv = (double)C->nv;
    r->kept16 = n16, r->kept8 = n8, r->kept4 = n4;
    r->kept_share = (double)(n16 + n8 + n4) / (double)rr;
    r->prefix_mass = pre / nv;
    r->mass16 = m16 / nv, r->mass8 = m8 / nv, r->mass4 = m4 / nv;
    r->router_mass = r->prefix_mass + kept / nv;
    r->oracle_mass = r->prefix_mass + top / nv;
    /* nothing kept by either (no prefix, all skipped): as good as the oracle */
    r->ratio = r->oracle_mass > 0.0 ? r->router_mass / r->oracle_mass : 1.0;
}

/* Head (b, h) of t as a [1, 1, N, D] view. */
static qva_tensor head_view(const qva_tensor *t, int64_t b, int64_t h) {
    qva_tensor x = *t;
    x.data = (char *)t->data + qvi_offset(t, b, h, 0, 0) * (int64_t)qva_dtype_size(t->dtype);
    x.shape[0] = x.shape[1] = 1;
    return x;
}

/* The draft method on head (b, h), as qva_attention's CPU reference. */
static qva_status draft_run(const rep_call *C, int64_t i, int64_t b, int64_t h, float *out) {
    const int64_t hk = h / (C->q->shape[1] / C->k->shape[1]);
    const qva_tensor tq = head_view(C->q, b, h), tk = head_view(C->k, b, hk);
    const qva_tensor tv = head_view(C->v, b, hk);
    const qva_tensor to = qva_tensor_hnd(out, QVA_F32, QVA_DEVICE_CPU, 1, 1, C->n, C->d);
    qvi_context_lock(C->ctx);
    qva_status st = qvi_cpu_run(C->ctx, &C->pcfg[i], &tq, &tk, &tv, &to, NULL, QVI_QUANT_ALL);
    qvi_context_unlock(C->ctx);
    if (st == QVA_OK) return st;
    char msg[512]; /* the view's messages say head (0, 0) */
    snprintf(msg, sizeof msg, "%s", qva_last_error());
    return qvi_fail(st, "draft report, head (b=%lld, h=%lld): %s", (long long)b,
                    (long long)h, msg);
}

/* FP64 sums of the squared error and reference (qva_compare's), for the
 * rel-L2 over all heads; 0 if an element is not finite. */
static int err_sums(const float *out, const float *ref, size_t n, double *e2, double *r2) {
    for (size_t i = 0; i < n; ++i) {
        const double o = out[i], r = ref[i], e = o - r;
        if (!isfinite(o) || !isfinite(r)) return 0;
        *e2 += e * e, *r2 += r * r;
    }
    return 1;
}

static void sum_add(rep_sum *S, const qva_draft_head_report *r, int64_t head) {
    qva_draft_head_report *s = &S->s;
    s->kept_share += r->kept_share, s->prefix_mass += r->prefix_mass;
    s->mass16 += r->mass16, s->mass8 += r->mass8, s->mass4 += r->mass4;
    s->router_mass += r->router_mass, s->oracle_mass += r->oracle_mass;
    if (head == 0 || r->ratio < S->ratio_min) S->ratio_min = r->ratio, S->ratio_min_head = head;
}

/* Point i on the loaded head: route, masses, draft output, errors. */
static qva_status head_point(const rep_call *C, rep_head *H, int64_t i, int64_t b,
                             int64_t h, qva_draft_head_report *r, rep_sum *S) {
    const size_t off = (size_t)C->lay.prefix_pad * (size_t)C->d, nd = (size_t)(C->n * C->d);
    int64_t quota[4]; /* this head's counts (per head under the MASS budget) */
    qva_status st = qvi_draft_route_packed(&C->pcfg[i], &C->plan[i], &C->lay, H->qp + off,
                                         H->kp + off, &H->rb, quota);
    if (st == QVA_OK) st = draft_run(C, i, b, h, H->out);
    if (st != QVA_OK) return st;
    route_masses(C, H, r);
    r->batch = b, r->head = h;
    qva_error_metrics m;
    qva_compare(H->out, H->ref, nd, &m);
    r->rel_l2 = m.rel_l2;
    const int64_t head = b * C->q->shape[1] + h;
    sum_add(S, r, head);
    if (!err_sums(H->out, H->ref, nd, &S->err2, &S->ref2)) S->bad = 1;
    return QVA_OK;
}

/* ------------------------------------------------------------ summary */

static void finish(const rep_call *C, const rep_sum *S, double skip, qva_draft_report *o) {
    const double nh = (double)(C->q->shape[0] * C->q->shape[1]);
    o->heads = C->q->shape[0] * C->q->shape[1];
    o->regions = C->R;
    o->skip = skip;
    o->kept_share = S->s.kept_share / nh;
    o->prefix_mass = S->s.prefix_mass / nh;
    o->mass16 = S->s.mass16 / nh, o->mass8 = S->s.mass8 / nh, o->mass4 = S->s.mass4 / nh;
    o->router_mass = S->s.router_mass / nh, o->oracle_mass = S->s.oracle_mass / nh;
    o->ratio = o->oracle_mass > 0.0 ? o->router_mass / o->oracle_mass : 1.0;
    o->ratio_min = S->ratio_min, o->ratio_min_head = S->ratio_min_head;
    /* qva_compare's rule: non-finite anywhere, or no reference energy, is +inf */
    if (S->bad) o->rel_l2 = INFINITY;
    else if (S->err2 == 0.0) o->rel_l2 = 0.0;
    else o->rel_l2 = S->ref2 > 0.0 ? sqrt(S->err2 / S->ref2) : INFINITY;
}

/* Every head: the exact pass once, then every point. */
static qva_status run_heads(const rep_call *C, rep_sum *sums, qva_draft_head_report *heads,
                            int64_t max_heads) {
    rep_head H;
    qva_status st = head_alloc(C, &H);
    for (int64_t b = 0; st == QVA_OK && b < C->q->shape[0]; ++b)
        for (int64_t h = 0; st == QVA_OK && h < C->q->shape[1]; ++h) {
            head_load(C, &H, b, h);
            st = exact_pass(C, &H);
            if (st == QVA_OK) sort_pairs(C, &H);
            for (int64_t i = 0; st == QVA_OK && i < C->points; ++i) {
                qva_draft_head_report r;
                st = head_point(C, &H, i, b, h, &r, &sums[i]);
                if (st == QVA_OK && heads)
                    heads[i * max_heads + b * C->q->shape[1] + h] = r;
            }
        }
    if (H.q) head_free(&H); /* head_alloc succeeded */
    return st;
}

/* The shared engine: skip NULL is the report of cfg itself (one point). */
static qva_status report_run(const qva_config *cfg, const qva_tensor *q,
                             const qva_tensor *k, const qva_tensor *v, const double *skip,
                             int64_t points, qva_draft_report *reports,
                             qva_draft_head_report *heads, int64_t max_heads) {
    rep_call C;
    qva_status st = call_init(&C, cfg, q, k, v, skip, points);
    rep_sum *sums = st == QVA_OK ? calloc((size_t)points, sizeof *sums) : NULL;
    if (st == QVA_OK && !sums)
        st = qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft report: %lld points", (long long)points);
    if (st == QVA_OK) st = run_heads(&C, sums, heads, max_heads);
    for (int64_t i = 0; st == QVA_OK && i < points; ++i)
        finish(&C, &sums[i], skip ? skip[i] : (double)cfg->draft.frac_skip, &reports[i]);
    free(sums);
    call_free(&C);
    return st;
}

/* B*H of a q that passed check_args. */
static int64_t heads_of(const qva_tensor *q) { return q->shape[0] * q->shape[1]; }

qva_status qva_draft_report_compute(const qva_config *cfg, const qva_tensor *q,
                                    const qva_tensor *k, const qva_tensor *v,
                                    qva_draft_report *report,
                                    qva_draft_head_report *heads, int64_t max_heads) {
    qvi_clear_error();
    if (!report)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qva_draft_report_compute: report is NULL");
    report_nan(report);
    qva_status st = check_args(cfg, q, k, v, heads, max_heads, 1, "qva_draft_report_compute");
    if (st != QVA_OK) return st;
    st = report_run(cfg, q, k, v, NULL, 1, report, heads, max_heads);
    if (st != QVA_OK) outputs_nan(report, 1, heads, max_heads, heads_of(q));
    return st;
}

qva_status qva_draft_sweep_compute(const qva_config *cfg, const qva_tensor *q,
                                   const qva_tensor *k, const qva_tensor *v,
                                   const double *skip, int64_t points,
                                   qva_draft_report *reports,
                                   qva_draft_head_report *heads, int64_t max_heads) {
    qvi_clear_error();
    if (!reports)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qva_draft_sweep_compute: reports is NULL");
    qva_status st = check_skips(skip, points);
    if (st != QVA_OK) return st; /* points unknown: nothing is written */
    outputs_nan(reports, points, NULL, 0, 0);
    st = check_args(cfg, q, k, v, heads, max_heads, points, "qva_draft_sweep_compute");
    if (st != QVA_OK) return st;
    st = report_run(cfg, q, k, v, skip, points, reports, heads, max_heads);
    if (st != QVA_OK) outputs_nan(reports, points, heads, max_heads, heads_of(q));
    return st;
}
