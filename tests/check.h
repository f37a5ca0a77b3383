/*
 * check.h: the check macros of every C test program (header-only; one translation unit each).
 *
 * A failed check prints its location, the condition, the seed of the data under test (when the
 * test set check_seed) and an optional printf-style message, counts, and the test goes on; main
 * returns check_finish(name), non-zero when any check failed, so ctest reports it.
 *
 *   CHECK(cond[, fmt, ...])       any condition
 *   CHECK_EQ(a, b)                integers, both values printed
 *   CHECK_NEAR(a, b, tol)         |a - b| <= tol, both values printed (NaN fails)
 *   CHECK_STATUS(expr, want)      an mi_status call returns want
 *   CHECK_OK(expr)                an mi_status call succeeds
 */
#ifndef MI_TEST_CHECK_H
#define MI_TEST_CHECK_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

static int check_failures;  /* failed checks of this program */
static int check_count;     /* checks run */
static uint64_t check_seed; /* the seed of the data under test; 0: none */

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 4, 5)))
#endif
static inline void
check_fail_(const char *file, int line, const char *cond, const char *fmt, ...) {
    check_failures++;
    fprintf(stderr, "%s:%d: check failed: %s", file, line, cond);
    if (check_seed) fprintf(stderr, " (seed %llu)", (unsigned long long)check_seed);
    /* fmt is " " and the caller's message: print ':' and the message only when there is one */
    if (fmt[1]) {
        va_list ap;
        va_start(ap, fmt);
        fputc(':', stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
}

/* The message is optional: " " __VA_ARGS__ pastes a leading space onto the caller's format (and
 * is the whole format when there is none). text is what the failure names. */
#define CHECK_IF_(ok, text, ...)                                                                   \
    do {                                                                                           \
        check_count++;                                                                             \
        if (!(ok)) check_fail_(__FILE__, __LINE__, text, " " __VA_ARGS__);                         \
    } while (0)

#define CHECK(cond, ...) CHECK_IF_(cond, #cond, __VA_ARGS__)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        const long long a_ = (long long)(a), b_ = (long long)(b);                                  \
        CHECK_IF_(a_ == b_, #a " == " #b, "%lld != %lld", a_, b_);                                 \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        const double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                       \
        CHECK_IF_(a_ - b_ <= t_ && b_ - a_ <= t_, #a " near " #b, "%.9g vs %.9g (tolerance %g)",   \
                  a_, b_, t_);                                                                     \
    } while (0)

#define CHECK_STATUS(expr, want)                                                                   \
    do {                                                                                           \
        const mi_status got_ = (expr);                                                             \
        CHECK_IF_(got_ == (want), #expr, "returned %s, expected %s", mi_status_name(got_),         \
                  mi_status_name(want));                                                           \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, MI_STATUS_SUCCESS)

/* The exit code of a test program: 0 when every check passed. */
static inline int check_finish(const char *name) {
    if (check_failures)
        fprintf(stderr, "%s: %d of %d checks failed\n", name, check_failures, check_count);
    else
        printf("%s: all checks passed (%d)\n", name, check_count);
    return check_failures ? 1 : 0;
}

#endif /* MI_TEST_CHECK_H */
