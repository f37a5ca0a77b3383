/*
 * kv_method_kivi.c: KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
 * Cache"). A storage method: the session's cache lives in a pool of KIVI pages (kv_quant.c:
 * keys per channel over groups of group_size tokens, values per token over groups of group_size
 * channels, the newest rows in f32) and the decode attention reads the codes directly
 * (mi_kv_seq_attend). Defaults bits 2, group_size 32, residual_length 32: the original's.
 * bits=16 keeps the model's f32 pages (no quantization).
 */
#include "kv_method.h"

static const kv_param_def kivi_params[] = {
    {"bits", KV_PARAM_INT, 2, 2, 16, NULL, "bits per element: 2 or 4 (16: no quantization)"},
    {"group_size", KV_PARAM_INT, 32, 4, 1024, NULL,
     "tokens per key group and channels per value group (divides head_dim, multiple of 4)"},
    {"residual_length", KV_PARAM_INT, 32, 1, 65536, NULL,
     "recent tokens kept in full precision (up to residual_length + group_size - 1)"},
};

static mi_status kivi_create(kv_method *m) {
    const int64_t bits = (int64_t)kv_spec_get(&m->spec, "bits");
    const int64_t g = (int64_t)kv_spec_get(&m->spec, "group_size");
    if (bits != 2 && bits != 4 && bits != 16)
        return kv_method_fail(m, MI_STATUS_INVALID_ARGUMENT,
                              "kv method kivi: bits must be 2, 4 or 16 (got %lld)",
                              (long long)bits);
    if (g % 4 != 0 || m->geo.head_dim % g != 0)
        return kv_method_fail(m, MI_STATUS_INVALID_ARGUMENT,
                              "kv method kivi: group_size %lld must be a multiple of 4 dividing "
                              "head_dim %d",
                              (long long)g, m->geo.head_dim);
    return MI_STATUS_SUCCESS;
}

static bool kivi_storage(const kv_method *m, mi_kv_pool_params *pp) {
    const int64_t bits = (int64_t)kv_spec_get(&m->spec, "bits");
    if (bits == 16) return false;
    const int32_t g = (int32_t)kv_spec_get(&m->spec, "group_size");
    pp->dtype = bits == 2 ? MI_KV_KIVI2 : MI_KV_KIVI4;
    pp->quant_group = g;
    pp->quant_residual = (int32_t)kv_spec_get(&m->spec, "residual_length");
    pp->meta_kinds = 0;
    if (pp->page_tokens % g) pp->page_tokens = (pp->page_tokens + g - 1) / g * g;
    return true;
}

const kv_method_entry kv_method_kivi_entry = {
    .name = "kivi",
    .summary = "2/4-bit asymmetric KV quantization with a full-precision residual",
    .params = kivi_params,
    .n_params = (int32_t)(sizeof kivi_params / sizeof kivi_params[0]),
    .create = kivi_create,
    .storage = kivi_storage,
};
