/*
 * kv_method_rows.c: mi_session_kv_keep_rows, a KV method's rows for a cache kept outside a
 * session (the Python transformers patch keeps transformers' own cache). The rule is the
 * method's keep_rows hook, the very one its session hooks apply.
 */
#include "kv_method.h"
#include "minference_session.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A [1, H, L, D] f32 CPU tensor with a contiguous last dimension. */
static bool bad_tensor(const mi_tensor *t) {
    return !t->data || t->dtype != MI_DTYPE_F32 || t->device != MI_DEVICE_CPU || t->shape[0] != 1 ||
           t->shape[1] <= 0 || t->shape[1] > INT32_MAX || t->shape[2] <= 0 || t->shape[3] <= 0 ||
           t->shape[3] > INT32_MAX || t->stride[3] != 1;
}

/* [1, H, L, D] with strides -> out[(i * H + h) * D + d] (token major) or [h][i][d] (head major). */
static void gather(const mi_tensor *t, float *out, bool token_major) {
    const int64_t H = t->shape[1], L = t->shape[2], D = t->shape[3];
    const float *base = t->data;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < L; i++) {
            const float *src = base + h * t->stride[1] + i * t->stride[2];
            float *dst = token_major ? out + (i * H + h) * D : out + (h * L + i) * D;
            memcpy(dst, src, (size_t)D * sizeof(float));
        }
}

mi_status mi_session_kv_keep_rows(const char *spec, int32_t n_layers, int32_t layer,
                                  const mi_tensor *q, const mi_tensor *k, int64_t *keep,
                                  int64_t *count, char *msg, size_t msg_size) {
    if (msg && msg_size) msg[0] = 0;
    if (!k || !keep || !count)
        return kv_msg(msg, msg_size, MI_STATUS_INVALID_ARGUMENT,
                      "mi_session_kv_keep_rows: k, keep and count are required");
    if (n_layers <= 0 || layer < 0 || layer >= n_layers)
        return kv_msg(msg, msg_size, MI_STATUS_INVALID_ARGUMENT,
                      "mi_session_kv_keep_rows: layer %d of %d", layer, n_layers);
    if (bad_tensor(k) || (q && bad_tensor(q)))
        return kv_msg(
            msg, msg_size, MI_STATUS_INVALID_ARGUMENT,
            "mi_session_kv_keep_rows: q and k must be [1, H, L, D] f32 CPU tensors with a "
            "contiguous last dimension");
    const int64_t len = k->shape[2];
    *count = len;
    kv_spec ks;
    char err[KV_METHOD_ERROR_MAX];
    mi_status st = kv_spec_parse(spec, &ks, err, sizeof err);
    if (st != MI_STATUS_SUCCESS) return kv_msg(msg, msg_size, st, "%s", err);
    if (!ks.entry || ks.entry == &kv_method_dense_entry) return MI_STATUS_SUCCESS;
    if (!ks.entry->keep_rows)
        return kv_msg(msg, msg_size, MI_STATUS_UNSUPPORTED,
                      "kv method %s needs the session's own paged cache (mi_session_params.kv)",
                      ks.entry->name);
    const int32_t n_kv = (int32_t)k->shape[1], hd = (int32_t)k->shape[3];
    int32_t n_heads = n_kv;
    int64_t n = 0;
    if (q) {
        n_heads = (int32_t)q->shape[1];
        n = q->shape[2];
        if (q->shape[3] != hd || n_heads % n_kv || n > len)
            return kv_msg(msg, msg_size, MI_STATUS_SHAPE_MISMATCH,
                          "mi_session_kv_keep_rows: q [1, %d, %lld, %lld] does not fit k [1, %d, "
                          "%lld, %d] (same head_dim, H_q a multiple of H_kv, no more queries than "
                          "rows)",
                          n_heads, (long long)n, (long long)q->shape[3], n_kv, (long long)len, hd);
    } else if (ks.entry->keep_rows_reads_k) {
        return kv_msg(msg, msg_size, MI_STATUS_INVALID_ARGUMENT,
                      "kv method %s selects rows with the call's queries: q is required",
                      ks.entry->name);
    }
    const kv_geometry geo = {n_layers, n_heads, n_kv, hd, 1};
    kv_method *m = NULL;
    st = kv_method_create(&ks, &geo, &m, err, sizeof err);
    if (st != MI_STATUS_SUCCESS) return kv_msg(msg, msg_size, st, "%s", err);
    float *qb = NULL, *kb = NULL;
    if (ks.entry->keep_rows_reads_k) {
        qb = malloc((size_t)(n * n_heads * hd) * sizeof(float));
        kb = malloc((size_t)(len * n_kv * hd) * sizeof(float));
        if (!qb || !kb) {
            st = kv_msg(msg, msg_size, MI_STATUS_OUT_OF_MEMORY, "out of memory for %lld rows",
                        (long long)len);
            goto done;
        }
        gather(q, qb, true);
        gather(k, kb, false);
    }
    st = ks.entry->keep_rows(m, layer, qb, n, kb, len, 0, keep, count);
    if (st != MI_STATUS_SUCCESS) {
        *count = len;
        kv_msg(msg, msg_size, st, "%s", m->error);
    }
done:
    free(qb);
    free(kb);
    kv_method_destroy(m);
    return st;
}
