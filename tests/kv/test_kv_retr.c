/*
 * test_kv_retr.c: RetrievalAttention's index and merge (src/kv/kv_retr.h) on seeded data.
 *
 *  - exact top-k against a float64 sort; the index's top-k recall against brute force on
 *    clustered keys with queries from another distribution (the case the query calibration is
 *    for), and the scan it needed;
 *  - the log-sum-exp merge of two disjoint parts against float64 softmax over their union;
 *  - top-k >= the indexed keys: static part + retrieval equals dense attention;
 *  - adds, clones, refusals;
 *  - the retr_attn method on a paged sequence: per decode step and head, the rows it selects are
 *    the sinks, the brute-force top-k of the indexed rows (recall target 1: the scan is exact)
 *    and every row after them; rows leaving the window join the index; a rewind into indexed
 *    rows falls back to every row; a fork selects what its parent does.
 *
 * `test_kv_retr --bench N D K` times the build and search on N keys of D channels.
 */
#include "../../src/kv/kv_method.h"
#include "../../src/kv/kv_retr.h"
#include "minference_kv.h"

#include "../check.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rs = 1;
static double urand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(rs >> 11) + 0.5) / 9007199254740992.0;
}
static double nrand(void) { return sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand()); }

/* Keys: a mixture of n_clusters Gaussians around a common offset; queries: another offset and
 * spread, so that queries and keys follow different distributions (as in attention). */
static void make_data(float *keys, int64_t n, float *queries, int64_t nq, int32_t d, int clusters) {
    double *cent = malloc(sizeof(double) * (size_t)(clusters * d));
    for (int64_t i = 0; i < clusters * d; i++) cent[i] = 1.5 * nrand();
    for (int64_t i = 0; i < n; i++) {
        const int c = (int)(urand() * clusters);
        for (int32_t k = 0; k < d; k++)
            keys[i * d + k] = (float)(cent[c * d + k] + 0.7 * nrand() + (k < 4 ? 3.0 : 0.0));
    }
    for (int64_t i = 0; i < nq; i++) {
        const int c = (int)(urand() * clusters);
        for (int32_t k = 0; k < d; k++)
            queries[i * d + k] = (float)(0.6 * cent[c * d + k] + 1.2 * nrand() - (k < 4 ? 2.0 : 0));
    }
    free(cent);
}

static double ddot(const float *a, const float *b, int32_t d) {
    double s = 0;
    for (int32_t i = 0; i < d; i++) s += (double)a[i] * b[i];
    return s;
}

static int cmp_desc(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : (x < y);
}

static void test_exact_topk(void) {
    rs = check_seed = 11;
    enum { N = 700, D = 24 };
    float *keys = malloc(sizeof(float) * N * D), q[D];
    for (int i = 0; i < N * D; i++) keys[i] = (float)nrand();
    for (int i = 0; i < D; i++) q[i] = (float)nrand();
    double *all = malloc(sizeof(double) * N);
    for (int i = 0; i < N; i++) all[i] = ddot(keys + i * D, q, D);
    qsort(all, N, sizeof(double), cmp_desc);
    const int ks[] = {1, 7, 100, N, N + 5};
    for (int t = 0; t < 5; t++) {
        int64_t ids[N + 5];
        float sc[N + 5];
        const int64_t got = kv_retr_exact_topk(keys, N, D, D, 1000, q, ks[t], ids, sc);
        CHECK_EQ(got, ks[t] < N ? ks[t] : N);
        bool seen[N] = {false};
        double lo = INFINITY;
        for (int64_t i = 0; i < got; i++) {
            CHECK(ids[i] >= 1000 && ids[i] < 1000 + N, "id %lld", (long long)ids[i]);
            if (ids[i] < 1000 || ids[i] >= 1000 + N) continue;
            CHECK(!seen[ids[i] - 1000], "id twice");
            seen[ids[i] - 1000] = true;
            CHECK_NEAR(sc[i], ddot(keys + (ids[i] - 1000) * D, q, D), 1e-4);
            lo = sc[i] < lo ? sc[i] : lo;
        }
        /* the k-th largest score of the float64 sort is the smallest kept (within rounding) */
        CHECK_NEAR(lo, all[got - 1], 1e-4);
    }
    free(keys);
    free(all);
    check_seed = 0;
}

