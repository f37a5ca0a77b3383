/*
 * kv_method.c: the KV-method table, the spec parser and the per-session instances
 * (kv_method.h). The methods themselves are in kv_method_<name>.c.
 */
#include "kv_method.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const kv_method_entry *const table[] = {
    &kv_method_dense_entry,     &kv_method_streamingllm_entry, &kv_method_snapkv_entry,
    &kv_method_pyramidkv_entry, &kv_method_quest_entry,        &kv_method_retr_attn_entry,
    &kv_method_kivi_entry,      &kv_method_leank_entry,
};
#define N_METHODS ((int32_t)(sizeof table / sizeof table[0]))

const kv_method_entry kv_method_dense_entry = {
    .name = "dense",
    .summary = "the full cache: every token kept and read",
};

int32_t kv_method_count(void) { return N_METHODS; }

const kv_method_entry *kv_method_at(int32_t i) { return i >= 0 && i < N_METHODS ? table[i] : NULL; }

const kv_method_entry *kv_method_find(const char *name) {
    if (!name) return NULL;
    for (int32_t i = 0; i < N_METHODS; i++)
        if (strcmp(table[i]->name, name) == 0) return table[i];
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Specs                                                                                       */

mi_status kv_msg(char *msg, size_t size, mi_status status, const char *fmt, ...) {
    if (msg && size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, size, fmt, ap);
        va_end(ap);
    }
    return status;
}

static void method_names(char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (int32_t i = 0; i < N_METHODS && used + 1 < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? ", " : "", table[i]->name);
        if (w < 0) break;
        used += (size_t)w;
    }
}

static void key_names(const kv_method_entry *e, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    if (e->n_params == 0) snprintf(buf, size, "none");
    for (int32_t i = 0; i < e->n_params && used + 1 < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? ", " : "", e->params[i].name);
        if (w < 0) break;
        used += (size_t)w;
    }
}

/* The index of choice word (len bytes) in "a|b|c", or -1. */
static int choice_index(const char *choices, const char *word, size_t len) {
    int idx = 0;
    for (const char *p = choices; *p; idx++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, word, len) == 0) return idx;
        if (!bar) break;
        p = bar + 1;
    }
    return -1;
}

static void choice_name(const char *choices, int idx, char *buf, size_t size) {
    const char *p = choices;
    for (int i = 0; i < idx && p; i++) {
        p = strchr(p, '|');
        if (p) p++;
    }
    if (!p) {
        snprintf(buf, size, "?");
        return;
    }
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    snprintf(buf, size, "%.*s", (int)n, p);
}

static void trim(const char **b, const char **e) {
    while (*b < *e && isspace((unsigned char)**b)) (*b)++;
    while (*e > *b && isspace((unsigned char)(*e)[-1])) (*e)--;
}

