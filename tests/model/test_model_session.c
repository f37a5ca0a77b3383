/*
 * test_model_session.c: sessions over the paged KV cache (include/minference_session.h), on a
 * small random-weights model and, when installed, on SmolLM2.
 *
 * References are built two ways: the model's own contiguous cache (mi_model_prefill / decode),
 * which shares the arithmetic but not the storage, and other sessions fed the same tokens in
 * the same calls, which must then agree bit for bit. A prompt split into chunks is compared with
 * one prefill within fp tolerance (the first prefill runs the library's attention, a later chunk
 * the library's attention at an offset, or under 32 tokens the runner's dense continuation: the
 * same sums in another order).
 *
 * `test_model_session --bench N` times, on SmolLM2 with an N-token cache, a decode step of a
 * session (attention reading the pages in place) against the model's contiguous cache and
 * against gathering every layer's rows out of the pages (mi_kv_seq_read), the alternative.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference_kv.h"
#include "minference_session.h"
#include "model_runner.h"
#include "model_test_util.h"

#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static mi_model *create(const mi_model_shape *s, uint64_t seed) {
    mi_model *m = test_random_model(s, seed);
    if (m) CHECK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1) == 0, "set_attention");
    return m;
}

static mi_session *new_session(mi_model *m) {
    mi_session *s = NULL;
    mi_status st = mi_session_create(m, NULL, &s);
    CHECK(st == MI_STATUS_SUCCESS, "session_create: %s", mi_model_last_error(m));
    return s;
}

static bool same(const float *a, const float *b, int n) {
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

/* Prefills tok[0..n) in chunks of c and returns the last logits in out. */
static mi_status prefill_chunks(mi_session *s, const int32_t *tok, int n, int c, float *out) {
    for (int i = 0; i < n; i += c) {
        int k = n - i < c ? n - i : c;
        mi_status st = mi_session_prefill(s, tok + i, (size_t)k, out);
        if (st != MI_STATUS_SUCCESS) return st;
    }
    return MI_STATUS_SUCCESS;
}

