/*
 * DraftAttention2 on the CPU: the phased mixed-precision attention (DA2
 * §3.3, C.3, C.4) over the plan, partition and route of src/draft/.
 * This is the bit-exact reference the CUDA kernels are checked against;
 * docs/DRAFT.md states every rounding step.
 */
#include "cpu/draft.h"
#include "draft/partition.h"
#include "draft/plan.h"
#include "draft/route.h"
#include "draft/router.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#define QVI_OMP_FOR _Pragma("omp parallel for schedule(dynamic, 1)")
#else
#define QVI_OMP_FOR
#endif

/* ------------------------------------------------------------ Eq. 8 */

void qvi_draft_phase_enter(float *acc, float *l, int d, float eta,
                           const float *dv) {
    for (int c = 0; c < d; ++c)
        acc[c] = acc[c] / (eta * dv[c]);
    *l = *l / eta;
}

void qvi_draft_phase_exit(float *acc, float *l, int d, float eta,
                          const float *dv) {
    for (int c = 0; c < d; ++c)
        acc[c] = acc[c] * (eta * dv[c]);
    *l = *l * eta;
}

void qvi_draft_phase_enter_f64(double *acc, double *l, int d, double eta,
                               const double *dv) {
    for (int c = 0; c < d; ++c)
        acc[c] = acc[c] / (eta * dv[c]);
    *l = *l / eta;
}

void qvi_draft_phase_exit_f64(double *acc, double *l, int d, double eta,
                              const double *dv) {
    for (int c = 0; c < d; ++c)
        acc[c] = acc[c] * (eta * dv[c]);
    *l = *l * eta;
}

/* ------------------------------------------------------------ the call */

/* Settings of one call, shared by all heads. */
typedef struct draft_job {
    const qvi_draft_plan *plan;
    const qvi_draft_layout *lay;
    int64_t n, R;
    int d, c;
    float sm_scale, scale_log2, eta;
    int use_f16, expcast, warmup;
    int p_block; /* +pblock: INT8-phase P codes against each block's max */
    int pooled;  /* +pooled: skipped pairs enter as their regions' means */
    int q_rows_per_scale;
    int int8_acc16; /* the INT8 blocks' PV partials rounded to FP16 (Table 6) */
    int v_sample;   /* +vsample: delta_c^V from the packed rows' sample */
    int strict; /* check_finite: a NaN/+inf score fails the row */
    int with4, with8; /* the plan's: NVFP4 / INT8 buffers may be needed */
    const qva_draft_params *dp;
    const qvi_draft_probe *probe; /* NULL: the method as specified */
} draft_job;

/* Per-head operands and results (buffers reused across heads). */
typedef struct draft_head {
    float *q16, *k16, *v16; /* n*d, sequence order, 16-bit rounded     */
    float *qp, *kp, *vp;    /* n_pack*d, packed; f32 then 16-bit       */
    float *q4, *k4, *v4;    /* R*c*d NVFP4 reconstructions (unscaled)  */
    float gq, gk, gv;       /* NVFP4 per-tensor scales                 */
    qvi_i8 q8, k8;          /* INT8 per region block                   */
    qvi_v8 v8;              /* E4M3 V, per-channel scale               */
    float *dv;              /* d: delta_c^V, 1 for an all-zero channel */
    float *qavg, *qmax, *kavg, *kmax; /* R*d pooled descriptors        */
    float *vavg, *vmax;     /* R*d value means (+pooled); vmax scratch   */
    float *A;               /* R*R draft map                           */
    uint8_t *prec;          /* R*R precision of each region pair       */
    int64_t quota[4];       /* this head's skip/4/8/16 (QVI_Q_*)       */
    float *out, *lse;       /* n*d and n, sequence order               */
    float *acc;             /* scratch accumulators, one per row group */
} draft_head;

static float round16(float x, int use_f16) {
    return use_f16 ? qva_round_f16(x) : qva_round_bf16(x);
}

static void round_all(float *x, int64_t n, int use_f16) {
    for (int64_t i = 0; i < n; ++i)
        x[i] = round16(x[i], use_f16);
}

/* Padding keys of a block get -inf so they take no weight. */
static void mask_tail(float *s, int valid, int nk) {
    for (int j = valid; j < nk; ++j)
        s[j] = -INFINITY;
}

/* ---- phases of one video query row (DA2 §3.3, C.4) ---- */

