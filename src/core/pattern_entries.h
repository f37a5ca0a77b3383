/*
 * pattern_entries.h: the pattern table, one entry per sparse pattern (the traits are declared in
 * pattern_table.h; docs/adding-a-pattern.md says what an entry holds). Header-only, so that the
 * backends' plain-C dense-fallback headers and the programs that test them read the same table
 * without reaching into the library. Included by pattern_table.h only.
 */
#ifndef MI_PATTERN_ENTRIES_H
#define MI_PATTERN_ENTRIES_H

#include <math.h>
#include <stddef.h>

#define MI_PT_FIELD(f, d) {#f, offsetof(mi_head_pattern, f), d}
#define MI_PT_OFF(f) offsetof(mi_head_pattern, f)

/* The search never scales a budget beyond this (keeps int32 arithmetic safe). */
#define MI_PT_MAX_BUDGET (1 << 28)

static inline int32_t mi_pt_scale_budget(int32_t b, double s, int32_t minimum) {
    double x = (double)b * s;
    if (x > MI_PT_MAX_BUDGET) x = MI_PT_MAX_BUDGET;
    int32_t r = (int32_t)lround(x);
    return r < minimum ? minimum : r;
}

static inline int32_t mi_pt_nonneg(int32_t x) { return x > 0 ? x : 0; }

static inline int32_t mi_pt_clamp_budget(int32_t size, int32_t minimum, int64_t len) {
    int64_t n = size > minimum ? size : minimum;
    if (n > len) n = len;
    return n < 0 ? 0 : (int32_t)n;
}

/* ---- A-shape and Tri-shape: n_init sinks + an n_local window (+ n_last dense rows) ---------- */

static inline int64_t mi_pt_window_kept_keys(const mi_head_pattern *p) {
    return (int64_t)mi_pt_nonneg(p->n_init) + mi_pt_nonneg(p->n_local);
}

static inline void mi_pt_window_scale(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    /* The window carries the budget; sinks are cheap and matter, so they only shrink. */
    out->n_local = mi_pt_scale_budget(base->n_local, s, 1);
    if (s < 1.0) out->n_init = mi_pt_scale_budget(base->n_init, s, base->n_init > 0 ? 1 : 0);
}

static inline void mi_pt_a_shape_plan(const mi_head_pattern *p, const mi_prefill_params *pp,
                                      int64_t L, mi_head_plan *plan) {
    (void)pp;
    (void)L;
    plan->n_init = p->n_init;
    plan->n_local = p->n_local;
    plan->n_last = 0;
}

static inline void mi_pt_tri_shape_plan(const mi_head_pattern *p, const mi_prefill_params *pp,
                                        int64_t L, mi_head_plan *plan) {
    mi_pt_a_shape_plan(p, pp, L, plan);
    plan->n_last = p->n_last;
}

/* ---- vertical-slash: estimated columns and diagonals ---------------------------------------- */

static inline void mi_pt_vs_scale(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    out->vertical_size = mi_pt_scale_budget(base->vertical_size, s, 1);
    out->slash_size = mi_pt_scale_budget(base->slash_size, s, 1);
}

static inline void mi_pt_vs_plan(const mi_head_pattern *p, const mi_prefill_params *pp, int64_t L,
                                 mi_head_plan *plan) {
    plan->vertical = mi_pt_clamp_budget(p->vertical_size, pp->vs.min_vertical, L);
    plan->slash = mi_pt_clamp_budget(p->slash_size, pp->vs.min_slash, L);
}

/* ---- block-sparse: top_k estimated 64 x 64 blocks per row block ----------------------------- */

static inline int64_t mi_pt_block_kept_keys(const mi_head_pattern *p) {
    return MI_BLOCK_SIZE * (int64_t)mi_pt_nonneg(p->top_k);
}

static inline void mi_pt_block_scale(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    out->top_k = mi_pt_scale_budget(base->top_k, s, 1);
}

static inline void mi_pt_block_plan(const mi_head_pattern *p, const mi_prefill_params *pp,
                                    int64_t L, mi_head_plan *plan) {
    (void)pp;
    (void)L;
    plan->top_k = p->top_k;
}

