/*
 * The ranking on the device (router.cu has the overview): the radix
 * select of each head's cumulative boundaries over the distinct 64-bit
 * keys, and for the MASS budget the weighted select that first finds each
 * head's K, quotas and boundaries on the device.  Bit for bit the CPU's
 * ranking (src/draft/router.c, src/draft/budget.h).
 */
#include "router_internal.cuh"

/* ------------------------------------------------------------ radix select */

__global__ void dr_sel_init_kernel(dr_sel *sel, int BH, unsigned long long e0,
                                   unsigned long long e1, unsigned long long e2) {
    const int bh = blockIdx.x * blockDim.x + threadIdx.x;
    if (bh >= BH) return;
    const unsigned long long e[3] = {e0, e1, e2};
    for (int j = 0; j < 3; ++j) {
        sel[bh].prefix[j] = 0ull;
        sel[bh].rank[j] = e[j] > 0 ? e[j] - 1 : 0ull; /* 0-based rank of the last kept */
        sel[bh].done[j] = 0;
    }
}

/* Bit j: open boundary j (j >= 1) is in the very state of open boundary
 * j - 1, same prefix and same rank left (equal cumulative quotas, as e_1 =
 * e_2 without an NVFP4 quota): its search is j - 1's, step for step, so
 * it is not counted but copied (dr_select_kernel).  Both kernels of a pass
 * read it from the state as the pass found it. */
static __device__ __forceinline__ int dr_sel_alias(const dr_sel &s, int open) {
    int alias = 0;
    for (int j = 1; j < 3; ++j)
        if (((open >> j) & 1) && ((open >> (j - 1)) & 1) && s.prefix[j] == s.prefix[j - 1] &&
            s.rank[j] == s.rank[j - 1])
            alias |= 1 << j;
    return alias;
}

/* The boundaries of findmask whose search is still on. */
static __device__ __forceinline__ int dr_sel_open(const dr_sel &s, int findmask) {
    int open = 0;
    for (int j = 0; j < 3; ++j)
        if (((findmask >> j) & 1) && !s.done[j]) open |= 1 << j;
    return open;
}

/*
 * Histogram of the 8-bit digit at `shift` of the keys that match each
 * open boundary's selected prefix (the bits above the digit), in shared
 * memory, then one global atomic per non-empty bin.  The match is shared
 * by boundaries whose prefixes are equal (all of them in the first pass);
 * an aliased boundary (dr_sel_alias) is not counted at all.
 * A head whose boundaries are all settled leaves at once.  AGG (the first
 * digit, which nearly every key shares: the map's values lie in [0, 1], so
 * their top bits vary little): the lanes of one digit add as a group, one
 * shared atomic per group (__match_any_sync), skipped where no lane
 * matches.  The later digits spread over the bins, where the groups are
 * one or two lanes: each matching lane adds its own 1 (NOTES: 173 -> 75
 * µs for the second digit at Wan).
 */
template <bool AGG>
__global__ void __launch_bounds__(DR_HIST_THREADS)
dr_hist_kernel(const float *A, long long M, int shift, int findmask, const dr_sel *sel,
               unsigned int *hist /* [BH][3][256] */) {
    __shared__ unsigned int h[3][256];
    const int bh = blockIdx.y, lane = threadIdx.x & 31;
    const dr_sel st = sel[bh];
    unsigned long long pre[3];
    const int open = dr_sel_open(st, findmask), alias = dr_sel_alias(st, open);
    int same = 0; /* per head, so uniform over the CTA */
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        pre[j] = st.prefix[j];
        if (j && ((open >> (j - 1)) & 1) && ((open >> j) & 1) && pre[j] == pre[j - 1])
            same |= 1 << j;
    }
    if (!open) return; /* before any barrier */
    for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) (&h[0][0])[i] = 0u;
    __syncthreads();
    const uint64_t high = shift >= 56 ? 0ull : ~0ull << (shift + 8);
    const uint32_t *Ab = (const uint32_t *)A + (int64_t)bh * M;
    const long long i0 = (long long)blockIdx.x * DR_HIST_THREADS * DR_HIST_ITEMS;
