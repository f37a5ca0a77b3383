/*
 * kv_leank.c: LeanK key-channel masks: the JSON file (format in minference_kv.h and
 * docs/kv-methods.md), validation, and a mask from per-channel importances (the learning tool's
 * last step).
 */
#include "atomic_file.h"
#include "internal.h"
#include "minference_kv.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEANK_FORMAT "minference-leank-mask"
#define LEANK_MAX_HEADS (1 << 22) /* layers x heads: bounds a hostile header */

struct mi_leank_mask {
    int32_t n_layers, n_kv_heads, head_dim;
    uint8_t *keep; /* [n_layers][n_kv_heads][head_dim] */
};

static mi_status fail(mi_context *ctx, mi_status st, const char *msg) {
    mi_context_set_error(ctx, st, msg);
    return st;
}

static mi_status mask_alloc(mi_context *ctx, int32_t L, int32_t H, int32_t D, mi_leank_mask **out) {
    char msg[160];
    if (L < 1 || H < 1 || D < 1 || D > 1024 || (int64_t)L * H > LEANK_MAX_HEADS) {
        snprintf(msg, sizeof msg,
                 "LeanK mask shape %d layers x %d KV heads x head_dim %d is out of range", L, H, D);
        return fail(ctx, MI_STATUS_INVALID_ARGUMENT, msg);
    }
    mi_leank_mask *m = calloc(1, sizeof *m);
    if (m) m->keep = malloc((size_t)L * (size_t)H * (size_t)D);
    if (!m || !m->keep) {
        free(m);
        return fail(ctx, MI_STATUS_OUT_OF_MEMORY, "out of memory for a LeanK mask");
    }
    m->n_layers = L, m->n_kv_heads = H, m->head_dim = D;
    memset(m->keep, 1, (size_t)L * (size_t)H * (size_t)D);
    *out = m;
    return MI_STATUS_SUCCESS;
}

mi_status mi_leank_mask_create(mi_context *ctx, int32_t n_layers, int32_t n_kv_heads,
                               int32_t head_dim, mi_leank_mask **out) {
    if (!out) return fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_leank_mask_create: out is NULL");
    return mask_alloc(ctx, n_layers, n_kv_heads, head_dim, out);
}

void mi_leank_mask_destroy(mi_leank_mask *mask) {
    if (!mask) return;
    free(mask->keep);
    free(mask);
}

void mi_leank_mask_shape(const mi_leank_mask *mask, int32_t *n_layers, int32_t *n_kv_heads,
                         int32_t *head_dim) {
    if (n_layers) *n_layers = mask ? mask->n_layers : 0;
    if (n_kv_heads) *n_kv_heads = mask ? mask->n_kv_heads : 0;
    if (head_dim) *head_dim = mask ? mask->head_dim : 0;
}

const uint8_t *mi_leank_mask_head(const mi_leank_mask *mask, int32_t layer, int32_t kv_head) {
    if (!mask || layer < 0 || layer >= mask->n_layers || kv_head < 0 || kv_head >= mask->n_kv_heads)
        return NULL;
    return mask->keep + ((size_t)layer * mask->n_kv_heads + (size_t)kv_head) * mask->head_dim;
}

mi_status mi_leank_mask_set(mi_leank_mask *mask, int32_t layer, int32_t kv_head,
                            const uint8_t *keep) {
    const uint8_t *row = mi_leank_mask_head(mask, layer, kv_head);
    if (!row || !keep) return MI_STATUS_INVALID_ARGUMENT;
    uint8_t *w = (uint8_t *)row;
    for (int32_t d = 0; d < mask->head_dim; d++) w[d] = keep[d] ? 1 : 0;
    return MI_STATUS_SUCCESS;
}

double mi_leank_mask_keep_fraction(const mi_leank_mask *mask) {
    if (!mask) return 0.0;
    const size_t n = (size_t)mask->n_layers * mask->n_kv_heads * mask->head_dim;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += mask->keep[i];
    return (double)k / (double)n;
}

/* ------------------------------------------------------------------------------------------ */
/* The file                                                                                    */

static bool get_dim(const json_t *root, const char *key, int32_t *out) {
    const json_t *v = json_object_get(root, key);
    if (!json_is_integer(v)) return false;
    const json_int_t x = json_integer_value(v);
    if (x < 1 || x > (1 << 24)) return false;
    *out = (int32_t)x;
    return true;
}

