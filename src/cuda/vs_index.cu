/*
 * vs_index.cu: vertical/slash sets -> block index, one thread per (b, h, row block), each
 * walking its row block with vs_walk_row (vs_walk.cuh: what the walk does, and its host test).
 * Each CTA stages both lists of its (b, h) in shared memory; unordered input (the public
 * mi_vs_build_index accepts any order) is bitonic-sorted there, and only lists too large for
 * shared memory go through cub's segmented sort into a stream-ordered scratch buffer. Duplicates
 * and out-of-range entries are skipped during the walk.
 * Kept columns are set as bits of the vertical list in shared memory where they fit (up to 4096
 * verticals for 128 threads): a thread's row is its own, so direct stores each touched 32 rows;
 * after the walk each warp writes its 32 rows' columns with one coalesced store per 32 list
 * entries (a scan of the words' counts places them). Direct stores remain for larger lists.
 * Shortcuts, for strictly ordered lists (checked once per CTA): the verticals left of the first
 * range counted by a binary search and copied by the warp, and each run of diagonals within 64
 * of the one before taken at once (its end found from bits of the slash list).
 * Invariant: every variant (bits or stores, shortcuts or step by step) writes the same index.
 * Entry points: mi_cuda_vs_index_run, mi_cuda_vs_build_index.
 */
#include "cuda_common.cuh"
#include "vs_walk.cuh"

#include <cub/device/device_segmented_sort.cuh>
#include <cuda/std/iterator>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <stdlib.h>
#include <string.h>

