/*
 * Host side of the 8-bit preparation: qvc_ops_alloc / qvc_ops_free and
 * qvc_prep (cuda_internal.h), which runs Q and K through qk.cu, the K
 * channel mean through kmean.cu and V through v.cu; and what qvc_prep4
 * (fp4.cu) shares with it: the checks of the views and arguments, and K
 * smoothing (the channel mean and the LSE shift it causes).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/device_util.cuh"
#include "prep_internal.h"

/* ------------------------------------------------------------ K smoothing */

/* smooth_k() of the CPU: lse_shift[bh][i] = (float)(dot * sm_scale) with
 * dot the FP64 sum, in channel order, of q_i[c] * mean[c] (each product of
 * two floats is exact in FP64, so the rounding is the CPU's), q_i the
 * loaded (unrotated) query row and mean the K' channel mean. */
template <int DT>
__global__ void lse_shift_kernel(qvc_view q, const float *kmean, float sm_scale, float *out) {
    const int bh = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x, D = (int)q.D;
    if (i >= q.N) return;
    const int64_t row = qvc_head_base(q, bh) + (int64_t)i * q.sn;
    const float *mean = kmean + (int64_t)bh * D;
    double dot = 0.0;
    for (int c = 0; c < D; ++c)
        dot = __dadd_rn(dot, __dmul_rn((double)qvc_ld<DT>(q.data, row + c), (double)mean[c]));
    out[(int64_t)bh * q.N + i] = __double2float_rn(__dmul_rn(dot, (double)sm_scale));
}

static qva_status launch_lse_shift(const qvc_view *q, const float *kmean, float sm_scale,
                                   float *out, int BH, cudaStream_t st) {
    dim3 grid((unsigned)qvi_cdiv((int)q->N, 128), (unsigned)BH);
    QVC_DISPATCH_DTYPE(q->dtype, (lse_shift_kernel<DT_><<<grid, 128, 0, st>>>(*q, kmean, sm_scale, out)));
    return qvc_launch_check("qvc_prep: LSE shift");
}

qva_status qvc_prep_ksmooth(const qvc_view *q, const qvc_view *k, const qvc_prep_args *a, int nk,
                            int BH, float *kmean, qvc_block_ext kext, void *kpart,
                            cudaStream_t st) {
    qva_status s = QVA_OK;
    if (kmean)
        s = a->k_sample ? qvc_stat_sample(k, BH, k->N, NULL, 1, kpart, kmean, NULL, st)
                        : qvc_kmean(k, a->perm, nk, BH, kmean, kext, a->kprev_mean, a->kprev_valid,
                                    st);
    if (s == QVA_OK && a->lse_shift)
        s = launch_lse_shift(q, kmean, a->sm_scale, a->lse_shift, BH, st);
    return s;
}

/* ------------------------------------------------------------ host side */

extern "C" qva_status qvc_ops_alloc(qvc_ops *ops, int BH, int nq, int nk,
                                    int D, int with_mu, int with_v_lo) {
    if (!ops) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_ops_alloc: ops is NULL");
    memset(ops, 0, sizeof *ops);
    if (BH < 1 || nq < 1 || nk < 1 || D < 1 || D > MAX_D)
        return qvi_fail(QVA_ERR_SHAPE, "qvc_ops_alloc: bad shape BH=%d nq=%d nk=%d D=%d",
                        BH, nq, nk, D);
    ops->BH = BH;
    ops->nq = nq;
    ops->nk = nk;
    ops->D = D;
    ops->nq_pad = qvi_cdiv(nq, QVI_BLOCK) * QVI_BLOCK;
    ops->nk_pad = qvi_cdiv(nk, QVI_BLOCK) * QVI_BLOCK;
    ops->nblk = ops->nk_pad / QVI_BLOCK;
    const size_t bh = (size_t)BH, d = (size_t)D, nkb = (size_t)ops->nblk;
    const qvc_alloc req[] = {
        {(void **)&ops->q_i8, bh * (size_t)ops->nq_pad * d},
        {(void **)&ops->q_scale, bh * (size_t)ops->nq_pad * sizeof(float)}, /* per row at most */
        {(void **)&ops->k_i8, bh * (size_t)ops->nk_pad * d},
        {(void **)&ops->k_scale, bh * nkb * sizeof(float)},
        {(void **)&ops->v_t, bh * nkb * d * QVI_BLOCK},
        {(void **)&ops->v_t_lo, with_v_lo ? bh * nkb * d * QVI_BLOCK : 0},
        {(void **)&ops->v_chan, bh * d * sizeof(float)},
        {(void **)&ops->v_blk, bh * nkb * sizeof(float)},
        {(void **)&ops->v_mu, with_mu ? bh * nkb * d * sizeof(float) : 0},
        {(void **)&ops->v_mu_tile,
         with_mu && (D == 64 || D == 128) ? bh * qvc_mu_head_bytes(ops->nblk) : 0},
    };
    qva_status st = qvc_malloc_all(req, sizeof req / sizeof req[0], "qvc_ops_alloc: cudaMalloc");
    if (st != QVA_OK) qvc_ops_free(ops);
    return st;
}

