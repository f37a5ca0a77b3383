/*
 * test_model_kv_cache.c: mi_kv_cache, a KV method's cache without a model (the transformers
 * patch's Quest, RetrievalAttention, KIVI and LeanK). Random q/k/v in calls of several sizes:
 *   - dense, and Quest with a budget covering the context: every call's attention against a
 *     float64 causal attention over every row so far;
 *   - Quest with a small budget reads fewer rows: it differs from dense, stays a convex
 *     combination of the value rows (within their range), and keeps every row (it loads, not
 *     evicts);
 *   - StreamingLLM evicts down to its bound; KIVI-4 stays near the reference and KIVI-2 stores
 *     a fraction of the f32 bytes;
 *   - bad arguments are refused with a message and change nothing.
 */
#include "minference_session.h"
#include "model_test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { NL = 2, NH = 4, NKV = 2, HD = 32 };

static uint64_t rng_state = 20261207;
static float rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* [1, H, n, HD] contiguous, head-major */
static mi_tensor t4(float *p, int64_t h, int64_t n) {
    return mi_tensor_bhld(p, MI_DTYPE_F32, MI_DEVICE_CPU, 1, h, n, HD);
}

typedef struct rows {
    float *k, *v; /* [NKV][cap][HD] */
    int64_t n, cap;
} rows;

/* float64 causal attention of q [NH][n][HD] over r's rows (the call's n last) */
static void reference(const rows *r, const float *q, int64_t n, float scale, double *out) {
    const int64_t past = r->n - n;
    double *w = malloc((size_t)r->n * sizeof(double));
    for (int32_t h = 0; h < NH; h++)
        for (int64_t i = 0; i < n; i++) {
            const int32_t g = h / (NH / NKV);
            const int64_t end = past + i + 1;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < end; j++) {
                double s = 0;
                for (int d = 0; d < HD; d++)
                    s += (double)q[(h * n + i) * HD + d] * r->k[(g * r->cap + j) * HD + d];
                w[j] = s * scale;
                mx = w[j] > mx ? w[j] : mx;
            }
            for (int64_t j = 0; j < end; j++) sum += (w[j] = exp(w[j] - mx));
            for (int d = 0; d < HD; d++) {
                double a = 0;
                for (int64_t j = 0; j < end; j++) a += w[j] * r->v[(g * r->cap + j) * HD + d];
                out[(h * n + i) * HD + d] = a / sum;
            }
        }
    free(w);
}

/* Feeds the same calls to c (every layer) and compares layer 0's attention with the float64
 * reference: returns the largest relative L2 error over calls after the first (the first is
 * attended by the caller, out NULL, as the patch does). */
static double run(mi_kv_cache *c, const int64_t *calls, int n_calls, double *vmin_ok) {
    rows r = {0};
    r.cap = 0;
    for (int i = 0; i < n_calls; i++) r.cap += calls[i];
    r.k = malloc((size_t)(NKV * r.cap * HD) * sizeof(float));
    r.v = malloc((size_t)(NKV * r.cap * HD) * sizeof(float));
    double worst = 0;
    if (vmin_ok) *vmin_ok = 1;
    const float scale = 1.0f / sqrtf((float)HD);
    for (int ci = 0; ci < n_calls; ci++) {
        const int64_t n = calls[ci];
        float *q = malloc((size_t)(NH * n * HD) * sizeof(float));
        float *k = malloc((size_t)(NKV * n * HD) * sizeof(float));
        float *v = malloc((size_t)(NKV * n * HD) * sizeof(float));
        float *o = malloc((size_t)(NH * n * HD) * sizeof(float));
        double *ref = malloc((size_t)(NH * n * HD) * sizeof(double));
        for (int64_t i = 0; i < NH * n * HD; i++) q[i] = 3.0f * rnd();
        for (int64_t i = 0; i < NKV * n * HD; i++) k[i] = rnd(), v[i] = rnd();
        for (int g = 0; g < NKV; g++)
            for (int64_t i = 0; i < n; i++) {
                memcpy(&r.k[(g * r.cap + r.n + i) * HD], &k[(g * n + i) * HD], HD * sizeof(float));
                memcpy(&r.v[(g * r.cap + r.n + i) * HD], &v[(g * n + i) * HD], HD * sizeof(float));
            }
        r.n += n;
        mi_tensor tq = t4(q, NH, n), tk = t4(k, NKV, n), tv = t4(v, NKV, n), to = t4(o, NH, n);
        for (int32_t l = 0; l < NL; l++)
            CHECK_OK(mi_kv_cache_call(c, l, &tq, &tk, &tv, scale, ci ? &to : NULL));
        if (ci) {
            reference(&r, q, n, scale, ref);
            double e2 = 0, r2 = 0;
            for (int64_t i = 0; i < NH * n * HD; i++) {
                e2 += (o[i] - ref[i]) * (o[i] - ref[i]);
                r2 += ref[i] * ref[i];
                if (vmin_ok && fabsf(o[i]) > 1.0f + 1e-5f) *vmin_ok = 0; /* values are in [-1, 1) */
            }
            const double e = sqrt(e2 / r2);
            worst = e > worst ? e : worst;
        }
        free(q), free(k), free(v), free(o), free(ref);
    }
    free(r.k), free(r.v);
    return worst;
}

