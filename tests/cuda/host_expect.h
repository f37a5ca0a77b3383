/*
 * host_expect.h: EXPECT for the host tests of the CUDA helpers (test_bs_chunks.cu,
 * test_bs_slots.cu): a failed property counts in check_failures (../core/check.h) and prints its
 * case, the first few only.
 */
#ifndef MI_TEST_HOST_EXPECT_H
#define MI_TEST_HOST_EXPECT_H

#include "../core/check.h"

static int expect_reported;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            check_failures++;                                                                      \
            if (expect_reported++ < 20) {                                                          \
                fprintf(stderr, "%s:%d: %s fails for ", __FILE__, __LINE__, #cond);                \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fputc('\n', stderr);                                                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#endif /* MI_TEST_HOST_EXPECT_H */
