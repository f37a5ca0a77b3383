/* test_eval_scoring.c: the answer checks, perplexity and haystack builders of the harnesses. */
#include "../check.h"
#include "minference.h"
#include "minference_tools.h"

#include <math.h>
#include <string.h>

static int needle(const char *out, const char *ans) {
    int m = -1;
    CHECK_STATUS(mi_eval_needle_match(out, ans, &m), MI_STATUS_SUCCESS);
    return m;
}

static int passkey(const char *out, const char *ans) {
    int m = -1;
    CHECK_STATUS(mi_eval_passkey_match(out, ans, &m), MI_STATUS_SUCCESS);
    return m;
}

static void test_answer_checks(void) {
    CHECK(needle("The special magic number is 4821937.", "4821937") == 1);
    CHECK(needle("It is 4 821 937, I think", "4821937") == 1);
    CHECK(needle("The number is 482193.", "4821937") == 0);
    CHECK(needle("", "4821937") == 0);
    CHECK(needle("12345", "no digits") == 0);

    CHECK(passkey("The pass key is 71432. Remember it.", "71432") == 1);
    CHECK(passkey("71432", "The answer: 71432") == 1);
    CHECK(passkey("I think 12 or 71432", "71432") == 0); /* the first integer counts */
    CHECK(passkey("714320", "71432") == 0);
    CHECK(passkey("none", "71432") == 0);

    const char *refs[] = {"Apple", "banana", "cherry"};
    double s = -1;
    CHECK_STATUS(mi_eval_string_match_all("apple and BANANA", refs, 3, &s), MI_STATUS_SUCCESS);
    CHECK(fabs(s - 2.0 / 3.0) < 1e-12);
    CHECK_STATUS(mi_eval_string_match_all("x", refs, 0, &s), MI_STATUS_SUCCESS);
    CHECK(s == 0.0);
    CHECK_STATUS(mi_eval_string_match_part("a Cherry pie", refs, 3, &s), MI_STATUS_SUCCESS);
    CHECK(s == 1.0);
    CHECK_STATUS(mi_eval_string_match_part("nothing", refs, 3, &s), MI_STATUS_SUCCESS);
    CHECK(s == 0.0);

    const char *others[] = {"5521", "9034", "7777"};
    int m = -1;
    CHECK_STATUS(mi_eval_kv_match("The value is 7777.", "7777", others, 3, &m), MI_STATUS_SUCCESS);
    CHECK(m == 1);
    CHECK_STATUS(mi_eval_kv_match("5521 9034 7777", "7777", others, 3, &m), MI_STATUS_SUCCESS);
    CHECK(m == 0); /* listing every value is not a retrieval */
    CHECK_STATUS(mi_eval_kv_match("7777", "7777", NULL, 0, &m), MI_STATUS_SUCCESS);
    CHECK(m == 1);

    /* Bad input: a status, and the output untouched. */
    m = 5;
    CHECK_STATUS(mi_eval_needle_match(NULL, "1", &m), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_eval_passkey_match("1", NULL, &m), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_eval_kv_match("1", "", NULL, 0, &m), MI_STATUS_INVALID_ARGUMENT);
    CHECK(m == 5);
    const char *bad[] = {"a", NULL};
    CHECK_STATUS(mi_eval_string_match_all("a", bad, 2, &s), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_eval_string_match_all("a", NULL, 1, &s), MI_STATUS_INVALID_ARGUMENT);
}

