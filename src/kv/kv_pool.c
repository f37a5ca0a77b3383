/*
 * kv_pool.c: the page pool of the KV cache: layout, slabs, the free list, reference counts,
 * row encoding (f32 / f16 / bf16 / fp8 e4m3 with a scale per page and head) and the per-page
 * key min/max metadata.
 */
/* madvise and MADV_HUGEPAGE */
#define _DEFAULT_SOURCE
#include "kv_internal.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ------------------------------------------------------------------------------------------ */
/* Errors and names                                                                            */

mi_status kv_fail(const mi_kv_pool *pool, mi_status status, const char *fmt, ...) {
    if (pool) {
        /* every pool is heap-allocated; const only marks queries that do not change the cache */
        mi_kv_pool *p = (mi_kv_pool *)pool;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->last_error, sizeof p->last_error, fmt, ap);
        va_end(ap);
    }
    return status;
}

void kv_clear_error(const mi_kv_pool *pool) {
    if (pool) ((mi_kv_pool *)pool)->last_error[0] = 0;
}

const char *mi_kv_pool_last_error(const mi_kv_pool *pool) { return pool ? pool->last_error : ""; }

const char *mi_kv_dtype_name(mi_kv_dtype dtype) {
    switch (dtype) {
    case MI_KV_F32: return "f32";
    case MI_KV_F16: return "f16";
    case MI_KV_BF16: return "bf16";
    case MI_KV_FP8_E4M3: return "fp8_e4m3";
    case MI_KV_KIVI2: return "kivi2";
    case MI_KV_KIVI4: return "kivi4";
    }
    return "unknown";
}

/* ------------------------------------------------------------------------------------------ */
/* fp8 e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; 0x7f / 0xff are NaN, max 448.      */

/* Round to nearest even on the bits: a long prompt codes tens of billions of values, and the
 * libm form (frexpf, ldexpf, rintf a value) ran at a tenth of the speed of the copies around it.
 * tests/kv/test_kv_seq.c checks it against that form over a sweep of every exponent. */
static inline uint8_t fp8_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    /* below 2^-6: subnormal steps of 2^-9, a * 512 < 8 rounded to nearest even by adding and
     * taking away 1.5 * 2^23 (8 steps is the smallest normal, whose code is also 8); from 448
     * on (infinities too): 448; NaN: 0x7f */
    const uint32_t is_small = 0u - (uint32_t)(a < 0x3c800000u);
    const uint32_t is_big = 0u - (uint32_t)(a >= 0x43e00000u); /* 448 on, infinities too */
    const uint32_t is_nan = 0u - (uint32_t)(a > 0x7f800000u);
    const uint32_t small = a & is_small; /* (the others would overflow an int) */
    float f;
    memcpy(&f, &small, sizeof f);
    const float rs = (f * 512.0f + 12582912.0f) - 12582912.0f;
    const uint32_t sub = (uint32_t)(int32_t)rs;
    /* normal: keep 3 of the 23 mantissa bits, rounding at bit 20 to nearest even (a carry moves
     * into the exponent); the exponent's bias goes from 127 to 7 */
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    const uint32_t norm = (r >> 20) - (120u << 3);
    uint32_t code = (sub & is_small) | (norm & ~is_small);
    code = (0x7eu & is_big) | (code & ~is_big);
    code = (0x7fu & is_nan) | ((code | sign) & ~is_nan);
    return (uint8_t)code;
}

uint8_t mi_fp8_e4m3_from_f32(float x) { return fp8_from_f32(x); }

/* out[d] = e4m3((x[d] - c[d]) * inv); restrict: the byte stores alias nothing (else the loop
 * would not vectorise). */
static void fp8_encode_scaled(uint8_t *restrict out, const float *restrict x,
                              const float *restrict c, float inv, int32_t n) {
    for (int32_t d = 0; d < n; d++) out[d] = fp8_from_f32((x[d] - c[d]) * inv);
}

/* An e4m3 code's value by bit arithmetic, which vectorises where it is inlined into a loop: the
 * 7 magnitude bits placed at the top of an f32's exponent and mantissa and scaled by 2^120 give
 * 2^(e-7) * 1.m for e > 0; e = 0 (subnormal) is m * 2^-9 from an integer (exact, also where
 * denormals are flushed); magnitude 0x7f is NaN; then the sign. Masks, not branches, so a loop
 * stays one vector path. */
