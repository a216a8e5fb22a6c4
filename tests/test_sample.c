/*
 * Statistics from a sample (docs/NUMERICS.md §3) on the CPU reference.
 *  (a) parsing and validation: +ksample for sage8 and vc8, +vsample for
 *      their one E4M3 digit of V and draft's INT8 phase; one option per setting (+ksample with
 *      +kprev is refused); CUDA refuses +vsample on f32 and says why;
 *  (b) the sample: QVA_STAT_ROW gives QVA_STAT_COUNT(n) distinct rows in
 *      order, from row 0, every row when n <= QVA_STAT_SAMPLE;
 *  (c) +vsample: with every channel's amax on a sampled row the scales
 *      are the call's own, so the output is the method's bit for bit;
 *      with a larger value on an unsampled row the output differs and its
 *      error stays near the method's; an unsampled value past 448 times
 *      the sampled scale makes the head use its own scales (the method's
 *      bits); a demeaning (reuse) step's error stays near the method's;
 *  (c') on a demeaning step the residual's scales from the sampled blocks
 *      (qvi_v8_prepare_carried itself), or the own past either bound;
 *  (d) +ksample: output and LSE near exact attention as the method's
 *      are (the LSE is the unsmoothed scores'), and stateless: a call's
 *      bits do not depend on what ran on the layer before;
 *  (e) grouped K/V heads: the calls are those of K/V repeated per query
 *      head, bit for bit;
 *  (f) draft's INT8 phase with +vsample (its packed video rows sampled):
 *      V whose every channel holds one magnitude gives the method's bits
 *      (the sampled amax is the whole one), as does V with one value past
 *      448 times the rest (sampled: the own scale; not: refused); random V
 *      changes the output, its error near the method's; CUDA says it does
 *      not run it on f32.
 * CUDA is held to the CPU's outputs by test_backend (its +ksample and
 * +vsample cases).
 */
#define TEST_RNG_SEED 0x5A3B1E0DDEC0DE11ull
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "method_option.h"

enum { NTOK = 1500, DH = 128, LAYER = 3 };

typedef struct io {
    int H, Hk;
    float *q, *k, *v, *out, *lse;
} io;

static void uniform(float *x, size_t n, float amp, float offset) {
    for (size_t i = 0; i < n; ++i) x[i] = offset + amp * (float)(2.0 * rng_unit() - 1.0);
}

static io make_io(int H, int Hk) {
    io c = {H, Hk, NULL, NULL, NULL, NULL, NULL};
    const size_t nq = (size_t)H * NTOK * DH, nk = (size_t)Hk * NTOK * DH;
    c.q = malloc(nq * sizeof(float)), c.k = malloc(nk * sizeof(float));
    c.v = malloc(nk * sizeof(float)), c.out = malloc(nq * sizeof(float));
    c.lse = malloc((size_t)H * NTOK * sizeof(float));
    uniform(c.q, nq, 1.5f, 0.0f), uniform(c.k, nk, 1.5f, 0.8f), uniform(c.v, nk, 1.0f, 0.0f);
    return c;
}

static void free_io(io *c) { free(c->q), free(c->k), free(c->v), free(c->out), free(c->lse); }

static size_t n_out(const io *c) { return (size_t)c->H * NTOK * DH; }
static size_t n_lse(const io *c) { return (size_t)c->H * NTOK; }

static qva_status attend(qva_context_t *ctx, const char *method, int layer, int step, io *c) {
    qva_config cfg;
    qva_config_default(&cfg);
    qva_status st = qva_config_set_method(&cfg, method);
    CHECK(st == QVA_OK, "%s: %s", method, qva_last_error());
    cfg.layer = layer, cfg.step = step, cfg.num_steps = 40;
    cfg.draft.grid_t = 3, cfg.draft.grid_h = 20, cfg.draft.grid_w = 25; /* NTOK tokens */
    const qva_tensor q = qva_tensor_hnd(c->q, QVA_F32, QVA_DEVICE_CPU, 1, c->H, NTOK, DH),
                     k = qva_tensor_hnd(c->k, QVA_F32, QVA_DEVICE_CPU, 1, c->Hk, NTOK, DH),
                     v = qva_tensor_hnd(c->v, QVA_F32, QVA_DEVICE_CPU, 1, c->Hk, NTOK, DH),
                     o = qva_tensor_hnd(c->out, QVA_F32, QVA_DEVICE_CPU, 1, c->H, NTOK, DH),
                     l = qva_tensor_hnd(c->lse, QVA_F32, QVA_DEVICE_CPU, 1, c->H, NTOK, 1);
    if (st == QVA_OK) st = qva_attention(ctx, &cfg, &q, &k, &v, &o, &l);
    CHECK(st == QVA_OK, "%s: %s", method, qva_last_error());
    return st;
}

