/*
 * cmd_scbench.h: SCBench (shared-context long-context benchmark) in `minference scbench`:
 *   cmd_scbench_score.c  the scoring of every task, as the benchmark's own scorer defines it
 *   cmd_scbench_data.c   the JSONL reader and the seeded offline generators
 *   cmd_scbench.c        the harness (multi-turn and multi-request modes), the method matrix,
 *                        the command line and the outputs (JSON, table, PNG)
 * docs/scbench.md describes the tasks, the modes and what differs from the original.
 */
#ifndef MI_TOOLS_CMD_SCBENCH_H
#define MI_TOOLS_CMD_SCBENCH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* Scoring (cmd_scbench_score.c). Pure functions of strings; malloc failure scores 0.           */

/* Lower case, punctuation (ASCII) and the articles a/an/the removed, whitespace folded: the
 * SQuAD-style normalisation of QA F1. malloc'ed. */
char *sc_normalize_answer(const char *s);
/* Token F1 of normalize(pred) against normalize(truth), the best over truths. */
double sc_qa_f1(const char *pred, const char *const *truths, int n);
/* Character F1 after lower-casing and dropping whitespace and ASCII/CJK punctuation, best over
 * truths (the Chinese QA score). */
double sc_qa_f1_zh(const char *pred, const char *const *truths, int n);
/* The fraction of refs contained in pred, case-insensitive, rounded to 2 decimals. */
double sc_string_match_all(const char *pred, const char *const *refs, int n);
/* The first run of ASCII digits in s into out (NUL-terminated; "" when none). */
void sc_first_int(const char *s, char *out, size_t cap);
/* Math find: the first number (digits, optionally "." digits) of pred; an integer label
 * matches when the number truncated to an integer equals it, a float label when equal. */
bool sc_math_find(const char *pred, double label, bool label_is_int);
/* Long-dialogue / many-shot: any item, upper-cased, contained in pred stripped and upper-cased. */
bool sc_any_item_in(const char *pred, const char *const *items, int n);
/* Multiple choice: labels are the answer text and its letter. */
bool sc_choice(const char *pred, const char *const *labels, int n);
/* ROUGE-Lsum F-measure (newline-separated sentences, lower-cased [a-z0-9] tokens, no stemming). */
double sc_rouge_lsum(const char *pred, const char *ref);
/* Sentence BLEU of candidate against one reference, whitespace tokens, 4-gram uniform weights,
 * Chen & Cherry smoothing method 4 (k = 5). */
double sc_bleu(const char *candidate, const char *reference);
/* The code the model wrote: the first Python function in the first fenced code block that has
 * one, else the first block, else the whole (stripped) output. malloc'ed. */
char *sc_repoqa_extract(const char *output);

/* A reference function of a repository (RepoQA needles). */
typedef struct sc_needle {
    const char *name;
    const char *code;
} sc_needle;
/* RepoQA pass@1 at similarity threshold 0.8: the needle most similar (BLEU) to the extracted
 * output must be the asked function (name) with similarity >= 0.8. *best_sim may be NULL. */
bool sc_repoqa_pass(const char *output, const char *name, const sc_needle *needles, int n,
                    double *best_sim);

/* The score in [0, 1] of one turn: task is the task that scores it (a turn's own "task" field
 * for the mixed tasks), label the turn's answer as stored in the data (a string, number or
 * list). RepoQA turns need the repository's needles (repoqa_* may be NULL otherwise). -1 for a
 * task it does not know. */
double sc_score_turn(const char *task, const char *pred, const json_t *answer,
                     const json_t *options, const char *repoqa_name, const sc_needle *needles,
                     int n_needles);

/* ------------------------------------------------------------------------------------------ */
/* Data (cmd_scbench_data.c)                                                                   */

/* The tasks, in the benchmark's order; the generated ones first. */
typedef struct sc_task_info {
    const char *name;
    int max_new_tokens;     /* the original's per task */
    int max_new_tokens_alt; /* mixed tasks: the second subtask's (summary_with_needles: passkey;
                               repoqa_and_kv: kv); 0 otherwise */
    bool generated;         /* an offline generator exists */
} sc_task_info;

extern const sc_task_info sc_tasks[];
extern const int sc_n_tasks;
const sc_task_info *sc_task_find(const char *name);
/* Max new tokens of one turn of task whose own subtask is sub (may be NULL). */
int sc_task_max_new(const sc_task_info *t, const char *sub);

