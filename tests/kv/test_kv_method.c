/*
 * test_kv_method.c: the KV-method framework (src/kv/kv_method.h) and the cache operation the
 * methods build on (mi_kv_seq_compact).
 *
 *  - specs: every method's defaults, given values, round trip through the formatter, and every
 *    kind of bad input (unknown name / key, not a number, not an integer, out of range, bad
 *    choice, a key twice, no '=') refused with a message naming the problem; the methods not
 *    built refuse with MI_STATUS_UNSUPPORTED;
 *  - compaction against a contiguous reference: random per-head subsets over several page sizes
 *    and dtypes, the untouched prefix pages kept (same ids), a forked parent unchanged (pages
 *    another sequence holds are never written), bad subsets and a full pool refused with the
 *    sequence unchanged, every page back in the pool at the end;
 *  - each method's rule against a float64 / brute-force reference: SnapKV's pooled window scores
 *    and top rows, PyramidKV's layer budgets, Quest's page bound (>= every q.k of the page) and
 *    its choice of pages, StreamingLLM's sinks + window; and for each, a budget covering
 *    everything selects everything.
 */
#include "../../src/kv/kv_method.h"
#include "kv_test_util.h"

#include <stdio.h>

static kv_spec parse_ok(const char *text) {
    kv_spec s;
    char err[256];
    mi_status st = kv_spec_parse(text, &s, err, sizeof err);
    CHECK(st == MI_STATUS_SUCCESS, "'%s': %s", text, err);
    return s;
}

static void parse_bad(const char *text, const char *needle) {
    kv_spec s;
    char err[512] = "";
    mi_status st = kv_spec_parse(text, &s, err, sizeof err);
    CHECK(st == MI_STATUS_INVALID_ARGUMENT, "'%s' was accepted", text);
    CHECK(strstr(err, needle) != NULL, "'%s': message '%s' does not mention '%s'", text, err,
          needle);
}

static void test_specs(void) {
    kv_spec s = parse_ok(NULL);
    CHECK(s.entry == &kv_method_dense_entry, "NULL is dense");
    s = parse_ok("  ");
    CHECK(s.entry == &kv_method_dense_entry, "blank is dense");
    s = parse_ok("dense");
    CHECK(s.entry == &kv_method_dense_entry, "dense");
    CHECK_EQ(kv_method_count(), 8);
    const char *names[] = {"dense", "streamingllm", "snapkv", "pyramidkv",
                           "quest", "retr_attn",    "kivi",   "leank"};
    for (int i = 0; i < 8; i++) {
        CHECK(kv_method_at(i) && strcmp(kv_method_at(i)->name, names[i]) == 0, "entry %d", i);
        CHECK(kv_method_find(names[i]) == kv_method_at(i), "find %s", names[i]);
    }
    CHECK(kv_method_at(8) == NULL && kv_method_at(-1) == NULL && !kv_method_find("x"), "bounds");

    s = parse_ok("snapkv");
    CHECK_EQ(kv_spec_get(&s, "window_size"), 32);
    CHECK_EQ(kv_spec_get(&s, "max_capacity_prompt"), 4096);
    CHECK_EQ(kv_spec_get(&s, "kernel_size"), 5);
    CHECK_EQ(kv_spec_get(&s, "pooling"), 0);
    CHECK(!kv_spec_given(&s, "window_size"), "default not given");
    s = parse_ok(" snapkv : window_size = 16 , pooling=maxpool,max_capacity_prompt=100 ");
    CHECK_EQ(kv_spec_get(&s, "window_size"), 16);
    CHECK_EQ(kv_spec_get(&s, "pooling"), 1);
    CHECK_EQ(kv_spec_get(&s, "max_capacity_prompt"), 100);
    CHECK(kv_spec_given(&s, "window_size") && !kv_spec_given(&s, "kernel_size"), "given");
    s = parse_ok("streamingllm");
    CHECK_EQ(kv_spec_get(&s, "n_init"), 128);
    CHECK_EQ(kv_spec_get(&s, "n_local"), 3968);
    s = parse_ok("quest:token_budget=2048");
    CHECK_EQ(kv_spec_get(&s, "token_budget"), 2048);
    s = parse_ok("pyramidkv:beta=10");
    CHECK_EQ(kv_spec_get(&s, "beta"), 10);
    s = parse_ok("snapkv:");
    CHECK(s.entry == &kv_method_snapkv_entry, "trailing colon");

    /* the formatter writes every key; parsing it back gives the same values */
    for (int i = 0; i < 8; i++) {
        char text[128], full[1024];
        snprintf(text, sizeof text, "%s", names[i]);
        kv_spec a = parse_ok(text);
        kv_spec_format(&a, full, sizeof full);
        kv_spec b = parse_ok(full);
        CHECK(b.entry == a.entry, "%s round trip", full);
        for (int32_t p = 0; p < a.entry->n_params; p++) {
            CHECK(a.values[p] == b.values[p], "%s: %s", full, a.entry->params[p].name);
            CHECK(strcmp(a.strings[p], b.strings[p]) == 0, "%s", full);
        }
    }

    parse_bad("snapkvv", "unknown kv method 'snapkvv'");
    parse_bad("snapkvv", "streamingllm"); /* the list of names */
    parse_bad("snapkv:window=3", "no key 'window'");
    parse_bad("snapkv:window=3", "window_size"); /* the list of keys */
    parse_bad("snapkv:window_size=abc", "not a number");
    parse_bad("snapkv:window_size=3.5", "must be an integer");
    parse_bad("snapkv:window_size=0", "outside");
    parse_bad("snapkv:window_size=1e300", "outside");
    parse_bad("snapkv:window_size=", "no value");
    parse_bad("snapkv:pooling=median", "avgpool|maxpool");
    parse_bad("snapkv:window_size=8,window_size=9", "given twice");
    parse_bad("snapkv:window_size", "not key=value");
    parse_bad("snapkv:window_size=8,,kernel_size=3", "not key=value");
    parse_bad(":window_size=8", "names no method");
    parse_bad("quest:token_budget=-1", "outside");
    parse_bad("dense:x=1", "no key 'x'");

    /* a method's own constraints */
    const kv_geometry geo = {2, 4, 2, 8, 64};
    kv_method *m = NULL;
    char err[256] = "";
    s = parse_ok("snapkv:window_size=64,max_capacity_prompt=64");
    CHECK_STATUS(kv_method_create(&s, &geo, &m, err, sizeof err), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(err, "must exceed window_size") != NULL, "%s", err);
    s = parse_ok("snapkv:kernel_size=4");
    CHECK_STATUS(kv_method_create(&s, &geo, &m, err, sizeof err), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(err, "odd") != NULL, "%s", err);
    s = parse_ok("quest:chunk_size=16");
    CHECK_STATUS(kv_method_create(&s, &geo, &m, err, sizeof err), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(err, "page size") != NULL, "%s", err);
    s = parse_ok("dense");
    m = (kv_method *)1;
    CHECK_OK(kv_method_create(&s, &geo, &m, err, sizeof err));
    CHECK(m == NULL, "dense has no instance");
}

