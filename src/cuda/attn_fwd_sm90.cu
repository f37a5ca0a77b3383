/*
 * attn_fwd_sm90.cu: the Hopper (sm_90a) variant of the attention kernel, D = 128 and 64:
 * warpgroup MMA (wgmma) instead of mma.sync, same tile plan (attn_plan.cuh), same masking and
 * numerics as attn_fwd.cu. (Described for D = 128; D = 64 is the same kernel with one 64-column
 * half per row, P V as 4 x m64n64k16, and four CTAs per SM.)
 *
 * A CTA is one warpgroup of 64 query rows. Q, K and V tiles sit in shared memory in the
 * 128-byte-swizzled K-major layout wgmma reads directly: each 128-column row is split in two
 * 64-column halves, and 16-byte chunk c of row r is stored at chunk c ^ (r & 7). S = Q K^T runs
 * as 8 x m64n64k16 with both operands from shared memory; O += P V as 4 x m64n128k16 with P from
 * registers (the accumulator layout of S is the register layout of the A operand) and V read
 * transposed (MN-major B).
 * Tiles arrive by cp.async (any key positions, as sparse tiles need); the writes are made visible
 * to the async proxy with fence.proxy.async before the barrier.
 * One kernel (the ring kernel) serves every mode (dense, A-/Tri-shape, sparse) in 64-row blocks,
 * three CTAs per SM, with K and V tiles in a ring of three shared-memory slots. Launches whose
 * every head is dense (and whose sequences have the full length) go to the warp-specialised
 * dense kernel instead (attn_dense_sm90.cu), and band-like sparse heads and A-/Tri-shape heads
 * to attn_sparse_sm90.cu (chosen per head on the device; this kernel then skips them).
 * Entry points: mi_cuda_sm90_usable, mi_cuda_attn_sm90_launch (at the end of this file).
 */
#include "sm90_common.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

namespace mi_cuda {

/* Sets the scores of keys row cannot see to -inf, where `needed` (decided when the tile was
 * loaded): a range tile wholly left of the diagonal (every tile of a dense row block but the
 * last) needs no test, nor does a gathered tile whose keys all exist and lie at or before the
 * block's first row. Range tile t starts at tile_offset; the keys of a gathered tile are in
 * kp[64]. Outside A-/Tri-shape the test is causality alone. */
__device__ __forceinline__ void mask_scores(float *s, const tile_plan &tp, int t, const int *kp,
                                            bool needed, int qrow0, int qrow1, int len) {
    if (!needed) return;
    const int cq = threadIdx.x % 4;
    const bool range = t < tp.n_a;
    const int off = range ? tile_offset(tp, t) : 0;
    auto key_of = [&](int col) {
        int key = range ? off + col : kp[col];
        if (range && (key < 0 || key >= len)) key = MI_NO_KEY;
        return key;
    };
    if (!tp.windowed) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (key_of(8 * j + 2 * cq + (e & 1)) > (e < 2 ? qrow0 : qrow1))
                    s[4 * j + e] = -INFINITY;
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (!key_visible(tp, key_of(8 * j + 2 * cq + (e & 1)), e < 2 ? qrow0 : qrow1))
                s[4 * j + e] = -INFINITY;
}

/* The kernel: one warpgroup per CTA, 64 query rows (one row block of the sparse index), three
 * CTAs per SM: the loop is latency bound, so more resident warps hide more of each warp's
 * stalls. Three CTAs need at most 168 registers (launch bounds) and about 75 KB of shared memory
 * each; two full K/V stages (83 KB) do not fit, so K and V tiles share a ring of three 16 KB
 * slots instead (67 KB in all): K0 V0 K1 V1 ..., item i in slot i % 3. K(t+1) is issued in step
 * t, right after the wgmma of S(t), into the slot V(t-1) used; V(t+1) right after the wgmma of
 * P V(t) into the slot K(t) used; each is waited one step later, the same prefetch distance as
 * a two-stage loop, with 48 KB of K/V instead of 64 KB. K(t) and V(t) are waited for separately
 * (V has a whole step to arrive). Per step the instructions are kept few: descriptors built
 * once per tile, plans and masks without branches on the mode, whether a range tile needs its
 * mask decided when it is loaded, gathered tiles unmasked when every key precedes the block,
 * the O rescale skipped when no row max moved, tree reductions, and the next tile's copies
 * issued under the running wgmma. */
template <typename T, int D>
__device__ __forceinline__ void attn_fwd_sm90_ring(const mi_cuda_attn_params &p) {
#ifdef MI_SM90_DEVICE
    constexpr int BM = 64, NT = 128, CPR = D / 8; /* CPR: 16-byte chunks per row */
    constexpr int QHALF = BM * 128, KHALF = 64 * 128, KTILE = D / 64 * KHALF;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *qs = smem_base_1024(smem_raw);
    unsigned char *ring = qs + D / 64 * QHALF;             /* [3 slots] of one K or V tile */
    int *kpos = reinterpret_cast<int *>(ring + 3 * KTILE); /* [2][BN]: key positions of K(t) */

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int m_blk = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y;
    /* heads the sparse kernel ran. Tested here, not after the plan (where its load would
     * overlap the plan's): that kept more registers live */
    if (p.sm90_taken && __ldg(p.sm90_taken + bh)) return;
    const int b = bh / p.heads, h = bh % p.heads;
    const int hk = h / p.group;
    const int len = p.seq_lens[b];
    const int rs = m_blk * BM;

    const T *qg = reinterpret_cast<const T *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    const T *kg = reinterpret_cast<const T *>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
    const T *vg = reinterpret_cast<const T *>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];
    T *og = reinterpret_cast<T *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    float *lseg = p.lse ? p.lse + ((int64_t)b * p.heads + h) * p.len : nullptr;

