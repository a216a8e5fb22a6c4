/*
 * V's E4M3 codes with per-channel scales (v_mode 0: sage8, vc8 and their
 * V-Smooth steps) from 16-bit inputs that allow 16-byte loads: the common
 * case of v_encode_kernel (v.cu), whose codes it gives bit for bit (the
 * same float operations); qvc_prep_v8 chooses (qvc_v_plain_ok).
 *
 *   v_plain_kernel<DT,D,MEANS>  one CTA of 256 threads per (128-key block, bh),
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
 *   v_stats_plain_kernel<DT,D>  demeaned V's block means and residual
 *                         amax, from the block's rows in registers, the
 *                         means in the CPU's tree (tree_block_part).
 *
 *   v_plain_kernel<..., FUSED>  +vsample on a demeaning step: the block's
 *                         means (v_stats_plain_kernel's) from the rows it
 *                         holds, then its codes, so that V is read once.
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

/* INT8 codes of x[e] / s[e], e = 0..3 (+i8pv, qvi_v8_prepare's): the
 * IEEE quotient, rounded to nearest even, clamped to +-127, packed
 * little-endian as the E4M3 codes are. */
static __device__ __forceinline__ uint32_t v_int8_codes4(const float *x, const float *s) {
    uint32_t w = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float r = fminf(fmaxf(rintf(__fdiv_rn(x[e], s[e])), -127.0f), 127.0f);
        w |= ((uint32_t)(int)r & 0xffu) << (8 * e);
    }
    return w;
}

/* The block's channel amax from the thread's rows (raw), into bamax
 * [bh][blk][D]: the max of |x| kept packed in the input's 16-bit format
 * (qvc_amax16: exact, NaN skipped as fmaxf skips it, padding rows +0),
 * then across the lanes and warps that hold the same channels, widened
 * once at the end.  Every thread of the CTA calls it (its barrier). */
template <int DT, int D>
static __device__ __forceinline__ void v_block_amax(const uint4 (&raw)[plain_geom<D>::STEPS],
                                                    int bh, int blk, int nblk, float *bamax) {
    using G = plain_geom<D>;
    __shared__ __align__(16) uint4 part[PREP_WARPS][G::LPR];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
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
    float a[VP_CPL];
    qvc_widen8<DT>(m, a);
    float4 *dst = (float4 *)(bamax + ((int64_t)bh * nblk + blk) * D + threadIdx.x * VP_CPL);
    dst[0] = make_float4(a[0], a[1], a[2], a[3]);
    dst[1] = make_float4(a[4], a[5], a[6], a[7]);
}

/* The block's channel means for the FUSED instance, from the rows the
 * threads hold, in the CPU's tree (tree_block_part); the thread of channel
 * c writes the mean and the residual amax from the least and greatest
 * value (v_stats_plain_kernel's expressions, so its bits) and shares the
 * mean; mu = the lane's.  red may alias the code tile: its last reads
 * come before the second barrier. */
template <int DT, int D>
static __device__ __forceinline__ void v_fused_means(const uint4 (&raw)[plain_geom<D>::STEPS],
                                                     float *red, float *smu, int c0, int blk,
                                                     int bh, const v_plain_params &p,
                                                     float (&mu)[VP_CPL]) {
    tree_block_part<DT, D>(raw, p.n - blk * QVI_BLOCK, red);
    __syncthreads();
    const int c = threadIdx.x;
    if (c < D) {
        float lo, hi;
        const float len = (float)min(QVI_BLOCK, p.n - blk * QVI_BLOCK);
        const float m = __fdiv_rn(tree_block_finish<D>(red, c, &lo, &hi), len);
        const int64_t o = ((int64_t)bh * p.nblk + blk) * D + c;
        p.fused_mu[o] = m;
        p.bamax[o] = fmaxf(fmaxf(0.0f, fabsf(__fsub_rn(hi, m))), fabsf(__fsub_rn(lo, m)));
        smu[c] = m;
    }
    __syncthreads(); /* the tile is free for the codes, the means shared */
#pragma unroll
    for (int e = 0; e < VP_CPL; ++e) mu[e] = smu[c0 + e];
}

