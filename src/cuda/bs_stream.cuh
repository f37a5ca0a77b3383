/*
 * bs_stream.cuh: the streaming block-sparse estimate (top k <= BSS_MAX_K): bs_stream_kernel
 * scores 64 row blocks per CTA with mma.sync against pooled key tiles streamed from the
 * diagonal down and keeps a running top k per row block in shared memory; bs_bound_kernel
 * first gives long rows a lower bound of their k-th score; with few heads, long row groups
 * split into chunks of key tiles that bs_bound_rank_kernel and bs_merge_kernel join.
 */
#ifndef MI_BS_STREAM_CUH
#define MI_BS_STREAM_CUH

#include "bs_chunks.cuh"
#include "bs_rank.cuh"
#include "bs_scores.cuh"
#include "bs_slots.cuh"

namespace mi_cuda {

/* ------------------------------------------------------------------------------------------ */
/* The streaming estimate: tensor-core scores and a running top k per row block                */

/* A CTA of four warps takes 64 adjacent row blocks of one (b, h), a warp 16 of them (the rows of
 * its mma tiles). It streams the pooled keys in tiles of 64 from the diagonal down to block 0
 * through shared memory (cp.async, two stages) and scores them with mma.sync m16n8k16 against
 * the pooled queries held in registers. Each row block keeps candidates in shared memory: every
 * score above its threshold is appended; when the next tile might not fit, the warp keeps the
 * row's top k (warp_keep_top) and raises the threshold to the smallest of them. So the pooled keys
 * are read once per 64 row blocks, not once per three or four as in bs_select_kernel.
 *
 * A candidate is one 64-bit value, (order key of the score) << 32 | ~block: distinct, ordered as
 * the CPU reference ranks (higher score first, lower block first among equal scores; the diagonal
 * and block 0 forced on top). Walking the keys downwards, a row's candidates are appended in
 * descending block order, which compaction keeps, so the kept list read backwards gives the
 * ascending offsets. Downwards also meets the high scores of near-diagonal blocks first, which
 * real heads favour, so the threshold rises early and few candidates are appended.
 *
 * Rows longer than BSS_BOUND_TILES tiles start from a bound that bs_bound_kernel computed before
 * (below), so each row's threshold starts near its k-th score.
 *
 * The candidate slots per row block, CAP: a row compacts to k before an n-tile (up to 8 new
 * candidates a row) could overflow them. 256 slots take a CTA's 64 rows to 172 KB of shared
 * memory, one CTA an SM; 128 slots (108 KB) fit two, for top k up to BSS_NARROW_MAX_K. More
 * slots, compacting less often, would cost more in occupancy than they save. */
constexpr int BSS_ROWS = 64;
constexpr int BSS_NT = 128;
constexpr int BSS_KEYS = 64;
constexpr int BSS_CAP_WIDE = 256, BSS_CAP_NARROW = 128;
/* the largest top k each takes; larger ones would compact too often */
constexpr int BSS_MAX_K = 192, BSS_NARROW_MAX_K = 104;
static_assert(BSS_MAX_K + 8 < BSS_CAP_WIDE && BSS_NARROW_MAX_K + 8 < BSS_CAP_NARROW,
              "candidate slots");
/* CTAs whose rows span more key tiles than this take a bound first */
constexpr int BSS_BOUND_TILES = 4;

/* The row groups' division into chunks of key tiles (bss_plan, bss_work_of, bss_range_of):
 * bs_chunks.cuh. */
__device__ __forceinline__ bss_plan bss_plan_of(const bs_select_params &p) {
    return {p.chunk_tiles, p.groups, p.groups_r, p.split_items};
}

/* A split row's place in the chunk buffers: the streaming pair's rows of the groups from
 * chunk_tiles on (those with more than chunk_tiles tiles). */
__device__ __forceinline__ int64_t bss_split_row(const bs_select_params &p, int b, int h, int m) {
    const int64_t rows = (int64_t)(p.groups_r - p.chunk_tiles) * BSS_ROWS;
    return ((int64_t)b * p.split_heads + p.split_slot[h]) * rows +
           (m - (int64_t)p.chunk_tiles * BSS_ROWS);
}

/* pooled key rows in shared memory are D + 32 values apart: the 16-byte reads of eight lanes
 * (two rows) fall on distinct banks */
template <int D> constexpr int bss_key_stride() { return D + 32; }
template <int D> constexpr size_t bss_key_bytes() {
    return (size_t)2 * BSS_KEYS * bss_key_stride<D>() * 2;
}
/* A row's candidate slots lie cap + 1 apart (8 bytes past their cap), so that the rows of a
 * warp's eight lanes g, at equal counts (as after a compaction), append to different banks. */
__host__ __device__ constexpr int bss_cand_row(int cap) { return cap + 1; }
template <int D> constexpr size_t bss_smem_bytes(int cap) {
    return (size_t)BSS_ROWS * bss_cand_row(cap) * 8 + bss_key_bytes<D>() +
           (size_t)(BSS_NT / 32) * 32 * 8;
}

__device__ __forceinline__ uint64_t bs_candidate(float score, int j, int m) {
    if (j > m) return 0; /* never above a threshold */
    return (uint64_t)bs_rank_key(score, j, m) << 32 | (uint32_t)~j;
}

/* Where lane t of a quad writes its n values when lanes 3 .. 0 write in turn (the sum over the
 * lanes above t); `total` gets the quad's sum. */
__device__ __forceinline__ int quad_offset_down(int n, int t, int &total) {
    int incl = n; /* over lanes t .. 3 */
    int o = __shfl_down_sync(0xffffffffu, incl, 1, 4);
    if (t < 3) incl += o;
    o = __shfl_down_sync(0xffffffffu, incl, 2, 4);
    if (t < 2) incl += o;
    total = __shfl_sync(0xffffffffu, incl, 0, 4);
    return incl - n;
}

/* The key tiles of row group m0 / BSS_ROWS in a sequence of nb blocks. */
__device__ __forceinline__ int bss_group_tiles(int m0, int nb) {
    return (min(m0 + BSS_ROWS, nb) + BSS_KEYS - 1) / BSS_KEYS;
}

/* The part of a streaming CTA (bs_stream_kernel, bs_bound_kernel) that one thread sees: its two
 * row blocks (those of its accumulator rows g and g + 8), their top k, whether they select
 * (otherwise none or every block), and the pooled queries of its warp as mma A fragments. The
 * k index of the mma runs over a permutation of d that A and B share: k-steps 2 s and 2 s + 1
 * take d = 32 s .. 32 s + 31, lane t's four values of a step being d = 32 s + 8 t + 4 (step & 1)
 * + 0..3, so one 16-byte read gives a lane its operands for both steps. */
template <typename T, int D> struct bss_thread {
    int mr[2], kk[2];
    bool sel[2];
    bool warp_sel; /* any row of the warp selects */
    int n_tiles;   /* the key tiles the CTA walks: none where no row selects */
    uint4 qf[2][D / 32];

    /* every thread of the CTA calls it (a barrier) */
    __device__ void init(const bs_select_params &p, int bh, int h, int m0, int wm0, int g, int t,
                         int len) {
        const int nb = (len + 63) / 64;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int m = wm0 + g + 8 * r;
            mr[r] = m;
            kk[r] = bs_row_k(p, h, m, len);
            sel[r] = kk[r] > 0 && kk[r] < m + 1;
        }
        warp_sel = __any_sync(0xffffffffu, sel[0] || sel[1]);
        n_tiles = __syncthreads_or(warp_sel) ? bss_group_tiles(m0, nb) : 0;
        const T *qg = static_cast<const T *>(p.qp) + (int64_t)bh * p.row_blocks * D;
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int s = 0; s < D / 32; ++s)
                qf[r][s] = mr[r] < nb ? __ldg(reinterpret_cast<const uint4 *>(
                                            qg + (int64_t)mr[r] * D + 32 * s + 8 * t))
                                      : make_uint4(0u, 0u, 0u, 0u);
    }

    /* row rr (0 .. 15) of the warp's rows, as every lane sees it: its top k and whether it
     * selects, from the lane that holds it (kk and sel named, not indexed: an indexed member
     * would put the struct in local memory) */
    __device__ __forceinline__ int row_k(int rr) const {
        return __shfl_sync(0xffffffffu, rr < 8 ? kk[0] : kk[1], (rr & 7) * 4);
    }
    __device__ __forceinline__ bool row_sel(int rr) const {
        return __shfl_sync(0xffffffffu, (int)(rr < 8 ? sel[0] : sel[1]), (rr & 7) * 4) != 0;
    }

    /* the scores of the warp's 16 rows against the 64 keys of a tile in shared memory */
    __device__ __forceinline__ void score(const T *kt, int g, int t, float (&acc)[8][4]) const {
        constexpr int KS = bss_key_stride<D>();
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
#pragma unroll
        for (int s = 0; s < D / 32; ++s) {
            const uint32_t a0[4] = {qf[0][s].x, qf[1][s].x, qf[0][s].y, qf[1][s].y};
            const uint32_t a1[4] = {qf[0][s].z, qf[1][s].z, qf[0][s].w, qf[1][s].w};
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const uint4 kv =
                    *reinterpret_cast<const uint4 *>(kt + (8 * nt + g) * KS + 32 * s + 8 * t);
                const uint32_t b0[2] = {kv.x, kv.y}, b1[2] = {kv.z, kv.w};
                mma_16816<T>(acc[nt], a0, b0);
                mma_16816<T>(acc[nt], a1, b1);
            }
        }
    }
};

