/*
 * The integer arithmetic of the adaptive MASS budget (docs/DRAFT.md,
 * "Adaptive budget") in one header that the CUDA router
 * (src/cuda/draft/router_select.cu) runs on the device, per head, and the
 * host compiles too.  The plan (src/draft/plan.c) calls the ppm rounding
 * and the split itself; the weight and the select are checked against the
 * CPU reference's own ranking (src/draft/router.c) by
 * tests/test_draft_adaptive.c, on many inputs, without a GPU.  Integers
 * only, so the device takes the CPU's decisions bit for bit:
 *
 *   qvi_budget_weight   w of one draft-map value from its f32 bits, as
 *                       qvi_draft_mass_weight (floor(A * 2^40), 0 for NaN
 *                       and A <= 0, 2^40 for A >= 1) by shifts alone
 *   qvi_budget_ppm_of   ceil or floor of ppm * x / 10^6 (qvi_draft_ppm_of)
 *   qvi_budget_split    qvi_draft_quotas' split, on fractions already in
 *                       parts per million (u[i] = llround(f_i * 10^6),
 *                       QVI_Q_* order): floors, then the largest
 *                       remainders, ties to 16, 8, 4, skip
 *   qvi_budget_sel      K_mass of one head by a weighted radix select on the
 *                       value bits of the ranking keys, a digit at a time
 *                       from per-digit counts and w-sums (the router's
 *                       histograms): qvi_budget_start, qvi_budget_digit for
 *                       shifts 56, 48, 40, 32, then qvi_budget_count
 */
#ifndef QVATTN_DRAFT_BUDGET_H
#define QVATTN_DRAFT_BUDGET_H

#include <stdint.h>

#ifdef __CUDACC__
#define QVI_BUDGET_FN static __host__ __device__ __forceinline__
#else
#define QVI_BUDGET_FN static inline
#endif

#define QVI_BUDGET_ONE ((uint64_t)1 << 40) /* = QVI_DRAFT_MASS_ONE */

/*
 * A positive normal f32 below 1 is m * 2^(e - 150) with the 24-bit
 * significand m and the biased exponent e in [1, 126], so
 * A * 2^40 = m * 2^(e - 110): a left shift for e >= 110, else a right
 * shift whose dropped bits are the floor.  Subnormals are below 2^-126,
 * far below 2^-40: weight 0.
 */
QVI_BUDGET_FN uint64_t qvi_budget_weight(uint32_t bits) {
    if (bits & 0x80000000u) return 0;       /* negative, -0, NaN with the sign set */
    if (bits > 0x7f800000u) return 0;       /* NaN */
    if (bits >= 0x3f800000u) return QVI_BUDGET_ONE; /* 1 <= A <= +inf */
    const int e = (int)(bits >> 23);
    if (e == 0) return 0;                   /* +0 and subnormals */
    const uint64_t m = (uint64_t)((bits & 0x7fffffu) | 0x800000u);
    return e >= 110 ? m << (e - 110) : (110 - e < 32 ? m >> (110 - e) : 0);
}

/* x = a * 10^6 + b: ppm * a <= x and ppm * b < 10^12 never overflow. */
QVI_BUDGET_FN uint64_t qvi_budget_ppm_of(uint64_t x, int64_t ppm, int round_up) {
    const uint64_t a = x / 1000000u, b = x % 1000000u, u = (uint64_t)ppm;
    const uint64_t low = u * b;
    return u * a + low / 1000000u + (round_up && low % 1000000u != 0);
}

/* quota[i] = floor(u[i] * pairs / U) plus one for the pairs - sum left,
 * by the largest remainder u[i] * pairs mod U (ties: the higher slot, 16
 * before 8, 4, skip).  U = sum u > 0; u[i] * pairs fits int64 for the
 * pairs the plan allows (at most INT64_MAX / 2e6). */
QVI_BUDGET_FN void qvi_budget_split(const int64_t u[4], int64_t pairs, int64_t quota[4]) {
    const int64_t U = u[0] + u[1] + u[2] + u[3];
    int64_t rem[4], total = 0;
    for (int i = 0; i < 4; ++i) {
        quota[i] = u[i] * pairs / U;
        rem[i] = u[i] * pairs % U;
        total += quota[i];
    }
    int bumped[4] = {0, 0, 0, 0};
    for (int64_t left = pairs - total; left > 0; --left) {
        int best = -1;
        for (int i = 3; i >= 0; --i)
            if (!bumped[i] && (best < 0 || rem[i] > rem[best])) best = i;
        bumped[best] = 1;
        ++quota[best];
    }
}

/*
 * Orderable 32-bit key of a draft-map value (the high half of the router's
 * ranking key): larger A -> larger key; NaN -> 0, below every number (the
 * CPU sorts NaN last); -0 and +0 equal (the CPU compares with !=).
 */
QVI_BUDGET_FN uint32_t qvi_budget_order_key(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The weighted select of one head: the weight still to reach inside the
 * current group (the keys whose value bits match prefix, bits 63..32 of
 * the ranking key), the count of keys ranked above the group, and done
 * once K_mass is known without a walk (T = 0). */
typedef struct qvi_budget_sel {
    uint64_t left, prefix;
    int64_t above;
    int done;
} qvi_budget_sel;

/* Before the first digit: T = ceil(mass_ppm * S / 10^6) of the total S. */
QVI_BUDGET_FN void qvi_budget_start(qvi_budget_sel *s, uint64_t S, int64_t mass_ppm) {
    s->left = qvi_budget_ppm_of(S, mass_ppm, 1);
    s->prefix = 0;
    s->above = 0;
    s->done = s->left == 0;
}

/*
 * One 8-bit value digit at `shift` (56, 48, 40, 32): cnt[d] and w[d] are
 * the count and the w-sum of the group's keys whose digit is d.  The keys
 * of higher digits rank first and weigh at least as much (w grows with
 * A), so walking from digit 255 down, the boundary key (where the ranked
 * prefix sum first reaches T) lies in the first digit whose w-sum reaches
 * what is left; the digits above are kept whole.  The group's w-sum is at
 * least `left`, so the walk stops by digit 0.
 */
QVI_BUDGET_FN void qvi_budget_digit(qvi_budget_sel *s, const unsigned *cnt, const uint64_t *w,
                                    int shift) {
    if (s->done) return;
    int d = 255;
    for (; d > 0 && s->left > w[d]; --d) {
        s->left -= w[d];
        s->above += cnt[d];
    }
    s->prefix |= (uint64_t)d << shift;
}

/*
 * K_mass after the last value digit: the group is the keys of one value
 * A, ranked consecutively (their order among themselves is the pair index)
 * and each of weight w(A) > 0 (the group's sum reaches a positive target),
 * so the boundary is its ceil(left / w(A))-th key.  A is positive, so its
 * f32 bits are the key without its top bit.
 */
QVI_BUDGET_FN int64_t qvi_budget_count(const qvi_budget_sel *s) {
    if (s->done) return 0;
    const uint64_t wa = qvi_budget_weight((uint32_t)(s->prefix >> 32) & 0x7fffffffu);
    return s->above + (int64_t)(wa ? (s->left + wa - 1) / wa : 0);
}

/* max(k, keep_min), then min(k, keep_max): the cap wins over the floor. */
QVI_BUDGET_FN int64_t qvi_budget_clamp(int64_t k, int64_t keep_min, int64_t keep_max) {
    k = k > keep_min ? k : keep_min;
    return k < keep_max ? k : keep_max;
}

#endif
