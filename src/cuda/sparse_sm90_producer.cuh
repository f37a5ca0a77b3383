/*
 * sparse_sm90_producer.cuh: the producer warpgroup of the warp-specialised sparse kernel
 * (attn_sparse_sm90.cu). Per work item: Q into the buffer of the item's parity; the range tiles
 * (A's and B's 64-key ranges merged and packed two to a 128-key tile, planned by warps 1-3 while
 * the item before runs, loaded by warp 0 with TMA); then the column tiles (TMA from the copies of
 * the last row block's columns, or gathered by all four warps with cp.async). Each tile's header
 * is written before its K barrier completes. Only warp 0 waits on the slots' empty barriers; the
 * other warps meet it at named barriers 3 (all four) and 4 (warps 1-3).
 */
#ifndef MI_SPARSE_SM90_PRODUCER_CUH
#define MI_SPARSE_SM90_PRODUCER_CUH

#include "sparse_sm90_layout.cuh"

#include <limits.h>

namespace mi_cuda {

#ifdef MI_SM90_DEVICE
/* Range starts of row blocks A and B: staged in shared memory (up to SP_STAGED each), the rest
 * read from the index; or, for an A-shape head (g == nullptr), generated: the sink pieces
 * 0, 64, .. then the window's from 64 win0. */
struct staged_list {
    const int32_t *sm, *g;
    int n;
    int sinks = 0, win0 = 0;
    __device__ int at(int i) const {
        if (!g) return (i < sinks ? i : win0 + i - sinks) * 64;
        return i < SP_STAGED ? sm[i] : __ldg(g + i);
    }
};

/* The 64-key pieces that the 64 rows from rs see under A-/Tri-shape window w: the tiles
 * plan_tiles gives the ring kernel. */
__device__ __forceinline__ staged_list ashape_starts(const a_shape_window &w, int rs, int len) {
    staged_list l{nullptr, nullptr, 0};
    if (rs >= len) return l;
    const a_shape_tiles t = a_shape_tiles_of(w, rs, min(rs + 64, len), len);
    l.n = t.n;
    l.sinks = t.sink_tiles;
    l.win0 = t.win_start;
    return l;
}

/* Whether list[0, n) holds key, comparing entries & mask (strictly ascending so). */
__device__ __forceinline__ bool sorted_contains(const int32_t *list, int n, int key,
                                                int mask = -1) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if ((list[mid] & mask) < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && (list[lo] & mask) == key;
}

/* Merges A's and B's range starts (each ascending, so that a start both use meets itself) into
 * one list, each start once with the row blocks that use it, and packs them two to a tile: two
 * starts both use (a shared tile), or one of A's only with one of B's only (a split tile: each
 * consumer computes its own 64-key half), or else two of one side's. Lane 0 of each producer
 * warp runs it. */
struct range_packer {
    staged_list la, lb;
    int ia = 0, ib = 0;
    /* a start of each users class (A only, B only, both) waiting for a partner, or INT_MIN;
     * scalars, not an array indexed by the class, which would live in local memory */
    int h1 = INT_MIN, h2 = INT_MIN, h3 = INT_MIN;
    __device__ range_packer(staged_list a_, staged_list b_) : la(a_), lb(b_) {}
    __device__ bool merging() const { return ia < la.n || ib < lb.n; }
    __device__ bool more() const {
        return merging() || h1 != INT_MIN || h2 != INT_MIN || h3 != INT_MIN;
    }
    /* The next tile: starts o[2], users u[2] (0: padding); call only when more(). */
    __device__ void next(int *o, int *u) {
        while (merging()) {
            const int va = ia < la.n ? la.at(ia) : INT_MAX, vb = ib < lb.n ? lb.at(ib) : INT_MAX;
            const bool ta = ia < la.n && va <= vb, tb = ib < lb.n && vb <= va;
            const int off = ta ? va : vb, cls = (ta ? 1 : 0) | (tb ? 2 : 0);
            ia += ta;
            ib += tb;
            if (cls == 3) {
                if (h3 == INT_MIN) {
                    h3 = off;
                    continue;
                }
                o[0] = h3, o[1] = off, u[0] = u[1] = 3;
                h3 = INT_MIN;
                return;
            }
            /* values, not references to h1 / h2: a reference chosen at run time put them in
             * local memory */
            const int mine = cls == 1 ? h1 : h2, other = cls == 1 ? h2 : h1;
            if (other != INT_MIN) { /* split: A's half first */
                o[0] = cls == 1 ? off : other;
                o[1] = cls == 1 ? other : off;
                u[0] = 1, u[1] = 2;
                h1 = h2 = INT_MIN; /* mine was empty */
                return;
            }
            if (mine != INT_MIN) { /* two of one side */
                o[0] = mine, o[1] = off, u[0] = u[1] = cls;
                h1 = cls == 1 ? INT_MIN : h1;
                h2 = cls == 1 ? h2 : INT_MIN;
                return;
            }
            h1 = cls == 1 ? off : h1;
            h2 = cls == 1 ? h2 : off;
        }
        /* the leftovers: A's and B's together, else one per tile */
        if (h1 != INT_MIN && h2 != INT_MIN) {
            o[0] = h1, o[1] = h2, u[0] = 1, u[1] = 2;
            h1 = h2 = INT_MIN;
            return;
        }
        const int cls = h1 != INT_MIN ? 1 : h2 != INT_MIN ? 2 : 3;
        o[0] = o[1] = cls == 1 ? h1 : cls == 2 ? h2 : h3, u[0] = cls, u[1] = 0;
        h1 = cls == 1 ? INT_MIN : h1;
        h2 = cls == 2 ? INT_MIN : h2;
        h3 = cls == 3 ? INT_MIN : h3;
    }
};

/* A's and B's range starts (up to SP_STAGED each) into staged, threads i0, i0 + step.. */
__device__ __forceinline__ void stage_starts(const sparse_sm90_args &a, int32_t *staged, int i0,
                                             int step, const int32_t *offs, int na, int nb) {
    for (int i = i0; i < min(na, SP_STAGED); i += step) staged[i] = __ldg(offs + i);
    for (int i = i0; i < min(nb, SP_STAGED); i += step)
        staged[SP_STAGED + i] = __ldg(offs + a.max_blocks + i);
}

/* An item's count from the index, clamped to what the index holds (0 for a missing B). */
__device__ __forceinline__ int count_at(const int32_t *counts, const sparse_item &n, int r,
                                        int most) {
    if (n.ashape) return 0; /* no columns (and no index) */
    return r == 0 || n.has_b ? min(max(__ldg(counts + n.row_a + r), 0), most) : 0;
}

/* An item's range starts: A's and B's lists of the index, na and nb starts (staged or not), or
 * generated for an A-shape head. */
__device__ __forceinline__ void range_lists(const sparse_sm90_args &a, int32_t *staged,
                                            const sparse_item &n, int na, int nb, staged_list &la,
                                            staged_list &lb) {
    if (n.ashape) {
        la = ashape_starts(a.a_win, n.rs, a.len);
        lb = ashape_starts(a.a_win, n.rs + 64, a.len);
        return;
    }
    const int32_t *offs = a.block_offset + n.row_a * a.max_blocks;
    la = {staged, offs, na};
    lb = {staged + SP_STAGED, offs + a.max_blocks, nb};
}

/* Warps 1-3 plan item w's range tiles into pl: its counts, its range starts staged, and lane 0
 * of warp 1 merging them into tiles. Warp 0 issues the loads at about nine cycles an
 * instruction (it shares its SM sub-partition with two consumer warps), so the merge and the
 * index reads stay off its path. An item with more than a.plan_tiles tiles or SP_STAGED starts
 * a side is merged inline by warp 0 (PLAN_INLINE). */
__device__ __forceinline__ void plan_item(const sparse_sm90_args &a, int32_t *staged, int tid,
                                          int w, range_plan &pl) {
    const sparse_item n = sparse_item_of(a, w);
    staged_list la, lb;
    range_lists(a, staged, n, count_at(a.block_count, n, 0, a.max_blocks),
                count_at(a.block_count, n, 1, a.max_blocks), la, lb);
    const int na = la.n, nb = lb.n;
    const bool fit = n.ashape || (na <= SP_STAGED && nb <= SP_STAGED);
    if (fit && !n.ashape) stage_starts(a, staged, tid - 32, 96, la.g, na, nb);
    named_barrier_sync(4, 96);
    if (tid == 32) {
        pl.count[0] = na;
        pl.count[1] = nb;
        pl.count[2] = count_at(a.column_count, n, 0, a.max_columns);
        pl.count[3] = count_at(a.column_count, n, 1, a.max_columns);
        int m = 0;
        bool ok = fit;
        if (fit) {
            range_packer rp(la, lb);
            while (rp.more()) {
                if (m == a.plan_tiles) {
                    ok = false;
                    break;
                }
                int o[2], u[2];
                rp.next(o, u);
                pl.off[m] = make_int2(o[0], o[1]);
                pl.users[m] = (uint8_t)(u[0] | u[1] << 2);
                ++m;
            }
        }
        pl.tiles = m;
        pl.state = ok ? PLAN_READY : PLAN_INLINE;
    }
}

/* The next item's counts and the heads of its lists into L2 while this one runs (its planners
 * read them, then its column lists): warps 1-3, off warp 0's path. */
__device__ __forceinline__ void prefetch_item(const sparse_sm90_args &a, const sparse_item &next,
                                              int tid) {
    const int64_t nrow = next.row_a;
    const int line = tid % 32, part = tid / 32; /* 128-byte lines of 32 entries */
    const bool index = !next.ashape;            /* an A-shape item reads none */
    if (index && part == 1 && line < 2) prefetch_l2((line ? a.column_count : a.block_count) + nrow);
    const int ol = line - 2; /* block_offset lines */
    if (index && part == 1 && ol >= 0 && ol < 8 && (ol % 4) * 32 < a.max_blocks)
        prefetch_l2(a.block_offset + (nrow + ol / 4) * a.max_blocks + (ol % 4) * 32);
    if (index && part >= 2 && line * 32 < a.max_columns)
        prefetch_l2(a.column_index + (nrow + part - 2) * a.max_columns + line * 32);
}

/* An item's column lists and how its column tiles are made. A's and B's lists are mostly the
 * same keys (the verticals of the head, less those inside each block's ranges). When both are
 * strictly ascending (as the index builders write them) and fit in shared memory (share), A's
 * tiles carry every column, each also used by B where B lists it, then come B's tiles of the
 * columns A does not list: a column both use is loaded once and both consumers compute its
 * tiles. Otherwise A's and B's tiles alternate, each used by its own row block only (while one
 * consumer computes a tile of A, the other computes the next one, of B). */
struct item_columns {
    int ca, cb;                     /* A's and B's column counts */
    const int32_t *cols_a, *cols_b; /* their lists in the index */
    int32_t *scol_a, *scol_b;       /* staged (share) */
    int32_t *warp_sum;              /* [3], for warps 1-3 */
    int32_t *t_shared;              /* warp 0's tile count after the ranges */
    int32_t *col_info;              /* [3]: share | prefix << 1, cnt_b, tiles_b */
    int tiles_a, tiles_b, cnt_b;    /* B's: all of them, or those A lacks */
    int col_a, col_b;               /* column tiles done */
    bool share;                     /* both lists staged and ascending: set by stage_columns */
    bool prefix;                    /* columns read from the copies of the last block's */
};

/* Stages both column lists and sees whether they can be shared: warps 1-3 (96 threads, named
 * barrier 4), once per item while warp 0 loads the range tiles. */
__device__ __forceinline__ void stage_columns(const sparse_sm90_args &a, const sparse_item &it,
                                              int tid, int pw, int lane, item_columns &c) {
    const int ca = c.ca, cb = c.cb;
    int32_t *scol_a = c.scol_a, *scol_b = c.scol_b, *warp_sum = c.warp_sum;
    const int st = tid - 32; /* their thread index */
    const bool fit = ca > 0 && cb > 0 && ca <= SP_CSTAGED && cb <= SP_CSTAGED;
    bool ok = fit;
    if (fit) {
        /* loads only, independent of each other so that they are all in flight at once; the
         * order is checked in shared memory afterwards */
#pragma unroll 4
        for (int i = st; i < ca; i += 96) scol_a[i] = __ldg(c.cols_a + i);
#pragma unroll 4
        for (int i = st; i < cb; i += 96) scol_b[i] = __ldg(c.cols_b + i);
        named_barrier_sync(4, 96);
        for (int i = st + 1; i < ca; i += 96) ok &= scol_a[i] > scol_a[i - 1];
        for (int i = st + 1; i < cb; i += 96) ok &= scol_b[i] > scol_b[i - 1];
        ok &= scol_a[0] >= 0 && scol_b[0] >= 0; /* bit 31 marks users below */
    }
    /* every thread's verdict (and its staged entries) before anyone reads them */
    c.share = !named_barrier_or(4, 96, !ok);
    /* Vertical-slash lists are the head's verticals left of the block's band: a prefix of the
     * last row block's list. Where both lists are, their columns are the first positions of
     * its copies, read with TMA as whole tiles (position j used by A if j < ca, by B if
     * j < cb) instead of gathered. */
    if (c.share && a.crows > 0) {
        const int n = __ldg(a.col_rows + it.bh);
        bool same = n >= max(ca, cb);
        if (same) {
            const int32_t *last =
                a.column_index + ((int64_t)it.bh * a.row_blocks + a.row_blocks - 1) * a.max_columns;
            for (int i = st; i < max(ca, cb); i += 96) {
                const int u = __ldg(last + i);
                same &= (i >= ca || scol_a[i] == u) && (i >= cb || scol_b[i] == u);
            }
        }
        c.prefix = !named_barrier_or(4, 96, !same);
    }
    if (c.share && !c.prefix) {
        /* who uses each column, found once per item rather than per tile: bit 31 of a B entry
         * marks a key A lists too, of an A entry a key B lists; B's list then keeps the keys A
         * lacks only, so that the tile count is known (the last tile carries the end of the
         * item) and no tile is empty */
        for (int i = st; i < cb; i += 96)
            if (sorted_contains(scol_a, ca, scol_b[i])) scol_b[i] |= INT_MIN;
        named_barrier_sync(4, 96);
        for (int i = st; i < ca; i += 96)
            if (sorted_contains(scol_b, cb, scol_a[i], INT_MAX)) scol_a[i] |= INT_MIN;
        int kept = 0;
        for (int c0 = 0; c0 < cb; c0 += 96) { /* in place: writes trail reads */
            const int v = c0 + st < cb ? scol_b[c0 + st] : INT_MIN;
            const uint32_t m = __ballot_sync(0xffffffffu, v >= 0);
            if (lane == 0) warp_sum[pw - 1] = __popc(m);
            named_barrier_sync(4, 96);
            int before = kept;
            for (int j = 0; j < 3; ++j) {
                before += j < pw - 1 ? warp_sum[j] : 0;
                kept += warp_sum[j];
            }
            named_barrier_sync(4, 96);
            if (v >= 0) scol_b[before + __popc(m & ((1u << lane) - 1))] = v;
        }
        named_barrier_sync(4, 96);
        c.cnt_b = kept;
        c.tiles_b = (kept + 127) / 128;
    }
    if (tid == 32) { /* for warp 0, after the barrier that ends the ranges */
        c.col_info[0] = (c.share ? 1 : 0) | (c.prefix ? 2 : 0);
        c.col_info[1] = c.cnt_b;
        c.col_info[2] = c.tiles_b;
    }
}

/* The range tiles of an item, by warp 0 alone (with every producer warp walking the plan, the
 * merge doubled the kernel's instructions per tile against the dense kernel's): from the plan,
 * or merged as it goes (lane 0). t counts the tiles over all items: the slot ring runs on. */
__device__ __forceinline__ void load_range_tiles(const sparse_sm90_args &a, const sparse_smem &sm,
                                                 const sparse_item &it, const range_plan &pl,
                                                 bool planned, int na, int nb, bool has_columns,
                                                 int lane, int &t) {
    staged_list la, lb;
    range_lists(a, sm.staged, it, na, nb, la, lb);
    range_packer rp(la, lb);
    const int planned_tiles = planned ? pl.tiles : 0;
    for (int i = 0;; ++t, ++i) {
        const int slot = t % SP_STAGES, par = ((t / SP_STAGES) - 1) & 1;
        const uint32_t kd = smem_addr(sm.ks) + slot * SP_TILE,
                       vd = smem_addr(sm.vs) + slot * SP_TILE;
        tile_header &hd = sm.hdr[slot];
        const int ranges_left = planned
                                    ? i < planned_tiles
                                    : __shfl_sync(0xffffffffu, lane == 0 ? (int)rp.more() : 0, 0);
        if (!ranges_left) break;
        /* the next range tile is known before the wait for its slot, so that the loads go out
         * as soon as the slot is free */
        int ro[2] = {0, 0}, ru[2] = {0, 0}, rlast = 0;
        if (planned) {
            const int2 o = pl.off[i];
            const int u = pl.users[i];
            ro[0] = o.x, ro[1] = o.y, ru[0] = u & 3, ru[1] = u >> 2;
            rlast = i + 1 == planned_tiles && !has_columns;
        } else if (lane == 0) {
            rp.next(ro, ru);
            rlast = !rp.more() && !has_columns; /* no more ranges and no columns */
        }
        /* adjacent ranges (most tiles of a band) as one run of 128 rows: half the loads */
        const bool run = ro[1] == ro[0] + 64;
        /* K or V of the tile (lane 0): the run, or each range */
        auto load = [&](uint32_t dst, const CUtensorMap *run_map, const CUtensorMap *map,
                        uint64_t *bar) {
            if (run) {
                tma_load_tile<128>(dst, run_map, ro[0], it.hk, it.b, bar);
                return;
            }
            mbar_expect_tx(bar, SP_TILE);
            for (int i = 0; i < 4; ++i)
                tma_load_4d(dst + (i & 1) * SP_HALF + (i >> 1) * 64 * 128, map, (i & 1) * 64,
                            ro[i >> 1], it.hk, it.b, bar);
        };
        if (t >= SP_STAGES) mbar_wait(sm.k_empty + slot, par);
        if (lane == 0) {
            hd.off[0] = ro[0];
            hd.off[1] = ro[1];
            hd.users[0] = ru[0];
            hd.users[1] = ru[1];
            hd.column = 0;
            hd.last = rlast;
            load(kd, &a.tm_k2, &a.tm_k, sm.k_full + slot);
        }
        if (t >= SP_STAGES) mbar_wait(sm.v_empty + slot, par);
        if (lane == 0) load(vd, &a.tm_v2, &a.tm_v, sm.v_full + slot);
        if (__shfl_sync(0xffffffffu, rlast, 0)) {
            ++t;
            break;
        }
    }
}

/* An item with no keys at all: an end marker for the consumers, no data. */
__device__ __forceinline__ void mark_empty_item(const sparse_smem &sm, int tid, int pw, int &t) {
    const int slot = t % SP_STAGES, par = ((t / SP_STAGES) - 1) & 1;
    if (pw == 0 && t >= SP_STAGES) mbar_wait(sm.k_empty + slot, par);
    if (tid == 0) {
        sm.hdr[slot].users[0] = sm.hdr[slot].users[1] = 0;
        sm.hdr[slot].column = 0;
        sm.hdr[slot].last = 1;
        mbar_arrive(sm.k_full + slot);
    }
    if (pw == 0 && t >= SP_STAGES) mbar_wait(sm.v_empty + slot, par);
    if (tid == 0) mbar_arrive(sm.v_full + slot);
    ++t;
}

/* The column tiles of an item, by all four warps: 128 positions of the copies with TMA
 * (prefix), or gathered rows, one key per thread. */
template <typename T>
__device__ __forceinline__ void load_column_tiles(const sparse_sm90_args &a, const sparse_smem &sm,
                                                  const sparse_item &it, int tid, int pw,
                                                  item_columns &c, int &t) {
    const int ca = c.ca, cb = c.cb;
    for (;; ++t) {
        const int slot = t % SP_STAGES, par = ((t / SP_STAGES) - 1) & 1;
        const uint32_t kd = smem_addr(sm.ks) + slot * SP_TILE,
                       vd = smem_addr(sm.vs) + slot * SP_TILE;
        tile_header &hd = sm.hdr[slot];
        /* Only warp 0 waits for a slot to be free. Another producer warp that lags may find the
         * barrier one phase further on than the one it expects (the consumers free the slot
         * again once warp 0 has refilled it), then wait on a phase that completes only after
         * warp 0 has gone on, and warp 0 in turn stops at the next named barrier of the four
         * warps: a deadlock. The other warps learn that the slot is free from a named barrier
         * after warp 0's wait, and only on gathered tiles, the only ones they write. */
        if (pw == 0 && t >= SP_STAGES) mbar_wait(sm.k_empty + slot, par);
        if (c.prefix) { /* the next 128 positions of the copies, with TMA */
            const int n_pos = max(ca, cb), p0 = 128 * c.col_a++, pos = p0 + tid;
            const int last = 128 * c.col_a >= n_pos;
            named_barrier_sync(3, 128); /* the K slot is free (warp 0 waited for it) */
            hd.kpos[tid] = pos < n_pos ? (pos < ca ? c.scol_a : c.scol_b)[pos] : MI_NO_KEY;
            hd.kusers[tid] = (uint8_t)((pos < ca ? 1 : 0) | (pos < cb ? 2 : 0));
            if (tid == 0) {
                /* a block whose list ends in the first half computes that half only */
                hd.users[0] = (p0 < ca ? 1 : 0) | (p0 < cb ? 2 : 0);
                hd.users[1] = (p0 + 64 < ca ? 1 : 0) | (p0 + 64 < cb ? 2 : 0);
                hd.column = 1;
                hd.last = last;
                /* the lists ascend (share), so a block's last key in the tile is its largest */
                for (int r = 0; r < 2; ++r) {
                    const int n = min(max((r ? cb : ca) - p0, 0), 128);
                    hd.nuse[r] = n;
                    hd.kmax[r] = n > 0 ? (r ? c.scol_b : c.scol_a)[p0 + n - 1] : -1;
                }
            }
            named_barrier_sync(3, 128); /* the header is written before the K barrier's arrive */
            if (tid == 0) tma_load_tile<128>(kd, &a.tm_kc, p0, it.bh, 0, sm.k_full + slot);
            if (pw == 0 && t >= SP_STAGES) mbar_wait(sm.v_empty + slot, par);
            if (tid == 0) tma_load_tile<128>(vd, &a.tm_vc, p0, it.bh, 0, sm.v_full + slot);
            if (last) {
                ++t;
                break;
            }
            continue;
        }
        /* the next gathered tile, one row per thread: its key and who uses it */
        const bool for_a =
            c.col_a < c.tiles_a && (c.share || c.col_b >= c.tiles_b || c.col_a <= c.col_b);
        const int col = (for_a ? c.col_a++ : c.col_b++) * 128 + tid, cnt = for_a ? ca : c.cnt_b;
        int key = MI_NO_KEY, users = 0;
        if (col < cnt) {
            const int raw = c.share ? (for_a ? c.scol_a : c.scol_b)[col]
                                    : __ldg((for_a ? c.cols_a : c.cols_b) + col);
            key = c.share ? raw & INT_MAX : raw;
            users = for_a ? (c.share && raw < 0 ? 3 : 1) : 2;
        }
        if (key < 0 || key >= a.len) key = MI_NO_KEY, users = 0;
        const int last = c.col_a >= c.tiles_a && c.col_b >= c.tiles_b;
        int tile_users = 2; /* B's tiles: B's only */
        if (for_a) {
            tile_users = named_barrier_or(3, 128, users & 1) ? 1 : 0;
            if (c.share && named_barrier_or(3, 128, users & 2)) tile_users |= 2;
        }
        named_barrier_sync(3, 128); /* the K slot is free (warp 0 waited for it) */
        hd.kpos[tid] = key;
        hd.kusers[tid] = (uint8_t)users;
        if (tid == 0) {
            hd.users[0] = hd.users[1] = tile_users;
            hd.column = 1;
            hd.last = last;
            hd.nuse[0] = hd.nuse[1] = -1;
        }
        /* The copies complete on the slot's barrier by themselves: each thread's arrive-on
         * counts as pending until its copies land, and thread 0's plain arrive (once every
         * thread has registered its own) is the one the barrier expects. So the producer goes
         * on at once; the consumers fence the async proxy before their wgmma read the tile.
         * Each warp copies its 32 rows (gather_rows). */
        auto gather = [&](const void *g, const int64_t *st, uint32_t dst, uint64_t *bar) {
            gather_rows<32, 1, 4>(dst, SP_HALF, 32 * pw,
                                  reinterpret_cast<const T *>(g) + it.b * st[0] + it.hk * st[1],
                                  st[2], key);
            cp_async_mbar_arrive(bar);
            named_barrier_sync(3, 128); /* also orders the header before the arrive */
            if (tid == 0) mbar_arrive(bar);
        };
        gather(a.k, a.k_stride, kd, sm.k_full + slot);
        if (pw == 0 && t >= SP_STAGES) mbar_wait(sm.v_empty + slot, par);
        named_barrier_sync(3, 128); /* the V slot is free */
        gather(a.v, a.v_stride, vd, sm.v_full + slot);
        if (last) {
            ++t;
            break;
        }
    }
}

/* The producer warpgroup: 96 registers (its merge, per-item column users and gather code
 * spilled at 72), the consumers take 200. */
template <typename T>
__device__ __forceinline__ void sparse_producer(const sparse_sm90_args &a, const sparse_smem &sm,
                                                int tid, int items) {
    setmaxnreg_dec<96>();
    const int pw = tid / 32, lane = tid % 32;
    int t = 0; /* tiles so far, over all items: the slot ring runs on */
    for (int w = blockIdx.x, k = 0; w < items; w += gridDim.x, ++k) {
        const sparse_item it = sparse_item_of(a, w);
        named_barrier_sync(3, 128); /* every warp is done with the last item; its plan is written */
        range_plan &pl = sm.plans[k & 1];
        if (pl.state == PLAN_NONE) { /* the first item, or one after an inline one */
            /* every thread has read the state before the planner may write it: a warp that read
             * it late would otherwise skip the barrier below that the others wait at */
            named_barrier_sync(3, 128);
            if (pw > 0) plan_item(a, sm.staged, tid, w, pl);
            named_barrier_sync(3, 128);
        }
        const bool planned = pl.state == PLAN_READY;
        const int na = pl.count[0], nb = pl.count[1];
        item_columns c;
        c.ca = pl.count[2];
        c.cb = pl.count[3];
        if (tid == 0) { /* Q, into the buffer item k - 2 used */
            const int qb = k & 1;
            if (k >= 2)
                while (!mbar_try_wait(sm.q_empty + qb, ((k >> 1) - 1) & 1)) {
                }
            tma_load_tile<128>(smem_addr(sm.qs) + qb * SP_TILE, &a.tm_q, it.rs, it.h, it.b,
                               sm.q_full + qb);
        }
        if (pw > 0 && w + (int)gridDim.x < items)
            prefetch_item(a, sparse_item_of(a, w + gridDim.x), tid);
        const int32_t *offs = a.block_offset + it.row_a * a.max_blocks;
        c.cols_a = a.column_index + it.row_a * a.max_columns;
        c.cols_b = c.cols_a + a.max_columns;
        if (!planned) { /* merged inline: its starts staged now */
            if (!it.ashape) stage_starts(a, sm.staged, tid, 128, offs, na, nb);
            named_barrier_sync(3, 128);
        }
        c.tiles_a = (c.ca + 127) / 128;
        c.tiles_b = (c.cb + 127) / 128;
        c.cnt_b = c.cb;
        c.scol_a = sm.staged + 2 * SP_STAGED;
        c.scol_b = c.scol_a + SP_CSTAGED;
        c.warp_sum = c.scol_b + SP_CSTAGED;
        c.t_shared = c.warp_sum + 4;
        c.col_info = c.warp_sum + 5;
        c.col_a = c.col_b = 0;
        c.share = c.prefix = false;
        const bool has_columns = c.ca > 0 || c.cb > 0;
        const int t0 = t;
        if (pw == 0) {
            load_range_tiles(a, sm, it, pl, planned, na, nb, has_columns, lane, t);
            if (lane == 0) *c.t_shared = t;
        } else {
            stage_columns(a, it, tid, pw, lane, c);
            /* then the next item's plan, into the staging warp 0 does not read (only an item
             * merged inline does; the next one is planned at its start then) */
            if (w + (int)gridDim.x < items) {
                if (planned)
                    plan_item(a, sm.staged, tid, w + gridDim.x, sm.plans[(k + 1) & 1]);
                else if (tid == 32)
                    sm.plans[(k + 1) & 1].state = PLAN_NONE;
            }
        }
        named_barrier_sync(3, 128); /* warp 0 is done with the ranges; t_shared is written */
        t = *c.t_shared;
        c.share = c.col_info[0] & 1;
        c.prefix = c.col_info[0] & 2;
        c.cnt_b = c.col_info[1];
        c.tiles_b = c.col_info[2];
        if (!has_columns) {
            if (t == t0) mark_empty_item(sm, tid, pw, t);
            continue;
        }
        load_column_tiles<T>(a, sm, it, tid, pw, c, t);
    }
}
#endif

} // namespace mi_cuda

#endif
