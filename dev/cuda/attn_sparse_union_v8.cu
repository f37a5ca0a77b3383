/*
 * dev/cuda/attn_sparse_union_v8.cu: experiment 8 (src/cuda/attn_sparse_sm90.cu of 22190fb plus a
 * packed union of the gathered columns; MI_CUDA_SM90_UNION=0 switched it off). Before each
 * launch, three small kernels build, per (b, h), the union of all row blocks' column lists (a
 * bitmap with one atomicOr per new key, a chunked popcount prefix giving each key its rank, the
 * keys ascending) and copy their K and V rows side by side into scratch (cudaMallocAsync). A pair
 * of row blocks whose sorted lists span a run of the union not much longer than themselves then
 * loads its gathered tiles with TMA from that run, like ranges, and masks the keys of the run it
 * does not list, instead of four producer warps copying every row with cp.async. Compiled with
 * MI_SPARSE_WATCHDOG, every mbarrier wait prints where it is after seconds and traps.
 * GPU tests: 152/152 quick and 398/398 full on this path, memcheck clean (a new test draws each
 * row block's columns from one set per head, so that runs, masked keys and the gather fallback
 * all occur).
 * Reached on an NVIDIA H200 (bf16, D = 128; ms per head and effective TFLOP/s; "gather" is this
 * file with MI_CUDA_SM90_UNION=0, "ring" the default kernel, same process or same machine):
 *   local 128K 0.833 / 526 and 0.840 / 522 (gather 0.870 / 503, 0.884 / 496; ring 0.878 / 499,
 *   0.884 / 496); local 1M 6.85 / 523 (gather 7.10 / 505; ring 7.23 / 496);
 *   small 128K 0.208 / 371 (gather 0.198 / 389; ring 0.191 / 404); small 1M 1.74 / 356 (gather
 *   1.62 / 383; ring 1.53 / 405); mixed 128K 7.48 / 443 (gather 7.53 / 439; ring 6.82 / 486);
 *   mixed 1M 98.9 / 372 (gather 99.9 / 368; ring 85.6 / 429);
 *   whole-layer VS prefill at 1M x 8 heads with estimated indexes: 66.0 ms per head (watchdog
 *   build) against gather 58.1 and ring 46.2.
 * So the union made the columns of the `local` set cheaper (+4-5 %) but cost more than it saved
 * on `small` (the union is rebuilt per launch) and on the estimated indexes, and one run of the
 * benchmark's sparse shapes in one process stopped in this kernel (mixed 128K after other
 * shapes; not reproduced in a separate process, nor with the watchdog build). Left out of src/.
 * Later the kernel in src/ showed the same kind of stop and its cause was found: producer warps
 * other than warp 0 waited on the slots' empty barriers, and a lagging one could wait for a
 * phase that needed warp 0 to go on while warp 0 waited for it at a named barrier. This snapshot
 * has the same waits, so that is the likely cause here too (not checked on this snapshot).
 */
/*
 * attn_sparse_sm90.cu: the Hopper (sm_90a) sparse attention kernel, D = 128, for launches whose
 * every head consumes the block index (vertical-slash and block-sparse layers, the benchmark's
 * index sets) and whose sequences all have the full length; everything else runs the ring
 * kernel of attn_fwd_sm90.cu.
 *
 * The structure of the dense kernel (attn_dense_sm90.cu) applied to two adjacent 64-row blocks
 * A and B of the index at once, so that the tiles both use are loaded once:
 *   - the producer warpgroup merges A's and B's range starts (each ascending) into one list of
 *     64-key ranges, each marked with who uses it (A, B or both), and packs them two to a
 *     128-key tile: two both use (a shared tile), one of A's only with one of B's only (a split
 *     tile: each consumer computes its own 64-key half), or else two of one side's. Tiles are
 *     loaded with TMA (64 x 64 boxes; ranges may start anywhere, rows outside the sequence read
 *     as zeros). A band of diagonals, the common case, is shared but for its two ends;
 *   - then the gathered columns: when both lists are strictly ascending, A's tiles carry every
 *     column (each also used by B where B lists it) and B's the ones A does not list; otherwise
 *     A's and B's tiles alternate, each used by its owner only. All four producer warps look the
 *     keys up, write them (and who uses each) to the tile's header and copy the rows with
 *     cp.async (zero-filled where a key does not exist);
 *   - each tile's header (range starts, users, keys, end-of-item marker) sits next to it in
 *     shared memory; a consumer computes the tiles (or the half) it uses, masks keys after its
 *     rows and keys only the other block uses, and otherwise only frees the slot (a P V still
 *     pending in that slot is issued first, so that no slot waits on a tile that comes later).
 * A persistent CTA per SM walks the work items (pairs x heads x batch), with Q double-buffered,
 * so that an item's start (reading the index, the first loads) overlaps the previous one's end.
 *
 * Opt-in (MI_CUDA_SM90_SPARSE=1), not the default. H200, bf16, against the ring kernel in one
 * process (bench/time_variants.py; bench/results/2026-11-30-gpu-sparse-ws-ab.json), ms per head
 * and effective TFLOP/s:
 *   local 128K 0.855 / 512 (ring 0.886 / 494), local 1M 6.99 / 513 (7.30 / 491);
 *   small 128K 0.208 / 370 (0.211 / 366), small 1M 1.68 / 370 (1.60 / 387);
 *   mixed 128K 7.28 / 455 (6.76 / 490), mixed 1M 98.3 / 374 (78.0 / 471);
 *   whole-layer VS prefill at 1M x 8 heads (estimated indexes) 56.3 against 46.0 ms per head.
 * So it wins where adjacent row blocks share their ranges (a band of diagonals) and loses where
 * they share few (scattered diagonals: mostly split tiles, each consumer with one 64-key half in
 * flight per stage, where the ring kernel keeps three CTAs' loads in flight per SM). The host
 * cannot tell the two apart before a launch (the index is built on the GPU), hence the switch.
 * How it got here (same harness, local / mixed / small at 128K, TFLOP/s):
 *   one producer warp, owner-only column tiles, pairs in merge order: 467 / 430 / 356 (ring
 *   498 / 487 / 386);
 *   ranges packed by users class: mixed 430 -> 480;
 *   a timing-only switch that dropped the columns or the ranges showed the gathered columns at
 *   about 170 TFLOP/s, the ranges at about 550;
 *   four producer warps for the gathers, columns shared when both lists are ascending: local 508;
 *   split tiles (a half per row block, computed as 64 keys): local 516, mixed 475, small 347;
 *   persistent CTAs: small 370 (and 1M small 314 -> 370).
 */