mi_status mi_leank_mask_parse(mi_context *ctx, const char *json, size_t length,
                              mi_leank_mask **out) {
    char msg[320];
    if (!json || !out) return fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_leank_mask_parse: NULL");
    json_error_t jerr;
    json_t *root = json_loadb(json, length, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(msg, sizeof msg, "LeanK mask: invalid JSON at line %d: %s", jerr.line, jerr.text);
        return fail(ctx, MI_STATUS_PARSE_ERROR, msg);
    }
    mi_status st = MI_STATUS_PARSE_ERROR;
    mi_leank_mask *m = NULL;
    int32_t L = 0, H = 0, D = 0;
    const json_t *fmt = json_object_get(root, "format"), *ver = json_object_get(root, "version");
    const json_t *masks = json_object_get(root, "masks");
    msg[0] = 0;
    if (!json_is_object(root) || !json_is_string(fmt) ||
        strcmp(json_string_value(fmt), LEANK_FORMAT) != 0)
        snprintf(msg, sizeof msg, "LeanK mask: not a \"%s\" file", LEANK_FORMAT);
    else if (!json_is_integer(ver) || json_integer_value(ver) != 1)
        snprintf(msg, sizeof msg, "LeanK mask: version must be 1");
    else if (!get_dim(root, "n_layers", &L) || !get_dim(root, "n_kv_heads", &H) ||
             !get_dim(root, "head_dim", &D))
        snprintf(msg, sizeof msg,
                 "LeanK mask: n_layers, n_kv_heads and head_dim must be positive integers");
    else if (!json_is_array(masks) || json_array_size(masks) != (size_t)L)
        snprintf(msg, sizeof msg, "LeanK mask: \"masks\" must be a list of %d layers", L);
    if (!msg[0]) {
        st = mask_alloc(ctx, L, H, D, &m);
        if (st != MI_STATUS_SUCCESS) {
            json_decref(root);
            return st;
        }
        st = MI_STATUS_PARSE_ERROR;
    }
    for (int32_t l = 0; !msg[0] && l < L; l++) {
        const json_t *layer = json_array_get(masks, (size_t)l);
        if (!json_is_array(layer) || json_array_size(layer) != (size_t)H) {
            snprintf(msg, sizeof msg, "LeanK mask: layer %d must list %d KV heads", l, H);
            break;
        }
        for (int32_t h = 0; h < H; h++) {
            const json_t *e = json_array_get(layer, (size_t)h);
            const char *bits = json_is_string(e) ? json_string_value(e) : NULL;
            if (!bits || json_string_length(e) != (size_t)D) {
                snprintf(msg, sizeof msg,
                         "LeanK mask: layer %d head %d must be a string of %d '0'/'1' characters",
                         l, h, D);
                break;
            }
            uint8_t *row = (uint8_t *)mi_leank_mask_head(m, l, h);
            for (int32_t d = 0; d < D; d++) {
                if (bits[d] != '0' && bits[d] != '1') {
                    snprintf(msg, sizeof msg,
                             "LeanK mask: layer %d head %d channel %d is '%c', not '0' or '1'", l,
                             h, d, bits[d]);
                    break;
                }
                row[d] = bits[d] == '1';
            }
            if (msg[0]) break;
        }
    }
    json_decref(root);
    if (msg[0]) {
        mi_leank_mask_destroy(m);
        return fail(ctx, st, msg);
    }
    *out = m;
    return MI_STATUS_SUCCESS;
}

mi_status mi_leank_mask_load(mi_context *ctx, const char *path, mi_leank_mask **out) {
    char msg[512];
    if (!path || !out) return fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_leank_mask_load: NULL");
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, sizeof msg, "cannot open LeanK mask %s: %s", path, strerror(errno));
        return fail(ctx, MI_STATUS_IO_ERROR, msg);
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap || cap >= ((size_t)1 << 30)) break;
        char *b = realloc(buf, cap * 2);
        if (!b) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b, cap *= 2;
    }
    const int err = ferror(f);
    fclose(f);
    if (!buf) return fail(ctx, MI_STATUS_OUT_OF_MEMORY, "out of memory reading a LeanK mask");
    if (err) {
        free(buf);
        snprintf(msg, sizeof msg, "cannot read LeanK mask %s", path);
        return fail(ctx, MI_STATUS_IO_ERROR, msg);
    }
    mi_status st = mi_leank_mask_parse(ctx, buf, n, out);
    free(buf);
    if (st != MI_STATUS_SUCCESS && ctx) {
        snprintf(msg, sizeof msg, "%s: %s", path, mi_context_last_error(ctx));
        mi_context_set_error(ctx, st, msg);
    }
    return st;
}

