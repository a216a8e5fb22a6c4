/*
 * qvattn — 8-bit, sparse and mixed-precision attention for video diffusion
 * transformers.  The one public header.
 *
 * Conventions
 *  - Every function that can fail returns a qva_status; qva_status_string()
 *    names it and qva_last_error() gives the message of the last failure on
 *    the calling thread.  The library never exits or aborts on user input.
 *  - Tensors are rank-4 [B, H, N, D] descriptors with element strides, so
 *    [B,H,N,D] ("HND") and [B,N,H,D] ("NHD") memory both work without copies.
 *  - k and v may have fewer heads than q (grouped-query / multi-query
 *    attention, see qva_attention) and the head dim D is any of 1..128
 *    (64 and 128 natively; see QVA_MAX_HEAD_DIM).
 *  - Attention is non-causal softmax(Q K^T * sm_scale) V.
 *  - Threads: every function may be called from any thread.  See
 *    "Threads" at qva_context_t for what may run at the same time.
 */
#ifndef QVATTN_H
#define QVATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QVA_VERSION_MAJOR 0
#define QVA_VERSION_MINOR 1
#define QVA_VERSION_PATCH 0
/* The version as one number, as qva_version() returns it: 10000 * MAJOR +
 * 100 * MINOR + PATCH. */
#define QVA_VERSION (QVA_VERSION_MAJOR * 10000 + QVA_VERSION_MINOR * 100 + QVA_VERSION_PATCH)

/* The shared library is built with hidden visibility: it exports the
 * functions declared in this header and nothing else. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* QVA_VERSION of the library linked at run time (the header's may differ). */
int qva_version(void);

/* ------------------------------------------------------------------ status */
typedef enum qva_status {
    QVA_OK = 0,
    QVA_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, bad enum, bad config value */
    QVA_ERR_SHAPE = 2,            /* shapes or strides inconsistent           */
    QVA_ERR_DTYPE = 3,            /* dtype not supported here                 */
    QVA_ERR_UNSUPPORTED = 4,      /* valid request this backend cannot run    */
    QVA_ERR_OUT_OF_MEMORY = 5,
    QVA_ERR_NONFINITE = 6,        /* NaN or Inf found in an input             */
    QVA_ERR_DEVICE = 7,           /* CUDA runtime error                       */
    QVA_ERR_PARSE = 8,            /* a method string or file could not parse  */
    QVA_ERR_IO = 9
} qva_status;

const char *qva_status_string(qva_status s);
/* Message of the last error raised on this thread ("" if none). */
const char *qva_last_error(void);

/* ------------------------------------------------------------------ tensors */
typedef enum qva_dtype { QVA_F32 = 0, QVA_BF16 = 1, QVA_F16 = 2 } qva_dtype;
typedef enum qva_device { QVA_DEVICE_CPU = 0, QVA_DEVICE_CUDA = 1 } qva_device;

/* shape = {B, H, N, D}; stride[i] is the element step along shape[i].
 * qva_attention accepts a descriptor when every shape[i] is in [1, 2^30],
 * every stride is >= 0, stride[3] == 1, and both its element count times
 * the dtype size and the bytes its strides span ((sum (shape[i]-1) *
 * stride[i] + 1) * dtype size) are at most QVA_MAX_TENSOR_BYTES; all of
 * it is computed with overflow checks (QVA_ERR_SHAPE otherwise). */
#define QVA_MAX_TENSOR_BYTES ((int64_t)1 << 48)
typedef struct qva_tensor {
    void *data;
    qva_dtype dtype;
    qva_device device;
    int64_t shape[4];
    int64_t stride[4];
} qva_tensor;

/* A contiguous descriptor for memory laid out [B,H,N,D] (layout "HND").
 * A stride whose product overflows int64 saturates to INT64_MAX, so such a
 * descriptor is refused by qva_attention (QVA_ERR_SHAPE), never wrapped. */
qva_tensor qva_tensor_hnd(void *data, qva_dtype dt, qva_device dev,
                          int64_t B, int64_t H, int64_t N, int64_t D);
/* A contiguous descriptor for memory laid out [B,N,H,D] (layout "NHD"). */
qva_tensor qva_tensor_nhd(void *data, qva_dtype dt, qva_device dev,
                          int64_t B, int64_t H, int64_t N, int64_t D);
size_t qva_dtype_size(qva_dtype dt);

/* ------------------------------------------------------------------ methods */
typedef enum qva_method {
    QVA_METHOD_EXACT = 0, /* FP64 softmax attention: the ground truth          */
    QVA_METHOD_BF16,      /* BF16 operands, FP32 online softmax (FA-class)     */
    QVA_METHOD_FP8,       /* E4M3 QK and PV, per-block scales, no smoothing    */
    QVA_METHOD_SAGE8,     /* INT8 QK (K smoothed) + E4M3 PV (SageAttention2)   */
    QVA_METHOD_VC8,       /* SAGE8 + V-Smooth (VC-Attention §3.2)              */
    QVA_METHOD_SAGE4,     /* NVFP4 QK and PV, K smoothed (SageAttention3-class)*/
    QVA_METHOD_VC4,       /* SAGE4 + V-Smooth                                  */
    QVA_METHOD_DRAFT,     /* DraftAttention2 sparse mixed precision            */
    QVA_METHOD_COUNT_
} qva_method;

/* cfg.expcast: the P code of the 8-bit methods (docs/NUMERICS.md §3, §7). */
typedef enum qva_expcast_mode {
    QVA_EXPCAST_OFF = 0,     /* exp2 then cast to E4M3 (DA2 C.3)             */
    QVA_EXPCAST_PAPER = 1,   /* VC Eq. 7, beta = -0.35 ("+expcast")          */
    QVA_EXPCAST_CENTRED = 2, /* Eq. 7 with beta = -0.45, which centres the
                                decoded/exact ratio on 1 ("+expcast-centred") */
    QVA_EXPCAST_E5M2 = 3     /* our extension: Eq. 7's one-FMA code in E5M2,
                                4 codes per binade, row max 2^15, beta -0.22
                                centred; no tail below 2^-14.94 lost
                                ("+expcast-e5m2"; CUDA: sage8/vc8, head dim
                                128, one V code) */
} qva_expcast_mode;

/* cfg.p_sum: the row sum l of the exp2 P path (expcast off; docs/NUMERICS.md
 * §3, "The row sum of an exp2 P"), E4M3 codes or +i8pv's u8 codes.  ExpCast
 * always sums its decoded codes.  The names sage8 and vc8 set CODES. */
