/*
 * vs_walk.cuh: the walk of the vertical-slash index build for one row block (docs/algorithms.md
 * §2), on the host and the device alike: vs_index_kernel (vs_index.cu) runs it a thread per row
 * block, and the host test (tests/cuda/test_vs_walk.cu) checks it against the CPU builder, with and
 * without its shortcuts, where CI has no GPU.
 *
 * The walk merges the 64-wide footprints of the diagonals left to right and keeps a vertical as
 * a gathered column only if it lies left of the current range. Every range starts at or before
 * the row block start (e = max(end - d, 64) <= end), so every gathered column is < start:
 * causal-safe by construction. Verticals right of the last range but left of the block start
 * (possible only without small distances) are kept as columns, like the CPU reference.
 * Duplicates and out-of-range entries are skipped as the walk meets them.
 */
#ifndef MI_VS_WALK_CUH
#define MI_VS_WALK_CUH

#include <stdint.h>

namespace mi_cuda {

__host__ __device__ __forceinline__ int vs_walk_ffs(uint32_t x) {
#ifdef __CUDA_ARCH__
    return __ffs(x);
#else
    return __builtin_ffs((int)x);
#endif
}

/* One (b, h)'s lists as the walk reads them: V ascending, S descending (sorted, but with any
 * entries). v_prefix: V is strictly ascending without negative entries; s_runs: S is strictly
 * descending without negative entries, and bit i of breaks is set where entry i ends a run (the
 * last entry, or the next is more than 64 below it), bit w of break_words where word w of breaks
 * has a bit (vs_walk_ends_run gives each bit). */
struct vs_walk_lists {
    const int32_t *V, *S;
    int nv, ns;
    bool v_prefix, s_runs;
    const uint32_t *breaks, *break_words;
};

/* Whether entry i of S (strictly descending, ns entries) ends a run: bit i of breaks. */
__host__ __device__ __forceinline__ bool vs_walk_ends_run(const int32_t *S, int ns, int i) {
    return i < ns && (i == ns - 1 || S[i] - S[i + 1] > 64);
}

/* What a row block's walk gave: its block starts, its columns, and how many of those are the
 * prefix V[0 .. prefix) (kept through keep_prefix, the others one at a time through keep). */
struct vs_walk_counts {
    int blocks, columns, prefix;
};

/* The walk of the row block [start, start + 64) of a sequence of len keys (start < len).
 * emit(n, x): block start x is the row block's n-th; keep(i, n, c): V[i] = c is its n-th column;
 * keep_prefix(n): V[0 .. n) are its first n columns. At most max_blocks blocks and max_columns
 * columns. */
template <typename Emit, typename Keep, typename KeepPrefix>
__host__ __device__ __forceinline__ vs_walk_counts vs_walk_row(const vs_walk_lists &l, int start,
                                                               int len, int max_blocks,
                                                               int max_columns, Emit emit_block,
                                                               Keep keep_column,
                                                               KeepPrefix keep_prefix_columns) {
    const int32_t *V = l.V, *S = l.S;
    const int nv = l.nv, ns = l.ns;
    const int end = start + 64;
    int nb = 0, nc = 0, n_prefix = 0;
    /* next valid diagonal (descending, unique, 0 <= d < len) */
    int si = 0, s_prev = 0x7fffffff;
    auto next_s = [&]() -> int {
        while (si < ns) {
            const int d = S[si++];
            if (d < 0 || d >= len || d >= s_prev) continue;
            s_prev = d;
            return d;
        }
        return -1;
    };
    /* The diagonals are sorted descending (so their windows' ends ascend); a diagonal whose
     * window ends inside the current range (d >= thr = end - r_end) changes nothing, so runs
     * of them are skipped with a galloping search instead of one step each: a band of
     * consecutive diagonals then costs a few loads per 64-key tile, not 64 iterations. */
    auto next_s_below = [&](int thr) -> int {
        if (si < ns && S[si] >= thr) {
            int lo = si, hi = si + 1, step = 1; /* S[lo] >= thr; S[hi] < thr or hi = ns */
            while (hi < ns && S[hi] >= thr) {
                lo = hi;
                step <<= 1;
                hi = lo + step;
            }
            if (hi > ns) hi = ns;
            while (hi - lo > 1) {
                const int mid = (lo + hi) >> 1;
                if (S[mid] >= thr)
                    lo = mid;
                else
                    hi = mid;
            }
            si = hi;
        }
        return next_s();
    };
    int vi = 0, v_prev = -1;
    int r_start = 0, r_end = 0; /* the range being grown */
    auto peek_v = [&]() -> int {
        while (vi < nv) {
            const int c = V[vi];
            if (c < 0 || c >= len || c <= v_prev) {
                ++vi;
                continue;
            }
            return c;
        }
        return 0x7fffffff;
    };
    /* Every vertical left of the first range is kept (or all left of the block when no
     * diagonal reaches it): with a strictly ascending list they are its first entries, so a
     * binary search counts them and the caller copies them, instead of a step each (about half
     * the list, on average, for a band of diagonals). */
    auto keep_prefix = [&](int bound) {
        if (!l.v_prefix) return;
        int lo = 0, hi = nv; /* first entry >= bound */
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (V[mid] < bound)
                lo = mid + 1;
            else
                hi = mid;
        }
        vi = lo;
        v_prev = lo > 0 ? V[lo - 1] : -1;
        n_prefix = nc = min(lo, max_columns);
        keep_prefix_columns(n_prefix);
    };
    /* The first entry at or after i that ends a run (bit i of breaks onwards; the list's last
     * entry always does). */
    auto run_end = [&](int i) -> int {
        int w = i >> 5;
        uint32_t bits = l.breaks[w] & (~0u << (i & 31));
        if (!bits) {
            int sw = (w + 1) >> 5;
            uint32_t words = l.break_words[sw] & (~0u << ((w + 1) & 31));
            while (!words) words = l.break_words[++sw];
            w = 32 * sw + vs_walk_ffs(words) - 1;
            bits = l.breaks[w];
        }
        return 32 * w + vs_walk_ffs(bits) - 1;
    };
    /* After diagonal dn (entry si - 1) extended or opened the range ending at r_end: each
     * diagonal that follows within 64 of the one before it ends its window at most 64 keys
     * past the range, so it is covered or extends the range by 64 keys, never opens another:
     * the range grows 64 keys at a time until the last diagonal of that run is covered. With a
     * strictly descending list the runs' ends are marked as bits, and the range takes its final
     * end at once: a run costs a few word reads, not a step per 64-key tile. The verticals it
     * passes over are inside the range and would have been dropped one by one; the loop drops
     * them still. */
    auto run_ahead = [&]() {
        if (!l.s_runs) return;
        const int j = run_end(si - 1);
        if (j < si) return;
        const int d_last = S[j];
        si = j + 1;
        s_prev = d_last;
        const int e_last = max(end - d_last, 64);
        if (e_last > r_end) r_end += (e_last - r_end + 63) & ~63;
    };
    auto emit = [&](int rs, int re) {
        for (int x = rs; x < re && nb < max_blocks; x += 64) emit_block(nb++, x);
    };
    /* keeps V[vi] = c as a column */
    auto keep = [&](int c) {
        keep_column(vi, nc, c);
        ++nc;
    };
    /* keeps every vertical from V[vi] on that lies left of the row block */
    auto keep_left_of_block = [&]() {
        for (int c = peek_v(); c < start && nc < max_columns; c = peek_v()) {
            keep(c);
            v_prev = c;
            ++vi;
        }
    };
    const int d = next_s_below(end); /* diagonals d >= end miss this row block */
    if (d < 0) {
        /* no diagonal reaches the block: verticals left of it are all gathered */
        keep_prefix(start);
        keep_left_of_block();
    } else {
        int e = max(end - d, 64);
        r_start = e - 64;
        r_end = e;
        keep_prefix(r_start);
        run_ahead();
        for (;;) {
            const int c = peek_v();
            if (c < r_end) {
                if (c < r_start && nc < max_columns) keep(c);
                v_prev = c;
                ++vi;
            } else {
                const int dn = next_s_below(end - r_end);
                if (dn < 0) {
                    emit(r_start, r_end);
                    /* verticals right of the last range that the whole block still sees (only
                     * without small distances): kept, as on the CPU */
                    keep_left_of_block();
                    break;
                }
                e = max(end - dn, 64);
                if (e > r_end + 64) {
                    emit(r_start, r_end);
                    r_start = e - 64;
                    r_end = e;
                    run_ahead();
                } else if (e > r_end) {
                    r_end += 64;
                    run_ahead();
                }
            }
        }
    }
    return vs_walk_counts{nb, nc, n_prefix};
}

} // namespace mi_cuda

#endif /* MI_VS_WALK_CUH */
