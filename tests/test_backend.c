/*
 * The one backend driver (after ggml's test-backend-ops): every case runs on
 * every available backend.
 *   test mode (default): the CPU reference of each method is checked against
 *     `exact` with a per-method accuracy ceiling, and each other backend
 *     (CUDA, when built and present and when supports() says yes) is
 *     checked against the CPU reference of the same method with a
 *     per-element atol + rtol*|ref| and a global normalized error, and its
 *     LSE (strided like the case's layout) within LSE_ATOL + LSE_RTOL*|ref|.
 *     Outputs and LSE are poisoned with NaN before every run; NaN/Inf or an
 *     unwritten element fails.
 *   perf mode (`test_backend perf`): times each method per backend.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "internal.h"

typedef struct tol {
    const char *method;
    double ceiling_vs_exact; /* CPU reference: rel-L2 vs exact must be below */
    double atol, rtol, rel_l2; /* other backend vs CPU reference            */
} tol;

/* Ceilings are sanity bounds on random data (not fidelity claims); the
 * GPU-vs-CPU tolerances are docs/NUMERICS.md §Tolerances. */
static const tol TOLS[] = {
    {"bf16", 0.02, 2e-3, 2e-2, 2e-3},
    {"fp8", 0.25, 2e-2, 5e-2, 2e-2},
    {"fp8+expcast", 0.25, 2e-2, 5e-2, 2e-2},
    {"sage8", 0.12, 1e-2, 5e-2, 1e-2},
    {"sage8+hadamard", 0.12, 1e-2, 5e-2, 1e-2},
    {"vc8", 0.12, 1e-2, 5e-2, 1e-2},
    {"vc8+expcast", 0.12, 1e-2, 5e-2, 1e-2},
    {"vc8+expcast+hadamard", 0.12, 1e-2, 5e-2, 1e-2},
    {"sage4", 0.5, 5e-2, 1e-1, 5e-2},
    {"sage4+hadamard", 0.5, 5e-2, 1e-1, 5e-2},
    {"vc4", 0.5, 5e-2, 1e-1, 5e-2},
};
/* LSE of another backend vs the CPU reference (natural-log units), every
 * method: docs/NUMERICS.md §6. */
#define LSE_ATOL 2e-4
#define LSE_RTOL 1e-5
#define NTOLS (int)(sizeof TOLS / sizeof *TOLS)

typedef struct tcase {
    int B, H, Nq, Nk, D;
    qva_dtype dt;
    int nhd;
} tcase;

static const tcase CASES[] = {
    {1, 2, 200, 200, 64, QVA_F32, 0},  /* N not a multiple of 128 */
    {1, 1, 77, 77, 128, QVA_BF16, 1},  /* N < 128, NHD, bf16       */
    {2, 2, 256, 256, 64, QVA_F16, 0},  /* B > 1, f16               */
    {1, 2, 130, 130, 128, QVA_BF16, 0},/* one valid key in a block */
    {1, 1, 64, 320, 64, QVA_F32, 1},   /* cross attention Nq < Nk  */
};
#define NCASES (int)(sizeof CASES / sizeof *CASES)

