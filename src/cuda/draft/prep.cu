/*
 * The operands of the DraftAttention2 kernels (draft_internal.h gives
 * their layout) from the user's Q, K, V, in the packed region order:
 *   dg_pack16_kernel    Q, K 16-bit rows, each video block's channel amax,
 *                       and (TILE) the router's pooling of the same rows
 *                       and their INT8 codes with one delta per region
 *                       block (Q: or per row)
 *   dg_pack16t_kernel   V 16-bit, transposed per block, and its amax
 *   dg_scale_kernel     V's channel scales delta_c, the NVFP4 tensor scales
 *   dg_v8_kernel        V E4M3 codes, transposed in the PV slot order
 *   dg_fp4_rows_kernel  Q, K NVFP4 reconstructions (groups of 16 channels)
 *   dg_fp4_cols_kernel  V NVFP4 reconstructions (groups of 16 keys)
 * dg_prep launches what the plan needs.  host.cu runs dg_prep_qk (with
 * the pooling and the INT8 codes: Q and K are read once) on the caller's
 * stream before the router's map, and dg_prep_rest on the side stream,
 * under the router.
 *
 * Every quantizer is the CPU's expression (src/cpu/draft.c,
 * src/cpu/formats.c) with explicit _rn intrinsics (no FMA contraction), so
 * codes and scales are bit-exact with the CPU reference.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "common/device_util.cuh"
#include "common/quant_code.cuh"
#include "draft_internal.h"

#define DG_PREP_THREADS 256
#define DG_FULL 0xffffffffu

/* ================================================================ device helpers */


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

/* ---- prep kernels: one CTA of 2*D threads per (128-slot block, bh) ----
 *
 * Rows of the user view are read in chunks of 8 channels (16-byte loads
 * where qvc_view_vec_ok holds, else scalar), so the 16 (D 128) or 8 (D 64) lanes
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

/* The channel max over the CTA of m (this thread's chunk): channel t's
 * for thread t < D, +0 for the others.  The values are |x| >= 0 and never
 * NaN (fmaxf drops NaN), so any reduction order gives the same bits. */
static __device__ __forceinline__ float dg_amax_reduce(const float *m, int D, int lg) {
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
    float a = 0.0f;
    if ((int)threadIdx.x < D) {
        a = red[0][threadIdx.x];
        for (int w = 1; w < D / 16; ++w) a = fmaxf(a, red[w][threadIdx.x]);
    }
    return a;
}

/* out[0..D) = dg_amax_reduce. */
static __device__ __forceinline__ void dg_amax_store(const float *m, int D, int lg, float *out) {
    const float a = dg_amax_reduce(m, D, lg);
    if ((int)threadIdx.x < D) out[threadIdx.x] = a;
}

/* ---- the tiled pack: the router's pooling and the INT8 codes of Q, K ----
 *
 * The Q and K packs also give what else is made of the same rows, so that
 * Q and K are read once.  The pooling:
 *
 * DA2 Eq. 1 exactly as the CPU computes it (qvi_draft_pool; router_map.cu's
 * dr_pool_kernel): per channel, the FP64 sum of the region's n rows in path
 * order, over n, rounded to FP32, and the max starting at the first row,
 * then m = t > m ? t : m.  The pack's threads hold the region's rows spread
 * over them, so they leave them in shared memory (16-bit inputs as their
 * own bits, f32 as floats: exact) and one thread per channel walks them in
 * path order.  The walk is a chain of FP64 adds; with few registers and a
 * 16-32 KB tile, enough CTAs share an SM for the other CTAs' loads to keep
 * DRAM busy meanwhile. */
typedef struct dg_pool_out {
    float *avg, *max; /* [BH][R][D]; NULL: no pooling */
} dg_pool_out;

/* The INT8 codes (DA2's 8-bit Q and K: draft_internal.h) are those of
 * src/cpu/draft.c: delta = amax/127 + 1e-7 of the row (Q, rows 1) or of
 * the region block, code = the rounded quotient.  A row's delta needs only
 * the lanes that hold the row; a block's needs the block's amax, so those
 * codes come after it, from the rows left in the tile.  Both deltas come
 * from the very values they code, so qvc_int8_codes4_bounded applies. */
