/*
 * model_gpu_quest.h: Quest's decode step on the device (model_gpu_quest.cu).
 *
 * A session whose pages lie in pinned host memory (kv_pinned) can let the device do what the
 * host does for Quest in a one-token call, per layer:
 *   - keep a mirror of every page's key bounds (the pool's MI_KV_META_KEY_MINMAX) and address,
 *     refreshed only for the pages whose id, version or covered rows changed;
 *   - rank the pages per query head by the bound of q.k with the host's arithmetic (the same
 *     products, sums in the same order) and ties (the lower page first), so the same pages win;
 *   - read only the chosen pages over the bus, decoded to f32 exactly as the host reader
 *     decodes them, and attend to them with an online softmax.
 * So an offloaded cache costs the bus its selected pages only; the result equals the host's up
 * to the order of the floating-point sums of the attention.
 */
#ifndef MI_MODEL_GPU_QUEST_H
#define MI_MODEL_GPU_QUEST_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "minference_kv.h"
}

struct mim_quest_dev;

/* A state for a model's shapes; NULL when out of host memory. Device memory grows on use. */
mim_quest_dev *mim_quest_dev_create(int n_layers, int n_heads, int n_kv, int head_dim);
void mim_quest_dev_destroy(mim_quest_dev *d);
/* Device memory it holds. */
size_t mim_quest_dev_bytes(const mim_quest_dev *d);

/* Whether pages of this layout can be read here (f32, bf16, f16 or fp8 pages with key bounds). */
bool mim_quest_dev_readable(const mi_kv_page_layout *lay, int n_kv, int head_dim);

/* The attention of one query row over layer `layer` of seq, which holds `rows` rows (the query's
 * own last): q bf16 [n_heads][head_dim] on the device, out bf16 likewise. Reads every page when
 * `all`, else per query head the kv_quest_pages(budget, ...) pages of the largest bound. Every
 * page's data and metadata must be pinned and mapped (the caller checks). On failure returns
 * an error code and writes a message to err. */
cudaError_t mim_quest_dev_attend(mim_quest_dev *d, const mi_kv_seq *seq, int layer, int64_t rows,
                                 int64_t budget, bool all, const __nv_bfloat16 *q, float scale,
                                 __nv_bfloat16 *out, cudaStream_t stream, char *err,
                                 size_t err_size);

#endif /* MI_MODEL_GPU_QUEST_H */
