/* Sparse prefill of one layer: 8 query heads over 2 KV heads (GQA), each head with its own
 * pattern, on synthetic data; compared against dense attention. */
#include <minference.h>
#include <minference_tools.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    const int64_t B = 1, H = 8, H_KV = 2, L = 8192, D = 64;
    mi_context *ctx = NULL;
    if (mi_context_create(NULL, &ctx) != MI_STATUS_SUCCESS) return 1;

    float *q = malloc(sizeof(float) * B * H * L * D);
    float *k = malloc(sizeof(float) * B * H_KV * L * D);
    float *v = malloc(sizeof(float) * B * H_KV * L * D);
    float *out = malloc(sizeof(float) * B * H * L * D);
    float *ref = malloc(sizeof(float) * B * H * L * D);
    mi_tensor tq = mi_tensor_bhld(q, MI_DTYPE_F32, MI_DEVICE_CPU, B, H, L, D);
    mi_tensor tk = mi_tensor_bhld(k, MI_DTYPE_F32, MI_DEVICE_CPU, B, H_KV, L, D);
    mi_tensor tv = mi_tensor_bhld(v, MI_DTYPE_F32, MI_DEVICE_CPU, B, H_KV, L, D);
    mi_tensor tout = mi_tensor_bhld(out, MI_DTYPE_F32, MI_DEVICE_CPU, B, H, L, D);
    mi_tensor tref = mi_tensor_bhld(ref, MI_DTYPE_F32, MI_DEVICE_CPU, B, H, L, D);

    mi_synth_params sp = mi_synth_default_params();
    mi_status st = mi_synth_generate(ctx, &sp, &tq, &tk, &tv, NULL);

    /* Half the heads vertical-slash, a quarter A-shape, a quarter block-sparse. */
    mi_head_pattern patterns[8];
    for (int h = 0; h < H; h++)
        patterns[h] = mi_head_pattern_default(h < 4   ? MI_PATTERN_VERTICAL_SLASH
                                              : h < 6 ? MI_PATTERN_A_SHAPE
                                                      : MI_PATTERN_BLOCK_SPARSE);
    mi_prefill_params params = mi_prefill_default_params();
    params.dense_below = 0; /* always sparse, even at this short length */

    if (st == MI_STATUS_SUCCESS)
        st =
            mi_prefill_attention(ctx, &tq, &tk, &tv, NULL, patterns, &params, &tout, NULL, NULL, 0);
    if (st == MI_STATUS_SUCCESS)
        st = mi_attention_dense(ctx, &tq, &tk, &tv, NULL, 0.0f, &tref, NULL);
    double err = 0.0;
    if (st == MI_STATUS_SUCCESS) st = mi_metrics_rel_l2(ctx, &tout, &tref, NULL, &err);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "error: %s: %s\n", mi_status_string(st), mi_context_last_error(ctx));
    else
        printf("sparse vs dense relative L2 error: %.4f\n", err);

    free(q), free(k), free(v), free(out), free(ref);
    mi_context_destroy(ctx);
    return st == MI_STATUS_SUCCESS ? 0 : 1;
}
