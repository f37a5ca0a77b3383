/*
 * vs_estimate.cu: vertical-slash estimation for all heads in three launches.
 *
 *   1. stats:   the last n = min(64, len) queries against key chunks of 2048 keys, tensor cores
 *               (wgmma on Hopper, mma.sync elsewhere); per chunk and row the running max and sum
 *               of exp (base 2).
 *   2. sums:    merge the chunk statistics into each row's log-sum-exp, recompute the scores,
 *               P = exp(s - lse) in fp32, staged a 64 x 64 tile at a time in shared memory,
 *               where one thread sums each column (each chunk owns its columns) and one each
 *               pair of diagonals (global atomics add the diagonals to the ones the previous
 *               and next chunks share). No shared-memory float atomics: on these GPUs they are
 *               compare-and-swap loops, and lanes of a warp meet on one diagonal.
 *   3. select:  per (b, h) and per vector, force the sinks / the local diagonals to +inf, radix
 *               select the per-head budget over CTAs of 4096 keys (three histogram passes),
 *               compact in index order: verticals come out ascending, slash distances
 *               descending (index i = len-1-d ascending), with no sort.
 * Recomputing the scores (twice the GEMM) avoids an [H, 64, L] fp32 buffer (8.6 GB at 1M x 32).
 * The corner mask of the estimate is the causal mask of query position len-n+r, so the tile code
 * is the attention kernel's; tiles without a masked key skip the mask and fold the scale into
 * the exponent.
 * Scores are q.k accumulated in fp32 (the original rounds the product to the input dtype before
 * scaling; keeping fp32 changes nothing but near-ties).
 * Entry points: mi_cuda_vs_scratch_bytes, mi_cuda_vs_estimate_run, mi_cuda_vs_estimate.
 */
#include "block_select.cuh"
#include "cuda_common.cuh"
#include "sm90_common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

