/*
 * The synthetic workload's arithmetic that must give the same bits on every
 * machine: sin, cos, log and exp from +, -, *, / and bit operations (IEEE
 * 754 makes each exact or correctly rounded, so no libm can change a bit),
 * and the random streams (xoshiro256** seeded by splitmix64, Box-Muller
 * normals).  Inline: the generator's hot loops call them per element.  A
 * fused a*b+c would change bits, so contraction is off wherever this is
 * included.
 */
#ifndef QVATTN_SYNTHETIC_DET_MATH_H
#define QVATTN_SYNTHETIC_DET_MATH_H

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------ elementary */
/* pi/2 and ln 2 split so that k*HI is exact for |k| < 2^20 (Cody-Waite). */
#define PIO2_HI 0x1.921fb54p+0
#define PIO2_LO 0x1.10b4611a62633p-30
#define TWO_OVER_PI 0x1.45f306dc9c883p-1
#define TWO_PI 0x1.921fb54442d18p+2
#define LN2_HI 0x1.62e42fe8p-1
#define LN2_LO 0x1.e8e7bcd5e4f1ep-31
#define LN2 0x1.62e42fefa39efp-1

/* Series coefficients as constant expressions: the compiler folds them
 * with correct rounding, so they are the same bits everywhere, and the
 * loops below multiply instead of divide. */
static const double SIN_C[7] = {
    1.0 / (2.0 * 3.0),   1.0 / (4.0 * 5.0),   1.0 / (6.0 * 7.0),
    1.0 / (8.0 * 9.0),   1.0 / (10.0 * 11.0), 1.0 / (12.0 * 13.0),
    1.0 / (14.0 * 15.0)};
static const double COS_C[7] = {
    1.0 / (1.0 * 2.0),   1.0 / (3.0 * 4.0),   1.0 / (5.0 * 6.0),
    1.0 / (7.0 * 8.0),   1.0 / (9.0 * 10.0),  1.0 / (11.0 * 12.0),
    1.0 / (13.0 * 14.0)};
static const double LOG_C[9] = {1.0,       1.0 / 3.0,  1.0 / 5.0,
                                1.0 / 7.0, 1.0 / 9.0,  1.0 / 11.0,
                                1.0 / 13.0, 1.0 / 15.0, 1.0 / 17.0};

/* sin and cos of r in [-pi/4, pi/4] turned by q quarter turns, from
 * Taylor series with `terms` terms after the first: 7 (to r^15, error
 * < 1e-13) for the tables, 5 (to r^11, < 2e-9) inside Box-Muller, whose
 * f32 noise needs no more and which dominates the generation time. */
static inline void sincos_turned(double r, int q, int terms, double *s,
                                 double *c) {
    double r2 = r * r, ps = 1.0, pc = 1.0;
    for (int i = terms - 1; i >= 0; --i) {
        ps = 1.0 - ps * r2 * SIN_C[i];
        pc = 1.0 - pc * r2 * COS_C[i];
    }
    double sr = r * ps, cr = pc;
    switch (q & 3) { /* two's complement: also right for q < 0 */
    case 0: *s = sr; *c = cr; break;
    case 1: *s = cr; *c = -sr; break;
    case 2: *s = -sr; *c = -cr; break;
    default: *s = -cr; *c = sr; break;
    }
}

/* sin and cos of x, |x| < 1e5 (Cody-Waite reduction by pi/2). */
static inline void det_sincos(double x, double *s, double *c) {
    double k = floor(x * TWO_OVER_PI + 0.5);
    double r = (x - k * PIO2_HI) - k * PIO2_LO;
    sincos_turned(r, (int)(long long)k, 7, s, c);
}

/* ln x for a positive normal x: x = m 2^e split by bit operations (an
 * inline frexp), m in [0.707, 1.414), then 2 atanh((m-1)/(m+1)) with
 * |z| <= 0.172: `terms` = 9 (to z^17) is good to 1e-14, 5 to 1e-9. */
static inline double log_series(double x, int terms) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    int e = (int)((bits >> 52) & 0x7FF) - 1022;
    bits = (bits & ~(0x7FFull << 52)) | (1022ull << 52);
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m < 0.70710678118654752) {
        m *= 2.0;
        e -= 1;
    }
    double z = (m - 1.0) / (m + 1.0), z2 = z * z, sum = 0.0;
    for (int i = terms - 1; i >= 0; --i) sum = sum * z2 + LOG_C[i];
    return 2.0 * z * sum + (double)e * LN2;
}

static inline double det_log(double x) { return log_series(x, 9); }

/* e^x for |x| < 700 (only the RoPE frequencies and one gain use it). */
static inline double det_exp(double x) {
    double k = floor(x / LN2 + 0.5);
    double r = (x - k * LN2_HI) - k * LN2_LO;
    double p = 1.0;
    for (int n = 14; n >= 1; --n) p = 1.0 + p * r / (double)n;
    return ldexp(p, (int)k);
}

/* ------------------------------------------------------------ random */
static inline uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Stateless hash of (a, b): picks cells, tokens and channels. */
static inline uint64_t hash2(uint64_t a, uint64_t b) {
    uint64_t x = a ^ (b * 0xD1B54A32D192ED03ULL);
    return splitmix64(&x);
}

typedef struct syn_rng {
    uint64_t s[4];
    int has_spare; /* Box-Muller makes normals in pairs */
    double spare;
} syn_rng;

static inline void rng_seed(syn_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; ++i) r->s[i] = splitmix64(&x);
    r->has_spare = 0;
    r->spare = 0.0;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** */
static inline uint64_t rng_next(syn_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double rng_uniform(syn_rng *r) {
    return (double)(rng_next(r) >> 11) * 0x1p-53;
}

/*
 * Box-Muller: two standard normals from u1 in (0, 1] (normal: >= 2^-53)
 * and u2 in [0, 1), with the short series.  The angle 2 pi u2 is reduced
 * in quarter turns: t = 4 u2 and t - round(t) are exact.
 */
static inline void box_muller(double u1, double u2, double *z0, double *z1) {
    double rad = sqrt(-2.0 * log_series(u1, 5)), s, c;
    double t = 4.0 * u2, k = (double)(int)(t + 0.5);
    sincos_turned((t - k) * (TWO_PI / 4.0), (int)k, 5, &s, &c);
    *z0 = rad * c;
    *z1 = rad * s;
}

static inline double rng_normal(syn_rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r), z0;
    box_muller(u1, u2, &z0, &r->spare);
    r->has_spare = 1;
    return z0;
}

/* n (even) normals of the stream in one go: the uniforms are drawn first,
 * then the transforms run as independent iterations the CPU overlaps (the
 * per-token noise is most of the generation time).  Same values as n
 * calls of rng_normal from a stream without a spare. */
static inline void normal_row(syn_rng *r, double *out, int n) {
    for (int i = 0; i < n; i += 2) {
        out[i] = 1.0 - rng_uniform(r);
        out[i + 1] = rng_uniform(r);
    }
    for (int i = 0; i < n; i += 2)
        box_muller(out[i], out[i + 1], &out[i], &out[i + 1]);
}

#endif
