/*
 * The online softmax of every device kernel (VC Eq. 1; the CPU's
 * qvi_row_raise_max and qvi_row_finish): the running max m and row sum l of
 * a thread's rows, the rescale of O when the max rises, the convention for
 * a row that has seen no finite score, and the epilogue's test of what a
 * row writes (qvc_softmax_row: the result, zeros, or NaN).
 *
 * The -inf convention: while a row's running max is -inf, its O and l are
 * still zero, so the rescale factor alpha is 1 (x * 1 is exact: the CPU's
 * "no rescale"), and the exponent is taken against 0, not -inf, so that a
 * masked score gives exp2(-inf) = 0 and never NaN.
 *
 * Paths differ in how they round, and each keeps its bits through named
 * options:
 *   QVC_SM_SKIP_UNCHANGED  leave O alone when no row of the warp moved
 *                          (alpha == 1 exactly: the same result, fewer
 *                          multiplies; warp-uniform, so call it from all 32
 *                          lanes)
 *   QVC_SM_EXACT_MUL       the l and O rescale as __fmul_rn, never fused
 *                          with a later add (the mma.sync bf16 and draft
 *                          kernels, which match the CPU's separate roundings)
 *   QVC_SM_EXP2_RN         alpha by a correctly rounded exp2 (the emulated
 *                          FP4 kernel's order of operations), not exp2f
 *
 * Thread layout: a thread holds two rows (r = 0, 1: g and g + 8 of an
 * m16n8 fragment); O is [NT][4] with columns 0, 1 of row 0 and 2, 3 of
 * row 1, as both mma.sync and wgmma accumulators lay it out.
 */
#ifndef QVATTN_SOFTMAX_CUH
#define QVATTN_SOFTMAX_CUH

#include "common/device_util.cuh"
#include "common/mma_sync.cuh"

enum {
    QVC_SM_SKIP_UNCHANGED = 1,
    QVC_SM_EXACT_MUL = 2,
    QVC_SM_EXP2_RN = 4,
};

/* A flat wgmma accumulator float[4 NT] seen as the [NT][4] fragment rows. */
template <int N>
static __device__ __forceinline__ float (&qvc_rows_of(float (&o)[N]))[N / 4][4] {
    return *(float(*)[N / 4][4])o;
}

/* ex2.approx.ftz: 2 ulp, flushes subnormal results. */
static __device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Correctly rounded exp2 in FP32. */
static __device__ __forceinline__ float exp2_rn(float x) {
    return __double2float_rn(exp2((double)x));
}

/* The rescale factor when the running max moves from m to mx >= m. */
template <int OPTS>
static __device__ __forceinline__ float qvc_softmax_alpha(float m, float mx) {
    if (!(mx > m && m != -INFINITY)) return 1.0f;
    return (OPTS & QVC_SM_EXP2_RN) ? exp2_rn(__fsub_rn(m, mx)) : exp2f(__fsub_rn(m, mx));
}

/* The max an exponent is taken against: 0 for a row with no finite score. */
static __device__ __forceinline__ float qvc_softmax_shift(float m) {
    return m == -INFINITY ? 0.0f : m;
}

/* What the epilogue writes for a row: the CPU's qvi_row_finish
 * (docs/NUMERICS.md §2, "Rows the arithmetic cannot finish"), so every
 * backend keeps one contract.
 *   QVC_ROW_NORMAL  m and l finite, l > 0: O / l and the LSE, as before
 *   QVC_ROW_EMPTY   not normal, and the row retained no key (a draft row
 *                   whose blocks were all skipped, with no prefix): zeros,
 *                   LSE -inf
 *   QVC_ROW_NAN     not normal although the row retained keys: a score
 *                   overflowed FP32 (+inf max; or every score -inf), or a
 *                   NaN reached the sum: NaN, LSE NaN — never quiet zeros
 * retained: the row had a key to attend to (dense kernels: always). */
enum { QVC_ROW_NORMAL = 0, QVC_ROW_EMPTY = 1, QVC_ROW_NAN = 2 };
static __device__ __forceinline__ int qvc_softmax_row(float m, float l, bool retained) {
    if (isfinite(m) && l > 0.0f && isfinite(l)) return QVC_ROW_NORMAL;
    return retained ? QVC_ROW_NAN : QVC_ROW_EMPTY;
}
/* What a row that is not QVC_ROW_NORMAL writes for each output (0 or NaN)
 * and for its LSE (-inf or NaN); the LSE shift keeps either. */
static __device__ __forceinline__ float qvc_softmax_fill(int kind) {
    return kind == QVC_ROW_EMPTY ? 0.0f : __int_as_float(0x7fc00000);
}
static __device__ __forceinline__ float qvc_softmax_lse_fill(int kind) {
    return kind == QVC_ROW_EMPTY ? -INFINITY : __int_as_float(0x7fc00000);
}

static __device__ __forceinline__ float qvc_sm_mul(float x, float a, int exact) {
    return exact ? __fmul_rn(x, a) : x * a;
}

/* Raise the running max of both rows to mx (mx >= m): alpha per row, and m
 * and l updated; O is left to qvc_softmax_rescale (a kernel may still have
 * a wgmma writing it). */
