/*
 * V's E4M3 codes with per-channel scales (v_mode 0: sage8, vc8 and their
 * V-Smooth steps) from 16-bit inputs that allow 16-byte loads: the common
 * case of v_encode_kernel (v.cu), whose codes it gives bit for bit (the
 * same float operations); qvc_prep_v8 chooses (qvc_v_plain_ok).
 *
 *   v_plain_kernel<DT,D>  one CTA of 256 threads per (128-key block, bh),
 *                         as qk_plain.cu: a lane holds 8 adjacent
 *                         channels, each thread loads all of its keys of
 *                         the block before the first is used, keeps them
 *                         packed, then subtracts the block mean (if
 *                         demeaned) and encodes into the shared-memory tile
 *                         that v_tile_write_t writes out transposed.
 *
 *   v_amax_plain_kernel<DT,D>  the same geometry: the per-block channel
 *                         amax of undemeaned V, the max kept packed.
 *
 * Why: v_encode_kernel's lane of 4 channels reloaded its scales and
 * reciprocals per 4 values and issued one load at a time; it ran at
 * 35-40% of DRAM bandwidth with 75-80% of the issue slots busy.
 */
#include <math.h>
#include <stdint.h>

#include "common/quant_code.cuh"
#include "prep_common.cuh"

#define VP_CPL PLAIN_CPL

/* One (128-key block, bh) of v_plain_kernel: the codes into tile, then
 * out transposed.  CG: the channel scales were written earlier in the same
 * kernel by another CTA (v_fused_kernel), so they are read through L2. */
template <int DT, int D, bool CG>
static __device__ __forceinline__ void v_plain_block(const v_plain_params &p, int blk, int bh,
                                                     uint8_t *tile) {
    using G = plain_geom<D>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = (lane % G::LPR) * VP_CPL;
    const int key0 = warp * G::RPW + lane / G::LPR; /* key of step 0 in the block */
    const int i0 = blk * QVI_BLOCK + key0;
    const int64_t base = qvc_head_base(p.v, bh);

    /* ---- producer: every key of the thread, in flight at once */
    uint4 raw[G::STEPS];
    plain_load_rows<D>(p.v, p.perm, bh, p.n, base, i0, c0, raw);

    /* the lane's channel scales, their reciprocals and the block's means */
    float cs[VP_CPL], rcp[VP_CPL], mu[VP_CPL];
    if (CG) /* both runs in flight before any use */
        plain_load8f_cg(p.chan + (int64_t)bh * D + c0, cs);
    else
        plain_load8f(p.chan + (int64_t)bh * D + c0, cs);
    if (p.bmu)
        plain_load8f(p.bmu + ((int64_t)bh * p.nblk + blk) * D + c0, mu);
    else
#pragma unroll
        for (int e = 0; e < VP_CPL; ++e) mu[e] = 0.0f;
    bool fast = true;
#pragma unroll
    for (int e = 0; e < VP_CPL; ++e) {
        rcp[e] = __frcp_rn(cs[e]);
        fast = fast && qvc_e4m3_fast_ok(cs[e], rcp[e]);
    }

    /* ---- codes into the tile, 8 bytes per lane and key (two stores: the
     * stride keeps 4-byte alignment only) */
#pragma unroll
    for (int s = 0; s < G::STEPS; ++s) {
        const int key = key0 + s * G::RPC;
        uint32_t lo = 0, hi = 0; /* padding keys: code 0 */
        if (blk * QVI_BLOCK + key < p.n) {
            float x[VP_CPL];
            qvc_widen8<DT>(raw[s], x);
            if (p.bmu) {
#pragma unroll
                for (int e = 0; e < VP_CPL; ++e) x[e] = __fsub_rn(x[e], mu[e]);
            }
            lo = qvc_e4m3_codes4(x, cs, rcp, fast);
            hi = qvc_e4m3_codes4(x + 4, cs + 4, rcp + 4, fast);
        }
        uint32_t *t = (uint32_t *)(tile + key * TILE_STRIDE + c0);
        t[0] = lo;
        t[1] = hi;
    }
    __syncthreads();

    /* ---- epilogue */
    v_tile_write_t<D>(tile, p.v_t + ((int64_t)bh * p.nblk + blk) * D * QVI_BLOCK);
    if (threadIdx.x == 0) p.v_blk[(int64_t)bh * p.nblk + blk] = 1.0f;
}

