/*
 * Exact FP64 column means of row lists, qvc_colsum_mean (cuda_internal.h):
 * the centroid update of the k-means (kmeans.cu).  Equal to the CPU's
 * sequential FP64 sums bit for bit (update_centroids): a certified
 * parallel pass and a sequential fallback.
 *
 * Head bh has npos positions; position p names row rows[bh*npos + p]
 * (rows NULL: row p) and belongs to segment pos_seg[bh*npos + p] (NULL:
 * segment bh).  Segment g's positions are seg_start[g] .. + seg_len[g]
 * within its head (NULL: 0 and npos); out[g][c] = (float)(sum / len) for
 * len > 0, untouched for len == 0.
 *
 * 1. Parallel pass (colsum_exact_kernel): per (segment, channel) the FP64
 *    sum in any order, the FP64 sum of |x| and q = the lowest set bit
 *    exponent of any nonzero x.  If sum|x| < 2^(q+52) then every partial
 *    sum of any subset, in any order, is a multiple of 2^q below 2^(q+53)
 *    in magnitude, hence exact in FP64: the CPU's sequential sum and ours
 *    are both the exact sum.  This holds for practically all bf16/f16
 *    data (8 or 11 significant bits) and for most f32 data.
 * 2. colsum_finalize_kernel writes those means and flags the others.
 * 3. colsum_kernel redoes only flagged channels sequentially, in list
 *    order (so even their roundings match the CPU): one warp adds, the 7
 *    other warps fill the next 128-row tile of a double buffer.
 */
#include <math.h>
#include <stdint.h>

#include "common/device_util.cuh"

#define CS_THREADS 256
#define CS_ROWS 128
#define CS_LOADERS (CS_THREADS / 32 - 1)                       /* 7  */
#define CS_PER_LOADER ((CS_ROWS + CS_LOADERS - 1) / CS_LOADERS) /* 19 */
#define XP_WARP_POS 256                       /* positions per warp, exact pass */
#define XP_QNONE 0x7F7F7F7F                   /* q of an all-zero channel (memset 0x7F) */

typedef struct colsum_params {
    qvc_view v;
    const int32_t *rows;     /* [BH][npos] or NULL                          */
    const uint32_t *pos_seg; /* [BH][npos] or NULL                          */
    int npos;
    const int *seg_start;    /* [nseg] or NULL (0)                          */
    const int *seg_len;      /* [nseg] or NULL (npos)                       */
    int seg_per_bh, nseg;
    float *out;              /* [nseg][D]                                   */
    double *sum, *asum;      /* [nseg][D] exact-pass accumulators           */
    int *qmin, *exact;       /* [nseg][D]                                   */
} colsum_params;

/* Exponent of the lowest set bit of a finite nonzero float. */
static __device__ __forceinline__ int lowbit_exp(float x) {
    const uint32_t b = __float_as_uint(x) & 0x7FFFFFFFu, E = b >> 23;
    uint32_t m = b & 0x7FFFFFu;
    int e = -149;
    if (E) {
        m |= 0x800000u;
        e = (int)E - 150;
    }
    return e + __ffs((int)m) - 1;
}

static __device__ __forceinline__ void colsum_flush(const colsum_params &p, int g, int c, double s,
                                                    double a, int q) {
    const int64_t o = (int64_t)g * p.v.D + c;
    atomicAdd(p.sum + o, s);
    atomicAdd(p.asum + o, a);
    if (q != XP_QNONE) atomicMin(p.qmin + o, q);
}

/* Each warp takes XP_WARP_POS consecutive positions (lane = channel) and
 * flushes its partials with atomics whenever the segment changes. */
