/*
 * bs_scores.cuh: the layout of the block-sparse estimate's scores in memory and the bit-by-bit
 * k-th largest that its select runs (bs_score_kernel, bs_row_select_kernel in bs_estimate.cu),
 * on the host and the device alike, so that the host test (tests/cuda/test_bs_scores.cu) checks
 * the code the kernels run.
 *
 * A (b, h) pair's scores are the order keys of the pooled scores of the causal triangle, by row
 * groups of 64 row blocks: group g holds [64][64 (g + 1)] keys, so row block m's keys for blocks
 * 0 .. m start 16-byte aligned, the rows of a group follow each other, and the keys of the
 * diagonal tile past m are zeros (below every real key). Each row also has the maxima of its
 * groups of BSR_GROUP_KEYS adjacent keys, BSR_GROUPS a tile, score_max_stride apart.
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
/* A row's group maxima (score_max_stride: BSR_GROUPS x the row groups) and a pair's. */
__host__ __device__ constexpr int64_t bsr_max_stride(int64_t R) {
    return BSR_GROUPS * ((R + BSR_ROWS - 1) / BSR_ROWS);
}
__host__ __device__ constexpr int64_t bsr_pair_maxima(int64_t R) {
    return ((R + BSR_ROWS - 1) / BSR_ROWS) * BSR_ROWS * bsr_max_stride(R);
}

/* The k-th largest of a set of keys, given count_ge(x) = how many are at or above x, every key
 * of the top k lying in [lo, hi] (k > 0, at least k keys): the largest x with count_ge(x) >= k,
 * fixed a bit at a time below the top bits that lo and hi share (about 20 counts for scores of
 * one row, not 32). */
#pragma nv_exec_check_disable /* count_ge runs where the caller does */
template <typename CountFn>
__host__ __device__ inline uint32_t bsr_kth_largest(CountFn count_ge, int k, uint32_t lo,
                                                    uint32_t hi) {
    const uint32_t diff = lo ^ hi;
    if (diff == 0) return lo;
    int top = 31;
    while (!((diff >> top) & 1u)) --top;
    uint32_t x = top == 31 ? 0u : lo & ~((2u << top) - 1u);
    for (int bit = top; bit >= 0; --bit) {
        const uint32_t c = x | (1u << bit);
        if (count_ge(c) >= k) x = c;
    }
    return x;
}

} // namespace mi_cuda

#endif /* MI_BS_SCORES_CUH */