/* ------------------------------------------------------------------------------------------ */
/* Compaction                                                                                  */

/* A sequence of `layers` layers of len random rows, mirrored in ref ([len][H][D] per layer). */
static void fill(mi_kv_seq *seq, ref_seq *ref, int64_t len) {
    for (int32_t l = 0; l < ref->n_layers; l++)
        for (int64_t done = 0; done < len;) {
            int64_t n = rng_int(1, 100);
            if (n > len - done) n = len - done;
            chunk c = chunk_make(ref->H, ref->D, n, MI_DTYPE_F32, false, 2.0f);
            CHECK_OK(mi_kv_seq_append(seq, l, &c.tk, &c.tv));
            ref_append(ref, l, c.k, c.v, n);
            chunk_free(&c);
            done += n;
        }
}

/* Every row of layer l against ref, within the dtype's tolerance: a loose bound, 7 % of |x|; fp8
 * codes the distance from a page centre inside the data's range (|x| < 3 here) and a compaction
 * rounds the kept rows once more, so there 2 x 7 % of |x| + 3. */
static void compare(const mi_kv_seq *seq, const ref_seq *ref, int32_t l, mi_kv_dtype dt,
                    const char *what) {
    const ref_layer *R = &ref->layers[l];
    CHECK_EQ(mi_kv_seq_length(seq, l), R->len);
    const int64_t n = R->len, H = ref->H, D = ref->D;
    float *k = malloc((size_t)(n * H * D + 1) * sizeof(float));
    float *v = malloc((size_t)(n * H * D + 1) * sizeof(float));
    mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, ref->H, n, ref->D);
    mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, ref->H, n, ref->D);
    if (n) CHECK_OK(mi_kv_seq_read(seq, l, 0, n, &tk, &tv));
    int bad = 0;
    for (int64_t i = 0; i < n * H * D && bad < 3; i++) {
        const float a = R->k[i], b = R->v[i];
        const float pad = dt == MI_KV_FP8_E4M3 ? 3.0f : 0.0f;
        const float rel = dt == MI_KV_FP8_E4M3 ? 0.14f : 0.07f;
        const bool ok = dt == MI_KV_F32 ? (k[i] == a && v[i] == b)
                                        : (fabsf(k[i] - a) <= rel * (fabsf(a) + pad) + 0.01f &&
                                           fabsf(v[i] - b) <= rel * (fabsf(b) + pad) + 0.01f);
        if (!ok) {
            bad++;
            CHECK(ok, "%s: layer %d element %lld: %g/%g vs %g/%g", what, l, (long long)i, k[i],
                  v[i], a, b);
        }
    }
    free(k);
    free(v);
}

