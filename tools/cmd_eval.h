/*
 * cmd_eval.h: what the tasks of `minference eval` share. cmd_eval.c parses the command line,
 * loads the model and the methods, runs one task and reports; each task fills the score grid:
 *   cmd_eval_retrieval.c  passkey, niah, kv-retrieval (a prompt per length, depth and sample)
 *   cmd_eval_ppl.c        ppl (perplexity of real text at each length)
 *   cmd_eval_recall.c     recall (attention recall and density of each method's patterns)
 */
#ifndef MI_TOOLS_CMD_EVAL_H
#define MI_TOOLS_CMD_EVAL_H

#include "minference.h"
#include "minference_model.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* An attention method to compare: a model mode, or one pattern for every head. */
typedef struct method {
    char name[96];
    mi_attn_mode mode;
    bool custom; /* one pattern for every head, through a generated config */
    mi_head_pattern pattern;
    mi_config *config; /* custom or --config (borrowed by the model) */
    int tri_mix;       /* 1: tri_mix, 2: tri_mix_minference (tri_start: first Tri-shape layer) */
    int32_t tri_start;
    char kv[256]; /* --kv: the session's KV method spec; "" runs the model's own cache */
} method;

/* "minference", a pattern name or alias (its default budget on every head), or
 * "NAME:V1[:V2...]" with the pattern's fields (mi_head_pattern_parse): one pattern for every
 * head through a generated config. */
bool parse_method(const char *spec, method *m);
/* The patterns a method gives one layer, as the model resolves them. */
mi_status method_layer(const method *m, int32_t layer, int32_t n_heads, mi_head_pattern *pat);

/* One run of a task. grid and aux are [nm][nl][nd] (nd = 1 for ppl and recall): grid the score
 * (fraction correct, perplexity, recall), aux the prefill seconds, the last quarter's perplexity
 * or the density; runs gets one JSON object per measurement. */
typedef struct eval_state {
    mi_model *model;
    mi_model_info info;
    mi_context *ctx; /* a CPU context for metrics and messages */
    method *methods;
    int nm;
    int32_t dense_below;
    bool quiet;
    const long long *lengths, *depths;
    int nl, nd, samples;
    uint64_t seed;
    const char *text; /* haystack or ppl text; NULL: the RULER filler (passkey, kv-retrieval) */
    size_t text_len;
    long long max_len; /* the longest of lengths */
    double *grid, *aux;
    json_t *runs;
    const char *kv; /* the current method's KV spec (eval_use_method); NULL: no session */
} eval_state;

mi_status eval_use_method(eval_state *e, const method *m);
/* text's tokens, malloc'ed; NULL on failure. */
int32_t *eval_tokenize(mi_model *model, const char *text, size_t len, int add_bos, size_t *n);

/* The tasks: false after printing what failed. */
bool eval_retrieval(eval_state *e, const char *task); /* passkey, niah, kv-retrieval */
bool eval_ppl(eval_state *e);
bool eval_recall(eval_state *e);

#endif /* MI_TOOLS_CMD_EVAL_H */
