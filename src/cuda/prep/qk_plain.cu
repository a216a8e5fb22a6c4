/*
 * INT8 Q and K of the 8-bit methods, rotated (+hadamard, the default) or
 * not, from 16-bit inputs that allow 16-byte loads: the common case, with
 * the generality of qk.cu (E4M3, f32, unaligned views) left out.  The
 * codes and scales are qk.cu's, bit for bit (the same float operations in
 * the same order); qvc_prep_qk8 chooses (qk_plain_ok).
 *
 *   qk_plain_kernel<DT,D,ROWS,ROT>  one CTA of 256 threads per (128-row
 *                        block, bh).  A lane holds 8 adjacent channels
 *                        (one 16-byte load per row), so a row is D/8
 *                        lanes.  Each thread loads all of its rows of the
 *                        block first (8 rows at D 128: 128 bytes in
 *                        flight per thread) and keeps them packed, 32
 *                        registers.  ROT: the Hadamard rotation, strides
 *                        1-4 in the lane's registers, 8 and up by
 *                        shuffles.  ROWS: one scale per row (INT8 Q),
 *                        a max over the row's lanes; else one per block
 *                        (K, smoothed by its channel mean and gathered
 *                        by the permutation): the block max from the K
 *                        mean pass's block extremes (qvc_block_ext) where
 *                        it made them (unrotated K), else from the
 *                        rows (rotated K: rotated once, kept in shared
 *                        memory); then the codes, one read of K.
 *                        Rotated at head dim 128 (without +kprev's code
 *                        sums) goes to qk_wide.cu instead.
 *
 * Why: qk.cu's lane of 4 channels pays a row's fixed work (the shuffles of
 * its max, the IEEE division and reciprocal of its scale, the addresses)
 * for 4 values; the kernels ran at one warp instruction per value, 66% of
 * the issue rate and a third of DRAM bandwidth (bench/NOTES.md, "Loads in
 * flight").  Here that work is shared by 8 values and K is read once.
 */
#include <math.h>
#include <stdint.h>

#include "common/quant_code.cuh"
#include "prep_common.cuh"

#define QKP_CPL PLAIN_CPL

/* qva_hadamard of row x (the lane's 8 channels sub*8 + e; +0 past n), in
 * its order of stages h = 1, 2, ... D/2: the signs (valid rows only, so a
 * padding row stays +0), strides 1-4 within the lane, strides 8 and up
 * between lanes sub ^ h/8 (the lane without that bit holds a and gets
 * a + b, its partner a - b), then the scale.  qk.cu's qk_row4 at 8
 * channels per lane.  Every lane of the warp calls it (the shuffles). */
template <int D>
static __device__ __forceinline__ void qkp_rotate(const qk_params &p, bool valid, const float *sg,
                                                  float *x) {
    const int sub = (threadIdx.x & 31) % plain_geom<D>::LPR;
    hadamard_in_lane<QKP_CPL>(x, sg, valid);
#pragma unroll
    for (int hl = 1; hl < plain_geom<D>::LPR; hl <<= 1) {
        /* o - x or x + o as one rounding of o + (+-1)x: the same value,
         * zeros' signs included, in one FFMA instead of two FADDs */
        const float side = (sub & hl) ? -1.0f : 1.0f;
#pragma unroll
        for (int e = 0; e < QKP_CPL; ++e) {
            const float o = __shfl_xor_sync(FULL_MASK, x[e], hl);
            x[e] = __fmaf_rn(side, x[e], o);
        }
    }
#pragma unroll
    for (int e = 0; e < QKP_CPL; ++e) x[e] = __fmul_rn(x[e], p.had_scale);
}

/* Row s of the thread's rows as the CPU has it before quantization: +0
 * past n, else loaded, (with mean) smoothed and (ROT) rotated. */
template <int DT, int D, bool ROT>
static __device__ __forceinline__ void qkp_row(const qk_params &p, const uint4 &u, bool valid,
                                               const float *mean, bool smooth, const float *sg,
                                               float *x) {
    qvc_widen8<DT>(u, x);
    if (smooth && valid) {
#pragma unroll
        for (int e = 0; e < QKP_CPL; ++e) x[e] = __fsub_rn(x[e], mean[e]);
    }
    if (ROT) qkp_rotate<D>(p, valid, sg, x);
}

static __device__ __forceinline__ void qkp_fill(float *x, float v) {
#pragma unroll
    for (int e = 0; e < QKP_CPL; ++e) x[e] = v;
}

/* |x| <= the amax that made scale (the row's or the block's own values). */
static __device__ __forceinline__ uint2 qkp_codes8(const float *x, float scale, float rcp) {
    return make_uint2(qvc_int8_codes4_bounded(x, scale, rcp), qvc_int8_codes4_bounded(x + 4, scale, rcp));
}

