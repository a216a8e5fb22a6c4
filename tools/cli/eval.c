/*
 * qvattn eval: accuracy of each method against exact attention, plus the
 * value-quantization and ExpCast statistics of head 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define TV_ROWS 256 /* rows of head 0 for the ExpCast TV */

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
    "  --dtype f32|bf16|f16 inputs as given to the library (default f32); bf16/f16\n"
    "                       round q, k, v to nearest even first, for every method\n"
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
    "error terms:\n"
    "  --decompose          also run each method on the CPU with one operand\n"
    "                       quantized at a time (Q, K, P, V, vc's means) and\n"
    "                       report each term's rel-L2 (docs/NUMERICS.md, \"Where\n"
    "                       the error comes from\")\n"
    "route quality (draft@ methods, CPU):\n"
    "  --draft-report       per head: the exact attention mass the kept region\n"
    "                       pairs hold (per phase) beside the oracle, the same\n"
    "                       number of pairs ranked by exact mass, and rel-L2\n"
    "  --draft-sweep LIST   skip rates in % (e.g. 50,70,85,90,95): the curve of\n"
    "                       kept share, router and oracle mass and rel-L2 for\n"
    "                       the first draft method's split (docs/DRAFT.md)\n"
    "output:\n"
    "  --device cpu|cuda|auto  where methods run (default auto: cuda when\n"
    "                       available and supported, else cpu)\n"
    "  --json               one JSON object on stdout (docs/CLI.md)\n";

static const opt_spec EVAL_OPTS[] = {
    OPTS_INPUT, OPTS_LAYOUT, OS("query-sample", OPT_INT, query_sample),
    OS("decompose", OPT_FLAG, decompose), OS("draft-report", OPT_FLAG, draft_report),
    OS("draft-sweep", OPT_STR, draft_sweep), {NULL, OPT_FLAG, 0}};

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

/* The share of region pairs each head kept, for the draft methods that
 * report it (the MASS budget varies it per head). */
static void print_kept_shares(const method_list *ml) {
    const int w = method_col(ml);
    int header = 0;
    for (int i = 0; i < ml->n; ++i) {
        const qva_draft_stats *d = &ml->v[i].draft;
        if (ml->v[i].skip[0] || d->heads == 0) continue;
        if (!header++)
            printf("\ndraft kept share (video-region pairs kept per head):\n"
                   "  %-*s %8s %8s %8s %7s %6s\n", w, "method", "mean", "min", "max",
                   "pairs", "heads");
        printf("  %-*s %8.4f %8.4f %8.4f %7lld %6lld\n", w, ml->v[i].name, d->kept_mean,
               d->kept_min, d->kept_max, (long long)d->pairs, (long long)d->heads);
    }
}