typedef struct dg_int8_out {
    int8_t *codes; /* [BH][R][128][D]; NULL: no codes */
    float *delta;  /* [BH][R] or (rows 1) [BH][R][128] */
    int rows;      /* rows per delta: 1 or DG_KEYS */
} dg_int8_out;

/* CTAs per SM the tiled pack asks ptxas for: 4 (64 registers) where the
 * 16-bit vector path fits them without spilling, else 2; 0 (no bound) for
 * the plain pack. */
static constexpr int dg_min_ctas(int dt, bool vec, bool tile) {
    return !tile ? 0 : dt != QVA_F32 && vec ? 4 : 2;
}

/* Bytes of the tiled pack's tile: a region's 128 rows of the input's values. */
static int dg_pool_smem(int dtype, int D) { return DG_KEYS * D * (dtype == QVA_F32 ? 4 : 2); }

template <int DT>
static __device__ __forceinline__ float dg_tile_get(const void *tile, int i) {
    if constexpr (DT == QVA_F32)
        return ((const float *)tile)[i];
    else if constexpr (DT == QVA_F16)
        return __half2float(__ushort_as_half(((const uint16_t *)tile)[i]));
    else
        return __uint_as_float((uint32_t)((const uint16_t *)tile)[i] << 16);
}

/* Row `row` of the pooling tile: the 8 values of channels c .. c + 7. */
template <int DT>
static __device__ __forceinline__ void dg_tile_put(const float (&v)[8], int row, int c, int D) {
    extern __shared__ __align__(16) unsigned char dg_tile[];
    if constexpr (DT == QVA_F32) {
        float4 *o = (float4 *)((float *)dg_tile + row * D + c);
        o[0] = make_float4(v[0], v[1], v[2], v[3]);
        o[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else { /* the input's 16-bit values, exactly */
        constexpr int F16 = DT == QVA_F16;
        *(uint4 *)((uint16_t *)dg_tile + row * D + c) =
            make_uint4(dg_pair16<F16>(v[0], v[1]), dg_pair16<F16>(v[2], v[3]),
                       dg_pair16<F16>(v[4], v[5]), dg_pair16<F16>(v[6], v[7]));
    }
}

/* Tile row `row`, channels c .. c + 7 (+0 at rows >= n, which the pack
 * did not write). */
template <int DT>
static __device__ __forceinline__ void dg_tile_get8(int row, int n, int c, int D, float (&v)[8]) {
    extern __shared__ __align__(16) unsigned char dg_tile[];
    if (row >= n) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = 0.0f;
    } else if constexpr (DT == QVA_F32) {
        const float4 *t = (const float4 *)((const float *)dg_tile + row * D + c);
        const float4 a = t[0], b = t[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        qvc_widen8<DT>(*(const uint4 *)((const uint16_t *)dg_tile + row * D + c), v);
    }
}

/* fl(fl(amax / 127) + 1e-7) (qvi_int8_delta); amax >= 0, and +0 skips
 * the division, whose quotient it knows. */
static __device__ __forceinline__ float dg_int8_delta(float amax) {
    return __fadd_rn(amax > 0.0f ? __fdiv_rn(amax, 127.0f) : 0.0f, 1e-7f);
}

/* Each row's INT8 codes under its own delta (delta[row]).  The rows come
 * back from the tile, where this very thread left them (no barrier), so
 * the pack's loads need not stay in registers.  A row's 2^LG adjacent
 * lanes (8 channels each) hold its amax in parts; one reduce-scatter
 * (7 shuffles for the 8 rows at 8 lanes a row, 8 at 16; not 8 LG) leaves
 * row q >> (LG - 3) whole on lane q of the group, so each lane divides
 * once (not once per row), and the deltas go back by shuffles.  The max is order-free (values
 * |x| >= 0, never NaN), so the deltas are the row-by-row ones. */
template <int DT, int LG>
static __device__ __forceinline__ void dg_int8_rows(int D, int n, int c, int r0, float *delta,
                                                    int8_t *q8) {
    constexpr int G = 1 << LG; /* lanes per row: 16 (D 128) or 8 (D 64) */
    const int lane = threadIdx.x & 31, q = lane & (G - 1);
    float pm[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        float v[8];
        dg_tile_get8<DT>(r0 + k * DG_RSTEP, n, c, D, v);
        pm[k] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) pm[k] = fmaxf(pm[k], fabsf(v[e]));
    }
    /* reduce-scatter: at width w (G/2 .. 1) a lane keeps the half of its
     * rows its bit w selects and takes the partner's part of them */
#pragma unroll
    for (int w = G / 2, cnt = 8; w >= 1 && cnt > 1; w >>= 1, cnt >>= 1) {
        const bool hi = (q & w) != 0;
#pragma unroll
        for (int i = 0; i < cnt / 2; ++i) {
            const float keep = hi ? pm[i + cnt / 2] : pm[i], give = hi ? pm[i] : pm[i + cnt / 2];
            pm[i] = fmaxf(keep, __shfl_xor_sync(DG_FULL, give, w));
        }
    }
    if (G == 16) pm[0] = fmaxf(pm[0], __shfl_xor_sync(DG_FULL, pm[0], 1)); /* 2 lanes per row */
    const int mine = q >> (LG - 3); /* the row whose amax this lane now holds */
    const float dl = dg_int8_delta(pm[0]), rcp = __frcp_rn(dl);
    if ((q & ((G >> 3) - 1)) == 0) delta[r0 + mine * DG_RSTEP] = dl;
    const int src0 = lane & ~(G - 1);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int from = src0 + (k << (LG - 3));
        const float dk = __shfl_sync(DG_FULL, dl, from), rk = __shfl_sync(DG_FULL, rcp, from);
        float v[8];
        dg_tile_get8<DT>(r0 + k * DG_RSTEP, n, c, D, v);
        *(uint2 *)(q8 + k * DG_RSTEP * D) = make_uint2(qvc_int8_codes4_bounded(v, dk, rk),
                                                       qvc_int8_codes4_bounded(v + 4, dk, rk));
    }
}

