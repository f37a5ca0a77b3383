/*
 * dev/cuda/tri_merge_rowblock_v1.cu: the first merge of Tri-shape's split last rows (5a39871,
 * src/cuda/attn_fwd.cu; see tri_split_plan there): one CTA per row block of the last rows, a
 * thread per dimension, walking the block's rows one after another and, for each, the chunks'
 * maxima and then their weighted rows.
 * GPU tests: test_cuda 593/593, --quick on the sm_80 kernels 315/315, memcheck of --quick clean.
 * Reached on an NVIDIA H200 (bf16, D = 128, 128 + 3968 + 100 last rows, `minference bench
 * --device cuda --methods a_shape,tri_shape`; bench/results/2026-12-02-gpu-tri-split.json):
 * Tri-shape on one head at 1M 35.7 ms in one launch -> 5.50 ms split (A-shape alone 3.6): the
 * two CTAs of the merge walked 100 rows x 261 chunks of dependent loads. At 128K x 32 heads
 * 16.4 -> 15.6 ms (nine chunks a row there). Replaced by a CTA per row (3.94 ms at 1M).
 * Kept for reference; not built.
 */
/* Combines the chunks of each Tri-shape row (a thread per dimension): the softmax of the whole
 * row from the chunks' maxima and sums, written over what the main launch wrote for it. */
template <typename T, int D>
__global__ void __launch_bounds__(D) tri_merge_kernel(const __grid_constant__ mi_cuda_attn_params p,
                                                      const __grid_constant__ tri_split_args sa) {
    int b, h, len, rb0;
    if (!tri_rows_of(p, sa, blockIdx.y, b, h, len, rb0)) return;
    const int rs = (rb0 + blockIdx.x) * BN;
    if (rs >= len) return;
    const int tri = a_shape_window_of(head_mode_of(p, h), len).tri_start;
    const int chunks = ((min(rs + BN, len) - 1) / BN + sa.chunk_tiles) / sa.chunk_tiles;
    const int64_t item0 = ((int64_t)blockIdx.y * sa.max_rb + blockIdx.x) * sa.max_chunks;
    T *og = reinterpret_cast<T *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    float *lseg = p.lse ? p.lse + ((int64_t)b * p.heads + h) * p.len : nullptr;
    const int d = threadIdx.x;
    for (int row = max(rs, tri); row < min(rs + BN, len); ++row) {
        const int r = row - rs;
        float mx = -INFINITY;
        for (int c = 0; c < chunks; ++c) mx = fmaxf(mx, sa.ml_part[(item0 + c) * BN + r].x);
        float sum = 0.f, acc = 0.f;
        for (int c = 0; c < chunks; ++c) {
            const float2 ml = sa.ml_part[(item0 + c) * BN + r];
            const float w = ml.x == -INFINITY ? 0.f : exp2f(ml.x - mx);
            sum += w * ml.y;
            acc += w * sa.o_part[((item0 + c) * BN + r) * D + d];
        }
        og[(int64_t)row * p.o_stride[2] + d] =
            dtype_traits<T>::from_float(sum > 0.f ? acc / sum : 0.f);
        if (lseg && d == 0) lseg[row] = sum > 0.f ? mx * MI_LN2 + logf(sum) : -INFINITY;
    }
}
