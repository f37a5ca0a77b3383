/*
 * dense_fallback.h: the length from which a head's sparse pattern pays on CUDA, used when
 * mi_prefill_params.dense_below < 0 (the default). A (b, h) whose sequence is shorter runs
 * dense: no estimation, no index, and (on Hopper, where every sequence has the full length) the
 * dense kernel. Plain C, so that the host test (tests/cuda/test_dense_fallback.c: the rule
 * against the measurements below) and the GPU test (tests/cuda/test_cuda.c) use the rule the
 * library uses.
 *
 * Measured on an H200 (bf16, D = 128, position-coded q/k, sparse prefill with dense_below = 0
 * against mi_attention_dense; speed-ups, dense time over sparse time; bench/results/2026-12-02-
 * gpu-crossover-patterns.json and -gpu-crossover-heads.json), 4 / 1 and 32 / 8 heads:
 *   - A-shape 128 + 3968: 0.97 / 1.14 at 8K, 1.32 / 1.57 at 12K; 64 + 960: 0.77 / 0.96 at 2K,
 *     1.12 / 1.16 at 3K; Tri-shape 128 + 3968 + 100: 0.86 / 1.09 at 8K, 1.18 / 1.29 at 12K. No
 *     estimation, so the work alone decides: sparse pays from three times the keys a row keeps
 *     (sinks and window), where it computes a sixth of the causal pairs or less.
 *   - Block-sparse top 100 (6400 keys a row): 0.82 / 0.95 at 12K, 1.02 / 1.09 at 16K, 1.37 / 1.54
 *     at 24K; top 25: 1.00 / 1.74 at 8K, 0.80 / 1.37 at 6K, 1.73 / 2.59 at 12K. Three times the
 *     kept keys, and a floor for the estimate's fixed cost that few heads do not share: 12K
 *     below 16 (b, h) pairs, 6K from there.
 *   - Vertical-slash 1000 / 6096 (estimation and index included): 0.91 at 32K and 1.04 at 40K
 *     on 4 heads, 1.00 at 32K and 1.05 at 36K on 8, 1.04 at 32K on 16 and 1.03 on 32 (0.92 at
 *     24K). Its fixed cost is the index build's latency (about 0.3 ms at 32K whatever the head
 *     count: a thread walks each row block's lists), so the crossover falls with the heads:
 *     40K below 8 (b, h) pairs, 36K below 16, 32K from there.
 * Heads of 64 dimensions (the same inputs; 9 / 3, 4 / 1 and 32 / 8 heads; speed-ups in that
 * order; bench/results/2026-12-02-gpu-crossover-patterns-d64.json):
 *   - A-shape 128 + 3968: 0.90 / 0.94 / 0.99 at 6K, 1.07 / 1.07 / 1.12 at 8K; 64 + 960: 0.87 /
 *     1.07 / 0.98 at 2K, 1.33 / 1.40 / 1.41 at 3K. Cheaper tiles than at D = 128, so twice the
 *     kept keys, and at least 3K for the launch's fixed costs.
 *   - Tri-shape 128 + 3968 + 100: 0.78 / 1.13 / 1.16 at 12K, 1.74 / 1.35 / 1.75 at 16K while its
 *     last rows were split over chunks of keys from 16K on (tri_split_plan.cuh); split from 8K
 *     (bench/results/2026-12-02-gpu-tri-split-8k.json): 0.94 / 0.87 / 1.07 at 8K, 1.32 / 1.15 /
 *     1.39 at 12K: three times the keys, as at D = 128 (whose Tri-shape rows there: 0.80 / 0.82 /
 *     1.10 at 8K, 1.27 / 1.11 / 1.42 at 12K).
 *   - Block-sparse top 100: 0.93 / 0.86 / 1.05 at 12K, 1.22 / 0.90 / 1.24 at 16K, 1.60 / 1.37 /
 *     1.68 at 24K: two and a half times its keys from 8 (b, h) pairs, three times below; top 25:
 *     1.06 / 0.85 / 1.36 at 6K, 1.42 / 1.14 / 1.84 at 8K: a floor of 8K below 16 pairs.
 *   - Vertical-slash 1000 / 6096: 0.83 / 0.67 / 1.02 at 24K, 1.03 / 0.88 / 1.12 at 32K, 1.15 /
 *     0.98 / 1.24 at 40K, 1.25 / 1.12 / 1.36 at 48K: 48K below 8 pairs, otherwise as at D = 128.
 * GPUs without the sm_90a kernels run the portable sm_80 kernels (mma.sync), measured on the H200
 * forced (tuning sm90=-1): no A100 was at hand. Both sides of each ratio run the same
 * kernels, so on a slower GPU the fixed costs (launches, the estimates' latency) weigh less and
 * the crossovers can only fall: this rule errs towards dense there. Speed-ups on 4 / 1 and
 * 32 / 8 heads at D = 128, then 9 / 3 and 32 / 8 at D = 64 (bench/results/2026-12-02-gpu-
 * crossover-patterns-sm80.json and -sm80-d64.json):
 *   - A-shape 128 + 3968: 1.19 / 1.05 / 1.15 / 1.08 at 6K, 1.25 / 1.23 / 1.48 / 1.29 at 8K; 64 +
 *     960: 1.24-1.83 at 2K, the shortest length measured. Twice the kept keys, at least 2K.
 *   - Tri-shape 128 + 3968 + 100 (last rows split from 16K on with the sm_80 chunk kernel): 1.13 /
 *     1.09 / 0.98 / 1.10 at 8K, 1.49 / 1.39 / 1.05 / 1.37 at 12K: three times the keys.
 *   - Block-sparse top 100: 1.11 / 1.07 / 1.19 / 1.20 at 12K, 1.13 / 1.28 / 1.46 / 1.44 at 16K;
 *     top 25: 0.91 / 0.98 / 0.99 / 1.01 at 3K, 1.17 / 1.23 / 1.19 / 1.28 at 4K. Twice the kept
 *     keys, at least 4K; the head count made no difference here.
 *   - Vertical-slash 1000 / 6096: 0.92 / 1.05 / 1.07 / 1.17 at 24K, 1.02 / 1.15 / 1.26 / 1.30 at
 *     32K (0.86 / 0.84 / 0.95 on 32 / 8 and 9 / 3 heads at 16K): 32K below 8 (b, h) pairs, 24K
 *     from 8 on: the attention the estimate saves costs more on these kernels than on
 *     Hopper's, so the estimate pays earlier.
 *
 * Before these rules one crossover served every pattern, measured with vertical-slash 1000 / 6096
 * on 32 / 8 heads (bench/torch_ref.py's "crossover" section): 0.66 at 16K, 0.87 at 24K, 1.16 at
 * 32K, 1.49 at 48K with the ring kernel (commit ee30eeb, bench/results/2026-11-30-gpu-
 * attention.json); 0.68 / 0.94 / 1.03 / 1.21 with the warp-specialised dense kernel (624ac90,
 * -gpu-attention-v9.json); 0.72 / 0.93 / 1.06 / 1.26 with band-like heads on the warp-specialised
 * sparse kernel (-gpu-crossover-routed.json); 0.74 / 0.90 / 1.03 / 1.21 with the dense kernel's
 * 176-key tiles (ce4c557, 2026-12-01-gpu-crossover-176-keys.json): 32K. So A-shape and
 * block-sparse heads ran dense below 32K, where they were 1.3-2.7x faster than dense from 12K
 * (A-shape) and 24K (block-sparse) on; and 4 heads of vertical-slash ran sparse at 32K, 4-9 %
 * slower than dense. D = 64 (9 / 3 heads): 0.41 at 16K, 0.63 at 32K, 0.79 at 48K, 0.96 at 64K,
 * 1.20 at 96K with the sparse heads on the mma.sync kernel (64defaf, -gpu-crossover-d64.json);
 * 0.59 / 0.99 / 1.27 / 1.57 at 16K / 32K / 48K / 64K on the wgmma ring kernel (614bf77,
 * -gpu-crossover-d64-ring.json): 48K.
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
    mi_fallback_env env = {head_dim, 0};
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