extern "C" void qvc_ops_free(qvc_ops *ops) {
    if (!ops) return;
    void *ptrs[] = {ops->q_i8, ops->q_scale, ops->k_i8, ops->k_scale,
                    ops->v_t, ops->v_t_lo, ops->v_chan, ops->v_blk, ops->v_mu, ops->v_mu_tile};
    qvc_free_all(ptrs, sizeof ptrs / sizeof ptrs[0]);
    memset(ops, 0, sizeof *ops);
}

qva_status qvc_prep_check_views(const char *who, const qvc_view *q, const qvc_view *k,
                                const qvc_view *v, const qvc_prep_args *a, int BH, int nq,
                                int nk, int D) {
    qva_status s;
    if ((s = qvc_check_view(who, q, "q")) || (s = qvc_check_view(who, k, "k")) ||
        (s = qvc_check_view(who, v, "v")))
        return s;
    if (!a) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "%s: NULL args", who);
    if (q->B * q->H != BH || k->B != q->B || k->H != q->H || v->B != q->B || v->H != q->H ||
        q->D != D || k->D != D || v->D != D || q->N != nq || k->N != nk || v->N != nk)
        return qvi_fail(QVA_ERR_SHAPE, "%s: views do not match ops (BH=%d nq=%d nk=%d D=%d)", who,
                        BH, nq, nk, D);
    if (BH > 65535) return qvi_fail(QVA_ERR_UNSUPPORTED, "%s: B*H = %d exceeds 65535", who, BH);
    return QVA_OK;
}

/* The three chains of the preparation: Q; the K mean, LSE shift and K
 * (and +kprev's next means); V.  What K's and V's codes wait for (K's
 * mean, +vsample's scales) is launched before Q's codes: every code
 * kernel fills the GPU, so a statistic queued behind one starts only as
 * its last CTAs retire, and the codes that need it wait that long
 * (bench/RESULTS.md, "d525562 on the H200"). */
static qva_status prep_chains(const qvc_view *q, const qvc_view *k, const qvc_view *v,
                              const qvc_prep_args *a, qvc_ops *ops, float *kmean, float *bmu,
                              float *bamax, qvc_block_ext kext, int32_t *csum, float *vscratch,
                              float *vsample, void *kpart, void *vpart, int demean,
                              const cudaStream_t sts[3]) {
    const int D = ops->D, BH = ops->BH;
    qk_params p;
    memset(&p, 0, sizeof p);
    p.signs = a->had_signs;
    p.hadamard = a->hadamard;
    p.had_scale = (float)(1.0 / sqrt((double)D));
    p.fmt = (int)a->qk_format;
    p.dev_qk8 = a->qk8;

    /* K' = K[perm] is smoothed by its own channel mean (summed in K'
     * order, as the CPU does) or a sample's; V' = V[perm] takes
     * +vsample's scales through +vprev's path, as if carried. */
    qva_status s = qvc_prep_ksmooth(q, k, a, ops->nk, BH, kmean, kext, kpart, sts[1]);
    qvc_prep_args av = *a;
    if (s == QVA_OK && a->v_sample && !demean) {
        av.vprev_scale = vsample;
        av.vprev_valid = (int *)(vsample + (size_t)BH * D);
        s = qvc_stat_sample(v, BH, v->N, NULL, 0, vpart, av.vprev_scale, av.vprev_valid, sts[2]);
    }

    /* Q: no permutation, no smoothing. */
    if (s == QVA_OK) {
        p.x = *q;
        p.n = ops->nq;
        p.n_pad = ops->nq_pad;
        p.rows_per_scale = a->q_rows_per_scale;
        p.codes = ops->q_i8;
        p.scale = ops->q_scale;
        ops->q_rows_per_scale = a->q_rows_per_scale;
        s = qvc_prep_qk8(p, BH, D, sts[0], "qvc_prep: Q quantize");
    }

    /* K': smoothed, then rotated */
    if (s == QVA_OK) {
        p.x = *k;
        p.perm = a->perm;
        p.mean = kmean;
        p.n = ops->nk;
        p.n_pad = ops->nk_pad;
        p.rows_per_scale = QVI_BLOCK;
        p.codes = ops->k_i8;
        p.scale = ops->k_scale;
        p.ext = kext;
        p.csum = csum;
        s = qvc_prep_qk8(p, BH, D, sts[1], "qvc_prep: K quantize");
    }
    /* +kprev: the means the layer's next call smooths with */
    if (s == QVA_OK && csum)
        s = qvc_kmean_next(csum, ops->k_scale, kmean, a->hadamard, a->had_signs, ops->nk,
                           ops->nblk, BH, D, a->kprev_mean, a->kprev_valid, sts[1]);

    if (s == QVA_OK) s = qvc_prep_v8(v, &av, demean, bmu, bamax, ops, vscratch, sts[2]);
    return s;
}