/* ref's layer l after keeping keep[h][count] per head. */
static void ref_compact(ref_seq *ref, int32_t l, int64_t count, const int64_t *keep) {
    ref_layer *R = &ref->layers[l];
    const int64_t H = ref->H, D = ref->D;
    float *k = malloc((size_t)(count * H * D + 1) * sizeof(float));
    float *v = malloc((size_t)(count * H * D + 1) * sizeof(float));
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < count; i++) {
            const int64_t src = keep[h * count + i];
            memcpy(k + (i * H + h) * D, R->k + (src * H + h) * D, (size_t)D * sizeof(float));
            memcpy(v + (i * H + h) * D, R->v + (src * H + h) * D, (size_t)D * sizeof(float));
        }
    free(R->k);
    free(R->v);
    R->k = k, R->v = v, R->len = R->cap = count;
}

/* A random ascending subset of 0..len-1 of count rows per head, the first `same` rows kept. */
static int64_t *random_keep(int32_t H, int64_t len, int64_t count, int64_t same) {
    int64_t *keep = malloc((size_t)(H * count + 1) * sizeof(int64_t));
    char *pick = malloc((size_t)len + 1);
    for (int32_t h = 0; h < H; h++) {
        memset(pick, 0, (size_t)len);
        for (int64_t i = 0; i < same; i++) pick[i] = 1;
        for (int64_t got = same; got < count;) {
            int64_t r = rng_int(same, len - 1);
            if (!pick[r]) pick[r] = 1, got++;
        }
        for (int64_t r = 0, i = 0; r < len; r++)
            if (pick[r]) keep[h * count + i++] = r;
    }
    free(pick);
    return keep;
}

