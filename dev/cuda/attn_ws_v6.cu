/*
 * dev/cuda/attn_ws_v6.cu: experiment 6 (snapshot of src/cuda/attn_fwd_sm90.cu after 9a472c0, with
 * its swizzle fix and hoisted wgmma descriptors): a warp-specialised kernel next to the ring
 * kernel, MI_CUDA_SM90_KERNEL=ws2|ws3 (2 or 3 K/V slots per consumer).
 *   - three warpgroups per CTA, one CTA per SM; warpgroups 1 and 2 are consumers with their own
 *     64-row block each (own tile list), warpgroup 0 the producer (64 threads per consumer,
 *     cp.async, then cp.async.wait + fence.proxy.async + mbarrier arrive; an item is announced
 *     once the next one is issued, or before the producer blocks on a slot);
 *   - setmaxnreg: producer 88, consumers 208 (40/232 and 72/216 spilled in the producer);
 *   - consumers keep Q in registers (wgmma RS for S) and overlap within the warpgroup: S(t) and
 *     P V(t-1) issued together, the softmax of t runs while P V(t-1) is in flight, O rescaled
 *     after it; K and V rings with full/empty mbarriers.
 * ptxas pitfalls met: mbarrier wait loops in inline asm count as divergent (C7520, every wgmma
 * serialised) - a loop on __all_sync(try_wait) keeps them uniform; a wait between two wgmma of
 * one group makes ptxas insert its own warpgroup.arrive (C7519); registers last written on a
 * divergent path (the mask) need a fresh definition before the fence.
 * Reached on an NVIDIA H200 (bf16, D = 128; A/B in one process against the ring kernel, two
 * runs, 334/334 GPU tests and memcheck clean for ws3):
 *   dense 32K 416-425 TFLOP/s (ring 479-485), dense 128K 407-426 (ring 433-446);
 *   local 128K 351 (ws2) / 378-383 (ws3) (ring 369-371), 1M 349 / 377-386 (ring 373-374);
 *   mixed 128K 393 / 405-416 (ring 418-425); small 128K 274 / 295-304 (ring 300-311),
 *   1M 284 / 301-302 (ring 320-322).
 * So two consumers with in-warpgroup overlap do no better than three independent CTAs, and dense
 * is 10-13 % slower. The profile of both (Nsight Compute, dense 32K) shows issue slots 52-53 %
 * busy with "wait" (fixed-latency dependency) the largest stall: the kernels issue about 540
 * instructions per warp per 64-key step, so the instruction count, not the schedule, is what to
 * cut (what src/cuda/attn_fwd_sm90.cu then did; TMA for range tiles: dev/cuda/attn_tma_v7.cu).
 */
/*
 * attn_fwd_sm90.cu: the Hopper (sm_90a) variant of the attention kernel, D = 128: warpgroup MMA
 * (wgmma) instead of mma.sync, same tile plan (attn_plan.cuh), same masking and numerics as
 * attn_fwd.cu.
 *
 * A CTA is one warpgroup of 64 query rows. Q, K and V tiles sit in shared memory in the 128-byte-swizzled K-major layout wgmma
 * reads directly: each 128-column row is split in two 64-column halves, and 16-byte chunk c of
 * row r is stored at chunk c ^ (r & 7). S = Q K^T runs as 8 x m64n64k16 with both operands from
 * shared memory; O += P V as 4 x m64n128k16 with P from registers (the accumulator layout of S is
 * the register layout of the A operand) and V read transposed (MN-major B).
 * Tiles arrive by cp.async (any key positions, as sparse tiles need); the writes are made visible
 * to the async proxy with fence.proxy.async before the barrier.
 * One kernel serves every mode (dense, A-/Tri-shape, sparse) in 64-row blocks, three CTAs per
 * SM, with K and V tiles in a ring of three shared-memory slots (numbers and history: the kernel's
 * comment below and dev/cuda/attn_dense_v1..v5.cu). */
#include "attn_plan.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MI_SM90_DEVICE 1
#endif

