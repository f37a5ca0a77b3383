/*
 * dense_fallback.h: the length from which a head's sparse pattern pays on CUDA, used when
 * mi_prefill_params.dense_below < 0 (the default). A (b, h) whose sequence is shorter runs
 * dense: no estimation, no index, and (on Hopper, where every sequence has the full length) the
 * dense kernel. Plain C, so that the host test (tests/cuda/test_dense_fallback.c) and the GPU
 * test (tests/cuda/test_cuda.c) use the rule the library uses.
 *
 * The rules are fitted to speed-ups (dense time over sparse time, estimation and index included)
 * measured on an H200 in bf16 with position-coded q/k; the measurements are the JSON files in
 * tests/data/crossover/, and test_dense_fallback checks every rule against them:
 *   - A-shape / Tri-shape: no estimate, so the work decides: sparse from three times the keys a
 *     row keeps (D = 64: A-shape from twice, at least 3K).
 *   - Block-sparse: three times the kept keys, with a floor for the estimate's fixed cost that
 *     few (b, h) pairs do not share (12K below 16 pairs, 6K from there; D = 64 differs a little).
 *   - Vertical-slash: the index build's latency is fixed per launch, so the crossover falls with
 *     the pairs sharing it: 40K below 8 pairs, 36K below 16, 32K from there (D = 64: 48K below 8).
 *   - The portable sm_80 kernels (measured on the H200 with the sm_90a kernels turned off; on a
 *     slower GPU fixed costs weigh less, so these err towards dense): A-shape twice the kept keys,
 *     Tri-shape three times (both at least 2K), block-sparse twice (at least 4K), vertical-slash
 *     32K below 8 pairs and 24K from there.
 * docs/kernel-history.md records how the single 32K crossover these replaced was measured.
 */
#ifndef MI_CUDA_DENSE_FALLBACK_H
#define MI_CUDA_DENSE_FALLBACK_H

#include <stdint.h>

#include "../core/kept_keys.h"
#include "minference.h"

#define MI_CUDA_DENSE_BELOW_VS 32768        /* vertical-slash, 16 or more (b, h) pairs */
#define MI_CUDA_DENSE_BELOW_VS_FEW 36864    /* 8 to 15 */
#define MI_CUDA_DENSE_BELOW_VS_FEWEST 40960 /* fewer than 8 */
#define MI_CUDA_DENSE_BELOW_BS_FLOOR 6144   /* block-sparse, 16 or more (b, h) pairs */
#define MI_CUDA_DENSE_BELOW_BS_FLOOR_FEW 12288
#define MI_CUDA_DENSE_BELOW_D64_VS_FEWEST 49152      /* D = 64: vertical-slash, below 8 pairs */
#define MI_CUDA_DENSE_BELOW_D64_BS_FLOOR_FEW 8192    /* D = 64: block-sparse, below 16 pairs */
#define MI_CUDA_DENSE_BELOW_D64_A_SHAPE_FLOOR 3072   /* D = 64: A-shape */
#define MI_CUDA_DENSE_BELOW_PORTABLE_FLOOR 2048      /* sm_80 kernels: A-/Tri-shape */
#define MI_CUDA_DENSE_BELOW_PORTABLE_BS_FLOOR 4096   /* sm_80: block-sparse */
#define MI_CUDA_DENSE_BELOW_PORTABLE_VS 24576        /* sm_80: vertical-slash, 8+ (b, h) pairs */
#define MI_CUDA_DENSE_BELOW_PORTABLE_VS_FEWEST 32768 /* sm_80: vertical-slash, fewer than 8 */

/* The (b, h) pairs of a launch that run each dynamic pattern: their estimates' fixed costs are
 * shared by that many. */
typedef struct mi_cuda_pattern_counts {
    int64_t vs, bs;
} mi_cuda_pattern_counts;

