/*
 * Batches of sessions (mi_session_prefill_batch / mi_session_decode_batch) against the same
 * sessions run one at a time: a random-weight model (dense and sparse attention, KV methods, a
 * bf16 session, continuations) and, when installed, SmolLM2.
 *
 * Tolerance: a batch stacks the sessions' rows for the matmuls, so a prompt of a few rows goes
 * through sgemm where alone it would go through the row-by-row GEMV (and sgemm's blocking may
 * depend on the row count): the same sums in another order. Logits must agree to a relative L2
 * distance of 1e-4 (float rounding is ~1e-7 per operation; a wrong row, position or cache is
 * O(1)) and give the same greedy tokens. A decode batch over equal caches uses the same dot
 * products as single decodes, so there it must be bit for bit.
 */
#include "minference_kv.h"
#include "model_internal.h"
#include "session_test_util.h"

#define TOL 1e-4

static float *fbuf(size_t n) {
    float *p = malloc(n * sizeof(float));
    if (!p) abort();
    return p;
}

static mi_session *open_dtype(mi_model *m, int32_t dtype) {
    mi_session_params p = mi_session_default_params();
    p.kv_dtype = dtype;
    mi_session *s = NULL;
    CHECK(mi_session_create(m, &p, &s) == MI_STATUS_SUCCESS, "session: %s", mi_model_last_error(m));
    return s;
}

/* ns sessions built by mk(i) prefilled with prompts[i] and decoded `steps` greedy steps, alone
 * and as batches; each prompt may be preceded by a first turn pre[i] (npre[i] > 0): then the
 * batch's prefill is a continuation. Returns the number of tokens the batch decoded differently
 * (0 expected). */
typedef mi_session *(*mk_fn)(mi_model *m, int i);

static void compare(mi_model *m, int ns, mk_fn mk, const int32_t *const *pre, const size_t *npre,
                    const int32_t *const *prompts, const size_t *lens, int steps,
                    const char *what) {
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab;
    mi_session *one[8], *bat[8];
    float *ref = fbuf((size_t)(ns * (steps + 1) * V)), *got = fbuf((size_t)(ns * V));
    int32_t *rtok = malloc(sizeof(int32_t) * (size_t)(ns * (steps + 1)));
    if (!rtok) abort();
    for (int i = 0; i < ns; i++) {
        one[i] = mk(m, i);
        bat[i] = mk(m, i);
        if (!one[i] || !bat[i]) return;
        if (pre && npre[i]) {
            /* the first turn alone in both, so the caches start equal */
            CHECK_OK(mi_session_prefill(one[i], pre[i], npre[i], NULL));
            CHECK_OK(mi_session_prefill(bat[i], pre[i], npre[i], NULL));
        }
    }
    /* one at a time: prefill, then greedy decode */
    for (int i = 0; i < ns; i++) {
        float *r = ref + (size_t)i * (steps + 1) * V;
        CHECK(mi_session_prefill(one[i], prompts[i], lens[i], r) == MI_STATUS_SUCCESS,
              "%s: single prefill %d: %s", what, i, mi_session_last_error(one[i]));
        for (int t = 0; t < steps; t++) {
            int32_t next = mi_argmax(r + (size_t)t * V, V);
            rtok[i * (steps + 1) + t] = next;
            CHECK_OK(mi_session_decode(one[i], &next, 1, r + (size_t)(t + 1) * V));
        }
        rtok[i * (steps + 1) + steps] = mi_argmax(r + (size_t)steps * V, V);
    }
    /* as a batch */
    mi_status st = mi_session_prefill_batch(bat, prompts, lens, (size_t)ns, got);
    CHECK(st == MI_STATUS_SUCCESS, "%s: prefill batch: %s", what, mi_session_last_error(bat[0]));
    if (st != MI_STATUS_SUCCESS) goto done;
    for (int t = 0; t <= steps; t++) {
        int32_t next[8];
        for (int i = 0; i < ns; i++) {
            const float *r = ref + ((size_t)i * (steps + 1) + t) * V;
            const double d = test_rel_l2(got + (size_t)i * V, r, V);
            CHECK(d < TOL, "%s: step %d, session %d (%zu tokens): logits differ by %g", what, t, i,
                  lens[i], d);
            next[i] = mi_argmax(got + (size_t)i * V, V);
            CHECK(next[i] == rtok[i * (steps + 1) + t],
                  "%s: step %d, session %d: token %d, alone %d", what, t, i, next[i],
                  rtok[i * (steps + 1) + t]);
            next[i] = rtok[i * (steps + 1) + t]; /* keep the sequences the same */
        }
        if (t == steps) break;
        st = mi_session_decode_batch(bat, next, (size_t)ns, got);
        CHECK(st == MI_STATUS_SUCCESS, "%s: decode batch: %s", what, mi_session_last_error(bat[0]));
        if (st != MI_STATUS_SUCCESS) goto done;
    }
    for (int i = 0; i < ns; i++) {
        CHECK_EQ(mi_session_n_past(bat[i]), mi_session_n_past(one[i]));
        mi_session_stats a, b;
        CHECK_OK(mi_session_stats_get(bat[i], &a));
        CHECK_OK(mi_session_stats_get(one[i], &b));
        CHECK_EQ(a.kv_rows, b.kv_rows);
    }
    /* over equal caches (forks of the single sessions), a decode batch is single decodes bit
     * for bit */
    {
        mi_session *fk[8];
        int32_t next[8];
        for (int i = 0; i < ns; i++) {
            CHECK_OK(mi_session_fork(one[i], &fk[i]));
            next[i] = rtok[i * (steps + 1) + steps];
        }
        CHECK_OK(mi_session_decode_batch(fk, next, (size_t)ns, got));
        for (int i = 0; i < ns; i++) {
            CHECK_OK(mi_session_decode(one[i], &next[i], 1, ref));
            CHECK(memcmp(ref, got + (size_t)i * V, sizeof(float) * (size_t)V) == 0,
                  "%s: decode batch over equal caches, session %d: not bit for bit (%g)", what, i,
                  test_rel_l2(got + (size_t)i * V, ref, V));
            mi_session_destroy(fk[i]);
        }
    }
done:
    for (int i = 0; i < ns; i++) {
        mi_session_destroy(one[i]);
        mi_session_destroy(bat[i]);
    }
    free(ref);
    free(got);
    free(rtok);
}

