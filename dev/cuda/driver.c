/*
 * The driver of the kernel versions under trial (dev/cuda, after llm.c's
 * dev/cuda): each version runs in place of the library's kernel for its
 * path, through the library's own preparation (qvc_set_dev_kernels), and is
 *   test mode: checked against the CPU reference on a small shape, and
 *              against the library kernel's output bit for bit (reported);
 *   perf mode: timed as full calls on a large shape (median of --iters),
 *              interleaved with the library kernel, and checked against the
 *              library kernel's output by rel-L2.
 *
 *   dev_attn [test|perf] [--method M] [--kernels K1,K2,...] [--shape B,H,N,D]
 *            [--grid T,GH,GW,PREFIX] [--iters N] [--step S --num-steps N]
 *
 * --step/--num-steps put the runs at one point of the schedule (V-Smooth's
 * reuse or plain steps): each context first runs step 0 (grouping), then
 * the checked or timed calls at step S.  Without them every call is a
 * grouping step (num_steps unknown).
 *
 * Kernels: lib (the library's), ws5 (8-bit methods),
 * dw10, dw11, dw16, serial-prep (draft).  Without --kernels the list comes from
 * QVA_ATTN_KERNEL (8-bit methods) or QVA_DRAFT_KERNEL (draft), else every
 * version of the method's path.
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_internal.h"

qva_status dev_attn8_ws5(const qvc_ops *, qvc_qk_format, const qvc_attn_args *, cudaStream_t);
qva_status dev_draft_ws_dw10(const qvc_draft_ws_args *, cudaStream_t);
qva_status dev_draft_ws_dw11(const qvc_draft_ws_args *, cudaStream_t);
qva_status dev_draft_ws_dw16(const qvc_draft_ws_args *, cudaStream_t);

typedef struct version {
    const char *name;
    int draft; /* the path it replaces: 0 the 8-bit kernel, 1 the draft kernel */
    qvc_dev_kernels k;
} version;

static const version VERSIONS[] = {
    {"lib", -1, {NULL, NULL, 0, NULL}},
    {"ws5", 0, {dev_attn8_ws5, NULL, 0, NULL}},
    {"dw10", 1, {NULL, dev_draft_ws_dw10, 0, NULL}},
    {"dw11", 1, {NULL, dev_draft_ws_dw11, 0, NULL}},
    {"dw16", 1, {NULL, dev_draft_ws_dw16, 0, NULL}},
    {"serial-prep", 1, {NULL, NULL, 1, NULL}},
};
#define NVERSIONS (int)(sizeof VERSIONS / sizeof *VERSIONS)

typedef struct opts {
    int perf, iters;
    const char *method, *kernels;
    int B, H, N, D, T, GH, GW, P;
    int step, num_steps;
} opts;

static const version *find_version(const char *name) {
    for (int i = 0; i < NVERSIONS; ++i)
        if (!strcmp(VERSIONS[i].name, name)) return &VERSIONS[i];
    return NULL;
}

/* ------------------------------------------------------------ data */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}
static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

typedef struct io {
    size_t n; /* elements of one tensor */
    uint16_t *q, *k, *v, *o;                 /* host, bf16 [B,H,N,D] */
    void *dq, *dk, *dv, *dout;               /* device */
} io;

static int io_make(const opts *o, io *x) {
    memset(x, 0, sizeof *x);
    x->n = (size_t)o->B * o->H * o->N * o->D;
    const size_t bytes = x->n * 2;
    x->q = malloc(bytes), x->k = malloc(bytes), x->v = malloc(bytes), x->o = malloc(bytes);
    if (!x->q || !x->k || !x->v || !x->o) return 0;
    for (size_t i = 0; i < x->n; ++i) {
        x->q[i] = to_bf16(2.0f * frand());
        x->k[i] = to_bf16(0.5f + 2.0f * frand()); /* a common K component, as in DiTs */
        x->v[i] = to_bf16(frand());
    }
    return qva_device_malloc(&x->dq, bytes) == QVA_OK && qva_device_malloc(&x->dk, bytes) == QVA_OK &&
           qva_device_malloc(&x->dv, bytes) == QVA_OK && qva_device_malloc(&x->dout, bytes) == QVA_OK &&
           qva_memcpy_to_device(x->dq, x->q, bytes) == QVA_OK &&
           qva_memcpy_to_device(x->dk, x->k, bytes) == QVA_OK &&
           qva_memcpy_to_device(x->dv, x->v, bytes) == QVA_OK;
}

static void io_free(io *x) {
    free(x->q), free(x->k), free(x->v), free(x->o);
    qva_device_free(x->dq), qva_device_free(x->dk), qva_device_free(x->dv), qva_device_free(x->dout);
}

