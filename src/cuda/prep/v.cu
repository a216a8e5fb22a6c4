/*
 * V of the 8-bit methods: the E4M3 codes of V' = V[perm] (the residual
 * when block-demeaned), transposed per 128-key block in the PV slot order
 * (qvc_ops.v_t), with per-channel scales and FP16 means (v_mode 0:
 * sage/vc) or one scale per block (v_mode 1: fp8).  qvc_prep (prep8.cu)
 * runs it through qvc_prep_v8; qvc_prep4 (fp4.cu) reuses v_stats_kernel
 * through qvc_prep_v_stats.
 *
 *   v_stats_kernel<DT,D>    a lane = 4 channels of one block, 4 or 8
 *                           blocks per CTA: block mean (if demean),
 *                           residual amax.
 *   v_scale_kernel          32 channels x 8 block strides per CTA: per-channel
 *                           scale and the FP16-rounded mean / scale.
 *   v_encode_kernel<DT,D>   one CTA per (block, bh): E4M3 codes of the block
 *                           (a lane = 4 adjacent channels, as qk.cu) into
 *                           shared memory, written transposed [D][128] with
 *                           the PV slot order of qvc_pv_slot_key().
 * Per-channel scales from 16-bit inputs go to v_plain.cu instead.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/quant_code.cuh"
#include "prep_common.cuh"

/* block_demean + the per-block part of v_channel_scale: the raw block mean
 * (0 without demeaning) and the amax of the residual over the valid rows.
 * A lane holds 4 adjacent channels of one block (4 or 8 blocks per
 * 128-thread CTA).  Demeaned, one pass: the mean (block_tree4) and each
 * channel's min and max, then the residual amax from those two, since
 * x -> fl(x - m) is monotone and so |fl(x - m)| is largest at the least or
 * the greatest x (NaN skipped as fmaxf skips it, infinities and a NaN mean
 * as the row-by-row loop has them).  Else one pass for the amax. */
template <int DT, int D>
__global__ void __launch_bounds__(128)
v_stats_kernel(qvc_view v, const int32_t *perm, int n, int nblk, int demean, int vec,
               float *bmu, float *bamax) {
    using L = block_lanes<D>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, bh = blockIdx.y;
    const int blk = blockIdx.x * L::PER_CTA + warp * L::PER_WARP + lane / qk_geom<D>::LPR;
    if (blk >= nblk) return;
    const int c0 = (lane % qk_geom<D>::LPR) * QK_CPL, r0 = blk * QVI_BLOCK;
    const int len = min(QVI_BLOCK, n - r0);
    const int64_t base = qvc_head_base(v, bh);
    float m[QK_CPL] = {0.0f, 0.0f, 0.0f, 0.0f};
    float amax[QK_CPL] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (demean) {
        float s[QK_CPL], mn[QK_CPL], mx[QK_CPL];
        block_tree4<DT>(v, perm, bh, n, base, r0, c0, vec, s, mn, mx);
#pragma unroll
        for (int e = 0; e < QK_CPL; ++e) {
            m[e] = __fdiv_rn(s[e], (float)len);
            amax[e] = fmaxf(fmaxf(0.0f, fabsf(__fsub_rn(mx[e], m[e]))), fabsf(__fsub_rn(mn[e], m[e])));
        }
    } else {
        for (int i = 0; i < len; i += 8) { /* rows past r0 + len are past n: +0 */
            float x[8][QK_CPL];
            prep_load_rows4<DT, 8>(v, perm, bh, n, base, r0 + i, 1, c0, vec, x);
#pragma unroll
            for (int u = 0; u < 8; ++u)
#pragma unroll
                for (int e = 0; e < QK_CPL; ++e) amax[e] = fmaxf(amax[e], fabsf(x[u][e]));
        }
    }
    const int64_t o = ((int64_t)bh * nblk + blk) * D + c0;
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e) bmu[o + e] = m[e], bamax[o + e] = amax[e];
}

