/*
 * +ksample and +vsample on the device (prep_internal.h): a head's
 * statistics over its QVA_STAT_COUNT(n) sampled tokens (QVA_STAT_ROW, in
 * the caller's token order), as the CPU's sampled_of makes them.
 *
 *   stat_sample_kernel<DT,MEAN>  one CTA of 256 threads per bh: the sampled
 *                         rows come through a shared tile, SS_ROWS at a
 *                         time (every thread loading), and one thread per
 *                         channel folds them in sample order.  MEAN: K's
 *                         FP64 sum, divided by the count and rounded to
 *                         float (the CPU's order, so bit for bit); else
 *                         V's amax, then amax / 2.25 (1 for an all-zero
 *                         channel), and valid[bh] = 1 so that the +vprev
 *                         path (v.cu) codes with them where they serve.
 *
 * Why a tile: one thread walking its channel down 1,024 rows waits out a
 * dependent load per row; the tile's loads are all independent.  The
 * sample is 1,024 rows x D values a head (256 KB of bf16 at D 128), so a
 * call reads a few MB instead of K (or V) once more.
 */
#include <stdint.h>

#include "prep_common.cuh"

#define SS_THREADS 256
#define SS_ROWS 64

template <int DT, bool MEAN>
__global__ void __launch_bounds__(SS_THREADS)
stat_sample_kernel(qvc_view x, float *out, int *valid) {
    __shared__ float tile[SS_ROWS][MAX_D];
    const int bh = blockIdx.x, D = (int)x.D, c = threadIdx.x;
    const int64_t n = x.N, m = QVA_STAT_COUNT(n), base = qvc_head_base(x, bh);
    double sum = 0.0;
    float amax = 0.0f;
    for (int64_t r0 = 0; r0 < m; r0 += SS_ROWS) {
        const int rows = (int)(m - r0 < SS_ROWS ? m - r0 : SS_ROWS);
        for (int e = threadIdx.x; e < rows * D; e += SS_THREADS) {
            const int r = e / D, ch = e - r * D;
            tile[r][ch] = qvc_ld<DT>(x.data, base + QVA_STAT_ROW(r0 + r, n) * x.sn + ch);
        }
        __syncthreads();
        if (c < D)
            for (int r = 0; r < rows; ++r) {
                if (MEAN)
                    sum = __dadd_rn(sum, (double)tile[r][c]);
                else
                    amax = fmaxf(amax, fabsf(tile[r][c]));
            }
        __syncthreads();
    }
    if (c >= D) return;
    if (MEAN) {
        out[(int64_t)bh * D + c] = __double2float_rn(__ddiv_rn(sum, (double)m));
    } else {
        const float s = fmaxf(__fdiv_rn(amax, QVI_V_E4M3_RANGE), 0.0f);
        out[(int64_t)bh * D + c] = s > 0.0f ? s : 1.0f;
        if (c == 0) valid[bh] = 1;
    }
}

qva_status qvc_stat_sample(const qvc_view *x, int BH, int mean, float *out, int *valid,
                           cudaStream_t st) {
    if (x->D > MAX_D)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep: +ksample/+vsample up to head dim %d",
                        MAX_D);
    if (mean)
        QVC_DISPATCH_DTYPE(x->dtype, (stat_sample_kernel<DT_, true>
                                      <<<BH, SS_THREADS, 0, st>>>(*x, out, valid)));
    else
        QVC_DISPATCH_DTYPE(x->dtype, (stat_sample_kernel<DT_, false>
                                      <<<BH, SS_THREADS, 0, st>>>(*x, out, valid)));
    return qvc_launch_check(mean ? "qvc_prep: K mean (+ksample)" : "qvc_prep: V scales (+vsample)");
}
