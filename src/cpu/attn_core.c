/*
 * attn_core.c: what the attention engine needs once: element conversion, the tile state, the
 * A-shape job set-up, and the dispatch between the engine compiled for the build's target and
 * the AVX-512 one (attn_core_avx512.c) when the build targets less and the CPU has it.
 *
 * Measured with tests/cpu/bench_cpu (fp32, D = 128, one head, process CPU time on the shared
 * 2-core Xeon with AVX-512; OpenBLAS 0.3.21 forced to its SkylakeX kernels with
 * OPENBLAS_CORETYPE=SkylakeX, since on this CPU it otherwise falls back to SSE3 "Prescott"):
 *   1 thread:  sgemm 2048^3 160 GFLOP/s; dense 137-146 GFLOP/s for L = 2K..16K (0.86-0.92x)
 *   2 threads: sgemm 300-314 GFLOP/s; dense 235 (L 4K), 261-281 GFLOP/s for L = 6K..64K
 *              (0.82-0.90x)
 *   The AVX2 engine alone reaches about half of that (66 GFLOP/s on 1 thread).
 *   Against OpenBLAS's default (Prescott) sgemm here, 62-68 GFLOP/s on 2 threads, dense is
 *   more than 3x faster.
 * Per-tile cblas_sgemm is slower, so it is not used: the two 64 x 64 x 128 products of a tile
 * (S = Q K^T, O += P V) alone run at 116 GFLOP/s on 1 thread with the SkylakeX kernels and 29
 * GFLOP/s with the default ones, below the whole engine (softmax and masks included) at 137-146;
 * the micro-kernel also reads fp32 K and V in place and fuses the rescale of O into P V.
 */
#include "cpu_common.h"

#include <math.h>

#if defined(__AVX__) || defined(__FMA__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define ENGINE(name) name##_base
#include "attn_engine.h"
#undef ENGINE

/* ------------------------------------------------------------------------------------------ */
/* Conversion                                                                                  */

static inline uint16_t f2h(float f) {
    uint32_t x = mi_cpu_f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {
        return (uint16_t)(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u | ((x >> 13) & 0x3ffu) : 0));
    }
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf */
    if (x < 0x38800000u) {
        /* fp16 subnormal (or zero): the mantissa is |f| * 2^24 rounded to nearest even; a result
         * of 0x400 is exactly the smallest normal's encoding. */
        return (uint16_t)(sign | (uint16_t)lrintf(mi_cpu_bits_f32(x) * 0x1p24f));
    }
    x -= (uint32_t)(127 - 15) << 23;
    x += 0xfffu + ((x >> 13) & 1u);
    return (uint16_t)(sign | (x >> 13));
}

static inline uint16_t f2b(float f) {
    uint32_t x = mi_cpu_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

void mi_cpu_load_f32(float *restrict dst, const void *restrict src, mi_dtype dtype, int64_t n,
                     float mul) {
    if (dtype == MI_DTYPE_F32) {
        const float *s = (const float *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i] * mul;
    } else if (dtype == MI_DTYPE_F16) {
        const uint16_t *s = (const uint16_t *)src;
        int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
        /* the hardware conversion: gcc does not vectorise the portable bit manipulation */
        const __m256 m = _mm256_set1_ps(mul);
        for (; i + 8 <= n; i += 8) {
            const __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(h), m));
        }
#endif
        for (; i < n; i++) dst[i] = mi_cpu_h2f(s[i]) * mul;
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = mi_cpu_b2f(s[i]) * mul;
    }
}

