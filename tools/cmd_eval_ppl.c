/*
 * cmd_eval_ppl.c: the ppl task of `minference eval`: the perplexity of real text at each length,
 * every position of one prefill per method, and of its last quarter (the positions whose
 * attention the sparse patterns cut most). With --kv, the last KV_TAIL tokens instead, scored one
 * decode step at a time in a session after prefilling the rest: a KV method acts on the cache
 * after the prefill, so only tokens decoded after it show what it kept.
 */
#include "minference.h"
#include "minference_model.h"
#include "minference_session.h"
#include "minference_tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cmd_eval.h"
#include "tool_util.h"

#define KV_TAIL 64

/* Perplexity of tok[n - tail .. n) decoded one by one after prefilling tok[0 .. n - tail) in a
 * session with e->kv; *rows and *bytes: the cache at the end. */
static mi_status kv_tail_ppl(eval_state *e, const int32_t *tok, size_t n, int64_t tail, double *ppl,
                             int64_t *rows, uint64_t *bytes) {
    const int V = e->info.vocab;
    float *logits = malloc((size_t)V * sizeof(float));
    double *lp = malloc((size_t)tail * sizeof(double));
    mi_session *s = NULL;
    mi_session_params sp = mi_session_default_params();
    sp.kv = e->kv;
    mi_status st = logits && lp ? mi_session_create(e->model, &sp, &s) : MI_STATUS_OUT_OF_MEMORY;
    const size_t head = n - (size_t)tail;
    if (st == MI_STATUS_SUCCESS) st = mi_session_prefill(s, tok, head, logits);
    for (int64_t i = 0; i < tail && st == MI_STATUS_SUCCESS; i++) {
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
        for (int v = 0; v < V; v++) z += exp((double)logits[v] - mx);
        lp[i] = (double)logits[tok[head + i]] - mx - log(z);
        if (i + 1 < tail) st = mi_session_decode(s, &tok[head + i], 1, logits);
    }
    if (st == MI_STATUS_SUCCESS) st = mi_eval_perplexity(lp, tail, ppl);
    mi_session_stats ss;
    if (st == MI_STATUS_SUCCESS && mi_session_stats_get(s, &ss) == MI_STATUS_SUCCESS) {
        *rows = ss.kv_rows;
        *bytes = ss.bytes;
    }
    if (s && st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference eval: kv %s: %s\n", e->kv, mi_session_last_error(s));
    mi_session_destroy(s);
    free(logits);
    free(lp);
    return st;
}

bool eval_ppl(eval_state *e) {
    size_t ntok = 0;
    int32_t *tok = eval_tokenize(e->model, e->text, e->text_len, 1, &ntok);
    if (!tok) {
        fprintf(stderr, "minference eval: tokenizer failed\n");
        return false;
    }
    if ((long long)ntok < e->max_len)
        fprintf(stderr, "minference eval: the text has %zu tokens; longer lengths are cut\n", ntok);
    double *lp = malloc(sizeof(double) * (size_t)(e->max_len > 1 ? e->max_len : 2));
    bool ok = lp != NULL;
    for (int li = 0; li < e->nl && ok; li++) {
        const size_t n = (size_t)e->lengths[li] < ntok ? (size_t)e->lengths[li] : ntok;
        for (int m = 0; m < e->nm && ok; m++) {
            const method *me = &e->methods[m];
            mi_model_capture cap = {NULL, NULL, lp};
            double t0 = tool_now_s();
            mi_status st = eval_use_method(e, me);
            if (st == MI_STATUS_SUCCESS && e->kv) {
                const int64_t tail = (int64_t)n / 4 < KV_TAIL ? (int64_t)n / 4 : KV_TAIL;
                double ppl = NAN;
                int64_t rows = 0;
                uint64_t bytes = 0;
                st = kv_tail_ppl(e, tok, n, tail, &ppl, &rows, &bytes);
                if (st != MI_STATUS_SUCCESS) {
                    ok = false;
                    break;
                }
                const size_t cell = (size_t)m * e->nl + li;
                e->grid[cell] = e->aux[cell] = ppl;
                fprintf(stderr,
                        "%-22s len %6zu: ppl of the last %lld tokens %.4f, %lld rows kept "
                        "(%.1f MiB) %.1f s\n",
                        me->name, n, (long long)tail, ppl, (long long)rows,
                        (double)bytes / (1024.0 * 1024.0), tool_now_s() - t0);
                json_array_append_new(e->runs,
                                      json_pack("{s:s, s:s, s:I, s:I, s:f, s:I, s:I, s:f}",
                                                "method", me->name, "kv", e->kv, "length",
                                                (json_int_t)n, "tail", (json_int_t)tail, "ppl_tail",
                                                ppl, "kv_rows", (json_int_t)rows, "kv_bytes",
                                                (json_int_t)bytes, "seconds", tool_now_s() - t0));
                continue;
            }
            if (st == MI_STATUS_SUCCESS) st = mi_model_prefill_capture(e->model, tok, n, &cap);
            double ppl = NAN, ppl_tail = NAN;
            if (st == MI_STATUS_SUCCESS) st = mi_eval_perplexity(lp, (int64_t)n - 1, &ppl);
            const int64_t tail0 = (int64_t)(n - 1) * 3 / 4;
            if (st == MI_STATUS_SUCCESS)
                st = mi_eval_perplexity(lp + tail0, (int64_t)n - 1 - tail0, &ppl_tail);
            if (st != MI_STATUS_SUCCESS) {
                fprintf(stderr, "minference eval: %s: %s\n", me->name,
                        mi_model_last_error(e->model));
                ok = false;
                break;
            }
            const size_t cell = (size_t)m * e->nl + li;
            e->grid[cell] = ppl;
            e->aux[cell] = ppl_tail;
            fprintf(stderr, "%-22s len %6zu: ppl %.4f (last quarter %.4f) %.1f s\n", me->name, n,
                    ppl, ppl_tail, tool_now_s() - t0);
            json_array_append_new(e->runs,
                                  json_pack("{s:s, s:I, s:f, s:f, s:f}", "method", me->name,
                                            "length", (json_int_t)n, "ppl", ppl, "ppl_last_quarter",
                                            ppl_tail, "seconds", tool_now_s() - t0));
        }
    }
    free(tok);
    free(lp);
    return ok;
}
