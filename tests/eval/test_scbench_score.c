/*
 * test_scbench_score.c: the SCBench scores on cases worked out by hand (each comment shows the
 * arithmetic), including the original's quirks that the scores keep (a string label iterated
 * character by character).
 */
#include "../check.h"
#include "cmd_scbench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static json_t *J(const char *text) {
    json_error_t e;
    return json_loads(text, JSON_DECODE_ANY, &e);
}

static double turn(const char *task, const char *pred, const char *answer_json) {
    json_t *a = J(answer_json);
    const double s = sc_score_turn(task, pred, a, NULL, NULL, NULL, 0);
    json_decref(a);
    return s;
}

static void test_qa(void) {
    char *n = sc_normalize_answer("The  Quick, brown-fox! theater");
    CHECK(n && strcmp(n, "quick brownfox theater") == 0, "%s", n);
    free(n);
    /* pred "cat sat on mat" (4), truth "cat on mat" (3): 3 common, P 3/4, R 1, F1 6/7 */
    const char *t1[] = {"a cat on a mat", "dog"};
    CHECK_NEAR(sc_qa_f1("The cat sat on the mat.", t1, 2), 6.0 / 7.0, 1e-12);
    const char *t2[] = {"zebra"};
    CHECK_NEAR(sc_qa_f1("The cat", t2, 1), 0.0, 0);
    /* 北京是首都 (5) against 首都北京 (4): 4 common, P 4/5, R 1, F1 8/9 */
    const char *z[] = {"首都北京"};
    CHECK_NEAR(sc_qa_f1_zh("北京，是 首都。", z, 1), 8.0 / 9.0, 1e-12);
    /* a string answer is iterated by character: the best single character wins, F1 2/6 */
    CHECK_NEAR(turn("scbench_qa_chn", "北京是首都", "\"北京\""), 2.0 * (1.0 / 5) / (1 + 1.0 / 5),
               1e-12);
}

static void test_matches(void) {
    const char *refs[] = {"abc", "xyz", "qqq"};
    CHECK_NEAR(sc_string_match_all("VAR ABC and var XYZ", refs, 3), 0.67, 1e-12);
    char buf[16];
    sc_first_int("The pass key is 71432, yes 5", buf, sizeof buf);
    CHECK(strcmp(buf, "71432") == 0);
    sc_first_int("no digits", buf, sizeof buf);
    CHECK(buf[0] == 0);

    CHECK(sc_math_find("The max is 12.75 and 3", 12, true));
    CHECK(sc_math_find("The max is 12.75 and 3", 12.75, false));
    CHECK(!sc_math_find("The max is 12.75 and 3", 13, true));
    CHECK(!sc_math_find("none", 0, true));
    CHECK(sc_math_find("-7", 7, true)); /* no sign in the number pattern */

    const char *items[] = {"(B)"};
    CHECK(sc_any_item_in(" the answer is (b) ", items, 1));
    CHECK(!sc_any_item_in("(C)", items, 1));
    /* the original iterates a string label: '(' alone is found in "(C)" */
    CHECK_NEAR(turn("scbench_many_shot", "(C)", "\"(B)\""), 1.0, 0);
    CHECK_NEAR(turn("scbench_many_shot", "(C)", "[\"(B)\"]"), 0.0, 0);

    const char *lab[] = {"Paris", "B"};
    CHECK(sc_choice("B. Paris", lab, 2));
    CHECK(!sc_choice("C", lab, 2));
    CHECK(sc_choice("The answer is: B", lab, 2));
    CHECK(sc_choice("I think the answer is Paris", lab, 2));
    CHECK(!sc_choice("I think the answer is", lab, 2));
    CHECK(sc_choice("maybe B or not", lab, 2));
    CHECK(!sc_choice("maybe AB", lab, 2)); /* "AB" is a part of "ABCD" but not a label */
    CHECK(!sc_choice("   ", lab, 2));
    CHECK(sc_choice("Paris", lab, 2));
}

