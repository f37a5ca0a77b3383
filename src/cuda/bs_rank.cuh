/*
 * bs_rank.cuh: what every select of the block-sparse estimate (bs_estimate.cu) shares: its
 * parameters (bs_select_params), the blocks a row block keeps (the diagonal and block 0
 * forced, top k, none past the index or the sequence), the rank of a pooled score (the upper
 * 16 bits of its order key, ties to the lower block, as the CPU reference) and the block-wide
 * top-k writers that emit ascending offsets.
 */
#ifndef MI_BS_RANK_CUH
#define MI_BS_RANK_CUH

#include "block_select.cuh"
#include "cuda_common.cuh"

namespace mi_cuda {

/* Eight values of a 16-byte load in the input dtype, as floats. */
template <typename T> __device__ __forceinline__ void unpack8(const uint4 &u, float *f) {
    const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = dtype_traits<T>::to_float(e[i]);
}

struct bs_select_params {
    const void *qp, *kp; /* pooled, in the input dtype */
    int32_t heads, group, row_blocks, head_dim;
    int32_t *block_count, *block_offset, *column_count;
    int32_t idx_row_blocks, max_blocks;
    int32_t dense_below;
    int32_t bound_groups; /* bs_bound_kernel's groups per tile: -1 automatic, else G */
    uint32_t *bound;      /* [B*H, row_blocks] each row's bound (bs_bound_kernel); null: none */
    /* The streaming kernels' row groups in chunks of key tiles (BSS_SPLIT_MAX, bs_chunks.cuh);
     * chunk_tiles 0: a CTA per row group. groups_r: the row groups with key tiles, split_items:
     * their chunks; split_heads: the streaming heads, split_slot[h]: h's rank among them. */
    int32_t chunk_tiles, groups_r, split_items, split_heads;
    int32_t groups, bh;     /* the index's row groups; the (b, h) pairs (all heads) */
    int32_t mask_append;    /* bs_stream_kernel's plain tiles appended at once where they can be */
    uint16_t *split_maxima; /* [split_heads, split rows, BSB_SLOTS] the chunks' group maxima */
    int32_t *split_count;   /* [split_heads, split rows, BSS_SPLIT_MAX] each chunk's candidates */
    uint64_t *split_cand;   /* [split_heads, split rows, BSS_SPLIT_MAX, BSS_MAX_K] */
    /* The estimate through scores in memory (bs_score_kernel, bs_row_select_kernel): the keys of
     * the pairs score_bh0 .. score_bh0 + gridDim.z - 1, score_pair_keys apart (bsr_row_base). */
    uint16_t *scores;
    int64_t score_pair_keys;
    int32_t score_bh0;
    int32_t score_chunk_tiles; /* the key tiles a CTA of bs_score_kernel scores */
    int32_t score_raise;       /* bs_row_select_kernel raises the bound of rows past BSR_WCAND */
    int32_t score_slack;       /* its bound search stops within this many values of k */
    /* and the summaries of each row's groups of BSR_GROUP_KEYS keys, score_sum_stride a row */
    uint32_t *score_sums;
    int32_t score_sum_stride;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
    int32_t top_k[MI_CUDA_MAX_HEADS];
    uint8_t active[MI_CUDA_MAX_HEADS];
    uint8_t split_slot[MI_CUDA_MAX_HEADS];
};

/* The sequence length of batch b as the estimate sees it: 0 below dense_below (no blocks). */
__device__ __forceinline__ int bs_seq_len(const bs_select_params &p, int b) {
    const int len = p.seq_lens[b];
    return p.dense_below > 0 && len < p.dense_below ? 0 : len;
}

/* The blocks row block m of head h keeps, as the CPU reference: at least the forced ones (the
 * diagonal, and block 0 when m > 0), none past the index or the sequence. */
__device__ __forceinline__ int bs_row_k(const bs_select_params &p, int h, int m, int len) {
    if (m >= p.idx_row_blocks || m * 64 >= len) return 0;
    const int k = max(min(max(p.top_k[h], 0), m + 1), m > 0 ? 2 : 1);
    return min(k, p.max_blocks);
}

/* The order key that ranks a pooled score: its order key cut to the upper 16 bits (bf16
 * precision), blocks with equal keys ranking by position, lower block first (the CPU reference's
 * bf16_score_rank). Every path ranks by it; the scores in memory keep just those 16 bits. */
__device__ __forceinline__ uint32_t bs_score_key(float score) {
    return float_order_key(score) & 0xffff0000u;
}

/* The order key that ranks block j for row block m: the diagonal first, then block 0, then the
 * score (higher first; the CPU reference's order). */
__device__ __forceinline__ uint32_t bs_rank_key(float score, int j, int m) {
    return j == m ? 0xffffffffu : j == 0 ? bs_score_key(3.402823466e38f) : bs_score_key(score);
}

/* The start of a row block's select (each of the NT threads that select the row calls it, tid
 * its index among them: a CTA's threads, or a warp's lanes): writes its counts, and its offsets
 * where it takes none or every block (then true: nothing is left to select). */
template <int NT>
__device__ __forceinline__ bool bs_row_trivial(const bs_select_params &p, int64_t row, int k, int n,
                                               int tid = (int)threadIdx.x) {
    int32_t *off = p.block_offset + row * p.max_blocks;
    if (tid == 0) {
        p.column_count[row] = 0;
        p.block_count[row] = k;
    }
    if (k <= 0) return true;
    if (k < n) return false;
    for (int j = tid; j < n; j += NT) off[j] = 64 * j;
    return true;
}

/* Writes the top k of a row block as ascending offsets, from the n_cand candidate blocks cand[]
 * (ascending, holding every block of the top k); key(j) ranks block j (bs_rank_key). Ties: lower
 * block first (the CPU reference's total order). Every thread of the CTA calls it. */
template <int NT, typename KeyFn>
__device__ void bs_emit_top_of(KeyFn key, const int *cand, int n_cand, int k, int32_t *off,
                               select_smem &sel,
                               typename cub::BlockScan<int, NT>::TempStorage &scan_tmp) {
    auto ckey = [&](int i) { return key(cand[i]); };
    uint32_t thr = 0;
    int take_eq = 0, eq_total = 0;
    const bool all = k >= n_cand;
    if (!all) block_radix_select<NT>(ckey, n_cand, k, sel, thr, take_eq, eq_total);
    block_compact<NT, 4>(
        ckey, n_cand, all, thr, take_eq, eq_total, false,
        [&](int i, int rank) { off[rank] = 64 * cand[i]; }, scan_tmp);
}

/* The same over all n blocks of the row (0 < k < n). */
template <int NT, typename KeyFn>
__device__ void bs_emit_top(KeyFn key, int n, int k, int32_t *off, select_smem &sel,
                            typename cub::BlockScan<int, NT>::TempStorage &scan_tmp) {
    uint32_t thr = 0;
    int take_eq = 0, eq_total = 0;
    block_radix_select<NT>(key, n, k, sel, thr, take_eq, eq_total);
    block_compact<NT, 4>(
        key, n, false, thr, take_eq, eq_total, false, [&](int j, int rank) { off[rank] = 64 * j; },
        scan_tmp);
}

} // namespace mi_cuda

#endif