namespace mi_cuda {

constexpr int VS_CHUNK = 2048;
constexpr int VS_ROWS = 64;
/* row pitch (floats) of the P tile of pass 2: 72 = 8 mod 32 puts the 16 float2 stores of a
 * half warp (rows g, columns 2 cq) in distinct banks */
constexpr int VS_P_PITCH = 72;

struct vs_params {
    const void *q, *k;
    int64_t q_stride[3], k_stride[3];
    int32_t heads, group, len, nchunks;
    int32_t q_off; /* q holds the rows from this position on (queries at an offset) */
    float scale_log2;
    float *vert, *slash; /* [B*H, len] */
    float2 *stats;       /* [B*H, nchunks, 64]: (max, sum) base 2 */
    int32_t dense_below;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
    uint8_t active[MI_CUDA_MAX_HEADS];
};

/* Pass 2's start: thread r < 64 merges row r's chunk statistics into its log-sum-exp, base 2
 * (row_lse; +inf for rows past n and rows with nothing, whose P is then 0). */
__device__ __forceinline__ void vs_merge_row_stats(const vs_params &p, int bh, int len, int n,
                                                   float *row_lse) {
    const int tid = threadIdx.x;
    if (tid >= VS_ROWS) return;
    float m = -INFINITY, l = 0.f;
    const float2 *st = p.stats + (int64_t)bh * p.nchunks * VS_ROWS + tid;
    const int nch = (len + VS_CHUNK - 1) / VS_CHUNK;
    for (int c = 0; c < nch; ++c) {
        const float2 v = st[(int64_t)c * VS_ROWS];
        if (v.x == -INFINITY) continue;
        const float mn = fmaxf(m, v.x);
        l = l * exp2f(m - mn) + v.y * exp2f(v.x - mn);
        m = mn;
    }
    row_lse[tid] = (l > 0.f && tid < n) ? m + log2f(l) : INFINITY;
}

/* What a thread of a score CTA (128 threads, one chunk of one head) keeps from one 64-key tile
 * to the next, and the per-tile step both score kernels share. The thread holds rows
 * qr0 = 16 warp + lane / 4 and qr1 = qr0 + 8 of the 64 queries, and of a tile of q.k the keys
 * 8 j + 2 cq (+1) at s[4 j + (0, 1)] for qr0 and s[4 j + (2, 3)] for qr1: the mma.sync and the
 * wgmma accumulator layout alike. */
template <int PASS> struct vs_chunk_rows {
    /* edge: a tile whose keys all lie below it needs no mask (every key before c1 and at or
     * before the first row's position) */
    int tid, cq, qr0, qr1, qpos0, qpos1, c0, c1, n, ns, edge;
    row_softmax sm;               /* pass 1: running max, sum */
    float lse0 = 0.f, lse1 = 0.f; /* pass 2: row log-sum-exp */
    /* pass 2: the running sum of the diagonal this thread finishes in the next tile (threads
     * 0..63; see step) */
    float carry = 0.f;
    float *vg, *sg;

    __device__ __forceinline__ vs_chunk_rows(const vs_params &p, int bh, int len, int c0_, int c1_,
                                             int n_) {
        tid = threadIdx.x;
        const int warp = tid / 32, lane = tid % 32;
        cq = lane % 4;
        qr0 = warp * 16 + lane / 4;
        qr1 = qr0 + 8;
        c0 = c0_;
        c1 = c1_;
        n = n_;
        qpos0 = qr0 < n ? len - n + qr0 : -1;
        qpos1 = qr1 < n ? len - n + qr1 : -1;
        vg = p.vert + (int64_t)bh * p.len;
        sg = p.slash + (int64_t)bh * p.len;
        /* diagonal sums at chunk-local index i = 64 t + n - 1 + (key - row) go to global
         * memory; the 63 indices a chunk shares with the next are summed there by both */
        ns = min(c1 - c0 + n - 1, len - c0);
        edge = min(c1, len - n + 1);
    }
    /* pass 2, once vs_merge_row_stats' results are visible */
    __device__ __forceinline__ void load_row_stats(const float *row_lse) {
        lse0 = row_lse[qr0];
        lse1 = row_lse[qr1];
    }
    __device__ __forceinline__ void add_slash(int i, float v) {
        if (v != 0.f && i >= 0 && i < ns) atomicAdd(sg + c0 + i, v);
    }
    /* Tile t of the chunk (keys c0 + 64 t ..) from its raw scores s. Pass 2 stages P in pt and
     * syncs the CTA once between writing and reading it; the caller syncs before pt is
     * written again. */
    __device__ __forceinline__ void step(float *s, int t, float scale_log2, float *pt) {
        const int kbase = c0 + t * 64;
        /* sc scales s inside the exponent. A tile with keys to mask, or a scale that is not
         * positive (where the row maximum of s would not give that of s * scale), is masked
         * and scaled here instead. */
        float sc = scale_log2;
        if (kbase + 64 > edge || !(scale_log2 > 0.f)) {
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kbase + 8 * j + 2 * cq + (e & 1);
                    const int qpos = e < 2 ? qpos0 : qpos1;
                    s[4 * j + e] =
                        (key < c1 && key <= qpos) ? s[4 * j + e] * scale_log2 : -INFINITY;
                }
            sc = 1.f;
        }
        if (PASS == 1) {
            sm.update(s, sc); /* the probabilities it leaves in s are not needed */
        } else {
            /* P in fp32 to shared memory, then each of its 64 columns and 127 diagonals summed
             * by one thread, without atomics: shared-memory float atomics are compare-and-swap
             * loops on this GPU, and the lanes of a warp hit the same diagonals */
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int c = 8 * j + 2 * cq;
                *reinterpret_cast<float2 *>(pt + qr0 * VS_P_PITCH + c) = make_float2(
                    exp2f(fmaf(s[4 * j], sc, -lse0)), exp2f(fmaf(s[4 * j + 1], sc, -lse0)));
                *reinterpret_cast<float2 *>(pt + qr1 * VS_P_PITCH + c) = make_float2(
                    exp2f(fmaf(s[4 * j + 2], sc, -lse1)), exp2f(fmaf(s[4 * j + 3], sc, -lse1)));
            }
            __syncthreads();
            if (tid < 64) {
                /* thread k: diagonal key - row = k (rows 0..63-k) and k - 64 (rows 64-k..63),
                 * 64 entries in all; the second is the one left open by the previous tile as
                 * its diagonal k, so it completes there */
                float a = 0.f, b = 0.f;
#pragma unroll 16
                for (int r = 0; r < 64; ++r) {
                    const float v = pt[r * VS_P_PITCH + ((r + tid) & 63)];
                    if (r + tid < 64)
                        a += v;
                    else
                        b += v;
                }
                add_slash(t * 64 + n - 1 + tid - 64, carry + b);
                carry = a;
            } else {
                /* thread 64 + c: column c, in four sums (one chain of 64 adds waited on each) */
                const int c = tid - 64;
                float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll
                for (int r = 0; r < 64; r += 4) {
                    a0 += pt[r * VS_P_PITCH + c];
                    a1 += pt[(r + 1) * VS_P_PITCH + c];
                    a2 += pt[(r + 2) * VS_P_PITCH + c];
                    a3 += pt[(r + 3) * VS_P_PITCH + c];
                }
                if (kbase + c < c1) vg[kbase + c] = (a0 + a1) + (a2 + a3);
            }
        }
    }
    /* after the chunk's last tile (n_tiles of them) */
    __device__ __forceinline__ void finish(const vs_params &p, int bh, int chunk, int n_tiles) {
        if (PASS == 1) {
            const float l0 = quad_sum(sm.l0), l1 = quad_sum(sm.l1);
            if (cq == 0) {
                float2 *st = p.stats + ((int64_t)bh * p.nchunks + chunk) * VS_ROWS;
                st[qr0] = make_float2(sm.m0, l0);
                st[qr1] = make_float2(sm.m1, l1);
            }
        } else if (tid < 64) {
            add_slash((n_tiles - 1) * 64 + n - 1 + tid, carry);
        }
    }
};

/* A score CTA's place: head h, chunk, batch b from the grid; false where it has nothing to do */
struct vs_chunk_place {
    int b, h, chunk, bh, len, c0, c1, n, n_tiles;
    __device__ __forceinline__ bool of(const vs_params &p) {
        h = blockIdx.x;
        chunk = blockIdx.y;
        b = blockIdx.z;
        len = p.seq_lens[b];
        if (!p.active[h] || len <= 0 || (p.dense_below > 0 && len < p.dense_below)) return false;
        c0 = chunk * VS_CHUNK;
        if (c0 >= len) return false;
        c1 = min(c0 + VS_CHUNK, len);
        n = min(VS_ROWS, len - p.q_off);
        if (n <= 0) return false;
        bh = b * p.heads + h;
        n_tiles = (c1 - c0 + 63) / 64;
        return true;
    }
    template <typename T> __device__ __forceinline__ const T *q_rows(const vs_params &p) const {
        return reinterpret_cast<const T *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    }
    template <typename T> __device__ __forceinline__ const T *k_rows(const vs_params &p) const {
        return reinterpret_cast<const T *>(p.k) + b * p.k_stride[0] + (h / p.group) * p.k_stride[1];
    }
};

/* The portable score kernel (mma.sync): each warp multiplies its 16 query rows by the whole
 * K tile, read from shared memory with ldmatrix. */
