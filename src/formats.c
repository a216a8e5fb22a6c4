/*
 * Number formats and small transforms shared by every method: E4M3, E2M1,
 * BF16/FP16 rounding, NVFP4 groups (DA2 Eq. 23-24), INT8 (DA2 C.3),
 * ExpCast-FP8 (VC Eq. 7) and the orthonormal Hadamard transform.
 *
 * Everything here is bit-exact and deterministic: each function documents
 * the float expression it evaluates (the CUDA backend replicates them), and
 * docs/NUMERICS.md collects the rules.  All rounding assumes the default
 * floating-point environment (round-to-nearest-even, no flush-to-zero); the
 * library never changes it.  Scalar float math only: with -std=c11 GCC does
 * not contract a*b+c into an FMA, and the one FMA we want is written out.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* ====================================================== helpers */

/* Exponent e of the binade [2^e, 2^(e+1)) holding a >= 0, but never below
 * emin: a format's subnormals share the quantum of its lowest normal
 * binade, so clamping the exponent is all subnormal rounding needs. */
static int binade_exponent(float a, int emin) {
    if (!(a >= ldexpf(1.0f, emin)))
        return emin;
    int e2;
    (void)frexpf(a, &e2); /* a = f * 2^e2 with f in [0.5, 1) */
    return e2 - 1;
}

/* Rounds finite a >= 0 to the grid of a binary format with mbits stored
 * mantissa bits and minimum normal exponent emin (no overflow handling).
 * Scaling by powers of two is exact, so rintf is the only rounding. */
static float round_to_grid(float a, int mbits, int emin) {
    int e = binade_exponent(a, emin);
    return ldexpf(rintf(ldexpf(a, mbits - e)), e - mbits);
}

static float max_abs_strided(const float *x, size_t stride, size_t len) {
    float m = 0.0f;
    for (size_t i = 0; i < len; ++i)
        m = fmaxf(m, fabsf(x[i * stride])); /* fmaxf skips NaN */
    return m;
}

/* ====================================================== E4M3 */

/*
 * Code of a magnitude a in [0, 448].  With e the clamped binade exponent
 * (emin = -6) the quantum is 2^(e-3), and n = RNE(a / 2^(e-3)) lies in
 * [8, 16] for normals ([0, 8] in the subnormal range).  The code is then
 * 8(e+7) + (n - 8) = 8e + 48 + n: a mantissa carry (n = 16) lands on the
 * next exponent by plain addition, and for e = -6 the code is simply n,
 * which covers subnormals and the subnormal-to-normal carry alike.
 */
static unsigned e4m3_magnitude_code(float a) {
    int e = binade_exponent(a, -6);
    int n = (int)rintf(ldexpf(a, 3 - e));
    return (unsigned)(8 * e + 48 + n);
}

uint8_t qva_e4m3_encode(float x) {
    if (isnan(x))
        return 0x7F;
    unsigned sign = signbit(x) ? 0x80u : 0x00u;
    float a = fabsf(x);
    /* Saturate before rounding: every real value above 448 (also +Inf)
     * maps to 448, since E4M3 has no Inf and 0x7F is NaN. */
    if (a > 448.0f)
        a = 448.0f;
    return (uint8_t)(sign | e4m3_magnitude_code(a));
}

float qva_e4m3_decode(uint8_t code) {
    unsigned e = (code >> 3) & 0xFu, m = code & 7u;
    float mag;
    if (e == 15u && m == 7u)
        mag = NAN;
    else if (e == 0u)
        mag = ldexpf((float)m, -9); /* subnormal: m/8 * 2^-6 */
    else
        mag = ldexpf((float)(8u + m), (int)e - 10); /* (1+m/8) 2^(e-7) */
    return (code & 0x80u) ? -mag : mag;
}

/* ====================================================== ExpCast-FP8 */

