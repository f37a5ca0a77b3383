/*
 * test_model_blend.c: CacheBlend (mi_session_prefill_blend) on small random-weights models and,
 * when installed, on SmolLM2.
 *
 *  - RoPE re-rotation: a chunk's layer-0 keys (they do not depend on the context) computed at
 *    position 0 and rotated to position P equal those computed at P after a prefix.
 *  - recompute ratio 1 is a full prefill: same K and V in every layer, same logits, bit for bit.
 *  - the selection rule (k largest deviations, ties to the lower index) against brute force.
 *  - a ratio below 1 recomputes ceil(ratio * chunk tokens), the suffix always; the session then
 *    decodes like any other; invalid calls are refused with the session unchanged.
 *
 * `test_model_blend --bench N CHUNKS` (SmolLM2): a passkey prompt of about N tokens split into
 * CHUNKS chunks, each prefilled alone, then blended at ratios 0, 0.15, 0.3, 1 against a full
 * prefill: time to first token, logit and KV deviation, and the greedy answer.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference_kv.h"
#include "minference_session.h"
#include "model_runner.h"
#include "model_test_util.h"

#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static mi_session *new_session(mi_model *m) {
    mi_session *s = NULL;
    mi_status st = mi_session_create(m, NULL, &s);
    CHECK(st == MI_STATUS_SUCCESS, "session_create: %s", mi_model_last_error(m));
    return s;
}

static mi_session *prefilled(mi_model *m, const int32_t *tok, int64_t n) {
    mi_session *s = new_session(m);
    CHECK_OK(mi_session_prefill(s, tok, (size_t)n, NULL));
    return s;
}

/* Rows [row0, row0 + n) of one layer of a session's K and V: [n, n_kv * hd] each. */
static void read_rows(mi_session *s, int32_t layer, int64_t row0, int64_t n, int n_kv, int hd,
                      float *k, float *v) {
    mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, n_kv, n, hd);
    mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, n_kv, n, hd);
    CHECK_OK(mi_kv_seq_read(mim_session_seq(s), layer, row0, n, k ? &tk : NULL, v ? &tv : NULL));
}

static double max_rel(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        num = d > num ? d : num;
        den = fabs(ref[i]) > den ? fabs(ref[i]) : den;
    }
    return num / (den > 0 ? den : 1);
}

static void test_select(void) {
    uint64_t seed = 12345;
    for (int trial = 0; trial < 50; trial++) {
        check_seed = seed;
        const int64_t n = 1 + (int64_t)(seed % 97);
        double dev[128];
        int64_t idx[128];
        for (int64_t i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            dev[i] = (double)((seed >> 40) % 13); /* many ties */
        }
        const int64_t k = (int64_t)(seed % (uint64_t)(n + 3));
        const int64_t got = mim_blend_select(dev, n, k, idx);
        CHECK_EQ(got, k < n ? k : n);
        bool in[128] = {false};
        for (int64_t i = 0; i < got; i++) {
            in[idx[i]] = true;
            if (i) CHECK(idx[i - 1] < idx[i], "not ascending");
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t rank = 0; /* elements ranked before i */
            for (int64_t j = 0; j < n; j++)
                if (dev[j] > dev[i] || (dev[j] == dev[i] && j < i)) rank++;
            CHECK(in[i] == (rank < k), "element %lld (rank %lld, k %lld)", (long long)i,
                  (long long)rank, (long long)k);
        }
    }
    check_seed = 0;
}

/* Layer-0 keys of chunk tok[0..n) computed alone and rotated to position P vs computed at P
 * after a prefix of P tokens. */
