/*
 * kv_method.h: the KV-cache methods of a session (StreamingLLM, SnapKV, PyramidKV, Quest, KIVI,
 * LeanK, RetrievalAttention), as one table of entries like the prefill pattern table: a name, its
 * keys with defaults and ranges, and hooks the forward pass calls. docs/kv-methods.md describes
 * each method; a spec "METHOD[:key=value,...]" picks one (mi_session_params.kv).
 *
 * The forward pass calls:
 *   select        per layer, before a decode-path attention (calls shorter than the
 *                 prefill-at-offset threshold): per query row and query head, which row spans of
 *                 the layer to read;
 *   after_prefill once every layer has attended, per layer, for a call of two or more tokens,
 *                 with the call's last q_rows queries (post-RoPE): compression (SnapKV's
 *                 observation window);
 *   after_append  then, per layer, after every call (prefill and decode): eviction.
 * A hook that is NULL does nothing (select NULL: every visible row). A hook may shrink the layer
 * with mi_kv_seq_compact (per-head row subsets of one common count) or mi_kv_seq_truncate; it must
 * go through kv_method_compact so that the session can tell which trailing rows are still the
 * last tokens (a rewind may drop only those).
 *
 * Rows and positions: after a compaction the layer's row i is no longer token i. Keys are stored
 * after RoPE at their own positions, so attention needs no position per row; the session keeps
 * the count of tokens seen (the next RoPE position) apart from the rows kept.
 */
#ifndef MI_KV_METHOD_H
#define MI_KV_METHOD_H

#include "minference_kv.h"

#include <stdbool.h>

/* Built into the model runner library (CMakeLists.txt), which calls them; internal to it. */
#include <stddef.h>
#include <stdint.h>

