/* check.h: a minimal assertion counter for the core tests. Each failure prints its location;
 * main returns the failure count so ctest reports it. */
#ifndef MI_TEST_CHECK_H
#define MI_TEST_CHECK_H

#include <stdio.h>

static int check_failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            check_failures++;                                                                      \
        }                                                                                          \
    } while (0)

#define CHECK_STATUS(expr, want)                                                                   \
    do {                                                                                           \
        mi_status got_ = (expr);                                                                   \
        if (got_ != (want)) {                                                                      \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr,     \
                    mi_status_name(got_), mi_status_name(want));                                   \
            check_failures++;                                                                      \
        }                                                                                          \
    } while (0)

#define CHECK_SUMMARY(name)                                                                        \
    (fprintf(stderr, "%s: %s (%d failures)\n", name, check_failures ? "FAIL" : "PASS",             \
             check_failures),                                                                      \
     check_failures ? 1 : 0)

#endif
