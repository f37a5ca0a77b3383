/*
 * kv_quant_attn.c: reading a layer's rows whatever holds them (pages of any dtype, the KIVI
 * residual): the tile reader and one query's attention over a range of rows, with LeanK's
 * channel mask on the middle rows. Quantized pages are read through the fused kernels of
 * kv_quant.c, never dequantized into a buffer.
 */
#include "kv_internal.h"
#include "kv_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static mi_status check_layer(const mi_kv_seq *seq, int32_t layer, const char *fn) {
    if (layer < 0 || layer >= seq->pool->params.n_layers)
        return kv_fail(seq->pool, MI_STATUS_INVALID_ARGUMENT, "%s: layer %d is outside 0..%d", fn,
                       layer, seq->pool->params.n_layers - 1);
    return MI_STATUS_SUCCESS;
}

/* Rows of the layer held in pages. */
static int64_t paged_rows(const mi_kv_pool *pool, const kv_layer *L) {
    return kv_is_quant(pool) ? L->qlen : L->len;
}

int64_t mi_kv_seq_quantized_rows(const mi_kv_seq *seq, int32_t layer) {
    if (!seq || layer < 0 || layer >= seq->pool->params.n_layers) return -1;
    return paged_rows(seq->pool, &seq->layers[layer]);
}

mi_status mi_kv_seq_residual(const mi_kv_seq *seq, int32_t layer, mi_kv_residual_view *out) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    kv_clear_error(seq->pool);
    mi_status st = check_layer(seq, layer, "mi_kv_seq_residual");
    if (st != MI_STATUS_SUCCESS) return st;
    if (!out)
        return kv_fail(seq->pool, MI_STATUS_INVALID_ARGUMENT, "mi_kv_seq_residual: out is NULL");
    const kv_layer *L = &seq->layers[layer];
    memset(out, 0, sizeof *out);
    out->first_row = paged_rows(seq->pool, L);
    if (kv_is_quant(seq->pool) && L->resid) {
        out->rows = (int32_t)(L->len - L->qlen);
        out->stride_rows = L->resid_cap;
        out->k = L->resid;
        out->v = kv_resid_row(seq->pool, L, 1, 0, 0);
    }
    return MI_STATUS_SUCCESS;
}

mi_status mi_kv_seq_read_tile(const mi_kv_seq *seq, int32_t layer, int32_t kv_head, int kv,
                              int64_t start, int64_t count, float *dst) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    const mi_kv_pool *pool = seq->pool;
    kv_clear_error(pool);
    static const char fn[] = "mi_kv_seq_read_tile";
    mi_status st = check_layer(seq, layer, fn);
    if (st != MI_STATUS_SUCCESS) return st;
    const kv_layer *L = &seq->layers[layer];
    if (kv_head < 0 || kv_head >= pool->layout.n_kv_heads || (kv != 0 && kv != 1))
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: head %d or kv %d is out of range", fn,
                       kv_head, kv);
    if (start < 0 || count < 0 || count > (1 << 20) || start > L->len || count > L->len - start)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                       "%s: rows %lld..%lld are outside layer %d's %lld rows (or over 2^20)", fn,
                       (long long)start, (long long)(start + count), layer, (long long)L->len);
    if (!dst && count) return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: dst is NULL", fn);
    const int32_t P = pool->layout.page_tokens, hd = pool->layout.head_dim;
    const int64_t paged = paged_rows(pool, L);
    for (int64_t r = start; r < start + count;) {
        float *out = dst + (size_t)(r - start) * hd;
        if (r >= paged) {
            memcpy(out, kv_resid_row(pool, L, kv, kv_head, r - paged), (size_t)hd * sizeof(float));
            r++;
            continue;
        }
        const int64_t stop_page = (r / P + 1) * P, stop_all = start + count;
        int64_t stop = stop_page < stop_all ? stop_page : stop_all;
        if (stop > paged) stop = paged;
        kv_rows_decode(pool, kv_page(pool, L->pages[r / P]), kv, kv_head, (int32_t)(r % P),
                       (int32_t)(r % P + (stop - r)), out);
        r = stop;
    }
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Attention                                                                                   */

static float dot(const float *a, const float *b, int32_t n) { return kv_dot(a, b, n); }

/* The next segment from r: rows inside one page (or the residual) and one mask region. */
static int64_t segment_end(int64_t r, int64_t end, int64_t paged, int32_t P, int64_t m0,
                           int64_t m1) {
    int64_t stop = end;
    if (r < paged) {
        const int64_t pe = (r / P + 1) * P;
        stop = pe < stop ? pe : stop;
        stop = paged < stop ? paged : stop;
    }
    if (r < m0 && m0 < stop) stop = m0;
    if (r < m1 && m1 < stop) stop = m1;
    return stop;
}

