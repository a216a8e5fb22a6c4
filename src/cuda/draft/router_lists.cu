/*
 * The key lists on the device (router.cu has the overview): the precision
 * of every region pair from the thresholds of router_select.cu, then per
 * (head, query region) row the key regions of each phase in ascending
 * order, in the CSR layout of cuda_internal.h.
 */
#include "router_internal.cuh"

/* ------------------------------------------------------------ lists */

/* 32-key groups of a row whose loads a warp issues together: one group at
 * a time, each warp waited out a load's latency for 128 bytes (the map)
 * or 32 (the precisions), and both kernels ran at a third of the memory
 * bandwidth (NOTES). */
#ifndef DR_LIST_ILP
#define DR_LIST_ILP 4
#endif

/* Precision of every pair of a row (warp per query region) and the row's
 * count of each phase. */
__global__ void __launch_bounds__(32 * DR_ROWS_PER_CTA)
dr_assign_kernel(const float *A, int R, dr_bounds bd, const dr_sel *sel, uint8_t *prec,
                 int32_t *cnt /* [BH][R][3] */) {
    const int bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int a = blockIdx.x * DR_ROWS_PER_CTA + warp;
    if (a >= R) return;
    const uint64_t M = (uint64_t)R * R;
    unsigned long long tau[3];
#pragma unroll
    for (int j = 0; j < 3; ++j) tau[j] = sel[bh].prefix[j];
    const int64_t row = ((int64_t)bh * R + a) * R;
    const uint32_t *Ar = (const uint32_t *)A + row;
    int n4 = 0, n8 = 0, n16 = 0;
    for (int b0 = 0; b0 < R; b0 += 32 * DR_LIST_ILP) {
        uint32_t v[DR_LIST_ILP];
#pragma unroll
        for (int u = 0; u < DR_LIST_ILP; ++u) {
            const int b = b0 + 32 * u + lane;
            v[u] = b < R ? __ldg(Ar + b) : 0u;
        }
#pragma unroll
        for (int u = 0; u < DR_LIST_ILP; ++u) {
            const int b = b0 + 32 * u + lane;
            int pc = 0;
            if (b < R) {
                pc = dr_class(dr_comp(v[u], (uint64_t)a * R + b, M), bd, tau);
                prec[row + b] = (uint8_t)pc;
            }
            n4 += __popc(__ballot_sync(DR_FULL, pc == 4));
            n8 += __popc(__ballot_sync(DR_FULL, pc == 8));
            n16 += __popc(__ballot_sync(DR_FULL, pc == 16));
        }
    }
    if (lane == 0) {
        int32_t *c = cnt + ((int64_t)bh * R + a) * 3;
        c[0] = n4;
        c[1] = n8;
        c[2] = n16;
    }
}

/* CSR offsets: per head an exclusive scan of its 3R row counts, placed at
 * bh*T (QUOTA: every head keeps T), or at hbase[bh] (MASS).  The last head
 * also writes the end, offsets[BH*3R]. */
__global__ void __launch_bounds__(DR_SCAN_THREADS)
dr_scan_kernel(const int32_t *cnt, int n3, int BH, long long T, const int64_t *hbase,
               int32_t *offsets) {
    __shared__ int wsum[DR_SCAN_THREADS / 32];
    const int bh = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t *c = cnt + (int64_t)bh * n3;
    int32_t *o = offsets + (int64_t)bh * n3;
    const long long base = hbase ? hbase[bh] : (long long)bh * T;
    long long carry = 0;
    for (int k0 = 0; k0 < n3; k0 += DR_SCAN_THREADS) {
        const int k = k0 + threadIdx.x;
        const int v = k < n3 ? c[k] : 0;
        int x = v;
        for (int d = 1; d < 32; d <<= 1) {
            const int y = __shfl_up_sync(DR_FULL, x, d);
            if (lane >= d) x += y;
        }
        if (lane == 31) wsum[warp] = x;
        __syncthreads();
        if (warp == 0) {
            int w = wsum[lane];
            for (int d = 1; d < 32; d <<= 1) {
                const int y = __shfl_up_sync(DR_FULL, w, d);
                if (lane >= d) w += y;
            }
            wsum[lane] = w;
        }
        __syncthreads();
        const int excl = x - v + (warp ? wsum[warp - 1] : 0);
        if (k < n3) o[k] = (int32_t)(base + carry + excl);
        carry += wsum[DR_SCAN_THREADS / 32 - 1];
        __syncthreads(); /* wsum is rewritten by the next tile */
    }
    if (bh == BH - 1 && threadIdx.x == 0) offsets[(int64_t)BH * n3] = (int32_t)(base + carry);
}

