/*
 * attn_fwd.cu: one flash-attention forward kernel (FlashAttention-2 style, sm_80 mma.sync) that
 * serves every pattern. A CTA owns BM query rows of one (b, h) and walks a list of 64-key tiles:
 *   phase A: contiguous 64-key ranges starting anywhere (dense: 0, 64, ...; A-shape: sinks then
 *            window; sparse: block_offset[]),
 *   phase B: gathered single columns, 64 at a time (sparse: column_index[]).
 * Key positions of the tile sit in shared memory, so one mask test (causal, sequence length,
 * A-shape window) covers all tile kinds; tiles that are provably fully visible skip the mask.
 * K/V rows that do not exist are zero-filled by cp.async, so a masked probability (0) never
 * multiplies garbage.
 * Its tile step also computes the dense last rows of Tri-shape heads split over chunks of keys,
 * on every GPU (attn_tri_split_kernel, merged by tri_merge_kernel; see tri_split_plan.cuh). On
 * Hopper the chunks run on the dense wgmma kernel instead (tri_chunk_sm90_kernel,
 * attn_dense_sm90.cu).
 * Entry points: mi_cuda_attn_run (picks the Hopper kernels where they apply), the public
 * mi_cuda_attention_dense / _a_shape / _sparse, and mi_cuda_fill_attn_params.
 */
#include "attn_plan.cuh"
#include "tri_split_plan.cuh"

