/*
 * tri_split_plan.cuh: how the dense last rows of Tri-shape heads are split over chunks of keys
 * (tri_split_args in attn_plan.cuh): whether to split, the chunk length and the grid. Host code,
 * apart from what the launcher reads from the context's tuning and the device (tri_split_knobs),
 * so that tests/cuda/test_tri_split_plan.cu checks it in CI, without a GPU.
 */
#ifndef MI_TRI_SPLIT_PLAN_CUH
#define MI_TRI_SPLIT_PLAN_CUH

#include "attn_plan.cuh"

#include <algorithm>

namespace mi_cuda {

/* Bounds past which the Tri-shape rows run in one launch (see tri_split_plan): the row blocks of
 * all of them (every sequence's and head's), and the chunks' scratch */
constexpr int64_t TRI_SPLIT_MAX_ROW_BLOCKS = 4096, TRI_SPLIT_MAX_BYTES = 256ll << 20;
/* scratch bytes of a chunk of a row block: its rows, maxima and sums */
inline int64_t tri_split_item_bytes(int64_t head_dim) {
    return BN * (head_dim * (int64_t)sizeof(float) + (int64_t)sizeof(float2));
}

/* What the plan takes besides the launch: mi_cuda_attn_run reads them from the context's tuning
 * and the device, the host test sets them */
struct tri_split_knobs {
    int64_t from; /* mi_tuning.tri_split: split from this many keys (0: never) */
    int per_sm;   /* CTAs an SM to aim at; 0: 1 with pairs, 4 without */
    int sms;      /* the device's SMs */
    bool pairs;   /* the Hopper chunk kernel: two row blocks a CTA, so chunk_tiles even */
};

/* Tri-shape heads' last rows see every key. In one launch such a row block is len / 64 tiles for
 * one CTA while the heads' other row blocks have n_local / 64 + 2, so that one CTA sets the
 * launch's time. So the launch runs those heads as A-shape, their last rows with the window (a
 * few tiles each), and then computes the last rows' blocks again, dense and split over chunks of
 * keys (attn_tri_split_kernel, about four CTAs an SM in all; on Hopper tri_chunk_sm90_kernel,
 * one wave of CTAs of two row blocks), merged into the output (tri_merge_kernel). It does so from
 * k.from keys on (mi_tuning.tri_split; default TRI_SPLIT_FROM_SM90 with Hopper's chunk kernel,
 * TRI_SPLIT_FROM otherwise; 0: never), and from half that where the Tri-shape heads' work is
 * short of two items of the heads' windows an SM (the rule that keeps such heads off the
 * warp-specialised kernel): the lengths from which the split paid against running those rows in
 * one CTA. */
constexpr int64_t TRI_SPLIT_FROM_SM90 = 8192, TRI_SPLIT_FROM = 16384;
/* The plan: no split where the last rows are many (more than TRI_SPLIT_MAX_ROW_BLOCKS row
 * blocks, or chunks needing more than TRI_SPLIT_MAX_BYTES of scratch): a launch with that many
 * row blocks that see every key keeps the SMs busy as it is. Returns the chunks to compute (0: no split), and fills sa but for its pointers and z with the
 * grid's third dimension. */
inline int64_t tri_split_plan(const mi_cuda_attn_params &p, const tri_split_knobs &k,
                              tri_split_args &sa, int64_t &z) {
    const int64_t from = k.from;
    const bool pairs = k.pairs;
    if (from <= 0 || p.len < from / 2) return 0;
    sa.n_tri = 0;
    int64_t window_items = 0; /* 128-key tiles of the Tri-shape heads' windows, per row pair */
    for (int h = 0; h < p.heads; ++h) {
        const mi_cuda_head_mode m = head_mode_of(p, h);
        if (m.mode != MI_CUDA_MODE_A_SHAPE || m.n_last <= 0) continue;
        sa.tri_head[sa.n_tri++] = (int16_t)h;
        window_items += (int64_t)p.batch * (std::max(m.n_local, 0) / 128 + 2);
    }
    if (sa.n_tri == 0) return 0;
    const int64_t sms = std::max(k.sms, 1);
    if (p.len < from && window_items >= 2 * sms) return 0;
    /* the rows of CTAs: a row block each on the sm_80 kernel, a pair of them on Hopper's */
    const int step = pairs ? 2 : 1;
    int64_t tiles = 0, n_rows = 0; /* 64-key tiles of every row of CTAs, such rows */
    int max_row_tiles = 0;
    /* g(rb0, rb1): the row blocks of each (b, h)'s last rows; every sequence, since the launch
     * runs none of them as Tri-shape, but for those run dense anyway */
    auto for_each_head = [&](auto &&g) {
        for (int b = 0; b < p.batch; ++b) {
            const int len = p.seq_lens[b];
            for (int i = 0; i < sa.n_tri; ++i) {
                const mi_cuda_head_mode m = head_mode_of(p, sa.tri_head[i]);
                if (m.dense_below > 0 && len < m.dense_below) continue;
                const int tri = a_shape_window_of(m, len).tri_start;
                if (tri < len) g(tri / BN, (len - 1) / BN);
            }
        }
    };
    /* f(64-key tiles of a row of CTAs), for each such row */
    auto for_each_row = [&](auto &&f) {
        for_each_head([&](int rb0, int rb1) {
            for (int rb = rb0; rb <= rb1; rb += step) f(std::min(rb + step - 1, rb1) + 1);
        });
    };
    /* Many last rows (n_last of a large part of the sequence) are many row blocks that see every
     * key: one launch keeps the SMs busy with them, and the chunks would need more scratch */
    int64_t row_blocks = 0;
    sa.max_rb = 0;
    for_each_head([&](int rb0, int rb1) {
        row_blocks += rb1 - rb0 + 1;
        sa.max_rb = std::max(sa.max_rb, rb1 - rb0 + 1);
    });
    if (row_blocks == 0 || row_blocks > TRI_SPLIT_MAX_ROW_BLOCKS) return 0;
    for_each_row([&](int t) {
        tiles += t;
        ++n_rows;
        max_row_tiles = std::max(max_row_tiles, t);
    });
    /* sm_80: about four CTAs an SM, several of which run on it at once. Hopper: a CTA fills an
     * SM, so as few waves as the rows of CTAs allow (k.per_sm), the chunks the
     * shortest that keep the last wave within them */
    const int per_sm = k.per_sm > 0 ? k.per_sm : pairs ? 1 : 4;
    int64_t target = per_sm * sms;
    if (pairs) target = std::max(target, (n_rows + sms - 1) / sms * sms);
    sa.chunk_tiles = (int)std::max<int64_t>(16 * step, (tiles + target - 1) / target);
    sa.chunk_tiles += sa.chunk_tiles % step;
    if (pairs) { /* the shortest even chunk with at most target CTAs: a binary search */
        auto ctas = [&](int ct) {
            int64_t n = 0;
            for_each_row([&](int t) { n += (t + ct - 1) / ct; });
            return n;
        };
        int lo = sa.chunk_tiles / 2,
            hi = std::max(lo, (max_row_tiles + 1) / 2); /* in pairs of tiles */
        while (lo < hi) {
            const int mid = lo + (hi - lo) / 2;
            if (ctas(2 * mid) <= target)
                hi = mid;
            else
                lo = mid + 1;
        }
        sa.chunk_tiles = 2 * lo;
    }
    sa.max_chunks = (int)(((p.len - 1) / BN + sa.chunk_tiles) / sa.chunk_tiles);
    z = (int64_t)p.batch * sa.n_tri;
    const int64_t items = z * sa.max_rb * sa.max_chunks;
    return items * tri_split_item_bytes(p.head_dim) > TRI_SPLIT_MAX_BYTES ? 0 : items;
}

} // namespace mi_cuda

#endif /* MI_TRI_SPLIT_PLAN_CUH */
