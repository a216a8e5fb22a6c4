/* DraftAttention2 (src/draft/, src/cpu/draft.c): the ragged
 * partition (DA2 Eq. 20-21), packing, router (Eq. 2, Algorithm 1, C.1),
 * quotas, the Eq. 8 phase scaling, and the phased kernel end to end
 * against the bf16 and exact methods. */
#include <stdlib.h>
#include <string.h>

#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include "check.h"
#include "cpu/draft.h"
#include "draft/partition.h"
#include "draft/plan.h"
#include "draft/router.h"

/* ------------------------------------------------------------ helpers */

static double urand(void) { /* uniform in (0, 1): never 0 for the log */
    return rng_unit() + 0x1p-54;
}
static float nrand(void) { /* standard normal (Box-Muller) */
    return (float)(sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand()));
}
/* Values representable in bf16, so the 16-bit paths see the inputs
 * exactly and only the P rounding separates them from FP64. */
static void fill_bf16(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; ++i)
        x[i] = qva_round_bf16(amp * nrand());
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    double e = 0.0, r = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double d = (double)a[i] - ref[i];
        e += d * d;
        r += (double)ref[i] * ref[i];
    }
    return sqrt(e / (r > 0 ? r : 1.0));
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* ------------------------------------------------------------ partition */

/* 1 if every region of the labelling is 4-connected (BFS per region). */
static int regions_connected(const qvi_partition *p) {
    int n = p->h * p->w, ok = 1;
    int32_t *seen = calloc((size_t)n, sizeof(int32_t));
    int32_t *queue = malloc(sizeof(int32_t) * (size_t)n);
    for (int k = 0; k < p->regions && ok; ++k) {
        int32_t size = p->start[k + 1] - p->start[k], head = 0, tail = 0;
        queue[tail++] = p->cells[p->start[k]];
        seen[queue[0]] = k + 1;
        while (head < tail) {
            int c = queue[head++], y = c / p->w, x = c % p->w;
            int nb[4][2] = {{y - 1, x}, {y + 1, x}, {y, x - 1}, {y, x + 1}};
            for (int i = 0; i < 4; ++i) {
                int yy = nb[i][0], xx = nb[i][1];
                if (yy < 0 || yy >= p->h || xx < 0 || xx >= p->w)
                    continue;
                int cc = yy * p->w + xx;
                if (p->label[cc] == k && seen[cc] != k + 1) {
                    seen[cc] = k + 1;
                    queue[tail++] = cc;
                }
            }
        }
        ok = tail == size;
    }
    free(seen);
    free(queue);
    return ok;
}

/* Sum over regions of unit boundary edges, counted cell side by side. */
static int64_t direct_perimeter(const qvi_partition *p) {
    int64_t per = 0;
    for (int y = 0; y < p->h; ++y)
        for (int x = 0; x < p->w; ++x) {
            int a = p->label[y * p->w + x];
            per += (y == 0 || p->label[(y - 1) * p->w + x] != a);
            per += (y == p->h - 1 || p->label[(y + 1) * p->w + x] != a);
            per += (x == 0 || p->label[y * p->w + x - 1] != a);
            per += (x == p->w - 1 || p->label[y * p->w + x + 1] != a);
        }
    return per;
}

/* Every candidate path of the construction is Hamiltonian with grid-
 * adjacent steps, and the winner has the least E_cut among them. */
static void check_candidates(const qvi_partition *p) {
    int n = p->h * p->w, feasible = 0;
    int32_t *path = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)n);
    char *hit = malloc((size_t)n);
    for (int fam = 0; fam < 2; ++fam) {
        int gh = fam ? p->w : p->h, bmax = gh < p->regions ? gh : p->regions;
        for (int b = 1; b <= bmax; ++b) {
            if (!qvi_partition_path(p->h, p->w, fam, b, path))
                continue;
            ++feasible;
            memset(hit, 0, (size_t)n);
            int perm = 1;
            for (int i = 0; i < n; ++i) {
                perm &= path[i] >= 0 && path[i] < n && !hit[path[i]];
                if (path[i] >= 0 && path[i] < n)
                    hit[path[i]] = 1;
            }
            CHECK(perm, "%dx%d fam %d b %d: path is not a permutation", p->h,
                  p->w, fam, b);
            int64_t q = n / p->regions, rem = n % p->regions, pos = 0;
            for (int k = 0; k < p->regions; ++k)
                for (int64_t i = 0; i < q + (k < rem); ++i)
                    lab[path[pos++]] = k;
            CHECK(qvi_partition_ecut(lab, p->h, p->w) >= p->e_cut,
                  "%dx%d: candidate fam %d b %d beats the winner", p->h, p->w,
                  fam, b);
        }
    }
    /* b = 1 of both families is always feasible. */
    CHECK(feasible >= 2, "%dx%d: only %d feasible candidates", p->h, p->w,
          feasible);
    free(path);
    free(lab);
    free(hit);
}

static void check_partition(int h, int w, int c) {
    qvi_partition p;
    qva_status st = qvi_partition_build(h, w, c, &p);
    CHECK(st == QVA_OK, "build %dx%d c=%d: %s", h, w, c, qva_last_error());
    if (st != QVA_OK)
        return;
    int n = h * w, R = (n + c - 1) / c;
    CHECK(p.regions == R, "%dx%d c=%d: R_f %d, want %d", h, w, c, p.regions, R);
    CHECK(R * c - n >= 0 && R * c - n < c, "%dx%d c=%d: padding %d", h, w, c,
          R * c - n);
    int lo = n, hi = 0;
    for (int k = 0; k < R; ++k) {
        int cnt = p.start[k + 1] - p.start[k];
        lo = cnt < lo ? cnt : lo;
        hi = cnt > hi ? cnt : hi;
        CHECK(cnt == n / R + (k < n % R), "%dx%d c=%d: region %d has %d", h, w,
              c, k, cnt);
        for (int i = p.start[k]; i < p.start[k + 1]; ++i)
            CHECK(p.label[p.cells[i]] == k, "label/cells disagree");
    }
    CHECK(p.start[R] == n, "cells cover the frame");
    CHECK(hi <= c && hi - lo <= 1, "%dx%d c=%d: counts %d..%d", h, w, c, lo, hi);
    CHECK(regions_connected(&p), "%dx%d c=%d: a region is not connected", h,
          w, c);
    int64_t per = direct_perimeter(&p);
    CHECK(per == 2 * ((int64_t)h + w) + 2 * p.e_cut && per == p.perimeter,
          "%dx%d c=%d: Eq. 21 %lld vs direct %lld", h, w, c,
          (long long)p.perimeter, (long long)per);
    CHECK(p.e_cut == qvi_partition_ecut(p.label, h, w), "e_cut");
    check_candidates(&p);
    qvi_partition_free(&p);
}

static void test_partition(void) {
    static const int cases[][3] = {
        {45, 80, 128}, {30, 52, 128}, {12, 20, 128}, {60, 104, 128},
        {48, 85, 128}, {1, 1, 128},   {1, 300, 128}, {300, 1, 128},
        {7, 3, 16},    {13, 17, 10},  {31, 53, 128}, {2, 128, 128},
        {2, 129, 128}, {11, 11, 128}, {45, 80, 64},  {45, 80, 16},
        {9, 7, 1},     {16, 16, 64},  {5, 200, 128}, {200, 5, 128},
        {24, 40, 128}, {17, 23, 37},  {8, 8, 128},   {46, 80, 128}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i)
        check_partition(cases[i][0], cases[i][1], cases[i][2]);
    for (int t = 0; t < 40; ++t) { /* random odd/even shapes */
        int h = 1 + (int)(urand() * 40), w = 1 + (int)(urand() * 60);
        int c = 1 + (int)(urand() * 150);
        check_partition(h, w, c);
    }
    /* The 720p latent grid: 29 blocks per frame, compact regions (a strip
     * of single columns would have perimeter 29 * 2 * (45 + 3)). */
    qvi_partition p;
    CHECK(qvi_partition_build(45, 80, 128, &p) == QVA_OK, "45x80");
    CHECK(p.regions == 29 && p.perimeter < 1500, "45x80: R %d perimeter %lld",
          p.regions, (long long)p.perimeter);
    qvi_partition_free(&p);
    CHECK(qvi_partition_build(0, 5, 128, &p) == QVA_ERR_INVALID_ARGUMENT, "h=0");
}

