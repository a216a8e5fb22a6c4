/*
 * Host-side interface between the files of the operand preparation
 * (src/cuda/prep/, listed in prep_common.cuh): the Q/K parameter block
 * that the 8-bit and the NVFP4 kernels share, and the host functions one
 * file calls in another.  Internal to these files (C++, included only by
 * .cu files); the backend's entry points are in cuda_internal.h.
 */
#ifndef QVATTN_CUDA_PREP_INTERNAL_H
#define QVATTN_CUDA_PREP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_internal.h"

#define MAX_D 128 /* largest head dim of the prepared operands */

/* Per (bh, 128-row block, channel) extremes of K' = K[perm], [BH][nblk][D]
 * each (fminf / fmaxf over the block's rows: NaN skipped, +inf / -inf when
 * every value is NaN); min NULL: not wanted. */
typedef struct qvc_block_ext {
    float *min, *max;
} qvc_block_ext;

/* One Q or K operand: qk_quant_kernel (qk.cu), qk_plain_kernel (qk_plain.cu)
 * and the NVFP4 Q/K kernels
 * (fp4.cu, which leave fmt, codes and scale unused) read it. */
typedef struct qk_params {
    qvc_view x;
    const int32_t *perm;  /* [BH][n] or NULL                   */
    const float *mean;    /* [BH][D] subtracted, or NULL       */
    const float *signs;   /* [D] +-1 or NULL                   */
    int hadamard;
    float had_scale;      /* (float)(1/sqrt((double)D))        */
    int fmt;              /* qvc_qk_format                     */
    int n, n_pad;
    int rows_per_scale;   /* 1 (INT8 Q per row) or QVI_BLOCK   */
    int vec;              /* qk.cu: vector loads allowed (set there) */
    qvc_block_ext ext;    /* K' block extremes (qk_plain.cu, block scales) or {NULL} */
    int32_t *csum;        /* K, qk_plain.cu: [BH][n_pad/128][D] each block's
                             column sums of its codes (+kprev), or NULL */
    qvc_qk8_launcher dev_qk8; /* the dev driver's trial, or NULL */
    int8_t *codes;        /* [BH][n_pad][D]                    */
    float *scale;         /* [BH][n_pad/rows_per_scale]        */
} qk_params;

static inline size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* ---- prep8.cu */
/* What qvc_prep and qvc_prep4 both require of their views and arguments. */
qva_status qvc_prep_check_views(const char *who, const qvc_view *q, const qvc_view *k,
                                const qvc_view *v, const qvc_prep_args *a, int BH, int nq,
                                int nk, int D);
/* K smoothing: kmean [BH][D] (NULL: none) = the channel mean of K[a->perm]
 * (qvc_kmean, with the block extremes into kext where kext.min is set;
 * with a->k_sample that of its sampled rows, qvc_stat_sample, kpart its
 * scratch), then a->lse_shift (if not NULL) = the LSE shift it causes
 * (smooth_k() of the CPU). */
qva_status qvc_prep_ksmooth(const qvc_view *q, const qvc_view *k, const qvc_prep_args *a, int nk,
                            int BH, float *kmean, qvc_block_ext kext, void *kpart,
                            cudaStream_t st);

/* ---- sample.cu */

/* ---- kmean.cu */
/* mean [BH][D] = the channel mean of K[perm] (perm [BH][n] or NULL) as the
 * CPU's qvi_channel_mean sums it: 128-row block sums, then their sum; and,
 * where kext.min is set, the blocks' extremes. */
/* +kprev: valid [BH] (or NULL) marks the heads whose mean is carried in
 * stored [BH][D]: their mean is stored's and their K is not read. */
qva_status qvc_kmean(const qvc_view *k, const int32_t *perm, int n, int BH, float *mean,
                     qvc_block_ext kext, const float *stored, const int *valid,
                     cudaStream_t st);
/* +kprev: the means the layer's next call uses, the CPU's next_k_mean:
 * stored [BH][D] = used + (FP64 block-order sum of kscale_b * csum_b) / n,
 * with the rotation undone first where rotate (+hadamard; signs: device
 * [D], or NULL for all +1); valid [BH] = every channel finite.  csum,
 * kscale: qk_plain.cu's K outputs ([BH][nblk][D], [BH][nblk]). */
qva_status qvc_kmean_next(const int32_t *csum, const float *kscale, const float *used,
                          int rotate, const float *signs, int n, int nblk, int BH, int D,
                          float *stored, int *valid, cudaStream_t st);

/* ---- qk.cu */
/* Codes and scales (per block, or per row for INT8 with p.rows_per_scale
 * 1) of one Q or K operand (p.fmt: qvc_qk_format). */
