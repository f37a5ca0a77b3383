/*
 * kv_method_retr_attn.c: RetrievalAttention (Liu et al., "RetrievalAttention: Accelerating
 * Long-Context LLM Inference via Vector Retrieval"). The cache stays whole in host memory; per
 * layer and KV head, the keys of the old tokens (past the n_init sinks, before the n_local
 * recent ones) go into a vector index (kv_retr.h) built when the prompt has been prefilled and
 * calibrated with the prompt's last queries, since queries and keys follow different
 * distributions. Each decode step, per query head, attends to the static part (the sinks and
 * every row after the indexed ones: the window and the tokens decoded since) and to the top_k
 * keys the index retrieves, in one softmax over their union: the log-sum-exp merge of the two
 * parts, done in one pass because both live in host memory here (kv_retr_merge is the merge
 * for parts computed apart). Rows leave the window into the index as tokens arrive.
 *
 * Defaults are the original's: top_k 4096 and from_layer 0 (its patch defaults), 128 sinks and
 * 512 recent tokens (its cache's start_size and recent_size). The index parameters
 * (list_size, recall, samples) are this implementation's: docs/kv-retrieval.md.
 * Prefill calls (and follow-up calls of 32 tokens or more) attend densely, as the original's.
 */
#include "kv_method.h"
#include "kv_retr.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const kv_param_def retr_params[] = {
    {"top_k", KV_PARAM_INT, 4096, 1, 1 << 24, NULL, "keys retrieved per head and step"},
    {"from_layer", KV_PARAM_INT, 0, 0, 1 << 16, NULL, "first layer that retrieves"},
    {"n_init", KV_PARAM_INT, 128, 0, 1 << 20, NULL, "sink tokens of the static part"},
    {"n_local", KV_PARAM_INT, 512, 0, 1 << 24, NULL, "recent tokens of the static part"},
    {"list_size", KV_PARAM_INT, 64, 1, 1 << 20, NULL, "keys per index list (k-means lists)"},
    {"recall", KV_PARAM_FLOAT, 0.95, 0.0, 1.0, NULL,
     "top-k recall the prompt's query samples calibrate the index scan to"},
    {"samples", KV_PARAM_INT, 64, 1, 1 << 16, NULL, "last prompt queries used as samples"},
};

typedef struct retr_layer {
    kv_retr_index **ix; /* [n_kv_heads]; NULL: no index yet */
    int64_t boundary;   /* rows n_init..boundary-1 are in the index */
    /* the keys of the first and last indexed rows ([2][n_kv * hd]) when the index took them: a
     * loaded cache that differs there gets a new index */
    float *mark;
} retr_layer;

typedef struct retr_state {
    int64_t top_k, from_layer, n_init, n_local;
    kv_retr_params ip;
    retr_layer *layers;
} retr_state;

static void drop_layer(const kv_method *m, retr_layer *L) {
    if (L->ix)
        for (int32_t h = 0; h < m->geo.n_kv_heads; h++) kv_retr_free(L->ix[h]);
    free(L->ix);
    free(L->mark);
    L->ix = NULL;
    L->mark = NULL;
    L->boundary = 0;
}

static void retr_destroy(kv_method *m) {
    retr_state *st = m->state;
    if (!st) return;
    if (st->layers)
        for (int32_t l = 0; l < m->geo.n_layers; l++) drop_layer(m, &st->layers[l]);
    free(st->layers);
    free(st);
    m->state = NULL;
}

