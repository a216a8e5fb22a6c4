/*
 * DraftAttention2 on the CPU: internal declarations shared by
 * src/cpu/partition.c, src/cpu/draft.c, the tests and (later) the CUDA
 * router.  Everything here is pure and deterministic; docs/DRAFT.md gives
 * the numerics with DA2 equation numbers.
 */
#ifndef QVATTN_CPU_DRAFT_H
#define QVATTN_CPU_DRAFT_H

#include "internal.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ partition */
/* Candidate families of the ragged 2D partition (docs/DRAFT.md §1). */
enum { QVI_PART_ROW_BANDS = 0, QVI_PART_COL_BANDS = 1 };

/*
 * A ragged partition of one h x w frame into R_f = ceil(h*w/c) connected
 * regions (DA2 C.2, Eq. 20-21).  Region k holds floor(h*w/R_f) cells plus
 * one for k < (h*w mod R_f).  Cells are numbered y*w + x.
 */
typedef struct qvi_partition {
    int h, w, c;
    int regions;         /* R_f                                        */
    int family;          /* QVI_PART_ROW_BANDS or QVI_PART_COL_BANDS   */
    int bands;           /* band count of the winning candidate        */
    int64_t e_cut;       /* neighbour pairs in different regions       */
    int64_t perimeter;   /* 2(h+w) + 2 e_cut (Eq. 21)                  */
    int32_t *label;      /* h*w: region of each cell                    */
    int32_t *cells;      /* h*w: cells grouped by region, path order    */
    int32_t *start;      /* regions+1: region k is cells[start[k]..)    */
} qvi_partition;

/* Builds the least-perimeter candidate; p is zeroed first. */
qva_status qvi_partition_build(int h, int w, int c, qvi_partition *p);
void qvi_partition_free(qvi_partition *p);
/* Horizontal and vertical neighbour pairs with different labels. */
int64_t qvi_partition_ecut(const int32_t *label, int h, int w);
/*
 * One candidate: the snake path of `bands` bands of the given family
 * (docs/DRAFT.md §1).  path receives h*w cell ids.  Returns 0 if the band
 * count is infeasible for this family (then path is unspecified).
 */
int qvi_partition_path(int h, int w, int family, int bands, int32_t *path);

/* ------------------------------------------------------------ packing */
/*
 * Token packing (DA2 C.2): packed slots = prefix (padded up to a multiple
 * of c) followed by one block of c slots per video region, frame by frame,
 * valid tokens first in path order, padding after.
 */
typedef struct qvi_draft_layout {
    int64_t n;              /* sequence length P + T*H*W                  */
    int prefix;             /* P                                           */
    int prefix_at_end;
    int t, h, w, c;
    int rf;                 /* regions per frame                           */
    int64_t regions;        /* R = T * R_f                                 */
    int64_t prefix_pad;     /* slots before the first video block          */
    int64_t n_pack;         /* prefix_pad + R * c                          */
    int32_t *pack_to_orig;  /* n_pack: sequence index, -1 for padding      */
    int32_t *orig_to_pack;  /* n: packed slot of each sequence index       */
    int32_t *count;         /* R: valid tokens of each video region        */
} qvi_draft_layout;

qva_status qvi_draft_layout_build(const qvi_partition *part, int t,
                                  int prefix, int prefix_at_end,
                                  qvi_draft_layout *lay);
void qvi_draft_layout_free(qvi_draft_layout *lay);
/* dst[n_pack*d] = rows of src[n*d] in packed order, padding rows zero. */
void qvi_draft_pack(const qvi_draft_layout *lay, const float *src, int d,
                    float *dst);

/* ------------------------------------------------------------ router */
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
/* Quota slots, in the order of the method string draft@S0/S4/S8/S16. */
enum { QVI_Q_SKIP = 0, QVI_Q_4 = 1, QVI_Q_8 = 2, QVI_Q_16 = 3 };
/*
 * Integer quotas over `pairs` region pairs by the largest-remainder method
 * on the fractions quantised to parts per million; remainder ties go to
 * 16, then 8, then 4, then skip.  quota[0..3] sums to pairs exactly.
 */
