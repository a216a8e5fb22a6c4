/*
 * The ranking on the device (router.cu has the overview): the radix
 * select of each head's cumulative boundaries over the distinct 64-bit
 * keys, and the launches of both selects (the MASS budget's weighted
 * select, which first finds each head's K, quotas and boundaries, is
 * router_mass.cu's).  Bit for bit the CPU's ranking (src/draft/router.c,
 * src/draft/budget.h).
 */
#include <cooperative_groups.h>

#include "router_select.cuh"

namespace cg = cooperative_groups;

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
 * it is not counted but copied (dr_count_select_kernel).  Both the count
 * and the step of a pass read it from the state as the pass found it. */
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

/* The digits of one count select, most significant first: shift and
 * width in bits (at most DR_SEL_WIDE_BITS for the first, 8 after it). */
typedef struct dr_shifts {
    int n, s[8], w[8];
} dr_shifts;

/* The largest cluster of a select (the portable size; dr_sel_cluster). */
#define DR_SEL_MAX_CLUSTER 8


/* What one digit pass compares, set up once per pass: the rows to count
 * (one per distinct prefix among the boundaries still searched: equal
 * prefixes select the same keys, hence the same counts), the value bits
 * above the digit (value digits, shift >= 32) or the whole value and the
 * index bits above the digit (index digits). */
typedef struct dr_sel_pass {
    int rows, vs, hs;   /* rows counted; the digit's shift and the bits above it,
                           within the value word or within the index word */
    uint32_t mask;      /* the digit's bits, after the shift */
    uint32_t hi[3];     /* per row: the selected bits above the digit, >> hs */
    uint32_t val[3];    /* per row, index digits: the selected value */
} dr_sel_pass;

/* Where one pass of a CTA counts: the rows (h[ROWS][256] as a shared-window
 * address) and, in the pass that lists the candidates, the list. */
typedef struct dr_sel_out {
    uint32_t hs;
    uint2 *cand;   /* (value word, index word) of each listed key */
    int *ncand;
    int cap;
} dr_sel_out;

/*
 * One key of a pass: its value word v (dr_order_key) and index word x
 * (M - 1 - i) of the 64-bit key.  Counts the digit (of x for INDEX, else
 * of v) into each row whose prefix the key matches, in 32-bit
 * arithmetic.  FIRST (the first digit, which nearly every key shares: the
 * map's values lie in [0, 1], so their top bits vary little, and every key
 * matches): the lanes that share lane 0's digit add as one, the others one
 * each; a warp-wide call.  LIST: a key that matches a row is listed.
 */
template <int ROWS, bool FIRST, bool INDEX, bool LIST>
static __device__ __forceinline__ void dr_sel_key(uint32_t v, uint32_t x, bool in,
                                                  const dr_sel_pass &ps, const dr_sel_out &o) {
    const uint32_t w = INDEX ? x : v; /* the word of the digit */
    const uint32_t dig = (w >> ps.vs) & ps.mask;
    if (FIRST) {
        const uint32_t lead = __shfl_sync(DR_FULL, dig, 0);
        const unsigned with = __ballot_sync(DR_FULL, in && dig == lead);
        dr_red_shared(o.hs + 4u * lead, (unsigned)__popc(with), (threadIdx.x & 31) == 0 && with);
        dr_red_shared(o.hs + 4u * dig, 1u, in && dig != lead);
        return;
    }
    const uint32_t above = dr_shr32(w, ps.hs);
    bool any = false;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const bool m = in && above == ps.hi[r] && (!INDEX || v == ps.val[r]);
        dr_red_shared(o.hs + 1024u * r + 4u * dig, 1u, m);
        any |= m;
    }
    if (LIST && any) {
        const int k = atomicAdd(o.ncand, 1);
        if (k < o.cap) o.cand[k] = make_uint2(v, x);
    }
}

