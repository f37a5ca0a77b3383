/*
 * minference.h: the public C11 API of libminference.
 *
 * Dynamic sparse attention for the prefill of long-context LLMs: every (batch, query head) gets a
 * sparse pattern (dense, A-shape, Tri-shape, vertical-slash, block-sparse) and a budget from a
 * per-model config; the library estimates the exact index from the actual q/k and computes only
 * the selected keys.
 *
 * Conventions
 *  - Every function returns mi_status (MI_STATUS_SUCCESS = 0) unless it is a pure query.
 *  - The library never aborts on caller input. On error, outputs are not written and the
 *    context (when one is passed) holds a message: mi_context_last_error().
 *  - Handles are opaque; destroy(NULL) is a no-op.
 *  - Thread safety: a context is used by one thread at a time; distinct contexts are independent.
 *    The library creates its own worker threads per call (n_threads in the context).
 *
 * Numerics contract
 *  - Inputs fp32, fp16 or bf16; all accumulation, softmax statistics and estimation in fp32.
 *  - Softmax scale defaults to 1/sqrt(D).
 *  - LSE output (optional) is the natural-log log-sum-exp of the scaled scores of the keys the
 *    row actually attended to: lse = m + log(sum exp(s - m)), fp32.
 *  - A query row that sees no key (possible only with an empty pattern) gets output 0 and
 *    LSE = -INFINITY; never NaN.
 *  - Causality: key j is visible to query i of the same sequence iff j <= i. Every sparse kernel
 *    applies the causal mask to every key it visits, whatever the index says.
 *
 * This header compiles as C11 and as C++; it includes no CUDA header.
 */
#ifndef MINFERENCE_H
#define MINFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "minference_export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Version                                                                                     */

#define MI_VERSION_MAJOR 0
#define MI_VERSION_MINOR 1
#define MI_VERSION_PATCH 0
#define MI_VERSION_STRING "0.1.0"

/* Runtime version, "MAJOR.MINOR.PATCH". Compare with MI_VERSION_STRING to detect a mismatch
 * between the header and the loaded library. */
MI_API const char *mi_version(void);
/* (MAJOR << 16) | (MINOR << 8) | PATCH of the loaded library. */
MI_API uint32_t mi_version_number(void);

/* ------------------------------------------------------------------------------------------ */
/* Status codes (append-only)                                                                  */

#define MI_STATUS_LIST(X)                                                                          \
    X(MI_STATUS_SUCCESS, 0, "success")                                                             \
    X(MI_STATUS_INVALID_ARGUMENT, 1, "invalid argument")                                           \
    X(MI_STATUS_SHAPE_MISMATCH, 2, "tensor shapes do not match")                                   \
    X(MI_STATUS_UNSUPPORTED, 3, "unsupported dtype, head size, device or option")                  \
    X(MI_STATUS_OUT_OF_MEMORY, 4, "out of memory")                                                 \
    X(MI_STATUS_IO_ERROR, 5, "file could not be read or written")                                  \
    X(MI_STATUS_PARSE_ERROR, 6, "malformed input file")                                            \
    X(MI_STATUS_NOT_BUILT, 7, "feature not compiled into this build")                              \
    X(MI_STATUS_DEVICE_ERROR, 8, "device (CUDA) error")                                            \
    X(MI_STATUS_WORKSPACE_TOO_SMALL, 9, "workspace too small")                                     \
    X(MI_STATUS_INTERNAL, 10, "internal error")

typedef enum mi_status {
#define MI_STATUS_ENUM_(name, value, text) name = value,
    MI_STATUS_LIST(MI_STATUS_ENUM_)
#undef MI_STATUS_ENUM_
} mi_status;

/* A static string for any status value ("unknown status" for values outside the table). */
MI_API const char *mi_status_string(mi_status status);
/* The enumerator's name, e.g. "MI_STATUS_UNSUPPORTED". */
MI_API const char *mi_status_name(mi_status status);

/* ------------------------------------------------------------------------------------------ */
/* Context                                                                                     */

typedef enum mi_device_type {
    MI_DEVICE_CPU = 0,
    MI_DEVICE_CUDA = 1,
} mi_device_type;

typedef struct mi_context_params {
    mi_device_type device; /* where the data lives and the kernels run */
    int device_id;         /* CUDA device ordinal (ignored on the CPU) */
    int n_threads;         /* CPU worker threads; <= 0 means all online cores; at most
                              MI_MAX_THREADS (more: MI_STATUS_INVALID_ARGUMENT) */
} mi_context_params;

