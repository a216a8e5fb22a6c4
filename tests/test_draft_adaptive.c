/* The adaptive (MASS) draft budget (docs/DRAFT.md, "Adaptive budget"):
 * method strings and validation, the integer mass rule on hand-built
 * maps, floor and cap, order independence, global against local heads,
 * the equality with fixed quotas of the same per-head counts, and the
 * CUDA router's port of the rule (src/draft/budget.h: weights, targets,
 * the split and the weighted digit select) against the CPU functions on
 * the host, so it is checked without a GPU. */
#include <stdlib.h>
#include <string.h>

#define TEST_RNG_SEED 0x5851f42d4c957f2dull
#include "check.h"
#include "draft/budget.h"
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
    /* CUDA runs the MASS budget wherever it runs draft. */
    char why[256] = "";
    const int cuda = qva_supports(QVA_DEVICE_CUDA, &ok, QVA_F32, 64, why, sizeof why);
    CHECK(cuda == (qva_cuda_available() != 0), "cuda: %d (%s)", cuda, why);
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

/* ------------------------------------------------------------ device port */

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* qvi_budget_weight (shifts on the bits) = qvi_draft_mass_weight (FP64
 * floor) on every exponent of both signs and on random patterns. */
static void test_port_weight(void) {
    long bad = 0;
    for (uint32_t sign = 0; sign < 2; ++sign)
        for (uint32_t e = 0; e < 256; ++e)
            for (int j = 0; j < 40; ++j) {
                const uint32_t m = j == 0 ? 0u : j == 1 ? 1u : j == 2 ? 0x7fffffu
                                 : j == 3 ? 0x400000u : (uint32_t)(rng_u64() & 0x7fffffu);
                const uint32_t u = sign << 31 | e << 23 | m;
                bad += qvi_budget_weight(u) != qvi_draft_mass_weight(float_of(u));
            }
    for (int i = 0; i < 1000000; ++i) {
        const uint32_t u = (uint32_t)rng_u64();
        bad += qvi_budget_weight(u) != qvi_draft_mass_weight(float_of(u));
    }
    for (int i = 0; i < 200000; ++i) { /* the map's own range, [0, 1] */
        const float a = (float)(rng_unit() * pow(2.0, -40.0 * rng_unit()));
        bad += qvi_budget_weight(bits_of(a)) != qvi_draft_mass_weight(a);
    }
    CHECK(bad == 0, "device weight differs from qvi_draft_mass_weight on %ld inputs", bad);
    CHECK(QVI_BUDGET_ONE == QVI_DRAFT_MASS_ONE, "one");
}

/* The orderable key orders numbers as the CPU's ranking does (ties for
 * equal values, -0 == +0) and puts NaN below them all. */
static void test_port_order_key(void) {
    long bad = 0;
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, 0x1p-149f, -0x1p-149f};
    for (int i = 0; i < 200000; ++i) {
        const float a = i < 64 ? special[i % 8] : float_of((uint32_t)rng_u64());
        const float b = i < 64 ? special[i / 8] : rng_unit() < 0.2 ? a : float_of((uint32_t)rng_u64());
        const uint32_t ka = qvi_budget_order_key(bits_of(a)), kb = qvi_budget_order_key(bits_of(b));
        if (isnan(a) || isnan(b))
            bad += isnan(a) ? ka != 0 || (!isnan(b) && kb == 0) : kb != 0 || ka == 0;
        else
            bad += (a > b) != (ka > kb) || (a == b) != (ka == kb);
    }
    CHECK(bad == 0, "order key disagrees with the ranking on %ld pairs", bad);
}

/* ppm_of (one function for the plan and the device) against 128-bit
 * arithmetic: ceil or floor of ppm * x / 10^6 exactly. */
