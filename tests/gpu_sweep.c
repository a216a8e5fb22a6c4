/*
 * gpu_sweep: the GPU reliability sweep of issue 13 (item 5).  Needs a CUDA
 * device and minutes, so it is a plain executable (CMake target gpu_sweep),
 * not a CTest test; scripts/gpu-sweep.sh builds and runs it.
 *
 *   gpu_sweep cases [N]  N (default 500) randomized cases against the CPU
 *                        reference on sampled query rows (below)
 *   gpu_sweep streams    two contexts on two streams, concurrently; one
 *                        context from two host threads; two contexts from
 *                        two threads: all bit-identical to serial calls
 *   gpu_sweep graphs     CUDA-graph capture + replay == eager, every method
 *                        and V-Smooth schedule action, and multi-call graphs
 *   gpu_sweep oom        a call whose workspace does not fit returns
 *                        QVA_ERR_OUT_OF_MEMORY and the context stays usable;
 *                        a 1,000-call soak keeps device memory flat
 *   gpu_sweep small      a handful of small cases, for compute-sanitizer
 *   gpu_sweep all        streams, graphs, oom, then cases with the time left,
 *                        each in a child process (a crash or a hang of one
 *                        mode is reported, not fatal), and one summary table
 * Options:
 *   --seed S        base seed of the random cases (default 1)
 *   --seconds T     time budget: cases (default 300) / all (default 300,
 *                   streams+graphs+oom first, cases get what is left)
 *   --only K        run case K of the seed alone, verbosely (reproduces a
 *                   failure; the sweep's long-lived context is then fresh;
 *                   K >= 1000000: the MASS twin of draft case K - 1000000)
 *   --max-n N       cap the sequence length of random cases (default 20000)
 *   --soak N        calls of the oom mode's soak (default 1000)
 *   --methods P     small/cases: only methods whose name starts with P
 *   --timeout T     watchdog of a standalone mode (seconds; 0 = none)
 *   --verbose       one line per case
 *   --plan          cases: list the cases and the CPU reference's work
 *                   without running anything (no device needed)
 *   --cpu-device    harness self-test without a GPU: the "device" is a
 *                   second CPU context holding the full tensors, so every
 *                   sampled-row reference must equal it bit for bit (cases
 *                   and small only)
 * Exit status: 0 all passed, 1 failures (or fewer cases than asked),
 * 2 usage, 3 no CUDA device, 4 watchdog.  Lines "@@ mode=..." are the
 * machine-readable result of each mode; "FAIL ..." lines name each failure
 * with the configuration that reproduces it.
 *
 * The reference.  The CPU reference is slow (one query row at a time), so a
 * case computes it on >= 64 sampled query rows only: whole 128-row blocks
 * of Q (a random block, often the partial last block and block 0), copied
 * into a gathered [B,H,rows,D] tensor, against the full K and V.  Every
 * method quantizes Q per 128-row block (INT8, E4M3) or per row (BF16,
 * Hadamard), so whole blocks keep their scales; the exception is NVFP4's
 * per-head tensor scale (amax over every row of Q), so sage4/vc4 cases
 * make sure the head's largest |Q| entry (after the Hadamard rotation)
 * lies in a sampled row.  V-Smooth needs q and k of the same N in
 * qva_attention, so the vc8/vc4 references call the CPU backend's
 * qvi_cpu_attention directly with the gathered rows (the permutation
 * depends on V alone).  Draft's partition and routing depend on all of Q,
 * so draft cases run the CPU on the full tensors and stay small.  Draft
 * cases draw fixed quotas (draft@S0/S4/S8/S16); about half of them have a
 * MASS twin, case K + 1000000, that repeats case K with an adaptive budget
 * (draft@pM[/S4/S8/S16] and min_keep/max_keep from a generator of its own,
 * so no case of an earlier seed changed) and runs right after it; the
 * per-method table counts the twins as "draft@p* (adaptive)".
 * The device output is poisoned (NaN bytes, guard zones around every
 * allocation) before each call; every element of every row must be finite
 * afterwards, padding and guards untouched, the inputs unchanged, and the
 * sampled rows within the per-method tolerances of tests/test_backend.c
 * (atol + rtol |ref| per element and a global rel-L2; LSE likewise).
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "draft/plan.h"
#include "internal.h"

/* ================================================================ globals */

typedef struct opts {
    const char *mode;
    int n;              /* cases asked for */
    uint64_t seed;
    double seconds;     /* budget of cases / all */
    int only;           /* --only K, or -1 */
    int max_n;
    int soak;
    const char *methods;
    int timeout;
    int verbose;
    int plan;
} opts;

static int g_cpu_dev;     /* --cpu-device */
static const char *g_mode = "?";
static int g_fail;        /* failures of the mode */
static int g_run;         /* cases / checks run */
static int g_skip;
static int g_dev_broken;  /* a sticky CUDA error: stop the mode */
static int g_verbose;
static int g_soft;        /* failf reports a FINDING (edge case) instead */
static int g_findings;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A failure: counted and printed with the mode. */
static void failf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static void failf(const char *fmt, ...) {
    va_list ap;
    if (g_soft) ++g_findings;
    else ++g_fail;
    printf("%s [%s] ", g_soft ? "FINDING" : "FAIL", g_mode);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* ================================================================ random */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t rng_u64(rng *r) { return mix64(r->s += 0x9E3779B97F4A7C15ull); }
static double rng_unit(rng *r) { return (double)(rng_u64(r) >> 11) * 0x1p-53; }
/* Uniform integer in [lo, hi]. */
static int rng_int(rng *r, int lo, int hi) {
    return lo + (int)(rng_u64(r) % (uint64_t)(hi - lo + 1));
}
static float rng_sym(rng *r) { return (float)(rng_unit(r) * 2.0 - 1.0); }
static int rng_pick(rng *r, const int *v, int n) { return v[rng_int(r, 0, n - 1)]; }
static rng rng_of(uint64_t seed, uint64_t salt) {
    rng r = {mix64(seed ^ mix64(salt + 0x243F6A8885A308D3ull))};
    return r;
}

/* ================================================================ device */

static int cu_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    printf("  cuda error: %s: %s\n", what, cudaGetErrorString(e));
    cudaGetLastError();
    return 0;
}

static qva_device dev_kind(void) { return g_cpu_dev ? QVA_DEVICE_CPU : QVA_DEVICE_CUDA; }

static void *dev_alloc(size_t n) {
    if (g_cpu_dev) return malloc(n ? n : 1);
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}
static void dev_free(void *p) {
    if (!p) return;
    if (g_cpu_dev) free(p);
    else cudaFree(p);
}
static int dev_sync(void) {
    if (g_cpu_dev) return 1;
    return cu_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}
/* Stream-ordered memset (the CPU device: immediate). */
static int dev_memset(void *p, int v, size_t n, cudaStream_t s) {
    if (g_cpu_dev) {
        memset(p, v, n);
        return 1;
    }
    return cu_ok(cudaMemsetAsync(p, v, n, s), "cudaMemsetAsync");
}
/* Synchronous copies: a pageable cudaMemcpy may return before its DMA
 * lands, and non-blocking streams do not wait for the legacy stream, so
 * the device is synchronized after an upload and before a download. */
static int dev_put(void *d, const void *h, size_t n) {
    if (g_cpu_dev) {
        memcpy(d, h, n);
        return 1;
    }
    return cu_ok(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D") &&
           cu_ok(cudaDeviceSynchronize(), "sync after H2D");
}
static int dev_get(void *h, const void *d, size_t n) {
    if (g_cpu_dev) {
        memcpy(h, d, n);
        return 1;
    }
    return cu_ok(cudaDeviceSynchronize(), "sync before D2H") &&
           cu_ok(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

/* After a failed synchronization: is the CUDA context still usable?  A
 * sticky error (illegal address, ...) poisons every later call, so the
 * mode stops instead of reporting hundreds of consequential failures. */
static int device_still_usable(void) {
    if (g_cpu_dev) return 1;
    cudaGetLastError();
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, 256);
    if (e == cudaSuccess) e = cudaMemset(p, 0, 256);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (p) cudaFree(p);
    if (e != cudaSuccess) {
        printf("  the CUDA context is broken (sticky error: %s): stopping this mode\n",
               cudaGetErrorString(e));
        g_dev_broken = 1;
        return 0;
    }
    return 1;
}

/* ================================================================ buffers */

/* One device allocation with a host mirror of its payload: GUARD bytes of
 * 0xFF on each side catch writes past the ends; the mirror holds what the
 * payload should contain (0xFF where no element lives). */
#define GUARD 512
typedef struct dbuf {
    size_t bytes;
    unsigned char *host;
    unsigned char *dbase;
} dbuf;

static unsigned char *dbuf_dev(const dbuf *b) { return b->dbase + GUARD; }
static size_t dbuf_total(const dbuf *b) { return b->bytes + 2 * (size_t)GUARD; }
static void dbuf_free(dbuf *b) {
    free(b->host);
    dev_free(b->dbase);
    memset(b, 0, sizeof *b);
}
static int dbuf_init(dbuf *b, size_t bytes) {
    memset(b, 0, sizeof *b);
    b->bytes = bytes;
    b->host = malloc(bytes ? bytes : 1);
    b->dbase = dev_alloc(bytes + 2 * (size_t)GUARD);
    if (!b->host || !b->dbase) {
        printf("  allocation of %zu bytes failed\n", bytes);
        dbuf_free(b);
        return 0;
    }
    memset(b->host, 0xFF, bytes);
    if (!dev_memset(b->dbase, 0xFF, dbuf_total(b), 0) || !dev_sync()) {
        dbuf_free(b);
        return 0;
    }
    return 1;
}
static int dbuf_put(const dbuf *b) { return dev_put(dbuf_dev(b), b->host, b->bytes); }
static int dbuf_poison(const dbuf *b, cudaStream_t s) {
    return dev_memset(b->dbase, 0xFF, dbuf_total(b), s);
}
/* The whole allocation, guards included (malloc'd; NULL on failure). */
static unsigned char *dbuf_get_all(const dbuf *b) {
    unsigned char *h = malloc(dbuf_total(b));
    if (h && !dev_get(h, b->dbase, dbuf_total(b))) {
        free(h);
        return NULL;
    }
    return h;
}
/* The payload alone. */
static unsigned char *dbuf_get(const dbuf *b) {
    unsigned char *h = malloc(b->bytes ? b->bytes : 1);
    if (h && !dev_get(h, dbuf_dev(b), b->bytes)) {
        free(h);
        return NULL;
    }
    return h;
}

/* ================================================================ tensors */

typedef struct tdesc {
    dbuf *buf;
    size_t off; /* elements from the payload start */
    qva_dtype dt;
    int64_t shape[4], stride[4];
} tdesc;

static size_t span_of(const int64_t shape[4], const int64_t stride[4]) {
    size_t s = 1;
    for (int i = 0; i < 4; ++i) s += (size_t)(shape[i] - 1) * (size_t)stride[i];
    return s;
}
static qva_tensor t_on(const tdesc *t, unsigned char *payload, qva_device dev) {
    qva_tensor x;
    x.data = payload + t->off * qva_dtype_size(t->dt);
    x.dtype = t->dt;
    x.device = dev;
    memcpy(x.shape, t->shape, sizeof x.shape);
    memcpy(x.stride, t->stride, sizeof x.stride);
    return x;
}
static qva_tensor t_dev(const tdesc *t) { return t_on(t, dbuf_dev(t->buf), dev_kind()); }
static qva_tensor t_host(const tdesc *t) { return t_on(t, t->buf->host, QVA_DEVICE_CPU); }

enum { LAY_HND, LAY_NHD, LAY_HND_PAD, LAY_NHD_PAD, LAY_PACKED, LAY_COUNT_ };
static const char *const LAY_NAME[LAY_COUNT_] = {"HND", "NHD", "HND+pad", "NHD+pad",
                                                 "packed-qkv"};

/* Element strides of [B,H,N,D] in a layout; prow pads each row (HND) or
 * head slot (NHD), ptok each head (HND) or token (NHD), pb each batch.
 * Packed: [B,N,3,H,D] with q, k, v at head-slot offsets 0, H, 2H. */
static void strides_for(int lay, int64_t H, int64_t N, int64_t D, int64_t prow, int64_t ptok,
                        int64_t pb, int64_t st[4]) {
    if (lay == LAY_HND || lay == LAY_HND_PAD) {
        const int64_t rs = D + prow, hs = N * rs + ptok;
        st[0] = H * hs + pb, st[1] = hs, st[2] = rs, st[3] = 1;
    } else {
        const int64_t hs = D + prow, ts = (lay == LAY_PACKED ? 3 : 1) * H * hs + ptok;
        st[0] = N * ts + pb, st[1] = hs, st[2] = ts, st[3] = 1;
    }
}

static void tdesc_set(tdesc *t, dbuf *b, size_t off, qva_dtype dt, int64_t B, int64_t H,
                      int64_t N, int64_t D, const int64_t st[4]) {
    t->buf = b;
    t->off = off;
    t->dt = dt;
    t->shape[0] = B, t->shape[1] = H, t->shape[2] = N, t->shape[3] = D;
    memcpy(t->stride, st, sizeof t->stride);
}

/* ---------------------------------------------------------------- values */

/* Each row (b,h,n) draws from its own generator, so a fill is the same
 * whatever the number of OpenMP threads (and the rows fill in parallel). */
static void fill_rows(const qva_tensor *t, uint64_t seed, float amp, const float *bias,
                      const float *cent /* [H*B][8][128] or NULL */) {
    const int64_t H = t->shape[1], N = t->shape[2], D = t->shape[3], rows = t->shape[0] * H * N;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
        const int64_t b = i / (H * N), h = (i / N) % H, n = i % N;
        rng r = rng_of(seed, (uint64_t)i);
        const float *cj = cent ? cent + ((size_t)(b * H + h) * 8 + (size_t)rng_int(&r, 0, 7)) * 128 : NULL;
        const int64_t o = qvi_offset(t, b, h, n, 0);
        for (int64_t c = 0; c < D; ++c)
            qvi_store_elem(t, o + c, (bias ? bias[c] : 0.0f) + (cj ? cj[c] : 0.0f) + amp * rng_sym(&r));
    }
}

/* q-like values amp * U(-1,1). */
static void fill_uniform(const qva_tensor *t, uint64_t seed, float amp) {
    fill_rows(t, seed, amp, NULL, NULL);
}

/* K: 2 U(-1,1) plus a bias shared by every token (DiT keys carry one):
 * mode 0 none, 1 the constant kb, 2 a random value in [-kb, kb] per channel. */
static void fill_k(const qva_tensor *t, uint64_t seed, int mode, float kb) {
    float bias[128];
    rng r = rng_of(seed, 0xB1A5u);
    for (int c = 0; c < 128; ++c) bias[c] = mode == 0 ? 0.0f : mode == 1 ? kb : kb * rng_sym(&r);
    fill_rows(t, seed, 2.0f, bias, NULL);
}

/* V: style 0 U(-1,1); style 1 eight clusters per head, each token a
 * center plus 0.25 U(-1,1), plus a channel bias (what V-Smooth's grouping
 * and demeaning are for). */
static void fill_v(const qva_tensor *t, uint64_t seed, int style) {
    if (style == 0) {
        fill_rows(t, seed, 1.0f, NULL, NULL);
        return;
    }
    const size_t heads = (size_t)(t->shape[0] * t->shape[1]);
    float *cent = malloc(heads * 8 * 128 * sizeof *cent), bias[128];
    if (!cent) {
        fill_rows(t, seed, 1.0f, NULL, NULL);
        return;
    }
    rng r = rng_of(seed, 0xCE17u);
    for (int c = 0; c < 128; ++c) bias[c] = 0.5f * rng_sym(&r);
    for (size_t i = 0; i < heads * 8 * 128; ++i) cent[i] = rng_sym(&r);
    fill_rows(t, seed, 0.25f, bias, cent);
    free(cent);
}

/* ================================================================ tolerances */

typedef struct tolr {
    double atol, rtol, rel_l2; /* output vs the CPU reference          */
    double latol, lrtol;       /* LSE                                   */
} tolr;

/* tests/test_backend.c's TOLS and lse_tol (docs/NUMERICS.md §6); draft:
 * the tolerance of the lowest-precision phase the fractions ask for, and
 * bf16's (or the warm-up method's) on a dense warm-up step. */
static tolr tol_for(const qva_config *cfg) {
    qva_config warm; /* a warm-up step run as another dense method: its tolerances */
    if (qvi_draft_warmup_config(cfg, &warm)) return tol_for(&warm);
    tolr t = {2e-3, 2e-2, 2e-3, 2e-4, 1e-5};
    switch (cfg->method) {
    case QVA_METHOD_FP8: t.atol = 2e-2, t.rtol = 5e-2, t.rel_l2 = 2e-2; break;
    case QVA_METHOD_SAGE8:
    case QVA_METHOD_VC8: t.atol = 1e-2, t.rtol = 5e-2, t.rel_l2 = 1e-2; break;
    case QVA_METHOD_SAGE4:
    case QVA_METHOD_VC4: t.atol = 5e-2, t.rtol = 1e-1, t.rel_l2 = 5e-2; break;
    case QVA_METHOD_DRAFT:
        if (cfg->step < cfg->draft.dense_warmup_steps) break;
        if (cfg->draft.frac4 > 0) t.atol = 5e-2, t.rtol = 1e-1, t.rel_l2 = 5e-2;
        else if (cfg->draft.frac8 > 0) t.atol = 1e-2, t.rtol = 5e-2, t.rel_l2 = 1e-2;
        break;
    default: break;
    }
    /* LSE: docs/NUMERICS.md §6, as test_backend's lse_tol: where l sums the
     * P codes (ExpCast, or the code sum that sage8 and vc8 take by default)
     * a score one ulp off can move one code by one step */
    const int sums_codes = cfg->expcast != QVA_EXPCAST_OFF || cfg->p_sum == QVA_P_SUM_CODES;
    if (cfg->method == QVA_METHOD_DRAFT) t.latol = 1e-3, t.lrtol = 1e-3;
    else if (cfg->method == QVA_METHOD_FP8) t.latol = cfg->p_sum == QVA_P_SUM_CODES ? 2e-2 : 1e-2;
    else if (sums_codes) t.latol = 2e-3, t.lrtol = 1e-5;
    return t;
}

static int is_vc(qva_method m) { return m == QVA_METHOD_VC8 || m == QVA_METHOD_VC4; }
static int is_fp4(qva_method m) { return m == QVA_METHOD_SAGE4 || m == QVA_METHOD_VC4; }

/* ================================================================ checks */

/* Bytes of a downloaded allocation (guards + payload) that no element of
 * the views owns and that no longer hold the poison 0xFF: stray writes. */
static size_t stray_bytes(const unsigned char *all, const dbuf *b, const tdesc *const *views,
                          int nviews) {
    unsigned char *mask = calloc(b->bytes ? b->bytes : 1, 1);
    if (!mask) return 0;
    for (int v = 0; v < nviews; ++v) {
        const tdesc *t = views[v];
        const size_t es = qva_dtype_size(t->dt), row = (size_t)t->shape[3] * es;
        for (int64_t bb = 0; bb < t->shape[0]; ++bb)
            for (int64_t h = 0; h < t->shape[1]; ++h)
                for (int64_t n = 0; n < t->shape[2]; ++n) {
                    const size_t o = (t->off + (size_t)(bb * t->stride[0] + h * t->stride[1] +
                                                        n * t->stride[2])) * es;
                    if (o + row <= b->bytes) memset(mask + o, 1, row);
                }
    }
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)GUARD; ++i)
        bad += (all[i] != 0xFF) + (all[GUARD + b->bytes + i] != 0xFF);
    for (size_t i = 0; i < b->bytes; ++i) bad += !mask[i] && all[GUARD + i] != 0xFF;
    free(mask);
    return bad;
}

