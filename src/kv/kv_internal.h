/*
 * kv_internal.h: the layout of the paged KV cache's pool and sequences, shared by kv_pool.c
 * (pages, refcounts, conversions), kv_seq.c (page tables) and kv_file.c (session files).
 *
 * Invariant that makes copy-on-write simple: a page is written only while exactly one sequence
 * references it (refs == 1). fill is the number of rows written into the page; a sequence may see
 * fewer (it truncated into a page it shares), never more.
 */
#ifndef MI_KV_INTERNAL_H
#define MI_KV_INTERNAL_H

#include "minference_kv.h"

#include <stdbool.h>

#define MI_KV_ERROR_CAPACITY 512
#define MI_KV_MAX_HEAD_DIM 1024
/* appends and reads of at least this many rows copy on OpenMP threads */
#define KV_PARALLEL_ROWS 4096

typedef struct kv_page_info {
    uint32_t refs; /* sequences referencing the page; 0: on the free list */
    int32_t fill;  /* rows written (and covered by the metadata) */
    /* changes when the page is taken, whenever its fill drops (a truncation whose rows may then
     * be written over) and when an append re-encodes earlier fp8 rows under a larger scale;
     * other appends leave it: rows below an earlier fill keep their values */
    uint64_t version;
} kv_page_info;

struct mi_kv_pool {
    mi_kv_pool_params params;
    mi_kv_page_layout layout;
    int32_t refs; /* the caller's reference + one per live sequence */
    int32_t live_sequences;
    int64_t max_pages; /* INT32_MAX when the pool has no limit */
    int32_t slab_pages;
    unsigned char **slabs; /* [n_slabs] slab_pages * page_bytes each */
    float **meta_slabs;    /* [n_slabs] slab_pages * meta floats each; NULL without metadata */
    int32_t n_slabs, cap_slabs;
    kv_page_info *info; /* [allocated] */
    int32_t *free_ids;  /* stack of free page ids */
    int32_t n_free;
    int64_t allocated;   /* pages backed by slabs */
    int32_t q_resid_cap; /* KIVI: residual rows a layer may hold (residual + group - 1) */
    int64_t used;        /* pages with refs > 0 */
    uint64_t versions;   /* the last page version handed out */
    char last_error[MI_KV_ERROR_CAPACITY];
};

typedef struct kv_layer {
    int32_t *pages; /* [n_pages] page ids */
    int64_t n_pages, cap_pages;
    int64_t len; /* rows */
    /* Reserved for methods that keep a different token subset per head (SnapKV, PyramidKV,
     * Ada-KV): per-head row counts [n_kv_heads], each head compacted to the front of its tiles.
     * NULL means every head has len rows, the only case implemented. */
    int32_t *head_len;
    /* KIVI: rows 0..qlen-1 are in the pages (n_pages = ceil(qlen / page_tokens)), rows
     * qlen..len-1 in resid: f32 [2 (K, V)][n_kv_heads][resid_cap][head_dim], own to the
     * sequence (NULL until the first append; resid_cap grows from group_size up to the pool's
     * q_resid_cap, so truncating into a quantized group always has room). Other dtypes: unused. */
    int64_t qlen;
    float *resid;
    int32_t resid_cap;
} kv_layer;

struct mi_kv_seq {
    mi_kv_pool *pool;
    kv_layer *layers; /* [n_layers] */
};

