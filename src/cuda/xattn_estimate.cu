/*
 * xattn_estimate.cu: XAttention's block selection on the GPU (CPU reference:
 * src/cpu/xattn_estimate.c; the method: docs/prefill-methods.md).
 *
 * With stride S, reshaped row r of the keys is K[rS .. rS + S - 1] side by side and reshaped row
 * r of the queries Q[rS + S - 1 .. rS] (reversed), so their dot product sums q.k over one
 * antidiagonal of an S x S tile. Per (b, h):
 *   - xa_mass_kernel, one CTA per 64 reshaped query rows: the 64 x 64 score tiles of the causal
 *     reshaped keys on tensor cores (WMMA, fp32 accumulation) from tiles staged in shared memory,
 *     zeros where a position is outside the sequence (or before the offset, for queries); a first
 *     pass takes each row's max and sum of exp, a second sums the probabilities into the mass of
 *     each pair of 64-token blocks, [R][R] floats in scratch;
 *   - xa_select_kernel, one CTA per row block m: block 0, the diagonal, then the fewest other
 *     blocks, largest mass first (equal masses: lower block first), whose mass with those two
 *     reaches threshold / 1000 of the row's (a threshold of 1000 keeps every block), found by a
 *     binary search on the mass value; offsets ascending into the mi_sparse_index.
 * The masses of as many (b, h) pairs as the scratch holds go per launch (at least one, so the
 * scratch is R^2 floats or more), and the index holds up to R blocks per row block, as the CPU's.
 * Rows, sums and ties follow the reference; only the dot products' and sums' rounding differ.
 */
#include "cta_reduce.cuh"
#include "cuda_common.cuh"

#include <mma.h>
#include <string.h>