static bool write_bytes(const char *path, const unsigned char *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(d, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *d = malloc((size_t)len + 1);
    *n = d ? fread(d, 1, (size_t)len, f) : 0;
    fclose(f);
    return d;
}

/* The session still holds the n tokens of tok: its next decode gives ref's logits. */
static void check_intact(mi_session *s, int64_t n, int32_t next, const float *ref, int V,
                         const char *what) {
    float *a = malloc(sizeof(float) * (size_t)V);
    CHECK(mi_session_n_past(s) == n, "%s: n_past %lld, want %lld", what,
          (long long)mi_session_n_past(s), (long long)n);
    CHECK(mi_session_decode(s, &next, 1, a) == 0, "%s: decode: %s", what, mi_session_last_error(s));
    CHECK(same(a, ref, V), "%s: the session changed (diff %g)", what, test_rel_l2(a, ref, V));
    CHECK(mi_session_rewind(s, 1) == 0, "%s: rewind", what);
    free(a);
}

static void test_random(void) {
    mi_model_shape sh = test_small_shape();
    const int V = sh.vocab, N = 300;
    int32_t tok[400];
    test_byte_tokens(tok, 400, 5);
    mi_model *m = create(&sh, 21), *other = create(&sh, 22);
    if (!m || !other) return;
    float *one = malloc(sizeof(float) * (size_t)V), *a = malloc(sizeof(float) * (size_t)V);
    float *b = malloc(sizeof(float) * (size_t)V), *ref = malloc(sizeof(float) * (size_t)V);

    /* a first prefill is the model's prefill, a decode the model's decode, bit for bit, in a
     * sparse mode too */
    for (int mode = 0; mode < 2; mode++) {
        CHECK(mi_model_set_attention(m, mode ? MI_ATTN_A_SHAPE : MI_ATTN_DENSE, NULL, 0) == 0,
              "mode");
        mi_session *s = new_session(m);
        CHECK(mi_model_prefill(m, tok, (size_t)N, ref) == 0, "model prefill");
        CHECK(mi_session_prefill(s, tok, (size_t)N, a) == 0, "session prefill: %s",
              mi_session_last_error(s));
        CHECK(same(a, ref, V), "mode %d: first prefill differs from the model's (%g)", mode,
              test_rel_l2(a, ref, V));
        CHECK(mi_model_decode(m, tok + N, 5, ref) == 0, "model decode");
        CHECK(mi_session_decode(s, tok + N, 5, a) == 0, "session decode");
        CHECK(same(a, ref, V), "mode %d: decode differs from the model's (%g)", mode,
              test_rel_l2(a, ref, V));
        CHECK(mi_session_n_past(s) == N + 5, "n_past");
        mi_session_destroy(s);
    }
    CHECK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1) == 0, "mode");

    /* chunked prefill == one prefill (dense) */
    mi_session *s = new_session(m);
    CHECK(mi_session_prefill(s, tok, (size_t)N, one) == 0, "prefill");
    mi_session_destroy(s);
    const int chunks[] = {1, 7, 64, 100, 129, 299};
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
        s = new_session(m);
        CHECK(prefill_chunks(s, tok, N, chunks[i], a) == 0, "chunks of %d: %s", chunks[i],
              mi_session_last_error(s));
        double d = test_rel_l2(a, one, V);
        CHECK(d < 1e-4, "chunks of %d: logits differ from one prefill by %g", chunks[i], d);
        CHECK(mi_session_n_past(s) == N, "n_past after chunks");
        mi_session_destroy(s);
    }

    /* fork + different suffixes == separate sessions; the parent unchanged; no copy */
    mi_session *parent = new_session(m);
    CHECK(mi_session_prefill(parent, tok, 200, NULL) == 0, "parent prefill");
    mi_session_stats ps0, cs, ps1;
    mi_session_stats_get(parent, &ps0);
    mi_session *c1 = NULL, *c2 = NULL;
    CHECK(mi_session_fork(parent, &c1) == 0 && mi_session_fork(parent, &c2) == 0, "fork");
    mi_session_stats_get(c1, &cs);
    mi_session_stats_get(parent, &ps1);
    CHECK(cs.n_tokens == 200 && cs.bytes == ps0.bytes && cs.shared_bytes == cs.bytes,
          "a fresh fork shares every page (%llu of %llu bytes)",
          (unsigned long long)cs.shared_bytes, (unsigned long long)cs.bytes);
    CHECK(ps1.pool_used_bytes == ps0.pool_used_bytes, "fork copied pages: pool %llu -> %llu bytes",
          (unsigned long long)ps0.pool_used_bytes, (unsigned long long)ps1.pool_used_bytes);
    printf("fork of 200 tokens: session %llu bytes, pool %llu -> %llu bytes\n",
           (unsigned long long)ps0.bytes, (unsigned long long)ps0.pool_used_bytes,
           (unsigned long long)ps1.pool_used_bytes);
    CHECK(mi_session_prefill(c1, tok + 200, 37, a) == 0, "child 1");
    CHECK(mi_session_prefill(c2, tok + 250, 70, b) == 0, "child 2");
    mi_session *r = new_session(m);
    CHECK(mi_session_prefill(r, tok, 200, NULL) == 0 &&
              mi_session_prefill(r, tok + 200, 37, ref) == 0,
          "reference 1");
    CHECK(same(a, ref, V), "child 1 differs from a separate session (%g)", test_rel_l2(a, ref, V));
    CHECK(mi_session_rewind(r, 37) == 0 && mi_session_prefill(r, tok + 250, 70, ref) == 0,
          "reference 2");
    CHECK(same(b, ref, V), "child 2 differs from a separate session (%g)", test_rel_l2(b, ref, V));
    /* the parent still decodes as a session that saw only its 200 tokens */
    CHECK(mi_session_rewind(r, 70) == 0 && mi_session_decode(r, tok + 300, 1, ref) == 0,
          "reference 3");
    CHECK(mi_session_rewind(r, 1) == 0, "rewind");
    check_intact(parent, 200, tok[300], ref, V, "parent after its children appended");
    mi_session_stats_get(c1, &cs);
    CHECK(cs.shared_bytes > 0 && cs.shared_bytes < cs.bytes, "child 1 after append: %llu of %llu",
          (unsigned long long)cs.shared_bytes, (unsigned long long)cs.bytes);
    mi_session_destroy(c1);
    mi_session_destroy(c2);
    check_intact(parent, 200, tok[300], ref, V, "parent after its children went");

    /* rewind then re-prefill == the original (bit for bit when the call is the same; within
     * fp tolerance otherwise: the projections of 1..4 rows and of more round differently) */
    CHECK(mi_session_prefill(r, tok + 200, 100, a) == 0, "r to 300");
    CHECK(mi_session_rewind(r, 100) == 0 && mi_session_prefill(r, tok + 200, 100, b) == 0,
          "rewind 100");
    CHECK(same(a, b, V), "rewind 100 and re-prefill differ (%g)", test_rel_l2(a, b, V));
    for (int k = 1; k <= 100; k += 33) {
        CHECK(mi_session_rewind(r, k) == 0, "rewind %d", k);
        CHECK(mi_session_n_past(r) == 300 - k, "n_past after rewind");
        CHECK(mi_session_prefill(r, tok + 300 - k, (size_t)k, b) == 0, "re-prefill");
        CHECK(test_rel_l2(a, b, V) < 1e-5, "rewind %d and re-prefill differ (%g)", k,
              test_rel_l2(a, b, V));
        CHECK(mi_session_rewind(r, k) == 0 &&
                  mi_session_prefill(r, tok + 300 - k, (size_t)k, one) == 0,
              "again");
        CHECK(same(one, b, V), "rewind %d twice differs", k);
    }
    CHECK(mi_session_rewind(r, 301) != 0 && mi_session_n_past(r) == 300, "rewind past the start");

    /* save -> load -> decode == continuing without saving */
    char dir[] = "/tmp/mi_session_testXXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256], bad[256], foreign[256];
    snprintf(path, sizeof(path), "%s/s.kv", dir);
    snprintf(bad, sizeof(bad), "%s/bad.kv", dir);
    snprintf(foreign, sizeof(foreign), "%s/foreign.kv", dir);
    CHECK(mi_session_save(r, path) == 0, "save: %s", mi_session_last_error(r));
    CHECK(mi_session_decode(r, tok + 300, 3, ref) == 0, "decode after save");
    mi_session *l = new_session(m);
    CHECK(mi_session_load(l, path) == 0, "load: %s", mi_session_last_error(l));
    CHECK(mi_session_n_past(l) == 300, "loaded n_past %lld", (long long)mi_session_n_past(l));
    CHECK(mi_session_decode(l, tok + 300, 3, a) == 0, "decode after load");
    CHECK(same(a, ref, V), "load + decode differs from decode (%g)", test_rel_l2(a, ref, V));
    CHECK(mi_session_rewind(l, 3) == 0 && mi_session_rewind(r, 3) == 0, "rewind");
    CHECK(mi_session_decode(r, tok + 300, 1, ref) == 0 && mi_session_rewind(r, 1) == 0, "ref");

    /* corrupt, truncated, foreign and missing files: refused, session untouched */
    size_t fn = 0;
    unsigned char *file = read_bytes(path, &fn);
    CHECK(file && fn > 200, "read back %zu bytes", fn);
    if (file && fn > 200) {
        const size_t cuts[] = {0, 7, 100, 128, fn / 2, fn - 4, fn - 1};
        for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
            write_bytes(bad, file, cuts[i]);
            mi_status st = mi_session_load(l, bad);
            CHECK(st == MI_STATUS_PARSE_ERROR, "truncated at %zu: %s", cuts[i], mi_status_name(st));
            CHECK(mi_session_last_error(l)[0] != 0, "no message");
            check_intact(l, 300, tok[300], ref, V, "after a truncated file");
        }
        const size_t flips[] = {3, 50, 72, 90, 130, fn / 3, fn - 2};
        for (size_t i = 0; i < sizeof(flips) / sizeof(flips[0]); i++) {
            file[flips[i]] ^= 0x10;
            write_bytes(bad, file, fn);
            file[flips[i]] ^= 0x10;
            mi_status st = mi_session_load(l, bad);
            CHECK(st != MI_STATUS_SUCCESS, "bit flip at %zu accepted", flips[i]);
            check_intact(l, 300, tok[300], ref, V, "after a corrupt file");
        }
        unsigned char extra = 0;
        write_bytes(bad, file, fn);
        FILE *f = fopen(bad, "ab");
        if (f) {
            fwrite(&extra, 1, 1, f);
            fclose(f);
        }
        CHECK(mi_session_load(l, bad) == MI_STATUS_PARSE_ERROR, "a trailing byte accepted");
    }
    free(file);
    mi_session *os = new_session(other);
    CHECK(mi_session_prefill(os, tok, 50, NULL) == 0 && mi_session_save(os, foreign) == 0,
          "foreign save");
    mi_status st = mi_session_load(l, foreign);
    CHECK(st == MI_STATUS_INVALID_ARGUMENT,
          "a file of another model (same shape, other "
          "weights): %s",
          mi_status_name(st));
    printf("foreign file refused: %s\n", mi_session_last_error(l));
    check_intact(l, 300, tok[300], ref, V, "after a foreign file");
    mi_session_destroy(os);
    snprintf(bad, sizeof(bad), "%s/missing.kv", dir);
    CHECK(mi_session_load(l, bad) == MI_STATUS_IO_ERROR, "missing file");
    check_intact(l, 300, tok[300], ref, V, "after a missing file");

    /* a failing call leaves the session unchanged: a bad token, max_tokens, pool capacity */
    int32_t badtok[5] = {1, 2, 3, V + 5, 4};
    CHECK(mi_session_prefill(l, badtok, 5, a) == MI_STATUS_INVALID_ARGUMENT, "bad token");
    check_intact(l, 300, tok[300], ref, V, "after a bad token");

    mi_model *small = create(&sh, 21);
    if (small) {
        /* pages of 64 tokens, one per layer: room for 3 pages lets layer 0 take a second page
         * and makes layer 1 fail, in the middle of the forward pass, going from 60 to 70 */
        mi_session_params sp = mi_session_default_params();
        mi_session *x = NULL;
        CHECK(mi_session_create(small, &sp, &x) == 0, "create");
        mi_session_stats xs;
        CHECK(mi_session_prefill(x, tok, 64, NULL) == 0, "64 tokens");
        mi_session_stats_get(x, &xs);
        const uint64_t page = xs.bytes / 2;
        mi_session_destroy(x);
        mi_model_destroy(small);
        small = create(&sh, 21);
        sp.pool_bytes = 3 * page;
        sp.max_tokens = 100;
        CHECK(mi_session_create(small, &sp, &x) == 0, "create");
        CHECK(mi_session_prefill(x, tok, 60, NULL) == 0, "60 tokens");
        CHECK(mi_session_decode(x, tok + 60, 1, ref) == 0 && mi_session_rewind(x, 1) == 0, "ref");
        st = mi_session_prefill(x, tok + 60, 10, a);
        CHECK(st == MI_STATUS_OUT_OF_MEMORY, "over the pool's capacity: %s", mi_status_name(st));
        printf("out of capacity: %s\n", mi_session_last_error(x));
        mi_session_stats_get(x, &xs);
        CHECK(xs.bytes == 2 * page && xs.pool_used_bytes == 2 * page, "pages kept: %llu",
              (unsigned long long)xs.bytes);
        check_intact(x, 60, tok[60], ref, V, "after running out of pages");
        st = mi_session_prefill(x, tok, 41, a);
        CHECK(st == MI_STATUS_INVALID_ARGUMENT, "over max_tokens: %s", mi_status_name(st));
        check_intact(x, 60, tok[60], ref, V, "after max_tokens");
        mi_session_destroy(x);
        mi_model_destroy(small);
    }

    /* a session of a model with a sliding window: follow-up turns keep the window */
    mi_model_shape wsh = sh;
    wsh.sliding_window = 48;
    mi_model *wm = create(&wsh, 23);
    if (wm) {
        mi_session *w = new_session(wm);
        CHECK(mi_model_prefill(wm, tok, 150, NULL) == 0 &&
                  mi_model_decode(wm, tok + 150, 40, ref) == 0,
              "window model");
        CHECK(prefill_chunks(w, tok, 150, 150, NULL) == 0 &&
                  mi_session_decode(w, tok + 150, 40, a) == 0,
              "window session");
        CHECK(same(a, ref, V), "window: session differs from the model (%g)",
              test_rel_l2(a, ref, V));
        mi_session_destroy(w);
        mi_model_destroy(wm);
    }

    unlink(path);
    unlink(foreign);
    snprintf(bad, sizeof(bad), "%s/bad.kv", dir);
    unlink(bad);
    rmdir(dir);
    mi_session_destroy(l);
    mi_session_destroy(r);
    mi_session_destroy(parent);
    CHECK(mi_session_create(NULL, NULL, &s) == MI_STATUS_INVALID_ARGUMENT && !s, "NULL model");
    mi_model_destroy(m);
    mi_model_destroy(other);
    free(one);
    free(a);
    free(b);
    free(ref);
}

