/*
 * infllm.c: InfLLM prefill (Xiao et al., "InfLLM: Training-Free Long-Context Extrapolation for
 * LLMs with an Efficient Context Memory", 2024; docs/prefill-methods.md).
 *
 * The prompt runs in chunks of chunk_size query rows at absolute positions [k C, (k+1) C). At the
 * start of a chunk at st, the keys farther than n_local from every row of the chunk (the first
 * st - n_local) are memory: the first n_init of them are the sinks, the rest are cut into blocks
 * of block_size keys (a partial block stays in the tail). Each block is represented by the mean
 * of its repr_topk keys that received the most attention from the rows whose local window held
 * them. The chunk retrieves the top_k blocks whose representatives score highest against the
 * mean of its queries (summed over the heads that share the selection; all blocks when there
 * are at most top_k), and row p attends, in one exact softmax, to
 *     the sinks  U  the retrieved blocks  U  every key from the end of the last block to p,
 * the last of which holds its local window (keys at distance < n_local).
 * A key's representative score is the sum, over the rows p with 0 <= p - j < n_local, of the
 * softmax probability row p gives it: a block is cut only once all those rows have run, which
 * makes the chunks sequential; rows inside a chunk and heads run in parallel.
 *
 * fp32 throughout (keys and values converted once per call), scores of the selection in double;
 * ties go to the lower key (representatives) and the lower block (selection).
 */
#include "cpu_common.h"
#include "pattern_table.h"

#include <math.h>
#include <omp.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mi_cpu_infllm_memory(const mi_head_plan *hp, int64_t st, int64_t *init_len, int64_t *n_blocks,
                          int64_t *tail) {
    const int64_t gone = st - hp->n_local, n_init = mi_cpu_max64(hp->n_init, 0);
    const int64_t init = gone <= 0 ? 0 : mi_cpu_min64(gone, n_init);
    int64_t nb = 0;
    if (init == n_init && gone > n_init) nb = (gone - n_init) / hp->block_size;
    *init_len = init;
    *n_blocks = nb;
    *tail = init + nb * hp->block_size;
}

/* Heads that share one selection: equal InfLLM fields, neither per_head. */
static bool same_selection(const mi_head_plan *a, const mi_head_plan *b) {
    return !a->per_head && !b->per_head && a->n_init == b->n_init && a->n_local == b->n_local &&
           a->top_k == b->top_k && a->block_size == b->block_size && a->repr_topk == b->repr_topk &&
           a->chunk_size == b->chunk_size;
}

typedef struct group_run {
    const mi_attn_shape *s;
    const mi_tensor *q;
    const float *kf, *vf; /* [H_kv][len][D] of this batch row */
    const mi_head_plan *hp;
    const int64_t *heads; /* the group's query heads */
    int64_t n, b, len;
    int64_t n_local; /* the window, at most len (a wider one holds the same keys) */
    float scale;
    mi_tensor *out;
    float *lse;
    mi_cpu_infllm_trace *trace;
} group_run;

/* Row p of head h: attends to ranges[0..nr) (the last being the tail [rst, p + 1)); adds the
 * window's probabilities into wb (index j - wlo). sc: one score per key. */
static void attend_row(const group_run *g, int64_t h, int64_t p, const int64_t *ranges, int64_t nr,
                       float *sc, float *qr, float *acc, float *wb, int64_t wlo) {
    const int64_t D = g->s->head_dim, hk = h / g->s->group, i = p - g->s->q_off;
    const float *kf = g->kf + (size_t)(hk * g->len) * (size_t)D;
    const float *vf = g->vf + (size_t)(hk * g->len) * (size_t)D;
    mi_cpu_load_f32(qr, mi_cpu_row(g->q, g->b, h, i), g->q->dtype, D, g->scale);
    float m = -INFINITY;
    int64_t n = 0;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t j = ranges[2 * r]; j < ranges[2 * r + 1]; j++) {
            sc[n] = mi_cpu_dot8(qr, kf + (size_t)j * (size_t)D, D);
            m = sc[n] > m ? sc[n] : m;
            n++;
        }
    for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    double sum = 0.0;
    n = 0;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t j = ranges[2 * r]; j < ranges[2 * r + 1]; j++) {
            const float e = expf(sc[n] - m);
            const float *vr = vf + (size_t)j * (size_t)D;
            sc[n++] = e;
            sum += e;
            for (int64_t d = 0; d < D; d++) acc[d] += e * vr[d];
        }
    const float inv = (float)(1.0 / sum);
    for (int64_t d = 0; d < D; d++) acc[d] *= inv;
    mi_cpu_store((void *)mi_cpu_row(g->out, g->b, h, i), g->out->dtype, acc, D);
    if (g->lse)
        g->lse[(g->b * g->s->heads_q + h) * (g->s->len - g->s->q_off) + i] = m + logf((float)sum);
    /* the window is the end of the tail: keys max(0, p - n_local + 1) .. p, the last n of sc */
    const int64_t w0 = mi_cpu_max64(0, p - g->n_local + 1);
    for (int64_t j = w0; j <= p; j++) wb[j - wlo] += sc[n - 1 - (p - j)] * inv;
}

