/*
 * test_cpu_sparse.c: attention over a block index (mi_attention_sparse).
 *  - random indices (ranges at any offset, partly outside the sequence; gathered columns in any
 *    order, some out of range; row blocks with nothing selected) against the float64 reference
 *    under the same index expanded to an element mask by the test itself;
 *  - an index listing every causal block gives exactly the dense kernel's output and LSE;
 *  - columns after the row (not causal) are masked in the column phase too.
 */
#include "test_qkvo.h"

/* Fills x with a random index: non-overlapping ranges and distinct columns outside them, so the
 * element mask is a set (a key listed twice would be counted twice by any kernel). */
static void random_index(mi_sparse_index *x, int64_t L, rng *r) {
    const int64_t R = x->row_blocks;
    for (int64_t bh = 0; bh < (int64_t)x->batch * x->heads; bh++) {
        for (int64_t m = 0; m < R; m++) {
            int32_t *bc = &x->block_count[bh * R + m], *cc = &x->column_count[bh * R + m];
            int32_t *offs = x->block_offset + (bh * R + m) * x->max_blocks;
            int32_t *cols = x->column_index + (bh * R + m) * x->max_columns;
            *bc = *cc = 0;
            if (rng_unif(r) < 0.15) continue; /* a row block with no key at all */
            int64_t cursor = -40 + rng_int(r, 80);
            for (int32_t i = 0; i < x->max_blocks; i++) {
                const int64_t off = cursor + rng_int(r, 100);
                if (off > 64 * m + 100) break;
                offs[(*bc)++] = (int32_t)off;
                cursor = off + 64;
            }
            const int32_t want = (int32_t)rng_int(r, x->max_columns + 1);
            for (int32_t t = 0; t < 4 * want && *cc < want; t++) {
                const int64_t c = -3 + rng_int(r, (64 * m + 80 < L + 6 ? 64 * m + 80 : L + 6));
                bool clash = false;
                for (int32_t i = 0; i < *bc; i++)
                    if (c >= offs[i] && c < offs[i] + 64) clash = true;
                for (int32_t i = 0; i < *cc; i++)
                    if (cols[i] == c) clash = true;
                if (!clash) cols[(*cc)++] = (int32_t)c;
            }
        }
    }
}

typedef struct sparse_case {
    mi_dtype dt;
    bool blhd;
    int64_t B, Hq, Hkv, L, D;
    int32_t seq_lens[2];
    bool use_lens;
} sparse_case;

static void run_random(mi_context *ctx, const sparse_case *c, rng *r) {
    char name[160];
    snprintf(name, sizeof name, "sparse %s %s B%lld Hq%lld Hkv%lld L%lld D%lld%s",
             mi_dtype_name(c->dt), c->blhd ? "blhd" : "bhld", (long long)c->B, (long long)c->Hq,
             (long long)c->Hkv, (long long)c->L, (long long)c->D, c->use_lens ? " varlen" : "");
    qkvo t = qkvo_new(c->dt, c->blhd, c->B, c->Hq, c->Hkv, c->L, c->D, 1.5, r);
    const int32_t R = (int32_t)((c->L + 63) / 64);
    sparse_buf sb = sparse_new((int32_t)c->B, (int32_t)c->Hq, R, 6, 40);
    random_index(&sb.x, c->L, r);
    const int32_t *lens = qkvo_nan_padding(&t, c->use_lens ? c->seq_lens : NULL);
    CHECK_OK(mi_attention_sparse(ctx, &t.q.t, &t.k.t, &t.v.t, lens, &sb.x, 0.0f, &t.o.t, t.lse));
    key_mask km = key_mask_from_index(&sb.x, c->L);
    qkvo_check(name, &t, lens, 0.0, mask_keys, &km);
    free(km.keys);
    free(sb.mem);
    qkvo_free(&t);
}

