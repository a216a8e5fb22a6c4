/* Core: errors, tensor descriptors, configs, method names, the context and
 * its per-layer state, the step schedule, validation and dispatch. */
#define _POSIX_C_SOURCE 199309L
#include "internal.h"
#include "checked.h"
#include "draft/plan.h"

#include <ctype.h>
#include <pthread.h>
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

/* ------------------------------------------------------------ errors */
static _Thread_local char last_error[512];

qva_status qvi_fail(qva_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

void qvi_clear_error(void) { last_error[0] = 0; }
const char *qva_last_error(void) { return last_error; }

const char *qva_status_string(qva_status s) {
    switch (s) {
    case QVA_OK: return "ok";
    case QVA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case QVA_ERR_SHAPE: return "shape mismatch";
    case QVA_ERR_DTYPE: return "unsupported dtype";
    case QVA_ERR_UNSUPPORTED: return "unsupported on this backend";
    case QVA_ERR_OUT_OF_MEMORY: return "out of memory";
    case QVA_ERR_NONFINITE: return "non-finite input";
    case QVA_ERR_DEVICE: return "device error";
    case QVA_ERR_PARSE: return "parse error";
    case QVA_ERR_IO: return "i/o error";
    }
    return "unknown status";
}

/* ------------------------------------------------------------ tensors */
size_t qva_dtype_size(qva_dtype dt) { return dt == QVA_F32 ? 4 : 2; }

static qva_tensor make_tensor(void *data, qva_dtype dt, qva_device dev,
                              const int64_t shape[4], const int64_t stride[4]) {
    qva_tensor t;
    t.data = data;
    t.dtype = dt;
    t.device = dev;
    memcpy(t.shape, shape, sizeof t.shape);
    memcpy(t.stride, stride, sizeof t.stride);
    return t;
}

qva_tensor qva_tensor_hnd(void *data, qva_dtype dt, qva_device dev, int64_t B,
                          int64_t H, int64_t N, int64_t D) {
    const int64_t shape[4] = {B, H, N, D};
    const int64_t nd = qvi_mul_sat_i64(N, D);
    const int64_t stride[4] = {qvi_mul_sat_i64(H, nd), nd, D, 1};
    return make_tensor(data, dt, dev, shape, stride);
}

qva_tensor qva_tensor_nhd(void *data, qva_dtype dt, qva_device dev, int64_t B,
                          int64_t H, int64_t N, int64_t D) {
    const int64_t shape[4] = {B, H, N, D};
    const int64_t hd = qvi_mul_sat_i64(H, D);
    const int64_t stride[4] = {qvi_mul_sat_i64(N, hd), D, hd, 1};
    return make_tensor(data, dt, dev, shape, stride);
}

float qvi_load_elem(const qva_tensor *t, int64_t off) {
    switch (t->dtype) {
    case QVA_F32: return ((const float *)t->data)[off];
    case QVA_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)t->data)[off] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    case QVA_F16: {
        uint16_t h = ((const uint16_t *)t->data)[off];
        uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31,
                 m = h & 1023;
        float f;
        if (e == 0) {
            f = ldexpf((float)m, -24);
            return sign ? -f : f;
        }
        uint32_t bits = e == 31 ? (sign | 0x7f800000u | (m << 13))
                                : (sign | ((e + 112) << 23) | (m << 13));
        memcpy(&f, &bits, 4);
        return f;
    }
    }
    return 0.0f;
}

/* Float -> half bits, round to nearest even (via the exact rounding of
 * qva_round_f16, then an exact re-encoding). */
static uint16_t f32_to_f16_bits(float x) {
    float r = qva_round_f16(x);
    uint32_t bits;
    memcpy(&bits, &r, 4);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    float a = fabsf(r);
    if (isnan(r)) return (uint16_t)(sign | 0x7e00u);
    if (isinf(r)) return (uint16_t)(sign | 0x7c00u);
    if (a < 6.103515625e-05f) /* subnormal: multiple of 2^-24 */
        return (uint16_t)(sign | (uint16_t)ldexpf(a, 24));
    int e;
    float m = frexpf(a, &e); /* a = m 2^e, m in [0.5,1) */
    uint16_t mant = (uint16_t)((m * 2.0f - 1.0f) * 1024.0f);
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | mant);
}