/* SmolLM2: a chat prompt prefilled whole and in chunks of 1, 7, 64 and 100. */
static void test_smollm2(const char *path) {
    mi_model_params p = mi_model_default_params();
    p.n_threads = 2;
    mi_model *m = NULL;
    if (mi_model_load(test_ctx(), path, &p, &m) != MI_STATUS_SUCCESS) {
        CHECK(0, "load %s: %s", path, TEST_ERR);
        return;
    }
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab;
    const char *text = "The quick brown fox jumps over the lazy dog. Paris is the capital of "
                       "France, and Berlin is the capital of Germany. The capital of Italy is";
    int32_t tok[256];
    size_t n = 0;
    CHECK(mi_model_tokenize(m, text, strlen(text), -1, 1, tok, 256, &n) == 0, "tokenize");
    CHECK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1) == 0, "attention");
    float *one = malloc(sizeof(float) * (size_t)V), *a = malloc(sizeof(float) * (size_t)V);
    mi_session *s = new_session(m);
    CHECK(mi_session_prefill(s, tok, n, one) == 0, "prefill");
    mi_session_destroy(s);
    const int chunks[] = {1, 7, 64, 100};
    for (int i = 0; i < 4; i++) {
        s = new_session(m);
        CHECK(prefill_chunks(s, tok, (int)n, chunks[i], a) == 0, "chunks");
        double d = test_rel_l2(a, one, V);
        CHECK(d < 1e-4, "SmolLM2, chunks of %d: logits differ by %g", chunks[i], d);
        CHECK(mi_argmax(a, V) == mi_argmax(one, V), "SmolLM2, chunks of %d: another token",
              chunks[i]);
        mi_session_destroy(s);
    }
    free(one);
    free(a);
    mi_model_destroy(m);
}

