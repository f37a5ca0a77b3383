/*
 * kv_retr.h: RetrievalAttention's pieces on the CPU: a vector index over one head's keys that is
 * searched for the keys with the largest q.k (maximum inner product), and attention over two
 * disjoint key sets (the static part: sinks and recent window; the retrieved top-k) merged
 * exactly by log-sum-exp. docs/kv-retrieval.md (RetrievalAttention) describes the method, its
 * defaults and why the index is written here rather than taken from an ANN library.
 *
 * The index is an inverted file: k-means over the keys gives lists of about list_size keys, each
 * key stored (copied) in its list with its row id. A search ranks the lists by q.centroid and
 * scans them in that order until scan_keys keys have been scored exactly, then keeps the top k.
 * Queries and keys of attention follow different distributions, so a list ranking that is good
 * for keys is not for queries: the index is calibrated with query samples (the prompt's last
 * queries), per head: scan_keys is the smallest scan that gives the samples the target recall
 * of their exact top-k, kept as a fraction of the keys as the index grows.
 */
#ifndef MI_KV_RETR_H
#define MI_KV_RETR_H

#include "minference.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kv_retr_params {
    int32_t list_size;    /* keys per list on average (lists = ceil(n / list_size)); 64 */
    int32_t kmeans_iters; /* Lloyd iterations; 10 */
    int32_t train_max;    /* k-means trains on at most this many sampled keys; 16384 */
    float target_recall;  /* calibration target for the samples' top-k; 0.95 (1: exact) */
    uint64_t seed;
} kv_retr_params;

kv_retr_params kv_retr_default_params(void);

typedef struct kv_retr_index kv_retr_index;

/* Builds an index over n keys (rows of keys, ld floats apart, d used) with row ids id0..id0+n-1.
 * queries [nq, d] (ld_q apart; may be NULL with nq 0) calibrate the scan for top_k; without them
 * the whole index is scanned (exact). NULL when out of memory. */
kv_retr_index *kv_retr_build(const float *keys, int64_t n, int64_t ld, int32_t d, int64_t id0,
                             const float *queries, int64_t nq, int64_t ld_q, int32_t top_k,
                             const kv_retr_params *params);
void kv_retr_free(kv_retr_index *ix);
/* Adds one key with row id to its nearest list. false when out of memory (index unchanged). */
bool kv_retr_add(kv_retr_index *ix, const float *key, int64_t id);
int64_t kv_retr_size(const kv_retr_index *ix);
int64_t kv_retr_lists(const kv_retr_index *ix);
/* Keys a search scans (at least min(k, size)): the calibrated fraction of the current size. */
int64_t kv_retr_scan_keys(const kv_retr_index *ix, int32_t k);
/* A deep copy (a forked session's own index). */
kv_retr_index *kv_retr_clone(const kv_retr_index *ix);

/* The k keys (k <= size; fewer when the index holds fewer) with the largest q.k among those
 * scanned: ids[i], scores[i] = q.k (unscaled), in no particular order. Returns the count.
 * scratch: kv_retr_scratch_floats(ix) floats. */
int64_t kv_retr_search(const kv_retr_index *ix, const float *q, int32_t k, int64_t *ids,
                       float *scores, float *scratch);
size_t kv_retr_scratch_floats(const kv_retr_index *ix);

/* Exact top-k by brute force over rows of keys (for tests and the exact path): ids in
 * id0.., scores q.k. Returns min(k, n). */
int64_t kv_retr_exact_topk(const float *keys, int64_t n, int64_t ld, int32_t d, int64_t id0,
                           const float *q, int32_t k, int64_t *ids, float *scores);

/* Softmax attention of one query over a set of keys given by their scores s[0..n) (already
 * scaled) and value rows vals[i] (d floats each): out[d] = sum softmax(s)_i v_i, and *lse =
 * log sum exp(s). n = 0: out zero, lse -inf. */
void kv_retr_partial(const float *s, int64_t n, const float *const *vals, int32_t d, float *out,
                     double *lse);
/* Merges two partial results over disjoint key sets into the attention over their union:
 * out = (e^{lse_a} out_a + e^{lse_b} out_b) / (e^{lse_a} + e^{lse_b}), computed from the
 * larger lse; out may alias out_a. */
void kv_retr_merge(const float *out_a, double lse_a, const float *out_b, double lse_b, int32_t d,
                   float *out, double *lse);

#endif /* MI_KV_RETR_H */