void qvi_store_elem(const qva_tensor *t, int64_t off, float x) {
    switch (t->dtype) {
    case QVA_F32: ((float *)t->data)[off] = x; break;
    case QVA_BF16: {
        float r = qva_round_bf16(x);
        uint32_t bits;
        memcpy(&bits, &r, 4);
        ((uint16_t *)t->data)[off] = (uint16_t)(bits >> 16);
        break;
    }
    case QVA_F16: ((uint16_t *)t->data)[off] = f32_to_f16_bits(x); break;
    }
}

void qvi_load_head(const qva_tensor *t, int64_t b, int64_t h, float *dst) {
    const int64_t n = t->shape[2], d = t->shape[3];
    for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < d; ++c)
            dst[i * d + c] = qvi_load_elem(t, qvi_offset(t, b, h, i, c));
}

void qvi_store_head(const qva_tensor *t, int64_t b, int64_t h,
                    const float *src) {
    const int64_t n = t->shape[2], d = t->shape[3];
    for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < d; ++c)
            qvi_store_elem(t, qvi_offset(t, b, h, i, c), src[i * d + c]);
}

/* ------------------------------------------------------------ config */
void qva_config_default(qva_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->method = QVA_METHOD_VC8;
    cfg->expcast = 1;
    cfg->hadamard_seed = 0x9e3779b97f4a7c15ull;
    /* Chosen by `qvattn sweep-vsmooth` (docs/NUMERICS.md, V-Smooth). */
    cfg->vsmooth.clusters = 32;
    cfg->vsmooth.iters = 2;
    cfg->vsmooth.warm_start = 1;
    cfg->vsmooth.block = QVI_BLOCK;
    cfg->vsmooth.schedule = QVA_SCHEDULE_PAPER;
    cfg->vsmooth.refresh_every = 4;
    cfg->draft.lambda = 0.2f;
    cfg->draft.frac_skip = 0.85f;
    cfg->draft.frac16 = 0.15f;
    cfg->draft.capacity = QVI_BLOCK;
    cfg->check_finite = 1;
}

static const char *const method_names[QVA_METHOD_COUNT_] = {
    "exact", "bf16", "fp8", "sage8", "vc8", "sage4", "vc4", "draft"};

static int method_is_8bit(qva_method m) {
    return m == QVA_METHOD_FP8 || m == QVA_METHOD_SAGE8 || m == QVA_METHOD_VC8;
}
static int method_is_quantized(qva_method m) {
    return method_is_8bit(m) || m == QVA_METHOD_SAGE4 || m == QVA_METHOD_VC4;
}

/* A plain decimal number, digits[.digits][e[+-]digits] (what %g prints),
 * read without strtod: no sign, blank, hex, inf or nan, and no locale.
 * Returns the characters read, 0 if s does not start with such a number. */
static size_t scan_decimal(const char *s, double *out) {
    const char *p = s;
    uint64_t mant = 0;
    int exp10 = 0, digits = 0;
    for (; isdigit((unsigned char)*p); ++p, ++digits) {
        if (mant < 100000000000000000ull) mant = mant * 10 + (uint64_t)(*p - '0');
        else if (exp10 < 10000) ++exp10; /* past 17 digits: scale only */
    }
    if (!digits) return 0;
    if (*p == '.') {
        if (!isdigit((unsigned char)p[1])) return 0;
        for (++p; isdigit((unsigned char)*p); ++p)
            if (mant < 100000000000000000ull) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                --exp10;
            }
    }
    if (*p == 'e' || *p == 'E') {
        const char *e = p + 1;
        int neg = *e == '-', x = 0, n = 0;
        if (*e == '+' || *e == '-') ++e;
        for (; isdigit((unsigned char)*e); ++e, ++n)
            if (x < 10000) x = x * 10 + (*e - '0');
        if (!n) return 0;
        exp10 += neg ? -x : x;
        p = e;
    }
    /* 10^k is exact in a double for k <= 22: one correctly rounded step. */
    double v = (double)mant;
    if (mant == 0) v = 0.0; /* 0e999 */
    else if (exp10 >= 0 && exp10 <= 22) v *= pow(10.0, exp10);
    else if (exp10 < 0 && exp10 >= -22) v /= pow(10.0, -exp10);
    else v *= pow(10.0, exp10);
    *out = v;
    return (size_t)(p - s);
}

