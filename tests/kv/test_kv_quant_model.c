/*
 * test_kv_quant_model.c: KIVI and LeanK in the model runner's sessions (mi_session_params.kv), on
 * a small random-weights model and, when installed, on SmolLM2.
 *
 *  - kivi:bits=16 and leank with an all-ones mask are the dense session, bit for bit;
 *  - kivi with a residual longer than the context reads the f32 residual through the page
 *    reader: the dense logits within float rounding;
 *  - KIVI-2 / KIVI-4 sessions decode, stay near dense (4 bits nearer than 2), take a fraction of
 *    the dense session's bytes; fork, save and load continue exactly; a KIVI file is refused by a
 *    dense session;
 *  - LeanK with a pruning mask changes the decode logits only, and a bad mask file is refused.
 */
#define _POSIX_C_SOURCE 200809L
#include "minference_kv.h"
#include "minference_session.h"
#include "model_runner.h"
#include "model_test_util.h"
#include "session_test_util.h"

#include <unistd.h>

/* A mask file for the model: every channel kept, or every third channel of every head pruned
 * (and head 0 of layer 0 pruned whole). */
static bool write_mask(const char *path, int32_t L, int32_t H, int32_t D, bool prune) {
    mi_leank_mask *mask = NULL;
    if (mi_leank_mask_create(test_ctx(), L, H, D, &mask) != MI_STATUS_SUCCESS) return false;
    uint8_t keep[1024];
    for (int32_t l = 0; prune && l < L; l++)
        for (int32_t h = 0; h < H; h++) {
            for (int32_t d = 0; d < D; d++) keep[d] = (l == 0 && h == 0) ? 0 : d % 3 != 0;
            mi_leank_mask_set(mask, l, h, keep);
        }
    const bool ok = mi_leank_mask_save(test_ctx(), mask, path) == MI_STATUS_SUCCESS;
    mi_leank_mask_destroy(mask);
    return ok;
}

/* kivi:bits=16 and an all-ones LeanK mask: dense, bit for bit. */
static void test_identity(mi_model *m, const int32_t *tok, int n0, int n1, int steps, int V,
                          const char *ones_mask) {
    const int calls = 2 + steps;
    float *ref = malloc((size_t)calls * V * sizeof(float));
    float *got = malloc((size_t)calls * V * sizeof(float));
    mi_session *d = open_kv(m, NULL);
    CHECK_OK(script(d, tok, n0, n1, steps, ref, V));
    mi_session_destroy(d);
    char leank[600];
    snprintf(leank, sizeof leank, "leank:mask=%s,sink_size=4,recent_size=8", ones_mask);
    const char *specs[] = {"kivi:bits=16", leank};
    for (int i = 0; i < 2; i++) {
        mi_session *s = open_kv(m, specs[i]);
        if (!s) continue;
        CHECK_OK(script(s, tok, n0, n1, steps, got, V));
        CHECK(memcmp(got, ref, (size_t)calls * V * sizeof(float)) == 0, "%s differs from dense",
              specs[i]);
        mi_session_destroy(s);
    }
    /* a residual over the context: every row f32, read through the page reader */
    char spec[64];
    snprintf(spec, sizeof spec, "kivi:bits=2,residual_length=%d", n0 + n1 + steps + 1);
    mi_session *s = open_kv(m, spec);
    if (s) {
        CHECK_OK(script(s, tok, n0, n1, steps, got, V));
        for (int c = 0; c < calls; c++)
            CHECK(test_rel_l2(got + (size_t)c * V, ref + (size_t)c * V, V) < 1e-5,
                  "call %d: rel %g", c, test_rel_l2(got + (size_t)c * V, ref + (size_t)c * V, V));
        mi_session_destroy(s);
    }
    free(ref);
    free(got);
}

