/*
 * DraftAttention2 router, the reference arithmetic (src/draft/router.c):
 * region pooling (DA2 Eq. 1, C.1), the draft map (Eq. 2) and the ranking
 * with quotas (Algorithm 1).  The CPU reference routes with these; the
 * CUDA router (src/cuda/draft/router.cu) is checked against them bit for
 * bit.  Pure and deterministic; docs/DRAFT.md §3 gives the numerics.
 */
#ifndef QVATTN_DRAFT_ROUTER_H
#define QVATTN_DRAFT_ROUTER_H

#include "internal.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Pooling over the valid tokens of each region (DA2 Eq. 1, C.1).  x holds
 * R blocks of c rows of d channels (the packed video part); avg is the
 * FP64 sum divided by n_a, rounded to f32; mx the channel-wise max.
 */
void qvi_draft_pool(const float *x, const int32_t *count, int64_t R, int c,
                    int d, float *avg, float *mx);
/*
 * Draft map of one head (DA2 Eq. 2): A[a*R+b] =
 *   (1-lambda) softmax_b(avgQ_a . avgK_b * sm) + lambda softmax_b(maxQ . maxK * sm)
 * with logits, softmaxes and the mixture in FP64, A rounded to f32.
 */
qva_status qvi_draft_map(const float *qavg, const float *qmax,
                         const float *kavg, const float *kmax, int64_t R,
                         int d, float sm_scale, float lambda, float *A);
/*
 * Algorithm 1 for one head: stable descending argsort of vec(A) (ties by
 * pair index a*R+b), the first quota[16] pairs -> 16, next quota[8] -> 8,
 * next quota[4] -> 4, the rest 0 (quota indexed by QVI_Q_*, src/draft/
 * plan.h).  prec receives R*R entries.
 */
qva_status qvi_draft_assign(const float *A, int64_t R, const int64_t quota[4],
                            uint8_t *prec);

#ifdef __cplusplus
}
#endif
#endif
