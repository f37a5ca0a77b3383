/* pattern.c: pattern names, defaults of the original, and parameter defaults. */
#include "internal.h"

#include <string.h>

const char *mi_pattern_name(mi_pattern_type type) {
    switch (type) {
    case MI_PATTERN_DENSE: return "dense";
    case MI_PATTERN_A_SHAPE: return "stream_llm";
    case MI_PATTERN_TRI_SHAPE: return "tri_shape";
    case MI_PATTERN_VERTICAL_SLASH: return "vertical_and_slash";
    case MI_PATTERN_BLOCK_SPARSE: return "block_sparse";
    }
    return NULL;
}

mi_status mi_pattern_from_name(const char *name, mi_pattern_type *out) {
    static const struct {
        const char *name;
        mi_pattern_type type;
    } names[] = {
        {"dense", MI_PATTERN_DENSE},
        {"stream_llm", MI_PATTERN_A_SHAPE},
        {"a_shape", MI_PATTERN_A_SHAPE},
        {"tri_shape", MI_PATTERN_TRI_SHAPE},
        {"vertical_and_slash", MI_PATTERN_VERTICAL_SLASH},
        {"vertical_slash", MI_PATTERN_VERTICAL_SLASH},
        {"block_sparse", MI_PATTERN_BLOCK_SPARSE},
    };
    if (!name || !out) return MI_STATUS_INVALID_ARGUMENT;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].type;
            return MI_STATUS_SUCCESS;
        }
    }
    return MI_STATUS_INVALID_ARGUMENT;
}

mi_head_pattern mi_head_pattern_default(mi_pattern_type type) {
    mi_head_pattern p;
    memset(&p, 0, sizeof p);
    p.type = type;
    /* Every field carries the original's default, so switching the type keeps sane budgets. */
    p.vertical_size = 1000;
    p.slash_size = 6096;
    p.n_init = 128;
    p.n_local = 3968;
    p.n_last = 100;
    p.top_k = 100;
    return p;
}

mi_vs_params mi_vs_default_params(void) {
    mi_vs_params p;
    p.last_q = 64;
    p.forced_columns = 30;
    p.forced_diagonals = 100;
    p.min_vertical = 30;
    p.min_slash = 50;
    return p;
}

mi_prefill_params mi_prefill_default_params(void) {
    mi_prefill_params p;
    p.softmax_scale = 0.0f;
    p.vs = mi_vs_default_params();
    p.dense_below = -1;
    return p;
}
