/*
 * kv_quant.c: KIVI pages (2- or 4-bit asymmetric codes). Keys are quantized per channel over a
 * group of group_size tokens, values per token over a group of group_size channels, each group
 * with an f16 scale and minimum: x' = code * scale + min, code = round((x - min) / scale)
 * clamped to 0..2^bits-1. The newest rows stay in an f32 residual per layer and are quantized a
 * whole group at a time once the residual would hold more than residual_length rows, so a key
 * group is always complete when it is quantized (its min and max are final).
 *
 * Also here: the page reader (any dtype, one head's rows to f32) and the fused kernels the
 * attention uses on quantized pages (scores from codes, value accumulation from codes).
 */
#include "kv_internal.h"
#include "kv_quant.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static int64_t pages_for(int64_t rows, int32_t P) { return (rows + P - 1) / P; }

/* ------------------------------------------------------------------------------------------ */
/* Codec                                                                                       */

static float f16_at(const unsigned char *p) { return kv_f16(p); }

/* Rounds to f16 without overflowing to infinity (KV values beyond f16 saturate). */
static uint16_t f16_of(float x) {
    if (!(x == x)) x = 0.0f;
    if (x > 65504.0f) x = 65504.0f;
    if (x < -65504.0f) x = -65504.0f;
    return mi_f32_to_f16(x);
}

static void put_pair(unsigned char *p, float scale, float mn) {
    const uint16_t s = f16_of(scale), z = f16_of(mn);
    memcpy(p, &s, 2);
    memcpy(p + 2, &z, 2);
}

static inline int code_at(const unsigned char *row, int32_t d, int bits) {
    if (bits == 2) return (row[d >> 2] >> ((d & 3) * 2)) & 3;
    return (row[d >> 1] >> ((d & 1) * 4)) & 15;
}

/* Scale and min of one group from its min and max: the stored (f16-rounded) values. */
static void group_params(float mn, float mx, int bits, float *scale, float *zero) {
    const float maxq = (float)((1 << bits) - 1);
    unsigned char pair[4];
    put_pair(pair, (mx - mn) / maxq, mn);
    *scale = f16_at(pair);
    *zero = f16_at(pair + 2);
}

static void minmax(const float *x, int64_t n, int64_t stride, float *mn, float *mx) {
    float a = INFINITY, b = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i * stride];
        if (!isfinite(v)) continue;
        a = v < a ? v : a;
        b = v > b ? v : b;
    }
    if (a > b) a = b = 0.0f; /* no finite value */
    *mn = a, *mx = b;
}

static unsigned char *code_row(const mi_kv_page_layout *L, unsigned char *page, int kv, int32_t h,
                               int32_t r) {
    return page + (kv ? L->v_offset : L->k_offset) + (size_t)h * L->head_stride +
           (size_t)r * L->row_stride;
}

static unsigned char *k_param(const mi_kv_page_layout *L, const unsigned char *page, int32_t h,
                              int32_t g, int32_t d) {
    const size_t groups = (size_t)(L->page_tokens / L->group_size);
    return (unsigned char *)page + L->k_param_offset +
           (((size_t)h * groups + (size_t)g) * (size_t)L->head_dim + (size_t)d) * 4;
}

static unsigned char *v_param(const mi_kv_page_layout *L, const unsigned char *page, int32_t h,
                              int32_t r, int32_t c) {
    const size_t groups = (size_t)(L->head_dim / L->group_size);
    return (unsigned char *)page + L->v_param_offset +
           (((size_t)h * (size_t)L->page_tokens + (size_t)r) * groups + (size_t)c) * 4;
}

/* Keys rows r0..r0+G-1 of head h (rows[i]: head_dim floats) as one group per channel. */
/* The codes of n values: round((x - min) / scale) clamped to 0..maxq, in a form that
 * vectorizes (a NaN or a value below the min gives 0, one above the max maxq; a group whose
 * scale is not positive codes 0). */
static inline void quant_codes(const float *restrict x, const float *restrict scale,
                               const float *restrict zero, int32_t n, int maxq,
                               uint8_t *restrict code) {
    const float top = (float)maxq;
    for (int32_t d = 0; d < n; d++) {
        float c = rintf((x[d] - zero[d]) / scale[d]);
        c = c > 0.0f ? c : 0.0f; /* also NaN, and a zero scale's inf or NaN */
        c = c < top ? c : top;
        code[d] = scale[d] > 0.0f ? (uint8_t)c : 0;
    }
}

