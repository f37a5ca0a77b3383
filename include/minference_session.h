/*
 * minference_session.h: sessions of the model runner (CPU). A session is one sequence's KV cache
 * and position, kept in the paged cache of minference_kv.h, separate from the weights: many
 * sessions share one model, a fork shares its parent's pages (copy-on-write), and a session can be
 * saved to a file and loaded back (docs/kv-cache.md describes the file).
 *
 * Conventions are those of minference.h: every function returns mi_status unless it is a pure
 * query; destroy(NULL) is a no-op; a failed call leaves the session exactly as it was (a forward
 * pass that fails in a layer cuts every layer back to the length it had before the call) and
 * leaves a message in mi_session_last_error().
 *
 * Concurrency: the model holds the weights, the worker threads and the scratch buffers that a
 * forward pass uses, and the page pool shared by its sessions, so one call at a time per model:
 * sessions of the same model must not be used from two threads at once (sessions of different
 * models may). Destroy a model's sessions before the model.
 *
 * Attention: the first prefill of an empty session runs the model's attention mode (sparse,
 * exactly as mi_model_prefill); a later prefill or decode (a follow-up turn, queries at an
 * offset) attends densely to the whole cache, reading the pages in place.
 *
 * KV methods (mi_session_params.kv, docs/kv-methods.md): a session may keep or read only part of
 * its cache (StreamingLLM, SnapKV, PyramidKV, Quest). A method that evicts or compacts rows makes
 * the tokens seen (mi_session_n_past, the next RoPE position) differ from the rows kept
 * (mi_session_stats.kv_rows); such a session can rewind only the tokens still kept in order at
 * its end and cannot be saved.
 *
 * mi_model_prefill / mi_model_decode / mi_model_n_past keep working over the model's own
 * default sequence and do not touch sessions.
 *
 * On a CUDA model a session keeps its rows in host pages that the device cache mirrors: before
 * a call, only the pages the device does not already hold are uploaded (a session that runs
 * again, or a fork of the session that ran last, uploads almost nothing; switching to an
 * unrelated session uploads its rows), and after it the call's new rows are downloaded into the
 * pages. kv_dtype f32 or bf16 means bf16 pages there (exact copies of the device's values); f16
 * and fp8 round them (the rows are uploaded again after each call). A KV method's session runs
 * its first call on the device and attends on the host after that, over its f32 pages with the
 * method's selection (the cache stays in host memory; the projections and the MLP stay on the
 * device). No CacheBlend there. A session's call empties the model's own default sequence,
 * which shares the device cache; with mi_model_params.kv_offload the device holds one layer's
 * rows at a time.
 */
#ifndef MINFERENCE_SESSION_H
#define MINFERENCE_SESSION_H

#include "minference_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mi_session mi_session;

typedef struct mi_session_params {
    /* Tokens this session may hold; <= 0: the model's max_context (no limit when that is 0).
     * A call that would exceed it fails with MI_STATUS_INVALID_ARGUMENT before any work. */
    int64_t max_tokens;
    /* Bytes of pages the model's pool (shared by all its sessions) may hold; taken when the
     * pool is created, i.e. by the model's first session; 0: no limit. Running out is
     * MI_STATUS_OUT_OF_MEMORY and leaves the session unchanged. */
    uint64_t pool_bytes;
    /* The KV method: NULL, "" or "dense": the full cache; else "METHOD[:key=value,...]" with the
     * original's names (streamingllm, snapkv, pyramidkv, quest, retr_attn, kivi, leank) and keys
     * (docs/kv-methods.md). A bad name, key or value is MI_STATUS_INVALID_ARGUMENT at create, a
     * method not built MI_STATUS_UNSUPPORTED. Copied at create. */
    const char *kv;
    /* The storage of the session's pages, an mi_kv_dtype (minference_kv.h): MI_KV_F32 (0, the
     * default: the forward pass's own precision, so a session equals the model bit for bit),
     * MI_KV_F16, MI_KV_BF16 or MI_KV_FP8_E4M3 (a scale per page, head and K/V). The rows a call
     * appends are attended in f32 by that call; later calls read the stored rows in place.
     * Other dtypes get a pool of their own (not shared with the model's f32 sessions, so a fork
     * shares pages only with sessions of its own lineage). Not with kivi (its own format), quest
     * or retr_attn (they read f32 pages): MI_STATUS_INVALID_ARGUMENT / MI_STATUS_UNSUPPORTED. */
    int32_t kv_dtype;
} mi_session_params;