static inline float fp8_value(uint32_t x) {
    const uint32_t mag = x & 0x7fu;
    uint32_t nb = mag << 20, sb;
    float normal, sub = (float)(int32_t)(mag & 7u) * 0x1p-9f, v;
    memcpy(&normal, &nb, sizeof normal);
    normal *= 0x1p120f;
    memcpy(&nb, &normal, sizeof nb);
    memcpy(&sb, &sub, sizeof sb);
    const uint32_t is_sub = 0u - (uint32_t)((mag >> 3) == 0u);
    const uint32_t is_nan = 0u - (uint32_t)(mag == 0x7fu);
    uint32_t bits = (nb & ~is_sub) | (sb & is_sub);
    bits = (bits & ~is_nan) | (0x7fc00000u & is_nan);
    bits |= (x & 0x80u) << 24;
    memcpy(&v, &bits, sizeof v);
    return v;
}

float mi_fp8_e4m3_to_f32(uint8_t x) { return fp8_value(x); }

void kv_fp8_decode(const uint8_t *restrict code, int32_t n, const float *restrict c, float s,
                   float *restrict dst) {
    /* code * s is exact (s is a power of two), so c + code * s rounds once */
    for (int32_t d = 0; d < n; d++) dst[d] = c[d] + fp8_value(code[d]) * s;
}

/* ------------------------------------------------------------------------------------------ */
/* Pool                                                                                        */

mi_kv_pool_params mi_kv_pool_default_params(void) {
    mi_kv_pool_params p;
    memset(&p, 0, sizeof p);
    p.dtype = MI_KV_F32;
    p.page_tokens = 64; /* the sparse kernels' block size */
    return p;
}

/* Slabs of 2 MiB or more are mapped directly and asked to be backed by huge pages: a long
 * prompt writes gigabytes of fresh pages, and faulting them in 4 KiB at a time made the appends
 * several times slower than the copies themselves (docs/kv-cache.md). Under AddressSanitizer
 * every slab comes from the allocator, which it checks. */
