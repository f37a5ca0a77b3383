/*
 * test_kv_quant.c: KIVI pages against a float64 reference.
 *  - every quantized element within its group's bound, the stored scale and min within f16
 *    rounding of the group's (max - min) / (2^bits - 1) and min; residual rows exact;
 *  - the residual policy (len - quantized rows in [R, R + G) once past R);
 *  - quantization independent of the chunking (a fork and a fresh sequence agree bit for bit);
 *  - fork / copy-on-write, truncate and rewind into quantized rows, save / load, old files;
 *  - attention over KIVI pages (the fused reader) against float64 attention over the dequantized
 *    rows; several queries of one KV head at once equal one-query calls bit for bit (every
 *    dtype, with and without LeanK's channel mask); a residual covering everything is attention
 *    over f32 pages, bit for bit;
 *  - bytes per token at the LLaMA-3-8B shape (printed; KIVI-2 <= 0.2 x bf16).
 */
#include "kv_test_util.h"

#include <omp.h>
#include <stdio.h>
#include <unistd.h>

static mi_kv_pool *make_pool(mi_kv_dtype dt, int32_t layers, int32_t H, int32_t D, int32_t P,
                             int32_t G, int32_t R) {
    mi_kv_pool_params p = mi_kv_pool_default_params();
    p.n_layers = layers, p.n_kv_heads = H, p.head_dim = D, p.dtype = dt, p.page_tokens = P;
    p.quant_group = G, p.quant_residual = R;
    mi_kv_pool *pool = NULL;
    CHECK_OK(mi_kv_pool_create(NULL, &p, &pool));
    return pool;
}

/* n rows [n][H][D] f32 with per-channel offsets and scales (keys have outlier channels). */
static void fill_rows(float *x, int64_t n, int32_t H, int32_t D, int kv) {
    for (int64_t i = 0; i < n; i++)
        for (int32_t h = 0; h < H; h++)
            for (int32_t d = 0; d < D; d++) {
                const float off = kv ? 0.0f : (float)((d * 7 + h) % 5) - 2.0f;
                const float mag = kv ? 1.0f : (d % 11 == 0 ? 8.0f : 1.5f);
                x[((size_t)i * H + h) * D + d] = off + rng_value(mag);
            }
}

static void append(mi_kv_seq *seq, ref_seq *ref, int32_t l, int64_t n) {
    const int32_t H = ref->H, D = ref->D;
    float *k = malloc((size_t)n * H * D * sizeof(float)), *v = malloc((size_t)n * H * D * 4);
    fill_rows(k, n, H, D, 0);
    fill_rows(v, n, H, D, 1);
    mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, n, D);
    mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, n, D);
    CHECK_OK(mi_kv_seq_append(seq, l, &tk, &tv));
    ref_append(ref, l, k, v, n);
    free(k), free(v);
}

/* Reads a layer into [len][H][D] f32. */
static void read_layer(const mi_kv_seq *seq, int32_t l, int32_t H, int32_t D, float *k, float *v) {
    const int64_t len = mi_kv_seq_length(seq, l);
    if (len == 0) return;
    mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, len, D);
    mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, len, D);
    CHECK_OK(mi_kv_seq_read(seq, l, 0, len, &tk, &tv));
}

static float f16v(const unsigned char *p) {
    uint16_t u;
    memcpy(&u, p, 2);
    return mi_f16_to_f32(u);
}

/* |f16(x) - x| for a value stored as f16: half an ulp, 2^-11 |x| + 2^-25 (subnormals). */
static bool f16_close(double stored, double exact) {
    return fabs(stored - exact) <= ldexp(fabs(exact), -11) + ldexp(1.0, -25);
}

/* Every row of layer l: quantized rows within the float64 bound of their group, the stored
 * parameters within f16 rounding of the group's, residual rows exact. Returns the worst error
 * relative to the group's range. */
