/*
 * kv_file.c: session files. A versioned, checksummed, little-endian image of one sequence
 * (format byte by byte: docs/kv-cache.md):
 *   header (128 bytes, its own CRC32C)  model identity, storage geometry, token count
 *   body                                per layer: rows, then each page's valid rows per head
 *                                       (K then V) and, for fp8, its scales and centres
 *   trailer (4 bytes)                   CRC32C of the body
 * Saving writes a temporary file in the same folder, syncs it and renames it over the target;
 * loading reads into a new sequence and swaps it in only when everything checked out.
 */
#include "kv_internal.h"
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "session files store rows in the host's byte order, which must be little-endian"
#endif

#define KV_MAGIC "MIKVSEQ" /* 8 bytes with its NUL */
/* 1: rows in the pages' element format; 2: the same plus the KIVI dtypes (group size and
 * residual length in the header, per layer the quantized row count and the f32 residual);
 * 3: fp8 pages with their centres after the scales (a version 1 fp8 file reads with centres 0).
 * Caches of the other dtypes are still written as version 1. */
#define KV_VERSION 3u
#define KV_HEADER_BYTES 128

uint64_t mi_kv_hash64(uint64_t seed, const void *data, size_t n) {
    uint64_t h = seed ^ 0xcbf29ce484222325ull;
    const unsigned char *p = data;
    for (size_t i = 0; i < n && p; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* ------------------------------------------------------------------------------------------ */
/* CRC32C (Castagnoli): the SSE4.2 instruction where built for it, else a table per call.      */

typedef struct crc32c {
    uint32_t crc;
#if !defined(__SSE4_2__)
    uint32_t table[256];
#endif
} crc32c;

static void crc_init(crc32c *c) {
    c->crc = 0xffffffffu;
#if !defined(__SSE4_2__)
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t x = i;
        for (int k = 0; k < 8; k++) x = (x >> 1) ^ (0x82f63b78u & (0u - (x & 1u)));
        c->table[i] = x;
    }
#endif
}

static void crc_update(crc32c *c, const void *data, size_t n) {
    const unsigned char *p = data;
    uint32_t crc = c->crc;
#if defined(__SSE4_2__)
    uint64_t crc64 = crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        crc64 = _mm_crc32_u64(crc64, w);
    }
    crc = (uint32_t)crc64;
    for (; n; n--, p++) crc = _mm_crc32_u8(crc, *p);
#else
    for (; n; n--, p++) crc = (crc >> 8) ^ c->table[(crc ^ *p) & 0xffu];
#endif
    c->crc = crc;
}

static uint32_t crc_final(const crc32c *c) { return c->crc ^ 0xffffffffu; }

static uint32_t crc_of(const void *data, size_t n) {
    crc32c c;
    crc_init(&c);
    crc_update(&c, data, n);
    return crc_final(&c);
}

/* ------------------------------------------------------------------------------------------ */
/* Header                                                                                      */

static void put32(unsigned char *p, uint32_t x) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(x >> (8 * i));
}
static void put64(unsigned char *p, uint64_t x) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(x >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) x |= (uint32_t)p[i] << (8 * i);
    return x;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)p[i] << (8 * i);
    return x;
}

typedef struct kv_header {
    uint32_t version;
    mi_kv_model_id id;
    uint32_t dtype, page_tokens;
    uint64_t n_tokens;
    uint32_t quant_group, quant_residual; /* version 2, KIVI; else 0 */
} kv_header;

