/*
 * Output pieces shared by the commands: JSON primitives (written straight
 * to stdout) and the description of the input that eval and bench print.
 */
#include <math.h>
#include <stdio.h>

#include "cli.h"

void js_str(const char *s) {
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
void js_num(double x) {
    if (isfinite(x)) printf("%.9g", x);
    else fputs("null", stdout);
}

void js_key(const char *k) {
    js_str(k);
    putchar(':');
}

void js_input(const workload *w, const views *vw) {
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
    printf(",\"prefix\":%d,\"prefix_at_end\":%s,\"dtype\":\"%s\"}", w->prefix,
           w->prefix_at_end ? "true" : "false",
           w->dtype == QVA_BF16 ? "bf16" : w->dtype == QVA_F16 ? "f16" : "f32");
}

void print_input(const workload *w, const views *vw) {
    printf("input: %s (%s)  B=%lld H=%lld", w->source, w->format,
           (long long)vw->B, (long long)vw->H);
    if (vw->H != w->x.H) printf(" of %lld", (long long)w->x.H);
    printf(" N=%lld", (long long)vw->N);
    if (vw->R != w->x.Nq || w->x.Nq != vw->N)
        printf(" query rows=%lld of %lld", (long long)vw->R, (long long)w->x.Nq);
    printf(" D=%lld", (long long)vw->D);
    if (w->dtype != QVA_F32) printf(" %s", w->dtype == QVA_BF16 ? "bf16" : "f16");
    if (w->has_grid)
        printf("  grid %dx%dx%d prefix %d%s", w->grid[0], w->grid[1], w->grid[2],
               w->prefix, w->prefix_at_end ? " (at end)" : "");
    printf("\n\n");
}

