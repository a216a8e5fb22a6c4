/*
 * qvattn bench: timing of qva_attention per method.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

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
    "  --dtype f32|bf16|f16 inputs as given to the library (default f32); bf16/f16\n"
    "                       round q, k, v to nearest even first, for every method\n"
    "  --grid T,H,W --prefix P --prefix-at-end   video layout (draft@)\n"
    "  --methods a,b,c      default: " DEFAULT_METHODS "\n"
    "  --iters N            timed calls per method (default 3, at most 100000)\n"
    "  --heads H            only the first H heads\n"
    "  --layer L --step I --steps N   schedule position\n"
    "  --device cpu|cuda|auto\n"
    "  --json               one JSON object on stdout\n"
    "\n"
    "CPU timings are those of a reference implementation, not product speed.\n";

static const opt_spec BENCH_OPTS[] = {
    OPTS_INPUT, OPTS_LAYOUT, OS("shape", OPT_STR, shape),
    OS("iters", OPT_INT, iters), {NULL, OPT_FLAG, 0}};

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
    const int mw = method_col(ml);
    printf("%-*s %-6s %11s %11s %9s   (%d iters after 1 warm-up)\n", mw, "method",
           "device", "median ms", "min ms", "TOPS", iters);
    for (int i = 0; i < ml->n; ++i) {
        const method_run *m = &ml->v[i];
        if (m->skip[0]) printf("%-*s %-6s skipped: %s\n", mw, m->name, "-", m->skip);
        else printf("%-*s %-6s %11.2f %11.2f %9.3g\n", mw, m->name, dev_name(m->dev),
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

int cmd_bench(int argc, char **argv) {
    opts o;
    method_session s;
    float *out = NULL;
    opts_init(&o);
    int rc = method_session_open(&s);
    if (!rc) rc = parse_opts(argc, argv, BENCH_OPTS, USAGE_BENCH, &o);
    int iters = rc ? 0 : opt_or(o.iters, 3);
    if (!rc && (iters < 1 || iters > MAX_BENCH_ITERS))
        rc = usage_error("--iters %d is outside [1, %d]", iters, MAX_BENCH_ITERS);
    if (!rc) rc = method_session_prepare(&s, &o, 0);
    if (!rc && !(out = malloc(s.vw.out_elems * sizeof *out)))
        rc = runtime_error("out of memory for the output");
    if (!rc) rc = bench_methods(&s.run, s.ml, iters, out);
    if (!rc && o.json) print_bench_json(&s.w, &s.vw, s.ml, iters);
    else if (!rc) print_bench_table(&s.w, &s.vw, s.ml, iters);
    free(out);
    method_session_close(&s);
    return rc == RC_HELP ? RC_OK : rc;
}