static int bench(const char *path, int n) {
    mi_model_params p = mi_model_default_params();
    mi_model *m = NULL;
    if (mi_model_load(NULL, path, &p, &m) != MI_STATUS_SUCCESS) return 1;
    mi_model_info info;
    mi_model_get_info(m, &info);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(n + 16));
    for (int i = 0; i < n + 16; i++) tok[i] = 1000 + (i * 7919) % 30000;
    float *lg = malloc(sizeof(float) * (size_t)info.vocab);
    mi_model_set_attention(m, MI_ATTN_MINFERENCE, NULL, -1);
    mi_session *s = new_session(m);
    double t0 = now_s();
    if (mi_session_prefill(s, tok, (size_t)n, lg) != 0) return 1;
    const double t_sess_prefill = now_s() - t0;
    t0 = now_s();
    if (mi_model_prefill(m, tok, (size_t)n, lg) != 0) return 1;
    const double t_model_prefill = now_s() - t0;
    const int steps = 8;
    t0 = now_s();
    for (int i = 0; i < steps; i++) mi_session_decode(s, tok + n + i, 1, lg);
    const double t_sess = (now_s() - t0) / steps;
    t0 = now_s();
    for (int i = 0; i < steps; i++) mi_model_decode(m, tok + n + i, 1, lg);
    const double t_model = (now_s() - t0) / steps;
    /* a follow-up turn of 256 tokens: dense over the whole cache (queries at an offset) */
    t0 = now_s();
    mi_session_prefill(s, tok + n + steps, 8, lg);
    const double t_follow8 = now_s() - t0;
    int32_t *turn = malloc(sizeof(int32_t) * 256);
    for (int i = 0; i < 256; i++) turn[i] = tok[i % n];
    t0 = now_s();
    mi_session_prefill(s, turn, 256, lg);
    const double t_follow = now_s() - t0;
    mi_session_rewind(s, 256 + 8);
    free(turn);
    /* what a gather of the whole cache into a contiguous buffer would add per step */
    const int64_t L = n + steps, kvd = (int64_t)info.n_kv_heads * info.head_dim;
    float *kb = malloc(sizeof(float) * (size_t)(L * kvd)),
          *vb = malloc(sizeof(float) * (size_t)(L * kvd));
    mi_kv_pool *pool = NULL;
    mi_kv_pool_params pp = mi_kv_pool_default_params();
    pp.n_layers = info.n_layers;
    pp.n_kv_heads = info.n_kv_heads;
    pp.head_dim = info.head_dim;
    mi_kv_pool_create(NULL, &pp, &pool);
    mi_kv_seq *seq = NULL;
    mi_kv_seq_create(pool, &seq);
    mi_tensor tk =
        mi_tensor_blhd(kb, MI_DTYPE_F32, MI_DEVICE_CPU, 1, info.n_kv_heads, L, info.head_dim);
    mi_tensor tv =
        mi_tensor_blhd(vb, MI_DTYPE_F32, MI_DEVICE_CPU, 1, info.n_kv_heads, L, info.head_dim);
    memset(kb, 0, sizeof(float) * (size_t)(L * kvd));
    memset(vb, 0, sizeof(float) * (size_t)(L * kvd));
    for (int l = 0; l < info.n_layers; l++) mi_kv_seq_append(seq, l, &tk, &tv);
    t0 = now_s();
    for (int r = 0; r < 3; r++)
        for (int l = 0; l < info.n_layers; l++) mi_kv_seq_read(seq, l, 0, L, &tk, &tv);
    const double t_gather = (now_s() - t0) / 3;
    mi_session_stats st;
    mi_session_stats_get(s, &st);
    printf("SmolLM2, %d-token cache, every core:\n"
           "  first prefill: session %.2f s, model %.2f s\n"
           "  decode step: session (pages in place) %.1f ms, model (contiguous) %.1f ms\n"
           "  gathering every layer's K and V out of the pages: %.1f ms per step\n"
           "  follow-up turn: 8 tokens %.2f s, 256 tokens %.2f s\n"
           "  session memory: %.1f MiB (%lld tokens)\n",
           n, t_sess_prefill, t_model_prefill, t_sess * 1e3, t_model * 1e3, t_gather * 1e3,
           t_follow8, t_follow, (double)st.bytes / 1048576.0, (long long)st.n_tokens);
    mi_kv_seq_destroy(seq);
    mi_kv_pool_destroy(pool);
    mi_session_destroy(s);
    mi_model_destroy(m);
    free(kb);
    free(vb);
    free(tok);
    free(lg);
    return 0;
}