#pragma unroll 4
    for (int it = 0; it < DR_HIST_ITEMS; ++it) {
        const long long i = i0 + (long long)it * DR_HIST_THREADS + threadIdx.x;
        const bool in = i < M;
        const uint64_t c = in ? dr_comp(__ldg(Ab + i), (uint64_t)i, (uint64_t)M) : 0ull;
        const int dig = (int)((c >> shift) & 255u);
        int val = -1;
        unsigned peers = 0u;
#pragma unroll
        for (int j = 0; j < 3; ++j) {
            if (!((open >> j) & 1) || ((alias >> j) & 1)) continue; /* uniform */
            if (!((same >> j) & 1)) {         /* uniform; else boundary j-1's */
                val = in && (c & high) == pre[j] ? dig : -1;
                if (AGG)
                    peers = __any_sync(DR_FULL, val >= 0) ? __match_any_sync(DR_FULL, val) : 0u;
            }
            if (!AGG && val >= 0)
                atomicAdd(&h[j][val], 1u);
            else if (AGG && val >= 0 && lane == __ffs(peers) - 1)
                atomicAdd(&h[j][val], (unsigned)__popc(peers));
        }
    }
    __syncthreads();
    unsigned int *g = hist + (int64_t)bh * 3 * 256;
    for (int i = threadIdx.x; i < 3 * 256; i += blockDim.x) {
        const unsigned v = (&h[0][0])[i];
        if (v) atomicAdd(g + i, v);
    }
}

/*
 * Picks each open boundary's digit (descending: from bin 255 down) and
 * clears the histogram for the next pass; an aliased boundary takes the
 * state of the one before it.  One warp per head; the bins are
 * first copied to shared memory with coalesced loads, so the scan does not
 * wait on one global load per bin.  If the boundary is the last (smallest)
 * of the keys that share its bits so far, every one of them is kept: tau
 * may then keep zeros below, since c >= prefix selects exactly those keys
 * and the ones above, and the search of that boundary ends.
 */
__global__ void dr_select_kernel(unsigned int *hist, dr_sel *sel, int shift, int findmask) {
    __shared__ unsigned int h[3 * 256];
    const int bh = blockIdx.x, lane = threadIdx.x;
    unsigned int *g = hist + (int64_t)bh * 3 * 256;
    for (int i = lane; i < 3 * 256; i += 32) {
        h[i] = g[i];
        g[i] = 0u;
    }
    const dr_sel old = sel[bh];
    const int open = dr_sel_open(old, findmask), alias = dr_sel_alias(old, open);
    __syncwarp();
    if (lane < 3 && ((open >> lane) & 1) && !((alias >> lane) & 1)) {
        const unsigned int *hj = h + lane * 256;
        unsigned long long r = sel[bh].rank[lane];
        int d = 255;
        for (; d > 0; --d) {
            const unsigned long long cnt = hj[d];
            if (r < cnt) break;
            r -= cnt;
        }
        sel[bh].prefix[lane] |= (unsigned long long)d << shift;
        sel[bh].rank[lane] = r;
        if (r + 1 == (unsigned long long)hj[d]) sel[bh].done[lane] = 1;
    }
    __syncwarp();
    if (lane == 0)
        for (int j = 1; j < 3; ++j)
            if ((alias >> j) & 1) {
                sel[bh].prefix[j] = sel[bh].prefix[j - 1];
                sel[bh].rank[j] = sel[bh].rank[j - 1];
                sel[bh].done[j] = sel[bh].done[j - 1];
            }
}

/* ------------------------------------------------------------ MASS budget */

