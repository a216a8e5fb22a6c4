/*
 * What a layer's calls carry to the next (docs/NUMERICS.md §3) on the CPU
 * reference.
 * cfg.k_mean = QVA_K_MEAN_PREVIOUS ("+kprev", "K's mean from the previous
 * call"):
 *  (a) parsing, naming and validation: sage8 and vc8 only;
 *  (b) a layer's first call, and every stateless call, is the method
 *      without +kprev bit for bit (it smooths with its own mean);
 *  (c) the mean a call leaves tracks K: after a call whose K moved by a
 *      large offset from the one before, the stored mean is that K's
 *      channel mean within the code error (rotated and not), and the
 *      call's output stays near exact attention;
 *  (d) a small drift of K between calls costs at most a few percent of
 *      the method's error, and the LSE stays the unsmoothed one;
 *  (e) grouped K/V heads: the calls are those of K/V repeated per query
 *      head, bit for bit; a layer whose heads change shape restarts;
 *  (f) a non-finite K leaves no mean, so the next call is its own.
 * The CUDA form is held to these means bit for bit by test_backend
 * (run_carried), and +vprev's V scales too.
 * cfg.v_scale = QVA_V_SCALE_PREVIOUS ("+vprev", "V's scale from the
 * previous call"):
 *  (g) parsing: sage8 and vc8 with one E4M3 digit of V;
 *  (h) first calls are the method's own bit for bit; a call after V grew
 *      1.5-fold uses the carried scales (its output differs, its error
 *      within 10% of the method's: one draw of a spread whose mean is the
 *      method's, NUMERICS §3) and leaves its own; a 300-fold growth (codes
 *      past E4M3's 448) makes the head use its own scales, bit for bit the
 *      method's; so do V-Smooth's demeaning steps, always;
 *  (i) grouped K/V heads as repeated ones, and the restart, with both
 *      options.
 */
#define TEST_RNG_SEED 0x6B9E7A11C0FFEEull
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "method_option.h"

enum { B = 1, N = 300, LAYER = 7 };

static void fill(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; ++i) x[i] = amp * (float)(2.0 * rng_unit() - 1.0);
}

typedef struct call {
    int H, Hk, D;
    float *q, *k, *v, *out, *lse;
} call;

static call make_call(int H, int Hk, int D) {
    call c = {H, Hk, D, NULL, NULL, NULL, NULL, NULL};
    const size_t nq = (size_t)B * H * N * D, nk = (size_t)B * Hk * N * D;
    c.q = malloc(nq * sizeof(float)), c.k = malloc(nk * sizeof(float));
    c.v = malloc(nk * sizeof(float)), c.out = malloc(nq * sizeof(float));
    c.lse = malloc((size_t)B * H * N * sizeof(float));
    fill(c.q, nq, 1.5f), fill(c.k, nk, 1.5f), fill(c.v, nk, 1.0f);
    for (size_t i = 0; i < nk; ++i) c.k[i] += 0.8f; /* a common K component, as in DiTs */
    return c;
}

static void free_call(call *c) {
    free(c->q), free(c->k), free(c->v), free(c->out), free(c->lse);
}

/* The step of run()'s calls: a plain one (V-Smooth on the stored order). */
static int g_step = 20;

/* qva_attention of `method` at `layer` on c (out, lse filled). */
static qva_status run(qva_context_t *ctx, const char *method, int layer, call *c) {
    qva_config cfg;
    qva_config_default(&cfg);
    qva_status st = qva_config_set_method(&cfg, method);
    CHECK(st == QVA_OK, "%s: %s", method, qva_last_error());
    cfg.layer = layer;
    cfg.step = g_step, cfg.num_steps = 40;
    cfg.check_finite = 0;
    const qva_tensor q = qva_tensor_hnd(c->q, QVA_F32, QVA_DEVICE_CPU, B, c->H, N, c->D),
                     k = qva_tensor_hnd(c->k, QVA_F32, QVA_DEVICE_CPU, B, c->Hk, N, c->D),
                     v = qva_tensor_hnd(c->v, QVA_F32, QVA_DEVICE_CPU, B, c->Hk, N, c->D),
                     o = qva_tensor_hnd(c->out, QVA_F32, QVA_DEVICE_CPU, B, c->H, N, c->D),
                     l = qva_tensor_hnd(c->lse, QVA_F32, QVA_DEVICE_CPU, B, c->H, N, 1);
    if (st == QVA_OK) st = qva_attention(ctx, &cfg, &q, &k, &v, &o, &l);
    CHECK(st == QVA_OK, "%s layer %d: %s", method, layer, qva_last_error());
    return st;
}

