/*
 * fuzz_hf: the Hugging Face folder loader (mi_model_load on a directory). One input holds the
 * folder's files, separated by the line "\n--mi-fuzz-file--\n" (in the dictionary):
 *   config.json, tokenizer.json, model.safetensors.index.json (not written when empty), then
 *   the shards model-00001.safetensors, model-00002.safetensors, ...
 * Without an index the loader finds the shards by listing the folder.
 */
#include "fuzz_util.h"

#define FZ_SEP "\n--mi-fuzz-file--\n"
#define FZ_MAX_PARTS 8

static const uint8_t *find_sep(const uint8_t *p, const uint8_t *end) {
    const size_t n = sizeof(FZ_SEP) - 1;
    for (; (size_t)(end - p) >= n; p++)
        if (*p == '\n' && memcmp(p, FZ_SEP, n) == 0) return p;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_dir();
    fz_clear();
    const uint8_t *p = data, *end = data + size;
    for (int part = 0; part < FZ_MAX_PARTS; part++) {
        const uint8_t *sep = find_sep(p, end);
        const uint8_t *stop = sep ? sep : end;
        char name[64];
        if (part == 0)
            snprintf(name, sizeof(name), "config.json");
        else if (part == 1)
            snprintf(name, sizeof(name), "tokenizer.json");
        else if (part == 2)
            snprintf(name, sizeof(name), "model.safetensors.index.json");
        else
            snprintf(name, sizeof(name), "model-%05d.safetensors", part - 2);
        if (part != 2 || stop > p) fz_write(name, p, (size_t)(stop - p));
        if (!sep) break;
        p = sep + sizeof(FZ_SEP) - 1;
    }
    mi_model_params params = fz_model_params();
    mi_model *model = NULL;
    if (mi_model_load(NULL, fz_dir(), &params, &model) == MI_STATUS_SUCCESS) {
        fz_exercise_model(model);
        mi_model_destroy(model);
    } else if (model) {
        abort();
    }
    return 0;
}