static void test_kivi(mi_model *m, const int32_t *tok, int V) {
    const int n0 = 300, n1 = 40, steps = 8, calls = 2 + steps;
    float *ref = malloc((size_t)calls * V * sizeof(float));
    float *got = malloc((size_t)calls * V * sizeof(float));
    mi_session *d = open_kv(m, NULL);
    CHECK_OK(script(d, tok, n0, n1, steps, ref, V));
    mi_session_stats dst;
    CHECK_OK(mi_session_stats_get(d, &dst));
    double err[2] = {0, 0};
    const char *specs[2] = {"kivi:bits=2", "kivi:bits=4"};
    for (int b = 0; b < 2; b++) {
        mi_session *s = open_kv(m, specs[b]);
        if (!s) continue;
        CHECK_OK(script(s, tok, n0, n1, steps, got, V));
        /* the prefill attends to its own f32 rows: equal; the decode steps read the codes */
        CHECK(memcmp(got, ref, (size_t)V * sizeof(float)) == 0, "%s: prefill differs", specs[b]);
        for (int c = 2; c < calls; c++) {
            const double e = test_rel_l2(got + (size_t)c * V, ref + (size_t)c * V, V);
            CHECK(isfinite(e), "%s call %d", specs[b], c);
            err[b] = fmax(err[b], e);
        }
        mi_session_stats st;
        CHECK_OK(mi_session_stats_get(s, &st));
        CHECK(st.n_tokens == dst.n_tokens && st.bytes < dst.bytes * (b ? 0.4 : 0.3),
              "%s: %llu bytes, dense %llu", specs[b], (unsigned long long)st.bytes,
              (unsigned long long)dst.bytes);
        /* fork and save / load continue exactly like the session */
        mi_session *f = NULL, *l = open_kv(m, specs[b]);
        CHECK_OK(mi_session_fork(s, &f));
        char path[] = "/tmp/mi_kvqm_XXXXXX";
        const int fd = mkstemp(path);
        close(fd);
        CHECK_OK(mi_session_save(s, path));
        if (l) CHECK_OK(mi_session_load(l, path));
        float *a = malloc((size_t)V * 4), *x = malloc((size_t)V * 4), *y = malloc((size_t)V * 4);
        for (int i = 0; i < 5; i++) {
            const int32_t t = tok[n0 + n1 + steps + i];
            CHECK_OK(mi_session_decode(s, &t, 1, a));
            if (f) CHECK_OK(mi_session_decode(f, &t, 1, x));
            if (l) CHECK_OK(mi_session_decode(l, &t, 1, y));
            CHECK(!f || memcmp(a, x, (size_t)V * 4) == 0, "%s: the fork differs", specs[b]);
            CHECK(!l || memcmp(a, y, (size_t)V * 4) == 0, "%s: the loaded copy differs", specs[b]);
        }
        CHECK_OK(mi_session_rewind(s, 60)); /* into quantized rows */
        CHECK_OK(mi_session_decode(s, &tok[5], 1, a));
        /* a dense session refuses the quantized file */
        CHECK_STATUS(mi_session_load(d, path), MI_STATUS_INVALID_ARGUMENT);
        unlink(path);
        free(a), free(x), free(y);
        mi_session_destroy(f);
        mi_session_destroy(l);
        mi_session_destroy(s);
    }
    printf("KIVI decode logits vs dense (rel L2, worst of %d steps): 2 bits %.4f, 4 bits %.4f\n",
           steps + 1, err[0], err[1]);
    /* unrelated logits are ~1.4 apart: 4 bits nearer than 2, both clearly related */
    CHECK(err[1] < err[0] && err[0] < 1.0, "2 bits %g, 4 bits %g", err[0], err[1]);
    mi_session_destroy(d);
    free(ref);
    free(got);
}