/* The representative of block bi of head h: the mean of the repr_topk keys of highest score,
 * taken in the order (score descending, key ascending). */
static void make_repr(const group_run *g, int64_t h, const float *score, int64_t bi, float *repr) {
    const int64_t D = g->s->head_dim, hk = h / g->s->group, bs = g->hp->block_size;
    const int64_t j0 = mi_cpu_max64(g->hp->n_init, 0) + bi * bs;
    const float *kf = g->kf + (size_t)(hk * g->len) * (size_t)D;
    const int64_t r = mi_cpu_min64(g->hp->repr_topk, bs);
    for (int64_t d = 0; d < D; d++) repr[d] = 0.0f;
    int64_t prev = -1;
    for (int64_t t = 0; t < r; t++) {
        int64_t best = -1;
        for (int64_t j = j0; j < j0 + bs; j++) {
            const bool after =
                prev < 0 || score[j] < score[prev] || (score[j] == score[prev] && j > prev);
            if (after && (best < 0 || score[j] > score[best])) best = j;
        }
        prev = best;
        const float *kr = kf + (size_t)best * (size_t)D;
        for (int64_t d = 0; d < D; d++) repr[d] += kr[d];
    }
    for (int64_t d = 0; d < D; d++) repr[d] /= (float)r;
}