/* ---- dilated and strided: a fixed key set per row (docs/prefill-methods.md) ------------------ */

static inline int64_t mi_pt_dilated_kept_keys(const mi_head_pattern *p) {
    const int64_t span = mi_pt_nonneg(p->n_local) - mi_pt_nonneg(p->dense_local);
    const int64_t step = p->stride > 1 ? p->stride : 1;
    return (int64_t)mi_pt_nonneg(p->n_init) + mi_pt_nonneg(p->dense_local) +
           (span > 0 ? (span + step - 1) / step : 0);
}

static inline void mi_pt_dilated_scale(const mi_head_pattern *base, double s,
                                       mi_head_pattern *out) {
    out->n_local = mi_pt_scale_budget(base->n_local, s, 1);
    out->dense_local = mi_pt_scale_budget(base->dense_local, s, 0);
    if (s < 1.0) out->n_init = mi_pt_scale_budget(base->n_init, s, base->n_init > 0 ? 1 : 0);
}

static inline void mi_pt_dilated_plan(const mi_head_pattern *p, const mi_prefill_params *pp,
                                      int64_t L, mi_head_plan *plan) {
    (void)pp;
    (void)L;
    plan->n_init = p->n_init;
    plan->n_local = p->n_local;
    plan->dense_local = p->dense_local;
    plan->stride = p->stride > 1 ? p->stride : 1;
}

static inline bool mi_pt_dilated_valid(const mi_head_pattern *p) { return p->stride >= 1; }

static inline void mi_pt_strided_plan(const mi_head_pattern *p, const mi_prefill_params *pp,
                                      int64_t L, mi_head_plan *plan) {
    (void)pp;
    (void)L;
    plan->stride = p->stride;
    plan->strided = true;
}

/* ---- XAttention and FlexPrefill: thresholds on estimated block mass ------------------------- */

/* A threshold t (per mille) scaled as a budget: the mass left out, 1000 - t, shrinks by s. */
static inline int32_t mi_pt_scale_threshold(int32_t t, double s) {
    const double out = 1000.0 - (1000.0 - (double)t) / s;
    return out < 0.0 ? 0 : out > 1000.0 ? 1000 : (int32_t)lround(out);
}

static inline void mi_pt_threshold_scale(const mi_head_pattern *base, double s,
                                         mi_head_pattern *out) {
    out->threshold = mi_pt_scale_threshold(base->threshold, s);
}

static inline void mi_pt_xattn_plan(const mi_head_pattern *p, const mi_prefill_params *pp,
                                    int64_t L, mi_head_plan *plan) {
    (void)pp;
    (void)L;
    plan->stride = p->stride;
    plan->threshold = p->threshold;
}

/* The stride splits a 64-row block evenly into antidiagonal groups. */
static inline bool mi_pt_xattn_valid(const mi_head_pattern *p) {
    return p->stride >= 1 && p->stride <= MI_BLOCK_SIZE && MI_BLOCK_SIZE % p->stride == 0 &&
           p->threshold <= 1000;
}

static inline void mi_pt_flex_plan(const mi_head_pattern *p, const mi_prefill_params *pp, int64_t L,
                                   mi_head_plan *plan) {
    (void)pp;
    (void)L;
    plan->threshold = p->threshold;
    plan->tau = p->tau;
}

static inline bool mi_pt_flex_valid(const mi_head_pattern *p) { return p->threshold <= 1000; }

/* ---- InfLLM: sinks + local window + top_k retrieved blocks per query chunk ------------------- */

/* Per row at most: the sinks, the window, the retrieved blocks, and the part of the tail not
 * yet cut into blocks (one block plus the chunk). */
static inline int64_t mi_pt_infllm_kept_keys(const mi_head_pattern *p) {
    return (int64_t)mi_pt_nonneg(p->n_init) + mi_pt_nonneg(p->n_local) +
           (int64_t)mi_pt_nonneg(p->top_k) * mi_pt_nonneg(p->block_size) +
           mi_pt_nonneg(p->block_size) + mi_pt_nonneg(p->chunk_size);
}

