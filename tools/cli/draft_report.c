/*
 * qvattn eval --draft-report and --draft-sweep: how much of the exact
 * attention mass each draft method's route keeps, beside the best route of
 * the same size, per head, and the curve over skip rates
 * (qva_draft_report_compute, qva_draft_sweep_compute on the CPU; docs/CLI.md,
 * docs/DRAFT.md "Route quality").  A draft method the library cannot report
 * on these views (--query-sample, no grid) is listed as skipped with the
 * reason.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_SWEEP 32

/* One method's report, or why there is none. */
typedef struct draft_row {
    int ran;
    qva_draft_report s;
    qva_draft_head_report *heads; /* s.heads entries */
    char skip[300];
} draft_row;

struct draft_out {
    int report;                    /* --draft-report                          */
    draft_row *rows;               /* per method of ml; NULL without --draft-report */
    int nrows;
    int sweep_method;              /* index in ml of the first draft method, -1 */
    int npoints;                   /* --draft-sweep points (0: none asked)   */
    double skip[MAX_SWEEP];        /* fractions                               */
    qva_draft_report pt[MAX_SWEEP];
    int sweep_ran;
    char sweep_skip[300];
};

/* ------------------------------------------------------------ options */

/* "50,70,85.5" of percentages in [0, 100] into fractions. */
static int parse_skips(const char *s, double *skip, int *n) {
    char buf[512];
    if (strlen(s) >= sizeof buf) return usage_error("--draft-sweep: list too long");
    strcpy(buf, s);
    *n = 0;
    for (char *tok = buf, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        char *end;
        errno = 0;
        double x = strtod(tok, &end);
        if (!*tok || *end || errno || !(tok[0] >= '0' && tok[0] <= '9'))
            return usage_error("--draft-sweep: '%s' is not a percentage", tok);
        if (!(x >= 0.0 && x <= 100.0))
            return usage_error("--draft-sweep: %s is outside [0, 100]", tok);
        if (*n >= MAX_SWEEP)
            return usage_error("--draft-sweep: more than %d skip rates", MAX_SWEEP);
        skip[(*n)++] = x / 100.0;
    }
    return RC_OK;
}

static int first_draft(const method_list *ml) {
    for (int i = 0; i < ml->n; ++i)
        if (ml->v[i].cfg.method == QVA_METHOD_DRAFT) return i;
    return -1;
}

int draft_report_prepare(const opts *o, const method_list *ml, draft_out **out) {
    *out = NULL;
    if (!o->draft_report && !o->draft_sweep) return RC_OK;
    draft_out *d = calloc(1, sizeof *d);
    if (!d) return runtime_error("out of memory for the route report");
    *out = d;
    d->report = o->draft_report;
    d->sweep_method = first_draft(ml);
    if (o->draft_sweep) {
        int rc = parse_skips(o->draft_sweep, d->skip, &d->npoints);
        if (rc) return rc;
        if (d->sweep_method < 0)
            return usage_error("--draft-sweep needs a draft@ method in --methods");
    }
    if (d->report && !(d->rows = calloc((size_t)ml->n + 1, sizeof *d->rows)))
        return runtime_error("out of memory for the route report");
    d->nrows = d->rows ? ml->n : 0;
    return RC_OK;
}

void draft_out_free(draft_out *d) {
    if (!d) return;
    for (int i = 0; i < d->nrows; ++i) free(d->rows[i].heads);
    free(d->rows);
    free(d);
}

/* ------------------------------------------------------------ runs */

/* A status that means "not on these views" (the row is skipped) rather
 * than a failure of the run. */
static int skippable(qva_status st) {
    return st == QVA_ERR_UNSUPPORTED || st == QVA_ERR_SHAPE;
}

static int report_one(const views *vw, const method_run *m, draft_row *row) {
    if (m->skip[0]) {
        snprintf(row->skip, sizeof row->skip, "%s", m->skip);
        return RC_OK;
    }
    row->heads = calloc((size_t)(vw->B * vw->H), sizeof *row->heads);
    if (!row->heads) return runtime_error("out of memory for the route report");
    qva_status st = qva_draft_report_compute(&m->cfg, &vw->q, &vw->k, &vw->v, &row->s,
                                             row->heads, vw->B * vw->H);
    if (st == QVA_OK) row->ran = 1;
    else if (skippable(st)) snprintf(row->skip, sizeof row->skip, "%s", qva_last_error());
    else {
        char what[128];
        snprintf(what, sizeof what, "route report of %s", m->name);
        return lib_error(st, what);
    }
    return RC_OK;
}

