/*
 * What the files of the DraftAttention2 path on the GPU share (DA2 §3.3,
 * C.3, C.4; docs/DRAFT.md §4-5).  The files of src/cuda/draft/, by role:
 *   host.cu                   qvc_draft_attention: the per-context state,
 *                             the side stream, plan -> layout -> router
 *                             and prep -> phased kernel -> dense rows
 *   router.cu                 the device layout and the router (CSR key
 *                             lists per head, query region and phase)
 *   prep_qk.cu, prep.cu       the operands below, in the packed order (Q and
 *                             K from one read; V and the rest)
 *   attn_draft_mma_64x128.cu  the mma.sync phased kernel (any route)
 *   attn_draft_ws_128x128.cu  the Hopper kernel (head dim 128, no NVFP4)
 *   pooled.cu                 +pooled: the skipped pairs as region means,
 *                             merged after the kernel through the LSE
 * This header holds the block size, the operand set (dg_ops), the phased
 * kernel's parameter block (dg_params), the E4M3 / E2M1 codecs that both
 * the quantizers and the NVFP4 phase use, and the host functions one file
 * calls in another.  Internal to these files (C++, included only by .cu
 * files); the backend's entry points are in cuda_internal.h.
 *
 * Operands (all per bh; nv = R*128 video slots; "packed" = the layout's
 * slot order, prefix blocks first):
 *   q16, k16 [n_pack][D], v16t [n_pack/128][D][128]   16-bit (FP16 iff q is
 *            f16, else BF16), RNE of the input; padding slots +0.  q16 is
 *            NULL (direct_q) when the Hopper kernel gathers Q's rows from
 *            the caller's tensor itself (host.cu: dg_direct_q_ok)
 *   q4, k4   [nv][D] BF16 bits of the unscaled NVFP4 reconstruction
 *            sigma*e2m1 (groups of 16 channels); v4t [R][D][128] the same
 *            for V (groups of 16 keys per channel), transposed; g4 [3] the
 *            tensor scales g_Q, g_K, g_V.  sigma*e2m1 has at most 6
 *            significant bits, so BF16 holds it exactly.
 *   q8, k8   [nv][D] INT8, k8s [R] one delta per region block, q8s [nv]
 *            one per row (q_rows_per_scale 1) or [R] per block (128);
 *            v8t [R][D][128] E4M3 of V/delta_c in the PV slot order
 *            (qvc_pv_slot_key), dv [D] the channel scales delta_c (with
 *            +vsample those of the packed video rows' sample where they
 *            serve, v_redo[bh] 0; else the head's own, v_redo 1).
 * Low-bit scales come from the video tokens only (padding is zero).
 */
#ifndef QVATTN_CUDA_DRAFT_INTERNAL_H
#define QVATTN_CUDA_DRAFT_INTERNAL_H

#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "cuda_internal.h"
#include "draft/plan.h"

#define DG_KEYS 128 /* keys per block (= region capacity) */

typedef struct dg_ops {
    int BH, R, D, with4, with8;
    int direct_q; /* no q16: the kernel reads Q in place (set per call) */
    int64_t n_pack;
    uint16_t *q16, *k16, *v16t;
    uint16_t *q4, *k4, *v4t;
    float *g4;
    int8_t *q8, *k8;
    float *q8s, *k8s;
    int q_rows_per_scale; /* 1 or DG_KEYS, from the plan */
    uint8_t *v8t;
    float *dv;
    float *amax; /* [3][BH][R][D] scratch: channel amax of each region, Q K V */
    void *vs_part; /* +vsample: the sample's chunk partials (qvc_stat_sample) */
    int *v_redo;   /* +vsample: [BH] 1 where the sampled scales do not serve */
} dg_ops;

/* The phased kernel's arguments: the operands, the layout (count, pack)
 * and the route (offsets, cols) on the device. */
typedef struct dg_params {
    dg_ops ops;
    int R;
    int64_t n_pack, prefix_pad;
    int prefix;
    const int32_t *count, *pack, *offsets, *cols;
    float scale_log2, eta;
    int expcast;
    int f16;   /* 16-bit operands are FP16 (else BF16) */
    int with8; /* a route may have INT8 blocks (the plan's with8) */
    int int8_acc16; /* INT8 blocks' PV partials rounded to FP16 (Table 6) */
    qvc_attn_args a;
} dg_params;