/* Starts the copy of pooled key tile `it` (keys 64 it .. 64 it + 63, zeros past nb) into dst. */
template <typename T, int D>
__device__ __forceinline__ void bss_load_tile(T *dst, const T *kg, int it, int nb) {
    constexpr int KS = bss_key_stride<D>();
    static_assert(BSS_KEYS * D / 8 % BSS_NT == 0, "16-byte pieces a thread");
#pragma unroll
    for (int i = 0; i < BSS_KEYS * D / 8 / BSS_NT; ++i) {
        const int c = threadIdx.x + i * BSS_NT;
        const int r = c / (D / 8), piece = c % (D / 8), j = it * BSS_KEYS + r;
        const bool ok = j < nb;
        cp_async_16(dst + r * KS + piece * 8, kg + (int64_t)(ok ? j : 0) * D + piece * 8,
                    ok ? 16 : 0);
    }
    cp_async_commit();
}

/* The pooled keys of (b, h)'s KV head. */
template <typename T, int D>
__device__ __forceinline__ const T *bss_keys_of(const bs_select_params &p, int b, int h) {
    const int bhk = b * (p.heads / p.group) + h / p.group;
    return static_cast<const T *>(p.kp) + (int64_t)bhk * p.row_blocks * D;
}

/* Walks key tiles hi - 1 down to lo through the two buffers of kbuf (every thread of the CTA
 * calls it, with the same range): body(it, tile) for each, the next tile loading meanwhile. */