static double check_layer(const mi_kv_seq *seq, const ref_seq *ref, int32_t l) {
    mi_kv_pool *pool = mi_kv_seq_pool(seq);
    mi_kv_page_layout L;
    CHECK_OK(mi_kv_pool_layout(pool, &L));
    const int32_t H = ref->H, D = ref->D, G = L.group_size, P = L.page_tokens;
    const int maxq = (1 << L.bits) - 1;
    const ref_layer *rl = &ref->layers[l];
    const int64_t len = rl->len, q = mi_kv_seq_quantized_rows(seq, l);
    CHECK_EQ(mi_kv_seq_length(seq, l), len);
    CHECK(q >= 0 && q <= len && q % G == 0, "quantized rows %lld of %lld", (long long)q,
          (long long)len);
    float *k = malloc(((size_t)len + 1) * H * D * 4), *v = malloc(((size_t)len + 1) * H * D * 4);
    read_layer(seq, l, H, D, k, v);
    double worst = 0.0;
    int bad = 0;
    for (int64_t r = q; r < len; r++) /* residual: exact */
        for (size_t i = 0; i < (size_t)H * D; i++) {
            const size_t at = (size_t)r * H * D + i;
            bad += k[at] != rl->k[at] || v[at] != rl->v[at];
        }
    CHECK(bad == 0, "layer %d: %d residual values differ", l, bad);
    bad = 0;
    for (int64_t g0 = 0; g0 < q; g0 += G) {
        mi_kv_page_view pv;
        CHECK_OK(mi_kv_seq_page(seq, l, g0 / P, &pv));
        const unsigned char *page = pv.data;
        const int32_t gi = (int32_t)((g0 % P) / G);
        for (int32_t h = 0; h < H; h++) {
            /* keys: per channel over the group's G tokens */
            for (int32_t d = 0; d < D; d++) {
                double mn = INFINITY, mx = -INFINITY;
                for (int32_t i = 0; i < G; i++) {
                    const double x = rl->k[((size_t)(g0 + i) * H + h) * D + d];
                    mn = x < mn ? x : mn, mx = x > mx ? x : mx;
                }
                const unsigned char *pp = (const unsigned char *)page + L.k_param_offset +
                                          (((size_t)h * (P / G) + gi) * D + d) * 4;
                const double s = f16v(pp), z = f16v(pp + 2);
                if (!f16_close(s, (mx - mn) / maxq) || !f16_close(z, mn)) bad++;
                const double bound =
                    fmax(fmax(s / 2, z - mn), mx - (z + maxq * s)) + 1e-6 * (fabs(mn) + fabs(mx));
                for (int32_t i = 0; i < G; i++) {
                    const size_t at = ((size_t)(g0 + i) * H + h) * D + d;
                    const double e = fabs((double)k[at] - (double)rl->k[at]);
                    if (e > bound) bad++;
                    if (mx > mn) worst = fmax(worst, e / (mx - mn));
                }
            }
            /* values: per token over G channels */
            for (int32_t i = 0; i < G; i++)
                for (int32_t c0 = 0; c0 < D; c0 += G) {
                    const size_t base = ((size_t)(g0 + i) * H + h) * D;
                    double mn = INFINITY, mx = -INFINITY;
                    for (int32_t d = c0; d < c0 + G; d++) {
                        const double x = rl->v[base + d];
                        mn = x < mn ? x : mn, mx = x > mx ? x : mx;
                    }
                    const int32_t r = (int32_t)((g0 + i) % P);
                    const unsigned char *pp = (const unsigned char *)page + L.v_param_offset +
                                              (((size_t)h * P + r) * (D / G) + c0 / G) * 4;
                    const double s = f16v(pp), z = f16v(pp + 2);
                    if (!f16_close(s, (mx - mn) / maxq) || !f16_close(z, mn)) bad++;
                    const double bound = fmax(fmax(s / 2, z - mn), mx - (z + maxq * s)) +
                                         1e-6 * (fabs(mn) + fabs(mx));
                    for (int32_t d = c0; d < c0 + G; d++) {
                        const double e = fabs((double)v[base + d] - (double)rl->v[base + d]);
                        if (e > bound) bad++;
                        if (mx > mn) worst = fmax(worst, e / (mx - mn));
                    }
                }
        }
    }
    CHECK(bad == 0, "layer %d: %d quantized values or parameters out of bound", l, bad);
    free(k), free(v);
    return worst;
}

/* After truncating into quantized rows, the rows moved back into the residual keep their
 * quantized values: the reference takes them. */
static void ref_take(ref_seq *ref, const mi_kv_seq *seq, int32_t l) {
    ref_layer *rl = &ref->layers[l];
    read_layer(seq, l, ref->H, ref->D, rl->k, rl->v);
}

static void ref_truncate(ref_seq *ref, int32_t l, int64_t len) { ref->layers[l].len = len; }

/* ------------------------------------------------------------------------------------------ */

