/*
 * sm90_common.cuh: what the Hopper (sm_90a) attention kernels share: wgmma wrappers and fences,
 * the 128-byte-swizzled tile layout and its descriptors, mbarrier / TMA / named-barrier
 * primitives, and the per-tile online-softmax steps in the wgmma accumulator layout.
 */
#ifndef MI_SM90_COMMON_CUH
#define MI_SM90_COMMON_CUH

#include "attn_plan.cuh"

#include <cuda.h> /* CUtensorMap and the encoder's type; the encoder is found at run time */
#include <cudaTypedefs.h>
#include <math.h>

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
    __device__ static void ss128(float *d, uint64_t a, uint64_t b, int sc) {
        wgmma_ss_m64n128_bf16(d, a, b, sc);
    }
    __device__ static void ss176(float *d, uint64_t a, uint64_t b, int sc) {
        wgmma_ss_m64n176_bf16(d, a, b, sc);
    }
    __device__ static void rs(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n128_tb_bf16(d, a, b, sc);
    }
    __device__ static void rs64(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n64_tb_bf16(d, a, b, sc);
    }
};
template <> struct wg<__half> {
    __device__ static void ss(float *d, uint64_t a, uint64_t b, int sc) {
        wgmma_ss_m64n64_f16(d, a, b, sc);
    }
    __device__ static void ss128(float *d, uint64_t a, uint64_t b, int sc) {
        wgmma_ss_m64n128_f16(d, a, b, sc);
    }
    __device__ static void ss176(float *d, uint64_t a, uint64_t b, int sc) {
        wgmma_ss_m64n176_f16(d, a, b, sc);
    }
    __device__ static void rs(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n128_tb_f16(d, a, b, sc);
    }
    __device__ static void rs64(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n64_tb_f16(d, a, b, sc);
    }
};

/* One 16-key k-step of O += P V over D columns (m64n128k16 or m64n64k16): P from registers, V
 * read transposed (MN-major), O accumulated. */
template <typename T, int D>
__device__ __forceinline__ void wgmma_pv(float *o, const uint32_t *a, uint64_t v) {
    static_assert(D == 128 || D == 64, "P V by m64n128k16 or m64n64k16");
    if constexpr (D == 128)
        wg<T>::rs(o, a, v, 1);
    else
        wg<T>::rs64(o, a, v, 1);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* mbarriers in shared memory (phase-parity waits), TMA box loads that complete on them, named
 * barriers and warpgroup register reallocation: the warp-specialised dense kernel's tools. */
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(b)),
                 "r"(bytes)
                 : "memory");
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
 * needs to keep later wgmma asynchronous (C7520 otherwise). */
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
    while (!__all_sync(0xffffffffu, mbar_try_wait(b, parity))) {
    }
}
/* An arrive-on the mbarrier once this thread's earlier cp.async have landed; it adds one pending
 * arrival first, so the barrier's expected count is unchanged. */
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *b) {
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(smem_addr(b)) : "memory");
}
/* Brings the 128-byte line of p into L2 (no register, no wait). */
__device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
/* One box of a 4-D tensor map (d, row, head, batch) into shared memory at dst. */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, int c0, int c1, int c2,
                                            int c3, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                 "r"(smem_addr(bar))
                 : "memory");
}
/* A ROWS x D tile of two-byte elements (D = 128 or 64): the bytes it brings on bar, then one
 * ROWS-row box per 64-column half (the halves ROWS x 128 bytes apart, as the tiles are laid out);
 * row is the map's second coordinate, c2 and c3 its last two. */
template <int ROWS, int D = 128>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const void *map, int row, int c2,
                                              int c3, uint64_t *bar) {
    static_assert(D == 128 || D == 64, "tiles of one or two 64-column halves");
    constexpr uint32_t half = ROWS * 64 * 2; /* ROWS rows of 64 two-byte columns */
    mbar_expect_tx(bar, D / 64 * half);
    tma_load_4d(dst, map, 0, row, c2, c3, bar);
    if constexpr (D == 128) tma_load_4d(dst + half, map, 64, row, c2, c3, bar);
}
/* One box of a 4-D tensor map from shared memory at src to global (a TMA store), in this
 * thread's bulk group: rows outside the map are not written. */