/* v_channel_scale, then mu_hat = fp16(mu / scale) (VC App. B), as floats
 * into v_mu and (v_mu_tile) as FP16 into the 8-bit kernel's restore tiles,
 * whose slots past the last block get +0, and at D 64 channels 64..127
 * too: the restore's n64 wgmma reads only channels 0..63 (the tile's
 * first 2 KB), but the producer copies whole tiles, which stay defined.
 * A CTA takes
 * VS_CH channels of one bh, VS_JL threads per channel striding over the
 * blocks (a thread per channel looping over all nblk blocks left the GPU
 * idle: 40 CTAs at Wan).  Maxima are order-independent, so this is the
 * sequential loop's result. */
#define VS_CH 32
#define VS_JL 8
/* given (+vsample's demeaning step, once decided): the scales are read
 * from it, not made, and only the means are written. */
__global__ void __launch_bounds__(VS_CH * VS_JL)
v_scale_kernel(int D, int nblk, int demean, float range, const float *bmu, const float *bamax,
               float *v_chan, float *v_mu, uint16_t *v_mu_tile, float *amax_out, float *mmax_out,
               const float *given) {
    __shared__ float red[2][VS_JL][VS_CH];
    __shared__ float scale[VS_CH];
    const int cl = threadIdx.x % VS_CH, jl = threadIdx.x / VS_CH, bh = blockIdx.y;
    const int c = blockIdx.x * VS_CH + cl;
    const int64_t o0 = (int64_t)bh * nblk * D + c;
    if (given) {
        if (jl == 0) scale[cl] = given[(int64_t)bh * D + c];
    } else {
        float amax = 0.0f, mmax = 0.0f;
        for (int j = jl; j < nblk; j += VS_JL) {
            amax = fmaxf(amax, bamax[o0 + (int64_t)j * D]);
            if (demean) mmax = fmaxf(mmax, fabsf(bmu[o0 + (int64_t)j * D]));
        }
        red[0][jl][cl] = amax;
        red[1][jl][cl] = mmax;
        __syncthreads();
        if (jl == 0) {
            for (int i = 1; i < VS_JL; ++i) {
                amax = fmaxf(amax, red[0][i][cl]);
                mmax = fmaxf(mmax, red[1][i][cl]);
            }
            float s = fmaxf(__fdiv_rn(amax, range), __fdiv_rn(mmax, 32768.0f));
            s = s > 0.0f ? s : 1.0f;
            v_chan[(int64_t)bh * D + c] = s;
            if (amax_out) amax_out[(int64_t)bh * D + c] = amax; /* +vprev's, +vsample's tests */
            if (mmax_out) mmax_out[(int64_t)bh * D + c] = mmax;
            scale[cl] = s;
        }
    }
    __syncthreads();
    const float s = scale[cl];
    if (!v_mu) return;
    const size_t head = qvc_mu_head_bytes(nblk);
    uint16_t *tile = v_mu_tile ? v_mu_tile + bh * (head / 2) : NULL;
    const int slots = (int)(head / QVC_MU_TILE_BYTES) * QVC_MU_BATCH;
    for (int j = jl; j < (tile ? slots : nblk); j += VS_JL) {
        const float m = demean && j < nblk ? round_f16(__fdiv_rn(bmu[o0 + (int64_t)j * D], s)) : 0.0f;
        if (j < nblk) v_mu[o0 + (int64_t)j * D] = m;
        if (!tile) continue;
        uint16_t *t = tile + (int64_t)(j / QVC_MU_BATCH) * (QVC_MU_TILE_BYTES / 2);
        t[qvc_mu_tile_at(c, j % QVC_MU_BATCH) / 2] = __half_as_ushort(__float2half_rn(m));
        if (D == 64) t[qvc_mu_tile_at(c + 64, j % QVC_MU_BATCH) / 2] = 0; /* never read */
    }
}

