/*
 * Device-side operand layouts shared by the CUDA prep kernels and the
 * attention kernels.  Everything is per (batch*head) "bh", padded to
 * QVI_BLOCK (128) tokens.  The CPU reference (src/cpu/head_ops.c) defines
 * the values; these are only their device layouts.
 */
#ifndef QVATTN_CUDA_INTERNAL_H
#define QVATTN_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Strided view of a user tensor on the device (element strides). */
typedef struct qvc_view {
    const void *data;
    int dtype; /* qva_dtype */
    int64_t B, H, N, D; /* H: the heads the kernels see (the query heads) */
    int64_t sb, sh, sn; /* stride[3] is 1 */
    int64_t hg;         /* heads per tensor head: view head h reads tensor
                           head h / hg (grouped K/V, GQA/MQA); 1 otherwise */
} qvc_view;

/*
 * Quantized operands of one call.
 *   q_i8  [BH][nq_pad][D] int8   q_scale [BH][nq_pad/q_rows_per_scale] f32
 *          (INT8: DA2 C.3 over one row, or over 128 rows with +qblock;
 *          E4M3: per 128 rows; room for nq_pad scales is allocated)
 *   k_i8  [BH][nk_pad][D] int8   k_scale [BH][nk_pad/128] f32, rows = K[pi]
 *          smoothed (channel mean subtracted) and rotated as configured
 *   (fp8 method: the same arrays hold E4M3 codes, scales amax/448)
 *   v_t   [BH][nblk][D][128] E4M3 codes of V[pi] (residual if demeaned),
 *          transposed per block with the key order of each 32-key chunk
 *          permuted by qvc_pv_slot_key() so the QK accumulator fragment
 *          feeds the PV MMA directly (DA2 Eq. 22)
 *   v_t_lo [BH][nblk][D][128] V's second E4M3 digit (QVA_V_E4M3X2: the
 *          code of the first one's residual, same scale and layout), or NULL
 *   v_chan [BH][D] f32 per-channel scale (sage/vc: amax/2.25; fp8: 1)
 *   v_blk  [BH][nblk] f32 per-block scale (fp8: amax/448; sage/vc: 1)
 *   v_mu   [BH][nblk][D] f32 FP16-rounded mean/scale, or NULL
 *   v_mu_tile [BH][nbatch][QVC_MU_TILE_BYTES] the same values as FP16 in
 *          the 8-bit kernel's restore tiles: 16 blocks a tile
 *          (qvc_mu_tile_at), 128 channels wide (at D 64 channels 64..127
 *          zero and unread: the restore runs at n64), slots past nblk
 *          zero, so that the kernel's producer copies a batch's tile as
 *          it is
 */
typedef struct qvc_ops {
    int BH, nq, nk, nq_pad, nk_pad, nblk, D;
    int q_rows_per_scale; /* set by qvc_prep: 1 or QVI_BLOCK */
    int8_t *q_i8;
    float *q_scale;
    int8_t *k_i8;
    float *k_scale;
    uint8_t *v_t;
    uint8_t *v_t_lo;
    float *v_chan;
    float *v_blk;
    float *v_mu;
    uint16_t *v_mu_tile;
} qvc_ops;

/* The V-Smooth restore's batches (dense/attn8_restore.cuh): QVC_MU_BATCH
 * key blocks per FP16 wgmma, whose B operand is a tile of their means at
 * D = 128: K-major without swizzle, 8 x 16-byte core matrices 128 B apart
 * along k (the block slot) and 256 B along n (the channel). */
#define QVC_MU_BATCH 16
#define QVC_MU_TILE_BYTES (QVC_MU_BATCH * 128 * 2)
#ifdef __CUDACC__
static inline __host__ __device__
#else
static inline
#endif
int qvc_mu_tile_at(int n, int k) { /* byte offset of (channel n, slot k) */
    return (((n >> 3) * 2 + (k >> 3)) * 128) + (n & 7) * 16 + (k & 7) * 2;
}
#ifdef __CUDACC__
static inline __host__ __device__
#else
static inline
#endif
size_t qvc_mu_head_bytes(int nblk) { /* one head's tiles: whole batches */
    return (size_t)((nblk + QVC_MU_BATCH - 1) / QVC_MU_BATCH) * QVC_MU_TILE_BYTES;
}

