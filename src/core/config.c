/*
 * config.c: per-model pattern configs in the original's JSON format (docs/algorithms.md §5).
 *
 *   [ { "<head>": [pattern, vertical_size, slash_size, score], ... },   <- layer 0
 *     ... ]
 *
 * Storage is sparse: each layer keeps only the heads the file (or set_head) named, sorted by head
 * id, so a hostile head id such as "2000000000" costs one entry, not a dense table. Missing heads
 * and layers resolve to the config's default pattern.
 *
 * Round-trip: the sizes are kept as they were read (block_sparse and dense ignore them at run
 * time, but writing them back unchanged keeps files byte-for-byte meaningful), and a score keeps
 * its JSON kind: an integer stays an integer, a real stays a real, an absent or null score is NaN
 * and is written as null.
 */
#include "atomic_file.h"
#include "internal.h"
#include "pattern_table.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum score_kind {
    SCORE_NONE = 0, /* absent or null: NaN */
    SCORE_INT = 1,
    SCORE_REAL = 2,
} score_kind;

typedef struct config_entry {
    int32_t head;
    mi_head_pattern pattern;
    score_kind kind;
    long long score_int;
    double score;
} config_entry;

typedef struct config_layer {
    config_entry *entries; /* ascending head */
    int32_t count, capacity;
} config_layer;

struct mi_config {
    int32_t n_layers;
    int32_t n_heads;
    mi_head_pattern default_pattern;
    config_layer *layers; /* [n_layers] */
};

/* Head ids beyond this are surely a corrupt file: readers size per-head arrays by the largest
 * id, so a lone huge id would ask for gigabytes (real models have at most a few hundred). */
#define MI_CONFIG_MAX_HEAD ((1 << 20) - 1)
/* Layers beyond this are surely a corrupt file, and the layer table is dense. */
#define MI_CONFIG_MAX_LAYERS (1 << 20)

/* ------------------------------------------------------------------------------------------ */
/* Storage                                                                                     */

static mi_config *config_alloc(int32_t n_layers, const mi_head_pattern *default_pattern) {
    mi_config *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->layers = calloc(n_layers > 0 ? (size_t)n_layers : 1, sizeof *c->layers);
    if (!c->layers) {
        free(c);
        return NULL;
    }
    c->n_layers = n_layers;
    c->default_pattern =
        default_pattern ? *default_pattern : mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    return c;
}

void mi_config_destroy(mi_config *config) {
    if (!config) return;
    for (int32_t l = 0; l < config->n_layers; l++) free(config->layers[l].entries);
    free(config->layers);
    free(config);
}

void mi_free(void *ptr) { free(ptr); }

/* Index of head in layer, or -(insertion point) - 1 when absent. */
static int32_t layer_find(const config_layer *layer, int32_t head) {
    int32_t lo = 0, hi = layer->count;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (layer->entries[mid].head < head)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < layer->count && layer->entries[lo].head == head) return lo;
    return -lo - 1;
}

/* The entry for head, inserted (zeroed but for the id) when absent; NULL when out of memory. */
static config_entry *layer_upsert(config_layer *layer, int32_t head) {
    int32_t pos = layer_find(layer, head);
    if (pos >= 0) return &layer->entries[pos];
    pos = -pos - 1;
    if (layer->count == layer->capacity) {
        int32_t cap = layer->capacity ? layer->capacity * 2 : 8;
        config_entry *e = realloc(layer->entries, (size_t)cap * sizeof *e);
        if (!e) return NULL;
        layer->entries = e;
        layer->capacity = cap;
    }
    memmove(&layer->entries[pos + 1], &layer->entries[pos],
            (size_t)(layer->count - pos) * sizeof *layer->entries);
    layer->count++;
    config_entry *e = &layer->entries[pos];
    memset(e, 0, sizeof *e);
    e->head = head;
    return e;
}

/* Appends e unsorted (the parser sorts each layer once); false when out of memory. */
static bool layer_append(config_layer *layer, const config_entry *e) {
    if (layer->count == layer->capacity) {
        int32_t cap = layer->capacity ? layer->capacity * 2 : 8;
        config_entry *n = realloc(layer->entries, (size_t)cap * sizeof *n);
        if (!n) return false;
        layer->entries = n;
        layer->capacity = cap;
    }
    layer->entries[layer->count++] = *e;
    return true;
}