/* out and lse of `method` on c, into fresh buffers (freed by the caller). */
static void attend_copy(qva_context_t *ctx, const char *method, int step, io *c, float **out,
                        float **lse) {
    attend(ctx, method, LAYER, step, c);
    *out = malloc(n_out(c) * sizeof(float)), *lse = malloc(n_lse(c) * sizeof(float));
    memcpy(*out, c->out, n_out(c) * sizeof(float));
    memcpy(*lse, c->lse, n_lse(c) * sizeof(float));
}

static double rel_err(const float *a, const float *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; ++i) {
        const double d = (double)a[i] - ref[i];
        e += d * d, r += (double)ref[i] * ref[i];
    }
    return sqrt(e / r);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; ++i) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* A row of n that QVA_STAT_ROW never gives. */
static int unsampled_row(int n) {
    char *hit = calloc((size_t)n, 1);
    for (int64_t i = 0; i < QVA_STAT_COUNT(n); ++i) hit[QVA_STAT_ROW(i, n)] = 1;
    int r = 0;
    while (r < n && hit[r]) ++r;
    free(hit);
    return r;
}

/* (a) ------------------------------------------------------------ parsing */
static void test_parse(void) {
    static const char *const kok[] = {"sage8+ksample", "vc8+ksample", "vc8+expcast+ksample",
                                      "sage8+nohadamard+ksample", "vc8+i8pv+ksample"};
    static const char *const kbad[] = {"fp8+ksample", "bf16+ksample", "sage4+ksample",
                                       "exact+ksample", "draft@85/0/7.5/7.5+ksample",
                                       "sage8+kprev+ksample", "sage8+ksample+ksample"};
    check_method_option(kok, sizeof kok / sizeof *kok, kbad, sizeof kbad / sizeof *kbad,
                        offsetof(qva_config, k_mean), QVA_K_MEAN_SAMPLE, QVA_K_MEAN_CALL,
                        "+ksample");
    static const char *const vok[] = {"sage8+vsample", "vc8+vsample", "vc8+expcast+vsample",
                                      "vc8+expcast-centred+pblock+ksample+vsample",
                                      "draft@85/0/7.5/7.5+vsample"};
    static const char *const vbad[] = {"fp8+vsample", "draft@85/0/0/15+vprev", "bf16+vsample",
                                       "sage8+v2+vsample", "vc8+i8pv+vsample",
                                       "sage8+vprev+vsample"};
    check_method_option(vok, sizeof vok / sizeof *vok, vbad, sizeof vbad / sizeof *vbad,
                        offsetof(qva_config, v_scale), QVA_V_SCALE_SAMPLE, QVA_V_SCALE_CALL,
                        "+vsample");
    qva_config c;
    qva_config_default(&c);
    CHECK(qva_config_set_method(&c, "fp8") == QVA_OK, "fp8");
    c.k_mean = QVA_K_MEAN_SAMPLE;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "fp8 with QVA_K_MEAN_SAMPLE refused");
    c.k_mean = 3;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "k_mean 3 refused");
    CHECK(qva_config_set_method(&c, "sage8+v2") == QVA_OK, "sage8+v2");
    c.v_scale = QVA_V_SCALE_SAMPLE;
    CHECK(option_call_check(&c) == QVA_ERR_INVALID_ARGUMENT, "+v2 with QVA_V_SCALE_SAMPLE refused");
    char why[256] = "";
    CHECK(qva_config_set_method(&c, "sage8+vsample") == QVA_OK &&
              !qva_supports(QVA_DEVICE_CUDA, &c, QVA_F32, 128, why, sizeof why) && why[0],
          "CUDA does not run +vsample on f32 inputs, and says why");
}

/* (b) ------------------------------------------------------------ the sample */
static void test_rows(void) {
    static const int ns[] = {1, 2, 127, 1024, 1025, 1500, 75600, 111700};
    for (size_t t = 0; t < sizeof ns / sizeof *ns; ++t) {
        const int n = ns[t];
        const int64_t m = QVA_STAT_COUNT(n);
        int ok = m == (n < QVA_STAT_SAMPLE ? n : QVA_STAT_SAMPLE) && QVA_STAT_ROW(0, n) == 0;
        for (int64_t i = 1; i < m; ++i)
            ok = ok && QVA_STAT_ROW(i, n) > QVA_STAT_ROW(i - 1, n) && QVA_STAT_ROW(i, n) < n;
        if (n <= QVA_STAT_SAMPLE) ok = ok && QVA_STAT_ROW(m - 1, n) == n - 1;
        else ok = ok && QVA_STAT_ROW(m - 1, n) >= n - n / QVA_STAT_SAMPLE - 1;
        CHECK(ok, "n %d: %lld distinct rows in order over the sequence", n, (long long)m);
    }
}

