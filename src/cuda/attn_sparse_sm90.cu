/*
 * attn_sparse_sm90.cu: the Hopper (sm_90a) sparse attention kernel, D = 128, for the heads of a
 * launch that consume the block index with band-like ranges (vertical-slash and block-sparse
 * heads, chosen on the device) and for its A-/Tri-shape heads (their sinks, window and dense
 * last rows generated as ranges), where the sequences all have the full length; everything
 * else runs the ring kernel of attn_fwd_sm90.cu.
 *
 * The structure of the dense kernel (attn_dense_sm90.cu) applied to two adjacent 64-row blocks
 * A and B of the index at once, so that the tiles both use are loaded once:
 *   - the producer warpgroup merges A's and B's range starts (each ascending) into one list of
 *     64-key ranges, each marked with who uses it (A, B or both), and packs them two to a
 *     128-key tile (warps 1-3 plan the next item's tiles while warp 0 loads this one's): two
 *     both use (a shared tile), one of A's only with one of B's only (a split tile: each
 *     consumer computes its own 64-key half), or else two of one side's. Tiles are
 *     loaded with TMA (64 x 64 boxes; ranges may start anywhere, rows outside the sequence read
 *     as zeros). A band of diagonals, the common case, is shared but for its two ends;
 *   - then the columns. Where both lists are a prefix of the head's last row block's list (as
 *     vertical-slash lists are: the verticals left of the block's band), they are read as whole
 *     tiles with TMA from copies of that block's K and V rows, which sparse_route_kernel makes
 *     before the launch. Otherwise they are gathered: when both lists are strictly ascending,
 *     A's tiles carry every column (each also used by B where B lists it) and B's the ones A
 *     does not list; else A's and B's tiles alternate, each used by its owner only. All four
 *     producer warps look the keys up, write them (and who uses each) to the tile's header and
 *     copy the rows with cp.async, sixteen lanes to a row (zero-filled where a key does not
 *     exist);
 *   - each tile's header (range starts, users, keys, whether it ends the item) sits next to it in
 *     shared memory; a consumer computes the tiles (or the half) it uses, masks keys after its
 *     rows and keys only the other block uses, and otherwise only frees the slot (a P V still
 *     pending in that slot is issued first, so that no slot waits on a tile that comes later).
 * A persistent CTA per SM walks the work items (pairs x heads x batch), with Q double-buffered,
 * so that an item's start (reading the index, the first loads) overlaps the previous one's end.
 *
 * It runs the sparse heads that sparse_route_kernel (below) finds band-like, the ring kernel the
 * rest. H200 (of the slower kind: the ring kernel on local 1M 7.9 ms), bf16, routed against the
 * ring kernel alone in one process (bench/time_variants.py;
 * bench/results/2026-11-30-gpu-sparse-column-copies-ab.json), ms per head and TFLOP/s:
 *   local 128K 0.842 / 521 (ring 0.967 / 453), local 1M 6.84 / 524 (7.89 / 455);
 *   small 128K 0.188 / 410 (0.212 / 363), small 1M 1.51 / 411 (1.66 / 373);
 *   mixed runs the ring kernel (128K 496, 1M 472-478).
 * Every sparse head on this kernel, earlier (bench/results/2026-11-30-gpu-sparse-ws-ab.json):
 *   mixed 128K 455 against the ring kernel's 490, mixed 1M 374 against 471; whole-layer VS
 *   prefill at 1M x 8 heads (estimated indexes) 56.3 against 46.0 ms per head.
 * So it wins where adjacent row blocks share their ranges (a band of diagonals) and loses where
 * they share few (scattered diagonals: mostly split tiles, each consumer with one 64-key half in
 * flight per stage, where the ring kernel keeps three CTAs' loads in flight per SM). The host
 * cannot tell the two apart before a launch (the index is built on the GPU), hence the choice
 * per head on the device.
 * How it got here (same harness, local / mixed / small at 128K, TFLOP/s):
 *   one producer warp, owner-only column tiles, pairs in merge order: 467 / 430 / 356 (ring
 *   498 / 487 / 386);
 *   ranges packed by users class: mixed 430 -> 480;
 *   a timing-only switch that dropped the columns or the ranges showed the gathered columns at
 *   about 170 TFLOP/s, the ranges at about 550;
 *   four producer warps for the gathers, columns shared when both lists are ascending: local 508;
 *   split tiles (a half per row block, computed as 64 keys): local 516, mixed 475, small 347;
 *   persistent CTAs: small 370 (and 1M small 314 -> 370);
 *   shared memory read as such (LDS, not generic loads) and column lists staged with
 *   independent loads: local 1M 7.27 -> 6.72 ms (489-493 -> 530-537), small 1M 387-394 -> 409
 *   (bench/results/2026-11-30-gpu-shared-space-ab.json);
 *   routed per head instead of opt-in (bench/results/2026-11-30-gpu-sparse-routing.json);
 *   only producer warp 0 waits on the empty barriers, which removed a rare deadlock (see the
 *   producer loop; bench/results/2026-11-30-gpu-ws-producer-fix.json);
 *   gathered rows copied by sixteen lanes each (a lane per row made every copy instruction touch
 *   32 rows), column users found once per item so that the item's last tile ends it (no end
 *   marker taking a slot), the next item's index prefetched into L2: a band with 1000 columns
 *   at 128K 317 -> 332, local-like at 1M 483 -> 496 (the ring kernel's gathers, changed the same
 *   way: 345 -> 377);
 *   columns that are a prefix of the last row block's read with TMA from copies of its K/V
 *   rows (an earlier try, dev/cuda/attn_sparse_union_v8.cu, built the union of all blocks'
 *   columns in three kernels per launch and cost more than it saved on `small`; the copies
 *   ride on the route kernel and the per-item check falls back to gathering): local 1M 7.23 ->
 *   6.84 ms (496 -> 524), small 128K 382 -> 410, small 1M 386 -> 411; the whole-layer prefill
 *   on estimated indexes unchanged (45.5 ms per head). From a sweep of band widths, a shared
 *   128 x 128 tile costs 1.8-2.0 us per SM and each work item about 4-5 us more (its last and
 *   first GEMM not overlapped, the epilogue, a split tile at the band's ends), which bounds
 *   `small` (ten tiles an item, 9.3 tiles' worth of counted FLOPs) near 510 TFLOP/s;
 *   producer warp 0 alone walks the range plan (the four warps each walked it and executed 6x
 *   the dense producer's instructions, on the consumers' SM sub-partitions): on an index where
 *   every tile is shared, 534-544 -> 549-552 at 32K (the dense kernel 605-612 in the same
 *   processes); local 1M 520 -> 534, small 128K 408 -> 420
 *   (bench/results/2026-11-30-gpu-sparse-producer-ab.json). What is left of the gap to the
 *   dense kernel is in the consumers: 14 % more instructions per wgmma (tile headers, the
 *   choice between whole, split and column tiles, more polling of the full barriers);
 *   the output rows stored from one address per row (store_rows in sm90_common.cuh: an
 *   address and a branch per store had been a tenth of the consumers' instructions on `small`):
 *   small 128K 408-410 -> 412-414, 1M 404 -> 411-414, local and mixed unchanged; the
 *   hand-on flag kept in a register (ptxas had reloaded a spilled item index at every tile):
 *   no change measured (bench/results/2026-11-30-gpu-sparse-epilogue-ab.json); column tiles
 *   of the copies masked by position (each block's count and largest key in the tile header)
 *   instead of a lookup of every key's position and users: local 1M 538-544 -> 544-549 and
 *   128K 530-540 -> 538-542 in one process, small unchanged (same file). Packing the header
 *   fields the consumers read into one word (one load and broadcast per tile instead of four)
 *   changed nothing measurable and was not kept; awaiting the next tile and reading its header
 *   during each turn, while S runs, made local and small 8-11 % slower (with two stages that
 *   tile's K is often still loading then, and the softmax waits behind it; same file).
 *   Tried and not kept, same file: an item's last P V issued with the next item's first S and
 *   its rows stored after that turn. Slower on every band-like set (local 1M 534-539 -> 520,
 *   small 128K 416 -> 406): the consumers then reach the next item's first tile with nothing
 *   to do and wait for it (mbarrier waits 3.2 -> 8.6 % of their samples), where the last P V
 *   and the store used to fill that wait.
 *   Nsight Compute on `small` then showed producer warp 0 busy most of the time: it shares its
 *   SM sub-partition with two consumer warps and issues about one instruction every nine
 *   cycles, and per tile it merged the next starts, waited, wrote the header and issued eight
 *   loads, with an item's index reads (counts, then lists) at each item's start. Copying the
 *   next item's counts and starts ahead with cp.async, from warp 0 just before an item's last
 *   tile, made small 1M 2-5 % slower (422-425 -> 397-405; its instructions sat right before that
 *   tile's loads); warps 1-3 instead plan the next item (counts, starts staged, the merge into a
 *   list of tiles, range_plan) while warp 0 issues this item's loads from its plan: small 128K
 *   416-418 -> 424-428, small 1M 419-422 -> 428-431, local 1M 538-540 -> 541-547; Q, the column
 *   copies and tiles of two adjacent ranges as 128-row boxes (two loads per K or V tile instead
 *   of four): within run-to-run spread, kept for the shorter producer path; warps 1-3 also
 *   stage and check the column lists, which warp 0 used to stop for after an item's second
 *   tile: local 1M 544-546 -> 551-554, small 128K 432-433 -> 436-439
 *   (bench/results/2026-11-30-gpu-sparse-planner-ab.json). The last P V carried into the next
 *   item's first turn, tried again with the planner in place: first 9-13 % slower (a branch on
 *   a per-thread flag put the tile loop in divergent code, where every wgmma descriptor went
 *   through R2UR: 12 % more consumer instructions), then, broadcast, still 2-3 % slower (local
 *   1M 548-550 -> 530-533; the first tile's step is a second copy of the consumer code); not kept.
 *   A-shape and Tri-shape heads moved here from the ring kernel: the producer generates each
 *   block's pieces (ashape_starts: the same tiles plan_tiles gives the ring kernel), so that a
 *   window's pieces are shared tiles but for its two ends, and the consumers also mask the keys
 *   left of the window in the pieces it cuts (a second branch, after the causal one, so that the
 *   other heads' mask path is unchanged). 128 + 4096 on the H200: 128K 0.615 -> 0.519-0.524 ms per
 *   head (454 -> 532-537 TFLOP/s, 1.8x the original kernel), 1M 5.03-5.11 -> 4.29-4.31 ms (443-450
 *   -> 525-528); with the last 64 rows dense (Tri-shape) at 128K x 32 heads 0.70-0.78 -> 0.58-0.59
 *   ms, but at 1M on one head 15.5 -> 17.6 ms: the pair holding those rows is one item of 8192
 *   tiles for one consumer, hence the launcher's rule for Tri-shape. A column tile of the copies
 *   whose block's list ends in its first half is computed as that half alone (S over 64 keys):
 *   small 128K 429-432 -> 440-441, local unchanged
 *   (bench/results/2026-11-30-gpu-a-shape-ws-ab.json).
 * Tried and not kept: the two consumers issuing their wgmma without taking turns (no named
 * barriers between them): local 557 -> 541 TFLOP/s at 128K and 568 -> 552 at 1M, small within
 * the run's spread (438 -> 435 at 128K, 435 -> 441 at 1M;
 * bench/results/2026-12-02-gpu-sparse-turns-ab.json). Taking turns lets one consumer's softmax
 * run under the other's GEMMs; it is not where an item's own cost comes from.
 * Tried and not kept: this kernel templated on D for heads of 64 dimensions (one 64-column half
 * per tile, P V as m64n64k16), against the ring kernel at D = 64 in one process: local +5-6 %
 * (350 -> 368 TFLOP/s at 128K and 1M), small and mixed unchanged, and in SmolLM2's prefill the
 * attention 5 % slower at 128K and equal at 1M
 * (bench/results/2026-12-01-gpu-sparse-d64-ws-tried.json). Halving D halves each tile's GEMMs
 * but not its softmax, its producer work or its barriers, which this kernel has more of.
 * The output rows staged in the item's Q buffer by stmatrix and stored with TMA, instead of 32
 * four-byte global stores a thread (a build that skipped those stores ran `small` 8-9 % faster,
 * bench/results/2026-12-02-gpu-sparse-store-cost.json): small 128K 435 -> 456, small 1M 437 ->
 * 471, local 128K 550 -> 569 and 1M 551 -> 558 TFLOP/s in one process, mixed (ring kernel)
 * unchanged (bench/results/2026-12-02-gpu-sparse-tma-store-ab.json).
 * Where an item's time goes, from clock() probes in the consumers of a timing-only build (5-8 %
 * slower; bench/results/2026-12-02-gpu-sparse-item-phases.json): per tile a consumer's own
 * chain (S until done about 810 cycles, the softmax step 1490, the loop between turns 480) is
 * about 3170 cycles on `local` and 3550 on `small` (more of its tiles masked), against 2048
 * cycles of tensor work for the tile's four GEMMs; waits for K and V are 6-7 % of an item and
 * waits for the other consumer's turn 3-3.5 %. `small`'s item start, last P V and epilogue add
 * about 10 %. Two changes at an item's edges, tried and not kept (their A/B runs in the same
 * file): the wait for the TMA store's read moved from the next item's start to after its first
 * turn (within spread), and the pending P V's V slot freed after the exponentials instead of
 * after the whole softmax step (the same or 1 % slower).
 */
