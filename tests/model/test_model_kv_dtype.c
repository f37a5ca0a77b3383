/*
 * test_model_kv_dtype.c: sessions whose pages are stored in f16, bf16 or fp8 (e4m3 with a scale
 * per page and head) instead of the model's f32 (mi_session_params.kv_dtype).
 *
 * The reference is an f32 session fed the same tokens in the same calls. A call attends to its
 * own new rows in f32, so only later calls read rounded rows: the first prefill's logits are the
 * f32 ones bit for bit, and decode steps drift by the storage's rounding, bounded here by the
 * relative L2 distance of the logits (f16 1e-3, bf16 1e-2, fp8 6e-2 on the random model) and, on
 * SmolLM2, by the perplexity of a text decoded token by token (bf16 within 0.3 % of f32, fp8
 * within 3 % of bf16). A stored dtype keeps the session operations: fork, rewind, save and load
 * continue exactly as the session they came from; the KV methods that select rows read them.
 */
#include "minference_kv.h"
#include "minference_session.h"
#include "model_test_util.h"

#include <math.h>
#include <unistd.h>

static const char *const dtype_names[] = {"f32", "f16", "bf16", "fp8"};

static mi_session *session(mi_model *m, int dtype, const char *kv) {
    mi_session_params p = mi_session_default_params();
    p.kv_dtype = dtype;
    p.kv = kv;
    mi_session *s = NULL;
    mi_status st = mi_session_create(m, &p, &s);
    CHECK(st == MI_STATUS_SUCCESS, "%s session: %s", dtype_names[dtype], mi_model_last_error(m));
    return s;
}

/* Prefill tok[0..n_prefill), then decode the rest one token at a time; returns the mean
 * negative log-likelihood of tok[n_prefill..n) and leaves the last logits in last. */
static double run_nll(mi_session *s, const int32_t *tok, int n, int n_prefill, int V, float *last) {
    float *lg = malloc(sizeof(float) * (size_t)V);
    double nll = 0;
    CHECK_OK(mi_session_prefill(s, tok, (size_t)n_prefill, lg));
    for (int i = n_prefill; i < n; i++) {
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
        for (int v = 0; v < V; v++) sum += exp(lg[v] - mx);
        nll -= lg[tok[i]] - mx - log(sum);
        CHECK_OK(mi_session_decode(s, &tok[i], 1, lg));
    }
    if (last) memcpy(last, lg, sizeof(float) * (size_t)V);
    free(lg);
    return nll / (double)(n - n_prefill);
}