static size_t out_elems(const call *c) { return (size_t)B * c->H * N * c->D; }

static double rel_l2(const float *a, const float *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; ++i) {
        const double d = (double)a[i] - ref[i];
        e += d * d, r += (double)ref[i] * ref[i];
    }
    return sqrt(e / r);
}

/* (a) ------------------------------------------------------------ parsing */
static void test_parse(void) {
    static const char *const ok[] = {"sage8+kprev", "vc8+kprev", "vc8+expcast+kprev",
                                     "sage8+nohadamard+kprev", "vc8+hadamard+i8pv+kprev"};
    static const char *const bad[] = {"fp8+kprev", "bf16+kprev", "sage4+kprev", "vc4+kprev",
                                      "exact+kprev", "draft@85/0/7.5/7.5+kprev",
                                      "sage8+kprev+kprev"};
    check_method_option(ok, sizeof ok / sizeof *ok, bad, sizeof bad / sizeof *bad,
                        offsetof(qva_config, k_mean), QVA_K_MEAN_PREVIOUS, QVA_K_MEAN_CALL,
                        "+kprev");
    qva_config c;
    qva_config_default(&c);
    CHECK(qva_config_set_method(&c, "sage8") == QVA_OK, "sage8");
    c.k_mean = 3;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "k_mean 3 refused");
    c.k_mean = QVA_K_MEAN_PREVIOUS;
    CHECK(option_call_check(&c) == QVA_OK, "sage8 + QVA_K_MEAN_PREVIOUS: %s", qva_last_error());
    CHECK(qva_config_set_method(&c, "fp8") == QVA_OK, "fp8");
    c.k_mean = QVA_K_MEAN_PREVIOUS;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "fp8 with QVA_K_MEAN_PREVIOUS refused");
    char why[256] = "";
    CHECK(qva_config_set_method(&c, "sage8+kprev") == QVA_OK &&
              !qva_supports(QVA_DEVICE_CUDA, &c, QVA_F32, 128, why, sizeof why) && why[0],
          "CUDA does not run +kprev on f32 inputs, and says why");
}

/* (b) ------------------------------------------------------------ first calls */
static void test_first_calls(const char *plain, const char *kprev) {
    call a = make_call(2, 2, 64), b = make_call(2, 2, 64);
    const size_t n = out_elems(&a), nl = n / a.D;
    float *out = malloc(n * sizeof *out), *lse = malloc(nl * sizeof *lse);
    qva_context_t *cp = NULL, *ck = NULL;
    CHECK(qva_context_create(&cp, QVA_DEVICE_CPU) == QVA_OK &&
              qva_context_create(&ck, QVA_DEVICE_CPU) == QVA_OK, "contexts");
    run(cp, plain, LAYER, &a);
    memcpy(out, a.out, n * sizeof *out), memcpy(lse, a.lse, nl * sizeof *lse);
    run(ck, kprev, LAYER, &a);
    CHECK(!memcmp(out, a.out, n * sizeof *out) && !memcmp(lse, a.lse, nl * sizeof *lse),
          "%s: a layer's first call is %s's", kprev, plain);
    for (int i = 0; i < 2; ++i) { /* stateless, after a call that left a mean */
        call *c = i ? &b : &a;
        run(cp, plain, QVA_LAYER_NONE, c);
        memcpy(out, c->out, n * sizeof *out);
        run(ck, kprev, QVA_LAYER_NONE, c);
        CHECK(!memcmp(out, c->out, n * sizeof *out), "%s: stateless call %d is %s's", kprev, i,
              plain);
    }
    qva_context_free(cp), qva_context_free(ck);
    free(out), free(lse);
    free_call(&a), free_call(&b);
}

/* (c) ------------------------------------------------------------ tracking */
/* The largest row 2-norm of x - mean: a bound on any rotated row's amax. */
static double max_row_norm(const float *x, const float *mean, int d) {
    double worst = 0;
    for (int r = 0; r < N; ++r) {
        double s = 0;
        for (int c = 0; c < d; ++c) {
            const double t = (double)x[(size_t)r * d + c] - mean[c];
            s += t * t;
        }
        worst = fmax(worst, sqrt(s));
    }
    return worst;
}