/* The block's INT8 codes under one delta: its amax is the max of the
 * channel amax a (thread t < D holds channel t's); this thread's rows
 * r0 + 16 k come back from the tile (n valid rows, +0 after). */
template <int DT>
static __device__ void dg_int8_block(float a, int D, int n, int c, int r0, float *delta,
                                     int8_t *q8) {
    __shared__ float wmax[DG_PREP_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(DG_FULL, a, o));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = a;
    __syncthreads();
    float bm = wmax[0];
    for (int w = 1; w < D / 16; ++w) bm = fmaxf(bm, wmax[w]); /* 2D threads, D/16 warps */
    const float dl = dg_int8_delta(bm), rcp = __frcp_rn(dl);
    if (threadIdx.x == 0) *delta = dl;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        float v[8];
        dg_tile_get8<DT>(r0 + k * DG_RSTEP, n, c, D, v);
        *(uint2 *)(q8 + k * DG_RSTEP * D) = make_uint2(qvc_int8_codes4_bounded(v, dl, rcp),
                                                       qvc_int8_codes4_bounded(v + 4, dl, rcp));
    }
}

/* The pooled avg and max of this CTA's region (n rows) from the tile. */
template <int DT>
static __device__ void dg_pool_store(int D, int n, float *avg, float *mx) {
    extern __shared__ __align__(16) unsigned char dg_tile[];
    __syncthreads();
    const int t = (int)threadIdx.x;
    if (t >= D) return;
    double sum = 0.0;
    float m = dg_tile_get<DT>(dg_tile, t);
    for (int i = 0; i < n; ++i) {
        const float x = dg_tile_get<DT>(dg_tile, i * D + t);
        sum = __dadd_rn(sum, (double)x);
        m = x > m ? x : m;
    }
    avg[t] = __double2float_rn(__ddiv_rn(sum, (double)n));
    mx[t] = m;
}

/* Eight channels of a row as loaded (qvc_ld8): 16-bit vector loads stay
 * packed until used, half the registers of their floats, so that all
 * eight rows of a thread can be in flight within the tiled pack's 64. */
template <int DT, bool VEC, bool PACKED = VEC && DT != QVA_F32>
struct dg_chunk {
    float x[8];
    __device__ __forceinline__ void load(const void *p, int64_t off) { qvc_ld8<DT, VEC>(p, off, x); }
    __device__ __forceinline__ void get(float (&v)[8]) const {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = x[e];
    }
};
template <int DT, bool VEC>
struct dg_chunk<DT, VEC, true> {
    uint4 u;
    __device__ __forceinline__ void load(const void *p, int64_t off) {
        u = __ldg((const uint4 *)((const unsigned short *)p + off));
    }
    __device__ __forceinline__ void get(float (&v)[8]) const { qvc_widen8<DT>(u, v); }
};

