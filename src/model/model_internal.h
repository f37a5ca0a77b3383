/*
 * model_internal.h: what the pieces of the model runner share (file formats, quantized weight
 * rows, the tokenizer, the thread pool). Callers see only include/minference_model.h.
 */
#ifndef MI_MODEL_INTERNAL_H
#define MI_MODEL_INTERNAL_H

#include "minference.h"
#include "minference_model.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

#define MIM_ERROR_CAPACITY 512

/* Formats into buf (may be NULL) and returns status, so a failure is one line. */
mi_status mim_fail(char *buf, size_t cap, mi_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Tensor data regions of one file: two tensors whose bytes overlap mean a corrupt or crafted
 * file (a write into one would change the other, and the formats forbid it). Sorts r by start;
 * MI_STATUS_PARSE_ERROR naming both tensors when any two non-empty regions overlap. */
typedef struct mim_region {
    const unsigned char *begin;
    uint64_t nbytes;
    const char *name;
    int name_len;
} mim_region;

mi_status mim_check_regions(mim_region *r, size_t n, const char *format, char *err, size_t cap);

/* ------------------------------------------------------------------------------------------ */
/* Unicode                                                                                     */

typedef struct mi_unicode_range {
    uint32_t lo, hi;
} mi_unicode_range;

extern const mi_unicode_range mi_unicode_letters[];
extern const size_t mi_unicode_letters_count;
extern const mi_unicode_range mi_unicode_numbers[];
extern const size_t mi_unicode_numbers_count;

bool mim_uc_is_letter(uint32_t cp);
bool mim_uc_is_number(uint32_t cp);
/* The White_Space property, which is what \s means in the tokenizers' regex engines. */
bool mim_uc_is_space(uint32_t cp);
/* Decodes one code point from s[0..n); invalid or truncated sequences decode as one byte
 * (returned as 0xFFFD) so that every input byte is consumed exactly once. Returns bytes used. */
size_t mim_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Writes 1..4 bytes; returns the count. */
size_t mim_utf8_encode(uint32_t cp, char out[4]);

/* ------------------------------------------------------------------------------------------ */
/* Tensor element types (GGML numbering, which GGUF files store)                              */

enum {
    MIM_TYPE_F32 = 0,
    MIM_TYPE_F16 = 1,
    MIM_TYPE_Q4_0 = 2,
    MIM_TYPE_Q4_1 = 3,
    MIM_TYPE_Q5_0 = 6,
    MIM_TYPE_Q5_1 = 7,
    MIM_TYPE_Q8_0 = 8,
    MIM_TYPE_Q4_K = 12,
    MIM_TYPE_Q5_K = 13,
    MIM_TYPE_Q6_K = 14,
    MIM_TYPE_BF16 = 30,
};

#define MIM_QK 32 /* elements per block of the Q4_0 / Q4_1 / Q8_0 formats */

/* Name of any GGML type id, including the ones this runner cannot read ("Q6_K"), or "unknown". */
const char *mim_type_name(uint32_t type);
bool mim_type_supported(uint32_t type);
/* Elements per block (1 for F32/F16/BF16, 32, or 256 for the K-quants); 0 if unsupported. */
uint64_t mim_type_block(uint32_t type);
/* Bytes of a row of n elements; false if n is not a multiple of the block or the type is not
 * supported. */
bool mim_type_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes);
/* Expands one row of n elements (n a multiple of the block size) to fp32. */
void mim_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);
/* dot(row, x) for one row of n elements without expanding it to memory. */
float mim_dot_row(uint32_t type, const void *row, const float *x, int64_t n);
/* out[i] = mim_dot_row(type, row, x + i * ldx, n) for i < n_x, bit for bit, reading the row
 * once for all of them (a batch of decode rows: the quantized blocks are unpacked once). */
void mim_dot_rows(uint32_t type, const void *row, const float *x, int64_t ldx, int64_t n_x,
                  int64_t n, float *out);

/* A 2-D weight in its file encoding: rows x cols, rows contiguous, row_bytes apart. */
typedef struct mim_weight {
    const void *data;
    uint32_t type;
    int64_t rows, cols;
    size_t row_bytes;
} mim_weight;

/* ------------------------------------------------------------------------------------------ */
/* GGUF                                                                                        */

enum {
    MIM_GGUF_U8 = 0,
    MIM_GGUF_I8 = 1,
    MIM_GGUF_U16 = 2,
    MIM_GGUF_I16 = 3,
    MIM_GGUF_U32 = 4,
    MIM_GGUF_I32 = 5,
    MIM_GGUF_F32 = 6,
    MIM_GGUF_BOOL = 7,
    MIM_GGUF_STRING = 8,
    MIM_GGUF_ARRAY = 9,
    MIM_GGUF_U64 = 10,
    MIM_GGUF_I64 = 11,
    MIM_GGUF_F64 = 12,
};