template <int DT, int D>
__global__ void __launch_bounds__(PREP_THREADS, 3)
v_plain_kernel(v_plain_params p) {
    __shared__ __align__(16) uint8_t tile[QVI_BLOCK * TILE_STRIDE];
    v_plain_block<DT, D, false>(p, blockIdx.x, blockIdx.y, tile);
}

/* The amax of one (block, bh), widened into a[] of the threads below
 * LPR (channels threadIdx.x * 8 ..); part: the CTA's [PREP_WARPS][LPR]
 * shared scratch. */
template <int DT, int D>
static __device__ __forceinline__ void v_amax_block(const qvc_view &v, const int32_t *perm, int n,
                                                    int blk, int bh, uint4 (*part)[plain_geom<D>::LPR],
                                                    float (&a)[VP_CPL]) {
    using G = plain_geom<D>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int key0 = warp * G::RPW + lane / G::LPR;

    uint4 raw[G::STEPS];
    plain_load_rows<D>(v, perm, bh, n, qvc_head_base(v, bh), blk * QVI_BLOCK + key0,
                       (lane % G::LPR) * VP_CPL, raw);
    uint4 m = make_uint4(0u, 0u, 0u, 0u); /* +0 in bf16 and f16 */
#pragma unroll
    for (int s = 0; s < G::STEPS; ++s) qvc_amax16<DT>(m, raw[s]);
    /* the warp's RPW rows of the same channels: lanes LPR apart */
#pragma unroll
    for (int o = G::LPR; o < 32; o <<= 1) {
        m.x = qvc_hmax2<DT>(m.x, __shfl_xor_sync(FULL_MASK, m.x, o));
        m.y = qvc_hmax2<DT>(m.y, __shfl_xor_sync(FULL_MASK, m.y, o));
        m.z = qvc_hmax2<DT>(m.z, __shfl_xor_sync(FULL_MASK, m.z, o));
        m.w = qvc_hmax2<DT>(m.w, __shfl_xor_sync(FULL_MASK, m.w, o));
    }
    if (lane < G::LPR) part[warp][lane] = m;
    __syncthreads();
    if (threadIdx.x >= G::LPR) return;
    for (int w = 1; w < PREP_WARPS; ++w) {
        const uint4 u = part[w][threadIdx.x];
        m.x = qvc_hmax2<DT>(m.x, u.x), m.y = qvc_hmax2<DT>(m.y, u.y);
        m.z = qvc_hmax2<DT>(m.z, u.z), m.w = qvc_hmax2<DT>(m.w, u.w);
    }
    qvc_widen8<DT>(m, a);
}

/*
 * v_stats_kernel's undemeaned case (v.cu: the per-block channel amax that
 * v_channel_scale reads) for the inputs v_plain_kernel takes.  Same
 * geometry as v_plain_kernel: a lane's 8 channels of every row it loads,
 * the max of |x| kept packed in the input's 16-bit format (qvc_amax16:
 * exact, NaN skipped as fmaxf skips it, padding rows +0), then across the
 * lanes and warps that hold the same channels, widened once at the end.
 */