MI_API mi_session_params mi_session_default_params(void);

/* Checks a KV method spec without a model. MI_STATUS_SUCCESS writes the spec with every key and
 * its value (defaults filled in) to msg; INVALID_ARGUMENT / UNSUPPORTED write the reason. msg may
 * be NULL. */
MI_API mi_status mi_session_kv_check(const char *spec, char *msg, size_t msg_size);
/* The KV methods by index (0..count-1), the original's names; NULL past the end. */
MI_API int32_t mi_session_kv_method_count(void);
MI_API const char *mi_session_kv_method_name(int32_t i);

/* An empty session over model (params may be NULL: defaults). A failure's message is in
 * mi_model_last_error(model); MI_STATUS_UNSUPPORTED on a CUDA model. */
MI_API mi_status mi_session_create(mi_model *model, const mi_session_params *params,
                                   mi_session **out);
MI_API void mi_session_destroy(mi_session *s);
/* Message of the last failed call on this session ("" if none). */
MI_API const char *mi_session_last_error(const mi_session *s);

/* Appends n tokens (a prompt, a follow-up turn or decoded tokens) and writes the last position's
 * logits [vocab] (may be NULL). prefill and decode are the same operation; the names say intent. */
MI_API mi_status mi_session_prefill(mi_session *s, const int32_t *tokens, size_t n, float *logits);
MI_API mi_status mi_session_decode(mi_session *s, const int32_t *tokens, size_t n, float *logits);
/* Tokens seen: the position of the next token (equal to the rows kept for a dense session). */
MI_API int64_t mi_session_n_past(const mi_session *s);
/* Drops the last n tokens (n <= n_past; with a KV method that compacted the cache, only tokens
 * still kept in order at its end). */
MI_API mi_status mi_session_rewind(mi_session *s, int64_t n);
/* A new session with s's tokens, sharing its pages: no row is copied; either may then append,
 * rewind or be destroyed without the other seeing it. */
MI_API mi_status mi_session_fork(const mi_session *s, mi_session **out);

/* Writes the cache to path atomically, with the model's identity (architecture, shapes and a
 * hash of the weights' types, shapes and leading bytes). */
MI_API mi_status mi_session_save(const mi_session *s, const char *path);
/* Replaces s's cache with the file's. MI_STATUS_IO_ERROR (cannot read), MI_STATUS_PARSE_ERROR
 * (not a session file, truncated, corrupt), MI_STATUS_UNSUPPORTED (newer format),
 * MI_STATUS_INVALID_ARGUMENT (another model, or more tokens than max_tokens),
 * MI_STATUS_OUT_OF_MEMORY (the pool cannot hold it); s is unchanged on every error. */
MI_API mi_status mi_session_load(mi_session *s, const char *path);

typedef struct mi_session_stats {
    int64_t n_tokens;         /* tokens seen (mi_session_n_past) */
    int64_t max_tokens;       /* 0: no limit */
    uint64_t bytes;           /* this session's pages (every layer) */
    uint64_t shared_bytes;    /* of them, pages another session also holds (a fork's prefix) */
    uint64_t pool_used_bytes; /* pages in use by any session of the model */
    uint64_t pool_allocated_bytes;
    uint64_t pool_capacity_bytes; /* 0: no limit */
    int32_t pool_sessions;        /* live sessions of the model */
    int32_t page_tokens;
    int64_t kv_rows; /* rows kept per layer (the longest layer): n_tokens unless a KV method
                      * evicted or compacted rows */
    /* calls whose KV method selected and attended on the device (Quest's one-token calls on a
     * CUDA model with kv_pinned); the others of a method attend on the host */
    int64_t kv_device_calls;
} mi_session_stats;

MI_API mi_status mi_session_stats_get(const mi_session *s, mi_session_stats *out);

/* ------------------------------------------------------------------------------------------ */
/* CacheBlend: reusing the caches of text chunks at new positions                               */

