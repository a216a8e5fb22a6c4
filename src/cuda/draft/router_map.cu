/*
 * The draft map on the device (router.cu has the overview and the
 * numerics): region pooling of Q and K (DA2 Eq. 1, C.1) and the two-branch
 * softmax map (Eq. 2), for all B*H heads at once, bit for bit the CPU's.
 */
#include <cooperative_groups.h>

#include "draft/router.h"
#include "router_fp64.cuh"
#include "router_internal.cuh"

namespace cg = cooperative_groups;

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
    const int64_t o = ((int64_t)bh * p.R + r) * D + (which ? qvc_dr_kslot(ch, D) : ch);
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

/* Query rows of the FP64 query tile: whole n8 tiles of the mma. */
static __host__ __device__ constexpr int dr_map_qn(int rows) { return (rows + 7) & ~7; }

/* Channels of the tile: whole k16 steps of the mma (the pad is zeros on
 * both sides, products +0 that leave the chain's value alone). */
static __host__ __device__ __forceinline__ int dr_map_dp(int D) { return (D + 15) & ~15; }

/* Row stride of the query tile in doubles: 4 mod 16, so that the 16 lanes
 * of a half-warp, rows g in 0..3 and channels t in 0..3 of one fragment
 * register, fall on distinct bank pairs. */
static __host__ __device__ __forceinline__ int dr_map_qds(int D) { return dr_map_dp(D) + 4; }

/* Row stride of the logits: odd, so that the 2*rows lanes of the sum pass,
 * one row each at the same key, read distinct bank pairs. */
static __host__ __device__ __forceinline__ int dr_map_rs(int R) { return R | 1; }

/* Dynamic shared memory of one map CTA (one branch) for `rows` query
 * regions. */
static size_t dr_map_smem(int rows, int R, int D) {
    return (size_t)dr_map_qn(rows) * dr_map_qds(D) * sizeof(double) /* query tile */
           + (size_t)rows * dr_map_rs(R) * sizeof(double)         /* logits, then exps */
           + (size_t)2 * rows * sizeof(double);                   /* row sums, reciprocals */
}

/* Entries per lane in flight in the exp and mixture passes (-D for trials). */
#ifndef DR_MAP_EXP_ILP
#define DR_MAP_EXP_ILP 4
#endif

/* The f32 key values of one lane's A fragment for channels c0 .. c0+15:
 * keys k0 + g + 8 h (row offsets krow[h]), channels c0 + t + 4 j; channels
 * past D are 0 (DC: D at compile time, 64 or 128, or 0).  With DC the rows
 * are in qvc_dr_kslot order, so channels c0 + t + 4 j, j = 0..3, are the
 * 16-byte vector at c0 + 4 t: two loads a lane, not eight. */
template <int DC>
static __device__ __forceinline__ void dr_map_ld_keys(const float *kx, const int64_t (&krow)[2],
                                                      int c0, int t, int D, float (&f)[8]) {
    if constexpr (DC != 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float4 v = __ldg((const float4 *)(kx + krow[h] + c0 + 4 * t));
            f[h] = v.x, f[2 + h] = v.y, f[4 + h] = v.z, f[6 + h] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = c0 + t + 4 * j;
#pragma unroll
            for (int h = 0; h < 2; ++h) f[2 * j + h] = c < D ? __ldg(kx + krow[h] + c) : 0.0f;
        }
    }
}

/* One k16 step of an item: channels c0 .. c0+15 of the key tile against
 * every query tile; the keys' f32 values converted once. */
template <int NT>
static __device__ __forceinline__ void dr_map_step(const double *qg, int QDS, int c0,
                                                   const float (&f)[8], double (&acc)[NT][4]) {
    double a[8], b[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) b[n][j] = qg[n * 8 * QDS + c0 + 4 * j];
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = (double)f[i];
#pragma unroll
    for (int n = 0; n < NT; ++n) dr_dmma(acc[n], a, b[n]);
}

/*
 * Logits of one work item: all query rows of the CTA (NT n8 tiles) against
 * a tile of 16 keys, on the tensor cores, each a chain over the channels in
 * order (dr_dmma).  The keys are the mma's A operand, read from L2 into
 * registers (all at once for D = 64 or 128, else one k16 step ahead) and
 * converted once; the queries are its B operand, from the FP64 tile in
 * shared memory.
 */
