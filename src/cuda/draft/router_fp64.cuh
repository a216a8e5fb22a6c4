/*
 * The draft map's FP64 arithmetic that must round as the CPU reference's
 * (router_map.cu; tests/cuda_test_fp64.cu checks both on the GPU at hand):
 * the tensor cores' f64 mma as the channel FMA chain, and the division by
 * a row sum through its reciprocal.  Internal to src/cuda/draft/.
 */
#ifndef QVATTN_CUDA_DRAFT_ROUTER_FP64_CUH
#define QVATTN_CUDA_DRAFT_ROUTER_FP64_CUH

#include <math.h>

/*
 * D = A B + C on the FP64 tensor cores, m16n8k16.  Measured on the H200
 * (sm_90a, 7.3 M outputs of random f32-valued operands, infinities and
 * zeros included): each output is exactly the chain
 *     c = fma(a[k], b[k], c) for k = 0 .. 15 in order,
 * which is the map's channel chain 16 channels at a time.  Fragments
 * (g = lane / 4, t = lane % 4): a[2j + h] = A[g + 8h][t + 4j],
 * b[j] = B[t + 4j][g], c[2h + e] = C[g + 8h][2t + e].
 */
static __device__ __forceinline__ void dr_dmma(double (&c)[4], const double (&a)[8],
                                               const double (&b)[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
        : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]),
          "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
}

/* Division by the row sums through their reciprocals (dr_div_rcp; -D 0 for
 * trials). */
#ifndef DR_MAP_RCP_DIV
#define DR_MAP_RCP_DIV 1
#endif

/*
 * x / s rounded to nearest, for an exp x in [0, 1] and its row's sum s,
 * given y = RN(1/s).  q = RN(x y) is within an ulp of x/s, so the residual
 * r = x - q s is exact in one FMA and RN(q + r y) is RN(x/s) (Markstein's
 * theorem), as long as nothing underflows: dr_div_exact() says when the
 * full division is needed instead (a sum that is not a finite value >= 1,
 * from a non-finite input, or an x below 2^-960, a quotient near the
 * subnormals).  Split so that a lane's quotients run side by side and the
 * rare full divisions come after.
 */
static __device__ __forceinline__ double dr_div_rcp(double x, double s, double y) {
    const double q = __dmul_rn(x, y);
    return __fma_rn(__fma_rn(-q, s, x), y, q);
}

/* A row sum the reciprocal form takes: finite and >= 1 (it holds the
 * row's maximum's exp(0) = 1). */
static __device__ __forceinline__ bool dr_div_sum_ok(double s) { return s >= 1.0 && s < INFINITY; }

static __device__ __forceinline__ bool dr_div_exact(double x, bool sum_ok) {
    return !DR_MAP_RCP_DIV || !sum_ok || !(x >= 0x1p-960);
}

#endif
