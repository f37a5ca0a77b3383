/*
 * test_config.c: pattern configs in the original's JSON: the mapping of every pattern, round
 * trips (ints stay ints), editing, shape checks, and every malformed input (right status, a
 * message naming the problem, no crash). argv[1]: the fixture directory.
 */
#include "../check.h"
#include "minference.h"

#include <math.h>
#include <stdbool.h>
#include <dirent.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *data_dir = ".";

static const char *fixture(const char *name) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", data_dir, name);
    return path;
}

static bool same_pattern(const mi_head_pattern *a, const mi_head_pattern *b) {
    return a->type == b->type && a->vertical_size == b->vertical_size &&
           a->slash_size == b->slash_size && a->n_init == b->n_init && a->n_local == b->n_local &&
           a->n_last == b->n_last && a->top_k == b->top_k;
}

static bool same_score(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* Every layer and head of a and b resolve to the same patterns and scores. */
static bool configs_equal(mi_context *ctx, const mi_config *a, const mi_config *b) {
    if (mi_config_n_layers(a) != mi_config_n_layers(b)) return false;
    if (mi_config_n_heads(a) != mi_config_n_heads(b)) return false;
    const int32_t H = mi_config_n_heads(a);
    mi_head_pattern pa[64], pb[64];
    double sa[64], sb[64];
    if (H > 64) return false;
    for (int32_t l = 0; l < mi_config_n_layers(a); l++) {
        if (mi_config_layer(ctx, a, l, H, pa, sa) || mi_config_layer(ctx, b, l, H, pb, sb))
            return false;
        for (int32_t h = 0; h < H; h++)
            if (!same_pattern(&pa[h], &pb[h]) || !same_score(sa[h], sb[h])) return false;
    }
    return true;
}

static void test_good_file(mi_context *ctx) {
    mi_config *cfg = NULL;
    CHECK_STATUS(mi_config_load(ctx, fixture("good.json"), &cfg), MI_STATUS_SUCCESS);
    if (!cfg) return;
    CHECK(mi_config_n_layers(cfg) == 3);
    CHECK(mi_config_n_heads(cfg) == 4);
    mi_head_pattern p[4];
    double s[4];
    const mi_head_pattern vs_default = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);

    CHECK_STATUS(mi_config_layer(ctx, cfg, 0, 4, p, s), MI_STATUS_SUCCESS);
    CHECK(p[0].type == MI_PATTERN_VERTICAL_SLASH && p[0].vertical_size == 1000 &&
          p[0].slash_size == 6096 && s[0] == 1.0);
    /* stream_llm: n_init = vertical_size, n_local = slash_size. */
    CHECK(p[1].type == MI_PATTERN_A_SHAPE && p[1].n_init == 100 && p[1].n_local == 800 &&
          s[1] == 0.8125);
    /* A head missing from the layer gets the default, with no score. */
    CHECK(same_pattern(&p[2], &vs_default) && isnan(s[2]));
    /* block_sparse: the first size is the block budget; both sizes kept as read. */
    CHECK(p[3].type == MI_PATTERN_BLOCK_SPARSE && p[3].top_k == 30 && p[3].vertical_size == 30 &&
          p[3].slash_size == 800 && s[3] == 2.0);

    CHECK_STATUS(mi_config_layer(ctx, cfg, 2, 4, p, s), MI_STATUS_SUCCESS);
    CHECK(p[0].type == MI_PATTERN_A_SHAPE && p[0].n_init == 128 && p[0].n_local == 3968);
    CHECK(p[1].type == MI_PATTERN_TRI_SHAPE && p[1].n_init == 64 && p[1].n_local == 1024 &&
          p[1].n_last == 100 && isnan(s[1]));
    CHECK(p[2].type == MI_PATTERN_DENSE && isnan(s[2]));
    CHECK(same_pattern(&p[3], &vs_default));

    /* Fewer heads than the config names: the extra heads are simply not returned. */
    CHECK_STATUS(mi_config_layer(ctx, cfg, 0, 2, p, NULL), MI_STATUS_SUCCESS);
    CHECK(p[1].type == MI_PATTERN_A_SHAPE);
    /* A layer past the file's end is a missing layer: all defaults. */
    CHECK_STATUS(mi_config_layer(ctx, cfg, 7, 4, p, s), MI_STATUS_SUCCESS);
    CHECK(same_pattern(&p[0], &vs_default) && same_pattern(&p[3], &vs_default) && isnan(s[0]));

    /* Shape checks. */
    CHECK_STATUS(mi_config_check(ctx, cfg, 3, 4), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_config_check(ctx, cfg, 32, 32), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_config_check(ctx, cfg, 2, 32), MI_STATUS_SHAPE_MISMATCH);
    CHECK(strstr(mi_context_last_error(ctx), "3 layers") != NULL);
    CHECK_STATUS(mi_config_check(ctx, cfg, 3, 3), MI_STATUS_SHAPE_MISMATCH);
    CHECK(strstr(mi_context_last_error(ctx), "head 3") != NULL);
    CHECK_STATUS(mi_config_check(ctx, cfg, -1, 3), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_check(ctx, NULL, 3, 3), MI_STATUS_INVALID_ARGUMENT);

    /* Round trip through text: same patterns and scores, and the text is a fixed point. */
    char *text = NULL, *text2 = NULL;
    CHECK_STATUS(mi_config_to_json(ctx, cfg, &text), MI_STATUS_SUCCESS);
    if (text) {
        /* Integer scores stay integers, reals stay reals (2.0 must not become 2). */
        CHECK(strstr(text, "\"0\": [\"vertical_and_slash\", 1000, 6096, 1]") != NULL);
        CHECK(strstr(text, "\"1\": [\"stream_llm\", 100, 800, 0.8125]") != NULL);
        CHECK(strstr(text, "\"3\": [\"block_sparse\", 30, 800, 2]") != NULL);
        CHECK(strstr(text, "\"0\": [\"stream_llm\", 128, 3968, 2.0]") != NULL);
        CHECK(strstr(text, "\"1\": [\"tri_shape\", 64, 1024, null]") != NULL);
        mi_config *back = NULL;
        CHECK_STATUS(mi_config_parse(ctx, text, strlen(text), &back), MI_STATUS_SUCCESS);
        if (back) {
            CHECK(configs_equal(ctx, cfg, back));
            CHECK_STATUS(mi_config_to_json(ctx, back, &text2), MI_STATUS_SUCCESS);
            CHECK(text2 && strcmp(text, text2) == 0);
            mi_free(text2);
            mi_config_destroy(back);
        }
    }
    mi_free(text);

    /* Round trip through a file. */
    char tmp[] = "/tmp/mi_config_test_XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0);
    if (fd >= 0) {
        fclose(fdopen(fd, "w"));
        CHECK_STATUS(mi_config_save(ctx, cfg, tmp), MI_STATUS_SUCCESS);
        mi_config *back = NULL;
        CHECK_STATUS(mi_config_load(ctx, tmp, &back), MI_STATUS_SUCCESS);
        CHECK(back && configs_equal(ctx, cfg, back));
        mi_config_destroy(back);
        remove(tmp);
    }
    CHECK_STATUS(mi_config_save(ctx, cfg, "/nonexistent-dir/x.json"), MI_STATUS_IO_ERROR);
    /* the message names the real cause (errno read where the call failed) */
    CHECK(strstr(mi_context_last_error(ctx), "No such file or directory") != NULL);
    /* A save that fails (here: the target is a folder, so the final rename fails) leaves what
     * was there, and no temporary file beside it. */
    char dir[] = "/tmp/mi_config_dir_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char target[64];
    snprintf(target, sizeof target, "%s/cfg.json", dir);
    CHECK(mkdir(target, 0755) == 0);
    CHECK_STATUS(mi_config_save(ctx, cfg, target), MI_STATUS_IO_ERROR);
    struct stat st;
    CHECK(stat(target, &st) == 0 && S_ISDIR(st.st_mode));
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; d && (e = readdir(d));) entries += e->d_name[0] != '.';
    if (d) closedir(d);
    CHECK(entries == 1);
    rmdir(target);
    rmdir(dir);
    mi_config_destroy(cfg);
}

