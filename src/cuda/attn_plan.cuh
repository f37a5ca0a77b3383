/*
 * attn_plan.cuh: the tile list of one CTA of the attention kernels (sm_80 and sm_90a), so that
 * both walk exactly the same keys: phase A contiguous 64-key ranges (dense: 0, 64, ...; A-shape:
 * sinks then window; sparse: block_offset[]), phase B gathered columns 64 at a time.
 */
#ifndef MI_ATTN_PLAN_CUH
#define MI_ATTN_PLAN_CUH

#include "cuda_common.cuh"

namespace mi_cuda {

constexpr int BN = 64;

/* An A-/Tri-shape head's window as every kernel reads its mode for a sequence of len rows:
 * sinks [0, n_init), n_local keys up to each row, and every key from row tri_start on
 * (0x7fffffff: no such rows). */
struct a_shape_window {
    int n_init, n_local, tri_start;
};
__host__ __device__ __forceinline__ a_shape_window a_shape_window_of(const mi_cuda_head_mode &m,
                                                                     int len) {
    const int nl = min(max(m.n_last, 0), len - 1);
    return {max(m.n_init, 0), max(m.n_local, 0), nl > 0 ? len - nl : 0x7fffffff};
}
__host__ __device__ __forceinline__ bool operator==(const a_shape_window &x,
                                                    const a_shape_window &y) {
    return x.n_init == y.n_init && x.n_local == y.n_local && x.tri_start == y.tri_start;
}
/* Whether row `row` keeps key `key` under window w (causality aside): a sink, inside the row's
 * window, or a dense Tri-shape row. */
__host__ __device__ __forceinline__ bool window_keeps(const a_shape_window &w, int key, int row) {
    return row - key < w.n_local || key < w.n_init || row >= w.tri_start;
}

/* Dense, A-shape and Tri-shape tiles are all "sinks [0, sink_tiles) then a window from
 * win_start" (dense: every tile a sink), and the sparse ones come from `offsets`, so that the
 * kernels' per-tile steps need no branch on the mode. */
struct tile_plan {
    int mode;
    bool windowed;  /* A-/Tri-shape: keys outside sinks + window are masked */
    int n_a, n_b;   /* range tiles, column tiles */
    int sink_tiles; /* A-shape: tiles [0, sink_tiles) then window tiles from win_start */
    int win_start;
    const int32_t *offsets; /* sparse: block_offset row */
    const int32_t *cols;    /* sparse: column_index row */
    int n_cols;
    a_shape_window win; /* outside A-/Tri-shape: no sinks, an unbounded window */
};

__device__ __forceinline__ int tile_offset(const tile_plan &tp, int t) {
    if (tp.offsets) return __ldg(tp.offsets + t);
    return (t < tp.sink_tiles ? t : tp.win_start + t - tp.sink_tiles) * BN;
}

/* Key position of row r of tile t, or MI_NO_KEY when it does not exist. */
__device__ __forceinline__ int tile_key(const tile_plan &tp, int t, int r, int len) {
    int pos;
    if (t < tp.n_a) {
        pos = tile_offset(tp, t) + r;
    } else {
        const int c = (t - tp.n_a) * BN + r;
        pos = c < tp.n_cols ? __ldg(tp.cols + c) : -1;
    }
    return (pos >= 0 && pos < len) ? pos : MI_NO_KEY;
}

/* Whether query row `row` sees key `key` (MI_NO_KEY is never seen): causal, plus the A-shape /
 * Tri-shape window. The sparse modes need no test beyond causality: their tiles hold only the
 * keys of the index. */
__device__ __forceinline__ bool key_visible(const tile_plan &tp, int key, int row) {
    return key <= row && window_keeps(tp.win, key, row);
}

/* A 64-key range tile starting at off that every row of first_row .. last_row sees entirely: inside
 * the sequence, at or left of the diagonal and, for A-/Tri-shape, all sinks, all inside the last
 * row's window, or all rows dense (Tri-shape): its scores need no mask. With a window only the
 * tiles at its two ends need one. */
__device__ __forceinline__ bool range_tile_unmasked(const tile_plan &tp, int off, int first_row,
                                                    int last_row, int len) {
    return off >= 0 && off + BN - 1 < len && off + BN - 1 <= first_row &&
           (!tp.windowed || off + BN - 1 < tp.win.n_init || last_row - off < tp.win.n_local ||
            first_row >= tp.win.tri_start);
}

/* The 64-key tiles that rows [rs, re) (re > rs, re <= len) see under window w: sink tiles
 * [0, sink_tiles), then window tiles from win_start, n in all; every tile up to the diagonal
 * where a row sees every key. */
struct a_shape_tiles {
    int sink_tiles, win_start, n;
};
__device__ __forceinline__ a_shape_tiles a_shape_tiles_of(const a_shape_window &w, int rs, int re,
                                                          int len) {
    const int last_tile = (re - 1) / BN;
    if (re - 1 >= w.tri_start) return {last_tile + 1, last_tile + 1, last_tile + 1};
    a_shape_tiles t;
    t.sink_tiles = min((min(w.n_init, len) + BN - 1) / BN, last_tile + 1);
    t.win_start = t.sink_tiles;
    int n_win = 0;
    if (w.n_local > 0) {
        t.win_start = max(t.sink_tiles, max(0, rs - w.n_local + 1) / BN);
        n_win = max(0, last_tile - t.win_start + 1);
    }
    t.n = t.sink_tiles + n_win;
    return t;
}

/* Rows [rs, rs + rows) that see no key: output 0, LSE -inf (lseg may be NULL). */
template <typename T>
__device__ __forceinline__ void write_empty_rows(T *og, int64_t o_row_stride, float *lseg, int rs,
                                                 int rows, int head_dim, int tid, int nthreads) {
    const int cpr = head_dim / 8;
    for (int i = tid; i < rows * cpr; i += nthreads) {
        const int r = i / cpr, c = i % cpr;
        *reinterpret_cast<uint4 *>(og + (int64_t)(rs + r) * o_row_stride + c * 8) =
            make_uint4(0, 0, 0, 0);
    }
    if (lseg)
        for (int r = tid; r < rows; r += nthreads) lseg[rs + r] = -INFINITY;
}

/* Plans the keys of query rows [rs, rs + BM) of (b, h); false when this launch skips the head. */
__device__ __forceinline__ bool plan_tiles(const mi_cuda_attn_params &p, int h, int bh, int m_blk,
                                           int rs, int BM, int len, tile_plan &tp) {
    const mi_cuda_head_mode hm = head_mode_of(p, h);
    tp.mode = hm.mode;
    tp.windowed = false;
    tp.n_a = tp.n_b = 0;
    tp.n_cols = 0;
    tp.sink_tiles = tp.win_start = 0;
    tp.offsets = tp.cols = nullptr;
    tp.win = {0, 0x7fffffff, 0x7fffffff};
    const int re = min(rs + BM, len); /* exclusive end of the real rows */
    /* NONE: rows another kernel writes (or already wrote), unless the length runs them dense */
    if (hm.dense_below > 0 && len < hm.dense_below) tp.mode = MI_CUDA_MODE_DENSE;
    if (tp.mode == MI_CUDA_MODE_NONE) return false;
    if (rs < len) {
        if (tp.mode == MI_CUDA_MODE_DENSE) {
            tp.n_a = (re - 1) / BN + 1;
            tp.sink_tiles = tp.n_a;
        } else if (tp.mode == MI_CUDA_MODE_A_SHAPE) {
            const a_shape_window w = a_shape_window_of(hm, len);
            tp.windowed = true;
            tp.win = w;
            const a_shape_tiles at = a_shape_tiles_of(w, rs, re, len);
            tp.sink_tiles = at.sink_tiles;
            tp.win_start = at.win_start;
            tp.n_a = at.n;
        } else { /* sparse: BM == 64, one index row block */
            const int64_t row = (int64_t)bh * p.row_blocks + m_blk;
            tp.n_a = min(max(p.block_count[row], 0), p.max_blocks);
            tp.offsets = p.block_offset + row * p.max_blocks;
            tp.n_cols = min(max(p.column_count[row], 0), p.max_columns);
            tp.cols = p.column_index + row * p.max_columns;
            tp.n_b = (tp.n_cols + BN - 1) / BN;
        }
    }
    return true;
}

/* The dense last rows of Tri-shape heads, split over their keys (tri_split_plan.cuh):
 * chunk (c, j, z) is row block tri_start / 64 + j of (b, h) = (z / n_tri, tri_head[z % n_tri])
 * over its key tiles [c * chunk_tiles, (c + 1) * chunk_tiles), unnormalised, in item
 * (z * max_rb + j) * max_chunks + c of o_part and ml_part; tri_merge_kernel then combines the
 * chunks of each row. The sm_80 kernel computes a chunk a CTA; the Hopper one (attn_dense_sm90.cu)
 * the chunks c of row blocks 2i and 2i + 1 together, which needs chunk_tiles even. */
struct tri_split_args {
    float *o_part;   /* [items][64][D] */
    float2 *ml_part; /* [items][64]: the row's running max (scaled, base 2) and sum */
    int chunk_tiles, max_rb, max_chunks, n_tri;
    int16_t tri_head[MI_CUDA_MAX_HEADS]; /* the heads with Tri-shape rows */
};

/* The first Tri-shape row of (b, h) = (z / n_tri, tri_head[z % n_tri]) and the sequence's length;
 * false where that sequence has no such rows (shorter than the head's last rows, or run dense by
 * dense_below). */
__device__ __forceinline__ bool tri_rows_of(const mi_cuda_attn_params &p, const tri_split_args &sa,
                                            int z, int &b, int &h, int &len, int &tri) {
    b = z / sa.n_tri;
    h = sa.tri_head[z % sa.n_tri];
    len = p.seq_lens[b];
    const mi_cuda_head_mode hm = head_mode_of(p, h);
    if (hm.dense_below > 0 && len < hm.dense_below) return false;
    tri = a_shape_window_of(hm, len).tri_start;
    return tri < len;
}

/* The Hopper chunk kernel (attn_dense_sm90.cu) for sa and its grid's third dimension z, for a plan
 * made for it (tri_split_knobs::pairs: a usable sm_90a device, chunk_tiles even); *used = false
 * (and cudaSuccess) where it does not apply: a sequence shorter than the launch, or tensors TMA
 * cannot address. */
cudaError_t tri_split_sm90_launch(const mi_cuda_attn_params &p, const tri_split_args &sa, int64_t z,
                                  cudaStream_t st, bool *used);

} // namespace mi_cuda

#endif /* MI_ATTN_PLAN_CUH */