#if defined(MADV_HUGEPAGE) && !defined(__SANITIZE_ADDRESS__)
#define KV_MAPPED_SLABS 1
static const size_t HUGE_BYTES = (size_t)2 << 20;
/* a mapped slab's length: whole huge pages */
static size_t mapped_len(size_t bytes) {
    return (bytes + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES;
}
#endif

static void *default_alloc(void *user, size_t bytes) {
    (void)user;
#ifdef KV_MAPPED_SLABS
    if (bytes >= HUGE_BYTES) {
        const size_t len = mapped_len(bytes);
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: refused is fine */
        return p;
    }
#endif
    return aligned_alloc(256, (bytes + 255) / 256 * 256);
}

static void default_free(void *user, void *ptr, size_t bytes) {
    (void)user;
#ifdef KV_MAPPED_SLABS
    if (bytes >= HUGE_BYTES) {
        munmap(ptr, mapped_len(bytes));
        return;
    }
#endif
    (void)bytes;
    free(ptr);
}

static void set_err(mi_context *ctx, const char *msg) {
    mi_context_set_error(ctx, MI_STATUS_SUCCESS, msg); /* only the message: the caller returns */
}

static int32_t elem_bytes_of(mi_kv_dtype dtype) {
    switch (dtype) {
    case MI_KV_F32: return 4;
    case MI_KV_F16:
    case MI_KV_BF16: return 2;
    case MI_KV_FP8_E4M3: return 1;
    case MI_KV_KIVI2:
    case MI_KV_KIVI4: return 1; /* codes are sub-byte: the layout says 0 */
    }
    return 0;
}

mi_status mi_kv_pool_create(mi_context *ctx, const mi_kv_pool_params *params, mi_kv_pool **out) {
    char msg[256];
    if (!params || !out) {
        set_err(ctx, "mi_kv_pool_create: params and out must not be NULL");
        return MI_STATUS_INVALID_ARGUMENT;
    }
    const mi_kv_pool_params *p = params;
    const int32_t eb = elem_bytes_of(p->dtype);
    msg[0] = 0;
    if (p->n_layers < 1 || p->n_layers > 65536 || p->n_kv_heads < 1 || p->n_kv_heads > 4096)
        snprintf(msg, sizeof msg, "n_layers (%d) must be in 1..65536, n_kv_heads (%d) in 1..4096",
                 p->n_layers, p->n_kv_heads);
    else if (p->head_dim < 1 || p->head_dim > MI_KV_MAX_HEAD_DIM)
        snprintf(msg, sizeof msg, "head_dim %d is outside 1..%d", p->head_dim, MI_KV_MAX_HEAD_DIM);
    else if (eb == 0)
        snprintf(msg, sizeof msg, "unknown storage dtype %d", (int)p->dtype);
    else if (p->page_tokens < 1 || p->page_tokens > 32768)
        snprintf(msg, sizeof msg, "page_tokens %d is outside 1..32768", p->page_tokens);
    else if (p->capacity_tokens < 0)
        snprintf(msg, sizeof msg, "capacity_tokens is negative");
    else if (p->meta_kinds & ~MI_KV_META_KEY_MINMAX)
        snprintf(msg, sizeof msg, "unknown metadata kinds 0x%x", p->meta_kinds);
    else if (!p->alloc != !p->free)
        snprintf(msg, sizeof msg, "alloc and free are given together or not at all");
    const bool kivi = p->dtype == MI_KV_KIVI2 || p->dtype == MI_KV_KIVI4;
    /* KIVI defaults: the original's group size 32 and residual length 32 */
    const int32_t qg = p->quant_group > 0 ? p->quant_group : 32;
    const int32_t qr = p->quant_residual > 0 ? p->quant_residual : 32;
    if (!msg[0] && kivi) {
        if (p->quant_group < 0 || p->quant_residual < 0 || qr > 65536)
            snprintf(msg, sizeof msg,
                     "quant_group (%d) and quant_residual (%d) must be 0 (default) or positive, "
                     "quant_residual at most 65536",
                     p->quant_group, p->quant_residual);
        else if (qg % 4 != 0 || p->page_tokens % qg != 0 || p->head_dim % qg != 0)
            snprintf(msg, sizeof msg,
                     "KIVI group size %d must be a multiple of 4 dividing page_tokens (%d) and "
                     "head_dim (%d)",
                     qg, p->page_tokens, p->head_dim);
        else if (p->meta_kinds)
            snprintf(msg, sizeof msg, "KIVI pools keep no metadata (meta_kinds 0x%x)",
                     p->meta_kinds);
    }
    if (msg[0]) {
        set_err(ctx, msg);
        return MI_STATUS_INVALID_ARGUMENT;
    }

    mi_kv_page_layout L;
    memset(&L, 0, sizeof L);
    L.dtype = p->dtype;
    L.page_tokens = p->page_tokens;
    L.n_kv_heads = p->n_kv_heads;
    L.head_dim = p->head_dim;
    L.elem_bytes = kivi ? 0 : eb;
    L.row_stride = (size_t)p->head_dim * (size_t)eb;
    if (kivi) {
        L.bits = p->dtype == MI_KV_KIVI2 ? 2 : 4;
        L.group_size = qg;
        L.row_stride = (size_t)p->head_dim * (size_t)L.bits / 8;
    }
    L.head_stride = (size_t)p->page_tokens * L.row_stride;
    L.k_offset = 0;
    /* regions start on 16 bytes (vector loads, aligned float scales) */
    L.v_offset = ((size_t)p->n_kv_heads * L.head_stride + 15) / 16 * 16;
    size_t end = L.v_offset + (size_t)p->n_kv_heads * L.head_stride;
    if (kivi) {
        /* f16 (scale, min) pairs: K per head, token group and channel; V per head, row and
         * channel group */
        L.k_param_offset = end = (end + 15) / 16 * 16;
        end += (size_t)p->n_kv_heads * (size_t)(p->page_tokens / qg) * (size_t)p->head_dim * 4;
        L.v_param_offset = end = (end + 15) / 16 * 16;
        end += (size_t)p->n_kv_heads * (size_t)p->page_tokens * (size_t)(p->head_dim / qg) * 4;
    }
    if (p->dtype == MI_KV_FP8_E4M3) {
        L.has_scales = 1;
        L.scale_offset = end = (end + 15) / 16 * 16;
        end += 2 * (size_t)p->n_kv_heads * sizeof(float);
        L.center_offset = end = (end + 15) / 16 * 16;
        end += 2 * (size_t)p->n_kv_heads * (size_t)p->head_dim * sizeof(uint16_t); /* bf16 */
    }
    L.page_bytes = (end + 255) / 256 * 256;
    L.meta_kinds = p->meta_kinds;
    if (p->meta_kinds & MI_KV_META_KEY_MINMAX)
        L.meta_bytes = (size_t)p->n_kv_heads * 2 * (size_t)p->head_dim * sizeof(float);
    if (L.page_bytes > ((size_t)1 << 31)) {
        snprintf(msg, sizeof msg, "a page of %zu bytes is too large (at most 2 GiB)", L.page_bytes);
        set_err(ctx, msg);
        return MI_STATUS_UNSUPPORTED;
    }

    int64_t max_pages = INT32_MAX - 1;
    if (p->capacity_tokens > 0) {
        const int64_t per_layer = (p->capacity_tokens + p->page_tokens - 1) / p->page_tokens;
        if (per_layer < max_pages / p->n_layers) max_pages = per_layer * p->n_layers;
    }
    if (p->capacity_bytes > 0) {
        const uint64_t n = p->capacity_bytes / (L.page_bytes + L.meta_bytes);
        if (n < (uint64_t)max_pages) max_pages = (int64_t)n;
    }
    if (max_pages < 1) {
        snprintf(msg, sizeof msg, "capacity_bytes %llu holds no page of %zu bytes",
                 (unsigned long long)p->capacity_bytes, L.page_bytes + L.meta_bytes);
        set_err(ctx, msg);
        return MI_STATUS_INVALID_ARGUMENT;
    }

    mi_kv_pool *pool = calloc(1, sizeof *pool);
    if (!pool) {
        set_err(ctx, "out of memory for the KV pool");
        return MI_STATUS_OUT_OF_MEMORY;
    }
    pool->params = *p;
    if (!pool->params.alloc) {
        pool->params.alloc = default_alloc;
        pool->params.free = default_free;
    }
    pool->layout = L;
    if (kivi) {
        pool->params.quant_group = qg;
        pool->params.quant_residual = qr;
        pool->q_resid_cap = qr + qg - 1;
    }
    pool->refs = 1;
    pool->max_pages = max_pages;
    int64_t slab = p->slab_pages > 0 ? p->slab_pages : (int64_t)(((size_t)4 << 20) / L.page_bytes);
    if (slab < 1) slab = 1;
    if (slab > max_pages) slab = max_pages;
    pool->slab_pages = (int32_t)slab;
    *out = pool;
    return MI_STATUS_SUCCESS;
}

static int64_t slab_count(const mi_kv_pool *pool, int32_t s) {
    const int64_t rest = pool->allocated - (int64_t)s * pool->slab_pages;
    return rest < pool->slab_pages ? rest : pool->slab_pages;
}

/* The metadata of n pages, rounded up as the allocator wants (a multiple of 256 bytes). They come
 * from the pool's allocator like the pages, so a device that reads pinned pages reads them too. */
static size_t meta_slab_bytes(const mi_kv_pool *pool, size_t n) {
    return (n * pool->layout.meta_bytes + 255) / 256 * 256;
}

static void pool_free(mi_kv_pool *pool) {
    for (int32_t s = 0; s < pool->n_slabs; s++) {
        const size_t n = (size_t)slab_count(pool, s);
        pool->params.free(pool->params.alloc_user, pool->slabs[s], n * pool->layout.page_bytes);
        if (pool->meta_slabs)
            pool->params.free(pool->params.alloc_user, pool->meta_slabs[s],
                              meta_slab_bytes(pool, n));
    }
    free(pool->slabs);
    free(pool->meta_slabs);
    free(pool->info);
    free(pool->free_ids);
    free(pool);
}

static void pool_unref(mi_kv_pool *pool) {
    if (--pool->refs == 0) pool_free(pool);
}

void mi_kv_pool_destroy(mi_kv_pool *pool) {
    if (pool) pool_unref(pool);
}

mi_status mi_kv_pool_layout(const mi_kv_pool *pool, mi_kv_page_layout *out) {
    if (!pool) return MI_STATUS_INVALID_ARGUMENT;
    if (!out) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "mi_kv_pool_layout: out is NULL");
    *out = pool->layout;
    return MI_STATUS_SUCCESS;
}