#include "sm90_common.cuh"

#include <limits.h>
#include <type_traits>
#include <stdio.h>
#include <stdlib.h>

namespace mi_cuda {

struct sparse_sm90_args {
    CUtensorMap tm_q, tm_k, tm_v;
    const void *k, *v; /* gathered columns */
    int64_t k_stride[3], v_stride[3];
    void *o;
    float *lse; /* [B, H, len] or NULL */
    int64_t o_stride[3];
    const int32_t *block_count, *block_offset, *column_count, *column_index;
    int row_blocks, max_blocks, max_columns;
    int heads, group, len;
    float scale_log2;
    int pairs, items; /* row-block pairs per (b, h); pairs x B x H work items */
    /* the union of each (b, h)'s gathered columns (column_union below), or u_keys = NULL */
    CUtensorMap tm_kc, tm_vc;
    const uint32_t *u_bits;
    const int32_t *u_rank_base, *u_keys, *u_count;
    int u_words, u_cap;
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
    int last;      /* the end marker after the CTA's last tile (no data) */
    int pad[2];
    int kpos[128]; /* gathered tile: key of each row, MI_NO_KEY where none */
    uint8_t kusers[128]; /* and the row blocks that use it */
};

/* range starts of A and B staged in shared memory for the producer's merge, then their columns */
constexpr int SP_STAGED = 2048, SP_CSTAGED = 2048;
constexpr size_t SP_SMEM = 1024 + (2 + 2 * SP_STAGES) * SP_TILE +
                           SP_STAGES * sizeof(tile_header) + 16 * sizeof(uint64_t) +
                           (2 * SP_STAGED + 2 * SP_CSTAGED) * sizeof(int32_t);
static_assert(SP_SMEM <= 227 * 1024, "more shared memory than an H100/H200 CTA may have");

#ifdef MI_SM90_DEVICE
/* Range starts of row blocks A and B: staged in shared memory (up to SP_STAGED each), the rest
 * read from the index. */
struct staged_list {
    const int32_t *sm, *g;
    int n;
    __device__ int at(int i) const { return i < SP_STAGED ? sm[i] : __ldg(g + i); }
};

/* Whether the strictly ascending list[0, n) holds key. */
__device__ __forceinline__ bool sorted_contains(const int32_t *list, int n, int key) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (list[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && list[lo] == key;
}

#endif

/* The union of the gathered columns of all row blocks of a (b, h), packed: its keys ascending
 * (u_keys), their K and V rows in that order (kc, vc), and for any key its rank among them
 * (u_rank_base[word] + the bits below it in u_bits). A vertical-slash column list is the head's
 * verticals less those its ranges cover or that follow its rows: nearly a run of the union. So a
 * pair of row blocks whose lists span a run of at most about their own length loads its gathered
 * tiles from kc / vc with TMA, like ranges, and masks the few keys of the run it does not list,
 * instead of the producer copying every row by cp.async. Built for each launch in three steps:
 * a bitmap of the keys (one atomicOr per new key), its popcount prefix (1024-word chunks: their
 * counts, then each chunk's scan after the chunks before it), then the rows. A (b, h) whose
 * union exceeds u_cap keeps gathering. */
constexpr int SP_UNION_CAP = 4096; /* keys; a multiple of 128 */

__global__ void union_mark_kernel(const int32_t *count, const int32_t *index, int row_blocks,
                                  int max_columns, int len, uint32_t *bits, int words) {
#ifdef MI_SM90_DEVICE
    const int bh = blockIdx.y, rb = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (rb >= row_blocks) return;
    const int64_t row = (int64_t)bh * row_blocks + rb;
    const int n = min(max(count[row], 0), max_columns);
    const int32_t *c = index + row * max_columns;
    uint32_t *bm = bits + (int64_t)bh * words;
    for (int i = lane; i < n; i += 32) {
        const int key = __ldg(c + i);
        if (key < 0 || key >= len) continue;
        const uint32_t m = 1u << (key & 31);
        /* most keys are in every row block's list: read before the atomic */
        if (!(__ldcg(bm + (key >> 5)) & m)) atomicOr(bm + (key >> 5), m);
    }
#endif
}

/* Keys in each 1024-word chunk of the bitmap: grid (chunks, B x H). */
__global__ void __launch_bounds__(1024)
    union_chunk_kernel(const uint32_t *bits, int words, int32_t *chunk_keys) {
#ifdef MI_SM90_DEVICE
    __shared__ int warp_sum[32];
    const int w = blockIdx.x * 1024 + threadIdx.x, lane = threadIdx.x % 32;
    int c = w < words ? __popc(bits[(int64_t)blockIdx.y * words + w]) : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if (lane == 0) warp_sum[threadIdx.x / 32] = c;
    __syncthreads();
    if (threadIdx.x < 32) {
        c = warp_sum[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
        if (lane == 0) chunk_keys[(int64_t)blockIdx.y * gridDim.x + blockIdx.x] = c;
    }
#endif
}

/* The popcount prefix of one chunk (after the keys of the chunks before it) and the keys it
 * holds; the last chunk writes the (b, h)'s count. Grid (chunks, B x H). */
__global__ void __launch_bounds__(1024)
    union_rank_kernel(const uint32_t *bits, int words, const int32_t *chunk_keys, int cap,
                      int32_t *rank_base, int32_t *keys, int32_t *count) {
#ifdef MI_SM90_DEVICE
    __shared__ int warp_excl[32], before, chunk_total;
    const int bh = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    if (warp == 0) {
        int sum = 0;
        for (int c = lane; c < (int)blockIdx.x; c += 32)
            sum += chunk_keys[(int64_t)bh * gridDim.x + c];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) before = sum;
    }
    const int w = blockIdx.x * 1024 + tid;
    const uint32_t v = w < words ? bits[(int64_t)bh * words + w] : 0u;
    const int c = __popc(v);
    int x = c; /* inclusive scan over the warp */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_excl[warp] = x;
    __syncthreads();
    if (warp == 0) {
        const int sum = warp_excl[lane];
        int incl = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        warp_excl[lane] = incl - sum;
        if (lane == 31) chunk_total = incl;
    }
    __syncthreads();
    if (w < words) {
        int r = before + warp_excl[warp] + x - c;
        rank_base[(int64_t)bh * words + w] = r;
        for (uint32_t m = v; m; m &= m - 1, ++r)
            if (r < cap) keys[(int64_t)bh * cap + r] = w * 32 + __ffs(m) - 1;
    }
    if (tid == 0 && blockIdx.x == gridDim.x - 1) count[bh] = before + chunk_total;
#endif
}

/* Rows [0, n) of the union's K and V, then zeros up to n + 128 (a run may start at any key and
 * read 128 rows: rows past n must hold numbers, since masked scores still multiply V). */
template <typename T>
__global__ void union_gather_kernel(const T *k, const T *v, int64_t ks0, int64_t ks1, int64_t ks2,
                                    int64_t vs0, int64_t vs1, int64_t vs2, int heads, int group,
                                    const int32_t *keys, const int32_t *count, int cap, T *kc,
                                    T *vc) {
#ifdef MI_SM90_DEVICE
    const int bh = blockIdx.y, b = bh / heads, hk = (bh % heads) / group;
    const int n = count[bh];
    const int r = blockIdx.x * 8 + threadIdx.x / 16, c = threadIdx.x % 16;
    if (n > cap || r >= min(cap, n + 128)) return;
    uint4 kr = make_uint4(0, 0, 0, 0), vr = kr;
    if (r < n) {
        const int key = keys[(int64_t)bh * cap + r];
        kr = reinterpret_cast<const uint4 *>(k + b * ks0 + hk * ks1 + key * ks2)[c];
        vr = reinterpret_cast<const uint4 *>(v + b * vs0 + hk * vs1 + key * vs2)[c];
    }
    const int64_t at = ((int64_t)bh * cap + r) * 128;
    reinterpret_cast<uint4 *>(kc + at)[c] = kr;
    reinterpret_cast<uint4 *>(vc + at)[c] = vr;
#endif
}

#ifdef MI_SM90_DEVICE
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
            int &mine = cls == 1 ? h1 : h2, &other = cls == 1 ? h2 : h1;
            if (other != INT_MIN) { /* split: A's half first */
                o[0] = cls == 1 ? off : other;
                o[1] = cls == 1 ? other : off;
                u[0] = 1, u[1] = 2;
                other = INT_MIN;
                return;
            }
            if (mine != INT_MIN) { /* two of one side */
                o[0] = mine, o[1] = off, u[0] = u[1] = cls;
                mine = INT_MIN;
                return;
            }
            mine = off;
        }
        /* the leftovers: A's and B's together, else one per tile */
        if (h1 != INT_MIN && h2 != INT_MIN) {
            o[0] = h1, o[1] = h2, u[0] = 1, u[1] = 2;
            h1 = h2 = INT_MIN;
            return;
        }
        const int cls = h1 != INT_MIN ? 1 : h2 != INT_MIN ? 2 : 3;
        int &held = cls == 1 ? h1 : cls == 2 ? h2 : h3;
        o[0] = o[1] = held, u[0] = cls, u[1] = 0;
        held = INT_MIN;
    }
};
#endif