/* NVFP4 phase: E2M1 Q,K,V with E4M3 group scales (Eq. 23); logits
 * restored by g_Q g_K; P coded by Eq. 24 inside qvi_pv_nvfp4, whose P is
 * already in probability units, so g_V alone restores the numerator. */
static void phase_nvfp4(const draft_job *J, const draft_head *H, qvi_row *r,
                        const uint8_t *prec, int64_t qrow, float *s) {
    int c = J->c, d = J->d;
    const float *q = H->q4 + qrow * d;
    float sc = (H->gq * H->gk) * J->scale_log2;
    for (int64_t b = 0; b < J->R; ++b) {
        if (prec[b] != 4)
            continue;
        qvi_scores_f32(q, H->k4 + b * c * d, c, d, sc, s);
        mask_tail(s, J->lay->count[b], c);
        qvi_row_raise_max(r, s, c);
        qvi_pv_nvfp4(r, s, H->v4 + b * c * d, H->gv, NULL, c);
    }
}

/* INT8 phase: INT8 QK^T with one K scale per region block and Q scales per
 * row (or per region block with +qblock), E4M3 P (against the running max,
 * or with +pblock against the block's own and weighted by exp2(m_b - m))
 * and V, each block's partial in FP32 (or rounded to FP16 as Table 6,
 * +fp16acc), entered and left through Eq. 8. */
static void phase_int8(const draft_job *J, const draft_head *H, qvi_row *r,
                       const uint8_t *prec, int64_t qrow, float *s) {
    int c = J->c, d = J->d;
    int64_t n8 = 0;
    for (int64_t b = 0; b < J->R; ++b)
        n8 += prec[b] == 8;
    if (n8 == 0) /* an empty phase has no boundary (Eq. 7) */
        return;
    qvi_draft_phase_enter(r->acc, &r->l, d, J->eta, H->dv);
    const int8_t *q = H->q8.codes + qrow * d;
    for (int64_t b = 0; b < J->R; ++b) {
        if (prec[b] != 8)
            continue;
        qvi_scores_i8(q, qvi_i8_row_scale(&H->q8, qrow), H->k8.codes + b * c * d,
                      H->k8.scale[b], c, d, J->scale_log2, s);
        mask_tail(s, J->lay->count[b], c);
        qvi_row_raise_max(r, s, c);
        qvi_pv_e4m3(r, s, H->v8.codes + b * c * d, NULL, 1.0f, NULL, c, J->expcast, 0,
                    J->int8_acc16, 0, J->p_block);
    }
    qvi_draft_phase_exit(r->acc, &r->l, d, J->eta, H->dv);
}

/* Packed prefix slots a video query reads: all of them (C.1), or none
 * when a probe drops them (qvi_cpu_draft_probe). */
static int64_t prefix_keys(const draft_job *J) {
    return J->probe && J->probe->drop_prefix ? 0 : J->lay->prefix_pad;
}

/* One 16-bit key block at packed slot k0 with `valid` real keys. */
static void block16(const draft_job *J, const draft_head *H, qvi_row *r,
                    const float *q, int64_t k0, int valid, float *s) {
    int c = J->c, d = J->d;
    qvi_scores_f32(q, H->kp + k0 * d, c, d, J->scale_log2, s);
    mask_tail(s, valid, c);
    qvi_row_raise_max(r, s, c);
    qvi_pv_16(r, s, H->vp + k0 * d, c, J->use_f16);
}

/* 16-bit phase: the prefix blocks (always retained by video queries),
 * then the 16-bit video blocks, in packed order. */
static void phase_16(const draft_job *J, const draft_head *H, qvi_row *r,
                     const uint8_t *prec, int64_t slot, float *s) {
    const qvi_draft_layout *L = J->lay;
    const float *q = H->qp + slot * J->d;
    for (int64_t k0 = 0; k0 < prefix_keys(J); k0 += J->c) {
        int64_t valid = L->prefix - k0;
        block16(J, H, r, q, k0, (int)(valid < J->c ? valid : J->c), s);
    }
    for (int64_t b = 0; b < J->R; ++b)
        if (prec[b] == 16)
            block16(J, H, r, q, L->prefix_pad + b * J->c, L->count[b], s);
}

/* +pooled: each skipped pair (a, b) enters row q of region a as count_b
 * keys at region b's mean key with its mean value: the score
 * q . kavg_b * scale_log2 + log2(count_b), then the 16-bit phase's update
 * (P rounded to the 16-bit format) with V = vavg_b.  Last in the walk. */
