/*
 * V-Smooth grouping on the device: Lloyd k-means over the value tokens of
 * every (batch, head) at once and the stable argsort of the labels, with
 * the rules of qvi_kmeans / qvi_stable_argsort_labels (src/cpu/kmeans.c).
 *
 * Reproducing the CPU exactly:
 *   - distances: FP32, channel order c = 0..D-1, one thread per token,
 *     explicit _rn intrinsics so no FMA is formed (the CPU does not
 *     contract); ties keep the lower cluster (strict <);
 *   - updates: the FP64 sum of a cluster runs over its members in token
 *     order, which is the CPU's order (it accumulates token by token), so
 *     the centroids match bit for bit.  The members of each cluster come
 *     from the same stable sort that yields the final permutation: CUB's
 *     radix sort (stable) on key = bh*k + label with value = token index.
 *     The member lists are then summed by qvc_colsum_mean (prep.cu), one
 *     CTA per (bh, cluster, 32 channels), one dependent DADD per member:
 *     a cluster holding most of a long sequence takes the longest.  The
 *     N x k distance matrix is never stored.
 *   - an empty cluster keeps its centroid; centroid = (float)(sum/count).
 *
 * Per iteration: memset counts -> assign (labels as sort keys, counts by
 * atomics: integer, so order-free) -> sort -> offsets -> update.  After the
 * iterations one more assign + sort writes the permutation straight into
 * perm.
 */
#include <cub/device/device_radix_sort.cuh>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "cuda_internal.h"

/* Defined in prep.cu (FP64 means of row lists in list order); to move
 * into cuda_internal.h. */
extern "C" qva_status qvc_colsum_mean(const qvc_view *v, const int32_t *rows,
                                      int64_t rows_stride, const int *seg_start,
                                      const int *seg_len, int fixed_len,
                                      int seg_per_bh, int nseg, float *out,
                                      cudaStream_t st);

#define KM_THREADS 128
#define KM_MAX_D 128
#define KM_TILE_STRIDE 33 /* 32 channels + 1: conflict-free row reads */

static qva_status km_fail(cudaError_t e, const char *what) {
    cudaGetLastError(); /* clear a non-sticky error */
    if (e == cudaErrorMemoryAllocation)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "%s: %s", what, cudaGetErrorString(e));
    return qvi_fail(QVA_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

static qva_status km_launch_check(const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? QVA_OK : qvi_fail(QVA_ERR_DEVICE, "%s launch: %s", what, cudaGetErrorString(e));
}

/* One element of a user view; bf16 and f16 widen to f32 exactly (the CPU
 * runs k-means on the same widened values).  DT < 0: the dtype is read at
 * run time (cold paths); else it is a compile-time constant so unrolled
 * loops issue their loads back to back. */
template <int DT>
static __device__ __forceinline__ float km_load(const qvc_view &v, int bh,
                                                int64_t row, int c) {
    const int64_t off = (bh / v.H) * v.sb + (bh % v.H) * v.sh + row * v.sn + c;
    const int dt = DT < 0 ? v.dtype : DT;
    if (dt == QVA_F32)
        return __ldg((const float *)v.data + off);
    unsigned short u = __ldg((const unsigned short *)v.data + off);
    if (dt == QVA_BF16)
        return __uint_as_float((unsigned)u << 16);
    return __half2float(__ushort_as_half(u));
}

/* Cold start: centroid j = row floor(j*n/k) (int64 product). */
__global__ void km_init_kernel(qvc_view v, int k, float *cent) {
    const int j = blockIdx.x, bh = blockIdx.y, c = threadIdx.x, D = (int)v.D;
    if (c >= D) return;
    const int64_t row = (int64_t)j * v.N / k;
    cent[((int64_t)bh * k + j) * D + c] = km_load<-1>(v, bh, row, c);
}

__global__ void km_iota_kernel(int32_t *vals, int n, int64_t total) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < total) vals[t] = (int32_t)(t % n);
}

/*
 * One thread per token.  The token's row is staged through shared memory
 * 32 channels at a time (coalesced along D) into registers; the centroids
 * of the bh sit in shared memory when they fit (use_smem), else they are
 * read from global memory (cached).  Channels D..DW-1 are zero on both
 * sides, adding exactly +0 to the sum.
 */
