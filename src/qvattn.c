/* Core: validation of a call, the capability query and the dispatch to a
 * backend.  Errors and tensors (base.c), configs (config.c) and the context
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

/* ------------------------------------------------------------ validation */

/* The totals of a descriptor with shapes >= 1 and strides >= 0: the bytes
 * of its elements and the bytes from data to the end of its last element.
 * 1 if both are at most QVA_MAX_TENSOR_BYTES, so that every offset is a
 * defined int64; 0 if not (or if they overflow). */
static int tensor_bytes(const qva_tensor *t, int64_t *elem_bytes, int64_t *span_bytes) {
    const int64_t esize = (int64_t)qva_dtype_size(t->dtype);
    int64_t count, last = 0, term;
    if (!qvi_prod_i64(t->shape, 4, &count) || !qvi_mul_i64(count, esize, elem_bytes))
        return 0;
    for (int i = 0; i < 4; ++i)
        if (!qvi_mul_i64(t->shape[i] - 1, t->stride[i], &term) ||
            !qvi_add_i64(last, term, &last))
            return 0;
    return qvi_add_i64(last, 1, &last) && qvi_mul_i64(last, esize, span_bytes) &&
           *elem_bytes <= QVA_MAX_TENSOR_BYTES && *span_bytes <= QVA_MAX_TENSOR_BYTES;
}

static qva_status check_tensor(const qva_tensor *t, const char *name,
                               qva_device dev) {
    if (!t) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "%s is NULL", name);
    if (!t->data)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "%s has no data pointer", name);
    if (t->dtype != QVA_F32 && t->dtype != QVA_BF16 && t->dtype != QVA_F16)
        return qvi_fail(QVA_ERR_DTYPE, "%s: unknown dtype %d", name, (int)t->dtype);
    if (t->device != QVA_DEVICE_CPU && t->device != QVA_DEVICE_CUDA)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "%s: unknown device %d (QVA_DEVICE_CPU = 0, "
                        "QVA_DEVICE_CUDA = 1)", name, (int)t->device);
    if (t->device != dev)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "%s is on the %s but the context is %s", name,
                        t->device == QVA_DEVICE_CPU ? "cpu" : "cuda device",
                        dev == QVA_DEVICE_CPU ? "cpu" : "cuda");
    for (int i = 0; i < 4; ++i) {
        if (t->shape[i] <= 0)
            return qvi_fail(QVA_ERR_SHAPE, "%s: shape[%d] = %lld must be > 0",
                            name, i, (long long)t->shape[i]);
        if (t->shape[i] > (1 << 30))
            return qvi_fail(QVA_ERR_SHAPE, "%s: shape[%d] = %lld is too large",
                            name, i, (long long)t->shape[i]);
        if (t->stride[i] < 0)
            return qvi_fail(QVA_ERR_SHAPE, "%s: negative stride[%d]", name, i);
    }
    if (t->stride[3] != 1)
        return qvi_fail(QVA_ERR_SHAPE,
                        "%s: the head dimension must be contiguous (stride[3] "
                        "= %lld, need 1)",
                        name, (long long)t->stride[3]);
    int64_t elem_bytes, span_bytes;
    if (!tensor_bytes(t, &elem_bytes, &span_bytes))
        return qvi_fail(QVA_ERR_SHAPE,
                        "%s: shape [%lld,%lld,%lld,%lld] with strides "
                        "[%lld,%lld,%lld,%lld] is too large: its elements or "
                        "the span of its strides exceed 2^48 bytes "
                        "(QVA_MAX_TENSOR_BYTES)",
                        name, (long long)t->shape[0], (long long)t->shape[1],
                        (long long)t->shape[2], (long long)t->shape[3],
                        (long long)t->stride[0], (long long)t->stride[1],
                        (long long)t->stride[2], (long long)t->stride[3]);
    return QVA_OK;
}

/* An output must give each element its own memory.  Definite overlaps:
 * along a dimension of size > 1 a step shorter than one row (stride[3] is
 * 1, so a row is shape[3] elements), or two such dimensions with the same
 * stride. */
