/* Helpers shared by the CUDA-only tests (cuda_test_*.c); include after
 * check.h (CHECK, rng_unit). */
#ifndef QVA_CUDA_TEST_UTIL_H
#define QVA_CUDA_TEST_UTIL_H
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qvattn.h"

/* Standard normal (Box-Muller) from the shared generator. */
static float rng_normal(void) {
    double u1 = rng_unit(), u2 = rng_unit();
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static uint16_t bf16_bits(float x) { /* x already bf16-representable */
    uint32_t b;
    memcpy(&b, &x, 4);
    return (uint16_t)(b >> 16);
}
/* Bits of a float that is exactly representable in binary16. */
static uint16_t f16_bits(float x) {
    uint16_t sign = signbit(x) ? 0x8000u : 0u;
    float a = fabsf(x);
    if (a == 0.0f) return sign;
    int e;
    (void)frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
    e -= 1;              /* a in [2^e, 2^(e+1)) */
    if (e < -14) return (uint16_t)(sign | (uint16_t)ldexpf(a, 24));
    uint16_t m = (uint16_t)(ldexpf(a, 10 - e) - 1024.0f);
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | m);
}
static const char *dtype_name(qva_dtype dt) {
    return dt == QVA_F32 ? "f32" : dt == QVA_BF16 ? "bf16" : "f16";
}
static int cuda_ok(cudaError_t e, const char *what) {
    CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}
#endif
