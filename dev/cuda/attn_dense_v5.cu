/*
 * dev/cuda/attn_dense_v5.cu: experiment 5 (snapshot of src/cuda/attn_fwd_sm90.cu on branch
 * gpu-perf; same SASS as the tested commit bb9b142): one 128-row kernel for every mode instead of
 * v4 (dense) + v3 (64-row blocks):
 *   - each warpgroup plans its own 64 rows (one row block of the sparse index) and the CTA walks
 *     the union of the two tile lists: a range tile both lists hold is loaded once for both, a
 *     tile of one list only is used by its warpgroup, column tiles belong to one warpgroup each;
 *   - ping-pong: both warpgroups run softmax(u), GEMMs(S(u+1), P V(u)) half a step apart inside
 *     one CTA barrier per step, so one's softmax runs while the other's wgmma run, and no wgmma
 *     is in flight while a warpgroup touches its accumulators (no private score copy);
 *   - Q in registers (wgmma RS for S, A-operand layout loaded once), four cp.async K/V stages.
 * Two ptxas pitfalls met: wgmma under a branch on a value ptxas cannot prove warp-uniform are
 * serialised (C7520); broadcasting the warpgroup index and the "S of this tile" flag from lane 0
 * (__shfl_sync) fixes it. A P V under a branch is serialised as well (C7515) even when uniform,
 * so P V always runs and a warpgroup that does not use the tile multiplies P = 0.
 * 241 registers, no spills, 133 KB of shared memory, one CTA (8 warps) per SM.
 *
 * Reached on an NVIDIA H200 (CUDA 13.0, bf16, D = 128, causal; one short run,
 * bench/results/2026-11-30-gpu-attention-v5-check.json; 334/334 GPU tests):
 *   dense  32K x 32 heads: 0.635 ms/head, 433 TFLOP/s; cuDNN SDPA 0.441 ms/head (623) in the same
 *          run = 0.69x, torch flash 344. v4: 0.685 ms/head, 401 TFLOP/s.
 *   sparse (effective TFLOP/s, ms/head) local 128K 316 (1.386), small 128K 255 (0.303), local 1M
 *          317 (11.31). v3 in earlier runs: local 321-324, small 271-280, local 1M 318 (11.29):
 *          flat on local, about 6 % slower on small. Not measured: mixed, 512K, dense >= 128K.
 * Full benchmark of this version merged with the runner (bench/run_gpu_bench.sh, same H200,
 * bench/results/2026-11-30-gpu-attention-v5-full.json): dense 433 / 429 / 429 / 431 TFLOP/s at
 * 32K / 128K / 512K / 1M (0.66 / 0.76 / 0.88 / 0.92x cuDNN; v4 401-407), but the sparse sets
 * lost: mixed 361 / 311 / 303 at 128K / 512K / 1M (v3 387 / 384 / 378), small 261 / 246 / 252
 * (v3 280 / 256 / 265), local flat; estimated VS prefill at 1M x 8 heads 515.8 ms (v3 448.5).
 * Sparse prefill is what the library is for, so src/cuda keeps v4 (dense) + v3 (sparse) and this
 * stays an experiment until the sparse steps are no slower than v3.
 * Then (src/cuda/attn_fwd_sm90.cu, the ring kernel): the 64-row one-warpgroup kernel with K and
 * V in one ring of three 16 KB slots (48 KB instead of 64 KB of tiles), 161 registers, three CTAs
 * = 12 warps per SM. Sparse sets +6 to +19 % (local 365-376, mixed 408-423, small 286-326
 * TFLOP/s; bench/results/2026-11-30-gpu-sparse-ring-ab.json), and dense through it +8 to +12 %
 * over v4 (445 / 439 / 430 / 431 TFLOP/s at 32K / 128K / 512K / 1M, 0.66-0.90x cuDNN;
 * bench/results/2026-11-30-gpu-dense-ring-ab.json), so it serves every mode now. More resident
 * warps was the lever, as the profile (latency bound, 8 warps per SM) suggested.
 * Reading: a step (one 64-key tile for both warpgroups, 2 x 2.1 MFLOP of wgmma) takes about
 * 1.28 us here and 1.38 us in v4, i.e. 2200-2700 cycles at 1.75-1.98 GHz against ~1000 cycles of
 * tensor work at the nominal rate, although v4 and v5 overlap quite different things (v4: S(t+1) with the softmax of
 * the same warpgroup, both warpgroups in lockstep; v5: one warpgroup's softmax with the other's
 * GEMMs). What limits both is therefore something they share, not the schedule: the leads are the
 * 64-wide S GEMMs (m64n64k16; FlashAttention-3 runs 128-176 keys per S for D = 128) and the
 * 32 KB of K/V per step through L2. Sharing tiles between the two warpgroups did not lift the
 * sparse sets because a step costs the same as before; `small` (about 19 steps per CTA) loses its
 * second CTA per SM that hid each CTA's start (plan, offsets, first tiles: dependent loads).
 * Next: S over 128 keys (two contiguous range tiles, or two column tiles of one warpgroup, per
 * step; S and P then need 48 more registers, so Q goes back to shared memory), then a producer
 * warp with TMA for in-range tiles, and a persistent grid so one tile list's start overlaps the
 * previous one's end.
 */
