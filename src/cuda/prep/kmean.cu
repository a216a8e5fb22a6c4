/*
 * K smoothing's channel mean on the device, qvc_kmean (prep_internal.h):
 * the CPU's qvi_channel_mean bit for bit, each 128-row block's FP32 tree
 * sum (qvi_block_sum) added in FP64 in block order.
 *
 *   kmean_block_kernel<DT,D,EXT>  a lane = 4 adjacent channels of one
 *                           128-row block (4 or 8 blocks per 128-thread
 *                           CTA): the block's tree sums of K[perm]
 *                           (block_tree4), into partial [BH][nblk][D];
 *                           EXT: the block's per-channel min and max too,
 *                           from which qk_plain.cu takes K's block amax
 *                           without a pass of its own.
 *   kmean_plain_kernel<DT,D,EXT>  the same sums for 16-bit inputs that
 *                           allow 16-byte loads: the block's rows in
 *                           registers, the tree by shuffles
 *                           (plain_block_sum).
 *   kmean_finish_kernel     thread = (bh, channel): the block sums in block
 *                           order (loaded KSF_AHEAD blocks at a time),
 *                           divided by n, rounded to float.
 * Every block is read once by one CTA (about the cost of a copy of K); the
 * only sequential work is nblk FP64 adds per channel.
 */
#include <stdint.h>

#include "prep_common.cuh"

#define KSM_THREADS 128

/* EXT: also each block's least and greatest value per channel (kext). */
template <int DT, int D, bool EXT>
__global__ void __launch_bounds__(KSM_THREADS)
kmean_block_kernel(qvc_view k, const int32_t *perm, int n, int nblk, int vec, double *partial,
                   qvc_block_ext kext, const int *skip) {
    using L = block_lanes<D>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, bh = blockIdx.y;
    if (skip && skip[bh]) return; /* +kprev: the head's carried mean serves */
    const int blk = blockIdx.x * L::PER_CTA + warp * L::PER_WARP + lane / qk_geom<D>::LPR;
    if (blk >= nblk) return;
    const int c0 = (lane % qk_geom<D>::LPR) * QK_CPL, r0 = blk * QVI_BLOCK;
    float s[QK_CPL], mn[QK_CPL], mx[QK_CPL];
    block_tree4<DT>(k, perm, bh, n, qvc_head_base(k, bh), r0, c0, vec, s, mn, mx);
    const int64_t o = ((int64_t)bh * nblk + blk) * D + c0;
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e) {
        partial[o + e] = (double)s[e];
        if (EXT) kext.min[o + e] = mn[e], kext.max[o + e] = mx[e];
    }
}

template <int DT, int D>
static void launch_kmean_block_d(const qvc_view &k, const int32_t *perm, int n, int nblk, int BH,
                                 double *partial, qvc_block_ext kext, const int *skip,
                                 cudaStream_t st) {
    const int vec = qvc_view_vec_ok(&k, QK_CPL);
    const dim3 grid((unsigned)qvi_cdiv(nblk, block_lanes<D>::PER_CTA), BH);
    if (kext.min)
        kmean_block_kernel<DT, D, true><<<grid, KSM_THREADS, 0, st>>>(k, perm, n, nblk, vec, partial, kext, skip);
    else
        kmean_block_kernel<DT, D, false><<<grid, KSM_THREADS, 0, st>>>(k, perm, n, nblk, vec, partial, kext, skip);
}

/*
 * kmean_block_kernel for 16-bit inputs that allow 16-byte loads: one CTA
 * of PREP_THREADS per (block, bh).  The rows arrive as v_plain_kernel's do
 * (8 channels a lane, every load in flight at once) and stay in registers;
 * the tree's leaves and first levels are made there, the rest by the
 * thread of each channel (plain_block_sum).  Why: the 4-channel lanes
 * spent about 14 instructions a value on the row addressing, the 8-byte
 * loads and their waits (346 us at Wan, 50% of DRAM peak), and a row-order
 * walk by one thread per channel left half the CTA waiting.
 */