static void test_compact(void) {
    const mi_kv_dtype dts[] = {MI_KV_F32, MI_KV_FP8_E4M3};
    const int32_t pts[] = {64, 7};
    for (int di = 0; di < 2; di++)
        for (int pi = 0; pi < 2; pi++) {
            check_seed = rng_state = 1000 + (uint64_t)(di * 2 + pi);
            mi_kv_pool_params pp = mi_kv_pool_default_params();
            pp.n_layers = 2, pp.n_kv_heads = 3, pp.head_dim = 16;
            pp.dtype = dts[di];
            pp.page_tokens = pts[pi];
            pp.meta_kinds = MI_KV_META_KEY_MINMAX;
            mi_kv_pool *pool = NULL;
            CHECK_OK(mi_kv_pool_create(NULL, &pp, &pool));
            mi_kv_seq *seq = NULL;
            CHECK_OK(mi_kv_seq_create(pool, &seq));
            ref_seq *ref = ref_new(2, 3, 16);
            fill(seq, ref, 300);
            for (int round = 0; round < 6; round++) {
                const int32_t l = round & 1;
                const int64_t len = mi_kv_seq_length(seq, l);
                const int64_t count = rng_int(len / 2, len - 1);
                const int64_t same = rng_int(0, count / 2);
                int64_t *keep = random_keep(3, len, count, same);
                /* the pages wholly before the first moved row keep their ids */
                int64_t first = count;
                for (int32_t h = 0; h < 3; h++)
                    for (int64_t i = 0; i < count; i++)
                        if (keep[h * count + i] != i && i < first) first = i;
                const int32_t *ids0 = NULL;
                int64_t np0 = 0;
                CHECK_OK(mi_kv_seq_page_table(seq, l, &ids0, &np0));
                int32_t before[64];
                const int64_t kept_pages = first / pts[pi];
                for (int64_t p = 0; p < kept_pages && p < 64; p++) before[p] = ids0[p];
                /* a fork holds the old pages: it must not see the compaction */
                mi_kv_seq *child = NULL;
                CHECK_OK(mi_kv_seq_fork(seq, &child));
                ref_seq *child_ref = ref_copy(ref);
                CHECK_OK(mi_kv_seq_compact(seq, l, count, keep));
                ref_compact(ref, l, count, keep);
                compare(seq, ref, l, dts[di], "compacted");
                compare(seq, ref, 1 - l, dts[di], "other layer");
                compare(child, child_ref, l, dts[di], "fork after the parent compacted");
                const int32_t *ids1 = NULL;
                int64_t np1 = 0;
                CHECK_OK(mi_kv_seq_page_table(seq, l, &ids1, &np1));
                CHECK_EQ(np1, (count + pts[pi] - 1) / pts[pi]);
                for (int64_t p = 0; p < kept_pages && p < 64; p++)
                    CHECK(ids1[p] == before[p], "page %lld before the first moved row replaced",
                          (long long)p);
                /* metadata of every page: the min/max of its rows */
                mi_kv_page_view view;
                for (int64_t p = 0; p < np1; p++) {
                    CHECK_OK(mi_kv_seq_page(seq, l, p, &view));
                    for (int32_t h = 0; h < 3; h++)
                        for (int32_t d = 0; d < 16; d++) {
                            float mn = INFINITY, mx = -INFINITY;
                            mi_kv_page_layout lay;
                            mi_kv_pool_layout(pool, &lay);
                            for (int32_t r = 0; r < view.rows; r++) {
                                float x = page_value(&lay, view.data, 0, h, r, d);
                                mn = x < mn ? x : mn;
                                mx = x > mx ? x : mx;
                            }
                            const float *mm = view.key_minmax + (size_t)h * 32;
                            CHECK(mm[d] <= mn && mm[16 + d] >= mx, "meta page %lld", (long long)p);
                        }
                }
                mi_kv_seq_destroy(child);
                ref_free(child_ref);
                free(keep);
                /* appending after a compaction continues from the kept rows */
                chunk c = chunk_make(3, 16, 5, MI_DTYPE_F32, false, 1.0f);
                CHECK_OK(mi_kv_seq_append(seq, l, &c.tk, &c.tv));
                ref_append(ref, l, c.k, c.v, 5);
                chunk_free(&c);
                compare(seq, ref, l, dts[di], "appended after compaction");
            }
            /* bad subsets: refused, nothing changed */
            const int64_t len = mi_kv_seq_length(seq, 0);
            int64_t *keep = random_keep(3, len, 10, 0);
            int64_t saved = keep[5];
            keep[5] = keep[4]; /* not ascending */
            CHECK_STATUS(mi_kv_seq_compact(seq, 0, 10, keep), MI_STATUS_INVALID_ARGUMENT);
            CHECK(strstr(mi_kv_pool_last_error(pool), "ascend") != NULL, "message");
            keep[5] = saved;
            keep[9] = len; /* outside */
            CHECK_STATUS(mi_kv_seq_compact(seq, 0, 10, keep), MI_STATUS_INVALID_ARGUMENT);
            CHECK_STATUS(mi_kv_seq_compact(seq, 0, len + 1, keep), MI_STATUS_INVALID_ARGUMENT);
            CHECK_STATUS(mi_kv_seq_compact(seq, 0, 10, NULL), MI_STATUS_INVALID_ARGUMENT);
            CHECK_STATUS(mi_kv_seq_compact(seq, 5, 10, keep), MI_STATUS_INVALID_ARGUMENT);
            CHECK_STATUS(mi_kv_seq_compact(NULL, 0, 10, keep), MI_STATUS_INVALID_ARGUMENT);
            compare(seq, ref, 0, dts[di], "after refused compactions");
            free(keep);
            /* keeping a prefix is a truncation */
            keep = random_keep(3, len, len / 2, len / 2);
            CHECK_OK(mi_kv_seq_compact(seq, 0, len / 2, keep));
            ref_compact(ref, 0, len / 2, keep);
            compare(seq, ref, 0, dts[di], "prefix kept");
            free(keep);
            ref_free(ref);
            mi_kv_seq_destroy(seq);
            mi_kv_pool_stats ps;
            CHECK_OK(mi_kv_pool_stats_get(pool, &ps));
            CHECK_EQ(ps.used_pages, 0);
            mi_kv_pool_destroy(pool);
        }

    /* a full pool: the compaction needs fresh pages, fails, and changes nothing */
    check_seed = rng_state = 77;
    mi_kv_pool_params pp = mi_kv_pool_default_params();
    pp.n_layers = 1, pp.n_kv_heads = 2, pp.head_dim = 8, pp.page_tokens = 8;
    pp.capacity_tokens = 64; /* 8 pages */
    mi_kv_pool *pool = NULL;
    CHECK_OK(mi_kv_pool_create(NULL, &pp, &pool));
    mi_kv_seq *seq = NULL;
    CHECK_OK(mi_kv_seq_create(pool, &seq));
    ref_seq *ref = ref_new(1, 2, 8);
    fill(seq, ref, 64);
    int64_t keep[80]; /* both heads move at row 0: every kept page is rewritten */
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 40; i++) keep[h * 40 + i] = i + 1 + h;
    CHECK_STATUS(mi_kv_seq_compact(seq, 0, 40, keep), MI_STATUS_OUT_OF_MEMORY);
    compare(seq, ref, 0, MI_KV_F32, "after a compaction out of pages");
    ref_free(ref);
    mi_kv_seq_destroy(seq);
    mi_kv_pool_destroy(pool);
}

