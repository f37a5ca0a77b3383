/*
 * kv_method_kivi.c: KIVI (asymmetric 2/4-bit keys per channel, values per token, in groups, with
 * a full-precision residual of recent tokens). The keys and defaults are the original's; the
 * method itself is not built yet: a session asking for it gets MI_STATUS_UNSUPPORTED.
 */
#include "kv_method.h"

static const kv_param_def kivi_params[] = {
    {"bits", KV_PARAM_INT, 2, 2, 4, NULL, "bits per element (2 or 4)"},
    {"group_size", KV_PARAM_INT, 32, 1, 4096, NULL, "elements per quantization group"},
    {"residual_length", KV_PARAM_INT, 32, 0, 1 << 20, NULL, "recent tokens kept in full precision"},
};

const kv_method_entry kv_method_kivi_entry = {
    .name = "kivi",
    .summary = "2/4-bit asymmetric KV quantization with a full-precision residual",
    .params = kivi_params,
    .n_params = (int32_t)(sizeof kivi_params / sizeof kivi_params[0]),
    .unsupported = "not built yet",
};