template <int DT, int D, bool EXT>
__global__ void __launch_bounds__(PREP_THREADS)
kmean_plain_kernel(qvc_view k, const int32_t *perm, int n, int nblk, double *partial,
                   qvc_block_ext kext, const int *skip) {
    __shared__ __align__(16) float red[tree_geom<D>::FLOATS];
    const int blk = blockIdx.x, bh = blockIdx.y, c = threadIdx.x;
    if (skip && skip[bh]) return; /* the whole CTA, before its barrier */
    float sum, mn, mx;
    if (!plain_block_sum<DT, D, EXT>(k, perm, bh, n, blk, red, &sum, &mn, &mx)) return;
    const int64_t o = ((int64_t)bh * nblk + blk) * D + c;
    partial[o] = (double)sum;
    if (EXT) kext.min[o] = mn, kext.max[o] = mx;
}

/* Whether kmean_plain_kernel serves K: 16-bit, 16-byte loadable. */
static bool kmean_plain_ok(const qvc_view &k) {
    return (k.D == 64 || k.D == 128) && (k.dtype == QVA_BF16 || k.dtype == QVA_F16) &&
           qvc_view_vec_ok(&k, PLAIN_CPL);
}

template <int DT, int D>
static void launch_kmean_plain_d(const qvc_view &k, const int32_t *perm, int n, int nblk, int BH,
                                 double *partial, qvc_block_ext kext, const int *skip,
                                 cudaStream_t st) {
    const dim3 grid((unsigned)nblk, (unsigned)BH);
    if (kext.min)
        kmean_plain_kernel<DT, D, true><<<grid, PREP_THREADS, 0, st>>>(k, perm, n, nblk, partial, kext, skip);
    else
        kmean_plain_kernel<DT, D, false><<<grid, PREP_THREADS, 0, st>>>(k, perm, n, nblk, partial, kext, skip);
}

template <int DT>
static void launch_kmean_block(const qvc_view &k, const int32_t *perm, int n, int nblk, int BH,
                               double *partial, qvc_block_ext kext, const int *skip,
                               cudaStream_t st) {
    if constexpr (DT != QVA_F32) {
        if (kmean_plain_ok(k)) {
            if (k.D == 64) launch_kmean_plain_d<DT, 64>(k, perm, n, nblk, BH, partial, kext, skip, st);
            else launch_kmean_plain_d<DT, 128>(k, perm, n, nblk, BH, partial, kext, skip, st);
            return;
        }
    }
    if (k.D == 64)
        launch_kmean_block_d<DT, 64>(k, perm, n, nblk, BH, partial, kext, skip, st);
    else
        launch_kmean_block_d<DT, 128>(k, perm, n, nblk, BH, partial, kext, skip, st);
}

#define KSF_AHEAD 32

__global__ void kmean_finish_kernel(const double *partial, int n, int nblk, int BH, int D,
                                    float *mean, const float *stored, const int *valid) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)BH * D) return;
    const int bh = (int)(t / D), c = (int)(t % D);
    if (valid && valid[bh]) { /* +kprev: the carried mean */
        mean[t] = stored[t];
        return;
    }
    const double *p = partial + (int64_t)bh * nblk * D + c;
    /* The adds stay in block order; the loads of KSF_AHEAD blocks go out
     * together (one thread per channel leaves little else to hide a load
     * behind: with one load waited on per add this kernel took ~57 us). */
    double s = 0.0;
    int b = 0;
    for (; b + KSF_AHEAD <= nblk; b += KSF_AHEAD) {
        double x[KSF_AHEAD];
#pragma unroll
        for (int u = 0; u < KSF_AHEAD; ++u) x[u] = __ldg(p + (int64_t)(b + u) * D);
#pragma unroll
        for (int u = 0; u < KSF_AHEAD; ++u) s = __dadd_rn(s, x[u]);
    }
    for (; b < nblk; ++b) s = __dadd_rn(s, __ldg(p + (int64_t)b * D));
    mean[t] = __double2float_rn(__ddiv_rn(s, (double)n));
}

