/*
 * DraftAttention2 router on the device (DA2 §3.1 Eq. 1-2, Algorithm 1,
 * C.1-C.2): region pooling of Q and K, the draft map, the per-head ranking
 * with quotas and the per-(head, query region) key lists of each phase.
 * All B*H heads at once, on the caller's stream.
 *
 * The results equal the CPU reference (src/cpu/draft.c, docs/DRAFT.md §3)
 * bit for bit:
 *   - pooling: one thread per (region, channel, Q or K) adds the region's
 *     valid tokens in path order (the packed order of the CPU) in FP64 with
 *     explicit _rn adds, divides once and rounds to f32; the max is the
 *     same sequential `v > m ? v : m` scan, started at the first token;
 *   - draft map: the logits are FP64 dot products in channel order, times
 *     sm; max; exp(x - max); the sum in key-region order by one lane; one
 *     IEEE division per entry; the FP64 mixture (1 - lambda) p + lambda p'
 *     rounded to f32.  The CPU chain is s = s + (double)q * (double)k,
 *     rounded after the product and after the sum (no contraction).  The
 *     product of two f32 values is exact in FP64 (24 + 24 <= 53
 *     significand bits; a nonzero |q k| lies in [2^-298, 2^256], inside
 *     FP64's normal range), so rounding it is the identity and
 *     __fma_rn(q, k, s) == __dadd_rn(s, __dmul_rn(q, k)) bit for bit,
 *     signed zeros and infinities included (only NaN payloads could
 *     differ, and every NaN ranks alike).  The device therefore runs one
 *     DFMA per channel instead of a DMUL and a DADD.  exp() is CUDA's FP64
 *     exp (<= 1 ulp), libm's may differ by an ulp; the f32 rounding absorbs
 *     that except on a rounding boundary (docs/DRAFT.md §3).
 *     Speed (dr_map_kernel): a CTA takes up to 16 query regions of one
 *     head, their descriptors converted once to FP64 in shared memory;
 *     each lane computes a 16 x 2 register tile (16 query regions, key
 *     regions b and b + 32) of one branch, the query values broadcast
 *     from shared memory, the key values read from L2 straight into
 *     registers and converted once per 16 uses.  Per channel that is 32
 *     DFMA, 8 broadcast shared loads and 2 conversions per lane, so the
 *     FP64 pipe, not shared memory or the conversion unit, bounds it; each
 *     key row is read from L2 once per 16 query regions.  The logits stay
 *     in shared memory for the softmax (2 x 16 x R doubles: 189 KB at
 *     R = 609, one CTA per SM; fewer rows when R is larger);
 *   - ranking: no sort.  Each entry gets the 64-bit key
 *         comp = orderable(A) << 32 | (M - 1 - pair index),   M = R*R,
 *     whose descending order is exactly the CPU's stable descending argsort
 *     (ties by ascending pair index; NaN last; -0 == +0), and all keys are
 *     distinct.  A radix select (8-bit digits, most significant first,
 *     only as many index digits as M - 1 needs) finds, per head, the keys
 *     tau_j of the pairs at ranks e_j - 1 for the three cumulative quotas
 *     e_0 = T16, e_1 = T16 + T8, e_2 = T16 + T8 + T4.  A pair's precision
 *     is then 16 if comp >= tau_0, else 8 if comp >= tau_1, else 4 if
 *     comp >= tau_2, else 0: the CPU's assignment of sorted positions.
 *     A boundary whose pair is the last of the keys that share its digits
 *     so far keeps all of them, so its search ends there with zeros below
 *     (c >= tau selects the same pairs); the index digits are then only
 *     read when a quota splits a group of equal A values;
 *   - lists: a warp per (head, query region) row writes each phase's key
 *     regions in ascending order with ballots; a per-head scan of the row
 *     counts gives the CSR offsets (layout in cuda_internal.h).
 * QUOTA budget: the quotas come from the CPU function (qvi_draft_quotas)
 * on the host, the same e_j for every head (dr_route_quota).
 * MASS budget (docs/DRAFT.md, "Adaptive budget"; dr_route_mass): each
 * head's K comes from the device, with no host synchronisation, by the
 * integer rule of src/draft/budget.h (the CPU's, tested against it on the
 * host):
 *   - weighted select: w = floor(A * 2^40) depends only on the value half
 *     of the key and grows with it.  Four passes over the value digits
 *     (dr_whist_kernel: per digit bucket the count and the uint64 w-sum of
 *     the candidate keys, integer atomics, so order-free; dr_wselect_kernel:
 *     one walk per head).  The first pass also gives S = sum(w) and the
 *     target T = ceil(mass_ppm * S / 10^6).  From bucket 255 down, the
 *     bucket whose w-sum reaches what is left of T holds the boundary; the
 *     ones above are kept whole (their count added, their weight taken
 *     off).  After the last value digit the candidates share one A, ranked
 *     by pair index, each of weight w(A) > 0, so K_mass = keys above +
 *     ceil(left / w(A)): no index digit is needed;
 *   - the same kernel clamps K to [keep_min, keep_max], splits it with
 *     qvi_draft_quotas's largest remainders (qvi_budget_split, on the
 *     fractions in ppm from the host), writes the head's quotas
 *     (head_quota) and sets the head's count-select state for its own
 *     e_0..e_2 (a boundary of 0 or M settled at once, tau above every key
 *     or 0, so the assignment compares all three as thresholds);
 *   - then the count select, precision matrix and lists above, unchanged
 *     but for the list starts: head bh starts at the kept counts of the
 *     heads before it (dr_head_base_kernel, one CTA), so the lists stay
 *     contiguous and a row's end is the next row's start, as the phased
 *     kernels read them.
 *   Extra work per call: 4 histogram and 4 walk launches, one list-start
 *   launch and one more memset than QUOTA; memory per head: 2 KB of w-sum
 *   buckets, 40 B of select state and list start, 32 B of quotas.
 */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/device_util.cuh"