static void test_tracking(const char *plain, const char *kprev, int D) {
    call c = make_call(2, 2, D);
    const size_t n = out_elems(&c), nk = (size_t)N * D;
    float *ex = malloc(n * sizeof *ex), *pl = malloc(n * sizeof *pl);
    qva_context_t *ctx = NULL, *cx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK &&
              qva_context_create(&cx, QVA_DEVICE_CPU) == QVA_OK, "contexts");
    run(ctx, kprev, LAYER, &c);
    /* K moves by a per-channel offset of up to 3 (the keys' scale is 1.5) */
    for (int h = 0; h < c.Hk; ++h)
        for (int r = 0; r < N; ++r)
            for (int d = 0; d < D; ++d) c.k[h * nk + (size_t)r * D + d] += 3.0f * sinf(0.7f * d + h);
    run(ctx, kprev, LAYER, &c);
    memcpy(pl, c.out, n * sizeof *pl);
    run(cx, "exact", QVA_LAYER_NONE, &c);
    memcpy(ex, c.out, n * sizeof *ex);
    const double e_kprev = rel_l2(pl, ex, n);
    run(cx, plain, QVA_LAYER_NONE, &c);
    const double e_plain = rel_l2(c.out, ex, n);
    printf("  %s D %d after an offset of K: rel-L2 %.5f (%s %.5f)\n", kprev, D, e_kprev, plain,
           e_plain);
    CHECK(e_kprev < 4.0 * e_plain, "%s: rel-L2 %.5f against %s's %.5f with a stale mean", kprev,
          e_kprev, plain, e_plain);
    for (int h = 0; h < c.Hk; ++h) {
        float mean[128];
        qvi_channel_mean(c.k + h * nk, N, D, mean);
        const qvi_vs_state *st = qvi_context_vs_state(ctx, LAYER, 0, h);
        CHECK(st && st->kmean_d == D, "head %d: a mean of %d channels is stored", h, D);
        if (!st || st->kmean_d != D) continue;
        /* each code is within half a step (block amax / 127) of its value;
         * the rotation back spreads a channel's error over at most sqrt(D) */
        const double step = max_row_norm(c.k + h * nk, st->kmean, D) * 1.1 / 127.0 + 1e-6;
        double worst = 0;
        for (int d = 0; d < D; ++d) worst = fmax(worst, fabs((double)st->kmean[d] - mean[d]));
        CHECK(worst <= 0.5 * step * sqrt((double)D), "%s head %d: stored mean %.3g from K's "
              "(bound %.3g)", kprev, h, worst, 0.5 * step * sqrt((double)D));
        CHECK(worst < 0.05, "%s head %d: the stored mean follows the offset (%.3g off)", kprev,
              h, worst);
    }
    qva_context_free(ctx), qva_context_free(cx);
    free(ex), free(pl);
    free_call(&c);
}

/* (d) ------------------------------------------------------------ drift */
static void test_drift(const char *plain, const char *kprev) {
    call c = make_call(2, 2, 128);
    const size_t n = out_elems(&c), nl = n / c.D, nk = (size_t)c.Hk * N * c.D;
    float *ex = malloc(n * sizeof *ex), *ok = malloc(n * sizeof *ok), *lk = malloc(nl * 4);
    qva_context_t *ctx = NULL, *cx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK &&
              qva_context_create(&cx, QVA_DEVICE_CPU) == QVA_OK, "contexts");
    float *le = malloc(nl * 4);
    double sum_k = 0, sum_p = 0, lse_k = 0, lse_p = 0;
    for (int step = 0; step < 4; ++step) {
        run(ctx, kprev, LAYER, &c);
        memcpy(ok, c.out, n * sizeof *ok), memcpy(lk, c.lse, nl * 4);
        run(cx, "exact", QVA_LAYER_NONE, &c);
        memcpy(ex, c.out, n * sizeof *ex), memcpy(le, c.lse, nl * 4);
        run(cx, plain, QVA_LAYER_NONE, &c);
        sum_k += rel_l2(ok, ex, n), sum_p += rel_l2(c.out, ex, n);
        for (size_t i = 0; i < nl; ++i) { /* the LSE against exact's: the unsmoothed one */
            lse_k = fmax(lse_k, fabs((double)lk[i] - le[i]));
            lse_p = fmax(lse_p, fabs((double)c.lse[i] - le[i]));
        }
        for (size_t i = 0; i < nk; ++i) /* a denoising step's drift */
            c.k[i] += 0.05f * (float)(2.0 * rng_unit() - 1.0) + 0.02f;
    }
    printf("  %s over 4 drifting calls: mean rel-L2 %.5f (%s %.5f), LSE within %.2g of "
           "exact's (%.2g)\n", kprev, sum_k / 4, plain, sum_p / 4, lse_k, lse_p);
    CHECK(sum_k <= 1.05 * sum_p, "%s: %.5f against %s's %.5f", kprev, sum_k / 4, plain, sum_p / 4);
    CHECK(lse_k <= 1.5 * lse_p, "%s: LSE %.3g from exact's, %s %.3g", kprev, lse_k, plain, lse_p);
    qva_context_free(ctx), qva_context_free(cx);
    free(ex), free(ok), free(lk), free(le);
    free_call(&c);
}