/* ------------------------------------------------------------ packing */

static void check_layout(int prefix, int at_end) {
    qvi_partition p;
    CHECK(qvi_partition_build(12, 20, 128, &p) == QVA_OK, "partition");
    qvi_draft_layout L;
    CHECK(qvi_draft_layout_build(&p, 2, prefix, at_end, &L) == QVA_OK, "layout");
    int64_t video = 2 * 12 * 20;
    CHECK(L.n == video + prefix && L.regions == 4, "sizes");
    CHECK(L.prefix_pad % 128 == 0 && L.prefix_pad - prefix < 128 &&
              L.prefix_pad >= prefix, "prefix pad %lld", (long long)L.prefix_pad);
    CHECK(L.n_pack == L.prefix_pad + 4 * 128, "n_pack");
    int64_t pad = 0;
    for (int64_t s = 0; s < L.n_pack; ++s) {
        int32_t o = L.pack_to_orig[s];
        if (o < 0) {
            ++pad;
            continue;
        }
        CHECK(o < L.n && L.orig_to_pack[o] == s, "inverse at slot %lld",
              (long long)s);
        int is_prefix = at_end ? o >= video : o < prefix;
        CHECK(is_prefix == (s < L.prefix_pad), "slot %lld holds %d", (long long)s, o);
    }
    CHECK(pad == L.n_pack - L.n, "padding count");
    for (int64_t r = 0; r < L.regions; ++r) /* valid first, then padding */
        for (int i = 0; i < 128; ++i)
            CHECK((L.pack_to_orig[L.prefix_pad + r * 128 + i] >= 0) ==
                      (i < L.count[r]), "region %lld slot %d", (long long)r, i);
    /* Frame 1's regions are frame 0's shifted by H*W. */
    int64_t base = at_end ? 0 : prefix;
    for (int i = 0; i < L.count[0]; ++i)
        CHECK(L.pack_to_orig[L.prefix_pad + 2 * 128 + i] ==
                  L.pack_to_orig[L.prefix_pad + i] + 240 &&
              L.pack_to_orig[L.prefix_pad + i] - base == p.cells[i],
              "frame order at %d", i);
    qvi_draft_layout_free(&L);
    qvi_partition_free(&p);
}

static void test_layout(void) {
    check_layout(0, 0);
    check_layout(7, 0);
    check_layout(7, 1);
    check_layout(128, 0);
    check_layout(200, 1);
}

/* ------------------------------------------------------------ router */

static void test_pool_and_map(void) {
    const int R = 5, c = 8, d = 16;
    int32_t count[5] = {8, 7, 3, 1, 8};
    float *x = calloc((size_t)R * c * d, sizeof(float));
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < count[r]; ++i)
            for (int ch = 0; ch < d; ++ch)
                x[(r * c + i) * d + ch] = nrand();
    float avg[5 * 16], mx[5 * 16];
    qvi_draft_pool(x, count, R, c, d, avg, mx);
    for (int r = 0; r < R; ++r)
        for (int ch = 0; ch < d; ++ch) {
            double s = 0.0;
            float m = -INFINITY;
            for (int i = 0; i < count[r]; ++i) {
                s += x[(r * c + i) * d + ch];
                m = fmaxf(m, x[(r * c + i) * d + ch]);
            }
            CHECK(avg[r * d + ch] == (float)(s / count[r]), "avg %d %d", r, ch);
            CHECK(mx[r * d + ch] == m, "max %d %d (padding must not count)", r, ch);
        }
    /* Eq. 2 in FP64; rows are convex mixtures of two softmaxes. */
    float A[25], A0[25], kavg[5 * 16], kmax[5 * 16];
    for (int i = 0; i < R * d; ++i) {
        kavg[i] = nrand();
        kmax[i] = nrand();
    }
    float sm = 0.25f, lam = 0.2f;
    CHECK(qvi_draft_map(avg, mx, kavg, kmax, R, d, sm, lam, A) == QVA_OK, "map");
    CHECK(qvi_draft_map(avg, mx, kavg, kmax, R, d, sm, 0.0f, A0) == QVA_OK, "map");
    for (int a = 0; a < R; ++a) {
        double e1[5], e2[5], z1 = 0, z2 = 0, row = 0;
        for (int b = 0; b < R; ++b) {
            double l1 = 0, l2 = 0;
            for (int ch = 0; ch < d; ++ch) {
                l1 += (double)avg[a * d + ch] * kavg[b * d + ch];
                l2 += (double)mx[a * d + ch] * kmax[b * d + ch];
            }
            e1[b] = exp(l1 * sm);
            e2[b] = exp(l2 * sm);
            z1 += e1[b];
            z2 += e2[b];
        }
        for (int b = 0; b < R; ++b) {
            double want = 0.8 * e1[b] / z1 + 0.2 * e2[b] / z2;
            CHECK_NEAR(A[a * R + b], want, 1e-7, "draft map");
            CHECK_NEAR(A0[a * R + b], e1[b] / z1, 1e-7, "lambda 0 = avg only");
            row += A[a * R + b];
        }
        CHECK_NEAR(row, 1.0, 1e-6, "row sum");
    }
    free(x);
}

/* The map's softmax sums in the documented warp order (docs/DRAFT.md §3):
 * qvi_draft_warp_sum against the butterfly written as a tree, top level
 * last (partials l and l + 16 first, then l and l + 8, ...), on rows whose
 * sums that order changes, and the map built on it. */
static double sum_tree_top_down(const double *e, int R) {
    double part[QVI_DRAFT_SUM_LANES] = {0};
    for (int b = 0; b < R; ++b) part[b % QVI_DRAFT_SUM_LANES] += e[b];
    for (int w = QVI_DRAFT_SUM_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; ++l) part[l] = part[l] + part[l + w];
    return part[0];
}

static void test_map_sum_order(void) {
    enum { NR = 200, RMAX = 700 };
    double e[RMAX];
    int chain_differs = 0, pairs_differ = 0;
    for (int t = 0; t < NR; ++t) {
        const int R = 1 + (int)(urand() * (RMAX - 1)); /* 1 .. RMAX-1: empty lanes too */
        for (int b = 0; b < R; ++b) e[b] = exp(-8.0 * urand());
        const double got = qvi_draft_warp_sum(e, R), want = sum_tree_top_down(e, R);
        CHECK(got == want, "warp-order sum, R = %d: %.17g against %.17g", R, got, want);
        double chain = 0.0, part[QVI_DRAFT_SUM_LANES] = {0};
        for (int b = 0; b < R; ++b) chain += e[b];
        for (int b = 0; b < R; ++b) part[b % QVI_DRAFT_SUM_LANES] += e[b];
        for (int w = 1; w < QVI_DRAFT_SUM_LANES; w *= 2) /* the other tree: neighbours first */
            for (int l = 0; l < QVI_DRAFT_SUM_LANES; l += 2 * w) part[l] = part[l] + part[l + w];
        chain_differs += chain != got;
        pairs_differ += part[0] != got;
    }
    /* The rows tell the orders apart, so the check above can fail. */
    CHECK(chain_differs > NR / 4, "key-order chain equals the warp order on %d of %d rows",
          NR - chain_differs, NR);
    CHECK(pairs_differ > NR / 10, "neighbour tree equals the warp order on %d of %d rows",
          NR - pairs_differ, NR);

    /* The map divides by that sum: A = (1 - lam) e_a / s_a + lam e_m / s_m. */
    enum { R = 77, d = 8 };
    float qa[R * d], qm[R * d], ka[R * d], km[R * d], A[R * R];
    for (int i = 0; i < R * d; ++i) {
        qa[i] = 2.0f * nrand();
        qm[i] = 2.0f * nrand();
        ka[i] = 2.0f * nrand();
        km[i] = 2.0f * nrand();
    }
    const float sm = 0.5f, lam = 0.3f;
    CHECK(qvi_draft_map(qa, qm, ka, km, R, d, sm, lam, A) == QVA_OK, "map");
    int bad = 0;
    for (int a = 0; a < R; ++a) {
        double p[2][R];
        for (int br = 0; br < 2; ++br) {
            const float *q = br ? qm : qa, *k = br ? km : ka;
            double x[R], mx = -INFINITY;
            for (int b = 0; b < R; ++b) {
                double dot = 0.0;
                for (int c = 0; c < d; ++c) dot += (double)q[a * d + c] * (double)k[b * d + c];
                x[b] = dot * (double)sm;
                mx = x[b] > mx ? x[b] : mx;
            }
            for (int b = 0; b < R; ++b) x[b] = exp(x[b] - mx);
            const double s = sum_tree_top_down(x, R);
            for (int b = 0; b < R; ++b) p[br][b] = x[b] / s;
        }
        for (int b = 0; b < R; ++b)
            bad += A[a * R + b] != (float)((1.0 - (double)lam) * p[0][b] + (double)lam * p[1][b]);
    }
    CHECK(bad == 0, "map entries off the formula with the warp-order sum: %d", bad);
}

