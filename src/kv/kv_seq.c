/*
 * kv_seq.c: a sequence's page tables: append (with copy-on-write of a shared, partly filled last
 * page), read, truncate, fork, and the zero-copy page views.
 *
 * Every mutating call first takes all it may need (page table room, pages, a conversion buffer)
 * and only then changes the sequence, so that a failure leaves it as it was.
 */
#include "kv_internal.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static int64_t pages_for(int64_t rows, int32_t P) { return (rows + P - 1) / P; }

static mi_status check_seq_layer(const mi_kv_seq *seq, int32_t layer, const char *fn) {
    if (layer < 0 || layer >= seq->pool->params.n_layers)
        return kv_fail(seq->pool, MI_STATUS_INVALID_ARGUMENT, "%s: layer %d is outside 0..%d", fn,
                       layer, seq->pool->params.n_layers - 1);
    return MI_STATUS_SUCCESS;
}

/* A [1, n_kv_heads, rows, head_dim] CPU tensor of f32 / f16 / bf16; rows < 0: any >= 1,
 * returned in *n. */
static mi_status check_rows(const mi_kv_pool *pool, const char *fn, const char *name,
                            const mi_tensor *t, int64_t rows, int64_t *n) {
    const mi_kv_pool_params *p = &pool->params;
    if (!t || !t->data)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: %s or its data is NULL", fn, name);
    if (t->device != MI_DEVICE_CPU)
        return kv_fail(pool, MI_STATUS_UNSUPPORTED, "%s: %s is not in host memory", fn, name);
    if (t->dtype != MI_DTYPE_F32 && t->dtype != MI_DTYPE_F16 && t->dtype != MI_DTYPE_BF16)
        return kv_fail(pool, MI_STATUS_UNSUPPORTED, "%s: %s has unknown dtype %d", fn, name,
                       (int)t->dtype);
    if (t->shape[0] != 1 || t->shape[1] != p->n_kv_heads || t->shape[3] != p->head_dim ||
        t->shape[2] < (rows < 0 ? 1 : rows) || (rows >= 0 && t->shape[2] != rows))
        return kv_fail(pool, MI_STATUS_SHAPE_MISMATCH,
                       "%s: %s is [%lld, %lld, %lld, %lld], expected [1, %d, %s, %d]", fn, name,
                       (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                       (long long)t->shape[3], p->n_kv_heads, rows < 0 ? "n >= 1" : "count",
                       p->head_dim);
    if (t->stride[3] != 1 || t->stride[1] < 0 || t->stride[2] < 0)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                       "%s: %s needs a contiguous last dimension and non-negative strides", fn,
                       name);
    if (n) *n = t->shape[2];
    return MI_STATUS_SUCCESS;
}

static const unsigned char *elem_ptr(const mi_tensor *t, int64_t h, int64_t i) {
    return (const unsigned char *)t->data +
           (size_t)(h * t->stride[1] + i * t->stride[2]) * mi_dtype_size(t->dtype);
}

/* rows i0..i0+c-1 of head h of t as floats: t's own memory when it is f32, else converted. */
static const float *src_rows(const mi_tensor *t, int64_t h, int64_t i0, int32_t c, int32_t hd,
                             float *tmp, int64_t *ld) {
    if (t->dtype == MI_DTYPE_F32) {
        *ld = t->stride[2];
        return (const float *)elem_ptr(t, h, i0);
    }
    for (int32_t i = 0; i < c; i++) {
        const unsigned char *row = elem_ptr(t, h, i0 + i);
        float *dst = tmp + (size_t)i * hd;
        if (t->dtype == MI_DTYPE_BF16) { /* the upper half of an f32: a shift, vectorised */
            const uint16_t *b = (const uint16_t *)row;
            uint32_t *w = (uint32_t *)dst;
            for (int32_t d = 0; d < hd; d++) w[d] = (uint32_t)b[d] << 16;
            continue;
        }
        for (int32_t d = 0; d < hd; d++) {
            uint16_t u;
            memcpy(&u, row + 2 * d, 2);
            dst[d] = mi_f16_to_f32(u);
        }
    }
    *ld = hd;
    return tmp;
}

