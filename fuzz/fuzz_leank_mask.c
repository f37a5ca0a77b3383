/*
 * fuzz_leank_mask: the LeanK mask-file reader (mi_leank_mask_parse, docs/kv-methods.md). A mask
 * that parses is queried (shape, every head's channels, the kept fraction), saved and loaded
 * again: the writer's file must load and hold the same channels.
 */
#include "minference_kv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static mi_context *ctx;
static char path[512];

static void remove_file(void) { unlink(path); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    mi_context_params p = mi_context_default_params();
    p.n_threads = 1;
    if (mi_context_create(&p, &ctx) != MI_STATUS_SUCCESS) abort();
    snprintf(path, sizeof path, "/tmp/fuzz_leank_%d.json", (int)getpid());
    atexit(remove_file);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mi_leank_mask *m = NULL;
    if (mi_leank_mask_parse(ctx, (const char *)data, size, &m) != MI_STATUS_SUCCESS) {
        if (m) abort(); /* a failed parse hands nothing out */
        return 0;
    }
    int32_t L = 0, H = 0, D = 0;
    mi_leank_mask_shape(m, &L, &H, &D);
    if (L <= 0 || H <= 0 || D <= 0) abort();
    long kept = 0;
    for (int32_t l = 0; l < L; l++)
        for (int32_t h = 0; h < H; h++) {
            const uint8_t *c = mi_leank_mask_head(m, l, h);
            if (!c) abort();
            for (int32_t d = 0; d < D; d++) kept += c[d] != 0;
        }
    const double f = mi_leank_mask_keep_fraction(m);
    if (!(f >= 0 && f <= 1)) abort();
    (void)kept;
    if (mi_leank_mask_save(ctx, m, path) == MI_STATUS_SUCCESS) {
        mi_leank_mask *r = NULL;
        if (mi_leank_mask_load(ctx, path, &r) != MI_STATUS_SUCCESS) abort();
        int32_t L2, H2, D2;
        mi_leank_mask_shape(r, &L2, &H2, &D2);
        if (L2 != L || H2 != H || D2 != D) abort();
        for (int32_t l = 0; l < L; l++)
            for (int32_t h = 0; h < H; h++)
                if (memcmp(mi_leank_mask_head(m, l, h), mi_leank_mask_head(r, l, h), (size_t)D) !=
                    0)
                    abort();
        mi_leank_mask_destroy(r);
    }
    mi_leank_mask_destroy(m);
    return 0;
}
