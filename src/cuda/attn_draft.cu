/*
 * DraftAttention2 on the GPU (DA2 §3.3, C.3, C.4; docs/DRAFT.md §4-5):
 * operand preparation in the packed region order and the phased kernel
 * attn_draft_mma_64x128, correct-first (mma.sync, no pipelining).
 *
 * One call (qvc_draft_attention):
 *   1. plan (qvi_draft_plan_make, shared with the CPU reference): warm-up,
 *      quotas, which low-bit operands are needed, the dense rows;
 *   2. warm-up: the bf16 method's prep16 + attn_bf16 over every row, which
 *      is exactly what the CPU computes then (docs/DRAFT.md §5);
 *   3. else: the device layout (host partition from the context cache,
 *      uploaded once per (grid, prefix)), the router (draft_router.cu:
 *      CSR key lists per (head, query region, phase)), the prep kernels
 *      below, one CTA of 64 query rows per (half region, head) walking the
 *      phases 4 -> 8 -> 16 with ONE online-softmax state, and the prefix
 *      query rows through the bf16 method on a row sub-view of Q (the CPU
 *      computes them exactly like `bf16`, in sequence order).
 *
 * Operands (all per bh; nv = R*128 video slots; "packed" = the layout's
 * slot order, prefix blocks first):
 *   q16, k16 [n_pack][D], v16t [n_pack/128][D][128]   16-bit (FP16 iff q is
 *            f16, else BF16), RNE of the input; padding slots +0
 *   q4, k4   [nv][D] BF16 bits of the unscaled NVFP4 reconstruction
 *            sigma*e2m1 (groups of 16 channels); v4t [R][D][128] the same
 *            for V (groups of 16 keys per channel), transposed; g4 [3] the
 *            tensor scales g_Q, g_K, g_V.  sigma*e2m1 has at most 6
 *            significant bits, so BF16 holds it exactly.
 *   q8, k8   [nv][D] INT8, q8s/k8s [R] one delta per region block;
 *            v8t [R][D][128] E4M3 of V/delta_c in the PV slot order
 *            (qvc_pv_slot_key), dv [D] the channel scales delta_c.
 * Low-bit scales come from the video tokens only (padding is zero).
 *
 * Numerics against the CPU reference (src/cpu/draft.c):
 *   - every quantizer is the CPU's expression with explicit _rn
 *     intrinsics (no FMA contraction), so codes and scales are bit-exact;
 *   - 16-bit phase: the bf16 kernel's math (P rounded to 16 bits, FP32
 *     partial per block);
 *   - INT8 phase: the dense 8-bit kernel's math (exact INT32 QK, E4M3 P
 *     and V, partial per block rounded to FP16 with saturation, Table 6),
 *     entered and left by Eq. 8;
 *   - NVFP4 phase, emulated (Hopper has no FP4 MMA): QK on the exact BF16
 *     reconstructions (products exact, FP32 accumulation), scores times
 *     (g_Q g_K) scale_log2; p = exp2(s - m) in FP32, l += sum p before the
 *     conversion; P coded per 16 keys by DA2 Eq. 24 with the CPU's
 *     expressions; the FP32 value of each coded p is split exactly into
 *     three BF16 terms (8 + 8 + 8 significant bits) and PV runs as three
 *     BF16 MMAs into one FP32 partial, so the partial is sum p*v with exact
 *     products; U += partial * g_V.
 *   The GPU therefore differs from the CPU only in summation order (MMA
 *   accumulation, row sums) and exp2f/log2f ulps.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/attn_common.cuh"
#include "common/softmax.cuh"
#include "draft/partition.h"
#include "draft/plan.h"

#define DG_ROWS 64       /* query rows per CTA (half a region)  */
#define DG_KEYS 128      /* keys per block (= region capacity)  */
#define DG_THREADS 128   /* 4 warps x 16 rows                   */
#define DG_PAD16 8       /* halfwords of row padding            */
#define DG_PAD8 16       /* bytes of row padding                */
#define DG_PREP_THREADS 256
#define DG_FULL 0xffffffffu

/* ================================================================ device helpers */

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

/* qva_int8_round. */
static __device__ __forceinline__ int8_t dg_int8_round(float y) {
    if (isnan(y)) return 0;
    if (y >= 127.0f) return 127;
    if (y <= -127.0f) return -127;
    return (int8_t)(int)roundf(y);
}

/* qva_nvfp4_tensor_scale. */
static __device__ __forceinline__ float dg_tensor_scale(float amax) {
    if (!isfinite(amax)) return 1.0f;
    const float g = __fdiv_rn(amax, 2688.0f);
    return g > 0.0f ? g : 1.0f;
}

/* nvfp4_group + nvfp4_group_unscaled of src/cpu/formats.c on 16 values:
 * out = sigma * e2m1(x / (g * sigma)). */
static __device__ __forceinline__ void dg_nvfp4_group(float *x, float g) {
    float amax = 0.0f;
#pragma unroll
    for (int u = 0; u < 16; ++u) amax = fmaxf(amax, fabsf(x[u]));
    const float sigma = dg_e4m3_decode(dg_e4m3(__fdiv_rn(amax, __fmul_rn(6.0f, g))));
    const float denom = __fmul_rn(g, sigma);
#pragma unroll
    for (int u = 0; u < 16; ++u) {
        const uint32_t code = sigma == 0.0f ? 0u : dg_e2m1(__fdiv_rn(x[u], denom));
        x[u] = __fmul_rn(sigma, dg_e2m1_decode(code));
    }
}

template <int F16>
static __device__ __forceinline__ uint16_t dg_round16(float a) {
    if constexpr (F16)
        return __half_as_ushort(__float2half_rn(a));
    else
        return __bfloat16_as_ushort(__float2bfloat16_rn(a));
}

/* BF16 bits of a value BF16 holds exactly. */
static __device__ __forceinline__ uint16_t dg_bf16_bits(float a) {
    return (uint16_t)(__float_as_uint(a) >> 16);
}

/* ================================================================ operands */

typedef struct dg_ops {
    int BH, R, D, with4, with8;
    int64_t n_pack;
    uint16_t *q16, *k16, *v16t;
    uint16_t *q4, *k4, *v4t;
    float *g4;
    int8_t *q8, *k8;
    float *q8s, *k8s;
    uint8_t *v8t;
    float *dv;
    float *amax; /* [3][BH][R][D] scratch: channel amax of each region, Q K V */
} dg_ops;

/* ---- prep kernels: one CTA of 2*D threads per (128-slot block, bh) ----
 *
 * Rows of the user view are read in chunks of 8 channels (16-byte loads
 * where dg_vec_ok holds, else scalar), so the 16 (D 128) or 8 (D 64) lanes
 * of a row read it in one coalesced piece and share its pack index (a
 * broadcast load).  Thread t keeps chunk c = 8 (t % (D/8)) and takes the
 * rows t / (D/8) + 16 k: with 2*D threads the trip counts are constants
 * for both D, so the loops unroll without branches and no load waits on
 * another's result but its pack index (a padding slot reads row 0 and is
 * replaced by +0 afterwards); ptxas then keeps 2-8 row loads per thread in
 * flight.  The channel amax is a running max per thread, reduced once.
 * Transposed outputs go through a shared tile of 32-bit words, XOR
 * swizzled by chunk (dg_swz): a warp's column writes then hit 32 distinct
 * banks and the row reads stay 16-byte vectors.  Every value is the old
 * per-element expression, so the outputs are unchanged bit for bit. */

#define DG_CPR_LG(D) ((D) == 128 ? 4 : 3) /* log2 of the 8-channel chunks per row */
#define DG_RSTEP 16                       /* rows (or tile words) between a thread's tasks */

/* Channels off .. off+7 of a user view, widened to f32 exactly (qvc_ld).
 * VEC: off is 16-byte aligned (dg_vec_ok). */
template <int DT, bool VEC>
static __device__ __forceinline__ void dg_ld8(const void *p, int64_t off, float *x) {
    if constexpr (VEC && DT == QVA_F32) {
        const float4 a = __ldg((const float4 *)((const float *)p + off));
        const float4 b = __ldg((const float4 *)((const float *)p + off) + 1);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
        x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    } else if constexpr (VEC) {
        const uint4 u = __ldg((const uint4 *)((const unsigned short *)p + off));
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (DT == QVA_BF16) {
                x[2 * i] = __uint_as_float(w[i] << 16);
                x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
            } else {
                x[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xFFFFu)));
                x[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = qvc_ld<DT>(p, off + i);
    }
}

/* x = +0 where the slot is padding. */
static __device__ __forceinline__ void dg_mask8(float *x, bool valid) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = valid ? x[i] : 0.0f;
}

/* Two 16-bit RNE values in one word, a at the lower address. */
template <int F16>
static __device__ __forceinline__ uint32_t dg_pair16(float a, float b) {
    return (uint32_t)dg_round16<F16>(a) | ((uint32_t)dg_round16<F16>(b) << 16);
}

/* Tile row c stores logical word j at j ^ dg_swz(c).  A warp's column
 * write covers D/8 chunks x 256/D consecutive words (the lowest a multiple
 * of 256/D), so chunk * 256/D spreads the 32 lanes over all banks. */
static __device__ __forceinline__ int dg_swz(int c, int lg) { return (c >> 3) << (5 - lg); }