static void test_rouge_bleu(void) {
    /* ref [the cat sat][on the mat], cand [the cat][sat on mat]: the union LCS of the first
     * reference sentence is the, cat, sat (3 hits); of the second on, the, mat, but "the" is
     * used up in the candidate: 2 hits. R 5/6, P 5/5, F 10/11. */
    CHECK_NEAR(sc_rouge_lsum("the cat\nsat on mat", "the cat sat\non the mat"), 10.0 / 11.0, 1e-12);
    CHECK_NEAR(sc_rouge_lsum("The CAT!", "the cat"), 1.0, 1e-12);
    CHECK_NEAR(sc_rouge_lsum("", "the cat"), 0.0, 0);
    CHECK_NEAR(sc_rouge_lsum("dog", "the cat"), 0.0, 0);

    CHECK_NEAR(sc_bleu("a b c d e", "a  b\nc d e"), 1.0, 1e-12);
    /* every precision 1, brevity penalty exp(1 - 5/4) */
    CHECK_NEAR(sc_bleu("a b c d", "a b c d e"), exp(-0.25), 1e-12);
    /* p1 2/4, p2 1/3; p3 0/2 and p4 0/1 smoothed to 1/(2^k * 5 / ln 4) / denominator */
    const double l4 = log(4.0);
    const double want = exp(0.25 * (log(0.5) + log(1.0 / 3) + log(l4 / 10 / 2) + log(l4 / 20)));
    CHECK_NEAR(sc_bleu("a b x y", "a b c d"), want, 1e-12);
    CHECK_NEAR(sc_bleu("x y", "a b c d"), 0.0, 0);
    /* one token: the missing n-gram orders drop out, leaving the brevity penalty exp(1 - 4) */
    CHECK_NEAR(sc_bleu("a", "a b c d"), exp(-3.0), 1e-12);
}

static void test_repoqa(void) {
    const char *out = "Here it is:\n```python\nimport os\ndef foo(a,\n        b):\n    x = 1\n\n"
                      "    return x\nprint(1)\n```\nDone.";
    const char *foo = "def foo(a,\n        b):\n    x = 1\n\n    return x";
    char *code = sc_repoqa_extract(out);
    CHECK(code && strcmp(code, foo) == 0, "%s", code);
    free(code);
    code = sc_repoqa_extract("  no block here \n");
    CHECK(code && strcmp(code, "no block here") == 0);
    free(code);
    code = sc_repoqa_extract("```\nx = 1\n```");
    CHECK(code && strcmp(code, "x = 1\n") == 0, "%s", code);
    free(code);
    code = sc_repoqa_extract("```py\ndef one(): return 1\ny = 2\n```");
    CHECK(code && strcmp(code, "def one(): return 1") == 0, "%s", code);
    free(code);

    const sc_needle needles[] = {{"foo", foo}, {"bar", "def bar():\n    return 2"}};
    double sim = 0;
    CHECK(sc_repoqa_pass(out, "foo", needles, 2, &sim));
    CHECK_NEAR(sim, 1.0, 1e-12);
    CHECK(!sc_repoqa_pass(out, "bar", needles, 2, NULL));
    /* the right function but too far from it: BLEU below 0.8 */
    CHECK(!sc_repoqa_pass("```\ndef foo(a, b):\n    return None\n```", "foo", needles, 2, &sim));
    CHECK(sim < 0.8);
}

static void test_dispatch(void) {
    CHECK_NEAR(turn("scbench_kv", "the value is abc-123.", "\"abc-123\""), 1, 0);
    CHECK_NEAR(turn("scbench_prefix_suffix", "abc-12", "\"abc-123\""), 0, 0);
    CHECK_NEAR(turn("scbench_passkey", "It is 71432.", "71432"), 1, 0);
    CHECK_NEAR(turn("scbench_passkey", "It is 71433.", "\"71432\""), 0, 0);
    CHECK_NEAR(turn("scbench_mf", "99", "[99]"), 1, 0);
    CHECK_NEAR(turn("scbench_mf", "9.5", "9.5"), 1, 0);
    CHECK_NEAR(turn("scbench_vt", "X1 and X2", "[\"X1\", \"X2\", \"X3\", \"X4\"]"), 0.5, 1e-12);
    CHECK_NEAR(turn("scbench_qa_eng", "Answer: PARIS", "\"Paris\""), 1, 0);
    CHECK_NEAR(turn("scbench_summary", "the cat", "\"the cat\""), 1, 1e-12);
    CHECK_NEAR(turn("no_such_task", "x", "\"x\""), -1, 0);
    json_t *opts = J("[\"London\", \"Paris\", \"Rome\", \"Oslo\"]"), *ans = J("\"Paris\"");
    CHECK_NEAR(sc_score_turn("scbench_choice_eng", "B", ans, opts, NULL, NULL, 0), 1, 0);
    CHECK_NEAR(sc_score_turn("scbench_choice_eng", "A", ans, opts, NULL, NULL, 0), 0, 0);
    json_decref(opts), json_decref(ans);
}

int main(void) {
    test_qa();
    test_matches();
    test_rouge_bleu();
    test_repoqa();
    test_dispatch();
    return check_finish("eval.scbench_score");
}
