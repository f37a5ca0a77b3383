/*
 * test_model_kv.c: KV methods in the model runner's sessions (mi_session_params.kv), on a small
 * random-weights model and, when installed, on SmolLM2.
 *
 *  - a bad spec is refused at create with a message; a method not built is UNSUPPORTED;
 *  - budget >= context: every method gives the dense session's logits bit for bit, through a
 *    prefill, a follow-up turn and decode steps;
 *  - StreamingLLM without sinks against the model's own sliding-window attention (the same rule
 *    computed another way), step by step, while the session's rows stay bounded and its position
 *    keeps counting;
 *  - the logical position: after an eviction or compaction, n_past counts every token, kv_rows
 *    what is kept; rewind is refused past the tokens kept in order, save of a compacted cache is
 *    refused, a fork continues exactly like its parent;
 *  - SmolLM2: every method with a budget over the context equals dense, and SnapKV / StreamingLLM
 *    under the context still decode (and bound the cache).
 */
#define _POSIX_C_SOURCE 200809L
#include "minference_session.h"
#include "model_runner.h"
#include "model_test_util.h"
#include "session_test_util.h"

#include <unistd.h>

static bool same(const float *a, const float *b, int n) {
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

static void test_specs(mi_model *m) {
    const char *bad[] = {"snapkvv", "snapkv:window=3", "snapkv:window_size=x",
                         "quest:token_budget=0", "snapkv:max_capacity_prompt=8,window_size=8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mi_session_params p = mi_session_default_params();
        p.kv = bad[i];
        mi_session *s = (mi_session *)1;
        CHECK_STATUS(mi_session_create(m, &p, &s), MI_STATUS_INVALID_ARGUMENT);
        CHECK(s == NULL && strstr(mi_model_last_error(m), "kv") != NULL, "%s: '%s'", bad[i],
              mi_model_last_error(m));
    }
    /* every method of the table is built: none is refused as unsupported */
    for (int32_t i = 0; i < mi_session_kv_method_count(); i++)
        CHECK_OK(mi_session_kv_check(mi_session_kv_method_name(i), NULL, 0));
    char msg[512];
    CHECK_OK(mi_session_kv_check("snapkv:window_size=16", msg, sizeof msg));
    CHECK(strcmp(msg, "snapkv:window_size=16,max_capacity_prompt=4096,kernel_size=5,"
                      "pooling=avgpool") == 0,
          "normalized: %s", msg);
    CHECK_STATUS(mi_session_kv_check("snapkv:bogus=1", msg, sizeof msg),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(msg, "bogus") != NULL, "%s", msg);
    CHECK_OK(mi_session_kv_check(NULL, NULL, 0));
    CHECK_EQ(mi_session_kv_method_count(), 8);
    CHECK(strcmp(mi_session_kv_method_name(1), "streamingllm") == 0, "names");
    CHECK(mi_session_kv_method_name(8) == NULL, "past the end");
}

/* Every method with a budget over the context: the dense session's logits, bit for bit. */
static void test_budget_covers(mi_model *m, const int32_t *tok, int n0, int n1, int steps, int V) {
    const int calls = 2 + steps;
    float *ref = malloc((size_t)calls * V * sizeof(float));
    float *got = malloc((size_t)calls * V * sizeof(float));
    mi_session *d = open_kv(m, NULL);
    CHECK_OK(script(d, tok, n0, n1, steps, ref, V));
    mi_session_destroy(d);
    const char *specs[] = {"dense",
                           "streamingllm:n_init=4,n_local=100000",
                           "snapkv:window_size=8,max_capacity_prompt=100000",
                           "pyramidkv:window_size=8,max_capacity_prompt=100000",
                           "quest:token_budget=100000",
                           "quest:token_budget=100000,dense_layers=0",
                           "retr_attn:top_k=100000,n_init=4,n_local=8"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        mi_session *s = open_kv(m, specs[i]);
        if (!s) continue;
        CHECK_OK(script(s, tok, n0, n1, steps, got, V));
        for (int c = 0; c < calls; c++)
            CHECK(same(got + (size_t)c * V, ref + (size_t)c * V, V),
                  "%s, call %d: differs from dense (rel %g)", specs[i], c,
                  test_rel_l2(got + (size_t)c * V, ref + (size_t)c * V, V));
        mi_session_stats st;
        CHECK_OK(mi_session_stats_get(s, &st));
        CHECK(st.n_tokens == n0 + n1 + steps && st.kv_rows == st.n_tokens, "%s: %lld / %lld",
              specs[i], (long long)st.n_tokens, (long long)st.kv_rows);
        mi_session_destroy(s);
    }
    free(ref);
    free(got);
}

/* StreamingLLM with n_init = 0 is a sliding window of n_local keys: the model's own window
 * attention (contiguous cache) computes the same thing, in the same order. */
static void test_streaming_window(const mi_model_shape *sh, const int32_t *tok, int V) {
    const int W = 48, n0 = 30, steps = 150;
    mi_model_shape wsh = *sh;
    wsh.sliding_window = W;
    mi_model *wm = test_random_model(&wsh, 5);
    mi_model *m = test_random_model(sh, 5);
    if (!wm || !m) goto out;
    mi_model_set_attention(wm, MI_ATTN_DENSE, NULL, -1);
    mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1);
    char spec[64];
    snprintf(spec, sizeof spec, "streamingllm:n_init=0,n_local=%d", W);
    mi_session *s = open_kv(m, spec);
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    CHECK_OK(mi_model_prefill(wm, tok, n0, a));
    CHECK_OK(mi_session_prefill(s, tok, n0, b));
    CHECK(same(a, b, V), "prefill under the window");
    int64_t most = 0;
    for (int i = 0; i < steps; i++) {
        CHECK_OK(mi_model_decode(wm, tok + n0 + i, 1, a));
        CHECK_OK(mi_session_decode(s, tok + n0 + i, 1, b));
        if (!same(a, b, V)) {
            CHECK(false, "step %d: streamingllm differs from the window model (rel %g)", i,
                  test_rel_l2(b, a, V));
            break;
        }
        mi_session_stats st;
        mi_session_stats_get(s, &st);
        most = st.kv_rows > most ? st.kv_rows : most;
        CHECK_EQ(st.n_tokens, n0 + i + 1);
        CHECK_EQ(mi_session_n_past(s), n0 + i + 1);
    }
    mi_session_stats st;
    mi_session_stats_get(s, &st);
    /* bounded: the window plus at most a page of pending rows */
    CHECK(most <= W + st.page_tokens && most > W, "rows peaked at %lld", (long long)most);
    printf("streamingllm n_local=%d: %d tokens seen, at most %lld rows kept (page %d)\n", W,
           n0 + steps, (long long)most, st.page_tokens);
    /* rewinding the tokens in the window is fine, past it is refused with a reason */
    const int64_t rows = st.kv_rows;
    CHECK_STATUS(mi_session_rewind(s, rows + 1), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_session_last_error(s), "streamingllm") != NULL, "%s", mi_session_last_error(s));
    CHECK_EQ(mi_session_n_past(s), n0 + steps);
    /* a compacted cache cannot be saved: its rows are not the positions */
    char path[] = "/tmp/mi_kv_test_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK_STATUS(mi_session_save(s, path), MI_STATUS_UNSUPPORTED);
    CHECK(strstr(mi_session_last_error(s), "compacted") != NULL, "%s", mi_session_last_error(s));
    unlink(path);
    /* a fork continues exactly like its parent */
    mi_session *c = NULL;
    CHECK_OK(mi_session_fork(s, &c));
    if (c) {
        CHECK_EQ(mi_session_n_past(c), n0 + steps);
        float *x = malloc((size_t)V * sizeof(float));
        for (int i = 0; i < 20; i++) {
            CHECK_OK(mi_session_decode(s, tok + i, 1, b));
            CHECK_OK(mi_session_decode(c, tok + i, 1, x));
            CHECK(same(b, x, V), "fork step %d", i);
        }
        free(x);
        /* rewinding a few tokens and feeding them again gives the same logits */
        CHECK_OK(mi_session_rewind(c, 3));
        CHECK_EQ(mi_session_n_past(c), mi_session_n_past(s) - 3);
        float *y = malloc((size_t)V * sizeof(float));
        CHECK_OK(mi_session_decode(c, tok + 17, 3, y));
        CHECK_EQ(mi_session_n_past(c), mi_session_n_past(s));
        mi_session_destroy(c);
        free(y);
    }
    mi_session_destroy(s);
    free(a);
    free(b);
