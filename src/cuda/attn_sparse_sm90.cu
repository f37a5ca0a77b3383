/*
 * attn_sparse_sm90.cu: the Hopper (sm_90a) warp-specialised sparse attention kernel, D = 128,
 * for the band-like sparse heads of a launch (vertical-slash and block-sparse indexes of 64-row
 * blocks) and its A-/Tri-shape heads (sinks, window and dense last rows generated as ranges),
 * where every sequence has the full length; the ring kernel of attn_fwd_sm90.cu runs the rest.
 *
 * A work item is a pair of adjacent 64-row blocks A and B of one (b, h), so that the tiles both
 * use are loaded once. A persistent CTA per SM walks the items (pairs x heads x batch, the last
 * pairs first), Q double-buffered so that an item's start overlaps the previous one's end:
 *   - producer (sparse_sm90_producer.cuh, warpgroup 0): merges A's and B's range starts into
 *     64-key ranges marked with their users and packs them two to a 128-key tile (shared, split
 *     or one side's), loaded with TMA; then the column tiles, read with TMA from copies of the
 *     last row block's K/V rows where both lists are a prefix of its list, else gathered with
 *     cp.async. Each tile's header (starts, users, keys, last) sits next to it;
 *   - consumers (sparse_sm90_consumer.cuh, warpgroups 1 and 2: row blocks A and B): S = Q K^T
 *     over the tiles or halves they use, masks, online softmax, P V, taking turns at the
 *     tensor cores; a tile neither uses only frees its slot;
 *   - epilogue (sparse_sm90_epilogue.cuh): normalised output rows and LSE, by TMA from the
 *     item's Q buffer or by per-thread stores.
 * Invariants: range starts ascend per row block; a tile is loaded once and freed by every
 * consumer warp (warp_arrive) whether or not it computes it; only producer warp 0 waits on the
 * empty barriers; the keys after a row are masked (causal), as are keys outside the sequence.
 *
 * Entry points: mi_cuda_attn_sm90_sparse_launch (routes the heads on the device with
 * sparse_route_kernel, flags the taken heads for the ring kernel to skip, then launches
 * attn_sparse_sm90_kernel). The route kernel sends a sparse head here when its sampled row
 * blocks' ranges come in runs of adjacent pieces (a band), where sharing tiles pays.
 */
#include "sparse_sm90_consumer.cuh"
#include "sparse_sm90_producer.cuh"

#include <limits.h>
#include <type_traits>
#include <stdio.h>
#include <stdlib.h>

namespace mi_cuda {

template <typename T>
__global__ void __launch_bounds__(384, 1)
    attn_sparse_sm90_kernel(const __grid_constant__ sparse_sm90_args a) {
#ifdef MI_SM90_DEVICE
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const sparse_smem sm = sparse_smem_of(smem_raw);
    const int tid = threadIdx.x;
    const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int items = a.pairs * __ldg(a.ws_heads);
    if ((int)blockIdx.x >= items) return; /* fewer heads were routed here than CTAs launched */
    if (tid == 0) {
        for (int i = 0; i < 2; ++i) {
            mbar_init(sm.q_full + i, 1);
            /* one arrival per consumer warp, or per consumer once its rows staged in the
             * buffer are stored */
            mbar_init(sm.q_empty + i, a.o_tma ? 2 : 8);
        }
        init_stage_barriers(sm.k_full, sm.v_full, sm.k_empty, sm.v_empty, SP_STAGES);
        sm.plans[0].state = sm.plans[1].state = PLAN_NONE;
        fence_mbarrier_init();
    }
    __syncthreads();
    if (wgi == 0) {
        sparse_producer<T>(a, sm, tid, items);
        return;
    }
    sparse_consumer<T>(a, sm, tid, wgi, items);
#endif
}

template <typename T> static cudaError_t launch_sparse(const sparse_sm90_args &a, cudaStream_t st) {
    auto kern = attn_sparse_sm90_kernel<T>;
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SP_SMEM);
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
constexpr int ROUTE_SAMPLES = 16;                 /* row blocks sampled per (b, h) */
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
            if (r < n)
                x = __ldg(reinterpret_cast<const uint4 *>(src + __ldg(cols + r) * rs) + i % 16);
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
 * the ring kernel runs the others. The tuning's sm90_sparse = 1 sends every sparse head to this
 * kernel, -1 none; sm90_a_shape = -1 leaves the A-/Tri-shape heads to the ring kernel. */
extern "C" cudaError_t mi_cuda_attn_sm90_sparse_launch(const mi_cuda_attn_params *p,
                                                       const mi_tuning *t, cudaStream_t st,
                                                       int *used, int32_t **taken) {
    *used = 0;
    *taken = nullptr;
    const int every = t->sm90_sparse > 0;
    if (t->sm90_sparse < 0 || p->head_dim != 128) return cudaSuccess;
    /* the sparse heads (with an index that covers the sequence), and the A-/Tri-shape heads with
     * the sinks, window and last rows of the first one (an A-shape layer's heads usually share
     * them; the others go to the ring kernel) */
    bool any_sparse = false, a_on = false;
    mi_cuda::a_shape_window a_win = {0, 0, INT_MAX};
    for (int h = 0; h < p->heads; ++h) {
        const mi_cuda_head_mode m = mi_cuda::head_mode_of(*p, h);
        any_sparse |= m.mode == MI_CUDA_MODE_SPARSE;
        if (!a_on && t->sm90_a_shape >= 0 && m.mode == MI_CUDA_MODE_A_SHAPE) {
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
    /* sm90_plan_tiles = N: plan at most N range tiles of an item ahead, merging longer items
     * inline (to test that path, which only items of more than SP_PLAN tiles take otherwise) */
    a.plan_tiles =
        t->sm90_plan_tiles > 0 ? min(t->sm90_plan_tiles, mi_cuda::SP_PLAN) : mi_cuda::SP_PLAN;
    /* sm90_tma_store = -1: each thread stores its output rows itself (the tests of that path) */
    a.o_tma =
        t->sm90_tma_store >= 0 && mi_cuda::encode_tma_map(&a.tm_o, p->o, p->o_stride, p->batch,
                                                          p->heads, p->len, 128, 64, bf16);
    if (cc.rows <= 0 || 2 * copy > COPY_BYTES_MAX || t->sm90_column_copies < 0)
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
