/*
 * test_bs_slots.cu: the slots the masked appends of the block-sparse streaming kernel give a
 * plain tile's candidates (src/cuda/bs_slots.cuh), on the host: the functions the kernel calls,
 * checked without a GPU on a quad's masks of every density. Properties: the four lanes' masks,
 * moved to the row's key order, are disjoint and mark exactly the passing keys; each passing key's
 * slot is the number of passing keys above it in the row (counted from the lanes' own masks), so
 * the slots are 0 .. n - 1, one per key, in descending key order.
 */
#include "bs_slots.cuh"

#include "host_expect.h"

using namespace mi_cuda;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_random() { return xorshift64(&rng_state); }

/* One row of a tile: own[t][w] is lane t's mask (only the bits of its keys may be set). */
static void test_quad(const uint32_t (&own)[4][2], int case_no) {
    /* the row's key order, from the lanes' masks */
    uint64_t row = 0;
    int bits = 0;
    for (int t = 0; t < 4; ++t) {
        uint32_t lo, hi;
        bss_lane_row_mask(own[t][0], own[t][1], t, lo, hi);
        const uint64_t moved = (uint64_t)hi << 32 | lo;
        EXPECT((row & moved) == 0, "case %d: lane %d overlaps", case_no, t);
        row |= moved;
        bits += __builtin_popcountll(moved);
        EXPECT(__builtin_popcountll(moved) ==
                   __builtin_popcount(own[t][0]) + __builtin_popcount(own[t][1]),
               "case %d: lane %d loses keys", case_no, t);
    }
    /* each key where it belongs, and its slot */
    bool passes[64] = {false};
    for (int t = 0; t < 4; ++t)
        for (int nt = 0; nt < 8; ++nt)
            for (int e = 0; e < 2; ++e)
                passes[8 * nt + 2 * t + e] = (own[t][nt >> 2] >> bss_own_bit(nt, e)) & 1u;
    bool slot_taken[64] = {false};
    for (int t = 0; t < 4; ++t)
        for (int nt = 0; nt < 8; ++nt)
            for (int e = 0; e < 2; ++e) {
                const int j = 8 * nt + 2 * t + e;
                EXPECT(((row >> j) & 1u) == (uint64_t)passes[j], "case %d: key %d", case_no, j);
                if (!passes[j]) continue;
                int higher = 0;
                for (int j2 = j + 1; j2 < 64; ++j2) higher += passes[j2];
                const int slot = bss_keys_above(row >> (2 * t), nt, e);
                EXPECT(slot == higher, "case %d: key %d slot %d, %d keys above", case_no, j, slot,
                       higher);
                EXPECT(slot >= 0 && slot < bits && !slot_taken[slot], "case %d: key %d slot %d",
                       case_no, j, slot);
                if (slot >= 0 && slot < 64) slot_taken[slot] = true;
            }
}

int main() {
    /* a lane's keys: bits 0 and 1 of each byte of each word */
    const uint32_t keys = 0x03030303u;
    int case_no = 0;
    const uint32_t fixed[] = {0u, keys, 0x01010101u, 0x02020202u, 0x00000003u, 0x03000000u};
    for (uint32_t a : fixed)
        for (uint32_t b : fixed) {
            const uint32_t own[4][2] = {{a, b}, {b, a}, {a, a}, {b, b}};
            test_quad(own, case_no++);
        }
    /* random masks, each key passing with probability 1/64 .. 63/64 */
    for (int round = 0; round < 20000; ++round) {
        const int p = 1 + round % 63;
        uint32_t own[4][2];
        for (int t = 0; t < 4; ++t)
            for (int w = 0; w < 2; ++w) {
                uint32_t m = 0;
                for (int bit = 0; bit < 32; ++bit)
                    if (((keys >> bit) & 1u) && (int)(next_random() % 64) < p) m |= 1u << bit;
                own[t][w] = m;
            }
        test_quad(own, case_no++);
    }
    /* one key at a time */
    for (int t = 0; t < 4; ++t)
        for (int nt = 0; nt < 8; ++nt)
            for (int e = 0; e < 2; ++e) {
                uint32_t own[4][2] = {{0u, 0u}, {0u, 0u}, {0u, 0u}, {0u, 0u}};
                own[t][nt >> 2] = 1u << bss_own_bit(nt, e);
                test_quad(own, case_no++);
            }
    return check_finish("bs_slots");
}