typedef enum qva_p_sum {
    QVA_P_SUM_FP32 = 0, /* FP32 sum of exp2 before the E4M3 cast (DA2 C.3,
                           SageAttention2): the default                   */
    QVA_P_SUM_CODES = 1 /* sum of the decoded E4M3 codes ("+codesum"): the
                           normalizer of the weights the numerator uses, so
                           O is a convex combination of V's rows; more
                           faithful where V has a large mean; the CUDA
                           kernels take it from the PV product            */
} qva_p_sum;

/* cfg.v_code: how the 8-bit PV codes V (sage8, vc8; docs/NUMERICS.md §3,
 * "V in two E4M3 digits"). */
typedef enum qva_v_code {
    QVA_V_E4M3 = 0,  /* one E4M3 code per value, per-channel scale (the
                        papers, SageAttention2): the default              */
    QVA_V_E4M3X2 = 1, /* "+v2": a second E4M3 code for the first one's
                        residual, same scale; the PV product runs twice
                        (hi and lo) on the same P codes, and V's share of
                        the error nearly vanishes (CUDA: head dim 128,
                        about 16-19% slower than one digit)               */
    QVA_V_INT8_PV = 2 /* "+i8pv": the PV product in integers: V in INT8
                        with one scale per channel (amax/127), P as
                        unsigned 8-bit codes round(255 exp2(s - m_b)) of
                        each key block's own row max m_b, exact integer
                        sums, the block's weight exp2(m_b - m) applied to
                        its partial; l sums the codes (p_sum CODES) or
                        the weights before rounding (p_sum FP32,
                        "+fp32sum": keys coded 0 stay in l; CPU only so
                        far).  About half the PV product's error of the
                        E4M3 forms (docs/NUMERICS.md §3, "The PV product
                        in integers").  CUDA: head dim 128; not with
                        ExpCast, whose codes are E4M3                     */
} qva_v_code;

/* cfg.p_floor: the keys ExpCast's E4M3 code cannot weigh (sage8, vc8 with
 * +expcast or +expcast-centred; docs/NUMERICS.md §3, "ExpCast's floor mass
 * put back").  Codes below 8 are E4M3's zero and subnormals: weights under
 * 2^-14.94 of the row max drop, those up to 2^-14 come out up to 4.4x too
 * small.  At 2K tokens that is 0.1% of a row; at Wan2.2-720p's 75,600 it
 * is 2.6%, and all of it sharpens the row. */
typedef enum qva_p_floor {
    QVA_P_FLOOR_DROP = 0, /* those keys are out of numerator and row sum
                             (VC Eq. 7, as the paper): the default        */
    QVA_P_FLOOR_MEAN = 1  /* "+floormass": their weights, from ExpCast's
                             code of the same score 12 binades up (one more
                             FMA per score, x 2^-12), stay in the row sum,
                             and their values are taken as a mean of V: the
                             block's mean where V-Smooth demeans (the
                             restore's row sum carries them), else the
                             head's.  CPU reference only so far           */
} qva_p_floor;

/* cfg.p_max: the max that the 8-bit P codes of sage8, vc8 and draft's INT8
 * phase are taken against (E4M3 V; docs/NUMERICS.md §3, "P coded against
 * each block's max").  Codes start at the top of the format and fall to its floor (and
 * ExpCast's subnormal codes) 15-18 binades lower; against the running row
 * max, a row over 75,600 keys has much of its mass that low. */
typedef enum qva_p_max {
    QVA_P_MAX_ROW = 0,  /* the running row max (the papers): the default  */
    QVA_P_MAX_BLOCK = 1 /* "+pblock": each key block's own row max m_b;
                           the block's partial and row sum are then scaled
                           by w = exp2(m_b - m) in FP32, as +i8pv does.
                           CUDA: one E4M3 digit of V, E4M3 P codes (not
                           +expcast-e5m2), head dim 64 and 128; draft:
                           CPU reference only                             */
} qva_p_max;

/* cfg.skip_fill: what a draft call's skipped video-region pairs add to
 * each row (extension; docs/DRAFT.md, "The skipped pairs, pooled"). */
typedef enum qva_skip_fill {
    QVA_SKIP_DROP = 0,  /* nothing (DraftAttention2): the default           */
    QVA_SKIP_POOLED = 1 /* "+pooled": each skipped pair (a, b) enters the
                           rows of a as count_b keys at region b's mean key
                           (the router's pooled average) with region b's
                           mean value, in the same online softmax (on
                           CUDA an unfused pass merged through the LSE:
                           docs/DRAFT.md, "The skipped pairs, pooled")    */
} qva_skip_fill;

/* Scale granularity of the INT8 query codes (sage8, vc8 and draft's INT8
 * phase; docs/NUMERICS.md, "Query scales").  The papers give one scale per
 * 128-row block; one per row is more faithful (the query quantizer was the
 * largest error term) and costs the kernels nothing. */
typedef enum qva_q_granularity {
    QVA_Q_PER_ROW = 0,  /* one INT8 scale per query row (the default)      */
    QVA_Q_PER_BLOCK = 1 /* one per 128 rows, as the papers ("+qblock")    */
} qva_q_granularity;

/* cfg.k_mean: the vector K smoothing subtracts (sage8, vc8; docs/NUMERICS.md
 * §3, "K's mean from the previous call").  Any vector keeps attention
 * exact (each row's scores move by one constant, which the softmax
 * ignores and the returned LSE adds back); only the INT8 code error of
 * K - mean depends on it. */
typedef enum qva_k_mean {
    QVA_K_MEAN_CALL = 0,    /* this call's channel mean (SageAttention, the
                               papers): the default                        */
    QVA_K_MEAN_PREVIOUS = 1, /* "+kprev": the mean this layer's previous call
                               left (cfg.layer's state; this call's own on
                               a layer's first call and on stateless calls),
                               so the preparation need not read K once for
                               its mean before coding it.  CUDA: bf16/f16
                               with 16-byte aligned rows                   */
    QVA_K_MEAN_SAMPLE = 2   /* "+ksample": the channel mean of this call's
                               QVA_STAT_SAMPLE sampled keys (QVA_STAT_ROW),
                               stateless; the preparation reads K once     */
} qva_k_mean;

/* cfg.v_scale: V's per-channel E4M3 scale (sage8, vc8 with one E4M3 digit;
 * docs/NUMERICS.md §3, "V's scale from the previous call"). */