/*
 * attn_fwd_sm90.cu: the Hopper (sm_90a) variant of the attention kernel, D = 128: warpgroup MMA
 * (wgmma) instead of mma.sync, same tile plan (attn_plan.cuh), same masking and numerics as
 * attn_fwd.cu. One kernel serves every mode (dense, A-/Tri-shape, sparse). H200: dense 433
 * TFLOP/s at 32K, the sparse sets as the earlier 64-row kernel; numbers, history and what limits
 * it: dev/cuda/attn_dense_v5.cu (earlier versions v1-v4 beside it).
 *
 * A CTA owns 128 query rows as two warpgroups of 64. Each warpgroup plans its own 64 rows (one row
 * block of the sparse index), and the CTA walks the union of the two tile lists: a range tile
 * that both lists hold (same offset; for dense and the sparse bands nearly all of them) is loaded
 * once and used by both warpgroups, a tile of one list only is used by its warpgroup alone, and
 * gathered column tiles belong to one warpgroup each. This halves the K/V traffic per FLOP
 * against a 64-row CTA and gives both warpgroups the same tiles to overlap on.
 *
 * Per 64-key tile a warpgroup runs S = Q K^T (8 x m64n64k16, Q in registers in the A-operand
 * layout, loaded once) and O += P V (4 x m64n128k16, P from registers: the accumulator layout of S
 * is the register layout of the A operand; V read transposed, MN-major B), K and V tiles in shared
 * memory in the 128-byte-swizzled K-major layout wgmma reads: each 128-column row is split in two
 * 64-column halves, and 16-byte chunk c of row r is stored at chunk c ^ (r & 7).
 *
 * Ping-pong: the two warpgroups run the same sequence softmax(u), GEMMs(S(u+1), PV(u)), ... half a
 * step apart, so that one's softmax (ALU, MUFU) runs while the other's GEMMs keep the tensor
 * cores busy. Step t is framed by one CTA barrier; inside it warpgroup 0 issues S(t+1) and PV(t),
 * waits, then does the softmax of tile t+1, while warpgroup 1 does the softmax of tile t first and
 * then its GEMMs. No wgmma is in flight while a warpgroup touches its accumulators, so ptxas does
 * not serialise them, and the scores need a single register array.
 * K/V tiles arrive by cp.async from all threads (any key positions, as sparse tiles need), four
 * stages: tile t+3 is issued in step t into the stage tile t-1 used, and waited two steps later;
 * the writes are made visible to the async proxy with fence.proxy.async before the barrier.
 */
#include "../../src/cuda/attn_plan.cuh"

#include <math.h>
#include <stdlib.h>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MI_SM90_DEVICE 1
#endif

