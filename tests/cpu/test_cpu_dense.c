/*
 * test_cpu_dense.c: dense causal attention and its LSE against the float64 reference, over
 * lengths around the 64-row tile (1, 63, 64, 65, 1000, 4099), GQA groups 1/4/8, D 64/128 (and
 * 3, 200, 256), all
 * dtypes, both layouts, batches with different lengths (including an empty sequence) and a
 * custom softmax scale.
 */
#include "test_qkvo.h"

typedef struct dense_case {
    mi_dtype dt;
    bool blhd;
    int64_t B, Hq, Hkv, L, D;
    int32_t seq_lens[2];
    bool use_lens;
    float scale;
} dense_case;

static void run_dense(mi_context *ctx, const dense_case *c, rng *r) {
    char name[160];
    snprintf(name, sizeof name, "dense %s %s B%lld Hq%lld Hkv%lld L%lld D%lld%s scale %g",
             mi_dtype_name(c->dt), c->blhd ? "blhd" : "bhld", (long long)c->B, (long long)c->Hq,
             (long long)c->Hkv, (long long)c->L, (long long)c->D, c->use_lens ? " varlen" : "",
             (double)c->scale);
    qkvo t = qkvo_new(c->dt, c->blhd, c->B, c->Hq, c->Hkv, c->L, c->D, 1.5, r);
    const int32_t *lens = qkvo_nan_padding(&t, c->use_lens ? c->seq_lens : NULL);
    CHECK_OK(mi_attention_dense(ctx, &t.q.t, &t.k.t, &t.v.t, lens, c->scale, &t.o.t, t.lse));
    qkvo_check(name, &t, lens, c->scale, mask_all, NULL);
    /* lse is optional */
    tb_poison(&t.o);
    CHECK_OK(mi_attention_dense(ctx, &t.q.t, &t.k.t, &t.v.t, lens, c->scale, &t.o.t, NULL));
    compare_out(name, &t.o, t.ref, lens);
    qkvo_free(&t);
}

int main(int argc, char **argv) {
    check_seed = test_seed(argc, argv, 1234);
    rng r = {check_seed};
    mi_context *ctx = test_context();
    const int64_t lens[] = {1, 63, 64, 65, 1000};
    const mi_dtype dts[] = {MI_DTYPE_F32, MI_DTYPE_F16, MI_DTYPE_BF16};
    const int64_t groups[] = {1, 4, 8};
    int idx = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        for (int di = 0; di < 3; di++) {
            for (int lay = 0; lay < 2; lay++, idx++) {
                dense_case c = {0};
                c.dt = dts[di];
                c.blhd = lay == 1;
                c.B = 1;
                const int64_t g = groups[idx % 3];
                c.Hkv = g == 1 ? 2 : 1;
                c.Hq = c.Hkv * g;
                if (lens[li] >= 1000 && c.Hq > 4) c.Hq = 4, c.Hkv = 1; /* keep the reference fast */
                c.L = lens[li];
                c.D = (idx / 3) % 2 ? 128 : 64;
                run_dense(ctx, &c, &r);
            }
        }
    }
    /* GQA 8 at a length with several tiles */
    dense_case g8 = {MI_DTYPE_F32, false, 1, 8, 1, 200, 64, {0, 0}, false, 0.0f};
    run_dense(ctx, &g8, &r);
    /* batches of different lengths, including an empty sequence; custom scale */
    dense_case v1 = {MI_DTYPE_F32, true, 2, 4, 2, 200, 64, {200, 131}, true, 0.0f};
    run_dense(ctx, &v1, &r);
    dense_case v2 = {MI_DTYPE_BF16, false, 2, 2, 1, 130, 128, {57, 0}, true, 0.3f};
    run_dense(ctx, &v2, &r);
    dense_case v3 = {MI_DTYPE_F16, true, 2, 8, 2, 300, 128, {300, 65}, true, 0.05f};
    run_dense(ctx, &v3, &r);
    /* head sizes that are not multiples of the register block or the vector width */
    dense_case d3 = {MI_DTYPE_F32, false, 1, 2, 1, 130, 3, {0, 0}, false, 0.0f};
    run_dense(ctx, &d3, &r);
    dense_case d200 = {MI_DTYPE_F16, true, 1, 2, 2, 100, 200, {0, 0}, false, 0.0f};
    run_dense(ctx, &d200, &r);
    dense_case d256 = {MI_DTYPE_BF16, false, 1, 1, 1, 70, 256, {0, 0}, false, 0.0f};
    run_dense(ctx, &d256, &r);
    /* long sequences, a few only: the float64 reference is quadratic */
    dense_case l1 = {MI_DTYPE_F32, false, 1, 1, 1, 4099, 128, {0, 0}, false, 0.0f};
    run_dense(ctx, &l1, &r);
    dense_case l2 = {MI_DTYPE_BF16, true, 1, 2, 1, 4099, 64, {0, 0}, false, 0.0f};
    run_dense(ctx, &l2, &r);
    mi_context_destroy(ctx);
    return check_finish("test_cpu_dense");
}