#include "draft/budget.h"
#include "draft/partition.h"
#include "draft/plan.h"


#define DR_MAX_D 128
#define DR_FULL 0xffffffffu
#define DR_ROWS_PER_CTA 8       /* warps (= query-region rows) of the list kernels */
#define DR_HIST_THREADS 256
#define DR_HIST_ITEMS 16        /* entries per thread and selection pass */
#define DR_SCAN_THREADS 1024
#define DR_MAP_WARPS 8          /* warps of the map kernel */
#define DR_MAP_MAX_ROWS 16      /* query regions per map CTA, when shared memory allows */
/*
 * Orderable key of a draft-map value: larger A -> larger key; NaN -> 0,
 * below every number (the CPU sorts NaN last); -0 and +0 equal (the CPU
 * compares with !=).
 */
static __host__ __device__ __forceinline__ uint32_t dr_order_key(uint32_t u) {
    return qvi_budget_order_key(u); /* src/draft/budget.h: the MASS select reads it too */
}

/* Distinct 64-bit key of pair i among M: descending order = the CPU's
 * stable descending argsort (equal A: ascending i). */
static __host__ __device__ __forceinline__ uint64_t dr_comp(uint32_t abits, uint64_t i,
                                                            uint64_t M) {
    return ((uint64_t)dr_order_key(abits) << 32) | (M - 1 - i);
}

/* Selection mode of one cumulative quota e_j: none retained, all, or a
 * threshold found by the radix select. */
enum { DR_SEL_NONE = 0, DR_SEL_ALL = 1, DR_SEL_FIND = 2 };

typedef struct dr_bounds {
    int mode[3];
} dr_bounds;

/* Per head: the selected key bits so far, the rank left within them and
 * whether the search is over (the remaining bits of tau stay zero). */
typedef struct dr_sel {
    unsigned long long prefix[3];
    unsigned long long rank[3];
    int done[3];
} dr_sel;

/* Precision (0/4/8/16) of composite key c under the per-head thresholds. */
static __host__ __device__ __forceinline__ int dr_class(uint64_t c, const dr_bounds &bd,
                                                        const unsigned long long *tau) {
#define DR_KEPT(j) (bd.mode[j] == DR_SEL_ALL || (bd.mode[j] == DR_SEL_FIND && c >= tau[j]))
    return DR_KEPT(0) ? 16 : DR_KEPT(1) ? 8 : DR_KEPT(2) ? 4 : 0;
#undef DR_KEPT
}

/* Phase index of a precision: 0 NVFP4, 1 INT8, 2 16-bit, -1 skipped. */
static __device__ __forceinline__ int dr_phase(int p) {
    return p == 4 ? 0 : p == 8 ? 1 : p == 16 ? 2 : -1;
}

/* ------------------------------------------------------------ pooling */

typedef struct dr_pool_params {
    qvc_view q, k;
    const int32_t *pack;   /* [n_pack] sequence index of each slot */
    const int32_t *count;  /* [R]                                  */
    int64_t prefix_pad;
    int c, R, D;
    float *qavg, *qmax, *kavg, *kmax; /* [BH][R][D] */
} dr_pool_params;

/* One element of Q (which = 0, dtype DTQ) or K (which = 1, dtype DTK),
 * widened to FP32 exactly. */
template <int DTQ, int DTK>
static __device__ __forceinline__ float dr_ld(int which, const void *data, int64_t off) {
    return which ? qvc_ld<DTK>(data, off) : qvc_ld<DTQ>(data, off);
}

/*
 * qvi_draft_pool for Q and K of one (region, bh): threads [0, D) take Q,
 * [D, 2D) K, one channel each; tokens in path order.  Loads are issued 16
 * ahead; the adds stay in order.
 */
template <int DTQ, int DTK>
__global__ void __launch_bounds__(2 * DR_MAX_D)
dr_pool_kernel(dr_pool_params p) {
    __shared__ int64_t rowoff[2][QVI_BLOCK];
    const int r = blockIdx.x, bh = blockIdx.y, D = p.D;
    const int n = p.count[r];
    const int64_t slot0 = p.prefix_pad + (int64_t)r * p.c;
    const int64_t qb = qvc_head_base(p.q, bh), kb = qvc_head_base(p.k, bh);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int64_t o = p.pack[slot0 + i];
        rowoff[0][i] = qb + o * p.q.sn;
        rowoff[1][i] = kb + o * p.k.sn;
    }
    __syncthreads();
    const int which = threadIdx.x >= D ? 1 : 0, ch = threadIdx.x - which * D;
    if (ch >= D || which > 1) return;
    const void *data = which ? p.k.data : p.q.data;
    const int64_t *ro = rowoff[which];

    double s = 0.0;
    /* The CPU starts the max at the block's first row (a padding row of
     * zeros only if the region were empty, which no partition makes). */
    float m = n > 0 ? dr_ld<DTQ, DTK>(which, data, ro[0] + ch) : 0.0f;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        float t[16];
#pragma unroll
        for (int u = 0; u < 16; ++u) t[u] = dr_ld<DTQ, DTK>(which, data, ro[i + u] + ch);
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            s = __dadd_rn(s, (double)t[u]);
            m = t[u] > m ? t[u] : m;
        }
    }
    for (; i < n; ++i) {
        const float v = dr_ld<DTQ, DTK>(which, data, ro[i] + ch);
        s = __dadd_rn(s, (double)v);
        m = v > m ? v : m;
    }
    const int64_t o = ((int64_t)bh * p.R + r) * D + ch;
    float *avg = which ? p.kavg : p.qavg, *mx = which ? p.kmax : p.qmax;
    avg[o] = __double2float_rn(__ddiv_rn(s, (double)n));
    mx[o] = m;
}