template <int DT, int D>
__global__ void __launch_bounds__(PREP_THREADS)
v_amax_plain_kernel(qvc_view v, const int32_t *perm, int n, int nblk, float *bamax) {
    __shared__ __align__(16) uint4 part[PREP_WARPS][plain_geom<D>::LPR];
    float a[VP_CPL];
    v_amax_block<DT, D>(v, perm, n, blockIdx.x, blockIdx.y, part, a);
    if (threadIdx.x >= plain_geom<D>::LPR) return;
    float4 *dst = (float4 *)(bamax + ((int64_t)blockIdx.y * nblk + blockIdx.x) * D + threadIdx.x * VP_CPL);
    dst[0] = make_float4(a[0], a[1], a[2], a[3]);
    dst[1] = make_float4(a[4], a[5], a[6], a[7]);
}

void qvc_v_amax_plain_launch(const qvc_view &v, const int32_t *perm, int n, int nblk, int BH,
                             float *bamax, cudaStream_t st) {
    const dim3 grid((unsigned)nblk, (unsigned)BH);
    if (v.dtype == QVA_BF16) {
        if (v.D == 64) v_amax_plain_kernel<QVA_BF16, 64><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bamax);
        else v_amax_plain_kernel<QVA_BF16, 128><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bamax);
    } else {
        if (v.D == 64) v_amax_plain_kernel<QVA_F16, 64><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bamax);
        else v_amax_plain_kernel<QVA_F16, 128><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bamax);
    }
}

/*
 * The plain step's whole V chain (v_amax_plain_kernel, v_scale_kernel's
 * undemeaned case, v_plain_kernel) in one persistent kernel that walks
 * the heads in order, so that a head's rows, read from DRAM for its amax,
 * are read again for its codes while they are still in L2 (a head is
 * 19 MB at Wan; the three kernels read all of V twice from DRAM).
 *
 * Work items, taken in ticket order (one atomicAdd per item): S(h, b) the
 * amax of block b of head h, C(h, b) its codes.  Rounds: S(0, *); then
 * for h = 1 .. BH-1, S(h, *) interleaved with C(h-1, *); then C(BH-1, *).
 * An S item folds its block amax into the head's channel amax (atomicMax
 * on the float bits: the values are >= +0 and never NaN, so the integer
 * order is the float order, and a max is order-free); the last S item of a
 * head (a counter) turns them into the channel scales, v_channel_scale_of
 * exactly as v_scale_kernel, and releases the head's flag.  A C item
 * acquires that flag first.  Every S item of a head holds a smaller
 * ticket than any C item of it and never waits, so the waits end.
 */
template <int DT, int D>
__global__ void __launch_bounds__(PREP_THREADS, 3)
v_fused_kernel(v_plain_params p, qvc_v_fused_state f, int BH, float *chan, float *v_mu) {
    using G = plain_geom<D>;
    __shared__ __align__(16) uint8_t tile[QVI_BLOCK * TILE_STRIDE];
    __shared__ __align__(16) uint4 part[PREP_WARPS][G::LPR];
    __shared__ int item, last;
    const int nblk = p.nblk;
    const int total = 2 * BH * nblk;
    for (;;) {
        if (threadIdx.x == 0) item = (int)atomicAdd(f.ticket, 1u);
        __syncthreads();
        const int t = item;
        __syncthreads();
        if (t >= total) return;
        int h, b, stats;
        if (t < nblk) {
            h = 0, b = t, stats = 1;
        } else {
            const int u = t - nblk, r = 1 + u / (2 * nblk), j = u % (2 * nblk);
            if (r < BH) h = (j & 1) ? r - 1 : r, b = j >> 1, stats = !(j & 1);
            else h = BH - 1, b = j, stats = 0;
        }
        if (stats) {
            float a[VP_CPL];
            v_amax_block<DT, D>(p.v, p.perm, p.n, b, h, part, a);
            if (threadIdx.x < G::LPR) {
#pragma unroll
                for (int e = 0; e < VP_CPL; ++e)
                    atomicMax(f.amax + (int64_t)h * D + threadIdx.x * VP_CPL + e, __float_as_uint(a[e]));
                __threadfence();
            }
            __syncthreads();
            if (threadIdx.x == 0) last = atomicAdd(f.done + h, 1u) == (unsigned)nblk - 1;
            __syncthreads();
            if (last) {
                __threadfence();
                for (int c = threadIdx.x; c < D; c += PREP_THREADS)
                    chan[(int64_t)h * D + c] =
                        v_channel_scale_of(__uint_as_float(__ldcg(f.amax + (int64_t)h * D + c)), 0.0f);
                __threadfence();
                __syncthreads();
                if (threadIdx.x == 0) qvc_st_release(f.ready + h, 1u);
            }
        } else {
            if (threadIdx.x == 0)
                while (qvc_ld_acquire(f.ready + h) == 0u) __nanosleep(64);
            __syncthreads();
            v_plain_block<DT, D, true>(p, b, h, tile);
            if (v_mu) /* v_scale_kernel's undemeaned means: 0 */
                for (int c = threadIdx.x; c < D; c += PREP_THREADS)
                    v_mu[((int64_t)h * nblk + b) * D + c] = 0.0f;
        }
    }
}