void mi_cpu_store(void *restrict dst, mi_dtype dtype, const float *restrict src, int64_t n) {
    if (dtype == MI_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == MI_DTYPE_F16) {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = f2h(src[i]);
    } else {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = f2b(src[i]);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Tile state                                                                                  */

mi_tile *mi_cpu_tile_alloc(int64_t D) {
    const size_t big = (size_t)D * MI_BS * sizeof(float);
    const size_t n_floats = 4 * (size_t)D * MI_BS + (size_t)MI_BS * MI_BS + (size_t)D + 16;
    const size_t bytes =
        (sizeof(mi_tile) + 63) / 64 * 64 + (n_floats * sizeof(float) + 63) / 64 * 64;
    char *base = aligned_alloc(64, bytes);
    if (!base) return NULL;
    mi_tile *t = (mi_tile *)base;
    memset(t, 0, sizeof *t);
    float *f = (float *)(base + (sizeof(mi_tile) + 63) / 64 * 64);
    t->D = D;
    t->qt = f;
    t->ot = (float *)((char *)f + big);
    t->kb = (float *)((char *)f + 2 * big);
    t->vb = (float *)((char *)f + 3 * big);
    t->st = (float *)((char *)f + 4 * big);
    t->row = t->st + MI_BS * MI_BS;
    return t;
}

void mi_cpu_tile_free(mi_tile *t) { free(t); }

static int use_avx512(const mi_context *ctx);

int mi_cpu_scratch_alloc(const mi_context *ctx, int n_threads, int64_t head_dim, size_t ws_floats,
                         mi_tile **tiles, float **ws) {
    int ok = 1;
    for (int i = 0; i < n_threads; i++) {
        tiles[i] = mi_cpu_tile_alloc(head_dim);
        if (tiles[i]) tiles[i]->avx512 = use_avx512(ctx);
        ok = ok && tiles[i];
        if (ws) {
            ws[i] = malloc(ws_floats * sizeof(float));
            ok = ok && ws[i];
        }
    }
    return ok;
}

void mi_cpu_scratch_free(int n_threads, mi_tile **tiles, float **ws) {
    for (int i = 0; i < n_threads; i++) {
        mi_cpu_tile_free(tiles[i]);
        if (ws) free(ws[i]);
    }
}

void mi_cpu_job_ashape(mi_attn_job *job, int64_t n_init, int64_t n_local, int64_t n_last) {
    job->kind = MI_JOB_ASHAPE;
    job->n_init = n_init < 0 ? 0 : n_init;
    job->n_local = n_local < 0 ? 0 : n_local;
    const int64_t last = mi_cpu_max64(0, mi_cpu_min64(n_last, job->len - 1));
    job->tri_start = last > 0 ? job->len - last : INT64_MAX;
}

/* ------------------------------------------------------------------------------------------ */
/* Dispatch                                                                                    */

/* The AVX-512 engine where the CPU has it, unless ctx's tuning asks for the build-target engine
 * (cpu_engine = 1), so that the tests can exercise that one on such a machine too
 * (tests/cpu/CMakeLists.txt). Calls with a tile take the engine the tile was made for. */
static int use_avx512(const mi_context *ctx) {
#if MI_CPU_AVX512_ENGINE
    if (ctx && ctx->tuning.cpu_engine == 1) return 0;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    (void)ctx;
    return 0;
#endif
}
#if MI_CPU_AVX512_ENGINE
#define DISPATCH(on, name, ...) ((on) ? name##_avx512(__VA_ARGS__) : name##_base(__VA_ARGS__))
#else
#define DISPATCH(on, name, ...) name##_base(__VA_ARGS__)
#endif

mi_status mi_cpu_run_jobs(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                          const mi_tensor *k, const mi_tensor *v, const mi_attn_job *jobs,
                          int64_t n_jobs, float scale, mi_tensor *out, float *lse) {
    return DISPATCH(use_avx512(ctx), mi_cpu_run_jobs, ctx, s, q, k, v, jobs, n_jobs, scale, out,
                    lse);
}

void mi_cpu_job_mass(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,
                     const mi_attn_job *job, float scale, int64_t r0, double *mass,
                     double *visited) {
    DISPATCH(t->avx512, mi_cpu_job_mass, t, s, q, k, job, scale, r0, mass, visited);
}

void mi_cpu_vs_sums(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q, const mi_tensor *k,
                    int64_t b, int64_t h, int64_t len, int64_t n, float scale, float *vert,
                    float *slash) {
    DISPATCH(t->avx512, mi_cpu_vs_sums, t, s, q, k, b, h, len, n, scale, vert, slash);
}

void mi_cpu_block_scores(mi_tile *t, int64_t D, const float *qp, int64_t nq, const float *kp,
                         int64_t nk, float *sc) {
    DISPATCH(t->avx512, mi_cpu_block_scores, t, D, qp, nq, kp, nk, sc);
}
