/*
 * minference_kv.h: the paged KV cache (C11, CPU storage).
 *
 * A pool owns fixed-size pages; a sequence (the KV part of a session) is one page table per layer
 * into its pool. One page holds page_tokens consecutive rows of one layer for every KV head, K and
 * V, head-major inside the page, so that each (head, page) is a contiguous [page_tokens, head_dim]
 * tile, the unit a sparse kernel loads (see mi_kv_page_layout). Pages are reference-counted:
 * mi_kv_seq_fork shares a prefix without copying it, and the first append into a shared, partly
 * filled page copies that page (copy-on-write). The design, the file format byte by byte and how
 * the model and the KV methods use it: docs/kv-cache.md.
 *
 * Conventions (as in minference.h)
 *  - Every function returns mi_status unless it is a pure query. On error nothing is changed:
 *    a failed append, truncate or load leaves the sequence exactly as it was, and the pool holds
 *    a message: mi_kv_pool_last_error().
 *  - Out of capacity (the pool's limit) and out of host memory are MI_STATUS_OUT_OF_MEMORY.
 *  - Handles are opaque; destroy(NULL) is a no-op. A sequence keeps its pool alive: the pool's
 *    memory goes when the pool and all its sequences are destroyed, in any order.
 *  - Thread safety: a pool and all its sequences are used by one thread at a time.
 *  - Storage is host memory (malloc, or the caller's allocator, e.g. pinned memory).
 */
#ifndef MINFERENCE_KV_H
#define MINFERENCE_KV_H

#include "minference.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Storage dtypes and the page layout                                                          */

/* The element format of the pages. The first three equal the mi_dtype values. */
typedef enum mi_kv_dtype {
    MI_KV_F32 = 0,
    MI_KV_F16 = 1,
    MI_KV_BF16 = 2,
    /* OCP fp8 e4m3 (max 448, no infinities) times a float scale per (page, head, K or V):
     * x = e4m3 * scale, scale = the smallest power of two >= max |x| / 448 over the rows written
     * so far (0 while they are all zero). Error bound per element: |x' - x| <= 2^-4 |x| +
     * 2^-9 scale (2^-10 scale for one rounding; growing a power-of-two scale re-rounds only the
     * values that become subnormal, by at most 2^-10 of each new scale). */
    MI_KV_FP8_E4M3 = 3,
    /* KIVI: 2- or 4-bit asymmetric codes with f16 scales and minima in groups (K per channel
     * over group_size tokens, V per token over group_size channels); the newest rows stay in f32
     * (the residual). See "KIVI quantized pages" at the end of this header. */
    MI_KV_KIVI2 = 4,
    MI_KV_KIVI4 = 5,
} mi_kv_dtype;

MI_API const char *mi_kv_dtype_name(mi_kv_dtype dtype);

/* fp8 e4m3 conversions: round to nearest even, saturating at +-448; NaN stays NaN. */
MI_API uint8_t mi_fp8_e4m3_from_f32(float x);
MI_API float mi_fp8_e4m3_to_f32(uint8_t x);

/* Metadata kinds a pool may keep per page, beside the rows (the row layout never changes). */
#define MI_KV_META_KEY_MINMAX 1u /* per head and channel: min and max of the keys (Quest) */

/*
 * Where everything is inside one page: byte offsets from the page's base. Code that reads pages
 * (kernels, the file writer) addresses rows through this descriptor only, so that other storage
 * formats (quantized KIVI pages) change the descriptor, not the readers.
 *   K of head h, row r: base + k_offset + h * head_stride + r * row_stride
 *   V of head h, row r: base + v_offset + h * head_stride + r * row_stride
 *   fp8 scales (float): base + scale_offset: [2][n_kv_heads] (K then V); scale_offset is 0 and
 *   has_scales 0 for the other dtypes.
 * Metadata lives beside the page, not in it (mi_kv_page_view.key_minmax).
 */
