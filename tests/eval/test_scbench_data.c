/*
 * test_scbench_data.c: the SCBench generators and prompts without a model. Every generator is
 * checked for determinism by seed, for its context's size against the target (with a token
 * count of one token per 4 bytes), and for answers that follow from its own context, recomputed
 * here from the context text (the key's value, the chain's variables, the list's statistics,
 * the needle function's source). The source data is written by the test (a labelled CSV, a dpkg
 * status file, a directory of Python files), so the test needs nothing installed. Also: the
 * JSONL round trip and the prompt layouts of both modes.
 */
#define _POSIX_C_SOURCE 200809L
#include "../check.h"
#include "cmd_scbench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static size_t count4(void *user, const char *text, size_t len) {
    (void)user, (void)text;
    return (len + 3) / 4;
}

static char dir[] = "/tmp/mi_scbench_data_XXXXXX";
static char csv[300], status_file[300], pydir[300];

static void write_sources(void) {
    snprintf(csv, sizeof csv, "%s/labels.csv", dir);
    FILE *f = fopen(csv, "w");
    fprintf(f, "60,3,alpha,beta\n");
    for (int i = 0; i < 60; i++) fprintf(f, "%d.%d,%d.5,%d,%d\n", i, i % 10, i % 7, i * 3, i % 2);
    fclose(f);
    snprintf(status_file, sizeof status_file, "%s/status", dir);
    f = fopen(status_file, "w");
    for (int p = 0; p < 30; p++) {
        fprintf(f,
                "Package: pkg%02d\nStatus: install ok installed\nDescription: summary of pkg%02d\n",
                p, p);
        for (int l = 0; l < 6; l++)
            fprintf(f,
                    " Line %d of the long description of package number %d, which says what "
                    "it does.\n",
                    l, p);
        fprintf(f, " .\n The second paragraph of pkg%02d.\n\n", p);
    }
    fclose(f);
    snprintf(pydir, sizeof pydir, "%s/lib", dir);
    mkdir(pydir, 0755);
    for (int k = 0; k < 6; k++) {
        char path[400];
        snprintf(path, sizeof path, "%s/mod%d.py", pydir, k);
        f = fopen(path, "w");
        fprintf(f, "\"\"\"Module %d.\"\"\"\nimport os\n\n", k);
        for (int j = 0; j < 20; j++) {
            fprintf(f,
                    "def func_%d_%d(a, b=%d):\n    \"\"\"Return the %d-th combination of a and b "
                    "for module %d, scaled.\"\"\"\n",
                    k, j, j, j, k);
            fprintf(f, "    x = a + b * %d\n    if x > %d:\n        x -= %d\n\n    return x\n\n\n",
                    j, k, j);
        }
        fclose(f);
    }
}

static sc_gen_params params(int64_t target, int turns, uint64_t seed) {
    sc_gen_params p = {seed, target, turns, 2, count4, NULL, csv, status_file, pydir};
    return p;
}

static json_t *gen(const char *task, const sc_gen_params *p) {
    json_t *a = json_array();
    const char *why = NULL;
    if (!sc_generate(task, p, a, &why)) {
        CHECK(0, "%s: %s", task, why);
        json_decref(a);
        return NULL;
    }
    return a;
}