/* One chunk of a blended prompt: its tokens and a session of the same model whose rows
 * cache_row..cache_row + n_tokens - 1 are those tokens' K and V, computed at those positions
 * (cache_row 0 for a chunk prefilled alone). The session is only read. */
typedef struct mi_blend_chunk {
    const int32_t *tokens;
    size_t n_tokens;
    const mi_session *cache;
    int64_t cache_row;
} mi_blend_chunk;

typedef struct mi_blend_params {
    /* Fraction of the chunks' tokens recomputed in the layers after check_layer: those whose
     * K and V deviate most from the cached ones at check_layer. Default 0.15; 1: every token
     * (a full prefill); 0: none (the cached K and V as they are, re-rotated). */
    float recompute_ratio;
    /* Layers 0..check_layer recompute every token (and select at check_layer); default 1. */
    int32_t check_layer;
} mi_blend_params;

typedef struct mi_blend_stats {
    int64_t n_tokens;       /* chunks + suffix */
    int64_t n_chunk_tokens; /* tokens that came from caches */
    int64_t n_recomputed;   /* chunk tokens recomputed past check_layer */
    double seconds;         /* the whole call */
} mi_blend_stats;

MI_API mi_blend_params mi_blend_default_params(void);

/* Fills the empty session s with the chunks one after the other (chunk i at the positions
 * after chunks 0..i-1) followed by n_suffix >= 1 new tokens (the question), and writes the
 * last position's logits [vocab] (may be NULL). The chunks' cached keys are rotated (RoPE) from
 * their cached positions to the new ones; every token is recomputed in layers 0..check_layer,
 * then only the recompute_ratio of chunk tokens with the largest K and V deviation and the
 * suffix (attention dense). params, stats may be NULL. MI_STATUS_UNSUPPORTED for a model with
 * dynamic RoPE scaling (its frequencies depend on the length). */
MI_API mi_status mi_session_prefill_blend(mi_session *s, const mi_blend_chunk *chunks,
                                          size_t n_chunks, const int32_t *suffix, size_t n_suffix,
                                          const mi_blend_params *params, float *logits,
                                          mi_blend_stats *stats);

/* ------------------------------------------------------------------------------------------ */
/* KV methods on a cache outside a session                                                     */
/*
 * The rows one layer keeps after a call, by the rule a session applies, for a cache kept
 * elsewhere (the Python transformers patch keeps transformers' own). spec as mi_session_params.kv;
 * layer of n_layers places the layer (PyramidKV's budgets). q: the call's queries after RoPE,
 * [1, n_heads, n, head_dim] (NULL allowed for StreamingLLM, which reads none; n is the call's
 * length); k: the layer's rows, the call's included, [1, n_kv_heads, len, head_dim]; both f32 on
 * the CPU, any strides with a contiguous last dimension. keep (room for n_kv_heads * len) gets,
 * per KV head h, its kept rows ascending at keep + h * *count; *count == len: the layer stays
 * whole.
 *   streamingllm: after any call, the first n_init and the last n_local rows once the layer has
 *     more than n_init + n_local (a session evicts a page later and reads the same rows);
 *   snapkv, pyramidkv: after a call of two or more queries, SnapKV's selection with the method's
 *     budgets; after a one-token call every row stays.
 * dense keeps every row. The other methods need the session's paged cache (quantized pages,
 * per-page metadata, an index, per-channel storage): MI_STATUS_UNSUPPORTED. msg (may be NULL)
 * gets the reason of a failure. */
MI_API mi_status mi_session_kv_keep_rows(const char *spec, int32_t n_layers, int32_t layer,
                                         const mi_tensor *q, const mi_tensor *k, int64_t *keep,
                                         int64_t *count, char *msg, size_t msg_size);

/* ------------------------------------------------------------------------------------------ */
/* A KV method's cache outside a model                                                          */
/*
 * The pages and method state of a session without its model, for a forward pass run elsewhere
 * (the Python transformers patch keeps Quest, RetrievalAttention, KIVI and LeanK here): the rows
 * a method keeps, the format it stores and the attention it reads are a session's own. One
 * sequence; each call appends to one layer, in any order of layers.
 */
typedef struct mi_kv_cache mi_kv_cache;

