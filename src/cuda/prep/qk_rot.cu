/*
 * Rotated INT8 Q and K at head dim 128 (+hadamard, the default of sage8
 * and vc8) from 16-bit inputs: qk_plain.cu's codes and scales, bit for bit
 * (the same float operations on each value, in the same order), with the
 * rotation's stages in registers instead of across lanes.
 *
 *   qk_rot_kernel<DT,ROWS>  one CTA of 256 threads per (128-row block, bh).
 *     producer:  the block's rows (gathered by the permutation, +0 past n)
 *                as coalesced 16-byte loads into a swizzled shared tile;
 *     mainloop:  thread t takes half t & 1 (64 channels) of row t >> 1:
 *                the signs (and K's mean), the Hadamard stages h = 1 .. 32
 *                in its registers, h = 64 with its partner lane t ^ 1;
 *     epilogue:  the scale (ROWS: the row's, INT8 Q; else the block's, K),
 *                the codes into a second swizzled tile, stored coalesced.
 *
 * Why: qk_plain_kernel spreads a row over 16 lanes of 8 channels, so four
 * of the seven stages are a shuffle and an FFMA per value, and the row's
 * max and scale are made by all 16 lanes; it ran at 2.3 TB/s (Q) and
 * 1.9 TB/s (K) where the unrotated kernels run at 4 (bench/RESULTS.md,
 * "d525562 on the H200").  Here one stage is shuffled, each value takes
 * about 17 instructions instead of 28, and K's rotated rows stay in
 * registers between its block max and its codes (no 64 KB tile).
 */
#include <math.h>
#include <stdint.h>

#include "common/quant_code.cuh"
#include "prep_common.cuh"

#define QKR_D 128
#define QKR_HALF 64                           /* channels a thread holds */
#define QKR_CHUNKS (QKR_D * 2 / 16)           /* 16-byte chunks in a 16-bit row: 16 */
#define QKR_LOADS (QVI_BLOCK * QKR_CHUNKS / PREP_THREADS) /* 8 per thread */
#define QKR_CODE_CHUNKS (QKR_D / 16)          /* 16-byte chunks in a code row: 8 */
#define QKR_STORES (QVI_BLOCK * QKR_CODE_CHUNKS / PREP_THREADS) /* 4 per thread */

/* Where chunk j of row r of the 16-bit tile lies (in chunks from the
 * row's start): the low three bits moved by the row and the half so that
 * the eight lanes of a 16-byte access phase (four rows, two halves, one j
 * each) and the eight of a row's coalesced write fall in distinct banks. */
static __device__ __forceinline__ int qkr_in_slot(int r, int j) {
    return (j & 8) | (((j & 7) + (j >> 3) + 2 * (r & 3)) & 7);
}

/* The same for chunk j of code row r (8 chunks): a thread writes chunks
 * 4h .. 4h + 3 of its row, a coalesced read takes a row's eight. */
static __device__ __forceinline__ int qkr_out_slot(int r, int j) { return j ^ (r & 3); }

/* ---- producer: the block's rows into the tile, all loads in flight
 * (thread t takes chunk t % 16 of rows t / 16 + 16 i) */
template <int DT>
static __device__ __forceinline__ void qkr_load_block(const qk_params &p, int bh, int blk,
                                                      uint4 *tile) {
    const int64_t base = qvc_head_base(p.x, bh);
    const int j = threadIdx.x % QKR_CHUNKS, r0 = threadIdx.x / QKR_CHUNKS;
    const int rstep = PREP_THREADS / QKR_CHUNKS;
    int64_t src[QKR_LOADS];
#pragma unroll
    for (int i = 0; i < QKR_LOADS; ++i) {
        const int row = blk * QVI_BLOCK + r0 + i * rstep;
        src[i] = row < p.n ? (p.perm ? (int64_t)__ldg(p.perm + (int64_t)bh * p.n + row) : (int64_t)row)
                           : -1;
    }
    const uint4 *x = (const uint4 *)((const unsigned short *)p.x.data + base) + j;
    const int64_t sn = p.x.sn / 8; /* in chunks: qvc_view_vec_ok(x, 8) holds */
    uint4 raw[QKR_LOADS];
#pragma unroll
    for (int i = 0; i < QKR_LOADS; ++i)
        raw[i] = src[i] >= 0 ? __ldg(x + src[i] * sn) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < QKR_LOADS; ++i) {
        const int r = r0 + i * rstep;
        tile[r * QKR_CHUNKS + qkr_in_slot(r, j)] = raw[i];
    }
}