/* Head keys in any order (here descending, which an insertion per key made quadratic) give the
 * same config as in ascending order. */
static void test_key_order(mi_context *ctx) {
    char json[4096];
    size_t n = (size_t)snprintf(json, sizeof json, "[{");
    for (int h = 63; h >= 0; h--)
        n += (size_t)snprintf(json + n, sizeof json - n,
                              "\"%d\": [\"vertical_and_slash\", %d, %d, 0.5]%s", h, 100 + h,
                              1000 + h, h ? ", " : "");
    snprintf(json + n, sizeof json - n, "}]");
    mi_config *c = NULL;
    CHECK_STATUS(mi_config_parse(ctx, json, strlen(json), &c), MI_STATUS_SUCCESS);
    CHECK(c && mi_config_n_heads(c) == 64);
    mi_head_pattern pat[64];
    double sc[64];
    if (c) CHECK_STATUS(mi_config_layer(ctx, c, 0, 64, pat, sc), MI_STATUS_SUCCESS);
    int ok = c != NULL;
    for (int h = 0; c && h < 64; h++)
        ok &= pat[h].type == MI_PATTERN_VERTICAL_SLASH && pat[h].vertical_size == 100 + h &&
              pat[h].slash_size == 1000 + h;
    CHECK(ok);
    mi_config_destroy(c);
}

