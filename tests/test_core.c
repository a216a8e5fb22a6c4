/* Core API: method parsing, the step schedule, bad inputs, the permutation
 * and V-Smooth identities, layouts and dtypes, the build's description. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

static float frand(void) { return (float)(2.0 * rng_unit() - 1.0); } /* [-1, 1) */
static void fill(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; ++i) x[i] = amp * frand();
}

static void test_method_names(void) {
    qva_config c;
    qva_config_default(&c);
    const char *good[] = {"exact", "bf16", "fp8", "sage8", "vc8", "vc8+expcast",
                          "sage8+nohadamard", "sage8+fp32sum", "sage8+expcast",
                          "sage8+nohadamard+qblock+fp32sum", "fp8+hadamard+codesum",
                          "vc8+expcast+nohadamard", "sage4", "vc4",
                          "draft@85/0/7.5/7.5", "draft@85/0/0/15", "fp8+expcast",
                          "vc8+expcast-centred", "draft@85/0/7.5/7.5+expcast-centred",
                          "draft@85/0/7.5/7.5+fp16acc", "draft@85/0/7.5/7.5+expcast+qblock+fp16acc",
                          "draft@p95/0/50/50+fp16acc"};
    for (size_t i = 0; i < sizeof good / sizeof *good; ++i) {
        char buf[64];
        CHECK(qva_config_set_method(&c, good[i]) == QVA_OK, "%s: %s", good[i], qva_last_error());
        CHECK(qva_config_method_name(&c, buf, sizeof buf) == QVA_OK, "name");
        CHECK(!strcmp(buf, good[i]), "round trip %s -> %s", good[i], buf);
    }
    CHECK(qva_config_set_method(&c, "draft@85/0/7.5/7.5") == QVA_OK, "draft");
    CHECK_NEAR(c.draft.frac_skip, 0.85, 1e-6, "skip");
    CHECK_NEAR(c.draft.frac8, 0.075, 1e-6, "f8");
    CHECK(qva_config_set_method(&c, "sage8+expcast-centred") == QVA_OK &&
              c.expcast == QVA_EXPCAST_CENTRED, "+expcast-centred sets QVA_EXPCAST_CENTRED");
    CHECK(qva_config_set_method(&c, "sage8+expcast") == QVA_OK && c.expcast == QVA_EXPCAST_PAPER,
          "+expcast sets QVA_EXPCAST_PAPER");
    const char *bad[] = {"", "vc9", "exact+expcast", "bf16+hadamard", "draft",
                         "draft@85/0/7.5", "draft@90/0/7.5/7.5", "draft@-5/5/50/50",
                         "vc8+turbo", "sage8@1/2/3/4", "draft@85/0/7.5/7.5x",
                         "vc4+expcast", "vc8+expcast+expcast-centred",
                         "sage8+expcast-centred+expcast", "bf16+expcast-centred",
                         "vc8+expcast-centre", "bf16+nohadamard", "draft@85/0/0/15+nohadamard",
                         "sage8+hadamard+nohadamard", "sage8+codesum+fp32sum",
                         "sage8+expcast+fp32sum", "vc8+expcast+fp32sum", "sage8+fp16acc",
                         "vc8+expcast+fp16acc", "draft@85/0/0/15+fp16acc+fp16acc"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        qva_config before = c;
        CHECK(qva_config_set_method(&c, bad[i]) == QVA_ERR_PARSE, "'%s' accepted", bad[i]);
        CHECK(strlen(qva_last_error()) > 0, "'%s' gave no message", bad[i]);
        CHECK(!memcmp(&before, &c, sizeof c), "'%s' modified cfg on error", bad[i]);
    }
}

/* sage8's and vc8's defaults (docs/NUMERICS.md §3): the name sets both
 * methods' rotation and code sum unless a suffix says otherwise; other
 * methods default to neither; a config set by hand is named by its fields. */
