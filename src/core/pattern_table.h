/*
 * pattern_table.h: the traits of a sparse pattern, one entry per pattern in the table
 * (pattern_entries.h), and the per-head plan built from it once for every backend
 * (prefill_plan.c).
 *
 * Everything the library knows about a pattern is in its entry: the names it is read and
 * written under, the mi_head_pattern fields it reads and their defaults, what the config file's
 * two sizes carry, the keys a row keeps, how the search scales its budget, which estimate and
 * which kernel run it, and how it fills its head's plan. Names, config I/O, validation, the
 * search and the plan read the entry; no other file switches over mi_pattern_type. What a
 * backend does per pattern is keyed by the plan's steps (mi_plan_kernel, mi_plan_estimate),
 * and its measured dense-fallback crossover by a rule it passes to mi_prefill_plan_build.
 */
#ifndef MI_PATTERN_TABLE_H
#define MI_PATTERN_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of entries (== the public mi_pattern_count()); types are 0 .. MI_PATTERN_TYPES - 1. */
#define MI_PATTERN_TYPES 10
#define MI_PATTERN_MAX_ALIASES 3
#define MI_PATTERN_MAX_FIELDS 7

/* The kernel a head runs (each backend implements the first three; a backend without one of
 * the others refuses the pattern with MI_STATUS_UNSUPPORTED). */
typedef enum mi_plan_kernel {
    MI_PLAN_KERNEL_DENSE = 0,   /* every causal key */
    MI_PLAN_KERNEL_WINDOW = 1,  /* n_init sinks + an n_local window; the last n_last rows dense */
    MI_PLAN_KERNEL_INDEX = 2,   /* a block index (64-key ranges + gathered columns) */
    MI_PLAN_KERNEL_ROWMASK = 3, /* a fixed per-row key set (dilated, strided): each row its own */
    MI_PLAN_KERNEL_INFLLM = 4,  /* InfLLM: query chunks over sinks, window and retrieved blocks */
} mi_plan_kernel;

/* How an index head's index is found from q/k (each backend implements every one). */
typedef enum mi_plan_estimate {
    MI_PLAN_ESTIMATE_NONE = 0,
    MI_PLAN_ESTIMATE_VS = 1,    /* vertical and slash sets from the last queries, then the index */
    MI_PLAN_ESTIMATE_BLOCK = 2, /* mean-pooled 64-block scores, top-k per row block */
    MI_PLAN_ESTIMATE_XATTN = 3, /* antidiagonal block mass, cumulative threshold per row block */
    MI_PLAN_ESTIMATE_FLEX = 4,  /* FlexPrefill: query-aware or vertical-slash blocks */
    MI_PLAN_ESTIMATES = 5,
} mi_plan_estimate;

/* One head's plan: what it runs on sequences of at least dense_below tokens (shorter ones run
 * dense, without estimate or index). */
typedef struct mi_head_plan {
    mi_pattern_type type;
    mi_plan_kernel kernel;
    mi_plan_estimate estimate;
    int32_t dense_below;             /* 0: never dense by length */
    int32_t n_init, n_local, n_last; /* MI_PLAN_KERNEL_WINDOW (n_last 0: A-shape) */
    int32_t vertical, slash;         /* MI_PLAN_ESTIMATE_VS: budgets after the minimums, <= L */
    int32_t top_k;                   /* MI_PLAN_ESTIMATE_BLOCK: blocks per row block, as given */
    int32_t stride;      /* XATTN: antidiagonal stride; ROWMASK: dilation or period (>= 1) */
    int32_t threshold;   /* XATTN: tau, FLEX: gamma (per mille, <= 1000) */
    int32_t tau;         /* FLEX: the sqrt-JS-divergence threshold (per mille) */
    int32_t dense_local; /* ROWMASK, dilated: dense local keys before the dilated span */
    bool strided;        /* ROWMASK: the strided rule (else the dilated one) */
    /* INFLLM (with n_init, n_local, top_k): block, representatives, query chunk, per-head */
    int32_t block_size, repr_topk, chunk_size, per_head;
} mi_head_plan;

/* A mi_head_pattern field a pattern reads, with its default (the original's). */
typedef struct mi_pattern_field_def {
    const char *name; /* the field's name in mi_head_pattern */
    size_t offset;
    int32_t default_value;
} mi_pattern_field_def;