typedef enum qva_v_scale {
    QVA_V_SCALE_CALL = 0,    /* this call's: amax / 2.25 (the default)       */
    QVA_V_SCALE_PREVIOUS = 1, /* "+vprev": on calls without V-Smooth's
                                demeaning, the scales this layer's previous
                                call made, where they serve this call (every
                                code within E4M3's +-448; else the head's
                                own), so the preparation need not read V for
                                its amax before coding it.  CUDA: bf16/f16
                                V with 16-byte aligned rows                */
    QVA_V_SCALE_SAMPLE = 2   /* "+vsample": as +vprev, with the scales of
                                this call's QVA_STAT_SAMPLE sampled values
                                (amax / 2.25 over QVA_STAT_ROW's rows)
                                instead of the previous call's: stateless;
                                on demeaning steps the residual's scales
                                from QVA_STAT_BLOCK's blocks, by the same
                                rule (and mean / scale <= 32768);
                                also draft's INT8 phase (its packed video
                                rows sampled; CUDA: bf16/f16)              */
} qva_v_scale;

/* +ksample and +vsample take their statistics over n' = QVA_STAT_COUNT(n)
 * = min(n, QVA_STAT_SAMPLE) of a head's n tokens in the caller's token
 * order, token QVA_STAT_ROW(i, n) for i = 0 .. n' - 1: spread evenly over
 * the sequence, so every frame of a video is sampled.  Any K mean keeps
 * attention exact, and a V scale from fewer values is at most the call's
 * own (where a code would pass E4M3's range the head's own scales serve),
 * so only where the codes sit changes (docs/NUMERICS.md §3, "Statistics
 * from a sample"). */
#define QVA_STAT_SAMPLE 1024
#define QVA_STAT_CHUNK 64 /* +ksample's mean: FP64 sums of 64 sampled rows each, then their sum */
#define QVA_STAT_COUNT(n) ((int64_t)(n) < QVA_STAT_SAMPLE ? (int64_t)(n) : (int64_t)QVA_STAT_SAMPLE)
#define QVA_STAT_ROW(i, n) ((int64_t)(i) * (int64_t)(n) / QVA_STAT_COUNT(n))
/* +vsample on a V-Smooth demeaning step: the residual's scales from
 * QVA_STAT_BLOCKS(nblk) = min(nblk, QVA_STAT_SAMPLE / 128) of the
 * permuted V's nblk key blocks of 128, block QVA_STAT_BLOCK(i, nblk) for
 * i = 0 .. QVA_STAT_BLOCKS(nblk) - 1 (whole blocks: each one's mean is
 * the block's own). */
#define QVA_STAT_BLOCKS(nblk) ((int64_t)(nblk) < QVA_STAT_SAMPLE / 128 ? (int64_t)(nblk) : (int64_t)(QVA_STAT_SAMPLE / 128))
#define QVA_STAT_BLOCK(i, nblk) ((int64_t)(i) * (int64_t)(nblk) / QVA_STAT_BLOCKS(nblk))

/* V-Smooth schedule (VC §3.4, Appendix A). */
typedef enum qva_schedule {
    QVA_SCHEDULE_PAPER = 0,  /* group on steps < ceil(n/4), refresh every 4 */
    QVA_SCHEDULE_ALWAYS = 1, /* recompute the permutation on every call     */
    QVA_SCHEDULE_DEMEAN = 2  /* extension: the paper's grouping steps, and
                                every later step demeans with the stored
                                permutation (reuse) instead of running
                                plain: docs/NUMERICS.md §4                  */
} qva_schedule;

typedef struct qva_vsmooth_params {
    int clusters;      /* k of the k-means over value tokens              */
    int iters;         /* Lloyd iterations per grouping                   */
    int warm_start;    /* start from the layer's stored centroids         */
    int block;         /* B_v; must be 128                                */
    qva_schedule schedule;
    int refresh_every; /* steps between permutation refreshes (paper: 4),
                          >= 1                                           */
} qva_vsmooth_params;
/* Limits of vsmooth.clusters and vsmooth.iters, for qva_attention and
 * qva_vsmooth_permutation alike. */
#define QVA_VSMOOTH_MAX_CLUSTERS 4096
#define QVA_VSMOOTH_MAX_ITERS 1000

/* How a draft call decides how many region pairs each head keeps
 * (docs/DRAFT.md, "Adaptive budget"). */
typedef enum qva_draft_budget {
    QVA_DRAFT_BUDGET_QUOTA = 0, /* DA2: the fixed fractions, the same per head */
    QVA_DRAFT_BUDGET_MASS = 1   /* per head: the top pairs holding `mass` of
                                   the draft map, within [min_keep, max_keep],
                                   split 4/8/16 by frac4/frac8/frac16       */
} qva_draft_budget;

/* draft.int8_acc: the format each INT8 block's PV partial is summed in
 * before it joins the row's FP32 output state (docs/DRAFT.md §4). */
typedef enum qva_draft_int8_acc {
    QVA_DRAFT_ACC_FP32 = 0, /* FP32, as draft's 16-bit phase and the dense
                               8-bit methods: the default                   */
    QVA_DRAFT_ACC_FP16 = 1  /* DA2 Table 6's FP16 ("+fp16acc"), saturating at
                               +-65504: a block whose partial passes that
                               (near-uniform rows over large V codes) is
                               clipped, as the paper's form would overflow */
} qva_draft_int8_acc;

typedef struct qva_draft_params {
    float lambda;          /* max-pool weight of Eq. 2 (paper: 0.2)           */
    float frac_skip;       /* fractions of video-region pairs; sum to 1      */
    float frac4, frac8, frac16; /* (MASS: frac_skip = 0 and these split the
                                   kept pairs)                               */
    int grid_t, grid_h, grid_w; /* latent video grid; T*H*W video tokens     */
    int prefix_tokens;     /* text/prefix tokens outside the grid            */
    int prefix_at_end;     /* 0: prefix first in the sequence; 1: last       */
    int capacity;          /* region capacity C == attention block (128)     */
    int dense_warmup_steps;/* steps < this run dense 16-bit attention        */
    int budget;            /* qva_draft_budget (default QUOTA)               */
    float mass;            /* MASS: share in (0, 1] of each head's draft-map
                              mass the kept pairs must reach (default 0.95) */
    float min_keep;        /* MASS: floor on the kept share of the R^2 pairs,
                              in [0, max_keep] (default 0.05)               */
    float max_keep;        /* MASS: cap on it, in [min_keep, 1] (default 1) */
    qva_method warmup_method; /* the method of the dense warm-up steps:
                              QVA_METHOD_BF16 (the default: DA2's dense
                              16-bit step) or another dense method (exact,
                              fp8, sage8, vc8, sage4, vc4), which the step
                              then runs as, with the call's expcast (if
                              8-bit), q_granularity (if INT8 Q) and vsmooth
                              options (docs/DRAFT.md, "Warm-up on a dense
                              8-bit method")                             */
    int int8_acc;          /* qva_draft_int8_acc of the INT8 phase's PV
                              partials (default FP32)                      */
} qva_draft_params;