/* ---- mainloop: the thread's 64 values as the CPU has them before
 * quantization (qva_hadamard after smoothing; +0 past n).  The signs are
 * XORed into the widened bits (sbits: 0 or the sign bit per channel),
 * which is x * (+-1) for every x; on a padding row they may leave -0
 * where the CPU has +0, and zeros of either sign give the same amax and
 * codes. */
template <int DT>
static __device__ __forceinline__ void qkr_widen_signed(const uint4 &u, const uint4 &s0,
                                                        const uint4 &s1, float *x) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    const uint32_t sb[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (DT == QVA_BF16) {
            x[2 * i] = __uint_as_float((w[i] << 16) + sb[2 * i]); /* + of the top bit is ^ */
            x[2 * i + 1] = __uint_as_float((w[i] & 0xFFFF0000u) ^ sb[2 * i + 1]);
        } else {
            const float lo = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xFFFFu)));
            const float hi = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
            x[2 * i] = __uint_as_float(__float_as_uint(lo) ^ sb[2 * i]);
            x[2 * i + 1] = __uint_as_float(__float_as_uint(hi) ^ sb[2 * i + 1]);
        }
    }
}

template <int DT>
static __device__ __forceinline__ void qkr_row_values(const qk_params &p, const uint4 *tile,
                                                      const uint4 *consts, int r, int h,
                                                      bool valid, bool smooth, float (&x)[QKR_HALF]) {
    const uint4 *sbits = consts + (QKR_D + h * QKR_HALF) / 4;
#pragma unroll
    for (int k = 0; k < QKR_HALF / 8; ++k)
        qkr_widen_signed<DT>(tile[r * QKR_CHUNKS + qkr_in_slot(r, 8 * h + k)], sbits[2 * k],
                             sbits[2 * k + 1], x + 8 * k);
    if (smooth && valid) {
        /* the CPU smooths, then applies the signs: fl(x - m) s = fl(x s - m s)
         * (RNE is symmetric), zeros' signs aside */
        const float *mean = (const float *)consts + h * QKR_HALF;
#pragma unroll
        for (int e = 0; e < QKR_HALF; ++e) x[e] = __fsub_rn(x[e], mean[e]);
    }
    hadamard_stages<QKR_HALF>(x);
    /* stage 64: a + b in half 0, a - b in half 1, each as one rounding of
     * o + (+-1)x (qkp_rotate's form) */
    const float side = h ? -1.0f : 1.0f;
#pragma unroll
    for (int e = 0; e < QKR_HALF; ++e) {
        const float o = __shfl_xor_sync(FULL_MASK, x[e], 1);
        x[e] = __fmaf_rn(side, x[e], o);
    }
#pragma unroll
    for (int e = 0; e < QKR_HALF; ++e) x[e] = __fmul_rn(x[e], p.had_scale);
}

/* ---- epilogue: codes of the thread's 64 values into the code tile, then
 * the block's 16 KB of codes stored by 16-byte chunks. */
static __device__ __forceinline__ void qkr_codes_to_tile(const float (&x)[QKR_HALF], float scale,
                                                         float rcp, int r, int h, uint4 *out) {
#pragma unroll
    for (int k = 0; k < QKR_HALF / 16; ++k) {
        const float *y = x + 16 * k;
        uint4 w;
        w.x = qvc_int8_codes4_bounded(y, scale, rcp);
        w.y = qvc_int8_codes4_bounded(y + 4, scale, rcp);
        w.z = qvc_int8_codes4_bounded(y + 8, scale, rcp);
        w.w = qvc_int8_codes4_bounded(y + 12, scale, rcp);
        out[r * QKR_CODE_CHUNKS + qkr_out_slot(r, 4 * h + k)] = w;
    }
}