static void test_codec(mi_kv_dtype dt, int32_t G, int32_t R, int32_t P) {
    const int32_t H = 2, D = 32, NL = 2;
    mi_kv_pool *pool = make_pool(dt, NL, H, D, P, G, R);
    mi_kv_seq *seq = NULL;
    CHECK_OK(mi_kv_seq_create(pool, &seq));
    ref_seq *ref = ref_new(NL, H, D);
    static const int64_t sizes[] = {1, 3, 7, 31, 32, 33, 64, 100, 129, 5, 2, 250};
    double worst = 0.0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (int32_t l = 0; l < NL; l++) {
            append(seq, ref, l, sizes[(i + l) % 12]);
            const int64_t len = mi_kv_seq_length(seq, l), q = mi_kv_seq_quantized_rows(seq, l);
            /* the residual policy: whole groups once more than R rows are waiting */
            if (len > R)
                CHECK(len - q >= R && len - q < R + G, "len %lld quantized %lld", (long long)len,
                      (long long)q);
            else
                CHECK_EQ(q, 0);
            worst = fmax(worst, check_layer(seq, ref, l));
        }
    /* 2 bits: within half a step of a range split in 3 (plus f16 rounding) */
    CHECK(worst <= (dt == MI_KV_KIVI2 ? 1.0 / 6 : 1.0 / 30) + 0.01, "worst %g", worst);
    /* truncate into quantized rows, append again, rewind */
    for (int32_t l = 0; l < NL; l++) {
        const int64_t cut = mi_kv_seq_quantized_rows(seq, l) - G / 2 - 1;
        CHECK_OK(mi_kv_seq_truncate(seq, l, cut));
        ref_truncate(ref, l, cut);
        CHECK(mi_kv_seq_quantized_rows(seq, l) == cut / G * G);
        ref_take(ref, seq, l);
        check_layer(seq, ref, l);
        append(seq, ref, l, 77);
        check_layer(seq, ref, l);
    }
    const int64_t shortest = mi_kv_seq_length(seq, 0) < mi_kv_seq_length(seq, 1)
                                 ? mi_kv_seq_length(seq, 0)
                                 : mi_kv_seq_length(seq, 1);
    CHECK_OK(mi_kv_seq_rewind(seq, shortest - 5));
    for (int32_t l = 0; l < NL; l++) {
        ref_truncate(ref, l, ref->layers[l].len - (shortest - 5));
        ref_take(ref, seq, l);
        check_layer(seq, ref, l);
    }
    ref_free(ref);
    mi_kv_seq_destroy(seq);
    mi_kv_pool_stats ps;
    CHECK_OK(mi_kv_pool_stats_get(pool, &ps));
    CHECK_EQ(ps.used_pages, 0);
    mi_kv_pool_destroy(pool);
}

static bool same_layers(const mi_kv_seq *a, const mi_kv_seq *b, int32_t NL, int32_t H, int32_t D) {
    for (int32_t l = 0; l < NL; l++) {
        const int64_t len = mi_kv_seq_length(a, l);
        if (len != mi_kv_seq_length(b, l) ||
            mi_kv_seq_quantized_rows(a, l) != mi_kv_seq_quantized_rows(b, l))
            return false;
        const size_t n = ((size_t)len + 1) * H * D;
        float *ka = malloc(n * 4), *va = malloc(n * 4), *kb = malloc(n * 4), *vb = malloc(n * 4);
        read_layer(a, l, H, D, ka, va);
        read_layer(b, l, H, D, kb, vb);
        const bool same = memcmp(ka, kb, (size_t)len * H * D * 4) == 0 &&
                          memcmp(va, vb, (size_t)len * H * D * 4) == 0;
        free(ka), free(va), free(kb), free(vb);
        if (!same) return false;
    }
    return true;
}

/* Appends the same rows to several sequences. */
static void append_all(mi_kv_seq **seqs, int n_seqs, int32_t l, int64_t n, int32_t H, int32_t D) {
    float *k = malloc((size_t)n * H * D * 4), *v = malloc((size_t)n * H * D * 4);
    fill_rows(k, n, H, D, 0);
    fill_rows(v, n, H, D, 1);
    mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, n, D);
    mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, n, D);
    for (int i = 0; i < n_seqs; i++) CHECK_OK(mi_kv_seq_append(seqs[i], l, &tk, &tv));
    free(k), free(v);
}

/* A long append quantizes its groups on threads: the same codes as one thread, and within the
 * codec's error of the rows (G 32 of 64-row pages: two groups share each page). */