/* (e), (i) ------------------------------------------------------ GQA */
/* `calls` calls of method on grouped K/V heads (4 query heads, 2 K/V) and
 * on the same K/V repeated per query head, K moving by 0.3 and V growing
 * by v_growth between calls: the outputs bit for bit equal. */
static void check_gqa(const char *method, int calls, float v_growth) {
    call g = make_call(4, 2, 64), r = make_call(4, 4, 64);
    const size_t nk = (size_t)N * 64, n = out_elems(&g);
    qva_context_t *cg = NULL, *cr = NULL;
    CHECK(qva_context_create(&cg, QVA_DEVICE_CPU) == QVA_OK &&
              qva_context_create(&cr, QVA_DEVICE_CPU) == QVA_OK, "contexts");
    memcpy(r.q, g.q, n * sizeof(float));
    for (int step = 0; step < calls; ++step) {
        for (int h = 0; h < 4; ++h) { /* K/V head h / 2, repeated */
            memcpy(r.k + h * nk, g.k + (h / 2) * nk, nk * sizeof(float));
            memcpy(r.v + h * nk, g.v + (h / 2) * nk, nk * sizeof(float));
        }
        run(cg, method, LAYER, &g);
        run(cr, method, LAYER, &r);
        CHECK(!memcmp(g.out, r.out, n * sizeof(float)), "%s call %d: grouped = repeated K/V",
              method, step);
        for (size_t i = 0; i < 2 * nk; ++i) g.k[i] += 0.3f, g.v[i] *= v_growth;
    }
    qva_context_free(cg), qva_context_free(cr);
    free_call(&g), free_call(&r);
}

/* A layer whose heads change shape (B, H, K/V heads) restarts: its next
 * call uses its own statistics, as a first call. */
static void test_shape_change(const char *plain, const char *carried) {
    call a = make_call(2, 2, 64), b = make_call(4, 2, 64);
    const size_t n = out_elems(&b);
    float *own = malloc(n * sizeof *own);
    qva_context_t *ctx = NULL, *cp = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK &&
              qva_context_create(&cp, QVA_DEVICE_CPU) == QVA_OK, "contexts");
    run(ctx, carried, LAYER, &a);
    run(cp, plain, LAYER, &a); /* the same V-Smooth history */
    run(cp, plain, LAYER, &b);
    memcpy(own, b.out, n * sizeof *own);
    run(ctx, carried, LAYER, &b);
    CHECK(!memcmp(own, b.out, n * sizeof *own), "%s: after 2 heads, 4 query heads restart",
          carried);
    qva_context_free(ctx), qva_context_free(cp);
    free(own);
    free_call(&a), free_call(&b);
}

/* (f) ------------------------------------------------------------ non-finite */
static void test_nonfinite(void) {
    call c = make_call(2, 2, 64);
    const size_t n = out_elems(&c);
    float *out = malloc(n * sizeof *out);
    qva_context_t *ctx = NULL, *cp = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK &&
              qva_context_create(&cp, QVA_DEVICE_CPU) == QVA_OK, "contexts");
    const float keep = c.k[5];
    c.k[5] = NAN;
    run(ctx, "sage8+kprev", LAYER, &c);
    const qvi_vs_state *st = qvi_context_vs_state(ctx, LAYER, 0, 0);
    CHECK(st && st->kmean_d == 0, "a NaN in K leaves no mean");
    c.k[5] = keep;
    run(ctx, "sage8+kprev", LAYER, &c);
    memcpy(out, c.out, n * sizeof *out);
    run(cp, "sage8", LAYER, &c);
    CHECK(!memcmp(out, c.out, n / 2 * sizeof *out), /* head 0; head 1 kept its mean */
          "the next call smooths with its own mean");
    qva_context_free(ctx), qva_context_free(cp);
    free(out);
    free_call(&c);
}