template <int DT>
__global__ void __launch_bounds__(CS_THREADS)
colsum_exact_kernel(colsum_params p) {
    const int bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.v.D, c = blockIdx.z * 32 + lane;
    const int p0 = (blockIdx.x * (CS_THREADS / 32) + warp) * XP_WARP_POS;
    if (p0 >= p.npos) return;
    const int p1 = min(p0 + XP_WARP_POS, p.npos);
    const int64_t base = qvc_head_base(p.v, bh), lb = (int64_t)bh * p.npos;
    int cur = -1, q = XP_QNONE;
    double s = 0.0, a = 0.0;
    for (int pos = p0; pos < p1; pos += 8) {
        int g[8];
        int64_t ro[8];
        float x[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int pp = pos + u;
            const bool in = pp < p1;
            g[u] = !in ? -1 : p.pos_seg ? (int)__ldg(p.pos_seg + lb + pp) : bh;
            ro[u] = !in ? -1 : p.rows ? (int64_t)__ldg(p.rows + lb + pp) : (int64_t)pp;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
            x[u] = (ro[u] >= 0 && c < D) ? qvc_ld<DT>(p.v.data, base + ro[u] * p.v.sn + c) : 0.0f;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (g[u] < 0) continue;
            if (g[u] != cur) { /* warp-uniform: every lane sees the same position */
                if (cur >= 0 && c < D) colsum_flush(p, cur, c, s, a, q);
                cur = g[u];
                s = a = 0.0;
                q = XP_QNONE;
            }
            s += (double)x[u];
            a += (double)fabsf(x[u]);
            if (x[u] != 0.0f) q = min(q, lowbit_exp(x[u]));
        }
    }
    if (cur >= 0 && c < D) colsum_flush(p, cur, c, s, a, q);
}

__global__ void colsum_finalize_kernel(colsum_params p) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)p.nseg * p.v.D) return;
    const int g = (int)(t / p.v.D);
    const int len = p.seg_len ? p.seg_len[g] : p.npos;
    const int q = p.qmin[t];
    /* NaN or Inf make asum non-finite: the comparison fails, and the
     * sequential path reproduces the CPU's result for them too. */
    const int ok = q == XP_QNONE || p.asum[t] < ldexp(1.0, q + 52);
    p.exact[t] = ok;
    if (ok && len > 0) p.out[t] = (float)(p.sum[t] / (double)len);
}

/* Row offsets (in elements, -1 past the end) of the rows this loader
 * fetches for tile t: rows loader, loader + 7, ... of the tile. */
static __device__ __forceinline__ void colsum_rows(const colsum_params &p, const int32_t *rows,
                                                   int start, int len, int t, int loader,
                                                   int64_t *ro) {
#pragma unroll
    for (int m = 0; m < CS_PER_LOADER; ++m) {
        const int rr = loader + CS_LOADERS * m, r = t * CS_ROWS + rr;
        ro[m] = (rr < CS_ROWS && r < len)
                    ? (rows ? (int64_t)__ldg(rows + r) : (int64_t)(start + r)) * p.v.sn
                    : -1;
    }
}

/* Loads the rows at ro (channel c of head base) into a tile. */
template <int DT>
static __device__ __forceinline__ void colsum_data(const colsum_params &p, const int64_t *ro,
                                                   int64_t base, int c, int loader, float *dst) {
    const int D = (int)p.v.D, lane = threadIdx.x & 31;
    float vals[CS_PER_LOADER];
#pragma unroll
    for (int m = 0; m < CS_PER_LOADER; ++m)
        vals[m] = (ro[m] >= 0 && c < D) ? qvc_ld<DT>(p.v.data, base + ro[m] + c) : 0.0f;
#pragma unroll
    for (int m = 0; m < CS_PER_LOADER; ++m) {
        const int rr = loader + CS_LOADERS * m;
        if (rr < CS_ROWS) dst[rr * 33 + lane] = vals[m];
    }
}

/* The sequential path for the channels the exact pass could not certify;
 * a CTA whose 32 channels are all certified returns at once. */
