/*
 * bs_pool.cuh: the pooling of the block-sparse estimate (bs_estimate.cu): the mean of each
 * 64-row block of q and k over its real rows (none past the sequence), summed in row order and
 * rounded to the input dtype as the CPU reference does. q and k in one launch (blockIdx.z);
 * bs_pool_vec_kernel reads rows with 16-byte loads (D a multiple of 8, aligned rows),
 * bs_pool_kernel is the general case.
 */
#ifndef MI_BS_POOL_CUH
#define MI_BS_POOL_CUH

#include "cuda_common.cuh"

namespace mi_cuda {

/* One tensor the pooling reads (q or k): its heads, and its (b, h) pairs bh_count. */
struct pool_tensor {
    const void *x;
    int64_t stride[3];
    int32_t heads, bh_count;
    /* queries at an offset: x holds the rows from this position on (blocks before it pool no
     * rows, a partial first block its rows from here) */
    int32_t row_off;
    void *out; /* [B*heads, R, D] in the input dtype */
};
/* The pooling of up to two tensors in one launch, t[blockIdx.z] (q and k together: one launch's
 * ramp and drain instead of two). */
struct pool_params {
    pool_tensor t[2];
    int32_t len, row_blocks, head_dim;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
};

/* The mean of a block's real rows, summed in row order and rounded to the input dtype as the CPU
 * reference does (IEEE reciprocal and product, whatever the fast-math flags). */
template <typename T> __device__ __forceinline__ T bs_mean_of(float sum, int rows) {
    return dtype_traits<T>::from_float(rows > 0 ? __fmul_rn(sum, __frcp_rn((float)rows)) : 0.f);
}

/* Where row block m of pair bh of tensor pt lies: the pair's first element (x, plus the caller's
 * offset within a row; absolute row r at x + (r - off) * stride) and its real rows [r0, r1) (none
 * before pt's first row or past the sequence); false past pt's pairs. */
template <typename T> struct pool_block {
    const T *x;
    int r0, r1, off;
};
template <typename T>
__device__ __forceinline__ bool pool_block_of(const pool_params &p, const pool_tensor &pt, int bh,
                                              int m, pool_block<T> &blk) {
    if (bh >= pt.bh_count) return false;
    const int b = bh / pt.heads, h = bh % pt.heads;
    blk.x = reinterpret_cast<const T *>(pt.x) + b * pt.stride[0] + h * pt.stride[1];
    blk.off = pt.row_off;
    blk.r0 = max(m * 64, pt.row_off);
    blk.r1 = min(m * 64 + 64, p.seq_lens[b]);
    return true;
}

/* A thread per (block, d). */
template <typename T> __global__ void bs_pool_kernel(const __grid_constant__ pool_params p) {
    const pool_tensor &pt = p.t[blockIdx.z];
    const int m = blockIdx.x, bh = blockIdx.y;
    const int d = threadIdx.x;
    pool_block<T> blk;
    if (d >= p.head_dim || !pool_block_of(p, pt, bh, m, blk)) return;
    float acc = 0.f;
    for (int r = blk.r0; r < blk.r1; ++r)
        acc += dtype_traits<T>::to_float(blk.x[(int64_t)(r - blk.off) * pt.stride[2] + d]);
    reinterpret_cast<T *>(pt.out)[((int64_t)bh * p.row_blocks + m) * p.head_dim + d] =
        bs_mean_of<T>(acc, max(blk.r1 - blk.r0, 0));
}

/* The same sums with a thread per (block, 8 values of d), for rows that 16-byte loads can read
 * (the common case): eight loads in flight a thread instead of one, where the one-value kernel
 * waits on memory latency. BS_POOL_NT / (D / 8) blocks per CTA. */
constexpr int BS_POOL_NT = 128;
template <typename T, int D>
__global__ void __launch_bounds__(BS_POOL_NT)
    bs_pool_vec_kernel(const __grid_constant__ pool_params p) {
    constexpr int PIECES = D / 8, BLOCKS = BS_POOL_NT / PIECES;
    const pool_tensor &pt = p.t[blockIdx.z];
    const int m = blockIdx.x * BLOCKS + threadIdx.x / PIECES, piece = threadIdx.x % PIECES;
    const int bh = blockIdx.y;
    pool_block<T> blk;
    if (m >= p.row_blocks || !pool_block_of(p, pt, bh, m, blk)) return;
    const T *x = blk.x + 8 * piece;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int r = blk.r0; r < blk.r1; ++r) {
        const uint4 u =
            __ldg(reinterpret_cast<const uint4 *>(x + (int64_t)(r - blk.off) * pt.stride[2]));
        const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += dtype_traits<T>::to_float(e[i]);
    }
    uint4 out;
    T *o = reinterpret_cast<T *>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = bs_mean_of<T>(acc[i], max(blk.r1 - blk.r0, 0));
    *reinterpret_cast<uint4 *>(reinterpret_cast<T *>(pt.out) +
                               ((int64_t)bh * p.row_blocks + m) * D + 8 * piece) = out;
}

} // namespace mi_cuda

#endif