/* Elements of a (downloaded) view that are NaN or Inf; lse: -inf allowed. */
static size_t nonfinite(const qva_tensor *t, int lse, int64_t *first_row) {
    size_t bad = 0;
    *first_row = -1;
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t n = 0; n < t->shape[2]; ++n) {
                const int64_t o = qvi_offset(t, b, h, n, 0);
                for (int64_t c = 0; c < t->shape[3]; ++c) {
                    const float x = qvi_load_elem(t, o + c);
                    const int ok = isfinite(x) || (lse && isinf(x) && x < 0);
                    if (!ok && bad++ == 0) *first_row = n;
                }
            }
    return bad;
}

typedef struct cmpres {
    size_t n, bad, exact_diff;
    double num, den, max_abs;
    int64_t fb, fh, frow, fc;
    double fgot, fref;
} cmpres;

/* got: device output (host copy, device strides) at rows sel[i]; ref: CPU
 * output at rows i. lse: -inf must match exactly. */
static void compare_view(const qva_tensor *got, const qva_tensor *ref, const int64_t *sel,
                         int64_t nsel, double atol, double rtol, int lse, cmpres *r) {
    memset(r, 0, sizeof *r);
    r->fb = r->fh = r->frow = r->fc = -1;
    for (int64_t b = 0; b < got->shape[0]; ++b)
        for (int64_t h = 0; h < got->shape[1]; ++h)
            for (int64_t i = 0; i < nsel; ++i) {
                const int64_t og = qvi_offset(got, b, h, sel[i], 0), orf = qvi_offset(ref, b, h, i, 0);
                for (int64_t c = 0; c < got->shape[3]; ++c) {
                    const float g = qvi_load_elem(got, og + c), f = qvi_load_elem(ref, orf + c);
                    ++r->n;
                    if (memcmp(&g, &f, sizeof g)) ++r->exact_diff;
                    int ok;
                    if (lse && isinf(f)) {
                        ok = g == f;
                    } else {
                        const double d = fabs((double)g - (double)f);
                        ok = d <= atol + rtol * fabs((double)f);
                        if (isfinite(d)) {
                            r->num += d * d, r->den += (double)f * f;
                            if (d > r->max_abs) r->max_abs = d;
                        } else {
                            r->num = INFINITY;
                        }
                    }
                    if (!ok && r->bad++ == 0) {
                        r->fb = b, r->fh = h, r->frow = sel[i], r->fc = c;
                        r->fgot = g, r->fref = f;
                    }
                }
            }
}
static double cmp_rel_l2(const cmpres *r) { return sqrt(r->num / (r->den > 0 ? r->den : 1.0)); }

/* ================================================================ cases */

static const char *const METHODS[] = {
    "bf16",  "fp8",           "fp8+expcast", "fp8+hadamard", "fp8+expcast+hadamard",
    "sage8", "sage8+expcast", "sage8+nohadamard+fp32sum", "sage8+expcast+nohadamard",
    "vc8",   "vc8+expcast",   "vc8+hadamard", "vc8+expcast+hadamard",
    "sage4", "sage4+hadamard", "vc4",         "vc4+hadamard",
    "draft", "draft",         "draft",        "draft",        "draft"};
#define NMETHODS (int)(sizeof METHODS / sizeof *METHODS)
static const char *const QUOTAS[] = {"0/0/0/100",  "85/0/0/15",   "85/0/7.5/7.5", "0/40/30/30",
                                     "50/20/15/15", "70/0/30/0",  "90/10/0/0",    "60/20/20/0",
                                     "0/0/100/0",  "0/100/0/0",   "95/0/0/5",     "30/30/30/10"};
#define NQUOTAS (int)(sizeof QUOTAS / sizeof *QUOTAS)
/* Method families for the per-method table: METHODS up to the first draft
 * entry, then the draft cases by budget (fixed quotas, adaptive MASS). */
#define FAM_DRAFT 17
#define FAM_MASS 18
#define NFAMILIES 19

/* The adaptive MASS budget (draft@pM[/S4/S8/S16], docs/DRAFT.md "Adaptive
 * budget") runs in twin cases, so that every case a seed produced before
 * stays what it was: case K + MASS_TWIN is the MASS twin of draft case K,
 * drawn from K's generator exactly as K (grid, prefix, heads, dtypes,
 * layouts, value styles, steps, warm-up, the expcast draw) except the
 * method, whose mass level, 4/8/16 split and min_keep/max_keep come from a
 * stream of their own (mass_rng).  About half of the draft cases have a
 * twin (has_mass_twin: from the same stream); a sweep runs it right after
 * K.  What hangs on the case id is the twin's own: its layer (so it shares
 * no draft state with K), the tensors' random values (run_scase) and the
 * fresh-context draw. */
#define MASS_TWIN 1000000
static const char *const MASS_LEVELS[] = {"50", "75", "90", "95", "95", "98", "99", "99.9", "100", "0.5"};
#define NMASS_LEVELS (int)(sizeof MASS_LEVELS / sizeof *MASS_LEVELS)
/* "": every kept pair at 16 bits; otherwise the S4/S8/S16 split */
static const char *const MASS_SPLITS[] = {"",          "",          "",          "/0/0/100",  "/0/50/50",
                                          "/20/30/50", "/10/20/70", "/0/100/0",  "/100/0/0", "/30/30/40",
                                          "/50/0/50",  "/0/7.5/92.5"};
#define NMASS_SPLITS (int)(sizeof MASS_SPLITS / sizeof *MASS_SPLITS)
/* min_keep / max_keep: the defaults (0.05 / 1, the first entry) in about
 * two twins of three, else one of the others: floors and caps that bind, no
 * floor, a cap of none and a floor of all */
static const float MASS_KEEP[][2] = {{0.05f, 1.0f}, {0.0f, 1.0f},  {0.6f, 1.0f}, {0.0f, 0.2f},
                                     {0.3f, 0.45f}, {0.1f, 0.5f},  {0.02f, 0.9f}, {0.0f, 0.0f},
                                     {1.0f, 1.0f}};
#define NMASS_KEEP (int)(sizeof MASS_KEEP / sizeof *MASS_KEEP)

static int is_draft_slot(int idx) {
    return idx >= 0 && idx < MASS_TWIN && !strcmp(METHODS[idx % NMETHODS], "draft");
}
/* The MASS stream of draft case K: a generator of its own, so that none of
 * K's draws moves. */
static rng mass_rng(uint64_t seed, int idx) { return rng_of(seed ^ 0x4D4153534255ull, (uint64_t)idx); }
static int has_mass_twin(uint64_t seed, int idx) {
    if (!is_draft_slot(idx)) return 0;
    rng m = mass_rng(seed, idx);
    return rng_unit(&m) < 0.5;
}
/* The MASS twin's method parts, from draft case idx's MASS stream. */
typedef struct mass_pick {
    const char *level, *split;
    float min_keep, max_keep;
} mass_pick;
static mass_pick pick_mass(uint64_t seed, int idx) {
    rng m = mass_rng(seed, idx);
    (void)rng_unit(&m); /* has_mass_twin's draw */
    mass_pick p;
    p.level = MASS_LEVELS[rng_int(&m, 0, NMASS_LEVELS - 1)];
    p.split = MASS_SPLITS[rng_int(&m, 0, NMASS_SPLITS - 1)];
    const int other = rng_unit(&m) < 0.35;
    const int k = rng_int(&m, 1, NMASS_KEEP - 1);
    p.min_keep = MASS_KEEP[other ? k : 0][0], p.max_keep = MASS_KEEP[other ? k : 0][1];
    return p;
}
/* The case after id in a sweep: 0, 1, 2, ..., each draft case K with a twin
 * followed by K + MASS_TWIN; -1 at the end of the id space. */
static int next_case_id(uint64_t seed, int id) {
    if (id < MASS_TWIN && has_mass_twin(seed, id)) return id + MASS_TWIN;
    const int base = id >= MASS_TWIN ? id - MASS_TWIN : id;
    return base + 1 < MASS_TWIN ? base + 1 : -1;
}

typedef struct scase {
    int idx;
    uint64_t seed;
    char method[64];
    int family; /* index into METHODS (draft: the first draft entry) */
    qva_config cfg;
    int B, H, Nq, Nk, D;
    qva_dtype dtq, dtk, dtv, dto;
    int lay, olay, llay, with_lse;
    int64_t prow, ptok, pb, poff; /* input pads and base offset (elements) */
    int64_t oprow, optok, opb, ooff;
    int nsteps, steps[4], perturb_v;
    int qamp_i, kmode, vstyle;
    int full_ref;
    int nblk_sel, blk[6];
} scase;

static const char *dt_name(qva_dtype d) { return d == QVA_F32 ? "f32" : d == QVA_BF16 ? "bf16" : "f16"; }

static void describe(const scase *c, char *buf, size_t len) {
    char steps[64] = "", rows[96] = "", extra[200] = "";
    size_t o = 0;
    for (int i = 0; i < c->nsteps; ++i)
        o += (size_t)snprintf(steps + o, sizeof steps - o, "%s%d", i ? "," : "", c->steps[i]);
    if (c->full_ref) {
        snprintf(rows, sizeof rows, "all %d rows", c->Nq);
    } else {
        o = (size_t)snprintf(rows, sizeof rows, "blocks");
        for (int i = 0; i < c->nblk_sel && o < sizeof rows; ++i)
            o += (size_t)snprintf(rows + o, sizeof rows - o, " %d", c->blk[i]);
    }
    const qva_config *g = &c->cfg;
    o = 0;
    if (g->sm_scale > 0) o += (size_t)snprintf(extra + o, sizeof extra - o, " sm_scale=%g", (double)g->sm_scale);
    if (g->hadamard && g->hadamard_signs)
        o += (size_t)snprintf(extra + o, sizeof extra - o, " signs(seed=%#" PRIx64 ")", g->hadamard_seed);
    if (is_vc(g->method))
        o += (size_t)snprintf(extra + o, sizeof extra - o,
                              " vsmooth(k=%d iters=%d warm=%d %s refresh=%d) num_steps=%d layer=%d%s",
                              g->vsmooth.clusters, g->vsmooth.iters, g->vsmooth.warm_start,
                              g->vsmooth.schedule == QVA_SCHEDULE_ALWAYS   ? "always"
                              : g->vsmooth.schedule == QVA_SCHEDULE_DEMEAN ? "demean"
                                                                           : "paper",
                              g->vsmooth.refresh_every, g->num_steps, g->layer,
                              c->perturb_v ? " new-V-per-step" : "");
    if (g->method == QVA_METHOD_DRAFT)
        o += (size_t)snprintf(extra + o, sizeof extra - o,
                              " grid=%dx%dx%d prefix=%d%s lambda=%g warmup_steps=%d warmup_method=%d",
                              g->draft.grid_t, g->draft.grid_h, g->draft.grid_w,
                              g->draft.prefix_tokens, g->draft.prefix_at_end ? "(last)" : "(first)",
                              (double)g->draft.lambda, g->draft.dense_warmup_steps,
                              (int)g->draft.warmup_method);
    if (g->method == QVA_METHOD_DRAFT && g->draft.budget == QVA_DRAFT_BUDGET_MASS)
        o += (size_t)snprintf(extra + o, sizeof extra - o, " min_keep=%g max_keep=%g%s",
                              (double)g->draft.min_keep, (double)g->draft.max_keep,
                              c->idx >= MASS_TWIN ? " (MASS twin)" : "");
    snprintf(buf, len,
             "case %d (--seed %" PRIu64 " --only %d): %s%s | B=%d H=%d Nq=%d Nk=%d D=%d | q/k/v %s/%s/%s "
             "out %s | in %s(row+%lld tok+%lld b+%lld off %lld) out %s(row+%lld tok+%lld b+%lld off "
             "%lld) lse %s | steps [%s] | ref %s",
             c->idx, c->seed, c->idx, c->method, extra, c->B, c->H, c->Nq, c->Nk, c->D,
             dt_name(c->dtq), dt_name(c->dtk), dt_name(c->dtv), dt_name(c->dto), LAY_NAME[c->lay],
             (long long)c->prow, (long long)c->ptok, (long long)c->pb, (long long)c->poff,
             LAY_NAME[c->olay], (long long)c->oprow, (long long)c->optok, (long long)c->opb,
             (long long)c->ooff, c->with_lse ? (c->llay == 0 ? "[B,H,N]" : c->llay == 1 ? "[B,N,H]" : "padded") : "none",
             steps, rows);
}

/* Budgets of one case's CPU work (multiply-adds), so that a case costs well
 * under a second on the device host's 16 cores. */
#define ROW_BUDGET 1.0e9   /* sampled rows x keys x D, over all steps   */
#define KM_BUDGET 1.0e9    /* k-means: keys x clusters x D x iterations */
#define DRAFT_BUDGET 6.0e8 /* draft (full CPU): N x N x D x heads       */
#define GEN_BUDGET 1.2e7   /* elements generated on the host            */

static int pick_n(rng *r, int max_n) {
    static const int special[] = {1,    2,    63,   64,   65,   127,  128,   129,   255,
                                  256,  257,  383,  384,  385,  1000, 4095,  4096,  4097,
                                  8191, 8192, 8193, 16383, 16384, 16385, 19999, 20000};
    int n;
    const double u = rng_unit(r);
    if (u < 0.2) n = special[rng_int(r, 0, (int)(sizeof special / sizeof *special) - 1)];
    else if (u < 0.4) n = rng_int(r, 1, 300);
    else if (u < 0.7) n = rng_int(r, 300, 4096);
    else if (u < 0.88) n = rng_int(r, 4096, 12000);
    else n = rng_int(r, 12000, 20000);
    return n > max_n ? rng_int(r, 1, max_n) : n;
}

/* The Q blocks whose rows the CPU computes (sorted, unique). */
static void pick_blocks(scase *c, rng *r) {
    const int nblk = (c->Nq + QVI_BLOCK - 1) / QVI_BLOCK;
    c->nblk_sel = 0;
    if (c->full_ref || c->Nq <= 2 * QVI_BLOCK) {
        c->full_ref = 1;
        return;
    }
    int set[6], n = 0;
    set[n++] = rng_int(r, 0, nblk - 2); /* a full block */
    if (rng_unit(r) < 0.5) set[n++] = nblk - 1;
    if (rng_unit(r) < 0.3) set[n++] = 0;
    if (rng_unit(r) < 0.2) set[n++] = rng_int(r, 0, nblk - 1);
    for (int i = 0; i < n; ++i) /* sort, unique */
        for (int j = i + 1; j < n; ++j)
            if (set[j] < set[i]) {
                const int t = set[i];
                set[i] = set[j], set[j] = t;
            }
    for (int i = 0; i < n; ++i)
        if (c->nblk_sel == 0 || c->blk[c->nblk_sel - 1] != set[i]) c->blk[c->nblk_sel++] = set[i];
}

static int64_t sel_rows(const scase *c) {
    if (c->full_ref) return c->Nq;
    int64_t n = 0;
    for (int i = 0; i < c->nblk_sel; ++i) {
        const int64_t r0 = (int64_t)c->blk[i] * QVI_BLOCK;
        n += (c->Nq - r0 < QVI_BLOCK) ? c->Nq - r0 : QVI_BLOCK;
    }
    return n;
}