namespace mi_cuda {

#ifdef MI_SM90_DEVICE
#include "wgmma_ops.cuh"

template <typename T> struct wg;
template <> struct wg<__nv_bfloat16> {
    __device__ static void ss(float *d, uint64_t a, uint64_t b, int sc) {
        wgmma_ss_m64n64_bf16(d, a, b, sc);
    }
    __device__ static void rs(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n128_tb_bf16(d, a, b, sc);
    }
    __device__ static void qk_rs(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n64_bf16(d, a, b, sc);
    }
};
template <> struct wg<__half> {
    __device__ static void ss(float *d, uint64_t a, uint64_t b, int sc) {
        wgmma_ss_m64n64_f16(d, a, b, sc);
    }
    __device__ static void rs(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n128_tb_f16(d, a, b, sc);
    }
    __device__ static void qk_rs(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n64_f16(d, a, b, sc);
    }
};

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* mbarriers in shared memory (phase parity waits) and warpgroup register reallocation, for the
 * warp-specialised kernel. */
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ bool mbar_test(uint64_t *b, int parity) {
    uint32_t ok;
    asm volatile("{\n.reg .pred P;\n"
                 "mbarrier.test_wait.parity.shared::cta.b64 P, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, P;\n}\n"
                 : "=r"(ok)
                 : "r"(smem_addr(b)), "r"(parity)
                 : "memory");
    return ok != 0;
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t *b, int parity) {
    uint32_t ok;
    asm volatile("{\n.reg .pred P;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, P;\n}\n"
                 : "=r"(ok)
                 : "r"(smem_addr(b)), "r"(parity)
                 : "memory");
    return ok != 0;
}
/* Every lane waits (and so acquires) itself; the vote keeps the loop warp-uniform, which ptxas
 * needs to keep later wgmma asynchronous. */
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
    while (!__all_sync(0xffffffffu, mbar_try_wait(b, parity))) {
    }
}
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
/* Pins accumulator registers in place around asynchronous wgmma (no instruction emitted): the
 * compiler may not move or reuse them across these points. */
template <int N> __device__ __forceinline__ void fence_operands(float *r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
#endif

/* Byte offset of 16-byte chunk c (0..15) of row r in a swizzled [2 halves][rows][128 B] tile. */
__device__ __forceinline__ uint32_t sw_off(int r, int c, int half_bytes) {
    return (uint32_t)((c >> 3) * half_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* wgmma shared-memory descriptor, 128-byte swizzle, of a tile and of byte offsets inside it: the
 * start address (bits 0-13, in 16-byte units) is the only field that changes between the
 * k-steps of one GEMM, and shared addresses stay below 256 KB, so an offset is one add to the
 * low word (computing each descriptor from scratch cost about ten instructions per wgmma). */
struct sw128_desc {
    uint32_t lo, hi;
    __device__ __forceinline__ sw128_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
        : lo(((saddr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16)),
          hi(((sbo >> 4) & 0x3FFF) | (1u << 30)) {}
    __device__ __forceinline__ uint64_t at(uint32_t byte_off) const {
        return ((uint64_t)hi << 32) | (lo + (byte_off >> 4));
    }
};

/* The per-tile steps both kernels share. A thread holds rows qrow0 = 16 warp + lane / 4 and
 * qrow1 = qrow0 + 8 of its warpgroup's 64, and in S (64 keys) the columns 8 j + 2 (lane % 4)
 * (+1) at s[4 j + (0, 1)] for qrow0 and s[4 j + (2, 3)] for qrow1 (the wgmma accumulator
 * layout). */

/* Sets the scores of keys row cannot see to -inf. Range tile t starts at tile_offset; the keys
 * of a gathered tile are in kp[64]. A range tile wholly left of the diagonal (every tile of a
 * dense row block but the last) needs no test. */
__device__ __forceinline__ void mask_scores(float *s, const tile_plan &tp, int t, const int *kp,
                                            int qrow0, int qrow1, int rs, int len) {
    const int cq = threadIdx.x % 4;
    const bool range = t < tp.n_a;
    const int off = range ? tile_offset(tp, t) : 0;
    if (range && range_tile_unmasked(tp, off, rs, len)) return;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = 8 * j + 2 * cq + (e & 1);
            int key = range ? off + col : kp[col];
            if (range && (key < 0 || key >= len)) key = MI_NO_KEY;
            if (!key_visible(tp, key, e < 2 ? qrow0 : qrow1)) s[4 * j + e] = -INFINITY;
        }
    }
}

/* Online softmax state of the thread's two rows (log2 domain; m = -inf while a row has seen
 * nothing). */
struct row_softmax {
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    /* Turns the scores of one tile into unnormalised probabilities in place and returns the
     * factors by which O must be rescaled. */
    __device__ __forceinline__ float2 update(float *s, float sc) {
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
            mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
        }
        mx0 = fmaxf(m0, warp_max_xor(warp_max_xor(mx0, 1), 2) * sc);
        mx1 = fmaxf(m1, warp_max_xor(warp_max_xor(mx1, 1), 2) * sc);
        const float mu0 = mx0 == -INFINITY ? 0.f : mx0;
        const float mu1 = mx1 == -INFINITY ? 0.f : mx1;
        const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
        m0 = mx0;
        m1 = mx1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s[4 * j] = exp2f(fmaf(s[4 * j], sc, -mu0));
            s[4 * j + 1] = exp2f(fmaf(s[4 * j + 1], sc, -mu0));
            s[4 * j + 2] = exp2f(fmaf(s[4 * j + 2], sc, -mu1));
            s[4 * j + 3] = exp2f(fmaf(s[4 * j + 3], sc, -mu1));
            rs0 += s[4 * j] + s[4 * j + 1];
            rs1 += s[4 * j + 2] + s[4 * j + 3];
        }
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
        return make_float2(al0, al1);
    }
};

