/* generate_batch.h: `minference generate --prompts FILE.jsonl` (cmd_generate_batch.c): many
 * prompts decoded together through batches of sessions (mi_session_prefill_batch). */
#ifndef MI_TOOLS_GENERATE_BATCH_H
#define MI_TOOLS_GENERATE_BATCH_H

#include "minference_model.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct generate_batch_opts {
    mi_model *model;
    const char *path; /* the JSONL file, "-": stdin */
    int max_new;      /* default of a line without "max_new_tokens" */
    int batch;        /* sessions decoded together at most */
    bool chat;
    mi_chat_template tmpl;
    const char *system;
    const char *kv; /* the sessions' KV method spec (NULL: dense) */
    int32_t kv_dtype;
    double temperature, top_p;
    int top_k;
    uint64_t seed;
    bool quiet, long_context;
} generate_batch_opts;

/* Reads every line first (a bad one is an error naming its line, before any work), then prints
 * one JSON object per prompt, in the file's order. Returns the exit status (0, 1). */
int mi_generate_batch(const generate_batch_opts *o);

#endif /* MI_TOOLS_GENERATE_BATCH_H */
