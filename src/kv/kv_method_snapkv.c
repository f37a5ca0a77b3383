/*
 * kv_method_snapkv.c: SnapKV (Li et al., "SnapKV: LLM Knows What You are Looking for Before
 * Generation") and PyramidKV (Cai et al., "PyramidKV: Dynamic KV Cache Compression based on
 * Pyramidal Information Funneling"), which shares SnapKV's selection and changes the budget per
 * layer.
 *
 * After a prefill call, per layer: the observation window is the call's last window_size queries;
 * each attends (causal softmax, scale 1/sqrt(head_dim)) to the layer's rows; the probabilities
 * given to the rows before the window are summed over the window's queries, pooled along the rows
 * (kernel_size, avgpool or maxpool, "same" padding), and each head keeps its top rows, plus the
 * window itself. Defaults are the original code's: window_size 32, max_capacity_prompt 4096,
 * kernel_size 5, avgpool; PyramidKV beta 20.
 *
 * Grouped-query attention: the original repeats each KV head for its query heads and keeps a
 * selection per query head (the cache grows by the group size). Here the cache stays per KV head:
 * a KV head ranks the rows by the sum of its query heads' pooled scores.
 */
#include "kv_method.h"

#include "../core/simd.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static const kv_param_def snap_params[] = {
    {"window_size", KV_PARAM_INT, 32, 1, 1 << 16, NULL, "observation window (last queries)"},
    {"max_capacity_prompt", KV_PARAM_INT, 4096, 2, 1 << 26, NULL, "rows kept per head"},
    {"kernel_size", KV_PARAM_INT, 5, 1, 255, NULL, "pooling kernel (odd)"},
    {"pooling", KV_PARAM_ENUM, 0, 0, 1, "avgpool|maxpool", "pooling of the window's scores"},
};

static const kv_param_def pyramid_params[] = {
    {"window_size", KV_PARAM_INT, 32, 1, 1 << 16, NULL, "observation window (last queries)"},
    {"max_capacity_prompt", KV_PARAM_INT, 4096, 2, 1 << 26, NULL, "mean rows kept per head"},
    {"kernel_size", KV_PARAM_INT, 5, 1, 255, NULL, "pooling kernel (odd)"},
    {"pooling", KV_PARAM_ENUM, 0, 0, 1, "avgpool|maxpool", "pooling of the window's scores"},
    {"beta", KV_PARAM_INT, 20, 1, 1 << 20, NULL, "top layer's share: (capacity - window) / beta"},
};

typedef struct snap_state {
    int64_t window, capacity, kernel, beta;
    int pooling; /* 0 avg, 1 max */
    bool pyramid;
    /* the keys read and the selection's buffers, kept from one layer to the next of a call
     * (freed after the last layer) */
    kv_scratch keys, select;
} snap_state;

int64_t kv_pyramid_prefix_budget(int64_t capacity, int64_t window, int64_t beta, int32_t n_layers,
                                 int32_t layer, int64_t len) {
    if (len < capacity) return -1; /* the original leaves shorter prompts alone */
    const int64_t base = capacity - window;
    if (len < 2 * base) return base; /* too short to shape: SnapKV's budget */
    int64_t min_num = base / beta, max_num = 2 * base - min_num;
    if (max_num >= len - window) {
        max_num = len - window;
        min_num = 2 * base - max_num;
    }
    const int64_t steps = n_layers > 1 ? (max_num - min_num) / (n_layers - 1) : 0;
    int64_t keep = max_num - (int64_t)layer * steps;
    if (keep < 0) keep = 0;
    if (keep > len - window) keep = len - window;
    return keep;
}

/* Row i of the window's scores: row[j] = exp(row[j] - max) for the visible j (0 after), and
 * sum[j] += row[j] / total for the prefix j < prefix. Vectors of VL; exp as 2^((x - max) log2 e),
 * within a few float ulps of expf. */
static inline vf load_u(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v); /* rows start anywhere: an unaligned load */
    return v;
}