/* +vprev, one CTA of D threads per head (qvi_v8_prepare_carried): where
 * may_serve, the carried scales serve if the head's are valid and every
 * channel's amax / scale <= 448; v_chan receives the scales the codes use
 * (the carried ones, or own) and serve[bh] the decision (0: the head is
 * coded again with its own).  Then the own scales become the carried
 * ones, valid if all finite.  The barriers order every read of valid and
 * carried before thread 0's writes. */
__global__ void v_carry_kernel(int may_serve, const float *own, const float *amax, float *carried,
                               int *valid, float *v_chan, int *serve) {
    const int bh = blockIdx.x, c = threadIdx.x;
    const int64_t o = (int64_t)bh * blockDim.x + c;
    const float use = carried[o], mine = own[o];
    const int ok = may_serve && valid[bh] && use > 0.0f && isfinite(use) &&
                   __fdiv_rn(amax[o], use) <= 448.0f;
    const int all = __syncthreads_and(ok);
    if (may_serve) v_chan[o] = all ? use : mine;
    const int fin = __syncthreads_and(isfinite(mine));
    carried[o] = mine;
    if (c == 0) {
        if (serve) serve[bh] = all;
        valid[bh] = fin;
    }
}

typedef struct v_params {
    qvc_view v;
    const int32_t *perm;
    int n, nblk;
    int vec;             /* vector loads allowed (qvc_view_vec_ok)      */
    int mode;            /* 0: per-channel (sage/vc); 1: per-block (fp8) */
    int demean;          /* mode 0 */
    const float *bmu;    /* mode 0 with demean: [BH][nblk][D] raw means */
    const float *chan;   /* mode 0: [BH][D] scales                      */
    uint8_t *v_t;        /* [BH][nblk][D][128]                          */
    float *v_blk;        /* [BH][nblk]                                  */
    float *v_chan;       /* [BH][D]: mode 1 writes 1                    */
    uint8_t *v_t_lo;     /* mode 0: V's second digit, or NULL           */
} v_params;