static mi_kv_cache *make(const char *spec) {
    mi_kv_cache_params p = mi_kv_cache_default_params();
    p.kv = spec;
    p.n_layers = NL, p.n_heads = NH, p.n_kv_heads = NKV, p.head_dim = HD;
    p.n_threads = 2;
    mi_kv_cache *c = NULL;
    char msg[256];
    CHECK_OK(mi_kv_cache_create(&p, &c, msg, sizeof msg));
    if (!c) fprintf(stderr, "%s: %s\n", spec ? spec : "dense", msg);
    return c;
}

static const int64_t calls[] = {300, 1, 1, 17, 1, 64, 1};
enum { N_CALLS = sizeof calls / sizeof calls[0] };
static const int64_t total = 300 + 1 + 1 + 17 + 1 + 64 + 1;

static void test_against_float64(void) {
    const char *exact[] = {NULL,
                           "dense",
                           "quest:token_budget=8192,dense_layers=0",
                           "retr_attn:top_k=8192",
                           "kivi:bits=16",
                           "snapkv:max_capacity_prompt=4096"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) {
        mi_kv_cache *c = make(exact[i]);
        if (!c) continue;
        const double e = run(c, calls, N_CALLS, NULL);
        CHECK(e < 1e-5, "%s: %.2e from float64", exact[i] ? exact[i] : "NULL", e);
        CHECK_EQ(mi_kv_cache_rows(c, 0), total);
        CHECK_EQ(mi_kv_cache_tokens(c, 1), total);
        mi_kv_cache_destroy(c);
    }
}

static void test_methods_change_the_reads(void) {
    /* Quest with a 128-token budget: fewer rows read, every row kept */
    rng_state = 7;
    mi_kv_cache *c = make("quest:token_budget=128,dense_layers=0");
    if (c) {
        double in_range = 0;
        const double e = run(c, calls, N_CALLS, &in_range);
        CHECK(e > 1e-3, "quest with a small budget equals dense (%.2e)", e);
        CHECK(in_range == 1, "an output left the values' range");
        CHECK_EQ(mi_kv_cache_rows(c, 0), total);
        mi_kv_cache_destroy(c);
    }
    /* StreamingLLM evicts to its bound (plus at most a page of slack) */
    c = make("streamingllm:n_init=4,n_local=60");
    if (c) {
        run(c, calls, N_CALLS, NULL);
        const int64_t rows = mi_kv_cache_rows(c, 0);
        CHECK(rows >= 64 && rows <= 64 + 64, "streamingllm kept %lld rows", (long long)rows);
        CHECK_EQ(mi_kv_cache_tokens(c, 0), total);
        mi_kv_cache_destroy(c);
    }
    /* KIVI: 4 bits near the reference; 2 bits in a fraction of f32's bytes */
    mi_kv_cache *f = make("dense"), *q4 = make("kivi:bits=4"), *q2 = make("kivi:bits=2");
    if (f && q4 && q2) {
        const double e = run(q4, calls, N_CALLS, NULL);
        run(q2, calls, N_CALLS, NULL);
        run(f, calls, N_CALLS, NULL);
        CHECK(e > 1e-3 && e < 0.2, "kivi-4: %.2e from float64", e);
        const double ratio = (double)mi_kv_cache_bytes(q2) / (double)mi_kv_cache_bytes(f);
        CHECK(ratio > 0 && ratio < 0.3, "kivi-2 keeps %.3f of f32's bytes", ratio);
    }
    mi_kv_cache_destroy(f), mi_kv_cache_destroy(q4), mi_kv_cache_destroy(q2);
}

