/*
 * DraftAttention2 on the GPU, the host side (DA2 §3.3; docs/DRAFT.md
 * §4-5): qvc_draft_attention and the state it keeps per context (the
 * device layout, the route buffers, the operands, the two side streams).
 *
 * One call (qvc_draft_attention):
 *   1. plan (qvi_draft_plan_make, shared with the CPU reference): warm-up,
 *      quotas, which low-bit operands are needed, the dense rows;
 *   2. warm-up: the bf16 method's prep16 + attn_bf16 over every row, which
 *      is exactly what the CPU computes then (docs/DRAFT.md §5);
 *   3. else: the device layout (host partition from the context cache,
 *      uploaded once per (grid, prefix)), the router (router.cu: CSR key
 *      lists per (head, query region, phase)) on a high-priority stream while
 *      the operand preparation (prep.cu) runs on the side stream, then the
 *      kernel the chooser names (attn_draft_ws_128x128.cu without NVFP4,
 *      else attn_draft_mma_64x128.cu), and the
 *      prefix query rows through the bf16 method on a row sub-view of Q
 *      (the CPU computes them exactly like `bf16`, in sequence order; the
 *      Hopper kernel computes them itself); with +pooled, the skipped
 *      pairs' pass (pooled.cu) merged into out and the LSE.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/device_util.cuh"
#include "expcast_magic.h"
#include "draft/partition.h"
#include "draft_internal.h"

typedef struct dg_state {
    int lay_key[6];          /* h, w, c, t, prefix, prefix_at_end */
    qvc_draft_layout lay;    /* device layout, valid if lay.pack_to_orig */
    qvc_draft_route_buf route;
    dg_ops ops;
    qvc_ops16 ops16;         /* the dense rows (prefix queries, warm-up) */
    qvc_phase_timer timer;
    dg_pooled_buf pooled;    /* +pooled's V means and kept-part LSE */
    /* The operand preparation does not depend on the route, so it runs on
     * a second stream, forked from and joined back into the caller's
     * stream by events, while the router runs on a third one, `hi`, of
     * the device's greatest priority, joined back by `routed_hi`.  Why the
     * priority: the router's chain is many small kernels, each of which
     * otherwise waited for a whole V kernel of the side stream to drain
     * off the SMs before its first CTA ran (bench/RESULTS.md, "The router
     * on a high-priority stream"). */
    cudaStream_t side, hi;
    cudaEvent_t fork, join, routed_hi;
    /* The kept-share stats of the last routed call, read lazily
     * (qvi_context_set_draft_stats_lazy): under QUOTA every head skips
     * stats_skip of stats_M pairs; under MASS the heads' quotas are in
     * route.head_quota once `routed` (recorded after the router) has
     * passed. */
    int stats_mass;
    int64_t stats_BH, stats_M, stats_skip;
    cudaEvent_t routed;
} dg_state;

static void dg_ops_free(dg_ops *o) {
    void *ptrs[] = {o->q16, o->k16, o->v16t, o->q4, o->k4, o->v4t, o->g4,
                    o->q8,  o->k8,  o->q8s,  o->k8s, o->v8t, o->dv, o->amax, o->vs_part,
                    o->v_redo};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(o, 0, sizeof *o);
}

static void dg_state_free(void *ptr) {
    dg_state *s = (dg_state *)ptr;
    if (!s) return;
    qvc_draft_layout_free(&s->lay);
    qvc_draft_route_free(&s->route);
    dg_ops_free(&s->ops);
    qvc_ops16_free(&s->ops16);
    dg_pooled_free(&s->pooled);
    qvc_timer_free(&s->timer);
    if (s->fork) cudaEventDestroy(s->fork);
    if (s->join) cudaEventDestroy(s->join);
    if (s->routed) cudaEventDestroy(s->routed);
    if (s->routed_hi) cudaEventDestroy(s->routed_hi);
    if (s->side) cudaStreamDestroy(s->side);
    if (s->hi) cudaStreamDestroy(s->hi);
    free(s);
}

