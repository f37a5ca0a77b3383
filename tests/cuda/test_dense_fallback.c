/*
 * test_dense_fallback.c: the CUDA prefill's per-head dense fallback (src/cuda/dense_fallback.h)
 * against the H200 measurements it was drawn from (tests/data/crossover/2026-12-02-gpu-crossover-
 * patterns.json and -heads.json at D = 128, -patterns-d64.json at D = 64, -tri-split-8k.json for
 * Tri-shape with its last rows split from 8K on; -patterns-sm80.json and -sm80-d64.json for the
 * sm_80 kernels): at every measured
 * length from a head's crossover on, sparse was at least as fast as dense; at the last measured
 * length below it, sparse was no more than 20 % faster (the rule leaves little on the table).
 * Then the rule's plain properties: the caller's dense_below for every head, dense heads never
 * estimated, the sm_80 kernels' rule, budgets that would overflow. Host code: CI runs it.
 *   test_dense_fallback DATA_DIR
 */
#include "../crossover_series.h"
#include "dense_fallback.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The rule's crossover for a measured series against the series (crossover_series.h); sm90:
 * the series ran the sm_90a kernels, else the sm_80 ones. */
static void check_series(const crossover_series *s, const char *what, int sm90) {
    const mi_cuda_pattern_counts c = mi_cuda_count_patterns(&s->pat, 1, s->heads);
    const int32_t from = mi_cuda_dense_below_of(&s->pat, -1, s->head_dim, sm90, c);
    CHECK(crossover_check_series(s, from, what) == 0);
}

/* The sm_80 kernels' rule against their measurements at D = 128 and 64: six patterns on two
 * head counts each. */
static void test_measured_portable(const char *dir) {
    const char *files[2] = {"2026-12-02-gpu-crossover-patterns-sm80.json",
                            "2026-12-02-gpu-crossover-patterns-sm80-d64.json"};
    const int64_t dims[2] = {128, 64};
    for (int f = 0; f < 2; f++) {
        json_t *j = crossover_load(dir, files[f]);
        CHECK(j != NULL);
        if (!j) continue;
        /* what ran: the sm_80 kernels, at the file's head dimension */
        const json_t *env = json_object_get(j, "env");
        const char *disabled = json_string_value(json_object_get(env, "MI_CUDA_DISABLE_SM90"));
        CHECK(disabled && !strcmp(disabled, "1"));
        CHECK(json_integer_value(json_object_get(j, "head_dim")) == dims[f]);
        crossover_series all[CROSSOVER_MAX_SERIES];
        const int n_series = crossover_series_of_rows(j, dims[f], all);
        CHECK(n_series == 12);
        for (int k = 0; k < n_series; k++)
            check_series(&all[k], mi_pattern_name(all[k].pat.type), 0);
        json_decref(j);
    }
}