static void test_refusals(void) {
    mi_kv_cache_params p = mi_kv_cache_default_params();
    mi_kv_cache *c = (mi_kv_cache *)1;
    char msg[256];
    CHECK_STATUS(mi_kv_cache_create(NULL, &c, msg, sizeof msg), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_cache_create(&p, &c, msg, sizeof msg), MI_STATUS_INVALID_ARGUMENT);
    CHECK(c == NULL && strstr(msg, "n_layers"), "%s", msg);
    p.n_layers = NL, p.n_heads = 3, p.n_kv_heads = 2, p.head_dim = HD;
    CHECK_STATUS(mi_kv_cache_create(&p, &c, msg, sizeof msg), MI_STATUS_INVALID_ARGUMENT);
    p.n_heads = NH;
    p.kv = "h2o";
    CHECK(mi_kv_cache_create(&p, &c, msg, sizeof msg) != MI_STATUS_SUCCESS && c == NULL);
    CHECK(strstr(msg, "h2o") != NULL, "%s", msg);
    p.kv = "leank"; /* no mask file */
    CHECK(mi_kv_cache_create(&p, &c, msg, sizeof msg) != MI_STATUS_SUCCESS && c == NULL);
    CHECK(strstr(msg, "leank") != NULL, "%s", msg);

    c = make("quest:token_budget=64");
    if (!c) return;
    float q[NH * 3 * HD], k[NKV * 3 * HD], v[NKV * 3 * HD], o[NH * 3 * HD];
    for (int i = 0; i < NH * 3 * HD; i++) q[i] = rnd(), o[i] = 0;
    for (int i = 0; i < NKV * 3 * HD; i++) k[i] = rnd(), v[i] = rnd();
    mi_tensor tq = t4(q, NH, 3), tk = t4(k, NKV, 3), tv = t4(v, NKV, 3), to = t4(o, NH, 3);
    mi_tensor tq2 = t4(q, NH, 2), tk_h = t4(k, NH, 3 * NKV / NH), tk64 = tk;
    tk64.dtype = MI_DTYPE_F16;
    CHECK_STATUS(mi_kv_cache_call(NULL, 0, &tq, &tk, &tv, 0.1f, &to), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_cache_call(c, NL, &tq, &tk, &tv, 0.1f, &to), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_kv_cache_last_error(c), "layer") != NULL, "%s", mi_kv_cache_last_error(c));
    CHECK_STATUS(mi_kv_cache_call(c, 0, &tq, NULL, &tv, 0.1f, &to), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_cache_call(c, 0, &tq, &tk_h, &tv, 0.1f, &to), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_cache_call(c, 0, &tq, &tk64, &tv, 0.1f, &to), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_cache_call(c, 0, &tq2, &tk, &tv, 0.1f, &to), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_cache_call(c, 0, NULL, &tk, &tv, 0.1f, &to), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_cache_call(c, 0, &tq, &tk, &tv, 0.0f, &to), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_cache_call(c, 0, &tq, &tk, &tv, NAN, &to), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_kv_cache_last_error(c), "scale") != NULL, "%s", mi_kv_cache_last_error(c));
    CHECK_EQ(mi_kv_cache_rows(c, 0), 0); /* nothing appended by a refused call */
    CHECK_EQ(mi_kv_cache_tokens(c, 0), 0);
    CHECK_EQ(mi_kv_cache_rows(c, -1), -1);
    CHECK_EQ(mi_kv_cache_tokens(c, NL), -1);
    CHECK_EQ(mi_kv_cache_rows(NULL, 0), -1);
    CHECK(mi_kv_cache_bytes(NULL) == 0);
    CHECK(strcmp(mi_kv_cache_last_error(NULL), "") == 0);
    CHECK_OK(mi_kv_cache_call(c, 0, &tq, &tk, &tv, 0.1f, &to));
    CHECK_EQ(mi_kv_cache_rows(c, 0), 3);
    mi_kv_cache_destroy(c);
    mi_kv_cache_destroy(NULL);
}