/* The pooling launch for Q of dtype DTQ and K of dtype dtk (they may differ,
 * as on the CPU). */
template <int DTQ>
static void dr_launch_pool(int dtk, const dr_pool_params &pp, int R, int BH, int threads,
                           cudaStream_t st) {
    const dim3 grid((unsigned)R, (unsigned)BH);
    if (dtk == QVA_F32)
        dr_pool_kernel<DTQ, QVA_F32><<<grid, threads, 0, st>>>(pp);
    else if (dtk == QVA_BF16)
        dr_pool_kernel<DTQ, QVA_BF16><<<grid, threads, 0, st>>>(pp);
    else
        dr_pool_kernel<DTQ, QVA_F16><<<grid, threads, 0, st>>>(pp);
}

/* ------------------------------------------------------------ draft map */

typedef struct dr_map_params {
    const float *qavg, *qmax, *kavg, *kmax; /* [BH][R][D] */
    int R, D;
    double sm, lam;
    float *A;                               /* [BH][R][R] */
} dr_map_params;

/* Row stride of the FP64 query tile: even, for the 16-byte pair loads. */
static __host__ __device__ constexpr int dr_map_qs(int rows) { return (rows + 1) & ~1; }

/* Row stride of the logits: odd, so that the 2*rows lanes of the sum pass,
 * one row each at the same key, read distinct bank pairs. */
static __host__ __device__ __forceinline__ int dr_map_rs(int R) { return R | 1; }

/* Dynamic shared memory of the map kernel for `rows` query regions. */
static size_t dr_map_smem(int rows, int R, int D) {
    return (size_t)2 * D * dr_map_qs(rows) * sizeof(double) /* query descriptors */
           + (size_t)2 * rows * dr_map_rs(R) * sizeof(double) /* logits, then exps */
           + (size_t)2 * rows * sizeof(double);               /* row sums          */
}

/* Eight consecutive channels of one key descriptor, as two 16-byte loads
 * when the rows are 16-byte aligned (D % 4 == 0). */
static __device__ __forceinline__ void dr_ld8(const float *p, bool vec, float (&f)[8]) {
    if (vec) {
        const float4 u = __ldg((const float4 *)p), v = __ldg((const float4 *)p + 1);
        f[0] = u.x, f[1] = u.y, f[2] = u.z, f[3] = u.w;
        f[4] = v.x, f[5] = v.y, f[6] = v.z, f[7] = v.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) f[i] = __ldg(p + i);
    }
}

/*
 * One channel of a lane's register tile: QS query rows times its two keys.
 * The query pairs are one 16-byte shared load at the same address in every
 * lane (a broadcast, one wavefront).  fma(q, k, s) == s + q*k rounded once
 * == __dadd_rn(s, __dmul_rn(q, k)) because q*k of two f32 values is exact
 * in FP64 (see the file comment).
 */
template <int QS>
static __device__ __forceinline__ void dr_map_step(const double *q, double k0, double k1,
                                                   double (&acc)[QS][2]) {
#pragma unroll
    for (int r = 0; r < QS; r += 2) {
        const double2 qq = *(const double2 *)(q + r);
        acc[r][0] = __fma_rn(qq.x, k0, acc[r][0]);
        acc[r][1] = __fma_rn(qq.x, k1, acc[r][1]);
        acc[r + 1][0] = __fma_rn(qq.y, k0, acc[r + 1][0]);
        acc[r + 1][1] = __fma_rn(qq.y, k1, acc[r + 1][1]);
    }
}

/*
 * Logits of QS query rows against the keys k0, k1 (rows of D floats), each
 * a chain over the channels in order.  The keys come straight from global
 * memory (L2) into registers, a 32-byte sector per key and 8 channels,
 * the next 8 requested before the current 8 are used; each key value is
 * converted once and used QS times.
 */
template <int QS>
static __device__ __forceinline__ void dr_map_dots(const double *q, const float *k0,
                                                   const float *k1, int D,
                                                   double (&acc)[QS][2]) {
    const bool vec = (D & 3) == 0;
    const int D8 = D & ~7;
    float f0[8], f1[8];
    if (D8) {
        dr_ld8(k0, vec, f0);
        dr_ld8(k1, vec, f1);
    }
    for (int c0 = 0; c0 < D8; c0 += 8) {
        const int cn = c0 + 8 < D8 ? c0 + 8 : c0; /* the last one reloads (an L1 hit) */
        float g0[8], g1[8];
        dr_ld8(k0 + cn, vec, g0);
        dr_ld8(k1 + cn, vec, g1);
#pragma unroll
        for (int u = 0; u < 8; ++u)
            dr_map_step<QS>(q + (c0 + u) * QS, (double)f0[u], (double)f1[u], acc);
#pragma unroll
        for (int u = 0; u < 8; ++u) f0[u] = g0[u], f1[u] = g1[u];
    }
    for (int c = D8; c < D; ++c)
        dr_map_step<QS>(q + c * QS, (double)__ldg(k0 + c), (double)__ldg(k1 + c), acc);
}