static qva_draft_params fracs(float s, float f4, float f8, float f16) {
    qva_draft_params p;
    memset(&p, 0, sizeof p);
    p.frac_skip = s;
    p.frac4 = f4;
    p.frac8 = f8;
    p.frac16 = f16;
    return p;
}

static void expect_quota(qva_draft_params p, int64_t pairs, int64_t s,
                         int64_t f4, int64_t f8, int64_t f16) {
    int64_t q[4] = {-1, -1, -1, -1};
    CHECK(qvi_draft_quotas(&p, pairs, q) == QVA_OK, "quotas: %s", qva_last_error());
    CHECK(q[0] == s && q[1] == f4 && q[2] == f8 && q[3] == f16,
          "pairs %lld: got %lld/%lld/%lld/%lld want %lld/%lld/%lld/%lld",
          (long long)pairs, (long long)q[0], (long long)q[1], (long long)q[2],
          (long long)q[3], (long long)s, (long long)f4, (long long)f8,
          (long long)f16);
}

static void test_quotas(void) {
    /* Exact cases and the documented tie order 16 > 8 > 4 > skip. */
    expect_quota(fracs(0.85f, 0, 0.075f, 0.075f), 16, 14, 0, 1, 1);
    expect_quota(fracs(0.85f, 0, 0, 0.15f), 100, 85, 0, 0, 15);
    expect_quota(fracs(0.5f, 0, 0.25f, 0.25f), 9, 5, 0, 2, 2);
    expect_quota(fracs(0, 0, 0.5f, 0.5f), 9, 0, 0, 4, 5);
    expect_quota(fracs(0.25f, 0.25f, 0.25f, 0.25f), 6, 1, 1, 2, 2);
    expect_quota(fracs(0.25f, 0.25f, 0.25f, 0.25f), 7, 1, 2, 2, 2);
    expect_quota(fracs(0.5f, 0.2f, 0.15f, 0.15f), 16, 8, 3, 2, 3);
    expect_quota(fracs(1, 0, 0, 0), 49, 49, 0, 0, 0);
    expect_quota(fracs(0, 0, 0, 1), 49, 0, 0, 0, 49);
    expect_quota(fracs(0.7f, 0, 0, 0.3f), 10, 7, 0, 0, 3); /* 0.7f < 0.7 */
    /* Sums are exact for many sizes and fraction sets. */
    const float sets[][4] = {{0.85f, 0, 0.075f, 0.075f}, {0.5f, 0.2f, 0.15f, 0.15f},
                             {0.807f, 0.144f, 0.048f, 0.001f}, {0.134f, 0.649f, 0.216f, 0.001f},
                             {0.296f, 0.352f, 0.352f, 0}, {1.0f / 3, 1.0f / 3, 1.0f / 3, 0}};
    for (size_t s = 0; s < sizeof sets / sizeof *sets; ++s)
        for (int64_t R = 1; R <= 200; R += 3) {
            qva_draft_params p = fracs(sets[s][0], sets[s][1], sets[s][2], sets[s][3]);
            int64_t q[4];
            CHECK(qvi_draft_quotas(&p, R * R, q) == QVA_OK, "quotas");
            CHECK(q[0] + q[1] + q[2] + q[3] == R * R, "sum at R %lld", (long long)R);
            for (int i = 0; i < 4; ++i) {
                double ideal = (double)sets[s][i] * (double)(R * R);
                CHECK(fabs((double)q[i] - ideal) < 1.0 + 1e-3 * R * R,
                      "quota %d far from ideal", i);
            }
        }
    qva_draft_params bad = fracs(0.5f, 0.5f, 0.5f, 0);
    int64_t q[4];
    CHECK(qvi_draft_quotas(&bad, 9, q) == QVA_ERR_INVALID_ARGUMENT, "sum 1.5");
    bad = fracs(1.2f, -0.2f, 0, 0);
    CHECK(qvi_draft_quotas(&bad, 9, q) == QVA_ERR_INVALID_ARGUMENT, "negative");
}

static void test_assign(void) {
    /* All equal: ranking is the pair index (ties by region-pair index). */
    float A[9];
    for (int i = 0; i < 9; ++i)
        A[i] = 0.25f;
    uint8_t prec[9];
    int64_t q1[4] = {3, 1, 3, 2}; /* skip, 4, 8, 16 */
    CHECK(qvi_draft_assign(A, 3, q1, prec) == QVA_OK, "assign");
    const uint8_t want1[9] = {16, 16, 8, 8, 8, 4, 0, 0, 0};
    for (int i = 0; i < 9; ++i)
        CHECK(prec[i] == want1[i], "equal A: pair %d got %d want %d", i,
              prec[i], want1[i]);
    /* Mixed ties: order 1,3 (0.9), 0,2,5 (0.5), 6 (0.4), 7,8 (0.3), 4. */
    const float A2[9] = {0.5f, 0.9f, 0.5f, 0.9f, 0.1f, 0.5f, 0.4f, 0.3f, 0.3f};
    int64_t q2[4] = {2, 3, 2, 2};
    CHECK(qvi_draft_assign(A2, 3, q2, prec) == QVA_OK, "assign");
    const uint8_t want2[9] = {8, 16, 8, 16, 0, 4, 4, 4, 0};
    for (int i = 0; i < 9; ++i)
        CHECK(prec[i] == want2[i], "ties: pair %d got %d want %d", i, prec[i],
              want2[i]);
    int64_t q3[4] = {2, 3, 2, 3};
    CHECK(qvi_draft_assign(A2, 3, q3, prec) == QVA_ERR_INVALID_ARGUMENT,
          "quotas not summing to R^2");
}

/* ------------------------------------------------------------ Eq. 8 */

static int64_t ulp_dist(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0)
        ia = INT32_MIN - ia;
    if (ib < 0)
        ib = INT32_MIN - ib;
    return llabs((int64_t)ia - ib);
}

static void test_phase_scaling(void) {
    enum { D = 64 };
    int64_t worst = 0;
    double worst64 = 0.0;
    for (int t = 0; t < 200; ++t) {
        float acc[D], acc0[D], dv[D], l = (float)(urand() * 100), l0 = l;
        double a64[D], a64_0[D], dv64[D], l64 = l;
        for (int c = 0; c < D; ++c) {
            acc[c] = acc0[c] = nrand() * (float)exp(8 * nrand());
            dv[c] = (float)(urand() * exp(4 * nrand()));
            a64[c] = a64_0[c] = acc[c];
            dv64[c] = dv[c];
        }
        for (int e = 0; e < 2; ++e) {
            float eta = qvi_draft_eta(e);
            qvi_draft_phase_enter(acc, &l, D, eta, dv);
            /* Normalised output in the encoded units: delta_c U^enc / l^enc. */
            for (int c = 0; c < D; ++c)
                CHECK(fabs(dv[c] * (double)acc[c] / l - acc0[c] / (double)l0) <=
                          1e-5 * fabs(acc0[c] / (double)l0) + 1e-30,
                      "U/l preserved inside the phase");
            qvi_draft_phase_exit(acc, &l, D, eta, dv);
            qvi_draft_phase_enter_f64(a64, &l64, D, eta, dv64);
            qvi_draft_phase_exit_f64(a64, &l64, D, eta, dv64);
        }
        for (int c = 0; c < D; ++c) {
            int64_t u = ulp_dist(acc[c], acc0[c]);
            worst = u > worst ? u : worst;
            double r = fabs(a64[c] - a64_0[c]) / fabs(a64_0[c]);
            worst64 = r > worst64 ? r : worst64;
        }
        int64_t ul = ulp_dist(l, l0);
        worst = ul > worst ? ul : worst;
        memcpy(acc, acc0, sizeof acc);
        l = l0;
    }
    /* Two round trips (exp2 and ExpCast eta) per value. */
    CHECK(worst <= 2, "float enter/exit round trip: %lld ulp", (long long)worst);
    CHECK(worst64 <= 1e-15, "FP64 enter/exit round trip: %g", worst64);
    CHECK(qvi_draft_eta(1) == 0.00390625f && qvi_draft_eta(0) == QVI_SAGE_ETA, "eta");
}