/* The CPU reference's work in a case: sampled rows x keys x D x heads x
 * steps (draft: every row). */
static double case_work(const scase *c) {
    return (double)c->B * c->H * (double)sel_rows(c) * c->Nk * c->D * c->nsteps;
}

/* The V-Smooth step sequences: group / reuse / plain and the edges. */
static void pick_vc_steps(scase *c, rng *r) {
    qva_config *g = &c->cfg;
    static const int ns[] = {8, 12, 20, 40, 50};
    const int n = rng_pick(r, ns, 5), w = (n + 3) / 4;
    g->num_steps = n;
    c->perturb_v = rng_unit(r) < 0.7;
    switch (rng_int(r, 0, 6)) {
    case 0: g->num_steps = 0, c->nsteps = 1, c->steps[0] = rng_int(r, 0, 3); break; /* unknown: group */
    case 1: c->nsteps = 3, c->steps[0] = 0, c->steps[1] = 1, c->steps[2] = w; break; /* G R P */
    case 2: c->nsteps = 2, c->steps[0] = 0, c->steps[1] = w + 1 < n ? w + 1 : w; break; /* G P */
    case 3: g->num_steps = 40, c->nsteps = 2, c->steps[0] = 0, c->steps[1] = 4; break; /* G G(warm) */
    case 4: c->nsteps = 1, c->steps[0] = 1; break;  /* reuse with nothing stored: groups */
    case 5: c->nsteps = 1, c->steps[0] = w; break;  /* plain with nothing stored */
    default:
        g->vsmooth.schedule = QVA_SCHEDULE_ALWAYS;
        c->nsteps = 2, c->steps[0] = 0, c->steps[1] = 1;
        break;
    }
}

/* The base fields of a case; the random generator and the small list fill
 * the rest. */
static int case_init(scase *c, int idx, uint64_t seed, const char *method) {
    memset(c, 0, sizeof *c);
    c->idx = idx;
    c->seed = seed;
    snprintf(c->method, sizeof c->method, "%s", method);
    c->family = FAM_DRAFT;
    for (int i = 0; i < FAM_DRAFT; ++i)
        if (!strcmp(METHODS[i], method)) c->family = i;
    qva_config_default(&c->cfg);
    if (qva_config_set_method(&c->cfg, method) != QVA_OK) {
        printf("internal: bad method '%s': %s\n", method, qva_last_error());
        return 0;
    }
    if (c->cfg.method == QVA_METHOD_DRAFT && c->cfg.draft.budget == QVA_DRAFT_BUDGET_MASS) c->family = FAM_MASS;
    c->cfg.layer = idx;
    c->nsteps = 1;
    c->dtq = c->dtk = c->dtv = c->dto = QVA_BF16;
    c->qamp_i = 1;
    return 1;
}

static void set_draft_grid(scase *c, int T, int GH, int GW, int P, int at_end) {
    c->cfg.draft.grid_t = T, c->cfg.draft.grid_h = GH, c->cfg.draft.grid_w = GW;
    c->cfg.draft.prefix_tokens = P, c->cfg.draft.prefix_at_end = at_end;
    c->Nq = c->Nk = P + T * GH * GW;
    c->full_ref = 1;
}

/* Case idx of a seed; idx >= MASS_TWIN: the MASS twin of draft case
 * idx - MASS_TWIN (every draw of that case, then the MASS stream's). */
static int gen_case(scase *c, int idx, const opts *o) {
    const int twin = idx >= MASS_TWIN, bidx = twin ? idx - MASS_TWIN : idx;
    if (twin && !is_draft_slot(bidx)) {
        printf("case %d: not a MASS twin (case %d is not a draft case)\n", idx, bidx);
        return 0;
    }
    rng r = rng_of(o->seed, (uint64_t)bidx);
    char method[64];
    const char *base = METHODS[bidx % NMETHODS];
    if (!strcmp(base, "draft")) {
        /* expcast first, then the quota: the order in which GCC evaluated
         * the arguments of the snprintf that used to draw both (right to
         * left), so that the cases of earlier seeds stay the same */
        const char *ec = rng_unit(&r) < 0.5 ? "+expcast" : "";
        const char *quota = QUOTAS[rng_int(&r, 0, NQUOTAS - 1)];
        if (twin) { /* K's quota and expcast draws are made all the same */
            const mass_pick mp = pick_mass(o->seed, bidx);
            snprintf(method, sizeof method, "draft@p%s%s%s", mp.level, mp.split, ec);
        } else {
            snprintf(method, sizeof method, "draft@%s%s", quota, ec);
        }
    } else {
        snprintf(method, sizeof method, "%s", base);
    }
    if (!case_init(c, idx, o->seed, method)) return 0;
    qva_config *g = &c->cfg;
    if (twin) {
        const mass_pick mp = pick_mass(o->seed, bidx);
        g->draft.min_keep = mp.min_keep, g->draft.max_keep = mp.max_keep;
    }
    const int draft = g->method == QVA_METHOD_DRAFT;
    if (rng_unit(&r) < 0.2) g->sm_scale = (float)(0.03 + 0.17 * rng_unit(&r));
    if (g->hadamard && rng_unit(&r) < 0.5) {
        g->hadamard_signs = 1;
        g->hadamard_seed = rng_u64(&r);
    }
    g->check_finite = rng_unit(&r) < 0.5;
    if (is_vc(g->method)) {
        static const int ks[] = {1, 4, 16, 32, 32, 64}, its[] = {0, 1, 2, 2, 3}, re[] = {4, 4, 2, 3};
        g->vsmooth.clusters = rng_pick(&r, ks, 6);
        g->vsmooth.iters = rng_pick(&r, its, 5);
        g->vsmooth.warm_start = rng_unit(&r) < 0.7;
        g->vsmooth.refresh_every = rng_pick(&r, re, 4);
        pick_vc_steps(c, &r);
        if (rng_unit(&r) < 0.1) g->layer = idx + 1000000; /* large layer ids key the state too */
    }
    c->D = rng_unit(&r) < 0.5 ? 64 : 128;
    c->B = rng_unit(&r) < 0.6 ? 1 : rng_unit(&r) < 0.75 ? 2 : 3;
    c->H = rng_int(&r, 1, 16);

    if (draft) {
        static const int dit[][3] = {{2, 16, 16}, {1, 30, 40}, {3, 12, 20}, {2, 24, 24}, {4, 8, 32}};
        const int nmax = o->max_n < 3072 ? o->max_n : 3072;
        int T, GH, GW, P, tries = 0;
        do {
            if (rng_unit(&r) < 0.3) {
                const int k = rng_int(&r, 0, 4);
                T = dit[k][0], GH = dit[k][1], GW = dit[k][2];
            } else {
                T = rng_int(&r, 1, 4), GH = rng_int(&r, 1, 48), GW = rng_int(&r, 1, 48);
            }
            P = rng_unit(&r) < 0.4 ? 0 : rng_int(&r, 1, 300);
        } while (P + T * GH * GW > nmax && ++tries < 100);
        if (P + T * GH * GW > nmax) T = 1, GH = 1, GW = 1, P = 0;
        set_draft_grid(c, T, GH, GW, P, rng_unit(&r) < 0.5);
        static const float lam[] = {0.2f, 0.2f, 0.2f, 0.0f, 0.5f, 1.0f};
        g->draft.lambda = lam[rng_int(&r, 0, 5)];
        const int wu = rng_unit(&r) < 0.6 ? 0 : rng_int(&r, 1, 2);
        g->draft.dense_warmup_steps = wu;
        if (wu > 0 && rng_unit(&r) < 0.4) { /* the warm-up as a dense 8-bit method */
            static const qva_method warm[] = {QVA_METHOD_SAGE8, QVA_METHOD_VC8, QVA_METHOD_FP8};
            g->draft.warmup_method = warm[rng_int(&r, 0, 2)];
        }
        if (wu > 0 && rng_unit(&r) < 0.5) c->nsteps = 2, c->steps[0] = 0, c->steps[1] = wu;
        else c->steps[0] = rng_int(&r, 0, 3);
        /* heads: the full CPU reference is N^2 D per head and step */
        double per = (double)c->Nq * c->Nq * c->D * c->nsteps;
        while (c->B * c->H > 1 && per * c->B * c->H > DRAFT_BUDGET) {
            if (c->H > 1) --c->H;
            else --c->B;
        }
    } else {
        c->Nq = pick_n(&r, o->max_n);
        c->Nk = c->Nq;
        if (!is_vc(g->method) && rng_unit(&r) < 0.1) c->Nk = pick_n(&r, o->max_n); /* cross */
        if (c->Nq <= 2 * QVI_BLOCK) c->full_ref = 1;
    }
    pick_blocks(c, &r);

    /* dtypes: q/k/v mostly alike (5%: mixed), the output often its own */
    static const qva_dtype dts[] = {QVA_F32, QVA_BF16, QVA_BF16, QVA_F16};
    c->dtq = c->dtk = c->dtv = dts[rng_int(&r, 0, 3)];
    if (rng_unit(&r) < 0.05) c->dtk = dts[rng_int(&r, 0, 3)], c->dtv = dts[rng_int(&r, 0, 3)];
    c->dto = rng_unit(&r) < 0.7 ? c->dtq : dts[rng_int(&r, 0, 3)];

    /* layouts, pads (odd ones too: the kernels must fall back from 16-byte
     * loads), base offsets that misalign the data pointer */
    static const int pads[] = {8, 64, 1, 3, 24, 128};
    const double u = rng_unit(&r);
    c->lay = u < 0.3 ? LAY_HND : u < 0.6 ? LAY_NHD : u < 0.72 ? LAY_HND_PAD : u < 0.84 ? LAY_NHD_PAD : LAY_PACKED;
    if (c->lay == LAY_PACKED && (c->Nq != c->Nk || c->dtk != c->dtq || c->dtv != c->dtq)) c->lay = LAY_NHD;
    if (c->lay == LAY_HND_PAD || c->lay == LAY_NHD_PAD || c->lay == LAY_PACKED) {
        c->prow = rng_unit(&r) < 0.5 ? 0 : rng_pick(&r, pads, 6);
        c->ptok = rng_unit(&r) < 0.5 ? 0 : rng_pick(&r, pads, 6);
        c->pb = rng_unit(&r) < 0.5 ? 0 : rng_pick(&r, pads, 6);
    }
    if (rng_unit(&r) < 0.1) c->poff = rng_int(&r, 1, 9);
    const double uo = rng_unit(&r);
    c->olay = uo < 0.4 ? LAY_HND : uo < 0.8 ? LAY_NHD : uo < 0.9 ? LAY_HND_PAD : LAY_NHD_PAD;
    if (c->olay >= LAY_HND_PAD) {
        c->oprow = rng_pick(&r, pads, 6);
        c->optok = rng_unit(&r) < 0.5 ? 0 : rng_pick(&r, pads, 6);
        c->opb = rng_unit(&r) < 0.5 ? 0 : rng_pick(&r, pads, 6);
    }
    if (rng_unit(&r) < 0.1) c->ooff = rng_int(&r, 1, 9);
    c->with_lse = rng_unit(&r) < 0.65;
    c->llay = rng_int(&r, 0, 2);

    /* values */
    c->qamp_i = rng_unit(&r) < 0.5 ? 1 : 2;
    c->kmode = rng_int(&r, 0, 2);
    c->vstyle = rng_unit(&r) < (is_vc(g->method) ? 0.6 : 0.3);

    /* cost caps: fewer heads, then fewer clusters */
    const double rows = (double)sel_rows(c);
    for (;;) {
        const double bh = (double)c->B * c->H;
        const double work = bh * rows * c->Nk * c->D * c->nsteps;
        const double gen = bh * ((double)c->Nq + 2.0 * c->Nk) * c->D;
        if ((work <= ROW_BUDGET && gen <= GEN_BUDGET) || bh <= 1) break;
        if (c->H > 1) --c->H;
        else --c->B;
    }
    if (is_vc(g->method)) {
        const double km = (double)c->B * c->H * c->Nk * c->D * (g->vsmooth.iters + 1) * c->nsteps;
        while (g->vsmooth.clusters > 1 && km * g->vsmooth.clusters > KM_BUDGET) g->vsmooth.clusters /= 2;
    }
    return 1;
}

/* ---------------------------------------------------------------- skips */

#define MAX_SKIP_REASONS 16
static char g_skip_why[MAX_SKIP_REASONS][160];
static int g_skip_cnt[MAX_SKIP_REASONS];
static void note_skip(const char *why) {
    ++g_skip;
    for (int i = 0; i < MAX_SKIP_REASONS; ++i) {
        if (!g_skip_why[i][0]) snprintf(g_skip_why[i], sizeof g_skip_why[i], "%s", why);
        if (!strcmp(g_skip_why[i], why) || i == MAX_SKIP_REASONS - 1) {
            ++g_skip_cnt[i];
            return;
        }
    }
}

/* ---------------------------------------------------------------- runner */

typedef struct case_state {
    const scase *c;
    int failed;
    char desc[1024];
} case_state;