static int cmp_entry(const void *a, const void *b) {
    const int32_t x = ((const config_entry *)a)->head, y = ((const config_entry *)b)->head;
    return (x > y) - (x < y);
}

static bool pattern_valid(const mi_head_pattern *p) { return mi_pattern_valid(p); }

/* ------------------------------------------------------------------------------------------ */
/* Parsing                                                                                     */

/* Accepts a JSON integer, or a real with an integral value (some writers emit 1000.0). */
static bool json_to_int32(const json_t *v, int32_t *out) {
    double d;
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < INT32_MIN || i > INT32_MAX) return false;
        *out = (int32_t)i;
        return true;
    }
    if (!json_is_real(v)) return false;
    d = json_real_value(v);
    if (!(d >= (double)INT32_MIN && d <= (double)INT32_MAX) || d != floor(d)) return false;
    *out = (int32_t)d;
    return true;
}

/* A head key must be the canonical decimal form of a non-negative integer: "0", "17", never
 * "-1", "+1", "01", "1.0" or "". The original looks heads up by str(h), so anything else could
 * never match a head there either. */
static bool parse_head_key(const char *key, int32_t *out) {
    size_t n = strlen(key);
    long long v = 0;
    if (n == 0 || n > 10 || (n > 1 && key[0] == '0')) return false;
    for (size_t i = 0; i < n; i++) {
        if (key[i] < '0' || key[i] > '9') return false;
        v = v * 10 + (key[i] - '0');
    }
    *out = v > MI_CONFIG_MAX_HEAD ? -1 : (int32_t)v; /* -1: well formed, but too large */
    return true;
}

/* Fills e from one [pattern, vertical_size, slash_size, score] array; on failure writes the
 * problem into why. */
static bool parse_entry(const json_t *arr, config_entry *e, char *why, size_t why_size) {
    size_t n;
    int32_t vs, ss;
    mi_pattern_type type;
    if (!json_is_array(arr)) {
        snprintf(why, why_size, "entry is not a list [pattern, vertical_size, slash_size, score]");
        return false;
    }
    n = json_array_size(arr);
    if (n != 3 && n != 4) {
        snprintf(why, why_size,
                 "entry has %zu elements, expected 4 [pattern, vertical_size, slash_size, score]"
                 " (or 3 without score)",
                 n);
        return false;
    }
    const json_t *name = json_array_get(arr, 0);
    if (!json_is_string(name)) {
        snprintf(why, why_size, "pattern name (element 0) is not a string");
        return false;
    }
    if (mi_pattern_from_name(json_string_value(name), &type) != MI_STATUS_SUCCESS) {
        int n_out =
            snprintf(why, why_size, "unknown pattern \"%.64s\" (expected", json_string_value(name));
        for (int32_t t = 0; t < mi_pattern_count() && n_out > 0 && (size_t)n_out < why_size; t++)
            n_out += snprintf(why + n_out, why_size - (size_t)n_out, "%s %s",
                              t == 0                        ? ""
                              : t + 1 == mi_pattern_count() ? " or"
                                                            : ",",
                              mi_pattern_name((mi_pattern_type)t));
        if (n_out > 0 && (size_t)n_out < why_size)
            snprintf(why + n_out, why_size - (size_t)n_out, ")");
        return false;
    }
    if (!json_to_int32(json_array_get(arr, 1), &vs)) {
        snprintf(why, why_size, "vertical_size (element 1) is not a 32-bit integer");
        return false;
    }
    if (!json_to_int32(json_array_get(arr, 2), &ss)) {
        snprintf(why, why_size, "slash_size (element 2) is not a 32-bit integer");
        return false;
    }
    if (vs < 0 || ss < 0) {
        snprintf(why, why_size, "negative size (vertical_size %d, slash_size %d)", (int)vs,
                 (int)ss);
        return false;
    }
    e->kind = SCORE_NONE;
    e->score = NAN;
    e->score_int = 0;
    if (n == 4) {
        const json_t *sc = json_array_get(arr, 3);
        if (json_is_integer(sc)) {
            e->kind = SCORE_INT;
            e->score_int = json_integer_value(sc);
            e->score = (double)e->score_int;
        } else if (json_is_real(sc)) {
            e->kind = SCORE_REAL;
            e->score = json_real_value(sc);
        } else if (!json_is_null(sc)) {
            snprintf(why, why_size, "score (element 3) is not a number or null");
            return false;
        }
    }
    /* The original's mapping of the two sizes onto each pattern's parameters
     * (docs/algorithms.md §5): the pattern's table entry says which fields they carry. */
    mi_head_pattern p;
    mi_head_pattern_from_sizes(type, vs, ss, &p);
    e->pattern = p;
    return true;
}

