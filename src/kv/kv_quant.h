/*
 * kv_quant.h: the fused kernels over KIVI pages (kv_quant.c) that the attention reader
 * (kv_quant_attn.c) calls; internal.
 */
#ifndef MI_KV_QUANT_H
#define MI_KV_QUANT_H

#include "kv_internal.h"

#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

/* An f16 stored at p as float (exact either way; the F16C instruction where built for it). */
static inline float kv_f16(const unsigned char *p) {
    uint16_t u;
    memcpy(&u, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(u);
#else
    return mi_f16_to_f32(u);
#endif
}

/* sum a[i] * b[i] in eight interleaved partial sums (vectorizes without reassociation flags;
 * the order is fixed, so equal inputs give equal results everywhere it is used). */
static inline float kv_dot(const float *a, const float *b, int32_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

/* The most queries one call of the kernels below takes (the query heads of one KV head). */
#define KV_QUANT_QUERIES 8

/* out[t * ld_out + r - r0] = scale * q_t . k_r for rows r0..r1-1 of head h of a KIVI page and
 * queries q_t = q + t * head_dim, t < nq <= KV_QUANT_QUERIES: the codes of a row are unpacked
 * once for all of them, the group's scale and min folded into each query once per group. */
void kv_quant_scores(const mi_kv_pool *pool, const unsigned char *page, int32_t h, int32_t r0,
                     int32_t r1, const float *q, int32_t nq, float scale, float *out,
                     int64_t ld_out);
/* acc[t * head_dim + d] += sum_r w[t * ld_w + r - r0] * v_r[d] for rows r0..r1-1 of head h of a
 * KIVI page, t < nq <= KV_QUANT_QUERIES. */
void kv_quant_accum(const mi_kv_pool *pool, const unsigned char *page, int32_t h, int32_t r0,
                    int32_t r1, const float *w, int64_t ld_w, int32_t nq, float *acc);

#endif /* MI_KV_QUANT_H */