#ifdef MI_SPARSE_WATCHDOG
#define SP_STEP(code) (tid == 0 ? (void)(dbg[0] = t, dbg[1] = (code)) : (void)0)
#else
#define SP_STEP(code) ((void)0)
#endif
#ifdef MI_SM90_DEVICE
/* mbar_wait; built with MI_SPARSE_WATCHDOG, a wait that lasts seconds prints where it is (the
 * producer's last tile and step from dbg) and traps, to locate a hang. */
__device__ __forceinline__ void sp_wait(uint64_t *b, int parity, int tag, int t,
                                        const volatile int *dbg) {
#ifdef MI_SPARSE_WATCHDOG
    long long n = 0;
    while (!__all_sync(0xffffffffu, mbar_try_wait(b, parity))) {
        if (++n == (1ll << 22) && threadIdx.x % 32 == 0)
            printf("stuck: block %d thread %d wait %d t %d parity %d | producer t %d step %d\n",
                   blockIdx.x, threadIdx.x, tag, t, parity, dbg[0], dbg[1]);
        if (n == (1ll << 23)) __trap();
    }
#else
    (void)tag, (void)t, (void)dbg;
    mbar_wait(b, parity);
#endif
}
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
    /* the producer's broadcast of a pair's run of the union, in the barriers' spare words (a
     * static __shared__ would be placed 1024-aligned, past what a CTA may have) */
    int *run_plan = reinterpret_cast<int *>(v_empty + SP_STAGES);
    volatile int *dbg = run_plan + 2; /* MI_SPARSE_WATCHDOG: the producer's tile and step */

    const int tid = threadIdx.x;
    const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
    /* work item w: the pair of row blocks 2 pair, 2 pair + 1 of (b, h), the last pairs (the
     * most keys, causally) first; each CTA takes items blockIdx.x, + gridDim.x, ... */
    struct item {
        int pair, bh, b, h, hk, rs;
        int64_t row_a;
        bool has_b;
    };
    auto item_of = [&](int w) {
        item it;
        it.pair = a.pairs - 1 - w % a.pairs;
        it.bh = w / a.pairs;
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
            mbar_init(q_empty + i, 8); /* one arrival per consumer warp */
        }
        init_stage_barriers(k_full, v_full, k_empty, v_empty, SP_STAGES);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wgi == 0) {
        /* the producer warpgroup: lane 0 of warp 0 plans and issues the TMA loads; all four
         * warps gather columns (32 rows each), since one warp issuing 4096 copies per tile
         * could not keep up with the consumers. Every warp walks the same plan and waits on
         * the same barriers, so that their phases stay in step. */
        /* 72 registers for the producer (at 56 its merge and gather code spilled 80 bytes;
         * at 72, 16) and 216 for the consumers, which need no more */
        setmaxnreg_dec<72>();
        const int pw = tid / 32, lane = tid % 32;
        int t = 0; /* tiles so far, over all items: the slot ring runs on */
        for (int w = blockIdx.x, k = 0; w < a.items; w += gridDim.x, ++k) {
        const item it = item_of(w);
        const int b = it.b, h = it.h, hk = it.hk;
        const int64_t row_a = it.row_a;
        const int na = min(max(a.block_count[row_a], 0), a.max_blocks);
        const int nb = it.has_b ? min(max(a.block_count[row_a + 1], 0), a.max_blocks) : 0;
        const int ca = min(max(a.column_count[row_a], 0), a.max_columns);
        const int cb = it.has_b ? min(max(a.column_count[row_a + 1], 0), a.max_columns) : 0;
        SP_STEP(7);
        if (tid == 0) { /* Q, into the buffer item k - 2 used */
            const int qb = k & 1;
            if (k >= 2)
                while (!mbar_try_wait(q_empty + qb, ((k >> 1) - 1) & 1)) {
                }
            mbar_expect_tx(q_full + qb, SP_TILE);
            for (int i = 0; i < 4; ++i)
                tma_load_4d(smem_addr(qs) + qb * SP_TILE + (i & 1) * SP_HALF +
                                (i >> 1) * 64 * 128,
                            &a.tm_q, (i & 1) * 64, it.rs + (i >> 1) * 64, h, b, q_full + qb);
        }
        named_barrier_sync(3, 128); /* every warp is done with the last item's staged lists */
        const int32_t *offs = a.block_offset + row_a * a.max_blocks;
        const int32_t *cols_a = a.column_index + row_a * a.max_columns;
        const int32_t *cols_b = cols_a + a.max_columns;
        for (int i = tid; i < min(na, SP_STAGED); i += 128) staged[i] = __ldg(offs + i);
        for (int i = tid; i < min(nb, SP_STAGED); i += 128)
            staged[SP_STAGED + i] = __ldg(offs + a.max_blocks + i);
        named_barrier_sync(3, 128);
        range_packer rp({staged, offs, na}, {staged + SP_STAGED, offs + a.max_blocks, nb});
        /* gathered tiles. A's and B's column lists are mostly the same keys (the verticals of
         * the head, less those inside each block's ranges). When both are strictly ascending
         * (as the index builders write them) and fit in shared memory, A's tiles carry every
         * column, each also used by B where B lists it, and then come B's tiles of the columns
         * A does not list (tiles with none are dropped): a column both use is loaded once and
         * both consumers compute its tiles. Otherwise A's and B's tiles alternate, each used
         * by its own row block only (while one consumer computes a tile of A, the other
         * computes the next one, of B). */
        const int tiles_a = (ca + 127) / 128, tiles_b = (cb + 127) / 128;
        int32_t *scol_a = staged + 2 * SP_STAGED, *scol_b = scol_a + SP_CSTAGED;
        int col_a = 0, col_b = 0; /* column tiles done */
        int share = -1;           /* not decided until the first gathered tile */
        int run = -1, run_end = 0; /* gathered tiles from the union: ranks [run, run_end) */
        for (int t0 = t;; ++t) {
            const int slot = t % SP_STAGES, par = ((t / SP_STAGES) - 1) & 1;
            const uint32_t kd = smem_addr(ks) + slot * SP_TILE, vd = smem_addr(vs) + slot * SP_TILE;
            tile_header &hd = hdr[slot];
            int ranges_left = 0;
            if (lane == 0) ranges_left = rp.more();
            ranges_left = __shfl_sync(0xffffffffu, ranges_left, 0);
            if (share < 0 && (t - t0 >= SP_STAGES || !ranges_left)) {
                /* stage both column lists and see whether they can be shared: once the first
                 * two tiles are on their way, so that it overlaps their loads */
                SP_STEP(1);
                bool ok = ca + cb > 0 && ca <= SP_CSTAGED && cb <= SP_CSTAGED;
                if (ok) {
                    for (int i = tid; i < ca; i += 128) {
                        scol_a[i] = __ldg(cols_a + i);
                        ok &= i == 0 || scol_a[i] > __ldg(cols_a + i - 1);
                    }
                    for (int i = tid; i < cb; i += 128) {
                        scol_b[i] = __ldg(cols_b + i);
                        ok &= i == 0 || scol_b[i] > __ldg(cols_b + i - 1);
                    }
                }
                /* every thread's verdict (and its staged entries) before anyone reads them */
                const bool sorted = !named_barrier_or(3, 128, !ok);
                share = sorted && ca > 0 && cb > 0;
                if (sorted && a.u_keys) {
                    /* the run of the union from A's or B's first column to the last one */
                    if (tid == 0) {
                        const int bh = it.bh;
                        auto rank = [&](int key) {
                            const int64_t w = (int64_t)bh * a.u_words + (key >> 5);
                            return __ldg(a.u_rank_base + w) +
                                   __popc(__ldg(a.u_bits + w) & ((1u << (key & 31)) - 1u));
                        };
                        bool fits = __ldg(a.u_count + bh) <= a.u_cap;
                        int r0 = INT_MAX, r1 = -1;
                        if (ca > 0) {
                            fits &= scol_a[0] >= 0 && scol_a[ca - 1] < a.len;
                            if (fits) r0 = rank(scol_a[0]), r1 = rank(scol_a[ca - 1]);
                        }
                        if (cb > 0) {
                            fits &= scol_b[0] >= 0 && scol_b[cb - 1] < a.len;
                            if (fits)
                                r0 = min(r0, rank(scol_b[0])), r1 = max(r1, rank(scol_b[cb - 1]));
                        }
                        /* a run much longer than the lists (scattered picks from a large
                         * union) would load more than it computes: gather those */
                        const int most = max(ca, cb);
                        fits &= r1 - r0 + 1 <= most + most / 4 + 128;
                        run_plan[0] = fits ? r0 : -1;
                        run_plan[1] = r1 + 1;
                    }
                    named_barrier_sync(3, 128);
                    run = run_plan[0];
                    run_end = run_plan[1];
                    named_barrier_sync(3, 128); /* read before the header is written again */
                }
            }
            SP_STEP(2);
            if (t >= SP_STAGES) sp_wait(k_empty + slot, par, 2, t, dbg);
            SP_STEP(3);
            if (ranges_left) {
                if (lane == 0) {
                    int o[2], u[2];
                    rp.next(o, u); /* every warp, to keep the plan */
                    if (pw == 0) {
                        hd.off[0] = o[0];
                        hd.off[1] = o[1];
                        hd.users[0] = u[0];
                        hd.users[1] = u[1];
                        hd.column = 0;
                        hd.last = 0;
                        mbar_expect_tx(k_full + slot, SP_TILE);
                        for (int i = 0; i < 4; ++i)
                            tma_load_4d(kd + (i & 1) * SP_HALF + (i >> 1) * 64 * 128, &a.tm_k,
                                        (i & 1) * 64, o[i >> 1], hk, b, k_full + slot);
                    }
                }
                if (t >= SP_STAGES) sp_wait(v_empty + slot, par, 3, t, dbg);
                if (pw == 0 && lane == 0) {
                    mbar_expect_tx(v_full + slot, SP_TILE);
                    for (int i = 0; i < 4; ++i)
                        tma_load_4d(vd + (i & 1) * SP_HALF + (i >> 1) * 64 * 128, &a.tm_v,
                                    (i & 1) * 64, hd.off[i >> 1], hk, b, v_full + slot);
                }
                continue;
            }
            /* the next gathered tile, one row per thread: its key and who uses it */
            int key = MI_NO_KEY, users = 0, for_a = 0;
            bool done = false;
            int run_row = -1; /* a tile from the union: its first rank */
            while (run >= 0) {
                if (run >= run_end) {
                    done = true;
                    break;
                }
                const int r = run + tid;
                key = r < run_end ? __ldg(a.u_keys + (int64_t)it.bh * a.u_cap + r) : MI_NO_KEY;
                users = 0;
                if (key != MI_NO_KEY)
                    users = (ca > 0 && sorted_contains(scol_a, ca, key) ? 1 : 0) |
                            (cb > 0 && sorted_contains(scol_b, cb, key) ? 2 : 0);
                run_row = run;
                run += 128;
                if (named_barrier_or(3, 128, users != 0)) break; /* else nobody's: skip it */
            }
            for (; run_row < 0 && !done;) {
                for_a = col_a < tiles_a && (share || col_b >= tiles_b || col_a <= col_b);
                if (!for_a && col_b >= tiles_b) {
                    done = true;
                    break;
                }
                const int ci = for_a ? col_a++ : col_b++;
                const int c = ci * 128 + tid, cnt = for_a ? ca : cb;
                key = c >= cnt ? MI_NO_KEY
                      : share  ? (for_a ? scol_a : scol_b)[c]
                               : __ldg((for_a ? cols_a : cols_b) + c);
                if (key < 0 || key >= a.len) key = MI_NO_KEY;
                users = key == MI_NO_KEY ? 0 : for_a ? 1 : 2;
                if (share && key != MI_NO_KEY) {
                    if (for_a && sorted_contains(scol_b, cb, key)) users = 3;
                    if (!for_a && sorted_contains(scol_a, ca, key)) {
                        key = MI_NO_KEY; /* in one of A's tiles already */
                        users = 0;
                    }
                }
                if (!share || for_a || named_barrier_or(3, 128, users != 0)) break;
            }
            if (done) { /* the end marker: no data, users 0 */
                SP_STEP(6);
                if (tid == 0) {
                    hd.users[0] = hd.users[1] = 0;
                    hd.column = 0;
                    hd.last = 1;
                    mbar_arrive(k_full + slot);
                }
                if (t >= SP_STAGES) sp_wait(v_empty + slot, par, 4, t, dbg);
                if (tid == 0) mbar_arrive(v_full + slot);
                ++t;
                break;
            }
            int tile_users = 2; /* B's tiles: B's only */
            if (run_row >= 0) {
                tile_users = (named_barrier_or(3, 128, users & 1) ? 1 : 0) |
                             (named_barrier_or(3, 128, users & 2) ? 2 : 0);
            } else if (for_a) {
                tile_users = named_barrier_or(3, 128, users & 1) ? 1 : 0;
                if (share && named_barrier_or(3, 128, users & 2)) tile_users |= 2;
            }
            hd.kpos[tid] = key;
            hd.kusers[tid] = (uint8_t)users;
            if (tid == 0) {
                hd.users[0] = hd.users[1] = tile_users;
                hd.column = 1;
                hd.last = 0;
            }
            /* the copies complete on the slot's barrier by themselves: each thread's arrive-on
             * counts as pending until its copies land, and thread 0's plain arrive (once every
             * thread has registered its own) is the one the barrier expects. So the producer goes
             * on at once; the consumers fence the async proxy before their wgmma read the tile. */
            auto gather = [&](const void *g, const int64_t *st, uint32_t dst, uint64_t *bar) {
                const bool ok = key != MI_NO_KEY;
                const T *src = reinterpret_cast<const T *>(g) + b * st[0] + hk * st[1] +
                               (int64_t)(ok ? key : 0) * st[2];
#pragma unroll
                for (int cc = 0; cc < 16; ++cc)
                    cp_async_16(dst + sw_off(tid, cc, SP_HALF), src + 8 * cc, ok ? 16 : 0);
                cp_async_mbar_arrive(bar);
                named_barrier_sync(3, 128); /* also orders the header before the arrive */
                if (tid == 0) mbar_arrive(bar);
            };
            SP_STEP(run_row >= 0 ? 4 : 5);
            if (run_row >= 0) { /* 128 rows of the union from rank run_row, by TMA */
                named_barrier_sync(3, 128); /* the header before the barrier completes */
                if (tid == 0) {
                    mbar_expect_tx(k_full + slot, SP_TILE);
                    for (int i = 0; i < 4; ++i)
                        tma_load_4d(kd + (i & 1) * SP_HALF + (i >> 1) * 64 * 128, &a.tm_kc,
                                    (i & 1) * 64, run_row + (i >> 1) * 64, h, b, k_full + slot);
                }
                if (t >= SP_STAGES) sp_wait(v_empty + slot, par, 5, t, dbg);
                if (tid == 0) {
                    mbar_expect_tx(v_full + slot, SP_TILE);
                    for (int i = 0; i < 4; ++i)
                        tma_load_4d(vd + (i & 1) * SP_HALF + (i >> 1) * 64 * 128, &a.tm_vc,
                                    (i & 1) * 64, run_row + (i >> 1) * 64, h, b, v_full + slot);
                }
                continue;
            }
            gather(a.k, a.k_stride, kd, k_full + slot);
            if (t >= SP_STAGES) sp_wait(v_empty + slot, par, 6, t, dbg);
            gather(a.v, a.v_stride, vd, v_full + slot);
        }
        } /* work items */
        return;
    }

    setmaxnreg_inc<216>();
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
    for (int w = blockIdx.x, k = 0; w < a.items; w += gridDim.x, ++k) {
    const item it = item_of(w);
    const bool last_item = w + (int)gridDim.x >= a.items;
    const int first_row = it.rs + cw * 64;
    const int qrow0 = first_row + warp * 16 + g, qrow1 = qrow0 + 8;
    const int qb = k & 1;
    const sw128_desc qd(smem_addr(qs) + qb * SP_TILE + cw * 64 * 128, 16, 1024);
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
    auto release = [&](uint64_t *bar) {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    };

    /* keys this consumer does not see: after its rows, outside the sequence, in a half of a
     * shared tile that only the other row block uses, or missing from a gathered tile */
    auto mask = [&](float *s, const tile_header &hd, bool whole, int hf, int column) {
        if (column) {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
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
            release(k_empty + slot); /* after the mask: it reads this slot's header */
            float2 al;
            if constexpr (SK == 2)
                al = sm.update<16>(s, sc);
            else
                al = sm.update<8>(sh, sc);
            if constexpr (PK > 0) {
                wgmma_wait<0>();
                fence_operands<64>(o);
                release(v_empty + pslot);
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
            release(v_empty + pslot);
        }
    };
    using C0 = std::integral_constant<int, 0>;
    using C1 = std::integral_constant<int, 1>;
    using C2 = std::integral_constant<int, 2>;

    sp_wait(q_full + qb, (k >> 1) & 1, 7, t, dbg);
    int pending = -1;    /* the tile whose P V is still to be issued (P in pa) */
    int pending_pk = 0;  /* its kind: 1 half, 2 whole */
    int pending_hf = 0;  /* its half */
    bool pending_column = false; /* a gathered tile */
    for (;; ++t) {
        const int slot = t % SP_STAGES, par = (t / SP_STAGES) & 1;
        sp_wait(k_full + slot, par, 8, t, dbg);
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
        /* consumer 1's very last turn is not awaited */
        const bool hand_on = cw == 0 || !(last && last_item);
        const int pslot = pending % SP_STAGES;
        /* loop-carried values that steer wgmma, broadcast again (ptxas does not follow their
         * uniformity through the loop) */
        const int pk = __shfl_sync(0xffffffffu, pending >= 0 ? pending_pk : 0, 0);
        const int phf = __shfl_sync(0xffffffffu, pending_hf, 0);
        if (pk) {
            sp_wait(v_full + pslot, (pending / SP_STAGES) & 1, 9, t, dbg);
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
            release(k_empty + slot);
            sp_wait(v_full + slot, par, 10, t, dbg);
            release(v_empty + slot);
        }
        if (last) {
            ++t;
            break;
        }
    }
    if (pending >= 0) { /* the last P V */
        const int pslot = pending % SP_STAGES;
        sp_wait(v_full + pslot, (pending / SP_STAGES) & 1, 11, t, dbg);
        if (pending_column) fence_proxy_async();
        wgmma_fence();
        if (__shfl_sync(0xffffffffu, pending_pk, 0) == 2) {
            issue_pv(pslot, true, 0);
            wgmma_commit();
            wgmma_wait<0>();
        } else {
            issue_pv(pslot, false, __shfl_sync(0xffffffffu, pending_hf, 0));
            wgmma_commit();
            wgmma_wait<0>();
        }
        fence_operands<64>(o);
        release(v_empty + pslot); /* the next item's tiles need the slot */
    }
    release(q_empty + qb); /* every S of this item is done */
    T *og = reinterpret_cast<T *>(a.o) + it.b * a.o_stride[0] + it.h * a.o_stride[1];
    float *lseg = a.lse ? a.lse + ((int64_t)it.b * a.heads + it.h) * a.len : nullptr;
    store_rows<T>(og, a.o_stride[2], lseg, sm, o, qrow0, qrow1, a.len, a.len, cq);
    } /* work items */
#endif
}