qva_status qvi_draft_quotas(const qva_draft_params *p, int64_t pairs,
                            int64_t quota[4]);
/*
 * Algorithm 1 for one head: stable descending argsort of vec(A) (ties by
 * pair index a*R+b), the first quota[16] pairs -> 16, next quota[8] -> 8,
 * next quota[4] -> 4, the rest 0.  prec receives R*R entries.
 */
qva_status qvi_draft_assign(const float *A, int64_t R, const int64_t quota[4],
                            uint8_t *prec);

/* ------------------------------------------------------------ phases */
/*
 * DA2 Eq. 8 unit change of the INT8 phase, with s_c = eta * dv[c] (f32):
 * enter: acc_c = acc_c / s_c, l = l / eta; exit: acc_c = acc_c * s_c,
 * l = l * eta (IEEE division and multiplication).  dv[c] must be nonzero.
 */
void qvi_draft_phase_enter(float *acc, float *l, int d, float eta,
                           const float *dv);
void qvi_draft_phase_exit(float *acc, float *l, int d, float eta,
                          const float *dv);
/* The same in FP64 (for checking that the pair is an identity). */
void qvi_draft_phase_enter_f64(double *acc, double *l, int d, double eta,
                               const double *dv);
void qvi_draft_phase_exit_f64(double *acc, double *l, int d, double eta,
                              const double *dv);
/* eta of the INT8 phase: 2^-8 with ExpCast, QVI_SAGE_ETA otherwise. */
float qvi_draft_eta(int expcast);

/* ------------------------------------------------------------ the call */
/*
 * Call-level checks of docs/DRAFT.md ("Validation"): grid, prefix, N,
 * capacity, lambda.  Shapes, dtypes and D were checked by the dispatcher.
 */
qva_status qvi_draft_validate(const qva_config *cfg, const qva_tensor *q);
/*
 * What one draft call computes, shared by the CPU reference and the CUDA
 * backend so both take the same decisions:
 *   warmup      cfg->step < dense_warmup_steps: every row dense (bf16 path)
 *   rf, regions R_f = ceil(H*W / C) and R = T * R_f (the partition's counts)
 *   quota       skip/4/8/16 over R^2 video-region pairs (qvi_draft_quotas)
 *   with4/with8 the NVFP4 / INT8 operands are needed (not in warm-up and a
 *               non-zero quota)
 *   dense_row0, dense_rows   the rows computed by the dense 16-bit path in
 *               sequence order: all N in warm-up, else the prefix queries
 *   scale_log2 = sm_scale * log2(e), eta of the INT8 phase, use_f16 (the
 *               16-bit format is FP16 iff q is f16, else BF16), expcast.
 * Runs qvi_draft_validate and the quota checks; p is zeroed first.
 */
typedef struct qvi_draft_plan {
    int64_t n;
    int d;
    int warmup;
    int rf;
    int64_t regions;
    int64_t quota[4];
    int with4, with8;
    int64_t dense_row0, dense_rows;
    float sm_scale, scale_log2, eta;
    int use_f16, expcast;
} qvi_draft_plan;
qva_status qvi_draft_plan_make(const qva_config *cfg, const qva_tensor *q,
                               qvi_draft_plan *p);

/* Context cache: the partition of (h, w, c), built on first use and kept
 * in QVI_SLOT_DRAFT (ctx may be NULL: *owned receives a fresh partition
 * the caller frees). */
qva_status qvi_draft_partition_get(qva_context_t *ctx, int h, int w, int c,
                                   const qvi_partition **part,
                                   qvi_partition **owned);
/* Frees a partition that qvi_draft_partition_get returned in *owned. */
void qvi_draft_partition_release(qvi_partition *owned);

#ifdef __cplusplus
}
#endif
#endif