#include "sm90_common.cuh"

#include <limits.h>
#include <type_traits>
#include <stdio.h>
#include <stdlib.h>

namespace mi_cuda {

struct sparse_sm90_args {
    /* Q, K and V for boxes of 128 rows (Q, a range tile whose two ranges are adjacent: one
     * load per 64 columns) and K and V for boxes of 64 rows (one per range) */
    CUtensorMap tm_q, tm_k2, tm_v2, tm_k, tm_v;
    const void *k, *v; /* gathered columns */
    int64_t k_stride[3], v_stride[3];
    void *o;
    float *lse; /* [B, H, len] or NULL */
    int64_t o_stride[3];
    const int32_t *block_count, *block_offset, *column_count, *column_index;
    int row_blocks, max_blocks, max_columns;
    int heads, group, len;
    float scale_log2;
    int pairs;         /* row-block pairs per (b, h) */
    int max_items;     /* pairs x B x H */
    const int32_t *ws_heads; /* {n, bh...}: the (b, h) this kernel runs, n x pairs work items;
                              * WS_A_SHAPE marks an A-shape head */
    a_shape_window a_win; /* that of the A-/Tri-shape heads routed here */
    /* The columns of each (b, h)'s last row block, copied (K and V rows in list order) by
     * sparse_route_kernel, for row blocks whose lists are a prefix of that one (see the tile
     * loop): tm_kc / tm_vc as (d, position, b * heads + h, 1), boxes of 128 positions;
     * col_rows[bh] positions hold copies, -1 where none were made; crows = 0: no copies. */
    CUtensorMap tm_kc, tm_vc;
    const int32_t *col_rows;
    int crows;
    int plan_tiles; /* range tiles planned ahead per item, at most (SP_PLAN; fewer to test) */
    /* O for boxes of 64 rows, and whether the output rows go through it (staged in the item's Q
     * buffer, stored by TMA) rather than by each thread's global stores */
    CUtensorMap tm_o;
    int o_tma;
};

constexpr int SP_STAGES = 2;
constexpr int SP_HALF = 128 * 128;   /* one 64-column half of a 128-row tile, bytes */
constexpr int SP_TILE = 2 * SP_HALF; /* 128 x 128 */

/* What the producer says about the tile in a slot (written before the slot's K barrier
 * completes; read by the consumers until they free the K slot). */
struct tile_header {
    int off[2];    /* range tiles: start of each 64-key half */
    int users[2];  /* per half: bit 0 = row block A, bit 1 = B; 0 = nobody (gathered: any key) */
    int column;    /* gathered tile: keys in kpos, their users in kusers */
    int last;      /* the item's last tile (or, for an item without keys, a marker: no data) */
    /* a column tile read from the copies: positions [0, nuse[i]) hold row block i's keys (A
     * i = 0, B 1), none of them after kmax[i]; -1: the keys and users are in kpos / kusers */
    int nuse[2], kmax[2];
    int pad[2];
    int kpos[128]; /* gathered tile: key of each row, MI_NO_KEY where none */
    uint8_t kusers[128]; /* and the row blocks that use it */
};

/* A list entry of ws_heads for an A-shape head: its ranges are its sinks and window, generated
 * instead of read from the index (see ashape_starts), and it has no columns */
[[maybe_unused]] constexpr int WS_A_SHAPE = 1 << 30; /* (device code only) */

/* range starts of A and B staged in shared memory for the producer's merge, then their columns */
constexpr int SP_STAGED = 1024, SP_CSTAGED = 2048;

/* An item's range tiles, planned while the item before it runs (see the producer). */
constexpr int SP_PLAN = 448; /* tiles; an item with more is planned as it goes */
enum { PLAN_NONE = 0, PLAN_READY = 1, PLAN_INLINE = 2 };
struct range_plan {
    int state;           /* PLAN_NONE: not planned yet; PLAN_INLINE: too long, merge inline */
    int tiles;           /* PLAN_READY: tiles in off / users */
    int count[4];        /* the item's range and column counts: A, B, A, B (clamped) */
    int2 off[SP_PLAN];   /* start of each 64-key half */
    uint8_t users[SP_PLAN]; /* users of half 0 | users of half 1 << 2 */
};

constexpr size_t SP_SMEM = 1024 + (2 + 2 * SP_STAGES) * SP_TILE +
                           SP_STAGES * sizeof(tile_header) + 16 * sizeof(uint64_t) +
                           (2 * SP_STAGED + 2 * SP_CSTAGED + 8) * sizeof(int32_t) +
                           2 * sizeof(range_plan);
static_assert(SP_SMEM <= 227 * 1024, "more shared memory than an H100/H200 CTA may have");

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
#endif

template <typename T>
__global__ void __launch_bounds__(384, 1)
    attn_sparse_sm90_kernel(const __grid_constant__ sparse_sm90_args a) {
#ifdef MI_SM90_DEVICE
    constexpr int D = 128;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *base = smem_base_1024(smem_raw);
    /* Q of two work items (the next one's loads while the consumers finish this one) */
    unsigned char *qs = base, *ks = qs + 2 * SP_TILE, *vs = ks + SP_STAGES * SP_TILE;
    tile_header *hdr = reinterpret_cast<tile_header *>(vs + SP_STAGES * SP_TILE);
    uint64_t *bars = reinterpret_cast<uint64_t *>(hdr + SP_STAGES);
    uint64_t *q_full = bars, *q_empty = bars + 2, *k_full = bars + 4, *v_full = k_full + SP_STAGES,
             *k_empty = v_full + SP_STAGES, *v_empty = k_empty + SP_STAGES;
    int32_t *staged /* [2][SP_STAGED] */ = reinterpret_cast<int32_t *>(bars + 16);
    /* by item parity, after the column lists (8-byte aligned: an even count of words before) */
    range_plan *plans = reinterpret_cast<range_plan *>(staged + 2 * SP_STAGED + 2 * SP_CSTAGED + 8);

    const int tid = threadIdx.x;
    const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int items = a.pairs * __ldg(a.ws_heads);
    if ((int)blockIdx.x >= items) return; /* fewer heads were routed here than CTAs launched */
    /* work item w: the pair of row blocks 2 pair, 2 pair + 1 of the list's (b, h), the last
     * pairs (the most keys, causally) first; each CTA takes items blockIdx.x, + gridDim.x, ... */
    struct item {
        int pair, bh, b, h, hk, rs;
        int64_t row_a;
        bool has_b, ashape;
    };
    auto item_of = [&](int w) {
        item it;
        it.pair = a.pairs - 1 - w % a.pairs;
        const int entry = __ldg(a.ws_heads + 1 + w / a.pairs);
        it.ashape = (entry & WS_A_SHAPE) != 0;
        it.bh = entry & ~WS_A_SHAPE;
        it.b = it.bh / a.heads;
        it.h = it.bh % a.heads;
        it.hk = it.h / a.group;
        it.rs = it.pair * 128;
        it.row_a = (int64_t)it.bh * a.row_blocks + 2 * it.pair;
        it.has_b = 2 * it.pair + 1 < a.row_blocks;
        return it;
    };

    if (tid == 0) {
        for (int i = 0; i < 2; ++i) {
            mbar_init(q_full + i, 1);
            /* one arrival per consumer warp, or per consumer once its rows staged in the
             * buffer are stored */
            mbar_init(q_empty + i, a.o_tma ? 2 : 8);
        }
        init_stage_barriers(k_full, v_full, k_empty, v_empty, SP_STAGES);
        plans[0].state = plans[1].state = PLAN_NONE;
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wgi == 0) {
        /* the producer warpgroup: lane 0 of warp 0 issues the TMA loads of the range tiles,
         * which warps 1-3 planned while the item before ran; all four warps write the column
         * tiles' headers and gather their rows (since one warp issuing 4096 copies per tile
         * could not keep up with the consumers). Only warp 0 waits on the slots' barriers (see
         * the column loop), the others meet it at named barriers. */
        /* 96 registers for the producer (its merge, per-item column users and gather code
         * spilled 144 bytes at 72, 12 at 96) and 200 for the consumers, whose code uses
         * registers up to R189 (R184 at this split) */
        setmaxnreg_dec<96>();
        const int pw = tid / 32, lane = tid % 32;
        /* Warps 1-3 plan an item's range tiles into plans[its parity]: its counts, its range
         * starts staged, and lane 0 of warp 1 merging them into tiles. Warp 0 issues the
         * loads at about nine cycles an instruction (it shares its SM sub-partition with two
         * consumer warps); merging as it went put a third of its instructions per tile, and
         * an item's index reads, on the path of every load. An item with more than SP_PLAN
         * tiles or SP_STAGED starts a side is merged inline by warp 0 (PLAN_INLINE). */
        /* A's and B's range starts (up to SP_STAGED each) into staged, threads i0, i0 + step.. */
        auto stage_starts = [&](int i0, int step, const int32_t *offs, int na, int nb) {
            for (int i = i0; i < min(na, SP_STAGED); i += step) staged[i] = __ldg(offs + i);
            for (int i = i0; i < min(nb, SP_STAGED); i += step)
                staged[SP_STAGED + i] = __ldg(offs + a.max_blocks + i);
        };
        /* an item's count from the index, clamped to what the index holds (0 for a missing B) */
        auto count_at = [&](const int32_t *counts, const item &n, int r, int most) {
            if (n.ashape) return 0; /* no columns (and no index) */
            return r == 0 || n.has_b ? min(max(__ldg(counts + n.row_a + r), 0), most) : 0;
        };
        /* an item's range starts: A's and B's lists of the index, na and nb starts (staged or
         * not), or generated for an A-shape head */
        auto range_lists = [&](const item &n, int na, int nb, staged_list &la, staged_list &lb) {
            if (n.ashape) {
                la = ashape_starts(a.a_win, n.rs, a.len);
                lb = ashape_starts(a.a_win, n.rs + 64, a.len);
                return;
            }
            const int32_t *offs = a.block_offset + n.row_a * a.max_blocks;
            la = {staged, offs, na};
            lb = {staged + SP_STAGED, offs + a.max_blocks, nb};
        };
        auto plan_item = [&](int w, range_plan &pl) {
            const item n = item_of(w);
            staged_list la, lb;
            range_lists(n, count_at(a.block_count, n, 0, a.max_blocks),
                        count_at(a.block_count, n, 1, a.max_blocks), la, lb);
            const int na = la.n, nb = lb.n;
            const bool fit = n.ashape || (na <= SP_STAGED && nb <= SP_STAGED);
            if (fit && !n.ashape) stage_starts(tid - 32, 96, la.g, na, nb);
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
        };
        int t = 0; /* tiles so far, over all items: the slot ring runs on */
        for (int w = blockIdx.x, k = 0; w < items; w += gridDim.x, ++k) {
        const item it = item_of(w);
        const int b = it.b, h = it.h, hk = it.hk;
        const int64_t row_a = it.row_a;
        named_barrier_sync(3, 128); /* every warp is done with the last item; its plan is written */
        range_plan &pl = plans[k & 1];
        if (pl.state == PLAN_NONE) { /* the first item, or one after an inline one */
            /* every thread has read the state before the planner may write it: a warp that read
             * it late would otherwise skip the barrier below that the others wait at */
            named_barrier_sync(3, 128);
            if (pw > 0) plan_item(w, pl);
            named_barrier_sync(3, 128);
        }
        const bool planned = pl.state == PLAN_READY;
        const int na = pl.count[0], nb = pl.count[1], ca = pl.count[2], cb = pl.count[3];
        if (tid == 0) { /* Q, into the buffer item k - 2 used */
            const int qb = k & 1;
            if (k >= 2)
                while (!mbar_try_wait(q_empty + qb, ((k >> 1) - 1) & 1)) {
                }
            tma_load_tile<128>(smem_addr(qs) + qb * SP_TILE, &a.tm_q, it.rs, h, b, q_full + qb);
        }
        /* the next item's counts and the heads of its lists into L2 while this one runs (its
         * planners read them, then its column lists), by warps 1-3: not on warp 0's path */
        if (pw > 0 && w + (int)gridDim.x < items) {
            const item next = item_of(w + gridDim.x);
            const int64_t nrow = next.row_a;
            const int line = tid % 32, part = tid / 32; /* 128-byte lines of 32 entries */
            const bool index = !next.ashape; /* an A-shape item reads none */
            if (index && part == 1 && line < 2)
                prefetch_l2((line ? a.column_count : a.block_count) + nrow);
            const int ol = line - 2; /* block_offset lines */
            if (index && part == 1 && ol >= 0 && ol < 8 && (ol % 4) * 32 < a.max_blocks)
                prefetch_l2(a.block_offset + (nrow + ol / 4) * a.max_blocks + (ol % 4) * 32);
            if (index && part >= 2 && line * 32 < a.max_columns)
                prefetch_l2(a.column_index + (nrow + part - 2) * a.max_columns + line * 32);
        }
        const int32_t *offs = a.block_offset + row_a * a.max_blocks;
        const int32_t *cols_a = a.column_index + row_a * a.max_columns;
        const int32_t *cols_b = cols_a + a.max_columns;
        if (!planned) { /* merged inline: its starts staged now */
            if (!it.ashape) stage_starts(tid, 128, offs, na, nb);
            named_barrier_sync(3, 128);
        }
        /* gathered tiles. A's and B's column lists are mostly the same keys (the verticals of
         * the head, less those inside each block's ranges). When both are strictly ascending
         * (as the index builders write them) and fit in shared memory, A's tiles carry every
         * column, each also used by B where B lists it, and then come B's tiles of the columns
         * A does not list: a column both use is loaded once and both consumers compute its
         * tiles. Otherwise A's and B's tiles alternate, each used by its own row block only
         * (while one consumer computes a tile of A, the other computes the next one, of B). */
        const int tiles_a = (ca + 127) / 128;
        int tiles_b = (cb + 127) / 128, cnt_b = cb; /* B's: all of them, or those A lacks */
        int32_t *scol_a = staged + 2 * SP_STAGED, *scol_b = scol_a + SP_CSTAGED;
        int32_t *warp_sum = scol_b + SP_CSTAGED; /* [3], for warps 1-3 */
        int32_t *t_shared = warp_sum + 4;        /* warp 0's tile count after the ranges */
        int32_t *col_info = warp_sum + 5; /* [3]: share | prefix << 1, cnt_b, tiles_b */
        int col_a = 0, col_b = 0; /* column tiles done */
        bool share = false;       /* both lists staged and ascending: set by stage_columns */
        bool prefix = false;      /* columns read from the copies of the last block's */
        const bool has_columns = ca > 0 || cb > 0;
        /* stages both column lists and sees whether they can be shared: warps 1-3 (96 threads,
         * named barrier 4), once per item while warp 0 loads the range tiles, which used to
         * stop for it */
        const int st = tid - 32; /* their thread index */
        auto stage_columns = [&]() {
            const bool fit = ca > 0 && cb > 0 && ca <= SP_CSTAGED && cb <= SP_CSTAGED;
            bool ok = fit;
            if (fit) {
                /* loads only, independent of each other so that they are all in flight
                 * at once; the order is checked in shared memory afterwards */
#pragma unroll 4
                for (int i = st; i < ca; i += 96) scol_a[i] = __ldg(cols_a + i);
#pragma unroll 4
                for (int i = st; i < cb; i += 96) scol_b[i] = __ldg(cols_b + i);
                named_barrier_sync(4, 96);
                for (int i = st + 1; i < ca; i += 96) ok &= scol_a[i] > scol_a[i - 1];
                for (int i = st + 1; i < cb; i += 96) ok &= scol_b[i] > scol_b[i - 1];
                ok &= scol_a[0] >= 0 && scol_b[0] >= 0; /* bit 31 marks users below */
            }
            /* every thread's verdict (and its staged entries) before anyone reads them */
            share = !named_barrier_or(4, 96, !ok);
            /* Vertical-slash lists are the head's verticals left of the block's band: a
             * prefix of the last row block's list. Where both lists are, their columns
             * are the first positions of its copies, read with TMA as whole tiles
             * (position j used by A if j < ca, by B if j < cb) instead of gathered. */
            if (share && a.crows > 0) {
                const int n = __ldg(a.col_rows + it.bh);
                bool same = n >= max(ca, cb);
                if (same) {
                    const int32_t *last = a.column_index +
                                          ((int64_t)it.bh * a.row_blocks + a.row_blocks - 1) *
                                              a.max_columns;
                    for (int i = st; i < max(ca, cb); i += 96) {
                        const int u = __ldg(last + i);
                        same &= (i >= ca || scol_a[i] == u) && (i >= cb || scol_b[i] == u);
                    }
                }
                prefix = !named_barrier_or(4, 96, !same);
            }
            if (share && !prefix) {
                /* who uses each column, found once per item rather than per tile: bit 31
                 * of a B entry marks a key A lists too, of an A entry a key B lists; B's
                 * list then keeps the keys A lacks only, so that the tile count is known
                 * (the last tile carries the end of the item) and no tile is empty */
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
                cnt_b = kept;
                tiles_b = (kept + 127) / 128;
            }
            if (tid == 32) { /* for warp 0, after the barrier that ends the ranges */
                col_info[0] = (share ? 1 : 0) | (prefix ? 2 : 0);
                col_info[1] = cnt_b;
                col_info[2] = tiles_b;
            }
        };
        /* The range tiles: warp 0 alone loads them (with every producer warp walking the
         * plan, the merge doubled the kernel's instructions per tile against the dense
         * kernel's), while the others stage the column lists and plan the next item. All four
         * write the column tiles. */
        const int t0 = t;
        if (pw == 0) {
            staged_list la, lb;
            range_lists(it, na, nb, la, lb);
            range_packer rp(la, lb);
            const int planned_tiles = planned ? pl.tiles : 0;
            for (int i = 0;; ++t, ++i) {
                const int slot = t % SP_STAGES, par = ((t / SP_STAGES) - 1) & 1;
                const uint32_t kd = smem_addr(ks) + slot * SP_TILE, vd = smem_addr(vs) + slot * SP_TILE;
                tile_header &hd = hdr[slot];
                const int ranges_left =
                    planned ? i < planned_tiles
                            : __shfl_sync(0xffffffffu, lane == 0 ? (int)rp.more() : 0, 0);
                if (!ranges_left) break;
                /* the next range tile is known before the wait for its slot, so that the loads
                 * go out as soon as the slot is free */
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
                /* adjacent ranges (most tiles of a band) as one run of 128 rows: half the
                 * loads to issue */
                const bool run = ro[1] == ro[0] + 64;
                /* K or V of the tile (lane 0): the run, or each range */
                auto load = [&](uint32_t dst, const CUtensorMap *run_map, const CUtensorMap *map,
                                uint64_t *bar) {
                    if (run) {
                        tma_load_tile<128>(dst, run_map, ro[0], hk, b, bar);
                        return;
                    }
                    mbar_expect_tx(bar, SP_TILE);
                    for (int i = 0; i < 4; ++i)
                        tma_load_4d(dst + (i & 1) * SP_HALF + (i >> 1) * 64 * 128, map,
                                    (i & 1) * 64, ro[i >> 1], hk, b, bar);
                };
                if (t >= SP_STAGES) mbar_wait(k_empty + slot, par);
                if (lane == 0) {
                    hd.off[0] = ro[0];
                    hd.off[1] = ro[1];
                    hd.users[0] = ru[0];
                    hd.users[1] = ru[1];
                    hd.column = 0;
                    hd.last = rlast;
                    load(kd, &a.tm_k2, &a.tm_k, k_full + slot);
                }
                if (t >= SP_STAGES) mbar_wait(v_empty + slot, par);
                if (lane == 0) load(vd, &a.tm_v2, &a.tm_v, v_full + slot);
                if (__shfl_sync(0xffffffffu, rlast, 0)) {
                    ++t;
                    break;
                }
            }
            if (lane == 0) *t_shared = t;
        } else {
            stage_columns();
            /* then the next item's plan, into the staging warp 0 does not read (only an item
             * merged inline does; the next one is planned at its start then) */
            if (w + (int)gridDim.x < items) {
                if (planned)
                    plan_item(w + gridDim.x, plans[(k + 1) & 1]);
                else if (tid == 32)
                    plans[(k + 1) & 1].state = PLAN_NONE;
            }
        }
        named_barrier_sync(3, 128); /* warp 0 is done with the ranges; t_shared is written */
        t = *t_shared;
        share = col_info[0] & 1;
        prefix = col_info[0] & 2;
        cnt_b = col_info[1];
        tiles_b = col_info[2];
        if (!has_columns) {
            if (t == t0) { /* an item with no keys at all: an end marker, no data */
                const int slot = t % SP_STAGES, par = ((t / SP_STAGES) - 1) & 1;
                if (pw == 0 && t >= SP_STAGES) mbar_wait(k_empty + slot, par);
                if (tid == 0) {
                    hdr[slot].users[0] = hdr[slot].users[1] = 0;
                    hdr[slot].column = 0;
                    hdr[slot].last = 1;
                    mbar_arrive(k_full + slot);
                }
                if (pw == 0 && t >= SP_STAGES) mbar_wait(v_empty + slot, par);
                if (tid == 0) mbar_arrive(v_full + slot);
                ++t;
            }
            continue;
        }
        for (;; ++t) { /* the column tiles */
            const int slot = t % SP_STAGES, par = ((t / SP_STAGES) - 1) & 1;
            const uint32_t kd = smem_addr(ks) + slot * SP_TILE, vd = smem_addr(vs) + slot * SP_TILE;
            tile_header &hd = hdr[slot];
            /* Only warp 0 waits for a slot to be free. Another producer warp that lags may find
             * the barrier one phase further on than the one it expects (the consumers free the
             * slot again once warp 0 has refilled it), then wait on a phase that completes only
             * after warp 0 has gone on, and warp 0 in turn stops at the next named barrier of
             * the four warps: a deadlock that shows up rarely, under timing. The other warps
             * learn that the slot is free from a named barrier after warp 0's wait, and only on
             * gathered tiles, the only ones they write. */
            if (pw == 0 && t >= SP_STAGES) mbar_wait(k_empty + slot, par);
            if (prefix) { /* the next 128 positions of the copies, with TMA */
                const int n_pos = max(ca, cb), p0 = 128 * col_a++, pos = p0 + tid;
                const int last = 128 * col_a >= n_pos;
                named_barrier_sync(3, 128); /* the K slot is free (warp 0 waited for it) */
                hd.kpos[tid] = pos < n_pos ? (pos < ca ? scol_a : scol_b)[pos] : MI_NO_KEY;
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
                        hd.kmax[r] = n > 0 ? (r ? scol_b : scol_a)[p0 + n - 1] : -1;
                    }
                }
                named_barrier_sync(3, 128); /* the header is written before the K barrier's arrive */
                if (tid == 0) tma_load_tile<128>(kd, &a.tm_kc, p0, it.bh, 0, k_full + slot);
                if (pw == 0 && t >= SP_STAGES) mbar_wait(v_empty + slot, par);
                if (tid == 0) tma_load_tile<128>(vd, &a.tm_vc, p0, it.bh, 0, v_full + slot);
                if (last) {
                    ++t;
                    break;
                }
                continue;
            }
            /* the next gathered tile, one row per thread: its key and who uses it */
            const bool for_a = col_a < tiles_a && (share || col_b >= tiles_b || col_a <= col_b);
            const int c = (for_a ? col_a++ : col_b++) * 128 + tid, cnt = for_a ? ca : cnt_b;
            int key = MI_NO_KEY, users = 0;
            if (c < cnt) {
                const int raw = share ? (for_a ? scol_a : scol_b)[c]
                                      : __ldg((for_a ? cols_a : cols_b) + c);
                key = share ? raw & INT_MAX : raw;
                users = for_a ? (share && raw < 0 ? 3 : 1) : 2;
            }
            if (key < 0 || key >= a.len) key = MI_NO_KEY, users = 0;
            const int last = col_a >= tiles_a && col_b >= tiles_b;
            int tile_users = 2; /* B's tiles: B's only */
            if (for_a) {
                tile_users = named_barrier_or(3, 128, users & 1) ? 1 : 0;
                if (share && named_barrier_or(3, 128, users & 2)) tile_users |= 2;
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
                                      reinterpret_cast<const T *>(g) + b * st[0] + hk * st[1],
                                      st[2], key);
                cp_async_mbar_arrive(bar);
                named_barrier_sync(3, 128); /* also orders the header before the arrive */
                if (tid == 0) mbar_arrive(bar);
            };
            gather(a.k, a.k_stride, kd, k_full + slot);
            if (pw == 0 && t >= SP_STAGES) mbar_wait(v_empty + slot, par);
            named_barrier_sync(3, 128); /* the V slot is free */
            gather(a.v, a.v_stride, vd, v_full + slot);
            if (last) {
                ++t;
                break;
            }
        }
        } /* work items */
        return;
    }

    setmaxnreg_inc<200>();
    const int cw = wgi - 1; /* consumer 0 (row block A) or 1 (B) */
    const int me = 1 << cw;
    const int ct = tid - 128 * wgi;
    const int warp = ct / 32, lane = ct % 32, g = lane / 4, cq = lane % 4;
    const int my_bar = 1 + cw, other_bar = 2 - cw;
    if (cw == 1) named_barrier_arrive(1, 256); /* consumer 0 goes first */
    float o[64], s[64], sh[32];
    uint32_t pa[8][4];
    const float sc = a.scale_log2;
    int t = 0; /* tiles so far, over all items */
    for (int w = blockIdx.x, k = 0; w < items; w += gridDim.x, ++k) {
    const item it = item_of(w);
    /* whether this consumer hands the tensor cores on after the item's last tile (consumer
     * 1's very last turn is not awaited); one register, set once per item (a bool of the item
     * index let ptxas recompute it from a spilled value at every tile) */
    const int hands_on_last = __shfl_sync(0xffffffffu, cw == 0 || w + (int)gridDim.x < items, 0);
    const int first_row = it.rs + cw * 64;
    /* the keys a row sees reach back `window` keys (or to a sink): A-shape heads only */
    const int window = it.ashape ? a.a_win.n_local : INT_MAX;
    const a_shape_window item_win = {a.a_win.n_init, window, a.a_win.tri_start};
    const int qrow0 = first_row + warp * 16 + g, qrow1 = qrow0 + 8;
    const int qb = k & 1;
    const sw128_desc qd(smem_addr(qs) + qb * SP_TILE + cw * 64 * 128, 16, 1024);
    /* the last item's rows were staged in its Q buffer: once their store has read them, the
     * buffer is free for the item after this one (its Q is loaded while this one runs) */
    if (a.o_tma && k > 0 && ct == 0) {
        bulk_wait_read<0>();
        mbar_arrive(q_empty + (qb ^ 1));
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    row_softmax sm;

    /* A tile is computed whole (S over 128 keys, 8 k-steps of P V) or, for a split or padded
     * tile, only its half `hf` (S over 64 keys, 4 k-steps) */
    auto issue_s = [&](float *s, int slot, bool whole, int hf) {
        const sw128_desc kd(smem_addr(ks) + slot * SP_TILE + hf * 64 * 128, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint64_t qa = qd.at((kk >> 2) * SP_HALF + (kk & 3) * 32);
            const uint64_t kb = kd.at((kk >> 2) * SP_HALF + (kk & 3) * 32);
            if (whole)
                wg<T>::ss128(s, qa, kb, kk > 0);
            else
                wg<T>::ss(s, qa, kb, kk > 0);
        }
    };
    auto issue_pv = [&](int slot, bool whole, int hf) {
        const sw128_desc vd(smem_addr(vs) + slot * SP_TILE + hf * 64 * 128, SP_HALF, 1024);
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
            if (whole || kk < 4) wg<T>::rs(o, pa[kk], vd.at(kk * 16 * 128), 1);
    };

    /* keys this consumer does not see: after its rows, outside the sequence, in a half of a
     * shared tile that only the other row block uses, or missing from a gathered tile */
    auto mask = [&](float *s, const tile_header &hd, bool whole, int hf, int column) {
        if (column) {
            /* a tile of the copies whose keys all come before this block's rows: only the
             * positions past this block's list go (most tiles: none), no per-key lookups */
            const int n = __shfl_sync(0xffffffffu, hd.nuse[cw], 0);
            if (n >= 0 && __shfl_sync(0xffffffffu, hd.kmax[cw], 0) <= first_row) {
                if (n < (whole ? 128 : 64)) {
#pragma unroll
                    for (int j = 0; j < 16; ++j) {
                        if (j >= 8 && !whole) break; /* a half tile: positions 0-63 */
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            s[4 * j + e] = 8 * j + 2 * cq + (e & 1) >= n ? -INFINITY : s[4 * j + e];
                    }
                }
                return;
            }
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                if (j >= 8 && !whole) break;
                int2 kk = *reinterpret_cast<const int2 *>(hd.kpos + 8 * j + 2 * cq);
                const uint32_t uu = *reinterpret_cast<const uint16_t *>(hd.kusers + 8 * j + 2 * cq);
                if (!(uu & me)) kk.x = MI_NO_KEY; /* a key of the other row block only */
                if (!((uu >> 8) & me)) kk.y = MI_NO_KEY;
                s[4 * j] = kk.x > qrow0 ? -INFINITY : s[4 * j];
                s[4 * j + 1] = kk.y > qrow0 ? -INFINITY : s[4 * j + 1];
                s[4 * j + 2] = kk.x > qrow1 ? -INFINITY : s[4 * j + 2];
                s[4 * j + 3] = kk.y > qrow1 ? -INFINITY : s[4 * j + 3];
            }
            return;
        }
        /* range halves: whole tiles hold two of this block's ranges at s[0..31], s[32..63];
         * a half tile one at s[0..31] */
#pragma unroll
        for (int part = 0; part < 2; ++part) {
            if (part == 1 && !whole) break;
            const int off = __shfl_sync(0xffffffffu, hd.off[whole ? part : hf], 0);
            if (off < 0 || off + 63 > first_row) {
#pragma unroll
                for (int j = 8 * part; j < 8 * part + 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = off + 8 * (j - 8 * part) + 2 * cq + (e & 1);
                        const bool kill = key < 0 || key > (e < 2 ? qrow0 : qrow1);
                        s[4 * j + e] = kill ? -INFINITY : s[4 * j + e];
                    }
            }
            /* A-shape: a piece not all sinks nor all inside the window of this block's last
             * row (the window's first piece or two; with Tri-shape's last rows, every piece of
             * their block) loses the keys too far left of the rows before those */
            if (off + 63 >= a.a_win.n_init && first_row + 63 - off >= window) {
#pragma unroll
                for (int j = 8 * part; j < 8 * part + 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = off + 8 * (j - 8 * part) + 2 * cq + (e & 1);
                        const bool kill = !window_keeps(item_win, key, e < 2 ? qrow0 : qrow1);
                        s[4 * j + e] = kill ? -INFINITY : s[4 * j + e];
                    }
            }
        }
    };

    /* One turn: S of tile `slot` (SK: 0 none, 1 half, 2 whole) issued with the pending P V
     * (PK: 0 none, 1 half, 2 whole), then the softmax of S while P V runs. Each combination is
     * its own code, with its issues and waits: paths that join between an issue and its wait
     * make ptxas serialise every wgmma of the kernel (C7514). */
    auto turn = [&](auto sk_c, auto pk_c, int slot, int hf, int column, const tile_header &hd,
                    int pslot, int phf, bool hand_on) {
        constexpr int SK = decltype(sk_c)::value, PK = decltype(pk_c)::value;
        /* a half tile's scores in registers of their own: sharing the whole tile's array
         * left ptxas short of registers for the wgmma pipeline (C7511) */
        float *sx = SK == 2 ? s : sh;
        named_barrier_sync(my_bar, 256);
        wgmma_fence();
        if constexpr (SK > 0) {
            issue_s(sx, slot, SK == 2, hf);
            wgmma_commit();
        }
        if constexpr (PK > 0) {
            issue_pv(pslot, PK == 2, phf);
            wgmma_commit();
        }
        if (hand_on) named_barrier_arrive(other_bar, 256);
        if constexpr (SK > 0) {
            if constexpr (PK > 0)
                wgmma_wait<1>(); /* S done; P V may still run */
            else
                wgmma_wait<0>();
            fence_operands<SK == 2 ? 64 : 32>(sx);
            mask(sx, hd, SK == 2, hf, column);
            warp_arrive(k_empty + slot); /* after the mask: it reads this slot's header */
            float2 al;
            if constexpr (SK == 2)
                al = sm.update<16>(s, sc);
            else
                al = sm.update<8>(sh, sc);
            if constexpr (PK > 0) {
                wgmma_wait<0>();
                fence_operands<64>(o);
                warp_arrive(v_empty + pslot);
            }
            /* O holds earlier tiles even without a pending P V when one was flushed */
            if (!__all_sync(0xffffffffu, al.x == 1.f && al.y == 1.f)) rescale_o(o, al);
            if constexpr (SK == 2)
                pack_p<T, 8>(pa, s);
            else
                pack_p<T, 4>(pa, sh);
        } else {
            wgmma_wait<0>();
            fence_operands<64>(o);
            warp_arrive(v_empty + pslot);
        }
    };
    using C0 = std::integral_constant<int, 0>;
    using C1 = std::integral_constant<int, 1>;
    using C2 = std::integral_constant<int, 2>;

    mbar_wait(q_full + qb, (k >> 1) & 1);
    int pending = -1;    /* the tile whose P V is still to be issued (P in pa) */
    int pending_pk = 0;  /* its kind: 1 half, 2 whole */
    int pending_hf = 0;  /* its half */
    bool pending_column = false; /* a gathered tile */
    for (;; ++t) {
        const int slot = t % SP_STAGES, par = (t / SP_STAGES) & 1;
        mbar_wait(k_full + slot, par);
        const tile_header &hd = hdr[slot];
        /* header values steer wgmma: broadcast, so that ptxas sees them warp-uniform */
        const int users0 = __shfl_sync(0xffffffffu, hd.users[0], 0);
        const int users1 = __shfl_sync(0xffffffffu, hd.users[1], 0);
        const int last = __shfl_sync(0xffffffffu, hd.last, 0);
        const int column = __shfl_sync(0xffffffffu, hd.column, 0);
        const bool m0 = (users0 & me) != 0, m1 = (users1 & me) != 0;
        const int sk = m0 && m1 ? 2 : m0 || m1 ? 1 : 0, hf = m0 ? 0 : 1;
        /* a gathered tile was written by cp.async (generic proxy), wgmma reads it through the
         * async proxy */
        if (column) fence_proxy_async();
        const bool hand_on = !last || hands_on_last;
        const int pslot = pending % SP_STAGES;
        /* loop-carried values that steer wgmma, broadcast again (ptxas does not follow their
         * uniformity through the loop) */
        const int pk = __shfl_sync(0xffffffffu, pending >= 0 ? pending_pk : 0, 0);
        const int phf = __shfl_sync(0xffffffffu, pending_hf, 0);
        if (pk) {
            mbar_wait(v_full + pslot, (pending / SP_STAGES) & 1);
            if (pending_column) fence_proxy_async();
        }
        if (sk > 0) {
            if (sk == 2) {
                if (pk == 2)
                    turn(C2(), C2(), slot, hf, column, hd, pslot, phf, hand_on);
                else if (pk == 1)
                    turn(C2(), C1(), slot, hf, column, hd, pslot, phf, hand_on);
                else
                    turn(C2(), C0(), slot, hf, column, hd, pslot, phf, hand_on);
            } else {
                if (pk == 2)
                    turn(C1(), C2(), slot, hf, column, hd, pslot, phf, hand_on);
                else if (pk == 1)
                    turn(C1(), C1(), slot, hf, column, hd, pslot, phf, hand_on);
                else
                    turn(C1(), C0(), slot, hf, column, hd, pslot, phf, hand_on);
            }
            pending = t;
            pending_pk = sk;
            pending_hf = hf;
            pending_column = column;
        } else {
            /* not ours. When the pending P V reads the V slot this tile came in, issue it (the
             * slot could not be freed otherwise); a P V of the tile just before stays pending,
             * its slot is not this one's. Then free this tile's slots. */
            if (pk && t - pending >= SP_STAGES) {
                if (pk == 2)
                    turn(C0(), C2(), slot, hf, column, hd, pslot, phf, hand_on);
                else
                    turn(C0(), C1(), slot, hf, column, hd, pslot, phf, hand_on);
                pending = -1;
            } else {
                named_barrier_sync(my_bar, 256);
                if (hand_on) named_barrier_arrive(other_bar, 256);
            }
            warp_arrive(k_empty + slot);
            mbar_wait(v_full + slot, par);
            warp_arrive(v_empty + slot);
        }
        if (last) {
            ++t;
            break;
        }
    }
    if (pending >= 0) { /* the last P V */
        const int pslot = pending % SP_STAGES;
        mbar_wait(v_full + pslot, (pending / SP_STAGES) & 1);
        if (pending_column) fence_proxy_async();
        /* the fence next to its wgmma: ptxas did not count one before the branch */
        const int phf = __shfl_sync(0xffffffffu, pending_hf, 0);
        if (__shfl_sync(0xffffffffu, pending_pk, 0) == 2) {
            wgmma_fence();
            issue_pv(pslot, true, 0);
            wgmma_commit();
            wgmma_wait<0>();
        } else {
            wgmma_fence();
            issue_pv(pslot, false, phf);
            wgmma_commit();
            wgmma_wait<0>();
        }
        fence_operands<64>(o);
        warp_arrive(v_empty + pslot); /* the next item's tiles need the slot */
    }
    float *lseg = a.lse ? a.lse + ((int64_t)it.b * a.heads + it.h) * a.len : nullptr;
    if (a.o_tma) {
        /* every S of this item is done, so its Q rows can take its output rows; one thread
         * stores them with TMA while the consumer goes on to its next item */
        const uint32_t qbuf = smem_addr(qs) + qb * SP_TILE;
        stage_rows<T>(qbuf, SP_HALF, 64 * cw, lseg, sm, o, qrow0, qrow1, a.len, cq);
        fence_proxy_async(); /* the rows, written by stmatrix, are read by the async proxy */
        named_barrier_sync(5 + cw, 128);
        if (ct == 0) {
            tma_store_4d(&a.tm_o, qbuf + cw * 64 * 128, 0, first_row, it.h, it.b);
            tma_store_4d(&a.tm_o, qbuf + SP_HALF + cw * 64 * 128, 64, first_row, it.h, it.b);
            bulk_commit();
        }
    } else {
        warp_arrive(q_empty + qb); /* every S of this item is done */
        T *og = reinterpret_cast<T *>(a.o) + it.b * a.o_stride[0] + it.h * a.o_stride[1];
        store_rows<T>(og, a.o_stride[2], lseg, sm, o, qrow0, qrow1, a.len, a.len, cq);
    }
    } /* work items */
    if (a.o_tma && ct == 0) bulk_wait<0>(); /* the last rows are written before the CTA ends */