template <typename T, int D, int PASS>
__global__ void __launch_bounds__(128) vs_scores_kernel(const __grid_constant__ vs_params p) {
    constexpr int PITCH = D + 8;
    constexpr int CPR = D / 8;
    constexpr int NT = 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *qs = reinterpret_cast<T *>(smem_raw);
    T *ks = qs + VS_ROWS * PITCH;                               /* [2][64][PITCH] */
    float *pt = reinterpret_cast<float *>(ks + 2 * 64 * PITCH); /* [64][VS_P_PITCH] P of a tile */
    float *row_lse = pt + 64 * VS_P_PITCH;                      /* [64] */

    vs_chunk_place w;
    if (!w.of(p)) return;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const T *qg = w.q_rows<T>(p), *kg = w.k_rows<T>(p);

    for (int i = tid; i < VS_ROWS * CPR; i += NT) {
        const int r = i / CPR, c = i % CPR;
        const bool ok = r < w.n;
        const int64_t row = ok ? w.len - w.n + r - p.q_off : 0;
        cp_async_16(qs + r * PITCH + c * 8, qg + row * p.q_stride[2] + c * 8, ok ? 16 : 0);
    }
    auto load_k = [&](int t, int buf) {
        for (int i = tid; i < 64 * CPR; i += NT) {
            const int r = i / CPR, c = i % CPR;
            const int key = w.c0 + t * 64 + r;
            const bool ok = key < w.c1;
            cp_async_16(ks + (buf * 64 + r) * PITCH + c * 8,
                        kg + (int64_t)(ok ? key : 0) * p.k_stride[2] + c * 8, ok ? 16 : 0);
        }
    };
    load_k(0, 0);
    cp_async_commit();
    if (PASS == 2) vs_merge_row_stats(p, w.bh, w.len, w.n, row_lse);

    vs_chunk_rows<PASS> rows(p, w.bh, w.len, w.c0, w.c1, w.n);
    uint32_t qf[D / 16][4];
    for (int t = 0; t < w.n_tiles; ++t) {
        const int buf = t & 1;
        if (t + 1 < w.n_tiles) {
            load_k(t + 1, buf ^ 1);
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
                ldmatrix_x4(qf[kk], qs + r * PITCH + kk * 16 + 8 * (lane / 16));
            }
            if (PASS == 2) rows.load_row_stats(row_lse);
        }
        const T *kb = ks + buf * 64 * PITCH;
        float s[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t bfr[4];
                const int key = 16 * j + (lane % 8) + 8 * (lane / 16);
                ldmatrix_x4(bfr, kb + key * PITCH + kk * 16 + 8 * ((lane / 8) % 2));
                mma_16816<T>(s + 8 * j, qf[kk], bfr);
                mma_16816<T>(s + 8 * j + 4, qf[kk], bfr + 2);
            }
        }
        rows.step(s, t, p.scale_log2, pt);
        __syncthreads();
    }
    rows.finish(p, w.bh, w.chunk, w.n_tiles);
}

/* The keys' tensor map of the wgmma score kernel (on: encoded; the keys come by 16-byte copies
 * otherwise). */
struct vs_score_maps {
    CUtensorMap k;
    int32_t on;
};

/* Bytes of dynamic shared memory of the wgmma score kernel: the 1024-byte alignment, the query
 * tile and two key tiles (swizzled halves of 64 columns), the key tiles' two barriers, and for
 * pass 2 the P tile and the rows' log-sum-exp. */
template <int D, int PASS> constexpr size_t vs_wg_smem_bytes() {
    return 1024 + (size_t)3 * (D / 64) * 64 * 128 + 16 +
           (PASS == 2 ? (size_t)(64 * VS_P_PITCH + 64) * sizeof(float) : 0);
}

/* The Hopper score kernel: S = Q K^T by wgmma, the query and key tiles read by the tensor cores
 * from shared memory (128-byte swizzle) once per warpgroup, where the mma.sync kernel's four
 * warps read each key tile four times through ldmatrix. The key tiles come by TMA (one thread
 * issues a tile), two buffers: tile t in buffer t & 1, as that buffer's (t >> 1)-th load. Tile
 * t + 1's product runs while the warps process tile t. */