/* Key (0..31) whose value sits in PV-operand slot s (0..31) of a chunk. */
#ifdef __CUDACC__
static inline __host__ __device__
#else
static inline
#endif
int qvc_pv_slot_key(int s) {
    int half = s >> 4, within = s & 15, tig = within >> 2, j = within & 3;
    return 8 * (2 * half + (j >> 1)) + 2 * tig + (j & 1);
}

/* ---- prep (src/cuda/prep/) -------------------------------------------- */
typedef enum qvc_qk_format { QVC_QK_INT8 = 0, QVC_QK_E4M3 = 1 } qvc_qk_format;
/* An 8-bit Q/K preparation under trial (dev/cuda, qvc_dev_kernels.qk8):
 * launches p's codes and scales and returns 1, or returns 0 where it does
 * not serve p and the library's kernel runs (prep/qk.cu). */
struct qk_params;
typedef int (*qvc_qk8_launcher)(const struct qk_params *p, int BH, int D, cudaStream_t st);
typedef struct qvc_prep_args {
    qvc_qk_format qk_format;
    int q_rows_per_scale;    /* 1 (INT8 only: a scale per query row) or
                                QVI_BLOCK (the papers, and E4M3)          */
    int smooth_k;            /* subtract the channel mean of K           */
    int hadamard;            /* rotate Q and K along D                   */
    const float *had_signs;  /* device [D] +-1, or NULL                  */
    const int32_t *perm;     /* device [BH][nk] or NULL                  */
    int v_mode;              /* 0: E4M3 per-channel amax/2.25 (sage/vc);
                                1: E4M3 per-block amax/448 (fp8);
                                2: INT8 per-channel amax/127 (+i8pv,
                                   undemeaned, 16-bit vector-loadable V) */
    int demean;              /* V-Smooth block demeaning (v_mode 0)      */
    /* LSE correction of K smoothing (needs smooth_k), or NULL: receives
     * lse_shift[bh*nq + i] = (float)(FP64 dot(q_i, mean(K')) * sm_scale),
     * q_i unrotated, exactly as smooth_k() of the CPU reference. */
    float *lse_shift;        /* device [BH][nq] f32, or NULL             */
    float sm_scale;          /* used only with lse_shift                 */
    /* +kprev (cfg.k_mean, the CPU's kprev_means / next_k_mean), or NULL:
     * the layer's carried K means [BH][D] and their validity [BH] (0: the
     * head smooths with its own mean, read as without +kprev).  The call
     * smooths with them, then overwrites both with the means its layer's
     * next call uses, made from its K codes.  INT8 K through qk_plain.cu
     * (bf16/f16, 16-byte aligned rows, head dim 64 or 128). */
    float *kprev_mean;
    int *kprev_valid;
    /* +vprev (cfg.v_scale, the CPU's qvi_v8_prepare_carried), or NULL: the
     * layer's carried V channel scales [BH][D] and their validity [BH].
     * Undemeaned E4M3 V through v_plain.cu codes with them where they
     * serve (every channel's amax / scale <= 448; else the head's own, a
     * second read of its V), and leaves its own scales in their place. */
    float *vprev_scale;
    int *vprev_valid;
    /* +ksample (cfg.k_mean): K smooths with the mean of its sampled rows
     * (the CPU's sampled_of), and the preparation reads K once */
    int k_sample;
    /* +vsample (cfg.v_scale): undemeaned E4M3 V codes with the scales of
     * its sampled rows where they serve, by +vprev's path (v.cu) with
     * those scales in place of carried ones; same inputs as +vprev */
    int v_sample;
    /* the dev driver's Q/K preparation under trial (qvc_dev_kernels.qk8),
     * or NULL */
    qvc_qk8_launcher qk8;
} qvc_prep_args;
/* +ksample (mean): out [BH][D] = the mean of x's sampled rows per channel
 * (QVA_STAT_ROW over n rows; map NULL: rows of x, else map[row] is x's
 * row, -1 a zero row), as the CPU's sampled_of sums it; +vsample (!mean):
 * out = their amax / 2.25 (1 for an all-zero channel) and, valid not
 * NULL, valid[BH] = 1.  part: qvc_stat_sample_bytes(BH, n, D) of scratch
 * (prep/sample.cu; draft's +vsample samples its packed video rows). */