template <typename T, int D, typename Body>
__device__ __forceinline__ void bss_walk_tiles(T *kbuf, const T *kg, bss_range r, int nb,
                                               Body body) {
    constexpr int KS = bss_key_stride<D>();
    if (r.hi <= r.lo) return;
    bss_load_tile<T, D>(kbuf, kg, r.hi - 1, nb);
    for (int it = r.hi - 1, buf = 0; it >= r.lo; --it, buf ^= 1) {
        if (it > r.lo) {
            bss_load_tile<T, D>(kbuf + (buf ^ 1) * BSS_KEYS * KS, kg, it - 1, nb);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        body(it, kbuf + buf * BSS_KEYS * KS);
        __syncthreads(); /* the buffer is loaded again two tiles on */
    }
}

/* The bound kernel. For the CTAs of bs_stream_kernel whose rows span more than BSS_BOUND_TILES
 * tiles, it scores the same tiles for the maxima of G groups of keys per row and tile only, each
 * kept in a fixed slot of shared memory as its top 16 bits (rounding down keeps it at or below a
 * key of its group), so there are no appends and no compactions. A row's bound is the k-th
 * largest of its maxima: k distinct blocks reach it, so the row's k-th largest score key is at
 * least that. G is the largest power of two up to 32 whose maxima fit the BSB_SLOTS slots (1M:
 * 2, 128K: 16); past that, tiles share slots, a slot keeping the largest of their groups' maxima:
 * still the maximum of a set of distinct blocks, so the bound holds. 512 slots give finer groups,
 * so tighter bounds, than 256 on near-diagonal scores. */
constexpr int BSB_SLOTS = 512;
/* A row's slots in shared memory are BSB_ROW apart: 16 bytes past the 1 KB of its slots, so the
 * rows of a warp's eight lanes g fall on different banks (1 KB apart, every update of a slot was
 * an eight-way conflict). */
constexpr int BSB_ROW = BSB_SLOTS + 8;
/* A chunk's window of a row's slots: 1, 2 or 4 windows (BSS_SPLIT_MAX). */
__device__ __forceinline__ int bsb_window(int chunks) {
    return chunks == 1 ? BSB_SLOTS : chunks == 2 ? BSB_SLOTS / 2 : BSB_SLOTS / 4;
}
static_assert(BSS_SPLIT_MAX == 4, "bsb_window");
template <int D> constexpr size_t bsb_smem_bytes() {
    return (size_t)BSS_ROWS * BSB_ROW * 2 + bss_key_bytes<D>();
}

/* The maxima of the groups of a lane's 16 keys of one row (two per n-tile) when a tile has G
 * groups: runs of 32 / G n-tiles (G >= 4), or the lane's keys with those of the next one or
 * three lanes of its quad (G = 2, 1). Group i of the lane ends in key[i * span]. */
template <int G, typename V, typename Max>
__device__ __forceinline__ void bsb_group_max(V (&key)[8], Max mx) {
    constexpr int span = G >= 4 ? 32 / G : 8;
#pragma unroll
    for (int w = 1; w < span; w <<= 1)
#pragma unroll
        for (int nt = 0; nt < 8; nt += 2 * w) key[nt] = mx(key[nt], key[nt + w]);
    if (G < 4) key[0] = mx(key[0], __shfl_xor_sync(0xffffffffu, key[0], 1));
    if (G < 2) key[0] = mx(key[0], __shfl_xor_sync(0xffffffffu, key[0], 2));
}

/* One tile's group maxima of a thread's two rows (rows[0] and rows[8 * BSB_ROW]), G groups a
 * tile (a compile-time G: runtime spans had cost divisions and branches at every key, and twice
 * the bound kernel's time), written to slots first .. first + G - 1 (modulo the window, mask + 1
 * slots), each keeping the largest. */
template <int G>
__device__ __forceinline__ void bsb_tile_maxima(const float (&acc)[8][4], bool plain, int j0,
                                                const int (&m)[2], int t, uint16_t *rows, int first,
                                                int mask) {
    constexpr int lane_groups = G >= 4 ? G / 4 : 1, span = 8 / lane_groups;
    const bool lane_on = G >= 4 || (t & (4 / G - 1)) == 0;
    const int group0 = G >= 4 ? t * lane_groups : G == 2 ? t >> 1 : 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        uint32_t key[8];
        if (plain) {
            /* float maxima, one order key a group: fmaxf passes NaN over, which can only lower
             * a maximum to another key of its group */
            float f[8];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) f[nt] = fmaxf(acc[nt][2 * r], acc[nt][2 * r + 1]);
            bsb_group_max<G>(f, [](float a, float c) { return fmaxf(a, c); });
#pragma unroll
            for (int nt = 0; nt < 8; nt += span) key[nt] = bs_score_key(f[nt]);
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const int jl = j0 + 8 * nt + 2 * t;
                const uint32_t k0 = jl <= m[r] ? bs_rank_key(acc[nt][2 * r], jl, m[r]) : 0;
                const uint32_t k1 =
                    jl + 1 <= m[r] ? bs_rank_key(acc[nt][2 * r + 1], jl + 1, m[r]) : 0;
                key[nt] = max(k0, k1);
            }
            bsb_group_max<G>(key, [](uint32_t a, uint32_t c) { return max(a, c); });
        }
        uint16_t *row = rows + 8 * r * BSB_ROW;
        if (lane_on)
