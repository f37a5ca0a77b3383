/*
 * test_kv_leank.c: LeanK key-channel masks: the file (round trip, every malformed case refused
 * with its reason), the mask from importances against a brute-force top-k, and attention with a
 * mask on the middle rows against a float64 reference (an all-ones mask is no mask, bit for bit;
 * a head without channels attends to the sink and recent rows only).
 */
#include "kv_test_util.h"

#include <stdio.h>
#include <unistd.h>

static mi_leank_mask *parse(mi_context *ctx, const char *json, mi_status want, const char *why) {
    mi_leank_mask *m = NULL;
    const mi_status st = mi_leank_mask_parse(ctx, json, strlen(json), &m);
    CHECK(st == want, "%s: status %d, %s", json, (int)st, mi_context_last_error(ctx));
    if (why)
        CHECK(strstr(mi_context_last_error(ctx), why) != NULL, "%s lacks \"%s\"",
              mi_context_last_error(ctx), why);
    return m;
}

static void test_file(mi_context *ctx) {
    const char *good = "{\"format\": \"minference-leank-mask\", \"version\": 1, \"n_layers\": 2, "
                       "\"n_kv_heads\": 2, \"head_dim\": 4, \"source\": \"hand\",\n"
                       "\"masks\": [[\"1010\", \"0000\"], [\"1111\", \"0110\"]]}";
    mi_leank_mask *m = parse(ctx, good, MI_STATUS_SUCCESS, NULL);
    int32_t L, H, D;
    mi_leank_mask_shape(m, &L, &H, &D);
    CHECK(L == 2 && H == 2 && D == 4);
    const uint8_t *r = mi_leank_mask_head(m, 0, 0);
    CHECK(r && r[0] == 1 && r[1] == 0 && r[2] == 1 && r[3] == 0);
    r = mi_leank_mask_head(m, 1, 1);
    CHECK(r && r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 0);
    CHECK(mi_leank_mask_head(m, 2, 0) == NULL && mi_leank_mask_head(m, 0, -1) == NULL);
    CHECK_NEAR(mi_leank_mask_keep_fraction(m), 8.0 / 16.0, 1e-12);
    /* round trip through a file */
    char path[] = "/tmp/mi_leank_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_OK(mi_leank_mask_save(ctx, m, path));
    mi_leank_mask *back = NULL;
    CHECK_OK(mi_leank_mask_load(ctx, path, &back));
    for (int32_t l = 0; l < 2; l++)
        for (int32_t h = 0; h < 2; h++)
            CHECK(memcmp(mi_leank_mask_head(m, l, h), mi_leank_mask_head(back, l, h), 4) == 0);
    mi_leank_mask_destroy(back);
    unlink(path);
    CHECK_STATUS(mi_leank_mask_load(ctx, path, &back), MI_STATUS_IO_ERROR);
    mi_leank_mask_destroy(m);

    static const struct {
        const char *json, *why;
    } bad[] = {
        {"not json", "invalid JSON"},
        {"[1, 2]", "not a"},
        {"{\"format\": \"other\", \"version\": 1}", "not a"},
        {"{\"format\": \"minference-leank-mask\", \"version\": 2, \"n_layers\": 1, \"n_kv_heads\": "
         "1, \"head_dim\": 2, \"masks\": [[\"11\"]]}",
         "version"},
        {"{\"format\": \"minference-leank-mask\", \"version\": 1, \"n_layers\": 0, \"n_kv_heads\": "
         "1, \"head_dim\": 2, \"masks\": []}",
         "positive"},
        {"{\"format\": \"minference-leank-mask\", \"version\": 1, \"n_layers\": 2, \"n_kv_heads\": "
         "1, \"head_dim\": 2, \"masks\": [[\"11\"]]}",
         "list of 2 layers"},
        {"{\"format\": \"minference-leank-mask\", \"version\": 1, \"n_layers\": 1, \"n_kv_heads\": "
         "2, \"head_dim\": 2, \"masks\": [[\"11\"]]}",
         "must list 2 KV heads"},
        {"{\"format\": \"minference-leank-mask\", \"version\": 1, \"n_layers\": 1, \"n_kv_heads\": "
         "1, \"head_dim\": 3, \"masks\": [[\"11\"]]}",
         "string of 3"},
        {"{\"format\": \"minference-leank-mask\", \"version\": 1, \"n_layers\": 1, \"n_kv_heads\": "
         "1, \"head_dim\": 2, \"masks\": [[\"1x\"]]}",
         "channel 1 is 'x'"},
        {"{\"format\": \"minference-leank-mask\", \"version\": 1, \"n_layers\": 1, \"n_kv_heads\": "
         "1, \"head_dim\": 2, \"masks\": [[11]]}",
         "string of 2"},
        {"{\"format\": \"minference-leank-mask\", \"format\": \"minference-leank-mask\"}",
         "invalid JSON"},
        {"{\"format\": \"minference-leank-mask\", \"version\": 1, \"n_layers\": 1, \"n_kv_heads\": "
         "1, \"head_dim\": 2000, \"masks\": [[\"11\"]]}",
         "out of range"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const mi_status want = strcmp(bad[i].why, "out of range") == 0 ? MI_STATUS_INVALID_ARGUMENT
                                                                       : MI_STATUS_PARSE_ERROR;
        CHECK(parse(ctx, bad[i].json, want, bad[i].why) == NULL);
    }
    CHECK_STATUS(mi_leank_mask_parse(ctx, NULL, 0, &m), MI_STATUS_INVALID_ARGUMENT);
}

static void test_from_importance(mi_context *ctx) {
    const int32_t L = 3, H = 2, D = 64;
    double *imp = malloc((size_t)L * H * D * sizeof(double));
    for (size_t i = 0; i < (size_t)L * H * D; i++) imp[i] = (double)(rng_next() % 1000);
    imp[5] = imp[6] = 5000.0; /* a tie at the top */
    static const struct {
        double keep;
        int32_t align, want;
    } cases[] = {{0.3, 8, 16}, {0.5, 1, 32}, {1.0, 16, 64}, {0.01, 8, 8}, {0.7, 32, 32}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        mi_leank_mask *m = NULL;
        CHECK_OK(
            mi_leank_mask_from_importance(ctx, L, H, D, imp, cases[c].keep, cases[c].align, &m));
        for (int32_t l = 0; l < L; l++)
            for (int32_t h = 0; h < H; h++) {
                const double *x = imp + ((size_t)l * H + h) * D;
                const uint8_t *row = mi_leank_mask_head(m, l, h);
                int32_t kept = 0, wrong = 0;
                for (int32_t d = 0; d < D; d++) {
                    kept += row[d];
                    /* brute force: d is kept iff fewer than want channels rank above it */
                    int32_t above = 0;
                    for (int32_t e = 0; e < D; e++) above += x[e] > x[d] || (x[e] == x[d] && e < d);
                    wrong += (above < cases[c].want) != (row[d] == 1);
                }
                CHECK_EQ(kept, cases[c].want);
                CHECK_EQ(wrong, 0);
            }
        mi_leank_mask_destroy(m);
    }
    mi_leank_mask *m = NULL;
    CHECK_STATUS(mi_leank_mask_from_importance(ctx, L, H, D, imp, 0.0, 8, &m),
                 MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_leank_mask_from_importance(ctx, L, H, D, imp, 0.5, 65, &m),
                 MI_STATUS_INVALID_ARGUMENT);
    free(imp);
}

static void test_attend(mi_kv_dtype dt) {
    const int32_t H = 2, D = 64;
    const int64_t len = 900;
    mi_kv_pool_params p = mi_kv_pool_default_params();
    p.n_layers = 1, p.n_kv_heads = H, p.head_dim = D, p.dtype = dt;
    mi_kv_pool *pool = NULL;
    CHECK_OK(mi_kv_pool_create(NULL, &p, &pool));
    mi_kv_seq *seq = NULL;
    CHECK_OK(mi_kv_seq_create(pool, &seq));
    chunk c = chunk_make(H, D, len, MI_DTYPE_F32, false, 2.0f);
    CHECK_OK(mi_kv_seq_append(seq, 0, &c.tk, &c.tv));
    chunk_free(&c);
    float *k = malloc((size_t)len * H * D * 4), *v = malloc((size_t)len * H * D * 4);
    mi_tensor tk = mi_tensor_blhd(k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, len, D);
    mi_tensor tv = mi_tensor_blhd(v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, len, D);
    CHECK_OK(mi_kv_seq_read(seq, 0, 0, len, &tk, &tv)); /* the stored rows */
    uint8_t mask[64], ones[64], zeros[64];
    for (int32_t d = 0; d < D; d++) mask[d] = (d % 3) != 0, ones[d] = 1, zeros[d] = 0;
    float q[64], out[64], out2[64], *scores = malloc((size_t)len * 4);
    const float scale = 0.125f;
    const int64_t m0 = 128, m1 = len - 300; /* sink 128, recent 300 */
    double worst = 0.0;
    for (int trial = 0; trial < 6; trial++) {
        for (int32_t d = 0; d < D; d++) q[d] = rng_value(2.0f);
        const int32_t h = trial % H;
        const uint8_t *mk = trial < 4 ? mask : zeros;
        mi_kv_attend_params ap = {0, len, scale, mk, m0, m1};
        CHECK_OK(mi_kv_seq_attend(seq, 0, h, q, &ap, scores, out));
        /* float64: masked q . k on the middle rows, skipped where the head keeps nothing */
        double s[900], mx = -INFINITY, sum = 0.0, want[64] = {0};
        bool none = trial >= 4;
        for (int64_t r = 0; r < len; r++) {
            const bool mid = r >= m0 && r < m1;
            double dot = 0.0;
            for (int32_t d = 0; d < D; d++)
                if (!mid || mk[d]) dot += (double)q[d] * k[((size_t)r * H + h) * D + d];
            s[r] = (mid && none) ? -INFINITY : dot * scale;
            mx = fmax(mx, s[r]);
        }
        for (int64_t r = 0; r < len; r++) {
            const double w = exp(s[r] - mx);
            sum += w;
            for (int32_t d = 0; d < D; d++) want[d] += w * v[((size_t)r * H + h) * D + d];
        }
        for (int32_t d = 0; d < D; d++)
            worst = fmax(worst, fabs(out[d] - want[d] / sum) / (1e-3 + fabs(want[d] / sum)));
        /* an all-ones mask is no mask */
        ap.channel_mask = ones;
        CHECK_OK(mi_kv_seq_attend(seq, 0, h, q, &ap, scores, out));
        ap.channel_mask = NULL;
        CHECK_OK(mi_kv_seq_attend(seq, 0, h, q, &ap, scores, out2));
        CHECK(memcmp(out, out2, sizeof out) == 0, "an all-ones mask changed the output");
    }
    CHECK(worst < 2e-4, "%s: LeanK attention vs float64: %g", mi_kv_dtype_name(dt), worst);
    free(k), free(v), free(scores);
    mi_kv_seq_destroy(seq);
    mi_kv_pool_destroy(pool);
}

int main(void) {
    check_seed = rng_state = 4821;
    mi_context *ctx = NULL;
    CHECK_OK(mi_context_create(NULL, &ctx));
    test_file(ctx);
    test_from_importance(ctx);
    test_attend(MI_KV_F32);
    test_attend(MI_KV_KIVI2);
    mi_context_destroy(ctx);
    return check_finish("test_kv_leank");
}