static mi_status parse_value(const kv_method_entry *e, int32_t pi, const char *vb, const char *ve,
                             kv_spec *out, char *err, size_t size) {
    const kv_param_def *p = &e->params[pi];
    const size_t len = (size_t)(ve - vb);
    if (len == 0) {
        return kv_msg(err, size, MI_STATUS_INVALID_ARGUMENT, "kv method %s: key %s has no value",
                      e->name, p->name);
    }
    if (p->kind == KV_PARAM_STRING) {
        if (len >= KV_METHOD_STRING_MAX) {
            return kv_msg(err, size, MI_STATUS_INVALID_ARGUMENT,
                          "kv method %s: the value of %s is longer than %d bytes", e->name, p->name,
                          KV_METHOD_STRING_MAX - 1);
        }
        memcpy(out->strings[pi], vb, len);
        out->strings[pi][len] = 0;
        return MI_STATUS_SUCCESS;
    }
    if (p->kind == KV_PARAM_ENUM) {
        int idx = choice_index(p->choices, vb, len);
        if (idx < 0) {
            return kv_msg(err, size, MI_STATUS_INVALID_ARGUMENT,
                          "kv method %s: %s must be one of %s, not '%.*s'", e->name, p->name,
                          p->choices, (int)(len > 64 ? 64 : len), vb);
        }
        out->values[pi] = idx;
        return MI_STATUS_SUCCESS;
    }
    char buf[64];
    if (len >= sizeof buf) {
        return kv_msg(err, size, MI_STATUS_INVALID_ARGUMENT,
                      "kv method %s: %s = '%.*s...' is not a number", e->name, p->name, 32, vb);
    }
    memcpy(buf, vb, len);
    buf[len] = 0;
    char *end = NULL;
    errno = 0;
    double v = strtod(buf, &end);
    if (end == buf || *end || errno == ERANGE || !isfinite(v)) {
        return kv_msg(err, size, MI_STATUS_INVALID_ARGUMENT,
                      "kv method %s: %s = '%s' is not a number", e->name, p->name, buf);
    }
    if (p->kind == KV_PARAM_INT && v != floor(v)) {
        return kv_msg(err, size, MI_STATUS_INVALID_ARGUMENT,
                      "kv method %s: %s = '%s' must be an integer", e->name, p->name, buf);
    }
    if (v < p->lo || v > p->hi) {
        return kv_msg(err, size, MI_STATUS_INVALID_ARGUMENT,
                      "kv method %s: %s = %s is outside [%g, %g]", e->name, p->name, buf, p->lo,
                      p->hi);
    }
    out->values[pi] = v;
    return MI_STATUS_SUCCESS;
}

mi_status kv_spec_parse(const char *text, kv_spec *out, char *err, size_t err_size) {
    if (err && err_size) err[0] = 0;
    if (!out) {
        return kv_msg(err, err_size, MI_STATUS_INVALID_ARGUMENT, "kv_spec_parse: out is NULL");
    }
    memset(out, 0, sizeof(*out));
    if (!text) text = "";
    const char *b = text, *e = text + strlen(text);
    trim(&b, &e);
    const char *colon = e > b ? memchr(b, ':', (size_t)(e - b)) : NULL;
    const char *ne = colon ? colon : e, *nb = b;
    trim(&nb, &ne);
    const kv_method_entry *entry = NULL;
    if (nb == ne) {
        if (colon) {
            return kv_msg(err, err_size, MI_STATUS_INVALID_ARGUMENT,
                          "kv spec '%.100s' names no method", text);
        }
        entry = &kv_method_dense_entry;
    } else {
        for (int32_t i = 0; i < N_METHODS; i++)
            if (strlen(table[i]->name) == (size_t)(ne - nb) &&
                strncmp(table[i]->name, nb, (size_t)(ne - nb)) == 0)
                entry = table[i];
        if (!entry) {
            char names[256];
            method_names(names, sizeof names);
            return kv_msg(err, err_size, MI_STATUS_INVALID_ARGUMENT,
                          "unknown kv method '%.*s'; the methods are %s",
                          (int)(ne - nb > 64 ? 64 : ne - nb), nb, names);
        }
    }
    out->entry = entry;
    for (int32_t i = 0; i < entry->n_params; i++) {
        out->values[i] = entry->params[i].def;
        out->strings[i][0] = 0;
    }
    if (!colon) return MI_STATUS_SUCCESS;
    const char *p = colon + 1;
    trim(&p, &e);
    if (p == e) return MI_STATUS_SUCCESS; /* "snapkv:" */
    while (p <= e) {
        const char *comma = memchr(p, ',', (size_t)(e - p));
        const char *ie = comma ? comma : e, *ib = p;
        trim(&ib, &ie);
        const char *eq = memchr(ib, '=', (size_t)(ie - ib));
        if (ib == ie || !eq) {
            return kv_msg(err, err_size, MI_STATUS_INVALID_ARGUMENT,
                          "kv method %s: '%.*s' is not key=value", entry->name,
                          (int)(ie - ib > 64 ? 64 : ie - ib), ib);
        }
        const char *kb = ib, *ke = eq, *vb = eq + 1, *ve = ie;
        trim(&kb, &ke);
        trim(&vb, &ve);
        int32_t pi = -1;
        for (int32_t i = 0; i < entry->n_params; i++)
            if (strlen(entry->params[i].name) == (size_t)(ke - kb) &&
                strncmp(entry->params[i].name, kb, (size_t)(ke - kb)) == 0)
                pi = i;
        if (pi < 0) {
            char keys[256];
            key_names(entry, keys, sizeof keys);
            return kv_msg(err, err_size, MI_STATUS_INVALID_ARGUMENT,
                          "kv method %s has no key '%.*s'; its keys are: %s", entry->name,
                          (int)(ke - kb > 64 ? 64 : ke - kb), kb, keys);
        }
        if (out->given & (1u << pi)) {
            return kv_msg(err, err_size, MI_STATUS_INVALID_ARGUMENT,
                          "kv method %s: key %s given twice", entry->name, entry->params[pi].name);
        }
        mi_status st = parse_value(entry, pi, vb, ve, out, err, err_size);
        if (st != MI_STATUS_SUCCESS) return st;
        out->given |= 1u << pi;
        if (!comma) break;
        p = comma + 1;
    }
    return MI_STATUS_SUCCESS;
}