out:
    mi_model_destroy(wm);
    mi_model_destroy(m);
}

/* SnapKV under the context: the cache shrinks to the capacity per layer, n_past counts every
 * token, decoding goes on. */
static void test_snapkv_compacts(mi_model *m, const int32_t *tok, int V) {
    mi_session *s = open_kv(m, "snapkv:window_size=8,max_capacity_prompt=64");
    float *a = malloc((size_t)V * sizeof(float));
    CHECK_OK(mi_session_prefill(s, tok, 200, a));
    mi_session_stats st;
    CHECK_OK(mi_session_stats_get(s, &st));
    CHECK(st.n_tokens == 200 && st.kv_rows == 64, "%lld tokens, %lld rows", (long long)st.n_tokens,
          (long long)st.kv_rows);
    for (int i = 0; i < 5; i++) CHECK_OK(mi_session_decode(s, tok + 200 + i, 1, a));
    CHECK_OK(mi_session_stats_get(s, &st));
    CHECK(st.n_tokens == 205 && st.kv_rows == 69, "%lld tokens, %lld rows", (long long)st.n_tokens,
          (long long)st.kv_rows);
    /* the window and the decoded tokens are the last tokens in order: 13 can be rewound */
    CHECK_STATUS(mi_session_rewind(s, 14), MI_STATUS_INVALID_ARGUMENT);
    CHECK_OK(mi_session_rewind(s, 13));
    CHECK_EQ(mi_session_n_past(s), 192);
    bool finite = true;
    for (int i = 0; i < V; i++) finite = finite && isfinite(a[i]);
    CHECK(finite, "logits finite");
    mi_session_destroy(s);
    /* PyramidKV: layers keep different counts, shrinking with depth */
    s = open_kv(m, "pyramidkv:window_size=8,max_capacity_prompt=40");
    CHECK_OK(mi_session_prefill(s, tok, 200, a));
    CHECK_OK(mi_session_stats_get(s, &st));
    CHECK(st.n_tokens == 200 && st.kv_rows < 200, "%lld rows", (long long)st.kv_rows);
    /* the layers now differ in length: decode and a follow-up turn read each its own rows */
    const int64_t rows = st.kv_rows;
    for (int i = 0; i < 3; i++) CHECK_OK(mi_session_decode(s, tok + 200 + i, 1, a));
    CHECK_OK(mi_session_prefill(s, tok + 203, 40, a));
    CHECK_OK(mi_session_stats_get(s, &st));
    CHECK(st.n_tokens == 243 && st.kv_rows <= rows + 43, "%lld tokens, %lld rows",
          (long long)st.n_tokens, (long long)st.kv_rows);
    finite = true;
    for (int i = 0; i < V; i++) finite = finite && isfinite(a[i]);
    CHECK(finite, "pyramidkv logits finite");
    CHECK_OK(mi_session_rewind(s, 8));
    CHECK_EQ(mi_session_n_past(s), 235);
    mi_session_destroy(s);
    free(a);
}