static void test_create_edit(mi_context *ctx) {
    mi_config *cfg = NULL;
    CHECK_STATUS(mi_config_create(ctx, 2, 4, NULL, &cfg), MI_STATUS_SUCCESS);
    if (!cfg) return;
    CHECK(mi_config_n_layers(cfg) == 2 && mi_config_n_heads(cfg) == 4);
    mi_head_pattern a = mi_head_pattern_default(MI_PATTERN_A_SHAPE);
    a.n_init = 64;
    a.n_local = 512;
    CHECK_STATUS(mi_config_set_head(ctx, cfg, 1, 2, &a, 3.0), MI_STATUS_SUCCESS);
    mi_head_pattern vs = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
    vs.vertical_size = 500;
    vs.slash_size = 700;
    CHECK_STATUS(mi_config_set_head(ctx, cfg, 0, 5, &vs, 0.25), MI_STATUS_SUCCESS);
    CHECK(mi_config_n_heads(cfg) == 6);
    /* Replacing a head keeps one entry. */
    CHECK_STATUS(mi_config_set_head(ctx, cfg, 0, 5, &vs, NAN), MI_STATUS_SUCCESS);

    char *text = NULL;
    CHECK_STATUS(mi_config_to_json(ctx, cfg, &text), MI_STATUS_SUCCESS);
    if (text) {
        CHECK(strstr(text, "\"2\": [\"stream_llm\", 64, 512, 3]") != NULL);
        CHECK(strstr(text, "\"5\": [\"vertical_and_slash\", 500, 700, null]") != NULL);
        mi_config *back = NULL;
        CHECK_STATUS(mi_config_parse(ctx, text, strlen(text), &back), MI_STATUS_SUCCESS);
        mi_head_pattern p[6];
        double s[6];
        if (back) {
            CHECK_STATUS(mi_config_layer(ctx, back, 1, 6, p, s), MI_STATUS_SUCCESS);
            CHECK(p[2].type == MI_PATTERN_A_SHAPE && p[2].n_init == 64 && p[2].n_local == 512 &&
                  s[2] == 3.0);
            CHECK(configs_equal(ctx, cfg, back));
            mi_config_destroy(back);
        }
    }
    mi_free(text);

    /* Setting a head of a layer past the end grows the config; the skipped layers default. */
    {
        mi_config *grow = NULL;
        CHECK_STATUS(mi_config_create(ctx, 1, 4, NULL, &grow), MI_STATUS_SUCCESS);
        CHECK_STATUS(mi_config_set_head(ctx, grow, 3, 1, &a, 0.5), MI_STATUS_SUCCESS);
        CHECK(mi_config_n_layers(grow) == 4);
        mi_head_pattern g[4];
        CHECK_STATUS(mi_config_layer(ctx, grow, 2, 4, g, NULL), MI_STATUS_SUCCESS);
        const mi_head_pattern vs_default = mi_head_pattern_default(MI_PATTERN_VERTICAL_SLASH);
        CHECK(same_pattern(&g[1], &vs_default));
        CHECK_STATUS(mi_config_layer(ctx, grow, 3, 4, g, NULL), MI_STATUS_SUCCESS);
        CHECK(g[1].type == MI_PATTERN_A_SHAPE && g[1].n_init == a.n_init);
        mi_config_destroy(grow);
    }

    /* Bad edits. */
    CHECK_STATUS(mi_config_set_head(ctx, cfg, 1 << 20, 0, &vs, 1.0), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_set_head(ctx, cfg, -1, 0, &vs, 1.0), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_set_head(ctx, cfg, 0, -3, &vs, 1.0), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_set_head(ctx, cfg, 0, 0, NULL, 1.0), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_set_head(ctx, cfg, 0, 0, &vs, INFINITY), MI_STATUS_INVALID_ARGUMENT);
    mi_head_pattern bad = vs;
    bad.slash_size = -1;
    CHECK_STATUS(mi_config_set_head(ctx, cfg, 0, 0, &bad, 1.0), MI_STATUS_INVALID_ARGUMENT);
    bad = vs;
    bad.type = (mi_pattern_type)42;
    CHECK_STATUS(mi_config_set_head(ctx, cfg, 0, 0, &bad, 1.0), MI_STATUS_INVALID_ARGUMENT);
    mi_config_destroy(cfg);

    /* A non-default default pattern is written out head by head, so it survives the file. */
    mi_head_pattern dense = mi_head_pattern_default(MI_PATTERN_DENSE);
    CHECK_STATUS(mi_config_create(ctx, 1, 3, &dense, &cfg), MI_STATUS_SUCCESS);
    if (cfg) {
        char *t = NULL;
        CHECK_STATUS(mi_config_to_json(ctx, cfg, &t), MI_STATUS_SUCCESS);
        mi_config *back = NULL;
        if (t) CHECK_STATUS(mi_config_parse(ctx, t, strlen(t), &back), MI_STATUS_SUCCESS);
        mi_head_pattern p[3];
        if (back) {
            CHECK_STATUS(mi_config_layer(ctx, back, 0, 3, p, NULL), MI_STATUS_SUCCESS);
            CHECK(p[0].type == MI_PATTERN_DENSE && p[2].type == MI_PATTERN_DENSE);
        }
        mi_config_destroy(back);
        mi_free(t);
        mi_config_destroy(cfg);
    }

    /* Empty configs. */
    CHECK_STATUS(mi_config_parse(ctx, "[]", 2, &cfg), MI_STATUS_SUCCESS);
    CHECK(cfg && mi_config_n_layers(cfg) == 0 && mi_config_n_heads(cfg) == 0);
    if (cfg) {
        char *t = NULL;
        CHECK_STATUS(mi_config_to_json(ctx, cfg, &t), MI_STATUS_SUCCESS);
        CHECK(t && strcmp(t, "[]\n") == 0);
        mi_free(t);
    }
    mi_config_destroy(cfg);
    CHECK_STATUS(mi_config_create(ctx, -1, 2, NULL, &cfg), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_create(ctx, 1, 2, NULL, NULL), MI_STATUS_INVALID_ARGUMENT);
    mi_config_destroy(NULL);
    mi_free(NULL);
    CHECK(mi_config_n_layers(NULL) == 0 && mi_config_n_heads(NULL) == 0);
}