/* Parses "S0/S4/S8/S16" percentages into the draft fractions; *end is
 * where the method string goes on (its end or a '+' option). */
static qva_status parse_draft_quotas(const char *s, qva_draft_params *dp,
                                     const char **end) {
    double f[4];
    for (int i = 0; i < 4; ++i) {
        /* S0..S8 end at '/', S16 at the end or a '+' option (an exponent
         * such as 1.5e+1 may hold a '+' too) */
        size_t tok = strcspn(s, i < 3 ? "/" : "/+"), len = scan_decimal(s, &f[i]);
        if (i == 3 && len > tok && (s[len] == 0 || s[len] == '+'))
            tok = len;
        const int shown = tok < 40 ? (int)tok : 40; /* quoted in messages */
        if ((i < 3) != (s[tok] == '/'))
            return qvi_fail(QVA_ERR_PARSE,
                            "draft quotas need the form S0/S4/S8/S16, e.g. "
                            "draft@85/0/7.5/7.5");
        if (len != tok || tok == 0)
            return qvi_fail(QVA_ERR_PARSE,
                            "draft quota %d '%.*s' is not a plain decimal "
                            "number (digits with an optional fraction, no "
                            "sign, blank or hex), e.g. draft@85/0/7.5/7.5",
                            i + 1, shown, s);
        if (!isfinite(f[i]) || f[i] > 100)
            return qvi_fail(QVA_ERR_PARSE,
                            "draft quota %d '%.*s' is outside [0,100]: the "
                            "quotas are percentages, e.g. draft@85/0/7.5/7.5",
                            i + 1, shown, s);
        s += tok + (i < 3);
    }
    *end = s;
    if (fabs(f[0] + f[1] + f[2] + f[3] - 100.0) > 1e-3)
        return qvi_fail(QVA_ERR_PARSE,
                        "draft quotas %g/%g/%g/%g do not sum to 100", f[0],
                        f[1], f[2], f[3]);
    dp->frac_skip = (float)(f[0] / 100);
    dp->frac4 = (float)(f[1] / 100);
    dp->frac8 = (float)(f[2] / 100);
    dp->frac16 = (float)(f[3] / 100);
    return QVA_OK;
}

static qva_status parse_suffixes(const char *s, qva_config *c) {
    while (*s == '+') {
        ++s;
        size_t len = strcspn(s, "+");
        int *flag = len == 7 && !strncmp(s, "expcast", 7)    ? &c->expcast
                    : len == 8 && !strncmp(s, "hadamard", 8) ? &c->hadamard
                                                             : NULL;
        if (flag && *flag)
            return qvi_fail(QVA_ERR_PARSE, "method option '+%.*s' given twice",
                            (int)len, s);
        if (flag)
            *flag = 1;
        else
            return qvi_fail(QVA_ERR_PARSE,
                            "unknown method option '+%.*s' (expected "
                            "+expcast or +hadamard)",
                            (int)len, s);
        s += len;
    }
    if (*s)
        return qvi_fail(QVA_ERR_PARSE, "unexpected text '%s' in method", s);
    return QVA_OK;
}