/* Logical words 4q .. 4q+3 of a swizzled tile row (s = its dg_swz, even):
 * one aligned 16-byte group, its two halves swapped when s & 2. */
static __device__ __forceinline__ uint4 dg_tile_ld(const uint32_t *row, int q, int s) {
    const uint4 u = *(const uint4 *)(row + ((4 * q) ^ (s & ~3)));
    return (s & 2) ? make_uint4(u.z, u.w, u.x, u.y) : u;
}

/* out[0..D) = channel max over the CTA of m (this thread's chunk).  The
 * values are |x| >= 0 and never NaN (fmaxf drops NaN), so any reduction
 * order gives the same bits. */
static __device__ __forceinline__ void dg_amax_store(const float *m, int D, int lg, float *out) {
    __shared__ float red[DG_PREP_THREADS / 32][128]; /* [warp][channel] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float r[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) r[e] = m[e];
    for (int o = 1 << lg; o < 32; o <<= 1) /* the lanes with the same chunk */
#pragma unroll
        for (int e = 0; e < 8; ++e) r[e] = fmaxf(r[e], __shfl_xor_sync(DG_FULL, r[e], o));
    if (lane < (1 << lg))
#pragma unroll
        for (int e = 0; e < 8; ++e) red[warp][lane * 8 + e] = r[e];
    __syncthreads();
    if ((int)threadIdx.x < D) {
        float a = red[0][threadIdx.x];
        for (int w = 1; w < D / 16; ++w) a = fmaxf(a, red[w][threadIdx.x]);
        out[threadIdx.x] = a;
    }
}

/* Q, K 16-bit rows [slot][D].  amax (low-bit calls): the channel amax of
 * each video block (blk >= pblk) into amax[bh][blk - pblk][D].  Padding
 * slots (pack -1) give +0, which leaves the max alone; partition.c puts
 * a region's count cells first, so the rest are exactly its valid tokens. */
template <int DT, int F16, bool VEC>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_pack16_kernel(qvc_view x, const int32_t *pack, int64_t n_pack, int pblk, int R, uint16_t *dst,
                 float *amax) {
    const int blk = blockIdx.x, bh = blockIdx.y, D = (int)x.D, lg = DG_CPR_LG(D);
    const int c = (threadIdx.x & ((1 << lg) - 1)) * 8, r0 = threadIdx.x >> lg;
    const int64_t base = qvc_head_base(x, bh);
    const int32_t *pk = pack + (int64_t)blk * DG_KEYS + r0;
    int32_t orig[8];
    float v[8][8];
#pragma unroll
    for (int k = 0; k < 8; ++k) orig[k] = __ldg(pk + k * DG_RSTEP);
#pragma unroll
    for (int k = 0; k < 8; ++k)
        dg_ld8<DT, VEC>(x.data, base + (int64_t)max(orig[k], 0) * x.sn + c, v[k]);
    uint16_t *o = dst + ((int64_t)bh * n_pack + (int64_t)blk * DG_KEYS + r0) * D + c;
    float m[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        dg_mask8(v[k], orig[k] >= 0);
        *(uint4 *)(o + k * DG_RSTEP * D) =
            make_uint4(dg_pair16<F16>(v[k][0], v[k][1]), dg_pair16<F16>(v[k][2], v[k][3]),
                       dg_pair16<F16>(v[k][4], v[k][5]), dg_pair16<F16>(v[k][6], v[k][7]));
#pragma unroll
        for (int e = 0; e < 8; ++e) m[e] = fmaxf(m[e], fabsf(v[k][e]));
    }
    if (amax && blk >= pblk) dg_amax_store(m, D, lg, amax + ((int64_t)bh * R + (blk - pblk)) * D);
}

/* V 16-bit transposed [blk][D][128], amax as dg_pack16_kernel.  A task is
 * keys 2j, 2j+1 x one chunk: per channel the two values are tile word j of
 * row c (little-endian: key 2j first); the tile rows then go out whole. */
template <int DT, int F16, bool VEC>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_pack16t_kernel(qvc_view x, const int32_t *pack, int64_t n_pack, int pblk, int R, uint16_t *dst,
                  float *amax) {
    __shared__ __align__(16) uint32_t tile[128 * (DG_KEYS / 2)]; /* [c][key pair], swizzled */
    const int blk = blockIdx.x, bh = blockIdx.y, D = (int)x.D, lg = DG_CPR_LG(D);
    const int c = (threadIdx.x & ((1 << lg) - 1)) * 8, j0 = threadIdx.x >> lg;
    const int64_t base = qvc_head_base(x, bh);
    const int32_t *pk = pack + (int64_t)blk * DG_KEYS + 2 * j0;
    int32_t orig[4][2];
    float v[4][2][8];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int h = 0; h < 2; ++h) orig[k][h] = __ldg(pk + 2 * k * DG_RSTEP + h);
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            dg_ld8<DT, VEC>(x.data, base + (int64_t)max(orig[k][h], 0) * x.sn + c, v[k][h]);
    const int s = dg_swz(c, lg);
    float m[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int j = j0 + k * DG_RSTEP;
        dg_mask8(v[k][0], orig[k][0] >= 0);
        dg_mask8(v[k][1], orig[k][1] >= 0);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            tile[(c + e) * (DG_KEYS / 2) + (j ^ s)] = dg_pair16<F16>(v[k][0][e], v[k][1][e]);
            m[e] = fmaxf(m[e], fmaxf(fabsf(v[k][0][e]), fabsf(v[k][1][e])));
        }
    }
    __syncthreads();
    uint4 *o = (uint4 *)(dst + ((int64_t)bh * n_pack + (int64_t)blk * DG_KEYS) * D);
#pragma unroll
    for (int k = 0; k < 8; ++k) { /* D * 16 pieces of 16 bytes, row cc = t / 16 */
        const int t = threadIdx.x + k * 2 * D, cc = t >> 4;
        o[t] = dg_tile_ld(tile + cc * (DG_KEYS / 2), t & 15, dg_swz(cc, lg));
    }
    if (amax && blk >= pblk) dg_amax_store(m, D, lg, amax + ((int64_t)bh * R + (blk - pblk)) * D);
}

/* Per (tensor w, head): the channel amax over all regions; V's gives the
 * channel scales delta_c = amax/2.25 (1 if zero), and with NVFP4 each
 * tensor scale comes from the max over channels.  Thread = 4 channels of
 * every (DG_SCALE_THREADS / (D/4))-th region; a max in any order (values
 * >= 0, never NaN) is the serial loop's bits. */
#define DG_SCALE_THREADS 512
__global__ void __launch_bounds__(DG_SCALE_THREADS)
dg_scale_kernel(const float *amax, int BH, int R, int D, int w0, int with4, int with8, float *g4,
                float *dv) {
    __shared__ __align__(16) float red[DG_SCALE_THREADS * 4]; /* [slice][D] */
    __shared__ float wm[DG_SCALE_THREADS / 32];
    const int w = w0 + (int)blockIdx.x, bh = blockIdx.y, t = threadIdx.x;
    const int c4 = D / 4, q = t % c4, slice = t / c4, slices = DG_SCALE_THREADS / c4;
    const float4 *am = (const float4 *)(amax + ((int64_t)w * BH + bh) * R * D) + q;
    float4 m = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int a = slice; a < R; a += slices) {
        const float4 u = __ldg(am + (int64_t)a * c4);
        m.x = fmaxf(m.x, u.x), m.y = fmaxf(m.y, u.y), m.z = fmaxf(m.z, u.z), m.w = fmaxf(m.w, u.w);
    }
    *(float4 *)&red[slice * D + 4 * q] = m;
    __syncthreads();
    float cm = 0.0f;
    if (t < D) {
        for (int sl = 0; sl < slices; ++sl) cm = fmaxf(cm, red[sl * D + t]);
        if (w == 2 && with8) {
            const float sc = __fdiv_rn(cm, 2.25f); /* v_channel_scale, no means */
            dv[(int64_t)bh * D + t] = sc > 0.0f ? sc : 1.0f;
        }
    }
    if (with4) {
        for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(DG_FULL, cm, o));
        if ((t & 31) == 0) wm[t >> 5] = cm;
        __syncthreads();
        if (t == 0) {
            float tm = 0.0f;
            for (int i = 0; i < DG_SCALE_THREADS / 32; ++i) tm = fmaxf(tm, wm[i]);
            g4[(int64_t)bh * 3 + w] = dg_tensor_scale(tm);
        }
    }
}

/* INT8 codes of Q or K for one region block, and its delta
 * amax/127 + 1e-7 (the block amax = the max of its channel amax, which
 * dg_pack16_kernel wrote) into delta[bh][a]. */