template <int OPTS>
static __device__ __forceinline__ void qvc_softmax_new_max(const float *mx, float *m, float *l,
                                                           float *alpha) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        alpha[r] = qvc_softmax_alpha<OPTS>(m[r], mx[r]);
        l[r] = qvc_sm_mul(l[r], alpha[r], OPTS & QVC_SM_EXACT_MUL);
        m[r] = fmaxf(m[r], mx[r]);
    }
}

template <int OPTS, int NT>
static __device__ __forceinline__ void qvc_softmax_rescale(float (&o)[NT][4], const float *alpha) {
    if ((OPTS & QVC_SM_SKIP_UNCHANGED) &&
        !__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
        return;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        o[n][0] = qvc_sm_mul(o[n][0], alpha[0], OPTS & QVC_SM_EXACT_MUL);
        o[n][1] = qvc_sm_mul(o[n][1], alpha[0], OPTS & QVC_SM_EXACT_MUL);
        o[n][2] = qvc_sm_mul(o[n][2], alpha[1], OPTS & QVC_SM_EXACT_MUL);
        o[n][3] = qvc_sm_mul(o[n][3], alpha[1], OPTS & QVC_SM_EXACT_MUL);
    }
}

/* Both: the new max, then O rescaled. */
template <int OPTS, int NT>
static __device__ __forceinline__ void qvc_softmax_raise(const float *mx, float *m, float *l,
                                                         float (&o)[NT][4]) {
    float alpha[2];
    qvc_softmax_new_max<OPTS>(mx, m, l, alpha);
    qvc_softmax_rescale<OPTS>(o, alpha);
}

/* The running max raised by a block of scores s ([NT][4] fragment rows):
 * mx = max(m, the row's scores), reduced over the quad. */
template <int NT>
static __device__ __forceinline__ void qvc_softmax_row_max(const float (&s)[NT][4], const float *m,
                                                           float *mx) {
    mx[0] = m[0], mx[1] = m[1];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
    mx[0] = qvc_quad_max(mx[0]);
    mx[1] = qvc_quad_max(mx[1]);
}

/* The 16-bit P of one block of m16n8 fragments s[NT][4]: p = exp2(s - m)
 * in FP32, the thread's row sums rs in key order (exact adds, the CPU's
 * order within a thread), p rounded to BF16 (FP16 if F16) as the PV A
 * fragments: pa[c] holds keys 16c .. 16c + 15. */
template <int F16, int NT>
static __device__ __forceinline__ void qvc_softmax_probs16(const float (&s)[NT][4], const float *m,
                                                           float *rs, uint32_t (&pa)[NT / 2][4]) {
    const float mr0 = qvc_softmax_shift(m[0]), mr1 = qvc_softmax_shift(m[1]);
#pragma unroll
    for (int c = 0; c < NT / 2; ++c) {
        const float *lo = s[2 * c], *hi = s[2 * c + 1];
        const float p0 = exp2f(__fsub_rn(lo[0], mr0)), p1 = exp2f(__fsub_rn(lo[1], mr0));
        const float p2 = exp2f(__fsub_rn(lo[2], mr1)), p3 = exp2f(__fsub_rn(lo[3], mr1));
        const float p4 = exp2f(__fsub_rn(hi[0], mr0)), p5 = exp2f(__fsub_rn(hi[1], mr0));
        const float p6 = exp2f(__fsub_rn(hi[2], mr1)), p7 = exp2f(__fsub_rn(hi[3], mr1));
        rs[0] = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(rs[0], p0), p1), p4), p5);
        rs[1] = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(rs[1], p2), p3), p6), p7);
        pa[c][0] = qvc_pack2<F16>(p0, p1); /* row g,     keys 16c + 2t     */
        pa[c][1] = qvc_pack2<F16>(p2, p3); /* row g + 8, keys 16c + 2t     */
        pa[c][2] = qvc_pack2<F16>(p4, p5); /* row g,     keys 16c + 8 + 2t */
        pa[c][3] = qvc_pack2<F16>(p6, p7); /* row g + 8, keys 16c + 8 + 2t */
    }
}

/* The row sums of a block of E4M3 P codes pa (keys 32c .. 32c + 31 in
 * pa[c]): with ExpCast the sum of the values the codes decode to (Prop.
 * 3.1), from one extra MMA against a column of E4M3 ones (0x38), with no
 * per-element decode (every column of the 16x8 tile holds the same sums);
 * else the quad sum of the thread's FP32 partials rs. */
template <int NC>
static __device__ __forceinline__ void qvc_softmax_code_sums(const uint32_t (&pa)[NC][4],
                                                             int expcast, float *rs) {
    if (expcast) {
        float ones[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < NC; ++c) qvc_mma_e4m3(ones, pa[c], 0x38383838u, 0x38383838u);
        rs[0] = ones[0];
        rs[1] = ones[2];
    } else {
        rs[0] = qvc_quad_sum(rs[0]);
        rs[1] = qvc_quad_sum(rs[1]);
    }
}

#endif
