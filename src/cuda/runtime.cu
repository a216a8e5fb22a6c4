/* CUDA backend glue: device discovery, memory helpers, the capability query,
 * per-context device state (workspace, V-Smooth permutations by layer) and
 * the dispatch of one attention call: [k-means] -> prep -> kernel, all on the
 * context's stream. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/device_util.cuh"
#include "expcast_magic.h"

#define CUDA_TRY(call, what)                                   \
    do {                                                       \
        cudaError_t e_ = (call);                               \
        if (e_ != cudaSuccess) return qvc_cuda_fail(e_, what);     \
    } while (0)

extern "C" int qva_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the "no device" error */
        return 0;
    }
    return n > 0;
}

/* ---------------------------------------------------------- capability */
static int is_fp4(qva_method m) { return m == QVA_METHOD_SAGE4 || m == QVA_METHOD_VC4; }
/* Methods whose K is smoothed: their LSE needs the per-row shift. */
static int smooths_k(qva_method m) {
    return m == QVA_METHOD_SAGE8 || m == QVA_METHOD_VC8 || is_fp4(m);
}

extern "C" int qvi_cuda_supports(const qva_config *cfg, qva_dtype dt, int64_t d,
                                 int64_t kv_group, char *why, size_t len) {
    if (!qva_cuda_available()) {
        snprintf(why, len, "no CUDA device present");
        return 0;
    }
    if ((cfg->k_mean == QVA_K_MEAN_PREVIOUS || cfg->v_scale != QVA_V_SCALE_CALL) &&
        dt != QVA_BF16 && dt != QVA_F16) {
        snprintf(why, len, "+kprev, +vprev and +vsample on CUDA take bf16 or f16 inputs (their "
                           "statistics come from the preparation's 16-bit path)");
        return 0;
    }
    if (cfg->v_code == QVA_V_INT8_PV && dt != QVA_BF16 && dt != QVA_F16) {
        snprintf(why, len, "+i8pv on CUDA takes bf16 or f16 inputs (its V prep reads 16-bit rows)");
        return 0;
    }
    return qvc_choose_kernel(cfg, d, kv_group, why, len) != QVC_KERNEL_NONE;
}

/* The 8-bit kernel, or the dev driver's version of it. */
static qva_status attn_8bit(qva_context_t *ctx, const qvc_ops *ops, qvc_qk_format fmt,
                            const qvc_attn_args *a, cudaStream_t st) {
    const qvc_dev_kernels *dev = qvc_dev_kernels_of(ctx);
    if (dev && dev->attn8_ws) return dev->attn8_ws(ops, fmt, a, st);
    return qvc_attn8_ws_128x128(ops, fmt, a, st);
}

/* ---------------------------------------------------------- state */
/* A layer's device state: V-Smooth's permutation and centroids, and the K
 * means +kprev carries to the layer's next call. */
typedef struct vs_dev {
    int layer, BH, N, D, k;
    int32_t *perm;     /* [BH][N]    */
    float *centroids;  /* [BH][k][D] */
    int km_B, km_H, km_Hk, km_D; /* the calls' shape (B, H, H_kv, D); 0: none */
    float *kmean;      /* [km_B * km_H][km_D], per query head (+kprev) */
    int *kmean_valid;  /* [km_B * km_H]: 0 until a call leaves a finite mean */
    float *vscale;     /* [km_B * km_H][km_D] V's channel scales (+vprev) */
    int *vscale_valid; /* [km_B * km_H] */
} vs_dev;

typedef struct cuda_state {
    qvc_ops ops;       /* grow-only workspace */
    qvc_ops16 ops16;   /* bf16 method workspace */
    qvc_ops4 ops4;     /* sage4/vc4 workspace */
    int ops_with_mu;
    float *lse_shift;  /* [BH][nq] K-smoothing LSE shift (grow-only) */
    size_t lse_shift_n;
    float *signs;      /* [128] Hadamard signs */
    uint64_t signs_key;
    vs_dev *vs;
    int nvs;
    qvc_phase_timer timer;
    qvc_fork fork;     /* the 8-bit preparation's K and V chains */
} cuda_state;

