/*
 * Per-element pieces shared by the attention kernels with 8-bit operands
 * (dense/attn8_ws.cuh: wgmma, warp-specialized; the draft kernels'
 * INT8 phases, mma.sync and wgmma).
 * All keep S and O in the m16n8 accumulator layout (row g and g+8,
 * columns 2*tig and 2*tig+1 of every 8-column chunk), so the probability
 * packing and the epilogue are the same code.
 */
#ifndef QVATTN_ATTN_COMMON_CUH
#define QVATTN_ATTN_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "device_util.cuh"
#include "mma_sync.cuh"

/* Offset that puts the row max at the top of E4M3's range: p = 2^(s-m+8.807)
 * so the largest probability encodes as 448 (VC §3.3, NUMERICS §3). */
#define QVC_P_AMP 8.807f

/* The Q scales of a thread's rows `row` and row + 8 (qvc_ops.q_scale: per
 * row, or per 128 rows; padding rows have their own scales). */
static __device__ __forceinline__ void qvc_q_scales(const qvc_ops &ops, int bh, int row,
                                                    float (&dq)[2]) {
    const int rps = ops.q_rows_per_scale;
    const float *qs = ops.q_scale + (size_t)bh * (ops.nq_pad / rps);
    dq[0] = __ldg(qs + row / rps);
    dq[1] = __ldg(qs + (row + 8) / rps);
}

/* VC Eq. 7 with the float expression of docs/NUMERICS-formats.md; add is
 * the addend 120 + beta. */
static __device__ __forceinline__ uint32_t qvc_expcast_code(float u, float add) {
    float t = __fmaf_rn(8.0f, u, add);
    if (!(t >= 0.0f)) return 0;
    return (uint32_t)rintf(fminf(t, 120.0f));
}

/* round_f16_sat of src/cpu/row.c: RNE to FP16, clamped to +-65504
 * (the 8-bit block partials of Table 6). */
static __device__ __forceinline__ float qvc_f16_sat(float x) {
    const float h = __half2float(__float2half_rn(x));
    return h > 65504.0f ? 65504.0f : h < -65504.0f ? -65504.0f : h;
}

/* Two probabilities -> two E4M3 codes (low byte first).  Without ExpCast
 * their FP32 values are added to *rowsum; with ExpCast the row sum of the
 * decoded codes comes from the PV product instead (a ones column). */
static __device__ __forceinline__ uint32_t qvc_prob_codes2(float s0, float s1, float m,
                                                           int expcast, float ec_add,
                                                           float *rowsum) {
    if (expcast) return qvc_expcast_code(s0 - m, ec_add) | (qvc_expcast_code(s1 - m, ec_add) << 8);
    float p0 = exp2f((s0 - m) + QVC_P_AMP), p1 = exp2f((s1 - m) + QVC_P_AMP);
    *rowsum += p0;
    *rowsum += p1;
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(p0, p1), __NV_SATFINITE, __NV_E4M3);
}

/* Pack the P codes of 32 keys (four 8-key accumulator chunks c4..c4+3,
 * two rows) into one m16k32 A fragment.  s points at chunk 4c: s[i][0..3]
 * as in the accumulator layout.  The key order this produces is
 * qvc_pv_slot_key(), which the prep kernel used to lay out V. */
static __device__ __forceinline__ void qvc_pack_p32(const float (*s)[4], float m0, float m1,
                                                    int expcast, float ec_add, float *rs,
                                                    uint32_t *pa) {
    uint32_t lo0 = qvc_prob_codes2(s[0][0], s[0][1], m0, expcast, ec_add, &rs[0]);
    uint32_t hi0 = qvc_prob_codes2(s[1][0], s[1][1], m0, expcast, ec_add, &rs[0]);
    uint32_t lo1 = qvc_prob_codes2(s[0][2], s[0][3], m1, expcast, ec_add, &rs[1]);
    uint32_t hi1 = qvc_prob_codes2(s[1][2], s[1][3], m1, expcast, ec_add, &rs[1]);
    uint32_t lo2 = qvc_prob_codes2(s[2][0], s[2][1], m0, expcast, ec_add, &rs[0]);
    uint32_t hi2 = qvc_prob_codes2(s[3][0], s[3][1], m0, expcast, ec_add, &rs[0]);
    uint32_t lo3 = qvc_prob_codes2(s[2][2], s[2][3], m1, expcast, ec_add, &rs[1]);
    uint32_t hi3 = qvc_prob_codes2(s[3][2], s[3][3], m1, expcast, ec_add, &rs[1]);
    pa[0] = lo0 | (hi0 << 16);
    pa[1] = lo1 | (hi1 << 16);
    pa[2] = lo2 | (hi2 << 16);
    pa[3] = lo3 | (hi3 << 16);
}

/* Two adjacent output columns (off, off+1) in one store where the dtype
 * allows it; the column stride is 1 (qvc_check_view). */
static __device__ __forceinline__ void qvc_store_out2(void *out, int dtype, int64_t off, float x0,
                                                      float x1) {
    __nv_bfloat16 *pb = (__nv_bfloat16 *)out + off;
    __half *ph = (__half *)out + off;
    if (dtype == QVA_BF16 && !((uintptr_t)pb & 3)) {
        *(__nv_bfloat162 *)pb = __floats2bfloat162_rn(x0, x1);
    } else if (dtype == QVA_F16 && !((uintptr_t)ph & 3)) {
        *(__half2 *)ph = __floats2half2_rn(x0, x1);
    } else {
        qvc_store_out(out, dtype, off, x0);
        qvc_store_out(out, dtype, off + 1, x1);
    }
}

#endif