/* The most CPU worker threads a context or a model takes, everywhere (library, CLI, Python). */
#define MI_MAX_THREADS 1024

typedef struct mi_context mi_context;

MI_API mi_context_params mi_context_default_params(void);
/* Creates a context. MI_STATUS_NOT_BUILT for MI_DEVICE_CUDA in a build without CUDA. */
MI_API mi_status mi_context_create(const mi_context_params *params, mi_context **out);
MI_API void mi_context_destroy(mi_context *ctx);
/* The message of the last failed call on this context ("" if none). Valid until the next call. */
MI_API const char *mi_context_last_error(const mi_context *ctx);
/* Records message as the context's last error and returns status, for libraries built on this
 * one (the model runner reports its constructors' failures this way). ctx NULL: no-op. */
MI_API mi_status mi_context_set_error(mi_context *ctx, mi_status status, const char *message);
/* The effective number of CPU threads. */
MI_API int mi_context_n_threads(const mi_context *ctx);
MI_API mi_device_type mi_context_device(const mi_context *ctx);

/*
 * Tuning: which of several equivalent kernels or launch shapes a backend takes. Every field's 0
 * (mi_tuning_default) is "auto": the backend's own heuristics, the choice for speed. Other values
 * force one path, for tests that reach every path on any input and for A/B benchmarks; the
 * results agree up to the rounding each kernel's tests allow. Switches are -1 (off), 0 (auto) or
 * 1 (on); where a field says "-1 only", its path is on by default and 1 means the same as 0.
 * The library never reads tuning from the environment. In the text form of mi_tuning_parse a
 * field is named as in this struct (e.g. "sm90_sparse=1,bs_split=-1"); fields a build or device
 * does not have are accepted and ignored (the CUDA ones on a CPU context).
 */
typedef struct mi_tuning {
    /* CPU: 1 runs the build target's engine (AVX2) even where AVX-512 is there. */
    int32_t cpu_engine;

    /* CUDA, which attention kernels. -1 only: the sm_80 (mma.sync) kernels on Hopper too. */
    int32_t sm90;
    /* -1 only: dense launches on the ring kernel, not the warp-specialised dense kernel. */
    int32_t sm90_dense;
    /* 1: every sparse head to the warp-specialised sparse kernel, -1: none (auto: the band-like
     * heads). */
    int32_t sm90_sparse;
    /* -1 only: A-/Tri-shape heads on the ring kernel. */
    int32_t sm90_a_shape;
    /* -1 only: the sparse kernel gathers every vertical-slash column list, never reads copies. */
    int32_t sm90_column_copies;
    /* N > 0: the sparse kernel's planner takes items of at most N tiles (above 448 counts as
     * 448), longer ones merge inline. */
    int32_t sm90_plan_tiles;
    /* -1 only: the sparse kernel's output rows stored by each thread, not staged in shared
     * memory and stored by TMA. */
    int32_t sm90_tma_store;
    /* N > 0: Tri-shape last rows split over chunks of keys from N keys on (auto: 8192 with
     * Hopper's chunk kernel, 16384 on the sm_80 one); -1: never split. */
    int32_t tri_split;

    /* CUDA, vertical-slash estimate and index. -1 only: the score passes by mma.sync on Hopper
     * too. */
    int32_t vs_wgmma;
    /* -1 only: the wgmma score passes load their key tiles by 16-byte copies, not TMA. */
    int32_t vs_score_tma;
    /* -1 only: the index build stores each kept column from its thread, not as bits for a
     * warp-wide write. */
    int32_t vs_index_mask;
    /* -1 only: the index build walks every vertical and diagonal a step at a time (no search
     * for the kept prefix of the verticals, no runs of diagonals at once). */
    int32_t vs_index_shortcuts;

    /* CUDA, block-sparse estimate. 1 / -1: through scores in memory at any length, or never
     * (auto: from 128K keys, where they fit). */
    int32_t bs_scores;
    /* -1 only: the scores by mma.sync on Hopper too. */
    int32_t bs_wgmma;
    /* -1 only: the wgmma score kernel loads its tiles by 16-byte copies, not TMA. */
    int32_t bs_score_tma;
    /* N > 0: the select's bound search stops once at most k + N values reach it on rows of
     * 1024 summaries (auto: 32); -1: the exact bound. */
    int32_t bs_bound_slack;
    /* -1 only: every head to the row-holding kernel, none to the streaming kernel. */
    int32_t bs_stream;
    /* N > 0: at most N row blocks per CTA of the row-holding kernel. */
    int32_t bs_rows;
    /* 1 / -1: the row-holding kernel's CTAs of 512 or of 256 threads. */
    int32_t bs_wide;
    /* G in 1, 2, 4, 8, 16, 32: the streaming kernel's bounds take G groups a tile; -1: no
     * bounds. */
    int32_t bs_bound;
    /* 128 or 256: the streaming kernel's candidate slots a row. */
    int32_t bs_cap;
    /* N > 0: long row groups split into chunks of at least N tiles; -1: never split. */
    int32_t bs_split;
    /* -1 only: plain tiles appended an n-tile at a time, never at once. */
    int32_t bs_mask_append;
    /* -1 only: pooling a value a thread, not by 16-byte loads. */
    int32_t bs_pool_vec;

    /* CUDA, dilated and strided heads. 1: in two passes where that walks fewer key tiles
     * (the sinks and dense windows over consecutive rows, then the dilated keys over rows a
     * stride apart, merged by log-sum-exp through the output); auto / -1: one pass. */
    int32_t rowmask_two_pass;
} mi_tuning;

