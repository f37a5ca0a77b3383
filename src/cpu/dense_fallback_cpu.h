/*
 * dense_fallback_cpu.h: the length from which a head's sparse pattern pays on the CPU, used when
 * mi_prefill_params.dense_below < 0 (the default). A (b, h) whose sequence is shorter runs dense:
 * no estimation, no index. Plain C, so that the host test (tests/cpu/test_cpu_dense_fallback.c)
 * uses the rule the library uses. The CUDA backend has its own (src/cuda/dense_fallback.h): a
 * GPU's fixed costs are launches and latencies, a CPU's are the estimates' passes over q and k.
 *
 * Fitted to speed-ups of the sparse prefill (estimation and index included) over dense on a
 * 2-core x86-64 machine (bf16, D = 128; the measurements are
 * tests/data/crossover/2026-12-02-cpu-crossover-patterns.json, which the test checks against):
 *   - A-shape / Tri-shape: no estimate, so the work decides: sparse from twice the kept keys.
 *   - Block-sparse: from one and a half times its blocks' keys.
 *   - Vertical-slash: 8192 (below that its diagonals cover nearly the whole causal triangle).
 *     Queries at an offset (q_len rows over L keys): the estimate's two passes of 64 rows over
 *     every key cost about 128 rows of dense attention, and a sparse row still reads up to
 *     vertical + slash keys, so sparse pays only from q_len (L - kept) > 128 L, i.e. for
 *     q_len > 128 and L > q_len kept / (q_len - 128). Measured on SmolLM2 over an 8K session:
 *     256 rows took 0.78 s dense and 0.98-1.92 s sparse (docs/kv-cache.md); this rule runs them
 *     dense, and a 1K turn over 128K sparse.
 *   - No pattern runs sparse below 3072, the prefill's own fixed costs.
 */
#ifndef MI_CPU_DENSE_FALLBACK_H
#define MI_CPU_DENSE_FALLBACK_H

#include <stdint.h>

#include "../core/kept_keys.h"
#include "minference.h"

#define MI_CPU_DENSE_BELOW_VS 8192    /* vertical-slash */
#define MI_CPU_DENSE_BELOW_FLOOR 3072 /* any sparse pattern: the prefill's own fixed costs */

/* The measured rules above, one per pattern (a pattern without one runs sparse from the floor).
 * Lengths before the floor; env is unused on the CPU. */
static inline int64_t mi_cpu_rule_window(const mi_head_pattern *p, const mi_fallback_env *env,
                                         const void *arg) {
    (void)env, (void)arg;
    return 2 * mi_kept_keys(p);
}
static inline int64_t mi_cpu_rule_block(const mi_head_pattern *p, const mi_fallback_env *env,
                                        const void *arg) {
    (void)env, (void)arg;
    return 3 * mi_kept_keys(p) / 2;
}
#define MI_CPU_VS_ESTIMATE_ROWS 128 /* the estimate's cost in rows of dense attention */
static inline int64_t mi_cpu_rule_vs(const mi_head_pattern *p, const mi_fallback_env *env,
                                     const void *arg) {
    (void)arg;
    if (!env || env->q_len <= 0 || env->q_len >= env->len) return MI_CPU_DENSE_BELOW_VS;
    if (env->q_len <= MI_CPU_VS_ESTIMATE_ROWS) return INT64_MAX; /* never pays at an offset */
    const int64_t kept = (int64_t)(p->vertical_size > 0 ? p->vertical_size : 0) +
                         (p->slash_size > 0 ? p->slash_size : 0);
    const int64_t from = env->q_len * kept / (env->q_len - MI_CPU_VS_ESTIMATE_ROWS) + 1;
    return from > MI_CPU_DENSE_BELOW_VS ? from : MI_CPU_DENSE_BELOW_VS;
}
static const mi_dense_below_rule mi_cpu_dense_below_rules[MI_PATTERN_TYPES] = {
    [MI_PATTERN_A_SHAPE] = mi_cpu_rule_window,
    [MI_PATTERN_TRI_SHAPE] = mi_cpu_rule_window,
    [MI_PATTERN_VERTICAL_SLASH] = mi_cpu_rule_vs,
    [MI_PATTERN_BLOCK_SPARSE] = mi_cpu_rule_block,
};

/* The CPU's rule for mi_prefill_plan_build: the pattern's, at least the floor (a sparse head). */
static inline int64_t mi_cpu_dense_below_rule(const mi_head_pattern *p, const mi_fallback_env *env,
                                              const void *arg) {
    const mi_dense_below_rule r = mi_cpu_dense_below_rules[p->type];
    const int64_t from = r ? r(p, env, arg) : 0;
    return from < MI_CPU_DENSE_BELOW_FLOOR ? MI_CPU_DENSE_BELOW_FLOOR : from;
}

/* The length from which pattern p runs sparse by default on the CPU (0 for a dense head, which
 * never estimates); clamped to INT32_MAX. */
static inline int32_t mi_cpu_default_dense_below(const mi_head_pattern *p) {
    const mi_pattern_traits *t = mi_pattern_traits_of(p->type);
    if (!t || t->kernel == MI_PLAN_KERNEL_DENSE) return 0;
    return mi_length_clamp(mi_cpu_dense_below_rule(p, NULL, NULL));
}

/* The length from which head p runs sparse under dense_below (>= 0: that, for every sparse head;
 * < 0: the default above). */
static inline int32_t mi_cpu_dense_below_of(const mi_head_pattern *p, int32_t dense_below) {
    const mi_pattern_traits *t = mi_pattern_traits_of(p->type);
    if (!t || t->kernel == MI_PLAN_KERNEL_DENSE) return 0;
    return dense_below >= 0 ? dense_below : mi_cpu_default_dense_below(p);
}

#endif /* MI_CPU_DENSE_FALLBACK_H */