/* Packs n codes of `bits` bits into a row, channel d at bit d * bits. */
static inline void pack_codes(const uint8_t *restrict code, int32_t n, int bits,
                              unsigned char *restrict row) {
    if (bits == 2) {
        for (int32_t j = 0; j < n / 4; j++)
            row[j] = (unsigned char)(code[4 * j] | code[4 * j + 1] << 2 | code[4 * j + 2] << 4 |
                                     code[4 * j + 3] << 6);
    } else {
        for (int32_t j = 0; j < n / 2; j++)
            row[j] = (unsigned char)(code[2 * j] | code[2 * j + 1] << 4);
    }
}

/* One key group of head h (rows r0..r0+G-1 of the page): scale and min per channel. */
static void quant_k_group(const mi_kv_page_layout *L, unsigned char *page, int32_t h, int32_t r0,
                          const float *const *rows) {
    const int32_t G = L->group_size, hd = L->head_dim, bits = L->bits, maxq = (1 << bits) - 1;
    float scale[MI_KV_MAX_HEAD_DIM], zero[MI_KV_MAX_HEAD_DIM], mn[MI_KV_MAX_HEAD_DIM],
        mx[MI_KV_MAX_HEAD_DIM];
    uint8_t code[MI_KV_MAX_HEAD_DIM];
    /* min and max per channel over the group's finite values, row by row (contiguous) */
    for (int32_t d = 0; d < hd; d++) mn[d] = INFINITY, mx[d] = -INFINITY;
    for (int32_t i = 0; i < G; i++) {
        const float *x = rows[i];
        for (int32_t d = 0; d < hd; d++) {
            const bool ok = isfinite(x[d]);
            mn[d] = ok && x[d] < mn[d] ? x[d] : mn[d];
            mx[d] = ok && x[d] > mx[d] ? x[d] : mx[d];
        }
    }
    for (int32_t d = 0; d < hd; d++) {
        if (mn[d] > mx[d]) mn[d] = mx[d] = 0.0f;
        group_params(mn[d], mx[d], bits, &scale[d], &zero[d]);
        put_pair(k_param(L, page, h, r0 / G, d), scale[d], zero[d]);
    }
    for (int32_t i = 0; i < G; i++) {
        quant_codes(rows[i], scale, zero, hd, maxq, code);
        pack_codes(code, hd, bits, code_row(L, page, 0, h, r0 + i));
    }
}

/* Value row r of head h: one group per group_size channels. */
static void quant_v_row(const mi_kv_page_layout *L, unsigned char *page, int32_t h, int32_t r,
                        const float *x) {
    const int32_t G = L->group_size, hd = L->head_dim, bits = L->bits, maxq = (1 << bits) - 1;
    float scale[MI_KV_MAX_HEAD_DIM], zero[MI_KV_MAX_HEAD_DIM];
    uint8_t code[MI_KV_MAX_HEAD_DIM];
    for (int32_t c0 = 0; c0 < hd; c0 += G) {
        float mn, mx, sg, zg;
        minmax(x + c0, G, 1, &mn, &mx);
        group_params(mn, mx, bits, &sg, &zg);
        put_pair(v_param(L, page, h, r, c0 / G), sg, zg);
        for (int32_t d = c0; d < c0 + G; d++) scale[d] = sg, zero[d] = zg;
    }
    quant_codes(x, scale, zero, hd, maxq, code);
    pack_codes(code, hd, bits, code_row(L, page, 1, h, r));
}