static mi_status parse_root(mi_context *ctx, const json_t *root, const char *origin,
                            mi_config **out) {
    size_t n_layers;
    mi_config *c;
    if (!json_is_array(root))
        return mi_fail(ctx, MI_STATUS_PARSE_ERROR,
                       "%s: top level is not a list of layers (one object per layer)", origin);
    n_layers = json_array_size(root);
    if (n_layers > MI_CONFIG_MAX_LAYERS)
        return mi_fail(ctx, MI_STATUS_PARSE_ERROR, "%s: %zu layers is more than the %d supported",
                       origin, n_layers, MI_CONFIG_MAX_LAYERS);
    c = config_alloc((int32_t)n_layers, NULL);
    if (!c) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "%s: out of memory", origin);
    for (size_t l = 0; l < n_layers; l++) {
        const json_t *layer = json_array_get(root, l);
        const char *key;
        json_t *value;
        if (!json_is_object(layer)) {
            mi_config_destroy(c);
            return mi_fail(ctx, MI_STATUS_PARSE_ERROR, "%s: layer %zu is not an object", origin, l);
        }
        json_object_foreach((json_t *)layer, key, value) {
            int32_t head;
            char why[256];
            config_entry parsed;
            if (!parse_head_key(key, &head)) {
                mi_config_destroy(c);
                return mi_fail(ctx, MI_STATUS_PARSE_ERROR,
                               "%s: layer %zu, head \"%.32s\": head key is not a non-negative "
                               "integer",
                               origin, l, key);
            }
            if (head < 0) {
                mi_config_destroy(c);
                return mi_fail(ctx, MI_STATUS_PARSE_ERROR,
                               "%s: layer %zu, head %.32s: more than the %d heads a layer may have",
                               origin, l, key, MI_CONFIG_MAX_HEAD + 1);
            }
            if (!parse_entry(value, &parsed, why, sizeof why)) {
                mi_config_destroy(c);
                return mi_fail(ctx, MI_STATUS_PARSE_ERROR, "%s: layer %zu, head %d: %s", origin, l,
                               (int)head, why);
            }
            parsed.head = head;
            if (!layer_append(&c->layers[l], &parsed)) {
                mi_config_destroy(c);
                return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "%s: out of memory", origin);
            }
            if (head + 1 > c->n_heads) c->n_heads = head + 1;
        }
        /* Sorted once per layer (an insertion per key was quadratic in the heads when the keys
         * come in descending order); two keys for one head ("1", "01") are refused. */
        config_layer *cl = &c->layers[l];
        if (cl->count > 1) qsort(cl->entries, (size_t)cl->count, sizeof *cl->entries, cmp_entry);
        for (int32_t i = 1; i < cl->count; i++)
            if (cl->entries[i].head == cl->entries[i - 1].head) {
                const int head = (int)cl->entries[i].head;
                mi_config_destroy(c);
                return mi_fail(ctx, MI_STATUS_PARSE_ERROR, "%s: layer %zu: head %d given twice",
                               origin, l, head);
            }
    }
    *out = c;
    return MI_STATUS_SUCCESS;
}

