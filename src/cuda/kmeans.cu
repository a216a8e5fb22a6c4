/*
 * V-Smooth grouping on the device: Lloyd k-means over the value tokens of
 * every (batch, head) at once and the stable argsort of the labels, with
 * the rules of qvi_kmeans / qvi_stable_argsort_labels (src/cpu/kmeans.c).
 *
 * Reproducing the CPU exactly (labels, centroids and the permutation are
 * bit-identical, tests/cuda_test_ops.c):
 *   - distances: FP32, channel order c = 0..D-1, explicit _rn intrinsics
 *     so no FMA is formed (the CPU does not contract); ties keep the lower
 *     cluster (strict <).  Two tokens per thread; the (token, centroid)
 *     partial distances live in shared memory and grow 32 channels at a
 *     time, KM_ILP centroids interleaved (each chain still in order).
 *   - updates: the CPU adds token by token, so a cluster's FP64 sum runs
 *     over its members in token order.  The members come from the stable
 *     sort that also yields the final permutation (a counting sort,
 *     kmeans_sort.cu; key = bh*k + label, value = token index); qvc_colsum_mean
 *     (prep/colsum.cu) then sums each member list: in parallel where the
 *     data certify that no partial sum can round (every order is then
 *     exact), sequentially in token order otherwise.  So the centroids
 *     equal the CPU's, not just to the last bit but exactly.
 *   - an empty cluster keeps its centroid; centroid = (float)(sum/count).
 *   - the N x k distance matrix is never stored.
 *
 * The assignment of bf16 V with k <= 32 runs on the tensor cores instead
 * (kmeans_tc.cu): the same labels, certified token by token, the CPU's
 * sums where the certificate fails.
 *
 * Per iteration: assign (labels as sort keys) -> sort (label counts,
 * offsets, the stable order) -> update.  After the iterations one more
 * assign + sort writes the permutation straight into perm.
 */
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "common/device_util.cuh"

/* Defined in prep/colsum.cu: FP64 means of row lists equal to the CPU's
 * sequential sums; to move into cuda_internal.h. */

#define KM_THREADS 128
#define KM_MAX_D 128
#define KM_TILE_STRIDE 33 /* 32 channels + 1: conflict-free row reads */

/* One element of a user view; bf16 and f16 widen to f32 exactly (the CPU
 * runs k-means on the same widened values).  DT < 0: the dtype is read at
 * run time (cold paths); else it is a compile-time constant so unrolled
 * loops issue their loads back to back. */
template <int DT>
static __device__ __forceinline__ float km_load(const qvc_view &v, int bh,
                                                int64_t row, int c) {
    const int64_t off = qvc_head_base(v, bh) + row * v.sn + c;
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

/* Stages rows i0..i0+127, channels c0..c0+31 of head bh into tile (zeros
 * past N or D); a warp reads 32 channels of one row per load. */
template <int DT>
static __device__ __forceinline__ void km_stage(const qvc_view &v, int bh, int i0, int c0,
                                                float *tile) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = c0 + lane;
    const int D = (int)v.D, n = (int)v.N;
#pragma unroll
    for (int rr = 0; rr < KM_THREADS / 4; ++rr) {
        const int r = rr * 4 + warp, i = i0 + r;
        tile[r * KM_TILE_STRIDE + lane] = (i < n && c < D) ? km_load<DT>(v, bh, i, c) : 0.0f;
    }
}

/* Token i's label as its sort key: bh * k + label (the segment id of the
 * update, so the heads' clusters never share a key). */
static __device__ __forceinline__ void km_emit(int bh, int n, int k, int i, int best,
                                               uint32_t *keys) {
    keys[(int64_t)bh * n + i] = (uint32_t)bh * (uint32_t)k + (uint32_t)best;
}

/* A token's channels c0 .. c0 + 31 (zeros past D) into x: 16-byte loads
 * where vec (qvc_view_vec_ok(v, 8)) and the 8 channels are all inside D. */
template <int DT>
static __device__ __forceinline__ void km_load_chunk(const qvc_view &v, int64_t row_off, int c0,
                                                     int vec, float *x) {
    const int D = (int)v.D;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        const int c = c0 + 8 * g;
        if (vec && c + 8 <= D) {
            qvc_ld8<DT, true>(v.data, row_off + c, x + 8 * g);
        } else {
#pragma unroll
            for (int u = 0; u < 8; ++u) x[8 * g + u] = c + u < D ? qvc_ld<DT>(v.data, row_off + c + u) : 0.0f;
        }
    }
}