static void phase_pooled(const draft_job *J, const draft_head *H, qvi_row *r,
                         const uint8_t *prec, int64_t slot, float *s) {
    if (!J->pooled)
        return;
    const int d = J->d;
    const float *q = H->qp + slot * d;
    for (int64_t b = 0; b < J->R; ++b) {
        if (prec[b] != 0)
            continue;
        qvi_scores_f32(q, H->kavg + b * d, 1, d, J->scale_log2, s);
        s[0] += log2f((float)J->lay->count[b]);
        qvi_row_raise_max(r, s, 1);
        qvi_pv_16(r, s, H->vavg + b * d, 1, J->use_f16);
    }
}

/* qvi_row_finish's flags for the rows of one video region: it retains a
 * key if the sequence has a prefix, a block of the region is kept (every
 * region holds at least one token) or the skipped ones enter pooled;
 * otherwise its rows are empty. */
static int row_flags(const draft_job *J, const uint8_t *prec) {
    int retained = prefix_keys(J) > 0 || J->pooled;
    for (int64_t b = 0; b < J->R && !retained; ++b)
        retained = prec[b] != 0;
    return (retained ? QVI_ROW_RETAINED : 0) | (J->strict ? QVI_ROW_STRICT : 0);
}

/* All valid query rows of video region a. */
static void video_region(const draft_job *J, draft_head *H, int64_t a,
                         float *acc) {
    const qvi_draft_layout *L = J->lay;
    const uint8_t *prec = H->prec + a * J->R;
    float s[QVI_BLOCK];
    for (int i = 0; i < L->count[a]; ++i) {
        int64_t qrow = a * J->c + i; /* row within the video part */
        int64_t slot = L->prefix_pad + qrow;
        int32_t orig = L->pack_to_orig[slot];
        qvi_row r;
        qvi_row_init(&r, acc, J->d);
        phase_nvfp4(J, H, &r, prec, qrow, s);
        phase_int8(J, H, &r, prec, qrow, s);
        phase_16(J, H, &r, prec, slot, s);
        phase_pooled(J, H, &r, prec, slot, s);
        H->lse[orig] = qvi_row_finish(&r, row_flags(J, prec), NULL, 0.0f,
                                      H->out + (int64_t)orig * J->d);
    }
}

/* Dense 16-bit rows [i0, i1) in sequence order over all keys in sequence
 * order, blocks of QVI_BLOCK (the bf16 method's computation). */
static void dense_rows(const draft_job *J, draft_head *H, int64_t i0,
                       int64_t i1, float *acc) {
    int d = J->d;
    float s[QVI_BLOCK];
    for (int64_t i = i0; i < i1; ++i) {
        qvi_row r;
        qvi_row_init(&r, acc, d);
        for (int64_t j0 = 0; j0 < J->n; j0 += QVI_BLOCK) {
            int nk = (int)(J->n - j0 < QVI_BLOCK ? J->n - j0 : QVI_BLOCK);
            qvi_scores_f32(H->q16 + i * d, H->k16 + j0 * d, nk, d,
                           J->scale_log2, s);
            qvi_row_raise_max(&r, s, nk);
            qvi_pv_16(&r, s, H->v16 + j0 * d, nk, J->use_f16);
        }
        H->lse[i] = qvi_row_finish(&r, QVI_ROW_RETAINED | (J->strict ? QVI_ROW_STRICT : 0),
                                   NULL, 0.0f, H->out + i * d);
    }
}

/* ---- operand preparation ---- */

/* The per-head allocations of the quantizers. */
static void lowbit_free(draft_head *H) {
    free(H->q8.codes);
    free(H->q8.scale);
    free(H->k8.codes);
    free(H->k8.scale);
    memset(&H->q8, 0, sizeof(H->q8));
    memset(&H->k8, 0, sizeof(H->k8));
    qvi_v8_free(&H->v8);
}

static void head_free(draft_head *H) {
    lowbit_free(H);
    void *bufs[] = {H->q16, H->k16,  H->v16, H->qp,   H->kp,   H->vp,
                    H->q4,  H->k4,   H->v4,  H->dv,   H->qavg, H->qmax,
                    H->kavg, H->kmax, H->A,  H->prec, H->out,  H->lse,
                    H->acc,  H->vavg, H->vmax};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; ++i)
        free(bufs[i]);
    memset(H, 0, sizeof(*H));
}