/* AMAX (+vprev's carried coding): also the block's channel amax into
 * p.bamax, from the rows already loaded.  FUSED (+vsample, demeaned): the
 * block means from those rows too (v_fused_means), p.only as +vprev's. */
template <int DT, int D, bool MEANS, bool V2, bool INT8 = false, bool AMAX = false,
          bool FUSED = false>
__global__ void __launch_bounds__(PREP_THREADS, (MEANS && !FUSED) || V2 ? 3 : 4) /* 4: more rows in flight */
v_plain_kernel(v_plain_params p) {
    static_assert(!INT8 || !V2, "INT8 V: one code");
    static_assert(!AMAX || !MEANS, "the amax of undemeaned V");
    static_assert(!FUSED || (MEANS && !V2 && !INT8), "fused means: one E4M3 code of the residual");
    using G = plain_geom<D>;
    /* FUSED: the means' tree first, the codes after */
    constexpr int TREE_BYTES = FUSED ? tree_geom<D>::FLOATS * 4 : 0;
    constexpr int TILE_BYTES = TREE_BYTES > QVI_BLOCK * TILE_STRIDE ? TREE_BYTES
                                                                    : QVI_BLOCK * TILE_STRIDE;
    __shared__ __align__(16) uint8_t tile[TILE_BYTES];
    __shared__ __align__(16) uint8_t tile_lo[V2 ? QVI_BLOCK * TILE_STRIDE : 16];
    __shared__ float smu[FUSED ? D : 1];
    const int blk = blockIdx.x, bh = blockIdx.y;
    if constexpr ((!MEANS || FUSED) && !V2 && !INT8) /* the others keep their SASS */
        if (p.only && p.only[bh] != p.only_value) return; /* the whole CTA */
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
    plain_load8f(p.chan + (int64_t)bh * D + c0, cs); /* both runs in flight before any use */
    if (FUSED)
        v_fused_means<DT, D>(raw, (float *)tile, smu, c0, blk, bh, p, mu);
    else if (MEANS)
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
        uint32_t lo2 = 0, hi2 = 0; /* the second digits (V2) */
        if (blk * QVI_BLOCK + key < p.n) {
            float x[VP_CPL];
            /* FUSED: not before the means' tree (ptxas hoisted these
             * register-only widenings above its barriers and spilled) */
            qvc_widen8<DT>(raw[s], x);
            if (MEANS) { /* residuals: no longer 16-bit values */
#pragma unroll
                for (int e = 0; e < VP_CPL; ++e) x[e] = __fsub_rn(x[e], mu[e]);
            }
            if (INT8) {
                lo = v_int8_codes4(x, cs);
                hi = v_int8_codes4(x + 4, cs + 4);
            } else if (V2) { /* the exact quotient for both digits */
                qvc_e4m3_digits4(x, cs, rcp, fast, &lo, &lo2);
                qvc_e4m3_digits4(x + 4, cs + 4, rcp + 4, fast, &hi, &hi2);
            } else if (MEANS) {
                lo = qvc_e4m3_codes4(x, cs, rcp, fast);
                hi = qvc_e4m3_codes4(x + 4, cs + 4, rcp + 4, fast);
            } else { /* the input's own values against their amax's scale */
                lo = qvc_e4m3_codes4_in16(x, cs, rcp, fast);
                hi = qvc_e4m3_codes4_in16(x + 4, cs + 4, rcp + 4, fast);
            }
        }
        uint32_t *t = (uint32_t *)(tile + key * TILE_STRIDE + c0);
        t[0] = lo;
        t[1] = hi;
        if (V2) {
            uint32_t *t2 = (uint32_t *)(tile_lo + key * TILE_STRIDE + c0);
            t2[0] = lo2;
            t2[1] = hi2;
        }
    }
    __syncthreads();

    /* ---- epilogue */
    const int64_t at = ((int64_t)bh * p.nblk + blk) * D * QVI_BLOCK;
    v_tile_write_t<D>(tile, p.v_t + at);
    if (V2) v_tile_write_t<D>(tile_lo, p.v_t_lo + at);
    if (threadIdx.x == 0) p.v_blk[(int64_t)bh * p.nblk + blk] = 1.0f;
    if constexpr (AMAX) v_block_amax<DT, D>(raw, bh, blk, p.nblk, p.bamax);
}