static uint64_t rs = 88172645463325252ull;
static float frand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)(rs >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

static size_t elems(int B, int H, int N, int D) { return (size_t)B * H * N * D; }

static qva_tensor desc(void *p, const tcase *c, int N, qva_device dev) {
    return c->nhd ? qva_tensor_nhd(p, c->dt, dev, c->B, c->H, N, c->D)
                  : qva_tensor_hnd(p, c->dt, dev, c->B, c->H, N, c->D);
}

/* The f32 [B,H,Nq,1] LSE, laid out like the case ([B,Nq,H] for NHD). */
static qva_tensor lse_desc(float *p, const tcase *c, qva_device dev) {
    return c->nhd ? qva_tensor_nhd(p, QVA_F32, dev, c->B, c->H, c->Nq, 1)
                  : qva_tensor_hnd(p, QVA_F32, dev, c->B, c->H, c->Nq, 1);
}
static size_t lse_count(const tcase *c) { return (size_t)c->B * c->H * c->Nq; }

/* Host buffers of one case, stored in the case's dtype. */
typedef struct host_io {
    void *q, *k, *v, *o;
    size_t nq, nk;
} host_io;

static void fill_tensor(const qva_tensor *t, float amp, float bias) {
    size_t n = elems((int)t->shape[0], (int)t->shape[1], (int)t->shape[2], (int)t->shape[3]);
    for (size_t i = 0; i < n; ++i) /* element order is irrelevant here */
        qvi_store_elem(t, (int64_t)i, bias + amp * frand());
}

static host_io make_case(const tcase *c) {
    host_io h;
    size_t es = qva_dtype_size(c->dt);
    h.nq = elems(c->B, c->H, c->Nq, c->D);
    h.nk = elems(c->B, c->H, c->Nk, c->D);
    h.q = malloc(h.nq * es), h.k = malloc(h.nk * es), h.v = malloc(h.nk * es);
    h.o = malloc(h.nq * es);
    qva_tensor q = desc(h.q, c, c->Nq, QVA_DEVICE_CPU), k = desc(h.k, c, c->Nk, QVA_DEVICE_CPU),
               v = desc(h.v, c, c->Nk, QVA_DEVICE_CPU);
    fill_tensor(&q, 2.0f, 0.0f);
    fill_tensor(&k, 2.0f, 0.5f); /* a common K component, as in DiTs */
    fill_tensor(&v, 1.0f, 0.0f);
    return h;
}

static void free_case(host_io *h) { free(h->q), free(h->k), free(h->v), free(h->o); }

/* Output as f32 in storage order, poisoned before the run; lse (NULL: not
 * requested) receives the LSE in its storage order. */
static qva_status run_cpu(const tcase *c, host_io *h, const char *method, float *res,
                          float *lse, double *ms) {
    qva_context_t *ctx;
    qva_config cfg;
    qva_config_default(&cfg);
    qva_status st = qva_config_set_method(&cfg, method);
    if (st != QVA_OK) return st;
    if ((st = qva_context_create(&ctx, QVA_DEVICE_CPU)) != QVA_OK) return st;
    qva_tensor q = desc(h->q, c, c->Nq, QVA_DEVICE_CPU), k = desc(h->k, c, c->Nk, QVA_DEVICE_CPU),
               v = desc(h->v, c, c->Nk, QVA_DEVICE_CPU), o = desc(h->o, c, c->Nq, QVA_DEVICE_CPU);
    for (size_t i = 0; i < h->nq; ++i) qvi_store_elem(&o, (int64_t)i, NAN);
    qva_tensor l = lse_desc(lse, c, QVA_DEVICE_CPU);
    for (size_t i = 0; lse && i < lse_count(c); ++i) lse[i] = NAN;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = qva_attention(ctx, &cfg, &q, &k, &v, &o, lse ? &l : NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (ms) *ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    for (size_t i = 0; i < h->nq; ++i) res[i] = qvi_load_elem(&o, (int64_t)i);
    qva_context_free(ctx);
    return st;
}

static qva_status run_cuda(const tcase *c, host_io *h, const char *method, float *res,
                           float *lse) {
    qva_config cfg;
    qva_config_default(&cfg);
    qva_status st = qva_config_set_method(&cfg, method);
    if (st != QVA_OK) return st;
    size_t es = qva_dtype_size(c->dt), nl = lse_count(c) * sizeof(float);
    void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dlse = NULL;
    qva_context_t *ctx = NULL;
    if ((st = qva_device_malloc(&dq, h->nq * es)) || (st = qva_device_malloc(&dk, h->nk * es)) ||
        (st = qva_device_malloc(&dv, h->nk * es)) || (st = qva_device_malloc(&dout, h->nq * es)) ||
        (st = qva_device_malloc(&dlse, nl)))
        goto done;
    qva_tensor o = desc(h->o, c, c->Nq, QVA_DEVICE_CPU);
    for (size_t i = 0; i < h->nq; ++i) qvi_store_elem(&o, (int64_t)i, NAN); /* poison */
    for (size_t i = 0; i < lse_count(c); ++i) lse[i] = NAN;
    if ((st = qva_memcpy_to_device(dq, h->q, h->nq * es)) ||
        (st = qva_memcpy_to_device(dk, h->k, h->nk * es)) ||
        (st = qva_memcpy_to_device(dv, h->v, h->nk * es)) ||
        (st = qva_memcpy_to_device(dout, h->o, h->nq * es)) ||
        (st = qva_memcpy_to_device(dlse, lse, nl)) ||
        (st = qva_context_create(&ctx, QVA_DEVICE_CUDA)))
        goto done;
    qva_tensor q = desc(dq, c, c->Nq, QVA_DEVICE_CUDA), k = desc(dk, c, c->Nk, QVA_DEVICE_CUDA),
               v = desc(dv, c, c->Nk, QVA_DEVICE_CUDA), od = desc(dout, c, c->Nq, QVA_DEVICE_CUDA),
               ld = lse_desc((float *)dlse, c, QVA_DEVICE_CUDA);
    if ((st = qva_attention(ctx, &cfg, &q, &k, &v, &od, &ld)) ||
        (st = qva_device_synchronize()) || (st = qva_memcpy_to_host(h->o, dout, h->nq * es)) ||
        (st = qva_memcpy_to_host(lse, dlse, nl)))
        goto done;
    for (size_t i = 0; i < h->nq; ++i) res[i] = qvi_load_elem(&o, (int64_t)i);
done:
    qva_context_free(ctx);
    qva_device_free(dq), qva_device_free(dk), qva_device_free(dv), qva_device_free(dout);
    qva_device_free(dlse);
    return st;
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = (double)a[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int all_finite(const float *a, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (!isfinite(a[i])) return 0;
    return 1;
}

/* A backend's output against the CPU reference of the same method. */
static void compare_backend(const char *label, const tol *t, const float *got,
                            const float *ref, size_t n) {
    CHECK(all_finite(got, n), "%s: NaN/Inf or unwritten output", label);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i)
        if (!(fabs((double)got[i] - ref[i]) <= t->atol + t->rtol * fabs(ref[i]))) ++bad;
    CHECK(bad == 0, "%s: %zu elements outside atol %g + rtol %g", label, bad, t->atol, t->rtol);
    double e = rel_l2(got, ref, n), mx = 0;
    for (size_t i = 0; i < n; ++i) mx = fmax(mx, fabs((double)got[i] - ref[i]));
    CHECK(e <= t->rel_l2, "%s: rel-L2 %g vs CPU reference (limit %g)", label, e, t->rel_l2);
    printf("%-34s vs cpu: max|diff| %.3e  rel-L2 %.3e\n", label, mx, e);
}

/* A backend's LSE against the CPU reference's. */
static void compare_lse(const char *label, const float *got, const float *ref, size_t n) {
    CHECK(all_finite(got, n), "%s: NaN/Inf or unwritten LSE", label);
    size_t bad = 0;
    double mx = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= LSE_ATOL + LSE_RTOL * fabs(ref[i]))) {
            if (bad < 3)
                fprintf(stderr, "  %s: lse[%zu] %.9g vs cpu %.9g\n", label, i, (double)got[i],
                        (double)ref[i]);
            ++bad;
        }
        if (d > mx) mx = d;
    }
    CHECK(bad == 0, "%s: %zu LSE values outside atol %g + rtol %g", label, bad, LSE_ATOL, LSE_RTOL);
    printf("%-34s vs cpu: LSE max|diff| %.3e\n", label, mx);
}