static inline mi_cuda_pattern_counts mi_cuda_count_patterns(const mi_head_pattern *patterns,
                                                            int64_t heads, int64_t batch) {
    mi_cuda_pattern_counts c = {0, 0};
    for (int64_t h = 0; h < heads; ++h) {
        const mi_pattern_traits *t = mi_pattern_traits_of(patterns[h].type);
        c.vs += t && t->estimate == MI_PLAN_ESTIMATE_VS;
        c.bs += t && t->estimate == MI_PLAN_ESTIMATE_BLOCK;
    }
    c.vs *= batch;
    c.bs *= batch;
    return c;
}

static inline int64_t mi_cuda_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The measured rules above, one per pattern and kernel family; env->pairs is the (b, h) pairs
 * sharing the head's estimate. A pattern without a rule runs sparse at any length. */
static inline int64_t mi_cuda_rule_a_shape(const mi_head_pattern *p, const mi_fallback_env *env,
                                           const void *arg) {
    (void)arg;
    const int64_t keys = mi_kept_keys(p);
    return env->head_dim == 64
               ? mi_cuda_max64(2 * keys, keys > 0 ? MI_CUDA_DENSE_BELOW_D64_A_SHAPE_FLOOR : 0)
               : 3 * keys;
}
/* (Tri-shape's few last rows, split over the SMs, cost little) */
static inline int64_t mi_cuda_rule_tri_shape(const mi_head_pattern *p, const mi_fallback_env *env,
                                             const void *arg) {
    (void)env, (void)arg;
    return 3 * mi_kept_keys(p);
}
static inline int64_t mi_cuda_rule_block(const mi_head_pattern *p, const mi_fallback_env *env,
                                         const void *arg) {
    (void)arg;
    const int d64 = env->head_dim == 64;
    const int64_t keys = mi_kept_keys(p);
    const int64_t floor_few =
        d64 ? MI_CUDA_DENSE_BELOW_D64_BS_FLOOR_FEW : MI_CUDA_DENSE_BELOW_BS_FLOOR_FEW;
    return mi_cuda_max64(d64 && env->pairs >= 8 ? keys * 5 / 2 : 3 * keys,
                         env->pairs < 16 ? floor_few : MI_CUDA_DENSE_BELOW_BS_FLOOR);
}
static inline int64_t mi_cuda_rule_vs(const mi_head_pattern *p, const mi_fallback_env *env,
                                      const void *arg) {
    (void)p, (void)arg;
    const int32_t fewest =
        env->head_dim == 64 ? MI_CUDA_DENSE_BELOW_D64_VS_FEWEST : MI_CUDA_DENSE_BELOW_VS_FEWEST;
    return env->pairs < 8    ? fewest
           : env->pairs < 16 ? MI_CUDA_DENSE_BELOW_VS_FEW
                             : MI_CUDA_DENSE_BELOW_VS;
}
/* The sm_80 kernels' crossovers (the same at D = 64 and 128). */
static inline int64_t mi_cuda_portable_rule_window(const mi_head_pattern *p, int64_t times) {
    const int64_t keys = mi_kept_keys(p);
    return mi_cuda_max64(times * keys, keys > 0 ? MI_CUDA_DENSE_BELOW_PORTABLE_FLOOR : 0);
}
static inline int64_t mi_cuda_portable_rule_a_shape(const mi_head_pattern *p,
                                                    const mi_fallback_env *env, const void *arg) {
    (void)env, (void)arg;
    return mi_cuda_portable_rule_window(p, 2);
}
static inline int64_t mi_cuda_portable_rule_tri_shape(const mi_head_pattern *p,
                                                      const mi_fallback_env *env, const void *arg) {
    (void)env, (void)arg;
    return mi_cuda_portable_rule_window(p, 3);
}
static inline int64_t mi_cuda_portable_rule_block(const mi_head_pattern *p,
                                                  const mi_fallback_env *env, const void *arg) {
    (void)env, (void)arg;
    return mi_cuda_max64(2 * mi_kept_keys(p), MI_CUDA_DENSE_BELOW_PORTABLE_BS_FLOOR);
}
static inline int64_t mi_cuda_portable_rule_vs(const mi_head_pattern *p, const mi_fallback_env *env,
                                               const void *arg) {
    (void)p, (void)arg;
    return env->pairs < 8 ? MI_CUDA_DENSE_BELOW_PORTABLE_VS_FEWEST
                          : MI_CUDA_DENSE_BELOW_PORTABLE_VS;
}

