/*
 * rowmask.c: the dilated and strided patterns (docs/prefill-methods.md): each query row attends
 * to a fixed set of keys of its own, computed exactly (a row-by-row kernel: the block index the
 * other kernels run is shared by the 64 rows of a block, which a per-row residue cannot be).
 *
 *   dilated: the n_init first keys, the dense_local nearest keys (distance d < dense_local), and
 *            every stride-th distance of the span dense_local <= d < n_local;
 *   strided: the stride nearest keys (d < stride) and every distance d that is a multiple of
 *            stride (Sparse Transformer, "strided" attention).
 *
 * Softmax in fp32 over the row's keys with the usual max shift; out rows past the sequence are
 * 0 and their lse -inf, as every other kernel writes them.
 */
#include "cpu_common.h"
#include "pattern_table.h"

#include <math.h>
#include <omp.h>

/* The keys of the row at absolute position p (any order, no duplicates); returns their count. */
int64_t mi_cpu_rowmask_keys(const mi_head_plan *hp, int64_t p, int32_t *keys) {
    int64_t n = 0;
    const int64_t step = hp->stride > 1 ? hp->stride : 1;
    if (hp->strided) {
        for (int64_t d = 0; d < step && d <= p; d++) keys[n++] = (int32_t)(p - d);
        for (int64_t d = step; d <= p; d += step) keys[n++] = (int32_t)(p - d);
        return n;
    }
    const int64_t sinks = mi_cpu_min64(mi_cpu_max64(hp->n_init, 0), p + 1);
    for (int64_t j = 0; j < sinks; j++) keys[n++] = (int32_t)j;
    const int64_t dense = mi_cpu_max64(hp->dense_local, 0), span = mi_cpu_max64(hp->n_local, 0);
    for (int64_t d = 0; d < dense && p - d >= sinks; d++) keys[n++] = (int32_t)(p - d);
    for (int64_t d = dense; d < span && p - d >= sinks; d += step) keys[n++] = (int32_t)(p - d);
    return n;
}

/* Rows [r0, r1) (query rows, absolute position q_off + i) of (b, h), with the keys and values of
 * its KV head in fp32 (kf, vf [len][D]). scratch: len int32 keys, len scores, 2 * D floats. */
static void rows(const mi_attn_shape *s, const mi_tensor *q, const float *kf, const float *vf,
                 const mi_head_plan *hp, int64_t b, int64_t h, int64_t len, int64_t r0, int64_t r1,
                 float scale, mi_tensor *out, float *lse, int32_t *keys, float *sc, float *f) {
    const int64_t D = s->head_dim, Lq = s->len - s->q_off;
    float *qr = f, *acc = f + D;
    for (int64_t i = r0; i < r1; i++) {
        const int64_t p = s->q_off + i;
        void *dst = (void *)mi_cpu_row(out, b, h, i);
        float *l = lse ? lse + (b * s->heads_q + h) * Lq + i : NULL;
        if (p >= len) {
            for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
            mi_cpu_store(dst, out->dtype, acc, D);
            if (l) *l = -INFINITY;
            continue;
        }
        mi_cpu_load_f32(qr, mi_cpu_row(q, b, h, i), q->dtype, D, scale);
        const int64_t n = mi_cpu_rowmask_keys(hp, p, keys);
        float m = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            sc[j] = mi_cpu_dot8(qr, kf + (size_t)keys[j] * (size_t)D, D);
            if (sc[j] > m) m = sc[j];
        }
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) {
            const float e = expf(sc[j] - m);
            const float *vr = vf + (size_t)keys[j] * (size_t)D;
            sum += e;
            for (int64_t d = 0; d < D; d++) acc[d] += e * vr[d];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t d = 0; d < D; d++) acc[d] *= inv;
        mi_cpu_store(dst, out->dtype, acc, D);
        if (l) *l = m + (float)log(sum);
    }
}