qva_status qva_config_set_method(qva_config *cfg, const char *name) {
    if (!cfg || !name) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "NULL argument");
    qva_config c = *cfg;
    c.expcast = 0;
    c.hadamard = 0;
    size_t base = strcspn(name, "+@");
    int found = -1;
    for (int i = 0; i < QVA_METHOD_COUNT_; ++i)
        if (strlen(method_names[i]) == base && !strncmp(name, method_names[i], base))
            found = i;
    if (found < 0)
        return qvi_fail(QVA_ERR_PARSE,
                        "unknown method '%s' (valid: exact, bf16, fp8, sage8, "
                        "vc8, sage4, vc4, draft@S0/S4/S8/S16; options "
                        "+expcast, +hadamard)",
                        name);
    c.method = (qva_method)found;
    const char *rest = name + base;
    qva_status st;
    if (c.method == QVA_METHOD_DRAFT) {
        if (*rest != '@')
            return qvi_fail(QVA_ERR_PARSE,
                            "draft needs quotas: draft@S0/S4/S8/S16");
        if ((st = parse_draft_quotas(rest + 1, &c.draft, &rest)) != QVA_OK) return st;
    } else if (*rest == '@') {
        return qvi_fail(QVA_ERR_PARSE, "only draft takes @quotas");
    }
    if ((st = parse_suffixes(rest, &c)) != QVA_OK) return st;
    if (c.expcast && !(method_is_8bit(c.method) || c.method == QVA_METHOD_DRAFT))
        return qvi_fail(QVA_ERR_PARSE,
                        "+expcast applies to the 8-bit methods (fp8, sage8, "
                        "vc8, draft's INT8 phase), not %s",
                        method_names[c.method]);
    if (c.hadamard && !method_is_quantized(c.method))
        return qvi_fail(QVA_ERR_PARSE,
                        "+hadamard applies to quantized methods, not %s",
                        method_names[c.method]);
    *cfg = c;
    return QVA_OK;
}

qva_status qva_config_method_name(const qva_config *cfg, char *buf, size_t len) {
    if (!cfg || !buf || len == 0 || (unsigned)cfg->method >= QVA_METHOD_COUNT_)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "bad arguments");
    int n;
    if (cfg->method == QVA_METHOD_DRAFT)
        n = snprintf(buf, len, "draft@%g/%g/%g/%g", 100.0 * cfg->draft.frac_skip,
                     100.0 * cfg->draft.frac4, 100.0 * cfg->draft.frac8,
                     100.0 * cfg->draft.frac16);
    else
        n = snprintf(buf, len, "%s", method_names[cfg->method]);
    if (n >= 0 && (size_t)n < len && cfg->expcast)
        n += snprintf(buf + n, len - (size_t)n, "+expcast");
    if (n >= 0 && (size_t)n < len && cfg->hadamard)
        n += snprintf(buf + n, len - (size_t)n, "+hadamard");
    return (n < 0 || (size_t)n >= len)
               ? qvi_fail(QVA_ERR_INVALID_ARGUMENT, "buffer too small")
               : QVA_OK;
}

/* ------------------------------------------------------------ schedule */
qva_step_action qva_schedule_action(const qva_vsmooth_params *p, int step,
                                    int num_steps) {
    if (p->schedule == QVA_SCHEDULE_ALWAYS || num_steps <= 0)
        return QVA_STEP_GROUP;
    int window = num_steps / 4 + (num_steps % 4 != 0); /* ceil(n/4): VC App. A */
    int every = p->refresh_every > 0 ? p->refresh_every : 4;
    if (step >= window) return QVA_STEP_PLAIN;
    return step % every == 0 ? QVA_STEP_GROUP : QVA_STEP_REUSE;
}

/* ------------------------------------------------------------ context */
typedef struct vs_entry {
    int layer;
    int64_t b, h;
    qvi_vs_state st;
} vs_entry;

/* Every field but device (fixed at creation) is read and written only
 * under lock: see "Threads" in include/qvattn.h. */
