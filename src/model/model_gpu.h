/*
 * model_gpu.h: the CUDA path of the model runner (model_gpu.cu; model_gpu_absent.c in builds
 * without CUDA, where loading for MI_DEVICE_CUDA reports MI_STATUS_NOT_BUILT).
 *
 * The GPU copy of a model holds bf16 weights (every GGUF/safetensors type is expanded on the host
 * one slice at a time and converted on the device), a bf16 KV cache, and fp32 residuals. The
 * host copy (memory-mapped file, tokenizer) stays: the tokenizer and the config checks use it.
 */
#ifndef MI_MODEL_GPU_H
#define MI_MODEL_GPU_H

#include "model_runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Uploads the weights of a loaded model to device params.device_id and makes m->ctx a CUDA
 * context on the model's stream. On failure the model is left without a GPU copy and err holds
 * a message. */
mi_status mim_gpu_attach(mi_model *m, char *err, size_t err_size);
/* Releases every device buffer (NULL-safe). */
void mim_gpu_detach(mi_model *m);

/* Sets the host memory of a session pool of this model: pinned, for the device to read pages
 * directly (model_gpu_pages.h), where params.kv_pinned asks for it; nothing otherwise. */
void mim_gpu_pool_memory(mi_model *m, mi_kv_pool_params *pp);

/* The forward pass of model_forward.c on the GPU: tokens (validated by the caller) at positions
 * n_past.. (fresh: from 0, through mi_prefill_attention; otherwise dense over the cache). Writes
 * the last position's logits (may be NULL). With capture (fresh only), calls capture->on_layer
 * with host fp32 copies of each layer's q/k/v and fills capture->token_log_probs; the cache is
 * then left empty. */
mi_status mim_gpu_forward(mi_model *m, const int32_t *tokens, int64_t n, bool fresh, float *logits,
                          const mi_model_capture *capture);

/* A session's call (model_forward.c) on the GPU. */
typedef struct mim_gpu_seq_call {
    mi_kv_seq *seq;
    struct kv_method *method; /* NULL: the full cache, attended on the device */
    int64_t pos;              /* RoPE position of the first token (tokens seen) */
    /* for a method's compression after the call: the last q_rows queries of every layer,
     * [n_layers][q_rows][qd] (NULL: not wanted) */
    float *qkeep;
    int64_t q_rows;
} mim_gpu_seq_call;

/* Without a method the device cache is first made to hold the session's rows (only the pages it
 * does not already mirror are uploaded), the forward runs, and the new rows are appended to the
 * session. With one, the first call runs on the device likewise and later calls attend on the
 * host over the pages with the method's selection (mim_seq_attention), the rest on the device.
 * All or nothing: on failure the session keeps its rows. Leaves the model's own sequence
 * empty. */
mi_status mim_gpu_forward_seq(mi_model *m, const mim_gpu_seq_call *call, const int32_t *tokens,
                              int64_t n, float *logits);

#ifdef __cplusplus
}
#endif

#endif /* MI_MODEL_GPU_H */