/* Mean recall of the index's top-k on held-out queries against brute force. */
static double recall(const kv_retr_index *ix, const float *keys, int64_t n, int32_t d,
                     const float *qs, int64_t nq, int32_t k) {
    int64_t *a = malloc(sizeof(int64_t) * (size_t)k), *b = malloc(sizeof(int64_t) * (size_t)k);
    float *sa = malloc(sizeof(float) * (size_t)k), *sb = malloc(sizeof(float) * (size_t)k);
    float *scratch = malloc(sizeof(float) * kv_retr_scratch_floats(ix));
    char *mark = calloc((size_t)n, 1);
    double tot = 0;
    for (int64_t i = 0; i < nq; i++) {
        const float *q = qs + i * d;
        const int64_t ga = kv_retr_exact_topk(keys, n, d, d, 0, q, k, a, sa);
        const int64_t gb = kv_retr_search(ix, q, k, b, sb, scratch);
        CHECK_EQ(gb, ga);
        for (int64_t j = 0; j < ga; j++) mark[a[j]] = 1;
        int64_t hit = 0;
        for (int64_t j = 0; j < gb; j++) {
            if (b[j] < 0 || b[j] >= n) {
                CHECK(0, "id %lld out of range", (long long)b[j]);
                continue;
            }
            hit += mark[b[j]];
            /* a retrieved score is the exact q.k of that key */
            CHECK(fabs(sb[j] - ddot(keys + b[j] * d, q, d)) < 1e-3, "score of %lld",
                  (long long)b[j]);
        }
        for (int64_t j = 0; j < ga; j++) mark[a[j]] = 0;
        tot += (double)hit / (double)ga;
    }
    free(a);
    free(b);
    free(sa);
    free(sb);
    free(scratch);
    free(mark);
    return tot / (double)nq;
}

static void test_recall(void) {
    rs = check_seed = 21;
    enum { N = 8192, D = 64, NQ = 64, NT = 200, K = 100 };
    float *keys = malloc(sizeof(float) * N * D), *qs = malloc(sizeof(float) * (NQ + NT) * D);
    make_data(keys, N, qs, NQ + NT, D, 40);
    kv_retr_params p = kv_retr_default_params();
    kv_retr_index *ix = kv_retr_build(keys, N, D, D, 0, qs, NQ, D, K, &p);
    CHECK(ix != NULL, "build");
    if (!ix) return;
    CHECK_EQ(kv_retr_size(ix), N);
    CHECK_EQ(kv_retr_lists(ix), (N + p.list_size - 1) / p.list_size);
    const int64_t scan = kv_retr_scan_keys(ix, K);
    const double r = recall(ix, keys, N, D, qs + NQ * D, NT, K);
    printf("index over %d keys (d %d, %lld lists): top-%d recall %.3f on held-out queries, "
           "scanning %lld keys (%.1f%%)\n",
           N, D, (long long)kv_retr_lists(ix), K, r, (long long)scan, 100.0 * scan / N);
    CHECK(r >= 0.85, "recall %.3f", r);
    CHECK(scan < N, "the calibration scans everything");
    /* without query samples the index scans everything: exact */
    kv_retr_index *flat = kv_retr_build(keys, N, D, D, 0, NULL, 0, 0, K, &p);
    CHECK(flat && kv_retr_scan_keys(flat, K) == N, "uncalibrated index is not exhaustive");
    if (flat) CHECK(recall(flat, keys, N, D, qs + NQ * D, 20, K) == 1.0, "exhaustive recall");
    kv_retr_free(flat);
    /* a higher target scans at least as much */
    p.target_recall = 0.99f;
    kv_retr_index *hi = kv_retr_build(keys, N, D, D, 0, qs, NQ, D, K, &p);
    CHECK(hi && kv_retr_scan_keys(hi, K) >= scan, "target 0.99 scans less than 0.95");
    kv_retr_free(hi);

    /* the clone answers the same; adds are found */
    kv_retr_index *c = kv_retr_clone(ix);
    CHECK(c != NULL, "clone");
    if (c) {
        CHECK(fabs(recall(c, keys, N, D, qs + NQ * D, 20, K) -
                   recall(ix, keys, N, D, qs + NQ * D, 20, K)) == 0,
              "clone differs");
        float far[D];
        for (int k = 0; k < D; k++) far[k] = 50.0f * qs[NQ * D + k]; /* the best key for q0 */
        CHECK(kv_retr_add(c, far, N), "add");
        CHECK_EQ(kv_retr_size(c), N + 1);
        CHECK_EQ(kv_retr_size(ix), N);
        int64_t ids[K];
        float sc[K];
        float *scratch = malloc(sizeof(float) * kv_retr_scratch_floats(c));
        kv_retr_search(c, qs + NQ * D, K, ids, sc, scratch);
        bool found = false;
        for (int j = 0; j < K; j++) found |= ids[j] == N;
        CHECK(found, "an added key is not retrieved");
        free(scratch);
        kv_retr_free(c);
    }
    kv_retr_free(ix);
    /* refusals */
    CHECK(kv_retr_build(keys, N, D, 0, 0, NULL, 0, 0, K, NULL) == NULL, "d 0");
    CHECK(kv_retr_build(NULL, 5, D, D, 0, NULL, 0, 0, K, NULL) == NULL, "no keys");
    p = kv_retr_default_params();
    p.list_size = 0;
    CHECK(kv_retr_build(keys, N, D, D, 0, NULL, 0, 0, K, &p) == NULL, "list_size 0");
    kv_retr_index *empty = kv_retr_build(NULL, 0, D, D, 0, NULL, 0, 0, K, NULL);
    CHECK(empty && kv_retr_size(empty) == 0, "empty index");
    if (empty) {
        float scratch[16];
        int64_t ids[1];
        float sc[1];
        CHECK_EQ(kv_retr_search(empty, qs, 1, ids, sc, scratch), 0);
        CHECK(kv_retr_add(empty, keys, 3), "add to empty");
        CHECK_EQ(kv_retr_search(empty, qs, 1, ids, sc, scratch), 1);
        CHECK_EQ(ids[0], 3);
    }
    kv_retr_free(empty);
    free(keys);
    free(qs);
    check_seed = 0;
}

