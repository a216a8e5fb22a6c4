/*
 * Operand preparation on the device: load the strided user Q, K, V, apply
 * the permutation, K smoothing, the Hadamard rotation and V-Smooth block
 * demeaning, and quantize into the layouts of cuda_internal.h.  The files
 * of src/cuda/prep/, by role:
 *   qk.cu      Q and K as 8-bit codes (INT8 / E4M3) with block scales
 *   qk_plain.cu  the same for INT8 from 16-bit inputs, rotated or not (the common case)
 *   v_plain.cu   V with per-channel scales from 16-bit inputs (the common case)
 *   kmean.cu   the K channel mean of K smoothing (block tree sums, then FP64)
 *   colsum.cu  exact FP64 column means of row lists (qvc_colsum_mean): the
 *              centroid update of kmeans.cu
 *   v.cu       V: block statistics, per-channel scales, E4M3 codes
 *   fp4.cu     the NVFP4 operands of sage4 / vc4 (qvc_prep4, qvc_ops4_*)
 *   prep8.cu   qvc_prep, qvc_ops_alloc / free, the LSE shift
 * This header holds the device helpers and constants that more than one of
 * them needs; prep_internal.h the host functions they call in each other.
 *
 * The values are those of the CPU reference (src/cpu/head_ops.c and v_operand.c,
 * qvi_cpu_prepare_head / qvi_v8_prepare / quantize_ops, and the quantizers of
 * src/formats.c), bit for bit:
 *   - every float operation is written with an explicit _rn intrinsic, so
 *     nvcc can never contract a multiply and an add into an FMA the CPU
 *     does not form (the CPU is built -std=c11, which does not contract);
 *   - the sums give the CPU's bits: a 128-row block's channel sums (V's
 *     block means, the K mean's blocks) in the CPU's fixed FP32 tree
 *     (qvi_block_sum; tree_block_part and block_tree4 below), the K
 *     mean's block sums then in FP64 in block order (kmean.cu); the
 *     k-means centroid sums in parallel when the data certify that no
 *     partial sum can round, sequentially in the CPU's order otherwise
 *     (colsum.cu);
 *   - maxima are order-independent, so they use ordinary tree reductions.
 * The input dtype is a template parameter of every kernel, so unrolled
 * loops issue their loads back to back.
 */
#ifndef QVATTN_CUDA_PREP_COMMON_CUH
#define QVATTN_CUDA_PREP_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "common/device_util.cuh"
#include "prep_internal.h"

#define PREP_THREADS 256
#define PREP_WARPS (PREP_THREADS / 32)
#define ROWS_PER_WARP (QVI_BLOCK / PREP_WARPS) /* 16 */
#define FULL_MASK 0xffffffffu

/* Source row of logical row i (perm: [BH][n] or NULL). */
static __device__ __forceinline__ int64_t src_row(const int32_t *perm, int bh,
                                                  int n, int i) {
    return perm ? (int64_t)__ldg(perm + (int64_t)bh * n + i) : (int64_t)i;
}

static __device__ __forceinline__ float round_f16(float y) {
    return __half2float(__float2half_rn(y));
}

static __device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

/* Block-wide max of a PREP_THREADS CTA; every thread gets the result. */
static __device__ float block_max(float x, float *red /* [PREP_WARPS] */) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    x = warp_max(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < PREP_WARPS; ++w) m = fmaxf(m, red[w]);
    return m;
}

/* The pair (a, b) -> (a + b, a - b) of qva_hadamard. */
static __device__ __forceinline__ void butterfly(float &a, float &b) {
    float s = __fadd_rn(a, b), d = __fsub_rn(a, b);
    a = s;
    b = d;
}

/* The Hadamard rotation's start within a lane of N adjacent channels: the
 * seeded signs (valid rows only: a padding row stays +0), then stages
 * h = 1 .. N/2 in qva_hadamard's order.  The stages across lanes follow in
 * the caller (qk.cu, qk_plain.cu). */
template <int N>
static __device__ __forceinline__ void hadamard_in_lane(float *x, const float *sg, bool valid) {
    if (valid) {
#pragma unroll
        for (int e = 0; e < N; ++e) x[e] = __fmul_rn(x[e], sg[e]);
    }
#pragma unroll
    for (int h = 1; h < N; h <<= 1) {
#pragma unroll
        for (int e = 0; e < N; ++e)
            if (!(e & h)) butterfly(x[e], x[e + h]);
    }
}