/*
 * qvi_draft_map for ROWS query regions a0 .. a0+ROWS-1 of one head, both
 * branches.  Phases, separated by block barriers:
 *   1. the query descriptors of the CTA, converted once to FP64 into
 *      shared memory as [branch][channel][row];
 *   2. work items (branch, 64 key regions) dealt round-robin to the warps
 *      (items i and i+4 share a scheduler, so its load is even); lane l
 *      holds keys b and b + 32 and all QS rows: 2*QS FP64 accumulators,
 *      per channel QS/2 broadcast loads and 2 conversions for 2*QS FMAs.
 *      Logits x = dot * sm go to shared memory, [branch][row][key];
 *   3. a warp per (branch, row): the max over keys, then exp(x - max) in
 *      place;
 *   4. one lane per (branch, row), 2*ROWS <= 32 chains side by side: the
 *      sum in key-region order;
 *   5. a warp per row: the two divisions, the mixture, f32 stores.
 */
template <int ROWS>
__global__ void __launch_bounds__(32 * DR_MAP_WARPS, 1)
dr_map_kernel(dr_map_params p) {
    constexpr int QS = dr_map_qs(ROWS);
    extern __shared__ __align__(16) double dr_smem[];
    const int R = p.R, D = p.D, RS = dr_map_rs(R), bh = blockIdx.y, a0 = blockIdx.x * ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    double *qd = dr_smem;            /* [2][D][QS]    */
    double *x = qd + 2 * D * QS;     /* [2][ROWS][RS] */
    double *sum = x + 2 * ROWS * RS; /* [2][ROWS]     */

    /* 1. Rows past R (and the pad row when ROWS is odd) are zeros. */
    for (int i = threadIdx.x; i < 2 * QS * D; i += blockDim.x) {
        const int c = i % D, t = i / D, r = t % QS, br = t / QS, a = a0 + r;
        const float *src = br ? p.qmax : p.qavg;
        qd[(br * D + c) * QS + r] =
            r < ROWS && a < R ? (double)src[((int64_t)bh * R + a) * D + c] : 0.0;
    }
    __syncthreads();

    /* 2. Keys past R load row R - 1 and are not stored. */
    const int ntile = (R + 63) / 64;
    for (int item = warp; item < 2 * ntile; item += DR_MAP_WARPS) {
        const int br = item & 1, b0 = (item >> 1) * 64 + lane, b1 = b0 + 32;
        const float *kx = (br ? p.kmax : p.kavg) + (int64_t)bh * R * D;
        double acc[QS][2];
#pragma unroll
        for (int r = 0; r < QS; ++r) acc[r][0] = acc[r][1] = 0.0;
        dr_map_dots<QS>(qd + br * D * QS, kx + (int64_t)min(b0, R - 1) * D,
                        kx + (int64_t)min(b1, R - 1) * D, D, acc);
        double *xb = x + br * ROWS * RS;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (b0 < R) xb[r * RS + b0] = __dmul_rn(acc[r][0], p.sm);
            if (b1 < R) xb[r * RS + b1] = __dmul_rn(acc[r][1], p.sm);
        }
    }
    __syncthreads();

    /* 3. Maxima: order-free for numbers (a +-0 tie changes no difference). */
    for (int pr = warp; pr < 2 * ROWS; pr += DR_MAP_WARPS) {
        if (a0 + pr % ROWS >= R) continue; /* warp-uniform */
        double *xr = x + pr * RS;
        double m = -INFINITY;
        for (int b = lane; b < R; b += 32) m = xr[b] > m ? xr[b] : m;
        for (int o = 16; o > 0; o >>= 1) {
            const double t = __shfl_xor_sync(DR_FULL, m, o);
            m = t > m ? t : m;
        }
        for (int b = lane; b < R; b += 32) xr[b] = exp(__dsub_rn(xr[b], m));
    }
    __syncthreads();

    /* 4. Sums in key-region order. */
    if (threadIdx.x < 2 * ROWS && a0 + (int)threadIdx.x % ROWS < R) {
        const double *xr = x + threadIdx.x * RS;
        double s = 0.0;
        int b = 0;
        for (; b + 8 <= R; b += 8) {
            double t[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) t[u] = xr[b + u];
#pragma unroll
            for (int u = 0; u < 8; ++u) s = __dadd_rn(s, t[u]);
        }
        for (; b < R; ++b) s = __dadd_rn(s, xr[b]);
        sum[threadIdx.x] = s;
    }
    __syncthreads();

    /* 5. Mixture. */
    const double oml = __dsub_rn(1.0, p.lam);
    for (int r = warp; r < ROWS && a0 + r < R; r += DR_MAP_WARPS) {
        const double *xa = x + r * RS, *xm = x + (ROWS + r) * RS;
        const double sa = sum[r], smx = sum[ROWS + r];
        float *Arow = p.A + ((int64_t)bh * R + a0 + r) * R;
        for (int b = lane; b < R; b += 32) {
            const double pa = __ddiv_rn(xa[b], sa), pm = __ddiv_rn(xm[b], smx);
            Arow[b] = __double2float_rn(__dadd_rn(__dmul_rn(oml, pa), __dmul_rn(p.lam, pm)));
        }
    }
}

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

/*
 * Histogram of the 8-bit digit at `shift` of the keys that match each
 * open boundary's selected prefix (the bits above the digit).  Warp-
 * aggregated shared atomics (many keys share a digit in the first passes),
 * then one global atomic per non-empty bin.  The match is skipped where no
 * lane of the warp matches (most keys after the first digits) and shared
 * by boundaries whose prefixes are equal (all of them in the first pass).
 * A head whose boundaries are all settled leaves at once.
 */
