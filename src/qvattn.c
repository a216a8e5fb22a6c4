/* Core: the capability query, the CPU path's head-dim padding and the
 * dispatch of a validated call (validate.c) to a backend.  Errors
 * (error.c), tensors (tensor.c), configs (config.c) and the context
 * (context.c) sit below it. */
#define _POSIX_C_SOURCE 199309L
#include "internal.h"
#include "checked.h"
#include "draft/plan.h"
#include "qva_build_commit.h" /* QVA_BUILD_COMMIT (cmake/build_commit.cmake) */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef QVA_BUILD_TYPE
#define QVA_BUILD_TYPE "unknown"
#endif
#ifndef QVA_HAVE_CUDA
#define QVA_HAVE_CUDA 0
#endif
#ifndef QVA_SANITIZE_ON
#define QVA_SANITIZE_ON 0
#endif
#ifndef QVA_TSAN_ON
#define QVA_TSAN_ON 0
#endif

/* ------------------------------------------------------------ dispatch */
/* Head dim the CPU backend computes a call of head dim d at: 64 or 128
 * (cpu_attention_padded). */
static int64_t padded_head_dim(int64_t d) { return d <= 64 ? 64 : 128; }

int qva_supports(qva_device device, const qva_config *cfg, qva_dtype dtype,
                 int64_t head_dim, char *why, size_t why_len) {
    return qva_supports_heads(device, cfg, dtype, head_dim, 1, 1, why, why_len);
}

int qva_supports_heads(qva_device device, const qva_config *cfg, qva_dtype dtype,
                       int64_t head_dim, int64_t heads, int64_t kv_heads,
                       char *why, size_t why_len) {
    char tmp[8];
    if (!why || why_len == 0) {
        why = tmp;
        why_len = sizeof tmp;
    }
    why[0] = 0;
    if (!cfg) {
        snprintf(why, why_len, "cfg is NULL");
        return 0;
    }
    if (qvi_check_config(cfg) != QVA_OK) { /* sets the message just read */
        snprintf(why, why_len, "invalid config: %s", qva_last_error());
        return 0;
    }
    if (dtype != QVA_F32 && dtype != QVA_BF16 && dtype != QVA_F16) {
        snprintf(why, why_len, "unknown dtype");
        return 0;
    }
    if (head_dim < 1 || head_dim > QVA_MAX_HEAD_DIM) {
        snprintf(why, why_len,
                 "head dim %lld: at most %d (64 and 128 run natively, smaller "
                 "ones zero-padded)", (long long)head_dim, QVA_MAX_HEAD_DIM);
        return 0;
    }
    if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0) {
        snprintf(why, why_len,
                 "%lld query heads over %lld K/V heads: grouped-query attention "
                 "needs the query heads to be a multiple of the K/V heads",
                 (long long)heads, (long long)kv_heads);
        return 0;
    }
    if (device == QVA_DEVICE_CPU) {
        if (head_dim == 64 || head_dim == 128)
            snprintf(why, why_len, "cpu reference implements every method");
        else
            snprintf(why, why_len,
                     "cpu reference implements every method (head dim %lld "
                     "zero-padded to %lld)",
                     (long long)head_dim, (long long)padded_head_dim(head_dim));
        return 1;
    }
    if (device == QVA_DEVICE_CUDA)
        return qvi_cuda_supports(cfg, dtype, head_dim, heads / kv_heads, why, why_len);
    snprintf(why, why_len, "unknown device");
    return 0;
}

qva_status qva_draft_step_check(const qva_config *cfg, int64_t n_tokens, int64_t head_dim,
                                int *dense_warmup) {
    qvi_clear_error();
    if (!cfg || !dense_warmup)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qva_draft_step_check: NULL argument");
    if (cfg->method != QVA_METHOD_DRAFT)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qva_draft_step_check: not a draft config");
    if (n_tokens < 1 || head_dim < 1 || n_tokens > (1 << 30) || head_dim > (1 << 30))
        return qvi_fail(QVA_ERR_SHAPE,
                        "qva_draft_step_check: N = %lld, D = %lld (each in [1, 2^30])",
                        (long long)n_tokens, (long long)head_dim);
    /* The plan is the one place that validates and decides (src/draft/plan.c). */
    qva_tensor q;
    memset(&q, 0, sizeof q);
    q.dtype = QVA_BF16;
    q.shape[0] = q.shape[1] = 1;
    q.shape[2] = n_tokens;
    q.shape[3] = head_dim;
    qvi_draft_plan pl;
    qva_status st = qvi_draft_plan_make(cfg, &q, &pl);
    if (st != QVA_OK) return st;
    *dense_warmup = pl.warmup && cfg->draft.warmup_method == QVA_METHOD_BF16;
    return QVA_OK;
}