static void test_method_defaults(void) {
    static const struct {
        const char *name, *canonical;
        int hadamard, p_sum;
    } C[] = {
        {"sage8", "sage8", 1, QVA_P_SUM_CODES},
        {"sage8+hadamard+codesum", "sage8", 1, QVA_P_SUM_CODES},
        {"sage8+nohadamard", "sage8+nohadamard", 0, QVA_P_SUM_CODES},
        {"sage8+fp32sum", "sage8+fp32sum", 1, QVA_P_SUM_FP32},
        {"sage8+expcast", "sage8+expcast", 1, QVA_P_SUM_FP32},
        {"sage8+fp32sum+nohadamard+qblock", "sage8+nohadamard+qblock+fp32sum", 0, QVA_P_SUM_FP32},
        {"vc8", "vc8", 1, QVA_P_SUM_CODES},
        {"vc8+hadamard+codesum", "vc8", 1, QVA_P_SUM_CODES},
        {"vc8+nohadamard", "vc8+nohadamard", 0, QVA_P_SUM_CODES},
        {"vc8+nohadamard+fp32sum", "vc8+nohadamard+fp32sum", 0, QVA_P_SUM_FP32},
        {"vc8+expcast", "vc8+expcast", 1, QVA_P_SUM_FP32},
        {"vc8+expcast+nohadamard", "vc8+expcast+nohadamard", 0, QVA_P_SUM_FP32},
        {"vc8+v2", "vc8+v2", 1, QVA_P_SUM_CODES},
        {"vc8+nohadamard+qblock+fp32sum", "vc8+nohadamard+qblock+fp32sum", 0, QVA_P_SUM_FP32},
        {"fp8+codesum", "fp8+codesum", 0, QVA_P_SUM_CODES},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; ++i) {
        qva_config c;
        qva_config_default(&c);
        c.hadamard = 1 - C[i].hadamard; /* the name overrides what was there */
        char buf[64] = "";
        CHECK(qva_config_set_method(&c, C[i].name) == QVA_OK, "%s: %s", C[i].name,
              qva_last_error());
        CHECK(c.hadamard == C[i].hadamard && c.p_sum == C[i].p_sum,
              "%s: hadamard %d p_sum %d", C[i].name, c.hadamard, c.p_sum);
        CHECK(qva_config_method_name(&c, buf, sizeof buf) == QVA_OK &&
                  !strcmp(buf, C[i].canonical), "%s named %s", C[i].name, buf);
    }
    qva_config c;
    qva_config_default(&c);
    c.method = QVA_METHOD_SAGE8; /* by hand: the struct's zeros */
    c.expcast = 0;
    char buf[64] = "";
    CHECK(qva_config_method_name(&c, buf, sizeof buf) == QVA_OK &&
              !strcmp(buf, "sage8+nohadamard+fp32sum"), "sage8 by hand named %s", buf);
    c.method = QVA_METHOD_VC8;
    CHECK(qva_config_method_name(&c, buf, sizeof buf) == QVA_OK &&
              !strcmp(buf, "vc8+nohadamard+fp32sum"), "vc8 by hand named %s", buf);
}

/* VC App. A: window ceil(n/4), refresh every 4 steps inside it. */
static void test_schedule(void) {
    qva_config c;
    qva_config_default(&c);
    struct { int n; const char *expect; } cases[] = {
        {8, "GR"},          /* window 2: group 0, reuse 1 */
        {40, "GRRRGRRRGR"}, /* window 10: group 0, 4, 8   */
        {50, "GRRRGRRRGRRRG"}}; /* window 13: 0,4,8,12  */
    for (size_t t = 0; t < 3; ++t) {
        int n = cases[t].n, w = (int)strlen(cases[t].expect);
        for (int s = 0; s < n; ++s) {
            qva_step_action a = qva_schedule_action(&c.vsmooth, s, n);
            char got = a == QVA_STEP_GROUP ? 'G' : a == QVA_STEP_REUSE ? 'R' : 'P';
            char want = s < w ? cases[t].expect[s] : 'P';
            CHECK(got == want, "n=%d step %d: %c, want %c", n, s, got, want);
        }
    }
    CHECK(qva_schedule_action(&c.vsmooth, 7, 0) == QVA_STEP_GROUP, "unknown n groups");
    c.vsmooth.schedule = QVA_SCHEDULE_ALWAYS;
    CHECK(qva_schedule_action(&c.vsmooth, 30, 40) == QVA_STEP_GROUP, "always");
    /* demean: the paper's window, then reuse (demean) where it runs plain */
    c.vsmooth.schedule = QVA_SCHEDULE_DEMEAN;
    for (int s = 0; s < 40; ++s) {
        qva_step_action a = qva_schedule_action(&c.vsmooth, s, 40);
        qva_step_action want = s < 10 && s % 4 == 0 ? QVA_STEP_GROUP : QVA_STEP_REUSE;
        CHECK(a == want, "demean n=40 step %d: %d, want %d", s, (int)a, (int)want);
    }
    CHECK(qva_schedule_action(&c.vsmooth, 7, 0) == QVA_STEP_GROUP, "demean, unknown n groups");
}