/* ------------------------------------------------------------ end to end */

typedef struct problem {
    int B, H, N, D, T, gh, gw, P, at_end;
    float *q, *k, *v;
} problem;

static problem make_problem(int T, int gh, int gw, int P, int at_end, int D) {
    problem p = {1, 2, P + T * gh * gw, D, T, gh, gw, P, at_end, NULL, NULL, NULL};
    size_t n = (size_t)p.B * p.H * p.N * p.D;
    p.q = malloc(n * sizeof(float));
    p.k = malloc(n * sizeof(float));
    p.v = malloc(n * sizeof(float));
    fill_bf16(p.q, n, 1.0f);
    fill_bf16(p.k, n, 1.0f);
    fill_bf16(p.v, n, 1.0f);
    return p;
}

static void free_problem(problem *p) {
    free(p->q);
    free(p->k);
    free(p->v);
}

static size_t problem_size(const problem *p) {
    return (size_t)p->B * p->H * p->N * p->D;
}

/* The default config with `method`, p's grid and prefix, at step `step`
 * of a `warmup`-step dense warm-up. */
static void draft_config(const problem *p, const char *method, int step, int warmup,
                         qva_config *cfg) {
    qva_config_default(cfg);
    CHECK(qva_config_set_method(cfg, method) == QVA_OK, "method %s: %s", method,
          qva_last_error());
    cfg->draft.grid_t = p->T;
    cfg->draft.grid_h = p->gh;
    cfg->draft.grid_w = p->gw;
    cfg->draft.prefix_tokens = p->P;
    cfg->draft.prefix_at_end = p->at_end;
    cfg->draft.dense_warmup_steps = warmup;
    cfg->step = step;
}

/* qva_attention of cfg on p; out (and lse if not NULL) receive [B,H,N,*]. */
static qva_status run_config(qva_context_t *ctx, const problem *p, const qva_config *cfg,
                             float *out, float *lse) {
    qva_tensor q = qva_tensor_hnd(p->q, QVA_F32, QVA_DEVICE_CPU, p->B, p->H, p->N, p->D);
    qva_tensor k = qva_tensor_hnd(p->k, QVA_F32, QVA_DEVICE_CPU, p->B, p->H, p->N, p->D);
    qva_tensor v = qva_tensor_hnd(p->v, QVA_F32, QVA_DEVICE_CPU, p->B, p->H, p->N, p->D);
    qva_tensor o = qva_tensor_hnd(out, QVA_F32, QVA_DEVICE_CPU, p->B, p->H, p->N, p->D);
    qva_tensor l = qva_tensor_hnd(lse, QVA_F32, QVA_DEVICE_CPU, p->B, p->H, p->N, 1);
    return qva_attention(ctx, cfg, &q, &k, &v, &o, lse ? &l : NULL);
}

/* Runs one method; out (and lse if not NULL) receive [B,H,N,*]. */
static qva_status run_method(qva_context_t *ctx, const problem *p,
                             const char *method, int step, int warmup,
                             float *out, float *lse) {
    qva_config cfg;
    draft_config(p, method, step, warmup, &cfg);
    const qva_status st = run_config(ctx, p, &cfg, out, lse);
    CHECK(st == QVA_OK, "%s: %s", method, qva_last_error());
    return st;
}

/* cfg on a fresh CPU context (state of its own: vc8 groups from scratch). */
static qva_status run_fresh(const problem *p, const qva_config *cfg, float *out, float *lse) {
    qva_context_t *ctx = NULL;
    if (qva_context_create(&ctx, QVA_DEVICE_CPU) != QVA_OK) return QVA_ERR_OUT_OF_MEMORY;
    const qva_status st = run_config(ctx, p, cfg, out, lse);
    qva_context_free(ctx);
    return st;
}

/* Sequence index range [lo, hi) of the prefix. */
static void prefix_range(const problem *p, int *lo, int *hi) {
    *lo = p->at_end ? p->N - p->P : 0;
    *hi = *lo + p->P;
}

/* Rows [lo,hi) of every head of a and b are bitwise equal. */
static int rows_equal(const problem *p, const float *a, const float *b, int lo,
                      int hi, int width) {
    for (int bh = 0; bh < p->B * p->H; ++bh)
        for (int i = lo; i < hi; ++i)
            if (memcmp(a + ((size_t)bh * p->N + i) * width,
                       b + ((size_t)bh * p->N + i) * width,
                       sizeof(float) * (size_t)width))
                return 0;
    return 1;
}

static void test_dense_equivalences(qva_context_t *ctx) {
    problem p = make_problem(2, 12, 20, 7, 0, 64); /* N = 487 */
    size_t n = problem_size(&p), nl = n / p.D;
    float *bf = malloc(n * 4), *dr = malloc(n * 4), *ex = malloc(n * 4);
    float *lbf = malloc(nl * 4), *ldr = malloc(nl * 4);
    run_method(ctx, &p, "bf16", 0, 0, bf, lbf);
    run_method(ctx, &p, "exact", 0, 0, ex, NULL);
    /* All 16-bit, no skip: bf16 up to summation order (and the P
     * rounding at a different running max). */
    run_method(ctx, &p, "draft@0/0/0/100", 0, 0, dr, ldr);
    double e = rel_l2(dr, bf, n);
    CHECK(e < 2e-3, "draft@0/0/0/100 vs bf16: rel L2 %g", e);
    CHECK(rel_l2(ldr, lbf, nl) < 1e-5, "lse vs bf16");
    CHECK(rows_equal(&p, dr, bf, 0, p.P, p.D), "prefix rows = bf16 exactly");
    CHECK(rel_l2(bf, ex, n) < 1e-2, "bf16 vs exact: %g", rel_l2(bf, ex, n));
    /* Dense warm-up runs the bf16 computation for every row. */
    run_method(ctx, &p, "draft@85/0/7.5/7.5", 1, 2, dr, ldr);
    CHECK(rows_equal(&p, dr, bf, 0, p.N, p.D), "warm-up output = bf16");
    CHECK(rows_equal(&p, ldr, lbf, 0, p.N, 1), "warm-up lse = bf16");
    /* Past the warm-up the same config is sparse. */
    run_method(ctx, &p, "draft@85/0/7.5/7.5", 2, 2, dr, NULL);
    CHECK(!rows_equal(&p, dr, bf, p.P, p.N, p.D), "step 2 is not dense");
    free(bf), free(dr), free(ex), free(lbf), free(ldr);
    free_problem(&p);
}

/* The expcast mode reaches the INT8 phase's P codes: +expcast-centred is
 * not the paper's beta (the plan once kept only expcast on/off). */
static void test_expcast_modes(qva_context_t *ctx) {
    problem p = make_problem(2, 12, 20, 7, 0, 64);
    size_t n = problem_size(&p);
    float *paper = malloc(n * 4), *centred = malloc(n * 4), *ex = malloc(n * 4);
    run_method(ctx, &p, "draft@50/0/50/0+expcast", 0, 0, paper, NULL);
    run_method(ctx, &p, "draft@50/0/50/0+expcast-centred", 0, 0, centred, NULL);
    run_method(ctx, &p, "exact", 0, 0, ex, NULL);
    CHECK(!rows_equal(&p, paper, centred, p.P, p.N, p.D), "the centred beta changes the output");
    CHECK(rows_equal(&p, paper, centred, 0, p.P, p.D), "prefix rows (16-bit) unchanged");
    const double ep = rel_l2(paper, ex, n), ec = rel_l2(centred, ex, n);
    CHECK(fabs(ec - ep) < 0.1 * ep, "same error scale: %g vs %g", ec, ep);
    free(paper), free(centred), free(ex);
    free_problem(&p);
}