static const char *S(const json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* The text between the first pair of double quotes after marker in s. */
static void quoted(const char *s, const char *marker, char *out, size_t cap) {
    out[0] = 0;
    const char *p = strstr(s, marker);
    if (!p || !(p = strchr(p + strlen(marker), '"'))) return;
    const char *e = strchr(p + 1, '"');
    if (!e || (size_t)(e - p) > cap) return;
    memcpy(out, p + 1, (size_t)(e - p - 1));
    out[e - p - 1] = 0;
}

static void check_kv_turn(const char *context, const json_t *turn) {
    char key[64];
    quoted(S(turn, "input"), "Key:", key, sizeof key);
    /* the object's value for the key, found in the context's text */
    char pat[80], val[64] = "";
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *at = strstr(context, pat);
    CHECK(key[0] && at, "key %s", key);
    if (at) quoted(at + strlen(pat) - 1, "", val, sizeof val);
    CHECK(!strcmp(val, S(turn, "answer")), "%s: %s vs %s", key, val, S(turn, "answer"));
}

static void check_kv(const json_t *ex) {
    const char *c = S(ex, "context");
    json_error_t e;
    json_t *obj = json_loads(c, 0, &e);
    CHECK(json_is_object(obj), "the context is a JSON object");
    const json_t *turns = json_object_get(ex, "multi_turns");
    for (size_t t = 0; t < json_array_size(turns); t++) {
        const json_t *tu = json_array_get(turns, t);
        char key[64];
        quoted(S(tu, "input"), "Key:", key, sizeof key);
        CHECK(!strcmp(json_string_value(json_object_get(obj, key)), S(tu, "answer")));
    }
    json_decref(obj);
}

static void check_prefix_suffix(const json_t *ex) {
    const char *c = S(ex, "context");
    const json_t *turns = json_object_get(ex, "multi_turns");
    CHECK(json_array_size(turns) > 0);
    for (size_t t = 0; t < json_array_size(turns); t++) {
        const json_t *tu = json_array_get(turns, t);
        char pre[16], suf[16];
        quoted(S(tu, "input"), "starts with", pre, sizeof pre);
        quoted(S(tu, "input"), "ends with", suf, sizeof suf);
        const char *ans = S(tu, "answer");
        const size_t la = strlen(ans);
        CHECK(!strncmp(ans, pre, strlen(pre)) && la >= strlen(suf) &&
              !strcmp(ans + la - strlen(suf), suf));
        /* exactly one line of the list has the prefix and the suffix: the answer */
        int n = 0;
        for (const char *l = strchr(c, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
            const char *e = strchr(l + 1, '\n');
            const size_t len = e ? (size_t)(e - l - 1) : strlen(l + 1);
            if (len >= strlen(suf) && !strncmp(l + 1, pre, strlen(pre)) &&
                !strncmp(l + 1 + len - strlen(suf), suf, strlen(suf))) {
                n++;
                CHECK(len == la && !strncmp(l + 1, ans, la));
            }
        }
        CHECK_EQ(n, 1);
    }
}

/* The variables whose chain reaches value: recomputed from the "VAR X = ..." statements. */
static void check_vt(const json_t *ex) {
    const char *c = S(ex, "context");
    char names[256][6], refs[256][6];
    long vals[256];
    int n = 0;
    for (const char *p = strstr(c, "VAR "); p && n < 256; p = strstr(p + 1, "VAR ")) {
        if (p > c && p[-1] == '=') continue;
        if (p >= c + 2 && !strncmp(p - 2, "= ", 2)) continue; /* the right side of a copy */
        char rhs[16] = "";
        if (sscanf(p, "VAR %5s = %15s", names[n], rhs) != 2) continue;
        if (!strcmp(rhs, "VAR")) {
            sscanf(p, "VAR %*5s = VAR %5s", refs[n]);
            vals[n] = -1;
        } else {
            refs[n][0] = 0;
            vals[n] = atol(rhs);
        }
        n++;
    }
    /* resolve the copies in order of appearance (a copy always follows its source) */
    for (int i = 0; i < n; i++)
        if (vals[i] < 0)
            for (int j = 0; j < i; j++)
                if (!strncmp(names[j], refs[i], 5)) vals[i] = vals[j];
    const json_t *turns = json_object_get(ex, "multi_turns");
    for (size_t t = 0; t < json_array_size(turns); t++) {
        const json_t *tu = json_array_get(turns, t);
        long v = 0;
        sscanf(strstr(S(tu, "input"), "the value ") + 10, "%ld", &v);
        const json_t *ans = json_object_get(tu, "answer");
        int want = 0;
        for (int i = 0; i < n; i++) {
            if (vals[i] != v) continue;
            want++;
            bool found = false;
            for (size_t k = 0; k < json_array_size(ans); k++)
                found |= !strcmp(json_string_value(json_array_get(ans, k)), names[i]);
            CHECK(found, "%s should be in the answer", names[i]);
        }
        CHECK_EQ(want, (int)json_array_size(ans));
    }
}

static int cmp_l(const void *a, const void *b) {
    const long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static void check_mf(const json_t *ex) {
    const char *c = S(ex, "context");
    long *v = malloc(strlen(c) * sizeof *v);
    int n = 0;
    for (const char *p = c + 1; *p && *p != ']';) {
        char *e;
        v[n++] = strtol(p, &e, 10);
        p = e;
        while (*p == ',' || *p == ' ') p++;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_l);
    CHECK(n % 2 == 1);
    const json_t *turns = json_object_get(ex, "multi_turns");
    for (size_t t = 0; t < json_array_size(turns); t++) {
        const json_t *tu = json_array_get(turns, t);
        const char *in = S(tu, "input");
        const long want = strstr(in, "largest")    ? v[n - 1]
                          : strstr(in, "smallest") ? v[0]
                                                   : v[n / 2];
        CHECK_EQ(json_integer_value(json_object_get(tu, "answer")), want);
    }
    free(v);
}

static void check_icl(const json_t *ex) {
    const char *c = S(ex, "context");
    const json_t *turns = json_object_get(ex, "multi_turns");
    for (size_t t = 0; t < json_array_size(turns); t++) {
        const json_t *tu = json_array_get(turns, t);
        const char *lab = json_string_value(json_array_get(json_object_get(tu, "answer"), 0));
        CHECK(lab && (!strcmp(lab, "alpha") || !strcmp(lab, "beta")));
        /* the asked row is held out of the shots, and its label is the CSV's: i % 2 */
        char line[128];
        snprintf(line, sizeof line, "%s\n", S(tu, "input"));
        strstr(line, "\nLabel:")[6] = 0; /* "Input: ...\nLabel" */
        CHECK(!strstr(c, line), "query row %s among the shots", line);
        int i = atoi(line + strlen("Input: "));
        CHECK(!strcmp(lab, i % 2 ? "beta" : "alpha"));
    }
    CHECK(strstr(c, "Label: alpha") && strstr(c, "Label: beta"));
}

static void check_summary(const json_t *ex) {
    const char *c = S(ex, "context");
    const json_t *turns = json_object_get(ex, "multi_turns");
    int keys = 0, sums = 0;
    for (size_t t = 0; t < json_array_size(turns); t++) {
        const json_t *tu = json_array_get(turns, t);
        if (!strcmp(S(tu, "task"), "scbench_passkey")) {
            keys++;
            const char *door = strstr(S(tu, "input"), "of the ") + 7;
            char needle[128];
            snprintf(needle, sizeof needle, "The pass key of the %.*s door is %s.",
                     (int)(strchr(door, ' ') - door), door, S(tu, "answer"));
            CHECK(strstr(c, needle), "%s", needle);
        } else {
            sums++;
            CHECK(!strcmp(S(tu, "task"), "scbench_summary"));
            const char *pkg = strstr(S(tu, "input"), "package ") + 8;
            char head[64], want[64];
            snprintf(head, sizeof head, "Package %.5s:\nLine 0", pkg);
            snprintf(want, sizeof want, "summary of %.5s", pkg);
            CHECK(strstr(c, head) && !strcmp(S(tu, "answer"), want));
        }
    }
    CHECK(keys >= 1 && sums >= 1);
}

static void check_repoqa(const json_t *ex, bool with_kv) {
    const char *c = S(ex, "context");
    const json_t *turns = json_object_get(ex, "multi_turns");
    CHECK(!strcmp(S(ex, "repo"), "cpython-stdlib") && !strcmp(S(ex, "lang"), "python"));
    for (size_t t = 0; t < json_array_size(turns); t++) {
        const json_t *tu = json_array_get(turns, t);
        if (with_kv && !strcmp(S(tu, "task"), "scbench_kv")) {
            check_kv_turn(c, tu);
            continue;
        }
        const char *code = S(tu, "answer");
        char head[160];
        snprintf(head, sizeof head, "def %s(", S(tu, "name"));
        CHECK(!strncmp(code, head, strlen(head)), "%s", code);
        CHECK(strstr(c, code) != NULL, "the needle is in the context");
        /* the description is the function's docstring */
        const char *desc = strstr(S(tu, "input"), "Function description:\n");
        CHECK(desc && strstr(code, desc + strlen("Function description:\n")));
        /* and the scorer finds it as the best match of the repository's needles */
        const sc_needle nd[] = {{S(tu, "name"), code}};
        char out[4096];
        snprintf(out, sizeof out, "```python\n%s\n```", code);
        CHECK(sc_repoqa_pass(out, S(tu, "name"), nd, 1, NULL));
    }
}

static void test_generators(void) {
    static const char *const tasks[] = {"scbench_kv",        "scbench_prefix_suffix",
                                        "scbench_vt",        "scbench_mf",
                                        "scbench_many_shot", "scbench_summary_with_needles",
                                        "scbench_repoqa",    "scbench_repoqa_and_kv"};
    const int64_t targets[] = {600, 2000};
    for (size_t k = 0; k < sizeof tasks / sizeof *tasks; k++)
        for (int ti = 0; ti < 2; ti++) {
            const char *task = tasks[k];
            const int64_t target = targets[ti];
            sc_gen_params p = params(target, 4, 7);
            json_t *a = gen(task, &p), *b = gen(task, &p);
            p.seed = 8;
            json_t *other = gen(task, &p);
            if (!a || !b || !other) {
                json_decref(a), json_decref(b), json_decref(other);
                continue;
            }
            CHECK(json_equal(a, b), "%s: same seed, same data", task);
            CHECK(!json_equal(a, other), "%s: another seed, other data", task);
            CHECK_EQ((int)json_array_size(a), 2);
            for (size_t e = 0; e < json_array_size(a); e++) {
                const json_t *ex = json_array_get(a, e);
                const char *c = S(ex, "context");
                const double n = (double)count4(NULL, c, strlen(c));
                /* within 3% below the target; item-sized tasks (whole package descriptions,
                 * whole functions) within 15% */
                const bool coarse = strstr(task, "summary") || strstr(task, "repoqa");
                CHECK(n <= target && n >= (coarse ? 0.85 : 0.97) * (double)target,
                      "%s: %.0f tokens for %lld", task, n, (long long)target);
                CHECK_EQ((int)json_array_size(json_object_get(ex, "multi_turns")), 4);
                if (!strcmp(task, "scbench_kv"))
                    check_kv(ex);
                else if (!strcmp(task, "scbench_prefix_suffix"))
                    check_prefix_suffix(ex);
                else if (!strcmp(task, "scbench_vt"))
                    check_vt(ex);
                else if (!strcmp(task, "scbench_mf"))
                    check_mf(ex);
                else if (!strcmp(task, "scbench_many_shot"))
                    check_icl(ex);
                else if (!strcmp(task, "scbench_summary_with_needles"))
                    check_summary(ex);
                else
                    check_repoqa(ex, strstr(task, "and_kv") != NULL);
            }
            json_decref(a), json_decref(b), json_decref(other);
        }
    /* bad requests */
    sc_gen_params p = params(600, 4, 1);
    json_t *a = json_array();
    const char *why = NULL;
    CHECK(!sc_generate("scbench_qa_eng", &p, a, &why) && why);
    CHECK(!sc_generate("nope", &p, a, &why) && why);
    p.n_turns = 0;
    CHECK(!sc_generate("scbench_kv", &p, a, &why) && why);
    p = params(600, 4, 1);
    p.icl_csv = "/nonexistent.csv";
    CHECK(!sc_generate("scbench_many_shot", &p, a, &why) && why);
    CHECK_EQ((int)json_array_size(a), 0);
    json_decref(a);
}

static void test_jsonl(void) {
    sc_gen_params p = params(300, 2, 3);
    json_t *a = gen("scbench_kv", &p);
    char path[400], why[256];
    snprintf(path, sizeof path, "%s/kv.jsonl", dir);
    CHECK(a && sc_write_jsonl(a, path));
    json_t *back = sc_read_jsonl(path, 0, why, sizeof why);
    CHECK(back && json_equal(a, back));
    json_decref(back);
    back = sc_read_jsonl(path, 1, why, sizeof why);
    CHECK(back && json_array_size(back) == 1);
    json_decref(back);
    json_decref(a);
    FILE *f = fopen(path, "w");
    fputs("{\"id\": 1, \"context\": \"c\", \"multi_turns\": []}\n\n{\"id\": 2}\n", f);
    fclose(f);
    CHECK(sc_read_jsonl(path, 0, why, sizeof why) == NULL && strstr(why, ":3:"), "%s", why);
    f = fopen(path, "w");
    fputs("{not json\n", f);
    fclose(f);
    CHECK(sc_read_jsonl(path, 0, why, sizeof why) == NULL);
    CHECK(sc_read_jsonl("/nonexistent/x.jsonl", 0, why, sizeof why) == NULL);
}

static void test_prompts(void) {
    json_error_t e;
    json_t *ex = json_loads("{\"id\": \"0\", \"context\": \"CTX\", \"multi_turns\": ["
                            "{\"input\": \"Q1\", \"answer\": \"A1\"},"
                            "{\"input\": \"Q2\", \"answer\": [\"x\", \"y'\"]},"
                            "{\"input\": \"Q3\", \"answer\": 3}]}",
                            0, &e);
    const sc_chat_fmt chat = {"<s>U:", "</s>U:", "</s>A:"};
    int n = 0;
    const char *why = NULL;
    char **p = sc_build_prompts("scbench_kv", ex, false, NULL, 0, &n, &why);
    CHECK(p && n == 3);
    if (p && n == 3) {
        CHECK(!strcmp(p[0], "Extract the value corresponding to the specified key in the JSON "
                            "object below.\n\nCTX\n\nQ1"));
        CHECK(!strcmp(p[1], "A1\n\nQ2"));
        CHECK(!strcmp(p[2], "['x', \"y'\"]\n\nQ3"), "%s", p[2]);
    }
    sc_free_prompts(p, n);
    p = sc_build_prompts("scbench_vt", ex, false, &chat, 2, &n, &why);
    CHECK(p && n == 2 && !strcmp(p[0], "<s>U:CTX\n\nQ1</s>A:") &&
          !strcmp(p[1], "A1</s>U:Q2</s>A:"));
    sc_free_prompts(p, n);
    p = sc_build_prompts("scbench_vt", ex, true, &chat, 0, &n, &why);
    CHECK(p && n == 4 && !strcmp(p[0], "<s>U:CTX") && !strcmp(p[1], "Q1</s>A:") &&
          !strcmp(p[3], "Q3</s>A:"));
    sc_free_prompts(p, n);
    /* without the golden context: the model's own answer where the reference one stood */
    char *own = sc_turn_prompt_answered("scbench_kv", ex, NULL, 1, "mine", 0);
    CHECK(own && !strcmp(own, "mine\n\nQ2"), "%s", own ? own : "(null)");
    free(own);
    own = sc_turn_prompt_answered("scbench_vt", ex, &chat, 2, NULL, 0);
    CHECK(own && !strcmp(own, "</s>U:Q3</s>A:"), "%s", own ? own : "(null)");
    free(own);
    CHECK(sc_turn_prompt_answered("scbench_kv", ex, NULL, 0, "x", 0) == NULL);
    CHECK(sc_turn_prompt_answered("scbench_kv", ex, NULL, 3, "x", 0) == NULL);
    json_decref(ex);

    /* math find: "What is {the ... }?" from the turn's own "The ... is" */
    ex = json_loads("{\"context\": \"[1, 2]\", \"multi_turns\": ["
                    "{\"input\": \"Answer now. The largest number of the list is: \", "
                    "\"answer\": 2},"
                    "{\"input\": \"The smallest number is: \", \"answer\": 1}]}",
                    0, &e);
    p = sc_build_prompts("scbench_mf", ex, false, NULL, 0, &n, &why);
    CHECK(p && n == 2);
    if (p && n == 2) {
        CHECK(!strcmp(p[0], "What is the largest number of the list?\n\n[1, 2]\n\nAnswer now. The "
                            "largest number of the list is: "),
              "%s", p[0]);
        CHECK(!strcmp(p[1], "2\n\nWhat is the smallest number?\n\nThe smallest number is: "), "%s",
              p[1]);
    }
    sc_free_prompts(p, n);
    p = sc_build_prompts("scbench_mf", ex, true, NULL, 0, &n, &why);
    CHECK(p && n == 3 && !strncmp(p[0], "Answer now. The largest", 23) &&
          !strcmp(p[2], "What is the smallest number?\n\nThe smallest number is: "));
    sc_free_prompts(p, n);
    json_decref(ex);

    /* choice: options and the original's answer lines */
    ex = json_loads(
        "{\"context\": \"BOOK\", \"multi_turns\": ["
        "{\"input\": \"Who?\", \"answer\": \"b\", \"options\": [\"a\",\"b\",\"c\",\"d\"]},"
        "{\"input\": \"Why?\", \"answer\": \"c\", \"options\": [\"a\",\"b\",\"c\",\"d\"]}]}",
        0, &e);
    p = sc_build_prompts("scbench_choice_eng", ex, false, NULL, 0, &n, &why);
    CHECK(p && n == 2 &&
          !strcmp(p[0],
                  "Read the book and answer the question.\n\nBOOK\n\nQuestion: Who?\nA. a\nB. "
                  "b\nC. c\nD. d\n\nThe the correct answer is") &&
          !strcmp(p[1], "b\n\nQuestion: Why?\nA. a\nB. b\nC. c\nD. d\n\nThe letter of the correct "
                        "answer is"));
    sc_free_prompts(p, n);
    json_decref(ex);
    ex = json_loads("{\"context\": \"BOOK\", \"multi_turns\": [{\"input\": \"Who?\"}]}", 0, &e);
    p = sc_build_prompts("scbench_choice_eng", ex, false, NULL, 0, &n, &why);
    CHECK(!p && why && n == 0);
    json_decref(ex);
}

/* Each turn's new tokens: the original's table (scbench/eval_utils.py), per subtask for the
 * mixed tasks. A RepoQA answer is a whole function, which the task's 1024 tokens hold and a
 * 64-token cap cuts below the pass threshold. */
static void test_new_tokens(void) {
    static const struct {
        const char *task, *sub;
        int want;
    } table[] = {
        {"scbench_kv", NULL, 150},
        {"scbench_prefix_suffix", NULL, 150},
        {"scbench_vt", NULL, 30},
        {"scbench_mf", NULL, 5},
        {"scbench_many_shot", NULL, 10},
        {"scbench_summary_with_needles", "scbench_summary", 800},
        {"scbench_summary_with_needles", "scbench_passkey", 15},
        {"scbench_repoqa", NULL, 1024},
        {"scbench_repoqa_and_kv", "scbench_repoqa", 1024},
        {"scbench_repoqa_and_kv", "scbench_kv", 80},
        {"scbench_qa_eng", NULL, 40},
        {"scbench_qa_chn", NULL, 40},
        {"scbench_choice_eng", NULL, 40},
        {"scbench_summary", NULL, 200},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        CHECK_EQ(sc_task_max_new(sc_task_find(table[i].task), table[i].sub), table[i].want);
    CHECK_EQ(sc_task_max_new(NULL, NULL), 0);

    /* a function of about 300 tokens (one per 4 bytes), 14 lines */
    char code[2048] = "def merge_ranges(ranges, gap=0):\n"
                      "    \"\"\"Merge overlapping or nearly touching integer ranges.\n\n"
                      "    Ranges closer than gap are joined; the result is sorted.\n"
                      "    \"\"\"\n";
    for (int l = 0; l < 10; l++) {
        char line[200];
        snprintf(line, sizeof line,
                 "    step_%d = [(lo + %d, hi - %d) for lo, hi in sorted(ranges) if hi - lo > "
                 "gap + %d]\n",
                 l, l, l, l);
        strcat(code, line);
    }
    const sc_needle nd[] = {{"merge_ranges", code},
                            {"other", "def other(x):\n    return [x for x in range(3)]\n"}};
    const size_t tokens = count4(NULL, code, strlen(code));
    const int cap = sc_task_max_new(sc_task_find("scbench_repoqa"), NULL);
    CHECK(tokens > 2 * 64 && tokens <= (size_t)cap, "%zu tokens", tokens);
    json_t *answer = json_string(code);
    char out[4096];
    snprintf(out, sizeof out, "Here it is:\n```python\n%s```\nDone.", code);
    CHECK_EQ(sc_score_turn("scbench_repoqa", out, answer, NULL, "merge_ranges", nd, 2), 1.0);
    /* the same answer cut after 64 tokens: the right function, too short to pass */
    snprintf(out, sizeof out, "```python\n%.*s", 64 * 4, code);
    double sim = 0;
    CHECK(!sc_repoqa_pass(out, "merge_ranges", nd, 2, &sim));
    CHECK(sim > 0 && sim < 0.8, "similarity %g", sim);
    CHECK_EQ(sc_score_turn("scbench_repoqa", out, answer, NULL, "merge_ranges", nd, 2), 0.0);
    json_decref(answer);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    write_sources();
    test_generators();
    test_jsonl();
    test_prompts();
    test_new_tokens();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_finish("eval.scbench_data");
}