void kv_quant_decode_rows(const mi_kv_pool *pool, const unsigned char *page, int kv, int32_t h,
                          int32_t r0, int32_t r1, float *dst) {
    const mi_kv_page_layout *L = &pool->layout;
    const int32_t G = L->group_size, hd = L->head_dim, bits = L->bits;
    for (int32_t r = r0; r < r1; r++, dst += hd) {
        const unsigned char *row = code_row(L, (unsigned char *)page, kv, h, r);
        for (int32_t d = 0; d < hd; d++) {
            const unsigned char *p =
                kv ? v_param(L, page, h, r, d / G) : k_param(L, page, h, r / G, d);
            dst[d] = (float)code_at(row, d, bits) * f16_at(p) + f16_at(p + 2);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Fused kernels over one page's rows of one head                                              */

/* Both kernels work in the codes' planar order: byte j of a row holds channels cpb * j + i
 * (i < cpb = 8 / bits), so the query (or the accumulator) is permuted once into
 * [i][j] = channel cpb * j + i and every pass over a row is an element-wise loop over its
 * bytes, which vectorizes. */
static float sum_lanes(const float *a, int32_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j];
    float t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) t += a[i];
    return t;
}

/* The planar codes of one row as floats: cf[i * nb + j] = channel cpb * j + i (exact). */
static inline __attribute__((always_inline)) void
row_codes(const unsigned char *restrict row, int32_t nb, int bits, float *restrict cf) {
    const int32_t cpb = 8 / bits;
    const unsigned mask = (1u << bits) - 1u;
    for (int32_t i = 0; i < cpb; i++)
        for (int32_t j = 0; j < nb; j++) cf[i * nb + j] = (float)((row[j] >> (bits * i)) & mask);
}

/* One row's sum_d qs_d c_d over its nb bytes from its unpacked codes: the products of the
 * first plane, then each later plane added, then the eight lanes; nb is a constant where it
 * is inlined with one, so the passes unroll into a few vector instructions. */
static inline __attribute__((always_inline)) float
row_dot(const float *restrict qs, const float *restrict cf, int32_t nb, int bits) {
    const int32_t cpb = 8 / bits;
    float a[MI_KV_MAX_HEAD_DIM];
    for (int32_t j = 0; j < nb; j++) a[j] = qs[j] * cf[j];
    for (int32_t i = 1; i < cpb; i++)
        for (int32_t j = 0; j < nb; j++) a[j] += qs[i * nb + j] * cf[i * nb + j];
    return sum_lanes(a, nb);
}

/* The rows' codes are unpacked once for all the queries (the query heads of a KV head read
 * the same rows); each query's arithmetic is the one-query order, so results do not depend on
 * how many share a call. nb and bits are constants where inlined with them. */
static inline __attribute__((always_inline)) void
scores_rows(const mi_kv_page_layout *L, const unsigned char *page, int32_t h, int32_t r0,
            int32_t r1, const float *q, int32_t nq, float scale, float *out, int64_t ld_out,
            int32_t nb, int bits) {
    const int32_t G = L->group_size, hd = L->head_dim, cpb = 8 / bits;
    float qs[KV_QUANT_QUERIES][MI_KV_MAX_HEAD_DIM], qz[KV_QUANT_QUERIES];
    float cf[MI_KV_MAX_HEAD_DIM], ks[MI_KV_MAX_HEAD_DIM], km[MI_KV_MAX_HEAD_DIM];
    for (int32_t r = r0; r < r1;) {
        /* the group's scale and min folded into each query: q.k = sum qs_d c_d + sum q_d min_d */
        const int32_t g = r / G, stop = (g + 1) * G < r1 ? (g + 1) * G : r1;
        const unsigned char *p = k_param(L, page, h, g, 0);
        for (int32_t d = 0; d < hd; d++) ks[d] = f16_at(p + 4 * d), km[d] = f16_at(p + 4 * d + 2);
        for (int32_t t = 0; t < nq; t++) {
            const float *qt = q + (int64_t)t * hd;
            qz[t] = 0.0f;
            for (int32_t d = 0; d < hd; d++) {
                qs[t][(d % cpb) * nb + d / cpb] = qt[d] * ks[d];
                qz[t] += qt[d] * km[d];
            }
        }
        for (; r < stop; r++) {
            row_codes(code_row(L, (unsigned char *)page, 0, h, r), nb, bits, cf);
            for (int32_t t = 0; t < nq; t++)
                out[t * ld_out + (r - r0)] = (row_dot(qs[t], cf, nb, bits) + qz[t]) * scale;
        }
    }
}

void kv_quant_scores(const mi_kv_pool *pool, const unsigned char *page, int32_t h, int32_t r0,
                     int32_t r1, const float *q, int32_t nq, float scale, float *out,
                     int64_t ld_out) {
    const mi_kv_page_layout *L = &pool->layout;
    const int32_t nb = L->head_dim / (8 / L->bits);
    if (L->bits == 2 && nb == 16) /* head_dim 64 */
        scores_rows(L, page, h, r0, r1, q, nq, scale, out, ld_out, 16, 2);
    else if (L->bits == 2 && nb == 32) /* head_dim 128 */
        scores_rows(L, page, h, r0, r1, q, nq, scale, out, ld_out, 32, 2);
    else if (L->bits == 4 && nb == 32)
        scores_rows(L, page, h, r0, r1, q, nq, scale, out, ld_out, 32, 4);
    else if (L->bits == 4 && nb == 64)
        scores_rows(L, page, h, r0, r1, q, nq, scale, out, ld_out, 64, 4);
    else
        scores_rows(L, page, h, r0, r1, q, nq, scale, out, ld_out, nb, L->bits);
}

static inline __attribute__((always_inline)) void
accum_rows(const mi_kv_page_layout *L, const unsigned char *page, int32_t h, int32_t r0, int32_t r1,
           const float *w, int64_t ld_w, int32_t nq, float *acc, int32_t nb, int bits) {
    const int32_t G = L->group_size, hd = L->head_dim, cpb = 8 / bits;
    const int32_t groups = hd / G, bpg = G / cpb; /* bytes per channel group */
    float ap[KV_QUANT_QUERIES][MI_KV_MAX_HEAD_DIM], zs[KV_QUANT_QUERIES][MI_KV_MAX_HEAD_DIM];
    float ws[MI_KV_MAX_HEAD_DIM], cf[MI_KV_MAX_HEAD_DIM], gs[MI_KV_MAX_HEAD_DIM],
        gz[MI_KV_MAX_HEAD_DIM], gsb[MI_KV_MAX_HEAD_DIM];
    /* the channel group of byte j of a row (planar order: byte j holds channels cpb * j..) */
    int32_t grp[MI_KV_MAX_HEAD_DIM];
    for (int32_t j = 0; j < nb; j++) grp[j] = j / bpg;
    for (int32_t t = 0; t < nq; t++) {
        memset(ap[t], 0, (size_t)hd * sizeof(float));
        memset(zs[t], 0, (size_t)groups * sizeof(float));
    }
    for (int32_t r = r0; r < r1; r++) {
        bool any = false;
        for (int32_t t = 0; t < nq; t++) any |= w[t * ld_w + (r - r0)] != 0.0f;
        if (!any) continue;
        row_codes(code_row(L, (unsigned char *)page, 1, h, r), nb, bits, cf);
        const unsigned char *p = v_param(L, page, h, r, 0);
        for (int32_t g = 0; g < groups; g++)
            gs[g] = f16_at(p + 4 * g), gz[g] = f16_at(p + 4 * g + 2);
        for (int32_t j = 0; j < nb; j++) gsb[j] = gs[grp[j]]; /* byte j's group scale */
        for (int32_t t = 0; t < nq; t++) {
            const float wr = w[t * ld_w + (r - r0)];
            if (wr == 0.0f) continue;
            for (int32_t j = 0; j < nb; j++) ws[j] = wr * gsb[j];
            for (int32_t g = 0; g < groups; g++) zs[t][g] += wr * gz[g];
            float *a = ap[t];
            for (int32_t i = 0; i < cpb; i++)
                for (int32_t j = 0; j < nb; j++) a[i * nb + j] += ws[j] * cf[i * nb + j];
        }
    }
    for (int32_t t = 0; t < nq; t++)
        for (int32_t d = 0; d < hd; d++)
            acc[t * hd + d] += ap[t][(d % cpb) * nb + d / cpb] + zs[t][d / G];
}

void kv_quant_accum(const mi_kv_pool *pool, const unsigned char *page, int32_t h, int32_t r0,
                    int32_t r1, const float *w, int64_t ld_w, int32_t nq, float *acc) {
    const mi_kv_page_layout *L = &pool->layout;
    const int32_t nb = L->head_dim / (8 / L->bits);
    if (L->bits == 2 && nb == 32)
        accum_rows(L, page, h, r0, r1, w, ld_w, nq, acc, 32, 2);
    else if (L->bits == 4 && nb == 64)
        accum_rows(L, page, h, r0, r1, w, ld_w, nq, acc, 64, 4);
    else
        accum_rows(L, page, h, r0, r1, w, ld_w, nq, acc, nb, L->bits);
}

/* ------------------------------------------------------------------------------------------ */
/* Append                                                                                      */

static const unsigned char *t_elem(const mi_tensor *t, int64_t h, int64_t i) {
    return (const unsigned char *)t->data +
           (size_t)(h * t->stride[1] + i * t->stride[2]) * mi_dtype_size(t->dtype);
}

/* Row i of head h of t as floats: its own memory (f32) or converted into buf. */
static const float *t_row(const mi_tensor *t, int64_t h, int64_t i, int32_t hd, float *buf) {
    const unsigned char *row = t_elem(t, h, i);
    if (t->dtype == MI_DTYPE_F32) return (const float *)row;
    for (int32_t d = 0; d < hd; d++) {
        uint16_t u;
        memcpy(&u, row + 2 * d, 2);
        buf[d] = t->dtype == MI_DTYPE_F16 ? mi_f16_to_f32(u) : mi_bf16_to_f32(u);
    }
    return buf;
}

size_t kv_quant_resid_bytes(const mi_kv_pool *pool, int32_t cap) {
    return 2 * (size_t)pool->layout.n_kv_heads * (size_t)cap * (size_t)pool->layout.head_dim *
           sizeof(float);
}

mi_status kv_quant_append(mi_kv_seq *seq, int32_t layer, const mi_tensor *k, const mi_tensor *v,
                          int64_t n) {
    mi_kv_pool *pool = seq->pool;
    const mi_kv_page_layout *Lay = &pool->layout;
    const int32_t P = Lay->page_tokens, H = Lay->n_kv_heads, hd = Lay->head_dim,
                  G = Lay->group_size, R = pool->params.quant_residual;
    kv_layer *L = &seq->layers[layer];
    if (n > INT64_MAX / 2 - L->len)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "mi_kv_seq_append: %lld rows are too many",
                       (long long)n);
    const int64_t len0 = L->len, q0 = L->qlen, len1 = len0 + n;
    int64_t q1 = len1 > R ? (len1 - R) / G * G : 0;
    if (q1 < q0) q1 = q0;
    const int64_t have = pages_for(q0, P), want = pages_for(q1, P);
    const int32_t off = (int32_t)(q0 % P);
    const int32_t last = off ? L->pages[have - 1] : -1;
    const bool cow = q1 > q0 && off && pool->info[last].refs > 1;
    const int64_t fresh = want - have, need = fresh + (cow ? 1 : 0);

    if (L->n_pages + need > L->cap_pages) {
        int64_t cap = L->cap_pages ? 2 * L->cap_pages : 16;
        if (cap < L->n_pages + need) cap = L->n_pages + need;
        int32_t *pages = realloc(L->pages, (size_t)cap * sizeof *pages);
        if (!pages) return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory for a page table");
        L->pages = pages;
        L->cap_pages = cap;
    }
    /* room for the new residual (rows q1..len1-1): grown by doubling, from one group up to
     * residual + group - 1 rows; swapped in once nothing can fail */
    float *grown = NULL;
    int32_t grown_cap = L->resid_cap;
    if (!L->resid || len1 - q1 > L->resid_cap) {
        grown_cap = L->resid_cap ? 2 * L->resid_cap : G;
        if (grown_cap < len1 - q1) grown_cap = (int32_t)(len1 - q1);
        if (grown_cap > pool->q_resid_cap) grown_cap = pool->q_resid_cap;
        grown = malloc(kv_quant_resid_bytes(pool, grown_cap));
        if (!grown)
            return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory for the KIVI residual");
    }
    /* a group's rows (converted where the source is not f32) and a row buffer, per thread:
     * a long prompt's groups are quantized on OpenMP threads (each group writes its own rows,
     * scales and byte-aligned codes; the pages' fill is set after, in order) */
    const int64_t n_groups = (q1 - q0) / G;
    const int nt = n >= KV_PARALLEL_ROWS && n_groups > 1 ? omp_get_max_threads() : 1;
    float *buf = malloc((size_t)nt * ((size_t)G + 1) * (size_t)hd * sizeof(float));
    const float **rows = malloc((size_t)nt * (size_t)G * sizeof *rows);
    if (!buf || !rows) {
        free(buf);
        free(rows);
        free(grown);
        return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory quantizing %lld rows",
                       (long long)n);
    }
    int32_t *slots = L->pages + L->n_pages;
    mi_status st = kv_pages_acquire(pool, need, slots);
    if (st != MI_STATUS_SUCCESS) {
        free(buf);
        free(rows);
        free(grown);
        return st;
    }

    /* From here on nothing fails. */
    if (grown) { /* the waiting rows move to the larger residual, at the same indices */
        float *old = L->resid;
        const int32_t old_cap = L->resid_cap;
        L->resid = grown;
        L->resid_cap = grown_cap;
        for (int kv = 0; old && kv < 2; kv++)
            for (int32_t h = 0; h < H; h++)
                memcpy(kv_resid_row(pool, L, kv, h, 0),
                       old + ((size_t)kv * H + (size_t)h) * (size_t)old_cap * (size_t)hd,
                       (size_t)(len0 - q0) * (size_t)hd * sizeof(float));
        free(old);
    }
    if (cow) {
        const int32_t copy = slots[fresh];
        memcpy(kv_page(pool, copy), kv_page(pool, last), Lay->page_bytes);
        pool->info[copy].fill = off;
        kv_page_release(pool, last);
        L->pages[have - 1] = copy;
    } else if (off && q1 > q0) {
        kv_page_set_fill(pool, last, off); /* truncated while shared, now our own */
    }
    L->n_pages += fresh;