/* The side stream, the router's stream and their events, made on first use. */
static qva_status dg_side_ensure(dg_state *s) {
    cudaError_t e = cudaSuccess;
    int least = 0, greatest = 0;
    if (!s->side) e = cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking);
    if (e == cudaSuccess && !s->hi && (e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) == cudaSuccess)
        e = cudaStreamCreateWithPriority(&s->hi, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess && !s->fork) e = cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming);
    if (e == cudaSuccess && !s->join) e = cudaEventCreateWithFlags(&s->join, cudaEventDisableTiming);
    if (e == cudaSuccess && !s->routed_hi)
        e = cudaEventCreateWithFlags(&s->routed_hi, cudaEventDisableTiming);
    return e == cudaSuccess ? QVA_OK : qvc_cuda_fail(e, "draft: side streams");
}

static dg_state *dg_get_state(qva_context_t *ctx) {
    void (*dtor)(void *) = dg_state_free;
    void **slot = qvi_context_slot(ctx, QVI_SLOT_CUDA_DRAFT, &dtor);
    if (!*slot) *slot = calloc(1, sizeof(dg_state));
    return (dg_state *)*slot;
}

/* direct_q: the call needs no packed Q (a packed Q left from an earlier
 * call stays, unused). */
static qva_status dg_ops_ensure(dg_ops *o, int BH, int R, int D, int64_t n_pack, int with4,
                                int with8, int direct_q) {
    o->direct_q = direct_q;
    if (o->v16t && o->BH == BH && o->R == R && o->D == D && o->n_pack == n_pack &&
        (o->with4 || !with4) && (o->with8 || !with8) && (o->q16 || direct_q))
        return QVA_OK;
    dg_ops_free(o);
    o->BH = BH, o->R = R, o->D = D, o->n_pack = n_pack, o->with4 = with4, o->with8 = with8;
    o->direct_q = direct_q;
    const size_t bh = (size_t)BH, d = (size_t)D, np = (size_t)n_pack, nv = (size_t)R * DG_KEYS;
    const size_t lowbit = (with4 || with8) ? 1 : 0;
    const qvc_alloc req[] = {
        {(void **)&o->q16, direct_q ? 0 : bh * np * d * 2},
        {(void **)&o->k16, bh * np * d * 2},
        {(void **)&o->v16t, bh * np * d * 2},
        {(void **)&o->q4, with4 ? bh * nv * d * 2 : 0},
        {(void **)&o->k4, with4 ? bh * nv * d * 2 : 0},
        {(void **)&o->v4t, with4 ? bh * nv * d * 2 : 0},
        {(void **)&o->g4, with4 ? bh * 3 * sizeof(float) : 0},
        {(void **)&o->q8, with8 ? bh * nv * d : 0},
        {(void **)&o->k8, with8 ? bh * nv * d : 0},
        {(void **)&o->q8s, with8 ? bh * nv * sizeof(float) : 0}, /* per row at most */
        {(void **)&o->k8s, with8 ? bh * (size_t)R * sizeof(float) : 0},
        {(void **)&o->v8t, with8 ? bh * nv * d : 0},
        {(void **)&o->dv, with8 ? bh * d * sizeof(float) : 0},
        {(void **)&o->amax, lowbit * 3 * bh * (size_t)R * d * sizeof(float)},
        {(void **)&o->vs_part, with8 ? qvc_stat_sample_bytes(BH, R * DG_KEYS, D) : 0},
        {(void **)&o->v_redo, with8 ? bh * sizeof(int) : 0},
    };
    qva_status st = qvc_malloc_all(req, sizeof req / sizeof req[0], "draft operands: cudaMalloc");
    if (st != QVA_OK) dg_ops_free(o);
    return st;
}