qva_status qvc_kmean(const qvc_view *k, const int32_t *perm, int n, int BH, float *mean,
                     qvc_block_ext kext, const float *stored, const int *valid,
                     cudaStream_t st) {
    const int D = (int)k->D;
    if (n < 1 || (D != 64 && D != 128))
        return qvi_fail(QVA_ERR_SHAPE, "K mean: n=%d D=%d (64 or 128)", n, D);
    const int nblk = qvi_cdiv(n, QVI_BLOCK);
    double *partial = NULL;
    cudaError_t e = cudaMallocAsync((void **)&partial, (size_t)BH * nblk * D * sizeof(double), st);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "K mean: cudaMallocAsync");
    QVC_DISPATCH_DTYPE(k->dtype,
                       launch_kmean_block<DT_>(*k, perm, n, nblk, BH, partial, kext, valid, st));
    qva_status s = qvc_launch_check("K mean: block sums");
    if (s == QVA_OK) {
        const int64_t cells = (int64_t)BH * D;
        /* 64-thread CTAs: BH * D threads spread over more SMs' load units */
        kmean_finish_kernel<<<(unsigned)((cells + 63) / 64), 64, 0, st>>>(partial, n, nblk, BH, D,
                                                                          mean, stored, valid);
        s = qvc_launch_check("K mean: finish");
    }
    if ((e = cudaFreeAsync(partial, st)) != cudaSuccess && s == QVA_OK)
        s = qvc_cuda_fail(e, "K mean: cudaFreeAsync");
    return s;
}

/* ------------------------------------------------------------ +kprev */
/* One CTA of D threads per head: thread c sums its channel's blocks in
 * block order (each product kscale_b * csum_b exact in FP64: 24 by 15
 * bits), divides by n, and the CTA undoes the rotation in qva_hadamard's
 * stages (each butterfly's two roundings are the CPU loop's, whatever
 * order the butterflies of a stage run in), scales, applies the signs and
 * adds the mean used.  The head is valid if every channel is finite. */
template <int D>
__global__ void __launch_bounds__(D)
kmean_next_kernel(const int32_t *csum, const float *kscale, const float *used, int rotate,
                  const float *signs, float had_scale, int n, int nblk, float *stored,
                  int *valid) {
    __shared__ float x[D];
    const int bh = blockIdx.x, c = threadIdx.x;
    const int32_t *cs = csum + (int64_t)bh * nblk * D + c;
    const float *ks = kscale + (int64_t)bh * nblk;
    double s = 0.0;
    for (int b = 0; b < nblk; ++b)
        s = __dadd_rn(s, __dmul_rn((double)__ldg(ks + b), (double)__ldg(cs + (int64_t)b * D)));
    x[c] = __double2float_rn(__ddiv_rn(s, (double)n));
    if (rotate) {
        __syncthreads();
#pragma unroll
        for (int h = 1; h < D; h *= 2) {
            if (!(c & h)) {
                const float a = x[c], b = x[c + h];
                x[c] = __fadd_rn(a, b);
                x[c + h] = __fsub_rn(a, b);
            }
            __syncthreads();
        }
        x[c] = __fmul_rn(x[c], had_scale);
        if (signs) x[c] = __fmul_rn(x[c], signs[c]); /* NULL: all +1 */
    }
    const float next = __fadd_rn(used[(int64_t)bh * D + c], x[c]);
    stored[(int64_t)bh * D + c] = next;
    const int ok = __syncthreads_and(isfinite(next));
    if (c == 0) valid[bh] = ok;
}

qva_status qvc_kmean_next(const int32_t *csum, const float *kscale, const float *used,
                          int rotate, const float *signs, int n, int nblk, int BH, int D,
                          float *stored, int *valid, cudaStream_t st) {
    const float hs = (float)(1.0 / sqrt((double)D)); /* qva_hadamard's */
    if (D == 64)
        kmean_next_kernel<64><<<BH, 64, 0, st>>>(csum, kscale, used, rotate, signs, hs, n, nblk,
                                                 stored, valid);
    else if (D == 128)
        kmean_next_kernel<128><<<BH, 128, 0, st>>>(csum, kscale, used, rotate, signs, hs, n, nblk,
                                                   stored, valid);
    else
        return qvi_fail(QVA_ERR_SHAPE, "K mean (+kprev): D=%d (64 or 128)", D);
    return qvc_launch_check("K mean (+kprev): next");
}