typedef struct mi_pattern_traits {
    mi_pattern_type type;
    const char *name; /* written to config files */
    /* Also read; NULL-terminated. The first, where the config name is not short, is the name
     * the tools print ("a_shape" for "stream_llm"). */
    const char *aliases[MI_PATTERN_MAX_ALIASES];
    mi_pattern_field_def fields[MI_PATTERN_MAX_FIELDS]; /* {NULL} after the last */
    /* The fields the config file's [pattern, size1, size2, score] sizes carry (offsets into
     * mi_head_pattern). A size of 0 read into a field flagged zero_is_default keeps the
     * field's default. */
    size_t config_field[2];
    bool zero_is_default[2];
    mi_plan_kernel kernel;
    mi_plan_estimate estimate;
    /* Keys a row keeps whatever the length (static and block budgets; NULL: none fixed). The
     * backends' dense-fallback rules scale with it. */
    int64_t (*kept_keys)(const mi_head_pattern *p);
    /* The search's budget scale by s (NULL: the pattern has no budget). */
    void (*scale)(const mi_head_pattern *base, double s, mi_head_pattern *out);
    /* Fills the pattern's fields of plan (window or budgets) for sequences of padded length L. */
    void (*plan)(const mi_head_pattern *p, const mi_prefill_params *pp, int64_t L,
                 mi_head_plan *plan);
    /* Whether the pattern's own fields hold values it can run (NULL: any non-negative ones). */
    bool (*valid)(const mi_head_pattern *p);
} mi_pattern_traits;

#include "pattern_entries.h"

/* The entry of type, NULL for a value outside the table. */
static inline const mi_pattern_traits *mi_pattern_traits_of(mi_pattern_type type) {
    if ((int)type < 0 || (int)type >= MI_PATTERN_TYPES) return NULL;
    return &mi_pattern_table[type];
}

/* The field at offset of p. */
static inline int32_t *mi_pattern_field_at(mi_head_pattern *p, size_t offset) {
    return (int32_t *)((char *)p + offset);
}
static inline int32_t mi_pattern_field_value(const mi_head_pattern *p, size_t offset) {
    return *(const int32_t *)((const char *)p + offset);
}

/* base with its budget scaled by s > 0, as the search scales it (a pattern without budget:
 * unchanged). */
void mi_pattern_scale(const mi_head_pattern *base, double s, mi_head_pattern *out);
/* Whether the pattern has a budget the search can scale. */
bool mi_pattern_has_budget(mi_pattern_type type);

/* No negative budget in any field, and a known type. */
bool mi_pattern_valid(const mi_head_pattern *p);

/* ---- the per-head plan ------------------------------------------------------------------- */

/* What a backend's dense-fallback rule sees besides the head's pattern. */
typedef struct mi_fallback_env {
    int64_t head_dim;
    int64_t pairs; /* the (b, h) pairs of the call whose estimate is this head's (0: none) */
    /* the call's keys and query rows: q_len < len for queries at an offset (a follow-up turn
     * or a later chunk); 0 where unknown (a full prefill) */
    int64_t len, q_len;
} mi_fallback_env;

/* A backend's measured crossover: the length from which head p pays sparse (<= 0: any length).
 * arg is the backend's own (e.g. which kernels run). Called for sparse heads only. */
typedef int64_t (*mi_dense_below_rule)(const mi_head_pattern *p, const mi_fallback_env *env,
                                       const void *arg);

typedef struct mi_prefill_plan {
    int64_t batch, heads, len;
    mi_head_plan *head;                       /* [heads], caller memory */
    int64_t pairs[MI_PLAN_ESTIMATES];         /* (b, h) pairs per estimate */
    int32_t estimate_from[MI_PLAN_ESTIMATES]; /* least dense_below of the estimate's heads
                                                 (INT32_MAX where none) */
    int32_t max_vertical, max_slash;          /* over MI_PLAN_ESTIMATE_VS heads */
    bool any_sparse_run;                      /* some (b, h) runs a sparse kernel at its length */
} mi_prefill_plan;

/* Plans every head of one call: kernel, estimate and budgets from the table, dense_below from
 * params (>= 0: that for every sparse head) or from rule (< 0; a NULL rule: never). seq_lens may
 * be NULL (every sequence has length L). heads [s->heads_q]. */
void mi_prefill_plan_build(const mi_attn_shape *s, const int32_t *seq_lens,
                           const mi_head_pattern *patterns, const mi_prefill_params *params,
                           mi_dense_below_rule rule, const void *rule_arg, mi_head_plan *heads,
                           mi_prefill_plan *plan);

/* Whether (b, h) of length len runs dense: a dense head, or shorter than its crossover. */
static inline bool mi_head_plan_dense_at(const mi_head_plan *h, int64_t len) {
    return h->kernel == MI_PLAN_KERNEL_DENSE || (h->dense_below > 0 && len < h->dense_below);
}

#ifdef __cplusplus
}
#endif

#endif /* MI_PATTERN_TABLE_H */