/* The INT8 blocks' PV partials: FP32 by default, DA2 Table 6's FP16 with
 * +fp16acc.  The option touches the numerator of the INT8 blocks only (LSE
 * and the 16-bit prefix rows are bitwise the default's); on ordinary data
 * the two differ by FP16's rounding of each partial, far below the 8-bit
 * error; where a block's partial passes 65504 (uniform scores over a
 * constant V: 448 x 2.25 per key) FP16 clips it and FP32 does not. */
static void test_int8_acc(qva_context_t *ctx) {
    problem p = make_problem(2, 12, 20, 7, 0, 64); /* N = 487 */
    size_t n = problem_size(&p), nl = n / p.D;
    float *o32 = malloc(n * 4), *o16 = malloc(n * 4), *ex = malloc(n * 4);
    float *l32 = malloc(nl * 4), *l16 = malloc(nl * 4);
    static const char *pairs[][2] = {{"draft@0/0/100/0", "draft@0/0/100/0+fp16acc"},
                                     {"draft@50/0/50/0+expcast", "draft@50/0/50/0+expcast+fp16acc"}};
    run_method(ctx, &p, "exact", 0, 0, ex, NULL);
    for (int i = 0; i < 2; ++i) {
        run_method(ctx, &p, pairs[i][0], 0, 0, o32, l32);
        run_method(ctx, &p, pairs[i][1], 0, 0, o16, l16);
        const double d = rel_l2(o16, o32, n), e32 = rel_l2(o32, ex, n), e16 = rel_l2(o16, ex, n);
        printf("  %-32s rel L2 vs exact %.6f (FP32 partials %.6f), vs FP32 %.2e\n", pairs[i][1],
               e16, e32, d);
        CHECK(d > 0 && d < 2e-3, "%s: FP16 partials move the output by %g", pairs[i][1], d);
        CHECK(e32 <= 1.01 * e16, "%s: FP32 partials' error %g against FP16's %g", pairs[i][0],
              e32, e16);
        CHECK(rows_equal(&p, l32, l16, 0, p.N, 1), "%s: the LSE does not see the partials",
              pairs[i][1]);
        CHECK(rows_equal(&p, o32, o16, 0, p.P, p.D), "%s: prefix rows (16-bit) unchanged",
              pairs[i][1]);
    }
    /* Uniform scores over a constant V: every kept block's partial is
     * 448 x 2.25 per valid key (E4M3 codes, both exact), about 250,000. */
    problem u = make_problem(2, 12, 20, 0, 0, 64);
    const size_t nu = problem_size(&u);
    for (size_t i = 0; i < nu; ++i) u.q[i] = 0.0f, u.v[i] = 1.0f;
    for (int i = 0; i < 2; ++i) {
        const char *m = i ? "draft@0/0/100/0+fp16acc" : "draft@0/0/100/0";
        run_method(ctx, &u, m, 0, 0, o32, NULL);
        double worst = 0;
        for (size_t j = 0; j < nu; ++j) worst = fmax(worst, fabs((double)o32[j] - 1.0));
        printf("  uniform scores, V = 1: %-24s max |out - 1| %.3g\n", m, worst);
        if (i)
            CHECK(worst > 0.25, "%s: the clipped partials give %g off V = 1", m, worst);
        else
            CHECK(worst < 1e-3, "%s: %g off V = 1", m, worst); /* l sums exp2's 447.9, P codes 448 */
    }
    free_problem(&u);
    free(o32), free(o16), free(ex), free(l32), free(l16);
    free_problem(&p);
}

/* draft@100/0/0/0: video queries see the prefix only; prefix queries
 * stay dense; without a prefix every video row is empty (zeros). */
static void test_full_skip(qva_context_t *ctx) {
    for (int at_end = 0; at_end < 2; ++at_end) {
        problem p = make_problem(2, 12, 20, 9, at_end, 64);
        size_t n = problem_size(&p), nl = n / p.D;
        float *dr = malloc(n * 4), *ex = malloc(n * 4), *ldr = malloc(nl * 4);
        run_method(ctx, &p, "draft@100/0/0/0", 0, 0, dr, ldr);
        run_method(ctx, &p, "exact", 0, 0, ex, NULL);
        int lo, hi;
        prefix_range(&p, &lo, &hi);
        double err2 = 0, ref2 = 0, lse_err = 0;
        for (int bh = 0; bh < p.B * p.H; ++bh) {
            const float *q = p.q + (size_t)bh * p.N * p.D, *k = p.k + (size_t)bh * p.N * p.D;
            const float *v = p.v + (size_t)bh * p.N * p.D;
            for (int i = 0; i < p.N; ++i) {
                if (i >= lo && i < hi)
                    continue;
                double s[16], mx = -INFINITY, z = 0, o[64] = {0};
                for (int j = lo; j < hi; ++j) {
                    double dot = 0;
                    for (int c = 0; c < p.D; ++c)
                        dot += (double)q[i * p.D + c] * k[j * p.D + c];
                    s[j - lo] = dot / 8.0;
                    mx = s[j - lo] > mx ? s[j - lo] : mx;
                }
                for (int j = lo; j < hi; ++j) {
                    double w = exp(s[j - lo] - mx);
                    z += w;
                    for (int c = 0; c < p.D; ++c)
                        o[c] += w * v[j * p.D + c];
                }
                for (int c = 0; c < p.D; ++c) {
                    double d = dr[((size_t)bh * p.N + i) * p.D + c] - o[c] / z;
                    err2 += d * d;
                    ref2 += o[c] / z * o[c] / z;
                }
                double dl = fabs(ldr[(size_t)bh * p.N + i] - (mx + log(z)));
                lse_err = dl > lse_err ? dl : lse_err;
            }
        }
        CHECK(sqrt(err2 / ref2) < 5e-3, "prefix-only attention: rel L2 %g",
              sqrt(err2 / ref2));
        CHECK(lse_err < 1e-4, "prefix-only lse: %g", lse_err);
        /* Prefix rows: dense over all keys. */
        double pe2 = 0, pr2 = 0;
        for (int bh = 0; bh < p.B * p.H; ++bh)
            for (int i = lo; i < hi; ++i)
                for (int c = 0; c < p.D; ++c) {
                    size_t at = ((size_t)bh * p.N + i) * p.D + c;
                    pe2 += (dr[at] - ex[at]) * (double)(dr[at] - ex[at]);
                    pr2 += (double)ex[at] * ex[at];
                }
        CHECK(sqrt(pe2 / pr2) < 1e-2, "prefix rows vs exact: %g", sqrt(pe2 / pr2));
        free(dr), free(ex), free(ldr);
        free_problem(&p);
    }
    problem p = make_problem(2, 12, 20, 0, 0, 64);
    size_t n = problem_size(&p), nl = n / p.D;
    float *dr = malloc(n * 4), *ldr = malloc(nl * 4);
    for (size_t i = 0; i < n; ++i)
        dr[i] = 1.0f;
    run_method(ctx, &p, "draft@100/0/0/0", 0, 0, dr, ldr);
    int zeros = 1, neg_inf = 1;
    for (size_t i = 0; i < n; ++i)
        zeros &= dr[i] == 0.0f;
    for (size_t i = 0; i < nl; ++i)
        neg_inf &= ldr[i] == -INFINITY;
    CHECK(zeros && neg_inf, "no prefix, all skipped: zeros and lse -inf");
    free(dr), free(ldr);
    free_problem(&p);
}