static qva_status check_no_self_overlap(const qva_tensor *t, const char *name) {
    for (int i = 0; i < 3; ++i) {
        if (t->shape[i] == 1) continue;
        if (t->stride[i] < t->shape[3])
            return qvi_fail(QVA_ERR_SHAPE,
                            "%s overlaps itself: stride[%d] = %lld is shorter "
                            "than a row of %lld elements",
                            name, i, (long long)t->stride[i], (long long)t->shape[3]);
        for (int j = 0; j < i; ++j)
            if (t->shape[j] > 1 && t->stride[j] == t->stride[i])
                return qvi_fail(QVA_ERR_SHAPE,
                                "%s overlaps itself: stride[%d] == stride[%d] "
                                "= %lld", name, j, i, (long long)t->stride[i]);
    }
    return QVA_OK;
}

/* 1 if the byte ranges [data, data + span) of a and b (both passed
 * check_tensor) intersect. */
static int spans_overlap(const qva_tensor *a, const qva_tensor *b) {
    int64_t unused, sa = 0, sb = 0;
    tensor_bytes(a, &unused, &sa);
    tensor_bytes(b, &unused, &sb);
    uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    return a0 < b0 + (uintptr_t)sb && b0 < a0 + (uintptr_t)sa;
}

/* The aliasing rule of qva_attention (include/qvattn.h): out and lse
 * overlap none of q, k, v and not each other; q, k, v may share memory. */
static qva_status check_aliasing(const qva_tensor *q, const qva_tensor *k,
                                 const qva_tensor *v, const qva_tensor *out,
                                 const qva_tensor *lse) {
    const qva_tensor *in[3] = {q, k, v};
    static const char *const in_name[3] = {"q", "k", "v"};
    const qva_tensor *outs[2] = {out, lse};
    static const char *const out_name[2] = {"out", "lse"};
    for (int o = 0; o < 2; ++o) {
        if (!outs[o]) continue;
        qva_status st = check_no_self_overlap(outs[o], out_name[o]);
        if (st != QVA_OK) return st;
        for (int i = 0; i < 3; ++i)
            if (spans_overlap(outs[o], in[i]))
                return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                                "%s overlaps the memory of %s: outputs must "
                                "not share memory with the inputs (no in-place "
                                "attention; see qva_attention in qvattn.h)",
                                out_name[o], in_name[i]);
    }
    if (out && lse && spans_overlap(out, lse))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "out and lse overlap: they need separate memory");
    return QVA_OK;
}

static int same_bhd(const qva_tensor *a, const qva_tensor *b) {
    return a->shape[0] == b->shape[0] && a->shape[1] == b->shape[1] &&
           a->shape[3] == b->shape[3];
}

/* q, k, v and out agree on B and D; q and out, k and v on their heads;
 * q's heads are a multiple of k's (grouped-query attention). */
static qva_status check_heads(const qva_tensor *q, const qva_tensor *k,
                              const qva_tensor *v, const qva_tensor *out) {
    const int gqa_ok = k->shape[1] == v->shape[1] && q->shape[1] % k->shape[1] == 0;
    if (q->shape[0] != k->shape[0] || q->shape[0] != v->shape[0] ||
        q->shape[3] != k->shape[3] || q->shape[3] != v->shape[3] ||
        (out && !same_bhd(q, out)))
        return qvi_fail(QVA_ERR_SHAPE,
                        "q and out must agree on B, H and D, and k and v with "
                        "them on B and D (q [%lld,%lld,*,%lld], k [%lld,%lld,*,%lld], v "
                        "[%lld,%lld,*,%lld], out [%lld,%lld,*,%lld])",
                        (long long)q->shape[0], (long long)q->shape[1],
                        (long long)q->shape[3], (long long)k->shape[0],
                        (long long)k->shape[1], (long long)k->shape[3],
                        (long long)v->shape[0], (long long)v->shape[1],
                        (long long)v->shape[3], (long long)(out ? out : q)->shape[0],
                        (long long)(out ? out : q)->shape[1],
                        (long long)(out ? out : q)->shape[3]);
    if (!gqa_ok)
        return qvi_fail(QVA_ERR_SHAPE,
                        "q has H = %lld heads, k %lld and v %lld: k and v need "
                        "the same heads H_kv, and grouped-query attention needs "
                        "H to be a multiple of H_kv (query head h reads K/V "
                        "head h / (H / H_kv))",
                        (long long)q->shape[1], (long long)k->shape[1],
                        (long long)v->shape[1]);
    return QVA_OK;
}

