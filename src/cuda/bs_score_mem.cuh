/*
 * bs_score_mem.cuh: the scoring half of the block-sparse estimate through scores in memory
 * (long sequences): bs_score_kernel (mma.sync) and bs_score_wg_kernel (wgmma, Hopper) write
 * every pooled score of the causal triangle as its 16-bit order key, and each group of
 * BSR_GROUP_KEYS keys' summary, in the layout of bs_scores.cuh; bs_row_select.cuh selects
 * from them.
 */
#ifndef MI_BS_SCORE_MEM_CUH
#define MI_BS_SCORE_MEM_CUH

#include "bs_scores.cuh"
#include "bs_stream.cuh"
#include "sm90_common.cuh"

namespace mi_cuda {

/* ------------------------------------------------------------------------------------------ */
/* The estimate through scores in memory: a tensor-core pass writes every pooled score of the    */
/* causal triangle to memory as its order key, then a CTA per row block selects from them.       */

/* The layout of the keys and group summaries in memory (bsr_row_base, bsr_pair_summaries, ...) and
 * the bit-by-bit k-th largest: bs_scores.cuh. */
static_assert(BSR_ROWS == BSS_ROWS && BSR_TILE_KEYS == BSS_KEYS, "the streaming kernel's tiles");

/* staged words a row, two 16-bit keys each: 16-byte aligned, no bank conflicts either way */
constexpr int BSR_STAGE_ROW = BSS_KEYS / 2 + 4;

/* The 16-bit order keys (bs_score_key's upper halves) of scores a and b, a in the low half: the
 * upper halves of their bits gathered, then each half with its sign set flipped whole, else its
 * sign bit set (one byte permutation replicates each half's sign over it). */
__device__ __forceinline__ uint32_t bsr_key16x2(float a, float b) {
    const uint32_t x = __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);
    uint32_t sign;
    asm("prmt.b32 %0, %1, 0, 0xbb99;" : "=r"(sign) : "r"(x));
    return x ^ (sign | 0x80008000u);
}

/* What both score kernels do with a warp's 16 x 64 scores of key tile `it`, s[4 nt + i] in the
 * mma / wgmma accumulator layout (lane g, t: rows mr[0] and mr[1] in i = 0, 1 and 2, 3, keys
 * 8 nt + 2 t + (i & 1)), in two steps. bsr_pack_tile: the 16-bit order keys (bs_rank_key's
 * upper halves, zeros past the diagonal), two a word, key[8 r + nt] for row mr[r]. Then
 * bsr_store_keys: the keys staged in shared memory and written a row's 128 bytes at a time for
 * the rows in sel_rows (the warp's rows start at out, row_len keys apart), and each 16-key
 * group's summary (bsr_summary_16x2: two lanes' halves, merged) handed to put_sum(on, i, rr,
 * group, summary), on for one lane a group of a selecting row; step i covers the warp's rows
 * 4 i .. 4 i + 3, one a quarter warp. The wgmma kernel packs a tile before the next tile's
 * product overwrites its accumulators, so that one set of 32 serves both (with two, ptxas
 * copies the finished one out after every product). */