#pragma unroll
            for (int nt = 0; nt < 8; nt += span) {
                const int slot = (first + group0 + nt / span) & mask;
                const uint16_t v = (uint16_t)(key[nt] >> 16);
                if (v > row[slot]) row[slot] = v;
            }
    }
}

/* The largest x (a score key's top 16 bits, returned in place) that at least k of the 16-bit
 * maxima row[0 .. n) reach (n a multiple of 64, at most BSB_SLOTS), bit by bit; a lane counts its
 * slots two at a time (halfword compares). Every lane of the warp calls it. */
__device__ __forceinline__ uint32_t bsb_row_bound(const uint16_t *row16, int n, int k) {
    const int lane = threadIdx.x & 31;
    const uint32_t *row = reinterpret_cast<const uint32_t *>(row16);
    uint32_t v[BSB_SLOTS / 64];
#pragma unroll
    for (int i = 0; i < BSB_SLOTS / 64; ++i) v[i] = 64 * i < n ? row[32 * i + lane] : 0u;
    uint32_t x = 0;
#pragma unroll 1
    for (int bit = 15; bit >= 0; --bit) {
        const uint32_t c = x | 1u << bit;
        int cnt = 0;
#pragma unroll
        for (int i = 0; i < BSB_SLOTS / 64; ++i) cnt += __popc(__vcmpgeu2(v[i], c * 0x10001u));
        /* (a halfword compare sets 16 bits) */
        if ((int)__reduce_add_sync(0xffffffffu, (unsigned)cnt) >= 16 * k) x = c;
    }
    return x << 16;
}