/*
 * VC Eq. 7 with the affine part folded into one FMA:
 *     t = fmaf(8.0f, u, 120.0f + beta),   119.65f = 64 + 56 + beta for the
 *     paper's beta = -0.35
 * (8(u+8) + 56 + beta = 8u + 120 + beta; the float constant 119.65f is
 * 0x42EF4CCD = 119.650001525878906, the same float 120.0f + beta gives).
 * Then clip to [0, 120] and RNE with rintf.  Clipping before rounding is
 * equivalent to Eq. 7's clip(Round()) because both bounds are integers.
 * NaN gives 0, as does any t < 0 (u < -14.956...); u > 0 gives 120.
 */
uint8_t qva_expcast_e4m3_beta(float u, float beta) {
    float t = fmaf(8.0f, u, 120.0f + beta);
    if (!(t >= 0.0f)) /* NaN or underflow */
        return 0;
    if (t > 120.0f)
        t = 120.0f;
    return (uint8_t)rintf(t);
}

uint8_t qva_expcast_e4m3(float u) { return qva_expcast_e4m3_beta(u, QVA_EXPCAST_BETA); }

/* E5M2 (bias 15, 2 mantissa bits), the codes 0..123 this file makes
 * (sign and Inf/NaN never occur for P). */
float qvi_e5m2_decode(uint8_t code) {
    unsigned e = (code >> 2) & 0x1Fu, m = code & 3u;
    if (e == 0u) return ldexpf((float)m, -16);      /* subnormal: m/4 * 2^-14 */
    return ldexpf((float)(4u + m), (int)e - 17);    /* (1+m/4) 2^(e-15) */
}

/* The same construction in E5M2: t = fmaf(4, u, 120 + beta), clipped to
 * [0, 120] and rounded; code 120 is 2^15, the row max.  Codes below 4 are
 * E5M2 subnormals (u below about -29), far under any weight that moves an
 * output, so the tail E4M3's code loses below 2^-14.94 is kept. */
uint8_t qvi_expcast_e5m2(float u, float beta) {
    float t = fmaf(4.0f, u, 120.0f + beta);
    if (!(t >= 0.0f)) return 0;
    if (t > 120.0f) t = 120.0f;
    return (uint8_t)rintf(t);
}

/* ====================================================== E2M1 (FP4) */

static const float kE2M1Mag[8] = {0.0f, 0.5f, 1.0f, 1.5f,
                                  2.0f, 3.0f, 4.0f, 6.0f};

/*
 * Nearest magnitude by walking the seven midpoints; a value exactly on a
 * midpoint goes to the even code (ties-to-even on the code's low bit, the
 * mantissa bit).  Above the last midpoint (5) everything saturates to 6,
 * +Inf included.  The sign is kept even when the magnitude rounds to zero
 * (-0.1 -> 0x8, "-0"), like IEEE; NaN has no FP4 encoding and gives 0.
 */
uint8_t qva_e2m1_encode(float x) {
    if (isnan(x))
        return 0;
    unsigned sign = signbit(x) ? 0x8u : 0x0u;
    float a = fabsf(x);
    unsigned c = 0;
    while (c < 7u) {
        float mid = 0.5f * (kE2M1Mag[c] + kE2M1Mag[c + 1]); /* exact */
        if (a < mid || (a == mid && (c & 1u) == 0u))
            break;
        ++c;
    }
    return (uint8_t)(sign | c);
}

/* Only the low 4 bits of code are read. */
float qva_e2m1_decode(uint8_t code) {
    float mag = kE2M1Mag[code & 7u];
    return (code & 0x8u) ? -mag : mag;
}

/* ====================================================== BF16 / FP16 */

/* Classic bias trick: adding 0x7FFF plus the kept LSB rounds the low 16
 * bits to nearest-even, and a carry out of the mantissa increments the
 * exponent (reaching Inf from the top binade), exactly IEEE RNE. */
