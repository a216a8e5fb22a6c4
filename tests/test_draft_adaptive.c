/* The adaptive (MASS) draft budget (docs/DRAFT.md, "Adaptive budget"):
 * method strings and validation, the integer mass rule on hand-built
 * maps, floor and cap, order independence, global against local heads,
 * and the equality with fixed quotas of the same per-head counts. */
#include <stdlib.h>
#include <string.h>

#define TEST_RNG_SEED 0x5851f42d4c957f2dull
#include "check.h"
#include "draft/plan.h"
#include "draft/router.h"
#include "draft_case.h"

/* ------------------------------------------------------------ parsing */

static void expect_parse(const char *name, const char *canon, float mass, float f4,
                         float f8, float f16) {
    qva_config cfg;
    qva_config_default(&cfg);
    CHECK(qva_config_set_method(&cfg, name) == QVA_OK, "%s: %s", name, qva_last_error());
    const qva_draft_params *d = &cfg.draft;
    CHECK(d->budget == QVA_DRAFT_BUDGET_MASS && d->mass == mass && d->frac_skip == 0.0f &&
              d->frac4 == f4 && d->frac8 == f8 && d->frac16 == f16,
          "%s: budget %d mass %g split %g/%g/%g/%g", name, d->budget, (double)d->mass,
          (double)d->frac_skip, (double)d->frac4, (double)d->frac8, (double)d->frac16);
    char buf[96];
    CHECK(qva_config_method_name(&cfg, buf, sizeof buf) == QVA_OK && !strcmp(buf, canon),
          "%s: canonical '%s', want '%s'", name, buf, canon);
    qva_config again = cfg; /* the canonical name parses back to the same config */
    CHECK(qva_config_set_method(&again, buf) == QVA_OK && !memcmp(&again, &cfg, sizeof cfg),
          "%s does not round-trip", buf);
}

static void expect_parse_error(const char *name, const char *phrase) {
    qva_config cfg, before;
    qva_config_default(&cfg);
    before = cfg;
    CHECK(qva_config_set_method(&cfg, name) == QVA_ERR_PARSE, "'%s' parsed", name);
    CHECK(strstr(qva_last_error(), phrase) != NULL, "'%s': message '%s' lacks '%s'", name,
          qva_last_error(), phrase);
    CHECK(!memcmp(&cfg, &before, sizeof cfg), "'%s': cfg changed on failure", name);
}

static void test_parse(void) {
    expect_parse("draft@p95", "draft@p95", 0.95f, 0, 0, 1);
    expect_parse("draft@p95/0/0/100", "draft@p95", 0.95f, 0, 0, 1);
    expect_parse("draft@p9.5e1/0/50/50", "draft@p95/0/50/50", 0.95f, 0, 0.5f, 0.5f);
    expect_parse("draft@p100/20/30/50", "draft@p100/20/30/50", 1.0f, 0.2f, 0.3f, 0.5f);
    expect_parse("draft@p0.5", "draft@p0.5", 0.005f, 0, 0, 1);
    expect_parse("draft@p99.9+expcast+qblock", "draft@p99.9+expcast+qblock", 0.999f, 0, 0, 1);
    expect_parse_error("draft@p", "is not a plain decimal percentage");
    expect_parse_error("draft@p-5", "is not a plain decimal percentage");
    expect_parse_error("draft@p 95", "is not a plain decimal percentage");
    expect_parse_error("draft@p95x", "is not a plain decimal percentage");
    expect_parse_error("draft@P95", "need the form S0/S4/S8/S16");
    expect_parse_error("draft@p0", "outside (0,100]");
    expect_parse_error("draft@p100.5", "outside (0,100]");
    expect_parse_error("draft@p95/50/50", "need the form pM/S4/S8/S16");
    expect_parse_error("draft@p95/0/50/50/0", "need the form pM/S4/S8/S16");
    expect_parse_error("draft@p95/0/50/60", "does not sum to 100");
    expect_parse_error("draft@p95/0/x/50", "quota 2 'x' is not a plain decimal");
    expect_parse_error("draft@p95+foo", "unknown method option");
    /* A quota method after a mass one goes back to the QUOTA budget. */
    qva_config cfg;
    qva_config_default(&cfg);
    CHECK(qva_config_set_method(&cfg, "draft@p90") == QVA_OK, "p90");
    CHECK(qva_config_set_method(&cfg, "draft@85/0/0/15") == QVA_OK &&
              cfg.draft.budget == QVA_DRAFT_BUDGET_QUOTA,
          "draft@85/0/0/15 after draft@p90: budget %d", cfg.draft.budget);
    qva_config_default(&cfg);
    CHECK(cfg.draft.budget == QVA_DRAFT_BUDGET_QUOTA && cfg.draft.mass == 0.95f &&
              cfg.draft.min_keep == 0.05f && cfg.draft.max_keep == 1.0f,
          "defaults");
}