template <typename T, int D, int PASS>
__global__ void __launch_bounds__(128, PASS == 1 ? 4 : 3)
    vs_scores_wg_kernel(const __grid_constant__ vs_params p,
                        const __grid_constant__ vs_score_maps mp) {
#ifdef MI_SM90_DEVICE
    constexpr int HALF = 64 * 128; /* bytes of 64 rows of 64 two-byte values */
    constexpr int TILE = D / 64 * HALF;
    constexpr int CPR = D / 8;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *qs = smem_base_1024(smem_raw);
    unsigned char *ks = qs + TILE;                                /* [2][TILE] */
    uint64_t *bars = reinterpret_cast<uint64_t *>(ks + 2 * TILE); /* [2] */
    float *pt = reinterpret_cast<float *>(ks + 2 * TILE + 16);    /* pass 2: [64][VS_P_PITCH] */
    float *row_lse = pt + 64 * VS_P_PITCH;                        /* pass 2: [64] */

    vs_chunk_place w;
    if (!w.of(p)) return;
    const int tid = threadIdx.x;
    const T *qg = w.q_rows<T>(p), *kg = w.k_rows<T>(p);
    const uint32_t qs_a = smem_addr(qs), ks_a = smem_addr(ks);
    const bool tma = mp.on != 0;
    const int hk = w.h / p.group;
    for (int i = tid; i < VS_ROWS * CPR; i += 128) {
        const int r = i / CPR, c = i % CPR;
        const bool ok = r < w.n;
        const int64_t row = ok ? w.len - w.n + r - p.q_off : 0;
        cp_async_16(qs_a + sw_off(r, c, HALF), qg + row * p.q_stride[2] + c * 8, ok ? 16 : 0);
    }
    cp_async_commit();
    /* tile t into buffer buf: by TMA from thread 0 (rows past the tensor read as zeros, rows
     * past the chunk are masked), or by every thread's copies as one commit group */
    auto load_k = [&](int t, int buf) {
        if (tma) {
            if (tid == 0)
                tma_load_tile<64, D>(ks_a + buf * TILE, &mp.k, w.c0 + t * 64, hk, w.b, bars + buf);
            return;
        }
#pragma unroll
        for (int i = 0; i < 64 * CPR / 128; ++i) {
            const int c = tid + i * 128;
            const int r = c / CPR, piece = c % CPR;
            const int key = w.c0 + t * 64 + r;
            const bool ok = key < w.c1;
            cp_async_16(ks_a + buf * TILE + sw_off(r, piece, HALF),
                        kg + (int64_t)(ok ? key : 0) * p.k_stride[2] + piece * 8, ok ? 16 : 0);
        }
        cp_async_commit();
    };
    /* waits for tile t's keys (and with copies, for every group this thread committed) */
    auto wait_k = [&](int t) {
        if (tma)
            mbar_wait(bars + (t & 1), (t >> 1) & 1);
        else
            cp_async_wait<0>();
    };
    if (tma && tid == 0) {
        mbar_init(bars, 1);
        mbar_init(bars + 1, 1);
        fence_mbarrier_init();
    }
    load_k(0, 0);
    if (w.n_tiles > 1) load_k(1, 1);
    if (PASS == 2) vs_merge_row_stats(p, w.bh, w.len, w.n, row_lse);
    if (tma || w.n_tiles == 1)
        cp_async_wait<0>(); /* the queries (and tile 0) */
    else
        cp_async_wait<1>(); /* the queries and tile 0, not tile 1 */
    fence_proxy_async();
    __syncthreads(); /* the queries, the barriers' initialisation, the row statistics */
    if (tma) wait_k(0);

    vs_chunk_rows<PASS> rows(p, w.bh, w.len, w.c0, w.c1, w.n);
    if (PASS == 2) rows.load_row_stats(row_lse);
    const sw128_desc qd(qs_a, 16, 1024);
    float acc[32], s[32];
    wgmma_issue_qk<T, D>(acc, qd, HALF, sw128_desc(ks_a, 16, 1024), HALF);
    wgmma_wait<0>();
    fence_operands<32>(acc);
    /* acc: tile t's scores. The next tile's product is issued into acc before tile t is
     * processed from a copy; the issue, the step and the wait sit in one branch (ptxas
     * serialises a wgmma whose accumulators might be read before the wait, as it did in the
     * block-sparse score kernel with them split over two branches on one condition). */
    for (int t = 0; t < w.n_tiles; ++t) {
        const int buf = t & 1;
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = acc[i];
        if (t + 1 < w.n_tiles) {
            wait_k(t + 1);
            if (!tma) fence_proxy_async();
            /* tile t + 1's keys in view; every warp done with buffer buf (tile t's product) and,
             * in pass 2, with the P tile */
            __syncthreads();
            wgmma_issue_qk<T, D>(acc, qd, HALF, sw128_desc(ks_a + (buf ^ 1) * TILE, 16, 1024),
                                 HALF);
            if (t + 2 < w.n_tiles) load_k(t + 2, buf);
            rows.step(s, t, p.scale_log2, pt);
            wgmma_wait<0>();
            fence_operands<32>(acc);
        } else {
            if (PASS == 2) __syncthreads(); /* every warp done with the previous P tile */
            rows.step(s, t, p.scale_log2, pt);
        }
    }
    rows.finish(p, w.bh, w.chunk, w.n_tiles);
#endif
}

struct vs_select_params {
    const float *vert, *slash;
    int32_t heads, len, nchunks; /* nchunks: SEL_CHUNK-element chunks of the longest vector */
    int32_t forced_columns, forced_diagonals, min_vertical, min_slash;
    int32_t max_vertical, max_slash;
    int32_t *vertical_count, *vertical_idx, *slash_count, *slash_idx;
    int *hist;          /* [V][SEL_BINS]: the pass's histogram, zero between passes */
    uint32_t *state;    /* [V][4]: prefix, mask, rank left (kr), keys in the chosen bin */
    int2 *chunk_counts; /* [V][nchunks]: keys above thr, keys equal to it */
    int32_t dense_below;
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
    int32_t vertical_size[MI_CUDA_MAX_HEADS];
    int32_t slash_size[MI_CUDA_MAX_HEADS];
    uint8_t active[MI_CUDA_MAX_HEADS];
};

/* The select spreads each vector (one per (b, h) and list; V = 2 B H of them) over CTAs of
 * SEL_CHUNK keys: a radix select in three passes of 11, 11 and 10 bits, each a histogram
 * kernel over every chunk (the keys of the prefix chosen so far; shared-memory counts added to
 * the vector's global histogram) and a pick kernel (a CTA per vector finds the bin that holds
 * the k-th largest key, narrows the prefix and clears the histogram), then a count kernel (keys
 * above and at the threshold per chunk) and a write kernel (each chunk's place in the output
 * from the counts of the chunks before it, then the in-order compaction of its keys). */
constexpr int SEL_CHUNK = 4096;
constexpr int SEL_NT = 256;
constexpr int SEL_ITEMS = SEL_CHUNK / SEL_NT;
constexpr int SEL_BINS = 2048;
constexpr int SEL_PICK_NT = 1024;

/* What vector v = 2 (b H + h) + which selects: k keys out of n, from vals. k <= 0: nothing (an
 * inactive head: not even the count); k >= n: everything. */