static void test_port_ppm(void) {
#ifdef __SIZEOF_INT128__
    long bad = 0;
    for (int i = 0; i < 300000; ++i) {
        const uint64_t x = i < 3 ? (i == 0 ? 0 : i == 1 ? UINT64_MAX : 999999)
                                 : rng_u64() >> (int)(64 * rng_unit());
        const int64_t ppm = i % 7 == 0 ? 1000000 : i % 7 == 1 ? 0 : (int64_t)(rng_u64() % 1000001);
        const unsigned __int128 p = (unsigned __int128)x * (uint64_t)ppm;
        for (int up = 0; up < 2; ++up) {
            const unsigned __int128 want = p / 1000000u + (up && p % 1000000u != 0);
            bad += (unsigned __int128)qvi_draft_ppm_of(x, ppm, up) != want;
        }
    }
    CHECK(bad == 0, "ppm_of differs from 128-bit arithmetic on %ld inputs", bad);
#endif
}

/* Random valid fractions: whole ppm, or decimals a user would type (7.5%),
 * or plain random floats normalised; frac_skip 0 under MASS. */
static void random_fractions(qva_draft_params *dp, int mass) {
    float f[4];
    const int kind = (int)(3 * rng_unit());
    double sum = 0.0;
    for (int i = 0; i < 4; ++i) {
        const double r = rng_unit() < 0.25 ? 0.0 : rng_unit();
        f[i] = kind == 0 ? (float)r : kind == 1 ? (float)(floor(r * 40) / 2) : (float)floor(r * 1e6);
        if (mass && i == 0) f[i] = 0.0f;
        sum += f[i];
    }
    if (sum == 0.0) f[3] = 1.0f, sum = 1.0;
    double acc = 0.0;
    for (int i = 0; i < 3; ++i) f[i] = (float)(f[i] / sum), acc += f[i];
    f[3] = (float)(1.0 - acc); /* the sum within an f32 ulp or so of 1 */
    if (f[3] < 0.0f) f[3] = 0.0f;
    dp->frac_skip = f[0], dp->frac4 = f[1], dp->frac8 = f[2], dp->frac16 = f[3];
}

/* 1 if quota is the largest-remainder split of pairs by u (the rule of
 * docs/DRAFT.md, checked from its definition): the quotas sum to pairs,
 * each is its exact share rounded down or up, and every share rounded up
 * has a larger remainder than every share rounded down, ties going to
 * the higher slot (16 before 8, 4, skip). */
static int is_largest_remainder_split(const int64_t u[4], int64_t pairs, const int64_t quota[4]) {
    const int64_t U = u[0] + u[1] + u[2] + u[3];
    int64_t sum = 0, fl[4], rem[4];
    int up[4];
    for (int i = 0; i < 4; ++i) {
        fl[i] = u[i] * pairs / U, rem[i] = u[i] * pairs % U;
        if (quota[i] != fl[i] && quota[i] != fl[i] + 1) return 0;
        up[i] = quota[i] == fl[i] + 1;
        sum += quota[i];
    }
    if (sum != pairs) return 0;
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
            if (up[i] && !up[j] && (rem[i] < rem[j] || (rem[i] == rem[j] && i < j))) return 0;
    return 1;
}

/* qvi_draft_quotas (the plan's) and qvi_budget_split (the device's, the
 * same function) against the rule's definition. */
