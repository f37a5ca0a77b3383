/*
 * kv_method_leank.c: LeanK (Zhang et al., "LeanK: Learnable K Cache Channel Pruning for
 * Efficient Decoding"). A static mask per layer and KV head over the key channels, read from a
 * file (mi_leank_mask_load; `minference leank-learn` writes one); decode scores the rows between
 * the first sink_size and the last recent_size with the kept channels only, and a head that keeps
 * none skips those rows (the original drops their keys and values). Defaults sink 128 and recent
 * 768: the original's. The original moves rows from the recent window to the pruned part
 * accumu_size (128) at a time, a copy this reader does not need: the boundary here is exact.
 * round_to is the alignment of the kept counts for the original's kernel; it is used by
 * leank-learn (--align), not at run time. Storage keeps every channel (the pages are shared with
 * dense sessions); only the reads are pruned.
 */
#include "kv_method.h"

#include <stdlib.h>

static const kv_param_def leank_params[] = {
    {"leank_path", KV_PARAM_STRING, 0, 0, 0, NULL, "the per-head channel mask file"},
    {"mask", KV_PARAM_STRING, 0, 0, 0, NULL, "the same as leank_path"},
    {"sink_size", KV_PARAM_INT, 128, 0, 1 << 20, NULL, "first tokens kept with every channel"},
    {"recent_size", KV_PARAM_INT, 768, 0, 1 << 20, NULL, "last tokens kept with every channel"},
    {"accumu_size", KV_PARAM_INT, 128, 0, 1 << 20, NULL,
     "the original's batch of rows moved to the pruned part (accepted; the boundary is exact)"},
    {"round_to", KV_PARAM_INT, 32, 1, 1024, NULL,
     "kept channels rounded to a multiple of (leank-learn --align)"},
};

typedef struct leank_state {
    mi_leank_mask *mask;
    int64_t sink, recent;
    int32_t refs; /* the mask is read-only: forks share it */
} leank_state;

static mi_status leank_create(kv_method *m) {
    const char *path = kv_spec_given(&m->spec, "mask") ? kv_spec_get_string(&m->spec, "mask")
                                                       : kv_spec_get_string(&m->spec, "leank_path");
    if (!path || !path[0])
        return kv_method_fail(m, MI_STATUS_INVALID_ARGUMENT,
                              "kv method leank: give the mask file: leank:leank_path=FILE (or "
                              "mask=FILE); `minference leank-learn` writes one");
    mi_context *ctx = NULL;
    if (mi_context_create(NULL, &ctx) != MI_STATUS_SUCCESS)
        return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    mi_leank_mask *mask = NULL;
    mi_status st = mi_leank_mask_load(ctx, path, &mask);
    if (st != MI_STATUS_SUCCESS) {
        kv_method_fail(m, st, "kv method leank: %s", mi_context_last_error(ctx));
        mi_context_destroy(ctx);
        return st;
    }
    mi_context_destroy(ctx);
    int32_t L, H, D;
    mi_leank_mask_shape(mask, &L, &H, &D);
    if (L != m->geo.n_layers || H != m->geo.n_kv_heads || D != m->geo.head_dim) {
        mi_leank_mask_destroy(mask);
        return kv_method_fail(m, MI_STATUS_INVALID_ARGUMENT,
                              "kv method leank: %s is for %d layers x %d KV heads x head_dim %d; "
                              "the model has %d x %d x %d",
                              path, L, H, D, m->geo.n_layers, m->geo.n_kv_heads, m->geo.head_dim);
    }
    leank_state *s = malloc(sizeof *s);
    if (!s) {
        mi_leank_mask_destroy(mask);
        return kv_method_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    s->mask = mask;
    s->sink = (int64_t)kv_spec_get(&m->spec, "sink_size");
    s->recent = (int64_t)kv_spec_get(&m->spec, "recent_size");
    s->refs = 1;
    m->state = s;
    return MI_STATUS_SUCCESS;
}

static void leank_destroy(kv_method *m) {
    leank_state *s = m->state;
    if (s && --s->refs == 0) {
        mi_leank_mask_destroy(s->mask);
        free(s);
    }
}

static mi_status leank_clone(const kv_method *m, kv_method *out) {
    leank_state *s = m->state;
    s->refs++; /* sessions of one model are used by one thread at a time */
    out->state = s;
    return MI_STATUS_SUCCESS;
}

static const uint8_t *leank_channels(const kv_method *m, int32_t layer, int32_t kv_head,
                                     int64_t *sink, int64_t *recent) {
    const leank_state *s = m->state;
    *sink = s->sink;
    *recent = s->recent;
    const uint8_t *keep = mi_leank_mask_head(s->mask, layer, kv_head);
    for (int32_t d = 0; keep && d < m->geo.head_dim; d++)
        if (!keep[d]) return keep;
    return NULL; /* every channel kept: nothing pruned */
}

const kv_method_entry kv_method_leank_entry = {
    .name = "leank",
    .summary = "static per-head key-channel pruning from a mask file",
    .params = leank_params,
    .n_params = (int32_t)(sizeof leank_params / sizeof leank_params[0]),
    .create = leank_create,
    .destroy = leank_destroy,
    .clone = leank_clone,
    .key_channels = leank_channels,
};