static void header_encode(const kv_header *h, unsigned char *b) {
    memset(b, 0, KV_HEADER_BYTES);
    memcpy(b, KV_MAGIC, 8);
    put32(b + 8, h->version);
    put32(b + 12, KV_HEADER_BYTES);
    memcpy(b + 16, h->id.arch, strnlen(h->id.arch, sizeof h->id.arch));
    put32(b + 48, (uint32_t)h->id.n_layers);
    put32(b + 52, (uint32_t)h->id.n_heads);
    put32(b + 56, (uint32_t)h->id.n_kv_heads);
    put32(b + 60, (uint32_t)h->id.head_dim);
    put32(b + 64, (uint32_t)h->id.hidden);
    put32(b + 68, (uint32_t)h->id.vocab);
    put64(b + 72, h->id.weights_hash);
    put32(b + 80, h->dtype);
    put32(b + 84, h->page_tokens);
    put64(b + 88, h->n_tokens);
    put32(b + 96, h->quant_group);
    put32(b + 100, h->quant_residual);
    /* 104..123 reserved, zero */
    put32(b + 124, crc_of(b, 124));
}

static void header_decode(const unsigned char *b, kv_header *h) {
    memset(h, 0, sizeof *h);
    h->version = get32(b + 8);
    memcpy(h->id.arch, b + 16, 32);
    h->id.arch[31] = 0;
    h->id.n_layers = (int32_t)get32(b + 48);
    h->id.n_heads = (int32_t)get32(b + 52);
    h->id.n_kv_heads = (int32_t)get32(b + 56);
    h->id.head_dim = (int32_t)get32(b + 60);
    h->id.hidden = (int32_t)get32(b + 64);
    h->id.vocab = (int32_t)get32(b + 68);
    h->id.weights_hash = get64(b + 72);
    h->dtype = get32(b + 80);
    h->page_tokens = get32(b + 84);
    h->n_tokens = get64(b + 88);
    if (h->version >= 2) {
        h->quant_group = get32(b + 96);
        h->quant_residual = get32(b + 100);
    }
}

static mi_status check_id(const mi_kv_pool *pool, const mi_kv_model_id *id, const char *fn) {
    if (!id) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: the model identity is NULL", fn);
    if (!memchr(id->arch, 0, sizeof id->arch))
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: arch is not NUL-terminated", fn);
    const mi_kv_pool_params *p = &pool->params;
    if (id->n_layers != p->n_layers || id->n_kv_heads != p->n_kv_heads ||
        id->head_dim != p->head_dim)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                       "%s: the model identity (%d layers, %d KV heads, head_dim %d) does not "
                       "match the pool's (%d, %d, %d)",
                       fn, id->n_layers, id->n_kv_heads, id->head_dim, p->n_layers, p->n_kv_heads,
                       p->head_dim);
    return MI_STATUS_SUCCESS;
}

static int64_t pages_of_rows(int64_t rows, int32_t P) { return rows / P + (rows % P != 0); }

/* ------------------------------------------------------------------------------------------ */
/* Page images: the valid rows of every head, K then V, then the fp8 scales                    */

/* KIVI: per head, the f16 pairs of its key groups and of its value rows. */
static size_t k_params_bytes(const mi_kv_page_layout *L, int32_t rows) {
    return L->bits ? (size_t)(rows / L->group_size) * (size_t)L->head_dim * 4 : 0;
}
static size_t v_params_bytes(const mi_kv_page_layout *L, int32_t rows) {
    return L->bits ? (size_t)rows * (size_t)(L->head_dim / L->group_size) * 4 : 0;
}

/* fp8: the centres' bytes in an image of file version v */
static size_t centre_bytes(const mi_kv_page_layout *L, uint32_t v) {
    return L->has_scales && v >= 3 ? 2 * (size_t)L->n_kv_heads * (size_t)L->head_dim * 2 : 0;
}

static size_t image_bytes(const mi_kv_page_layout *L, uint32_t v, int32_t rows) {
    return 2 * (size_t)L->n_kv_heads * (size_t)rows * L->row_stride +
           (L->has_scales ? 2 * (size_t)L->n_kv_heads * sizeof(float) : 0) + centre_bytes(L, v) +
           (size_t)L->n_kv_heads * (k_params_bytes(L, rows) + v_params_bytes(L, rows));
}