    tile_plan tp;
    if (!plan_tiles(p, h, bh, m_blk, rs, BM, len, tp)) return;
    const int n_tiles = tp.n_a + tp.n_b;

    if (n_tiles == 0) {
        write_empty_rows(og, p.o_stride[2], lseg, rs, min(BM, p.len - rs), D, tid, NT);
        return;
    }

    for (int i = tid; i < BM * CPR; i += NT) {
        const int r = i / CPR, c = i % CPR;
        const int row = rs + r;
        const bool ok = row < len;
        const T *src = qg + (int64_t)(ok ? row : 0) * p.q_stride[2] + c * 8;
        cp_async_16(qs + sw_off(r, c, QHALF), src, ok ? 16 : 0);
    }
    constexpr int RPP = NT / CPR, PASSES = BN / RPP;
    const int lr0 = tid / CPR, lc = tid % CPR;
    const uint32_t soff0 = sw_off(lr0, lc, KHALF);
    /* K or V of tile t into ring slot `slot`. Gathered tiles: the K load looks the key positions
     * up and keeps them in kpos[t & 1] (for the mask and for V); the V load reads them from there,
     * so a barrier must separate the two. */
    const uint32_t ring_s = smem_addr(ring);
    const int gr = tid >> 1, gc = tid & 1; /* gathered tiles: the row a lane pair looks up */
    int late = 0; /* the gathered K tile just loaded has a key after rs or a missing one */
    bool range_mask = true; /* the range K tile just loaded needs the mask */
    auto load = [&](int t, int slot, bool is_v) {
        const uint32_t d = ring_s + slot * KTILE;
        const T *g = is_v ? vg : kg;
        const int64_t sl = is_v ? p.v_stride[2] : p.k_stride[2];
        if (t < tp.n_a) {
            const int off = tile_offset(tp, t);
            /* whether the tile's scores need the mask, known here and not after S(t), where
             * looking the offset up again would sit between the wgmma and the softmax */
            if (!is_v) range_mask = !range_tile_unmasked(tp, off, rs, rs + BM - 1, len);
            if (off >= 0 && off + BN <= len) {
                const T *src = g + (off + lr0) * sl + lc * 8;
#pragma unroll
                for (int i = 0; i < PASSES; ++i)
                    cp_async_16(d + soff0 + i * RPP * 128, src + i * RPP * sl, 16);
                return;
            }
        }
        /* gathered rows: two threads per row look its key position up (K) or read it back
         * (V); each warp then copies its sixteen rows (gather_rows) */
        int *kp = kpos + (t & 1) * BN;
        const int pos = is_v ? kp[gr] : tile_key(tp, t, gr, len);
        if (!is_v) {
            if (gc == 0) kp[gr] = pos;
            late |= pos == MI_NO_KEY || pos > rs;
        }
        gather_rows<16, 2, D / 16, T, D>(d, KHALF, 16 * warp, g, sl, pos);
    };
    load(0, 0, false);
    cp_async_commit(); /* group: Q, K0 */
    __syncthreads();   /* kpos of tile 0 */
    load(0, 1, true);
    cp_async_commit(); /* group: V0 */