template <int DT, int DW>
__global__ void __launch_bounds__(KM_THREADS)
km_assign_kernel(qvc_view v, int k, const float *cent, int use_smem,
                 uint32_t *keys, int *cnt) {
    extern __shared__ float cs_smem[];
    __shared__ float tile[KM_THREADS * KM_TILE_STRIDE];
    const int bh = blockIdx.y, t = threadIdx.x, warp = t >> 5, lane = t & 31;
    const int D = (int)v.D, n = (int)v.N;
    const int i0 = blockIdx.x * KM_THREADS;
    const float *cg = cent + (int64_t)bh * k * D;
    const float *cs = cg;
    if (use_smem) {
        for (int e = t; e < k * D; e += KM_THREADS) cs_smem[e] = cg[e];
        cs = cs_smem; /* visible after the first barrier below */
    }

    float x[DW];
#pragma unroll
    for (int ch = 0; ch < DW / 32; ++ch) {
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < KM_THREADS / 4; ++rr) {
            const int r = rr * 4 + warp, i = i0 + r, c = ch * 32 + lane;
            tile[r * KM_TILE_STRIDE + lane] = (i < n && c < D) ? km_load<DT>(v, bh, i, c) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < 32; ++u) x[ch * 32 + u] = tile[t * KM_TILE_STRIDE + u];
    }
    const int i = i0 + t;
    if (i >= n) return;

    /* KM_ILP centroids per pass: independent chains interleave, each
     * still summed in channel order; compared in index order afterwards. */
    constexpr int KM_ILP = DW >= 128 ? 1 : 4; /* D = 128: x[] alone is 128 registers */
    int best = 0;
    float bd = 0.0f;
    for (int j0 = 0; j0 < k; j0 += KM_ILP) {
        const float *cj[KM_ILP];
        float acc[KM_ILP];
#pragma unroll
        for (int u = 0; u < KM_ILP; ++u) {
            cj[u] = cs + (int64_t)min(j0 + u, k - 1) * D;
            acc[u] = 0.0f;
        }
#pragma unroll
        for (int c = 0; c < DW; ++c) {
#pragma unroll
            for (int u = 0; u < KM_ILP; ++u) {
                const float d = __fsub_rn(x[c], c < D ? cj[u][c] : 0.0f);
                acc[u] = __fadd_rn(acc[u], __fmul_rn(d, d));
            }
        }
#pragma unroll
        for (int u = 0; u < KM_ILP; ++u) {
            const int j = j0 + u;
            if (j < k && (j == 0 || acc[u] < bd)) { /* strict: ties keep the lower index */
                bd = acc[u];
                best = j;
            }
        }
    }
    keys[(int64_t)bh * n + i] = (uint32_t)bh * (uint32_t)k + (uint32_t)best;
    atomicAdd(&cnt[(int64_t)bh * k + best], 1);
}

/* Exclusive scan of the counts of each bh (k is small; one thread per bh). */
__global__ void km_offsets_kernel(const int *cnt, int *start, int BH, int k) {
    const int bh = blockIdx.x * blockDim.x + threadIdx.x;
    if (bh >= BH) return;
    int acc = 0;
    for (int j = 0; j < k; ++j) {
        start[(int64_t)bh * k + j] = acc;
        acc += cnt[(int64_t)bh * k + j];
    }
}

static size_t km_align(size_t x) { return (x + 255) & ~(size_t)255; }

typedef struct km_state {
    qvc_view v;
    int BH, n, k, D, DW;
    int use_smem;
    size_t smem;
    uint32_t *keys, *keys_sorted;
    int32_t *iota, *members;
    int *cnt, *start;
    void *cub_tmp;
    size_t cub_bytes;
    int end_bit;
    cudaStream_t st;
} km_state;

/* The assign kernel for a dtype and a padded width. */
typedef void (*km_assign_fn)(qvc_view, int, const float *, int, uint32_t *, int *);
template <int DT>
static km_assign_fn km_assign_pick_width(int dw) {
    return dw == 32 ? km_assign_kernel<DT, 32> : dw == 64 ? km_assign_kernel<DT, 64>
                                                          : km_assign_kernel<DT, 128>;
}
static km_assign_fn km_assign_pick(int dtype, int dw) {
    switch (dtype) {
    case QVA_F32: return km_assign_pick_width<QVA_F32>(dw);
    case QVA_BF16: return km_assign_pick_width<QVA_BF16>(dw);
    default: return km_assign_pick_width<QVA_F16>(dw);
    }
}

static qva_status km_assign(const km_state *s, const float *cent) {
    cudaError_t e = cudaMemsetAsync(s->cnt, 0, (size_t)s->BH * s->k * sizeof(int), s->st);
    if (e != cudaSuccess) return km_fail(e, "qvc_kmeans_perm: cudaMemsetAsync");
    dim3 grid(qvi_cdiv(s->n, KM_THREADS), s->BH);
    km_assign_pick(s->v.dtype, s->DW)<<<grid, KM_THREADS, s->smem, s->st>>>(
        s->v, s->k, cent, s->use_smem, s->keys, s->cnt);
    return km_launch_check("qvc_kmeans_perm: assign");
}

static qva_status km_sort(km_state *s, int32_t *vals_out) {
    size_t bytes = s->cub_bytes;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(s->cub_tmp, bytes, s->keys, s->keys_sorted,
                                                    s->iota, vals_out, s->BH * s->n, 0, s->end_bit,
                                                    s->st);
    if (e != cudaSuccess) return km_fail(e, "qvc_kmeans_perm: radix sort");
    return km_launch_check("qvc_kmeans_perm: radix sort");
}

/* Sets the dynamic shared memory of the assign kernel (centroids) and
 * decides whether they fit at all. */