/*
 * Assignment, KM_TPT tokens per thread (KM_CTA_TOKENS per CTA, one head).
 * The head's centroids and each (token, centroid) partial distance live in
 * shared memory; a token's row comes 32 channels at a time into registers
 * (vector loads straight from the view).  For each chunk a thread extends
 * the partial distances of its KM_TPT tokens against KM_ILP centroids at
 * once: KM_TPT x KM_ILP independent chains, each still summed in channel
 * order, so the sums are the CPU's.  One 16-byte centroid read (a
 * broadcast) feeds 4 channels of every token of the thread, so the loop is
 * bound by the FP32 adds, not by shared memory.  Channels past D are zero
 * on both sides and add exactly +0.  The last chunk ends in the CPU's rule
 * over the k distances, in index order: strict <, so ties (and a NaN first
 * distance) keep the lower index.
 */
#define KM_ILP 4
#define KM_TPT 2
#define KM_CTA_TOKENS (KM_THREADS * KM_TPT)
template <int DT>
__global__ void __launch_bounds__(KM_THREADS, 4)
km_assign_kernel(qvc_view v, int vec, int k, const float *cent, uint32_t *keys) {
    /* centroids [k][Dp] zero-padded to Dp = D rounded up to 32, then the
     * partial distances [k][KM_CTA_TOKENS] */
    extern __shared__ float4 km_dyn[];
    const int bh = blockIdx.y, t = threadIdx.x;
    const int D = (int)v.D, Dp = (D + 31) & ~31, n = (int)v.N;
    const int i0 = blockIdx.x * KM_CTA_TOKENS;
    float *cs = (float *)km_dyn, *part = cs + (size_t)k * Dp;
    const float *cg = cent + (int64_t)bh * k * D;
    for (int e = t; e < k * Dp; e += KM_THREADS) {
        const int j = e / Dp, c = e % Dp;
        cs[e] = c < D ? cg[j * D + c] : 0.0f;
    }
    __syncthreads();

    const int64_t base = qvc_head_base(v, bh);
    int64_t row_off[KM_TPT];
#pragma unroll
    for (int s = 0; s < KM_TPT; ++s) row_off[s] = base + (int64_t)min(i0 + s * KM_THREADS + t, n - 1) * v.sn;
    float bd[KM_TPT] = {};
    int best[KM_TPT] = {};

    for (int c0 = 0; c0 < D; c0 += 32) {
        const bool first = c0 == 0, last = c0 + 32 >= D;
        float x[KM_TPT][32];
#pragma unroll
        for (int s = 0; s < KM_TPT; ++s) km_load_chunk<DT>(v, row_off[s], c0, vec, x[s]);
        for (int j0 = 0; j0 < k; j0 += KM_ILP) {
            const float4 *cj[KM_ILP];
            float a[KM_TPT][KM_ILP];
#pragma unroll
            for (int u = 0; u < KM_ILP; ++u) {
                const int j = min(j0 + u, k - 1);
                cj[u] = (const float4 *)(cs + j * Dp + c0);
#pragma unroll
                for (int s = 0; s < KM_TPT; ++s)
                    a[s][u] = first ? 0.0f : part[j * KM_CTA_TOKENS + s * KM_THREADS + t];
            }
#pragma unroll
            for (int c4 = 0; c4 < 8; ++c4) {
#pragma unroll
                for (int u = 0; u < KM_ILP; ++u) {
                    const float4 cv = cj[u][c4]; /* channels 4c4 .. 4c4+3, in order */
#pragma unroll
                    for (int s = 0; s < KM_TPT; ++s) {
                        float d = __fsub_rn(x[s][4 * c4], cv.x);
                        a[s][u] = __fadd_rn(a[s][u], __fmul_rn(d, d));
                        d = __fsub_rn(x[s][4 * c4 + 1], cv.y);
                        a[s][u] = __fadd_rn(a[s][u], __fmul_rn(d, d));
                        d = __fsub_rn(x[s][4 * c4 + 2], cv.z);
                        a[s][u] = __fadd_rn(a[s][u], __fmul_rn(d, d));
                        d = __fsub_rn(x[s][4 * c4 + 3], cv.w);
                        a[s][u] = __fadd_rn(a[s][u], __fmul_rn(d, d));
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < KM_ILP; ++u) {
                const int j = j0 + u;
                if (j >= k) break;
#pragma unroll
                for (int s = 0; s < KM_TPT; ++s) {
                    if (!last) {
                        part[j * KM_CTA_TOKENS + s * KM_THREADS + t] = a[s][u];
                    } else if (j == 0 || a[s][u] < bd[s]) {
                        bd[s] = a[s][u];
                        best[s] = j;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int s = 0; s < KM_TPT; ++s) {
        const int i = i0 + s * KM_THREADS + t;
        if (i < n) km_emit(bh, n, k, i, best[s], keys);
    }
}

/*
 * Fallback when the centroids and partials do not fit in shared memory
 * (very large k): the token row stays in registers (DW = D padded to 64
 * or 128) and the centroids are read from global memory (cached).
 */
template <int DT, int DW>
__global__ void __launch_bounds__(KM_THREADS)
km_assign_global_kernel(qvc_view v, int /* vec */, int k, const float *cent, uint32_t *keys) {
    __shared__ float tile[KM_THREADS * KM_TILE_STRIDE];
    const int bh = blockIdx.y, t = threadIdx.x;
    const int D = (int)v.D, n = (int)v.N, i0 = blockIdx.x * KM_THREADS;
    const float *cs = cent + (int64_t)bh * k * D;
    float x[DW];
#pragma unroll
    for (int ch = 0; ch < DW / 32; ++ch) {
        __syncthreads();
        km_stage<DT>(v, bh, i0, ch * 32, tile);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < 32; ++u) x[ch * 32 + u] = tile[t * KM_TILE_STRIDE + u];
    }
    const int i = i0 + t;
    if (i >= n) return;
    int best = 0;
    float bd = 0.0f;
    for (int j = 0; j < k; ++j) {
        const float *cj = cs + (int64_t)j * D;
        float acc = 0.0f;
#pragma unroll
        for (int c = 0; c < DW; ++c) {
            const float d = __fsub_rn(x[c], c < D ? __ldg(cj + c) : 0.0f);
            acc = __fadd_rn(acc, __fmul_rn(d, d));
        }
        if (j == 0 || acc < bd) { /* strict: ties keep the lower index */
            bd = acc;
            best = j;
        }
    }
    km_emit(bh, n, k, i, best, keys);
}

static size_t km_align(size_t x) { return (x + 255) & ~(size_t)255; }

typedef struct km_state {
    qvc_view v;
    int BH, n, k, D, DW, vec;
    int use_smem;
    size_t smem;
    uint32_t *keys, *keys_sorted;
    int32_t *members;
    int *cnt, *start, *hist;
    cudaStream_t st;
} km_state;

typedef void (*km_assign_fn)(qvc_view, int, int, const float *, uint32_t *);
static km_assign_fn km_assign_shared_pick(int dtype) {
    switch (dtype) {
    case QVA_F32: return km_assign_kernel<QVA_F32>;
    case QVA_BF16: return km_assign_kernel<QVA_BF16>;
    default: return km_assign_kernel<QVA_F16>;
    }
}
/* The fallback is a cold path: its dtype is read at run time (DT -1), so
 * it costs two instantiations, not nine. */
static km_assign_fn km_assign_global_pick_width(int dw) {
    return dw == 64 ? km_assign_global_kernel<-1, 64> : km_assign_global_kernel<-1, 128>;
}
/* The assign kernel of this call (see km_smem_setup). */
static km_assign_fn km_assign_pick(const km_state *s) {
    if (s->use_smem) return km_assign_shared_pick(s->v.dtype);
    return km_assign_global_pick_width(s->DW);
}

static qva_status km_assign(const km_state *s, const float *cent) {
    if (qvc_km_assign_tc_ok(&s->v, s->k)) /* bf16, k <= 32: certified tensor-core distances */
        return qvc_km_assign_tc(&s->v, s->BH, s->k, cent, s->keys, s->st);
    const int per_cta = s->use_smem ? KM_CTA_TOKENS : KM_THREADS;
    dim3 grid(qvi_cdiv(s->n, per_cta), s->BH);
    km_assign_pick(s)<<<grid, KM_THREADS, s->smem, s->st>>>(s->v, s->vec, s->k, cent, s->keys);
    return qvc_launch_check("qvc_kmeans_perm: assign");
}

/* The labels' counts and offsets (s->cnt, s->start), then the stable sort
 * by label into keys_sorted / vals_out (kmeans_sort.cu). */
static qva_status km_sort(km_state *s, int32_t *vals_out) {
    return qvc_label_sort(s->keys, s->BH, s->n, s->k, s->hist, s->cnt, s->start, s->keys_sorted,
                          vals_out, s->st);
}

/* Chooses the assign kernel: the shared-memory one when the centroids and
 * the partial distances fit, else the global one; raises the dynamic
 * shared memory limit where needed. */
static qva_status km_smem_setup(km_state *s) {
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "qvc_kmeans_perm: device attributes");
    const size_t need = (size_t)s->k * (((s->D + 31) & ~31) + KM_CTA_TOKENS) * sizeof(float);
    s->use_smem = need + 1024 <= (size_t)optin;
    s->smem = s->use_smem ? need : 0;
    if (s->use_smem && need > 48 * 1024) {
        /* Past 48 KiB a kernel must opt in.  The limit is set to the
         * device maximum, not to this call's need, so concurrent calls
         * from other threads can never lower it. */
        e = cudaFuncSetAttribute((const void *)km_assign_pick(s),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
        if (e != cudaSuccess) return qvc_cuda_fail(e, "qvc_kmeans_perm: cudaFuncSetAttribute");
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
    s.DW = s.D <= 64 ? 64 : 128; /* channels past D add exactly +0 */
    s.vec = qvc_view_vec_ok(v, 8);
    s.st = st;
    if ((size_t)k * sizeof(int) > 48 * 1024)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_kmeans_perm: k = %d (at most %d)", k,
                        (int)(48 * 1024 / sizeof(int)));

    qva_status rs = km_smem_setup(&s);
    if (rs != QVA_OK) return rs;

    const size_t nb = km_align((size_t)total * 4), kb = km_align((size_t)BH * k * sizeof(int));
    const int64_t hist_n = qvc_label_sort_scratch(BH, s.n, k);
    const size_t hb = km_align((size_t)hist_n * sizeof(int));
    char *tmp = NULL;
    cudaError_t e;
    if ((e = cudaMallocAsync((void **)&tmp, 3 * nb + 2 * kb + hb, st)) != cudaSuccess)
        return qvc_cuda_fail(e, "qvc_kmeans_perm: cudaMallocAsync");
    s.keys = (uint32_t *)tmp;
    s.keys_sorted = (uint32_t *)(tmp + nb);
    s.members = (int32_t *)(tmp + 2 * nb);
    s.cnt = (int *)(tmp + 3 * nb);
    s.start = (int *)(tmp + 3 * nb + kb);
    s.hist = hist_n ? (int *)(tmp + 3 * nb + 2 * kb) : NULL;

    if (!warm) {
        km_init_kernel<<<dim3(k, s.BH), KM_MAX_D, 0, st>>>(s.v, k, centroids);
        rs = qvc_launch_check("qvc_kmeans_perm: init");
    }
    for (int it = 0; it < iters && rs == QVA_OK; ++it) {
        rs = km_assign(&s, centroids);
        if (rs == QVA_OK) rs = km_sort(&s, s.members);
        if (rs == QVA_OK) /* empty clusters (count 0) are left as they are */
            rs = qvc_colsum_mean(&s.v, s.members, s.keys_sorted, s.n, s.start, s.cnt, k, s.BH * k,
                                 centroids, st);
    }
    /* Final assignment; its stable sort is the permutation. */
    if (rs == QVA_OK) rs = km_assign(&s, centroids);
    if (rs == QVA_OK) rs = km_sort(&s, perm);

    if ((e = cudaFreeAsync(tmp, st)) != cudaSuccess && rs == QVA_OK)
        rs = qvc_cuda_fail(e, "qvc_kmeans_perm: cudaFreeAsync");
    return rs;
}