    const int g = lane / 4, cq = lane % 4;
    const int qrow0 = rs + warp * 16 + g, qrow1 = qrow0 + 8;
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    row_softmax sm;
    const sw128_desc qd(smem_addr(qs), 16, 1024);

    /* slot of K(t) = 2t mod 3, V(t) = 2t+1 mod 3, the free one (V(t-1)'s) = 2t+2 mod 3 */
    int sk = 0;
    for (int t = 0; t < n_tiles; ++t) {
        const int sv = sk == 2 ? 0 : sk + 1, sn = sv == 2 ? 0 : sv + 1;
        /* one group is committed after K(t) (V(t)); an empty group is committed when there is
         * nothing to load, so that this count holds to the end */
        cp_async_wait<1>();
        fence_proxy_async();
        /* K(t) visible; every warp is done with P V(t-1), slot sn is free; and whether tile t
         * (if gathered) needs its mask, from the threads that loaded it */
        const bool late_t = __syncthreads_or(late);
        late = 0;
        const bool mask_t = t < tp.n_a ? range_mask : late_t; /* before load(t + 1) resets it */

        const sw128_desc kd(smem_addr(ring + sk * KTILE), 16, 1024);
        float s[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.f;
        wgmma_issue_qk<T, D>(s, qd, QHALF, kd, KHALF);
        /* the next tile's copies are issued while the tensor cores run S(t) (slot sn is not
         * one S(t) reads) */
        if (t + 1 < n_tiles) load(t + 1, sn, false);
        cp_async_commit();
        wgmma_wait<0>();

        mask_scores(s, tp, t, kpos + (t & 1) * BN, mask_t, qrow0, qrow1, len);
        const float2 al = sm.update(s, p.scale_log2);
        /* past the first tiles a row's max rarely moves: skip the 64 multiplies when it moved
         * in none of the warp's rows (al = exp2(0) = 1 exactly) */
        if (!__all_sync(0xffffffffu, al.x == 1.f && al.y == 1.f)) rescale_o<D>(o, al);
        uint32_t a[4][4];
        pack_p<T>(a, s);

        cp_async_wait<1>(); /* V(t); K(t+1) may still be in flight */
        fence_proxy_async();
        __syncthreads(); /* V(t) visible; every warp is done with S(t), slot sk is free */

        const sw128_desc vd(smem_addr(ring + sv * KTILE), KHALF, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_pv<T, D>(o, a[kk], vd.at(kk * 16 * 128));
        wgmma_commit();
        if (t + 1 < n_tiles) load(t + 1, sk, true); /* slot sk: P V(t) does not read it */
        cp_async_commit();
        wgmma_wait<0>();
        sk = sn;
    }

    store_rows<T, D>(og, p.o_stride[2], lseg, sm, o, qrow0, qrow1, len, p.len, cq);
#endif
}

/* The entry points: three CTAs per SM at D = 128 (168 registers at most), four at D = 64, whose
 * O accumulator and tiles are half as large (128 registers, no spills, 34 KB of shared memory
 * each; five CTAs would hold it to 96 registers, where ptxas spills). */
template <typename T>
__global__ void __launch_bounds__(128, 3)
    attn_fwd_sm90_ring_kernel(const __grid_constant__ mi_cuda_attn_params p) {
    attn_fwd_sm90_ring<T, 128>(p);
}
template <typename T>
__global__ void __launch_bounds__(128, 4)
    attn_fwd_sm90_ring_d64_kernel(const __grid_constant__ mi_cuda_attn_params p) {
    attn_fwd_sm90_ring<T, 64>(p);
}

template <typename T, int D>
static cudaError_t launch_sm90(const mi_cuda_attn_params &p, cudaStream_t st) {
    /* D = 128: 67,072 B, so that three CTAs (plus 1 KB reserved each) fit in the 228 KB of an SM
     * (D = 64: 34,304 B); ask for the largest shared-memory carveout so that the driver does not
     * pick a smaller one */
    const size_t smem = 1024 + 4 * (D / 64) * 64 * 128 + 2 * BN * sizeof(int);
    auto kern = D == 128 ? attn_fwd_sm90_ring_kernel<T> : attn_fwd_sm90_ring_d64_kernel<T>;
    cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((p.len + 63) / 64, p.batch * p.heads);
    kern<<<grid, 128, smem, st>>>(p);
    return cudaGetLastError();
}

template <int D> static cudaError_t launch_sm90(const mi_cuda_attn_params &p, cudaStream_t st) {
    return p.dtype == MI_DTYPE_BF16 ? launch_sm90<__nv_bfloat16, D>(p, st)
                                    : launch_sm90<__half, D>(p, st);
}

} // namespace mi_cuda

/* Whether the Hopper kernels can run here: built for sm_90a and a compute capability 9.0 device
 * (a context's tuning may still turn them off: mi_cuda_sm90_on). */
extern "C" int mi_cuda_sm90_usable(void) {
#ifdef MI_HAVE_SM90A
    static int cached = -1;
    if (cached < 0) {
        int dev = 0, major = 0, minor = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        cached = major == 9 && minor == 0;
    }
    return cached;
#else
    return 0;
#endif
}

/* Where every sequence has the full length, a head runs dense for all of them or none: the heads
 * that do (dense heads, and those below their dense_below) take the dense kernel and leave the
 * launch (MI_CUDA_MODE_NONE in *rest), so that a mixed layer's dense heads run as fast as a
 * dense layer's. Where that kernel does not apply they stay, as MI_CUDA_MODE_DENSE, so that the
 * sparse kernel's route (which has no sequence lengths to compare) leaves them to the ring
 * kernel. Returns p, rest, or nullptr where the dense kernel took every head. */
static const mi_cuda_attn_params *dense_heads_apart(const mi_cuda_attn_params *p,
                                                    mi_cuda_attn_params *rest, const mi_tuning *t,
                                                    cudaStream_t st, cudaError_t *e) {
    *e = cudaSuccess;
    if (!p->use_head_modes) return p;
    for (int b = 0; b < p->batch; ++b)
        if (p->seq_lens[b] != p->len) return p;
    int16_t listed[MI_CUDA_MAX_HEADS];
    int n = 0;
    for (int h = 0; h < p->heads; ++h) {
        const mi_cuda_head_mode &m = p->head_modes[h];
        if (m.mode == MI_CUDA_MODE_DENSE || (m.dense_below > 0 && p->len < m.dense_below))
            listed[n++] = (int16_t)h;
    }
    if (n == 0) return p;
    int used = 0;
    *e = mi_cuda_attn_sm90_dense_launch(p, listed, n, t, st, &used);
    if (*e != cudaSuccess) return p;
    if (used && n == p->heads) return nullptr;
    *rest = *p;
    for (int i = 0; i < n; ++i) {
        rest->head_modes[listed[i]].mode = used ? MI_CUDA_MODE_NONE : MI_CUDA_MODE_DENSE;
        rest->head_modes[listed[i]].dense_below = 0; /* NONE: done, whatever the length */
    }
    return rest;
}

extern "C" cudaError_t mi_cuda_attn_sm90_launch(const mi_cuda_attn_params *p, const mi_tuning *t,
                                                cudaStream_t st) {
    int used = 0;
    cudaError_t e = mi_cuda_attn_sm90_dense_launch(p, nullptr, 0, t, st, &used);
    if (used || e != cudaSuccess) return e;
    static thread_local mi_cuda_attn_params rest; /* 7 KB: off the stack */
    p = dense_heads_apart(p, &rest, t, st, &e);
    if (e != cudaSuccess || !p) return e;
    int32_t *taken = nullptr;
    e = mi_cuda_attn_sm90_sparse_launch(p, t, st, &used, &taken);
    if (e != cudaSuccess) return e;
    /* the ring kernel: every head, or those the sparse kernel left */
    const mi_cuda_attn_params *ring = p;
    static thread_local mi_cuda_attn_params q; /* 7 KB: off the stack */
    if (used) {
        q = *p;
        q.sm90_taken = taken;
        ring = &q;
    }
    e = p->head_dim == 64 ? mi_cuda::launch_sm90<64>(*ring, st)
                          : mi_cuda::launch_sm90<128>(*ring, st);
    if (!taken) return e;
    const cudaError_t f = cudaFreeAsync(taken, st);
    return e != cudaSuccess ? e : f;
}