template <int DT, int D>
static void launch_v_fused_d(const v_plain_params &p, const qvc_v_fused_state &f, int BH,
                             float *chan, float *v_mu, int ctas, cudaStream_t st) {
    const int total = 2 * BH * p.nblk;
    v_fused_kernel<DT, D><<<(unsigned)min(ctas, total), PREP_THREADS, 0, st>>>(p, f, BH, chan, v_mu);
}

template <int DT, int D>
static int v_fused_ctas(int sms) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v_fused_kernel<DT, D>, PREP_THREADS, 0) !=
            cudaSuccess || per_sm < 1)
        per_sm = 1;
    return per_sm * sms;
}

qva_status qvc_v_fused_plain_launch(const v_plain_params &p, const qvc_v_fused_state &f, int BH,
                                    float *chan, float *v_mu, cudaStream_t st) {
    int dev = 0, sms = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
        return qvc_cuda_fail(e, "qvc_prep: V (device attributes)");
    if ((long long)2 * BH * p.nblk > INT32_MAX)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep: V: %d heads of %d blocks", BH, p.nblk);
    if (p.v.dtype == QVA_BF16) {
        if (p.v.D == 64) launch_v_fused_d<QVA_BF16, 64>(p, f, BH, chan, v_mu, v_fused_ctas<QVA_BF16, 64>(sms), st);
        else launch_v_fused_d<QVA_BF16, 128>(p, f, BH, chan, v_mu, v_fused_ctas<QVA_BF16, 128>(sms), st);
    } else {
        if (p.v.D == 64) launch_v_fused_d<QVA_F16, 64>(p, f, BH, chan, v_mu, v_fused_ctas<QVA_F16, 64>(sms), st);
        else launch_v_fused_d<QVA_F16, 128>(p, f, BH, chan, v_mu, v_fused_ctas<QVA_F16, 128>(sms), st);
    }
    return qvc_launch_check("qvc_prep: V (fused)");
}

bool qvc_v_plain_ok(const qvc_view *v, int mode) {
    return mode == 0 && (v->D == 64 || v->D == 128) &&
           (v->dtype == QVA_BF16 || v->dtype == QVA_F16) && qvc_view_vec_ok(v, VP_CPL);
}

void qvc_v_plain_launch(const v_plain_params &p, int BH, cudaStream_t st) {
    const dim3 grid((unsigned)p.nblk, (unsigned)BH);
    if (p.v.dtype == QVA_BF16) {
        if (p.v.D == 64) v_plain_kernel<QVA_BF16, 64><<<grid, PREP_THREADS, 0, st>>>(p);
        else v_plain_kernel<QVA_BF16, 128><<<grid, PREP_THREADS, 0, st>>>(p);
    } else {
        if (p.v.D == 64) v_plain_kernel<QVA_F16, 64><<<grid, PREP_THREADS, 0, st>>>(p);
        else v_plain_kernel<QVA_F16, 128><<<grid, PREP_THREADS, 0, st>>>(p);
    }
}