mi_status mi_kv_seq_attend(const mi_kv_seq *seq, int32_t layer, int32_t kv_head, const float *q,
                           const mi_kv_attend_params *p, float *scores, float *out) {
    return mi_kv_seq_attend_heads(seq, layer, kv_head, q, 1, p, scores, out);
}

mi_status mi_kv_seq_attend_heads(const mi_kv_seq *seq, int32_t layer, int32_t kv_head,
                                 const float *q, int32_t nq, const mi_kv_attend_params *p,
                                 float *scores, float *out) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    const mi_kv_pool *pool = seq->pool;
    static const char fn[] = "mi_kv_seq_attend";
    mi_status st = check_layer(seq, layer, fn);
    if (st != MI_STATUS_SUCCESS) return st;
    const kv_layer *L = &seq->layers[layer];
    const mi_kv_page_layout *Lay = &pool->layout;
    const int32_t P = Lay->page_tokens, hd = Lay->head_dim;
    if (!q || !p || !out || kv_head < 0 || kv_head >= Lay->n_kv_heads)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                       "%s: q, params and out must be given and head %d in 0..%d", fn, kv_head,
                       Lay->n_kv_heads - 1);
    if (nq < 1 || nq > KV_QUANT_QUERIES)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: %d queries (1..%d)", fn, nq,
                       KV_QUANT_QUERIES);
    if (p->first < 0 || p->first > p->end || p->end > L->len || !isfinite(p->scale))
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                       "%s: rows %lld..%lld are outside layer %d's %lld rows (or a bad scale)", fn,
                       (long long)p->first, (long long)p->end, layer, (long long)L->len);
    if (p->end > p->first && !scores)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: scores is NULL", fn);
    const int64_t n = p->end - p->first;

    /* LeanK: the masked queries for the middle rows (the mask is the KV head's, the same for
     * every query); a head without channels skips them */
    float qm[KV_QUANT_QUERIES * MI_KV_MAX_HEAD_DIM], qk[KV_QUANT_QUERIES][MI_KV_MAX_HEAD_DIM];
    int32_t idx[MI_KV_MAX_HEAD_DIM], kept = 0;
    int64_t m0 = 0, m1 = 0;
    bool skip_mid = false;
    if (p->channel_mask) {
        for (int32_t d = 0; d < hd; d++)
            if (p->channel_mask[d]) idx[kept++] = d;
        for (int32_t t = 0; t < nq; t++)
            for (int32_t d = 0, c = 0; d < hd; d++) {
                qm[t * hd + d] = p->channel_mask[d] ? q[t * hd + d] : 0.0f;
                if (p->channel_mask[d]) qk[t][c++] = q[t * hd + d];
            }
        m0 = p->mask_first > p->first ? p->mask_first : p->first;
        m1 = p->mask_end < p->end ? p->mask_end : p->end;
        if (m1 < m0) m1 = m0;
        skip_mid = kept == 0;
        if (kept == hd) m0 = m1 = 0; /* nothing pruned: no middle */
    }
    const int64_t paged = paged_rows(pool, L);
    const bool quant = kv_is_quant(pool), f32 = Lay->dtype == MI_KV_F32;
    enum { DEC_ROWS = 16 }; /* rows of pages of another dtype decoded per call */
    float buf[DEC_ROWS * MI_KV_MAX_HEAD_DIM], mx[KV_QUANT_QUERIES];
    for (int32_t t = 0; t < nq; t++) mx[t] = -INFINITY;
    for (int64_t r = p->first; r < p->end;) {
        const int64_t stop = segment_end(r, p->end, paged, P, m0, m1);
        const bool mid = r >= m0 && r < m1;
        float *sc = scores + (r - p->first); /* query t's at sc + t * n */
        if (mid && skip_mid) {
            for (int32_t t = 0; t < nq; t++)
                for (int64_t i = r; i < stop; i++) sc[t * n + i - r] = -INFINITY;
            r = stop;
            continue;
        }
        if (r >= paged) {
            for (int64_t i = r; i < stop; i++) {
                const float *k = kv_resid_row(pool, L, 0, kv_head, i - paged);
                for (int32_t t = 0; t < nq; t++)
                    sc[t * n + i - r] = dot(k, (mid ? qm : q) + t * hd, hd) * p->scale;
            }
        } else {
            const unsigned char *page = kv_page(pool, L->pages[r / P]);
            const int32_t a = (int32_t)(r % P), b = (int32_t)(a + (stop - r));
            if (quant && mid) {
                kv_quant_scores(pool, page, kv_head, a, b, qm, nq, p->scale, sc, n);
            } else if (quant) {
                kv_quant_scores(pool, page, kv_head, a, b, q, nq, p->scale, sc, n);
            } else if (f32 && mid) { /* LeanK: only the kept channels are multiplied */
                const float *k = (const float *)(page + Lay->k_offset + kv_head * Lay->head_stride);
                for (int32_t i = a; i < b; i++) {
                    const float *kr = k + (size_t)i * hd;
                    for (int32_t t = 0; t < nq; t++) {
                        float acc = 0.0f;
                        for (int32_t c = 0; c < kept; c++) acc += qk[t][c] * kr[idx[c]];
                        sc[t * n + i - a] = acc * p->scale;
                    }
                }
            } else if (f32) {
                const float *k = (const float *)(page + Lay->k_offset + kv_head * Lay->head_stride);
                for (int32_t i = a; i < b; i++)
                    for (int32_t t = 0; t < nq; t++)
                        sc[t * n + i - a] = dot(k + (size_t)i * hd, q + t * hd, hd) * p->scale;
            } else { /* decoded DEC_ROWS rows at a time (the page's scale and centre read once) */
                for (int32_t i0 = a; i0 < b; i0 += DEC_ROWS) {
                    const int32_t i1 = i0 + DEC_ROWS < b ? i0 + DEC_ROWS : b;
                    kv_rows_decode(pool, page, 0, kv_head, i0, i1, buf);
                    for (int32_t i = i0; i < i1; i++)
                        for (int32_t t = 0; t < nq; t++)
                            sc[t * n + i - a] =
                                dot(buf + (size_t)(i - i0) * hd, (mid ? qm : q) + t * hd, hd) *
                                p->scale;
                }
            }
        }
        for (int32_t t = 0; t < nq; t++)
            for (int64_t i = r; i < stop; i++)
                mx[t] = sc[t * n + i - r] > mx[t] ? sc[t * n + i - r] : mx[t];
        r = stop;
    }
    for (int32_t t = 0; t < nq; t++)
        for (int32_t d = 0; d < hd; d++) out[t * hd + d] = 0.0f;
    float sum[KV_QUANT_QUERIES];
    bool any = false;
    for (int32_t t = 0; t < nq; t++) {
        sum[t] = 0.0f;
        float *sc = scores + t * n;
        if (!(mx[t] > -INFINITY)) { /* no row attended: zero weights, a zero output */
            for (int64_t i = 0; i < n; i++) sc[i] = 0.0f;
            continue;
        }
        any = true;
        for (int64_t i = 0; i < n; i++) {
            sc[i] = expf(sc[i] - mx[t]);
            sum[t] += sc[i];
        }
    }
    if (!any) return MI_STATUS_SUCCESS;
    for (int64_t r = p->first; r < p->end;) {
        const int64_t stop = segment_end(r, p->end, paged, P, m0, m1);
        const float *w = scores + (r - p->first); /* query t's at w + t * n */
        if (r >= paged) {
            for (int64_t i = r; i < stop; i++) {
                const float *v = kv_resid_row(pool, L, 1, kv_head, i - paged);
                for (int32_t t = 0; t < nq; t++)
                    for (int32_t d = 0; d < hd; d++) out[t * hd + d] += w[t * n + i - r] * v[d];
            }
        } else {
            const unsigned char *page = kv_page(pool, L->pages[r / P]);
            const int32_t a = (int32_t)(r % P), b = (int32_t)(a + (stop - r));
            if (quant) {
                kv_quant_accum(pool, page, kv_head, a, b, w, n, nq, out);
            } else {
                const float *v = (const float *)(page + Lay->v_offset + kv_head * Lay->head_stride);
                int32_t have0 = 0, have1 = 0; /* rows decoded into buf */
                for (int32_t i = a; i < b; i++) {
                    bool used = false;
                    for (int32_t t = 0; t < nq; t++) used |= w[t * n + i - a] != 0.0f;
                    if (!used) continue;
                    const float *vr = v + (size_t)i * hd;
                    if (!f32) {
                        if (i >= have1) {
                            have0 = i;
                            have1 = i + DEC_ROWS < b ? i + DEC_ROWS : b;
                            kv_rows_decode(pool, page, 1, kv_head, have0, have1, buf);
                        }
                        vr = buf + (size_t)(i - have0) * hd;
                    }
                    for (int32_t t = 0; t < nq; t++) {
                        const float wi = w[t * n + i - a];
                        if (wi == 0.0f) continue;
                        for (int32_t d = 0; d < hd; d++) out[t * hd + d] += wi * vr[d];
                    }
                }
            }
        }
        r = stop;
    }
    for (int32_t t = 0; t < nq; t++) {
        if (!(mx[t] > -INFINITY)) continue;
        const float inv = 1.0f / sum[t];
        for (int32_t d = 0; d < hd; d++) out[t * hd + d] *= inv;
    }
    return MI_STATUS_SUCCESS;
}