/* A pass of the count select over the keys [lo, hi) of one head. */
template <int ROWS, bool FIRST, bool INDEX, bool LIST>
static __device__ __forceinline__ void dr_sel_scan(const uint32_t *Ab, int lo, int hi, int M,
                                                   const dr_sel_pass &ps, const dr_sel_out &o) {
    const dr_span sp = dr_span_of(Ab, lo, hi);
    for (int b = 0; b < sp.nv; b += DR_SPAN_U * DR_SEL_THREADS) {
        uint4 q[DR_SPAN_U];
        dr_span_load(sp, b, q);
#pragma unroll
        for (int u = 0; u < DR_SPAN_U; ++u) {
            const int j = b + u * DR_SEL_THREADS + (int)threadIdx.x, i = sp.a0 + 4 * j;
            const bool in = j < sp.nv;
            const uint32_t e[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
            for (int c = 0; c < 4; ++c)
                dr_sel_key<ROWS, FIRST, INDEX, LIST>(dr_order_key(e[c]), (uint32_t)(M - 1 - i - c),
                                                     in, ps, o);
        }
    }
    int i;
    bool in;
    const uint32_t bits = dr_span_rest(sp, &i, &in);
    dr_sel_key<ROWS, FIRST, INDEX, LIST>(dr_order_key(bits), (uint32_t)(M - 1 - i), in, ps, o);
}

/* A pass over the CTA's listed keys (n of them). */
template <int ROWS, bool INDEX>
static __device__ __forceinline__ void dr_sel_scan_list(const uint2 *cand, int n,
                                                        const dr_sel_pass &ps, const dr_sel_out &o) {
    for (int k = (int)threadIdx.x; k < n; k += DR_SEL_THREADS) {
        const uint2 c = cand[k];
        dr_sel_key<ROWS, false, INDEX, false>(c.x, c.y, true, ps, o);
    }
}

/* Where a later pass reads its keys: every key of the share, the share
 * while listing the matching ones, or the list. */
enum { DR_SRC_ALL = 0, DR_SRC_LISTING = 1, DR_SRC_LIST = 2 };

template <int ROWS, bool INDEX>
static __device__ __forceinline__ void dr_sel_pass_rows(int src, const uint32_t *Ab, int lo, int hi,
                                                        int M, const dr_sel_pass &ps,
                                                        const dr_sel_out &o, int n) {
    if (src == DR_SRC_LIST)
        dr_sel_scan_list<ROWS, INDEX>(o.cand, n, ps, o);
    else if (src == DR_SRC_LISTING)
        dr_sel_scan<ROWS, false, INDEX, true>(Ab, lo, hi, M, ps, o);
    else
        dr_sel_scan<ROWS, false, INDEX, false>(Ab, lo, hi, M, ps, o);
}

/* A pass after the first, for ps.rows rows (1 to 3). */
template <bool INDEX>
static __device__ __forceinline__ void dr_sel_pass_any(int src, const uint32_t *Ab, int lo, int hi,
                                                       int M, const dr_sel_pass &ps,
                                                       const dr_sel_out &o, int n) {
    if (ps.rows == 1)
        dr_sel_pass_rows<1, INDEX>(src, Ab, lo, hi, M, ps, o, n);
    else if (ps.rows == 2)
        dr_sel_pass_rows<2, INDEX>(src, Ab, lo, hi, M, ps, o, n);
    else
        dr_sel_pass_rows<3, INDEX>(src, Ab, lo, hi, M, ps, o, n);
}

/* Lane l's sum of bins top - l n .. top - l n - n + 1, and the warp's
 * inclusive scan of those sums from lane 0 (the highest bins) on, plus
 * base: which lane's bins hold rank r (31 if none), and the count above
 * that lane's bins. */
static __device__ __forceinline__ int dr_sel_lane_of(const unsigned int *hj, int top, int n,
                                                     unsigned long long r,
                                                     unsigned long long *base) {
    const int lane = threadIdx.x & 31;
    unsigned long long own = 0ull;
#pragma unroll 8
    for (int u = 0; u < n; ++u) /* rotated by lane: runs of 32k bins in distinct banks */
        own += hj[top - n * lane - (u + lane) % n];
    unsigned long long incl = own;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long t = __shfl_up_sync(DR_FULL, incl, o);
        if (lane >= o) incl += t;
    }
    const unsigned hit = __ballot_sync(DR_FULL, r < *base + incl);
    const int L = hit ? __ffs(hit) - 1 : 31;
    *base += __shfl_sync(DR_FULL, incl - own, L);
    return L;
}

/*
 * One boundary's digit from the cluster's counts hj (NB bins; a warp):
 * descending from bin NB - 1, the bin where the rank left falls.  A scan
 * of the warp's bins in 32 runs finds the run (for NB > 256, a second
 * scan splits that run in 32 again); lane 0 walks the last run.  Bin 0 is
 * taken without a test when the bins above do not hold the rank (as the
 * sequential walk from the top down to 1 does).  If the boundary is the
 * last (smallest) of the keys that share its bits so far, every one of
 * them is kept: tau may then keep zeros below, since c >= prefix selects
 * exactly those keys and the ones above, and the search of that boundary
 * ends.
 */