float qva_round_bf16(float x) {
    if (isnan(x))
        return copysignf(NAN, x); /* a NaN bf16 can represent */
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    b += 0x7FFFu + ((b >> 16) & 1u);
    b &= 0xFFFF0000u;
    memcpy(&x, &b, sizeof b);
    return x;
}

/* IEEE binary16: 10 mantissa bits, emin = -14 (subnormal quantum 2^-24).
 * 65520 is the midpoint between 65504 and 2^16; RNE sends it and anything
 * larger to Inf (65504 has an odd mantissa). */
float qva_round_f16(float x) {
    if (isnan(x))
        return copysignf(NAN, x);
    float a = fabsf(x);
    if (a >= 65520.0f)
        return copysignf(INFINITY, x);
    return copysignf(round_to_grid(a, 10, -14), x);
}

/* ====================================================== NVFP4 (DA2 Eq. 23) */

#define QVI_NVFP4_GROUP 16
#define QVI_NVFP4_RANGE 2688.0f /* 6 * 448: E2M1 max times E4M3 max */

/* g = amax / 2688 so the largest group scale lands at E4M3's 448.  Any
 * amax that would not give a positive finite g (0, negative, NaN, Inf, or
 * a subnormal amax whose quotient underflows) gives g = 1 instead. */
float qva_nvfp4_tensor_scale(float amax) {
    if (!isfinite(amax))
        return 1.0f;
    float g = amax / QVI_NVFP4_RANGE;
    return (g > 0.0f) ? g : 1.0f;
}

/*
 * One group of len values at stride: scale code
 *     sc = e4m3(amax / (6.0f * g))              (6.0f*g rounded first)
 * and, when sigma = decode(sc) != 0, codes e2m1(x / (g * sigma)) with
 * (g * sigma) rounded first.  A zero sigma zeroes the group (Eq. 23).
 */
static uint8_t nvfp4_group(const float *x, size_t stride, size_t len,
                           float g, uint8_t *codes) {
    float amax = max_abs_strided(x, stride, len);
    uint8_t sc = qva_e4m3_encode(amax / (6.0f * g));
    float sigma = qva_e4m3_decode(sc);
    float denom = g * sigma;
    for (size_t i = 0; i < len; ++i)
        codes[i] = (sigma == 0.0f) ? 0 : qva_e2m1_encode(x[i * stride] / denom);
    return sc;
}

/* n need not be a multiple of 16: a trailing partial group is coded as a
 * group of its own (scale_codes then has ceil(n/16) entries). */
void qva_nvfp4_quantize(const float *x, size_t n, float g, uint8_t *codes,
                        uint8_t *scale_codes) {
    if (!x || !codes || !scale_codes)
        return;
    for (size_t i0 = 0; i0 < n; i0 += QVI_NVFP4_GROUP) {
        size_t len = (n - i0 < QVI_NVFP4_GROUP) ? n - i0 : QVI_NVFP4_GROUP;
        scale_codes[i0 / QVI_NVFP4_GROUP] =
            nvfp4_group(x + i0, 1, len, g, codes + i0);
    }
}

/* out = (g * sigma) * e2m1: the product g*sigma rounded first. */
void qva_nvfp4_dequantize(const uint8_t *codes, const uint8_t *scale_codes,
                          size_t n, float g, float *out) {
    if (!codes || !scale_codes || !out)
        return;
    for (size_t i = 0; i < n; ++i) {
        float gs = g * qva_e4m3_decode(scale_codes[i / QVI_NVFP4_GROUP]);
        out[i] = gs * qva_e2m1_decode(codes[i]);
    }
}

/*
 * DA2 Eq. 24, per element:
 *     sigma = decode(e4m3(448.0f * max|p|))
 *     p     = (sigma / 2688.0f) * e2m1((2688.0f * p) / sigma)
 * and all zeros when sigma == 0.  max|p| equals max p for probabilities.
 */