__device__ __forceinline__ void bsr_pack_tile(const float *s, int it, const int (&mr)[2], int t,
                                              uint32_t (&key)[16]) {
    /* a tile past block 0 and before every row's diagonal (most of them): each key is its
     * score's order key, no block is forced and none lies past its row (mr[0] of lane 0 is the
     * warp's first row) */
    const int first_row = __shfl_sync(0xffffffffu, mr[0], 0);
    if (it > 0 && (it + 1) * BSS_KEYS <= first_row) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                key[8 * r + nt] = bsr_key16x2(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]);
    } else {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int m = mr[r];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const int j = it * BSS_KEYS + 8 * nt + 2 * t;
                const uint32_t k0 = j <= m ? bs_rank_key(s[4 * nt + 2 * r], j, m) : 0u;
                const uint32_t k1 = j + 1 <= m ? bs_rank_key(s[4 * nt + 2 * r + 1], j + 1, m) : 0u;
                key[8 * r + nt] = __byte_perm(k0, k1, 0x7632);
            }
        }
    }
}
template <typename PutSum>
__device__ __forceinline__ void bsr_store_keys(const uint32_t (&key)[16], int it, int g, int t,
                                               int lane, uint32_t *stage, unsigned sel_rows,
                                               uint16_t *out, int row_len, PutSum put_sum) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
            stage[(g + 8 * r) * BSR_STAGE_ROW + 4 * nt + t] = key[8 * r + nt];
    __syncwarp();
    /* four rows a store: a quarter warp a row, eight keys a lane; the lane's address and row
     * bits worked out once (per store they had been a 64-bit product and sum, and a branch) */
    const int quarter = lane >> 3, c = 4 * (lane & 7);
    const unsigned sel_quarter = sel_rows >> quarter; /* bit 4 i: row 4 i + quarter */
    const uint32_t *stage_q = stage + quarter * BSR_STAGE_ROW + c;
    uint16_t *out_q = out + (int64_t)quarter * row_len + it * BSS_KEYS + 2 * c;
    const int64_t out_step = 4 * (int64_t)row_len;
    const bool lead = (lane & 1) == 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint4 v = *reinterpret_cast<const uint4 *>(stage_q + 4 * i * BSR_STAGE_ROW);
        const bool sel = (sel_quarter >> (4 * i)) & 1u;
        st_global_v4_if(sel, out_q + i * out_step, v);
        uint32_t top, second;
        bsr_top2_16x2_of4({v.x, v.y, v.z, v.w}, top, second);
        bsr_top2_16x2_merge(top, second, __shfl_xor_sync(0xffffffffu, top, 1),
                            __shfl_xor_sync(0xffffffffu, second, 1));
        put_sum(lead && sel, i, 4 * i + quarter, (lane & 7) >> 1, bsr_summary_16x2(top, second));
    }
    __syncwarp(); /* the stage is written again by the next tile */
}
template <typename PutSum>
__device__ __forceinline__ void bsr_store_tile(const float *s, int it, const int (&mr)[2], int g,
                                               int t, int lane, uint32_t *stage, unsigned sel_rows,
                                               uint16_t *out, int row_len, PutSum put_sum) {
    uint32_t key[16];
    bsr_pack_tile(s, it, mr, t, key);
    bsr_store_keys(key, it, g, t, lane, stage, sel_rows, out, row_len, put_sum);
}

/* The key tiles one CTA of bs_score_kernel scores, by default. */
constexpr int BSR_CHUNK_TILES = 8;

/* Where a CTA of either score kernel works: the pair (z among the launch's, bh, b, h), the row
 * group from m0 and the warp's rows from wm0, key tiles from lo on; false where it has nothing
 * to score. */
struct bsr_score_place {
    int z, bh, b, h, group, m0, lo, len, nb, wm0;
    /* the keys a row of the group takes (its rows lie that far apart) */
    __device__ __forceinline__ int row_len() const { return BSS_KEYS * (group + 1); }
    /* where the keys and the group summaries of the warp's first row go */
    __device__ __forceinline__ uint16_t *keys_out(const bs_select_params &p, int warp) const {
        return p.scores + (int64_t)z * p.score_pair_keys + bsr_group_base(group) +
               (int64_t)(16 * warp) * row_len();
    }
    __device__ __forceinline__ uint32_t *sums_out(const bs_select_params &p) const {
        return p.score_sums + (int64_t)z * bsr_pair_summaries(p.row_blocks) +
               (int64_t)wm0 * p.score_sum_stride;
    }
};
__device__ __forceinline__ bool bsr_score_place_of(const bs_select_params &p, int warp,
                                                   bsr_score_place &w) {
    w.z = blockIdx.z;
    w.bh = p.score_bh0 + w.z;
    w.b = w.bh / p.heads;
    w.h = w.bh % p.heads;
    w.group = (int)(gridDim.y - 1 - blockIdx.y);
    w.m0 = w.group * BSS_ROWS;
    w.lo = (int)blockIdx.x * p.score_chunk_tiles;
    if (!p.active[w.h] || w.m0 >= p.idx_row_blocks || w.lo > w.group) return false;
    w.len = bs_seq_len(p, w.b);
    w.nb = (w.len + 63) / 64;
    w.wm0 = w.m0 + 16 * warp;
    return w.m0 < w.nb;
}