static void run_case(int ci, int perf) {
    const tcase *c = &CASES[ci];
    host_io h = make_case(c);
    float *exact = malloc(h.nq * 4), *ref = malloc(h.nq * 4), *got = malloc(h.nq * 4);
    float *lref = malloc(lse_count(c) * 4), *lgot = malloc(lse_count(c) * 4);
    double ms = 0;
    CHECK(run_cpu(c, &h, "exact", exact, NULL, NULL) == QVA_OK, "case %d exact: %s", ci,
          qva_last_error());
    const int cuda = qva_cuda_available();
    for (int m = 0; m < NTOLS; ++m) {
        const tol *t = &TOLS[m];
        char label[96];
        snprintf(label, sizeof label, "case %d %s", ci, t->method);
        if (c->Nq != c->Nk && !strncmp(t->method, "vc", 2)) continue; /* self-attn only */
        qva_status st = run_cpu(c, &h, t->method, ref, lref, &ms);
        CHECK(st == QVA_OK, "%s cpu: %s", label, qva_last_error());
        CHECK(all_finite(ref, h.nq), "%s cpu: NaN/Inf or unwritten output", label);
        CHECK(all_finite(lref, lse_count(c)), "%s cpu: NaN/Inf or unwritten LSE", label);
        double e = rel_l2(ref, exact, h.nq);
        CHECK(e < t->ceiling_vs_exact, "%s cpu: rel-L2 %g vs exact (ceiling %g)", label, e,
              t->ceiling_vs_exact);
        if (perf) printf("%-28s cpu  %8.2f ms  rel-L2 vs exact %.3e\n", label, ms, e);
        qva_config cfg;
        qva_config_default(&cfg);
        qva_config_set_method(&cfg, t->method);
        if (!cuda || !qva_supports(QVA_DEVICE_CUDA, &cfg, c->dt, c->D, NULL, 0)) continue;
        CHECK(run_cuda(c, &h, t->method, got, lgot) == QVA_OK, "%s cuda: %s", label,
              qva_last_error());
        compare_backend(label, t, got, ref, h.nq);
        compare_lse(label, lgot, lref, lse_count(c));
    }
    free(exact), free(ref), free(got), free(lref), free(lgot);
    free_case(&h);
}

int main(int argc, char **argv) {
    int perf = argc > 1 && !strcmp(argv[1], "perf");
    printf("backends: cpu%s\n", qva_cuda_available() ? ", cuda" : " (cuda not present)");
    for (int i = 0; i < NCASES; ++i) run_case(i, perf);
    return check_summary("test_backend");
}
