/*
 * test_cpu_vs_static.c: MInference w/ static (mi_vs_static_*) on the CPU.
 *  - the first input's sets are mi_vs_estimate's on that input (the original's static
 *    parameters: 30 forced diagonals), estimated once;
 *  - a later input (another length, other data) reuses them: its output equals, bit for bit,
 *    the explicit-index kernel (mi_vs_build_index + mi_attention_sparse) under the first
 *    input's sets, and the float64 reference under that index's mask;
 *  - budgets covering the sequence are dense attention;
 *  - the sets saved and loaded give the same output without an estimate; malformed files and
 *    mismatched heads are refused; reset estimates again; bad arguments are refused.
 */
#include "test_qkvo.h"

#include <math.h>
#include <unistd.h>

static mi_vs_params static_params(void) {
    mi_vs_params p = mi_vs_default_params();
    p.forced_diagonals = 30;
    return p;
}

static bool same_out(const tbuf *a, const tbuf *b) {
    const size_t n = (size_t)(a->B * a->H * a->L * a->D) * mi_dtype_size(a->t.dtype);
    return memcmp(a->t.data, b->t.data, n) == 0;
}

/* The explicit-index result of vs on t (the kept sets, batch 1, replicated over t's batch). */
static void explicit_run(mi_context *ctx, qkvo *t, const mi_vs_index *vs, tbuf *out, key_mask *km) {
    const int32_t B = (int32_t)t->q.B, H = (int32_t)t->q.H, L = (int32_t)t->q.L;
    vs_buf x = vs_new(B, H, vs->max_vertical, vs->max_slash);
    for (int32_t b = 0; b < B; b++)
        for (int32_t h = 0; h < H; h++) {
            x.x.vertical_count[b * H + h] = vs->vertical_count[h];
            x.x.slash_count[b * H + h] = vs->slash_count[h];
            for (int32_t i = 0; i < vs->max_vertical; i++)
                x.x.vertical_idx[((size_t)b * H + h) * vs->max_vertical + i] =
                    vs->vertical_idx[(size_t)h * vs->max_vertical + i];
            for (int32_t i = 0; i < vs->max_slash; i++)
                x.x.slash_idx[((size_t)b * H + h) * vs->max_slash + i] =
                    vs->slash_idx[(size_t)h * vs->max_slash + i];
        }
    const int32_t R = (L + 63) / 64;
    sparse_buf idx =
        sparse_new(B, H, R, vs->max_slash + 1, vs->max_vertical > 0 ? vs->max_vertical : 1);
    CHECK_OK(mi_vs_build_index(ctx, L, NULL, &x.x, &idx.x));
    CHECK_OK(
        mi_attention_sparse(ctx, &t->q.t, &t->k.t, &t->v.t, NULL, &idx.x, 0.0f, &out->t, NULL));
    *km = key_mask_from_index(&idx.x, L);
    free(idx.mem);
    free(x.mem);
}

