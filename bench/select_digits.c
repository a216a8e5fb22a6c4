/*
 * How many keys of each half of a head's draft map share the kept-share
 * boundary's top bits, for first digits of 8, 12, 13, 14 and 16 bits: the
 * count select (src/cuda/draft/router_select.cu) lists a CTA's keys in the
 * second pass only if that count fits its list (12,288 keys).  CPU draft
 * maps (the reference's pooling and map) of synthetic heads at Wan's
 * geometry, 21 x 45 x 80 tokens, 609 regions, two heads a recipe.
 *
 *   cmake --build build --target qvattn_static   (any build with libqvattn.a)
 *   cc -O2 -std=c11 -Iinclude -Isrc bench/select_digits.c build/libqvattn.a \
 *      -o /tmp/select_digits -lm -fopenmp -lpthread -lstdc++ [-ldl -lrt and
 *      -L<cuda>/lib64 -lcudart_static for a CUDA build]
 *   /tmp/select_digits [kept share, default 0.15]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "qvattn.h"
#include "draft/partition.h"
#include "draft/router.h"
#include "draft/budget.h"

static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int main(int argc, char **argv) {
    const char *recipes[] = {"video", "global", "local-clustered"};
    const int T = 21, H = 45, W = 80, D = 128, C = 128, HEADS = 2;
    double keep = argc > 1 ? atof(argv[1]) : 0.15;
    for (int rc = 0; rc < 3; ++rc) {
        qva_synthetic_spec sp;
        memset(&sp, 0, sizeof sp);
        snprintf(sp.name, sizeof sp.name, "sim");
        sp.B = 1, sp.H = HEADS, sp.D = D, sp.grid_t = T, sp.grid_h = H, sp.grid_w = W;
        sp.seed = 7, sp.recipe = rc;
        const int64_t N = (int64_t)T * H * W;
        float *q = malloc(sizeof(float) * HEADS * N * D), *k = malloc(sizeof(float) * HEADS * N * D),
              *v = malloc(sizeof(float) * HEADS * N * D);
        if (qva_synthetic_generate(&sp, q, k, v) != QVA_OK) { printf("gen fail\n"); return 1; }
        qvi_partition p;
        qvi_draft_layout L;
        qvi_partition_build(H, W, C, &p);
        qvi_draft_layout_build(&p, T, 0, 0, &L);
        const int64_t R = L.regions, M = R * R;
        float *pk = malloc(sizeof(float) * L.n_pack * D), *pq = malloc(sizeof(float) * L.n_pack * D);
        float *qa = malloc(4 * R * D), *qm = malloc(4 * R * D), *ka = malloc(4 * R * D), *km = malloc(4 * R * D);
        float *A = malloc(4 * M);
        uint64_t *keys = malloc(8 * M);
        for (int h = 0; h < HEADS; ++h) {
            qvi_draft_pack(&L, q + (int64_t)h * N * D, D, pq);
            qvi_draft_pack(&L, k + (int64_t)h * N * D, D, pk);
            qvi_draft_pool(pq + L.prefix_pad * D, L.count, R, C, D, qa, qm);
            qvi_draft_pool(pk + L.prefix_pad * D, L.count, R, C, D, ka, km);
            qvi_draft_map(qa, qm, ka, km, R, D, 1.0f / sqrtf((float)D), 0.2f, A);
            for (int64_t i = 0; i < M; ++i) {
                uint32_t u;
                memcpy(&u, A + i, 4);
                keys[i] = ((uint64_t)qvi_budget_order_key(u) << 32) | (uint64_t)(M - 1 - i);
            }
            const int64_t e = (int64_t)(keep * (double)M);
            uint64_t *s = malloc(8 * M);
            memcpy(s, keys, 8 * M);
            qsort(s, M, 8, cmp_desc);
            const uint64_t tau = s[e - 1];
            free(s);
            const int bits[5] = {8, 12, 13, 14, 16};
            printf("%-16s head %d R %lld keep %.2f tau A=%g:", recipes[rc], h, (long long)R, keep,
                   (double)A[M - 1 - (tau & 0xffffffffu)]);
            for (int b = 0; b < 5; ++b) {
                const uint64_t pre = tau >> (64 - bits[b]);
                int64_t half[2] = {0, 0};
                const int64_t share = (M + 1) / 2;
                for (int64_t i = 0; i < M; ++i)
                    if ((keys[i] >> (64 - bits[b])) == pre) half[i / share]++;
                printf("  %2d bits: %lld / %lld", bits[b], (long long)half[0], (long long)half[1]);
            }
            printf("   (cap 12288 a CTA)\n");
        }
        free(q), free(k), free(v), free(pk), free(pq), free(qa), free(qm), free(ka), free(km), free(A), free(keys);
        qvi_draft_layout_free(&L);
        qvi_partition_free(&p);
    }
    return 0;
}
