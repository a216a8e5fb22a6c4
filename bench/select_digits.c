/*
 * The count select's first digit (src/cuda/draft/router_select.cu) on CPU
 * draft maps: the reference's pooling and map of synthetic heads at Wan's
 * geometry, 21 x 45 x 80 tokens, 609 regions.  Two modes:
 *
 *   count [kept share, default 0.15]: how many keys of each half of a
 *     head's map (the share of one CTA of the cluster pair) share the
 *     boundary's top 8, 12, 13, 14 and 16 bits.  The select lists a CTA's
 *     keys in its second pass only if that count fits its list (12,288
 *     keys).  Three recipes, two heads each.
 *   model: a host model of the count select with a first digit of WIDE
 *     bits (environment, 9 to 14; default 12, the library's
 *     DR_SEL_WIDE_BITS): its digit schedule (WIDE, 8, 8 and 16 - WIDE
 *     value bits, then 8-bit index digits), its bins and its two-level
 *     pick, lane by lane, one boundary at a time.  For kept counts from 1
 *     pair to all but one, the threshold must keep exactly e keys and,
 *     where the search ran to the last digit, equal the e-th key of a
 *     sort.  Every 97th key takes its predecessor's value; COARSE=n clears
 *     the n low value bits, so that ties reach the index digits.  This
 *     checks the logic, not the kernel: cuda_test_draft on a GPU decides.
 *   warps: the first pass's shared adds per 32 keys as a warp issues
 *     them (the adds, the distinct bins, the deepest run of adds to one
 *     bin), three recipes, two heads each.
 *   shares: whether each CTA of a cluster of NC (default 3) lists the
 *     boundary bin's keys in the second pass, decided from the head's
 *     counts (their mean a CTA) against each CTA's own count.
 * FRAMES=31 takes HunyuanVideo-1.5-720p's grid (899 regions) for Wan's 21.
 *
 *   cc -O2 -std=c11 -Iinclude -Isrc bench/select_digits.c build/libqvattn.a \
 *      -o /tmp/select_digits -lm -fopenmp -lpthread -lstdc++ [-ldl -lrt and
 *      -L<cuda>/lib64 -lcudart_static for a CUDA build]
 *   /tmp/select_digits 0.15;  /tmp/select_digits model;  /tmp/select_digits warps;  WIDE=14 COARSE=20 /tmp/select_digits model
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "qvattn.h"
#include "draft/partition.h"
#include "draft/router.h"
#include "draft/budget.h"

enum { GH = 45, GW = 80, HD = 128, CAP = 128 };
static int GT = 21; /* latent frames: 21 (Wan2.2-720p, 609 regions); FRAMES=31 for HunyuanVideo's 899 */

