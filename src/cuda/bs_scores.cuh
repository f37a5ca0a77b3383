/*
 * bs_scores.cuh: the layout of the block-sparse estimate's scores in memory and the bit-by-bit
 * k-th largest that its select runs (bs_score_kernel in bs_score_mem.cuh, bs_row_select_kernel
 * in bs_row_select.cuh), on the host and the device alike, so that the host test
 * (tests/cuda/test_bs_scores.cu) checks the code the kernels run.
 *
 * A (b, h) pair's scores are the 16-bit order keys of the pooled scores of the causal triangle
 * (the upper half of each score's 32-bit order key: the estimate ranks scores at bf16
 * precision), by row groups of 64 row blocks: group g holds [64][64 (g + 1)] keys, so row block
 * m's keys for blocks 0 .. m start 16-byte aligned, the rows of a group follow each other, and
 * the keys of the diagonal tile past m are zeros (below every real key). Each row also has a
 * summary of each of its groups of BSR_GROUP_KEYS adjacent keys, BSR_GROUPS a tile,
 * score_sum_stride apart: the group's largest and second largest keys (bsr_group_summary).
 */
#ifndef MI_BS_SCORES_CUH
#define MI_BS_SCORES_CUH

#include <stdint.h>

namespace mi_cuda {

/* row blocks of a row group, keys (blocks) of a key tile */
constexpr int BSR_ROWS = 64, BSR_TILE_KEYS = 64;
constexpr int BSR_GROUP_KEYS = 16, BSR_GROUPS = BSR_TILE_KEYS / BSR_GROUP_KEYS;

/* The first key of row group g, and the keys of a pair of R row blocks. */
__host__ __device__ constexpr int64_t bsr_group_base(int64_t g) {
    return (int64_t)BSR_ROWS * BSR_TILE_KEYS * g * (g + 1) / 2;
}
__host__ __device__ constexpr int64_t bsr_pair_keys(int64_t R) {
    return bsr_group_base((R + BSR_ROWS - 1) / BSR_ROWS);
}
/* The first key of row block m (its keys for blocks 0 .. m, then zeros to the tile's end). */
__host__ __device__ constexpr int64_t bsr_row_base(int64_t m) {
    return bsr_group_base(m / BSR_ROWS) + (m % BSR_ROWS) * BSR_TILE_KEYS * (m / BSR_ROWS + 1);
}
/* A row's group summaries (score_sum_stride: BSR_GROUPS x the row groups) and a pair's. */
__host__ __device__ constexpr int64_t bsr_summary_stride(int64_t R) {
    return BSR_GROUPS * ((R + BSR_ROWS - 1) / BSR_ROWS);
}
__host__ __device__ constexpr int64_t bsr_pair_summaries(int64_t R) {
    return ((R + BSR_ROWS - 1) / BSR_ROWS) * BSR_ROWS * bsr_summary_stride(R);
}

/* Where both searches start, given diff = lo ^ hi (not 0): the highest bit in which lo and hi
 * differ, and x, their shared bits above it with zeros below. */
__host__ __device__ inline int bsr_search_start(uint32_t lo, uint32_t diff, uint32_t &x) {
    int top = 31;
    while (!((diff >> top) & 1u)) --top;
    x = top == 31 ? 0u : lo & ~((2u << top) - 1u);
    return top;
}

/* The k-th largest of a set of keys, given count_ge(x) = how many are at or above x, every key
 * of the top k lying in [lo, hi] (k > 0, at least k keys): the largest x with count_ge(x) >= k,
 * fixed a bit at a time below the top bits that lo and hi share (about 20 counts for scores of
 * one row, not 32). With slack >= 0 the search stops as soon as at most k + slack keys reach
 * the value fixed so far (cnt_lo: how many reach lo), which is then a lower bound of the k-th
 * largest that at least k keys reach. */
#pragma nv_exec_check_disable /* count_ge runs where the caller does */
template <typename CountFn>
__host__ __device__ inline uint32_t bsr_kth_largest(CountFn count_ge, int k, uint32_t lo,
                                                    uint32_t hi, int slack = -1, int cnt_lo = 0) {
    const uint32_t diff = lo ^ hi;
    if (diff == 0) return lo;
    uint32_t x;
    const int top = bsr_search_start(lo, diff, x);
    for (int bit = top; bit >= 0 && (slack < 0 || cnt_lo > k + slack); --bit) {
        const uint32_t c = x | (1u << bit);
        const int n = count_ge(c);
        if (n >= k) {
            x = c;
            cnt_lo = n;
        }
    }
    return x;
}

/* A group's summary: the upper 16 bits of its largest key, then those of its second largest.
 * Its largest key reaches x16 << 16 exactly where the summary does. */
__host__ __device__ constexpr uint32_t bsr_group_summary(uint32_t top, uint32_t second) {
    return (top & 0xffff0000u) | (second >> 16);
}

/* Two 16-bit keys a word (the first in the low half), as the score kernels hold them: the
 * larger and the smaller of each half of a and b (one instruction each on sm_90; on the host
 * each half picked by `first(x, y)`, whether x wins). */
template <typename First>
__host__ __device__ inline uint32_t bsr_pick16x2(uint32_t a, uint32_t b, First first) {
    const uint32_t lo = first(a & 0xffffu, b & 0xffffu) ? a & 0xffffu : b & 0xffffu;
    return (first(a >> 16, b >> 16) ? a & 0xffff0000u : b & 0xffff0000u) | lo;
}
__host__ __device__ inline uint32_t bsr_max16x2(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __vmaxu2(a, b);
#else
    return bsr_pick16x2(a, b, [](uint32_t x, uint32_t y) { return x > y; });
#endif
}
__host__ __device__ inline uint32_t bsr_min16x2(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __vminu2(a, b);
#else
    return bsr_pick16x2(a, b, [](uint32_t x, uint32_t y) { return x < y; });
#endif
}
/* The two largest of each half over the four words w (top >= second in each half), and two such
 * pairs merged. */
__host__ __device__ inline void bsr_top2_16x2_of4(const uint32_t (&w)[4], uint32_t &top,
                                                  uint32_t &second) {
    top = bsr_max16x2(w[0], w[1]);
    second = bsr_min16x2(w[0], w[1]);
    for (int i = 2; i < 4; ++i) {
        second = bsr_max16x2(second, bsr_min16x2(top, w[i]));
        top = bsr_max16x2(top, w[i]);
    }
}
__host__ __device__ inline void bsr_top2_16x2_merge(uint32_t &top, uint32_t &second, uint32_t top2,
                                                    uint32_t second2) {
    second = bsr_max16x2(bsr_min16x2(top, top2), bsr_max16x2(second, second2));
    top = bsr_max16x2(top, top2);
}
/* The summary (bsr_group_summary) of a group whose halves' two largest are top and second: the
 * halves merged into each other (swapped by a byte permutation). */
__host__ __device__ inline uint32_t bsr_summary_16x2(uint32_t top, uint32_t second) {
    bsr_top2_16x2_merge(top, second, top >> 16 | top << 16, second >> 16 | second << 16);
    return (top & 0xffff0000u) | (second & 0xffffu);
}
/* How many of a summary's two keys reach x16 << 16 (0 < x16 < 2^16). The k-th largest x16 over
 * a row's summaries is reached by k distinct keys, so x16 << 16 bounds the row's k-th key from
 * below (two keys a group make it far tighter than the maxima alone: at 128K, 116 keys reach
 * it on average for top 100 where 812 reach the k-th largest maximum, bench/bs_bound_model.py). */
__host__ __device__ constexpr int bsr_summary_count(uint32_t w, uint32_t x16) {
    return (w >= (x16 << 16)) + ((w & 0xffffu) >= x16);
}
/* The same count kept as a countdown: n_top -= whether w's upper key falls below x16, n_second
 * -= whether its lower one does (x = x16 << 16). On the device each is a subtraction whose
 * borrow is taken off the count, two instructions on two separate chains; written as a sum of
 * comparisons, ptxas had made each value an increment and a predicated move, one long chain. */
__host__ __device__ inline void bsr_summary_count_down(uint32_t w, uint32_t x, int &n_top,
                                                       int &n_second) {
#ifdef __CUDA_ARCH__
    asm("{\n\t.reg .u32 t;\n\tsub.cc.u32 t, %1, %2;\n\tsubc.u32 %0, %0, 0;\n\t}"
        : "+r"(n_top)
        : "r"(w), "r"(x));
    asm("{\n\t.reg .u32 t;\n\tsub.cc.u32 t, %1, %2;\n\tsubc.u32 %0, %0, 0;\n\t}"
        : "+r"(n_second)
        : "r"(w << 16), "r"(x));
#else
    n_top -= w < x;
    n_second -= (w << 16) < x;
#endif
}

/* Widens [lo16, hi16] (start: 0xffff, 0) to the nonzero 16-bit values of summary w (zeros: the
 * keys past the row's end). */
__host__ __device__ inline void bsr_summary_range(uint32_t w, uint32_t &lo16, uint32_t &hi16) {
    const uint32_t t16 = w >> 16, s16 = w & 0xffffu, v = s16 ? s16 : t16 ? t16 : 0xffffu;
    lo16 = lo16 < v ? lo16 : v;
    hi16 = hi16 > t16 ? hi16 : t16;
}

/* A lower bound of a row's k-th largest key from its summaries, given count_ge(x16) over them
 * (0 < x16 < 2^16) and the range [lo16, hi16] of the nonzero values (hi16 = 0: none): a value
 * that at least k of them reach, found bit by bit from the top as their k-th largest, the search
 * stopping as soon as at most k + slack values reach the value it has fixed so far (slack < 0:
 * never; then it is the k-th largest). Every value it passes over costs the select one more key
 * to list; every count it saves, a pass over all of the row's summaries. 0 where fewer than k
 * are nonzero (no bound). */
#pragma nv_exec_check_disable /* count_ge runs where the caller does */
template <typename CountFn>
__host__ __device__ inline uint32_t bsr_summary_bound(CountFn count_ge, int k, int slack,
                                                      uint32_t lo16, uint32_t hi16) {
    if (hi16 == 0) return 0u;
    const int cnt_lo = count_ge(lo16);
    if (cnt_lo < k) return 0u;
    /* the search starts from the shared bits of lo16 and hi16, at or below lo16, which every
     * value reaches as it reaches lo16; stopped early, it may end there */
    const uint32_t x = bsr_kth_largest(count_ge, k, lo16, hi16, slack, cnt_lo);
    return x < lo16 ? lo16 : x; /* as many values reach either */
}

/* bsr_kth_largest in two phases, the same result: count_ge over every key while more than cap
 * of those at or above lo lie in the range still open, [x, x + 2^(bit + 1)); then list(x, bit)
 * gathers those (the keys v >= lo with (v - x) >> bit <= 1, at most cap of them) and list_ge(c)
 * counts over them alone, the keys above the range added. cnt_lo: the keys at or above lo. Once
 * the upper bits are fixed only the keys near the k-th are left, so the later counts read a
 * register instead of every key. */
#pragma nv_exec_check_disable /* the callbacks run where the caller does */
template <typename CountFn, typename ListFn, typename ListCountFn>
__host__ __device__ inline uint32_t bsr_kth_largest_listed(CountFn count_ge, ListFn list,
                                                           ListCountFn list_ge, int k, uint32_t lo,
                                                           uint32_t hi, int cap, int cnt_lo) {
    const uint32_t diff = lo ^ hi;
    if (diff == 0) return lo;
    uint32_t x;
    int bit = bsr_search_start(lo, diff, x);
    int cnt_hi = 0; /* the keys at or above the open range's end */
    /* two loops, not one with a flag: the first one's state is dead in the second */
    for (; bit >= 0 && cnt_lo - cnt_hi > cap; --bit) {
        const uint32_t c = x | (1u << bit);
        const int n = count_ge(c);
        if (n >= k) {
            x = c;
            cnt_lo = n;
        } else {
            cnt_hi = n;
        }
    }
    if (bit < 0) return x;
    list(x, bit);
    const int above = cnt_hi;
    for (; bit >= 0; --bit) {
        const uint32_t c = x | (1u << bit);
        if (above + list_ge(c) >= k) x = c;
    }
    return x;
}

} // namespace mi_cuda

#endif /* MI_BS_SCORES_CUH */