template <int DT, bool VEC>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_int8_kernel(qvc_view x, const int32_t *pack, const int32_t *count, int64_t prefix_pad, int R,
               const float *amax, float *delta, int8_t *codes) {
    const int a = blockIdx.x, bh = blockIdx.y, D = (int)x.D, n = count[a], lg = DG_CPR_LG(D);
    const int c = (threadIdx.x & ((1 << lg) - 1)) * 8, r0 = threadIdx.x >> lg;
    const int64_t base = qvc_head_base(x, bh), slot0 = prefix_pad + (int64_t)a * DG_KEYS;
    const int64_t blk = (int64_t)bh * R + a;
    int32_t orig[8];
    float v[8][8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int i = r0 + k * DG_RSTEP;
        orig[k] = i < n ? __ldg(pack + slot0 + i) : 0;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) dg_ld8<DT, VEC>(x.data, base + (int64_t)orig[k] * x.sn + c, v[k]);
    float bm = 0.0f; /* every warp reduces the D channel values itself */
    for (int i = threadIdx.x & 31; i < D; i += 32) bm = fmaxf(bm, __ldg(amax + blk * D + i));
    for (int o = 16; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(DG_FULL, bm, o));
    const float dl = __fadd_rn(__fdiv_rn(bm, 127.0f), 1e-7f);
    if (threadIdx.x == 0) delta[blk] = dl;
    int8_t *o = codes + (blk * DG_KEYS + r0) * D + c;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        dg_mask8(v[k], r0 + k * DG_RSTEP < n);
        uint32_t w[2] = {0u, 0u};
#pragma unroll
        for (int e = 0; e < 8; ++e)
            w[e >> 2] |= (uint32_t)(uint8_t)dg_int8_round(__fdiv_rn(v[k][e], dl)) << (8 * (e & 3));
        *(uint2 *)(o + k * DG_RSTEP * D) = make_uint2(w[0], w[1]);
    }
}

/* E4M3 codes of V / delta_c for one region block, transposed [D][128] in
 * the PV slot order.  Tile word w of row c holds slots 4w .. 4w+3 (keys
 * k0, k0+1, k0+8, k0+9 by qvc_pv_slot_key, k0 = 16 (w/4) + 2 (w%4)); a task
 * is those 4 keys x one chunk. */
template <int DT, bool VEC>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_v8_kernel(qvc_view x, const int32_t *pack, const int32_t *count, int64_t prefix_pad, int R,
             const float *dv, uint8_t *v8t) {
    __shared__ __align__(16) uint32_t tile[128 * (DG_KEYS / 4)]; /* [c][slot quad], swizzled */
    const int a = blockIdx.x, bh = blockIdx.y, D = (int)x.D, n = count[a], lg = DG_CPR_LG(D);
    const int c = (threadIdx.x & ((1 << lg) - 1)) * 8, w0 = threadIdx.x >> lg;
    const int64_t base = qvc_head_base(x, bh), slot0 = prefix_pad + (int64_t)a * DG_KEYS;
    int key[2][4], orig[2][4];
    float v[2][4][8];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int w = w0 + k * DG_RSTEP;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int slot = 4 * w + u;
            key[k][u] = (slot & ~31) + qvc_pv_slot_key(slot & 31);
            orig[k][u] = key[k][u] < n ? __ldg(pack + slot0 + key[k][u]) : 0;
        }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int u = 0; u < 4; ++u)
            dg_ld8<DT, VEC>(x.data, base + (int64_t)orig[k][u] * x.sn + c, v[k][u]);
    float d[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) d[e] = __ldg(dv + (int64_t)bh * D + c + e);
    const int s = dg_swz(c, lg);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int w = w0 + k * DG_RSTEP;
#pragma unroll
        for (int u = 0; u < 4; ++u) dg_mask8(v[k][u], key[k][u] < n);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            uint32_t word = 0u;
#pragma unroll
            for (int u = 0; u < 4; ++u) word |= dg_e4m3(__fdiv_rn(v[k][u][e], d[e])) << (8 * u);
            tile[(c + e) * (DG_KEYS / 4) + (w ^ s)] = word;
        }
    }
    __syncthreads();
    uint4 *o = (uint4 *)(v8t + ((int64_t)bh * R + a) * D * DG_KEYS);
#pragma unroll
    for (int k = 0; k < 4; ++k) { /* D * 8 pieces of 16 bytes, row cc = t / 8 */
        const int t = threadIdx.x + k * 2 * D, cc = t >> 3;
        o[t] = dg_tile_ld(tile + cc * (DG_KEYS / 4), t & 7, dg_swz(cc, lg));
    }
}

/* NVFP4 of Q or K (groups of 16 channels of a row), BF16 reconstructions. */
template <int DT>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_fp4_rows_kernel(qvc_view x, const int32_t *pack, const int32_t *count, int64_t prefix_pad,
                   int R, const float *g4, int which, uint16_t *dst) {
    const int a = blockIdx.x, bh = blockIdx.y, D = (int)x.D, G = D / 16, n = count[a];
    const int64_t base = qvc_head_base(x, bh), slot0 = prefix_pad + (int64_t)a * DG_KEYS;
    const float g = g4[(int64_t)bh * 3 + which];
    for (int idx = threadIdx.x; idx < DG_KEYS * G; idx += DG_PREP_THREADS) {
        const int i = idx / G, grp = idx % G;
        float v[16];
        const int64_t row = i < n ? base + (int64_t)__ldg(pack + slot0 + i) * x.sn : -1;
#pragma unroll
        for (int u = 0; u < 16; ++u) v[u] = row >= 0 ? qvc_ld<DT>(x.data, row + grp * 16 + u) : 0.0f;
        dg_nvfp4_group(v, g);
        uint16_t *o = dst + (((int64_t)bh * R + a) * DG_KEYS + i) * D + grp * 16;
#pragma unroll
        for (int u = 0; u < 16; ++u) o[u] = dg_bf16_bits(v[u]);
    }
}

/* NVFP4 of V (groups of 16 keys of a channel), transposed [D][128]. */
template <int DT>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_fp4_cols_kernel(qvc_view x, const int32_t *pack, const int32_t *count, int64_t prefix_pad,
                   int R, const float *g4, uint16_t *dst) {
    const int a = blockIdx.x, bh = blockIdx.y, D = (int)x.D, n = count[a];
    const int64_t base = qvc_head_base(x, bh), slot0 = prefix_pad + (int64_t)a * DG_KEYS;
    const float g = g4[(int64_t)bh * 3 + 2];
    for (int idx = threadIdx.x; idx < D * (DG_KEYS / 16); idx += DG_PREP_THREADS) {
        const int c = idx % D, grp = idx / D;
        float v[16];
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            const int key = grp * 16 + u;
            v[u] = key < n ? qvc_ld<DT>(x.data, base + (int64_t)__ldg(pack + slot0 + key) * x.sn + c)
                           : 0.0f;
        }
        dg_nvfp4_group(v, g);
        uint16_t *o = dst + (((int64_t)bh * R + a) * D + c) * DG_KEYS + grp * 16;
#pragma unroll
        for (int u = 0; u < 16; ++u) o[u] = dg_bf16_bits(v[u]);
    }
}

/* ================================================================ the phased kernel */

typedef struct dg_params {
    dg_ops ops;
    int R;
    int64_t n_pack, prefix_pad;
    int prefix;
    const int32_t *count, *pack, *offsets, *cols;
    float scale_log2, eta;
    int expcast;
    qvc_attn_args a;
} dg_params;

/* One online-softmax state of the thread's two rows (g and g + 8). */
template <int D>
struct dg_acc {
    float o[D / 8][4];
    float m[2], l[2];
};

/* Shared tiles: 16-bit (K [128][D+8], V^T [D][136]) or 8-bit (K
 * [128][D+16], V^T [D][144]) in one dynamic buffer. */
template <int D>
static constexpr int dg_smem16_k(void) { return DG_KEYS * (D + DG_PAD16) * 2; }
template <int D>
static constexpr int dg_smem_bytes(void) {
    return dg_smem16_k<D>() + D * (DG_KEYS + DG_PAD16) * 2;
}

/* Loads a 16-bit K block [128][D] and V^T block [D][128] into the tiles. */
template <int D>
static __device__ __forceinline__ void dg_load16(unsigned char *smem, const uint16_t *kg,
                                                 const uint16_t *vg) {
    uint16_t *kt = (uint16_t *)smem, *vt = (uint16_t *)(smem + dg_smem16_k<D>());
    __syncthreads(); /* every warp is done with the previous tiles */
    for (int i = threadIdx.x; i < DG_KEYS * D / 8; i += DG_THREADS) {
        const int r = i / (D / 8), c = (i % (D / 8)) * 8;
        qvc_cp_async16(kt + r * (D + DG_PAD16) + c, kg + (size_t)r * D + c);
    }
    for (int i = threadIdx.x; i < D * DG_KEYS / 8; i += DG_THREADS) {
        const int r = i / (DG_KEYS / 8), c = (i % (DG_KEYS / 8)) * 8;
        qvc_cp_async16(vt + r * (DG_KEYS + DG_PAD16) + c, vg + (size_t)r * DG_KEYS + c);
    }
    qvc_cp_async_wait_all();
    __syncthreads();
}

/* Loads an INT8 K block [128][D] and E4M3 V^T block [D][128]. */
template <int D>
static __device__ __forceinline__ void dg_load8(unsigned char *smem, const int8_t *kg,
                                                const uint8_t *vg) {
    uint8_t *kt = smem, *vt = smem + DG_KEYS * (D + DG_PAD8);
    __syncthreads();
    for (int i = threadIdx.x; i < DG_KEYS * D / 16; i += DG_THREADS) {
        const int r = i / (D / 16), c = (i % (D / 16)) * 16;
        qvc_cp_async16(kt + r * (D + DG_PAD8) + c, (const uint8_t *)kg + (size_t)r * D + c);
    }
    for (int i = threadIdx.x; i < D * DG_KEYS / 16; i += DG_THREADS) {
        const int r = i / (DG_KEYS / 16), c = (i % (DG_KEYS / 16)) * 16;
        qvc_cp_async16(vt + r * (DG_KEYS + DG_PAD8) + c, vg + (size_t)r * DG_KEYS + c);
    }
    qvc_cp_async_wait_all();
    __syncthreads();
}

