/*
 * Operand preparation on the device: load the strided user Q, K, V, apply
 * the permutation, K smoothing, the Hadamard rotation and V-Smooth block
 * demeaning, and quantize into the layouts of cuda_internal.h.  The files
 * of src/cuda/prep/, by role:
 *   qk.cu      Q and K as 8-bit codes (INT8 / E4M3) with block scales
 *   qk_plain.cu  the same for INT8 from 16-bit inputs, rotated or not (the common case)
 *   v_plain.cu   V with per-channel scales from 16-bit inputs (the common case)
 *   kmean.cu   the K channel mean of K smoothing (two-level FP64 sums)
 *   colsum.cu  exact FP64 column means of row lists (qvc_colsum_mean): the
 *              centroid update of kmeans.cu
 *   v.cu       V: block statistics, per-channel scales, E4M3 codes
 *   fp4.cu     the NVFP4 operands of sage4 / vc4 (qvc_prep4, qvc_ops4_*)
 *   prep8.cu   qvc_prep, qvc_ops_alloc / free, the LSE shift
 * This header holds the device helpers and constants that more than one of
 * them needs; prep_internal.h the host functions they call in each other.
 *
 * The values are those of the CPU reference (src/cpu/attention.c,
 * prepare_head / qvi_v8_prepare / quantize_ops, and the quantizers of
 * src/cpu/formats.c), bit for bit:
 *   - every float operation is written with an explicit _rn intrinsic, so
 *     nvcc can never contract a multiply and an add into an FMA the CPU
 *     does not form (the CPU is built -std=c11, which does not contract);
 *   - the FP64 sums (K channel mean, V block means) give the CPU's
 *     sequential sums exactly: V block means (128 rows) are summed
 *     sequentially in row order (v.cu); the K mean in 128-row blocks,
 *     then over blocks, as the CPU defines it (kmean.cu); the k-means
 *     centroid sums in parallel when the data certify that no partial sum
 *     can round, sequentially in the CPU's order otherwise (colsum.cu);
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

/* FP64 sums, in row order, of a lane's QK_CPL channels c0.. over rows
 * r0 .. r0 + len - 1 of X[perm] (8 rows loaded at once, then the ordered
 * adds): the per-block sums of the K mean (kmean.cu) and of V-Smooth's
 * block means (v.cu), bit for bit the CPU's sequential sums.  len is
 * min(128, n - r0), so a group's rows past r0 + len are past n.  MINMAX:
 * also each channel's least and greatest value (fminf / fmaxf, which skip
 * NaN; +inf / -inf when every value is NaN). */
template <int DT, bool MINMAX = false>
static __device__ __forceinline__ void block_colsum4(const qvc_view &x, const int32_t *perm, int bh,
                                                     int n, int64_t base, int r0, int len, int c0,
                                                     int vec, double *s, float *mn = NULL,
                                                     float *mx = NULL) {
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e) {
        s[e] = 0.0;
        if (MINMAX) mn[e] = INFINITY, mx[e] = -INFINITY;
    }
    for (int i = 0; i < len; i += 8) {
        float v[8][QK_CPL];
        prep_load_rows4<DT, 8>(x, perm, bh, n, base, r0 + i, 1, c0, vec, v);
#pragma unroll
        for (int u = 0; u < 8; ++u)
            if (i + u < len)
#pragma unroll
                for (int e = 0; e < QK_CPL; ++e) {
                    s[e] = __dadd_rn(s[e], (double)v[u][e]);
                    if (MINMAX) mn[e] = fminf(mn[e], v[u][e]), mx[e] = fmaxf(mx[e], v[u][e]);
                }
    }
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

/* Channel c's FP64 sum over the first len rows of a shared [128][D] tile
 * of 16-bit values, in row order, and (EXT) their least and greatest
 * value: block_colsum4's bits. */
template <int DT, int D, bool EXT>
static __device__ __forceinline__ void plain_tile_colsum(const uint16_t *tile, int len, int c,
                                                         double *sum, float *mn, float *mx) {
    double s = 0.0;
    float lo = INFINITY, hi = -INFINITY;
#pragma unroll 8
    for (int i = 0; i < len; ++i) {
        const float v = qvc_widen16<DT>(tile[i * D + c]);
        s = __dadd_rn(s, (double)v);
        if (EXT) lo = fminf(lo, v), hi = fmaxf(hi, v);
    }
    *sum = s;
    if (EXT) *mn = lo, *mx = hi;
}

/* One 128-row block of X[perm] as loaded (16-bit values, rows [0, 128) of
 * the block, +0 past n) into a shared [128][D] tile, then, for the threads
 * c < D, channel c's FP64 sum over the block's `len` valid rows in row
 * order and (EXT) their least and greatest value: block_colsum4's bits
 * (one thread per channel walks the tile in order).  Every thread of the
 * CTA (PREP_THREADS) calls it; returns whether this thread has a channel.
 * The K mean's block sums (kmean.cu) and V's demeaned statistics
 * (v_plain.cu) both read their blocks this way: 8 channels a lane, every
 * load in flight, where block_colsum4's 4-channel lanes spent about 14
 * instructions a value on addressing and waits. */
template <int DT, int D, bool EXT>
static __device__ __forceinline__ bool plain_block_colsum(const qvc_view &x, const int32_t *perm,
                                                          int bh, int n, int blk, uint16_t *tile,
                                                          double *sum, float *mn, float *mx) {
    using G = plain_geom<D>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = (lane % G::LPR) * PLAIN_CPL, key0 = warp * G::RPW + lane / G::LPR;
    {
        uint4 raw[G::STEPS];
        plain_load_rows<D>(x, perm, bh, n, qvc_head_base(x, bh), blk * QVI_BLOCK + key0, c0, raw);
#pragma unroll
        for (int s = 0; s < G::STEPS; ++s) *(uint4 *)&tile[(key0 + s * G::RPC) * D + c0] = raw[s];
    }
    __syncthreads();
    const int c = threadIdx.x;
    if (c >= D) return false;
    plain_tile_colsum<DT, D, EXT>(tile, min(QVI_BLOCK, n - blk * QVI_BLOCK), c, sum, mn, mx);
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
