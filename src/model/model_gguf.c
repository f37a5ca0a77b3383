/*
 * model_gguf.c: GGUF v2/v3 reader over a memory map.
 *
 * The whole header (key/values, tensor infos) is walked once at open with a bounds-checked
 * cursor: every length, count and offset is checked against the file size before it is used,
 * with overflow-safe arithmetic, so a truncated or corrupt file is a PARSE_ERROR with a message
 * and never a read past the end. After open, all stored pointers are known to be in range.
 */
#define _POSIX_C_SOURCE 200809L
#include "model_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little endian */
#define GGUF_DEFAULT_ALIGNMENT 32
/* Sanity caps: beyond these a count is corrupt, not large. */
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NESTING 4

typedef struct cursor {
    const unsigned char *base;
    size_t size, pos;
    char *err;
    size_t cap;
} cursor;

static bool need(cursor *c, uint64_t n, const char *what) {
    if (n > c->size - c->pos) {
        mim_fail(c->err, c->cap, MI_STATUS_PARSE_ERROR,
                 "GGUF truncated or corrupt: %s needs %llu bytes at offset %zu, file has %zu", what,
                 (unsigned long long)n, c->pos, c->size);
        return false;
    }
    return true;
}

static bool rd_u32(cursor *c, uint32_t *v, const char *what) {
    if (!need(c, 4, what)) return false;
    const unsigned char *p = c->base + c->pos;
    *v = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    c->pos += 4;
    return true;
}

static bool rd_u64(cursor *c, uint64_t *v, const char *what) {
    uint32_t lo, hi;
    if (!need(c, 8, what) || !rd_u32(c, &lo, what) || !rd_u32(c, &hi, what)) return false;
    *v = (uint64_t)lo | ((uint64_t)hi << 32);
    return true;
}

static bool rd_str(cursor *c, const char **s, size_t *len, const char *what) {
    uint64_t n;
    if (!rd_u64(c, &n, what) || !need(c, n, what)) return false;
    *s = (const char *)(c->base + c->pos);
    *len = (size_t)n;
    c->pos += (size_t)n;
    return true;
}

