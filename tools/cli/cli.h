/*
 * What the qvattn CLI's commands share: exit codes, option parsing, input
 * loading, method runs and output helpers.  Each command lives in its own
 * file (eval.c, bench.c, info.c, sweep_vsmooth.c) and main.c dispatches.
 *
 * The CLI uses only the public header (qvattn.h) plus tools/io/io.h, so it
 * exercises the library exactly as a user would.
 */
#ifndef QVA_TOOLS_CLI_H
#define QVA_TOOLS_CLI_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "io/io.h"
#include "qvattn.h"

/* Exit codes; RC_HELP is internal (--help was printed) and exits 0. */
enum { RC_OK = 0, RC_RUNTIME = 1, RC_USAGE = 2, RC_HELP = 3 };

#define DEFAULT_METHODS                                                    \
    "exact,bf16,fp8,sage8,vc8+expcast-centred+pblock,vc8,vc8+expcast,"     \
    "vc8+expcast-centred,"                                                 \
    "vc8+nohadamard,vc8+nohadamard+expcast,sage8+nohadamard+fp32sum,"      \
    "vc8+i8pv,draft@85/0/0/15,draft@85/0/7.5/7.5"
#define MAX_METHODS 64
/* bench --iters: timed calls per method at most. */
#define MAX_BENCH_ITERS 100000
/* Progress lines go to stderr only once a run has taken this long, so
 * quick runs stay quiet. */
#define PROGRESS_AFTER_MS 1000.0

#if defined(__GNUC__)
#define CLI_PRINTF(fmt_arg, first_arg) \
    __attribute__((format(printf, fmt_arg, first_arg)))
#else
#define CLI_PRINTF(fmt_arg, first_arg)
#endif

/* ------------------------------------------------------------ commands */
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_sweep_vsmooth(int argc, char **argv);

/* ------------------------------------------------------------ messages */
/* Names the running command ("qvattn eval") in usage messages. */
void cli_set_command(const char *name);
/* Print "qvattn: ..." to stderr and return RC_USAGE / RC_RUNTIME. */
int usage_error(const char *fmt, ...) CLI_PRINTF(1, 2);
int runtime_error(const char *fmt, ...) CLI_PRINTF(1, 2);
/* A library failure: what we were doing, the status name and message. */
int lib_error(qva_status st, const char *what);
double now_ms(void);

/* ------------------------------------------------------------ options */
/* Every command's options in one struct; each command accepts the subset
 * its opt_spec table lists. */
typedef struct opts {
    const char *input, *synthetic, *methods, *grid, *shape, *device;
    const char *seed, *clusters, *iters_list, *draft_sweep, *dtype;
    int prefix, prefix_at_end, layer, step, steps, heads, query_sample;
    int iters, json, decompose, draft_report;
} opts;

/* An integer option that was not given. */
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
        OS("seed", OPT_STR, seed), OS("json", OPT_FLAG, json),                \
        OS("dtype", OPT_STR, dtype)
#define OPTS_LAYOUT                                                           \
    OS("grid", OPT_STR, grid), OS("prefix", OPT_INT, prefix),                 \
        OS("prefix-at-end", OPT_FLAG, prefix_at_end),                         \
        OS("methods", OPT_STR, methods), OS("layer", OPT_INT, layer),         \
        OS("step", OPT_INT, step), OS("steps", OPT_INT, steps),               \
        OS("heads", OPT_INT, heads), OS("device", OPT_STR, device)

void opts_init(opts *o);
/* Parses argv[2..]; RC_HELP after printing `help` for --help. */
int parse_opts(int argc, char **argv, const opt_spec *specs, const char *help,
               opts *o);
/* "a,b,c" of ints in [lo, hi] into v; count <= max. */
int parse_int_list(const char *s, const char *what, int lo, int hi, int *v,
                   int max, int *count);
int opt_or(int v, int dflt);

/* ------------------------------------------------------------ workload */
typedef struct workload {
    qio_qkv x;          /* f32 [B,H,N,D] q, k, v (q has Nq rows) */
    /* --dtype bf16|f16: x holds the rounded values (every consumer sees the
     * same inputs) and q16/k16/v16 their 16-bit codes, which the library
     * is given; f32: dtype QVA_F32 and no codes. */
    qva_dtype dtype;
    uint16_t *q16, *k16, *v16;
    char source[600];
    const char *format; /* "synthetic", "random", "safetensors", "npy" */
    int has_grid, grid[3], prefix, prefix_at_end;
} workload;

/* Exactly one source; `dflt` preset when none is given. */
int load_workload(const opts *o, const char *dflt, workload *w);
/* --grid/--prefix override the preset's layout; T*H*W + P must equal N. */
int resolve_grid(const opts *o, workload *w);
void workload_free(workload *w);