/* Query heads that share a KV head are read together (each K and V row once for the group);
 * each head's result must be what it gets alone: the same cache with every KV head duplicated
 * per query head (group 1, one head at a time) gives the same output bit for bit, for the whole
 * cache (dense) and for a selection that gives the group one span (Quest's dense layers). */
static void test_grouped_heads_equal_alone(const char *spec) {
    mi_kv_cache *c[2];
    for (int i = 0; i < 2; i++) {
        mi_kv_cache_params p = mi_kv_cache_default_params();
        p.kv = spec;
        p.n_layers = NL, p.n_heads = NH, p.n_kv_heads = i ? NH : NKV, p.head_dim = HD;
        p.n_threads = 2;
        char msg[256];
        CHECK_OK(mi_kv_cache_create(&p, &c[i], msg, sizeof msg));
        if (!c[i]) return;
    }
    const int group = NH / NKV;
    int differ = 0;
    for (int ci = 0; ci < N_CALLS; ci++) {
        const int64_t n = calls[ci];
        float *q = malloc(sizeof(float) * NH * n * HD), *k = malloc(sizeof(float) * NKV * n * HD);
        float *v = malloc(sizeof(float) * NKV * n * HD), *o[2];
        float *k2 = malloc(sizeof(float) * NH * n * HD), *v2 = malloc(sizeof(float) * NH * n * HD);
        for (int64_t i = 0; i < NH * n * HD; i++) q[i] = rnd();
        for (int64_t i = 0; i < NKV * n * HD; i++) k[i] = rnd(), v[i] = rnd();
        for (int h = 0; h < NH; h++) /* query head h's own copy of its KV head */
            for (int64_t i = 0; i < n * HD; i++) {
                k2[h * n * HD + i] = k[(h / group) * n * HD + i];
                v2[h * n * HD + i] = v[(h / group) * n * HD + i];
            }
        for (int i = 0; i < 2; i++) o[i] = malloc(sizeof(float) * NH * n * HD);
        for (int32_t l = 0; l < NL; l++) {
            mi_tensor tq = t4(q, NH, n), tk = t4(k, NKV, n), tv = t4(v, NKV, n);
            mi_tensor tk2 = t4(k2, NH, n), tv2 = t4(v2, NH, n);
            mi_tensor to0 = t4(o[0], NH, n), to1 = t4(o[1], NH, n);
            CHECK_OK(mi_kv_cache_call(c[0], l, &tq, &tk, &tv, 0.17f, &to0));
            CHECK_OK(mi_kv_cache_call(c[1], l, &tq, &tk2, &tv2, 0.17f, &to1));
            differ += memcmp(o[0], o[1], sizeof(float) * NH * n * HD) != 0;
        }
        free(q), free(k), free(v), free(k2), free(v2), free(o[0]), free(o[1]);
    }
    CHECK(differ == 0, "%s: %d calls of grouped heads differ from the heads alone",
          spec ? spec : "dense", differ);
    mi_kv_cache_destroy(c[0]);
    mi_kv_cache_destroy(c[1]);
}

int main(void) {
    test_against_float64();
    test_methods_change_the_reads();
    test_refusals();
    test_grouped_heads_equal_alone(NULL);
    test_grouped_heads_equal_alone("quest:token_budget=64,dense_layers=1");
    return check_finish("model.kv_cache");
}
