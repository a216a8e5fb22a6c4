/*
 * k-smem3 and k-smem4, versions under trial of prep/qk_wide.cu's rotated
 * K (gathered, smoothed, one scale per block) at head dim 128: its codes
 * and scale bit for bit (the same float operations; the block max is an
 * exact max in any order), with the thread's first rotated row parked in
 * shared memory while the second is made, instead of both in registers.
 * dev_attn reaches them through qvc_dev_kernels.qk8; Q and everything else
 * stay with the library's kernels.
 *
 * Why: k_wide_kernel holds both rotated rows (64 floats) until the block
 * max is known, 111 registers and two CTAs an SM.  A CTA loads, rotates,
 * waits at the block max, then stores, so with two an SM the loads of one
 * seldom cover the other's arithmetic: on the H100 it takes 150 us per ten
 * heads of Wan against Q's 111.6, which moves the same bytes at three CTAs
 * an SM (bench/NOTES.md, "qk-wide").  With one row in registers the kernel
 * fits 3 (k-smem3) or 4 (k-smem4) CTAs an SM; the parked row costs 8
 * STS.128 and 8 LDS.128 a thread, laid out [chunk][thread] so that a warp's
 * 16-byte accesses are consecutive (no bank conflicts), 32 KB a CTA.
 */
#include <math.h>
#include <stdint.h>

#include "prep/prep_internal.h"
#include "prep/qk_wide.cuh"

/* x less (SUB) or times the lane's 32 values of a 128-float shared array,
 * a chunk of 8 at a time, so that 8 registers hold them, not 32. */
template <bool SUB>
static __device__ __forceinline__ void ks_chunks(const float *a, int q, float *x) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float4 u = ((const float4 *)a)[2 * (q + 4 * j)], w = ((const float4 *)a)[2 * (q + 4 * j) + 1];
        const float c[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) x[8 * j + e] = SUB ? __fsub_rn(x[8 * j + e], c[e]) : __fmul_rn(x[8 * j + e], c[e]);
    }
}

template <int DT, int MINB>
__global__ void __launch_bounds__(PREP_THREADS, MINB) k_smem_kernel(qk_params p) {
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
        if (smooth && valid) ks_chunks<true>(s_mean, q, x);
        if (sign && valid) ks_chunks<false>(s_sg, q, x);
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

/* qvc_qk8_launcher: K (a scale per block) where qk_wide.cu would serve it;
 * 0 for Q and the rest, which the library's kernels take. */
template <int MINB>
static int dev_qk8_ksmem(const qk_params *p, int BH, int D, cudaStream_t st) {
    if (p->rows_per_scale != QVI_BLOCK || !qvc_qk_wide_ok(*p, D)) return 0;
    const dim3 grid(p->n_pad / QVI_BLOCK, BH);
    if (p->x.dtype == QVA_BF16)
        k_smem_kernel<QVA_BF16, MINB><<<grid, PREP_THREADS, 0, st>>>(*p);
    else
        k_smem_kernel<QVA_F16, MINB><<<grid, PREP_THREADS, 0, st>>>(*p);
    return 1;
}

extern "C" int dev_qk8_ksmem3(const qk_params *p, int BH, int D, cudaStream_t st) {
    return dev_qk8_ksmem<3>(p, BH, D, st);
}
extern "C" int dev_qk8_ksmem4(const qk_params *p, int BH, int D, cudaStream_t st) {
    return dev_qk8_ksmem<4>(p, BH, D, st);
}