static void test_threads(mi_kv_dtype dt) {
    const int32_t H = 2, D = 32, NL = 1;
    mi_kv_pool *pools[2];
    mi_kv_seq *seqs[2];
    const int saved = omp_get_max_threads();
    for (int t = 0; t < 2; t++) {
        pools[t] = make_pool(dt, NL, H, D, 64, 32, 32);
        CHECK_OK(mi_kv_seq_create(pools[t], &seqs[t]));
    }
    /* a residual to carry into the long append, then one past KV_PARALLEL_ROWS */
    static const int64_t sizes[2] = {37, 4096};
    for (int a = 0; a < 2; a++) {
        const int64_t n = sizes[a];
        float *k = malloc((size_t)n * H * D * 4), *v = malloc((size_t)n * H * D * 4);
        fill_rows(k, n, H, D, 0);
        fill_rows(v, n, H, D, 1);
        mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, n, D);
        mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, n, D);
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(t ? 4 : 1);
            CHECK_OK(mi_kv_seq_append(seqs[t], 0, &tk, &tv));
        }
        free(k), free(v);
    }
    omp_set_num_threads(saved);
    CHECK(mi_kv_seq_quantized_rows(seqs[0], 0) > 4000);
    CHECK(same_layers(seqs[0], seqs[1], NL, H, D), "%s: threads changed the codes",
          mi_kv_dtype_name(dt));
    for (int t = 0; t < 2; t++) {
        mi_kv_seq_destroy(seqs[t]);
        mi_kv_pool_destroy(pools[t]);
    }
}

static void test_fork_cow(void) {
    const int32_t H = 2, D = 16, NL = 1, G = 8, P = 16;
    mi_kv_pool *pool = make_pool(MI_KV_KIVI4, NL, H, D, P, G, 8);
    mi_kv_seq *parent = NULL, *fresh = NULL, *child = NULL, *snap = NULL;
    CHECK_OK(mi_kv_seq_create(pool, &parent));
    CHECK_OK(mi_kv_seq_create(pool, &fresh));
    mi_kv_seq *both[2] = {parent, fresh};
    /* one chunk into the parent, three into the fresh copy: the same rows, other chunking */
    float *k = malloc(45 * H * D * 4), *v = malloc(45 * H * D * 4);
    fill_rows(k, 45, H, D, 0);
    fill_rows(v, 45, H, D, 1);
    mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, 45, D);
    mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, 45, D);
    CHECK_OK(mi_kv_seq_append(parent, 0, &tk, &tv));
    for (int64_t a = 0; a < 45; a += 15) {
        mi_tensor sk = mi_tensor_blhd(k + a * H * D, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, 15, D);
        mi_tensor sv = mi_tensor_blhd(v + a * H * D, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, 15, D);
        CHECK_OK(mi_kv_seq_append(fresh, 0, &sk, &sv));
    }
    free(k), free(v);
    CHECK(same_layers(parent, fresh, NL, H, D), "chunking changed the quantized rows");
    CHECK_EQ(mi_kv_seq_quantized_rows(parent, 0), 32); /* 45 - 8 -> 37 -> 32 */
    CHECK_OK(mi_kv_seq_fork(parent, &child));
    CHECK_OK(mi_kv_seq_fork(parent, &snap));
    mi_kv_seq_stats st;
    CHECK_OK(mi_kv_seq_stats_get(child, &st));
    CHECK(st.shared_pages == st.pages && st.pages == 2, "pages %lld shared %lld",
          (long long)st.pages, (long long)st.shared_pages);
    /* the child and the fresh sequence get the same rows: quantizing into the shared, partly
     * filled page copies it; the parent is unchanged */
    mi_kv_seq *cf[2] = {child, fresh};
    append_all(cf, 2, 0, 19, H, D);
    CHECK(same_layers(child, fresh, NL, H, D), "fork + append differs from a fresh sequence");
    CHECK(same_layers(parent, snap, NL, H, D), "the parent changed");
    append_all(both, 1, 0, 40, H, D); /* parent diverges */
    CHECK(same_layers(child, fresh, NL, H, D), "the child changed");
    /* truncate the child into a shared page and append: a copy, the parent unchanged */
    mi_kv_seq_destroy(snap);
    CHECK_OK(mi_kv_seq_fork(parent, &snap));
    CHECK_OK(mi_kv_seq_truncate(child, 0, 21));
    CHECK_EQ(mi_kv_seq_quantized_rows(child, 0), 16);
    append_all(&child, 1, 0, 30, H, D);
    CHECK(same_layers(parent, snap, NL, H, D), "the parent changed after the child's truncate");
    mi_kv_seq_destroy(parent);
    mi_kv_seq_destroy(child);
    mi_kv_seq_destroy(fresh);
    mi_kv_seq_destroy(snap);
    mi_kv_pool_stats ps;
    CHECK_OK(mi_kv_pool_stats_get(pool, &ps));
    CHECK_EQ(ps.used_pages, 0);
    mi_kv_pool_destroy(pool);
}

