/*
 * minference_tools.h: the measurement side of libminference, for tools, tests and notebooks:
 * synthetic attention data with planted structure, pattern metrics (recall, density, FLOPs,
 * output error), the offline per-head pattern search, and the scoring and haystack helpers of
 * the accuracy harnesses. The attention path itself (kernels, configs, prefill) needs only
 * minference.h.
 *
 * Conventions are those of minference.h.
 */
#ifndef MINFERENCE_TOOLS_H
#define MINFERENCE_TOOLS_H

#include "minference.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Synthetic structured attention data                                                         */

typedef struct mi_synth_params {
    uint64_t seed;
    int32_t n_sinks;                /* sink key columns at the start (strong for every query) */
    int32_t n_verticals;            /* heavy-hitter key columns at random positions */
    int32_t n_slashes;              /* slash lines at chosen distances (besides the local band) */
    const int32_t *slash_distances; /* [n_slashes] or NULL: random distances */
    int32_t local_window;           /* width of the local decay band */
    int32_t n_needles;              /* retrieval pairs: a query row aligned with one far key */
    float strength;                 /* logit boost of planted structure (default 6) */
    float noise;                    /* scale of the random background (default 1) */
} mi_synth_params;

MI_API mi_synth_params mi_synth_default_params(void);

/* What the generator planted, per head (caller arrays, may be NULL):
 *   vertical_cols [H, n_verticals]; slash_dists [H, n_slashes]; needle_rows/needle_cols
 *   [H, n_needles]. */
typedef struct mi_synth_truth {
    int32_t *vertical_cols;
    int32_t *slash_dists;
    int32_t *needle_rows;
    int32_t *needle_cols;
} mi_synth_truth;

/* Fills q [B, H_q, L, D], k and v [B, H_kv, L, D] (CPU tensors, any dtype) with seeded data whose
 * dense attention shows the planted structure. Heads in a GQA group share k/v structure. */
MI_API mi_status mi_synth_generate(mi_context *ctx, const mi_synth_params *params, mi_tensor *q,
                                   mi_tensor *k, mi_tensor *v, mi_synth_truth *truth);

/* ------------------------------------------------------------------------------------------ */
/* Metrics (CPU)                                                                               */

typedef struct mi_head_metrics {
    double recall;      /* attention mass of dense kept by the pattern's keys, mean over rows */
    double density;     /* fraction of causal (row, key) pairs computed */
    double flops;       /* 4 * D * (keys visited), summed over rows (estimation excluded) */
    double dense_flops; /* 2 * len^2 * D -style count: 4 * D * causal pairs */
} mi_head_metrics;

/* Recall, density and FLOPs of each (b, h)'s pattern on these q/k, exact and blockwise (no
 * L x L memory). out [B * H_q], row-major over (b, h). */
MI_API mi_status mi_metrics_evaluate(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                     const int32_t *seq_lens, const mi_head_pattern *patterns,
                                     const mi_prefill_params *params, mi_head_metrics *out);

/* ||out - ref|| / ||ref|| over all valid rows (float64 sums). */
MI_API mi_status mi_metrics_rel_l2(mi_context *ctx, const mi_tensor *out, const mi_tensor *ref,
                                   const int32_t *seq_lens, double *rel_err);

/* ------------------------------------------------------------------------------------------ */
/* Pattern search                                                                              */
/*
 * Chooses a pattern and budget for every query head of one layer from that layer's post-RoPE
 * q/k/v on a sample prompt (docs/algorithms.md §6). Everything is measured blockwise
 * (mi_metrics_evaluate, mi_prefill_attention), so memory stays O(L) per head at any sample length.
 *
 * Candidates are pattern families: a candidate's budgets are its shape, and the search may scale
 * them by a factor s (VS: vertical_size and slash_size; A-/Tri-shape: n_local, and n_init when
 * s < 1; block-sparse: top_k; dense: fixed). Modes:
 *   MI_SEARCH_FIXED     the candidates as given, as in the original search.
 *   MI_SEARCH_FLOPS     each candidate is scaled per head until its measured density (FLOPs of
 *                       the keys it visits / dense FLOPs) is closest to target_density, so every
 *                       candidate costs the same; then the best score wins.
 *   MI_SEARCH_ADAPTIVE  per head and candidate, the smallest scale whose recall reaches
 *                       target_recall (doubling, then bisection on s); the cheapest candidate
 *                       that reaches the target wins, else the one with the highest recall.
 * Score (higher is better): recall - error_weight * rel_l2, where rel_l2 is the kernel output's
 * relative error against dense attention (only when error_weight > 0, which costs one sparse
 * prefill per candidate and one dense prefill per layer). Ties keep the earlier candidate.
 */

typedef enum mi_search_mode {
    MI_SEARCH_FIXED = 0,
    MI_SEARCH_FLOPS = 1,
    MI_SEARCH_ADAPTIVE = 2,
} mi_search_mode;

typedef struct mi_search_params {
    const mi_head_pattern *candidates; /* [n_candidates]; NULL: mi_search_default_candidates */
    int32_t n_candidates;
    mi_search_mode mode;
    double target_density;     /* MI_SEARCH_FLOPS: in (0, 1] (default 0.1) */
    double target_recall;      /* MI_SEARCH_ADAPTIVE: in (0, 1] (default 0.95) */
    double error_weight;       /* weight of the kernel output error in the score (default 1) */
    double max_scale;          /* largest budget scale tried (default 64) */
    double min_scale;          /* smallest budget scale tried (default 1/64) */
    int32_t iterations;        /* bisection steps per candidate (default 6) */
    mi_prefill_params prefill; /* estimation parameters; dense_below is forced to 0 */
} mi_search_params;

