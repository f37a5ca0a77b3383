/*
 * kv_method_leank.c: LeanK (static per-head key-channel pruning from a mask file). The keys and
 * defaults are the original's; the method itself is not built yet: a session asking for it gets
 * MI_STATUS_UNSUPPORTED.
 */
#include "kv_method.h"

static const kv_param_def leank_params[] = {
    {"leank_path", KV_PARAM_STRING, 0, 0, 0, NULL, "the per-head channel mask file"},
    {"sink_size", KV_PARAM_INT, 128, 0, 1 << 20, NULL, "first tokens kept with every channel"},
    {"recent_size", KV_PARAM_INT, 768, 0, 1 << 20, NULL, "last tokens kept with every channel"},
    {"accumu_size", KV_PARAM_INT, 128, 0, 1 << 20, NULL, "tokens accumulated before pruning"},
    {"round_to", KV_PARAM_INT, 32, 1, 1024, NULL, "kept channels rounded to a multiple of"},
};

const kv_method_entry kv_method_leank_entry = {
    .name = "leank",
    .summary = "static per-head key-channel pruning from a mask file",
    .params = leank_params,
    .n_params = (int32_t)(sizeof leank_params / sizeof leank_params[0]),
    .unsupported = "not built yet",
};
