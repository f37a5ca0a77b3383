/*
 * cmd_eval_recall.c: the recall task of `minference eval`: one dense prefill per length, and at
 * every layer each method's patterns measured on that pass's q/k (attention recall and density,
 * mean over layers and heads).
 */
#include "minference.h"
#include "minference_model.h"
#include "minference_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_eval.h"

typedef struct recall_acc {
    eval_state *e;
    mi_context *ctx;
    double *recall, *density; /* [nm] sums over layers and heads */
    long long count;
    mi_status st;
} recall_acc;

static mi_status on_layer_recall(void *user, int32_t layer, const mi_tensor *q, const mi_tensor *k,
                                 const mi_tensor *v) {
    (void)v;
    recall_acc *a = user;
    const int32_t H = (int32_t)q->shape[1];
    mi_head_pattern *pat = malloc(sizeof(mi_head_pattern) * (size_t)H);
    mi_head_metrics *met = malloc(sizeof(mi_head_metrics) * (size_t)H);
    if (!pat || !met) {
        free(pat);
        free(met);
        return MI_STATUS_OUT_OF_MEMORY;
    }
    mi_prefill_params pp = mi_prefill_default_params();
    pp.dense_below = a->e->dense_below;
    mi_status st = MI_STATUS_SUCCESS;
    for (int m = 0; m < a->e->nm && st == MI_STATUS_SUCCESS; m++) {
        st = method_layer(&a->e->methods[m], layer, H, pat);
        if (st == MI_STATUS_SUCCESS) st = mi_metrics_evaluate(a->ctx, q, k, NULL, pat, &pp, met);
        for (int32_t h = 0; h < H && st == MI_STATUS_SUCCESS; h++) {
            a->recall[m] += met[h].recall;
            a->density[m] += met[h].density;
        }
    }
    a->count += H;
    free(pat);
    free(met);
    if (st != MI_STATUS_SUCCESS)
        fprintf(stderr, "minference eval: metrics: %s\n", mi_context_last_error(a->ctx));
    return st;
}

bool eval_recall(eval_state *e) {
    size_t ntok = 0;
    int32_t *tok = eval_tokenize(e->model, e->text, e->text_len, 1, &ntok);
    if (!tok) {
        fprintf(stderr, "minference eval: tokenizer failed\n");
        return false;
    }
    if ((long long)ntok < e->max_len)
        fprintf(stderr, "minference eval: the text has %zu tokens; longer lengths are cut\n", ntok);
    const int nm = e->nm;
    double *rsum = calloc((size_t)nm * 2, sizeof(double));
    bool ok = rsum != NULL;
    for (int li = 0; li < e->nl && ok; li++) {
        const size_t n = (size_t)e->lengths[li] < ntok ? (size_t)e->lengths[li] : ntok;
        recall_acc acc = {e, e->ctx, rsum, rsum + nm, 0, MI_STATUS_SUCCESS};
        memset(rsum, 0, sizeof(double) * (size_t)nm * 2);
        mi_model_capture cap = {on_layer_recall, &acc, NULL};
        method dense;
        parse_method("dense", &dense);
        mi_status st = eval_use_method(e, &dense);
        if (st == MI_STATUS_SUCCESS) st = mi_model_prefill_capture(e->model, tok, n, &cap);
        if (st != MI_STATUS_SUCCESS) {
            fprintf(stderr, "minference eval: %s\n", mi_model_last_error(e->model));
            ok = false;
            break;
        }
        for (int m = 0; m < nm; m++) {
            const size_t cell = (size_t)m * e->nl + li;
            e->grid[cell] = acc.recall[m] / (double)acc.count;
            e->aux[cell] = acc.density[m] / (double)acc.count;
            fprintf(stderr, "%-22s len %6zu: recall %.4f density %.4f\n", e->methods[m].name, n,
                    e->grid[cell], e->aux[cell]);
            json_array_append_new(e->runs,
                                  json_pack("{s:s, s:I, s:f, s:f}", "method", e->methods[m].name,
                                            "length", (json_int_t)n, "recall", e->grid[cell],
                                            "density", e->aux[cell]));
        }
    }
    free(tok);
    free(rsum);
    return ok;
}