/* The vectorized kernels (qk.cu, v.cu): a lane holds QK_CPL adjacent
 * channels of a row, so a row of D channels takes D / QK_CPL lanes (32 at
 * D 128, 16 at D 64) and one warp step covers 32 / that many rows.  Loads
 * are QK_CPL elements wide and codes leave 4 bytes per lane. */
#define QK_CPL 4
static_assert(QK_CPL == 4, "common/quant_code.cuh packs 4 codes per lane");
template <int D>
struct qk_geom {
    static constexpr int LPR = D / QK_CPL;               /* lanes per row  */
    static constexpr int RPS = 32 / LPR;                 /* rows per step  */
    static constexpr int STEPS = ROWS_PER_WARP / RPS;    /* steps per warp */
};

/* QK_CPL elements of a user view at off, widened exactly: one vector load
 * where vec (qvc_view_vec_ok(view, QK_CPL), checked once per launch), else
 * one by one (qvc_ld8's 4-wide twin, with a run-time flag). */
template <int DT>
static __device__ __forceinline__ void prep_load4(const void *data, int64_t off, int vec,
                                                  float *x) {
    if (vec) {
        if constexpr (DT == QVA_F32) {
            const float4 v = __ldg((const float4 *)((const float *)data + off));
            x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
        } else {
            const uint2 v = __ldg((const uint2 *)((const unsigned short *)data + off));
            const unsigned short h[4] = {(unsigned short)(v.x & 0xFFFFu), (unsigned short)(v.x >> 16),
                                         (unsigned short)(v.y & 0xFFFFu), (unsigned short)(v.y >> 16)};
#pragma unroll
            for (int e = 0; e < QK_CPL; ++e)
                x[e] = DT == QVA_BF16 ? __uint_as_float((unsigned)h[e] << 16)
                                      : __half2float(__ushort_as_half(h[e]));
        }
    } else {
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) x[e] = qvc_ld<DT>(data, off + e);
    }
}

/* The lane's QK_CPL elements of one row as loaded, not yet widened: with
 * vec, a 16-bit type packs them in w[0..1] and f32 in w[0..3]; without,
 * w[e] holds element e's bits.  Keeping the widening out of the load is
 * what lets a group's loads all be in flight before the first returns. */
typedef struct prep_raw4 {
    uint32_t w[QK_CPL];
} prep_raw4;

template <int DT>
static __device__ __forceinline__ void prep_load_raw4(const void *data, int64_t off, int vec,
                                                      prep_raw4 &r) {
    if constexpr (DT == QVA_F32) {
        if (vec) {
            const uint4 v = __ldg((const uint4 *)((const float *)data + off));
            r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
        } else {
#pragma unroll
            for (int e = 0; e < QK_CPL; ++e) r.w[e] = __ldg((const uint32_t *)data + off + e);
        }
    } else {
        if (vec) {
            const uint2 v = __ldg((const uint2 *)((const unsigned short *)data + off));
            r.w[0] = v.x, r.w[1] = v.y;
        } else {
#pragma unroll
            for (int e = 0; e < QK_CPL; ++e) r.w[e] = __ldg((const unsigned short *)data + off + e);
        }
    }
}

/* prep_load4's values from prep_load_raw4's bits, exactly. */
template <int DT>
static __device__ __forceinline__ void prep_widen4(const prep_raw4 &r, int vec, float *x) {
    uint32_t h[QK_CPL];
    if constexpr (DT == QVA_F32) {
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) x[e] = __uint_as_float(r.w[e]);
        return;
    }
    if (vec) {
        h[0] = r.w[0] & 0xFFFFu, h[1] = r.w[0] >> 16, h[2] = r.w[1] & 0xFFFFu, h[3] = r.w[1] >> 16;
    } else {
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) h[e] = r.w[e];
    }
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e)
        x[e] = DT == QVA_BF16 ? __uint_as_float(h[e] << 16)
                              : __half2float(__ushort_as_half((unsigned short)h[e]));
}

/* The lane's QK_CPL channels of S rows i0, i0 + di, ... of X[perm] (rows
 * at or past n are +0): the permutation entries, then every row's load,
 * then the widening, so that a warp has S loads in flight instead of one.
 * Row by row, with the arithmetic between the loads, the quantize kernels
 * kept about 12 KB in flight per SM (bench/NOTES.md, "Loads in flight"). */
