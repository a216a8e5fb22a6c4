/* Threads (include/qvattn.h, "Threads"): several host threads on ONE
 * context, and threads on separate contexts, give the bits of the same calls
 * made serially.  Methods: vc8 and vc4 (V-Smooth state per layer, steps
 * that group, reuse and run plain), draft (the partition cache) and sage8
 * (only the timings); another thread meanwhile flips profiling, sets the
 * stream and reads the timings, or resets the context.  Built and run
 * under ASan (`make asan`) and ThreadSanitizer (`make tsan`). */
#define _POSIX_C_SOURCE 200112L
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "qvattn.h"

/* Each thread's calls: first one on a "bulk" vc8 layer of H_BULK heads
 * (a V-Smooth state per head), then NSTEPS steps of [vc8 layer, vc4 layer,
 * sage8, draft].  Without ThreadSanitizer each thread's layers make
 * 16 + 1 + 1 V-Smooth states, 72 in all, so the state table grows (past
 * 64) while other threads use it: the use-after-free of issue 13.
 * ThreadSanitizer sees a race whether or not it breaks something, and runs
 * this code ~60x slower: there one head per call and one value block (the
 * token order then changes no result) suffice. */
#if defined(__SANITIZE_THREAD__)
#define TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_TSAN 1
#endif
#endif
#ifdef TEST_TSAN
#define H_BULK 1
#define H_OTHER 1
#define N_VS 48
#else
#define H_BULK 16
#define H_OTHER 2 /* sage8, draft */
#define N_VS 130  /* vc8, vc4: two value blocks, so the token order matters */
#endif
#define NTHREADS 4
#define NSTEPS 3    /* of 8: group, reuse, plain (VC App. A) */
#define NUM_STEPS 8
#define CALLS_PER_STEP 4
#define NCALLS (1 + NSTEPS * CALLS_PER_STEP)
#define NCALLS_STATELESS (1 + CALLS_PER_STEP) /* the reset run: one step */
#define B 1
#define N_SMALL 48 /* bulk and sage8 */
#define D 64

/* Draft grids (T, gh, gw, prefix); N_draft = prefix + T*gh*gw. */
static const int grids[4][4] = {{3, 4, 8, 3}, {2, 4, 8, 0}, {3, 6, 4, 5}, {2, 4, 6, 1}};

typedef enum { CALL_BULK, CALL_VC8, CALL_VC4, CALL_SAGE8, CALL_DRAFT } call_kind;

typedef struct call {
    call_kind kind;
    int layer, step, grid;
    int stateless; /* V-Smooth: recompute on every call, no warm start */
    uint64_t seed;
} call;

/* Thread t's i-th call.  Thread t owns layers 3t, 3t+1, 3t+2. */
static call call_of(int t, int i, int stateless) {
    call c;
    memset(&c, 0, sizeof c);
    c.stateless = stateless;
    if (i == 0) {
        c.kind = CALL_BULK;
        c.layer = 3 * t + 2;
        c.seed = 0x500u + (uint64_t)t;
        return c;
    }
    const int s = (i - 1) / CALLS_PER_STEP, j = (i - 1) % CALLS_PER_STEP;
    static const call_kind kinds[CALLS_PER_STEP] = {CALL_VC8, CALL_VC4, CALL_SAGE8, CALL_DRAFT};
    c.kind = kinds[j];
    c.step = s;
    c.layer = 3 * t + (j == 1);
    c.grid = (t + s) % 4;
    c.seed = 0x1000u + (uint64_t)(t * CALLS_PER_STEP + j) * 64 + (uint64_t)s;
    return c;
}

/* shift + amp * uniform [-1, 1), from the generator state *st (each call
 * its own: check.h's rng_state is not for threads). */