static qva_status make_config(const opts *o, qva_config *cfg) {
    qva_config_default(cfg);
    qva_status st = qva_config_set_method(cfg, o->method);
    if (st != QVA_OK) return st;
    cfg->draft.grid_t = o->T, cfg->draft.grid_h = o->GH, cfg->draft.grid_w = o->GW;
    cfg->draft.prefix_tokens = o->P;
    cfg->draft.dense_warmup_steps = 0;
    cfg->step = o->step;
    cfg->num_steps = o->num_steps;
    return QVA_OK;
}

/* Step 0 of the schedule first when the runs are at a later step, so the
 * layer's state (V-Smooth's permutation) is the one that step reuses. */
static qva_status run_step0(qva_context_t *ctx, const qva_config *cfg, const qva_tensor *q,
                            const qva_tensor *k, const qva_tensor *v, const qva_tensor *out) {
    if (cfg->step == 0 || cfg->num_steps <= 0) return QVA_OK;
    qva_config c0 = *cfg;
    c0.step = 0;
    return qva_attention(ctx, &c0, q, k, v, out, NULL);
}

/* ------------------------------------------------------------ runs */
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* One full call of version v on the device; the output lands in x->o. */
static qva_status run_gpu(const opts *o, const version *v, io *x, float *out, double *ms) {
    qva_config cfg;
    qva_context_t *ctx = NULL;
    qva_status st = make_config(o, &cfg);
    if (st == QVA_OK) st = qva_context_create(&ctx, QVA_DEVICE_CUDA);
    if (st == QVA_OK) st = qvc_set_dev_kernels(ctx, &v->k);
    qva_tensor q = qva_tensor_hnd(x->dq, QVA_BF16, QVA_DEVICE_CUDA, o->B, o->H, o->N, o->D);
    qva_tensor k = qva_tensor_hnd(x->dk, QVA_BF16, QVA_DEVICE_CUDA, o->B, o->H, o->N, o->D);
    qva_tensor vv = qva_tensor_hnd(x->dv, QVA_BF16, QVA_DEVICE_CUDA, o->B, o->H, o->N, o->D);
    qva_tensor out_t = qva_tensor_hnd(x->dout, QVA_BF16, QVA_DEVICE_CUDA, o->B, o->H, o->N, o->D);
    for (size_t i = 0; i < x->n; ++i) x->o[i] = 0x7fc1; /* NaN: poison */
    if (st == QVA_OK) st = qva_memcpy_to_device(x->dout, x->o, x->n * 2);
    if (st == QVA_OK) st = run_step0(ctx, &cfg, &q, &k, &vv, &out_t);
    if (st == QVA_OK) st = qva_attention(ctx, &cfg, &q, &k, &vv, &out_t, NULL); /* warm-up */
    const int reps = ms ? o->iters : 0;
    double *t = calloc((size_t)(reps > 0 ? reps : 1), sizeof *t);
    for (int r = 0; st == QVA_OK && r < reps; ++r) {
        st = qva_device_synchronize();
        const double t0 = now_ms();
        if (st == QVA_OK) st = qva_attention(ctx, &cfg, &q, &k, &vv, &out_t, NULL);
        if (st == QVA_OK) st = qva_device_synchronize();
        t[r] = now_ms() - t0;
    }
    if (st == QVA_OK) st = qva_device_synchronize();
    if (st == QVA_OK) st = qva_memcpy_to_host(x->o, x->dout, x->n * 2);
    for (size_t i = 0; st == QVA_OK && i < x->n; ++i) out[i] = from_bf16(x->o[i]);
    if (ms && reps > 0) { /* median */
        for (int i = 1; i < reps; ++i)
            for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
                const double s = t[j];
                t[j] = t[j - 1], t[j - 1] = s;
            }
        *ms = t[reps / 2];
    }
    free(t);
    qva_context_free(ctx);
    return st;
}

static qva_status run_cpu(const opts *o, io *x, float *out) {
    qva_config cfg;
    qva_context_t *ctx = NULL;
    qva_status st = make_config(o, &cfg);
    if (st == QVA_OK) st = qva_context_create(&ctx, QVA_DEVICE_CPU);
    float *of = malloc(x->n * sizeof(float));
    qva_tensor q = qva_tensor_hnd(x->q, QVA_BF16, QVA_DEVICE_CPU, o->B, o->H, o->N, o->D);
    qva_tensor k = qva_tensor_hnd(x->k, QVA_BF16, QVA_DEVICE_CPU, o->B, o->H, o->N, o->D);
    qva_tensor v = qva_tensor_hnd(x->v, QVA_BF16, QVA_DEVICE_CPU, o->B, o->H, o->N, o->D);
    qva_tensor ot = qva_tensor_hnd(of, QVA_F32, QVA_DEVICE_CPU, o->B, o->H, o->N, o->D);
    if (st == QVA_OK && !of) st = QVA_ERR_OUT_OF_MEMORY;
    if (st == QVA_OK) st = run_step0(ctx, &cfg, &q, &k, &v, &ot);
    if (st == QVA_OK) st = qva_attention(ctx, &cfg, &q, &k, &v, &ot, NULL);
    if (st == QVA_OK) memcpy(out, of, x->n * sizeof(float));
    free(of);
    qva_context_free(ctx);
    return st;
}