static mi_status parse_buffer(mi_context *ctx, const char *json, size_t length, const char *origin,
                              mi_config **out) {
    json_error_t err;
    /* Duplicate head keys would make the file mean different things to different readers. */
    json_t *root = json_loadb(json, length, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return mi_fail(ctx, MI_STATUS_PARSE_ERROR, "%s:%d:%d: %s", origin, err.line, err.column,
                       err.text);
    mi_status st = parse_root(ctx, root, origin, out);
    json_decref(root);
    return st;
}

mi_status mi_config_parse(mi_context *ctx, const char *json, size_t length, mi_config **out) {
    mi_clear_error(ctx);
    if (!out) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_config_parse: out is NULL");
    *out = NULL;
    if (!json && length > 0)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_config_parse: json is NULL");
    return parse_buffer(ctx, json ? json : "", length, "<config>", out);
}

mi_status mi_config_load(mi_context *ctx, const char *path, mi_config **out) {
    FILE *f;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    mi_clear_error(ctx);
    if (!out) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_config_load: out is NULL");
    *out = NULL;
    if (!path) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_config_load: path is NULL");
    f = fopen(path, "rb");
    if (!f) return mi_fail(ctx, MI_STATUS_IO_ERROR, "%s: %s", path, strerror(errno));
    /* Read in growing chunks rather than trusting fseek/ftell, so pipes and /proc work too. */
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                fclose(f);
                return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        int e = errno;
        free(buf);
        fclose(f);
        return mi_fail(ctx, MI_STATUS_IO_ERROR, "%s: read failed: %s", path, strerror(e));
    }
    fclose(f);
    mi_status st = parse_buffer(ctx, buf, len, path, out);
    free(buf);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Construction and queries                                                                    */

mi_status mi_config_create(mi_context *ctx, int32_t n_layers, int32_t n_heads,
                           const mi_head_pattern *default_pattern, mi_config **out) {
    mi_clear_error(ctx);
    if (!out) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_config_create: out is NULL");
    *out = NULL;
    if (n_layers < 0 || n_layers > MI_CONFIG_MAX_LAYERS || n_heads < 0 ||
        n_heads > MI_CONFIG_MAX_HEAD + 1)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_create: invalid shape %d layers x %d heads", (int)n_layers,
                       (int)n_heads);
    if (default_pattern && !pattern_valid(default_pattern))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_create: invalid default pattern (unknown type or negative "
                       "size)");
    mi_config *c = config_alloc(n_layers, default_pattern);
    if (!c) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "mi_config_create: out of memory");
    c->n_heads = n_heads;
    *out = c;
    return MI_STATUS_SUCCESS;
}

int32_t mi_config_n_layers(const mi_config *config) { return config ? config->n_layers : 0; }

int32_t mi_config_n_heads(const mi_config *config) { return config ? config->n_heads : 0; }

mi_status mi_config_check(mi_context *ctx, const mi_config *config, int32_t n_layers,
                          int32_t n_heads) {
    mi_clear_error(ctx);
    if (!config) return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_config_check: config is NULL");
    if (n_layers < 0 || n_heads < 0)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_check: invalid model shape %d layers x %d heads", (int)n_layers,
                       (int)n_heads);
    if (config->n_layers > n_layers)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "config has %d layers but the model has %d",
                       (int)config->n_layers, (int)n_layers);
    for (int32_t l = 0; l < config->n_layers; l++) {
        const config_layer *layer = &config->layers[l];
        /* Entries are sorted, so the last one holds the largest head id. */
        if (layer->count > 0 && layer->entries[layer->count - 1].head >= n_heads)
            return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                           "layer %d names head %d but the model has %d heads", (int)l,
                           (int)layer->entries[layer->count - 1].head, (int)n_heads);
    }
    return MI_STATUS_SUCCESS;
}

mi_status mi_config_layer(mi_context *ctx, const mi_config *config, int32_t layer, int32_t n_heads,
                          mi_head_pattern *patterns, double *scores) {
    mi_clear_error(ctx);
    if (!config || !patterns)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_layer: config and patterns are required");
    if (layer < 0 || n_heads < 0)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_layer: invalid layer %d or head count %d", (int)layer,
                       (int)n_heads);
    for (int32_t h = 0; h < n_heads; h++) {
        patterns[h] = config->default_pattern;
        if (scores) scores[h] = NAN;
    }
    /* A layer past the end of the file is a missing layer: defaults only (docs/algorithms.md
     * §5). */
    if (layer >= config->n_layers) return MI_STATUS_SUCCESS;
    const config_layer *cl = &config->layers[layer];
    for (int32_t i = 0; i < cl->count && cl->entries[i].head < n_heads; i++) {
        const config_entry *e = &cl->entries[i];
        patterns[e->head] = e->pattern;
        if (scores) scores[e->head] = e->score;
    }
    return MI_STATUS_SUCCESS;
}