typedef struct io_bufs {
    float *q, *k, *v, *o;
    int B, H, N, D;
} io_bufs;

static io_bufs make_io(int B, int H, int N, int D) {
    io_bufs b = {NULL, NULL, NULL, NULL, B, H, N, D};
    size_t n = (size_t)B * H * N * D;
    b.q = malloc(n * 4), b.k = malloc(n * 4), b.v = malloc(n * 4), b.o = malloc(n * 4);
    fill(b.q, n, 2.0f);
    fill(b.k, n, 2.0f);
    fill(b.v, n, 1.0f);
    return b;
}
static void free_io(io_bufs *b) { free(b->q), free(b->k), free(b->v), free(b->o); }

static qva_status run_hnd(qva_context_t *ctx, const char *method, io_bufs *b) {
    qva_config c;
    qva_config_default(&c);
    if (qva_config_set_method(&c, method) != QVA_OK) return QVA_ERR_PARSE;
    qva_tensor q = qva_tensor_hnd(b->q, QVA_F32, QVA_DEVICE_CPU, b->B, b->H, b->N, b->D);
    qva_tensor k = qva_tensor_hnd(b->k, QVA_F32, QVA_DEVICE_CPU, b->B, b->H, b->N, b->D);
    qva_tensor v = qva_tensor_hnd(b->v, QVA_F32, QVA_DEVICE_CPU, b->B, b->H, b->N, b->D);
    qva_tensor o = qva_tensor_hnd(b->o, QVA_F32, QVA_DEVICE_CPU, b->B, b->H, b->N, b->D);
    return qva_attention(ctx, &c, &q, &k, &v, &o, NULL);
}