/* (c) ------------------------------------------------------------ +vsample */
/* Channel c of every K/V head of c->v: value x at row r. */
static void put_row(io *c, int r, float x) {
    for (int h = 0; h < c->Hk; ++h)
        for (int ch = 0; ch < DH; ++ch) c->v[((size_t)h * NTOK + r) * DH + ch] = x;
}

static void test_vsample(const char *plain, const char *sampled, int vsmooth) {
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context");
    io c = make_io(2, 2);
    float *ref, *rl, *got, *gl, *ex, *el;
    put_row(&c, 0, 1.5f); /* every channel's amax on row 0, a sampled row */
    attend_copy(ctx, plain, 20, &c, &ref, &rl);
    attend_copy(ctx, sampled, 20, &c, &got, &gl);
    CHECK(!memcmp(ref, got, n_out(&c) * sizeof(float)),
          "%s: the amax on a sampled row gives the method's scales and output", sampled);
    free(ref), free(rl), free(got), free(gl);

    const int r = unsampled_row(NTOK);
    put_row(&c, r, -3.0f); /* larger than anything sampled, within E4M3's range */
    attend_copy(ctx, plain, 20, &c, &ref, &rl);
    attend_copy(ctx, sampled, 20, &c, &got, &gl);
    attend_copy(ctx, "exact", 20, &c, &ex, &el);
    const double e_ref = rel_err(ref, ex, n_out(&c)), e_got = rel_err(got, ex, n_out(&c));
    CHECK(memcmp(ref, got, n_out(&c) * sizeof(float)) != 0 && e_got < 1.1 * e_ref,
          "%s: an unsampled amax (row %d) changes the scales; rel-L2 %.4e against %.4e",
          sampled, r, e_got, e_ref);
    free(ref), free(rl), free(got), free(gl), free(ex), free(el);

    put_row(&c, r, 2000.0f); /* 2000 / (1.5 / 2.25) = 3000 > 448: the head's own */
    attend_copy(ctx, plain, 20, &c, &ref, &rl);
    attend_copy(ctx, sampled, 20, &c, &got, &gl);
    CHECK(!memcmp(ref, got, n_out(&c) * sizeof(float)),
          "%s: a code past 448 makes the head use its own scales", sampled);
    free(ref), free(rl), free(got), free(gl);

    if (vsmooth) { /* a demeaning step: the sampled blocks' scales (test_vsample_blocks) */
        put_row(&c, r, -3.0f);
        attend_copy(ctx, plain, 1, &c, &ref, &rl);
        attend_copy(ctx, sampled, 1, &c, &got, &gl);
        attend_copy(ctx, "exact", 1, &c, &ex, &el);
        const double d_ref = rel_err(ref, ex, n_out(&c)), d_got = rel_err(got, ex, n_out(&c));
        CHECK(d_got < 1.1 * d_ref, "%s: a demeaning step's rel-L2 %.4e against the method's %.4e",
              sampled, d_got, d_ref);
        free(ref), free(rl), free(got), free(gl), free(ex), free(el);
    }
    free_io(&c);
    qva_context_free(ctx);
}

/* (c') +vsample on a demeaning step, on qvi_v8_prepare_carried itself (V in
 * its permuted order): the residual's scales are v_channel_scale's over
 * the QVA_STAT_BLOCK blocks where they serve, else the head's own; the
 * bounds are a residual code past 448 and a mean / scale past 32768, each
 * in a block the sample misses. */
static void expected_block_scales(const float *v, int n, float *s) {
    const int nblk = (n + QVI_BLOCK - 1) / QVI_BLOCK;
    for (int c = 0; c < DH; ++c) {
        float amax = 0.0f, mmax = 0.0f;
        for (int64_t i = 0; i < QVA_STAT_BLOCKS(nblk); ++i) {
            const int j = (int)QVA_STAT_BLOCK(i, nblk), r0 = j * QVI_BLOCK;
            const int r1 = r0 + QVI_BLOCK < n ? r0 + QVI_BLOCK : n;
            const float m = qvi_block_mean(v, n, DH, r0, c);
            for (int r = r0; r < r1; ++r) amax = fmaxf(amax, fabsf(v[(size_t)r * DH + c] - m));
            mmax = fmaxf(mmax, fabsf(m));
        }
        const float x = fmaxf(amax / QVI_V_E4M3_RANGE, mmax / 32768.0f);
        s[c] = x > 0.0f ? x : 1.0f;
    }
}

