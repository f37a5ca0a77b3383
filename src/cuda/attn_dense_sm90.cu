/*
 * attn_dense_sm90.cu: the Hopper (sm_90a) dense causal attention kernel, D = 128 or 64, for
 * launches whose every head is dense and whose sequences all have the full length (the dense
 * fallback and mi_cuda_attention_dense); everything else runs the ring kernel of attn_fwd_sm90.cu
 * (at D = 128 also the sparse kernel of attn_sparse_sm90.cu). Described for D = 128; at D = 64
 * the tiles are one 64-column half, S takes 4 k-steps and P V is m64n64k16.
 *
 * Warp-specialised, one CTA of three warpgroups per SM over 128 query rows:
 *   - warpgroup 0 is the producer: one thread loads Q once and K and V BN = 176 keys at a time
 *     with TMA (4-D tensor maps d, row, head, batch, in the 128-byte swizzle wgmma reads) into
 *     two stages each, with full / empty mbarriers;
 *   - warpgroups 1 and 2 are consumers of 64 rows each that share every K and V tile. Each step
 *     issues S(t) = Q K(t)^T and O += P(t-1) V(t-1) together and runs the softmax of S(t) while
 *     P V(t-1) is in flight; the two take turns at the tensor cores (two named barriers), so
 *     that one's softmax runs under the other's GEMMs;
 *   - setmaxnreg gives the producer 24 registers and the consumers 240.
 * Invariants: only the tiles that reach past a consumer's first row need the causal mask; keys
 * past the sequence arrive as zeros (TMA fills what lies outside the tensor, hence the full
 * length: a shorter sequence would read its padding).
 * The same code computes the chunks of Tri-shape's dense last rows (tri_chunk_sm90_kernel; see
 * tri_split_args in attn_plan.cuh): its tiles start at a chunk's first key, a CTA takes two row
 * blocks, and each consumer writes its block's unnormalised rows, maxima and sums for the merge.
 * Entry point: mi_cuda_attn_sm90_dense_launch (tile width BN = 176, or 128 for A/B runs).
 */
#include "sm90_common.cuh"

#include <stdio.h>
#include <stdlib.h>