#include <algorithm>
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace mi_cuda {

template <int D> struct attn_smem {
    static constexpr int PITCH = D + 8; /* +16 bytes a row: ldmatrix rows land on distinct banks */
};

/* The kernel's body, shared by the entry points below; SPLIT: a Tri-shape chunk (see
 * tri_split_args) instead of a whole row block. */
template <typename T, int D, int BM, bool SPLIT = false>
__device__ __forceinline__ void attn_fwd_rows(const mi_cuda_attn_params &p,
                                              const tri_split_args *sa = nullptr) {
    constexpr int NW = BM / 16;
    constexpr int NT = NW * 32;
    constexpr int PITCH = attn_smem<D>::PITCH;
    constexpr int CPR = D / 8; /* 16-byte chunks per row */
    using tr = dtype_traits<T>;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *qs = reinterpret_cast<T *>(smem_raw);
    T *ks = qs + BM * PITCH;                                  /* [2][BN][PITCH] */
    T *vs = ks + 2 * BN * PITCH;                              /* [2][BN][PITCH] */
    int *kpos = reinterpret_cast<int *>(vs + 2 * BN * PITCH); /* [2][BN] */

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    int m_blk, bh, b, h, len;
    if constexpr (SPLIT) {
        static_assert(BM == BN, "a chunk's row block is one 64-row block");
        int tri;
        if (!tri_rows_of(p, *sa, blockIdx.z, b, h, len, tri)) return;
        m_blk = tri / BN + blockIdx.y;
        bh = b * p.heads + h;
    } else {
        m_blk = p.q_off / BM + (int)(gridDim.x - 1 - blockIdx.x); /* heavy (late) first */
        bh = blockIdx.y;
        b = bh / p.heads, h = bh % p.heads;
        len = p.seq_lens[b];
    }
    const int hk = h / p.group;
    const int rs = m_blk * BM;

    const T *qg = reinterpret_cast<const T *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    const T *kg = reinterpret_cast<const T *>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
    const T *vg = reinterpret_cast<const T *>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];
    T *og = reinterpret_cast<T *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    /* q, o and lse rows are absolute positions minus q_off (rows before it are not there) */
    const int q_off = SPLIT ? 0 : p.q_off;
    float *lseg = p.lse ? p.lse + ((int64_t)b * p.heads + h) * (p.len - q_off) : nullptr;

    tile_plan tp;
    if constexpr (SPLIT) { /* every causal key of the block: this chunk's tiles of them */
        if (rs >= len) return;
        const int all = (min(rs + BM, len) - 1) / BN + 1, t0 = blockIdx.x * sa->chunk_tiles;
        if (t0 >= all) return;
        tp.mode = MI_CUDA_MODE_DENSE;
        tp.windowed = false;
        tp.n_a = min(all - t0, sa->chunk_tiles);
        tp.n_b = tp.n_cols = 0;
        tp.sink_tiles = 0;
        tp.win_start = t0;
        tp.offsets = tp.cols = nullptr;
        tp.win = {0, 0x7fffffff, 0x7fffffff};
    } else if (!plan_tiles(p, h, bh, m_blk, rs, BM, len, tp)) {
        return;
    }
    const int n_tiles = tp.n_a + tp.n_b;

    /* ---- rows without work: zeros, LSE -inf ---- */
    if (!SPLIT && n_tiles == 0) {
        const int rows = min(BM, p.len - rs);
        for (int i = tid; i < rows * CPR; i += NT) {
            const int r = i / CPR, c = i % CPR;
            if (rs + r >= q_off)
                *reinterpret_cast<uint4 *>(og + (int64_t)(rs + r - q_off) * p.o_stride[2] + c * 8) =
                    make_uint4(0, 0, 0, 0);
        }
        if (lseg)
            for (int r = tid; r < rows; r += NT)
                if (rs + r >= q_off) lseg[rs + r - q_off] = -INFINITY;
        return;
    }

    /* ---- async loads ---- */
    for (int i = tid; i < BM * CPR; i += NT) {
        const int r = i / CPR, c = i % CPR;
        const int row = rs + r;
        const bool ok = row < len && row >= q_off;
        const T *src = qg + (int64_t)(ok ? row - q_off : 0) * p.q_stride[2] + c * 8;
        cp_async_16(qs + r * PITCH + c * 8, src, ok ? 16 : 0);
    }
    auto load_kv = [&](int t, int buf) {
        T *kd = ks + buf * BN * PITCH;
        T *vd = vs + buf * BN * PITCH;
#pragma unroll
        for (int i = tid; i < BN * CPR; i += NT) {
            const int r = i / CPR, c = i % CPR;
            const int pos = tile_key(tp, t, r, len);
            const bool ok = pos != MI_NO_KEY;
            const int64_t row = ok ? pos : 0;
            cp_async_16(kd + r * PITCH + c * 8, kg + row * p.k_stride[2] + c * 8, ok ? 16 : 0);
            cp_async_16(vd + r * PITCH + c * 8, vg + row * p.v_stride[2] + c * 8, ok ? 16 : 0);
            if (c == 0) kpos[buf * BN + r] = pos;
        }
    };
    load_kv(0, 0);
    cp_async_commit();

    /* ---- per-thread state: rows r0 = warp*16 + lane/4 and r0 + 8 ---- */
    const int g = lane / 4, cq = lane % 4;
    const int qrow0 = rs + warp * 16 + g, qrow1 = qrow0 + 8;
    float acc_o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    uint32_t qf[D / 16][4];

    for (int t = 0; t < n_tiles; ++t) {
        const int buf = t & 1;
        if (t + 1 < n_tiles) {
            load_kv(t + 1, buf ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (t == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const int r = warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
                const int c = kk * 16 + 8 * (lane / 16);
                ldmatrix_x4(qf[kk], qs + r * PITCH + c);
            }
        }
        const T *kb = ks + buf * BN * PITCH;
        const T *vb = vs + buf * BN * PITCH;

        /* S = Q K^T, 16 x 64 per warp */
        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t bfr[4];
                const int key = 16 * j + (lane % 8) + 8 * (lane / 16);
                const int d = kk * 16 + 8 * ((lane / 8) % 2);
                ldmatrix_x4(bfr, kb + key * PITCH + d);
                mma_16816<T>(s[2 * j], qf[kk], bfr);
                mma_16816<T>(s[2 * j + 1], qf[kk], bfr + 2);
            }
        }

        /* scale, mask */
        const bool full =
            t < tp.n_a && range_tile_unmasked(tp, tile_offset(tp, t), rs, rs + BM - 1, len);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] *= p.scale_log2;
        if (!full) {
            const int *kp = kpos + buf * BN;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kp[8 * j + 2 * cq + (e & 1)];
                    const int row = e < 2 ? qrow0 : qrow1;
                    /* the window test only where there is a window (a uniform branch) */
                    if (tp.windowed ? !key_visible(tp, key, row) : key > row) s[j][e] = -INFINITY;
                }
            }
        }

        /* online softmax (base 2) */
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        mx0 = warp_max_xor(warp_max_xor(mx0, 1), 2);
        mx1 = warp_max_xor(warp_max_xor(mx1, 1), 2);
        const float mu0 = mx0 == -INFINITY ? 0.f : mx0;
        const float mu1 = mx1 == -INFINITY ? 0.f : mx1;
        const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
        m0 = mx0;
        m1 = mx1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s[j][0] = exp2f(s[j][0] - mu0);
            s[j][1] = exp2f(s[j][1] - mu0);
            s[j][2] = exp2f(s[j][2] - mu1);
            s[j][3] = exp2f(s[j][3] - mu1);
            rs0 += s[j][0] + s[j][1];
            rs1 += s[j][2] + s[j][3];
        }
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            acc_o[i][0] *= al0;
            acc_o[i][1] *= al0;
            acc_o[i][2] *= al1;
            acc_o[i][3] *= al1;
        }

        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            uint32_t a[4];
            a[0] = tr::pack2(s[2 * kk][0], s[2 * kk][1]);
            a[1] = tr::pack2(s[2 * kk][2], s[2 * kk][3]);
            a[2] = tr::pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            a[3] = tr::pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dn = 0; dn < D / 16; ++dn) {
                uint32_t bfr[4];
                const int key = 16 * kk + (lane % 8) + 8 * ((lane / 8) % 2);
                const int d = 16 * dn + 8 * (lane / 16);
                ldmatrix_x4_trans(bfr, vb + key * PITCH + d);
                mma_16816<T>(acc_o[2 * dn], a, bfr);
                mma_16816<T>(acc_o[2 * dn + 1], a, bfr + 2);
            }
        }
        __syncthreads();
    }

    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    if constexpr (SPLIT) { /* the chunk's unnormalised rows, its max and sum */
        const int64_t item =
            ((int64_t)blockIdx.z * sa->max_rb + blockIdx.y) * sa->max_chunks + blockIdx.x;
        const int r0 = warp * 16 + g, r1 = r0 + 8;
        float *op = sa->o_part + item * BM * D;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            const int c = 8 * i + 2 * cq;
            *reinterpret_cast<float2 *>(op + r0 * D + c) = make_float2(acc_o[i][0], acc_o[i][1]);
            *reinterpret_cast<float2 *>(op + r1 * D + c) = make_float2(acc_o[i][2], acc_o[i][3]);
        }
        if (cq == 0) {
            sa->ml_part[item * BM + r0] = make_float2(m0, l0);
            sa->ml_part[item * BM + r1] = make_float2(m1, l1);
        }
        return;
    }

    /* ---- epilogue: normalise, stage through shared memory, 16-byte stores ---- */
    const bool live0 = qrow0 < len && l0 > 0.f, live1 = qrow1 < len && l1 > 0.f;
    const float inv0 = live0 ? 1.f / l0 : 0.f, inv1 = live1 ? 1.f / l1 : 0.f;
    T *stage = qs + warp * 16 * PITCH; /* this warp's own Q rows, no longer read */
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
        const int c = 8 * i + 2 * cq;
        *reinterpret_cast<uint32_t *>(stage + g * PITCH + c) =
            tr::pack2(acc_o[i][0] * inv0, acc_o[i][1] * inv0);
        *reinterpret_cast<uint32_t *>(stage + (g + 8) * PITCH + c) =
            tr::pack2(acc_o[i][2] * inv1, acc_o[i][3] * inv1);
    }
    if (lseg && cq == 0) {
        if (qrow0 < p.len && qrow0 >= q_off)
            lseg[qrow0 - q_off] = live0 ? m0 * MI_LN2 + logf(l0) : -INFINITY;
        if (qrow1 < p.len && qrow1 >= q_off)
            lseg[qrow1 - q_off] = live1 ? m1 * MI_LN2 + logf(l1) : -INFINITY;
    }
    __syncwarp();
    for (int i = lane; i < 16 * CPR; i += 32) {
        const int r = i / CPR, c = i % CPR;
        const int row = rs + warp * 16 + r;
        if (row < p.len && row >= q_off)
            *reinterpret_cast<uint4 *>(og + (int64_t)(row - q_off) * p.o_stride[2] + c * 8) =
                *reinterpret_cast<const uint4 *>(stage + r * PITCH + c * 8);
    }
}