template <int DT, int S>
static __device__ __forceinline__ void prep_load_rows4(const qvc_view &x, const int32_t *perm,
                                                       int bh, int n, int64_t base, int i0,
                                                       int di, int c0, int vec,
                                                       float (&v)[S][QK_CPL]) {
    int src[S]; /* the source rows, loaded before any is used */
    if (perm) {
        const int32_t *pr = perm + (int64_t)bh * n;
#pragma unroll
        for (int s = 0; s < S; ++s) src[s] = i0 + s * di < n ? __ldg(pr + i0 + s * di) : 0;
    } else {
#pragma unroll
        for (int s = 0; s < S; ++s) src[s] = i0 + s * di;
    }
    prep_raw4 r[S];
#pragma unroll
    for (int s = 0; s < S; ++s) {
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) r[s].w[e] = 0u; /* +0 in every dtype */
        if (i0 + s * di < n) prep_load_raw4<DT>(x.data, base + (int64_t)src[s] * x.sn + c0, vec, r[s]);
    }
#pragma unroll
    for (int s = 0; s < S; ++s) prep_widen4<DT>(r[s], vec, v[s]);
}

/* The lane's 4 channels of the 128-row block at r0 in qvi_block_sum's
 * tree (one lane walks it: the leaves in order, the pairs by a binary
 * counter whose levels the full unroll keeps in registers), and each
 * channel's least and greatest value over the rows before n (fminf /
 * fmaxf skip NaN). */
template <int DT>
static __device__ __forceinline__ void block_tree4(const qvc_view &x, const int32_t *perm, int bh,
                                                   int n, int64_t base, int r0, int c0, int vec,
                                                   float (&sum)[QK_CPL], float (&mn)[QK_CPL],
                                                   float (&mx)[QK_CPL]) {
    constexpr int ROWS = QVI_BLOCK / QVI_TREE_LEAVES; /* a leaf's rows, 32 apart */
    float level[6][QK_CPL];
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e) mn[e] = INFINITY, mx[e] = -INFINITY;
#pragma unroll
    for (int i = 0; i < QVI_TREE_LEAVES; ++i) {
        float v[ROWS][QK_CPL], node[QK_CPL];
        prep_load_rows4<DT, ROWS>(x, perm, bh, n, base, r0 + i, QVI_TREE_LEAVES, c0, vec, v);
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) {
            node[e] = v[0][e];
#pragma unroll
            for (int t = 1; t < ROWS; ++t) node[e] = __fadd_rn(node[e], v[t][e]);
        }
#pragma unroll
        for (int t = 0; t < ROWS; ++t)
            if (r0 + i + t * QVI_TREE_LEAVES < n)
#pragma unroll
                for (int e = 0; e < QK_CPL; ++e) mn[e] = fminf(mn[e], v[t][e]), mx[e] = fmaxf(mx[e], v[t][e]);
        int b = 0;
#pragma unroll
        for (; (i >> b) & 1; ++b)
#pragma unroll
            for (int e = 0; e < QK_CPL; ++e) node[e] = __fadd_rn(level[b][e], node[e]);
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) level[b][e] = node[e];
    }
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e) sum[e] = level[5][e];
}

/* V's code tile in shared memory: [128 keys][TILE_STRIDE] bytes, a key's
 * codes in channel order.  With the stride 132 (33 words) a row's word
 * falls in bank (row + word) mod 32; the 32 keys that one transposed read
 * takes (slots 4j + q, j = 0..31) fall in 8 banks, 4 to a bank. */
#define TILE_STRIDE (MAX_D + 4)

/* The tile to dst ([D][128], qvc_ops.v_t's block) transposed, in the PV
 * slot order of qvc_pv_slot_key(): word w holds slots 4(w%32)..+3 of
 * channel w/32, so each warp stores one channel's 128 contiguous bytes.
 * Lane j reads, for 4 channels at once, the 4-byte words of its four
 * slots' keys and transposes the 4 x 4 bytes with 8 byte permutes (a
 * byte load per code would take 4 times the shared-memory requests).
 * The CTA (PREP_THREADS) calls it after the tile's __syncthreads. */
