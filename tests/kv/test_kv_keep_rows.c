/*
 * test_kv_keep_rows.c: mi_session_kv_keep_rows, a KV method's rows for a cache kept outside a
 * session, against the session's own hooks on a paged sequence of the same rows:
 *  - SnapKV and PyramidKV (every layer's budget) keep exactly the rows a session keeps after a
 *    prefill call, with q given as a strided [B, L, H, D] view and k as [B, H, L, D]; the rows
 *    equal kv_snapkv_select on the same data; a one-token call, and a capacity covering the whole
 *    layer, keep every row;
 *  - StreamingLLM: sinks + the last window once the layer is longer than the two (q may be
 *    NULL), every row below that; the session's eviction (a page later) keeps the same rows;
 *  - dense keeps every row; the methods that need the session's cache are MI_STATUS_UNSUPPORTED;
 *    bad specs, tensors, shapes and layers are refused with a message.
 */
#include "../../src/kv/kv_method.h"
#include "kv_test_util.h"
#include "minference_session.h"

#include <stdio.h>

enum { NH = 6, NKV = 2, HD = 16, PT = 16, LAYERS = 4 };

/* The rows a session keeps: a paged layer of k (bhld [NKV][len][HD]) after the hook. */
static void session_rows(const char *spec, int32_t layer, const float *qtok, int64_t n,
                         const float *k, int64_t len, bool prefill, float *out, int64_t *rows) {
    mi_kv_pool_params pp = mi_kv_pool_default_params();
    pp.n_layers = LAYERS, pp.n_kv_heads = NKV, pp.head_dim = HD, pp.page_tokens = PT;
    mi_kv_pool *pool = NULL;
    mi_kv_seq *seq = NULL;
    CHECK_OK(mi_kv_pool_create(NULL, &pp, &pool));
    CHECK_OK(mi_kv_seq_create(pool, &seq));
    mi_tensor tk = mi_tensor_bhld((void *)k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NKV, len, HD);
    CHECK_OK(mi_kv_seq_append(seq, layer, &tk, &tk));
    kv_spec ks;
    char err[256];
    CHECK_OK(kv_spec_parse(spec, &ks, err, sizeof err));
    const kv_geometry geo = {LAYERS, NH, NKV, HD, PT};
    kv_method *m = NULL;
    CHECK_OK(kv_method_create(&ks, &geo, &m, err, sizeof err));
    kv_method_appended(m, len);
    if (prefill) CHECK_OK(kv_method_after_prefill(m, seq, layer, qtok, n));
    CHECK_OK(kv_method_after_append(m, seq, layer, n));
    *rows = mi_kv_seq_length(seq, layer);
    mi_tensor to = mi_tensor_bhld(out, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NKV, *rows, HD);
    CHECK_OK(mi_kv_seq_read(seq, layer, 0, *rows, &to, NULL));
    kv_method_destroy(m);
    mi_kv_seq_destroy(seq);
    mi_kv_pool_destroy(pool);
}

/* keep's rows of k equal the session's rows, head by head. */
static void same_rows(const float *k, int64_t len, const int64_t *keep, int64_t count,
                      const float *sess, int64_t sess_rows, const char *what) {
    CHECK(count == sess_rows, "%s: %lld rows kept, the session keeps %lld", what, (long long)count,
          (long long)sess_rows);
    if (count != sess_rows) return;
    for (int32_t h = 0; h < NKV; h++)
        for (int64_t i = 0; i < count; i++) {
            const int64_t r = keep[h * count + i];
            CHECK(r >= 0 && r < len && (i == 0 || r > keep[h * count + i - 1]), "%s: ascending",
                  what);
            CHECK(memcmp(k + (h * len + r) * HD, sess + (h * count + i) * HD, HD * sizeof(float)) ==
                      0,
                  "%s: head %d row %lld", what, h, (long long)i);
        }
}