typedef struct mim_gguf_kv {
    const char *key; /* not NUL-terminated: key_len bytes */
    size_t key_len;
    uint32_t type;
    const unsigned char *value; /* scalar value, string (u64 length + bytes) or array payload */
    uint32_t array_type;        /* for arrays */
    uint64_t array_count;
} mim_gguf_kv;

typedef struct mim_gguf_tensor {
    const char *name;
    size_t name_len;
    uint32_t n_dims;
    uint64_t ne[4]; /* ne[0] is the contiguous dimension */
    uint32_t type;
    const void *data;
    uint64_t nbytes;
} mim_gguf_tensor;

typedef struct mim_gguf {
    const unsigned char *base;
    size_t size;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    mim_gguf_kv *kv;
    mim_gguf_tensor *tensors;
    bool mapped;
} mim_gguf;

/* Maps and validates a whole GGUF file: every key, string, array and tensor extent is checked
 * against the file size, so later reads need no checks. Tensors of unsupported types are
 * accepted here (their extent is only checked when the size is computable); the loader names
 * the type when it needs the tensor. */
mi_status mim_gguf_open(const char *path, mim_gguf **out, char *err, size_t cap);
/* The same over a caller buffer that must outlive the handle. */
mi_status mim_gguf_open_memory(const void *data, size_t size, mim_gguf **out, char *err,
                               size_t cap);
void mim_gguf_close(mim_gguf *g);

const mim_gguf_kv *mim_gguf_find(const mim_gguf *g, const char *key);
const mim_gguf_tensor *mim_gguf_find_tensor(const mim_gguf *g, const char *name);
/* Typed getters: false if absent or of an incompatible type. Integers of any width convert. */
bool mim_gguf_get_i64(const mim_gguf *g, const char *key, int64_t *out);
bool mim_gguf_get_f64(const mim_gguf *g, const char *key, double *out);
bool mim_gguf_get_bool(const mim_gguf *g, const char *key, bool *out);
/* A string value (not NUL-terminated). */
bool mim_gguf_get_str(const mim_gguf *g, const char *key, const char **s, size_t *len);
/* Walks an array of strings: *cursor starts at kv->value and advances. Safe because the file
 * was validated at open. */
void mim_gguf_next_str(const unsigned char **cursor, const char **s, size_t *len);
/* Element i of a numeric array as double. */
double mim_gguf_array_num(const mim_gguf_kv *kv, uint64_t i);

/* ------------------------------------------------------------------------------------------ */
/* safetensors (one shard)                                                                    */

typedef struct mim_st_tensor {
    char *name;
    uint32_t type; /* MIM_TYPE_F32 / F16 / BF16, or UINT32_MAX for others (dtype_name says) */
    char dtype_name[16];
    int n_dims;
    int64_t shape[4];
    const void *data;
    uint64_t nbytes;
} mim_st_tensor;

typedef struct mim_st_file {
    const unsigned char *base;
    size_t size;
    int n_tensors;
    mim_st_tensor *tensors;
} mim_st_file;

mi_status mim_st_open(const char *path, mim_st_file *out, char *err, size_t cap);
mi_status mim_st_open_memory(const void *data, size_t size, mim_st_file *out, char *err,
                             size_t cap);
void mim_st_close(mim_st_file *f, bool unmap);

/* ------------------------------------------------------------------------------------------ */
/* Hash maps                                                                                   */

/* Open addressing, string keys (borrowed, not copied) to int32 values. */
typedef struct mim_strmap {
    const char **keys;
    uint32_t *lens;
    int32_t *vals;
    size_t cap, count;
} mim_strmap;

bool mim_strmap_init(mim_strmap *m, size_t expected);
void mim_strmap_free(mim_strmap *m);
/* false on allocation failure; an existing key keeps its first value. */
bool mim_strmap_put(mim_strmap *m, const char *key, size_t len, int32_t val);
int32_t mim_strmap_get(const mim_strmap *m, const char *key, size_t len); /* -1 if absent */

/* uint64 keys to two int32 values (BPE pair -> rank, merged id). */
typedef struct mim_pairmap {
    uint64_t *keys;
    int32_t *rank, *merged;
    size_t cap, count;
} mim_pairmap;

bool mim_pairmap_init(mim_pairmap *m, size_t expected);
void mim_pairmap_free(mim_pairmap *m);
bool mim_pairmap_put(mim_pairmap *m, uint64_t key, int32_t rank, int32_t merged);
bool mim_pairmap_get(const mim_pairmap *m, uint64_t key, int32_t *rank, int32_t *merged);

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                   */

typedef enum mim_tok_kind {
    MIM_TOK_BYTE_BPE = 0, /* GPT-2 style: bytes mapped to printable code points, merge ranks */
    MIM_TOK_SPM = 1,      /* SentencePiece BPE: U+2581 for spaces, scores, <0xXX> fallback */
} mim_tok_kind;

