/*
 * The division-free 8-bit codes of src/cuda/common/quant_code.cuh against
 * the CPU reference (qva_int8_round(x / delta), qva_e4m3_encode(x / s)),
 * on quotients chosen to sit on and next to rounding boundaries, where the
 * fast quotient x * (1/delta) and the IEEE quotient may round apart:
 *   INT8: x = (j + 0.5) * delta and its neighbours (exact ties where
 *         delta is a power of two), the clamp at +-127, NaN, infinities,
 *         zero and non-finite deltas; the bounded form (qk_plain.cu's) on
 *         cases that meet its precondition, delta from their own amax;
 *   E4M3: x = mid * s for the midpoints between adjacent E4M3 values
 *         (normal and subnormal), the saturation at 448, non-normal
 *         scales and values the scale does not bound (the exact path's
 *         guard); and every bf16 x against V's scales fl(amax / 2.25)
 *         for bf16 amax of many significands (where x / s lands on an
 *         E4M3 midpoint up to the scale's rounding); the one-step form
 *         (qvc_e4m3_codes4_in16) on every bf16 and f16 x against both
 *         scales of sampled amax of the format.
 * Every case must match bit for bit.  The test also counts the cases
 * where the plain rounding of the fast quotient would have been wrong, so
 * it proves it can fail.  Needs a GPU; without one it exits 77 (skipped).
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "common/quant_code.cuh"
#include "qvattn.h"
#include "internal.h"

struct code_case {
    float x[4];
    float s[4]; /* INT8: s[0] is delta */
};

__global__ void int8_codes_kernel(const code_case *c, int n, uint32_t *fast, uint32_t *naive) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float d = c[i].s[0], r = __frcp_rn(d);
    fast[i] = qvc_int8_codes4(c[i].x, d, r);
    /* the fast path without its guard: the clamped product, rounded by
     * the magic-add */
    uint32_t w = 0;
    for (int e = 0; e < 4; ++e) {
        const float y = fminf(fmaxf(__fmul_rn(c[i].x[e], r), -127.0f), 127.0f);
        w |= (__float_as_uint(__fadd_rn(y, QVC_INT8_MAGIC)) & 0xFFu) << (8 * e);
    }
    naive[i] = w;
}

/* The bounded form (qvc_int8_codes4_bounded: |x| <= the amax behind delta,
 * so |x / delta| <= 127 and the clamp test is dropped); its naive twin is
 * the single-FMA rounding without the half-integer guard. */
__global__ void int8_bounded_kernel(const code_case *c, int n, uint32_t *fast, uint32_t *naive) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float d = c[i].s[0], r = __frcp_rn(d);
    fast[i] = qvc_int8_codes4_bounded(c[i].x, d, r);
    uint32_t w = 0;
    for (int e = 0; e < 4; ++e)
        w |= (__float_as_uint(__fmaf_rn(c[i].x[e], r, QVC_INT8_MAGIC)) & 0xFFu) << (8 * e);
    naive[i] = w;
}

template <bool IN16>
__global__ void e4m3_codes_kernel(const code_case *c, int n, uint32_t *fast, uint32_t *naive) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float r[4];
    bool ok = true;
    for (int e = 0; e < 4; ++e) {
        r[e] = __frcp_rn(c[i].s[e]);
        ok = ok && qvc_e4m3_fast_ok(c[i].s[e], r[e]);
        ok = ok && !(fabsf(c[i].x[e]) > 0x1p64f * c[i].s[e]); /* the callers' bound (NaN passes) */
    }
    fast[i] = IN16 ? qvc_e4m3_codes4_in16(c[i].x, c[i].s, r, ok) : qvc_e4m3_codes4(c[i].x, c[i].s, r, ok);
    uint32_t w = 0;
    for (int e = 0; e < 4; ++e) w |= qvc_e4m3_code(__fmul_rn(c[i].x[e], r[e])) << (8 * e);
    naive[i] = w;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double unit() {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
/* A positive float spread over many binades: m * 2^e. */
static float spread(int lo, int hi) {
    return ldexpf((float)(1.0 + unit()), lo + (int)(unit() * (hi - lo + 1)));
}
static float sgn(float v) { return unit() < 0.5 ? -v : v; }

/* The float at k ulps from v (toward +inf for k > 0). */
static float ulps(float v, int k) {
    for (; k > 0; --k) v = nextafterf(v, INFINITY);
    for (; k < 0; ++k) v = nextafterf(v, -INFINITY);
    return v;
}

static std::vector<code_case> int8_cases() {
    std::vector<code_case> cs;
    const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e30f, -1e30f};
    for (int t = 0; t < 200000; ++t) {
        code_case c;
        /* delta as the quantizers make it (amax/127 + 1e-7), some powers of
         * two (exact ties), and rarely a non-finite one */
        float d = t % 3 == 0 ? ldexpf(1.0f, (int)(unit() * 12) - 6)
                             : (float)(spread(-12, 8) / 127.0f) + 1e-7f;
        if (t % 997 == 0) d = t % 2 ? INFINITY : NAN;
        for (int e = 0; e < 4; ++e) {
            const int j = (int)(unit() * 256.0) - 128; /* ties from -127.5 to 127.5 */
            float x = (float)((double)j + 0.5) * d;
            x = ulps(x, (int)(unit() * 7.0) - 3);
            if (unit() < 0.02) x = specials[(int)(unit() * 7.0)];
            if (unit() < 0.05) x = sgn((float)(unit() * 140.0)) * d; /* anywhere, past the clamp too */
            c.x[e] = x;
        }
        c.s[0] = c.s[1] = c.s[2] = c.s[3] = d;
        cs.push_back(c);
    }
    return cs;
}