/* Grid (chunks of score_chunk_tiles key tiles, row groups longest first, pairs): the scores of a
 * row group's 64 row blocks against one chunk of key tiles, computed as bs_stream_kernel computes
 * them (bss_thread::score, the same sums in the same order), written as bs_rank_key with each
 * group of BSR_GROUP_KEYS keys' summary (bsr_store_tile; the chunk's summaries staged and written
 * 16 bytes at a time). Rows that take none or every block are not written (the select does not
 * read them). */
/* the group summaries of a chunk's tiles, a row's BSR_GROUPS x BSR_MAX_CHUNK_TILES */
constexpr int BSR_MAX_CHUNK_TILES = 8;
constexpr int BSR_SUM_ROW = BSR_GROUPS * BSR_MAX_CHUNK_TILES + 4;
template <int D> constexpr size_t bsr_score_smem() {
    return bss_key_bytes<D>() + (size_t)BSS_ROWS * (BSR_STAGE_ROW + BSR_SUM_ROW) * 4;
}
template <typename T, int D>
__global__ void __launch_bounds__(BSS_NT, 3)
    bs_score_kernel(const __grid_constant__ bs_select_params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    T *kbuf = reinterpret_cast<T *>(smem); /* [2][64][KS] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t *stage = reinterpret_cast<uint32_t *>(smem + bss_key_bytes<D>()) +
                      16 * warp * BSR_STAGE_ROW; /* [16][BSR_STAGE_ROW] */
    uint32_t *stage_sum = reinterpret_cast<uint32_t *>(smem + bss_key_bytes<D>()) +
                          BSS_ROWS * BSR_STAGE_ROW + 16 * warp * BSR_SUM_ROW; /* [16][..] */
    bsr_score_place w;
    if (!bsr_score_place_of(p, warp, w)) return;
    const int bh = w.bh, b = w.b, h = w.h, m0 = w.m0, lo = w.lo;
    const int len = w.len, nb = w.nb, wm0 = w.wm0;
    bss_thread<T, D> th;
    th.init(p, bh, h, m0, wm0, g, t, len);
    if (th.n_tiles == 0) return;
    const bss_range range = {lo, min(lo + p.score_chunk_tiles, th.n_tiles), 0};
    unsigned sel_rows = 0; /* bit rr: the warp's row rr selects (its keys are written) */
    for (int rr = 0; rr < 16; ++rr) sel_rows |= (unsigned)th.row_sel(rr) << rr;
    const int row_len = w.row_len();
    uint16_t *out = w.keys_out(p, warp);
    uint32_t *sums_out = w.sums_out(p);
    bss_walk_tiles<T, D>(kbuf, bss_keys_of<T, D>(p, b, h), range, nb, [&](int it, const T *tile) {
        if (!th.warp_sel) return;
        float acc[8][4];
        th.score(tile, g, t, acc);
        bsr_store_tile(&acc[0][0], it, th.mr, g, t, lane, stage, sel_rows, out, row_len,
                       [&](bool on, int, int rr, int grp, uint32_t sum) {
                           if (on)
                               stage_sum[rr * BSR_SUM_ROW + BSR_GROUPS * (it - range.lo) + grp] =
                                   sum;
                       });
    });
    if (!th.warp_sel) return;
    /* the chunk's summaries, BSR_GROUPS x its tiles a row (16-byte pieces: a quarter of the warp a
     * row) */
    const int pieces = BSR_GROUPS * (range.hi - range.lo) / 4;
    for (int i = lane; i < 16 * pieces; i += 32) {
        const int rr = i / pieces, c = 4 * (i % pieces);
        if (!((sel_rows >> rr) & 1u)) continue;
        *reinterpret_cast<uint4 *>(sums_out + rr * p.score_sum_stride + BSR_GROUPS * range.lo + c) =
            *reinterpret_cast<const uint4 *>(stage_sum + rr * BSR_SUM_ROW + c);
    }
}

