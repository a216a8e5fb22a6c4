/* No silent wrong answers (issue 13, defect 4; docs/NUMERICS.md §2 "Rows
 * the arithmetic cannot finish"): scores that overflow FP32, NaN reaching a
 * row sum, and NaN inputs with check_finite = 0.  A row is zeros with LSE
 * -inf only when it retained no key; a row whose max or sum is not finite
 * is NaN with LSE NaN; check_finite turns either into QVA_ERR_NONFINITE on
 * the CPU. */
#include <stdlib.h>
#include <string.h>

#define TEST_RNG_SEED 0x6E6F6E66696E6974ull
#include "check.h"
#include "internal.h"

enum { B = 1, H = 2, N = 200, D = 64 }; /* N not a multiple of 128 */
#define NE ((size_t)B * H * N * D)
#define NR ((size_t)B * H * N)

typedef struct bufs {
    float q[NE], k[NE], v[NE], o[NE], lse[NR];
} bufs;

static float urand(float lo, float hi) { return lo + (hi - lo) * (float)rng_unit(); }

/* q, k: amp * U[lo, 1) (lo = 0.5: every score positive; lo = -1: mixed). */
static void fill_big(bufs *b, float amp, float lo) {
    for (size_t i = 0; i < NE; ++i) {
        b->q[i] = amp * urand(lo, 1.0f);
        b->k[i] = amp * urand(lo, 1.0f);
        b->v[i] = urand(-1.0f, 1.0f);
    }
}