__global__ void __launch_bounds__(DR_HIST_THREADS)
dr_hist_kernel(const float *A, long long M, int shift, int findmask, const dr_sel *sel,
               unsigned int *hist /* [BH][3][256] */) {
    __shared__ unsigned int h[3][256];
    const int bh = blockIdx.y, lane = threadIdx.x & 31;
    unsigned long long pre[3];
    int open = 0, same = 0; /* per head, so uniform over the CTA */
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        pre[j] = sel[bh].prefix[j];
        if (((findmask >> j) & 1) && !sel[bh].done[j]) open |= 1 << j;
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
            if (!((open >> j) & 1)) continue; /* uniform */
            if (!((same >> j) & 1)) {         /* uniform; else boundary j-1's */
                val = in && (c & high) == pre[j] ? dig : -1;
                peers = __any_sync(DR_FULL, val >= 0) ? __match_any_sync(DR_FULL, val) : 0u;
            }
            if (val >= 0 && lane == __ffs(peers) - 1) atomicAdd(&h[j][val], (unsigned)__popc(peers));
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
 * clears the histogram for the next pass.  One warp per head; the bins are
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
    __syncwarp();
    if (lane < 3 && ((findmask >> lane) & 1) && !sel[bh].done[lane]) {
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
}

/* ------------------------------------------------------------ MASS budget */

/* The MASS integers of one call, from the host (qvi_draft_mass_bounds and
 * the split fractions in parts per million, as qvi_draft_quotas takes
 * them). */
typedef struct dr_mass_params {
    long long M, mass_ppm, keep_min, keep_max;
    long long u[4]; /* QVI_Q_* order; u[QVI_Q_SKIP] = 0 */
} dr_mass_params;

/* Per head, the weighted select over the value digits (budget.h). */
typedef qvi_budget_sel dr_mass;

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

/* ------------------------------------------------------------ lists */

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
    for (int b0 = 0; b0 < R; b0 += 32) {
        const int b = b0 + lane;
        int pc = 0;
        if (b < R) {
            pc = dr_class(dr_comp(__ldg(Ar + b), (uint64_t)a * R + b, M), bd, tau);
            prec[row + b] = (uint8_t)pc;
        }
        n4 += __popc(__ballot_sync(DR_FULL, pc == 4));
        n8 += __popc(__ballot_sync(DR_FULL, pc == 8));
        n16 += __popc(__ballot_sync(DR_FULL, pc == 16));
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
    for (int b0 = 0; b0 < R; b0 += 32) {
        const int b = b0 + lane;
        const int ph = b < R ? dr_phase(pr[b]) : -1;
#pragma unroll
        for (int p = 0; p < 3; ++p) {
            const unsigned m = __ballot_sync(DR_FULL, ph == p);
            if (ph == p) cols[o[p] + __popc(m & lt)] = b;
            o[p] += __popc(m);
        }
    }
}

/* ------------------------------------------------------------ host side */

extern "C" qva_status qvc_draft_layout_upload(const struct qvi_partition *part, int t,
                                              int prefix, int prefix_at_end,
                                              qvc_draft_layout *out) {
    if (!out) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_layout_upload: out is NULL");
    memset(out, 0, sizeof *out);
    if (!part) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_layout_upload: no partition");
    qvi_draft_layout lay;
    qva_status s = qvi_draft_layout_build(part, t, prefix, prefix_at_end, &lay);
    if (s != QVA_OK) return s;
    if (lay.regions > 46340 || lay.c > QVI_BLOCK) { /* R^2 pairs must fit int32 */
        s = qvi_fail(QVA_ERR_UNSUPPORTED,
                     "qvc_draft_layout_upload: %lld regions of capacity %d (at most 46340 of %d)",
                     (long long)lay.regions, lay.c, QVI_BLOCK);
        qvi_draft_layout_free(&lay);
        return s;
    }
    struct { void **p; const void *src; size_t bytes; } req[] = {
        {(void **)&out->pack_to_orig, lay.pack_to_orig, (size_t)lay.n_pack * sizeof(int32_t)},
        {(void **)&out->orig_to_pack, lay.orig_to_pack, (size_t)lay.n * sizeof(int32_t)},
        {(void **)&out->count, lay.count, (size_t)lay.regions * sizeof(int32_t)},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0] && s == QVA_OK; ++i) {
        cudaError_t e = cudaMalloc(req[i].p, req[i].bytes ? req[i].bytes : 4);
        if (e != cudaSuccess) {
            *req[i].p = NULL;
            s = qvc_cuda_fail(e, "qvc_draft_layout_upload: cudaMalloc");
        } else if (req[i].bytes &&
                   (e = cudaMemcpy(*req[i].p, req[i].src, req[i].bytes, cudaMemcpyHostToDevice)) !=
                       cudaSuccess) {
            s = qvc_cuda_fail(e, "qvc_draft_layout_upload: cudaMemcpy");
        }
    }
    if (s == QVA_OK) {
        out->n = lay.n;
        out->n_pack = lay.n_pack;
        out->prefix_pad = lay.prefix_pad;
        out->prefix = lay.prefix;
        out->prefix_at_end = lay.prefix_at_end;
        out->t = lay.t;
        out->h = lay.h;
        out->w = lay.w;
        out->c = lay.c;
        out->rf = lay.rf;
        out->regions = (int)lay.regions;
    } else {
        qvc_draft_layout_free(out);
    }
    qvi_draft_layout_free(&lay);
    return s;
}

extern "C" void qvc_draft_layout_free(qvc_draft_layout *l) {
    if (!l) return;
    void *ptrs[] = {l->pack_to_orig, l->orig_to_pack, l->count};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(l, 0, sizeof *l);
}

static size_t dr_align(size_t x) { return (x + 255) & ~(size_t)255; }

/* Scratch: histograms [BH][3][256] u32, selection state [BH], row counts
 * [BH][R][3] i32; for the MASS budget the w-sum bins [BH][256] u64, the
 * weighted-select state [BH] and the heads' list starts [BH] i64. */