template <int DT>
__global__ void __launch_bounds__(CS_THREADS)
colsum_kernel(colsum_params p) {
    __shared__ float tile[2][CS_ROWS * 33];
    const int seg = blockIdx.x, bh = seg / p.seg_per_bh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int D = (int)p.v.D, c = blockIdx.y * 32 + lane;
    const int start = p.seg_start ? p.seg_start[seg] : 0;
    const int len = p.seg_len ? p.seg_len[seg] : p.npos;
    const bool need = c < D && len > 0 && !p.exact[(int64_t)seg * D + c];
    if (!__syncthreads_or(need)) return;
    const int ntiles = (len + CS_ROWS - 1) / CS_ROWS;
    const int64_t base = qvc_head_base(p.v, bh);
    const int32_t *rows = p.rows ? p.rows + (int64_t)bh * p.npos + start : NULL;

    /* Loaders keep the row offsets of the next tile in registers, fetched
     * one tile ahead, so each tile costs them a single memory round trip. */
    int64_t ro[CS_PER_LOADER];
    if (warp > 0 && ntiles > 0) {
        colsum_rows(p, rows, start, len, 0, warp - 1, ro);
        colsum_data<DT>(p, ro, base, c, warp - 1, tile[0]);
        colsum_rows(p, rows, start, len, 1, warp - 1, ro);
    }
    __syncthreads();
    double s = 0.0;
    for (int t = 0; t < ntiles; ++t) {
        if (warp > 0) {
            if (t + 1 < ntiles) {
                colsum_data<DT>(p, ro, base, c, warp - 1, tile[(t + 1) & 1]);
                colsum_rows(p, rows, start, len, t + 2, warp - 1, ro);
            }
        } else {
            /* Shared loads 16 ahead so the chain is only the DADDs. */
            const float *src = tile[t & 1] + lane;
            const int nr = min(CS_ROWS, len - t * CS_ROWS);
            int rr = 0;
            for (; rr + 16 <= nr; rr += 16) {
                float u[16];
#pragma unroll
                for (int m = 0; m < 16; ++m) u[m] = src[(rr + m) * 33];
#pragma unroll
                for (int m = 0; m < 16; ++m) s += (double)u[m];
            }
            for (; rr < nr; ++rr) s += (double)src[rr * 33];
        }
        __syncthreads();
    }
    if (warp == 0 && need) p.out[(int64_t)seg * D + c] = (float)(s / (double)len);
}

extern "C" qva_status qvc_colsum_mean(const qvc_view *v, const int32_t *rows,
                                      const uint32_t *pos_seg, int npos,
                                      const int *seg_start, const int *seg_len,
                                      int seg_per_bh, int nseg, float *out,
                                      cudaStream_t st) {
    if (nseg <= 0 || npos <= 0) return QVA_OK;
    const int D = (int)v->D, BH = (int)(v->B * v->H), ncg = qvi_cdiv(D, 32);
    const size_t cells = (size_t)nseg * D;
    const size_t b8 = (cells * 8 + 255) & ~(size_t)255, b4 = (cells * 4 + 255) & ~(size_t)255;
    char *tmp = NULL;
    cudaError_t e = cudaMallocAsync((void **)&tmp, 2 * b8 + 2 * b4, st);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "column mean: cudaMallocAsync");
    colsum_params p;
    p.v = *v;
    p.rows = rows;
    p.pos_seg = pos_seg;
    p.npos = npos;
    p.seg_start = seg_start;
    p.seg_len = seg_len;
    p.seg_per_bh = seg_per_bh;
    p.nseg = nseg;
    p.out = out;
    p.sum = (double *)tmp;
    p.asum = (double *)(tmp + b8);
    p.qmin = (int *)(tmp + 2 * b8);
    p.exact = (int *)(tmp + 2 * b8 + b4);
    qva_status s = QVA_OK;
    if ((e = cudaMemsetAsync(tmp, 0, 2 * b8, st)) != cudaSuccess ||
        (e = cudaMemsetAsync(p.qmin, 0x7F, b4, st)) != cudaSuccess)
        s = qvc_cuda_fail(e, "column mean: cudaMemsetAsync");
    if (s == QVA_OK) {
        const int per_cta = (CS_THREADS / 32) * XP_WARP_POS;
        dim3 grid((unsigned)qvi_cdiv(npos, per_cta), (unsigned)BH, (unsigned)ncg);
        QVC_DISPATCH_DTYPE(v->dtype, (colsum_exact_kernel<DT_><<<grid, CS_THREADS, 0, st>>>(p)));
        s = qvc_launch_check("column mean: exact pass");
    }
    if (s == QVA_OK) {
        colsum_finalize_kernel<<<(unsigned)((cells + 255) / 256), 256, 0, st>>>(p);
        s = qvc_launch_check("column mean: finalize");
    }
    if (s == QVA_OK) {
        dim3 grid((unsigned)nseg, (unsigned)ncg);
        QVC_DISPATCH_DTYPE(v->dtype, (colsum_kernel<DT_><<<grid, CS_THREADS, 0, st>>>(p)));
        s = qvc_launch_check("column mean: sequential pass");
    }
    if ((e = cudaFreeAsync(tmp, st)) != cudaSuccess && s == QVA_OK)
        s = qvc_cuda_fail(e, "column mean: cudaFreeAsync");
    return s;
}