/* Keys at or past `valid` of the block score -inf (padding slots). */
static __device__ __forceinline__ void dg_mask(float (&s)[DG_KEYS / 8][4], int valid) {
    if (valid >= DG_KEYS) return;
    const int tig = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < DG_KEYS / 8; ++nt) {
        const int key = nt * 8 + 2 * tig;
        if (key >= valid) s[nt][0] = s[nt][2] = -INFINITY;
        if (key + 1 >= valid) s[nt][1] = s[nt][3] = -INFINITY;
    }
}

/* qvi_row_raise_max for both rows. */
template <int D>
static __device__ __forceinline__ void dg_raise(dg_acc<D> &r, const float (&s)[DG_KEYS / 8][4]) {
    float mx[2];
    qvc_softmax_row_max(s, r.m, mx);
    qvc_softmax_raise<QVC_SM_EXACT_MUL>(mx, r.m, r.l, r.o);
}

/* Q rows (g, g+8) of a 16-bit [rows][D] operand as m16n8k16 A fragments. */
template <int D>
static __device__ __forceinline__ void dg_qfrag16(uint32_t (&qf)[D / 16][4], const uint16_t *rowg) {
    const int tig = threadIdx.x & 3;
    const uint16_t *qg = rowg + 2 * tig;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
        qf[kc][0] = __ldg((const uint32_t *)(qg + kc * 16));
        qf[kc][1] = __ldg((const uint32_t *)(qg + 8 * D + kc * 16));
        qf[kc][2] = __ldg((const uint32_t *)(qg + kc * 16 + 8));
        qf[kc][3] = __ldg((const uint32_t *)(qg + 8 * D + kc * 16 + 8));
    }
}

/* S = (Q K^T) * f on a 16-bit K tile, padding masked. */
template <int D, int F16>
static __device__ __forceinline__ void dg_scores16(float (&s)[DG_KEYS / 8][4],
                                                   const uint32_t (&qf)[D / 16][4],
                                                   const unsigned char *smem, float f, int valid) {
    const uint16_t *kt = (const uint16_t *)smem;
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int nt = 0; nt < DG_KEYS / 8; ++nt) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint16_t *kr = kt + (nt * 8 + g) * (D + DG_PAD16) + 2 * tig;
#pragma unroll
        for (int kc = 0; kc < D / 16; ++kc)
            qvc_mma16<F16>(acc, qf[kc], qvc_lds32(kr + kc * 16), qvc_lds32(kr + kc * 16 + 8));
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = __fmul_rn(acc[e], f);
    }
    dg_mask(s, valid);
}

/* ---- 16-bit phase: one block (qvi_pv_16) ---- */
template <int D, int F16>
static __device__ __forceinline__ void dg_block16(dg_acc<D> &r, const uint32_t (&qf)[D / 16][4],
                                                  unsigned char *smem, const uint16_t *kg,
                                                  const uint16_t *vg, int valid, float f) {
    dg_load16<D>(smem, kg, vg);
    float s[DG_KEYS / 8][4];
    dg_scores16<D, F16>(s, qf, smem, f, valid);
    dg_raise<D>(r, s);
    const float mr0 = qvc_softmax_shift(r.m[0]), mr1 = qvc_softmax_shift(r.m[1]);
    uint32_t pa[DG_KEYS / 16][4];
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < DG_KEYS / 16; ++c) {
        const float *lo = s[2 * c], *hi = s[2 * c + 1];
        const float p0 = exp2f(__fsub_rn(lo[0], mr0)), p1 = exp2f(__fsub_rn(lo[1], mr0));
        const float p2 = exp2f(__fsub_rn(lo[2], mr1)), p3 = exp2f(__fsub_rn(lo[3], mr1));
        const float p4 = exp2f(__fsub_rn(hi[0], mr0)), p5 = exp2f(__fsub_rn(hi[1], mr0));
        const float p6 = exp2f(__fsub_rn(hi[2], mr1)), p7 = exp2f(__fsub_rn(hi[3], mr1));
        rs[0] = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(rs[0], p0), p1), p4), p5);
        rs[1] = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(rs[1], p2), p3), p6), p7);
        pa[c][0] = qvc_pack2<F16>(p0, p1);
        pa[c][1] = qvc_pack2<F16>(p2, p3);
        pa[c][2] = qvc_pack2<F16>(p4, p5);
        pa[c][3] = qvc_pack2<F16>(p6, p7);
    }
    r.l[0] = __fadd_rn(r.l[0], qvc_quad_sum(rs[0]));
    r.l[1] = __fadd_rn(r.l[1], qvc_quad_sum(rs[1]));
    const uint16_t *vt = (const uint16_t *)(smem + dg_smem16_k<D>());
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint16_t *vr = vt + (n * 8 + g) * (DG_KEYS + DG_PAD16) + 2 * tig;
#pragma unroll
        for (int c = 0; c < DG_KEYS / 16; ++c)
            qvc_mma16<F16>(part, pa[c], qvc_lds32(vr + c * 16), qvc_lds32(vr + c * 16 + 8));
#pragma unroll
        for (int e = 0; e < 4; ++e) r.o[n][e] = __fadd_rn(r.o[n][e], part[e]);
    }
}

/* ---- NVFP4 phase: one block (qvi_scores_f32 on the reconstructions,
 * qvi_pv_nvfp4 with vscale = g_V) ---- */

/* Piece k (0, 1, 2) of the exact split x = hi + mid + lo into BF16 values
 * (truncations: each piece carries the next 8 significant bits). */
static __device__ __forceinline__ float dg_split(float x, int k) {
    const float hi = __uint_as_float(__float_as_uint(x) & 0xFFFF0000u);
    if (k == 0) return hi;
    const float r = __fsub_rn(x, hi); /* exact */
    const float mid = __uint_as_float(__float_as_uint(r) & 0xFFFF0000u);
    return k == 1 ? mid : __fsub_rn(r, mid); /* exact, <= 8 bits */
}
static __device__ __forceinline__ uint32_t dg_pack_split(float a, float b, int k) {
    return (__float_as_uint(dg_split(a, k)) >> 16) | (__float_as_uint(dg_split(b, k)) & 0xFFFF0000u);
}

/* DA2 Eq. 24 on one 16-key group of one row held by a quad (4 values per
 * thread): sigma = e4m3(448 max p), p = (sigma/2688) e2m1(2688 p / sigma). */
static __device__ __forceinline__ float dg_prob4(float p, float sigma, float step) {
    return sigma == 0.0f
               ? 0.0f
               : __fmul_rn(step, dg_e2m1_decode(dg_e2m1(__fdiv_rn(__fmul_rn(2688.0f, p), sigma))));
}
static __device__ __forceinline__ void dg_probs16(float &p0, float &p1, float &p2, float &p3) {
    const float pm = qvc_quad_max(fmaxf(fmaxf(p0, p1), fmaxf(p2, p3))); /* p >= 0 */
    const float sigma = dg_e4m3_decode(dg_e4m3(__fmul_rn(448.0f, pm)));
    const float step = __fdiv_rn(sigma, 2688.0f);
    p0 = dg_prob4(p0, sigma, step);
    p1 = dg_prob4(p1, sigma, step);
    p2 = dg_prob4(p2, sigma, step);
    p3 = dg_prob4(p3, sigma, step);
}

template <int D>
static __device__ __forceinline__ void dg_block4(dg_acc<D> &r, const uint32_t (&qf)[D / 16][4],
                                                 unsigned char *smem, const uint16_t *kg,
                                                 const uint16_t *vg, int valid, float f, float gv) {
    dg_load16<D>(smem, kg, vg);
    float s[DG_KEYS / 8][4];
    dg_scores16<D, 0>(s, qf, smem, f, valid);
    dg_raise<D>(r, s);
    const float mr[2] = {qvc_softmax_shift(r.m[0]), qvc_softmax_shift(r.m[1])};
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < DG_KEYS / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[nt][e] = exp2f(__fsub_rn(s[nt][e], mr[e >> 1])); /* -inf -> 0 */
            rs[e >> 1] = __fadd_rn(rs[e >> 1], s[nt][e]);
        }
    r.l[0] = __fadd_rn(r.l[0], qvc_quad_sum(rs[0])); /* before the conversion */
    r.l[1] = __fadd_rn(r.l[1], qvc_quad_sum(rs[1]));
#pragma unroll
    for (int c = 0; c < DG_KEYS / 16; ++c) {
        dg_probs16(s[2 * c][0], s[2 * c][1], s[2 * c + 1][0], s[2 * c + 1][1]); /* row g */
        dg_probs16(s[2 * c][2], s[2 * c][3], s[2 * c + 1][2], s[2 * c + 1][3]); /* row g + 8 */
    }
    uint32_t pa[3][DG_KEYS / 16][4];