static size_t dr_scratch_hist(int BH) { return dr_align((size_t)BH * 3 * 256 * sizeof(unsigned)); }
static size_t dr_scratch_sel(int BH) { return dr_align((size_t)BH * sizeof(dr_sel)); }
static size_t dr_scratch_cnt(int BH, int R) { return dr_align((size_t)BH * R * 3 * sizeof(int32_t)); }
static size_t dr_scratch_whist(int BH) { return dr_align((size_t)BH * 256 * sizeof(unsigned long long)); }
static size_t dr_scratch_mass(int BH) { return dr_align((size_t)BH * sizeof(dr_mass)); }
static size_t dr_scratch_base(int BH) { return dr_align((size_t)BH * sizeof(int64_t)); }

/* The scratch regions of one call, carved in the order of the sizes. */
typedef struct dr_scratch {
    unsigned int *hist;
    dr_sel *sel;
    int32_t *cnt;
    unsigned long long *whist;
    dr_mass *mass;
    int64_t *base;
} dr_scratch;

static size_t dr_scratch_bytes(int BH, int R) {
    return dr_scratch_hist(BH) + dr_scratch_sel(BH) + dr_scratch_cnt(BH, R) +
           dr_scratch_whist(BH) + dr_scratch_mass(BH) + dr_scratch_base(BH);
}

static dr_scratch dr_scratch_of(void *scratch, int BH, int R) {
    char *p = (char *)scratch;
    dr_scratch x;
    x.hist = (unsigned int *)p;
    p += dr_scratch_hist(BH);
    x.sel = (dr_sel *)p;
    p += dr_scratch_sel(BH);
    x.cnt = (int32_t *)p;
    p += dr_scratch_cnt(BH, R);
    x.whist = (unsigned long long *)p;
    p += dr_scratch_whist(BH);
    x.mass = (dr_mass *)p;
    p += dr_scratch_mass(BH);
    x.base = (int64_t *)p;
    return x;
}

extern "C" qva_status qvc_draft_route_alloc(qvc_draft_route_buf *b, int BH, int R, int D) {
    if (!b) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_route_alloc: buf is NULL");
    memset(b, 0, sizeof *b);
    if (BH < 1 || R < 1 || D < 1 || D > DR_MAX_D)
        return qvi_fail(QVA_ERR_SHAPE, "qvc_draft_route_alloc: bad shape BH=%d R=%d D=%d", BH, R, D);
    const size_t bh = (size_t)BH, r = (size_t)R, d = (size_t)D, M = r * r;
    if ((double)bh * (double)M * 3.0 + 1.0 > 2147483647.0)
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "qvc_draft_route_alloc: B*H*R^2 = %d*%d^2 pairs exceed the int32 lists",
                        BH, R);
    b->BH = BH;
    b->R = R;
    b->D = D;
    const size_t scratch = dr_scratch_bytes(BH, R);
    const qvc_alloc req[] = {
        {(void **)&b->qavg, bh * r * d * sizeof(float)},
        {(void **)&b->qmax, bh * r * d * sizeof(float)},
        {(void **)&b->kavg, bh * r * d * sizeof(float)},
        {(void **)&b->kmax, bh * r * d * sizeof(float)},
        {(void **)&b->A, bh * M * sizeof(float)},
        {(void **)&b->prec, bh * M},
        {(void **)&b->offsets, (bh * r * 3 + 1) * sizeof(int32_t)},
        {(void **)&b->cols, bh * M * sizeof(int32_t)},
        {(void **)&b->head_quota, bh * 4 * sizeof(int64_t)},
        {&b->scratch, scratch},
    };
    qva_status st = qvc_malloc_all(req, sizeof req / sizeof req[0], "qvc_draft_route_alloc: cudaMalloc");
    if (st != QVA_OK) qvc_draft_route_free(b);
    return st;
}

extern "C" void qvc_draft_route_free(qvc_draft_route_buf *b) {
    if (!b) return;
    void *ptrs[] = {b->qavg, b->qmax, b->kavg, b->kmax, b->A,
                    b->prec, b->offsets, b->cols, b->head_quota, b->scratch};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(b, 0, sizeof *b);
}

static qva_status dr_check_view(const qvc_view *x, const char *name) {
    if (!x || !x->data)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_draft_route: %s is NULL", name);
    if (x->dtype != QVA_F32 && x->dtype != QVA_BF16 && x->dtype != QVA_F16)
        return qvi_fail(QVA_ERR_DTYPE, "qvc_draft_route: %s has dtype %d", name, x->dtype);
    return QVA_OK;
}

template <int ROWS>
static qva_status dr_launch_map_rows(const dr_map_params &mp, int BH, size_t smem,
                                     cudaStream_t st) {
    const cudaError_t e = cudaFuncSetAttribute(
        dr_map_kernel<ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "qvc_draft_route: map shared memory");
    const dim3 grid((unsigned)qvi_cdiv(mp.R, ROWS), (unsigned)BH);
    dr_map_kernel<ROWS><<<grid, 32 * DR_MAP_WARPS, smem, st>>>(mp);
    return qvc_launch_check("qvc_draft_route: draft map");
}

/* Draft map launch: as many query regions per CTA (16, 8, 4, 2 or 1) as
 * the device's opt-in shared memory holds.  More rows reuse each key
 * descriptor read from L2 more often; 16 rows at R = 609 take 189 KB, one
 * CTA per SM. */
