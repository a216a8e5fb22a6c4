/*
 * Rotated INT8 Q with one scale per row (qk_wide_kernel) and rotated K,
 * gathered and smoothed, with one scale per block (k_wide_kernel), at head
 * dim 128 from 16-bit inputs: qk_plain_kernel's codes and scales bit for
 * bit, at 32 channels a lane instead of 8.  qvc_prep_qk8 asks
 * qvc_qk_wide_ok first; qk_plain.cu keeps head dim 64, the unrotated
 * codes and +kprev's code sums.
 *
 * Why: rotated Q is bound by its instruction issue (bench/NOTES.md, "The
 * tree and qk-pipe on the GPU"): 29.6 instructions a value at 8 channels
 * a lane, of which the rotation's four shuffled stages are 8 and the
 * row's scale, made by all 16 lanes of a row, 4.3.  With 4 lanes a row,
 * five of the seven stages run in the lane's registers (one FADD a value
 * each), two are shuffled (SHFL + FFMA), and the row's max, scale and
 * reciprocal are shared by 32 values: about 24 instructions a value.
 *
 * Layout: lane q = lane % 4 of a row holds the 16-byte chunks q + 4j (j =
 * 0..3) of the row, channels 8 (q + 4j) + e, so that each of its four
 * loads and code stores is 64 contiguous bytes a row across the row's 4
 * lanes.  In its registers x[8j + e], the row's stages h = 1, 2, 4 are
 * x's strides 1, 2, 4, stages 8 and 16 are lanes q ^ 1 and q ^ 2, and
 * stages 32 and 64 are x's strides 8 and 16: qva_hadamard's order of
 * stages, each butterfly the same two roundings.  A thread takes 2 rows
 * (row r0 and r0 + 64), a CTA of 256 threads a 128-row block.  K keeps
 * one rotated row in registers and one in 32 KB of shared memory until
 * the block max is known (qk_plain's rotated K stages the whole block in
 * a 64 KB tile, on whose round trip ncu found it waiting).
 */
#include <math.h>
#include <stdint.h>

#include "prep_internal.h"
#include "qk_wide.cuh"

/* The signs are staged in shared memory and read back per row (8 more
 * LDS a row): 80 registers and three CTAs an SM.  Held in registers, 128
 * and two CTAs, the kernel was 8% slower (bench/NOTES.md, "qk-wide"). */