#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const int64_t g0 = q0 + gi * G;
        const int32_t id = L->pages[g0 / P], r0 = (int32_t)(g0 % P);
        unsigned char *page = kv_page(pool, id);
        float *my_buf = buf + (size_t)omp_get_thread_num() * ((size_t)G + 1) * (size_t)hd;
        const float **my_rows = rows + (size_t)omp_get_thread_num() * (size_t)G;
        for (int32_t h = 0; h < H; h++)
            for (int kv = 0; kv < 2; kv++) {
                const mi_tensor *t = kv ? v : k;
                for (int32_t i = 0; i < G; i++) {
                    const int64_t row = g0 + i;
                    my_rows[i] = row < len0 ? kv_resid_row(pool, L, kv, h, row - q0)
                                            : t_row(t, h, row - len0, hd, my_buf + (size_t)i * hd);
                }
                if (kv == 0)
                    quant_k_group(Lay, page, h, r0, my_rows);
                else
                    for (int32_t i = 0; i < G; i++) quant_v_row(Lay, page, h, r0 + i, my_rows[i]);
            }
    }
    for (int64_t g0 = q0; g0 < q1; g0 += G)
        pool->info[L->pages[g0 / P]].fill = (int32_t)(g0 % P) + G;
    /* the residual becomes rows q1..len1-1 */
    for (int kv = 0; kv < 2; kv++)
        for (int32_t h = 0; h < H; h++) {
            if (q1 < len0)
                memmove(kv_resid_row(pool, L, kv, h, 0), kv_resid_row(pool, L, kv, h, q1 - q0),
                        (size_t)(len0 - q1) * (size_t)hd * sizeof(float));
            const mi_tensor *t = kv ? v : k;
            for (int64_t row = q1 > len0 ? q1 : len0; row < len1; row++) {
                const float *src = t_row(t, h, row - len0, hd, buf);
                memcpy(kv_resid_row(pool, L, kv, h, row - q1), src, (size_t)hd * sizeof(float));
            }
        }
    L->qlen = q1;
    L->len = len1;
    free(buf);
    free(rows);
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Truncate, fork                                                                              */

