/*
 * cpu_common.h: what the CPU kernels share: element conversion, SIMD helpers, the tile state of
 * one 64-row query block, and the attention "job" that every kernel family (dense, A-/Tri-shape,
 * sparse, metrics) reduces to.
 *
 * Layout of the tile state (all fp32, 64-byte aligned, MI_BLOCK_SIZE = 64 columns):
 *   qt [D][64]   query block, transposed, pre-multiplied by scale * log2(e) so that the
 *                softmax runs in base 2 (exp2 is cheaper than exp and LSE converts exactly)
 *   st [64][64]  scores of one key tile, key-major: st[j][i] = q_i . k_j; overwritten by P
 *   ot [D][64]   unnormalised output, transposed
 *   m, l [64]    running max (base-2 units) and running sum per query row
 * Keeping everything "rows in the vector lanes" makes the softmax statistics plain vector ops and
 * lets both GEMMs read K and V rows straight from the caller's fp32 tensor (scalar broadcasts),
 * so fp32 inputs need no packing at all.
 */
#ifndef MI_CPU_COMMON_H
#define MI_CPU_COMMON_H

#include "backend.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MI_BS MI_BLOCK_SIZE
#define MI_MAX_D 256

/* ------------------------------------------------------------------------------------------ */
/* Element access                                                                              */

/* Address of element (b, h, l, 0) of a strided tensor. */
static inline const void *mi_cpu_row(const mi_tensor *t, int64_t b, int64_t h, int64_t l) {
    const size_t esz = t->dtype == MI_DTYPE_F32 ? 4 : 2;
    return (const char *)t->data +
           (size_t)(b * t->stride[0] + h * t->stride[1] + l * t->stride[2]) * esz;
}

static inline float mi_cpu_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t mi_cpu_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Branch-free fp16 -> fp32 (gcc vectorises loops of it): the exponent rebias is a multiply by
 * 2^112, which also turns fp16 subnormals into the right fp32 normals; Inf/NaN are patched. */
static inline float mi_cpu_h2f(uint16_t h) {
    const uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t bits = mi_cpu_f32_bits(mi_cpu_bits_f32(em) * 0x1p112f);
    bits = em >= (0x7c00u << 13) ? (0x7f800000u | em) : bits;
    return mi_cpu_bits_f32(bits | sign);
}

static inline float mi_cpu_b2f(uint16_t h) { return mi_cpu_bits_f32((uint32_t)h << 16); }

/* Converts n elements starting at src (dtype) into dst (fp32); multiplies by mul. */
void mi_cpu_load_f32(float *dst, const void *src, mi_dtype dtype, int64_t n, float mul);
/* Stores n fp32 values to dst in dtype (round to nearest even). */
void mi_cpu_store(void *dst, mi_dtype dtype, const float *src, int64_t n);

/* ------------------------------------------------------------------------------------------ */
/* Attention jobs                                                                              */

typedef enum mi_job_kind {
    MI_JOB_DENSE = 0,  /* every causal key */
    MI_JOB_ASHAPE = 1, /* sinks + window; rows >= tri_start dense (Tri-shape) */
    MI_JOB_SPARSE = 2, /* 64-wide key ranges + gathered columns from a block index */
} mi_job_kind;

/* One (batch, query head) and how its keys are chosen. For MI_JOB_SPARSE the pointers are the
 * (b, h) slices of a block index: block_count [R], block_offset [R, max_blocks], column_count [R],
 * column_index [R, max_columns]; counts are clamped to the capacities and entries outside the
 * sequence are skipped, so any index content is safe. */
typedef struct mi_attn_job {
    int64_t b, h;
    int64_t len; /* valid rows and keys of this sequence */
    mi_job_kind kind;
    int64_t n_init, n_local, tri_start; /* A-/Tri-shape */
    const int32_t *block_count, *block_offset, *column_count, *column_index;
    int64_t max_blocks, max_columns;
} mi_attn_job;

/* B * H_q dense jobs, (b, h) row-major, len from seq_lens; NULL when out of memory. */
mi_attn_job *mi_cpu_jobs_new(const mi_attn_shape *s, const int32_t *seq_lens);
/* Points a job at its (b, h) slices of a block index. */
void mi_cpu_job_sparse(mi_attn_job *job, const mi_sparse_index *index);

/* A-shape job parameters resolved as the kernels use them (n_last clamped to len - 1). */
void mi_cpu_job_ashape(mi_attn_job *job, int64_t n_init, int64_t n_local, int64_t n_last);