static size_t scalar_size(uint32_t type) {
    switch (type) {
    case MIM_GGUF_U8:
    case MIM_GGUF_I8:
    case MIM_GGUF_BOOL: return 1;
    case MIM_GGUF_U16:
    case MIM_GGUF_I16: return 2;
    case MIM_GGUF_U32:
    case MIM_GGUF_I32:
    case MIM_GGUF_F32: return 4;
    case MIM_GGUF_U64:
    case MIM_GGUF_I64:
    case MIM_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Skips over one value of the given type, checking every piece. */
static bool skip_value(cursor *c, uint32_t type, int depth, const char *what) {
    size_t sz = scalar_size(type);
    if (sz) return need(c, sz, what) && (c->pos += sz, true);
    if (type == MIM_GGUF_STRING) {
        const char *s;
        size_t n;
        return rd_str(c, &s, &n, what);
    }
    if (type == MIM_GGUF_ARRAY) {
        uint32_t et;
        uint64_t count;
        if (depth >= GGUF_MAX_NESTING) {
            mim_fail(c->err, c->cap, MI_STATUS_PARSE_ERROR,
                     "GGUF corrupt: arrays nested too deep "
                     "in %s",
                     what);
            return false;
        }
        if (!rd_u32(c, &et, what) || !rd_u64(c, &count, what)) return false;
        size_t esz = scalar_size(et);
        if (esz) {
            if (count > UINT64_MAX / esz) return need(c, UINT64_MAX, what);
            return need(c, count * esz, what) && (c->pos += (size_t)(count * esz), true);
        }
        if (et != MIM_GGUF_STRING && et != MIM_GGUF_ARRAY) {
            mim_fail(c->err, c->cap, MI_STATUS_PARSE_ERROR,
                     "GGUF corrupt: unknown array element type %u in %s", et, what);
            return false;
        }
        /* Each element takes at least 8 bytes, which bounds a corrupt count cheaply. */
        if (count > (c->size - c->pos) / 8) return need(c, UINT64_MAX, what);
        for (uint64_t i = 0; i < count; i++)
            if (!skip_value(c, et, depth + 1, what)) return false;
        return true;
    }
    mim_fail(c->err, c->cap, MI_STATUS_PARSE_ERROR, "GGUF corrupt: unknown value type %u in %s",
             type, what);
    return false;
}

static mi_status parse(mim_gguf *g, char *err, size_t cap) {
    cursor c = {g->base, g->size, 0, err, cap};
    uint32_t magic;
    if (!rd_u32(&c, &magic, "magic")) return MI_STATUS_PARSE_ERROR;
    if (magic != GGUF_MAGIC)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "not a GGUF file (bad magic 0x%08x)",
                        magic);
    if (!rd_u32(&c, &g->version, "version")) return MI_STATUS_PARSE_ERROR;
    if (g->version != 2 && g->version != 3)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "unsupported GGUF version %u (2 and 3 are supported)", g->version);
    if (!rd_u64(&c, &g->n_tensors, "tensor count") || !rd_u64(&c, &g->n_kv, "key/value count"))
        return MI_STATUS_PARSE_ERROR;
    /* A key/value takes >= 12 bytes and a tensor info >= 24: larger counts cannot fit. */
    if (g->n_kv > g->size / 12 || g->n_tensors > g->size / 24)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "GGUF corrupt: %llu key/values and %llu tensors cannot fit in %zu bytes",
                        (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, g->size);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
    if (!g->kv || !g->tensors)
        return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory reading GGUF header");

    uint64_t alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        mim_gguf_kv *kv = &g->kv[i];
        if (!rd_str(&c, &kv->key, &kv->key_len, "key") || !rd_u32(&c, &kv->type, "value type"))
            return MI_STATUS_PARSE_ERROR;
        char what[96];
        snprintf(what, sizeof(what), "value of '%.*s'", (int)(kv->key_len < 60 ? kv->key_len : 60),
                 kv->key);
        if (kv->type == MIM_GGUF_ARRAY) {
            size_t at = c.pos;
            if (!rd_u32(&c, &kv->array_type, what) || !rd_u64(&c, &kv->array_count, what))
                return MI_STATUS_PARSE_ERROR;
            kv->value = c.base + c.pos;
            c.pos = at;
        } else {
            kv->value = c.base + c.pos;
        }
        if (!skip_value(&c, kv->type, 0, what)) return MI_STATUS_PARSE_ERROR;
        if (kv->key_len == 17 && memcmp(kv->key, "general.alignment", 17) == 0) {
            if (kv->type != MIM_GGUF_U32)
                return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                                "GGUF corrupt: general.alignment is not a u32");
            uint32_t a;
            memcpy(&a, kv->value, 4);
            if (a == 0 || (a & (a - 1)) != 0)
                return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                                "GGUF corrupt: alignment %u is not a power of two", a);
            alignment = a;
        }
    }

    uint64_t *offsets = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(uint64_t));
    if (!offsets)
        return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory reading GGUF header");
    mi_status st = MI_STATUS_SUCCESS;
    for (uint64_t i = 0; i < g->n_tensors && st == MI_STATUS_SUCCESS; i++) {
        mim_gguf_tensor *t = &g->tensors[i];
        if (!rd_str(&c, &t->name, &t->name_len, "tensor name") ||
            !rd_u32(&c, &t->n_dims, "tensor dims")) {
            st = MI_STATUS_PARSE_ERROR;
            break;
        }
        if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
            st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                          "GGUF corrupt: tensor '%.*s' has %u "
                          "dimensions",
                          (int)t->name_len, t->name, t->n_dims);
            break;
        }
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims && st == MI_STATUS_SUCCESS; d++)
            if (!rd_u64(&c, &t->ne[d], "tensor shape")) st = MI_STATUS_PARSE_ERROR;
        if (st != MI_STATUS_SUCCESS || !rd_u32(&c, &t->type, "tensor type") ||
            !rd_u64(&c, &offsets[i], "tensor offset")) {
            st = MI_STATUS_PARSE_ERROR;
            break;
        }
    }
    if (st == MI_STATUS_SUCCESS) {
        uint64_t data_start = (c.pos + alignment - 1) / alignment * alignment;
        if (g->n_tensors > 0 && data_start > g->size)
            st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                          "GGUF truncated: tensor data would start at %llu, file has %zu bytes",
                          (unsigned long long)data_start, g->size);
        for (uint64_t i = 0; i < g->n_tensors && st == MI_STATUS_SUCCESS; i++) {
            mim_gguf_tensor *t = &g->tensors[i];
            uint64_t n = 1;
            for (int d = 0; d < 4; d++) {
                if (t->ne[d] != 0 && n > UINT64_MAX / t->ne[d]) {
                    st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                                  "GGUF corrupt: tensor '%.*s' shape overflows", (int)t->name_len,
                                  t->name);
                    break;
                }
                n *= t->ne[d];
            }
            if (st != MI_STATUS_SUCCESS) break;
            uint64_t row_bytes;
            if (offsets[i] % alignment != 0) {
                /* aligned data is part of the format, and typed loads rely on it */
                st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                              "GGUF corrupt: tensor '%.*s' data offset %llu is not a multiple of "
                              "the alignment %llu",
                              (int)t->name_len, t->name, (unsigned long long)offsets[i],
                              (unsigned long long)alignment);
                break;
            }
            if (!mim_type_supported(t->type)) {
                /* Size unknown to this reader: record the start only; the loader rejects the
                 * tensor by type name if it is ever needed. */
                if (offsets[i] > g->size - data_start) {
                    st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                                  "GGUF truncated: tensor '%.*s' starts past the end",
                                  (int)t->name_len, t->name);
                    break;
                }
                t->data = g->base + data_start + offsets[i];
                t->nbytes = 0;
                continue;
            }
            if (!mim_type_row_bytes(t->type, t->ne[0], &row_bytes)) {
                st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                              "GGUF corrupt: tensor '%.*s' row of %llu is not a whole number of "
                              "%s blocks",
                              (int)t->name_len, t->name, (unsigned long long)t->ne[0],
                              mim_type_name(t->type));
                break;
            }
            uint64_t rows = t->ne[0] ? n / t->ne[0] : 0;
            if (rows && row_bytes > UINT64_MAX / rows) {
                st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                              "GGUF corrupt: tensor '%.*s' size overflows", (int)t->name_len,
                              t->name);
                break;
            }
            t->nbytes = row_bytes * rows;
            if (offsets[i] > g->size - data_start ||
                t->nbytes > g->size - data_start - offsets[i]) {
                st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                              "GGUF truncated: tensor '%.*s' (%llu bytes at data offset %llu) "
                              "extends past the end of the file (%zu bytes)",
                              (int)t->name_len, t->name, (unsigned long long)t->nbytes,
                              (unsigned long long)offsets[i], g->size);
                break;
            }
            t->data = g->base + data_start + offsets[i];
        }
    }
    free(offsets);
    if (st == MI_STATUS_SUCCESS && g->n_tensors > 1) {
        mim_region *r = malloc(g->n_tensors * sizeof *r);
        if (!r) return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        for (uint64_t i = 0; i < g->n_tensors; i++)
            r[i] = (mim_region){g->tensors[i].data, g->tensors[i].nbytes, g->tensors[i].name,
                                (int)g->tensors[i].name_len};
        st = mim_check_regions(r, g->n_tensors, "GGUF", err, cap);
        free(r);
    }
    return st;
}