/* The same scores by wgmma on Hopper (bs_score_wg_kernel): the row group's pooled queries and
 * two key tiles in shared memory, 128-byte swizzled (sw_off), the keys of tile it - 1 multiplied
 * asynchronously while the warps write those of tile it, the summaries written a word at a time
 * (no chunk staging). The sums are wgmma's, in the order of d: they may differ from
 * bs_stream_kernel's in the last bits, so near-ties can fall the other way (the tuning
 * bs_wgmma=-1 takes bs_score_kernel, whose scores are the streaming kernel's bit for bit). */
template <int D> constexpr size_t bsr_wg_tile_bytes() { return (size_t)BSS_KEYS * D * 2; }
template <int D> constexpr size_t bsr_wg_smem() {
    /* Q, two key tiles, the stage, and the mbarriers of the tiles' TMA loads */
    return 1024 + 3 * bsr_wg_tile_bytes<D>() + (size_t)BSS_ROWS * BSR_STAGE_ROW * 4 +
           4 * sizeof(uint64_t);
}
/* Tensor maps of the pooled queries and keys (d, row block, head, batch) in 64-row boxes, where
 * the tiles come by TMA (D = 128; on: both encoded): one thread issues a tile's two boxes,
 * instead of every thread computing and issuing eight 16-byte copies. */
