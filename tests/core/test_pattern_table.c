/*
 * test_pattern_table.c: the pattern table (src/core/pattern_entries.h) through the public API and
 * the core plan: every name and alias round-trips, every pattern has its defaults, every pattern
 * survives a config JSON round trip and a "NAME:V1:V2" parse, and the plan follows the table.
 */
#include "../check.h"
#include "minference.h"
#include "pattern_table.h"

#include <stdlib.h>
#include <string.h>

static int32_t field_value(const mi_head_pattern *p, const char *field) {
    if (!strcmp(field, "vertical_size")) return p->vertical_size;
    if (!strcmp(field, "slash_size")) return p->slash_size;
    if (!strcmp(field, "n_init")) return p->n_init;
    if (!strcmp(field, "n_local")) return p->n_local;
    if (!strcmp(field, "n_last")) return p->n_last;
    if (!strcmp(field, "top_k")) return p->top_k;
    if (!strcmp(field, "stride")) return p->stride;
    if (!strcmp(field, "threshold")) return p->threshold;
    if (!strcmp(field, "tau")) return p->tau;
    if (!strcmp(field, "dense_local")) return p->dense_local;
    if (!strcmp(field, "block_size")) return p->block_size;
    if (!strcmp(field, "repr_topk")) return p->repr_topk;
    if (!strcmp(field, "chunk_size")) return p->chunk_size;
    if (!strcmp(field, "per_head")) return p->per_head;
    return -1;
}

static void set_field(mi_head_pattern *p, const char *field, int32_t v) {
    if (!strcmp(field, "vertical_size")) p->vertical_size = v;
    if (!strcmp(field, "slash_size")) p->slash_size = v;
    if (!strcmp(field, "n_init")) p->n_init = v;
    if (!strcmp(field, "n_local")) p->n_local = v;
    if (!strcmp(field, "n_last")) p->n_last = v;
    if (!strcmp(field, "top_k")) p->top_k = v;
    if (!strcmp(field, "stride")) p->stride = v;
    if (!strcmp(field, "threshold")) p->threshold = v;
    if (!strcmp(field, "tau")) p->tau = v;
    if (!strcmp(field, "dense_local")) p->dense_local = v;
    if (!strcmp(field, "block_size")) p->block_size = v;
    if (!strcmp(field, "repr_topk")) p->repr_topk = v;
    if (!strcmp(field, "chunk_size")) p->chunk_size = v;
    if (!strcmp(field, "per_head")) p->per_head = v;
}