/* A zeroed HND copy of t (same dtype, CPU) with dp >= D channels per row;
 * with copy, each row's first D channels are t's. */
static qva_status pad_head_dim(const qva_tensor *t, int64_t dp, int copy,
                               qva_tensor *dst) {
    const size_t es = qva_dtype_size(t->dtype);
    const int64_t B = t->shape[0], H = t->shape[1], N = t->shape[2], D = t->shape[3];
    int64_t rows, elems;
    if (!qvi_prod_i64(t->shape, 3, &rows) || !qvi_mul_i64(rows, dp, &elems) ||
        (uint64_t)elems > SIZE_MAX / es)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "head dim padding: tensor too large");
    char *buf = calloc((size_t)elems, es); /* zero bits: +0 in every dtype */
    if (!buf)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY,
                        "head dim padding: %lld x %lld elements", (long long)rows,
                        (long long)dp);
    *dst = qva_tensor_hnd(buf, t->dtype, t->device, B, H, N, dp);
    for (int64_t b = 0; copy && b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t n = 0; n < N; ++n)
                memcpy(buf + (size_t)(((b * H + h) * N + n) * dp) * es,
                       (const char *)t->data + (size_t)qvi_offset(t, b, h, n, 0) * es,
                       (size_t)D * es);
    return QVA_OK;
}

/* The first D channels of each row of the padded p back into t. */
static void unpad_head_dim(const qva_tensor *p, const qva_tensor *t) {
    const size_t es = qva_dtype_size(t->dtype);
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t n = 0; n < t->shape[2]; ++n)
                memcpy((char *)t->data + (size_t)qvi_offset(t, b, h, n, 0) * es,
                       (const char *)p->data + (size_t)qvi_offset(p, b, h, n, 0) * es,
                       (size_t)t->shape[3] * es);
}

static qva_status cpu_attention(qva_context_t *ctx, const qva_config *cfg,
                                const qva_tensor *q, const qva_tensor *k,
                                const qva_tensor *v, const qva_tensor *out,
                                const qva_tensor *lse, int mask) {
    return cfg->method == QVA_METHOD_DRAFT
               ? qvi_cpu_draft(ctx, cfg, q, k, v, out, lse)
               : qvi_cpu_attention_masked(ctx, cfg, q, k, v, out, lse, mask);
}

/* A head dim other than 64 and 128 on the CPU (include/qvattn.h,
 * qva_attention): the call on copies zero-padded to 64 or 128 channels
 * with sm_scale that of the original D, the padded output columns
 * dropped.  out's padded copy starts as out, so the heads a failing call
 * leaves unwritten keep what they held. */
static qva_status cpu_attention_padded(qva_context_t *ctx, const qva_config *cfg,
                                       const qva_tensor *q, const qva_tensor *k,
                                       const qva_tensor *v, const qva_tensor *out,
                                       const qva_tensor *lse, int mask) {
    const int64_t dp = padded_head_dim(q->shape[3]);
    qva_config c = *cfg;
    c.sm_scale = qvi_sm_scale(cfg, q->shape[3]);
    qva_tensor pq, pk, pv, po;
    memset(&pq, 0, sizeof pq), memset(&pk, 0, sizeof pk);
    memset(&pv, 0, sizeof pv), memset(&po, 0, sizeof po);
    qva_status st;
    if ((st = pad_head_dim(q, dp, 1, &pq)) == QVA_OK &&
        (st = pad_head_dim(k, dp, 1, &pk)) == QVA_OK &&
        (st = pad_head_dim(v, dp, 1, &pv)) == QVA_OK &&
        (st = pad_head_dim(out, dp, 1, &po)) == QVA_OK) {
        st = cpu_attention(ctx, &c, &pq, &pk, &pv, &po, lse, mask);
        unpad_head_dim(&po, out);
    }
    free(pq.data), free(pk.data), free(pv.data), free(po.data);
    return st;
}