static void cuda_state_free(void *p) {
    cuda_state *s = (cuda_state *)p;
    if (!s) return;
    qvc_ops_free(&s->ops);
    qvc_ops16_free(&s->ops16);
    qvc_ops4_free(&s->ops4);
    cudaFree(s->lse_shift);
    cudaFree(s->signs);
    for (int i = 0; i < s->nvs; ++i) {
        cudaFree(s->vs[i].perm), cudaFree(s->vs[i].centroids);
        cudaFree(s->vs[i].kmean), cudaFree(s->vs[i].kmean_valid);
        cudaFree(s->vs[i].vscale), cudaFree(s->vs[i].vscale_valid);
    }
    free(s->vs);
    qvc_timer_free(&s->timer);
    qvc_fork_free(&s->fork);
    free(s);
}

static cuda_state *get_state(qva_context_t *ctx) {
    void (*dtor)(void *) = cuda_state_free;
    void **slot = qvi_context_slot(ctx, QVI_SLOT_CUDA, &dtor);
    if (!*slot) *slot = calloc(1, sizeof(cuda_state));
    return (cuda_state *)*slot;
}

/* The 8-bit operands' buffers; V's second digit (v_t_lo) only for a call
 * that asks for it (+v2), kept while the shape stays. */
static qva_status ensure_ops(cuda_state *s, int BH, int nq, int nk, int D, int with_mu,
                             int with_v_lo) {
    qvc_ops *o = &s->ops;
    if (o->q_i8 && o->BH == BH && o->nq == nq && o->nk == nk && o->D == D &&
        (s->ops_with_mu || !with_mu) && (o->v_t_lo || !with_v_lo)) {
        return QVA_OK;
    }
    qvc_ops_free(o);
    s->ops_with_mu = with_mu;
    return qvc_ops_alloc(o, BH, nq, nk, D, with_mu, with_v_lo);
}

static qva_status ensure_ops16(cuda_state *s, int BH, int nq, int nk, int D) {
    qvc_ops16 *o = &s->ops16;
    if (o->q && o->BH == BH && o->nq == nq && o->nk == nk && o->D == D) return QVA_OK;
    qvc_ops16_free(o);
    return qvc_ops16_alloc(o, BH, nq, nk, D);
}

static qva_status ensure_ops4(cuda_state *s, int BH, int nq, int nk, int D) {
    qvc_ops4 *o = &s->ops4;
    if (o->q && o->BH == BH && o->nq == nq && o->nk == nk && o->D == D) return QVA_OK;
    qvc_ops4_free(o);
    return qvc_ops4_alloc(o, BH, nq, nk, D, 1);
}

/* The LSE shift array of a K-smoothed method when an LSE is requested,
 * else NULL. */
static qva_status ensure_lse_shift(cuda_state *s, const qva_config *cfg, const qva_tensor *q,
                                   const qva_tensor *lse, float **out) {
    *out = NULL;
    if (!lse || !smooths_k(cfg->method)) return QVA_OK;
    const size_t n = (size_t)(q->shape[0] * q->shape[1] * q->shape[2]);
    if (n > s->lse_shift_n) {
        cudaFree(s->lse_shift);
        s->lse_shift = NULL;
        s->lse_shift_n = 0;
        CUDA_TRY(cudaMalloc(&s->lse_shift, n * sizeof(float)), "cudaMalloc lse shift");
        s->lse_shift_n = n;
    }
    *out = s->lse_shift;
    return QVA_OK;
}

static qva_status ensure_signs(cuda_state *s, const qva_config *cfg, int D, cudaStream_t st) {
    uint64_t key = cfg->hadamard_signs ? (cfg->hadamard_seed ^ (uint64_t)D) : 1u + (uint64_t)D;
    if (s->signs && s->signs_key == key) return QVA_OK;
    float host[128];
    qvi_hadamard_signs(cfg, D, host);
    if (!s->signs) CUDA_TRY(cudaMalloc(&s->signs, 128 * sizeof(float)), "cudaMalloc signs");
    CUDA_TRY(cudaMemcpyAsync(s->signs, host, (size_t)D * sizeof(float), cudaMemcpyHostToDevice, st),
             "copy signs");
    CUDA_TRY(cudaStreamSynchronize(st), "sync signs"); /* host buffer goes out of scope */
    s->signs_key = key;
    return QVA_OK;
}

