/*
 * test_eval_e2e.c: the eval and search commands end to end on the real demo model, small
 * enough for two CPU cores: a passkey prompt of 512 tokens (dense must find the key), the
 * attention recall of a tight pattern, and a search over a 256-token sample whose config must
 * load back. Exits 77 (skipped) when no model file is available.
 */
#define _POSIX_C_SOURCE 200809L
#include "../check.h"
#include "cli.h"
#include "heatmap_png.h"
#include "minference.h"
#include "minference_model.h"
#include "minference_tools.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* $MI_MODEL, else the library's demo-model lookup; a path that cannot be read means "no model"
 * (skip), not failure. */
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
    return strcmp(argv[0], "search") == 0 ? mi_cmd_search(argc - 1, argv + 1)
                                          : mi_cmd_eval(argc - 1, argv + 1);
}

/* scores[0][0] of method m in an eval JSON file. */
static double score_of(json_t *root, int m) {
    json_t *meth = json_array_get(json_object_get(root, "methods"), (size_t)m);
    json_t *row = json_array_get(json_object_get(meth, "scores"), 0);
    return json_number_value(json_array_get(row, 0));
}

int main(void) {
    char *model = find_model();
    if (!model) {
        fprintf(stderr, "eval.e2e: no model file (set MI_MODEL or run scripts/fetch_model.sh); "
                        "skipped\n");
        return 77;
    }
    char dir[] = "/tmp/mi_eval_e2e_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char json1[256], json2[256], png[256], cfg[256];
    snprintf(json1, sizeof json1, "%s/passkey.json", dir);
    snprintf(json2, sizeof json2, "%s/recall.json", dir);
    snprintf(png, sizeof png, "%s/passkey.png", dir);
    snprintf(cfg, sizeof cfg, "%s/cfg.json", dir);

    char *pk[] = {"eval",      "passkey",  "--model", model,       "--lengths",
                  "512",       "--depths", "0",       "--methods", "dense,a_shape:4:16",
                  "--threads", "2",        "--quiet", "--json",    json1,
                  "--png",     png,        NULL};
    if (!heatmap_png_supported()) pk[15] = NULL; /* a build without libpng: no --png */
    CHECK(run(pk) == 0);
    json_error_t jerr;
    json_t *root = json_load_file(json1, 0, &jerr);
    CHECK(root != NULL);
    if (root) {
        CHECK(score_of(root, 0) == 1.0); /* dense retrieves the key at 512 tokens */
        /* A 20-key window cannot see a key 500 tokens back. */
        CHECK(score_of(root, 1) == 0.0);
        json_decref(root);
    }
    if (heatmap_png_supported()) {
        FILE *f = fopen(png, "rb");
        unsigned char sig[8] = {0};
        CHECK(f && fread(sig, 1, 8, f) == 8 && memcmp(sig, "\x89PNG\r\n\x1a\n", 8) == 0);
        if (f) fclose(f);
    }

    char *rc[] = {"eval",      "recall", "--model",   model,
                  "--lengths", "512",    "--methods", "dense,vs:30:50,a_shape:4:16",
                  "--threads", "2",      "--quiet",   "--json",
                  json2,       NULL};
    CHECK(run(rc) == 0);
    root = json_load_file(json2, 0, &jerr);
    CHECK(root != NULL);
    if (root) {
        CHECK(score_of(root, 0) > 0.999999); /* dense keeps all the mass */
        CHECK(score_of(root, 1) > 0.3 && score_of(root, 1) < 1.0);
        CHECK(score_of(root, 2) > 0.1 && score_of(root, 2) < score_of(root, 0));
        json_decref(root);
    }

    char *se[] = {"search",       "--model", model,       "--len", "256",   "--recall", "0.9",
                  "--iterations", "3",       "--threads", "2",     "--out", cfg,        NULL};
    CHECK(run(se) == 0);
    /* A finished search leaves the config and no OUT.partial (which holds the layers done so
     * far while it runs, so that an interrupted search never leaves a whole-looking config). */
    char partial[600];
    snprintf(partial, sizeof partial, "%s.partial", cfg);
    CHECK(access(partial, F_OK) != 0);
    mi_config *c = NULL;
    CHECK_STATUS(mi_config_load(NULL, cfg, &c), MI_STATUS_SUCCESS);
    if (c) {
        CHECK(mi_config_n_layers(c) == 30);
        CHECK(mi_config_n_heads(c) == 9);
        mi_head_pattern pat[9];
        double sc[9];
        CHECK_STATUS(mi_config_layer(NULL, c, 5, 9, pat, sc), MI_STATUS_SUCCESS);
        for (int h = 0; h < 9; h++) CHECK(sc[h] > 0.0 && sc[h] <= 1.0 + 1e-9);
        mi_config_destroy(c);
    }
    /* Usage errors are status 2, not a crash. */
    char *bad1[] = {"eval", "nosuchtask", NULL};
    CHECK(run(bad1) == 2);
    char *bad2[] = {"eval", "passkey", "--methods", "vs:1", NULL};
    CHECK(run(bad2) == 2);
    char *bad3[] = {"search", "--model", model, NULL};
    CHECK(run(bad3) == 2);

    remove(json1);
    remove(json2);
    remove(png);
    remove(cfg);
    rmdir(dir);
    free(model);
    return check_finish("eval.e2e");
}