extern "C" qva_status qvc_prep(const qvc_view *q, const qvc_view *k,
                               const qvc_view *v, const qvc_prep_args *a,
                               qvc_ops *ops, const qvc_fork *fk, cudaStream_t st) {
    qva_status s;
    if (!ops || !ops->q_i8)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: NULL or unallocated ops");
    if ((s = qvc_prep_check_views("qvc_prep", q, k, v, a, ops->BH, ops->nq, ops->nk, ops->D)))
        return s;
    const int D = ops->D, BH = ops->BH, nblk = ops->nblk;
    if (a->qk_format != QVC_QK_INT8 && a->qk_format != QVC_QK_E4M3)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: bad qk_format %d", (int)a->qk_format);
    if (a->q_rows_per_scale != QVI_BLOCK &&
        !(a->q_rows_per_scale == 1 && a->qk_format == QVC_QK_INT8))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qvc_prep: q_rows_per_scale %d (1 with INT8, or %d)", a->q_rows_per_scale,
                        QVI_BLOCK);
    if (a->v_mode != 0 && a->v_mode != 1 && a->v_mode != 2)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: bad v_mode %d", a->v_mode);
    if (a->v_mode == 2 && (!qvc_v_plain_ok(v, 2) || ops->v_t_lo))
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "qvc_prep: INT8 V (+i8pv) on CUDA takes bf16/f16 V with 16-byte "
                        "aligned rows, head dim 64 or 128, and one code per value");
    const int demean = a->v_mode != 1 && a->demean;
    if (demean && !ops->v_mu)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: demean needs ops allocated with_mu");
    if (a->hadamard && (D & (D - 1)) != 0)
        return qvi_fail(QVA_ERR_UNSUPPORTED, "qvc_prep: Hadamard needs a power-of-two D, got %d", D);
    if (a->lse_shift && !a->smooth_k)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qvc_prep: lse_shift needs smooth_k");
    if (a->vprev_scale && !(a->vprev_valid && a->v_mode == 0 && !ops->v_t_lo &&
                            qvc_v_plain_ok(v, 0)))
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "qvc_prep: +vprev on CUDA takes one E4M3 digit of bf16/f16 V with "
                        "16-byte aligned rows at head dim 64 or 128 (v_plain.cu codes it)");
    if (a->v_sample && (a->vprev_scale || a->v_mode != 0 || ops->v_t_lo || !qvc_v_plain_ok(v, 0)))
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "qvc_prep: +vsample on CUDA takes one E4M3 digit of bf16/f16 V with "
                        "16-byte aligned rows at head dim 64 or 128 (v_plain.cu codes it), "
                        "without +vprev");
    /* K's quantization as qvc_prep_qk8 sees it (qk_plain.cu or qk.cu) */
    qk_params kp;
    memset(&kp, 0, sizeof kp);
    kp.x = *k, kp.fmt = (int)a->qk_format, kp.hadamard = a->hadamard, kp.rows_per_scale = QVI_BLOCK;
    /* +kprev's code sums come from qk_plain.cu */
    const int kprev = a->kprev_mean != NULL;
    if (kprev && !(a->smooth_k && a->kprev_valid && qvc_qk_plain_ok(kp, D)))
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "qvc_prep: +kprev on CUDA takes INT8 K of bf16/f16 with 16-byte aligned "
                        "rows at head dim 64 or 128 (its code sums come from qk_plain.cu)");

    if (a->k_sample && (kprev || !a->smooth_k))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qvc_prep: +ksample smooths K (smooth_k), not with +kprev");

    /* Temporaries: K channel mean [BH][D]; V block means and residual
     * amax [BH][nblk][D] (v_mode 0). One stream-ordered allocation. */
    const size_t mean_b = a->smooth_k ? align256((size_t)BH * D * sizeof(float)) : 0;
    const size_t stat_b = a->v_mode != 1 ? align256((size_t)BH * nblk * D * sizeof(float)) : 0;
    /* K's block extremes, where qk_plain.cu encodes K (its block amax from
     * them, qvc_block_ext) */
    const size_t ext_b = a->smooth_k && !kprev && !a->k_sample && qvc_qk_plain_takes_ext(kp, D)
                             ? align256((size_t)BH * nblk * D * sizeof(float)) : 0;
    const size_t csum_b = kprev ? align256((size_t)BH * nblk * D * sizeof(int32_t)) : 0;
    const int vsample = a->v_sample && !demean;
    const size_t vsc_b = a->v_sample && demean
                             ? align256(qvc_v_sampled_blocks_floats(BH, D) * sizeof(float))
                         : a->vprev_scale || vsample
                             ? align256((size_t)BH * (2 * D + 1) * sizeof(float)) : 0;
    /* +vsample: the sampled scales [BH][D] and their validity [BH] */
    const size_t vsm_b = vsample ? align256((size_t)BH * (D + 1) * sizeof(float)) : 0;
    /* +ksample / +vsample: the sample's chunk partials, one set per chain */
    const size_t part_b = align256(qvc_stat_sample_bytes(BH, ops->nk, D));
    const size_t kpart_b = a->k_sample ? part_b : 0, vpart_b = vsample ? part_b : 0;
    const size_t tmp_b =
        mean_b + 2 * stat_b + 2 * ext_b + csum_b + vsc_b + vsm_b + kpart_b + vpart_b;
    char *tmp = NULL;
    cudaError_t e;
    if (tmp_b && (e = cudaMallocAsync((void **)&tmp, tmp_b, st)) != cudaSuccess)
        return qvc_cuda_fail(e, "qvc_prep: cudaMallocAsync");
    float *kmean = mean_b ? (float *)tmp : NULL;
    float *bmu = stat_b ? (float *)(tmp + mean_b) : NULL;
    float *bamax = stat_b ? (float *)(tmp + mean_b + stat_b) : NULL;
    qvc_block_ext kext = {NULL, NULL};
    if (ext_b) {
        kext.min = (float *)(tmp + mean_b + 2 * stat_b);
        kext.max = (float *)(tmp + mean_b + 2 * stat_b + ext_b);
    }

    int32_t *csum = csum_b ? (int32_t *)(tmp + mean_b + 2 * stat_b + 2 * ext_b) : NULL;
    float *vscratch = vsc_b ? (float *)(tmp + mean_b + 2 * stat_b + 2 * ext_b + csum_b) : NULL;
    char *after = tmp + mean_b + 2 * stat_b + 2 * ext_b + csum_b + vsc_b;
    float *vsm = vsm_b ? (float *)after : NULL;
    void *kpart = kpart_b ? (void *)(after + vsm_b) : NULL;
    void *vpart = vpart_b ? (void *)(after + vsm_b + kpart_b) : NULL;

    const cudaStream_t sts[3] = {st, fk ? fk->side[0] : st, fk ? fk->side[1] : st};
    if (fk && (s = qvc_fork_begin(fk, st)) != QVA_OK) {
        if (tmp) cudaFreeAsync(tmp, st);
        return s;
    }
    s = prep_chains(q, k, v, a, ops, kmean, bmu, bamax, kext, csum, vscratch, vsm, kpart, vpart,
                    demean, sts);
    /* joined even after a failed launch, so that st stays after every
     * kernel of this call and the free below after their last use */
    if (fk) {
        const qva_status j = qvc_fork_end(fk, st);
        if (s == QVA_OK) s = j;
    }

    if (tmp && (e = cudaFreeAsync(tmp, st)) != cudaSuccess && s == QVA_OK)
        s = qvc_cuda_fail(e, "qvc_prep: cudaFreeAsync");
    return s;
}
