/*
 * A host model of the count select at 63d4891 (src/cuda/draft/
 * router_select.cu, reverted by 60b043c until it runs on a GPU): its digit
 * schedule (a 14-bit first digit, then 8, 8 and 2 value bits and 8-bit
 * index digits), its bins and its two-level pick, lane by lane, for one
 * boundary at a time.  It checks, for kept counts from 1 pair to all but
 * one, that the threshold keeps exactly e keys and, where the search ran
 * to the last digit, equals the e-th key of a sort.  CPU draft maps at
 * Wan's geometry (two recipes), every 97th key given its predecessor's
 * value; COARSE=n clears the n low value bits, so that ties reach the
 * index digits.  Not the kernel: the device still has to run
 * cuda_test_draft on it (NOTES).
 *
 *   cc -O2 -std=c11 -Iinclude -Isrc bench/select_model.c build/libqvattn.a \
 *      -o /tmp/select_model -lm -fopenmp -lpthread -lstdc++ [CUDA build:
 *      -ldl -lrt -L<cuda>/lib64 -lcudart_static]
 *   /tmp/select_model; COARSE=20 /tmp/select_model; COARSE=31 /tmp/select_model
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "qvattn.h"
#include "draft/partition.h"
#include "draft/router.h"
#include "draft/budget.h"

static unsigned *HJ;
static int lane_of(int top, int n, unsigned long long r, unsigned long long *base) {
    unsigned long long own[32], incl[32], run = 0;
    for (int l = 0; l < 32; ++l) {
        own[l] = 0;
        for (int u = 0; u < n; ++u) own[l] += HJ[top - n * l - (u + l) % n];
        run += own[l];
        incl[l] = run;
    }
    int L = 31;
    for (int l = 0; l < 32; ++l) if (r < *base + incl[l]) { L = l; break; }
    *base += incl[L] - own[L];
    return L;
}
static void pick(int NB, int shift, unsigned long long *prefix, unsigned long long *rank, int *done) {
    int PER = NB / 32, PER2 = PER > 8 ? PER / 32 : PER;
    unsigned long long r = *rank, base = 0;
    int top = NB - 1 - PER * lane_of(NB - 1, PER, r, &base);
    if (PER2 != PER) top -= PER2 * lane_of(top, PER2, r, &base);
    unsigned long long rr = r - base;
    int d = 0;
    for (int u = 0; u < PER2; ++u) { d = top - u; if (d == 0 || rr < HJ[d]) break; rr -= HJ[d]; }
    *prefix |= (unsigned long long)d << shift;
    *rank = rr;
    if (rr + 1 == HJ[d]) *done = 1;
}
static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}
int main(void) {
    const int T = 21, H = 45, W = 80, D = 128, C = 128, WIDE = 14;
    HJ = malloc(4 << 14);
    int fails = 0, runs = 0;
    for (int rc = 0; rc < 2; ++rc) {
        qva_synthetic_spec sp; memset(&sp, 0, sizeof sp);
        sp.B = 1, sp.H = 1, sp.D = D, sp.grid_t = T, sp.grid_h = H, sp.grid_w = W, sp.seed = 3, sp.recipe = rc;
        const int64_t N = (int64_t)T * H * W;
        float *q = malloc(4 * N * D), *k = malloc(4 * N * D), *v = malloc(4 * N * D);
        qva_synthetic_generate(&sp, q, k, v);
        qvi_partition p; qvi_draft_layout L;
        qvi_partition_build(H, W, C, &p); qvi_draft_layout_build(&p, T, 0, 0, &L);
        const int64_t R = L.regions, M = R * R;
        float *pk = malloc(4 * L.n_pack * D), *pq = malloc(4 * L.n_pack * D);
        float *qa = malloc(4 * R * D), *qm = malloc(4 * R * D), *ka = malloc(4 * R * D), *km = malloc(4 * R * D), *A = malloc(4 * M);
        qvi_draft_pack(&L, q, D, pq); qvi_draft_pack(&L, k, D, pk);
        qvi_draft_pool(pq + L.prefix_pad * D, L.count, R, C, D, qa, qm);
        qvi_draft_pool(pk + L.prefix_pad * D, L.count, R, C, D, ka, km);
        qvi_draft_map(qa, qm, ka, km, R, D, 1.0f / sqrtf(D), 0.2f, A);
        uint64_t *keys = malloc(8 * M), *s = malloc(8 * M);
        for (int64_t i = 0; i < M; ++i) { uint32_t u; memcpy(&u, A + i, 4); keys[i] = ((uint64_t)qvi_budget_order_key(u) << 32) | (uint64_t)(M - 1 - i); }
        /* a few ties: duplicate some values so that index digits matter */
        for (int64_t i = 1; i < M; i += 97) keys[i] = (keys[i - 1] & ~0xffffffffull) | (keys[i] & 0xffffffffull);
        if (getenv("COARSE")) for (int64_t i = 0; i < M; ++i) keys[i] &= ~(((1ull << atoi(getenv("COARSE"))) - 1) << 32);
        memcpy(s, keys, 8 * M); qsort(s, M, 8, cmp_desc);
        int sh[8], wd[8], n = 0;
        const int vw[4] = {WIDE, 8, 8, 32 - WIDE - 16};
        for (int j = 0, t = 64; j < 4; ++j) { t -= vw[j]; sh[n] = t, wd[n++] = vw[j]; }
        int ibits = 0; while (ibits < 32 && ((unsigned long long)(M - 1) >> ibits)) ++ibits;
        for (int t = ((ibits + 7) / 8 - 1) * 8; t >= 0; t -= 8) sh[n] = t, wd[n++] = 8;
        const double fr[] = {0.0001, 0.01, 0.15, 0.3, 0.5, 0.9, 0.999999};
        for (int f = 0; f < 7; ++f) {
            long long e = (long long)(fr[f] * M); if (e < 1) e = 1;
            unsigned long long prefix = 0, rank = e - 1; int done = 0;
            for (int ps = 0; ps < n && !done; ++ps) {
                const int shift = sh[ps], width = wd[ps], vs = shift & 31, hs = vs + width;
                const int nb = width > 8 ? 1 << width : 256;
                memset(HJ, 0, 4 * nb);
                for (int64_t i = 0; i < M; ++i) {
                    uint32_t vv = keys[i] >> 32, x = (uint32_t)keys[i];
                    uint32_t pv = prefix >> 32, px = (uint32_t)prefix;
                    int match; uint32_t w;
                    if (shift >= 32) { match = hs >= 32 || (vv >> hs) == (pv >> hs); w = vv; }
                    else { match = vv == pv && (hs >= 32 || (x >> hs) == (px >> hs)); w = x; }
                    if (match) HJ[(w >> vs) & ((1u << width) - 1)]++;
                }
                pick(nb, shift, &prefix, &rank, &done);
            }
            long long ge = 0; for (int64_t i = 0; i < M; ++i) ge += keys[i] >= prefix;
            const int ok = ge == e && (done || prefix == s[e - 1]);
            runs++; fails += !ok;
            printf("recipe %d e %lld: tau %016llx  sorted %016llx  kept %lld %s\n", rc, e, prefix, (unsigned long long)s[e - 1], ge, ok ? "ok" : "FAIL");
        }
    }
    printf("%d of %d failed\n", fails, runs);
    return fails != 0;
}
