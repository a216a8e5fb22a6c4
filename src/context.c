/* The context: its lock, stream, profiling and timings, its per-layer
 * V-Smooth state and its module slots (see "Threads" in qvattn.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

/* ------------------------------------------------------------ context */
typedef struct vs_entry {
    int layer;
    int64_t b, h;
    qvi_vs_state st;
} vs_entry;

/* Every field but device (fixed at creation) is read and written only
 * under lock: see "Threads" in include/qvattn.h. */
struct qva_context {
    pthread_mutex_t lock;
    qva_device device;
    void *stream;
    int profiling;
    qva_timings timings;
    qvi_timings_fn timings_fn; /* pending: timings not yet read */
    void *timings_arg;
    qva_draft_stats draft_stats;
    qvi_draft_stats_fn draft_stats_fn; /* pending: draft_stats not yet read */
    void *draft_stats_arg;
    vs_entry *vs;
    size_t vs_len, vs_cap;
    void *slots[QVI_SLOT_COUNT_];
    void (*slot_dtor[QVI_SLOT_COUNT_])(void *);
};

qva_status qva_context_create(qva_context_t **ctx, qva_device device) {
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    *ctx = NULL;
    if (device != QVA_DEVICE_CPU && device != QVA_DEVICE_CUDA)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "unknown device %d", (int)device);
    if (device == QVA_DEVICE_CUDA && !qva_cuda_available())
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "no CUDA device (or library built without CUDA)");
    qva_context_t *c = calloc(1, sizeof *c);
    if (!c) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "context allocation");
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "context lock");
    }
    c->device = device;
    *ctx = c;
    return QVA_OK;
}

static void free_state(qva_context_t *c) {
    for (size_t i = 0; i < c->vs_len; ++i) {
        free(c->vs[i].st.perm);
        free(c->vs[i].st.centroids);
    }
    free(c->vs);
    c->vs = NULL;
    c->vs_len = c->vs_cap = 0;
    for (int s = 0; s < QVI_SLOT_COUNT_; ++s) {
        if (c->slots[s] && c->slot_dtor[s]) c->slot_dtor[s](c->slots[s]);
        c->slots[s] = NULL;
    }
}

void qva_context_free(qva_context_t *ctx) {
    if (!ctx) return;
    free_state(ctx);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

/* Reads pending stats into ctx->draft_stats (zero heads on failure). */
static qva_status resolve_draft_stats(qva_context_t *c) {
    if (!c->draft_stats_fn) return QVA_OK;
    qva_draft_stats st;
    memset(&st, 0, sizeof st);
    const qva_status r = c->draft_stats_fn(c->draft_stats_arg, &st);
    if (r != QVA_OK) memset(&st, 0, sizeof st);
    c->draft_stats = st;
    c->draft_stats_fn = NULL;
    c->draft_stats_arg = NULL;
    return r;
}

static qva_status resolve_timings(qva_context_t *c) {
    if (!c->timings_fn) return QVA_OK;
    qva_timings t;
    memset(&t, 0, sizeof t);
    const qva_status r = c->timings_fn(c->timings_arg, &t);
    if (r != QVA_OK) memset(&t, 0, sizeof t);
    c->timings = t;
    c->timings_fn = NULL;
    c->timings_arg = NULL;
    return r;
}

qva_status qva_context_reset(qva_context_t *ctx) {
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    qvi_context_lock(ctx);
    (void)resolve_draft_stats(ctx); /* the stats outlive the slots, as on the CPU */
    (void)resolve_timings(ctx);     /* so do the timings */
    free_state(ctx);
    qvi_context_unlock(ctx);
    return QVA_OK;
}

qva_status qva_context_set_stream(qva_context_t *ctx, void *stream) {
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    qvi_context_lock(ctx);
    ctx->stream = stream;
    qvi_context_unlock(ctx);
    return QVA_OK;
}

void qvi_context_lock(qva_context_t *ctx) { pthread_mutex_lock(&ctx->lock); }
void qvi_context_unlock(qva_context_t *ctx) { pthread_mutex_unlock(&ctx->lock); }

void *qvi_context_stream(const qva_context_t *ctx) { return ctx->stream; }
qva_device qvi_context_device(const qva_context_t *ctx) { return ctx->device; }
int qvi_context_profiling(const qva_context_t *ctx) { return ctx->profiling; }
void qvi_context_set_timings(qva_context_t *ctx, const qva_timings *t) {
    ctx->timings = *t;
    ctx->timings_fn = NULL;
    ctx->timings_arg = NULL;
}

void qvi_context_set_timings_lazy(qva_context_t *ctx, qvi_timings_fn fn, void *arg) {
    memset(&ctx->timings, 0, sizeof ctx->timings);
    ctx->timings_fn = fn;
    ctx->timings_arg = arg;
}

void qvi_context_set_draft_stats(qva_context_t *ctx, const qva_draft_stats *st) {
    ctx->draft_stats = *st;
    ctx->draft_stats_fn = NULL;
    ctx->draft_stats_arg = NULL;
}

void qvi_context_set_draft_stats_lazy(qva_context_t *ctx, qvi_draft_stats_fn fn, void *arg) {
    memset(&ctx->draft_stats, 0, sizeof ctx->draft_stats);
    ctx->draft_stats_fn = fn;
    ctx->draft_stats_arg = arg;
}

qva_status qva_context_last_draft_stats(const qva_context_t *ctx, qva_draft_stats *st) {
    if (!ctx || !st) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "NULL argument");
    qva_context_t *c = (qva_context_t *)ctx; /* the lock is not the state */
    qvi_context_lock(c);
    const qva_status r = resolve_draft_stats(c);
    *st = c->draft_stats;
    qvi_context_unlock(c);
    return r;
}