static qva_status dr_launch_map(const dr_map_params &mp, int BH, cudaStream_t st) {
    int dev = 0, optin = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) !=
            cudaSuccess)
        return qvc_cuda_fail(e, "qvc_draft_route: device attributes");
    int rows = DR_MAP_MAX_ROWS;
    while (rows > 1 && dr_map_smem(rows, mp.R, mp.D) > (size_t)optin) rows >>= 1;
    const size_t smem = dr_map_smem(rows, mp.R, mp.D);
    if (smem > (size_t)optin)
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "qvc_draft_route: %d video regions need %zu bytes of shared memory "
                        "for the draft map (device limit %d)",
                        mp.R, smem, optin);
    switch (rows) {
    case 16: return dr_launch_map_rows<16>(mp, BH, smem, st);
    case 8: return dr_launch_map_rows<8>(mp, BH, smem, st);
    case 4: return dr_launch_map_rows<4>(mp, BH, smem, st);
    case 2: return dr_launch_map_rows<2>(mp, BH, smem, st);
    default: return dr_launch_map_rows<1>(mp, BH, smem, st);
    }
}

/* The MASS integers of a call: the bounds of the plan (validated there)
 * and the split fractions in parts per million, exactly as
 * qvi_draft_quotas rounds them. */
static qva_status dr_mass_setup(const qva_draft_params *dp, long long M, dr_mass_params *mp) {
    int64_t ppm, lo, hi;
    const qva_status s = qvi_draft_mass_bounds(dp, M, &ppm, &lo, &hi);
    if (s != QVA_OK) return s;
    mp->M = M, mp->mass_ppm = ppm, mp->keep_min = lo, mp->keep_max = hi;
    const float f[4] = {dp->frac_skip, dp->frac4, dp->frac8, dp->frac16}; /* QVI_Q_* order */
    for (int i = 0; i < 4; ++i) mp->u[i] = llround((double)f[i] * 1e6);
    return QVA_OK;
}

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
        dr_hist_kernel<<<hgrid, DR_HIST_THREADS, 0, st>>>(A, M, shifts[i], findmask, sel, hist);
        if ((s = qvc_launch_check("qvc_draft_route: select histogram")) != QVA_OK) return s;
        dr_select_kernel<<<(unsigned)BH, 32, 0, st>>>(hist, sel, shifts[i], findmask);
        if ((s = qvc_launch_check("qvc_draft_route: select digit")) != QVA_OK) return s;
    }
    return QVA_OK;
}

/* QUOTA: one set of boundaries for every head, from the host. */
static qva_status dr_route_quota(qvc_draft_route_buf *b, const int64_t quota[4],
                                 const dr_scratch *sc, cudaStream_t st) {
    const int BH = b->BH, R = b->R;
    const long long M = (long long)R * R;
    const long long e[3] = {quota[QVI_Q_16], quota[QVI_Q_16] + quota[QVI_Q_8],
                            quota[QVI_Q_16] + quota[QVI_Q_8] + quota[QVI_Q_4]};
    qva_status s;
    /* c. thresholds of the three cumulative quotas (Algorithm 1) */
    dr_bounds bd;
    int findmask = 0;
    for (int j = 0; j < 3; ++j) {
        bd.mode[j] = e[j] <= 0 ? DR_SEL_NONE : e[j] >= M ? DR_SEL_ALL : DR_SEL_FIND;
        if (bd.mode[j] == DR_SEL_FIND) findmask |= 1 << j;
    }
    dr_sel_init_kernel<<<(unsigned)qvi_cdiv(BH, 128), 128, 0, st>>>(
        sc->sel, BH, (unsigned long long)e[0], (unsigned long long)e[1], (unsigned long long)e[2]);
    if ((s = qvc_launch_check("qvc_draft_route: selection init")) != QVA_OK) return s;
    if (findmask) {
        const cudaError_t ce =
            cudaMemsetAsync(sc->hist, 0, (size_t)BH * 3 * 256 * sizeof(unsigned), st);
        if (ce != cudaSuccess) return qvc_cuda_fail(ce, "qvc_draft_route: cudaMemsetAsync");
        if ((s = dr_count_select(b->A, M, BH, findmask, sc->sel, sc->hist, st)) != QVA_OK)
            return s;
    }

    /* d. precision matrix, row counts, CSR offsets and lists */
    const dim3 rgrid((unsigned)qvi_cdiv(R, DR_ROWS_PER_CTA), (unsigned)BH);
    dr_assign_kernel<<<rgrid, 32 * DR_ROWS_PER_CTA, 0, st>>>(b->A, R, bd, sc->sel, b->prec,
                                                              sc->cnt);
    if ((s = qvc_launch_check("qvc_draft_route: assign")) != QVA_OK) return s;
    dr_scan_kernel<<<(unsigned)BH, DR_SCAN_THREADS, 0, st>>>(sc->cnt, 3 * R, BH, e[2], NULL,
                                                             b->offsets);
    if ((s = qvc_launch_check("qvc_draft_route: offsets")) != QVA_OK) return s;
    if (e[2] > 0) {
        dr_fill_kernel<<<rgrid, 32 * DR_ROWS_PER_CTA, 0, st>>>(b->prec, b->offsets, R, b->cols);
        if ((s = qvc_launch_check("qvc_draft_route: lists")) != QVA_OK) return s;
    }
    return QVA_OK;
}

/*
 * MASS: each head's K and quotas on the device, then the QUOTA path's
 * kernels with per-head boundaries.  c1: the weighted select, four value
 * digits (dr_whist_kernel, dr_wselect_kernel), whose last pass writes the
 * head's quotas and its count-select state; c2: the count select of
 * every boundary a head still has to find; d: the lists, each head's
 * starting at the kept counts of the heads before it (dr_head_base).
 */
