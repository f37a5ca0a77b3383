/*
 * fuzz_config: the pattern config reader (mi_config_parse). A config that parses is queried
 * (layers, heads, check) and written back: the JSON it writes must parse, and writing that again
 * must give the same text (the writer's output is a fixed point).
 */
#include "minference.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static mi_context *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    mi_context_params p = mi_context_default_params();
    p.device = MI_DEVICE_CPU;
    p.n_threads = 1;
    if (mi_context_create(&p, &ctx) != MI_STATUS_SUCCESS) abort();
    return 0;
}

/* Per-layer reads allocate [n_heads]; a parsed head id sizes that, so larger ones are left to
 * the parser alone (the reads themselves are the same code for any size). */
#define FZ_MAX_HEADS 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mi_config *cfg = NULL;
    mi_status st = mi_config_parse(ctx, (const char *)data, size, &cfg);
    if (st != MI_STATUS_SUCCESS) {
        if (cfg) abort(); /* a failed parse must leave *out NULL */
        mi_context_last_error(ctx);
        return 0;
    }
    int32_t n_layers = mi_config_n_layers(cfg), n_heads = mi_config_n_heads(cfg);
    if (n_layers < 0 || n_heads < 0) abort();
    mi_config_check(ctx, cfg, n_layers, n_heads);
    if (n_heads > 1) mi_config_check(ctx, cfg, n_layers, n_heads - 1);
    if (n_heads <= FZ_MAX_HEADS && (int64_t)n_layers * n_heads <= (1 << 20)) {
        int32_t nh = n_heads > 0 ? n_heads : 1;
        mi_head_pattern *pat = malloc((size_t)nh * sizeof(*pat));
        double *scores = malloc((size_t)nh * sizeof(double));
        if (!pat || !scores) abort();
        for (int32_t l = 0; l <= n_layers; l++) /* one past the end: defaults */
            mi_config_layer(ctx, cfg, l, nh, pat, scores);
        free(pat);
        free(scores);
    }
    char *json1 = NULL, *json2 = NULL;
    if (mi_config_to_json(ctx, cfg, &json1) != MI_STATUS_SUCCESS) abort();
    mi_config *again = NULL;
    if (mi_config_parse(ctx, json1, strlen(json1), &again) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "written config does not parse: %s\n%s\n", mi_context_last_error(ctx),
                json1);
        abort();
    }
    if (mi_config_to_json(ctx, again, &json2) != MI_STATUS_SUCCESS) abort();
    mi_config *third = NULL;
    char *json3 = NULL;
    if (mi_config_parse(ctx, json2, strlen(json2), &third) != MI_STATUS_SUCCESS ||
        mi_config_to_json(ctx, third, &json3) != MI_STATUS_SUCCESS)
        abort();
    if (strcmp(json2, json3) != 0) {
        fprintf(stderr, "config writer is not a fixed point:\n%s\n---\n%s\n", json2, json3);
        abort();
    }
    mi_free(json1);
    mi_free(json2);
    mi_free(json3);
    mi_config_destroy(third);
    mi_config_destroy(again);
    mi_config_destroy(cfg);
    return 0;
}
