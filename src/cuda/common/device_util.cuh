/* Device helpers shared by the CUDA backend's translation units. */
#ifndef QVATTN_DEVICE_UTIL_CUH
#define QVATTN_DEVICE_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <string.h>
#include <cuda_runtime.h>

#include "cuda_internal.h"

/* A CUDA error as a qva_status (out-of-memory kept apart); clears a
 * non-sticky error so later checks are clean. */
static inline qva_status qvc_cuda_fail(cudaError_t e, const char *what) {
    cudaGetLastError();
    if (e == cudaErrorMemoryAllocation)
        return qvi_fail(QVA_ERR_OUT_OF_MEMORY, "%s: %s", what, cudaGetErrorString(e));
    return qvi_fail(QVA_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

/* The status of the last kernel launch. */
static inline qva_status qvc_launch_check(const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? QVA_OK
                            : qvi_fail(QVA_ERR_DEVICE, "%s launch: %s", what, cudaGetErrorString(e));
}

/* Per-call phase timings for qva_context_set_profiling: events 0..3 bound
 * grouping (or the draft router), prep and the kernel.  Created on first
 * use; one per backend state. */
typedef struct qvc_phase_timer {
    cudaEvent_t ev[4];
    int have;
} qvc_phase_timer;

static inline qva_status qvc_timer_mark(qvc_phase_timer *t, int i, int on, cudaStream_t st) {
    if (!on) return QVA_OK;
    cudaError_t e;
    if (!t->have) {
        for (int j = 0; j < 4; ++j)
            if ((e = cudaEventCreate(&t->ev[j])) != cudaSuccess) {
                for (int k = 0; k < j; ++k) cudaEventDestroy(t->ev[k]);
                return qvc_cuda_fail(e, "cudaEventCreate");
            }
        t->have = 1;
    }
    if ((e = cudaEventRecord(t->ev[i], st)) != cudaSuccess) return qvc_cuda_fail(e, "cudaEventRecord");
    return QVA_OK;
}

/* qvi_timings_fn of a profiled call: waits for its last mark, then reads
 * the three phase times. */
static inline qva_status qvc_timer_read(void *arg, qva_timings *tm) {
    const qvc_phase_timer *t = (const qvc_phase_timer *)arg;
    cudaError_t e;
    if ((e = cudaEventSynchronize(t->ev[3])) != cudaSuccess ||
        (e = cudaEventElapsedTime(&tm->grouping_ms, t->ev[0], t->ev[1])) != cudaSuccess ||
        (e = cudaEventElapsedTime(&tm->prep_ms, t->ev[1], t->ev[2])) != cudaSuccess ||
        (e = cudaEventElapsedTime(&tm->kernel_ms, t->ev[2], t->ev[3])) != cudaSuccess)
        return qvc_cuda_fail(e, "phase timings");
    return QVA_OK;
}

/* After the last mark: the context reads the times when asked
 * (qva_context_last_timings), not now.  Why: a synchronization here left
 * the GPU idle at the start of the next profiled call, so its phases
 * waited for the host's launches and ran from idle clocks, which the
 * timed calls never do (bench/NOTES.md). */
static inline qva_status qvc_timer_finish(qva_context_t *ctx, qvc_phase_timer *t) {
    qvi_context_set_timings_lazy(ctx, qvc_timer_read, t);
    return QVA_OK;
}

static inline void qvc_timer_free(qvc_phase_timer *t) {
    if (t->have)
        for (int i = 0; i < 4; ++i) cudaEventDestroy(t->ev[i]);
    t->have = 0;
}

/* The device view of a user tensor [B,H,N,D] (element strides). */
static inline qvc_view qvc_view_of(const qva_tensor *t) {
    qvc_view w;
    w.data = t->data;
    w.dtype = (int)t->dtype;
    w.B = t->shape[0], w.H = t->shape[1], w.N = t->shape[2], w.D = t->shape[3];
    w.sb = t->stride[0], w.sh = t->stride[1], w.sn = t->stride[2];
    w.hg = 1;
    return w;
}

/* K or V seen by the query heads of q: with grouped K/V (H_kv < H, the
 * dispatcher checked H % H_kv == 0) query head h reads K/V head
 * h / (H / H_kv), as the CPU reference; every kernel then runs as for
 * H = H_kv, preparing each query head's operands from its K/V head. */
static inline qvc_view qvc_kv_view(const qva_tensor *kv, const qva_tensor *q) {
    qvc_view w = qvc_view_of(kv);
    w.hg = q->shape[1] / kv->shape[1];
    w.H = q->shape[1];
    return w;
}

/* A device allocation request; bytes == 0 leaves *p NULL. */
typedef struct qvc_alloc {
    void **p;
    size_t bytes;
} qvc_alloc;

/* cudaMalloc of every request; on failure the failed pointer is NULL and
 * the ones already made are left for the caller's free function. */
static inline qva_status qvc_malloc_all(const qvc_alloc *req, size_t n, const char *what) {
    for (size_t i = 0; i < n; ++i) {
        if (!req[i].bytes) continue;
        cudaError_t e = cudaMalloc(req[i].p, req[i].bytes);
        if (e != cudaSuccess) {
            *req[i].p = NULL;
            return qvc_cuda_fail(e, what);
        }
    }
    return QVA_OK;
}

/* cudaFree of every non-NULL pointer.  An error (a sticky one from an
 * earlier launch) cannot be acted on here; it is cleared so it does not
 * leak into the next check, and the pointers are dropped either way. */
static inline void qvc_free_all(void *const *ptrs, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (ptrs[i] && cudaFree(ptrs[i]) != cudaSuccess) cudaGetLastError();
}

/* Runs CALL with the constexpr int DT_ set to the runtime dtype of a view
 * (f32, bf16, else f16), for kernels templated on the input dtype. */
#define QVC_DISPATCH_DTYPE(dtype, CALL)                                        \
    do {                                                                       \
        switch (dtype) {                                                       \
        case QVA_F32: { constexpr int DT_ = QVA_F32; CALL; } break;            \
        case QVA_BF16: { constexpr int DT_ = QVA_BF16; CALL; } break;          \
        default: { constexpr int DT_ = QVA_F16; CALL; } break;                 \
        }                                                                      \
    } while (0)

/* A user view is present and of a supported dtype (who: the caller). */
static inline qva_status qvc_check_view(const char *who, const qvc_view *x, const char *name) {
    if (!x || !x->data) return qvi_fail(QVA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", who, name);
    if (x->dtype != QVA_F32 && x->dtype != QVA_BF16 && x->dtype != QVA_F16)
        return qvi_fail(QVA_ERR_DTYPE, "%s: %s has dtype %d", who, name, x->dtype);
    return QVA_OK;
}

/* Two floats -> two 16-bit values (FP16 if F16, else BF16), RNE, a in the
 * low half (the lower column of an MMA fragment register). */
template <int F16>
static __device__ __forceinline__ uint32_t qvc_pack2(float a, float b) {
    uint32_t u;
    if constexpr (F16) {
        const __half2 h = __floats2half2_rn(a, b);
        memcpy(&u, &h, sizeof u);
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        memcpy(&u, &h, sizeof u);
    }
    return u;
}

/* One element of a user view; bf16 and f16 widen to f32 exactly, as the
 * CPU's qvi_load_head does. */
template <int DT>
static __device__ __forceinline__ float qvc_ld(const void *p, int64_t off) {
    if constexpr (DT == QVA_F32) {
        return __ldg((const float *)p + off);
    } else {
        unsigned short u = __ldg((const unsigned short *)p + off);
        if constexpr (DT == QVA_BF16)
            return __uint_as_float((unsigned)u << 16);
        else
            return __half2float(__ushort_as_half(u));
    }
}

/* One 16-bit value (bf16 or f16 by DT) widened to f32 exactly. */
template <int DT>
static __device__ __forceinline__ float qvc_widen16(uint16_t u) {
    if constexpr (DT == QVA_BF16)
        return __uint_as_float((uint32_t)u << 16);
    else
        return __half2float(__ushort_as_half(u));
}

/* The 8 16-bit values of a 16-byte load (bf16 or f16 by DT), widened to
 * f32 exactly, in memory order. */
template <int DT>
static __device__ __forceinline__ void qvc_widen8(const uint4 &u, float *x) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (DT == QVA_BF16) {
            x[2 * i] = __uint_as_float(w[i] << 16);
            x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        } else {
            x[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xFFFFu)));
            x[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
        }
    }
}

