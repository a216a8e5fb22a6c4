/*
 * qvattn — command-line front end of the library.
 *
 *   qvattn eval           accuracy of each method against exact attention
 *   qvattn bench          timing of qva_attention
 *   qvattn info           build, backends and per-method capabilities
 *   qvattn sweep-vsmooth  V-Smooth clusters x iterations, measured
 *
 * It uses only the public header (qvattn.h) plus tools/io.h.  Exit codes:
 * 0 success, 1 runtime error (bad file, library failure), 2 usage error
 * (unknown flag, method or preset, inconsistent arguments).  docs/CLI.md
 * documents every flag and the JSON schemas.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, strdup */

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io.h"
#include "qvattn.h"

enum { RC_OK = 0, RC_RUNTIME = 1, RC_USAGE = 2, RC_HELP = 3 };

#define DEFAULT_METHODS                                                      \
    "exact,bf16,fp8,sage8,vc8,vc8+expcast,sage8+hadamard,draft@85/0/0/15,"  \
    "draft@85/0/7.5/7.5"
#define MAX_METHODS 64
#define MAX_LIST 32
#define TV_ROWS 256          /* rows of head 0 for the ExpCast TV         */
#define PROGRESS_AFTER_MS 1000.0

/* ------------------------------------------------------------ messages */
static const char *g_cmd = "qvattn"; /* subcommand, for "try --help" */

static int usage_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static int runtime_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

static int usage_error(const char *fmt, ...) {
    va_list ap;
    fputs("qvattn: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help'.\n", g_cmd);
    return RC_USAGE;
}

static int runtime_error(const char *fmt, ...) {
    va_list ap;
    fputs("qvattn: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return RC_RUNTIME;
}

/* A library failure: what we were doing, the status name and message. */
static int lib_error(qva_status st, const char *what) {
    return runtime_error("%s: %s: %s", what, qva_status_string(st),
                         qva_last_error());
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ------------------------------------------------------------ help */
static const char USAGE_MAIN[] =
    "usage: qvattn <command> [options]\n"
    "\n"
    "commands:\n"
    "  eval           accuracy of each method against exact attention\n"
    "  bench          time qva_attention (median of --iters runs)\n"
    "  info           version, build, backends, method capabilities\n"
    "  sweep-vsmooth  V-Smooth k-means clusters x iterations sweep\n"
    "\n"
    "'qvattn <command> --help' describes each command's options.\n";

static const char USAGE_EVAL[] =
    "usage: qvattn eval [--input PATH | --synthetic NAME] [options]\n"
    "\n"
    "Runs each method on the same q, k, v and compares it with exact (FP64)\n"
    "attention, which is always computed on the CPU as the reference.\n"
    "\n"
    "input (default: --synthetic wan-small):\n"
    "  --input PATH         safetensors file with q, k, v; a directory with\n"
    "                       q.npy, k.npy, v.npy; or Q.npy,K.npy,V.npy\n"
    "  --synthetic NAME     a synthetic preset (grid and prefix come with it)\n"
    "  --seed S             seed of the synthetic preset\n"
    "  --grid T,H,W         latent video grid (needed by draft@ for files)\n"
    "  --prefix P           prefix (text) tokens outside the grid (default 0)\n"
    "  --prefix-at-end      the prefix follows the video tokens\n"
    "methods:\n"
    "  --methods a,b,c      default: " DEFAULT_METHODS "\n"
    "  --layer L            layer id (keys the per-layer state)\n"
    "  --step I             denoising step (default 0)\n"
    "  --steps N            steps in the schedule (default 0 = unknown)\n"
    "subset:\n"
    "  --heads H            evaluate only the first H heads\n"
    "  --query-sample R     evaluate R evenly spaced query rows (methods that\n"
    "                       need every row, draft@ and vc*, are skipped)\n"
    "output:\n"
    "  --device cpu|cuda|auto  where methods run (default auto: cuda when\n"
    "                       available and supported, else cpu)\n"
    "  --json               one JSON object on stdout (docs/CLI.md)\n";

static const char USAGE_BENCH[] =
    "usage: qvattn bench [--synthetic NAME | --shape B,H,N,D | --input PATH]\n"
    "                    [options]\n"
    "\n"
    "Times qva_attention: one warm-up call, then --iters timed calls; reports\n"
    "the median and minimum in ms and TOPS = 4*B*H*Nq*N*D / t (dense\n"
    "equivalent, also for sparse methods).\n"
    "\n"
    "  --synthetic NAME     preset (default wan-small)\n"
    "  --shape B,H,N,D      random normal q, k, v of this shape\n"
    "  --input PATH         as for eval\n"
    "  --seed S             seed of the synthetic or random data\n"
    "  --grid T,H,W --prefix P --prefix-at-end   video layout (draft@)\n"
    "  --methods a,b,c      default: " DEFAULT_METHODS "\n"
    "  --iters N            timed calls per method (default 3)\n"
    "  --heads H            only the first H heads\n"
    "  --layer L --step I --steps N   schedule position\n"
    "  --device cpu|cuda|auto\n"
    "  --json               one JSON object on stdout\n"
    "\n"
    "CPU timings are those of a reference implementation, not product speed.\n";

static const char USAGE_INFO[] =
    "usage: qvattn info [--json]\n"
    "\n"
    "Prints the version, the build, the backends and, for each method, whether\n"
    "cpu and cuda can run it at D=64 and D=128 with bf16 inputs.\n";

static const char USAGE_SWEEP[] =
    "usage: qvattn sweep-vsmooth [--synthetic NAME | --input PATH] [options]\n"
    "\n"
    "For each (clusters, iterations) pair, over the heads of the input: the\n"
    "mean value-quantization relative MSE and block-mean energy share under\n"
    "the k-means order, and the mean k-means time per head; plus the\n"
    "sequence-order baseline.  This is how V-Smooth's defaults are chosen.\n"
    "\n"
    "  --synthetic NAME     preset (default wan-small)\n"
    "  --input PATH         as for eval\n"
    "  --seed S             seed of the synthetic preset\n"
    "  --clusters LIST      default 4,8,16,32,64\n"
    "  --iters LIST         default 1,2,4,8\n"
    "  --heads H            only the first H heads (of each batch)\n"
    "  --json               one JSON object on stdout\n";

/* ------------------------------------------------------------ options */
typedef struct opts {
    const char *input, *synthetic, *methods, *grid, *shape, *device;
    const char *seed, *clusters, *iters_list;
    int prefix, prefix_at_end, layer, step, steps, heads, query_sample;
    int iters, json;
} opts;

#define UNSET INT_MIN

typedef enum opt_kind { OPT_FLAG, OPT_STR, OPT_INT } opt_kind;
typedef struct opt_spec {
    const char *name;
    opt_kind kind;
    size_t off;
} opt_spec;

#define OS(n, k, f) {n, k, offsetof(opts, f)}
#define OPTS_INPUT                                                            \
    OS("input", OPT_STR, input), OS("synthetic", OPT_STR, synthetic),         \
        OS("seed", OPT_STR, seed), OS("json", OPT_FLAG, json)
#define OPTS_LAYOUT                                                           \
    OS("grid", OPT_STR, grid), OS("prefix", OPT_INT, prefix),                 \
        OS("prefix-at-end", OPT_FLAG, prefix_at_end),                         \
        OS("methods", OPT_STR, methods), OS("layer", OPT_INT, layer),         \
        OS("step", OPT_INT, step), OS("steps", OPT_INT, steps),               \
        OS("heads", OPT_INT, heads), OS("device", OPT_STR, device)

static const opt_spec EVAL_OPTS[] = {
    OPTS_INPUT, OPTS_LAYOUT, OS("query-sample", OPT_INT, query_sample),
    {NULL, OPT_FLAG, 0}};
static const opt_spec BENCH_OPTS[] = {
    OPTS_INPUT, OPTS_LAYOUT, OS("shape", OPT_STR, shape),
    OS("iters", OPT_INT, iters), {NULL, OPT_FLAG, 0}};
static const opt_spec INFO_OPTS[] = {OS("json", OPT_FLAG, json),
                                     {NULL, OPT_FLAG, 0}};
static const opt_spec SWEEP_OPTS[] = {
    OPTS_INPUT, OS("clusters", OPT_STR, clusters),
    OS("iters", OPT_STR, iters_list), OS("heads", OPT_INT, heads),
    {NULL, OPT_FLAG, 0}};

static void opts_init(opts *o) {
    memset(o, 0, sizeof *o);
    o->prefix = o->layer = o->step = o->steps = UNSET;
    o->heads = o->query_sample = o->iters = UNSET;
}

/* Strict decimal int: the whole string, within int range. */
static int parse_int(const char *s, int *v) {
    char *end;
    long x;
    if (!s || !*s) return 0;
    x = strtol(s, &end, 10);
    if (*end || x < INT_MIN + 1 || x > INT_MAX) return 0;
    *v = (int)x;
    return 1;
}

static const opt_spec *find_opt(const opt_spec *specs, const char *name,
                                size_t len) {
    for (const opt_spec *s = specs; s->name; ++s)
        if (strlen(s->name) == len && !strncmp(s->name, name, len)) return s;
    return NULL;
}

static int set_opt(opts *o, const opt_spec *s, const char *val) {
    char *base = (char *)o + s->off;
    if (s->kind == OPT_STR) {
        memcpy(base, &val, sizeof val);
        return RC_OK;
    }
    int v;
    if (!parse_int(val, &v))
        return usage_error("--%s expects an integer, got '%s'", s->name, val);
    memcpy(base, &v, sizeof v);
    return RC_OK;
}

/* One argument at argv[*i] ("--name", "--name=value" or "--name value"). */
static int parse_one(int argc, char **argv, int *i, const opt_spec *specs,
                     opts *o) {
    const char *a = argv[*i];
    if (strncmp(a, "--", 2) != 0) return usage_error("unexpected argument '%s'", a);
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const opt_spec *s = find_opt(specs, name, len);
    if (!s) return usage_error("unknown option '%.*s' for '%s'", (int)len + 2, a, g_cmd);
    if (s->kind == OPT_FLAG) {
        if (eq) return usage_error("--%s takes no value", s->name);
        int one = 1;
        memcpy((char *)o + s->off, &one, sizeof one);
        return RC_OK;
    }
    const char *val = eq ? eq + 1 : NULL;
    if (!val) {
        if (*i + 1 >= argc) return usage_error("--%s needs a value", s->name);
        val = argv[++*i];
    }
    return set_opt(o, s, val);
}

/* Parses argv[2..]; RC_HELP after printing `help` for --help. */
static int parse_opts(int argc, char **argv, const opt_spec *specs,
                      const char *help, opts *o) {
    opts_init(o);
    for (int i = 2; i < argc; ++i) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RC_HELP;
        }
        int rc = parse_one(argc, argv, &i, specs, o);
        if (rc) return rc;
    }
    return RC_OK;
}