template <typename T, int D>
__global__ void __launch_bounds__(BSS_NT, 2)
    bs_bound_kernel(const __grid_constant__ bs_select_params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    T *kbuf = reinterpret_cast<T *>(smem);                                      /* [2][64][KS] */
    uint16_t *maxima = reinterpret_cast<uint16_t *>(smem + bss_key_bytes<D>()); /* [64][BSB_ROW] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    /* the work items of all (b, h) in turn, so that every head's longest come first */
    const int bh = (int)(blockIdx.x % (unsigned)p.bh);
    const int b = bh / p.heads, h = bh % p.heads;
    const bss_work w = bss_work_of(bss_plan_of(p), (int)(blockIdx.x / (unsigned)p.bh));
    const int m0 = w.group * BSS_ROWS;
    if (!p.active[h] || m0 >= p.idx_row_blocks) return;
    const int len = bs_seq_len(p, b);
    const int nb = (len + 63) / 64;
    const int wm0 = m0 + 16 * warp;
    bss_thread<T, D> th;
    th.init(p, bh, h, m0, wm0, g, t, len);
    if (th.n_tiles <= BSS_BOUND_TILES) return; /* the streaming kernel takes no bound here */
    const bss_range range = bss_range_of(w, th.n_tiles);
    /* a chunk's window of each row's slots, G groups a tile: as many as the chunk's tiles fit */
    const int window = bsb_window(w.chunks);
    int G = p.bound_groups > 0 ? p.bound_groups : 32;
    if (p.bound_groups <= 0)
        while (G > 1 && range.span * G > window) G >>= 1;
    for (int i = threadIdx.x; i < BSS_ROWS * BSB_ROW / 8; i += BSS_NT)
        reinterpret_cast<uint4 *>(maxima)[i] = make_uint4(0u, 0u, 0u, 0u);
    const int m[2] = {th.mr[0], th.mr[1]};
    bss_walk_tiles<T, D>(kbuf, bss_keys_of<T, D>(p, b, h), range, nb, [&](int it, const T *tile) {
        const int j0 = it * BSS_KEYS;
        /* a plain tile: every key below every row's diagonal, none of them block 0 */
        const bool plain = it > 0 && j0 + BSS_KEYS <= wm0;
        if (!th.warp_sel || j0 > wm0 + 15) return;
        float acc[8][4];
        th.score(tile, g, t, acc);
        /* the tile's first slot (a group's slot wraps at most once past it) */
        const int first = ((it - range.lo) * G) & (window - 1), mask = window - 1;
        uint16_t *rows = maxima + (16 * warp + g) * BSB_ROW;
        switch (G) {
        case 1: bsb_tile_maxima<1>(acc, plain, j0, m, t, rows, first, mask); break;
        case 2: bsb_tile_maxima<2>(acc, plain, j0, m, t, rows, first, mask); break;
        case 4: bsb_tile_maxima<4>(acc, plain, j0, m, t, rows, first, mask); break;
        case 8: bsb_tile_maxima<8>(acc, plain, j0, m, t, rows, first, mask); break;
        case 16: bsb_tile_maxima<16>(acc, plain, j0, m, t, rows, first, mask); break;
        default: bsb_tile_maxima<32>(acc, plain, j0, m, t, rows, first, mask); break;
        }
    });
    if (!th.warp_sel) return;

    if (w.chunks > 1) {
        /* the window goes to the row's slots in memory, for bs_bound_rank_kernel (every chunk
         * writes its window, an empty chunk zeros) */
        __syncwarp();
        for (int rr = 0; rr < 16; ++rr) {
            const uint4 *src = reinterpret_cast<const uint4 *>(maxima + (16 * warp + rr) * BSB_ROW);
            uint4 *dst = reinterpret_cast<uint4 *>(
                p.split_maxima + bss_split_row(p, b, h, wm0 + rr) * BSB_SLOTS + w.chunk * window);
            for (int i = lane; i < window / 8; i += 32) dst[i] = src[i];
        }
        return;
    }
    /* each row's bound: the k-th largest of its maxima */
#pragma unroll 1
    for (int rr = 0; rr < 16; ++rr) {
        const int k = th.row_k(rr);
        if (!th.row_sel(rr)) continue;
        const uint32_t x = bsb_row_bound(maxima + (16 * warp + rr) * BSB_ROW, BSB_SLOTS, k);
        if (lane == 0) p.bound[(int64_t)bh * p.row_blocks + wm0 + rr] = x;
    }
}

/* The row of a split group that a warp of bs_bound_rank_kernel or bs_merge_kernel takes (a warp
 * a row from the first split group on, BSS_NT / 32 rows a CTA, grid y the (b, h) pairs): its top
 * k, whether it selects, and its group's chunks; none (valid false) past the index or in a head
 * the launch does not take. */
struct bss_split_warp {
    bool valid, sel;
    int b, h, bh, m, len, k, chunks;
};
__device__ __forceinline__ bss_split_warp bss_split_warp_of(const bs_select_params &p) {
    bss_split_warp w;
    w.bh = blockIdx.y;
    w.b = w.bh / p.heads;
    w.h = w.bh % p.heads;
    w.m = p.chunk_tiles * BSS_ROWS + blockIdx.x * (BSS_NT / 32) + (threadIdx.x >> 5);
    w.valid = p.active[w.h] && w.m < p.idx_row_blocks;
    if (!w.valid) return w;
    w.len = bs_seq_len(p, w.b);
    w.k = bs_row_k(p, w.h, w.m, w.len);
    w.sel = w.k > 0 && w.k < w.m + 1;
    w.chunks = bss_group_chunks(w.m / BSS_ROWS, p.chunk_tiles);
    return w;
}

/* The rows of split groups (a warp each): the k-th largest of the group maxima that the bound
 * kernel's chunks wrote to their windows, as bs_bound_kernel does for the rows of one CTA. */
__global__ void __launch_bounds__(BSS_NT)
    bs_bound_rank_kernel(const __grid_constant__ bs_select_params p) {
    const bss_split_warp w = bss_split_warp_of(p);
    if (!w.valid || !w.sel) return;
    /* the streaming kernel's test: the tiles of the row's group */
    if (bss_group_tiles(w.m / BSS_ROWS * BSS_ROWS, (w.len + 63) / 64) <= BSS_BOUND_TILES) return;
    const uint32_t x = bsb_row_bound(p.split_maxima + bss_split_row(p, w.b, w.h, w.m) * BSB_SLOTS,
                                     bsb_window(w.chunks) * w.chunks, w.k);
    if ((threadIdx.x & 31) == 0) p.bound[(int64_t)w.bh * p.row_blocks + w.m] = x;
}

