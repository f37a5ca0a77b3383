/*
 * pattern_table.c: the traits of every sparse pattern (pattern_table.h), and the public name
 * functions read from them. A new pattern is one entry here plus its own kernels
 * (docs/adding-a-pattern.md).
 */
#include "pattern_table.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FIELD(f, d)                                                                                \
    { #f, offsetof(mi_head_pattern, f), d }
#define OFF(f) offsetof(mi_head_pattern, f)

/* The search never scales a budget beyond this (keeps int32 arithmetic safe). */
#define MI_SEARCH_MAX_BUDGET (1 << 28)

static int32_t scale_budget(int32_t b, double s, int32_t minimum) {
    double x = (double)b * s;
    if (x > MI_SEARCH_MAX_BUDGET) x = MI_SEARCH_MAX_BUDGET;
    int32_t r = (int32_t)lround(x);
    return r < minimum ? minimum : r;
}

static int32_t nonneg(int32_t x) { return x > 0 ? x : 0; }

static int32_t clamp_budget(int32_t size, int32_t minimum, int64_t len) {
    int64_t n = size > minimum ? size : minimum;
    if (n > len) n = len;
    return n < 0 ? 0 : (int32_t)n;
}

/* ---- A-shape and Tri-shape: n_init sinks + an n_local window (+ n_last dense rows) ---------- */

static int64_t window_kept_keys(const mi_head_pattern *p) {
    return (int64_t)nonneg(p->n_init) + nonneg(p->n_local);
}

static void window_scale(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    /* The window carries the budget; sinks are cheap and matter, so they only shrink. */
    out->n_local = scale_budget(base->n_local, s, 1);
    if (s < 1.0) out->n_init = scale_budget(base->n_init, s, base->n_init > 0 ? 1 : 0);
}

static void a_shape_plan(const mi_head_pattern *p, const mi_prefill_params *pp, int64_t L,
                         mi_head_plan *plan) {
    (void)pp;
    (void)L;
    plan->n_init = p->n_init;
    plan->n_local = p->n_local;
    plan->n_last = 0;
}

static void tri_shape_plan(const mi_head_pattern *p, const mi_prefill_params *pp, int64_t L,
                           mi_head_plan *plan) {
    a_shape_plan(p, pp, L, plan);
    plan->n_last = p->n_last;
}

/* ---- vertical-slash: estimated columns and diagonals ---------------------------------------- */

static void vs_scale(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    out->vertical_size = scale_budget(base->vertical_size, s, 1);
    out->slash_size = scale_budget(base->slash_size, s, 1);
}

static void vs_plan(const mi_head_pattern *p, const mi_prefill_params *pp, int64_t L,
                    mi_head_plan *plan) {
    plan->vertical = clamp_budget(p->vertical_size, pp->vs.min_vertical, L);
    plan->slash = clamp_budget(p->slash_size, pp->vs.min_slash, L);
}

/* ---- block-sparse: top_k estimated 64 x 64 blocks per row block ----------------------------- */

static int64_t block_kept_keys(const mi_head_pattern *p) {
    return MI_BLOCK_SIZE * (int64_t)nonneg(p->top_k);
}

static void block_scale(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    out->top_k = scale_budget(base->top_k, s, 1);
}

static void block_plan(const mi_head_pattern *p, const mi_prefill_params *pp, int64_t L,
                       mi_head_plan *plan) {
    (void)pp;
    (void)L;
    plan->top_k = p->top_k;
}

/* ---- the table ------------------------------------------------------------------------------ */

/* Sizes the original's files hold for VS-like and unused entries: written back as read. */
#define SIZES_AS_READ                                                                              \
    { OFF(vertical_size), OFF(slash_size) }

static const mi_pattern_traits table[MI_PATTERN_TYPES] = {
    {
        .type = MI_PATTERN_DENSE,
        .name = "dense",
        .config_field = SIZES_AS_READ,
        .kernel = MI_PLAN_KERNEL_DENSE,
        .estimate = MI_PLAN_ESTIMATE_NONE,
    },
    {
        .type = MI_PATTERN_A_SHAPE,
        .name = "stream_llm",
        .aliases = {"a_shape", "A-shape"},
        .fields = {FIELD(n_init, 128), FIELD(n_local, 3968)},
        .config_field = {OFF(n_init), OFF(n_local)},
        .kernel = MI_PLAN_KERNEL_WINDOW,
        .kept_keys = window_kept_keys,
        .scale = window_scale,
        .plan = a_shape_plan,
    },
    {
        .type = MI_PATTERN_TRI_SHAPE,
        .name = "tri_shape",
        /* n_last has no slot in the file: it reads back as its default */
        .fields = {FIELD(n_init, 128), FIELD(n_local, 3968), FIELD(n_last, 100)},
        .config_field = {OFF(n_init), OFF(n_local)},
        .kernel = MI_PLAN_KERNEL_WINDOW,
        .kept_keys = window_kept_keys,
        .scale = window_scale,
        .plan = tri_shape_plan,
    },
    {
        .type = MI_PATTERN_VERTICAL_SLASH,
        .name = "vertical_and_slash",
        .aliases = {"vertical_slash", "vs"},
        .fields = {FIELD(vertical_size, 1000), FIELD(slash_size, 6096)},
        .config_field = SIZES_AS_READ,
        .kernel = MI_PLAN_KERNEL_INDEX,
        .estimate = MI_PLAN_ESTIMATE_VS,
        .scale = vs_scale,
        .plan = vs_plan,
    },
    {
        .type = MI_PATTERN_BLOCK_SPARSE,
        .name = "block_sparse",
        .fields = {FIELD(top_k, 100)},
        /* The original ignores both sizes here (always 100 blocks) and never writes such heads;
         * a positive first size carries the searched block budget so that it survives a round
         * trip, and 0 (as hand-written entries have it) keeps the original's 100: a budget of no
         * blocks would leave each row block its diagonal and first block only. */
        .config_field = {OFF(top_k), OFF(slash_size)},
        .zero_is_default = {true, false},
        .kernel = MI_PLAN_KERNEL_INDEX,
        .estimate = MI_PLAN_ESTIMATE_BLOCK,
        .kept_keys = block_kept_keys,
        .scale = block_scale,
        .plan = block_plan,
    },
};

const mi_pattern_traits *mi_pattern_traits_of(mi_pattern_type type) {
    if ((int)type < 0 || (int)type >= MI_PATTERN_TYPES) return NULL;
    return &table[type];
}

bool mi_pattern_valid(const mi_head_pattern *p) {
    return mi_pattern_traits_of(p->type) && p->vertical_size >= 0 && p->slash_size >= 0 &&
           p->n_init >= 0 && p->n_local >= 0 && p->n_last >= 0 && p->top_k >= 0;
}

/* ---- public: names, fields, defaults, config sizes ------------------------------------------ */

int32_t mi_pattern_count(void) { return MI_PATTERN_TYPES; }

const char *mi_pattern_name(mi_pattern_type type) {
    const mi_pattern_traits *t = mi_pattern_traits_of(type);
    return t ? t->name : NULL;
}

const char *mi_pattern_alias(mi_pattern_type type, int32_t i) {
    const mi_pattern_traits *t = mi_pattern_traits_of(type);
    if (!t || i < 0 || i >= MI_PATTERN_MAX_ALIASES) return NULL;
    return t->aliases[i];
}

const char *mi_pattern_field(mi_pattern_type type, int32_t i) {
    const mi_pattern_traits *t = mi_pattern_traits_of(type);
    if (!t || i < 0 || i >= MI_PATTERN_MAX_FIELDS) return NULL;
    return t->fields[i].name;
}

mi_status mi_pattern_from_name(const char *name, mi_pattern_type *out) {
    if (!name || !out) return MI_STATUS_INVALID_ARGUMENT;
    for (int i = 0; i < MI_PATTERN_TYPES; i++) {
        const mi_pattern_traits *t = &table[i];
        bool match = strcmp(name, t->name) == 0;
        for (int a = 0; !match && a < MI_PATTERN_MAX_ALIASES && t->aliases[a]; a++)
            match = strcmp(name, t->aliases[a]) == 0;
        if (match) {
            *out = t->type;
            return MI_STATUS_SUCCESS;
        }
    }
    return MI_STATUS_INVALID_ARGUMENT;
}

mi_head_pattern mi_head_pattern_default(mi_pattern_type type) {
    mi_head_pattern p;
    memset(&p, 0, sizeof p);
    /* Every field carries its default whatever the type, so switching the type keeps sane
     * budgets; the type's own entry is applied last. */
    for (int i = 0; i <= MI_PATTERN_TYPES; i++) {
        const mi_pattern_traits *t = i < MI_PATTERN_TYPES ? &table[i] : mi_pattern_traits_of(type);
        if (!t) break;
        for (int f = 0; f < MI_PATTERN_MAX_FIELDS && t->fields[f].name; f++)
            *mi_pattern_field_at(&p, t->fields[f].offset) = t->fields[f].default_value;
    }
    p.type = type;
    return p;
}

mi_status mi_head_pattern_from_sizes(mi_pattern_type type, int32_t size1, int32_t size2,
                                     mi_head_pattern *out) {
    const mi_pattern_traits *t = mi_pattern_traits_of(type);
    if (!t || !out || size1 < 0 || size2 < 0) return MI_STATUS_INVALID_ARGUMENT;
    mi_head_pattern p = mi_head_pattern_default(type);
    const int32_t sizes[2] = {size1, size2};
    p.vertical_size = size1;
    p.slash_size = size2;
    for (int i = 0; i < 2; i++)
        if (sizes[i] > 0 || !t->zero_is_default[i])
            *mi_pattern_field_at(&p, t->config_field[i]) = sizes[i];
    /* the two sizes as they will be written back */
    p.vertical_size = mi_pattern_field_value(&p, t->config_field[0]);
    p.slash_size = mi_pattern_field_value(&p, t->config_field[1]);
    *out = p;
    return MI_STATUS_SUCCESS;
}

mi_status mi_head_pattern_sizes(const mi_head_pattern *p, int32_t *size1, int32_t *size2) {
    const mi_pattern_traits *t = p ? mi_pattern_traits_of(p->type) : NULL;
    if (!t || !size1 || !size2) return MI_STATUS_INVALID_ARGUMENT;
    *size1 = mi_pattern_field_value(p, t->config_field[0]);
    *size2 = mi_pattern_field_value(p, t->config_field[1]);
    return MI_STATUS_SUCCESS;
}

void mi_pattern_scale(const mi_head_pattern *base, double s, mi_head_pattern *out) {
    const mi_pattern_traits *t = mi_pattern_traits_of(base->type);
    *out = *base;
    if (t && t->scale) t->scale(base, s, out);
}

bool mi_pattern_has_budget(mi_pattern_type type) {
    const mi_pattern_traits *t = mi_pattern_traits_of(type);
    return t && t->scale;
}

mi_status mi_head_pattern_parse(const char *text, mi_head_pattern *out) {
    char name[64];
    mi_pattern_type type;
    if (!text || !out) return MI_STATUS_INVALID_ARGUMENT;
    const char *c = strchr(text, ':');
    const size_t n = c ? (size_t)(c - text) : strlen(text);
    if (n == 0 || n >= sizeof name) return MI_STATUS_INVALID_ARGUMENT;
    memcpy(name, text, n);
    name[n] = '\0';
    if (mi_pattern_from_name(name, &type) != MI_STATUS_SUCCESS) return MI_STATUS_INVALID_ARGUMENT;
    const mi_pattern_traits *t = mi_pattern_traits_of(type);
    mi_head_pattern p = mi_head_pattern_default(type);
    int f = 0;
    for (; c; f++) {
        if (f >= MI_PATTERN_MAX_FIELDS || !t->fields[f].name) return MI_STATUS_INVALID_ARGUMENT;
        char *end;
        errno = 0;
        const long long v = strtoll(c + 1, &end, 10);
        if (end == c + 1 || errno || v < 0 || v > INT32_MAX || (*end && *end != ':'))
            return MI_STATUS_INVALID_ARGUMENT;
        *mi_pattern_field_at(&p, t->fields[f].offset) = (int32_t)v;
        c = *end == ':' ? end : NULL;
    }
    /* The fields a config file holds are required; the others (Tri-shape's n_last) may keep
     * their defaults. */
    for (int g = f; g < MI_PATTERN_MAX_FIELDS && t->fields[g].name; g++)
        if (t->fields[g].offset == t->config_field[0] || t->fields[g].offset == t->config_field[1])
            return MI_STATUS_INVALID_ARGUMENT;
    *out = p;
    return MI_STATUS_SUCCESS;
}