/* Kept share of the last draft call on a context: per (batch, head), the
 * video-region pairs it kept at 4, 8 or 16 bits over R^2.  Under the QUOTA
 * budget every head keeps the same share; under MASS it varies. */
typedef struct qva_draft_stats {
    int64_t heads;     /* heads routed; 0 when the last call routed none (not
                          draft, a dense warm-up step, a failed call).  On
                          CUDA the first read after a MASS call waits for
                          that call's router (its per-head counts are on
                          the device)                                      */
    int64_t pairs;     /* R^2 video-region pairs per head                   */
    double kept_mean;  /* mean over the heads of kept pairs / R^2           */
    double kept_min, kept_max;
} qva_draft_stats;
/* The stats of the last qva_attention call on ctx (a qva_context_t). */
struct qva_context;
qva_status qva_context_last_draft_stats(const struct qva_context *ctx,
                                        qva_draft_stats *stats);

typedef struct qva_config {
    qva_method method;
    float sm_scale;        /* 0 selects 1/sqrt(D)                           */
    int hadamard;          /* rotate Q and K by a Hadamard matrix first     */
    int hadamard_signs;    /* ... with seeded random signs (randomized)     */
    uint64_t hadamard_seed;
    int expcast;           /* qva_expcast_mode of the 8-bit P (and draft's) */
    int q_granularity;     /* qva_q_granularity of INT8 Q (sage8, vc8, draft) */
    int p_sum;             /* qva_p_sum of the exp2 P path (fp8, sage8, vc8) */
    int v_code;            /* qva_v_code of the 8-bit V (sage8, vc8)        */
    qva_vsmooth_params vsmooth;
    qva_draft_params draft;
    int layer;             /* layer id: keys the per-layer state, or
                            * QVA_LAYER_NONE: a stateless call (below)     */
    int step;              /* denoising step index, 0-based                 */
    int num_steps;         /* steps in the schedule; <= 0: unknown          */
    int check_finite;      /* CPU: NaN/Inf inputs, and outputs or LSE that
                            * overflow FP32, are QVA_ERR_NONFINITE (see
                            * qva_attention); no effect on CUDA          */
    int k_mean;            /* qva_k_mean of K smoothing (sage8, vc8)        */
    int v_scale;           /* qva_v_scale of V's E4M3 scale (sage8, vc8)    */
    int p_floor;           /* qva_p_floor of ExpCast's E4M3 P (sage8, vc8)  */
    int p_max;             /* qva_p_max of the E4M3 P codes (sage8, vc8,
                            * draft's INT8 phase)                         */
    int skip_fill;         /* qva_skip_fill of draft's skipped pairs       */
} qva_config;

/* cfg->layer = QVA_LAYER_NONE makes a call stateless: its output is a
 * function of its inputs and config alone.  V-Smooth then groups on every
 * call from a cold start (as schedule ALWAYS with warm_start 0), whatever
 * step, num_steps, vsmooth.schedule and vsmooth.warm_start say; what the
 * call stores under this key is scratch, always recomputed before it is
 * read, so no later call (of this or any layer) depends on it.  Other
 * layer ids (>= 0 by convention) key the state the schedule reuses. */
#define QVA_LAYER_NONE (-1)

/* Fills the paper defaults (method = VC8 with ExpCast, lambda 0.2, C 128...) */
void qva_config_default(qva_config *cfg);
/*
 * Parses a method name into cfg (other fields untouched):
 *   exact | bf16 | fp8 | sage8 | vc8 | sage4 | vc4 | draft@S0/S4/S8/S16
 *   | draft@pM | draft@pM/S4/S8/S16
 * optionally followed by "+expcast" (8-bit methods and draft), or instead
 * "+expcast-centred" (cfg->expcast = QVA_EXPCAST_CENTRED), "+hadamard"
 * (quantized methods) and "+qblock" (sage8, vc8, draft: the papers' one INT8
 * query scale per 128 rows instead of one per row) and "+codesum" (fp8,
 * sage8, vc8 without +expcast: cfg->p_sum = QVA_P_SUM_CODES) and "+v2"
 * (sage8, vc8: cfg->v_code = QVA_V_E4M3X2) and "+fp16acc" (draft:
 * cfg->draft.int8_acc = QVA_DRAFT_ACC_FP16) and "+kprev" (sage8, vc8:
 * cfg->k_mean = QVA_K_MEAN_PREVIOUS) and "+vprev" (sage8, vc8 with one E4M3
 * digit of V: cfg->v_scale = QVA_V_SCALE_PREVIOUS) and "+floormass" (sage8,
 * vc8 with an E4M3 ExpCast: cfg->p_floor = QVA_P_FLOOR_MEAN) and "+pblock"
 * (sage8, vc8 with E4M3 P codes, draft: cfg->p_max = QVA_P_MAX_BLOCK) and
 * "+pooled" (draft: cfg->skip_fill = QVA_SKIP_POOLED), each setting
 * at most once.
 * The name sets every one of these fields: to the option given, else to
 * the method's default, which is zero except for sage8 and vc8: both
 * rotate (hadamard = 1) and, without ExpCast, sum P's codes (p_sum =
 * QVA_P_SUM_CODES); "+nohadamard" and "+fp32sum" turn those off
 * ("sage8+nohadamard+fp32sum+qblock" is the papers' form,
 * "vc8+nohadamard+expcast+qblock" the VC paper's method).  A config whose
 * fields are set by hand keeps them (qva_config_method_name names them).
 * Strict: no blanks, case folding or trailing text;
 * each quota S is a plain decimal percentage in [0,100] (digits, an
 * optional fraction and exponent: "85", "7.5"; no sign, blank or hex) and
 * the four sum to 100.  draft@pM selects the MASS budget (draft.budget):
 * each head keeps its top region pairs until they hold M percent of its
 * draft-map mass (M in (0,100], the same plain decimals; "draft@p95" is
 * 95%, "draft@p0.95" under 1%), all at 16 bits, or split by S4/S8/S16
 * (summing to 100: frac_skip becomes 0); draft.min_keep and draft.max_keep
 * bound the kept share.  QVA_ERR_PARSE with a message naming the problem,
 * cfg untouched, otherwise.
 */
qva_status qva_config_set_method(qva_config *cfg, const char *name);
/* Writes the canonical method name of cfg into buf. */
qva_status qva_config_method_name(const qva_config *cfg, char *buf, size_t len);