template <int NB>
static __device__ __forceinline__ void dr_sel_pick(const unsigned int *hj, int shift, dr_sel &st,
                                                   int j) {
    constexpr int PER = NB / 32, PER2 = PER > 8 ? PER / 32 : PER;
    const unsigned long long r = st.rank[j];
    unsigned long long base = 0ull;
    int top = NB - 1 - PER * dr_sel_lane_of(hj, NB - 1, PER, r, &base);
    if (PER2 != PER) top -= PER2 * dr_sel_lane_of(hj, top, PER2, r, &base);
    if ((threadIdx.x & 31) != 0) return;
    unsigned long long rr = r - base;
    int d = 0;
    for (int u = 0; u < PER2; ++u) {
        d = top - u;
        if (d == 0 || rr < hj[d]) break;
        rr -= hj[d];
    }
    st.prefix[j] |= (unsigned long long)d << shift;
    st.rank[j] = rr;
    if (rr + 1 == (unsigned long long)hj[d]) st.done[j] = 1;
}

/*
 * The whole count select of one head (its state in sel[bh], initialised),
 * by a cluster of CTAs that each count a contiguous share of the head's
 * keys.  Per digit: every CTA counts its share into its own bins; after a
 * cluster barrier every CTA adds the cluster's bins (distributed shared
 * memory) and takes the same step on its own copy of the state, so the
 * copies stay equal and the loop ends in every CTA at once, when no
 * boundary is open.  An aliased boundary takes the state of the one
 * before it.  The second barrier keeps the bins until every CTA has read
 * them.  Once a CTA's own bins say that the keys matching the next
 * prefixes fit its list (dynamic shared memory, `cap` keys), it lists them
 * during the next pass and reads only the list after that: the later
 * digits, index digits included, then cost no pass over the map.  One
 * launch replaces a histogram and a digit launch per pass (NOTES, "The
 * select in one launch").
 */