/* Mixed precisions: finite, ordered errors against FP64. */
static void test_mixed(qva_context_t *ctx) {
    problem p = make_problem(2, 24, 40, 13, 0, 64); /* 16 regions, 256 pairs */
    size_t n = problem_size(&p);
    float *ex = malloc(n * 4), *dr = malloc(n * 4);
    run_method(ctx, &p, "exact", 0, 0, ex, NULL);
    static const struct { const char *m; double max_err; } cases[] = {
        {"draft@0/0/0/100", 1e-2},   {"draft@85/0/0/15", 10.0},
        {"draft@85/0/7.5/7.5", 10.0}, {"draft@50/20/15/15", 10.0},
        {"draft@0/0/100/0", 5e-2},   {"draft@0/0/100/0+expcast", 5e-2},
        {"draft@0/100/0/0", 0.25},   {"draft@0/40/30/30", 0.2},
        {"draft@13.5/64.9/21.6/0", 2.0}};
    double err[9];
    for (int i = 0; i < 9; ++i) {
        memset(dr, 0xff, n * 4); /* NaN poison */
        run_method(ctx, &p, cases[i].m, 0, 0, dr, NULL);
        CHECK(all_finite(dr, n), "%s: non-finite output", cases[i].m);
        err[i] = rel_l2(dr, ex, n);
        CHECK(err[i] < cases[i].max_err, "%s: rel L2 %g", cases[i].m, err[i]);
        printf("  %-26s rel L2 vs exact %.5f\n", cases[i].m, err[i]);
    }
    CHECK(err[0] < err[1], "16-bit dense %g !< sparse %g", err[0], err[1]);
    CHECK(err[0] < err[4] && err[4] < err[6], "16 < 8 < 4 bit errors");
    CHECK(err[7] < err[6], "mixed 4/8/16 better than all 4-bit");
    /* Determinism: a second run (cached partition) is bitwise equal. */
    float *again = malloc(n * 4);
    run_method(ctx, &p, "draft@50/20/15/15", 0, 0, dr, NULL);
    run_method(ctx, &p, "draft@50/20/15/15", 0, 0, again, NULL);
    CHECK(!memcmp(dr, again, n * 4), "repeatable");
    /* Another grid in the same context, then a reset: the cache keys on
     * (H, W, C) and rebuilds the same partition. */
    problem small = make_problem(1, 12, 20, 0, 0, 64);
    float *os = malloc(problem_size(&small) * 4);
    run_method(ctx, &small, "draft@50/20/15/15", 0, 0, os, NULL);
    run_method(ctx, &p, "draft@50/20/15/15", 0, 0, again, NULL);
    CHECK(!memcmp(dr, again, n * 4), "repeatable with two cached grids");
    CHECK(qva_context_reset(ctx) == QVA_OK, "reset");
    run_method(ctx, &p, "draft@50/20/15/15", 0, 0, again, NULL);
    CHECK(!memcmp(dr, again, n * 4), "repeatable after reset");
    free(os);
    free_problem(&small);
    free(again);
    free(ex), free(dr);
    free_problem(&p);
}

/* Spatially local attention (random Fourier features of the token's
 * (t, y, x) in Q and K): the draft finds the important region pairs, so
 * half the pairs keep most of the output, and demoting the lower-ranked
 * half of those to INT8 costs little (Theorem 3.6's ordering). */
static void test_locality(qva_context_t *ctx) {
    problem p = make_problem(2, 24, 40, 13, 0, 64);
    double om[32][3], ph[32];
    for (int i = 0; i < 32; ++i) {
        for (int j = 0; j < 3; ++j)
            om[i][j] = 0.15 * nrand();
        ph[i] = 6.283185307179586 * urand();
    }
    for (int bh = 0; bh < p.B * p.H; ++bh)
        for (int t = 0; t < p.N; ++t) {
            size_t r = ((size_t)bh * p.N + t) * p.D;
            int vi = t - p.P;
            if (vi < 0)
                continue; /* prefix tokens stay random */
            double f = vi / (p.gh * p.gw), y = (vi / p.gw) % p.gh, x = vi % p.gw;
            for (int i = 0; i < 32; ++i) {
                double a = om[i][0] * y + om[i][1] * x + 4 * om[i][2] * f + ph[i];
                p.q[r + i] = qva_round_bf16((float)(1.5 * cos(a)) + 0.3f * nrand());
                p.q[r + 32 + i] = qva_round_bf16((float)(1.5 * sin(a)) + 0.3f * nrand());
                p.k[r + i] = qva_round_bf16((float)(1.5 * cos(a)) + 0.3f * nrand());
                p.k[r + 32 + i] = qva_round_bf16((float)(1.5 * sin(a)) + 0.3f * nrand());
            }
        }
    size_t n = problem_size(&p);
    float *ex = malloc(n * 4), *dr = malloc(n * 4);
    run_method(ctx, &p, "exact", 0, 0, ex, NULL);
    run_method(ctx, &p, "draft@50/0/0/50", 0, 0, dr, NULL);
    double e16 = rel_l2(dr, ex, n);
    run_method(ctx, &p, "draft@50/0/25/25", 0, 0, dr, NULL);
    double e8 = rel_l2(dr, ex, n);
    CHECK(e16 < 0.3, "local attention, half the pairs: rel L2 %g", e16);
    CHECK(e8 < 1.1 * e16, "INT8 for the lower half: %g vs %g", e8, e16);
    free(ex), free(dr);
    free_problem(&p);
}

/* Moving the prefix to the end permutes the sequence; video rows are
 * computed from the same packed blocks, so they match bitwise. */
static void test_prefix_position(qva_context_t *ctx) {
    problem a = make_problem(2, 12, 20, 7, 0, 64);
    problem b = make_problem(2, 12, 20, 7, 1, 64);
    int video = a.N - a.P, D = a.D;
    for (int bh = 0; bh < a.B * a.H; ++bh)
        for (int i = 0; i < a.N; ++i) {
            int j = i < a.P ? video + i : i - a.P; /* a's token i -> b's j */
            size_t ai = ((size_t)bh * a.N + i) * D, bj = ((size_t)bh * a.N + j) * D;
            memcpy(b.q + bj, a.q + ai, sizeof(float) * D);
            memcpy(b.k + bj, a.k + ai, sizeof(float) * D);
            memcpy(b.v + bj, a.v + ai, sizeof(float) * D);
        }
    size_t n = problem_size(&a);
    float *oa = malloc(n * 4), *ob = malloc(n * 4);
    run_method(ctx, &a, "draft@50/20/15/15", 0, 0, oa, NULL);
    run_method(ctx, &b, "draft@50/20/15/15", 0, 0, ob, NULL);
    int same = 1;
    double pe = 0;
    for (int bh = 0; bh < a.B * a.H; ++bh)
        for (int i = 0; i < a.N; ++i) {
            int j = i < a.P ? video + i : i - a.P;
            const float *ra = oa + ((size_t)bh * a.N + i) * D;
            const float *rb = ob + ((size_t)bh * a.N + j) * D;
            if (i >= a.P)
                same &= !memcmp(ra, rb, sizeof(float) * D);
            else
                for (int c = 0; c < D; ++c)
                    pe = fmax(pe, fabs(ra[c] - rb[c]));
        }
    CHECK(same, "video rows identical with the prefix at start and at end");
    CHECK(pe < 2e-3, "prefix rows close (dense, other key order): %g", pe);
    free(oa), free(ob);
    free_problem(&a);
    free_problem(&b);
}

/* bf16 storage of bf16-representable inputs loads the same values, so
 * the output matches the f32 run bitwise. */
