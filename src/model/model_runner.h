/*
 * model_runner.h: the layout of a loaded model, shared by the loader and the forward pass.
 */
#ifndef MI_MODEL_RUNNER_H
#define MI_MODEL_RUNNER_H

#include "minference_kv.h"
#include "minference_session.h"
#include "model_internal.h"

typedef struct mim_layer {
    mim_weight wq, wk, wv, wo, wg, wu, wd;
    float *bq, *bk, *bv;         /* [n_heads*hd], [n_kv*hd]; NULL without biases */
    float *attn_norm, *ffn_norm; /* [hidden] */
} mim_layer;

struct mi_model {
    mi_model_info info;
    mi_model_params params;
    int32_t n_layers, hidden, n_heads, n_kv, hd, ffn, vocab;
    float eps;
    mim_rope rope;
    mim_weight tok_embd, output;
    float *out_norm;
    mim_layer *layers;
    mim_tokenizer *tok;
    int32_t extra_eog[8]; /* further end-of-generation ids (config.json eos lists) */
    int n_extra_eog;
    bool smollm; /* for the customary ChatML system prompt */

    /* storage */
    mim_gguf *gguf;
    mim_st_file *shards;
    int n_shards;
    void **owned; /* fp32 copies of norms, biases, rope factors */
    int n_owned, cap_owned;

    /* runtime */
    mi_context *ctx;
    mim_pool *pool;
    int32_t pattern; /* the one pattern of every head, or < 0: from the config */
    const mi_config *config;
    int32_t dense_below;
    mi_model_progress_fn progress;
    void *progress_user;
    float **k_cache, **v_cache; /* [n_layers][cache_cap * n_kv * hd], rows by position */
    int64_t cache_cap, n_past;
    float *wscratch; /* one weight matrix expanded to fp32 for sgemm */
    size_t wscratch_floats;
    int64_t sliding_window; /* keys a query sees (Mistral v0.1: 4096); 0: all */
    mi_model_timing timing;
    void *gpu; /* the CUDA copy (model_gpu.cu) or NULL */
    char last_error[MIM_ERROR_CAPACITY];
    /* sessions (model_session.c): the page pool they share, created with the first one */
    mi_kv_pool *kv_pool;
    /* kv_offload on CUDA: the model's own sequence (mi_model_prefill / decode) as a session */
    struct mi_session *own_session;
    uint64_t weights_hash; /* 0 until first needed */
    /* a session call of at least this many tokens over a cache runs the library's prefill
     * attention at an offset (model_seq_prefill.c); 0: MIM_SEQ_PREFILL_FROM */
    int64_t seq_prefill_from;
    /* "static" attention (model_static.c): per layer the kept vertical-slash sets, created at
     * the layer's first fresh prompt; static_dir (or NULL) the folder they are loaded from and
     * saved to */
    struct mi_vs_static **static_vs;
    char *static_dir;
};

/* malloc'ed memory released with the model (NULL when out of memory). */
void *mim_model_own(mi_model *m, size_t bytes);

/* The random-weights source of mi_model_create_random (model_random.c). */
mi_status mim_random_weights(mi_model *m, const mi_model_shape *shape, uint64_t seed, char *err,
                             size_t err_size);