mi_status mim_gguf_open_memory(const void *data, size_t size, mim_gguf **out, char *err,
                               size_t cap) {
    if (!out) return mim_fail(err, cap, MI_STATUS_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!data && size) return mim_fail(err, cap, MI_STATUS_INVALID_ARGUMENT, "data is NULL");
    mim_gguf *g = calloc(1, sizeof(*g));
    if (!g) return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    g->base = data;
    g->size = size;
    mi_status st = parse(g, err, cap);
    if (st != MI_STATUS_SUCCESS) {
        mim_gguf_close(g);
        return st;
    }
    *out = g;
    return MI_STATUS_SUCCESS;
}

mi_status mim_gguf_open(const char *path, mim_gguf **out, char *err, size_t cap) {
    if (!path || !out) return mim_fail(err, cap, MI_STATUS_INVALID_ARGUMENT, "path or out is NULL");
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return mim_fail(err, cap, MI_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return mim_fail(err, cap, MI_STATUS_IO_ERROR, "cannot stat %s: %s", path, strerror(errno));
    }
    size_t size = (size_t)sb.st_size;
    if (size == 0) {
        close(fd);
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "%s is empty", path);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return mim_fail(err, cap, MI_STATUS_IO_ERROR, "cannot map %s: %s", path, strerror(errno));
    mi_status st = mim_gguf_open_memory(map, size, out, err, cap);
    if (st != MI_STATUS_SUCCESS) {
        munmap(map, size);
        return st;
    }
    (*out)->mapped = true;
    return MI_STATUS_SUCCESS;
}

