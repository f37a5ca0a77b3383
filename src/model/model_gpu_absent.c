/*
 * model_gpu_absent.c: the model runner's CUDA entry points in a build without CUDA.
 */
#include "model_gpu.h"

mi_status mim_gpu_attach(mi_model *m, char *err, size_t err_size) {
    (void)m;
    return mim_fail(err, err_size, MI_STATUS_NOT_BUILT,
                    "this build has no CUDA support (rebuild with nvcc found, or -DMI_CUDA=ON); "
                    "use --device cpu");
}

void mim_gpu_detach(mi_model *m) { (void)m; }

void mim_gpu_pool_memory(mi_model *m, mi_kv_pool_params *pp) {
    (void)m;
    (void)pp;
}

mi_status mim_gpu_forward(mi_model *m, const int32_t *tokens, int64_t n, bool fresh, float *logits,
                          const mi_model_capture *capture) {
    (void)tokens;
    (void)n;
    (void)fresh;
    (void)logits;
    (void)capture;
    return mim_model_fail(m, MI_STATUS_NOT_BUILT, "this build has no CUDA support");
}

mi_status mim_gpu_forward_seq(mi_model *m, const mim_gpu_seq_call *call, const int32_t *tokens,
                              int64_t n, float *logits) {
    (void)call;
    (void)tokens;
    (void)n;
    (void)logits;
    return mim_model_fail(m, MI_STATUS_NOT_BUILT, "this build has no CUDA support");
}