/* ------------------------------------------------------------------ context */
/*
 * A context holds a device's mutable state: the V-Smooth permutations and
 * centroids of each (layer, batch, K/V head), the draft partition cache, the
 * CUDA workspace, the stream, the profiling flag and the last timings.
 *
 * Threads
 *  - Separate contexts are independent: threads may use different
 *    contexts at the same time with no lock shared between them.
 *  - One context may be shared by several host threads.  Its calls
 *    (qva_attention, qva_context_reset, qva_context_set_stream,
 *    qva_context_set_profiling, qva_context_last_timings) are serialized
 *    by a per-context lock held for the whole call, so every state change
 *    (V-Smooth state of a layer, the partition cache, the workspace, the
 *    timings, the stream, the flag) is made under it and two calls never
 *    interleave.  Calls on one context therefore do not run in parallel;
 *    use one context per thread (or per stream) for parallel work.
 *  - Shared state is keyed by cfg->layer: threads that share a context and
 *    must not see each other's V-Smooth state use different layer ids
 *    (or QVA_LAYER_NONE, whose calls see none).
 *    Calls to one layer from several threads run in the order the lock
 *    is taken, which the caller must fix if the step sequence matters.
 *    qva_context_last_timings returns the last call's timings, whichever
 *    thread made it; a reset from one thread drops the state of all.
 *  - qva_last_error() is per thread: it reports the calling thread's
 *    last failure only.
 *  - Not safe: qva_context_free while another thread uses (or may still
 *    enter) the context; it must be the context's last call.  Tensors are
 *    the caller's: two calls writing the same out (or one writing what
 *    another reads) at the same time race, context shared or not.
 *  - On CUDA the lock covers the host side of a call; the kernels it
 *    launched run on after it returns, ordered by the context's stream.
 *    Threads sharing a CUDA context keep that one stream (see
 *    qva_context_set_stream) and synchronize before switching it.
 *  - A CUDA context works on the calling thread's current device
 *    (cudaSetDevice) with buffers it allocated there: every thread that
 *    uses it must have that device current.
 *  - The CPU backend parallelises inside a call with OpenMP when built
 *    with it; the lock is taken around the call, outside those regions.
 *  - Everything else (configs, codecs, metrics, synthetic data,
 *    qva_vsmooth_permutation, qva_supports, qva_supports_heads,
 *    qva_draft_step_check) keeps no state and may run concurrently
 *    without restriction, on arguments that no other thread writes
 *    meanwhile.
 */
typedef struct qva_context qva_context_t;

qva_status qva_context_create(qva_context_t **ctx, qva_device device);
void qva_context_free(qva_context_t *ctx);
/* Sets the CUDA stream (cudaStream_t) launches go to; NULL = default.
 * A context reuses its device buffers from call to call, so its calls
 * must be ordered: keep one stream per context (or synchronize before
 * switching), and use one context per concurrently running stream.  The
 * draft method forks its operand preparation onto an internal stream of
 * the context and joins it back with events before its kernel, so the
 * call stays ordered on this stream.
 * CUDA graphs: a call can be captured on this stream once the context has
 * run an eager call of the same shapes, method and Hadamard signs: the
 * first call of a new shape allocates device buffers and the first use of
 * a sign set copies it synchronously, and neither is allowed while a
 * stream captures (such a call returns QVA_ERR_DEVICE).  Replays then
 * reuse the buffers (measured on the H200: every method and V-Smooth
 * action replays bit-identically to eager calls, bench/RESULTS.md). */
qva_status qva_context_set_stream(qva_context_t *ctx, void *cuda_stream);
/* Drops all per-layer state (permutations, centroids, partitions). */
qva_status qva_context_reset(qva_context_t *ctx);

/* Phase timings of the last qva_attention call on a CUDA context made
 * with profiling on, for benchmarks (zeros if that call failed).
 * Profiling records CUDA events around each phase; the call does not wait
 * for them, qva_context_last_timings does (it synchronizes with the last
 * profiled call's end), so back-to-back profiled calls run as unprofiled
 * ones do.  Leave it off in production.  On the CPU the phases are not
 * separated (kernel_ms holds the whole call). */
typedef struct qva_timings {
    float grouping_ms; /* k-means + argsort (0 on a non-grouping step) */
    float prep_ms;     /* fused gather / smoothing / quantization      */
    float kernel_ms;   /* the attention kernel alone                   */
} qva_timings;
qva_status qva_context_set_profiling(qva_context_t *ctx, int on);
qva_status qva_context_last_timings(const qva_context_t *ctx, qva_timings *t);

/* Largest head dim qva_attention takes.  64 and 128 run natively; the CPU
 * backend runs any other D <= 128 exactly by zero padding (qva_attention);
 * the CUDA kernels take 64 and 128 only (pad in the caller, see
 * qva_supports' reason). */
#define QVA_MAX_HEAD_DIM 128

/* Capability query: can `device` run this config at this shape/dtype?
 * (q, k and v with the same number of heads: qva_supports_heads(...,
 * 1, 1, ...).)  1 or 0; why (may be NULL) receives the reason. */
int qva_supports(qva_device device, const qva_config *cfg, qva_dtype dtype,
                 int64_t head_dim, char *why, size_t why_len);
/* qva_supports for a call whose q has `heads` heads and k, v `kv_heads`
 * heads (grouped-query attention when kv_heads < heads; heads must be a
 * multiple of kv_heads, both >= 1).  Both backends run grouped K/V for
 * every method they run at kv_heads == heads. */
int qva_supports_heads(qva_device device, const qva_config *cfg, qva_dtype dtype,
                       int64_t head_dim, int64_t heads, int64_t kv_heads,
                       char *why, size_t why_len);
/* A draft config's checks for a sequence of n_tokens tokens of head dim
 * head_dim (grid, prefix, capacity, lambda, fractions: the errors
 * qva_attention would give), and whether the call at cfg->step is a dense
 * warm-up step that the library computes exactly as the bf16 method
 * (draft.warmup_method QVA_METHOD_BF16): *dense_warmup is 1 only then.  A
 * warm-up step with another warmup_method gives 0: it runs as that method
 * and only qva_attention computes it.  For callers that compute bf16
 * warm-up steps elsewhere (the PyTorch layer runs them through torch SDPA). */
qva_status qva_draft_step_check(const qva_config *cfg, int64_t n_tokens, int64_t head_dim,
                                int *dense_warmup);
/* The checks qva_attention makes on a call before it computes: the config
 * (step inside the schedule, sm_scale, method options), the descriptors on
 * `device` and their agreement, self-attention for vc8, vc4 and draft, the
 * lse descriptor and, with cfg->check_finite, the NaN/Inf scan of CPU
 * inputs.  out and lse may be NULL (not checked).  Returns the status (and
 * qva_last_error() message) qva_attention gives for these; the draft plan's
 * own checks are qva_draft_step_check's.  For callers that compute a call
 * elsewhere (the PyTorch layer's draft warm-up steps on torch SDPA). */