static vs_dev *find_vs(cuda_state *s, int layer) {
    for (int i = 0; i < s->nvs; ++i)
        if (s->vs[i].layer == layer) return &s->vs[i];
    vs_dev *p = (vs_dev *)realloc(s->vs, (size_t)(s->nvs + 1) * sizeof *p);
    if (!p) return NULL;
    s->vs = p;
    vs_dev *e = &s->vs[s->nvs++];
    memset(e, 0, sizeof *e);
    e->layer = layer;
    return e;
}

/* The V-Smooth permutation of this call on the device (VC §3.4 schedule),
 * or NULL perm for the sage/fp8 methods. */
static qva_status vsmooth_perm(cuda_state *s, const qva_config *cfg, const qvc_view *v,
                               const int32_t **perm, int *demean, float *group_ms,
                               cudaStream_t st) {
    *perm = NULL;
    *demean = 0;
    if (cfg->method != QVA_METHOD_VC8 && cfg->method != QVA_METHOD_VC4) return QVA_OK;
    const int BH = (int)(v->B * v->H), N = (int)v->N, D = (int)v->D, k = cfg->vsmooth.clusters;
    qva_step_action act = qva_schedule_action(&cfg->vsmooth, cfg->step, cfg->num_steps);
    vs_dev *e = find_vs(s, cfg->layer);
    if (!e) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "v-smooth state");
    int usable = e->perm && e->BH == BH && e->N == N && e->D == D && e->k == k;
    if (act == QVA_STEP_GROUP || !usable) {
        int warm = usable && cfg->vsmooth.warm_start;
        if (!usable) {
            cudaFree(e->perm), cudaFree(e->centroids);
            e->perm = NULL, e->centroids = NULL;
            CUDA_TRY(cudaMalloc(&e->perm, (size_t)BH * N * sizeof(int32_t)), "cudaMalloc perm");
            CUDA_TRY(cudaMalloc(&e->centroids, (size_t)BH * k * D * sizeof(float)),
                     "cudaMalloc centroids");
            e->BH = BH, e->N = N, e->D = D, e->k = k;
        }
        qva_status r = qvc_kmeans_perm(v, k, cfg->vsmooth.iters, warm, e->centroids, e->perm, st);
        if (r != QVA_OK) {
            e->BH = 0; /* unusable until regrouped */
            return r;
        }
    }
    (void)group_ms;
    *perm = e->perm;
    *demean = act != QVA_STEP_PLAIN;
    return QVA_OK;
}

/* +kprev / +vprev: the layer's carried K means and V scales for the call's
 * heads (q: B, H, D; k: H_kv).  Another shape restarts the layer (none
 * valid: each head uses its own), as the CPU reference does.  NULLs for
 * the options not asked and for stateless calls. */
static qva_status carry_state(cuda_state *s, const qva_config *cfg, const qva_tensor *q,
                              const qva_tensor *k, qvc_prep_args *pa, cudaStream_t st) {
    pa->kprev_mean = NULL, pa->kprev_valid = NULL, pa->vprev_scale = NULL, pa->vprev_valid = NULL;
    const int kp = cfg->k_mean == QVA_K_MEAN_PREVIOUS, vp = cfg->v_scale == QVA_V_SCALE_PREVIOUS;
    if (!(kp || vp) || cfg->layer == QVA_LAYER_NONE) return QVA_OK;
    const int B = (int)q->shape[0], H = (int)q->shape[1], Hk = (int)k->shape[1],
              D = (int)q->shape[3], BH = B * H;
    vs_dev *e = find_vs(s, cfg->layer);
    if (!e) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "layer state");
    if (!e->kmean || e->km_B != B || e->km_H != H || e->km_Hk != Hk || e->km_D != D) {
        cudaFree(e->kmean), cudaFree(e->kmean_valid), cudaFree(e->vscale), cudaFree(e->vscale_valid);
        e->kmean = e->vscale = NULL, e->kmean_valid = e->vscale_valid = NULL;
        e->km_B = e->km_H = e->km_Hk = e->km_D = 0;
        const size_t vals = (size_t)BH * D * sizeof(float), flags = (size_t)BH * sizeof(int);
        CUDA_TRY(cudaMalloc(&e->kmean, vals), "cudaMalloc carried statistics");
        CUDA_TRY(cudaMalloc(&e->kmean_valid, flags), "cudaMalloc carried statistics");
        CUDA_TRY(cudaMalloc(&e->vscale, vals), "cudaMalloc carried statistics");
        CUDA_TRY(cudaMalloc(&e->vscale_valid, flags), "cudaMalloc carried statistics");
        CUDA_TRY(cudaMemsetAsync(e->kmean_valid, 0, flags, st), "clear carried statistics");
        CUDA_TRY(cudaMemsetAsync(e->vscale_valid, 0, flags, st), "clear carried statistics");
        e->km_B = B, e->km_H = H, e->km_Hk = Hk, e->km_D = D;
    }
    if (kp) pa->kprev_mean = e->kmean, pa->kprev_valid = e->kmean_valid;
    if (vp) pa->vprev_scale = e->vscale, pa->vprev_valid = e->vscale_valid;
    return QVA_OK;
}