template <typename T, int D, int BM>
__global__ void __launch_bounds__(BM * 2)
    attn_fwd_kernel(const __grid_constant__ mi_cuda_attn_params p) {
    attn_fwd_rows<T, D, BM>(p);
}

/* On Hopper (where this kernel runs only when the wgmma kernels are switched off), D = 64 must
 * keep two CTAs of 256 threads (or four of 128) an SM, i.e. at most 128 registers a thread:
 * left to itself ptxas gives it more, and one CTA an SM. The sm_80 build keeps ptxas's choice:
 * held to 128 registers it spills 44 bytes. D = 128 keeps ptxas's choice everywhere. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MI_ATTN_D64_BOUNDS(BM) __launch_bounds__((BM) * 2, 256 / (BM))
#else
#define MI_ATTN_D64_BOUNDS(BM) __launch_bounds__((BM) * 2)
#endif
template <typename T, int BM>
__global__ void MI_ATTN_D64_BOUNDS(BM)
    attn_fwd_d64_kernel(const __grid_constant__ mi_cuda_attn_params p) {
    attn_fwd_rows<T, 64, BM>(p);
}

/* A chunk of Tri-shape rows (tri_split_args), on every GPU: the sm_80 kernel's tile step. */
template <typename T, int D>
__global__ void __launch_bounds__(128)
    attn_tri_split_kernel(const __grid_constant__ mi_cuda_attn_params p,
                          const __grid_constant__ tri_split_args sa) {
    attn_fwd_rows<T, D, 64, true>(p, &sa);
}