#endif
}

template <typename T>
static cudaError_t launch_sparse(const sparse_sm90_args &a, cudaStream_t st) {
    auto kern = attn_sparse_sm90_kernel<T>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)SP_SMEM);
    if (e != cudaSuccess) return e;
    /* persistent: one CTA per SM walks the work items, so that an item's start (reading the
     * index, the first loads) overlaps the previous item's end */
    kern<<<dim3(min(a.max_items, mi_cuda_sm_count())), 384, SP_SMEM, st>>>(a);
    return cudaGetLastError();
}

/* Which (b, h) the warp-specialised kernel takes. It pays where the two row blocks of a pair
 * share most of their ranges, that is where ranges come in runs of adjacent 64-key pieces (a
 * band of diagonals: a run of n pieces in row block A is the same run one piece on in B, n - 1
 * shared): in `local` and `small` every start but a block's last is followed by the next piece;
 * scattered diagonals make runs of one or two pieces (`mixed`, from its definition: about 0.55
 * at 128K, 0.15 at 1M), where the ring kernel is faster. So a sparse head goes to this kernel
 * when at least 90 % of the starts of sampled row blocks (the later half, which holds most of
 * the work) are followed by the next piece; the others go to the ring kernel. So do the heads of
 * other modes, but for the A-shape heads with the sinks, window and last rows this launch runs
 * here (a_win: the first A-/Tri-shape head's): those come here (list entries marked WS_A_SHAPE).
 * One CTA per (b, h) writes its flag (taken[bh], for the ring kernel to skip) and appends it to
 * this kernel's list {n, bh...} (n zeroed before). For a sparse head it takes, it then copies
 * the K and V rows of the last row block's columns (the first c.rows of them, where they are
 * ascending keys of the sequence) to c.k / c.v in list order, zeros after them for a tile, and
 * writes how many to c.count[bh] (-1: none). */
