/*
 * DraftAttention2 plan: what one draft call computes, decided once for the
 * CPU reference and the CUDA backend alike (src/draft/plan.c): the
 * call-level validation, the warm-up decision, the region counts, the
 * integer quotas and the eta of the INT8 phase.  docs/DRAFT.md ("Plan",
 * "Validation") states the rules.
 */
#ifndef QVATTN_DRAFT_PLAN_H
#define QVATTN_DRAFT_PLAN_H

#include "internal.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ quotas */
/* Quota slots, in the order of the method string draft@S0/S4/S8/S16. */
enum { QVI_Q_SKIP = 0, QVI_Q_4 = 1, QVI_Q_8 = 2, QVI_Q_16 = 3 };
/*
 * Integer quotas over `pairs` region pairs by the largest-remainder method
 * on the fractions quantised to parts per million; remainder ties go to
 * 16, then 8, then 4, then skip.  quota[0..3] sums to pairs exactly.
 */
qva_status qvi_draft_quotas(const qva_draft_params *p, int64_t pairs,
                            int64_t quota[4]);

/* ceil (round_up) or floor of ppm * x / 10^6, exact for every uint64 x
 * and ppm in [0, 10^6] (the adaptive budget's target, floor and cap). */
uint64_t qvi_draft_ppm_of(uint64_t x, int64_t ppm, int round_up);

/* The MASS budget's integers over M region pairs (docs/DRAFT.md, "Adaptive
 * budget"): mass_ppm = llround(mass * 10^6), keep_min = ceil(min_keep * M)
 * and keep_max = floor(max_keep * M) with the keep shares in parts per
 * million first.  Checks the budget fields first (QVA_ERR_INVALID_ARGUMENT,
 * also for a QUOTA budget).  The plan and the CUDA router both take them
 * from here. */
qva_status qvi_draft_mass_bounds(const qva_draft_params *dp, int64_t M, int64_t *mass_ppm,
                                 int64_t *keep_min, int64_t *keep_max);

/* The kept-share stats (qva_draft_stats) of one call, a head at a time:
 * st zeroed first, then qvi_draft_stats_add for each head routed (M pairs,
 * `skipped` of them skipped) in (batch, head) order, then
 * qvi_draft_stats_finish (the mean).  The CPU reference and the CUDA
 * backend report through these, so both give the same doubles. */
void qvi_draft_stats_add(qva_draft_stats *st, int64_t M, int64_t skipped);
void qvi_draft_stats_finish(qva_draft_stats *st);

/* eta of the INT8 phase: 2^-8 with ExpCast, QVI_SAGE_ETA otherwise. */
float qvi_draft_eta(int expcast);

/* ------------------------------------------------------------ the call */
/*
 * Call-level checks of docs/DRAFT.md ("Validation"): grid, prefix, N,
 * capacity, lambda.  Shapes, dtypes and D were checked by the dispatcher.
 */
qva_status qvi_draft_validate(const qva_config *cfg, const qva_tensor *q);
/* A method the warm-up steps may run as: any dense one (not draft). */
int qvi_draft_warmup_method_ok(qva_method m);
/*
 * A draft call at a dense warm-up step (step < dense_warmup_steps) whose
 * warmup_method is not bf16 runs as that dense method: *out = cfg with
 * method = warmup_method, expcast kept only for an 8-bit method, p_max
 * only where qvi_p_max_applies, and
 * q_granularity only for one with INT8 queries (hadamard stays 0: draft
 * refuses it).  Returns 1 then, else 0 (out untouched).  The dispatcher
 * and the CUDA chooser both ask it, after qvi_draft_validate.
 */
int qvi_draft_warmup_config(const qva_config *cfg, qva_config *out);
/*
 * What one draft call computes, shared by the CPU reference and the CUDA
 * backend so both take the same decisions:
 *   warmup      cfg->step < dense_warmup_steps: every row dense (bf16 path;
 *               another warmup_method never reaches the plan: the
 *               dispatcher runs that method, qvi_draft_warmup_config)
 *   rf, regions R_f = ceil(H*W / C) and R = T * R_f (the partition's counts)
 *   quota       skip/4/8/16 over R^2 video-region pairs (qvi_draft_quotas);
 *               under the MASS budget all zero: the quotas are per head
 *               (qvi_draft_route_head, src/draft/router.h)
 *   mass        the MASS budget is on; mass_ppm = llround(mass * 10^6),
 *               keep_min = ceil(min_keep * R^2) and keep_max =
 *               floor(max_keep * R^2) in pairs (min_keep and max_keep in
 *               parts per million first; docs/DRAFT.md, "Adaptive budget")
 *   with4/with8 the NVFP4 / INT8 operands may be needed (not in warm-up
 *               and a non-zero quota; MASS: a non-zero split fraction)
 *   dense_row0, dense_rows   the rows computed by the dense 16-bit path in
 *               sequence order: all N in warm-up, else the prefix queries
 *   scale_log2 = sm_scale * log2(e), eta of the INT8 phase, use_f16 (the
 *               16-bit format is FP16 iff q is f16, else BF16), expcast, p_block
 *               (cfg->p_max: the INT8 phase's P codes as qvi_pv_e4m3's p_block),
 *               pooled (cfg->skip_fill POOLED, not in warm-up),
 *   q_rows_per_scale   of the INT8 query codes: 1, or C with +qblock
 *   int8_acc16  the INT8 blocks' PV partials are rounded to FP16 (draft.int8_acc
 *               QVA_DRAFT_ACC_FP16, DA2 Table 6), else summed in FP32
 *   v_sample    cfg->v_scale QVA_V_SCALE_SAMPLE: delta_c^V from the packed
 *               video rows QVA_STAT_ROW samples, where they serve
 * Runs qvi_draft_validate and the quota checks; p is zeroed first.
 */
typedef struct qvi_draft_plan {
    int64_t n;
    int d;
    int warmup;
    int rf;
    int64_t regions;
    int64_t quota[4];
    int mass;
    int64_t mass_ppm, keep_min, keep_max;
    int with4, with8;
    int64_t dense_row0, dense_rows;
    float sm_scale, scale_log2, eta;
    int use_f16, expcast;
    int p_block; /* +pblock: the INT8 phase's P codes against each block's max */
    int pooled;  /* +pooled: skipped pairs enter as their regions' means */
    int q_rows_per_scale;
    int int8_acc16;
    int v_sample; /* +vsample: the INT8 phase's V scales from a sample */
} qvi_draft_plan;
/* Eq. 20: video regions per frame, ceil(grid_h*grid_w / capacity); -1 when
 * the grid or capacity is unset. */
int64_t qvi_draft_regions_per_frame(const qva_draft_params *dp);
qva_status qvi_draft_plan_make(const qva_config *cfg, const qva_tensor *q,
                               qvi_draft_plan *p);

#ifdef __cplusplus
}
#endif
#endif