/* Writes row block `row` of the index (every lane of the warp calls it): its k blocks in
 * ascending order, the candidates c[k - 1] .. c[0] (kept in descending block order) where the
 * row selects, else blocks 0 .. k - 1 (none or every block). */
__device__ __forceinline__ void bss_write_row(const bs_select_params &p, int64_t row, int k,
                                              bool sel, const uint64_t *c) {
    const int lane = threadIdx.x & 31;
    int32_t *off = p.block_offset + row * p.max_blocks;
    if (lane == 0) {
        p.block_count[row] = k;
        p.column_count[row] = 0;
    }
    for (int i = lane; i < k; i += 32) off[i] = 64 * (sel ? (int)~(uint32_t)c[k - 1 - i] : i);
}

/* A row's candidate count and threshold. */
struct bss_row_state {
    int cnt;
    uint64_t thr;
};

/* Keeps the top k of each row of `rows` (the warp's 8 rows of one accumulator half, CAP slots
 * apart) that `need` marks at its quad's first lane, and returns this thread's row's count and
 * threshold after that. Not inlined: the streaming kernel calls it before every n-tile, and 16
 * inlined copies of warp_keep_top would crowd the instruction cache; the call is rare. */
template <int CAP>
__device__ __noinline__ bss_row_state bss_keep_top(uint64_t *rows, unsigned need, bss_row_state me,
                                                   int k, uint64_t *scratch) {
    const int g = (threadIdx.x & 31) >> 2;
    while (need) {
        const int src = __ffs(need) - 1;
        need &= need - 1;
        const int n_c = __shfl_sync(0xffffffffu, me.cnt, src);
        const int k_c = __shfl_sync(0xffffffffu, k, src);
        const uint64_t low =
            warp_keep_top<CAP / 32>(rows + (src >> 2) * bss_cand_row(CAP), n_c, k_c, scratch);
        if (g == (src >> 2)) me = {k_c, low};
    }
    return me;
}