namespace mi_cuda {

/* The kernel's arguments: tensor maps of Q, K and V and what the epilogue needs. */
struct dense_sm90_args {
    CUtensorMap tm_q, tm_k, tm_v;
    void *o;
    float *lse; /* [B, H, len] or NULL */
    int64_t o_stride[3];
    int heads, group, len;
    float scale_log2;
    /* 0: every head; else the grid runs heads listed[0, n_listed) of each sequence (the dense
     * heads of a launch whose other heads run the sparse kernels) */
    int n_listed;
    int16_t listed[MI_CUDA_MAX_HEADS];
};

constexpr int DS_BM = 128, DS_STAGES = 2;
constexpr int DS_HALF = 128 * 128; /* one 64-column half of a 128-row tile, bytes */
/* the 128 x D tile of Q: D / 64 halves */
template <int D> constexpr int ds_q_tile() { return D / 64 * DS_HALF; }
/* K and V come in tiles of BN keys (128 or 176), each D / 64 halves of BN rows of 64 columns */
template <int BN> constexpr int ds_kv_half() { return BN * 128; }
template <int BN, int D> constexpr int ds_kv_tile() { return D / 64 * ds_kv_half<BN>(); }
/* Q, two K and two V stages, the mbarriers; plus 1 KB to align the tiles to 1024 bytes (the
 * 128-byte swizzle repeats every 8 rows of 128 bytes) */
template <int BN, int D> constexpr size_t ds_smem() {
    return 1024 + ds_q_tile<D>() + 2 * DS_STAGES * ds_kv_tile<BN, D>() + 16 * sizeof(uint64_t);
}
static_assert(ds_smem<176, 128>() <= 227 * 1024, "176-key tiles fit a CTA's shared memory");

/* One CTA per pair of row blocks, not persistent: the CTAs that run together are adjacent row
 * blocks of one head, which stream the same K/V through L2 at the same pace. Two K/V stages are
 * enough for the loads to arrive in time. The consumers' loop is bound by its instructions per
 * step (the softmax's FFMA, MUFU, FADD and FMNMX, the reductions, barriers, waits and
 * descriptors), not by one pipe: hence K/V tiles of 176 keys (S by m64n176k16, FlashAttention-3's
 * tile for D = 128), over which a step's fixed instructions spread. At D = 64 the softmax, not
 * the tensor work, bounds it. A list of heads for the grid (dense_sm90_args::listed) lets a
 * mixed launch's dense heads run here instead of on the ring kernel. */
template <typename T, int BN, int D, bool CHUNK>
__device__ __forceinline__ void dense_rows(const dense_sm90_args &a, const mi_cuda_attn_params *p,
                                           const tri_split_args *sa) {
#ifdef MI_SM90_DEVICE
    static_assert(BN == 128 || BN == 176, "the S wgmma shapes wg<T> wraps");
    constexpr int KH = ds_kv_half<BN>(), KT = ds_kv_tile<BN, D>(), NS = BN / 2, NO = D / 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *base = smem_base_1024(smem_raw);
    unsigned char *qs = base, *ks = qs + ds_q_tile<D>(), *vs = ks + DS_STAGES * KT;
    uint64_t *bars = reinterpret_cast<uint64_t *>(vs + DS_STAGES * KT);
    uint64_t *q_full = bars, *k_full = bars + 1, *v_full = k_full + DS_STAGES,
             *k_empty = v_full + DS_STAGES, *v_empty = k_empty + DS_STAGES;

    const int tid = threadIdx.x;
    /* values that steer wgmma come from lane 0: ptxas serialises wgmma under branches on values
     * it cannot prove warp-uniform (C7520) */
    const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
    /* rows rs .. rs + 127 of (b, h), tiles of keys from kbase */
    int b, h, rs, len, kbase, n_tiles;
    if constexpr (CHUNK) { /* chunk blockIdx.x of row blocks 2 y and 2 y + 1 (tri_split_args) */
        int tri;
        if (!tri_rows_of(*p, *sa, blockIdx.z, b, h, len, tri)) return;
        rs = (tri / 64 + 2 * blockIdx.y) * 64;
        kbase = blockIdx.x * sa->chunk_tiles * 64;
        const int keys = min(rs + DS_BM, len); /* every key up to the last row */
        if (rs >= len || kbase >= keys) return;
        n_tiles = (min(kbase + sa->chunk_tiles * 64, keys) - kbase - 1) / BN + 1;
    } else {
        const int m_blk = gridDim.x - 1 - blockIdx.x; /* the longest row blocks first */
        const int bh = blockIdx.y;
        if (a.n_listed > 0)
            b = bh / a.n_listed, h = a.listed[bh % a.n_listed];
        else
            b = bh / a.heads, h = bh % a.heads;
        rs = m_blk * DS_BM;
        len = a.len;
        kbase = 0;
        n_tiles = (min(rs + DS_BM, a.len) - 1) / BN + 1;
    }
    const int hk = h / a.group;

    if (tid == 0) {
        mbar_init(q_full, 1);
        init_stage_barriers(k_full, v_full, k_empty, v_empty, DS_STAGES);
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wgi == 0) {
        setmaxnreg_dec<24>();
        if (tid != 0) return;
        tma_load_tile<128, D>(smem_addr(qs), &a.tm_q, rs, h, b, q_full);
        for (int t = 0; t < n_tiles; ++t) {
            const int slot = t % DS_STAGES, par = ((t / DS_STAGES) - 1) & 1;
            const uint32_t kd = smem_addr(ks) + slot * KT, vd = smem_addr(vs) + slot * KT;
            if (t >= DS_STAGES)
                while (!mbar_try_wait(k_empty + slot, par)) {
                }
            tma_load_tile<BN, D>(kd, &a.tm_k, kbase + t * BN, hk, b, k_full + slot);
            if (t >= DS_STAGES)
                while (!mbar_try_wait(v_empty + slot, par)) {
                }
            tma_load_tile<BN, D>(vd, &a.tm_v, kbase + t * BN, hk, b, v_full + slot);
        }
        return;
    }

    setmaxnreg_inc<240>();
    const int cw = wgi - 1; /* consumer 0 or 1: rows rs + 64 cw .. + 63 */
    const int ct = tid - 128 * wgi;
    const int warp = ct / 32, lane = ct % 32, g = lane / 4, cq = lane % 4;
    const int first_row = rs + cw * 64, qrow0 = first_row + warp * 16 + g, qrow1 = qrow0 + 8;
    /* turn-taking: consumer cw issues after a sync on barrier 1 + cw, then lets the other go */
    const int my_bar = 1 + cw, other_bar = 2 - cw;
    if (cw == 1) named_barrier_arrive(1, 256); /* consumer 0 goes first */

    const sw128_desc qd(smem_addr(qs) + cw * 64 * 128, 16, 1024);
    float o[NO], s[NS];
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = 0.f;
    row_softmax sm;
    const float sc = a.scale_log2;

    auto issue_s = [&](int t) {
        const sw128_desc kd(smem_addr(ks) + (t % DS_STAGES) * KT, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint64_t qa = qd.at((kk >> 2) * DS_HALF + (kk & 3) * 32);
            const uint64_t kb = kd.at((kk >> 2) * KH + (kk & 3) * 32);
            if constexpr (BN == 176)
                wg<T>::ss176(s, qa, kb, kk > 0);
            else
                wg<T>::ss128(s, qa, kb, kk > 0);
        }
    };
    auto issue_pv = [&](int t) {
        const sw128_desc vd(smem_addr(vs) + (t % DS_STAGES) * KT, KH, 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv<T, D>(o, pa[kk], vd.at(kk * 16 * 128));
    };
    /* a tile on the diagonal: keys after the row (and so every key past the sequence) get
     * -inf. Tiles of 128 keys: the last; of 176: the last one or two (mask_needed). */
    auto mask_needed = [&](int t) { return kbase + t * BN + BN - 1 > first_row; };
    auto mask_diag = [&](int t) {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = kbase + t * BN + 8 * j + 2 * cq + (e & 1);
                s[4 * j + e] = key > (e < 2 ? qrow0 : qrow1) ? -INFINITY : s[4 * j + e];
            }
    };

    mbar_wait(q_full, 0);
    mbar_wait(k_full, 0);
    named_barrier_sync(my_bar, 256);
    wgmma_fence();
    issue_s(0);
    wgmma_commit();
    if (cw == 0 || n_tiles > 1) named_barrier_arrive(other_bar, 256);
    wgmma_wait<0>();
    fence_operands<NS>(s);
    warp_arrive(k_empty);
    if (mask_needed(0)) mask_diag(0);
    sm.update<BN / 8>(s, sc); /* O is still 0: nothing to rescale */
    pack_p<T, BN / 16>(pa, s);

    for (int t = 1; t < n_tiles; ++t) {
        const int ks_slot = t % DS_STAGES, vs_slot = (t - 1) % DS_STAGES;
        /* both waits before the fence: a wait loop between two wgmma makes ptxas insert a
         * warpgroup.arrive of its own (C7519) */
        mbar_wait(k_full + ks_slot, (t / DS_STAGES) & 1);
        mbar_wait(v_full + vs_slot, ((t - 1) / DS_STAGES) & 1);
        named_barrier_sync(my_bar, 256);
        wgmma_fence();
        issue_s(t);
        wgmma_commit();
        issue_pv(t - 1);
        wgmma_commit();
        if (cw == 0 || t < n_tiles - 1) named_barrier_arrive(other_bar, 256);
        wgmma_wait<1>(); /* S(t) done; P V(t-1) may still run */
        fence_operands<NS>(s);
        warp_arrive(k_empty + ks_slot);
        if (mask_needed(t)) mask_diag(t);
        const float2 al = sm.update<BN / 8>(s, sc);
        wgmma_wait<0>();
        fence_operands<NO>(o);
        warp_arrive(v_empty + vs_slot);
        /* past the first tiles a row's max rarely moves (al = exp2(0) = 1 exactly) */
        if (!__all_sync(0xffffffffu, al.x == 1.f && al.y == 1.f)) rescale_o<D>(o, al);
        pack_p<T, BN / 16>(pa, s);
    }
    const int last = n_tiles - 1;
    mbar_wait(v_full + last % DS_STAGES, (last / DS_STAGES) & 1);
    wgmma_fence();
    issue_pv(last);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands<NO>(o);

    if constexpr (CHUNK) { /* this consumer's row block: unnormalised rows, maxima and sums */
        if (first_row >= len) return;
        const int64_t item =
            ((int64_t)blockIdx.z * sa->max_rb + 2 * blockIdx.y + cw) * sa->max_chunks + blockIdx.x;
        const int r0 = warp * 16 + g, r1 = r0 + 8;
        float *op = sa->o_part + item * 64 * D;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            const int c = 8 * i + 2 * cq;
            *reinterpret_cast<float2 *>(op + r0 * D + c) = make_float2(o[4 * i], o[4 * i + 1]);
            *reinterpret_cast<float2 *>(op + r1 * D + c) = make_float2(o[4 * i + 2], o[4 * i + 3]);
        }
        const float l0 = quad_sum(sm.l0), l1 = quad_sum(sm.l1);
        if (cq == 0) {
            sa->ml_part[item * 64 + r0] = make_float2(sm.m0, l0);
            sa->ml_part[item * 64 + r1] = make_float2(sm.m1, l1);
        }
    } else {
        T *og = reinterpret_cast<T *>(a.o) + b * a.o_stride[0] + h * a.o_stride[1];
        float *lseg = a.lse ? a.lse + ((int64_t)b * a.heads + h) * a.len : nullptr;
        store_rows<T, D>(og, a.o_stride[2], lseg, sm, o, qrow0, qrow1, a.len, a.len, cq);
    }
#endif
}