static mi_status run_group(mi_context *ctx, const group_run *g, int nt) {
    const mi_attn_shape *s = g->s;
    const mi_head_plan *hp = g->hp;
    const int64_t D = s->head_dim, C = hp->chunk_size, bs = hp->block_size, len = g->len;
    const int64_t n = g->n, max_nb = len / bs + 1, wlen = MI_BS + g->n_local;
    const int64_t tiles = (C + MI_BS - 1) / MI_BS + 1;
    float *score = calloc((size_t)(n * len), sizeof(float));
    float *repr = malloc((size_t)(n * max_nb * D) * sizeof(float));
    float *wbuf = malloc((size_t)(n * tiles * wlen) * sizeof(float));
    float *thr = malloc((size_t)nt * ((size_t)len + 2 * (size_t)D) * sizeof(float));
    double *bscore = malloc((size_t)max_nb * sizeof(double));
    double *qbar = malloc((size_t)(n * D) * sizeof(double));
    int64_t *sel = malloc((size_t)max_nb * sizeof(int64_t));
    int64_t *ranges = malloc((size_t)(2 * (max_nb + 2)) * (size_t)(nt + 1) * sizeof(int64_t));
    unsigned char *taken = malloc((size_t)max_nb);
    if (!score || !repr || !wbuf || !thr || !bscore || !qbar || !sel || !ranges || !taken) {
        free(score), free(repr), free(wbuf), free(thr), free(bscore), free(qbar), free(sel);
        free(ranges), free(taken);
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "prefill: out of memory");
    }
    int64_t formed = 0;
    const int64_t first = s->q_off / C, last = (len - 1) / C;
    for (int64_t kc = first; kc <= last && len > s->q_off; kc++) {
        const int64_t st = kc * C, r0 = mi_cpu_max64(st, s->q_off), r1 = mi_cpu_min64(st + C, len);
        int64_t init, nb, rst;
        mi_cpu_infllm_memory(hp, st, &init, &nb, &rst);
        const double t0 = now_s();
        /* representatives of the blocks cut since the last chunk (their rows have all run);
         * a few blocks per chunk, cheaper than waking the threads */
        for (int64_t it = 0; it < n * (nb - formed); it++) {
            const int64_t m = it / (nb - formed), bi = formed + it % (nb - formed);
            make_repr(g, g->heads[m], score + m * len, bi, repr + (m * max_nb + bi) * D);
        }
        formed = nb;
        int64_t n_sel = 0;
        if (nb <= hp->top_k) {
            for (int64_t bi = 0; bi < nb; bi++) sel[n_sel++] = bi;
        } else {
            for (int64_t m = 0; m < n; m++) {
                double *qb = qbar + m * D;
                float *row = thr; /* thread 0's scratch: not in a parallel region here */
                for (int64_t d = 0; d < D; d++) qb[d] = 0.0;
                for (int64_t p = r0; p < r1; p++) {
                    mi_cpu_load_f32(row, mi_cpu_row(g->q, g->b, g->heads[m], p - s->q_off),
                                    g->q->dtype, D, 1.0f);
                    for (int64_t d = 0; d < D; d++) qb[d] += row[d];
                }
                for (int64_t d = 0; d < D; d++) qb[d] /= (double)(r1 - r0);
            }
            for (int64_t bi = 0; bi < nb; bi++) {
                double a = 0.0;
                for (int64_t m = 0; m < n; m++) {
                    const float *rp = repr + (m * max_nb + bi) * D;
                    const double *qb = qbar + m * D;
                    for (int64_t d = 0; d < D; d++) a += qb[d] * (double)rp[d];
                }
                bscore[bi] = a;
                taken[bi] = 0;
            }
            for (int64_t t = 0; t < hp->top_k; t++) {
                int64_t best = -1;
                for (int64_t bi = 0; bi < nb; bi++)
                    if (!taken[bi] && (best < 0 || bscore[bi] > bscore[best])) best = bi;
                if (best >= 0) taken[best] = 1;
            }
            for (int64_t bi = 0; bi < nb; bi++)
                if (taken[bi]) sel[n_sel++] = bi;
        }
        /* key ranges: sinks, retrieved blocks ascending, then the tail (its end set per row) */
        int64_t nr = 0;
        if (init > 0) ranges[2 * nr] = 0, ranges[2 * nr + 1] = init, nr++;
        for (int64_t x = 0; x < n_sel; x++) {
            ranges[2 * nr] = mi_cpu_max64(hp->n_init, 0) + sel[x] * bs;
            ranges[2 * nr + 1] = ranges[2 * nr] + bs;
            nr++;
        }
        const double t1 = now_s();
        if (g->trace) {
            mi_cpu_infllm_trace *tr = g->trace;
            for (int64_t m = 0; m < n && kc < tr->n_chunks; m++) {
                const int64_t slot = (g->b * s->heads_q + g->heads[m]) * tr->n_chunks + kc;
                tr->count[slot] = (int32_t)n_sel;
                for (int64_t x = 0; x < n_sel && x < tr->max_sel; x++)
                    tr->blocks[slot * tr->max_sel + x] = (int32_t)sel[x];
            }
            tr->select_s += t1 - t0;
        }
        /* the rows, 64 at a time per head; each piece's window probabilities in its own buffer */
        const int64_t n_tiles = (r1 - r0 + MI_BS - 1) / MI_BS;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t it = 0; it < n * n_tiles; it++) {
            const int64_t m = it / n_tiles, t = it % n_tiles;
            const int64_t a = r0 + t * MI_BS, e = mi_cpu_min64(a + MI_BS, r1);
            float *mine = thr + (size_t)omp_get_thread_num() * ((size_t)len + 2 * (size_t)D);
            float *wb = wbuf + (m * tiles + t) * wlen;
            int64_t *rg = ranges + (size_t)(2 * (max_nb + 2)) * (size_t)(omp_get_thread_num() + 1);
            memcpy(rg, ranges, (size_t)(2 * nr) * sizeof(int64_t));
            for (int64_t x = 0; x < wlen; x++) wb[x] = 0.0f;
            for (int64_t p = a; p < e; p++) {
                rg[2 * nr] = rst;
                rg[2 * nr + 1] = p + 1;
                attend_row(g, g->heads[m], p, rg, nr + 1, mine + 2 * D, mine, mine + D, wb,
                           a - g->n_local + 1);
            }
        }
        /* fixed order: the scores do not depend on the thread count */
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t m = 0; m < n; m++)
            for (int64_t t = 0; t < n_tiles; t++) {
                const int64_t a = r0 + t * MI_BS, wlo = a - g->n_local + 1;
                const float *wb = wbuf + (m * tiles + t) * wlen;
                const int64_t e = mi_cpu_min64(a + MI_BS, r1);
                for (int64_t j = mi_cpu_max64(wlo, 0); j < e; j++)
                    score[m * len + j] += wb[j - wlo];
            }
    }
    free(score), free(repr), free(wbuf), free(thr), free(bscore), free(qbar), free(sel);
    free(ranges), free(taken);
    return MI_STATUS_SUCCESS;
}