mi_status mi_config_set_head(mi_context *ctx, mi_config *config, int32_t layer, int32_t head,
                             const mi_head_pattern *pattern, double score) {
    mi_clear_error(ctx);
    if (!config || !pattern)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_set_head: config and pattern are required");
    if (layer < 0 || layer >= MI_CONFIG_MAX_LAYERS)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_set_head: layer %d outside [0, %d)", (int)layer,
                       (int)MI_CONFIG_MAX_LAYERS);
    if (head < 0 || head > MI_CONFIG_MAX_HEAD)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_config_set_head: invalid head %d",
                       (int)head);
    if (!pattern_valid(pattern))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_set_head: layer %d, head %d: unknown pattern type or negative "
                       "size",
                       (int)layer, (int)head);
    if (isinf(score))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_set_head: layer %d, head %d: infinite score cannot be written",
                       (int)layer, (int)head);
    if (layer >= config->n_layers) {
        /* A search writes layer after layer, as the original's does: the config grows, and the
         * layers in between hold no entries (their heads get the default). */
        config_layer *grown = realloc(config->layers, (size_t)(layer + 1) * sizeof *grown);
        if (!grown)
            return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "mi_config_set_head: out of memory");
        memset(grown + config->n_layers, 0, (size_t)(layer + 1 - config->n_layers) * sizeof *grown);
        config->layers = grown;
        config->n_layers = layer + 1;
    }
    config_entry *e = layer_upsert(&config->layers[layer], head);
    if (!e) return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "mi_config_set_head: out of memory");
    e->pattern = *pattern;
    /* Keep the two file fields consistent with the parameters the pattern really uses, so that
     * to_json writes what will be read back. */
    mi_head_pattern_sizes(pattern, &e->pattern.vertical_size, &e->pattern.slash_size);
    e->score = score;
    e->score_int = 0;
    if (isnan(score)) {
        e->kind = SCORE_NONE;
    } else if (score == floor(score) && fabs(score) < 9007199254740992.0) {
        /* Integral values are written as integers, as the shipped configs hold them. */
        e->kind = SCORE_INT;
        e->score_int = (long long)score;
    } else {
        e->kind = SCORE_REAL;
    }
    if (head + 1 > config->n_heads) config->n_heads = head + 1;
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Serialisation                                                                               */

typedef struct strbuf {
    char *data;
    size_t len, cap;
    bool failed;
} strbuf;

