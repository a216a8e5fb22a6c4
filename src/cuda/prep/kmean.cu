/*
 * K smoothing's channel mean on the device, qvc_kmean (prep_internal.h):
 * the two-level FP64 sum of the CPU's qvi_channel_mean, bit for bit.
 *
 *   kmean_block_kernel<DT>  one CTA per (128-row block, bh), thread =
 *                           channel: the block's FP64 sum of K[perm] in row
 *                           order, into partial [BH][nblk][D].
 *   kmean_finish_kernel     thread = (bh, channel): the block sums in block
 *                           order, divided by n, rounded to float.
 * Every block is read once by one CTA (about the cost of a copy of K); the
 * only sequential work is nblk FP64 adds per channel.
 */
#include <stdint.h>

#include "common/device_util.cuh"
#include "prep_internal.h"

#define KSM_THREADS MAX_D
#define KSM_UNROLL 16

template <int DT>
__global__ void __launch_bounds__(KSM_THREADS)
kmean_block_kernel(qvc_view k, const int32_t *perm, int n, int nblk, double *partial) {
    const int blk = blockIdx.x, bh = blockIdx.y, c = threadIdx.x, D = (int)k.D;
    if (c >= D) return;
    const int64_t base = qvc_head_base(k, bh);
    const int r0 = blk * QVI_BLOCK, rows = min(QVI_BLOCK, n - r0);
    const int32_t *pr = perm ? perm + (int64_t)bh * n + r0 : NULL;
    double s = 0.0;
    for (int r = 0; r < rows; r += KSM_UNROLL) {
        float x[KSM_UNROLL];
#pragma unroll
        for (int u = 0; u < KSM_UNROLL; ++u) { /* loads first, then the ordered adds */
            const int i = r + u;
            const int64_t row = i < rows ? (pr ? (int64_t)__ldg(pr + i) : (int64_t)(r0 + i)) : -1;
            x[u] = row >= 0 ? qvc_ld<DT>(k.data, base + row * k.sn + c) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < KSM_UNROLL; ++u)
            if (r + u < rows) s = __dadd_rn(s, (double)x[u]);
    }
    partial[((int64_t)bh * nblk + blk) * D + c] = s;
}

__global__ void kmean_finish_kernel(const double *partial, int n, int nblk, int BH, int D,
                                    float *mean) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)BH * D) return;
    const int bh = (int)(t / D), c = (int)(t % D);
    const double *p = partial + (int64_t)bh * nblk * D + c;
    double s = 0.0;
    for (int b = 0; b < nblk; ++b) s = __dadd_rn(s, p[(int64_t)b * D]);
    mean[t] = __double2float_rn(__ddiv_rn(s, (double)n));
}

qva_status qvc_kmean(const qvc_view *k, const int32_t *perm, int n, int BH, float *mean,
                     cudaStream_t st) {
    const int D = (int)k->D;
    if (n < 1 || D < 1 || D > MAX_D)
        return qvi_fail(QVA_ERR_SHAPE, "K mean: n=%d D=%d", n, D);
    const int nblk = qvi_cdiv(n, QVI_BLOCK);
    double *partial = NULL;
    cudaError_t e = cudaMallocAsync((void **)&partial, (size_t)BH * nblk * D * sizeof(double), st);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "K mean: cudaMallocAsync");
    dim3 grid((unsigned)nblk, (unsigned)BH);
    QVC_DISPATCH_DTYPE(k->dtype, (kmean_block_kernel<DT_><<<grid, KSM_THREADS, 0, st>>>(
                                     *k, perm, n, nblk, partial)));
    qva_status s = qvc_launch_check("K mean: block sums");
    if (s == QVA_OK) {
        const int64_t cells = (int64_t)BH * D;
        kmean_finish_kernel<<<(unsigned)((cells + 255) / 256), 256, 0, st>>>(partial, n, nblk, BH,
                                                                             D, mean);
        s = qvc_launch_check("K mean: finish");
    }
    if ((e = cudaFreeAsync(partial, st)) != cudaSuccess && s == QVA_OK)
        s = qvc_cuda_fail(e, "K mean: cudaFreeAsync");
    return s;
}
