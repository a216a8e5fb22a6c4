/*
 * Overflow-checked int64 arithmetic: the one place where sizes, strides,
 * grid products and counts computed from user input are checked.  Each
 * helper stores the exact result and returns 1, or returns 0 when the
 * result does not fit in int64 (then *r is unspecified).  Header-only and
 * free of library internals, so the CLI (tools/cli) uses it too.
 */
#ifndef QVATTN_CHECKED_H
#define QVATTN_CHECKED_H

#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
static inline int qvi_add_i64(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_add_overflow(a, b, r);
}
static inline int qvi_mul_i64(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_mul_overflow(a, b, r);
}
#else
static inline int qvi_add_i64(int64_t a, int64_t b, int64_t *r) {
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) return 0;
    *r = a + b;
    return 1;
}
static inline int qvi_mul_i64(int64_t a, int64_t b, int64_t *r) {
    if (a != 0 && b != 0) {
        if (a > 0 ? (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a)
                  : (b > 0 ? a < INT64_MIN / b : b < INT64_MAX / a))
            return 0;
    }
    *r = a * b;
    return 1;
}
#endif

/* The product of v[0..n): 1 and the exact value, or 0 on overflow. */
static inline int qvi_prod_i64(const int64_t *v, int n, int64_t *r) {
    int64_t p = 1;
    for (int i = 0; i < n; ++i)
        if (!qvi_mul_i64(p, v[i], &p)) return 0;
    *r = p;
    return 1;
}

/* a * b, or INT64_MAX when it overflows (for results that must stay
 * defined and be rejected later, such as the strides of a descriptor). */
static inline int64_t qvi_mul_sat_i64(int64_t a, int64_t b) {
    int64_t r;
    return qvi_mul_i64(a, b, &r) ? r : INT64_MAX;
}

#endif
