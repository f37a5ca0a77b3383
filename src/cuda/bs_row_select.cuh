/*
 * bs_row_select.cuh: the selecting half of the block-sparse estimate through scores in memory:
 * bs_row_select_kernel, a warp per row block, bounds its k-th key by the k-th largest of the
 * group summaries, lists the keys of the groups that reach the bound and writes the top k as
 * ascending offsets, with ballots and no block-wide barrier.
 */
#ifndef MI_BS_ROW_SELECT_CUH
#define MI_BS_ROW_SELECT_CUH

#include "bs_score_mem.cuh"

namespace mi_cuda {

/* The k-th largest of the n keys key(0 .. n - 1) (0 < k <= n), every key of the top k in
 * [lo, hi], by one warp, with no barrier: bsr_kth_largest_listed with one ballot per 32 keys a
 * count until at most 32 keys at or above lo are left in the range still open; those then sit
 * one a lane (listed through the warp's 32 words at `list`) and each count is one ballot. In the
 * select, counts over every key would be most of its instructions. n_ge_lo: the keys at
 * or above lo, or -1 (counted here). */
template <typename KeyFn>
__device__ uint32_t bsr_warp_kth_largest(KeyFn key, int n, int k, uint32_t lo, uint32_t hi,
                                         int n_ge_lo, uint32_t *list) {
    const int lane = threadIdx.x & 31;
    auto count_ge = [&](uint32_t c) {
        int cnt = 0;
        for (int i0 = 0; i0 < n; i0 += 32) {
            const int i = i0 + lane;
            cnt += __popc(__ballot_sync(0xffffffffu, i < n && key(i) >= c));
        }
        return cnt;
    };
    uint32_t mine = 0u; /* this lane's listed key; 0 (below every count's threshold): none */
    auto list_keys = [&](uint32_t x, int bit) {
        int at = 0;
        for (int i0 = 0; i0 < n; i0 += 32) {
            const int i = i0 + lane;
            const uint32_t v = i < n ? key(i) : 0u;
            const bool in = i < n && v >= lo && ((v - x) >> bit) <= 1u;
            const unsigned bal = __ballot_sync(0xffffffffu, in);
            if (in) list[at + lanes_below(bal)] = v;
            at += __popc(bal);
        }
        __syncwarp();
        mine = lane < at ? list[lane] : 0u;
        __syncwarp(); /* the list is written again by the warp's next call */
    };
    auto list_ge = [&](uint32_t c) { return __popc(__ballot_sync(0xffffffffu, mine >= c)); };
    return bsr_kth_largest_listed(count_ge, list_keys, list_ge, k, lo, hi, 32,
                                  n_ge_lo >= 0 ? n_ge_lo : count_ge(lo));
}

/* Writes the top k of n candidate blocks as ascending offsets, by one warp: key(i) ranks
 * candidate i, block(i) is its block, ascending in i; every key of the top k lies in [lo, hi].
 * The k-th largest key, then every key above it and the first of those equal to it (lower
 * block first, the CPU reference's order), with ballots only. n_ge_lo and list: as
 * bsr_warp_kth_largest's. */
template <typename KeyFn, typename BlockFn>
__device__ void bsr_warp_emit(KeyFn key, BlockFn block, int n, int k, uint32_t lo, uint32_t hi,
                              int n_ge_lo, uint32_t *list, int32_t *off) {
    const bool all = k >= n;
    const uint32_t thr = all ? 0u : bsr_warp_kth_largest(key, n, k, lo, hi, n_ge_lo, list);
    int above = 0;
    for (int i0 = 0; i0 < n && !all; i0 += 32) {
        const int i = i0 + (threadIdx.x & 31);
        above += __popc(__ballot_sync(0xffffffffu, i < n && key(i) > thr));
    }
    const int take_eq = k - above;
    int eq_run = 0, out = 0;
    for (int i0 = 0; i0 < n; i0 += 32) {
        const int i = i0 + (threadIdx.x & 31);
        const uint32_t u = i < n ? key(i) : 0u;
        const bool eq = i < n && !all && u == thr;
        const unsigned eq_bal = __ballot_sync(0xffffffffu, eq);
        const bool take =
            i < n && (all || u > thr || (eq && eq_run + lanes_below(eq_bal) < take_eq));
        const unsigned take_bal = __ballot_sync(0xffffffffu, take);
        if (take) off[out + lanes_below(take_bal)] = 64 * block(i);
        eq_run += __popc(eq_bal);
        out += __popc(take_bal);
    }
}

/* Appends this lane's entries e = 0 .. N - 1 whose keep[e] is set, in ascending order of
 * N * lane + e after the warp's `base` entries so far: put(at, e) for each, at its place.
 * Returns base + the warp's count. Ballots only (no scan). */
template <int N, typename PutFn>
__device__ __forceinline__ int bsr_warp_append(const bool (&keep)[N], int base, PutFn put) {
    unsigned bal[N];
    int at = base, total = base;
#pragma unroll
    for (int e = 0; e < N; ++e) {
        bal[e] = __ballot_sync(0xffffffffu, keep[e]);
        at += lanes_below(bal[e]);
        total += __popc(bal[e]);
    }
#pragma unroll
    for (int e = 0; e < N; ++e)
        if (keep[e]) put(at++, e);
    return total;
}

__device__ __forceinline__ uint32_t bsr_lane_of(const uint4 &u, int e) {
    return e == 0 ? u.x : e == 1 ? u.y : e == 2 ? u.z : u.w;
}
/* Key e of the eight 16-bit keys in u, as the 32-bit key it ranks as (its upper half). */
__device__ __forceinline__ uint32_t bsr_key_of(const uint4 &u, int e) {
    const uint32_t w = bsr_lane_of(u, e >> 1);
    return e & 1 ? w & 0xffff0000u : w << 16;
}

/* Grid (groups of BSR_WARPS row blocks longest first, pairs): a warp per row block, its top k
 * from its keys in memory, with no barrier. The k-th largest 16-bit value of the row's group
 * summaries (from bs_score_kernel) bounds the row's k-th key from below (bsr_summary_count,
 * counted down by bsr_summary_count_down).
 * Only the groups whose largest key reaches the bound can hold a key of the top k: the warp
 * lists them in order, reads them 16 groups (a 16-byte read a lane) at a time, BSR_BATCH
 * reads in flight, and lists their keys at or above the bound, in ascending order;
 * bsr_warp_emit selects from those. Where more than BSR_WCAND groups or keys reach the bound
 * (short rows, many near scores), the k-th largest key listed is a higher bound and the warp
 * lists again; where that fails too, it selects from the whole row in memory. The summaries sit
 * in registers for the bound's counts up to BSR_REG_GROUPS of them (1M). */
constexpr int BSR_WARPS = 8;
constexpr int BSR_WCAND = 512;
constexpr int BSR_BATCH = 4;
constexpr int BSR_REG_GROUPS = 1024;
/* the bound search's stop (bsr_summary_bound) on rows of BSR_REG_GROUPS summaries, and
 * proportionally less on shorter ones: on short rows the extra keys listed cost more than the
 * counts saved */
constexpr int BSR_BOUND_SLACK = 32;
/* three CTAs an SM (80 registers a thread) */
constexpr int BSR_CTAS_PER_SM = 3;
__global__ void __launch_bounds__(32 * BSR_WARPS, BSR_CTAS_PER_SM)
    bs_row_select_kernel(const __grid_constant__ bs_select_params p) {
    __shared__ int cand[BSR_WARPS][BSR_WCAND];
    __shared__ uint32_t cand_key[BSR_WARPS][BSR_WCAND];
    __shared__ int cand_group[BSR_WARPS][BSR_WCAND];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int z = blockIdx.y, bh = p.score_bh0 + z;
    const int b = bh / p.heads, h = bh % p.heads;
    const int m = p.idx_row_blocks - 1 - (int)(blockIdx.x * BSR_WARPS + warp);
    if (!p.active[h] || m < 0) return;
    const int len = bs_seq_len(p, b), n = m + 1, k = bs_row_k(p, h, m, len);
    const int64_t row = (int64_t)bh * p.idx_row_blocks + m;
    if (bs_row_trivial<32>(p, row, k, n, lane)) return;
    int32_t *off = p.block_offset + row * p.max_blocks;
    const uint16_t *keys = p.scores + (int64_t)z * p.score_pair_keys + bsr_row_base(m);
    const uint32_t *sums = p.score_sums + (int64_t)z * bsr_pair_summaries(p.row_blocks) +
                           (int64_t)m * p.score_sum_stride;
    const uint4 *sv = reinterpret_cast<const uint4 *>(sums);
    const int ng = BSR_GROUPS * (m / BSS_ROWS + 1), ng4 = ng / 4; /* BSR_GROUPS is 4 */
    /* the range of the nonzero 16-bit values, and the largest summary */
    uint32_t lo16 = 0xffffu, hi16 = 0u, top = 0u;
    auto range_of = [&](uint32_t w) {
        bsr_summary_range(w, lo16, hi16);
        top = max(top, w);
    };
    uint32_t x16 = 0u;
    if (ng <= BSR_REG_GROUPS) {
        uint4 sr[BSR_REG_GROUPS / 128];
#pragma unroll
        for (int r = 0; r < BSR_REG_GROUPS / 128; ++r) {
            const int i = 32 * r + lane;
            sr[r] = i < ng4 ? __ldg(sv + i) : make_uint4(0u, 0u, 0u, 0u);
            if (i < ng4) {
                range_of(sr[r].x);
                range_of(sr[r].y);
                range_of(sr[r].z);
                range_of(sr[r].w);
            }
        }
        /* the counts read only the registers that hold summaries (NR of them a lane, a
         * compile-time count: all eight were counted, zeros too, so at 128K eight times the
         * work) */
        const uint32_t lo_w = __reduce_min_sync(0xffffffffu, lo16),
                       hi_w = __reduce_max_sync(0xffffffffu, hi16);
        auto bound_of = [&](auto nr) {
            constexpr int NR = decltype(nr)::value;
            return bsr_summary_bound(
                [&](uint32_t c) {
                    /* counted down from the lane's NR x 8 values (zeros included) */
                    int n_top = 4 * NR, n_second = 4 * NR;
                    const uint32_t x = c << 16;
#pragma unroll
                    for (int r = 0; r < NR; ++r) {
                        bsr_summary_count_down(sr[r].x, x, n_top, n_second);
                        bsr_summary_count_down(sr[r].y, x, n_top, n_second);
                        bsr_summary_count_down(sr[r].z, x, n_top, n_second);
                        bsr_summary_count_down(sr[r].w, x, n_top, n_second);
                    }
                    return (int)__reduce_add_sync(0xffffffffu, (unsigned)(n_top + n_second));
                },
                k, p.score_slack < 0 ? -1 : p.score_slack * NR / 8, lo_w, hi_w);
        };
        static_assert(BSR_REG_GROUPS / 128 == 8, "the register counts below");
        const int nr = (ng4 + 31) / 32;
        x16 = nr <= 1   ? bound_of(std::integral_constant<int, 1>())
              : nr <= 2 ? bound_of(std::integral_constant<int, 2>())
              : nr <= 4 ? bound_of(std::integral_constant<int, 4>())
                        : bound_of(std::integral_constant<int, 8>());
    } else {
        for (int i = lane; i < ng; i += 32) range_of(__ldg(sums + i));
        x16 = bsr_summary_bound(
            [&](uint32_t c) {
                int n_top = 0, n_second = 0, words = 0;
                for (int i = lane; i < ng; i += 32, ++words)
                    bsr_summary_count_down(__ldg(sums + i), c << 16, n_top, n_second);
                return (int)__reduce_add_sync(0xffffffffu,
                                              (unsigned)(2 * words + n_top + n_second));
            },
            k, p.score_slack, __reduce_min_sync(0xffffffffu, lo16),
            __reduce_max_sync(0xffffffffu, hi16));
    }
    uint32_t bound = x16 << 16;
    const uint32_t hi = __reduce_max_sync(0xffffffffu, top) | 0xffffu;
    int *wc = cand[warp], *wg = cand_group[warp];
    uint32_t *wk = cand_key[warp];
    /* bsr_warp_kth_largest's list of 32 keys: the group list's first words, free once a collect
     * has read it (a separate array took the static shared memory past sm_80's 48 KB) */
    uint32_t *kth_list = reinterpret_cast<uint32_t *>(wg);
    const uint4 *kv = reinterpret_cast<const uint4 *>(keys);
    /* Lists the keys at or above bnd, in ascending order, from the groups whose largest key
     * can reach it: up to BSR_WCAND of them in wc / wk, the count listed returned; over: more
     * reach bnd than were listed. */
    auto collect = [&](uint32_t bnd, bool &over) {
        const uint32_t group_bnd = bnd & 0xffff0000u; /* what the summaries resolve */
        int n_groups = 0;
        for (int i0 = 0; i0 < ng4 && n_groups <= BSR_WCAND; i0 += 32) {
            const int i = i0 + lane;
            const uint4 u = i < ng4 ? __ldg(sv + i) : make_uint4(0u, 0u, 0u, 0u);
            bool keep[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) keep[e] = i < ng4 && bsr_lane_of(u, e) >= group_bnd;
            n_groups = bsr_warp_append(keep, n_groups, [&](int at, int e) {
                if (at < BSR_WCAND) wg[at] = 4 * i + e;
            });
        }
        __syncwarp();
        const int listed = min(n_groups, BSR_WCAND);
        int n_cand = 0;
        /* their keys, half a group (eight keys, 16 bytes) a lane */
        for (int c0 = 0; c0 < listed && n_cand <= BSR_WCAND; c0 += 16 * BSR_BATCH) {
            uint4 u[BSR_BATCH];
            int gi[BSR_BATCH];
#pragma unroll
            for (int r = 0; r < BSR_BATCH; ++r) {
                const int c = c0 + 16 * r + (lane >> 1);
                gi[r] = c < listed ? wg[c] : -1;
                u[r] =
                    gi[r] >= 0 ? __ldcs(kv + 2 * gi[r] + (lane & 1)) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int r = 0; r < BSR_BATCH; ++r) {
                const int j = BSR_GROUP_KEYS * gi[r] + 8 * (lane & 1);
                bool keep[8];
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    keep[e] = gi[r] >= 0 && j + e < n && bsr_key_of(u[r], e) >= bnd;
                n_cand = bsr_warp_append(keep, n_cand, [&](int at, int e) {
                    if (at < BSR_WCAND) {
                        wc[at] = j + e;
                        wk[at] = bsr_key_of(u[r], e);
                    }
                });
            }
        }
        __syncwarp();
        over = n_cand > BSR_WCAND || n_groups > BSR_WCAND;
        return min(n_cand, BSR_WCAND);
    };
    bool over;
    int n_cand = collect(bound, over);
    /* Too many keys reach the bound (short rows with fewer than k summary values, many near
     * ones): the k-th largest of those listed is reached by k distinct keys, a higher bound. */
    if (over && n_cand >= k && p.score_raise) {
        const uint32_t raised = bsr_warp_kth_largest([&](int i) { return wk[i]; }, n_cand, k, bound,
                                                     hi, n_cand, kth_list);
        __syncwarp();
        if (raised > bound) {
            bound = raised;
            n_cand = collect(bound, over);
        }
    }
    if (!over)
        bsr_warp_emit([&](int i) { return wk[i]; }, [&](int i) { return wc[i]; }, n_cand, k, bound,
                      hi, n_cand, kth_list, off);
    else
        bsr_warp_emit([&](int j) { return (uint32_t)keys[j] << 16; }, [&](int j) { return j; }, n,
                      k, bound, hi, -1, kth_list, off);
}

} // namespace mi_cuda

#endif