size_t qvc_stat_sample_bytes(int BH, int n, int D);
qva_status qvc_stat_sample(const qvc_view *x, int BH, int64_t n, const int32_t *map, int mean,
                           void *part, float *out, int *valid, cudaStream_t st);
/* Two side streams for the independent chains of one call (streams.cu):
 * qvc_fork_begin makes them wait for the caller's stream, qvc_fork_end
 * makes the caller's stream wait for them.  Made on first use, owned by
 * the context's state. */
#define QVC_FORK_SIDES 2
typedef struct qvc_fork {
    cudaStream_t side[QVC_FORK_SIDES];
    cudaEvent_t ev[QVC_FORK_SIDES + 1]; /* the fork, then each side's join */
} qvc_fork;
qva_status qvc_fork_ensure(qvc_fork *f);
void qvc_fork_free(qvc_fork *f);
qva_status qvc_fork_begin(const qvc_fork *f, cudaStream_t st);
qva_status qvc_fork_end(const qvc_fork *f, cudaStream_t st);

/* Fills ops (allocated by the caller with qvc_ops_alloc).  With fk (else
 * NULL: all on st), Q, the K chain and the V chain run side by side: Q on
 * st, K and V on the two side streams, joined back into st before return. */
qva_status qvc_prep(const qvc_view *q, const qvc_view *k, const qvc_view *v,
                    const qvc_prep_args *a, qvc_ops *ops, const qvc_fork *fk,
                    cudaStream_t st);
/* with_v_lo: room for v_t_lo (QVA_V_E4M3X2), else it stays NULL. */
qva_status qvc_ops_alloc(qvc_ops *ops, int BH, int nq, int nk, int D, int with_mu,
                         int with_v_lo);
void qvc_ops_free(qvc_ops *ops);

/* ---- k-means (src/cuda/kmeans.cu) -------------------------------------- */
/* Lloyd k-means over V rows of every bh at once, same rules as
 * qvi_kmeans (FP32 distances in channel order, ties to the lower index,
 * FP64 sums in a fixed order); warm: centroids hold the start.  Writes
 * perm[BH][N] = stable argsort(labels) per bh.  centroids: [BH][k][D]. */
qva_status qvc_kmeans_perm(const qvc_view *v, int k, int iters, int warm,
                           float *centroids, int32_t *perm, cudaStream_t st);

/* The assignment's tensor-core form (src/cuda/kmeans_tc.cu): labels as
 * sort keys [BH][N] = bh * k + label, equal to qvi_kmeans's, for bf16 V
 * with 16-bit-aligned rows, D 64 or 128 and k <= 32 (qvc_km_assign_tc_ok). */
int qvc_km_assign_tc_ok(const qvc_view *v, int k);
qva_status qvc_km_assign_tc(const qvc_view *v, int BH, int k, const float *cent, uint32_t *keys,
                            cudaStream_t st);

/* The stable sort of k-means labels (src/cuda/kmeans_sort.cu): keys
 * [BH][n] = bh * k + label -> keys_out / vals_out (token indices) in the
 * CPU's stable order; cnt and start [BH][k] get each label's count and
 * first slot.  hist: qvc_label_sort_scratch(BH, n, k) ints of scratch, or
 * NULL when that is 0 (the serial way). */