/* Rows in t's dtype are the pages' own bytes (f32, f16 or bf16 pages; not fp8 or KIVI): then
 * appends and reads copy them, with no conversion through float. */
static bool same_bytes(const mi_kv_pool *pool, const mi_tensor *t) {
    const mi_kv_dtype d = pool->layout.dtype;
    return (d == MI_KV_F32 || d == MI_KV_F16 || d == MI_KV_BF16) && (int)t->dtype == (int)d;
}

/* mi_f32_to_bf16 over a row (round to nearest even, NaN kept quiet), in a loop that vectorises:
 * a long session's upload to the GPU reads billions of values through here. */
static void bf16_row(uint16_t *restrict out, const float *restrict x, int32_t n) {
    const uint32_t *u = (const uint32_t *)x;
    for (int32_t d = 0; d < n; d++) {
        const uint32_t w = u[d];
        const uint32_t is_nan = 0u - (uint32_t)((w & 0x7fffffffu) > 0x7f800000u);
        const uint32_t rounded = (w + 0x7fffu + ((w >> 16) & 1u)) >> 16;
        out[d] = (uint16_t)((((w >> 16) | 0x40u) & is_nan) | (rounded & ~is_nan));
    }
}

static void store_row(const mi_tensor *t, int64_t h, int64_t i, const float *src, int32_t hd) {
    unsigned char *row = (unsigned char *)elem_ptr(t, h, i);
    switch (t->dtype) {
    case MI_DTYPE_F32: memcpy(row, src, (size_t)hd * sizeof(float)); break;
    case MI_DTYPE_BF16: bf16_row((uint16_t *)row, src, hd); break;
    case MI_DTYPE_F16:
        for (int32_t d = 0; d < hd; d++) {
            const uint16_t u = mi_f32_to_f16(src[d]);
            memcpy(row + 2 * d, &u, 2);
        }
        break;
    }
}

/* ------------------------------------------------------------------------------------------ */

mi_kv_pool *mi_kv_seq_pool(const mi_kv_seq *seq) { return seq ? seq->pool : NULL; }

mi_status mi_kv_seq_create(mi_kv_pool *pool, mi_kv_seq **out) {
    if (!pool) return MI_STATUS_INVALID_ARGUMENT;
    kv_clear_error(pool);
    if (!out) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "mi_kv_seq_create: out is NULL");
    mi_kv_seq *seq = kv_seq_new(pool);
    if (!seq) return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory for a KV sequence");
    *out = seq;
    return MI_STATUS_SUCCESS;
}

mi_status mi_kv_seq_fork(const mi_kv_seq *parent, mi_kv_seq **out) {
    if (!parent) return MI_STATUS_INVALID_ARGUMENT;
    mi_kv_pool *pool = parent->pool;
    kv_clear_error(pool);
    if (!out) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "mi_kv_seq_fork: out is NULL");
    mi_kv_seq *seq = kv_seq_new(pool);
    if (!seq) return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory for a KV sequence");
    for (int32_t l = 0; l < pool->params.n_layers; l++) {
        const kv_layer *src = &parent->layers[l];
        kv_layer *dst = &seq->layers[l];
        if (kv_is_quant(pool) && kv_quant_fork_layer(pool, src, dst) != MI_STATUS_SUCCESS) {
            mi_kv_seq_destroy(seq);
            return MI_STATUS_OUT_OF_MEMORY;
        }
        dst->len = src->len; /* KIVI: rows in the residual need no pages */
        if (src->n_pages == 0) continue;
        dst->pages = malloc((size_t)src->n_pages * sizeof(int32_t));
        if (!dst->pages) {
            mi_kv_seq_destroy(seq); /* releases only the layers already shared */
            return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory for a page table");
        }
        memcpy(dst->pages, src->pages, (size_t)src->n_pages * sizeof(int32_t));
        dst->n_pages = dst->cap_pages = src->n_pages;
        for (int64_t i = 0; i < src->n_pages; i++) pool->info[src->pages[i]].refs++;
    }
    *out = seq;
    return MI_STATUS_SUCCESS;
}

