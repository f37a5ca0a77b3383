/*
 * bs_select_rows.cuh: the block-sparse estimate with whole score rows in shared memory
 * (bs_select_kernel), for top k past the streaming kernel's or GPUs without its shared memory:
 * a CTA per (b, h) and up to BS_MAX_ROWS adjacent row blocks scores them against every pooled
 * key (each key read once for all of them), then selects each row's top k with
 * block_select.cuh (a histogram pass to the keys near the top, then the radix select and the
 * in-order compaction), so the offsets come out sorted.
 */
#ifndef MI_BS_SELECT_ROWS_CUH
#define MI_BS_SELECT_ROWS_CUH

#include "bs_rank.cuh"

namespace mi_cuda {

constexpr int BS_NT = 256;
constexpr int BS_MAX_ROWS = 4;      /* row blocks per CTA, at most (their pooled q in registers) */
constexpr int BS_CANDIDATES = 2048; /* the two-pass select's room for keys near the top */
/* the scores of a CTA's row blocks: at most this much shared memory */
constexpr size_t BS_SCORE_SMEM = 200 * 1024;
/* floats per row block in the scores of a CTA whose last row block is m_end - 1 (its m_end
 * keys, rounded up for 16-byte alignment) */
__host__ __device__ constexpr int64_t bs_score_stride(int64_t m_end) { return (m_end + 3) & ~3; }

/* One CTA per `ROWS` adjacent row blocks of one (b, h), the longest first. The scores: the
 * pooled keys are read once for all ROWS row blocks (each was read once per row block, a CTA's
 * threads each reading a whole row: at 1M, 69 GB of L2 reads per head), eight lanes to a key
 * row, coalesced. Then, per row block, the top k: block_top_bin narrows the m + 1 keys to the
 * few near the top, the exact radix select and the in-order compaction run on those; where more
 * than BS_CANDIDATES lie there (k close to m), on all of them as before. */
template <typename T, int D, int ROWS, int UNROLL, int NT>
__global__ void __launch_bounds__(NT, NT == BS_NT ? 2 : 1)
    bs_select_kernel(const __grid_constant__ bs_select_params p) {
    extern __shared__ float scores[]; /* [ROWS][stride] */
    __shared__ union {
        select_smem sel;
        top_bin_smem top;
    } sm;
    __shared__ int cand[BS_CANDIDATES];
    __shared__ typename cub::BlockScan<int, NT>::TempStorage scan_tmp;
    const int bh = blockIdx.y;
    const int b = bh / p.heads, h = bh % p.heads;
    const int m0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
    if (!p.active[h] || m0 >= p.idx_row_blocks) return;
    const int len = bs_seq_len(p, b);
    const int rows = min(ROWS, p.idx_row_blocks - m0);
    int kk[ROWS];
    int n_score = 0; /* key rows whose scores some row block needs */
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int m = m0 + r, n = m + 1;
        kk[r] = bs_row_k(p, h, m, len);
        if (kk[r] > 0 && kk[r] < n) n_score = n;
    }
    const int stride = (int)bs_score_stride(m0 + ROWS);

    if (n_score > 0) {
        /* lane l of a warp: key row 4 w' + l / 8 of the warp's four, 8-value pieces l % 8,
         * l % 8 + 8, ... (eight lanes read 128 contiguous bytes at a time) */
        constexpr int PIECES = D / 64;
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = lane & 7;
        float q[ROWS][PIECES][8];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int m = min(m0 + r, p.row_blocks - 1);
            const uint4 *qg = reinterpret_cast<const uint4 *>(static_cast<const T *>(p.qp) +
                                                              ((int64_t)bh * p.row_blocks + m) * D);
#pragma unroll
            for (int i = 0; i < PIECES; ++i) unpack8<T>(qg[i * 8 + part], q[r][i]);
        }
        const int bhk = b * (p.heads / p.group) + h / p.group;
        const uint4 *kbase = reinterpret_cast<const uint4 *>(static_cast<const T *>(p.kp) +
                                                             (int64_t)bhk * p.row_blocks * D);
        /* UNROLL groups of key rows in flight per warp (see launch_bs_select) */
        constexpr int STEP = 4 * (NT / 32);
        /* the loop bound is the warp's (the shuffles below need every lane) */
        for (int j0 = 4 * warp; j0 < n_score; j0 += STEP * UNROLL) {
            uint4 kv[UNROLL][PIECES];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = j0 + u * STEP + (lane >> 3);
#pragma unroll
                for (int i = 0; i < PIECES; ++i)
                    kv[u][i] = j < n_score ? __ldg(kbase + (int64_t)j * (D / 8) + i * 8 + part)
                                           : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int j = j0 + u * STEP + (lane >> 3);
                float kf[PIECES][8];
#pragma unroll
                for (int i = 0; i < PIECES; ++i) unpack8<T>(kv[u][i], kf[i]);
                float acc[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    acc[r] = 0.f;
#pragma unroll
                    for (int i = 0; i < PIECES; ++i)
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[r] += kf[i][e] * q[r][i][e];
#pragma unroll
                    for (int o = 4; o > 0; o >>= 1)
                        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
                }
                if (part == 0 && j < n_score)
#pragma unroll
                    for (int r = 0; r < ROWS; ++r)
                        if (j <= m0 + r) scores[r * stride + j] = acc[r];
            }
        }
        __syncthreads();
    }

    for (int r = 0; r < rows; ++r) {
        const int m = m0 + r, n = m + 1, k = kk[r];
        const int64_t row = (int64_t)bh * p.idx_row_blocks + m;
        int32_t *off = p.block_offset + row * p.max_blocks;
        if (bs_row_trivial<NT>(p, row, k, n)) continue;
        const float *sc = scores + r * stride;
        auto key = [&](int j) { return bs_rank_key(sc[j], j, m); };
        int bin, n_cand;
        block_top_bin<NT>(key, n, k, sm.top, scan_tmp, bin, n_cand);
        if (n_cand <= BS_CANDIDATES) {
            /* the candidates, ascending: the keys in the bin or above */
            block_compact<NT, 4>(
                key, n, bin == 0, ((uint32_t)bin << 20) - 1u, 0, 0, false,
                [&](int j, int rank) { cand[rank] = j; }, scan_tmp);
            __syncthreads();
            bs_emit_top_of<NT>(key, cand, n_cand, k, off, sm.sel, scan_tmp);
        } else {
            bs_emit_top<NT>(key, n, k, off, sm.sel, scan_tmp);
        }
        __syncthreads(); /* cand and the select's shared memory are reused by the next row */
    }
}

} // namespace mi_cuda

#endif