void qva_nvfp4_quantize_probs16(float *p16) {
    if (!p16)
        return;
    float pmax = max_abs_strided(p16, 1, QVI_NVFP4_GROUP);
    float sigma = qva_e4m3_decode(qva_e4m3_encode(448.0f * pmax));
    float step = sigma / QVI_NVFP4_RANGE;
    for (int i = 0; i < QVI_NVFP4_GROUP; ++i) {
        if (sigma == 0.0f) {
            p16[i] = 0.0f;
            continue;
        }
        uint8_t c = qva_e2m1_encode((QVI_NVFP4_RANGE * p16[i]) / sigma);
        p16[i] = step * qva_e2m1_decode(c);
    }
}

/* ====================================================== INT8 (DA2 C.3) */

/* roundf rounds half away from zero, which is DA2's rule; the clamp comes
 * first so that huge inputs never reach an out-of-range conversion. NaN
 * gives 0. */
int8_t qva_int8_round(float x_over_delta) {
    if (isnan(x_over_delta))
        return 0;
    if (x_over_delta >= 127.0f)
        return 127;
    if (x_over_delta <= -127.0f)
        return -127;
    return (int8_t)roundf(x_over_delta);
}

/* delta = amax / 127.0f + 1e-7f (two float roundings, in that order);
 * codes[i] = int8_round(x[i] / delta).  The 1e-7 keeps delta > 0 for an
 * all-zero input, whose codes are then 0. */
float qva_int8_quantize(const float *x, size_t n, int8_t *codes) {
    float amax = x ? max_abs_strided(x, 1, n) : 0.0f;
    float delta = amax / 127.0f + 1e-7f;
    if (x && codes)
        for (size_t i = 0; i < n; ++i)
            codes[i] = qva_int8_round(x[i] / delta);
    return delta;
}

/* ====================================================== Hadamard */

/*
 * Unnormalised fast Walsh-Hadamard butterflies (a+b, a-b) with strides
 * 1, 2, 4, ...: the result is H_n x with H_n in Sylvester order,
 * H_n[i][j] = (-1)^popcount(i & j).  The 1/sqrt(n) factor is applied once
 * at the end as the float (float)(1.0 / sqrt((double)n)), exact when n is
 * a power of 4.
 */