static void test_measured(const char *dir) {
    test_measured_portable(dir);
    json_t *pj = crossover_load(dir, "2026-12-02-gpu-crossover-patterns.json");
    json_t *hj = crossover_load(dir, "2026-12-02-gpu-crossover-heads.json");
    json_t *dj = crossover_load(dir, "2026-12-02-gpu-crossover-patterns-d64.json");
    json_t *tj = crossover_load(dir, "2026-12-02-gpu-tri-split-8k.json");
    CHECK(pj && hj && dj && tj);
    if (!pj || !hj || !dj || !tj) goto done;
    crossover_series all[CROSSOVER_MAX_SERIES];
    /* D = 128, static and block-sparse patterns */
    int n_series = crossover_series_of_rows(pj, 128, all);
    CHECK(n_series == 10); /* five patterns at 4 and 32 heads */
    for (int k = 0; k < n_series; k++) check_series(&all[k], mi_pattern_name(all[k].pat.type), 1);
    /* D = 64, every pattern; Tri-shape below, since these rows had its last rows split over
     * chunks of keys only from 16K on */
    CHECK(json_integer_value(json_object_get(dj, "head_dim")) == 64);
    n_series = crossover_series_of_rows(dj, 64, all);
    CHECK(n_series == 18); /* six patterns at 9, 4 and 32 heads */
    for (int k = 0; k < n_series; k++)
        if (all[k].pat.type != MI_PATTERN_TRI_SHAPE)
            check_series(&all[k], mi_pattern_name(all[k].pat.type), 1);
    size_t i;
    const json_t *r;
    /* Tri-shape (and A-shape beside it) with the split from 8K on, at D = 64 and 128 */
    int n_tri = 0;
    json_array_foreach(json_object_get(tj, "runs"), i, r) {
        /* the default on Hopper (tri_split_plan.cuh's TRI_SPLIT_FROM_SM90) */
        if (json_integer_value(json_object_get(r, "tri_split")) != 8192) continue;
        n_series =
            crossover_series_of_rows(r, json_integer_value(json_object_get(r, "head_dim")), all);
        CHECK(n_series == 6); /* two patterns at 9, 32 and 4 heads */
        for (int k = 0; k < n_series; k++) {
            check_series(&all[k], mi_pattern_name(all[k].pat.type), 1);
            n_tri += all[k].pat.type == MI_PATTERN_TRI_SHAPE;
        }
    }
    CHECK(n_tri == 6); /* at D = 64 and 128 */
    /* vertical-slash 1000 / 6096: runs {heads, rows: [{L, speedup}]} */
    const json_t *runs = json_object_get(hj, "runs");
    int n_runs = 0;
    json_array_foreach(runs, i, r) {
        crossover_series s;
        memset(&s, 0, sizeof s);
        s.pat = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
        s.heads = json_integer_value(json_object_get(r, "heads"));
        s.head_dim = 128;
        size_t j;
        const json_t *row;
        json_array_foreach(json_object_get(r, "rows"), j, row) {
            if (s.n == CROSSOVER_MAX_LENGTHS) break;
            s.len[s.n] = json_integer_value(json_object_get(row, "L"));
            s.speedup[s.n++] = json_number_value(json_object_get(row, "speedup"));
        }
        check_series(&s, "vertical_and_slash", 1);
        n_runs++;
    }
    CHECK(n_runs == 4); /* 4, 8, 16 and 32 heads */
done:
    json_decref(pj);
    json_decref(hj);
    json_decref(dj);
    json_decref(tj);
}