static __device__ __forceinline__ void qkr_store_codes(const qk_params &p, int bh, int blk,
                                                       const uint4 *out) {
    uint4 *codes = (uint4 *)(p.codes + ((int64_t)bh * p.n_pad + (int64_t)blk * QVI_BLOCK) * QKR_D);
#pragma unroll
    for (int i = 0; i < QKR_STORES; ++i) {
        const int g = i * PREP_THREADS + threadIdx.x, r = g / QKR_CODE_CHUNKS, j = g % QKR_CODE_CHUNKS;
        codes[g] = out[r * QKR_CODE_CHUNKS + qkr_out_slot(r, j)];
    }
}

/* Shared memory: the 16-bit tile (32 KB), reused for the codes (16 KB). */
#define QKR_SMEM_BYTES (QVI_BLOCK * QKR_CHUNKS * 16)

template <int DT, bool ROWS>
__global__ void __launch_bounds__(PREP_THREADS, 3)
qk_rot_kernel(qk_params p) {
    extern __shared__ __align__(16) uint4 qkr_tile[];
    /* K's mean times the signs (floats; unused for Q), the signs' bits */
    __shared__ __align__(16) uint32_t consts[2 * QKR_D];
    __shared__ float red[PREP_WARPS];
    const int blk = blockIdx.x, bh = blockIdx.y;
    const int r = threadIdx.x >> 1, h = threadIdx.x & 1;
    const bool valid = blk * QVI_BLOCK + r < p.n;
    const bool smooth = !ROWS && p.mean != NULL; /* Q is never smoothed: qvc_qk_plain_ok */

    qkr_load_block<DT>(p, bh, blk, qkr_tile);
    if (threadIdx.x < QKR_D) {
        const float sg = p.signs ? __ldg(p.signs + threadIdx.x) : 1.0f; /* +-1 */
        const float m = smooth ? __ldg(p.mean + (int64_t)bh * QKR_D + threadIdx.x) : 0.0f;
        consts[threadIdx.x] = __float_as_uint(__fmul_rn(m, sg));
        consts[QKR_D + threadIdx.x] = sg < 0.0f ? 0x80000000u : 0u;
    }
    __syncthreads();

    float x[QKR_HALF];
    qkr_row_values<DT>(p, qkr_tile, (const uint4 *)consts, r, h, valid, smooth, x);
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < QKR_HALF; ++e) amax = fmaxf(amax, fabsf(x[e]));
    float scale;
    if constexpr (ROWS) {
        scale = qvc_int8_delta(fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 1)));
        if (h == 0) p.scale[(int64_t)bh * p.n_pad + (int64_t)blk * QVI_BLOCK + r] = scale;
        __syncthreads(); /* every thread has read the 16-bit tile */
    } else {
        scale = qvc_int8_delta(block_max(amax, red)); /* its barrier also ends the tile's reads */
        if (threadIdx.x == 0) p.scale[(int64_t)bh * (p.n_pad / QVI_BLOCK) + blk] = scale;
    }
    qkr_codes_to_tile(x, scale, __frcp_rn(scale), r, h, qkr_tile);
    __syncthreads();
    qkr_store_codes(p, bh, blk, qkr_tile);
}

bool qvc_qk_rot_ok(const qk_params &p, int D) {
    return D == QKR_D && p.hadamard && !p.csum && qvc_qk_plain_ok(p, D);
}

template <int DT, bool ROWS>
static void qkr_launch(const qk_params &p, dim3 grid, cudaStream_t st) {
    qk_rot_kernel<DT, ROWS><<<grid, PREP_THREADS, QKR_SMEM_BYTES, st>>>(p); /* 32 KB: no opt-in */
}

void qvc_qk_rot_launch(const qk_params &p, dim3 grid, cudaStream_t st) {
    const bool rows = p.rows_per_scale == 1;
    if (p.x.dtype == QVA_BF16)
        rows ? qkr_launch<QVA_BF16, true>(p, grid, st) : qkr_launch<QVA_BF16, false>(p, grid, st);
    else
        rows ? qkr_launch<QVA_F16, true>(p, grid, st) : qkr_launch<QVA_F16, false>(p, grid, st);
}