/* Every field 0: each backend's own choices. */
MI_API mi_tuning mi_tuning_default(void);
/* Applies a comma-separated list of name=value (value an integer, or auto, on, off for 0, 1, -1;
 * cpu_engine=base for 1) to *tuning, field by field; "" changes nothing. An unknown name or a
 * value out of the field's range gives MI_STATUS_INVALID_ARGUMENT (a message on ctx, which may
 * be NULL) and leaves *tuning as it was. */
MI_API mi_status mi_tuning_parse(mi_context *ctx, const char *spec, mi_tuning *tuning);
/* Writes the fields that differ from the default as name=value,... ("" when none), as much as
 * fits in size bytes (NUL-terminated); returns the length of the whole text, as snprintf does. */
MI_API int mi_tuning_format(const mi_tuning *tuning, char *buf, size_t size);
/* The tuning of the calls that follow on ctx (checked as mi_tuning_parse checks values; on a bad
 * value MI_STATUS_INVALID_ARGUMENT and ctx keeps its tuning). */
MI_API mi_status mi_context_set_tuning(mi_context *ctx, const mi_tuning *tuning);
MI_API mi_status mi_context_get_tuning(const mi_context *ctx, mi_tuning *tuning);
/* mi_tuning_parse applied to ctx's tuning (for bindings that do not declare the struct). */
MI_API mi_status mi_context_parse_tuning(mi_context *ctx, const char *spec);
/* mi_tuning_format of ctx's tuning (the same, for bindings); -1 for a NULL ctx. */
MI_API int mi_context_format_tuning(const mi_context *ctx, char *buf, size_t size);

/* Build features, for `minference info`: a static string such as "cpu openblas cuda(sm_90a,sm_80)". */
MI_API const char *mi_build_features(void);
/* The source commit the library was built from: git's short hash, "-dirty" appended where tracked
 * files differed from it, or "unknown" where it was built outside a git checkout. Benchmarks
 * record it with their results. */
MI_API const char *mi_build_commit(void);
/* Number of usable CUDA devices (0 in a CPU-only build or without a GPU). */
MI_API int mi_cuda_device_count(void);

/* ------------------------------------------------------------------------------------------ */
/* Tensors: described, never owned                                                             */

typedef enum mi_dtype {
    MI_DTYPE_F32 = 0,
    MI_DTYPE_F16 = 1,
    MI_DTYPE_BF16 = 2,
} mi_dtype;

/* Size in bytes of one element; 0 for an unknown dtype. */
MI_API size_t mi_dtype_size(mi_dtype dtype);
MI_API const char *mi_dtype_name(mi_dtype dtype);

/*
 * An attention operand: logical dims always [B, H, L, D] (batch, heads, sequence, head_dim).
 * stride[] is in elements for each logical dim; stride[3] must be 1 (D contiguous).
 * [B, H, L, D] storage: stride = {H*L*D, L*D, D, 1}; [B, L, H, D] storage: {L*H*D, D, H*D, 1}.
 * GQA: k and v have H_kv heads with H_q % H_kv == 0; query head h reads KV head h / (H_q/H_kv).
 */