static void check_rotation(mi_model *m, const int32_t *prefix, int64_t P, const int32_t *tok,
                           int64_t n, double tol, const char *what) {
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int n_kv = info.n_kv_heads, hd = info.head_dim;
    const int64_t kvd = (int64_t)n_kv * hd;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)(P + n));
    memcpy(all, prefix, sizeof(int32_t) * (size_t)P);
    memcpy(all + P, tok, sizeof(int32_t) * (size_t)n);
    mi_session *alone = prefilled(m, tok, n), *after = prefilled(m, all, P + n);
    float *ka = malloc(sizeof(float) * (size_t)(n * kvd));
    float *kb = malloc(sizeof(float) * (size_t)(n * kvd));
    float *k0 = malloc(sizeof(float) * (size_t)(n * kvd));
    read_rows(alone, 0, 0, n, n_kv, hd, ka, NULL);
    read_rows(after, 0, P, n, n_kv, hd, kb, NULL);
    memcpy(k0, ka, sizeof(float) * (size_t)(n * kvd));
    CHECK_OK(mim_rope_shift(m, ka, n, 0, P));
    const double d = max_rel(ka, kb, n * kvd), d0 = max_rel(k0, kb, n * kvd);
    CHECK(d < tol, "%s: rotated keys differ by %g (max rel)", what, d);
    /* the comparison can fail: unrotated keys are far off */
    CHECK(d0 > 100 * tol, "%s: unrotated keys differ by only %g", what, d0);
    printf("%s: rotated from 0 to %lld: keys within %.2e (unrotated %.2e)\n", what, (long long)P, d,
           d0);
    mi_session_destroy(alone);
    mi_session_destroy(after);
    free(ka);
    free(kb);
    free(k0);
    free(all);
}