static void test_port_split(void) {
    long bad = 0, runs = 0;
    for (int i = 0; i < 20000; ++i) {
        qva_draft_params dp;
        memset(&dp, 0, sizeof dp);
        random_fractions(&dp, i & 1);
        const int64_t u[4] = {llround((double)dp.frac_skip * 1e6), llround((double)dp.frac4 * 1e6),
                              llround((double)dp.frac8 * 1e6), llround((double)dp.frac16 * 1e6)};
        for (int j = 0; j < 8; ++j) {
            const int64_t pairs = j == 0 ? 0 : j == 1 ? 1 : j == 2 ? (int64_t)46340 * 46340
                                : j < 5 ? (int64_t)(rng_u64() % 100) : (int64_t)(rng_u64() % 2147483648u);
            int64_t want[4], got[4];
            if (qvi_draft_quotas(&dp, pairs, want) != QVA_OK) {
                CHECK(0, "fractions %g/%g/%g/%g: %s", (double)dp.frac_skip, (double)dp.frac4,
                      (double)dp.frac8, (double)dp.frac16, qva_last_error());
                return;
            }
            qvi_budget_split(u, pairs, got);
            bad += memcmp(want, got, sizeof want) != 0 || !is_largest_remainder_split(u, pairs, got);
            ++runs;
        }
    }
    /* The quotas of the tests and benches, every pair count to 2000. */
    const char *names[] = {"85/0/7.5/7.5", "0/40/30/30", "50/20/15/15", "60/10/15/15"};
    for (int i = 0; i < 4; ++i) {
        qva_config cfg;
        qva_config_default(&cfg);
        char m[64];
        snprintf(m, sizeof m, "draft@%s", names[i]);
        CHECK(qva_config_set_method(&cfg, m) == QVA_OK, "%s", m);
        const qva_draft_params *dp = &cfg.draft;
        const int64_t u[4] = {llround((double)dp->frac_skip * 1e6), llround((double)dp->frac4 * 1e6),
                              llround((double)dp->frac8 * 1e6), llround((double)dp->frac16 * 1e6)};
        for (int64_t pairs = 0; pairs < 2000; ++pairs) {
            int64_t got[4];
            CHECK(qvi_draft_quotas(dp, pairs, got) == QVA_OK, "%s", m);
            bad += !is_largest_remainder_split(u, pairs, got);
            ++runs;
        }
    }
    /* The rule itself rejects a wrong split (so the checks above can fail). */
    const int64_t u3[4] = {1, 1, 1, 0}, ok3[4] = {1, 1, 2, 0}, wrong3[4] = {2, 1, 1, 0};
    CHECK(is_largest_remainder_split(u3, 4, ok3) && !is_largest_remainder_split(u3, 4, wrong3),
          "the largest-remainder check: tie order");
    CHECK(bad == 0, "the split breaks the largest-remainder rule in %ld of %ld runs", bad, runs);
}

/* The router's weighted select on the host: per value digit the counts
 * and w-sums of the group's keys (what dr_mass_select_kernel accumulates),
 * the walk, then the count.  Returns K_mass. */
static int64_t port_keep(const float *A, int64_t M, int64_t ppm) {
    qvi_budget_sel s = {0, 0, 0, 0}; /* qvi_budget_start sets it at shift 56 */
    for (int shift = 56; shift >= 32; shift -= 8) {
        unsigned cnt[256];
        uint64_t w[256];
        memset(cnt, 0, sizeof cnt);
        memset(w, 0, sizeof w);
        const uint64_t high = shift == 56 ? 0 : ~0ull << (shift + 8);
        const uint64_t pre = shift == 56 ? 0 : s.prefix;
        for (int64_t i = 0; i < M; ++i) {
            const uint64_t v = (uint64_t)qvi_budget_order_key(bits_of(A[i])) << 32;
            if ((v & high) != pre) continue;
            const int d = (int)((v >> shift) & 255u);
            cnt[d] += 1;
            w[d] += qvi_budget_weight(bits_of(A[i]));
        }
        if (shift == 56) {
            uint64_t S = 0;
            for (int d = 0; d < 256; ++d) S += w[d];
            qvi_budget_start(&s, S, ppm);
        }
        qvi_budget_digit(&s, cnt, w, shift);
    }
    return qvi_budget_count(&s);
}

/* A map of kind k over M pairs of R rows: 0 softmax rows (the router's
 * shape), 1 few levels (ties), 2 all equal, 3 zeros, 4 with negatives,
 * NaN, values >= 1 and subnormals, 5 a single heavy pair. */