/* Q, K 16-bit rows [slot][D] of block blockIdx.x + blk0 (TILE: dst may be
 * NULL, none written).  amax (low-bit calls): the channel amax of each
 * video block (blk >= pblk) into amax[bh][blk - pblk][D].  TILE, for each
 * video block: the router's pooling into pool, the INT8 codes into i8
 * (above; either may be absent), with dg_pool_smem bytes of dynamic shared
 * memory.  Padding slots (pack -1) give +0, which leaves the amax alone;
 * partition.c puts a region's count cells first, so the rest are exactly
 * its valid tokens. */
template <int DT, int F16, bool VEC, bool TILE>
__global__ void __launch_bounds__(DG_PREP_THREADS, dg_min_ctas(DT, VEC, TILE))
dg_pack16_kernel(qvc_view x, const int32_t *pack, const int32_t *count, int64_t n_pack, int pblk,
                 int blk0, int R, uint16_t *dst, float *amax, dg_pool_out pool, dg_int8_out i8) {
    const int blk = blockIdx.x + blk0, bh = blockIdx.y, D = (int)x.D, lg = DG_CPR_LG(D);
    const int c = (threadIdx.x & ((1 << lg) - 1)) * 8, r0 = threadIdx.x >> lg;
    const int64_t base = qvc_head_base(x, bh), vb = (int64_t)bh * R + (blk - pblk);
    const int32_t *pk = pack + (int64_t)blk * DG_KEYS + r0;
    const bool video = TILE && blk >= pblk;
    const bool pooling = video && pool.avg, quant = video && i8.codes;
    const bool block_delta = quant && i8.rows != 1;
    int32_t orig[8];
    dg_chunk<DT, VEC> rows[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) orig[k] = __ldg(pk + k * DG_RSTEP);
#pragma unroll
    for (int k = 0; k < 8; ++k) rows[k].load(x.data, base + (int64_t)max(orig[k], 0) * x.sn + c);
    uint32_t valid = 0u; /* bit k: row r0 + 16 k is a token (one register, not eight) */
#pragma unroll
    for (int k = 0; k < 8; ++k) valid |= (uint32_t)(orig[k] >= 0) << k;
    uint16_t *o = !TILE || dst ? dst + ((int64_t)bh * n_pack + (int64_t)blk * DG_KEYS + r0) * D + c
                               : NULL;
    float m[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const int n = video ? count[blk - pblk] : 0;
    const int n_tile = pooling || quant ? n : 0; /* rows the tile keeps */
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        float v[8];
        rows[k].get(v);
        dg_mask8(v, (valid >> k) & 1u);
        if (r0 + k * DG_RSTEP < n_tile) dg_tile_put<DT>(v, r0 + k * DG_RSTEP, c, D);
        if (!TILE || o)
            *(uint4 *)(o + k * DG_RSTEP * D) =
                make_uint4(dg_pair16<F16>(v[0], v[1]), dg_pair16<F16>(v[2], v[3]),
                           dg_pair16<F16>(v[4], v[5]), dg_pair16<F16>(v[6], v[7]));
#pragma unroll
        for (int e = 0; e < 8; ++e) m[e] = fmaxf(m[e], fabsf(v[e]));
    }
    int8_t *q8 = quant ? i8.codes + (vb * DG_KEYS + r0) * D + c : NULL;
    if (quant && !block_delta && lg == 4)
        dg_int8_rows<DT, 4>(D, n, c, r0, i8.delta + vb * DG_KEYS, q8);
    else if (quant && !block_delta)
        dg_int8_rows<DT, 3>(D, n, c, r0, i8.delta + vb * DG_KEYS, q8);
    const bool store_amax = amax && blk >= pblk;
    if (store_amax || block_delta) { /* CTA-uniform: the reductions hold barriers */
        const float a = dg_amax_reduce(m, D, lg);
        if (store_amax && (int)threadIdx.x < D) amax[vb * D + threadIdx.x] = a;
        if (block_delta) dg_int8_block<DT>(a, D, n, c, r0, i8.delta + vb, q8);
    }
    if (pooling) dg_pool_store<DT>(D, n, pool.avg + vb * D, pool.max + vb * D);
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
            qvc_ld8<DT, VEC>(x.data, base + (int64_t)max(orig[k][h], 0) * x.sn + c, v[k][h]);
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

/* E4M3 codes of V / delta_c for one region block, transposed [D][128] in
 * the PV slot order (qvc_e4m3_codes4: a product by 1/delta_c, the division
 * only near a rounding boundary).  Tile word w of row c holds slots 4w .. 4w+3 (keys
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
            qvc_ld8<DT, VEC>(x.data, base + (int64_t)orig[k][u] * x.sn + c, v[k][u]);
    float d[8], rd[8];
    bool fast = true; /* qvc_e4m3_codes4's reciprocal path for all 8 channels */
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        d[e] = __ldg(dv + (int64_t)bh * D + c + e);
        rd[e] = __frcp_rn(d[e]);
        fast = fast && qvc_e4m3_fast_ok(d[e], rd[e]);
    }
    const int s = dg_swz(c, lg);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int w = w0 + k * DG_RSTEP;