/* Max over a row's LPR lanes (xor offsets stay inside the row). */
template <int D>
static __device__ __forceinline__ float qkp_row_max(float x) {
#pragma unroll
    for (int o = plain_geom<D>::LPR / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

/* The lane's share of the block amax from the block's per-channel extremes
 * (qvc_block_ext): x -> fl(x - mean) is monotone, so |fl(x - mean)| is
 * largest at the channel's least or greatest x; fmaxf skips a NaN there as
 * the row-by-row max skips a NaN value, and a channel with no non-NaN value
 * (min > max) adds nothing, as its NaN values add nothing there.  Padding
 * rows (+0) add nothing either way.  A row's lanes cover every channel, so
 * their max (qkp_row_max) is the block's. */
static __device__ __forceinline__ float qkp_ext_amax(const qk_params &p, int bh, int blk, int c0,
                                                     const float *mean, bool smooth) {
    const int64_t o = ((int64_t)bh * (p.n_pad / QVI_BLOCK) + blk) * p.x.D + c0;
    float a = 0.0f;
#pragma unroll
    for (int e = 0; e < QKP_CPL; ++e) {
        const float lo = p.ext.min[o + e], hi = p.ext.max[o + e];
        if (!(lo <= hi)) continue;
        const float ylo = smooth ? __fsub_rn(lo, mean[e]) : lo, yhi = smooth ? __fsub_rn(hi, mean[e]) : hi;
        a = fmaxf(a, fmaxf(fabsf(ylo), fabsf(yhi)));
    }
    return a;
}

/* The lane's shares of the rows and the operation's constants. */
struct qkp_lane {
    int blk, bh, c0, r0;
    const float *mean, *sg;
    bool smooth;
};

/* INT8 Q: one scale per row, a max over the row's lanes. */
template <int DT, int D, bool ROT>
static __device__ __forceinline__ void qkp_rows_per_row(const qk_params &p, const qkp_lane &L,
                                                        const uint4 (&raw)[plain_geom<D>::STEPS],
                                                        int8_t *codes) {
    using G = plain_geom<D>;
    float *scales = p.scale + (int64_t)L.bh * p.n_pad + L.r0;
#pragma unroll
    for (int s = 0; s < G::STEPS; ++s) {
        float x[QKP_CPL], amax = 0.0f;
        qkp_row<DT, D, ROT>(p, raw[s], L.r0 + s * G::RPC < p.n, L.mean, false, L.sg, x);
#pragma unroll
        for (int e = 0; e < QKP_CPL; ++e) amax = fmaxf(amax, fabsf(x[e]));
        const float scale = qvc_int8_delta(qkp_row_max<D>(amax));
        if (L.c0 == 0) scales[s * G::RPC] = scale;
        *(uint2 *)(codes + (int64_t)s * G::RPC * D) = qkp_codes8(x, scale, __frcp_rn(scale));
    }
}

/* +kprev: the thread's codes of one row added into its channels' sums (a
 * dp4a with a one-hot byte picks one signed code each). */
static __device__ __forceinline__ void qkp_add_codes(const uint2 &w, int (&cs)[QKP_CPL]) {
#pragma unroll
    for (int e = 0; e < QKP_CPL; ++e)
        cs[e] = __dp4a((int)(e < 4 ? w.x : w.y), 1 << (8 * (e & 3)), cs[e]);
}

/* +kprev: the block's column sums of its codes into p.csum: the row lanes
 * of a channel group, then the warps, all integer adds (no order). */
template <int D>
static __device__ __forceinline__ void qkp_write_code_sums(const qk_params &p, const qkp_lane &L,
                                                           int (&cs)[QKP_CPL], int *sums) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < D) sums[threadIdx.x] = 0;
#pragma unroll
    for (int o = plain_geom<D>::LPR; o < 32; o <<= 1)
#pragma unroll
        for (int e = 0; e < QKP_CPL; ++e) cs[e] += __shfl_xor_sync(FULL_MASK, cs[e], o);
    __syncthreads();
    if (lane < plain_geom<D>::LPR)
#pragma unroll
        for (int e = 0; e < QKP_CPL; ++e) atomicAdd(&sums[L.c0 + e], cs[e]);
    __syncthreads();
    if (threadIdx.x < D)
        p.csum[((int64_t)L.bh * (p.n_pad / QVI_BLOCK) + L.blk) * D + threadIdx.x] = sums[threadIdx.x];
}