/* Head h's min/max over the page's rows 0..rows-1 from scratch. */
static void meta_head_rebuild(mi_kv_pool *pool, int32_t id, int32_t h, int32_t rows) {
    float *m = kv_page_meta(pool, id);
    if (!m) return;
    const int32_t hd = pool->layout.head_dim;
    float *mn = m + (size_t)h * 2 * hd;
    for (int32_t d = 0; d < hd; d++) mn[d] = INFINITY, mn[hd + d] = -INFINITY;
    kv_meta_extend(pool, id, h, 0, rows);
}

/* One append's rows and where they go (mi_kv_seq_append). */
typedef struct append_job {
    mi_kv_pool *pool;
    const kv_layer *L;
    const mi_tensor *k, *v;
    bool raw; /* rows in the pages' own bytes */
    int64_t first, head, n;
    int32_t r_first;
} append_job;

/* Page j of the job; tmp: P * head_dim floats for rows that need converting. */
static void append_page(const append_job *jb, int64_t j, float *tmp) {
    mi_kv_pool *pool = jb->pool;
    const int32_t P = pool->params.page_tokens, H = pool->params.n_kv_heads,
                  hd = pool->params.head_dim;
    const int64_t i = j == 0 ? 0 : jb->head + (j - 1) * P;
    const int32_t r0 = j == 0 ? jb->r_first : 0;
    const int32_t c = (int32_t)(j == 0 ? jb->head : (jb->n - i < P ? jb->n - i : P));
    const int64_t pi = jb->first + j;
    const int32_t id = jb->L->pages[pi];
    unsigned char *page = kv_page(pool, id);
    const unsigned char *prev = pi > 0 ? kv_page(pool, jb->L->pages[pi - 1]) : NULL;
    for (int32_t h = 0; h < H; h++) {
        if (jb->raw) {
            for (int32_t r = 0; r < c; r++) {
                memcpy(kv_row_at(pool, page, 0, h, r0 + r), elem_ptr(jb->k, h, i + r),
                       pool->layout.row_stride);
                memcpy(kv_row_at(pool, page, 1, h, r0 + r), elem_ptr(jb->v, h, i + r),
                       pool->layout.row_stride);
            }
            kv_meta_extend(pool, id, h, r0, r0 + c);
            continue;
        }
        int64_t ld;
        const float *src = src_rows(jb->k, h, i, c, hd, tmp, &ld);
        bool rewrote = false; /* fp8 rows re-encoded under a larger scale */
        if (kv_rows_encode(pool, page, 0, h, r0, c, src, ld, prev)) {
            meta_head_rebuild(pool, id, h, r0 + c);
            rewrote = true;
        } else {
            kv_meta_extend(pool, id, h, r0, r0 + c);
        }
        src = src_rows(jb->v, h, i, c, hd, tmp, &ld);
        if (kv_rows_encode(pool, page, 1, h, r0, c, src, ld, prev)) rewrote = true;
        /* only the first page holds earlier rows to re-encode: never on a thread */
        if (rewrote && r0 > 0) pool->info[id].version = ++pool->versions;
    }
    pool->info[id].fill = r0 + c;
}

