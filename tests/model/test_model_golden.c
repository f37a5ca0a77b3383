/*
 * test_model_golden.c: the SmolLM2 GGUF through the whole runner (tokenizer, default attention,
 * decode) reproduces the fixture that scripts/check_logits.py recorded from transformers: the
 * prompt's token ids and the greedy tokens up to end-of-sequence. Exit 77 without the model.
 */
#include "model_test_util.h"

#include <jansson.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s golden_smollm2.json\n", argv[0]);
        return 2;
    }
    char *path = test_find_model();
    if (!path) {
        printf("SmolLM2 GGUF not installed (scripts/fetch_model.sh): skipped\n");
        return SKIP_CODE;
    }
    json_error_t jerr;
    json_t *fx = json_load_file(argv[1], 0, &jerr);
    if (!fx) {
        fprintf(stderr, "%s: %s\n", argv[1], jerr.text);
        return 1;
    }
    const char *prompt = json_string_value(json_object_get(fx, "prompt"));
    json_t *want_ids = json_object_get(fx, "hf_prompt_ids");
    json_t *want_gen = json_object_get(fx, "greedy_hf");
    CHECK(prompt && json_array_size(want_ids) > 0 && json_array_size(want_gen) > 0, "fixture");

    mi_model *m = NULL;
    mi_model_params p = mi_model_default_params();
    CHECK(mi_model_load(test_ctx(), path, &p, &m) == MI_STATUS_SUCCESS, "%s: %s", path, TEST_ERR);
    free(path);
    if (!m || !prompt) {
        json_decref(fx);
        return check_finish("test_model_golden");
    }
    mi_model_info info;
    mi_model_get_info(m, &info);
    CHECK(info.n_layers == 30 && info.n_heads == 9 && info.n_kv_heads == 3 && info.vocab == 49152 &&
              info.tied_embeddings == 1,
          "SmolLM2-135M shape");
    int32_t ids[512];
    size_t n = 0;
    CHECK(mi_model_tokenize(m, prompt, strlen(prompt), -1, 1, ids, 512, &n) == MI_STATUS_SUCCESS,
          "tokenize");
    bool same = n == json_array_size(want_ids);
    for (size_t i = 0; same && i < n; i++)
        same = ids[i] == json_integer_value(json_array_get(want_ids, i));
    CHECK(same, "prompt ids differ from transformers (%zu vs %zu)", n, json_array_size(want_ids));

    float *logits = malloc((size_t)info.vocab * sizeof(float));
    size_t n_gen = json_array_size(want_gen);
    CHECK(mi_model_prefill(m, ids, n, logits) == MI_STATUS_SUCCESS, "%s", mi_model_last_error(m));
    printf("greedy:");
    for (size_t i = 0; i < n_gen; i++) {
        int32_t next = mi_argmax(logits, info.vocab);
        int32_t want = (int32_t)json_integer_value(json_array_get(want_gen, i));
        printf(" %d", next);
        CHECK(next == want, "greedy token %zu: %d, transformers %d", i, next, want);
        if (next != want || mi_model_token_is_eog(m, next)) break;
        CHECK(mi_model_decode(m, &next, 1, logits) == MI_STATUS_SUCCESS, "%s",
              mi_model_last_error(m));
    }
    printf("\n");
    free(logits);
    mi_model_destroy(m);
    json_decref(fx);
    return check_finish("test_model_golden");
}