/* KIVI parameter regions of head h (contiguous per head: groups, then rows, in order). */
static size_t k_params_at(const mi_kv_page_layout *L, int32_t h) {
    return L->k_param_offset + (size_t)h * k_params_bytes(L, L->page_tokens);
}
static size_t v_params_at(const mi_kv_page_layout *L, int32_t h) {
    return L->v_param_offset + (size_t)h * v_params_bytes(L, L->page_tokens);
}

static void page_to_image(const mi_kv_page_layout *L, uint32_t v, const unsigned char *page,
                          int32_t rows, unsigned char *img) {
    const size_t n = (size_t)rows * L->row_stride;
    for (int kv = 0; kv < 2; kv++)
        for (int32_t h = 0; h < L->n_kv_heads; h++, img += n)
            memcpy(img, page + (kv ? L->v_offset : L->k_offset) + (size_t)h * L->head_stride, n);
    if (L->has_scales) {
        memcpy(img, page + L->scale_offset, 2 * (size_t)L->n_kv_heads * sizeof(float));
        img += 2 * (size_t)L->n_kv_heads * sizeof(float);
        memcpy(img, page + L->center_offset, centre_bytes(L, v));
    }
    for (int32_t h = 0; L->bits && h < L->n_kv_heads; h++) {
        memcpy(img, page + k_params_at(L, h), k_params_bytes(L, rows));
        img += k_params_bytes(L, rows);
        memcpy(img, page + v_params_at(L, h), v_params_bytes(L, rows));
        img += v_params_bytes(L, rows);
    }
}