#pragma unroll
    for (int k = 0; k < 3; ++k)
#pragma unroll
        for (int c = 0; c < DG_KEYS / 16; ++c) {
            const float *lo = s[2 * c], *hi = s[2 * c + 1];
            pa[k][c][0] = dg_pack_split(lo[0], lo[1], k);
            pa[k][c][1] = dg_pack_split(lo[2], lo[3], k);
            pa[k][c][2] = dg_pack_split(hi[0], hi[1], k);
            pa[k][c][3] = dg_pack_split(hi[2], hi[3], k);
        }
    const uint16_t *vt = (const uint16_t *)(smem + dg_smem16_k<D>());
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint16_t *vr = vt + (n * 8 + g) * (DG_KEYS + DG_PAD16) + 2 * tig;
#pragma unroll
        for (int c = 0; c < DG_KEYS / 16; ++c) {
            const uint32_t b0 = qvc_lds32(vr + c * 16), b1 = qvc_lds32(vr + c * 16 + 8);
#pragma unroll
            for (int k = 0; k < 3; ++k) qvc_mma_bf16(part, pa[k][c], b0, b1);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) r.o[n][e] = __fadd_rn(r.o[n][e], __fmul_rn(part[e], gv));
    }
}

/* ---- INT8 phase: one block (qvi_scores_i8, qvi_pv_e4m3 with FP16
 * partials) ---- */

/* Two scores -> two E4M3 P codes (low byte first); the exp path adds the
 * FP32 amplified weights to *rowsum. */
static __device__ __forceinline__ uint32_t dg_pcodes2(float s0, float s1, float m, int expcast,
                                                      float *rowsum) {
    if (expcast) return qvc_expcast_code(__fsub_rn(s0, m)) | (qvc_expcast_code(__fsub_rn(s1, m)) << 8);
    const float p0 = exp2f(__fadd_rn(__fsub_rn(s0, m), QVI_SAGE_P_OFFSET));
    const float p1 = exp2f(__fadd_rn(__fsub_rn(s1, m), QVI_SAGE_P_OFFSET));
    *rowsum = __fadd_rn(__fadd_rn(*rowsum, p0), p1);
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(p0, p1), __NV_SATFINITE, __NV_E4M3);
}

template <int D>
static __device__ __forceinline__ void dg_block8(dg_acc<D> &r, const uint32_t (&qf)[D / 32][4],
                                                 unsigned char *smem, const int8_t *kg,
                                                 const uint8_t *vg, int valid, float f,
                                                 int expcast) {
    dg_load8<D>(smem, kg, vg);
    const uint8_t *kt = smem, *vt = smem + DG_KEYS * (D + DG_PAD8);
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    float s[DG_KEYS / 8][4];
#pragma unroll
    for (int nt = 0; nt < DG_KEYS / 8; ++nt) {
        int acc[4] = {0, 0, 0, 0};
#pragma unroll
        for (int kc = 0; kc < D / 32; ++kc) {
            const uint8_t *kr = kt + (nt * 8 + g) * (D + DG_PAD8) + kc * 32 + tig * 4;
            qvc_mma_s8(acc, qf[kc], qvc_lds32(kr), qvc_lds32(kr + 16));
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = __fmul_rn((float)acc[e], f);
    }
    dg_mask(s, valid);
    dg_raise<D>(r, s);
    const float mr0 = qvc_softmax_shift(r.m[0]), mr1 = qvc_softmax_shift(r.m[1]);
    uint32_t pa[DG_KEYS / 32][4];
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int c = 0; c < DG_KEYS / 32; ++c) {
        const uint32_t lo0 = dg_pcodes2(s[4 * c][0], s[4 * c][1], mr0, expcast, &rs[0]);
        const uint32_t hi0 = dg_pcodes2(s[4 * c + 1][0], s[4 * c + 1][1], mr0, expcast, &rs[0]);
        const uint32_t lo1 = dg_pcodes2(s[4 * c][2], s[4 * c][3], mr1, expcast, &rs[1]);
        const uint32_t hi1 = dg_pcodes2(s[4 * c + 1][2], s[4 * c + 1][3], mr1, expcast, &rs[1]);
        const uint32_t lo2 = dg_pcodes2(s[4 * c + 2][0], s[4 * c + 2][1], mr0, expcast, &rs[0]);
        const uint32_t hi2 = dg_pcodes2(s[4 * c + 3][0], s[4 * c + 3][1], mr0, expcast, &rs[0]);
        const uint32_t lo3 = dg_pcodes2(s[4 * c + 2][2], s[4 * c + 2][3], mr1, expcast, &rs[1]);
        const uint32_t hi3 = dg_pcodes2(s[4 * c + 3][2], s[4 * c + 3][3], mr1, expcast, &rs[1]);
        pa[c][0] = lo0 | (hi0 << 16);
        pa[c][1] = lo1 | (hi1 << 16);
        pa[c][2] = lo2 | (hi2 << 16);
        pa[c][3] = lo3 | (hi3 << 16);
    }
    if (expcast) { /* the row sum of the decoded codes, from a ones column */
        float ones[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < DG_KEYS / 32; ++c) qvc_mma_e4m3(ones, pa[c], 0x38383838u, 0x38383838u);
        rs[0] = ones[0];
        rs[1] = ones[2];
    } else {
        rs[0] = qvc_quad_sum(rs[0]);
        rs[1] = qvc_quad_sum(rs[1]);
    }
    r.l[0] = __fadd_rn(r.l[0], rs[0]);
    r.l[1] = __fadd_rn(r.l[1], rs[1]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < DG_KEYS / 32; ++c) {
            const uint8_t *vr = vt + (n * 8 + g) * (DG_KEYS + DG_PAD8) + c * 32 + tig * 4;
            qvc_mma_e4m3(part, pa[c], qvc_lds32(vr), qvc_lds32(vr + 16));
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) r.o[n][e] = __fadd_rn(r.o[n][e], qvc_f16_sat(part[e]));
    }
}

/* Eq. 8 unit change: enter (dir 0) divides by eta*delta_c, exit multiplies. */
template <int D>
static __device__ __forceinline__ void dg_phase_scale(dg_acc<D> &r, const float *dv, float eta,
                                                      int enter) {
    const int tig = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float sc = __fmul_rn(eta, dv[n * 8 + 2 * tig + (e & 1)]);
            r.o[n][e] = enter ? __fdiv_rn(r.o[n][e], sc) : __fmul_rn(r.o[n][e], sc);
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) r.l[h] = enter ? __fdiv_rn(r.l[h], eta) : __fmul_rn(r.l[h], eta);
}

/*
 * grid (2 R, BH): CTA x covers rows [64 (x & 1), +64) of video region
 * a = x >> 1 of head bh; warp w rows 16 w + g and + 8 of that half.
 */