static void test_bf16_inputs(qva_context_t *ctx) {
    problem p = make_problem(2, 12, 20, 7, 0, 64);
    size_t n = problem_size(&p);
    uint16_t *hb[3];
    const float *src[3] = {p.q, p.k, p.v};
    for (int t = 0; t < 3; ++t) {
        hb[t] = malloc(n * 2);
        for (size_t i = 0; i < n; ++i) {
            uint32_t u;
            memcpy(&u, &src[t][i], 4);
            hb[t][i] = (uint16_t)(u >> 16); /* exact: values are bf16 */
        }
    }
    float *of = malloc(n * 4), *ob = malloc(n * 4);
    run_method(ctx, &p, "draft@50/20/15/15+expcast", 0, 0, of, NULL);
    qva_config cfg;
    qva_config_default(&cfg);
    CHECK(qva_config_set_method(&cfg, "draft@50/20/15/15+expcast") == QVA_OK, "m");
    cfg.draft.grid_t = 2, cfg.draft.grid_h = 12, cfg.draft.grid_w = 20;
    cfg.draft.prefix_tokens = 7;
    qva_tensor q = qva_tensor_hnd(hb[0], QVA_BF16, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_tensor k = qva_tensor_hnd(hb[1], QVA_BF16, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_tensor v = qva_tensor_hnd(hb[2], QVA_BF16, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_tensor o = qva_tensor_hnd(ob, QVA_F32, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    CHECK(qva_attention(ctx, &cfg, &q, &k, &v, &o, NULL) == QVA_OK, "bf16: %s",
          qva_last_error());
    CHECK(!memcmp(of, ob, n * 4), "bf16 inputs = f32 inputs of bf16 values");
    for (int t = 0; t < 3; ++t)
        free(hb[t]);
    free(of), free(ob);
    free_problem(&p);
}

/* draft.warmup_method: a warm-up step runs as that dense method, with the
 * call's expcast (8-bit methods only) and q_granularity (INT8 Q only);
 * routed steps are untouched; bad values are refused at every step. */
static void test_warmup_method(void) {
    problem p = make_problem(2, 12, 20, 7, 1, 64); /* N = 487, prefix last */
    const size_t n = problem_size(&p), nl = n / p.D;
    float *a = malloc(n * 4), *b = malloc(n * 4), *la = malloc(nl * 4), *lb = malloc(nl * 4);
    static const struct {
        const char *draft;  /* the call's method */
        qva_method warm;    /* its warm-up method */
        const char *as;     /* the dense method the warm-up step must equal */
        int qblock;
    } C[] = {
        {"draft@85/0/0/15", QVA_METHOD_VC8, "vc8", 0},
        {"draft@85/0/0/15+expcast", QVA_METHOD_VC8, "vc8+expcast", 0},
        {"draft@85/0/7.5/7.5", QVA_METHOD_SAGE8, "sage8+qblock", 1},
        {"draft@85/0/7.5/7.5+expcast", QVA_METHOD_FP8, "fp8+expcast", 0},
        {"draft@85/0/0/15+expcast", QVA_METHOD_SAGE4, "sage4", 0},
        {"draft@85/0/0/15", QVA_METHOD_EXACT, "exact", 0},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; ++i) {
        qva_config cd, ref;
        draft_config(&p, C[i].draft, 1, 3, &cd);
        cd.num_steps = 8;
        cd.draft.warmup_method = C[i].warm;
        if (C[i].qblock) cd.q_granularity = QVA_Q_PER_BLOCK;
        ref = cd;
        CHECK(qva_config_set_method(&ref, C[i].as) == QVA_OK, "%s", C[i].as);
        if (!strstr(C[i].as, "+expcast")) ref.expcast = 0;
        if (!C[i].qblock) ref.q_granularity = QVA_Q_PER_ROW;
        CHECK(run_fresh(&p, &cd, a, la) == QVA_OK, "%s warm-up as %s: %s", C[i].draft, C[i].as,
              qva_last_error());
        CHECK(run_fresh(&p, &ref, b, lb) == QVA_OK, "%s: %s", C[i].as, qva_last_error());
        CHECK(!memcmp(a, b, n * 4) && !memcmp(la, lb, nl * 4),
              "%s warm-up step = %s bit for bit (out and lse)", C[i].draft, C[i].as);
        int dense = -1;
        CHECK(qva_draft_step_check(&cd, p.N, p.D, &dense) == QVA_OK && dense == 0,
              "step check: a %s warm-up is not a bf16 warm-up (%d)", C[i].as, dense);
        /* a routed step (step 3 of 3 warm-up steps) ignores the warm-up method */
        cd.step = 3;
        ref = cd;
        ref.draft.warmup_method = QVA_METHOD_BF16;
        CHECK(run_fresh(&p, &cd, a, la) == QVA_OK && run_fresh(&p, &ref, b, lb) == QVA_OK,
              "%s routed step: %s", C[i].draft, qva_last_error());
        CHECK(!memcmp(a, b, n * 4) && !memcmp(la, lb, nl * 4),
              "%s routed step unchanged by warmup_method", C[i].draft);
    }
    qva_config c;
    draft_config(&p, "draft@85/0/0/15", 0, 2, &c);
    int dense = -1;
    CHECK(qva_draft_step_check(&c, p.N, p.D, &dense) == QVA_OK && dense == 1,
          "step check: the default warm-up is bf16");
    for (int step = 0; step < 3; step += 2) { /* a warm-up step, a routed one */
        const qva_method bad[2] = {QVA_METHOD_DRAFT, (qva_method)99};
        for (int j = 0; j < 2; ++j) {
            draft_config(&p, "draft@85/0/0/15", step, 2, &c);
            c.draft.warmup_method = bad[j];
            CHECK(run_fresh(&p, &c, a, NULL) == QVA_ERR_INVALID_ARGUMENT &&
                      strstr(qva_last_error(), "warmup_method"),
                  "warmup_method %d at step %d refused: %s", (int)bad[j], step, qva_last_error());
        }
    }
    /* the draft checks come first, then the warm-up method's own */
    draft_config(&p, "draft@85/0/0/15", 0, 2, &c);
    c.draft.warmup_method = QVA_METHOD_VC8;
    c.draft.grid_w = 21;
    CHECK(run_fresh(&p, &c, a, NULL) == QVA_ERR_SHAPE, "grid mismatch in a vc8 warm-up");
    c.draft.grid_w = p.gw;
    c.vsmooth.clusters = 0;
    CHECK(run_fresh(&p, &c, a, NULL) == QVA_ERR_INVALID_ARGUMENT &&
              strstr(qva_last_error(), "clusters"),
          "vc8 warm-up with clusters 0: %s", qva_last_error());
    free(a), free(b), free(la), free(lb);
    free_problem(&p);
}

static void test_validation(qva_context_t *ctx) {
    problem p = make_problem(1, 12, 20, 5, 0, 64);
    size_t n = problem_size(&p);
    float *o = malloc(n * 4);
    qva_tensor q = qva_tensor_hnd(p.q, QVA_F32, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_tensor k = qva_tensor_hnd(p.k, QVA_F32, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_tensor v = qva_tensor_hnd(p.v, QVA_F32, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_tensor ot = qva_tensor_hnd(o, QVA_F32, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_config base;
    qva_config_default(&base);
    CHECK(qva_config_set_method(&base, "draft@85/0/7.5/7.5") == QVA_OK, "method");
    base.draft.grid_t = 1;
    base.draft.grid_h = 12;
    base.draft.grid_w = 20;
    base.draft.prefix_tokens = 5;
    CHECK(qva_attention(ctx, &base, &q, &k, &v, &ot, NULL) == QVA_OK, "valid: %s",
          qva_last_error());
    struct { const char *what; qva_status want; qva_config c; } bad[11];
    for (int i = 0; i < 11; ++i)
        bad[i].c = base;
    bad[0].what = "grid mismatch", bad[0].want = QVA_ERR_SHAPE, bad[0].c.draft.grid_w = 21;
    bad[1].what = "prefix mismatch", bad[1].want = QVA_ERR_SHAPE, bad[1].c.draft.prefix_tokens = 4;
    bad[2].what = "capacity 64", bad[2].want = QVA_ERR_UNSUPPORTED, bad[2].c.draft.capacity = 64;
    bad[3].what = "fractions sum", bad[3].want = QVA_ERR_INVALID_ARGUMENT, bad[3].c.draft.frac16 = 0.2f;
    bad[4].what = "lambda", bad[4].want = QVA_ERR_INVALID_ARGUMENT, bad[4].c.draft.lambda = 1.5f;
    bad[5].what = "grid 0", bad[5].want = QVA_ERR_INVALID_ARGUMENT, bad[5].c.draft.grid_t = 0;
    bad[6].what = "prefix >= N", bad[6].want = QVA_ERR_INVALID_ARGUMENT, bad[6].c.draft.prefix_tokens = p.N;
    bad[7].what = "negative fraction", bad[7].want = QVA_ERR_INVALID_ARGUMENT;
    bad[7].c.draft.frac_skip = 1.0f, bad[7].c.draft.frac8 = -0.075f, bad[7].c.draft.frac16 = 0.075f;
    bad[8].what = "capacity 0", bad[8].want = QVA_ERR_INVALID_ARGUMENT, bad[8].c.draft.capacity = 0;
    bad[9].what = "int8_acc 2", bad[9].want = QVA_ERR_INVALID_ARGUMENT, bad[9].c.draft.int8_acc = 2;
    bad[10].what = "int8_acc -1", bad[10].want = QVA_ERR_INVALID_ARGUMENT, bad[10].c.draft.int8_acc = -1;
    for (int i = 0; i < 11; ++i) {
        qva_status st = qva_attention(ctx, &bad[i].c, &q, &k, &v, &ot, NULL);
        CHECK(st == bad[i].want, "%s: got %s", bad[i].what, qva_status_string(st));
        CHECK(strlen(qva_last_error()) > 0, "%s: no message", bad[i].what);
    }
    free(o);
    free_problem(&p);
}

/* The call plan shared by the CPU reference and the CUDA backend
 * (qvi_draft_plan_make): regions equal the partition's, quotas the
 * quota function's, the dense rows and the low-bit flags follow the
 * config, and every invalid config fails as qva_attention does. */
static void test_plan(void) {
    static const struct { int T, gh, gw, P, at_end, D; qva_dtype dt; const char *m; int warm, step; } C[] = {
        {2, 10, 10, 0, 0, 64, QVA_F32, "draft@85/0/0/15", 0, 0},
        {1, 7, 10, 7, 0, 128, QVA_BF16, "draft@0/40/30/30", 0, 0},
        {1, 16, 15, 16, 1, 64, QVA_F16, "draft@85/0/7.5/7.5+expcast", 0, 0},
        {5, 20, 24, 64, 1, 64, QVA_F32, "draft@50/20/15/15", 0, 0},
        {3, 45, 80, 3, 0, 128, QVA_BF16, "draft@85/0/7.5/7.5", 2, 1}, /* warm-up */
        {3, 45, 80, 3, 1, 128, QVA_BF16, "draft@85/0/7.5/7.5", 2, 2}, /* after it */
        {1, 1, 1, 0, 0, 64, QVA_F16, "draft@0/0/0/100", 0, 0},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; ++i) {
        qva_config cfg;
        qva_config_default(&cfg);
        CHECK(qva_config_set_method(&cfg, C[i].m) == QVA_OK, "%s", C[i].m);
        cfg.draft.grid_t = C[i].T, cfg.draft.grid_h = C[i].gh, cfg.draft.grid_w = C[i].gw;
        cfg.draft.prefix_tokens = C[i].P, cfg.draft.prefix_at_end = C[i].at_end;
        cfg.draft.dense_warmup_steps = C[i].warm;
        cfg.step = C[i].step;
        const int N = C[i].P + C[i].T * C[i].gh * C[i].gw;
        float dummy = 0.0f;
        qva_tensor q = qva_tensor_hnd(&dummy, C[i].dt, QVA_DEVICE_CPU, 1, 1, N, C[i].D);
        qvi_draft_plan pl;
        CHECK(qvi_draft_plan_make(&cfg, &q, &pl) == QVA_OK, "plan %zu: %s", i, qva_last_error());
        qvi_partition part;
        CHECK(qvi_partition_build(C[i].gh, C[i].gw, 128, &part) == QVA_OK, "partition");
        qvi_draft_layout lay;
        CHECK(qvi_draft_layout_build(&part, C[i].T, C[i].P, C[i].at_end, &lay) == QVA_OK, "layout");
        CHECK(pl.rf == part.regions && pl.regions == lay.regions, "plan %zu: R_f %d / R %lld vs %d / %lld",
              i, pl.rf, (long long)pl.regions, part.regions, (long long)lay.regions);
        int64_t quota[4];
        CHECK(qvi_draft_quotas(&cfg.draft, lay.regions * lay.regions, quota) == QVA_OK, "quotas");
        CHECK(!memcmp(quota, pl.quota, sizeof quota), "plan %zu: quotas", i);
        const int warm = C[i].step < C[i].warm;
        CHECK(pl.warmup == warm, "plan %zu: warm-up %d", i, pl.warmup);
        int pub_warm = -1;
        CHECK(qva_draft_step_check(&cfg, N, C[i].D, &pub_warm) == QVA_OK && pub_warm == warm,
              "plan %zu: qva_draft_step_check says warm-up %d", i, pub_warm);
        CHECK(pl.with4 == (!warm && quota[QVI_Q_4] > 0) && pl.with8 == (!warm && quota[QVI_Q_8] > 0),
              "plan %zu: low-bit flags %d %d", i, pl.with4, pl.with8);
        const int64_t r0 = warm ? 0 : C[i].at_end ? N - C[i].P : 0, nr = warm ? N : C[i].P;
        CHECK(pl.dense_row0 == r0 && pl.dense_rows == nr, "plan %zu: dense rows %lld+%lld", i,
              (long long)pl.dense_row0, (long long)pl.dense_rows);
        /* the prefix rows are exactly the unmapped-to-video sequence indices */
        for (int64_t j = 0; !warm && j < N; ++j) {
            const int in_dense = j >= pl.dense_row0 && j < pl.dense_row0 + pl.dense_rows;
            const int32_t slot = lay.orig_to_pack[j];
            CHECK(in_dense == (slot < lay.prefix_pad), "plan %zu: row %lld dense %d slot %d", i,
                  (long long)j, in_dense, (int)slot);
            if (in_dense != (slot < lay.prefix_pad)) break;
        }
        CHECK(pl.use_f16 == (C[i].dt == QVA_F16), "plan %zu: use_f16", i);
        CHECK(pl.expcast == (cfg.expcast != 0) && pl.eta == qvi_draft_eta(cfg.expcast), "plan %zu: eta", i);
        CHECK(pl.scale_log2 == qvi_sm_scale(&cfg, C[i].D) * QVI_LOG2E && pl.n == N && pl.d == C[i].D,
              "plan %zu: scale / shape", i);
        qvi_draft_layout_free(&lay);
        qvi_partition_free(&part);
    }
    /* invalid configs: the plan fails with qva_attention's status */
    problem p = make_problem(1, 12, 20, 5, 0, 64);
    size_t n = problem_size(&p);
    float *o = malloc(n * 4);
    qva_tensor q = qva_tensor_hnd(p.q, QVA_F32, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_tensor k = qva_tensor_hnd(p.k, QVA_F32, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_tensor v = qva_tensor_hnd(p.v, QVA_F32, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_tensor ot = qva_tensor_hnd(o, QVA_F32, QVA_DEVICE_CPU, p.B, p.H, p.N, p.D);
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context");
    qva_config base;
    qva_config_default(&base);
    CHECK(qva_config_set_method(&base, "draft@85/0/7.5/7.5") == QVA_OK, "method");
    base.draft.grid_t = 1, base.draft.grid_h = 12, base.draft.grid_w = 20;
    base.draft.prefix_tokens = 5;
    for (int i = 0; i < 7; ++i) {
        qva_config c = base;
        switch (i) {
        case 0: c.draft.grid_w = 21; break;
        case 1: c.draft.prefix_tokens = 4; break;
        case 2: c.draft.capacity = 64; break;
        case 3: c.draft.frac16 = 0.2f; break;
        case 4: c.draft.lambda = 1.5f; break;
        case 5: c.draft.grid_t = 0; break;
        default: c.draft.prefix_tokens = p.N; break;
        }
        qvi_draft_plan pl;
        const qva_status a = qvi_draft_plan_make(&c, &q, &pl);
        const qva_status b = qva_attention(ctx, &c, &q, &k, &v, &ot, NULL);
        int warm = 0;
        const qva_status d = qva_draft_step_check(&c, p.N, p.D, &warm);
        CHECK(a != QVA_OK && a == b && d == b, "bad config %d: plan %s, attention %s, step check %s",
              i, qva_status_string(a), qva_status_string(b), qva_status_string(d));
    }
    int warm = 0;
    CHECK(qva_draft_step_check(&base, p.N, p.D, &warm) == QVA_OK && !warm, "step check: base");
    qva_config dense = base;
    CHECK(qva_config_set_method(&dense, "bf16") == QVA_OK, "bf16");
    CHECK(qva_draft_step_check(&dense, p.N, p.D, &warm) == QVA_ERR_INVALID_ARGUMENT,
          "step check: a bf16 config is refused");
    CHECK(qva_draft_step_check(&base, p.N, p.D, NULL) == QVA_ERR_INVALID_ARGUMENT,
          "step check: NULL output");
    qva_context_free(ctx);
    free(o);
    free_problem(&p);
}

int main(void) {
    test_partition();
    test_layout();
    test_pool_and_map();
    test_map_sum_order();
    test_quotas();
    test_assign();
    test_phase_scaling();
    qva_context_t *ctx = NULL;
    CHECK(qva_context_create(&ctx, QVA_DEVICE_CPU) == QVA_OK, "context");
    if (ctx) {
        test_dense_equivalences(ctx);
        test_expcast_modes(ctx);
        test_int8_acc(ctx);
        test_full_skip(ctx);
        test_mixed(ctx);
        test_locality(ctx);
        test_prefix_position(ctx);
        test_bf16_inputs(ctx);
        test_validation(ctx);
        qva_context_free(ctx);
    }
    test_warmup_method();
    test_plan(); /* last: it draws from the RNG */
    return check_summary("test_draft");
}
