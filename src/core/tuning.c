/* tuning.c: the tuning struct's names, ranges and text form (include/minference.h). */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One row per field of mi_tuning: its name in the text form, and the values it takes (lo..hi,
 * or where `only` is set, 0 and the listed values). */
typedef struct tuning_field {
    const char *name;
    size_t offset;
    int32_t lo, hi;
    const int32_t *only; /* terminated by 0 */
} tuning_field;

static const int32_t bound_groups[] = {-1, 1, 2, 4, 8, 16, 32, 0};
static const int32_t cap_slots[] = {128, 256, 0};

#define SWITCH(f) {#f, offsetof(mi_tuning, f), -1, 1, NULL}
#define COUNT(f, lo) {#f, offsetof(mi_tuning, f), lo, INT32_MAX, NULL}
#define ONLY(f, list) {#f, offsetof(mi_tuning, f), 0, 0, list}

static const tuning_field fields[] = {
    {"cpu_engine", offsetof(mi_tuning, cpu_engine), 0, 1, NULL},
    SWITCH(sm90),
    SWITCH(sm90_dense),
    SWITCH(sm90_sparse),
    SWITCH(sm90_a_shape),
    SWITCH(sm90_column_copies),
    COUNT(sm90_plan_tiles, 0),
    SWITCH(sm90_tma_store),
    COUNT(tri_split, -1),
    SWITCH(vs_wgmma),
    SWITCH(vs_score_tma),
    SWITCH(vs_index_mask),
    SWITCH(vs_index_shortcuts),
    SWITCH(bs_scores),
    SWITCH(bs_wgmma),
    SWITCH(bs_score_tma),
    COUNT(bs_bound_slack, -1),
    SWITCH(bs_stream),
    COUNT(bs_rows, 0),
    SWITCH(bs_wide),
    ONLY(bs_bound, bound_groups),
    ONLY(bs_cap, cap_slots),
    COUNT(bs_split, -1),
    SWITCH(bs_mask_append),
    SWITCH(bs_pool_vec),
    SWITCH(rowmask_two_pass),
};
#define N_FIELDS (sizeof fields / sizeof fields[0])
/* a new field of mi_tuning needs its row above */
_Static_assert(N_FIELDS * sizeof(int32_t) == sizeof(mi_tuning), "a mi_tuning field has no row");

static int32_t *field_of(mi_tuning *t, const tuning_field *f) {
    return (int32_t *)(void *)((char *)t + f->offset);
}
static int32_t field_value(const mi_tuning *t, const tuning_field *f) {
    return *(const int32_t *)(const void *)((const char *)t + f->offset);
}

static int value_ok(const tuning_field *f, int32_t v) {
    if (!f->only) return v >= f->lo && v <= f->hi;
    if (v == 0) return 1;
    for (const int32_t *o = f->only; *o; ++o)
        if (*o == v) return 1;
    return 0;
}

static mi_status bad_value(mi_context *ctx, const tuning_field *f, const char *value) {
    if (f->only) {
        char list[96];
        int n = snprintf(list, sizeof list, "0");
        for (const int32_t *o = f->only; *o && n < (int)sizeof list; ++o)
            n += snprintf(list + n, sizeof list - (size_t)n, ", %d", (int)*o);
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "tuning %s = %s: takes %s", f->name, value,
                       list);
    }
    if (f->hi == INT32_MAX)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "tuning %s = %s: takes %d or more", f->name,
                       value, (int)f->lo);
    return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "tuning %s = %s: takes %d to %d", f->name,
                   value, (int)f->lo, (int)f->hi);
}

mi_tuning mi_tuning_default(void) {
    mi_tuning t;
    memset(&t, 0, sizeof t);
    return t;
}

static mi_status tuning_check(mi_context *ctx, const mi_tuning *t) {
    if (!t) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "tuning is NULL");
    for (size_t i = 0; i < N_FIELDS; ++i) {
        const int32_t v = field_value(t, &fields[i]);
        if (!value_ok(&fields[i], v)) {
            char text[16];
            snprintf(text, sizeof text, "%d", (int)v);
            return bad_value(ctx, &fields[i], text);
        }
    }
    return MI_STATUS_SUCCESS;
}