template <int D, int F16>
__global__ void __launch_bounds__(DG_THREADS)
attn_draft_mma_64x128(dg_params p) {
    extern __shared__ __align__(16) unsigned char dg_smem[];
    const int bh = blockIdx.y, a = blockIdx.x >> 1, half = blockIdx.x & 1;
    const int cnt = p.count[a];
    if (half * DG_ROWS >= cnt) return; /* only padding rows: uniform exit */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int lr0 = half * DG_ROWS + warp * 16 + g; /* row in the region; and lr0 + 8 */
    const dg_ops &op = p.ops;
    const int R = p.R;
    const int64_t nv = (int64_t)R * DG_KEYS, hr = (int64_t)bh * R;

    dg_acc<D> r;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) r.o[n][0] = r.o[n][1] = r.o[n][2] = r.o[n][3] = 0.0f;
    r.m[0] = r.m[1] = -INFINITY;
    r.l[0] = r.l[1] = 0.0f;

    const int32_t *off = p.offsets + (hr + a) * 3;
    const int32_t e0 = off[0], e1 = off[1], e2 = off[2], e3 = off[3];

    /* 1. NVFP4 blocks */
    if (e1 > e0) {
        uint32_t qf[D / 16][4];
        dg_qfrag16<D>(qf, op.q4 + ((int64_t)bh * nv + (int64_t)a * DG_KEYS + lr0) * D);
        const float f = __fmul_rn(__fmul_rn(op.g4[bh * 3 + 0], op.g4[bh * 3 + 1]), p.scale_log2);
        const float gv = op.g4[bh * 3 + 2];
        for (int i = e0; i < e1; ++i) {
            const int b = p.cols[i];
            dg_block4<D>(r, qf, dg_smem, op.k4 + ((int64_t)bh * nv + (int64_t)b * DG_KEYS) * D,
                         op.v4t + (hr + b) * D * DG_KEYS, p.count[b], f, gv);
        }
    }

    /* 2. INT8 blocks, inside the Eq. 8 unit change (an empty phase has none) */
    if (e2 > e1) {
        const float *dv = op.dv + (int64_t)bh * D;
        dg_phase_scale<D>(r, dv, p.eta, 1);
        uint32_t qf[D / 32][4];
        const uint8_t *qg = (const uint8_t *)op.q8 + ((int64_t)bh * nv + (int64_t)a * DG_KEYS) * D;
#pragma unroll
        for (int kc = 0; kc < D / 32; ++kc) {
            qf[kc][0] = __ldg((const uint32_t *)(qg + (size_t)lr0 * D + kc * 32 + tig * 4));
            qf[kc][1] = __ldg((const uint32_t *)(qg + (size_t)(lr0 + 8) * D + kc * 32 + tig * 4));
            qf[kc][2] = __ldg((const uint32_t *)(qg + (size_t)lr0 * D + kc * 32 + 16 + tig * 4));
            qf[kc][3] = __ldg((const uint32_t *)(qg + (size_t)(lr0 + 8) * D + kc * 32 + 16 + tig * 4));
        }
        const float dq = op.q8s[hr + a];
        for (int i = e1; i < e2; ++i) {
            const int b = p.cols[i];
            const float f = __fmul_rn(__fmul_rn(dq, op.k8s[hr + b]), p.scale_log2);
            dg_block8<D>(r, qf, dg_smem, op.k8 + ((int64_t)bh * nv + (int64_t)b * DG_KEYS) * D,
                         op.v8t + (hr + b) * D * DG_KEYS, p.count[b], f, p.expcast);
        }
        dg_phase_scale<D>(r, dv, p.eta, 0);
    }

    /* 3. 16-bit: every prefix block, then the 16-bit video blocks */
    {
        uint32_t qf[D / 16][4];
        const int64_t hp = (int64_t)bh * p.n_pack;
        dg_qfrag16<D>(qf, op.q16 + (hp + p.prefix_pad + (int64_t)a * DG_KEYS + lr0) * D);
        for (int64_t k0 = 0; k0 < p.prefix_pad; k0 += DG_KEYS) {
            const int64_t left = (int64_t)p.prefix - k0;
            dg_block16<D, F16>(r, qf, dg_smem, op.k16 + (hp + k0) * D, op.v16t + (hp + k0) * D,
                               (int)(left < DG_KEYS ? left : DG_KEYS), p.scale_log2);
        }
        for (int i = e2; i < e3; ++i) {
            const int b = p.cols[i];
            const int64_t k0 = p.prefix_pad + (int64_t)b * DG_KEYS;
            dg_block16<D, F16>(r, qf, dg_smem, op.k16 + (hp + k0) * D, op.v16t + (hp + k0) * D,
                               p.count[b], p.scale_log2);
        }
    }

    /* qvi_row_finish, scattered back to the sequence order */
    const qvc_attn_args &A = p.a;
    const int b = bh / A.H, h = bh % A.H;
    const bool retained = e3 > e0 || p.prefix_pad > 0; /* a kept block, or the prefix */
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int lr = lr0 + 8 * rr;
        if (lr >= cnt) continue;
        const int64_t orig = p.pack[p.prefix_pad + (int64_t)a * DG_KEYS + lr];
        const int kind = qvc_softmax_row(r.m[rr], r.l[rr], retained);
        const float fill = qvc_softmax_fill(kind);
        const int64_t base = b * A.osb + h * A.osh + orig * A.osn;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int col = n * 8 + 2 * tig;
            qvc_store_out(A.out, A.out_dtype, base + col, kind ? fill : __fdiv_rn(r.o[n][2 * rr], r.l[rr]));
            qvc_store_out(A.out, A.out_dtype, base + col + 1, kind ? fill : __fdiv_rn(r.o[n][2 * rr + 1], r.l[rr]));
        }
        if (A.lse && tig == 0)
            A.lse[b * A.lsb + h * A.lsh + orig * A.lsn] =
                kind ? qvc_softmax_lse_fill(kind)
                     : __fmul_rn(__fadd_rn(r.m[rr], log2f(r.l[rr])), 0.69314718055994531f);
    }
}

/* ================================================================ host side */

typedef struct dg_state {
    int lay_key[6];          /* h, w, c, t, prefix, prefix_at_end */
    qvc_draft_layout lay;    /* device layout, valid if lay.pack_to_orig */
    qvc_draft_route_buf route;
    dg_ops ops;
    qvc_ops16 ops16;         /* the dense rows (prefix queries, warm-up) */
    qvc_phase_timer timer;
    /* The operand preparation does not depend on the route, so it runs on
     * a second stream, forked from and joined back into the caller's
     * stream by events, while the router runs on the caller's stream. */
    cudaStream_t side;
    cudaEvent_t fork, join;
} dg_state;

static void dg_ops_free(dg_ops *o) {
    void *ptrs[] = {o->q16, o->k16, o->v16t, o->q4, o->k4, o->v4t, o->g4,
                    o->q8,  o->k8,  o->q8s,  o->k8s, o->v8t, o->dv, o->amax};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(o, 0, sizeof *o);
}

static void dg_state_free(void *ptr) {
    dg_state *s = (dg_state *)ptr;
    if (!s) return;
    qvc_draft_layout_free(&s->lay);
    qvc_draft_route_free(&s->route);
    dg_ops_free(&s->ops);
    qvc_ops16_free(&s->ops16);
    qvc_timer_free(&s->timer);
    if (s->fork) cudaEventDestroy(s->fork);
    if (s->join) cudaEventDestroy(s->join);
    if (s->side) cudaStreamDestroy(s->side);
    free(s);
}

/* The side stream and its two events, made on first use. */
static qva_status dg_side_ensure(dg_state *s) {
    cudaError_t e = cudaSuccess;
    if (!s->side) e = cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking);
    if (e == cudaSuccess && !s->fork) e = cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming);
    if (e == cudaSuccess && !s->join) e = cudaEventCreateWithFlags(&s->join, cudaEventDisableTiming);
    return e == cudaSuccess ? QVA_OK : qvc_cuda_fail(e, "draft: side stream");
}

static dg_state *dg_get_state(qva_context_t *ctx) {
    void (*dtor)(void *) = dg_state_free;
    void **slot = qvi_context_slot(ctx, QVI_SLOT_CUDA_DRAFT, &dtor);
    if (!*slot) *slot = calloc(1, sizeof(dg_state));
    return (dg_state *)*slot;
}

static qva_status dg_ops_ensure(dg_ops *o, int BH, int R, int D, int64_t n_pack, int with4,
                                int with8) {
    if (o->q16 && o->BH == BH && o->R == R && o->D == D && o->n_pack == n_pack &&
        (o->with4 || !with4) && (o->with8 || !with8))
        return QVA_OK;
    dg_ops_free(o);
    o->BH = BH, o->R = R, o->D = D, o->n_pack = n_pack, o->with4 = with4, o->with8 = with8;
    const size_t bh = (size_t)BH, d = (size_t)D, np = (size_t)n_pack, nv = (size_t)R * DG_KEYS;
    const size_t lowbit = (with4 || with8) ? 1 : 0;
    const qvc_alloc req[] = {
        {(void **)&o->q16, bh * np * d * 2},
        {(void **)&o->k16, bh * np * d * 2},
        {(void **)&o->v16t, bh * np * d * 2},
        {(void **)&o->q4, with4 ? bh * nv * d * 2 : 0},
        {(void **)&o->k4, with4 ? bh * nv * d * 2 : 0},
        {(void **)&o->v4t, with4 ? bh * nv * d * 2 : 0},
        {(void **)&o->g4, with4 ? bh * 3 * sizeof(float) : 0},
        {(void **)&o->q8, with8 ? bh * nv * d : 0},
        {(void **)&o->k8, with8 ? bh * nv * d : 0},
        {(void **)&o->q8s, with8 ? bh * (size_t)R * sizeof(float) : 0},
        {(void **)&o->k8s, with8 ? bh * (size_t)R * sizeof(float) : 0},
        {(void **)&o->v8t, with8 ? bh * nv * d : 0},
        {(void **)&o->dv, with8 ? bh * d * sizeof(float) : 0},
        {(void **)&o->amax, lowbit * 3 * bh * (size_t)R * d * sizeof(float)},
    };
    qva_status st = qvc_malloc_all(req, sizeof req / sizeof req[0], "draft operands: cudaMalloc");
    if (st != QVA_OK) dg_ops_free(o);
    return st;
}

static qvc_attn_args dg_args(float scale_log2, const qva_tensor *q, const qva_tensor *out,
                             const qva_tensor *lse, int64_t row0) {
    qvc_attn_args a;
    memset(&a, 0, sizeof a);
    a.scale_log2 = scale_log2;
    a.expcast = 0;
    a.out = (char *)out->data + (size_t)(row0 * out->stride[2]) * qva_dtype_size(out->dtype);
    a.out_dtype = (int)out->dtype;
    a.osb = out->stride[0], a.osh = out->stride[1], a.osn = out->stride[2];
    a.lse = lse ? (float *)lse->data + row0 * lse->stride[2] : NULL;
    a.lsb = lse ? lse->stride[0] : 0, a.lsh = lse ? lse->stride[1] : 0;
    a.lsn = lse ? lse->stride[2] : 0;
    a.H = (int)q->shape[1];
    return a;
}

/* Rows [row0, row0 + rows) of Q against every key, exactly the bf16
 * method (prep16 + attn_bf16 on a row sub-view of Q and of the outputs). */
