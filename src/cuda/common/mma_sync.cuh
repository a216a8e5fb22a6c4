/*
 * mma.sync wrappers and small warp helpers shared by the correct-first
 * kernels (dense/attn_bf16_mma_64x128.cu, draft/attn_draft_mma_64x128.cu).
 * Fragment layouts are PTX's m16n8k16 (16-bit) and m16n8k32 (8-bit) ones.
 */
#ifndef QVATTN_MMA_SYNC_CUH
#define QVATTN_MMA_SYNC_CUH

#include <stdint.h>

/* C(16x8 f32) += A(16x16 bf16) B(16x8 bf16) */
static __device__ __forceinline__ void qvc_mma_bf16(float *c, const uint32_t *a, uint32_t b0,
                                                    uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* C(16x8 f32) += A(16x16 f16) B(16x8 f16) */
static __device__ __forceinline__ void qvc_mma_f16(float *c, const uint32_t *a, uint32_t b0,
                                                   uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int F16>
static __device__ __forceinline__ void qvc_mma16(float *c, const uint32_t *a, uint32_t b0,
                                                 uint32_t b1) {
    if constexpr (F16)
        qvc_mma_f16(c, a, b0, b1);
    else
        qvc_mma_bf16(c, a, b0, b1);
}

/* C(16x8 s32) += A(16x32 s8) B(32x8 s8) */
static __device__ __forceinline__ void qvc_mma_s8(int *c, const uint32_t *a, uint32_t b0,
                                                  uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* C(16x8 f32) += A(16x32 e4m3) B(32x8 e4m3) */
static __device__ __forceinline__ void qvc_mma_e4m3(float *c, const uint32_t *a, uint32_t b0,
                                                    uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void qvc_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until at most N of this thread's committed groups are pending. */
template <int N>
static __device__ __forceinline__ void qvc_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
static __device__ __forceinline__ void qvc_cp_async_wait_all(void) {
    qvc_cp_async_commit();
    qvc_cp_async_wait<0>();
}

/* Reductions over the 4 threads of a quad (one accumulator row). */
static __device__ __forceinline__ float qvc_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
static __device__ __forceinline__ float qvc_quad_sum(float x) {
    x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/* A 32-bit shared-memory word (two 16-bit or four 8-bit elements). */
static __device__ __forceinline__ uint32_t qvc_lds32(const void *p) {
    return *(const uint32_t *)p;
}

#endif
