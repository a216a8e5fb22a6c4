/*
 * +ksample and +vsample on the device (cuda_internal.h): a head's
 * statistics over its QVA_STAT_COUNT(n) sampled tokens (QVA_STAT_ROW, in
 * the caller's token order), as the CPU's sampled_of makes them; with a
 * row map, over the n rows it names (draft's packed video rows, -1 for a
 * padding row, read as zeros: the CPU samples its packed copy).
 *
 *   stat_part_kernel<DT,MEAN>  one CTA of D threads per (chunk of
 *                         QVA_STAT_CHUNK sampled rows, bh), a thread per
 *                         channel with all of its chunk's loads in flight
 *                         at once: MEAN, the chunk's FP64 sum in sample
 *                         order; else its amax.
 *   stat_finish_kernel<MEAN>  one CTA of D threads per bh: the chunks'
 *                         sums in chunk order, divided by the count and
 *                         rounded to float (the CPU's two-level order, so
 *                         bit for bit); else their amax / 2.25 (1 for an
 *                         all-zero channel), and valid[bh] = 1 so that
 *                         +vprev's path (v.cu) codes with the scales
 *                         where they serve.
 *
 * Why chunks: the sum's order is fixed, and one thread walking 1,024 rows
 * of its channel waits out a load, then an FP64 add, per row; in 16
 * chunks the loads of a chunk are independent and the chunks run side by
 * side (a sample is 1,024 rows x D values a head, 256 KB of bf16 at D
 * 128: a call reads a few MB instead of K or V once more).
 */
#include <stdint.h>

#include "prep_common.cuh"

/* Chunk g of head bh (its rows' sampled indices g QVA_STAT_CHUNK on). */
template <int DT, bool MEAN>
__global__ void __launch_bounds__(MAX_D)
stat_part_kernel(qvc_view x, int64_t n, const int32_t *map, void *part) {
    const int g = blockIdx.x, bh = blockIdx.y, D = (int)x.D, c = threadIdx.x;
    const int64_t m = QVA_STAT_COUNT(n), base = qvc_head_base(x, bh) + c;
    const int nchunk = (int)((m + QVA_STAT_CHUNK - 1) / QVA_STAT_CHUNK);
    const int64_t i0 = (int64_t)g * QVA_STAT_CHUNK;
    const int rows = (int)(m - i0 < QVA_STAT_CHUNK ? m - i0 : QVA_STAT_CHUNK);
    float v[QVA_STAT_CHUNK];
#pragma unroll
    for (int r = 0; r < QVA_STAT_CHUNK; ++r) {
        int64_t row = r < rows ? QVA_STAT_ROW(i0 + r, n) : -1;
        if (map && row >= 0) row = __ldg(map + row);
        v[r] = row >= 0 ? qvc_ld<DT>(x.data, base + row * x.sn) : 0.0f;
    }
    const int64_t o = ((int64_t)bh * nchunk + g) * D + c;
    if (MEAN) {
        double s = 0.0;
#pragma unroll
        for (int r = 0; r < QVA_STAT_CHUNK; ++r)
            if (r < rows) s = __dadd_rn(s, (double)v[r]);
        ((double *)part)[o] = s;
    } else {
        float a = 0.0f;
#pragma unroll
        for (int r = 0; r < QVA_STAT_CHUNK; ++r) a = fmaxf(a, fabsf(v[r])); /* padding +0 */
        ((float *)part)[o] = a;
    }
}

template <bool MEAN>
__global__ void __launch_bounds__(MAX_D)
stat_finish_kernel(int64_t n, int nchunk, const void *part, float *out, int *valid) {
    const int bh = blockIdx.x, D = blockDim.x, c = threadIdx.x;
    const int64_t o = (int64_t)bh * nchunk * D + c;
    if (MEAN) {
        double s = 0.0;
        for (int g = 0; g < nchunk; ++g) s = __dadd_rn(s, ((const double *)part)[o + (int64_t)g * D]);
        out[(int64_t)bh * D + c] = __double2float_rn(__ddiv_rn(s, (double)QVA_STAT_COUNT(n)));
    } else {
        float a = 0.0f;
        for (int g = 0; g < nchunk; ++g) a = fmaxf(a, ((const float *)part)[o + (int64_t)g * D]);
        const float s = __fdiv_rn(a, QVI_V_E4M3_RANGE); /* >= +0: fmaxf drops NaN */
        out[(int64_t)bh * D + c] = s > 0.0f ? s : 1.0f;
        if (c == 0 && valid) valid[bh] = 1;
    }
}

size_t qvc_stat_sample_bytes(int BH, int n, int D) {
    const int64_t m = QVA_STAT_COUNT(n);
    return (size_t)BH * (size_t)((m + QVA_STAT_CHUNK - 1) / QVA_STAT_CHUNK) * (size_t)D *
           sizeof(double);
}

qva_status qvc_stat_sample(const qvc_view *x, int BH, int64_t n, const int32_t *map, int mean,
                           void *part, float *out, int *valid, cudaStream_t st) {
    if (x->D > MAX_D)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep: +ksample/+vsample up to head dim %d",
                        MAX_D);
    const int64_t m = QVA_STAT_COUNT(n);
    const int nchunk = (int)((m + QVA_STAT_CHUNK - 1) / QVA_STAT_CHUNK), D = (int)x->D;
    const dim3 grid((unsigned)nchunk, (unsigned)BH);
    if (mean) {
        QVC_DISPATCH_DTYPE(x->dtype, (stat_part_kernel<DT_, true><<<grid, D, 0, st>>>(*x, n, map, part)));
        stat_finish_kernel<true><<<BH, D, 0, st>>>(n, nchunk, part, out, valid);
    } else {
        QVC_DISPATCH_DTYPE(x->dtype, (stat_part_kernel<DT_, false><<<grid, D, 0, st>>>(*x, n, map, part)));
        stat_finish_kernel<false><<<BH, D, 0, st>>>(n, nchunk, part, out, valid);
    }
    return qvc_launch_check(mean ? "qvc_prep: K mean (+ksample)" : "qvc_prep: V scales (+vsample)");
}
