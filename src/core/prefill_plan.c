/*
 * prefill_plan.c: the per-head plan of a prefill call, decided once here for every backend:
 * which kernel and estimate each head runs (its pattern's table entry), its window or budgets,
 * and the length below which it runs dense instead (the caller's dense_below, or the backend's
 * measured rule). The backends lay out their index memory and launch from the plan; none of them
 * looks at a pattern's type.
 */
#include "pattern_table.h"

#include <string.h>

void mi_prefill_plan_build(const mi_attn_shape *s, const int32_t *seq_lens,
                           const mi_head_pattern *patterns, const mi_prefill_params *params,
                           mi_dense_below_rule rule, const void *rule_arg, mi_head_plan *heads,
                           mi_prefill_plan *plan) {
    const int64_t H = s->heads_q, B = s->batch, L = s->len;
    memset(plan, 0, sizeof *plan);
    plan->batch = B;
    plan->heads = H;
    plan->len = L;
    plan->head = heads;
    for (int e = 0; e < MI_PLAN_ESTIMATES; e++) plan->estimate_from[e] = INT32_MAX;
    for (int64_t h = 0; h < H; h++) {
        const mi_pattern_traits *t = mi_pattern_traits_of(patterns[h].type);
        mi_head_plan *hp = &heads[h];
        memset(hp, 0, sizeof *hp);
        hp->type = patterns[h].type;
        hp->kernel = t->kernel;
        hp->estimate = t->estimate;
        if (t->plan) t->plan(&patterns[h], params, L, hp);
        plan->pairs[hp->estimate] += B;
        if (hp->estimate == MI_PLAN_ESTIMATE_VS) {
            if (hp->vertical > plan->max_vertical) plan->max_vertical = hp->vertical;
            if (hp->slash > plan->max_slash) plan->max_slash = hp->slash;
        }
    }
    /* Crossovers second: a rule may weigh how many (b, h) pairs share the head's estimate. */
    for (int64_t h = 0; h < H; h++) {
        mi_head_plan *hp = &heads[h];
        if (hp->kernel == MI_PLAN_KERNEL_DENSE) continue;
        if (params->dense_below >= 0) {
            hp->dense_below = params->dense_below;
        } else if (rule) {
            const mi_fallback_env env = {s->head_dim, hp->estimate ? plan->pairs[hp->estimate] : 0,
                                         L, L - s->q_off};
            const int64_t from = rule(&patterns[h], &env, rule_arg);
            hp->dense_below = from <= 0 ? 0 : from > INT32_MAX ? INT32_MAX : (int32_t)from;
        }
        if (hp->estimate && hp->dense_below < plan->estimate_from[hp->estimate])
            plan->estimate_from[hp->estimate] = hp->dense_below;
        for (int64_t b = 0; b < B && !plan->any_sparse_run; b++)
            if (!mi_head_plan_dense_at(hp, seq_lens ? seq_lens[b] : L)) plan->any_sparse_run = true;
    }
}