namespace mi_cuda {

struct index_params {
    const int32_t *v_count, *v_idx, *s_count, *s_idx;
    int32_t max_v, max_s;
    int32_t heads, row_blocks_L; /* ceil(L/64) */
    int32_t *block_count, *block_offset, *column_count, *column_index;
    int32_t row_blocks, max_blocks, max_columns;
    int32_t first_block; /* rows of the blocks before it are not wanted (queries at an offset) */
    int32_t dense_below;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
    uint8_t active[MI_CUDA_MAX_HEADS];
};

__device__ __forceinline__ int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

/* In-place bitonic sort of n (a power of two) ints in shared memory by the whole CTA. */
__device__ void bitonic_sort(int32_t *a, int n, bool ascending) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const bool up = ((i & k) == 0) == ascending;
                    const int32_t x = a[i], y = a[ixj];
                    if ((x > y) == up) {
                        a[i] = y;
                        a[ixj] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
}

/* Every thread of a CTA walks the same two lists at its own pace: staged in shared memory when
 * they fit (use_smem), so the walk does not wait on scattered global loads. */
__global__ void vs_index_kernel(const __grid_constant__ index_params p, int use_smem,
                                int mask_words, int shortcuts) {
    extern __shared__ int32_t lists[];
    const int m = p.first_block + blockIdx.x * blockDim.x + threadIdx.x;
    const int bh = blockIdx.y;
    const int b = bh / p.heads, h = bh % p.heads;
    if (!p.active[h]) return;
    const int32_t *Vg = p.v_idx + (int64_t)bh * p.max_v;
    const int32_t *Sg = p.s_idx + (int64_t)bh * p.max_s;
    const int nv_ = min(max(p.v_count[bh], 0), p.max_v);
    const int ns_ = min(max(p.s_count[bh], 0), p.max_s);
    const int32_t *Vl = Vg, *Sl = Sg;
    /* shared memory: both lists (when staged), the column bits (mask_words a thread), then the
     * slash list's run ends (with the shortcuts) */
    const int vp_all = use_smem ? pow2_at_least(p.max_v) : 0;
    const int sp_all = use_smem ? pow2_at_least(p.max_s) : 0;
    uint32_t *masks = reinterpret_cast<uint32_t *>(lists + vp_all + sp_all);
    bool v_prefix = false, s_runs = false;
    uint32_t *breaks = nullptr, *break_words = nullptr;
    if (use_smem) {
        /* lists padded to powers of two with sentinels that sort last */
        const int vp = pow2_at_least(nv_), sp = pow2_at_least(ns_);
        int32_t *Vs = lists, *Ss = lists + vp_all;
        int ordered = 1;
        for (int i = threadIdx.x; i < vp; i += blockDim.x) {
            Vs[i] = i < nv_ ? Vg[i] : 0x7fffffff;
            if (i > 0 && i < nv_ && Vg[i] < Vg[i - 1]) ordered = 0;
        }
        for (int i = threadIdx.x; i < sp; i += blockDim.x) {
            Ss[i] = i < ns_ ? Sg[i] : (int32_t)0x80000000;
            if (i > 0 && i < ns_ && Sg[i] > Sg[i - 1]) ordered = 0;
        }
        /* the estimator's output is ordered already; anything else is sorted here */
        if (!__syncthreads_and(ordered)) {
            bitonic_sort(Vs, vp, true);
            bitonic_sort(Ss, sp, false);
        }
        __syncthreads();
        Vl = Vs;
        Sl = Ss;
        /* the shortcuts below need lists without duplicates or negative entries, as the
         * estimator writes them; anything else takes the walk's checks one entry at a time */
        if (shortcuts) {
            int strict_v = 1, strict_s = 1;
            for (int i = threadIdx.x; i < nv_; i += blockDim.x)
                if (i == 0 ? Vs[0] < 0 : Vs[i] <= Vs[i - 1]) strict_v = 0;
            for (int i = threadIdx.x; i < ns_; i += blockDim.x)
                if ((i > 0 && Ss[i] >= Ss[i - 1]) || (i == ns_ - 1 && Ss[i] < 0)) strict_s = 0;
            v_prefix = __syncthreads_and(strict_v);
            s_runs = __syncthreads_and(strict_s) && ns_ > 0;
            /* bit i of breaks: entry i ends a run (the last entry, or the next is more than 64
             * below it); bit w of the summary: word w of breaks has a bit */
            const int bw = (sp + 31) / 32;
            breaks = masks + mask_words * blockDim.x;
            break_words = breaks + bw;
            if (s_runs) { /* a ballot a word (the bounds are multiples of 32: whole warps) */
                for (int i = threadIdx.x; i < 32 * bw; i += blockDim.x) {
                    const bool end_here = vs_walk_ends_run(Ss, ns_, i);
                    const uint32_t bits = __ballot_sync(0xffffffffu, end_here);
                    if ((threadIdx.x & 31) == 0) breaks[i >> 5] = bits;
                }
                __syncthreads();
                for (int w = threadIdx.x; w < (bw + 31) / 32 * 32; w += blockDim.x) {
                    const uint32_t bits = __ballot_sync(0xffffffffu, w < bw && breaks[w] != 0);
                    if ((threadIdx.x & 31) == 0) break_words[w >> 5] = bits;
                }
                __syncthreads();
            }
        }
    }
    /* kept columns as bits of the vertical list (word k of thread t at k * blockDim.x + t, so that
     * lanes setting the same word index hit distinct banks), written out by the warp after the
     * walk: each thread's columns are a row of their own, which a store per column would write
     * 32 rows at a time */
    for (int k = 0; k < mask_words; ++k) masks[k * blockDim.x + threadIdx.x] = 0;
    const bool in_grid = m < p.row_blocks;
    if (!in_grid && !mask_words) return;
    const int64_t row = (int64_t)bh * p.row_blocks + m;
    int len = p.seq_lens[b];
    if (p.dense_below > 0 && len < p.dense_below) len = 0;
    const int start = m * 64;
    int nb = 0, nc = 0, n_prefix = 0;
    if (in_grid && start < len) {
        int32_t *off = p.block_offset + row * p.max_blocks;
        int32_t *col = p.column_index + row * p.max_columns;
        const vs_walk_lists lists_walked{Vl, Sl, nv_, ns_, v_prefix, s_runs, breaks, break_words};
        const vs_walk_counts n = vs_walk_row(
            lists_walked, start, len, p.max_blocks, p.max_columns,
            [&](int k, int x) { off[k] = x; },
            [&](int i, int k, int c) {
                /* the word is this thread's own, but an atomic whose result goes unused issues
                 * without waiting, where a load, an or and a store would put a shared-memory
                 * round trip on the walk's path (twice the time on the estimator's lists) */
                if (mask_words)
                    atomicOr(&masks[(i >> 5) * blockDim.x + threadIdx.x], 1u << (i & 31));
                else
                    col[k] = c;
            },
            [&](int k) {
                if (!mask_words)
                    for (int i = 0; i < k; ++i) col[i] = Vl[i];
            });
        nb = n.blocks;
        nc = n.columns;
        n_prefix = n.prefix;
    }
    if (in_grid) {
        p.block_count[row] = nb;
        p.column_count[row] = nc;
    }
    if (!mask_words) return;
    /* each row of the warp in turn: its kept columns in list order, 32 list entries a store. A
     * lane reads one word of the row's bits, a scan of their counts places every word, and the
     * warp stores the words that hold any (the row's bits end at its block start) */
    __syncwarp();
    const int lane = threadIdx.x & 31, first = threadIdx.x - lane;
    const uint32_t below = (1u << lane) - 1u;
    for (int r = 0; r < 32; ++r) {
        const int nr = __shfl_sync(0xffffffffu, nc, r);
        if (nr == 0) continue;
        int32_t *col = p.column_index + (row - lane + r) * p.max_columns;
        /* the prefix first (its entries have no bits), then the bits of the rest */
        const int np = __shfl_sync(0xffffffffu, n_prefix, r);
        for (int i = lane; i < np; i += 32) col[i] = Vl[i];
        int done = np;
        for (int kb = 0; kb < mask_words && done < nr; kb += 32) {
            const uint32_t mine =
                kb + lane < mask_words ? masks[(kb + lane) * blockDim.x + first + r] : 0u;
            const int cnt = __popc(mine);
            int incl = cnt;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int x = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += x;
            }
            const int excl = done + incl - cnt;
            for (unsigned nz = __ballot_sync(0xffffffffu, mine != 0u); nz; nz &= nz - 1) {
                const int k = __ffs(nz) - 1;
                const uint32_t w = __shfl_sync(0xffffffffu, mine, k);
                const int at = __shfl_sync(0xffffffffu, excl, k);
                if ((w >> lane) & 1u) col[at + __popc(w & below)] = Vl[32 * (kb + k) + lane];
            }
            done += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
}

/* Segment bounds of the per-(b, h) lists for the segmented sort. */
struct seg_begin {
    int32_t stride;
    __host__ __device__ int64_t operator()(int64_t i) const { return i * stride; }
};
struct seg_end {
    const int32_t *count;
    int32_t stride;
    __host__ __device__ int64_t operator()(int64_t i) const {
        const int32_t c = count[i];
        return i * stride + (c < 0 ? 0 : (c > stride ? stride : c));
    }
};

} // namespace mi_cuda

using namespace mi_cuda;

extern "C" mi_status mi_cuda_vs_index_run(mi_context *ctx, int64_t L, int64_t first_row,
                                          const int32_t *seq_lens, const mi_vs_index *vs,
                                          int sorted, const uint8_t *active, int32_t dense_below,
                                          mi_sparse_index *index) {
    const int64_t R = (L + 63) / 64;
    if (vs->batch != index->batch || vs->heads != index->heads)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "vs index and sparse index disagree on B, H");
    if (index->row_blocks < R)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "sparse index has %d row blocks, L needs %lld", index->row_blocks,
                       (long long)R);
    if (vs->batch > MI_CUDA_MAX_BATCH || vs->heads > MI_CUDA_MAX_HEADS)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "CUDA index: too many heads or batches");
    const int64_t BH = (int64_t)vs->batch * vs->heads;
    if (BH <= 0 || index->row_blocks <= 0) return MI_STATUS_SUCCESS;
    if (BH > 65535) return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "CUDA index: B*H exceeds 65535");
    cudaStream_t stream = mi_stream(ctx);

    index_params p;
    memset(&p, 0, sizeof(p));
    p.v_count = vs->vertical_count;
    p.v_idx = vs->vertical_idx;
    p.s_count = vs->slash_count;
    p.s_idx = vs->slash_idx;
    p.max_v = vs->max_vertical;
    p.max_s = vs->max_slash;
    p.heads = vs->heads;
    p.block_count = index->block_count;
    p.block_offset = index->block_offset;
    p.column_count = index->column_count;
    p.column_index = index->column_index;
    p.row_blocks = index->row_blocks;
    p.max_blocks = index->max_blocks;
    p.max_columns = index->max_columns;
    p.first_block = (int32_t)(first_row / 64 < index->row_blocks ? first_row / 64 : 0);
    p.dense_below = dense_below;
    for (int64_t b = 0; b < vs->batch; ++b) p.seq_lens[b] = (int32_t)mi_seq_len(seq_lens, b, L);
    for (int64_t h = 0; h < vs->heads; ++h) p.active[h] = active ? active[h] : 1;

    void *scratch = nullptr;
    cudaError_t e = cudaSuccess;
    size_t pv = 1, ps = 1;
    while (pv < (size_t)p.max_v) pv <<= 1;
    while (ps < (size_t)p.max_s) ps <<= 1;
    const size_t lists = (pv + ps) * sizeof(int32_t);
    /* the slash list's run ends as bits beside the lists, and a summary word per 32 of them */
    const size_t break_words = (ps + 31) / 32;
    const size_t break_bytes = (break_words + (break_words + 31) / 32) * 4;
    /* what a CTA may have: 160 KB of lists and 200 KB in all where the GPU allows more (227 KB
     * on the H200), less where it does not (163 KB on the A100) */
    const size_t optin = (size_t)mi_cuda_smem_per_block();
    const size_t smem_cap = optin > 0 && optin < 200 * 1024 ? optin : 200 * 1024;
    const int use_smem = lists <= 160 * 1024 && lists + break_bytes <= smem_cap;
    if (!sorted && !use_smem && (p.max_v > 0 || p.max_s > 0)) {
        /* sort copies of both lists (the caller's index is const) */
        const size_t nv = (size_t)BH * p.max_v, ns = (size_t)BH * p.max_s;
        auto cnt = thrust::make_counting_iterator<int64_t>(0);
        auto vb = thrust::make_transform_iterator(cnt, seg_begin{p.max_v});
        auto ve = thrust::make_transform_iterator(cnt, seg_end{p.v_count, p.max_v});
        auto sb = thrust::make_transform_iterator(cnt, seg_begin{p.max_s});
        auto se = thrust::make_transform_iterator(cnt, seg_end{p.s_count, p.max_s});
        size_t tv = 0, ts = 0;
        e = cub::DeviceSegmentedSort::SortKeys((void *)nullptr, tv, p.v_idx, (int32_t *)nullptr,
                                               (int64_t)nv, (int64_t)BH, vb, ve, stream);
        if (e == cudaSuccess)
            e = cub::DeviceSegmentedSort::SortKeysDescending((void *)nullptr, ts, p.s_idx,
                                                             (int32_t *)nullptr, (int64_t)ns,
                                                             (int64_t)BH, sb, se, stream);
        const size_t tmp = tv > ts ? tv : ts;
        const size_t a_v = (nv * 4 + 255) & ~(size_t)255, a_s = (ns * 4 + 255) & ~(size_t)255;
        if (e == cudaSuccess) e = cudaMallocAsync(&scratch, a_v + a_s + tmp + 256, stream);
        if (e != cudaSuccess)
            return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA index sort setup: %s",
                           cudaGetErrorString(e));
        int32_t *sv = static_cast<int32_t *>(scratch);
        int32_t *ss = reinterpret_cast<int32_t *>(static_cast<char *>(scratch) + a_v);
        void *tmpp = static_cast<char *>(scratch) + a_v + a_s;
        if (nv > 0) {
            size_t t = tmp;
            e = cub::DeviceSegmentedSort::SortKeys(tmpp, t, p.v_idx, sv, (int64_t)nv, (int64_t)BH,
                                                   vb, ve, stream);
        }
        if (e == cudaSuccess && ns > 0) {
            size_t t = tmp;
            e = cub::DeviceSegmentedSort::SortKeysDescending(tmpp, t, p.s_idx, ss, (int64_t)ns,
                                                             (int64_t)BH, sb, se, stream);
        }
        p.v_idx = sv;
        p.s_idx = ss;
    }
    if (e == cudaSuccess) {
        /* the column bits where they fit beside the lists (16 KB for 1000 verticals), unless
         * the tuning asks for direct stores (vs_index_mask = -1); vs_index_shortcuts = -1: the
         * walk takes every vertical and diagonal one step at a time */
        const int nt = 128;
        const int mask_env = ctx->tuning.vs_index_mask >= 0;
        const int shortcuts = ctx->tuning.vs_index_shortcuts >= 0;
        int mask_words = (p.max_v + 31) / 32;
        const size_t mask_bytes = (size_t)mask_words * nt * sizeof(uint32_t);
        const size_t breaks = use_smem && shortcuts ? break_bytes : 0;
        const size_t base = use_smem ? lists + breaks : 0;
        if (!mask_env || mask_bytes > 64 * 1024 || base + mask_bytes > smem_cap) mask_words = 0;
        const size_t smem = base + (mask_words ? mask_bytes : 0);
        if (smem > 0)
            e = cudaFuncSetAttribute(vs_index_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem);
        dim3 grid((unsigned)((index->row_blocks - p.first_block + nt - 1) / nt), (unsigned)BH);
        if (e == cudaSuccess) {
            vs_index_kernel<<<grid, nt, smem, stream>>>(p, use_smem, mask_words, shortcuts);
            e = cudaGetLastError();
        }
    }
    if (scratch) cudaFreeAsync(scratch, stream);
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA index build: %s", cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

extern "C" mi_status mi_cuda_vs_build_index(mi_context *ctx, int64_t L, const int32_t *seq_lens,
                                            const mi_vs_index *vs, mi_sparse_index *index) {
    return mi_cuda_vs_index_run(ctx, L, 0, seq_lens, vs, 0, nullptr, 0, index);
}