static void test_names(void) {
    const int32_t n = mi_pattern_count();
    CHECK(n == MI_PATTERN_TYPES);
    CHECK(n >= 5);
    for (int32_t t = 0; t < n; t++) {
        const mi_pattern_type type = (mi_pattern_type)t;
        mi_pattern_type back = (mi_pattern_type)-1;
        const char *name = mi_pattern_name(type);
        CHECK(name != NULL);
        if (!name) continue;
        CHECK_STATUS(mi_pattern_from_name(name, &back), MI_STATUS_SUCCESS);
        CHECK(back == type);
        for (int32_t a = 0; mi_pattern_alias(type, a); a++) {
            back = (mi_pattern_type)-1;
            CHECK_STATUS(mi_pattern_from_name(mi_pattern_alias(type, a), &back), MI_STATUS_SUCCESS);
            CHECK(back == type);
            CHECK(strcmp(mi_pattern_alias(type, a), name) != 0);
        }
        /* no name or alias is another pattern's */
        for (int32_t u = 0; u < t; u++) {
            CHECK(strcmp(mi_pattern_name((mi_pattern_type)u), name) != 0);
            for (int32_t a = 0; mi_pattern_alias(type, a); a++) {
                CHECK(strcmp(mi_pattern_name((mi_pattern_type)u), mi_pattern_alias(type, a)));
                for (int32_t b = 0; mi_pattern_alias((mi_pattern_type)u, b); b++)
                    CHECK(
                        strcmp(mi_pattern_alias((mi_pattern_type)u, b), mi_pattern_alias(type, a)));
            }
        }
        const mi_pattern_traits *tr = mi_pattern_traits_of(type);
        CHECK(tr && tr->type == type);
    }
    /* the names the original's configs and this library's tools use */
    static const struct {
        const char *name;
        mi_pattern_type type;
    } known[] = {
        {"dense", MI_PATTERN_DENSE},
        {"stream_llm", MI_PATTERN_A_SHAPE},
        {"a_shape", MI_PATTERN_A_SHAPE},
        {"A-shape", MI_PATTERN_A_SHAPE},
        {"tri_shape", MI_PATTERN_TRI_SHAPE},
        {"vertical_and_slash", MI_PATTERN_VERTICAL_SLASH},
        {"vertical_slash", MI_PATTERN_VERTICAL_SLASH},
        {"vs", MI_PATTERN_VERTICAL_SLASH},
        {"block_sparse", MI_PATTERN_BLOCK_SPARSE},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        mi_pattern_type t = (mi_pattern_type)-1;
        CHECK_STATUS(mi_pattern_from_name(known[i].name, &t), MI_STATUS_SUCCESS);
        CHECK(t == known[i].type);
    }
    CHECK(!strcmp(mi_pattern_alias(MI_PATTERN_A_SHAPE, 0), "a_shape"));
    CHECK(!strcmp(mi_pattern_alias(MI_PATTERN_VERTICAL_SLASH, 0), "vertical_slash"));
    mi_pattern_type t;
    CHECK(mi_pattern_name((mi_pattern_type)n) == NULL);
    CHECK(mi_pattern_name((mi_pattern_type)-1) == NULL);
    CHECK(mi_pattern_alias((mi_pattern_type)n, 0) == NULL);
    CHECK(mi_pattern_field((mi_pattern_type)n, 0) == NULL);
    CHECK_STATUS(mi_pattern_from_name("nope", &t), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_pattern_from_name("", &t), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_pattern_from_name(NULL, &t), MI_STATUS_INVALID_ARGUMENT);
}

static void test_defaults(void) {
    for (int32_t t = 0; t < mi_pattern_count(); t++) {
        const mi_pattern_type type = (mi_pattern_type)t;
        const mi_head_pattern p = mi_head_pattern_default(type);
        const mi_pattern_traits *tr = mi_pattern_traits_of(type);
        CHECK(p.type == type);
        /* every field the pattern reads has a known, non-negative default (0 only where it
         * switches a part off: dilated's dense_local, InfLLM's per_head), and the default is
         * valid; a pattern with a budget or an estimate reads at least one */
        int n_fields = 0;
        for (int32_t f = 0; mi_pattern_field(type, f); f++, n_fields++) {
            const char *name = mi_pattern_field(type, f);
            CHECK(field_value(&p, name) > 0 ||
                      (field_value(&p, name) == 0 &&
                       (!strcmp(name, "dense_local") || !strcmp(name, "per_head"))),
                  "%s.%s", mi_pattern_name(type), name);
        }
        CHECK(mi_pattern_valid(&p), "%s", mi_pattern_name(type));
        CHECK(n_fields > 0 || (tr->kernel == MI_PLAN_KERNEL_DENSE && !tr->scale));
        CHECK((tr->kernel == MI_PLAN_KERNEL_INDEX) == (tr->estimate != MI_PLAN_ESTIMATE_NONE));
        CHECK(tr->kernel == MI_PLAN_KERNEL_DENSE || tr->plan != NULL);
    }
    /* the original's defaults, whatever the type */
    const mi_head_pattern d = mi_head_pattern_default(MI_PATTERN_DENSE);
    CHECK(d.vertical_size == 1000 && d.slash_size == 6096 && d.n_init == 128 && d.n_local == 3968 &&
          d.n_last == 100 && d.top_k == 100);
}