/*
 * v_stats_kernel's undemeaned case (v.cu: the per-block channel amax that
 * v_channel_scale reads) for the inputs v_plain_kernel takes.  Same
 * geometry as v_plain_kernel: a lane's 8 channels of every row it loads,
 * the max of |x| kept packed in the input's 16-bit format (qvc_amax16:
 * exact, NaN skipped as fmaxf skips it, padding rows +0), then across the
 * lanes and warps that hold the same channels, widened once at the end.
 * Why: v_stats_kernel's 4-channel lanes spent about 9 instructions a value
 * on the widening, the float max and each row's addressing (275 us at
 * Wan, 61% of DRAM peak, the longest chain of the dense preparation).
 */
/* skip (or NULL): heads whose amax comes from elsewhere (+vprev's carried
 * coding) are left out. */
template <int DT, int D>
__global__ void __launch_bounds__(PREP_THREADS)
v_amax_plain_kernel(qvc_view v, const int32_t *perm, int n, int nblk, float *bamax,
                    const int *skip) {
    using G = plain_geom<D>;
    const int blk = blockIdx.x, bh = blockIdx.y;
    if (skip && skip[bh]) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int key0 = warp * G::RPW + lane / G::LPR;
    uint4 raw[G::STEPS];
    plain_load_rows<D>(v, perm, bh, n, qvc_head_base(v, bh), blk * QVI_BLOCK + key0,
                       (lane % G::LPR) * VP_CPL, raw);
    v_block_amax<DT, D>(raw, bh, blk, nblk, bamax);
}

/*
 * v_stats_kernel's demeaned case (v.cu) for the inputs v_plain_kernel
 * takes: per channel of one 128-key block, the raw mean (qvi_block_mean's
 * tree, plain_block_sum) and the residual amax from the block's least and
 * greatest value (x -> fl(x - m) is monotone), the same expressions on the
 * same sums.  Why: v_stats_kernel's 4-channel lanes were the longest
 * kernel of the reuse and grouping steps' V chain (305 us at Wan beside
 * the other chains, against 226 us for the K mean's block sums read this
 * way).
 */
/* sampled (+vsample's demeaning step): CTA i takes block QVA_STAT_BLOCK(i,
 * nblk) and writes row i of [BH][QVA_STAT_BLOCKS(nblk)][D]. */
template <int DT, int D>
__global__ void __launch_bounds__(PREP_THREADS)
v_stats_plain_kernel(qvc_view v, const int32_t *perm, int n, int nblk, float *bmu, float *bamax,
                     int sampled) {
    __shared__ __align__(16) float red[tree_geom<D>::FLOATS];
    const int bh = blockIdx.y, c = threadIdx.x;
    const int blk = sampled ? (int)QVA_STAT_BLOCK(blockIdx.x, nblk) : (int)blockIdx.x;
    const int nout = sampled ? (int)QVA_STAT_BLOCKS(nblk) : nblk;
    float sum, mn, mx;
    if (!plain_block_sum<DT, D, true>(v, perm, bh, n, blk, red, &sum, &mn, &mx)) return;
    const float m = __fdiv_rn(sum, (float)min(QVI_BLOCK, n - blk * QVI_BLOCK));
    const int64_t o = ((int64_t)bh * nout + blockIdx.x) * D + c;
    bmu[o] = m;
    bamax[o] = fmaxf(fmaxf(0.0f, fabsf(__fsub_rn(mx, m))), fabsf(__fsub_rn(mn, m)));
}

