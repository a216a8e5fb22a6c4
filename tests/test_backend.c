/*
 * The one backend driver (after ggml's test-backend-ops): every case runs on
 * every available backend.
 *   test mode (default): the CPU reference of each method is checked against
 *     `exact` with a per-method accuracy ceiling, and each other backend
 *     (CUDA, when built and present and when supports() says yes) is
 *     checked against the CPU reference of the same method with a
 *     per-element atol + rtol*|ref| and a global normalized error.  Outputs
 *     are poisoned with NaN before every run; NaN/Inf or an unwritten
 *     element fails.
 *   perf mode (`test_backend perf`): times each method per backend.
 *   hash mode (`test_backend hash`): runs every CUDA case without the CPU
 *     and prints a 64-bit hash of each output's and LSE's bits, so two
 *     builds can be compared bit for bit (scripts/gpu-check.sh --compare);
 *     with a method prefix only those methods (a quick sanitizer run).
 *     `test_backend hash-qblock` runs sage8, vc8 and draft with +qblock
 *     (the papers' per-block query scales) and prints them under their
 *     plain names, to compare with a build from before per-row scales.
 *   test mode with CUDA also runs the non-finite cases (run_nonfinite):
 *     scores that overflow FP32 and a NaN input with check_finite = 0 must
 *     give every row the same kind (finite, NaN, empty) on both backends;
 *     draft's INT8 partials where FP32 and FP16 part (run_int8_acc); and
 *     +kprev's and +vprev's carried statistics over three calls
 *     (run_carried); +vsample's own-scale cases bit for bit (run_sampled).
 *   test mode on every backend: draft's +vsample against its own scales on
 *     rows the sample holds or misses (run_draft_sampled).
 */
#define _POSIX_C_SOURCE 199309L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "draft/partition.h"
#include "internal.h"

typedef struct tol {
    const char *method;
    double ceiling_vs_exact; /* CPU reference: rel-L2 vs exact must be below */
    double atol, rtol, rel_l2; /* other backend vs CPU reference            */
    int draft_warmup;          /* draft: run step 0 of a 1-step dense warm-up */
    const char *warmup_as;     /* draft warm-up: draft.warmup_method (its
                                  tolerances are this entry's); NULL: bf16 */
} tol;

/* Ceilings are sanity bounds on random data (not fidelity claims); the
 * GPU-vs-CPU tolerances are docs/NUMERICS.md §Tolerances.  Draft configs
 * that skip pairs are far from exact on random inputs (no locality:
 * docs/DRAFT.md §7), so their ceiling only catches garbage. */
