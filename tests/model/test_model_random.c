/*
 * test_model_random.c: random-weights models (mi_model_create_random), the sliding window, the
 * prefill timing report and the sampler, on the CPU.
 *
 * The window is checked two ways that share no code: a prompt's last logits from one prefill
 * (the window becomes an A-shape with no sinks in the attention kernels) against a prefill of
 * all but the last token followed by a decode step (the decode path's own window), and against
 * the same model without a window when the prompt fits in the window.
 */
#include "model_test_util.h"

int main(void) {
    mi_model_shape s = test_small_shape();
    const int V = s.vocab, n = 600;
    int32_t tok[600];
    test_byte_tokens(tok, n, 3);
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);

    /* same seed, same model; another seed, another model */
    mi_model *m1 = test_random_model(&s, 11), *m2 = test_random_model(&s, 11),
             *m3 = test_random_model(&s, 12);
    if (!m1 || !m2 || !m3) return check_finish("model.random");
    mi_model_info info;
    CHECK(mi_model_get_info(m1, &info) == MI_STATUS_SUCCESS && info.vocab == V &&
              info.head_dim == 32 && strcmp(info.source, "random") == 0,
          "info");
    CHECK(mi_model_set_attention(m1, MI_ATTN_DENSE, NULL, -1) == 0, "set_attention");
    CHECK(mi_model_set_attention(m2, MI_ATTN_DENSE, NULL, -1) == 0, "set_attention");
    CHECK(mi_model_set_attention(m3, MI_ATTN_DENSE, NULL, -1) == 0, "set_attention");
    CHECK(mi_model_prefill(m1, tok, 64, a) == 0, "prefill");
    CHECK(mi_model_prefill(m2, tok, 64, b) == 0, "prefill");
    CHECK(memcmp(a, b, sizeof(float) * (size_t)V) == 0, "the same seed gave different logits");
    CHECK(mi_model_prefill(m3, tok, 64, b) == 0, "prefill");
    CHECK(test_rel_l2(a, b, V) > 0.1, "another seed gave the same model (diff %g)",
          test_rel_l2(a, b, V));
    /* logits of a sane size: unit-RMS activations through a tied head of unit-RMS rows */
    double ss = 0;
    for (int i = 0; i < V; i++) ss += (double)a[i] * a[i];
    CHECK(sqrt(ss / V) > 0.05 && sqrt(ss / V) < 50, "logit RMS %g", sqrt(ss / V));

    /* the timing report of the last prefill */
    mi_model_timing tm;
    CHECK(mi_model_last_timing(m1, &tm) == MI_STATUS_SUCCESS, "last_timing");
    CHECK(tm.n_tokens == 64 && tm.total_s > 0 && tm.attention_s > 0 && tm.gemm_s > 0 &&
              tm.attention_s + tm.gemm_s <= tm.total_s * 1.01 && tm.device_bytes == 0,
          "timing n=%lld total %g attention %g gemm %g", (long long)tm.n_tokens, tm.total_s,
          tm.attention_s, tm.gemm_s);
    CHECK(mi_model_last_timing(NULL, &tm) == MI_STATUS_INVALID_ARGUMENT, "NULL model");
    CHECK(mi_model_last_timing(m1, NULL) == MI_STATUS_INVALID_ARGUMENT, "NULL out");
    mi_model_destroy(m2);
    mi_model_destroy(m3);

    /* sliding window of 200 keys */
    mi_model_shape sw = s;
    sw.sliding_window = 200;
    mi_model *w = test_random_model(&sw, 11);
    if (!w) return check_finish("model.random");
    CHECK(mi_model_get_info(w, &info) == 0 && info.sliding_window == 200, "window in info");
    const mi_attn_mode modes[] = {MI_ATTN_DENSE, MI_ATTN_MINFERENCE, MI_ATTN_A_SHAPE};
    for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
        /* prompt inside the window: the same as no window */
        CHECK(mi_model_set_attention(w, modes[k], NULL, 0) == 0, "set_attention");
        CHECK(mi_model_set_attention(m1, MI_ATTN_DENSE, NULL, 0) == 0, "set_attention");
        CHECK(mi_model_prefill(w, tok, 150, a) == 0, "prefill");
        CHECK(mi_model_prefill(m1, tok, 150, b) == 0, "prefill");
        if (modes[k] == MI_ATTN_DENSE)
            CHECK(test_rel_l2(a, b, V) < 1e-5, "window > prompt changed dense logits (%g)",
                  test_rel_l2(a, b, V));
        /* past the window: one prefill against prefill + decode */
        CHECK(mi_model_prefill(w, tok, (size_t)n, a) == 0, "prefill: %s", mi_model_last_error(w));
        CHECK(mi_model_prefill(w, tok, (size_t)n - 1, b) == 0, "prefill");
        CHECK(mi_model_decode(w, tok + n - 1, 1, b) == 0, "decode");
        CHECK(test_rel_l2(a, b, V) < 1e-4, "%s: windowed prefill and decode differ (%g)",
              mi_attn_mode_name(modes[k]), test_rel_l2(a, b, V));
        /* and the window matters: without it the logits move */
        CHECK(mi_model_prefill(m1, tok, (size_t)n, b) == 0, "prefill");
        if (modes[k] == MI_ATTN_DENSE)
            CHECK(test_rel_l2(a, b, V) > 1e-3, "the window had no effect (%g)",
                  test_rel_l2(a, b, V));
    }
    mi_model_destroy(w);
    mi_model_destroy(m1);

    /* bad shapes and arguments */
    mi_model *bad = NULL;
    mi_model_shape z = s;
    z.n_heads = 3; /* not a multiple of the 2 kv heads */
    CHECK(mi_model_create_random(test_ctx(), &z, 1, NULL, &bad) == MI_STATUS_INVALID_ARGUMENT &&
              !bad && strstr(TEST_ERR, "heads"),
          "bad head split accepted: %s", TEST_ERR);
    z = s;
    z.vocab = 10;
    CHECK(mi_model_create_random(test_ctx(), &z, 1, NULL, &bad) == MI_STATUS_INVALID_ARGUMENT,
          "tiny vocab accepted");
    CHECK(mi_model_create_random(test_ctx(), NULL, 1, NULL, &bad) == MI_STATUS_INVALID_ARGUMENT,
          "NULL shape");
    CHECK(mi_model_create_random(test_ctx(), &s, 1, NULL, NULL) == MI_STATUS_INVALID_ARGUMENT,
          "NULL out");
    mi_model_params p = mi_model_default_params();
    p.device_id = -1;
    CHECK(mi_model_create_random(test_ctx(), &s, 1, &p, &bad) == MI_STATUS_INVALID_ARGUMENT,
          "negative device id");
    mi_model_shape big = mi_model_shape_llama3_8b();
    CHECK(big.n_layers == 32 && big.hidden == 4096 && big.n_heads == 32 && big.n_kv_heads == 8 &&
              big.head_dim == 128 && big.ffn == 14336,
          "8B shape");
    /* the sampler */
    mi_sampler *sm = NULL;
    CHECK(mi_sampler_create(-0.5, 0, 1.0, 1, 10, &sm) == MI_STATUS_INVALID_ARGUMENT && !sm,
          "negative temperature accepted");
    CHECK(mi_sampler_create(1.0, -1, 1.0, 1, 10, &sm) == MI_STATUS_INVALID_ARGUMENT, "top_k < 0");
    CHECK(mi_sampler_create(1.0, 0, 0.0, 1, 10, &sm) == MI_STATUS_INVALID_ARGUMENT, "top_p 0");
    CHECK(mi_sampler_create(1.0, 0, 1.0, 1, 0, &sm) == MI_STATUS_INVALID_ARGUMENT, "vocab 0");
    CHECK(mi_sampler_create(1.0, 0, 1.0, 1, 10, NULL) == MI_STATUS_INVALID_ARGUMENT, "NULL out");
    CHECK(mi_sampler_sample(NULL, a, 1) == -1, "NULL sampler");
    const float two[2] = {0.0f, logf(3.0f)}; /* softmax: 1/4, 3/4 */
    CHECK(mi_sampler_create(0.0, 0, 1.0, 1, 2, &sm) == 0 && mi_sampler_sample(sm, two, 2) == 1,
          "temperature 0 is greedy");
    CHECK(mi_sampler_sample(sm, two, 3) == -1, "n above the vocabulary accepted");
    const float nan2[2] = {NAN, 1.0f}, inf2[2] = {0.0f, INFINITY}, ninf2[2] = {-INFINITY, 1.0f};
    CHECK(mi_sampler_sample(sm, nan2, 2) == -1, "NaN logit sampled");
    CHECK(mi_sampler_sample(sm, inf2, 2) == -1, "+inf logit sampled");
    CHECK(mi_sampler_sample(sm, ninf2, 2) == 1, "-inf logit (a masked token) refused");
    mi_sampler_destroy(sm);
    int ones = 0, draws = 4000, seq1[16], same = 1;
    CHECK(mi_sampler_create(1.0, 0, 1.0, 42, 2, &sm) == 0, "create");
    for (int i = 0; i < draws; i++) {
        int t = mi_sampler_sample(sm, two, 2);
        ones += t == 1;
        if (i < 16) seq1[i] = t;
    }
    mi_sampler_destroy(sm);
    CHECK(fabs((double)ones / draws - 0.75) < 0.03, "token 1 drawn %.3f of the time, want 0.75",
          (double)ones / draws);
    CHECK(mi_sampler_create(1.0, 0, 1.0, 42, 2, &sm) == 0, "create");
    for (int i = 0; i < 16; i++) same &= mi_sampler_sample(sm, two, 2) == seq1[i];
    mi_sampler_destroy(sm);
    CHECK(same, "the same seed gave another sequence");
    /* top_k 1 and a tiny top_p keep only the best token */
    CHECK(mi_sampler_create(1.0, 1, 1.0, 7, 2, &sm) == 0, "create");
    for (int i = 0; i < 50; i++) same &= mi_sampler_sample(sm, two, 2) == 1;
    mi_sampler_destroy(sm);
    CHECK(mi_sampler_create(1.0, 0, 0.5, 7, 2, &sm) == 0, "create");
    for (int i = 0; i < 50; i++) same &= mi_sampler_sample(sm, two, 2) == 1;
    mi_sampler_destroy(sm);
    CHECK(same, "top_k 1 / top_p 0.5 drew the weaker token");
    free(a);
    free(b);
    return check_finish("model.random");
}