/* Combines the chunks of one Tri-shape row (a CTA per row, a thread per dimension): the softmax
 * of the whole row from the chunks' maxima and sums, written over what the main launch wrote for
 * it. Row blockIdx.x % 64 of the row block blockIdx.x / 64 of the rows (see tri_split_args). */
template <typename T, int D>
__global__ void __launch_bounds__(D) tri_merge_kernel(const __grid_constant__ mi_cuda_attn_params p,
                                                      const __grid_constant__ tri_split_args sa) {
    int b, h, len, tri;
    if (!tri_rows_of(p, sa, blockIdx.y, b, h, len, tri)) return;
    const int j = blockIdx.x / BN, r = blockIdx.x % BN, rs = (tri / BN + j) * BN, row = rs + r;
    if (row >= len || row < tri) return;
    const int chunks = ((min(rs + BN, len) - 1) / BN + sa.chunk_tiles) / sa.chunk_tiles;
    const int64_t item0 = ((int64_t)blockIdx.y * sa.max_rb + j) * sa.max_chunks;
    const float2 *ml = sa.ml_part + item0 * BN + r;
    const float *op = sa.o_part + (item0 * BN + r) * D + threadIdx.x;
    float mx = -INFINITY;
    for (int c = 0; c < chunks; ++c) mx = fmaxf(mx, ml[(int64_t)c * BN].x);
    float sum = 0.f, acc = 0.f;
#pragma unroll 4
    for (int c = 0; c < chunks; ++c) {
        const float2 mc = ml[(int64_t)c * BN];
        const float w = mc.x == -INFINITY ? 0.f : exp2f(mc.x - mx);
        sum += w * mc.y;
        acc += w * op[(int64_t)c * BN * D];
    }
    T *og = reinterpret_cast<T *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    og[(int64_t)row * p.o_stride[2] + threadIdx.x] =
        dtype_traits<T>::from_float(sum > 0.f ? acc / sum : 0.f);
    if (p.lse && threadIdx.x == 0)
        p.lse[((int64_t)b * p.heads + h) * p.len + row] =
            sum > 0.f ? mx * MI_LN2 + logf(sum) : -INFINITY;
}