static void test_perplexity(void) {
    /* Uniform logits over 4 tokens: log p = -ln 4 for every token, perplexity 4. */
    const float logits[4] = {3.0f, 3.0f, 3.0f, 3.0f};
    double lp = 0;
    CHECK_STATUS(mi_eval_log_prob(logits, 4, 2, &lp), MI_STATUS_SUCCESS);
    CHECK(fabs(lp + log(4.0)) < 1e-12);
    const double lps[3] = {lp, lp, lp};
    double ppl = 0;
    CHECK_STATUS(mi_eval_perplexity(lps, 3, &ppl), MI_STATUS_SUCCESS);
    CHECK(fabs(ppl - 4.0) < 1e-9);
    /* Large logits stay finite (stable log-softmax). */
    const float big[3] = {1000.0f, 0.0f, -1000.0f};
    CHECK_STATUS(mi_eval_log_prob(big, 3, 0, &lp), MI_STATUS_SUCCESS);
    CHECK(fabs(lp) < 1e-12);
    CHECK_STATUS(mi_eval_log_prob(big, 3, 2, &lp), MI_STATUS_SUCCESS);
    CHECK(fabs(lp + 2000.0) < 1e-6);
    CHECK_STATUS(mi_eval_log_prob(big, 3, 3, &lp), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_eval_perplexity(lps, 0, &ppl), MI_STATUS_INVALID_ARGUMENT);
    const double pos[1] = {0.5};
    CHECK_STATUS(mi_eval_perplexity(pos, 1, &ppl), MI_STATUS_INVALID_ARGUMENT);
}

static void test_haystacks(void) {
    char *h = NULL;
    size_t n = 0;
    CHECK_STATUS(mi_eval_haystack(NULL, 0, 1000, &h, &n), MI_STATUS_SUCCESS);
    CHECK(h && n >= 1000 && strlen(h) == n);
    CHECK(h && strncmp(h, "The grass is green. The sky is blue.", 36) == 0);
    /* Whole filler blocks only. */
    CHECK(n % strlen(MI_EVAL_FILLER) == 0);

    /* The needle goes at a sentence start at or before depth%. */
    size_t off = 1;
    CHECK_STATUS(mi_eval_needle_offset(h, n, 0.0, &off), MI_STATUS_SUCCESS);
    CHECK(off == 0);
    for (double d = 5; d < 100; d += 7.5) {
        CHECK_STATUS(mi_eval_needle_offset(h, n, d, &off), MI_STATUS_SUCCESS);
        CHECK(off <= (size_t)(n * d / 100.0));
        CHECK(off == 0 || (h[off - 1] == ' ' && h[off - 2] == '.'));
        CHECK(off + 100 > (size_t)(n * d / 100.0)); /* a filler sentence is < 100 bytes */
    }
    CHECK_STATUS(mi_eval_needle_offset(h, n, 100.0, &off), MI_STATUS_SUCCESS);
    CHECK(off == n);
    CHECK_STATUS(mi_eval_needle_offset(h, n, 101.0, &off), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_eval_needle_offset(h, n, NAN, &off), MI_STATUS_INVALID_ARGUMENT);

    const char *needle = "The special magic Paris number is: 1234567.";
    char *with = NULL;
    CHECK_STATUS(mi_eval_insert_needle(h, n, needle, 50.0, &with, &off), MI_STATUS_SUCCESS);
    CHECK(with && strlen(with) == n + strlen(needle) + 1);
    CHECK(with && strncmp(with + off, needle, strlen(needle)) == 0);
    CHECK(with && with[off + strlen(needle)] == ' ');
    CHECK(with && memcmp(with, h, off) == 0);
    mi_free(with);
    CHECK_STATUS(mi_eval_insert_needle(h, n, needle, 100.0, &with, &off), MI_STATUS_SUCCESS);
    CHECK(with && strcmp(with + n, needle) == 0);
    mi_free(with);
    mi_free(h);

    /* Real text: whitespace folded, repeated to the size, paragraph break between repeats. */
    const char *book = "  It was a\n dark   night.\tThe end.\n";
    CHECK_STATUS(mi_eval_haystack(book, strlen(book), 50, &h, &n), MI_STATUS_SUCCESS);
    CHECK(h && strncmp(h, "It was a dark night. The end.\n\nIt was", 37) == 0);
    CHECK(n >= 50);
    mi_free(h);
    CHECK_STATUS(mi_eval_haystack(" \n\t", 3, 50, &h, &n), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_eval_haystack(NULL, 0, 10, NULL, &n), MI_STATUS_INVALID_ARGUMENT);
}

int main(void) {
    test_answer_checks();
    test_perplexity();
    test_haystacks();
    return check_finish("eval.scoring");
}