static void image_to_page(const mi_kv_page_layout *L, uint32_t v, const unsigned char *img,
                          int32_t rows, unsigned char *page) {
    const size_t n = (size_t)rows * L->row_stride;
    for (int kv = 0; kv < 2; kv++)
        for (int32_t h = 0; h < L->n_kv_heads; h++, img += n)
            memcpy(page + (kv ? L->v_offset : L->k_offset) + (size_t)h * L->head_stride, img, n);
    if (L->has_scales) {
        memcpy(page + L->scale_offset, img, 2 * (size_t)L->n_kv_heads * sizeof(float));
        img += 2 * (size_t)L->n_kv_heads * sizeof(float);
        /* a version 1 fp8 page had no centres: they are 0 */
        memset(page + L->center_offset, 0, 2 * (size_t)L->n_kv_heads * (size_t)L->head_dim * 2);
        memcpy(page + L->center_offset, img, centre_bytes(L, v));
    }
    for (int32_t h = 0; L->bits && h < L->n_kv_heads; h++) {
        memcpy(page + k_params_at(L, h), img, k_params_bytes(L, rows));
        img += k_params_bytes(L, rows);
        memcpy(page + v_params_at(L, h), img, v_params_bytes(L, rows));
        img += v_params_bytes(L, rows);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Save                                                                                        */

typedef struct writer {
    FILE *f;
    crc32c crc;
    int err; /* errno of the first failure, 0 if none */
} writer;

static void wr(writer *w, const void *p, size_t n, bool checksum) {
    if (w->err || n == 0) return;
    if (fwrite(p, 1, n, w->f) != n) {
        w->err = errno ? errno : EIO;
        return;
    }
    if (checksum) crc_update(&w->crc, p, n);
}

mi_status mi_kv_seq_save(const mi_kv_seq *seq, const char *path, const mi_kv_model_id *id) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    const mi_kv_pool *pool = seq->pool;
    kv_clear_error(pool);
    static const char fn[] = "mi_kv_seq_save";
    if (!path || !path[0]) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: no path", fn);
    mi_status st = check_id(pool, id, fn);
    if (st != MI_STATUS_SUCCESS) return st;
    const mi_kv_page_layout *L = &pool->layout;
    const int32_t P = L->page_tokens;

    kv_header h;
    memset(&h, 0, sizeof h);
    const bool quant = kv_is_quant(pool);
    h.version = quant ? 2u : L->has_scales ? 3u : 1u;
    if (quant) {
        h.quant_group = (uint32_t)pool->params.quant_group;
        h.quant_residual = (uint32_t)pool->params.quant_residual;
    }
    h.id = *id;
    h.dtype = (uint32_t)L->dtype;
    h.page_tokens = (uint32_t)P;
    h.n_tokens = (uint64_t)mi_kv_seq_tokens(seq);
    unsigned char hb[KV_HEADER_BYTES];
    header_encode(&h, hb);

    unsigned char *img = malloc(image_bytes(L, h.version, P));
    if (!img) return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    /* owner-only: a cache holds the text of the conversation */
    mi_atomic_file af;
    const int oe = mi_atomic_open(&af, path, 0600);
    if (oe) {
        free(img);
        return kv_fail(pool, MI_STATUS_IO_ERROR, "%s: cannot create a temporary file for %s: %s",
                       fn, path, strerror(oe));
    }
    writer w;
    memset(&w, 0, sizeof w);
    crc_init(&w.crc);
    w.f = af.f;
    wr(&w, hb, sizeof hb, false);
    for (int32_t l = 0; l < pool->params.n_layers && !w.err; l++) {
        const kv_layer *ly = &seq->layers[l];
        unsigned char rb[8];
        put64(rb, (uint64_t)ly->len);
        wr(&w, rb, 8, true);
        const int64_t paged = quant ? ly->qlen : ly->len;
        if (quant) {
            put64(rb, (uint64_t)paged);
            wr(&w, rb, 8, true);
        }
        for (int64_t i = 0; i < ly->n_pages && !w.err; i++) {
            const int32_t rows = (int32_t)(paged - i * P < P ? paged - i * P : P);
            page_to_image(L, h.version, kv_page(pool, ly->pages[i]), rows, img);
            wr(&w, img, image_bytes(L, h.version, rows), true);
        }
        for (int kv = 0; quant && kv < 2; kv++)
            for (int32_t hh = 0; hh < L->n_kv_heads && ly->len > paged; hh++)
                wr(&w, kv_resid_row(pool, ly, kv, hh, 0),
                   (size_t)(ly->len - paged) * (size_t)L->head_dim * sizeof(float), true);
    }
    unsigned char cb[4];
    put32(cb, crc_final(&w.crc));
    wr(&w, cb, 4, false);
    free(img);
    if (w.err) {
        mi_atomic_abort(&af);
    } else {
        w.err = mi_atomic_commit(&af);
    }
    if (w.err)
        return kv_fail(pool, MI_STATUS_IO_ERROR, "%s: cannot write %s: %s", fn, path,
                       strerror(w.err));
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Load                                                                                        */

typedef struct reader {
    FILE *f;
    crc32c crc;
    uint64_t size, pos; /* the file's bytes, those read */
} reader;

/* MI_STATUS_PARSE_ERROR for a short file, MI_STATUS_IO_ERROR for a read error. */
static mi_status rd(const mi_kv_pool *pool, reader *r, void *p, size_t n, bool checksum,
                    const char *path, const char *what) {
    if (n == 0) return MI_STATUS_SUCCESS;
    errno = 0;
    if (fread(p, 1, n, r->f) != n) {
        if (ferror(r->f))
            return kv_fail(pool, MI_STATUS_IO_ERROR, "mi_kv_seq_load: cannot read %s: %s", path,
                           strerror(errno ? errno : EIO));
        return kv_fail(pool, MI_STATUS_PARSE_ERROR,
                       "mi_kv_seq_load: %s is truncated (it ends inside %s)", path, what);
    }
    if (checksum) crc_update(&r->crc, p, n);
    r->pos += n;
    return MI_STATUS_SUCCESS;
}

static mi_status load_body(mi_kv_pool *pool, reader *r, const kv_header *h, const char *path,
                           mi_kv_seq *seq) {
    const mi_kv_page_layout *L = &pool->layout;
    const int32_t P = L->page_tokens;
    const uint32_t v = h->version;
    unsigned char *img = malloc(image_bytes(L, v, P));
    if (!img) return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "mi_kv_seq_load: out of memory");
    mi_status st = MI_STATUS_SUCCESS;
    uint64_t most = 0;
    for (int32_t l = 0; l < pool->params.n_layers && st == MI_STATUS_SUCCESS; l++) {
        unsigned char rb[8];
        if ((st = rd(pool, r, rb, 8, true, path, "a layer's row count")) != MI_STATUS_SUCCESS)
            break;
        const uint64_t rows = get64(rb);
        /* the header (checked by its own CRC) bounds every layer, so a corrupt count cannot
         * make us allocate more than the file claims to hold */
        if (rows > h->n_tokens) {
            st = kv_fail(pool, MI_STATUS_PARSE_ERROR,
                         "mi_kv_seq_load: %s is corrupt (layer %d has %llu rows of %llu tokens)",
                         path, l, (unsigned long long)rows, (unsigned long long)h->n_tokens);
            break;
        }
        if (rows > most) most = rows;
        kv_layer *ly = &seq->layers[l];
        const bool quant = kv_is_quant(pool);
        uint64_t paged = rows, resid_bytes = 0;
        if (quant) {
            if ((st = rd(pool, r, rb, 8, true, path, "a layer's quantized row count")) !=
                MI_STATUS_SUCCESS)
                break;
            paged = get64(rb);
            if (paged > rows || paged % (uint64_t)L->group_size != 0 ||
                rows - paged > (uint64_t)pool->q_resid_cap) {
                st = kv_fail(pool, MI_STATUS_PARSE_ERROR,
                             "mi_kv_seq_load: %s is corrupt (layer %d: %llu quantized of %llu "
                             "rows)",
                             path, l, (unsigned long long)paged, (unsigned long long)rows);
                break;
            }
            resid_bytes = 2 * (uint64_t)L->n_kv_heads * (rows - paged) * (uint64_t)L->head_dim *
                          sizeof(float);
            /* at least a group of room, as after an append (truncation needs it) */
            int32_t cap = (int32_t)(rows - paged);
            if (cap < L->group_size) cap = L->group_size;
            if (rows > 0 && !(ly->resid = malloc(kv_quant_resid_bytes(pool, cap)))) {
                st = kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "mi_kv_seq_load: out of memory");
                break;
            }
            if (rows > 0) ly->resid_cap = cap;
            ly->len = (int64_t)rows;
            ly->qlen = (int64_t)paged;
        }
        const int64_t n_pages = pages_of_rows((int64_t)paged, P);
        if (n_pages == 0 && resid_bytes == 0) continue;
        /* nor can a short file make us take pages for rows it does not hold */
        /* (compared without forming the product, which a huge count would overflow) */
        const uint64_t remain = r->size - r->pos, full = paged / (uint64_t)P;
        const uint64_t page_bytes = image_bytes(L, v, P);
        if (full > remain / page_bytes ||
            full * page_bytes + image_bytes(L, v, (int32_t)(paged % (uint64_t)P)) + resid_bytes >
                remain) {
            st = kv_fail(pool, MI_STATUS_PARSE_ERROR,
                         "mi_kv_seq_load: %s is truncated (layer %d claims %llu rows, %llu bytes "
                         "remain)",
                         path, l, (unsigned long long)rows, (unsigned long long)remain);
            break;
        }
        ly->pages = n_pages ? malloc((size_t)n_pages * sizeof(int32_t)) : NULL;
        if (n_pages && !ly->pages) {
            st = kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "mi_kv_seq_load: out of memory");
            break;
        }
        ly->cap_pages = n_pages;
        if ((st = kv_pages_acquire(pool, n_pages, ly->pages)) != MI_STATUS_SUCCESS) break;
        ly->n_pages = n_pages; /* owned from here: released with the sequence on failure */
        ly->len = (int64_t)rows;
        for (int64_t i = 0; i < n_pages && st == MI_STATUS_SUCCESS; i++) {
            const int32_t n = (int32_t)((int64_t)paged - i * P < P ? (int64_t)paged - i * P : P);
            if ((st = rd(pool, r, img, image_bytes(L, v, n), true, path, "a page")) !=
                MI_STATUS_SUCCESS)
                break;
            const int32_t id = ly->pages[i];
            image_to_page(L, v, img, n, kv_page(pool, id));
            pool->info[id].fill = n;
        }
        for (int kv = 0; quant && kv < 2 && st == MI_STATUS_SUCCESS; kv++)
            for (int32_t hh = 0; hh < L->n_kv_heads && rows > paged; hh++)
                if ((st = rd(pool, r, kv_resid_row(pool, ly, kv, hh, 0),
                             (size_t)(rows - paged) * (size_t)L->head_dim * sizeof(float), true,
                             path, "a residual")) != MI_STATUS_SUCCESS)
                    break;
    }
    free(img);
    if (st == MI_STATUS_SUCCESS && most != h->n_tokens)
        st = kv_fail(pool, MI_STATUS_PARSE_ERROR,
                     "mi_kv_seq_load: %s is corrupt (%llu tokens in the header, %llu rows stored)",
                     path, (unsigned long long)h->n_tokens, (unsigned long long)most);
    return st;
}