static mi_session *mk_dense(mi_model *m, int i) {
    (void)i;
    return open_kv(m, "dense");
}

static mi_session *mk_kv(mi_model *m, int i) {
    static const char *const specs[] = {"streamingllm:n_init=4,n_local=16",
                                        "snapkv:window_size=8,max_capacity_prompt=40",
                                        "quest:token_budget=32", NULL};
    if (i == 3) return open_dtype(m, MI_KV_BF16);
    return open_kv(m, specs[i]);
}

/* Every session of the batch as it was: its tokens and rows, and the same logits for the same
 * next token as a fork taken before the call. */
static void check_unchanged(mi_session **ss, mi_session **before, int ns, int V, const char *what) {
    float *a = fbuf((size_t)V), *b = fbuf((size_t)V);
    for (int i = 0; i < ns; i++) {
        CHECK_EQ(mi_session_n_past(ss[i]), mi_session_n_past(before[i]));
        mi_session_stats x, y;
        CHECK_OK(mi_session_stats_get(ss[i], &x));
        CHECK_OK(mi_session_stats_get(before[i], &y));
        CHECK(x.kv_rows == y.kv_rows, "%s: session %d has %lld rows, had %lld", what, i,
              (long long)x.kv_rows, (long long)y.kv_rows);
        if (mi_session_n_past(ss[i]) == 0) continue;
        const int32_t t = 7;
        CHECK_OK(mi_session_decode(ss[i], &t, 1, a));
        CHECK_OK(mi_session_decode(before[i], &t, 1, b));
        CHECK(memcmp(a, b, sizeof(float) * (size_t)V) == 0, "%s: session %d changed", what, i);
        CHECK_OK(mi_session_rewind(ss[i], 1));
        CHECK_OK(mi_session_rewind(before[i], 1));
    }
    free(a);
    free(b);
}