/* Key regions of each (row, phase) in ascending order (warp per row). */
__global__ void __launch_bounds__(32 * DR_ROWS_PER_CTA)
dr_fill_kernel(const uint8_t *prec, const int32_t *offsets, int R, int32_t *cols) {
    const int bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int a = blockIdx.x * DR_ROWS_PER_CTA + warp;
    if (a >= R) return;
    const int64_t ri = (int64_t)bh * R + a;
    const uint8_t *pr = prec + ri * R;
    int32_t o[3];
#pragma unroll
    for (int p = 0; p < 3; ++p) o[p] = offsets[ri * 3 + p];
    const unsigned lt = (1u << lane) - 1u;
    for (int b0 = 0; b0 < R; b0 += 32 * DR_LIST_ILP) {
        int ph[DR_LIST_ILP];
#pragma unroll
        for (int u = 0; u < DR_LIST_ILP; ++u) {
            const int b = b0 + 32 * u + lane;
            ph[u] = b < R ? dr_phase(pr[b]) : -1;
        }
#pragma unroll
        for (int u = 0; u < DR_LIST_ILP; ++u)
#pragma unroll
            for (int p = 0; p < 3; ++p) {
                const unsigned m = __ballot_sync(DR_FULL, ph[u] == p);
                if (ph[u] == p) cols[o[p] + __popc(m & lt)] = b0 + 32 * u + lane;
                o[p] += __popc(m);
            }
    }
}

/* Start of each head's lists: the exclusive prefix sum of the kept counts
 * R^2 - skip over the heads, one CTA (B*H <= 65535, 64 tiles at most). */
__global__ void __launch_bounds__(DR_SCAN_THREADS)
dr_head_base_kernel(const int64_t *head_quota, int BH, long long M, int64_t *base) {
    __shared__ long long wsum[DR_SCAN_THREADS / 32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long long carry = 0;
    for (int h0 = 0; h0 < BH; h0 += DR_SCAN_THREADS) {
        const int h = h0 + threadIdx.x;
        const long long v = h < BH ? M - head_quota[(int64_t)h * 4 + QVI_Q_SKIP] : 0;
        long long x = v;
        for (int d = 1; d < 32; d <<= 1) {
            const long long y = __shfl_up_sync(DR_FULL, x, d);
            if (lane >= d) x += y;
        }
        if (lane == 31) wsum[warp] = x;
        __syncthreads();
        if (warp == 0) {
            long long t = wsum[lane];
            for (int d = 1; d < 32; d <<= 1) {
                const long long y = __shfl_up_sync(DR_FULL, t, d);
                if (lane >= d) t += y;
            }
            wsum[lane] = t;
        }
        __syncthreads();
        if (h < BH) base[h] = carry + x - v + (warp ? wsum[warp - 1] : 0);
        carry += wsum[DR_SCAN_THREADS / 32 - 1];
        __syncthreads(); /* wsum is rewritten by the next tile */
    }
}

/* ------------------------------------------------------------ host side */

qva_status qvc_dr_lists(const qvc_draft_route_buf *b, const dr_bounds *bd, const dr_scratch *sc,
                        long long retained, cudaStream_t st) {
    const int BH = b->BH, R = b->R;
    const long long M = (long long)R * R;
    qva_status s;
    const dim3 rgrid((unsigned)qvi_cdiv(R, DR_ROWS_PER_CTA), (unsigned)BH);
    dr_assign_kernel<<<rgrid, 32 * DR_ROWS_PER_CTA, 0, st>>>(b->A, R, *bd, sc->sel, b->prec,
                                                              sc->cnt);
    if ((s = qvc_launch_check("qvc_draft_route: assign")) != QVA_OK) return s;
    if (retained < 0) { /* MASS: each head's lists start after the heads before it */
        dr_head_base_kernel<<<1, DR_SCAN_THREADS, 0, st>>>(b->head_quota, BH, M, sc->base);
        if ((s = qvc_launch_check("qvc_draft_route: list starts")) != QVA_OK) return s;
    }
    dr_scan_kernel<<<(unsigned)BH, DR_SCAN_THREADS, 0, st>>>(
        sc->cnt, 3 * R, BH, retained < 0 ? 0 : retained, retained < 0 ? sc->base : NULL,
        b->offsets);
    if ((s = qvc_launch_check("qvc_draft_route: offsets")) != QVA_OK) return s;
    if (retained == 0) return QVA_OK;
    dr_fill_kernel<<<rgrid, 32 * DR_ROWS_PER_CTA, 0, st>>>(b->prec, b->offsets, R, b->cols);
    return qvc_launch_check("qvc_draft_route: lists");
}