static void *xmalloc(size_t n, int *fail) {
    void *p = malloc(n ? n : 1);
    if (!p)
        *fail = 1;
    return p;
}

/* Allocates the buffers the call needs (low-bit ones only when used). */
static qva_status head_alloc(const draft_job *J, draft_head *H) {
    memset(H, 0, sizeof(*H));
    size_t d = (size_t)J->d, n = (size_t)J->n, np = (size_t)J->lay->n_pack;
    size_t nv = (size_t)J->R * (size_t)J->c, R = (size_t)J->R;
    size_t groups = R + (n + QVI_BLOCK - 1) / QVI_BLOCK;
    int fail = 0;
    H->q16 = xmalloc(sizeof(float) * n * d, &fail);
    H->k16 = xmalloc(sizeof(float) * n * d, &fail);
    H->v16 = xmalloc(sizeof(float) * n * d, &fail);
    H->out = xmalloc(sizeof(float) * n * d, &fail);
    H->lse = xmalloc(sizeof(float) * n, &fail);
    H->acc = xmalloc(sizeof(float) * groups * d, &fail);
    if (!J->warmup) {
        H->qp = xmalloc(sizeof(float) * np * d, &fail);
        H->kp = xmalloc(sizeof(float) * np * d, &fail);
        H->vp = xmalloc(sizeof(float) * np * d, &fail);
        H->qavg = xmalloc(sizeof(float) * R * d, &fail);
        H->qmax = xmalloc(sizeof(float) * R * d, &fail);
        H->kavg = xmalloc(sizeof(float) * R * d, &fail);
        H->kmax = xmalloc(sizeof(float) * R * d, &fail);
        H->A = xmalloc(sizeof(float) * R * R, &fail);
        H->prec = xmalloc(R * R, &fail);
        if (J->pooled) {
            H->vavg = xmalloc(sizeof(float) * R * d, &fail);
            H->vmax = xmalloc(sizeof(float) * R * d, &fail);
        }
    }
    if (J->with4) {
        H->q4 = xmalloc(sizeof(float) * nv * d, &fail);
        H->k4 = xmalloc(sizeof(float) * nv * d, &fail);
        H->v4 = xmalloc(sizeof(float) * nv * d, &fail);
    }
    if (J->with8) {
        H->dv = xmalloc(sizeof(float) * d, &fail);
    }
    if (fail) {
        head_free(H);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY,
                        "draft: buffers for N = %lld, D = %d", (long long)n,
                        J->d);
    }
    return QVA_OK;
}

/* Low-bit operands of the packed video part (docs/DRAFT.md §4): scales
 * come from the video tokens only, the only ones the low-bit paths read. */
static qva_status prep_lowbit(const draft_job *J, draft_head *H) {
    int d = J->d, nv = (int)(J->R * J->c);
    size_t off = (size_t)J->lay->prefix_pad * (size_t)d;
    if (H->quota[QVI_Q_4] > 0) {
        H->gq = qvi_quant_nvfp4_rows(H->qp + off, nv, d, H->q4);
        H->gk = qvi_quant_nvfp4_rows(H->kp + off, nv, d, H->k4);
        H->gv = qvi_quant_nvfp4_cols(H->vp + off, nv, d, H->v4);
    }
    if (H->quota[QVI_Q_8] > 0) {
        /* The quantizers allocate; lowbit_free releases per head. */
        qvi_quant_i8(H->qp + off, nv, d, J->q_rows_per_scale, &H->q8);
        qvi_quant_i8(H->kp + off, nv, d, QVI_BLOCK, &H->k8);
        if (!H->q8.codes || !H->k8.codes)
            return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft: int8 operands");
        float sampled[128];
        if (J->v_sample) qvi_v_sample_scales(H->vp + off, nv, d, sampled);
        qva_status st = qvi_v8_prepare_carried(H->vp + off, nv, d, NULL, 0, QVA_V_E4M3,
                                               J->v_sample ? sampled : NULL, 0, NULL, &H->v8);
        if (st != QVA_OK)
            return st;
        for (int c = 0; c < d; ++c) /* all-zero channel: codes 0, scale 1 */
            H->dv[c] = H->v8.chan_scale[c] != 0.0f ? H->v8.chan_scale[c] : 1.0f;
    }
    return QVA_OK;
}

/* A probe's route filter on head bh: the pairs it drops are skipped
 * (after the router, so operands and scales stay the call's); the route
 * is copied out if asked for. */