struct qva_context {
    pthread_mutex_t lock;
    qva_device device;
    void *stream;
    int profiling;
    qva_timings timings;
    vs_entry *vs;
    size_t vs_len, vs_cap;
    void *slots[QVI_SLOT_COUNT_];
    void (*slot_dtor[QVI_SLOT_COUNT_])(void *);
};

qva_status qva_context_create(qva_context_t **ctx, qva_device device) {
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    *ctx = NULL;
    if (device != QVA_DEVICE_CPU && device != QVA_DEVICE_CUDA)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "unknown device %d", (int)device);
    if (device == QVA_DEVICE_CUDA && !qva_cuda_available())
        return qvi_fail(QVA_ERR_UNSUPPORTED,
                        "no CUDA device (or library built without CUDA)");
    qva_context_t *c = calloc(1, sizeof *c);
    if (!c) return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "context allocation");
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "context lock");
    }
    c->device = device;
    *ctx = c;
    return QVA_OK;
}

static void free_state(qva_context_t *c) {
    for (size_t i = 0; i < c->vs_len; ++i) {
        free(c->vs[i].st.perm);
        free(c->vs[i].st.centroids);
    }
    free(c->vs);
    c->vs = NULL;
    c->vs_len = c->vs_cap = 0;
    for (int s = 0; s < QVI_SLOT_COUNT_; ++s) {
        if (c->slots[s] && c->slot_dtor[s]) c->slot_dtor[s](c->slots[s]);
        c->slots[s] = NULL;
    }
}

void qva_context_free(qva_context_t *ctx) {
    if (!ctx) return;
    free_state(ctx);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

qva_status qva_context_reset(qva_context_t *ctx) {
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    qvi_context_lock(ctx);
    free_state(ctx);
    qvi_context_unlock(ctx);
    return QVA_OK;
}

qva_status qva_context_set_stream(qva_context_t *ctx, void *stream) {
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    qvi_context_lock(ctx);
    ctx->stream = stream;
    qvi_context_unlock(ctx);
    return QVA_OK;
}

void qvi_context_lock(qva_context_t *ctx) { pthread_mutex_lock(&ctx->lock); }
void qvi_context_unlock(qva_context_t *ctx) { pthread_mutex_unlock(&ctx->lock); }

void *qvi_context_stream(const qva_context_t *ctx) { return ctx->stream; }
int qvi_context_profiling(const qva_context_t *ctx) { return ctx->profiling; }
void qvi_context_set_timings(qva_context_t *ctx, const qva_timings *t) {
    ctx->timings = *t;
}

qva_status qva_context_set_profiling(qva_context_t *ctx, int on) {
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    qvi_context_lock(ctx);
    ctx->profiling = on != 0;
    qvi_context_unlock(ctx);
    return QVA_OK;
}

qva_status qva_context_last_timings(const qva_context_t *ctx, qva_timings *t) {
    if (!ctx || !t) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "NULL argument");
    qva_context_t *c = (qva_context_t *)ctx; /* the lock is not the state */
    qvi_context_lock(c);
    *t = c->timings;
    qvi_context_unlock(c);
    return QVA_OK;
}

void **qvi_context_slot(qva_context_t *ctx, qvi_slot slot,
                        void (**dtor)(void *)) {
    if (dtor && *dtor) ctx->slot_dtor[slot] = *dtor; /* register */
    else if (dtor) *dtor = ctx->slot_dtor[slot];     /* query    */
    return &ctx->slots[slot];
}

qvi_vs_state *qvi_context_vs_state(qva_context_t *ctx, int layer, int64_t b,
                                   int64_t h) {
    for (size_t i = 0; i < ctx->vs_len; ++i)
        if (ctx->vs[i].layer == layer && ctx->vs[i].b == b && ctx->vs[i].h == h)
            return &ctx->vs[i].st;
    if (ctx->vs_len == ctx->vs_cap) {
        size_t cap = ctx->vs_cap ? 2 * ctx->vs_cap : 64;
        vs_entry *p = realloc(ctx->vs, cap * sizeof *p);
        if (!p) return NULL;
        ctx->vs = p;
        ctx->vs_cap = cap;
    }
    vs_entry *e = &ctx->vs[ctx->vs_len++];
    memset(e, 0, sizeof *e);
    e->layer = layer;
    e->b = b;
    e->h = h;
    e->st.last_group_step = -1;
    return &e->st;
}