/* ------------------------------------------------------------ validation */

static void expect_invalid(qva_config cfg, const char *phrase) {
    int dense = -1;
    qva_status st = qva_draft_step_check(&cfg, 4 * 16 * 32, 64, &dense);
    CHECK(st == QVA_ERR_INVALID_ARGUMENT && strstr(qva_last_error(), phrase),
          "want '%s': status %d, '%s'", phrase, (int)st, qva_last_error());
}

static void test_validation(void) {
    dcase c = dcase_new(1, 4, 16, 32, 0, 64);
    qva_config ok = dcase_config(&c, "draft@p90/0/50/50"), cfg;
    int dense = -1;
    CHECK(qva_draft_step_check(&ok, c.N, 64, &dense) == QVA_OK && dense == 0, "%s",
          qva_last_error());
    cfg = ok, cfg.draft.mass = 0.0f;
    expect_invalid(cfg, "mass = 0 is outside (0, 1]");
    cfg = ok, cfg.draft.mass = 1.5f;
    expect_invalid(cfg, "mass = 1.5 is outside (0, 1]");
    cfg = ok, cfg.draft.min_keep = 0.6f, cfg.draft.max_keep = 0.5f;
    expect_invalid(cfg, "min_keep = 0.6 and max_keep = 0.5");
    cfg = ok, cfg.draft.max_keep = 1.01f;
    expect_invalid(cfg, "max_keep = 1.01");
    cfg = ok, cfg.draft.min_keep = -0.1f;
    expect_invalid(cfg, "min_keep = -0.1");
    cfg = ok, cfg.draft.frac_skip = 0.5f, cfg.draft.frac8 = 0.0f;
    expect_invalid(cfg, "frac_skip = 0.5 must be 0");
    cfg = ok, cfg.draft.frac8 = 0.25f;
    expect_invalid(cfg, "sum to");
    cfg = ok, cfg.draft.budget = 5;
    expect_invalid(cfg, "budget = 5 is not a qva_draft_budget");
    /* The QUOTA budget does not read mass, min_keep or max_keep. */
    cfg = dcase_config(&c, "draft@85/0/0/15");
    cfg.draft.mass = -1.0f, cfg.draft.min_keep = 2.0f;
    CHECK(qva_draft_step_check(&cfg, c.N, 64, &dense) == QVA_OK, "%s", qva_last_error());
    /* CUDA does not run the MASS budget: qva_supports says why. */
    char why[256] = "";
    CHECK(!qva_supports(QVA_DEVICE_CUDA, &ok, QVA_F32, 128, why, sizeof why), "cuda");
    CHECK(qva_cuda_available() == 0 || strstr(why, "adaptive draft budget: CPU reference only"),
          "cuda reason: %s", why);
    dcase_free(&c);
}

/* ------------------------------------------------------------ the rule */

