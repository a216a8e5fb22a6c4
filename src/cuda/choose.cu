/* The one place that decides which kernel runs a config on the device
 * (ggml's fattn.cu pattern): qvi_cuda_supports() reports its answer, and
 * the dispatch (runtime.cu, draft/host.cu) runs it.  Nothing here reads
 * the environment; kernel versions under trial are set on a context by
 * the dev driver (dev/cuda), never by the library. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "draft/plan.h"
#include "cuda_internal.h"

static const char *kernel_what(qvc_kernel k) {
    switch (k) {
    case QVC_KERNEL_ATTN8_WS_128X128:
        return "attn8_ws_128x128 (wgmma/TMA, warp-specialized; INT8 or E4M3 QK, E4M3 PV)";
    case QVC_KERNEL_ATTN_BF16_MMA_64X128: return "attn_bf16_mma_64x128 (mma.sync BF16/FP16)";
    case QVC_KERNEL_ATTN_FP4_SIMT_64X128:
        return "attn_fp4_simt_64x128 (NVFP4 emulated in FP32: no FP4 tensor cores on sm_90)";
    case QVC_KERNEL_ATTN_DRAFT_WS_128X128:
        return "attn_draft_ws_128x128 (block-sparse wgmma/TMA, BF16/FP16 and INT8/E4M3 phases)";
    case QVC_KERNEL_ATTN_DRAFT_MMA_64X128:
        return "attn_draft_mma_64x128 (mma.sync phases; NVFP4 emulated with exact BF16 MMAs)";
    default: return "none";
    }
}

/* Whether the draft route of cfg has NVFP4 blocks: the plan's with4
 * (qvi_draft_plan_make) when the grid is set, else the fraction asked.
 * QUOTA: a non-zero 4-bit quota; MASS: some head may keep pairs (cap > 0)
 * and the split gives 4 bits a share (its K varies per head). */
static int draft_with4(const qva_draft_params *dp) {
    const int64_t rf = qvi_draft_regions_per_frame(dp);
    if (rf < 0 || dp->grid_t <= 0 || dp->grid_t > (1 << 20) || dp->grid_t * rf > (1 << 20))
        return dp->frac4 > 0.0f;
    const int64_t regions = dp->grid_t * rf, M = regions * regions;
    if (dp->budget == QVA_DRAFT_BUDGET_MASS) {
        int64_t ppm, lo, hi;
        if (qvi_draft_mass_bounds(dp, M, &ppm, &lo, &hi) != QVA_OK) return dp->frac4 > 0.0f;
        return hi > 0 && llround((double)dp->frac4 * 1e6) > 0;
    }
    int64_t quota[4];
    if (qvi_draft_quotas(dp, M, quota) != QVA_OK) return dp->frac4 > 0.0f;
    return quota[QVI_Q_4] > 0;
}

static qvc_kernel choose(const qva_config *cfg, int64_t d, int64_t kv_group, char *why,
                         size_t len);

static qvc_kernel choose_draft(const qva_config *cfg, int64_t d, int64_t kv_group, char *why,
                               size_t len) {
    if (cfg->hadamard) {
        snprintf(why, len, "draft has no +hadamard variant");
        return QVC_KERNEL_NONE;
    }
    /* Refused at every step, warm-up included, so that a caller who asks
     * once gets the answer for the whole schedule.  Both budgets run (the
     * router selects MASS's per-head counts on the device). */
    if (cfg->draft.budget != QVA_DRAFT_BUDGET_QUOTA && cfg->draft.budget != QVA_DRAFT_BUDGET_MASS) {
        snprintf(why, len, "draft.budget = %d is not a qva_draft_budget", cfg->draft.budget);
        return QVC_KERNEL_NONE;
    }
    if (cfg->p_max == QVA_P_MAX_BLOCK) { /* measured no gain at the CPU's lengths */
        snprintf(why, len, "draft +pblock runs on the CPU reference only");
        return QVC_KERNEL_NONE;
    }
    const qva_method wm = cfg->draft.warmup_method;
    if (!qvi_draft_warmup_method_ok(wm)) {
        snprintf(why, len, "draft.warmup_method = %d is not a dense method", (int)wm);
        return QVC_KERNEL_NONE;
    }
    qva_config warm;
    if (qvi_draft_warmup_config(cfg, &warm)) return choose(&warm, d, kv_group, why, len);
    if (cfg->step < cfg->draft.dense_warmup_steps)
        return QVC_KERNEL_ATTN_BF16_MMA_64X128; /* the dense warm-up is the bf16 method */
    if ((d == 128 || d == 64) && !draft_with4(&cfg->draft)) return QVC_KERNEL_ATTN_DRAFT_WS_128X128;
    return QVC_KERNEL_ATTN_DRAFT_MMA_64X128;
}