static void test_properties(void) {
    const mi_cuda_pattern_counts few = {4, 4}, many = {64, 64};
    const mi_pattern_type types[] = {MI_PATTERN_A_SHAPE, MI_PATTERN_TRI_SHAPE,
                                     MI_PATTERN_VERTICAL_SLASH, MI_PATTERN_BLOCK_SPARSE};
    const mi_head_pattern dense = mi_head_pattern_default(MI_PATTERN_DENSE);
    /* a dense head never estimates, whatever the caller asks */
    CHECK(mi_cuda_dense_below_of(&dense, -1, 128, 1, few) == 0);
    CHECK(mi_cuda_dense_below_of(&dense, 5000, 128, 1, few) == 0);
    for (int t = 0; t < 4; t++) {
        const mi_head_pattern p = mi_head_pattern_default(types[t]);
        /* the caller's value, for every sparse head; 0: sparse at any length */
        CHECK(mi_cuda_dense_below_of(&p, 0, 128, 1, few) == 0);
        CHECK(mi_cuda_dense_below_of(&p, 777, 64, 0, many) == 777);
        /* the sm_80 kernels: one rule for either D, never a later crossover for more heads */
        CHECK(mi_cuda_dense_below_of(&p, -1, 128, 0, few) ==
              mi_cuda_dense_below_of(&p, -1, 64, 0, few));
        CHECK(mi_cuda_dense_below_of(&p, -1, 128, 0, few) >=
              mi_cuda_dense_below_of(&p, -1, 128, 0, many));
        /* fewer heads to share the estimates' fixed costs: never an earlier crossover */
        for (int d = 64; d <= 128; d += 64)
            CHECK(mi_cuda_dense_below_of(&p, -1, d, 1, few) >=
                  mi_cuda_dense_below_of(&p, -1, d, 1, many));
        /* D = 64 tiles cost less than D = 128 ones: never a later crossover, but for the
         * vertical-slash estimate on fewest heads */
        CHECK(mi_cuda_dense_below_of(&p, -1, 64, 1, many) <=
              mi_cuda_dense_below_of(&p, -1, 128, 1, many));
    }
    /* D = 64 (tests/data/crossover/2026-12-02-gpu-crossover-patterns-d64.json) */
    mi_head_pattern a64 = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
    a64.n_init = 128, a64.n_local = 3968;
    CHECK(mi_cuda_dense_below_of(&a64, -1, 64, 1, few) == 8192); /* twice the keys */
    a64.n_init = 64, a64.n_local = 960;
    CHECK(mi_cuda_dense_below_of(&a64, -1, 64, 1, few) == MI_CUDA_DENSE_BELOW_D64_A_SHAPE_FLOOR);
    mi_head_pattern t64 = mi_head_pattern_default(MI_PATTERN_TRI_SHAPE);
    t64.n_init = 128, t64.n_local = 3968;
    CHECK(mi_cuda_dense_below_of(&t64, -1, 64, 1, many) == 12288); /* three times */
    mi_head_pattern b64 = mi_head_pattern_default(MI_PATTERN_BLOCK_SPARSE);
    b64.top_k = 100;
    const mi_cuda_pattern_counts bs7 = {0, 7}, bs8 = {0, 8};
    CHECK(mi_cuda_dense_below_of(&b64, -1, 64, 1, bs7) == 3 * 6400);
    CHECK(mi_cuda_dense_below_of(&b64, -1, 64, 1, bs8) == 6400 * 5 / 2);
    b64.top_k = 1;
    CHECK(mi_cuda_dense_below_of(&b64, -1, 64, 1, bs8) == MI_CUDA_DENSE_BELOW_D64_BS_FLOOR_FEW);
    CHECK(mi_cuda_dense_below_of(&b64, -1, 64, 1, many) == MI_CUDA_DENSE_BELOW_BS_FLOOR);
    const mi_head_pattern v64 = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    const mi_cuda_pattern_counts vs7 = {7, 0}, vs8 = {8, 0};
    CHECK(mi_cuda_dense_below_of(&v64, -1, 64, 1, vs7) == MI_CUDA_DENSE_BELOW_D64_VS_FEWEST);
    CHECK(mi_cuda_dense_below_of(&v64, -1, 64, 1, vs8) == MI_CUDA_DENSE_BELOW_VS_FEW);
    /* A-/Tri-shape: three times the keys a row keeps; a longer window, a later crossover */
    mi_head_pattern a = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
    a.n_init = 128, a.n_local = 3968;
    CHECK(mi_cuda_dense_below_of(&a, -1, 128, 1, few) == 12288);
    a.n_local = 8000;
    CHECK(mi_cuda_dense_below_of(&a, -1, 128, 1, few) == 3 * (128 + 8000));
    a.n_init = -5, a.n_local = -7; /* (rejected by validation; the rule still stays sane) */
    CHECK(mi_cuda_dense_below_of(&a, -1, 128, 1, few) == 0);
    a.n_init = 0x7fffffff, a.n_local = 0x7fffffff; /* clamped, not wrapped */
    CHECK(mi_cuda_dense_below_of(&a, -1, 128, 1, few) == 0x7fffffff);
    /* block-sparse: three times its blocks' keys, at least the estimate's floor */
    mi_head_pattern bs = mi_head_pattern_default(MI_PATTERN_BLOCK_SPARSE);
    bs.top_k = 1;
    CHECK(mi_cuda_dense_below_of(&bs, -1, 128, 1, few) == MI_CUDA_DENSE_BELOW_BS_FLOOR_FEW);
    CHECK(mi_cuda_dense_below_of(&bs, -1, 128, 1, many) == MI_CUDA_DENSE_BELOW_BS_FLOOR);
    bs.top_k = 0x7fffffff;
    CHECK(mi_cuda_dense_below_of(&bs, -1, 128, 1, few) == 0x7fffffff);
    /* vertical-slash: by the (b, h) pairs that share the estimate */
    const mi_head_pattern vs = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    const mi_cuda_pattern_counts c7 = {7, 0}, c8 = {8, 0}, c16 = {16, 0};
    CHECK(mi_cuda_dense_below_of(&vs, -1, 128, 1, c7) == MI_CUDA_DENSE_BELOW_VS_FEWEST);
    CHECK(mi_cuda_dense_below_of(&vs, -1, 128, 1, c8) == MI_CUDA_DENSE_BELOW_VS_FEW);
    CHECK(mi_cuda_dense_below_of(&vs, -1, 128, 1, c16) == MI_CUDA_DENSE_BELOW_VS);
    /* the counts: (b, h) pairs per dynamic pattern */
    mi_head_pattern layer[5] = {vs, vs, bs, a, dense};
    const mi_cuda_pattern_counts c = mi_cuda_count_patterns(layer, 5, 3);
    CHECK(c.vs == 6 && c.bs == 3);
    /* an estimate runs a sequence where any of its heads runs sparse: the least crossover */
    mi_head_pattern bs4 = mi_head_pattern_default(MI_PATTERN_BLOCK_SPARSE);
    mi_head_pattern bs100 = bs4;
    bs4.top_k = 4, bs100.top_k = 100;
    const mi_head_pattern mix[4] = {bs4, vs, bs100, a}; /* the last is not the least */
    CHECK(mi_cuda_estimate_dense_below(mix, 4, MI_PATTERN_BLOCK_SPARSE, -1, 128, 1, few) ==
          MI_CUDA_DENSE_BELOW_BS_FLOOR_FEW); /* top 4's 12288, not top 100's 19200 */
    CHECK(mi_cuda_estimate_dense_below(mix, 4, MI_PATTERN_VERTICAL_SLASH, -1, 128, 1, few) ==
          MI_CUDA_DENSE_BELOW_VS_FEWEST);
    CHECK(mi_cuda_estimate_dense_below(mix, 4, MI_PATTERN_BLOCK_SPARSE, 500, 128, 1, few) == 500);
    CHECK(mi_cuda_estimate_dense_below(mix, 4, MI_PATTERN_TRI_SHAPE, -1, 128, 1, few) ==
          0x7fffffff); /* no such head */
    /* the sm_80 kernels (tests/data/crossover/2026-12-02-gpu-crossover-patterns-sm80*.json) */
    CHECK(mi_cuda_dense_below_of(&a, -1, 128, 0, few) == 0x7fffffff); /* clamped */
    a.n_init = 128, a.n_local = 3968;
    CHECK(mi_cuda_dense_below_of(&a, -1, 128, 0, few) == 8192); /* twice the keys */
    a.n_init = 0, a.n_local = 512;
    CHECK(mi_cuda_dense_below_of(&a, -1, 64, 0, few) == MI_CUDA_DENSE_BELOW_PORTABLE_FLOOR);
    mi_head_pattern t = mi_head_pattern_default(MI_PATTERN_TRI_SHAPE);
    t.n_init = 128, t.n_local = 3968;
    CHECK(mi_cuda_dense_below_of(&t, -1, 128, 0, many) == 12288); /* three times */
    bs.top_k = 100;
    CHECK(mi_cuda_dense_below_of(&bs, -1, 128, 0, few) == 12800); /* twice */
    bs.top_k = 4;
    CHECK(mi_cuda_dense_below_of(&bs, -1, 64, 0, many) == MI_CUDA_DENSE_BELOW_PORTABLE_BS_FLOOR);
    CHECK(mi_cuda_dense_below_of(&vs, -1, 128, 0, c7) == MI_CUDA_DENSE_BELOW_PORTABLE_VS_FEWEST);
    CHECK(mi_cuda_dense_below_of(&vs, -1, 128, 0, c8) == MI_CUDA_DENSE_BELOW_PORTABLE_VS);
}

int main(int argc, char **argv) {
    return crossover_test_main(argc, argv, "test_dense_fallback", test_measured, test_properties);
}