template <int DT, int D, bool V2>
__global__ void __launch_bounds__(PREP_THREADS)
v_encode_kernel(v_params p) {
    using G = qk_geom<D>;
    __shared__ __align__(16) uint8_t tile[QVI_BLOCK * TILE_STRIDE];
    __shared__ __align__(16) uint8_t tile_lo[V2 ? QVI_BLOCK * TILE_STRIDE : 16];
    __shared__ float red[PREP_WARPS];
    const int blk = blockIdx.x, bh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = (lane % G::LPR) * QK_CPL, key0 = warp * ROWS_PER_WARP + lane / G::LPR;
    const int64_t base = qvc_head_base(p.v, bh);

    float bscale = 1.0f;
    bool bounded = true; /* bscale bounds the block's values (not where an infinite amax made it 1) */
    if (p.mode == 1) { /* qvi_quant_e4m3_blocks: amax over the block (pads are 0) */
        float amax = 0.0f;
#pragma unroll 4
        for (int s = 0; s < G::STEPS; ++s) {
            const int i = blk * QVI_BLOCK + key0 + s * G::RPS;
            if (i < p.n) {
                float x[QK_CPL];
                prep_load4<DT>(p.v.data, base + src_row(p.perm, bh, p.n, i) * p.v.sn + c0, p.vec, x);
#pragma unroll
                for (int e = 0; e < QK_CPL; ++e) amax = fmaxf(amax, fabsf(x[e]));
            }
        }
        amax = block_max(amax, red);
        bscale = __fdiv_rn(amax, 448.0f);
        if (!(bscale > 0.0f) || !isfinite(bscale)) bscale = 1.0f;
        bounded = isfinite(amax);
    }

    /* the divisor of each of the lane's channels (its channel scale, or
     * the block's) and its reciprocal, for qvc_e4m3_codes4 */
    float mu[QK_CPL], cs[QK_CPL], rcp[QK_CPL];
    bool fast = bounded;
#pragma unroll
    for (int e = 0; e < QK_CPL; ++e) {
        const int c = c0 + e;
        mu[e] = p.mode == 0 && p.demean ? p.bmu[((int64_t)bh * p.nblk + blk) * D + c] : 0.0f;
        cs[e] = p.mode == 0 ? p.chan[(int64_t)bh * D + c] : bscale;
        rcp[e] = __frcp_rn(cs[e]);
        fast = fast && qvc_e4m3_fast_ok(cs[e], rcp[e]);
    }
    /* Codes of the warp's 16 keys into the tile, 4 bytes per lane
     * (re-reading the rows the amax pass touched: L2 hits). */
#pragma unroll 4
    for (int s = 0; s < G::STEPS; ++s) {
        const int key = key0 + s * G::RPS, i = blk * QVI_BLOCK + key;
        uint32_t word = 0, word2 = 0; /* padding keys: code 0 */
        if (i < p.n) {
            float x[QK_CPL];
            prep_load4<DT>(p.v.data, base + src_row(p.perm, bh, p.n, i) * p.v.sn + c0, p.vec, x);
            if (p.mode == 0 && p.demean) {
#pragma unroll
                for (int e = 0; e < QK_CPL; ++e) x[e] = __fsub_rn(x[e], mu[e]);
            }
            if (V2) qvc_e4m3_digits4(x, cs, rcp, fast, &word, &word2);
            else word = qvc_e4m3_codes4(x, cs, rcp, fast);
        }
        *(uint32_t *)(tile + key * TILE_STRIDE + c0) = word;
        if (V2) *(uint32_t *)(tile_lo + key * TILE_STRIDE + c0) = word2;
    }
    __syncthreads();

    const int64_t at = ((int64_t)bh * p.nblk + blk) * D * QVI_BLOCK;
    v_tile_write_t<D>(tile, p.v_t + at);
    if (V2) v_tile_write_t<D>(tile_lo, p.v_t_lo + at);

    if (threadIdx.x == 0) p.v_blk[(int64_t)bh * p.nblk + blk] = bscale;
    if (p.mode == 1 && blk == 0)
        for (int c = threadIdx.x; c < D; c += PREP_THREADS) p.v_chan[(int64_t)bh * D + c] = 1.0f;
}

template <int DT, int D>
static void launch_v_stats(const qvc_view &v, const int32_t *perm, int nk, int nblk, int BH,
                           int demean, float *bmu, float *bamax, cudaStream_t st) {
    const dim3 grid((unsigned)qvi_cdiv(nblk, block_lanes<D>::PER_CTA), (unsigned)BH);
    v_stats_kernel<DT, D><<<grid, 128, 0, st>>>(v, perm, nk, nblk, demean, qvc_view_vec_ok(&v, QK_CPL), bmu,
                                                bamax);
}

qva_status qvc_prep_v_stats(const qvc_view *v, const int32_t *perm, int nk, int nblk, int BH,
                            int demean, float *bmu, float *bamax, cudaStream_t st,
                            const char *what) {
    if (v->D == 64)
        QVC_DISPATCH_DTYPE(v->dtype, (launch_v_stats<DT_, 64>(*v, perm, nk, nblk, BH, demean, bmu,
                                                              bamax, st)));
    else if (v->D == 128)
        QVC_DISPATCH_DTYPE(v->dtype, (launch_v_stats<DT_, 128>(*v, perm, nk, nblk, BH, demean, bmu,
                                                               bamax, st)));
    else
        return qvi_fail(QVA_ERR_UNSUPPORTED, "%s: head dim %d (64 or 128)", what, (int)v->D);
    return qvc_launch_check(what);
}

