/*
 * The draft map's FP64 arithmetic (src/cuda/draft/router_fp64.cuh) on the
 * GPU at hand, where the CPU reference's bit-exactness rests on it:
 *   - dr_dmma (mma.sync m16n8k16 .f64) must give each output as the FMA
 *     chain over k in order, the CPU's channel chain (a product of two f32
 *     values is exact in FP64).  Random f32-valued operands over four
 *     exponent mixes, zeros and infinities, and C values that nearly cancel
 *     the row's products, where the order matters most; the reversed chain
 *     must differ somewhere, so the data can tell the orders apart.
 *   - the mixture's division (dr_div_rcp, gated by dr_div_exact) must equal
 *     __ddiv_rn: 2^28 random quotients per operand mix with x in
 *     [2^-960, 1] and s in [1, 2^11), and the edge cases (x zero, tiny or
 *     NaN; sums below 1, zero, infinite or NaN).  The uncorrected quotient
 *     RN(x * RN(1/s)) must differ somewhere, so the check can fail.
 * cuda_test_draft compares the whole map with the CPU's; this test names
 * the cause if a GPU rounds differently.  Needs a GPU; without one it
 * exits 77 (skipped).
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "check.h"
#include "draft/router_fp64.cuh"

enum { MMA_M = 16, MMA_N = 8, MMA_K = 16, NPROB = 2048 };

/* One m16n8k16 problem per warp: A [16][16], B [16][8], C [16][8]
 * row-major; the fragments as router_fp64.cuh documents them. */
__global__ void dmma_kernel(const double *A, const double *B, const double *C, double *D) {
    const int w = blockIdx.x, g = threadIdx.x >> 2, t = threadIdx.x & 3;
    const double *a = A + w * MMA_M * MMA_K, *b = B + w * MMA_K * MMA_N;
    const double *c = C + w * MMA_M * MMA_N;
    double af[8], bf[4], d[4];
    for (int j = 0; j < 4; ++j) {
        for (int h = 0; h < 2; ++h) af[2 * j + h] = a[(g + 8 * h) * MMA_K + t + 4 * j];
        bf[j] = b[(t + 4 * j) * MMA_N + g];
    }
    for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) d[2 * h + e] = c[(g + 8 * h) * MMA_N + 2 * t + e];
    dr_dmma(d, af, bf);
    for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e)
            D[w * MMA_M * MMA_N + (g + 8 * h) * MMA_N + 2 * t + e] = d[2 * h + e];
}

/* An f32 value: random significand, exponent span by mix, 1 in 64 zero,
 * 1 in 64 infinite under mix 3. */
static double f32_value(int mix) {
    static const int span[4] = {61, 7, 121, 9};
    const uint64_t r = rng_u64();
    float v = ldexpf(1.0f + (float)(r & 0xffffff) / 16777216.0f,
                     (int)((r >> 24) % span[mix]) - span[mix] / 2);
    if (r >> 63) v = -v;
    if (((r >> 32) & 63) == 5) v = 0.0f;
    if (mix == 3 && ((r >> 40) & 63) == 9) v = (r >> 62) & 1 ? INFINITY : -INFINITY;
    return v;
}

/* Same value, or both NaN. */
static int same(double x, double y) {
    return (isnan(x) && isnan(y)) || memcmp(&x, &y, sizeof x) == 0;
}

