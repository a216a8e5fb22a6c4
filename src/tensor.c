/* Tensor descriptors, element access in any supported dtype, and the
 * softmax scale: used by the core and both backends. */
#include <math.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

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
    case QVA_F16: return qvi_f16_bits_to_float(((const uint16_t *)t->data)[off]);
    }
    return 0.0f;
}

float qvi_f16_bits_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    float f;
    if (e == 0) {
        f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    uint32_t bits = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
    memcpy(&f, &bits, 4);
    return f;
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


float qvi_sm_scale(const qva_config *cfg, int64_t d) {
    return cfg->sm_scale > 0 ? cfg->sm_scale : 1.0f / sqrtf((float)d);
}
