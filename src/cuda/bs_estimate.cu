/*
 * bs_estimate.cu: the block-sparse estimate on the GPU and its dispatch. For each row block m of
 * each head: the mean-pooled q (64 rows, real rows only, rounded to the input dtype) against
 * every pooled k of blocks n <= m, ranked by the upper 16 bits of each score's order key (equal
 * keys: lower block first, as the CPU reference), the diagonal block and block 0 forced; its top
 * k written as ascending offsets 64 n into the common mi_sparse_index form (column_count = 0).
 *
 * Parts (device code in the headers, host launchers and dispatch here):
 *   - pooling: bs_pool.cuh (q and k in one launch);
 *   - ranking shared by every select: bs_rank.cuh;
 *   - through scores in memory, from 128K (bsr_scores_on): scoring in bs_score_mem.cuh
 *     (bs_score_wg_kernel on Hopper, else bs_score_kernel; layout in bs_scores.cuh), selection
 *     in bs_row_select.cuh;
 *   - streaming, top k <= BSS_MAX_K: bs_stream.cuh (running top k per row block, a bound pass
 *     first for long rows, long row groups split into chunks with few heads: bs_chunks.cuh);
 *   - whole score rows in shared memory, for larger top k: bs_select_rows.cuh.
 * Invariants: every path pools and ranks as the CPU reference (the same sums in row order, the
 * same 16-bit rank and ties; only the dot products' rounding may differ); offsets ascend; the
 * sequences shorter than dense_below get no blocks.
 *
 * Entry points: mi_cuda_bs_scratch_bytes (the scratch a call needs), mi_cuda_bs_estimate_run
 * (pooling, then the path chosen per call and head), mi_cuda_block_sparse_estimate.
 */
#include "block_select.cuh"
#include "bs_chunks.cuh"
#include "bs_scores.cuh"
#include "bs_slots.cuh"
#include "cuda_common.cuh"
#include "sm90_common.cuh"

#include <algorithm>
#include <stdlib.h>
#include <type_traits>
#include <string.h>

#include "bs_pool.cuh"
#include "bs_row_select.cuh"
#include "bs_select_rows.cuh"