static void test_integers(void) {
    CHECK(qvi_draft_mass_weight(0.5f) == (uint64_t)1 << 39, "w(1/2)");
    CHECK(qvi_draft_mass_weight(1.0f) == QVI_DRAFT_MASS_ONE, "w(1)");
    CHECK(qvi_draft_mass_weight(2.0f) == QVI_DRAFT_MASS_ONE, "w(2) saturates");
    CHECK(qvi_draft_mass_weight(nextafterf(1.0f, 0.0f)) == QVI_DRAFT_MASS_ONE - (1u << 16),
          "w(1 - 2^-24)");
    CHECK(qvi_draft_mass_weight(0x1p-41f) == 0 && qvi_draft_mass_weight(0x1p-40f) == 1,
          "w at 2^-40");
    CHECK(qvi_draft_mass_weight(NAN) == 0 && qvi_draft_mass_weight(-0.0f) == 0 &&
              qvi_draft_mass_weight(-1.0f) == 0,
          "w of NaN and negatives");
    CHECK(qvi_draft_ppm_of(10, 500000, 1) == 5 && qvi_draft_ppm_of(11, 500000, 1) == 6 &&
              qvi_draft_ppm_of(11, 500000, 0) == 5,
          "ppm rounding");
    const uint64_t big = UINT64_MAX;
    CHECK(qvi_draft_ppm_of(big, 1000000, 1) == big && qvi_draft_ppm_of(big, 0, 1) == 0,
          "ppm at the ends");
    CHECK(qvi_draft_ppm_of(big, 999999, 1) == 18446725626965477906ull &&
              qvi_draft_ppm_of(big, 999999, 0) == 18446725626965477905ull &&
              qvi_draft_ppm_of(big, 1, 1) == 18446744073710ull &&
              qvi_draft_ppm_of(big, 1, 0) == 18446744073709ull,
          "ppm of 2^64 - 1 without overflow");
}

/* A hand-built 3x3 map of binary fractions summing to 1 (weights exact):
 * pairs in rank order 0, 1, 2, ..., with 6 and 7 tied and 8 empty. */
static const float MAP9[9] = {0.5f,       0.25f,      0.125f,     0.0625f, 0.03125f,
                              0.015625f, 0.0078125f, 0.0078125f, 0.0f};

static int64_t keep_of(const float *A, int64_t M, int64_t ppm, int64_t lo, int64_t hi) {
    int64_t k = -1;
    CHECK(qvi_draft_mass_keep(A, M, ppm, lo, hi, &k) == QVA_OK, "%s", qva_last_error());
    return k;
}

/* A plan of the MASS budget with these integers (what plan_make fills). */
static qvi_draft_plan mass_plan(int64_t ppm, int64_t lo, int64_t hi) {
    qvi_draft_plan p;
    memset(&p, 0, sizeof p);
    p.mass = 1;
    p.mass_ppm = ppm;
    p.keep_min = lo;
    p.keep_max = hi;
    return p;
}

static void test_known_counts(void) {
    CHECK(keep_of(MAP9, 9, 500000, 0, 9) == 1, "50%%: the first pair holds it");
    CHECK(keep_of(MAP9, 9, 750000, 0, 9) == 2, "75%%: exactly two");
    CHECK(keep_of(MAP9, 9, 750001, 0, 9) == 3, "a ppm past 75%%: three");
    CHECK(keep_of(MAP9, 9, 990000, 0, 9) == 7, "99%%: one of the tied pair");
    CHECK(keep_of(MAP9, 9, 1000000, 0, 9) == 8, "100%%: every pair with mass, not the empty one");
    CHECK(keep_of(MAP9, 9, 1, 0, 9) == 1, "1 ppm: one");
    /* The route of 99%: the tie goes to the lower pair index (6). */
    qva_draft_params split;
    memset(&split, 0, sizeof split);
    split.frac8 = 0.5f, split.frac16 = 0.5f;
    qvi_draft_plan p = mass_plan(990000, 0, 9);
    int64_t quota[4];
    uint8_t prec[9];
    CHECK(qvi_draft_route_head(MAP9, 3, &split, &p, quota, prec) == QVA_OK, "route");
    CHECK(quota[0] == 2 && quota[1] == 0 && quota[2] == 3 && quota[3] == 4,
          "99%% split 0/50/50 of 7: %lld/%lld/%lld/%lld", (long long)quota[0],
          (long long)quota[1], (long long)quota[2], (long long)quota[3]);
    const uint8_t want[9] = {16, 16, 16, 16, 8, 8, 8, 0, 0};
    for (int i = 0; i < 9; ++i)
        CHECK(prec[i] == want[i], "99%%: pair %d got %d want %d", i, prec[i], want[i]);
    /* Empty map: nothing to keep but the floor. */
    const float zeros[4] = {0, 0, 0, 0};
    CHECK(keep_of(zeros, 4, 950000, 0, 4) == 0 && keep_of(zeros, 4, 950000, 2, 4) == 2,
          "zero mass");
}