static qva_status check_config(const qva_config *cfg) {
    if ((unsigned)cfg->method >= QVA_METHOD_COUNT_)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "unknown method %d", (int)cfg->method);
    if (!(cfg->sm_scale >= 0) || !isfinite(cfg->sm_scale))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "sm_scale must be finite and >= 0 (0 = 1/sqrt(D))");
    if (cfg->expcast != QVA_EXPCAST_OFF && cfg->expcast != QVA_EXPCAST_PAPER &&
        cfg->expcast != QVA_EXPCAST_CENTRED && cfg->expcast != QVA_EXPCAST_E5M2)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "expcast = %d is not a qva_expcast_mode",
                        cfg->expcast);
    if (cfg->expcast && !(qvi_method_is_8bit(cfg->method) || cfg->method == QVA_METHOD_DRAFT))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "expcast needs an 8-bit method or draft");
    if (cfg->expcast == QVA_EXPCAST_E5M2 && cfg->method == QVA_METHOD_DRAFT)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "expcast QVA_EXPCAST_E5M2 applies to fp8, sage8 and vc8, not draft "
                        "(its INT8 phase codes P in E4M3)");
    if (cfg->hadamard && !qvi_method_is_quantized(cfg->method))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "hadamard needs a quantized method");
    if (cfg->q_granularity != QVA_Q_PER_ROW && cfg->q_granularity != QVA_Q_PER_BLOCK)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "q_granularity = %d (QVA_Q_PER_ROW or QVA_Q_PER_BLOCK)",
                        cfg->q_granularity);
    if (cfg->q_granularity == QVA_Q_PER_BLOCK && !qvi_method_has_int8_q(cfg->method))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "q_granularity QVA_Q_PER_BLOCK applies to sage8, vc8 and draft");
    if (cfg->p_sum != QVA_P_SUM_FP32 && cfg->p_sum != QVA_P_SUM_CODES)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "p_sum = %d (QVA_P_SUM_FP32 or QVA_P_SUM_CODES)", cfg->p_sum);
    if (cfg->p_sum == QVA_P_SUM_CODES && !qvi_p_sum_applies(cfg))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "p_sum QVA_P_SUM_CODES applies to fp8, sage8 and vc8 without expcast "
                        "(ExpCast always sums its codes: leave p_sum QVA_P_SUM_FP32)");
    if (cfg->v_code != QVA_V_E4M3 && cfg->v_code != QVA_V_E4M3X2 &&
        cfg->v_code != QVA_V_INT8_PV)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "v_code = %d (QVA_V_E4M3, QVA_V_E4M3X2 or QVA_V_INT8_PV)", cfg->v_code);
    if (cfg->v_code != QVA_V_E4M3 && !qvi_v_code_applies(cfg->method))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "v_code %s applies to sage8 and vc8",
                        cfg->v_code == QVA_V_INT8_PV ? "QVA_V_INT8_PV" : "QVA_V_E4M3X2");
    if (cfg->v_code == QVA_V_INT8_PV && cfg->expcast)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "v_code QVA_V_INT8_PV codes P from exp2: not with expcast");
    if (cfg->k_mean != QVA_K_MEAN_CALL && cfg->k_mean != QVA_K_MEAN_PREVIOUS &&
        cfg->k_mean != QVA_K_MEAN_SAMPLE)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "k_mean = %d (QVA_K_MEAN_CALL, QVA_K_MEAN_PREVIOUS or QVA_K_MEAN_SAMPLE)",
                        cfg->k_mean);
    if (cfg->k_mean != QVA_K_MEAN_CALL && !qvi_k_mean_applies(cfg->method))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "k_mean %s applies to sage8 and vc8",
                        cfg->k_mean == QVA_K_MEAN_SAMPLE ? "QVA_K_MEAN_SAMPLE"
                                                         : "QVA_K_MEAN_PREVIOUS");
    if (cfg->v_scale != QVA_V_SCALE_CALL && cfg->v_scale != QVA_V_SCALE_PREVIOUS &&
        cfg->v_scale != QVA_V_SCALE_SAMPLE)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "v_scale = %d (QVA_V_SCALE_CALL, QVA_V_SCALE_PREVIOUS or "
                        "QVA_V_SCALE_SAMPLE)",
                        cfg->v_scale);
    if (cfg->v_scale != QVA_V_SCALE_CALL && !qvi_v_scale_applies(cfg))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "v_scale %s applies to sage8 and vc8 with v_code QVA_V_E4M3 (and "
                        "QVA_V_SCALE_SAMPLE to draft)",
                        cfg->v_scale == QVA_V_SCALE_SAMPLE ? "QVA_V_SCALE_SAMPLE"
                                                           : "QVA_V_SCALE_PREVIOUS");
    if (cfg->p_floor != QVA_P_FLOOR_DROP && cfg->p_floor != QVA_P_FLOOR_MEAN)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "p_floor = %d (QVA_P_FLOOR_DROP or QVA_P_FLOOR_MEAN)", cfg->p_floor);
    if (cfg->p_floor == QVA_P_FLOOR_MEAN && !qvi_p_floor_applies(cfg))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "p_floor QVA_P_FLOOR_MEAN applies to sage8 and vc8 with expcast "
                        "QVA_EXPCAST_PAPER or QVA_EXPCAST_CENTRED");
    if (cfg->p_max != QVA_P_MAX_ROW && cfg->p_max != QVA_P_MAX_BLOCK)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "p_max = %d (QVA_P_MAX_ROW or QVA_P_MAX_BLOCK)",
                        cfg->p_max);
    if (cfg->skip_fill != QVA_SKIP_DROP && cfg->skip_fill != QVA_SKIP_POOLED)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "skip_fill = %d (QVA_SKIP_DROP or QVA_SKIP_POOLED)", cfg->skip_fill);
    if (cfg->skip_fill == QVA_SKIP_POOLED && cfg->method != QVA_METHOD_DRAFT)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "skip_fill QVA_SKIP_POOLED applies to draft only");
    if (cfg->p_max == QVA_P_MAX_BLOCK && !qvi_p_max_applies(cfg))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "p_max QVA_P_MAX_BLOCK applies to sage8, vc8 and draft with E4M3 P codes "
                        "(v_code not QVA_V_INT8_PV, p_floor QVA_P_FLOOR_DROP)");
    if (cfg->method == QVA_METHOD_VC8 || cfg->method == QVA_METHOD_VC4) {
        const qva_vsmooth_params *p = &cfg->vsmooth;
        if (p->clusters < 1 || p->clusters > QVA_VSMOOTH_MAX_CLUSTERS)
            return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                            "vsmooth.clusters = %d must be in [1, %d]", p->clusters,
                            QVA_VSMOOTH_MAX_CLUSTERS);
        if (p->iters < 0 || p->iters > QVA_VSMOOTH_MAX_ITERS)
            return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                            "vsmooth.iters = %d must be in [0, %d]", p->iters,
                            QVA_VSMOOTH_MAX_ITERS);
        if (p->block != QVI_BLOCK)
            return qvi_fail(QVA_ERR_UNSUPPORTED,
                            "vsmooth.block = %d: only B_v = 128 is implemented",
                            p->block);
        if (p->schedule != QVA_SCHEDULE_PAPER && p->schedule != QVA_SCHEDULE_ALWAYS &&
            p->schedule != QVA_SCHEDULE_DEMEAN)
            return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "unknown vsmooth schedule");
        if (p->refresh_every < 1)
            return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                            "vsmooth.refresh_every = %d must be >= 1 (steps "
                            "between permutation refreshes; paper: 4)",
                            p->refresh_every);
    }
    if (cfg->step < 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "step = %d must be >= 0", cfg->step);
    if (cfg->num_steps > 0 && cfg->step >= cfg->num_steps)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "step %d is outside the %d-step schedule", cfg->step,
                        cfg->num_steps);
    return QVA_OK;
}