/* +vsample on a demeaning step, one CTA of D threads per head
 * (qvi_v8_prepare_carried's sample_blocks): the sampled blocks' scales
 * `use` serve if every channel's residual amax / scale <= 448 and every
 * |mean| / scale <= 32768; v_chan receives the scales the codes use and
 * serve[bh] the decision (0: coded again with the own). */
__global__ void v_sample_decide_kernel(const float *use, const float *own, const float *amax,
                                       const float *mmax, float *v_chan, int *serve) {
    const int bh = blockIdx.x, c = threadIdx.x;
    const int64_t o = (int64_t)bh * blockDim.x + c;
    const float u = use[o];
    const int ok = isfinite(u) && __fdiv_rn(amax[o], u) <= 448.0f && __fdiv_rn(mmax[o], u) <= 32768.0f;
    const int all = __syncthreads_and(ok);
    v_chan[o] = all ? u : own[o];
    if (c == 0) serve[bh] = all;
}

/* The scratch v_prep_sampled_blocks needs, in floats. */
size_t qvc_v_sampled_blocks_floats(int BH, int D) {
    return (size_t)BH * (4 * (size_t)D + 2 * (size_t)(QVA_STAT_SAMPLE / QVI_BLOCK) * D + 1);
}

/* +vsample on a demeaning step (one E4M3 digit, v_plain.cu's inputs): the
 * sampled blocks' means and residual amax, their scales; V coded once with
 * them, each block taking its own means on the way (FUSED); the own scales
 * and the head's amax from those means; the decision; the FP16 means /
 * scale; the heads it refused coded again with their own. */
static qva_status v_prep_sampled_blocks(const qvc_view *v, const qvc_prep_args *a, float *bmu,
                                        float *bamax, qvc_ops *ops, float *scratch,
                                        cudaStream_t st) {
    const int D = ops->D, BH = ops->BH, nk = ops->nk, nblk = ops->nblk;
    const size_t hd = (size_t)BH * D, sd = (size_t)BH * (QVA_STAT_SAMPLE / QVI_BLOCK) * D;
    float *use = scratch, *own = use + hd, *amax = own + hd, *mmax = amax + hd;
    float *smu = mmax + hd, *samax = smu + sd;
    int *serve = (int *)(samax + sd);
    const dim3 sg((unsigned)(D / VS_CH), (unsigned)BH);
    qvc_v_stats_plain_launch(*v, a->perm, nk, nblk, BH, smu, samax, 1, st);
    v_scale_kernel<<<sg, VS_CH * VS_JL, 0, st>>>(D, (int)QVA_STAT_BLOCKS(nblk), 1, QVI_V_E4M3_RANGE,
                                                 smu, samax, use, NULL, NULL, NULL, NULL, NULL);
    qva_status s = qvc_launch_check("qvc_prep: V sampled blocks (+vsample)");
    if (s != QVA_OK) return s;
    v_plain_params pp = {*v, a->perm, nk, nblk, NULL, use, ops->v_t, ops->v_blk,
                         NULL, 0, NULL, 0, bamax, bmu};
    qvc_v_plain_launch(pp, BH, st);
    if ((s = qvc_launch_check("qvc_prep: V encode (+vsample, demeaned)")) != QVA_OK) return s;
    v_scale_kernel<<<sg, VS_CH * VS_JL, 0, st>>>(D, nblk, 1, QVI_V_E4M3_RANGE, bmu, bamax, own,
                                                 NULL, NULL, amax, mmax, NULL);
    v_sample_decide_kernel<<<BH, D, 0, st>>>(use, own, amax, mmax, ops->v_chan, serve);
    v_scale_kernel<<<sg, VS_CH * VS_JL, 0, st>>>(D, nblk, 1, QVI_V_E4M3_RANGE, bmu, NULL, NULL,
                                                 ops->v_mu, ops->v_mu_tile, NULL, NULL, ops->v_chan);
    if ((s = qvc_launch_check("qvc_prep: V scales (+vsample, demeaned)")) != QVA_OK) return s;
    pp.chan = ops->v_chan, pp.only = serve, pp.only_value = 0;
    qvc_v_plain_launch(pp, BH, st);
    return qvc_launch_check("qvc_prep: V encode (+vsample, demeaned, own)");
}