typedef struct mi_tensor {
    void *data;
    mi_dtype dtype;
    mi_device_type device;
    int64_t shape[4];  /* B, H, L, D */
    int64_t stride[4]; /* in elements */
} mi_tensor;

/* Descriptor of a contiguous [B, H, L, D] buffer. */
MI_API mi_tensor mi_tensor_bhld(void *data, mi_dtype dtype, mi_device_type device, int64_t B,
                                int64_t H, int64_t L, int64_t D);
/* Descriptor of a contiguous [B, L, H, D] buffer (logical dims still B, H, L, D). */
MI_API mi_tensor mi_tensor_blhd(void *data, mi_dtype dtype, mi_device_type device, int64_t B,
                                int64_t H, int64_t L, int64_t D);

/* fp16 / bf16 conversion helpers (round to nearest even). */
MI_API uint16_t mi_f32_to_f16(float x);
MI_API float mi_f16_to_f32(uint16_t h);
MI_API uint16_t mi_f32_to_bf16(float x);
MI_API float mi_bf16_to_f32(uint16_t h);

/* ------------------------------------------------------------------------------------------ */
/* Per-head sparse patterns                                                                    */

typedef enum mi_pattern_type {
    MI_PATTERN_DENSE = 0,          /* causal flash attention */
    MI_PATTERN_A_SHAPE = 1,        /* "stream_llm": n_init sinks + n_local window */
    MI_PATTERN_TRI_SHAPE = 2,      /* A-shape + the last n_last query rows dense */
    MI_PATTERN_VERTICAL_SLASH = 3, /* "vertical_and_slash" */
    MI_PATTERN_BLOCK_SPARSE = 4,   /* "block_sparse": top_k 64x64 blocks per row block */
    MI_PATTERN_DILATED = 5,        /* "dilated": sinks + every stride-th key of a local span */
    MI_PATTERN_STRIDED = 6,        /* "strided": the last stride keys + every stride-th key */
    MI_PATTERN_XATTENTION = 7,     /* "xattention": antidiagonal block scores, threshold */
    MI_PATTERN_FLEXPREFILL = 8,    /* "flexprefill": query-aware or vertical-slash blocks */
    MI_PATTERN_INFLLM = 9,         /* "inf_llm": sinks + local window + top_k retrieved blocks */
} mi_pattern_type;

/* The patterns are numbered 0 .. mi_pattern_count() - 1; names, aliases and fields come from
 * the library's table, so a binding or tool lists them instead of keeping a copy. */
MI_API int32_t mi_pattern_count(void);
/* The config-file name of a pattern ("vertical_and_slash", "stream_llm", "block_sparse",
 * "dense", "tri_shape"), NULL for an unknown value. */
MI_API const char *mi_pattern_name(mi_pattern_type type);
/* The i-th other name a pattern is read under (e.g. "a_shape" and "A-shape" for "stream_llm",
 * "vertical_slash" and "vs" for "vertical_and_slash"); NULL past the last or for an unknown
 * type. Alias 0, where there is one, is the short name the CLI prints. */
MI_API const char *mi_pattern_alias(mi_pattern_type type, int32_t i);
/* Parses a config-file name or an alias. */
MI_API mi_status mi_pattern_from_name(const char *name, mi_pattern_type *out);
/* The i-th mi_head_pattern field a pattern reads ("n_init", "top_k", ...); NULL past the last
 * (a dense pattern reads none). */
MI_API const char *mi_pattern_field(mi_pattern_type type, int32_t i);

typedef struct mi_head_pattern {
    mi_pattern_type type;
    int32_t vertical_size; /* VS: key columns kept */
    int32_t slash_size;    /* VS: diagonals kept */
    int32_t n_init;        /* A-/Tri-shape: sink keys */
    int32_t n_local;       /* A-/Tri-shape: local window, including the diagonal */
    int32_t n_last;        /* Tri-shape: dense query rows at the end (clamped to L-1) */
    int32_t top_k;         /* block-sparse: 64-key blocks per 64-query block */
    int32_t stride;        /* XAttention: antidiagonal stride; dilated: the dilation; strided:
                              the period */
    int32_t threshold;     /* XAttention: block-mass threshold; FlexPrefill: gamma (per mille) */
    int32_t tau;           /* FlexPrefill: sqrt-JS-divergence threshold (per mille) */
    int32_t dense_local;   /* dilated: the local keys kept densely before the dilated span */
    int32_t block_size;    /* InfLLM: tokens per memory block (top_k counts these blocks) */
    int32_t repr_topk;     /* InfLLM: representative keys per block */
    int32_t chunk_size;    /* InfLLM: query rows per retrieval (one selection per chunk) */
    int32_t per_head;      /* InfLLM: 1: each head selects its blocks; 0: the heads of a call
                              with equal InfLLM fields share one selection */
} mi_head_pattern;