static void case_err(case_state *cs, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void case_err(case_state *cs, const char *fmt, ...) {
    va_list ap;
    if (!cs->failed) printf("FAIL [%s] %s\n", g_mode, cs->desc);
    cs->failed = 1;
    printf("    ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* Rotated (if hadamard) max |x| of row n of a host view. */
static float row_amax(const qva_tensor *t, int64_t b, int64_t h, int64_t n, const float *signs) {
    float x[128];
    const int64_t D = t->shape[3], o = qvi_offset(t, b, h, n, 0);
    for (int64_t c = 0; c < D; ++c) x[c] = qvi_load_elem(t, o + c);
    if (signs) qva_hadamard(x, (int)D, signs);
    float m = 0.0f;
    for (int64_t c = 0; c < D; ++c) m = fabsf(x[c]) > m ? fabsf(x[c]) : m;
    return m;
}

/* NVFP4 quantizes Q with one tensor scale per head from the amax of every
 * row; the gathered rows must hold that amax, so the largest sampled row
 * is scaled up where needed.  Returns 0 if it could not be arranged. */
static int plant_fp4_amax(const scase *c, const qva_tensor *q, const int64_t *sel, int64_t nsel) {
    float signs[128], *sg = NULL;
    if (c->cfg.hadamard) {
        qvi_hadamard_signs(&c->cfg, c->D, signs);
        sg = signs;
    }
    for (int64_t b = 0; b < c->B; ++b)
        for (int64_t h = 0; h < c->H; ++h)
            for (int attempt = 0;; ++attempt) {
                float all = 0.0f, best = 0.0f;
                int64_t best_row = sel[0];
                for (int64_t n = 0; n < c->Nq; ++n) {
                    const float m = row_amax(q, b, h, n, sg);
                    all = m > all ? m : all;
                }
                for (int64_t i = 0; i < nsel; ++i) {
                    const float m = row_amax(q, b, h, sel[i], sg);
                    if (m > best) best = m, best_row = sel[i];
                }
                if (best >= all) break;
                if (attempt == 6 || best <= 0.0f) return 0;
                const float f = all / best * 1.02f;
                const int64_t o = qvi_offset(q, b, h, best_row, 0);
                for (int64_t ch = 0; ch < c->D; ++ch)
                    qvi_store_elem(q, o + ch, qvi_load_elem(q, o + ch) * f);
            }
    return 1;
}

/* The input buffers of a case must hold what was uploaded. */
static int inputs_intact(const dbuf *b) {
    unsigned char *all = dbuf_get_all(b);
    if (!all) return 0;
    int ok = 1;
    for (size_t i = 0; i < (size_t)GUARD && ok; ++i)
        ok = all[i] == 0xFF && all[GUARD + b->bytes + i] == 0xFF;
    ok = ok && !memcmp(all + GUARD, b->host, b->bytes);
    free(all);
    return ok;
}

typedef struct case_time {
    double dev_s, cpu_s;
} case_time;

/* Runs one case: 1 passed, 0 failed, -1 skipped. */
static int run_scase(const scase *c, qva_context_t *gctx_in, cudaStream_t stream, case_time *tm) {
    case_state cs;
    memset(&cs, 0, sizeof cs);
    cs.c = c;
    describe(c, cs.desc, sizeof cs.desc);
    char why[256] = "";
    if (!qva_supports(dev_kind(), &c->cfg, c->dtq, c->D, why, sizeof why)) {
        char reason[160];
        snprintf(reason, sizeof reason, "%s: %s", c->method, why);
        note_skip(reason);
        return -1;
    }
    const qva_config *g = &c->cfg;
    const int64_t B = c->B, H = c->H, Nq = c->Nq, Nk = c->Nk, D = c->D;
    dbuf bq, bk, bv, bo, bl;
    memset(&bq, 0, sizeof bq), memset(&bk, 0, sizeof bk), memset(&bv, 0, sizeof bv);
    memset(&bo, 0, sizeof bo), memset(&bl, 0, sizeof bl);
    tdesc tq, tk, tv, to, tlse;
    qva_context_t *gctx = gctx_in, *cctx = NULL;
    unsigned char *qg = NULL, *oref = NULL;
    float *lref = NULL;
    int64_t *sel = NULL;
    int ok = 0;
    rng r = rng_of(c->seed ^ 0x5eed5eedull, (uint64_t)c->idx);

    /* ---- buffers and descriptors */
    int64_t st[4];
    if (c->lay == LAY_PACKED) {
        strides_for(LAY_PACKED, H, Nq, D, c->prow, c->ptok, c->pb, st);
        const int64_t shape[4] = {B, H, Nq, D};
        const size_t span = span_of(shape, st) + 2 * (size_t)H * (size_t)st[1];
        if (!dbuf_init(&bq, ((size_t)c->poff + span) * qva_dtype_size(c->dtq))) goto out;
        tdesc_set(&tq, &bq, (size_t)c->poff, c->dtq, B, H, Nq, D, st);
        tdesc_set(&tk, &bq, (size_t)(c->poff + H * st[1]), c->dtk, B, H, Nk, D, st);
        tdesc_set(&tv, &bq, (size_t)(c->poff + 2 * H * st[1]), c->dtv, B, H, Nk, D, st);
    } else {
        dbuf *bufs[3] = {&bq, &bk, &bv};
        tdesc *ts[3] = {&tq, &tk, &tv};
        const qva_dtype dts[3] = {c->dtq, c->dtk, c->dtv};
        for (int i = 0; i < 3; ++i) {
            const int64_t n = i == 0 ? Nq : Nk;
            strides_for(c->lay, H, n, D, c->prow, c->ptok, c->pb, st);
            const int64_t shape[4] = {B, H, n, D};
            if (!dbuf_init(bufs[i], ((size_t)c->poff + span_of(shape, st)) * qva_dtype_size(dts[i])))
                goto out;
            tdesc_set(ts[i], bufs[i], (size_t)c->poff, dts[i], B, H, n, D, st);
        }
    }
    {
        strides_for(c->olay, H, Nq, D, c->oprow, c->optok, c->opb, st);
        const int64_t shape[4] = {B, H, Nq, D};
        if (!dbuf_init(&bo, ((size_t)c->ooff + span_of(shape, st)) * qva_dtype_size(c->dto))) goto out;
        tdesc_set(&to, &bo, (size_t)c->ooff, c->dto, B, H, Nq, D, st);
    }
    if (c->with_lse) {
        int64_t ls[4];
        if (c->llay == 0) ls[0] = H * Nq, ls[1] = Nq, ls[2] = 1, ls[3] = 1;
        else if (c->llay == 1) ls[0] = Nq * H, ls[1] = 1, ls[2] = H, ls[3] = 1;
        else ls[0] = H * (2 * Nq + 3) + 5, ls[1] = 2 * Nq + 3, ls[2] = 2, ls[3] = 1;
        const int64_t shape[4] = {B, H, Nq, 1};
        if (!dbuf_init(&bl, span_of(shape, ls) * sizeof(float))) goto out;
        tdesc_set(&tlse, &bl, 0, QVA_F32, B, H, Nq, 1, ls);
    }

    /* ---- values */
    {
        const qva_tensor q = t_host(&tq), k = t_host(&tk), v = t_host(&tv);
        fill_uniform(&q, rng_u64(&r), (float)c->qamp_i);
        fill_k(&k, rng_u64(&r), c->kmode, c->kmode == 1 ? 0.5f : 1.0f);
        fill_v(&v, rng_u64(&r), c->vstyle);
    }
    const int64_t nsel = sel_rows(c);
    sel = malloc((size_t)nsel * sizeof *sel);
    if (!sel) {
        case_err(&cs, "host allocation failed");
        goto out;
    }
    if (c->full_ref) {
        for (int64_t i = 0; i < nsel; ++i) sel[i] = i;
    } else {
        int64_t n = 0;
        for (int i = 0; i < c->nblk_sel; ++i)
            for (int64_t row = (int64_t)c->blk[i] * QVI_BLOCK;
                 row < Nq && row < ((int64_t)c->blk[i] + 1) * QVI_BLOCK; ++row)
                sel[n++] = row;
    }
    if (is_fp4(g->method) && !c->full_ref) {
        const qva_tensor q = t_host(&tq);
        if (!plant_fp4_amax(c, &q, sel, nsel)) {
            note_skip("could not put the NVFP4 amax of Q into the sampled rows");
            ok = -1;
            goto out;
        }
    }
    if (!dbuf_put(&bq) || (bk.dbase && !dbuf_put(&bk)) || (bv.dbase && !dbuf_put(&bv))) {
        case_err(&cs, "upload failed");
        goto out;
    }

    /* ---- the CPU side: gathered rows of Q, outputs */
    qva_tensor qref;
    const size_t esq = qva_dtype_size(c->dtq), eso = qva_dtype_size(c->dto);
    if (c->full_ref) {
        qref = t_host(&tq);
    } else {
        qg = malloc((size_t)(B * H * nsel * D) * esq);
        if (!qg) {
            case_err(&cs, "host allocation failed");
            goto out;
        }
        qref = qva_tensor_hnd(qg, c->dtq, QVA_DEVICE_CPU, B, H, nsel, D);
    }
    oref = malloc((size_t)(B * H * nsel * D) * eso);
    lref = malloc((size_t)(B * H * nsel) * sizeof(float));
    if (!oref || !lref) {
        case_err(&cs, "host allocation failed");
        goto out;
    }
    const qva_tensor orf = qva_tensor_hnd(oref, c->dto, QVA_DEVICE_CPU, B, H, nsel, D);
    const qva_tensor lrf = qva_tensor_hnd(lref, QVA_F32, QVA_DEVICE_CPU, B, H, nsel, 1);
    if (qva_context_create(&cctx, QVA_DEVICE_CPU) != QVA_OK) {
        case_err(&cs, "CPU context: %s", qva_last_error());
        goto out;
    }
    if (!gctx) {
        if (qva_context_create(&gctx, dev_kind()) != QVA_OK) {
            case_err(&cs, "device context: %s", qva_last_error());
            goto out;
        }
        if (!g_cpu_dev) qva_context_set_stream(gctx, stream);
    }

    ok = 1;
    for (int s = 0; s < c->nsteps && ok; ++s) {
        qva_config cfg = *g;
        cfg.step = c->steps[s];
        const tolr tl = tol_for(&cfg); /* draft: warm-up steps are bf16 */
        if (s > 0 && c->perturb_v) { /* the next denoising step's V */
            const qva_tensor v = t_host(&tv);
            fill_v(&v, rng_u64(&r), c->vstyle);
            if (!dbuf_put(tv.buf)) {
                case_err(&cs, "upload failed");
                ok = 0;
                break;
            }
        }
        if (!c->full_ref) { /* gather (after any V change: Q is fixed, but cheap) */
            const qva_tensor q = t_host(&tq);
            for (int64_t b = 0; b < B; ++b)
                for (int64_t h = 0; h < H; ++h)
                    for (int64_t i = 0; i < nsel; ++i)
                        memcpy(qg + (size_t)(((b * H + h) * nsel + i) * D) * esq,
                               (const unsigned char *)q.data + (size_t)qvi_offset(&q, b, h, sel[i], 0) * esq,
                               (size_t)D * esq);
        }
        /* device call on poisoned outputs */
        if (!dbuf_poison(&bo, stream) || (c->with_lse && !dbuf_poison(&bl, stream)) || !dev_sync()) {
            case_err(&cs, "poisoning the outputs failed");
            ok = 0;
            break;
        }
        const qva_tensor q = t_dev(&tq), k = t_dev(&tk), v = t_dev(&tv), o = t_dev(&to);
        const qva_tensor l = c->with_lse ? t_dev(&tlse) : o;
        double t0 = now_s();
        qva_status rs = qva_attention(gctx, &cfg, &q, &k, &v, &o, c->with_lse ? &l : NULL);
        if (rs != QVA_OK) {
            case_err(&cs, "step %d: device call returned %s: %s", cfg.step, qva_status_string(rs),
                     qva_last_error());
            ok = 0;
            break;
        }
        if (!dev_sync()) {
            case_err(&cs, "step %d: the device failed after the call", cfg.step);
            device_still_usable();
            ok = 0;
            break;
        }
        tm->dev_s += now_s() - t0;
        unsigned char *oall = dbuf_get_all(&bo), *lall = c->with_lse ? dbuf_get_all(&bl) : NULL;
        if (!oall || (c->with_lse && !lall)) {
            case_err(&cs, "step %d: download failed", cfg.step);
            free(oall), free(lall);
            ok = 0;
            break;
        }
        /* CPU reference on the sampled rows */
        for (size_t i = 0; i < (size_t)(B * H * nsel * D); ++i)
            qvi_store_elem(&orf, (int64_t)i, NAN);
        for (size_t i = 0; i < (size_t)(B * H * nsel); ++i) lref[i] = NAN;
        const qva_tensor kh = t_host(&tk), vh = t_host(&tv);
        t0 = now_s();
        if (is_vc(cfg.method) && qref.shape[2] != kh.shape[2])
            rs = qvi_cpu_attention(cctx, &cfg, &qref, &kh, &vh, &orf, c->with_lse ? &lrf : NULL);
        else
            rs = qva_attention(cctx, &cfg, &qref, &kh, &vh, &orf, c->with_lse ? &lrf : NULL);
        tm->cpu_s += now_s() - t0;
        if (rs != QVA_OK) {
            case_err(&cs, "step %d: CPU reference returned %s: %s", cfg.step, qva_status_string(rs),
                     qva_last_error());
            ok = 0;
        }
        /* checks */
        const tdesc *ov[1] = {&to}, *lv[1] = {&tlse};
        size_t stray = stray_bytes(oall, &bo, ov, 1);
        if (stray) case_err(&cs, "step %d: %zu output bytes outside the elements (padding/guards) were written", cfg.step, stray), ok = 0;
        if (c->with_lse && (stray = stray_bytes(lall, &bl, lv, 1)))
            case_err(&cs, "step %d: %zu LSE bytes outside the elements were written", cfg.step, stray), ok = 0;
        const qva_tensor og = t_on(&to, oall + GUARD, QVA_DEVICE_CPU);
        int64_t frow;
        size_t nf = nonfinite(&og, 0, &frow);
        if (nf) case_err(&cs, "step %d: %zu output elements NaN/Inf or unwritten (first in row %lld)", cfg.step, nf, (long long)frow), ok = 0;
        qva_tensor lg;
        memset(&lg, 0, sizeof lg);
        if (c->with_lse) {
            lg = t_on(&tlse, lall + GUARD, QVA_DEVICE_CPU);
            nf = nonfinite(&lg, 1, &frow);
            if (nf) case_err(&cs, "step %d: %zu LSE values NaN/+Inf or unwritten (first in row %lld)", cfg.step, nf, (long long)frow), ok = 0;
        }
        if (rs == QVA_OK) {
            cmpres cr;
            compare_view(&og, &orf, sel, nsel, tl.atol, tl.rtol, 0, &cr);
            const double e = cmp_rel_l2(&cr);
            if (cr.bad)
                case_err(&cs, "step %d: %zu of %zu elements outside atol %g + rtol %g |ref| (first: b %lld h %lld row %lld c %lld: %.6g vs ref %.6g); max|diff| %.3g",
                         cfg.step, cr.bad, cr.n, tl.atol, tl.rtol, (long long)cr.fb, (long long)cr.fh,
                         (long long)cr.frow, (long long)cr.fc, cr.fgot, cr.fref, cr.max_abs), ok = 0;
            if (!(e <= tl.rel_l2))
                case_err(&cs, "step %d: rel-L2 %.3g vs the CPU reference (limit %g)", cfg.step, e, tl.rel_l2), ok = 0;
            if (g_cpu_dev && cr.exact_diff)
                case_err(&cs, "step %d: harness self-test: %zu elements of the sampled-row reference differ from the full computation (rel-L2 %.3g)",
                         cfg.step, cr.exact_diff, e), ok = 0;
            if (c->with_lse) {
                cmpres lr;
                compare_view(&lg, &lrf, sel, nsel, tl.latol, tl.lrtol, 1, &lr);
                if (lr.bad)
                    case_err(&cs, "step %d: %zu of %zu LSE values outside %g + %g |ref| (first: b %lld h %lld row %lld: %.7g vs ref %.7g)",
                             cfg.step, lr.bad, lr.n, tl.latol, tl.lrtol, (long long)lr.fb, (long long)lr.fh,
                             (long long)lr.frow, lr.fgot, lr.fref), ok = 0;
                if (g_cpu_dev && lr.exact_diff)
                    case_err(&cs, "step %d: harness self-test: %zu LSE values differ", cfg.step, lr.exact_diff), ok = 0;
            }
            if (g_verbose)
                printf("    step %d: max|diff| %.3g rel-L2 %.3g (%zu elements)\n", cfg.step, cr.max_abs, e, cr.n);
        }
        free(oall), free(lall);
        if (!inputs_intact(&bq) || (bk.dbase && !inputs_intact(&bk)) || (bv.dbase && !inputs_intact(&bv)))
            case_err(&cs, "step %d: an input buffer (or its guard zone) changed during the call", cfg.step), ok = 0;
    }
    if (cs.failed) ok = 0;

out:
    if (ok == 0 && !cs.failed) case_err(&cs, "case setup failed (see the lines above)");
    if (cs.failed && ok == 1) ok = 0;
    if (gctx && gctx != gctx_in) qva_context_free(gctx);
    qva_context_free(cctx);
    free(qg), free(oref), free(lref), free(sel);
    dbuf_free(&bq), dbuf_free(&bk), dbuf_free(&bv), dbuf_free(&bo), dbuf_free(&bl);
    return ok;
}

/* ================================================================ watchdog */

static char g_alarm_msg[160];
static void on_alarm(int sig) {
    (void)sig;
    const ssize_t w = write(1, g_alarm_msg, strlen(g_alarm_msg));
    (void)w;
    _exit(4);
}
static void watchdog(const char *mode, int seconds) {
    snprintf(g_alarm_msg, sizeof g_alarm_msg,
             "\nFAIL [%s] watchdog: still running after %d s (hang?)\n@@ mode=%s result=TIMEOUT "
             "run=0 fail=1 skip=0 seconds=%d note=watchdog\n",
             mode, seconds, mode, seconds);
    if (seconds <= 0) return;
    signal(SIGALRM, on_alarm);
    alarm((unsigned)seconds);
}

static int report(const char *mode, double t0, const char *result, const char *note) {
    printf("@@ mode=%s result=%s run=%d fail=%d skip=%d seconds=%.1f note=%s\n", mode, result, g_run,
           g_fail, g_skip, now_s() - t0, note ? note : "");
    fflush(stdout);
    return strcmp(result, "pass") ? 1 : 0;
}

static void print_skips(void) {
    for (int i = 0; i < MAX_SKIP_REASONS && g_skip_why[i][0]; ++i)
        printf("  skipped %d x: %s\n", g_skip_cnt[i], g_skip_why[i]);
}

/* ================================================================ mode: cases */

static int mode_cases(const opts *o) {
    g_mode = "cases";
    const double t0 = now_s();
    cudaStream_t stream = NULL;
    if (!g_cpu_dev && !cu_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"))
        return report("cases", t0, "FAIL", "no stream");
    qva_context_t *gctx = NULL;
    int fam_run[NFAMILIES], fam_fail[NFAMILIES], attempts = 0, budget_hit = 0;
    memset(fam_run, 0, sizeof fam_run), memset(fam_fail, 0, sizeof fam_fail);
    case_time tm = {0, 0};
    double last_progress = t0;
    printf("cases: %d asked, seed %" PRIu64 ", budget %.0f s, N <= %d%s\n", o->n, o->seed, o->seconds,
           o->max_n, g_cpu_dev ? " (harness self-test: the device is a CPU context)" : "");
    for (int idx = o->only >= 0 ? o->only : 0; idx >= 0; idx = next_case_id(o->seed, idx)) {
        if (o->only >= 0 && idx != o->only) break;
        if (o->only < 0 && g_run >= o->n) break;
        if (g_dev_broken) break;
        if (now_s() - t0 > o->seconds) {
            budget_hit = 1;
            printf("cases: the time budget of %.0f s is spent after %d cases\n", o->seconds, g_run);
            break;
        }
        scase c;
        const int gen_ok = gen_case(&c, idx, o);
        /* --methods: the cases of other methods are not attempts, so that a
         * rare family (draft@p: one id in ten) still gets its N cases */
        if (gen_ok && o->methods && strncmp(c.method, o->methods, strlen(o->methods))) continue;
        if (++attempts > 4 * o->n + 100) break;
        if (!gen_ok) {
            failf("case %d: could not be generated", idx);
            continue;
        }
        /* one long-lived context (its workspace reallocates from case to
         * case, as in a model), reset every 32 cases and replaced every 128
         * (by the ids below MASS_TWIN: a MASS twin runs on its case's
         * context); one case in ten on a fresh context on the legacy default
         * stream */
        const int not_twin = idx < MASS_TWIN;
        if (!gctx || (not_twin && idx % 128 == 0)) {
            qva_context_free(gctx);
            gctx = NULL;
            if (qva_context_create(&gctx, dev_kind()) != QVA_OK) {
                failf("device context: %s", qva_last_error());
                break;
            }
            if (!g_cpu_dev) qva_context_set_stream(gctx, stream);
        } else if (not_twin && idx % 32 == 0) {
            qva_context_reset(gctx);
        }
        rng r = rng_of(o->seed, (uint64_t)idx ^ 0xC0FFEEull);
        const int fresh = rng_unit(&r) < 0.1;
        if (o->verbose || o->only >= 0) {
            char d[1024];
            describe(&c, d, sizeof d);
            printf("  %s%s\n", d, fresh ? " [fresh context, default stream]" : "");
        }
        const case_time before = tm;
        const int res = run_scase(&c, fresh ? NULL : gctx, fresh ? NULL : stream, &tm);
        if (o->verbose || o->only >= 0)
            printf("    %s: device %.3f s, CPU reference %.3f s (%.3g row-key-channel products)\n",
                   res == 1 ? "ok" : res == 0 ? "FAILED" : "skipped", tm.dev_s - before.dev_s,
                   tm.cpu_s - before.cpu_s, case_work(&c));
        if (res >= 0) {
            ++g_run;
            ++fam_run[c.family];
            if (res == 0) ++g_fail, ++fam_fail[c.family];
        }
        if (now_s() - last_progress > 20 || (g_run && g_run % 100 == 0 && res >= 0)) {
            printf("  [cases] %d run, %d failed, %d skipped, %.0f s (device %.1f s, CPU reference %.1f s)\n",
                   g_run, g_fail, g_skip, now_s() - t0, tm.dev_s, tm.cpu_s);
            fflush(stdout);
            last_progress = now_s();
        }
    }
    qva_context_free(gctx);
    if (stream) cudaStreamDestroy(stream);
    printf("\ncases per method family (run / failed):\n");
    for (int i = 0; i < NFAMILIES; ++i)
        if (fam_run[i] || fam_fail[i])
            printf("  %-24s %4d / %d\n",
                   i == FAM_DRAFT ? "draft@* (fixed quotas)" : i == FAM_MASS ? "draft@p* (adaptive)" : METHODS[i],
                   fam_run[i], fam_fail[i]);
    print_skips();
    printf("time: device calls %.1f s, CPU reference %.1f s, total %.1f s\n", tm.dev_s, tm.cpu_s,
           now_s() - t0);
    char note[160];
    const int asked = o->only >= 0 ? 1 : o->n;
    snprintf(note, sizeof note, "%d of %d cases asked%s%s", g_run, asked,
             budget_hit ? " (time budget spent)" : "", g_dev_broken ? " (device broken)" : "");
    const char *res = g_fail ? "FAIL" : (g_run < asked || g_dev_broken) ? "INCOMPLETE" : "pass";
    return report("cases", t0, res, note);
}

/* The cases of a seed and their CPU work, without running them. */
static int plan_cases(const opts *o) {
    double work = 0, km = 0, maxw = 0, elems = 0;
    int n = 0, big = 0, full = 0, draft = 0, mass = 0, cross = 0, lay[LAY_COUNT_] = {0};
    for (int idx = o->only >= 0 ? o->only : 0; idx >= 0 && n < (o->only >= 0 ? 1 : o->n);
         idx = next_case_id(o->seed, idx)) {
        if (o->only >= 0 && idx != o->only) break;
        scase c;
        if (!gen_case(&c, idx, o)) return 1;
        if (o->methods && strncmp(c.method, o->methods, strlen(o->methods))) continue;
        ++n;
        const double w = case_work(&c);
        work += w, maxw = w > maxw ? w : maxw;
        if (is_vc(c.cfg.method))
            km += (double)c.B * c.H * c.Nk * c.D * c.cfg.vsmooth.clusters * (c.cfg.vsmooth.iters + 1) * c.nsteps;
        elems += (double)c.B * c.H * ((double)c.Nq + 2.0 * c.Nk) * c.D;
        big += c.Nq > 8192, full += c.full_ref, draft += c.cfg.method == QVA_METHOD_DRAFT, cross += c.Nq != c.Nk;
        mass += c.family == FAM_MASS;
        ++lay[c.lay];
        if (o->verbose) {
            char d[1024];
            describe(&c, d, sizeof d);
            printf("  %s | work %.3g\n", d, w);
        }
    }
    printf("plan: %d cases: %d with N > 8192, %d draft (%d MASS), %d cross-attention, %d on all rows;", n, big, draft,
           mass, cross, full);
    for (int i = 0; i < LAY_COUNT_; ++i) printf(" %s %d", LAY_NAME[i], lay[i]);
    printf("\nplan: CPU reference work %.3g (max %.3g a case), k-means %.3g, %.3g input elements generated\n",
           work, maxw, km, elems);
    return 0;
}

/* ================================================================ mode: small */

static void small_case(scase *c, int idx, const char *method, int B, int H, int Nq, int Nk, int D,
                       qva_dtype dt, int lay, int lse) {
    case_init(c, idx, 7, method);
    c->B = B, c->H = H, c->Nq = Nq, c->Nk = Nk, c->D = D;
    c->dtq = c->dtk = c->dtv = c->dto = dt;
    c->lay = lay;
    c->olay = lay == LAY_PACKED ? LAY_NHD : lay;
    if (lay == LAY_HND_PAD || lay == LAY_NHD_PAD || lay == LAY_PACKED) c->prow = 8, c->ptok = 3, c->pb = 16;
    if (c->olay == LAY_HND_PAD || c->olay == LAY_NHD_PAD) c->oprow = 1, c->optok = 0, c->opb = 0;
    c->with_lse = lse;
    c->llay = idx % 3;
    c->full_ref = 1;
    c->vstyle = 1;
    c->kmode = 2;
    c->steps[0] = 0;
}

/* A handful of small cases, each against the full CPU reference: the
 * run under compute-sanitizer (memcheck, racecheck, synccheck). */
static int small_list(scase *cs) {
    int n = 0;
    small_case(&cs[n], n, "bf16", 1, 2, 200, 200, 64, QVA_F32, LAY_HND, 1), ++n;
    small_case(&cs[n], n, "fp8+expcast", 1, 1, 130, 130, 128, QVA_BF16, LAY_NHD, 1), ++n;
    small_case(&cs[n], n, "sage8+nohadamard+fp32sum", 2, 1, 257, 257, 64, QVA_F16, LAY_HND_PAD, 1);
    cs[n].cfg.hadamard_signs = 1, ++n;
    small_case(&cs[n], n, "sage8", 1, 2, 300, 300, 128, QVA_BF16, LAY_HND, 1), ++n;
    small_case(&cs[n], n, "vc8+expcast", 1, 2, 300, 300, 128, QVA_BF16, LAY_HND, 1);
    cs[n].cfg.num_steps = 8, cs[n].nsteps = 3, cs[n].steps[1] = 1, cs[n].steps[2] = 3, cs[n].perturb_v = 1, ++n;
    small_case(&cs[n], n, "vc8+expcast+hadamard", 1, 1, 260, 260, 64, QVA_BF16, LAY_PACKED, 0), ++n;
    small_case(&cs[n], n, "vc4", 1, 1, 200, 200, 64, QVA_BF16, LAY_NHD, 1), ++n;
    small_case(&cs[n], n, "sage4+hadamard", 1, 2, 129, 129, 128, QVA_BF16, LAY_HND, 1), ++n;
    small_case(&cs[n], n, "fp8", 1, 1, 100, 300, 64, QVA_BF16, LAY_NHD_PAD, 1), ++n; /* cross */
    small_case(&cs[n], n, "draft@85/0/7.5/7.5", 1, 1, 0, 0, 128, QVA_BF16, LAY_HND, 1);
    set_draft_grid(&cs[n], 1, 12, 20, 16, 0), ++n;
    small_case(&cs[n], n, "draft@0/40/30/30+expcast", 1, 1, 0, 0, 64, QVA_F16, LAY_NHD, 1);
    set_draft_grid(&cs[n], 2, 10, 13, 20, 1), ++n;
    small_case(&cs[n], n, "draft@85/0/0/15", 1, 2, 0, 0, 128, QVA_BF16, LAY_HND, 1);
    set_draft_grid(&cs[n], 1, 10, 20, 8, 0);
    cs[n].cfg.draft.dense_warmup_steps = 1, cs[n].nsteps = 2, cs[n].steps[1] = 1, ++n;
    /* the adaptive MASS budget: the device's per-head select and counts */
    small_case(&cs[n], n, "draft@p95", 1, 2, 0, 0, 128, QVA_BF16, LAY_NHD, 1);
    set_draft_grid(&cs[n], 1, 12, 20, 16, 1), ++n;
    small_case(&cs[n], n, "draft@p90/20/30/50+expcast", 1, 2, 0, 0, 64, QVA_F16, LAY_HND, 1);
    set_draft_grid(&cs[n], 2, 10, 13, 0, 0);
    cs[n].cfg.draft.min_keep = 0.1f, cs[n].cfg.draft.max_keep = 0.6f, ++n;
    return n;
}

static int mode_small(const opts *o) {
    g_mode = "small";
    const double t0 = now_s();
    scase cs[16];
    const int n = small_list(cs);
    cudaStream_t stream = NULL;
    if (!g_cpu_dev && !cu_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"))
        return report("small", t0, "FAIL", "no stream");
    qva_context_t *ctx = NULL;
    if (qva_context_create(&ctx, dev_kind()) != QVA_OK) {
        failf("device context: %s", qva_last_error());
        return report("small", t0, "FAIL", "no context");
    }
    if (!g_cpu_dev) qva_context_set_stream(ctx, stream);
    case_time tm = {0, 0};
    for (int i = 0; i < n && !g_dev_broken; ++i) {
        if (o->methods && strncmp(cs[i].method, o->methods, strlen(o->methods))) continue;
        char d[1024];
        describe(&cs[i], d, sizeof d);
        printf("  %s\n", d);
        fflush(stdout);
        const int res = run_scase(&cs[i], ctx, stream, &tm);
        if (res >= 0) ++g_run;
        if (res == 0) ++g_fail;
    }
    qva_context_free(ctx);
    if (stream) cudaStreamDestroy(stream);
    print_skips();
    return report("small", t0, g_fail ? "FAIL" : g_dev_broken ? "INCOMPLETE" : "pass", "");
}

/* ================================================================ calls */

/* One attention call of the stream / graph / oom modes: contiguous inputs
 * of its own, and two output slots (e.g. eager and graph). */
typedef struct cspec {
    const char *method;
    int B, H, N, Nk, D;
    qva_dtype dt;
    int nhd, lse;
    int layer, step, num_steps, always;
    int T, GH, GW, P, at_end, warmup; /* draft grid (T = 0: not draft) */
    int signs;                        /* hadamard_signs with this seed  */
} cspec;

typedef struct gcall {
    cspec sp;
    qva_config cfg;
    dbuf q, k, v, o[2], l[2];
    tdesc tq, tk, tv, to[2], tl[2];
} gcall;

static void cspec_name(const cspec *s, char *buf, size_t len) {
    char nk[24] = "";
    if (s->Nk && s->Nk != s->N) snprintf(nk, sizeof nk, " Nk%d", s->Nk);
    snprintf(buf, len, "%s%s B%d H%d N%d%s D%d %s %s%s layer %d step %d/%d%s", s->method,
             s->signs ? "(signs)" : "", s->B, s->H, s->N, nk, s->D, dt_name(s->dt), s->nhd ? "NHD" : "HND",
             s->lse ? " +lse" : "", s->layer, s->step, s->num_steps, s->always ? " always" : "");
}

static int spec_config(const cspec *sp, qva_config *cfg) {
    qva_config_default(cfg);
    if (qva_config_set_method(cfg, sp->method) != QVA_OK) {
        failf("bad method %s: %s", sp->method, qva_last_error());
        return 0;
    }
    cfg->layer = sp->layer;
    cfg->step = sp->step;
    cfg->num_steps = sp->num_steps;
    if (sp->always) cfg->vsmooth.schedule = QVA_SCHEDULE_ALWAYS;
    if (sp->signs) cfg->hadamard_signs = 1, cfg->hadamard_seed = 0xABCDEF12345ull + (uint64_t)sp->signs;
    if (sp->T) {
        cfg->draft.grid_t = sp->T, cfg->draft.grid_h = sp->GH, cfg->draft.grid_w = sp->GW;
        cfg->draft.prefix_tokens = sp->P, cfg->draft.prefix_at_end = sp->at_end;
        cfg->draft.dense_warmup_steps = sp->warmup;
    }
    return 1;
}

static int gcall_fill(gcall *g, uint64_t seed) {
    const qva_tensor q = t_host(&g->tq), k = t_host(&g->tk), v = t_host(&g->tv);
    fill_uniform(&q, mix64(seed + 1), 1.5f);
    fill_k(&k, mix64(seed + 2), 2, 1.0f);
    fill_v(&v, mix64(seed + 3), 1);
    return dbuf_put(&g->q) && dbuf_put(&g->k) && dbuf_put(&g->v);
}

static void gcall_free(gcall *g) {
    dbuf_free(&g->q), dbuf_free(&g->k), dbuf_free(&g->v);
    for (int s = 0; s < 2; ++s) dbuf_free(&g->o[s]), dbuf_free(&g->l[s]);
}

static int gcall_init(gcall *g, const cspec *sp, uint64_t seed) {
    memset(g, 0, sizeof *g);
    g->sp = *sp;
    if (!g->sp.Nk) g->sp.Nk = sp->N;
    if (sp->T) g->sp.N = g->sp.Nk = sp->P + sp->T * sp->GH * sp->GW;
    if (!spec_config(&g->sp, &g->cfg)) return 0;
    const int lay = sp->nhd ? LAY_NHD : LAY_HND;
    const int64_t B = sp->B, H = sp->H, N = g->sp.N, Nk = g->sp.Nk, D = sp->D;
    const size_t es = qva_dtype_size(sp->dt);
    int64_t st[4];
    strides_for(lay, H, N, D, 0, 0, 0, st);
    int ok = dbuf_init(&g->q, (size_t)(B * H * N * D) * es);
    if (ok) tdesc_set(&g->tq, &g->q, 0, sp->dt, B, H, N, D, st);
    strides_for(lay, H, Nk, D, 0, 0, 0, st);
    ok = ok && dbuf_init(&g->k, (size_t)(B * H * Nk * D) * es) && dbuf_init(&g->v, (size_t)(B * H * Nk * D) * es);
    if (ok) tdesc_set(&g->tk, &g->k, 0, sp->dt, B, H, Nk, D, st), tdesc_set(&g->tv, &g->v, 0, sp->dt, B, H, Nk, D, st);
    strides_for(lay, H, N, D, 0, 0, 0, st);
    const int64_t ls[4] = {H * N, N, 1, 1};
    for (int s = 0; s < 2 && ok; ++s) {
        ok = dbuf_init(&g->o[s], (size_t)(B * H * N * D) * es);
        if (ok) tdesc_set(&g->to[s], &g->o[s], 0, sp->dt, B, H, N, D, st);
        if (ok && sp->lse) {
            ok = dbuf_init(&g->l[s], (size_t)(B * H * N) * sizeof(float));
            if (ok) tdesc_set(&g->tl[s], &g->l[s], 0, QVA_F32, B, H, N, 1, ls);
        }
    }
    if (!ok || !gcall_fill(g, seed)) {
        failf("setting up %s failed", sp->method);
        gcall_free(g);
        return 0;
    }
    return 1;
}

static int gcall_poison(gcall *g, int slot, cudaStream_t s) {
    return dbuf_poison(&g->o[slot], s) && (!g->sp.lse || dbuf_poison(&g->l[slot], s));
}

/* One call into output slot `slot` at `step` (-1: the spec's step). */
static qva_status gcall_call(gcall *g, qva_context_t *ctx, int slot, int step) {
    qva_config cfg = g->cfg;
    if (step >= 0) cfg.step = step;
    const qva_tensor q = t_dev(&g->tq), k = t_dev(&g->tk), v = t_dev(&g->tv), o = t_dev(&g->to[slot]);
    const qva_tensor l = g->sp.lse ? t_dev(&g->tl[slot]) : o;
    return qva_attention(ctx, &cfg, &q, &k, &v, &o, g->sp.lse ? &l : NULL);
}

typedef struct gres {
    unsigned char *o, *l;
} gres;
static void gres_free(gres *r) {
    free(r->o), free(r->l);
    r->o = r->l = NULL;
}
static int gres_fetch(const gcall *g, int slot, gres *r) {
    r->o = dbuf_get(&g->o[slot]);
    r->l = g->sp.lse ? dbuf_get(&g->l[slot]) : NULL;
    return r->o && (!g->sp.lse || r->l);
}
/* Elements (and LSE values) whose bits differ. */
static size_t gres_diff(const gcall *g, const gres *a, const gres *b, size_t *ldiff) {
    const size_t es = qva_dtype_size(g->sp.dt), n = g->o[0].bytes / es;
    size_t d = 0;
    for (size_t i = 0; i < n; ++i) d += memcmp(a->o + i * es, b->o + i * es, es) != 0;
    *ldiff = 0;
    if (g->sp.lse)
        for (size_t i = 0; i < g->l[0].bytes / 4; ++i) *ldiff += memcmp(a->l + 4 * i, b->l + 4 * i, 4) != 0;
    return d;
}
static size_t gres_nonfinite(const gcall *g, const gres *r) {
    int64_t frow;
    qva_tensor o = t_on(&g->to[0], r->o, QVA_DEVICE_CPU);
    size_t n = nonfinite(&o, 0, &frow);
    if (g->sp.lse) {
        qva_tensor l = t_on(&g->tl[0], r->l, QVA_DEVICE_CPU);
        n += nonfinite(&l, 1, &frow);
    }
    return n;
}

/* ================================================================ mode: streams */

/* Workloads: each a list of calls; both use layer 1 on purpose (the state
 * of one context must not leak into another). */
static const cspec WORK_A[] = {
    {"vc8+expcast", 1, 8, 6000, 0, 128, QVA_BF16, 0, 1, 1, 0, 40, 0, 0, 0, 0, 0, 0, 0, 0},
    {"vc8+expcast", 1, 8, 6000, 0, 128, QVA_BF16, 0, 1, 1, 1, 40, 0, 0, 0, 0, 0, 0, 0, 0},
    {"vc8+expcast", 1, 8, 6000, 0, 128, QVA_BF16, 0, 1, 1, 12, 40, 0, 0, 0, 0, 0, 0, 0, 0},
    {"sage8", 1, 8, 8192, 0, 128, QVA_BF16, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"draft@85/0/7.5/7.5", 1, 4, 0, 0, 128, QVA_BF16, 0, 0, 0, 0, 0, 0, 4, 32, 48, 128, 0, 0, 0},
    {"bf16", 2, 4, 4096, 0, 64, QVA_F16, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"sage4+hadamard", 1, 4, 3000, 0, 128, QVA_BF16, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fp8+expcast", 1, 8, 5000, 0, 128, QVA_BF16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
static const cspec WORK_B[] = {
    {"vc4", 1, 4, 4000, 0, 64, QVA_F16, 1, 1, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0},
    {"vc4", 1, 4, 4000, 0, 64, QVA_F16, 1, 1, 1, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0},
    {"vc8", 2, 4, 3000, 0, 128, QVA_F32, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"draft@0/40/30/30+expcast", 1, 2, 0, 0, 64, QVA_BF16, 1, 1, 0, 0, 0, 0, 2, 24, 40, 77, 1, 0, 0},
    {"sage8+nohadamard+fp32sum", 1, 16, 4500, 0, 64, QVA_BF16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3},
    {"bf16", 1, 8, 8000, 0, 128, QVA_BF16, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
#define NWA (int)(sizeof WORK_A / sizeof *WORK_A)
#define NWB (int)(sizeof WORK_B / sizeof *WORK_B)

/* Runs calls[0..n) in order on ctx into `slot` (poisoned first). */
static int run_list(gcall *calls, int n, qva_context_t *ctx, cudaStream_t s, int slot, char *err,
                    size_t errlen) {
    for (int i = 0; i < n; ++i) {
        if (!gcall_poison(&calls[i], slot, s)) {
            snprintf(err, errlen, "call %d: poisoning failed", i);
            return 0;
        }
        const qva_status st = gcall_call(&calls[i], ctx, slot, -1);
        if (st != QVA_OK) {
            char nm[160];
            cspec_name(&calls[i].sp, nm, sizeof nm);
            snprintf(err, errlen, "call %d (%s) returned %s: %s", i, nm, qva_status_string(st), qva_last_error());
            return 0;
        }
    }
    return 1;
}

static qva_context_t *new_ctx(cudaStream_t s) {
    qva_context_t *c = NULL;
    if (qva_context_create(&c, QVA_DEVICE_CUDA) != QVA_OK) {
        failf("context: %s", qva_last_error());
        return NULL;
    }
    qva_context_set_stream(c, s);
    return c;
}

/* Fetches every call's slot and compares with refs; returns mismatches. */
static int compare_all(const char *what, gcall *calls, int n, int slot, gres *refs, const int *nondet) {
    int bad = 0;
    for (int i = 0; i < n; ++i) {
        gres r = {NULL, NULL};
        char nm[160];
        cspec_name(&calls[i].sp, nm, sizeof nm);
        ++g_run;
        if (!gres_fetch(&calls[i], slot, &r)) {
            failf("%s: call %d (%s): download failed", what, i, nm);
            ++bad;
            continue;
        }
        size_t ld, d = gres_diff(&calls[i], &refs[i], &r, &ld);
        const size_t nf = gres_nonfinite(&calls[i], &r);
        if (d || ld || nf) {
            failf("%s: call %d (%s): %zu output elements and %zu LSE values differ from the serial run, %zu "
                  "non-finite%s",
                  what, i, nm, d, ld, nf, nondet && nondet[i] ? " (but this call is not even deterministic serially)" : "");
            ++bad;
        }
        gres_free(&r);
    }
    return bad;
}

typedef struct thr_arg {
    gcall *calls;
    int n;
    qva_context_t *ctx;
    cudaStream_t s;
    int slot;
    pthread_barrier_t *bar;
    int ok;
    char err[512];
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = (thr_arg *)p;
    pthread_barrier_wait(a->bar);
    a->ok = run_list(a->calls, a->n, a->ctx, a->s, a->slot, a->err, sizeof a->err);
    return NULL;
}

/* Runs two lists from two host threads (ctx/streams per list, maybe the
 * same context); joins. */
static int run_threads(gcall *l0, int n0, qva_context_t *c0, cudaStream_t s0, gcall *l1, int n1,
                       qva_context_t *c1, cudaStream_t s1, int slot, const char *what) {
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    thr_arg a[2] = {{l0, n0, c0, s0, slot, &bar, 0, ""}, {l1, n1, c1, s1, slot, &bar, 0, ""}};
    pthread_t t[2];
    int started = 0;
    for (int i = 0; i < 2; ++i)
        if (pthread_create(&t[i], NULL, thr_main, &a[i]) == 0) ++started;
    if (started < 2) {
        failf("%s: pthread_create failed", what);
        if (started == 1) pthread_cancel(t[0]), pthread_join(t[0], NULL);
        pthread_barrier_destroy(&bar);
        return 0;
    }
    pthread_join(t[0], NULL), pthread_join(t[1], NULL);
    pthread_barrier_destroy(&bar);
    int ok = 1;
    for (int i = 0; i < 2; ++i)
        if (!a[i].ok) failf("%s: thread %d: %s", what, i, a[i].err), ok = 0;
    return ok;
}

static int mode_streams(const opts *o) {
    g_mode = "streams";
    const double t0 = now_s();
    (void)o;
    cudaStream_t sA = NULL, sB = NULL;
    gcall A[NWA], B[NWB];
    gres refA[NWA], refB[NWB];
    int nondetA[NWA], nondetB[NWB], okA = 0, okB = 0;
    memset(refA, 0, sizeof refA), memset(refB, 0, sizeof refB);
    memset(nondetA, 0, sizeof nondetA), memset(nondetB, 0, sizeof nondetB);
    char err[512] = "";
    if (!cu_ok(cudaStreamCreateWithFlags(&sA, cudaStreamNonBlocking), "stream") ||
        !cu_ok(cudaStreamCreateWithFlags(&sB, cudaStreamNonBlocking), "stream"))
        return report("streams", t0, "FAIL", "no streams");
    for (okA = 0; okA < NWA && gcall_init(&A[okA], &WORK_A[okA], 100 + (uint64_t)okA); ++okA) {}
    for (okB = 0; okB < NWB && gcall_init(&B[okB], &WORK_B[okB], 200 + (uint64_t)okB); ++okB) {}
    if (okA < NWA || okB < NWB) goto done;

    /* serial reference: A on its context, then B on its own; then again,
     * to tell a nondeterministic call from a concurrency bug */
    printf("streams: serial reference (%d + %d calls)\n", NWA, NWB);
    for (int rep = 0; rep < 2; ++rep) {
        qva_context_t *ca = new_ctx(sA), *cb = new_ctx(sB);
        const int slot = rep;
        int ok = ca && cb && run_list(A, NWA, ca, sA, slot, err, sizeof err);
        if (ok) ok = cu_ok(cudaStreamSynchronize(sA), "sync A");
        if (ok && !(ok = run_list(B, NWB, cb, sB, slot, err, sizeof err))) failf("serial B: %s", err);
        else if (!ok) failf("serial A: %s", err);
        ok = ok && cu_ok(cudaDeviceSynchronize(), "sync");
        qva_context_free(ca), qva_context_free(cb);
        if (!ok) {
            device_still_usable();
            goto done;
        }
        if (rep == 0) {
            for (int i = 0; i < NWA; ++i)
                if (!gres_fetch(&A[i], 0, &refA[i])) goto done;
            for (int i = 0; i < NWB; ++i)
                if (!gres_fetch(&B[i], 0, &refB[i])) goto done;
            for (int i = 0; i < NWA; ++i)
                if (gres_nonfinite(&A[i], &refA[i])) failf("serial A call %d: non-finite output", i);
            for (int i = 0; i < NWB; ++i)
                if (gres_nonfinite(&B[i], &refB[i])) failf("serial B call %d: non-finite output", i);
        } else {
            for (int i = 0; i < NWA + NWB; ++i) {
                gcall *gc = i < NWA ? &A[i] : &B[i - NWA];
                gres *rf = i < NWA ? &refA[i] : &refB[i - NWA];
                gres r = {NULL, NULL};
                size_t ld = 0, d = gres_fetch(gc, 1, &r) ? gres_diff(gc, rf, &r, &ld) : 1;
                if (d || ld) {
                    char nm[160];
                    cspec_name(&gc->sp, nm, sizeof nm);
                    failf("determinism: %s: two serial runs differ in %zu elements / %zu LSE values", nm, d, ld);
                    if (i < NWA) nondetA[i] = 1;
                    else nondetB[i - NWA] = 1;
                }
                gres_free(&r);
            }
        }
    }

    /* A: two contexts on two streams, calls interleaved without syncs */
    for (int round = 0; round < 3 && !g_dev_broken; ++round) {
        qva_context_t *ca = new_ctx(sA), *cb = new_ctx(sB);
        int ok = ca && cb;
        const double tr = now_s();
        for (int i = 0; ok && i < (NWA > NWB ? NWA : NWB); ++i) {
            if (i < NWA) ok = run_list(&A[i], 1, ca, sA, 1, err, sizeof err);
            if (ok && i < NWB) ok = run_list(&B[i], 1, cb, sB, 1, err, sizeof err);
        }
        if (!ok) failf("two streams, round %d: %s", round, err);
        if (!cu_ok(cudaDeviceSynchronize(), "sync")) ok = 0, device_still_usable();
        qva_context_free(ca), qva_context_free(cb);
        if (ok) {
            char w[64];
            snprintf(w, sizeof w, "two contexts/two streams round %d", round);
            const int bad = compare_all(w, A, NWA, 1, refA, nondetA) + compare_all(w, B, NWB, 1, refB, nondetB);
            printf("  two contexts on two streams, round %d: %s (%.2f s)\n", round, bad ? "MISMATCH" : "identical",
                   now_s() - tr);
        }
    }

    /* C: two host threads, each its own context and stream */
    for (int round = 0; round < 3 && !g_dev_broken; ++round) {
        qva_context_t *ca = new_ctx(sA), *cb = new_ctx(sB);
        int ok = ca && cb && run_threads(A, NWA, ca, sA, B, NWB, cb, sB, 1, "two threads/two contexts");
        if (!cu_ok(cudaDeviceSynchronize(), "sync")) ok = 0, device_still_usable();
        qva_context_free(ca), qva_context_free(cb);
        if (ok) {
            const int bad = compare_all("two threads/two contexts", A, NWA, 1, refA, nondetA) +
                            compare_all("two threads/two contexts", B, NWB, 1, refB, nondetB);
            printf("  two host threads, two contexts, round %d: %s\n", round, bad ? "MISMATCH" : "identical");
        }
    }

    /* B: one context (one stream) from two host threads, each on its own
     * layers; the library serializes calls on one context (its contract) */
    {
        enum { STEPS = 4, LAYERS = 3, NT = STEPS * LAYERS };
        static const char *const m0[LAYERS] = {"vc8+expcast", "draft@85/0/7.5/7.5", "sage8"};
        static const char *const m1[LAYERS] = {"vc4", "vc8+hadamard", "bf16"};
        gcall T0[NT], T1[NT];
        gres R0[NT], R1[NT];
        int n0 = 0, n1 = 0;
        memset(R0, 0, sizeof R0), memset(R1, 0, sizeof R1);
        for (int s = 0; s < STEPS; ++s)
            for (int l = 0; l < LAYERS; ++l) {
                cspec a = {m0[l], 1, 4, 3000, 0, 128, QVA_BF16, 0, 1, 2 * l, s, 8, 0, 0, 0, 0, 0, 0, 0, 0};
                if (l == 1) a.T = 3, a.GH = 20, a.GW = 48, a.P = 120;
                cspec b = {m1[l], 2, 2, 2000, 0, 64, QVA_F16, 1, 1, 2 * l + 1, s, 8, 0, 0, 0, 0, 0, 0, 0, 0};
                if (n0 == s * LAYERS + l && gcall_init(&T0[n0], &a, 300 + (uint64_t)n0)) ++n0;
                if (n1 == s * LAYERS + l && gcall_init(&T1[n1], &b, 400 + (uint64_t)n1)) ++n1;
            }
        int ok = n0 == NT && n1 == NT;
        cudaStream_t s = sA;
        if (ok) { /* serial reference on a fresh context */
            qva_context_t *c = new_ctx(s);
            ok = c && run_list(T0, NT, c, s, 0, err, sizeof err) && run_list(T1, NT, c, s, 0, err, sizeof err);
            if (!ok) failf("one context, serial: %s", err);
            ok = ok && cu_ok(cudaDeviceSynchronize(), "sync");
            qva_context_free(c);
            for (int i = 0; ok && i < NT; ++i) ok = gres_fetch(&T0[i], 0, &R0[i]) && gres_fetch(&T1[i], 0, &R1[i]);
        }
        printf("streams: one context from two host threads (%d calls each; a crash here is a thread-safety bug)\n", NT);
        fflush(stdout);
        for (int round = 0; ok && round < 4 && !g_dev_broken; ++round) {
            qva_context_t *c = new_ctx(s);
            int rok = c && run_threads(T0, NT, c, s, T1, NT, c, s, 1, "one context/two threads");
            if (!cu_ok(cudaDeviceSynchronize(), "sync")) rok = 0, device_still_usable();
            qva_context_free(c);
            if (rok) {
                const int bad = compare_all("one context/two threads", T0, NT, 1, R0, NULL) +
                                compare_all("one context/two threads", T1, NT, 1, R1, NULL);
                printf("  one context, two host threads, round %d: %s\n", round, bad ? "MISMATCH" : "identical");
            }
        }
        for (int i = 0; i < NT; ++i) gres_free(&R0[i]), gres_free(&R1[i]);
        for (int i = 0; i < n0; ++i) gcall_free(&T0[i]);
        for (int i = 0; i < n1; ++i) gcall_free(&T1[i]);
    }

done:
    for (int i = 0; i < NWA; ++i) gres_free(&refA[i]);
    for (int i = 0; i < NWB; ++i) gres_free(&refB[i]);
    for (int i = 0; i < okA; ++i) gcall_free(&A[i]);
    for (int i = 0; i < okB; ++i) gcall_free(&B[i]);
    if (okA < NWA || okB < NWB) failf("setup failed");
    cudaStreamDestroy(sA), cudaStreamDestroy(sB);
    return report("streams", t0, g_fail ? "FAIL" : g_dev_broken ? "INCOMPLETE" : "pass",
                  "2 ctx/2 streams x3, 2 threads/2 ctx x3, 1 ctx/2 threads x4");
}

/* ================================================================ mode: graphs */

/* One graph case: calls captured together (usually one), after eager
 * warm-up calls at the steps in warm[] (allocation and first-use syncs
 * happen there), then captured at each call's own step. */
typedef struct gcase {
    char name[160];
    int edge; /* beyond "every method and action": a FINDING, not a failure */
    int n, nwarm;
    int warm[2];
    cspec calls[4];
} gcase;

static const char *const GRAPH_METHODS[] = {
    "bf16",  "fp8",  "fp8+expcast", "fp8+hadamard", "sage8", "sage8+expcast", "sage8+nohadamard+fp32sum",
    "sage8+expcast+hadamard", "sage4", "sage4+hadamard", "vc8", "vc8+expcast", "vc8+hadamard",
    "vc8+expcast+hadamard", "vc4", "vc4+hadamard", "draft@0/0/0/100", "draft@85/0/0/15",
    "draft@85/0/7.5/7.5", "draft@85/0/7.5/7.5+expcast", "draft@0/40/30/30", "draft@50/20/15/15"};
#define NGM (int)(sizeof GRAPH_METHODS / sizeof *GRAPH_METHODS)

/* Two shapes: S0 = B1 H4 N2300 D128 bf16 HND with LSE (draft grid 2x20x55
 * + 100 first); S1 = B2 H2 N1000 D64 f16 NHD, no LSE, Hadamard signs
 * (draft grid 3x12x27 + 28 last). */
static cspec graph_shape(int s, const char *m, int layer) {
    cspec c;
    memset(&c, 0, sizeof c);
    c.method = m;
    c.layer = layer;
    if (s == 0) {
        c.B = 1, c.H = 4, c.N = 2300, c.D = 128, c.dt = QVA_BF16, c.lse = 1;
        if (!strncmp(m, "draft", 5)) c.T = 2, c.GH = 20, c.GW = 55, c.P = 100;
    } else {
        c.B = 2, c.H = 2, c.N = 1000, c.D = 64, c.dt = QVA_F16, c.nhd = 1, c.signs = strstr(m, "hadamard") != NULL;
        if (!strncmp(m, "draft", 5)) c.T = 3, c.GH = 12, c.GW = 27, c.P = 28, c.at_end = 1;
    }
    return c;
}

/* A zeroed case appended to gc[0..*n) (NULL when full). */
static gcase *gcase_add(gcase *gc, int *n, int max, int ncalls, int edge, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
static gcase *gcase_add(gcase *gc, int *n, int max, int ncalls, int edge, const char *fmt, ...) {
    if (*n >= max) return NULL;
    gcase *g = &gc[(*n)++];
    va_list ap;
    memset(g, 0, sizeof *g);
    g->n = ncalls, g->nwarm = 1, g->edge = edge;
    va_start(ap, fmt);
    vsnprintf(g->name, sizeof g->name, fmt, ap);
    va_end(ap);
    return g;
}

static int graph_cases(gcase *gc, int max) {
    int n = 0;
    gcase *g;
    for (int s = 0; s < 2; ++s)
        for (int m = 0; m < NGM; ++m) {
            const char *meth = GRAPH_METHODS[m];
            const int vc = !strncmp(meth, "vc", 2), draft = !strncmp(meth, "draft", 5);
            /* V-Smooth, 40 steps: group at 0, 4, 8; reuse 1-3, 5-7, 9; plain >= 10 */
            static const char *const act[] = {" group", " reuse", " plain"};
            static const int capstep[] = {4, 5, 12};
            for (int a = 0; a < (vc ? 3 : 1); ++a)
                if ((g = gcase_add(gc, &n, max, 1, 0, "%s%s (shape %d)", meth,
                                   vc ? act[a] : draft ? " sparse step" : "", s))) {
                    g->calls[0] = graph_shape(s, meth, 10 + m);
                    if (vc) g->calls[0].num_steps = 40, g->calls[0].step = capstep[a];
                }
            if (draft && m == NGM - 4) { /* dense warm-up: its step and the first sparse one */
                if ((g = gcase_add(gc, &n, max, 1, 0, "%s dense warm-up step (shape %d)", meth, s))) {
                    g->calls[0] = graph_shape(s, meth, 10 + m);
                    g->calls[0].warmup = 2, g->calls[0].step = 1;
                }
                if ((g = gcase_add(gc, &n, max, 1, 0, "%s sparse step after warm-up (shape %d)", meth, s))) {
                    g->nwarm = 2, g->warm[1] = 2;
                    g->calls[0] = graph_shape(s, meth, 10 + m);
                    g->calls[0].warmup = 2, g->calls[0].step = 3;
                }
            }
            if (!strcmp(meth, "vc8+expcast") && (g = gcase_add(gc, &n, max, 1, 0, "%s schedule=always (shape %d)", meth, s))) {
                g->calls[0] = graph_shape(s, meth, 10 + m);
                g->calls[0].always = 1, g->calls[0].num_steps = 40, g->calls[0].step = 1;
            }
        }
    /* A transformer step: four layers of different methods in one graph. */
    if ((g = gcase_add(gc, &n, max, 4, 0, "multi-call graph: vc8+expcast reuse, sage8, draft, bf16 (one shape)"))) {
        g->calls[0] = graph_shape(0, "vc8+expcast", 1), g->calls[0].num_steps = 40, g->calls[0].step = 5;
        g->calls[1] = graph_shape(0, "sage8", 2);
        g->calls[2] = graph_shape(0, "draft@85/0/7.5/7.5", 3);
        g->calls[3] = graph_shape(0, "bf16", 4);
    }
    /* Edges a model can hit: two shapes on one context (self- and cross-
     * attention), two Hadamard sign sets on one context. */
    if ((g = gcase_add(gc, &n, max, 2, 1, "edge: multi-call graph, sage8 at two key lengths (2300, 333) on one context"))) {
        g->calls[0] = graph_shape(0, "sage8", 1);
        g->calls[1] = graph_shape(0, "sage8", 2), g->calls[1].Nk = 333;
    }
    if ((g = gcase_add(gc, &n, max, 2, 1, "edge: multi-call graph, sage8+hadamard with two sign sets on one context"))) {
        g->calls[0] = graph_shape(0, "sage8+hadamard", 1);
        g->calls[1] = graph_shape(0, "sage8+hadamard", 2), g->calls[1].signs = 5;
    }
    return n;
}

/* Eager (context E, stream sE) vs captured-and-replayed (context G, stream
 * sG) on the same inputs; then new inputs in the same buffers, eager again
 * vs a second replay. */
static void run_graph_case(const gcase *gc) {
    gcall calls[4];
    int ninit = 0;
    cudaStream_t sE = NULL, sG = NULL;
    qva_context_t *E = NULL, *G = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    gres ref[4], got[4];
    memset(ref, 0, sizeof ref), memset(got, 0, sizeof got);
    char err[512] = "";
    ++g_run;
    for (; ninit < gc->n; ++ninit)
        if (!gcall_init(&calls[ninit], &gc->calls[ninit], 900 + (uint64_t)ninit)) goto done;
    if (!cu_ok(cudaStreamCreateWithFlags(&sE, cudaStreamNonBlocking), "stream") ||
        !cu_ok(cudaStreamCreateWithFlags(&sG, cudaStreamNonBlocking), "stream") || !(E = new_ctx(sE)) ||
        !(G = new_ctx(sG))) {
        failf("graph %s: setup failed", gc->name);
        goto done;
    }
    /* eager warm-up on both contexts */
    for (int w = 0; w < gc->nwarm; ++w)
        for (int i = 0; i < gc->n; ++i) {
            qva_status st = gcall_call(&calls[i], E, 0, gc->warm[w]);
            if (st == QVA_OK) st = gcall_call(&calls[i], G, 1, gc->warm[w]);
            if (st != QVA_OK) {
                failf("graph %s: eager warm-up call %d returned %s: %s", gc->name, i, qva_status_string(st),
                      qva_last_error());
                goto done;
            }
        }
    if (!cu_ok(cudaDeviceSynchronize(), "warm-up")) {
        failf("graph %s: eager warm-up failed on the device", gc->name);
        device_still_usable();
        goto done;
    }
    for (int round = 0; round < 2; ++round) {
        if (round == 1) { /* new inputs in the same buffers */
            for (int i = 0; i < gc->n; ++i)
                if (!gcall_fill(&calls[i], 5000 + (uint64_t)i)) goto done;
        }
        /* eager */
        if (!run_list(calls, gc->n, E, sE, 0, err, sizeof err)) {
            failf("graph %s: eager call: %s", gc->name, err);
            goto done;
        }
        if (!cu_ok(cudaDeviceSynchronize(), "eager")) {
            failf("graph %s: eager call failed on the device", gc->name);
            device_still_usable();
            goto done;
        }
        for (int i = 0; i < gc->n; ++i) {
            gres_free(&ref[i]);
            if (!gres_fetch(&calls[i], 0, &ref[i])) goto done;
            if (gres_nonfinite(&calls[i], &ref[i])) failf("graph %s: eager call %d: non-finite output", gc->name, i);
        }
        /* capture once, replay every round */
        for (int i = 0; i < gc->n; ++i)
            if (!gcall_poison(&calls[i], 1, sG)) goto done;
        if (!cu_ok(cudaStreamSynchronize(sG), "poison")) goto done;
        if (round == 0) {
            cudaError_t e = cudaStreamBeginCapture(sG, cudaStreamCaptureModeGlobal);
            if (e != cudaSuccess) {
                failf("graph %s: cudaStreamBeginCapture: %s", gc->name, cudaGetErrorString(e));
                cudaGetLastError();
                goto done;
            }
            qva_status st = QVA_OK;
            int bad_call = -1;
            char lib_err[400] = "";
            for (int i = 0; i < gc->n && st == QVA_OK; ++i) {
                st = gcall_call(&calls[i], G, 1, -1);
                if (st != QVA_OK) bad_call = i, snprintf(lib_err, sizeof lib_err, "%s", qva_last_error());
            }
            e = cudaStreamEndCapture(sG, &graph);
            const cudaError_t e2 = e == cudaSuccess && graph ? cudaGraphInstantiate(&exec, graph, 0) : e;
            if (st != QVA_OK || e != cudaSuccess || !graph || e2 != cudaSuccess) {
                char why[640];
                if (st != QVA_OK)
                    snprintf(why, sizeof why, "call %d of the graph returned %s: %s", bad_call,
                             qva_status_string(st), lib_err);
                else if (e != cudaSuccess || !graph)
                    snprintf(why, sizeof why, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
                else
                    snprintf(why, sizeof why, "cudaGraphInstantiate: %s", cudaGetErrorString(e2));
                failf("graph %s: NOT CAPTURABLE (global capture mode, after eager warm-up): %s", gc->name, why);
                cudaGetLastError();
                goto done;
            }
        }
        if (!cu_ok(cudaGraphLaunch(exec, sG), "cudaGraphLaunch") || !cu_ok(cudaStreamSynchronize(sG), "replay")) {
            failf("graph %s: replay %d failed on the device", gc->name, round);
            device_still_usable();
            goto done;
        }
        for (int i = 0; i < gc->n; ++i) {
            size_t ld = 0, d;
            gres_free(&got[i]);
            if (!gres_fetch(&calls[i], 1, &got[i])) goto done;
            d = gres_diff(&calls[i], &ref[i], &got[i], &ld);
            const size_t nf = gres_nonfinite(&calls[i], &got[i]);
            if (d || ld || nf)
                failf("graph %s: replay %d, call %d: %zu output elements and %zu LSE values differ from eager, %zu "
                      "non-finite",
                      gc->name, round, i, d, ld, nf);
        }
    }
    if (g_verbose) printf("  graph %s: ok\n", gc->name);
done:
    if (ninit < gc->n) failf("graph %s: setup failed", gc->name);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaDeviceSynchronize();
    cudaGetLastError();
    qva_context_free(E), qva_context_free(G);
    if (sE) cudaStreamDestroy(sE);
    if (sG) cudaStreamDestroy(sG);
    for (int i = 0; i < 4; ++i) gres_free(&ref[i]), gres_free(&got[i]);
    for (int i = 0; i < ninit; ++i) gcall_free(&calls[i]);
}

static int mode_graphs(const opts *o) {
    g_mode = "graphs";
    const double t0 = now_s();
    static gcase gc[128];
    const int n = graph_cases(gc, 128);
    printf("graphs: %d cases (eager warm-up, capture in global mode, replay twice with new inputs)\n", n);
    for (int i = 0; i < n && !g_dev_broken; ++i) {
        if (o->methods && strncmp(gc[i].calls[0].method, o->methods, strlen(o->methods))) continue;
        const int before = g_fail + g_findings;
        g_soft = gc[i].edge;
        run_graph_case(&gc[i]);
        g_soft = 0;
        printf("  %-80s %s\n", gc[i].name,
               g_fail + g_findings == before ? "ok" : gc[i].edge ? "FINDING" : "FAILED");
        fflush(stdout);
    }
    char note[160];
    snprintf(note, sizeof note, "%d cases; %d findings in edge cases (FINDING lines, not failures)", n, g_findings);
    return report("graphs", t0, g_fail ? "FAIL" : g_dev_broken ? "INCOMPLETE" : "pass", note);
}

/* ================================================================ mode: oom */

static size_t dev_free_bytes(void) {
    size_t fr = 0, tot = 0;
    cudaDeviceSynchronize();
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
    return fr;
}

/* Ballast: device allocations until about `leave` bytes stay free. */
typedef struct ballast {
    void *p[512];
    int n;
} ballast;
static void ballast_free(ballast *b) {
    for (int i = 0; i < b->n; ++i) cudaFree(b->p[i]);
    b->n = 0;
    cudaDeviceSynchronize();
}
static void ballast_fill(ballast *b, size_t leave) {
    const size_t MiB2 = (size_t)2 << 20;
    size_t chunk = (size_t)1 << 30;
    while (b->n < 512 && chunk >= MiB2) {
        const size_t fr = dev_free_bytes();
        if (fr <= leave + MiB2) break;
        const size_t want = fr - leave < chunk ? ((fr - leave) / MiB2) * MiB2 : chunk;
        if (want < MiB2) break;
        void *p = NULL;
        if (cudaMalloc(&p, want) != cudaSuccess) {
            cudaGetLastError();
            chunk = want / 2; /* fragmentation or reserve: ask for less */
            continue;
        }
        b->p[b->n++] = p;
    }
}

/* The big inputs: [1,16,65536,128] bf16 (256 MiB a tensor); workspaces of
 * every method are several of these. */
enum { OB = 1, OH = 16, ON = 65536, OD = 128 };

typedef struct big_io {
    void *q, *k, *v, *o;
} big_io;

static qva_status big_call(qva_context_t *ctx, const char *method, const big_io *io, int layer) {
    qva_config cfg;
    qva_config_default(&cfg);
    qva_config_set_method(&cfg, method);
    cfg.layer = layer;
    if (cfg.method == QVA_METHOD_DRAFT) /* 16 x 64 x 64 = 65536 */
        cfg.draft.grid_t = 16, cfg.draft.grid_h = 64, cfg.draft.grid_w = 64, cfg.draft.prefix_tokens = 0;
    const qva_tensor q = qva_tensor_hnd(io->q, QVA_BF16, QVA_DEVICE_CUDA, OB, OH, ON, OD),
                     k = qva_tensor_hnd(io->k, QVA_BF16, QVA_DEVICE_CUDA, OB, OH, ON, OD),
                     v = qva_tensor_hnd(io->v, QVA_BF16, QVA_DEVICE_CUDA, OB, OH, ON, OD),
                     o = qva_tensor_hnd(io->o, QVA_BF16, QVA_DEVICE_CUDA, OB, OH, ON, OD);
    return qva_attention(ctx, &cfg, &q, &k, &v, &o, NULL);
}

static const char *const OOM_METHODS[] = {"bf16", "fp8+expcast", "sage8", "vc8+expcast", "sage4", "vc4",
                                          "draft@85/0/7.5/7.5", "draft@0/40/30/30"};
#define NOOM (int)(sizeof OOM_METHODS / sizeof *OOM_METHODS)

/* A small case of a method (full CPU reference) on ctx. */
static int small_check(qva_context_t *ctx, cudaStream_t s, const char *method, int idx) {
    scase c;
    small_case(&c, 500 + idx, method, 1, 2, 300, 300, 128, QVA_BF16, LAY_HND, 1);
    if (!strncmp(method, "draft", 5)) set_draft_grid(&c, 1, 12, 20, 60, 0);
    case_time tm = {0, 0};
    return run_scase(&c, ctx, s, &tm) == 1;
}

static long host_rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static void soak(const opts *o) {
    enum { CYCLE = 10 };
    cspec sp[CYCLE];
    memset(sp, 0, sizeof sp);
    sp[0] = graph_shape(0, "bf16", 0), sp[0].N = 1500, sp[0].D = 64;
    sp[1] = graph_shape(0, "fp8+expcast", 0), sp[1].N = 2000;
    sp[2] = graph_shape(1, "sage8+hadamard", 0);
    sp[3] = graph_shape(0, "vc8+expcast", 0), sp[3].num_steps = 40;
    sp[4] = graph_shape(1, "vc4", 1), sp[4].num_steps = 40;
    sp[5] = graph_shape(0, "sage4", 0), sp[5].N = 700;
    sp[6] = graph_shape(0, "draft@85/0/7.5/7.5", 0);
    sp[7] = graph_shape(1, "draft@0/40/30/30", 0);
    sp[8] = graph_shape(0, "draft@85/0/0/15", 0), sp[8].warmup = 1000;
    sp[9] = graph_shape(1, "vc8", 2), sp[9].always = 1;
    gcall calls[CYCLE];
    int ninit = 0;
    cudaStream_t s = NULL;
    qva_context_t *ctx = NULL;
    const int total = ((o->soak < 20 ? 20 : o->soak) + CYCLE - 1) / CYCLE * CYCLE;
    for (; ninit < CYCLE; ++ninit)
        if (!gcall_init(&calls[ninit], &sp[ninit], 7000 + (uint64_t)ninit)) break;
    if (ninit < CYCLE || !cu_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream") || !(ctx = new_ctx(s))) {
        failf("soak: setup failed");
        goto done;
    }
    size_t m10 = 0, mprev = 0;
    long rss10 = 0;
    const double t0 = now_s();
    ++g_run;
    for (int i = 0; i < total; ++i) {
        gcall *g = &calls[i % CYCLE];
        const int step = g->cfg.num_steps > 0 ? (i / CYCLE) % g->cfg.num_steps : 0;
        const qva_status st = gcall_call(g, ctx, 0, step);
        if (st != QVA_OK) {
            failf("soak: call %d (%s) returned %s: %s", i, g->sp.method, qva_status_string(st), qva_last_error());
            goto done;
        }
        if ((i + 1) % CYCLE == 0 && !cu_ok(cudaStreamSynchronize(s), "soak")) {
            failf("soak: the device failed after call %d", i);
            device_still_usable();
            goto done;
        }
        const int n = i + 1;
        if (n == CYCLE || n == 100 || n == 500 || n == total) {
            const size_t fr = dev_free_bytes();
            const long rss = host_rss_kib();
            if (n == CYCLE) m10 = fr, rss10 = rss;
            printf("  soak: after %5d calls: device free %.1f MiB (%+.2f MiB vs after 10), host RSS %+ld KiB vs after 10\n",
                   n, (double)fr / 1048576.0, ((double)fr - (double)m10) / 1048576.0, rss - rss10);
            mprev = fr;
        }
    }
    {
        const double grew = ((double)m10 - (double)mprev) / 1048576.0;
        if (fabs(grew) > 1.0)
            failf("soak: device memory after %d calls differs from after 10 calls by %.2f MiB (limit 1 MiB)", total, grew);
        else
            printf("  soak: %d calls in %.1f s, device memory within %.2f MiB of the level after 10 calls\n", total,
                   now_s() - t0, fabs(grew));
    }
done:
    qva_context_free(ctx);
    if (s) cudaStreamDestroy(s);
    for (int i = 0; i < ninit; ++i) gcall_free(&calls[i]);
}

static int mode_oom(const opts *o) {
    g_mode = "oom";
    const double t0 = now_s();
    big_io io = {NULL, NULL, NULL, NULL};
    ballast bal;
    memset(&bal, 0, sizeof bal);
    cudaStream_t s = NULL;
    qva_context_t *ctx = NULL, *warm = NULL;
    const size_t bytes = (size_t)OB * OH * ON * OD * 2, MiB = (size_t)1 << 20;
    if (!cu_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream")) goto done;
    if (!cu_ok(cudaMalloc(&io.q, bytes), "q") || !cu_ok(cudaMalloc(&io.k, bytes), "k") ||
        !cu_ok(cudaMalloc(&io.v, bytes), "v") || !cu_ok(cudaMalloc(&io.o, bytes), "o")) {
        failf("oom: the inputs (4 x %zu MiB) do not fit", bytes / MiB);
        goto done;
    }
    /* bf16 0x3C3C = 0.0115: finite inputs, no host generation */
    cudaMemset(io.q, 0x3C, bytes), cudaMemset(io.k, 0x3C, bytes), cudaMemset(io.v, 0x3C, bytes);
    cudaDeviceSynchronize();

    /* 1. every method once at the big shape with all memory free (legal
     * shape; loads the kernels), on a context freed afterwards */
    if (!(warm = new_ctx(s))) goto done;
    printf("oom: big shape [%d,%d,%d,%d] bf16 with memory free\n", OB, OH, ON, OD);
    for (int m = 0; m < NOOM; ++m) {
        const double tm = now_s();
        const qva_status st = big_call(warm, OOM_METHODS[m], &io, 1);
        const int synced = cu_ok(cudaStreamSynchronize(s), "big call");
        ++g_run;
        if (st != QVA_OK || !synced) {
            failf("oom: %s at the big shape with free memory returned %s: %s", OOM_METHODS[m], qva_status_string(st),
                  qva_last_error());
            if (!synced && !device_still_usable()) goto done;
        } else {
            printf("  %-22s ok (%.2f s)\n", OOM_METHODS[m], now_s() - tm);
        }
    }
    for (int m = 0; m < NOOM; ++m) /* the small calls' kernels too */
        if (!small_check(warm, s, OOM_METHODS[m], 60 + m)) failf("oom: small %s call failed", OOM_METHODS[m]);
    qva_context_free(warm);
    warm = NULL;
    const size_t base = dev_free_bytes(); /* no context alive */

    /* 2. a context that did small calls; memory filled so that the big
     * call's workspace cannot fit: first nearly nothing free (the first
     * allocation fails), then 300 MiB (some allocations succeed first) */
    if (!(ctx = new_ctx(s))) goto done;
    for (int m = 0; m < NOOM; ++m)
        if (!small_check(ctx, s, OOM_METHODS[m], m)) failf("oom: small %s call before the test failed", OOM_METHODS[m]);
    static const size_t leave_mib[2] = {64, 300};
    for (int lv = 0; lv < 2 && !g_dev_broken; ++lv) {
        ballast_fill(&bal, leave_mib[lv] * MiB);
        printf("oom: ballast leaves %.0f MiB free (asked %zu MiB)\n", (double)dev_free_bytes() / (double)MiB, leave_mib[lv]);
        for (int m = 0; m < NOOM && !g_dev_broken; ++m) {
            ++g_run;
            const qva_status st = big_call(ctx, OOM_METHODS[m], &io, 100 + m);
            const int synced = cu_ok(cudaStreamSynchronize(s), "after the failed call");
            /* 64 MiB fits no workspace; at 300 MiB the 4-bit methods' (a
             * quarter of the 8-bit ones') can fit, and then the call runs */
            if (st != QVA_ERR_OUT_OF_MEMORY && !(lv == 1 && st == QVA_OK))
                failf("oom: %s with %zu MiB free returned %s (expected out of memory): %s", OOM_METHODS[m],
                      leave_mib[lv], qva_status_string(st), qva_last_error());
            if (!synced) {
                failf("oom: %s: the device failed after the out-of-memory call", OOM_METHODS[m]);
                if (!device_still_usable()) goto done;
            }
            ++g_run;
            /* a layer of its own per level: a second call on one layer
             * would warm-start k-means from the first's centroids, which
             * the fresh CPU reference cannot follow */
            const int ok = small_check(ctx, s, OOM_METHODS[m], 20 + 10 * lv + m);
            if (!ok) failf("oom: %s: a small call after the out-of-memory call failed (context not usable)", OOM_METHODS[m]);
            printf("  %-22s %s -> %s, then a small call: %s\n", OOM_METHODS[m], "big call", qva_status_string(st),
                   ok ? "ok" : "FAILED");
            fflush(stdout);
        }
        ballast_free(&bal);
    }
    /* 3. memory back: the same context runs the big shape */
    for (int m = 0; m < NOOM && !g_dev_broken; m += 3) {
        ++g_run;
        const qva_status st = big_call(ctx, OOM_METHODS[m], &io, 200 + m);
        if (st != QVA_OK || !cu_ok(cudaStreamSynchronize(s), "big call"))
            failf("oom: %s at the big shape after the ballast was freed returned %s: %s", OOM_METHODS[m],
                  qva_status_string(st), qva_last_error());
    }
    /* 4. nothing leaked: with the context freed, device memory is back
     * at its level before the context was created */
    qva_context_free(ctx);
    ctx = NULL;
    {
        const size_t after = dev_free_bytes();
        const double diff = ((double)base - (double)after) / (double)MiB;
        ++g_run;
        printf("oom: device free before the tested context %.1f MiB, after freeing it %.1f MiB\n",
               (double)base / (double)MiB, (double)after / (double)MiB);
        if (fabs(diff) > 1.0)
            failf("oom: freeing a context that met out-of-memory errors left %.2f MiB of device memory behind", diff);
    }
    printf("oom: soak\n");
    soak(o);
done:
    ballast_free(&bal);
    qva_context_free(warm), qva_context_free(ctx);
    cudaFree(io.q), cudaFree(io.k), cudaFree(io.v), cudaFree(io.o);
    if (s) cudaStreamDestroy(s);
    return report("oom", t0, g_fail ? "FAIL" : g_dev_broken ? "INCOMPLETE" : "pass", "");
}

/* ================================================================ mode: all */

typedef struct child_res {
    char mode[16];
    char result[16];
    int run, fail, skip;
    double seconds;
    char note[200];
    int status; /* wait status */
    int timed_out, have_line;
} child_res;

#define MAX_FAIL_LINES 60
static char *g_fail_lines[MAX_FAIL_LINES];
static int g_nfail_lines, g_fail_lines_dropped;

static void keep_fail_line(const char *mode, const char *line) {
    if (g_nfail_lines < MAX_FAIL_LINES) {
        const size_t n = strlen(line) + strlen(mode) + 4;
        char *p = malloc(n);
        if (p) snprintf(p, n, "%s", line), g_fail_lines[g_nfail_lines++] = p;
    } else {
        ++g_fail_lines_dropped;
    }
}

static void parse_at_line(const char *line, child_res *r) {
    const char *p;
    r->have_line = 1;
    if ((p = strstr(line, "result="))) sscanf(p, "result=%15s", r->result);
    if ((p = strstr(line, "run="))) r->run = atoi(p + 4);
    if ((p = strstr(line, "fail="))) r->fail = atoi(p + 5);
    if ((p = strstr(line, "skip="))) r->skip = atoi(p + 5);
    if ((p = strstr(line, "seconds="))) r->seconds = atof(p + 8);
    if ((p = strstr(line, "note="))) snprintf(r->note, sizeof r->note, "%s", p + 5);
}

/* Runs `self argv...` with its output echoed and parsed; killed after
 * timeout_s. */
static void run_child(const char *self, char *const argv[], int timeout_s, child_res *r) {
    int fds[2];
    const double t0 = now_s();
    snprintf(r->result, sizeof r->result, "CRASH");
    fflush(stdout);
    if (pipe(fds) != 0) {
        snprintf(r->note, sizeof r->note, "pipe: %s", strerror(errno));
        return;
    }
    const pid_t pid = fork();
    if (pid < 0) {
        snprintf(r->note, sizeof r->note, "fork: %s", strerror(errno));
        close(fds[0]), close(fds[1]);
        return;
    }
    if (pid == 0) {
        dup2(fds[1], 1), dup2(fds[1], 2);
        close(fds[0]), close(fds[1]);
        execv(self, argv);
        fprintf(stderr, "exec %s: %s\n", self, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    char buf[8192], line[4096];
    size_t ll = 0;
    for (;;) {
        const double left = t0 + timeout_s - now_s();
        if (left <= 0) {
            kill(pid, SIGKILL);
            r->timed_out = 1;
            printf("FAIL [all] mode %s: killed after %d s (hang or too slow)\n", r->mode, timeout_s);
            break;
        }
        struct pollfd pf = {fds[0], POLLIN, 0};
        const int pr = poll(&pf, 1, (int)(left * 1000 > 1000 ? 1000 : left * 1000 + 1));
        if (pr < 0 && errno != EINTR) break;
        if (pr <= 0) continue;
        const ssize_t got = read(fds[0], buf, sizeof buf);
        if (got <= 0) break;
        for (ssize_t i = 0; i < got; ++i) {
            if (buf[i] != '\n' && ll < sizeof line - 1) {
                line[ll++] = buf[i];
                continue;
            }
            line[ll] = 0;
            puts(line);
            const char *pc = strstr(line, "  [cases] "); /* progress: counts if the child dies */
            if (pc && !r->have_line) sscanf(pc, "  [cases] %d run, %d failed, %d skipped", &r->run, &r->fail, &r->skip);
            if (!strncmp(line, "@@ ", 3)) parse_at_line(line, r);
            else if (!strncmp(line, "FAIL", 4) || !strncmp(line, "FINDING", 7)) keep_fail_line(r->mode, line);
            ll = 0;
        }
        fflush(stdout);
    }
    if (ll) line[ll] = 0, puts(line);
    close(fds[0]);
    waitpid(pid, &r->status, 0);
    if (!r->seconds) r->seconds = now_s() - t0;
    if (r->timed_out) {
        snprintf(r->result, sizeof r->result, "TIMEOUT");
        snprintf(r->note, sizeof r->note, "killed after %d s", timeout_s);
        ++r->fail;
    } else if (WIFSIGNALED(r->status)) {
        snprintf(r->result, sizeof r->result, "CRASH");
        snprintf(r->note, sizeof r->note, "signal %d (%s)%s", WTERMSIG(r->status), strsignal(WTERMSIG(r->status)),
                 r->have_line ? "" : ", no result line");
        keep_fail_line(r->mode, "FAIL [all] a mode crashed (see its output above)");
        ++r->fail;
    } else if (!r->have_line) {
        snprintf(r->result, sizeof r->result, "FAIL");
        snprintf(r->note, sizeof r->note, "exit %d without a result line", WEXITSTATUS(r->status));
        ++r->fail;
    }
}

static int mode_all(const opts *o, const char *argv0) {
    const double t0 = now_s();
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) self[n] = 0;
    else snprintf(self, sizeof self, "%s", argv0);
    static const char *const modes[] = {"streams", "graphs", "oom", "cases"};
    static const int limits[] = {150, 200, 240, 0}; /* typical: 20, 30, 60 s */
    child_res res[4];
    memset(res, 0, sizeof res);
    char seed[32], maxn[32], soakn[32], secs[32], nc[32];
    snprintf(seed, sizeof seed, "%" PRIu64, o->seed);
    snprintf(maxn, sizeof maxn, "%d", o->max_n);
    snprintf(soakn, sizeof soakn, "%d", o->soak);
    snprintf(nc, sizeof nc, "%d", o->n);
    printf("gpu_sweep all: seed %s, budget %.0f s; %s\n", seed, o->seconds, qva_build_info());
    for (int i = 0; i < 4; ++i) {
        snprintf(res[i].mode, sizeof res[i].mode, "%s", modes[i]);
        int limit = limits[i];
        double cases_budget = o->seconds - (now_s() - t0) - 5;
        if (i == 3) {
            if (cases_budget < 30) cases_budget = 30;
            limit = (int)cases_budget + 120;
        }
        snprintf(secs, sizeof secs, "%.0f", i == 3 ? cases_budget : o->seconds);
        char *args[] = {(char *)argv0, (char *)modes[i], nc,    (char *)"--seed", seed, (char *)"--max-n", maxn,
                        (char *)"--soak", soakn, (char *)"--seconds", secs, (char *)"--timeout", (char *)"0",
                        o->verbose ? (char *)"--verbose" : NULL, NULL};
        printf("\n================ gpu_sweep %s (limit %d s) ================\n", modes[i], limit);
        run_child(self, args, limit, &res[i]);
    }
    int failed = 0;
    printf("\n## gpu_sweep all (seed %s)\n\n", seed);
    printf("| mode | result | run | failures | skipped | seconds | note |\n|---|---|--:|--:|--:|--:|---|\n");
    for (int i = 0; i < 4; ++i) {
        printf("| %s | %s | %d | %d | %d | %.1f | %s |\n", res[i].mode, res[i].result, res[i].run, res[i].fail,
               res[i].skip, res[i].seconds, res[i].note);
        failed += strcmp(res[i].result, "pass") != 0;
    }
    if (g_nfail_lines) {
        printf("\nfailures and findings (first %d%s):\n", g_nfail_lines, g_fail_lines_dropped ? ", more above" : "");
        for (int i = 0; i < g_nfail_lines; ++i) printf("  %s\n", g_fail_lines[i]), free(g_fail_lines[i]);
    }
    printf("\ngpu_sweep all: %s (%d of 4 modes passed) in %.0f s\n", failed ? "FAIL" : "PASS", 4 - failed, now_s() - t0);
    printf("@@ mode=all result=%s run=%d fail=%d skip=0 seconds=%.1f note=%d of 4 modes passed\n",
           failed ? "FAIL" : "pass", 4, failed, now_s() - t0, 4 - failed);
    return failed ? 1 : 0;
}

/* ================================================================ main */

static int usage(void) {
    fprintf(stderr,
            "usage: gpu_sweep MODE [N] [options]\n"
            "  MODE: cases [N] | streams | graphs | oom | small | all\n"
            "  --seed S  --seconds T  --only K  --max-n N  --soak N  --methods PREFIX\n"
            "  --timeout T  --verbose  --cpu-device  --plan\n"
            "(the comment at the top of tests/gpu_sweep.c explains each)\n");
    return 2;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    opts o;
    memset(&o, 0, sizeof o);
    o.n = 500, o.seed = 1, o.seconds = 300, o.only = -1, o.max_n = 20000, o.soak = 1000, o.timeout = -1;
    if (argc < 2) return usage();
    o.mode = argv[1];
    for (int i = 2; i < argc; ++i) {
        const char *a = argv[i];
        char *end = NULL;
        const int has_val = i + 1 < argc;
        if (!strcmp(a, "--seed") && has_val) o.seed = strtoull(argv[++i], &end, 0);
        else if (!strcmp(a, "--seconds") && has_val) o.seconds = strtod(argv[++i], &end);
        else if (!strcmp(a, "--only") && has_val) o.only = (int)strtol(argv[++i], &end, 0);
        else if (!strcmp(a, "--max-n") && has_val) o.max_n = (int)strtol(argv[++i], &end, 0);
        else if (!strcmp(a, "--soak") && has_val) o.soak = (int)strtol(argv[++i], &end, 0);
        else if (!strcmp(a, "--timeout") && has_val) o.timeout = (int)strtol(argv[++i], &end, 0);
        else if (!strcmp(a, "--methods") && has_val) o.methods = argv[++i];
        else if (!strcmp(a, "--verbose")) g_verbose = o.verbose = 1;
        else if (!strcmp(a, "--cpu-device")) g_cpu_dev = 1;
        else if (!strcmp(a, "--plan")) o.plan = 1;
        else if (a[0] >= '0' && a[0] <= '9') o.n = (int)strtol(a, &end, 0);
        else return usage();
        if (end && *end) {
            fprintf(stderr, "gpu_sweep: bad number '%s'\n", argv[i]);
            return 2;
        }
    }
    if (o.n < 1 || o.max_n < 1 || o.max_n > 1 << 20 || !(o.seconds > 0) || o.soak < 0) {
        fprintf(stderr, "gpu_sweep: N, --max-n and --seconds must be positive\n");
        return 2;
    }
    const char *m = o.mode;
    const int known = !strcmp(m, "cases") || !strcmp(m, "streams") || !strcmp(m, "graphs") ||
                      !strcmp(m, "oom") || !strcmp(m, "small") || !strcmp(m, "all");
    if (!known) return usage();
    if (g_cpu_dev && strcmp(m, "cases") && strcmp(m, "small")) {
        fprintf(stderr, "gpu_sweep: --cpu-device applies to cases and small only\n");
        return 2;
    }
    if (o.plan && !strcmp(m, "cases")) return plan_cases(&o);
    if (!g_cpu_dev && !qva_cuda_available()) {
        printf("gpu_sweep %s: no CUDA device (%s)\n@@ mode=%s result=NODEVICE run=0 fail=0 skip=0 seconds=0 note=no CUDA device\n",
               m, qva_build_info(), m);
        return 3;
    }
    if (!strcmp(m, "all")) return mode_all(&o, argv[0]);
    int wd = o.timeout;
    if (wd < 0) wd = !strcmp(m, "cases") ? (int)o.seconds + 180 : !strcmp(m, "small") ? 0 : 300;
    watchdog(m, wd);
    if (!g_cpu_dev) {
        int dev = 0;
        struct cudaDeviceProp prop;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
            printf("gpu_sweep %s on %s (sm_%d%d, %.0f GiB); %s\n", m, prop.name, prop.major, prop.minor,
                   (double)prop.totalGlobalMem / 1073741824.0, qva_build_info());
    }
    if (!strcmp(m, "cases")) return mode_cases(&o);
    if (!strcmp(m, "small")) return mode_small(&o);
    if (!strcmp(m, "streams")) return mode_streams(&o);
    if (!strcmp(m, "graphs")) return mode_graphs(&o);
    return mode_oom(&o);
}