qva_status qva_attention_check(qva_device device, const qva_config *cfg,
                               const qva_tensor *q, const qva_tensor *k,
                               const qva_tensor *v, const qva_tensor *out,
                               const qva_tensor *lse);
/* 1 if the library was built with CUDA and a device is present. */
int qva_cuda_available(void);
/* Device memory helpers, so C callers need no CUDA headers.  Without CUDA
 * they return QVA_ERR_UNSUPPORTED, except qva_device_free(NULL), which
 * like free(NULL) does nothing and returns QVA_OK on every build. */
qva_status qva_device_malloc(void **ptr, size_t bytes);
qva_status qva_device_free(void *ptr);
qva_status qva_memcpy_to_device(void *dst, const void *src, size_t bytes);
qva_status qva_memcpy_to_host(void *dst, const void *src, size_t bytes);
qva_status qva_device_synchronize(void);

/*
 * The attention call.  q,k,v,out: [B,H,N,D] descriptors on the context's
 * device; out may have its own dtype and strides.  k and v may have
 * H_kv heads where H % H_kv == 0 (grouped-query attention; H_kv = 1 is
 * multi-query): query head h reads K/V head h / (H / H_kv), with no copy.
 * Methods with V-Smooth keep its state (permutation, centroids) per
 * (layer, batch, K/V head): the permutation orders the value tokens, which
 * the query heads of a group share.  Both backends run every method on
 * grouped K/V (CUDA prepares each query head's quantized operands from its
 * K/V head: the attention kernels are those of H = H_kv).
 * Head dims: D in [1, QVA_MAX_HEAD_DIM].  64 and 128 run as they are; on
 * the CPU any other D runs as the call with Q, K and V zero-padded to 64
 * (D < 64) or 128 channels, sm_scale 0 meaning 1/sqrt(D) of the original
 * D, and the padded output columns dropped: zero channels leave every
 * score, scale and quantizer of the methods unchanged (the +hadamard
 * rotation then runs over the padded width, which keeps q.k).  The CPU
 * pads by copying the inputs.  The CUDA backend takes 64 and 128 only.
 * lse (may be NULL): f32
 * [B,H,N,1]-shaped descriptor receiving the natural-log sum-exp of the
 * scaled scores q.k * sm_scale over the keys the method retained (for the
 * K-smoothed methods the smoothing shift is added back, on every backend,
 * so it is the LSE of the original scores).
 *
 * Rows that cannot be computed are never quiet zeros (docs/NUMERICS.md §2,
 * "Rows the arithmetic cannot finish"); every backend, every method:
 *  - a row that retained no key (only draft: every block of its region
 *    skipped and no prefix) is written as zeros with LSE -inf;
 *  - a row whose running max or row sum is not finite and positive — a
 *    score q.k * sm_scale overflowed FP32 (|q|, |k| near 1e19 in the
 *    16-bit and 8-bit methods), or a NaN input reached it with
 *    check_finite = 0 — is written as NaN with LSE NaN.  Every other row
 *    takes the method's usual arithmetic, unchanged bit for bit.
 * With cfg->check_finite (CPU only; the default) the call returns
 * QVA_ERR_NONFINITE instead, naming the row, when an input holds NaN/Inf or
 * an output (or a requested LSE) is not finite, the -inf LSE of an empty
 * row aside; out and lse are then left unwritten for that (b, h) and
 * later ones.  `exact` computes in FP64, so finite inputs give finite
 * outputs; only its LSE can overflow FP32 (+inf).  With check_finite = 0
 * (and on CUDA, which does not scan), a NaN or Inf input gives NaN rows in
 * exact and bf16; in the quantized methods what it gives depends on the
 * quantizer (an INT8 code of NaN is 0), so scan inputs you do not trust.
 *
 * Aliasing: q, k and v are only read and may share memory (e.g. views of
 * one fused QKV buffer).  out and lse are written: the byte range of each
 * (from data to the end of its last element, see qva_tensor) must not
 * intersect that of q, k, v or of the other one, and neither may overlap
 * itself (a zero or too-short stride along a dimension of size > 1).  Even
 * exact aliasing (out == q) is refused: there is no in-place attention,
 * since a failing call could leave an input half overwritten.  Interleaved
 * layouts whose ranges intersect are refused even when no element is
 * shared.  Violations are QVA_ERR_INVALID_ARGUMENT (overlap with another
 * tensor) or QVA_ERR_SHAPE (an output overlapping itself).
 */
qva_status qva_attention(qva_context_t *ctx, const qva_config *cfg,
                         const qva_tensor *q, const qva_tensor *k,
                         const qva_tensor *v, const qva_tensor *out,
                         const qva_tensor *lse);

/* What the schedule does at (step, num_steps) for a V-Smooth method. */
typedef enum qva_step_action {
    QVA_STEP_GROUP = 0,   /* recompute the permutation (k-means), demean  */
    QVA_STEP_REUSE = 1,   /* reuse the stored permutation, demean         */
    QVA_STEP_PLAIN = 2    /* stored permutation, no demeaning             */
} qva_step_action;
qva_step_action qva_schedule_action(const qva_vsmooth_params *p, int step,
                                    int num_steps);

/* ------------------------------------------------------------------ codecs */
/* E4M3 (OCP FP8, bias 7, max 448, no Inf): round to nearest even,
 * saturating to +-448; NaN encodes to 0x7F. */
uint8_t qva_e4m3_encode(float x);
float qva_e4m3_decode(uint8_t code);
/* ExpCast-FP8, VC Eq. 7: c(u) = clip_[0,120](RNE(8(u+8) + 56 + beta)),
 * beta = -0.35, u = (s - m) log2(e) <= 0.  NaN gives 0. */
uint8_t qva_expcast_e4m3(float u);
#define QVA_EXPCAST_BETA (-0.35f)
/* The same code with another beta in (-0.5, 0.5) (the row max keeps code
 * 120): qva_expcast_e4m3(u) is qva_expcast_e4m3_beta(u, QVA_EXPCAST_BETA)
 * bit for bit.  QVA_EXPCAST_BETA_CENTRED makes the mean ratio of decoded
 * to exact probability over a doubling 1 (NUMERICS §7, "ExpCast's bias"). */
uint8_t qva_expcast_e4m3_beta(float u, float beta);
#define QVA_EXPCAST_BETA_CENTRED (-0.45f)
/* E2M1 (FP4): values {0,.5,1,1.5,2,3,4,6} with sign; RNE, saturating. */
uint8_t qva_e2m1_encode(float x);
float qva_e2m1_decode(uint8_t code);
/* BF16 / FP16 round to nearest even (returned as float). */
float qva_round_bf16(float x);
float qva_round_f16(float x);

