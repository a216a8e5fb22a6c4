/*
 * The stable sort of k-means labels by label, per (batch, head): the
 * unique stable order of the CPU's qvi_stable_argsort_labels, as the
 * permutation of V-Smooth and as the member lists of the centroid update
 * (kmeans.cu).  A counting sort: token i goes to slot start[label] + the
 * number of earlier tokens with its label; the slots of head bh begin at
 * bh*n.  Keys are bh * k + label.  Two ways to it:
 *
 * Chunked (k <= KM_CHUNKED_MAX_K): the tokens of a head in chunks of
 * KM_SORT_THREADS.  km_hist_kernel counts each chunk's labels;
 * km_scan_kernel turns the counts of a head, label-major, into each
 * (label, chunk)'s first slot (and the label counts and offsets the update
 * needs); km_scatter_kernel ranks each chunk's tokens: the warps' label
 * counts, summed over the earlier warps, plus the rank among the earlier
 * lanes with the same label (__match_any_sync).  Every chunk runs at once.
 *
 * Serial (larger k, where the chunk counts would not fit): counts by
 * atomics, one CTA per head walks its chunks in order and its warps in
 * order, with one cursor per label.
 */
#include <stdint.h>

#include "common/device_util.cuh"

#define KM_SORT_THREADS 512
#define KM_SORT_WARPS (KM_SORT_THREADS / 32)
#define KM_CHUNKED_MAX_K 256
#define KM_SCAN_THREADS 1024

/* hist[bh][label][chunk]: the tokens of the chunk with that label. */
__global__ void __launch_bounds__(KM_SORT_THREADS)
km_hist_kernel(const uint32_t *keys, int n, int k, int nchunk, int *hist) {
    extern __shared__ int km_h[];
    const int chunk = blockIdx.x, bh = blockIdx.y, i = chunk * KM_SORT_THREADS + threadIdx.x;
    for (int j = threadIdx.x; j < k; j += KM_SORT_THREADS) km_h[j] = 0;
    __syncthreads();
    if (i < n) atomicAdd(&km_h[keys[(int64_t)bh * n + i] - (uint32_t)bh * (uint32_t)k], 1);
    __syncthreads();
    for (int j = threadIdx.x; j < k; j += KM_SORT_THREADS)
        hist[((int64_t)bh * k + j) * nchunk + chunk] = km_h[j];
}

/* Exclusive scan of a CTA's per-thread totals: every thread gets its own
 * prefix. */
static __device__ int km_block_exclusive_scan(int x, int *warp_sums) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    int incl = x;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nw ? warp_sums[lane] : 0, wi = w;
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += y;
        }
        if (lane < nw) warp_sums[lane] = wi - w;
    }
    __syncthreads();
    return warp_sums[warp] + incl - x;
}

/* In place, per head: hist (label-major) -> the first slot of each
 * (label, chunk) within the head; cnt and start get each label's count and
 * first slot. */
__global__ void __launch_bounds__(KM_SCAN_THREADS)
km_scan_kernel(int *hist, int n, int k, int nchunk, int *cnt, int *start) {
    __shared__ int warp_sums[KM_SCAN_THREADS / 32];
    const int bh = blockIdx.x;
    const int64_t e_all = (int64_t)k * nchunk;
    const int per = (int)((e_all + KM_SCAN_THREADS - 1) / KM_SCAN_THREADS);
    int *h = hist + (int64_t)bh * e_all;
    const int64_t e0 = (int64_t)threadIdx.x * per, e1 = min(e0 + per, e_all);
    int sum = 0;
    for (int64_t e = e0; e < e1; ++e) sum += h[e];
    int acc = km_block_exclusive_scan(sum, warp_sums);
    for (int64_t e = e0; e < e1; ++e) {
        const int c = h[e];
        h[e] = acc;
        acc += c;
    }
    __syncthreads(); /* the slots are in global memory, visible to the CTA */
    for (int j = threadIdx.x; j < k; j += KM_SCAN_THREADS) {
        const int s0 = h[(int64_t)j * nchunk], s1 = j + 1 < k ? h[(int64_t)(j + 1) * nchunk] : n;
        start[(int64_t)bh * k + j] = s0;
        cnt[(int64_t)bh * k + j] = s1 - s0;
    }
}

__global__ void __launch_bounds__(KM_SORT_THREADS)
km_scatter_kernel(const uint32_t *keys, const int *slot, int n, int k, int nchunk,
                  uint32_t *keys_out, int32_t *vals_out) {
    extern __shared__ int km_w[]; /* [KM_SORT_WARPS][k]: label counts, then offsets */
    const int chunk = blockIdx.x, bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = chunk * KM_SORT_THREADS + threadIdx.x;
    const int64_t base = (int64_t)bh * n;
    for (int e = threadIdx.x; e < KM_SORT_WARPS * k; e += KM_SORT_THREADS) km_w[e] = 0;
    __syncthreads();
    const bool valid = i < n;
    const uint32_t key = valid ? keys[base + i] : 0xffffffffu;
    const int label = valid ? (int)(key - (uint32_t)bh * (uint32_t)k) : 0;
    const unsigned same = __match_any_sync(0xffffffffu, key);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (valid && rank == 0) km_w[warp * k + label] = __popc(same);
    __syncthreads();
    for (int j = threadIdx.x; j < k; j += KM_SORT_THREADS) {
        int acc = slot[((int64_t)bh * k + j) * nchunk + chunk];
        for (int w = 0; w < KM_SORT_WARPS; ++w) {
            const int c = km_w[w * k + j];
            km_w[w * k + j] = acc;
            acc += c;
        }
    }
    __syncthreads();
    if (valid) {
        const int pos = km_w[warp * k + label] + rank;
        keys_out[base + pos] = key;
        vals_out[base + pos] = i;
    }
}