extern "C" qva_status qvi_cuda_layer_carried(qva_context_t *ctx, int layer, int BH, int D,
                                             int which, float *vals, int *valid) {
    cuda_state *s = get_state(ctx);
    if (!s) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "cuda state");
    vs_dev *e = NULL;
    for (int i = 0; i < s->nvs; ++i)
        if (s->vs[i].layer == layer) e = &s->vs[i];
    if (!e || !e->kmean || e->km_B * e->km_H != BH || e->km_D != D)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "layer %d holds no carried statistics of %d x %d",
                        layer, BH, D);
    cudaStream_t st = (cudaStream_t)qvi_context_stream(ctx);
    CUDA_TRY(cudaMemcpyAsync(vals, which ? e->vscale : e->kmean, (size_t)BH * D * sizeof(float),
                             cudaMemcpyDeviceToHost, st), "copy carried statistics");
    CUDA_TRY(cudaMemcpyAsync(valid, which ? e->vscale_valid : e->kmean_valid,
                             (size_t)BH * sizeof(int), cudaMemcpyDeviceToHost, st),
             "copy carried statistics");
    CUDA_TRY(cudaStreamSynchronize(st), "copy carried statistics");
    return QVA_OK;
}

static qvc_attn_args make_args(const qva_config *cfg, const qva_tensor *q,
                               const qva_tensor *out, const qva_tensor *lse) {
    qvc_attn_args a;
    a.scale_log2 = qvi_sm_scale(cfg, q->shape[3]) * QVI_LOG2E;
    a.expcast = cfg->expcast;
    a.expcast_add = qvi_expcast_addend(qvi_expcast_beta(cfg->expcast));
    a.sum_codes = cfg->p_sum == QVA_P_SUM_CODES;
    a.u8_pv = cfg->v_code == QVA_V_INT8_PV;
    a.p_block = cfg->p_max == QVA_P_MAX_BLOCK && qvi_p_max_applies(cfg);
    a.out = out->data;
    a.out_dtype = (int)out->dtype;
    a.osb = out->stride[0], a.osh = out->stride[1], a.osn = out->stride[2];
    a.lse = lse ? (float *)lse->data : NULL;
    a.lsb = lse ? lse->stride[0] : 0, a.lsh = lse ? lse->stride[1] : 0;
    a.lsn = lse ? lse->stride[2] : 0;
    a.H = (int)q->shape[1];
    a.lse_shift = NULL;
    return a;
}

/* sage4 / vc4: NVFP4 prep (bit-exact with the CPU quantizers) and the
 * emulated 4-bit kernel.  perm/demean come from vsmooth_perm (vc4). */
