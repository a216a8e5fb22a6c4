/*
 * The draft map on the device (router.cu has the overview and the
 * numerics): region pooling of Q and K (DA2 Eq. 1, C.1) and the two-branch
 * softmax map (Eq. 2), for all B*H heads at once, bit for bit the CPU's.
 */
#include "router_internal.cuh"

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
    if (vec)
        qvc_ld8<QVA_F32, true>(p, 0, f);
    else
        qvc_ld8<QVA_F32, false>(p, 0, f);
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

    /* 1. Rows past R (and the pad row when ROWS is odd) are zeros.  Every
     * load of the thread is issued before the first store. */
    {
        constexpr int NT = 32 * DR_MAP_WARPS, PER = (2 * QS * DR_MAX_D + NT - 1) / NT;
        float v[PER];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int i = threadIdx.x + j * NT, c = i % D, t = i / D, r = t % QS, br = t / QS;
            const float *src = br ? p.qmax : p.qavg;
            v[j] = i < 2 * QS * D && r < ROWS && a0 + r < R
                       ? __ldg(src + ((int64_t)bh * R + a0 + r) * D + c) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int i = threadIdx.x + j * NT, c = i % D, t = i / D, r = t % QS, br = t / QS;
            if (i < 2 * QS * D) qd[(br * D + c) * QS + r] = (double)v[j];
        }
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

/* a. pooling (Eq. 1), in path order for any D and region capacity.  The
 * draft call itself pools beside its 16-bit pack instead (prep.cu). */
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