static void test_floor_and_cap(void) {
    CHECK(keep_of(MAP9, 9, 500000, 4, 9) == 4, "floor raises 1 to 4");
    CHECK(keep_of(MAP9, 9, 990000, 0, 3) == 3, "cap lowers 7 to 3");
    CHECK(keep_of(MAP9, 9, 990000, 5, 5) == 5, "floor = cap");
    CHECK(keep_of(MAP9, 9, 500000, 5, 4) == 4, "the cap wins when they cross");
    /* The plan's rounding: the floor up, the cap down, in whole pairs. */
    dcase c = dcase_new(1, 1, 12, 32, 0, 64); /* R = 3, M = 9 */
    qva_config cfg = dcase_config(&c, "draft@p90");
    cfg.draft.min_keep = 0.3f, cfg.draft.max_keep = 0.3f; /* 2.7 pairs */
    qva_tensor q = qva_tensor_hnd(c.q, QVA_F32, QVA_DEVICE_CPU, 1, 1, c.N, c.D);
    qvi_draft_plan p;
    CHECK(qvi_draft_plan_make(&cfg, &q, &p) == QVA_OK, "%s", qva_last_error());
    CHECK(p.regions == 3 && p.mass && p.mass_ppm == 900000 && p.keep_min == 3 &&
              p.keep_max == 2,
          "plan: R %lld ppm %lld keep [%lld, %lld]", (long long)p.regions,
          (long long)p.mass_ppm, (long long)p.keep_min, (long long)p.keep_max);
    CHECK(p.quota[0] == 0 && p.quota[3] == 0 && !p.with4 && !p.with8, "no plan quotas");
    cfg.draft.min_keep = 0.0f, cfg.draft.max_keep = 0.0f;
    CHECK(qvi_draft_plan_make(&cfg, &q, &p) == QVA_OK && p.keep_max == 0, "cap 0");
    /* The floor and cap end to end: every head keeps exactly the share. */
    dcase_fill_random(&c);
    cfg = dcase_config(&c, "draft@p1");
    cfg.draft.min_keep = 0.5f, cfg.draft.max_keep = 0.5f; /* ceil 4.5 = 5 > floor 4 */
    qva_context_t *ctx;
    qva_context_create(&ctx, QVA_DEVICE_CPU);
    float *out = malloc(dcase_elems(&c) * sizeof(float));
    dcase_run(ctx, &c, &cfg, out, NULL, NULL);
    qva_draft_stats st;
    CHECK(qva_context_last_draft_stats(ctx, &st) == QVA_OK && st.heads == 1 && st.pairs == 9 &&
              st.kept_min == 4.0 / 9 && st.kept_max == 4.0 / 9,
          "stats %lld heads %lld pairs kept [%g, %g]", (long long)st.heads,
          (long long)st.pairs, st.kept_min, st.kept_max);
    free(out);
    qva_context_free(ctx);
    dcase_free(&c);
}

/* ------------------------------------------------------------ order */

/* Kept flags of one head's route (prec != 0) under plan p. */
static void kept_flags(const float *A, int64_t R, const qvi_draft_plan *p, uint8_t *kept) {
    qva_draft_params all16;
    memset(&all16, 0, sizeof all16);
    all16.frac16 = 1.0f;
    int64_t quota[4];
    CHECK(qvi_draft_route_head(A, R, &all16, p, quota, kept) == QVA_OK, "route");
    for (int64_t i = 0; i < R * R; ++i)
        kept[i] = kept[i] != 0;
}

