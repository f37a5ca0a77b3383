/*
 * pattern_table.c: the public functions read from the pattern table (pattern_entries.h): names,
 * aliases, fields, defaults, config sizes, NAME:V1:V2 parsing.
 */
#include "pattern_table.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

bool mi_pattern_valid(const mi_head_pattern *p) {
    const mi_pattern_traits *t = mi_pattern_traits_of(p->type);
    return t && p->vertical_size >= 0 && p->slash_size >= 0 && p->n_init >= 0 && p->n_local >= 0 &&
           p->n_last >= 0 && p->top_k >= 0 && p->stride >= 0 && p->threshold >= 0 && p->tau >= 0 &&
           p->dense_local >= 0 && (!t->valid || t->valid(p));
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
        const mi_pattern_traits *t = &mi_pattern_table[i];
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
    /* Every field carries a default whatever the type, so switching the type keeps sane
     * budgets: the first entry's that reads it (A-shape's n_init, not dilated's); the type's own
     * entry is applied last. */
    bool set[sizeof p / sizeof(int32_t)] = {false};
    for (int i = 0; i <= MI_PATTERN_TYPES; i++) {
        const mi_pattern_traits *t =
            i < MI_PATTERN_TYPES ? &mi_pattern_table[i] : mi_pattern_traits_of(type);
        if (!t) break;
        for (int f = 0; f < MI_PATTERN_MAX_FIELDS && t->fields[f].name; f++) {
            const size_t slot = t->fields[f].offset / sizeof(int32_t);
            if (set[slot] && i < MI_PATTERN_TYPES) continue;
            set[slot] = true;
            *mi_pattern_field_at(&p, t->fields[f].offset) = t->fields[f].default_value;
        }
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