/* Defaults of the original: VS (1000, 6096); A-shape (128, 3968); Tri-shape n_last 100;
 * block-sparse top_k 100; dilated as its dilated1 (1024 sinks, 8192-key span, dilation 2);
 * XAttention stride 8, threshold 900; FlexPrefill gamma 900, tau 100; strided period 128;
 * InfLLM top_k 16, n_local 4096, n_init 128, block_size 128, repr_topk 4, chunk_size 512,
 * per_head 0 (docs/prefill-methods.md says where each comes from). */
MI_API mi_head_pattern mi_head_pattern_default(mi_pattern_type type);
/* A config entry [name, size1, size2] as a head pattern: what the two sizes carry is the
 * pattern's (VS: vertical_size, slash_size; stream_llm and tri_shape: n_init, n_local;
 * block_sparse: top_k, where 0 keeps the default); the other fields take their defaults.
 * MI_STATUS_INVALID_ARGUMENT for an unknown type or a negative size. */
MI_API mi_status mi_head_pattern_from_sizes(mi_pattern_type type, int32_t size1, int32_t size2,
                                            mi_head_pattern *out);
/* The two sizes a config file holds for p (the inverse of the above). */
MI_API mi_status mi_head_pattern_sizes(const mi_head_pattern *p, int32_t *size1, int32_t *size2);
/* A pattern from "NAME[:V1[:V2...]]": a pattern name or alias, then values for its fields in
 * mi_pattern_field order ("a_shape:100:800", "tri_shape:128:3968:100", "vs:1000:6096",
 * "block_sparse:8", "dense"); the fields a config file holds are required, the others (n_last)
 * keep their defaults when left out. MI_STATUS_INVALID_ARGUMENT for an unknown name, or a
 * missing, extra, negative or non-integer value. */
MI_API mi_status mi_head_pattern_parse(const char *text, mi_head_pattern *out);

/* Vertical-slash estimation parameters (docs/algorithms.md §1). */
typedef struct mi_vs_params {
    int32_t last_q;           /* query rows used for the estimate (64) */
    int32_t forced_columns;   /* first key columns always kept (30) */
    int32_t forced_diagonals; /* diagonals d = 0..n-1 always kept (100) */
    int32_t min_vertical;     /* minimum vertical budget (30) */
    int32_t min_slash;        /* minimum slash budget (50) */
} mi_vs_params;

MI_API mi_vs_params mi_vs_default_params(void);

/* Whole-layer prefill parameters. */
typedef struct mi_prefill_params {
    float softmax_scale; /* <= 0: 1/sqrt(D) */
    mi_vs_params vs;     /* vertical-slash estimation */
    int32_t dense_below; /* sequences shorter than this run dense, every head; < 0: the
                               backend's measured crossovers, one per head by its pattern and
                               budget (on CUDA also by the heads that share its estimate; see
                               docs/architecture.md), 0: never fall back */
} mi_prefill_params;

MI_API mi_prefill_params mi_prefill_default_params(void);

/* ------------------------------------------------------------------------------------------ */
/* Sparse indices (caller-owned memory, int32, in the tensors' device memory)                  */

#define MI_BLOCK_SIZE 64 /* rows and keys per block for every sparse kernel */

/*
 * Estimated vertical-slash sets per (b, h).
 *   vertical_count [B, H]                number of valid entries
 *   vertical_idx   [B, H, max_vertical]  key columns, ascending
 *   slash_count    [B, H]
 *   slash_idx      [B, H, max_slash]     diagonal distances d = i - j >= 0, descending
 */
typedef struct mi_vs_index {
    int32_t batch, heads, max_vertical, max_slash;
    int32_t *vertical_count;
    int32_t *vertical_idx;
    int32_t *slash_count;
    int32_t *slash_idx;
} mi_vs_index;