/* Moving the pairs around moves the kept set with them (distinct values),
 * and keeps the kept values (with ties: the tie rule picks among them). */
static void test_order_independence(void) {
    enum { R = 20, M = R * R };
    float A[M], B[M];
    int64_t perm[M];
    uint8_t ka[M], kb[M];
    for (int levels = 0; levels < 2; ++levels) {
        for (int i = 0; i < M; ++i) /* levels: 7 distinct values, many ties */
            A[i] = levels ? (float)(1 + (int)(7 * rng_unit())) / 4096.0f
                          : (float)(rng_unit() * rng_unit() * 0.02);
        for (int i = 0; i < M; ++i)
            perm[i] = i;
        for (int i = M - 1; i > 0; --i) { /* Fisher-Yates */
            int j = (int)(rng_unit() * (i + 1));
            int64_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int i = 0; i < M; ++i)
            B[perm[i]] = A[i];
        for (int64_t ppm = 100000; ppm <= 1000000; ppm += 150000) {
            qvi_draft_plan p = mass_plan(ppm, 0, M);
            kept_flags(A, R, &p, ka);
            kept_flags(B, R, &p, kb);
            int64_t na = 0, nb = 0, moved = 1;
            uint64_t wa = 0, wb = 0; /* the kept mass */
            for (int i = 0; i < M; ++i) {
                na += ka[i], nb += kb[i];
                wa += ka[i] ? qvi_draft_mass_weight(A[i]) : 0;
                wb += kb[i] ? qvi_draft_mass_weight(B[i]) : 0;
                moved &= ka[i] == kb[perm[i]];
            }
            CHECK(na == nb && wa == wb, "ties %d ppm %lld: kept %lld / %lld, mass %llu / %llu",
                  levels, (long long)ppm, (long long)na, (long long)nb,
                  (unsigned long long)wa, (unsigned long long)wb);
            CHECK(levels || moved, "distinct values, ppm %lld: the kept set did not move",
                  (long long)ppm);
            CHECK(keep_of(A, M, ppm, 0, M) == na, "mass_keep = route count");
        }
    }
}

/* ------------------------------------------------------------ heads */

/* Head 1 of c: smooth random Fourier features of (t, y, x) in both Q and
 * K, sharp enough that each token attends to its neighbourhood. */
static void make_local_head(dcase *c, int h, double gain) {
    enum { F = 32 }; /* 2F = D = 64 channels */
    double om[F][3], ph[F];
    for (int i = 0; i < F; ++i) {
        for (int j = 0; j < 3; ++j)
            om[i][j] = 0.12 * dcase_normal(); /* wavelengths past a region */
        ph[i] = 6.283185307179586 * rng_unit();
    }
    for (int t = 0; t < c->N - c->P; ++t) {
        const double pos[3] = {t / (c->gh * c->gw), (t / c->gw) % c->gh, t % c->gw};
        float *q = c->q + ((size_t)h * c->N + c->P + t) * c->D;
        float *k = c->k + ((size_t)h * c->N + c->P + t) * c->D;
        for (int i = 0; i < F; ++i) {
            double a = om[i][0] * 4 * pos[0] + om[i][1] * pos[1] + om[i][2] * pos[2] + ph[i];
            q[2 * i] = k[2 * i] = (float)(gain * cos(a));
            q[2 * i + 1] = k[2 * i + 1] = (float)(gain * sin(a));
        }
    }
}

/* Counts of 16/8/4-bit pairs of head h in a probe's route. */
static void head_counts(const uint8_t *prec, int64_t M, int h, int64_t n[4]) {
    n[0] = n[1] = n[2] = n[3] = 0;
    for (int64_t i = 0; i < M; ++i) {
        uint8_t p = prec[(size_t)h * M + i];
        n[p == 4 ? QVI_Q_4 : p == 8 ? QVI_Q_8 : p == 16 ? QVI_Q_16 : QVI_Q_SKIP] += 1;
    }
}