qva_status qva_context_set_profiling(qva_context_t *ctx, int on) {
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    qvi_context_lock(ctx);
    ctx->profiling = on != 0;
    qvi_context_unlock(ctx);
    return QVA_OK;
}

qva_status qva_context_last_timings(const qva_context_t *ctx, qva_timings *t) {
    if (!ctx || !t) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "NULL argument");
    qva_context_t *c = (qva_context_t *)ctx; /* the lock is not the state */
    qvi_context_lock(c);
    const qva_status r = resolve_timings(c);
    *t = c->timings;
    qvi_context_unlock(c);
    return r;
}

void **qvi_context_slot(qva_context_t *ctx, qvi_slot slot,
                        void (**dtor)(void *)) {
    if (dtor && *dtor) ctx->slot_dtor[slot] = *dtor; /* register */
    else if (dtor) *dtor = ctx->slot_dtor[slot];     /* query    */
    return &ctx->slots[slot];
}

void qvi_context_carry_shape(qva_context_t *ctx, int layer, const int64_t shape[3]) {
    for (size_t i = 0; i < ctx->vs_len; ++i) {
        qvi_vs_state *st = &ctx->vs[i].st;
        if (ctx->vs[i].layer != layer || !memcmp(st->carry_shape, shape, sizeof st->carry_shape))
            continue;
        st->kmean_d = st->vscale_d = 0;
        memcpy(st->carry_shape, shape, sizeof st->carry_shape);
    }
}

qvi_vs_state *qvi_context_vs_state(qva_context_t *ctx, int layer, int64_t b,
                                   int64_t h) {
    for (size_t i = 0; i < ctx->vs_len; ++i)
        if (ctx->vs[i].layer == layer && ctx->vs[i].b == b && ctx->vs[i].h == h)
            return &ctx->vs[i].st;
    if (ctx->vs_len == ctx->vs_cap) {
        size_t cap = ctx->vs_cap ? 2 * ctx->vs_cap : 64;
        vs_entry *p = realloc(ctx->vs, cap * sizeof *p);
        if (!p) return NULL;
        ctx->vs = p;
        ctx->vs_cap = cap;
    }
    vs_entry *e = &ctx->vs[ctx->vs_len++];
    memset(e, 0, sizeof *e);
    e->layer = layer;
    e->b = b;
    e->h = h;
    e->st.last_group_step = -1;
    return &e->st;
}