static qvc_attn_args dg_args(float scale_log2, const qva_tensor *q, const qva_tensor *out,
                             const qva_tensor *lse, int64_t row0) {
    qvc_attn_args a;
    memset(&a, 0, sizeof a);
    a.scale_log2 = scale_log2;
    a.expcast = 0;
    a.out = (char *)out->data + (size_t)(row0 * out->stride[2]) * qva_dtype_size(out->dtype);
    a.out_dtype = (int)out->dtype;
    a.osb = out->stride[0], a.osh = out->stride[1], a.osn = out->stride[2];
    a.lse = lse ? (float *)lse->data + row0 * lse->stride[2] : NULL;
    a.lsb = lse ? lse->stride[0] : 0, a.lsh = lse ? lse->stride[1] : 0;
    a.lsn = lse ? lse->stride[2] : 0;
    a.H = (int)q->shape[1];
    return a;
}

/* Rows [row0, row0 + rows) of Q against every key, exactly the bf16
 * method (prep16 + attn_bf16 on a row sub-view of Q and of the outputs). */
static qva_status dg_dense_rows(dg_state *s, const qvi_draft_plan *pl, const qva_tensor *q,
                                const qva_tensor *k, const qva_tensor *v, const qva_tensor *out,
                                const qva_tensor *lse, cudaStream_t st) {
    if (pl->dense_rows <= 0) return QVA_OK;
    const int BH = (int)(q->shape[0] * q->shape[1]), D = (int)q->shape[3];
    const int nq = (int)pl->dense_rows, nk = (int)k->shape[2];
    qvc_view qv = qvc_view_of(q);
    qv.data = (const char *)q->data +
              (size_t)(pl->dense_row0 * q->stride[2]) * qva_dtype_size(q->dtype);
    qv.N = nq;
    const qvc_view kv = qvc_kv_view(k, q), vv = qvc_kv_view(v, q);
    qvc_ops16 *o = &s->ops16;
    qva_status r;
    if (!(o->q && o->BH == BH && o->nq == nq && o->nk == nk && o->D == D)) {
        qvc_ops16_free(o);
        if ((r = qvc_ops16_alloc(o, BH, nq, nk, D)) != QVA_OK) return r;
    }
    if ((r = qvc_prep16(&qv, &kv, &vv, pl->use_f16, o, st)) != QVA_OK) return r;
    const qvc_attn_args a = dg_args(pl->scale_log2, q, out, lse, pl->dense_row0);
    return qvc_attn_bf16(o, pl->use_f16, &a, st);
}

/* The device layout of this call's grid and prefix (uploaded once). */
static qva_status dg_layout(dg_state *s, qva_context_t *ctx, const qva_config *cfg,
                            const qvi_draft_plan *pl) {
    const qva_draft_params *dp = &cfg->draft;
    const int key[6] = {dp->grid_h, dp->grid_w, dp->capacity, dp->grid_t, dp->prefix_tokens,
                        dp->prefix_at_end ? 1 : 0};
    if (s->lay.pack_to_orig && !memcmp(key, s->lay_key, sizeof key)) return QVA_OK;
    qvc_draft_layout_free(&s->lay);
    const qvi_partition *part = NULL;
    qvi_partition *owned = NULL;
    qva_status r = qvi_draft_partition_get(ctx, dp->grid_h, dp->grid_w, dp->capacity, &part, &owned);
    if (r != QVA_OK) return r;
    r = qvc_draft_layout_upload(part, dp->grid_t, dp->prefix_tokens, dp->prefix_at_end, &s->lay);
    if (owned) qvi_draft_partition_release(owned);
    if (r != QVA_OK) return r;
    /* The upload copies from pageable memory; make it visible to every
     * stream before the first kernel reads it. */
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        qvc_draft_layout_free(&s->lay);
        return qvc_cuda_fail(e, "draft: layout upload");
    }
    const qvc_draft_layout *L = &s->lay;
    /* Host self-check of what the kernels index by. */
    if (L->regions != pl->regions || L->n != pl->n || L->c != DG_KEYS ||
        L->prefix_pad % DG_KEYS != 0 || L->n_pack != L->prefix_pad + (int64_t)L->regions * DG_KEYS ||
        L->prefix_pad < L->prefix || L->prefix_pad - L->prefix >= DG_KEYS) {
        qva_status bad = qvi_fail(QVA_ERR_SHAPE,
                                  "draft: device layout (R = %d, N = %lld, C = %d, prefix_pad = "
                                  "%lld, n_pack = %lld) disagrees with the plan (R = %lld, N = %lld)",
                                  L->regions, (long long)L->n, L->c, (long long)L->prefix_pad,
                                  (long long)L->n_pack, (long long)pl->regions, (long long)pl->n);
        qvc_draft_layout_free(&s->lay);
        return bad;
    }
    memcpy(s->lay_key, key, sizeof key);
    return QVA_OK;
}