/* One scale per block, stored by thread 0; returns its reciprocal. */
static __device__ __forceinline__ float qkp_block_scale(const qk_params &p, const qkp_lane &L,
                                                        float amax, float *scale) {
    *scale = qvc_int8_delta(amax);
    if (threadIdx.x == 0) p.scale[(int64_t)L.bh * (p.n_pad / QVI_BLOCK) + L.blk] = *scale;
    return __frcp_rn(*scale);
}

/* Rotated K: the rotated rows kept as floats, so the rotation runs once
 * (the extremes say nothing of rotated rows), in shared memory (rot: the
 * block's [128][D] floats; each thread reads back only what it wrote):
 * kept in registers they held the kernel to two CTAs an SM (118
 * registers), which left DRAM a third busy. */
template <int DT, int D, bool CSUM>
static __device__ __forceinline__ void qkp_block_kept(const qk_params &p, const qkp_lane &L,
                                                      const uint4 (&raw)[plain_geom<D>::STEPS],
                                                      float *red, float *rot, int8_t *codes,
                                                      int (&cs)[QKP_CPL]) {
    using G = plain_geom<D>;
    const int row0 = L.r0 - L.blk * QVI_BLOCK; /* the thread's first row in the block */
    float amax = 0.0f;
#pragma unroll
    for (int s = 0; s < G::STEPS; ++s) {
        float x[QKP_CPL];
        qkp_row<DT, D, true>(p, raw[s], L.r0 + s * G::RPC < p.n, L.mean, L.smooth, L.sg, x);
#pragma unroll
        for (int e = 0; e < QKP_CPL; ++e) amax = fmaxf(amax, fabsf(x[e]));
        float4 *t = (float4 *)(rot + (row0 + s * G::RPC) * D + L.c0);
        t[0] = make_float4(x[0], x[1], x[2], x[3]);
        t[1] = make_float4(x[4], x[5], x[6], x[7]);
    }
    float scale;
    const float rcp = qkp_block_scale(p, L, block_max(amax, red), &scale);
#pragma unroll
    for (int s = 0; s < G::STEPS; ++s) {
        const float4 *t = (const float4 *)(rot + (row0 + s * G::RPC) * D + L.c0);
        const float4 a = t[0], b = t[1];
        const float x[QKP_CPL] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const uint2 w = qkp_codes8(x, scale, rcp);
        *(uint2 *)(codes + (int64_t)s * G::RPC * D) = w;
        if (CSUM) qkp_add_codes(w, cs);
    }
}

/* Unrotated K: the block max from the extremes where the K mean pass made
 * them, else from the rows; then the rows again (cheap to redo, and fewer
 * registers than keeping them). */
template <int DT, int D, bool CSUM>
static __device__ __forceinline__ void qkp_block_redo(const qk_params &p, const qkp_lane &L,
                                                      const uint4 (&raw)[plain_geom<D>::STEPS],
                                                      float *red, int8_t *codes,
                                                      int (&cs)[QKP_CPL]) {
    using G = plain_geom<D>;
    float amax = 0.0f;
    if (p.ext.min) {
        amax = qkp_row_max<D>(qkp_ext_amax(p, L.bh, L.blk, L.c0, L.mean, L.smooth));
    } else {
#pragma unroll
        for (int s = 0; s < G::STEPS; ++s) {
            float x[QKP_CPL];
            qkp_row<DT, D, false>(p, raw[s], L.r0 + s * G::RPC < p.n, L.mean, L.smooth, L.sg, x);
#pragma unroll
            for (int e = 0; e < QKP_CPL; ++e) amax = fmaxf(amax, fabsf(x[e]));
        }
        amax = block_max(amax, red);
    }
    float scale;
    const float rcp = qkp_block_scale(p, L, amax, &scale);
#pragma unroll
    for (int s = 0; s < G::STEPS; ++s) {
        float x[QKP_CPL];
        qkp_row<DT, D, false>(p, raw[s], L.r0 + s * G::RPC < p.n, L.mean, L.smooth, L.sg, x);
        const uint2 w = qkp_codes8(x, scale, rcp);
        *(uint2 *)(codes + (int64_t)s * G::RPC * D) = w;
        if (CSUM) qkp_add_codes(w, cs);
    }
}

/* Shared memory of rotated K's rows (dynamic: 64 KB at D 128). */
template <int D>
static constexpr int qkp_rot_bytes() { return QVI_BLOCK * D * (int)sizeof(float); }

/* CSUM: K's code sums for +kprev (p.csum), an instance of its own so that
 * the other K instances keep their registers. */