static inline void mi_pt_infllm_scale(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    /* the retrieved blocks and the window carry the budget */
    out->top_k = mi_pt_scale_budget(base->top_k, s, 0);
    out->n_local = mi_pt_scale_budget(base->n_local, s, 1);
}

static inline void mi_pt_infllm_plan(const mi_head_pattern *p, const mi_prefill_params *pp,
                                     int64_t L, mi_head_plan *plan) {
    (void)pp;
    (void)L;
    plan->n_init = p->n_init;
    plan->n_local = p->n_local;
    plan->top_k = p->top_k;
    plan->block_size = p->block_size;
    plan->repr_topk = p->repr_topk;
    plan->chunk_size = p->chunk_size;
    plan->per_head = p->per_head;
}

static inline bool mi_pt_infllm_valid(const mi_head_pattern *p) {
    return p->n_local >= 1 && p->block_size >= 1 && p->chunk_size >= 1 && p->repr_topk >= 1 &&
           p->repr_topk <= p->block_size && p->per_head <= 1;
}

/* ---- the table ------------------------------------------------------------------------------ */

/* Sizes the original's files hold for VS-like and unused entries: written back as read. */
#define MI_PT_SIZES_AS_READ {MI_PT_OFF(vertical_size), MI_PT_OFF(slash_size)}

