/*
 * bs_estimate.cu: block-sparse estimation (spec §3.4 with the library's fixes): 64-row mean
 * pooling of q and k over the real rows only, pooled scores qp[m].kp[n] for n <= m, the diagonal
 * block and block 0 forced, per-row-block top-k written as ascending offsets 64*n into the common
 * mi_sparse_index form (column_count = 0).
 * One CTA per (b, h, row block) holds the m+1 scores in shared memory and runs the block radix
 * select + in-order compaction of block_select.cuh, so the offsets come out sorted.
 */
#include "block_select.cuh"
#include "cuda_common.cuh"

#include <string.h>

namespace mi_cuda {

struct pool_params {
    const void *x;
    int64_t stride[3];
    int32_t heads, len, row_blocks, head_dim;
    float *out; /* [B*heads, R, D] */
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
};

template <typename T>
__global__ void bs_pool_kernel(const __grid_constant__ pool_params p) {
    const int m = blockIdx.x, bh = blockIdx.y;
    const int b = bh / p.heads, h = bh % p.heads;
    const int len = p.seq_lens[b];
    const int d = threadIdx.x;
    if (d >= p.head_dim) return;
    const T *x = reinterpret_cast<const T *>(p.x) + b * p.stride[0] + h * p.stride[1];
    const int r0 = m * 64, r1 = min(r0 + 64, len);
    float acc = 0.f;
    for (int r = r0; r < r1; ++r) acc += dtype_traits<T>::to_float(x[(int64_t)r * p.stride[2] + d]);
    p.out[((int64_t)bh * p.row_blocks + m) * p.head_dim + d] =
        r1 > r0 ? acc / (float)(r1 - r0) : 0.f;
}

struct bs_select_params {
    const float *qp, *kp;
    int32_t heads, group, row_blocks, head_dim;
    int32_t *block_count, *block_offset, *column_count;
    int32_t idx_row_blocks, max_blocks;
    int32_t dense_below;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
    int32_t top_k[MI_CUDA_MAX_HEADS];
    uint8_t active[MI_CUDA_MAX_HEADS];
};

constexpr int BS_NT = 256;

__global__ void __launch_bounds__(BS_NT)
    bs_select_kernel(const __grid_constant__ bs_select_params p) {
    extern __shared__ float scores[]; /* [m+1] then the pooled query row */
    __shared__ select_smem sm;
    __shared__ typename cub::BlockScan<int, BS_NT>::TempStorage scan_tmp;
    const int m = blockIdx.x, bh = blockIdx.y;
    const int b = bh / p.heads, h = bh % p.heads;
    if (!p.active[h] || m >= p.idx_row_blocks) return;
    int len = p.seq_lens[b];
    if (p.dense_below > 0 && len < p.dense_below) len = 0;
    const int64_t row = (int64_t)bh * p.idx_row_blocks + m;
    const int n = m + 1;
    /* as the CPU reference: at least the forced blocks (diagonal, and block 0 when m > 0) */
    int k = max(min(max(p.top_k[h], 0), n), m > 0 ? 2 : 1);
    k = min(k, p.max_blocks);
    if (m * 64 >= len) k = 0;
    if (threadIdx.x == 0) p.column_count[row] = 0;
    if (k <= 0) {
        if (threadIdx.x == 0) p.block_count[row] = 0;
        return;
    }
    const int D = p.head_dim;
    float *qrow = scores + ((n + 3) & ~3);
    const float *qg = p.qp + ((int64_t)bh * p.row_blocks + m) * D;
    for (int i = threadIdx.x; i < D; i += BS_NT) qrow[i] = qg[i];
    __syncthreads();
    const int bhk = b * (p.heads / p.group) + h / p.group;
    const float *kbase = p.kp + (int64_t)bhk * p.row_blocks * D;
    if (k < n) {
        for (int j = threadIdx.x; j < n; j += BS_NT) {
            const float4 *kr = reinterpret_cast<const float4 *>(kbase + (int64_t)j * D);
            float acc = 0.f;
            for (int i = 0; i < D / 4; ++i) {
                const float4 kv = kr[i];
                acc += kv.x * qrow[4 * i] + kv.y * qrow[4 * i + 1] + kv.z * qrow[4 * i + 2] +
                       kv.w * qrow[4 * i + 3];
            }
            scores[j] = acc;
        }
        __syncthreads();
    }
    auto key = [&](int j) -> uint32_t {
        if (j == m) return 0xffffffffu;                  /* diagonal first */
        if (j == 0) return float_order_key(3.402823466e38f); /* then block 0 */
        return float_order_key(scores[j]);
    };
    uint32_t thr = 0;
    int take_eq = 0, eq_total = 0;
    const bool all = k >= n;
    if (!all) block_radix_select<BS_NT>(key, n, k, sm, thr, take_eq, eq_total);
    int32_t *off = p.block_offset + row * p.max_blocks;
    /* ties: lower block first (the CPU reference's total order) */
    block_compact<BS_NT, 4>(key, n, all, thr, take_eq, eq_total, false,
                            [&](int j, int rank) { off[rank] = 64 * j; }, scan_tmp);
    if (threadIdx.x == 0) p.block_count[row] = k;
}

} // namespace mi_cuda