/* At least 20 bad calls, each a specific status and a message. */
static void test_bad_inputs(qva_context_t *ctx) {
    io_bufs b = make_io(1, 2, 40, 64);
    qva_config c;
    qva_config_default(&c);
    /* the cases below set other methods by hand: fields every method takes */
    qva_config_set_method(&c, "sage8+nohadamard+fp32sum");
    qva_tensor q = qva_tensor_hnd(b.q, QVA_F32, QVA_DEVICE_CPU, 1, 2, 40, 64);
    qva_tensor k = q, v = q, o = q, lse;
    k.data = b.k, v.data = b.v, o.data = b.o;
    float lbuf[80];
    lse = qva_tensor_hnd(lbuf, QVA_F32, QVA_DEVICE_CPU, 1, 2, 40, 1);
    CHECK(qva_attention(ctx, &c, &q, &k, &v, &o, &lse) == QVA_OK, "baseline: %s", qva_last_error());

    int nr = 0;
#define BAD(expr, st, label)                                                     \
    do {                                                                         \
        qva_tensor q2 = q, k2 = k, v2 = v, o2 = o, l2 = lse;                     \
        qva_config c2 = c;                                                       \
        (void)q2, (void)k2, (void)v2, (void)o2, (void)l2, (void)c2;              \
        expr;                                                                    \
        qva_status got = qva_attention(ctx, &c2, &q2, &k2, &v2, &o2, &l2);       \
        CHECK(got == (st), "%s: got %s (%s)", label, qva_status_string(got),     \
              qva_last_error());                                                 \
        CHECK(strlen(qva_last_error()) > 0, "%s: no message", label);            \
        ++nr;                                                                    \
    } while (0)
    BAD(q2.data = NULL, QVA_ERR_INVALID_ARGUMENT, "q data NULL");
    BAD(q2.dtype = (qva_dtype)7, QVA_ERR_DTYPE, "unknown dtype");
    BAD(q2.device = QVA_DEVICE_CUDA, QVA_ERR_INVALID_ARGUMENT, "device mismatch");
    BAD(q2.shape[2] = 0, QVA_ERR_SHAPE, "N = 0");
    BAD(k2.shape[2] = 0, QVA_ERR_SHAPE, "k N = 0");
    BAD(q2.shape[3] = 192; k2.shape[3] = 192; v2.shape[3] = 192; o2.shape[3] = 192,
        QVA_ERR_UNSUPPORTED, "D = 192 (> QVA_MAX_HEAD_DIM)");
    BAD(k2.shape[1] = 1, QVA_ERR_SHAPE, "k and v heads differ");
    BAD(o2.shape[1] = 1, QVA_ERR_SHAPE, "out heads differ from q's");
    BAD(v2.shape[2] = 39, QVA_ERR_SHAPE, "k/v N mismatch");
    BAD(o2.shape[2] = 39, QVA_ERR_SHAPE, "out rows mismatch");
    BAD(q2.stride[3] = 2, QVA_ERR_SHAPE, "non-contiguous D");
    BAD(q2.stride[1] = -1, QVA_ERR_SHAPE, "negative stride");
    BAD(q2.shape[0] = -3, QVA_ERR_SHAPE, "negative B");
    BAD(c2.method = (qva_method)99, QVA_ERR_INVALID_ARGUMENT, "unknown method");
    BAD(c2.sm_scale = -1.0f, QVA_ERR_INVALID_ARGUMENT, "negative sm_scale");
    BAD(c2.sm_scale = NAN, QVA_ERR_INVALID_ARGUMENT, "NaN sm_scale");
    BAD(c2.method = QVA_METHOD_EXACT; c2.expcast = 1, QVA_ERR_INVALID_ARGUMENT, "expcast on exact");
    BAD(c2.method = QVA_METHOD_BF16; c2.hadamard = 1, QVA_ERR_INVALID_ARGUMENT, "hadamard on bf16");
    BAD(c2.method = QVA_METHOD_VC8; c2.vsmooth.clusters = 0, QVA_ERR_INVALID_ARGUMENT, "0 clusters");
    BAD(c2.method = QVA_METHOD_VC8; c2.vsmooth.block = 64, QVA_ERR_UNSUPPORTED, "B_v 64");
    BAD(c2.method = QVA_METHOD_VC8; c2.vsmooth.schedule = (qva_schedule)3,
        QVA_ERR_INVALID_ARGUMENT, "unknown schedule");
    BAD(c2.step = -1, QVA_ERR_INVALID_ARGUMENT, "negative step");
    BAD(c2.step = 9; c2.num_steps = 8, QVA_ERR_INVALID_ARGUMENT, "step past schedule");
    BAD(l2.dtype = QVA_BF16, QVA_ERR_SHAPE, "lse dtype");
    BAD(l2.shape[3] = 2, QVA_ERR_SHAPE, "lse shape");
    BAD(b.v[77] = NAN, QVA_ERR_NONFINITE, "NaN in v");
    b.v[77] = 0.5f;
    BAD(b.q[5] = INFINITY, QVA_ERR_NONFINITE, "Inf in q");
    b.q[5] = 0.5f;
    BAD(c2.method = QVA_METHOD_VC8; q2.shape[2] = 20; o2.shape[2] = 20; l2.shape[2] = 20,
        QVA_ERR_SHAPE, "vc8 with Nq != Nk");
    BAD(c2.method = QVA_METHOD_DRAFT, QVA_ERR_INVALID_ARGUMENT, "draft without grid");
    BAD(c2.method = QVA_METHOD_DRAFT; c2.draft.grid_t = 1; c2.draft.grid_h = 5;
        c2.draft.grid_w = 5, QVA_ERR_SHAPE, "draft grid mismatch");
#undef BAD
    CHECK(nr >= 20, "only %d bad-input cases", nr);
    CHECK(qva_attention(NULL, &c, &q, &k, &v, &o, NULL) == QVA_ERR_INVALID_ARGUMENT, "NULL ctx");
    CHECK(qva_attention(ctx, NULL, &q, &k, &v, &o, NULL) == QVA_ERR_INVALID_ARGUMENT, "NULL cfg");
    CHECK(qva_attention(ctx, &c, &q, NULL, &v, &o, NULL) == QVA_ERR_INVALID_ARGUMENT, "NULL k");
    qva_context_t *bad = NULL;
    CHECK(qva_context_create(&bad, (qva_device)5) == QVA_ERR_INVALID_ARGUMENT, "bad device");
    CHECK(bad == NULL, "ctx set on failure");
    CHECK(qva_context_create(NULL, QVA_DEVICE_CPU) == QVA_ERR_INVALID_ARGUMENT, "NULL out");
    for (int s = 0; s <= (int)QVA_ERR_IO; ++s)
        CHECK(strcmp(qva_status_string((qva_status)s), "unknown status") != 0, "status %d", s);
    free_io(&b);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; ++i) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* Permuting K and V together leaves non-causal attention unchanged (VC Eq.
 * 3): exact with permuted K,V equals the unpermuted result to FP64
 * rounding (then rounded to f32). */
