/* kv_test_util.h: what the KV cache tests share: a seeded generator, a plain contiguous reference
 * cache ([len][n_kv][hd] rows per layer, as the model keeps it), chunk tensors in every source
 * dtype and layout, and the per-dtype tolerances. */
#ifndef MI_KV_TEST_UTIL_H
#define MI_KV_TEST_UTIL_H

#include "../check.h"
#include "minference_kv.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 1;

static inline uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline int64_t rng_int(int64_t lo, int64_t hi) { /* inclusive */
    return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1));
}

/* Roughly normal values with a per-call magnitude, so that fp8 scales grow within a page. */
static inline float rng_value(float mag) {
    float s = 0.0f;
    for (int i = 0; i < 4; i++)
        s += (float)((double)(rng_next() >> 11) / 9007199254740992.0) - 0.5f;
    return s * mag;
}

/* ------------------------------------------------------------------------------------------ */
/* Reference cache                                                                             */

typedef struct ref_layer {
    float *k, *v; /* [len][H][D] */
    int64_t len, cap;
} ref_layer;

typedef struct ref_seq {
    int32_t n_layers, H, D;
    ref_layer *layers;
} ref_seq;

static inline ref_seq *ref_new(int32_t n_layers, int32_t H, int32_t D) {
    ref_seq *r = calloc(1, sizeof *r);
    r->n_layers = n_layers, r->H = H, r->D = D;
    r->layers = calloc((size_t)n_layers, sizeof *r->layers);
    return r;
}

static inline void ref_free(ref_seq *r) {
    if (!r) return;
    for (int32_t l = 0; l < r->n_layers; l++) free(r->layers[l].k), free(r->layers[l].v);
    free(r->layers);
    free(r);
}

static inline ref_seq *ref_copy(const ref_seq *src) {
    ref_seq *r = ref_new(src->n_layers, src->H, src->D);
    const size_t row = (size_t)src->H * src->D;
    for (int32_t l = 0; l < src->n_layers; l++) {
        ref_layer *d = &r->layers[l];
        const ref_layer *s = &src->layers[l];
        d->len = d->cap = s->len;
        d->k = malloc((s->len + 1) * row * sizeof(float));
        d->v = malloc((s->len + 1) * row * sizeof(float));
        memcpy(d->k, s->k ? s->k : d->k, (size_t)s->len * row * sizeof(float));
        memcpy(d->v, s->v ? s->v : d->v, (size_t)s->len * row * sizeof(float));
    }
    return r;
}

/* Appends n rows k, v [n][H][D]. */
static inline void ref_append(ref_seq *r, int32_t l, const float *k, const float *v, int64_t n) {
    ref_layer *L = &r->layers[l];
    const size_t row = (size_t)r->H * r->D;
    if (L->len + n > L->cap) {
        L->cap = (L->len + n) * 2;
        L->k = realloc(L->k, (size_t)L->cap * row * sizeof(float));
        L->v = realloc(L->v, (size_t)L->cap * row * sizeof(float));
    }
    memcpy(L->k + L->len * row, k, (size_t)n * row * sizeof(float));
    memcpy(L->v + L->len * row, v, (size_t)n * row * sizeof(float));
    L->len += n;
}

/* ------------------------------------------------------------------------------------------ */
/* Chunks                                                                                      */

/* A chunk of n rows: values in f32 [n][H][D] (what the cache should hold, after the source
 * dtype's rounding) and a tensor over them in the source dtype and layout. */
typedef struct chunk {
    float *k, *v;
    void *kdata, *vdata;
    mi_tensor tk, tv;
    int64_t n;
} chunk;

static inline void chunk_free(chunk *c) {
    free(c->k), free(c->v), free(c->kdata), free(c->vdata);
    memset(c, 0, sizeof *c);
}