int64_t qvc_label_sort_scratch(int64_t BH, int n, int k);
qva_status qvc_label_sort(const uint32_t *keys, int BH, int n, int k, int *hist, int *cnt,
                          int *start, uint32_t *keys_out, int32_t *vals_out, cudaStream_t st);

/* FP64 means of lists of V rows (segments of `rows`), equal to the CPU's
 * sequential sums (prep/colsum.cu); used by the k-means centroid update. */
qva_status qvc_colsum_mean(const qvc_view *v, const int32_t *rows,
                           const uint32_t *pos_seg, int npos,
                           const int *seg_start, const int *seg_len,
                           int seg_per_bh, int nseg, float *out,
                           cudaStream_t st);

/* ---- DraftAttention2 router (src/cuda/draft/router*.cu) --------------- */
/* The packing of the host partition (src/cpu/draft.h), uploaded once per
 * (partition, T, prefix); the route lists are CSR rows
 * i = (bh*R + a)*3 + phase (0: 4-bit, 1: 8-bit, 2: 16-bit) with ascending
 * key regions cols[offsets[i] .. offsets[i+1]); prefix blocks are implicit
 * (video queries take all of them in the 16-bit phase). */
#define QVC_DRAFT_ROUTER_API 1
struct qvi_partition;
typedef struct qvc_draft_layout {
    int64_t n, n_pack, prefix_pad;
    int prefix, prefix_at_end, t, h, w, c, rf;
    int regions;
    int32_t *pack_to_orig, *orig_to_pack, *count; /* device */
} qvc_draft_layout;
qva_status qvc_draft_layout_upload(const struct qvi_partition *part, int t, int prefix,
                                   int prefix_at_end, qvc_draft_layout *out);
void qvc_draft_layout_free(qvc_draft_layout *l);
/* The lists of head bh follow those of head bh - 1 without a gap (a row's
 * end is the next row's start, offsets[i + 1], across heads too): under
 * the QUOTA budget head bh starts at bh*T, under MASS at the sum of the
 * earlier heads' kept counts, computed on the device. */
typedef struct qvc_draft_route_buf {
    int BH, R, D;
    int mass;           /* host: the last call ran the MASS budget          */
    int64_t quota[4];   /* host: skip,4,8,16 of the last call (QUOTA; all 0
                           under MASS: head_quota has them)                  */
    int64_t retained;   /* host: T = R^2 - skip (QUOTA; -1 under MASS)      */
    float *qavg, *qmax, *kavg, *kmax; /* [BH][R][D]; K's rows in qvc_dr_kslot order */
    float *A;           /* [BH][R][R] */
    uint8_t *prec;      /* [BH][R][R] */
    int32_t *offsets;   /* [BH*R*3+1] */
    int32_t *cols;      /* [BH*R*R] capacity */
    int64_t *head_quota; /* [BH][4] skip,4,8,16 of each head (MASS only)    */
    void *scratch;
} qvc_draft_route_buf;
qva_status qvc_draft_route_alloc(qvc_draft_route_buf *b, int BH, int R, int D);
void qvc_draft_route_free(qvc_draft_route_buf *b);
qva_status qvc_draft_route(const qvc_view *q, const qvc_view *k, const qva_config *cfg,
                           const qvc_draft_layout *lay, qvc_draft_route_buf *b, cudaStream_t st);
/* The same without its pooling: b->qavg .. kmax already hold it
 * (qvc_draft_pool16, or the draft prep's Q and K packs). */
qva_status qvc_draft_route_pooled(const qvc_view *q, const qvc_view *k, const qva_config *cfg,
                                  const qvc_draft_layout *lay, qvc_draft_route_buf *b,
                                  cudaStream_t st);
/* Where the router keeps channel c of a row of K's pooled descriptors
 * (kavg, kmax): at D 64 and 128, within each 16 channels, channel
 * 16s + 4j + t at 16s + 4t + j, so that a lane of the map's FP64 mma loads
 * the four channels it takes of a k16 step (t, t + 4, t + 8, t + 12) as one
 * 16-byte vector; other D: c.  Its own inverse. */
