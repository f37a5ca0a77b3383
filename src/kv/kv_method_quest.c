/*
 * kv_method_quest.c: Quest (Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context
 * LLM Inference"). Per page, the pool keeps the channel-wise min and max of the keys
 * (MI_KV_META_KEY_MINMAX); at each decode step, per query head, the page's upper bound of q.k is
 * sum_d max(q_d min_d, q_d max_d); the top pages within the token budget are read, nothing else.
 * Prefill and the first dense_layers layers attend densely, as in the original code.
 *
 * Defaults: token_budget 1024 and the first 2 layers dense (the original's). The page is the
 * cache's own page (64 tokens), where the original uses 16-token chunks: the bounds are the
 * metadata the pool already keeps per page, and a page is the unit an offloaded cache moves.
 * The number of pages is max(3, token_budget / page) as in the original, capped at the pages
 * there are; nothing is evicted (the cache stays whole, only reading is sparse).
 */
#include "kv_method.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* (query, head) lists ranked per parallel round: bounds the chosen pages' memory */
#define QUEST_LISTS 4096

static const kv_param_def quest_params[] = {
    {"token_budget", KV_PARAM_INT, 1024, 1, 1 << 30, NULL, "tokens read per head and step"},
    {"chunk_size", KV_PARAM_INT, 64, 1, 1 << 16, NULL,
     "tokens per page (must be the cache's page size)"},
    {"dense_layers", KV_PARAM_INT, 2, 0, 1 << 16, NULL, "first layers that read every page"},
};

typedef struct quest_state {
    int64_t budget, dense_layers;
} quest_state;

static mi_status quest_create(kv_method *m) {
    const int64_t chunk = (int64_t)kv_spec_get(&m->spec, "chunk_size");
    if (chunk != m->geo.page_tokens)
        return kv_method_fail(m, MI_STATUS_INVALID_ARGUMENT,
                              "kv method quest: chunk_size %lld must be the cache's page size "
                              "(%d tokens): the bounds are kept per page",
                              (long long)chunk, m->geo.page_tokens);
    quest_state *st = malloc(sizeof(*st));
    if (!st) return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    st->budget = (int64_t)kv_spec_get(&m->spec, "token_budget");
    st->dense_layers = (int64_t)kv_spec_get(&m->spec, "dense_layers");
    m->state = st;
    return MI_STATUS_SUCCESS;
}

static void quest_destroy(kv_method *m) { free(m->state); }