namespace mi_cuda {

/* The row blocks per CTA for R row blocks: as many as fit BS_SCORE_SMEM (0: none fits). */
static int bs_rows_per_cta(int64_t R) {
    const int64_t per = (R + BS_MAX_ROWS + 3) * (int64_t)sizeof(float);
    return (int)std::min<int64_t>(BS_MAX_ROWS, (int64_t)BS_SCORE_SMEM / per);
}

/* Where the scores leave room for two CTAs per SM, CTAs of 256 threads with one group of key rows
 * in flight per warp; where one CTA fills an SM's shared memory (about 512K and beyond), the
 * wide variant: 512 threads, two groups in flight per warp (at most 128 registers), since one
 * CTA of 256 threads an SM is latency bound. */
constexpr size_t BS_TWO_CTA_SMEM = 80 * 1024;
constexpr int BS_WIDE_NT = 512;

template <typename T, int D, int ROWS>
static cudaError_t launch_bs_select(const bs_select_params &sp, int64_t BH, int force_wide,
                                    cudaStream_t st) {
    const int64_t stride = bs_score_stride((int64_t)sp.idx_row_blocks + ROWS);
    const size_t smem = (size_t)(ROWS * stride) * sizeof(float);
    /* force_wide (mi_tuning.bs_wide) 1 or -1 forces the choice (for the tests) */
    const bool wide = force_wide != 0 ? force_wide > 0 : smem > BS_TWO_CTA_SMEM;
    auto kern =
        wide ? bs_select_kernel<T, D, ROWS, 2, BS_WIDE_NT> : bs_select_kernel<T, D, ROWS, 1, BS_NT>;
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const unsigned ctas = (unsigned)((sp.idx_row_blocks + ROWS - 1) / ROWS);
    kern<<<dim3(ctas, (unsigned)BH), wide ? BS_WIDE_NT : BS_NT, smem, st>>>(sp);
    return cudaGetLastError();
}

template <typename T, int D>
static cudaError_t launch_bs_select(const bs_select_params &sp, int rows, int64_t BH,
                                    int force_wide, cudaStream_t st) {
    switch (rows) {
    case 1: return launch_bs_select<T, D, 1>(sp, BH, force_wide, st);
    case 2: return launch_bs_select<T, D, 2>(sp, BH, force_wide, st);
    case 3: return launch_bs_select<T, D, 3>(sp, BH, force_wide, st);
    default: return launch_bs_select<T, D, 4>(sp, BH, force_wide, st);
    }
}

template <typename T, int D>
static cudaError_t launch_bs_stream(const bs_select_params &sp, int cap, int64_t BH,
                                    cudaStream_t st) {
    const bool split = sp.chunk_tiles > 0;
    const int64_t items = split ? sp.split_items + sp.groups - sp.groups_r : sp.groups;
    const dim3 grid((unsigned)(items * BH));
    /* the rows of the split groups, BSS_NT / 32 a CTA */
    const dim3 split_grid(
        (unsigned)(((sp.groups_r - sp.chunk_tiles) * BSS_ROWS + BSS_NT / 32 - 1) / (BSS_NT / 32)),
        (unsigned)BH);
    cudaError_t e;
    if (sp.bound != nullptr) {
        auto bound = bs_bound_kernel<T, D>;
        const size_t smem = bsb_smem_bytes<D>();
        e = cudaFuncSetAttribute(bound, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        bound<<<grid, BSS_NT, smem, st>>>(sp);
        if (split) bs_bound_rank_kernel<<<split_grid, BSS_NT, 0, st>>>(sp);
    }
    auto kern = cap == BSS_CAP_NARROW ? bs_stream_kernel<T, D, BSS_CAP_NARROW>
                                      : bs_stream_kernel<T, D, BSS_CAP_WIDE>;
    const size_t smem = bss_smem_bytes<D>(cap);
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kern<<<grid, BSS_NT, smem, st>>>(sp);
    if (split) bs_merge_kernel<<<split_grid, BSS_NT, 0, st>>>(sp);
    return cudaGetLastError();
}

template <typename T, int D>
static cudaError_t launch_bs_scores(bs_select_params sp, int64_t BH, int64_t chunk_pairs,
                                    const mi_tuning &t, cudaStream_t st) {
    /* wgmma where the Hopper kernels run, unless the tuning says bs_wgmma = -1 */
    const bool wg = mi_cuda_sm90_on(t) && t.bs_wgmma >= 0;
    const size_t smem = wg ? bsr_wg_smem<D>() : bsr_score_smem<D>();
    if (!wg) sp.score_chunk_tiles = std::min(sp.score_chunk_tiles, BSR_MAX_CHUNK_TILES);
    cudaError_t e =
        wg ? cudaFuncSetAttribute(bs_score_wg_kernel<T, D>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
           : cudaFuncSetAttribute(bs_score_kernel<T, D>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    /* the wgmma kernel's tiles by TMA where D is 128, unless bs_score_tma = -1 (then, or where a
     * map cannot be made, by 16-byte copies) */
    bsr_score_maps maps;
    memset(&maps, 0, sizeof maps);
    if (wg && D == 128 && t.bs_score_tma >= 0) {
        const int heads_kv = sp.heads / sp.group, batch = sp.bh / sp.heads;
        const int64_t rows = sp.row_blocks;
        const int64_t q_stride[3] = {sp.heads * rows * D, rows * D, D};
        const int64_t k_stride[3] = {heads_kv * rows * D, rows * D, D};
        const bool bf16 = std::is_same<T, __nv_bfloat16>::value;
        maps.on =
            encode_tma_map(&maps.q, sp.qp, q_stride, batch, sp.heads, sp.row_blocks, D, 64, bf16) &&
            encode_tma_map(&maps.k, sp.kp, k_stride, batch, heads_kv, sp.row_blocks, D, 64, bf16);
    }
    const unsigned groups = (unsigned)sp.groups_r;
    const unsigned chunks = (groups + sp.score_chunk_tiles - 1) / sp.score_chunk_tiles;
    for (int64_t z0 = 0; z0 < BH; z0 += chunk_pairs) {
        const unsigned nz = (unsigned)std::min<int64_t>(chunk_pairs, BH - z0);
        bool any = false; /* chunks of heads the call does not take launch nothing */
        for (int64_t bh = z0; bh < z0 + nz; ++bh) any |= sp.active[bh % sp.heads] != 0;
        if (!any) continue;
        sp.score_bh0 = (int32_t)z0;
        if (wg)
            bs_score_wg_kernel<T, D><<<dim3(chunks, groups, nz), BSS_NT, smem, st>>>(sp, maps);
        else
            bs_score_kernel<T, D><<<dim3(chunks, groups, nz), BSS_NT, smem, st>>>(sp);
        const unsigned rows = (unsigned)((sp.idx_row_blocks + BSR_WARPS - 1) / BSR_WARPS);
        bs_row_select_kernel<<<dim3(rows, nz), 32 * BSR_WARPS, 0, st>>>(sp);
    }
    return cudaGetLastError();
}

} // namespace mi_cuda

using namespace mi_cuda;

static size_t align256b(size_t x) { return (x + 255) & ~(size_t)255; }

/* bss_chunk_tiles_for's `forced` from mi_tuning.bs_split: -1 automatic, 0 never split, N chunks
 * of at least N tiles (tests). */
static int bss_split_forced(const mi_tuning &t) {
    return t.bs_split == 0 ? -1 : t.bs_split < 0 ? 0 : t.bs_split;
}

/* The CTA slots bss_chunk_tiles_for (bs_chunks.cuh) spreads the tiles over: two an SM. */
static int64_t bss_slots() { return 2 * (int64_t)mi_cuda_sm_count(); }

/* The scratch's parts: pooled q, pooled k (the input dtype, two bytes a value), the streaming
 * kernel's row bounds, and for split groups (split_pairs streaming pairs in chunks of
 * chunk_tiles, 0: none) the chunks' group maxima, candidate counts and candidates. */
struct bs_scratch_layout {
    size_t qp, kp, bound, split_maxima, split_count, split_cand, scores, score_sums, total;
};
static bs_scratch_layout bs_scratch_of(int64_t batch, int64_t heads, int64_t heads_kv, int64_t len,
                                       int64_t head_dim, int64_t split_pairs, int chunk_tiles,
                                       int64_t score_pairs) {
    const int64_t R = (len + 63) / 64, BH = batch * heads, groups = (R + BSS_ROWS - 1) / BSS_ROWS;
    const int64_t split_rows =
        chunk_tiles > 0 ? split_pairs * (groups - chunk_tiles) * BSS_ROWS : 0;
    bs_scratch_layout l;
    l.qp = 0;
    l.kp = l.qp + align256b((size_t)BH * R * head_dim * 2);
    l.bound = l.kp + align256b((size_t)batch * heads_kv * R * head_dim * 2);
    l.split_maxima = l.bound + align256b((size_t)BH * R * 4);
    l.split_count = l.split_maxima + align256b((size_t)split_rows * BSB_SLOTS * 2);
    l.split_cand = l.split_count + align256b((size_t)split_rows * BSS_SPLIT_MAX * 4);
    l.scores = l.split_cand + align256b((size_t)split_rows * BSS_SPLIT_MAX * BSS_MAX_K * 8);
    l.score_sums = l.scores + align256b((size_t)score_pairs * bsr_pair_keys(R) * 2);
    l.total = l.score_sums + align256b((size_t)score_pairs * bsr_pair_summaries(R) * 4);
    return l;
}

/* The estimate through scores in memory takes at most this much scratch for its keys, the
 * (b, h) pairs going through it in turn in chunks that fit (one pair at 1M: 336 MB, 269 of them
 * its keys). */
constexpr size_t BSR_SCORE_BYTES = (size_t)1 << 30;

/* A (b, h) pair's keys and group summaries. */
static size_t bsr_pair_bytes(int64_t R) {
    return (size_t)bsr_pair_keys(R) * 2 + (size_t)bsr_pair_summaries(R) * 4;
}

/* Whether the estimate goes through scores in memory at this length (every head, however
 * many): from BSR_AUTO_MIN_ROW_BLOCKS on, where a pair's keys fit BSR_SCORE_BYTES (up to about
 * 1.8M; longer sequences take the streaming kernel). From 128K on it was faster than streaming
 * at one, four and 32 heads, on random and on position-coded scores; the one exception was
 * random scores at 128K x 32 heads, within a few per cent;
 * near-diagonal scores, the shape of real heads, favour scores in memory at every count.
 * mi_tuning.bs_scores = 1 or -1 forces it on or off (A/B runs, tests). */
/* 128K: the shortest length measured */
constexpr int64_t BSR_AUTO_MIN_ROW_BLOCKS = 2048;
static bool bsr_scores_on(const mi_tuning &t, int64_t len) {
    const int64_t R = (len + 63) / 64;
    if (t.bs_scores != 0) return t.bs_scores > 0;
    return R >= BSR_AUTO_MIN_ROW_BLOCKS && bsr_pair_bytes(R) <= BSR_SCORE_BYTES;
}

/* The pairs a chunk of the scores path takes: as many as fit BSR_SCORE_BYTES, at least one. */
static int64_t bsr_chunk_pairs(int64_t BH, int64_t len) {
    const size_t pair = bsr_pair_bytes((len + 63) / 64);
    return std::max<int64_t>(1, std::min<int64_t>(BH, (int64_t)(BSR_SCORE_BYTES / pair)));
}

/* The key tiles a CTA of the score kernels takes for `groups` row groups of `pairs` (b, h) pairs
 * a launch: BSR_CHUNK_TILES, or half that where the CTAs would not fill the SMs' slots (three
 * CTAs an SM) twice over (short sequences, few heads). */
static int bsr_chunk_tiles(int64_t groups, int64_t pairs) {
    int64_t ctas = 0;
    for (int64_t g = 0; g < groups; ++g) ctas += (g + BSR_CHUNK_TILES) / BSR_CHUNK_TILES;
    return ctas * pairs >= 2 * 3 * (int64_t)mi_cuda_sm_count() ? BSR_CHUNK_TILES
                                                               : BSR_CHUNK_TILES / 2;
}

/* The scores path's scratch where it is on; else enough for any number of streaming heads (the
 * split buffers peak at a few heads). */
extern "C" size_t mi_cuda_bs_scratch_bytes(const mi_context *ctx, int64_t batch, int64_t heads,
                                           int64_t heads_kv, int64_t len, int64_t head_dim) {
    const mi_tuning &t = ctx->tuning;
    if (bsr_scores_on(t, len))
        return bs_scratch_of(batch, heads, heads_kv, len, head_dim, 0, 0,
                             bsr_chunk_pairs(batch * heads, len))
            .total;
    const int64_t groups = ((len + 63) / 64 + BSS_ROWS - 1) / BSS_ROWS, slots = bss_slots();
    const int forced = bss_split_forced(t);
    size_t most = 0;
    for (int64_t hs = 1; hs <= heads; ++hs) {
        const int64_t pairs = batch * hs;
        const int chunk = bss_chunk_tiles_for(pairs, groups, slots, forced);
        most = std::max(
            most, bs_scratch_of(batch, heads, heads_kv, len, head_dim, pairs, chunk, 0).total);
    }
    return most;
}

extern "C" mi_status mi_cuda_bs_estimate_run(mi_context *ctx, const mi_attn_shape *s,
                                             const mi_tensor *q, const mi_tensor *k,
                                             const int32_t *seq_lens, const int32_t *top_k,
                                             const uint8_t *active, int32_t dense_below,
                                             void *scratch, mi_sparse_index *index) {
    mi_cuda_attn_params ap;
    mi_status st =
        mi_cuda_fill_attn_params(ctx, s, q, k, nullptr, nullptr, seq_lens, 1.0f, nullptr, &ap);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t R = (s->len + 63) / 64;
    if (index->batch != s->batch || index->heads != s->heads_q || index->row_blocks < R)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "sparse index is [%d, %d, %d], the call needs [%lld, %lld, %lld]",
                       index->batch, index->heads, index->row_blocks, (long long)s->batch,
                       (long long)s->heads_q, (long long)R);
    if (s->head_dim != 64 && s->head_dim != 128)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "CUDA block-sparse estimate: head_dim %lld (64 or 128)",
                       (long long)s->head_dim);
    /* Heads with top k up to BSS_MAX_K take the streaming kernel, the others the one that holds
     * whole score rows; so do heads whose streaming kernel's shared memory a CTA cannot have
     * (A100: 163 KB, room for 128 slots only). The streaming kernel takes 128 candidate slots a
     * row where every such head's top k is at most BSS_NARROW_MAX_K and its CTAs outnumber the
     * SMs (else the second CTA an SM would buy nothing: 128 slots compact more often) or 256 do
     * not fit, else 256.
     * H200, top 100: 128 slots took 128K x 32 heads from 0.044 to 0.036 ms per head on random
     * inputs and 1M x 32 from 0.95 / 0.77 to 0.67 / 0.73, but 512K x 1 position-coded from
     * 0.45 to 0.66. The tuning's bs_stream = -1 sends every head to the row-holding kernel,
     * bs_cap = 128 or 256 fixes the slots (A/B runs, tests). */
    const mi_tuning &tune = ctx->tuning;
    const size_t smem_cta = (size_t)mi_cuda_smem_per_block();
    const auto stream_smem = [&](int cap) {
        return s->head_dim == 64 ? bss_smem_bytes<64>(cap) : bss_smem_bytes<128>(cap);
    };
    const bool wide_fits = smem_cta >= stream_smem(BSS_CAP_WIDE);
    const int cap_env = tune.bs_cap;
    const bool stream_on = tune.bs_stream >= 0;
    /* long sequences: every head through scores in memory (bsr_scores_on) */
    const bool scores_on = bsr_scores_on(tune, s->len);
    const bool narrow_ok = cap_env != BSS_CAP_WIDE && smem_cta >= stream_smem(BSS_CAP_NARROW);
    bool any_stream = false, any_rows = false;
    int n_stream = 0;
    uint8_t to_stream[MI_CUDA_MAX_HEADS], to_rows[MI_CUDA_MAX_HEADS];
    uint8_t split_slot[MI_CUDA_MAX_HEADS] = {0};
    for (int64_t h = 0; h < s->heads_q; ++h) {
        const bool on = active ? active[h] != 0 : true;
        const bool st_head = stream_on && ((narrow_ok && top_k[h] <= BSS_NARROW_MAX_K) ||
                                           (wide_fits && top_k[h] <= BSS_MAX_K));
        to_stream[h] = on && st_head && !scores_on;
        to_rows[h] = on && !st_head && !scores_on;
        any_stream |= to_stream[h] != 0;
        any_rows |= to_rows[h] != 0;
        if (to_stream[h]) split_slot[h] = (uint8_t)n_stream++;
    }
    /* the streaming heads' row groups in chunks where few heads leave SMs idle (BSS_SPLIT_MAX) */
    const int groups_r = (int)((R + BSS_ROWS - 1) / BSS_ROWS);
    const int groups = (index->row_blocks + BSS_ROWS - 1) / BSS_ROWS;
    const int64_t pairs = s->batch * n_stream;
    const int chunk_tiles =
        bss_chunk_tiles_for(pairs, groups_r, bss_slots(), bss_split_forced(tune));
    const int split_items = chunk_tiles > 0 ? bss_split_items(groups_r, chunk_tiles) : 0;
    const int64_t stream_ctas =
        pairs * (chunk_tiles > 0 ? split_items + groups - groups_r : groups);
    /* 128 slots where the CTAs outnumber the SMs (else the second CTA an SM would buy nothing)
     * or 256 do not fit. Chunks need three CTAs an SM for it: at 512K x 1 head (320 chunks on
     * 132 SMs) 256 slots took the streaming kernel from 0.28 to 0.21 ms on position-coded inputs
     * (fewer compactions near the diagonal) and from 0.25 to 0.27 on random ones; at 1M x 1
     * (640 chunks) from 0.50 to 0.73 on random inputs and 0.50 to 0.51 on position-coded ones */
    const int64_t narrow_ctas = (int64_t)mi_cuda_sm_count() * (chunk_tiles > 0 ? 3 : 1);
    const bool narrow_on = cap_env == BSS_CAP_NARROW ||
                           (cap_env != BSS_CAP_WIDE && (stream_ctas > narrow_ctas || !wide_fits));
    bool all_narrow = true;
    for (int64_t h = 0; h < s->heads_q; ++h)
        if (to_stream[h] && !(narrow_on && narrow_ok && top_k[h] <= BSS_NARROW_MAX_K))
            all_narrow = false;
    const int cap = all_narrow ? BSS_CAP_NARROW : BSS_CAP_WIDE;
    int rows = bs_rows_per_cta(index->row_blocks);
    /* bs_rows = N caps the row blocks per CTA, so that the tests reach each variant on short
     * sequences */
    if (tune.bs_rows > 0) rows = std::min(rows, (int)tune.bs_rows);
    if (any_rows && rows < 1)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "CUDA block-sparse estimate: %d row blocks do not fit shared memory "
                       "for a top k above %d (at most %d)",
                       index->row_blocks, BSS_MAX_K,
                       (int)(BS_SCORE_SMEM / sizeof(float)) - BS_MAX_ROWS - 3);
    const int64_t BH = s->batch * s->heads_q, BHK = s->batch * s->heads_kv;
    if (R <= 0 || BH <= 0) return MI_STATUS_SUCCESS;
    cudaStream_t stream = mi_stream(ctx);
    const int64_t score_pairs = scores_on ? bsr_chunk_pairs(BH, s->len) : 0;
    const bs_scratch_layout lay = bs_scratch_of(s->batch, s->heads_q, s->heads_kv, s->len,
                                                s->head_dim, pairs, chunk_tiles, score_pairs);
    void *qp = static_cast<char *>(scratch) + lay.qp;
    void *kp = static_cast<char *>(scratch) + lay.kp;