static void fill(float *x, size_t n, float amp, float shift, uint64_t *st) {
    for (size_t i = 0; i < n; ++i)
        x[i] = shift + amp * (float)((double)(rng_u64_of(st) >> 11) * 0x1p-52 - 1.0);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Runs one call; *hash receives a hash of the output and LSE bits. */
static qva_status run_call(qva_context_t *ctx, const call *c, uint64_t *hash) {
    qva_config cfg;
    qva_config_default(&cfg);
    const char *m = c->kind == CALL_BULK || c->kind == CALL_VC8 ? "vc8+expcast"
                    : c->kind == CALL_VC4 ? "vc4" : c->kind == CALL_SAGE8 ? "sage8"
                    : "draft@50/0/25/25";
    qva_status st = qva_config_set_method(&cfg, m);
    if (st != QVA_OK) return st;
    int n = c->kind == CALL_BULK || c->kind == CALL_SAGE8 ? N_SMALL : N_VS;
    const int H = c->kind == CALL_BULK ? H_BULK : c->kind == CALL_SAGE8 || c->kind == CALL_DRAFT ? H_OTHER : 1;
    if (c->kind == CALL_DRAFT) {
        const int *g = grids[c->grid];
        cfg.draft.grid_t = g[0];
        cfg.draft.grid_h = g[1];
        cfg.draft.grid_w = g[2];
        cfg.draft.prefix_tokens = g[3];
        cfg.draft.dense_warmup_steps = c->stateless ? 0 : 1; /* step 0: dense */
        n = g[3] + g[0] * g[1] * g[2];
    }
    cfg.layer = c->layer;
    cfg.step = c->step;
    cfg.num_steps = NUM_STEPS;
    cfg.vsmooth.clusters = 8;
    if (c->stateless) {
        cfg.vsmooth.schedule = QVA_SCHEDULE_ALWAYS;
        cfg.vsmooth.warm_start = 0;
    }
    const size_t sz = (size_t)B * H * n * D;
    float *q = malloc(sz * sizeof *q), *k = malloc(sz * sizeof *k), *v = malloc(sz * sizeof *v);
    float *o = malloc(sz * sizeof *o), *l = malloc((size_t)B * H * n * sizeof *l);
    if (!q || !k || !v || !o || !l) {
        st = QVA_ERR_OUT_OF_MEMORY;
    } else {
        uint64_t rs = c->seed;
        fill(q, sz, 2.0f, 0.0f, &rs);
        fill(k, sz, 2.0f, 0.5f, &rs);
        fill(v, sz, 1.0f, 0.25f, &rs);
        qva_tensor qt = qva_tensor_hnd(q, QVA_F32, QVA_DEVICE_CPU, B, H, n, D);
        qva_tensor kt = qva_tensor_hnd(k, QVA_F32, QVA_DEVICE_CPU, B, H, n, D);
        qva_tensor vt = qva_tensor_hnd(v, QVA_F32, QVA_DEVICE_CPU, B, H, n, D);
        qva_tensor ot = qva_tensor_hnd(o, QVA_F32, QVA_DEVICE_CPU, B, H, n, D);
        qva_tensor lt = qva_tensor_hnd(l, QVA_F32, QVA_DEVICE_CPU, B, H, n, 1);
        st = qva_attention(ctx, &cfg, &qt, &kt, &vt, &ot, &lt);
        *hash = fnv(fnv(0xcbf29ce484222325ull, o, sz * sizeof *o), l,
                    (size_t)B * H * n * sizeof *l);
    }
    free(q), free(k), free(v), free(o), free(l);
    return st;
}

typedef struct worker {
    pthread_t tid;
    qva_context_t *ctx;
    int t, stateless;
    uint64_t hash[NCALLS];
    qva_status st[NCALLS];
    char err[NCALLS][128];
} worker;

static int calls_of(const worker *w) { return w->stateless ? NCALLS_STATELESS : NCALLS; }

static void run_sequence(worker *w) {
    for (int i = 0; i < calls_of(w); ++i) {
        call c = call_of(w->t, i, w->stateless);
        w->hash[i] = 0;
        w->st[i] = run_call(w->ctx, &c, &w->hash[i]);
        snprintf(w->err[i], sizeof w->err[i], "%s", qva_last_error());
    }
}
static void *worker_main(void *p) {
    run_sequence(p);
    return NULL;
}

/* Calls on the shared context that change or read its settings while the
 * workers run (CPU: neither the stream nor profiling changes a result). */
typedef struct meddler {
    pthread_t tid;
    qva_context_t *ctx;
    int reset; /* 1: qva_context_reset in a loop */
    atomic_int stop;
    long calls, failures;
} meddler;

static void *meddler_main(void *p) {
    meddler *m = p;
    while (!atomic_load(&m->stop)) {
        qva_timings tm;
        int bad = 0;
        if (m->reset) {
            bad |= qva_context_reset(m->ctx) != QVA_OK;
        } else {
            bad |= qva_context_set_profiling(m->ctx, (int)(m->calls & 1)) != QVA_OK;
            bad |= qva_context_set_stream(m->ctx, NULL) != QVA_OK;
            bad |= qva_context_last_timings(m->ctx, &tm) != QVA_OK;
            bad |= !(tm.kernel_ms >= 0.0f);
        }
        m->failures += bad;
        ++m->calls;
        struct timespec ts = {0, 200000}; /* 0.2 ms */
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Runs the workers on ctx (NULL: each its own context), with a meddler on
 * ctx if meddle >= 0 (0: settings, 1: reset); compares with ref. */
static void run_threads(const char *what, qva_context_t *ctx, int meddle, int stateless,
                        worker ref[NTHREADS]) {
    static worker w[NTHREADS];
    qva_context_t *own[NTHREADS] = {NULL};
    meddler m;
    memset(&m, 0, sizeof m);
    atomic_init(&m.stop, 0);
    m.ctx = ctx;
    m.reset = meddle == 1;
    int started = 0;
    for (int t = 0; t < NTHREADS; ++t) {
        memset(&w[t], 0, sizeof w[t]);
        w[t].t = t;
        w[t].stateless = stateless;
        w[t].ctx = ctx;
        if (!ctx) {
            CHECK(qva_context_create(&own[t], QVA_DEVICE_CPU) == QVA_OK, "context");
            w[t].ctx = own[t];
        }
    }
    int meddling = ctx && meddle >= 0 && !pthread_create(&m.tid, NULL, meddler_main, &m);
    for (int t = 0; t < NTHREADS; ++t)
        started += !pthread_create(&w[t].tid, NULL, worker_main, &w[t]);
    CHECK(started == NTHREADS, "%s: started %d threads", what, started);
    for (int t = 0; t < started; ++t) pthread_join(w[t].tid, NULL);
    if (meddling) {
        atomic_store(&m.stop, 1);
        pthread_join(m.tid, NULL);
        CHECK(m.failures == 0, "%s: %ld of %ld context calls failed", what, m.failures, m.calls);
    }
    int mismatches = 0, calls = 0;
    for (int t = 0; t < started; ++t)
        for (int i = 0; i < calls_of(&w[t]); ++i, ++calls) {
            CHECK(w[t].st[i] == QVA_OK, "%s: thread %d call %d: %s", what, t, i, w[t].err[i]);
            mismatches += w[t].hash[i] != ref[t].hash[i];
        }
    CHECK(mismatches == 0, "%s: %d of %d results differ from the serial calls", what,
          mismatches, calls);
    for (int t = 0; t < NTHREADS; ++t) qva_context_free(own[t]);
}

int main(void) {
    static worker ref[NTHREADS], ref_sl[NTHREADS];
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context: %s", qva_last_error());
    if (!ctx) return check_summary("test_threads");

    /* The serial calls: every thread's sequence in turn on one context. */
    for (int sl = 0; sl < 2; ++sl) {
        worker *r = sl ? ref_sl : ref;
        for (int t = 0; t < NTHREADS; ++t) {
            r[t].t = t;
            r[t].stateless = sl;
            r[t].ctx = ctx;
            run_sequence(&r[t]);
            for (int i = 0; i < calls_of(&r[t]); ++i)
                CHECK(r[t].st[i] == QVA_OK, "serial: thread %d call %d: %s", t, i, r[t].err[i]);
        }
        CHECK(qva_context_reset(ctx) == QVA_OK, "reset");
    }
    /* Every call computes something of its own (no degenerate output). */
    int same = 0;
    for (int t = 0; t < NTHREADS * NCALLS; ++t)
        for (int u = 0; u < t; ++u)
            same += ref[t / NCALLS].hash[t % NCALLS] == ref[u / NCALLS].hash[u % NCALLS];
    CHECK(same == 0, "%d pairs of serial calls with equal results", same);
    /* The state matters: the step-1 vc8 call reuses step 0's permutation,
     * so on a fresh context (which groups instead) its bits differ. */
    if (N_VS > 128) {
        call c = call_of(0, 1 + CALLS_PER_STEP, 0);
        uint64_t h = 0;
        CHECK(c.kind == CALL_VC8 && c.step == 1, "call layout");
        CHECK(run_call(ctx, &c, &h) == QVA_OK, "fresh call: %s", qva_last_error());
        CHECK(h != ref[0].hash[1 + CALLS_PER_STEP], "step 1 on a fresh context equals the reuse step");
        CHECK(qva_context_reset(ctx) == QVA_OK, "reset");
    }

    /* One context, all threads, its settings changed meanwhile. */
    run_threads("shared context", ctx, 0, 0, ref);
    CHECK(qva_context_reset(ctx) == QVA_OK, "reset");
    /* One context reset while the threads run calls that do not depend on
     * the state (V-Smooth recomputed each call; the partitions rebuilt). */
    run_threads("shared context under reset", ctx, 1, 1, ref_sl);
    /* Separate contexts, no lock shared. */
    run_threads("separate contexts", NULL, -1, 0, ref);

    qva_context_free(ctx);
    return check_summary("test_threads");
}