void mim_gguf_close(mim_gguf *g) {
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g->kv);
    free(g->tensors);
    free(g);
}

const mim_gguf_kv *mim_gguf_find(const mim_gguf *g, const char *key) {
    size_t n = strlen(key);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key_len == n && memcmp(g->kv[i].key, key, n) == 0) return &g->kv[i];
    return NULL;
}

const mim_gguf_tensor *mim_gguf_find_tensor(const mim_gguf *g, const char *name) {
    size_t n = strlen(name);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].name_len == n && memcmp(g->tensors[i].name, name, n) == 0)
            return &g->tensors[i];
    return NULL;
}

static double scalar_num(uint32_t type, const unsigned char *p, bool *ok) {
    *ok = true;
    switch (type) {
    case MIM_GGUF_U8:
    case MIM_GGUF_BOOL: return p[0];
    case MIM_GGUF_I8: return (int8_t)p[0];
    case MIM_GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case MIM_GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case MIM_GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case MIM_GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case MIM_GGUF_F32: {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    case MIM_GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    case MIM_GGUF_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    case MIM_GGUF_F64: {
        double v;
        memcpy(&v, p, 8);
        return v;
    }
    default: *ok = false; return 0;
    }
}

bool mim_gguf_get_i64(const mim_gguf *g, const char *key, int64_t *out) {
    const mim_gguf_kv *kv = mim_gguf_find(g, key);
    bool ok = false;
    if (!kv) return false;
    if (kv->type == MIM_GGUF_U64 || kv->type == MIM_GGUF_I64) {
        memcpy(out, kv->value, 8); /* exact beyond 2^53 */
        return true;
    }
    double v = scalar_num(kv->type, kv->value, &ok);
    if (ok) *out = (int64_t)v;
    return ok;
}

bool mim_gguf_get_f64(const mim_gguf *g, const char *key, double *out) {
    const mim_gguf_kv *kv = mim_gguf_find(g, key);
    bool ok = false;
    if (!kv) return false;
    double v = scalar_num(kv->type, kv->value, &ok);
    if (ok) *out = v;
    return ok;
}

bool mim_gguf_get_bool(const mim_gguf *g, const char *key, bool *out) {
    int64_t v;
    if (!mim_gguf_get_i64(g, key, &v)) return false;
    *out = v != 0;
    return true;
}

bool mim_gguf_get_str(const mim_gguf *g, const char *key, const char **s, size_t *len) {
    const mim_gguf_kv *kv = mim_gguf_find(g, key);
    if (!kv || kv->type != MIM_GGUF_STRING) return false;
    const unsigned char *p = kv->value;
    mim_gguf_next_str(&p, s, len);
    return true;
}

void mim_gguf_next_str(const unsigned char **cursor, const char **s, size_t *len) {
    uint64_t n;
    memcpy(&n, *cursor, 8);
    *s = (const char *)(*cursor + 8);
    *len = (size_t)n;
    *cursor += 8 + n;
}

double mim_gguf_array_num(const mim_gguf_kv *kv, uint64_t i) {
    bool ok;
    size_t sz = scalar_size(kv->array_type);
    if (kv->type != MIM_GGUF_ARRAY || !sz || i >= kv->array_count) return 0;
    return scalar_num(kv->array_type, kv->value + i * sz, &ok);
}