static void sb_printf(strbuf *sb, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sb_printf(strbuf *sb, const char *fmt, ...) {
    va_list ap;
    if (sb->failed) return;
    for (;;) {
        size_t room = sb->cap - sb->len;
        va_start(ap, fmt);
        int n = vsnprintf(sb->data ? sb->data + sb->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            sb->failed = true;
            return;
        }
        if ((size_t)n < room) {
            sb->len += (size_t)n;
            return;
        }
        size_t ncap = sb->cap ? sb->cap * 2 : 4096;
        while (ncap - sb->len <= (size_t)n) ncap *= 2;
        char *nd = realloc(sb->data, ncap);
        if (!nd) {
            sb->failed = true;
            return;
        }
        sb->data = nd;
        sb->cap = ncap;
    }
}

/* Shortest "%.*g" that reads back to the same double, always with a '.' or exponent so that
 * the value reads back as a JSON real, not an integer. */
static void sb_real(strbuf *sb, double v) {
    char tmp[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    if (!strpbrk(tmp, ".eE")) strcat(tmp, ".0");
    sb_printf(sb, "%s", tmp);
}

static void sb_entry(strbuf *sb, int32_t head, const mi_head_pattern *p, score_kind kind,
                     long long score_int, double score) {
    int32_t vs = p->vertical_size, ss = p->slash_size;
    mi_head_pattern_sizes(p, &vs, &ss);
    sb_printf(sb, "\"%d\": [\"%s\", %d, %d, ", (int)head, mi_pattern_name(p->type), (int)vs,
              (int)ss);
    if (kind == SCORE_INT)
        sb_printf(sb, "%lld", score_int);
    else if (kind == SCORE_REAL)
        sb_real(sb, score);
    else
        sb_printf(sb, "null");
    sb_printf(sb, "]");
}

static bool pattern_equal(const mi_head_pattern *a, const mi_head_pattern *b) {
    return a->type == b->type && a->vertical_size == b->vertical_size &&
           a->slash_size == b->slash_size && a->n_init == b->n_init && a->n_local == b->n_local &&
           a->n_last == b->n_last && a->top_k == b->top_k;
}

mi_status mi_config_to_json(mi_context *ctx, const mi_config *config, char **out) {
    strbuf sb = {0};
    mi_clear_error(ctx);
    if (!config || !out)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_to_json: config and out are required");
    *out = NULL;
    /* The format has no slot for a default pattern: when it is not the library's, write every
     * head explicitly so that reading the file back gives the same patterns. */
    const mi_head_pattern lib_default = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    const bool explicit_defaults = !pattern_equal(&config->default_pattern, &lib_default);
    sb_printf(&sb, "[");
    for (int32_t l = 0; l < config->n_layers; l++) {
        const config_layer *layer = &config->layers[l];
        int32_t written = 0;
        sb_printf(&sb, "%s\n  {", l ? "," : "");
        if (explicit_defaults) {
            int32_t i = 0;
            for (int32_t h = 0; h < config->n_heads; h++) {
                sb_printf(&sb, "%s", written++ ? ", " : "");
                if (i < layer->count && layer->entries[i].head == h) {
                    const config_entry *e = &layer->entries[i++];
                    sb_entry(&sb, h, &e->pattern, e->kind, e->score_int, e->score);
                } else {
                    sb_entry(&sb, h, &config->default_pattern, SCORE_NONE, 0, NAN);
                }
            }
        } else {
            for (int32_t i = 0; i < layer->count; i++) {
                const config_entry *e = &layer->entries[i];
                sb_printf(&sb, "%s", written++ ? ", " : "");
                sb_entry(&sb, e->head, &e->pattern, e->kind, e->score_int, e->score);
            }
        }
        sb_printf(&sb, "}");
    }
    sb_printf(&sb, "%s]\n", config->n_layers ? "\n" : "");
    if (sb.failed) {
        free(sb.data);
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "mi_config_to_json: out of memory");
    }
    *out = sb.data;
    return MI_STATUS_SUCCESS;
}

mi_status mi_config_save(mi_context *ctx, const mi_config *config, const char *path) {
    char *text = NULL;
    mi_clear_error(ctx);
    if (!config || !path)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_config_save: config and path are required");
    mi_status st = mi_config_to_json(ctx, config, &text);
    if (st != MI_STATUS_SUCCESS) return st;
    /* Atomically: an interrupted or failed save leaves the old file as it was. */
    const int e = mi_atomic_write(path, text, strlen(text), 0666);
    free(text);
    if (e) return mi_fail(ctx, MI_STATUS_IO_ERROR, "%s: cannot write: %s", path, strerror(e));
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* The original's per-model configs, shipped in data/configs                                   */

typedef struct model_config {
    const char *model; /* Hugging Face model id */
    const char *file;  /* in data/configs */
} model_config;

#define MI_L3_8B "Llama_3_8B_Instruct_262k_kv_out_v32_fit_o_best_pattern.json"
#define MI_L3_70B "Llama_3_70B_Instruct_262k_kv_out_v32_fit_o_best_pattern.json"
#define MI_L31_8B "Llama_3.1_8B_Instruct_128k_kv_out_v32_fit_o_best_pattern_v2.json"
#define MI_L31_70B "Llama_3.1_70B_Instruct_128k_kv_out_v32_fit_o_best_pattern_v2.json"

/* The original's model-name map (minference/configs/model2path.py), in its order. */
static const model_config model_configs[] = {
    {"gradientai/Llama-3-8B-Instruct-262k", MI_L3_8B},
    {"gradientai/Llama-3-8B-Instruct-Gradient-1048k", MI_L3_8B},
    {"gradientai/Llama-3-8B-Instruct-Gradient-4194k", MI_L3_8B},
    {"01-ai/Yi-9B-200K", "Yi_9B_200k_kv_out_v32_fit_o_best_pattern.json"},
    {"microsoft/Phi-3-mini-128k-instruct",
     "Phi_3_mini_128k_instruct_kv_out_v32_fit_o_best_pattern.json"},
    {"Qwen/Qwen2-7B-Instruct",
     "Qwen2_7B_Instruct_128k_instruct_kv_out_v32_fit_o_best_pattern.json"},
    {"Qwen/Qwen2.5-7B-Instruct",
     "Qwen2.5_7B_Instruct_128k_instruct_kv_out_v32_fit_o_best_pattern.json"},
    {"Qwen/Qwen2.5-32B-Instruct", "Qwen2.5_32B_Instruct_128k_kv_out_v32_fit_o_best_pattern.json"},
    {"Qwen/Qwen2.5-72B-Instruct", "Qwen2.5_72B_Instruct_128k_kv_out_v32_fit_o_best_pattern.json"},
    {"Qwen/Qwen2.5-7B-Instruct-1M", "Qwen2.5_7B_Instruct_1M.json"},
    {"Qwen/Qwen2.5-14B-Instruct-1M", "Qwen2.5_14B_Instruct_1M.json"},
    {"THUDM/glm-4-9b-chat-1m", "GLM_4_9B_1M_instruct_kv_out_v32_fit_o_best_pattern.json"},
    {"meta-llama/Meta-Llama-3.1-8B-Instruct", MI_L31_8B},
    {"meta-llama/Meta-Llama-3.1-70B-Instruct", MI_L31_70B},
    {"meta-llama/Llama-3.1-8B-Instruct", MI_L31_8B},
    {"meta-llama/Llama-3.1-70B-Instruct", MI_L31_70B},
    {"gradientai/Llama-3-70B-Instruct-Gradient-262k", MI_L3_70B},
    {"gradientai/Llama-3-70B-Instruct-Gradient-1048k", MI_L3_70B},
};

#define N_MODEL_CONFIGS ((int32_t)(sizeof model_configs / sizeof model_configs[0]))

int32_t mi_config_model_count(void) { return N_MODEL_CONFIGS; }

const char *mi_config_model_name(int32_t i) {
    return i >= 0 && i < N_MODEL_CONFIGS ? model_configs[i].model : NULL;
}

/* Case-folded, with '_' and ' ' read as '-': file and folder names write a model's name with
 * any of the three. */
static int name_char(char c) {
    if (c == '_' || c == ' ') return '-';
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : (unsigned char)c;
}

static bool name_equal(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (name_char(a[i]) != name_char(b[i])) return false;
    return true;
}

static bool name_contains(const char *hay, const char *needle) {
    const size_t n = strlen(needle), h = strlen(hay);
    for (size_t i = 0; i + n <= h; i++)
        if (name_equal(hay + i, needle, n)) return true;
    return false;
}

const char *mi_config_model_file(const char *model) {
    if (!model || !*model) return NULL;
    for (int32_t i = 0; i < N_MODEL_CONFIGS; i++)
        if (strlen(model) == strlen(model_configs[i].model) &&
            name_equal(model, model_configs[i].model, strlen(model)))
            return model_configs[i].file;
    /* A path or file name that holds a model's name (the part after the owner): the longest
     * such name wins, so "Qwen2.5-7B-Instruct-1M" is not read as "Qwen2.5-7B-Instruct". */
    const char *best = NULL;
    size_t best_len = 0;
    for (int32_t i = 0; i < N_MODEL_CONFIGS; i++) {
        const char *slash = strchr(model_configs[i].model, '/');
        const char *name = slash ? slash + 1 : model_configs[i].model;
        if (strlen(name) > best_len && name_contains(model, name)) {
            best = model_configs[i].file;
            best_len = strlen(name);
        }
    }
    return best;
}

#ifndef MI_CONFIG_INSTALL_DIR
#define MI_CONFIG_INSTALL_DIR ""
#endif
#ifndef MI_CONFIG_SOURCE_DIR
#define MI_CONFIG_SOURCE_DIR ""
#endif

char *mi_config_model_path(const char *model) {
    const char *file = mi_config_model_file(model);
    if (!file) return NULL;
    /* installed first, then the source tree this library was built from */
    const char *dirs[] = {MI_CONFIG_INSTALL_DIR, MI_CONFIG_SOURCE_DIR};
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        if (!dirs[d][0]) continue;
        const size_t n = strlen(dirs[d]) + 1 + strlen(file) + 1;
        char *path = malloc(n);
        if (!path) return NULL;
        snprintf(path, n, "%s/%s", dirs[d], file);
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            return path;
        }
        free(path);
    }
    return NULL;
}