/* Gives every field of p's pattern a distinct non-default value. */
static mi_head_pattern distinct(mi_pattern_type type, int32_t base) {
    mi_head_pattern p = mi_head_pattern_default(type);
    for (int32_t f = 0; mi_pattern_field(type, f); f++)
        set_field(&p, mi_pattern_field(type, f), base + 7 * f);
    /* values the pattern refuses made valid, still not its defaults: XAttention's stride must
     * split a 64-row block, thresholds are per mille */
    /* InfLLM: a switch, and no more representatives than keys in a block */
    if (!mi_pattern_valid(&p) && p.per_head > 1) p.per_head = 1;
    if (!mi_pattern_valid(&p) && p.repr_topk > p.block_size) p.repr_topk = 1 + base % 3;
    if (!mi_pattern_valid(&p) && p.stride > 0) p.stride = base % 2 ? 4 : 16;
    if (!mi_pattern_valid(&p) && p.threshold > 1000) p.threshold = 1 + base % 997;
    CHECK(mi_pattern_valid(&p), "%s from %d", mi_pattern_name(type), base);
    return p;
}

static void test_config_round_trip(void) {
    const int32_t n = mi_pattern_count();
    mi_config *cfg = NULL, *back = NULL;
    char *json = NULL;
    CHECK_STATUS(mi_config_create(NULL, 1, n, NULL, &cfg), MI_STATUS_SUCCESS);
    for (int32_t t = 0; t < n; t++) {
        const mi_head_pattern p = distinct((mi_pattern_type)t, 11 + 100 * t);
        CHECK_STATUS(mi_config_set_head(NULL, cfg, 0, t, &p, 0.5), MI_STATUS_SUCCESS);
    }
    CHECK_STATUS(mi_config_to_json(NULL, cfg, &json), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_config_parse(NULL, json, json ? strlen(json) : 0, &back), MI_STATUS_SUCCESS);
    mi_head_pattern got[64];
    if (back && n <= 64) {
        CHECK_STATUS(mi_config_layer(NULL, back, 0, n, got, NULL), MI_STATUS_SUCCESS);
        for (int32_t t = 0; t < n; t++) {
            const mi_pattern_type type = (mi_pattern_type)t;
            const mi_head_pattern want = distinct(type, 11 + 100 * t);
            int32_t w1, w2, g1, g2;
            CHECK(got[t].type == type);
            CHECK_STATUS(mi_head_pattern_sizes(&want, &w1, &w2), MI_STATUS_SUCCESS);
            CHECK_STATUS(mi_head_pattern_sizes(&got[t], &g1, &g2), MI_STATUS_SUCCESS);
            CHECK(w1 == g1 && w2 == g2);
            /* the fields the file carries come back; the others take their defaults */
            mi_head_pattern expect;
            CHECK_STATUS(mi_head_pattern_from_sizes(type, w1, w2, &expect), MI_STATUS_SUCCESS);
            CHECK(memcmp(&expect, &got[t], sizeof expect) == 0);
        }
    }
    /* a second write gives the same text */
    char *json2 = NULL;
    if (back) CHECK_STATUS(mi_config_to_json(NULL, back, &json2), MI_STATUS_SUCCESS);
    CHECK(json && json2 && strcmp(json, json2) == 0);
    mi_free(json);
    mi_free(json2);
    mi_config_destroy(cfg);
    mi_config_destroy(back);
}