/* Runs every row block of every job in parallel: writes out rows [0, L) of each job's (b, h)
 * (rows >= len as 0) and lse [B, H_q, L] if non-NULL (rows >= len as -inf). */
mi_status mi_cpu_run_jobs(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                          const mi_tensor *k, const mi_tensor *v, const mi_attn_job *jobs,
                          int64_t n_jobs, float scale, mi_tensor *out, float *lse);

/* Per-row statistics of one job's pattern for the metrics: for rows [r0, r0 + nr) of the job,
 * mass[i] = attention mass (of the dense softmax) on the keys the pattern visits, and *visited +=
 * visited causal (row, key) pairs. Single-threaded; ws from mi_cpu_tile_alloc. */
typedef struct mi_tile mi_tile;
/* Tile state of one 64-row query block (layout in the comment at the top of this file). */
struct mi_tile {
    _Alignas(64) float m[MI_BS];     /* running max, base-2 units */
    _Alignas(64) float l[MI_BS];     /* running sum */
    _Alignas(64) float alpha[MI_BS]; /* rescale factor of the current tile */
    _Alignas(64) float lse2[MI_BS];  /* final base-2 LSE (metrics / estimation passes) */
    _Alignas(64) float acc[MI_BS];   /* per-row mass (metrics) */
    int32_t kpos[MI_BS];             /* key positions of the current tile */
    int64_t D;
    int64_t r0, nr; /* query rows of the block (absolute positions) */
    int64_t q_off;  /* absolute position of q's row 0 */
    double visited;
    float *qt;  /* [D][64] */
    float *st;  /* [64][64] */
    float *ot;  /* [D][64] */
    float *kb;  /* [64][D] */
    float *vb;  /* [64][D] */
    float *row; /* [D] */
    int avx512; /* the AVX-512 engine runs the calls on this tile (mi_cpu_scratch_alloc) */
};
mi_tile *mi_cpu_tile_alloc(int64_t head_dim);
void mi_cpu_tile_free(mi_tile *t);

/* Per-thread scratch of a parallel loop on ctx: tiles[i] for head_dim (on the engine ctx's tuning
 * picks), and ws[i] of ws_floats floats when ws is not NULL. Returns 0 when any allocation
 * failed; free with mi_cpu_scratch_free either way (entries that failed are NULL). */
int mi_cpu_scratch_alloc(const mi_context *ctx, int n_threads, int64_t head_dim, size_t ws_floats,
                         mi_tile **tiles, float **ws);
void mi_cpu_scratch_free(int n_threads, mi_tile **tiles, float **ws);
void mi_cpu_job_mass(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,
                     const mi_attn_job *job, float scale, int64_t r0, double *mass,
                     double *visited);

/* Vertical-slash estimation sums for one (b, h): the n last rows of the sequence (n <= the query
 * rows, len - s->q_off) against all its keys (causal), exact fp32 softmax, vert[j] += column mass of key j, slash[d] += mass on the
 * diagonal d = i - j. vert and slash have len entries, zeroed by the caller. */
void mi_cpu_vs_sums(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,
                    int64_t b, int64_t h, int64_t len, int64_t n, float scale, float *vert,
                    float *slash);

/* Scores of up to 64 pooled query blocks against pooled key blocks (both fp32 [n][D], row
 * major): sc[j * 64 + i] = qp[i] . kp[j] for i < nq, j < nk (nk <= 64). */
void mi_cpu_block_scores(mi_tile *t, int64_t D, const float *qp, int64_t nq, const float *kp,
                         int64_t nk, float *sc);

/* The engine (attn_engine.h) is compiled for the build's target (suffix _base) and, on x86-64
 * builds below AVX-512, a second time with AVX-512 enabled (suffix _avx512), picked at run time. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__AVX512F__)
#define MI_CPU_AVX512_ENGINE 1
#else
#define MI_CPU_AVX512_ENGINE 0
#endif

#define MI_CPU_ENGINE_DECLARE(sfx)                                                                 \
    mi_status mi_cpu_run_jobs##sfx(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,    \
                                   const mi_tensor *k, const mi_tensor *v,                         \
                                   const mi_attn_job *jobs, int64_t n_jobs, float scale,           \
                                   mi_tensor *out, float *lse);                                    \
    void mi_cpu_job_mass##sfx(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,              \
                              const mi_tensor *k, const mi_attn_job *job, float scale, int64_t r0, \
                              double *mass, double *visited);                                      \
    void mi_cpu_vs_sums##sfx(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,               \
                             const mi_tensor *k, int64_t b, int64_t h, int64_t len, int64_t n,     \
                             float scale, float *vert, float *slash);                              \
    void mi_cpu_block_scores##sfx(mi_tile *t, int64_t D, const float *qp, int64_t nq,              \
                                  const float *kp, int64_t nk, float *sc);
MI_CPU_ENGINE_DECLARE(_base)
MI_CPU_ENGINE_DECLARE(_avx512)

/* ------------------------------------------------------------------------------------------ */
/* Shared helpers                                                                              */