static const mi_pattern_traits mi_pattern_table[MI_PATTERN_TYPES] = {
    {
        .type = MI_PATTERN_DENSE,
        .name = "dense",
        .config_field = MI_PT_SIZES_AS_READ,
        .kernel = MI_PLAN_KERNEL_DENSE,
        .estimate = MI_PLAN_ESTIMATE_NONE,
    },
    {
        .type = MI_PATTERN_A_SHAPE,
        .name = "stream_llm",
        .aliases = {"a_shape", "A-shape"},
        .fields = {MI_PT_FIELD(n_init, 128), MI_PT_FIELD(n_local, 3968)},
        .config_field = {MI_PT_OFF(n_init), MI_PT_OFF(n_local)},
        .kernel = MI_PLAN_KERNEL_WINDOW,
        .kept_keys = mi_pt_window_kept_keys,
        .scale = mi_pt_window_scale,
        .plan = mi_pt_a_shape_plan,
    },
    {
        .type = MI_PATTERN_TRI_SHAPE,
        .name = "tri_shape",
        /* n_last has no slot in the file: it reads back as its default */
        .fields = {MI_PT_FIELD(n_init, 128), MI_PT_FIELD(n_local, 3968), MI_PT_FIELD(n_last, 100)},
        .config_field = {MI_PT_OFF(n_init), MI_PT_OFF(n_local)},
        .kernel = MI_PLAN_KERNEL_WINDOW,
        .kept_keys = mi_pt_window_kept_keys,
        .scale = mi_pt_window_scale,
        .plan = mi_pt_tri_shape_plan,
    },
    {
        .type = MI_PATTERN_VERTICAL_SLASH,
        .name = "vertical_and_slash",
        .aliases = {"vertical_slash", "vs"},
        .fields = {MI_PT_FIELD(vertical_size, 1000), MI_PT_FIELD(slash_size, 6096)},
        .config_field = MI_PT_SIZES_AS_READ,
        .kernel = MI_PLAN_KERNEL_INDEX,
        .estimate = MI_PLAN_ESTIMATE_VS,
        .scale = mi_pt_vs_scale,
        .plan = mi_pt_vs_plan,
    },
    {
        .type = MI_PATTERN_BLOCK_SPARSE,
        .name = "block_sparse",
        .fields = {MI_PT_FIELD(top_k, 100)},
        /* The original ignores both sizes here (always 100 blocks) and never writes such heads;
         * a positive first size carries the searched block budget so that it survives a round
         * trip, and 0 (as hand-written entries have it) keeps the original's 100: a budget of no
         * blocks would leave each row block its diagonal and first block only. */
        .config_field = {MI_PT_OFF(top_k), MI_PT_OFF(slash_size)},
        .zero_is_default = {true, false},
        .kernel = MI_PLAN_KERNEL_INDEX,
        .estimate = MI_PLAN_ESTIMATE_BLOCK,
        .kept_keys = mi_pt_block_kept_keys,
        .scale = mi_pt_block_scale,
        .plan = mi_pt_block_plan,
    },
    {
        .type = MI_PATTERN_DILATED,
        .name = "dilated",
        /* the original's dilated1; its dilated2 is dilated:1024:6144:2:2048 */
        .fields = {MI_PT_FIELD(n_init, 1024), MI_PT_FIELD(n_local, 8192), MI_PT_FIELD(stride, 2),
                   MI_PT_FIELD(dense_local, 0)},
        .config_field = {MI_PT_OFF(n_init), MI_PT_OFF(n_local)},
        .kernel = MI_PLAN_KERNEL_ROWMASK,
        .kept_keys = mi_pt_dilated_kept_keys,
        .scale = mi_pt_dilated_scale,
        .plan = mi_pt_dilated_plan,
        .valid = mi_pt_dilated_valid,
    },
    {
        .type = MI_PATTERN_STRIDED,
        .name = "strided",
        .fields = {MI_PT_FIELD(stride, 128)},
        .config_field = {MI_PT_OFF(stride), MI_PT_OFF(slash_size)},
        .zero_is_default = {true, false},
        .kernel = MI_PLAN_KERNEL_ROWMASK,
        .plan = mi_pt_strided_plan,
        .valid = mi_pt_dilated_valid,
    },
    {
        .type = MI_PATTERN_XATTENTION,
        .name = "xattention",
        .fields = {MI_PT_FIELD(stride, 8), MI_PT_FIELD(threshold, 900)},
        .config_field = {MI_PT_OFF(stride), MI_PT_OFF(threshold)},
        .zero_is_default = {true, false},
        .kernel = MI_PLAN_KERNEL_INDEX,
        .estimate = MI_PLAN_ESTIMATE_XATTN,
        .scale = mi_pt_threshold_scale,
        .plan = mi_pt_xattn_plan,
        .valid = mi_pt_xattn_valid,
    },
    {
        .type = MI_PATTERN_FLEXPREFILL,
        .name = "flexprefill",
        .fields = {MI_PT_FIELD(threshold, 900), MI_PT_FIELD(tau, 100)},
        .config_field = {MI_PT_OFF(threshold), MI_PT_OFF(tau)},
        .kernel = MI_PLAN_KERNEL_INDEX,
        .estimate = MI_PLAN_ESTIMATE_FLEX,
        .scale = mi_pt_threshold_scale,
        .plan = mi_pt_flex_plan,
        .valid = mi_pt_flex_valid,
    },
    {
        .type = MI_PATTERN_INFLLM,
        .name = "inf_llm",
        .aliases = {"infllm", "InfLLM"},
        /* the original's MInference("inf_llm") settings (docs/prefill-methods.md) */
        .fields = {MI_PT_FIELD(top_k, 16), MI_PT_FIELD(n_local, 4096), MI_PT_FIELD(n_init, 128),
                   MI_PT_FIELD(block_size, 128), MI_PT_FIELD(repr_topk, 4),
                   MI_PT_FIELD(chunk_size, 512), MI_PT_FIELD(per_head, 0)},
        .config_field = {MI_PT_OFF(top_k), MI_PT_OFF(n_local)},
        /* no blocks is a budget; no window is not (0 keeps the default) */
        .zero_is_default = {false, true},
        .kernel = MI_PLAN_KERNEL_INFLLM,
        .kept_keys = mi_pt_infllm_kept_keys,
        .scale = mi_pt_infllm_scale,
        .plan = mi_pt_infllm_plan,
        .valid = mi_pt_infllm_valid,
    },
};

#undef MI_PT_FIELD
#undef MI_PT_OFF
#undef MI_PT_SIZES_AS_READ

#endif /* MI_PATTERN_ENTRIES_H */