#pragma unroll
        for (int u = 0; u < 4; ++u) dg_mask8(v[k][u], key[k][u] < n);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float x4[4] = {v[k][0][e], v[k][1][e], v[k][2][e], v[k][3][e]};
            const float d4[4] = {d[e], d[e], d[e], d[e]}, r4[4] = {rd[e], rd[e], rd[e], rd[e]};
            tile[(c + e) * (DG_KEYS / 4) + (w ^ s)] = qvc_e4m3_codes4(x4, d4, r4, fast);
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

/* ================================================================ launchers */

/* The tiled pack of one instance: its tile in dynamic shared memory
 * (64 KB for f32 rows at D 128, above the default 48 KB). */
template <int DT, int F16, bool VEC>
static void dg_launch_tiled_pack(dim3 grid, unsigned nt, const qvc_view &x,
                                 const qvc_draft_layout *L, int blk0, int R, uint16_t *dst,
                                 float *amax, dg_pool_out pool, dg_int8_out i8, cudaStream_t st) {
    const int smem = dg_pool_smem(DT, (int)x.D);
    void (*k)(qvc_view, const int32_t *, const int32_t *, int64_t, int, int, int, uint16_t *,
              float *, dg_pool_out, dg_int8_out) = dg_pack16_kernel<DT, F16, VEC, true>;
    if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    k<<<grid, nt, smem, st>>>(x, L->pack_to_orig, L->count, L->n_pack,
                              (int)(L->prefix_pad / DG_KEYS), blk0, R, dst, amax, pool, i8);
}

/* One 16-bit operand (trans: V^T) and, with amax, its channel amax; Q and
 * K with the pooling and INT8 codes that pool and i8 ask for. */
template <int DT, int F16>
static void dg_launch_pack16(const qvc_view &x, const qvc_draft_layout *L, int R, int BH,
                             uint16_t *dst, float *amax, int trans, dg_pool_out pool,
                             dg_int8_out i8, cudaStream_t st) {
    const dim3 grid((unsigned)(L->n_pack / DG_KEYS), (unsigned)BH);
    const int pblk = (int)(L->prefix_pad / DG_KEYS);
    const int32_t *pk = L->pack_to_orig;
    const int64_t np = L->n_pack;
    const unsigned nt = 2 * (unsigned)x.D;
    const bool vec = qvc_view_vec_ok(&x, 8), tiled = pool.avg || i8.codes;
    if (trans && vec)
        dg_pack16t_kernel<DT, F16, true><<<grid, nt, 0, st>>>(x, pk, np, pblk, R, dst, amax);
    else if (trans)
        dg_pack16t_kernel<DT, F16, false><<<grid, nt, 0, st>>>(x, pk, np, pblk, R, dst, amax);
    else if (vec && tiled)
        dg_launch_tiled_pack<DT, F16, true>(grid, nt, x, L, 0, R, dst, amax, pool, i8, st);
    else if (tiled)
        dg_launch_tiled_pack<DT, F16, false>(grid, nt, x, L, 0, R, dst, amax, pool, i8, st);
    else if (vec)
        dg_pack16_kernel<DT, F16, true, false><<<grid, nt, 0, st>>>(x, pk, NULL, np, pblk, 0, R,
                                                                    dst, amax, pool, i8);
    else
        dg_pack16_kernel<DT, F16, false, false><<<grid, nt, 0, st>>>(x, pk, NULL, np, pblk, 0, R,
                                                                     dst, amax, pool, i8);
}