static void test_errors(mi_model *m, mi_model *other, const int32_t *tok) {
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab;
    mi_session *ss[3], *snap[3];
    for (int i = 0; i < 3; i++) {
        ss[i] = open_kv(m, "dense");
        CHECK_OK(mi_session_prefill(ss[i], tok + 10 * i, (size_t)(5 + 3 * i), NULL));
        CHECK_OK(mi_session_fork(ss[i], &snap[i]));
    }
    float *lg = fbuf((size_t)(3 * V));
    int32_t bad[40];
    memcpy(bad, tok, sizeof bad);
    bad[17] = V; /* outside the vocabulary, in the last member */
    const int32_t *tp[3] = {tok, tok + 50, bad};
    size_t np[3] = {40, 3, 40};

    CHECK_STATUS(mi_session_prefill_batch(ss, tp, np, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_session_last_error(ss[0]), "session 2") &&
              strstr(mi_session_last_error(ss[0]), "vocabulary"),
          "bad token: '%s'", mi_session_last_error(ss[0]));
    check_unchanged(ss, snap, 3, V, "a bad token");
    int32_t dt[3] = {1, 2, -1};
    CHECK_STATUS(mi_session_decode_batch(ss, dt, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    check_unchanged(ss, snap, 3, V, "a bad decode token");

    /* a session twice */
    mi_session *dup[3] = {ss[0], ss[1], ss[0]};
    CHECK_STATUS(mi_session_prefill_batch(dup, tp, np, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_session_last_error(ss[0]), "session 2 is session 0"), "dup: '%s'",
          mi_session_last_error(ss[0]));
    dt[2] = 3;
    CHECK_STATUS(mi_session_decode_batch(dup, dt, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    check_unchanged(ss, snap, 3, V, "a duplicate");

    /* another model's session */
    mi_session *o = open_kv(other, "dense");
    mi_session *mix[3] = {ss[0], o, ss[2]};
    CHECK_STATUS(mi_session_decode_batch(mix, dt, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_session_last_error(ss[2]), "another model"), "mix: '%s'",
          mi_session_last_error(ss[2]));
    CHECK(strstr(mi_session_last_error(o), "another model"), "mix: '%s'", mi_session_last_error(o));
    CHECK_EQ(mi_session_n_past(o), 0);
    check_unchanged(ss, snap, 3, V, "mixed models");
    mi_session_destroy(o);

    /* NULLs and empty members */
    mi_session *withnull[3] = {ss[0], NULL, ss[2]};
    CHECK_STATUS(mi_session_decode_batch(withnull, dt, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_session_last_error(ss[0]), "session 1 is NULL"), "null: '%s'",
          mi_session_last_error(ss[0]));
    CHECK_STATUS(mi_session_decode_batch(NULL, dt, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_session_decode_batch(ss, dt, 0, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_session_decode_batch(ss, NULL, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_session_prefill_batch(ss, NULL, np, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_session_prefill_batch(ss, tp, NULL, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    const int32_t *tnull[3] = {tok, NULL, tok};
    CHECK_STATUS(mi_session_prefill_batch(ss, tnull, np, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    size_t nzero[3] = {4, 0, 4};
    tp[2] = tok;
    CHECK_STATUS(mi_session_prefill_batch(ss, tp, nzero, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_session_last_error(ss[1]), "no tokens for session 1"), "empty: '%s'",
          mi_session_last_error(ss[1]));
    check_unchanged(ss, snap, 3, V, "NULLs");

    /* a member over its max_tokens */
    mi_session_params p = mi_session_default_params();
    p.max_tokens = 20;
    mi_session *small = NULL, *small_snap = NULL;
    CHECK_OK(mi_session_create(m, &p, &small));
    CHECK_OK(mi_session_prefill(small, tok, 10, NULL));
    CHECK_OK(mi_session_fork(small, &small_snap));
    mi_session *withcap[3] = {ss[0], ss[1], small}, *capsnap[3] = {snap[0], snap[1], small_snap};
    size_t ncap[3] = {4, 4, 11};
    CHECK_STATUS(mi_session_prefill_batch(withcap, tp, ncap, 3, lg), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_session_last_error(ss[0]), "max_tokens"), "cap: '%s'",
          mi_session_last_error(ss[0]));
    check_unchanged(withcap, capsnap, 3, V, "max_tokens");
    ncap[2] = 10; /* exactly up to it */
    CHECK_OK(mi_session_prefill_batch(withcap, tp, ncap, 3, lg));
    CHECK_EQ(mi_session_n_past(small), 20);
    mi_session_destroy(small);
    mi_session_destroy(small_snap);
    for (int i = 0; i < 3; i++) {
        mi_session_destroy(ss[i]);
        mi_session_destroy(snap[i]);
    }
    free(lg);
}

/* A pool too small for the batch: the call runs out inside the layers, cleanly, and no session
 * keeps a row of it (the pool's pages in use are those of before; no forks here, which would
 * make the sessions' shared last pages private copies). */
static void test_out_of_memory(const mi_model_shape *sh, const int32_t *tok) {
    mi_model *m = test_random_model(sh, 31);
    if (!m) return;
    mi_model_info info;
    mi_model_get_info(m, &info);
    const int V = info.vocab;
    mi_session_params p = mi_session_default_params();
    /* a 64-token page: 64 rows * 2 heads * 32 * 2 (K, V) * 4 bytes, plus Quest's key bounds
     * (2 heads * 2 * 32 floats) */
    const uint64_t page = 64 * 2 * 32 * 2 * 4 + 2 * 2 * 32 * 4;
    p.pool_bytes = 14 * page;
    mi_session *ss[3];
    for (int i = 0; i < 3; i++) {
        CHECK_OK(mi_session_create(m, &p, &ss[i]));
        CHECK_OK(mi_session_prefill(ss[i], tok, 3, NULL));
    }
    mi_session_stats before, after;
    CHECK_OK(mi_session_stats_get(ss[0], &before));
    CHECK_EQ(before.pool_used_bytes, 6 * page);
    const int32_t *tp[3] = {tok, tok + 1, tok + 2};
    /* 1 + 3 + 4 pages per layer, 2 layers: 16 pages, over 14 */
    size_t np[3] = {60, 130, 200};
    float *lg = fbuf((size_t)(3 * V)), *a = fbuf((size_t)V), *b = fbuf((size_t)V);
    CHECK_STATUS(mi_session_prefill_batch(ss, tp, np, 3, lg), MI_STATUS_OUT_OF_MEMORY);
    CHECK(strstr(mi_session_last_error(ss[1]), "prefill batch"), "oom: '%s'",
          mi_session_last_error(ss[1]));
    CHECK_OK(mi_session_stats_get(ss[0], &after));
    CHECK_EQ(after.pool_used_bytes, before.pool_used_bytes);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(mi_session_n_past(ss[i]), 3);
        /* the next token's logits are those of a session that never saw the failed call */
        mi_session *ref = NULL;
        CHECK_OK(mi_session_create(m, &p, &ref));
        const int32_t t = 7;
        CHECK_OK(mi_session_prefill(ref, tok, 3, NULL));
        CHECK_OK(mi_session_decode(ref, &t, 1, b));
        CHECK_OK(mi_session_decode(ss[i], &t, 1, a));
        CHECK(memcmp(a, b, sizeof(float) * (size_t)V) == 0, "out of memory: session %d changed", i);
        CHECK_OK(mi_session_rewind(ss[i], 1));
        mi_session_destroy(ref);
    }
    /* a batch that fits still runs */
    np[1] = 20, np[2] = 20;
    CHECK_OK(mi_session_prefill_batch(ss, tp, np, 3, lg));
    for (int i = 0; i < 3; i++) mi_session_destroy(ss[i]);
    free(lg);
    free(a);
    free(b);
    mi_model_destroy(m);
}

static void test_random(void) {
    mi_model_shape sh = test_small_shape();
    int32_t tok[600];
    test_byte_tokens(tok, 600, 17);
    mi_model *m = test_random_model(&sh, 5), *other = test_random_model(&sh, 6);
    if (!m || !other) return;
    /* lengths: not multiples of 64, one token, one under the decode-path threshold */
    const int32_t *prompts[4] = {tok, tok + 200, tok + 300, tok + 400};
    size_t lens[4] = {130, 1, 77, 20};
    for (int mode = 0; mode < 2; mode++) {
        CHECK_OK(mi_model_set_attention(m, mode ? MI_ATTN_A_SHAPE : MI_ATTN_DENSE, NULL, 0));
        compare(m, 3, mk_dense, NULL, NULL, prompts, lens, 4, mode ? "a-shape" : "dense");
    }
    CHECK_OK(mi_model_set_attention(m, MI_ATTN_DENSE, NULL, 0));
    compare(m, 4, mk_kv, NULL, NULL, prompts, lens, 5, "kv methods");
    /* continuations: a first turn, then one of >= 32 tokens (prefill at an offset), one of one
     * token and one of a few (the decode path) in one batch */
    const int32_t *pre[4] = {tok + 500, tok + 510, tok + 520, tok + 530};
    size_t npre[4] = {70, 9, 1, 40};
    size_t clens[4] = {45, 1, 6, 33};
    compare(m, 3, mk_dense, pre, npre, prompts, clens, 3, "continuations");
    compare(m, 4, mk_kv, pre, npre, prompts, clens, 3, "continuations with kv methods");
    /* one session is a batch too */
    compare(m, 1, mk_dense, NULL, NULL, prompts, lens, 2, "one session");
    /* 8 decode rows: still the GEMV path */
    const int32_t *p8[8];
    size_t l8[8];
    for (int i = 0; i < 8; i++) p8[i] = tok + 37 * i, l8[i] = (size_t)(1 + 9 * i);
    compare(m, 8, mk_dense, NULL, NULL, p8, l8, 2, "eight sessions");
    test_errors(m, other, tok);
    test_out_of_memory(&sh, tok);
    mi_model_destroy(m);
    mi_model_destroy(other);
}

/* mim_dot_rows (a weight row against several decode rows, the batch's GEMV) equals
 * mim_dot_row on each x row bit for bit, and a float64 dot of the dequantised row to rounding,
 * for the formats it unpacks once (Q4_0, Q4_1, Q8_0) and one it does not (F32). */
static void test_dot_rows(void) {
    const int64_t n = 256;
    const uint32_t types[] = {MIM_TYPE_Q4_0, MIM_TYPE_Q4_1, MIM_TYPE_Q8_0, MIM_TYPE_F32};
    uint64_t seed = 99;
    unsigned char row[1024];
    float x[9 * 256], w[256], out[9];
    for (int64_t i = 0; i < 9 * n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 40) / (double)(1 << 24) - 0.5);
    }
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const uint32_t type = types[t];
        uint64_t bytes = 0;
        CHECK(mim_type_row_bytes(type, (uint64_t)n, &bytes) && bytes <= sizeof row, "type %u",
              type);
        for (uint64_t i = 0; i < bytes; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            row[i] = (unsigned char)(seed >> 56);
        }
        if (type == MIM_TYPE_F32) /* finite floats */
            for (int64_t i = 0; i < n; i++) ((float *)(void *)row)[i] = x[i] * 3.0f;
        else /* small finite fp16 scales (and Q4_1 minimums): 0x2c00..0x2fff is 1/16..1/8 */
            for (uint64_t b = 0; b < bytes; b += type == MIM_TYPE_Q4_1   ? 20
                                                 : type == MIM_TYPE_Q8_0 ? 34
                                                                         : 18) {
                row[b + 1] = (unsigned char)(0x2c | (row[b + 1] & 3));
                if (type == MIM_TYPE_Q4_1) row[b + 3] = (unsigned char)(0xac | (row[b + 3] & 3));
            }
        mim_dequant_row(type, row, w, n);
        for (int nx = 1; nx <= 9; nx++) {
            mim_dot_rows(type, row, x, n, nx, n, out);
            for (int i = 0; i < nx; i++) {
                const float one = mim_dot_row(type, row, x + i * n, n);
                CHECK(memcmp(&one, &out[i], sizeof one) == 0,
                      "type %u, %d rows, row %d: %.9g != %.9g", type, nx, i, out[i], one);
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < n; k++) {
                    ref += (double)w[k] * x[i * n + k];
                    mag += fabs((double)w[k] * x[i * n + k]);
                }
                CHECK(fabs(out[i] - ref) <= 1e-5 * mag + 1e-6, "type %u: %g, float64 %g", type,
                      out[i], ref);
            }
        }
    }
}

static void test_smollm2(const char *path) {
    mi_model_params p = mi_model_default_params();
    p.n_threads = 2;
    mi_model *m = NULL;
    if (mi_model_load(test_ctx(), path, &p, &m) != MI_STATUS_SUCCESS) {
        CHECK(0, "load %s: %s", path, TEST_ERR);
        return;
    }
    const char *texts[3] = {
        "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and "
        "Berlin is the capital of Germany. Rome is the capital of Italy, Madrid the capital of "
        "Spain and Lisbon the capital of Portugal. Vienna is the capital of Austria, Bern the "
        "capital of Switzerland and Brussels the capital of Belgium. The capital of the "
        "Netherlands is",
        "Hello",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
        "        return n\n    return"};
    int32_t tok[3][256];
    const int32_t *tp[3];
    size_t lens[3];
    for (int i = 0; i < 3; i++) {
        CHECK_OK(mi_model_tokenize(m, texts[i], strlen(texts[i]), i != 1 ? -1 : 0, 1, tok[i], 256,
                                   &lens[i]));
        tp[i] = tok[i];
    }
    CHECK(lens[1] == 1 && lens[0] > 64 && lens[0] % 64 && lens[2] % 64, "lengths %zu %zu %zu",
          lens[0], lens[1], lens[2]);
    compare(m, 3, mk_dense, NULL, NULL, tp, lens, 6, "SmolLM2");
    mi_model_destroy(m);
}

int main(void) {
    char *path = test_find_model();
    test_dot_rows();
    test_random();
    if (path)
        test_smollm2(path);
    else
        printf("SmolLM2 not installed: its part skipped\n");
    free(path);
    return check_finish("model.batch");
}