/* Whether the Hopper kernel gathers this call's 16-bit Q rows from the
 * caller's tensor (dw_gather_q) instead of a packed copy: Q already in the
 * operand's format (FP16 for f16, else BF16: the packed rows would be its
 * very bits), every row on a 16-byte boundary (cp.async), no +pooled
 * (which reads the packed Q), and no INT8 phase.  It halves Q's pass (the
 * pooling only) and adds the gather's latency to each CTA's start (bench/
 * NOTES.md, "Q read in place"): at Wan2.2-720p 0.27 ms less preparation
 * against 0.10 ms more kernel without an INT8 phase, and with one (Q's
 * pass still writes the INT8 codes) 0.21 less against 0.23 more, so those
 * calls keep the packed Q.  K stays packed: gathering a K tile per block
 * cost the kernel more than its pack.  The dev driver's kernel versions
 * read the packed Q. */
static int dg_direct_q_ok(const qvi_draft_plan *pl, const qvc_view *qv, int hopper,
                          const qvc_dev_kernels *dev) {
    return hopper && !(dev && dev->draft_ws) && !pl->pooled && !pl->with8 &&
           qv->dtype == (pl->use_f16 ? QVA_F16 : QVA_BF16) && qvc_view_vec_ok(qv, 8);
}

/* The Hopper block-sparse kernel, or the dev driver's version of it. */
static qva_status dg_launch_ws(const dg_params *p, const qvc_view *qv, int BH, int D, int f16,
                               const qvc_dev_kernels *dev, cudaStream_t st) {
    qvc_draft_ws_args w;
    memset(&w, 0, sizeof w);
    w.BH = BH, w.R = p->R, w.D = D, w.prefix = p->prefix, w.expcast = p->expcast, w.f16 = f16;
    w.with8 = p->with8, w.int8_acc16 = p->int8_acc16;
    w.n_pack = p->n_pack, w.prefix_pad = p->prefix_pad;
    w.q16 = p->ops.q16, w.k16 = p->ops.k16, w.v16t = p->ops.v16t;
    w.q8 = p->ops.q8, w.k8 = p->ops.k8, w.v8t = p->ops.v8t;
    w.q8s = p->ops.q8s, w.k8s = p->ops.k8s, w.dv = p->ops.dv;
    w.q_rows_per_scale = p->ops.q_rows_per_scale;
    w.count = p->count, w.pack = p->pack, w.offsets = p->offsets, w.cols = p->cols;
    w.scale_log2 = p->scale_log2, w.eta = p->eta;
    w.a = p->a;
    w.direct_q = p->ops.direct_q, w.qv = *qv;
    if (dev && dev->draft_ws) return dev->draft_ws(&w, st);
    return qvc_attn_draft_ws_128x128(&w, st);
}

/* What the kernels index by fits: the head dim, B*H (grid y), N. */
static qva_status dg_check_shape(const qvi_draft_plan *pl, const qva_tensor *q) {
    const int64_t BH64 = q->shape[0] * q->shape[1];
    const int D = (int)q->shape[3];
    if (D != 64 && D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft (cuda): head dim %d (64 or 128)", D);
    if (BH64 > 65535)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft (cuda): B*H = %lld exceeds 65535",
                        (long long)BH64);
    if (pl->n > INT32_MAX - DG_KEYS)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft (cuda): N = %lld too large", (long long)pl->n);
    return QVA_OK;
}

