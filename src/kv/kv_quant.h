/*
 * kv_quant.h: the fused kernels over KIVI pages (kv_quant.c) that the attention reader
 * (kv_quant_attn.c) calls; internal.
 */
#ifndef MI_KV_QUANT_H
#define MI_KV_QUANT_H

#include "kv_internal.h"

/* out[r - r0] = scale * q . k_r for rows r0..r1-1 of head h of a KIVI page, from the codes (the
 * group's scale and min are folded into q once per group). */
void kv_quant_scores(const mi_kv_pool *pool, const unsigned char *page, int32_t h, int32_t r0,
                     int32_t r1, const float *q, float scale, float *out);
/* acc[d] += sum_r w[r - r0] * v_r[d] for rows r0..r1-1 of head h of a KIVI page. */
void kv_quant_accum(const mi_kv_pool *pool, const unsigned char *page, int32_t h, int32_t r0,
                    int32_t r1, const float *w, float *acc);

#endif /* MI_KV_QUANT_H */
