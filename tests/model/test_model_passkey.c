/*
 * test_model_passkey.c: a ~2700-token passkey prompt through SmolLM2 with dense prefill, the
 * default vertical-slash budgets (1000/6096), the default A-shape (128/3968), and a tight
 * vertical-slash config (200/500 for every head, a few percent of the causal pairs): all give
 * the same greedy answer, and dense finds the key. Exit 77 without the model.
 */
#include "model_test_util.h"

#define KEY "68231"
#define N_GEN 6

static char *passkey_prompt(void) {
    const char *intro = "There is an important info hidden inside a lot of irrelevant text. Find "
                        "it and memorize it. I will quiz you about the important information "
                        "there.\n";
    const char *fill = "The grass is green. The sky is blue. The sun is yellow. Here we go. "
                       "There and back again. ";
    const char *needle = "The pass key is " KEY ". Remember it. " KEY " is the pass key. ";
    const char *question = "\nWhat is the pass key? The pass key is";
    size_t cap = strlen(intro) + 110 * strlen(fill) + strlen(needle) + strlen(question) + 1;
    char *s = malloc(cap);
    strcpy(s, intro);
    for (int i = 0; i < 110; i++) {
        if (i == 55) strcat(s, needle);
        strcat(s, fill);
    }
    strcat(s, question);
    return s;
}

static bool run(mi_model *m, mi_attn_mode mode, const mi_config *cfg, const int32_t *ids, size_t n,
                int32_t *out, float *logits, int vocab) {
    if (mi_model_set_attention(m, mode, cfg, 0) != MI_STATUS_SUCCESS ||
        mi_model_prefill(m, ids, n, logits) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "%s\n", mi_model_last_error(m));
        return false;
    }
    for (int i = 0; i < N_GEN; i++) {
        out[i] = mi_argmax(logits, vocab);
        if (i + 1 < N_GEN && mi_model_decode(m, &out[i], 1, logits) != MI_STATUS_SUCCESS)
            return false;
    }
    return true;
}

int main(void) {
    char *path = test_find_model();
    if (!path) {
        printf("SmolLM2 GGUF not installed (scripts/fetch_model.sh): skipped\n");
        return SKIP_CODE;
    }
    mi_model *m = NULL;
    CHECK(mi_model_load(test_ctx(), path, NULL, &m) == MI_STATUS_SUCCESS, "%s", TEST_ERR);
    free(path);
    if (!m) return check_finish("test_model_passkey");
    mi_model_info info;
    mi_model_get_info(m, &info);
    char *prompt = passkey_prompt();
    size_t n = 0;
    mi_model_tokenize(m, prompt, strlen(prompt), -1, 1, NULL, 0, &n);
    int32_t *ids = malloc(n * sizeof(int32_t));
    mi_model_tokenize(m, prompt, strlen(prompt), -1, 1, ids, n, &n);
    CHECK(n > 2000 && n < 4000, "prompt has %zu tokens", n);
    float *logits = malloc((size_t)info.vocab * sizeof(float));

    mi_config *tight = NULL;
    mi_head_pattern vs = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    vs.vertical_size = 200;
    vs.slash_size = 500;
    CHECK(mi_config_create(NULL, info.n_layers, info.n_heads, &vs, &tight) == MI_STATUS_SUCCESS,
          "config");
    struct {
        const char *name;
        mi_attn_mode mode;
        const mi_config *cfg;
    } runs[] = {{"dense", MI_ATTN_DENSE, NULL},
                {"vertical_and_slash 1000/6096", MI_ATTN_MINFERENCE, NULL},
                {"a_shape 128/3968", MI_ATTN_A_SHAPE, NULL},
                {"vertical_and_slash 200/500", MI_ATTN_MINFERENCE, tight}};
    int32_t ref[N_GEN], got[N_GEN];
    for (size_t r = 0; r < sizeof(runs) / sizeof(runs[0]); r++) {
        int32_t *dst = r == 0 ? ref : got;
        bool ok = run(m, runs[r].mode, runs[r].cfg, ids, n, dst, logits, info.vocab);
        CHECK(ok, "%s failed", runs[r].name);
        char text[256];
        size_t w = 0, len;
        for (int i = 0; ok && i < N_GEN; i++) {
            mi_model_token_to_piece(m, dst[i], text + w, sizeof(text) - 1 - w, &len);
            w += len < sizeof(text) - 1 - w ? len : sizeof(text) - 1 - w;
        }
        text[w] = 0;
        printf("%-30s %zu tokens -> \"%s\"\n", runs[r].name, n, text);
        if (r == 0)
            CHECK(strstr(text, KEY) != NULL, "dense prefill did not find the key");
        else
            CHECK(ok && memcmp(ref, got, sizeof(ref)) == 0, "%s differs from dense", runs[r].name);
    }
    mi_config_destroy(tight);
    free(logits);
    free(ids);
    free(prompt);
    mi_model_destroy(m);
    return check_finish("test_model_passkey");
}
