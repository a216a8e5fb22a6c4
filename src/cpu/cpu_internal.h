/*
 * What the files of the CPU reference share and nothing else sees: the
 * decode tables and block pieces of the row engine (row.c) that the
 * methods reuse, V's gather and block means (v_operand.c), one head's
 * prepared operands (head_ops.c), and what a call takes from and leaves
 * to its layer (layer_state.c).  attention.c runs the dense methods on
 * them; draft.c runs the draft methods on the engine of internal.h.
 */
#ifndef QVATTN_CPU_INTERNAL_H
#define QVATTN_CPU_INTERNAL_H

#include "internal.h"

/* ------------------------------------------------------------ row engine */

/* The E4M3 decode table: the hot loops decode every P and V code. */
const float *qvi_e4m3_lut(void);
/* The decode table of the P codes of an expcast mode (V's stay E4M3). */
const float *qvi_p_lut(int expcast);
/* qvi_probs_e4m3 against the row max m, or (p_block) against the block's
 * own max m_b with the block's weight *w = exp2f(m_b - m) (1 otherwise,
 * 0 for a block without keys, whose codes are then all 0): the codes, and
 * the row sum times *w. */
float qvi_probs_e4m3_at(const float *s, float m, int nk, int expcast, int sum_codes,
                        int p_block, uint8_t *pc, float *floor, float *w);

/* ------------------------------------------------------------ V operand */

/* Rows of v gathered by perm (NULL: in order) into dst[n * d]. */
void qvi_gather_rows(const float *v, int n, int d, const int32_t *perm, float *dst);
/* Block means over the valid rows (qvi_block_mean) into mu[nblk * d], and
 * the residual in place. */
void qvi_block_demean(float *x, int n, int d, int nblk, float *mu);

/* ------------------------------------------------------------ one head */

/* QVI_PATH_F32: the decomposition's FP32 engine (qvi_quant_mask other than
 * QVI_QUANT_ALL): every operand in FP32, dequantized where its bit is on. */
typedef enum qvi_path_kind {
    QVI_PATH_16,
    QVI_PATH_FP8,
    QVI_PATH_I8,
    QVI_PATH_FP4,
    QVI_PATH_F32
} qvi_path_kind;

/* One head's prepared operands. Q rows and K/V rows padded to QVI_BLOCK. */
typedef struct qvi_head_ops {
    qvi_path_kind kind;
    int nq, nk, nq_pad, nk_pad, d;
    int expcast;
    int sum_codes;        /* cfg->p_sum == QVA_P_SUM_CODES                    */
    int floor_mass;       /* cfg->p_floor == QVA_P_FLOOR_MEAN                 */
    int p_block;          /* cfg->p_max == QVA_P_MAX_BLOCK                    */
    float *vbar;          /* +floormass without demeaning: fp16(mean of V
                             / scale_c) (QVI_PATH_I8), else NULL              */
    qva_v_code v_code;    /* QVI_PATH_I8: V's code (cfg->v_code)              */
    int use_f16;          /* 16-bit path in FP16 (f16 inputs), else BF16      */
    int strict;           /* check_finite: a NaN/+inf score fails the row     */
    float scale_log2;
    float *qf, *kf, *vf;  /* QVI_PATH_16 (rounded) and QVI_PATH_FP4 (unscaled) */
    float gq, gk, gv;     /* NVFP4 tensor scales                              */
    float *mu4;           /* vc4 block means (FP16-rounded), or NULL          */
    qvi_i8 qi, ki;        /* QVI_PATH_I8                                      */
    int q_rows_per_scale; /* QVI_PATH_I8: 1 or QVI_BLOCK (qva_q_granularity)  */
    qvi_f8 q8, k8, v8b;   /* QVI_PATH_FP8                                     */
    qvi_v8 v8;            /* QVI_PATH_I8 values                               */
    float *lse_shift;     /* nq: LSE correction of K smoothing, or NULL       */
    int mask;             /* qvi_quant_mask of the call                       */
    qvi_path_kind codes_kind; /* QVI_PATH_F32: the method's own path (its P)  */
    float *xq, *xk, *xv;  /* QVI_PATH_F32 operands (V: the residual for vc)   */
    float *xmu;           /* QVI_PATH_F32 V-Smooth means, real units, or NULL */
    float *xvbar;         /* QVI_PATH_F32 vbar in real units, or NULL         */
} qvi_head_ops;

/* What a layer's calls carry to its next call, for one head: +kprev's K
 * means and +vprev's V channel scales.  use: the previous call's (NULL:
 * this call's own); next: where this call's go (NULL: not wanted). */
typedef struct qvi_carried {
    const float *kuse, *vuse;
    float *knext, *vnext;
    int v_blocks; /* +vsample: demeaning steps' scales from sampled blocks */
} qvi_carried;

/* Loads, permutes (perm: the V-Smooth order of the head's K/V, or NULL),
 * smooths, rotates and quantizes query head (b, h), which reads K/V head
 * (b, hk), into *o; free it with qvi_cpu_head_ops_free, also on failure. */
qva_status qvi_cpu_prepare_head(const qva_config *cfg, const qva_tensor *qt,
                                const qva_tensor *kt, const qva_tensor *vt, int64_t b,
                                int64_t h, int64_t hk, const int32_t *perm, int demean,
                                int mask, const qvi_carried *km, qvi_head_ops *o);
void qvi_cpu_head_ops_free(qvi_head_ops *o);

/* ------------------------------------------------------------ layer state */

/* The V-Smooth permutation and demeaning of K/V head (b, hk) for this
 * call (perm NULL and no demeaning for the other methods). */
qva_status qvi_cpu_kv_head_order(qva_context_t *ctx, const qva_config *cfg,
                                 const qva_tensor *vt, int64_t b, int64_t hk,
                                 const int32_t **perm, int *demean);
/* +kprev / +vprev: what the layer's previous call left for K/V head
 * (b, hk), copied into buf[0] / buf[1], and where this call's go (buf[2],
 * buf[3]). */
qva_status qvi_cpu_carried_of(qva_context_t *ctx, const qva_config *cfg, int64_t b,
                              int64_t hk, int d, float (*buf)[128], qvi_carried *cs);
/* +ksample / +vsample: this call's statistics of K/V head (b, hk) from
 * its sampled tokens, into buf[0] / buf[1] as if carried. */
qva_status qvi_cpu_sampled_of(const qva_config *cfg, const qva_tensor *k, const qva_tensor *v,
                              int64_t b, int64_t hk, float (*buf)[128], qvi_carried *cs);
/* Keeps this call's K mean / V scales (cs->knext, cs->vnext) for the
 * layer's next call, with the call's shape. */
qva_status qvi_cpu_carried_store(qva_context_t *ctx, const qva_config *cfg, int64_t b,
                                 int64_t hk, int d, const int64_t shape[3],
                                 const qvi_carried *cs);

#endif