template <typename T, int D, int CAP>
__global__ void __launch_bounds__(BSS_NT, CAP == BSS_CAP_NARROW ? 2 : 1)
    bs_stream_kernel(const __grid_constant__ bs_select_params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int KS = bss_key_stride<D>();
    uint64_t *cand = reinterpret_cast<uint64_t *>(smem); /* [BSS_ROWS][CROW] */
    constexpr int CROW = bss_cand_row(CAP);
    T *kbuf = reinterpret_cast<T *>(smem + (size_t)BSS_ROWS * CROW * 8); /* [2][64][KS] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    /* the warp's 32 values for warp_keep_top */
    uint64_t *scratch = reinterpret_cast<uint64_t *>(kbuf + 2 * BSS_KEYS * KS) + 32 * warp;
    /* the work items of all (b, h) in turn, so that every head's longest come first */
    const int bh = (int)(blockIdx.x % (unsigned)p.bh);
    const int b = bh / p.heads, h = bh % p.heads;
    const bss_work w = bss_work_of(bss_plan_of(p), (int)(blockIdx.x / (unsigned)p.bh));
    const int m0 = w.group * BSS_ROWS;
    if (!p.active[h] || m0 >= p.idx_row_blocks) return;
    const int len = bs_seq_len(p, b);
    const int nb = (len + 63) / 64; /* the sequence's blocks */
    const int wm0 = m0 + 16 * warp;
    bss_thread<T, D> th;
    th.init(p, bh, h, m0, wm0, g, t, len);
    const bool bounded = p.bound != nullptr && th.n_tiles > BSS_BOUND_TILES;
    int cnt[2] = {0, 0};
    uint64_t thr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        /* the bound x admits every block whose score key reaches it */
        const uint32_t x =
            bounded && th.sel[r] ? p.bound[(int64_t)bh * p.row_blocks + th.mr[r]] : 0u;
        thr[r] = th.sel[r] ? (x > 0 ? ((uint64_t)x << 32) - 1 : 0) : ~0ull;
    }
    const T *kg = bss_keys_of<T, D>(p, b, h);
    /* keeps the top k of this warp's selecting rows that hold more than `limit` candidates
     * (limit < 0: more than k) */
    auto shrink = [&](int limit) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned need = __ballot_sync(
                0xffffffffu, t == 0 && th.sel[r] && cnt[r] > (limit < 0 ? th.kk[r] : limit));
            if (need) {
                const bss_row_state now = bss_keep_top<CAP>(cand + (16 * warp + 8 * r) * CROW, need,
                                                            {cnt[r], thr[r]}, th.kk[r], scratch);
                cnt[r] = now.cnt;
                thr[r] = now.thr;
            }
        }
    };

    bss_walk_tiles<T, D>(kbuf, kg, bss_range_of(w, th.n_tiles), nb, [&](int it, const T *tile) {
        const int j0 = it * BSS_KEYS;
        /* a plain tile: every key below every row's diagonal, none of them block 0, so each
         * key is its score's order key */
        const bool plain = it > 0 && j0 + BSS_KEYS <= wm0;
        if (th.warp_sel && j0 <= wm0 + 15) {
            float acc[8][4];
            th.score(tile, g, t, acc);
            /* in a plain tile, the n-tiles where no score can reach its row's threshold key are
             * passed over (one float compare a score; NaN goes on to the exact test). may[r]
             * marks the keys that pass that compare: key j0 + 8 nt + 2 t + e at bit
             * bss_own_bit(nt, e) of word nt / 4 (bs_slots.cuh) */
            unsigned nt_on = 0xffu;
            uint32_t may[2][2] = {{0u, 0u}, {0u, 0u}};
            if (plain) {
                float lim[2];
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    lim[r] = th.sel[r] ? float_of_order_key((uint32_t)(thr[r] >> 32)) : INFINITY;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        if (!(acc[nt][i] < lim[i >> 1]))
                            may[i >> 1][nt >> 2] |= 1u << bss_own_bit(nt, i & 1);
                /* bit nt: any of the lane's keys of n-tile nt passes (byte nt % 4 of word nt / 4
                 * not 0, its bits gathered by a multiply) */
                unsigned reach = 0;
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    uint32_t x = (may[0][w] | may[1][w]) & 0x03030303u;
                    x = (x | x >> 1) & 0x01010101u;
                    reach |= (x * 0x01020408u) >> 24 << (4 * w);
                }
                nt_on = __reduce_or_sync(0xffffffffu, reach);
            }
            /* A plain tile's appends at once, where every row has room for all the keys its
             * mask passes and each of them is above its threshold (the common case once the
             * threshold is near the k-th score): each key's slot is the row's count plus the
             * row's keys above it in the tile (the quad's masks joined), so the candidates land
             * where the appends below would put them, in the same order, with no dependence
             * from one n-tile to the next. Where a row lacks the room (a compaction is due) or a
             * passed key is not a candidate (a score equal to the threshold's, NaN), it returns
             * false having moved nothing (what it wrote lies past the counts) and the appends
             * below take the tile. */
            auto append_masked = [&]() -> bool {
                uint64_t above[2];
                int total[2];
                bool fits = true;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    uint32_t lo, hi;
                    bss_lane_row_mask(may[r][0], may[r][1], t, lo, hi);
                    lo |= __shfl_xor_sync(0xffffffffu, lo, 1);
                    hi |= __shfl_xor_sync(0xffffffffu, hi, 1);
                    lo |= __shfl_xor_sync(0xffffffffu, lo, 2);
                    hi |= __shfl_xor_sync(0xffffffffu, hi, 2);
                    total[r] = __popc(lo) + __popc(hi);
                    fits &= cnt[r] + total[r] <= CAP;
                    /* bit 8 nt + e: this lane's key of n-tile nt, column e */
                    above[r] = ((uint64_t)hi << 32 | lo) >> (2 * t);
                }
                if (!__all_sync(0xffffffffu, fits)) return false;
                bool exact = true;
#pragma unroll
                for (int nt = 7; nt >= 0; --nt) {
                    if (!((nt_on >> nt) & 1u)) continue;
#pragma unroll
                    for (int r = 0; r < 2; ++r)
#pragma unroll
                        for (int e = 1; e >= 0; --e) {
                            if (!((may[r][nt >> 2] >> bss_own_bit(nt, e)) & 1u)) continue;
                            const int j = j0 + 8 * nt + 2 * t + e;
                            const uint64_t c =
                                (uint64_t)bs_score_key(acc[nt][2 * r + e]) << 32 | (uint32_t)~j;
                            exact &= c > thr[r];
                            const int pos = cnt[r] + bss_keys_above(above[r], nt, e);
                            cand[(16 * warp + g + 8 * r) * CROW + pos] = c;
                        }
                }
                if (__any_sync(0xffffffffu, !exact)) return false;
                cnt[0] += total[0];
                cnt[1] += total[1];
                return true;
            };
            /* (not where a lane's own keys, four times over, would not fit its row: a tile full of
             * candidates, as near the diagonal, needs a compaction anyway) */
            if (plain && nt_on != 0 && p.mask_append) {
                bool likely = true;
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    likely &= cnt[r] + 4 * (__popc(may[r][0]) + __popc(may[r][1])) <= CAP;
                if (__all_sync(0xffffffffu, likely) && append_masked()) return;
            }
            /* append, highest block first: n-tiles downwards, lanes 3 .. 0 of a quad, and the
             * second column of a lane before its first. A plain tile's candidates need no
             * diagonal or block-0 tests (a compile-time branch) */
            auto append = [&](auto plain_tile) {
                constexpr bool PLAIN = decltype(plain_tile)::value;
#pragma unroll
                for (int nt = 7; nt >= 0; --nt) {
                    if (!((nt_on >> nt) & 1u)) continue;
                    shrink(CAP - 8); /* room for the n-tile */
                    const int jl = j0 + 8 * nt + 2 * t;
                    uint64_t c[2][2];
                    bool f[2][2];
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const float sc = acc[nt][2 * r + 1 - e];
                            const int j = jl + 1 - e;
                            c[r][e] = PLAIN ? (uint64_t)bs_score_key(sc) << 32 | (uint32_t)~j
                                            : bs_candidate(sc, j, th.mr[r]);
                            f[r][e] = c[r][e] > thr[r];
                        }
                    }
                    if (!__any_sync(0xffffffffu, f[0][0] || f[0][1] || f[1][0] || f[1][1]))
                        continue;
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int n = f[r][0] + f[r][1];
                        int total;
                        int pos = cnt[r] + quad_offset_down(n, t, total);
                        uint64_t *row = cand + (16 * warp + g + 8 * r) * CROW;
                        if (f[r][0]) row[pos++] = c[r][0];
                        if (f[r][1]) row[pos] = c[r][1];
                        cnt[r] += total;
                    }
                }
            };
            if (plain)
                append(std::true_type{});
            else
                append(std::false_type{});
        }
    });

    /* exactly k per selecting row (at most k in a chunk), then the offsets, ascending */
    if (th.warp_sel) shrink(-1);
    __syncwarp();
    if (w.chunks > 1) {
        /* a chunk's candidates go to memory, for bs_merge_kernel */
        if (!th.warp_sel) return;
#pragma unroll 1
        for (int rr = 0; rr < 16; ++rr) {
            /* (named, not indexed: an indexed array would go to local memory) */
            const int n = __shfl_sync(0xffffffffu, rr < 8 ? cnt[0] : cnt[1], (rr & 7) * 4);
            if (!th.row_sel(rr)) continue;
            const int64_t sr = bss_split_row(p, b, h, wm0 + rr) * BSS_SPLIT_MAX + w.chunk;
            const uint64_t *c = cand + (16 * warp + rr) * CROW;
            uint64_t *dst = p.split_cand + sr * BSS_MAX_K;
            for (int i = lane; i < n; i += 32) dst[i] = c[i];
            if (lane == 0) p.split_count[sr] = n;
        }
        return;
    }
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) {
        const int m = wm0 + rr, k = th.row_k(rr);
        const bool s = th.row_sel(rr);
        if (m >= p.idx_row_blocks) continue;
        bss_write_row(p, (int64_t)bh * p.idx_row_blocks + m, k, s, cand + (16 * warp + rr) * CROW);
    }
}