/* Records a message on pool (may be NULL) and returns status. */
mi_status kv_fail(const mi_kv_pool *pool, mi_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void kv_clear_error(const mi_kv_pool *pool);

static inline unsigned char *kv_page(const mi_kv_pool *pool, int32_t id) {
    return pool->slabs[id / pool->slab_pages] +
           (size_t)(id % pool->slab_pages) * pool->layout.page_bytes;
}

/* Row r of head h of K (kv = 0) or V (kv = 1) inside a page (mi_kv_page_layout). */
static inline unsigned char *kv_row_at(const mi_kv_pool *pool, const unsigned char *page, int kv,
                                       int32_t h, int32_t r) {
    const mi_kv_page_layout *L = &pool->layout;
    return (unsigned char *)page + (kv ? L->v_offset : L->k_offset) + (size_t)h * L->head_stride +
           (size_t)r * L->row_stride;
}

/* [n_kv][2][head_dim] floats, or NULL without metadata. */
static inline float *kv_page_meta(const mi_kv_pool *pool, int32_t id) {
    if (!pool->meta_slabs) return NULL;
    const size_t per = pool->layout.meta_bytes / sizeof(float);
    return pool->meta_slabs[id / pool->slab_pages] + (size_t)(id % pool->slab_pages) * per;
}

/* Takes n pages (refs = 1, fill = 0, empty metadata) into ids, all or none: on failure a
 * message and MI_STATUS_OUT_OF_MEMORY, nothing taken. */
mi_status kv_pages_acquire(mi_kv_pool *pool, int64_t n, int32_t *ids);
/* Sets a page's fill; a lower fill gives the page a new version (see kv_page_info). */
static inline void kv_page_set_fill(mi_kv_pool *pool, int32_t id, int32_t fill) {
    if (fill < pool->info[id].fill) pool->info[id].version = ++pool->versions;
    pool->info[id].fill = fill;
}

/* Drops one reference; the page returns to the free list at zero. */
void kv_page_release(mi_kv_pool *pool, int32_t id);

/* dst[d] = c[d] + mi_fp8_e4m3_to_f32(code[d]) * s, d < n, in a loop that vectorises. */
void kv_fp8_decode(const uint8_t *code, int32_t n, const float *c, float s, float *dst);

/* Rows r0..r1-1 of head h of K (kv = 0) or V (kv = 1) of a page, decoded to float:
 * dst [r1 - r0, head_dim]. */
void kv_rows_decode(const mi_kv_pool *pool, const unsigned char *page, int kv, int32_t h,
                    int32_t r0, int32_t r1, float *dst);
/* Writes rows r0..r0+n-1 of head h (src [n, ld] floats, head_dim used), re-encoding the page's
 * earlier rows where an fp8 scale must grow. Returns true when earlier rows changed. fp8: rows
 * starting a page set its centre, their mean, unless they are few and prev (the layer's previous
 * page, or NULL) lends its own. */
bool kv_rows_encode(mi_kv_pool *pool, unsigned char *page, int kv, int32_t h, int32_t r0, int32_t n,
                    const float *src, int64_t ld, const unsigned char *prev);
/* Recomputes the page's metadata over its rows 0..fill-1 (all heads). */
void kv_meta_recompute(mi_kv_pool *pool, int32_t id);
/* Widens head h's metadata by the page's rows r0..r1-1. */
void kv_meta_extend(mi_kv_pool *pool, int32_t id, int32_t h, int32_t r0, int32_t r1);

/* A sequence with empty layers (no message on failure: the caller reports). */
mi_kv_seq *kv_seq_new(mi_kv_pool *pool);
/* Releases every page of every layer and frees the tables; leaves an unusable shell. */
void kv_seq_clear(mi_kv_seq *seq);

/* KIVI (kv_quant.c). */
static inline bool kv_is_quant(const mi_kv_pool *pool) {
    return pool->layout.dtype == MI_KV_KIVI2 || pool->layout.dtype == MI_KV_KIVI4;
}
/* Row i of head h's K (kv = 0) or V residual of a layer. */
static inline float *kv_resid_row(const mi_kv_pool *pool, const kv_layer *L, int kv, int32_t h,
                                  int64_t i) {
    return L->resid +
           (((size_t)kv * pool->layout.n_kv_heads + (size_t)h) * (size_t)L->resid_cap + (size_t)i) *
               (size_t)pool->layout.head_dim;
}
void kv_quant_decode_rows(const mi_kv_pool *pool, const unsigned char *page, int kv, int32_t h,
                          int32_t r0, int32_t r1, float *dst);
mi_status kv_quant_append(mi_kv_seq *seq, int32_t layer, const mi_tensor *k, const mi_tensor *v,
                          int64_t n);
mi_status kv_quant_truncate(mi_kv_seq *seq, int32_t layer, int64_t len);
/* Copies src's residual into dst (a fork): MI_STATUS_OUT_OF_MEMORY with a message on failure. */
mi_status kv_quant_fork_layer(mi_kv_pool *pool, const kv_layer *src, kv_layer *dst);
/* Bytes of a residual of cap rows. */
size_t kv_quant_resid_bytes(const mi_kv_pool *pool, int32_t cap);

#endif /* MI_KV_INTERNAL_H */