static mi_status quest_clone(const kv_method *m, kv_method *out) {
    quest_state *st = malloc(sizeof(*st));
    if (!st) return kv_method_fail(out, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    *st = *(const quest_state *)m->state;
    out->state = st;
    return MI_STATUS_SUCCESS;
}

float kv_quest_bound(const float *q, const float *minmax, int32_t hd) {
    /* eight running sums, which vectorise (one chain of adds cannot, without reassociation) */
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int32_t d = 0;
    for (; d + 8 <= hd; d += 8)
        for (int u = 0; u < 8; u++) {
            const float a = q[d + u] * minmax[d + u], b = q[d + u] * minmax[hd + d + u];
            acc[u] += a > b ? a : b;
        }
    float s = 0.0f;
    for (; d < hd; d++) {
        const float a = q[d] * minmax[d], b = q[d] * minmax[hd + d];
        s += a > b ? a : b;
    }
    for (int u = 0; u < 8; u++) s += acc[u];
    return s;
}

typedef struct page_rank {
    float bound;
    int64_t page;
} page_rank;

static inline void swap_rank(page_rank *a, page_rank *b) {
    const page_rank x = *a;
    *a = *b;
    *b = x;
}

static int by_bound(const void *a, const void *b) {
    const page_rank *x = a, *y = b;
    if (x->bound != y->bound) return x->bound > y->bound ? -1 : 1;
    return x->page < y->page ? -1 : x->page > y->page;
}

/* Leaves the k pages first by by_bound (any order) at a[0..k): quickselect, median of three,
 * expected O(n) where a sort of every page was O(n log n). by_bound is a strict total order (the
 * page breaks ties), so the set is the sort's. */
static void top_by_bound(page_rank *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (k > 0 && k < n && lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (by_bound(&a[mid], &a[lo]) < 0) swap_rank(&a[mid], &a[lo]);
        if (by_bound(&a[hi], &a[lo]) < 0) swap_rank(&a[hi], &a[lo]);
        if (by_bound(&a[hi], &a[mid]) < 0) swap_rank(&a[hi], &a[mid]);
        const page_rank pivot = a[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (by_bound(&a[i], &pivot) < 0) i++;
            while (by_bound(&pivot, &a[j]) < 0) j--;
            if (i <= j) swap_rank(&a[i++], &a[j--]);
        }
        /* a[lo..j] rank before a[j+1..i-1] (the pivot) before a[i..hi] */
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

static int by_page(const void *a, const void *b) {
    const page_rank *x = a, *y = b;
    return x->page < y->page ? -1 : x->page > y->page;
}

int64_t kv_quest_pages(int64_t budget, int32_t page_tokens, int64_t n_pages) {
    int64_t k = budget / page_tokens;
    if (k < 3) k = 3;
    return k < n_pages ? k : n_pages;
}

static mi_status quest_select(kv_method *m, const mi_kv_seq *seq, int32_t layer, const float *q,
                              int64_t n, kv_selection *sel) {
    const quest_state *st = m->state;
    const int32_t nh = m->geo.n_heads, hd = m->geo.head_dim, pt = m->geo.page_tokens;
    const int32_t group = nh / m->geo.n_kv_heads;
    const int64_t rows = mi_kv_seq_length(seq, layer);
    const int64_t n_pages = (rows + pt - 1) / pt;
    if (kv_selection_reset(sel, n * nh) != MI_STATUS_SUCCESS)
        return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory selecting pages");
    const float **meta = NULL;
    page_rank *rank = NULL;
    int64_t *chosen = NULL;
    mi_status s = MI_STATUS_SUCCESS;
    const bool dense = layer < st->dense_layers;
    if (!dense) {
        meta = malloc((size_t)(n_pages ? n_pages : 1) * sizeof(*meta));
        rank = malloc((size_t)(n_pages ? n_pages : 1) * sizeof(*rank));
        if (!meta || !rank) {
            s = kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory selecting pages");
            goto done;
        }
        for (int64_t p = 0; p < n_pages; p++) {
            mi_kv_page_view v;
            if ((s = mi_kv_seq_page(seq, layer, p, &v)) != MI_STATUS_SUCCESS || !v.key_minmax) {
                s = kv_method_fail(m, s ? s : MI_STATUS_INTERNAL,
                                   "kv method quest: layer %d page %lld has no key bounds", layer,
                                   (long long)p);
                goto done;
            }
            meta[p] = v.key_minmax;
        }
    }
    /* The query heads of one KV head (a group) are ranked together, on threads, so that each
     * page's bounds are read once for the group; lists are written in list order afterwards,
     * a whole number of rows' lists (at least one row) a round. */
    const int64_t kmax = dense ? 1 : kv_quest_pages(st->budget, pt, n_pages), lists = n * nh;
    const int64_t round = QUEST_LISTS >= nh ? QUEST_LISTS - QUEST_LISTS % nh : nh;
    const int nt = omp_get_max_threads();
    if (!dense) {
        chosen = malloc((size_t)round * (size_t)(kmax ? kmax : 1) * sizeof(*chosen));
        page_rank *more = realloc(rank, (size_t)nt * (size_t)group *
                                            (size_t)(n_pages ? n_pages : 1) * sizeof(*rank));
        if (more) rank = more;
        if (!chosen || !more) {
            s = kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory selecting pages");
            goto done;
        }
    }
    for (int64_t l0 = 0; l0 < lists && s == MI_STATUS_SUCCESS; l0 += round) {
        const int64_t l1 = l0 + round < lists ? l0 + round : lists;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (!dense)
        for (int64_t gi = l0 / group; gi < l1 / group; gi++) {
            const int64_t li0 = gi * group, i = li0 / nh, end = rows - n + i + 1;
            const int64_t pages = (end + pt - 1) / pt;
            const int32_t h0 = (int32_t)(li0 % nh), kh = h0 / group;
            if (dense || end <= st->budget) continue; /* every row: written below */
            page_rank *rk = rank + (size_t)omp_get_thread_num() * (size_t)group * (size_t)n_pages;
            const float *qg = q + (i * nh + h0) * (int64_t)hd;
            for (int64_t p = 0; p < pages; p++) {
                const float *mm = meta[p] + (int64_t)kh * 2 * hd;
                for (int32_t g = 0; g < group; g++)
                    rk[g * n_pages + p] = (page_rank){kv_quest_bound(qg + g * hd, mm, hd), p};
            }
            const int64_t k = kv_quest_pages(st->budget, pt, pages);
            for (int32_t g = 0; g < group; g++) {
                page_rank *r = rk + g * n_pages;
                top_by_bound(r, pages, k);
                qsort(r, (size_t)k, sizeof(*r), by_page);
                for (int64_t t = 0; t < k; t++) chosen[(li0 + g - l0) * kmax + t] = r[t].page;
            }
        }
        for (int64_t li = l0; li < l1 && s == MI_STATUS_SUCCESS; li++) {
            const int64_t i = li / nh, end = rows - n + i + 1, pages = (end + pt - 1) / pt;
            if (dense || end <= st->budget) {
                s = kv_selection_push(sel, 0, end);
            } else {
                const int64_t k = kv_quest_pages(st->budget, pt, pages);
                for (int64_t t = 0; t < k && s == MI_STATUS_SUCCESS; t++) {
                    const int64_t r0 = chosen[(li - l0) * kmax + t] * pt;
                    s = kv_selection_push(sel, r0, r0 + pt < end ? r0 + pt : end);
                }
            }
            if (s == MI_STATUS_SUCCESS)
                kv_selection_close(sel);
            else
                s = kv_method_fail(m, s, "out of memory selecting pages");
        }
    }
done:
    free(chosen);
    free(meta);
    free(rank);
    return s;
}

const kv_method_entry kv_method_quest_entry = {
    .name = "quest",
    .summary = "per decode step and head, the pages with the largest q.k upper bound",
    .params = quest_params,
    .n_params = (int32_t)(sizeof quest_params / sizeof quest_params[0]),
    .create = quest_create,
    .destroy = quest_destroy,
    .clone = quest_clone,
    .select = quest_select,
};