/* The layout, the route buffers and the operands for this call's shape. */
static qva_status dg_buffers(dg_state *s, qva_context_t *ctx, const qva_config *cfg,
                             const qvi_draft_plan *pl, int BH, int D, int direct_q) {
    qva_status r = dg_layout(s, ctx, cfg, pl);
    if (r != QVA_OK) return r;
    const qvc_draft_layout *L = &s->lay;
    const int R = L->regions;
    if (!(s->route.A && s->route.BH == BH && s->route.R == R && s->route.D == D)) {
        qvc_draft_route_free(&s->route);
        if ((r = qvc_draft_route_alloc(&s->route, BH, R, D)) != QVA_OK) return r;
    }
    return dg_ops_ensure(&s->ops, BH, R, D, L->n_pack, pl->with4, pl->with8, direct_q);
}

/* The rest of the preparation forked onto the side stream: it starts
 * after the Q and K packs (which pool for the router) and overlaps the
 * router; s->join marks its end. */
static qva_status dg_fork_prep(dg_state *s, const qvi_draft_plan *pl, const qvc_view xv[3],
                               cudaStream_t st) {
    cudaError_t e;
    qva_status r;
    if ((r = dg_side_ensure(s)) != QVA_OK) return r;
    if ((e = cudaEventRecord(s->fork, st)) != cudaSuccess ||
        (e = cudaStreamWaitEvent(s->side, s->fork, 0)) != cudaSuccess)
        return qvc_cuda_fail(e, "draft: fork the preparation");
    if ((r = dg_prep_rest(pl, &s->lay, &xv[0], &xv[1], &xv[2], &s->ops, s->side)) != QVA_OK)
        return r;
    if ((e = cudaEventRecord(s->join, s->side)) != cudaSuccess)
        return qvc_cuda_fail(e, "draft: join the preparation");
    return QVA_OK;
}

/* What the stats of this call need: the plan's quotas, or (MASS) an
 * event after the router, so that reading the heads' quotas later waits
 * for it and for nothing else. */