__device__ __forceinline__ void tma_store_4d(const void *map, uint32_t src, int c0, int c1, int c2,
                                             int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
                 " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/* until this thread's bulk groups but the last N have read their shared memory */
template <int N> __device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
/* until they have written global memory too */
template <int N> __device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
/* Four 8 x 8 matrices of two-byte elements into shared memory: lane l gives the address of row
 * l % 8 of matrix l / 8, and v[j] is its part of matrix j (row l / 4, elements 2 (l % 4) and
 * 2 (l % 4) + 1: the wgmma accumulator's layout). */
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t *v) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/* A named barrier that also ORs a predicate over its threads (bar.red.or). */
__device__ __forceinline__ bool named_barrier_or(int id, int threads, bool pred) {
    uint32_t r;
    asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\n"
                 "bar.red.or.pred p, %2, %3, q;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(r)
                 : "r"((uint32_t)pred), "r"(id), "r"(threads)
                 : "memory");
    return r != 0;
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* The dynamic shared memory rounded up to 1024 bytes: the 128-byte swizzle repeats every 8 rows
 * of 128 bytes, and TMA writes it relative to such a boundary. Rounded by adding to raw, not
 * through an integer: the compiler then still knows the result points to shared memory and
 * reads and writes through it with LDS / STS instead of generic loads and stores. */
__device__ __forceinline__ unsigned char *smem_base_1024(unsigned char *raw) {
    return raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);
}
/* The barriers of n K/V stages: full ones completed by the producer (one arrival plus the
 * bytes), empty ones by the eight warps of the two consumer warpgroups. */
__device__ __forceinline__ void init_stage_barriers(uint64_t *k_full, uint64_t *v_full,
                                                    uint64_t *k_empty, uint64_t *v_empty, int n) {
    for (int i = 0; i < n; ++i) {
        mbar_init(k_full + i, 1);
        mbar_init(v_full + i, 1);
        mbar_init(k_empty + i, 8);
        mbar_init(v_empty + i, 8);
    }
}
/* Makes initialised mbarriers visible to the other threads and to the async proxy (TMA). */
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* One arrival per warp on an mbarrier (the consumers' empty barriers count warps), once every
 * lane of the warp is done with the slot. */
__device__ __forceinline__ void warp_arrive(uint64_t *bar) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}
/* Pins accumulator registers around asynchronous wgmma (no instruction): the compiler may not
 * move or reuse them across this point. */