static int run_sweep(const views *vw, const method_list *ml, draft_out *d) {
    const method_run *m = &ml->v[d->sweep_method];
    if (m->skip[0]) {
        snprintf(d->sweep_skip, sizeof d->sweep_skip, "%s", m->skip);
        return RC_OK;
    }
    qva_status st = qva_draft_sweep_compute(&m->cfg, &vw->q, &vw->k, &vw->v, d->skip,
                                            d->npoints, d->pt, NULL, 0);
    if (st == QVA_OK) d->sweep_ran = 1;
    else if (skippable(st)) snprintf(d->sweep_skip, sizeof d->sweep_skip, "%s", qva_last_error());
    else return lib_error(st, "the skip-rate sweep");
    return RC_OK;
}

int draft_report_run(const views *vw, const method_list *ml, draft_out *d) {
    const double t_start = now_ms();
    for (int i = 0; d->report && i < ml->n; ++i) {
        if (ml->v[i].cfg.method != QVA_METHOD_DRAFT) continue;
        int rc = report_one(vw, &ml->v[i], &d->rows[i]);
        if (rc) return rc;
        if (now_ms() - t_start >= PROGRESS_AFTER_MS)
            fprintf(stderr, "[draft-report] %s: %s\n", ml->v[i].name,
                    d->rows[i].ran ? "done" : "skipped");
    }
    return d->npoints ? run_sweep(vw, ml, d) : RC_OK;
}

/* ------------------------------------------------------------ tables */

static void print_head(const qva_draft_head_report *r) {
    printf("%4lld %4lld %7.2f %8.4f %8.4f %8.4f %8.4f %8.4f %8.4f %8.4f %11.4e\n",
           (long long)r->batch, (long long)r->head, 100.0 * r->kept_share, r->router_mass,
           r->mass16, r->mass8, r->mass4, r->prefix_mass, r->oracle_mass, r->ratio,
           r->rel_l2);
}

/* What the numbers say about the heads that need attention: a route that
 * loses most of the mass, or a draft map that misses the heavy pairs. */
#define NOTE_MASS 0.5
#define NOTE_RATIO 0.9
static void print_note(const method_run *m, const draft_row *r, int by_ratio,
                       const char *what) {
    int n = 0;
    for (int64_t h = 0; h < r->s.heads; ++h) {
        const qva_draft_head_report *x = &r->heads[h];
        if (by_ratio ? x->ratio >= NOTE_RATIO : x->router_mass >= NOTE_MASS) continue;
        if (!n++) printf("note: %s: heads (b,h)", m->name);
        printf(" %lld,%lld", (long long)x->batch, (long long)x->head);
    }
    if (n) printf(" %s\n", what);
}

static void print_notes(const method_run *m, const draft_row *r) {
    print_note(m, r, 0, "keep less than half of the attention mass: expect a large "
                        "error; lower the skip rate (--draft-sweep)");
    print_note(m, r, 1, "keep under 0.9x the oracle's mass: the draft map misses "
                        "heavy pairs (heads without spatial locality)");
}

static void print_row(const method_run *m, const draft_row *r) {
    if (!r->ran) {
        printf("%s: skipped: %s\n", m->name, r->skip);
        return;
    }
    const qva_draft_report *s = &r->s;
    printf("%s: %lld video regions, %lld region pairs per head\n", m->name,
           (long long)s->regions, (long long)(s->regions * s->regions));
    printf("%4s %4s %7s %8s %8s %8s %8s %8s %8s %8s %11s\n", "b", "h", "kept%", "router",
           "16-bit", "8-bit", "4-bit", "prefix", "oracle", "r/o", "rel-L2");
    for (int64_t h = 0; h < s->heads; ++h) print_head(&r->heads[h]);
    const qva_draft_head_report *lo = &r->heads[s->ratio_min_head];
    printf("summary: %s: kept %.2f%%, router %.4f, oracle %.4f, router/oracle %.4f "
           "(lowest %.4f at b=%lld h=%lld), rel-L2 %.4e\n",
           m->name, 100.0 * s->kept_share, s->router_mass, s->oracle_mass, s->ratio,
           s->ratio_min, (long long)lo->batch, (long long)lo->head, s->rel_l2);
    print_notes(m, r);
}