/* The kernel of D and BM for T; D = 64 has its own entry point (its launch bounds). */
template <typename T, int D, int BM> constexpr auto attn_kernel() {
    if constexpr (D == 64)
        return attn_fwd_d64_kernel<T, BM>;
    else
        return attn_fwd_kernel<T, D, BM>;
}

template <int D, int BM>
static cudaError_t launch_attn(const mi_cuda_attn_params &p, bool bf16, cudaStream_t st) {
    constexpr int PITCH = attn_smem<D>::PITCH;
    static_assert(sizeof(__half) == sizeof(__nv_bfloat16), "one shared-memory size for both");
    const size_t smem = (size_t)(BM + 4 * BN) * PITCH * sizeof(__half) + 2 * BN * sizeof(int);
    auto kern = bf16 ? attn_kernel<__nv_bfloat16, D, BM>() : attn_kernel<__half, D, BM>();
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((p.len + BM - 1) / BM - p.q_off / BM, p.batch * p.heads);
    kern<<<grid, BM * 2, smem, st>>>(p);
    return cudaGetLastError();
}

/* The split and the merge (see tri_split_plan); pairs: the plan was made for the Hopper chunk
 * kernel, which runs it where it applies. */
template <typename T, int D>
static cudaError_t launch_tri_split(const mi_cuda_attn_params &p, const tri_split_args &sa,
                                    int64_t z, bool pairs, cudaStream_t st) {
    constexpr int PITCH = attn_smem<D>::PITCH;
    const size_t smem = (size_t)(BN + 4 * BN) * PITCH * sizeof(T) + 2 * BN * sizeof(int);
    auto kern = attn_tri_split_kernel<T, D>;
    bool on_sm90 = false;
    cudaError_t e = pairs ? tri_split_sm90_launch(p, sa, z, st, &on_sm90) : cudaSuccess;
    if (e != cudaSuccess) return e;
    if (!on_sm90) {
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        kern<<<dim3(sa.max_chunks, sa.max_rb, z), 128, smem, st>>>(p, sa);
    }
    tri_merge_kernel<T, D><<<dim3(sa.max_rb * BN, z), D, 0, st>>>(p, sa);
    return cudaGetLastError();
}

} // namespace mi_cuda

using namespace mi_cuda;

/* The launch as it was asked for (see tri_split_plan for the Tri-shape rows). */
static mi_status attn_launch(mi_context *ctx, const mi_cuda_attn_params *p, int block_m);

extern "C" mi_status mi_cuda_attn_run(mi_context *ctx, const mi_cuda_attn_params *p, int block_m) {
    if (p->len <= 0 || p->batch <= 0 || p->heads <= 0) return MI_STATUS_SUCCESS;
    /* queries at an offset: one launch, Tri-shape rows included (the split plans whole rows) */
    if (p->q_off > 0) return attn_launch(ctx, p, block_m);
    static thread_local tri_split_args sa;
    int64_t z = 0;
    const mi_tuning &t = ctx->tuning;
    tri_split_knobs k;
    k.pairs = mi_cuda_sm90_on(t);
    k.from = t.tri_split > 0   ? t.tri_split
             : t.tri_split < 0 ? 0
             : k.pairs         ? TRI_SPLIT_FROM_SM90
                               : TRI_SPLIT_FROM;
    k.per_sm = 0;
    k.sms = mi_cuda_sm_count();
    const int64_t items = tri_split_plan(*p, k, sa, z);
    if (items == 0 || sa.max_rb > 65535 || z > 65535) /* (beyond a grid: in one launch) */
        return attn_launch(ctx, p, block_m);
    static thread_local mi_cuda_attn_params a_only; /* 6 KB: off the stack */
    a_only = *p;
    a_only.mode.n_last = 0;
    for (int h = 0; h < p->heads; ++h) a_only.head_modes[h].n_last = 0;
    mi_status s = attn_launch(ctx, &a_only, block_m);
    if (s != MI_STATUS_SUCCESS) return s;
    cudaStream_t st = mi_stream(ctx);
    const size_t o_bytes = (size_t)items * BN * p->head_dim * sizeof(float);
    const size_t bytes = (size_t)(items * tri_split_item_bytes(p->head_dim));
    void *scratch = nullptr;
    cudaError_t e = cudaMallocAsync(&scratch, bytes, st);
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR,
                       "CUDA attention: %zu bytes for Tri-shape rows: %s", bytes,
                       cudaGetErrorString(e));
    sa.o_part = static_cast<float *>(scratch);
    sa.ml_part = reinterpret_cast<float2 *>(static_cast<char *>(scratch) + o_bytes);
    const bool bf = p->dtype == MI_DTYPE_BF16, d64 = p->head_dim == 64;
    e = bf ? (d64 ? launch_tri_split<__nv_bfloat16, 64>(*p, sa, z, k.pairs, st)
                  : launch_tri_split<__nv_bfloat16, 128>(*p, sa, z, k.pairs, st))
           : (d64 ? launch_tri_split<__half, 64>(*p, sa, z, k.pairs, st)
                  : launch_tri_split<__half, 128>(*p, sa, z, k.pairs, st));
    const cudaError_t f = cudaFreeAsync(scratch, st);
    if (e == cudaSuccess) e = f;
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA attention, Tri-shape rows: %s",
                       cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