static void test_vsample_blocks(void) {
    const int n = NTOK, nblk = (n + QVI_BLOCK - 1) / QVI_BLOCK;
    int missed = -1; /* a block the sample does not hold */
    for (int j = 0; j < nblk && missed < 0; ++j) {
        int hit = 0;
        for (int64_t i = 0; i < QVA_STAT_BLOCKS(nblk); ++i) hit |= QVA_STAT_BLOCK(i, nblk) == j;
        if (!hit) missed = j;
    }
    CHECK(nblk > QVA_STAT_SAMPLE / QVI_BLOCK && missed >= 0, "%d blocks, block %d unsampled", nblk,
          missed);
    float *v = malloc((size_t)n * DH * sizeof *v), s[DH];
    for (size_t i = 0; i < (size_t)n * DH; ++i) v[i] = rng_unit() * 2.0f - 1.0f;
    for (int form = 0; form < 3; ++form) {
        if (form == 1) v[((size_t)missed * QVI_BLOCK + 5) * DH + 9] = 2000.0f;
        if (form == 2) {
            v[((size_t)missed * QVI_BLOCK + 5) * DH + 9] = 0.5f;
            for (int r = 0; r < QVI_BLOCK; ++r) v[((size_t)missed * QVI_BLOCK + r) * DH + 3] = 2e4f;
        }
        qvi_v8 own, got;
        const qva_status a = qvi_v8_prepare_carried(v, n, DH, NULL, 1, QVA_V_E4M3, NULL, 0, NULL, &own),
                         b = qvi_v8_prepare_carried(v, n, DH, NULL, 1, QVA_V_E4M3, NULL, 1, NULL, &got);
        CHECK(a == QVA_OK && b == QVA_OK, "demeaned V prepared");
        if (a != QVA_OK || b != QVA_OK) break;
        expected_block_scales(v, n, s);
        const size_t nc = (size_t)own.n_pad * DH, nm = (size_t)own.nblk * DH;
        const int same = !memcmp(own.chan_scale, got.chan_scale, DH * sizeof(float)) &&
                         !memcmp(own.codes, got.codes, nc) &&
                         !memcmp(own.mu_hat, got.mu_hat, nm * sizeof(float));
        if (form == 0)
            CHECK(!memcmp(got.chan_scale, s, sizeof s) && !same,
                  "demeaned V: the sampled blocks' scales, other codes");
        else
            CHECK(same, "demeaned V: %s in block %d, the head's own scales and codes",
                  form == 1 ? "a residual code past 448" : "a mean / scale past 32768", missed);
        qvi_v8_free(&own), qvi_v8_free(&got);
    }
    free(v);
}

/* (d) ------------------------------------------------------------ +ksample */
static void test_ksample(const char *plain, const char *sampled) {
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context");
    io a = make_io(2, 2), b = make_io(2, 2);
    float *ref, *rl, *got, *gl, *ex, *el, *again, *al;
    attend_copy(ctx, "exact", 20, &a, &ex, &el);
    attend_copy(ctx, plain, 20, &a, &ref, &rl);
    attend_copy(ctx, sampled, 20, &a, &got, &gl);
    const double e_ref = rel_err(ref, ex, n_out(&a)), e_got = rel_err(got, ex, n_out(&a));
    const double l_ref = max_abs_diff(rl, el, n_lse(&a)), l_got = max_abs_diff(gl, el, n_lse(&a));
    CHECK(memcmp(ref, got, n_out(&a) * sizeof(float)) != 0 && e_got < 1.1 * e_ref,
          "%s: rel-L2 %.4e against the method's %.4e", sampled, e_got, e_ref);
    CHECK(l_got < 2.0 * l_ref + 1e-4,
          "%s: LSE within %.2e of exact (the method's %.2e): the unsmoothed scores'", sampled,
          l_got, l_ref);
    attend(ctx, sampled, LAYER, 20, &b); /* other inputs on the same layer */
    attend_copy(ctx, sampled, 20, &a, &again, &al);
    CHECK(!memcmp(got, again, n_out(&a) * sizeof(float)) &&
              !memcmp(gl, al, n_lse(&a) * sizeof(float)),
          "%s: stateless (the same inputs, the same bits after another call)", sampled);
    free(ref), free(rl), free(got), free(gl), free(ex), free(el), free(again), free(al);
    free_io(&a), free_io(&b);
    qva_context_free(ctx);
}