/* Every causal block listed: bitwise the dense kernel (same tiles in the same order). */
static void full_equals_dense(mi_context *ctx, mi_dtype dt, int64_t L, int64_t D, rng *r) {
    const int64_t Hq = 4, Hkv = 2;
    qkvo t = qkvo_new(dt, false, 2, Hq, Hkv, L, D, 1.5, r);
    tbuf o2 = tb_new(dt, false, 2, Hq, L, D);
    tb_poison(&o2);
    const int32_t lens[2] = {(int32_t)L, (int32_t)(L * 2 / 3)};
    qkvo_nan_padding(&t, lens);
    const int32_t R = (int32_t)((L + 63) / 64);
    sparse_buf sb = sparse_new(2, (int32_t)Hq, R, R, 0);
    for (int64_t bh = 0; bh < 2 * Hq; bh++)
        for (int32_t m = 0; m < R; m++) {
            sb.x.block_count[bh * R + m] = m + 1;
            for (int32_t i = 0; i <= m; i++) sb.x.block_offset[(bh * R + m) * R + i] = 64 * i;
        }
    float *l2 = malloc(t.n_rows * sizeof(float));
    CHECK_OK(mi_attention_dense(ctx, &t.q.t, &t.k.t, &t.v.t, lens, 0.0f, &t.o.t, t.lse));
    CHECK_OK(mi_attention_sparse(ctx, &t.q.t, &t.k.t, &t.v.t, lens, &sb.x, 0.0f, &o2.t, l2));
    const size_t bytes = t.n_rows * (size_t)D * mi_dtype_size(dt);
    CHECK(memcmp(t.o.data, o2.data, bytes) == 0, "full sparse index != dense output (L %lld, %s)",
          (long long)L, mi_dtype_name(dt));
    CHECK(memcmp(t.lse, l2, t.n_rows * sizeof(float)) == 0, "full sparse index != dense LSE");
    free(l2);
    free(sb.mem);
    tb_free(&o2);
    qkvo_free(&t);
}

/* Columns at or after the row, a range reaching past the rows and a column past the sequence
 * end: nothing non-causal leaks. (Columns stay outside the range: a key listed twice counts
 * twice, as in the original; the index builders never list a key twice.) */
static void noncausal_columns(mi_context *ctx, rng *r) {
    const int64_t L = 200, D = 64;
    qkvo t = qkvo_new(MI_DTYPE_F32, false, 1, 1, 1, L, D, 1.0, r);
    const int32_t R = 4;
    sparse_buf sb = sparse_new(1, 1, R, 2, 4);
    for (int32_t m = 0; m < R; m++) {
        sb.x.block_count[m] = 1;
        sb.x.block_offset[m * 2] = 64 * m + 32; /* half of it is after every row of the block */
        sb.x.column_count[m] = 4;
        const int32_t cols[4] = {0, 64 * m + 10, 64 * m + 20, 199};
        memcpy(sb.x.column_index + m * 4, cols, sizeof cols);
    }
    CHECK_OK(mi_attention_sparse(ctx, &t.q.t, &t.k.t, &t.v.t, NULL, &sb.x, 0.0f, &t.o.t, t.lse));
    key_mask km = key_mask_from_index(&sb.x, L);
    qkvo_check("non-causal columns", &t, NULL, 1.0 / 8.0, mask_keys, &km);
    free(km.keys);
    free(sb.mem);
    qkvo_free(&t);
}

int main(int argc, char **argv) {
    check_seed = test_seed(argc, argv, 777);
    rng r = {check_seed};
    mi_context *ctx = test_context();
    const sparse_case cases[] = {
        {MI_DTYPE_F32, false, 1, 1, 1, 1, 64, {0, 0}, false},
        {MI_DTYPE_F32, true, 1, 2, 2, 63, 128, {0, 0}, false},
        {MI_DTYPE_F16, false, 1, 4, 1, 64, 64, {0, 0}, false},
        {MI_DTYPE_BF16, true, 1, 8, 1, 65, 128, {0, 0}, false},
        {MI_DTYPE_F32, false, 1, 4, 1, 1000, 64, {0, 0}, false},
        {MI_DTYPE_F16, true, 1, 2, 2, 1000, 128, {0, 0}, false},
        {MI_DTYPE_BF16, false, 2, 8, 1, 300, 64, {300, 100}, true},
        {MI_DTYPE_F32, true, 2, 4, 1, 777, 128, {0, 500}, true},
        {MI_DTYPE_F32, false, 1, 2, 1, 4099, 128, {0, 0}, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_random(ctx, &cases[i], &r);
    full_equals_dense(ctx, MI_DTYPE_F32, 65, 64, &r);
    full_equals_dense(ctx, MI_DTYPE_BF16, 1000, 128, &r);
    full_equals_dense(ctx, MI_DTYPE_F16, 130, 64, &r);
    noncausal_columns(ctx, &r);
    mi_context_destroy(ctx);
    return check_finish("test_cpu_sparse");
}