/* max(a, b) per 16-bit lane in the input's format (bf16 or f16 by DT):
 * the packed max returns the operand that is not NaN (PTX max without
 * .NaN), as fmaxf does. */
template <int DT>
static __device__ __forceinline__ uint32_t qvc_hmax2(uint32_t a, uint32_t b) {
    if constexpr (DT == QVA_BF16) {
        const __nv_bfloat162 r = __hmax2(*(const __nv_bfloat162 *)&a, *(const __nv_bfloat162 *)&b);
        return *(const uint32_t *)&r;
    } else {
        const __half2 r = __hmax2(*(const __half2 *)&a, *(const __half2 *)&b);
        return *(const uint32_t *)&r;
    }
}

/* The lanes' minimum, as qvc_hmax2 (NaN skipped as fminf skips it). */
template <int DT>
static __device__ __forceinline__ uint32_t qvc_hmin2(uint32_t a, uint32_t b) {
    if constexpr (DT == QVA_BF16) {
        const __nv_bfloat162 r = __hmin2(*(const __nv_bfloat162 *)&a, *(const __nv_bfloat162 *)&b);
        return *(const uint32_t *)&r;
    } else {
        const __half2 r = __hmin2(*(const __half2 *)&a, *(const __half2 *)&b);
        return *(const uint32_t *)&r;
    }
}