static void test_dmma_chain(void) {
    const size_t na = (size_t)NPROB * MMA_M * MMA_K, nb = (size_t)NPROB * MMA_K * MMA_N,
                 nc = (size_t)NPROB * MMA_M * MMA_N;
    std::vector<double> A(na), B(nb), C(nc), D(nc);
    double *dA = NULL, *dB = NULL, *dC = NULL, *dD = NULL;
    const bool ok = cudaMalloc(&dA, na * 8) == cudaSuccess && cudaMalloc(&dB, nb * 8) == cudaSuccess &&
                    cudaMalloc(&dC, nc * 8) == cudaSuccess && cudaMalloc(&dD, nc * 8) == cudaSuccess;
    CHECK(ok, "device buffers");
    for (int mix = 0; ok && mix < 4; ++mix) {
        for (size_t i = 0; i < na; ++i) A[i] = f32_value(mix);
        for (size_t i = 0; i < nb; ++i) B[i] = f32_value(mix);
        for (int w = 0; w < NPROB; ++w)
            for (int r = 0; r < MMA_M; ++r)
                for (int n = 0; n < MMA_N; ++n) {
                    double s = 0.0;
                    for (int j = 0; j < 8; ++j) s = fma(f32_value(mix), f32_value(mix), s);
                    if (rng_unit() < 0.25) { /* nearly cancel the row's products */
                        double p = 0.0;
                        for (int k = 0; k < MMA_K; ++k)
                            p += A[(size_t)w * MMA_M * MMA_K + r * MMA_K + k] *
                                 B[(size_t)w * MMA_K * MMA_N + k * MMA_N + n];
                        s = -p * (1.0 + 0x1p-30);
                    }
                    C[(size_t)w * MMA_M * MMA_N + r * MMA_N + n] = s;
                }
        cudaMemcpy(dA, A.data(), na * 8, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, B.data(), nb * 8, cudaMemcpyHostToDevice);
        cudaMemcpy(dC, C.data(), nc * 8, cudaMemcpyHostToDevice);
        dmma_kernel<<<NPROB, 32>>>(dA, dB, dC, dD);
        const cudaError_t e = cudaMemcpy(D.data(), dD, nc * 8, cudaMemcpyDeviceToHost);
        CHECK(e == cudaSuccess, "dmma kernel: %s", cudaGetErrorString(e));
        long fwd = 0, rev = 0;
        for (int w = 0; w < NPROB; ++w)
            for (int r = 0; r < MMA_M; ++r)
                for (int n = 0; n < MMA_N; ++n) {
                    const double *a = &A[(size_t)w * MMA_M * MMA_K + r * MMA_K];
                    const double *b = &B[(size_t)w * MMA_K * MMA_N + n];
                    const size_t o = (size_t)w * MMA_M * MMA_N + r * MMA_N + n;
                    double f = C[o], v = C[o];
                    for (int k = 0; k < MMA_K; ++k) f = fma(a[k], b[k * MMA_N], f);
                    for (int k = MMA_K - 1; k >= 0; --k) v = fma(a[k], b[k * MMA_N], v);
                    fwd += !same(f, D[o]);
                    rev += !same(v, D[o]);
                }
        printf("dr_dmma, operand mix %d: %ld of %zu outputs differ from the k-order FMA chain "
               "(%ld from the reversed chain)\n", mix, fwd, nc, rev);
        CHECK(fwd == 0, "mix %d: the f64 mma is not the k-order chain (%ld outputs)", mix, fwd);
        CHECK(rev > 0, "mix %d: the data cannot tell the chain orders apart", mix);
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
}

/* The map's division of x by the row sum s, as router_map.cu's mixture
 * composes it. */
static __device__ double map_div(double x, double s) {
    const double q = dr_div_rcp(x, s, __drcp_rn(s));
    return dr_div_exact(x, dr_div_sum_ok(s)) ? __ddiv_rn(x, s) : q;
}

static __device__ uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Random quotients: bad[0] counts map_div != __ddiv_rn, bad[1] the
 * uncorrected RN(x * RN(1/s)) != __ddiv_rn. */
__global__ void div_random_kernel(uint64_t seed, int iters, int mix, unsigned long long *bad) {
    const uint64_t id = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    unsigned long long n0 = 0, n1 = 0;
    for (int it = 0; it < iters; ++it) {
        const uint64_t h1 = mix64(seed ^ (id * 0x100000001B3ull + (uint64_t)it)), h2 = mix64(h1);
        const int ex = mix == 0 ? -(int)(h1 % 960) : -(int)(h1 % 60);
        const double x = fmin(1.0, __longlong_as_double(
                                       (long long)(((uint64_t)(1023 + ex) << 52) | (h2 >> 12))));
        double s = __longlong_as_double(
            (long long)(((uint64_t)(1023 + (h1 >> 20) % 11) << 52) | (mix64(h2) >> 12)));
        if (mix == 2) s = (double)(1 + h1 % 2000) + ((h2 & 1) ? 0.0 : 0.5);
        const double want = __ddiv_rn(x, s);
        n0 += __double_as_longlong(map_div(x, s)) != __double_as_longlong(want);
        n1 += __double_as_longlong(__dmul_rn(x, __drcp_rn(s))) != __double_as_longlong(want);
    }
    atomicAdd(&bad[0], n0);
    atomicAdd(&bad[1], n1);
}

__global__ void div_cases_kernel(const double *x, const double *s, int n, double *got,
                                 double *want) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    got[i] = map_div(x[i], s[i]);
    want[i] = __ddiv_rn(x[i], s[i]);
}

