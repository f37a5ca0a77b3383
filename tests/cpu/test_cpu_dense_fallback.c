/*
 * test_cpu_dense_fallback.c: the CPU prefill's per-head dense fallback (src/cpu/
 * dense_fallback_cpu.h) against the measurement it was drawn from (tests/data/crossover/2026-12-02-
 * cpu-crossover-patterns.json; the check is tests/crossover_series.h's: sparse at least as fast as
 * dense from each crossover on, less than 1.2x faster at the last length below it), then the
 * rule's plain properties. The library applying it per (b, h) is checked in test_cpu_prefill.
 *   test_cpu_dense_fallback DATA_DIR
 */
#include "../crossover_series.h"
#include "dense_fallback_cpu.h"

#include <stdio.h>

static void test_measured(const char *dir) {
    json_t *j = crossover_load(dir, "2026-12-02-cpu-crossover-patterns.json");
    CHECK(j != NULL);
    if (!j) return;
    crossover_series all[CROSSOVER_MAX_SERIES];
    const int n =
        crossover_series_of_rows(j, json_integer_value(json_object_get(j, "head_dim")), all);
    CHECK(n == 6); /* six patterns on 4 heads */
    for (int k = 0; k < n; k++) {
        const int32_t from = mi_cpu_dense_below_of(&all[k].pat, -1);
        CHECK(crossover_check_series(&all[k], from, mi_pattern_name(all[k].pat.type)) == 0);
    }
    json_decref(j);
}

static void test_properties(void) {
    const mi_head_pattern dense = mi_head_pattern_default(MI_PATTERN_DENSE);
    CHECK(mi_cpu_dense_below_of(&dense, -1) == 0); /* a dense head never estimates */
    CHECK(mi_cpu_dense_below_of(&dense, 5000) == 0);
    const mi_pattern_type types[] = {MI_PATTERN_A_SHAPE, MI_PATTERN_TRI_SHAPE,
                                     MI_PATTERN_VERTICAL_SLASH, MI_PATTERN_BLOCK_SPARSE};
    for (int t = 0; t < 4; t++) {
        const mi_head_pattern p = mi_head_pattern_default(types[t]);
        CHECK(mi_cpu_dense_below_of(&p, 0) == 0); /* the caller's value, for every sparse head */
        CHECK(mi_cpu_dense_below_of(&p, 777) == 777);
        CHECK(mi_cpu_dense_below_of(&p, -1) >= MI_CPU_DENSE_BELOW_FLOOR);
    }
    /* A-/Tri-shape: twice the keys a row keeps */
    mi_head_pattern a = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
    a.n_init = 128, a.n_local = 3968;
    CHECK(mi_cpu_dense_below_of(&a, -1) == 8192);
    a.n_init = 64, a.n_local = 3000;
    CHECK(mi_cpu_dense_below_of(&a, -1) == 2 * 3064);
    a.n_init = 4, a.n_local = 60; /* the floor */
    CHECK(mi_cpu_dense_below_of(&a, -1) == MI_CPU_DENSE_BELOW_FLOOR);
    a.n_init = -5, a.n_local = -7; /* (rejected by validation; the rule still stays sane) */
    CHECK(mi_cpu_dense_below_of(&a, -1) == MI_CPU_DENSE_BELOW_FLOOR);
    a.n_init = 0x7fffffff, a.n_local = 0x7fffffff; /* clamped, not wrapped */
    CHECK(mi_cpu_dense_below_of(&a, -1) == 0x7fffffff);
    /* block-sparse: one and a half times its blocks' keys */
    mi_head_pattern bs = mi_head_pattern_default(MI_PATTERN_BLOCK_SPARSE);
    bs.top_k = 100;
    CHECK(mi_cpu_dense_below_of(&bs, -1) == 9600);
    bs.top_k = 0x7fffffff;
    CHECK(mi_cpu_dense_below_of(&bs, -1) == 0x7fffffff);
    /* vertical-slash: its measured constant, whatever the budgets */
    mi_head_pattern vs = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    vs.vertical_size = 10, vs.slash_size = 20;
    CHECK(mi_cpu_dense_below_of(&vs, -1) == MI_CPU_DENSE_BELOW_VS);
}

