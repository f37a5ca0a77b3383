/*
 * rowmask_plan.cuh: how rowmask.cu lays out the dilated and strided rules (host and device code,
 * so that tests/cuda/test_rowmask_plan.cu checks it on the host, in CI, against the CPU rule
 * mi_cpu_rowmask_keys): a head's rule clamped to the length, the CTAs' rows, the three
 * arithmetic progressions of keys a CTA's rows may keep, their 64-key tiles, the per-row mask,
 * the tiles a warp may skip or leave unmasked, and the host's one- or two-pass choice.
 */
#ifndef MI_ROWMASK_PLAN_CUH
#define MI_ROWMASK_PLAN_CUH

#include "pattern_table.h"

#include <stdint.h>
#include <string.h>

namespace mi_cuda {

__host__ __device__ __forceinline__ int rm_min(int a, int b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int rm_max(int a, int b) { return a > b ? a : b; }

constexpr int RM_BM = 64;  /* rows of a tensor-core CTA: 4 warps of 16 */
constexpr int RM_BN = 64;  /* keys of a tile */
constexpr int RM_NT = 128; /* threads of a CTA */
constexpr int RM_NO_LIMIT = 0x7fffffff;

/* One head of a launch: its rule clamped to [0, L] (step >= 1) and its rows' layout. */
struct rm_head {
    int32_t h, dense_below;
    int32_t n_init, dense, span, step;
    int32_t rs;     /* a CTA's rows are rs apart (all of one residue mod rs) */
    int32_t groups; /* CTAs of one (b, h): rs residues times the row tiles of each */
    int32_t parts;  /* 1: the sinks and dense windows, 2: the dilated keys (rs a multiple of s) */
    int32_t fold;   /* a second pass: fold the first pass's rows (out, lse) into these */
};

/* Keys key0, key0 + step, ... (count of them); a row at position p keeps those at a distance
 * p - key in [dlo, dhi). */
struct rm_seg {
    int key0, step, count, dlo, dhi;
};

/* The keys that rows pmin .. pmax (a multiple of hd.step apart, or one row) may keep: sinks,
 * dense window hull, dilated hull. For a single row they are exactly its keys. */
__host__ __device__ __forceinline__ void rm_segments(const rm_head &hd, int pmin, int pmax,
                                                     rm_seg *sg) {
    sg[0] = {0, 1, rm_min(hd.n_init, pmax + 1), 0, RM_NO_LIMIT};
    const int lo = rm_max(hd.n_init, pmin - hd.dense + 1);
    sg[1] = {lo, 1, hd.dense > 0 ? rm_max(pmax - lo + 1, 0) : 0, 0, hd.dense};
    /* the rows' common residue: key = p - dense - j * step */
    const int hi = pmax - hd.dense, lo2 = rm_max(hd.n_init, pmin - hd.span + 1);
    const int n = hd.span > hd.dense && hi >= lo2 ? (hi - lo2) / hd.step + 1 : 0;
    sg[2] = {hi - (n > 0 ? n - 1 : 0) * hd.step, hd.step, n, hd.dense, hd.span};
}

__host__ __device__ __forceinline__ int rm_tiles(const rm_seg *sg) {
    return (sg[0].count + RM_BN - 1) / RM_BN + (sg[1].count + RM_BN - 1) / RM_BN +
           (sg[2].count + RM_BN - 1) / RM_BN;
}

/* Tile t of the three segments (constant indices only: the array stays in registers). */
__host__ __device__ __forceinline__ rm_seg rm_tile(const rm_seg *sg, int t) {
    const int t0 = (sg[0].count + RM_BN - 1) / RM_BN, t1 = (sg[1].count + RM_BN - 1) / RM_BN;
    rm_seg s = sg[0];
    if (t >= t0) {
        t -= t0;
        s = sg[1];
        if (t >= t1) {
            t -= t1;
            s = sg[2];
        }
    }
    s.key0 += t * RM_BN * s.step;
    s.count = rm_min(s.count - t * RM_BN, RM_BN);
    return s;
}

/* Position of the first row of CTA x (rows rows, rs apart): residue x % rs, the last row tiles
 * first (their rows keep the most keys). */
__host__ __device__ __forceinline__ int rm_first_row(int q_off, const rm_head &hd, int x,
                                                     int rows) {
    const int tiles = hd.groups / hd.rs;
    return q_off + x % hd.rs + (tiles - 1 - x / hd.rs) * rows * hd.rs;
}
/* Whether a row at distance d from a tile's first key keeps its key col. */
__host__ __device__ __forceinline__ bool rm_keeps(const rm_seg &ts, int col, int d_first) {
    const int d = d_first - col * ts.step;
    return col < ts.count && d >= ts.dlo && d < ts.dhi;
}

/* Whether some row of the positions wlo..whi (of one residue) keeps a key of tile ts, and
 * whether every one keeps every key of a full tile: the rows' distances span
 * [wlo - last key, whi - first key]. */
__host__ __device__ __forceinline__ bool rm_tile_any(const rm_seg &ts, int wlo, int whi) {
    const int kmax = ts.key0 + (ts.count - 1) * ts.step;
    return whi - ts.key0 >= ts.dlo && wlo - kmax < ts.dhi;
}
__host__ __device__ __forceinline__ bool rm_tile_full(const rm_seg &ts, int wlo, int whi) {
    const int kmax = ts.key0 + (ts.count - 1) * ts.step;
    return ts.count == RM_BN && wlo - kmax >= ts.dlo && whi - ts.key0 < ts.dhi;
}

/* Host side. */

/* The rule of plan hp on sequences of L keys, strided as dilated (no sinks, dense = step = the
 * period, span L), every length clamped to [0, L] so that no position arithmetic overflows. */
inline rm_head rm_head_of(const mi_head_plan &hp, int64_t h, int64_t L) {
    auto clamp = [L](int64_t x) { return (int32_t)(x < 0 ? 0 : x > L ? L : x); };
    rm_head hd;
    memset(&hd, 0, sizeof(hd));
    hd.h = (int32_t)h;
    hd.dense_below = hp.dense_below;
    const int32_t step = clamp(hp.stride > 1 ? hp.stride : 1);
    hd.step = step > 1 ? step : 1;
    if (hp.strided) {
        hd.n_init = 0;
        hd.dense = hd.step;
        hd.span = (int32_t)L;
    } else {
        hd.n_init = clamp(hp.n_init);
        hd.dense = clamp(hp.dense_local);
        hd.span = clamp(hp.n_local);
    }
    return hd;
}

/* CTAs of one (b, h) with rows rs apart, and 64-key tiles of a hull. */
inline int64_t rm_ctas(int64_t Lq, int64_t rs) {
    return rs * (((Lq + rs - 1) / rs + RM_BM - 1) / RM_BM);
}
inline int64_t rm_tiles_of(int64_t keys) { return (keys + RM_BN - 1) / RM_BN; }

/* Whether two passes walk fewer tiles than one (rows s apart): the dense windows' hull grows by
 * 63 s over rows s apart, by 63 over consecutive ones, the dilated keys' hull is the same in both
 * (a CTA's loads and stores counted as a tile, the fold's reads as another). */
inline bool rm_two_passes(const rm_head &hd, int64_t L, int64_t Lq) {
    const int64_t s = hd.step, dil = hd.span > hd.dense ? hd.span - hd.dense : 0;
    if (dil == 0 || s == 1 || hd.n_init + hd.dense == 0) return false;
    auto cap = [L](int64_t x) { return x < L ? x : L; };
    auto window = [&](int64_t rs) {
        return hd.dense > 0 ? rm_tiles_of(cap(hd.dense + (RM_BM - 1) * rs)) : 0;
    };
    const int64_t dilated = rm_tiles_of((cap(dil + (RM_BM - 1) * s) + s - 1) / s);
    const int64_t one = rm_ctas(Lq, s) * (1 + rm_tiles_of(hd.n_init) + window(s) + dilated);
    const int64_t two =
        rm_ctas(Lq, 1) * (1 + rm_tiles_of(hd.n_init) + window(1)) + rm_ctas(Lq, s) * (2 + dilated);
    return two < one;
}

} // namespace mi_cuda

#endif /* MI_ROWMASK_PLAN_CUH */