/* (g) ------------------------------------------------------------ +vprev parsing */
static void test_vprev_parse(void) {
    static const char *const ok[] = {"sage8+vprev", "vc8+vprev", "vc8+expcast+vprev",
                                     "sage8+kprev+vprev", "vc8+hadamard+expcast-centred+vprev"};
    static const char *const bad[] = {"fp8+vprev", "bf16+vprev", "sage4+vprev", "vc4+vprev",
                                      "draft@85/0/7.5/7.5+vprev", "sage8+v2+vprev",
                                      "vc8+i8pv+vprev", "sage8+vprev+vprev"};
    check_method_option(ok, sizeof ok / sizeof *ok, bad, sizeof bad / sizeof *bad,
                        offsetof(qva_config, v_scale), QVA_V_SCALE_PREVIOUS, QVA_V_SCALE_CALL,
                        "+vprev");
    qva_config c;
    qva_config_default(&c);
    CHECK(qva_config_set_method(&c, "vc8") == QVA_OK, "vc8");
    c.v_scale = QVA_V_SCALE_PREVIOUS;
    CHECK(option_call_check(&c) == QVA_OK, "vc8 + QVA_V_SCALE_PREVIOUS: %s", qva_last_error());
    c.v_code = QVA_V_E4M3X2;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "with v_code E4M3X2 refused");
    c.v_code = QVA_V_E4M3, c.v_scale = 3;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "v_scale 3 refused");
}

/* (h) ------------------------------------------------------------ +vprev calls */
static void scale_v(call *c, float f) {
    for (size_t i = 0; i < (size_t)B * c->Hk * N * c->D; ++i) c->v[i] *= f;
}

static void test_vprev_calls(const char *plain, const char *vprev, int step) {
    g_step = step;
    call c = make_call(2, 2, 128);
    const size_t n = out_elems(&c), nk = (size_t)N * c.D;
    float *ex = malloc(n * sizeof *ex), *own = malloc(n * sizeof *own);
    qva_context_t *ctx = NULL, *cp = NULL, *cx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK &&
              qva_context_create(&cp, QVA_DEVICE_CPU) == QVA_OK &&
              qva_context_create(&cx, QVA_DEVICE_CPU) == QVA_OK, "contexts");
    /* the first call: its own scales */
    run(cp, plain, LAYER, &c);
    memcpy(own, c.out, n * sizeof *own);
    run(ctx, vprev, LAYER, &c);
    CHECK(!memcmp(own, c.out, n * sizeof *own), "%s step %d: the first call is %s's", vprev, step,
          plain);
    /* V grows 1.5-fold: the carried scales serve (not on demeaning steps) */
    scale_v(&c, 1.5f);
    run(cp, plain, LAYER, &c);
    memcpy(own, c.out, n * sizeof *own);
    run(ctx, vprev, LAYER, &c);
    const int same = !memcmp(own, c.out, n * sizeof *own);
    CHECK(step < 10 ? same : !same, "%s step %d: the carried scales %s", vprev, step,
          step < 10 ? "are not used while demeaning" : "were used");
    float *mine = malloc(n * sizeof *mine);
    memcpy(mine, c.out, n * sizeof *mine);
    run(cx, "exact", QVA_LAYER_NONE, &c);
    memcpy(ex, c.out, n * sizeof *ex);
    const double ek = rel_l2(mine, ex, n), ep = rel_l2(own, ex, n);
    printf("  %s step %d after V x1.5: rel-L2 %.5f (%s %.5f)\n", vprev, step, ek, plain, ep);
    CHECK(ek <= 1.10 * ep, "%s: %.5f against %s's %.5f", vprev, ek, plain, ep);
    for (int h = 0; h < c.Hk; ++h) { /* the call left its own scales */
        qvi_v8 x;
        CHECK(qvi_v8_prepare(c.v + h * nk, N, c.D, NULL, 0, QVA_V_E4M3, &x) == QVA_OK, "v8");
        const qvi_vs_state *st = qvi_context_vs_state(ctx, LAYER, 0, h);
        if (step >= 10) /* undemeaned: the own scales are qvi_v8_prepare's of V as it is */
            CHECK(st && st->vscale_d == c.D &&
                      !memcmp(st->vscale, x.chan_scale, (size_t)c.D * sizeof(float)),
                  "%s head %d: the call's own scales kept", vprev, h);
        else
            CHECK(st && st->vscale_d == c.D, "%s head %d: scales kept", vprev, h);
        qvi_v8_free(&x);
    }
    /* V grows 300-fold: codes would pass 448; the head codes with its own */
    scale_v(&c, 300.0f);
    run(cp, plain, LAYER, &c);
    memcpy(own, c.out, n * sizeof *own);
    run(ctx, vprev, LAYER, &c);
    CHECK(!memcmp(own, c.out, n * sizeof *own), "%s step %d: after a 300-fold growth, %s's", vprev,
          step, plain);
    qva_context_free(ctx), qva_context_free(cp), qva_context_free(cx);
    free(ex), free(own), free(mine);
    free_call(&c);
    g_step = 20;
}