struct column_copies {
    void *k, *v;    /* [B * H][rows][128] elements of 2 bytes */
    int32_t *count; /* [B * H] */
    int rows;       /* 0: no copies */
};
/* (ROUTE_SCAN and ROUTE_MIN_CANDIDATES serve device code only, which some passes leave out) */
constexpr int ROUTE_SAMPLES = 16; /* row blocks sampled per (b, h) */
[[maybe_unused]] constexpr int ROUTE_SCAN = 1024; /* starts read per sampled row block, at most */
/* fewer starts with a successor: the ring kernel */
[[maybe_unused]] constexpr int ROUTE_MIN_CANDIDATES = 16;

/* Whether head mode m is A-shape (or Tri-shape) with window w. */
__host__ __device__ __forceinline__ bool a_shape_with(const mi_cuda_head_mode &m, int len,
                                                      const a_shape_window &w) {
    return m.mode == MI_CUDA_MODE_A_SHAPE && a_shape_window_of(m, len) == w;
}

/* sparse_on = 0: no sparse head comes here (no usable index); a_on = 0: no A-shape head, else
 * those with window a_win */
__global__ void __launch_bounds__(32 * ROUTE_SAMPLES)
    sparse_route_kernel(const __grid_constant__ mi_cuda_attn_params p, int32_t *taken,
                        int32_t *list, int sparse_on, int every, column_copies c, int a_on,
                        a_shape_window a_win) {
#ifdef MI_SM90_DEVICE
    const int bh = blockIdx.x, h = bh % p.heads;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bool sparse = sparse_on && head_mode_of(p, h).mode == MI_CUDA_MODE_SPARSE;
    const bool ashape = a_on && a_shape_with(head_mode_of(p, h), p.len, a_win);
    int adj = 0, cand = 0;
    if (sparse && !every) {
        /* one warp per sampled row block */
        const int R = p.row_blocks, lo = R / 2;
        const int64_t row = (int64_t)bh * R + lo + (int64_t)(R - lo) * warp / ROUTE_SAMPLES;
        const int n = min(min(max(__ldg(p.block_count + row), 0), p.max_blocks), ROUTE_SCAN);
        const int32_t *offs = p.block_offset + row * p.max_blocks;
        for (int j = lane; j + 1 < n; j += 32) {
            adj += __ldg(offs + j + 1) == __ldg(offs + j) + 64;
            ++cand;
        }
    }
    adj = __reduce_add_sync(0xffffffffu, adj);
    cand = __reduce_add_sync(0xffffffffu, cand);
    __shared__ int s_adj[ROUTE_SAMPLES], s_cand[ROUTE_SAMPLES], s_ws;
    if (lane == 0) s_adj[warp] = adj, s_cand[warp] = cand;
    __syncthreads();
    if (threadIdx.x == 0) {
        adj = cand = 0;
        for (int i = 0; i < ROUTE_SAMPLES; ++i) adj += s_adj[i], cand += s_cand[i];
        const bool ws =
            ashape || (sparse && (every || (cand >= ROUTE_MIN_CANDIDATES && 10 * adj >= 9 * cand)));
        taken[bh] = ws;
        if (ws) list[1 + atomicAdd(list, 1)] = bh | (ashape ? WS_A_SHAPE : 0);
        s_ws = ws && sparse; /* column copies: sparse heads only */
    }
    __syncthreads();
    if (c.rows == 0) return;
    const int64_t row = (int64_t)bh * p.row_blocks + p.row_blocks - 1;
    const int n = s_ws ? min(min(max(__ldg(p.column_count + row), 0), p.max_columns), c.rows) : 0;
    const int32_t *cols = p.column_index + row * p.max_columns;
    bool ok = s_ws != 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int key = __ldg(cols + i);
        ok &= key >= 0 && key < p.len && (i == 0 || key > __ldg(cols + i - 1));
    }
    if (!__syncthreads_and(ok)) {
        if (threadIdx.x == 0) c.count[bh] = -1;
        return;
    }
    /* sixteen lanes to a row of 256 bytes; the rows of one tile past the copies are zeros, so
     * that a tile reaching there reads no stale data (its keys there are masked, but a NaN
     * times a zero weight would still spoil the output) */
    const int b = bh / p.heads, hk = bh % p.heads / p.group;
    const int fill = min(n + 128, c.rows);
    for (int pass = 0; pass < 2; ++pass) {
        const char *src = reinterpret_cast<const char *>(pass ? p.v : p.k) +
                          2 * (b * (pass ? p.v_stride : p.k_stride)[0] +
                               hk * (pass ? p.v_stride : p.k_stride)[1]);
        const int64_t rs = 2 * (pass ? p.v_stride : p.k_stride)[2];
        uint4 *dst = reinterpret_cast<uint4 *>(pass ? c.v : c.k) + (int64_t)bh * c.rows * 16;
        for (int i = threadIdx.x; i < fill * 16; i += blockDim.x) {
            const int r = i / 16;
            uint4 x = make_uint4(0, 0, 0, 0);
            if (r < n) x = __ldg(reinterpret_cast<const uint4 *>(src + __ldg(cols + r) * rs) + i % 16);
            dst[i] = x;
        }
    }
    if (threadIdx.x == 0) c.count[bh] = n;