static void test_files(void) {
    const int32_t H = 2, D = 32, NL = 3;
    char path[] = "/tmp/mi_kvq_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    mi_kv_model_id id;
    memset(&id, 0, sizeof id);
    strcpy(id.arch, "test");
    id.n_layers = NL, id.n_heads = 4, id.n_kv_heads = H, id.head_dim = D, id.hidden = 128;
    id.vocab = 100, id.weights_hash = 42;
    for (int dt = MI_KV_KIVI2; dt <= MI_KV_KIVI4; dt++) {
        mi_kv_pool *pool = make_pool((mi_kv_dtype)dt, NL, H, D, 64, 32, 32);
        mi_kv_seq *a = NULL, *b = NULL;
        CHECK_OK(mi_kv_seq_create(pool, &a));
        CHECK_OK(mi_kv_seq_create(pool, &b));
        ref_seq *ref = ref_new(NL, H, D);
        append(a, ref, 0, 300); /* pages and a residual */
        append(a, ref, 1, 20);  /* only a residual */
        CHECK_OK(mi_kv_seq_save(a, path, &id));
        FILE *f = fopen(path, "rb");
        unsigned char hb[16] = {0};
        CHECK(f && fread(hb, 1, 16, f) == 16);
        if (f) fclose(f);
        CHECK_EQ(hb[8], 2); /* version 2: KIVI */
        CHECK_OK(mi_kv_seq_load(b, path, &id));
        CHECK(same_layers(a, b, NL, H, D), "save + load changed the rows");
        for (int32_t l = 0; l < NL; l++) check_layer(b, ref, l);
        /* the loaded copy goes on like the original */
        mi_kv_seq *ab[2] = {a, b};
        append_all(ab, 2, 0, 50, H, D);
        append_all(ab, 2, 1, 50, H, D);
        CHECK(same_layers(a, b, NL, H, D), "a loaded sequence appends differently");
        /* truncated files and another group size are refused, b unchanged */
        CHECK_OK(mi_kv_seq_save(a, path, &id));
        f = fopen(path, "rb");
        fseek(f, 0, SEEK_END);
        const long size = ftell(f);
        fclose(f);
        CHECK_OK(mi_kv_seq_truncate(b, 0, mi_kv_seq_length(b, 0) - 10));
        for (long cut = 130; cut < size; cut += size / 7) {
            CHECK(truncate(path, cut) == 0);
            CHECK_STATUS(mi_kv_seq_load(b, path, &id), MI_STATUS_PARSE_ERROR);
            CHECK_OK(mi_kv_seq_save(a, path, &id));
        }
        CHECK_EQ(mi_kv_seq_length(b, 0), mi_kv_seq_length(a, 0) - 10);
        mi_kv_pool *other = make_pool((mi_kv_dtype)dt, NL, H, D, 64, 16, 32);
        mi_kv_seq *c = NULL;
        CHECK_OK(mi_kv_seq_create(other, &c));
        CHECK_STATUS(mi_kv_seq_load(c, path, &id), MI_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(mi_kv_pool_last_error(other), "groups of 32") != NULL, "%s",
              mi_kv_pool_last_error(other));
        mi_kv_seq_destroy(c);
        mi_kv_pool_destroy(other);
        ref_free(ref);
        mi_kv_seq_destroy(a);
        mi_kv_seq_destroy(b);
        mi_kv_pool_destroy(pool);
    }
    /* an f32 cache is still written as version 1 and loads */
    mi_kv_pool *pool = make_pool(MI_KV_F32, NL, H, D, 64, 0, 0);
    mi_kv_seq *a = NULL, *b = NULL;
    CHECK_OK(mi_kv_seq_create(pool, &a));
    CHECK_OK(mi_kv_seq_create(pool, &b));
    ref_seq *ref = ref_new(NL, H, D);
    append(a, ref, 0, 70);
    CHECK_OK(mi_kv_seq_save(a, path, &id));
    FILE *f = fopen(path, "rb");
    unsigned char hb[16] = {0};
    CHECK(f && fread(hb, 1, 16, f) == 16);
    if (f) fclose(f);
    CHECK_EQ(hb[8], 1);
    CHECK_OK(mi_kv_seq_load(b, path, &id));
    CHECK(same_layers(a, b, NL, H, D));
    ref_free(ref);
    mi_kv_seq_destroy(a);
    mi_kv_seq_destroy(b);
    mi_kv_pool_destroy(pool);
    unlink(path);
}