/* `test_carry study`: the spread of +vprev's effect (docs/NUMERICS.md §3):
 * over `trials` random draws, the second call's V scaled by a factor in
 * [0.7, 1.4], rel-L2 against exact of the carried scales over the
 * method's own; prints the mean and the standard deviation. */
static void study(const char *plain, const char *vprev, int trials) {
    double sr = 0, sr2 = 0;
    for (int t = 0; t < trials; ++t) {
        call c = make_call(2, 2, 128);
        const size_t n = out_elems(&c);
        float *own = malloc(n * sizeof *own), *mine = malloc(n * sizeof *mine);
        qva_context_t *ctx = NULL, *cp = NULL, *cx = NULL;
        CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK &&
                  qva_context_create(&cp, QVA_DEVICE_CPU) == QVA_OK &&
                  qva_context_create(&cx, QVA_DEVICE_CPU) == QVA_OK, "contexts");
        run(cp, plain, LAYER, &c), run(ctx, vprev, LAYER, &c);
        scale_v(&c, (float)(0.7 + 0.7 * rng_unit()));
        run(cp, plain, LAYER, &c);
        memcpy(own, c.out, n * sizeof *own);
        run(ctx, vprev, LAYER, &c);
        memcpy(mine, c.out, n * sizeof *mine);
        run(cx, "exact", QVA_LAYER_NONE, &c);
        const double r = rel_l2(mine, c.out, n) / rel_l2(own, c.out, n);
        sr += r, sr2 += r * r;
        qva_context_free(ctx), qva_context_free(cp), qva_context_free(cx);
        free(own), free(mine);
        free_call(&c);
    }
    const double m = sr / trials;
    printf("%s over %s, %d draws: rel-L2 ratio mean %.4f, sd %.4f\n", vprev, plain, trials, m,
           sqrt(sr2 / trials - m * m));
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "study")) {
        study("sage8", "sage8+vprev", 30);
        study("vc8+expcast", "vc8+expcast+vprev", 30);
        study("vc8+hadamard+expcast-centred", "vc8+hadamard+expcast-centred+vprev", 30);
        return check_summary("test_carry study");
    }
    test_parse();
    test_first_calls("sage8", "sage8+kprev");
    test_first_calls("vc8+expcast", "vc8+expcast+kprev");
    test_tracking("sage8", "sage8+kprev", 128);            /* rotated */
    test_tracking("sage8+nohadamard", "sage8+nohadamard+kprev", 64);
    test_tracking("vc8", "vc8+kprev", 128);
    test_drift("sage8", "sage8+kprev");
    test_drift("vc8+hadamard+expcast-centred", "vc8+hadamard+expcast-centred+kprev");
    check_gqa("sage8+kprev", 2, 1.0f);
    test_shape_change("sage8", "sage8+kprev");
    test_nonfinite();
    test_vprev_parse();
    test_vprev_calls("sage8", "sage8+vprev", 20);
    test_vprev_calls("vc8+expcast", "vc8+expcast+vprev", 20);
    test_vprev_calls("vc8", "vc8+vprev", 1); /* demeaned (a reuse step) */
    check_gqa("vc8+kprev+vprev", 3, 1.2f);
    test_shape_change("vc8+expcast", "vc8+expcast+kprev+vprev");
    return check_summary("test_carry");
}