template <int NT, int DC>
static __device__ __forceinline__ void dr_map_item(const double *qt, int QDS, const float *kx,
                                                   int k0, int R, int D, double (&acc)[NT][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t krow[2] = {(int64_t)min(k0 + g, R - 1) * D, (int64_t)min(k0 + g + 8, R - 1) * D};
    const double *qg = qt + g * QDS + t;
    if constexpr (DC != 0) {
        /* Every key value of the item requested at once: L2's latency,
         * not the mma, was what the k16 steps waited on. */
        float f[DC / 16][8];
#pragma unroll
        for (int s = 0; s < DC / 16; ++s) dr_map_ld_keys<DC>(kx, krow, 16 * s, t, D, f[s]);
#pragma unroll
        for (int s = 0; s < DC / 16; ++s) dr_map_step<NT>(qg, QDS, 16 * s, f[s], acc);
    } else {
        const int DP = dr_map_dp(D);
        float f[8];
        dr_map_ld_keys<0>(kx, krow, 0, t, D, f);
        for (int c0 = 0; c0 < DP; c0 += 16) {
            float fn[8];
            dr_map_ld_keys<0>(kx, krow, c0 + 16 < DP ? c0 + 16 : c0, t, D, fn); /* last: L1 hits */
            dr_map_step<NT>(qg, QDS, c0, f, acc);
#pragma unroll
            for (int i = 0; i < 8; ++i) f[i] = fn[i];
        }
    }
}

/*
 * qvi_draft_map for ROWS query regions a0 .. a0+ROWS-1 of one head, by a
 * cluster of two CTAs: rank 0 the average branch, rank 1 the max branch.
 * Each CTA's shared memory is half of what both branches would take, so
 * two CTAs share an SM.  That pays where R is large enough that one CTA
 * of both branches could hold only 8 rows (HunyuanVideo: 4% less time).
 * At Wan it changed nothing: occupancy rose, the issue rate hardly, and
 * the FP64/tensor pipe that both CTAs' mma and scalar FP64 use stayed the
 * busiest (ncu; NOTES).
 * Phases, separated by barriers:
 *   1. the branch's query descriptors, converted once to FP64 into shared
 *      memory as [row][channel] (rows and channels padded with zeros to
 *      whole mma tiles);
 *   2. work items (16 key regions) dealt round-robin to the warps: FP64
 *      mma (dr_map_item), logits x = dot * sm to shared memory, [row][key];
 *   3. a warp per row: the max over keys, exp(x - max) in place, the sum
 *      in the CPU's warp order and its reciprocal;
 *   4. (after a cluster barrier) a warp per row of the CTA's half of the
 *      rows: the two divisions (dr_div_rcp) with both CTAs' exps and sums
 *      read over distributed shared memory, the mixture, f32 stores.
 */
template <int ROWS>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(32 * DR_MAP_WARPS, DR_MAP_CTAS)
dr_map_kernel(dr_map_params p) {
    constexpr int QN = dr_map_qn(ROWS), NT = QN / 8, HALF = (ROWS + 1) / 2;
    extern __shared__ __align__(16) double dr_smem[];
    cg::cluster_group cl = cg::this_cluster();
    const int br = (int)cl.block_rank();
    const int R = p.R, D = p.D, RS = dr_map_rs(R), bh = blockIdx.y, a0 = (blockIdx.x >> 1) * ROWS;
    const int DP = dr_map_dp(D), QDS = dr_map_qds(D);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    double *qd = dr_smem;        /* [QN][QDS]  */
    double *x = qd + QN * QDS;   /* [ROWS][RS] */
    double *sum = x + ROWS * RS; /* [ROWS]     */
    double *rcp = sum + ROWS;    /* [ROWS]     */

    /* 1. Rows past R (and the pad rows) and the pad channels are zeros.
     * Every load of the thread is issued before the first store. */
    {
        constexpr int NTH = 32 * DR_MAP_WARPS;
        constexpr int PER = (QN * DR_MAX_D + NTH - 1) / NTH;
        const int total = QN * DP;
        const float *src = br ? p.qmax : p.qavg;
        float v[PER];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int i = threadIdx.x + j * NTH, c = i % DP, r = i / DP;
            v[j] = i < total && c < D && r < ROWS && a0 + r < R
                       ? __ldg(src + ((int64_t)bh * R + a0 + r) * D + c) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int i = threadIdx.x + j * NTH, c = i % DP, r = i / DP;
            if (i < total) qd[r * QDS + c] = (double)v[j];
        }
    }
    __syncthreads();

    /* 2. Keys past R load row R - 1 and are not stored. */
    {
        const int ntile = (R + 15) / 16, g = lane >> 2, t = lane & 3;
        const float *kx = (br ? p.kmax : p.kavg) + (int64_t)bh * R * D;
        for (int item = warp; item < ntile; item += DR_MAP_WARPS) {
            const int k0 = item * 16;
            double acc[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[n][e] = 0.0;
            if (D == 128) /* the video models' head dim: unrolled, no channel tests */
                dr_map_item<NT, 128>(qd, QDS, kx, k0, R, D, acc);
            else if (D == 64)
                dr_map_item<NT, 64>(qd, QDS, kx, k0, R, D, acc);
            else
                dr_map_item<NT, 0>(qd, QDS, kx, k0, R, D, acc);
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = n * 8 + 2 * t + (e & 1), b = k0 + g + 8 * (e >> 1);
                    if (r < ROWS && b < R) x[r * RS + b] = __dmul_rn(acc[n][e], p.sm);
                }
        }
    }
    __syncthreads();

    /* 3. A warp per row: the max over keys (order-free for numbers: a +-0
     * tie changes no difference), exp(x - max) in place, and the sum in
     * the CPU's warp order (qvi_draft_map): each lane adds its keys b =
     * lane mod 32 as it makes them, then the butterfly, so no lane runs a
     * chain over the whole row. */
    static_assert(QVI_DRAFT_SUM_LANES == 32, "the map's sums take a warp");
    for (int r = warp; r < ROWS; r += DR_MAP_WARPS) {
        if (a0 + r >= R) continue; /* warp-uniform */
        double *xr = x + r * RS;
        double m = -INFINITY;
        for (int b = lane; b < R; b += 32) m = xr[b] > m ? xr[b] : m;
        for (int o = 16; o > 0; o >>= 1) {
            const double t = __shfl_xor_sync(DR_FULL, m, o);
            m = t > m ? t : m;
        }
        /* DR_MAP_EXP_ILP independent exps per lane in flight: each is a
         * chain of FP64 latencies, and a warp per row is all there is. */
        double s = 0.0;
        for (int b0 = lane; b0 < R; b0 += 32 * DR_MAP_EXP_ILP) {
            double v[DR_MAP_EXP_ILP];
#pragma unroll
            for (int u = 0; u < DR_MAP_EXP_ILP; ++u) {
                const int b = b0 + 32 * u;
                v[u] = b < R ? __dsub_rn(xr[b], m) : 0.0;
            }
#pragma unroll
            for (int u = 0; u < DR_MAP_EXP_ILP; ++u) v[u] = exp(v[u]);
#pragma unroll
            for (int u = 0; u < DR_MAP_EXP_ILP; ++u)
                if (b0 + 32 * u < R) {
                    xr[b0 + 32 * u] = v[u];
                    s = __dadd_rn(s, v[u]);
                }
        }
        for (int o = 16; o > 0; o >>= 1) s = __dadd_rn(s, __shfl_xor_sync(DR_FULL, s, o));
        if (lane == 0) {
            sum[r] = s;
            rcp[r] = __drcp_rn(s);
        }
    }
    cl.sync(); /* both branches' exps and sums, visible to the cluster */

    /* 4. Mixture of the CTA's half of the rows, dealt to the warps as
     * (row, piece of keys): where the half has fewer rows than the CTA has
     * warps (8 query regions a CTA, as at HunyuanVideo, or fewer), each
     * row is cut into PIECES runs of whole ILP batches, so every warp
     * works.  Each entry is its own result, so the cut changes no bit. */
    {
        constexpr int PIECES = DR_MAP_WARPS > HALF ? DR_MAP_WARPS / HALF : 1;
        constexpr int BATCH = 32 * DR_MAP_EXP_ILP;
        const double *xa = cl.map_shared_rank(x, 0), *xm = cl.map_shared_rank(x, 1);
        const double *suma = cl.map_shared_rank(sum, 0), *summ = cl.map_shared_rank(sum, 1);
        const double *rcpa = cl.map_shared_rank(rcp, 0), *rcpm = cl.map_shared_rank(rcp, 1);
        const double oml = __dsub_rn(1.0, p.lam);
        const int rend = min(ROWS, (br + 1) * HALF);
        const int chunk = (R + PIECES * BATCH - 1) / (PIECES * BATCH) * BATCH;
        for (int unit = warp; unit < HALF * PIECES; unit += DR_MAP_WARPS) {
            const int r = br * HALF + unit / PIECES, bstart = (unit % PIECES) * chunk;
            if (r >= rend || a0 + r >= R) break; /* units ascend by row: warp-uniform */
            const int bend = min(R, bstart + chunk);
            const double *xar = xa + r * RS, *xmr = xm + r * RS;
            const double sa = suma[r], smx = summ[r], ya = rcpa[r], ym = rcpm[r];
            float *Arow = p.A + ((int64_t)bh * R + a0 + r) * R;
            const bool oka = dr_div_sum_ok(sa), okm = dr_div_sum_ok(smx);
            for (int b0 = bstart + lane; b0 < bend; b0 += BATCH) {
                double pa[DR_MAP_EXP_ILP], pm[DR_MAP_EXP_ILP], ea[DR_MAP_EXP_ILP],
                    em[DR_MAP_EXP_ILP];
#pragma unroll
                for (int u = 0; u < DR_MAP_EXP_ILP; ++u) {
                    const int b = min(b0 + 32 * u, R - 1); /* past R: recomputes R - 1 */
                    ea[u] = xar[b], em[u] = xmr[b];
                    pa[u] = dr_div_rcp(ea[u], sa, ya), pm[u] = dr_div_rcp(em[u], smx, ym);
                }
                bool exact = false; /* one branch for the lane's rare full divisions */
#pragma unroll
                for (int u = 0; u < DR_MAP_EXP_ILP; ++u)
                    exact |= dr_div_exact(ea[u], oka) | dr_div_exact(em[u], okm);
                if (exact) {
#pragma unroll
                    for (int u = 0; u < DR_MAP_EXP_ILP; ++u) {
                        if (dr_div_exact(ea[u], oka)) pa[u] = __ddiv_rn(ea[u], sa);
                        if (dr_div_exact(em[u], okm)) pm[u] = __ddiv_rn(em[u], smx);
                    }
                }
#pragma unroll
                for (int u = 0; u < DR_MAP_EXP_ILP; ++u)
                    if (b0 + 32 * u < bend)
                        Arow[b0 + 32 * u] = __double2float_rn(
                            __dadd_rn(__dmul_rn(oml, pa[u]), __dmul_rn(p.lam, pm[u])));
            }
        }
    }
    cl.sync(); /* the partner's reads of this CTA's shared memory are done */
}