static qva_status check_finite_head(const qva_tensor *t, const char *name) {
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t i = 0; i < t->shape[2]; ++i)
                for (int64_t c = 0; c < t->shape[3]; ++c)
                    if (!isfinite(qvi_load_elem(t, qvi_offset(t, b, h, i, c))))
                        return qvi_fail(QVA_ERR_NONFINITE,
                                        "%s[%lld,%lld,%lld,%lld] is not finite",
                                        name, (long long)b, (long long)h,
                                        (long long)i, (long long)c);
    return QVA_OK;
}

/* qvi_validate_call; with need_out = 0 out may be NULL (qva_attention_check
 * without one: the checks that involve out are skipped). */
static qva_status validate(const qva_config *cfg, const qva_tensor *q,
                           const qva_tensor *k, const qva_tensor *v,
                           const qva_tensor *out, const qva_tensor *lse,
                           qva_device dev, int need_out) {
    qva_status st;
    if (!cfg) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "cfg is NULL");
    if ((st = check_config(cfg)) != QVA_OK) return st;
    if ((st = check_tensor(q, "q", dev)) || (st = check_tensor(k, "k", dev)) ||
        (st = check_tensor(v, "v", dev)) ||
        ((out || need_out) && (st = check_tensor(out, "out", dev))))
        return st;
    if ((st = check_heads(q, k, v, out)) != QVA_OK) return st;
    if (q->shape[0] * q->shape[1] > INT32_MAX) /* the backends count heads in int */
        return qvi_fail(QVA_ERR_SHAPE, "B*H = %lld*%lld heads: at most 2^31-1",
                        (long long)q->shape[0], (long long)q->shape[1]);
    if (k->shape[2] != v->shape[2])
        return qvi_fail(QVA_ERR_SHAPE, "k has %lld tokens but v has %lld",
                        (long long)k->shape[2], (long long)v->shape[2]);
    if (out && out->shape[2] != q->shape[2])
        return qvi_fail(QVA_ERR_SHAPE, "out has %lld rows but q has %lld",
                        (long long)out->shape[2], (long long)q->shape[2]);
    if (q->shape[3] > QVA_MAX_HEAD_DIM)
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "head dim D = %lld not supported: at most %d (64 and "
                        "128 run natively, smaller ones zero-padded)",
                        (long long)q->shape[3], QVA_MAX_HEAD_DIM);
    if (cfg->method == QVA_METHOD_DRAFT && q->shape[2] != k->shape[2])
        return qvi_fail(QVA_ERR_SHAPE,
                        "draft is self-attention over the video grid: q and k "
                        "need the same N (%lld vs %lld)",
                        (long long)q->shape[2], (long long)k->shape[2]);
    if ((cfg->method == QVA_METHOD_VC8 || cfg->method == QVA_METHOD_VC4) &&
        q->shape[2] != k->shape[2])
        return qvi_fail(QVA_ERR_SHAPE,
                        "V-Smooth is for self-attention: q and k need the same N");
    if (lse) {
        if ((st = check_tensor(lse, "lse", dev)) != QVA_OK) return st;
        if (lse->dtype != QVA_F32 || lse->shape[0] != q->shape[0] ||
            lse->shape[1] != q->shape[1] || lse->shape[2] != q->shape[2] ||
            lse->shape[3] != 1)
            return qvi_fail(QVA_ERR_SHAPE, "lse must be f32 [B,H,N,1]");
    }
    if (out && (st = check_aliasing(q, k, v, out, lse)) != QVA_OK) return st;
    if (dev == QVA_DEVICE_CPU && cfg->check_finite) {
        if ((st = check_finite_head(q, "q")) || (st = check_finite_head(k, "k")) ||
            (st = check_finite_head(v, "v")))
            return st;
    }
    return QVA_OK;
}