static const tol TOLS[] = {
    {"bf16", 0.02, 2e-3, 2e-2, 2e-3, 0, NULL},
    {"fp8", 0.25, 2e-2, 5e-2, 2e-2, 0, NULL},
    {"fp8+expcast", 0.25, 2e-2, 5e-2, 2e-2, 0, NULL},
    {"sage8", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"sage8+nohadamard+fp32sum", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL}, /* SageAttention2's form */
    {"sage8+qblock", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+expcast", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+nohadamard", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+expcast+nohadamard", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+expcast+qblock", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+expcast-centred", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    /* ExpCast's code in E5M2 (the CPU reference only so far) */
    {"vc8+expcast-e5m2", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"sage8+expcast-e5m2", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    /* ExpCast's floor mass put back (the CPU reference only so far) */
    {"vc8+expcast+floormass", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"sage8+expcast-centred+floormass", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+hadamard+expcast-centred+floormass", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    /* P coded against each block's own max */
    {"vc8+expcast-centred+pblock", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+pblock", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"sage8+nohadamard+fp32sum+pblock", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    /* statistics from a sample (NUMERICS §3): the device's sampled K mean
     * and V scales are the CPU's, so the usual 8-bit tolerances */
    {"sage8+ksample+vsample", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"sage8+nohadamard+ksample", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+expcast-centred+pblock+ksample+vsample", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    /* the exp2 P's row sum: sage8 and vc8 sum the decoded codes by
     * default, +fp32sum the FP32 weights */
    {"sage8+nohadamard", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+fp32sum", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"fp8+codesum", 0.25, 2e-2, 5e-2, 2e-2, 0, NULL},
    /* V in two E4M3 digits (CUDA: head dim 128) */
    {"sage8+v2", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+expcast+v2", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+hadamard+expcast-centred+v2", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    /* the PV product in integers (CUDA: head dim 128) */
    {"sage8+i8pv", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+i8pv", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"vc8+fp32sum+i8pv", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL}, /* l the weights' FP32 sum */
    {"sage8+fp32sum+i8pv", 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"sage4", 0.5, 5e-2, 1e-1, 5e-2, 0, NULL},
    {"sage4+hadamard", 0.5, 5e-2, 1e-1, 5e-2, 0, NULL},
    {"vc4", 0.5, 5e-2, 1e-1, 5e-2, 0, NULL},
    /* draft: the tolerance of the lowest precision phase the config uses */
    {"draft@0/0/0/100", 0.02, 2e-3, 2e-2, 2e-3, 0, NULL},
    {"draft@85/0/0/15", 10.0, 2e-3, 2e-2, 2e-3, 0, NULL},
    {"draft@85/0/0/15", 0.02, 2e-3, 2e-2, 2e-3, 1, NULL}, /* dense warm-up = bf16 */
    /* warm-up steps run as another dense method (= that method's entry) */
    {"draft@85/0/0/15+expcast", 0.12, 1e-2, 5e-2, 1e-2, 1, "vc8+expcast"},
    {"draft@85/0/7.5/7.5", 0.12, 1e-2, 5e-2, 1e-2, 1, "sage8"},
    {"draft@85/0/7.5/7.5", 10.0, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"draft@85/0/7.5/7.5+expcast", 10.0, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"draft@85/0/7.5/7.5+expcast-centred", 10.0, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"draft@50/20/15/15+expcast-centred", 10.0, 5e-2, 1e-1, 5e-2, 0, NULL},
    {"draft@85/0/7.5/7.5+qblock", 10.0, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"draft@85/0/7.5/7.5+fp16acc", 10.0, 1e-2, 5e-2, 1e-2, 0, NULL}, /* Table 6's FP16 partials */
    /* the INT8 phase's V scales from the packed video rows' sample */
    {"draft@85/0/7.5/7.5+expcast+vsample", 10.0, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"draft@50/20/15/15+vsample", 10.0, 5e-2, 1e-1, 5e-2, 0, NULL},
    {"draft@0/40/30/30", 0.35, 5e-2, 1e-1, 5e-2, 0, NULL},
    {"draft@50/20/15/15", 10.0, 5e-2, 1e-1, 5e-2, 0, NULL},
    /* the adaptive budget: per head K (on CUDA found by the router) */
    {"draft@p95", 10.0, 2e-3, 2e-2, 2e-3, 0, NULL},
    {"draft@p90/0/50/50", 10.0, 1e-2, 5e-2, 1e-2, 0, NULL},
    {"draft@p95/20/30/50", 10.0, 5e-2, 1e-1, 5e-2, 0, NULL},
    /* the skipped pairs as their regions' means (CUDA: a pass after the
     * kernel, merged through the LSE; a 16-bit output rounded twice) */
    {"draft@85/0/0/15+pooled", 10.0, 4e-3, 2e-2, 4e-3, 0, NULL},
    {"draft@p95/0/50/50+pooled", 10.0, 1e-2, 5e-2, 1e-2, 0, NULL},
};
#define NTOLS (int)(sizeof TOLS / sizeof *TOLS)
/* LSE of another backend vs the CPU reference, every method (natural log;
 * -inf rows must match exactly); docs/NUMERICS.md §6:
 *   draft: 1e-3 + 1e-3|ref| (the phases' partials are rounded in another order);
 *   fp8: 1e-2: its E4M3 QK product accumulates on the tensor cores with less
 *     than FP32 precision, so the scores (and m, l) differ by ~1e-3 (H200);
 *     fp8+codesum 2e-2: those score differences also move P codes across
 *     rounding boundaries, and l sums the codes (1.3e-2 seen, H200);
 *   +expcast, +codesum, +i8pv (not +i8pv+fp32sum): l sums the decoded P
 *     codes, and a score or exp2 one ulp off the CPU's can move one code by
 *     one step (1/16 of that weight; +i8pv 1/255 of its block's): 2e-3;
 *   the rest: l is an FP32 sum of exp2 weights, so only order and log2f
 *     ulps differ: 2e-4 + 1e-5|ref|. */
/* " (warm-up)", " (warm-up as M)" or "" after a method in the output. */
static const char *warm_tag(const tol *t) {
    static _Thread_local char buf[64];
    if (!t->draft_warmup) return "";
    if (!t->warmup_as) return " (warm-up)";
    snprintf(buf, sizeof buf, " (warm-up as %s)", t->warmup_as);
    return buf;
}

/* Whether l sums P codes: ExpCast, the exp2 path's code sum, or +i8pv's
 * u8 codes (one step is 1/255 of its block's weight; +i8pv+fp32sum sums
 * the weights, as the FP32 path). */
static int sums_codes(const char *method) {
    qva_config c;
    qva_config_default(&c);
    return qva_config_set_method(&c, method) == QVA_OK &&
           (c.expcast != QVA_EXPCAST_OFF || c.p_sum == QVA_P_SUM_CODES);
}

static void lse_tol(const char *method, double *atol, double *rtol) {
    if (!strncmp(method, "draft", 5))
        *atol = 1e-3, *rtol = 1e-3;
    else if (!strncmp(method, "fp8", 3)) /* E4M3 QK: tensor-core accumulation below FP32 */
        *atol = strstr(method, "codesum") ? 2e-2 : 1e-2, *rtol = 1e-5;
    else if (sums_codes(method)) /* sage8's code sum is its default: not in its name */
        *atol = 2e-3, *rtol = 1e-5;
    else
        *atol = 2e-4, *rtol = 1e-5;
}

typedef struct tcase {
    int B, H, Nq, Nk, D;
    qva_dtype dt;
    int nhd;
    int T, GH, GW, P, at_end; /* draft video grid + prefix (T = 0: no draft) */
    int draft_only;           /* the dense methods skip this case           */
} tcase;

static const tcase CASES[] = {
    {1, 2, 200, 200, 64, QVA_F32, 0, 2, 10, 10, 0, 0, 0},   /* N not a multiple of 128 */
    {1, 1, 77, 77, 128, QVA_BF16, 1, 1, 7, 10, 7, 0, 0},    /* N < 128, NHD, bf16       */
    {2, 2, 256, 256, 64, QVA_F16, 0, 1, 16, 15, 16, 1, 0},  /* B > 1, f16, prefix last  */
    {1, 2, 130, 130, 128, QVA_BF16, 0, 1, 10, 13, 0, 0, 0}, /* one valid key in a block */
    {1, 1, 64, 320, 64, QVA_F32, 1, 0, 0, 0, 0, 0, 0},      /* cross attention Nq < Nk  */
    /* D 128 dense (the Hopper 8-bit kernel): B > 1 with NHD strides over
     * three query tiles, and cross attention */
    {2, 3, 300, 300, 128, QVA_F16, 1, 0, 0, 0, 0, 0, 0},
    {1, 2, 200, 333, 128, QVA_BF16, 0, 0, 0, 0, 0, 0, 0},
    /* draft only: more regions (R = 12, 6, 20) */
    {1, 1, 1536, 1536, 128, QVA_BF16, 1, 4, 16, 24, 0, 0, 1},
    {2, 1, 700, 700, 64, QVA_F16, 1, 3, 13, 17, 37, 0, 1},
    {1, 1, 2464, 2464, 64, QVA_F32, 0, 5, 20, 24, 64, 1, 1},
    /* D 128 with a prefix of two key blocks (one partial), first and last:
     * the Hopper kernel's prefix-query CTAs */
    {1, 2, 680, 680, 128, QVA_BF16, 0, 2, 12, 20, 200, 1, 1},
    {1, 1, 1136, 1136, 128, QVA_F16, 1, 2, 16, 32, 112, 0, 1},
    /* more packed video rows than a sample (+vsample), a prefix last */
    {1, 1, 2148, 2148, 64, QVA_F16, 0, 4, 16, 32, 100, 1, 1},
};
#define NCASES (int)(sizeof CASES / sizeof *CASES)

static int is_draft(const char *method) { return !strncmp(method, "draft", 5); }

/* make_config's check_finite (run_nonfinite turns it off: the GPU never
 * scans, and the CPU would fail the call instead of writing the rows). */
static int g_check_finite = 1;
/* hash-qblock mode: sage8, vc8 and draft run with +qblock appended. */
static int g_qblock = 0;

/* The config of one (case, method): the method string, and for draft the
 * case's grid and prefix (and the warm-up step if asked). */
static qva_status make_config(const tcase *c, const tol *t, qva_config *cfg) {
    qva_config_default(cfg);
    qva_status st = qva_config_set_method(cfg, t->method);
    if (st == QVA_OK && g_qblock && qvi_method_has_int8_q(cfg->method))
        cfg->q_granularity = QVA_Q_PER_BLOCK;
    cfg->check_finite = g_check_finite;
    if (st != QVA_OK || !is_draft(t->method)) return st;
    cfg->draft.grid_t = c->T;
    cfg->draft.grid_h = c->GH;
    cfg->draft.grid_w = c->GW;
    cfg->draft.prefix_tokens = c->P;
    cfg->draft.prefix_at_end = c->at_end;
    cfg->draft.dense_warmup_steps = t->draft_warmup ? 1 : 0;
    if (t->warmup_as) { /* its method; +expcast is the draft string's */
        qva_config m;
        qva_config_default(&m);
        if ((st = qva_config_set_method(&m, t->warmup_as)) != QVA_OK) return st;
        cfg->draft.warmup_method = m.method;
    }
    cfg->step = 0;
    return QVA_OK;
}

static uint64_t rs = 88172645463325252ull;
static float frand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)(rs >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

static size_t elems(int B, int H, int N, int D) { return (size_t)B * H * N * D; }

static qva_tensor desc(void *p, const tcase *c, int N, qva_device dev) {
    return c->nhd ? qva_tensor_nhd(p, c->dt, dev, c->B, c->H, N, c->D)
                  : qva_tensor_hnd(p, c->dt, dev, c->B, c->H, N, c->D);
}

/* Host buffers of one case, stored in the case's dtype. */
typedef struct host_io {
    void *q, *k, *v, *o;
    size_t nq, nk;
} host_io;

static void fill_tensor(const qva_tensor *t, float amp, float bias) {
    size_t n = elems((int)t->shape[0], (int)t->shape[1], (int)t->shape[2], (int)t->shape[3]);
    for (size_t i = 0; i < n; ++i) /* element order is irrelevant here */
        qvi_store_elem(t, (int64_t)i, bias + amp * frand());
}

static host_io make_case(const tcase *c) {
    host_io h;
    size_t es = qva_dtype_size(c->dt);
    h.nq = elems(c->B, c->H, c->Nq, c->D);
    h.nk = elems(c->B, c->H, c->Nk, c->D);
    h.q = malloc(h.nq * es), h.k = malloc(h.nk * es), h.v = malloc(h.nk * es);
    h.o = malloc(h.nq * es);
    qva_tensor q = desc(h.q, c, c->Nq, QVA_DEVICE_CPU), k = desc(h.k, c, c->Nk, QVA_DEVICE_CPU),
               v = desc(h.v, c, c->Nk, QVA_DEVICE_CPU);
    fill_tensor(&q, 2.0f, 0.0f);
    fill_tensor(&k, 2.0f, 0.5f); /* a common K component, as in DiTs */
    fill_tensor(&v, 1.0f, 0.0f);
    return h;
}

static void free_case(host_io *h) { free(h->q), free(h->k), free(h->v), free(h->o); }

static qva_tensor lse_desc(void *p, const tcase *c, qva_device dev) {
    return qva_tensor_hnd(p, QVA_F32, dev, c->B, c->H, c->Nq, 1);
}

/* Output as f32 in storage order, poisoned before the run; lse (if not
 * NULL) receives [B,H,Nq] f32, poisoned too. */
/* The draft stats of the last run_cpu / run_cuda call (zero if it failed). */
static qva_draft_stats g_stats_cpu, g_stats_cuda;

/* keep: the context to run in (its layer state carries over), or NULL for
 * a fresh one. */
static qva_status run_cpu_in(qva_context_t *keep, const tcase *c, host_io *h, const tol *t,
                             float *res, float *lse, double *ms) {
    qva_context_t *ctx = keep;
    qva_config cfg;
    qva_status st = make_config(c, t, &cfg);
    if (st != QVA_OK) return st;
    if (!keep && (st = qva_context_create(&ctx, QVA_DEVICE_CPU)) != QVA_OK) return st;
    qva_tensor q = desc(h->q, c, c->Nq, QVA_DEVICE_CPU), k = desc(h->k, c, c->Nk, QVA_DEVICE_CPU),
               v = desc(h->v, c, c->Nk, QVA_DEVICE_CPU), o = desc(h->o, c, c->Nq, QVA_DEVICE_CPU);
    qva_tensor l = lse_desc(lse, c, QVA_DEVICE_CPU);
    for (size_t i = 0; i < h->nq; ++i) qvi_store_elem(&o, (int64_t)i, NAN);
    const size_t nl = (size_t)c->B * c->H * c->Nq;
    for (size_t i = 0; lse && i < nl; ++i) lse[i] = NAN;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = qva_attention(ctx, &cfg, &q, &k, &v, &o, lse ? &l : NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (ms) *ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    for (size_t i = 0; i < h->nq; ++i) res[i] = qvi_load_elem(&o, (int64_t)i);
    memset(&g_stats_cpu, 0, sizeof g_stats_cpu);
    if (st == QVA_OK) st = qva_context_last_draft_stats(ctx, &g_stats_cpu);
    if (!keep) qva_context_free(ctx);
    return st;
}

static qva_status run_cpu(const tcase *c, host_io *h, const tol *t, float *res, float *lse,
                          double *ms) {
    return run_cpu_in(NULL, c, h, t, res, lse, ms);
}

static qva_status run_cuda_in(qva_context_t *keep, const tcase *c, host_io *h, const tol *t,
                              float *res, float *lse) {
    qva_config cfg;
    qva_status st = make_config(c, t, &cfg);
    if (st != QVA_OK) return st;
    size_t es = qva_dtype_size(c->dt);
    const size_t nl = (size_t)c->B * c->H * c->Nq;
    void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dlse = NULL;
    qva_context_t *ctx = keep;
    if ((st = qva_device_malloc(&dq, h->nq * es)) || (st = qva_device_malloc(&dk, h->nk * es)) ||
        (st = qva_device_malloc(&dv, h->nk * es)) || (st = qva_device_malloc(&dout, h->nq * es)) ||
        (lse && (st = qva_device_malloc(&dlse, nl * sizeof(float)))))
        goto done;
    qva_tensor o = desc(h->o, c, c->Nq, QVA_DEVICE_CPU);
    for (size_t i = 0; i < h->nq; ++i) qvi_store_elem(&o, (int64_t)i, NAN); /* poison */
    for (size_t i = 0; lse && i < nl; ++i) lse[i] = NAN;
    if ((st = qva_memcpy_to_device(dq, h->q, h->nq * es)) ||
        (st = qva_memcpy_to_device(dk, h->k, h->nk * es)) ||
        (st = qva_memcpy_to_device(dv, h->v, h->nk * es)) ||
        (st = qva_memcpy_to_device(dout, h->o, h->nq * es)) ||
        (lse && (st = qva_memcpy_to_device(dlse, lse, nl * sizeof(float)))) ||
        (!keep && (st = qva_context_create(&ctx, QVA_DEVICE_CUDA))))
        goto done;
    qva_tensor q = desc(dq, c, c->Nq, QVA_DEVICE_CUDA), k = desc(dk, c, c->Nk, QVA_DEVICE_CUDA),
               v = desc(dv, c, c->Nk, QVA_DEVICE_CUDA), od = desc(dout, c, c->Nq, QVA_DEVICE_CUDA);
    qva_tensor ld = lse_desc(dlse, c, QVA_DEVICE_CUDA);
    if ((st = qva_attention(ctx, &cfg, &q, &k, &v, &od, lse ? &ld : NULL)) ||
        (st = qva_device_synchronize()) || (st = qva_memcpy_to_host(h->o, dout, h->nq * es)) ||
        (lse && (st = qva_memcpy_to_host(lse, dlse, nl * sizeof(float)))))
        goto done;
    for (size_t i = 0; i < h->nq; ++i) res[i] = qvi_load_elem(&o, (int64_t)i);
    st = qva_context_last_draft_stats(ctx, &g_stats_cuda);
done:
    if (st != QVA_OK) memset(&g_stats_cuda, 0, sizeof g_stats_cuda);
    if (!keep) qva_context_free(ctx);
    qva_device_free(dq), qva_device_free(dk), qva_device_free(dv), qva_device_free(dout);
    if (dlse) qva_device_free(dlse);
    return st;
}

static qva_status run_cuda(const tcase *c, host_io *h, const tol *t, float *res, float *lse) {
    return run_cuda_in(NULL, c, h, t, res, lse);
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = (double)a[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int all_finite(const float *a, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (!isfinite(a[i])) return 0;
    return 1;
}

/* A backend's output against the CPU reference of the same method. */
/* Token row of a storage index of an output [B,H,Nq,D] of case c. */
static long row_of(const tcase *c, size_t i) {
    return c->nhd ? (long)((i / ((size_t)c->H * c->D)) % (size_t)c->Nq)
                  : (long)((i / (size_t)c->D) % (size_t)c->Nq);
}

static void compare_backend(const char *label, const tcase *c, const tol *t, const float *got,
                            const float *ref, size_t n) {
    CHECK(all_finite(got, n), "%s: NaN/Inf or unwritten output", label);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
        if (!(fabs((double)got[i] - ref[i]) <= t->atol + t->rtol * fabs(ref[i])) && bad++ == 0)
            first = i;
    CHECK(bad == 0,
          "%s: %zu elements outside atol %g + rtol %g (first: storage index %zu, token row %ld, "
          "%g vs %g)",
          label, bad, t->atol, t->rtol, first, row_of(c, first), bad ? (double)got[first] : 0.0,
          bad ? (double)ref[first] : 0.0);
    double e = rel_l2(got, ref, n);
    CHECK(e <= t->rel_l2, "%s: rel-L2 %g vs CPU reference (limit %g)", label, e, t->rel_l2);
}

/* The inputs of a case's LSE rows, for the one-step bound below. */
typedef struct lse_rows {
    const tcase *c;
    const host_io *h;
    double sm_scale;
} lse_rows;

static int64_t elem_off(const qva_tensor *t, int b, int h, int n, int d) {
    return b * t->stride[0] + h * t->stride[1] + n * t->stride[2] + d * t->stride[3];
}

/* Where l sums P's E4M3 codes (ExpCast, the exp2 code sum), a score one
 * ulp off the CPU's can move a code by one step near a rounding boundary,
 * at most 1/8 of its value (3 mantissa bits), and the row maximum's code
 * never moves (it is fixed at the top).  So one such step moves a row's
 * LSE by at most log(1 + w/8), w the largest weight share of any other
 * key in the row: a bound set by the row's own data, large only where one
 * key other than the maximum carries much of the row.  Here w comes from
 * FP64 softmax weights of the inputs (10% margin for the quantized ones). */
static double one_step_bound(const lse_rows *r, size_t row) {
    const tcase *c = r->c;
    const int i = (int)(row % (size_t)c->Nq), bh = (int)(row / (size_t)c->Nq);
    const int b = bh / c->H, hh = bh % c->H;
    const qva_tensor q = desc(r->h->q, c, c->Nq, QVA_DEVICE_CPU),
                     k = desc(r->h->k, c, c->Nk, QVA_DEVICE_CPU);
    double *s = malloc((size_t)c->Nk * sizeof *s), mx = -INFINITY;
    if (!s) return 0;
    for (int j = 0; j < c->Nk; ++j) {
        double acc = 0;
        for (int d = 0; d < c->D; ++d)
            acc += (double)qvi_load_elem(&q, elem_off(&q, b, hh, i, d)) *
                   qvi_load_elem(&k, elem_off(&k, b, hh, j, d));
        s[j] = acc * r->sm_scale;
        mx = fmax(mx, s[j]);
    }
    double l = 0, second = 0;
    int top_seen = 0;
    for (int j = 0; j < c->Nk; ++j) {
        const double p = exp(s[j] - mx);
        l += p;
        if (s[j] == mx && !top_seen) top_seen = 1;
        else second = fmax(second, p);
    }
    free(s);
    return log1p(1.1 * second / l / 8);
}

/* rows for compare_lse where the method's l sums E4M3 codes (not draft,
 * whose own tolerance covers it, nor E5M2 or +i8pv's u8 codes); else NULL. */
static const lse_rows *e4m3_code_rows(lse_rows *r, const tcase *c, const host_io *h,
                                      const char *method) {
    qva_config cfg;
    qva_config_default(&cfg);
    if (is_draft(method) || qva_config_set_method(&cfg, method) != QVA_OK) return NULL;
    const int e4m3 = cfg.expcast == QVA_EXPCAST_PAPER || cfg.expcast == QVA_EXPCAST_CENTRED ||
                     (cfg.expcast == QVA_EXPCAST_OFF && cfg.p_sum == QVA_P_SUM_CODES &&
                      cfg.v_code != QVA_V_INT8_PV);
    if (!e4m3) return NULL;
    *r = (lse_rows){c, h, qvi_sm_scale(&cfg, c->D)};
    return r;
}

/* LSE against the CPU's: -inf (a row with no retained key) exactly, the
 * rest within LSE_ATOL + LSE_RTOL |ref|; with `rows` (methods summing E4M3
 * codes), a row past that within it plus the one-step bound above; NaN
 * (unwritten) fails. */
static void compare_lse(const char *label, const char *method, const float *got,
                        const float *ref, size_t n, const lse_rows *rows) {
    double atol, rtol, mx = 0;
    lse_tol(method, &atol, &rtol);
    size_t bad = 0, first = n, stepped = 0;
    for (size_t i = 0; i < n; ++i) {
        const double d = fabs((double)got[i] - ref[i]);
        int ok = isinf(ref[i]) ? got[i] == ref[i] : d <= atol + rtol * fabs(ref[i]);
        if (!ok && rows && !isinf(ref[i]) && !isnan(got[i]) &&
            d <= atol + rtol * fabs(ref[i]) + one_step_bound(rows, i))
            ok = 1, ++stepped;
        if (!ok && bad++ == 0) first = i;
        if (!isinf(ref[i]) && d > mx) mx = d;
    }
    printf("%-40s cuda LSE max|diff| %.3e%s\n", label, mx,
           stepped ? " (rows within one code step's bound, past the flat one)" : "");
    if (stepped) printf("%-40s %zu row(s) within one code step's bound\n", label, stepped);
    CHECK(bad == 0, "%s: %zu LSE values off (first: [b*H+h]*N + row = %zu, %g vs %g)", label, bad, first,
          bad ? (double)got[first] : 0.0, bad ? (double)ref[first] : 0.0);
}

/* FNV-1a of n bytes. */
static uint64_t fnv64(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Hash mode also runs longer sequences (many key blocks per row, and a
 * draft grid of R = 64 regions), which the CPU reference would be slow on. */
static const tcase HASH_CASES[] = {
    {1, 4, 4096, 4096, 128, QVA_BF16, 0, 0, 0, 0, 0, 0, 0},
    {1, 2, 8192 + 100, 8192 + 100, 128, QVA_BF16, 1, 8, 32, 32, 100, 0, 0},
    /* Wan2.2's frame: regions of 124 and 125 tokens (the near-full masks) */
    {1, 2, 7200, 7200, 128, QVA_BF16, 0, 2, 45, 80, 0, 0, 1},
};

/* Only methods whose name starts with this (argv[2]; NULL: all). */
static const char *method_filter;

static int filtered_out(const char *method) {
    return method_filter && strncmp(method, method_filter, strlen(method_filter));
}

/* Hash mode: the CUDA output and LSE bits of every (case, method). */
static void hash_case(const tcase *c, int ci) {
    host_io h = make_case(c);
    const size_t nl = (size_t)c->B * c->H * c->Nq;
    float *got = malloc(h.nq * 4), *lgot = malloc(nl * 4);
    for (int m = 0; m < NTOLS; ++m) {
        const tol *t = &TOLS[m];
        if (c->Nq != c->Nk && !strncmp(t->method, "vc", 2)) continue;
        if (is_draft(t->method) ? c->T == 0 : c->draft_only) continue;
        if (g_qblock && strstr(t->method, "+qblock")) continue; /* the plain entry covers it */
        if (filtered_out(t->method)) continue;
        qva_config cfg;
        make_config(c, t, &cfg);
        char why[256] = "";
        if (!qva_supports(QVA_DEVICE_CUDA, &cfg, c->dt, c->D, why, sizeof why)) continue;
        CHECK(run_cuda(c, &h, t, got, lgot) == QVA_OK, "case %d %s: %s", ci, t->method,
              qva_last_error());
        printf("hash case %d %-28s%s out %016llx lse %016llx  [%s]\n", ci, t->method,
               warm_tag(t),
               (unsigned long long)fnv64(h.o, h.nq * qva_dtype_size(c->dt)),
               (unsigned long long)fnv64(lgot, nl * 4), why);
    }
    free(got), free(lgot);
    free_case(&h);
}

static void run_case(int ci, int perf) {
    const tcase *c = &CASES[ci];
    /* The draft-only cases exist for the GPU kernel at larger R; without a
     * device they would only re-test the CPU reference (test_draft does),
     * slowly under the sanitizers. */
    if (c->draft_only && !qva_cuda_available()) return;
    host_io h = make_case(c);
    const size_t nl = (size_t)c->B * c->H * c->Nq;
    float *exact = malloc(h.nq * 4), *ref = malloc(h.nq * 4), *got = malloc(h.nq * 4);
    float *lref = malloc(nl * 4), *lgot = malloc(nl * 4);
    double ms = 0;
    CHECK(run_cpu(c, &h, &(tol){"exact", 0, 0, 0, 0, 0, NULL}, exact, NULL, NULL) == QVA_OK,
          "case %d exact: %s", ci, qva_last_error());
    const int cuda = qva_cuda_available();
    for (int m = 0; m < NTOLS; ++m) {
        const tol *t = &TOLS[m];
        const int draft = is_draft(t->method);
        char label[96];
        snprintf(label, sizeof label, "case %d %s%s", ci, t->method,
                 warm_tag(t));
        if (filtered_out(t->method)) continue;
        if (c->Nq != c->Nk && !strncmp(t->method, "vc", 2)) continue; /* self-attn only */
        if (draft ? c->T == 0 : c->draft_only) continue;
        if (t->draft_warmup && c->draft_only) continue; /* = bf16, covered by cases 0-3 */
        float *lse_ref = lref, *lse_got = lgot;
        qva_status st = run_cpu(c, &h, t, ref, lse_ref, &ms);
        CHECK(st == QVA_OK, "%s cpu: %s", label, qva_last_error());
        CHECK(all_finite(ref, h.nq), "%s cpu: NaN/Inf or unwritten output", label);
        double e = rel_l2(ref, exact, h.nq);
        CHECK(e < t->ceiling_vs_exact, "%s cpu: rel-L2 %g vs exact (ceiling %g)", label, e,
              t->ceiling_vs_exact);
        if (perf) printf("%-40s cpu  %8.2f ms  rel-L2 vs exact %.3e\n", label, ms, e);
        qva_config cfg;
        make_config(c, t, &cfg);
        if (!cuda || !qva_supports(QVA_DEVICE_CUDA, &cfg, c->dt, c->D, NULL, 0)) continue;
        CHECK(run_cuda(c, &h, t, got, lse_got) == QVA_OK, "%s cuda: %s", label, qva_last_error());
        compare_backend(label, c, t, got, ref, h.nq);
        const char *lse_method = t->warmup_as ? t->warmup_as : t->method;
        lse_rows rows;
        compare_lse(label, lse_method, lse_got, lse_ref, nl,
                    e4m3_code_rows(&rows, c, &h, lse_method));
        /* the kept shares: each head's count (MASS: found on the device) */
        CHECK(!memcmp(&g_stats_cpu, &g_stats_cuda, sizeof g_stats_cpu),
              "%s: draft stats cuda %lld heads %.9g..%.9g mean %.9g, cpu %lld heads "
              "%.9g..%.9g mean %.9g", label, (long long)g_stats_cuda.heads,
              g_stats_cuda.kept_min, g_stats_cuda.kept_max, g_stats_cuda.kept_mean,
              (long long)g_stats_cpu.heads, g_stats_cpu.kept_min, g_stats_cpu.kept_max,
              g_stats_cpu.kept_mean);
    }
    free(exact), free(ref), free(got), free(lref), free(lgot);
    free_case(&h);
}

/* The kind of output row i of an HND case with its LSE: 0 finite, 1 NaN
 * (LSE NaN), 2 empty (zeros, LSE -inf), 3 finite with LSE +inf (the
 * K-smoothing shift q.mean(K) sm_scale of 1e19 inputs overflows FP32),
 * 4 none of these. */
static int row_kind(const float *o, const float *lse, int D, size_t i) {
    int fin = 1, nan = 1, zero = 1;
    for (int c = 0; c < D; ++c) {
        const float x = o[i * D + c];
        fin &= isfinite(x) != 0, nan &= isnan(x) != 0, zero &= x == 0.0f;
    }
    if (fin && isfinite(lse[i])) return 0;
    if (nan && isnan(lse[i])) return 1;
    if (zero && lse[i] == -INFINITY) return 2;
    if (fin && lse[i] == INFINITY) return 3;
    return 4;
}

/* docs/NUMERICS.md §2, "Rows the arithmetic cannot finish", on the GPU:
 * q, k ~ 1e19 (every bf16, fp8 and INT8-phase score overflows FP32; the
 * K-smoothed methods stay finite) and, for bf16, a NaN in one q row, with
 * check_finite = 0.  Each row must be of the same kind on both backends,
 * except that CUDA may give NaN where the CPU finished the row: the 8-bit
 * Hopper kernel forms the block's scale product dq*dk*scale in FP32 before
 * the scores, so its scores overflow at smaller inputs than the CPU's
 * (K-smoothed INT8 at 1e19: CPU finite with LSE +inf, H200 NaN; loud
 * either way, never a quiet zero).  The values of finite rows are not
 * compared (scores ~1e37 make the
 * softmax one-hot, and an ulp can move its argmax).  HND cases only (the
 * output rows and the LSE share one order). */
static void run_nonfinite(int ci) {
    const tcase *c = &CASES[ci];
    if (c->nhd || c->dt == QVA_F16 || c->Nq != c->Nk) return; /* f16 cannot hold 1e19 */
    host_io h = make_case(c);
    qva_tensor q = desc(h.q, c, c->Nq, QVA_DEVICE_CPU), k = desc(h.k, c, c->Nk, QVA_DEVICE_CPU);
    const size_t nl = (size_t)c->B * c->H * c->Nq;
    float *ref = malloc(h.nq * 4), *got = malloc(h.nq * 4), *lref = malloc(nl * 4),
          *lgot = malloc(nl * 4);
    for (int variant = 0; variant < 2; ++variant) {
        for (size_t i = 0; i < h.nq; ++i) /* scale 1 for the NaN variant */
            qvi_store_elem(&q, (int64_t)i, (variant ? 1.0f : 1e19f) * (0.75f + 0.25f * frand()));
        for (size_t i = 0; i < h.nk; ++i)
            qvi_store_elem(&k, (int64_t)i, (variant ? 1.0f : 1e19f) * (0.75f + 0.25f * frand()));
        if (variant) qvi_store_elem(&q, 3 * c->D + 5, NAN); /* head 0, row 3 */
        for (int m = 0; m < NTOLS; ++m) {
            const tol *t = &TOLS[m];
            if (variant && strcmp(t->method, "bf16")) continue;
            if (is_draft(t->method) ? c->T == 0 : c->draft_only) continue;
            qva_config cfg;
            make_config(c, t, &cfg);
            if (!qva_supports(QVA_DEVICE_CUDA, &cfg, c->dt, c->D, NULL, 0)) continue;
            char label[112];
            snprintf(label, sizeof label, "nonfinite case %d %s%s%s", ci, t->method,
                     warm_tag(t), variant ? " NaN q" : " 1e19");
            g_check_finite = 0;
            qva_status sc = run_cpu(c, &h, t, ref, lref, NULL);
            qva_status sg = run_cuda(c, &h, t, got, lgot);
            g_check_finite = 1;
            CHECK(sc == QVA_OK && sg == QVA_OK, "%s: cpu %s, cuda %s (%s)", label,
                  qva_status_string(sc), qva_status_string(sg), qva_last_error());
            int n[5] = {0, 0, 0, 0, 0}, differ = 0, louder = 0;
            size_t first = nl;
            for (size_t i = 0; i < nl; ++i) {
                const int kc = row_kind(ref, lref, c->D, i), kg = row_kind(got, lgot, c->D, i);
                ++n[kc];
                if (kg == 1 && (kc == 0 || kc == 3))
                    ++louder; /* NaN on the GPU where the CPU finished: loud */
                else if (kc != kg && differ++ == 0)
                    first = i;
            }
            printf("%-52s rows: %d finite, %d NaN, %d empty, %d LSE +inf; %d differ on cuda, "
                   "%d NaN on cuda where the cpu finished\n",
                   label, n[0], n[1], n[2], n[3], differ, louder);
            CHECK(differ == 0, "%s: %d rows of another kind on cuda (first row %zu: cpu %d, cuda %d)",
                  label, differ, first, first < nl ? row_kind(ref, lref, c->D, first) : -1,
                  first < nl ? row_kind(got, lgot, c->D, first) : -1);
            CHECK(n[4] == 0 && (n[2] == 0 || is_draft(t->method)),
                  "%s: cpu rows neither finite nor NaN (%d), or empty in a dense method (%d)",
                  label, n[4], n[2]);
            if (variant) CHECK(n[1] == 1, "%s: %d NaN rows, want the one NaN q row", label, n[1]);
        }
    }
    free(ref), free(got), free(lref), free(lgot);
    free_case(&h);
}

/* Draft's INT8 partials (draft.int8_acc) where FP16 and FP32 part: Q = 0
 * (uniform scores) over V = 1, so every kept block's partial is 448 x 2.25
 * per valid key, past FP16's 65504 in a block of 65 keys or more (the
 * cases whose regions average 96 keys or more clip by over a quarter).  The
 * CPU gives 1 with FP32 partials and clips with +fp16acc; CUDA must give
 * the CPU's rows to 2e-3 beyond one bf16 step of the value (the outputs
 * are stored in the case's dtype) in both, which the 8-bit tolerances of
 * the random cases cannot tell apart (2e-4 rel-L2 between the forms
 * there); the forms are 0.3-0.5 apart here. */
static void run_int8_acc(int ci) {
    const tcase *c = &CASES[ci];
    const int frame = c->GH * c->GW, regions = (frame + 127) / 128;
    if (c->T == 0 || c->Nq != c->Nk || frame < 96 * regions) return; /* regions of < 96 keys */
    host_io h = make_case(c);
    qva_tensor q = desc(h.q, c, c->Nq, QVA_DEVICE_CPU), v = desc(h.v, c, c->Nk, QVA_DEVICE_CPU);
    for (size_t i = 0; i < h.nq; ++i) qvi_store_elem(&q, (int64_t)i, 0.0f);
    for (size_t i = 0; i < h.nk; ++i) qvi_store_elem(&v, (int64_t)i, 1.0f);
    float *ref = malloc(h.nq * 4), *got = malloc(h.nq * 4);
    static const char *methods[] = {"draft@0/0/100/0", "draft@0/0/100/0+fp16acc"};
    for (int m = 0; m < 2; ++m) {
        const tol t = {methods[m], 10.0, 2e-3, 0, 2e-3, 0, NULL};
        qva_config cfg;
        make_config(c, &t, &cfg);
        if (!qva_supports(QVA_DEVICE_CUDA, &cfg, c->dt, c->D, NULL, 0)) continue;
        const qva_status sc = run_cpu(c, &h, &t, ref, NULL, NULL), sg = run_cuda(c, &h, &t, got, NULL);
        CHECK(sc == QVA_OK && sg == QVA_OK, "int8_acc case %d %s: cpu %s, cuda %s (%s)", ci,
              methods[m], qva_status_string(sc), qva_status_string(sg), qva_last_error());
        double off1 = 0, diff = 0;
        for (size_t i = 0; i < h.nq; ++i) { /* beyond one bf16 step of the value (2^-8 |x|) */
            off1 = fmax(off1, fabs((double)ref[i] - 1.0));
            diff = fmax(diff, fabs((double)got[i] - ref[i]) - 0x1p-8 * fabs((double)ref[i]));
        }
        printf("int8_acc case %d %-26s cpu max |out - 1| %.3g, cuda - cpu max %.3g\n", ci,
               methods[m], off1, diff);
        CHECK(m ? off1 > 0.25 : off1 < 1e-3, "int8_acc case %d %s: the CPU is %g off V = 1", ci,
              methods[m], off1);
        CHECK(diff < 2e-3, "int8_acc case %d %s: cuda %g from the cpu", ci, methods[m], diff);
    }
    free(ref), free(got);
    free_case(&h);
}

/* +kprev and +vprev across calls: a CPU and a CUDA context each run the
 * same three calls at one layer, the second with K moved by a per-channel
 * offset and V grown 1.5-fold, the third with V grown 300-fold (past what
 * the carried V scales serve); after each call the statistics the layer
 * keeps for its next call must be the CPU's bit for bit (the outputs alone
 * cannot show a wrong one: any K mean keeps attention exact, and a V scale
 * only moves the codes within E4M3's range), and every output and LSE
 * within the method's tolerances of the CPU's (the absolute one times V's growth). */
static void compare_carried(const char *label, qva_context_t *cc, qva_context_t *cg,
                            const tcase *c, int layer, int which) {
    const int BH = c->B * c->H; /* the cases' K/V heads are their query heads */
    float *gm = malloc((size_t)BH * c->D * 4);
    int *gv = malloc((size_t)BH * sizeof(int));
    CHECK(qvi_cuda_layer_carried(cg, layer, BH, c->D, which, gm, gv) == QVA_OK, "%s: %s", label,
          qva_last_error());
    int differ = 0, bad_valid = 0;
    for (int bh = 0; bh < BH; ++bh) {
        const qvi_vs_state *st = qvi_context_vs_state(cc, layer, bh / c->H, bh % c->H);
        const int cpu_d = !st ? -1 : which ? st->vscale_d : st->kmean_d;
        bad_valid += gv[bh] != (cpu_d == c->D);
        if (cpu_d == c->D)
            differ += memcmp(which ? st->vscale : st->kmean, gm + (size_t)bh * c->D,
                             (size_t)c->D * 4) != 0;
    }
    printf("%-52s %s: %d of %d heads differ, %d validity flags\n", label,
           which ? "V scales" : "K means", differ, BH, bad_valid);
    CHECK(differ == 0 && bad_valid == 0, "%s: %d heads' %s differ from the CPU's, %d validity "
          "flags", label, differ, which ? "V scales" : "K means", bad_valid);
    free(gm), free(gv);
}

static void run_carried(int ci) {
    const tcase *c = &CASES[ci];
    if (c->draft_only || (c->dt != QVA_BF16 && c->dt != QVA_F16)) return;
    static const char *const methods[] = {"sage8+kprev", "sage8+nohadamard+kprev",
                                          "vc8+expcast+kprev", "vc8+expcast+nohadamard+kprev",
                                          "sage8+vprev", "vc8+expcast+kprev+vprev"};
    for (size_t m = 0; m < sizeof methods / sizeof *methods; ++m) {
        if (!strncmp(methods[m], "vc", 2) && c->Nq != c->Nk) continue; /* V-Smooth: self-attention */
        const tol t = {methods[m], 0.12, 1e-2, 5e-2, 1e-2, 0, NULL};
        qva_config cfg;
        make_config(c, &t, &cfg);
        if (!qva_supports(QVA_DEVICE_CUDA, &cfg, c->dt, c->D, NULL, 0)) continue;
        host_io h = make_case(c);
        qva_tensor k = desc(h.k, c, c->Nk, QVA_DEVICE_CPU), v = desc(h.v, c, c->Nk, QVA_DEVICE_CPU);
        qva_context_t *cc = NULL, *cg = NULL;
        const size_t nl = (size_t)c->B * c->H * c->Nq;
        float *ref = malloc(h.nq * 4), *got = malloc(h.nq * 4), *lref = malloc(nl * 4),
              *lgot = malloc(nl * 4);
        CHECK(qva_context_create(&cc, QVA_DEVICE_CPU) == QVA_OK &&
                  qva_context_create(&cg, QVA_DEVICE_CUDA) == QVA_OK, "contexts");
        double v_size = 1; /* V's growth since the first call */
        for (int call = 0; call < 3 && cc && cg; ++call) {
            char label[96];
            snprintf(label, sizeof label, "carried case %d %s call %d", ci, methods[m], call);
            const float grow = call == 0 ? 1.0f : call == 1 ? 1.5f : 300.0f;
            v_size *= grow;
            for (size_t i = 0; call && i < h.nk; ++i) { /* K moves, V grows */
                if (call == 1)
                    qvi_store_elem(&k, (int64_t)i, qvi_load_elem(&k, (int64_t)i) +
                                                       0.5f * sinf(0.3f * (float)(i % c->D)));
                qvi_store_elem(&v, (int64_t)i, qvi_load_elem(&v, (int64_t)i) * grow);
            }
            const qva_status sc = run_cpu_in(cc, c, &h, &t, ref, lref, NULL),
                             sg = run_cuda_in(cg, c, &h, &t, got, lgot);
            CHECK(sc == QVA_OK && sg == QVA_OK, "%s: cpu %s, cuda %s (%s)", label,
                  qva_status_string(sc), qva_status_string(sg), qva_last_error());
            if (sc != QVA_OK || sg != QVA_OK) break;
            tol tv = t; /* outputs, and their 8-bit error, grow with V */
            tv.atol *= v_size;
            compare_backend(label, c, &tv, got, ref, h.nq);
            lse_rows rows;
            compare_lse(label, t.method, lgot, lref, nl, e4m3_code_rows(&rows, c, &h, t.method));
            if (cfg.k_mean) compare_carried(label, cc, cg, c, cfg.layer, 0);
            if (cfg.v_scale) compare_carried(label, cc, cg, c, cfg.layer, 1);
        }
        qva_context_free(cc), qva_context_free(cg);
        free(ref), free(got), free(lref), free(lgot);
        free_case(&h);
    }
}

/* +vsample on CUDA, where the sample is a part of the keys: with every
 * channel's amax on row 0 (always sampled) the sampled scales are the
 * call's own, and with a value past 448 times the sampled scale on a row
 * the sample skips the head takes its own; both times the output is the
 * method's without +vsample bit for bit, as on the CPU
 * (tests/test_sample.c). */
static void set_v_row(host_io *h, const tcase *c, int row, float x) {
    const qva_tensor v = desc(h->v, c, c->Nk, QVA_DEVICE_CPU);
    for (int b = 0; b < c->B; ++b)
        for (int hh = 0; hh < c->H; ++hh)
            for (int d = 0; d < c->D; ++d)
                qvi_store_elem(&v, b * v.stride[0] + hh * v.stride[1] + row * v.stride[2] +
                                       d * v.stride[3], x);
}

static void run_sampled(int ci) {
    const tcase *c = &CASES[ci];
    if (c->draft_only || (c->dt != QVA_BF16 && c->dt != QVA_F16) || c->Nk <= QVA_STAT_SAMPLE)
        return;
    int skipped = 1; /* the first row QVA_STAT_ROW passes over (it only grows) */
    while (QVA_STAT_ROW(skipped, c->Nk) == skipped) ++skipped;
    static const char *const pairs[][2] = {
        {"sage8", "sage8+vsample"},
        {"vc8+expcast-centred+pblock", "vc8+expcast-centred+pblock+vsample"}};
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; ++p) {
        if (!strncmp(pairs[p][0], "vc", 2) && c->Nq != c->Nk) continue;
        const tol tb = {pairs[p][0], 0.12, 1e-2, 5e-2, 1e-2, 0, NULL},
                  ts = {pairs[p][1], 0.12, 1e-2, 5e-2, 1e-2, 0, NULL};
        qva_config cfg;
        make_config(c, &ts, &cfg);
        if (!qva_supports(QVA_DEVICE_CUDA, &cfg, c->dt, c->D, NULL, 0)) continue;
        host_io h = make_case(c);
        float *a = malloc(h.nq * 4), *b = malloc(h.nq * 4);
        for (int form = 0; form < 2; ++form) {
            if (form == 0) set_v_row(&h, c, 0, 1.5f); /* V is within +-1 */
            else set_v_row(&h, c, skipped, 2000.0f);
            const qva_status sa = run_cuda_in(NULL, c, &h, &tb, a, NULL),
                             sb = run_cuda_in(NULL, c, &h, &ts, b, NULL);
            CHECK(sa == QVA_OK && sb == QVA_OK && !memcmp(a, b, h.nq * 4),
                  "sampled case %d %s: %s, the method's bits (%s)", ci, pairs[p][1],
                  form ? "a code past 448 on an unsampled row" : "the amax on a sampled row",
                  qva_last_error());
        }
        free(a), free(b);
        free_case(&h);
    }
}

/* Draft's +vsample (the packed video rows' QVA_STAT_ROW sample) against
 * the same route with the head's own V scales, on each backend, with one
 * video token's V row set to x in every channel (V is within +-1): a
 * sampled token at 1.5 gives the sample the head's amax (the same bits);
 * an unsampled one at 2000 makes a code pass 448, so the head takes its
 * own scales (the same bits); an unsampled one at 1.5 leaves the sampled
 * scales in use (all-INT8 route: other bits). */
static void run_draft_sampled(int ci) {
    const tcase *c = &CASES[ci];
    if (c->T == 0 || (c->dt != QVA_BF16 && c->dt != QVA_F16)) return;
    qvi_partition part;
    qvi_draft_layout lay;
    if (qvi_partition_build(c->GH, c->GW, QVI_BLOCK, &part) != QVA_OK) return;
    const qva_status ls = qvi_draft_layout_build(&part, c->T, c->P, c->at_end, &lay);
    qvi_partition_free(&part);
    CHECK(ls == QVA_OK, "draft sampled case %d: layout", ci);
    if (ls != QVA_OK) return;
    const int64_t nv = lay.regions * lay.c;
    const int32_t *video = lay.pack_to_orig + lay.prefix_pad;
    int sampled_tok = -1, unsampled_tok = -1;
    char *in = calloc((size_t)nv, 1);
    for (int64_t i = 0; i < QVA_STAT_COUNT(nv); ++i) in[QVA_STAT_ROW(i, nv)] = 1;
    for (int64_t r = 0; r < nv; ++r) {
        if (video[r] < 0) continue;
        if (in[r] && sampled_tok < 0) sampled_tok = video[r];
        if (!in[r] && unsampled_tok < 0) unsampled_tok = video[r];
    }
    free(in);
    qvi_draft_layout_free(&lay);
    if (unsampled_tok < 0) return; /* the sample holds every row */
    static const char *const pairs[][2] = {{"draft@0/0/100/0", "draft@0/0/100/0+vsample"},
                                           {"draft@0/50/50/0+expcast", "draft@0/50/50/0+expcast+vsample"}};
    const struct {
        int tok;
        float x;
        int same;
        const char *what;
    } forms[] = {{sampled_tok, 1.5f, 1, "the amax on a sampled row"},
                 {unsampled_tok, 2000.0f, 1, "a code past 448 on an unsampled row"},
                 {unsampled_tok, 1.5f, 0, "the sampled scales on an all-INT8 route"}};
    for (int dev = 0; dev < 2; ++dev) {
        if (dev == 1 && !qva_cuda_available()) break;
        for (size_t p = 0; p < sizeof pairs / sizeof *pairs; ++p) {
            const tol tb = {pairs[p][0], 10.0, 1e-2, 5e-2, 1e-2, 0, NULL},
                      ts = {pairs[p][1], 10.0, 1e-2, 5e-2, 1e-2, 0, NULL};
            if (filtered_out(tb.method)) continue;
            host_io h = make_case(c);
            float *a = malloc(h.nq * 4), *b = malloc(h.nq * 4);
            for (size_t f = 0; f < sizeof forms / sizeof *forms; ++f) {
                if (p == 1 && !forms[f].same) continue; /* a mixed route may miss the row */
                set_v_row(&h, c, forms[f].tok, forms[f].x);
                const qva_status sa = dev ? run_cuda_in(NULL, c, &h, &tb, a, NULL)
                                          : run_cpu_in(NULL, c, &h, &tb, a, NULL, NULL),
                                 sb = dev ? run_cuda_in(NULL, c, &h, &ts, b, NULL)
                                          : run_cpu_in(NULL, c, &h, &ts, b, NULL, NULL);
                CHECK(sa == QVA_OK && sb == QVA_OK && (memcmp(a, b, h.nq * 4) == 0) == forms[f].same,
                      "draft sampled case %d %s %s: %s, %s bits (%s)", ci, dev ? "cuda" : "cpu",
                      pairs[p][1], forms[f].what, forms[f].same ? "the method's" : "other",
                      qva_last_error());
                free_case(&h);
                h = make_case(c);
            }
            free(a), free(b);
            free_case(&h);
        }
    }
}

/* test_backend [test|perf|hash|hash-qblock] [METHOD_PREFIX], e.g. "test
 * draft" for the draft methods only; "hash PREFIX" runs only the GPU (no
 * CPU reference), the quick form for a sanitizer. */
int main(int argc, char **argv) {
    int perf = argc > 1 && !strcmp(argv[1], "perf");
    g_qblock = argc > 1 && !strcmp(argv[1], "hash-qblock");
    method_filter = argc > 2 ? argv[2] : NULL;
    if (argc > 1 && (!strcmp(argv[1], "hash") || g_qblock)) {
        if (!qva_cuda_available()) {
            fprintf(stderr, "test_backend hash: no CUDA device\n");
            return 2;
        }
        for (int i = 0; i < NCASES; ++i) hash_case(&CASES[i], i);
        for (int i = 0; i < (int)(sizeof HASH_CASES / sizeof *HASH_CASES); ++i)
            hash_case(&HASH_CASES[i], NCASES + i);
        return check_summary("test_backend hash");
    }
    if (argc > 1 && strcmp(argv[1], "perf") && strcmp(argv[1], "test")) {
        fprintf(stderr, "usage: test_backend [test|perf|hash|hash-qblock] [METHOD_PREFIX]\n");
        return 2;
    }
    printf("backends: cpu%s\n", qva_cuda_available() ? ", cuda" : " (cuda not present)");
    for (int i = 0; i < NCASES; ++i) run_case(i, perf);
    for (int i = 0; !perf && i < NCASES; ++i) run_draft_sampled(i);
    if (!perf && qva_cuda_available())
        for (int i = 0; i < NCASES; ++i) run_nonfinite(i), run_int8_acc(i), run_carried(i), run_sampled(i);
    return check_summary("test_backend");
}