qva_status qvc_prep_qk8(const qk_params &p, int BH, int D, cudaStream_t st, const char *what);

/* ---- qk_plain.cu */
/* Whether qk_plain_kernel serves p (INT8, rotated or not, 16-bit
 * vector-loadable input, D 64 or 128), and its launch over grid
 * (n_pad / 128, BH).  qvc_qk_plain_takes_ext: it serves K's block scales
 * from the K mean pass's block extremes (p.ext), which say nothing of
 * rotated rows. */
bool qvc_qk_plain_ok(const qk_params &p, int D);
bool qvc_qk_plain_takes_ext(const qk_params &p, int D);
void qvc_qk_plain_launch(const qk_params &p, dim3 grid, int D, cudaStream_t st);

/* ---- qk_wide.cu */
/* Whether qk_wide.cu's kernels serve p (qk_plain's rotated INT8 Q per row
 * or K per block at head dim 128, without +kprev's code sums), and their
 * launch over grid (n_pad / 128, BH). */
bool qvc_qk_wide_ok(const qk_params &p, int D);
void qvc_qk_wide_launch(const qk_params &p, dim3 grid, cudaStream_t st);

/* ---- v_plain.cu */
/* One V operand of v_plain_kernel (per-channel scales, v_mode 0 or 2). */
typedef struct v_plain_params {
    qvc_view v;
    const int32_t *perm; /* [BH][n] or NULL                             */
    int n, nblk;
    const float *bmu;    /* [BH][nblk][D] raw block means if demeaned, else NULL */
    const float *chan;   /* [BH][D] channel scales                      */
    uint8_t *v_t;        /* [BH][nblk][D][128]                          */
    float *v_blk;        /* [BH][nblk]: 1                               */
    uint8_t *v_t_lo;     /* [BH][nblk][D][128] V's second digit, or NULL */
    int int8;            /* INT8 codes (v_mode 2: +i8pv), not E4M3       */
    /* +vprev: run only heads with only[bh] == only_value (only: NULL, all);
     * bamax: where undemeaned E4M3 coding also leaves the blocks' channel
     * amax (v_amax_plain_kernel's), or NULL */
    const int *only;
    int only_value;
    float *bamax;
    /* +vsample on a demeaning step: the kernel takes each block's mean
     * itself (v_stats_plain_kernel's sums) and writes it here, its
     * residual amax into bamax; bmu is NULL.  NULL: not fused. */
    float *fused_mu;
} v_plain_params;
/* Whether v_plain_kernel serves V in this mode (0, 16-bit vector-loadable
 * input, D 64 or 128), and its launch. */
bool qvc_v_plain_ok(const qvc_view *v, int mode);
void qvc_v_plain_launch(const v_plain_params &p, int BH, cudaStream_t st);
/* qvc_prep_v_stats without demeaning for the inputs qvc_v_plain_ok takes:
 * the per-block channel amax into bamax [BH][nblk][D] (bmu not written:
 * nothing reads it undemeaned). */
void qvc_v_amax_plain_launch(const qvc_view &v, const int32_t *perm, int n, int nblk, int BH,
                             float *bamax, const int *skip, cudaStream_t st);

/* qvc_prep_v_stats with demeaning for the inputs qvc_v_plain_ok takes:
 * the raw block means into bmu and the residual amax into bamax; with
 * sampled only those of the QVA_STAT_BLOCKS(nblk) blocks QVA_STAT_BLOCK
 * picks, [BH][QVA_STAT_BLOCKS(nblk)][D]. */
void qvc_v_stats_plain_launch(const qvc_view &v, const int32_t *perm, int n, int nblk, int BH,
                              float *bmu, float *bamax, int sampled, cudaStream_t st);

/* ---- v.cu */
/* Per (128-key block, bh, channel) of V[perm]: the raw block mean (0
 * unless demean) into bmu and the residual amax into bamax, [BH][nblk][D]. */
qva_status qvc_prep_v_stats(const qvc_view *v, const int32_t *perm, int nk, int nblk, int BH,
                            int demean, float *bmu, float *bamax, cudaStream_t st,
                            const char *what);
/* The V part of qvc_prep: ops->v_t, v_chan, v_blk and v_mu from V[a->perm]
 * (bmu, bamax: [BH][nblk][D] scratch, used for a->v_mode 0; vprev_scratch:
 * 2 BH D floats and BH ints for a->vprev_scale, qvc_v_sampled_blocks_floats
 * for a->v_sample with demean, else unused). */
qva_status qvc_prep_v8(const qvc_view *v, const qvc_prep_args *a, int demean, float *bmu,
                       float *bamax, qvc_ops *ops, float *vprev_scratch, cudaStream_t st);
size_t qvc_v_sampled_blocks_floats(int BH, int D);

#endif