/* ---- E4M3 / E2M1 codecs (the quantizers of prep.cu, the NVFP4 phase) */

/* qva_e4m3_encode for the finite values used here: RNE, saturating. */
static __device__ __forceinline__ uint32_t dg_e4m3(float y) {
    return (uint32_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
}

/* qva_e4m3_decode (exact). */
static __device__ __forceinline__ float dg_e4m3_decode(uint32_t code) {
    const uint32_t e = (code >> 3) & 15u, m = code & 7u;
    float mag;
    if (e == 15u && m == 7u)
        mag = __int_as_float(0x7fc00000);
    else if (e == 0u)
        mag = ldexpf((float)m, -9);
    else
        mag = ldexpf((float)(8u + m), (int)e - 10);
    return (code & 0x80u) ? -mag : mag;
}

/* qva_e2m1_encode: nearest of {0, .5, 1, 1.5, 2, 3, 4, 6}, a tie to the
 * even code; the walk over the midpoints as one count (the conditions hold
 * for a prefix of them).  NaN gives 0, the sign is kept. */
static __device__ __forceinline__ uint32_t dg_e2m1(float x) {
    if (isnan(x)) return 0u;
    const uint32_t sign = signbit(x) ? 8u : 0u;
    const float a = fabsf(x);
    const uint32_t c = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) + (uint32_t)(a > 1.25f) +
                       (uint32_t)(a >= 1.75f) + (uint32_t)(a > 2.5f) + (uint32_t)(a >= 3.5f) +
                       (uint32_t)(a > 5.0f);
    return sign | c;
}

static __device__ __forceinline__ float dg_e2m1_decode(uint32_t code) {
    const uint32_t c = code & 7u;
    const float mag = c < 4u ? 0.5f * (float)c : c == 4u ? 2.0f : c == 5u ? 3.0f : c == 6u ? 4.0f : 6.0f;
    return (code & 8u) ? -mag : mag;
}

/* ---- prep_qk.cu (dg_prep_qk), prep.cu (the rest) */
/* Every operand the plan needs, from the user views, on stream st. */
qva_status dg_prep(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                   const qvc_view *kv, const qvc_view *vv, dg_ops *o, cudaStream_t st);
/* dg_prep in two parts: the 16-bit Q and K (with NVFP4, their region amax), their
 * INT8 codes where the plan has an INT8 phase, and with pool non-NULL the
 * router's pooling into pool->qavg .. kmax, all from one read of Q and K;
 * then everything else. */
qva_status dg_prep_qk(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                      const qvc_view *kv, dg_ops *o, const qvc_draft_route_buf *pool,
                      cudaStream_t st);
qva_status dg_prep_rest(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                        const qvc_view *kv, const qvc_view *vv, dg_ops *o, cudaStream_t st);

/* ---- attn_draft_mma_64x128.cu */
/* The phased kernel over every video query row (D 64 or 128; f16: the
 * 16-bit operands are FP16). */
qva_status dg_launch_mma(const dg_params *p, int BH, int D, int f16, cudaStream_t st);

/* ---- pooled.cu: +pooled, the skipped pairs as their regions' means */
typedef struct dg_pooled_buf {
    int BH, R, D;
    int64_t n;
    float *vavg, *vmax; /* [BH][R][D] V pooled as the router pools K */
    float *lse;         /* [BH][n] the kept part's LSE when the caller asks none */
} dg_pooled_buf;
qva_status dg_pooled_ensure(dg_pooled_buf *b, int BH, int R, int D, int64_t n);
void dg_pooled_free(dg_pooled_buf *b);
/* After the phased kernel has written out and a->lse (the kept keys'):
 * the pooled keys of every video row merged into both, on stream st. */
qva_status dg_pooled_merge(const dg_pooled_buf *b, const qvc_view *v, const qvc_draft_layout *L,
                           const qvc_draft_route_buf *route, const dg_ops *ops,
                           const qvc_attn_args *a, int f16, cudaStream_t st);

#endif