typedef struct mi_kv_cache_params {
    const char *kv; /* the method, as mi_session_params.kv (NULL or "dense": every row) */
    int32_t n_layers, n_heads, n_kv_heads, head_dim;
    int32_t n_threads;   /* threads of the attention; <= 0: every core */
    uint64_t pool_bytes; /* most bytes of pages; 0: no limit */
} mi_kv_cache_params;

MI_API mi_kv_cache_params mi_kv_cache_default_params(void);
/* msg (may be NULL) gets the reason of a failure: a bad spec or shape, a mask file LeanK cannot
 * read. */
MI_API mi_status mi_kv_cache_create(const mi_kv_cache_params *params, mi_kv_cache **out, char *msg,
                                    size_t msg_size);
MI_API void mi_kv_cache_destroy(mi_kv_cache *c);
MI_API const char *mi_kv_cache_last_error(const mi_kv_cache *c);
/* Rows layer holds (fewer than its tokens once a method evicted some); -1 for a bad layer. */
MI_API int64_t mi_kv_cache_rows(const mi_kv_cache *c, int32_t layer);
/* Tokens appended to layer so far. */
MI_API int64_t mi_kv_cache_tokens(const mi_kv_cache *c, int32_t layer);
/* Bytes of pages the cache holds (KIVI's codes, LeanK's kept channels count as stored). */
MI_API uint64_t mi_kv_cache_bytes(const mi_kv_cache *c);

/* One attention call of one layer, as a session runs it:
 *   1. k, v [1, n_kv_heads, n, head_dim] (the call's rows after RoPE) are appended;
 *   2. when out is given, q [1, n_heads, n, head_dim] (after RoPE) attends over the layer's rows
 *      by the method's rule (Quest's pages, RetrievalAttention's retrieved keys, KIVI's codes,
 *      LeanK's channels), query i seeing the rows before the call and the call's first i + 1,
 *      scaled by scale (> 0), into out [1, n_heads, n, head_dim]; out NULL: the caller attended
 *      itself (a first call under a sparse prefill pattern);
 *   3. the method's step after a call runs (SnapKV's selection and RetrievalAttention's index
 *      after calls of two or more queries, which read q; evictions, quantization).
 * Tensors are f32 on the CPU, any strides with a contiguous last dimension. On failure before
 * step 3 the layer is as it was. */
MI_API mi_status mi_kv_cache_call(mi_kv_cache *c, int32_t layer, const mi_tensor *q,
                                  const mi_tensor *k, const mi_tensor *v, float scale,
                                  mi_tensor *out);

/* ------------------------------------------------------------------------------------------ */
/* Batches: several sessions in one forward pass                                                */

/* Appends tokens[i][0..n_tokens[i]) to sessions[i] for every i < n in one forward pass, and
 * writes each session's last-position logits to row i of logits [n, vocab] (may be NULL). The
 * per-token work (embeddings, projections, MLP, LM head) runs once over every session's rows
 * stacked, so each weight matrix is read once per layer for the whole batch; attention runs per
 * session over its own cache, exactly as mi_session_prefill would (the sparse prefill of an
 * empty session included), and each session's KV method runs as in a single call. The results
 * equal n single calls up to float rounding (a decode batch of up to 16 sessions: bit for bit).
 * Sessions may hold different lengths, KV methods and kv_dtypes; they must all belong to one
 * model, each appear once (a fork is another session), and each call must fit its max_tokens.
 * All or nothing: a failure (a bad argument, MI_STATUS_OUT_OF_MEMORY from the pool or the
 * activations) changes no session, except when a KV method's compaction after the layers fails,
 * which keeps the call's tokens in every session (as for a single call). The message goes to
 * every session's mi_session_last_error and to the model's. MI_STATUS_UNSUPPORTED on a CUDA
 * model (its sessions take turns in its device cache: one call at a time). */
MI_API mi_status mi_session_prefill_batch(mi_session *const *sessions, const int32_t *const *tokens,
                                          const size_t *n_tokens, size_t n, float *logits);
/* One token per session: tokens[i] goes to sessions[i]; logits [n, vocab] (may be NULL). */
MI_API mi_status mi_session_decode_batch(mi_session *const *sessions, const int32_t *tokens,
                                         size_t n, float *logits);

#ifdef __cplusplus
}
#endif

#endif /* MINFERENCE_SESSION_H */