/* Sum of v over the lanes of `peers` (v < 2^20 and at most 32 lanes: no
 * overflow of the 32-bit warp reduction). */
static __device__ __forceinline__ unsigned dr_peer_sum(unsigned peers, unsigned v) {
    return __reduce_add_sync(peers, v);
}

/*
 * Per head: the count and the w-sum of each 8-bit value digit at `shift`
 * (56, 48, 40, 32) over the keys whose higher value bits match the head's
 * prefix; the first pass (56) takes every key.  The weight is a function
 * of the value bits, so only the 32 value bits of the composite key are
 * read.  Warp-aggregated as dr_hist_kernel: the lanes of one digit add
 * their weights by two 32-bit warp reductions (w < 2^40 split at bit 20),
 * then one shared atomic per digit; integer sums, so the order of the
 * atomics changes nothing.  Counts go to bin set 0 of hist.
 */
__global__ void __launch_bounds__(DR_HIST_THREADS)
dr_whist_kernel(const float *A, long long M, int shift, const dr_mass *ms, unsigned int *hist,
                unsigned long long *whist /* [BH][256] */) {
    __shared__ unsigned int h[256];
    __shared__ unsigned long long w[256];
    const int bh = blockIdx.y, lane = threadIdx.x & 31;
    const bool first = shift == 56;
    if (!first && ms[bh].done) return; /* per head: before any barrier */
    const unsigned long long pre = first ? 0ull : ms[bh].prefix;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) h[i] = 0u, w[i] = 0ull;
    __syncthreads();
    const uint64_t high = first ? 0ull : ~0ull << (shift + 8);
    const uint32_t *Ab = (const uint32_t *)A + (int64_t)bh * M;
    const long long i0 = (long long)blockIdx.x * DR_HIST_THREADS * DR_HIST_ITEMS;
#pragma unroll 4
    for (int it = 0; it < DR_HIST_ITEMS; ++it) {
        const long long i = i0 + (long long)it * DR_HIST_THREADS + threadIdx.x;
        const uint32_t bits = i < M ? __ldg(Ab + i) : 0u;
        const uint64_t v = (uint64_t)dr_order_key(bits) << 32;
        const int val = i < M && (v & high) == pre ? (int)((v >> shift) & 255u) : -1;
        if (!__any_sync(DR_FULL, val >= 0)) continue; /* uniform */
        const unsigned peers = __match_any_sync(DR_FULL, val);
        const uint64_t wt = val >= 0 ? qvi_budget_weight(bits) : 0ull;
        const unsigned lo = dr_peer_sum(peers, (unsigned)(wt & 0xfffffu));
        const unsigned hi = dr_peer_sum(peers, (unsigned)(wt >> 20));
        if (val >= 0 && lane == __ffs(peers) - 1) {
            atomicAdd(&h[val], (unsigned)__popc(peers));
            atomicAdd(&w[val], ((unsigned long long)hi << 20) + lo);
        }
    }
    __syncthreads();
    unsigned int *g = hist + (int64_t)bh * 3 * 256;
    unsigned long long *gw = whist + (int64_t)bh * 256;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        if (h[i]) atomicAdd(g + i, h[i]);
        if (w[i]) atomicAdd(gw + i, w[i]);
    }
}

/* The count-select state of one head for its cumulative boundaries e[j]:
 * e = 0 keeps nothing (tau above every key: the largest key is
 * 0xff800000 << 32 | index, +inf's), e >= M everything (tau = 0); both
 * are settled, so dr_assign_kernel compares every boundary as FIND. */
static __device__ void dr_sel_set(dr_sel *s, const long long e[3], long long M) {
    for (int j = 0; j < 3; ++j) {
        s->prefix[j] = e[j] <= 0 ? ~0ull : 0ull;
        s->rank[j] = e[j] > 0 ? (unsigned long long)(e[j] - 1) : 0ull;
        s->done[j] = e[j] <= 0 || e[j] >= M;
    }
}