__global__ void __launch_bounds__(DR_SEL_THREADS, 1)
dr_count_select_kernel(const float *A, long long M, dr_shifts sh, int findmask, int cap,
                       dr_sel *sel) {
    /* Dynamic shared memory: the list (cap keys), then the bins h (the
     * first pass's DR_SEL_WIDE_BINS, then [3][256]).  The first pass's
     * cluster totals use the list's space, which no key fills before the
     * second pass; the later passes' totals have their own. */
    __shared__ unsigned int tot_rows[3 * 256];
    __shared__ dr_sel st;
    __shared__ int ncand, src;
    extern __shared__ uint2 dr_cand[];
    unsigned int *h = (unsigned int *)(dr_cand + cap);
    cg::cluster_group cl = cg::this_cluster();
    const int bh = blockIdx.y, warp = threadIdx.x >> 5, m = (int)M;
    const unsigned nc = cl.num_blocks(), rank = cl.block_rank();
    const int share = (int)((M + nc - 1) / nc);
    const int lo = min(m, (int)rank * share), hi = min(m, lo + share);
    const uint32_t *Ab = (const uint32_t *)A + (int64_t)bh * M;
    dr_sel_out o;
    o.hs = (uint32_t)__cvta_generic_to_shared(h);
    o.cand = dr_cand;
    o.ncand = &ncand;
    o.cap = cap;
    if (threadIdx.x == 0) {
        st = sel[bh];
        ncand = 0;
        src = DR_SRC_ALL;
    }
    __syncthreads();
    for (int p = 0; p < sh.n; ++p) {
        const int shift = sh.s[p], width = sh.w[p];
        const int nb = width > 8 ? 1 << width : 256; /* bins a row: rows > 1 only if width <= 8 */
        const int open = dr_sel_open(st, findmask), alias = dr_sel_alias(st, open);
        if (!open) break; /* the same in every CTA of the cluster */
        /* the row each searched boundary counts into: the first searched
         * boundary with its prefix */
        dr_sel_pass ps;
        int row[3] = {-1, -1, -1};
        ps.rows = 0;
        ps.vs = shift & 31;
        ps.hs = ps.vs + width;
        ps.mask = (1u << width) - 1u;
        for (int j = 0; j < 3; ++j) {
            if (!((open >> j) & 1) || ((alias >> j) & 1)) continue;
            for (int q = 0; q < j; ++q)
                if (row[q] >= 0 && st.prefix[q] == st.prefix[j]) row[j] = row[q];
            if (row[j] >= 0) continue;
            row[j] = ps.rows;
            ps.hi[ps.rows] = dr_shr32(shift >= 32 ? (uint32_t)(st.prefix[j] >> 32)
                                                  : (uint32_t)st.prefix[j], ps.hs);
            ps.val[ps.rows] = (uint32_t)(st.prefix[j] >> 32);
            ++ps.rows;
        }
        const int from = src, listed = ncand;
        for (int i = threadIdx.x; i < ps.rows * nb; i += DR_SEL_THREADS) h[i] = 0u;
        __syncthreads();
        if (p == 0 && ps.rows == 1) /* every prefix is 0 */
            dr_sel_scan<1, true, false, false>(Ab, lo, hi, m, ps, o);
        else if (shift >= 32)
            dr_sel_pass_any<false>(from, Ab, lo, hi, m, ps, o, listed);
        else
            dr_sel_pass_any<true>(from, Ab, lo, hi, m, ps, o, listed);
        cl.sync();
        unsigned int *tot = nb > 256 ? (unsigned int *)dr_cand : tot_rows;
        /* every CTA's count of bin i, the cluster's loads issued together
         * (measured about 1 us less than one at a time, at 14 bits: NOTES) */
#pragma unroll 2
        for (int i = threadIdx.x; i < ps.rows * nb; i += DR_SEL_THREADS) {
            unsigned x[DR_SEL_MAX_CLUSTER];
#pragma unroll
            for (int r = 0; r < DR_SEL_MAX_CLUSTER; ++r)
                x[r] = r < (int)nc ? cl.map_shared_rank(h, r)[i] : 0u;
            unsigned v = 0u;
#pragma unroll
            for (int r = 0; r < DR_SEL_MAX_CLUSTER; ++r) v += x[r];
            tot[i] = v;
        }
        __syncthreads();
        if (warp < 3 && row[warp] >= 0) {
            if (nb == DR_SEL_WIDE_BINS)
                dr_sel_pick<DR_SEL_WIDE_BINS>(tot + nb * row[warp], shift, st, warp);
            else
                dr_sel_pick<256>(tot + nb * row[warp], shift, st, warp);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int j = 1; j < 3; ++j)
                if ((alias >> j) & 1) {
                    st.prefix[j] = st.prefix[j - 1];
                    st.rank[j] = st.rank[j - 1];
                    st.done[j] = st.done[j - 1];
                }
            /* The next source.  The keys that match a boundary's new
             * prefix are, in this CTA, the count of its chosen bin. */
            if (from == DR_SRC_LISTING)
                src = ncand <= cap ? DR_SRC_LIST : DR_SRC_ALL;
            else if (from == DR_SRC_ALL) {
                long long want = 0;
                for (int j = 0; j < 3; ++j)
                    if (row[j] >= 0 && !st.done[j])
                        want += h[nb * row[j] + ((st.prefix[j] >> shift) & ps.mask)];
                if (want <= cap) {
                    src = DR_SRC_LISTING;
                    ncand = 0;
                }
            }
        }
        cl.sync(); /* the bins are read everywhere; the state is settled */
    }
    if (rank == 0 && threadIdx.x == 0) sel[bh] = st;
}

/* ------------------------------------------------------------ host side */

/* Listed keys per CTA of the count select: 96 KB of shared memory, which
 * also holds the first pass's cluster totals. */
#define DR_SEL_CAP 12288
static_assert(DR_SEL_WIDE_BITS >= 9 && DR_SEL_WIDE_BITS <= 14 &&
                  DR_SEL_WIDE_BINS * sizeof(unsigned int) <= DR_SEL_CAP * sizeof(uint2),
              "the first pass's totals must fit the list's space");

/* The largest cluster (up to 8 CTAs, the portable size) of `kernel`
 * (DR_SEL_THREADS threads, smem bytes of dynamic shared memory) whose BH
 * clusters are all resident at once, from the occupancy calculator; cached
 * per kernel slot, device and size.  1 (no cluster to speak of) when even
 * that is not. */
static int dr_sel_cluster(const void *kernel, int slot, size_t smem, int BH, cudaStream_t st,
                          int *nc_out) {
    static int cache[2][16][DR_SEL_MAX_CLUSTER + 1]; /* 0: unknown, else max active clusters + 1 */
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return (int)e;
    for (int nc = DR_SEL_MAX_CLUSTER; nc >= 2; --nc) {
        int act = dev < 16 ? __atomic_load_n(&cache[slot][dev][nc], __ATOMIC_RELAXED) - 1 : -1;
        if (act < 0) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((unsigned)nc, 1);
            cfg.blockDim = dim3(DR_SEL_THREADS);
            cfg.dynamicSmemBytes = smem;
            cfg.stream = st;
            cudaLaunchAttribute attr = {};
            attr.id = cudaLaunchAttributeClusterDimension;
            attr.val.clusterDim.x = (unsigned)nc;
            attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
            cfg.attrs = &attr;
            cfg.numAttrs = 1;
            if ((e = cudaOccupancyMaxActiveClusters(&act, kernel, &cfg)) != cudaSuccess)
                return (int)e;
            if (dev < 16) __atomic_store_n(&cache[slot][dev][nc], act + 1, __ATOMIC_RELAXED);
        }
        if (act >= BH) {
            *nc_out = nc;
            return 0;
        }
    }
    *nc_out = 1;
    return 0;
}