MI_API mi_search_params mi_search_default_params(void);

/* The original's candidates (docs/algorithms.md §6): stream_llm (100, 800); VS (30, 800),
 * (100, 750), (500, 700), (3500, 100), (1000, 6096); block_sparse with top_k = 1/8 of the row
 * blocks of a sample of sample_len tokens (at least 1). out [capacity]; *count gets the number written (7). */
MI_API mi_status mi_search_default_candidates(int64_t sample_len, mi_head_pattern *out,
                                              int32_t capacity, int32_t *count);

/* A candidate's budgets scaled by s (> 0), as the search scales them. */
MI_API mi_status mi_search_scale_pattern(const mi_head_pattern *base, double s,
                                         mi_head_pattern *out);

/* Searches one layer. q [B, H_q, L, D], k and v [B, H_kv, L, D] on the CPU (ctx a CPU context);
 * seq_lens [B] optional. best [H_q] gets each head's pattern; scores [H_q] (optional) its
 * score; metrics [H_q] (optional) the chosen pattern's recall/density/FLOPs summed over the batch
 * (recall and density averaged). */
MI_API mi_status mi_search_layer(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                 const mi_tensor *v, const int32_t *seq_lens,
                                 const mi_search_params *params, mi_head_pattern *best,
                                 double *scores, mi_head_metrics *metrics);

/* ------------------------------------------------------------------------------------------ */
/* Evaluation: answer checks, perplexity and haystacks (docs/algorithms.md §7)                 */
/*
 * Pure string and number helpers for the accuracy harnesses. They take no context: a NULL
 * argument returns MI_STATUS_INVALID_ARGUMENT. Outputs are written only on success.
 */

/* Needle-in-a-haystack (docs/algorithms.md §7): *match = 1 when the digits of answer appear, in one
 * run, among the digits of output (non-digits of output are skipped, so "1 234 567" matches
 * "1234567"; an answer without digits never matches). */
MI_API mi_status mi_eval_needle_match(const char *output, const char *answer, int *match);
/* Passkey (InfiniteBench): *match = 1 when the first integer in output equals answer's. */
MI_API mi_status mi_eval_passkey_match(const char *output, const char *answer, int *match);
/* RULER string_match_all: the fraction (0..1) of refs contained in output, case-insensitive. */
MI_API mi_status mi_eval_string_match_all(const char *output, const char *const *refs,
                                          int32_t n_refs, double *score);
/* RULER string_match_part: 1 when any ref is contained (case-insensitive), else 0. */
MI_API mi_status mi_eval_string_match_part(const char *output, const char *const *refs,
                                           int32_t n_refs, double *score);
/* Multi-key retrieval: *match = 1 when output contains value (exactly, case-sensitive) and none
 * of the distractor values (the values of the other keys, may be NULL / 0). */
MI_API mi_status mi_eval_kv_match(const char *output, const char *value,
                                  const char *const *distractors, int32_t n_distractors,
                                  int *match);

/* log p(token) from raw logits [n_vocab] (a stable log-softmax in double). */
MI_API mi_status mi_eval_log_prob(const float *logits, int32_t n_vocab, int32_t token,
                                  double *log_prob);
/* exp(-mean(log_probs[0..n))). */
MI_API mi_status mi_eval_perplexity(const double *log_probs, int64_t n, double *ppl);

/* The RULER filler sentence block, repeated. */
#define MI_EVAL_FILLER                                                                             \
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "

/* A haystack of at least min_bytes bytes: MI_EVAL_FILLER repeated when text is NULL, else text
 * (e.g. a book read from a file) repeated, its whitespace runs folded to one space, with a
 * paragraph break between repeats. *out is malloc'ed and NUL-terminated (release with mi_free);
 * *length (optional) gets its length. */
MI_API mi_status mi_eval_haystack(const char *text, size_t text_len, size_t min_bytes, char **out,
                                  size_t *length);
/* The byte offset at which a needle goes for depth in [0, 100] percent of hay_len: the offset
 * depth% into the text, moved back to just after the previous sentence end ('.', '!' or '?'
 * followed by whitespace) or to 0 when there is none; depth 100 gives hay_len (appended). */
MI_API mi_status mi_eval_needle_offset(const char *hay, size_t hay_len, double depth,
                                       size_t *offset);
/* hay with needle inserted at mi_eval_needle_offset(depth); *out malloc'ed (mi_free). A space is
 * added after the needle when the text continues without one. */
MI_API mi_status mi_eval_insert_needle(const char *hay, size_t hay_len, const char *needle,
                                       double depth, char **out, size_t *offset);

/* ------------------------------------------------------------------------------------------ */
/* Output files                                                                                */

/* data [n] as the file path, whole or not at all: written to a temporary file in path's folder,
 * flushed, synced and renamed over path. On any failure path is left as it was (the old file,
 * or none) and ctx (may be NULL) gets a message naming the cause (MI_STATUS_IO_ERROR). Results,
 * heat maps and configs are written this way so that an interrupted run never leaves half a
 * file that a later step would read as complete. */
MI_API mi_status mi_file_write_atomic(mi_context *ctx, const char *path, const void *data,
                                      size_t n);

#ifdef __cplusplus
}
#endif

#endif /* MINFERENCE_TOOLS_H */