/* Builds the union of the gathered columns (column_union above) into stream-ordered scratch
 * and points a at it; *scratch = NULL and a.u_keys = NULL where there is no column or the
 * scratch cannot be had (the kernel then gathers every column). */
template <typename T>
static cudaError_t build_union(sparse_sm90_args &a, const mi_cuda_attn_params *p,
                               cudaStream_t st, void **scratch) {
    *scratch = nullptr;
    a.u_keys = nullptr;
    const char *off = getenv("MI_CUDA_SM90_UNION");
    if ((off && off[0] == '0') || p->max_columns <= 0) return cudaSuccess;
    const int bh = p->batch * p->heads;
    /* a vertical-slash union holds at most the head's verticals, fewer than max_columns */
    const int cap = min(SP_UNION_CAP, (p->max_columns + 127) / 128 * 128);
    const int words = (p->len + 31) / 32;
    auto up = [](size_t n) { return (n + 1023) / 1024 * 1024; };
    const int chunks = (words + 1023) / 1024;
    const size_t bits_b = up((size_t)bh * words * 4), keys_b = up((size_t)bh * cap * 4),
                 count_b = up((size_t)bh * (chunks + 1) * 4),
                 rows_b = up((size_t)bh * cap * 128 * sizeof(T));
    if (cudaMallocAsync(scratch, 2 * bits_b + keys_b + count_b + 2 * rows_b, st) != cudaSuccess) {
        (void)cudaGetLastError(); /* no union: gather */
        *scratch = nullptr;
        return cudaSuccess;
    }
    unsigned char *s = static_cast<unsigned char *>(*scratch);
    uint32_t *bits = reinterpret_cast<uint32_t *>(s);
    int32_t *rank_base = reinterpret_cast<int32_t *>(s + bits_b);
    int32_t *keys = reinterpret_cast<int32_t *>(s + 2 * bits_b);
    int32_t *count = reinterpret_cast<int32_t *>(s + 2 * bits_b + keys_b);
    T *kc = reinterpret_cast<T *>(s + 2 * bits_b + keys_b + count_b);
    T *vc = reinterpret_cast<T *>(s + 2 * bits_b + keys_b + count_b + rows_b);
    const int64_t cs[3] = {(int64_t)p->heads * cap * 128, (int64_t)cap * 128, 128};
    const bool bf16 = p->dtype == MI_DTYPE_BF16;
    if (!encode_tma_map(&a.tm_kc, kc, cs, p->batch, p->heads, cap, 64, bf16) ||
        !encode_tma_map(&a.tm_vc, vc, cs, p->batch, p->heads, cap, 64, bf16))
        return cudaSuccess; /* gather; the scratch is freed by the caller */
    cudaError_t e = cudaMemsetAsync(bits, 0, (size_t)bh * words * 4, st);
    if (e != cudaSuccess) return e;
    union_mark_kernel<<<dim3((p->row_blocks + 3) / 4, bh), 128, 0, st>>>(
        p->column_count, p->column_index, p->row_blocks, p->max_columns, p->len, bits, words);
    int32_t *chunk_keys = count + bh;
    union_chunk_kernel<<<dim3(chunks, bh), 1024, 0, st>>>(bits, words, chunk_keys);
    union_rank_kernel<<<dim3(chunks, bh), 1024, 0, st>>>(bits, words, chunk_keys, cap, rank_base,
                                                         keys, count);
    union_gather_kernel<T><<<dim3(cap / 8, bh), 128, 0, st>>>(
        static_cast<const T *>(p->k), static_cast<const T *>(p->v), p->k_stride[0],
        p->k_stride[1], p->k_stride[2], p->v_stride[0], p->v_stride[1], p->v_stride[2],
        p->heads, p->group, keys, count, cap, kc, vc);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    a.u_bits = bits;
    a.u_rank_base = rank_base;
    a.u_keys = keys;
    a.u_count = count;
    a.u_words = words;
    a.u_cap = cap;
    return cudaSuccess;
}