/* A launch of grid (nc, BH) in clusters of nc CTAs. */
static cudaLaunchConfig_t dr_cluster_cfg(int nc, int BH, size_t smem, cudaStream_t st,
                                         cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)nc, (unsigned)BH);
    cfg.blockDim = dim3(DR_SEL_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    *attr = cudaLaunchAttribute{};
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = (unsigned)nc;
    attr->val.clusterDim.y = attr->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

/* The count select of the boundaries in findmask (sel initialised): the
 * 32 value bits in digits of DR_SEL_WIDE_BITS, 8, 8 and the rest, then the index bits that
 * M - 1 uses in digits of 8, in one cluster launch
 * (dr_count_select_kernel). */
static qva_status dr_count_select(const float *A, long long M, int BH, int findmask, dr_sel *sel,
                                  cudaStream_t st) {
    dr_shifts sh;
    sh.n = 0;
    const int vw[4] = {DR_SEL_WIDE_BITS, 8, 8, 32 - DR_SEL_WIDE_BITS - 16}; /* the last 1 to 7 */
    for (int j = 0, s = 64; j < 4; ++j) {
        s -= vw[j];
        sh.s[sh.n] = s, sh.w[sh.n++] = vw[j];
    }
    int ibits = 0;
    while (ibits < 32 && ((unsigned long long)(M - 1) >> ibits) != 0ull) ++ibits;
    for (int s = ((ibits + 7) / 8 - 1) * 8; s >= 0; s -= 8) sh.s[sh.n] = s, sh.w[sh.n++] = 8;
    const size_t smem = DR_SEL_CAP * sizeof(uint2) + DR_SEL_WIDE_BINS * sizeof(unsigned int);
    cudaError_t e = cudaFuncSetAttribute(dr_count_select_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "qvc_draft_route: select shared memory");
    int nc = 1;
    if ((e = (cudaError_t)dr_sel_cluster((const void *)dr_count_select_kernel, 0, smem, BH, st,
                                         &nc)) != cudaSuccess)
        return qvc_cuda_fail(e, "qvc_draft_route: select cluster size");
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = dr_cluster_cfg(nc, BH, smem, st, &attr);
    if ((e = cudaLaunchKernelEx(&cfg, dr_count_select_kernel, A, M, sh, findmask,
                                (int)DR_SEL_CAP, sel)) != cudaSuccess)
        return qvc_cuda_fail(e, "qvc_draft_route: select launch");
    return qvc_launch_check("qvc_draft_route: select");
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
    return dr_count_select(b->A, M, BH, findmask, sc->sel, st);
}

/* c1: the weighted select, four value digits in one cluster launch
 * (dr_mass_select_kernel), which writes each head's quotas and its
 * count-select state; c2: the count select of every boundary a head still
 * has to find.  Settled boundaries hold tau 0 or above every key, so all
 * three compare as FIND. */
qva_status qvc_dr_select_mass(const qvc_draft_route_buf *b, const dr_mass_params *mp,
                              const dr_scratch *sc, dr_bounds *bd, cudaStream_t st) {
    const int BH = b->BH;
    const long long M = (long long)b->R * b->R;
    cudaError_t e;
    int nc = 1;
    if ((e = (cudaError_t)dr_sel_cluster((const void *)dr_mass_select_kernel, 1, 0, BH, st,
                                         &nc)) != cudaSuccess)
        return qvc_cuda_fail(e, "qvc_draft_route: mass select cluster size");
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = dr_cluster_cfg(nc, BH, 0, st, &attr);
    if ((e = cudaLaunchKernelEx(&cfg, dr_mass_select_kernel, b->A, M, *mp, sc->sel,
                                b->head_quota)) != cudaSuccess)
        return qvc_cuda_fail(e, "qvc_draft_route: mass select launch");
    qva_status s = qvc_launch_check("qvc_draft_route: mass select");
    if (s != QVA_OK) return s;
    bd->mode[0] = bd->mode[1] = bd->mode[2] = DR_SEL_FIND;
    return dr_count_select(b->A, M, BH, 7, sc->sel, st);
}
