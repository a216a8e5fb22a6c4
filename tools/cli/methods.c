/*
 * Running methods: the --methods list, device choice, GPU copies of the
 * input and the timed qva_attention calls that eval and bench share.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ------------------------------------------------------------ devices */
static int parse_device(const opts *o, dev_mode *m) {
    const char *s = o->device ? o->device : "auto";
    if (!strcmp(s, "cpu")) *m = DEV_CPU;
    else if (!strcmp(s, "cuda")) *m = DEV_CUDA;
    else if (!strcmp(s, "auto")) *m = DEV_AUTO;
    else return usage_error("--device must be cpu, cuda or auto, not '%s'", s);
    if (*m == DEV_CUDA && !qva_cuda_available())
        return runtime_error("--device cuda: no CUDA device available (%s)",
                             qva_build_info());
    return RC_OK;
}

static void gpu_free(gpu_state *g) {
    void *p[4] = {g->q, g->k, g->v, g->out};
    for (int i = 0; i < 4; ++i)
        if (p[i]) qva_device_free(p[i]);
    memset(g, 0, sizeof *g);
}

/* q, k, v as the library is given them (f32, or the 16-bit codes of
 * --dtype) and an f32 output. */
static qva_status gpu_upload(gpu_state *g, const workload *w, size_t out_elems) {
    const qio_qkv *x = &w->x;
    const int half = w->dtype != QVA_F32;
    const size_t es = half ? sizeof(uint16_t) : sizeof(float);
    size_t nq = (size_t)(x->B * x->H * x->Nq * x->D) * es;
    size_t nk = (size_t)(x->B * x->H * x->N * x->D) * es;
    const void *q = half ? (const void *)w->q16 : (const void *)x->q;
    const void *k = half ? (const void *)w->k16 : (const void *)x->k;
    const void *v = half ? (const void *)w->v16 : (const void *)x->v;
    qva_status st;
    if ((st = qva_device_malloc(&g->q, nq)) || (st = qva_device_malloc(&g->k, nk)) ||
        (st = qva_device_malloc(&g->v, nk)) ||
        (st = qva_device_malloc(&g->out, out_elems * sizeof(float))) ||
        (st = qva_memcpy_to_device(g->q, q, nq)) ||
        (st = qva_memcpy_to_device(g->k, k, nk)) ||
        (st = qva_memcpy_to_device(g->v, v, nk)))
        return st;
    g->ready = 1;
    return QVA_OK;
}

qva_device pick_device(dev_mode m, const qva_config *cfg, qva_dtype dt, int64_t D,
                       char *note, size_t len) {
    char why[200] = "";
    if (m == DEV_CPU || !qva_cuda_available()) return QVA_DEVICE_CPU;
    if (qva_supports(QVA_DEVICE_CUDA, cfg, dt, D, why, sizeof why))
        return QVA_DEVICE_CUDA;
    snprintf(note, len, "cuda cannot run it (%s); ran on cpu", why);
    return QVA_DEVICE_CPU;
}

/* ------------------------------------------------------------ methods */
static int check_schedule(const opts *o) {
    int step = opt_or(o->step, 0), steps = opt_or(o->steps, 0);
    if (step < 0) return usage_error("--step must be >= 0");
    if (steps < 0) return usage_error("--steps must be >= 0");
    if (steps > 0 && step >= steps)
        return usage_error("--step %d is outside --steps %d", step, steps);
    return RC_OK;
}

/* Everything but the method: layout and schedule position. */
static void apply_workload(qva_config *cfg, const opts *o, const workload *w) {
    cfg->layer = opt_or(o->layer, 0);
    cfg->step = opt_or(o->step, 0);
    cfg->num_steps = opt_or(o->steps, 0);
    if (!w->has_grid) return;
    cfg->draft.grid_t = w->grid[0];
    cfg->draft.grid_h = w->grid[1];
    cfg->draft.grid_w = w->grid[2];
    cfg->draft.prefix_tokens = w->prefix;
    cfg->draft.prefix_at_end = w->prefix_at_end;
}

static int add_method(method_list *ml, const char *name, int explicit_list,
                      const opts *o, const workload *w) {
    method_run *mr = &ml->v[ml->n];
    memset(mr, 0, sizeof *mr);
    if (!*name) return usage_error("empty method name in --methods");
    if (strlen(name) >= sizeof mr->name) return usage_error("method name too long: '%s'", name);
    for (int i = 0; i < ml->n; ++i) /* names key the JSON object */
        if (!strcmp(ml->v[i].name, name)) return usage_error("method %s listed twice", name);
    strcpy(mr->name, name);
    qva_config_default(&mr->cfg);
    if (qva_config_set_method(&mr->cfg, name) != QVA_OK)
        return usage_error("%s", qva_last_error());
    apply_workload(&mr->cfg, o, w);
    if (mr->cfg.method == QVA_METHOD_DRAFT && !w->has_grid) {
        if (explicit_list)
            return usage_error("method %s needs the video layout: pass --grid "
                               "T,H,W (and --prefix P)", name);
        snprintf(mr->skip, sizeof mr->skip, "needs --grid T,H,W (and --prefix P)");
    }
    ++ml->n;
    return RC_OK;
}

/* Splits --methods (or the default list) and validates every name. */
static int build_methods(const opts *o, const workload *w, method_list *ml) {
    char buf[1024];
    const char *list = o->methods ? o->methods : DEFAULT_METHODS;
    if (strlen(list) >= sizeof buf) return usage_error("--methods list too long");
    strcpy(buf, list);
    ml->n = 0;
    for (char *tok = buf, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        while (*tok == ' ') ++tok;
        char *end = tok + strlen(tok);
        while (end > tok && end[-1] == ' ') *--end = '\0';
        if (ml->n >= MAX_METHODS) return usage_error("more than %d methods", MAX_METHODS);
        int rc = add_method(ml, tok, o->methods != NULL, o, w);
        if (rc) return rc;
    }
    return RC_OK;
}

