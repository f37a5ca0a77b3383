/*
 * test_model_configs.c: the shipped per-model configs (data/configs) found by model name. Every
 * name maps to a file that loads and has the layer and head counts of that model's family, ids
 * match case-insensitively, a path holding a model's name finds its config (the longest name
 * wins), and names no config was made for find none.
 */
#include "../check.h"
#include "minference.h"

#include <stdlib.h>
#include <string.h>

/* layers and query heads of each model family, as the original's files hold them */
static void expect_shape(const char *id, int32_t *layers, int32_t *heads) {
    *layers = *heads = -1;
    static const struct {
        const char *key;
        int32_t layers, heads;
    } shapes[] = {
        {"Llama-3-8B", 32, 32},    {"Llama-3.1-8B", 32, 32}, {"Llama-3-70B", 80, 64},
        {"Llama-3.1-70B", 80, 64}, {"Yi-9B", 48, 32},        {"Phi-3-mini", 32, 32},
        {"Qwen2-7B", 28, 28},      {"Qwen2.5-7B", 28, 28},   {"Qwen2.5-14B", 48, 40},
        {"Qwen2.5-32B", 64, 40},   {"Qwen2.5-72B", 80, 64},  {"glm-4-9b", 40, 32},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strstr(id, shapes[i].key)) {
            *layers = shapes[i].layers;
            *heads = shapes[i].heads;
        }
}

int main(void) {
    const int32_t n = mi_config_model_count();
    CHECK_EQ(n, 18);
    CHECK(mi_config_model_name(-1) == NULL);
    CHECK(mi_config_model_name(n) == NULL);
    for (int32_t i = 0; i < n; i++) {
        const char *id = mi_config_model_name(i);
        CHECK(id && strchr(id, '/'), "model %d", i);
        if (!id) continue;
        for (int32_t j = 0; j < i; j++) CHECK(strcmp(id, mi_config_model_name(j)) != 0);
        const char *file = mi_config_model_file(id);
        CHECK(file && strstr(file, ".json"), "%s", id);
        char *path = mi_config_model_path(id);
        CHECK(path != NULL, "%s: no shipped file", id);
        if (!path) continue;
        CHECK(strstr(path, file) != NULL);
        mi_config *cfg = NULL;
        CHECK_OK(mi_config_load(NULL, path, &cfg));
        int32_t layers, heads;
        expect_shape(id, &layers, &heads);
        CHECK(layers > 0, "%s: no expected shape", id);
        if (cfg) {
            CHECK_EQ(mi_config_n_layers(cfg), layers);
            CHECK_EQ(mi_config_n_heads(cfg), heads);
            CHECK_OK(mi_config_check(NULL, cfg, layers, heads));
        }
        mi_config_destroy(cfg);
        mi_free(path);
    }
    /* ids ignore case; paths and file names find the config of the name they hold */
    const char *l31 = mi_config_model_file("meta-llama/Llama-3.1-8B-Instruct");
    CHECK(l31 && strstr(l31, "3.1_8B") && strstr(l31, "_v2"));
    const char *same = mi_config_model_file("META-LLAMA/llama-3.1-8b-instruct");
    CHECK(same && l31 && !strcmp(same, l31));
    same = mi_config_model_file("/models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf");
    CHECK(same && l31 && !strcmp(same, l31));
    same = mi_config_model_file(
        "/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/0e9e3");
    CHECK(same && l31 && !strcmp(same, l31));
    const char *q1m = mi_config_model_file("/w/Qwen2.5-7B-Instruct-1M");
    CHECK(q1m && !strcmp(q1m, "Qwen2.5_7B_Instruct_1M.json"), "%s", q1m ? q1m : "(none)");
    const char *q = mi_config_model_file("/w/qwen2.5_7b_instruct.gguf");
    CHECK(q && strstr(q, "Qwen2.5_7B_Instruct_128k"), "%s", q ? q : "(none)");
    CHECK(mi_config_model_file("/w/SmolLM2-135M-Instruct.gguf") == NULL);
    CHECK(mi_config_model_file("Llama-3.1-8B") == NULL); /* a name's prefix is not the name */
    CHECK(mi_config_model_file("") == NULL);
    CHECK(mi_config_model_file(NULL) == NULL);
    CHECK(mi_config_model_path("/w/SmolLM2-135M-Instruct.gguf") == NULL);
    return check_finish("model_configs");
}