mi_status mi_kv_seq_append(mi_kv_seq *seq, int32_t layer, const mi_tensor *k, const mi_tensor *v) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    mi_kv_pool *pool = seq->pool;
    kv_clear_error(pool);
    static const char fn[] = "mi_kv_seq_append";
    mi_status st = check_seq_layer(seq, layer, fn);
    int64_t n = 0;
    if (st == MI_STATUS_SUCCESS) st = check_rows(pool, fn, "k", k, -1, &n);
    if (st == MI_STATUS_SUCCESS) st = check_rows(pool, fn, "v", v, n, NULL);
    if (st != MI_STATUS_SUCCESS) return st;
    if (kv_is_quant(pool)) return kv_quant_append(seq, layer, k, v, n);

    const int32_t P = pool->params.page_tokens, hd = pool->params.head_dim;
    kv_layer *L = &seq->layers[layer];
    if (n > INT64_MAX / 2 - L->len)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: %lld rows are too many", fn,
                       (long long)n);
    const int32_t off = (int32_t)(L->len % P);
    const int32_t last = off ? L->pages[L->n_pages - 1] : -1;
    const bool cow = off && pool->info[last].refs > 1;
    const int64_t room = off ? P - off : 0;
    const int64_t fresh = n > room ? pages_for(n - room, P) : 0;
    const int64_t need = fresh + (cow ? 1 : 0);

    if (L->n_pages + need > L->cap_pages) {
        int64_t cap = L->cap_pages ? 2 * L->cap_pages : 16;
        if (cap < L->n_pages + need) cap = L->n_pages + need;
        int32_t *pages = realloc(L->pages, (size_t)cap * sizeof *pages);
        if (!pages) return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory for a page table");
        L->pages = pages; /* only the capacity grew: the sequence is unchanged */
        L->cap_pages = cap;
    }
    float *tmp = NULL;
    if (k->dtype != MI_DTYPE_F32 || v->dtype != MI_DTYPE_F32) {
        tmp = malloc((size_t)P * (size_t)hd * sizeof(float));
        if (!tmp)
            return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory converting %lld rows",
                           (long long)n);
    }
    /* the fresh pages land in the table's spare slots, the copy of the shared page after them */
    int32_t *slots = L->pages + L->n_pages;
    if ((st = kv_pages_acquire(pool, need, slots)) != MI_STATUS_SUCCESS) {
        free(tmp);
        return st;
    }

    /* From here on nothing fails. */
    if (cow) {
        const int32_t copy = slots[fresh];
        memcpy(kv_page(pool, copy), kv_page(pool, last), pool->layout.page_bytes);
        pool->info[copy].fill = off;
        if (pool->meta_slabs) {
            if (pool->info[last].fill == off)
                memcpy(kv_page_meta(pool, copy), kv_page_meta(pool, last), pool->layout.meta_bytes);
            else
                kv_meta_recompute(pool, copy); /* the other sequence wrote past our rows */
        }
        kv_page_release(pool, last);
        L->pages[L->n_pages - 1] = copy;
    } else if (off && pool->info[last].fill != off) {
        /* a page this sequence truncated while it was shared, now its own: drop the rows past
         * our end from the metadata before writing over them */
        kv_page_set_fill(pool, last, off);
        kv_meta_recompute(pool, last);
    }
    L->n_pages += fresh;

    const bool raw = same_bytes(pool, k) && same_bytes(pool, v);
    /* page j of the call: rows [i, i + c) of k and v into rows [r0, r0 + c) of the layer's page
     * first + j (append_page) */
    const int32_t r_first = (int32_t)(L->len % P);
    const int64_t head = n < P - r_first ? n : P - r_first;
    const int64_t n_pages = n > 0 ? 1 + (n - head + P - 1) / P : 0;
    const append_job job = {pool, L, k, v, raw, L->len / P, head, n, r_first};
    /* Long appends (a prompt's layer: hundreds of MiB, much of it first touches of fresh pages)
     * copy on threads, a page each, with a conversion buffer each. The middle pages are whole,
     * so they neither read another page (an fp8 page started by few rows takes the previous
     * page's centre) nor change a version; the first and last pages go alone, in order. */
    int nt = n >= KV_PARALLEL_ROWS && n_pages > 2 ? omp_get_max_threads() : 1;
    if (tmp) { /* the threads' conversion buffers stay within 64 MiB (large pages: fewer) */
        const int64_t fit = ((int64_t)64 << 20) / ((int64_t)P * hd * (int64_t)sizeof(float));
        if (nt > fit) nt = fit > 1 ? (int)fit : 1;
    }
    float *bufs =
        nt > 1 && tmp ? malloc((size_t)nt * (size_t)P * (size_t)hd * sizeof(float)) : NULL;
    const bool threads = nt > 1 && (!tmp || bufs);
    if (n_pages > 0) append_page(&job, 0, tmp);
    if (threads) {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4)
        for (int64_t j = 1; j < n_pages - 1; j++)
            append_page(&job, j, bufs ? bufs + (size_t)omp_get_thread_num() * P * hd : NULL);
    }
    for (int64_t j = threads ? n_pages - 1 : 1; j < n_pages; j++) append_page(&job, j, tmp);
    L->len += n;
    free(bufs);
    free(tmp);
    return MI_STATUS_SUCCESS;
}

