/*
 * test_kv_retr_model.c: RetrievalAttention's index (src/kv/kv_retr.h) on the real keys and
 * queries of SmolLM2 (skipped when the model is not installed): a prompt of N tokens is prefilled
 * with a capture; per layer and KV head, an index over the keys past the sinks and before the
 * window is built and calibrated with the queries just before the last 64 positions (the
 * prompt's "samples"), then searched with the last 64 queries (the "decode steps": they come
 * later, as decode queries do) against brute force.
 *
 * The test (N = 2048, top-k 128) asserts the mean recall reaches 0.85 with a partial scan, and
 * that calibrating with queries is not worse than with keys (which assumes queries look like
 * keys, and is what an index tuned on its own data does). `test_kv_retr_model --bench N K` prints recall, scan and build time per setting.
 */
#include "../../src/kv/kv_retr.h"
#include "minference_model.h"

#include "../check.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SKIP_CODE 77
#define N_INIT 128
#define N_LOCAL 512
#define N_TEST 64
#define N_SAMPLES 64

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct grab {
    int32_t n_layers, n_heads, n_kv, hd;
    int64_t n;
    float **q, **k; /* per layer: [n, n_heads * hd], [n, n_kv * hd] */
} grab;

static mi_status on_layer(void *user, int32_t layer, const mi_tensor *q, const mi_tensor *k,
                          const mi_tensor *v) {
    (void)v;
    grab *g = user;
    const size_t qb = (size_t)(g->n * g->n_heads * g->hd) * sizeof(float);
    const size_t kb = (size_t)(g->n * g->n_kv * g->hd) * sizeof(float);
    g->q[layer] = malloc(qb);
    g->k[layer] = malloc(kb);
    if (!g->q[layer] || !g->k[layer]) return MI_STATUS_OUT_OF_MEMORY;
    memcpy(g->q[layer], q->data, qb); /* [B, L, H, D] storage: rows of n_heads * hd */
    memcpy(g->k[layer], k->data, kb);
    return MI_STATUS_SUCCESS;
}

typedef struct result {
    double recall, recall_uncal, scan_frac, scan_uncal, build_s, search_ms, exact_ms;
} result;

/* Over every layer and KV head: index over rows N_INIT..M - N_LOCAL (M = n - N_TEST), samples
 * the queries at M - N_SAMPLES..M-1, tests the queries at M..n-1. */
static result evaluate(const grab *g, int32_t top_k, float target) {
    result r = {0};
    const int64_t M = g->n - N_TEST, end = M - N_LOCAL, nk = end - N_INIT;
    const int32_t hd = g->hd, group = g->n_heads / g->n_kv;
    float *keys = malloc(sizeof(float) * (size_t)(nk * hd));
    float *qs = malloc(sizeof(float) * (size_t)(N_SAMPLES * group * hd));
    int64_t *a = malloc(sizeof(int64_t) * (size_t)top_k),
            *b = malloc(sizeof(int64_t) * (size_t)top_k);
    float *sa = malloc(sizeof(float) * (size_t)top_k), *sb = malloc(sizeof(float) * (size_t)top_k);
    char *mark = calloc((size_t)nk, 1);
    double n_eval = 0;
    kv_retr_params p = kv_retr_default_params();
    p.target_recall = target;
    for (int32_t l = 0; l < g->n_layers; l++)
        for (int32_t h = 0; h < g->n_kv; h++) {
            for (int64_t i = 0; i < nk; i++)
                memcpy(keys + i * hd, g->k[l] + ((N_INIT + i) * g->n_kv + h) * hd,
                       sizeof(float) * (size_t)hd);
            for (int64_t i = 0; i < N_SAMPLES; i++)
                for (int32_t j = 0; j < group; j++)
                    memcpy(qs + (i * group + j) * hd,
                           g->q[l] + ((M - N_SAMPLES + i) * g->n_heads + h * group + j) * hd,
                           sizeof(float) * (size_t)hd);
            double t0 = now_s();
            kv_retr_index *ix =
                kv_retr_build(keys, nk, hd, hd, 0, qs, N_SAMPLES * group, hd, top_k, &p);
            r.build_s += now_s() - t0;
            /* the same lists calibrated with keys in place of queries (what an index tuned
             * on its own data would scan): the keys at the sample positions */
            float *ks = malloc(sizeof(float) * (size_t)(N_SAMPLES * hd));
            for (int64_t i = 0; i < N_SAMPLES; i++)
                memcpy(ks + i * hd, g->k[l] + ((M - N_SAMPLES + i) * g->n_kv + h) * hd,
                       sizeof(float) * (size_t)hd);
            kv_retr_index *un = kv_retr_build(keys, nk, hd, hd, 0, ks, N_SAMPLES, hd, top_k, &p);
            free(ks);
            CHECK(ix && un, "build");
            if (!ix || !un) continue;
            const int64_t scan = kv_retr_scan_keys(ix, top_k);
            r.scan_uncal += (double)kv_retr_scan_keys(un, top_k) / (double)nk;
            r.scan_frac += (double)scan / (double)nk;
            float *scratch = malloc(sizeof(float) * kv_retr_scratch_floats(ix));
            for (int64_t i = M; i < g->n; i++)
                for (int32_t j = 0; j < group; j++) {
                    const float *q = g->q[l] + (i * g->n_heads + h * group + j) * hd;
                    t0 = now_s();
                    const int64_t ga = kv_retr_exact_topk(keys, nk, hd, hd, 0, q, top_k, a, sa);
                    r.exact_ms += (now_s() - t0) * 1e3;
                    t0 = now_s();
                    const int64_t gb = kv_retr_search(ix, q, top_k, b, sb, scratch);
                    r.search_ms += (now_s() - t0) * 1e3;
                    for (int64_t t = 0; t < ga; t++) mark[a[t]] = 1;
                    int64_t hit = 0;
                    for (int64_t t = 0; t < gb; t++) hit += mark[b[t]];
                    r.recall += (double)hit / (double)ga;
                    const int64_t gu = kv_retr_search(un, q, top_k, b, sb, scratch);
                    hit = 0;
                    for (int64_t t = 0; t < gu; t++) hit += mark[b[t]];
                    r.recall_uncal += (double)hit / (double)ga;
                    for (int64_t t = 0; t < ga; t++) mark[a[t]] = 0;
                    n_eval++;
                }
            free(scratch);
            kv_retr_free(ix);
            kv_retr_free(un);
        }
    r.recall /= n_eval;
    r.recall_uncal /= n_eval;
    r.search_ms /= n_eval;
    r.exact_ms /= n_eval;
    r.scan_frac /= (double)(g->n_layers * g->n_kv);
    r.scan_uncal /= (double)(g->n_layers * g->n_kv);
    free(keys);
    free(qs);
    free(a);
    free(b);
    free(sa);
    free(sb);
    free(mark);
    return r;
}