static void test_division(void) {
    unsigned long long *bad = NULL;
    CHECK(cudaMallocManaged(&bad, 2 * sizeof *bad) == cudaSuccess, "managed counters");
    if (!bad) return;
    const int blocks = 1024, threads = 256, iters = 1024; /* 2^28 quotients */
    for (int mix = 0; mix < 3; ++mix) {
        bad[0] = bad[1] = 0;
        div_random_kernel<<<blocks, threads>>>(0x5EED0000ull + mix, iters, mix, bad);
        const cudaError_t e = cudaDeviceSynchronize();
        CHECK(e == cudaSuccess, "division kernel: %s", cudaGetErrorString(e));
        printf("map division, operand mix %d: %llu of %llu quotients differ from __ddiv_rn "
               "(uncorrected: %llu)\n", mix, bad[0], (unsigned long long)blocks * threads * iters,
               bad[1]);
        CHECK(bad[0] == 0, "mix %d: %llu quotients differ from the IEEE division", mix, bad[0]);
        CHECK(bad[1] > 0, "mix %d: the uncorrected quotient never differs: the check cannot fail",
              mix);
    }
    cudaFree(bad);

    /* Edge cases: both gates of dr_div_exact and the values beside them.
     * x stays in the map's domain, [0, 1] or NaN (an exp of x - max). */
    const double xs[] = {0.0, -0.0, 1.0, 0x1p-960, 0x1.fffffffffffffp-961, 0x1p-1000, 0x1p-1074,
                         NAN, 0.75, 1.0 / 3.0};
    const double ss[] = {1.0, 609.0, 0x1.fffffffffffffp-1, 0.5, 0.0, INFINITY, NAN, 1.5, 3.0,
                         2047.999};
    const int nx = sizeof xs / sizeof xs[0], ns = sizeof ss / sizeof ss[0], n = nx * ns;
    std::vector<double> hx(n), hs(n), got(n), want(n);
    for (int i = 0; i < nx; ++i)
        for (int j = 0; j < ns; ++j) hx[i * ns + j] = xs[i], hs[i * ns + j] = ss[j];
    double *d = NULL;
    CHECK(cudaMalloc(&d, 4 * n * sizeof(double)) == cudaSuccess, "edge buffers");
    if (!d) return;
    cudaMemcpy(d, hx.data(), n * 8, cudaMemcpyHostToDevice);
    cudaMemcpy(d + n, hs.data(), n * 8, cudaMemcpyHostToDevice);
    div_cases_kernel<<<1, 128>>>(d, d + n, n, d + 2 * n, d + 3 * n);
    cudaMemcpy(got.data(), d + 2 * n, n * 8, cudaMemcpyDeviceToHost);
    cudaMemcpy(want.data(), d + 3 * n, n * 8, cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; ++i)
        CHECK(same(got[i], want[i]), "%a / %a: %a, IEEE %a", hx[i], hs[i], got[i], want[i]);
    cudaFree(d);
}

int main(void) {
    int dev = 0;
    if (cudaGetDeviceCount(&dev) != cudaSuccess || dev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    test_dmma_chain();
    test_division();
    CHECK(cudaGetLastError() == cudaSuccess, "no sticky CUDA error");
    return check_summary("cuda_test_fp64");
}
