/*
 * host_expect.h: EXPECT for the host tests of the CUDA helpers (test_bs_chunks.cu,
 * test_bs_slots.cu, test_vs_walk.cu): a failed property counts in check_failures
 * (../check.h) and prints its case, the first few only; and their seeded random source.
 */
#ifndef MI_TEST_HOST_EXPECT_H
#define MI_TEST_HOST_EXPECT_H

#include "../check.h"

#include <stdint.h>

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

/* xorshift64: the next value of a test's fixed sequence (state: its seed, then its last value) */
static inline uint64_t xorshift64(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

#endif /* MI_TEST_HOST_EXPECT_H */