/* ------------------------------------------------------------------------------------------ */
/* The methods' rules against float64 references                                               */

static void test_snapkv_rule(void) {
    const int32_t nh = 6, nkv = 2, hd = 16, group = nh / nkv;
    kv_scratch scratch = {NULL, 0}; /* reused across the trials' sizes, as across layers */
    for (int trial = 0; trial < 12; trial++) {
        check_seed = rng_state = 500 + (uint64_t)trial;
        const int64_t len = rng_int(40, 300), w = rng_int(1, 24);
        const int64_t kernel = 2 * rng_int(0, 4) + 1;
        const int pooling = (int)rng_int(0, 1);
        const int64_t prefix = len - w, n_keep = rng_int(0, prefix);
        float *q = malloc((size_t)(w * nh * hd) * sizeof(float));
        float *k = malloc((size_t)(nkv * len * hd) * sizeof(float));
        for (int64_t i = 0; i < w * nh * hd; i++) q[i] = rng_value(3.0f);
        for (int64_t i = 0; i < nkv * len * hd; i++) k[i] = rng_value(3.0f);
        int64_t *keep = malloc((size_t)(nkv * (n_keep + w)) * sizeof(int64_t));
        CHECK_OK(
            kv_snapkv_select(q, w, k, len, nh, nkv, hd, kernel, pooling, n_keep, keep, &scratch));
        /* float64: the causal softmax of each window query, summed over the window, pooled,
         * summed over each KV head's query heads */
        double *score = calloc((size_t)(nkv * prefix + 1), sizeof(double));
        double *sum = malloc((size_t)(prefix + 1) * sizeof(double));
        double *p = malloc((size_t)len * sizeof(double));
        for (int32_t h = 0; h < nh; h++) {
            const int32_t kh = h / group;
            for (int64_t j = 0; j < prefix; j++) sum[j] = 0;
            for (int64_t i = 0; i < w; i++) {
                const int64_t vis = prefix + i + 1;
                double mx = -INFINITY, z = 0;
                for (int64_t j = 0; j < vis; j++) {
                    double s = 0;
                    for (int32_t d = 0; d < hd; d++)
                        s += (double)q[(i * nh + h) * hd + d] * k[(kh * len + j) * hd + d];
                    p[j] = s / sqrt((double)hd);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int64_t j = 0; j < vis; j++) z += exp(p[j] - mx);
                for (int64_t j = 0; j < prefix; j++) sum[j] += exp(p[j] - mx) / z;
            }
            for (int64_t j = 0; j < prefix; j++) {
                double acc = pooling ? -INFINITY : 0;
                for (int64_t t = j - kernel / 2; t <= j + kernel / 2; t++) {
                    if (t < 0 || t >= prefix) continue;
                    acc = pooling ? (sum[t] > acc ? sum[t] : acc) : acc + sum[t];
                }
                score[kh * prefix + j] += pooling ? acc : acc / (double)kernel;
            }
        }
        const int64_t count = n_keep + w;
        for (int32_t kh = 0; kh < nkv; kh++) {
            const int64_t *kk = keep + kh * count;
            char *in = calloc((size_t)len + 1, 1);
            for (int64_t i = 0; i < count; i++) {
                CHECK(i == 0 || kk[i] > kk[i - 1], "ascending");
                in[kk[i]] = 1;
            }
            for (int64_t i = 0; i < w; i++) CHECK(kk[n_keep + i] == prefix + i, "window kept");
            /* every kept prefix row scores at least as much as every dropped one */
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t j = 0; j < prefix; j++) {
                const double s = score[kh * prefix + j];
                if (in[j])
                    lo = s < lo ? s : lo;
                else
                    hi = s > hi ? s : hi;
            }
            CHECK(n_keep == 0 || n_keep == prefix || lo >= hi - 1e-5 * (fabs(hi) + 1e-3),
                  "trial %d head %d: kept %.9g < dropped %.9g", trial, kh, lo, hi);
            free(in);
        }
        /* keeping every prefix row keeps the whole layer */
        int64_t *all = malloc((size_t)(nkv * len) * sizeof(int64_t));
        CHECK_OK(kv_snapkv_select(q, w, k, len, nh, nkv, hd, kernel, pooling, prefix, all, NULL));
        for (int64_t i = 0; i < nkv * len; i++) CHECK_EQ(all[i], i % len);
        free(all);
        free(score);
        free(sum);
        free(p);
        free(keep);
        free(q);
        free(k);
    }
    CHECK_STATUS(kv_snapkv_select(NULL, 4, NULL, 3, 2, 1, 4, 5, 0, 0, NULL, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    kv_scratch_free(&scratch);
}

static void test_pyramid_budgets(void) {
    /* the original's shape: shorter than capacity untouched; under twice the budget SnapKV's;
     * beyond it budgets shrink with depth, averaging SnapKV's */
    CHECK_EQ(kv_pyramid_prefix_budget(4096, 32, 20, 32, 0, 4000), -1);
    CHECK_EQ(kv_pyramid_prefix_budget(4096, 32, 20, 32, 5, 5000), 4064);
    const int32_t layers = 30;
    for (int64_t len = 9000; len <= 200000; len *= 3) {
        int64_t total = 0, prev = INT64_MAX;
        for (int32_t l = 0; l < layers; l++) {
            const int64_t b = kv_pyramid_prefix_budget(4096, 32, 20, layers, l, len);
            CHECK(b >= 0 && b <= len - 32 && b <= prev, "layer %d budget %lld", l, (long long)b);
            prev = b;
            total += b;
        }
        const int64_t first = kv_pyramid_prefix_budget(4096, 32, 20, layers, 0, len);
        const int64_t last = kv_pyramid_prefix_budget(4096, 32, 20, layers, layers - 1, len);
        CHECK(first > 4064 && last < 4064, "shrinks: %lld .. %lld", (long long)first,
              (long long)last);
        /* the mean is SnapKV's budget up to the integer steps' rounding */
        CHECK(llabs(total / layers - 4064) <= 4064 / 20 / 2 + layers, "mean %lld",
              (long long)(total / layers));
    }
}

static void test_quest_rule(void) {
    const int32_t hd = 32, rows = 64;
    for (int trial = 0; trial < 50; trial++) {
        check_seed = rng_state = 900 + (uint64_t)trial;
        float q[32], mm[64], k[64 * 32];
        for (int d = 0; d < hd; d++)
            q[d] = rng_value(4.0f), mm[d] = INFINITY, mm[hd + d] = -INFINITY;
        for (int r = 0; r < rows; r++)
            for (int d = 0; d < hd; d++) {
                const float x = rng_value(4.0f);
                k[r * hd + d] = x;
                mm[d] = x < mm[d] ? x : mm[d];
                mm[hd + d] = x > mm[hd + d] ? x : mm[hd + d];
            }
        const double u = kv_quest_bound(q, mm, hd);
        double best = -INFINITY, brute = 0;
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int d = 0; d < hd; d++) s += (double)q[d] * k[r * hd + d];
            best = s > best ? s : best;
        }
        /* the bound, brute force over the corners: per channel the larger of q min and q max */
        for (int d = 0; d < hd; d++) {
            const double a = (double)q[d] * mm[d], b = (double)q[d] * mm[hd + d];
            brute += a > b ? a : b;
        }
        CHECK(u >= best - 1e-4 * (fabs(best) + 1), "bound %.9g below a key's q.k %.9g", u, best);
        CHECK_NEAR(u, brute, 1e-4 * (fabs(brute) + 1));
    }
    CHECK_EQ(kv_quest_pages(1024, 64, 100), 16);
    CHECK_EQ(kv_quest_pages(100, 64, 100), 3); /* the original's floor of 3 */
    CHECK_EQ(kv_quest_pages(1024, 64, 10), 10);
}