static void probe_route(const draft_job *J, draft_head *H, int64_t bh) {
    const qvi_draft_probe *pb = J->probe;
    const int64_t M = J->R * J->R;
    for (int64_t i = 0; pb->keep && i < M; ++i)
        if (!pb->keep[bh * M + i])
            H->prec[i] = 0;
    if (pb->prec_out)
        memcpy(pb->prec_out + bh * M, H->prec, (size_t)M);
}

/* Router of one head: pooling, Eq. 2, Algorithm 1 with this head's quotas
 * (per head under the MASS budget): src/draft/route.c, the composition the
 * route-quality report reads its kept set from. */
static qva_status route_head(const draft_job *J, draft_head *H,
                             const qva_config *cfg) {
    size_t off = (size_t)J->lay->prefix_pad * (size_t)J->d;
    const qvi_draft_route_buf rb = {H->qavg, H->qmax, H->kavg, H->kmax, H->A, H->prec};
    return qvi_draft_route_packed(cfg, J->plan, J->lay, H->qp + off, H->kp + off, &rb,
                                  H->quota);
}

/* Loads query head (b,h) and its K/V head (b, h / (H / H_kv)), routes it
 * and prepares every operand format. */
static qva_status prep_head(const draft_job *J, draft_head *H,
                            const qva_config *cfg, const qva_tensor *q,
                            const qva_tensor *k, const qva_tensor *v,
                            int64_t b, int64_t h) {
    const int64_t hk = h / (q->shape[1] / k->shape[1]);
    qvi_load_head(q, b, h, H->q16);
    qvi_load_head(k, b, hk, H->k16);
    qvi_load_head(v, b, hk, H->v16);
    if (!J->warmup) {
        qvi_draft_pack(J->lay, H->q16, J->d, H->qp);
        qvi_draft_pack(J->lay, H->k16, J->d, H->kp);
        qvi_draft_pack(J->lay, H->v16, J->d, H->vp);
        qva_status st = route_head(J, H, cfg);
        if (st == QVA_OK && J->probe)
            probe_route(J, H, b * q->shape[1] + h);
        if (st == QVA_OK)
            st = prep_lowbit(J, H);
        if (st != QVA_OK)
            return st;
        if (J->pooled) /* as the router pools K: FP64 means of the f32 values */
            qvi_draft_pool(H->vp + (size_t)J->lay->prefix_pad * (size_t)J->d, J->lay->count,
                           J->R, J->c, J->d, H->vavg, H->vmax);
        /* The 16-bit operands: input dtype if 16-bit, else bf16. */
        int64_t np = J->lay->n_pack * J->d;
        round_all(H->qp, np, J->use_f16);
        round_all(H->kp, np, J->use_f16);
        round_all(H->vp, np, J->use_f16);
    }
    int64_t nd = J->n * J->d;
    round_all(H->q16, nd, J->use_f16);
    round_all(H->k16, nd, J->use_f16);
    round_all(H->v16, nd, J->use_f16);
    return QVA_OK;
}

/* Computes every row of one prepared head. */
static void compute_head(const draft_job *J, draft_head *H) {
    const qvi_draft_layout *L = J->lay;
    int64_t R = J->warmup ? 0 : J->R;
    QVI_OMP_FOR
    for (int64_t a = 0; a < R; ++a)
        video_region(J, H, a, H->acc + a * J->d);
    /* Dense rows: all of them in warm-up, else the prefix queries. */
    int64_t i0 = 0, i1 = J->n;
    if (!J->warmup) {
        i0 = L->prefix_at_end ? J->n - L->prefix : 0;
        i1 = i0 + L->prefix;
    }
    int64_t groups = (i1 - i0 + QVI_BLOCK - 1) / QVI_BLOCK;
    QVI_OMP_FOR
    for (int64_t g = 0; g < groups; ++g) {
        int64_t r0 = i0 + g * QVI_BLOCK;
        int64_t r1 = r0 + QVI_BLOCK < i1 ? r0 + QVI_BLOCK : i1;
        dense_rows(J, H, r0, r1, H->acc + (J->R + g) * J->d);
    }
}

/* Fills the call settings from the plan (quotas over R^2 video-region
 * pairs of the layout). */
