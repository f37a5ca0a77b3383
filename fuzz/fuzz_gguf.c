/*
 * fuzz_gguf: the GGUF loader (mi_model_load on a file). The input is the file; a model that
 * loads is then used (tokenizer, chat template, a short prefill), so that whatever the loader
 * accepts is checked to be safe to run.
 */
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_write("model.gguf", data, size);
    mi_model_params params = fz_model_params();
    mi_model *model = NULL;
    if (mi_model_load(NULL, path, &params, &model) == MI_STATUS_SUCCESS) {
        fz_exercise_model(model);
        mi_model_destroy(model);
    } else if (model) {
        abort(); /* a failed load must leave *out NULL */
    }
    return 0;
}
