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
#include "draft/plan.h"

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
/* Partials of each softmax sum of the map: the row's entries b = l mod 32
 * go to partial l, combined by a butterfly (qvi_draft_warp_sum), the
 * order in which one warp sums a row side by side. */
#define QVI_DRAFT_SUM_LANES 32
/* The sum of e[0 .. R-1] in that warp order, in FP64 (docs/DRAFT.md §3,
 * "The order of the map's sums"). */
double qvi_draft_warp_sum(const double *e, int64_t R);
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

/* ------------------------------------------------------------ MASS budget */
/*
 * The adaptive budget (docs/DRAFT.md, "Adaptive budget"), in integers so
 * that no summation order can change a decision:
 *   w(A)  = floor(A * 2^40) for A in [0, 1] (exact in f32 -> FP64), 0 for
 *           NaN and A <= 0, 2^40 for A >= 1;
 *   T     = ceil(mass_ppm * sum(w) / 10^6) (qvi_draft_ppm_of);
 *   K     = the least K whose top-K pairs (the ranking of qvi_draft_assign)
 *           have a w-sum >= T, then max(K, keep_min), then min(K, keep_max).
 */
#define QVI_DRAFT_MASS_ONE ((uint64_t)1 << 40)
uint64_t qvi_draft_mass_weight(float a);
/* K of one head's map A (M pairs); QVA_ERR_UNSUPPORTED if sum(w) would not
 * fit 64 bits (impossible for a map from qvi_draft_map below 2^23
 * regions: each of its rows sums to 1 within a few f32 roundings). */
qva_status qvi_draft_mass_keep(const float *A, int64_t M, int64_t mass_ppm,
                               int64_t keep_min, int64_t keep_max, int64_t *kept);
/*
 * One head's route under the plan: its quotas (the plan's under the QUOTA
 * budget; under MASS skip = R^2 - K and K split 4/8/16 by qvi_draft_quotas
 * on dp's fractions) and its precision matrix (Algorithm 1 with those
 * quotas; the QUOTA budget is exactly qvi_draft_assign).
 */
qva_status qvi_draft_route_head(const float *A, int64_t R, const qva_draft_params *dp,
                                const qvi_draft_plan *plan, int64_t quota[4],
                                uint8_t *prec);

#ifdef __cplusplus
}
#endif
#endif