static qvc_kernel choose(const qva_config *cfg, int64_t d, int64_t kv_group, char *why,
                         size_t len) {
    if (d != 64 && d != 128) {
        snprintf(why, len,
                 "head dim %lld: the CUDA kernels take 64 or 128 (zero-pad q, k and "
                 "v to %d channels and pass sm_scale = 1/sqrt(%lld), dropping the "
                 "padded output columns: qvattn.attention and qvattn.sdpa do)",
                 (long long)d, d < 64 ? 64 : 128, (long long)d);
        return QVC_KERNEL_NONE;
    }
    if (kv_group < 1) {
        snprintf(why, len, "bad K/V head group %lld", (long long)kv_group);
        return QVC_KERNEL_NONE;
    }
    if (cfg->p_max == QVA_P_MAX_BLOCK &&
        (cfg->v_code != QVA_V_E4M3 || cfg->expcast == QVA_EXPCAST_E5M2)) {
        snprintf(why, len, "+pblock (P coded against each key block's own max) runs on CUDA "
                           "with one E4M3 digit of V and E4M3 P codes; here%s%s",
                 cfg->v_code != QVA_V_E4M3 ? " another V code" : "",
                 cfg->expcast == QVA_EXPCAST_E5M2 ? " +expcast-e5m2" : "");
        return QVC_KERNEL_NONE;
    }
    if (cfg->p_floor == QVA_P_FLOOR_MEAN) {
        snprintf(why, len, "+floormass (ExpCast's floor mass put back) runs on the CPU "
                           "reference only so far");
        return QVC_KERNEL_NONE;
    }
    if (cfg->v_code == QVA_V_INT8_PV && d != 128) {
        snprintf(why, len, "+i8pv (the PV product in integers) runs on CUDA at head dim 128 "
                           "only (attn8_ws_128x128); head dim %lld",
                 (long long)d);
        return QVC_KERNEL_NONE;
    }
    if (cfg->expcast == QVA_EXPCAST_E5M2 &&
        (d != 128 || cfg->method == QVA_METHOD_FP8 || cfg->v_code != QVA_V_E4M3)) {
        snprintf(why, len, "+expcast-e5m2 (ExpCast's code in E5M2) runs on CUDA for sage8 and "
                           "vc8 at head dim 128 with one V code (attn8_ws_128x128); here %s at "
                           "head dim %lld%s",
                 cfg->method == QVA_METHOD_FP8 ? "fp8" : "the method", (long long)d,
                 cfg->v_code != QVA_V_E4M3 ? " with another V code" : "");
        return QVC_KERNEL_NONE;
    }
    if (cfg->v_code == QVA_V_E4M3X2 && d != 128) {
        snprintf(why, len, "+v2 (V in two E4M3 digits) runs on CUDA at head dim 128 only "
                           "(attn8_ws_128x128); head dim %lld",
                 (long long)d);
        return QVC_KERNEL_NONE;
    }
    switch (cfg->method) {
    case QVA_METHOD_BF16: return QVC_KERNEL_ATTN_BF16_MMA_64X128;
    case QVA_METHOD_SAGE8:
    case QVA_METHOD_VC8:
    case QVA_METHOD_FP8: /* head dim 64 too, in the kernel's 128-wide tiles */
        return QVC_KERNEL_ATTN8_WS_128X128;
    case QVA_METHOD_SAGE4:
    case QVA_METHOD_VC4: return QVC_KERNEL_ATTN_FP4_SIMT_64X128;
    case QVA_METHOD_DRAFT: return choose_draft(cfg, d, kv_group, why, len);
    case QVA_METHOD_EXACT:
        snprintf(why, len, "exact (FP64) is the CPU ground truth only");
        return QVC_KERNEL_NONE;
    default: {
        char name[64] = "?";
        qva_config_method_name(cfg, name, sizeof name);
        snprintf(why, len, "no CUDA kernel for %s yet (CPU reference only)", name);
        return QVC_KERNEL_NONE;
    }
    }
}

extern "C" qvc_kernel qvc_choose_kernel(const qva_config *cfg, int64_t d, int64_t kv_group,
                                        char *why, size_t len) {
    char none[8];
    if (!why) why = none, len = sizeof none;
    const qvc_kernel k = choose(cfg, d, kv_group, why, len);
    if (k != QVC_KERNEL_NONE) snprintf(why, len, "cuda: %s", kernel_what(k));
    return k;
}

/* ---------------------------------------------------------- dev kernels */
static void dev_kernels_free(void *p) { free(p); }

/* Called outside qva_attention (dev/cuda/driver.c), so it takes the
 * context's lock itself; qvc_dev_kernels_of runs inside qva_attention. */
extern "C" qva_status qvc_set_dev_kernels(qva_context_t *ctx, const qvc_dev_kernels *k) {
    void (*dtor)(void *) = dev_kernels_free;
    qvi_context_lock(ctx);
    void **slot = qvi_context_slot(ctx, QVI_SLOT_CUDA_DEV, &dtor);
    if (!*slot) *slot = calloc(1, sizeof(qvc_dev_kernels));
    const int ok = *slot != NULL;
    if (ok) *(qvc_dev_kernels *)*slot = *k;
    qvi_context_unlock(ctx);
    return ok ? QVA_OK : qvi_fail(QVA_ERR_OUT_OF_MEMORY, "dev kernels");
}

extern "C" const qvc_dev_kernels *qvc_dev_kernels_of(qva_context_t *ctx) {
    void (*dtor)(void *) = dev_kernels_free;
    void **slot = qvi_context_slot(ctx, QVI_SLOT_CUDA_DEV, &dtor);
    return slot ? (const qvc_dev_kernels *)*slot : NULL;
}