/* A global head (q = 0: a uniform draft map) keeps ceil(p M) pairs; a
 * local one keeps few. */
static void test_global_and_local(qva_context_t *ctx) {
    dcase c = dcase_new(2, 4, 16, 32, 0, 64); /* R = 16, M = 256 */
    dcase_fill_random(&c);
    memset(c.q, 0, sizeof(float) * (size_t)c.N * c.D); /* head 0 */
    make_local_head(&c, 1, 2.0);
    const int64_t M = dcase_regions(&c) * dcase_regions(&c);
    uint8_t *prec = malloc((size_t)(2 * M));
    float *out = malloc(dcase_elems(&c) * sizeof(float));
    qvi_draft_probe probe = {NULL, 0, prec};
    for (int64_t ppm = 500000; ppm <= 900000; ppm += 400000) {
        qva_config cfg = dcase_config(&c, ppm == 500000 ? "draft@p50" : "draft@p90");
        cfg.draft.min_keep = 0.0f;
        dcase_run(ctx, &c, &cfg, out, NULL, &probe);
        int64_t g[4], l[4];
        head_counts(prec, M, 0, g);
        head_counts(prec, M, 1, l);
        const int64_t want = (int64_t)qvi_draft_ppm_of((uint64_t)M, ppm, 1);
        CHECK(M - g[QVI_Q_SKIP] == want, "global head at %lld ppm keeps %lld, want %lld",
              (long long)ppm, (long long)(M - g[QVI_Q_SKIP]), (long long)want);
        CHECK(M - l[QVI_Q_SKIP] < M / 4, "local head at %lld ppm keeps %lld of %lld",
              (long long)ppm, (long long)(M - l[QVI_Q_SKIP]), (long long)M);
        printf("  %lld ppm: global head keeps %lld / %lld, local head %lld\n", (long long)ppm,
               (long long)(M - g[QVI_Q_SKIP]), (long long)M, (long long)(M - l[QVI_Q_SKIP]));
        qva_draft_stats st;
        qva_context_last_draft_stats(ctx, &st);
        CHECK(st.heads == 2 && st.kept_max == (double)want / M &&
                  st.kept_min == (double)(M - l[QVI_Q_SKIP]) / M,
              "stats [%g, %g]", st.kept_min, st.kept_max);
    }
    free(prec), free(out);
    dcase_free(&c);
}

/* ------------------------------------------------------------ equality */

/* Head h of c as a one-head case. */
static dcase one_head(const dcase *c, int h) {
    dcase o = dcase_new(1, c->T, c->gh, c->gw, c->P, c->D);
    size_t n = (size_t)c->N * c->D, at = (size_t)h * n;
    memcpy(o.q, c->q + at, n * sizeof(float));
    memcpy(o.k, c->k + at, n * sizeof(float));
    memcpy(o.v, c->v + at, n * sizeof(float));
    return o;
}

/* The QUOTA config whose quotas over M pairs are n (checked). */
static qva_config fixed_config(const dcase *c, const int64_t n[4], int64_t M) {
    qva_config cfg = dcase_config(c, "draft@85/0/0/15");
    cfg.draft.frac_skip = (float)((double)n[QVI_Q_SKIP] / (double)M);
    cfg.draft.frac4 = (float)((double)n[QVI_Q_4] / (double)M);
    cfg.draft.frac8 = (float)((double)n[QVI_Q_8] / (double)M);
    cfg.draft.frac16 = (float)((double)n[QVI_Q_16] / (double)M);
    int64_t q[4];
    CHECK(qvi_draft_quotas(&cfg.draft, M, q) == QVA_OK && !memcmp(q, n, sizeof q),
          "fixed quotas %lld/%lld/%lld/%lld", (long long)q[0], (long long)q[1],
          (long long)q[2], (long long)q[3]);
    return cfg;
}