/* +vprev's plain step (undemeaned E4M3 V through v_plain.cu): the amax of
 * the heads without carried scales; the carried heads coded with their
 * carried scales, their amax made on the way; the own scales and amax;
 * the decision (v_carry_kernel); the heads it refused coded again with
 * their own.  scratch: own [BH][D], amax [BH][D], serve [BH]. */
static qva_status v_prep_carried(const qvc_view *v, const qvc_prep_args *a, float *bamax,
                                 qvc_ops *ops, float *scratch, cudaStream_t st) {
    const int D = ops->D, BH = ops->BH, nk = ops->nk, nblk = ops->nblk;
    float *own = scratch, *amax = scratch + (size_t)BH * D;
    int *serve = (int *)(scratch + 2 * (size_t)BH * D);
    qvc_v_amax_plain_launch(*v, a->perm, nk, nblk, BH, bamax, a->vprev_valid, st);
    qva_status s = qvc_launch_check("qvc_prep: V amax (+vprev)");
    if (s != QVA_OK) return s;
    v_plain_params pp = {*v, a->perm, nk, nblk, NULL, a->vprev_scale, ops->v_t, ops->v_blk,
                         NULL, 0, a->vprev_valid, 1, bamax, NULL};
    qvc_v_plain_launch(pp, BH, st);
    if ((s = qvc_launch_check("qvc_prep: V encode (+vprev, carried)")) != QVA_OK) return s;
    v_scale_kernel<<<dim3((unsigned)(D / VS_CH), (unsigned)BH), VS_CH * VS_JL, 0, st>>>(
        D, nblk, 0, QVI_V_E4M3_RANGE, NULL, bamax, own, NULL, NULL, amax, NULL, NULL);
    if ((s = qvc_launch_check("qvc_prep: V scale (+vprev)")) != QVA_OK) return s;
    v_carry_kernel<<<BH, D, 0, st>>>(1, own, amax, a->vprev_scale, a->vprev_valid, ops->v_chan,
                                     serve);
    if ((s = qvc_launch_check("qvc_prep: V scales carried")) != QVA_OK) return s;
    pp.chan = ops->v_chan, pp.only = serve, pp.only_value = 0, pp.bamax = NULL;
    qvc_v_plain_launch(pp, BH, st);
    return qvc_launch_check("qvc_prep: V encode (+vprev, own)");
}