/* (e) ------------------------------------------------------------ grouped heads */
static void test_gqa(const char *method) {
    qva_context_t *ctx = NULL, *cr = NULL; /* each with its own V-Smooth order */
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK &&
              qva_context_create(&cr, QVA_DEVICE_CPU) == QVA_OK, "contexts");
    io g = make_io(4, 2), r = make_io(4, 4);
    memcpy(r.q, g.q, n_out(&g) * sizeof(float));
    const size_t head = (size_t)NTOK * DH;
    for (int h = 0; h < 4; ++h) { /* query head h reads K/V head h / 2 */
        memcpy(r.k + h * head, g.k + (h / 2) * head, head * sizeof(float));
        memcpy(r.v + h * head, g.v + (h / 2) * head, head * sizeof(float));
    }
    attend(ctx, method, LAYER, 20, &g);
    attend(cr, method, LAYER, 20, &r);
    CHECK(!memcmp(g.out, r.out, n_out(&g) * sizeof(float)) &&
              !memcmp(g.lse, r.lse, n_lse(&g) * sizeof(float)),
          "%s: grouped K/V heads as repeated ones", method);
    free_io(&g), free_io(&r);
    qva_context_free(ctx), qva_context_free(cr);
}

/* (f) ------------------------------------------------------------ draft */
static void test_draft(const char *plain, const char *sampled) {
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context");
    io c = make_io(2, 2);
    float *ref, *rl, *got, *gl, *ex, *el;
    attend_copy(ctx, "exact", 20, &c, &ex, &el);
    attend_copy(ctx, plain, 20, &c, &ref, &rl);
    attend_copy(ctx, sampled, 20, &c, &got, &gl);
    const double e_ref = rel_err(ref, ex, n_out(&c)), e_got = rel_err(got, ex, n_out(&c));
    CHECK(memcmp(ref, got, n_out(&c) * sizeof(float)) != 0 && e_got < 1.1 * e_ref,
          "%s: sampled scales, rel-L2 %.4e against the method's %.4e", sampled, e_got, e_ref);
    free(ref), free(rl), free(got), free(gl), free(ex), free(el);
    const size_t nv = (size_t)c.Hk * NTOK * DH;
    for (int form = 0; form < 2; ++form) {
        for (size_t i = 0; i < nv; ++i) /* channel magnitudes 0.5 .. 1.5, signs random */
            c.v[i] = (rng_unit() < 0.5 ? -1.0f : 1.0f) * (0.5f + (float)(i % DH) / DH);
        if (form) c.v[(size_t)777 * DH + 5] = 2000.0f;
        attend_copy(ctx, plain, 20, &c, &ref, &rl);
        attend_copy(ctx, sampled, 20, &c, &got, &gl);
        CHECK(!memcmp(ref, got, n_out(&c) * sizeof(float)), "%s: %s, the method's bits", sampled,
              form ? "a code past 448 (sampled or refused)" : "one magnitude a channel");
        free(ref), free(rl), free(got), free(gl);
    }
    qva_config cfg;
    qva_config_default(&cfg);
    char why[256] = "";
    CHECK(qva_config_set_method(&cfg, sampled) == QVA_OK &&
              !qva_supports(QVA_DEVICE_CUDA, &cfg, QVA_F32, DH, why, sizeof why) && why[0],
          "%s: CUDA does not run it on f32, and says why", sampled);
    free_io(&c);
    qva_context_free(ctx);
}

int main(void) {
    test_parse();
    test_rows();
    test_vsample("sage8", "sage8+vsample", 0);
    test_vsample("vc8+expcast-centred+pblock", "vc8+expcast-centred+pblock+vsample", 1);
    test_vsample_blocks();
    test_ksample("sage8", "sage8+ksample");
    test_ksample("sage8+nohadamard", "sage8+nohadamard+ksample");
    test_ksample("vc8+expcast-centred+pblock", "vc8+expcast-centred+pblock+ksample");
    test_gqa("vc8+expcast-centred+pblock+ksample+vsample");
    test_draft("draft@85/0/15/0+expcast", "draft@85/0/15/0+expcast+vsample");
    test_draft("draft@85/0/7.5/7.5", "draft@85/0/7.5/7.5+vsample");
    return check_summary("test_sample");
}
