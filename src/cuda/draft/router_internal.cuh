/*
 * What the four files of the device router share (router.cu has the
 * overview): the launch shapes, the 64-bit ranking key, the count-select
 * state, the MASS integers and the scratch regions of one call, and the
 * entry points each file gives the others.  Internal to src/cuda/draft/.
 */
#ifndef QVATTN_CUDA_DRAFT_ROUTER_INTERNAL_CUH
#define QVATTN_CUDA_DRAFT_ROUTER_INTERNAL_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/device_util.cuh"
#include "draft/budget.h"
#include "draft/partition.h"
#include "draft/plan.h"


#define DR_MAX_D 128
#define DR_FULL 0xffffffffu
#define DR_ROWS_PER_CTA 8       /* warps (= query-region rows) of the list kernels */
#define DR_SEL_THREADS 1024     /* threads of each CTA of the count select */
#define DR_SCAN_THREADS 1024
#ifndef DR_MAP_WARPS
#define DR_MAP_WARPS 8          /* warps of each map CTA (-D for trials) */
#endif
#ifndef DR_MAP_CTAS
#define DR_MAP_CTAS 2           /* map CTAs an SM, each a branch of a cluster pair:
                                   the register cap is 64K / (32 * warps * CTAs) */
#endif
#ifndef DR_MAP_MAX_ROWS
#define DR_MAP_MAX_ROWS 16      /* query regions per map CTA, when shared memory allows (-D for trials) */
#endif
/*
 * Orderable key of a draft-map value: larger A -> larger key; NaN -> 0,
 * below every number (the CPU sorts NaN last); -0 and +0 equal (the CPU
 * compares with !=).
 */
static __host__ __device__ __forceinline__ uint32_t dr_order_key(uint32_t u) {
    return qvi_budget_order_key(u); /* src/draft/budget.h: the MASS select reads it too */
}

/* Distinct 64-bit key of pair i among M: descending order = the CPU's
 * stable descending argsort (equal A: ascending i). */
static __host__ __device__ __forceinline__ uint64_t dr_comp(uint32_t abits, uint64_t i,
                                                            uint64_t M) {
    return ((uint64_t)dr_order_key(abits) << 32) | (M - 1 - i);
}

/* Selection mode of one cumulative quota e_j: none retained, all, or a
 * threshold found by the radix select. */
enum { DR_SEL_NONE = 0, DR_SEL_ALL = 1, DR_SEL_FIND = 2 };

typedef struct dr_bounds {
    int mode[3];
} dr_bounds;

/* Per head: the selected key bits so far, the rank left within them and
 * whether the search is over (the remaining bits of tau stay zero). */
typedef struct dr_sel {
    unsigned long long prefix[3];
    unsigned long long rank[3];
    int done[3];
} dr_sel;

/* Precision (0/4/8/16) of composite key c under the per-head thresholds. */
static __host__ __device__ __forceinline__ int dr_class(uint64_t c, const dr_bounds &bd,
                                                        const unsigned long long *tau) {
#define DR_KEPT(j) (bd.mode[j] == DR_SEL_ALL || (bd.mode[j] == DR_SEL_FIND && c >= tau[j]))
    return DR_KEPT(0) ? 16 : DR_KEPT(1) ? 8 : DR_KEPT(2) ? 4 : 0;
#undef DR_KEPT
}

/* Phase index of a precision: 0 NVFP4, 1 INT8, 2 16-bit, -1 skipped. */
static __device__ __forceinline__ int dr_phase(int p) {
    return p == 4 ? 0 : p == 8 ? 1 : p == 16 ? 2 : -1;
}


/* The MASS integers of one call, from the host (qvi_draft_mass_bounds and
 * the split fractions in parts per million, as qvi_draft_quotas takes
 * them). */
typedef struct dr_mass_params {
    long long M, mass_ppm, keep_min, keep_max;
    long long u[4]; /* QVI_Q_* order; u[QVI_Q_SKIP] = 0 */
} dr_mass_params;

/* Per head, the weighted select over the value digits (budget.h). */
typedef qvi_budget_sel dr_mass;

/* The scratch regions of one call (router.cu carves them): selection
 * state [BH], row counts [BH][R][3] i32; for the MASS budget the heads'
 * list starts [BH] i64. */
typedef struct dr_scratch {
    dr_sel *sel;
    int32_t *cnt;
    int64_t *base;
} dr_scratch;

/* router_map.cu: pooling (Eq. 1; skipped when pooled: b holds it) and the
 * draft map (Eq. 2) into b->A. */
qva_status qvc_dr_pool_map(const qvc_view *q, const qvc_view *k, const qvc_draft_layout *lay,
                           const qvc_draft_route_buf *b, int pooled, double sm, double lam,
                           cudaStream_t st);

/* router_select.cu: the thresholds of every head's cumulative boundaries
 * in sc->sel.  QUOTA: the same e[3] for every head, *bd their modes;
 * MASS: each head's K, quotas (b->head_quota) and boundaries on the
 * device, every mode FIND. */
qva_status qvc_dr_select_quota(const qvc_draft_route_buf *b, const long long e[3],
                               const dr_scratch *sc, dr_bounds *bd, cudaStream_t st);
qva_status qvc_dr_select_mass(const qvc_draft_route_buf *b, const dr_mass_params *mp,
                              const dr_scratch *sc, dr_bounds *bd, cudaStream_t st);

/* router_lists.cu: the precision matrix, CSR offsets and key lists from
 * the thresholds.  retained >= 0: every head keeps that many pairs (QUOTA);
 * -1: each head's count is in b->head_quota (MASS). */
qva_status qvc_dr_lists(const qvc_draft_route_buf *b, const dr_bounds *bd, const dr_scratch *sc,
                        long long retained, cudaStream_t st);

#endif