/* Selects the k largest of val[0..n) (NaN ranks lowest; ties go to the lower index) and writes
 * their indices to idx ascending. tmp has room for n int32. Deterministic. */
void mi_cpu_topk(const float *val, int32_t n, int32_t k, int32_t *tmp, int32_t *idx);

/* Sorts ascending and removes duplicates; returns the new count. */
int32_t mi_cpu_sort_unique(int32_t *a, int32_t n);

/* Builds the block index of one (b, h) and all its row blocks (docs/algorithms.md §2, made
 * causal-safe). verticals / slashes: any order, duplicates and out-of-range entries allowed.
 * scratch holds nv + ns int32. Row blocks ending at or before position first (queries at an
 * offset: no query there) are left empty. */
void mi_cpu_vs_index_head(int64_t L, int64_t len, int64_t first, const int32_t *verticals,
                          int32_t nv, const int32_t *slashes, int32_t ns, int32_t *scratch,
                          int32_t *block_count, int32_t *block_offset, int64_t max_blocks,
                          int32_t *column_count, int32_t *column_index, int64_t max_columns);

/* Vertical-slash estimation of one (b, h): clamped budgets, forced entries, top-k; vidx written
 * ascending, sidx (distances) descending. ws: mi_cpu_vs_ws_floats(len) floats. */
size_t mi_cpu_vs_ws_floats(int64_t len);
void mi_cpu_vs_estimate_head(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                             const mi_tensor *k, int64_t b, int64_t h, int64_t len,
                             int32_t vertical_size, int32_t slash_size, const mi_vs_params *p,
                             float scale, float *ws, int32_t *vidx, int32_t *vcount, int32_t *sidx,
                             int32_t *scount);

/* Effective budgets of vertical-slash estimation for a sequence of length len. */
static inline int32_t mi_cpu_vs_budget(int32_t size, int32_t minimum, int64_t len) {
    int64_t n = size > minimum ? size : minimum;
    if (n > len) n = len;
    return n < 0 ? 0 : (int32_t)n;
}

/* Block-sparse estimation of one (b, h) into its index slices (block_count [R], block_offset
 * [R, max_blocks], column_count [R]). ws: mi_cpu_bs_ws_floats(len, D) floats. */
size_t mi_cpu_bs_ws_floats(int64_t len, int64_t D);
void mi_cpu_bs_estimate_head(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                             const mi_tensor *k, int64_t b, int64_t h, int64_t len,
                             int64_t row_blocks, int32_t top_k, float *ws, int32_t *block_count,
                             int32_t *block_offset, int64_t max_blocks, int32_t *column_count);

/* XAttention estimation of one (b, h) (xattn_estimate.c) into its index slices, with max_blocks
 * >= the row blocks; t is a tile for head_dim * stride; ws: mi_cpu_xattn_ws_floats floats,
 * 64-byte aligned. mass_out (optional, [nb][nb]) receives each row block's block mass. */
size_t mi_cpu_xattn_ws_floats(int64_t len, int64_t D, int32_t stride);
void mi_cpu_xattn_estimate_head(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                                const mi_tensor *k, int64_t b, int64_t h, int64_t len,
                                int64_t row_blocks, int32_t stride, int32_t threshold, float scale,
                                float *ws, int32_t *block_count, int32_t *block_offset,
                                int64_t max_blocks, int32_t *column_count, double *mass_out);
/* Row block m's threshold selection from its block mass a [m + 1]: block 0 and block m, then
 * the others by descending mass (ties: lower block first) while the mass kept is below
 * threshold / 1000 of the total; all blocks for threshold >= 1000. Writes 64 * block to offs
 * ascending, returns the count. scratch: 16 * (m + 1) bytes. */
int32_t mi_cpu_threshold_select(const double *a, int64_t m, int32_t threshold, void *scratch,
                                int32_t *offs, int64_t max_blocks);

/* FlexPrefill estimation of one (b, h) (flex_estimate.c) into its index slices (max_blocks >=
 * the row blocks); t is a tile for head_dim; *query_aware (optional) gets the decision. */