qva_status qvi_validate_call(const qva_config *cfg, const qva_tensor *q,
                             const qva_tensor *k, const qva_tensor *v,
                             const qva_tensor *out, const qva_tensor *lse,
                             qva_device dev) {
    return validate(cfg, q, k, v, out, lse, dev, 1);
}

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
    if (check_config(cfg) != QVA_OK) { /* sets the message just read */
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

qva_status qva_attention_check(qva_device device, const qva_config *cfg,
                               const qva_tensor *q, const qva_tensor *k,
                               const qva_tensor *v, const qva_tensor *out,
                               const qva_tensor *lse) {
    qvi_clear_error();
    if (device != QVA_DEVICE_CPU && device != QVA_DEVICE_CUDA)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "unknown device %d", (int)device);
    /* without out: every check but those of out (shape, aliasing) */
    return validate(cfg, q, k, v, out, lse, device, 0);
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
 * check_config.  The tensors passed validate() already: draft asks more
 * of them (self-attention) than any dense method. */
static qva_status as_warmup_method(const qva_config **cfg, qva_config *warm,
                                   const qva_tensor *q) {
    if (!qvi_draft_warmup_config(*cfg, warm)) return QVA_OK;
    qvi_draft_plan pl;
    qva_status st = qvi_draft_plan_make(*cfg, q, &pl);
    if (st != QVA_OK || (st = check_config(warm)) != QVA_OK) return st;
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