static void test_random(void) {
    mi_model_shape shape = test_small_shape();
    shape.n_layers = 4;
    mi_model *m = test_random_model(&shape, 7);
    if (!m) return;
    CHECK_OK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1));
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab, n_kv = info.n_kv_heads, hd = info.head_dim, L = info.n_layers;
    const int64_t kvd = (int64_t)n_kv * hd;
    enum { NA = 40, NB = 53, NS = 9, N = NA + NB + NS };
    int32_t tok[N];
    test_byte_tokens(tok, N, 99);
    check_rotation(m, tok, NA, tok + NA, NB, 1e-5, "random model");

    mi_session *ca = prefilled(m, tok, NA), *cb = prefilled(m, tok + NA, NB);
    /* B's cache also computed after another prefix, at rows 17..: blended from there */
    int32_t other[17 + NB];
    test_byte_tokens(other, 17, 5);
    memcpy(other + 17, tok + NA, sizeof(int32_t) * NB);
    mi_session *cb17 = prefilled(m, other, 17 + NB);
    mi_session *full = new_session(m);
    float *lf = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    CHECK_OK(mi_session_prefill(full, tok, N, lf));

    mi_blend_chunk ch[2] = {{tok, NA, ca, 0}, {tok + NA, NB, cb, 0}};
    mi_blend_params bp = mi_blend_default_params();
    CHECK(bp.recompute_ratio == 0.15f && bp.check_layer == 1, "defaults");
    float *kf = malloc(sizeof(float) * (size_t)(N * kvd)),
          *vf = malloc(sizeof(float) * (size_t)(N * kvd));
    float *kb = malloc(sizeof(float) * (size_t)(N * kvd)),
          *vb = malloc(sizeof(float) * (size_t)(N * kvd));

    /* ratio 1: a full prefill, bit for bit */
    bp.recompute_ratio = 1.0f;
    mi_session *s = new_session(m);
    mi_blend_stats bs;
    CHECK_OK(mi_session_prefill_blend(s, ch, 2, tok + NA + NB, NS, &bp, lb, &bs));
    CHECK_EQ(mi_session_n_past(s), N);
    CHECK_EQ(bs.n_tokens, N);
    CHECK_EQ(bs.n_chunk_tokens, NA + NB);
    CHECK_EQ(bs.n_recomputed, NA + NB);
    CHECK(memcmp(lf, lb, sizeof(float) * (size_t)V) == 0, "ratio 1: logits differ (%g)",
          test_rel_l2(lb, lf, V));
    for (int l = 0; l < L; l++) {
        read_rows(full, l, 0, N, n_kv, hd, kf, vf);
        read_rows(s, l, 0, N, n_kv, hd, kb, vb);
        CHECK(memcmp(kf, kb, sizeof(float) * (size_t)(N * kvd)) == 0 &&
                  memcmp(vf, vb, sizeof(float) * (size_t)(N * kvd)) == 0,
              "ratio 1: layer %d K/V differ", l);
    }
    mi_session_destroy(s);

    /* ratios below 1: the count, the recomputed layers, and the chunk from another position */
    const float ratios[] = {0.0f, 0.15f, 0.5f};
    for (int r = 0; r < 3; r++) {
        for (int from17 = 0; from17 < 2; from17++) {
            bp.recompute_ratio = ratios[r];
            mi_blend_chunk c2[2] = {ch[0], ch[1]};
            if (from17) c2[1] = (mi_blend_chunk){tok + NA, NB, cb17, 17};
            s = new_session(m);
            CHECK_OK(mi_session_prefill_blend(s, c2, 2, tok + NA + NB, NS, &bp, lb, &bs));
            CHECK_EQ(bs.n_recomputed, (int64_t)ceil((double)ratios[r] * (NA + NB)));
            /* layers 0..check_layer are recomputed for every token: exactly the full prefill's */
            for (int l = 0; l <= bp.check_layer; l++) {
                read_rows(full, l, 0, N, n_kv, hd, kf, vf);
                read_rows(s, l, 0, N, n_kv, hd, kb, vb);
                CHECK(memcmp(kf, kb, sizeof(float) * (size_t)(N * kvd)) == 0,
                      "ratio %g: layer %d keys differ", (double)ratios[r], l);
            }
            /* past it, an unselected chunk row holds its cached K, rotated: chunk A (at row 0
             * in its cache and in the prompt) exactly its cache's rows */
            read_rows(s, L - 1, 0, NA, n_kv, hd, kb, vb);
            read_rows(ca, L - 1, 0, NA, n_kv, hd, kf, vf);
            int64_t same_rows = 0;
            for (int64_t i = 0; i < NA; i++)
                same_rows += memcmp(kb + i * kvd, kf + i * kvd, sizeof(float) * (size_t)kvd) == 0;
            CHECK(same_rows >= NA - bs.n_recomputed, "ratio %g: %lld cached rows of chunk A kept",
                  (double)ratios[r], (long long)same_rows);
            double dl = test_rel_l2(lb, lf, V);
            printf("random model, ratio %.2f%s: logits within %.3g of the full prefill\n",
                   (double)ratios[r], from17 ? " (chunk B cached at row 17)" : "", dl);
            /* the session goes on like any other */
            int32_t next = 3;
            float *d1 = malloc(sizeof(float) * (size_t)V);
            CHECK_OK(mi_session_decode(s, &next, 1, d1));
            CHECK_EQ(mi_session_n_past(s), N + 1);
            free(d1);
            mi_session_destroy(s);
        }
    }

    /* chunks cached in their own context (the full prefill's rows): nothing deviates, so at
     * any ratio the selected rows' attention over the kept rows gives the full prefill's logits
     * (up to the order of the sums) */
    for (int r = 0; r < 3; r++) {
        bp.recompute_ratio = ratios[r];
        mi_blend_chunk own[2] = {{tok, NA, full, 0}, {tok + NA, NB, full, NA}};
        s = new_session(m);
        CHECK_OK(mi_session_prefill_blend(s, own, 2, tok + NA + NB, NS, &bp, lb, &bs));
        const double d = test_rel_l2(lb, lf, V);
        CHECK(d < 1e-5, "ratio %g, chunks in context: logits differ by %g", (double)ratios[r], d);
        CHECK_EQ(mi_argmax(lb, V), mi_argmax(lf, V));
        mi_session_destroy(s);
    }

    /* refusals leave the session unchanged */
    s = new_session(m);
    bp = mi_blend_default_params();
    CHECK_STATUS(mi_session_prefill_blend(s, ch, 2, NULL, 0, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_session_last_error(s), "new token") != NULL, "message: %s",
          mi_session_last_error(s));
    CHECK_STATUS(mi_session_prefill_blend(s, NULL, 2, tok, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    bp.recompute_ratio = 1.5f;
    CHECK_STATUS(mi_session_prefill_blend(s, ch, 2, tok, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    bp.recompute_ratio = NAN;
    CHECK_STATUS(mi_session_prefill_blend(s, ch, 2, tok, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    bp = mi_blend_default_params();
    bp.check_layer = L;
    CHECK_STATUS(mi_session_prefill_blend(s, ch, 2, tok, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    bp = mi_blend_default_params();
    mi_blend_chunk bad = {tok, NB + 1, cb, 0}; /* more rows than its cache holds */
    CHECK_STATUS(mi_session_prefill_blend(s, &bad, 1, tok, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    bad = (mi_blend_chunk){tok, 3, cb, -1};
    CHECK_STATUS(mi_session_prefill_blend(s, &bad, 1, tok, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    bad = (mi_blend_chunk){tok, 3, s, 0};
    CHECK_STATUS(mi_session_prefill_blend(s, &bad, 1, tok, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    int32_t oov = V + 5;
    CHECK_STATUS(mi_session_prefill_blend(s, ch, 2, &oov, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_EQ(mi_session_n_past(s), 0);
    CHECK_STATUS(mi_session_prefill_blend(full, ch, 2, tok, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT); /* not empty */
    CHECK_EQ(mi_session_n_past(full), N);
    CHECK_STATUS(mi_session_prefill_blend(NULL, ch, 2, tok, 1, &bp, lb, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    /* a chunk cached by another model */
    mi_model *m2 = test_random_model(&shape, 8);
    if (m2) {
        mi_session *o = prefilled(m2, tok, NA);
        mi_blend_chunk foreign = {tok, NA, o, 0};
        CHECK_STATUS(mi_session_prefill_blend(s, &foreign, 1, tok, 1, &bp, lb, NULL),
                     MI_STATUS_INVALID_ARGUMENT);
        mi_session_destroy(o);
        mi_model_destroy(m2);
    }
    /* no chunks: a plain prefill of the suffix */
    CHECK_OK(mi_session_prefill_blend(s, NULL, 0, tok, N, &bp, lb, NULL));
    CHECK(memcmp(lb, lf, sizeof(float) * (size_t)V) == 0, "no chunks: not the full prefill");
    mi_session_destroy(s);

    mi_session_destroy(ca);
    mi_session_destroy(cb);
    mi_session_destroy(cb17);
    mi_session_destroy(full);
    free(lf);
    free(lb);
    free(kf);
    free(vf);
    free(kb);
    free(vb);
    mi_model_destroy(m);
}

/* A sliding-window model: the selected rows' attention sees only the window, as the full
 * prefill's does (chunks cached in their own context, so nothing else differs). */
static void test_window(void) {
    mi_model_shape shape = test_small_shape();
    shape.n_layers = 3;
    shape.sliding_window = 24;
    mi_model *m = test_random_model(&shape, 9);
    if (!m) return;
    CHECK_OK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1));
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab;
    enum { NA = 50, NB = 61, NS = 5, N = NA + NB + NS };
    int32_t tok[N];
    test_byte_tokens(tok, N, 17);
    mi_session *full = new_session(m);
    float *lf = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    CHECK_OK(mi_session_prefill(full, tok, N, lf));
    const float ratios[] = {0.15f, 0.5f};
    for (int r = 0; r < 2; r++) {
        mi_blend_params bp = mi_blend_default_params();
        bp.recompute_ratio = ratios[r];
        mi_blend_chunk own[2] = {{tok, NA, full, 0}, {tok + NA, NB, full, NA}};
        mi_session *s = new_session(m);
        CHECK_OK(mi_session_prefill_blend(s, own, 2, tok + NA + NB, NS, &bp, lb, NULL));
        const double d = test_rel_l2(lb, lf, V);
        CHECK(d < 1e-5, "window, ratio %g: logits differ by %g", (double)ratios[r], d);
        mi_session_destroy(s);
    }
    mi_session_destroy(full);
    free(lf);
    free(lb);
    mi_model_destroy(m);
}

static mi_model *load(const char *path) {
    mi_model_params p = mi_model_default_params();
    p.n_threads = 2;
    mi_model *m = NULL;
    if (mi_model_load(test_ctx(), path, &p, &m) != MI_STATUS_SUCCESS) {
        CHECK(0, "load %s: %s", path, TEST_ERR);
        return NULL;
    }
    return m;
}

static int64_t tokenize(mi_model *m, const char *text, int32_t *tok, size_t cap) {
    size_t n = 0;
    CHECK_OK(mi_model_tokenize(m, text, strlen(text), -1, 0, tok, cap, &n));
    return (int64_t)n;
}

static void test_smollm2(const char *path) {
    mi_model *m = load(path);
    if (!m) return;
    CHECK_OK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1));
    int32_t pre[4096], tok[256];
    const char *filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. ";
    int64_t np = 0;
    while (np < 1500) np += tokenize(m, filler, pre + np, 4096 - (size_t)np);
    const int64_t n =
        tokenize(m, "The pass key is 71432. Remember it. 71432 is the pass key.", tok, 256);
    check_rotation(m, pre, np, tok, n, 2e-5, "SmolLM2");
    mi_model_destroy(m);
}

/* ------------------------------------------------------------------------------------------ */

static int bench(const char *path, int n_target, int n_chunks) {
    mi_model *m = load(path);
    if (!m) return 1;
    CHECK_OK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1));
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab, n_kv = info.n_kv_heads, hd = info.head_dim, L = info.n_layers;
    const int64_t kvd = (int64_t)n_kv * hd;
    const char *filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. "
                         "There and back again. ";
    const char *needle = "The pass key is 68319. Remember it. 68319 is the pass key. ";
    const char *question = "What is the pass key? The pass key is";
    const int64_t cap = n_target + 512;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)cap);
    int64_t *bounds = malloc(sizeof(int64_t) * (size_t)(n_chunks + 1));
    int64_t n = tokenize(m,
                         "There is an important info hidden inside a lot of irrelevant text. "
                         "Find it and memorize it. ",
                         tok, (size_t)cap);
    const int64_t per = (n_target - n) / n_chunks, needle_chunk = n_chunks / 2;
    bounds[0] = 0;
    for (int c = 0; c < n_chunks; c++) {
        const int64_t end = n + per;
        bool put = false;
        while (n < end) {
            if (c == needle_chunk && !put && n > end - per / 2) {
                n += tokenize(m, needle, tok + n, (size_t)(cap - n));
                put = true;
            } else {
                n += tokenize(m, filler, tok + n, (size_t)(cap - n));
            }
        }
        bounds[c + 1] = n;
    }
    int32_t q[64];
    const int64_t nq = tokenize(m, question, q, 64);
    memcpy(tok + n, q, sizeof(int32_t) * (size_t)nq);
    const int64_t N = n + nq;
    int32_t want[8];
    const int64_t nwant = tokenize(m, " 68319", want, 8);
    printf("SmolLM2, %lld tokens in %d chunks + %lld question tokens, %d threads\n", (long long)n,
           n_chunks, (long long)nq, 2);

    float *lf = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    mi_session *full = new_session(m);
    double t0 = now_s();
    CHECK_OK(mi_session_prefill(full, tok, (size_t)N, lf));
    const double t_full = now_s() - t0;
    mi_session **cache = calloc((size_t)n_chunks, sizeof(*cache));
    mi_blend_chunk *ch = calloc((size_t)n_chunks, sizeof(*ch));
    t0 = now_s();
    for (int c = 0; c < n_chunks; c++) {
        cache[c] = prefilled(m, tok + bounds[c], bounds[c + 1] - bounds[c]);
        ch[c] = (mi_blend_chunk){tok + bounds[c], (size_t)(bounds[c + 1] - bounds[c]), cache[c], 0};
    }
    const double t_chunks = now_s() - t0;
    float *kf = malloc(sizeof(float) * (size_t)(N * kvd)),
          *kb = malloc(sizeof(float) * (size_t)(N * kvd));
    float *vf = malloc(sizeof(float) * (size_t)(N * kvd)),
          *vb = malloc(sizeof(float) * (size_t)(N * kvd));

    /* greedy answer of a session: nwant tokens */
    printf("full prefill: %.2f s; the chunks alone (precomputed, not counted): %.2f s\n", t_full,
           t_chunks);
    printf("| method | TTFT (s) | logits rel. L2 vs full | KV rel. L2 (last layer) | answer |\n");
    printf("|---|---|---|---|---|\n");
    const float ratios[] = {-1.0f, 0.0f, 0.15f, 0.3f, 1.0f};
    for (int r = 0; r < 5; r++) {
        mi_session *s = NULL;
        double t = 0;
        float *lg = lb;
        if (ratios[r] < 0) {
            s = full;
            t = t_full;
            lg = lf;
        } else {
            s = new_session(m);
            mi_blend_params bp = mi_blend_default_params();
            bp.recompute_ratio = ratios[r];
            t0 = now_s();
            CHECK_OK(
                mi_session_prefill_blend(s, ch, (size_t)n_chunks, q, (size_t)nq, &bp, lb, NULL));
            t = now_s() - t0;
        }
        read_rows(full, L - 1, 0, N, n_kv, hd, kf, vf);
        read_rows(s, L - 1, 0, N, n_kv, hd, kb, vb);
        const double dkv = test_rel_l2(kb, kf, N * kvd) + test_rel_l2(vb, vf, N * kvd);
        char ans[128] = {0};
        int ok = 1;
        float *lg2 = malloc(sizeof(float) * (size_t)V);
        memcpy(lg2, lg, sizeof(float) * (size_t)V);
        mi_session *g = NULL;
        CHECK_OK(mi_session_fork(s, &g));
        for (int64_t i = 0; i < nwant; i++) {
            int32_t t1 = mi_argmax(lg2, V);
            ok &= t1 == want[i];
            char piece[32];
            size_t len = 0;
            if (mi_model_token_to_piece(m, t1, piece, sizeof piece, &len) == 0 &&
                strlen(ans) + len < sizeof ans - 1)
                strncat(ans, piece, len);
            CHECK_OK(mi_session_decode(g, &t1, 1, lg2));
        }
        mi_session_destroy(g);
        free(lg2);
        if (ratios[r] < 0)
            printf("| full prefill | %.2f | 0 | 0 | %s%s |\n", t, ans, ok ? " (right)" : "");
        else
            printf("| blend %.2f | %.2f | %.3g | %.3g | %s%s |\n", (double)ratios[r], t,
                   test_rel_l2(lb, lf, V), dkv, ans, ok ? " (right)" : "");
        if (s != full) mi_session_destroy(s);
    }
    for (int c = 0; c < n_chunks; c++) mi_session_destroy(cache[c]);
    mi_session_destroy(full);
    free(cache);
    free(ch);
    free(tok);
    free(bounds);
    free(lf);
    free(lb);
    free(kf);
    free(kb);
    free(vf);
    free(vb);
    mi_model_destroy(m);
    return check_finish("model.blend bench");
}

int main(int argc, char **argv) {
    char *path = test_find_model();
    if (argc >= 3 && strcmp(argv[1], "--bench") == 0) {
        int rc = path ? bench(path, atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 4) : SKIP_CODE;
        free(path);
        return rc;
    }
    test_select();
    test_random();
    test_window();
    if (path)
        test_smollm2(path);
    else
        printf("SmolLM2 not installed: its part skipped\n");
    free(path);
    return check_finish("model.blend");
}
