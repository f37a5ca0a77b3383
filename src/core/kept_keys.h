/*
 * kept_keys.h: what the backends' dense-fallback rules scale with (src/cpu/dense_fallback_cpu.h,
 * src/cuda/dense_fallback.h): the keys a row of a static or block-sparse head keeps (its
 * pattern's table entry says), and a length in int64 brought back to the int32 of
 * mi_prefill_params.dense_below. Plain C.
 */
#ifndef MI_KEPT_KEYS_H
#define MI_KEPT_KEYS_H

#include <stdint.h>

#include "pattern_table.h"

/* Keys a row keeps: sinks + window for A-/Tri-shape, 64 a block for block-sparse; 0 for the
 * others. Negative sizes (rejected by validation) count as 0. */
static inline int64_t mi_kept_keys(const mi_head_pattern *p) {
    const mi_pattern_traits *t = mi_pattern_traits_of(p->type);
    return t && t->kept_keys ? t->kept_keys(p) : 0;
}

/* A length clamped to INT32_MAX. */
static inline int32_t mi_length_clamp(int64_t len) {
    return len > INT32_MAX ? INT32_MAX : (int32_t)len;
}

#endif /* MI_KEPT_KEYS_H */