template <int DT, int D, bool ROWS, bool ROT, bool CSUM = false>
__global__ void __launch_bounds__(PREP_THREADS, ROWS ? 3 : ROT ? 3 : 4) /* 3: rotated K's 64 KB */
qk_plain_kernel(qk_params p) {
    using G = plain_geom<D>;
    __shared__ float red[PREP_WARPS];
    extern __shared__ __align__(16) float qkp_rot[]; /* rotated K only */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    qkp_lane L;
    L.blk = blockIdx.x, L.bh = blockIdx.y;
    L.c0 = (lane % G::LPR) * QKP_CPL;
    L.r0 = L.blk * QVI_BLOCK + warp * G::RPW + lane / G::LPR; /* row of step 0 */

    /* ---- producer: every row of the thread, in flight at once */
    uint4 raw[G::STEPS];
    plain_load_rows<D>(p.x, p.perm, L.bh, p.n, qvc_head_base(p.x, L.bh), L.r0, L.c0, raw);
    /* the lane's constants as 16-byte loads, in flight with the rows */
    float mean[QKP_CPL], sg[QKP_CPL];
    L.smooth = !ROWS && p.mean != NULL; /* Q (ROWS) is never smoothed: qvc_qk_plain_ok */
    if (L.smooth)
        plain_load8f(p.mean + (int64_t)L.bh * D + L.c0, mean);
    else
        qkp_fill(mean, 0.0f);
    if (ROT && p.signs)
        plain_load8f(p.signs + L.c0, sg);
    else
        qkp_fill(sg, 1.0f);
    L.mean = mean, L.sg = sg;

    /* ---- codes and scales */
    int8_t *codes = p.codes + ((int64_t)L.bh * p.n_pad + L.r0) * D + L.c0;
    if constexpr (ROWS) {
        qkp_rows_per_row<DT, D, ROT>(p, L, raw, codes);
    } else {
        int cs[QKP_CPL] = {0, 0, 0, 0, 0, 0, 0, 0};
        if constexpr (ROT)
            qkp_block_kept<DT, D, CSUM>(p, L, raw, red, qkp_rot, codes, cs);
        else
            qkp_block_redo<DT, D, CSUM>(p, L, raw, red, codes, cs);
        if constexpr (CSUM) {
            __shared__ int sums[D];
            qkp_write_code_sums<D>(p, L, cs, sums);
        }
    }
}

template <int DT, int D, bool ROT, bool CSUM>
static void launch_qk_plain_k(const qk_params &p, dim3 grid, cudaStream_t st) {
    if (ROT) {
        /* the attribute is per function and idempotent; its failure shows
         * as the launch's (qvc_launch_check) */
        constexpr int smem = qkp_rot_bytes<D>();
        cudaFuncSetAttribute(qk_plain_kernel<DT, D, false, ROT, CSUM>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        qk_plain_kernel<DT, D, false, ROT, CSUM><<<grid, PREP_THREADS, smem, st>>>(p);
    } else {
        qk_plain_kernel<DT, D, false, ROT, CSUM><<<grid, PREP_THREADS, 0, st>>>(p);
    }
}

template <int DT, int D, bool ROT>
static void launch_qk_plain_r(const qk_params &p, dim3 grid, cudaStream_t st) {
    if (p.rows_per_scale == 1)
        qk_plain_kernel<DT, D, true, ROT><<<grid, PREP_THREADS, 0, st>>>(p);
    else if (p.csum)
        launch_qk_plain_k<DT, D, ROT, true>(p, grid, st);
    else
        launch_qk_plain_k<DT, D, ROT, false>(p, grid, st);
}

template <int DT, int D>
static void launch_qk_plain_d(const qk_params &p, dim3 grid, cudaStream_t st) {
    if (p.hadamard)
        launch_qk_plain_r<DT, D, true>(p, grid, st);
    else
        launch_qk_plain_r<DT, D, false>(p, grid, st);
}

bool qvc_qk_plain_ok(const qk_params &p, int D) {
    return p.fmt == QVC_QK_INT8 && (D == 64 || D == 128) &&
           !(p.rows_per_scale == 1 && p.mean) &&
           (p.x.dtype == QVA_BF16 || p.x.dtype == QVA_F16) && qvc_view_vec_ok(&p.x, QKP_CPL);
}

bool qvc_qk_plain_takes_ext(const qk_params &p, int D) {
    return p.rows_per_scale == QVI_BLOCK && !p.hadamard && qvc_qk_plain_ok(p, D);
}

void qvc_qk_plain_launch(const qk_params &p, dim3 grid, int D, cudaStream_t st) {
    if (p.x.dtype == QVA_BF16) {
        if (D == 64) launch_qk_plain_d<QVA_BF16, 64>(p, grid, st);
        else launch_qk_plain_d<QVA_BF16, 128>(p, grid, st);
    } else {
        if (D == 64) launch_qk_plain_d<QVA_F16, 64>(p, grid, st);
        else launch_qk_plain_d<QVA_F16, 128>(p, grid, st);
    }
}
