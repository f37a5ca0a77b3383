/*
 * bs_chunks.cuh: how the block-sparse estimate's bound and streaming kernels (bs_stream.cuh)
 * divide their work, on the host and the device alike, so that the host test
 * (tests/cuda/test_bs_chunks.cu) checks the same code the kernels run.
 *
 * A CTA of those kernels takes a row group (64 row blocks) and walks its key tiles one after the
 * other, from the diagonal down: group c has c + 1 tiles. With few heads the groups at the end of
 * a long sequence set the time (at 1M x 1 head the last group walks 256 tiles while the average
 * is 128, and half the SMs' second CTA slots idle). Where the tiles of all groups, spread over
 * two CTAs an SM, come to at most 3/4 of the longest group's, the groups longer than chunk_tiles
 * split into up to BSS_SPLIT_MAX chunks of about equal length, the nearest the diagonal first.
 * Each chunk of the bound kernel writes the group maxima of its tiles into its own window of the
 * row's slots (bs_bound_rank_kernel takes the k-th largest over all windows, as bs_bound_kernel
 * does over one CTA's), each chunk of the streaming kernel keeps the top k of its tiles'
 * candidates (bs_merge_kernel keeps the top k of their union): every block of a row's top k is
 * in its chunk's top k.
 */
#ifndef MI_BS_CHUNKS_CUH
#define MI_BS_CHUNKS_CUH

#include <stdint.h>

namespace mi_cuda {

constexpr int BSS_SPLIT_MAX = 4;
/* automatic chunks take at least this many tiles (a chunk costs its start, its end and a share
 * of the merge) */
constexpr int BSS_SPLIT_MIN_TILES = 16;

/* A launch's division of the row groups: chunk_tiles 0 (a CTA per group, `groups` of them) or
 * the chunk length; groups_r: the groups with key tiles, split_items: their chunks. */
struct bss_plan {
    int chunk_tiles, groups, groups_r, split_items;
};

/* What a CTA walks: row group `group`, chunk `chunk` of `chunks`. */
struct bss_work {
    int group, chunk, chunks;
};

/* The chunks of group c: ceil((c + 1) / chunk_tiles). */
__host__ __device__ __forceinline__ int bss_group_chunks(int c, int chunk_tiles) {
    return (c + chunk_tiles) / chunk_tiles;
}

/* The chunks of groups 0 .. groups - 1. */
__host__ __device__ inline int bss_split_items(int groups, int chunk_tiles) {
    int n = 0;
    for (int c = 0; c < groups; ++c) n += bss_group_chunks(c, chunk_tiles);
    return n;
}

/* Work item x: without chunks, the row groups from the last; with them, the chunks of the groups
 * with tiles from the last group, then the groups past the sequence (nothing to walk, rows to
 * clear). */
__host__ __device__ __forceinline__ bss_work bss_work_of(const bss_plan &p, int x) {
    const int C = p.chunk_tiles;
    if (C <= 0) return {p.groups - 1 - x, 0, 1};
    if (x >= p.split_items) return {p.groups_r + x - p.split_items, 0, 1};
    int S = (p.groups_r + C - 1) / C, c_hi = p.groups_r - 1;
    for (;;) {
        /* the groups of S chunks: c + 1 in ((S - 1) C, S C] */
        const int c_lo = (S - 1) * C, n = (c_hi - c_lo + 1) * S;
        if (x < n || S == 1) return {c_hi - x / S, x % S, S};
        x -= n;
        c_hi = c_lo - 1;
        --S;
    }
}

/* The key tiles [lo, hi) of a CTA's chunk, of the n_tiles its rows reach: all of them without
 * chunks; else chunk s of the group's c + 1 tiles split evenly (chunk 0 the highest), clipped to
 * n_tiles (a shorter sequence of the batch). span: the chunk's tiles before clipping. */
struct bss_range {
    int lo, hi, span;
};
__host__ __device__ __forceinline__ bss_range bss_range_of(const bss_work &w, int n_tiles) {
    if (w.chunks == 1) return {0, n_tiles, n_tiles};
    const int n = w.group + 1, base = n / w.chunks, extra = n % w.chunks;
    const int hi = n - (w.chunk * base + (w.chunk < extra ? w.chunk : extra));
    const int span = base + (w.chunk < extra ? 1 : 0);
    const int h = hi < n_tiles ? hi : n_tiles;
    return {hi - span < h ? hi - span : h, h, span};
}

/* The chunk length for `pairs` streaming (b, h) pairs of `groups` row groups with key tiles, on
 * `slots` CTA slots (two an SM), or 0 where no group splits; forced: -1 automatic, 0 never, N at
 * least N tiles. Groups split where the tiles of all groups, spread over the slots, come to at
 * most 3/4 of the longest group's: otherwise the longest-first order already evens the CTAs out,
 * and chunks only add their starts, ends and merges. The chunks then take about half the tiles a
 * slot gets (so that the longest-first order evens them out), at least BSS_SPLIT_MIN_TILES, and
 * a group at most BSS_SPLIT_MAX. The 3/4: a model of that order (CTAs of n + 2 tiles' cost into
 * 264 slots) evened the busiest slot out with one or few long pairs and lost from two pairs of 1M
 * on. */
inline int bss_chunk_tiles_for(int64_t pairs, int64_t groups, int64_t slots, int forced) {
    if (forced == 0 || pairs <= 0 || groups < 2) return 0;
    int64_t c = forced;
    if (forced < 0) {
        const int64_t tiles = pairs * groups * (groups + 1) / 2;
        if (4 * tiles > 3 * groups * slots) return 0;
        c = (tiles + 2 * slots - 1) / (2 * slots);
        if (c < BSS_SPLIT_MIN_TILES) c = BSS_SPLIT_MIN_TILES;
    }
    const int64_t most = (groups + BSS_SPLIT_MAX - 1) / BSS_SPLIT_MAX;
    if (c < most) c = most;
    return c < groups ? (int)c : 0;
}

} // namespace mi_cuda

#endif /* MI_BS_CHUNKS_CUH */