/* The serial way's counts: one atomic per token (integers: order-free). */
__global__ void km_count_kernel(const uint32_t *keys, int64_t total, int *cnt) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) atomicAdd(&cnt[keys[i]], 1);
}

/* Exclusive scan of the counts of each bh (one thread per bh). */
__global__ void km_offsets_kernel(const int *cnt, int *start, int BH, int k) {
    const int bh = blockIdx.x * blockDim.x + threadIdx.x;
    if (bh >= BH) return;
    int acc = 0;
    for (int j = 0; j < k; ++j) {
        start[(int64_t)bh * k + j] = acc;
        acc += cnt[(int64_t)bh * k + j];
    }
}

/* The serial sort, CTA per (batch, head): chunks in order, the warps of a
 * chunk in order, lanes that share a label ranked by lane. */
__global__ void __launch_bounds__(KM_SORT_THREADS)
km_sort_serial_kernel(const uint32_t *keys, const int *start, int n, int k, uint32_t *keys_out,
                      int32_t *vals_out) {
    extern __shared__ int km_cursor[];
    const int bh = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned below = (1u << lane) - 1u;
    const int64_t base = (int64_t)bh * n;
    for (int j = threadIdx.x; j < k; j += KM_SORT_THREADS) km_cursor[j] = start[(int64_t)bh * k + j];
    __syncthreads();
    for (int c0 = 0; c0 < n; c0 += KM_SORT_THREADS) {
        const int i = c0 + threadIdx.x;
        const bool valid = i < n;
        const uint32_t key = valid ? keys[base + i] : 0xffffffffu;
        const int label = valid ? (int)(key - (uint32_t)bh * (uint32_t)k) : 0;
        for (int w = 0; w < KM_SORT_WARPS; ++w) {
            if (warp == w) {
                const unsigned same = __match_any_sync(0xffffffffu, key);
                if (valid) {
                    const int pos = km_cursor[label] + __popc(same & below);
                    keys_out[base + pos] = key;
                    vals_out[base + pos] = i;
                }
                __syncwarp();
                if (valid && (same & below) == 0) km_cursor[label] += __popc(same);
            }
            __syncthreads();
        }
    }
}

/* Scratch ints the chunked way needs (0: the serial way runs). */
extern "C" int64_t qvc_label_sort_scratch(int64_t BH, int n, int k) {
    const int64_t cells = BH * k * qvi_cdiv(n, KM_SORT_THREADS);
    /* the chunk counts stay small at the default k */
    return k <= KM_CHUNKED_MAX_K && cells <= ((int64_t)1 << 26) ? cells : 0;
}

extern "C" qva_status qvc_label_sort(const uint32_t *keys, int BH, int n, int k, int *hist,
                                     int *cnt, int *start, uint32_t *keys_out, int32_t *vals_out,
                                     cudaStream_t st) {
    if (hist) {
        const int nchunk = qvi_cdiv(n, KM_SORT_THREADS);
        dim3 grid(nchunk, BH);
        km_hist_kernel<<<grid, KM_SORT_THREADS, (size_t)k * sizeof(int), st>>>(keys, n, k, nchunk,
                                                                               hist);
        qva_status r = qvc_launch_check("qvc_kmeans_perm: chunk counts");
        if (r != QVA_OK) return r;
        km_scan_kernel<<<BH, KM_SCAN_THREADS, 0, st>>>(hist, n, k, nchunk, cnt, start);
        if ((r = qvc_launch_check("qvc_kmeans_perm: chunk slots")) != QVA_OK) return r;
        km_scatter_kernel<<<grid, KM_SORT_THREADS, (size_t)KM_SORT_WARPS * k * sizeof(int), st>>>(
            keys, hist, n, k, nchunk, keys_out, vals_out);
        return qvc_launch_check("qvc_kmeans_perm: scatter");
    }
    cudaError_t e = cudaMemsetAsync(cnt, 0, (size_t)BH * k * sizeof(int), st);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "qvc_kmeans_perm: cudaMemsetAsync");
    const int64_t total = (int64_t)BH * n;
    km_count_kernel<<<(unsigned)((total + 255) / 256), 256, 0, st>>>(keys, total, cnt);
    qva_status r = qvc_launch_check("qvc_kmeans_perm: counts");
    if (r != QVA_OK) return r;
    km_offsets_kernel<<<qvi_cdiv(BH, 128), 128, 0, st>>>(cnt, start, BH, k);
    if ((r = qvc_launch_check("qvc_kmeans_perm: offsets")) != QVA_OK) return r;
    km_sort_serial_kernel<<<BH, KM_SORT_THREADS, (size_t)k * sizeof(int), st>>>(keys, start, n, k,
                                                                               keys_out, vals_out);
    return qvc_launch_check("qvc_kmeans_perm: sort");
}
