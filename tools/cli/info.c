/*
 * qvattn info: version, build, backends and what each backend can run.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char USAGE_INFO[] =
    "usage: qvattn info [--json]\n"
    "\n"
    "Prints the version, the build, the backends and, for each method, whether\n"
    "cpu and cuda can run it at D=64 and D=128 with bf16 inputs.\n";

static const opt_spec INFO_OPTS[] = {OS("json", OPT_FLAG, json),
                                     {NULL, OPT_FLAG, 0}};

static const char *const INFO_METHODS[] = {
    "exact", "bf16", "fp8", "fp8+expcast", "sage8", "sage8+expcast",
    "sage8+nohadamard+fp32sum", "vc8", "vc8+expcast", "sage4", "vc4",
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
    int w = METHOD_COL;
    for (int i = 0; i < N_INFO_METHODS; ++i)
        if ((int)strlen(INFO_METHODS[i]) > w) w = (int)strlen(INFO_METHODS[i]);
    printf("  %-*s %-8s %-8s %-8s %-8s\n", w, "method", "cpu d64", "cpu d128",
           "cuda d64", "cuda d128");
    for (int i = 0; i < N_INFO_METHODS; ++i) {
        cap c[2][2];
        capabilities(INFO_METHODS[i], c);
        printf("  %-*s %-8s %-8s %-8s %-8s", w, INFO_METHODS[i],
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

int cmd_info(int argc, char **argv) {
    opts o;
    opts_init(&o);
    int rc = parse_opts(argc, argv, INFO_OPTS, USAGE_INFO, &o);
    if (rc) return rc == RC_HELP ? RC_OK : rc;
    if (o.json) info_json();
    else info_text();
    return RC_OK;
}