typedef struct mi_kv_page_layout {
    mi_kv_dtype dtype;
    int32_t page_tokens, n_kv_heads, head_dim;
    int32_t elem_bytes; /* bytes per element */
    int32_t has_scales; /* 1: fp8 scales at scale_offset, centres at center_offset */
    size_t row_stride;  /* bytes between rows of one head (head_dim * elem_bytes) */
    size_t head_stride; /* bytes between heads (page_tokens * row_stride) */
    size_t k_offset, v_offset, scale_offset;
    /* fp8: bf16 centres [2 (K, V)][n_kv_heads][head_dim] at center_offset; element d of a row
     * of head h is center[kv][h][d] + e4m3(code) * scale[kv][h] */
    size_t center_offset;
    size_t page_bytes;   /* bytes of one page, a multiple of 256 */
    uint32_t meta_kinds; /* MI_KV_META_* kept by the pool */
    size_t meta_bytes;   /* metadata bytes per page (beside it) */
    /* KIVI (bits 2 or 4, else 0): codes are packed little-endian inside each row (channel d at
     * bit d * bits of the row); row_stride = head_dim * bits / 8. The f16 (scale, min) pairs:
     *   K of head h, token group g (rows g*group_size..), channel d:
     *       base + k_param_offset + ((h * page_tokens / group_size + g) * head_dim + d) * 4
     *   V of head h, row r, channel group c:
     *       base + v_param_offset + ((h * page_tokens + r) * (head_dim / group_size) + c) * 4
     * x = code * scale + min. */
    int32_t bits, group_size;
    size_t k_param_offset, v_param_offset;
} mi_kv_page_layout;

/* ------------------------------------------------------------------------------------------ */
/* Pool                                                                                        */

/* Host memory for pages (e.g. cudaHostAlloc for offload). alloc returns NULL when out of memory;
 * bytes is a multiple of 256 and the result must be 256-byte aligned. */
typedef void *(*mi_kv_alloc_fn)(void *user, size_t bytes);
typedef void (*mi_kv_free_fn)(void *user, void *ptr, size_t bytes);

typedef struct mi_kv_pool_params {
    int32_t n_layers, n_kv_heads, head_dim; /* the model's; head_dim 1..1024 */
    mi_kv_dtype dtype;                      /* storage dtype; default MI_KV_F32 */
    int32_t page_tokens;                    /* rows per page, 1..32768; default 64 */
    /* Capacity: a pool never holds more pages than either limit allows; 0: no limit.
     * capacity_tokens counts tokens of every layer (ceil(tokens / page_tokens) * n_layers pages);
     * capacity_bytes counts pages and their metadata. */
    int64_t capacity_tokens;
    uint64_t capacity_bytes;
    uint32_t meta_kinds;  /* MI_KV_META_* bits; default 0 */
    int32_t slab_pages;   /* pages per host allocation; <= 0: about 4 MiB worth */
    mi_kv_alloc_fn alloc; /* NULL: aligned_alloc / free */
    mi_kv_free_fn free;
    void *alloc_user;
    /* KIVI dtypes only (0: the defaults): tokens per key group and channels per value group
     * (default 32; divides page_tokens and head_dim, a multiple of 4), and the rows kept in f32
     * (default 32; the residual holds residual_length..residual_length + group_size - 1 rows). */
    int32_t quant_group, quant_residual;
} mi_kv_pool_params;

typedef struct mi_kv_pool mi_kv_pool;

MI_API mi_kv_pool_params mi_kv_pool_default_params(void);
/* Creates an empty pool (pages are allocated on demand, in slabs). ctx (may be NULL) receives
 * the message when creation fails (mi_context_last_error); later calls on the pool and its
 * sequences report to mi_kv_pool_last_error. */
MI_API mi_status mi_kv_pool_create(mi_context *ctx, const mi_kv_pool_params *params,
                                   mi_kv_pool **out);
/* Drops the caller's reference; the memory goes with the last sequence. */
MI_API void mi_kv_pool_destroy(mi_kv_pool *pool);
/* The message of the last failed call on the pool or one of its sequences ("" if none). */
MI_API const char *mi_kv_pool_last_error(const mi_kv_pool *pool);
MI_API mi_status mi_kv_pool_layout(const mi_kv_pool *pool, mi_kv_page_layout *out);

typedef struct mi_kv_pool_stats {
    int64_t capacity_pages;   /* -1: no limit */
    int64_t allocated_pages;  /* pages backed by memory (used + free) */
    int64_t used_pages;       /* referenced by at least one sequence */
    int64_t shared_pages;     /* referenced by more than one */
    uint64_t page_bytes;      /* one page with its metadata */
    uint64_t allocated_bytes; /* allocated_pages * page_bytes */
    uint64_t used_bytes;      /* used_pages * page_bytes */
    int32_t live_sequences;
} mi_kv_pool_stats;

MI_API mi_status mi_kv_pool_stats_get(const mi_kv_pool *pool, mi_kv_pool_stats *out);
/* The base address of a page (see mi_kv_page_layout), NULL for an id that is not in use. */
MI_API const void *mi_kv_pool_page_data(const mi_kv_pool *pool, int32_t page_id);

/* ------------------------------------------------------------------------------------------ */
/* Sequence                                                                                    */

typedef struct mi_kv_seq mi_kv_seq;

#define MI_KV_ALL_LAYERS (-1)

