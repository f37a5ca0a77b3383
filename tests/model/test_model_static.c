/*
 * test_model_static.c: the model runner's "static" attention (MInference w/ static) on a random
 * model, on the CPU.
 *  - budgets covering the prompt: every key, the dense model's logits (first and later prompt);
 *  - reuse: a later prompt runs the first prompt's sets. The sets a first prompt saved in a
 *    folder ("static:DIR"), loaded by another model, give that later prompt the same logits bit
 *    for bit as the model that estimated them; a model whose first prompt is the later one
 *    (its own sets) gives other logits;
 *  - names: "static" and "static:DIR" are read, "static:" is not.
 */
#include "model_test_util.h"

#include <unistd.h>

static void prefill(mi_model *m, const int32_t *tok, size_t n, float *logits) {
    const mi_status st = mi_model_prefill(m, tok, n, logits);
    CHECK(st == MI_STATUS_SUCCESS, "prefill: %s", mi_model_last_error(m));
}

static mi_config *vs_config(int32_t v, int32_t s) {
    mi_head_pattern p = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    p.vertical_size = v;
    p.slash_size = s;
    mi_config *c = NULL;
    CHECK(mi_config_create(test_ctx(), 2, 4, &p, &c) == MI_STATUS_SUCCESS, "config");
    return c;
}

int main(void) {
    mi_model_shape s = test_small_shape();
    const int V = s.vocab;
    int32_t a_tok[260], b_tok[230];
    test_byte_tokens(a_tok, 260, 5);
    test_byte_tokens(b_tok, 230, 6);
    float *ref = malloc(sizeof(float) * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
    float *l3 = malloc(sizeof(float) * (size_t)V);
    mi_model *d = test_random_model(&s, 21), *m = test_random_model(&s, 21);
    if (!d || !m) return check_finish("model.static");

    /* budgets over the prompt: dense */
    mi_config *all = vs_config(100000, 100000);
    CHECK(mi_model_set_attention(d, MI_ATTN_DENSE, NULL, 0) == MI_STATUS_SUCCESS, "dense");
    CHECK(mi_model_set_attention_name(m, "static", all, 0) == MI_STATUS_SUCCESS, "static: %s",
          mi_model_last_error(m));
    prefill(d, a_tok, 260, ref);
    prefill(m, a_tok, 260, got);
    CHECK(test_rel_l2(got, ref, V) < 1e-4, "static covering all, first prompt: rel %g",
          test_rel_l2(got, ref, V));
    prefill(d, b_tok, 230, ref);
    prefill(m, b_tok, 230, got);
    CHECK(test_rel_l2(got, ref, V) < 1e-4, "static covering all, later prompt: rel %g",
          test_rel_l2(got, ref, V));

    /* reuse, through a folder */
    char dir[] = "/tmp/mi_static_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char name[64];
    snprintf(name, sizeof name, "static:%s", dir);
    mi_config *small = vs_config(30, 60);
    mi_model *m2 = test_random_model(&s, 21), *m3 = test_random_model(&s, 21);
    CHECK(mi_model_set_attention_name(m, name, small, 0) == MI_STATUS_SUCCESS, "%s",
          mi_model_last_error(m));
    prefill(m, a_tok, 260, got); /* estimates, saves */
    prefill(m, b_tok, 230, ref); /* reuses */
    CHECK(mi_model_set_attention_name(m2, name, small, 0) == MI_STATUS_SUCCESS, "load");
    prefill(m2, b_tok, 230, got); /* loads the first prompt's sets */
    CHECK(memcmp(got, ref, sizeof(float) * (size_t)V) == 0,
          "the loaded sets give other logits than the model that estimated them");
    CHECK(mi_model_set_attention_name(m3, "static", small, 0) == MI_STATUS_SUCCESS, "static");
    prefill(m3, b_tok, 230, l3); /* its own sets */
    CHECK(memcmp(l3, ref, sizeof(float) * (size_t)V) != 0,
          "a later prompt gives the same logits with its own sets: reuse not shown");
    for (int l = 0; l < 2; l++) {
        char path[128];
        snprintf(path, sizeof path, "%s/layer%d.mivs", dir, l);
        CHECK(access(path, R_OK) == 0, "%s missing", path);
        remove(path);
    }
    rmdir(dir);

    CHECK(mi_model_set_attention_name(m, "static:", NULL, 0) == MI_STATUS_INVALID_ARGUMENT,
          "an empty folder is refused");
    mi_model_destroy(d);
    mi_model_destroy(m);
    mi_model_destroy(m2);
    mi_model_destroy(m3);
    mi_config_destroy(all);
    mi_config_destroy(small);
    free(ref), free(got), free(l3);
    return check_finish("model.static");
}