/* Per head, the MASS output equals the QUOTA output of the counts it chose,
 * bit for bit (output and LSE): the budget only chooses the counts. */
static void test_equals_fixed(qva_context_t *ctx) {
    dcase c = dcase_new(3, 4, 16, 32, 13, 64);
    dcase_fill_random(&c);
    make_local_head(&c, 1, 1.5);
    make_local_head(&c, 2, 0.7);
    const int64_t M = dcase_regions(&c) * dcase_regions(&c);
    const size_t hn = (size_t)c.N * c.D;
    uint8_t *prec = malloc((size_t)(c.H * M));
    float *out = malloc(dcase_elems(&c) * 4), *lse = malloc((size_t)c.H * c.N * 4);
    float *o1 = malloc(hn * 4), *l1 = malloc((size_t)c.N * 4);
    static const char *methods[] = {"draft@p90/0/50/50", "draft@p95/20/30/50+expcast"};
    for (int mi = 0; mi < 2; ++mi) {
        qva_config cfg = dcase_config(&c, methods[mi]);
        qvi_draft_probe probe = {NULL, 0, prec};
        dcase_run(ctx, &c, &cfg, out, lse, &probe);
        for (int h = 0; h < c.H; ++h) {
            int64_t n[4];
            head_counts(prec, M, h, n);
            printf("  %s head %d keeps %lld/%lld/%lld (4/8/16) of %lld\n", methods[mi], h,
                   (long long)n[QVI_Q_4], (long long)n[QVI_Q_8], (long long)n[QVI_Q_16],
                   (long long)M);
            dcase o = one_head(&c, h);
            qva_config fixed = fixed_config(&o, n, M);
            fixed.expcast = cfg.expcast;
            dcase_run(ctx, &o, &fixed, o1, l1, NULL);
            CHECK(!memcmp(o1, out + h * hn, hn * 4) && !memcmp(l1, lse + (size_t)h * c.N, (size_t)c.N * 4),
                  "%s head %d (%lld/%lld/%lld/%lld): differs from the fixed quotas",
                  methods[mi], h, (long long)n[0], (long long)n[1], (long long)n[2],
                  (long long)n[3]);
            dcase_free(&o);
        }
    }
    free(prec), free(out), free(lse), free(o1), free(l1);
    dcase_free(&c);
}

/* A dense warm-up step routes nothing; a QUOTA call reports its share. */
static void test_stats(qva_context_t *ctx) {
    dcase c = dcase_new(2, 2, 16, 32, 5, 64);
    dcase_fill_random(&c);
    float *out = malloc(dcase_elems(&c) * 4);
    qva_config cfg = dcase_config(&c, "draft@85/0/0/15");
    dcase_run(ctx, &c, &cfg, out, NULL, NULL);
    qva_draft_stats st;
    qva_context_last_draft_stats(ctx, &st);
    CHECK(st.heads == 2 && st.pairs == 64 && st.kept_min == 10.0 / 64 &&
              st.kept_max == st.kept_min && st.kept_mean == st.kept_min,
          "quota stats: %lld heads, %lld pairs, %g", (long long)st.heads, (long long)st.pairs,
          st.kept_mean);
    cfg = dcase_config(&c, "draft@p90");
    cfg.draft.dense_warmup_steps = 1;
    dcase_run(ctx, &c, &cfg, out, NULL, NULL);
    qva_context_last_draft_stats(ctx, &st);
    CHECK(st.heads == 0, "warm-up step: %lld heads", (long long)st.heads);
    CHECK(qva_context_last_draft_stats(NULL, &st) == QVA_ERR_INVALID_ARGUMENT, "NULL ctx");
    free(out);
    dcase_free(&c);
}

int main(void) {
    test_parse();
    test_validation();
    test_integers();
    test_known_counts();
    test_floor_and_cap();
    test_order_independence();
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context");
    if (ctx) {
        test_global_and_local(ctx);
        test_equals_fixed(ctx);
        test_stats(ctx);
        qva_context_free(ctx);
    }
    return check_summary("test_draft_adaptive");
}