mi_status mi_kv_seq_read(const mi_kv_seq *seq, int32_t layer, int64_t start, int64_t count,
                         mi_tensor *k_out, mi_tensor *v_out) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    const mi_kv_pool *pool = seq->pool;
    kv_clear_error(pool);
    static const char fn[] = "mi_kv_seq_read";
    mi_status st = check_seq_layer(seq, layer, fn);
    if (st != MI_STATUS_SUCCESS) return st;
    const kv_layer *L = &seq->layers[layer];
    if (start < 0 || count < 0 || start > L->len || count > L->len - start)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                       "%s: rows %lld..%lld are outside layer %d's %lld rows", fn, (long long)start,
                       (long long)(start + count), layer, (long long)L->len);
    if (k_out && (st = check_rows(pool, fn, "k_out", k_out, count, NULL)) != MI_STATUS_SUCCESS)
        return st;
    if (v_out && (st = check_rows(pool, fn, "v_out", v_out, count, NULL)) != MI_STATUS_SUCCESS)
        return st;
    const int32_t P = pool->params.page_tokens, H = pool->params.n_kv_heads,
                  hd = pool->params.head_dim;
    /* Blocks of up to READ_BLOCK rows inside one page, on threads for long reads (an offloaded
     * layer's upload reads all of its rows): a block's rows of one head are decoded in one call,
     * which reads the page's fp8 centre and scale once. */
    enum { READ_BLOCK = 16 };
    const int64_t first_block = start / READ_BLOCK,
                  end_block = (start + count + READ_BLOCK - 1) / READ_BLOCK;
#pragma omp parallel for schedule(static) if (count >= KV_PARALLEL_ROWS)
    for (int64_t b = first_block; b < end_block; b++) {
        float buf[READ_BLOCK * MI_KV_MAX_HEAD_DIM];
        /* the block's rows, clipped to the read; READ_BLOCK divides no page size in general,
         * so a block is also cut where a page ends */
        int64_t row = b * READ_BLOCK > start ? b * READ_BLOCK : start;
        const int64_t stop =
            (b + 1) * READ_BLOCK < start + count ? (b + 1) * READ_BLOCK : start + count;
        while (row < stop) {
            if (kv_is_quant(pool) && row >= L->qlen) { /* the KIVI residual */
                for (int32_t h = 0; h < H; h++) {
                    if (k_out)
                        store_row(k_out, h, row - start, kv_resid_row(pool, L, 0, h, row - L->qlen),
                                  hd);
                    if (v_out)
                        store_row(v_out, h, row - start, kv_resid_row(pool, L, 1, h, row - L->qlen),
                                  hd);
                }
                row++;
                continue;
            }
            int64_t run = (row / P + 1) * P < stop ? (row / P + 1) * P : stop;
            if (kv_is_quant(pool) && run > L->qlen) run = L->qlen;
            const unsigned char *page = kv_page(pool, L->pages[row / P]);
            const int32_t r = (int32_t)(row % P), n = (int32_t)(run - row);
            for (int32_t h = 0; h < H; h++)
                for (int kv = 0; kv < 2; kv++) {
                    mi_tensor *out = kv ? v_out : k_out;
                    if (!out) continue;
                    if (same_bytes(pool, out)) {
                        for (int32_t i = 0; i < n; i++)
                            memcpy((void *)elem_ptr(out, h, row - start + i),
                                   kv_row_at(pool, page, kv, h, r + i), pool->layout.row_stride);
                        continue;
                    }
                    kv_rows_decode(pool, page, kv, h, r, r + n, buf);
                    for (int32_t i = 0; i < n; i++)
                        store_row(out, h, row - start + i, buf + (size_t)i * hd, hd);
                }
            row = run;
        }
    }
    return MI_STATUS_SUCCESS;
}