static int32_t param_index(const kv_spec *s, const char *key) {
    for (int32_t i = 0; s->entry && i < s->entry->n_params; i++)
        if (strcmp(s->entry->params[i].name, key) == 0) return i;
    fprintf(stderr, "kv method %s has no key %s\n", s->entry ? s->entry->name : "?", key);
    abort(); /* a method asking for a key it does not declare is a bug in the method */
}

double kv_spec_get(const kv_spec *s, const char *key) { return s->values[param_index(s, key)]; }

const char *kv_spec_get_string(const kv_spec *s, const char *key) {
    return s->strings[param_index(s, key)];
}

bool kv_spec_given(const kv_spec *s, const char *key) {
    return (s->given >> param_index(s, key)) & 1u;
}

void kv_spec_format(const kv_spec *s, char *buf, size_t size) {
    if (!buf || !size) return;
    buf[0] = 0;
    if (!s || !s->entry) return;
    size_t used = 0;
    int w = snprintf(buf, size, "%s", s->entry->name);
    used = w > 0 ? (size_t)w : 0;
    for (int32_t i = 0; i < s->entry->n_params && used + 1 < size; i++) {
        const kv_param_def *p = &s->entry->params[i];
        char val[KV_METHOD_STRING_MAX + 32];
        if (p->kind == KV_PARAM_STRING && !s->strings[i][0]) continue; /* not given: no value */
        if (p->kind == KV_PARAM_STRING)
            snprintf(val, sizeof val, "%s", s->strings[i]);
        else if (p->kind == KV_PARAM_ENUM)
            choice_name(p->choices, (int)s->values[i], val, sizeof val);
        else
            snprintf(val, sizeof val, "%.10g", s->values[i]);
        w = snprintf(buf + used, size - used, "%c%s=%s", strchr(buf, ':') ? ',' : ':', p->name,
                     val);
        if (w < 0) break;
        used += (size_t)w;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Instances                                                                                   */

mi_status kv_method_fail(kv_method *m, mi_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->error, sizeof m->error, fmt, ap);
    va_end(ap);
    return st;
}

static kv_method *instance_new(const kv_spec *spec, const kv_geometry *geo) {
    kv_method *m = calloc(1, sizeof(*m));
    if (!m) return NULL;
    m->exact_tail = calloc((size_t)(geo->n_layers > 0 ? geo->n_layers : 1), sizeof(int64_t));
    if (!m->exact_tail) {
        free(m);
        return NULL;
    }
    m->entry = spec->entry;
    m->spec = *spec;
    m->geo = *geo;
    return m;
}

static void instance_free(kv_method *m) {
    free(m->exact_tail);
    free(m);
}

mi_status kv_method_create(const kv_spec *spec, const kv_geometry *geo, kv_method **out, char *err,
                           size_t err_size) {
    if (err && err_size) err[0] = 0;
    if (!out || !spec || !geo) {
        return kv_msg(err, err_size, MI_STATUS_INVALID_ARGUMENT, "kv_method_create: NULL argument");
    }
    *out = NULL;
    if (!spec->entry || spec->entry == &kv_method_dense_entry) return MI_STATUS_SUCCESS;
    if (spec->entry->unsupported) {
        return kv_msg(err, err_size, MI_STATUS_UNSUPPORTED, "kv method %s: %s", spec->entry->name,
                      spec->entry->unsupported);
    }
    if (geo->n_layers <= 0 || geo->n_heads <= 0 || geo->n_kv_heads <= 0 || geo->head_dim <= 0 ||
        geo->page_tokens <= 0 || geo->n_heads % geo->n_kv_heads) {
        return kv_msg(err, err_size, MI_STATUS_INVALID_ARGUMENT, "kv method %s: bad model geometry",
                      spec->entry->name);
    }
    kv_method *m = instance_new(spec, geo);
    if (!m) {
        return kv_msg(err, err_size, MI_STATUS_OUT_OF_MEMORY, "out of memory for kv method %s",
                      spec->entry->name);
    }
    mi_status st = spec->entry->create ? spec->entry->create(m) : MI_STATUS_SUCCESS;
    if (st != MI_STATUS_SUCCESS) {
        (void)kv_msg(err, err_size, MI_STATUS_SUCCESS, "%s", m->error);
        instance_free(m);
        return st;
    }
    *out = m;
    return MI_STATUS_SUCCESS;
}

void kv_method_destroy(kv_method *m) {
    if (!m) return;
    if (m->entry->destroy) m->entry->destroy(m);
    instance_free(m);
}

mi_status kv_method_clone(const kv_method *m, kv_method **out, char *err, size_t err_size) {
    if (err && err_size) err[0] = 0;
    if (!out) return MI_STATUS_INVALID_ARGUMENT;
    *out = NULL;
    if (!m) return MI_STATUS_SUCCESS;
    kv_method *c = instance_new(&m->spec, &m->geo);
    if (!c) {
        return kv_msg(err, err_size, MI_STATUS_OUT_OF_MEMORY, "out of memory for kv method %s",
                      m->entry->name);
    }
    memcpy(c->exact_tail, m->exact_tail, (size_t)m->geo.n_layers * sizeof(int64_t));
    c->q_rows = m->q_rows;
    mi_status st = MI_STATUS_SUCCESS;
    if (m->entry->clone)
        st = m->entry->clone(m, c);
    else if (m->state)
        st = kv_method_fail(c, MI_STATUS_INTERNAL, "kv method %s cannot be forked", m->entry->name);
    if (st != MI_STATUS_SUCCESS) {
        (void)kv_msg(err, err_size, MI_STATUS_SUCCESS, "%s", c->error);
        instance_free(c);
        return st;
    }
    *out = c;
    return MI_STATUS_SUCCESS;
}

void kv_method_appended(kv_method *m, int64_t n) {
    if (!m) return;
    for (int32_t l = 0; l < m->geo.n_layers; l++) m->exact_tail[l] += n;
}

mi_status kv_method_after_append(kv_method *m, mi_kv_seq *seq, int32_t layer, int64_t n_new) {
    if (!m) return MI_STATUS_SUCCESS;
    return m->entry->after_append ? m->entry->after_append(m, seq, layer, n_new)
                                  : MI_STATUS_SUCCESS;
}

mi_status kv_method_after_prefill(kv_method *m, mi_kv_seq *seq, int32_t layer, const float *q,
                                  int64_t n) {
    if (!m || !m->entry->after_prefill) return MI_STATUS_SUCCESS;
    return m->entry->after_prefill(m, seq, layer, q, n);
}

bool kv_method_selects(const kv_method *m) { return m && m->entry->select; }

mi_status kv_method_select(kv_method *m, const mi_kv_seq *seq, int32_t layer, const float *q,
                           int64_t n, kv_selection *sel) {
    if (!m || !m->entry->select) return MI_STATUS_SUCCESS;
    return m->entry->select(m, seq, layer, q, n, sel);
}

int64_t kv_method_rewindable(const kv_method *m) {
    if (!m) return INT64_MAX;
    int64_t r = INT64_MAX;
    for (int32_t l = 0; l < m->geo.n_layers; l++)
        if (m->exact_tail[l] < r) r = m->exact_tail[l];
    return r;
}

void kv_method_rewound(kv_method *m, int64_t n) {
    if (!m) return;
    for (int32_t l = 0; l < m->geo.n_layers; l++)
        m->exact_tail[l] = m->exact_tail[l] > n ? m->exact_tail[l] - n : 0;
}

void kv_method_reset_tails(kv_method *m, const mi_kv_seq *seq) {
    if (!m) return;
    for (int32_t l = 0; l < m->geo.n_layers; l++) m->exact_tail[l] = mi_kv_seq_length(seq, l);
}

mi_status kv_method_compact(kv_method *m, mi_kv_seq *seq, int32_t layer, int64_t count,
                            const int64_t *keep) {
    const int64_t len = mi_kv_seq_length(seq, layer);
    mi_status st = mi_kv_seq_compact(seq, layer, count, keep);
    if (st != MI_STATUS_SUCCESS)
        return kv_method_fail(m, st, "kv method %s, layer %d: %s", m->entry->name, layer,
                              mi_kv_pool_last_error(mi_kv_seq_pool(seq)));
    /* the kept rows that are still the last tokens: the longest common run at the end where
     * every head keeps len - t .. len - 1 */
    int64_t t = 0;
    const int32_t H = m->geo.n_kv_heads;
    for (; t < count; t++) {
        bool same = true;
        for (int32_t h = 0; h < H && same; h++)
            same = keep[(int64_t)h * count + count - 1 - t] == len - 1 - t;
        if (!same) break;
    }
    m->exact_tail[layer] = t;
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Selections                                                                                  */

void *kv_scratch_get(kv_scratch *s, size_t bytes) {
    if (bytes <= s->cap && s->p) return s->p;
    free(s->p);
    s->cap = 0;
    s->p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (s->p) s->cap = bytes;
    return s->p;
}

void kv_scratch_free(kv_scratch *s) {
    free(s->p);
    s->p = NULL;
    s->cap = 0;
}

void kv_selection_init(kv_selection *sel) { memset(sel, 0, sizeof(*sel)); }

void kv_selection_free(kv_selection *sel) {
    free(sel->offsets);
    free(sel->spans);
    memset(sel, 0, sizeof(*sel));
}

mi_status kv_selection_reset(kv_selection *sel, int64_t n_lists) {
    if (n_lists + 1 > sel->cap_lists) {
        int64_t *o = realloc(sel->offsets, (size_t)(n_lists + 1) * sizeof(int64_t));
        if (!o) return MI_STATUS_OUT_OF_MEMORY;
        sel->offsets = o;
        sel->cap_lists = n_lists + 1;
    }
    sel->n_lists = n_lists;
    sel->n_spans = 0;
    sel->open = 0;
    sel->offsets[0] = 0;
    return MI_STATUS_SUCCESS;
}

mi_status kv_selection_push(kv_selection *sel, int64_t start, int64_t end) {
    if (end <= start) return MI_STATUS_SUCCESS;
    const int64_t first = sel->offsets[sel->open];
    if (sel->n_spans > first && sel->spans[2 * sel->n_spans - 1] >= start) {
        int64_t *last_end = &sel->spans[2 * sel->n_spans - 1];
        if (end > *last_end) *last_end = end;
        return MI_STATUS_SUCCESS;
    }
    if (sel->n_spans + 1 > sel->cap_spans) {
        int64_t cap = sel->cap_spans ? 2 * sel->cap_spans : 64;
        int64_t *s = realloc(sel->spans, (size_t)(2 * cap) * sizeof(int64_t));
        if (!s) return MI_STATUS_OUT_OF_MEMORY;
        sel->spans = s;
        sel->cap_spans = cap;
    }
    sel->spans[2 * sel->n_spans] = start;
    sel->spans[2 * sel->n_spans + 1] = end;
    sel->n_spans++;
    return MI_STATUS_SUCCESS;
}

void kv_selection_close(kv_selection *sel) {
    if (sel->open >= sel->n_lists) return;
    sel->open++;
    sel->offsets[sel->open] = sel->n_spans;
}