template <int N> __device__ __forceinline__ void fence_operands(float *r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
#endif

/* Byte offset of 16-byte chunk c (0..15) of row r in a swizzled [2 halves][rows][128 B] tile. */
__device__ __forceinline__ uint32_t sw_off(int r, int c, int half_bytes) {
    return (uint32_t)((c >> 3) * half_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* One warp's ROWS gathered rows of D two-byte elements (D = 64 or 128) into rows row0.. of a
 * swizzled tile at dst, with cp.async: D / 8 lanes to a row, so that each instruction moves whole
 * rows (a lane per row made each instruction touch 32 rows, a memory transaction each). Row r's
 * key is in lane KEY_SPREAD * r; a row whose key is MI_NO_KEY is filled with zeros. src is row 0
 * of the (b, head) slice, stride its elements per row. */
template <int ROWS, int KEY_SPREAD, int UNROLL, typename T, int D = 128>
__device__ __forceinline__ void gather_rows(uint32_t dst, int half_bytes, int row0, const T *src,
                                            int64_t stride, int key) {
    static_assert(D == 64 || D == 128, "rows of 64 or 128 elements");
    /* lanes per row (and its log2: lane is signed, and / or % would add sign fixes), rows per
     * instruction */
    constexpr int LPR = D / 8, LPR_LOG2 = D == 128 ? 4 : 3, RPI = 32 / LPR;
    /* the lane as the kernels compute it, so that it is the same value to the compiler
     * (threadIdx.x & 31 cost the ring kernel two registers and 32 instructions) */
    const int lane = (int)threadIdx.x % 32, c = lane & (LPR - 1);
    src += 8 * c;
#pragma unroll UNROLL
    for (int i = 0; i < ROWS / RPI; ++i) {
        const int r = RPI * i + (lane >> LPR_LOG2);
        const int kr = __shfl_sync(0xffffffffu, key, KEY_SPREAD * r);
        const bool ok = kr != MI_NO_KEY;
        cp_async_16(dst + sw_off(row0 + r, c, half_bytes), src + (int64_t)(ok ? kr : 0) * stride,
                    ok ? 16 : 0);
    }
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

#ifdef MI_SM90_DEVICE
/* Issues S = Q K^T for a 64-row Q tile and a 64-key K tile, D values each, both swizzled in
 * halves of 64 columns (q_half and k_half bytes apart), as one committed wgmma group: D / 16
 * k-steps, the first overwriting s. */
template <typename T, int D>
__device__ __forceinline__ void wgmma_issue_qk(float *s, const sw128_desc &qd, int q_half,
                                               const sw128_desc &kd, int k_half) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        wg<T>::ss(s, qd.at((kk >> 2) * q_half + (kk & 3) * 32),
                  kd.at((kk >> 2) * k_half + (kk & 3) * 32), kk > 0);
    wgmma_commit();
}
#endif

/* The per-tile steps the kernels share. A thread holds rows qrow0 = 16 warp + lane / 4 and
 * qrow1 = qrow0 + 8 of its warpgroup's 64, and in S (64 or 128 keys) the columns 8 j + 2
 * (lane % 4) (+1) at s[4 j + (0, 1)] for qrow0 and s[4 j + (2, 3)] for qrow1 (the wgmma
 * accumulator layout). */

/* Folds a0[0, N) and a1[0, N) into a0[0] and a1[0] as trees, one level per instantiation (a
 * loop over the levels is not unrolled for 16 entries, and the arrays then go to local memory);
 * each level folds the upper half onto the lower, whose middle entry stays where N is odd. */
template <int N, typename F> __device__ __forceinline__ void tree_fold(float *a0, float *a1, F f) {
    if constexpr (N > 1) {
        constexpr int H = (N + 1) / 2;
#pragma unroll
        for (int j = 0; j < N - H; ++j) {
            a0[j] = f(a0[j], a0[j + H]);
            a1[j] = f(a1[j], a1[j + H]);
        }
        tree_fold<H>(a0, a1, f);
    }
}

/* Online softmax state of the thread's two rows (log2 domain; m = -inf while a row has seen
 * nothing), over tiles of 8 NJ keys (s[4 j + e] as above, j < NJ). */
struct row_softmax {
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    /* Turns the scores of one tile into unnormalised probabilities in place and returns the
     * factors by which O must be rescaled. */
    /* Maxima and sums are trees, not chains: a 16-long chain of dependent instructions per row
     * was the largest stall ("wait") of the kernel with three warps per scheduler. */
    template <int NJ = 8> __device__ __forceinline__ float2 update(float *s, float sc) {
        float a0[NJ], a1[NJ];
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            a0[j] = fmaxf(s[4 * j], s[4 * j + 1]);
            a1[j] = fmaxf(s[4 * j + 2], s[4 * j + 3]);
        }
        tree_fold<NJ>(a0, a1, [](float x, float y) { return fmaxf(x, y); });
        float mx0 = fmaxf(m0, warp_max_xor(warp_max_xor(a0[0], 1), 2) * sc);
        float mx1 = fmaxf(m1, warp_max_xor(warp_max_xor(a1[0], 1), 2) * sc);
        const float mu0 = mx0 == -INFINITY ? 0.f : mx0;
        const float mu1 = mx1 == -INFINITY ? 0.f : mx1;
        const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
        m0 = mx0;
        m1 = mx1;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            s[4 * j] = exp2f(fmaf(s[4 * j], sc, -mu0));
            s[4 * j + 1] = exp2f(fmaf(s[4 * j + 1], sc, -mu0));
            s[4 * j + 2] = exp2f(fmaf(s[4 * j + 2], sc, -mu1));
            s[4 * j + 3] = exp2f(fmaf(s[4 * j + 3], sc, -mu1));
            a0[j] = s[4 * j] + s[4 * j + 1];
            a1[j] = s[4 * j + 2] + s[4 * j + 3];
        }
        tree_fold<NJ>(a0, a1, [](float x, float y) { return x + y; });
        l0 = l0 * al0 + a0[0];
        l1 = l1 * al1 + a1[0];
        return make_float2(al0, al1);
    }
};

/* O of D columns (D / 2 accumulators a thread) times each row's factor. */
template <int D = 128> __device__ __forceinline__ void rescale_o(float *o, float2 al) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
        o[4 * i] *= al.x;
        o[4 * i + 1] *= al.x;
        o[4 * i + 2] *= al.y;
        o[4 * i + 3] *= al.y;
    }
}

