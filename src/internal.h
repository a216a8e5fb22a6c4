/*
 * Internal interfaces shared by the core, the CPU reference and the CUDA
 * backend.  Not installed.  Names carry the qvi_ prefix.
 */
#ifndef QVATTN_INTERNAL_H
#define QVATTN_INTERNAL_H

#include "qvattn.h"

#include <math.h>
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QVI_BLOCK 128              /* query/key/value block (B_v, DA2 C)    */
#define QVI_LOG2E 1.4426950408889634f
#define QVI_SAGE_P_OFFSET 8.807f   /* exp2 offset: P max ~ 448 (DA2 C.3)    */
#define QVI_SAGE_ETA 0.0022326917f /* 2^-8.807, P dequant scale (DA2 C.3)   */
#define QVI_EXPCAST_LOG2_AMP 8.0f  /* ExpCast puts the row max at 2^8       */
/* +expcast-e5m2 (NUMERICS §7, "One candidate: ExpCast in E5M2"): code =
 * rint(4u + 120 + beta) in E5M2, code 120 = 2^15; beta centres the mean
 * decoded/exact ratio (bench/p_code_bias.py, a 0.01 grid). */
#define QVI_EXPCAST5_BETA (-0.22f)
#define QVI_EXPCAST5_LOG2_AMP 15.0f
/* +i8pv: a block's u8 codes put its row max at 255, and the block weight
 * exp2(m_b - m) keeps the row's max at 255: log2(255) */
#define QVI_U8_LOG2_AMP 7.99435343685885793f
#define QVI_V_E4M3_RANGE 2.25f     /* per-channel V scale amax/2.25 (C.3)   */
/* +floormass (qva_p_floor): a key whose E4M3 P code is below
 * QVI_P_NORMAL_CODE (zero or subnormal) is weighed by ExpCast's code of its
 * score QVI_FLOOR_BINADES binades up, times 2^-QVI_FLOOR_BINADES.  Those
 * codes stay below 104, normal down to u = -26.94; what lies lower is under
 * 2^-26.94 of the row max per key (0.09% of a row at 111,700 keys). */
#define QVI_P_NORMAL_CODE 8
#define QVI_FLOOR_BINADES 12

/* ExpCast's beta for a qva_expcast_mode other than off (the paper's, or
 * the centred one); the kernels take the addend 120 + beta
 * (qvi_expcast_addend in expcast_magic.h). */
static inline float qvi_expcast_beta(int mode) {
    return mode == QVA_EXPCAST_E5M2       ? QVI_EXPCAST5_BETA
           : mode == QVA_EXPCAST_CENTRED ? QVA_EXPCAST_BETA_CENTRED
                                         : QVA_EXPCAST_BETA;
}
/* +expcast-e5m2's code of u = (s - m) log2(e) <= 0, and E5M2's value
 * (src/formats.c). */
uint8_t qvi_expcast_e5m2(float u, float beta);
float qvi_e5m2_decode(uint8_t code);
/* log2 of the decoded row max of a P code: ExpCast's 2^8 (E4M3 code
 * 120) or 2^15 (E5M2 code 120); the exp2 path's 8.807 offset otherwise. */
static inline float qvi_p_log2_amp(int expcast) {
    return expcast == QVA_EXPCAST_E5M2 ? QVI_EXPCAST5_LOG2_AMP
           : expcast                   ? QVI_EXPCAST_LOG2_AMP
                                       : QVI_SAGE_P_OFFSET;
}