/* ------------------------------------------------------------ checks */
typedef struct errs {
    double rel_l2, max_abs;
    size_t bad, nonfinite, differ;
} errs;

static errs compare(const float *got, const float *ref, size_t n, double atol, double rtol) {
    errs e = {0, 0, 0, 0, 0};
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(got[i])) {
            ++e.nonfinite;
            continue;
        }
        const double d = fabs((double)got[i] - ref[i]);
        num += d * d, den += (double)ref[i] * ref[i];
        if (d > e.max_abs) e.max_abs = d;
        if (!(d <= atol + rtol * fabs(ref[i]))) ++e.bad;
        if (got[i] != ref[i]) ++e.differ;
    }
    e.rel_l2 = sqrt(num / (den > 0 ? den : 1));
    return e;
}

/* The library's GPU-vs-CPU tolerances (docs/NUMERICS.md), by the lowest
 * precision the method uses. */
static void tolerance(const char *method, double *atol, double *rtol, double *rel) {
    if (strstr(method, "4") && !strstr(method, "draft")) {
        *atol = 5e-2, *rtol = 1e-1, *rel = 5e-2;
    } else if (!strncmp(method, "draft", 5) && !strstr(method, "/0/0/")) {
        *atol = 1e-2, *rtol = 5e-2, *rel = 1e-2;
    } else if (!strncmp(method, "draft", 5) || !strcmp(method, "bf16")) {
        *atol = 2e-3, *rtol = 2e-2, *rel = 2e-3;
    } else {
        *atol = 1e-2, *rtol = 5e-2, *rel = 1e-2;
    }
}

/* ------------------------------------------------------------ main */
static int parse_ints(const char *s, int *v, int n) {
    for (int i = 0; i < n; ++i) {
        char *end;
        const long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > (1 << 30)) return 0;
        v[i] = (int)x;
        if (i + 1 < n) {
            if (*end != ',') return 0;
            s = end + 1;
        } else if (*end) {
            return 0;
        }
    }
    return 1;
}

static int usage(void) {
    fprintf(stderr, "usage: dev_attn [test|perf] [--method M] [--kernels K1,K2,...] "
                    "[--shape B,H,N,D] [--grid T,GH,GW,PREFIX] [--iters N] "
                    "[--step S --num-steps N]\nkernels:");
    for (int i = 0; i < NVERSIONS; ++i) fprintf(stderr, " %s", VERSIONS[i].name);
    fprintf(stderr, "\n");
    return 2;
}

static int parse(int argc, char **argv, opts *o) {
    int shape[4], grid[4];
    memset(o, 0, sizeof *o);
    o->method = "vc8+expcast", o->iters = 10;
    int i = 1, have_shape = 0, have_grid = 0;
    if (i < argc && (!strcmp(argv[i], "test") || !strcmp(argv[i], "perf"))) o->perf = !strcmp(argv[i++], "perf");
    for (; i < argc; i += 2) {
        if (i + 1 >= argc) return 0;
        if (!strcmp(argv[i], "--method")) o->method = argv[i + 1];
        else if (!strcmp(argv[i], "--kernels")) o->kernels = argv[i + 1];
        else if (!strcmp(argv[i], "--shape")) have_shape = parse_ints(argv[i + 1], shape, 4) ? 1 : -1;
        else if (!strcmp(argv[i], "--grid")) have_grid = parse_ints(argv[i + 1], grid, 4) ? 1 : -1;
        else if (!strcmp(argv[i], "--iters")) o->iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--step")) o->step = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--num-steps")) o->num_steps = atoi(argv[i + 1]);
        else return 0;
    }
    if (have_shape < 0 || have_grid < 0 || o->iters < 1) return 0;
    if (o->step < 0 || o->num_steps < 0 || (o->step > 0 && o->step >= o->num_steps)) return 0;
    const int draft = !strncmp(o->method, "draft", 5);
    if (!have_shape) { /* test: small enough for the CPU reference; perf: Wan2.2-720p */
        const int def_test[4] = {1, 2, 1024 + 64, 128}, def_perf[4] = {1, 40, 75600, 128};
        memcpy(shape, o->perf ? def_perf : def_test, sizeof shape);
    }
    if (!have_grid) {
        const int def_test[4] = {4, 16, 16, 64}, def_perf[4] = {21, 45, 80, 0};
        memcpy(grid, o->perf ? def_perf : def_test, sizeof grid);
    }
    o->B = shape[0], o->H = shape[1], o->N = shape[2], o->D = shape[3];
    o->T = draft ? grid[0] : 0, o->GH = grid[1], o->GW = grid[2], o->P = grid[3];
    if (!o->kernels) {
        const char *e = getenv(draft ? "QVA_DRAFT_KERNEL" : "QVA_ATTN_KERNEL");
        o->kernels = e && *e ? e : draft ? "lib,dw10,dw11,dw16,serial-prep" : "lib,ws5";
    }
    return 1;
}