static mi_status retr_create(kv_method *m) {
    retr_state *st = calloc(1, sizeof(*st));
    if (!st) return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    st->layers = calloc((size_t)m->geo.n_layers, sizeof(retr_layer));
    if (!st->layers) {
        free(st);
        return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    m->state = st;
    st->top_k = (int64_t)kv_spec_get(&m->spec, "top_k");
    st->from_layer = (int64_t)kv_spec_get(&m->spec, "from_layer");
    st->n_init = (int64_t)kv_spec_get(&m->spec, "n_init");
    st->n_local = (int64_t)kv_spec_get(&m->spec, "n_local");
    st->ip = kv_retr_default_params();
    st->ip.list_size = (int32_t)kv_spec_get(&m->spec, "list_size");
    st->ip.target_recall = (float)kv_spec_get(&m->spec, "recall");
    m->q_rows = (int64_t)kv_spec_get(&m->spec, "samples");
    return MI_STATUS_SUCCESS;
}

static mi_status retr_clone(const kv_method *m, kv_method *out) {
    const retr_state *src = m->state;
    retr_state *st = calloc(1, sizeof(*st));
    if (!st) return kv_method_fail(out, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    *st = *src;
    st->layers = calloc((size_t)m->geo.n_layers, sizeof(retr_layer));
    out->state = st;
    bool ok = st->layers != NULL;
    for (int32_t l = 0; ok && l < m->geo.n_layers; l++) {
        const retr_layer *a = &src->layers[l];
        retr_layer *b = &st->layers[l];
        if (!a->ix) continue;
        b->ix = calloc((size_t)m->geo.n_kv_heads, sizeof(*b->ix));
        ok = b->ix != NULL;
        b->boundary = a->boundary;
        const size_t mb = (size_t)(2 * m->geo.n_kv_heads * m->geo.head_dim) * sizeof(float);
        if (ok && (ok = (b->mark = malloc(mb)) != NULL)) memcpy(b->mark, a->mark, mb);
        for (int32_t h = 0; ok && h < m->geo.n_kv_heads; h++)
            ok = (b->ix[h] = kv_retr_clone(a->ix[h])) != NULL;
    }
    if (!ok) { /* the framework frees the instance, not its state */
        retr_destroy(out);
        return kv_method_fail(out, MI_STATUS_OUT_OF_MEMORY, "out of memory for a fork's index");
    }
    return MI_STATUS_SUCCESS;
}

/* Rows r0..r1-1 of a layer's keys, head-major: [n_kv][r1 - r0][hd]. */
static float *read_keys(kv_method *m, const mi_kv_seq *seq, int32_t layer, int64_t r0, int64_t r1) {
    const int64_t n = r1 - r0;
    float *k = malloc((size_t)(n * m->geo.n_kv_heads * m->geo.head_dim) * sizeof(float));
    if (!k) return NULL;
    mi_tensor t =
        mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->geo.n_kv_heads, n, m->geo.head_dim);
    if (mi_kv_seq_read(seq, layer, r0, n, &t, NULL) != MI_STATUS_SUCCESS) {
        free(k);
        return NULL;
    }
    return k;
}

/* Whether the layer's rows n_init and boundary - 1 still hold the keys the index took (a
 * session load replaces the rows; a rewind is seen by the row count). */
static bool marks_hold(kv_method *m, const mi_kv_seq *seq, int32_t layer) {
    const retr_state *st = m->state;
    const retr_layer *L = &st->layers[layer];
    const int64_t per = (int64_t)m->geo.n_kv_heads * m->geo.head_dim;
    const int64_t rows[2] = {st->n_init, L->boundary - 1};
    if (L->boundary > mi_kv_seq_length(seq, layer)) return false;
    for (int i = 0; i < 2; i++) {
        float *k = read_keys(m, seq, layer, rows[i], rows[i] + 1);
        const bool same = k && memcmp(k, L->mark + i * per, (size_t)per * sizeof(float)) == 0;
        free(k);
        if (!same) return false;
    }
    return true;
}

/* Records the keys of rows n_init and boundary - 1 (k_first / k_last: [n_kv][hd] rows of a
 * head-major read, stride between heads in rows). */
static void set_mark(kv_method *m, retr_layer *L, int slot, const float *k, int64_t stride) {
    const int32_t hd = m->geo.head_dim;
    const int64_t per = (int64_t)m->geo.n_kv_heads * hd;
    for (int32_t h = 0; h < m->geo.n_kv_heads; h++)
        memcpy(L->mark + slot * per + (int64_t)h * hd, k + (int64_t)h * stride * hd,
               (size_t)hd * sizeof(float));
}

/* Builds a layer's indexes over rows n_init..end-1; q: nq sample queries [nq, n_heads * hd]
 * (post-RoPE), each KV head calibrated with its group's query heads. */
static mi_status build_layer(kv_method *m, const mi_kv_seq *seq, int32_t layer, int64_t end,
                             const float *q, int64_t nq) {
    retr_state *st = m->state;
    retr_layer *L = &st->layers[layer];
    const int32_t n_kv = m->geo.n_kv_heads, hd = m->geo.head_dim, nh = m->geo.n_heads;
    const int32_t group = nh / n_kv;
    const int64_t n = end - st->n_init;
    float *k = read_keys(m, seq, layer, st->n_init, end);
    /* each KV head's query samples, and its index built on a thread of its own (a head's
     * k-means and calibration do not depend on the others) */
    float *qs = nq > 0 ? malloc((size_t)(n_kv * nq * group * hd) * sizeof(float)) : NULL;
    L->ix = calloc((size_t)n_kv, sizeof(*L->ix));
    L->mark = malloc((size_t)(2 * n_kv * hd) * sizeof(float));
    mi_status s = MI_STATUS_SUCCESS;
    if (!k || !L->ix || !L->mark || (nq > 0 && !qs)) s = MI_STATUS_OUT_OF_MEMORY;
    if (s == MI_STATUS_SUCCESS) {
        int failed = 0;
#pragma omp parallel for schedule(dynamic, 1)
        for (int32_t h = 0; h < n_kv; h++) {
            float *mine = qs ? qs + (int64_t)h * nq * group * hd : NULL;
            for (int64_t i = 0; i < nq; i++)
                for (int32_t g = 0; g < group; g++)
                    memcpy(mine + (i * group + g) * hd, q + (i * nh + h * group + g) * (int64_t)hd,
                           (size_t)hd * sizeof(float));
            L->ix[h] =
                kv_retr_build(k + (int64_t)h * n * hd, n, hd, hd, st->n_init, mine, nq * group, hd,
                              (int32_t)(st->top_k < n ? st->top_k : n), &st->ip);
            if (!L->ix[h]) {
#pragma omp atomic write
                failed = 1;
            }
        }
        if (failed) s = MI_STATUS_OUT_OF_MEMORY;
    }
    if (s == MI_STATUS_SUCCESS) {
        set_mark(m, L, 0, k, n);
        set_mark(m, L, 1, k + (n - 1) * hd, n);
    }
    free(k);
    free(qs);
    if (s != MI_STATUS_SUCCESS) {
        drop_layer(m, L);
        return kv_method_fail(m, s, "kv method retr_attn: out of memory building layer %d's index",
                              layer);
    }
    L->boundary = end;
    return MI_STATUS_SUCCESS;
}

/* After a prompt: the index over the old rows, calibrated with the call's last queries. */
static mi_status retr_after_prefill(kv_method *m, mi_kv_seq *seq, int32_t layer, const float *q,
                                    int64_t n) {
    retr_state *st = m->state;
    retr_layer *L = &st->layers[layer];
    const int64_t end = mi_kv_seq_length(seq, layer) - st->n_local;
    if (L->ix && (end < L->boundary || !marks_hold(m, seq, layer))) drop_layer(m, L);
    if (layer < st->from_layer || L->ix || end <= st->n_init) return MI_STATUS_SUCCESS;
    return build_layer(m, seq, layer, end, q, n);
}

/* Rows that left the window go into the index (built, uncalibrated, when there is none). */
static mi_status retr_after_append(kv_method *m, mi_kv_seq *seq, int32_t layer, int64_t n_new) {
    (void)n_new;
    retr_state *st = m->state;
    retr_layer *L = &st->layers[layer];
    const int64_t end = mi_kv_seq_length(seq, layer) - st->n_local;
    if (layer < st->from_layer) return MI_STATUS_SUCCESS;
    if (L->ix && (end < L->boundary || !marks_hold(m, seq, layer)))
        drop_layer(m, L); /* rewound into indexed rows, or another cache loaded */
    if (end <= st->n_init) return MI_STATUS_SUCCESS;
    if (!L->ix) return build_layer(m, seq, layer, end, NULL, 0);
    if (end == L->boundary) return MI_STATUS_SUCCESS;
    float *k = read_keys(m, seq, layer, L->boundary, end);
    if (!k) return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    const int64_t cnt = end - L->boundary;
    const int32_t hd = m->geo.head_dim;
    for (int32_t h = 0; h < m->geo.n_kv_heads; h++)
        for (int64_t i = 0; i < cnt; i++)
            if (!kv_retr_add(L->ix[h], k + ((int64_t)h * cnt + i) * hd, L->boundary + i)) {
                free(k);
                /* a partly grown index cannot stay: rebuilt at the next call */
                drop_layer(m, L);
                return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for an index");
            }
    set_mark(m, L, 1, k + (cnt - 1) * hd, cnt);
    free(k);
    L->boundary = end;
    return MI_STATUS_SUCCESS;
}

static int cmp_id(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : (x > y);
}

static mi_status retr_select(kv_method *m, const mi_kv_seq *seq, int32_t layer, const float *q,
                             int64_t n, kv_selection *sel) {
    retr_state *st = m->state;
    retr_layer *L = &st->layers[layer];
    const int32_t nh = m->geo.n_heads, hd = m->geo.head_dim;
    const int32_t group = nh / m->geo.n_kv_heads;
    const int64_t rows = mi_kv_seq_length(seq, layer);
    /* rewound into indexed rows, or another cache loaded: every row now, rebuilt after */
    if (L->ix && (L->boundary > rows - n || !marks_hold(m, seq, layer))) drop_layer(m, L);
    if (kv_selection_reset(sel, n * nh) != MI_STATUS_SUCCESS)
        return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory selecting keys");
    /* top_k covering every indexed key: all rows, i.e. dense attention */
    const bool dense = !L->ix || st->top_k >= kv_retr_size(L->ix[0]);
    const int64_t lists = n * nh, k = st->top_k;
    int64_t *ids = NULL, *got = NULL;
    mi_status s = MI_STATUS_SUCCESS;
    if (!dense) {
        ids = malloc((size_t)(lists * k) * sizeof(int64_t));
        got = malloc((size_t)lists * sizeof(int64_t));
        if (!ids || !got) s = MI_STATUS_OUT_OF_MEMORY;
    }
    /* the searches, in parallel over (row, head); the spans are then written in order */
    if (!dense && s == MI_STATUS_SUCCESS) {
        int failed = 0;
#pragma omp parallel
        {
            float *sc = malloc((size_t)k * sizeof(float));
            float *scratch = malloc(kv_retr_scratch_floats(L->ix[0]) * sizeof(float));
            if (!sc || !scratch) {
#pragma omp atomic write
                failed = 1;
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < lists; t++) {
                if (!sc || !scratch) continue;
                const int64_t i = t / nh;
                const int32_t h = (int32_t)(t % nh);
                got[t] = kv_retr_search(L->ix[h / group], q + (i * nh + h) * (int64_t)hd,
                                        (int32_t)k, ids + t * k, sc, scratch);
                qsort(ids + t * k, (size_t)got[t], sizeof(int64_t), cmp_id);
            }
            free(sc);
            free(scratch);
        }
        if (failed) s = MI_STATUS_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < n && s == MI_STATUS_SUCCESS; i++) {
        const int64_t end = rows - n + i + 1;
        for (int32_t h = 0; h < nh && s == MI_STATUS_SUCCESS; h++) {
            if (dense) {
                s = kv_selection_push(sel, 0, end);
            } else {
                const int64_t t = i * nh + h, *id = ids + t * k;
                s = kv_selection_push(sel, 0, st->n_init < end ? st->n_init : end);
                for (int64_t j = 0; j < got[t] && s == MI_STATUS_SUCCESS; j++)
                    s = kv_selection_push(sel, id[j], id[j] + 1);
                if (s == MI_STATUS_SUCCESS) s = kv_selection_push(sel, L->boundary, end);
            }
            kv_selection_close(sel);
        }
    }
    free(ids);
    free(got);
    if (s != MI_STATUS_SUCCESS)
        return kv_method_fail(m, s, "kv method retr_attn: out of memory selecting keys");
    return MI_STATUS_SUCCESS;
}

const kv_method_entry kv_method_retr_attn_entry = {
    .name = "retr_attn",
    .summary = "top-k keys from a vector index over the host-resident cache, plus sinks and window",
    .params = retr_params,
    .n_params = (int32_t)(sizeof retr_params / sizeof retr_params[0]),
    .create = retr_create,
    .destroy = retr_destroy,
    .clone = retr_clone,
    .after_append = retr_after_append,
    .after_prefill = retr_after_prefill,
    .select = retr_select,
};