/*
 * One digit of the weighted select, a warp per head: the bins are copied
 * to shared memory and cleared for the next pass, and lane 0 takes the
 * step of src/draft/budget.h (tested there against the CPU's rule).  The
 * first pass (56) sums every bin, S = sum(w) (below 2^56: the map's rows
 * each sum to about 1 and R < 2^16, so no overflow check is needed), and
 * sets T.  The last pass (32) finds K_mass with no index digit, clamps it,
 * splits it (qvi_budget_split = qvi_draft_quotas) and writes the head's
 * quotas and the count-select state of its boundaries e_0..e_2.
 */
__global__ void dr_wselect_kernel(unsigned int *hist, unsigned long long *whist, dr_mass *ms,
                                  int shift, dr_mass_params mp, dr_sel *sel,
                                  int64_t *head_quota /* [BH][4] */) {
    __shared__ unsigned int h[256];
    __shared__ uint64_t w[256];
    const int bh = blockIdx.x, lane = threadIdx.x;
    unsigned int *g = hist + (int64_t)bh * 3 * 256;
    unsigned long long *gw = whist + (int64_t)bh * 256;
    for (int i = lane; i < 256; i += 32) {
        h[i] = g[i], w[i] = gw[i];
        g[i] = 0u, gw[i] = 0ull;
    }
    __syncwarp();
    if (lane) return;
    dr_mass m;
    if (shift == 56) {
        uint64_t S = 0;
        for (int d = 0; d < 256; ++d) S += w[d];
        qvi_budget_start(&m, S, mp.mass_ppm);
    } else {
        m = ms[bh];
    }
    qvi_budget_digit(&m, h, w, shift);
    if (shift != 32) {
        ms[bh] = m;
        return;
    }
    const int64_t k = qvi_budget_clamp(qvi_budget_count(&m), mp.keep_min, mp.keep_max);
    int64_t q[4];
    const int64_t u[4] = {mp.u[0], mp.u[1], mp.u[2], mp.u[3]};
    qvi_budget_split(u, k, q);
    q[QVI_Q_SKIP] = mp.M - k;
    for (int j = 0; j < 4; ++j) head_quota[(int64_t)bh * 4 + j] = q[j];
    const long long e[3] = {q[QVI_Q_16], q[QVI_Q_16] + q[QVI_Q_8], k};
    dr_sel_set(&sel[bh], e, mp.M);
}

/* ------------------------------------------------------------ host side */

/* The count select of the boundaries in findmask (sel initialised): a
 * histogram and a digit pass per 8 bits, the 32 value bits, then the index
 * bits that M - 1 uses.  hist must be zero; it is zero again after. */
static qva_status dr_count_select(const float *A, long long M, int BH, int findmask, dr_sel *sel,
                                  unsigned int *hist, cudaStream_t st) {
    qva_status s;
    int shifts[8], np = 0;
    for (int sh = 56; sh >= 32; sh -= 8) shifts[np++] = sh;
    int ibits = 0;
    while (ibits < 32 && ((unsigned long long)(M - 1) >> ibits) != 0ull) ++ibits;
    for (int sh = ((ibits + 7) / 8 - 1) * 8; sh >= 0; sh -= 8) shifts[np++] = sh;
    const long long per_cta = (long long)DR_HIST_THREADS * DR_HIST_ITEMS;
    const dim3 hgrid((unsigned)((M + per_cta - 1) / per_cta), (unsigned)BH);
    for (int i = 0; i < np; ++i) {
        if (i == 0)
            dr_hist_kernel<true><<<hgrid, DR_HIST_THREADS, 0, st>>>(A, M, shifts[i], findmask, sel,
                                                                     hist);
        else
            dr_hist_kernel<false><<<hgrid, DR_HIST_THREADS, 0, st>>>(A, M, shifts[i], findmask,
                                                                      sel, hist);
        if ((s = qvc_launch_check("qvc_draft_route: select histogram")) != QVA_OK) return s;
        dr_select_kernel<<<(unsigned)BH, 32, 0, st>>>(hist, sel, shifts[i], findmask);
        if ((s = qvc_launch_check("qvc_draft_route: select digit")) != QVA_OK) return s;
    }
    return QVA_OK;
}