/* Queries at an offset: a vertical-slash head's estimate costs about 128 dense rows, so a short
 * turn runs dense and a long turn over a long cache sparse; the plan (src/core/prefill_plan.c)
 * hands the rule the call's rows. A full prefill keeps the constant. */
static void test_offset(void) {
    const mi_head_pattern vs = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH); /* 1000 + 6096 */
    const int64_t kept = 1000 + 6096;
    mi_fallback_env env = {128, 1, 8192 + 256, 256};
    const int64_t at256 = mi_cpu_dense_below_rule(&vs, &env, NULL);
    CHECK(at256 == 256 * kept / (256 - 128) + 1); /* 14193: dense over an 8K session */
    env.len = 131072, env.q_len = 1024;
    CHECK(1024 * kept / (1024 - 128) + 1 < MI_CPU_DENSE_BELOW_VS); /* 8110: the constant rules */
    CHECK(mi_cpu_dense_below_rule(&vs, &env, NULL) == MI_CPU_DENSE_BELOW_VS);
    env.q_len = 512;
    CHECK(mi_cpu_dense_below_rule(&vs, &env, NULL) == 512 * kept / (512 - 128) + 1); /* 9462 */
    env.q_len = 128; /* no turn this short pays its estimate */
    CHECK(mi_cpu_dense_below_rule(&vs, &env, NULL) == INT64_MAX);
    env.q_len = 100000; /* a long chunk: the full prefill's constant is the larger */
    CHECK(mi_cpu_dense_below_rule(&vs, &env, NULL) == MI_CPU_DENSE_BELOW_VS);
    env.q_len = env.len; /* not at an offset */
    CHECK(mi_cpu_dense_below_rule(&vs, &env, NULL) == MI_CPU_DENSE_BELOW_VS);

    /* through the plan: 256 rows over 8448 keys dense, 1024 over 32768 sparse, and the A-shape
     * head beside them untouched */
    mi_head_pattern pats[2] = {vs, mi_head_pattern_default(MI_PATTERN_A_SHAPE)};
    pats[1].n_init = 64, pats[1].n_local = 1024;
    mi_prefill_params pp = mi_prefill_default_params();
    mi_head_plan heads[2];
    mi_prefill_plan plan;
    mi_attn_shape sh = {0};
    sh.batch = 1, sh.heads_q = 2, sh.heads_kv = 1, sh.group = 2, sh.head_dim = 64;
    sh.len = 8448, sh.q_off = 8448 - 256;
    mi_prefill_plan_build(&sh, NULL, pats, &pp, mi_cpu_dense_below_rule, NULL, heads, &plan);
    CHECK(mi_head_plan_dense_at(&heads[0], sh.len));
    CHECK(!mi_head_plan_dense_at(&heads[1], sh.len));
    sh.len = 32768, sh.q_off = 32768 - 1024;
    mi_prefill_plan_build(&sh, NULL, pats, &pp, mi_cpu_dense_below_rule, NULL, heads, &plan);
    CHECK(!mi_head_plan_dense_at(&heads[0], sh.len));
    sh.q_off = 0; /* the same length as a full prefill: sparse, as before */
    sh.len = 8448;
    mi_prefill_plan_build(&sh, NULL, pats, &pp, mi_cpu_dense_below_rule, NULL, heads, &plan);
    CHECK(!mi_head_plan_dense_at(&heads[0], sh.len));
}

int main(int argc, char **argv) {
    test_offset();
    return crossover_test_main(argc, argv, "test_cpu_dense_fallback", test_measured,
                               test_properties);
}