static void test_random_model_dtypes(void) {
    mi_model_shape sh = test_small_shape();
    mi_model *m = test_random_model(&sh, 11);
    if (!m) return;
    CHECK_OK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1));
    const int V = sh.vocab, N = 300, P = 200;
    int32_t *tok = malloc(sizeof(int32_t) * N);
    uint64_t r = 99;
    for (int i = 0; i < N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((r >> 33) % 256);
    }
    float *ref = malloc(sizeof(float) * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
    float *first_ref = malloc(sizeof(float) * (size_t)V),
          *first = malloc(sizeof(float) * (size_t)V);
    mi_session *s32 = session(m, MI_KV_F32, NULL);
    CHECK_OK(mi_session_prefill(s32, tok, P, first_ref));
    for (int i = P; i < N; i++) CHECK_OK(mi_session_decode(s32, &tok[i], 1, ref));
    mi_session_stats st32;
    CHECK_OK(mi_session_stats_get(s32, &st32));
    const double tol[] = {0, 1e-3, 1e-2, 6e-2};
    for (int dt = MI_KV_F16; dt <= MI_KV_FP8_E4M3; dt++) {
        mi_session *s = session(m, dt, NULL);
        if (!s) continue;
        CHECK_OK(mi_session_prefill(s, tok, P, first));
        CHECK(memcmp(first, first_ref, sizeof(float) * (size_t)V) == 0,
              "%s: the first prefill attends in f32 and must equal f32's logits", dtype_names[dt]);
        for (int i = P; i < N; i++) CHECK_OK(mi_session_decode(s, &tok[i], 1, got));
        const double d = test_rel_l2(got, ref, V);
        CHECK(d < tol[dt] && d > 0, "%s: logits %g from f32's (bound %g)", dtype_names[dt], d,
              tol[dt]);
        mi_session_stats st;
        CHECK_OK(mi_session_stats_get(s, &st));
        CHECK(st.n_tokens == N, "%s: %lld tokens", dtype_names[dt], (long long)st.n_tokens);
        /* pages of half the bytes (f16, bf16) or a quarter plus the scales (fp8); the f32 pool
         * also keeps Quest's key bounds beside its pages */
        const double ratio = (double)st.bytes / (double)st32.bytes;
        CHECK(dt == MI_KV_FP8_E4M3 ? ratio < 0.27 : ratio < 0.51, "%s: %.3f of f32's bytes",
              dtype_names[dt], ratio);
        printf("%-4s: decode logits %.2e from f32, %.3f of its bytes\n", dtype_names[dt], d, ratio);

        /* fork, rewind, save and load keep the stored rows exactly */
        mi_session *f = NULL;
        CHECK_OK(mi_session_fork(s, &f));
        CHECK_OK(mi_session_rewind(f, 5));
        for (int i = N - 5; i < N; i++) CHECK_OK(mi_session_decode(f, &tok[i], 1, got));
        char path[256];
        snprintf(path, sizeof path, "/tmp/mi_kv_dtype_%d_%d.session", (int)getpid(), dt);
        CHECK_OK(mi_session_save(s, path));
        mi_session *l = session(m, dt, NULL);
        CHECK_OK(mi_session_load(l, path));
        const int32_t next = 42;
        float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V),
              *c = malloc(sizeof(float) * (size_t)V);
        CHECK_OK(mi_session_decode(s, &next, 1, a));
        CHECK_OK(mi_session_decode(l, &next, 1, b));
        CHECK_OK(mi_session_decode(f, &next, 1, c));
        CHECK(memcmp(a, b, sizeof(float) * (size_t)V) == 0, "%s: loaded session differs",
              dtype_names[dt]);
        CHECK(memcmp(a, c, sizeof(float) * (size_t)V) == 0, "%s: rewound fork differs",
              dtype_names[dt]);
        /* a file of another dtype is refused, the session unchanged */
        mi_session *other = session(m, dt == MI_KV_FP8_E4M3 ? MI_KV_F16 : MI_KV_FP8_E4M3, NULL);
        CHECK(mi_session_load(other, path) != MI_STATUS_SUCCESS, "%s file loaded into another",
              dtype_names[dt]);
        CHECK(mi_session_n_past(other) == 0, "the refused load changed the session");
        unlink(path);
        free(a), free(b), free(c);
        mi_session_destroy(other);
        mi_session_destroy(l);
        mi_session_destroy(f);
        mi_session_destroy(s);
    }
    /* refusals, naming the field */
    mi_session_params p = mi_session_default_params();
    mi_session *s = (mi_session *)1;
    p.kv_dtype = 7;
    CHECK_STATUS(mi_session_create(m, &p, &s), MI_STATUS_INVALID_ARGUMENT);
    CHECK(s == NULL && strstr(mi_model_last_error(m), "kv_dtype"), "%s", mi_model_last_error(m));
    p.kv_dtype = MI_KV_FP8_E4M3;
    p.kv = "kivi";
    CHECK_STATUS(mi_session_create(m, &p, &s), MI_STATUS_INVALID_ARGUMENT);
    /* methods that read selected rows read stored pages too (a page's rows decoded at a time):
     * a budget covering the context reads every row, as no method does (the same rounded rows
     * in a different order of arithmetic than the dense reader's: a tolerance), a small one
     * fewer, which changes the logits */
    const char *all_rows[] = {"quest:token_budget=100000,dense_layers=0",
                              "streamingllm:n_init=4,n_local=100000",
                              "retr_attn:top_k=100000,n_init=4,n_local=16"};
    const char *few_rows[] = {"quest:token_budget=64,dense_layers=0",
                              "streamingllm:n_init=4,n_local=60",
                              "retr_attn:top_k=16,n_init=4,n_local=16"};
    for (int dt = MI_KV_BF16; dt <= MI_KV_FP8_E4M3; dt++) {
        float *plain = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V);
        mi_session *d = session(m, dt, NULL);
        if (d) run_nll(d, tok, N, P, V, plain);
        for (int i = 0; d && i < 3; i++) {
            mi_session *a = session(m, dt, all_rows[i]), *f = session(m, dt, few_rows[i]);
            if (a) {
                run_nll(a, tok, N, P, V, lg);
                const double e = test_rel_l2(lg, plain, V);
                CHECK(e < 1e-5, "%s on %s pages, every row: logits %g from no method's",
                      all_rows[i], dtype_names[dt], e);
            }
            if (f) {
                run_nll(f, tok, N, P, V, lg);
                const double e = test_rel_l2(lg, plain, V);
                CHECK(e > 1e-4 && isfinite(e), "%s on %s pages: logits %g from every row's",
                      few_rows[i], dtype_names[dt], e);
            }
            mi_session_destroy(a);
            mi_session_destroy(f);
        }
        mi_session_destroy(d);
        free(plain), free(lg);
    }
    /* methods that only compact rows work on stored pages */
    mi_session *sl = session(m, MI_KV_BF16, "snapkv:max_capacity_prompt=64,window_size=8");
    if (sl) {
        CHECK_OK(mi_session_prefill(sl, tok, P, got));
        for (int i = P; i < P + 20; i++) CHECK_OK(mi_session_decode(sl, &tok[i], 1, got));
        mi_session_stats st;
        CHECK_OK(mi_session_stats_get(sl, &st));
        CHECK(st.kv_rows == 64 + 20 && st.n_tokens == P + 20,
              "snapkv on bf16 pages: %lld rows for %lld tokens", (long long)st.kv_rows,
              (long long)st.n_tokens);
    }
    mi_session_destroy(sl);
    mi_session_destroy(s32);
    free(tok), free(ref), free(got), free(first_ref), free(first);
    mi_model_destroy(m);
}