/* Per pattern type, in the order of mi_pattern_type (this header is also C++, which has no array
 * designators): [0] the sm_90a kernels' rule, [1] the sm_80 kernels'. */
static const mi_dense_below_rule mi_cuda_dense_below_rules[MI_PATTERN_TYPES][2] = {
    /* MI_PATTERN_DENSE */ {0, 0},
    /* MI_PATTERN_A_SHAPE */ {mi_cuda_rule_a_shape, mi_cuda_portable_rule_a_shape},
    /* MI_PATTERN_TRI_SHAPE */ {mi_cuda_rule_tri_shape, mi_cuda_portable_rule_tri_shape},
    /* MI_PATTERN_VERTICAL_SLASH */ {mi_cuda_rule_vs, mi_cuda_portable_rule_vs},
    /* MI_PATTERN_BLOCK_SPARSE */ {mi_cuda_rule_block, mi_cuda_portable_rule_block},
};

/* The CUDA rule for mi_prefill_plan_build; arg points to an int, nonzero where the sm_90a
 * kernels run. */
static inline int64_t mi_cuda_dense_below_rule(const mi_head_pattern *p, const mi_fallback_env *env,
                                               const void *arg) {
    const int sm90 = *(const int *)arg;
    const mi_dense_below_rule r = mi_cuda_dense_below_rules[p->type][sm90 ? 0 : 1];
    return r ? r(p, env, arg) : 0;
}

/* The length from which pattern p runs sparse by default (0: whatever the length; a dense
 * head: 0, it never estimates); clamped to INT32_MAX. sm90: the sm_90a kernels run it; c: the
 * launch's (b, h) pairs per estimate. */
static inline int32_t mi_cuda_default_dense_below(const mi_head_pattern *p, int64_t head_dim,
                                                  int sm90, mi_cuda_pattern_counts c) {
    const mi_pattern_traits *t = mi_pattern_traits_of(p->type);
    if (!t || t->kernel == MI_PLAN_KERNEL_DENSE) return 0;
    mi_fallback_env env = {head_dim, 0, 0, 0};
    if (t->estimate == MI_PLAN_ESTIMATE_VS) env.pairs = c.vs;
    if (t->estimate == MI_PLAN_ESTIMATE_BLOCK) env.pairs = c.bs;
    const int64_t from = mi_cuda_dense_below_rule(p, &env, &sm90);
    return from <= 0 ? 0 : mi_length_clamp(from);
}

/* The length from which head p runs sparse under params' dense_below (>= 0: that, for every
 * head; < 0: the default above). */
static inline int32_t mi_cuda_dense_below_of(const mi_head_pattern *p, int32_t dense_below,
                                             int64_t head_dim, int sm90, mi_cuda_pattern_counts c) {
    const mi_pattern_traits *t = mi_pattern_traits_of(p->type);
    if (!t || t->kernel == MI_PLAN_KERNEL_DENSE) return 0;
    return dense_below >= 0 ? dense_below : mi_cuda_default_dense_below(p, head_dim, sm90, c);
}

/* The length from which the estimate of pattern type (vertical-slash or block-sparse) runs a
 * sequence: the least crossover of its heads (block-sparse heads of different budgets have
 * different ones; a head that runs dense leaves its index unread); INT32_MAX without such heads. */
static inline int32_t mi_cuda_estimate_dense_below(const mi_head_pattern *patterns, int64_t heads,
                                                   mi_pattern_type type, int32_t dense_below,
                                                   int64_t head_dim, int sm90,
                                                   mi_cuda_pattern_counts c) {
    int32_t least = INT32_MAX;
    for (int64_t h = 0; h < heads; ++h) {
        if (patterns[h].type != type) continue;
        const int32_t from = mi_cuda_dense_below_of(&patterns[h], dense_below, head_dim, sm90, c);
        if (from < least) least = from;
    }
    return least;
}

#endif /* MI_CUDA_DENSE_FALLBACK_H */