/* m = max(m, |u|) per 16-bit lane of a 16-byte load.  Widening is
 * monotone and exact, so the widened result is the float running max's
 * bits (from m = +0, as fmaxf's loops start). */
template <int DT>
static __device__ __forceinline__ void qvc_amax16(uint4 &m, const uint4 &u) {
    m.x = qvc_hmax2<DT>(m.x, u.x & 0x7fff7fffu); /* |x|: the sign bits cleared */
    m.y = qvc_hmax2<DT>(m.y, u.y & 0x7fff7fffu);
    m.z = qvc_hmax2<DT>(m.z, u.z & 0x7fff7fffu);
    m.w = qvc_hmax2<DT>(m.w, u.w & 0x7fff7fffu);
}

/* Elements off .. off + 7 of a user view, widened to f32 exactly (qvc_ld).
 * VEC: qvc_view_vec_ok(view, 8) held on the host and off is a multiple of
 * 8, so they come as 16-byte loads (two for floats); else one by one. */
template <int DT, bool VEC>
static __device__ __forceinline__ void qvc_ld8(const void *p, int64_t off, float *x) {
    if constexpr (VEC && DT == QVA_F32) {
        const float4 *f = (const float4 *)((const float *)p + off);
        const float4 a = __ldg(f), b = __ldg(f + 1);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
        x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    } else if constexpr (VEC) {
        qvc_widen8<DT>(__ldg((const uint4 *)((const unsigned short *)p + off)), x);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = qvc_ld<DT>(p, off + i);
    }
}

/* Whether n-element vector loads (qvc_ld8, n = 8; prep_load4, n = 4) may
 * read x at every multiple of n: the base and every stride on a vector
 * boundary (n elements, at most 16 bytes). */