/* bhld: [B, H, L, D] storage instead of the model's [B, L, H, D]. */
static inline chunk chunk_make(int32_t H, int32_t D, int64_t n, mi_dtype dtype, bool bhld,
                               float mag) {
    chunk c;
    memset(&c, 0, sizeof c);
    c.n = n;
    const size_t count = (size_t)n * H * D, es = mi_dtype_size(dtype);
    c.k = malloc(count * sizeof(float));
    c.v = malloc(count * sizeof(float));
    c.kdata = malloc(count * es);
    c.vdata = malloc(count * es);
    c.tk = bhld ? mi_tensor_bhld(c.kdata, dtype, MI_DEVICE_CPU, 1, H, n, D)
                : mi_tensor_blhd(c.kdata, dtype, MI_DEVICE_CPU, 1, H, n, D);
    c.tv = c.tk;
    c.tv.data = c.vdata;
    for (int kv = 0; kv < 2; kv++) {
        float *ref = kv ? c.v : c.k;
        unsigned char *data = kv ? c.vdata : c.kdata;
        for (int64_t i = 0; i < n; i++)
            for (int32_t h = 0; h < H; h++)
                for (int32_t d = 0; d < D; d++) {
                    float x = rng_value(mag);
                    const size_t at = (size_t)(h * c.tk.stride[1] + i * c.tk.stride[2] + d);
                    if (dtype == MI_DTYPE_F32) {
                        memcpy(data + at * 4, &x, 4);
                    } else {
                        uint16_t u = dtype == MI_DTYPE_F16 ? mi_f32_to_f16(x) : mi_f32_to_bf16(x);
                        memcpy(data + at * 2, &u, 2);
                        x = dtype == MI_DTYPE_F16 ? mi_f16_to_f32(u) : mi_bf16_to_f32(u);
                    }
                    ref[((size_t)i * H + h) * D + d] = x;
                }
    }
    return c;
}

/* ------------------------------------------------------------------------------------------ */
/* Tolerances                                                                                  */

/* The storage rounding of one value, against its f32 original x; scale: the fp8 page scale.
 *   f32: exact.
 *   bf16: round to nearest even on 8 significant bits: half an ulp, <= 2^-8 |x|.
 *   f16: 11 significant bits: <= 2^-11 |x|, plus half the smallest subnormal step (2^-25).
 *   fp8 e4m3: the bound stated in minference_kv.h, 2^-4 |x| + 2^-9 scale. */
/* fp8 codes x - centre, so its rounding is relative to that distance */
static inline bool within_tol(mi_kv_dtype dt, float x, float got, float scale, float centre) {
    const double err = fabs((double)got - (double)x), a = fabs((double)x);
    switch (dt) {
    case MI_KV_F32: return got == x;
    case MI_KV_BF16: return err <= ldexp(a, -8);
    case MI_KV_F16: return err <= ldexp(a, -11) + ldexp(1.0, -25);
    case MI_KV_FP8_E4M3:
        return err <=
               ldexp(fabs((double)x - centre), -4) + ldexp((double)scale, -9) + ldexp(a, -22);
    case MI_KV_KIVI2:
    case MI_KV_KIVI4: break; /* per-group bounds: test_kv_quant.c */
    }
    return false;
}

/* The value a page holds for K (kv = 0) or V of head h, row r, decoded through the layout
 * descriptor only (the way a kernel would). */
static inline float page_value(const mi_kv_page_layout *L, const void *page, int kv, int32_t h,
                               int32_t r, int32_t d) {
    const unsigned char *p = (const unsigned char *)page + (kv ? L->v_offset : L->k_offset) +
                             (size_t)h * L->head_stride + (size_t)r * L->row_stride +
                             (size_t)d * L->elem_bytes;
    uint16_t u;
    float f;
    switch (L->dtype) {
    case MI_KV_F32: memcpy(&f, p, 4); return f;
    case MI_KV_F16: memcpy(&u, p, 2); return mi_f16_to_f32(u);
    case MI_KV_BF16: memcpy(&u, p, 2); return mi_bf16_to_f32(u);
    case MI_KV_FP8_E4M3: {
        float s;
        memcpy(&s,
               (const unsigned char *)page + L->scale_offset +
                   ((size_t)kv * L->n_kv_heads + h) * sizeof(float),
               4);
        memcpy(&u,
               (const unsigned char *)page + L->center_offset +
                   (((size_t)kv * L->n_kv_heads + h) * L->head_dim + d) * sizeof(uint16_t),
               2);
        return mi_bf16_to_f32(u) + mi_fp8_e4m3_to_f32(*p) * s;
    }
    case MI_KV_KIVI2:
    case MI_KV_KIVI4: break; /* codes and group parameters: test_kv_quant.c */
    }
    return NAN;
}

#endif /* MI_KV_TEST_UTIL_H */