using namespace mi_cuda;

static size_t align256b(size_t x) { return (x + 255) & ~(size_t)255; }

extern "C" size_t mi_cuda_bs_scratch_bytes(int64_t batch, int64_t heads, int64_t heads_kv,
                                           int64_t len, int64_t head_dim) {
    const int64_t R = (len + 63) / 64;
    return align256b((size_t)batch * heads * R * head_dim * 4) +
           align256b((size_t)batch * heads_kv * R * head_dim * 4);
}

extern "C" mi_status mi_cuda_bs_estimate_run(mi_context *ctx, const mi_attn_shape *s,
                                             const mi_tensor *q, const mi_tensor *k,
                                             const int32_t *seq_lens, const int32_t *top_k,
                                             const uint8_t *active, int32_t dense_below,
                                             void *scratch, mi_sparse_index *index) {
    mi_cuda_attn_params ap;
    mi_status st = mi_cuda_fill_attn_params(ctx, s, q, k, nullptr, nullptr, seq_lens, 1.0f,
                                            nullptr, &ap);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t R = (s->len + 63) / 64;
    if (index->batch != s->batch || index->heads != s->heads_q || index->row_blocks < R)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "sparse index is [%d, %d, %d], the call needs [%lld, %lld, %lld]",
                       index->batch, index->heads, index->row_blocks, (long long)s->batch,
                       (long long)s->heads_q, (long long)R);
    const size_t smem = (size_t)(R + 4) * 4 + (size_t)s->head_dim * 4;
    if (smem > 200 * 1024)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "CUDA block-sparse estimate: L too long");
    const int64_t BH = s->batch * s->heads_q, BHK = s->batch * s->heads_kv;
    if (R <= 0 || BH <= 0) return MI_STATUS_SUCCESS;
    cudaStream_t stream = mi_stream(ctx);
    float *qp = static_cast<float *>(scratch);
    float *kp = reinterpret_cast<float *>(static_cast<char *>(scratch) +
                                          align256b((size_t)BH * R * s->head_dim * 4));

    pool_params pp;
    memset(&pp, 0, sizeof(pp));
    memcpy(pp.seq_lens, ap.seq_lens, sizeof(pp.seq_lens));
    pp.len = (int32_t)s->len;
    pp.row_blocks = (int32_t)R;
    pp.head_dim = (int32_t)s->head_dim;
    const bool bf = s->dtype == MI_DTYPE_BF16;
    for (int pass = 0; pass < 2; ++pass) {
        const mi_tensor *t = pass ? k : q;
        pp.x = t->data;
        for (int i = 0; i < 3; ++i) pp.stride[i] = t->stride[i];
        pp.heads = (int32_t)(pass ? s->heads_kv : s->heads_q);
        pp.out = pass ? kp : qp;
        dim3 grid((unsigned)R, (unsigned)(pass ? BHK : BH));
        if (bf)
            bs_pool_kernel<__nv_bfloat16><<<grid, (unsigned)s->head_dim, 0, stream>>>(pp);
        else
            bs_pool_kernel<__half><<<grid, (unsigned)s->head_dim, 0, stream>>>(pp);
    }

    bs_select_params sp;
    memset(&sp, 0, sizeof(sp));
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
    for (int64_t h = 0; h < s->heads_q; ++h) {
        sp.top_k[h] = top_k[h];
        sp.active[h] = active ? active[h] : 1;
    }
    cudaError_t e = cudaFuncSetAttribute(bs_select_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess) {
        bs_select_kernel<<<dim3((unsigned)index->row_blocks, (unsigned)BH), BS_NT, smem, stream>>>(
            sp);
        e = cudaGetLastError();
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
    const size_t bytes = mi_cuda_bs_scratch_bytes(s->batch, s->heads_q, s->heads_kv, s->len,
                                                  s->head_dim);
    cudaStream_t stream = mi_stream(ctx);
    void *scratch = nullptr;
    cudaError_t e = cudaMallocAsync(&scratch, bytes, stream);
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "CUDA estimate scratch: %s",
                       cudaGetErrorString(e));
    mi_status st = mi_cuda_bs_estimate_run(ctx, s, q, k, seq_lens, top_k, nullptr, 0, scratch,
                                           index);
    cudaFreeAsync(scratch, stream);
    return st;
}