mi_status mi_cpu_rowmask_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                             const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                             const mi_head_plan *heads, float scale, mi_tensor *out, float *lse) {
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    const int64_t Lq = s->len - s->q_off, chunk = 128, D = s->head_dim, L = s->len;
    const int64_t n_chunks = (Lq + chunk - 1) / chunk, G = s->group;
    int any = 0;
    for (int64_t h = 0; h < s->heads_q; h++) any |= heads[h].kernel == MI_PLAN_KERNEL_ROWMASK;
    if (!any) return MI_STATUS_SUCCESS;
    /* one KV head at a time: its keys and values in fp32 once, then every row of its query
     * heads in parallel */
    float *kf = malloc((size_t)(L * D) * sizeof(float)),
          *vf = malloc((size_t)(L * D) * sizeof(float));
    int32_t *keys = malloc((size_t)nt * (size_t)L * sizeof(int32_t));
    float *buf = malloc((size_t)nt * ((size_t)L + 2 * (size_t)D) * sizeof(float));
    if (!kf || !vf || !keys || !buf) {
        free(kf), free(vf), free(keys), free(buf);
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "prefill: out of memory");
    }
    for (int64_t b = 0; b < s->batch; b++) {
        const int64_t len = mi_seq_len(seq_lens, b, L);
        for (int64_t hk = 0; hk < s->heads_kv; hk++) {
            int needed = 0;
            for (int64_t h = hk * G; h < hk * G + G; h++)
                needed |= heads[h].kernel == MI_PLAN_KERNEL_ROWMASK &&
                          !mi_head_plan_dense_at(&heads[h], len);
            if (!needed) continue;
#pragma omp parallel for num_threads(nt) schedule(static)
            for (int64_t j = 0; j < len; j++) {
                mi_cpu_load_f32(kf + j * D, mi_cpu_row(k, b, hk, j), k->dtype, D, 1.0f);
                mi_cpu_load_f32(vf + j * D, mi_cpu_row(v, b, hk, j), v->dtype, D, 1.0f);
            }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
            for (int64_t it = 0; it < G * n_chunks; it++) {
                const int64_t h = hk * G + it / n_chunks, c = it % n_chunks;
                const mi_head_plan *hp = &heads[h];
                if (hp->kernel != MI_PLAN_KERNEL_ROWMASK || mi_head_plan_dense_at(hp, len))
                    continue;
                const int tid = omp_get_thread_num();
                float *mine = buf + (size_t)tid * ((size_t)L + 2 * (size_t)D);
                rows(s, q, kf, vf, hp, b, h, len, c * chunk, mi_cpu_min64(c * chunk + chunk, Lq),
                     scale, out, lse, keys + (size_t)tid * (size_t)L, mine + 2 * D, mine);
            }
        }
    }
    free(kf), free(vf), free(keys), free(buf);
    return MI_STATUS_SUCCESS;
}

void mi_cpu_rowmask_mass(const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,
                         const mi_head_plan *hp, int64_t b, int64_t h, int64_t len, int64_t r0,
                         int64_t nr, float scale, double *mass, double *visited) {
    const int64_t D = s->head_dim, hk = h / s->group;
    float *buf = malloc(((size_t)len + 2 * (size_t)D) * sizeof(float));
    int32_t *keys = malloc((size_t)len * sizeof(int32_t));
    for (int64_t i = 0; i < nr; i++) mass[i] = 0.0;
    if (!buf || !keys) {
        free(buf);
        free(keys);
        return;
    }
    float *sc = buf, *qr = buf + len, *row = qr + D;
    for (int64_t i = 0; i < nr; i++) {
        const int64_t p = r0 + i;
        if (p >= len) break;
        mi_cpu_load_f32(qr, mi_cpu_row(q, b, h, p - s->q_off), q->dtype, D, scale);
        float m = -INFINITY;
        for (int64_t j = 0; j <= p; j++) {
            mi_cpu_load_f32(row, mi_cpu_row(k, b, hk, j), k->dtype, D, 1.0f);
            sc[j] = mi_cpu_dot8(qr, row, D);
            m = sc[j] > m ? sc[j] : m;
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= p; j++) sum += exp((double)(sc[j] - m));
        const int64_t n = mi_cpu_rowmask_keys(hp, p, keys);
        double kept = 0.0;
        for (int64_t j = 0; j < n; j++) kept += exp((double)(sc[keys[j]] - m));
        mass[i] = kept / sum;
        *visited += (double)n;
    }
    free(buf);
    free(keys);
}