mi_status mi_kv_pool_stats_get(const mi_kv_pool *pool, mi_kv_pool_stats *out) {
    if (!pool) return MI_STATUS_INVALID_ARGUMENT;
    if (!out) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "mi_kv_pool_stats_get: out is NULL");
    mi_kv_pool_stats s;
    memset(&s, 0, sizeof s);
    const bool limited = pool->params.capacity_tokens > 0 || pool->params.capacity_bytes > 0;
    s.capacity_pages = limited ? pool->max_pages : -1;
    s.allocated_pages = pool->allocated;
    s.used_pages = pool->used;
    for (int64_t i = 0; i < pool->allocated; i++) s.shared_pages += pool->info[i].refs > 1;
    s.page_bytes = pool->layout.page_bytes + pool->layout.meta_bytes;
    s.allocated_bytes = (uint64_t)s.allocated_pages * s.page_bytes;
    s.used_bytes = (uint64_t)s.used_pages * s.page_bytes;
    s.live_sequences = pool->live_sequences;
    *out = s;
    return MI_STATUS_SUCCESS;
}

const void *mi_kv_pool_page_data(const mi_kv_pool *pool, int32_t page_id) {
    if (!pool || page_id < 0 || page_id >= pool->allocated || pool->info[page_id].refs == 0)
        return NULL;
    return kv_page(pool, page_id);
}