template <typename T, int BN, int D>
__global__ void __launch_bounds__(384, 1)
    attn_dense_sm90_kernel(const __grid_constant__ dense_sm90_args a) {
    dense_rows<T, BN, D, false>(a, nullptr, nullptr);
}

/* The Tri-shape chunks (tri_split_args), two row blocks a CTA: the dense kernel over a chunk's
 * keys. */
template <typename T, int D>
__global__ void __launch_bounds__(384, 1)
    tri_chunk_sm90_kernel(const __grid_constant__ dense_sm90_args a,
                          const __grid_constant__ mi_cuda_attn_params p,
                          const __grid_constant__ tri_split_args sa) {
    dense_rows<T, 128, D, true>(a, &p, &sa);
}

/* The dense kernel's arguments from launch p, but for the tensor maps: every head (n_listed 0). */
static void dense_args_of(dense_sm90_args &a, const mi_cuda_attn_params &p) {
    a.o = p.o;
    a.lse = p.lse;
    for (int i = 0; i < 3; ++i) a.o_stride[i] = p.o_stride[i];
    a.heads = p.heads;
    a.group = p.group;
    a.len = p.len;
    a.scale_log2 = p.scale_log2;
    a.n_listed = 0;
}

template <int BN, int D>
static cudaError_t launch_dense(const dense_sm90_args &a, int batch, bool bf16, cudaStream_t st) {
    auto kern =
        bf16 ? attn_dense_sm90_kernel<__nv_bfloat16, BN, D> : attn_dense_sm90_kernel<__half, BN, D>;
    constexpr size_t smem = ds_smem<BN, D>();
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((a.len + DS_BM - 1) / DS_BM, batch * (a.n_listed > 0 ? a.n_listed : a.heads));
    kern<<<grid, 384, smem, st>>>(a);
    return cudaGetLastError();
}