static qva_status run_fp4(qva_context_t *ctx, cuda_state *s, const qva_config *cfg,
                          const qva_tensor *q, const qva_tensor *k, const qva_tensor *out,
                          const qva_tensor *lse, const qvc_view *qv, const qvc_view *kv,
                          const qvc_view *vv, const int32_t *perm, int demean, int prof,
                          cudaStream_t st) {
    const int BH = (int)(q->shape[0] * q->shape[1]), D = (int)q->shape[3];
    qva_status r;
    float *shift;
    if ((r = ensure_ops4(s, BH, (int)q->shape[2], (int)k->shape[2], D)) != QVA_OK) return r;
    if ((r = ensure_lse_shift(s, cfg, q, lse, &shift)) != QVA_OK) return r;
    qvc_prep_args pa;
    memset(&pa, 0, sizeof pa);
    pa.smooth_k = 1;
    pa.hadamard = cfg->hadamard;
    if (cfg->hadamard) {
        if ((r = ensure_signs(s, cfg, D, st)) != QVA_OK) return r;
        pa.had_signs = s->signs;
    }
    pa.perm = perm;
    pa.demean = demean;
    pa.lse_shift = shift;
    pa.sm_scale = qvi_sm_scale(cfg, D);
    qvc_ops4 ops = s->ops4;
    if (!demean) ops.mu = NULL;
    if ((r = qvc_prep4(qv, kv, vv, &pa, &ops, st)) != QVA_OK) return r;
    if ((r = qvc_timer_mark(&s->timer, 2, prof, st)) != QVA_OK) return r;
    qvc_attn_args a = make_args(cfg, q, out, lse);
    a.lse_shift = shift;
    if ((r = qvc_attn_fp4(&ops, &a, st)) != QVA_OK) return r;
    if ((r = qvc_timer_mark(&s->timer, 3, prof, st)) != QVA_OK) return r;
    return prof ? qvc_timer_finish(ctx, &s->timer) : QVA_OK;
}

