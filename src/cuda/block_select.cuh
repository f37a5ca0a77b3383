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

/* An unsigned key that orders as the float does (negatives flipped, positives above them). */
__device__ __forceinline__ uint32_t float_order_key(float f) {
    /* sign set: every bit flipped, else the sign bit set; an arithmetic shift and one
     * three-input logic op (the select of the two cases compiled to three instructions) */
    const uint32_t u = __float_as_uint(f);
    return u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u);
}

/* The float whose key is k: scores at or above it (or NaN) are the ones whose key can reach k. */
__device__ __forceinline__ float float_of_order_key(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
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

/* The bin where the count from the top reaches k (0 < k <= the total), over bins that each
 * thread of NT holds as cnt[0 .. PER), highest first across the threads in order: the one thread
 * whose cnt[i] holds that bin calls found(i, keys in the bins above it, cnt[i]). */
template <int NT, int PER, typename ScanTmp, typename FoundFn>
__device__ __forceinline__ void bin_reaching_k(const int (&cnt)[PER], int k, ScanTmp &scan_tmp,
                                               FoundFn found) {
    int sum = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) sum += cnt[i];
    int excl;
    cub::BlockScan<int, NT>(scan_tmp).ExclusiveSum(sum, excl);
    if (excl < k && k <= excl + sum) {
        int acc = excl;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            if (acc < k && k <= acc + cnt[i]) found(i, acc, cnt[i]);
            acc += cnt[i];
        }
    }
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
    int cnt[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) cnt[i] = sm.hist[TOP_BINS - 1 - (PER * tid + i)];
    bin_reaching_k<NT>(cnt, k, scan_tmp, [&](int i, int above, int c) {
        sm.bin = TOP_BINS - 1 - (PER * tid + i);
        sm.n_cand = above + c;
    });
    __syncthreads();
    bin = sm.bin;
    n_cand = sm.n_cand;
    __syncthreads();
}

/* Visits the selected positions in ascending order: emit(position, rank). Selection: every key >
 * thr, plus n_take_eq of the keys == thr (the first ones, or the last ones with prefer_high).
 * k >= n (take_all) selects everything. A part of a longer list, positions [begin, n), is
 * compacted given what lies before it: eq_before keys equal to thr and sel_before selected. */
template <int NT, int ITEMS, typename KeyFn, typename EmitFn>
__device__ void block_compact(KeyFn key, int n, bool take_all, uint32_t thr, int n_take_eq,
                              int eq_total, bool prefer_high, EmitFn emit,
                              typename cub::BlockScan<int, NT>::TempStorage &scan_tmp,
                              int begin = 0, int eq_before = 0, int sel_before = 0) {
    using scan_t = cub::BlockScan<int, NT>;
    const int tid = threadIdx.x;
    int run_eq = eq_before, run_sel = sel_before;
    for (int base = begin; base < n; base += NT * ITEMS) {
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

/* Warp-wide selects over n <= 32 SLOTS distinct 64-bit values, held in registers: lane l holds
 * value 32 i + l in slot i, 0 where there is none (every value is above 0). */

/* How many values are >= x (x > 0), one ballot per slot. */
template <int SLOTS> __device__ __forceinline__ int warp_count_ge(const uint64_t *v, uint64_t x) {
    int c = 0;
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) c += __popc(__ballot_sync(0xffffffffu, v[i] >= x));
    return c;
}

/* This lane's place among the lanes set in a ballot below it. */
__device__ __forceinline__ int lanes_below(unsigned ballot) {
    return __popc(ballot & ((1u << (threadIdx.x & 31)) - 1u));
}

/* The kr-th largest of the values in [lo, hi] by quickselect, each round counting the values at
 * or above a pseudo-random pivot of those still in question (about 2 ln n rounds). Requires
 * 0 < kr <= the values in [lo, hi], lo > 0. */
template <int SLOTS>
__device__ __forceinline__ uint64_t warp_kth_quickselect(const uint64_t *v, uint64_t lo,
                                                         uint64_t hi, int kr) {
    const int lane = threadIdx.x & 31;
    uint32_t seed = 0x9e3779b9u * (uint32_t)(7 * kr + 1);
    for (;;) {
        unsigned in[SLOTS];
        int total = 0;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) {
            in[i] = __ballot_sync(0xffffffffu, v[i] >= lo && v[i] <= hi);
            total += __popc(in[i]);
        }
        if (total == kr) { /* all of them: the kr-th is the smallest */
            uint64_t low = ~0ull;
#pragma unroll
            for (int i = 0; i < SLOTS; ++i)
                if ((in[i] >> lane) & 1u) low = v[i] < low ? v[i] : low;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const uint64_t other = __shfl_xor_sync(0xffffffffu, low, o);
                low = other < low ? other : low;
            }
            return low;
        }
        seed = seed * 1664525u + 1013904223u;
        /* the pivot: the r-th value in question, in slot `at` of lane src */
        int r = (int)((seed >> 8) % (uint32_t)total), at = -1, src = 0;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) {
            const int cnt = __popc(in[i]);
            if (at < 0 && r < cnt) {
                at = i;
                src = (int)__fns(in[i], 0, r + 1);
            } else if (at < 0) {
                r -= cnt;
            }
        }
        uint64_t pick = 0;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i)
            if (i == at) pick = v[i];
        const uint64_t pivot = __shfl_sync(0xffffffffu, pick, src);
        int ge = 0;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i)
            ge += __popc(__ballot_sync(0xffffffffu, ((in[i] >> lane) & 1u) && v[i] >= pivot));
        if (ge == kr) return pivot;
        if (ge > kr) {
            lo = pivot + 1;
        } else {
            kr -= ge;
            hi = pivot - 1;
        }
    }
}