static void test_snapkv(void) {
    char msg[256];
    for (int trial = 0; trial < 8; trial++) {
        check_seed = rng_state = 900 + (uint64_t)trial;
        const int64_t len = rng_int(120, 400), n = rng_int(2, 80);
        const int32_t layer = (int32_t)rng_int(0, LAYERS - 1);
        float *qtok = malloc((size_t)(n * NH * HD) * sizeof(float)); /* [n][NH][HD] */
        float *k = malloc((size_t)(NKV * len * HD) * sizeof(float));
        float *sess = malloc((size_t)(NKV * len * HD) * sizeof(float));
        int64_t *keep = malloc((size_t)(NKV * len) * sizeof(int64_t));
        for (int64_t i = 0; i < n * NH * HD; i++) qtok[i] = rng_value(3.0f);
        for (int64_t i = 0; i < NKV * len * HD; i++) k[i] = rng_value(3.0f);
        const mi_tensor tq = mi_tensor_blhd(qtok, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NH, n, HD);
        const mi_tensor tk = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NKV, len, HD);
        const int64_t cap = rng_int(40, 110), window = rng_int(4, 32);
        const char *methods[2] = {"snapkv", "pyramidkv"};
        for (int which = 0; which < 2; which++) {
            char spec[160];
            snprintf(spec, sizeof spec, "%s:window_size=%lld,max_capacity_prompt=%lld,pooling=%s",
                     methods[which], (long long)window, (long long)cap,
                     trial % 2 ? "maxpool" : "avgpool");
            int64_t count = -1, rows = -1;
            CHECK_OK(mi_session_kv_keep_rows(spec, LAYERS, layer, &tq, &tk, keep, &count, msg,
                                             sizeof msg));
            session_rows(spec, layer, qtok, n, k, len, true, sess, &rows);
            same_rows(k, len, keep, count, sess, rows, spec);
            const int64_t w = n < window ? n : window;
            const int64_t budget =
                which ? kv_pyramid_prefix_budget(cap, w, 20, LAYERS, layer, len) : cap - w;
            CHECK(count < len && count == budget + w, "%s: %lld rows (budget %lld + %lld)", spec,
                  (long long)count, (long long)budget, (long long)w);
            /* the rule itself */
            int64_t *direct = malloc((size_t)(NKV * count) * sizeof(int64_t));
            CHECK_OK(kv_snapkv_select(qtok + (n - w) * NH * HD, w, k, len, NH, NKV, HD, 5,
                                      trial % 2, count - w, direct, NULL));
            CHECK(memcmp(direct, keep, (size_t)(NKV * count) * sizeof(int64_t)) == 0,
                  "%s: kv_snapkv_select's rows", spec);
            free(direct);
            /* a one-token call (decode) keeps every row */
            const mi_tensor t1 =
                mi_tensor_blhd(qtok + (n - 1) * NH * HD, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NH, 1, HD);
            CHECK_OK(mi_session_kv_keep_rows(spec, LAYERS, layer, &t1, &tk, keep, &count, NULL, 0));
            CHECK_EQ(count, len);
            /* a capacity covering the layer keeps every row, as the session does */
            snprintf(spec, sizeof spec, "%s:window_size=%lld,max_capacity_prompt=%lld",
                     methods[which], (long long)window, (long long)(len + 1));
            CHECK_OK(mi_session_kv_keep_rows(spec, LAYERS, layer, &tq, &tk, keep, &count, NULL, 0));
            CHECK_EQ(count, len);
            session_rows(spec, layer, qtok, n, k, len, true, sess, &rows);
            CHECK_EQ(rows, len);
        }
        free(qtok);
        free(k);
        free(sess);
        free(keep);
    }
}

static void test_streamingllm(void) {
    check_seed = rng_state = 77;
    const int64_t len = 150;
    float *k = malloc((size_t)(NKV * len * HD) * sizeof(float));
    float *sess = malloc((size_t)(NKV * len * HD) * sizeof(float));
    int64_t *keep = malloc((size_t)(NKV * len) * sizeof(int64_t));
    for (int64_t i = 0; i < NKV * len * HD; i++) k[i] = rng_value(3.0f);
    const mi_tensor tk = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NKV, len, HD);
    int64_t count = -1, rows = -1;
    /* 4 + 100 < 150 - PT: the session evicts too */
    CHECK_OK(mi_session_kv_keep_rows("streamingllm:n_init=4,n_local=100", LAYERS, 1, NULL, &tk,
                                     keep, &count, NULL, 0));
    CHECK_EQ(count, 104);
    for (int32_t h = 0; h < NKV; h++)
        for (int64_t i = 0; i < count; i++)
            CHECK_EQ(keep[h * count + i], i < 4 ? i : len - 100 + (i - 4));
    session_rows("streamingllm:n_init=4,n_local=100", 1, NULL, 1, k, len, false, sess, &rows);
    same_rows(k, len, keep, count, sess, rows, "streamingllm");
    /* one row past the bound: evicted here at once (the session waits a page) */
    CHECK_OK(mi_session_kv_keep_rows("streamingllm:n_init=4,n_local=145", LAYERS, 1, NULL, &tk,
                                     keep, &count, NULL, 0));
    CHECK_EQ(count, 149);
    CHECK(keep[3] == 3 && keep[4] == 5 && keep[148] == 149, "sinks, then the window");
    /* the bound covering the layer: every row */
    CHECK_OK(mi_session_kv_keep_rows("streamingllm:n_init=4,n_local=146", LAYERS, 1, NULL, &tk,
                                     keep, &count, NULL, 0));
    CHECK_EQ(count, len);
    CHECK_OK(mi_session_kv_keep_rows("dense", LAYERS, 1, NULL, &tk, keep, &count, NULL, 0));
    CHECK_EQ(count, len);
    free(k);
    free(sess);
    free(keep);
}