/* float64 attention of q over rows [first, end) given as [len][H][D] arrays. */
static void ref_attend(const float *k, const float *v, int32_t H, int32_t D, int32_t h,
                       const float *q, int64_t first, int64_t end, double scale, double *out) {
    double mx = -INFINITY, sum = 0.0;
    double *s = malloc((size_t)(end - first + 1) * sizeof(double));
    for (int64_t r = first; r < end; r++) {
        double dot = 0.0;
        for (int32_t d = 0; d < D; d++) dot += (double)q[d] * k[((size_t)r * H + h) * D + d];
        s[r - first] = dot * scale;
        mx = fmax(mx, s[r - first]);
    }
    for (int32_t d = 0; d < D; d++) out[d] = 0.0;
    for (int64_t r = first; r < end; r++) {
        const double w = exp(s[r - first] - mx);
        sum += w;
        for (int32_t d = 0; d < D; d++) out[d] += w * v[((size_t)r * H + h) * D + d];
    }
    for (int32_t d = 0; d < D; d++) out[d] /= sum;
    free(s);
}

static void test_attend(mi_kv_dtype dt) {
    const int32_t H = 2, D = 64, NL = 1;
    mi_kv_pool *pool = make_pool(dt, NL, H, D, 64, 32, 32);
    mi_kv_seq *seq = NULL;
    CHECK_OK(mi_kv_seq_create(pool, &seq));
    ref_seq *ref = ref_new(NL, H, D);
    append(seq, ref, 0, 1000);
    const int64_t len = 1000;
    float *k = malloc((size_t)len * H * D * 4), *v = malloc((size_t)len * H * D * 4);
    read_layer(seq, 0, H, D, k, v); /* the dequantized rows */
    float q[64], out[64], *scores = malloc((size_t)len * 4);
    double want[64];
    const float scale = 0.125f;
    double worst = 0.0;
    for (int trial = 0; trial < 12; trial++) {
        for (int32_t d = 0; d < D; d++) q[d] = rng_value(2.0f);
        const int32_t h = trial % H;
        const int64_t first = trial < 6 ? 0 : rng_int(0, 500), end = rng_int(first + 1, len);
        mi_kv_attend_params p = {first, end, scale, NULL, 0, 0};
        CHECK_OK(mi_kv_seq_attend(seq, 0, h, q, &p, scores, out));
        ref_attend(k, v, H, D, h, q, first, end, scale, want);
        for (int32_t d = 0; d < D; d++)
            worst = fmax(worst, fabs(out[d] - want[d]) / (1e-3 + fabs(want[d])));
        /* a tile read equals the gathered rows */
        float tile[64 * 70];
        CHECK_OK(mi_kv_seq_read_tile(seq, 0, h, trial & 1, first,
                                     end - first < 70 ? end - first : 70, tile));
        int bad = 0;
        for (int64_t r = 0; r < (end - first < 70 ? end - first : 70); r++)
            for (int32_t d = 0; d < D; d++)
                bad +=
                    tile[r * D + d] != (trial & 1 ? v : k)[((size_t)(first + r) * H + h) * D + d];
        CHECK(bad == 0, "tile differs in %d values", bad);
    }
    CHECK(worst < 2e-4, "attention over %s pages vs float64 over the dequantized rows: %g",
          mi_kv_dtype_name(dt), worst);
    /* several queries at once (a grouped-query head's): each one's result bit for bit, with and
     * without a key-channel mask over the middle rows, and a mask that keeps no channel */
    {
        enum { NQ = 5 };
        float qs[NQ * 64], outs[NQ * 64], one[64], *sc = malloc((size_t)NQ * len * 4);
        uint8_t mask[64];
        int differ = 0;
        for (int trial = 0; trial < 9; trial++) {
            for (int32_t i = 0; i < NQ * D; i++) qs[i] = rng_value(2.0f);
            for (int32_t d = 0; d < D; d++) mask[d] = trial < 6 ? (uint8_t)(rng_int(0, 3) != 0) : 0;
            const int32_t nq = 1 + trial % NQ, h = trial % H;
            const int64_t first = trial % 2 ? 0 : rng_int(0, 400), end = rng_int(first + 1, len);
            mi_kv_attend_params p = {first,      end,     scale, trial % 3 ? mask : NULL,
                                     first + 50, end - 40};
            CHECK_OK(mi_kv_seq_attend_heads(seq, 0, h, qs, nq, &p, sc, outs));
            for (int32_t t = 0; t < nq; t++) {
                CHECK_OK(mi_kv_seq_attend(seq, 0, h, qs + t * D, &p, scores, one));
                differ += memcmp(one, outs + t * D, (size_t)D * 4) != 0;
            }
        }
        CHECK(differ == 0, "%s: %d grouped queries differ from one-query calls",
              mi_kv_dtype_name(dt), differ);
        mi_kv_attend_params p = {0, len, scale, NULL, 0, 0};
        CHECK_STATUS(mi_kv_seq_attend_heads(seq, 0, 0, qs, 0, &p, sc, outs),
                     MI_STATUS_INVALID_ARGUMENT);
        CHECK_STATUS(mi_kv_seq_attend_heads(seq, 0, 0, qs, 9, &p, sc, outs),
                     MI_STATUS_INVALID_ARGUMENT);
        free(sc);
    }
    mi_kv_attend_params bad = {0, len + 1, scale, NULL, 0, 0};
    CHECK_STATUS(mi_kv_seq_attend(seq, 0, 0, q, &bad, scores, out), MI_STATUS_INVALID_ARGUMENT);
    bad.end = len;
    CHECK_STATUS(mi_kv_seq_attend(seq, 0, H, q, &bad, scores, out), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_attend(seq, 0, 0, q, &bad, NULL, out), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_read_tile(seq, 0, 0, 2, 0, 1, out), MI_STATUS_INVALID_ARGUMENT);
    free(k), free(v), free(scores);
    ref_free(ref);
    mi_kv_seq_destroy(seq);
    mi_kv_pool_destroy(pool);
}