cudaError_t tri_split_sm90_launch(const mi_cuda_attn_params &p, const tri_split_args &sa, int64_t z,
                                  cudaStream_t st, bool *used) {
    *used = false;
    static thread_local dense_sm90_args a; /* tensor maps: off the stack */
    const bool bf16 = p.dtype == MI_DTYPE_BF16;
    const int d = p.head_dim;
    /* sequences of the full length only, as for the dense launch: a chunk's last tile may reach
     * past its sequence, whose padding would be read as it is (a zero probability times a NaN
     * there is NaN), where past the tensor TMA reads zeros */
    if (!encode_qkv_maps(&a.tm_q, &a.tm_k, &a.tm_v, &p, DS_BM, 128)) return cudaSuccess;
    dense_args_of(a, p); /* (the chunks write their own scratch, not o or lse) */
    *used = true;
    auto kern =
        d == 64
            ? (bf16 ? tri_chunk_sm90_kernel<__nv_bfloat16, 64> : tri_chunk_sm90_kernel<__half, 64>)
            : (bf16 ? tri_chunk_sm90_kernel<__nv_bfloat16, 128>
                    : tri_chunk_sm90_kernel<__half, 128>);
    const size_t smem = d == 64 ? ds_smem<128, 64>() : ds_smem<128, 128>();
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kern<<<dim3(sa.max_chunks, (sa.max_rb + 1) / 2, z), 384, smem, st>>>(a, p, sa);
    return cudaGetLastError();
}

} // namespace mi_cuda

/* Runs the launch with the dense kernel when it applies: every head dense (uniform mode) or the
 * n_listed > 0 heads listed (the others left to the caller), every sequence of the full length,
 * D = 128 or 64, tensors TMA can address, and not switched off by the tuning (sm90_dense = -1).
 * *used = 0 (and cudaSuccess) when it does not apply. */
extern "C" cudaError_t mi_cuda_attn_sm90_dense_launch(const mi_cuda_attn_params *p,
                                                      const int16_t *listed, int n_listed,
                                                      const mi_tuning *t, cudaStream_t st,
                                                      int *used) {
    *used = 0;
    const bool uniform = !p->use_head_modes && p->mode.mode == MI_CUDA_MODE_DENSE;
    if (t->sm90_dense < 0 || (n_listed <= 0 && !uniform) || n_listed > p->heads ||
        (p->head_dim != 128 && p->head_dim != 64))
        return cudaSuccess;
    static thread_local mi_cuda::dense_sm90_args a; /* tensor maps: off the stack */
    const bool bf16 = p->dtype == MI_DTYPE_BF16;
    constexpr int bn = 176; /* K/V tiles of 176 keys */
    if (!mi_cuda::encode_qkv_maps(&a.tm_q, &a.tm_k, &a.tm_v, p, mi_cuda::DS_BM, bn))
        return cudaSuccess;
    mi_cuda::dense_args_of(a, *p);
    a.n_listed = n_listed > 0 ? n_listed : 0;
    for (int i = 0; i < a.n_listed; ++i) a.listed[i] = listed[i];
    *used = 1;
    if (p->head_dim == 64) return mi_cuda::launch_dense<bn, 64>(a, p->batch, bf16, st);
    return mi_cuda::launch_dense<bn, 128>(a, p->batch, bf16, st);
}