namespace mi_cuda {

#ifdef MI_SM90_DEVICE
#include "../../src/cuda/wgmma_ops.cuh"

template <typename T> struct wg;
template <> struct wg<__nv_bfloat16> {
    __device__ static void qk_rs(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n64_bf16(d, a, b, sc);
    }
    __device__ static void pv(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n128_tb_bf16(d, a, b, sc);
    }
};
template <> struct wg<__half> {
    __device__ static void qk_rs(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n64_f16(d, a, b, sc);
    }
    __device__ static void pv(float *d, const uint32_t *a, uint64_t b, int sc) {
        wgmma_rs_m64n128_tb_f16(d, a, b, sc);
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
/* Pins registers in place around asynchronous wgmma (no instruction emitted): the compiler may
 * not move or reuse them across these points. */
template <int N> __device__ __forceinline__ void fence_operands(float *r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
#endif

/* Byte offset of 16-byte chunk c (0..15) of row r in a swizzled [2 halves][rows][128 B] tile. */
__device__ __forceinline__ uint32_t sw_off(int r, int c, int half_bytes) {
    return (uint32_t)((c >> 3) * half_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* wgmma shared-memory descriptor, 128-byte swizzle. */
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | ((uint64_t)1 << 62);
}

/* One tile of the CTA's walk. users: bit w set when warpgroup w computes it (0: no tile, the walk
 * is over). A range tile holds keys off .. off + 63; a column tile holds the gathered columns
 * 64 * idx .. 64 * idx + 63 of its one user's column list. */
struct walk_tile {
    int pos;   /* range: first key; column: tile index in the user's column list */
    int users; /* bits 0, 1: warpgroups; bit 2: column tile */
};
constexpr int WALK_COLUMN = 4;
constexpr int NO_RANGE = 0x7fffffff; /* past the end of a range list (offsets are < 2^30) */

__device__ __forceinline__ int range_at(const tile_plan &tp, int i) {
    return i < tp.n_a ? tile_offset(tp, i) : NO_RANGE;
}

/* The union of the two warpgroups' tile lists: range tiles merged by offset (each list ascending
 * in practice; any order stays correct, a tile is then just not shared), then the column tiles of
 * warpgroup 0, then those of warpgroup 1. Every thread runs the same walk. The next offset of each
 * list is read one tile ahead, so the load latency hides behind a step. */
struct tile_walk {
    int i0, i1, head0, head1, col;

    __device__ __forceinline__ void start(const tile_plan &tp0, const tile_plan &tp1) {
        i0 = i1 = col = 0;
        head0 = range_at(tp0, 0);
        head1 = range_at(tp1, 0);
    }
    __device__ __forceinline__ walk_tile next(const tile_plan &tp0, const tile_plan &tp1) {
        walk_tile w;
        if (head0 != NO_RANGE || head1 != NO_RANGE) {
            w.pos = min(head0, head1);
            w.users = (head0 == w.pos ? 1 : 0) | (head1 == w.pos ? 2 : 0);
            if (w.users & 1) head0 = range_at(tp0, ++i0);
            if (w.users & 2) head1 = range_at(tp1, ++i1);
        } else if (col < tp0.n_b) {
            w.pos = col++;
            w.users = 1 | WALK_COLUMN;
        } else if (col < tp0.n_b + tp1.n_b) {
            w.pos = col++ - tp0.n_b;
            w.users = 2 | WALK_COLUMN;
        } else {
            w.pos = 0;
            w.users = 0;
        }
        return w;
    }
};

template <typename T>
__global__ void __launch_bounds__(256, 1)
    attn_fwd_sm90_kernel(const __grid_constant__ mi_cuda_attn_params p) {
#ifdef MI_SM90_DEVICE
    constexpr int D = 128, BM = 128, NT = 256, CPR = 16, NSTAGE = 4;
    constexpr int KHALF = BN * 128, KTILE = 2 * KHALF;
    using tr = dtype_traits<T>;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *base = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
    unsigned char *ks = base;                                 /* [NSTAGE] */
    unsigned char *vs = ks + NSTAGE * KTILE;                  /* [NSTAGE] */
    int *kpos = reinterpret_cast<int *>(vs + NSTAGE * KTILE); /* [NSTAGE][BN] */

    const int tid = threadIdx.x;
    /* broadcast from lane 0: ptxas then knows the warpgroup index is warp-uniform and keeps the
     * wgmma in the branches below pipelined */
    const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int warp = (tid / 32) % 4, lane = tid % 32;
    const int me = 1 << wgi;                      /* this warpgroup's bit in walk_tile::users */
    const int m_blk = gridDim.x - 1 - blockIdx.x; /* heavy (late) row blocks first */
    const int bh = blockIdx.y;
    const int b = bh / p.heads, h = bh % p.heads;
    const int hk = h / p.group;
    const int len = p.seq_lens[b];
    const int rs = m_blk * BM;
    const int rs_wg = rs + wgi * 64; /* this warpgroup's first row */

    const T *qg = reinterpret_cast<const T *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    const T *kg = reinterpret_cast<const T *>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
    const T *vg = reinterpret_cast<const T *>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];
    T *og = reinterpret_cast<T *>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    float *lseg = p.lse ? p.lse + ((int64_t)b * p.heads + h) * p.len : nullptr;

    /* one plan per warpgroup: 64-row blocks 2 m_blk and 2 m_blk + 1 */
    tile_plan tp0, tp1;
    if (!plan_tiles(p, h, bh, 2 * m_blk, rs, 64, len, tp0)) return;
    plan_tiles(p, h, bh, 2 * m_blk + 1, rs + 64, 64, len, tp1);
    tile_walk walk;
    walk.start(tp0, tp1);
    /* tiles t .. t+3 of the walk: this step's, the next, and the two in flight */
    walk_tile w0 = walk.next(tp0, tp1);
    if (w0.users == 0) {
        write_empty_rows(og, p.o_stride[2], lseg, rs, min(BM, p.len - rs), D, tid, NT);
        return;
    }
    walk_tile w1 = walk.next(tp0, tp1);
    walk_tile w2 = walk.next(tp0, tp1);

    /* Fast path for a 64-key range fully inside the sequence: each thread always copies the same
     * 16-byte column chunk of rows lr0, lr0 + RPP, ...; RPP is a multiple of 8, so the swizzle
     * term is the same for all of them and every address is a base plus a constant. */
    constexpr int RPP = NT / CPR, PASSES = BN / RPP;
    const int lr0 = tid / CPR, lc = tid % CPR;
    const uint32_t soff0 = sw_off(lr0, lc, KHALF);
    const int64_t ksl = p.k_stride[2], vsl = p.v_stride[2];
    const T *kbase = kg + lr0 * ksl + lc * 8;
    const T *vbase = vg + lr0 * vsl + lc * 8;
    /* Issues the copies of tile w into stage buf (nothing for the end of the walk). Keys that do
     * not exist are zero-filled, so a masked probability (0) never multiplies garbage. */
    auto load_kv = [&](const walk_tile &w, int buf) {
        unsigned char *kd = ks + buf * KTILE;
        unsigned char *vd = vs + buf * KTILE;
        if (w.users == 0) return;
        if (!(w.users & WALK_COLUMN)) {
            const int off = w.pos;
            if (off >= 0 && off + BN <= len) {
                const T *kp = kbase + off * ksl;
                const T *vp = vbase + off * vsl;
#pragma unroll
                for (int i = 0; i < PASSES; ++i) {
                    cp_async_16(kd + soff0 + i * RPP * 128, kp + i * RPP * ksl, 16);
                    cp_async_16(vd + soff0 + i * RPP * 128, vp + i * RPP * vsl, 16);
                }
            } else {
#pragma unroll
                for (int i = 0; i < PASSES; ++i) {
                    const int r = lr0 + i * RPP, pos = off + r;
                    const bool ok = pos >= 0 && pos < len;
                    const int64_t row = ok ? pos : 0;
                    const uint32_t o = soff0 + i * RPP * 128;
                    cp_async_16(kd + o, kg + row * ksl + lc * 8, ok ? 16 : 0);
                    cp_async_16(vd + o, vg + row * vsl + lc * 8, ok ? 16 : 0);
                }
            }
            return;
        }
        /* gathered columns of one warpgroup's list; their positions go to kpos for the mask */
        const bool of0 = w.users & 1;
        const int32_t *cols = (of0 ? tp0.cols : tp1.cols) + w.pos * BN;
        const int n = (of0 ? tp0.n_cols : tp1.n_cols) - w.pos * BN;
        int pos[PASSES];
#pragma unroll
        for (int i = 0; i < PASSES; ++i) {
            const int r = lr0 + i * RPP;
            pos[i] = r < n ? __ldg(cols + r) : -1;
        }
#pragma unroll
        for (int i = 0; i < PASSES; ++i) {
            const int r = lr0 + i * RPP;
            const bool ok = pos[i] >= 0 && pos[i] < len;
            const int64_t row = ok ? pos[i] : 0;
            const uint32_t o = soff0 + i * RPP * 128;
            cp_async_16(kd + o, kg + row * ksl + lc * 8, ok ? 16 : 0);
            cp_async_16(vd + o, vg + row * vsl + lc * 8, ok ? 16 : 0);
            if (lc == 0) kpos[buf * BN + r] = ok ? pos[i] : MI_NO_KEY;
        }
    };

    const int g = lane / 4, cq = lane % 4;
    const int qrow0 = rs_wg + warp * 16 + g, qrow1 = qrow0 + 8;

    /* Q in registers in the A-operand layout: rows g and g + 8 of this warp's 16, columns
     * 16 kk + 2 cq (+1) and 16 kk + 8 + 2 cq (+1); rows past the sequence are zeros */
    uint32_t qf[8][4];
    {
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
    uint32_t pa[4][4]; /* P of the last softmax, bf16/fp16 pairs in the A-operand layout */
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const tile_plan &mask_tp = tp0; /* mode and A-shape window: the same for both warpgroups */

    /* S = Q K^T of the tile in stage buf into s (issued, not committed) */
    auto issue_s = [&](int buf) {
        const uint32_t k_addr = smem_addr(ks + buf * KTILE);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t ka = k_addr + (kk >> 2) * KHALF + (kk & 3) * 32;
            wg<T>::qk_rs(s, qf[kk], sw128_desc(ka, 16, 1024), kk > 0);
        }
    };
    /* O += P V of the tile in stage buf (issued, not committed) */
    auto issue_pv = [&](int buf) {
        const uint32_t v_addr = smem_addr(vs + buf * KTILE);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wg<T>::pv(o, pa[kk], sw128_desc(v_addr + kk * 16 * 128, KHALF, 1024), 1);
    };
    /* This warpgroup's GEMMs of step t: S of tile t+1 when it uses that tile, and P V of tile t,
     * one commit group; the copies of tile t+3 are issued while they run. P V runs even for a tile
     * this warpgroup does not use, with P = 0: a P V under a branch makes ptxas serialise every
     * wgmma (C7515), which costs more than the idle multiply. */
    auto gemms = [&](const walk_tile &nxt, int t, const walk_tile &far) {
        /* broadcast from lane 0: warp-uniform for ptxas, else the branch serialises the wgmma */
        const bool do_s = __shfl_sync(0xffffffffu, nxt.users & me, 0) != 0;
        if (do_s) {
#pragma unroll
            for (int i = 0; i < 32; ++i) s[i] = 0.f;
        }
        wgmma_fence();
        if (do_s) issue_s((t + 1) % NSTAGE);
        issue_pv(t % NSTAGE);
        wgmma_commit();
        load_kv(far, (t + 3) % NSTAGE);
        cp_async_commit(); /* one group a step, empty or not: the waits count steps */
        wgmma_wait0();
        fence_operands<32>(s);
        fence_operands<64>(o);
    };

    /* Online softmax of tile w (scores in s, stage buf): masks, running max and sums, O rescaled,
     * P packed into pa for the next P V; P = 0 for a tile this warpgroup does not use. */
    auto softmax = [&](const walk_tile &w, int buf) {
        if (!(w.users & me)) {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
            return;
        }
        /* Range tiles know their key positions (off + column); column tiles read them from
         * shared memory. Scores stay unscaled here: the scale is folded into exp2 below. */
        const bool range = !(w.users & WALK_COLUMN);
        const int off = w.pos;
        if (!(range && range_tile_unmasked(mask_tp, off, rs_wg, len))) {
            const int *kp = kpos + buf * BN;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = 8 * j + 2 * cq + (e & 1);
                    int key = range ? off + col : kp[col];
                    if (range && (key < 0 || key >= len)) key = MI_NO_KEY;
                    if (!key_visible(mask_tp, key, e < 2 ? qrow0 : qrow1)) s[4 * j + e] = -INFINITY;
                }
            }
        }
        /* running max in scaled base-2 units (scale > 0, so max and scale commute) */
        const float sc = p.scale_log2;
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
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            o[4 * i] *= al0;
            o[4 * i + 1] *= al0;
            o[4 * i + 2] *= al1;
            o[4 * i + 3] *= al1;
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            pa[kk][0] = tr::pack2(s[8 * kk], s[8 * kk + 1]);
            pa[kk][1] = tr::pack2(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = tr::pack2(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = tr::pack2(s[8 * kk + 6], s[8 * kk + 7]);
        }
    };

    /* prologue: tiles 0..2 in flight, S of tile 0; warpgroup 0 runs half a step
     * ahead, so it also does the softmax of tile 0 now */
    load_kv(w0, 0);
    cp_async_commit();
    load_kv(w1, 1);
    cp_async_commit();
    load_kv(w2, 2);
    cp_async_commit();
    cp_async_wait<2>();
    fence_proxy_async();
    __syncthreads();
    if (__shfl_sync(0xffffffffu, w0.users & me, 0)) {
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.f;
        wgmma_fence();
        issue_s(0);
        wgmma_commit();
        wgmma_wait0();
        fence_operands<32>(s);
    }
    if (wgi == 0) softmax(w0, 0);

    for (int t = 0; w0.users != 0; ++t) {
        cp_async_wait<1>(); /* this thread's copies of tile t+1 (tile t+2's may still fly) */
        fence_proxy_async();
        __syncthreads(); /* tile t+1 visible; stage (t+3) % 4 (tile t-1) free */
        const walk_tile w3 = walk.next(tp0, tp1);
        if (wgi == 0) {
            gemms(w1, t, w3);
            softmax(w1, (t + 1) % NSTAGE);
        } else {
            softmax(w0, t % NSTAGE);
            gemms(w1, t, w3);
        }
        w0 = w1;
        w1 = w2;
        w2 = w3;
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const bool live0 = qrow0 < len && l0 > 0.f, live1 = qrow1 < len && l1 > 0.f;
    const float inv0 = live0 ? 1.f / l0 : 0.f, inv1 = live1 ? 1.f / l1 : 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int c = 8 * i + 2 * cq;
        if (qrow0 < p.len)
            *reinterpret_cast<uint32_t *>(og + (int64_t)qrow0 * p.o_stride[2] + c) =
                tr::pack2(o[4 * i] * inv0, o[4 * i + 1] * inv0);
        if (qrow1 < p.len)
            *reinterpret_cast<uint32_t *>(og + (int64_t)qrow1 * p.o_stride[2] + c) =
                tr::pack2(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
    }
    if (lseg && cq == 0) {
        if (qrow0 < p.len) lseg[qrow0] = live0 ? m0 * MI_LN2 + logf(l0) : -INFINITY;
        if (qrow1 < p.len) lseg[qrow1] = live1 ? m1 * MI_LN2 + logf(l1) : -INFINITY;
    }
#endif
}

template <typename T>
static cudaError_t launch_sm90(const mi_cuda_attn_params &p, cudaStream_t st) {
    constexpr int BM = 128, NSTAGE = 4, KTILE = 2 * BN * 128;
    const size_t smem = 1024 + 2 * NSTAGE * KTILE + NSTAGE * BN * sizeof(int);
    auto kern = attn_fwd_sm90_kernel<T>;
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((p.len + BM - 1) / BM, p.batch * p.heads);
    kern<<<grid, 256, smem, st>>>(p);
    return cudaGetLastError();
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

/* Every mode runs the same 128-row kernel (block_m is the sm_80 kernel's choice). */
extern "C" cudaError_t mi_cuda_attn_sm90_launch(const mi_cuda_attn_params *p, int block_m,
                                                cudaStream_t st) {
    (void)block_m;
    return p->dtype == MI_DTYPE_BF16 ? mi_cuda::launch_sm90<__nv_bfloat16>(*p, st)
                                     : mi_cuda::launch_sm90<__half>(*p, st);
}