static qva_status dr_route_mass(qvc_draft_route_buf *b, const dr_mass_params *mp,
                                const dr_scratch *sc, cudaStream_t st) {
    const int BH = b->BH, R = b->R;
    const long long M = (long long)R * R;
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
    if ((s = dr_count_select(b->A, M, BH, 7, sc->sel, sc->hist, st)) != QVA_OK) return s;

    dr_bounds bd; /* per head in sel: settled boundaries hold tau 0 or above every key */
    bd.mode[0] = bd.mode[1] = bd.mode[2] = DR_SEL_FIND;
    const dim3 rgrid((unsigned)qvi_cdiv(R, DR_ROWS_PER_CTA), (unsigned)BH);
    dr_assign_kernel<<<rgrid, 32 * DR_ROWS_PER_CTA, 0, st>>>(b->A, R, bd, sc->sel, b->prec,
                                                              sc->cnt);
    if ((s = qvc_launch_check("qvc_draft_route: assign")) != QVA_OK) return s;
    dr_head_base_kernel<<<1, DR_SCAN_THREADS, 0, st>>>(b->head_quota, BH, M, sc->base);
    if ((s = qvc_launch_check("qvc_draft_route: list starts")) != QVA_OK) return s;
    dr_scan_kernel<<<(unsigned)BH, DR_SCAN_THREADS, 0, st>>>(sc->cnt, 3 * R, BH, 0, sc->base,
                                                             b->offsets);
    if ((s = qvc_launch_check("qvc_draft_route: offsets")) != QVA_OK) return s;
    dr_fill_kernel<<<rgrid, 32 * DR_ROWS_PER_CTA, 0, st>>>(b->prec, b->offsets, R, b->cols);
    return qvc_launch_check("qvc_draft_route: lists");
}

extern "C" qva_status qvc_draft_route(const qvc_view *q, const qvc_view *k,
                                      const qva_config *cfg, const qvc_draft_layout *lay,
                                      qvc_draft_route_buf *b, cudaStream_t st) {
    qva_status s;
    if ((s = dr_check_view(q, "q")) != QVA_OK || (s = dr_check_view(k, "k")) != QVA_OK) return s;
    if (!cfg || !lay || !lay->pack_to_orig || !lay->count || !b || !b->A)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qvc_draft_route: NULL config, layout or unallocated buffers");
    const int D = (int)q->D, R = lay->regions;
    const int64_t BH64 = q->B * q->H;
    if (k->B != q->B || k->H != q->H || k->D != q->D || q->N != lay->n || k->N != lay->n ||
        D < 1 || D > DR_MAX_D)
        return qvi_fail(QVA_ERR_SHAPE,
                        "qvc_draft_route: q [%lld,%lld,%lld,%lld] / k [%lld,%lld,%lld,%lld] "
                        "do not match the layout (N = %lld) or D > %d",
                        (long long)q->B, (long long)q->H, (long long)q->N, (long long)q->D,
                        (long long)k->B, (long long)k->H, (long long)k->N, (long long)k->D,
                        (long long)lay->n, DR_MAX_D);
    if (BH64 != b->BH || R != b->R || D != b->D)
        return qvi_fail(QVA_ERR_SHAPE,
                        "qvc_draft_route: buffers for BH=%d R=%d D=%d, call has BH=%lld R=%d D=%d",
                        b->BH, b->R, b->D, (long long)BH64, R, D);
    if (BH64 > 65535)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_draft_route: B*H = %lld exceeds 65535",
                        (long long)BH64);
    if (lay->c < 1 || lay->c > QVI_BLOCK)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_draft_route: region capacity %d (1..%d)",
                        lay->c, QVI_BLOCK);
    const float lambda = cfg->draft.lambda;
    if (!(lambda >= 0.0f && lambda <= 1.0f))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "draft: lambda = %g is outside [0, 1]",
                        (double)lambda);
    const int BH = (int)BH64;
    const long long M = (long long)R * R;
    const int mass = cfg->draft.budget == QVA_DRAFT_BUDGET_MASS;
    int64_t quota[4] = {0, 0, 0, 0};
    dr_mass_params mpar;
    if (mass) {
        if ((s = dr_mass_setup(&cfg->draft, M, &mpar)) != QVA_OK) return s;
        b->retained = -1; /* per head, on the device (head_quota) */
    } else {
        if ((s = qvi_draft_quotas(&cfg->draft, M, quota)) != QVA_OK) return s;
        b->retained = quota[QVI_Q_16] + quota[QVI_Q_8] + quota[QVI_Q_4];
    }
    memcpy(b->quota, quota, sizeof quota);
    b->mass = mass;
    const dr_scratch sc = dr_scratch_of(b->scratch, BH, R);

    /* a. pooling (Eq. 1) */
    dr_pool_params pp;
    pp.q = *q;
    pp.k = *k;
    pp.pack = lay->pack_to_orig;
    pp.count = lay->count;
    pp.prefix_pad = lay->prefix_pad;
    pp.c = lay->c;
    pp.R = R;
    pp.D = D;
    pp.qavg = b->qavg;
    pp.qmax = b->qmax;
    pp.kavg = b->kavg;
    pp.kmax = b->kmax;
    const int pool_threads = qvi_cdiv(2 * D, 32) * 32;
    QVC_DISPATCH_DTYPE(q->dtype, dr_launch_pool<DT_>(k->dtype, pp, R, BH, pool_threads, st));
    if ((s = qvc_launch_check("qvc_draft_route: pooling")) != QVA_OK) return s;

    /* b. draft map (Eq. 2) */
    dr_map_params mp;
    mp.qavg = b->qavg;
    mp.qmax = b->qmax;
    mp.kavg = b->kavg;
    mp.kmax = b->kmax;
    mp.R = R;
    mp.D = D;
    mp.sm = (double)qvi_sm_scale(cfg, D);
    mp.lam = (double)lambda;
    mp.A = b->A;
    if ((s = dr_launch_map(mp, BH, st)) != QVA_OK) return s;

    /* c.-d. the ranking and the lists */
    return mass ? dr_route_mass(b, &mpar, &sc, st) : dr_route_quota(b, quota, &sc, st);
}