/* ------------------------------------------------------------ errors */
/* Records a formatted message for qva_last_error() and returns st. */
qva_status qvi_fail(qva_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void qvi_clear_error(void);

/* ------------------------------------------------------------ tensors */
/* Element offset of (b,h,n,d) in t. */
static inline int64_t qvi_offset(const qva_tensor *t, int64_t b, int64_t h,
                                 int64_t n, int64_t d) {
    return b * t->stride[0] + h * t->stride[1] + n * t->stride[2] +
           d * t->stride[3];
}
float qvi_load_elem(const qva_tensor *t, int64_t off);
/* An f16 value from its bits, widened exactly (NaN payloads kept). */
float qvi_f16_bits_to_float(uint16_t h);
void qvi_store_elem(const qva_tensor *t, int64_t off, float x);
/* Copies head (b,h) of a CPU tensor into dst[n*d] (row-major, f32). */
void qvi_load_head(const qva_tensor *t, int64_t b, int64_t h, float *dst);
/* Stores src[n*d] into head (b,h) of a CPU tensor, rounding to its dtype. */
void qvi_store_head(const qva_tensor *t, int64_t b, int64_t h,
                    const float *src);
/* Validates q,k,v,out,lse against each other and the config (validate.c). */
qva_status qvi_validate_call(const qva_config *cfg, const qva_tensor *q,
                             const qva_tensor *k, const qva_tensor *v,
                             const qva_tensor *out, const qva_tensor *lse,
                             qva_device expect);
/* Every option of cfg alone; the first that is wrong is the one reported. */
qva_status qvi_check_config(const qva_config *cfg);
float qvi_sm_scale(const qva_config *cfg, int64_t d);
/* Ceil-divide for block counts. */
static inline int qvi_cdiv(int a, int b) { return (a + b - 1) / b; }

/* ------------------------------------------------------------ context */
typedef enum qvi_slot {
    QVI_SLOT_DRAFT = 0,      /* host partition cache (src/draft/partition.c)    */
    QVI_SLOT_CUDA = 1,       /* CUDA workspace (src/cuda/runtime.cu)             */
    QVI_SLOT_CUDA_DRAFT = 2, /* CUDA draft layout/route/operands (draft/host.cu) */
    QVI_SLOT_CUDA_DEV = 3,   /* kernel versions under trial (dev/cuda)          */
    QVI_SLOT_COUNT_
} qvi_slot;
/* The context's lock (include/qvattn.h, "Threads").  qva_attention holds
 * it around the whole backend call, so everything below is called with it
 * held; code that reaches the context's state from elsewhere takes it
 * (not recursive: never call a locking qva_context_* or qva_attention with
 * it held). */
void qvi_context_lock(qva_context_t *ctx);
void qvi_context_unlock(qva_context_t *ctx);
/* A per-context slot that a module owns.  If dtor points to a non-NULL
 * function it is registered as the slot's destructor (run on context free
 * and reset); if it points to NULL it receives the registered one. */
void **qvi_context_slot(qva_context_t *ctx, qvi_slot slot,
                        void (**dtor)(void *));

void *qvi_context_stream(const qva_context_t *ctx);
qva_device qvi_context_device(const qva_context_t *ctx);
/* Method families (config.c). */
int qvi_method_is_8bit(qva_method m);
int qvi_method_is_quantized(qva_method m);
/* sage8, vc8, draft: the methods whose QK runs on INT8 query codes. */
int qvi_method_has_int8_q(qva_method m);
/* cfg->p_sum = QVA_P_SUM_CODES is meaningful: fp8, sage8, vc8 without
 * ExpCast. */
int qvi_p_sum_applies(const qva_config *cfg);
/* cfg->v_code = QVA_V_E4M3X2 is meaningful: sage8, vc8. */
int qvi_v_code_applies(qva_method m);
/* cfg->k_mean = QVA_K_MEAN_PREVIOUS is meaningful: sage8, vc8. */
int qvi_k_mean_applies(qva_method m);
/* cfg->v_scale = QVA_V_SCALE_PREVIOUS is meaningful: sage8, vc8 with one
 * E4M3 digit of V. */
int qvi_v_scale_applies(const qva_config *cfg);
/* cfg->p_floor = QVA_P_FLOOR_MEAN is meaningful: sage8, vc8 with an E4M3
 * ExpCast (paper or centred beta) and E4M3 V codes. */
int qvi_p_floor_applies(const qva_config *cfg);
int qvi_p_max_applies(const qva_config *cfg);
/* The fields a method name sets unless a suffix does (hadamard, p_sum),
 * at cfg->method's defaults: qva_config_set_method's, and a draft warm-up
 * step's (the warm-up method by its plain name). */
void qvi_method_defaults(qva_config *cfg);
int qvi_context_profiling(const qva_context_t *ctx);
void qvi_context_set_timings(qva_context_t *ctx, const qva_timings *t);
/* Timings a backend can only read later (the CUDA phases' events, which
 * the call does not wait for): qva_context_last_timings calls fn(arg, out)
 * once, under the context lock, and keeps its answer (zeros and fn's
 * status on failure).  Cleared by qvi_context_set_timings; resolved before
 * qva_context_reset frees the slots fn may read. */
typedef qva_status (*qvi_timings_fn)(void *arg, qva_timings *out);
void qvi_context_set_timings_lazy(qva_context_t *ctx, qvi_timings_fn fn, void *arg);
/* The kept share qva_context_last_draft_stats reports (zeroed at the start
 * of every qva_attention call; the CPU draft sets it when it finishes). */
void qvi_context_set_draft_stats(qva_context_t *ctx, const qva_draft_stats *st);
/* Stats a backend can only read later (the CUDA router's per-head counts
 * live on the device): qva_context_last_draft_stats calls fn(arg, out) once,
 * under the context lock, and keeps its answer; a failure reports no heads
 * and returns fn's status.  Cleared by qvi_context_set_draft_stats (every
 * qva_attention call starts with it); resolved before qva_context_reset
 * frees the slots fn may read. */
typedef qva_status (*qvi_draft_stats_fn)(void *arg, qva_draft_stats *out);
void qvi_context_set_draft_stats_lazy(qva_context_t *ctx, qvi_draft_stats_fn fn, void *arg);

/* Per-(layer, batch, K/V head) state: V-Smooth's permutation and
 * centroids, and what +kprev and +vprev carry to the layer's next call. */
typedef struct qvi_vs_state {
    int n, d, k;         /* tokens, head dim, clusters              */
    int32_t *perm;       /* n entries, NULL before the first group  */
    float *centroids;    /* k*d                                     */
    int last_group_step; /* step at which perm was computed         */
    int kmean_d;         /* channels of kmean; 0: none stored yet   */
    float kmean[128];
    int vscale_d;        /* channels of vscale (+vprev); 0: none    */
    float vscale[128];
    int64_t carry_shape[3]; /* B, H, H_kv of the call that left them:
                               another shape restarts (CUDA's rule)  */
} qvi_vs_state;
/* A call of shape (B, H, H_kv) at `layer`: every state of the layer whose
 * carried statistics (+kprev, +vprev) came from another shape forgets them
 * (the layer restarts, as on CUDA, whose state is one array per layer). */
void qvi_context_carry_shape(qva_context_t *ctx, int layer, const int64_t shape[3]);
/* Finds or creates the state of (layer, b, h); NULL on OOM. */
qvi_vs_state *qvi_context_vs_state(qva_context_t *ctx, int layer, int64_t b,
                                   int64_t h);

/* ------------------------------------------------------------ k-means */
/*
 * Lloyd k-means over the n rows of v[n*d] (f32).  If warm != 0 the
 * centroids array holds the starting centroids, else they are initialised
 * from the rows at i*n/k.  labels receives n labels; centroids is updated.
 * Deterministic: distances in FP32 in channel order, ties to the lower
 * cluster; sums in FP64; an empty cluster keeps its previous centroid.
 */
void qvi_kmeans(const float *v, int n, int d, int k, int iters, int warm,
                float *centroids, int32_t *labels);
/* perm = stable argsort(labels) (counting sort). */
void qvi_stable_argsort_labels(const int32_t *labels, int n, int k,
                               int32_t *perm);

/* ------------------------------------------------------------ operands */
/* Hadamard signs for a config (NULL-free: all +1 when not randomized). */
void qvi_hadamard_signs(const qva_config *cfg, int d, float *signs);
/* Channel mean over the first n rows of x[n*d] (K smoothing's): the block
 * sums of qvi_block_sum added in FP64 in block order, f32 result. */
void qvi_channel_mean(const float *x, int n, int d, float *mean);
/* Channel c's sum over the QVI_BLOCK-row block at row r0 of x[n*d] in the
 * fixed FP32 tree of docs/NUMERICS.md §4 (rows past n read as +0), and
 * V-Smooth's block mean: that sum divided in FP32 by the valid rows'
 * count.  The GPU's kernels give the same bits. */
#define QVI_TREE_LEAVES 32 /* leaf i: rows i, i + 32, i + 64, i + 96 */
float qvi_block_sum(const float *x, int n, int d, int r0, int c);
float qvi_block_mean(const float *x, int n, int d, int r0, int c);

/* INT8 codes with the DA2 C.3 quantizer (scale amax/127 + 1e-7) over
 * groups of rows_per_scale rows: QVI_BLOCK (K, and Q as the papers) or 1
 * (Q per row, qva_q_granularity). */
typedef struct qvi_i8 {
    int8_t *codes;      /* n_pad*d                    */
    float *scale;       /* cdiv(n_pad, rows_per_scale) */
    int rows_per_scale; /* 1 or QVI_BLOCK              */
} qvi_i8;
/* The scale of row r's codes. */
static inline float qvi_i8_row_scale(const qvi_i8 *x, int64_t r) {
    return x->scale[r / x->rows_per_scale];
}
/* E4M3 blocks: codes with a scalar scale per block and per channel. */
typedef struct qvi_f8 {
    uint8_t *codes;     /* n_pad*d */
    float *block_scale; /* nblk    */
    float *chan_scale;  /* d       */
} qvi_f8;

/* x[n_pad*d] rows >= n are zero.  These allocate the arrays of *out with
 * malloc (NULL fields on failure); the caller frees each field. */
void qvi_quant_i8(const float *x, int n_pad, int d, int rows_per_scale, qvi_i8 *out);
/* Rows per INT8 query scale for a config: 1, or QVI_BLOCK with +qblock. */
int qvi_q_rows_per_scale(const qva_config *cfg);
/* per-block scalar scale amax/448 (1 where the block is zero). */
void qvi_quant_e4m3_blocks(const float *x, int n_pad, int d, qvi_f8 *out);
/* NVFP4 rows: groups of 16 along d; stores the unscaled reconstruction
 * sigma*e2m1 in out[n_pad*d] and returns the per-tensor scale g. */
float qvi_quant_nvfp4_rows(const float *x, int n_pad, int d, float *out);
/* NVFP4 columns: groups of 16 consecutive rows in each channel (V). */
float qvi_quant_nvfp4_cols(const float *x, int n_pad, int d, float *out);

/*
 * The 8-bit value operand of sage8/vc8 (VC §3.2, App. B): rows gathered by
 * perm (NULL: identity), block means over the valid rows of each block of
 * QVI_BLOCK (if demean), residual coded E4M3 with per-channel scale
 * amax/2.25 (QVA_V_INT8_PV: INT8, amax/127), means stored FP16 and divided
 * by that scale.
 */
typedef struct qvi_v8 {
    int n, n_pad, d, nblk;
    uint8_t *codes;   /* n_pad*d (QVA_V_INT8_PV: int8_t bits) */
    uint8_t *codes_lo;/* n_pad*d: the second digit (QVA_V_E4M3X2), else NULL */
    float *chan_scale;/* d                             */
    float *mu_hat;    /* nblk*d, NULL without demeaning */
} qvi_v8;
/* code: QVA_V_E4M3; QVA_V_E4M3X2 adds codes_lo = e4m3(x - dec(codes)), x
 * the scaled (demeaned) value codes encodes; QVA_V_INT8_PV codes
 * x = value / scale as rint(x) in [-127, 127]. */
qva_status qvi_v8_prepare(const float *v, int n, int d, const int32_t *perm,
                          int demean, qva_v_code code, qvi_v8 *out);
/* +vsample: V's channel scales over rows QVA_STAT_ROW(i, n) of x (n rows
 * of d): amax / 2.25, 1 for an all-zero channel (NaN skipped, as the
 * call's own scales skip it). */
void qvi_v_sample_scales(const float *x, int n, int d, float *scale);
/* qvi_v8_prepare with +vprev's carried channel scales (E4M3, one digit):
 * use (d, or NULL) replaces this call's own scales without demeaning,
 * where they serve (every code within E4M3's range: one decision for the
 * whole head); next (d, or NULL) receives the own scales, for the layer's
 * next call.  sample_blocks (+vsample), with demean: the residual's scales
 * from the QVA_STAT_BLOCK blocks replace the own where they serve (every
 * code within E4M3's range and every mean / scale <= 32768). */
qva_status qvi_v8_prepare_carried(const float *v, int n, int d, const int32_t *perm, int demean,
                                  qva_v_code code, const float *use, int sample_blocks,
                                  float *next, qvi_v8 *out);
void qvi_v8_free(qvi_v8 *x);

/* ------------------------------------------------------------ row engine */
/*
 * One query row's online-softmax state (Eq. 1 of VC, Eq. 8 of DA2).  Scores
 * are in the log2 domain (s * sm_scale * log2 e).  acc and l are in the
 * units of the current phase: an 8-bit phase keeps them amplified by 2^a
 * (a = 8.807 for exp2, 8 for ExpCast) and acc in value-code units.
 */
typedef struct qvi_row {
    float m;       /* running max, -INFINITY before any key          */
    float l;       /* denominator                                     */
    float *acc;    /* numerator [d]                                   */
    int d;
    int nonfinite; /* a score was NaN or +inf (the max ignores NaN)   */
    float floor;   /* +floormass: weight (in l) of keys whose value is
                      floor_mean, rescaled with acc and l             */
    const float *floor_mean; /* [d] in acc's units, or NULL: none     */
} qvi_row;

void qvi_row_init(qvi_row *r, float *acc, int d);
/* Raises m to cover s[0..nk) (masked = -INFINITY) and rescales l, acc.
 * Like fmaxf on the GPU, the max ignores NaN scores; a NaN or +inf score
 * sets r->nonfinite (for check_finite). */
void qvi_row_raise_max(qvi_row *r, const float *s, int nk);

/* Scores: s[j] = dot(q, K_j) * scale_log2, FP32 sum in channel order. */
void qvi_scores_f32(const float *q, const float *K, int nk, int d,
                    float scale_log2, float *s);
/* Scores: s[j] = (float)int32_dot * ((dq * dk) * scale_log2). */
void qvi_scores_i8(const int8_t *q, float dq, const int8_t *K, float dk,
                   int nk, int d, float scale_log2, float *s);
/* Scores of E4M3-coded q, K with scalar scales: same order as i8. */
void qvi_scores_e4m3(const uint8_t *q, float dq, const uint8_t *K, float dk,
                     int nk, int d, float scale_log2, float *s);

/* 16-bit PV: p = exp2(s-m) (FP32), l += sum p, P rounded to the 16-bit
 * format (bf16 if use_f16 == 0), FP32 partial over the block, acc +=. */
void qvi_pv_16(qvi_row *r, const float *s, const float *V, int nk,
               int use_f16);

/* Probability codes of one block for the 8-bit path; returns the row sum
 * that enters l and the V-Smooth restore (FP32 amplified weights for the
 * exp2 path, decoded code values for ExpCast, so Prop. 3.1 holds, and for
 * the exp2 path with sum_codes: QVA_P_SUM_CODES).  The codes are E4M3 but
 * for QVA_EXPCAST_E5M2, whose are E5M2 (qvi_e5m2_decode). */
float qvi_probs_e4m3(const float *s, float m, int nk, int expcast, int sum_codes,
                     uint8_t *pcodes, float *floor);
/* floor (NULL: the paper's code): +floormass with an E4M3 ExpCast (not
 * E5M2, not exp2).  Keys whose code is below QVI_P_NORMAL_CODE then code 0
 * and leave the returned sum; *floor receives their weight, the FP32 key-
 * order sum of the decoded codes qva_expcast_e4m3_beta(u, beta + 8 *
 * QVI_FLOOR_BINADES), times 2^-QVI_FLOOR_BINADES (0 if none). */
/* 8-bit PV: codes from qvi_probs_e4m3; partial_c = sum_k P_k V_kc (FP32,
 * key order, rounded to FP16 if fp16_partial); acc += partial * vscale;
 * mu (may be NULL): acc += rowsum * mu (VC Eq. 6).  Vlo (may be NULL): V's
 * second digit (QVA_V_E4M3X2); each key adds P_k hi_kc, then P_k lo_kc.
 * floor_mass (+floormass): the block's floor weight f joins the row sum,
 * rowsum + f, in l and in the restore; without mu, r->floor += f.
 * p_block (+pblock, QVA_P_MAX_BLOCK): the codes are taken against the
 * block's own max m_b = qvi_block_max(s, nk) instead of r->m, and with
 * w = exp2f(m_b - r->m) the row sum becomes rowsum * w (in l and the
 * restore) and acc += partial * (w * vscale); a block without keys adds
 * nothing. */
void qvi_pv_e4m3(qvi_row *r, const float *s, const uint8_t *V, const uint8_t *Vlo,
                 float vscale, const float *mu, int nk, int expcast, int sum_codes,
                 int fp16_partial, int floor_mass, int p_block);
/* The largest of s[0..nk) (-INFINITY if none; NaN is not the max). */
float qvi_block_max(const float *s, int nk);
/* PV in integers (QVA_V_INT8_PV, docs/NUMERICS.md §3): m_b = the block's
 * largest score (keys with s = -inf are out), e_k = exp2f(s_k - m_b) * 255,
 * u_k = rint(e_k) as u8 (0 below 0.5), partial_c = sum_k u_k V_kc exact in
 * int32 (V: int8 codes), w = exp2(m_b - m); the block's row sum is
 * (float)sum_k u_k * w (sum_codes: QVA_P_SUM_CODES) or (the FP32 key-order
 * sum of e_k) * w (QVA_P_SUM_FP32: keys coded 0 stay in l); l += rowsum,
 * acc += (float)partial * w, mu (may be NULL): acc += rowsum * mu.  acc
 * and l carry the factor 255 (QVI_U8_LOG2_AMP). */
void qvi_pv_u8i8(qvi_row *r, const float *s, const uint8_t *V, const float *mu, int nk,
                 int sum_codes);
/* The u8 codes of one block (qvi_pv_u8i8's) into u and the row sum they
 * add (as qvi_pv_u8i8 says for sum_codes); returns w = exp2(m_b - m), 0 if
 * the block has no key. */
float qvi_probs_u8(const float *s, float m, int nk, int sum_codes, uint8_t *u, float *rowsum);
/* 4-bit PV: p = exp2(s-m), l += sum p (FP32, before conversion), P coded
 * NVFP4 by DA2 Eq. 24 per 16 keys; V holds unscaled NVFP4 values;
 * acc += partial * vscale (+ rowsum * mu). nk is a multiple of 16. */
void qvi_pv_nvfp4(qvi_row *r, const float *s, const float *V, float vscale,
                  const float *mu, int nk);
/* Final output of a row (docs/NUMERICS.md §2, "Rows the arithmetic cannot
 * finish"), the rule of qvc_softmax_row on the GPU:
 *  - m and l finite, l > 0: out_c = acc_c * chan_scale_c / l (chan_scale
 *    may be NULL), acc_c + floor * floor_mean_c where floor_mean is set;
 *    returns the natural-log LSE (log2_amp: the amplification of l);
 *  - else, a row that retained no key (flags without QVI_ROW_RETAINED):
 *    zeros, returns -INFINITY (empty row);
 *  - else (a score overflowed FP32, a NaN reached the max or the sum):
 *    NaN, returns NaN.
 * QVI_ROW_STRICT (check_finite) also makes a row NaN that saw a NaN or
 * +inf score (r->nonfinite) although its max and sum stayed finite. */
enum { QVI_ROW_RETAINED = 1, QVI_ROW_STRICT = 2 };
float qvi_row_finish(const qvi_row *r, int flags, const float *chan_scale,
                     float log2_amp, float *out);
/* check_finite after a head's rows (n rows of d outputs; lse NULL when the
 * caller asked for none): QVA_ERR_NONFINITE naming the first row whose
 * output is not finite or whose LSE is NaN or +inf (an empty row, zeros
 * and LSE -inf, passes).  The inputs were checked finite, so the cause is
 * FP32 overflow inside the method. */
qva_status qvi_check_rows(const float *out, const float *lse, int64_t n, int d,
                          int64_t b, int64_t h);

/* ------------------------------------------------------------ backends */
qva_status qvi_cpu_attention(qva_context_t *ctx, const qva_config *cfg,
                             const qva_tensor *q, const qva_tensor *k,
                             const qva_tensor *v, const qva_tensor *out,
                             const qva_tensor *lse);
/*
 * The operands a dense quantized method (fp8, sage8, vc8, sage4, vc4)
 * quantizes, for the error decomposition (qva_error_terms_compute;
 * docs/NUMERICS.md, "Where the error comes from").  QVI_QUANT_ALL is the
 * method as qva_attention runs it, on its codes.  Any other mask runs the
 * head on an FP32 engine: an operand whose bit is off keeps the FP32 value
 * its quantizer would have seen (after permutation, K smoothing, Hadamard,
 * V demeaning), one whose bit is on is replaced by its dequantized codes;
 * P off means FP32 exp2(s - m) with FP32 row sums.  QVI_QUANT_FP32_ENGINE
 * with every other bit on is the method dequantized (tests compare it
 * with the codes).  Other methods ignore the mask.
 */
enum {
    QVI_QUANT_Q = 1,
    QVI_QUANT_K = 2,
    QVI_QUANT_P = 4,
    QVI_QUANT_V = 8,              /* for vc8/vc4: the demeaned residual   */
    QVI_QUANT_MU = 16,            /* vc8/vc4: the stored block means      */
    QVI_QUANT_ALL = 31,
    QVI_QUANT_FP32_ENGINE = 32
};
/* qvi_cpu_attention with an operand mask (the above). */
qva_status qvi_cpu_attention_masked(qva_context_t *ctx, const qva_config *cfg,
                                    const qva_tensor *q, const qva_tensor *k,
                                    const qva_tensor *v, const qva_tensor *out,
                                    const qva_tensor *lse, int mask);
/* The CPU backend on a validated call (src/qvattn.c): draft or the dense
 * methods, head dims other than 64 and 128 zero-padded; mask as
 * qvi_cpu_attention_masked (draft takes QVI_QUANT_ALL only).  The caller
 * holds ctx's lock. */
qva_status qvi_cpu_run(qva_context_t *ctx, const qva_config *cfg, const qva_tensor *q,
                       const qva_tensor *k, const qva_tensor *v, const qva_tensor *out,
                       const qva_tensor *lse, int mask);
/* For the CPU-only analysis calls (qva_error_terms_compute,
 * qva_draft_report_compute), before the generic checks: a CUDA q, k or v
 * gets a message that names `func` rather than "the context". */
qva_status qvi_check_on_cpu(const qva_tensor *q, const qva_tensor *k, const qva_tensor *v,
                            const char *func);
/* DraftAttention2 on the CPU (src/cpu/draft.c). */
qva_status qvi_cpu_draft(qva_context_t *ctx, const qva_config *cfg,
                         const qva_tensor *q, const qva_tensor *k,
                         const qva_tensor *v, const qva_tensor *out,
                         const qva_tensor *lse);
/* kv_group: query heads per K/V head (1 without grouped K/V). */
int qvi_cuda_supports(const qva_config *cfg, qva_dtype dt, int64_t d, int64_t kv_group,
                      char *why, size_t len);
qva_status qvi_cuda_attention(qva_context_t *ctx, const qva_config *cfg,
                              const qva_tensor *q, const qva_tensor *k,
                              const qva_tensor *v, const qva_tensor *out,
                              const qva_tensor *lse);
/* For tests: what a CUDA context carries for `layer` (which 0: +kprev's K
 * means, 1: +vprev's V scales), [BH][D] per query head (B*H heads), and
 * their validity [BH], copied to the host (QVA_ERR_INVALID_ARGUMENT where
 * the layer holds none of that shape). */
qva_status qvi_cuda_layer_carried(qva_context_t *ctx, int layer, int BH, int D, int which,
                                  float *vals, int *valid);

#ifdef __cplusplus
}
#endif
#endif