#ifdef __CUDACC__
static inline __host__ __device__
#else
static inline
#endif
int qvc_dr_kslot(int c, int D) {
    return D == 64 || D == 128 ? (c & ~15) | ((c & 3) << 2) | ((c >> 2) & 3) : c;
}

/* The router's pooling of x (Q or K) into avg, max [BH][R][D], bit for bit
 * the CPU's, as the draft prep computes it beside its 16-bit pack
 * (src/cuda/draft/prep_qk.cu): D 64 or 128, region capacity 128; kslots:
 * the channels in qvc_dr_kslot order (K's), else in order. */
qva_status qvc_draft_pool16(const qvc_view *x, const qvc_draft_layout *lay, int BH, float *avg,
                            float *max, int kslots, cudaStream_t st);

/* ---- attention (src/cuda/attn_*.cu) ------------------------------------ */
typedef struct qvc_attn_args {
    float scale_log2;  /* sm_scale * log2(e)                           */
    int expcast;       /* ExpCast P codes (a qva_expcast_mode)         */
    float expcast_add; /* its addend 120 + beta (expcast_magic.h)     */
    int sum_codes;     /* exp2 P codes with the row sum of the decoded
                          codes (QVA_P_SUM_CODES): the ones row's sum,
                          as ExpCast's                                 */
    int u8_pv;         /* +i8pv: u8 P codes of each block's row max, INT8
                          V (v_mode 2), the s32 product (QVA_V_INT8_PV) */
    int p_block;       /* +pblock: E4M3 P codes of each block's row max,
                          the block scaled by exp2(m_b - m) (QVA_P_MAX_BLOCK) */
    void *out;         /* user output (strided, its dtype)             */
    int out_dtype;
    int64_t osb, osh, osn;
    float *lse;        /* [B,H,N,1] f32 strided, or NULL               */
    int64_t lsb, lsh, lsn;
    int H;             /* heads, to split bh                           */
    /* K-smoothing LSE shift, device [BH][nq] f32 (row i of head bh at
     * bh*nq + i, nq = the call's query count, not padded), or NULL.  A
     * kernel that writes the LSE adds it last, as one FP32 add:
     *   lse = ln2*(m + log2(l) - a) + lse_shift[bh*nq + i]
     * (-inf stays -inf).  Filled by qvc_prep / qvc_prep4 (their
     * qvc_prep_args.lse_shift); NULL when no LSE is requested or the
     * method does not smooth K. */
    const float *lse_shift;
} qvc_attn_args;
/* The Hopper 8-bit kernel (dense/attn8_ws_128x128.cu): wgmma + TMA,
 * warp-specialized, head dim 64 or 128 (64 in the 128-wide tiles). */
qva_status qvc_attn8_ws_128x128(const qvc_ops *ops, qvc_qk_format fmt,
                                const qvc_attn_args *a, cudaStream_t st);

/* The block-sparse Hopper draft kernel (draft/attn_draft_ws_128x128.cu), head dim 128,
 * routes without an NVFP4 phase.  Operands as draft/prep.cu prepares them
 * (draft/draft_internal.h): q16/k16 [BH][n_pack][128], v16t [BH][n_pack/128][128][128]
 * (16-bit, f16 iff f16), q8/k8 [BH][R][128][128] INT8 with q8s/k8s [BH][R],
 * v8t [BH][R][128][128] E4M3 in the PV slot order, dv [BH][128]; the
 * 8-bit ones may be NULL when no route has an INT8 phase.  with8: a route
 * of the call may have INT8 blocks (the plan's; the 8-bit buffers may be
 * allocated from an earlier call either way). */