static qva_status dg_dense_rows(dg_state *s, const qvi_draft_plan *pl, const qva_tensor *q,
                                const qva_tensor *k, const qva_tensor *v, const qva_tensor *out,
                                const qva_tensor *lse, cudaStream_t st) {
    if (pl->dense_rows <= 0) return QVA_OK;
    const int BH = (int)(q->shape[0] * q->shape[1]), D = (int)q->shape[3];
    const int nq = (int)pl->dense_rows, nk = (int)k->shape[2];
    qvc_view qv = qvc_view_of(q);
    qv.data = (const char *)q->data +
              (size_t)(pl->dense_row0 * q->stride[2]) * qva_dtype_size(q->dtype);
    qv.N = nq;
    const qvc_view kv = qvc_view_of(k), vv = qvc_view_of(v);
    qvc_ops16 *o = &s->ops16;
    qva_status r;
    if (!(o->q && o->BH == BH && o->nq == nq && o->nk == nk && o->D == D)) {
        qvc_ops16_free(o);
        if ((r = qvc_ops16_alloc(o, BH, nq, nk, D)) != QVA_OK) return r;
    }
    if ((r = qvc_prep16(&qv, &kv, &vv, pl->use_f16, o, st)) != QVA_OK) return r;
    const qvc_attn_args a = dg_args(pl->scale_log2, q, out, lse, pl->dense_row0);
    return qvc_attn_bf16(o, pl->use_f16, &a, st);
}

/* The device layout of this call's grid and prefix (uploaded once). */
static qva_status dg_layout(dg_state *s, qva_context_t *ctx, const qva_config *cfg,
                            const qvi_draft_plan *pl) {
    const qva_draft_params *dp = &cfg->draft;
    const int key[6] = {dp->grid_h, dp->grid_w, dp->capacity, dp->grid_t, dp->prefix_tokens,
                        dp->prefix_at_end ? 1 : 0};
    if (s->lay.pack_to_orig && !memcmp(key, s->lay_key, sizeof key)) return QVA_OK;
    qvc_draft_layout_free(&s->lay);
    const qvi_partition *part = NULL;
    qvi_partition *owned = NULL;
    qva_status r = qvi_draft_partition_get(ctx, dp->grid_h, dp->grid_w, dp->capacity, &part, &owned);
    if (r != QVA_OK) return r;
    r = qvc_draft_layout_upload(part, dp->grid_t, dp->prefix_tokens, dp->prefix_at_end, &s->lay);
    if (owned) qvi_draft_partition_release(owned);
    if (r != QVA_OK) return r;
    /* The upload copies from pageable memory; make it visible to every
     * stream before the first kernel reads it. */
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        qvc_draft_layout_free(&s->lay);
        return qvc_cuda_fail(e, "draft: layout upload");
    }
    const qvc_draft_layout *L = &s->lay;
    /* Host self-check of what the kernels index by. */
    if (L->regions != pl->regions || L->n != pl->n || L->c != DG_KEYS ||
        L->prefix_pad % DG_KEYS != 0 || L->n_pack != L->prefix_pad + (int64_t)L->regions * DG_KEYS ||
        L->prefix_pad < L->prefix || L->prefix_pad - L->prefix >= DG_KEYS) {
        qva_status bad = qvi_fail(QVA_ERR_SHAPE,
                                  "draft: device layout (R = %d, N = %lld, C = %d, prefix_pad = "
                                  "%lld, n_pack = %lld) disagrees with the plan (R = %lld, N = %lld)",
                                  L->regions, (long long)L->n, L->c, (long long)L->prefix_pad,
                                  (long long)L->n_pack, (long long)pl->regions, (long long)pl->n);
        qvc_draft_layout_free(&s->lay);
        return bad;
    }
    memcpy(s->lay_key, key, sizeof key);
    return QVA_OK;
}

/* 16-byte row loads are legal when the base and every row start are
 * 16-byte aligned (chunks start at multiples of 8 elements). */
static bool dg_vec_ok(const qvc_view *x) {
    const int64_t step = x->dtype == QVA_F32 ? 4 : 8; /* elements per 16 bytes */
    return ((uintptr_t)x->data & 15u) == 0 && x->sb % step == 0 && x->sh % step == 0 &&
           x->sn % step == 0;
}

/* One 16-bit operand (trans: V^T) and, with amax, its channel amax. */
template <int DT, int F16>
static void dg_launch_pack16(const qvc_view &x, const qvc_draft_layout *L, int R, int BH,
                             uint16_t *dst, float *amax, int trans, cudaStream_t st) {
    const dim3 grid((unsigned)(L->n_pack / DG_KEYS), (unsigned)BH);
    const int pblk = (int)(L->prefix_pad / DG_KEYS);
    const int32_t *pk = L->pack_to_orig;
    const int64_t np = L->n_pack;
    const unsigned nt = 2 * (unsigned)x.D;
    const bool vec = dg_vec_ok(&x);
    if (trans && vec)
        dg_pack16t_kernel<DT, F16, true><<<grid, nt, 0, st>>>(x, pk, np, pblk, R, dst, amax);
    else if (trans)
        dg_pack16t_kernel<DT, F16, false><<<grid, nt, 0, st>>>(x, pk, np, pblk, R, dst, amax);
    else if (vec)
        dg_pack16_kernel<DT, F16, true><<<grid, nt, 0, st>>>(x, pk, np, pblk, R, dst, amax);
    else
        dg_pack16_kernel<DT, F16, false><<<grid, nt, 0, st>>>(x, pk, np, pblk, R, dst, amax);
}

/* The 8-bit operand of tensor w (0 Q, 1 K: INT8 and delta; 2 V: E4M3). */
template <int DT>
static void dg_launch_8bit(const qvc_view &x, const qvc_draft_layout *L, const dg_ops *o, int w,
                           cudaStream_t st) {
    const dim3 grid((unsigned)o->R, (unsigned)o->BH);
    const unsigned nt = 2 * (unsigned)o->D;
    const int32_t *pk = L->pack_to_orig, *cnt = L->count;
    const int64_t pp = L->prefix_pad;
    const bool vec = dg_vec_ok(&x);
    const float *am = o->amax + (size_t)w * o->BH * o->R * o->D;
    float *dl = w ? o->k8s : o->q8s;
    int8_t *codes = w ? o->k8 : o->q8;
    if (w == 2 && vec)
        dg_v8_kernel<DT, true><<<grid, nt, 0, st>>>(x, pk, cnt, pp, o->R, o->dv, o->v8t);
    else if (w == 2)
        dg_v8_kernel<DT, false><<<grid, nt, 0, st>>>(x, pk, cnt, pp, o->R, o->dv, o->v8t);
    else if (vec)
        dg_int8_kernel<DT, true><<<grid, nt, 0, st>>>(x, pk, cnt, pp, o->R, am, dl, codes);
    else
        dg_int8_kernel<DT, false><<<grid, nt, 0, st>>>(x, pk, cnt, pp, o->R, am, dl, codes);
}

/* All operands of the phased kernel.  Each input is read once by its
 * 16-bit pack (which also gives the channel amax of every region) and
 * once more by its 8-bit quantizer; the scales need only the amax. */
static qva_status dg_prep(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                          const qvc_view *kv, const qvc_view *vv, dg_ops *o, cudaStream_t st) {
    const int BH = o->BH, R = o->R, D = o->D, lowbit = pl->with4 || pl->with8;
    const qvc_view *xs[3] = {qv, kv, vv};
    uint16_t *d16[3] = {o->q16, o->k16, o->v16t};
    const size_t plane = (size_t)BH * R * D;
    qva_status r;
    for (int w = 0; w < 3; ++w) {
        const qvc_view &x = *xs[w];
        float *am = lowbit ? o->amax + w * plane : NULL;
        const int tr = w == 2;
        if (pl->use_f16)
            QVC_DISPATCH_DTYPE(x.dtype,
                               (dg_launch_pack16<DT_, 1>(x, L, R, BH, d16[w], am, tr, st)));
        else
            QVC_DISPATCH_DTYPE(x.dtype,
                               (dg_launch_pack16<DT_, 0>(x, L, R, BH, d16[w], am, tr, st)));
        if ((r = qvc_launch_check("draft prep: 16-bit operands")) != QVA_OK) return r;
    }
    if (!lowbit) return QVA_OK;
    const int w0 = pl->with4 ? 0 : 2; /* without NVFP4 only V's channel scales */
    dg_scale_kernel<<<dim3((unsigned)(3 - w0), (unsigned)BH), DG_SCALE_THREADS, 0, st>>>(
        o->amax, BH, R, D, w0, pl->with4, pl->with8, o->g4, o->dv);
    if ((r = qvc_launch_check("draft prep: scales")) != QVA_OK) return r;
    if (pl->with8)
        for (int w = 0; w < 3; ++w) {
            QVC_DISPATCH_DTYPE(xs[w]->dtype, (dg_launch_8bit<DT_>(*xs[w], L, o, w, st)));
            if ((r = qvc_launch_check("draft prep: 8-bit operands")) != QVA_OK) return r;
        }
    const dim3 grid((unsigned)R, (unsigned)BH);
    if (pl->with4) {
        QVC_DISPATCH_DTYPE(qv->dtype, (dg_fp4_rows_kernel<DT_><<<grid, DG_PREP_THREADS, 0, st>>>(
                                          *qv, L->pack_to_orig, L->count, L->prefix_pad, R, o->g4,
                                          0, o->q4)));
        if ((r = qvc_launch_check("draft prep: Q nvfp4")) != QVA_OK) return r;
        QVC_DISPATCH_DTYPE(kv->dtype, (dg_fp4_rows_kernel<DT_><<<grid, DG_PREP_THREADS, 0, st>>>(
                                          *kv, L->pack_to_orig, L->count, L->prefix_pad, R, o->g4,
                                          1, o->k4)));
        if ((r = qvc_launch_check("draft prep: K nvfp4")) != QVA_OK) return r;
        QVC_DISPATCH_DTYPE(vv->dtype, (dg_fp4_cols_kernel<DT_><<<grid, DG_PREP_THREADS, 0, st>>>(
                                          *vv, L->pack_to_orig, L->count, L->prefix_pad, R, o->g4,
                                          o->v4t)));
        if ((r = qvc_launch_check("draft prep: V nvfp4")) != QVA_OK) return r;
    }
    return QVA_OK;
}