static void test_reuse(mi_context *ctx, mi_dtype dt, rng *r) {
    const int64_t H = 4, Hkv = 2, D = 32;
    const int32_t vsz[4] = {40, 100, 64, 30}, ssz[4] = {60, 200, 100, 50};
    qkvo a = qkvo_new(dt, false, 1, H, Hkv, 700, D, 1.0, r);
    qkvo b = qkvo_new(dt, false, 2, H, Hkv, 900, D, 1.0, r);
    mi_vs_static *st = NULL;
    CHECK_OK(mi_vs_static_create(ctx, (int32_t)H, vsz, ssz, NULL, &st));
    CHECK(mi_vs_static_estimates(st) == 0);
    mi_vs_index view;
    CHECK_STATUS(mi_vs_static_sets(st, &view), MI_STATUS_INVALID_ARGUMENT);
    /* first input: its own estimate */
    CHECK_OK(mi_vs_static_attention(ctx, st, &a.q.t, &a.k.t, &a.v.t, 0.0f, &a.o.t, NULL));
    CHECK(mi_vs_static_estimates(st) == 1);
    CHECK_OK(mi_vs_static_sets(st, &view));
    vs_buf want = vs_new(1, (int32_t)H, view.max_vertical, view.max_slash);
    const mi_vs_params sp = static_params();
    CHECK_OK(mi_vs_estimate(ctx, &a.q.t, &a.k.t, NULL, vsz, ssz, &sp, 0.0f, &want.x));
    for (int64_t h = 0; h < H; h++) {
        CHECK(view.vertical_count[h] == want.x.vertical_count[h] &&
              view.slash_count[h] == want.x.slash_count[h]);
        CHECK(memcmp(view.vertical_idx + h * view.max_vertical,
                     want.x.vertical_idx + h * view.max_vertical,
                     (size_t)view.vertical_count[h] * 4) == 0);
        CHECK(memcmp(view.slash_idx + h * view.max_slash, want.x.slash_idx + h * view.max_slash,
                     (size_t)view.slash_count[h] * 4) == 0);
    }
    /* the 30 forced diagonals of the static estimate */
    for (int64_t h = 0; h < H; h++) {
        int forced = 0;
        for (int32_t i = 0; i < view.slash_count[h]; i++)
            forced += view.slash_idx[h * view.max_slash + i] < 30;
        CHECK(forced == 30, "head %lld keeps %d of the 30 forced diagonals", (long long)h, forced);
    }
    free(want.mem);
    /* a later input: no estimate, the explicit kernel's result under the kept sets */
    CHECK_OK(mi_vs_static_attention(ctx, st, &b.q.t, &b.k.t, &b.v.t, 0.0f, &b.o.t, b.lse));
    CHECK(mi_vs_static_estimates(st) == 1);
    tbuf ex = tb_new(dt, false, 2, H, 900, D);
    key_mask km;
    CHECK_OK(mi_vs_static_sets(st, &view));
    explicit_run(ctx, &b, &view, &ex, &km);
    CHECK(same_out(&b.o, &ex), "the second input's output is not the explicit index's");
    char what[64];
    snprintf(what, sizeof what, "static reuse %s", mi_dtype_name(dt));
    qkvo_check(what, &b, NULL, 0, mask_keys, &km);
    free(km.keys);
    /* saved and loaded: the same output, no estimate */
    char path[] = "/tmp/mi_vs_static_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_OK(mi_vs_static_save(ctx, st, path));
    mi_vs_static *st2 = NULL;
    CHECK_OK(mi_vs_static_create(ctx, (int32_t)H, vsz, ssz, NULL, &st2));
    CHECK_OK(mi_vs_static_load(ctx, st2, path));
    CHECK_OK(mi_vs_static_attention(ctx, st2, &b.q.t, &b.k.t, &b.v.t, 0.0f, &ex.t, NULL));
    CHECK(mi_vs_static_estimates(st2) == 0);
    CHECK(same_out(&b.o, &ex), "the loaded sets give another output");
    /* a file for other heads, and a truncated one, are refused */
    mi_vs_static *st3 = NULL;
    CHECK_OK(mi_vs_static_create(ctx, 3, vsz, ssz, NULL, &st3));
    CHECK_STATUS(mi_vs_static_load(ctx, st3, path), MI_STATUS_SHAPE_MISMATCH);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fclose(f);
    CHECK(truncate(path, size - 4) == 0);
    CHECK_STATUS(mi_vs_static_load(ctx, st2, path), MI_STATUS_PARSE_ERROR);
    CHECK(mi_vs_static_estimates(st2) == 0 && mi_vs_static_sets(st2, &view) == MI_STATUS_SUCCESS);
    remove(path);
    CHECK_STATUS(mi_vs_static_load(ctx, st2, path), MI_STATUS_IO_ERROR);
    /* reset: the next input is estimated again */
    mi_vs_static_reset(st);
    CHECK_OK(mi_vs_static_attention(ctx, st, &b.q.t, &b.k.t, &b.v.t, 0.0f, &b.o.t, NULL));
    CHECK(mi_vs_static_estimates(st) == 1);
    /* bad arguments */
    CHECK_STATUS(mi_vs_static_attention(ctx, st3, &b.q.t, &b.k.t, &b.v.t, 0.0f, &b.o.t, NULL),
                 MI_STATUS_SHAPE_MISMATCH);
    CHECK_STATUS(mi_vs_static_attention(ctx, st, NULL, &b.k.t, &b.v.t, 0.0f, &b.o.t, NULL),
                 MI_STATUS_INVALID_ARGUMENT);
    mi_vs_static *none = NULL;
    const int32_t neg[1] = {-1};
    CHECK_STATUS(mi_vs_static_create(ctx, 1, neg, ssz, NULL, &none), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_vs_static_create(ctx, 0, vsz, ssz, NULL, &none), MI_STATUS_INVALID_ARGUMENT);
    CHECK(none == NULL);
    mi_vs_static_destroy(st3);
    mi_vs_static_destroy(st2);
    mi_vs_static_destroy(st);
    tb_free(&ex);
    qkvo_free(&a);
    qkvo_free(&b);
}

/* budgets covering the sequence: every key, dense (on inputs up to the first's length) */
static void test_dense(mi_context *ctx, mi_dtype dt, rng *r) {
    const int32_t big[2] = {100000, 100000};
    qkvo a = qkvo_new(dt, false, 1, 2, 1, 650, 32, 1.0, r);
    qkvo b = qkvo_new(dt, false, 1, 2, 1, 650, 32, 1.0, r);
    mi_vs_static *st = NULL;
    CHECK_OK(mi_vs_static_create(ctx, 2, big, big, NULL, &st));
    CHECK_OK(mi_vs_static_attention(ctx, st, &a.q.t, &a.k.t, &a.v.t, 0.0f, &a.o.t, a.lse));
    CHECK_OK(mi_vs_static_attention(ctx, st, &b.q.t, &b.k.t, &b.v.t, 0.0f, &b.o.t, b.lse));
    char what[64];
    snprintf(what, sizeof what, "static covering all %s", mi_dtype_name(dt));
    qkvo_check(what, &a, NULL, 0, mask_all, NULL);
    qkvo_check(what, &b, NULL, 0, mask_all, NULL);
    mi_vs_static_destroy(st);
    qkvo_free(&a);
    qkvo_free(&b);
}

int main(int argc, char **argv) {
    const uint64_t seed = test_seed(argc, argv, 20261208);
    check_seed = seed;
    rng r = {seed};
    mi_context *ctx = test_context();
    test_reuse(ctx, MI_DTYPE_F32, &r);
    test_reuse(ctx, MI_DTYPE_BF16, &r);
    test_dense(ctx, MI_DTYPE_F32, &r);
    test_dense(ctx, MI_DTYPE_BF16, &r);
    mi_context_destroy(ctx);
    return check_finish("cpu_vs_static");
}
