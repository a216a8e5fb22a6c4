/*
 * What the draft preparation's two files share (prep_qk.cu: the Q and K
 * packs; prep.cu: V and the other operands): the thread layout of their
 * kernels, the 16-bit rounding, the padding mask and the channel amax
 * reduction.  Included by those two .cu files only.
 */
#ifndef QVATTN_CUDA_DRAFT_PREP_COMMON_CUH
#define QVATTN_CUDA_DRAFT_PREP_COMMON_CUH

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

/* a in the 16-bit operand format (F16: FP16, else BF16), RNE. */
template <int F16>
static __device__ __forceinline__ uint16_t dg_round16(float a) {
    if constexpr (F16)
        return __half_as_ushort(__float2half_rn(a));
    else
        return __bfloat16_as_ushort(__float2bfloat16_rn(a));
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

/* Eight channels of a row as loaded (qvc_ld8): 16-bit vector loads stay
 * packed until used, half the registers of their floats, so that all
 * of a thread's rows can be in flight within a small register budget. */
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

#endif