/* The pooling alone (no pack written): the video blocks only. */
template <int DT>
static void dg_launch_pool16(const qvc_view &x, const qvc_draft_layout *L, int BH,
                             dg_pool_out pool, cudaStream_t st) {
    const int pblk = (int)(L->prefix_pad / DG_KEYS);
    const dim3 grid((unsigned)L->regions, (unsigned)BH);
    const unsigned nt = 2 * (unsigned)x.D;
    const dg_int8_out none = {NULL, NULL, 0};
    if (qvc_view_vec_ok(&x, 8))
        dg_launch_tiled_pack<DT, 0, true>(grid, nt, x, L, pblk, L->regions, NULL, NULL, pool,
                                          none, st);
    else
        dg_launch_tiled_pack<DT, 0, false>(grid, nt, x, L, pblk, L->regions, NULL, NULL, pool,
                                           none, st);
}

extern "C" qva_status qvc_draft_pool16(const qvc_view *x, const qvc_draft_layout *L, int BH,
                                       float *avg, float *max, cudaStream_t st) {
    if (!x || !L || !L->pack_to_orig || !L->count || !avg || !max)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_pool16: NULL argument");
    if ((x->D != 64 && x->D != 128) || L->c != DG_KEYS || L->prefix_pad % DG_KEYS != 0 ||
        x->N != L->n || x->B * x->H != BH)
        return qvi_fail(QVA_ERR_SHAPE,
                        "qvc_draft_pool16: D %lld (64 or 128), region capacity %d (%d), "
                        "N %lld (layout %lld), B*H %lld (%d)",
                        (long long)x->D, L->c, DG_KEYS, (long long)x->N, (long long)L->n,
                        (long long)(x->B * x->H), BH);
    const dg_pool_out pool = {avg, max};
    QVC_DISPATCH_DTYPE(x->dtype, dg_launch_pool16<DT_>(*x, L, BH, pool, st));
    return qvc_launch_check("qvc_draft_pool16");
}

/* V's E4M3 codes (after dg_scale_kernel's delta_c). */
template <int DT>
static void dg_launch_v8(const qvc_view &x, const qvc_draft_layout *L, const dg_ops *o,
                         cudaStream_t st) {
    const dim3 grid((unsigned)o->R, (unsigned)o->BH);
    const unsigned nt = 2 * (unsigned)o->D;
    const int32_t *pk = L->pack_to_orig, *cnt = L->count;
    const int64_t pp = L->prefix_pad;
    if (qvc_view_vec_ok(&x, 8))
        dg_v8_kernel<DT, true><<<grid, nt, 0, st>>>(x, pk, cnt, pp, o->R, o->dv, o->v8t);
    else
        dg_v8_kernel<DT, false><<<grid, nt, 0, st>>>(x, pk, cnt, pp, o->R, o->dv, o->v8t);
}

/* The NVFP4 reconstructions q4, k4, v4t (after dg_scale_kernel's g4). */
static qva_status dg_prep_fp4(const qvc_draft_layout *L, const qvc_view *qv, const qvc_view *kv,
                              const qvc_view *vv, dg_ops *o, cudaStream_t st) {
    const dim3 grid((unsigned)o->R, (unsigned)o->BH);
    const int32_t *pk = L->pack_to_orig, *cnt = L->count;
    const int64_t pp = L->prefix_pad;
    const int R = o->R;
    qva_status r;
    QVC_DISPATCH_DTYPE(qv->dtype, (dg_fp4_rows_kernel<DT_><<<grid, DG_PREP_THREADS, 0, st>>>(
                                      *qv, pk, cnt, pp, R, o->g4, 0, o->q4)));
    if ((r = qvc_launch_check("draft prep: Q nvfp4")) != QVA_OK) return r;
    QVC_DISPATCH_DTYPE(kv->dtype, (dg_fp4_rows_kernel<DT_><<<grid, DG_PREP_THREADS, 0, st>>>(
                                      *kv, pk, cnt, pp, R, o->g4, 1, o->k4)));
    if ((r = qvc_launch_check("draft prep: K nvfp4")) != QVA_OK) return r;
    QVC_DISPATCH_DTYPE(vv->dtype, (dg_fp4_cols_kernel<DT_><<<grid, DG_PREP_THREADS, 0, st>>>(
                                      *vv, pk, cnt, pp, R, o->g4, o->v4t)));
    return qvc_launch_check("draft prep: V nvfp4");
}