typedef struct qvc_draft_ws_args {
    int BH, R, D, prefix, expcast, f16, with8; /* D: head dim, 64 or 128 */
    int int8_acc16; /* INT8 blocks' PV partials rounded to FP16 (Table 6) */
    int64_t n_pack, prefix_pad;
    const uint16_t *q16, *k16, *v16t;
    const int8_t *q8, *k8;
    const uint8_t *v8t;
    const float *q8s, *k8s, *dv;
    int q_rows_per_scale; /* of q8s: 1 or 128 (see draft_internal.h) */
    const int32_t *count, *pack, *offsets, *cols;
    float scale_log2, eta;
    qvc_attn_args a;
    /* direct_q: the kernel gathers its 16-bit Q rows from the caller's
     * tensor qv itself (row pack[slot] of each head; draft/host.cu:
     * dg_direct_q_ok), and q16 is neither written nor read (NULL) */
    int direct_q;
    qvc_view qv;
} qvc_draft_ws_args;
qva_status qvc_attn_draft_ws_128x128(const qvc_draft_ws_args *w, cudaStream_t st);

/* ---- 4-bit methods sage4 / vc4 (src/cuda/prep/fp4.cu, dense/attn_fp4_simt_64x128.cu) */
/*
 * NVFP4 operands (DA2 Eq. 23), codes and scales bit-exact with the CPU
 * quantizers qvi_quant_nvfp4_rows / _cols (src/formats.c):
 *   q, k   [BH][n_pad][D/2]  E2M1 codes, two per byte: channel 2i in the
 *          low nibble, 2i+1 in the high nibble (bit 3 of a nibble = sign)
 *   q_sc, k_sc [BH][n_pad][D/16] E4M3 scale codes, groups of 16 channels
 *   v      [BH][nk_pad][D/2]  E2M1 codes of V[pi] (the residual when
 *          demeaned), row-major like k
 *   v_sc   [BH][nk_pad/16][D] E4M3 scale codes, groups of 16 consecutive
 *          keys of one channel
 *   g      [BH][3] f32 tensor scales gq, gk, gv of each head
 *   mu     [BH][nblk][D] f32 FP16-rounded raw block means (vc4; not
 *          divided by any scale, VC App. B), or NULL
 * Element value = g * e4m3(sc) * e2m1(code), the product e4m3*e2m1 first
 * (it is exact).  K rows are smoothed and rotated as for sage8.
 */
typedef struct qvc_ops4 {
    int BH, nq, nk, nq_pad, nk_pad, nblk, D;
    uint8_t *q, *q_sc;
    uint8_t *k, *k_sc;
    uint8_t *v, *v_sc;
    float *g;
    float *mu;
} qvc_ops4;
qva_status qvc_ops4_alloc(qvc_ops4 *ops, int BH, int nq, int nk, int D, int with_mu);
void qvc_ops4_free(qvc_ops4 *ops);
/* Fills ops from the views; uses a->smooth_k, hadamard, had_signs, perm,
 * demean, lse_shift, sm_scale (qk_format and v_mode are ignored).  A
 * demean request needs ops->mu. */
qva_status qvc_prep4(const qvc_view *q, const qvc_view *k, const qvc_view *v,
                     const qvc_prep_args *a, qvc_ops4 *ops, cudaStream_t st);
/* Emulated NVFP4 attention (Hopper has no FP4 tensor cores): decoded
 * operands, FP32 FMAs in the CPU's order; a->expcast is ignored. */
qva_status qvc_attn_fp4(const qvc_ops4 *ops, const qvc_attn_args *a, cudaStream_t st);

/* ---- bf16 method (prep/bf16.cu, dense/attn_bf16_mma_64x128.cu) ----------- */
#define QVC_HAVE_OPS16 1
/* 16-bit operands: BF16 bits, FP16 if use_f16 (the CPU takes the format
 * from q's dtype), RNE from the input; padding is +0.
 *   q   [BH][nq_pad][D]
 *   k   [BH][nk_pad][D]
 *   v_t [BH][nblk][D][128]  V transposed per 128-key block (key order) */
