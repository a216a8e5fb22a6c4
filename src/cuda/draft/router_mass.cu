/*
 * The MASS budget's weighted select on the device (router.cu has the
 * overview): per head, the kept count K whose draft-map mass reaches the
 * target, its split into the phases' quotas, and the count-select state of
 * their boundaries, bit for bit the CPU's (src/draft/budget.h).
 */
#include <cooperative_groups.h>

#include "router_select.cuh"

namespace cg = cooperative_groups;

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

/* A 64-bit sum kept as two u32 words in shared memory (lo at lo_addr, hi at
 * lo_addr + 1024): += v where p.  Hopper has no native 64-bit shared add
 * (the compiler's is a compare-and-swap loop, which stalls on a crowded
 * bin), so the low word takes a native add and the carry out of it (seen
 * in the value the add returns, exact whatever order the adds land in)
 * goes to the high word with v's high half. */
static __device__ __forceinline__ void dr_add64_shared(uint32_t lo_addr, unsigned long long v,
                                                       bool p) {
    if (!p) return;
    const unsigned vl = (unsigned)v;
    unsigned old;
    asm volatile("atom.shared::cta.add.u32 %0, [%1], %2;\n" : "=r"(old) : "r"(lo_addr), "r"(vl)
                 : "memory");
    const unsigned h = (unsigned)(v >> 32) + (old + vl < old ? 1u : 0u);
    dr_red_shared(lo_addr + 1024u, h, h != 0u);
}

/*
 * One key of a weighted pass: its f32 bits, the count and the w-sum of its
 * value digit (at vs in the value word) into the bins at hs (counts, 256
 * u32) and ws (w-sums, dr_add64_shared) if its value bits above the digit
 * are `above_want` (every key in the first pass).  The lanes that share
 * lane 0's digit add as one (their weights by two 32-bit reductions, w <
 * 2^40 split at bit 20; integer sums, so the order of the adds changes
 * nothing), the others one each; a warp-wide call.
 */
template <bool FIRST>
static __device__ __forceinline__ void dr_mass_key(uint32_t bits, bool in, int vs,
                                                   uint32_t above_want, uint32_t hs, uint32_t ws) {
    const uint32_t v = dr_order_key(bits), dig = (v >> vs) & 255u;
    const bool match = in && (FIRST || dr_shr32(v, vs + 8) == above_want);
    const unsigned long long wt = match ? qvi_budget_weight(bits) : 0ull;
    const uint32_t lead = __shfl_sync(DR_FULL, match ? dig : 256u, 0);
    const unsigned with = __ballot_sync(DR_FULL, match && dig == lead);
    if (match && dig == lead) {
        const unsigned lo = __reduce_add_sync(with, (unsigned)(wt & 0xfffffu));
        const unsigned hi = __reduce_add_sync(with, (unsigned)(wt >> 20));
        const bool first = (int)(threadIdx.x & 31) == __ffs(with) - 1;
        dr_red_shared(hs + 4u * lead, (unsigned)__popc(with), first);
        dr_add64_shared(ws + 4u * lead, ((unsigned long long)hi << 20) + lo, first);
    }
    dr_red_shared(hs + 4u * dig, 1u, match && dig != lead);
    dr_add64_shared(ws + 4u * dig, wt, match && dig != lead);
}

/* A weighted pass over the keys [lo, hi) of one head (dr_span's reads). */
template <bool FIRST>
static __device__ __forceinline__ void dr_mass_scan(const uint32_t *Ab, int lo, int hi, int vs,
                                                    uint32_t above_want, uint32_t hs, uint32_t ws) {
    const dr_span sp = dr_span_of(Ab, lo, hi);
    for (int b = 0; b < sp.nv; b += DR_SPAN_U * DR_SEL_THREADS) {
        uint4 q[DR_SPAN_U];
        dr_span_load(sp, b, q);
#pragma unroll
        for (int u = 0; u < DR_SPAN_U; ++u) {
            const bool in = b + u * DR_SEL_THREADS + (int)threadIdx.x < sp.nv;
            dr_mass_key<FIRST>(q[u].x, in, vs, above_want, hs, ws);
            dr_mass_key<FIRST>(q[u].y, in, vs, above_want, hs, ws);
            dr_mass_key<FIRST>(q[u].z, in, vs, above_want, hs, ws);
            dr_mass_key<FIRST>(q[u].w, in, vs, above_want, hs, ws);
        }
    }
    int i;
    bool in;
    const uint32_t bits = dr_span_rest(sp, &i, &in);
    dr_mass_key<FIRST>(bits, in, vs, above_want, hs, ws);
}