struct sel_task {
    const float *vals;
    int n, k, which, bh, forced_lo, forced_hi;
    bool active;
};

__device__ __forceinline__ sel_task sel_task_of(const vs_select_params &p, int v) {
    sel_task t;
    t.bh = v >> 1;
    t.which = v & 1; /* 0: vertical, 1: slash */
    const int b = t.bh / p.heads, h = t.bh % p.heads;
    t.active = p.active[h] != 0;
    int len = p.seq_lens[b];
    if (p.dense_below > 0 && len < p.dense_below) len = 0;
    t.n = len;
    if (t.which == 0)
        t.k = min(min(len, max(p.vertical_size[h], p.min_vertical)), p.max_vertical);
    else
        t.k = min(min(len, max(p.slash_size[h], p.min_slash)), p.max_slash);
    t.vals = (t.which ? p.slash : p.vert) + (int64_t)t.bh * p.len;
    t.forced_lo = t.which ? len - p.forced_diagonals : 0x7fffffff;
    t.forced_hi = t.which ? 0 : p.forced_columns;
    return t;
}

/* The order key of entry i: the sinks (vertical) and the local diagonals (slash) forced to the
 * top. */
__device__ __forceinline__ uint32_t sel_key(const sel_task &t, int i) {
    const uint32_t u = float_order_key(t.vals[i]); /* loaded either way: no branch per load */
    return i >= t.forced_lo || i < t.forced_hi ? 0xffffffffu : u;
}

/* Histogram of key bits [SHIFT, SHIFT + BITS) over one chunk, of the keys whose bits above
 * them equal the prefix chosen by the previous passes. */
template <int SHIFT, int BITS, bool MATCH>
__global__ void __launch_bounds__(SEL_NT)
    vs_select_hist_kernel(const __grid_constant__ vs_select_params p) {
    constexpr int NB = 1 << BITS;
    static_assert(NB <= SEL_BINS, "the global histogram holds every bin");
    __shared__ int hist[NB];
    const int v = blockIdx.y;
    const sel_task t = sel_task_of(p, v);
    const int c0 = blockIdx.x * SEL_CHUNK;
    if (!t.active || t.k <= 0 || t.k >= t.n || c0 >= t.n) return;
    uint32_t prefix = 0, mask = 0;
    if (SHIFT + BITS < 32) {
        prefix = p.state[4 * v];
        mask = p.state[4 * v + 1];
    }
    for (int i = threadIdx.x; i < NB; i += SEL_NT) hist[i] = 0;
    __syncthreads();
    /* every key loaded first (independent loads in flight), then counted */
    uint32_t u[SEL_ITEMS];
#pragma unroll
    for (int j = 0; j < SEL_ITEMS; ++j) {
        const int i = c0 + j * SEL_NT + threadIdx.x;
        u[j] = i < t.n ? sel_key(t, i) : 0u;
    }
#pragma unroll
    for (int j = 0; j < SEL_ITEMS; ++j) {
        const int i = c0 + j * SEL_NT + threadIdx.x;
        const int bin = i < t.n && (u[j] & mask) == prefix ? (int)((u[j] >> SHIFT) & (NB - 1)) : -1;
        if (MATCH) {
            /* the later passes count only the keys of one bin, which few warps hold, and
             * those share most bits: lanes of one bin add once (a plain atomic add per key
             * measured faster on the first pass, where the keys spread over more bins) */
            if (SHIFT + BITS < 32 && !__any_sync(0xffffffffu, bin >= 0)) continue;
            const unsigned same = __match_any_sync(0xffffffffu, bin);
            if (bin >= 0 && (threadIdx.x & 31) == __ffs(same) - 1)
                atomicAdd(&hist[bin], __popc(same));
        } else if (bin >= 0) {
            atomicAdd(&hist[bin], 1);
        }
    }
    __syncthreads();
    int *gh = p.hist + (int64_t)v * SEL_BINS;
    for (int i = threadIdx.x; i < NB; i += SEL_NT)
        if (hist[i]) atomicAdd(&gh[i], hist[i]);
}

/* A CTA per vector: the bin of the pass's histogram where the count from the top reaches the
 * rank left, which extends the prefix; the histogram is cleared for the next pass. */
template <int SHIFT, int BITS>
__global__ void __launch_bounds__(SEL_PICK_NT)
    vs_select_pick_kernel(const __grid_constant__ vs_select_params p) {
    constexpr int NB = 1 << BITS;
    static_assert(NB <= SEL_BINS, "the global histogram holds every bin");
    constexpr int PER = NB >= SEL_PICK_NT ? NB / SEL_PICK_NT : 1;
    __shared__ typename cub::BlockScan<int, SEL_PICK_NT>::TempStorage scan_tmp;
    __shared__ uint32_t chosen[3];
    const int v = blockIdx.x;
    const sel_task t = sel_task_of(p, v);
    if (!t.active || t.k <= 0 || t.k >= t.n) return;
    uint32_t *st = p.state + 4 * v;
    uint32_t prefix = 0, mask = 0;
    int kr = t.k;
    if (SHIFT + BITS < 32) {
        prefix = st[0];
        mask = st[1];
        kr = (int)st[2];
    }
    int *gh = p.hist + (int64_t)v * SEL_BINS;
    /* thread i owns bins NB - 1 - PER i .. NB - PER i, highest first */
    const int tid = threadIdx.x;
    int cnt[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int bin = NB - 1 - (PER * tid + j);
        cnt[j] = bin >= 0 ? gh[bin] : 0;
    }
    bin_reaching_k<SEL_PICK_NT>(cnt, kr, scan_tmp, [&](int j, int above, int c) {
        chosen[0] = (uint32_t)(NB - 1 - (PER * tid + j));
        chosen[1] = (uint32_t)above;
        chosen[2] = (uint32_t)c;
    });
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int bin = NB - 1 - (PER * tid + j);
        if (bin >= 0 && cnt[j]) gh[bin] = 0;
    }
    __syncthreads();
    if (tid == 0) {
        st[0] = prefix | (chosen[0] << SHIFT);
        st[1] = mask | ((uint32_t)(NB - 1) << SHIFT);
        st[2] = (uint32_t)(kr - (int)chosen[1]);
        st[3] = chosen[2];
    }
}