template <typename T>
static cudaError_t launch_sparse(sparse_sm90_args &a, const mi_cuda_attn_params *p,
                                 cudaStream_t st) {
    auto kern = attn_sparse_sm90_kernel<T>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)SP_SMEM);
    if (e != cudaSuccess) return e;
    void *scratch = nullptr;
    e = build_union<T>(a, p, st, &scratch);
    if (e == cudaSuccess) {
        /* persistent: one CTA per SM walks the work items, so that an item's start (reading
         * the index, the first loads) overlaps the previous item's end */
        kern<<<dim3(min(a.items, mi_cuda_sm_count())), 384, SP_SMEM, st>>>(a);
        e = cudaGetLastError();
    }
    if (scratch) cudaFreeAsync(scratch, st);
    return e;
}

} // namespace mi_cuda

/* Runs the launch with the sparse kernel when it is asked for (MI_CUDA_SM90_SPARSE=1) and
 * applies: every head sparse, every sequence of the full length and not run dense by dense_below,
 * D = 128, an index of 64-row blocks covering the sequence, tensors TMA can address. *used = 0
 * (and cudaSuccess) otherwise. Not the default: it is faster than the ring kernel where adjacent
 * row blocks share most of their ranges (a band of diagonals) and slower where they share few
 * (scattered diagonals, such as the estimated indexes of the whole-layer prefill benchmark). */