static qva_status job_init(draft_job *J, const qvi_draft_plan *P,
                           const qvi_draft_layout *lay) {
    memset(J, 0, sizeof(*J));
    if (lay->regions != P->regions)
        return qvi_fail(QVA_ERR_SHAPE,
                        "draft: layout has %lld regions, plan %lld",
                        (long long)lay->regions, (long long)P->regions);
    J->plan = P;
    J->lay = lay;
    J->n = P->n;
    J->d = P->d;
    J->c = lay->c;
    J->R = lay->regions;
    J->sm_scale = P->sm_scale;
    J->scale_log2 = P->scale_log2;
    J->expcast = P->expcast;
    J->p_block = P->p_block;
    J->pooled = P->pooled;
    J->q_rows_per_scale = P->q_rows_per_scale;
    J->int8_acc16 = P->int8_acc16;
    J->v_sample = P->v_sample;
    J->eta = P->eta;
    J->use_f16 = P->use_f16;
    J->warmup = P->warmup;
    J->with4 = P->with4;
    J->with8 = P->with8;
    return QVA_OK;
}

/* Adds head H's kept share to st (heads routed so far). */
static void stats_add(qva_draft_stats *st, const draft_job *J, const draft_head *H) {
    qvi_draft_stats_add(st, J->R * J->R, H->quota[QVI_Q_SKIP]);
}

/* Runs every (b, h) head with one set of buffers. */
static qva_status run_heads(const draft_job *J, const qva_config *cfg,
                            const qva_tensor *q, const qva_tensor *k,
                            const qva_tensor *v, const qva_tensor *out,
                            const qva_tensor *lse, qva_draft_stats *stats) {
    draft_head H;
    memset(stats, 0, sizeof *stats);
    qva_status st = head_alloc(J, &H);
    for (int64_t b = 0; st == QVA_OK && b < q->shape[0]; ++b)
        for (int64_t h = 0; st == QVA_OK && h < q->shape[1]; ++h) {
            st = prep_head(J, &H, cfg, q, k, v, b, h);
            if (st == QVA_OK && !J->warmup)
                stats_add(stats, J, &H);
            if (st == QVA_OK) {
                compute_head(J, &H);
                if (cfg->check_finite)
                    st = qvi_check_rows(H.out, lse ? H.lse : NULL, J->n, J->d, b, h);
            }
            lowbit_free(&H);
            if (st != QVA_OK)
                break;
            qvi_store_head(out, b, h, H.out);
            if (lse)
                qvi_store_head(lse, b, h, H.lse);
        }
    if (H.out) /* head_alloc succeeded */
        head_free(&H);
    qvi_draft_stats_finish(stats);
    return st;
}

qva_status qvi_cpu_draft(qva_context_t *ctx, const qva_config *cfg,
                         const qva_tensor *q, const qva_tensor *k,
                         const qva_tensor *v, const qva_tensor *out,
                         const qva_tensor *lse) {
    return qvi_cpu_draft_probe(ctx, cfg, q, k, v, out, lse, NULL);
}

qva_status qvi_cpu_draft_probe(qva_context_t *ctx, const qva_config *cfg,
                               const qva_tensor *q, const qva_tensor *k,
                               const qva_tensor *v, const qva_tensor *out,
                               const qva_tensor *lse, const qvi_draft_probe *probe) {
    qvi_draft_plan plan;
    qva_status st = qvi_draft_plan_make(cfg, q, &plan);
    if (st != QVA_OK)
        return st;
    const qva_draft_params *p = &cfg->draft;
    const qvi_partition *part = NULL;
    qvi_partition *owned = NULL;
    st = qvi_draft_partition_get(ctx, p->grid_h, p->grid_w, p->capacity, &part,
                                 &owned);
    if (st != QVA_OK)
        return st;
    qvi_draft_layout lay;
    st = qvi_draft_layout_build(part, p->grid_t, p->prefix_tokens,
                                p->prefix_at_end, &lay);
    if (st == QVA_OK) {
        draft_job J;
        qva_draft_stats stats;
        st = job_init(&J, &plan, &lay);
        J.strict = cfg->check_finite != 0;
        J.dp = &cfg->draft;
        J.probe = probe;
        if (st == QVA_OK)
            st = run_heads(&J, cfg, q, k, v, out, lse, &stats);
        if (st == QVA_OK) /* only a call that finished reports */
            qvi_context_set_draft_stats(ctx, &stats);
        qvi_draft_layout_free(&lay);
    }
    if (owned)
        qvi_draft_partition_release(owned);
    return st;
}