template <int D>
static __device__ __forceinline__ void v_tile_write_t(const uint8_t *tile, uint8_t *dst_block) {
    constexpr int STEP = PREP_WARPS * 4; /* channels of the CTA per step */
    static_assert(PREP_THREADS % 32 == 0 && D % STEP == 0, "lane = slot group, whole steps");
    uint32_t *dst = (uint32_t *)dst_block;
    const int j = threadIdx.x & 31;
    /* the lane's four slots, hence keys, are the same in every step */
    const uint8_t *row[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int s = 4 * j + q;
        row[q] = tile + ((s & ~31) + qvc_pv_slot_key(s & 31)) * TILE_STRIDE;
    }
#pragma unroll
    for (int i = 0; i < D / STEP; ++i) {
        const int c = (threadIdx.x >> 5) * 4 + i * STEP;
        const uint32_t r0 = *(const uint32_t *)(row[0] + c), r1 = *(const uint32_t *)(row[1] + c);
        const uint32_t r2 = *(const uint32_t *)(row[2] + c), r3 = *(const uint32_t *)(row[3] + c);
        /* bytes (r0.b, r1.b) interleaved, then joined: word b = r0..r3's byte b */
        const uint32_t lo01 = __byte_perm(r0, r1, 0x5140), lo23 = __byte_perm(r2, r3, 0x5140);
        const uint32_t hi01 = __byte_perm(r0, r1, 0x7362), hi23 = __byte_perm(r2, r3, 0x7362);
        dst[(c + 0) * 32 + j] = __byte_perm(lo01, lo23, 0x5410);
        dst[(c + 1) * 32 + j] = __byte_perm(lo01, lo23, 0x7632);
        dst[(c + 2) * 32 + j] = __byte_perm(hi01, hi23, 0x5410);
        dst[(c + 3) * 32 + j] = __byte_perm(hi01, hi23, 0x7632);
    }
}

/* The "plain" kernels (qk_plain.cu, v_plain.cu): 16-bit inputs, a lane
 * holds 8 adjacent channels (one 16-byte load per row), a row is D/8
 * lanes, a PREP_THREADS CTA covers one 128-row block in STEPS steps of RPC
 * rows, and a thread's rows are r0 + s * RPC. */
#define PLAIN_CPL 8
template <int D>
struct plain_geom {
    static constexpr int LPR = D / PLAIN_CPL;           /* lanes per row      */
    static constexpr int RPW = 32 / LPR;                /* rows per warp step */
    static constexpr int RPC = RPW * PREP_WARPS;        /* rows per CTA step  */
    static constexpr int STEPS = QVI_BLOCK / RPC;       /* rows per thread    */
    static_assert(STEPS * RPC == QVI_BLOCK, "steps cover the block");
};

/* The thread's rows r0 + s * RPC of X[perm] (perm [BH][n] or NULL), the
 * lane's 8 channels from c0, packed as loaded (0 past n): the permutation
 * entries first, then every row's 16-byte load, none used before all are
 * issued. */
template <int D>
static __device__ __forceinline__ void plain_load_rows(const qvc_view &x, const int32_t *perm,
                                                       int bh, int n, int64_t base, int r0, int c0,
                                                       uint4 (&raw)[plain_geom<D>::STEPS]) {
    using G = plain_geom<D>;
    int src[G::STEPS];
    if (perm) {
        const int32_t *pr = perm + (int64_t)bh * n;
#pragma unroll
        for (int s = 0; s < G::STEPS; ++s) src[s] = r0 + s * G::RPC < n ? __ldg(pr + r0 + s * G::RPC) : 0;
    } else {
#pragma unroll
        for (int s = 0; s < G::STEPS; ++s) src[s] = r0 + s * G::RPC;
    }
#pragma unroll
    for (int s = 0; s < G::STEPS; ++s) {
        raw[s] = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + s * G::RPC < n)
            raw[s] = __ldg((const uint4 *)((const unsigned short *)x.data + base + (int64_t)src[s] * x.sn + c0));
    }
}

