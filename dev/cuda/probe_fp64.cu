/*
 * probe_fp64: the two FP64 rounding facts the device draft map relies on
 * (src/cuda/draft/router_map.cu), measured on the GPU it runs on.
 *
 *  1. mma.sync .f64 (m8n8k4, m16n8k4, m16n8k16) computes each output as
 *     the chain c = fma(a[k], b[k], c), k = 0, 1, ... in order: the CPU
 *     reference's channel chain, because a product of two f32 values is
 *     exact in FP64.  Checked bit for bit against that chain (and, to show
 *     the check can fail, against the reversed chain) on random f32-valued
 *     operands over four exponent ranges, zeros and infinities included.
 *  2. For x in [2^-960, 1] and s in [1, 2^11): with y = RN(1/s) and
 *     q = RN(x y), RN(q + RN(x - q s) y) == RN(x / s) (Markstein), checked
 *     against __ddiv_rn on 2^32 quotients per operand mix.
 *
 *     make dev && ./build/dev/cuda/probe_fp64      (exit 0: both hold)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#define NWARPS 4096 /* mma problems per shape and operand mix */

static __device__ uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static __device__ uint64_t hash64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* An f32 value with a random significand and an exponent range set by the
 * operand mix; 1 in 128 is zero, and mix 3 has infinities. */
static __device__ float probe_f32(uint32_t key, int mix) {
    const uint32_t h = hash32(key), e = hash32(key * 2654435761u + 7u);
    static const int span[4] = {61, 7, 121, 9};
    float v = ldexpf(1.0f + (float)(h & 0xffffff) / 16777216.0f, (int)(e % span[mix]) - span[mix] / 2);
    if (e & 0x80000000u) v = -v;
    if ((e & 0x7f) == 3) v = 0.0f;
    if (mix == 3 && (e & 0x3f0) == 0x50) v = (e & 0x8000u) ? -INFINITY : INFINITY;
    return v;
}

/* Operands of one warp's problem: A [M][K], B [K][N], C [M][N] (row-major);
 * C is a chain partial of other products, or (1 in 4) nearly cancels the
 * row's products, where the order of the additions matters most. */
__global__ void fill_operands(double *A, double *B, double *C, int M, int N, int K, int mix) {
    const int w = blockIdx.x;
    for (int i = threadIdx.x; i < M * K; i += 32)
        A[w * M * K + i] = probe_f32(0xA000u ^ (w * 1000003u + i * 7u + 1u), mix);
    for (int i = threadIdx.x; i < K * N; i += 32)
        B[w * K * N + i] = probe_f32(0xB000u ^ (w * 1000033u + i * 13u + 2u), mix);
    __syncwarp();
    for (int i = threadIdx.x; i < M * N; i += 32) {
        double c = 0.0;
        for (int j = 0; j < 8; ++j)
            c = fma((double)probe_f32(w * 77u + i * 31u + j * 5u + 3u, mix),
                    (double)probe_f32(w * 91u + i * 37u + j * 11u + 4u, mix), c);
        if ((hash32(w * 5u + i) & 3) == 0) {
            const int r = i / N, col = i % N;
            double s = 0.0;
            for (int k = 0; k < K; ++k) s += A[w * M * K + r * K + k] * B[w * K * N + k * N + col];
            c = -s * (1.0 + 0x1p-30);
        }
        C[w * M * N + i] = c;
    }
}

/* Fragments (g = lane / 4, t = lane % 4): A[g + 8h][t + 4j], B[t + 4j][g],
 * C[g + 8h][2t + e]; m8n8k4 has h = j = 0 only. */
__global__ void mma_m8n8k4(const double *A, const double *B, const double *C, double *D) {
    const int w = blockIdx.x, g = threadIdx.x >> 2, t = threadIdx.x & 3;
    const double *a = A + w * 32, *b = B + w * 32, *c = C + w * 64;
    double d0 = c[g * 8 + 2 * t], d1 = c[g * 8 + 2 * t + 1];
    asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
        : "+d"(d0), "+d"(d1)
        : "d"(a[g * 4 + t]), "d"(b[t * 8 + g]));
    D[w * 64 + g * 8 + 2 * t] = d0;
    D[w * 64 + g * 8 + 2 * t + 1] = d1;
}

__global__ void mma_m16n8k4(const double *A, const double *B, const double *C, double *D) {
    const int w = blockIdx.x, g = threadIdx.x >> 2, t = threadIdx.x & 3;
    const double *a = A + w * 64, *b = B + w * 32, *c = C + w * 128;
    double d[4];
    for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) d[2 * h + e] = c[(g + 8 * h) * 8 + 2 * t + e];
    asm("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
        : "d"(a[g * 4 + t]), "d"(a[(g + 8) * 4 + t]), "d"(b[t * 8 + g]));
    for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) D[w * 128 + (g + 8 * h) * 8 + 2 * t + e] = d[2 * h + e];
}

__global__ void mma_m16n8k16(const double *A, const double *B, const double *C, double *D) {
    const int w = blockIdx.x, g = threadIdx.x >> 2, t = threadIdx.x & 3;
    const double *a = A + w * 256, *b = B + w * 128, *c = C + w * 128;
    double af[8], bf[4], d[4];
    for (int j = 0; j < 4; ++j) {
        for (int h = 0; h < 2; ++h) af[2 * j + h] = a[(g + 8 * h) * 16 + t + 4 * j];
        bf[j] = b[(t + 4 * j) * 8 + g];
    }
    for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) d[2 * h + e] = c[(g + 8 * h) * 8 + 2 * t + e];
    asm("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
        : "d"(af[0]), "d"(af[1]), "d"(af[2]), "d"(af[3]), "d"(af[4]), "d"(af[5]), "d"(af[6]),
          "d"(af[7]), "d"(bf[0]), "d"(bf[1]), "d"(bf[2]), "d"(bf[3]));
    for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) D[w * 128 + (g + 8 * h) * 8 + 2 * t + e] = d[2 * h + e];
}

