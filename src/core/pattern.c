/* pattern.c: the defaults of the estimation and prefill parameters (the patterns' own names
 * and defaults are in the pattern table, pattern_entries.h). */
#include "internal.h"

#include <string.h>

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