static qva_status run(qva_context_t *ctx, const char *method, int check_finite, bufs *b,
                      int with_lse) {
    qva_config c;
    qva_config_default(&c);
    if (qva_config_set_method(&c, method) != QVA_OK) return QVA_ERR_PARSE;
    c.check_finite = check_finite;
    c.num_steps = 0; /* vc8/vc4: group on every call */
    if (c.method == QVA_METHOD_DRAFT) { /* the whole sequence is one 10x20 frame */
        c.draft.grid_t = 1, c.draft.grid_h = 10, c.draft.grid_w = 20;
        c.draft.prefix_tokens = 0;
        c.draft.dense_warmup_steps = 0;
    }
    qva_tensor q = qva_tensor_hnd(b->q, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor k = qva_tensor_hnd(b->k, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor v = qva_tensor_hnd(b->v, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor o = qva_tensor_hnd(b->o, QVA_F32, QVA_DEVICE_CPU, B, H, N, D);
    qva_tensor l = qva_tensor_hnd(b->lse, QVA_F32, QVA_DEVICE_CPU, B, H, N, 1);
    for (size_t i = 0; i < NE; ++i) b->o[i] = 12345.0f; /* poison */
    for (size_t i = 0; i < NR; ++i) b->lse[i] = 12345.0f;
    return qva_attention(ctx, &c, &q, &k, &v, &o, with_lse ? &l : NULL);
}

/* The kinds of output row the contract allows, and the ones it does not. */
enum { ROW_FINITE, ROW_NAN, ROW_EMPTY, ROW_BAD };
static int row_kind(const bufs *b, size_t r, int with_lse) {
    const float *o = b->o + r * D;
    int fin = 1, nan = 1, zero = 1;
    for (int c = 0; c < D; ++c) {
        fin &= isfinite(o[c]) != 0;
        nan &= isnan(o[c]) != 0;
        zero &= o[c] == 0.0f;
    }
    float l = b->lse[r];
    if (zero && (!with_lse || l == -INFINITY)) return ROW_EMPTY;
    if (nan && (!with_lse || isnan(l))) return ROW_NAN;
    if (fin && (!with_lse || isfinite(l) || l == INFINITY)) return ROW_FINITE;
    return ROW_BAD;
}

/* Counts the rows of each kind; dense methods must never give ROW_EMPTY. */
static void count_rows(const bufs *b, int with_lse, int n[4]) {
    memset(n, 0, 4 * sizeof *n);
    for (size_t r = 0; r < NR; ++r) ++n[row_kind(b, r, with_lse)];
}

/* Defect 4: finite q, k near 1e19.  With check_finite = 0 every row is a
 * finite result or NaN (never zeros with QVA_OK); with check_finite = 1 the
 * call either succeeds with finite rows or says QVA_ERR_NONFINITE and names
 * the overflow. */
static void test_score_overflow(qva_context_t *ctx, bufs *b) {
    const char *methods[] = {"bf16", "fp8", "fp8+expcast", "sage8", "sage8+expcast", "vc8",
                             "vc8+expcast", "sage4", "vc4", "draft@0/0/0/100",
                             "draft@0/0/100/0", "draft@0/100/0/0"};
    const struct { float amp, lo; } inputs[] = {{1e19f, 0.5f}, {4e19f, -1.0f}};
    for (size_t m = 0; m < sizeof methods / sizeof *methods; ++m) {
        int overflowed = 0;
        for (size_t t = 0; t < 2; ++t) {
            rng_state = 1000 + t;
            fill_big(b, inputs[t].amp, inputs[t].lo);
            qva_status st = run(ctx, methods[m], 0, b, 1);
            CHECK(st == QVA_OK, "%s amp %g: check_finite=0 gave %s (%s)", methods[m],
                  inputs[t].amp, qva_status_string(st), qva_last_error());
            int n[4];
            count_rows(b, 1, n);
            CHECK(n[ROW_EMPTY] == 0, "%s amp %g lo %g: %d rows silently zero (LSE -inf)",
                  methods[m], inputs[t].amp, inputs[t].lo, n[ROW_EMPTY]);
            CHECK(n[ROW_BAD] == 0, "%s amp %g lo %g: %d rows neither finite nor NaN", methods[m],
                  inputs[t].amp, inputs[t].lo, n[ROW_BAD]);
            overflowed += n[ROW_NAN] > 0;

            st = run(ctx, methods[m], 1, b, 1);
            if (n[ROW_NAN] > 0) {
                CHECK(st == QVA_ERR_NONFINITE, "%s amp %g: %d NaN rows, check_finite gave %s",
                      methods[m], inputs[t].amp, n[ROW_NAN], qva_status_string(st));
                CHECK(strstr(qva_last_error(), "overflow") != NULL, "%s: message '%s'",
                      methods[m], qva_last_error());
            }
        }
        /* bf16, fp8 and draft's 16-bit and INT8 phases overflow on the
         * all-positive 1e19 input; the K-smoothed methods at 4e19. */
        if (strcmp(methods[m], "draft@0/100/0/0") != 0)
            CHECK(overflowed > 0, "%s: no input overflowed (the test lost its point)", methods[m]);
    }
}

/* exact runs in FP64: the 1e19 scores are finite there, so the output is
 * the correct one (one-hot: the argmax key's value) and never zeros; only
 * the LSE, ~1e39, does not fit FP32: +inf, which check_finite reports. */
static void test_exact_large(qva_context_t *ctx, bufs *b) {
    rng_state = 77;
    fill_big(b, 1e19f, 0.5f);
    qva_status st = run(ctx, "exact", 0, b, 1);
    CHECK(st == QVA_OK, "exact 1e19: %s (%s)", qva_status_string(st), qva_last_error());
    int wrong = 0;
    for (size_t r = 0; r < NR; ++r) {
        size_t head = r / N;
        const float *q = b->q + r * D, *K = b->k + head * N * D, *V = b->v + head * N * D;
        double best = -INFINITY;
        size_t arg = 0;
        for (size_t j = 0; j < N; ++j) {
            double s = 0.0;
            for (int c = 0; c < D; ++c) s += (double)q[c] * K[j * D + c];
            if (s > best) best = s, arg = j;
        }
        for (int c = 0; c < D; ++c) wrong += fabsf(b->o[r * D + c] - V[arg * D + c]) > 1e-5f;
        CHECK(b->lse[r] == INFINITY, "exact row %zu: LSE %g, want +inf (overflow)", r,
              (double)b->lse[r]);
    }
    CHECK(wrong == 0, "exact 1e19: %d elements differ from the argmax key's value", wrong);
    st = run(ctx, "exact", 1, b, 0);
    CHECK(st == QVA_OK, "exact 1e19 without LSE, check_finite: %s (%s)", qva_status_string(st),
          qva_last_error());
    st = run(ctx, "exact", 1, b, 1);
    CHECK(st == QVA_ERR_NONFINITE && strstr(qva_last_error(), "LSE"),
          "exact 1e19 with LSE, check_finite: %s (%s)", qva_status_string(st), qva_last_error());
}

/* Defect 4: a NaN input with check_finite = 0 is not "out of memory".  For
 * exact and bf16 (no quantizer in between) the NaN reaches the scores of
 * its row, and that row is NaN: never zeros. */
static void test_nan_input(qva_context_t *ctx, bufs *b) {
    const char *methods[] = {"exact", "bf16", "draft@0/0/0/100"};
    for (size_t m = 0; m < sizeof methods / sizeof *methods; ++m) {
        rng_state = 5;
        fill_big(b, 1.0f, -1.0f);
        const size_t row = N + 7; /* head 1, row 7 */
        b->q[row * D + 3] = NAN;
        qva_status st = run(ctx, methods[m], 0, b, 1);
        CHECK(st == QVA_OK, "%s NaN q, check_finite=0: %s (%s)", methods[m],
              qva_status_string(st), qva_last_error());
        int n[4];
        count_rows(b, 1, n);
        CHECK(row_kind(b, row, 1) == ROW_NAN, "%s: the NaN row is kind %d, want NaN", methods[m],
              row_kind(b, row, 1));
        CHECK(n[ROW_FINITE] == (int)NR - 1, "%s: %d finite rows, want %d", methods[m],
              n[ROW_FINITE], (int)NR - 1);
        st = run(ctx, methods[m], 1, b, 1);
        CHECK(st == QVA_ERR_NONFINITE, "%s NaN q, check_finite=1: %s", methods[m],
              qva_status_string(st));

        b->q[row * D + 3] = 0.5f;
        b->k[(N + 11) * D + 5] = NAN; /* one key of head 1: every row of head 1 */
        st = run(ctx, methods[m], 0, b, 1);
        CHECK(st == QVA_OK, "%s NaN k, check_finite=0: %s (%s)", methods[m],
              qva_status_string(st), qva_last_error());
        count_rows(b, 1, n);
        CHECK(n[ROW_NAN] == N && n[ROW_FINITE] == N, "%s NaN k: %d NaN rows, %d finite",
              methods[m], n[ROW_NAN], n[ROW_FINITE]);
    }
}

/* The engine's finish on the states a broken row can reach (a NaN or zero
 * row sum, an infinite max) and the one empty state. */
static void test_row_finish(void) {
    float acc[4] = {1.0f, 2.0f, 3.0f, 4.0f}, out[4];
    const struct { float m, l; int retained, want; } cases[] = {
        {0.0f, NAN, 1, ROW_NAN},            /* NaN row sum: not "no key" */
        {0.0f, 0.0f, 1, ROW_NAN},           /* zero sum with a finite max */
        {INFINITY, 0.0f, 1, ROW_NAN},       /* +inf score (ExpCast: every code 0) */
        {INFINITY, NAN, 1, ROW_NAN},        /* +inf score, exp path */
        {-INFINITY, NAN, 1, ROW_NAN},       /* every score NaN */
        {-INFINITY, 0.0f, 1, ROW_NAN},      /* every score overflowed to -inf */
        {-INFINITY, 0.0f, 0, ROW_EMPTY},    /* no key retained */
        {2.0f, 4.0f, 1, ROW_FINITE},
        {2.0f, INFINITY, 1, ROW_NAN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
        qvi_row r = {.m = cases[i].m, .l = cases[i].l, .acc = acc, .d = 4};
        float lse = qvi_row_finish(&r, cases[i].retained ? QVI_ROW_RETAINED : 0, NULL, 0.0f, out);
        int nan = 1, zero = 1;
        for (int c = 0; c < 4; ++c) nan &= isnan(out[c]) != 0, zero &= out[c] == 0.0f;
        int got = nan && isnan(lse)                  ? ROW_NAN
                  : zero && lse == -INFINITY         ? ROW_EMPTY
                  : isfinite(lse) && isfinite(out[0]) ? ROW_FINITE
                                                      : ROW_BAD;
        CHECK(got == cases[i].want, "finish(m %g, l %g, retained %d): kind %d, want %d",
              (double)cases[i].m, (double)cases[i].l, cases[i].retained, got, cases[i].want);
    }
    /* unchanged arithmetic of a normal row */
    qvi_row r = {.m = 2.0f, .l = 4.0f, .acc = acc, .d = 4};
    float lse = qvi_row_finish(&r, QVI_ROW_RETAINED, NULL, 1.0f, out);
    CHECK(out[0] == 0.25f && out[3] == 1.0f, "normal row: %g %g", (double)out[0], (double)out[3]);
    CHECK(lse == (2.0f + 2.0f - 1.0f) * 0.69314718055994531f, "normal LSE %g", (double)lse);
    /* a NaN score seen, finite max and sum (ExpCast codes NaN as 0): the
     * value is kept, unless strict (check_finite), which makes it NaN */
    r.nonfinite = 1;
    qvi_row_finish(&r, QVI_ROW_RETAINED, NULL, 0.0f, out);
    CHECK(out[0] == 0.25f, "non-strict row with a NaN score: %g", (double)out[0]);
    lse = qvi_row_finish(&r, QVI_ROW_RETAINED | QVI_ROW_STRICT, NULL, 0.0f, out);
    CHECK(isnan(out[0]) && isnan(lse), "strict row with a NaN score: %g", (double)out[0]);
}

/* The max ignores NaN scores (as fmaxf on the GPU) and flags them. */
static void test_raise_max_flags(void) {
    float acc[2] = {0}, s[4] = {1.0f, NAN, -INFINITY, 3.0f};
    qvi_row r;
    qvi_row_init(&r, acc, 2);
    qvi_row_raise_max(&r, s, 2);
    CHECK(r.m == 1.0f && r.nonfinite, "NaN score: m %g flag %d", (double)r.m, r.nonfinite);
    qvi_row_init(&r, acc, 2);
    qvi_row_raise_max(&r, s + 2, 2);
    CHECK(r.m == 3.0f && !r.nonfinite, "-inf (masked) score: m %g flag %d", (double)r.m,
          r.nonfinite);
    float t[2] = {INFINITY, 0.0f};
    qvi_row_raise_max(&r, t, 2);
    CHECK(r.m == INFINITY && r.nonfinite, "+inf score: m %g flag %d", (double)r.m, r.nonfinite);
}

/* Draft rows that retain no key stay the one legitimate empty row. */
static void test_draft_empty_rows(qva_context_t *ctx, bufs *b) {
    rng_state = 9;
    fill_big(b, 1.0f, -1.0f);
    qva_status st = run(ctx, "draft@100/0/0/0", 1, b, 1);
    CHECK(st == QVA_OK, "draft skip-all: %s (%s)", qva_status_string(st), qva_last_error());
    int n[4];
    count_rows(b, 1, n);
    CHECK(n[ROW_EMPTY] == (int)NR, "draft skip-all: %d empty rows of %d", n[ROW_EMPTY], (int)NR);
}

int main(void) {
    qva_context_t *ctx = NULL;
    if (qva_context_create(&ctx, QVA_DEVICE_CPU) != QVA_OK) return 1;
    bufs *b = malloc(sizeof *b);
    if (!b) return 1;
    test_row_finish();
    test_raise_max_flags();
    test_score_overflow(ctx, b);
    test_exact_large(ctx, b);
    test_nan_input(ctx, b);
    test_draft_empty_rows(ctx, b);
    free(b);
    qva_context_free(ctx);
    return check_summary("test_nonfinite");
}