void qvc_v_stats_plain_launch(const qvc_view &v, const int32_t *perm, int n, int nblk, int BH,
                              float *bmu, float *bamax, int sampled, cudaStream_t st) {
    const dim3 grid((unsigned)(sampled ? QVA_STAT_BLOCKS(nblk) : nblk), (unsigned)BH);
    const int sm = sampled;
    if (v.dtype == QVA_BF16) {
        if (v.D == 64) v_stats_plain_kernel<QVA_BF16, 64><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bmu, bamax, sm);
        else v_stats_plain_kernel<QVA_BF16, 128><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bmu, bamax, sm);
    } else {
        if (v.D == 64) v_stats_plain_kernel<QVA_F16, 64><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bmu, bamax, sm);
        else v_stats_plain_kernel<QVA_F16, 128><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bmu, bamax, sm);
    }
}

void qvc_v_amax_plain_launch(const qvc_view &v, const int32_t *perm, int n, int nblk, int BH,
                             float *bamax, const int *skip, cudaStream_t st) {
    const dim3 grid((unsigned)nblk, (unsigned)BH);
    if (v.dtype == QVA_BF16) {
        if (v.D == 64) v_amax_plain_kernel<QVA_BF16, 64><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bamax, skip);
        else v_amax_plain_kernel<QVA_BF16, 128><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bamax, skip);
    } else {
        if (v.D == 64) v_amax_plain_kernel<QVA_F16, 64><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bamax, skip);
        else v_amax_plain_kernel<QVA_F16, 128><<<grid, PREP_THREADS, 0, st>>>(v, perm, n, nblk, bamax, skip);
    }
}

bool qvc_v_plain_ok(const qvc_view *v, int mode) {
    return (mode == 0 || mode == 2) && (v->D == 64 || v->D == 128) &&
           (v->dtype == QVA_BF16 || v->dtype == QVA_F16) && qvc_view_vec_ok(v, VP_CPL);
}

template <int DT, int D>
static void launch_v_plain_d(const v_plain_params &p, dim3 grid, cudaStream_t st) {
    if (p.int8) { /* +i8pv: one code (qvc_prep checked) */
        if (p.bmu) v_plain_kernel<DT, D, true, false, true><<<grid, PREP_THREADS, 0, st>>>(p);
        else v_plain_kernel<DT, D, false, false, true><<<grid, PREP_THREADS, 0, st>>>(p);
    } else if (p.v_t_lo) {
        if (p.bmu) v_plain_kernel<DT, D, true, true><<<grid, PREP_THREADS, 0, st>>>(p);
        else v_plain_kernel<DT, D, false, true><<<grid, PREP_THREADS, 0, st>>>(p);
    } else if (p.fused_mu) {
        v_plain_kernel<DT, D, true, false, false, false, true><<<grid, PREP_THREADS, 0, st>>>(p);
    } else if (p.bmu) {
        v_plain_kernel<DT, D, true, false><<<grid, PREP_THREADS, 0, st>>>(p);
    } else if (p.bamax) {
        v_plain_kernel<DT, D, false, false, false, true><<<grid, PREP_THREADS, 0, st>>>(p);
    } else {
        v_plain_kernel<DT, D, false, false><<<grid, PREP_THREADS, 0, st>>>(p);
    }
}

void qvc_v_plain_launch(const v_plain_params &p, int BH, cudaStream_t st) {
    const dim3 grid((unsigned)p.nblk, (unsigned)BH);
    if (p.v.dtype == QVA_BF16) {
        if (p.v.D == 64) launch_v_plain_d<QVA_BF16, 64>(p, grid, st);
        else launch_v_plain_d<QVA_BF16, 128>(p, grid, st);
    } else {
        if (p.v.D == 64) launch_v_plain_d<QVA_F16, 64>(p, grid, st);
        else launch_v_plain_d<QVA_F16, 128>(p, grid, st);
    }
}