qva_status qvc_prep_v8(const qvc_view *v, const qvc_prep_args *a, int demean, float *bmu,
                       float *bamax, qvc_ops *ops, float *vprev_scratch, cudaStream_t st) {
    const int D = ops->D, BH = ops->BH, nk = ops->nk, nblk = ops->nblk;
    qva_status s = QVA_OK;
    if (a->vprev_scale && !demean && a->v_mode == 0 && !ops->v_t_lo && qvc_v_plain_ok(v, 0))
        return v_prep_carried(v, a, bamax, ops, vprev_scratch, st);
    if (a->v_sample && demean) /* qvc_prep checked the mode and the inputs */
        return v_prep_sampled_blocks(v, a, bmu, bamax, ops, vprev_scratch, st);

    /* V' = V[perm]. */
    v_params vp;
    memset(&vp, 0, sizeof vp);
    vp.v = *v;
    vp.perm = a->perm;
    vp.n = nk;
    vp.nblk = nblk;
    vp.mode = a->v_mode;
    vp.demean = demean;
    vp.bmu = bmu;
    vp.chan = ops->v_chan;
    vp.v_t = ops->v_t;
    vp.v_blk = ops->v_blk;
    vp.v_chan = ops->v_chan;
    vp.v_t_lo = a->v_mode == 0 ? ops->v_t_lo : NULL;
    if (a->v_mode != 1) { /* per-channel scales: E4M3 (0) or INT8 (2) */
        if (!demean && qvc_v_plain_ok(v, 0)) {
            qvc_v_amax_plain_launch(*v, a->perm, nk, nblk, BH, bamax, NULL, st);
            s = qvc_launch_check("qvc_prep: V amax");
        } else if (qvc_v_plain_ok(v, 0)) {
            qvc_v_stats_plain_launch(*v, a->perm, nk, nblk, BH, bmu, bamax, 0, st);
            s = qvc_launch_check("qvc_prep: V stats");
        } else {
            s = qvc_prep_v_stats(v, a->perm, nk, nblk, BH, demean, bmu, bamax, st, "qvc_prep: V stats");
        }
        if (s == QVA_OK) {
            v_scale_kernel<<<dim3((unsigned)(D / VS_CH), (unsigned)BH), VS_CH * VS_JL, 0, st>>>(
                D, nblk, demean, a->v_mode == 2 ? 127.0f : QVI_V_E4M3_RANGE, bmu, bamax,
                ops->v_chan, ops->v_mu, ops->v_mu_tile, NULL, NULL, NULL);
            s = qvc_launch_check("qvc_prep: V scale");
        }
        if (s == QVA_OK && a->vprev_scale) { /* a demeaning step: its own scales, kept */
            v_carry_kernel<<<BH, D, 0, st>>>(0, ops->v_chan, NULL, a->vprev_scale, a->vprev_valid,
                                             NULL, NULL);
            s = qvc_launch_check("qvc_prep: V scales kept");
        }
    } else if (ops->v_mu) { /* fp8 has no means: keep them 0 */
        cudaError_t e = cudaMemsetAsync(ops->v_mu, 0, (size_t)BH * nblk * D * sizeof(float), st);
        if (e == cudaSuccess && ops->v_mu_tile)
            e = cudaMemsetAsync(ops->v_mu_tile, 0, (size_t)BH * qvc_mu_head_bytes(nblk), st);
        if (e != cudaSuccess) s = qvc_cuda_fail(e, "qvc_prep: cudaMemsetAsync");
    }
    if (s == QVA_OK && qvc_v_plain_ok(v, a->v_mode)) {
        const v_plain_params pp = {*v, a->perm, nk, nblk, demean ? bmu : NULL, ops->v_chan,
                                   ops->v_t, ops->v_blk, ops->v_t_lo, a->v_mode == 2,
                                   NULL, 0, NULL, NULL};
        qvc_v_plain_launch(pp, BH, st);
        return qvc_launch_check("qvc_prep: V encode");
    }
    if (s == QVA_OK) {
        vp.vec = qvc_view_vec_ok(v, QK_CPL);
        const dim3 grid((unsigned)nblk, (unsigned)BH);
        if (D == 64 && vp.v_t_lo)
            QVC_DISPATCH_DTYPE(v->dtype, (v_encode_kernel<DT_, 64, true><<<grid, PREP_THREADS, 0, st>>>(vp)));
        else if (D == 64)
            QVC_DISPATCH_DTYPE(v->dtype, (v_encode_kernel<DT_, 64, false><<<grid, PREP_THREADS, 0, st>>>(vp)));
        else if (D == 128 && vp.v_t_lo)
            QVC_DISPATCH_DTYPE(v->dtype, (v_encode_kernel<DT_, 128, true><<<grid, PREP_THREADS, 0, st>>>(vp)));
        else if (D == 128)
            QVC_DISPATCH_DTYPE(v->dtype, (v_encode_kernel<DT_, 128, false><<<grid, PREP_THREADS, 0, st>>>(vp)));
        else
            s = qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep: V encode: head dim %d (64 or 128)", D);
        if (s == QVA_OK) s = qvc_launch_check("qvc_prep: V encode");
    }
    return s;
}