typedef enum mim_pretok {
    MIM_PRE_GPT2 = 0,
    MIM_PRE_LLAMA3 = 1,
    MIM_PRE_QWEN2 = 2,
    MIM_PRE_SMOLLM = 3, /* every digit alone, then the GPT-2 expression */
} mim_pretok;

enum {
    MIM_TT_NORMAL = 1,
    MIM_TT_UNKNOWN = 2,
    MIM_TT_CONTROL = 3,
    MIM_TT_USER_DEFINED = 4,
    MIM_TT_UNUSED = 5,
    MIM_TT_BYTE = 6,
};

typedef struct mim_tokenizer {
    mim_tok_kind kind;
    mim_pretok pre;
    int32_t n_vocab;
    char *arena;       /* all token strings, NUL-separated */
    const char **text; /* [n_vocab] */
    uint32_t *len;     /* [n_vocab] */
    float *score;      /* [n_vocab] SPM merge priority */
    int32_t *type;     /* [n_vocab] MIM_TT_* */
    mim_strmap vocab;
    mim_pairmap merges; /* byte BPE: (left id, right id) -> rank, merged id */
    int32_t *specials;  /* ids matched literally in text, longest first */
    int32_t n_specials;
    int32_t byte_token[256]; /* SPM: id of <0xXX>, -1 if absent */
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[512];
    int32_t bos, eos, eot, unk;
    bool add_bos, add_space_prefix;
} mim_tokenizer;

/* GPT-2's byte-to-unicode map of byte-level BPE vocabularies: the code point that stands for
 * each byte in token text. */
void mim_gpt2_byte_map(uint32_t byte_to_cp[256]);

/* Builds from GGUF metadata (tokenizer.ggml.*). */
mi_status mim_tokenizer_from_gguf(const mim_gguf *g, mim_tokenizer **out, char *err, size_t cap);
/* Builds from a Hugging Face tokenizer.json (text of the file). */
mi_status mim_tokenizer_from_json(const char *json, size_t len, mim_tokenizer **out, char *err,
                                  size_t cap);
void mim_tokenizer_free(mim_tokenizer *t);
int32_t mim_tokenizer_find(const mim_tokenizer *t, const char *s);
/* Tokenizes; *n_out gets the count; returns false on allocation failure. *tokens is malloc'ed. */
bool mim_tokenize(const mim_tokenizer *t, const char *text, size_t len, bool add_bos,
                  bool parse_special, int32_t **tokens, size_t *n_out);
/* Appends the bytes of one token to out (capacity cap); returns the byte count it needs. */
size_t mim_token_bytes(const mim_tokenizer *t, int32_t id, char *out, size_t cap);
/* Splits text into pre-tokenizer pieces (byte offsets, [start, end) pairs): exposed for tests. */
bool mim_pretokenize(mim_pretok pre, const char *text, size_t len, size_t **bounds,
                     size_t *n_pieces);

/* Monotonic clock in seconds. */
double mim_now_s(void);

/* ------------------------------------------------------------------------------------------ */
/* Thread pool                                                                                 */

typedef struct mim_pool mim_pool;
typedef void (*mim_task_fn)(void *arg, int64_t begin, int64_t end, int thread);

mim_pool *mim_pool_create(int n_threads);
void mim_pool_destroy(mim_pool *p);
int mim_pool_size(const mim_pool *p);
/* Splits [0, n) into contiguous ranges over the pool's threads (the caller is thread 0) and
 * waits for all of them. */
void mim_pool_run(mim_pool *p, int64_t n, mim_task_fn fn, void *arg);

/* ------------------------------------------------------------------------------------------ */
/* RoPE                                                                                        */

typedef struct mim_rope {
    int32_t dim;  /* rotated dimensions (head_dim unless partial) */
    double theta; /* base */
    mi_rope_scaling scaling;
    const float *freq_factors; /* [dim/2] divisors of the frequencies (GGUF rope_freqs), or NULL */
    bool neox;                 /* pairs (i, i + dim/2); else adjacent pairs (2i, 2i+1) */
} mim_rope;

/* inv_freq [dim/2] and the cos/sin multiplier (YaRN attention factor; 1 otherwise) for a
 * sequence of seq_len tokens (dynamic NTK depends on it). */
void mim_rope_freqs(const mim_rope *r, int64_t seq_len, float *inv_freq, float *mscale);
/* Rotates n rows of n_heads heads, row stride row_stride floats, head_dim hd, positions pos0..;
 * cos_t / sin_t [n, dim/2] precomputed by mim_rope_table. */
void mim_rope_apply(const mim_rope *r, float *x, int64_t n, int64_t n_heads, int64_t hd,
                    int64_t row_stride, const float *cos_t, const float *sin_t);
void mim_rope_table(const float *inv_freq, float mscale, int32_t dim, int64_t pos0, int64_t n,
                    float *cos_t, float *sin_t);

#endif /* MI_MODEL_INTERNAL_H */
