/*
 * fuzz_tokenizer_json: the tokenizer.json reader, through the public loader. The input is the
 * tokenizer.json of a folder whose config.json and weights are fixed (one layer, hidden 32,
 * zero weights, 512 embedding rows, written once at start); a tokenizer that loads is then
 * used (tokenize, pieces, chat template, a short prefill).
 */
#include "fuzz_util.h"

#define FZ_VOCAB 512
#define FZ_HIDDEN 32
#define FZ_KV 16 /* one key/value head of 16 */

typedef struct fz_tensor {
    const char *name;
    int64_t rows, cols; /* rows 0: a vector */
} fz_tensor;

static const fz_tensor tensors[] = {
    {"model.embed_tokens.weight", FZ_VOCAB, FZ_HIDDEN},
    {"model.norm.weight", 0, FZ_HIDDEN},
    {"model.layers.0.input_layernorm.weight", 0, FZ_HIDDEN},
    {"model.layers.0.post_attention_layernorm.weight", 0, FZ_HIDDEN},
    {"model.layers.0.self_attn.q_proj.weight", FZ_HIDDEN, FZ_HIDDEN},
    {"model.layers.0.self_attn.k_proj.weight", FZ_KV, FZ_HIDDEN},
    {"model.layers.0.self_attn.v_proj.weight", FZ_KV, FZ_HIDDEN},
    {"model.layers.0.self_attn.o_proj.weight", FZ_HIDDEN, FZ_HIDDEN},
    {"model.layers.0.mlp.gate_proj.weight", FZ_HIDDEN, FZ_HIDDEN},
    {"model.layers.0.mlp.up_proj.weight", FZ_HIDDEN, FZ_HIDDEN},
    {"model.layers.0.mlp.down_proj.weight", FZ_HIDDEN, FZ_HIDDEN},
};
#define FZ_N_TENSORS (sizeof(tensors) / sizeof(tensors[0]))

static void write_fixed_files(void) {
    static const char config[] =
        "{\"model_type\":\"llama\",\"hidden_size\":32,\"intermediate_size\":32,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
        "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"max_position_embeddings\":256,"
        "\"vocab_size\":512,\"tie_word_embeddings\":true}";
    fz_write("config.json", config, sizeof(config) - 1);

    char header[4096];
    size_t h = 0;
    uint64_t off = 0;
    h += (size_t)snprintf(header + h, sizeof(header) - h, "{");
    for (size_t i = 0; i < FZ_N_TENSORS; i++) {
        const fz_tensor *t = &tensors[i];
        uint64_t bytes = (uint64_t)(t->rows ? t->rows : 1) * (uint64_t)t->cols * 4;
        char shape[64];
        if (t->rows)
            snprintf(shape, sizeof(shape), "%lld,%lld", (long long)t->rows, (long long)t->cols);
        else
            snprintf(shape, sizeof(shape), "%lld", (long long)t->cols);
        h += (size_t)snprintf(header + h, sizeof(header) - h,
                              "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],"
                              "\"data_offsets\":[%llu,%llu]}",
                              i ? "," : "", t->name, shape, (unsigned long long)off,
                              (unsigned long long)(off + bytes));
        off += bytes;
    }
    h += (size_t)snprintf(header + h, sizeof(header) - h, "}");
    if (h >= sizeof(header)) abort();
    size_t total = 8 + h + (size_t)off;
    unsigned char *file = calloc(1, total);
    if (!file) abort();
    uint64_t hlen = h;
    memcpy(file, &hlen, 8); /* little-endian hosts only, as the loader */
    memcpy(file + 8, header, h);
    fz_write("model.safetensors", file, total);
    free(file);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    write_fixed_files();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_write("tokenizer.json", data, size);
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