/* An empty sequence: every layer has 0 rows. */
MI_API mi_status mi_kv_seq_create(mi_kv_pool *pool, mi_kv_seq **out);
/* Releases the sequence's pages (freed when no other sequence shares them). */
MI_API void mi_kv_seq_destroy(mi_kv_seq *seq);
MI_API mi_kv_pool *mi_kv_seq_pool(const mi_kv_seq *seq);

/* A new sequence with the parent's rows, sharing its pages (no copy). Either may then append,
 * truncate or be destroyed independently: the other never sees it. */
MI_API mi_status mi_kv_seq_fork(const mi_kv_seq *parent, mi_kv_seq **out);

/* Appends a chunk of n >= 1 rows to one layer. k, v: [1, n_kv_heads, n, head_dim] on the CPU,
 * f32, f16 or bf16, any strides with the last dimension contiguous (both the model's
 * [B, L, H, D] rows and [B, H, L, D] work). Converts to the storage dtype; keeps the metadata.
 * MI_STATUS_OUT_OF_MEMORY when the pool's capacity or host memory runs out: nothing appended. */
MI_API mi_status mi_kv_seq_append(mi_kv_seq *seq, int32_t layer, const mi_tensor *k,
                                  const mi_tensor *v);

/* Copies rows start..start+count-1 of one layer out of the pages. k_out, v_out:
 * [1, n_kv_heads, count, head_dim] on the CPU, f32, f16 or bf16; either may be NULL. */
MI_API mi_status mi_kv_seq_read(const mi_kv_seq *seq, int32_t layer, int64_t start, int64_t count,
                                mi_tensor *k_out, mi_tensor *v_out);

/* Keeps the first len rows of one layer (or of every layer: MI_KV_ALL_LAYERS); len may not
 * exceed a layer's length. Pages past the end are released. Never allocates. */
MI_API mi_status mi_kv_seq_truncate(mi_kv_seq *seq, int32_t layer, int64_t len);
/* Drops the last n rows of every layer (n <= the shortest layer's length). */
MI_API mi_status mi_kv_seq_rewind(mi_kv_seq *seq, int64_t n);

/* Keeps, per KV head, a subset of one layer's rows: afterwards row i of head h holds what was
 * row keep[h * count + i] (keep: [n_kv_heads][count], each head's rows strictly ascending and
 * inside the layer; heads may keep different rows) and the layer has count rows. Pages up to the
 * first moved row are kept; later rows go to fresh pages (shared pages are never written), so
 * the rewritten part briefly needs its pages twice. All or nothing: MI_STATUS_OUT_OF_MEMORY
 * leaves the sequence unchanged. Used by the KV methods that evict or select tokens. */
MI_API mi_status mi_kv_seq_compact(mi_kv_seq *seq, int32_t layer, int64_t count,
                                   const int64_t *keep);

/* Rows of one layer; -1 for a NULL sequence or a layer out of range. */
MI_API int64_t mi_kv_seq_length(const mi_kv_seq *seq, int32_t layer);
/* The longest layer's rows (the sequence's token count once every layer has its chunk). */
MI_API int64_t mi_kv_seq_tokens(const mi_kv_seq *seq);

/* Zero-copy access for kernels: the layer's page ids (row r is in page ids[r / page_tokens], at
 * row r % page_tokens), valid until the sequence next changes. */
MI_API mi_status mi_kv_seq_page_table(const mi_kv_seq *seq, int32_t layer, const int32_t **ids,
                                      int64_t *n_pages);

typedef struct mi_kv_page_view {
    const void *data; /* the page's base (mi_kv_page_layout); read-only */
    int32_t page_id;
    int32_t rows; /* this sequence's rows in the page */
    /* rows the metadata covers: rows, or more where this sequence truncated into a page it
     * shared with a longer one (a looser bound, still valid for its rows) */
    int32_t meta_rows;
    int32_t refcount;         /* sequences sharing the page */
    int64_t first_row;        /* the layer row of the page's row 0 */
    const float *k_scale;     /* fp8: [n_kv_heads] per-head scales of K; NULL otherwise */
    const float *v_scale;     /* fp8: [n_kv_heads] per-head scales of V; NULL otherwise */
    const uint16_t *k_center; /* fp8: bf16 [n_kv_heads][head_dim] added to K after scaling */
    const uint16_t *v_center; /* fp8: the same for V (both NULL otherwise) */
    /* MI_KV_META_KEY_MINMAX: [n_kv_heads][2][head_dim] (min then max per head, over the stored,
     * dequantized keys of rows 0..meta_rows-1); NULL when the pool keeps none */
    const float *key_minmax;
    /* Changes when the page is taken from the free list and whenever rows the page held may be
     * written over (a truncation inside it, fp8 rows re-encoded under a larger scale); other
     * appends leave it. So a copy of the page's first R rows made at version V (a device
     * mirror) is still exact while the version is V. */
    uint64_t version;
} mi_kv_page_view;