__device__ __forceinline__ void rescale_o(float *o, float2 al) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        o[4 * i] *= al.x;
        o[4 * i + 1] *= al.x;
        o[4 * i + 2] *= al.y;
        o[4 * i + 3] *= al.y;
    }
}

/* P in the A-operand register layout of the P V wgmma (the accumulator layout of S, in pairs). */
template <typename T> __device__ __forceinline__ void pack_p(uint32_t (*a)[4], const float *s) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        a[kk][0] = dtype_traits<T>::pack2(s[8 * kk], s[8 * kk + 1]);
        a[kk][1] = dtype_traits<T>::pack2(s[8 * kk + 2], s[8 * kk + 3]);
        a[kk][2] = dtype_traits<T>::pack2(s[8 * kk + 4], s[8 * kk + 5]);
        a[kk][3] = dtype_traits<T>::pack2(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

/* O / l and the log-sum-exp of the thread's two rows; rows that saw no key get 0 and -inf. Rows
 * past this sequence (batch: len < p.len) are written as such; rows past p.len not at all. */
template <typename T>
__device__ __forceinline__ void store_rows(T *og, int64_t ostride, float *lseg, row_softmax sm,
                                           const float *o, int qrow0, int qrow1, int len,
                                           int plen, int cq) {
    float l0 = sm.l0, l1 = sm.l1;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const bool live0 = qrow0 < len && l0 > 0.f, live1 = qrow1 < len && l1 > 0.f;
    const float inv0 = live0 ? 1.f / l0 : 0.f, inv1 = live1 ? 1.f / l1 : 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int c = 8 * i + 2 * cq;
        if (qrow0 < plen)
            *reinterpret_cast<uint32_t *>(og + (int64_t)qrow0 * ostride + c) =
                dtype_traits<T>::pack2(o[4 * i] * inv0, o[4 * i + 1] * inv0);
        if (qrow1 < plen)
            *reinterpret_cast<uint32_t *>(og + (int64_t)qrow1 * ostride + c) =
                dtype_traits<T>::pack2(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
    }
    if (lseg && cq == 0) {
        if (qrow0 < plen) lseg[qrow0] = live0 ? sm.m0 * MI_LN2 + logf(l0) : -INFINITY;
        if (qrow1 < plen) lseg[qrow1] = live1 ? sm.m1 * MI_LN2 + logf(l1) : -INFINITY;
    }
}

/* The kernel: one warpgroup per CTA, 64 query rows (one row block of the sparse index), three
 * CTAs per SM. It replaced a two-warpgroup 128-row dense kernel (dev/cuda/attn_dense_v4.cu) and
 * the two-CTA 64-row loop (dev/cuda/attn_dense_v3.cu): the profile of those was latency bound
 * (issue slots 38% busy, 0.49 eligible warps per scheduler), so more resident warps hide more of
 * each warp's stalls. Three CTAs need at most 168 registers (launch bounds; ptxas: 161, no
 * spills) and about 75 KB of shared memory each; two full K/V stages (83 KB) do not fit, so K and
 * V tiles share a ring of three 16 KB slots instead (67 KB in all): K0 V0 K1 V1 ..., item i in
 * slot i % 3. K(t+1) is issued at the start of step t into the slot V(t-1) used, V(t+1) after
 * S(t) into the slot K(t) used; each is waited one step later, the same prefetch distance as the
 * two-stage loop, with 48 KB of K/V instead of 64 KB.
 * H200, bf16, against the two-CTA loop in one process (ms/head, effective TFLOP/s; both runs:
 * bench/results/2026-11-30-gpu-sparse-ring-ab.json; dense: 445 / 439 / 430 / 431 TFLOP/s at
 * 32K / 128K / 512K / 1M against 397-405 for the 128-row kernel,
 * bench/results/2026-11-30-gpu-dense-ring-ab.json):
 * local 128K 1.166 / 376 (1.356 / 323), 1M 9.60 / 373 (11.26 / 319); mixed 128K 7.86 / 421
 * (8.41 / 393), 1M 90.0 / 408 (95.2 / 386); small 128K 0.247 / 313 (0.295 / 262), 1M 2.17 / 286
 * (2.56 / 242); whole-layer VS prefill at 1M x 8 heads 427.4 ms (447.6 ms). */
template <typename T>
__global__ void __launch_bounds__(128, 3)
    attn_fwd_sm90_ring_kernel(const __grid_constant__ mi_cuda_attn_params p) {
#ifdef MI_SM90_DEVICE
    constexpr int D = 128, BM = 64, NT = 128, CPR = 16;
    constexpr int QHALF = BM * 128, KHALF = 64 * 128, KTILE = 2 * KHALF;
    using tr = dtype_traits<T>;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *base = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
    unsigned char *qs = base;
    unsigned char *ring = qs + 2 * QHALF;                   /* [3 slots] of one K or V tile */
    int *kpos = reinterpret_cast<int *>(ring + 3 * KTILE); /* [2][BN]: key positions of K(t) */

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int m_blk = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y;
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
        const int rows = min(BM, p.len - rs);
        for (int i = tid; i < rows * CPR; i += NT) {
            const int r = i / CPR, c = i % CPR;
            *reinterpret_cast<uint4 *>(og + (int64_t)(rs + r) * p.o_stride[2] + c * 8) =
                make_uint4(0, 0, 0, 0);
        }
        if (lseg)
            for (int r = tid; r < rows; r += NT) lseg[rs + r] = -INFINITY;
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
    auto load = [&](int t, int slot, bool is_v) {
        const uint32_t d = ring_s + slot * KTILE;
        const T *g = is_v ? vg : kg;
        const int64_t sl = is_v ? p.v_stride[2] : p.k_stride[2];
        if (t < tp.n_a) {
            const int off = tile_offset(tp, t);
            if (off >= 0 && off + BN <= len) {
                const T *src = g + (off + lr0) * sl + lc * 8;
#pragma unroll
                for (int i = 0; i < PASSES; ++i)
                    cp_async_16(d + soff0 + i * RPP * 128, src + i * RPP * sl, 16);
                return;
            }
        }
        int *kp = kpos + (t & 1) * BN;
#pragma unroll
        for (int i = tid; i < BN * CPR; i += NT) {
            const int r = i / CPR, c = i % CPR;
            const int pos = is_v ? kp[r] : tile_key(tp, t, r, len);
            const bool ok = pos != MI_NO_KEY;
            const int64_t row = ok ? pos : 0;
            cp_async_16(d + sw_off(r, c, KHALF), g + row * sl + c * 8, ok ? 16 : 0);
            if (!is_v && c == 0) kp[r] = pos;
        }
    };
    load(0, 0, false);
    cp_async_commit(); /* group: Q, K0 */
    __syncthreads();   /* kpos of tile 0 */
    load(0, 1, true);
    cp_async_commit(); /* group: V0 */

    const int g = lane / 4, cq = lane % 4;
    const int qrow0 = rs + warp * 16 + g, qrow1 = qrow0 + 8;
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
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
        __syncthreads(); /* K(t) visible; every warp is done with P V(t-1), slot sn is free */
        if (t + 1 < n_tiles) load(t + 1, sn, false);
        cp_async_commit();

        const sw128_desc kd(smem_addr(ring + sk * KTILE), 16, 1024);
        float s[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.f;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wg<T>::ss(s, qd.at((kk >> 2) * QHALF + (kk & 3) * 32),
                      kd.at((kk >> 2) * KHALF + (kk & 3) * 32), kk > 0);
        wgmma_commit();
        wgmma_wait0();

        mask_scores(s, tp, t, kpos + (t & 1) * BN, qrow0, qrow1, rs, len);
        const float2 al = sm.update(s, p.scale_log2);
        if (!(p.sm90_flags & 2) || !__all_sync(0xffffffffu, al.x == 1.f && al.y == 1.f))
            rescale_o(o, al);
        uint32_t a[4][4];
        pack_p<T>(a, s);

        cp_async_wait<1>(); /* V(t); K(t+1) may still be in flight */
        fence_proxy_async();
        __syncthreads(); /* V(t) visible; every warp is done with S(t), slot sk is free */
        if (t + 1 < n_tiles) load(t + 1, sk, true);
        cp_async_commit();

        const sw128_desc vd(smem_addr(ring + sv * KTILE), KHALF, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg<T>::rs(o, a[kk], vd.at(kk * 16 * 128), 1);
        wgmma_commit();
        wgmma_wait0();
        sk = sn;
    }

    store_rows<T>(og, p.o_stride[2], lseg, sm, o, qrow0, qrow1, len, p.len, cq);
#endif
}

/* The warp-specialised kernel: three warpgroups per CTA, one per SM. Warpgroups 1 and 2 are
 * consumers, each with its own 64-row block (its own tile list: the sparse row blocks differ),
 * and only issue wgmma and run the softmax; warpgroup 0 is the producer, its threads 0-63 loading
 * consumer 0's K/V tiles and 64-127 consumer 1's, with cp.async (any key positions, as gathered
 * tiles need). setmaxnreg moves registers from the producer (88: no spills) to the consumers
 * (208), which
 * keep Q in registers (wgmma RS for S: no shared-memory reads of Q per step) and overlap within
 * the warpgroup: step t issues S(t) = Q K(t)^T and then O += P(t-1) V(t-1), runs the softmax of
 * tile t while P V is still in flight, and rescales O only after it. K and V have their own rings
 * of NS slots per consumer, each slot with a "full" mbarrier (the producer's 64 threads arrive
 * once the tile is in shared memory and fenced for the async proxy) and an "empty" one (the
 * consumer's 128 threads arrive once the wgmma that read it completed; for K also once the mask
 * read the tile's key positions). */
template <typename T, int NS>
__global__ void __launch_bounds__(384, 1)
    attn_fwd_sm90_ws_kernel(const __grid_constant__ mi_cuda_attn_params p) {
#ifdef MI_SM90_DEVICE
    constexpr int D = 128, BM = 64, CPR = 16;
    constexpr int KHALF = 64 * 128, KTILE = 2 * KHALF;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *base = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);

    /* values that steer wgmma are broadcast from lane 0: ptxas serialises wgmma under branches on
     * values it cannot prove warp-uniform (C7520) */
    const int tid = threadIdx.x;
    const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int c = wgi == 0 ? tid / 64 : wgi - 1; /* the consumer this thread works for */
    /* per consumer: K slots [NS], V slots [NS]; then key positions [2][NS][BN]; then mbarriers
     * [2][full K, full V, empty K, empty V][NS] */
    unsigned char *kt = base + (size_t)c * 2 * NS * KTILE, *vt = kt + NS * KTILE;
    int *kpos = reinterpret_cast<int *>(base + 2 * 2 * NS * KTILE) + c * NS * BN;
    uint64_t *bars = reinterpret_cast<uint64_t *>(base + 2 * 2 * NS * KTILE + 2 * NS * BN * 4);
    uint64_t *full_k = bars + c * 4 * NS, *full_v = full_k + NS, *empty_k = full_v + NS,
             *empty_v = empty_k + NS;
    if (tid == 0) {
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < NS; ++j) {
                mbar_init(bars + i * 4 * NS + j, 64);
                mbar_init(bars + i * 4 * NS + NS + j, 64);
                mbar_init(bars + i * 4 * NS + 2 * NS + j, 128);
                mbar_init(bars + i * 4 * NS + 3 * NS + j, 128);
            }
    }
    __syncthreads();

    const int n_blocks = (p.len + BM - 1) / BM;
    const int m_blk = n_blocks - 1 - (2 * (int)blockIdx.x + c);
    const int bh = blockIdx.y;
    const int b = bh / p.heads, h = bh % p.heads;
    const int hk = h / p.group;
    const int len = p.seq_lens[b];
    const int rs = m_blk * BM;
    tile_plan tp;
    const bool live =
        __shfl_sync(0xffffffffu, m_blk >= 0 && plan_tiles(p, h, bh, m_blk, rs, BM, len, tp), 0);
    const int n_tiles = __shfl_sync(0xffffffffu, live ? tp.n_a + tp.n_b : 0, 0);

    if (wgi == 0) {
        setmaxnreg_dec<88>();
        if (n_tiles == 0) return;
        const int pt = tid % 64;
        const T *kg = reinterpret_cast<const T *>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
        const T *vg = reinterpret_cast<const T *>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];
        constexpr int RPP = 64 / CPR, PASSES = BN / RPP;
        const int lr0 = pt / CPR, lc = pt % CPR;
        /* a pass covers 4 rows, so the swizzle (row % 8) alternates between two patterns */
        const uint32_t soff_even = sw_off(lr0, lc, KHALF), soff_odd = sw_off(lr0 + RPP, lc, KHALF);
        /* item i: K(i / 2) for even i, V(i / 2) for odd i */
        auto issue = [&](int item) {
            const int t = item >> 1, slot = t % NS;
            const bool is_v = item & 1;
            const uint32_t d = smem_addr(is_v ? vt : kt) + slot * KTILE;
            const T *g = is_v ? vg : kg;
            const int64_t sl = is_v ? p.v_stride[2] : p.k_stride[2];
            if (t < tp.n_a) {
                const int off = tile_offset(tp, t);
                if (off >= 0 && off + BN <= len) {
                    const T *src = g + (off + lr0) * sl + lc * 8;
#pragma unroll
                    for (int i = 0; i < PASSES; ++i)
                        cp_async_16(d + (i & 1 ? soff_odd : soff_even) + (i >> 1) * 2 * RPP * 128,
                                    src + i * RPP * sl, 16);
                    return;
                }
            }
            /* key positions: looked up for K (one row per thread, shared by a barrier of the
             * 64 threads, the first one ensuring that nobody still reads the slot's previous
             * positions), reused for V */
            int *kp = kpos + slot * BN;
            if (!is_v) {
                named_barrier(1 + c, 64);
                kp[pt] = tile_key(tp, t, pt, len);
                named_barrier(1 + c, 64);
            }
            for (int i = pt; i < BN * CPR; i += 64) {
                const int r = i / CPR, cc = i % CPR;
                const int pos = kp[r];
                const bool ok = pos != MI_NO_KEY;
                cp_async_16(d + sw_off(r, cc, KHALF), g + (int64_t)(ok ? pos : 0) * sl + cc * 8,
                            ok ? 16 : 0);
            }
        };
        auto full_of = [&](int item) {
            return ((item & 1) ? full_v : full_k) + (item >> 1) % NS;
        };
        /* item i is announced once item i + 1 has been issued (the two loads overlap), or before
         * waiting for a slot, since the consumer may need item i to free it */
        int pending = -1;
        for (int it = 0; it < 2 * n_tiles; ++it) {
            const int t = it >> 1;
            if (t >= NS) {
                uint64_t *e = ((it & 1) ? empty_v : empty_k) + t % NS;
                const int par = (t / NS - 1) & 1;
                if (!__all_sync(0xffffffffu, mbar_test(e, par))) { /* uniform: see mbar_wait */
                    if (pending >= 0) {
                        cp_async_wait<0>();
                        fence_proxy_async();
                        mbar_arrive(full_of(pending));
                        pending = -1;
                    }
                    mbar_wait(e, par);
                }
            }
            issue(it);
            cp_async_commit();
            if (pending >= 0) {
                cp_async_wait<1>();
                fence_proxy_async();
                mbar_arrive(full_of(pending));
            }
            pending = it;
        }
        cp_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(full_of(pending));
        return;
    }

    setmaxnreg_inc<208>();
    if (!live) return;
    const int ct = tid - 128 * wgi;
    T *og = reinterpret_cast<T *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    float *lseg = p.lse ? p.lse + ((int64_t)b * p.heads + h) * p.len : nullptr;
    if (n_tiles == 0) {
        write_empty_rows(og, p.o_stride[2], lseg, rs, min(BM, p.len - rs), D, ct, 128);
        return;
    }
    const int warp = ct / 32, lane = ct % 32;
    const int g = lane / 4, cq = lane % 4;
    const int qrow0 = rs + warp * 16 + g, qrow1 = qrow0 + 8;

    /* Q in registers in the A-operand layout: rows g and g + 8 of this warp's 16, columns
     * 16 kk + 2 cq (+1) and 16 kk + 8 + 2 cq (+1); rows past the sequence are zeros */
    uint32_t qf[8][4];
    {
        const T *qg = reinterpret_cast<const T *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
        const bool ok0 = qrow0 < len, ok1 = qrow1 < len;
        const T *q0 = qg + (int64_t)(ok0 ? qrow0 : 0) * p.q_stride[2] + 2 * cq;
        const T *q1 = qg + (int64_t)(ok1 ? qrow1 : 0) * p.q_stride[2] + 2 * cq;
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            qf[kk][0] = ok0 ? __ldg(reinterpret_cast<const unsigned int *>(q0 + 16 * kk)) : 0u;
            qf[kk][1] = ok1 ? __ldg(reinterpret_cast<const unsigned int *>(q1 + 16 * kk)) : 0u;
            qf[kk][2] = ok0 ? __ldg(reinterpret_cast<const unsigned int *>(q0 + 16 * kk + 8)) : 0u;
            qf[kk][3] = ok1 ? __ldg(reinterpret_cast<const unsigned int *>(q1 + 16 * kk + 8)) : 0u;
        }
    }

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float s[32];
    uint32_t pa[4][4];
    row_softmax sm;
    const float sc = p.scale_log2;
    /* s gets a fresh definition before each S (ahead of the wgmma fence): its last writes (the
     * mask) sit on divergent paths, and wgmma reading registers defined there would be
     * serialised (C7520) */
    auto clear_s = [&]() {
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.f;
    };
    auto issue_s = [&](int t) {
        const sw128_desc kd(smem_addr(kt + (t % NS) * KTILE), 16, 1024);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wg<T>::qk_rs(s, qf[kk], kd.at((kk >> 2) * KHALF + (kk & 3) * 32), kk > 0);
    };
    auto issue_pv = [&](int t) {
        const sw128_desc vd(smem_addr(vt + (t % NS) * KTILE), KHALF, 1024);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg<T>::rs(o, pa[kk], vd.at(kk * 16 * 128), 1);
    };

    mbar_wait(full_k, 0);
    clear_s();
    wgmma_fence();
    issue_s(0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands<32>(s);
    mask_scores(s, tp, 0, kpos, qrow0, qrow1, rs, len);
    mbar_arrive(empty_k);
    sm.update(s, sc); /* O is still 0: nothing to rescale */
    pack_p<T>(pa, s);
    for (int t = 1; t < n_tiles; ++t) {
        const int kslot = t % NS, vslot = (t - 1) % NS;
        /* both waits before the fence: a wait loop between two wgmma makes ptxas insert a
         * warpgroup.arrive of its own (C7519) */
        mbar_wait(full_k + kslot, (t / NS) & 1);
        mbar_wait(full_v + vslot, ((t - 1) / NS) & 1);
        clear_s();
        wgmma_fence();
        issue_s(t);
        wgmma_commit();
        issue_pv(t - 1);
        wgmma_commit();
        wgmma_wait<1>(); /* S(t) is done, P V(t - 1) may still run */
        fence_operands<32>(s);
        mask_scores(s, tp, t, kpos + kslot * BN, qrow0, qrow1, rs, len);
        mbar_arrive(empty_k + kslot);
        const float2 al = sm.update(s, sc);
        wgmma_wait<0>();
        fence_operands<64>(o);
        mbar_arrive(empty_v + vslot);
        if (!(p.sm90_flags & 2) || !__all_sync(0xffffffffu, al.x == 1.f && al.y == 1.f))
            rescale_o(o, al);
        pack_p<T>(pa, s);
    }
    mbar_wait(full_v + (n_tiles - 1) % NS, ((n_tiles - 1) / NS) & 1);
    wgmma_fence();
    issue_pv(n_tiles - 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands<64>(o);
    store_rows<T>(og, p.o_stride[2], lseg, sm, o, qrow0, qrow1, len, p.len, cq);
#endif
}

template <typename K>
static cudaError_t launch_kernel(K kern, const mi_cuda_attn_params &p, int bm, int threads,
                                 size_t smem, cudaStream_t st) {
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((p.len + bm - 1) / bm, p.batch * p.heads);
    kern<<<grid, threads, smem, st>>>(p);
    return cudaGetLastError();
}

template <typename T> static cudaError_t launch_sm90(const mi_cuda_attn_params &p, cudaStream_t st) {
    /* 67,072 B: three CTAs (plus 1 KB reserved each) fit in the 228 KB of an SM; ask for the
     * largest shared-memory carveout so that the driver does not pick a smaller one */
    const size_t smem = 1024 + 64 * 256 + 3 * 64 * 256 + 2 * BN * sizeof(int);
    cudaFuncSetAttribute(attn_fwd_sm90_ring_kernel<T>,
                         cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    /* MI_CUDA_SM90_OCC=1: say once how many CTAs the driver fits per SM (3 expected) */
    static int reported = 0;
    if (!reported && getenv("MI_CUDA_SM90_OCC")) {
        int n = 0;
        cudaFuncSetAttribute(attn_fwd_sm90_ring_kernel<T>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_fwd_sm90_ring_kernel<T>, 128, smem);
        fprintf(stderr, "sm90 ring kernel: %d CTAs per SM (%zu B shared)\n", n, smem);
        reported = 1;
    }
    /* MI_CUDA_SM90_KERNEL=ws2|ws3: the warp-specialised kernel with 2 or 3 K/V slots per
     * consumer (A/B against the ring kernel) */
    const char *k = getenv("MI_CUDA_SM90_KERNEL");
    if (k && (!strcmp(k, "ws2") || !strcmp(k, "ws3"))) {
        const int ns = k[2] - '0';
        const size_t ws_smem = 1024 + (size_t)2 * 2 * ns * 64 * 256 + 2 * ns * BN * sizeof(int) +
                               2 * 4 * ns * sizeof(uint64_t);
        /* one CTA of two 64-row blocks per 128 rows */
        return ns == 2 ? launch_kernel(attn_fwd_sm90_ws_kernel<T, 2>, p, 128, 384, ws_smem, st)
                       : launch_kernel(attn_fwd_sm90_ws_kernel<T, 3>, p, 128, 384, ws_smem, st);
    }
    return launch_kernel(attn_fwd_sm90_ring_kernel<T>, p, 64, 128, smem, st);
}

} // namespace mi_cuda

/* Whether the Hopper kernels can run here: built for sm_90a, a compute capability 9.0 device, and
 * not disabled with MI_CUDA_DISABLE_SM90=1 (to compare both paths on one GPU). */
extern "C" int mi_cuda_sm90_usable(void) {
#ifdef MI_HAVE_SM90A
    static int cached = -1;
    if (cached < 0) {
        int dev = 0, major = 0, minor = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        const char *off = getenv("MI_CUDA_DISABLE_SM90");
        cached = major == 9 && minor == 0 && !(off && off[0] == '1');
    }
    return cached;
#else
    return 0;
#endif
}

extern "C" cudaError_t mi_cuda_attn_sm90_launch(const mi_cuda_attn_params *p, cudaStream_t st) {
    mi_cuda_attn_params q = *p;
    const char *skip = getenv("MI_CUDA_SM90_SKIP_RESCALE");
    q.sm90_flags = (skip && skip[0] == '1') << 1;
    return p->dtype == MI_DTYPE_BF16 ? mi_cuda::launch_sm90<__nv_bfloat16>(q, st)
                                     : mi_cuda::launch_sm90<__half>(q, st);
}