/* ------------------------------------------------------------------------------------------ */
/* Pages                                                                                       */

static void meta_reset(mi_kv_pool *pool, int32_t id) {
    float *m = kv_page_meta(pool, id);
    if (!m) return;
    const int32_t hd = pool->layout.head_dim;
    for (int32_t h = 0; h < pool->layout.n_kv_heads; h++, m += 2 * hd)
        for (int32_t d = 0; d < hd; d++) m[d] = INFINITY, m[hd + d] = -INFINITY;
}

/* One more slab; MI_STATUS_OUT_OF_MEMORY (with a message) when the host has no memory. */
static mi_status grow(mi_kv_pool *pool) {
    int64_t count = pool->max_pages - pool->allocated;
    if (count > pool->slab_pages) count = pool->slab_pages;
    const int64_t total = pool->allocated + count;
    /* the bookkeeping arrays first: growing them is harmless if the slab then fails */
    if (pool->n_slabs == pool->cap_slabs) {
        const int32_t cap = pool->cap_slabs ? 2 * pool->cap_slabs : 16;
        unsigned char **s = realloc(pool->slabs, (size_t)cap * sizeof *s);
        if (s) pool->slabs = s;
        float **ms = NULL;
        if (s && pool->layout.meta_bytes) {
            ms = realloc(pool->meta_slabs, (size_t)cap * sizeof *ms);
            if (ms) pool->meta_slabs = ms;
        }
        if (!s || (pool->layout.meta_bytes && !ms))
            return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory for the page tables");
        pool->cap_slabs = cap;
    }
    kv_page_info *info = realloc(pool->info, (size_t)total * sizeof *info);
    if (info) pool->info = info;
    int32_t *ids = info ? realloc(pool->free_ids, (size_t)total * sizeof *ids) : NULL;
    if (ids) pool->free_ids = ids;
    if (!info || !ids)
        return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory for the page tables");
    const size_t bytes = (size_t)count * pool->layout.page_bytes;
    unsigned char *data = pool->params.alloc(pool->params.alloc_user, bytes);
    float *meta = NULL;
    if (data && pool->layout.meta_bytes) {
        meta = pool->params.alloc(pool->params.alloc_user, meta_slab_bytes(pool, (size_t)count));
        if (!meta) pool->params.free(pool->params.alloc_user, data, bytes);
    }
    if (!data || (pool->layout.meta_bytes && !meta))
        return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY,
                       "out of host memory for %lld KV pages (%zu bytes)", (long long)count,
                       bytes + (size_t)count * pool->layout.meta_bytes);
    pool->slabs[pool->n_slabs] = data;
    if (pool->meta_slabs) pool->meta_slabs[pool->n_slabs] = meta;
    pool->n_slabs++;
    /* pushed highest first so that the lowest ids are taken first */
    for (int64_t i = total - 1; i >= pool->allocated; i--) {
        pool->info[i].refs = 0;
        pool->info[i].fill = 0;
        pool->free_ids[pool->n_free++] = (int32_t)i;
    }
    pool->allocated = total;
    return MI_STATUS_SUCCESS;
}

