/*
 * dense_fallback_cpu.h: the length from which a head's sparse pattern pays on the CPU, used when
 * mi_prefill_params.dense_below < 0 (the default). A (b, h) whose sequence is shorter runs dense:
 * no estimation, no index. Plain C, so that the host test (tests/cpu/test_cpu_dense_fallback.c:
 * the rule against the measurements below) uses the rule the library uses. The CUDA backend has
 * its own (src/cuda/dense_fallback.h): a GPU's fixed costs are launches and latencies, a CPU's
 * are the estimates' passes over q and k, so the two crossovers differ.
 *
 * Measured on a 2-core x86-64 machine (AMD EPYC, AVX-512 engine, 2 threads; bf16, D = 128, 4 / 1
 * heads; synthetic inputs with sinks, verticals, slashes and a local band; process CPU time,
 * median of 5; tests/cpu/bench_cpu_patterns; bench/results/2026-12-02-cpu-crossover-
 * patterns.json), speed-ups of the sparse prefill (estimation and index included) over dense:
 *   - A-shape 64 + 960: 0.96 at 1K, 1.19 at 2K, 2.02 at 4K; 128 + 3968: 0.93 at 4K, 1.07 at 6K,
 *     1.02 at 8K, 1.70 at 12K; Tri-shape 128 + 3968 + 100: 0.90 at 6K, 1.24 at 8K. No estimate,
 *     and the CPU engine's cost is its work: sparse pays from twice the keys a row keeps.
 *   - Block-sparse top 25 (1600 keys a row): 0.99 at 2K, 1.27 at 3K, 1.48 at 4K; top 100: 0.79
 *     at 6K, 1.16 at 8K, 1.43 at 12K: from one and a half times its blocks' keys.
 *   - Vertical-slash 1000 / 6096: 0.77 at 6K, 1.22 at 8K, 1.26 at 12K: 8192, as measured before
 *     (src/cpu/prefill.c, on one head in fp32, and at D = 64).
 * A first run of the same program in wall time (noisier on this shared machine) agreed: A-shape
 * 64 + 960 1.52x at 2K, block-sparse top 25 1.44x at 3K, top 100 0.97x at 8K and 1.25x at 12K.
 * No pattern runs sparse below 3072: at D = 64 (9 / 3 heads, the demo model's shape; -cpu-
 * crossover-patterns-d64-2threads.json and -1thread.json) A-shape 64 + 960 was 0.77-1.00x at 2K
 * and 1.44-1.61x at 3K. Those two D = 64 runs are too noisy here for crossovers of their own (the
 * default's dense calls against the same dense call: 0.6-1.4x); they agree with this rule but at
 * single lengths within that noise.
 * Before this rule every pattern ran dense below 8192, where A-shape 64 + 960 was 2.0-2.6x and
 * block-sparse top 25 1.4-1.5x faster sparse at 4K-6K.
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
static inline int64_t mi_cpu_rule_vs(const mi_head_pattern *p, const mi_fallback_env *env,
                                     const void *arg) {
    (void)p, (void)env, (void)arg;
    return MI_CPU_DENSE_BELOW_VS;
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