static void window_row(float *row, int64_t visible, int64_t prefix, float *sum) {
    vf m = vset1(-INFINITY);
    int64_t j = 0;
    for (; j + VL <= visible; j += VL) m = vmax(m, load_u(row + j));
    float mx = -INFINITY;
    for (int i = 0; i < VL; i++) mx = m[i] > mx ? m[i] : mx;
    for (; j < visible; j++) mx = row[j] > mx ? row[j] : mx;
    const vf vmx = vset1(mx), l2e = vset1(1.4426950408889634f);
    vf z = vset1(0.0f);
    for (j = 0; j + VL <= visible; j += VL) {
        const vf e = vexp2((load_u(row + j) - vmx) * l2e);
        memcpy(row + j, &e, sizeof e);
        z += e;
    }
    float total = hsum(z);
    for (; j < visible; j++) total += (row[j] = exp2f((row[j] - mx) * 1.4426950408889634f));
    const float inv = 1.0f / total;
    for (j = 0; j < prefix; j++) sum[j] += row[j] * inv;
}

typedef struct rank_item {
    float score;
    int64_t row;
} rank_item;

static int by_score(const void *a, const void *b) {
    const rank_item *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

static int by_row(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

mi_status kv_snapkv_select(const float *q, int64_t w, const float *k, int64_t len, int32_t n_heads,
                           int32_t n_kv, int32_t hd, int64_t kernel, int pooling, int64_t n_keep,
                           int64_t *keep, kv_scratch *scratch) {
    const int64_t prefix = len - w;
    if (w < 1 || prefix < 0 || n_keep < 0 || n_keep > prefix || kernel < 1 || !(kernel & 1))
        return MI_STATUS_INVALID_ARGUMENT;
    const int32_t group = n_heads / n_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t P = prefix ? prefix : 1, count = n_keep + w;
    /* Heads on threads, each with its own scores and pooled row (summed into its KV head's in
     * head order afterwards, so the result does not depend on the thread count). */
    const int nt = omp_get_max_threads() < n_heads ? omp_get_max_threads() : n_heads;
    /* one block for every buffer: scores [nt][w][len], sums [nt][P], pooled rows per query head
     * [n_heads][P] and per KV head [n_kv][P], rank items [n_kv][P] (64-byte aligned parts) */
    const size_t a = 16; /* floats per 64 bytes */
    const size_t n_sc = ((size_t)nt * (size_t)(w * len) + a - 1) / a * a;
    const size_t n_sum = ((size_t)nt * (size_t)P + a - 1) / a * a;
    const size_t n_hp = ((size_t)n_heads * (size_t)P + a - 1) / a * a;
    const size_t n_pool = ((size_t)n_kv * (size_t)P + a - 1) / a * a;
    const size_t bytes = (n_sc + n_sum + n_hp + n_pool) * sizeof(float) +
                         (size_t)n_kv * (size_t)P * sizeof(rank_item);
    kv_scratch own = {NULL, 0};
    float *sc = kv_scratch_get(scratch ? scratch : &own, bytes);
    if (!sc) return MI_STATUS_OUT_OF_MEMORY;
    float *sum = sc + n_sc, *head_pool = sum + n_sum, *pooled = head_pool + n_hp;
    rank_item *items = (rank_item *)(pooled + n_pool);
    memset(pooled, 0, (size_t)(n_kv * P) * sizeof(float));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int32_t h = 0; h < n_heads; h++) {
        const int32_t kh = h / group;
        float *my_sc = sc + (size_t)omp_get_thread_num() * (size_t)(w * len);
        float *my_sum = sum + (size_t)omp_get_thread_num() * (size_t)P;
        /* scores of the window's queries against every row: [w, len] (one thread's BLAS) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)w, (int)len, hd, scale,
                    q + (int64_t)h * hd, n_heads * hd, k + (int64_t)kh * len * hd, hd, 0.0f, my_sc,
                    (int)len);
        for (int64_t j = 0; j < prefix; j++) my_sum[j] = 0.0f;
        for (int64_t i = 0; i < w; i++) /* causal inside the window */
            window_row(my_sc + i * len, prefix + i + 1, prefix, my_sum);
        float *pool = head_pool + (int64_t)h * P;
        const int64_t half = kernel / 2;
        for (int64_t j = 0; j < prefix; j++) {
            float acc = pooling ? -INFINITY : 0.0f;
            for (int64_t t = j - half; t <= j + half; t++) {
                if (t < 0 || t >= prefix) continue; /* zero padding (avg), -inf (max) */
                if (pooling)
                    acc = my_sum[t] > acc ? my_sum[t] : acc;
                else
                    acc += my_sum[t];
            }
            pool[j] = pooling ? acc : acc / (float)kernel;
        }
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int32_t kh = 0; kh < n_kv; kh++) {
        float *pool = pooled + (int64_t)kh * P;
        for (int32_t h = kh * group; h < kh * group + group; h++) /* in head order */
            for (int64_t j = 0; j < prefix; j++) pool[j] += head_pool[(int64_t)h * P + j];
        rank_item *it = items + (int64_t)kh * P;
        int64_t *out = keep + (int64_t)kh * count;
        for (int64_t j = 0; j < prefix; j++) it[j] = (rank_item){pool[j], j};
        qsort(it, (size_t)prefix, sizeof(rank_item), by_score);
        for (int64_t i = 0; i < n_keep; i++) out[i] = it[i].row;
        qsort(out, (size_t)n_keep, sizeof(int64_t), by_row);
        for (int64_t i = 0; i < w; i++) out[n_keep + i] = prefix + i;
    }
    kv_scratch_free(&own);
    return MI_STATUS_SUCCESS;
}

static mi_status snap_create_common(kv_method *m, bool pyramid) {
    snap_state *st = calloc(1, sizeof(*st));
    if (!st) return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    st->window = (int64_t)kv_spec_get(&m->spec, "window_size");
    st->capacity = (int64_t)kv_spec_get(&m->spec, "max_capacity_prompt");
    st->kernel = (int64_t)kv_spec_get(&m->spec, "kernel_size");
    st->pooling = (int)kv_spec_get(&m->spec, "pooling");
    st->beta = pyramid ? (int64_t)kv_spec_get(&m->spec, "beta") : 1;
    st->pyramid = pyramid;
    const char *name = m->entry->name;
    if (st->capacity <= st->window) {
        kv_method_fail(m, MI_STATUS_INVALID_ARGUMENT,
                       "kv method %s: max_capacity_prompt (%lld) must exceed window_size (%lld)",
                       name, (long long)st->capacity, (long long)st->window);
        free(st);
        return MI_STATUS_INVALID_ARGUMENT;
    }
    if (!(st->kernel & 1)) {
        free(st);
        return kv_method_fail(m, MI_STATUS_INVALID_ARGUMENT,
                              "kv method %s: kernel_size must be odd (pooling keeps the length)",
                              name);
    }
    m->state = st;
    m->q_rows = st->window;
    return MI_STATUS_SUCCESS;
}

static mi_status snap_create(kv_method *m) { return snap_create_common(m, false); }
static mi_status pyramid_create(kv_method *m) { return snap_create_common(m, true); }
static void snap_destroy(kv_method *m) {
    snap_state *st = m->state;
    if (st) {
        kv_scratch_free(&st->keys);
        kv_scratch_free(&st->select);
    }
    free(st);
}

static mi_status snap_clone(const kv_method *m, kv_method *out) {
    snap_state *st = malloc(sizeof(*st));
    if (!st) return kv_method_fail(out, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    *st = *(const snap_state *)m->state;
    st->keys = st->select = (kv_scratch){NULL, 0}; /* buffers are not shared */
    out->state = st;
    return MI_STATUS_SUCCESS;
}

/* The prefix rows a layer of len rows keeps; -1: leave it whole. */
static int64_t prefix_budget(const kv_method *m, int32_t layer, int64_t len, int64_t w) {
    const snap_state *st = m->state;
    if (st->pyramid)
        return kv_pyramid_prefix_budget(st->capacity, w, st->beta, m->geo.n_layers, layer, len);
    return len < st->capacity ? -1 : st->capacity - w;
}

/* The observation window (w) and the prefix rows kept (n_keep) after a call of n queries over
 * len rows; false: the layer stays whole. */
static bool snap_plan(const kv_method *m, int32_t layer, int64_t len, int64_t n, int64_t *w,
                      int64_t *n_keep) {
    const snap_state *st = m->state;
    if (n < 2) return false; /* compression follows a prefill call only */
    /* a call shorter than the window observes with the queries it has */
    *w = n < st->window ? n : st->window;
    if (*w > len) return false;
    *n_keep = prefix_budget(m, layer, len, *w);
    return *n_keep >= 0 && *n_keep + *w < len;
}

static mi_status snap_keep_with(kv_method *m, int32_t layer, const float *q, int64_t n,
                                const float *k, int64_t len, int64_t *keep, int64_t *count,
                                kv_scratch *scratch) {
    const snap_state *st = m->state;
    int64_t w = 0, n_keep = 0;
    *count = len;
    if (!snap_plan(m, layer, len, n, &w, &n_keep)) return MI_STATUS_SUCCESS;
    mi_status s = kv_snapkv_select(q + (n - w) * (int64_t)m->geo.n_heads * m->geo.head_dim, w, k,
                                   len, m->geo.n_heads, m->geo.n_kv_heads, m->geo.head_dim,
                                   st->kernel, st->pooling, n_keep, keep, scratch);
    if (s != MI_STATUS_SUCCESS) return kv_method_fail(m, s, "selecting rows of layer %d", layer);
    *count = n_keep + w;
    return MI_STATUS_SUCCESS;
}

static mi_status snap_keep(kv_method *m, int32_t layer, const float *q, int64_t n, const float *k,
                           int64_t len, int64_t slack, int64_t *keep, int64_t *count) {
    (void)slack;
    return snap_keep_with(m, layer, q, n, k, len, keep, count, NULL);
}

static mi_status snap_compress(kv_method *m, mi_kv_seq *seq, int32_t layer, const float *q,
                               int64_t n) {
    snap_state *st = m->state;
    const int64_t len = mi_kv_seq_length(seq, layer);
    int64_t w = 0, n_keep = 0;
    mi_status s = MI_STATUS_SUCCESS;
    if (snap_plan(m, layer, len, n, &w, &n_keep)) {
        const int32_t H = m->geo.n_kv_heads, hd = m->geo.head_dim;
        float *k = kv_scratch_get(&st->keys, (size_t)(len * H * hd) * sizeof(float));
        int64_t *keep = malloc((size_t)((n_keep + w) * H) * sizeof(int64_t));
        if (!k || !keep) {
            s = kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory compressing %lld rows",
                               (long long)len);
        } else {
            mi_tensor tk = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, len, hd);
            int64_t count = len;
            s = mi_kv_seq_read(seq, layer, 0, len, &tk, NULL);
            if (s != MI_STATUS_SUCCESS)
                kv_method_fail(m, s, "reading layer %d: %s", layer,
                               mi_kv_pool_last_error(mi_kv_seq_pool(seq)));
            else if ((s = snap_keep_with(m, layer, q, n, k, len, keep, &count, &st->select)) ==
                         MI_STATUS_SUCCESS &&
                     count < len)
                s = kv_method_compact(m, seq, layer, count, keep);
        }
        free(keep);
    }
    /* the call's last layer: nothing more to reuse the buffers for */
    if (layer == m->geo.n_layers - 1 || s != MI_STATUS_SUCCESS) {
        kv_scratch_free(&st->keys);
        kv_scratch_free(&st->select);
    }
    return s;
}

const kv_method_entry kv_method_snapkv_entry = {
    .name = "snapkv",
    .summary = "after prefill, per head the rows most attended by the last queries, plus them",
    .params = snap_params,
    .n_params = (int32_t)(sizeof snap_params / sizeof snap_params[0]),
    .create = snap_create,
    .destroy = snap_destroy,
    .clone = snap_clone,
    .after_prefill = snap_compress,
    .keep_rows = snap_keep,
    .keep_rows_reads_k = true,
};

const kv_method_entry kv_method_pyramidkv_entry = {
    .name = "pyramidkv",
    .summary = "SnapKV's selection with budgets shrinking from lower to upper layers",
    .params = pyramid_params,
    .n_params = (int32_t)(sizeof pyramid_params / sizeof pyramid_params[0]),
    .create = pyramid_create,
    .destroy = snap_destroy,
    .clone = snap_clone,
    .after_prefill = snap_compress,
    .keep_rows = snap_keep,
    .keep_rows_reads_k = true,
};