template <int DT>
__global__ void __launch_bounds__(PREP_THREADS, 3) qk_wide_kernel(qk_params p) {
    __shared__ __align__(16) float s_sg[QKW_D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, q = lane % QKW_LPR;
    const int bh = blockIdx.y;
    const int r0 = blockIdx.x * QVI_BLOCK + warp * QKW_RPW + lane / QKW_LPR;

    /* ---- producer: both rows in flight, then the signs for the CTA */
    const int src[QKW_STEPS] = {r0, r0 + QKW_RPC};
    uint4 raw[QKW_STEPS][4];
    qkw_load_rows(p, bh, src, r0, q, raw);
    if (threadIdx.x < QKW_D) s_sg[threadIdx.x] = p.signs ? p.signs[threadIdx.x] : 1.0f;
    __syncthreads();

    /* ---- each row: signed (valid rows only, so that a padding row stays
     * +0), rotated, its scale from the row's 4 lanes, its codes */
    float *scales = p.scale + (int64_t)bh * p.n_pad;
#pragma unroll
    for (int s = 0; s < QKW_STEPS; ++s) {
        const int r = r0 + s * QKW_RPC;
        float x[QKW_CPL];
#pragma unroll
        for (int j = 0; j < 4; ++j) qvc_widen8<DT>(raw[s][j], x + 8 * j);
        if (p.signs && r < p.n) qkw_chunks<false>(s_sg, q, x);
        qkw_stages(x, q, p.had_scale);
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < QKW_CPL; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
        for (int o = QKW_LPR / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
        const float scale = qvc_int8_delta(amax);
        if (q == 0) scales[r] = scale;
        qkw_store_codes(p.codes + ((int64_t)bh * p.n_pad + r) * QKW_D, q, x, scale, __frcp_rn(scale));
    }
}

/* Rotated K (or Q per block): K' = K[perm] rows, less the channel mean
 * (valid rows), signed and rotated, one scale for the block from its
 * rotated rows.  A thread's first rotated row waits for the block max in
 * shared memory ([chunk][thread] float4s, conflict-free, 32 KB a CTA), its
 * second in registers: 64 registers (and one predicated 8-byte spill), so
 * that four CTAs fit an SM.  On the H100 that took 122 us per ten heads of
 * Wan, three CTAs 136 and both rows in registers (111, two CTAs) 151
 * (bench/NOTES.md, "k-smem"). */
#define QKW_K_CTAS 4
template <int DT>
__global__ void __launch_bounds__(PREP_THREADS, QKW_K_CTAS) k_wide_kernel(qk_params p) {
    __shared__ __align__(16) float s_mean[QKW_D], s_sg[QKW_D];
    __shared__ __align__(16) float4 s_row[QKW_CPL / 4][PREP_THREADS];
    __shared__ float red[PREP_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, q = lane % QKW_LPR;
    const int bh = blockIdx.y, blk = blockIdx.x;
    const int r0 = blk * QVI_BLOCK + warp * QKW_RPW + lane / QKW_LPR;
    const bool smooth = p.mean != NULL, sign = p.signs != NULL;

    /* ---- producer: the permutation's entries, then both rows in flight */
    int src[QKW_STEPS];
#pragma unroll
    for (int s = 0; s < QKW_STEPS; ++s) {
        const int r = r0 + s * QKW_RPC;
        src[s] = r >= p.n ? 0 : p.perm ? __ldg(p.perm + (int64_t)bh * p.n + r) : r;
    }
    uint4 raw[QKW_STEPS][4];
    qkw_load_rows(p, bh, src, r0, q, raw);
    if (threadIdx.x < QKW_D) {
        s_mean[threadIdx.x] = smooth ? p.mean[(int64_t)bh * QKW_D + threadIdx.x] : 0.0f;
        s_sg[threadIdx.x] = sign ? p.signs[threadIdx.x] : 1.0f;
    }
    __syncthreads();

    /* ---- each row smoothed and rotated; the first parked in shared
     * memory, the second kept in x */
    float x[QKW_CPL], amax = 0.0f;
#pragma unroll
    for (int s = 0; s < QKW_STEPS; ++s) {
        const bool valid = r0 + s * QKW_RPC < p.n;
#pragma unroll
        for (int j = 0; j < 4; ++j) qvc_widen8<DT>(raw[s][j], x + 8 * j);
        if (smooth && valid) qkw_chunks<true>(s_mean, q, x);
        if (sign && valid) qkw_chunks<false>(s_sg, q, x);
        qkw_stages(x, q, p.had_scale);
#pragma unroll
        for (int i = 0; i < QKW_CPL; ++i) amax = fmaxf(amax, fabsf(x[i]));
        if (s + 1 < QKW_STEPS)
#pragma unroll
            for (int k = 0; k < QKW_CPL / 4; ++k)
                s_row[k][threadIdx.x] = make_float4(x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3]);
    }
    static_assert(QKW_STEPS == 2, "one row parked, one in registers");

    /* ---- the block max, then the codes: the second row from x, the first
     * from its slot (the thread's own, so no barrier beyond block_max's) */
    const float scale = qvc_int8_delta(block_max(amax, red)), rcp = __frcp_rn(scale);
    if (threadIdx.x == 0) p.scale[(int64_t)bh * (p.n_pad / QVI_BLOCK) + blk] = scale;
    int8_t *codes = p.codes + ((int64_t)bh * p.n_pad + r0) * QKW_D;
    qkw_store_codes(codes + (int64_t)QKW_RPC * QKW_D, q, x, scale, rcp);
#pragma unroll
    for (int k = 0; k < QKW_CPL / 4; ++k) {
        const float4 v = s_row[k][threadIdx.x];
        x[4 * k] = v.x, x[4 * k + 1] = v.y, x[4 * k + 2] = v.z, x[4 * k + 3] = v.w;
    }
    qkw_store_codes(codes, q, x, scale, rcp);
}

bool qvc_qk_wide_ok(const qk_params &p, int D) {
    if (D != QKW_D || !p.hadamard || p.csum || !qvc_qk_plain_ok(p, D)) return false;
    return p.rows_per_scale == QVI_BLOCK || (p.rows_per_scale == 1 && !p.perm && !p.mean);
}

template <int DT>
static void launch_qkw(const qk_params &p, dim3 grid, cudaStream_t st) {
    if (p.rows_per_scale != 1)
        k_wide_kernel<DT><<<grid, PREP_THREADS, 0, st>>>(p);
    else
        qk_wide_kernel<DT><<<grid, PREP_THREADS, 0, st>>>(p);
}

void qvc_qk_wide_launch(const qk_params &p, dim3 grid, cudaStream_t st) {
    if (p.x.dtype == QVA_BF16)
        launch_qkw<QVA_BF16>(p, grid, st);
    else
        launch_qkw<QVA_F16>(p, grid, st);
}
