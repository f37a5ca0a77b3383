/*
 * block_select.cuh: block-wide top-k by radix select, then an in-order compaction, so that the
 * selected indices come out ascending without any sort. Used by the vertical-slash estimate
 * (k out of up to L values per head) and the block-sparse estimate (k out of m+1 per row block).
 *
 * Keys are float values mapped to order-preserving uint32. Ties at the threshold are broken by
 * position: lowest positions first, or highest first when prefer_high is set. block_top_bin
 * narrows a long list to the keys near the top first, where the caller has room for them.
 */
#ifndef MI_BLOCK_SELECT_CUH
#define MI_BLOCK_SELECT_CUH

#include <cub/block/block_scan.cuh>

namespace mi_cuda {

__device__ __forceinline__ uint32_t float_order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Adds one to hist[bin_of(i)] for each i < n whose bin is not negative, over the block. Values of
 * one vector share their top bits, so most keys land in a few bins: lanes with the same bin are
 * merged (match_any) and one of them adds the count, instead of up to 32 serialised atomics on
 * one address. */
template <int NT, typename BinFn>
__device__ __forceinline__ void block_histogram(BinFn bin_of, int n, int *hist) {
    const int n_round = (n + NT - 1) / NT * NT; /* every lane of a warp reaches match_any */
    for (int i = threadIdx.x; i < n_round; i += NT) {
        const int bin = i < n ? bin_of(i) : -1;
        const unsigned same = __match_any_sync(0xffffffffu, bin);
        if (bin >= 0 && (threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist[bin], __popc(same));
    }
}

struct select_smem {
    int hist[256];
    int bin, above, eq_total;
};

/* After the call (all threads): thr = the k-th largest key, n_take_eq = how many keys equal to
 * thr to take, eq_total = how many there are. Requires 0 < k < n. */
template <int NT, typename KeyFn>
__device__ void block_radix_select(KeyFn key, int n, int k, select_smem &sm, uint32_t &thr,
                                   int &n_take_eq, int &eq_total) {
    uint32_t prefix = 0, mask = 0;
    int kr = k;
    const int tid = threadIdx.x;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += NT) sm.hist[i] = 0;
        __syncthreads();
        block_histogram<NT>(
            [&](int i) {
                const uint32_t u = key(i);
                return (u & mask) == prefix ? (int)((u >> shift) & 255u) : -1;
            },
            n, sm.hist);
        __syncthreads();
        if (tid < 32) {
            const int lane = tid;
            int cnt[8], sum = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                cnt[i] = sm.hist[255 - (8 * lane + i)];
                sum += cnt[i];
            }
            int incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const int excl = incl - sum;
            if (excl < kr && kr <= incl) {
                int acc = excl;
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    if (acc < kr && kr <= acc + cnt[i]) {
                        sm.bin = 255 - (8 * lane + i);
                        sm.above = acc;
                        sm.eq_total = cnt[i];
                    }
                    acc += cnt[i];
                }
            }
        }
        __syncthreads();
        prefix |= (uint32_t)sm.bin << shift;
        mask |= 255u << shift;
        kr -= sm.above;
        __syncthreads();
    }
    thr = prefix;
    n_take_eq = kr;
    eq_total = sm.eq_total;
}

/* The first of a two-pass select for k out of n keys, when few keys lie near the k-th largest:
 * a histogram of the top 12 bits (sign, exponent, 3 mantissa bits of a float) finds the bin that
 * holds the k-th largest key. Every key of the top k then lies in that bin or above, so the
 * caller compacts those candidates (block_compact, keys above (bin << 20) - 1) and runs the exact
 * select on them alone: two passes over the n keys instead of five. After the call (all threads):
 * bin, and n_cand = the keys in that bin or above. Requires 0 < k <= n. */
constexpr int TOP_BINS = 4096;
struct top_bin_smem {
    int hist[TOP_BINS];
    int bin, n_cand;
};

template <int NT, typename KeyFn, typename ScanTmp>
__device__ void block_top_bin(KeyFn key, int n, int k, top_bin_smem &sm, ScanTmp &scan_tmp,
                              int &bin, int &n_cand) {
    constexpr int PER = TOP_BINS / NT; /* bins per thread, highest first */
    static_assert(TOP_BINS % NT == 0, "bins per thread");
    const int tid = threadIdx.x;
    for (int i = tid; i < TOP_BINS; i += NT) sm.hist[i] = 0;
    __syncthreads();
    block_histogram<NT>([&](int i) { return (int)(key(i) >> 20); }, n, sm.hist);
    __syncthreads();
    /* thread t owns bins TOP_BINS - 1 - PER t .. - PER + 1; a scan of their sums in that order
     * finds the bin where the count from the top reaches k */
    int cnt[PER], sum = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        cnt[i] = sm.hist[TOP_BINS - 1 - (PER * tid + i)];
        sum += cnt[i];
    }
    int excl;
    cub::BlockScan<int, NT>(scan_tmp).ExclusiveSum(sum, excl);
    if (excl < k && k <= excl + sum) {
        int acc = excl;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            if (acc < k && k <= acc + cnt[i]) {
                sm.bin = TOP_BINS - 1 - (PER * tid + i);
                sm.n_cand = acc + cnt[i];
            }
            acc += cnt[i];
        }
    }
    __syncthreads();
    bin = sm.bin;
    n_cand = sm.n_cand;
    __syncthreads();
}

/* Visits the selected positions in ascending order: emit(position, rank). Selection: every key >
 * thr, plus n_take_eq of the keys == thr (the first ones, or the last ones with prefer_high).
 * k >= n (take_all) selects everything. */
template <int NT, int ITEMS, typename KeyFn, typename EmitFn>
__device__ void block_compact(KeyFn key, int n, bool take_all, uint32_t thr, int n_take_eq,
                              int eq_total, bool prefer_high, EmitFn emit,
                              typename cub::BlockScan<int, NT>::TempStorage &scan_tmp) {
    using scan_t = cub::BlockScan<int, NT>;
    const int tid = threadIdx.x;
    int run_eq = 0, run_sel = 0;
    for (int base = 0; base < n; base += NT * ITEMS) {
        int eq[ITEMS], sel[ITEMS], gt[ITEMS];
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int pos = base + tid * ITEMS + i;
            gt[i] = 0;
            eq[i] = 0;
            if (pos < n) {
                if (take_all) {
                    gt[i] = 1;
                } else {
                    const uint32_t u = key(pos);
                    gt[i] = u > thr;
                    eq[i] = u == thr;
                }
            }
        }
        int eq_rank[ITEMS], eq_agg;
        scan_t(scan_tmp).ExclusiveSum(eq, eq_rank, eq_agg);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int r = run_eq + eq_rank[i];
            const bool take_eq = prefer_high ? r >= eq_total - n_take_eq : r < n_take_eq;
            sel[i] = gt[i] || (eq[i] && take_eq);
        }
        int sel_pos[ITEMS], sel_agg;
        scan_t(scan_tmp).ExclusiveSum(sel, sel_pos, sel_agg);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ITEMS; ++i)
            if (sel[i]) emit(base + tid * ITEMS + i, run_sel + sel_pos[i]);
        run_eq += eq_agg;
        run_sel += sel_agg;
    }
}

} // namespace mi_cuda

#endif /* MI_BLOCK_SELECT_CUH */