extern "C" qva_status qvi_cuda_attention(qva_context_t *ctx, const qva_config *cfg,
                                         const qva_tensor *q, const qva_tensor *k,
                                         const qva_tensor *v, const qva_tensor *out,
                                         const qva_tensor *lse) {
    char why[256];
    const qvc_kernel kern =
        qvc_choose_kernel(cfg, q->shape[3], q->shape[1] / k->shape[1], why, sizeof why);
    if (kern == QVC_KERNEL_NONE) return qvi_fail(QVA_ERR_UNSUPPORTED, "%s", why);
    if (cfg->method == QVA_METHOD_DRAFT) return qvc_draft_attention(ctx, cfg, q, k, v, out, lse);
    cudaStream_t st = (cudaStream_t)qvi_context_stream(ctx);
    cuda_state *s = get_state(ctx);
    if (!s) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "cuda state");
    const int prof = qvi_context_profiling(ctx);
    const int BH = (int)(q->shape[0] * q->shape[1]), D = (int)q->shape[3];
    const qvc_view qv = qvc_view_of(q), kv = qvc_kv_view(k, q), vv = qvc_kv_view(v, q);
    qva_status r;

    if ((r = qvc_timer_mark(&s->timer, 0, prof, st)) != QVA_OK) return r;
    const int32_t *perm;
    int demean;
    if ((r = vsmooth_perm(s, cfg, &vv, &perm, &demean, NULL, st)) != QVA_OK) return r;
    if ((r = qvc_timer_mark(&s->timer, 1, prof, st)) != QVA_OK) return r;

    if (kern == QVC_KERNEL_ATTN_FP4_SIMT_64X128)
        return run_fp4(ctx, s, cfg, q, k, out, lse, &qv, &kv, &vv, perm, demean, prof, st);
    if (kern == QVC_KERNEL_ATTN_BF16_MMA_64X128) {
        /* The CPU reference rounds Q, K and V to FP16 when q is f16, else
         * to BF16 (qvi_cpu_prepare_head: use_f16 = q dtype == f16). */
        const int use_f16 = q->dtype == QVA_F16;
        if ((r = ensure_ops16(s, BH, (int)q->shape[2], (int)k->shape[2], D)) != QVA_OK) return r;
        if ((r = qvc_prep16(&qv, &kv, &vv, use_f16, &s->ops16, st)) != QVA_OK) return r;
        if ((r = qvc_timer_mark(&s->timer, 2, prof, st)) != QVA_OK) return r;
        const qvc_attn_args a16 = make_args(cfg, q, out, lse);
        if ((r = qvc_attn_bf16(&s->ops16, use_f16, &a16, st)) != QVA_OK) return r;
        if ((r = qvc_timer_mark(&s->timer, 3, prof, st)) != QVA_OK) return r;
        return prof ? qvc_timer_finish(ctx, &s->timer) : QVA_OK;
    }

    const int v2 = cfg->v_code == QVA_V_E4M3X2;
    if ((r = ensure_ops(s, BH, (int)q->shape[2], (int)k->shape[2], D, 1, v2)) != QVA_OK) return r;
    float *shift; /* K-smoothing LSE shift (sage8/vc8 with an LSE), or NULL */
    if ((r = ensure_lse_shift(s, cfg, q, lse, &shift)) != QVA_OK) return r;
    qvc_prep_args pa;
    memset(&pa, 0, sizeof pa);
    pa.qk_format = cfg->method == QVA_METHOD_FP8 ? QVC_QK_E4M3 : QVC_QK_INT8;
    pa.q_rows_per_scale = cfg->method == QVA_METHOD_FP8 ? QVI_BLOCK : qvi_q_rows_per_scale(cfg);
    pa.smooth_k = cfg->method != QVA_METHOD_FP8;
    pa.hadamard = cfg->hadamard;
    pa.had_signs = NULL;
    if (cfg->hadamard) {
        if ((r = ensure_signs(s, cfg, D, st)) != QVA_OK) return r;
        pa.had_signs = s->signs;
    }
    pa.perm = perm;
    pa.v_mode = cfg->method == QVA_METHOD_FP8 ? 1 : cfg->v_code == QVA_V_INT8_PV ? 2 : 0;
    pa.demean = demean;
    pa.lse_shift = shift;
    pa.sm_scale = qvi_sm_scale(cfg, D);
    if ((r = carry_state(s, cfg, q, k, &pa, st)) != QVA_OK) return r;
    pa.k_sample = cfg->k_mean == QVA_K_MEAN_SAMPLE;
    pa.v_sample = cfg->v_scale == QVA_V_SCALE_SAMPLE;
    const qvc_dev_kernels *dev = qvc_dev_kernels_of(ctx);
    pa.qk8 = dev ? dev->qk8 : NULL;
    qvc_ops ops = s->ops;
    if (!demean) ops.v_mu = NULL, ops.v_mu_tile = NULL;
    if (!v2) ops.v_t_lo = NULL;
    if ((r = qvc_fork_ensure(&s->fork)) != QVA_OK) return r;
    if ((r = qvc_prep(&qv, &kv, &vv, &pa, &ops, &s->fork, st)) != QVA_OK) return r;
    if ((r = qvc_timer_mark(&s->timer, 2, prof, st)) != QVA_OK) return r;

    qvc_attn_args a = make_args(cfg, q, out, lse);
    a.lse_shift = shift;
    if ((r = attn_8bit(ctx, &ops, pa.qk_format, &a, st)) != QVA_OK) return r;
    if ((r = qvc_timer_mark(&s->timer, 3, prof, st)) != QVA_OK) return r;
    return prof ? qvc_timer_finish(ctx, &s->timer) : QVA_OK;
}

/* ---------------------------------------------------------- memory */
extern "C" qva_status qva_device_malloc(void **p, size_t n) {
    if (!p) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "NULL pointer");
    CUDA_TRY(cudaMalloc(p, n), "cudaMalloc");
    return QVA_OK;
}
extern "C" qva_status qva_device_free(void *p) {
    if (!p) return QVA_OK; /* like free(NULL), even with no device present */
    CUDA_TRY(cudaFree(p), "cudaFree");
    return QVA_OK;
}
extern "C" qva_status qva_memcpy_to_device(void *d, const void *s, size_t n) {
    CUDA_TRY(cudaMemcpy(d, s, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    return QVA_OK;
}
extern "C" qva_status qva_memcpy_to_host(void *d, const void *s, size_t n) {
    CUDA_TRY(cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return QVA_OK;
}
extern "C" qva_status qva_device_synchronize(void) {
    CUDA_TRY(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return QVA_OK;
}