/* The rows of split groups (a warp each, BSS_NT / 32 a CTA): the top k of the union of the
 * chunks' candidates, which come in descending block order (chunk 0 holds the highest tiles,
 * each chunk's list is in that order), so the kept list read backwards gives the ascending
 * offsets as in bs_stream_kernel. Rows that do not select get none or every block. */
constexpr int BSM_SLOTS = BSS_SPLIT_MAX * BSS_MAX_K / 32; /* warp_keep_top's values a lane */
__global__ void __launch_bounds__(BSS_NT)
    bs_merge_kernel(const __grid_constant__ bs_select_params p) {
    __shared__ uint64_t lists[BSS_NT / 32][BSS_SPLIT_MAX * BSS_MAX_K];
    __shared__ uint64_t scratch[BSS_NT / 32][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bss_split_warp w = bss_split_warp_of(p);
    if (!w.valid) return;
    const int64_t row = (int64_t)w.bh * p.idx_row_blocks + w.m;
    if (!w.sel) {
        bss_write_row(p, row, w.k, false, nullptr);
        return;
    }
    const int64_t sr = bss_split_row(p, w.b, w.h, w.m) * BSS_SPLIT_MAX;
    uint64_t *c = lists[warp];
    int n = 0;
    for (int s = 0; s < w.chunks; ++s) {
        const int n_s = p.split_count[sr + s];
        const uint64_t *src = p.split_cand + (sr + s) * BSS_MAX_K;
        for (int i = lane; i < n_s; i += 32) c[n + i] = src[i];
        n += n_s;
    }
    __syncwarp();
    /* at least k: k distinct blocks reach the bound (or, without one, every chunk admits all).
     * warp_keep_top sized to the list: its samples are spread over all its slots, and with
     * most of them past the list it brackets the k-th value badly and falls back to its
     * quickselect */
    const int k = min(w.k, n);
    if (k > 0 && k < n) {
        uint64_t *sc = scratch[warp];
        if (n <= 128)
            warp_keep_top<4>(c, n, k, sc);
        else if (n <= 256)
            warp_keep_top<8>(c, n, k, sc);
        else if (n <= 384)
            warp_keep_top<12>(c, n, k, sc);
        else if (n <= 512)
            warp_keep_top<16>(c, n, k, sc);
        else
            warp_keep_top<BSM_SLOTS>(c, n, k, sc);
    }
    bss_write_row(p, row, k, true, c);
}

} // namespace mi_cuda

#endif