int main(int argc, char **argv) {
    opts o;
    if (!parse(argc, argv, &o)) return usage();
    if (!qva_cuda_available()) {
        fprintf(stderr, "dev_attn: no CUDA device\n");
        return 2;
    }
    io x;
    if (!io_make(&o, &x)) {
        fprintf(stderr, "dev_attn: allocation failed: %s\n", qva_last_error());
        return 1;
    }
    const int draft = !strncmp(o.method, "draft", 5);
    double atol, rtol, rel;
    tolerance(o.method, &atol, &rtol, &rel);
    float *lib = malloc(x.n * sizeof(float)), *got = malloc(x.n * sizeof(float));
    float *ref = o.perf ? NULL : malloc(x.n * sizeof(float));
    int fails = 0;
    double lib_ms = 0;
    const double flops = 4.0 * o.B * o.H * (double)o.N * o.N * o.D;
    printf("method %s, shape (%d,%d,%d,%d)", o.method, o.B, o.H, o.N, o.D);
    if (o.num_steps > 0) printf(", step %d of %d", o.step, o.num_steps);
    if (draft) printf(", grid %dx%dx%d + %d", o.T, o.GH, o.GW, o.P);
    printf(", %s\n", o.perf ? "perf (full calls, median)" : "test (vs CPU reference)");
    if (run_gpu(&o, find_version("lib"), &x, lib, o.perf ? &lib_ms : NULL) != QVA_OK) {
        fprintf(stderr, "lib: %s\n", qva_last_error());
        return 1;
    }
    if (ref && run_cpu(&o, &x, ref) != QVA_OK) {
        fprintf(stderr, "cpu reference: %s\n", qva_last_error());
        return 1;
    }
    char list[256];
    snprintf(list, sizeof list, "%s", o.kernels);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        const version *v = find_version(name);
        if (!v || (v->draft >= 0 && v->draft != draft)) {
            printf("%-12s skipped: not a version of this method's path\n", name);
            continue;
        }
        double ms = 0;
        if (run_gpu(&o, v, &x, got, o.perf ? &ms : NULL) != QVA_OK) {
            printf("%-12s FAIL: %s\n", name, qva_last_error());
            ++fails;
            continue;
        }
        const errs vl = compare(got, lib, x.n, atol, rtol);
        if (o.perf) {
            if (strcmp(name, "lib")) { /* interleave: the library again after each version */
                double again = 0;
                if (run_gpu(&o, find_version("lib"), &x, lib, &again) == QVA_OK && again < lib_ms)
                    lib_ms = again;
            }
            const int ok = vl.nonfinite == 0 && vl.rel_l2 <= rel;
            printf("%-12s %9.2f ms  %7.1f TOPS  %5.3fx lib  rel-L2 vs lib %.2e  %s\n", name, ms,
                   flops / (ms * 1e9), lib_ms / ms, vl.rel_l2, ok ? "ok" : "FAIL");
            fails += !ok;
        } else {
            const errs vr = compare(got, ref, x.n, atol, rtol);
            const int ok = vr.nonfinite == 0 && vr.bad == 0 && vr.rel_l2 <= rel;
            printf("%-12s rel-L2 vs CPU %.2e (limit %.0e), %zu outside atol+rtol, %zu NaN/unwritten; "
                   "vs lib: %s (%zu differ)  %s\n",
                   name, vr.rel_l2, rel, vr.bad, vr.nonfinite, vl.differ ? "differs" : "bit-identical",
                   vl.differ, ok ? "ok" : "FAIL");
            fails += !ok;
        }
    }
    free(lib), free(got), free(ref);
    io_free(&x);
    return fails ? 1 : 0;
}