qva_status qvi_cpu_run(qva_context_t *ctx, const qva_config *cfg, const qva_tensor *q,
                       const qva_tensor *k, const qva_tensor *v, const qva_tensor *out,
                       const qva_tensor *lse, int mask) {
    return q->shape[3] == padded_head_dim(q->shape[3])
               ? cpu_attention(ctx, cfg, q, k, v, out, lse, mask)
               : cpu_attention_padded(ctx, cfg, q, k, v, out, lse, mask);
}

/* A draft call at a warm-up step whose warmup_method is not bf16 runs as
 * that dense method (qvi_draft_warmup_config): after the draft call's own
 * checks (grid, prefix, quotas: the errors every step of the schedule
 * gives), *cfg becomes *warm once its options (vsmooth's, say) pass
 * qvi_check_config.  The tensors passed validate() already: draft asks more
 * of them (self-attention) than any dense method. */
static qva_status as_warmup_method(const qva_config **cfg, qva_config *warm,
                                   const qva_tensor *q) {
    if (!qvi_draft_warmup_config(*cfg, warm)) return QVA_OK;
    qvi_draft_plan pl;
    qva_status st = qvi_draft_plan_make(*cfg, q, &pl);
    if (st != QVA_OK || (st = qvi_check_config(warm)) != QVA_OK) return st;
    *cfg = warm;
    return QVA_OK;
}

qva_status qva_attention(qva_context_t *ctx, const qva_config *cfg_in,
                         const qva_tensor *q, const qva_tensor *k,
                         const qva_tensor *v, const qva_tensor *out,
                         const qva_tensor *lse) {
    qvi_clear_error();
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    qva_status st = qvi_validate_call(cfg_in, q, k, v, out, lse, qvi_context_device(ctx));
    if (st != QVA_OK) return st;
    qva_config warm;
    st = as_warmup_method(&cfg_in, &warm, q);
    if (st != QVA_OK) return st;
    qva_config cfgv = *cfg_in;
    const qva_config *cfg = &cfgv;
    const qva_draft_stats no_stats = {0, 0, 0.0, 0.0, 0.0}; /* until a draft call sets them */
    if (cfgv.layer == QVA_LAYER_NONE) { /* stateless (include/qvattn.h) */
        cfgv.vsmooth.schedule = QVA_SCHEDULE_ALWAYS;
        cfgv.vsmooth.warm_start = 0;
    }
    if (qvi_context_device(ctx) == QVA_DEVICE_CUDA) {
        char why[256];
        if (!qvi_cuda_supports(cfg, q->dtype, q->shape[3], q->shape[1] / k->shape[1], why,
                               sizeof why))
            return qvi_fail(QVA_ERR_UNSUPPORTED, "cuda backend: %s", why);
        qvi_context_lock(ctx);
        qvi_context_set_draft_stats(ctx, &no_stats);
        if (qvi_context_profiling(ctx)) { /* this call's marks replace the pending ones */
            const qva_timings none = {0.0f, 0.0f, 0.0f};
            qvi_context_set_timings(ctx, &none);
        }
        st = qvi_cuda_attention(ctx, cfg, q, k, v, out, lse);
        qvi_context_unlock(ctx);
        return st;
    }
    struct timespec t0, t1;
    qvi_context_lock(ctx);
    qvi_context_set_draft_stats(ctx, &no_stats);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = qvi_cpu_run(ctx, cfg, q, k, v, out, lse, QVI_QUANT_ALL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    qva_timings tm = {0.0f, 0.0f,
                      (float)((double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                              (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6)};
    qvi_context_set_timings(ctx, &tm); /* the CPU reference does not separate phases */
    qvi_context_unlock(ctx);
    return st;
}

const char *qva_build_info(void) {
    return "qvattn " "0.1.0" " (C11"
#if QVA_HAVE_CUDA
           ", CUDA sm_90a"
#else
           ", no CUDA"
#endif
#ifdef _OPENMP
           ", OpenMP"
#endif
#if QVA_SANITIZE_ON
           ", ASan+UBSan"
#endif
#if QVA_TSAN_ON
           ", TSan"
#endif
           ", " QVA_BUILD_TYPE ", git " QVA_BUILD_COMMIT ")";
}
