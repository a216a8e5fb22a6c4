/*
 * Validation of a call: the tensor descriptors (shapes, strides, byte
 * spans), aliasing between inputs and outputs, grouped heads, every option
 * of the config, and, on the CPU, finite inputs.  qva_attention runs it
 * before any backend (qvi_validate_call); qva_attention_check runs it
 * alone.  Nothing here reads a backend.
 */
#include "internal.h"
#include "checked.h"

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

/* The method, the scale, and the options of how Q, K and P are coded. */
static qva_status check_method_codes(const qva_config *cfg) {
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
    return QVA_OK;
}

/* Q's scale granularity, P's row sum and V's code. */
static qva_status check_qpv_codes(const qva_config *cfg) {
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
    return QVA_OK;
}

/* Where the K mean and the V scales come from (this call, the previous
 * call, a sample). */
static qva_status check_statistics(const qva_config *cfg) {
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
    return QVA_OK;
}

/* P's floor and max, and what stands in for skipped draft blocks. */
static qva_status check_p_tails(const qva_config *cfg) {
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
    return QVA_OK;
}

/* V-Smooth's parameters, for vc8 and vc4. */
static qva_status check_vsmooth(const qva_config *cfg) {
    if (cfg->method != QVA_METHOD_VC8 && cfg->method != QVA_METHOD_VC4) return QVA_OK;
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
    return QVA_OK;
}

/* The call's place in the denoising schedule. */
static qva_status check_schedule(const qva_config *cfg) {
    if (cfg->step < 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "step = %d must be >= 0", cfg->step);
    if (cfg->num_steps > 0 && cfg->step >= cfg->num_steps)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "step %d is outside the %d-step schedule", cfg->step,
                        cfg->num_steps);
    return QVA_OK;
}

qva_status qvi_check_config(const qva_config *cfg) {
    qva_status st;
    if ((st = check_method_codes(cfg)) || (st = check_qpv_codes(cfg)) ||
        (st = check_statistics(cfg)) || (st = check_p_tails(cfg)) ||
        (st = check_vsmooth(cfg)) || (st = check_schedule(cfg)))
        return st;
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
    if ((st = qvi_check_config(cfg)) != QVA_OK) return st;
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