/* The 16-bit operand of tensor w (0 Q, 1 K, 2 V transposed) and, with
 * amax, each region's channel amax into amax [3][BH][R][D]; pool and i8
 * (Q, K): the router's pooling and the INT8 codes of the same reads. */
static qva_status dg_prep16(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view &x,
                            int w, dg_ops *o, float *amax, dg_pool_out pool, dg_int8_out i8,
                            cudaStream_t st) {
    const int BH = o->BH, R = o->R;
    uint16_t *d16[3] = {o->q16, o->k16, o->v16t};
    float *am = amax ? amax + (size_t)w * BH * R * o->D : NULL;
    const int tr = w == 2;
    if (pl->use_f16)
        QVC_DISPATCH_DTYPE(x.dtype,
                           (dg_launch_pack16<DT_, 1>(x, L, R, BH, d16[w], am, tr, pool, i8, st)));
    else
        QVC_DISPATCH_DTYPE(x.dtype,
                           (dg_launch_pack16<DT_, 0>(x, L, R, BH, d16[w], am, tr, pool, i8, st)));
    return qvc_launch_check("draft prep: 16-bit operands");
}

qva_status dg_prep_qk(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                      const qvc_view *kv, dg_ops *o, const qvc_draft_route_buf *pool,
                      cudaStream_t st) {
    float *amax = pl->with4 || pl->with8 ? o->amax : NULL;
    const dg_pool_out none = {NULL, NULL};
    const dg_pool_out pq = pool ? dg_pool_out{pool->qavg, pool->qmax} : none;
    const dg_pool_out pk = pool ? dg_pool_out{pool->kavg, pool->kmax} : none;
    const dg_int8_out no8 = {NULL, NULL, 0};
    o->q_rows_per_scale = pl->q_rows_per_scale;
    const dg_int8_out q8 = pl->with8 ? dg_int8_out{o->q8, o->q8s, o->q_rows_per_scale} : no8;
    const dg_int8_out k8 = pl->with8 ? dg_int8_out{o->k8, o->k8s, DG_KEYS} : no8;
    const qva_status r = dg_prep16(pl, L, *qv, 0, o, amax, pq, q8, st);
    return r != QVA_OK ? r : dg_prep16(pl, L, *kv, 1, o, amax, pk, k8, st);
}

/* The rest once Q and K are packed (with their INT8 codes): V is read
 * once by its 16-bit pack (which also gives the channel amax of every
 * region) and once more by its E4M3 quantizer, which needs the channel
 * scales of all regions; the NVFP4 operands read Q, K, V once more. */
qva_status dg_prep_rest(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                        const qvc_view *kv, const qvc_view *vv, dg_ops *o, cudaStream_t st) {
    const int lowbit = pl->with4 || pl->with8;
    const dg_pool_out none = {NULL, NULL};
    const dg_int8_out no8 = {NULL, NULL, 0};
    qva_status r = dg_prep16(pl, L, *vv, 2, o, lowbit ? o->amax : NULL, none, no8, st);
    if (r != QVA_OK || !lowbit) return r;
    const int w0 = pl->with4 ? 0 : 2; /* without NVFP4 only V's channel scales */
    dg_scale_kernel<<<dim3((unsigned)(3 - w0), (unsigned)o->BH), DG_SCALE_THREADS, 0, st>>>(
        o->amax, o->BH, o->R, o->D, w0, pl->with4, pl->with8, o->g4, o->dv);
    if ((r = qvc_launch_check("draft prep: scales")) != QVA_OK) return r;
    if (pl->with8) {
        QVC_DISPATCH_DTYPE(vv->dtype, (dg_launch_v8<DT_>(*vv, L, o, st)));
        if ((r = qvc_launch_check("draft prep: V E4M3")) != QVA_OK) return r;
    }
    return pl->with4 ? dg_prep_fp4(L, qv, kv, vv, o, st) : QVA_OK;
}

qva_status dg_prep(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                   const qvc_view *kv, const qvc_view *vv, dg_ops *o, cudaStream_t st) {
    const qva_status r = dg_prep_qk(pl, L, qv, kv, o, NULL, st);
    return r != QVA_OK ? r : dg_prep_rest(pl, L, qv, kv, vv, o, st);
}