template <int ROWS>
static qva_status dr_launch_map_rows(const dr_map_params &mp, int BH, size_t smem,
                                     cudaStream_t st) {
    const cudaError_t e = cudaFuncSetAttribute(
        dr_map_kernel<ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return qvc_cuda_fail(e, "qvc_draft_route: map shared memory");
    const dim3 grid(2u * (unsigned)qvi_cdiv(mp.R, ROWS), (unsigned)BH); /* x: (rows, branch) */
    dr_map_kernel<ROWS><<<grid, 32 * DR_MAP_WARPS, smem, st>>>(mp);
    return qvc_launch_check("qvc_draft_route: draft map");
}

/* Draft map launch: as many query regions per CTA (16, 8, 4, 2 or 1) as
 * leave room in an SM's shared memory for DR_MAP_CTAS CTAs (fewer rows
 * if even one would not fit).  More rows reuse each key descriptor read
 * from L2 more often; 16 rows at R = 609 take 93 KB, two CTAs an SM. */
static qva_status dr_launch_map(const dr_map_params &mp, int BH, cudaStream_t st) {
    int dev = 0, optin = 0, per_sm = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) !=
            cudaSuccess ||
        (e = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                    dev)) != cudaSuccess)
        return qvc_cuda_fail(e, "qvc_draft_route: device attributes");
    const size_t reserved = 1024; /* the system's shared memory of each CTA */
    int rows = DR_MAP_MAX_ROWS;
    while (rows > 1 &&
           DR_MAP_CTAS * (dr_map_smem(rows, mp.R, mp.D) + reserved) > (size_t)per_sm)
        rows >>= 1;
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