typedef struct qvc_ops16 {
    int BH, nq, nk, nq_pad, nk_pad, nblk, D;
    uint16_t *q;
    uint16_t *k;
    uint16_t *v_t;
} qvc_ops16;
qva_status qvc_ops16_alloc(qvc_ops16 *ops, int BH, int nq, int nk, int D);
void qvc_ops16_free(qvc_ops16 *ops);
qva_status qvc_prep16(const qvc_view *q, const qvc_view *k, const qvc_view *v,
                      int use_f16, qvc_ops16 *ops, cudaStream_t st);
/* mma.sync m16n8k16, FP32 online softmax; a->expcast is ignored. */
qva_status qvc_attn_bf16(const qvc_ops16 *ops, int use_f16,
                         const qvc_attn_args *a, cudaStream_t st);

/* ---- DraftAttention2 phased attention (src/cuda/draft/host.cu) -------- */
/* The whole `draft@...` call on the device (validated by the dispatcher):
 * plan, router, prep, the phased kernel and the dense rows (prefix queries,
 * or every row during the dense warm-up), on the context's stream. */
qva_status qvc_draft_attention(qva_context_t *ctx, const qva_config *cfg, const qva_tensor *q,
                               const qva_tensor *k, const qva_tensor *v, const qva_tensor *out,
                               const qva_tensor *lse);

/* ---- the kernel chooser (src/cuda/choose.cu) ------------------------- */
/* The kernels of the library, one per path. */
typedef enum qvc_kernel {
    QVC_KERNEL_NONE = 0,
    QVC_KERNEL_ATTN8_WS_128X128,       /* sage8, vc8, fp8 at head dim 64, 128 */
    QVC_KERNEL_ATTN_BF16_MMA_64X128,   /* bf16; the draft's dense warm-up   */
    QVC_KERNEL_ATTN_FP4_SIMT_64X128,   /* sage4, vc4 (emulated NVFP4)       */
    QVC_KERNEL_ATTN_DRAFT_WS_128X128,  /* draft, head dim 64, 128, no NVFP4 */
    QVC_KERNEL_ATTN_DRAFT_MMA_64X128,  /* draft with NVFP4 blocks           */
} qvc_kernel;
/* The one decision of which kernel runs cfg at head dim d with kv_group
 * query heads per K/V head (1: as many K/V heads as query heads); both
 * qva_supports() (through qvi_cuda_supports) and the dispatch ask it.
 * QVC_KERNEL_NONE with the reason in why, else the kernel and what it is.
 * Grouped K/V (kv_group > 1) runs every kernel: the views map each query
 * head to its K/V head (qvc_kv_view), the operands are prepared per query
 * head. */
qvc_kernel qvc_choose_kernel(const qva_config *cfg, int64_t d, int64_t kv_group, char *why,
                             size_t len);

/* ---- kernel versions under trial (dev/cuda) --------------------------- */
/* The dev driver runs another launcher in place of a library kernel, on
 * one context, through the library's own preparation; the library never
 * sets these.  NULL members keep the library's kernel. */
typedef qva_status (*qvc_attn8_launcher)(const qvc_ops *ops, qvc_qk_format fmt,
                                         const qvc_attn_args *a, cudaStream_t st);
typedef qva_status (*qvc_draft_ws_launcher)(const qvc_draft_ws_args *w, cudaStream_t st);
typedef struct qvc_dev_kernels {
    qvc_attn8_launcher attn8_ws;     /* in place of attn8_ws_128x128       */
    qvc_draft_ws_launcher draft_ws;  /* in place of attn_draft_ws_128x128  */
    int serial_draft_prep;           /* draft prep on the caller's stream  */
    qvc_qk8_launcher qk8;            /* 8-bit Q/K codes, where it serves   */
} qvc_dev_kernels;
qva_status qvc_set_dev_kernels(qva_context_t *ctx, const qvc_dev_kernels *k);
/* The context's dev kernels, or NULL (every library kernel). */
const qvc_dev_kernels *qvc_dev_kernels_of(qva_context_t *ctx);

#ifdef __cplusplus
}
#endif
#endif