/* NVFP4 (DA2 Eq. 23): per-tensor scale g > 0; for each group of 16, an E4M3
 * local scale sigma = e4m3(amax/(6 g)) and E2M1 codes of x/(g sigma).  n must
 * be a multiple of 16.  scale_codes has n/16 entries, codes n entries (one
 * code per byte). */
float qva_nvfp4_tensor_scale(float amax);
void qva_nvfp4_quantize(const float *x, size_t n, float g, uint8_t *codes,
                        uint8_t *scale_codes);
void qva_nvfp4_dequantize(const uint8_t *codes, const uint8_t *scale_codes,
                          size_t n, float g, float *out);
/* DA2 Eq. 24: online NVFP4 of 16 probabilities in [0,1] (in place). */
void qva_nvfp4_quantize_probs16(float *p16);

/* INT8 (DA2 C.3): delta = amax/127 + 1e-7, code = round(x/delta) with ties
 * away from zero, clamped to [-127,127].  Returns delta. */
float qva_int8_quantize(const float *x, size_t n, int8_t *codes);
int8_t qva_int8_round(float x_over_delta);

/* In-place orthonormal Hadamard transform of length n (power of 2); signs
 * (NULL or n entries of +-1) are applied first. */
qva_status qva_hadamard(float *x, int n, const float *signs);

/* ------------------------------------------------------------ workloads */
/* Which kinds of heads the synthetic generator makes (docs/SYNTHETIC.md).
 * VIDEO is 0 so that a spec filled by hand with this field zeroed gets the
 * original workload, which every preset before these recipes uses. */
typedef enum qva_synthetic_recipe {
    QVA_SYN_VIDEO = 0,           /* local heads, value prototypes on cells */
    QVA_SYN_GLOBAL = 1,          /* global heads, unclustered values, query
                                    row norms varying within blocks */
    QVA_SYN_LOCAL_CLUSTERED = 2, /* local heads, values clustered by object */
    QVA_SYN_MIXED = 3            /* even heads GLOBAL, odd LOCAL_CLUSTERED */
} qva_synthetic_recipe;

typedef struct qva_synthetic_spec {
    char name[32];
    int B, H, D;
    int grid_t, grid_h, grid_w;
    int prefix_tokens;
    uint64_t seed;
    int recipe; /* qva_synthetic_recipe */
} qva_synthetic_spec;

/* Looks up a named preset (see docs/SYNTHETIC.md); an unknown or NULL name
 * is QVA_ERR_INVALID_ARGUMENT with a message that lists the presets. */
qva_status qva_synthetic_preset(const char *name, qva_synthetic_spec *spec);
int qva_synthetic_preset_count(void);
const char *qva_synthetic_preset_name(int i);
/* Fills f32 HND buffers q,k,v of B*H*N*D each, N = prefix + T*H*W. */
qva_status qva_synthetic_generate(const qva_synthetic_spec *spec, float *q,
                                  float *k, float *v);

/* ------------------------------------------------------------ metrics */
typedef struct qva_error_metrics {
    double rel_l2, cos_sim, max_abs, psnr_db;
} qva_error_metrics;
/* Compares out to ref (n floats), sums in FP64. PSNR uses peak =
 * max(ref) - min(ref); identical inputs give psnr = +inf, cos = 1.  A NaN
 * or Inf in either input gives rel_l2 = max_abs = +inf and cos_sim = psnr
 * = -inf, so a broken output can never look good. */
void qva_compare(const float *out, const float *ref, size_t n,
                 qva_error_metrics *m);

/* The part of an output's error that moves every row the same way
 * (docs/NUMERICS.md, "The error's direction"), which rel-L2 cannot see:
 * such a bias compounds over a sampler's steps where rounding noise does
 * not.  Per head, v_bar is the mean of V over its keys (what uniform
 * attention returns) and d = ref - v_bar per row; with e = out - ref,
 *   sharpen = <e, d> / <d, d>   (> 0: rows moved away from the uniform
 *                                average, sharper; < 0: flatter)
 *   cos     = <e, d> / (|e| |d|) (the share of the error along d; about 0
 *                                for unbiased noise, 0 when e = 0)
 * summed in FP64 over all rows and heads.  out and ref: f32 [B, H, R, D]
 * contiguous (as qva_compare takes them); v: a CPU tensor [B, H_kv, N, D],
 * any dtype and strides, H a multiple of H_kv.  A NaN/Inf in out, ref or
 * v is QVA_ERR_NONFINITE; a bad argument QVA_ERR_INVALID_ARGUMENT,
 * QVA_ERR_DTYPE or QVA_ERR_SHAPE; on any failure both fields are NaN.  Where
 * ref is the uniform average itself (d = 0), both are 0. */
typedef struct qva_error_direction {
    double sharpen, cos;
} qva_error_direction;
qva_status qva_error_direction_compute(const float *out, const float *ref, int64_t H, int64_t R,
                                       const qva_tensor *v, qva_error_direction *dir);

/* Where a quantized method's error comes from (docs/NUMERICS.md, "Where
 * the error comes from").  Each field is a rel-L2 (qva_compare) against
 * exact FP64 attention, over all of q's rows, of the CPU reference run
 * with some of the method's operands quantized and the others kept at the
 * FP32 value the quantizer would have seen (after the permutation, K
 * smoothing, the Hadamard rotation and V demeaning of the method).
 * NaN where a term does not apply. */
typedef struct qva_error_terms {
    double full; /* every operand quantized: the method as qva_attention  */
    double q;    /* only Q (INT8, E4M3 or NVFP4 codes)                    */
    double k;    /* only K                                                */
    double p;    /* only P (E4M3 exp2 or ExpCast codes, NVFP4)            */
    double v;    /* only V (vc8/vc4: the demeaned residual)               */
    double mu;   /* only the V-Smooth block means (vc8, vc4; else NaN)    */
    double none; /* nothing quantized: the method's FP32 arithmetic alone */
} qva_error_terms;
/* Fills *terms for cfg's method on CPU tensors q, k, v (the checks and
 * errors of qva_attention_check; one output buffer per term is allocated
 * inside).  Decomposes fp8, sage8, vc8, sage4 and vc4 with their options
 * (+expcast, +hadamard, +qblock); exact and bf16 (nothing, or every
 * operand in one 16-bit format) and draft (phases per block pair) are
 * QVA_ERR_UNSUPPORTED.  Stateless: computed as with cfg->layer =
 * QVA_LAYER_NONE (V-Smooth groups from a cold start); cfg->check_finite
 * applies to every run.  On failure every field is NaN.  Costs one exact
 * call and six or seven calls of the method. */
qva_status qva_error_terms_compute(const qva_config *cfg, const qva_tensor *q,
                                   const qva_tensor *k, const qva_tensor *v,
                                   qva_error_terms *terms);
