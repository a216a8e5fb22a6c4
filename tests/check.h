/* Minimal test harness: CHECK records a failure and continues; a test
 * program returns check_summary() from main. */
#ifndef QVA_CHECK_H
#define QVA_CHECK_H
#include <stdio.h>
#include <math.h>

static int check_failures_ = 0;
static int check_count_ = 0;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        ++check_count_;                                                       \
        if (!(cond)) {                                                        \
            ++check_failures_;                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
        }                                                                     \
    } while (0)

#define CHECK_NEAR(a, b, tol, what)                                           \
    CHECK(fabs((double)(a) - (double)(b)) <= (tol), "%s: %.9g vs %.9g (tol %g)", \
          what, (double)(a), (double)(b), (double)(tol))

/* The tests' random numbers: splitmix64, seeded per file by defining
 * TEST_RNG_SEED before including this header. */
#include <stdint.h>
#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x243F6A8885A308D3ull
#endif
static uint64_t rng_state = TEST_RNG_SEED;
/* The next number of the generator whose state is *s (for a state of its
 * own, e.g. one per thread). */
static uint64_t rng_u64_of(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t rng_u64(void) { return rng_u64_of(&rng_state); }
/* Uniform in [0, 1). */
static double rng_unit(void) { return (double)(rng_u64() >> 11) * 0x1p-53; }
/* Standard normal (Box-Muller, one of the pair). */
static inline double rng_gauss(void) {
    const double u = rng_unit() + 1e-12, w = rng_unit();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

static int check_summary(const char *name) {
    printf("%s: %d checks, %d failures\n", name, check_count_, check_failures_);
    return check_failures_ ? 1 : 0;
}
#endif