/*
 * A compiled block index (docs/algorithms.md §2), consumed by mi_attention_sparse.
 * R = ceil(L / 64) row blocks.
 *   block_count  [B, H, R]               64-wide key ranges for row block m
 *   block_offset [B, H, R, max_blocks]   start key of each range (any key, not only multiples of 64)
 *   column_count [B, H, R]               extra single key columns
 *   column_index [B, H, R, max_columns]  those keys, ascending
 * Block-sparse indices use the same form with offsets = 64 * block and column_count = 0.
 */
typedef struct mi_sparse_index {
    int32_t batch, heads, row_blocks, max_blocks, max_columns;
    int32_t *block_count;
    int32_t *block_offset;
    int32_t *column_count;
    int32_t *column_index;
} mi_sparse_index;

/* Bytes for a vs index / sparse index of the given capacities (one buffer, int32 aligned). */
MI_API size_t mi_vs_index_bytes(int32_t batch, int32_t heads, int32_t max_vertical,
                                int32_t max_slash);
MI_API size_t mi_sparse_index_bytes(int32_t batch, int32_t heads, int32_t row_blocks,
                                    int32_t max_blocks, int32_t max_columns);
/* Lay an index out over caller memory of at least the size above. */
MI_API mi_status mi_vs_index_init(mi_vs_index *index, int32_t batch, int32_t heads,
                                  int32_t max_vertical, int32_t max_slash, void *buffer,
                                  size_t buffer_bytes);
MI_API mi_status mi_sparse_index_init(mi_sparse_index *index, int32_t batch, int32_t heads,
                                      int32_t row_blocks, int32_t max_blocks, int32_t max_columns,
                                      void *buffer, size_t buffer_bytes);

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                     */
/*
 * Shared arguments:
 *   q        [B, H_q, L, D]
 *   k, v     [B, H_kv, L, D]     H_q % H_kv == 0 (GQA broadcast, never copied)
 *   out      [B, H_q, L, D]      same dtype as q; may not alias q/k/v
 *   lse      [B, H_q, L] fp32, contiguous, optional (NULL)
 *   seq_lens [B] int32, optional (NULL: every sequence has length L). Sequence b uses rows and
 *            keys 0..seq_lens[b]-1; rows at or after seq_lens[b] are written as 0 (LSE -inf).
 *            On CUDA, seq_lens lives in host memory.
 *   scale    <= 0 means 1/sqrt(D).
 * D must be 1..256 on the CPU; 64 or 128 on CUDA (else MI_STATUS_UNSUPPORTED).
 */

/* Dense causal attention, flash-style (tiled, online softmax). */
MI_API mi_status mi_attention_dense(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                    const mi_tensor *v, const int32_t *seq_lens, float scale,
                                    mi_tensor *out, float *lse);

/* A-shape: keys {j <= i : i - j < n_local} ∪ {j < n_init}. With n_last > 0 (Tri-shape), the last
 * min(n_last, len-1) rows of each sequence attend densely to all their causal keys. */
MI_API mi_status mi_attention_a_shape(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                      const mi_tensor *v, const int32_t *seq_lens, int32_t n_init,
                                      int32_t n_local, int32_t n_last, float scale, mi_tensor *out,
                                      float *lse);

/* Vertical-slash estimation (docs/algorithms.md §1) for all (b, h): the last last_q queries against
 * all keys, causal corner mask, fp32 softmax, column and diagonal sums, forced entries, top-k.
 * vertical_size / slash_size: [H_q] budgets per head (after the minimum budgets and clamping to
 * the sequence length). index capacities must be >= the largest clamped budget. */
MI_API mi_status mi_vs_estimate(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                const int32_t *seq_lens, const int32_t *vertical_size,
                                const int32_t *slash_size, const mi_vs_params *params, float scale,
                                mi_vs_index *index);

/* Index conversion (docs/algorithms.md §2) from vertical / slash sets to a block index, for
 * sequences of padded length L. Inputs may be in any order and may hold duplicates or out-of-range
 * entries (ignored). The result is causal-safe for any input: gathered columns are always < the row
 * block start, and the kernel masks every key causally. index->max_blocks must be >=
 * max_slash + 1 and index->max_columns >= max_vertical. */
MI_API mi_status mi_vs_build_index(mi_context *ctx, int64_t L, const int32_t *seq_lens,
                                   const mi_vs_index *vs, mi_sparse_index *index);