mi_status mi_kv_seq_load(mi_kv_seq *seq, const char *path, const mi_kv_model_id *id) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    mi_kv_pool *pool = seq->pool;
    kv_clear_error(pool);
    static const char fn[] = "mi_kv_seq_load";
    if (!path || !path[0]) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: no path", fn);
    mi_status st = check_id(pool, id, fn);
    if (st != MI_STATUS_SUCCESS) return st;

    reader r;
    memset(&r, 0, sizeof r);
    crc_init(&r.crc);
    r.f = fopen(path, "rb");
    long size = -1;
    int e = errno;
    if (r.f && fseek(r.f, 0, SEEK_END) == 0 && (size = ftell(r.f)) >= 0 &&
        fseek(r.f, 0, SEEK_SET) == 0)
        r.size = (uint64_t)size;
    else
        e = errno;
    if (!r.f || size < 0) {
        if (r.f) fclose(r.f);
        return kv_fail(pool, MI_STATUS_IO_ERROR, "%s: cannot open %s: %s", fn, path, strerror(e));
    }
    unsigned char hb[KV_HEADER_BYTES];
    kv_header h;
    mi_kv_seq *fresh = NULL;
    st = rd(pool, &r, hb, sizeof hb, false, path, "the header");
    if (st == MI_STATUS_SUCCESS) {
        header_decode(hb, &h);
        if (memcmp(hb, KV_MAGIC, 8) != 0)
            st = kv_fail(pool, MI_STATUS_PARSE_ERROR, "%s: %s is not a KV session file", fn, path);
        else if (h.version > KV_VERSION)
            st = kv_fail(pool, MI_STATUS_UNSUPPORTED,
                         "%s: %s has format version %u; this library reads up to %u", fn, path,
                         h.version, KV_VERSION);
        else if (h.version == 0 || get32(hb + 12) != KV_HEADER_BYTES ||
                 get32(hb + 124) != crc_of(hb, 124))
            st = kv_fail(pool, MI_STATUS_PARSE_ERROR, "%s: %s has a corrupt header", fn, path);
    }
    if (st == MI_STATUS_SUCCESS &&
        (strcmp(h.id.arch, id->arch) != 0 || h.id.n_layers != id->n_layers ||
         h.id.n_heads != id->n_heads || h.id.n_kv_heads != id->n_kv_heads ||
         h.id.head_dim != id->head_dim || h.id.hidden != id->hidden || h.id.vocab != id->vocab ||
         h.id.weights_hash != id->weights_hash))
        st = kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                     "%s: %s belongs to another model: %s with %d layers, %d/%d heads, head_dim "
                     "%d, hidden %d, vocab %d, weights hash %016llx; this one is %s with %d, "
                     "%d/%d, %d, %d, %d, %016llx",
                     fn, path, h.id.arch, h.id.n_layers, h.id.n_heads, h.id.n_kv_heads,
                     h.id.head_dim, h.id.hidden, h.id.vocab, (unsigned long long)h.id.weights_hash,
                     id->arch, id->n_layers, id->n_heads, id->n_kv_heads, id->head_dim, id->hidden,
                     id->vocab, (unsigned long long)id->weights_hash);
    if (st == MI_STATUS_SUCCESS && kv_is_quant(pool) && h.dtype == (uint32_t)pool->layout.dtype &&
        (h.quant_group != (uint32_t)pool->params.quant_group ||
         h.quant_residual != (uint32_t)pool->params.quant_residual))
        st = kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                     "%s: %s stores KIVI groups of %u with a residual of %u; the pool's are %d "
                     "and %d",
                     fn, path, h.quant_group, h.quant_residual, pool->params.quant_group,
                     pool->params.quant_residual);
    if (st == MI_STATUS_SUCCESS && (h.dtype != (uint32_t)pool->layout.dtype ||
                                    h.page_tokens != (uint32_t)pool->layout.page_tokens))
        st = kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                     "%s: %s stores %s pages of %u tokens; the pool keeps %s pages of %d", fn, path,
                     mi_kv_dtype_name((mi_kv_dtype)h.dtype), h.page_tokens,
                     mi_kv_dtype_name(pool->layout.dtype), pool->layout.page_tokens);
    /* every stored row takes at least a byte, so a count beyond the file's size is corrupt
     * (and would overflow the page arithmetic further on) */
    if (st == MI_STATUS_SUCCESS && h.n_tokens > r.size)
        st = kv_fail(pool, MI_STATUS_PARSE_ERROR,
                     "%s: %s is truncated or corrupt (its header claims %llu tokens, but the file "
                     "holds %llu bytes)",
                     fn, path, (unsigned long long)h.n_tokens, (unsigned long long)r.size);
    if (st == MI_STATUS_SUCCESS && !(fresh = kv_seq_new(pool)))
        st = kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "%s: out of memory for a KV sequence", fn);
    if (st == MI_STATUS_SUCCESS) st = load_body(pool, &r, &h, path, fresh);
    if (st == MI_STATUS_SUCCESS) {
        unsigned char cb[4];
        st = rd(pool, &r, cb, 4, false, path, "the checksum");
        if (st == MI_STATUS_SUCCESS && get32(cb) != crc_final(&r.crc))
            st = kv_fail(pool, MI_STATUS_PARSE_ERROR,
                         "%s: %s is corrupt (its checksum does not match its contents)", fn, path);
        if (st == MI_STATUS_SUCCESS && fgetc(r.f) != EOF)
            st = kv_fail(pool, MI_STATUS_PARSE_ERROR,
                         "%s: %s is corrupt (bytes follow the checksum)", fn, path);
    }
    fclose(r.f);
    if (st != MI_STATUS_SUCCESS) {
        mi_kv_seq_destroy(fresh);
        return st;
    }
    /* the metadata is derived, never stored: rebuilt once the rows are known to be intact */
    for (int32_t l = 0; l < pool->params.n_layers; l++)
        for (int64_t i = 0; i < fresh->layers[l].n_pages; i++)
            kv_meta_recompute(pool, fresh->layers[l].pages[i]);
    kv_layer *old = seq->layers;
    seq->layers = fresh->layers;
    fresh->layers = old;
    mi_kv_seq_destroy(fresh); /* releases seq's former pages */
    return MI_STATUS_SUCCESS;
}