/* `--bench-offset N [threads]`: on SmolLM2 with an N-token session, per attention mode (dense,
 * minference): a follow-up turn of k tokens over the cache through the dense loop and through the
 * prefill attention at an offset (the crossover, and the 256-token turn), and the prompt prefilled
 * in chunks of 512 and 1024 against one prefill (time, top token, logits). */
static void logit_diff(const float *a, const float *b, int V, double *max_abs, double *rel) {
    double num = 0.0, den = 0.0, mx = 0.0;
    for (int i = 0; i < V; i++) {
        const double d = fabs((double)a[i] - b[i]);
        mx = d > mx ? d : mx;
        num += d * d;
        den += (double)b[i] * b[i];
    }
    *max_abs = mx;
    *rel = den > 0 ? sqrt(num / den) : 0.0;
}

static int bench_offset(const char *path, int n, int threads) {
    mi_model_params p = mi_model_default_params();
    p.n_threads = threads;
    mi_model *m = NULL;
    if (mi_model_load(NULL, path, &p, &m) != MI_STATUS_SUCCESS) return 1;
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(n + 256));
    for (int i = 0; i < n + 256; i++) tok[i] = 1000 + (i * 7919) % 30000;
    float *one = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V);
    float *ref = malloc(sizeof(float) * (size_t)V);
    const mi_attn_mode modes[2] = {MI_ATTN_DENSE, MI_ATTN_MINFERENCE};
    printf("SmolLM2, %d-token session, %d threads\n", n, threads);
    for (int mi = 0; mi < 2; mi++) {
        mi_model_set_attention(m, modes[mi], NULL, -1);
        const char *mode = mi ? "minference" : "dense";
        mi_session *s = new_session(m);
        double t0 = now_s();
        if (mi_session_prefill(s, tok, (size_t)n, one) != 0) return 1;
        printf("[%s] one prefill of %d: %.2f s\n", mode, n, now_s() - t0);
        static const int ks[] = {4, 8, 16, 32, 64, 256};
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int k = ks[ki];
            double t[2];
            for (int path_i = 0; path_i < 2; path_i++) {
                m->seq_prefill_from = path_i ? 1 : INT64_MAX; /* 0: loop, 1: at an offset */
                t0 = now_s();
                mi_session_prefill(s, tok + n, (size_t)k, path_i ? lg : ref);
                t[path_i] = now_s() - t0;
                mi_session_rewind(s, k);
            }
            double mx, rel;
            logit_diff(lg, ref, V, &mx, &rel);
            printf("[%s] follow-up of %3d: dense loop %.3f s, prefill at an offset %.3f s "
                   "(%.2fx); top token %s, logits max |diff| %.2g, rel %.2g\n",
                   mode, k, t[0], t[1], t[0] / t[1],
                   mi_argmax(lg, V) == mi_argmax(ref, V) ? "same" : "DIFFERS", mx, rel);
        }
        m->seq_prefill_from = 0;
        mi_session_destroy(s);
        static const int chunks[] = {1024, 512};
        for (size_t ci = 0; ci < 2; ci++) {
            s = new_session(m);
            t0 = now_s();
            printf("[%s] chunk times (s):", mode);
            for (int c0 = 0; c0 < n; c0 += chunks[ci]) {
                const int c = n - c0 < chunks[ci] ? n - c0 : chunks[ci];
                const double t1 = now_s();
                mi_session_prefill(s, tok + c0, (size_t)c, lg);
                printf(" %.2f", now_s() - t1);
            }
            printf("\n");
            const double tc = now_s() - t0;
            double mx, rel;
            logit_diff(lg, one, V, &mx, &rel);
            printf("[%s] chunks of %d: %.2f s; top token %s, logits max |diff| %.3g, rel %.3g\n",
                   mode, chunks[ci], tc, mi_argmax(lg, V) == mi_argmax(one, V) ? "same" : "DIFFERS",
                   mx, rel);
            mi_session_destroy(s);
        }
    }
    mi_model_destroy(m);
    free(tok);
    free(one);
    free(lg);
    free(ref);
    return 0;
}

int main(int argc, char **argv) {
    char *path = test_find_model();
    if (argc >= 3 && strcmp(argv[1], "--bench-offset") == 0) {
        int rc = path ? bench_offset(path, atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 2) : SKIP_CODE;
        free(path);
        return rc;
    }
    if (argc == 3 && strcmp(argv[1], "--bench") == 0) {
        int rc = path ? bench(path, atoi(argv[2])) : SKIP_CODE;
        free(path);
        return rc;
    }
    test_random();
    if (path)
        test_smollm2(path);
    else
        printf("SmolLM2 not installed: its part skipped\n");
    free(path);
    return check_finish("model.session");
}