/* The selection hooks over a real sequence: StreamingLLM's spans, Quest's pages against a
 * float64 ranking, and "budget >= context selects everything". */
static void test_select_hooks(void) {
    check_seed = rng_state = 4242;
    const int32_t nh = 4, nkv = 2, hd = 16, pt = 16;
    mi_kv_pool_params pp = mi_kv_pool_default_params();
    pp.n_layers = 3, pp.n_kv_heads = nkv, pp.head_dim = hd, pp.page_tokens = pt;
    pp.meta_kinds = MI_KV_META_KEY_MINMAX;
    mi_kv_pool *pool = NULL;
    CHECK_OK(mi_kv_pool_create(NULL, &pp, &pool));
    mi_kv_seq *seq = NULL;
    CHECK_OK(mi_kv_seq_create(pool, &seq));
    ref_seq *ref = ref_new(3, nkv, hd);
    const int64_t len = 200;
    fill(seq, ref, len);
    const kv_geometry geo = {3, nh, nkv, hd, pt};
    char err[256];
    kv_selection sel;
    kv_selection_init(&sel);
    const int64_t n = 3; /* three query rows: the last three of the layer */
    float q[3 * 4 * 16];
    for (int i = 0; i < 3 * 4 * 16; i++) q[i] = rng_value(3.0f);

    /* StreamingLLM: [0, n_init) and the last n_local visible rows */
    kv_spec s = parse_ok("streamingllm:n_init=4,n_local=50");
    kv_method *m = NULL;
    CHECK_OK(kv_method_create(&s, &geo, &m, err, sizeof err));
    CHECK_OK(kv_method_select(m, seq, 1, q, n, &sel));
    CHECK_EQ(sel.n_lists, n * nh);
    for (int64_t i = 0; i < n; i++)
        for (int32_t h = 0; h < nh; h++) {
            const int64_t li = i * nh + h, a = sel.offsets[li], end = len - n + i + 1;
            CHECK_EQ(sel.offsets[li + 1] - a, 2);
            CHECK(sel.spans[2 * a] == 0 && sel.spans[2 * a + 1] == 4, "sinks");
            CHECK(sel.spans[2 * a + 2] == end - 50 && sel.spans[2 * a + 3] == end, "window");
        }
    /* eviction once a page's worth piled up: sinks + window, positions kept in order */
    CHECK_OK(kv_method_after_append(m, seq, 1, len));
    CHECK_EQ(mi_kv_seq_length(seq, 1), 54);
    {
        int64_t keep[2 * 54];
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 54; i++) keep[h * 54 + i] = i < 4 ? i : len - 50 + (i - 4);
        ref_compact(ref, 1, 54, keep);
        compare(seq, ref, 1, MI_KV_F32, "streamingllm eviction");
    }
    CHECK_EQ(m->exact_tail[1], 50);
    kv_method_destroy(m);
    /* a window covering everything selects every row: one span [0, end) */
    s = parse_ok("streamingllm:n_init=4,n_local=1000");
    CHECK_OK(kv_method_create(&s, &geo, &m, err, sizeof err));
    CHECK_OK(kv_method_select(m, seq, 0, q, n, &sel));
    for (int64_t li = 0; li < n * nh; li++) {
        const int64_t a = sel.offsets[li];
        CHECK(sel.offsets[li + 1] - a == 1 && sel.spans[2 * a] == 0 &&
                  sel.spans[2 * a + 1] == len - n + li / nh + 1,
              "dense span");
    }
    kv_method_destroy(m);

    /* Quest: pages by the float64 bound, the top max(3, budget / page) */
    s = parse_ok("quest:token_budget=48,chunk_size=16,dense_layers=1");
    CHECK_OK(kv_method_create(&s, &geo, &m, err, sizeof err));
    CHECK_OK(kv_method_select(m, seq, 2, q, n, &sel));
    const int64_t n_pages = (len + pt - 1) / pt;
    for (int64_t i = 0; i < n; i++)
        for (int32_t h = 0; h < nh; h++) {
            const int64_t li = i * nh + h, end = len - n + i + 1, pages = (end + pt - 1) / pt;
            double bound[16];
            for (int64_t p = 0; p < pages; p++) {
                double u = 0;
                for (int32_t d = 0; d < hd; d++) {
                    double mn = INFINITY, mx = -INFINITY;
                    for (int64_t r = p * pt; r < (p + 1) * pt && r < len; r++) {
                        const double x = ref->layers[2].k[(r * nkv + h / 2) * hd + d];
                        mn = x < mn ? x : mn;
                        mx = x > mx ? x : mx;
                    }
                    const double qd = q[li * hd + d];
                    u += qd * mn > qd * mx ? qd * mn : qd * mx;
                }
                bound[p] = u;
            }
            char chosen[16] = {0};
            int64_t rows_read = 0;
            for (int64_t a = sel.offsets[li]; a < sel.offsets[li + 1]; a++) {
                const int64_t r0 = sel.spans[2 * a], r1 = sel.spans[2 * a + 1];
                CHECK(r1 <= end, "nothing past the causal end");
                rows_read += r1 - r0;
                for (int64_t r = r0; r < r1; r++) chosen[r / pt] = 1;
            }
            int64_t n_chosen = 0;
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t p = 0; p < pages; p++) {
                if (chosen[p])
                    n_chosen++, lo = bound[p] < lo ? bound[p] : lo;
                else
                    hi = bound[p] > hi ? bound[p] : hi;
            }
            CHECK_EQ(n_chosen, 3);
            CHECK(rows_read <= 3 * pt, "read %lld rows", (long long)rows_read);
            CHECK(lo >= hi - 1e-4 * (fabs(hi) + 1), "kept page bound %.9g < dropped %.9g", lo, hi);
        }
    (void)n_pages;
    /* the dense layers and a budget covering everything: one span [0, end) */
    CHECK_OK(kv_method_select(m, seq, 0, q, n, &sel));
    for (int64_t li = 0; li < n * nh; li++)
        CHECK(sel.offsets[li + 1] - sel.offsets[li] == 1 && sel.spans[2 * sel.offsets[li]] == 0,
              "dense layer");
    kv_method_destroy(m);
    s = parse_ok("quest:token_budget=200,chunk_size=16");
    CHECK_OK(kv_method_create(&s, &geo, &m, err, sizeof err));
    CHECK_OK(kv_method_select(m, seq, 2, q, n, &sel));
    for (int64_t li = 0; li < n * nh; li++)
        CHECK(sel.offsets[li + 1] - sel.offsets[li] == 1 &&
                  sel.spans[2 * sel.offsets[li] + 1] == len - n + li / nh + 1,
              "budget >= context: dense");
    /* a fork of the method keeps its spec */
    kv_method *c = NULL;
    CHECK_OK(kv_method_clone(m, &c, err, sizeof err));
    CHECK(c && c->entry == m->entry && c->spec.values[0] == 200, "clone");
    kv_method_destroy(c);
    kv_method_destroy(m);

    /* SnapKV through its hook: the layer shrinks to the capacity, the window kept at the end */
    s = parse_ok("snapkv:window_size=8,max_capacity_prompt=40");
    CHECK_OK(kv_method_create(&s, &geo, &m, err, sizeof err));
    CHECK_EQ(m->q_rows, 8);
    float qw[8 * 4 * 16];
    for (int i = 0; i < 8 * 4 * 16; i++) qw[i] = rng_value(3.0f);
    CHECK_OK(kv_method_after_prefill(m, seq, 0, qw, 8));
    CHECK_EQ(mi_kv_seq_length(seq, 0), 40);
    CHECK_EQ(m->exact_tail[0], 8);
    /* under the capacity nothing happens */
    const int64_t l2 = mi_kv_seq_length(seq, 2);
    s = parse_ok("snapkv:window_size=8,max_capacity_prompt=1000");
    kv_method *m2 = NULL;
    CHECK_OK(kv_method_create(&s, &geo, &m2, err, sizeof err));
    CHECK_OK(kv_method_after_prefill(m2, seq, 2, qw, 8));
    CHECK_EQ(mi_kv_seq_length(seq, 2), l2);
    kv_method_destroy(m2);
    kv_method_destroy(m);

    kv_selection_free(&sel);
    ref_free(ref);
    mi_kv_seq_destroy(seq);
    mi_kv_pool_destroy(pool);
}

