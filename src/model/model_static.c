/*
 * model_static.c: "static" attention of the model runner, MInference w/ static (the original's
 * attn_type "static"; docs/prefill-methods.md). Each layer keeps one mi_vs_static: the layer's
 * first fresh prompt estimates every query head's vertical-slash sets with the budgets of the
 * layer's config entries (their two sizes, whatever the entry's pattern, as the original's
 * static mode reads them; VS 1000/6096 without a config), and every later fresh prompt reuses
 * them. With a folder ("static:DIR"), a layer whose file DIR/layer<N>.mivs exists loads its sets
 * from it instead of estimating, and a layer that estimated saves them there.
 */
#define _POSIX_C_SOURCE 200809L
#include "model_runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void mim_static_free(mi_model *m) {
    if (m->static_vs)
        for (int32_t l = 0; l < m->n_layers; l++) mi_vs_static_destroy(m->static_vs[l]);
    free(m->static_vs);
    free(m->static_dir);
    m->static_vs = NULL;
    m->static_dir = NULL;
}

static void layer_file(const mi_model *m, int32_t layer, char *path, size_t size) {
    snprintf(path, size, "%s/layer%d.mivs", m->static_dir, layer);
}

mi_status mim_static_attention(mi_model *m, int32_t layer, const mi_head_pattern *pat,
                               const mi_tensor *q, const mi_tensor *k, const mi_tensor *v,
                               mi_tensor *out) {
    if (!m->static_vs) {
        m->static_vs = calloc((size_t)m->n_layers, sizeof *m->static_vs);
        if (!m->static_vs) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    char path[4096];
    if (!m->static_vs[layer]) {
        int32_t *budget = malloc(2 * (size_t)m->n_heads * sizeof(int32_t));
        if (!budget) return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        for (int32_t h = 0; h < m->n_heads; h++) {
            budget[h] = pat[h].vertical_size;
            budget[m->n_heads + h] = pat[h].slash_size;
        }
        mi_status st = mi_vs_static_create(m->ctx, m->n_heads, budget, budget + m->n_heads, NULL,
                                           &m->static_vs[layer]);
        free(budget);
        if (st == MI_STATUS_SUCCESS && m->static_dir) {
            layer_file(m, layer, path, sizeof path);
            struct stat sb;
            if (stat(path, &sb) == 0) st = mi_vs_static_load(m->ctx, m->static_vs[layer], path);
        }
        if (st != MI_STATUS_SUCCESS)
            return mim_model_fail(m, st, "layer %d static sets: %s", layer,
                                  mi_context_last_error(m->ctx));
    }
    mi_vs_static *vs = m->static_vs[layer];
    const int32_t before = mi_vs_static_estimates(vs);
    mi_status st =
        mi_vs_static_attention(m->ctx, vs, q, k, v, 1.0f / sqrtf((float)m->hd), out, NULL);
    if (st == MI_STATUS_SUCCESS && m->static_dir && mi_vs_static_estimates(vs) > before) {
        mkdir(m->static_dir, 0755); /* an existing folder is fine; a failure shows at the save */
        layer_file(m, layer, path, sizeof path);
        st = mi_vs_static_save(m->ctx, vs, path);
    }
    if (st != MI_STATUS_SUCCESS)
        return mim_model_fail(m, st, "layer %d static attention: %s", layer,
                              mi_context_last_error(m->ctx));
    return MI_STATUS_SUCCESS;
}
