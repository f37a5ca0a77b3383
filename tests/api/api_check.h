/* api_check.h: assertion counting for the API tests. A failure prints its location and keeps
 * going; main returns non-zero when any check failed. */
#ifndef MI_API_CHECK_H
#define MI_API_CHECK_H

#include <stdio.h>

static int api_failures;
static int api_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        api_checks++;                                                                              \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            api_failures++;                                                                        \
        }                                                                                          \
    } while (0)

#define CHECK_STATUS(expr, want)                                                                   \
    do {                                                                                           \
        api_checks++;                                                                              \
        mi_status got_ = (expr);                                                                   \
        if (got_ != (want)) {                                                                      \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr,     \
                    mi_status_name(got_), mi_status_name(want));                                   \
            api_failures++;                                                                        \
        }                                                                                          \
    } while (0)

#define API_SUMMARY(name)                                                                          \
    (fprintf(stderr, "%s: %d checks, %d failed\n", name, api_checks, api_failures),                \
     api_failures ? 1 : 0)

#endif /* MI_API_CHECK_H */
