/*
 * kv_compact.c: per-head compaction of one layer (mi_kv_seq_compact), for the KV methods that
 * keep a subset of the tokens (StreamingLLM's eviction, SnapKV / PyramidKV's selection).
 *
 * Every head keeps the same number of rows (docs/kv-cache.md, "Why one page covers every KV
 * head"), possibly different ones. The pages up to the first row that moves are kept as they are
 * (StreamingLLM's sinks, a shared prefix); from the page holding that row on, the kept rows are
 * written into fresh pages and the old ones released. Shared pages are therefore never written
 * (copy-on-write holds without a special case), and the fresh pages are all taken before anything
 * changes, so a failure leaves the sequence as it was. The price is that the rewritten part
 * briefly needs its new pages beside the old ones.
 */
#include "kv_internal.h"

#include <stdlib.h>
#include <string.h>

mi_status mi_kv_seq_compact(mi_kv_seq *seq, int32_t layer, int64_t count, const int64_t *keep) {
    if (!seq) return MI_STATUS_INVALID_ARGUMENT;
    mi_kv_pool *pool = seq->pool;
    kv_clear_error(pool);
    static const char fn[] = "mi_kv_seq_compact";
    if (layer < 0 || layer >= pool->params.n_layers)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: layer %d is outside 0..%d", fn, layer,
                       pool->params.n_layers - 1);
    kv_layer *L = &seq->layers[layer];
    if (kv_is_quant(pool)) /* quantized groups span rows: a subset would need requantizing */
        return kv_fail(pool, MI_STATUS_UNSUPPORTED, "%s: KIVI pages cannot be compacted", fn);
    if (L->head_len)
        return kv_fail(pool, MI_STATUS_UNSUPPORTED, "%s: per-head row counts are not supported",
                       fn);
    if (count < 0 || count > L->len)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                       "%s: %lld rows cannot be kept of layer %d's %lld", fn, (long long)count,
                       layer, (long long)L->len);
    if (count > 0 && !keep)
        return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT, "%s: keep is NULL", fn);
    const int32_t P = pool->params.page_tokens, H = pool->params.n_kv_heads,
                  hd = pool->params.head_dim;
    /* each head's rows ascending and inside the layer; the first row where any head moves */
    int64_t first_moved = count;
    for (int32_t h = 0; h < H; h++) {
        const int64_t *k = keep + (int64_t)h * count;
        for (int64_t i = 0; i < count; i++) {
            if (k[i] < 0 || k[i] >= L->len || (i && k[i] <= k[i - 1]))
                return kv_fail(pool, MI_STATUS_INVALID_ARGUMENT,
                               "%s: head %d's rows must ascend inside 0..%lld (entry %lld is "
                               "%lld)",
                               fn, h, (long long)L->len - 1, (long long)i, (long long)k[i]);
            if (k[i] != i && i < first_moved) first_moved = i;
        }
    }
    if (first_moved == count) return mi_kv_seq_truncate(seq, layer, count);

    const int64_t p0 = first_moved / P, p1 = (count + P - 1) / P, n_new = p1 - p0;
    int32_t *ids = malloc((size_t)(n_new ? n_new : 1) * sizeof(int32_t));
    float *buf = malloc((size_t)P * (size_t)hd * sizeof(float));
    if (!ids || !buf) {
        free(ids);
        free(buf);
        return kv_fail(pool, MI_STATUS_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    mi_status st = kv_pages_acquire(pool, n_new, ids);
    if (st != MI_STATUS_SUCCESS) {
        free(ids);
        free(buf);
        return st;
    }
    /* From here on nothing fails. */
    for (int64_t j = 0; j < n_new; j++) {
        const int64_t r0 = (p0 + j) * P;
        const int32_t rows = (int32_t)(count - r0 < P ? count - r0 : P);
        unsigned char *dst = kv_page(pool, ids[j]);
        for (int32_t h = 0; h < H; h++)
            for (int kv = 0; kv < 2; kv++) {
                const int64_t *k = keep + (int64_t)h * count;
                for (int32_t r = 0; r < rows; r++) {
                    const int64_t src = k[r0 + r];
                    const unsigned char *page = kv_page(pool, L->pages[src / P]);
                    const int32_t sr = (int32_t)(src % P);
                    kv_rows_decode(pool, page, kv, h, sr, sr + 1, buf + (size_t)r * hd);
                }
                kv_rows_encode(pool, dst, kv, h, 0, rows, buf, hd, NULL);
            }
        pool->info[ids[j]].fill = rows;
        kv_meta_recompute(pool, ids[j]);
    }
    for (int64_t i = p0; i < L->n_pages; i++) kv_page_release(pool, L->pages[i]);
    memcpy(L->pages + p0, ids, (size_t)n_new * sizeof(int32_t));
    L->n_pages = p1;
    L->len = count;
    free(ids);
    free(buf);
    return MI_STATUS_SUCCESS;
}