qva_status qvc_dr_select_quota(const qvc_draft_route_buf *b, const long long e[3],
                               const dr_scratch *sc, dr_bounds *bd, cudaStream_t st) {
    const int BH = b->BH;
    const long long M = (long long)b->R * b->R;
    qva_status s;
    int findmask = 0;
    for (int j = 0; j < 3; ++j) {
        bd->mode[j] = e[j] <= 0 ? DR_SEL_NONE : e[j] >= M ? DR_SEL_ALL : DR_SEL_FIND;
        if (bd->mode[j] == DR_SEL_FIND) findmask |= 1 << j;
    }
    dr_sel_init_kernel<<<(unsigned)qvi_cdiv(BH, 128), 128, 0, st>>>(
        sc->sel, BH, (unsigned long long)e[0], (unsigned long long)e[1], (unsigned long long)e[2]);
    if ((s = qvc_launch_check("qvc_draft_route: selection init")) != QVA_OK) return s;
    if (!findmask) return QVA_OK;
    const cudaError_t ce = cudaMemsetAsync(sc->hist, 0, (size_t)BH * 3 * 256 * sizeof(unsigned), st);
    if (ce != cudaSuccess) return qvc_cuda_fail(ce, "qvc_draft_route: cudaMemsetAsync");
    return dr_count_select(b->A, M, BH, findmask, sc->sel, sc->hist, st);
}

/* c1: the weighted select, four value digits (dr_whist_kernel,
 * dr_wselect_kernel), whose last pass writes the head's quotas and its
 * count-select state; c2: the count select of every boundary a head still
 * has to find.  Settled boundaries hold tau 0 or above every key, so all
 * three compare as FIND. */
qva_status qvc_dr_select_mass(const qvc_draft_route_buf *b, const dr_mass_params *mp,
                              const dr_scratch *sc, dr_bounds *bd, cudaStream_t st) {
    const int BH = b->BH;
    const long long M = (long long)b->R * b->R;
    qva_status s;
    cudaError_t ce;
    if ((ce = cudaMemsetAsync(sc->hist, 0, (size_t)BH * 3 * 256 * sizeof(unsigned), st)) !=
            cudaSuccess ||
        (ce = cudaMemsetAsync(sc->whist, 0, (size_t)BH * 256 * sizeof(unsigned long long),
                              st)) != cudaSuccess)
        return qvc_cuda_fail(ce, "qvc_draft_route: cudaMemsetAsync");
    const long long per_cta = (long long)DR_HIST_THREADS * DR_HIST_ITEMS;
    const dim3 hgrid((unsigned)((M + per_cta - 1) / per_cta), (unsigned)BH);
    for (int sh = 56; sh >= 32; sh -= 8) {
        dr_whist_kernel<<<hgrid, DR_HIST_THREADS, 0, st>>>(b->A, M, sh, sc->mass, sc->hist,
                                                            sc->whist);
        if ((s = qvc_launch_check("qvc_draft_route: mass histogram")) != QVA_OK) return s;
        dr_wselect_kernel<<<(unsigned)BH, 32, 0, st>>>(sc->hist, sc->whist, sc->mass, sh, *mp,
                                                        sc->sel, b->head_quota);
        if ((s = qvc_launch_check("qvc_draft_route: mass digit")) != QVA_OK) return s;
    }
    bd->mode[0] = bd->mode[1] = bd->mode[2] = DR_SEL_FIND;
    return dr_count_select(b->A, M, BH, 7, sc->sel, sc->hist, st);
}