static mi_status attn_launch(mi_context *ctx, const mi_cuda_attn_params *p, int block_m) {
    if ((int64_t)p->batch * p->heads > 65535)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "CUDA attention: B*H = %lld exceeds 65535",
                       (long long)p->batch * p->heads);
    cudaStream_t st = mi_stream(ctx);
    cudaError_t e = cudaSuccess;
    const bool bf = p->dtype == MI_DTYPE_BF16;
    /* Hopper: every launch on its wgmma kernels (attn_fwd_sm90.cu), but queries at an offset;
     * elsewhere the kernel above */
    if (mi_cuda_sm90_on(ctx->tuning) && p->q_off == 0) {
        e = mi_cuda_attn_sm90_launch(p, &ctx->tuning, st);
    } else {
        const bool d64 = p->head_dim == 64;
        if (block_m == 128)
            e = d64 ? launch_attn<64, 128>(*p, bf, st) : launch_attn<128, 128>(*p, bf, st);
        else
            e = d64 ? launch_attn<64, 64>(*p, bf, st) : launch_attn<128, 64>(*p, bf, st);
    }
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA attention launch: %s",
                       cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

static int64_t tensor_align_ok(const mi_tensor *t) {
    if (((uintptr_t)t->data & 15u) != 0) return 0;
    for (int i = 0; i < 3; ++i)
        if (t->stride[i] % 8 != 0) return 0;
    return 1;
}

