/*
 * qvattn eval --decompose: where each method's error comes from, by
 * qva_error_terms_compute on the CPU (docs/CLI.md, docs/NUMERICS.md "Where
 * the error comes from").  A method the library does not decompose
 * (exact, bf16, draft) or cannot run on these views (vc8/vc4 under
 * --query-sample) is listed as skipped with the library's reason.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define NSINGLE 5
static const char *const SINGLE_NAME[NSINGLE] = {"Q", "K", "P", "V", "mu"};
static const char *const SINGLE_KEY[NSINGLE] = {"q", "k", "p", "v", "mu"};

static void single_terms(const qva_error_terms *t, double v[NSINGLE]) {
    v[0] = t->q, v[1] = t->k, v[2] = t->p, v[3] = t->v, v[4] = t->mu;
}

/* cos of every term (full, the single ones, none) in the table's order. */
static void term_cos(const qva_error_term_directions *d, double c[NSINGLE + 2]) {
    c[0] = d->full.cos, c[1] = d->q.cos, c[2] = d->k.cos, c[3] = d->p.cos, c[4] = d->v.cos;
    c[5] = d->mu.cos, c[6] = d->none.cos;
}

/* The largest single-operand term and its share of the sum of the squared
 * terms (independent errors add roughly in quadrature); -1 if none. */
static int dominant(const qva_error_terms *t, double *share) {
    double v[NSINGLE], sum2 = 0.0;
    int best = -1;
    single_terms(t, v);
    for (int i = 0; i < NSINGLE; ++i) {
        if (!isfinite(v[i])) continue;
        sum2 += v[i] * v[i];
        if (best < 0 || v[i] > v[best]) best = i;
    }
    *share = best >= 0 && sum2 > 0.0 ? v[best] * v[best] / sum2 : NAN;
    return best;
}

/* Decomposes one method into *row: a skip (with the reason) for what the
 * library declines here, an error for anything else. */
static int decompose_one(const views *vw, const method_run *m, decomp_row *row) {
    memset(row, 0, sizeof *row);
    if (m->skip[0]) {
        snprintf(row->skip, sizeof row->skip, "%s", m->skip);
        return RC_OK;
    }
    qva_status st =
        qva_error_terms_directions_compute(&m->cfg, &vw->q, &vw->k, &vw->v, &row->t, &row->d);
    if (st == QVA_OK) {
        row->ran = 1;
        return RC_OK;
    }
    if (st == QVA_ERR_UNSUPPORTED || st == QVA_ERR_SHAPE) {
        snprintf(row->skip, sizeof row->skip, "%s", qva_last_error());
        return RC_OK;
    }
    char what[128];
    snprintf(what, sizeof what, "decomposing %s", m->name);
    return lib_error(st, what);
}

int decompose_methods(const views *vw, const method_list *ml, decomp_row *rows) {
    const double t_start = now_ms();
    for (int i = 0; i < ml->n; ++i) {
        int rc = decompose_one(vw, &ml->v[i], &rows[i]);
        if (rc) return rc;
        if (now_ms() - t_start >= PROGRESS_AFTER_MS)
            fprintf(stderr, "[decompose %d/%d] %s: %s\n", i + 1, ml->n, ml->v[i].name,
                    rows[i].ran ? "done" : "skipped");
    }
    return RC_OK;
}

static void print_cell(double x) {
    if (isfinite(x)) printf(" %10.4e", x);
    else printf(" %10s", "-");
}

void print_decompose_table(const method_list *ml, const decomp_row *rows) {
    const int w = method_col(ml);
    printf("\nWhere the error comes from (CPU reference; rel-L2 against exact with one\n"
           "operand quantized, the others FP32; none = nothing quantized):\n");
    printf("%-*s %10s %10s %10s %10s %10s %10s %10s\n", w, "method", "full", "Q", "K", "P",
           "V", "mu", "none");
    for (int i = 0; i < ml->n; ++i) {
        const decomp_row *r = &rows[i];
        if (!r->ran) {
            printf("%-*s skipped: %s\n", w, ml->v[i].name, r->skip);
            continue;
        }
        double v[NSINGLE];
        single_terms(&r->t, v);
        printf("%-*s", w, ml->v[i].name);
        print_cell(r->t.full);
        for (int k = 0; k < NSINGLE; ++k) print_cell(v[k]);
        print_cell(r->t.none);
        printf("\n");
    }
    for (int i = 0; i < ml->n; ++i) {
        double share, v[NSINGLE];
        int d = rows[i].ran ? dominant(&rows[i].t, &share) : -1;
        if (d < 0) continue;
        single_terms(&rows[i].t, v);
        printf("dominant: %s: %s (%.3e of full %.3e; %.0f%% of the squared terms)\n",
               ml->v[i].name, SINGLE_NAME[d], v[d], rows[i].t.full, 100.0 * share);
    }
    printf("\nThe sign of each term's error: the share of it along ref - mean(V)\n"
           "(err-cos; > 0 sharper rows, < 0 flatter, about 0 for noise):\n");
    printf("%-*s %10s %10s %10s %10s %10s %10s %10s\n", w, "method", "full", "Q", "K", "P",
           "V", "mu", "none");
    for (int i = 0; i < ml->n; ++i) {
        if (!rows[i].ran) continue;
        double c[NSINGLE + 2];
        term_cos(&rows[i].d, c);
        printf("%-*s", w, ml->v[i].name);
        for (int k = 0; k < NSINGLE + 2; ++k) {
            if (isfinite(c[k])) printf(" %+10.3f", c[k]);
            else printf(" %10s", "-");
        }
        printf("\n");
    }
}

static void js_terms(const decomp_row *r) {
    double v[NSINGLE], share;
    single_terms(&r->t, v);
    printf("{\"full\":");
    js_num(r->t.full);
    for (int k = 0; k < NSINGLE; ++k) {
        printf(",");
        js_key(SINGLE_KEY[k]);
        js_num(v[k]);
    }
    printf(",\"none\":");
    js_num(r->t.none);
    int d = dominant(&r->t, &share);
    printf(",\"dominant\":");
    if (d >= 0) js_str(SINGLE_KEY[d]);
    else fputs("null", stdout);
    printf(",\"dominant_share\":");
    js_num(share);
    static const char *const key[NSINGLE + 2] = {"full", "q", "k", "p", "v", "mu", "none"};
    double c[NSINGLE + 2];
    term_cos(&r->d, c);
    printf(",\"err_cos\":{");
    for (int i = 0; i < NSINGLE + 2; ++i) {
        if (i) printf(",");
        js_key(key[i]);
        js_num(c[i]);
    }
    printf("}}");
}

void js_decompose(const method_list *ml, const decomp_row *rows) {
    js_key("decompose");
    printf("{");
    for (int i = 0; i < ml->n; ++i) {
        if (i) printf(",");
        js_key(ml->v[i].name);
        if (rows[i].ran) {
            js_terms(&rows[i]);
            continue;
        }
        printf("{");
        js_key("skipped");
        js_str(rows[i].skip);
        printf("}");
    }
    printf("}");
}