static void port_map(float *A, int R, int kind) {
    const int M = R * R;
    for (int a = 0; a < R; ++a) {
        double sum = 0.0;
        for (int b = 0; b < R; ++b) {
            const double x = kind == 1 ? (double)(1 + (int)(5 * rng_unit()))
                           : exp(6.0 * rng_unit() * rng_unit());
            A[a * R + b] = (float)x, sum += x;
        }
        for (int b = 0; b < R; ++b) A[a * R + b] = (float)(A[a * R + b] / sum);
    }
    if (kind == 2)
        for (int i = 0; i < M; ++i) A[i] = 1.0f / (float)R;
    if (kind == 3)
        for (int i = 0; i < M; ++i) A[i] = 0.0f;
    if (kind == 4)
        for (int i = 0; i < M; ++i) {
            const double u = rng_unit();
            A[i] = u < 0.05 ? -A[i] : u < 0.08 ? NAN : u < 0.1 ? 1.0f + (float)u
                 : u < 0.12 ? 0x1p-140f : u < 0.14 ? 0x1p-41f : u < 0.16 ? -0.0f : A[i];
        }
    if (kind == 5) {
        for (int i = 0; i < M; ++i) A[i] = 1e-9f;
        A[(int)(rng_unit() * M)] = 0.999f;
    }
}

/* K_mass and the whole per-head route of the port = the CPU's, on maps of
 * every kind, R up to 24, masses from 1 ppm to 100%, floors and caps. */
static void test_port_select(void) {
    enum { RMAX = 24 };
    static float A[RMAX * RMAX];
    static uint8_t prec[RMAX * RMAX];
    const int64_t ppms[] = {1, 500000, 900000, 950000, 999999, 1000000, -1};
    long bad = 0, runs = 0;
    for (int it = 0; it < 600; ++it) {
        const int R = it < 6 ? 1 + it : 1 + (int)(RMAX * rng_unit());
        const int64_t M = (int64_t)R * R;
        port_map(A, R, it % 6);
        for (size_t j = 0; j < sizeof ppms / sizeof *ppms; ++j) {
            const int64_t ppm = ppms[j] >= 0 ? ppms[j] : (int64_t)(rng_u64() % 1000001);
            const int64_t want = keep_of(A, M, ppm, 0, M), got = port_keep(A, M, ppm);
            if (want != got && bad < 5)
                fprintf(stderr, "  port select: R %d kind %d ppm %lld: K %lld, CPU %lld\n", R,
                        it % 6, (long long)ppm, (long long)got, (long long)want);
            bad += want != got;
            /* the clamp and the split of one head's route */
            const int64_t lo = (int64_t)(rng_u64() % (uint64_t)(M + 1));
            const int64_t hi = rng_unit() < 0.3 ? lo : lo + (int64_t)(rng_u64() % (uint64_t)(M - lo + 1));
            qva_draft_params dp;
            memset(&dp, 0, sizeof dp);
            random_fractions(&dp, 1);
            qvi_draft_plan p = mass_plan(ppm, lo, hi);
            int64_t q[4], g[4];
            CHECK(qvi_draft_route_head(A, R, &dp, &p, q, prec) == QVA_OK, "%s", qva_last_error());
            const int64_t u[4] = {0, llround((double)dp.frac4 * 1e6), llround((double)dp.frac8 * 1e6),
                                  llround((double)dp.frac16 * 1e6)};
            const int64_t k = qvi_budget_clamp(got, lo, hi);
            qvi_budget_split(u, k, g);
            g[QVI_Q_SKIP] = M - k;
            bad += memcmp(q, g, sizeof q) != 0;
            runs += 2;
        }
    }
    CHECK(bad == 0, "the device rule differs from the CPU's in %ld of %ld runs", bad, runs);
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
    test_port_weight();
    test_port_order_key();
    test_port_ppm();
    test_port_split();
    test_port_select();
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