template <int D, int F16>
static qva_status dg_launch_attn(const dg_params &p, int BH, cudaStream_t st) {
    const int smem = dg_smem_bytes<D>(); /* 69632 (D 128) or 35840 (D 64) bytes */
    cudaError_t e = cudaFuncSetAttribute(attn_draft_mma_64x128<D, F16>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "attn_draft: shared memory attribute");
    const dim3 grid((unsigned)(2 * p.R), (unsigned)BH);
    attn_draft_mma_64x128<D, F16><<<grid, DG_THREADS, smem, st>>>(p);
    return qvc_launch_check("attn_draft");
}

/* The Hopper block-sparse kernel, or the dev driver's version of it. */
static qva_status dg_launch_ws(const dg_params *p, int BH, int f16, const qvc_dev_kernels *dev,
                               cudaStream_t st) {
    qvc_draft_ws_args w;
    memset(&w, 0, sizeof w);
    w.BH = BH, w.R = p->R, w.prefix = p->prefix, w.expcast = p->expcast, w.f16 = f16;
    w.n_pack = p->n_pack, w.prefix_pad = p->prefix_pad;
    w.q16 = p->ops.q16, w.k16 = p->ops.k16, w.v16t = p->ops.v16t;
    w.q8 = p->ops.q8, w.k8 = p->ops.k8, w.v8t = p->ops.v8t;
    w.q8s = p->ops.q8s, w.k8s = p->ops.k8s, w.dv = p->ops.dv;
    w.count = p->count, w.pack = p->pack, w.offsets = p->offsets, w.cols = p->cols;
    w.scale_log2 = p->scale_log2, w.eta = p->eta;
    w.a = p->a;
    if (dev && dev->draft_ws) return dev->draft_ws(&w, st);
    return qvc_attn_draft_ws_128x128(&w, st);
}

/* Phase timings: grouping_ms is the router, prep_ms the operand
 * preparation, kernel_ms the phased kernel and the dense rows. */
extern "C" qva_status qvc_draft_attention(qva_context_t *ctx, const qva_config *cfg,
                                          const qva_tensor *q, const qva_tensor *k,
                                          const qva_tensor *v, const qva_tensor *out,
                                          const qva_tensor *lse) {
    qvi_draft_plan pl;
    qva_status r = qvi_draft_plan_make(cfg, q, &pl);
    if (r != QVA_OK) return r;
    const int64_t BH64 = q->shape[0] * q->shape[1];
    const int D = (int)q->shape[3];
    if (D != 64 && D != 128)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft (cuda): head dim %d (64 or 128)", D);
    if (BH64 > 65535)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft (cuda): B*H = %lld exceeds 65535",
                        (long long)BH64);
    if (pl.n > INT32_MAX - DG_KEYS)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft (cuda): N = %lld too large", (long long)pl.n);
    const int BH = (int)BH64;
    cudaStream_t st = (cudaStream_t)qvi_context_stream(ctx);
    dg_state *s = dg_get_state(ctx);
    if (!s) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "draft (cuda): state");
    const int prof = qvi_context_profiling(ctx);
    const qvc_view qv = qvc_view_of(q), kv = qvc_view_of(k), vv = qvc_view_of(v);
    if ((r = qvc_check_view("draft", &qv, "q")) || (r = qvc_check_view("draft", &kv, "k")) ||
        (r = qvc_check_view("draft", &vv, "v")))
        return r;

    if ((r = qvc_timer_mark(&s->timer, 0, prof, st)) != QVA_OK) return r;
    if (pl.warmup) { /* docs/DRAFT.md §5: exactly the bf16 method */
        if ((r = qvc_timer_mark(&s->timer, 1, prof, st)) || (r = qvc_timer_mark(&s->timer, 2, prof, st))) return r;
        if ((r = dg_dense_rows(s, &pl, q, k, v, out, lse, st)) != QVA_OK) return r;
        if ((r = qvc_timer_mark(&s->timer, 3, prof, st)) != QVA_OK) return r;
        return prof ? qvc_timer_finish(ctx, &s->timer, st) : QVA_OK;
    }

    if ((r = dg_layout(s, ctx, cfg, &pl)) != QVA_OK) return r;
    const qvc_draft_layout *L = &s->lay;
    const int R = L->regions;
    if (!(s->route.A && s->route.BH == BH && s->route.R == R && s->route.D == D)) {
        qvc_draft_route_free(&s->route);
        if ((r = qvc_draft_route_alloc(&s->route, BH, R, D)) != QVA_OK) return r;
    }
    if ((r = dg_ops_ensure(&s->ops, BH, R, D, L->n_pack, pl.with4, pl.with8)) != QVA_OK) return r;
    /* Prep forked onto the side stream: it starts after everything the
     * caller queued before this call and overlaps the router; the kernel
     * waits for both.  Timings: grouping_ms is the router on the caller's
     * stream, prep_ms the part of the preparation not hidden under it. */
    /* the dev driver can keep the preparation on the caller's stream after
     * the router, to time the overlap */
    const qvc_dev_kernels *dev = qvc_dev_kernels_of(ctx);
    const int serial = dev && dev->serial_draft_prep;
    if (!serial) {
        cudaError_t e;
        if ((r = dg_side_ensure(s)) != QVA_OK) return r;
        if ((e = cudaEventRecord(s->fork, st)) != cudaSuccess ||
            (e = cudaStreamWaitEvent(s->side, s->fork, 0)) != cudaSuccess)
            return qvc_cuda_fail(e, "draft: fork the preparation");
        if ((r = dg_prep(&pl, L, &qv, &kv, &vv, &s->ops, s->side)) != QVA_OK) return r;
        if ((e = cudaEventRecord(s->join, s->side)) != cudaSuccess)
            return qvc_cuda_fail(e, "draft: join the preparation");
    }
    if ((r = qvc_draft_route(&qv, &kv, cfg, L, &s->route, st)) != QVA_OK) return r;
    if (memcmp(s->route.quota, pl.quota, sizeof pl.quota))
        return qvi_fail(QVA_ERR_SHAPE, "draft (cuda): router quotas differ from the plan's");
    if ((r = qvc_timer_mark(&s->timer, 1, prof, st)) != QVA_OK) return r;
    if (serial) {
        if ((r = dg_prep(&pl, L, &qv, &kv, &vv, &s->ops, st)) != QVA_OK) return r;
    } else {
        const cudaError_t e = cudaStreamWaitEvent(st, s->join, 0);
        if (e != cudaSuccess) return qvc_cuda_fail(e, "draft: wait for the preparation");
    }
    if ((r = qvc_timer_mark(&s->timer, 2, prof, st)) != QVA_OK) return r;

    dg_params p;
    memset(&p, 0, sizeof p);
    p.ops = s->ops;
    p.R = R;
    p.n_pack = L->n_pack;
    p.prefix_pad = L->prefix_pad;
    p.prefix = L->prefix;
    p.count = L->count;
    p.pack = L->pack_to_orig;
    p.offsets = s->route.offsets;
    p.cols = s->route.cols;
    p.scale_log2 = pl.scale_log2;
    p.eta = pl.eta;
    p.expcast = pl.expcast;
    p.a = dg_args(pl.scale_log2, q, out, lse, 0);
    const qvc_kernel kern = qvc_choose_kernel(cfg, D, NULL, 0);
    const int hopper = kern == QVC_KERNEL_ATTN_DRAFT_WS_128X128;
    if (hopper == (D != 128 || pl.with4))
        return qvi_fail(QVA_ERR_UNSUPPORTED, "draft (cuda): the chooser and the plan disagree");
    if (hopper)
        r = dg_launch_ws(&p, BH, pl.use_f16, dev, st);
    else if (D == 128)
        r = pl.use_f16 ? dg_launch_attn<128, 1>(p, BH, st) : dg_launch_attn<128, 0>(p, BH, st);
    else
        r = pl.use_f16 ? dg_launch_attn<64, 1>(p, BH, st) : dg_launch_attn<64, 0>(p, BH, st);
    if (r != QVA_OK) return r;
    /* The prefix queries: dense over every key, as the bf16 method.  The
     * Hopper kernel computes them itself (its prefix-query CTAs). */
    if (!hopper && (r = dg_dense_rows(s, &pl, q, k, v, out, lse, st)) != QVA_OK) return r;
    if ((r = qvc_timer_mark(&s->timer, 3, prof, st)) != QVA_OK) return r;
    return prof ? qvc_timer_finish(ctx, &s->timer, st) : QVA_OK;
}