/* ------------------------------------------------------------ validation */
float qvi_sm_scale(const qva_config *cfg, int64_t d) {
    return cfg->sm_scale > 0 ? cfg->sm_scale : 1.0f / sqrtf((float)d);
}

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
    if (cfg->expcast && !(method_is_8bit(cfg->method) || cfg->method == QVA_METHOD_DRAFT))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "expcast needs an 8-bit method or draft");
    if (cfg->hadamard && !method_is_quantized(cfg->method))
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "hadamard needs a quantized method");
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
        if (p->schedule != QVA_SCHEDULE_PAPER && p->schedule != QVA_SCHEDULE_ALWAYS)
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
    *dense_warmup = pl.warmup;
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
                                const qva_tensor *lse) {
    return cfg->method == QVA_METHOD_DRAFT
               ? qvi_cpu_draft(ctx, cfg, q, k, v, out, lse)
               : qvi_cpu_attention(ctx, cfg, q, k, v, out, lse);
}

/* A head dim other than 64 and 128 on the CPU (include/qvattn.h,
 * qva_attention): the call on copies zero-padded to 64 or 128 channels
 * with sm_scale that of the original D, the padded output columns
 * dropped.  out's padded copy starts as out, so the heads a failing call
 * leaves unwritten keep what they held. */
static qva_status cpu_attention_padded(qva_context_t *ctx, const qva_config *cfg,
                                       const qva_tensor *q, const qva_tensor *k,
                                       const qva_tensor *v, const qva_tensor *out,
                                       const qva_tensor *lse) {
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
        st = cpu_attention(ctx, &c, &pq, &pk, &pv, &po, lse);
        unpad_head_dim(&po, out);
    }
    free(pq.data), free(pk.data), free(pv.data), free(po.data);
    return st;
}

qva_status qva_attention(qva_context_t *ctx, const qva_config *cfg_in,
                         const qva_tensor *q, const qva_tensor *k,
                         const qva_tensor *v, const qva_tensor *out,
                         const qva_tensor *lse) {
    qvi_clear_error();
    if (!ctx) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "ctx is NULL");
    qva_status st = qvi_validate_call(cfg_in, q, k, v, out, lse, ctx->device);
    if (st != QVA_OK) return st;
    qva_config cfgv = *cfg_in;
    const qva_config *cfg = &cfgv;
    if (cfgv.layer == QVA_LAYER_NONE) { /* stateless (include/qvattn.h) */
        cfgv.vsmooth.schedule = QVA_SCHEDULE_ALWAYS;
        cfgv.vsmooth.warm_start = 0;
    }
    if (ctx->device == QVA_DEVICE_CUDA) {
        char why[256];
        if (!qvi_cuda_supports(cfg, q->dtype, q->shape[3], q->shape[1] / k->shape[1], why,
                               sizeof why))
            return qvi_fail(QVA_ERR_UNSUPPORTED, "cuda backend: %s", why);
        qvi_context_lock(ctx);
        st = qvi_cuda_attention(ctx, cfg, q, k, v, out, lse);
        qvi_context_unlock(ctx);
        return st;
    }
    struct timespec t0, t1;
    qvi_context_lock(ctx);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = q->shape[3] == padded_head_dim(q->shape[3])
             ? cpu_attention(ctx, cfg, q, k, v, out, lse)
             : cpu_attention_padded(ctx, cfg, q, k, v, out, lse);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    qva_timings tm = {0.0f, 0.0f,
                      (float)((double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                              (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6)};
    ctx->timings = tm; /* the CPU reference does not separate phases */
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
           ", " QVA_BUILD_TYPE ")";
}