static void test_sizes(void) {
    for (int32_t t = 0; t < mi_pattern_count(); t++) {
        const mi_pattern_type type = (mi_pattern_type)t;
        mi_head_pattern p;
        int32_t a, b;
        CHECK_STATUS(mi_head_pattern_from_sizes(type, 37, 41, &p), MI_STATUS_SUCCESS);
        CHECK_STATUS(mi_head_pattern_sizes(&p, &a, &b), MI_STATUS_SUCCESS);
        CHECK(a == 37 && b == 41 && p.type == type);
        CHECK_STATUS(mi_head_pattern_from_sizes(type, -1, 41, &p), MI_STATUS_INVALID_ARGUMENT);
    }
    mi_head_pattern p;
    CHECK_STATUS(mi_head_pattern_from_sizes(MI_PATTERN_A_SHAPE, 64, 512, &p), MI_STATUS_SUCCESS);
    CHECK(p.n_init == 64 && p.n_local == 512 && p.vertical_size == 64 && p.slash_size == 512);
    /* block-sparse: a first size of 0 keeps the default budget, as the original runs it */
    CHECK_STATUS(mi_head_pattern_from_sizes(MI_PATTERN_BLOCK_SPARSE, 0, 5, &p), MI_STATUS_SUCCESS);
    CHECK(p.top_k == 100 && p.vertical_size == 100 && p.slash_size == 5);
    CHECK_STATUS(mi_head_pattern_from_sizes((mi_pattern_type)mi_pattern_count(), 1, 1, &p),
                 MI_STATUS_INVALID_ARGUMENT);
}

static void test_parse(void) {
    for (int32_t t = 0; t < mi_pattern_count(); t++) {
        const mi_pattern_type type = (mi_pattern_type)t;
        const mi_head_pattern want = distinct(type, 5 + t);
        const char *names[2] = {mi_pattern_name(type), mi_pattern_alias(type, 0)};
        for (int k = 0; k < 2 && names[k]; k++) {
            char text[256];
            int len = snprintf(text, sizeof text, "%s", names[k]);
            for (int32_t f = 0; mi_pattern_field(type, f); f++)
                len += snprintf(text + len, sizeof text - (size_t)len, ":%d",
                                (int)field_value(&want, mi_pattern_field(type, f)));
            mi_head_pattern got;
            CHECK_STATUS(mi_head_pattern_parse(text, &got), MI_STATUS_SUCCESS);
            CHECK(memcmp(&got, &want, sizeof got) == 0);
            /* one value too many */
            snprintf(text + len, sizeof text - (size_t)len, ":1");
            CHECK_STATUS(mi_head_pattern_parse(text, &got), MI_STATUS_INVALID_ARGUMENT);
        }
    }
    mi_head_pattern p;
    CHECK_STATUS(mi_head_pattern_parse("tri_shape:64:1024", &p), MI_STATUS_SUCCESS);
    CHECK(p.type == MI_PATTERN_TRI_SHAPE && p.n_init == 64 && p.n_local == 1024 && p.n_last == 100);
    CHECK_STATUS(mi_head_pattern_parse("a_shape:100:800", &p), MI_STATUS_SUCCESS);
    CHECK(p.type == MI_PATTERN_A_SHAPE && p.n_init == 100 && p.n_local == 800);
    CHECK_STATUS(mi_head_pattern_parse("vs:1000:6096", &p), MI_STATUS_SUCCESS);
    CHECK(p.vertical_size == 1000 && p.slash_size == 6096);
    CHECK_STATUS(mi_head_pattern_parse("block_sparse:8", &p), MI_STATUS_SUCCESS);
    CHECK(p.top_k == 8);
    static const char *bad[] = {"a_shape:100", "dense:1",       "vs:1:2:3", "block_sparse:-1",
                                "nope:1",      "block_sparse",  "vs:1:x",   ":1",
                                "vs:1:",       "a_shape:1:2:3", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const mi_status st = mi_head_pattern_parse(bad[i], &p);
        if (st != MI_STATUS_INVALID_ARGUMENT) fprintf(stderr, "accepted \"%s\"\n", bad[i]);
        CHECK(st == MI_STATUS_INVALID_ARGUMENT);
    }
}