struct bsr_score_maps {
    CUtensorMap q, k;
    int32_t on;
};
template <typename T, int D>
__global__ void __launch_bounds__(BSS_NT, 3)
    bs_score_wg_kernel(const __grid_constant__ bs_select_params p,
                       const __grid_constant__ bsr_score_maps mp) {
#ifdef MI_SM90_DEVICE
    constexpr int HALF = BSS_KEYS * 128; /* bytes of 64 rows of 64 two-byte values */
    constexpr int TILE = (int)bsr_wg_tile_bytes<D>();
    static_assert(BSS_ROWS == 64 && BSS_KEYS == 64 && BSS_NT == 128, "one m64n64 warpgroup");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *qs = smem_base_1024(smem_raw);
    unsigned char *ks = qs + TILE; /* [2][TILE] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t *stage = reinterpret_cast<uint32_t *>(ks + 2 * TILE) + 16 * warp * BSR_STAGE_ROW;
    bsr_score_place w;
    if (!bsr_score_place_of(p, warp, w)) return;
    const int bh = w.bh, b = w.b, h = w.h, m0 = w.m0, lo = w.lo;
    const int len = w.len, nb = w.nb, wm0 = w.wm0;
    bss_thread<T, D> th; /* rows, top k and selects (its query fragments go unused) */
    th.init(p, bh, h, m0, wm0, g, t, len);
    if (th.n_tiles == 0) return;
    const int hi = min(lo + p.score_chunk_tiles, th.n_tiles);
    unsigned sel_rows = 0;
    for (int rr = 0; rr < 16; ++rr) sel_rows |= (unsigned)th.row_sel(rr) << rr;
    const int row_len = w.row_len();
    uint16_t *out = w.keys_out(p, warp);
    uint32_t *sums_out = w.sums_out(p);
    /* 64 rows of D values from src (rows from row0 on, zeros from nb on) into dst, swizzled */
    auto load_rows = [&](uint32_t dst, const T *src, int row0) {
#pragma unroll
        for (int i = 0; i < BSS_KEYS * D / 8 / BSS_NT; ++i) {
            const int c = (int)threadIdx.x + i * BSS_NT;
            const int r = c / (D / 8), piece = c % (D / 8), j = row0 + r;
            const bool ok = j < nb;
            cp_async_16(dst + sw_off(r, piece, HALF), src + (int64_t)(ok ? j : 0) * D + 8 * piece,
                        ok ? 16 : 0);
        }
    };
    const T *kg = bss_keys_of<T, D>(p, b, h);
    const uint32_t qs_a = smem_addr(qs), ks_a = smem_addr(ks);
    /* the TMA path: q_full, then k_full of the two key buffers; buffer (hi - 1 - t) & 1 takes
     * tile t, as its ((hi - 1 - t) >> 1)-th load */
    const bool tma = D == 128 && mp.on;
    uint64_t *bars = reinterpret_cast<uint64_t *>(ks + 2 * TILE + BSS_ROWS * BSR_STAGE_ROW * 4);
    const int hk = h / p.group;
    auto key_parity = [&](int t) { return ((hi - 1 - t) >> 1) & 1; };
    if (tma) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < 3; ++i) mbar_init(bars + i, 1);
            fence_mbarrier_init();
            tma_load_tile<BSS_KEYS>(qs_a, &mp.q, m0, h, b, bars);
            tma_load_tile<BSS_KEYS>(ks_a, &mp.k, (hi - 1) * BSS_KEYS, hk, b, bars + 1);
            if (hi - 2 >= lo)
                tma_load_tile<BSS_KEYS>(ks_a + TILE, &mp.k, (hi - 2) * BSS_KEYS, hk, b, bars + 2);
        }
        __syncthreads(); /* the barriers initialised */
    } else {
        load_rows(qs_a, static_cast<const T *>(p.qp) + (int64_t)bh * p.row_blocks * D, m0);
        load_rows(ks_a, kg, (hi - 1) * BSS_KEYS);
        cp_async_commit();
        if (hi - 2 >= lo) load_rows(ks_a + TILE, kg, (hi - 2) * BSS_KEYS);
        cp_async_commit();
    }
    const sw128_desc qd(qs_a, 16, 1024);
    auto issue = [&](float *s, int buf) {
        wgmma_issue_qk<T, D>(s, qd, HALF, sw128_desc(ks_a + buf * TILE, 16, 1024), HALF);
    };
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    if (tma) {
        mbar_wait(bars, 0);
        mbar_wait(bars + 1, 0);
    } else {
        cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads();
    }
    issue(acc, 0);
    wgmma_wait<0>();
    fence_operands<32>(acc);
    /* where the lane's summaries go: row (lane >> 3) + 4 i, group (lane & 7) >> 1 of a tile */
    uint32_t *sums_lane = sums_out + (int64_t)(lane >> 3) * p.score_sum_stride + ((lane & 7) >> 1);
    const int64_t sums_step = 4 * (int64_t)p.score_sum_stride;
    auto write = [&](const uint32_t(&key)[16], int it) {
        if (th.warp_sel)
            bsr_store_keys(key, it, g, t, lane, stage, sel_rows, out, row_len,
                           [&](bool on, int i, int, int, uint32_t sum) {
                               st_global_if(on, sums_lane + BSR_GROUPS * it + i * sums_step, sum);
                           });
    };
    /* acc: tile it's scores, from buffer cb; tile it - 1's keys loading into the other. Packs
     * tile it's keys, starts tile it - 1's product into acc and tile it - 2's keys into cb, and
     * writes tile it meanwhile. Nothing is in flight from one tile to the next, and the issue,
     * the writes and the wait sit in one branch: ptxas serialises wgmma whose accumulators
     * other instructions might read before the wait, as it did with them split over two
     * branches on the same condition. */
    for (int it = hi - 1, cb = 0; it >= lo; --it, cb ^= 1) {
        uint32_t key[16];
        bsr_pack_tile(acc, it, th.mr, t, key);
        if (it - 1 >= lo) {
            if (tma) {
                mbar_wait(bars + 1 + (cb ^ 1), key_parity(it - 1)); /* tile it - 1's keys */
                __syncthreads(); /* every warp is done with buffer cb */
                if (threadIdx.x == 0 && it - 2 >= lo)
                    tma_load_tile<BSS_KEYS>(ks_a + cb * TILE, &mp.k, (it - 2) * BSS_KEYS, hk, b,
                                            bars + 1 + cb);
            } else {
                cp_async_wait<0>();
                fence_proxy_async();
                __syncthreads(); /* tile it - 1's keys in view; every warp is done with buffer cb */
                if (it - 2 >= lo) load_rows(ks_a + cb * TILE, kg, (it - 2) * BSS_KEYS);
                cp_async_commit();
            }
            issue(acc, cb ^ 1);
            write(key, it);
            wgmma_wait<0>();
            fence_operands<32>(acc);
        } else {
            write(key, it);
        }
    }
#endif
}

} // namespace mi_cuda

#endif