/* SmolLM2: the perplexity of license text, its last 256 tokens decoded one by one. */
static void test_smollm2(const char *path) {
    mi_model_params mp = mi_model_default_params();
    mp.n_threads = 2;
    mi_model *m = NULL;
    if (mi_model_load(test_ctx(), path, &mp, &m) != MI_STATUS_SUCCESS) {
        CHECK(0, "load %s: %s", path, TEST_ERR);
        return;
    }
    mi_model_info info;
    mi_model_get_info(m, &info);
    CHECK_OK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1));
    size_t len = 0;
    char *text = NULL;
    FILE *f = fopen("/usr/share/common-licenses/GPL-3", "rb");
    if (f) {
        text = calloc(1, 4096);
        len = fread(text, 1, 4095, f);
        fclose(f);
    }
    if (!text || len < 3000) {
        printf("SmolLM2: no license text to read, its part skipped\n");
        free(text);
        mi_model_destroy(m);
        return;
    }
    int32_t tok[4096];
    size_t n = 0;
    CHECK_OK(mi_model_tokenize(m, text, len, -1, 1, tok, 4096, &n));
    const int N = n < 512 ? (int)n : 512, P = N - 256;
    double ppl[4] = {0, 0, 0, 0};
    for (int dt = 0; dt < 4; dt++) {
        if (dt == MI_KV_F16) continue; /* f16's drift is the random model's part */
        mi_session *s = session(m, dt, NULL);
        if (!s) continue;
        ppl[dt] = exp(run_nll(s, tok, N, P, info.vocab, NULL));
        mi_session_destroy(s);
    }
    printf("SmolLM2, perplexity of %d decoded tokens after %d: f32 %.4f bf16 %.4f (%+.2f %%) fp8 "
           "%.4f (%+.2f %% of bf16)\n",
           N - P, P, ppl[0], ppl[2], 100 * (ppl[2] / ppl[0] - 1), ppl[3],
           100 * (ppl[3] / ppl[2] - 1));
    /* bf16 pages cost SmolLM2 under 0.1 % of perplexity here and fp8 about 1 % (this text after
     * 256 tokens: +0.68 % with the pages' centres, +2.15 % without; over 12 windows of 4 texts
     * +1.4 % on average, its KL from f32 a third lower than without centres; the 0.5 % wanted of
     * fp8 is not reached on this 135M model, docs/kv-cache.md). The bounds catch a broken
     * encoding, scale or centre, which costs far more. */
    CHECK(fabs(ppl[2] / ppl[0] - 1) < 3e-3, "bf16 perplexity %.4f vs f32 %.4f", ppl[2], ppl[0]);
    CHECK(fabs(ppl[3] / ppl[2] - 1) < 3e-2, "fp8 perplexity %.4f vs bf16 %.4f", ppl[3], ppl[2]);
    free(text);
    mi_model_destroy(m);
}

int main(void) {
    test_random_model_dtypes();
    char *path = test_find_model();
    if (path)
        test_smollm2(path);
    else
        printf("SmolLM2 not installed: its part skipped\n");
    free(path);
    return check_finish("model.kv_dtype");
}