/* "a,b,c" of ints >= lo into v; count <= max. */
static int parse_int_list(const char *s, const char *what, int lo, int *v,
                          int max, int *count) {
    char buf[256];
    if (strlen(s) >= sizeof buf) return usage_error("--%s: list too long", what);
    strcpy(buf, s);
    *count = 0;
    for (char *tok = buf, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        int x;
        if (!parse_int(tok, &x) || x < lo)
            return usage_error("--%s: '%s' is not an integer >= %d", what, tok, lo);
        if (*count >= max) return usage_error("--%s: more than %d entries", what, max);
        v[(*count)++] = x;
    }
    return RC_OK;
}

static int opt_or(int v, int dflt) { return v == UNSET ? dflt : v; }

/* ------------------------------------------------------------ workload */
typedef struct workload {
    qio_qkv x;          /* f32 [B,H,N,D] q, k, v (q has Nq rows) */
    char source[600];
    const char *format; /* "synthetic", "random", "safetensors", "npy" */
    int has_grid, grid[3], prefix, prefix_at_end;
} workload;

static void workload_free(workload *w) { qio_qkv_free(&w->x); }

static int alloc_qkv(qio_qkv *x, int64_t B, int64_t H, int64_t N, int64_t D) {
    size_t n = (size_t)(B * H * N * D);
    x->B = B;
    x->H = H;
    x->Nq = x->N = N;
    x->D = D;
    x->q = malloc(n * sizeof(float));
    x->k = malloc(n * sizeof(float));
    x->v = malloc(n * sizeof(float));
    if (x->q && x->k && x->v) return RC_OK;
    qio_qkv_free(x);
    return runtime_error("out of memory for q, k, v (%zu floats each)", n);
}

static int parse_seed(const opts *o, uint64_t *seed) {
    char *end;
    if (!o->seed) return RC_OK;
    unsigned long long s = strtoull(o->seed, &end, 0);
    if (!*o->seed || *end || o->seed[0] == '-')
        return usage_error("--seed expects a non-negative integer, got '%s'", o->seed);
    *seed = (uint64_t)s;
    return RC_OK;
}