static void test_selection_lists(void) {
    kv_selection sel;
    kv_selection_init(&sel);
    CHECK_OK(kv_selection_reset(&sel, 2));
    CHECK_OK(kv_selection_push(&sel, 0, 4));
    CHECK_OK(kv_selection_push(&sel, 4, 9)); /* touching: merged */
    CHECK_OK(kv_selection_push(&sel, 9, 9)); /* empty: ignored */
    CHECK_OK(kv_selection_push(&sel, 20, 30));
    kv_selection_close(&sel);
    CHECK_OK(kv_selection_push(&sel, 5, 6)); /* a new list does not merge with the last */
    kv_selection_close(&sel);
    kv_selection_close(&sel); /* past the end: ignored */
    CHECK_EQ(sel.offsets[1], 2);
    CHECK_EQ(sel.offsets[2], 3);
    CHECK(sel.spans[0] == 0 && sel.spans[1] == 9 && sel.spans[2] == 20 && sel.spans[4] == 5,
          "spans");
    for (int i = 0; i < 1000; i++) CHECK_OK(kv_selection_push(&sel, 2 * i + 100, 2 * i + 101));
    kv_selection_free(&sel);
}

int main(void) {
    test_specs();
    test_selection_lists();
    test_compact();
    test_snapkv_rule();
    test_pyramid_budgets();
    test_quest_rule();
    test_select_hooks();
    return check_finish("kv.method");
}