/* Block-sparse estimation (docs/algorithms.md §4): 64-row mean pooling of q and k (partial blocks
 * pooled over their real rows, rounded to the input dtype), block-causal top-k per row block; the
 * diagonal block and block 0 are always kept. For bf16 / fp16 inputs the pooled scores rank at bf16
 * precision (the upper 16 bits of each fp32 score), blocks whose scores are equal there by
 * position, lower block first; fp32 inputs rank at fp32. top_k: [H_q] blocks per row block
 * (clamped to the causal blocks). Writes offsets ascending, column_count = 0.
 * index->max_blocks >= max top_k. */
MI_API mi_status mi_block_sparse_estimate(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                          const int32_t *seq_lens, const int32_t *top_k,
                                          mi_sparse_index *index);

/* Sparse attention over a block index: phase 1 the 64-wide key ranges, phase 2 the gathered
 * columns, one online softmax, causal mask everywhere. */
MI_API mi_status mi_attention_sparse(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                     const mi_tensor *v, const int32_t *seq_lens,
                                     const mi_sparse_index *index, float scale, mi_tensor *out,
                                     float *lse);

/* A whole layer: every query head with its own pattern (patterns [H_q]), estimation, index and
 * kernel, batch > 1 with a length per sequence. workspace may be NULL (the library allocates);
 * otherwise it must hold mi_prefill_workspace_size() bytes in the device's memory.
 * Queries at an offset (a later chunk or turn over a cache): q [B, H_q, q_len, D] may be the last
 * q_len <= k_len positions of k / v [B, H_kv, k_len, D] (query i at position k_len - q_len + i;
 * out and lse have q_len rows). Every pattern works by absolute position: A-/Tri-shape windows
 * and Tri-shape's last rows are the whole sequence's; vertical-slash is estimated from the
 * chunk's own last queries against all keys; block-sparse rows are 64-row blocks aligned to
 * absolute positions (a partial first block is pooled over the chunk's rows); the dense fallback
 * looks at k_len. Without seq_lens (MI_STATUS_UNSUPPORTED). On CUDA the attention at an offset
 * runs on the portable kernel, not the Hopper ones. */
MI_API mi_status mi_prefill_workspace_size(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                           const mi_head_pattern *patterns,
                                           const mi_prefill_params *params, size_t *bytes);
MI_API mi_status mi_prefill_attention(mi_context *ctx, const mi_tensor *q, const mi_tensor *k,
                                      const mi_tensor *v, const int32_t *seq_lens,
                                      const mi_head_pattern *patterns,
                                      const mi_prefill_params *params, mi_tensor *out, float *lse,
                                      void *workspace, size_t workspace_size);

/* ------------------------------------------------------------------------------------------ */
/* Pattern configs: the original's JSON                                                        */
/*
 * [ { "<head>": [pattern, vertical_size, slash_size, score], ... },   <- layer 0
 *   ... ]
 * pattern is "vertical_and_slash", "stream_llm" (n_init = vertical_size, n_local = slash_size) or
 * "block_sparse" (top_k = vertical_size: the original ignores the sizes of such heads and never
 * writes them); this library also reads and writes "dense" and "tri_shape" (n_init, n_local as
 * for stream_llm; n_last is not stored and reads back as 100).
 * Missing layers or heads get the config's default pattern (VS 1000/6096 unless set).
 */
typedef struct mi_config mi_config;

/* ctx may be NULL (then only the status tells what went wrong). */
MI_API mi_status mi_config_load(mi_context *ctx, const char *path, mi_config **out);
MI_API mi_status mi_config_parse(mi_context *ctx, const char *json, size_t length, mi_config **out);
/* An empty config (every head gets default_pattern, or VS 1000/6096 when NULL). */
MI_API mi_status mi_config_create(mi_context *ctx, int32_t n_layers, int32_t n_heads,
                                  const mi_head_pattern *default_pattern, mi_config **out);
MI_API void mi_config_destroy(mi_config *config);

MI_API int32_t mi_config_n_layers(const mi_config *config);
/* The largest head id + 1 seen in any layer (or set by create). */
MI_API int32_t mi_config_n_heads(const mi_config *config);
/* MI_STATUS_SHAPE_MISMATCH with a message when the config has more layers than n_layers or a
 * head id >= n_heads. Fewer layers or heads are valid (defaults fill them). */
MI_API mi_status mi_config_check(mi_context *ctx, const mi_config *config, int32_t n_layers,
                                 int32_t n_heads);