static int load_synthetic(const opts *o, const char *name, workload *w) {
    qva_synthetic_spec spec;
    qva_status st = qva_synthetic_preset(name, &spec);
    if (st != QVA_OK) return usage_error("%s", qva_last_error());
    int rc = parse_seed(o, &spec.seed);
    if (rc) return rc;
    int64_t N = (int64_t)spec.prefix_tokens +
                (int64_t)spec.grid_t * spec.grid_h * spec.grid_w;
    if ((rc = alloc_qkv(&w->x, spec.B, spec.H, N, spec.D))) return rc;
    st = qva_synthetic_generate(&spec, w->x.q, w->x.k, w->x.v);
    if (st != QVA_OK) return lib_error(st, "generating the synthetic preset");
    snprintf(w->source, sizeof w->source, "synthetic:%s", spec.name);
    w->format = "synthetic";
    w->has_grid = 1;
    w->grid[0] = spec.grid_t;
    w->grid[1] = spec.grid_h;
    w->grid[2] = spec.grid_w;
    w->prefix = spec.prefix_tokens;
    return RC_OK;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Standard normal by Box-Muller: bench data needs no more than that. */
static void fill_normal(float *x, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((double)(splitmix(s) >> 11) + 1.0) * 0x1.0p-53;
        double u2 = (double)(splitmix(s) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1)), t = 6.283185307179586 * u2;
        x[i] = (float)(r * cos(t));
        if (i + 1 < n) x[i + 1] = (float)(r * sin(t));
    }
}

static int load_random(const opts *o, workload *w) {
    int v[4], count;
    uint64_t seed = 0;
    int rc = parse_int_list(o->shape, "shape", 1, v, 4, &count);
    if (rc) return rc;
    if (count != 4) return usage_error("--shape expects B,H,N,D");
    if (v[3] != 64 && v[3] != 128)
        return usage_error("--shape: head dim D=%d not supported: 64 or 128", v[3]);
    if ((double)v[0] * v[1] * v[2] * v[3] > 1e10)
        return usage_error("--shape %s is too large", o->shape);
    if ((rc = parse_seed(o, &seed)) || (rc = alloc_qkv(&w->x, v[0], v[1], v[2], v[3])))
        return rc;
    size_t n = (size_t)v[0] * v[1] * v[2] * v[3];
    fill_normal(w->x.q, n, &seed);
    fill_normal(w->x.k, n, &seed);
    fill_normal(w->x.v, n, &seed);
    snprintf(w->source, sizeof w->source, "random:%s", o->shape);
    w->format = "random";
    return RC_OK;
}

static int load_file(const char *path, workload *w) {
    qio_error err;
    if (qio_load_qkv(path, &w->x, &err) != QIO_OK)
        return runtime_error("cannot load input (%s): %s", qio_err_name(err.code),
                             err.msg);
    snprintf(w->source, sizeof w->source, "%s", path);
    w->format = w->x.format;
    return RC_OK;
}

/* Exactly one source; `dflt` preset when none is given. */
static int load_workload(const opts *o, const char *dflt, workload *w) {
    int given = !!o->input + !!o->synthetic + !!o->shape;
    memset(w, 0, sizeof *w);
    if (given > 1)
        return usage_error("give only one of --input, --synthetic, --shape");
    if (o->input) return load_file(o->input, w);
    if (o->shape) return load_random(o, w);
    return load_synthetic(o, o->synthetic ? o->synthetic : dflt, w);
}

/* --grid/--prefix override the preset's layout; T*H*W + P must equal N. */
static int resolve_grid(const opts *o, workload *w) {
    int g[3], count;
    w->prefix_at_end = o->prefix_at_end;
    if (!o->grid) {
        if (o->prefix != UNSET && !w->has_grid)
            return usage_error("--prefix needs --grid T,H,W");
        if (o->prefix != UNSET) w->prefix = o->prefix;
    } else {
        int rc = parse_int_list(o->grid, "grid", 1, g, 3, &count);
        if (rc) return rc;
        if (count != 3) return usage_error("--grid expects T,H,W");
        memcpy(w->grid, g, sizeof g);
        w->prefix = opt_or(o->prefix, 0);
        w->has_grid = 1;
    }
    if (!w->has_grid) return RC_OK;
    if (w->prefix < 0) return usage_error("--prefix must be >= 0");
    int64_t thw = (int64_t)w->grid[0] * w->grid[1] * w->grid[2];
    if (thw + w->prefix != w->x.N)
        return usage_error(
            "grid %dx%dx%d + prefix %d: T*H*W+P = %lld tokens, but the input "
            "has N=%lld%s",
            w->grid[0], w->grid[1], w->grid[2], w->prefix,
            (long long)(thw + w->prefix), (long long)w->x.N,
            thw < w->x.N && o->prefix == UNSET ? " (missing --prefix?)" : "");
    return RC_OK;
}

/* ------------------------------------------------------------ views */
/* The evaluated part of the input, as f32 CPU views: no copies. */
typedef struct views {
    qva_tensor q, k, v;
    int64_t B, H, R, N, D; /* R = query rows evaluated */
    size_t out_elems;
} views;

static int make_views(const opts *o, const workload *w, int allow_rows,
                      views *vw) {
    const qio_qkv *x = &w->x;
    int64_t H = x->H, R = x->Nq;
    if (o->heads != UNSET) {
        if (o->heads < 1 || o->heads > x->H)
            return usage_error("--heads %d: the input has H=%lld heads", o->heads,
                               (long long)x->H);
        H = o->heads;
    }
    if (allow_rows && o->query_sample != UNSET) {
        if (o->query_sample < 1 || o->query_sample > x->Nq)
            return usage_error("--query-sample %d: the input has %lld query rows",
                               o->query_sample, (long long)x->Nq);
        R = o->query_sample;
    }
    vw->q = qva_tensor_hnd(x->q, QVA_F32, QVA_DEVICE_CPU, x->B, x->H, x->Nq, x->D);
    vw->k = qva_tensor_hnd(x->k, QVA_F32, QVA_DEVICE_CPU, x->B, x->H, x->N, x->D);
    vw->v = qva_tensor_hnd(x->v, QVA_F32, QVA_DEVICE_CPU, x->B, x->H, x->N, x->D);
    vw->q.shape[1] = vw->k.shape[1] = vw->v.shape[1] = H;
    vw->q.shape[2] = R;
    vw->q.stride[2] *= x->Nq / R; /* evenly spaced rows: 0, s, 2s, ... */
    vw->B = x->B;
    vw->H = H;
    vw->R = R;
    vw->N = x->N;
    vw->D = x->D;
    vw->out_elems = (size_t)(vw->B * H * R * vw->D);
    return RC_OK;
}

/* ------------------------------------------------------------ devices */
typedef enum dev_mode { DEV_CPU, DEV_CUDA, DEV_AUTO } dev_mode;

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

/* Device copies of q, k, v and the output, made on first use. */
typedef struct gpu_state {
    void *q, *k, *v, *out;
    int ready;
} gpu_state;

static void gpu_free(gpu_state *g) {
    void *p[4] = {g->q, g->k, g->v, g->out};
    for (int i = 0; i < 4; ++i)
        if (p[i]) qva_device_free(p[i]);
    memset(g, 0, sizeof *g);
}