qva_status qva_hadamard(float *x, int n, const float *signs) {
    if (!x)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "qva_hadamard: x is NULL");
    if (n < 1 || (n & (n - 1)) != 0)
        return qvi_fail(QVA_ERR_INVALID_ARGUMENT,
                        "qva_hadamard: n = %d is not a power of two", n);
    if (signs)
        for (int i = 0; i < n; ++i)
            x[i] *= signs[i];
    for (int h = 1; h < n; h *= 2) {
        for (int i = 0; i < n; i += 2 * h) {
            for (int j = i; j < i + h; ++j) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
    float s = (float)(1.0 / sqrt((double)n));
    for (int i = 0; i < n; ++i)
        x[i] *= s;
    return QVA_OK;
}

/* ====================================================== operands */

/* splitmix64 (Steele, Lea, Flood 2014): state += 0x9E3779B97F4A7C15, then
 * the output mix of the incremented state. */
static uint64_t splitmix64_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* signs[i] = -1 if bit 63 of the (i+1)-th splitmix64 draw from state
 * cfg->hadamard_seed is set, else +1; all +1 when cfg is NULL or
 * cfg->hadamard_signs is 0. */
void qvi_hadamard_signs(const qva_config *cfg, int d, float *signs) {
    if (!signs)
        return;
    int randomized = cfg && cfg->hadamard_signs;
    uint64_t state = randomized ? cfg->hadamard_seed : 0;
    for (int i = 0; i < d; ++i)
        signs[i] = (randomized && (splitmix64_next(&state) >> 63)) ? -1.0f
                                                                   : 1.0f;
}

/* The tree (docs/NUMERICS.md §4): leaf i is the chain ((x_i + x_{i+32}) +
 * x_{i+64}) + x_{i+96}, then leaves and nodes are added in pairs in index
 * order, (2k) + (2k+1), up to one sum.  Why a tree in FP32: a GPU makes
 * the leaves in registers and the pairs by shuffles, where a sum in row
 * order was one thread per channel walking the block, half the CTA idle.
 * The pairs are kept by a binary counter: level b holds the pending left
 * node, and leaf i closes the levels its trailing one bits name. */
_Static_assert(QVI_BLOCK == 128 && QVI_TREE_LEAVES == 32, "five levels over 32 leaves of 4 rows");
float qvi_block_sum(const float *x, int n, int d, int r0, int c) {
    float level[6] = {0.0f};
    for (int i = 0; i < QVI_TREE_LEAVES; ++i) {
        float node = 0.0f;
        for (int t = 0; t < QVI_BLOCK / QVI_TREE_LEAVES; ++t) {
            const int r = r0 + i + t * QVI_TREE_LEAVES;
            const float v = r < n ? x[(size_t)r * (size_t)d + (size_t)c] : 0.0f;
            node = t ? node + v : v;
        }
        int b = 0;
        for (; (i >> b) & 1; ++b) node = level[b] + node;
        level[b] = node;
    }
    return level[5];
}

float qvi_block_mean(const float *x, int n, int d, int r0, int c) {
    const int len = n - r0 < QVI_BLOCK ? n - r0 : QVI_BLOCK;
    return qvi_block_sum(x, n, d, r0, c) / (float)len;
}

/* mean[c] = (float)(S / n); zeros for n <= 0.  S is the FP64 sum, in block
 * order, of each QVI_BLOCK-row block's FP32 tree sum (qvi_block_sum).  The
 * blocks are independent, so the GPU sums them in parallel and still gives
 * these roundings bit for bit (docs/NUMERICS.md, "K smoothing"). */
void qvi_channel_mean(const float *x, int n, int d, float *mean) {
    for (int c = 0; c < d; ++c) {
        double s = 0.0;
        for (int r0 = 0; r0 < n; r0 += QVI_BLOCK) s += (double)qvi_block_sum(x, n, d, r0, c);
        mean[c] = (n > 0) ? (float)(s / (double)n) : 0.0f;
    }
}

/* Rows of block b of a matrix with n_pad rows (the last block may be
 * short when n_pad is not a multiple of QVI_BLOCK). */
static int block_rows(int n_pad, int b) {
    int left = n_pad - b * QVI_BLOCK;
    return left < QVI_BLOCK ? left : QVI_BLOCK;
}

/*
 * Ownership of the qvi_i8 / qvi_f8 arrays: allocated here with malloc, one
 * allocation per field, released by the caller with free() on each field.
 * On allocation failure every field is NULL (nothing leaks), so callers
 * test out->codes.  n_pad and d must be positive.
 */
void qvi_quant_i8(const float *x, int n_pad, int d, int rows_per_scale, qvi_i8 *out) {
    int ngrp = qvi_cdiv(n_pad, rows_per_scale);
    out->rows_per_scale = rows_per_scale;
    out->codes = malloc((size_t)n_pad * (size_t)d);
    out->scale = malloc((size_t)ngrp * sizeof(float));
    if (!out->codes || !out->scale) {
        free(out->codes);
        free(out->scale);
        out->codes = NULL;
        out->scale = NULL;
        return;
    }
    for (int b = 0; b < ngrp; ++b) {
        int rows = n_pad - b * rows_per_scale;
        size_t off = (size_t)b * (size_t)rows_per_scale * (size_t)d;
        size_t len = (size_t)(rows < rows_per_scale ? rows : rows_per_scale) * (size_t)d;
        out->scale[b] = qva_int8_quantize(x + off, len, out->codes + off);
    }
}

int qvi_q_rows_per_scale(const qva_config *cfg) {
    return cfg->q_granularity == QVA_Q_PER_BLOCK ? QVI_BLOCK : 1;
}

/* Block scale amax/448.0f; 1.0f when that is not positive and finite (a
 * zero block, or amax so small the quotient underflows).  Codes are
 * e4m3(x / scale); chan_scale is all 1 (no per-channel factor here). */
void qvi_quant_e4m3_blocks(const float *x, int n_pad, int d, qvi_f8 *out) {
    int nblk = qvi_cdiv(n_pad, QVI_BLOCK);
    out->codes = malloc((size_t)n_pad * (size_t)d);
    out->block_scale = malloc((size_t)nblk * sizeof(float));
    out->chan_scale = malloc((size_t)d * sizeof(float));
    if (!out->codes || !out->block_scale || !out->chan_scale) {
        free(out->codes);
        free(out->block_scale);
        free(out->chan_scale);
        out->codes = NULL;
        out->block_scale = NULL;
        out->chan_scale = NULL;
        return;
    }
    for (int c = 0; c < d; ++c)
        out->chan_scale[c] = 1.0f;
    for (int b = 0; b < nblk; ++b) {
        size_t off = (size_t)b * QVI_BLOCK * (size_t)d;
        size_t len = (size_t)block_rows(n_pad, b) * (size_t)d;
        float scale = max_abs_strided(x + off, 1, len) / 448.0f;
        if (!(scale > 0.0f) || !isfinite(scale))
            scale = 1.0f;
        out->block_scale[b] = scale;
        for (size_t i = 0; i < len; ++i)
            out->codes[off + i] = qva_e4m3_encode(x[off + i] / scale);
    }
}

/* One strided NVFP4 group written as sigma * e2m1 (the reconstruction
 * divided by g; the product of a 4-bit and a 2-bit significand is exact). */
static void nvfp4_group_unscaled(const float *x, size_t stride, size_t len,
                                 float g, float *out) {
    uint8_t codes[QVI_NVFP4_GROUP];
    float sigma = qva_e4m3_decode(nvfp4_group(x, stride, len, g, codes));
    for (size_t i = 0; i < len; ++i)
        out[i * stride] = sigma * qva_e2m1_decode(codes[i]);
}

/* g from the amax of all n_pad*d values, then groups of 16 channels of
 * each row (a short last group if d % 16 != 0).  Returns g. */
float qvi_quant_nvfp4_rows(const float *x, int n_pad, int d, float *out) {
    size_t total = (size_t)n_pad * (size_t)d;
    float g = qva_nvfp4_tensor_scale(max_abs_strided(x, 1, total));
    for (int r = 0; r < n_pad; ++r) {
        size_t row = (size_t)r * (size_t)d;
        for (int c0 = 0; c0 < d; c0 += QVI_NVFP4_GROUP) {
            size_t len = (size_t)(d - c0 < QVI_NVFP4_GROUP ? d - c0
                                                           : QVI_NVFP4_GROUP);
            nvfp4_group_unscaled(x + row + (size_t)c0, 1, len, g,
                                 out + row + (size_t)c0);
        }
    }
    return g;
}

/* Same with groups of 16 consecutive rows of each channel (V operand, the
 * PV reduction runs over tokens).  Returns g. */
float qvi_quant_nvfp4_cols(const float *x, int n_pad, int d, float *out) {
    size_t total = (size_t)n_pad * (size_t)d;
    float g = qva_nvfp4_tensor_scale(max_abs_strided(x, 1, total));
    for (int r0 = 0; r0 < n_pad; r0 += QVI_NVFP4_GROUP) {
        size_t len = (size_t)(n_pad - r0 < QVI_NVFP4_GROUP ? n_pad - r0
                                                           : QVI_NVFP4_GROUP);
        for (int c = 0; c < d; ++c) {
            size_t off = (size_t)r0 * (size_t)d + (size_t)c;
            nvfp4_group_unscaled(x + off, (size_t)d, len, g, out + off);
        }
    }
    return g;
}
