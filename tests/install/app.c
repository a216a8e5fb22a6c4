/* A program that uses qvattn as an installed library would: the public
 * header only.  Checks qva_version() against the header and runs the CPU
 * attention (bf16 against exact), which needs no GPU in any build.
 * Built by install_test.sh against the installed library (pkg-config,
 * shared and static; find_package) and through add_subdirectory. */
#include <qvattn.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 1, H = 2, N = 128, D = 64 };

static float next_value(uint64_t *s) { /* uniform in [-1, 1) */
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (2.0 / 16777216.0) - 1.0);
}

static int run(qva_context_t *ctx, const char *method, const qva_tensor *q,
               const qva_tensor *k, const qva_tensor *v, const qva_tensor *out) {
    qva_config cfg;
    qva_config_default(&cfg);
    qva_status st = qva_config_set_method(&cfg, method);
    if (st == QVA_OK) st = qva_attention(ctx, &cfg, q, k, v, out, NULL);
    if (st != QVA_OK)
        fprintf(stderr, "%s: %s: %s\n", method, qva_status_string(st), qva_last_error());
    return st == QVA_OK;
}

int main(void) {
    if (qva_version() != QVA_VERSION) {
        fprintf(stderr, "qva_version() is %d, the header says %d\n", qva_version(), QVA_VERSION);
        return 1;
    }
    size_t n = (size_t)B * H * N * D;
    float *buf = malloc(5 * n * sizeof(float));
    if (!buf) return 1;
    uint64_t seed = 1;
    for (size_t i = 0; i < 3 * n; ++i) buf[i] = next_value(&seed);
    qva_tensor q = qva_tensor_hnd(buf, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor k = qva_tensor_hnd(buf + n, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor v = qva_tensor_hnd(buf + 2 * n, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor ref = qva_tensor_hnd(buf + 3 * n, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor out = qva_tensor_hnd(buf + 4 * n, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_context_t *ctx = NULL;
    qva_status st = qva_context_create(&ctx, QVA_DEVICE_CPU);
    if (st != QVA_OK) {
        fprintf(stderr, "qva_context_create: %s\n", qva_last_error());
        return 1;
    }
    int ok = run(ctx, "exact", &q, &k, &v, &ref) && run(ctx, "bf16", &q, &k, &v, &out);
    qva_context_free(ctx);
    if (ok) {
        qva_error_metrics m;
        qva_compare(buf + 4 * n, buf + 3 * n, n, &m);
        ok = m.rel_l2 < 1e-2;
        printf("qvattn %d.%d.%d, %s: bf16 vs exact rel-L2 %.3e; cuda device: %s\n",
               QVA_VERSION_MAJOR, QVA_VERSION_MINOR, QVA_VERSION_PATCH, qva_build_info(),
               m.rel_l2, qva_cuda_available() ? "yes" : "no");
        if (!ok) fprintf(stderr, "rel-L2 %.3e is not below 1e-2\n", m.rel_l2);
    }
    free(buf);
    return ok ? 0 : 1;
}
