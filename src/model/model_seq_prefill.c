/*
 * model_seq_prefill.c: a session's follow-up turn or later chunk through the library's prefill
 * attention, the queries at an offset over the whole cache, with the layer's patterns (so a
 * follow-up turn past the sparse crossover runs sparse, and below it dense but blocked).
 *
 * The layer's rows are gathered out of the pages into one contiguous [1, n_kv, L, hd] buffer
 * (mi_kv_seq_read, head-major like the pages: one copy per (page, head)); the kernels do not read
 * a page table yet. The gather is O(L) per layer against the O(n L) attention, which is why short
 * calls (decode, a few tokens) keep the in-place dense loop of model_session.c: below
 * MIM_SEQ_PREFILL_FROM tokens the gather is not paid back (measured in docs/kv-cache.md). The
 * model's own contiguous cache takes the same route (no gather), so that a session and the model
 * still give the same logits bit for bit.
 */
#include "minference_kv.h"
#include "model_runner.h"

#include <stdlib.h>

mi_status mim_prefill_at_offset(mi_model *m, int32_t layer, const float *q, int64_t n,
                                const mi_tensor *k, const mi_tensor *v, float *out) {
    const int64_t L = k->shape[2];
    mi_head_pattern *pat = malloc((size_t)m->n_heads * sizeof *pat);
    mi_status st = pat ? mim_layer_patterns(m, layer, L, pat)
                       : mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY, "out of memory for patterns");
    if (st == MI_STATUS_SUCCESS) {
        /* the dense fallback and the window rule look at the whole sequence */
        const mi_prefill_params pp = mim_prefill_params_for(m, L);
        mi_tensor tq =
            mi_tensor_blhd((void *)q, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
        mi_tensor to = mi_tensor_blhd(out, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_heads, n, m->hd);
        st = mi_prefill_attention(m->ctx, &tq, k, v, NULL, pat, &pp, &to, NULL, NULL, 0);
        if (st != MI_STATUS_SUCCESS)
            mim_model_fail(m, st, "layer %d attention: %s", layer, mi_context_last_error(m->ctx));
    }
    free(pat);
    return st;
}

mi_status mim_seq_prefill_attention(mi_model *m, const mi_kv_seq *seq, int32_t layer,
                                    const float *q, int64_t n, int64_t n_past, float *out) {
    const int64_t L = n_past + n, kvd = (int64_t)m->n_kv * m->hd;
    float *kv = malloc((size_t)(2 * L * kvd) * sizeof(float));
    if (!kv)
        return mim_model_fail(m, MI_STATUS_OUT_OF_MEMORY,
                              "out of memory gathering %lld cached rows", (long long)L);
    mi_tensor tk = mi_tensor_bhld(kv, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, L, m->hd);
    mi_tensor tv = mi_tensor_bhld(kv + L * kvd, MI_DTYPE_F32, MI_DEVICE_CPU, 1, m->n_kv, L, m->hd);
    mi_status st = mi_kv_seq_read(seq, layer, 0, L, &tk, &tv);
    if (st != MI_STATUS_SUCCESS)
        mim_model_fail(m, st, "layer %d: reading the KV cache: %s", layer,
                       mi_kv_pool_last_error(mi_kv_seq_pool(seq)));
    else
        st = mim_prefill_at_offset(m, layer, q, n, &tk, &tv, out);
    free(kv);
    return st;
}