static inline bool qvc_view_vec_ok(const qvc_view *x, int n) {
    const int64_t es = x->dtype == QVA_F32 ? 4 : 2;
    const int64_t step = n * es > 16 ? 16 / es : n; /* elements per vector load */
    return ((uintptr_t)x->data % (uintptr_t)(step * es)) == 0 && x->sb % step == 0 &&
           x->sh % step == 0 && x->sn % step == 0;
}

/* Offset of row 0, channel 0 of head bh (B*H < 2^16, so 32-bit split). */
static __device__ __forceinline__ int64_t qvc_head_base(const qvc_view &v, int bh) {
    const int H = (int)v.H, b = bh / H, h = bh - b * H;
    return (int64_t)b * v.sb + (int64_t)(h / (int)v.hg) * v.sh;
}

/* ---- NVFP4 pieces (E4M3 scales, E2M1 codes), as src/formats.c ---- */

/* qva_e4m3_encode: RNE, saturating to +-448, NaN -> 0x7F (the hardware
 * cvt.rn.satfinite.e4m3x2.f32, sm_89+). */
static __device__ __forceinline__ uint32_t qvc_e4m3_code(float y) {
    return (uint32_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
}

/* qva_e4m3_decode (exact): (1 + m/8) 2^(e-7), subnormals m 2^-9, 0x7F/0xFF NaN. */
static __device__ __forceinline__ float qvc_e4m3_value(uint32_t code) {
    const uint32_t e = (code >> 3) & 15u, m = code & 7u;
    float mag;
    if (e == 15u && m == 7u)
        mag = __uint_as_float(0x7FC00000u);
    else if (e == 0u)
        mag = (float)m * 0x1p-9f;
    else
        mag = __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (code & 0x80u) ? -mag : mag;
}

/* qva_e2m1_encode: nearest of {0,.5,1,1.5,2,3,4,6}, a tie going to the
 * even code (so the thresholds alternate > and >=), saturating; the sign
 * is kept for a magnitude that rounds to 0; NaN -> 0.  Software: FP4
 * conversions (cvt ... e2m1x2) are sm_100+ only. */
static __device__ __forceinline__ uint32_t qvc_e2m1_code(float x) {
    if (isnan(x)) return 0u;
    const float a = fabsf(x);
    const uint32_t c = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) + (uint32_t)(a > 1.25f) +
                       (uint32_t)(a >= 1.75f) + (uint32_t)(a > 2.5f) + (uint32_t)(a >= 3.5f) +
                       (uint32_t)(a > 5.0f);
    return (signbit(x) ? 8u : 0u) | c;
}

/* qva_e2m1_decode of the low 4 bits (code 8 is -0). */
static __device__ __forceinline__ float qvc_e2m1_value(uint32_t code) {
    const uint32_t m = code & 7u;
    /* 0, .5, 1, 1.5 = m/2; 2, 3, 4, 6 = (m - 2) * (1 or 2) */
    const float mag = m < 4u ? 0.5f * (float)m : (m < 6u ? (float)(m - 2u) : (float)(2u * (m - 4u)));
    return (code & 8u) ? -mag : mag;
}

/* qva_nvfp4_tensor_scale: amax/2688, or 1 where that is not a positive
 * finite float. */
static __device__ __forceinline__ float qvc_nvfp4_tensor_scale(float amax) {
    if (!isfinite(amax)) return 1.0f;
    const float g = __fdiv_rn(amax, 2688.0f);
    return g > 0.0f ? g : 1.0f;
}

/* 16-byte global -> shared asynchronous copy (cp.async.cg). */
static __device__ __forceinline__ void qvc_cp_async16(void *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

/* One output element in the user's dtype (RNE), at element offset off. */
static __device__ __forceinline__ void qvc_store_out(void *out, int dtype, int64_t off, float x) {
    if (dtype == QVA_F32)
        ((float *)out)[off] = x;
    else if (dtype == QVA_BF16)
        ((__nv_bfloat16 *)out)[off] = __float2bfloat16_rn(x);
    else
        ((__half *)out)[off] = __float2half_rn(x);
}

#endif