static void test_leank(mi_model *m, const int32_t *tok, int V, const char *pruned) {
    const int n0 = 200, n1 = 40, steps = 4, calls = 2 + steps;
    float *ref = malloc((size_t)calls * V * sizeof(float));
    float *got = malloc((size_t)calls * V * sizeof(float));
    mi_session *d = open_kv(m, NULL);
    CHECK_OK(script(d, tok, n0, n1, steps, ref, V));
    mi_session_destroy(d);
    char spec[600];
    snprintf(spec, sizeof spec, "leank:leank_path=%s,sink_size=16,recent_size=32", pruned);
    mi_session *s = open_kv(m, spec);
    if (s) {
        CHECK_OK(script(s, tok, n0, n1, steps, got, V));
        CHECK(memcmp(got, ref, (size_t)V * 4) == 0, "the first prefill is not pruned");
        double e = 0.0;
        for (int c = 2; c < calls; c++)
            e = fmax(e, test_rel_l2(got + (size_t)c * V, ref + (size_t)c * V, V));
        printf("LeanK (a third of the channels pruned) decode logits vs dense: rel L2 %.4f\n", e);
        CHECK(e > 0.0 && isfinite(e), "pruned decode vs dense: %g", e);
        mi_session_destroy(s);
    }
    /* masks that do not fit or do not exist */
    mi_session_params p = mi_session_default_params();
    mi_session *x = NULL;
    p.kv = "leank";
    CHECK_STATUS(mi_session_create(m, &p, &x), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_model_last_error(m), "mask") != NULL, "%s", mi_model_last_error(m));
    p.kv = "leank:mask=/nonexistent/mask.json";
    CHECK_STATUS(mi_session_create(m, &p, &x), MI_STATUS_IO_ERROR);
    char path[] = "/tmp/mi_kvqm_mask_XXXXXX";
    close(mkstemp(path));
    write_mask(path, 1, 1, 8, false);
    char bad[600];
    snprintf(bad, sizeof bad, "leank:mask=%s", path);
    p.kv = bad;
    CHECK_STATUS(mi_session_create(m, &p, &x), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_model_last_error(m), "the model has") != NULL, "%s", mi_model_last_error(m));
    unlink(path);
    p.kv = "kivi:bits=3";
    CHECK_STATUS(mi_session_create(m, &p, &x), MI_STATUS_INVALID_ARGUMENT);
    free(ref);
    free(got);
}

static void run_model(mi_model *m, const int32_t *tok, int V, int32_t L, int32_t H, int32_t D) {
    char ones[] = "/tmp/mi_kvqm_ones_XXXXXX", pruned[] = "/tmp/mi_kvqm_pruned_XXXXXX";
    close(mkstemp(ones));
    close(mkstemp(pruned));
    CHECK(write_mask(ones, L, H, D, false) && write_mask(pruned, L, H, D, true));
    test_identity(m, tok, 150, 40, 6, V, ones);
    test_kivi(m, tok, V);
    test_leank(m, tok, V, pruned);
    unlink(ones);
    unlink(pruned);
}

int main(void) {
    mi_model_shape sh = test_small_shape();
    mi_model *m = test_random_model(&sh, 11);
    if (!m) return check_finish("kv.quant_model");
    mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1);
    const int V = sh.vocab;
    int32_t tok[700];
    for (int i = 0; i < 700; i++) tok[i] = (int32_t)((i * 37 + 11) % V);
    run_model(m, tok, V, sh.n_layers, sh.n_kv_heads, sh.head_dim);
    mi_model_destroy(m);

    char *path = test_find_model();
    if (!path) {
        printf("SmolLM2 not installed: its part skipped\n");
        return check_finish("kv.quant_model");
    }
    mi_model_params p = mi_model_default_params();
    p.n_threads = 2;
    if (mi_model_load(test_ctx(), path, &p, &m) != MI_STATUS_SUCCESS) {
        CHECK(false, "load %s", path);
    } else {
        mi_model_info info;
        mi_model_get_info(m, &info);
        for (int i = 0; i < 700; i++) tok[i] = 100 + (i * 7919) % 20000;
        run_model(m, tok, info.vocab, info.n_layers, info.n_kv_heads, info.head_dim);
        mi_model_destroy(m);
    }
    free(path);
    return check_finish("kv.quant_model");
}