/* A block's channel sums in the CPU's tree (qvi_block_sum, docs/NUMERICS.md
 * §4) from the rows the plain geometry holds: step s of a thread is row
 * key0 + s RPC, so its steps s = j, j + LEAVES, ... are the four rows of
 * leaf key0 + j RPC (RPC LEAVES = 32), added in register in the leaf's
 * order.  Lanes LPR apart hold neighbouring leaves of the same channels,
 * so the warp's shuffles make the tree's first log2(RPW) levels; a node
 * of that level is warp + PREP_WARPS j.  The CTA's nodes meet in shared
 * memory, where the thread of channel c adds them in pairs in index order.
 * Each add takes the same two operands as the CPU's (IEEE addition
 * commutes), so the sum has the CPU's bits.  Why: the row-order FP64 sum
 * it replaces was one thread per channel walking the block while the other
 * half of the CTA waited at the barrier (ncu: barrier 2.1 and long
 * scoreboard 2.1 stalls per issue in the one-pass V kernel). */
template <int D>
struct tree_geom {
    using G = plain_geom<D>;
    static constexpr int LEAVES = QVI_TREE_LEAVES / G::RPC; /* a thread's leaves      */
    static constexpr int NODES = QVI_TREE_LEAVES / G::RPW;  /* a CTA's after shuffles */
    /* the nodes, then each warp's least and greatest values */
    static constexpr int FLOATS = (NODES + 2 * PREP_WARPS) * D;
    static_assert(LEAVES * G::RPC == QVI_TREE_LEAVES && NODES == LEAVES * PREP_WARPS,
                  "a leaf's rows are one thread's steps");
};

/* Every thread of the CTA: its leaves and (EXT) its valid rows' extremes,
 * the warp's levels by shuffles, into red[tree_geom<D>::FLOATS].  valid:
 * the block's rows before n (rows past n are +0 in raw, as the CPU reads
 * them, and not in the extremes). */
template <int DT, int D, bool EXT = true>
static __device__ __forceinline__ void tree_block_part(const uint4 (&raw)[plain_geom<D>::STEPS],
                                                       int valid, float *red) {
    using G = plain_geom<D>;
    using T = tree_geom<D>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = (lane % G::LPR) * PLAIN_CPL, key0 = warp * G::RPW + lane / G::LPR;
    /* a pass per leaf, then the extremes on the packed rows: the one-pass
     * V kernel keeps the rows for its codes, and with 16 float extremes
     * live beside them ptxas spilled (296 bytes at 80 registers) */
#pragma unroll
    for (int j = 0; j < T::LEAVES; ++j) {
        float node[PLAIN_CPL];
#pragma unroll
        for (int s = j; s < G::STEPS; s += T::LEAVES) {
            float x[PLAIN_CPL];
            qvc_widen8<DT>(raw[s], x);
#pragma unroll
            for (int e = 0; e < PLAIN_CPL; ++e) node[e] = s == j ? x[e] : __fadd_rn(node[e], x[e]);
        }
#pragma unroll
        for (int o = G::LPR; o < 32; o <<= 1)
#pragma unroll
            for (int e = 0; e < PLAIN_CPL; ++e)
                node[e] = __fadd_rn(node[e], __shfl_xor_sync(FULL_MASK, node[e], o));
        if (lane < G::LPR) {
            float4 *n4 = (float4 *)(red + (warp + PREP_WARPS * j) * D + c0);
            n4[0] = make_float4(node[0], node[1], node[2], node[3]);
            n4[1] = make_float4(node[4], node[5], node[6], node[7]);
        }
    }
    if (!EXT) return;
    /* the extremes packed, as loaded (widening is exact and monotone, so
     * the widened extremes are fminf's and fmaxf's over the floats) */
    constexpr uint32_t PINF = DT == QVA_BF16 ? 0x7f807f80u : 0x7c007c00u;
    uint32_t lo[4] = {PINF, PINF, PINF, PINF}, hi[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) hi[w] = PINF | 0x80008000u; /* -inf */
#pragma unroll
    for (int s = 0; s < G::STEPS; ++s)
        if (key0 + s * G::RPC < valid) {
            const uint32_t u[4] = {raw[s].x, raw[s].y, raw[s].z, raw[s].w};
#pragma unroll
            for (int w = 0; w < 4; ++w) lo[w] = qvc_hmin2<DT>(lo[w], u[w]), hi[w] = qvc_hmax2<DT>(hi[w], u[w]);
        }
#pragma unroll
    for (int o = G::LPR; o < 32; o <<= 1)
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            lo[w] = qvc_hmin2<DT>(lo[w], __shfl_xor_sync(FULL_MASK, lo[w], o));
            hi[w] = qvc_hmax2<DT>(hi[w], __shfl_xor_sync(FULL_MASK, hi[w], o));
        }
    if (lane >= G::LPR) return;
    float f[PLAIN_CPL];
    qvc_widen8<DT>(make_uint4(lo[0], lo[1], lo[2], lo[3]), f);
    float4 *n4 = (float4 *)(red + (T::NODES + warp) * D + c0);
    n4[0] = make_float4(f[0], f[1], f[2], f[3]);
    n4[1] = make_float4(f[4], f[5], f[6], f[7]);
    qvc_widen8<DT>(make_uint4(hi[0], hi[1], hi[2], hi[3]), f);
    n4 = (float4 *)(red + (T::NODES + PREP_WARPS + warp) * D + c0);
    n4[0] = make_float4(f[0], f[1], f[2], f[3]);
    n4[1] = make_float4(f[4], f[5], f[6], f[7]);
}

