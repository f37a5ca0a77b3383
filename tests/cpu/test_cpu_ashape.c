/*
 * test_cpu_ashape.c: A-shape and Tri-shape attention against the float64 reference under the
 * element mask {j <= i : i - j < n_local} ∪ {j < n_init} (+ the last min(n_last, len - 1) rows
 * dense), including the empty pattern (rows with no key: output 0, LSE -inf), windows narrower
 * and wider than a tile, sinks overlapping the window, n_last beyond the length, and varlen.
 */
#include "test_qkvo.h"

typedef struct ashape_case {
    mi_dtype dt;
    bool blhd;
    int64_t B, Hq, Hkv, L, D;
    int32_t n_init, n_local, n_last;
    int32_t seq_lens[2];
    bool use_lens;
} ashape_case;

static void run_ashape(mi_context *ctx, const ashape_case *c, rng *r) {
    char name[200];
    snprintf(name, sizeof name,
             "a-shape %s %s B%lld Hq%lld Hkv%lld L%lld D%lld init %d local %d "
             "last %d%s",
             mi_dtype_name(c->dt), c->blhd ? "blhd" : "bhld", (long long)c->B, (long long)c->Hq,
             (long long)c->Hkv, (long long)c->L, (long long)c->D, c->n_init, c->n_local, c->n_last,
             c->use_lens ? " varlen" : "");
    qkvo t = qkvo_new(c->dt, c->blhd, c->B, c->Hq, c->Hkv, c->L, c->D, 1.5, r);
    const int32_t *lens = qkvo_nan_padding(&t, c->use_lens ? c->seq_lens : NULL);
    CHECK_OK(mi_attention_a_shape(ctx, &t.q.t, &t.k.t, &t.v.t, lens, c->n_init, c->n_local,
                                  c->n_last, 0.0f, &t.o.t, t.lse));
    ashape_mask m = {c->n_init, c->n_local, c->n_last, lens, c->L};
    qkvo_check(name, &t, lens, 0.0, mask_ashape, &m);
    qkvo_free(&t);
}

int main(int argc, char **argv) {
    check_seed = test_seed(argc, argv, 4321);
    rng r = {check_seed};
    mi_context *ctx = test_context();
    const ashape_case cases[] = {
        /* dt, blhd, B, Hq, Hkv, L, D, n_init, n_local, n_last, lens, use_lens */
        {MI_DTYPE_F32, false, 1, 1, 1, 1, 64, 4, 16, 0, {0, 0}, false},
        {MI_DTYPE_F32, false, 1, 2, 2, 63, 64, 4, 16, 0, {0, 0}, false},
        {MI_DTYPE_F16, true, 1, 4, 1, 64, 128, 1, 1, 0, {0, 0}, false},   /* diagonal only */
        {MI_DTYPE_BF16, false, 1, 8, 1, 65, 64, 0, 64, 0, {0, 0}, false}, /* window = tile */
        {MI_DTYPE_F32, true, 1, 4, 1, 1000, 128, 128, 300, 0, {0, 0}, false},
        {MI_DTYPE_F16, false, 1, 2, 2, 1000, 64, 3, 70, 100, {0, 0}, false},  /* Tri-shape */
        {MI_DTYPE_BF16, true, 1, 4, 4, 1000, 64, 100, 150, 0, {0, 0}, false}, /* sinks touch win */
        {MI_DTYPE_F32, false, 1, 2, 1, 300, 64, 0, 0, 0, {0, 0}, false},      /* empty pattern */
        {MI_DTYPE_F32, false, 1, 2, 1, 300, 64, 0, 0, 40, {0, 0}, false},     /* only Tri rows */
        {MI_DTYPE_F32, true, 1, 1, 1, 65, 128, 0, 5, 1000, {0, 0}, false},    /* n_last > L */
        {MI_DTYPE_F32, false, 1, 1, 1, 200, 64, 500, 10, 0, {0, 0}, false},   /* all sinks */
        {MI_DTYPE_F16, true, 2, 4, 2, 500, 64, 7, 90, 33, {500, 129}, true},
        {MI_DTYPE_F32, false, 2, 2, 1, 200, 128, 16, 40, 0, {0, 70}, true},
        {MI_DTYPE_F32, false, 1, 1, 1, 4099, 128, 128, 1000, 100, {0, 0}, false},
        {MI_DTYPE_F16, false, 1, 2, 1, 333, 96, 10, 77, 20, {0, 0}, false}, /* D = 96 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_ashape(ctx, &cases[i], &r);
    mi_context_destroy(ctx);
    return check_finish("test_cpu_ashape");
}