void mi_cpu_flex_estimate_head(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                               const mi_tensor *k, int64_t b, int64_t h, int64_t len,
                               int64_t row_blocks, int32_t gamma_pm, int32_t tau_pm, float scale,
                               int32_t *block_count, int32_t *block_offset, int64_t max_blocks,
                               int32_t *column_count, int *query_aware);
/* sqrt of the Jensen-Shannon divergence (natural log) of two distributions [n]. */
double mi_cpu_sqrt_js(const double *p, const double *q, int64_t n);

/* Dilated and strided heads (rowmask.c): the keys of the row at absolute position p under head
 * plan hp, and the run of every such (b, h) of a call. */
struct mi_head_plan;
int64_t mi_cpu_rowmask_keys(const struct mi_head_plan *hp, int64_t p, int32_t *keys);
/* The metrics of rows [r0, r0 + nr) of a row-mask (b, h) (as mi_cpu_job_mass): mass[i] of the
 * dense softmax on the row's keys, *visited += the keys visited. */
void mi_cpu_rowmask_mass(const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,
                         const struct mi_head_plan *hp, int64_t b, int64_t h, int64_t len,
                         int64_t r0, int64_t nr, float scale, double *mass, double *visited);
/* The CPU's plan of a prefill call (prefill.c): heads [H_q]. */
struct mi_prefill_plan;
void mi_cpu_plan_heads(const mi_attn_shape *s, const int32_t *seq_lens,
                       const mi_head_pattern *patterns, const mi_prefill_params *pp,
                       struct mi_head_plan *heads, struct mi_prefill_plan *plan);
mi_status mi_cpu_rowmask_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                             const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                             const struct mi_head_plan *heads, float scale, mi_tensor *out,
                             float *lse);

/* InfLLM heads (infllm.c). What a run selected, for tests and benchmarks (optional):
 * count [B, H_q, n_chunks] and blocks [B, H_q, n_chunks, max_sel] get each chunk's retrieved
 * blocks (ascending; chunk k holds rows k * chunk_size ..), select_s / total_s add the seconds
 * spent choosing blocks (representatives, query means, scores, top-k) and in the whole run. */
typedef struct mi_cpu_infllm_trace {
    int32_t *count, *blocks;
    int64_t n_chunks, max_sel;
    double select_s, total_s;
} mi_cpu_infllm_trace;
/* The memory at the start of the chunk at absolute position st: init_len sink keys, n_blocks
 * blocks after them, the tail from key *tail on. */
void mi_cpu_infllm_memory(const struct mi_head_plan *hp, int64_t st, int64_t *init_len,
                          int64_t *n_blocks, int64_t *tail);
mi_status mi_cpu_infllm_run(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                            const mi_tensor *k, const mi_tensor *v, const int32_t *seq_lens,
                            const struct mi_head_plan *heads, float scale, mi_tensor *out,
                            float *lse, mi_cpu_infllm_trace *trace);

/* Whether row p of (b, h) attends to key j in the run trace recorded (its chunk's blocks). */
bool mi_cpu_infllm_keeps(const struct mi_head_plan *hp, const mi_cpu_infllm_trace *trace, int64_t b,
                         int64_t h, int64_t heads_q, int64_t p, int64_t j);
/* The metrics of rows [r0, r0 + nr) of an InfLLM (b, h) under trace (as mi_cpu_rowmask_mass). */
void mi_cpu_infllm_mass(const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,
                        const struct mi_head_plan *hp, const mi_cpu_infllm_trace *trace, int64_t b,
                        int64_t h, int64_t len, int64_t r0, int64_t nr, float scale, double *mass,
                        double *visited);

/* Prefill planning (prefill.c): lays the jobs and their indices out in workspace (of
 * mi_cpu_prefill_workspace_size bytes) and runs the estimators. *jobs_out: B * H_q jobs. */
mi_status mi_cpu_prefill_plan(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                              const mi_tensor *k, const int32_t *seq_lens,
                              const mi_head_pattern *patterns, const mi_prefill_params *params,
                              void *workspace, mi_attn_job **jobs_out);

static inline int64_t mi_cpu_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t mi_cpu_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* a . b in f32 with eight partial sums (vectorizes without -ffast-math); the estimators'
 * and the row-mask kernel's dot product */
static inline float mi_cpu_dot8(const float *a, const float *b, int64_t D) {
    float acc[8] = {0};
    int64_t d = 0;
    for (; d + 8 <= D; d += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[d + u] * b[d + u];
    float s = 0.0f;
    for (; d < D; d++) s += a[d] * b[d];
    for (int u = 0; u < 8; u++) s += acc[u];
    return s;
}

#endif /* MI_CPU_COMMON_H */