mi_status mi_cpu_infllm_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                            const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                            const mi_head_plan *heads, float scale, mi_tensor *out, float *lse,
                            mi_cpu_infllm_trace *trace) {
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    const int64_t Hq = s->heads_q, Hkv = s->heads_kv, D = s->head_dim, L = s->len;
    const int64_t Lq = L - s->q_off;
    int any = 0;
    for (int64_t h = 0; h < Hq; h++) any |= heads[h].kernel == MI_PLAN_KERNEL_INFLLM;
    if (!any) return MI_STATUS_SUCCESS;
    const double t_start = now_s();
    float *kf = malloc((size_t)(Hkv * L * D) * sizeof(float));
    float *vf = malloc((size_t)(Hkv * L * D) * sizeof(float));
    int64_t *members = malloc((size_t)Hq * sizeof(int64_t));
    unsigned char *done = malloc((size_t)Hq);
    if (!kf || !vf || !members || !done) {
        free(kf), free(vf), free(members), free(done);
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "prefill: out of memory");
    }
    mi_status st = MI_STATUS_SUCCESS;
    for (int64_t b = 0; b < s->batch && st == MI_STATUS_SUCCESS; b++) {
        const int64_t len = mi_seq_len(seq_lens, b, L);
        int needed = 0;
        for (int64_t h = 0; h < Hq; h++) {
            done[h] =
                heads[h].kernel != MI_PLAN_KERNEL_INFLLM || mi_head_plan_dense_at(&heads[h], len);
            needed |= !done[h];
        }
        if (!needed) continue;
        /* rows past the sequence: 0, lse -inf, as every kernel writes them */
        for (int64_t h = 0; h < Hq; h++) {
            if (done[h]) continue;
            float zero[MI_MAX_D] = {0};
            for (int64_t i = mi_cpu_max64(len - s->q_off, 0); i < Lq; i++) {
                mi_cpu_store((void *)mi_cpu_row(out, b, h, i), out->dtype, zero, D);
                if (lse) lse[(b * Hq + h) * Lq + i] = -INFINITY;
            }
        }
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t x = 0; x < Hkv * len; x++) {
            const int64_t hk = x / len, j = x % len;
            mi_cpu_load_f32(kf + (size_t)(hk * len + j) * D, mi_cpu_row(k, b, hk, j), k->dtype, D,
                            1.0f);
            mi_cpu_load_f32(vf + (size_t)(hk * len + j) * D, mi_cpu_row(v, b, hk, j), v->dtype, D,
                            1.0f);
        }
        for (int64_t h = 0; h < Hq && st == MI_STATUS_SUCCESS; h++) {
            if (done[h]) continue;
            int64_t n = 0;
            for (int64_t h2 = h; h2 < Hq; h2++)
                if (!done[h2] && (h2 == h || same_selection(&heads[h], &heads[h2]))) {
                    members[n++] = h2;
                    done[h2] = 1;
                }
            const group_run g = {.s = s,
                                 .q = q,
                                 .kf = kf,
                                 .vf = vf,
                                 .hp = &heads[h],
                                 .heads = members,
                                 .n = n,
                                 .b = b,
                                 .len = len,
                                 .n_local = mi_cpu_min64(heads[h].n_local, len),
                                 .scale = scale,
                                 .out = out,
                                 .lse = lse,
                                 .trace = trace};
            st = run_group(ctx, &g, nt);
        }
    }
    free(kf), free(vf), free(members), free(done);
    if (trace) trace->total_s += now_s() - t_start;
    return st;
}

bool mi_cpu_infllm_keeps(const mi_head_plan *hp, const mi_cpu_infllm_trace *trace, int64_t b,
                         int64_t h, int64_t heads_q, int64_t p, int64_t j) {
    if (j > p) return false;
    const int64_t kc = p / hp->chunk_size;
    int64_t init, nb, rst;
    mi_cpu_infllm_memory(hp, kc * hp->chunk_size, &init, &nb, &rst);
    if (j < init || j >= rst) return true;
    const int64_t slot = (b * heads_q + h) * trace->n_chunks + kc;
    const int64_t bi = (j - mi_cpu_max64(hp->n_init, 0)) / hp->block_size;
    for (int64_t x = 0; x < trace->count[slot] && x < trace->max_sel; x++)
        if (trace->blocks[slot * trace->max_sel + x] == bi) return true;
    return false;
}

void mi_cpu_infllm_mass(const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,
                        const mi_head_plan *hp, const mi_cpu_infllm_trace *trace, int64_t b,
                        int64_t h, int64_t len, int64_t r0, int64_t nr, float scale, double *mass,
                        double *visited) {
    const int64_t D = s->head_dim, hk = h / s->group;
    float *buf = malloc(((size_t)len + 2 * (size_t)D) * sizeof(float));
    for (int64_t i = 0; i < nr; i++) mass[i] = 0.0;
    if (!buf) return;
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
        double sum = 0.0, kept = 0.0;
        for (int64_t j = 0; j <= p; j++) {
            const double e = exp((double)(sc[j] - m));
            sum += e;
            if (mi_cpu_infllm_keeps(hp, trace, b, h, s->heads_q, p, j)) kept += e, *visited += 1.0;
        }
        mass[i] = kept / sum;
    }
    free(buf);
}