mi_status mi_kv_seq_truncate(mi_kv_seq *seq, int32_t layer, int64_t len) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    mi_kv_pool *pool = seq->pool;
    kv_clear_error(pool);
    const int32_t nl = pool->params.n_layers;
    if (layer != MI_KV_ALL_LAYERS) {
        mi_status st = check_seq_layer(seq, layer, "mi_kv_seq_truncate");
        if (st != MI_STATUS_SUCCESS) return st;
    }
    const int32_t l0 = layer == MI_KV_ALL_LAYERS ? 0 : layer;
    const int32_t l1 = layer == MI_KV_ALL_LAYERS ? nl : layer + 1;
    for (int32_t l = l0; l < l1; l++)
        if (len < 0 || len > seq->layers[l].len)
            return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                           "mi_kv_seq_truncate: length %lld is outside layer %d's 0..%lld",
                           (long long)len, l, (long long)seq->layers[l].len);
    const int32_t P = pool->params.page_tokens;
    for (int32_t l = l0; l < l1; l++) {
        if (kv_is_quant(pool)) {
            kv_quant_truncate(seq, l, len);
            continue;
        }
        kv_layer *L = &seq->layers[l];
        const int64_t keep = pages_for(len, P);
        for (int64_t i = keep; i < L->n_pages; i++) kv_page_release(pool, L->pages[i]);
        L->n_pages = keep;
        L->len = len;
        const int32_t off = (int32_t)(len % P);
        if (off) {
            const int32_t id = L->pages[keep - 1];
            /* a shared page keeps its rows (another sequence sees them) and its wider metadata */
            if (pool->info[id].refs == 1 && pool->info[id].fill != off) {
                kv_page_set_fill(pool, id, off);
                kv_meta_recompute(pool, id);
            }
        }
    }
    return MI_STATUS_SUCCESS;
}

mi_status mi_kv_seq_rewind(mi_kv_seq *seq, int64_t n) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    kv_clear_error(seq->pool);
    int64_t shortest = INT64_MAX;
    for (int32_t l = 0; l < seq->pool->params.n_layers; l++)
        if (seq->layers[l].len < shortest) shortest = seq->layers[l].len;
    if (n < 0 || n > shortest)
        return kv_fail(seq->pool, MI_STATUS_INVALID_ARGUMENT,
                       "mi_kv_seq_rewind: %lld rows cannot be dropped from a sequence whose "
                       "shortest layer has %lld",
                       (long long)n, (long long)shortest);
    for (int32_t l = 0; l < seq->pool->params.n_layers; l++) {
        /* per layer: the layers may differ in length (a forward pass between two layers) */
        mi_status st = mi_kv_seq_truncate(seq, l, seq->layers[l].len - n);
        if (st != MI_STATUS_SUCCESS) return st; /* cannot happen: the lengths were checked */
    }
    return MI_STATUS_SUCCESS;
}

int64_t mi_kv_seq_length(const mi_kv_seq *seq, int32_t layer) {
    if (!seq || layer < 0 || layer >= seq->pool->params.n_layers) return -1;
    return seq->layers[layer].len;
}

int64_t mi_kv_seq_tokens(const mi_kv_seq *seq) {
    if (!seq) return -1;
    int64_t most = 0;
    for (int32_t l = 0; l < seq->pool->params.n_layers; l++)
        if (seq->layers[l].len > most) most = seq->layers[l].len;
    return most;
}