static qva_status dg_stats_mark(dg_state *s, const qvi_draft_plan *pl, cudaStream_t st) {
    s->stats_mass = pl->mass;
    s->stats_BH = s->route.BH;
    s->stats_M = pl->regions * pl->regions;
    s->stats_skip = pl->quota[QVI_Q_SKIP];
    if (!pl->mass) return QVA_OK;
    cudaError_t e = cudaSuccess;
    if (!s->routed) e = cudaEventCreateWithFlags(&s->routed, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(s->routed, st);
    return e == cudaSuccess ? QVA_OK : qvc_cuda_fail(e, "draft: route event");
}

/* qvi_draft_stats_fn of a routed call: the CPU reference's stats, head by
 * head in (batch, head) order.  Under MASS this waits for the router of
 * that call (only when the stats are asked for) and copies its B*H
 * quotas; no later call has rewritten them, since every call replaces
 * these pending stats first. */
static qva_status dg_stats_read(void *arg, qva_draft_stats *out) {
    const dg_state *s = (const dg_state *)arg;
    memset(out, 0, sizeof *out);
    if (!s->stats_mass) {
        for (int64_t h = 0; h < s->stats_BH; ++h) qvi_draft_stats_add(out, s->stats_M, s->stats_skip);
        qvi_draft_stats_finish(out);
        return QVA_OK;
    }
    const size_t n = (size_t)s->stats_BH * 4;
    int64_t *hq = (int64_t *)malloc(n * sizeof(int64_t));
    if (!hq) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft (cuda): stats");
    cudaError_t e = cudaEventSynchronize(s->routed);
    if (e == cudaSuccess)
        e = cudaMemcpy(hq, s->route.head_quota, n * sizeof(int64_t), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) {
        for (int64_t h = 0; h < s->stats_BH; ++h)
            qvi_draft_stats_add(out, s->stats_M, hq[h * 4 + QVI_Q_SKIP]);
        qvi_draft_stats_finish(out);
    }
    free(hq);
    return e == cudaSuccess ? QVA_OK : qvc_cuda_fail(e, "draft (cuda): stats");
}

/* The Q and K packs, which also pool for the router, then the router on
 * the high-priority stream and the rest of the preparation beside it; the
 * caller's stream waits for both before the kernel.  Timings: grouping_ms is the packs and the
 * router, prep_ms the part of the rest not hidden under them.  serial
 * (the dev driver, to time the overlap) runs the router with its own
 * pooling first and the whole preparation after it, on the caller's
 * stream. */
static qva_status dg_route_prep(dg_state *s, const qva_config *cfg, const qvi_draft_plan *pl,
                                const qvc_view xv[3], int serial, int prof, cudaStream_t st) {
    qva_status r;
    if (serial) {
        r = qvc_draft_route(&xv[0], &xv[1], cfg, &s->lay, &s->route, st);
    } else {
        if ((r = dg_prep_qk(pl, &s->lay, &xv[0], &xv[1], &s->ops, &s->route, st)) != QVA_OK ||
            (r = dg_fork_prep(s, pl, xv, st)) != QVA_OK)
            return r;
        cudaError_t e;
        if ((e = cudaStreamWaitEvent(s->hi, s->fork, 0)) != cudaSuccess)
            return qvc_cuda_fail(e, "draft: fork the router");
        r = qvc_draft_route_pooled(&xv[0], &xv[1], cfg, &s->lay, &s->route, s->hi);
        /* joined even after a failed launch: st stays after the router */
        if ((e = cudaEventRecord(s->routed_hi, s->hi)) != cudaSuccess ||
            (e = cudaStreamWaitEvent(st, s->routed_hi, 0)) != cudaSuccess)
            return qvc_cuda_fail(e, "draft: join the router");
    }
    if (r != QVA_OK) return r;
    /* Under MASS the plan has no quotas (each head's are on the device). */
    if (s->route.mass != pl->mass ||
        (!pl->mass && memcmp(s->route.quota, pl->quota, sizeof pl->quota)))
        return qvi_fail(QVA_ERR_SHAPE, "draft (cuda): router quotas differ from the plan's");
    if ((r = dg_stats_mark(s, pl, st)) != QVA_OK) return r;
    if ((r = qvc_timer_mark(&s->timer, 1, prof, st)) != QVA_OK) return r;
    if (serial) return dg_prep(pl, &s->lay, &xv[0], &xv[1], &xv[2], &s->ops, st);
    const cudaError_t e = cudaStreamWaitEvent(st, s->join, 0);
    return e == cudaSuccess ? QVA_OK : qvc_cuda_fail(e, "draft: wait for the preparation");
}

/* The phased kernel's arguments: the state's layout, route and operands. */
static dg_params dg_params_of(const dg_state *s, const qvi_draft_plan *pl, const qva_tensor *q,
                              const qva_tensor *out, const qva_tensor *lse) {
    const qvc_draft_layout *L = &s->lay;
    dg_params p;
    memset(&p, 0, sizeof p);
    p.ops = s->ops;
    p.R = L->regions;
    p.n_pack = L->n_pack;
    p.prefix_pad = L->prefix_pad;
    p.prefix = L->prefix;
    p.count = L->count;
    p.pack = L->pack_to_orig;
    p.offsets = s->route.offsets;
    p.cols = s->route.cols;
    p.scale_log2 = pl->scale_log2;
    p.eta = pl->eta;
    p.expcast = pl->expcast;
    p.with8 = pl->with8;
    p.int8_acc16 = pl->int8_acc16;
    p.a = dg_args(pl->scale_log2, q, out, lse, 0);
    p.a.expcast_add = qvi_expcast_addend(qvi_expcast_beta(pl->expcast));
    return p;
}

/* The last phase mark and, when profiling, the timings. */
static qva_status dg_finish(qva_context_t *ctx, dg_state *s, int prof, cudaStream_t st) {
    const qva_status r = qvc_timer_mark(&s->timer, 3, prof, st);
    if (r != QVA_OK) return r;
    return prof ? qvc_timer_finish(ctx, &s->timer) : QVA_OK;
}

/* Phase timings (dg_route_prep): grouping_ms is the Q and K packs and the
 * router, prep_ms the rest of the preparation not hidden under them,
 * kernel_ms the phased kernel and the dense rows. */
extern "C" qva_status qvc_draft_attention(qva_context_t *ctx, const qva_config *cfg,
                                          const qva_tensor *q, const qva_tensor *k,
                                          const qva_tensor *v, const qva_tensor *out,
                                          const qva_tensor *lse) {
    qvi_draft_plan pl;
    qva_status r = qvi_draft_plan_make(cfg, q, &pl);
    if (r != QVA_OK || (r = dg_check_shape(&pl, q)) != QVA_OK) return r;
    const int BH = (int)(q->shape[0] * q->shape[1]), D = (int)q->shape[3];
    cudaStream_t st = (cudaStream_t)qvi_context_stream(ctx);
    dg_state *s = dg_get_state(ctx);
    if (!s) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft (cuda): state");
    const int prof = qvi_context_profiling(ctx);
    const qvc_view xv[3] = {qvc_view_of(q), qvc_kv_view(k, q), qvc_kv_view(v, q)};
    if ((r = qvc_check_view("draft", &xv[0], "q")) || (r = qvc_check_view("draft", &xv[1], "k")) ||
        (r = qvc_check_view("draft", &xv[2], "v")))
        return r;

    if ((r = qvc_timer_mark(&s->timer, 0, prof, st)) != QVA_OK) return r;
    if (pl.warmup) { /* docs/DRAFT.md §5: exactly the bf16 method */
        if ((r = qvc_timer_mark(&s->timer, 1, prof, st)) ||
            (r = qvc_timer_mark(&s->timer, 2, prof, st)) ||
            (r = dg_dense_rows(s, &pl, q, k, v, out, lse, st)))
            return r;
        return dg_finish(ctx, s, prof, st);
    }

    const qvc_dev_kernels *dev = qvc_dev_kernels_of(ctx);
    const int hopper = qvc_choose_kernel(cfg, D, q->shape[1] / k->shape[1], NULL, 0) ==
                       QVC_KERNEL_ATTN_DRAFT_WS_128X128;
    if (hopper == pl.with4) /* dg_check_shape allowed head dims 64 and 128 only */
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft (cuda): the chooser and the plan disagree");
    if ((r = dg_buffers(s, ctx, cfg, &pl, BH, D, dg_direct_q_ok(&pl, &xv[0], hopper, dev))) !=
        QVA_OK)
        return r;
    const int serial = dev && dev->serial_draft_prep;
    if ((r = dg_route_prep(s, cfg, &pl, xv, serial, prof, st)) != QVA_OK) return r;
    if ((r = qvc_timer_mark(&s->timer, 2, prof, st)) != QVA_OK) return r;

    /* +pooled merges through the kept part's LSE: the caller's, or ours */
    qva_tensor lse_own;
    if (pl.pooled &&
        (r = dg_pooled_ensure(&s->pooled, BH, s->lay.regions, D, q->shape[2])) != QVA_OK)
        return r;
    if (pl.pooled && !lse) {
        lse_own = qva_tensor_hnd(s->pooled.lse, QVA_F32, QVA_DEVICE_CUDA, q->shape[0],
                                 q->shape[1], q->shape[2], 1);
        lse = &lse_own;
    }
    const dg_params p = dg_params_of(s, &pl, q, out, lse);
    r = hopper ? dg_launch_ws(&p, &xv[0], BH, D, pl.use_f16, dev, st)
               : dg_launch_mma(&p, BH, D, pl.use_f16, st);
    if (r != QVA_OK) return r;
    /* The prefix queries: dense over every key, as the bf16 method.  The
     * Hopper kernel computes them itself (its prefix-query CTAs). */
    if (!hopper && (r = dg_dense_rows(s, &pl, q, k, v, out, lse, st)) != QVA_OK) return r;
    if (pl.pooled && (r = dg_pooled_merge(&s->pooled, &xv[2], &s->lay, &s->route, &s->ops,
                                          &p.a, pl.use_f16, st)) != QVA_OK)
        return r;
    if ((r = dg_finish(ctx, s, prof, st)) != QVA_OK) return r;
    qvi_context_set_draft_stats_lazy(ctx, dg_stats_read, s); /* only a call that ran reports */
    return QVA_OK;
}