typedef void (*mma_kernel)(const double *, const double *, const double *, double *);

/* Same value, or both NaN (payloads are not compared). */
static int same(double x, double y) {
    return (isnan(x) && isnan(y)) || memcmp(&x, &y, sizeof x) == 0;
}

/* Outputs that differ from the forward chain; *rev gets those that differ
 * from the reversed one.  -1 on a CUDA error. */
static long check_shape(mma_kernel kern, int M, int N, int K, int mix, long *rev) {
    const size_t na = (size_t)NWARPS * M * K, nb = (size_t)NWARPS * K * N, nc = (size_t)NWARPS * M * N;
    double *dA, *dB, *dC, *dD;
    double *h = (double *)malloc((na + nb + 2 * nc) * sizeof(double));
    long fwd = -1;
    *rev = -1;
    if (!h || cudaMalloc(&dA, na * 8) || cudaMalloc(&dB, nb * 8) || cudaMalloc(&dC, nc * 8) ||
        cudaMalloc(&dD, nc * 8)) {
        free(h);
        return -1;
    }
    fill_operands<<<NWARPS, 32>>>(dA, dB, dC, M, N, K, mix);
    kern<<<NWARPS, 32>>>(dA, dB, dC, dD);
    double *hA = h, *hB = hA + na, *hC = hB + nb, *hD = hC + nc;
    if (cudaMemcpy(hA, dA, na * 8, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(hB, dB, nb * 8, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(hC, dC, nc * 8, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(hD, dD, nc * 8, cudaMemcpyDeviceToHost) == cudaSuccess) {
        fwd = 0, *rev = 0;
        for (int w = 0; w < NWARPS; ++w)
            for (int i = 0; i < M; ++i)
                for (int j = 0; j < N; ++j) {
                    const double *a = hA + (size_t)w * M * K + i * K, *b = hB + (size_t)w * K * N + j;
                    const double c = hC[(size_t)w * M * N + i * N + j];
                    double f = c, r = c;
                    for (int k = 0; k < K; ++k) f = fma(a[k], b[k * N], f);
                    for (int k = K - 1; k >= 0; --k) r = fma(a[k], b[k * N], r);
                    const double d = hD[(size_t)w * M * N + i * N + j];
                    fwd += !same(f, d);
                    *rev += !same(r, d);
                }
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
    free(h);
    return fwd;
}

/* Quotients x/s (x in [2^-960, 1] or [2^-60, 1], or s a small integer or
 * half-integer) where the reciprocal form differs from __ddiv_rn. */
__global__ void div_probe(uint64_t seed, int iters, int mix, unsigned long long *bad) {
    const uint64_t id = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    unsigned long long n = 0;
    for (int it = 0; it < iters; ++it) {
        const uint64_t h1 = hash64(seed ^ (id * 0x100000001b3ull + it)), h2 = hash64(h1 + 77);
        const int ex = mix == 0 ? -(int)(h1 % 960) : -(int)(h1 % 60);
        double x = __longlong_as_double((long long)(((uint64_t)(1023 + ex) << 52) | (h2 & 0xfffffffffffffull)));
        x = fmin(x, 1.0);
        double s = __longlong_as_double(
            (long long)(((uint64_t)(1023 + (h1 >> 20) % 11) << 52) | (hash64(h2) & 0xfffffffffffffull)));
        if (mix == 2) s = (double)(1 + h1 % 2000) + ((h2 & 1) ? 0.0 : 0.5);
        if (x < 0x1p-960) continue;
        const double y = __drcp_rn(s), q = __dmul_rn(x, y);
        const double f = __fma_rn(__fma_rn(-q, s, x), y, q);
        n += __double_as_longlong(f) != __double_as_longlong(__ddiv_rn(x, s));
    }
    atomicAdd(bad, n);
}

int main(void) {
    static const struct { const char *name; mma_kernel kern; int M, N, K; } shapes[] = {
        {"m8n8k4", mma_m8n8k4, 8, 8, 4}, {"m16n8k4", mma_m16n8k4, 16, 8, 4},
        {"m16n8k16", mma_m16n8k16, 16, 8, 16}};
    int failed = 0;
    for (int mix = 0; mix < 4; ++mix)
        for (int s = 0; s < 3; ++s) {
            long rev = 0;
            const long fwd = check_shape(shapes[s].kern, shapes[s].M, shapes[s].N, shapes[s].K, mix, &rev);
            printf("mma %-9s operands %d: %ld outputs, %ld differ from the forward chain "
                   "(%ld from the reversed one)\n",
                   shapes[s].name, mix, (long)NWARPS * shapes[s].M * shapes[s].N, fwd, rev);
            failed |= fwd != 0;
        }
    unsigned long long *bad = NULL;
    if (cudaMallocManaged(&bad, sizeof *bad) != cudaSuccess) return 2;
    for (int mix = 0; mix < 3; ++mix) {
        *bad = 0;
        const int blocks = 4096, threads = 256, iters = 512;
        for (int rep = 0; rep < 8; ++rep)
            div_probe<<<blocks, threads>>>(0x1234u + rep * 7919u + mix, iters, mix, bad);
        const cudaError_t e = cudaDeviceSynchronize();
        printf("division operands %d: %llu quotients, %llu differ from __ddiv_rn (%s)\n", mix,
               8ull * blocks * threads * iters, *bad, cudaGetErrorString(e));
        failed |= *bad != 0 || e != cudaSuccess;
    }
    cudaFree(bad);
    printf("%s\n", failed ? "FAIL" : "OK");
    return failed;
}