typedef struct bad_case {
    const char *file; /* fixture, or NULL to use text */
    const char *text;
    mi_status status;
    const char *needle; /* must appear in the message */
} bad_case;

static void test_malformed(mi_context *ctx) {
    const bad_case cases[] = {
        {"bad_syntax.json", NULL, MI_STATUS_PARSE_ERROR, "bad_syntax.json:2:"},
        {"bad_toplevel.json", NULL, MI_STATUS_PARSE_ERROR, "top level"},
        {"bad_layer.json", NULL, MI_STATUS_PARSE_ERROR, "layer 1 is not an object"},
        {"bad_head_key.json", NULL, MI_STATUS_PARSE_ERROR, "head \"first\""},
        {"bad_head_negative.json", NULL, MI_STATUS_PARSE_ERROR, "head \"-1\""},
        {"bad_arity.json", NULL, MI_STATUS_PARSE_ERROR, "5 elements"},
        {"bad_type.json", NULL, MI_STATUS_PARSE_ERROR, "vertical_size"},
        {"bad_negative.json", NULL, MI_STATUS_PARSE_ERROR, "negative"},
        {"bad_pattern.json", NULL, MI_STATUS_PARSE_ERROR, "diagonal_magic"},
        {"bad_score.json", NULL, MI_STATUS_PARSE_ERROR, "score"},
        {"bad_duplicate.json", NULL, MI_STATUS_PARSE_ERROR, "duplicate"},
        {"empty.json", NULL, MI_STATUS_PARSE_ERROR, "empty.json:"},
        {"does_not_exist.json", NULL, MI_STATUS_IO_ERROR, "does_not_exist.json"},
        {NULL, "", MI_STATUS_PARSE_ERROR, "<config>"},
        {NULL, "[", MI_STATUS_PARSE_ERROR, "<config>:1:"},
        {NULL, "[{\"0\": 5}]", MI_STATUS_PARSE_ERROR, "layer 0, head 0: entry is not a list"},
        {NULL, "[{\"0\": []}]", MI_STATUS_PARSE_ERROR, "0 elements"},
        {NULL, "[{\"0\": [1, 2, 3, 4]}]", MI_STATUS_PARSE_ERROR, "not a string"},
        {NULL, "[{\"01\": [\"dense\", 0, 0, 0]}]", MI_STATUS_PARSE_ERROR, "head \"01\""},
        {NULL, "[{\"1.5\": [\"dense\", 0, 0, 0]}]", MI_STATUS_PARSE_ERROR, "head \"1.5\""},
        {NULL, "[{\"\": [\"dense\", 0, 0, 0]}]", MI_STATUS_PARSE_ERROR, "head \"\""},
        {NULL, "[{\"99999999999\": [\"dense\", 0, 0, 0]}]", MI_STATUS_PARSE_ERROR, "head"},
        {NULL, "[{\"0\": [\"dense\", 1.5, 0, 0]}]", MI_STATUS_PARSE_ERROR, "vertical_size"},
        {NULL, "[{\"0\": [\"dense\", 0, true, 0]}]", MI_STATUS_PARSE_ERROR, "slash_size"},
        {NULL, "[{\"0\": [\"dense\", 0, 3000000000, 0]}]", MI_STATUS_PARSE_ERROR, "slash_size"},
        {NULL, "[{\"0\": [\"dense\", 0, 0, [1]]}]", MI_STATUS_PARSE_ERROR, "score"},
        {NULL, "[{}, {\"2\": [\"vertical_and_slash\", 10, -1, 0]}]", MI_STATUS_PARSE_ERROR,
         "layer 1, head 2"},
        {NULL, "[{}] trailing", MI_STATUS_PARSE_ERROR, "<config>:1:"},
        {NULL, "[null]", MI_STATUS_PARSE_ERROR, "layer 0 is not an object"},
        {NULL, "\"text\"", MI_STATUS_PARSE_ERROR, "<config>:1:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        for (int with_ctx = 0; with_ctx < 2; with_ctx++) {
            mi_context *use = with_ctx ? ctx : NULL;
            mi_config *cfg = (mi_config *)&cfg; /* poison: must come back NULL */
            mi_status st = c->file ? mi_config_load(use, fixture(c->file), &cfg)
                                   : mi_config_parse(use, c->text, strlen(c->text), &cfg);
            if (st != c->status)
                fprintf(stderr, "case %zu (%s): got %s\n", i, c->file ? c->file : c->text,
                        mi_status_name(st));
            CHECK(st == c->status);
            CHECK(cfg == NULL);
            if (use) {
                const char *msg = mi_context_last_error(ctx);
                if (!strstr(msg, c->needle))
                    fprintf(stderr, "case %zu: message \"%s\" lacks \"%s\"\n", i, msg, c->needle);
                CHECK(strstr(msg, c->needle) != NULL);
            }
        }
    }
    /* Argument errors. */
    mi_config *cfg = NULL;
    CHECK_STATUS(mi_config_load(ctx, NULL, &cfg), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_load(ctx, fixture("good.json"), NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_parse(ctx, NULL, 5, &cfg), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_parse(NULL, NULL, 5, &cfg), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_to_json(ctx, NULL, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_save(ctx, NULL, "x"), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_config_layer(ctx, NULL, 0, 1, NULL, NULL), MI_STATUS_INVALID_ARGUMENT);
    /* A directory is not a readable config. */
    CHECK_STATUS(mi_config_load(ctx, data_dir, &cfg), MI_STATUS_IO_ERROR);
    mi_config_destroy(cfg);

    /* Bytes after an embedded NUL or random garbage never crash the parser. */
    unsigned char junk[256];
    uint32_t x = 12345;
    for (int round = 0; round < 200; round++) {
        size_t n = 1 + (size_t)(round % 255);
        for (size_t i = 0; i < n; i++) {
            x = x * 1664525u + 1013904223u;
            junk[i] = "[]{}\",:0123456789-eE.ntrufalsvd_ \x01\xff"[(x >> 24) % 36];
        }
        cfg = NULL;
        mi_status st = mi_config_parse(ctx, (const char *)junk, n, &cfg);
        CHECK(st == MI_STATUS_SUCCESS || st == MI_STATUS_PARSE_ERROR);
        mi_config_destroy(cfg);
    }
}

/* A block_sparse entry's first size is its block budget when positive; 0 (hand-written entries,
 * whose sizes the original ignores) keeps the original's 100 blocks, not a budget of none. */
static void test_block_sparse_budget(mi_context *ctx) {
    const char *text = "[{\"0\": [\"block_sparse\", 0, 0], \"1\": [\"block_sparse\", 7, 0],"
                       " \"2\": [\"block_sparse\", 1000, 6096]}]";
    mi_config *cfg = NULL;
    CHECK_STATUS(mi_config_parse(ctx, text, strlen(text), &cfg), MI_STATUS_SUCCESS);
    if (!cfg) return;
    mi_head_pattern p[3];
    const mi_head_pattern bs_default = mi_head_pattern_default(MI_PATTERN_BLOCK_SPARSE);
    CHECK_STATUS(mi_config_layer(ctx, cfg, 0, 3, p, NULL), MI_STATUS_SUCCESS);
    CHECK(bs_default.top_k == 100);
    CHECK(p[0].type == MI_PATTERN_BLOCK_SPARSE && p[0].top_k == bs_default.top_k);
    CHECK(p[1].top_k == 7 && p[2].top_k == 1000);
    char *out = NULL;
    CHECK_STATUS(mi_config_to_json(ctx, cfg, &out), MI_STATUS_SUCCESS);
    if (out) { /* written back as the budget it runs with */
        CHECK(strstr(out, "\"0\": [\"block_sparse\", 100, 0, null]") != NULL);
        CHECK(strstr(out, "\"1\": [\"block_sparse\", 7, 0, null]") != NULL);
    }
    mi_free(out);
    mi_config_destroy(cfg);
}

int main(int argc, char **argv) {
    if (argc > 1) data_dir = argv[1];
    mi_context *ctx = NULL;
    mi_context_params cp = mi_context_default_params();
    cp.n_threads = 1;
    if (mi_context_create(&cp, &ctx) != MI_STATUS_SUCCESS) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    test_good_file(ctx);
    test_block_sparse_budget(ctx);
    test_key_order(ctx);
    test_create_edit(ctx);
    test_malformed(ctx);
    mi_context_destroy(ctx);
    return check_finish("test_config");
}