/* A residual longer than the context quantizes nothing: attention is the f32 pages', bit for
 * bit. */
static void test_residual_is_dense(void) {
    const int32_t H = 2, D = 32;
    mi_kv_pool *qp = make_pool(MI_KV_KIVI2, 1, H, D, 64, 32, 4096);
    mi_kv_pool *fp = make_pool(MI_KV_F32, 1, H, D, 64, 0, 0);
    mi_kv_seq *qs = NULL, *fs = NULL;
    CHECK_OK(mi_kv_seq_create(qp, &qs));
    CHECK_OK(mi_kv_seq_create(fp, &fs));
    mi_kv_seq *both[2] = {qs, fs};
    append_all(both, 2, 0, 700, H, D);
    append_all(both, 2, 0, 1, H, D);
    CHECK_EQ(mi_kv_seq_quantized_rows(qs, 0), 0);
    /* the residual's room grows with its rows (doubling), not to residual_length at once */
    mi_kv_seq_stats st;
    CHECK_OK(mi_kv_seq_stats_get(qs, &st));
    CHECK(st.pages == 0 && st.bytes <= 2 * (uint64_t)H * D * sizeof(float) * 2 * 701,
          "%llu bytes for 701 rows", (unsigned long long)st.bytes);
    mi_kv_residual_view rv;
    CHECK_OK(mi_kv_seq_residual(qs, 0, &rv));
    CHECK(rv.first_row == 0 && rv.rows == 701 && rv.stride_rows >= 701 && rv.k && rv.v);
    float q[32], a[32], b[32], *scores = malloc(701 * 4);
    for (int32_t d = 0; d < D; d++) q[d] = rng_value(2.0f);
    mi_kv_attend_params p = {0, 701, 0.17f, NULL, 0, 0};
    CHECK_OK(mi_kv_seq_attend(qs, 0, 1, q, &p, scores, a));
    CHECK_OK(mi_kv_seq_attend(fs, 0, 1, q, &p, scores, b));
    CHECK(memcmp(a, b, sizeof a) == 0, "a residual covering everything differs from f32 pages");
    free(scores);
    mi_kv_seq_destroy(qs);
    mi_kv_seq_destroy(fs);
    mi_kv_pool_destroy(qp);
    mi_kv_pool_destroy(fp);
}