/* Two counts summed over the CTA, the totals returned to every thread. */
__device__ __forceinline__ int2 block_sum2(int a, int b, int (&scratch)[2][SEL_NT / 32]) {
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if ((threadIdx.x & 31) == 0) {
        scratch[0][threadIdx.x / 32] = a;
        scratch[1][threadIdx.x / 32] = b;
    }
    __syncthreads();
    int2 c = make_int2(0, 0);
    for (int w = 0; w < SEL_NT / 32; ++w) {
        c.x += scratch[0][w];
        c.y += scratch[1][w];
    }
    return c;
}

/* Per chunk: the keys above the threshold and equal to it. */
__global__ void __launch_bounds__(SEL_NT)
    vs_select_count_kernel(const __grid_constant__ vs_select_params p) {
    __shared__ int sums[2][SEL_NT / 32];
    const int v = blockIdx.y;
    const sel_task t = sel_task_of(p, v);
    const int c0 = blockIdx.x * SEL_CHUNK;
    if (!t.active || t.k <= 0 || t.k >= t.n || c0 >= t.n) return;
    const uint32_t thr = p.state[4 * v];
    uint32_t u[SEL_ITEMS];
#pragma unroll
    for (int j = 0; j < SEL_ITEMS; ++j) {
        const int i = c0 + j * SEL_NT + threadIdx.x;
        u[j] = i < t.n ? sel_key(t, i) : 0u;
    }
    int gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < SEL_ITEMS; ++j) {
        const bool in = c0 + j * SEL_NT + (int)threadIdx.x < t.n;
        gt += in && u[j] > thr;
        eq += in && u[j] == thr;
    }
    const int2 c = block_sum2(gt, eq, sums);
    if (threadIdx.x == 0) p.chunk_counts[(int64_t)v * p.nchunks + blockIdx.x] = c;
}

/* Each chunk's selected keys, in order, at their place in the vector's output: verticals
 * ascending, slash distances descending (index i = len - 1 - d ascending). Ties at the
 * threshold take the first keys (verticals) or the last (slash: with a budget below the forced
 * window the nearest diagonals survive). */
__global__ void __launch_bounds__(SEL_NT)
    vs_select_write_kernel(const __grid_constant__ vs_select_params p) {
    using scan_t = cub::BlockScan<int, SEL_NT>;
    __shared__ typename scan_t::TempStorage scan_tmp;
    __shared__ int before[2][SEL_NT / 32];
    const int v = blockIdx.y;
    const sel_task t = sel_task_of(p, v);
    if (!t.active) return;
    const int c0 = blockIdx.x * SEL_CHUNK;
    int32_t *count = t.which ? p.slash_count + t.bh : p.vertical_count + t.bh;
    if (t.k <= 0) {
        if (blockIdx.x == 0 && threadIdx.x == 0) *count = 0;
        return;
    }
    if (c0 >= t.n) return;
    const bool all = t.k >= t.n;
    uint32_t thr = 0;
    int take_eq = 0, eq_total = 0, eq_before = 0, sel_before = c0;
    if (!all) {
        const uint32_t *st = p.state + 4 * v;
        thr = st[0];
        take_eq = (int)st[2];
        eq_total = (int)st[3];
        /* what the chunks before this one hold */
        int gt = 0, eq = 0;
        const int2 *cc = p.chunk_counts + (int64_t)v * p.nchunks;
        for (int c = threadIdx.x; c < (int)blockIdx.x; c += SEL_NT) {
            const int2 x = cc[c];
            gt += x.x;
            eq += x.y;
        }
        const int2 c = block_sum2(gt, eq, before);
        eq_before = c.y;
        const int eq_taken =
            t.which ? max(0, eq_before - (eq_total - take_eq)) : min(eq_before, take_eq);
        sel_before = c.x + eq_taken;
    }
    const int end = min(c0 + SEL_CHUNK, t.n);
    auto key = [&](int i) { return sel_key(t, i); };
    if (t.which == 0) {
        int32_t *out = p.vertical_idx + (int64_t)t.bh * p.max_vertical;
        block_compact<SEL_NT, 8>(
            key, end, all, thr, take_eq, eq_total, false,
            [&](int pos, int rank) { out[rank] = pos; }, scan_tmp, c0, eq_before, sel_before);
    } else {
        int32_t *out = p.slash_idx + (int64_t)t.bh * p.max_slash;
        const int lm1 = t.n - 1;
        block_compact<SEL_NT, 8>(
            key, end, all, thr, take_eq, eq_total, true,
            [&](int pos, int rank) { out[rank] = lm1 - pos; }, scan_tmp, c0, eq_before, sel_before);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *count = t.k;
}

static cudaError_t launch_select(const vs_select_params &p, int vectors, cudaStream_t st) {
    cudaError_t e = cudaMemsetAsync(p.hist, 0, (size_t)vectors * SEL_BINS * sizeof(int), st);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)p.nchunks, (unsigned)vectors);
    vs_select_hist_kernel<21, 11, false><<<grid, SEL_NT, 0, st>>>(p);
    vs_select_pick_kernel<21, 11><<<vectors, SEL_PICK_NT, 0, st>>>(p);
    vs_select_hist_kernel<10, 11, true><<<grid, SEL_NT, 0, st>>>(p);
    vs_select_pick_kernel<10, 11><<<vectors, SEL_PICK_NT, 0, st>>>(p);
    vs_select_hist_kernel<0, 10, true><<<grid, SEL_NT, 0, st>>>(p);
    vs_select_pick_kernel<0, 10><<<vectors, SEL_PICK_NT, 0, st>>>(p);
    vs_select_count_kernel<<<grid, SEL_NT, 0, st>>>(p);
    vs_select_write_kernel<<<grid, SEL_NT, 0, st>>>(p);
    return cudaGetLastError();
}