extern "C" mi_status mi_cuda_fill_attn_params(mi_context *ctx, const mi_attn_shape *s,
                                              const mi_tensor *q, const mi_tensor *k,
                                              const mi_tensor *v, const mi_tensor *out,
                                              const int32_t *seq_lens, float scale, float *lse,
                                              mi_cuda_attn_params *p) {
    if (s->dtype != MI_DTYPE_BF16 && s->dtype != MI_DTYPE_F16)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "CUDA kernels take bf16 or fp16 tensors, not %s",
                       mi_dtype_name(s->dtype));
    if (s->head_dim != 64 && s->head_dim != 128)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "CUDA kernels support head_dim 64 or 128, not %lld", (long long)s->head_dim);
    if (s->batch > MI_CUDA_MAX_BATCH || s->heads_q > MI_CUDA_MAX_HEADS)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                       "CUDA kernels support batch <= %d and heads <= %d, not %lld and %lld",
                       MI_CUDA_MAX_BATCH, MI_CUDA_MAX_HEADS, (long long)s->batch,
                       (long long)s->heads_q);
    if (s->len > 0x3fffffff)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "sequence too long for CUDA kernels");
    const mi_tensor *ts[4] = {q, k, v, out};
    const char *names[4] = {"q", "k", "v", "out"};
    for (int i = 0; i < 4; ++i)
        if (ts[i] && !tensor_align_ok(ts[i]))
            return mi_fail(ctx, MI_STATUS_UNSUPPORTED,
                           "CUDA kernels need %s 16-byte aligned with strides a multiple of 8",
                           names[i]);
    memset(p, 0, sizeof(*p));
    p->q = q->data;
    p->k = k ? k->data : nullptr;
    p->v = v ? v->data : nullptr;
    p->o = out ? out->data : nullptr;
    p->lse = lse;
    for (int i = 0; i < 3; ++i) {
        p->q_stride[i] = q->stride[i];
        p->k_stride[i] = k ? k->stride[i] : 0;
        p->v_stride[i] = v ? v->stride[i] : 0;
        p->o_stride[i] = out ? out->stride[i] : 0;
    }
    p->batch = (int32_t)s->batch;
    p->heads = (int32_t)s->heads_q;
    p->heads_kv = (int32_t)s->heads_kv;
    p->group = (int32_t)s->group;
    p->len = (int32_t)s->len;
    p->q_off = (int32_t)s->q_off;
    p->head_dim = (int32_t)s->head_dim;
    p->dtype = s->dtype;
    p->scale_log2 = scale * MI_LOG2E;
    p->mode.mode = MI_CUDA_MODE_DENSE;
    for (int64_t b = 0; b < s->batch; ++b)
        p->seq_lens[b] = (int32_t)mi_seq_len(seq_lens, b, s->len);
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Backend entry points                                                                        */

extern "C" mi_status mi_cuda_attention_dense(mi_context *ctx, const mi_attn_shape *s,
                                             const mi_tensor *q, const mi_tensor *k,
                                             const mi_tensor *v, const int32_t *seq_lens,
                                             float scale, mi_tensor *out, float *lse) {
    mi_cuda_attn_params p;
    mi_status st = mi_cuda_fill_attn_params(ctx, s, q, k, v, out, seq_lens, scale, lse, &p);
    if (st != MI_STATUS_SUCCESS) return st;
    p.mode.mode = MI_CUDA_MODE_DENSE;
    return mi_cuda_attn_run(ctx, &p, 128);
}

extern "C" mi_status mi_cuda_attention_a_shape(mi_context *ctx, const mi_attn_shape *s,
                                               const mi_tensor *q, const mi_tensor *k,
                                               const mi_tensor *v, const int32_t *seq_lens,
                                               int32_t n_init, int32_t n_local, int32_t n_last,
                                               float scale, mi_tensor *out, float *lse) {
    mi_cuda_attn_params p;
    mi_status st = mi_cuda_fill_attn_params(ctx, s, q, k, v, out, seq_lens, scale, lse, &p);
    if (st != MI_STATUS_SUCCESS) return st;
    p.mode.mode = MI_CUDA_MODE_A_SHAPE;
    p.mode.n_init = n_init;
    p.mode.n_local = n_local;
    p.mode.n_last = n_last;
    return mi_cuda_attn_run(ctx, &p, 64);
}

extern "C" mi_status mi_cuda_attention_sparse(mi_context *ctx, const mi_attn_shape *s,
                                              const mi_tensor *q, const mi_tensor *k,
                                              const mi_tensor *v, const int32_t *seq_lens,
                                              const mi_sparse_index *index, float scale,
                                              mi_tensor *out, float *lse) {
    mi_cuda_attn_params p;
    mi_status st = mi_cuda_fill_attn_params(ctx, s, q, k, v, out, seq_lens, scale, lse, &p);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t R = (s->len + MI_BLOCK_SIZE - 1) / MI_BLOCK_SIZE;
    if (index->row_blocks < R || index->batch != s->batch || index->heads != s->heads_q)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "sparse index is [%d, %d, %d], the call needs [%lld, %lld, %lld]",
                       index->batch, index->heads, index->row_blocks, (long long)s->batch,
                       (long long)s->heads_q, (long long)R);
    p.mode.mode = MI_CUDA_MODE_SPARSE;
    mi_cuda_attn_use_index(&p, index);
    return mi_cuda_attn_run(ctx, &p, 64);
}