static qva_status km_smem_setup(km_state *s) {
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return km_fail(e, "qvc_kmeans_perm: device attributes");
    const size_t need = (size_t)s->k * s->D * sizeof(float);
    const size_t stat = (size_t)KM_THREADS * KM_TILE_STRIDE * sizeof(float);
    s->use_smem = need + stat + 1024 <= (size_t)optin;
    s->smem = s->use_smem ? need : 0;
    if (s->smem > 48 * 1024) {
        e = cudaFuncSetAttribute((const void *)km_assign_pick(s->v.dtype, s->DW),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s->smem);
        if (e != cudaSuccess) return km_fail(e, "qvc_kmeans_perm: cudaFuncSetAttribute");
    }
    return QVA_OK;
}

extern "C" qva_status qvc_kmeans_perm(const qvc_view *v, int k, int iters,
                                      int warm, float *centroids, int32_t *perm,
                                      cudaStream_t st) {
    if (!v || !v->data || !centroids || !perm)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_kmeans_perm: NULL argument");
    if (v->dtype != QVA_F32 && v->dtype != QVA_BF16 && v->dtype != QVA_F16)
        return qvi_fail(QVA_ERR_DTYPE, "qvc_kmeans_perm: dtype %d", v->dtype);
    if (k < 1 || iters < 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_kmeans_perm: k = %d, iters = %d", k, iters);
    const int64_t BH = v->B * v->H, total = BH * v->N;
    if (v->N < 1 || v->D < 1 || v->D > KM_MAX_D || BH < 1)
        return qvi_fail(QVA_ERR_SHAPE, "qvc_kmeans_perm: N = %lld, D = %lld, B*H = %lld",
                        (long long)v->N, (long long)v->D, (long long)BH);
    if (total > INT32_MAX || BH > 65535 || BH * k > INT32_MAX)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_kmeans_perm: B*H*N = %lld, k = %d too large",
                        (long long)total, k);

    km_state s;
    memset(&s, 0, sizeof s);
    s.v = *v;
    s.BH = (int)BH;
    s.n = (int)v->N;
    s.k = k;
    s.D = (int)v->D;
    s.DW = s.D <= 32 ? 32 : s.D <= 64 ? 64 : 128;
    s.st = st;
    const uint64_t maxkey = (uint64_t)BH * (uint64_t)k - 1;
    s.end_bit = 1;
    while (s.end_bit < 32 && (maxkey >> s.end_bit) != 0) ++s.end_bit;

    qva_status rs = km_smem_setup(&s);
    if (rs != QVA_OK) return rs;

    /* CUB temp size for this problem (no work is done by this call). */
    cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, s.cub_bytes, (const uint32_t *)NULL,
                                                    (uint32_t *)NULL, (const int32_t *)NULL,
                                                    (int32_t *)NULL, (int)total, 0, s.end_bit, st);
    if (e != cudaSuccess) return km_fail(e, "qvc_kmeans_perm: radix sort size");

    const size_t nb = km_align((size_t)total * 4), kb = km_align((size_t)BH * k * sizeof(int));
    const size_t tmp_b = 4 * nb + 2 * kb + km_align(s.cub_bytes);
    char *tmp = NULL;
    if ((e = cudaMallocAsync((void **)&tmp, tmp_b, st)) != cudaSuccess)
        return km_fail(e, "qvc_kmeans_perm: cudaMallocAsync");
    s.keys = (uint32_t *)tmp;
    s.keys_sorted = (uint32_t *)(tmp + nb);
    s.iota = (int32_t *)(tmp + 2 * nb);
    s.members = (int32_t *)(tmp + 3 * nb);
    s.cnt = (int *)(tmp + 4 * nb);
    s.start = (int *)(tmp + 4 * nb + kb);
    s.cub_tmp = tmp + 4 * nb + 2 * kb;

    km_iota_kernel<<<(unsigned)((total + 255) / 256), 256, 0, st>>>(s.iota, s.n, total);
    rs = km_launch_check("qvc_kmeans_perm: iota");
    if (rs == QVA_OK && !warm) {
        km_init_kernel<<<dim3(k, s.BH), KM_MAX_D, 0, st>>>(s.v, k, centroids);
        rs = km_launch_check("qvc_kmeans_perm: init");
    }
    for (int it = 0; it < iters && rs == QVA_OK; ++it) {
        rs = km_assign(&s, centroids);
        if (rs == QVA_OK) rs = km_sort(&s, s.members);
        if (rs == QVA_OK) {
            km_offsets_kernel<<<qvi_cdiv(s.BH, 128), 128, 0, st>>>(s.cnt, s.start, s.BH, k);
            rs = km_launch_check("qvc_kmeans_perm: offsets");
        }
        if (rs == QVA_OK) /* empty clusters (count 0) are left as they are */
            rs = qvc_colsum_mean(&s.v, s.members, s.n, s.start, s.cnt, 0, k, s.BH * k, centroids, st);
    }
    /* Final assignment; its stable sort is the permutation. */
    if (rs == QVA_OK) rs = km_assign(&s, centroids);
    if (rs == QVA_OK) rs = km_sort(&s, perm);

    if ((e = cudaFreeAsync(tmp, st)) != cudaSuccess && rs == QVA_OK)
        rs = km_fail(e, "qvc_kmeans_perm: cudaFreeAsync");
    return rs;
}
