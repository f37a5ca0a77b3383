/*
 * test_scbench_e2e.c: `minference scbench` end to end on the demo model, small enough for two
 * CPU cores: generated kv and summary_with_needles contexts of ~900 tokens, 2 turns, both modes,
 * dense attention with the dense KV cache and a KV method the library refuses (reported as
 * unsupported, the run goes on); then a hand-written public-format file through --data; then
 * a 2 x 2 method matrix (every attn x kv pair once per mode).
 * Exits 77 (skipped) when no model file is available.
 */
#define _POSIX_C_SOURCE 200809L
#include "../check.h"
#include "cli.h"
#include "minference_model.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *find_model(void) {
    const char *env = getenv("MI_MODEL");
    char *path = env && *env ? strdup(env) : mi_model_default_path();
    if (path && access(path, R_OK) != 0) {
        free(path);
        path = NULL;
    }
    return path;
}

static int run(char **argv) {
    int argc = 0;
    while (argv[argc]) argc++;
    return mi_cmd_scbench(argc, argv);
}

static bool is_png(const char *path) {
    unsigned char sig[8] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    const size_t n = fread(sig, 1, 8, f);
    fclose(f);
    return n == 8 && sig[1] == 'P' && sig[2] == 'N' && sig[3] == 'G';
}

/* The result row of (mode, attn, kv, task), or NULL. */
static json_t *result(json_t *root, const char *mode, const char *kv, const char *task) {
    json_t *r = json_object_get(root, "results");
    for (size_t i = 0; i < json_array_size(r); i++) {
        json_t *o = json_array_get(r, i);
        if (!strcmp(json_string_value(json_object_get(o, "mode")), mode) &&
            !strcmp(json_string_value(json_object_get(o, "kv")), kv) &&
            !strcmp(json_string_value(json_object_get(o, "task")), task))
            return o;
    }
    return NULL;
}

