/*
 * qvattn sweep-vsmooth: V-Smooth k-means clusters x iterations, measured
 * over the heads of the input; this is how V-Smooth's defaults are chosen.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_LIST 32 /* entries of --clusters and of --iters */

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
    "  --dtype f32|bf16|f16 round q, k, v to this dtype first (default f32)\n"
    "  --clusters LIST      default 4,8,16,32,64 (each in [1, 4096])\n"
    "  --iters LIST         default 1,2,4,8 (each in [1, 1000])\n"
    "  --heads H            only the first H heads (of each batch)\n"
    "  --json               one JSON object on stdout\n";

static const opt_spec SWEEP_OPTS[] = {
    OPTS_INPUT, OS("clusters", OPT_STR, clusters),
    OS("iters", OPT_STR, iters_list), OS("heads", OPT_INT, heads),
    {NULL, OPT_FLAG, 0}};

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
                            1, QVA_VSMOOTH_MAX_CLUSTERS, s->ks, MAX_LIST, &s->nk);
    if (!rc) rc = parse_int_list(o->iters_list ? o->iters_list : "1,2,4,8", "iters",
                                 1, QVA_VSMOOTH_MAX_ITERS, s->its, MAX_LIST, &s->ni);
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

int cmd_sweep_vsmooth(int argc, char **argv) {
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