/* The same terms, and the direction of each term's error
 * (qva_error_direction_compute on the term's output against exact, with
 * cfg's v): which operand's code makes the rows sharper or flatter.  The
 * directions of a term that does not apply, and every field on failure,
 * are NaN.  Costs what qva_error_terms_compute does. */
typedef struct qva_error_term_directions {
    qva_error_direction full, q, k, p, v, mu, none;
} qva_error_term_directions;
qva_status qva_error_terms_directions_compute(const qva_config *cfg, const qva_tensor *q,
                                              const qva_tensor *k, const qva_tensor *v,
                                              qva_error_terms *terms,
                                              qva_error_term_directions *dirs);

/* Route quality of a draft config (docs/DRAFT.md, "Route quality").  The
 * mass of a set of keys is the exact softmax probability (FP64, from Q and
 * K as given) that a video query row puts on them, averaged over the
 * head's T*H*W video query rows; every row's mass over all N keys is 1.
 * Video-region pair (a, b) holds the mass of the rows of region a on the
 * keys of region b.  Prefix (text) keys are kept by every video row (DA2
 * C.1, in the 16-bit phase): their mass is counted as kept and reported
 * apart.  Prefix query rows run dense and hold no pair; they count in
 * rel_l2 only. */
typedef struct qva_draft_head_report {
    int64_t batch, head;      /* the query head (b, h) of q                 */
    int64_t kept16, kept8, kept4; /* region pairs the router gives a phase  */
    double kept_share;        /* (kept16 + kept8 + kept4) / R^2             */
    double prefix_mass;       /* on the prefix keys (0 without a prefix)    */
    double mass16, mass8, mass4; /* on the video pairs of each phase        */
    double router_mass;       /* prefix_mass + mass16 + mass8 + mass4 (to
                               * FP64 rounding)                            */
    double oracle_mass;       /* prefix_mass + the heaviest kept16 + kept8 +
                               * kept4 pairs by their exact mass: the most
                               * any route of that many pairs holds         */
    double ratio;             /* router_mass / oracle_mass, <= 1 exactly
                               * (both summed heaviest pair first); 1 when
                               * both are 0                                 */
    double rel_l2;            /* the draft output against exact attention,
                               * all N rows of the head (qva_compare)       */
} qva_draft_head_report;
/* The same over every head: shares and masses are means over the B*H
 * heads (each has the same number of video rows), ratio = router_mass /
 * oracle_mass of the means, ratio_min the smallest head's ratio and
 * rel_l2 the draft output against exact over all heads (what qvattn eval
 * reports for the method). */
typedef struct qva_draft_report {
    int64_t heads;            /* B*H                                        */
    int64_t regions;          /* R = T * ceil(H*W / 128) video regions      */
    double skip;              /* cfg's frac_skip (the sweep's point)        */
    double kept_share;
    double prefix_mass, mass16, mass8, mass4, router_mass, oracle_mass;
    double ratio, ratio_min;
    int64_t ratio_min_head;   /* b*H + h of the head with ratio_min         */
    double rel_l2;
} qva_draft_report;
/* The route-quality report of draft config cfg on CPU tensors q, k, v
 * (qva_attention's checks and errors, then the draft plan's; a method
 * other than draft is QVA_ERR_INVALID_ARGUMENT).  *report receives the
 * summary; heads (NULL, or max_heads >= B*H entries) one entry per query
 * head in (b, h) order.  The kept set is the one qva_attention's CPU
 * reference routes with (it calls the same code).  The report is of a
 * routed step: cfg->step and dense_warmup_steps are ignored (a warm-up
 * step keeps every key).  Stateless; cfg->check_finite applies.  Costs,
 * per head, one FP64 pass over every (row, key) pair (the exact reference
 * and the masses) and one CPU draft call.  On failure every double of
 * *report is NaN and every count 0, and so are heads' first B*H entries
 * unless the failure was in the arguments themselves. */
qva_status qva_draft_report_compute(const qva_config *cfg, const qva_tensor *q,
                                    const qva_tensor *k, const qva_tensor *v,
                                    qva_draft_report *report,
                                    qva_draft_head_report *heads, int64_t max_heads);
/* The report at `points` skip rates skip[i] in [0, 1] for cfg's split of
 * the kept pairs: point i runs cfg with frac_skip = skip[i] and frac16,
 * frac8, frac4 scaled by (1 - skip[i]) / (frac16 + frac8 + frac4) (all
 * 16-bit when cfg keeps nothing).  reports receives `points` summaries; heads
 * (NULL, or points * max_heads entries, max_heads >= B*H) point i's heads
 * from heads + i * max_heads.  The exact pass is made once per head for
 * all points; each point costs one CPU draft call per head.  points in
 * [1, 1000]; otherwise as qva_draft_report_compute. */
qva_status qva_draft_sweep_compute(const qva_config *cfg, const qva_tensor *q,
                                   const qva_tensor *k, const qva_tensor *v,
                                   const double *skip, int64_t points,
                                   qva_draft_report *reports,
                                   qva_draft_head_report *heads, int64_t max_heads);

/* Value-quantization statistics of one head V [n, d] (f32, row-major) under
 * a token order: relative MSE of per-channel E4M3 quantization after block
 * demeaning, and the mean share of block energy removed by the means (VC
 * Eq. 5). perm may be NULL (sequence order) and must be a permutation;
 * block must be 128 (QVA_ERR_UNSUPPORTED otherwise). */
typedef struct qva_vquant_stats {
    double rel_mse;       /* ||Vhat - V||^2 / ||V||^2 with demeaning    */
    double rel_mse_plain; /* the same without demeaning                  */
    double energy_share;  /* mean over blocks of B||mu||^2 / ||V_j||^2   */
} qva_vquant_stats;
qva_status qva_vquant_stats_compute(const float *v, int n, int d,
                                    const int32_t *perm, int block,
                                    qva_vquant_stats *st);
/* k-means order of one head (what vc8 computes); perm receives n entries.
 * clusters in [1, QVA_VSMOOTH_MAX_CLUSTERS], iters in [0,
 * QVA_VSMOOTH_MAX_ITERS] (the limits of qva_attention). */
qva_status qva_vsmooth_permutation(const float *v, int n, int d, int clusters,
                                   int iters, int32_t *perm);

/* Mean total variation between ExpCast rows and exact softmax rows of one
 * head, over rows [0, rows). Also returns the max TV found.  sm_scale 0
 * means 1/sqrt(d). */
qva_status qva_expcast_tv(const float *q, const float *k, int n, int d,
                          float sm_scale, int rows, double *mean_tv,
                          double *max_tv);

/* ------------------------------------------------------------ build info */
const char *qva_build_info(void);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* QVATTN_H */