static qva_status gpu_upload(gpu_state *g, const workload *w, size_t out_elems) {
    const qio_qkv *x = &w->x;
    size_t nq = (size_t)(x->B * x->H * x->Nq * x->D) * sizeof(float);
    size_t nk = (size_t)(x->B * x->H * x->N * x->D) * sizeof(float);
    qva_status st;
    if ((st = qva_device_malloc(&g->q, nq)) || (st = qva_device_malloc(&g->k, nk)) ||
        (st = qva_device_malloc(&g->v, nk)) ||
        (st = qva_device_malloc(&g->out, out_elems * sizeof(float))) ||
        (st = qva_memcpy_to_device(g->q, x->q, nq)) ||
        (st = qva_memcpy_to_device(g->k, x->k, nk)) ||
        (st = qva_memcpy_to_device(g->v, x->v, nk)))
        return st;
    g->ready = 1;
    return QVA_OK;
}

/* CUDA when asked for (or auto), available and able to run cfg at f32;
 * else the CPU, with a note saying why when cuda was wanted. */
static qva_device pick_device(dev_mode m, const qva_config *cfg, int64_t D,
                              char *note, size_t len) {
    char why[200] = "";
    if (m == DEV_CPU || !qva_cuda_available()) return QVA_DEVICE_CPU;
    if (qva_supports(QVA_DEVICE_CUDA, cfg, QVA_F32, D, why, sizeof why))
        return QVA_DEVICE_CUDA;
    snprintf(note, len, "cuda cannot run it (%s); ran on cpu", why);
    return QVA_DEVICE_CPU;
}

/* ------------------------------------------------------------ methods */
typedef struct method_run {
    char name[64];
    qva_config cfg;
    char skip[300]; /* non-empty: not run, and why */
    char note[300]; /* e.g. a cuda fallback */
    qva_device dev;
    double ms, ms_min;
    qva_error_metrics m;
} method_run;

typedef struct method_list {
    method_run v[MAX_METHODS];
    int n;
} method_list;

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

/* ------------------------------------------------------------ running */
/* The call environment shared by all methods of a run. */
typedef struct runner {
    const workload *w;
    const views *vw;
    dev_mode mode;
    gpu_state gpu;
} runner;

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

/* Runs mr `iters` times (after `warmup` untimed calls) on a fresh context,
 * so no method inherits another's per-layer state. */
static int run_method(runner *r, method_run *mr, int warmup, int iters,
                      float *out) {
    qva_context_t *ctx = NULL;
    double *t = calloc((size_t)iters, sizeof *t);
    mr->dev = pick_device(r->mode, &mr->cfg, r->vw->D, mr->note, sizeof mr->note);
    qva_status st = t ? QVA_OK : QVA_ERR_OUT_OF_MEMORY;
    if (st == QVA_OK && mr->dev == QVA_DEVICE_CUDA && !r->gpu.ready)
        st = gpu_upload(&r->gpu, r->w, r->vw->out_elems);
    if (st == QVA_OK) st = qva_context_create(&ctx, mr->dev);
    for (int i = 0; st == QVA_OK && i < warmup + iters; ++i) {
        double ms;
        st = call_once(r, ctx, &mr->cfg, mr->dev, out, &ms);
        if (i >= warmup) t[i - warmup] = ms;
    }
    qva_context_free(ctx);
    int rc = st == QVA_OK ? RC_OK : skip_or_fail(r, mr, st);
    if (st == QVA_OK) {
        for (int i = 1; i < iters; ++i) /* insertion sort: iters is small */
            for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
                double x = t[j];
                t[j] = t[j - 1];
                t[j - 1] = x;
            }
        mr->ms = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
        mr->ms_min = t[0];
    }
    free(t);
    return rc;
}

static const char *dev_name(qva_device d) {
    return d == QVA_DEVICE_CUDA ? "cuda" : "cpu";
}