    pool_params pp;
    memset(&pp, 0, sizeof(pp));
    memcpy(pp.seq_lens, ap.seq_lens, sizeof(pp.seq_lens));
    pp.len = (int32_t)s->len;
    pp.row_blocks = (int32_t)R;
    pp.head_dim = (int32_t)s->head_dim;
    const bool bf = s->dtype == MI_DTYPE_BF16, d64 = s->head_dim == 64;
    const bool pool_vec = tune.bs_pool_vec >= 0;
    /* q and k in one launch of each kernel: the 16-byte one where every row starts 16-byte
     * aligned (bs_pool_vec = -1: never, for tests), the one-value one for the others */
    enum { POOL_VEC, POOL_ONE, POOL_KINDS };
    pool_params by_kernel[POOL_KINDS];
    int n_of[POOL_KINDS] = {0, 0};
    for (int pass = 0; pass < 2; ++pass) {
        const mi_tensor *t = pass ? k : q;
        const bool vec = ((uintptr_t)t->data & 15) == 0 && t->stride[0] % 8 == 0 &&
                         t->stride[1] % 8 == 0 && t->stride[2] % 8 == 0 && pool_vec;
        const int kind = vec ? POOL_VEC : POOL_ONE;
        if (n_of[kind] == 0) by_kernel[kind] = pp;
        pool_tensor &pt = by_kernel[kind].t[n_of[kind]++];
        pt.x = t->data;
        for (int i = 0; i < 3; ++i) pt.stride[i] = t->stride[i];
        pt.heads = (int32_t)(pass ? s->heads_kv : s->heads_q);
        pt.bh_count = (int32_t)(pass ? BHK : BH);
        pt.row_off = pass ? 0 : (int32_t)s->q_off;
        pt.out = pass ? kp : qp;
    }
    /* grids as wide as q's (b, h) pairs, the most (k's heads divide q's); k's CTAs past its own
     * pairs return at once */
    if (n_of[POOL_VEC] > 0) {
        const int blocks = BS_POOL_NT / ((int)s->head_dim / 8);
        const dim3 grid((unsigned)((R + blocks - 1) / blocks), (unsigned)BH,
                        (unsigned)n_of[POOL_VEC]);
        if (bf)
            (d64 ? bs_pool_vec_kernel<__nv_bfloat16, 64>
                 : bs_pool_vec_kernel<__nv_bfloat16, 128>)<<<grid, BS_POOL_NT, 0, stream>>>(
                by_kernel[POOL_VEC]);
        else
            (d64 ? bs_pool_vec_kernel<__half, 64>
                 : bs_pool_vec_kernel<__half, 128>)<<<grid, BS_POOL_NT, 0, stream>>>(
                by_kernel[POOL_VEC]);
    }
    if (n_of[POOL_ONE] > 0) {
        const dim3 grid((unsigned)R, (unsigned)BH, (unsigned)n_of[POOL_ONE]);
        if (bf)
            bs_pool_kernel<__nv_bfloat16>
                <<<grid, (unsigned)s->head_dim, 0, stream>>>(by_kernel[POOL_ONE]);
        else
            bs_pool_kernel<__half><<<grid, (unsigned)s->head_dim, 0, stream>>>(by_kernel[POOL_ONE]);
    }