/* The value of one name=value item: an integer or a word for one. */
static int parse_value(const tuning_field *f, const char *s, size_t n, int32_t *out) {
    static const struct {
        const char *word;
        int32_t value;
    } words[] = {{"auto", 0}, {"on", 1}, {"off", -1}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; ++i)
        if (strlen(words[i].word) == n && strncmp(s, words[i].word, n) == 0) {
            *out = words[i].value;
            return 1;
        }
    if (f->offset == offsetof(mi_tuning, cpu_engine) && n == 4 && strncmp(s, "base", 4) == 0) {
        *out = 1;
        return 1;
    }
    char buf[24];
    if (n == 0 || n >= sizeof buf) return 0;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end = NULL;
    errno = 0;
    const long v = strtol(buf, &end, 10);
    if (errno != 0 || *end != '\0' || v < INT32_MIN || v > INT32_MAX) return 0;
    *out = (int32_t)v;
    return 1;
}

mi_status mi_tuning_parse(mi_context *ctx, const char *spec, mi_tuning *tuning) {
    if (!spec || !tuning)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "tuning: %s is NULL",
                       spec ? "tuning" : "spec");
    mi_tuning t = *tuning;
    for (const char *p = spec; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (len == 0) { /* empty items: "a=1,,b=2" or a trailing comma */
            p += end ? 1 : 0;
            continue;
        }
        if (!eq)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "tuning \"%.*s\": not name=value",
                           (int)len, p);
        const size_t nlen = (size_t)(eq - p);
        const tuning_field *f = NULL;
        for (size_t i = 0; i < N_FIELDS && !f; ++i)
            if (strlen(fields[i].name) == nlen && strncmp(fields[i].name, p, nlen) == 0)
                f = &fields[i];
        if (!f)
            return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "tuning: no field named \"%.*s\"",
                           (int)nlen, p);
        const char *val = eq + 1;
        const size_t vlen = len - nlen - 1;
        int32_t v = 0;
        if (!parse_value(f, val, vlen, &v) || !value_ok(f, v)) {
            char text[32];
            snprintf(text, sizeof text, "%.*s", (int)(vlen < 24 ? vlen : 24), val);
            return bad_value(ctx, f, text);
        }
        *field_of(&t, f) = v;
        p += len + (end ? 1 : 0);
    }
    *tuning = t;
    return MI_STATUS_SUCCESS;
}

int mi_tuning_format(const mi_tuning *tuning, char *buf, size_t size) {
    if (buf && size > 0) buf[0] = '\0';
    if (!tuning) return 0;
    size_t n = 0;
    for (size_t i = 0; i < N_FIELDS; ++i) {
        const int32_t v = field_value(tuning, &fields[i]);
        if (v == 0) continue;
        const int w = snprintf(buf && n < size ? buf + n : NULL, buf && n < size ? size - n : 0,
                               "%s%s=%d", n ? "," : "", fields[i].name, (int)v);
        if (w < 0) return -1;
        n += (size_t)w;
    }
    return (int)n;
}

mi_status mi_context_set_tuning(mi_context *ctx, const mi_tuning *tuning) {
    if (!ctx) return MI_STATUS_INVALID_ARGUMENT;
    const mi_status st = tuning_check(ctx, tuning);
    if (st != MI_STATUS_SUCCESS) return st;
    ctx->tuning = *tuning;
    return MI_STATUS_SUCCESS;
}

mi_status mi_context_get_tuning(const mi_context *ctx, mi_tuning *tuning) {
    if (!ctx || !tuning) return MI_STATUS_INVALID_ARGUMENT;
    *tuning = ctx->tuning;
    return MI_STATUS_SUCCESS;
}

mi_status mi_context_parse_tuning(mi_context *ctx, const char *spec) {
    if (!ctx) return MI_STATUS_INVALID_ARGUMENT;
    return mi_tuning_parse(ctx, spec, &ctx->tuning);
}

int mi_context_format_tuning(const mi_context *ctx, char *buf, size_t size) {
    if (!ctx) {
        if (buf && size) buf[0] = '\0';
        return -1;
    }
    return mi_tuning_format(&ctx->tuning, buf, size);
}