mi_status mi_leank_mask_save(mi_context *ctx, const mi_leank_mask *mask, const char *path) {
    char msg[512];
    if (!mask || !path || !path[0])
        return fail(ctx, MI_STATUS_INVALID_ARGUMENT, "mi_leank_mask_save: NULL mask or path");
    mi_atomic_file af;
    int e = mi_atomic_open(&af, path, 0644);
    if (e) {
        snprintf(msg, sizeof msg, "cannot create %s: %s", path, strerror(e));
        return fail(ctx, MI_STATUS_IO_ERROR, msg);
    }
    fprintf(af.f,
            "{\"format\": \"%s\", \"version\": 1, \"n_layers\": %d, \"n_kv_heads\": %d, "
            "\"head_dim\": %d, \"keep_fraction\": %.6f,\n \"masks\": [\n",
            LEANK_FORMAT, mask->n_layers, mask->n_kv_heads, mask->head_dim,
            mi_leank_mask_keep_fraction(mask));
    for (int32_t l = 0; l < mask->n_layers; l++) {
        fputs("  [", af.f);
        for (int32_t h = 0; h < mask->n_kv_heads; h++) {
            const uint8_t *row = mi_leank_mask_head(mask, l, h);
            fputc('"', af.f);
            for (int32_t d = 0; d < mask->head_dim; d++) fputc(row[d] ? '1' : '0', af.f);
            fputs(h + 1 < mask->n_kv_heads ? "\", " : "\"", af.f);
        }
        fputs(l + 1 < mask->n_layers ? "],\n" : "]\n", af.f);
    }
    fputs(" ]}\n", af.f);
    e = ferror(af.f) ? EIO : 0;
    if (e)
        mi_atomic_abort(&af);
    else
        e = mi_atomic_commit(&af);
    if (e) {
        snprintf(msg, sizeof msg, "cannot write %s: %s", path, strerror(e));
        return fail(ctx, MI_STATUS_IO_ERROR, msg);
    }
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* From importances                                                                            */

typedef struct ranked {
    double score;
    int32_t d;
} ranked;

static int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->d - y->d; /* ties: the lower channel first */
}

mi_status mi_leank_mask_from_importance(mi_context *ctx, int32_t n_layers, int32_t n_kv_heads,
                                        int32_t head_dim, const double *importance, double keep,
                                        int32_t align, mi_leank_mask **out) {
    if (!importance || !out || !(keep > 0.0 && keep <= 1.0) || align < 1 || align > head_dim)
        return fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                    "mi_leank_mask_from_importance: importance and out must be given, keep in "
                    "(0, 1] and align in 1..head_dim");
    mi_leank_mask *m = NULL;
    mi_status st = mask_alloc(ctx, n_layers, n_kv_heads, head_dim, &m);
    if (st != MI_STATUS_SUCCESS) return st;
    ranked *r = malloc((size_t)head_dim * sizeof *r);
    if (!r) {
        mi_leank_mask_destroy(m);
        return fail(ctx, MI_STATUS_OUT_OF_MEMORY, "out of memory learning a LeanK mask");
    }
    int32_t k = (int32_t)lround(keep * head_dim / align) * align;
    if (k < align) k = align;
    if (k > head_dim) k = head_dim;
    for (int32_t l = 0; l < n_layers; l++)
        for (int32_t h = 0; h < n_kv_heads; h++) {
            const double *imp = importance + ((size_t)l * n_kv_heads + (size_t)h) * head_dim;
            for (int32_t d = 0; d < head_dim; d++)
                r[d].score = isfinite(imp[d]) ? imp[d] : -1.0, r[d].d = d;
            qsort(r, (size_t)head_dim, sizeof *r, cmp_ranked);
            uint8_t *row = (uint8_t *)mi_leank_mask_head(m, l, h);
            memset(row, 0, (size_t)(uint32_t)head_dim); /* head_dim > 0: checked above */
            for (int32_t i = 0; i < k; i++) row[r[i].d] = 1;
        }
    free(r);
    *out = m;
    return MI_STATUS_SUCCESS;
}