/* The two score passes in order, each kernel allowed its shared memory first. */
template <typename K1, typename K2, typename... Args>
static cudaError_t launch_passes(K1 pass1, size_t smem1, K2 pass2, size_t smem2, dim3 grid,
                                 cudaStream_t st, const Args &...args) {
    cudaError_t e =
        cudaFuncSetAttribute(pass1, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem1);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(pass2, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem2);
    if (e != cudaSuccess) return e;
    pass1<<<grid, 128, smem1, st>>>(args...);
    pass2<<<grid, 128, smem2, st>>>(args...);
    return cudaGetLastError();
}

template <typename T, int D>
static cudaError_t launch_scores(const vs_params &p, int batch, const mi_tuning &t,
                                 cudaStream_t st) {
    const dim3 grid(p.heads, p.nchunks, batch);
    /* vs_wgmma = -1: the mma.sync score kernel on Hopper too (tests) */
    if (mi_cuda_sm90_on(t) && t.vs_wgmma >= 0) {
        /* the key tiles by TMA, unless vs_score_tma = -1 (then, or where the keys cannot be
         * mapped, by 16-byte copies) */
        vs_score_maps maps;
        memset(&maps, 0, sizeof maps);
        if (t.vs_score_tma >= 0)
            maps.on = encode_tma_map(&maps.k, p.k, p.k_stride, batch, p.heads / p.group, p.len, D,
                                     64, std::is_same<T, __nv_bfloat16>::value);
        return launch_passes(vs_scores_wg_kernel<T, D, 1>, vs_wg_smem_bytes<D, 1>(),
                             vs_scores_wg_kernel<T, D, 2>, vs_wg_smem_bytes<D, 2>(), grid, st, p,
                             maps);
    }
    const size_t smem =
        (size_t)3 * 64 * (D + 8) * sizeof(T) + (size_t)(64 * VS_P_PITCH + 64) * sizeof(float);
    return launch_passes(vs_scores_kernel<T, D, 1>, smem, vs_scores_kernel<T, D, 2>, smem, grid, st,
                         p);
}

} // namespace mi_cuda

using namespace mi_cuda;

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Scratch, in order: the column and diagonal sums [B H, len] each, the score pass's chunk
 * statistics, and the select's histograms, states and chunk counts (two vectors per (b, h)).
 * Each part starts 256-byte aligned; offsets[i] is where part i starts, offsets[6] the end. */
static void vs_scratch_offsets(int64_t bh, int64_t len, size_t offsets[7]) {
    const int64_t vectors = 2 * bh;
    const size_t parts[6] = {(size_t)bh * len * sizeof(float),
                             (size_t)bh * len * sizeof(float),
                             (size_t)bh * ((len + VS_CHUNK - 1) / VS_CHUNK) * VS_ROWS *
                                 sizeof(float2),
                             (size_t)vectors * SEL_BINS * sizeof(int),
                             (size_t)vectors * 4 * sizeof(uint32_t),
                             (size_t)vectors * ((len + SEL_CHUNK - 1) / SEL_CHUNK) * sizeof(int2)};
    offsets[0] = 0;
    for (int i = 0; i < 6; ++i) offsets[i + 1] = offsets[i] + align256(parts[i]);
}

extern "C" size_t mi_cuda_vs_scratch_bytes(int64_t batch, int64_t heads, int64_t len) {
    size_t off[7];
    vs_scratch_offsets(batch * heads, len, off);
    return off[6];
}

/* Passes 1 and 2 (the column and diagonal sums) over the active heads into the scratch's first
 * three parts; vert/slash: where the sums landed. */