mi_status kv_pages_acquire(mi_kv_pool *pool, int64_t n, int32_t *ids) {
    if (n <= 0) return MI_STATUS_SUCCESS;
    const int64_t available = pool->n_free + (pool->max_pages - pool->allocated);
    if (n > available)
        return kv_fail(
            pool, MI_STATUS_OUT_OF_MEMORY,
            "the KV pool is full: %lld more pages needed, %lld free of a capacity of "
            "%lld pages (%lld tokens per layer)",
            (long long)n, (long long)available, (long long)pool->max_pages,
            (long long)(pool->max_pages / pool->params.n_layers * pool->params.page_tokens));
    while (pool->n_free < n) {
        mi_status st = grow(pool);
        if (st != MI_STATUS_SUCCESS) return st;
    }
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = pool->free_ids[--pool->n_free];
        pool->info[id].refs = 1;
        pool->info[id].fill = 0;
        pool->info[id].version = ++pool->versions;
        meta_reset(pool, id);
        if (pool->layout.has_scales) /* a page's scales describe its own rows only */
            memset(kv_page(pool, id) + pool->layout.scale_offset, 0,
                   2 * (size_t)pool->layout.n_kv_heads * sizeof(float));
        ids[i] = id;
    }
    pool->used += n;
    return MI_STATUS_SUCCESS;
}