mi_status mi_kv_seq_page_table(const mi_kv_seq *seq, int32_t layer, const int32_t **ids,
                               int64_t *n_pages) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    kv_clear_error(seq->pool);
    mi_status st = check_seq_layer(seq, layer, "mi_kv_seq_page_table");
    if (st != MI_STATUS_SUCCESS) return st;
    if (!ids || !n_pages)
        return kv_fail(seq->pool, MI_STATUS_INVALID_ARGUMENT,
                       "mi_kv_seq_page_table: ids and n_pages must not be NULL");
    *ids = seq->layers[layer].pages;
    *n_pages = seq->layers[layer].n_pages;
    return MI_STATUS_SUCCESS;
}

mi_status mi_kv_seq_page(const mi_kv_seq *seq, int32_t layer, int64_t index, mi_kv_page_view *out) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    const mi_kv_pool *pool = seq->pool;
    kv_clear_error(pool);
    mi_status st = check_seq_layer(seq, layer, "mi_kv_seq_page");
    if (st != MI_STATUS_SUCCESS) return st;
    const kv_layer *L = &seq->layers[layer];
    if (!out) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "mi_kv_seq_page: out is NULL");
    if (index < 0 || index >= L->n_pages)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                       "mi_kv_seq_page: page %lld is outside layer %d's %lld pages",
                       (long long)index, layer, (long long)L->n_pages);
    const int32_t P = pool->params.page_tokens, id = L->pages[index];
    const unsigned char *page = kv_page(pool, id);
    mi_kv_page_view v;
    memset(&v, 0, sizeof v);
    v.data = page;
    v.page_id = id;
    v.first_row = index * P;
    const int64_t paged = kv_is_quant(pool) ? L->qlen : L->len; /* KIVI: the quantized rows */
    v.rows = (int32_t)(paged - v.first_row < P ? paged - v.first_row : P);
    v.meta_rows = pool->info[id].fill;
    v.refcount = (int32_t)pool->info[id].refs;
    v.version = pool->info[id].version;
    if (pool->layout.has_scales) {
        v.k_scale = (const float *)(page + pool->layout.scale_offset);
        v.v_scale = v.k_scale + pool->layout.n_kv_heads;
        v.k_center = (const uint16_t *)(page + pool->layout.center_offset);
        v.v_center = v.k_center + (size_t)pool->layout.n_kv_heads * pool->layout.head_dim;
    }
    v.key_minmax = kv_page_meta(pool, id);
    *out = v;
    return MI_STATUS_SUCCESS;
}

mi_status mi_kv_seq_stats_get(const mi_kv_seq *seq, mi_kv_seq_stats *out) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    const mi_kv_pool *pool = seq->pool;
    kv_clear_error(pool);
    if (!out) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "mi_kv_seq_stats_get: out is NULL");
    mi_kv_seq_stats s;
    memset(&s, 0, sizeof s);
    s.tokens = mi_kv_seq_tokens(seq);
    for (int32_t l = 0; l < pool->params.n_layers; l++) {
        const kv_layer *L = &seq->layers[l];
        s.pages += L->n_pages;
        for (int64_t i = 0; i < L->n_pages; i++) s.shared_pages += pool->info[L->pages[i]].refs > 1;
    }
    const uint64_t pb = pool->layout.page_bytes + pool->layout.meta_bytes;
    s.bytes = (uint64_t)s.pages * pb;
    if (kv_is_quant(pool)) /* each layer's f32 residual, the sequence's own */
        for (int32_t l = 0; l < pool->params.n_layers; l++)
            if (seq->layers[l].resid)
                s.bytes += kv_quant_resid_bytes(pool, seq->layers[l].resid_cap);
    s.shared_bytes = (uint64_t)s.shared_pages * pb;
    *out = s;
    return MI_STATUS_SUCCESS;
}