/* The evaluated part of the input, as f32 CPU views: no copies. */
typedef struct views {
    qva_tensor q, k, v;
    int64_t B, H, R, N, D; /* R = query rows evaluated */
    size_t out_elems;
} views;

/* --heads and (when allow_rows) --query-sample select the views. */
int make_views(const opts *o, const workload *w, int allow_rows, views *vw);

/* ------------------------------------------------------------ methods */
typedef enum dev_mode { DEV_CPU, DEV_CUDA, DEV_AUTO } dev_mode;

/* Device copies of q, k, v and the output, made on first use. */
typedef struct gpu_state {
    void *q, *k, *v, *out;
    int ready;
} gpu_state;

typedef struct method_run {
    char name[64];
    qva_config cfg;
    char skip[300]; /* non-empty: not run, and why */
    char note[300]; /* e.g. a cuda fallback */
    qva_device dev;
    double ms, ms_min;
    qva_error_metrics m;
    qva_error_direction dir; /* eval: the error along ref - mean(V); NaN if not computed */
    qva_draft_stats draft; /* kept share of the last call (draft on the CPU) */
} method_run;

typedef struct method_list {
    method_run v[MAX_METHODS];
    int n;
} method_list;

/* The call environment shared by all methods of a run. */
typedef struct runner {
    const workload *w;
    const views *vw;
    dev_mode mode;
    gpu_state gpu;
} runner;

/* What eval and bench hold while they run methods on one input. */
typedef struct method_session {
    workload w;
    views vw;
    runner run;
    method_list *ml; /* on the heap: MAX_METHODS runs are large */
} method_session;

/* Zeroes s and allocates its method list. */
int method_session_open(method_session *s);
/* Device, schedule, input, layout, methods and views, checked in this
 * order so both commands report the same first problem. */
int method_session_prepare(method_session *s, const opts *o, int allow_rows);
void method_session_close(method_session *s);

/* CUDA when asked for (or auto), available and able to run cfg on inputs
 * of dtype dt; else the CPU, with a note saying why when cuda was wanted. */
qva_device pick_device(dev_mode m, const qva_config *cfg, qva_dtype dt, int64_t D,
                       char *note, size_t len);
/* Runs mr `iters` times (after `warmup` untimed calls) on a fresh context,
 * so no method inherits another's per-layer state. */
int run_method(runner *r, method_run *mr, int warmup, int iters, float *out);
const char *dev_name(qva_device d);
/* The width of a table's method column: the longest name of ml, at least
 * METHOD_COL, so that every row's columns line up. */
#define METHOD_COL 22
int method_col(const method_list *ml);
/* "[i/n] name: ..." on stderr once the run is slow enough to want it. */
void progress(const method_run *m, int i, int n, double t_start);

/* ------------------------------------------------------------ decompose */
/* eval --decompose: one method's qva_error_terms_compute (decompose.c). */
typedef struct decomp_row {
    int ran;        /* t holds the terms                       */
    qva_error_terms t;
    qva_error_term_directions d; /* each term's error direction */
    char skip[300]; /* !ran: why (the library's reason)        */
} decomp_row;
/* rows[i] for ml->v[i], on the CPU views; RC_OK unless a call failed for
 * a reason other than "not decomposed here". */
int decompose_methods(const views *vw, const method_list *ml, decomp_row *rows);
/* The table of terms and one "dominant:" line per decomposed method. */
void print_decompose_table(const method_list *ml, const decomp_row *rows);
/* The "decompose" member of eval's JSON. */
void js_decompose(const method_list *ml, const decomp_row *rows);

/* ------------------------------------------------------------ draft report */
/* eval --draft-report / --draft-sweep (draft_report.c): the route-quality
 * report of each draft method and the skip-rate curve of the first. */
typedef struct draft_out draft_out;
/* *out = NULL without either option; parses --draft-sweep (usage errors
 * before any work). */
int draft_report_prepare(const opts *o, const method_list *ml, draft_out **out);
/* Runs the reports on the CPU views; RC_OK unless a call failed for a
 * reason other than "not on these views". */
int draft_report_run(const views *vw, const method_list *ml, draft_out *d);
/* The per-head tables, summary lines and the sweep's curve. */
void print_draft_out(const method_list *ml, const draft_out *d);
/* The "draft_report" and "draft_sweep" members of eval's JSON. */
void js_draft_out(const method_list *ml, const draft_out *d);
void draft_out_free(draft_out *d);

/* ------------------------------------------------------------ output */
void js_str(const char *s);
/* JSON has no Inf/NaN: they are written as null (docs/CLI.md). */
void js_num(double x);
void js_key(const char *k);
/* The "input" member of eval's and bench's JSON. */
void js_input(const workload *w, const views *vw);
/* The "input: ..." line above eval's and bench's tables. */
void print_input(const workload *w, const views *vw);

#endif /* QVA_TOOLS_CLI_H */