/* Formats a message into msg (size bytes; msg may be NULL) and returns status. */
mi_status kv_msg(char *msg, size_t size, mi_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#define KV_METHOD_MAX_PARAMS 12
#define KV_METHOD_STRING_MAX 512
#define KV_METHOD_ERROR_MAX 512

typedef enum kv_param_kind {
    KV_PARAM_INT,    /* integer in [lo, hi] */
    KV_PARAM_FLOAT,  /* real in [lo, hi] */
    KV_PARAM_ENUM,   /* one of choices ("avgpool|maxpool"); the value is the index */
    KV_PARAM_STRING, /* free text (a file path), up to KV_METHOD_STRING_MAX - 1 bytes */
} kv_param_kind;

typedef struct kv_param_def {
    const char *name;
    kv_param_kind kind;
    double def, lo, hi;
    const char *choices; /* KV_PARAM_ENUM only */
    const char *help;
} kv_param_def;

struct kv_method_entry;

/* A parsed, validated spec. values[i] belongs to entry->params[i] (the default unless given). */
typedef struct kv_spec {
    const struct kv_method_entry *entry;
    double values[KV_METHOD_MAX_PARAMS];
    char strings[KV_METHOD_MAX_PARAMS][KV_METHOD_STRING_MAX];
    uint32_t given; /* bit i: params[i] was in the spec */
} kv_spec;

/* The model's shapes a method instance is built for. */
typedef struct kv_geometry {
    int32_t n_layers, n_heads, n_kv_heads, head_dim, page_tokens;
} kv_geometry;

/* Per query row and query head (list i * n_heads + h), the row spans [start, end) of the layer to
 * read, ascending and disjoint. */
typedef struct kv_selection {
    int64_t n_lists;
    int64_t *offsets; /* [n_lists + 1]: list i is spans offsets[i]..offsets[i+1]-1 */
    int64_t *spans;   /* [2 * n_spans]: start, end */
    int64_t n_spans, cap_lists, cap_spans;
    int64_t open; /* the list being written */
} kv_selection;

typedef struct kv_method kv_method;

typedef struct kv_method_entry {
    const char *name; /* the original's kv_type name */
    const char *summary;
    const kv_param_def *params;
    int32_t n_params;
    /* NULL: usable; else the reason it cannot run here yet (MI_STATUS_UNSUPPORTED) */
    const char *unsupported;
    /* Builds m->state (may stay NULL); the spec is validated already. */
    mi_status (*create)(kv_method *m);
    void (*destroy)(kv_method *m);
    /* A fork's copy of m's state into out->state (out's spec, geometry and tails are copied). */
    mi_status (*clone)(const kv_method *m, kv_method *out);
    mi_status (*after_append)(kv_method *m, mi_kv_seq *seq, int32_t layer, int64_t n_new);
    /* q: the call's n queries [n, n_heads * head_dim] (row-major, f32, after RoPE); the layer's
     * rows already hold the call's K/V at the end. */
    mi_status (*after_prefill)(kv_method *m, mi_kv_seq *seq, int32_t layer, const float *q,
                               int64_t n);
    /* q as above for n rows; row i sees the layer's rows 0..n_rows - n + i. Fills sel with
     * n * n_heads lists (kv_selection_begin / push / end). */
    mi_status (*select)(kv_method *m, const mi_kv_seq *seq, int32_t layer, const float *q,
                        int64_t n, kv_selection *sel);
    /* Storage of the session's cache (KIVI): adjusts the pool parameters and returns true when
     * the session needs a pool of its own (another dtype than the model's pool). */
    bool (*storage)(const kv_method *m, mi_kv_pool_params *pp);
    /* LeanK: the key channels a KV head keeps ([head_dim] 1/0) for rows sink..len - recent - 1
     * of a layer of len rows; NULL: every channel. */
    const uint8_t *(*key_channels)(const kv_method *m, int32_t layer, int32_t kv_head,
                                   int64_t *sink, int64_t *recent);
    /* The rows a layer of len rows keeps after a call of n queries: per KV head *count rows,
     * ascending, at keep + h * *count (keep holds [n_kv_heads][len]); *count == len: the layer
     * stays whole. q [n][n_heads * head_dim] (after RoPE; NULL where the method reads none),
     * k [n_kv_heads][len][head_dim] (NULL likewise). slack: rows a cache may hold past the
     * method's bound before it evicts (a session: a page). The session's hooks and
     * mi_session_kv_keep_rows (a cache outside a session) both apply the rule through it;
     * NULL: the method needs the session's own cache. */
    mi_status (*keep_rows)(kv_method *m, int32_t layer, const float *q, int64_t n, const float *k,
                           int64_t len, int64_t slack, int64_t *keep, int64_t *count);
    /* Whether keep_rows reads k (SnapKV) or only the lengths (StreamingLLM). */
    bool keep_rows_reads_k;
} kv_method_entry;

struct kv_method {
    const kv_method_entry *entry;
    kv_spec spec;
    kv_geometry geo;
    void *state;
    /* per layer: how many trailing rows are the last tokens, in order (rows since the last
     * compaction, plus the part a compaction kept in place) */
    int64_t *exact_tail;
    int64_t q_rows;       /* queries after_prefill wants (the call's last ones); set by create */
    int64_t device_calls; /* calls whose selection and attention ran on the device (CUDA) */
    char error[KV_METHOD_ERROR_MAX];
};

/* The table, in the original's order: dense, streamingllm, snapkv, pyramidkv, quest, retr_attn,
 * kivi, leank. */
int32_t kv_method_count(void);
const kv_method_entry *kv_method_at(int32_t i);
const kv_method_entry *kv_method_find(const char *name);

/* Parses "METHOD[:key=value,...]" (NULL or "" is dense). On error writes a message to err. */
mi_status kv_spec_parse(const char *text, kv_spec *out, char *err, size_t err_size);
/* The value of a key of the spec's method (must exist: a programming error otherwise aborts). */
double kv_spec_get(const kv_spec *s, const char *key);
const char *kv_spec_get_string(const kv_spec *s, const char *key);
bool kv_spec_given(const kv_spec *s, const char *key);
/* "METHOD:key=value,..." with every key, the defaults filled in. */
void kv_spec_format(const kv_spec *s, char *buf, size_t size);

/* An instance for one session; *out NULL for dense (no hooks at all). MI_STATUS_UNSUPPORTED for
 * an entry that is not built. err gets the message on failure. */
mi_status kv_method_create(const kv_spec *spec, const kv_geometry *geo, kv_method **out, char *err,
                           size_t err_size);
void kv_method_destroy(kv_method *m);
mi_status kv_method_clone(const kv_method *m, kv_method **out, char *err, size_t err_size);

/* Hooks as the forward pass calls them (a NULL m or hook: nothing). Messages in m->error.
 * kv_method_appended first: every layer got n rows at its end. */
void kv_method_appended(kv_method *m, int64_t n);
mi_status kv_method_after_append(kv_method *m, mi_kv_seq *seq, int32_t layer, int64_t n_new);
mi_status kv_method_after_prefill(kv_method *m, mi_kv_seq *seq, int32_t layer, const float *q,
                                  int64_t n);
bool kv_method_selects(const kv_method *m);
mi_status kv_method_select(kv_method *m, const mi_kv_seq *seq, int32_t layer, const float *q,
                           int64_t n, kv_selection *sel);
/* Rows the session may rewind: the shortest exact tail over the layers. */
int64_t kv_method_rewindable(const kv_method *m);
/* After a rewind / failed call truncated every layer by n rows. */
void kv_method_rewound(kv_method *m, int64_t n);
/* After a load replaced the rows (every row is its token again). */
void kv_method_reset_tails(kv_method *m, const mi_kv_seq *seq);

/* Compacts a layer (mi_kv_seq_compact) and updates its exact tail. keep: [n_kv_heads][count]. */
mi_status kv_method_compact(kv_method *m, mi_kv_seq *seq, int32_t layer, int64_t count,
                            const int64_t *keep);
mi_status kv_method_fail(kv_method *m, mi_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Selection lists. */
void kv_selection_init(kv_selection *sel);
void kv_selection_free(kv_selection *sel);
/* Empties sel for n_lists lists (allocation failure: MI_STATUS_OUT_OF_MEMORY). */
mi_status kv_selection_reset(kv_selection *sel, int64_t n_lists);
/* Adds [start, end) to the open list (merged with the previous span when they touch); lists are
 * written in order: list i is closed by kv_selection_close. */
mi_status kv_selection_push(kv_selection *sel, int64_t start, int64_t end);
void kv_selection_close(kv_selection *sel);

/* Scratch memory a method keeps from one layer to the next of a call: the buffers of a long
 * context are hundreds of MiB, and a fresh allocation per layer faults every page in again. */
typedef struct kv_scratch {
    void *p;
    size_t cap;
} kv_scratch;
/* At least `bytes` (64-byte aligned; the contents are not kept); NULL when out of memory. */
void *kv_scratch_get(kv_scratch *s, size_t bytes);
void kv_scratch_free(kv_scratch *s);

/* The methods' rules, exposed for their reference tests. */
/* SnapKV's selection: q [w][n_heads * hd] (the last w queries), k [n_kv][len][hd]; keep
 * [n_kv][n_keep + w] gets, per KV head, its n_keep highest-scoring rows of 0..len-w-1 ascending,
 * then the window's rows. pooling 0: avgpool, 1: maxpool; kernel odd. scratch (may be NULL)
 * holds its buffers. */
mi_status kv_snapkv_select(const float *q, int64_t w, const float *k, int64_t len, int32_t n_heads,
                           int32_t n_kv, int32_t hd, int64_t kernel, int pooling, int64_t n_keep,
                           int64_t *keep, kv_scratch *scratch);
/* PyramidKV's rows kept before the window in a layer of len rows; -1: the layer stays whole. */
int64_t kv_pyramid_prefix_budget(int64_t capacity, int64_t window, int64_t beta, int32_t n_layers,
                                 int32_t layer, int64_t len);
/* Quest's bound of q.k over a page: minmax [2][hd] (min then max). */
float kv_quest_bound(const float *q, const float *minmax, int32_t hd);
/* Quest's page count for a token budget over n_pages pages. */
int64_t kv_quest_pages(int64_t budget, int32_t page_tokens, int64_t n_pages);

/* The entries, each in its own file. */
extern const kv_method_entry kv_method_dense_entry;
extern const kv_method_entry kv_method_streamingllm_entry;
extern const kv_method_entry kv_method_snapkv_entry;
extern const kv_method_entry kv_method_pyramidkv_entry;
extern const kv_method_entry kv_method_quest_entry;
extern const kv_method_entry kv_method_retr_attn_entry;
extern const kv_method_entry kv_method_kivi_entry;
extern const kv_method_entry kv_method_leank_entry;

#endif /* MI_KV_METHOD_H */