/* a. pooling (Eq. 1), in path order for any D and region capacity.  The
 * draft call itself pools beside its 16-bit pack instead (prep_qk.cu). */
static qva_status dr_pool(const qvc_view *q, const qvc_view *k, const qvc_draft_layout *lay,
                          const qvc_draft_route_buf *b, cudaStream_t st) {
    const int D = (int)q->D, R = lay->regions;
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
    QVC_DISPATCH_DTYPE(q->dtype, dr_launch_pool<DT_>(k->dtype, pp, R, b->BH, pool_threads, st));
    return qvc_launch_check("qvc_draft_route: pooling");
}

qva_status qvc_dr_pool_map(const qvc_view *q, const qvc_view *k, const qvc_draft_layout *lay,
                           const qvc_draft_route_buf *b, int pooled, double sm, double lam,
                           cudaStream_t st) {
    const int D = (int)q->D, R = lay->regions, BH = b->BH;
    qva_status s;
    if (!pooled && (s = dr_pool(q, k, lay, b, st)) != QVA_OK) return s;

    /* b. draft map (Eq. 2) */
    dr_map_params mp;
    mp.qavg = b->qavg;
    mp.qmax = b->qmax;
    mp.kavg = b->kavg;
    mp.kmax = b->kmax;
    mp.R = R;
    mp.D = D;
    mp.sm = sm;
    mp.lam = lam;
    mp.A = b->A;
    return dr_launch_map(mp, BH, st);
}