/* Cases that meet the bounded form's precondition: delta is the
 * quantizers' fl(fl(amax / 127) + 1e-7) of an amax at least every |x| of
 * the case (the case's own largest value, or one just above it), the
 * values on and next to the ties (j + 0.5) delta, |j| <= 126, and at the
 * top of the range; NaN values (skipped by the amax, as fmaxf skips them);
 * an infinite value (amax, hence delta, infinite: every code 0 or the
 * NaN's). */
static std::vector<code_case> int8_bounded_cases() {
    std::vector<code_case> cs;
    for (int t = 0; t < 200000; ++t) {
        code_case c;
        const float d0 = t % 3 == 0 ? ldexpf(1.0f, (int)(unit() * 12) - 6)
                                    : (float)(spread(-12, 8) / 127.0f) + 1e-7f;
        float amax = 0.0f;
        for (int e = 0; e < 4; ++e) {
            const int j = (int)(unit() * 254.0) - 127; /* ties from -126.5 to 126.5 */
            float x = ulps((float)((double)j + 0.5) * d0, (int)(unit() * 7.0) - 3);
            if (unit() < 0.05) x = sgn((float)(unit() * 127.0)) * d0;
            c.x[e] = x;
        }
        if (t % 5 == 0) c.x[(int)(unit() * 4.0)] = sgn(127.0f * d0); /* the top code */
        if (t % 101 == 0) c.x[(int)(unit() * 4.0)] = NAN;
        if (t % 499 == 0) c.x[(int)(unit() * 4.0)] = sgn(INFINITY);
        for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(c.x[e]));
        if (t % 2) amax = ulps(amax, (int)(unit() * 4.0)); /* a block max above these four */
        const float d = amax / 127.0f + 1e-7f; /* -std=c++17 host: IEEE, not contracted */
        c.s[0] = c.s[1] = c.s[2] = c.s[3] = d;
        cs.push_back(c);
    }
    return cs;
}

/* All non-negative finite E4M3 values in increasing order. */
static std::vector<float> e4m3_values() {
    std::vector<float> v;
    for (int m = 0; m < 8; ++m) v.push_back(ldexpf((float)m, -9)); /* zero and subnormals */
    for (int e = -6; e <= 8; ++e)
        for (int m = 0; m < 8; ++m) {
            const float y = ldexpf(1.0f + m / 8.0f, e);
            if (y <= 448.0f) v.push_back(y);
        }
    return v;
}

static std::vector<code_case> e4m3_cases() {
    const std::vector<float> vals = e4m3_values();
    std::vector<code_case> cs;
    const float odd_scales[] = {1e-40f, 0.0f, INFINITY, NAN, 3e38f};
    for (int t = 0; t < 200000; ++t) {
        code_case c;
        for (int e = 0; e < 4; ++e) {
            float s = spread(-20, 10);
            if (t % 1009 == 0) s = odd_scales[(int)(unit() * 5.0)];
            const size_t k = (size_t)(unit() * (double)(vals.size() - 1));
            double mid = 0.5 * ((double)vals[k] + (double)vals[k + 1]);
            if (unit() < 0.03) mid = 448.0 + unit() * 64.0; /* saturation */
            float x = sgn((float)(mid * (double)s));
            x = ulps(x, (int)(unit() * 7.0) - 3);
            if (unit() < 0.01) x = unit() < 0.5 ? NAN : sgn(INFINITY);
            c.x[e] = x;
            c.s[e] = s;
        }
        cs.push_back(c);
    }
    return cs;
}

/* Every finite bf16 (f16: bf16 = 0) x with |x| <= amax against s =
 * fl(amax / 2.25) (V's channel scale, DA2 C.3) and, with s448, also
 * fl(amax / 448), for amax of every 3rd significand of the format times a
 * few binades: the values V's codes meet. */