static int cmp_desc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The 64-bit select keys (router_internal.cuh's dr_comp) of `heads` heads'
 * CPU draft maps, [heads][M]; NULL on failure. */
static uint64_t *map_keys(int recipe, uint64_t seed, int heads, int64_t *M_out) {
    qva_synthetic_spec sp;
    memset(&sp, 0, sizeof sp);
    snprintf(sp.name, sizeof sp.name, "select");
    sp.B = 1, sp.H = heads, sp.D = HD, sp.grid_t = GT, sp.grid_h = GH, sp.grid_w = GW;
    sp.seed = seed, sp.recipe = recipe;
    const int64_t N = (int64_t)GT * GH * GW, D = HD;
    float *q = malloc(sizeof(float) * heads * N * D), *k = malloc(sizeof(float) * heads * N * D),
          *v = malloc(sizeof(float) * heads * N * D);
    qvi_partition p;
    qvi_draft_layout L;
    if (!q || !k || !v || qva_synthetic_generate(&sp, q, k, v) != QVA_OK ||
        qvi_partition_build(GH, GW, CAP, &p) != QVA_OK ||
        qvi_draft_layout_build(&p, GT, 0, 0, &L) != QVA_OK)
        return NULL;
    const int64_t R = L.regions, M = R * R;
    float *pq = malloc(sizeof(float) * L.n_pack * D), *pk = malloc(sizeof(float) * L.n_pack * D);
    float *pool = malloc(sizeof(float) * 4 * R * D), *A = malloc(sizeof(float) * M);
    uint64_t *keys = malloc(sizeof(uint64_t) * heads * M);
    if (!pq || !pk || !pool || !A || !keys) return NULL;
    float *qa = pool, *qm = pool + R * D, *ka = pool + 2 * R * D, *km = pool + 3 * R * D;
    for (int h = 0; h < heads; ++h) {
        qvi_draft_pack(&L, q + h * N * D, (int)D, pq);
        qvi_draft_pack(&L, k + h * N * D, (int)D, pk);
        qvi_draft_pool(pq + L.prefix_pad * D, L.count, R, CAP, (int)D, qa, qm);
        qvi_draft_pool(pk + L.prefix_pad * D, L.count, R, CAP, (int)D, ka, km);
        if (qvi_draft_map(qa, qm, ka, km, R, (int)D, 1.0f / sqrtf((float)D), 0.2f, A) != QVA_OK)
            return NULL;
        for (int64_t i = 0; i < M; ++i) {
            uint32_t u;
            memcpy(&u, A + i, 4);
            keys[h * M + i] = ((uint64_t)qvi_budget_order_key(u) << 32) | (uint64_t)(M - 1 - i);
        }
    }
    free(q), free(k), free(v), free(pq), free(pk), free(pool), free(A);
    qvi_draft_layout_free(&L);
    qvi_partition_free(&p);
    *M_out = M;
    return keys;
}

/* The key of rank e - 1 (0-based) in descending order. */
static uint64_t sorted_at(const uint64_t *keys, int64_t M, int64_t e) {
    uint64_t *s = malloc(sizeof(uint64_t) * M);
    memcpy(s, keys, sizeof(uint64_t) * M);
    qsort(s, M, sizeof(uint64_t), cmp_desc);
    const uint64_t t = s[e - 1];
    free(s);
    return t;
}

/* One head's keys, as every mode visits them. */
typedef struct head_ref {
    const char *recipe;
    int head;
    const uint64_t *keys;
    int64_t M;
} head_ref;

/* fn on each head: three recipes, two heads each (seed 7). */
static int for_each_head(void (*fn)(const head_ref *, void *), void *ctx) {
    static const char *recipes[] = {"video", "global", "local-clustered"};
    for (int rc = 0; rc < 3; ++rc) {
        int64_t M = 0;
        uint64_t *keys = map_keys(rc, 7, 2, &M);
        if (!keys) return fprintf(stderr, "map failed\n"), 1;
        for (int h = 0; h < 2; ++h) {
            const head_ref hr = {recipes[rc], h, keys + h * M, M};
            fn(&hr, ctx);
        }
        free(keys);
    }
    return 0;
}

static void count_head(const head_ref *hr, void *ctx) {
    const double keep = *(const double *)ctx;
    const int bits[5] = {8, 12, 13, 14, 16};
    const uint64_t *kh = hr->keys;
    const int64_t M = hr->M;
    const uint64_t tau = sorted_at(kh, M, (int64_t)(keep * (double)M));
    printf("%-16s head %d keep %.2f:", hr->recipe, hr->head, keep);
    for (int b = 0; b < 5; ++b) {
        const uint64_t pre = tau >> (64 - bits[b]);
        const int64_t share = (M + 1) / 2;
        int64_t half[2] = {0, 0};
        for (int64_t i = 0; i < M; ++i)
            if ((kh[i] >> (64 - bits[b])) == pre) half[i / share]++;
        printf("  %2d bits: %lld / %lld", bits[b], (long long)half[0], (long long)half[1]);
    }
    printf("   (list: 12288 a CTA)\n");
}

static int count_mode(double keep) { return for_each_head(count_head, &keep); }

/* ------------------------------------------------------------ model */

static unsigned bins[1 << 14];

/* dr_sel_lane_of: the lane (run of n bins from top down) that holds rank
 * r, and the count above it added to *base. */
static int lane_of(int top, int n, unsigned long long r, unsigned long long *base) {
    unsigned long long own[32], incl[32], run = 0;
    for (int l = 0; l < 32; ++l) {
        own[l] = 0;
        for (int u = 0; u < n; ++u) own[l] += bins[top - n * l - (u + l) % n];
        incl[l] = run += own[l];
    }
    int L = 31;
    for (int l = 0; l < 32; ++l)
        if (r < *base + incl[l]) {
            L = l;
            break;
        }
    *base += incl[L] - own[L];
    return L;
}

/* dr_sel_pick over nb bins. */
static void pick(int nb, int shift, unsigned long long *prefix, unsigned long long *rank,
                 int *done) {
    const int per = nb / 32, per2 = per > 8 ? per / 32 : per;
    unsigned long long base = 0;
    int top = nb - 1 - per * lane_of(nb - 1, per, *rank, &base);
    if (per2 != per) top -= per2 * lane_of(top, per2, *rank, &base);
    unsigned long long rr = *rank - base;
    int d = 0;
    for (int u = 0; u < per2; ++u) {
        d = top - u;
        if (d == 0 || rr < bins[d]) break;
        rr -= bins[d];
    }
    *prefix |= (unsigned long long)d << shift;
    *rank = rr;
    if (rr + 1 == bins[d]) *done = 1;
}

/* The select's threshold for the top e of keys. */
static uint64_t model_select(const uint64_t *keys, int64_t M, int64_t e, int wide, int *done) {
    int sh[8], wd[8], n = 0;
    const int vw[4] = {wide, 8, 8, 16 - wide};
    for (int j = 0, t = 64; j < 4; ++j) t -= vw[j], sh[n] = t, wd[n++] = vw[j];
    int ibits = 0;
    while (ibits < 32 && ((unsigned long long)(M - 1) >> ibits)) ++ibits;
    for (int t = ((ibits + 7) / 8 - 1) * 8; t >= 0; t -= 8) sh[n] = t, wd[n++] = 8;
    unsigned long long prefix = 0, rank = (unsigned long long)e - 1;
    *done = 0;
    for (int ps = 0; ps < n && !*done; ++ps) {
        const int shift = sh[ps], width = wd[ps], vs = shift & 31, hs = vs + width;
        const int nb = width > 8 ? 1 << width : 256;
        const uint32_t pv = (uint32_t)(prefix >> 32), px = (uint32_t)prefix;
        memset(bins, 0, sizeof(unsigned) * nb);
        for (int64_t i = 0; i < M; ++i) {
            const uint32_t v = (uint32_t)(keys[i] >> 32), x = (uint32_t)keys[i];
            const int match = shift >= 32 ? hs >= 32 || (v >> hs) == (pv >> hs)
                                          : v == pv && (hs >= 32 || (x >> hs) == (px >> hs));
            if (match) bins[((shift >= 32 ? v : x) >> vs) & ((1u << width) - 1)]++;
        }
        pick(nb, shift, &prefix, &rank, done);
    }
    return prefix;
}

static int model_mode(void) {
    const char *coarse = getenv("COARSE");
    const int clear = coarse ? atoi(coarse) : 0;
    const char *w = getenv("WIDE");
    const int wide = w ? atoi(w) : 12;
    if (wide < 9 || wide > 14) return fprintf(stderr, "WIDE must be 9 to 14\n"), 1;
    const double fr[] = {0.0001, 0.01, 0.15, 0.3, 0.5, 0.9, 0.999999};
    int fails = 0, runs = 0;
    for (int rc = 0; rc < 2; ++rc) {
        int64_t M = 0;
        uint64_t *keys = map_keys(rc, 3, 1, &M);
        if (!keys) return fprintf(stderr, "map failed\n"), 1;
        for (int64_t i = 1; i < M; i += 97)
            keys[i] = (keys[i - 1] & ~0xffffffffull) | (keys[i] & 0xffffffffull);
        for (int64_t i = 0; i < M && clear > 0; ++i) keys[i] &= ~(((1ull << clear) - 1) << 32);
        for (int f = 0; f < 7; ++f) {
            int64_t e = (int64_t)(fr[f] * (double)M), kept = 0;
            if (e < 1) e = 1;
            int done;
            const uint64_t tau = model_select(keys, M, e, wide, &done), sorted = sorted_at(keys, M, e);
            for (int64_t i = 0; i < M; ++i) kept += keys[i] >= tau;
            const int ok = kept == e && (done || tau == sorted);
            runs++, fails += !ok;
            printf("recipe %d e %lld: tau %016llx  sorted %016llx  kept %lld %s\n", rc,
                   (long long)e, (unsigned long long)tau, (unsigned long long)sorted,
                   (long long)kept, ok ? "ok" : "FAIL");
        }
        free(keys);
    }
    printf("%d of %d failed\n", fails, runs);
    return fails != 0;
}

/* ------------------------------------------------------------ warps */

/*
 * The first pass's shared adds, as the kernel issues them: a warp's 32
 * lanes hold keys base + 4 l + c of one 128-key load (dr_sel_scan), the
 * lanes that share lane 0's 12-bit digit add as one and the others one
 * each (dr_sel_key<.., FIRST>).  Per 32 keys: the adds issued, the
 * distinct bins among them and the largest number of adds to one bin (the
 * adds to one address serialise).
 */
static void warps_head(const head_ref *hr, void *ctx) {
    (void)ctx;
    const uint64_t *kh = hr->keys;
    double adds = 0, distinct = 0, worst = 0, groups = 0;
    for (int64_t base = 0; base + 128 <= hr->M; base += 128)
        for (int c = 0; c < 4; ++c) {
            unsigned dig[32], seen[32], nseen = 0, cnt[32] = {0};
            for (int l = 0; l < 32; ++l) dig[l] = (unsigned)(kh[base + 4 * l + c] >> 52);
            int a = 1, mx = 1;
            for (int l = 0; l < 32; ++l) {
                if (dig[l] == dig[0]) continue;
                ++a;
                unsigned s = 0;
                while (s < nseen && seen[s] != dig[l]) ++s;
                if (s == nseen) seen[nseen++] = dig[l];
                if (++cnt[s] > (unsigned)mx) mx = (int)cnt[s];
            }
            adds += a, distinct += nseen + 1, worst += mx, groups += 1;
        }
    printf("%-16s head %d: per 32 keys %.1f adds, %.1f bins, %.2f adds to the busiest\n",
           hr->recipe, hr->head, adds / groups, distinct / groups, worst / groups);
}

static int warps_mode(void) { return for_each_head(warps_head, NULL); }

/* ------------------------------------------------------------ shares */

/*
 * Whether a CTA of the count select lists its keys in the pass after the
 * first, decided from the head's counts alone (trial 66e63c8: the map
 * kernel counts the first digit, so no CTA has its own counts): every CTA
 * takes its share of the chosen bin as the cluster's mean and lists if
 * that fits 12,288 keys.  Against each CTA's own count (the library): a
 * wrong "yes" costs a pass (a list that overflows sends the next pass
 * back to the map), a wrong "no" the pass the list would have saved.
 * NC CTAs (environment; 3 and 8 are what one CTA an SM on 132 SMs
 * leaves for Wan's 40 heads and HunyuanVideo's 16, an estimate:
 * dr_sel_cluster asks the occupancy calculator at run time), each a
 * contiguous share of the head's keys.
 */
typedef struct shares_tally {
    int nc, wrong_yes, wrong_no, cases;
} shares_tally;

static void shares_head(const head_ref *hr, void *ctx) {
    shares_tally *t = ctx;
    const double fr[] = {0.05, 0.15, 0.3, 0.5};
    const int nc = t->nc;
    const int64_t M = hr->M, share = (M + nc - 1) / nc;
    for (int f = 0; f < 4; ++f) {
        const uint64_t tau = sorted_at(hr->keys, M, (int64_t)(fr[f] * (double)M));
        const uint64_t bin = tau >> 52;
        int64_t own[8] = {0}, total = 0, most = 0;
        for (int64_t i = 0; i < M; ++i)
            if ((hr->keys[i] >> 52) == bin) own[i / share]++, total++;
        int fits = 0;
        for (int c = 0; c < nc; ++c) {
            fits += own[c] <= 12288;
            most = own[c] > most ? own[c] : most;
        }
        const int guess = (total + nc - 1) / nc <= 12288;
        t->wrong_yes += guess && fits < nc;
        t->wrong_no += !guess && fits > 0;
        t->cases++;
        printf("%-16s head %d keep %.2f: bin %lld keys, mean %lld, largest %lld; "
               "CTAs that fit %d of %d, guess %s\n",
               hr->recipe, hr->head, fr[f], (long long)total,
               (long long)((total + nc - 1) / nc), (long long)most, fits, nc,
               guess ? "list" : "no list");
    }
}

static int shares_mode(void) {
    const char *ncs = getenv("NC");
    shares_tally t = {ncs ? atoi(ncs) : 3, 0, 0, 0};
    if (t.nc < 1 || t.nc > 8) return fprintf(stderr, "NC must be 1 to 8\n"), 1;
    if (for_each_head(shares_head, &t)) return 1;
    printf("NC %d, %d frames: %d cases, %d wrong lists, %d lists missed\n", t.nc, GT, t.cases,
           t.wrong_yes, t.wrong_no);
    return 0;
}

int main(int argc, char **argv) {
    if (getenv("FRAMES")) GT = atoi(getenv("FRAMES"));
    if (GT < 1 || GT > 64) return fprintf(stderr, "FRAMES must be 1 to 64\n"), 1;
    if (argc > 1 && !strcmp(argv[1], "shares")) return shares_mode();
    if (argc > 1 && !strcmp(argv[1], "model")) return model_mode();
    if (argc > 1 && !strcmp(argv[1], "warps")) return warps_mode();
    return count_mode(argc > 1 ? atof(argv[1]) : 0.15);
}