static bool capture(const char *path, int64_t n_target, grab *g) {
    mi_model_params mp = mi_model_default_params();
    mp.n_threads = 2;
    mi_model *m = NULL;
    if (mi_model_load(NULL, path, &mp, &m) != MI_STATUS_SUCCESS) {
        CHECK(0, "load %s", path);
        return false;
    }
    CHECK_OK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1));
    mi_model_info info;
    mi_model_get_info(m, &info);
    /* a long document: numbered facts, so that attention has something to look up */
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(n_target + 64));
    int64_t n = 0;
    for (int i = 0; n < n_target; i++) {
        char line[160];
        snprintf(line, sizeof line, "Fact %d: the %s of item %d is %d, and it was recorded in %d. ",
                 i, (const char *[]){"colour", "weight", "price", "owner", "place"}[i % 5],
                 (i * 37) % 1000, (i * 7919) % 10007, 1900 + i % 120);
        size_t got = 0;
        if (mi_model_tokenize(m, line, strlen(line), n == 0 ? -1 : 0, 0, tok + n,
                              (size_t)(n_target + 64 - n), &got) != MI_STATUS_SUCCESS)
            break;
        n += (int64_t)got;
    }
    if (n > n_target) n = n_target;
    g->n_layers = info.n_layers;
    g->n_heads = info.n_heads;
    g->n_kv = info.n_kv_heads;
    g->hd = info.head_dim;
    g->n = n;
    g->q = calloc((size_t)info.n_layers, sizeof(float *));
    g->k = calloc((size_t)info.n_layers, sizeof(float *));
    mi_model_capture cap = {on_layer, g, NULL};
    const bool ok = mi_model_prefill_capture(m, tok, (size_t)n, &cap) == MI_STATUS_SUCCESS;
    CHECK(ok, "capture");
    free(tok);
    mi_model_destroy(m);
    return ok;
}

static void grab_free(grab *g) {
    for (int32_t l = 0; l < g->n_layers; l++) {
        free(g->q[l]);
        free(g->k[l]);
    }
    free(g->q);
    free(g->k);
}

static char *find_model(void) {
    const char *env = getenv("MI_MODEL");
    char *path = env && *env ? strdup(env) : mi_model_default_path();
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        free(path);
        return NULL;
    }
    fclose(f);
    return path;
}

int main(int argc, char **argv) {
    char *path = find_model();
    if (!path) {
        printf("SmolLM2 not installed: skipped\n");
        return SKIP_CODE;
    }
    grab g;
    memset(&g, 0, sizeof g);
    const bool bench = argc >= 3 && strcmp(argv[1], "--bench") == 0;
    const int64_t n = bench ? atoll(argv[2]) : 2048;
    if (capture(path, n, &g)) {
        const int32_t ks[] = {bench && argc > 3 ? atoi(argv[3]) : 128};
        const float targets[] = {0.9f, 0.95f, 0.99f};
        for (int t = 0; t < (bench ? 3 : 1); t++) {
            const float target = bench ? targets[t] : 0.95f;
            result r = evaluate(&g, ks[0], target);
            printf("SmolLM2, %lld tokens, %d layers x %d KV heads, index over %lld keys: top-%d "
                   "target %.2f: recall %.3f scanning %.1f%% of the keys (calibrated with keys "
                   "instead: "
                   "recall %.3f scanning %.1f%%), build %.3f s (all heads), search %.3f ms vs "
                   "exact %.3f ms per query\n",
                   (long long)g.n, g.n_layers, g.n_kv, (long long)(g.n - N_TEST - N_LOCAL - N_INIT),
                   ks[0], (double)target, r.recall, 100.0 * r.scan_frac, r.recall_uncal,
                   100.0 * r.scan_uncal, r.build_s, r.search_ms, r.exact_ms);
            if (!bench) {
                CHECK(r.recall >= 0.85, "recall %.3f", r.recall);
                CHECK(r.scan_frac < 0.9, "scans %.2f of the keys", r.scan_frac);
                CHECK(r.recall >= r.recall_uncal - 0.02,
                      "calibrated with queries %.3f below with keys %.3f", r.recall,
                      r.recall_uncal);
            }
        }
    }
    grab_free(&g);
    free(path);
    return check_finish("kv.retr_model");
}