/* float64 softmax attention of q over rows idx of keys / vals: out[d]. */
static void ref_attention(const float *q, const float *keys, const float *vals, const int64_t *idx,
                          int64_t n, int32_t d, double scale, double *out) {
    double mx = -INFINITY, sum = 0;
    double *s = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        s[i] = ddot(keys + idx[i] * d, q, d) * scale;
        mx = s[i] > mx ? s[i] : mx;
    }
    for (int32_t k = 0; k < d; k++) out[k] = 0;
    for (int64_t i = 0; i < n; i++) {
        const double w = exp(s[i] - mx);
        sum += w;
        for (int32_t k = 0; k < d; k++) out[k] += w * vals[idx[i] * d + k];
    }
    for (int32_t k = 0; k < d; k++) out[k] /= sum;
    free(s);
}

/* Partial attention over the rows idx (float, as the method computes it). */
static void part(const float *q, const float *keys, const float *vals, const int64_t *idx,
                 int64_t n, int32_t d, float scale, float *out, double *lse) {
    float *s = malloc(sizeof(float) * (size_t)(n ? n : 1));
    const float **v = malloc(sizeof(float *) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        s[i] = (float)ddot(keys + idx[i] * d, q, d) * scale;
        v[i] = vals + idx[i] * d;
    }
    kv_retr_partial(s, n, v, d, out, lse);
    free(s);
    free(v);
}

static void test_merge(void) {
    rs = check_seed = 31;
    enum { N = 3000, D = 64 };
    float *keys = malloc(sizeof(float) * N * D), *vals = malloc(sizeof(float) * N * D), q[D];
    for (int i = 0; i < N * D; i++) {
        keys[i] = (float)(2.0 * nrand());
        vals[i] = (float)nrand();
    }
    for (int i = 0; i < D; i++) q[i] = (float)(2.0 * nrand());
    const float scale = 1.0f / sqrtf((float)D);
    int64_t *a = malloc(sizeof(int64_t) * N), *b = malloc(sizeof(int64_t) * N);
    int64_t *all = malloc(sizeof(int64_t) * N);
    for (int trial = 0; trial < 20; trial++) {
        int64_t na = 0, nb = 0;
        const double pa = trial == 0 ? 1.0 : (trial == 1 ? 0.0 : urand());
        for (int64_t i = 0; i < N; i++) {
            all[i] = i;
            if (urand() < pa)
                a[na++] = i;
            else
                b[nb++] = i;
        }
        float oa[D], ob[D], o[D];
        double la, lb, l, ref[D];
        part(q, keys, vals, a, na, D, scale, oa, &la);
        part(q, keys, vals, b, nb, D, scale, ob, &lb);
        kv_retr_merge(oa, la, ob, lb, D, o, &l);
        ref_attention(q, keys, vals, all, N, D, scale, ref);
        double err = 0, mag = 0;
        for (int k = 0; k < D; k++) {
            err = fmax(err, fabs(o[k] - ref[k]));
            mag = fmax(mag, fabs(ref[k]));
        }
        CHECK(err <= 1e-5 * fmax(mag, 1e-3), "trial %d (%lld + %lld keys): merge off by %g", trial,
              (long long)na, (long long)nb, err);
        /* the merged lse is the union's */
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < N; i++) mx = fmax(mx, ddot(keys + i * D, q, D) * scale);
        for (int64_t i = 0; i < N; i++) sum += exp(ddot(keys + i * D, q, D) * scale - mx);
        CHECK_NEAR(l, mx + log(sum), 1e-4);
        /* in place */
        kv_retr_merge(oa, la, ob, lb, D, oa, &la);
        CHECK(memcmp(oa, o, sizeof o) == 0, "in-place merge differs");
    }
    free(a);
    free(b);
    free(all);
    free(keys);
    free(vals);
    check_seed = 0;
}