static int64_t rule_fixed(const mi_head_pattern *p, const mi_fallback_env *env, const void *arg) {
    (void)p;
    return *(const int64_t *)arg + env->pairs; /* the pairs sharing the estimate show through */
}

static void test_plan(void) {
    const int32_t n = mi_pattern_count();
    mi_head_pattern pats[64];
    mi_head_plan heads[64];
    mi_prefill_plan plan;
    if (n > 64) return;
    for (int32_t t = 0; t < n; t++) pats[t] = mi_head_pattern_default((mi_pattern_type)t);
    mi_attn_shape s = {2, n, n, 20000, 64, 1, MI_DTYPE_BF16, MI_DEVICE_CPU, 0};
    mi_prefill_params pp = mi_prefill_default_params();
    const int64_t from = 10000;
    mi_prefill_plan_build(&s, NULL, pats, &pp, rule_fixed, &from, heads, &plan);
    int64_t pairs[MI_PLAN_ESTIMATES] = {0};
    for (int32_t t = 0; t < n; t++) pairs[mi_pattern_traits_of((mi_pattern_type)t)->estimate] += 2;
    for (int32_t t = 0; t < n; t++) {
        const mi_pattern_traits *tr = mi_pattern_traits_of((mi_pattern_type)t);
        CHECK(heads[t].type == tr->type && heads[t].kernel == tr->kernel &&
              heads[t].estimate == tr->estimate);
        if (tr->kernel == MI_PLAN_KERNEL_DENSE) {
            CHECK(heads[t].dense_below == 0);
            CHECK(mi_head_plan_dense_at(&heads[t], 1 << 30));
        } else {
            CHECK(heads[t].dense_below == from + (tr->estimate ? pairs[tr->estimate] : 0));
            CHECK(mi_head_plan_dense_at(&heads[t], heads[t].dense_below - 1));
            CHECK(!mi_head_plan_dense_at(&heads[t], heads[t].dense_below));
        }
    }
    CHECK(plan.any_sparse_run);
    CHECK(plan.max_vertical == 1000 && plan.max_slash == 6096);
    CHECK(plan.pairs[MI_PLAN_ESTIMATE_VS] == 2 && plan.pairs[MI_PLAN_ESTIMATE_BLOCK] == 2);
    /* an explicit dense_below wins over the rule; 0 never falls back */
    pp.dense_below = 0;
    mi_prefill_plan_build(&s, NULL, pats, &pp, rule_fixed, &from, heads, &plan);
    for (int32_t t = 0; t < n; t++) CHECK(heads[t].dense_below == 0);
    CHECK(plan.estimate_from[MI_PLAN_ESTIMATE_VS] == 0);
    pp.dense_below = 30000; /* longer than the sequences: nothing runs sparse */
    mi_prefill_plan_build(&s, NULL, pats, &pp, rule_fixed, &from, heads, &plan);
    CHECK(!plan.any_sparse_run);
    /* window plans carry the window, Tri-shape its last rows */
    CHECK(heads[MI_PATTERN_A_SHAPE].n_init == 128 && heads[MI_PATTERN_A_SHAPE].n_local == 3968 &&
          heads[MI_PATTERN_A_SHAPE].n_last == 0);
    CHECK(heads[MI_PATTERN_TRI_SHAPE].n_last == 100);
    /* budgets after the minimums, clamped to the length */
    s.len = 500;
    pp.dense_below = -1;
    mi_prefill_plan_build(&s, NULL, pats, &pp, NULL, NULL, heads, &plan);
    CHECK(heads[MI_PATTERN_VERTICAL_SLASH].vertical == 500 &&
          heads[MI_PATTERN_VERTICAL_SLASH].slash == 500);
    for (int32_t t = 0; t < n; t++) CHECK(heads[t].dense_below == 0); /* no rule: never */
}

int main(void) {
    test_names();
    test_defaults();
    test_config_round_trip();
    test_sizes();
    test_parse();
    test_plan();
    return check_finish("test_pattern_table");
}