static void print_eval_table(const method_list *ml) {
    const int w = method_col(ml);
    printf("%-*s %-6s %11s %11s %11s %9s %10s %10s %7s\n", w, "method", "device", "rel-L2",
           "cos", "max-abs", "PSNR dB", "ms", "sharpen", "err-cos");
    for (int i = 0; i < ml->n; ++i) {
        const method_run *m = &ml->v[i];
        if (m->skip[0]) {
            printf("%-*s %-6s skipped: %s\n", w, m->name, "-", m->skip);
            continue;
        }
        printf("%-*s %-6s %11.4e %11.8f %11.4e %9.2f %10.1f %+10.2e %+7.3f\n", w, m->name,
               dev_name(m->dev), m->m.rel_l2, m->m.cos_sim, m->m.max_abs,
               m->m.psnr_db, m->ms, m->dir.sharpen, m->dir.cos);
    }
    for (int i = 0; i < ml->n; ++i)
        if (ml->v[i].note[0]) printf("note: %s: %s\n", ml->v[i].name, ml->v[i].note);
    print_kept_shares(ml);
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

/* ,"kept_share":{...}: the draft stats of a method that routed heads. */
static void js_kept_share(const qva_draft_stats *d) {
    const char *const key[3] = {"mean", "min", "max"};
    const double val[3] = {d->kept_mean, d->kept_min, d->kept_max};
    printf(",\"kept_share\":{\"pairs\":%lld,\"heads\":%lld", (long long)d->pairs,
           (long long)d->heads);
    for (int i = 0; i < 3; ++i) {
        printf(",\"%s\":", key[i]);
        js_num(val[i]);
    }
    printf("}");
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
    printf(",\"sharpen\":");
    js_num(m->dir.sharpen);
    printf(",\"err_cos\":");
    js_num(m->dir.cos);
    printf(",\"device\":\"%s\",\"canonical\":", dev_name(m->dev));
    js_str(canon);
    if (m->note[0]) {
        printf(",\"note\":");
        js_str(m->note);
    }
    if (m->draft.heads > 0) js_kept_share(&m->draft);
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

/* rows: the --decompose terms, or NULL without --decompose; dr likewise
 * the route reports. */
static void print_eval_json(const workload *w, const views *vw, const method_list *ml,
                            const vq_report *r, const decomp_row *rows, const draft_out *dr) {
    printf("{\"methods\":{");
    for (int i = 0; i < ml->n; ++i) {
        if (i) printf(",");
        js_method_eval(&ml->v[i]);
    }
    printf("},");
    js_input(w, vw);
    printf(",");
    js_vq(r);
    if (rows) {
        printf(",");
        js_decompose(ml, rows);
    }
    if (dr) {
        printf(",");
        js_draft_out(ml, dr);
    }
    printf("}\n");
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
                    pick_device(r->mode, &m->cfg, r->vw->q.dtype, r->vw->D, m->note,
                                sizeof m->note) == QVA_DEVICE_CPU;
        if (reuse) { /* the same computation: do not pay for it twice */
            m->dev = QVA_DEVICE_CPU;
            m->ms = exact.ms;
            memcpy(out, ref, r->vw->out_elems * sizeof *out);
        } else if (!m->skip[0] && (rc = run_method(r, m, 0, 1, out))) {
            return rc;
        }
        if (!m->skip[0]) {
            qva_compare(out, ref, r->vw->out_elems, &m->m);
            /* a failure (a NaN output) leaves NaN, which the table prints */
            (void)qva_error_direction_compute(out, ref, r->vw->H, r->vw->R, &r->vw->v, &m->dir);
        }
        progress(m, i + 1, ml->n, t_start);
    }
    return RC_OK;
}

static int eval_report(const opts *o, const workload *w, const views *vw,
                       const method_list *ml, const decomp_row *rows, const draft_out *dr) {
    vq_report r;
    memset(&r, 0, sizeof r);
    vq_compute(w, &r);
    tv_compute(w, &r);
    warn_aux(&r);
    if (o->json) {
        print_eval_json(w, vw, ml, &r, rows, dr);
        return RC_OK;
    }
    print_input(w, vw);
    print_eval_table(ml);
    if (rows) print_decompose_table(ml, rows);
    if (dr) print_draft_out(ml, dr);
    print_aux(&r);
    return RC_OK;
}

int cmd_eval(int argc, char **argv) {
    opts o;
    method_session s;
    float *ref = NULL, *out = NULL;
    decomp_row *rows = NULL;
    draft_out *dr = NULL;
    opts_init(&o);
    int rc = method_session_open(&s);
    if (!rc) rc = parse_opts(argc, argv, EVAL_OPTS, USAGE_EVAL, &o);
    if (!rc) rc = method_session_prepare(&s, &o, 1);
    if (!rc) rc = draft_report_prepare(&o, s.ml, &dr);
    if (!rc) {
        ref = malloc(s.vw.out_elems * sizeof *ref);
        out = malloc(s.vw.out_elems * sizeof *out);
        if (!ref || !out) rc = runtime_error("out of memory for the outputs");
    }
    if (!rc) rc = eval_methods(&s.run, s.ml, ref, out);
    if (!rc && o.decompose) {
        rows = calloc((size_t)s.ml->n + 1, sizeof *rows);
        rc = rows ? decompose_methods(&s.vw, s.ml, rows)
                  : runtime_error("out of memory for the error terms");
    }
    if (!rc && dr) rc = draft_report_run(&s.vw, s.ml, dr);
    if (!rc) rc = eval_report(&o, &s.w, &s.vw, s.ml, rows, dr);
    draft_out_free(dr);
    free(ref);
    free(out);
    free(rows);
    method_session_close(&s);
    return rc == RC_HELP ? RC_OK : rc;
}
