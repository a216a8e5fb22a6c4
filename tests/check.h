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

static int check_summary(const char *name) {
    printf("%s: %d checks, %d failures\n", name, check_count_, check_failures_);
    return check_failures_ ? 1 : 0;
}
#endif