/* A decode step as the method runs it: static part (sinks + window) and the top-k of an index
 * over the middle, merged; with top-k covering the middle it is dense attention. */
static void test_dense_when_covered(void) {
    rs = check_seed = 41;
    enum { N = 2000, D = 64, S = 16, W = 128, NQ = 8 };
    float *keys = malloc(sizeof(float) * N * D), *vals = malloc(sizeof(float) * N * D);
    float *qs = malloc(sizeof(float) * NQ * D);
    make_data(keys, N, qs, NQ, D, 10);
    for (int i = 0; i < N * D; i++) vals[i] = (float)nrand();
    const float scale = 1.0f / sqrtf((float)D);
    const int64_t mid = N - S - W;
    const int32_t ks[] = {(int32_t)mid, (int32_t)mid + 100, 50};
    for (int t = 0; t < 3; t++) {
        kv_retr_index *ix = kv_retr_build(keys + S * D, mid, D, D, S, qs, NQ, D, ks[t], NULL);
        CHECK(ix != NULL, "build");
        if (!ix) continue;
        int64_t *ids = malloc(sizeof(int64_t) * (size_t)ks[t]), st[S + W], all[N];
        float *sc = malloc(sizeof(float) * (size_t)ks[t]);
        float *scratch = malloc(sizeof(float) * kv_retr_scratch_floats(ix));
        for (int i = 0; i < S; i++) st[i] = i;
        for (int i = 0; i < W; i++) st[S + i] = N - W + i;
        for (int i = 0; i < N; i++) all[i] = i;
        double max_err = 0;
        for (int iq = 0; iq < NQ; iq++) {
            const float *q = qs + iq * D;
            const int64_t got = kv_retr_search(ix, q, ks[t], ids, sc, scratch);
            float os[D], orr[D], o[D];
            double ls, lr, l, ref[D];
            part(q, keys, vals, st, S + W, D, scale, os, &ls);
            part(q, keys, vals, ids, got, D, scale, orr, &lr);
            kv_retr_merge(os, ls, orr, lr, D, o, &l);
            if (ks[t] >= mid) {
                CHECK_EQ(got, mid);
                ref_attention(q, keys, vals, all, N, D, scale, ref);
                for (int k = 0; k < D; k++) max_err = fmax(max_err, fabs(o[k] - ref[k]));
            } else {
                /* the union of the static part and the retrieved keys, in float64 */
                int64_t *u = malloc(sizeof(int64_t) * (size_t)(S + W + got));
                memcpy(u, st, sizeof st);
                memcpy(u + S + W, ids, sizeof(int64_t) * (size_t)got);
                ref_attention(q, keys, vals, u, S + W + got, D, scale, ref);
                for (int k = 0; k < D; k++) max_err = fmax(max_err, fabs(o[k] - ref[k]));
                free(u);
            }
        }
        CHECK(max_err < 2e-6, "top-k %d: off by %g", ks[t], max_err);
        kv_retr_free(ix);
        free(ids);
        free(sc);
        free(scratch);
    }
    free(keys);
    free(vals);
    free(qs);
    check_seed = 0;
}

/* Appends rows [n, n_kv * d] of K (V: the same) to every layer. */
static void append_rows(mi_kv_seq *seq, int32_t layers, const float *k, int64_t n, int32_t n_kv,
                        int32_t d) {
    mi_tensor t = mi_tensor_blhd((void *)k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, n_kv, n, d);
    for (int32_t l = 0; l < layers; l++) CHECK_OK(mi_kv_seq_append(seq, l, &t, &t));
}