    bs_select_params sp;
    memset(&sp, 0, sizeof(sp));
    /* Long rows of the streaming kernel start from bounds (bs_bound_kernel). The tuning's
     * bs_bound = -1 takes no bounds, G (1, 2, 4, 8, 16 or 32) fixes the bound kernel's groups per
     * tile, past its slots too (A/B runs, tests). */
    sp.bound_groups = tune.bs_bound > 0 ? tune.bs_bound : -1;
    sp.bound = tune.bs_bound < 0
                   ? nullptr
                   : reinterpret_cast<uint32_t *>(static_cast<char *>(scratch) + lay.bound);
    /* bs_mask_append = -1: plain tiles appended an n-tile at a time, always (A/B runs, tests) */
    sp.mask_append = tune.bs_mask_append >= 0;
    sp.qp = qp;
    sp.kp = kp;
    sp.heads = (int32_t)s->heads_q;
    sp.group = (int32_t)s->group;
    sp.row_blocks = (int32_t)R;
    sp.head_dim = (int32_t)s->head_dim;
    sp.block_count = index->block_count;
    sp.block_offset = index->block_offset;
    sp.column_count = index->column_count;
    sp.idx_row_blocks = index->row_blocks;
    sp.max_blocks = index->max_blocks;
    sp.dense_below = dense_below;
    memcpy(sp.seq_lens, ap.seq_lens, sizeof(sp.seq_lens));
    for (int64_t h = 0; h < s->heads_q; ++h) sp.top_k[h] = top_k[h];
    sp.groups = groups;
    sp.bh = (int32_t)BH;
    sp.chunk_tiles = chunk_tiles;
    sp.groups_r = groups_r;
    sp.split_items = split_items;
    sp.split_heads = n_stream;
    memcpy(sp.split_slot, split_slot, sizeof(split_slot));
    sp.split_maxima = reinterpret_cast<uint16_t *>(static_cast<char *>(scratch) + lay.split_maxima);
    sp.split_count = reinterpret_cast<int32_t *>(static_cast<char *>(scratch) + lay.split_count);
    sp.split_cand = reinterpret_cast<uint64_t *>(static_cast<char *>(scratch) + lay.split_cand);
    sp.scores = reinterpret_cast<uint16_t *>(static_cast<char *>(scratch) + lay.scores);
    sp.score_pair_keys = bsr_pair_keys(R);
    sp.score_sums = reinterpret_cast<uint32_t *>(static_cast<char *>(scratch) + lay.score_sums);
    sp.score_sum_stride = (int32_t)bsr_summary_stride(R);
    sp.score_chunk_tiles = scores_on ? bsr_chunk_tiles(groups_r, score_pairs) : BSR_CHUNK_TILES;
    sp.score_raise = 1;
    /* bs_bound_slack = N: the select's bound search on rows of 1024 summaries stops within N
     * values of k (shorter rows' within as many eighths as they hold 128 summaries); -1: it
     * never stops early (A/B runs, tests) */
    sp.score_slack = tune.bs_bound_slack != 0 ? tune.bs_bound_slack : BSR_BOUND_SLACK;
    cudaError_t e = cudaSuccess;
    if (scores_on) {
        for (int64_t h = 0; h < s->heads_q; ++h) sp.active[h] = active ? active[h] != 0 : 1;
        e = bf ? (d64 ? launch_bs_scores<__nv_bfloat16, 64>(sp, BH, score_pairs, tune, stream)
                      : launch_bs_scores<__nv_bfloat16, 128>(sp, BH, score_pairs, tune, stream))
               : (d64 ? launch_bs_scores<__half, 64>(sp, BH, score_pairs, tune, stream)
                      : launch_bs_scores<__half, 128>(sp, BH, score_pairs, tune, stream));
    }
    if (any_stream) {
        memcpy(sp.active, to_stream, (size_t)s->heads_q);
        e = bf ? (d64 ? launch_bs_stream<__nv_bfloat16, 64>(sp, cap, BH, stream)
                      : launch_bs_stream<__nv_bfloat16, 128>(sp, cap, BH, stream))
               : (d64 ? launch_bs_stream<__half, 64>(sp, cap, BH, stream)
                      : launch_bs_stream<__half, 128>(sp, cap, BH, stream));
    }
    if (e == cudaSuccess && any_rows) {
        memcpy(sp.active, to_rows, (size_t)s->heads_q);
        const int wide = tune.bs_wide;
        e = bf ? (d64 ? launch_bs_select<__nv_bfloat16, 64>(sp, rows, BH, wide, stream)
                      : launch_bs_select<__nv_bfloat16, 128>(sp, rows, BH, wide, stream))
               : (d64 ? launch_bs_select<__half, 64>(sp, rows, BH, wide, stream)
                      : launch_bs_select<__half, 128>(sp, rows, BH, wide, stream));
    }
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA block-sparse estimate: %s",
                       cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

extern "C" mi_status mi_cuda_block_sparse_estimate(mi_context *ctx, const mi_attn_shape *s,
                                                   const mi_tensor *q, const mi_tensor *k,
                                                   const int32_t *seq_lens, const int32_t *top_k,
                                                   mi_sparse_index *index) {
    if (s->heads_q > MI_CUDA_MAX_HEADS || s->batch > MI_CUDA_MAX_BATCH)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "CUDA estimate: too many heads or batches");
    const size_t bytes =
        mi_cuda_bs_scratch_bytes(ctx, s->batch, s->heads_q, s->heads_kv, s->len, s->head_dim);
    cudaStream_t stream = mi_stream(ctx);
    void *scratch = nullptr;
    cudaError_t e = cudaMallocAsync(&scratch, bytes, stream);
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "CUDA estimate scratch: %s",
                       cudaGetErrorString(e));
    mi_status st =
        mi_cuda_bs_estimate_run(ctx, s, q, k, seq_lens, top_k, nullptr, 0, scratch, index);
    cudaFreeAsync(scratch, stream);
    return st;
}