/* P in the A-operand register layout of the P V wgmma (the accumulator layout of S, in pairs),
 * NK k-steps of 16 keys. */
template <typename T, int NK = 4>
__device__ __forceinline__ void pack_p(uint32_t (*a)[4], const float *s) {
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
        a[kk][0] = dtype_traits<T>::pack2(s[8 * kk], s[8 * kk + 1]);
        a[kk][1] = dtype_traits<T>::pack2(s[8 * kk + 2], s[8 * kk + 3]);
        a[kk][2] = dtype_traits<T>::pack2(s[8 * kk + 4], s[8 * kk + 5]);
        a[kk][3] = dtype_traits<T>::pack2(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

/* A thread's two output rows at their end: each row's sum l over the quad, and 1 / l, 0 for a
 * row past its sequence or that saw no key. */
struct row_ends {
    float l0, l1, inv0, inv1;
    bool live0, live1;
};
__device__ __forceinline__ row_ends end_rows(row_softmax sm, int qrow0, int qrow1, int len) {
    row_ends e;
    e.l0 = quad_sum(sm.l0), e.l1 = quad_sum(sm.l1);
    e.live0 = qrow0 < len && e.l0 > 0.f, e.live1 = qrow1 < len && e.l1 > 0.f;
    e.inv0 = e.live0 ? 1.f / e.l0 : 0.f, e.inv1 = e.live1 ? 1.f / e.l1 : 0.f;
    return e;
}
/* Their log-sum-exp into lseg (when given), -inf for the rows end_rows gave 0; in0 / in1: whether
 * each row is written at all. */
__device__ __forceinline__ void store_lse(float *lseg, row_softmax sm, const row_ends &e, int qrow0,
                                          int qrow1, bool in0, bool in1, int cq) {
    if (lseg && cq == 0) {
        if (in0) lseg[qrow0] = e.live0 ? sm.m0 * MI_LN2 + logf(e.l0) : -INFINITY;
        if (in1) lseg[qrow1] = e.live1 ? sm.m1 * MI_LN2 + logf(e.l1) : -INFINITY;
    }
}

/* O / l and the log-sum-exp of the thread's two rows; rows that saw no key get 0 and -inf. Rows
 * past this sequence (batch: len < p.len) are written as such; rows past p.len not at all. */
template <typename T, int D = 128>
__device__ __forceinline__ void store_rows(T *og, int64_t ostride, float *lseg, row_softmax sm,
                                           const float *o, int qrow0, int qrow1, int len, int plen,
                                           int cq) {
    const row_ends e = end_rows(sm, qrow0, qrow1, len);
    /* each row's address once, then D / 8 predicated stores at constant offsets from it: an
     * address and a branch per store made this a tenth of the sparse kernel's instructions on
     * items of ten tiles */
    const bool in0 = qrow0 < plen, in1 = qrow1 < plen;
    uint32_t *r0 = reinterpret_cast<uint32_t *>(og + (int64_t)(in0 ? qrow0 : 0) * ostride + 2 * cq);
    uint32_t *r1 = reinterpret_cast<uint32_t *>(og + (int64_t)(in1 ? qrow1 : 0) * ostride + 2 * cq);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
        const uint32_t v0 = dtype_traits<T>::pack2(o[4 * i] * e.inv0, o[4 * i + 1] * e.inv0);
        const uint32_t v1 = dtype_traits<T>::pack2(o[4 * i + 2] * e.inv1, o[4 * i + 3] * e.inv1);
        if (in0) r0[4 * i] = v0;
        if (in1) r1[4 * i] = v1;
    }
    store_lse(lseg, sm, e, qrow0, qrow1, in0, in1, cq);
}

#ifdef MI_SM90_DEVICE
/* As store_rows, but into shared memory: a warpgroup's 64 normalised output rows, as rows row0..
 * of a swizzled [2 halves][rows][128 B] tile at dst (the layout a TMA box store reads), by
 * stmatrix, eight instructions a thread where store_rows issues 32 global stores; the LSE, when
 * asked for, still goes straight to global memory. */
template <typename T>
__device__ __forceinline__ void stage_rows(uint32_t dst, int half_bytes, int row0, float *lseg,
                                           row_softmax sm, const float *o, int qrow0, int qrow1,
                                           int len, int cq) {
    const row_ends e = end_rows(sm, qrow0, qrow1, len);
    const float inv0 = e.inv0, inv1 = e.inv1;
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    /* lane l addresses row l % 8 of matrix l / 8: matrices 0 and 2 hold the warp's rows 0-7,
     * 1 and 3 its rows 8-15; 0 and 1 the first of two 16-byte chunks, 2 and 3 the second */
    const int r = row0 + 16 * warp + (lane & 7) + (lane & 8);
    const int second = lane >> 4;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
        const uint32_t v[4] = {dtype_traits<T>::pack2(o[4 * i] * inv0, o[4 * i + 1] * inv0),
                               dtype_traits<T>::pack2(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1),
                               dtype_traits<T>::pack2(o[4 * i + 4] * inv0, o[4 * i + 5] * inv0),
                               dtype_traits<T>::pack2(o[4 * i + 6] * inv1, o[4 * i + 7] * inv1)};
        stmatrix_x4(dst + sw_off(r, i + second, half_bytes), v);
    }
    store_lse(lseg, sm, e, qrow0, qrow1, qrow0 < len, qrow1 < len, cq);
}
#endif