static mi_status vs_sums(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                         const mi_tensor *k, const int32_t *seq_lens, float scale,
                         const uint8_t *active, int32_t dense_below, void *scratch, vs_params *pp) {
    mi_cuda_attn_params ap;
    mi_status st =
        mi_cuda_fill_attn_params(ctx, s, q, k, nullptr, nullptr, seq_lens, scale, nullptr, &ap);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t L = s->len, BH = s->batch * s->heads_q;
    vs_params &p = *pp;
    memset(&p, 0, sizeof(p));
    p.q = q->data;
    p.k = k->data;
    for (int i = 0; i < 3; ++i) {
        p.q_stride[i] = q->stride[i];
        p.k_stride[i] = k->stride[i];
    }
    p.heads = (int32_t)s->heads_q;
    p.group = (int32_t)s->group;
    p.len = (int32_t)L;
    p.q_off = (int32_t)s->q_off;
    p.nchunks = (int32_t)((L + VS_CHUNK - 1) / VS_CHUNK);
    p.scale_log2 = scale * MI_LOG2E;
    char *w = static_cast<char *>(scratch);
    size_t off[7];
    vs_scratch_offsets(BH, L, off);
    p.vert = reinterpret_cast<float *>(w + off[0]);
    p.slash = reinterpret_cast<float *>(w + off[1]);
    p.stats = reinterpret_cast<float2 *>(w + off[2]);
    p.dense_below = dense_below;
    memcpy(p.seq_lens, ap.seq_lens, sizeof(p.seq_lens));
    for (int64_t h = 0; h < s->heads_q; ++h) p.active[h] = active ? active[h] : 1;
    if (L <= 0 || BH <= 0) return MI_STATUS_SUCCESS;
    cudaStream_t stream = mi_stream(ctx);
    cudaError_t e = cudaMemsetAsync(p.slash, 0, (size_t)BH * L * sizeof(float), stream);
    if (e == cudaSuccess) {
        const bool bf = s->dtype == MI_DTYPE_BF16;
        if (s->head_dim == 64)
            e = bf ? launch_scores<__nv_bfloat16, 64>(p, (int)s->batch, ctx->tuning, stream)
                   : launch_scores<__half, 64>(p, (int)s->batch, ctx->tuning, stream);
        else
            e = bf ? launch_scores<__nv_bfloat16, 128>(p, (int)s->batch, ctx->tuning, stream)
                   : launch_scores<__half, 128>(p, (int)s->batch, ctx->tuning, stream);
    }
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA vs estimation: %s",
                       cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

extern "C" size_t mi_cuda_vs_sums_bytes(int64_t batch, int64_t heads, int64_t len) {
    size_t off[7];
    vs_scratch_offsets(batch * heads, len, off);
    return off[3];
}

extern "C" mi_status mi_cuda_vs_sums_run(mi_context *ctx, const mi_attn_shape *s,
                                         const mi_tensor *q, const mi_tensor *k,
                                         const int32_t *seq_lens, float scale,
                                         const uint8_t *active, int32_t dense_below, void *scratch,
                                         const float **vert, const float **slash) {
    vs_params p;
    const mi_status st = vs_sums(ctx, s, q, k, seq_lens, scale, active, dense_below, scratch, &p);
    *vert = p.vert;
    *slash = p.slash;
    return st;
}

extern "C" mi_status mi_cuda_vs_estimate_run(mi_context *ctx, const mi_attn_shape *s,
                                             const mi_tensor *q, const mi_tensor *k,
                                             const int32_t *seq_lens, const int32_t *vertical_size,
                                             const int32_t *slash_size, const mi_vs_params *vp,
                                             float scale, const uint8_t *active,
                                             int32_t dense_below, void *scratch,
                                             mi_vs_index *index) {
    if (index->batch != s->batch || index->heads != s->heads_q)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "vs index is [%d, %d], q is [%lld, %lld]",
                       index->batch, index->heads, (long long)s->batch, (long long)s->heads_q);
    if (vp->last_q != VS_ROWS)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "CUDA estimation uses last_q = 64, not %d",
                       vp->last_q);
    const int64_t L = s->len, BH = s->batch * s->heads_q;
    vs_params p;
    mi_status st = vs_sums(ctx, s, q, k, seq_lens, scale, active, dense_below, scratch, &p);
    if (st != MI_STATUS_SUCCESS || L <= 0 || BH <= 0) return st;
    cudaStream_t stream = mi_stream(ctx);
    char *w = static_cast<char *>(scratch);
    size_t off[7];
    vs_scratch_offsets(BH, L, off);
    cudaError_t e;

    vs_select_params sp;
    memset(&sp, 0, sizeof(sp));
    sp.vert = p.vert;
    sp.slash = p.slash;
    sp.heads = p.heads;
    sp.len = p.len;
    sp.nchunks = (int32_t)((L + SEL_CHUNK - 1) / SEL_CHUNK);
    sp.hist = reinterpret_cast<int *>(w + off[3]);
    sp.state = reinterpret_cast<uint32_t *>(w + off[4]);
    sp.chunk_counts = reinterpret_cast<int2 *>(w + off[5]);
    sp.forced_columns = vp->forced_columns;
    sp.forced_diagonals = vp->forced_diagonals;
    sp.min_vertical = vp->min_vertical;
    sp.min_slash = vp->min_slash;
    sp.max_vertical = index->max_vertical;
    sp.max_slash = index->max_slash;
    sp.vertical_count = index->vertical_count;
    sp.vertical_idx = index->vertical_idx;
    sp.slash_count = index->slash_count;
    sp.slash_idx = index->slash_idx;
    sp.dense_below = dense_below;
    memcpy(sp.seq_lens, p.seq_lens, sizeof(sp.seq_lens));
    memcpy(sp.active, p.active, sizeof(sp.active));
    for (int64_t h = 0; h < s->heads_q; ++h) {
        sp.vertical_size[h] = vertical_size[h];
        sp.slash_size[h] = slash_size[h];
    }
    e = launch_select(sp, (int)(2 * BH), stream);
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA vs selection: %s", cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}

extern "C" mi_status mi_cuda_vs_estimate(mi_context *ctx, const mi_attn_shape *s,
                                         const mi_tensor *q, const mi_tensor *k,
                                         const int32_t *seq_lens, const int32_t *vertical_size,
                                         const int32_t *slash_size, const mi_vs_params *params,
                                         float scale, mi_vs_index *index) {
    if (s->heads_q > MI_CUDA_MAX_HEADS || s->batch > MI_CUDA_MAX_BATCH)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "CUDA estimation: too many heads or batches");
    const size_t bytes = mi_cuda_vs_scratch_bytes(s->batch, s->heads_q, s->len);
    cudaStream_t stream = mi_stream(ctx);
    void *scratch = nullptr;
    cudaError_t e = cudaMallocAsync(&scratch, bytes, stream);
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "CUDA estimation scratch (%zu bytes): %s",
                       bytes, cudaGetErrorString(e));
    mi_status st = mi_cuda_vs_estimate_run(ctx, s, q, k, seq_lens, vertical_size, slash_size,
                                           params, scale, nullptr, 0, scratch, index);
    cudaFreeAsync(scratch, stream);
    return st;
}