/* Keeps the k largest of the n distinct values c[0 .. n) (n <= 32 SLOTS) in place, in their
 * order, and returns the smallest one kept. The k-th largest is bracketed first: 32 of the values,
 * one per lane from spread positions, are sorted (bitonic, across lanes) and a binary search with
 * exact counts finds the two adjacent samples around it. The few values between them (n / 32
 * expected) go one per lane to `scratch` (32 values of the warp's own), where each lane ranks its
 * value against the others; where more than 32 lie there, a quickselect between the two samples.
 * About a fifth of a quickselect's instructions for n = 256. Requires 0 < k <= n. */
template <int SLOTS>
__device__ __forceinline__ uint64_t warp_keep_top(uint64_t *c, int n, int k, uint64_t *scratch) {
    static_assert(SLOTS >= 1 && SLOTS <= 32, "slots");
    const int lane = threadIdx.x & 31;
    uint64_t v[SLOTS];
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) v[i] = 32 * i + lane < n ? c[32 * i + lane] : 0;
    uint64_t thr = 1; /* k == n: every value */
    if (k < n) {
        /* lane l samples value 32 (l % SLOTS) + l, read again: picking it out of v[] made v[] an
         * indexed array in local memory */
        const int at = 32 * (lane % SLOTS) + lane;
        uint64_t smp = at < n ? c[at] : 0;
#pragma unroll
        for (int size = 2; size <= 32; size <<= 1)
#pragma unroll
            for (int stride = size / 2; stride > 0; stride >>= 1) {
                const uint64_t other = __shfl_xor_sync(0xffffffffu, smp, stride);
                const bool keep_max = ((lane & size) == 0) == ((lane & stride) == 0);
                smp = keep_max ? (other > smp ? other : smp) : (other < smp ? other : smp);
            }
        /* lane i holds the i-th largest sample (0s last). The first i whose sample has at least k
         * values at or above it (i = 32: none, every value counts) */
        int lo_i = 0, hi_i = 32;
        while (lo_i < hi_i) {
            const int mid = (lo_i + hi_i) >> 1;
            const uint64_t x = __shfl_sync(0xffffffffu, smp, mid);
            if (x == 0 || warp_count_ge<SLOTS>(v, x) >= k)
                hi_i = mid;
            else
                lo_i = mid + 1;
        }
        /* the k-th largest is the kr-th of [lower, upper] */
        const uint64_t above_smp = lo_i > 0 ? __shfl_sync(0xffffffffu, smp, lo_i - 1) : 0;
        const uint64_t at_smp = __shfl_sync(0xffffffffu, smp, lo_i & 31);
        const uint64_t upper = lo_i > 0 ? above_smp - 1 : ~0ull;
        const uint64_t lower = lo_i < 32 && at_smp > 0 ? at_smp : 1;
        const int kr = k - (lo_i > 0 ? warp_count_ge<SLOTS>(v, above_smp) : 0);
        int m = 0;
#pragma unroll
        for (int i = 0; i < SLOTS; ++i) {
            const bool in = v[i] >= lower && v[i] <= upper;
            const unsigned bal = __ballot_sync(0xffffffffu, in);
            const int at = m + lanes_below(bal);
            if (in && at < 32) scratch[at] = v[i];
            m += __popc(bal);
        }
        __syncwarp();
        if (m <= 32) {
            const uint64_t x = lane < m ? scratch[lane] : 0;
            int rank = 0;
            for (int j = 0; j < m; ++j) rank += scratch[j] > x;
            const unsigned hit = __ballot_sync(0xffffffffu, lane < m && rank == kr - 1);
            thr = __shfl_sync(0xffffffffu, x, __ffs(hit) - 1);
        } else {
            thr = warp_kth_quickselect<SLOTS>(v, lower, upper, kr);
        }
        __syncwarp(); /* scratch is written again by the next call */
    }
    int out = 0;
#pragma unroll
    for (int i = 0; i < SLOTS; ++i) {
        const bool keep = v[i] >= thr; /* thr > 0: never an empty slot */
        const unsigned kept = __ballot_sync(0xffffffffu, keep);
        if (keep) c[out + lanes_below(kept)] = v[i];
        out += __popc(kept);
    }
    __syncwarp();
    return thr;
}

} // namespace mi_cuda

#endif /* MI_BLOCK_SELECT_CUH */
