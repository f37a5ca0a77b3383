/*
 * cmd_eval_ppl.c: the ppl task of `minference eval`: the perplexity of real text at each length,
 * every position of one prefill per method, and of its last quarter (the positions whose
 * attention the sparse patterns cut most).
 */
#include "minference.h"
#include "minference_model.h"
#include "minference_tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cmd_eval.h"
#include "tool_util.h"

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