static void print_sweep(const method_list *ml, const draft_out *d) {
    const method_run *m = &ml->v[d->sweep_method];
    const qva_draft_params *p = &m->cfg.draft;
    const double kept = (double)p->frac4 + p->frac8 + p->frac16;
    printf("\nSkip-rate sweep, %s's split of the kept pairs (16-bit %.0f%%, 8-bit %.0f%%, "
           "4-bit %.0f%%):\n",
           m->name, kept > 0 ? 100.0 * p->frac16 / kept : 100.0,
           kept > 0 ? 100.0 * p->frac8 / kept : 0.0, kept > 0 ? 100.0 * p->frac4 / kept : 0.0);
    if (!d->sweep_ran) {
        printf("skipped: %s\n", d->sweep_skip);
        return;
    }
    printf("%7s %7s %8s %8s %8s %8s %11s\n", "skip%", "kept%", "router", "oracle", "r/o",
           "min r/o", "rel-L2");
    for (int i = 0; i < d->npoints; ++i) {
        const qva_draft_report *s = &d->pt[i];
        printf("%7.2f %7.2f %8.4f %8.4f %8.4f %8.4f %11.4e\n", 100.0 * s->skip,
               100.0 * s->kept_share, s->router_mass, s->oracle_mass, s->ratio, s->ratio_min,
               s->rel_l2);
    }
}

void print_draft_out(const method_list *ml, const draft_out *d) {
    if (d->report) {
        printf("\nRoute quality (CPU; the exact FP64 attention mass of the video query rows\n"
               "that the kept region pairs hold, per phase, beside the oracle: as many\n"
               "pairs ranked by exact mass; prefix keys are always kept):\n");
        for (int i = 0; i < ml->n; ++i)
            if (ml->v[i].cfg.method == QVA_METHOD_DRAFT) print_row(&ml->v[i], &d->rows[i]);
    }
    if (d->npoints) print_sweep(ml, d);
}

/* ------------------------------------------------------------ JSON */

static void js_field(const char *k, double x) {
    printf(",");
    js_key(k);
    js_num(x);
}

static void js_masses(double kept, double pre, double m16, double m8, double m4,
                      double router, double oracle, double ratio, double rel) {
    js_field("kept_share", kept);
    js_field("prefix_mass", pre);
    js_field("mass16", m16);
    js_field("mass8", m8);
    js_field("mass4", m4);
    js_field("router_mass", router);
    js_field("oracle_mass", oracle);
    js_field("ratio", ratio);
    js_field("rel_l2", rel);
}

static void js_head(const qva_draft_head_report *r) {
    printf("{\"b\":%lld,\"h\":%lld,\"kept16\":%lld,\"kept8\":%lld,\"kept4\":%lld",
           (long long)r->batch, (long long)r->head, (long long)r->kept16,
           (long long)r->kept8, (long long)r->kept4);
    js_masses(r->kept_share, r->prefix_mass, r->mass16, r->mass8, r->mass4, r->router_mass,
              r->oracle_mass, r->ratio, r->rel_l2);
    printf("}");
}

static void js_summary(const qva_draft_report *s) {
    printf("{\"heads\":%lld,\"regions\":%lld", (long long)s->heads, (long long)s->regions);
    js_field("skip", s->skip);
    js_masses(s->kept_share, s->prefix_mass, s->mass16, s->mass8, s->mass4, s->router_mass,
              s->oracle_mass, s->ratio, s->rel_l2);
    js_field("ratio_min", s->ratio_min);
    printf(",\"ratio_min_head\":%lld}", (long long)s->ratio_min_head);
}

static void js_row(const draft_row *r) {
    if (!r->ran) {
        printf("{");
        js_key("skipped");
        js_str(r->skip);
        printf("}");
        return;
    }
    printf("{\"summary\":");
    js_summary(&r->s);
    printf(",\"heads\":[");
    for (int64_t h = 0; h < r->s.heads; ++h) {
        if (h) printf(",");
        js_head(&r->heads[h]);
    }
    printf("]}");
}

static void js_sweep(const method_list *ml, const draft_out *d) {
    js_key("draft_sweep");
    printf("{\"method\":");
    js_str(ml->v[d->sweep_method].name);
    if (!d->sweep_ran) {
        printf(",\"skipped\":");
        js_str(d->sweep_skip);
        printf("}");
        return;
    }
    printf(",\"points\":[");
    for (int i = 0; i < d->npoints; ++i) {
        if (i) printf(",");
        js_summary(&d->pt[i]);
    }
    printf("]}");
}

void js_draft_out(const method_list *ml, const draft_out *d) {
    int first = 1;
    if (d->report) {
        js_key("draft_report");
        printf("{");
        for (int i = 0; i < ml->n; ++i) {
            if (ml->v[i].cfg.method != QVA_METHOD_DRAFT) continue;
            if (!first) printf(",");
            first = 0;
            js_key(ml->v[i].name);
            js_row(&d->rows[i]);
        }
        printf("}");
    }
    if (d->npoints) {
        if (d->report) printf(",");
        js_sweep(ml, d);
    }
}