int main(void) {
    char *model = find_model();
    if (!model) {
        fprintf(stderr, "eval.scbench_e2e: no model file; skipped\n");
        return 77;
    }
    char dir[] = "/tmp/mi_scbench_e2e_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char json[300], png[300], curves[300], data[300], qa[300];
    snprintf(json, sizeof json, "%s/r.json", dir);
    snprintf(png, sizeof png, "%s/h.png", dir);
    snprintf(curves, sizeof curves, "%s/c.png", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(qa, sizeof qa, "%s/data/scbench_qa_eng.jsonl", dir);

    char *argv[] = {"--model",
                    model,
                    "--tasks",
                    "scbench_kv,scbench_summary_with_needles",
                    "--length",
                    "900",
                    "--turns",
                    "2",
                    "--examples",
                    "1",
                    "--kv",
                    "dense,no_such_kv_method:a=1,b=2",
                    "--max-new-tokens",
                    "24",
                    "--reprefill",
                    "--json",
                    json,
                    "--png",
                    png,
                    "--curves",
                    curves,
                    "--quiet",
                    NULL};
    CHECK_EQ(run(argv), 0);
    json_error_t err;
    json_t *root = json_load_file(json, 0, &err);
    CHECK(root != NULL, "%s", err.text);
    if (root) {
        json_t *methods = json_object_get(root, "methods");
        CHECK_EQ((int)json_array_size(methods), 2);
        CHECK(json_is_true(json_object_get(json_array_get(methods, 0), "supported")));
        CHECK(json_is_false(json_object_get(json_array_get(methods, 1), "supported")));
        /* "a=1,b=2" continues the second spec: two methods, not four */
        CHECK(!strcmp(json_string_value(json_object_get(json_array_get(methods, 1), "kv")),
                      "no_such_kv_method:a=1,b=2"));
        /* two tasks x two modes x one supported method, two turns each */
        json_t *runs = json_object_get(root, "runs");
        CHECK_EQ((int)json_array_size(runs), 4);
        for (size_t i = 0; i < json_array_size(runs); i++) {
            json_t *preds = json_object_get(json_array_get(runs, i), "predictions");
            CHECK_EQ((int)json_array_size(preds), 2);
            for (size_t t = 0; t < json_array_size(preds); t++) {
                const double s =
                    json_number_value(json_object_get(json_array_get(preds, t), "score"));
                CHECK(s >= 0 && s <= 1);
                CHECK(json_is_string(json_object_get(json_array_get(preds, t), "prediction")));
            }
        }
        /* the pass-key turn (turn 2 of summary_with_needles): dense finds it in both modes */
        for (int md = 0; md < 2; md++) {
            const char *mode = md ? "multi-request" : "multi-turn";
            json_t *o = result(root, mode, "dense", "scbench_summary_with_needles");
            CHECK(o != NULL);
            if (!o) continue;
            const double key = json_number_value(json_array_get(json_object_get(o, "per_turn"), 1));
            CHECK(key == 1.0, "%s: pass key score %g", mode, key);
            CHECK(json_number_value(json_object_get(o, "prefill_s")) > 0);
            CHECK(json_integer_value(json_object_get(o, "context_tokens")) > 800);
        }
        json_t *mr = result(root, "multi-request", "dense", "scbench_kv");
        CHECK(mr && json_number_value(json_object_get(mr, "reprefill_total_s")) > 0);
        CHECK(result(root, "multi-turn", "no_such_kv_method:a=1,b=2", "scbench_kv") == NULL);
        json_decref(root);
    }
#ifdef MI_TOOLS_LIBPNG
    CHECK(is_png(png) && is_png(curves));
#endif

    /* the public format through --data: a book question, scored by the original's rule */
    char mk[400];
    snprintf(mk, sizeof mk, "mkdir -p '%s'", data);
    CHECK_EQ(system(mk), 0);
    FILE *f = fopen(qa, "w");
    fputs("{\"id\": 0, \"context\": \"Tom has a red bicycle. He rides it to the lake every "
          "morning. Anna lives in Paris.\", \"multi_turns\": [{\"input\": \"Where does Anna "
          "live?\", \"answer\": \"Paris\"}, {\"input\": \"What colour is Tom's bicycle?\", "
          "\"answer\": \"red\"}]}\n",
          f);
    fclose(f);
    char *argv2[] = {"--model", model,        "--data", data, "--tasks", "scbench_qa_eng",
                     "--mode",  "multi-turn", "--json", json, "--quiet", NULL};
    CHECK_EQ(run(argv2), 0);
    root = json_load_file(json, 0, &err);
    json_t *o = root ? result(root, "multi-turn", "dense", "scbench_qa_eng") : NULL;
    CHECK(o && json_array_size(json_object_get(o, "per_turn")) == 5);
    CHECK(o && json_is_number(json_array_get(json_object_get(o, "per_turn"), 1)) &&
          json_is_null(json_array_get(json_object_get(o, "per_turn"), 2)));
    json_decref(root);

    /* the matrix: every attn x kv pair, attn-major, one run (one context prefill) per example,
     * mode and pair */
    char *argv5[] = {"--model",
                     model,
                     "--tasks",
                     "scbench_kv",
                     "--length",
                     "300",
                     "--turns",
                     "2",
                     "--attn",
                     "dense,a_shape:16:64",
                     "--kv",
                     "dense;streamingllm:n_init=16,n_local=64",
                     "--max-new-tokens",
                     "4",
                     "--json",
                     json,
                     "--quiet",
                     NULL};
    CHECK_EQ(run(argv5), 0);
    root = json_load_file(json, 0, &err);
    CHECK(root != NULL);
    if (root) {
        static const char *const attn[] = {"dense", "a_shape:16:64"};
        static const char *const kv[] = {"dense", "streamingllm:n_init=16,n_local=64"};
        json_t *ja = json_object_get(root, "attn"), *jk = json_object_get(root, "kv");
        json_t *methods = json_object_get(root, "methods"), *runs = json_object_get(root, "runs");
        CHECK_EQ((int)json_array_size(ja), 2);
        CHECK_EQ((int)json_array_size(jk), 2);
        CHECK_EQ((int)json_array_size(methods), 4);
        for (int a = 0; a < 2; a++) {
            CHECK(!strcmp(json_string_value(json_array_get(ja, (size_t)a)), attn[a]));
            CHECK(!strcmp(json_string_value(json_array_get(jk, (size_t)a)), kv[a]));
            for (int k = 0; k < 2; k++) {
                json_t *m = json_array_get(methods, (size_t)(a * 2 + k));
                CHECK(!strcmp(json_string_value(json_object_get(m, "attn")), attn[a]) &&
                      !strcmp(json_string_value(json_object_get(m, "kv")), kv[k]));
                for (int md = 0; md < 2; md++) {
                    const char *mode = md ? "multi-request" : "multi-turn";
                    int n_runs = 0, n_results = 0;
                    for (size_t i = 0; i < json_array_size(runs); i++) {
                        json_t *o = json_array_get(runs, i);
                        if (strcmp(json_string_value(json_object_get(o, "mode")), mode) ||
                            strcmp(json_string_value(json_object_get(o, "attn")), attn[a]) ||
                            strcmp(json_string_value(json_object_get(o, "kv")), kv[k]))
                            continue;
                        n_runs++;
                        CHECK_EQ((int)json_array_size(json_object_get(o, "predictions")), 2);
                        CHECK(json_integer_value(json_object_get(o, "context_tokens")) > 200);
                    }
                    json_t *res = json_object_get(root, "results");
                    for (size_t i = 0; i < json_array_size(res); i++) {
                        json_t *o = json_array_get(res, i);
                        n_results +=
                            !strcmp(json_string_value(json_object_get(o, "mode")), mode) &&
                            !strcmp(json_string_value(json_object_get(o, "attn")), attn[a]) &&
                            !strcmp(json_string_value(json_object_get(o, "kv")), kv[k]) &&
                            json_array_size(json_object_get(o, "per_turn")) == 2;
                    }
                    CHECK_EQ(n_runs, 1);
                    CHECK_EQ(n_results, 1);
                }
            }
        }
        CHECK_EQ((int)json_array_size(runs), 8);
        CHECK_EQ((int)json_integer_value(json_object_get(root, "max_new_tokens_cap")), 4);
        json_decref(root);
    }

    /* usage errors */
    char *argv3[] = {"--tasks", "scbench_qa_eng", "--model", model, NULL};
    CHECK_EQ(run(argv3), 2); /* a book task without --data */
    char *argv4[] = {"--attn", "no_such_pattern", "--model", model, NULL};
    CHECK_EQ(run(argv4), 2);
    char *argv6[] = {"--kv", ";;", "--model", model, NULL};
    CHECK_EQ(run(argv6), 2);

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    free(model);
    return check_finish("eval.scbench_e2e");
}