mi_status kv_quant_truncate(mi_kv_seq *seq, int32_t layer, int64_t len) {
    mi_kv_pool *pool = seq->pool;
    kv_layer *L = &seq->layers[layer];
    const int32_t P = pool->layout.page_tokens, G = pool->layout.group_size,
                  H = pool->layout.n_kv_heads;
    if (len >= L->qlen) {
        L->len = len;
        return MI_STATUS_SUCCESS;
    }
    /* the rows of the last partial group come back into the residual with their quantized
     * values (the residual always has room: fewer than group_size rows) */
    const int64_t qn = len / G * G;
    for (int64_t row = qn; row < len; row++) {
        const unsigned char *page = kv_page(pool, L->pages[row / P]);
        for (int kv = 0; kv < 2; kv++)
            for (int32_t h = 0; h < H; h++)
                kv_quant_decode_rows(pool, page, kv, h, (int32_t)(row % P), (int32_t)(row % P) + 1,
                                     kv_resid_row(pool, L, kv, h, row - qn));
    }
    const int64_t keep = pages_for(qn, P);
    for (int64_t i = keep; i < L->n_pages; i++) kv_page_release(pool, L->pages[i]);
    L->n_pages = keep;
    const int32_t off = (int32_t)(qn % P);
    if (off) {
        const int32_t id = L->pages[keep - 1];
        if (pool->info[id].refs == 1) kv_page_set_fill(pool, id, off);
    }
    L->qlen = qn;
    L->len = len;
    return MI_STATUS_SUCCESS;
}

mi_status kv_quant_fork_layer(mi_kv_pool *pool, const kv_layer *src, kv_layer *dst) {
    dst->qlen = src->qlen;
    if (!src->resid) return MI_STATUS_SUCCESS;
    dst->resid = malloc(kv_quant_resid_bytes(pool, src->resid_cap));
    if (!dst->resid)
        return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "out of memory for a KIVI residual");
    dst->resid_cap = src->resid_cap;
    memcpy(dst->resid, src->resid, kv_quant_resid_bytes(pool, src->resid_cap));
    return MI_STATUS_SUCCESS;
}