static void test_permutation_invariance(qva_context_t *ctx) {
    const int N = 300, D = 64;
    io_bufs a = make_io(1, 1, N, D), p = make_io(1, 1, N, D);
    int32_t perm[300];
    for (int i = 0; i < N; ++i) perm[i] = i;
    for (int i = N - 1; i > 0; --i) { /* Fisher-Yates */
        int j = (int)((frand() * 0.5f + 0.5f) * (float)(i + 1)) % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    memcpy(p.q, a.q, (size_t)N * D * 4);
    for (int i = 0; i < N; ++i) {
        memcpy(p.k + (size_t)i * D, a.k + (size_t)perm[i] * D, D * 4);
        memcpy(p.v + (size_t)i * D, a.v + (size_t)perm[i] * D, D * 4);
    }
    CHECK(run_hnd(ctx, "exact", &a) == QVA_OK, "exact");
    CHECK(run_hnd(ctx, "exact", &p) == QVA_OK, "exact permuted");
    double e = max_abs_diff(a.o, p.o, (size_t)N * D);
    CHECK(e <= 1e-6, "permuted exact differs by %g", e);
    free_io(&a), free_io(&p);
}

/* VC Eq. 4-6 without quantization loss: values built so that the residual
 * after block demeaning is exactly representable in E4M3 at the channel
 * scale, and the means exactly in FP16; the 8-bit value operand then
 * reconstructs V exactly, and the Eq. 6 recurrence (run here in FP64 on the
 * reconstruction) reproduces exact attention. */
static void test_demean_restore(void) {
    const int N = 256, D = 64, nblk = 2;
    float *v = malloc((size_t)N * D * 4);
    const float levels[5] = {-2.25f, -1.0f, 0.0f, 1.0f, 2.25f};
    for (int j = 0; j < nblk; ++j)
        for (int c = 0; c < D; ++c) {
            float mu = 0.5f * (float)((j * 7 + c) % 9) - 2.0f;
            float scale = ldexpf(1.0f, (c % 5) - 2);
            for (int i = 0; i < 128; ++i) { /* symmetric levels: mean is mu */
                int li = (i < 64) ? (i % 5) : 4 - ((i - 64) % 5);
                v[((size_t)j * 128 + i) * D + c] = mu + scale * levels[li];
            }
        }
    qvi_v8 x;
    CHECK(qvi_v8_prepare(v, N, D, NULL, 1, QVA_V_E4M3, &x) == QVA_OK, "prepare");
    double worst = 0;
    for (int i = 0; i < N; ++i)
        for (int c = 0; c < D; ++c) {
            double rec = ((double)qva_e4m3_decode(x.codes[(size_t)i * D + c]) +
                          x.mu_hat[(size_t)(i / 128) * D + c]) * x.chan_scale[c];
            worst = fmax(worst, fabs(rec - v[(size_t)i * D + c]));
        }
    CHECK(worst == 0.0, "lossless demean/restore off by %g", worst);
    /* Eq. 6 in FP64: A += P R + r mu^T per block equals P V. */
    float q[64];
    fill(q, D, 1.0f);
    double m = -INFINITY, l = 0, A[64] = {0}, ref[64] = {0}, lref = 0, s[256];
    for (int t = 0; t < N; ++t) {
        s[t] = 0;
        for (int c = 0; c < D; ++c) s[t] += (double)q[c] * v[(size_t)t * D + c] * 0.125;
    }
    double mref = -INFINITY;
    for (int t = 0; t < N; ++t) mref = fmax(mref, s[t]);
    for (int t = 0; t < N; ++t) {
        double p = exp(s[t] - mref);
        lref += p;
        for (int c = 0; c < D; ++c) ref[c] += p * v[(size_t)t * D + c];
    }
    for (int j = 0; j < nblk; ++j) {
        double mn = m;
        for (int t = j * 128; t < j * 128 + 128; ++t) mn = fmax(mn, s[t]);
        double alpha = exp(m - mn), r = 0, part[64] = {0};
        for (int t = j * 128; t < j * 128 + 128; ++t) {
            double p = exp(s[t] - mn);
            r += p;
            for (int c = 0; c < D; ++c)
                part[c] += p * qva_e4m3_decode(x.codes[(size_t)t * D + c]);
        }
        l = alpha * l + r;
        for (int c = 0; c < D; ++c)
            A[c] = alpha * A[c] + part[c] + r * x.mu_hat[(size_t)j * D + c];
        m = mn;
    }
    double err = 0;
    for (int c = 0; c < D; ++c)
        err = fmax(err, fabs(A[c] * x.chan_scale[c] / l - ref[c] / lref));
    CHECK(err < 1e-12, "Eq. 6 restore differs from exact by %g", err);
    qvi_v8_free(&x);
    free(v);
}

/* NHD and HND memory give bit-identical results; bf16/f16 inputs work. */
static void test_layouts_dtypes(qva_context_t *ctx) {
    const int B = 2, H = 3, N = 150, D = 64;
    const size_t n = (size_t)B * H * N * D;
    io_bufs a = make_io(B, H, N, D);
    float *qn = malloc(n * 4), *kn = malloc(n * 4), *vn = malloc(n * 4), *on = malloc(n * 4);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int i = 0; i < N; ++i)
                for (int c = 0; c < D; ++c) {
                    size_t hnd = (((size_t)b * H + h) * N + i) * D + c;
                    size_t nhd = (((size_t)b * N + i) * H + h) * D + c;
                    qn[nhd] = a.q[hnd], kn[nhd] = a.k[hnd], vn[nhd] = a.v[hnd];
                }
    const char *methods[] = {"bf16", "sage8", "vc8+expcast", "fp8+hadamard", "vc4"};
    for (int m = 0; m < 5; ++m) {
        qva_config c;
        qva_config_default(&c);
        qva_config_set_method(&c, methods[m]);
        qva_tensor q = qva_tensor_hnd(a.q, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
        qva_tensor k = qva_tensor_hnd(a.k, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
        qva_tensor v = qva_tensor_hnd(a.v, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
        qva_tensor o = qva_tensor_hnd(a.o, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
        qva_tensor q2 = qva_tensor_nhd(qn, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
        qva_tensor k2 = qva_tensor_nhd(kn, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
        qva_tensor v2 = qva_tensor_nhd(vn, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
        qva_tensor o2 = qva_tensor_nhd(on, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
        CHECK(qva_attention(ctx, &c, &q, &k, &v, &o, NULL) == QVA_OK, "%s hnd", methods[m]);
        qva_context_reset(ctx); /* fresh V-Smooth state for the second run */
        CHECK(qva_attention(ctx, &c, &q2, &k2, &v2, &o2, NULL) == QVA_OK, "%s nhd", methods[m]);
        double worst = 0;
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h)
                for (int i = 0; i < N; ++i)
                    for (int cc = 0; cc < D; ++cc) {
                        size_t hnd = (((size_t)b * H + h) * N + i) * D + cc;
                        size_t nhd = (((size_t)b * N + i) * H + h) * D + cc;
                        worst = fmax(worst, fabs(a.o[hnd] - on[nhd]));
                    }
        CHECK(worst == 0.0, "%s: NHD vs HND differ by %g", methods[m], worst);
    }
    /* bf16 storage of the same (bf16-representable) inputs matches f32. */
    uint16_t *qb = malloc(n * 2), *kb = malloc(n * 2), *vb = malloc(n * 2), *ob = malloc(n * 2);
    for (size_t i = 0; i < n; ++i) {
        a.q[i] = qva_round_bf16(a.q[i]), a.k[i] = qva_round_bf16(a.k[i]), a.v[i] = qva_round_bf16(a.v[i]);
        uint32_t u;
        memcpy(&u, &a.q[i], 4), qb[i] = (uint16_t)(u >> 16);
        memcpy(&u, &a.k[i], 4), kb[i] = (uint16_t)(u >> 16);
        memcpy(&u, &a.v[i], 4), vb[i] = (uint16_t)(u >> 16);
    }
    qva_config c;
    qva_config_default(&c);
    qva_config_set_method(&c, "sage8");
    qva_tensor q = qva_tensor_hnd(a.q, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor k = qva_tensor_hnd(a.k, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor v = qva_tensor_hnd(a.v, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor o = qva_tensor_hnd(a.o, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor q2 = qva_tensor_hnd(qb, QVA_BF16, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor k2 = qva_tensor_hnd(kb, QVA_BF16, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor v2 = qva_tensor_hnd(vb, QVA_BF16, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor o2 = qva_tensor_hnd(ob, QVA_BF16, QVA_DEVICE_CPU, B, H, N, D);
    CHECK(qva_attention(ctx, &c, &q, &k, &v, &o, NULL) == QVA_OK, "f32");
    CHECK(qva_attention(ctx, &c, &q2, &k2, &v2, &o2, NULL) == QVA_OK, "bf16");
    double worst = 0;
    for (size_t i = 0; i < n; ++i)
        worst = fmax(worst, fabs(qvi_load_elem(&o2, (int64_t)i) - qva_round_bf16(a.o[i])));
    CHECK(worst == 0.0, "bf16 storage differs by %g", worst);
    free(qb), free(kb), free(vb), free(ob);
    free(qn), free(kn), free(vn), free(on);
    free_io(&a);
}

/* The V-Smooth state follows the schedule: grouping steps recompute the
 * permutation, reuse and plain steps keep it; layers are separate. */
static void test_schedule_state(qva_context_t *ctx) {
    io_bufs a = make_io(1, 1, 256, 64);
    qva_config c;
    qva_config_default(&c);
    qva_config_set_method(&c, "vc8");
    c.num_steps = 8;
    qva_tensor q = qva_tensor_hnd(a.q, QVA_F32, QVA_DEVICE_CPU, 1, 1, 256, 64);
    qva_tensor k = q, v = q, o = q;
    k.data = a.k, v.data = a.v, o.data = a.o;
    qva_context_reset(ctx);
    for (int s = 0; s < 8; ++s) {
        c.step = s;
        CHECK(qva_attention(ctx, &c, &q, &k, &v, &o, NULL) == QVA_OK, "step %d", s);
        qvi_vs_state *st = qvi_context_vs_state(ctx, 0, 0, 0);
        CHECK(st && st->perm, "no permutation after step %d", s);
        CHECK(st && st->last_group_step == 0, "step %d regrouped (last %d)", s,
              st ? st->last_group_step : -9);
    }
    c.layer = 3;
    c.step = 5; /* no state yet for layer 3: it must group now */
    CHECK(qva_attention(ctx, &c, &q, &k, &v, &o, NULL) == QVA_OK, "layer 3");
    qvi_vs_state *st = qvi_context_vs_state(ctx, 3, 0, 0);
    CHECK(st && st->last_group_step == 5, "layer 3 did not group on first use");
    free_io(&a);
}

/* LSE is that of the unsmoothed scores for every method: K smoothing's
 * per-row shift is added back (it was off by up to ~3.5 before). */
static void test_lse(qva_context_t *ctx) {
    const int N = 200, D = 64;
    io_bufs a = make_io(1, 2, N, D);
    for (size_t i = 0; i < (size_t)2 * N * D; ++i) a.k[i] += 1.5f; /* common K */
    float ref[400], got[400];
    const char *methods[] = {"bf16", "fp8", "sage8", "vc8+expcast", "sage8+nohadamard+fp32sum",
                             "sage4"};
    const double tol[] = {0.02, 0.25, 0.05, 0.05, 0.05, 0.2};
    for (int m = -1; m < 6; ++m) {
        qva_config c;
        qva_config_default(&c);
        qva_config_set_method(&c, m < 0 ? "exact" : methods[m]);
        qva_tensor q = qva_tensor_hnd(a.q, QVA_F32, QVA_DEVICE_CPU, 1, 2, N, D);
        qva_tensor k = q, v = q, o = q;
        k.data = a.k, v.data = a.v, o.data = a.o;
        qva_tensor l = qva_tensor_hnd(m < 0 ? ref : got, QVA_F32, QVA_DEVICE_CPU, 1, 2, N, 1);
        CHECK(qva_attention(ctx, &c, &q, &k, &v, &o, &l) == QVA_OK, "lse run");
        if (m < 0) continue;
        double worst = 0;
        for (int i = 0; i < 2 * N; ++i) worst = fmax(worst, fabs((double)got[i] - ref[i]));
        CHECK(worst < tol[m], "%s: LSE off by %g (tol %g)", methods[m], worst, tol[m]);
    }
    free_io(&a);
}

/* The lazy timings (what the CUDA backend leaves after a profiled call):
 * read once, when asked, and kept; resolved by a reset; dropped by a
 * direct set; a failed read gives its status and zeros. */
static int lazy_reads;
static qva_status lazy_read(void *arg, qva_timings *t) {
    ++lazy_reads;
    t->grouping_ms = 1.0f, t->prep_ms = 2.0f, t->kernel_ms = *(const float *)arg;
    return QVA_OK;
}
static qva_status lazy_read_fails(void *arg, qva_timings *t) {
    (void)arg;
    t->kernel_ms = 9.0f;
    return qvi_fail(QVA_ERR_DEVICE, "test: the events are gone");
}

static void test_lazy_timings(qva_context_t *ctx) {
    float k = 3.0f;
    qva_timings t;
    lazy_reads = 0;
    qvi_context_set_timings_lazy(ctx, lazy_read, &k);
    CHECK(lazy_reads == 0, "not read before it is asked for");
    CHECK(qva_context_last_timings(ctx, &t) == QVA_OK && t.prep_ms == 2.0f && t.kernel_ms == 3.0f,
          "read when asked: %g %g", (double)t.prep_ms, (double)t.kernel_ms);
    k = 4.0f;
    CHECK(qva_context_last_timings(ctx, &t) == QVA_OK && t.kernel_ms == 3.0f && lazy_reads == 1,
          "read once and kept (%d reads)", lazy_reads);
    qvi_context_set_timings_lazy(ctx, lazy_read, &k);
    CHECK(qva_context_reset(ctx) == QVA_OK && lazy_reads == 2, "a reset reads them first");
    CHECK(qva_context_last_timings(ctx, &t) == QVA_OK && t.kernel_ms == 4.0f && lazy_reads == 2,
          "kept through the reset: %g", (double)t.kernel_ms);
    qvi_context_set_timings_lazy(ctx, lazy_read, &k);
    const qva_timings direct = {0.5f, 0.25f, 0.125f};
    qvi_context_set_timings(ctx, &direct);
    CHECK(qva_context_last_timings(ctx, &t) == QVA_OK && t.kernel_ms == 0.125f && lazy_reads == 2,
          "a direct set drops the pending read");
    qvi_context_set_timings_lazy(ctx, lazy_read_fails, NULL);
    CHECK(qva_context_last_timings(ctx, &t) == QVA_ERR_DEVICE && t.kernel_ms == 0.0f,
          "a failed read: its status and zeros");
    CHECK(qva_context_last_timings(ctx, &t) == QVA_OK && t.kernel_ms == 0.0f, "then read no more");
}

/* qva_build_info() ends with the source's commit (cmake/build_commit.cmake):
 * ", git " then 7 or more hex digits, "+dirty" optionally, or "unknown". */
static void test_build_info(void) {
    const char *s = qva_build_info(), *g = strstr(s, ", git ");
    int ok = !strncmp(s, "qvattn ", 7) && g != NULL;
    if (ok) {
        const char *c = g + 6;
        size_t hex = strspn(c, "0123456789abcdef");
        const char *rest = c + hex;
        ok = (hex >= 7 && (!strcmp(rest, ")") || !strcmp(rest, "+dirty)"))) || !strcmp(c, "unknown)");
    }
    CHECK(ok, "qva_build_info names its commit: \"%s\"", s);
}

int main(void) {
    qva_context_t *ctx = NULL;
    test_build_info();
    if (qva_context_create(&ctx, QVA_DEVICE_CPU) != QVA_OK) return 1;
    test_method_names();
    test_method_defaults();
    test_schedule();
    test_bad_inputs(ctx);
    test_permutation_invariance(ctx);
    test_demean_restore();
    test_layouts_dtypes(ctx);
    test_schedule_state(ctx);
    test_lse(ctx);
    test_lazy_timings(ctx);
    qva_context_free(ctx);
    return check_summary("test_core");
}