static void test_refusals(void) {
    float q[2 * NH * HD] = {0}, k[NKV * 8 * HD] = {0};
    int64_t keep[NKV * 8], count = 0;
    char msg[256];
    const mi_tensor tq = mi_tensor_blhd(q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NH, 2, HD);
    const mi_tensor tk = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NKV, 8, HD);
    const char *paged[] = {"quest", "retr_attn", "kivi", "leank"};
    for (int i = 0; i < 4; i++) {
        CHECK_STATUS(
            mi_session_kv_keep_rows(paged[i], LAYERS, 0, &tq, &tk, keep, &count, msg, sizeof msg),
            MI_STATUS_UNSUPPORTED);
        CHECK(strstr(msg, paged[i]) && strstr(msg, "session"), "%s: '%s'", paged[i], msg);
    }
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv:window=3", LAYERS, 0, &tq, &tk, keep, &count, msg,
                                         sizeof msg),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(msg, "window") != NULL, "'%s'", msg);
    CHECK_STATUS(
        mi_session_kv_keep_rows("nope", LAYERS, 0, &tq, &tk, keep, &count, msg, sizeof msg),
        MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(
        mi_session_kv_keep_rows("snapkv", LAYERS, 0, NULL, &tk, keep, &count, msg, sizeof msg),
        MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(msg, "q is required") != NULL, "'%s'", msg);
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, LAYERS, &tq, &tk, keep, &count, NULL, 0),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", 0, 0, &tq, &tk, keep, &count, NULL, 0),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, 0, &tq, NULL, keep, &count, NULL, 0),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, 0, &tq, &tk, NULL, &count, NULL, 0),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, 0, &tq, &tk, keep, NULL, NULL, 0),
                 MI_STATUS_INVALID_ARGUMENT);
    mi_tensor bad = tk;
    bad.dtype = MI_DTYPE_F16;
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, 0, &tq, &bad, keep, &count, NULL, 0),
                 MI_STATUS_INVALID_ARGUMENT);
    bad = tk;
    bad.stride[3] = 2;
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, 0, &tq, &bad, keep, &count, NULL, 0),
                 MI_STATUS_INVALID_ARGUMENT);
    bad = tk;
    bad.shape[0] = 2;
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, 0, &tq, &bad, keep, &count, NULL, 0),
                 MI_STATUS_INVALID_ARGUMENT);
    bad = tk;
    bad.device = MI_DEVICE_CUDA;
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, 0, &tq, &bad, keep, &count, NULL, 0),
                 MI_STATUS_INVALID_ARGUMENT);
    /* shapes that do not fit: head_dim, H_q not a multiple of H_kv, more queries than rows */
    mi_tensor q2 = mi_tensor_blhd(q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NH, 2, HD / 2);
    CHECK_STATUS(
        mi_session_kv_keep_rows("snapkv", LAYERS, 0, &q2, &tk, keep, &count, msg, sizeof msg),
        MI_STATUS_SHAPE_MISMATCH);
    q2 = mi_tensor_blhd(q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 5, 2, HD);
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, 0, &q2, &tk, keep, &count, NULL, 0),
                 MI_STATUS_SHAPE_MISMATCH);
    const mi_tensor k1 = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, NKV, 1, HD);
    CHECK_STATUS(mi_session_kv_keep_rows("snapkv", LAYERS, 0, &tq, &k1, keep, &count, NULL, 0),
                 MI_STATUS_SHAPE_MISMATCH);
}

int main(void) {
    test_snapkv();
    test_streamingllm();
    test_refusals();
    return check_finish("test_kv_keep_rows");
}