static void test_bad_params(void) {
    mi_kv_pool_params p = mi_kv_pool_default_params();
    p.n_layers = 1, p.n_kv_heads = 1, p.head_dim = 48, p.dtype = MI_KV_KIVI2;
    mi_kv_pool *pool = NULL;
    mi_context *ctx = NULL;
    CHECK_OK(mi_context_create(NULL, &ctx));
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT); /* 48 % 32 */
    CHECK(strstr(mi_context_last_error(ctx), "group size") != NULL);
    p.head_dim = 64, p.quant_group = 6;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    p.quant_group = 0, p.meta_kinds = MI_KV_META_KEY_MINMAX;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    p.meta_kinds = 0, p.quant_residual = -1;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    p.quant_residual = 0;
    CHECK_OK(mi_kv_pool_create(ctx, &p, &pool));
    mi_kv_page_layout L;
    CHECK_OK(mi_kv_pool_layout(pool, &L));
    CHECK(L.bits == 2 && L.group_size == 32 && L.row_stride == 16 && L.elem_bytes == 0);
    CHECK(strcmp(mi_kv_dtype_name(MI_KV_KIVI4), "kivi4") == 0);
    mi_kv_pool_destroy(pool);
    mi_context_destroy(ctx);
}

/* KV bytes per token at the LLaMA-3-8B shape (32 layers, 8 KV heads, head_dim 128) at 128K
 * context: one layer is filled for real (its pages and residual as allocated), times 32. */
static void test_bytes_per_token(void) {
    const int32_t H = 8, D = 128, layers = 32;
    const int64_t ctx = 131072, chunk = 4096;
    const double bf16 = 2.0 * H * D * 2 * layers;
    for (int dt = MI_KV_KIVI2; dt <= MI_KV_KIVI4; dt++) {
        mi_kv_pool *pool = make_pool((mi_kv_dtype)dt, 1, H, D, 64, 32, 32);
        mi_kv_seq *seq = NULL;
        CHECK_OK(mi_kv_seq_create(pool, &seq));
        float *k = malloc((size_t)chunk * H * D * 4), *v = malloc((size_t)chunk * H * D * 4);
        fill_rows(k, chunk, H, D, 0);
        fill_rows(v, chunk, H, D, 1);
        mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, chunk, D);
        mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, chunk, D);
        for (int64_t n = 0; n < ctx; n += chunk) CHECK_OK(mi_kv_seq_append(seq, 0, &tk, &tv));
        mi_kv_seq_stats st;
        CHECK_OK(mi_kv_seq_stats_get(seq, &st));
        const double per_token = (double)st.bytes * layers / (double)ctx;
        printf("KV bytes per token, LLaMA-3-8B shape at %lld tokens: %s %.1f, bf16 %.0f, "
               "ratio %.4f\n",
               (long long)ctx, mi_kv_dtype_name((mi_kv_dtype)dt), per_token, bf16,
               per_token / bf16);
        if (dt == MI_KV_KIVI2) CHECK(per_token <= 0.2 * bf16, "KIVI-2 %.1f bytes", per_token);
        if (dt == MI_KV_KIVI4) CHECK(per_token <= 0.35 * bf16, "KIVI-4 %.1f bytes", per_token);
        free(k), free(v);
        mi_kv_seq_destroy(seq);
        mi_kv_pool_destroy(pool);
    }
}

int main(void) {
    check_seed = rng_state = 20261207;
    test_bad_params();
    test_codec(MI_KV_KIVI2, 32, 32, 64);
    test_codec(MI_KV_KIVI4, 32, 32, 64);
    test_codec(MI_KV_KIVI2, 8, 5, 16);
    test_codec(MI_KV_KIVI4, 16, 40, 32);
    test_fork_cow();
    test_files();
    test_attend(MI_KV_KIVI2);
    test_attend(MI_KV_KIVI4);
    test_attend(MI_KV_F32);
    test_attend(MI_KV_BF16);
    test_attend(MI_KV_F16);
    test_attend(MI_KV_FP8_E4M3);
    test_residual_is_dense();
    test_bytes_per_token();
    test_threads(MI_KV_KIVI2);
    test_threads(MI_KV_KIVI4);
    return check_finish("test_kv_quant");
}