/* Page index (0..n_pages-1) of one layer. */
MI_API mi_status mi_kv_seq_page(const mi_kv_seq *seq, int32_t layer, int64_t index,
                                mi_kv_page_view *out);

typedef struct mi_kv_seq_stats {
    int64_t tokens;        /* mi_kv_seq_tokens */
    int64_t pages;         /* page table entries over all layers */
    int64_t shared_pages;  /* of them, pages another sequence also references */
    uint64_t bytes;        /* pages * page bytes (with metadata) */
    uint64_t shared_bytes; /* shared_pages * page bytes; bytes - shared_bytes are its own */
} mi_kv_seq_stats;

MI_API mi_status mi_kv_seq_stats_get(const mi_kv_seq *seq, mi_kv_seq_stats *out);

/* ------------------------------------------------------------------------------------------ */
/* Session files                                                                               */

/* The model a cache belongs to, supplied by the caller; a file loads only into the same. */
typedef struct mi_kv_model_id {
    char arch[32]; /* e.g. "llama"; NUL-terminated */
    int32_t n_layers, n_heads, n_kv_heads, head_dim, hidden, vocab;
    uint64_t weights_hash; /* e.g. mi_kv_hash64 over the weights' names, shapes and types */
} mi_kv_model_id;

/* 64-bit FNV-1a of n bytes, chained through seed (start with 0). */
MI_API uint64_t mi_kv_hash64(uint64_t seed, const void *data, size_t n);

/* Writes the sequence to path atomically (a temporary file in the same folder, synced, then
 * renamed): the file is either complete or absent. id's shapes must match the pool's.
 * MI_STATUS_IO_ERROR with the system's reason on failure. */
MI_API mi_status mi_kv_seq_save(const mi_kv_seq *seq, const char *path, const mi_kv_model_id *id);

/* Replaces seq's contents with the file's (read into new pages of seq's pool, then swapped in).
 * On any error seq is unchanged:
 *   MI_STATUS_IO_ERROR       the file cannot be opened or read;
 *   MI_STATUS_PARSE_ERROR    not a session file, truncated, or the checksum fails (corrupt);
 *   MI_STATUS_UNSUPPORTED    a newer format version;
 *   MI_STATUS_INVALID_ARGUMENT written for another model (identity differs from id) or for
 *                            another pool geometry (dtype, page size);
 *   MI_STATUS_OUT_OF_MEMORY  the pool cannot hold it. */
MI_API mi_status mi_kv_seq_load(mi_kv_seq *seq, const char *path, const mi_kv_model_id *id);

/* ------------------------------------------------------------------------------------------ */
/* KIVI quantized pages and reading any page format                                            */

/*
 * A pool of dtype MI_KV_KIVI2 / MI_KV_KIVI4 stores a layer's rows 0..quantized-1 in quantized
 * pages (the page table covers only them) and its newest rows quantized..length-1 in f32, in a
 * residual beside the table (per sequence, copied on fork). An append quantizes whole groups
 * of group_size rows once the residual would exceed residual_length rows; truncating into
 * quantized rows moves the rows of the last partial group back into the residual (with their
 * quantized values). mi_kv_seq_read, truncate, rewind, fork, save and load work for every
 * dtype. Pools of these dtypes keep no metadata (meta_kinds must be 0).
 */

/* Rows of a layer held in quantized pages (a multiple of group_size); the rest are in the
 * residual. For the other dtypes: the layer's length. -1 for a bad sequence or layer. */
MI_API int64_t mi_kv_seq_quantized_rows(const mi_kv_seq *seq, int32_t layer);

/* The residual of a KIVI layer: rows first_row..first_row+rows-1, f32, K and V of head h,
 * row i at k[(h * stride_rows + i) * head_dim]. rows 0 and NULL pointers for the other dtypes. */
typedef struct mi_kv_residual_view {
    int64_t first_row;
    int32_t rows, stride_rows;
    const float *k, *v;
} mi_kv_residual_view;

MI_API mi_status mi_kv_seq_residual(const mi_kv_seq *seq, int32_t layer, mi_kv_residual_view *out);

/* The page reader: rows start..start+count-1 of one KV head's K (kv = 0) or V (kv = 1) of a
 * layer, decoded to f32 into dst [count, head_dim], from whatever holds them (pages of any
 * dtype, the residual). count <= 1 << 20 per call. */