/* Token counter for the generators: the number of tokens of text (in the model's tokenizer). */
typedef size_t (*sc_count_fn)(void *user, const char *text, size_t len);

typedef struct sc_gen_params {
    uint64_t seed;
    int64_t target_tokens; /* context length to aim at, in tokens of count() */
    int n_turns;
    int n_examples;
    sc_count_fn count;
    void *user;
    const char *icl_csv;  /* many-shot: a labelled CSV in scikit-learn's layout (NULL: look up) */
    const char *text_src; /* summary_with_needles: dpkg status file (NULL: /var/lib/dpkg/status) */
    const char *py_src;   /* repoqa: a directory of Python sources (NULL: this Python's stdlib) */
} sc_gen_params;

/* Generates n_examples of task as SCBench JSON objects (appended to out, a JSON array). false
 * with *why set when it cannot (missing source data, unknown task). */
bool sc_generate(const char *task, const sc_gen_params *p, json_t *out, const char **why);
/* Reads a JSONL file of SCBench examples into a JSON array (blank lines skipped). NULL with
 * *why on an I/O or parse error, or a line without "context" and "multi_turns". */
json_t *sc_read_jsonl(const char *path, int max_examples, char *why, size_t why_cap);
/* Writes examples as JSONL, whole or not at all (tool_write_file). */
bool sc_write_jsonl(const json_t *examples, const char *path);
/* The path of scikit-learn's iris.csv when the package is installed (asks python3 where the
 * package is, without importing it). malloc'ed or NULL. */
char *sc_default_icl_csv(void);

/* ------------------------------------------------------------------------------------------ */
/* Prompts (cmd_scbench.c)                                                                      */

/* A chat template as three pieces: a first user message is prefix + text + tail (prefix holds
 * the model's default system prompt), a later one (after an assistant answer ans) is
 * ans + between + text + tail. NULL pieces: no chat formatting (the plain templates). */
typedef struct sc_chat_fmt {
    const char *prefix;
    const char *between;
    const char *tail;
} sc_chat_fmt;

/* The prompts of one example in the original's layout: prompts[0] the first prefill (multi-turn:
 * context + first question; multi-request: the context alone), then one per turn after it
 * (multi-turn) or one per query (multi-request). chat NULL: plain text. At most max_turns turns
 * (<= 0: all). malloc'ed strings in a malloc'ed array of *n; NULL on a malformed example
 * (*why says what). */
char **sc_build_prompts(const char *task, const json_t *example, bool multi_request,
                        const sc_chat_fmt *chat, int max_turns, int *n, const char **why);
void sc_free_prompts(char **prompts, int n);
/* Multi-turn without the golden context: the prompt of turn i >= 1 with `answer` (the model's
 * own answer of turn i - 1; NULL: "") where the reference answer would be. malloc'ed; NULL on a
 * malformed example or turn. */
char *sc_turn_prompt_answered(const char *task, const json_t *example, const sc_chat_fmt *chat,
                              int i, const char *answer, int max_turns);

/* ------------------------------------------------------------------------------------------ */
/* The method matrix (cmd_scbench_matrix.c)                                                     */

/* The --attn list (comma-separated) into out[0..n): names or NAME:V1[:V2...] as given, "all"
 * for dense, minference and every other pattern of the library's table by its short name; an
 * entry named twice is kept once. n, or -1 with *why (empty list, more than max). The strings
 * are malloc'ed (sc_free_list). Names are not checked here. */
int sc_attn_list(const char *arg, char **out, int max, char *why, size_t cap);
/* The --kv list: specs separated by ';', or by ',' where the next part starts a method ("dense,
 * snapkv:a=1,b=2" is two specs); "all" for every KV method of the library at its defaults. */
int sc_kv_list(const char *arg, char **out, int max, char *why, size_t cap);
void sc_free_list(char **v, int n);

/* The per-turn accuracy curves (cmd_scbench_plot.c): acc [n_panels][nm][nt] in [0, 1] (NaN: no
 * point). false when the file cannot be written or the build has no libpng. */
bool sc_write_curves_png(const char *path, const double *acc, int n_panels, int nm, int nt);

#endif /* MI_TOOLS_CMD_SCBENCH_H */
