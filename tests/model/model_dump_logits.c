/*
 * model_dump_logits.c: prints what scripts/check_logits.py compares against transformers:
 * the prompt's token ids, the greedy continuation, and the logits after the prompt and after
 * each greedy token (binary fp32, n_steps x vocab).
 *
 *   model_dump_logits MODEL PROMPT N_GEN LOGITS.f32 [TEXT...]
 * stdout: one JSON object {"prompt_ids": [...], "greedy": [...], "vocab": V,
 *         "tokenized": [[ids of TEXT 1], ...]}
 */
#include "minference_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_ids(const int32_t *ids, size_t n) {
    printf("[");
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
    printf("]");
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL PROMPT N_GEN LOGITS.f32 [TEXT...]\n", argv[0]);
        return 2;
    }
    mi_model *m = NULL;
    mi_model_params p = mi_model_default_params();
    mi_context *ectx = NULL; /* receives the loader's message */
    mi_context_create(NULL, &ectx);
    if (mi_model_load(ectx, argv[1], &p, &m) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "load: %s\n", mi_context_last_error(ectx));
        return 1;
    }
    mi_context_destroy(ectx);
    mi_model_set_attention(m, MI_ATTN_DENSE, NULL, -1);
    mi_model_info info;
    mi_model_get_info(m, &info);
    int n_gen = atoi(argv[3]);
    size_t n = 0;
    mi_model_tokenize(m, argv[2], strlen(argv[2]), -1, 1, NULL, 0, &n);
    int32_t *ids = malloc((n + (size_t)n_gen + 1) * sizeof(int32_t));
    float *logits = malloc((size_t)info.vocab * sizeof(float));
    FILE *f = fopen(argv[4], "wb");
    if (!ids || !logits || !f) return 1;
    mi_model_tokenize(m, argv[2], strlen(argv[2]), -1, 1, ids, n, &n);
    if (mi_model_prefill(m, ids, n, logits) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "prefill: %s\n", mi_model_last_error(m));
        return 1;
    }
    int32_t *gen = ids + n;
    for (int i = 0; i < n_gen; i++) {
        fwrite(logits, sizeof(float), (size_t)info.vocab, f);
        gen[i] = mi_argmax(logits, info.vocab);
        if (i + 1 < n_gen && mi_model_decode(m, &gen[i], 1, logits) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "decode: %s\n", mi_model_last_error(m));
            return 1;
        }
    }
    fclose(f);
    printf("{\"vocab\": %d, \"prompt_ids\": ", info.vocab);
    print_ids(ids, n);
    printf(", \"greedy\": ");
    print_ids(gen, (size_t)n_gen);
    printf(", \"tokenized\": [");
    for (int a = 5; a < argc; a++) {
        size_t k = 0;
        mi_model_tokenize(m, argv[a], strlen(argv[a]), 0, 1, NULL, 0, &k);
        int32_t *t = malloc((k + 1) * sizeof(int32_t));
        mi_model_tokenize(m, argv[a], strlen(argv[a]), 0, 1, t, k, &k);
        printf("%s", a > 5 ? ", " : "");
        print_ids(t, k);
        free(t);
    }
    printf("]}\n");
    free(ids);
    free(logits);
    mi_model_destroy(m);
    return 0;
}