namespace mi_cuda {

constexpr int XA_NT = 256;
constexpr int XA_MAX_PAIRS = 64;
constexpr int XA_PITCH = 72;  /* 64 + 8 halves: a multiple of 8 for WMMA, rows apart in banks */
constexpr int XA_SPITCH = 68; /* score tile pitch in floats */
/* the masses of one launch stay within this, or one pair when a single pair needs more */
constexpr size_t XA_MASS_BUDGET = (size_t)256 << 20;

struct xa_params {
    const void *q, *k;
    int64_t q_stride[3], k_stride[3];
    int32_t heads, group, head_dim, q_off, row_blocks;
    int32_t dense_below;
    float *mass; /* [pairs][R][R] */
    int32_t *block_count, *block_offset, *column_count;
    int32_t max_blocks;
    int32_t n_pairs;
    int16_t pair_b[XA_MAX_PAIRS], pair_h[XA_MAX_PAIRS];
    int32_t len[XA_MAX_PAIRS], stride[XA_MAX_PAIRS], threshold[XA_MAX_PAIRS];
    float mul_log2[XA_MAX_PAIRS]; /* scale / S * log2(e) */
};

/* Whether reshaped query row r (stride S) holds a query position. */
__device__ __forceinline__ bool xa_row_live(int64_t r, int S, int len, int q_off) {
    return r * S < len && r * S + S - 1 >= q_off;
}

/* The 64 x 64 scores of reshaped query rows r0.. against reshaped key rows n0.. into sc. */
template <typename T>
__device__ __forceinline__ void xa_score_tile(const xa_params &p, const T *qb, const T *kb, int S,
                                              int len, int64_t r0, int64_t n0, T *qs, T *ks,
                                              float *sc) {
    using namespace nvcuda;
    const int tid = threadIdx.x, warp = tid / 32;
    const int fr = warp >> 1, fc = (warp & 1) * 2;
    const int D = p.head_dim, SD = S * D;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
    for (int kk = 0; kk < SD; kk += 64) {
        const int u = kk / D, d0 = kk % D;
        for (int it = tid; it < 64 * 8; it += XA_NT) {
            const int row = it / 8, c8 = (it % 8) * 8;
            const int64_t qpos = (r0 + row) * S + S - 1 - u, kpos = (n0 + row) * S + u;
            uint4 qv = make_uint4(0, 0, 0, 0), kv = make_uint4(0, 0, 0, 0);
            if (qpos >= p.q_off && qpos < len)
                qv = *reinterpret_cast<const uint4 *>(qb + (qpos - p.q_off) * p.q_stride[2] + d0 +
                                                      c8);
            if (kpos < len)
                kv = *reinterpret_cast<const uint4 *>(kb + kpos * p.k_stride[2] + d0 + c8);
            *reinterpret_cast<uint4 *>(qs + row * XA_PITCH + c8) = qv;
            *reinterpret_cast<uint4 *>(ks + row * XA_PITCH + c8) = kv;
        }
        __syncthreads();
#pragma unroll
        for (int k16 = 0; k16 < 64; k16 += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
            wmma::load_matrix_sync(a, qs + fr * 16 * XA_PITCH + k16, XA_PITCH);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                /* B = K^T: element (k, n) at ks[n][k], a column-major read */
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bf;
                wmma::load_matrix_sync(bf, ks + (fc + j) * 16 * XA_PITCH + k16, XA_PITCH);
                wmma::mma_sync(acc[j], a, bf, acc[j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 2; j++)
        wmma::store_matrix_sync(sc + fr * 16 * XA_SPITCH + (fc + j) * 16, acc[j], XA_SPITCH,
                                wmma::mem_row_major);
    __syncthreads();
}

template <typename T> __global__ void __launch_bounds__(XA_NT) xa_mass_kernel(const xa_params p) {
    const int pi = blockIdx.y;
    const int S = p.stride[pi], per = 64 / S, len = p.len[pi];
    const int64_t nb = (len + 63) / 64, nr = nb * per, r0 = (int64_t)blockIdx.x * 64;
    /* no query in these rows, or the sequence runs dense */
    if (r0 >= nr || (r0 + 63) * S + S - 1 < p.q_off || len < p.dense_below) return;
    const int b = p.pair_b[pi], h = p.pair_h[pi];
    const T *qb = static_cast<const T *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    const T *kb = static_cast<const T *>(p.k) + b * p.k_stride[0] + (h / p.group) * p.k_stride[1];
    float *mass = p.mass + (size_t)pi * p.row_blocks * p.row_blocks;

    __shared__ __align__(32) unsigned char tiles[2 * 64 * XA_PITCH * sizeof(T)];
    __shared__ __align__(32) float sc[64 * XA_SPITCH];
    T *qs = reinterpret_cast<T *>(tiles), *ks = qs + 64 * XA_PITCH;
    float *cs = reinterpret_cast<float *>(tiles); /* [S][64] column sums, after the scores */
    static_assert(2 * 64 * XA_PITCH * sizeof(T) >= 64 * 64 * sizeof(float), "column sums fit");

    const int tid = threadIdx.x, i = tid / 4, q4 = tid % 4; /* row i, 16 columns from 16 q4 */
    const bool live = xa_row_live(r0 + i, S, len, p.q_off);
    const float mul = p.mul_log2[pi];
    float m = -INFINITY, l = 0.0f;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t n0 = 0; n0 <= r0; n0 += 64) {
            xa_score_tile<T>(p, qb, kb, S, len, r0, n0, qs, ks, sc);
            float *row = sc + i * XA_SPITCH + q4 * 16;
            const int64_t last = r0 + i - n0; /* keys past it in the tile are in the future */
            if (pass == 0) {
                float tm = -INFINITY;
                for (int j = 0; j < 16; j++)
                    if (q4 * 16 + j <= last) tm = fmaxf(tm, row[j] * mul);
                tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
                tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
                const float nm = fmaxf(m, tm);
                float ts = 0.0f;
                for (int j = 0; j < 16; j++)
                    if (q4 * 16 + j <= last) ts += exp2f(row[j] * mul - nm);
                ts += __shfl_xor_sync(0xffffffffu, ts, 1);
                ts += __shfl_xor_sync(0xffffffffu, ts, 2);
                if (nm != -INFINITY) l = l * exp2f(m - nm) + ts;
                m = nm;
                __syncthreads();
                continue;
            }
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            for (int j = 0; j < 16; j++)
                row[j] = live && q4 * 16 + j <= last ? exp2f(row[j] * mul - m) * inv : 0.0f;
            __syncthreads();
            /* per row group (one row block) and key column, then per key group: cells of
             * (row block, key block) */
            for (int e = tid; e < S * 64; e += XA_NT) {
                const int g = e / 64, j = e % 64;
                float s = 0.0f;
                for (int r = g * per; r < g * per + per; r++) s += sc[r * XA_SPITCH + j];
                cs[g * 64 + j] = s;
            }
            __syncthreads();
            for (int c = tid; c < S * S; c += XA_NT) {
                const int g = c / S, kg = c % S;
                const int64_t mb = r0 / per + g, n = n0 / per + kg;
                float s = 0.0f;
                for (int j = kg * per; j < kg * per + per; j++) s += cs[g * 64 + j];
                if (n <= mb && mb < nb) mass[mb * p.row_blocks + n] = s;
            }
            __syncthreads();
        }
    }
}

__global__ void __launch_bounds__(XA_NT) xa_select_kernel(const xa_params p) {
    extern __shared__ float a[]; /* the row's masses, blocks 0..m */
    __shared__ double red[XA_NT / 32];
    __shared__ uint32_t redu[XA_NT / 32];
    __shared__ int scan[XA_NT + 1];
    const int pi = blockIdx.y, m = blockIdx.x, tid = threadIdx.x;
    const int b = p.pair_b[pi], h = p.pair_h[pi], len = p.len[pi];
    const size_t row = ((size_t)b * p.heads + h) * p.row_blocks + m;
    const int nb = (len + 63) / 64;
    if (tid == 0) p.column_count[row] = 0;
    if (len < p.dense_below || m >= nb || m < p.q_off / 64) {
        if (tid == 0) p.block_count[row] = 0;
        return;
    }
    int32_t *out = p.block_offset + row * p.max_blocks;
    const int thr = p.threshold[pi];
    if (thr >= 1000 || m < 2) {
        const int n = min(m + 1, p.max_blocks);
        for (int j = tid; j < n; j += XA_NT) out[j] = j * 64;
        if (tid == 0) p.block_count[row] = n;
        return;
    }
    const float *src = p.mass + ((size_t)pi * p.row_blocks + m) * p.row_blocks;
    double part = 0.0;
    uint32_t top = 0;
    for (int j = tid; j <= m; j += XA_NT) {
        const float v = fmaxf(src[j], 0.0f);
        a[j] = v;
        part += v;
        if (j > 0 && j < m) top = max(top, __float_as_uint(v));
    }
    const double total = cta_sum<XA_NT>(part, red);
    top = cta_max<XA_NT>(top, redu);
    const double need = total * (double)thr / 1000.0;
    const double base = (double)a[0] + (double)a[m];
    /* tau: the largest mass value v with base + (the candidates' mass of at least v) >= need;
     * the candidates above it are all kept, those equal to it in block order as needed */
    uint32_t tau = 0xffffffffu; /* none: the two forced blocks suffice */
    if (base < need) {
        uint32_t lo = 0, hi = top;
        while (lo < hi) {
            const uint32_t mid = lo + (hi - lo + 1) / 2;
            double s = 0.0;
            for (int j = 1 + tid; j < m; j += XA_NT)
                if (__float_as_uint(a[j]) >= mid) s += a[j];
            if (base + cta_sum<XA_NT>(s, red) >= need)
                lo = mid;
            else
                hi = mid - 1;
        }
        tau = lo;
    }
    /* each thread takes a contiguous span of blocks, so that scans give block order */
    const int span = (m + 1 + XA_NT - 1) / XA_NT, j0 = tid * span, j1 = min(j0 + span, m + 1);
    int ties_needed = 0;
    if (tau != 0xffffffffu) {
        double above = 0.0;
        int ties = 0;
        for (int j = max(j0, 1); j < min(j1, m); j++) {
            const uint32_t u = __float_as_uint(a[j]);
            if (u > tau) above += a[j];
            ties += u == tau;
        }
        const double kept = base + cta_sum<XA_NT>(above, red);
        int before = 0; /* ties before this thread's span */
        const int tie_total = cta_scan<XA_NT>(ties, scan, &before);
        const float tv = __uint_as_float(tau);
        if (tv > 0.0f) {
            const double n = ceil((need - kept) / (double)tv);
            ties_needed = n<1.0 ? 1 : n>(double) tie_total ? tie_total : (int)n;
        } else {
            ties_needed = tie_total;
        }
        /* the flags, ties ranked in block order */
        int count = 0, rank = before;
        for (int j = j0; j < j1; j++) {
            const uint32_t u = __float_as_uint(a[j]);
            const bool tie = j > 0 && j < m && u == tau;
            const bool keep = j == 0 || j == m || (j < m && u > tau) || (tie && rank < ties_needed);
            rank += tie;
            count += keep;
        }
        int at = 0;
        const int n = cta_scan<XA_NT>(count, scan, &at);
        rank = before;
        for (int j = j0; j < j1; j++) {
            const uint32_t u = __float_as_uint(a[j]);
            const bool tie = j > 0 && j < m && u == tau;
            const bool keep = j == 0 || j == m || (j < m && u > tau) || (tie && rank < ties_needed);
            rank += tie;
            if (keep && at < p.max_blocks) out[at++] = j * 64;
        }
        if (tid == 0) p.block_count[row] = min(n, p.max_blocks);
        return;
    }
    if (tid == 0) {
        out[0] = 0;
        out[1] = m * 64;
        p.block_count[row] = 2;
    }
}

} // namespace mi_cuda

using namespace mi_cuda;

extern "C" size_t mi_cuda_xattn_scratch_bytes(int64_t pairs, int64_t len) {
    const size_t R = (size_t)((len + 63) / 64), one = R * R * sizeof(float);
    size_t n = one > 0 ? XA_MASS_BUDGET / one : 1;
    if (n < 1) n = 1;
    if (n > (size_t)pairs) n = pairs > 0 ? (size_t)pairs : 1;
    if (n > (size_t)XA_MAX_PAIRS) n = XA_MAX_PAIRS;
    return n * one;
}

extern "C" mi_status mi_cuda_xattn_estimate_run(mi_context *ctx, const mi_attn_shape *s,
                                                const mi_tensor *q, const mi_tensor *k,
                                                const int32_t *seq_lens, const int32_t *stride,
                                                const int32_t *threshold, float scale,
                                                const uint8_t *active, int32_t dense_below,
                                                void *scratch, size_t scratch_bytes,
                                                mi_sparse_index *index) {
    mi_cuda_attn_params ap;
    mi_status st =
        mi_cuda_fill_attn_params(ctx, s, q, k, nullptr, nullptr, seq_lens, scale, nullptr, &ap);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t R = (s->len + 63) / 64;
    if (index->row_blocks != R || index->max_blocks < R)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "XAttention estimate: the index needs %lld row blocks of up to %lld blocks",
                       (long long)R, (long long)R);
    const size_t one = (size_t)(R * R) * sizeof(float);
    const int64_t per_launch = (int64_t)(scratch_bytes / one);
    if (per_launch < 1)
        return mi_fail(ctx, MI_STATUS_WORKSPACE_TOO_SMALL,
                       "XAttention estimate: scratch of %zu bytes, needs %zu", scratch_bytes, one);
    const int64_t smem = R * (int64_t)sizeof(float);
    if (smem > mi_cuda_smem_per_block())
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "XAttention estimate: %lld row blocks exceed this GPU's shared memory",
                       (long long)R);
    cudaStream_t stream = mi_stream(ctx);
    cudaError_t e = cudaFuncSetAttribute(xa_select_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    xa_params p;
    memset(&p, 0, sizeof(p));
    p.q = q->data;
    p.k = k->data;
    for (int i = 0; i < 3; i++) p.q_stride[i] = q->stride[i], p.k_stride[i] = k->stride[i];
    p.heads = (int32_t)s->heads_q;
    p.group = (int32_t)s->group;
    p.head_dim = (int32_t)s->head_dim;
    p.q_off = (int32_t)s->q_off;
    p.row_blocks = (int32_t)R;
    p.dense_below = dense_below;
    p.mass = static_cast<float *>(scratch);
    p.block_count = index->block_count;
    p.block_offset = index->block_offset;
    p.column_count = index->column_count;
    p.max_blocks = index->max_blocks;
    const int64_t cap = per_launch < XA_MAX_PAIRS ? per_launch : XA_MAX_PAIRS;
    const bool bf = s->dtype == MI_DTYPE_BF16;
    /* the pairs gathered so far: their masses, then their selection */
    auto flush = [&]() {
        int64_t rows = 0; /* the widest grid a pair needs: reshaped rows of the smallest S */
        for (int j = 0; j < p.n_pairs; j++) {
            const int64_t nr = (p.len[j] + 63) / 64 * (64 / p.stride[j]);
            if (p.len[j] >= dense_below && nr > rows) rows = nr;
        }
        if (rows > 0) {
            const dim3 grid((unsigned)((rows + 63) / 64), (unsigned)p.n_pairs);
            if (bf)
                xa_mass_kernel<__nv_bfloat16><<<grid, XA_NT, 0, stream>>>(p);
            else
                xa_mass_kernel<__half><<<grid, XA_NT, 0, stream>>>(p);
        }
        xa_select_kernel<<<dim3((unsigned)R, (unsigned)p.n_pairs), XA_NT, (size_t)smem, stream>>>(
            p);
        p.n_pairs = 0;
        return cudaGetLastError();
    };
    for (int64_t b = 0; b < s->batch && e == cudaSuccess; b++) {
        for (int64_t h = 0; h < s->heads_q && e == cudaSuccess; h++) {
            if (active && !active[h]) continue;
            const int i = p.n_pairs++;
            p.pair_b[i] = (int16_t)b;
            p.pair_h[i] = (int16_t)h;
            p.len[i] = ap.seq_lens[b];
            p.stride[i] = stride[h];
            p.threshold[i] = threshold[h];
            p.mul_log2[i] = scale / (float)stride[h] * MI_LOG2E;
            if (p.n_pairs == cap) e = flush();
        }
    }
    if (e == cudaSuccess && p.n_pairs > 0) e = flush();
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA XAttention estimate: %s",
                       cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}