/* ------------------------------------------------------------ session */
int method_session_open(method_session *s) {
    memset(s, 0, sizeof *s);
    s->ml = calloc(1, sizeof *s->ml);
    return s->ml ? RC_OK : runtime_error("out of memory");
}

int method_session_prepare(method_session *s, const opts *o, int allow_rows) {
    int rc = parse_device(o, &s->run.mode);
    if (!rc) rc = check_schedule(o);
    if (!rc) rc = load_workload(o, "wan-small", &s->w);
    if (!rc) rc = resolve_grid(o, &s->w);
    if (!rc) rc = build_methods(o, &s->w, s->ml);
    if (!rc) rc = make_views(o, &s->w, allow_rows, &s->vw);
    s->run.w = &s->w;
    s->run.vw = &s->vw;
    return rc;
}

void method_session_close(method_session *s) {
    gpu_free(&s->run.gpu);
    free(s->ml);
    workload_free(&s->w);
}

/* ------------------------------------------------------------ running */
static qva_tensor retarget(qva_tensor t, void *data) {
    t.data = data;
    t.device = QVA_DEVICE_CUDA;
    return t;
}

/* One qva_attention call on dev into `out` (host f32, contiguous), timed;
 * a cuda output is copied back after the clock stops. */
static qva_status call_once(runner *r, qva_context_t *ctx, const qva_config *cfg,
                            qva_device dev, float *out, double *ms) {
    const views *vw = r->vw;
    qva_tensor o = qva_tensor_hnd(out, QVA_F32, QVA_DEVICE_CPU, vw->B, vw->H,
                                  vw->R, vw->D);
    qva_tensor q = vw->q, k = vw->k, v = vw->v;
    if (dev == QVA_DEVICE_CUDA) {
        q = retarget(q, r->gpu.q);
        k = retarget(k, r->gpu.k);
        v = retarget(v, r->gpu.v);
        o = retarget(o, r->gpu.out);
    }
    double t0 = now_ms();
    qva_status st = qva_attention(ctx, cfg, &q, &k, &v, &o, NULL);
    if (st == QVA_OK && dev == QVA_DEVICE_CUDA) st = qva_device_synchronize();
    *ms = now_ms() - t0;
    if (st == QVA_OK && dev == QVA_DEVICE_CUDA)
        st = qva_memcpy_to_host(out, r->gpu.out, vw->out_elems * sizeof(float));
    return st;
}

/* A failure that only means "this method needs every query row": under a
 * row subset, shape/unsupported errors become a skip with the reason. */
static int skip_or_fail(const runner *r, method_run *mr, qva_status st) {
    if (r->vw->R != r->vw->N && (st == QVA_ERR_SHAPE || st == QVA_ERR_UNSUPPORTED)) {
        snprintf(mr->skip, sizeof mr->skip, "needs every query row: %s",
                 qva_last_error());
        return RC_OK;
    }
    char what[128];
    snprintf(what, sizeof what, "method %s on %s", mr->name,
             mr->dev == QVA_DEVICE_CUDA ? "cuda" : "cpu");
    return lib_error(st, what);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs mr `iters` times (after `warmup` untimed calls) on a fresh context,
 * so no method inherits another's per-layer state. */
int run_method(runner *r, method_run *mr, int warmup, int iters, float *out) {
    qva_context_t *ctx = NULL;
    double *t = calloc((size_t)iters, sizeof *t);
    mr->dev = pick_device(r->mode, &mr->cfg, r->vw->q.dtype, r->vw->D, mr->note,
                          sizeof mr->note);
    qva_status st = t ? QVA_OK : QVA_ERR_OUT_OF_MEMORY;
    if (st == QVA_OK && mr->dev == QVA_DEVICE_CUDA && !r->gpu.ready)
        st = gpu_upload(&r->gpu, r->w, r->vw->out_elems);
    if (st == QVA_OK) st = qva_context_create(&ctx, mr->dev);
    for (int i = 0; st == QVA_OK && i < warmup; ++i) {
        double ms;
        st = call_once(r, ctx, &mr->cfg, mr->dev, out, &ms);
    }
    for (int i = 0; st == QVA_OK && i < iters; ++i)
        st = call_once(r, ctx, &mr->cfg, mr->dev, out, &t[i]);
    if (st == QVA_OK) st = qva_context_last_draft_stats(ctx, &mr->draft);
    qva_context_free(ctx);
    int rc = st == QVA_OK ? RC_OK : skip_or_fail(r, mr, st);
    if (st == QVA_OK) {
        qsort(t, (size_t)iters, sizeof *t, cmp_double);
        mr->ms = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
        mr->ms_min = t[0];
    }
    free(t);
    return rc;
}

const char *dev_name(qva_device d) {
    return d == QVA_DEVICE_CUDA ? "cuda" : "cpu";
}

int method_col(const method_list *ml) {
    size_t w = METHOD_COL;
    for (int i = 0; i < ml->n; ++i)
        if (strlen(ml->v[i].name) > w) w = strlen(ml->v[i].name);
    return (int)w;
}

void progress(const method_run *m, int i, int n, double t_start) {
    if (now_ms() - t_start < PROGRESS_AFTER_MS) return;
    if (m->skip[0]) fprintf(stderr, "[%d/%d] %s: skipped\n", i, n, m->name);
    else fprintf(stderr, "[%d/%d] %s: %.1f ms on %s\n", i, n, m->name, m->ms,
                 dev_name(m->dev));
}

