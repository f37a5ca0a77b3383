/*
 * kv_method_streamingllm.c: StreamingLLM (Xiao et al., "Efficient Streaming Language Models with
 * Attention Sinks"): the cache keeps the first n_init tokens (the attention sinks) and the last
 * n_local; everything between is evicted. Defaults are the original code's (n_init 128,
 * n_local 3968: a 4096-token cache).
 *
 * Reading: a decode step attends to rows [0, n_init) and its last n_local rows, exactly.
 * Memory: rows beyond n_init + n_local are evicted once a page's worth (page_tokens) has piled up,
 * so the rewrite of the window costs O(window) once per page of tokens, not per token, and the
 * cache never holds more than n_init + n_local + page_tokens rows after a call. A prefill call
 * attends to every row it finds (the whole prompt, as the original's prefill does) and is
 * evicted after. Keys keep the RoPE of their original positions (as the original's code; the
 * paper's re-indexing of positions inside the cache would need keys stored before RoPE).
 */
#include "kv_method.h"

#include <stdlib.h>

static const kv_param_def streaming_params[] = {
    {"n_init", KV_PARAM_INT, 128, 0, 1 << 24, NULL, "first tokens always kept (attention sinks)"},
    {"n_local", KV_PARAM_INT, 3968, 1, 1 << 26, NULL, "recent tokens kept"},
};

typedef struct streaming_state {
    int64_t n_init, n_local;
} streaming_state;

static mi_status streaming_create(kv_method *m) {
    streaming_state *st = malloc(sizeof(*st));
    if (!st) return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    st->n_init = (int64_t)kv_spec_get(&m->spec, "n_init");
    st->n_local = (int64_t)kv_spec_get(&m->spec, "n_local");
    m->state = st;
    return MI_STATUS_SUCCESS;
}

static void streaming_destroy(kv_method *m) { free(m->state); }

static mi_status streaming_clone(const kv_method *m, kv_method *out) {
    streaming_state *st = malloc(sizeof(*st));
    if (!st) return kv_method_fail(out, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    *st = *(const streaming_state *)m->state;
    out->state = st;
    return MI_STATUS_SUCCESS;
}

static mi_status streaming_keep(kv_method *m, int32_t layer, const float *q, int64_t n,
                                const float *k, int64_t len, int64_t slack, int64_t *keep,
                                int64_t *count) {
    (void)layer, (void)q, (void)n, (void)k;
    const streaming_state *st = m->state;
    const int64_t cap = st->n_init + st->n_local;
    *count = len;
    if (len <= cap + slack) return MI_STATUS_SUCCESS;
    for (int32_t h = 0; h < m->geo.n_kv_heads; h++) {
        int64_t *kh = keep + (int64_t)h * cap;
        for (int64_t i = 0; i < st->n_init; i++) kh[i] = i;
        for (int64_t i = 0; i < st->n_local; i++) kh[st->n_init + i] = len - st->n_local + i;
    }
    *count = cap;
    return MI_STATUS_SUCCESS;
}

static mi_status streaming_evict(kv_method *m, mi_kv_seq *seq, int32_t layer, int64_t n_new) {
    const streaming_state *st = m->state;
    const int64_t len = mi_kv_seq_length(seq, layer), cap = st->n_init + st->n_local;
    if (len <= cap + m->geo.page_tokens) return MI_STATUS_SUCCESS;
    int64_t *keep = malloc((size_t)(cap * m->geo.n_kv_heads) * sizeof(int64_t));
    if (!keep) return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory evicting");
    int64_t count = len;
    mi_status s =
        streaming_keep(m, layer, NULL, n_new, NULL, len, m->geo.page_tokens, keep, &count);
    if (s == MI_STATUS_SUCCESS && count < len) s = kv_method_compact(m, seq, layer, count, keep);
    free(keep);
    return s;
}

static mi_status streaming_select(kv_method *m, const mi_kv_seq *seq, int32_t layer, const float *q,
                                  int64_t n, kv_selection *sel) {
    (void)q;
    const streaming_state *st = m->state;
    const int64_t rows = mi_kv_seq_length(seq, layer);
    if (kv_selection_reset(sel, n * m->geo.n_heads) != MI_STATUS_SUCCESS)
        return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory selecting rows");
    for (int64_t i = 0; i < n; i++) {
        const int64_t end = rows - n + i + 1;
        const int64_t sink = st->n_init < end ? st->n_init : end;
        int64_t local = end - st->n_local;
        if (local < sink) local = sink;
        for (int32_t h = 0; h < m->geo.n_heads; h++) {
            if (kv_selection_push(sel, 0, sink) != MI_STATUS_SUCCESS ||
                kv_selection_push(sel, local, end) != MI_STATUS_SUCCESS)
                return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory selecting rows");
            kv_selection_close(sel);
        }
    }
    return MI_STATUS_SUCCESS;
}

const kv_method_entry kv_method_streamingllm_entry = {
    .name = "streamingllm",
    .summary = "attention sinks + a recent window; decode memory bounded",
    .params = streaming_params,
    .n_params = (int32_t)(sizeof streaming_params / sizeof streaming_params[0]),
    .create = streaming_create,
    .destroy = streaming_destroy,
    .clone = streaming_clone,
    .after_append = streaming_evict,
    .select = streaming_select,
    .keep_rows = streaming_keep,
};