/* The spans of list i of a selection, as a row mask over [0, end). */
static void spans_mask(const kv_selection *sel, int64_t i, int64_t end, char *mask) {
    memset(mask, 0, (size_t)end);
    for (int64_t s = sel->offsets[i]; s < sel->offsets[i + 1]; s++)
        for (int64_t r = sel->spans[2 * s]; r < sel->spans[2 * s + 1] && r < end; r++) mask[r] = 1;
}

static void test_method(void) {
    rs = check_seed = 51;
    enum { L = 2, NH = 4, NKV = 2, D = 16, N0 = 900, NI = 8, NL = 40, TOPK = 30 };
    const int32_t group = NH / NKV;
    mi_kv_pool_params pp = mi_kv_pool_default_params();
    pp.n_layers = L;
    pp.n_kv_heads = NKV;
    pp.head_dim = D;
    mi_kv_pool *pool = NULL;
    mi_kv_seq *seq = NULL;
    CHECK_OK(mi_kv_pool_create(NULL, &pp, &pool));
    CHECK_OK(mi_kv_seq_create(pool, &seq));
    const int64_t total = N0 + 5;
    float *k = malloc(sizeof(float) * (size_t)(total * NKV * D));
    float *q = malloc(sizeof(float) * (size_t)(total * NH * D));
    for (int64_t i = 0; i < total * NKV * D; i++) k[i] = (float)nrand();
    for (int64_t i = 0; i < total * NH * D; i++) q[i] = (float)(1.5 * nrand());
    char text[160], err[256];
    snprintf(text, sizeof text, "retr_attn:top_k=%d,n_init=%d,n_local=%d,list_size=16,recall=1",
             TOPK, NI, NL);
    kv_spec spec;
    CHECK_OK(kv_spec_parse(text, &spec, err, sizeof err));
    const kv_geometry geo = {L, NH, NKV, D, 64};
    kv_method *m = NULL;
    CHECK_OK(kv_method_create(&spec, &geo, &m, err, sizeof err));
    if (!m) return;
    CHECK_EQ(m->q_rows, 64);
    /* the prompt, then its hooks as the forward pass calls them */
    append_rows(seq, L, k, N0, NKV, D);
    kv_method_appended(m, N0);
    for (int32_t l = 0; l < L; l++) {
        CHECK_OK(kv_method_after_prefill(m, seq, l, q + (N0 - 64) * NH * D, 64));
        CHECK_OK(kv_method_after_append(m, seq, l, N0));
    }
    char *mask = malloc((size_t)total), *want = malloc((size_t)total);
    int64_t ids[TOPK];
    float sc[TOPK];
    kv_selection sel;
    kv_selection_init(&sel);
    kv_method *fork = NULL;
    for (int64_t step = 0; step < 5; step++) {
        const int64_t rows = N0 + step + 1, boundary = N0 + step - NL;
        append_rows(seq, L, k + (rows - 1) * NKV * D, 1, NKV, D);
        if (step == 3) CHECK_OK(kv_method_clone(m, &fork, err, sizeof err));
        for (int32_t l = 0; l < L; l++) {
            const float *qr = q + (rows - 1) * NH * D;
            CHECK_OK(kv_method_select(m, seq, l, qr, 1, &sel));
            CHECK_EQ(sel.n_lists, NH);
            kv_selection fs;
            kv_selection_init(&fs);
            if (fork) {
                CHECK_OK(kv_method_select(fork, seq, l, qr, 1, &fs));
                CHECK(fs.n_spans == sel.n_spans &&
                          memcmp(fs.spans, sel.spans, sizeof(int64_t) * 2 * (size_t)sel.n_spans) ==
                              0,
                      "the fork selects otherwise");
            }
            kv_selection_free(&fs);
            for (int32_t h = 0; h < NH; h++) {
                spans_mask(&sel, h, rows, mask);
                /* brute force: sinks, the top-k of rows NI..boundary-1 by q.k, the rest after */
                memset(want, 0, (size_t)rows);
                for (int64_t r = 0; r < NI; r++) want[r] = 1;
                for (int64_t r = boundary; r < rows; r++) want[r] = 1;
                float *keys = malloc(sizeof(float) * (size_t)((boundary - NI) * D));
                for (int64_t r = NI; r < boundary; r++)
                    memcpy(keys + (r - NI) * D, k + (r * NKV + h / group) * D, sizeof(float) * D);
                const int64_t got =
                    kv_retr_exact_topk(keys, boundary - NI, D, D, NI, qr + h * D, TOPK, ids, sc);
                for (int64_t t = 0; t < got; t++) want[ids[t]] = 1;
                free(keys);
                CHECK(memcmp(mask, want, (size_t)rows) == 0,
                      "step %lld layer %d head %d: selected rows differ from brute force",
                      (long long)step, l, h);
            }
        }
        kv_method_appended(m, 1);
        if (fork) kv_method_appended(fork, 1);
        for (int32_t l = 0; l < L; l++) {
            CHECK_OK(kv_method_after_append(m, seq, l, 1));
            if (fork) CHECK_OK(kv_method_after_append(fork, seq, l, 1));
        }
    }
    /* a rewind into the indexed rows: every row is read, until the index is rebuilt */
    CHECK_OK(mi_kv_seq_truncate(seq, MI_KV_ALL_LAYERS, 300));
    kv_method_rewound(m, total - 300);
    append_rows(seq, L, k + 300 * NKV * D, 1, NKV, D);
    CHECK_OK(kv_method_select(m, seq, 0, q, 1, &sel));
    CHECK(sel.offsets[1] == 1 && sel.spans[0] == 0 && sel.spans[1] == 301, "after a rewind");
    CHECK_OK(kv_method_after_append(m, seq, 0, 1));
    CHECK_OK(kv_method_select(m, seq, 0, q, 1, &sel));
    CHECK(sel.offsets[1] > 2, "no index rebuilt after the rewind");
    /* another cache of the same length in its place (a session load): every row, then a new
     * index */
    CHECK_OK(mi_kv_seq_truncate(seq, MI_KV_ALL_LAYERS, 0));
    for (int64_t i = 0; i < 301 * NKV * D; i++) k[i] = (float)nrand();
    append_rows(seq, L, k, 301, NKV, D);
    append_rows(seq, L, k + 301 * NKV * D, 1, NKV, D);
    CHECK_OK(kv_method_select(m, seq, 0, q, 1, &sel));
    CHECK(sel.offsets[1] == 1 && sel.spans[0] == 0 && sel.spans[1] == 302, "after a load");
    CHECK_OK(kv_method_after_append(m, seq, 0, 1));
    CHECK_OK(kv_method_select(m, seq, 0, q, 1, &sel));
    CHECK(sel.offsets[1] > 2, "no index rebuilt after the load");
    kv_selection_free(&sel);
    kv_method_destroy(m);
    kv_method_destroy(fork);
    mi_kv_seq_destroy(seq);
    mi_kv_pool_destroy(pool);
    free(k);
    free(q);
    free(mask);
    free(want);
    check_seed = 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench(int64_t n, int32_t d, int32_t k) {
    rs = 5;
    float *keys = malloc(sizeof(float) * (size_t)(n * d)), *qs = malloc(sizeof(float) * 264 * d);
    make_data(keys, n, qs, 264, d, 64);
    double t0 = now_s();
    kv_retr_index *ix = kv_retr_build(keys, n, d, d, 0, qs, 64, d, k, NULL);
    const double tb = now_s() - t0;
    float *scratch = malloc(sizeof(float) * kv_retr_scratch_floats(ix));
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)k);
    float *sc = malloc(sizeof(float) * (size_t)k);
    t0 = now_s();
    for (int i = 0; i < 200; i++) kv_retr_search(ix, qs + (64 + i) * d, k, ids, sc, scratch);
    const double ts = (now_s() - t0) / 200;
    t0 = now_s();
    for (int i = 0; i < 200; i++)
        kv_retr_exact_topk(keys, n, d, d, 0, qs + (64 + i) * d, k, ids, sc);
    const double te = (now_s() - t0) / 200;
    const double r = recall(ix, keys, n, d, qs + 64 * d, 200, k);
    printf("n %lld d %d k %d: build %.3f s, %lld lists, scan %lld keys; search %.3f ms (exact "
           "%.3f ms); recall %.3f\n",
           (long long)n, d, k, tb, (long long)kv_retr_lists(ix),
           (long long)kv_retr_scan_keys(ix, k), ts * 1e3, te * 1e3, r);
    kv_retr_free(ix);
    free(keys);
    free(qs);
    free(scratch);
    free(ids);
    free(sc);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--bench") == 0)
        return bench(atoll(argv[2]), atoi(argv[3]), atoi(argv[4]));
    test_exact_topk();
    test_recall();
    test_merge();
    test_dense_when_covered();
    test_method();
    return check_finish("kv.retr");
}