/* The driver's tensor-map encoder, looked up once through the runtime (no link to libcuda);
 * NULL where the driver does not have it. */
static inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    static int looked = 0;
    if (!looked) {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
        looked = 1;
    }
    return fn;
}

/* Tensor map of Q, K or V as (d, row, head, batch), d < head_dim, for boxes of 64 columns (128
 * bytes, the 128-byte swizzle of the tile layout) by box_rows rows; false where TMA cannot address
 * the tensor (strides or base not 16-byte aligned, no encoder). Rows outside [0, len) read as
 * zeros. */
static inline bool encode_tma_map(CUtensorMap *map, const void *base, const int64_t *stride,
                                  int batch, int heads, int len, int head_dim, int box_rows,
                                  bool bf16) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
    if (!enc || (reinterpret_cast<uintptr_t>(base) & 15)) return false;
    const int64_t es = 2; /* bytes per element */
    cuuint64_t dims[4] = {(cuuint64_t)head_dim, (cuuint64_t)len, (cuuint64_t)heads,
                          (cuuint64_t)batch};
    /* a dimension of size 1 is never stepped: any valid stride will do */
    cuuint64_t strides[3] = {(cuuint64_t)(stride[2] * es),
                             (cuuint64_t)(heads > 1 ? stride[1] * es : 16),
                             (cuuint64_t)(batch > 1 ? stride[0] * es : 16)};
    for (int i = 0; i < 3; ++i)
        if (strides[i] == 0 || strides[i] % 16 || strides[i] >= ((cuuint64_t)1 << 40)) return false;
    cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1}, estride[4] = {1, 1, 1, 1};
    return enc(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
               const_cast<void *>(base), dims, strides, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Tensor maps of a launch's Q, K and V for boxes of box_rows rows (K and V: kv_box_rows where
 * given); false where the launch cannot
 * be read through them (the caller then runs the ring kernel): a sequence shorter than the
 * tensors (TMA would read its padding, where only rows past the tensor read as zeros), or a
 * tensor TMA cannot address. */
static inline bool encode_qkv_maps(CUtensorMap *q, CUtensorMap *k, CUtensorMap *v,
                                   const mi_cuda_attn_params *p, int box_rows,
                                   int kv_box_rows = 0) {
    for (int b = 0; b < p->batch; ++b)
        if (p->seq_lens[b] != p->len) return false;
    const bool bf16 = p->dtype == MI_DTYPE_BF16;
    const int kv_rows = kv_box_rows > 0 ? kv_box_rows : box_rows;
    const int d = p->head_dim;
    return encode_tma_map(q, p->q, p->q_stride, p->batch, p->heads, p->len, d, box_rows, bf16) &&
           encode_tma_map(k, p->k, p->k_stride, p->batch, p->heads_kv, p->len, d, kv_rows, bf16) &&
           encode_tma_map(v, p->v, p->v_stride, p->batch, p->heads_kv, p->len, d, kv_rows, bf16);
}

} // namespace mi_cuda

#endif /* MI_SM90_COMMON_CUH */