/* ------------------------------------------------------------ JSON out */
static void js_str(const char *s) {
    putchar('"');
    for (; *s; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* JSON has no Inf/NaN: they are written as null (docs/CLI.md). */
static void js_num(double x) {
    if (isfinite(x)) printf("%.9g", x);
    else fputs("null", stdout);
}

static void js_key(const char *k) {
    js_str(k);
    putchar(':');
}

static void js_input(const workload *w, const views *vw) {
    js_key("input");
    printf("{");
    js_key("source");
    js_str(w->source);
    printf(",");
    js_key("format");
    js_str(w->format);
    printf(",\"B\":%lld,\"H\":%lld,\"heads_total\":%lld,\"N\":%lld,\"Nq\":%lld,"
           "\"query_rows\":%lld,\"D\":%lld,",
           (long long)vw->B, (long long)vw->H, (long long)w->x.H, (long long)vw->N,
           (long long)w->x.Nq, (long long)vw->R, (long long)vw->D);
    js_key("grid");
    if (w->has_grid) printf("[%d,%d,%d]", w->grid[0], w->grid[1], w->grid[2]);
    else fputs("null", stdout);
    printf(",\"prefix\":%d,\"prefix_at_end\":%s}", w->prefix,
           w->prefix_at_end ? "true" : "false");
}

/* ------------------------------------------------------------ eval */
/* V-quantization statistics of head 0 under three token orders. */
typedef struct vq_report {
    int block, clusters, iters;
    const char *order[3];
    int ok[3];
    qva_vquant_stats st[3];
    char err[3][200];
    int tv_ok, tv_rows;
    double tv_mean, tv_max;
    char tv_err[200];
} vq_report;

static void vq_fail(vq_report *r, int i, qva_status st) {
    snprintf(r->err[i], sizeof r->err[i], "%s: %s", qva_status_string(st),
             qva_last_error());
}

static void vq_one(vq_report *r, int i, const float *v, int n, int d,
                   const int32_t *perm) {
    qva_status st = qva_vquant_stats_compute(v, n, d, perm, r->block, &r->st[i]);
    if (st == QVA_OK) r->ok[i] = 1;
    else vq_fail(r, i, st);
}

static void vq_compute(const workload *w, vq_report *r) {
    qva_config cfg;
    int n = (int)w->x.N, d = (int)w->x.D;
    const float *v = w->x.v; /* (b=0, h=0) is the first n*d floats */
    qva_config_default(&cfg);
    r->block = cfg.vsmooth.block;
    r->clusters = cfg.vsmooth.clusters;
    r->iters = cfg.vsmooth.iters;
    r->order[0] = "sequence";
    r->order[1] = "kmeans";
    r->order[2] = "hadamard";
    vq_one(r, 0, v, n, d, NULL);
    int32_t *perm = malloc((size_t)n * sizeof *perm);
    float *rot = malloc((size_t)n * d * sizeof *rot);
    qva_status st = perm && rot ? QVA_OK : QVA_ERR_OUT_OF_MEMORY;
    if (st == QVA_OK) st = qva_vsmooth_permutation(v, n, d, r->clusters, r->iters, perm);
    if (st == QVA_OK) vq_one(r, 1, v, n, d, perm);
    else vq_fail(r, 1, st);
    st = rot ? QVA_OK : QVA_ERR_OUT_OF_MEMORY;
    if (rot) memcpy(rot, v, (size_t)n * d * sizeof *rot);
    for (int i = 0; st == QVA_OK && i < n; ++i) st = qva_hadamard(rot + (size_t)i * d, d, NULL);
    if (st == QVA_OK) vq_one(r, 2, rot, n, d, NULL);
    else vq_fail(r, 2, st);
    free(perm);
    free(rot);
}

static void tv_compute(const workload *w, vq_report *r) {
    int n = (int)w->x.N, d = (int)w->x.D;
    int rows = (int)(w->x.Nq < n ? w->x.Nq : n);
    r->tv_rows = rows < TV_ROWS ? rows : TV_ROWS;
    qva_status st = qva_expcast_tv(w->x.q, w->x.k, n, d, (float)(1.0 / sqrt(d)),
                                   r->tv_rows, &r->tv_mean, &r->tv_max);
    if (st == QVA_OK) r->tv_ok = 1;
    else snprintf(r->tv_err, sizeof r->tv_err, "%s: %s", qva_status_string(st),
                  qva_last_error());
}

static void warn_aux(const vq_report *r) {
    for (int i = 0; i < 3; ++i)
        if (!r->ok[i])
            fprintf(stderr, "qvattn: warning: V stats (%s order): %s\n", r->order[i],
                    r->err[i]);
    if (!r->tv_ok) fprintf(stderr, "qvattn: warning: ExpCast TV: %s\n", r->tv_err);
}

static void print_input(const workload *w, const views *vw) {
    printf("input: %s (%s)  B=%lld H=%lld", w->source, w->format,
           (long long)vw->B, (long long)vw->H);
    if (vw->H != w->x.H) printf(" of %lld", (long long)w->x.H);
    printf(" N=%lld", (long long)vw->N);
    if (vw->R != w->x.Nq || w->x.Nq != vw->N)
        printf(" query rows=%lld of %lld", (long long)vw->R, (long long)w->x.Nq);
    printf(" D=%lld", (long long)vw->D);
    if (w->has_grid)
        printf("  grid %dx%dx%d prefix %d%s", w->grid[0], w->grid[1], w->grid[2],
               w->prefix, w->prefix_at_end ? " (at end)" : "");
    printf("\n\n");
}

static void print_eval_table(const method_list *ml) {
    printf("%-22s %-6s %11s %11s %11s %9s %10s\n", "method", "device", "rel-L2",
           "cos", "max-abs", "PSNR dB", "ms");
    for (int i = 0; i < ml->n; ++i) {
        const method_run *m = &ml->v[i];
        if (m->skip[0]) {
            printf("%-22s %-6s skipped: %s\n", m->name, "-", m->skip);
            continue;
        }
        printf("%-22s %-6s %11.4e %11.8f %11.4e %9.2f %10.1f\n", m->name,
               dev_name(m->dev), m->m.rel_l2, m->m.cos_sim, m->m.max_abs,
               m->m.psnr_db, m->ms);
    }
    for (int i = 0; i < ml->n; ++i)
        if (ml->v[i].note[0]) printf("note: %s: %s\n", ml->v[i].name, ml->v[i].note);
}

static void print_aux(const vq_report *r) {
    printf("\nV quantization, head 0 (E4M3 per channel, block %d; k-means k=%d, "
           "%d iters):\n",
           r->block, r->clusters, r->iters);
    printf("  %-10s %12s %15s %13s\n", "order", "rel-MSE", "rel-MSE plain",
           "energy share");
    for (int i = 0; i < 3; ++i) {
        if (!r->ok[i]) {
            printf("  %-10s unavailable: %s\n", r->order[i], r->err[i]);
            continue;
        }
        printf("  %-10s %12.4e %15.4e %13.4f\n", r->order[i], r->st[i].rel_mse,
               r->st[i].rel_mse_plain, r->st[i].energy_share);
    }
    if (r->tv_ok)
        printf("ExpCast TV, head 0, %d rows: mean %.4e, max %.4e\n", r->tv_rows,
               r->tv_mean, r->tv_max);
    else
        printf("ExpCast TV: unavailable: %s\n", r->tv_err);
}

static void js_method_eval(const method_run *m) {
    js_key(m->name);
    if (m->skip[0]) {
        printf("{");
        js_key("skipped");
        js_str(m->skip);
        printf("}");
        return;
    }
    char canon[96] = "";
    qva_config_method_name(&m->cfg, canon, sizeof canon);
    printf("{\"rel_l2\":");
    js_num(m->m.rel_l2);
    printf(",\"cos_sim\":");
    js_num(m->m.cos_sim);
    printf(",\"max_abs\":");
    js_num(m->m.max_abs);
    printf(",\"psnr\":");
    js_num(m->m.psnr_db);
    printf(",\"ms\":");
    js_num(m->ms);
    printf(",\"device\":\"%s\",\"canonical\":", dev_name(m->dev));
    js_str(canon);
    if (m->note[0]) {
        printf(",\"note\":");
        js_str(m->note);
    }
    printf("}");
}

static void js_vq(const vq_report *r) {
    printf("\"vquant\":{\"head\":0,\"block\":%d,\"clusters\":%d,\"iters\":%d",
           r->block, r->clusters, r->iters);
    for (int i = 0; i < 3; ++i) {
        printf(",");
        js_key(r->order[i]);
        if (!r->ok[i]) {
            printf("{\"error\":");
            js_str(r->err[i]);
            printf("}");
            continue;
        }
        printf("{\"rel_mse\":");
        js_num(r->st[i].rel_mse);
        printf(",\"rel_mse_plain\":");
        js_num(r->st[i].rel_mse_plain);
        printf(",\"energy_share\":");
        js_num(r->st[i].energy_share);
        printf("}");
    }
    printf("},\"expcast_tv\":{\"rows\":%d", r->tv_rows);
    if (r->tv_ok) {
        printf(",\"mean\":");
        js_num(r->tv_mean);
        printf(",\"max\":");
        js_num(r->tv_max);
    } else {
        printf(",\"mean\":null,\"max\":null,\"error\":");
        js_str(r->tv_err);
    }
    printf("}");
}

static void print_eval_json(const workload *w, const views *vw,
                            const method_list *ml, const vq_report *r) {
    printf("{\"methods\":{");
    for (int i = 0; i < ml->n; ++i) {
        if (i) printf(",");
        js_method_eval(&ml->v[i]);
    }
    printf("},");
    js_input(w, vw);
    printf(",");
    js_vq(r);
    printf("}\n");
}

static void progress(const method_run *m, int i, int n, double t_start) {
    if (now_ms() - t_start < PROGRESS_AFTER_MS) return;
    if (m->skip[0]) fprintf(stderr, "[%d/%d] %s: skipped\n", i, n, m->name);
    else fprintf(stderr, "[%d/%d] %s: %.1f ms on %s\n", i, n, m->name, m->ms,
                 dev_name(m->dev));
}

/* Computes the CPU exact reference, then every method against it. */
static int eval_methods(runner *r, method_list *ml, float *ref, float *out) {
    method_run exact;
    double t_start = now_ms();
    memset(&exact, 0, sizeof exact);
    strcpy(exact.name, "exact (reference)");
    qva_config_default(&exact.cfg);
    qva_config_set_method(&exact.cfg, "exact");
    dev_mode saved = r->mode;
    r->mode = DEV_CPU; /* the ground truth is always the FP64 CPU reference */
    int rc = run_method(r, &exact, 0, 1, ref);
    r->mode = saved;
    if (rc) return rc;
    if (exact.skip[0]) return runtime_error("exact reference: %s", exact.skip);
    progress(&exact, 0, ml->n, t_start);
    for (int i = 0; i < ml->n; ++i) {
        method_run *m = &ml->v[i];
        int reuse = m->cfg.method == QVA_METHOD_EXACT &&
                    pick_device(r->mode, &m->cfg, r->vw->D, m->note,
                                sizeof m->note) == QVA_DEVICE_CPU;
        if (reuse) { /* the same computation: do not pay for it twice */
            m->dev = QVA_DEVICE_CPU;
            m->ms = exact.ms;
            memcpy(out, ref, r->vw->out_elems * sizeof *out);
        } else if (!m->skip[0] && (rc = run_method(r, m, 0, 1, out))) {
            return rc;
        }
        if (!m->skip[0]) qva_compare(out, ref, r->vw->out_elems, &m->m);
        progress(m, i + 1, ml->n, t_start);
    }
    return RC_OK;
}

static int eval_report(const opts *o, const workload *w, const views *vw,
                       const method_list *ml) {
    vq_report r;
    memset(&r, 0, sizeof r);
    vq_compute(w, &r);
    tv_compute(w, &r);
    warn_aux(&r);
    if (o->json) {
        print_eval_json(w, vw, ml, &r);
        return RC_OK;
    }
    print_input(w, vw);
    print_eval_table(ml);
    print_aux(&r);
    return RC_OK;
}

static int cmd_eval(int argc, char **argv) {
    opts o;
    opts_init(&o);
    workload w;
    views vw;
    runner run;
    method_list *ml = calloc(1, sizeof *ml);
    float *ref = NULL, *out = NULL;
    memset(&w, 0, sizeof w);
    memset(&run, 0, sizeof run);
    int rc = ml ? parse_opts(argc, argv, EVAL_OPTS, USAGE_EVAL, &o)
                : runtime_error("out of memory");
    if (!rc) rc = parse_device(&o, &run.mode);
    if (!rc) rc = check_schedule(&o);
    if (!rc) rc = load_workload(&o, "wan-small", &w);
    if (!rc) rc = resolve_grid(&o, &w);
    if (!rc) rc = build_methods(&o, &w, ml);
    if (!rc) rc = make_views(&o, &w, 1, &vw);
    if (!rc) {
        ref = malloc(vw.out_elems * sizeof *ref);
        out = malloc(vw.out_elems * sizeof *out);
        if (!ref || !out) rc = runtime_error("out of memory for the outputs");
    }
    run.w = &w;
    run.vw = &vw;
    if (!rc) rc = eval_methods(&run, ml, ref, out);
    if (!rc) rc = eval_report(&o, &w, &vw, ml);
    gpu_free(&run.gpu);
    free(ref);
    free(out);
    free(ml);
    workload_free(&w);
    return rc == RC_HELP ? RC_OK : rc;
}

/* ------------------------------------------------------------ bench */
static double tops_of(const views *vw, double ms) {
    double flops = 4.0 * (double)vw->B * (double)vw->H * (double)vw->R *
                   (double)vw->N * (double)vw->D;
    return ms > 0.0 ? flops / (ms * 1e-3) / 1e12 : 0.0;
}

static int any_cpu(const method_list *ml) {
    for (int i = 0; i < ml->n; ++i)
        if (!ml->v[i].skip[0] && ml->v[i].dev == QVA_DEVICE_CPU) return 1;
    return 0;
}

static const char CPU_NOTE[] =
    "CPU timings are those of the reference implementation, not product speed";

static void print_bench_table(const workload *w, const views *vw,
                             const method_list *ml, int iters) {
    print_input(w, vw);
    printf("%-22s %-6s %11s %11s %9s   (%d iters after 1 warm-up)\n", "method",
           "device", "median ms", "min ms", "TOPS", iters);
    for (int i = 0; i < ml->n; ++i) {
        const method_run *m = &ml->v[i];
        if (m->skip[0]) printf("%-22s %-6s skipped: %s\n", m->name, "-", m->skip);
        else printf("%-22s %-6s %11.2f %11.2f %9.3g\n", m->name, dev_name(m->dev),
                    m->ms, m->ms_min, tops_of(vw, m->ms));
    }
    for (int i = 0; i < ml->n; ++i)
        if (ml->v[i].note[0]) printf("note: %s: %s\n", ml->v[i].name, ml->v[i].note);
    if (any_cpu(ml)) printf("note: %s.\n", CPU_NOTE);
}

static void print_bench_json(const workload *w, const views *vw,
                             const method_list *ml, int iters) {
    printf("{\"methods\":{");
    for (int i = 0; i < ml->n; ++i) {
        const method_run *m = &ml->v[i];
        if (i) printf(",");
        js_key(m->name);
        if (m->skip[0]) {
            printf("{\"skipped\":");
            js_str(m->skip);
            printf("}");
            continue;
        }
        printf("{\"ms\":");
        js_num(m->ms);
        printf(",\"ms_min\":");
        js_num(m->ms_min);
        printf(",\"tops\":");
        js_num(tops_of(vw, m->ms));
        printf(",\"device\":\"%s\"}", dev_name(m->dev));
    }
    printf("},");
    js_input(w, vw);
    printf(",\"iters\":%d,\"warmup\":1", iters);
    if (any_cpu(ml)) {
        printf(",\"note\":");
        js_str(CPU_NOTE);
    }
    printf("}\n");
}

static int bench_methods(runner *r, method_list *ml, int iters, float *out) {
    double t_start = now_ms();
    for (int i = 0; i < ml->n; ++i) {
        method_run *m = &ml->v[i];
        int rc = m->skip[0] ? RC_OK : run_method(r, m, 1, iters, out);
        if (rc) return rc;
        progress(m, i + 1, ml->n, t_start);
    }
    return RC_OK;
}

static int cmd_bench(int argc, char **argv) {
    opts o;
    opts_init(&o);
    workload w;
    views vw;
    runner run;
    method_list *ml = calloc(1, sizeof *ml);
    float *out = NULL;
    memset(&w, 0, sizeof w);
    memset(&run, 0, sizeof run);
    int rc = ml ? parse_opts(argc, argv, BENCH_OPTS, USAGE_BENCH, &o)
                : runtime_error("out of memory");
    int iters = rc ? 0 : opt_or(o.iters, 3);
    if (!rc && iters < 1) rc = usage_error("--iters must be >= 1");
    if (!rc) rc = parse_device(&o, &run.mode);
    if (!rc) rc = check_schedule(&o);
    if (!rc) rc = load_workload(&o, "wan-small", &w);
    if (!rc) rc = resolve_grid(&o, &w);
    if (!rc) rc = build_methods(&o, &w, ml);
    if (!rc) rc = make_views(&o, &w, 0, &vw);
    if (!rc && !(out = malloc(vw.out_elems * sizeof *out)))
        rc = runtime_error("out of memory for the output");
    run.w = &w;
    run.vw = &vw;
    if (!rc) rc = bench_methods(&run, ml, iters, out);
    if (!rc && o.json) print_bench_json(&w, &vw, ml, iters);
    else if (!rc) print_bench_table(&w, &vw, ml, iters);
    gpu_free(&run.gpu);
    free(out);
    free(ml);
    workload_free(&w);
    return rc == RC_HELP ? RC_OK : rc;
}

/* ------------------------------------------------------------ info */
static const char *const INFO_METHODS[] = {
    "exact", "bf16", "fp8", "fp8+expcast", "sage8", "sage8+expcast",
    "sage8+hadamard", "vc8", "vc8+expcast", "sage4", "vc4",
    "draft@85/0/0/15", "draft@85/0/7.5/7.5"};
#define N_INFO_METHODS (int)(sizeof INFO_METHODS / sizeof INFO_METHODS[0])

typedef struct cap {
    int ok;
    char why[200];
} cap;

/* cpu/cuda x D=64/128 at bf16 for one method name. */
static void capabilities(const char *name, cap c[2][2]) {
    qva_config cfg;
    qva_config_default(&cfg);
    int parsed = qva_config_set_method(&cfg, name) == QVA_OK;
    for (int dev = 0; dev < 2; ++dev)
        for (int j = 0; j < 2; ++j) {
            c[dev][j].why[0] = '\0';
            if (!parsed) {
                c[dev][j].ok = 0;
                snprintf(c[dev][j].why, sizeof c[dev][j].why, "%s", qva_last_error());
                continue;
            }
            c[dev][j].ok = qva_supports((qva_device)dev, &cfg, QVA_BF16, j ? 128 : 64,
                                        c[dev][j].why, sizeof c[dev][j].why);
        }
}

static void info_text(void) {
    printf("qvattn %d.%d.%d\n", QVA_VERSION_MAJOR, QVA_VERSION_MINOR,
           QVA_VERSION_PATCH);
    printf("build: %s\n", qva_build_info());
    printf("backends: cpu (reference, always); cuda: %s\n",
           qva_cuda_available() ? "available" : "not available");
    printf("\ncapabilities (bf16 inputs):\n");
    printf("  %-22s %-8s %-8s %-8s %-8s\n", "method", "cpu d64", "cpu d128",
           "cuda d64", "cuda d128");
    for (int i = 0; i < N_INFO_METHODS; ++i) {
        cap c[2][2];
        capabilities(INFO_METHODS[i], c);
        printf("  %-22s %-8s %-8s %-8s %-8s", INFO_METHODS[i],
               c[0][0].ok ? "yes" : "no", c[0][1].ok ? "yes" : "no",
               c[1][0].ok ? "yes" : "no", c[1][1].ok ? "yes" : "no");
        if (!c[1][1].ok && c[1][1].why[0]) printf("  cuda: %s", c[1][1].why);
        printf("\n");
    }
}

static void info_json(void) {
    printf("{\"version\":\"%d.%d.%d\",\"build\":", QVA_VERSION_MAJOR,
           QVA_VERSION_MINOR, QVA_VERSION_PATCH);
    js_str(qva_build_info());
    printf(",\"backends\":{\"cpu\":true,\"cuda\":%s},\"methods\":{",
           qva_cuda_available() ? "true" : "false");
    for (int i = 0; i < N_INFO_METHODS; ++i) {
        cap c[2][2];
        capabilities(INFO_METHODS[i], c);
        printf("%s", i ? "," : "");
        js_key(INFO_METHODS[i]);
        printf("{");
        for (int dev = 0; dev < 2; ++dev)
            for (int j = 0; j < 2; ++j) {
                printf("%s\"%s_d%d\":{\"ok\":%s,\"why\":", dev || j ? "," : "",
                       dev ? "cuda" : "cpu", j ? 128 : 64, c[dev][j].ok ? "true" : "false");
                js_str(c[dev][j].why);
                printf("}");
            }
        printf("}");
    }
    printf("}}\n");
}

static int cmd_info(int argc, char **argv) {
    opts o;
    opts_init(&o);
    int rc = parse_opts(argc, argv, INFO_OPTS, USAGE_INFO, &o);
    if (rc) return rc == RC_HELP ? RC_OK : rc;
    if (o.json) info_json();
    else info_text();
    return RC_OK;
}

/* ------------------------------------------------------------ sweep */
typedef struct sweep_row {
    int clusters, iters;
    double rel_mse, rel_mse_plain, energy_share, kmeans_ms;
} sweep_row;

typedef struct sweep {
    int ks[MAX_LIST], its[MAX_LIST], nk, ni;
    int block, heads; /* heads evaluated per batch entry */
    sweep_row base;   /* sequence order */
    sweep_row rows[MAX_LIST * MAX_LIST];
    int nrows;
    int32_t *perm;
} sweep;

static const float *head_v(const workload *w, int64_t b, int64_t h) {
    return w->x.v + (size_t)((b * w->x.H + h) * w->x.N * w->x.D);
}

/* Averages the stats of every evaluated head, in sequence order or (use_perm)
 * the k-means order of row->clusters, row->iters. */
static int sweep_point(const workload *w, sweep *s, sweep_row *row, int use_perm) {
    int n = (int)w->x.N, d = (int)w->x.D, count = 0;
    qva_status st;
    for (int64_t b = 0; b < w->x.B; ++b)
        for (int64_t h = 0; h < s->heads; ++h) {
            const float *v = head_v(w, b, h);
            qva_vquant_stats vs;
            double t0 = now_ms();
            if (use_perm &&
                (st = qva_vsmooth_permutation(v, n, d, row->clusters, row->iters, s->perm)))
                return lib_error(st, "k-means permutation");
            row->kmeans_ms += now_ms() - t0;
            if ((st = qva_vquant_stats_compute(v, n, d, use_perm ? s->perm : NULL,
                                               s->block, &vs)))
                return lib_error(st, "value-quantization statistics");
            row->rel_mse += vs.rel_mse;
            row->rel_mse_plain += vs.rel_mse_plain;
            row->energy_share += vs.energy_share;
            ++count;
        }
    row->rel_mse /= count;
    row->rel_mse_plain /= count;
    row->energy_share /= count;
    row->kmeans_ms /= count;
    return RC_OK;
}

static int sweep_run(const workload *w, sweep *s) {
    int rc = sweep_point(w, s, &s->base, 0);
    double t_start = now_ms();
    for (int i = 0; !rc && i < s->nk; ++i)
        for (int j = 0; !rc && j < s->ni; ++j) {
            sweep_row *row = &s->rows[s->nrows++];
            memset(row, 0, sizeof *row);
            row->clusters = s->ks[i];
            row->iters = s->its[j];
            rc = sweep_point(w, s, row, 1);
            if (!rc && now_ms() - t_start > PROGRESS_AFTER_MS)
                fprintf(stderr, "[%d/%d] k=%d iters=%d: rel-MSE %.4e\n", s->nrows,
                        s->nk * s->ni, row->clusters, row->iters, row->rel_mse);
        }
    return rc;
}

static void print_sweep_table(const workload *w, const sweep *s) {
    qva_config cfg;
    qva_config_default(&cfg);
    printf("input: %s (%s)  B=%lld heads=%d N=%lld D=%lld  block %d\n",
           w->source, w->format, (long long)w->x.B, s->heads, (long long)w->x.N,
           (long long)w->x.D, s->block);
    printf("library default: clusters=%d iters=%d\n\n", cfg.vsmooth.clusters,
           cfg.vsmooth.iters);
    printf("%8s %6s %12s %9s %15s %13s %11s\n", "clusters", "iters", "rel-MSE",
           "vs seq", "rel-MSE plain", "energy share", "k-means ms");
    printf("%8s %6s %12.4e %9s %15.4e %13.4f %11s\n", "sequence", "-",
           s->base.rel_mse, "1.000", s->base.rel_mse_plain, s->base.energy_share, "-");
    for (int i = 0; i < s->nrows; ++i) {
        const sweep_row *r = &s->rows[i];
        printf("%8d %6d %12.4e %9.3f %15.4e %13.4f %11.2f\n", r->clusters,
               r->iters, r->rel_mse, r->rel_mse / s->base.rel_mse, r->rel_mse_plain,
               r->energy_share, r->kmeans_ms);
    }
    printf("\nrel-MSE and energy share are means over heads; k-means ms is the "
           "mean time per head.\n");
}

static void js_sweep_row(const sweep_row *r) {
    printf("{\"rel_mse\":");
    js_num(r->rel_mse);
    printf(",\"rel_mse_plain\":");
    js_num(r->rel_mse_plain);
    printf(",\"energy_share\":");
    js_num(r->energy_share);
}

static void print_sweep_json(const workload *w, const sweep *s) {
    qva_config cfg;
    qva_config_default(&cfg);
    printf("{\"input\":{\"source\":");
    js_str(w->source);
    printf(",\"format\":");
    js_str(w->format);
    printf(",\"B\":%lld,\"heads\":%d,\"N\":%lld,\"D\":%lld},\"block\":%d,"
           "\"default\":{\"clusters\":%d,\"iters\":%d},\"sequence\":",
           (long long)w->x.B, s->heads, (long long)w->x.N, (long long)w->x.D,
           s->block, cfg.vsmooth.clusters, cfg.vsmooth.iters);
    js_sweep_row(&s->base);
    printf("},\"sweep\":[");
    for (int i = 0; i < s->nrows; ++i) {
        const sweep_row *r = &s->rows[i];
        printf("%s", i ? "," : "");
        js_sweep_row(r);
        printf(",\"clusters\":%d,\"iters\":%d,\"kmeans_ms\":", r->clusters, r->iters);
        js_num(r->kmeans_ms);
        printf("}");
    }
    printf("]}\n");
}

static int sweep_setup(const opts *o, const workload *w, sweep *s) {
    qva_config cfg;
    qva_config_default(&cfg);
    s->block = cfg.vsmooth.block;
    int rc = parse_int_list(o->clusters ? o->clusters : "4,8,16,32,64", "clusters",
                            1, s->ks, MAX_LIST, &s->nk);
    if (!rc) rc = parse_int_list(o->iters_list ? o->iters_list : "1,2,4,8", "iters",
                                 1, s->its, MAX_LIST, &s->ni);
    if (rc) return rc;
    for (int i = 0; i < s->nk; ++i)
        if (s->ks[i] > w->x.N)
            return usage_error("--clusters %d: more clusters than the N=%lld tokens",
                               s->ks[i], (long long)w->x.N);
    s->heads = (int)w->x.H;
    if (o->heads != UNSET && (o->heads < 1 || o->heads > w->x.H))
        return usage_error("--heads %d: the input has H=%lld heads", o->heads,
                           (long long)w->x.H);
    if (o->heads != UNSET) s->heads = o->heads;
    s->perm = malloc((size_t)w->x.N * sizeof *s->perm);
    return s->perm ? RC_OK : runtime_error("out of memory for the permutation");
}

static int cmd_sweep(int argc, char **argv) {
    opts o;
    opts_init(&o);
    workload w;
    sweep *s = calloc(1, sizeof *s);
    memset(&w, 0, sizeof w);
    int rc = s ? parse_opts(argc, argv, SWEEP_OPTS, USAGE_SWEEP, &o)
               : runtime_error("out of memory");
    if (!rc) rc = load_workload(&o, "wan-small", &w);
    if (!rc) rc = sweep_setup(&o, &w, s);
    if (!rc) rc = sweep_run(&w, s);
    if (!rc && o.json) print_sweep_json(&w, s);
    else if (!rc) print_sweep_table(&w, s);
    if (s) free(s->perm);
    free(s);
    workload_free(&w);
    return rc == RC_HELP ? RC_OK : rc;
}

/* ------------------------------------------------------------ main */
int main(int argc, char **argv) {
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"eval", cmd_eval},
                {"bench", cmd_bench},
                {"info", cmd_info},
                {"sweep-vsmooth", cmd_sweep}};
    if (argc < 2) {
        fputs(USAGE_MAIN, stderr);
        return RC_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        fputs(USAGE_MAIN, stdout);
        return RC_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("qvattn %d.%d.%d\n", QVA_VERSION_MAJOR, QVA_VERSION_MINOR,
               QVA_VERSION_PATCH);
        return RC_OK;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; ++i)
        if (!strcmp(argv[1], cmds[i].name)) {
            static char label[64];
            snprintf(label, sizeof label, "qvattn %s", cmds[i].name);
            g_cmd = label;
            return cmds[i].fn(argc, argv);
        }
    fprintf(stderr, "qvattn: unknown command '%s'\n\n%s", argv[1], USAGE_MAIN);
    return RC_USAGE;
}