/* Patterns of one layer's heads, defaults filled in. patterns [n_heads]; scores optional [n_heads]
 * (NaN where absent). */
MI_API mi_status mi_config_layer(mi_context *ctx, const mi_config *config, int32_t layer,
                                 int32_t n_heads, mi_head_pattern *patterns, double *scores);
/* Sets one head (score NaN: none). A layer at or past the end grows the config; the layers in
 * between get the default pattern. */
MI_API mi_status mi_config_set_head(mi_context *ctx, mi_config *config, int32_t layer, int32_t head,
                                    const mi_head_pattern *pattern, double score);
/* Serialise: *out is malloc'ed, NUL-terminated; release with mi_free. */
MI_API mi_status mi_config_to_json(mi_context *ctx, const mi_config *config, char **out);
MI_API mi_status mi_config_save(mi_context *ctx, const mi_config *config, const char *path);
/* Frees memory the library returned to the caller. */
MI_API void mi_free(void *ptr);

/* The original's per-model configs, shipped with the library (data/configs, installed under
 * <datadir>/minference/configs; data/configs/README.md lists them). Models are named by their
 * Hugging Face ids, in the original's order: mi_config_model_name(0 .. count - 1). */
MI_API int32_t mi_config_model_count(void);
MI_API const char *mi_config_model_name(int32_t i);
/* The config file name for model: a model id (case-insensitive), else the id whose name (the
 * part after "owner/") a path or file name holds, the longest such name ('-', '_' and ' ' read
 * alike, so ".../Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf" finds the LLaMA-3.1-8B config). NULL
 * when none. */
MI_API const char *mi_config_model_file(const char *model);
/* The shipped file's full path for model (installed copy first, then the source tree the
 * library was built from): malloc'ed (release with mi_free), NULL when none is found. */
MI_API char *mi_config_model_path(const char *model);

/* ------------------------------------------------------------------------------------------ */
/* MInference w/ static: vertical-slash sets estimated once, reused                            */
/*
 * One object per layer: the first mi_vs_static_attention call (or mi_vs_static_load) fixes
 * each query head's vertical-slash sets (mi_vs_estimate on that input); every later call only
 * converts them into an index for its own length (mi_vs_build_index: slash entries are
 * distances, columns past the length are skipped) and runs mi_attention_sparse. Heads and
 * budgets are fixed at creation; an input of any batch size uses the sets of the first input's
 * sequence 0 for every sequence. CPU only (the sets live in host memory; a CUDA context gets
 * MI_STATUS_UNSUPPORTED). Not thread-safe: one call at a time per object.
 */
typedef struct mi_vs_static mi_vs_static;

/* heads query heads, budgets vertical_size / slash_size [heads] (clamped as mi_vs_estimate
 * clamps them, to the first input's length). params NULL: the original's static estimate
 * (mi_vs_default_params with 30 forced diagonals). */
MI_API mi_status mi_vs_static_create(mi_context *ctx, int32_t heads, const int32_t *vertical_size,
                                     const int32_t *slash_size, const mi_vs_params *params,
                                     mi_vs_static **out);
MI_API void mi_vs_static_destroy(mi_vs_static *st);
/* Forgets the sets: the next call estimates again. */
MI_API void mi_vs_static_reset(mi_vs_static *st);
/* Times the sets were estimated (0 before the first call, then 1 until a reset). */
MI_API int32_t mi_vs_static_estimates(const mi_vs_static *st);
/* q, k, v, out as for mi_attention_sparse (no seq_lens: every sequence has length L), q with
 * the object's number of heads. */
MI_API mi_status mi_vs_static_attention(mi_context *ctx, mi_vs_static *st, const mi_tensor *q,
                                        const mi_tensor *k, const mi_tensor *v, float scale,
                                        mi_tensor *out, float *lse);
/* A read-only view of the sets (batch 1, the object's heads); MI_STATUS_INVALID_ARGUMENT before
 * they exist. Valid until the next call that changes them. */
MI_API mi_status mi_vs_static_sets(const mi_vs_static *st, mi_vs_index *view);
/* The sets to a file and back (a small binary format: magic, heads, capacities, then the
 * index's arrays); load replaces the sets (its heads must match) and counts as no estimate. */
MI_API mi_status mi_vs_static_save(mi_context *ctx, const mi_vs_static *st, const char *path);
MI_API mi_status mi_vs_static_load(mi_context *ctx, mi_vs_static *st, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* MINFERENCE_H */