#endif
}

} // namespace mi_cuda

/* Runs the sparse heads of the launch that suit it (see sparse_route_kernel), and its
 * A-/Tri-shape heads with the first one's sinks, window and last rows, with this kernel where
 * it applies: every sequence of the full length (where the heads run dense below their
 * dense_below are dense heads already: mi_cuda_attn_sm90_launch), D = 128,
 * tensors TMA can address, and a sparse head with an index of 64-row blocks covering the
 * sequence or such an A-/Tri-shape head. The choice is made on the device, since the index is
 * built there: a small kernel flags the heads this kernel runs (*taken) and lists them for it;
 * the ring kernel runs the others. MI_CUDA_SM90_SPARSE=1 sends every sparse head to this
 * kernel, =0 none; MI_CUDA_SM90_A_SHAPE=0 leaves the A-/Tri-shape heads to the ring kernel (for
 * A/B runs). */
extern "C" cudaError_t mi_cuda_attn_sm90_sparse_launch(const mi_cuda_attn_params *p,
                                                        cudaStream_t st, int *used,
                                                        int32_t **taken) {
    *used = 0;
    *taken = nullptr;
    const char *env = getenv("MI_CUDA_SM90_SPARSE");
    const int every = env && env[0] == '1';
    const char *a_env = getenv("MI_CUDA_SM90_A_SHAPE"); /* =0: A-shape to the ring kernel */
    if ((env && env[0] == '0') || p->head_dim != 128) return cudaSuccess;
    /* the sparse heads (with an index that covers the sequence), and the A-/Tri-shape heads with
     * the sinks, window and last rows of the first one (an A-shape layer's heads usually share
     * them; the others go to the ring kernel) */
    bool any_sparse = false, a_on = false;
    mi_cuda::a_shape_window a_win = {0, 0, INT_MAX};
    for (int h = 0; h < p->heads; ++h) {
        const mi_cuda_head_mode m = mi_cuda::head_mode_of(*p, h);
        any_sparse |= m.mode == MI_CUDA_MODE_SPARSE;
        if (!a_on && !(a_env && a_env[0] == '0') && m.mode == MI_CUDA_MODE_A_SHAPE) {
            a_on = true;
            a_win = mi_cuda::a_shape_window_of(m, p->len);
        }
    }
    /* Tri-shape: the pair that holds the dense last rows is one item of about len / 128 tiles
     * (one consumer busy), the others about n_local / 128 + 2 each. Unless each SM has at least
     * two such items' worth of the others, that item sets the kernel's time: 128 + 4096 + 64
     * at 1M on one head ran 17.6 ms here against 15.5 on the ring kernel (4.3 without the last
     * rows), while at 128K on 32 heads 0.59 against 0.78 ms per head. */
    if (a_on && a_win.tri_start != INT_MAX) {
        int64_t heads = 0;
        for (int h = 0; h < p->heads; ++h)
            heads += mi_cuda::a_shape_with(mi_cuda::head_mode_of(*p, h), p->len, a_win);
        if (heads * p->batch * (a_win.n_local / 128 + 2) < 2 * (int64_t)mi_cuda_sm_count())
            a_on = false;
    }
    if (any_sparse && (!p->block_count || (int64_t)p->row_blocks * 64 < p->len)) any_sparse = false;
    if (!any_sparse && !a_on) return cudaSuccess;
    static thread_local mi_cuda::sparse_sm90_args a; /* tensor maps: off the stack */
    const bool bf16 = p->dtype == MI_DTYPE_BF16;
    if (!mi_cuda::encode_qkv_maps(&a.tm_q, &a.tm_k2, &a.tm_v2, p, 128) ||
        !mi_cuda::encode_tma_map(&a.tm_k, p->k, p->k_stride, p->batch, p->heads_kv, p->len, 128, 64,
                                 bf16) ||
        !mi_cuda::encode_tma_map(&a.tm_v, p->v, p->v_stride, p->batch, p->heads_kv, p->len, 128, 64,
                                 bf16))
        return cudaSuccess;
    a.k = p->k;
    a.v = p->v;
    a.o = p->o;
    a.lse = p->lse;
    for (int i = 0; i < 3; ++i) {
        a.k_stride[i] = p->k_stride[i];
        a.v_stride[i] = p->v_stride[i];
        a.o_stride[i] = p->o_stride[i];
    }
    a.block_count = any_sparse ? p->block_count : nullptr;
    a.block_offset = any_sparse ? p->block_offset : nullptr;
    a.column_count = any_sparse ? p->column_count : nullptr;
    a.column_index = any_sparse ? p->column_index : nullptr;
    a.row_blocks = any_sparse ? p->row_blocks : (p->len + 63) / 64;
    a.max_blocks = any_sparse ? p->max_blocks : 0;
    a.max_columns = any_sparse ? p->max_columns : 0;
    a.a_win = a_win;
    a.heads = p->heads;
    a.group = p->group;
    a.len = p->len;
    a.scale_log2 = p->scale_log2;
    a.pairs = (a.row_blocks + 1) / 2;
    const int n_bh = p->batch * p->heads;
    const int64_t items = (int64_t)a.pairs * n_bh;
    if (items > 0x7fffffff) return cudaSuccess;
    a.max_items = (int)items;
    /* flags, list {n, bh...}, copy counts, then the column copies (up to SP_CSTAGED rows per
     * (b, h): the most a shared column list has; none where they would take more than
     * COPY_BYTES_MAX): stream-ordered, so that nothing waits for the host */
    constexpr size_t COPY_BYTES_MAX = (size_t)256 << 20;
    mi_cuda::column_copies cc = {nullptr, nullptr, nullptr,
                                 min(a.max_columns, mi_cuda::SP_CSTAGED)};
    const size_t ints = ((2 + 3 * (size_t)n_bh) * sizeof(int32_t) + 255) / 256 * 256;
    size_t copy = (size_t)n_bh * cc.rows * 128 * 2;
    const char *copies_env = getenv("MI_CUDA_SM90_COLUMN_COPIES"); /* =0: gather (A/B runs) */
    /* =N: plan at most N range tiles of an item ahead, merging longer items inline (to test
     * that path, which only items of more than SP_PLAN tiles take otherwise) */
    const char *plan_env = getenv("MI_CUDA_SM90_PLAN_TILES");
    a.plan_tiles = plan_env ? max(0, min(atoi(plan_env), mi_cuda::SP_PLAN)) : mi_cuda::SP_PLAN;
    /* =0: each thread stores its output rows itself (A/B runs, and the tests of that path) */
    const char *store_env = getenv("MI_CUDA_SM90_TMA_STORE");
    a.o_tma = !(store_env && store_env[0] == '0') &&
              mi_cuda::encode_tma_map(&a.tm_o, p->o, p->o_stride, p->batch, p->heads, p->len, 128,
                                      64, bf16);
    if (cc.rows <= 0 || 2 * copy > COPY_BYTES_MAX || (copies_env && copies_env[0] == '0'))
        cc.rows = 0, copy = 0;
    int32_t *buf = nullptr;
    if (cudaMallocAsync(reinterpret_cast<void **>(&buf), ints + 2 * copy, st) != cudaSuccess) {
        (void)cudaGetLastError(); /* no memory for them: the ring kernel runs every head */
        return cudaSuccess;
    }
    a.ws_heads = buf + n_bh;
    cc.count = buf + 2 * n_bh + 1;
    a.col_rows = cc.count;
    a.crows = 0;
    if (cc.rows > 0) {
        cc.k = reinterpret_cast<char *>(buf) + ints;
        cc.v = reinterpret_cast<char *>(cc.k) + copy;
        const int64_t cstride[3] = {0, (int64_t)cc.rows * 128, 128};
        if (mi_cuda::encode_tma_map(&a.tm_kc, cc.k, cstride, 1, n_bh, cc.rows, 128, 128, bf16) &&
            mi_cuda::encode_tma_map(&a.tm_vc, cc.v, cstride, 1, n_bh, cc.rows, 128, 128, bf16))
            a.crows = cc.rows;
        else
            cc.rows = 0;
    }
    cudaError_t e = cudaMemsetAsync(buf + n_bh, 0, sizeof(int32_t), st);
    if (e == cudaSuccess) {
        mi_cuda::sparse_route_kernel<<<n_bh, 32 * mi_cuda::ROUTE_SAMPLES, 0, st>>>(
            *p, buf, buf + n_bh, any_sparse, every, cc, a_on, a_win);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = bf16 ? mi_cuda::launch_sparse<__nv_bfloat16>(a, st)
                 : mi_cuda::launch_sparse<__half>(a, st);
    if (e != cudaSuccess) {
        cudaFreeAsync(buf, st);
        return e;
    }
    *used = 1;
    *taken = buf;
    return cudaSuccess;
}