/* The thread of channel c, after the barrier that follows tree_block_part:
 * the tree's sum, and (EXT) the block's least and greatest valid value
 * (+inf and -inf when there is none that is not NaN). */
template <int D, bool EXT = true>
static __device__ __forceinline__ float tree_block_finish(const float *red, int c, float *lo,
                                                          float *hi) {
    using T = tree_geom<D>;
    float nd[T::NODES];
#pragma unroll
    for (int k = 0; k < T::NODES; ++k) nd[k] = red[k * D + c];
#pragma unroll
    for (int w = T::NODES / 2; w >= 1; w /= 2) /* w pairs: a constant trip count */
#pragma unroll
        for (int k = 0; k < T::NODES / 2; ++k)
            if (k < w) nd[k] = __fadd_rn(nd[2 * k], nd[2 * k + 1]);
    if (!EXT) return nd[0];
    float a = INFINITY, b = -INFINITY;
#pragma unroll
    for (int w = 0; w < PREP_WARPS; ++w)
        a = fminf(a, red[(T::NODES + w) * D + c]), b = fmaxf(b, red[(T::NODES + PREP_WARPS + w) * D + c]);
    *lo = a, *hi = b;
    return nd[0];
}

/* One 128-row block of X[perm]: channel c's tree sum (qvi_block_sum) and
 * (EXT) the block's extremes (tree_block_part, tree_block_finish).  Every
 * thread of the CTA calls it; returns whether this thread has a channel
 * (c < D).  V's block means and the K mean's block sums read their
 * blocks this way: 8 channels a lane, every load in flight. */
template <int DT, int D, bool EXT>
static __device__ __forceinline__ bool plain_block_sum(const qvc_view &x, const int32_t *perm,
                                                       int bh, int n, int blk, float *red,
                                                       float *sum, float *mn, float *mx) {
    using G = plain_geom<D>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = (lane % G::LPR) * PLAIN_CPL, key0 = warp * G::RPW + lane / G::LPR;
    {
        uint4 raw[G::STEPS];
        plain_load_rows<D>(x, perm, bh, n, qvc_head_base(x, bh), blk * QVI_BLOCK + key0, c0, raw);
        tree_block_part<DT, D, EXT>(raw, n - blk * QVI_BLOCK, red);
    }
    __syncthreads();
    const int c = threadIdx.x;
    if (c >= D) return false;
    *sum = tree_block_finish<D, EXT>(red, c, mn, mx);
    return true;
}

/* 8 floats from a 32-byte aligned address (the plain kernels' per-channel
 * constants: c0 is a multiple of 8 and the arrays are cudaMalloc'd), as two
 * 16-byte loads issued together. */
static __device__ __forceinline__ void plain_load8f(const float *a, float *x) {
    const float4 u = __ldg((const float4 *)a), v = __ldg((const float4 *)a + 1);
    x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w, x[4] = v.x, x[5] = v.y, x[6] = v.z, x[7] = v.w;
}

/* The lane's block and channels when a 128-thread CTA's warps each take
 * 32 / LPR blocks (a row of D channels is LPR = D / QK_CPL lanes). */
template <int D>
struct block_lanes {
    static constexpr int PER_WARP = 32 / qk_geom<D>::LPR;
    static constexpr int PER_CTA = 4 * PER_WARP;
};

#endif