static void test_smollm2(void) {
    char *path = test_find_model();
    if (!path) {
        printf("SmolLM2 not installed: its part skipped\n");
        return;
    }
    mi_model_params p = mi_model_default_params();
    p.n_threads = 2;
    mi_model *m = NULL;
    if (mi_model_load(test_ctx(), path, &p, &m) != MI_STATUS_SUCCESS) {
        CHECK(false, "load %s", path);
        free(path);
        return;
    }
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab;
    int32_t tok[700];
    for (int i = 0; i < 700; i++) tok[i] = 100 + (i * 7919) % 20000;
    test_budget_covers(m, tok, 300, 40, 4, V);
    free(path);
    mi_model_destroy(m);
}

int main(void) {
    mi_model_shape sh = test_small_shape();
    mi_model *m = test_random_model(&sh, 11);
    if (!m) return check_finish("model.kv");
    mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1);
    const int V = sh.vocab;
    int32_t tok[600];
    for (int i = 0; i < 600; i++) tok[i] = (int32_t)((i * 37 + 11) % V);
    test_specs(m);
    test_budget_covers(m, tok, 150, 40, 6, V);
    test_snapkv_compacts(m, tok, V);
    test_streaming_window(&sh, tok, V);
    mi_model_destroy(m);
    test_smollm2();
    return check_finish("model.kv");
}