/*
 * The weighted select of every head (src/draft/budget.h's rule, tested
 * there against the CPU's), one cluster of CTAs per head as the count
 * select: four passes over the value digits (56, 48, 40, 32), each CTA
 * counting its share, then the cluster's bins added over distributed
 * shared memory and the same step taken in every CTA.  The first pass
 * also gives S = sum(w) (below 2^56: the map's rows each sum to about 1
 * and R < 2^16) and sets T.  After the last, rank 0 finds K_mass with no
 * index digit, clamps it, splits it (qvi_budget_split = qvi_draft_quotas)
 * and writes the head's quotas and the count-select state of its
 * boundaries e_0..e_2.
 */
__global__ void __launch_bounds__(DR_SEL_THREADS, 1)
dr_mass_select_kernel(const float *A, long long M, dr_mass_params mp, dr_sel *sel,
                      int64_t *head_quota /* [BH][4] */) {
    __shared__ unsigned int h[256], htot[256], w[2][256]; /* w: low, high words */
    __shared__ unsigned long long wtot[256];
    __shared__ dr_mass ms;
    cg::cluster_group cl = cg::this_cluster();
    const int bh = blockIdx.y, m = (int)M;
    const unsigned nc = cl.num_blocks(), rank = cl.block_rank();
    const int share = (int)((M + nc - 1) / nc);
    const int lo = min(m, (int)rank * share), hi = min(m, lo + share);
    const uint32_t *Ab = (const uint32_t *)A + (int64_t)bh * M;
    const uint32_t hs = (uint32_t)__cvta_generic_to_shared(h);
    const uint32_t ws = (uint32_t)__cvta_generic_to_shared(&w[0][0]);
    for (int shift = 56; shift >= 32; shift -= 8) {
        const bool first = shift == 56;
        for (int i = threadIdx.x; i < 256; i += DR_SEL_THREADS) h[i] = w[0][i] = w[1][i] = 0u;
        __syncthreads();
        const int vs = shift - 32;
        if (first)
            dr_mass_scan<true>(Ab, lo, hi, vs, 0u, hs, ws);
        else if (!ms.done) /* the same in every CTA of the cluster */
            dr_mass_scan<false>(Ab, lo, hi, vs, dr_shr32((uint32_t)(ms.prefix >> 32), vs + 8),
                                hs, ws);
        cl.sync();
        for (int i = threadIdx.x; i < 256; i += DR_SEL_THREADS) {
            unsigned c = 0u;
            unsigned long long s = 0ull;
            for (unsigned r = 0; r < nc; ++r) {
                const unsigned(*wr)[256] = cl.map_shared_rank(w, r);
                c += cl.map_shared_rank(h, r)[i];
                s += ((unsigned long long)wr[1][i] << 32) + wr[0][i];
            }
            htot[i] = c, wtot[i] = s;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            dr_mass st;
            if (first) {
                uint64_t S = 0;
                for (int d = 0; d < 256; ++d) S += wtot[d];
                qvi_budget_start(&st, S, mp.mass_ppm);
            } else {
                st = ms;
            }
            qvi_budget_digit(&st, htot, (const uint64_t *)wtot, shift);
            ms = st;
            if (shift == 32 && rank == 0) {
                const int64_t k = qvi_budget_clamp(qvi_budget_count(&st), mp.keep_min, mp.keep_max);
                int64_t q[4];
                const int64_t u[4] = {mp.u[0], mp.u[1], mp.u[2], mp.u[3]};
                qvi_budget_split(u, k, q);
                q[QVI_Q_SKIP] = mp.M - k;
                for (int j = 0; j < 4; ++j) head_quota[(int64_t)bh * 4 + j] = q[j];
                const long long e[3] = {q[QVI_Q_16], q[QVI_Q_16] + q[QVI_Q_8], k};
                dr_sel_set(&sel[bh], e, mp.M);
            }
        }
        cl.sync(); /* the bins are read everywhere; the state is settled */
    }
}