static std::vector<code_case> e4m3_16bit_cases(int bf16, int s448) {
    std::vector<code_case> cs;
    const int sigs = bf16 ? 128 : 1024;
    for (int sig = 0; sig < sigs; sig += bf16 ? 3 : 97)
        for (int ex = -3; ex <= 9; ex += 6)
            for (int k = 0; k <= s448; ++k) {
                const float amax = ldexpf(1.0f + (float)sig / (float)sigs, ex);
                const float s = k ? amax / 448.0f : amax / 2.25f;
                code_case c;
                int e = 0;
                for (uint32_t b = 0; b < 0x10000u; ++b) {
                    float x;
                    if (bf16) {
                        const uint32_t u = b << 16;
                        memcpy(&x, &u, 4);
                    } else {
                        x = qvi_f16_bits_to_float((uint16_t)b);
                    }
                    if (!(fabsf(x) <= amax)) continue; /* also drops NaN and infinities */
                    c.x[e] = x, c.s[e] = s;
                    if (++e == 4) cs.push_back(c), e = 0;
                }
            }
    return cs;
}

static int ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    fprintf(stderr, "FAIL: %s: %s\n", what, cudaGetErrorString(e));
    return 0;
}

/* Runs the kernel on the cases; counts words that differ from the CPU
 * reference (must be 0) and words where the unguarded rounding would have
 * differed (must be > 0: the cases reach the boundaries). */
enum code_kind { INT8_CODES, INT8_BOUNDED, E4M3_CODES, E4M3_CODES_IN16 };

static int run(const char *name, code_kind kind, const std::vector<code_case> &cs) {
    const bool int8 = kind == INT8_CODES || kind == INT8_BOUNDED;
    const int n = (int)cs.size();
    code_case *dc = NULL;
    uint32_t *df = NULL, *dn = NULL;
    std::vector<uint32_t> f(n), nv(n);
    if (!ok(cudaMalloc(&dc, n * sizeof(code_case)), "cudaMalloc") ||
        !ok(cudaMalloc(&df, n * 4), "cudaMalloc") || !ok(cudaMalloc(&dn, n * 4), "cudaMalloc") ||
        !ok(cudaMemcpy(dc, cs.data(), n * sizeof(code_case), cudaMemcpyHostToDevice), "H2D"))
        return 1;
    if (kind == INT8_CODES)
        int8_codes_kernel<<<(n + 255) / 256, 256>>>(dc, n, df, dn);
    else if (kind == INT8_BOUNDED)
        int8_bounded_kernel<<<(n + 255) / 256, 256>>>(dc, n, df, dn);
    else if (kind == E4M3_CODES)
        e4m3_codes_kernel<false><<<(n + 255) / 256, 256>>>(dc, n, df, dn);
    else
        e4m3_codes_kernel<true><<<(n + 255) / 256, 256>>>(dc, n, df, dn);
    if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "sync") ||
        !ok(cudaMemcpy(f.data(), df, n * 4, cudaMemcpyDeviceToHost), "D2H") ||
        !ok(cudaMemcpy(nv.data(), dn, n * 4, cudaMemcpyDeviceToHost), "D2H"))
        return 1;
    cudaFree(dc), cudaFree(df), cudaFree(dn);
    long bad = 0, naive_bad = 0;
    for (int i = 0; i < n; ++i) {
        uint32_t ref = 0;
        for (int e = 0; e < 4; ++e) {
            const float q = cs[i].x[e] / cs[i].s[e]; /* the CPU's IEEE quotient */
            const uint32_t code = int8 ? (uint32_t)(uint8_t)qva_int8_round(q) : qva_e4m3_encode(q);
            ref |= code << (8 * e);
        }
        naive_bad += nv[i] != ref;
        if (f[i] == ref) continue;
        if (bad++ < 8)
            fprintf(stderr, "FAIL: %s case %d: device %08x, reference %08x (x0 %a, s0 %a)\n", name, i,
                    f[i], ref, cs[i].x[0], cs[i].s[0]);
    }
    printf("%s: %d cases x 4 values, %ld words differ from the reference; the unguarded fast "
           "quotient would differ in %ld\n", name, n, bad, naive_bad);
    if (naive_bad == 0) {
        fprintf(stderr, "FAIL: %s: no case reached a rounding boundary\n", name);
        return 1;
    }
    return bad != 0;
}

int main(void) {
    int dev = 0;
    if (cudaGetDeviceCount(&dev) != cudaSuccess || dev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    int fails = run("int8 codes", INT8_CODES, int8_cases());
    fails += run("int8 bounded codes", INT8_BOUNDED, int8_bounded_cases());
    fails += run("e4m3 codes", E4M3_CODES, e4m3_cases());
    fails += run("e4m3 codes of bf16 values", E4M3_CODES, e4m3_16bit_cases(1, 0));
    /* the one-step form on its domain: 16-bit values, scales of their amax */
    fails += run("e4m3 one-step codes of bf16 values", E4M3_CODES_IN16, e4m3_16bit_cases(1, 1));
    fails += run("e4m3 one-step codes of f16 values", E4M3_CODES_IN16, e4m3_16bit_cases(0, 1));
    printf("cuda_test_codes: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