void kv_page_release(mi_kv_pool *pool, int32_t id) {
    if (--pool->info[id].refs == 0) {
        pool->free_ids[pool->n_free++] = id;
        pool->used--;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Rows                                                                                        */

static float *scale_of(const mi_kv_pool *pool, const unsigned char *page, int kv, int32_t h) {
    return (float *)(page + pool->layout.scale_offset) + (size_t)kv * pool->layout.n_kv_heads + h;
}
/* fp8 centres: bf16, [2][n_kv_heads][head_dim] (any value is a valid centre: bf16 halves their
 * bytes at no cost in accuracy) */
static uint16_t *center_of(const mi_kv_pool *pool, const unsigned char *page, int kv, int32_t h) {
    const mi_kv_page_layout *L = &pool->layout;
    return (uint16_t *)(page + L->center_offset) + ((size_t)kv * L->n_kv_heads + h) * L->head_dim;
}
static void centre_get(const mi_kv_pool *pool, const unsigned char *page, int kv, int32_t h,
                       float *c) {
    const uint16_t *b = center_of(pool, page, kv, h);
    for (int32_t d = 0; d < pool->layout.head_dim; d++) c[d] = mi_bf16_to_f32(b[d]);
}

void kv_rows_decode(const mi_kv_pool *pool, const unsigned char *page, int kv, int32_t h,
                    int32_t r0, int32_t r1, float *dst) {
    const int32_t hd = pool->layout.head_dim;
    const float s = pool->layout.has_scales ? *scale_of(pool, page, kv, h) : 1.0f;
    float c[MI_KV_MAX_HEAD_DIM];
    if (pool->layout.has_scales) centre_get(pool, page, kv, h, c);
    for (int32_t r = r0; r < r1; r++, dst += hd) {
        const unsigned char *row = kv_row_at(pool, page, kv, h, r);
        switch (pool->layout.dtype) {
        case MI_KV_F32: memcpy(dst, row, (size_t)hd * sizeof(float)); break;
        case MI_KV_F16:
            for (int32_t d = 0; d < hd; d++) {
                uint16_t u;
                memcpy(&u, row + 2 * d, 2);
                dst[d] = mi_f16_to_f32(u);
            }
            break;
        case MI_KV_BF16:
            for (int32_t d = 0; d < hd; d++) {
                uint16_t u;
                memcpy(&u, row + 2 * d, 2);
                dst[d] = mi_bf16_to_f32(u);
            }
            break;
        case MI_KV_FP8_E4M3: kv_fp8_decode(row, hd, c, s, dst); break;
        case MI_KV_KIVI2:
        case MI_KV_KIVI4: kv_quant_decode_rows(pool, page, kv, h, r, r + 1, dst); break;
        }
    }
}

static void encode_row(const mi_kv_pool *pool, unsigned char *row, const float *src, float s,
                       const float *c) {
    const int32_t hd = pool->layout.head_dim;
    switch (pool->layout.dtype) {
    case MI_KV_F32: memcpy(row, src, (size_t)hd * sizeof(float)); break;
    case MI_KV_F16:
        for (int32_t d = 0; d < hd; d++) {
            const uint16_t u = mi_f32_to_f16(src[d]);
            memcpy(row + 2 * d, &u, 2);
        }
        break;
    case MI_KV_BF16:
        for (int32_t d = 0; d < hd; d++) {
            const uint16_t u = mi_f32_to_bf16(src[d]);
            memcpy(row + 2 * d, &u, 2);
        }
        break;
    case MI_KV_FP8_E4M3: {
        /* s == 0: every value so far was zero; s is a power of two, so 1 / s is exact where it
         * is a normal float */
        if (s >= 0x1p-100f) {
            fp8_encode_scaled(row, src, c, 1.0f / s, hd);
        } else if (s > 0.0f) {
            for (int32_t d = 0; d < hd; d++) row[d] = fp8_from_f32((src[d] - c[d]) / s);
        } else {
            memset(row, 0, (size_t)hd);
        }
        break;
    }
    case MI_KV_KIVI2:
    case MI_KV_KIVI4: break; /* whole groups are written by kv_quant.c */
    }
}

bool kv_rows_encode(mi_kv_pool *pool, unsigned char *page, int kv, int32_t h, int32_t r0, int32_t n,
                    const float *src, int64_t ld, const unsigned char *prev) {
    const int32_t hd = pool->layout.head_dim;
    bool rescaled = false;
    float s = 1.0f, c[MI_KV_MAX_HEAD_DIM];
    if (pool->layout.has_scales) {
        float *sp = scale_of(pool, page, kv, h);
        uint16_t *cb = center_of(pool, page, kv, h);
        if (r0 == 0 && n < pool->layout.page_tokens / 4) {
            /* a page begun by a few rows (decoding) keeps the previous page's centre, a mean
             * over many more rows; the first page, 0 (a mean of a few rows is mostly noise) */
            if (prev)
                memcpy(cb, center_of(pool, prev, kv, h), (size_t)hd * sizeof(uint16_t));
            else
                memset(cb, 0, (size_t)hd * sizeof(uint16_t));
            *sp = 0.0f;
        } else if (r0 == 0) {
            /* The page's first rows set its centre: their mean per channel. Keys carry large
             * per-channel offsets, and e4m3 rounds relative to the value coded, so coding the
             * distance from the centre rounds far less (later rows use the same centre). */
            double m[MI_KV_MAX_HEAD_DIM];
            int32_t cnt[MI_KV_MAX_HEAD_DIM];
            for (int32_t d = 0; d < hd; d++) m[d] = 0.0, cnt[d] = 0;
            for (int32_t i = 0; i < n; i++) /* row by row: the rows are contiguous */
                for (int32_t d = 0; d < hd; d++) {
                    const float x = src[i * ld + d];
                    const bool ok = isfinite(x);
                    m[d] += ok ? (double)x : 0.0;
                    cnt[d] += ok;
                }
            for (int32_t d = 0; d < hd; d++)
                cb[d] = mi_f32_to_bf16(cnt[d] ? (float)(m[d] / (double)cnt[d]) : 0.0f);
            *sp = 0.0f;
        }
        centre_get(pool, page, kv, h, c);
        /* the largest finite distance: per channel first (selects across a row vectorise),
         * then over the channels */
        float mx[MI_KV_MAX_HEAD_DIM], amax = 0.0f;
        for (int32_t d = 0; d < hd; d++) mx[d] = 0.0f;
        for (int32_t i = 0; i < n; i++)
            for (int32_t d = 0; d < hd; d++) {
                float a = fabsf(src[i * ld + d] - c[d]);
                a = a <= FLT_MAX ? a : 0.0f;
                mx[d] = a > mx[d] ? a : mx[d];
            }
        for (int32_t d = 0; d < hd; d++) amax = mx[d] > amax ? mx[d] : amax;
        s = *sp;
        float want = 0.0f;
        if (amax > 0.0f) {
            /* a power of two: growing it shifts the earlier rows' exponents, exact unless a
             * value falls into the subnormal range */
            int e;
            const float m = frexpf(amax / 448.0f, &e);
            want = ldexpf(1.0f, m == 0.5f ? e - 1 : e);
        }
        if (want > s) {
            /* the new rows do not fit the page's scale: re-encode the earlier rows under the
             * larger one */
            float buf[MI_KV_MAX_HEAD_DIM];
            for (int32_t r = 0; r < r0 && s > 0.0f; r++) {
                kv_rows_decode(pool, page, kv, h, r, r + 1, buf);
                encode_row(pool, kv_row_at(pool, page, kv, h, r), buf, want, c);
            }
            rescaled = r0 > 0 && s > 0.0f;
            *sp = s = want;
        }
    }
    for (int32_t i = 0; i < n; i++)
        encode_row(pool, kv_row_at(pool, page, kv, h, r0 + i), src + i * ld, s, c);
    return rescaled;
}

void kv_meta_extend(mi_kv_pool *pool, int32_t id, int32_t h, int32_t r0, int32_t r1) {
    float *m = kv_page_meta(pool, id);
    if (!m) return;
    const int32_t hd = pool->layout.head_dim;
    float *mn = m + (size_t)h * 2 * hd, *mx = mn + hd;
    const unsigned char *page = kv_page(pool, id);
    float buf[MI_KV_MAX_HEAD_DIM];
    for (int32_t r = r0; r < r1; r++) {
        kv_rows_decode(pool, page, 0, h, r, r + 1, buf);
        for (int32_t d = 0; d < hd; d++) {
            if (buf[d] < mn[d]) mn[d] = buf[d];
            if (buf[d] > mx[d]) mx[d] = buf[d];
        }
    }
}

void kv_meta_recompute(mi_kv_pool *pool, int32_t id) {
    if (!pool->meta_slabs) return;
    meta_reset(pool, id);
    for (int32_t h = 0; h < pool->layout.n_kv_heads; h++)
        kv_meta_extend(pool, id, h, 0, pool->info[id].fill);
}

/* ------------------------------------------------------------------------------------------ */
/* Sequence lifetime (here because it moves the pool's reference count)                        */

mi_kv_seq *kv_seq_new(mi_kv_pool *pool) {
    mi_kv_seq *seq = calloc(1, sizeof *seq);
    if (!seq) return NULL;
    seq->layers = calloc((size_t)pool->params.n_layers, sizeof *seq->layers);
    if (!seq->layers) {
        free(seq);
        return NULL;
    }
    seq->pool = pool;
    pool->refs++;
    pool->live_sequences++;
    return seq;
}

void kv_seq_clear(mi_kv_seq *seq) {
    for (int32_t l = 0; l < seq->pool->params.n_layers; l++) {
        kv_layer *L = &seq->layers[l];
        for (int64_t i = 0; i < L->n_pages; i++) kv_page_release(seq->pool, L->pages[i]);
        free(L->pages);
        free(L->head_len);
        free(L->resid);
        memset(L, 0, sizeof *L);
    }
}

void mi_kv_seq_destroy(mi_kv_seq *seq) {
    if (!seq) return;
    mi_kv_pool *pool = seq->pool;
    kv_seq_clear(seq);
    free(seq->layers);
    free(seq);
    pool->live_sequences--;
    pool_unref(pool);
}