extern "C" cudaError_t mi_cuda_attn_sm90_sparse_launch(const mi_cuda_attn_params *p,
                                                        cudaStream_t st, int *used) {
    *used = 0;
    const char *on = getenv("MI_CUDA_SM90_SPARSE");
    if (!(on && on[0] == '1') || p->head_dim != 128 || !p->block_count ||
        (p->dense_below > 0 && p->len < p->dense_below) ||
        (int64_t)p->row_blocks * 64 < p->len)
        return cudaSuccess;
    for (int h = 0; h < p->heads; ++h)
        if ((p->use_head_modes ? p->head_modes[h].mode : p->mode.mode) != MI_CUDA_MODE_SPARSE)
            return cudaSuccess;
    static thread_local mi_cuda::sparse_sm90_args a; /* tensor maps: off the stack */
    const bool bf16 = p->dtype == MI_DTYPE_BF16;
    if (!mi_cuda::encode_qkv_maps(&a.tm_q, &a.tm_k, &a.tm_v, p, 64)) return cudaSuccess;
    a.k = p->k;
    a.v = p->v;
    a.o = p->o;
    a.lse = p->lse;
    for (int i = 0; i < 3; ++i) {
        a.k_stride[i] = p->k_stride[i];
        a.v_stride[i] = p->v_stride[i];
        a.o_stride[i] = p->o_stride[i];
    }
    a.block_count = p->block_count;
    a.block_offset = p->block_offset;
    a.column_count = p->column_count;
    a.column_index = p->column_index;
    a.row_blocks = p->row_blocks;
    a.max_blocks = p->max_blocks;
    a.max_columns = p->max_columns;
    a.heads = p->heads;
    a.group = p->group;
    a.len = p->len;
    a.scale_log2 = p->scale_log2;
    a.pairs = (p->row_blocks + 1) / 2;
    const int64_t items = (int64_t)a.pairs * p->batch * p->heads;
    if (items > 0x7fffffff) return cudaSuccess;
    a.items = (int)items;
    *used = 1;
    return bf16 ? mi_cuda::launch_sparse<__nv_bfloat16>(a, p, st)
                : mi_cuda::launch_sparse<__half>(a, p, st);
}
