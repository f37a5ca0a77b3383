/*
 * sparse_sm90_layout.cuh: what the parts of the warp-specialised sparse kernel
 * (attn_sparse_sm90.cu) share: its arguments, the shared-memory layout (Q of two work items, a
 * ring of SP_STAGES K and V tiles with a header each, the barriers, staged index lists, two
 * range plans) and the work items (a pair of adjacent 64-row blocks of one (b, h)).
 */
#ifndef MI_SPARSE_SM90_LAYOUT_CUH
#define MI_SPARSE_SM90_LAYOUT_CUH

#include "sm90_common.cuh"

namespace mi_cuda {

struct sparse_sm90_args {
    /* Q, K and V for boxes of 128 rows (Q, a range tile whose two ranges are adjacent: one
     * load per 64 columns) and K and V for boxes of 64 rows (one per range) */
    CUtensorMap tm_q, tm_k2, tm_v2, tm_k, tm_v;
    const void *k, *v; /* gathered columns */
    int64_t k_stride[3], v_stride[3];
    void *o;
    float *lse; /* [B, H, len] or NULL */
    int64_t o_stride[3];
    const int32_t *block_count, *block_offset, *column_count, *column_index;
    int row_blocks, max_blocks, max_columns;
    int heads, group, len;
    float scale_log2;
    int pairs;               /* row-block pairs per (b, h) */
    int max_items;           /* pairs x B x H */
    const int32_t *ws_heads; /* {n, bh...}: the (b, h) this kernel runs, n x pairs work items;
                              * WS_A_SHAPE marks an A-shape head */
    a_shape_window a_win;    /* that of the A-/Tri-shape heads routed here */
    /* The columns of each (b, h)'s last row block, copied (K and V rows in list order) by
     * sparse_route_kernel, for row blocks whose lists are a prefix of that one (see the column
     * tiles of the producer): tm_kc / tm_vc as (d, position, b * heads + h, 1), boxes of 128
     * positions; col_rows[bh] positions hold copies, -1 where none were made; crows = 0: none. */
    CUtensorMap tm_kc, tm_vc;
    const int32_t *col_rows;
    int crows;
    int plan_tiles; /* range tiles planned ahead per item, at most (SP_PLAN; fewer to test) */
    /* O for boxes of 64 rows, and whether the output rows go through it (staged in the item's Q
     * buffer, stored by TMA) rather than by each thread's global stores */
    CUtensorMap tm_o;
    int o_tma;
};

constexpr int SP_STAGES = 2;
constexpr int SP_HALF = 128 * 128;   /* one 64-column half of a 128-row tile, bytes */
constexpr int SP_TILE = 2 * SP_HALF; /* 128 x 128 */

/* What the producer says about the tile in a slot (written before the slot's K barrier
 * completes; read by the consumers until they free the K slot). */
struct tile_header {
    int off[2];   /* range tiles: start of each 64-key half */
    int users[2]; /* per half: bit 0 = row block A, bit 1 = B; 0 = nobody (gathered: any key) */
    int column;   /* gathered tile: keys in kpos, their users in kusers */
    int last;     /* the item's last tile (or, for an item without keys, a marker: no data) */
    /* a column tile read from the copies: positions [0, nuse[i]) hold row block i's keys (A
     * i = 0, B 1), none of them after kmax[i]; -1: the keys and users are in kpos / kusers */
    int nuse[2], kmax[2];
    int pad[2];
    int kpos[128];       /* gathered tile: key of each row, MI_NO_KEY where none */
    uint8_t kusers[128]; /* and the row blocks that use it */
};

/* A list entry of ws_heads for an A-shape head: its ranges are its sinks and window, generated
 * instead of read from the index (see ashape_starts), and it has no columns */
[[maybe_unused]] constexpr int WS_A_SHAPE = 1 << 30; /* (device code only) */

/* range starts of A and B staged in shared memory for the producer's merge, then their columns */
constexpr int SP_STAGED = 1024, SP_CSTAGED = 2048;

/* An item's range tiles, planned while the item before it runs (see the producer). */
constexpr int SP_PLAN = 448; /* tiles; an item with more is planned as it goes */
enum { PLAN_NONE = 0, PLAN_READY = 1, PLAN_INLINE = 2 };
struct range_plan {
    int state;              /* PLAN_NONE: not planned yet; PLAN_INLINE: too long, merge inline */
    int tiles;              /* PLAN_READY: tiles in off / users */
    int count[4];           /* the item's range and column counts: A, B, A, B (clamped) */
    int2 off[SP_PLAN];      /* start of each 64-key half */
    uint8_t users[SP_PLAN]; /* users of half 0 | users of half 1 << 2 */
};

constexpr size_t SP_SMEM =
    1024 + (2 + 2 * SP_STAGES) * SP_TILE + SP_STAGES * sizeof(tile_header) + 16 * sizeof(uint64_t) +
    (2 * SP_STAGED + 2 * SP_CSTAGED + 8) * sizeof(int32_t) + 2 * sizeof(range_plan);
static_assert(SP_SMEM <= 227 * 1024, "more shared memory than an H100/H200 CTA may have");

#ifdef MI_SM90_DEVICE
/* The kernel's shared memory, carved from the dynamic allocation (SP_SMEM bytes). */
struct sparse_smem {
    /* Q of two work items (the next one's loads while the consumers finish this one) */
    unsigned char *qs, *ks, *vs;
    tile_header *hdr;
    uint64_t *q_full, *q_empty, *k_full, *v_full, *k_empty, *v_empty;
    int32_t *staged;   /* [2][SP_STAGED] range starts, then [2][SP_CSTAGED] columns, then 8 words */
    range_plan *plans; /* by item parity */
};

__device__ __forceinline__ sparse_smem sparse_smem_of(unsigned char *smem_raw) {
    sparse_smem m;
    unsigned char *base = smem_base_1024(smem_raw);
    m.qs = base;
    m.ks = m.qs + 2 * SP_TILE;
    m.vs = m.ks + SP_STAGES * SP_TILE;
    m.hdr = reinterpret_cast<tile_header *>(m.vs + SP_STAGES * SP_TILE);
    uint64_t *bars = reinterpret_cast<uint64_t *>(m.hdr + SP_STAGES);
    m.q_full = bars;
    m.q_empty = bars + 2;
    m.k_full = bars + 4;
    m.v_full = m.k_full + SP_STAGES;
    m.k_empty = m.v_full + SP_STAGES;
    m.v_empty = m.k_empty + SP_STAGES;
    m.staged = reinterpret_cast<int32_t *>(bars + 16);
    /* after the column lists (8-byte aligned: an even count of words before) */
    m.plans = reinterpret_cast<range_plan *>(m.staged + 2 * SP_STAGED + 2 * SP_CSTAGED + 8);
    return m;
}

/* Work item w: the pair of row blocks 2 pair, 2 pair + 1 of the list's (b, h), the last pairs
 * (the most keys, causally) first; each CTA takes items blockIdx.x, + gridDim.x, ... */
struct sparse_item {
    int pair, bh, b, h, hk, rs;
    int64_t row_a;
    bool has_b, ashape;
};

__device__ __forceinline__ sparse_item sparse_item_of(const sparse_sm90_args &a, int w) {
    sparse_item it;
    it.pair = a.pairs - 1 - w % a.pairs;
    const int entry = __ldg(a.ws_heads + 1 + w / a.pairs);
    it.ashape = (entry & WS_A_SHAPE) != 0;
    it.bh = entry & ~WS_A_SHAPE;
    it.b = it.bh / a.heads;
    it.h = it.bh % a.heads;
    it.hk = it.h / a.group;
    it.rs = it.pair * 128;
    it.row_a = (int64_t)it.bh * a.row_blocks + 2 * it.pair;
    it.has_b = 2 * it.pair + 1 < a.row_blocks;
    return it;
}
#endif

} // namespace mi_cuda

#endif