MI_API mi_status mi_kv_seq_read_tile(const mi_kv_seq *seq, int32_t layer, int32_t kv_head, int kv,
                                     int64_t start, int64_t count, float *dst);

/* One query's attention over rows first..end-1 of one KV head, reading the pages in their own
 * format (f32/f16/bf16/fp8 rows, KIVI codes with the scale and min folded into the query and
 * the softmax weights: no row is dequantized into a buffer) and the residual.
 *   out[d] = sum_r softmax_r(scale * q . k_r) v_r[d]
 * LeanK: when channel_mask ([head_dim], 1 keep, 0 prune) is given, rows mask_first..mask_end-1
 * score with the kept channels only; a head whose mask keeps no channel skips those rows.
 * scores: scratch of end - first floats. */
typedef struct mi_kv_attend_params {
    int64_t first, end;
    float scale;
    const uint8_t *channel_mask; /* NULL: every channel */
    int64_t mask_first, mask_end;
} mi_kv_attend_params;

MI_API mi_status mi_kv_seq_attend(const mi_kv_seq *seq, int32_t layer, int32_t kv_head,
                                  const float *q, const mi_kv_attend_params *params, float *scores,
                                  float *out);
/* The same for n_q queries of the KV head at once (the query heads of a grouped-query head):
 * q and out [n_q, head_dim], scores [n_q, end - first]. Each row is read (and decoded) once for
 * all of them; each query's result is mi_kv_seq_attend's bit for bit. n_q in 1..8. */
MI_API mi_status mi_kv_seq_attend_heads(const mi_kv_seq *seq, int32_t layer, int32_t kv_head,
                                        const float *q, int32_t n_q,
                                        const mi_kv_attend_params *params, float *scores,
                                        float *out);

/* ------------------------------------------------------------------------------------------ */
/* LeanK key-channel masks                                                                     */

/*
 * A static mask per layer and KV head over the head_dim key channels (docs/kv-methods.md,
 * "LeanK"). File format (JSON, UTF-8):
 *   {"format": "minference-leank-mask", "version": 1,
 *    "n_layers": L, "n_kv_heads": H, "head_dim": D,
 *    "masks": [["1011...", ... H strings], ... L lists]}
 * masks[l][h] has exactly D characters '0' or '1'; character d is channel d (1: kept). Other
 * keys (e.g. "keep_fraction", "source") are informational and ignored.
 */
typedef struct mi_leank_mask mi_leank_mask;

/* A mask with every channel kept. */
MI_API mi_status mi_leank_mask_create(mi_context *ctx, int32_t n_layers, int32_t n_kv_heads,
                                      int32_t head_dim, mi_leank_mask **out);
/* Reads and validates a mask file (MI_STATUS_IO_ERROR, MI_STATUS_PARSE_ERROR with the reason). */
MI_API mi_status mi_leank_mask_load(mi_context *ctx, const char *path, mi_leank_mask **out);
MI_API mi_status mi_leank_mask_parse(mi_context *ctx, const char *json, size_t length,
                                     mi_leank_mask **out);
/* Writes the file atomically. */
MI_API mi_status mi_leank_mask_save(mi_context *ctx, const mi_leank_mask *mask, const char *path);
MI_API void mi_leank_mask_destroy(mi_leank_mask *mask);
MI_API void mi_leank_mask_shape(const mi_leank_mask *mask, int32_t *n_layers, int32_t *n_kv_heads,
                                int32_t *head_dim);
/* [head_dim] bytes, 1 kept / 0 pruned; NULL for an index out of range. */
MI_API const uint8_t *mi_leank_mask_head(const mi_leank_mask *mask, int32_t layer, int32_t kv_head);
MI_API mi_status mi_leank_mask_set(mi_leank_mask *mask, int32_t layer, int32_t kv_head,
                                   const uint8_t *keep);
/* Kept channels over all heads (0..1). */
MI_API double mi_leank_mask_keep_fraction(const mi_leank_mask *mask);
/* Learning from importances [n_layers][n_kv_heads][head_dim] (e.g. the calibration run's
 * sqrt(sum q_d^2) * sqrt(sum k_d^2) per channel): per head the round(keep * head_dim / align)
 * * align most important channels (at least align, ties to the lower channel). */
MI_API mi_status mi_leank_mask_from_importance(mi_context *ctx, int32_t n_layers,
                                               int32_t n_kv_heads, int32_t head_dim,
                                               const double *importance, double keep, int32_t align,
                                               mi_leank_mask **out);

#ifdef __cplusplus
}
#endif

#endif /* MINFERENCE_KV_H */
