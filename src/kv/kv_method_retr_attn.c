/*
 * kv_method_retr_attn.c: RetrievalAttention (old tokens in host memory behind a vector index,
 * a static part of sinks and window, top-k retrieved keys merged by log-sum-exp). The keys and
 * defaults are the original's; the method itself is not built yet: a session asking for it gets
 * MI_STATUS_UNSUPPORTED.
 */
#include "kv_method.h"

static const kv_param_def retr_params[] = {
    {"top_k", KV_PARAM_INT, 4096, 1, 1 << 24, NULL, "keys retrieved per head and step"},
    {"from_layer", KV_PARAM_INT, 0, 0, 1 << 16, NULL, "first layer that retrieves"},
    {"n_init", KV_PARAM_INT, 128, 0, 1 << 20, NULL, "sink tokens of the static part"},
    {"n_local", KV_PARAM_INT, 512, 0, 1 << 24, NULL, "recent tokens of the static part"},
};

const kv_method_entry kv_method_retr_attn_entry = {
    .name = "retr_attn",
    .summary = "top-k keys from a vector index over the host-resident cache, plus sinks and window",
    .params = retr_params,
    .n_params = (int32_t)(sizeof retr_params / sizeof retr_params[0]),
    .unsupported = "not built yet",
};