/* Records a message on the model and returns status. */
mi_status mim_model_fail(mi_model *m, mi_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* out [n, ldo] (columns 0..w->rows) = x [n, w->cols] . W^T */
void mim_matmul(mi_model *m, const float *x, int64_t n, const mim_weight *w, float *out,
                int64_t ldo);

/* count (1..3) matrices of the same input x [n, cols] row by row over the encoded weights, in
 * one parallel region: each weight row is decoded once for all n rows (mim_dot_rows). */
void mim_matmul_rows(mi_model *m, const float *x, int64_t n, int count, const mim_weight *const *ws,
                     float *const *outs, const int64_t *ldos);
/* The fp32 scratch for one expanded weight matrix (m->wscratch), taken once: prefills of more
 * than a few rows multiply through sgemm with it (out of memory leaves it NULL: GEMV then). */
void mim_ensure_wscratch(mi_model *m);
/* dst [w->rows, w->cols] = the weight expanded to fp32, rows split over the model's threads. */
void mim_dequant_matrix(mi_model *m, const mim_weight *w, float *dst);
/* dst [count, w->cols] = rows first..first+count-1 of the weight expanded to fp32. */
void mim_dequant_rows(mi_model *m, const mim_weight *w, int64_t first, int64_t count, float *dst);

/* out [n, dim] = RMSNorm of x [n, dim] with gain w (sums in float64). */
void mim_rmsnorm(const float *x, const float *w, float *out, int64_t n, int64_t dim, float eps);

/* x [n, ld] columns 0..dim += b (nothing when b is NULL). */
void mim_add_bias(float *x, const float *b, int64_t n, int64_t dim, int64_t ld);

/* The forward pass (model_forward.c; model_gpu.cu on the GPU) of n tokens (checked here) at
 * positions n_past.. (fresh: from 0). Writes the last position's logits (may be NULL). With a
 * capture (fresh prompts only), calls its hook after each layer's RoPE and fills its
 * log-probabilities, and leaves the cache empty. */
mi_status mim_forward(mi_model *m, const int32_t *tokens, int64_t n, bool fresh, float *logits,
                      const mi_model_capture *capture);

struct kv_method;

/* mim_forward for a session (model_session.c): appends the n tokens' K and V to seq (which the
 * model's pool holds) and attends over it; pos is the RoPE position of the first token (tokens
 * seen, which differs from seq's rows once a KV method evicted or compacted rows); method (may
 * be NULL: dense) selects the rows decode reads and compacts the cache after the call
 * (src/kv/kv_method.h). On failure every layer is cut back to its length before the call,
 * except when the method's compaction after the layers fails: *kept (may be NULL) then says
 * the call's tokens stay. Layers may differ in length (PyramidKV). */
/* The KV method's steps after a session's call of n tokens, every layer (once every layer has
 * attended, so a failure inside the layers leaves no compacted layer behind): the call counted,
 * then after_prefill with the call's last q_rows queries of each layer (qkeep
 * [n_layers][q_rows][n_heads * hd]; calls of two or more tokens, where qkeep is given), then
 * after_append (eviction). */
mi_status mim_method_after_call(mi_model *m, mi_kv_seq *seq, struct kv_method *method,
                                const float *qkeep, int64_t q_rows, int64_t n);
mi_status mim_forward_seq(mi_model *m, mi_kv_seq *seq, struct kv_method *method, int64_t pos,
                          const int32_t *tokens, int64_t n, float *logits, bool *kept);

/* Dense attention of n query rows (the last n rows) over the first n_past + n rows of one
 * layer of seq, read from the pages in place (model_session.c). q, out: [n, n_heads * hd].
 * With a method that selects, each (row, head) reads only the row spans it picks. */
mi_status mim_seq_attention(mi_model *m, const mi_kv_seq *seq, struct kv_method *method,
                            int32_t layer, const float *q, int64_t n, int64_t n_past, float scale,
                            float *out);
/* The same for any owner of a sequence (a session's model, a mi_kv_cache): its shapes, sliding
 * window (0: none) and threads; a failure's reason goes to err. */
typedef struct mim_seq_shape {
    int32_t n_heads, n_kv, hd;
    int64_t window;
    mim_pool *pool;
} mim_seq_shape;
mi_status mim_seq_attend(const mim_seq_shape *sh, const mi_kv_seq *seq, struct kv_method *method,
                         int32_t layer, const float *q, int64_t n, int64_t n_past, float scale,
                         float *out, char *err, size_t err_size);

/* The layer's patterns (the model's attention mode) for n query rows at positions n_past.. over
 * the first n_past + n rows of one layer of seq, through mi_prefill_attention with the queries
 * at an offset over the layer's rows gathered out of the pages (model_seq_prefill.c). */
#define MIM_SEQ_PREFILL_FROM 32
/* The rows from which a later call runs the prefill attention at an offset (the model's
 * seq_prefill_from, else MIM_SEQ_PREFILL_FROM). */
static inline int64_t mim_seq_prefill_from(const mi_model *m) {
    return m->seq_prefill_from > 0 ? m->seq_prefill_from : MIM_SEQ_PREFILL_FROM;
}
/* The same over contiguous k, v [1, n_kv, n_past + n, hd] (the model's own cache). */
mi_status mim_prefill_at_offset(mi_model *m, int32_t layer, const float *q, int64_t n,
                                const mi_tensor *k, const mi_tensor *v, float *out);
mi_status mim_seq_prefill_attention(mi_model *m, const mi_kv_seq *seq, int32_t layer,
                                    const float *q, int64_t n, int64_t n_past, float *out);

/* out [n - 1] = log p(tokens[i + 1] | ..i) from the final residuals x [n, hidden] (CPU). */
mi_status mim_token_log_probs(mi_model *m, const float *x, const int32_t *tokens, int64_t n,
                              double *out);

/* pat [n_heads] = the patterns of one layer for a prompt of n tokens under the model's attention
 * mode and config, intersected with the model's sliding window. */
mi_status mim_layer_patterns(mi_model *m, int32_t layer, int64_t n, mi_head_pattern *pat);
/* m->pattern of "static" attention (MInference w/ static): fresh prompts run each layer's kept
 * vertical-slash sets (model_static.c), follow-up turns the config as "minference" does. */
#define MIM_PATTERN_STATIC (-2)
/* A fresh prompt's attention of layer under static attention; pat: the layer's config patterns
 * (their two sizes are the budgets, as the original's static mode reads them). */
mi_status mim_static_attention(mi_model *m, int32_t layer, const mi_head_pattern *pat,
                               const mi_tensor *q, const mi_tensor *k, const mi_tensor *v,
                               mi_tensor *out);
/* Drops the kept sets (a new attention setting, or the model's end). */
void mim_static_free(mi_model *m);

/* The KV cache capacity (tokens) to allocate for need tokens when current are allocated, under
 * params.max_context (which need may not exceed). */
mi_status mim_cache_capacity(mi_model *m, int64_t need, int64_t current, int64_t *cap);

/* Prefill parameters for a prompt of n tokens: the head's softmax scale, the model's dense
 * threshold (never a dense fallback past a sliding window, which dense would ignore). */
mi_prefill_params mim_prefill_params_for(const mi_model *m, int64_t n);

/* A session's parts, for the session operations outside model_session.c (model_blend.c);
 * mim_session_fail records msg as the session's last error and returns st. */
mi_model *mim_session_model(const mi_session *s);
mi_kv_seq *mim_session_seq(const mi_session *s);
int64_t mim_session_max_tokens(const mi_session *s);
/* true without a KV method (every row is its token); the position after the last token */
bool mim_session_dense(const mi_session *s);
void mim_session_set_n_pos(mi_session *s, int64_t n_pos);
mi_status mim_session_fail(const mi_session *s, mi_status st, const char *msg);
/* The session's KV method (NULL: dense), for the batched forward pass (model_batch.c). */
struct kv_method *mim_session_method(const mi_session *s);

/* CacheBlend's selection (model_blend.c): idx[0..k) = the indices of the k largest dev[0..n)
 * (ties: the lower index first), in ascending order; idx has room for n. Returns min(k, n). */
int64_t mim_blend_select(const double *dev, int64_t n, int64_t k, int64_t *idx);

/* Rotates n key rows k [n, n_kv * hd] (RoPE applied at positions from..) to positions to.. */
mi_status mim_rope_shift(mi_model *m, float *k, int64_t n, int64_t from, int64_t to);

#endif /* MI_MODEL_RUNNER_H */
