/*
 * attn_engine.h: the attention engine, written once and compiled once per instruction set
 * (included by attn_core.c for the build's target, and by attn_core_avx512.c with AVX-512
 * enabled for runtime dispatch). Define ENGINE(name) to suffix the four entry points.
 *
 * A work item is one 64-row query block of one (b, h) "job" (cpu_common.h). The item loads its
 * queries transposed (qt [D][64], pre-scaled by scale * log2 e), then visits key tiles of up to
 * 64 keys. A key tile is either a contiguous range (read in place when the tensor is fp32,
 * converted into a scratch tile otherwise) or a gathered list of columns (copied). Per tile:
 *
 *   GEMM 1   st[j][i] = sum_d K[j][d] * qt[d][i]          (64 keys x 64 rows x D)
 *   mask     st[j][i] = -inf where key j is invisible to row i (causal, window, sinks, Tri rows)
 *   softmax  m_new = max(m, max_j st); alpha = 2^(m - m_new); P = 2^(st - m_new); l = l*alpha + sum P
 *   GEMM 2   ot[d][i] = alpha[i] * ot[d][i] + sum_j V[j][d] * P[j][i]
 *
 * Both GEMMs are the same register-blocked micro-kernel: MR scalars of the "A" operand (K or V
 * elements, broadcast) times NV vectors of 64-wide rows of the "B" operand (qt or P), FMA into
 * MR x NV accumulators held in registers for the whole contraction. The vector width follows the
 * target (8 floats with AVX2, 16 with AVX-512). Vector code uses GCC vector extensions, with
 * intrinsics for FMA / max / min / broadcast where the target has them, because the build's strict
 * C11 mode turns floating-point contraction off.
 *
 * Online-softmax numerics: everything fp32; a row whose max is still -inf uses 0 as the reference
 * so that 2^(-inf - ref) = 0 and no NaN appears; a row that saw no key ends with l = 0 and gets
 * output 0 and LSE -inf (the header's contract).
 *
 * No include guard: meant to be included once per translation unit.
 */
#include "cpu_common.h"

#include <math.h>
#include <omp.h>

#include "../core/simd.h"

/* Register blocking of the micro-kernel for the vector width (simd.h) */
#if VL == 16
#define MR 8 /* 8 x 2 accumulators of 16 floats: 16 of the 32 zmm registers */
#define NV 2
#else
#define MR 4 /* 4 x 2 accumulators of 8 floats + 2 B vectors + 1 broadcast: 11 of 16 ymm */
#define NV 2
#endif
#define NVEC (MI_BS / VL)

/*
 * The micro-kernel. For r < mr:
 *   C[r][0:64] = (alpha ? alpha * C[r] : 0) + sum_{p < np} A(r, p) * B[p][0:64]
 * with A(r, p) = a[r * ars + p * acs] and B, C row-major with 64 columns, 64-byte aligned.
 * always_inline with a constant mr lets gcc unroll the register block completely.
 */
static inline __attribute__((always_inline)) void
mk(const int mr, const int64_t np, const float *restrict a, const int64_t ars, const int64_t acs,
   const float *restrict B, float *restrict C, const float *restrict alpha) {
    for (int c0 = 0; c0 < NVEC; c0 += NV) {
        vf acc[MR][NV];
        for (int r = 0; r < mr; r++) {
            for (int v = 0; v < NV; v++) {
                if (alpha) {
                    acc[r][v] = *(const vf *)(alpha + (c0 + v) * VL) *
                                *(const vf *)(C + r * MI_BS + (c0 + v) * VL);
                } else {
                    acc[r][v] = vset1(0.0f);
                }
            }
        }
        const float *ap = a;
        const float *bp = B + c0 * VL;
        for (int64_t p = 0; p < np; p++) {
            vf bv[NV];
            for (int v = 0; v < NV; v++) bv[v] = *(const vf *)(bp + v * VL);
            for (int r = 0; r < mr; r++) {
                const vf av = vset1(ap[r * ars]);
                for (int v = 0; v < NV; v++) acc[r][v] = vfma(av, bv[v], acc[r][v]);
            }
            ap += acs;
            bp += MI_BS;
        }
        for (int r = 0; r < mr; r++) {
            for (int v = 0; v < NV; v++) *(vf *)(C + r * MI_BS + (c0 + v) * VL) = acc[r][v];
        }
    }
}

/* C[0:m][0:64] = (alpha ? alpha * C : 0) + A B, A(r, p) as in mk, m rows in blocks of MR.
 * Kept out of line: one call per tile costs nothing, and inlined copies only grow the code. */
static __attribute__((noinline)) void gemm(int m, int64_t np, const float *a, int64_t ars,
                                           int64_t acs, const float *B, float *C,
                                           const float *alpha) {
    int r = 0; /* m <= max(64, D) <= 256 */
    for (; r + MR <= m; r += MR) mk(MR, np, a + r * ars, ars, acs, B, C + r * MI_BS, alpha);
    for (; r < m; r++) mk(1, np, a + r * ars, ars, acs, B, C + r * MI_BS, alpha);
}

/* ------------------------------------------------------------------------------------------ */
/* Tile rows                                                                                   */

/* Loads rows [r0, r0 + nr) of (b, h) transposed into qt, multiplied by mul; clears the state. */
/* Rows r0.. are absolute positions; q holds them from q_off on (queries at an offset). */
static void tile_begin(mi_tile *t, const mi_tensor *q, int64_t q_off, int64_t b, int64_t h,
                       int64_t r0, int64_t nr, float mul) {
    const int64_t D = t->D;
    t->r0 = r0;
    t->q_off = q_off;
    t->nr = nr;
    t->visited = 0.0;
    memset(t->qt, 0, (size_t)D * MI_BS * sizeof(float));
    memset(t->ot, 0, (size_t)D * MI_BS * sizeof(float));
    for (int i = 0; i < MI_BS; i++) {
        t->m[i] = -INFINITY;
        t->l[i] = 0.0f;
        t->acc[i] = 0.0f;
    }
    for (int64_t i = 0; i < nr; i++) {
        mi_cpu_load_f32(t->row, mi_cpu_row(q, b, h, r0 - q_off + i), q->dtype, D, mul);
        for (int64_t d = 0; d < D; d++) t->qt[d * MI_BS + i] = t->row[d];
    }
}

/* ------------------------------------------------------------------------------------------ */
/* One key tile                                                                                */

typedef enum tile_mode {
    MODE_ATTN, /* online softmax + P V */
    MODE_LSE,  /* online softmax statistics only */
    MODE_MASS, /* acc[i] += sum_j 2^(s - lse2[i]); visited pairs counted */
    MODE_VS,   /* as MASS but scattered into column and diagonal sums */
} tile_mode;

/* Which keys a row sees, beyond the key list itself: key j is visible to row r iff j <= r and
 * (r - j < n_local or j < n_init or r >= tri_start). Dense: n_local = INT64_MAX. */
typedef struct mask_params {
    int64_t n_init, n_local, tri_start;
} mask_params;

/* Sets invisible scores to -inf; returns the number of visible (row, key) pairs among rows < nr. */
static int64_t tile_mask(mi_tile *t, int64_t nk, const mask_params *mp) {
    const int64_t r0 = t->r0, nr = t->nr;
    const int64_t tl = mi_cpu_max64(0, mi_cpu_min64(MI_BS, mp->tri_start - r0));
    int64_t visible = 0;
    for (int64_t j = 0; j < nk; j++) {
        const int64_t kp = t->kpos[j];
        const int64_t lo = mi_cpu_max64(0, mi_cpu_min64(MI_BS, kp - r0));
        int64_t hi = MI_BS;
        if (kp >= mp->n_init && mp->n_local < INT64_MAX / 2) {
            hi = mi_cpu_max64(lo, mi_cpu_min64(MI_BS, kp + mp->n_local - r0));
        }
        /* visible rows: [lo, hi) and [max(lo, tl), 64) */
        float *row = t->st + j * MI_BS;
        for (int64_t i = 0; i < lo; i++) row[i] = -INFINITY;
        const int64_t gap_end = mi_cpu_max64(hi, tl);
        for (int64_t i = hi; i < gap_end; i++) row[i] = -INFINITY;
        const int64_t a = mi_cpu_min64(hi, nr), c = mi_cpu_max64(mi_cpu_max64(lo, tl), hi);
        visible += mi_cpu_max64(0, a - lo) + mi_cpu_max64(0, nr - mi_cpu_min64(c, nr));
    }
    return visible;
}

/* Processes nk keys at positions t->kpos[0..nk): K rows at k (row stride ldk), V rows at v. */
static void tile_step(mi_tile *t, tile_mode mode, int64_t nk, const float *k, int64_t ldk,
                      const float *v, int64_t ldv, const mask_params *mp, float *vert,
                      float *slash) {
    const int64_t D = t->D;
    float *st = t->st;
    gemm((int)nk, D, k, ldk, 1, t->qt, st, NULL);
    const int64_t visible = tile_mask(t, nk, mp);
    t->visited += (double)visible;
    if (mode == MODE_ATTN || mode == MODE_LSE) {
        for (int c = 0; c < NVEC; c++) {
            const vf m_old = *(vf *)(t->m + c * VL);
            vf mx = m_old;
            for (int64_t j = 0; j < nk; j++) mx = vmax(mx, *(vf *)(st + j * MI_BS + c * VL));
            /* A row with no visible key so far keeps -inf as its max; 0 serves as the reference
             * so that every masked probability is 2^-inf = 0 rather than NaN. */
            const vf ref = vsel(mx == vset1(-INFINITY), vset1(0.0f), mx);
            const vf alpha = vexp2(m_old - ref);
            vf sum = vset1(0.0f);
            for (int64_t j = 0; j < nk; j++) {
                vf *sp = (vf *)(st + j * MI_BS + c * VL);
                const vf p = vexp2(*sp - ref);
                *sp = p;
                sum += p;
            }
            *(vf *)(t->m + c * VL) = mx;
            *(vf *)(t->l + c * VL) = *(vf *)(t->l + c * VL) * alpha + sum;
            *(vf *)(t->alpha + c * VL) = alpha;
        }
        if (mode == MODE_ATTN) gemm((int)D, nk, v, 1, ldv, st, t->ot, t->alpha);
    } else {
        for (int c = 0; c < NVEC; c++) {
            const vf lse = *(vf *)(t->lse2 + c * VL);
            vf sum = vset1(0.0f);
            for (int64_t j = 0; j < nk; j++) {
                vf *sp = (vf *)(st + j * MI_BS + c * VL);
                const vf p = vexp2(*sp - lse);
                *sp = p;
                sum += p;
            }
            *(vf *)(t->acc + c * VL) += sum;
        }
        if (mode == MODE_VS) {
            for (int64_t j = 0; j < nk; j++) {
                const int64_t kp = t->kpos[j];
                const float *p = st + j * MI_BS;
                float colsum = 0.0f;
                /* rows i < kp - r0 are masked (p = 0) and would give negative distances */
                for (int64_t i = mi_cpu_max64(0, kp - t->r0); i < t->nr; i++) {
                    colsum += p[i];
                    slash[t->r0 + i - kp] += p[i];
                }
                vert[kp] += colsum;
            }
        }
    }
}

/* Points kp / vp at nk key and value rows from k0 of (b, hk): in place for fp32 (no packing),
 * else converted into t's scratch tiles. V only in MODE_ATTN. */
static void load_kv(mi_tile *t, tile_mode mode, const mi_tensor *k, const mi_tensor *v, int64_t b,
                    int64_t hk, int64_t k0, int64_t nk, const float **kp, int64_t *ldk,
                    const float **vp, int64_t *ldv) {
    const int64_t D = t->D;
    *vp = NULL;
    *ldv = D;
    if (k->dtype == MI_DTYPE_F32) {
        *kp = (const float *)mi_cpu_row(k, b, hk, k0);
        *ldk = k->stride[2];
        if (mode == MODE_ATTN) {
            *vp = (const float *)mi_cpu_row(v, b, hk, k0);
            *ldv = v->stride[2];
        }
        return;
    }
    for (int64_t j = 0; j < nk; j++) {
        mi_cpu_load_f32(t->kb + j * D, mi_cpu_row(k, b, hk, k0 + j), k->dtype, D, 1.0f);
    }
    *kp = t->kb;
    *ldk = D;
    if (mode == MODE_ATTN) {
        for (int64_t j = 0; j < nk; j++) {
            mi_cpu_load_f32(t->vb + j * D, mi_cpu_row(v, b, hk, k0 + j), v->dtype, D, 1.0f);
        }
        *vp = t->vb;
    }
}

/* Row blocks per work item (run_jobs): the group's blocks visit their keys together so that K
 * and V tiles are reused from cache. */
#define GROUP 4

/* Keys [lo, hi) of (b, hk) in tiles of 64. */
static void visit_range(mi_tile *t, tile_mode mode, const mi_tensor *k, const mi_tensor *v,
                        int64_t b, int64_t hk, int64_t lo, int64_t hi, const mask_params *mp,
                        float *vert, float *slash) {
    for (int64_t k0 = lo; k0 < hi; k0 += MI_BS) {
        const int64_t nk = mi_cpu_min64(MI_BS, hi - k0);
        for (int64_t j = 0; j < nk; j++) t->kpos[j] = (int32_t)(k0 + j);
        const float *kp, *vp;
        int64_t ldk, ldv;
        load_kv(t, mode, k, v, b, hk, k0, nk, &kp, &ldk, &vp, &ldv);
        tile_step(t, mode, nk, kp, ldk, vp, ldv, mp, vert, slash);
    }
}

/* Dense causal attention of G row-block tiles at once (t[0..G), rows already loaded): each key
 * tile is loaded once and applied to every block that sees it, so K and V stream from memory
 * once per G blocks instead of once per block (at 16K+ keys they no longer fit in L2). */
static void visit_dense_group(mi_tile *const *t, int G, const mi_tensor *k, const mi_tensor *v,
                              int64_t b, int64_t hk) {
    const mask_params mp = {0, INT64_MAX, INT64_MAX};
    int64_t hi = 0;
    for (int g = 0; g < G; g++) hi = mi_cpu_max64(hi, t[g]->r0 + t[g]->nr);
    for (int64_t k0 = 0; k0 < hi; k0 += MI_BS) {
        const float *kp, *vp;
        int64_t ldk, ldv;
        load_kv(t[0], MODE_ATTN, k, v, b, hk, k0, mi_cpu_min64(MI_BS, hi - k0), &kp, &ldk, &vp,
                &ldv);
        for (int g = 0; g < G; g++) {
            const int64_t nk = mi_cpu_min64(MI_BS, t[g]->r0 + t[g]->nr - k0);
            if (nk <= 0) continue;
            for (int64_t j = 0; j < nk; j++) t[g]->kpos[j] = (int32_t)(k0 + j);
            tile_step(t[g], MODE_ATTN, nk, kp, ldk, vp, ldv, &mp, NULL, NULL);
        }
    }
}

/* Gathered keys t->kpos[0..nk) (already valid positions). */
static void visit_gathered(mi_tile *t, tile_mode mode, const mi_tensor *k, const mi_tensor *v,
                           int64_t b, int64_t hk, int64_t nk, const mask_params *mp) {
    const int64_t D = t->D;
    for (int64_t j = 0; j < nk; j++) {
        mi_cpu_load_f32(t->kb + j * D, mi_cpu_row(k, b, hk, t->kpos[j]), k->dtype, D, 1.0f);
        if (mode == MODE_ATTN) {
            mi_cpu_load_f32(t->vb + j * D, mi_cpu_row(v, b, hk, t->kpos[j]), v->dtype, D, 1.0f);
        }
    }
    tile_step(t, mode, nk, t->kb, D, t->vb, D, mp, NULL, NULL);
}

static mask_params job_mask(const mi_attn_job *job) {
    mask_params mp = {0, INT64_MAX, INT64_MAX};
    if (job->kind == MI_JOB_ASHAPE) {
        mp.n_init = job->n_init;
        mp.n_local = job->n_local;
        mp.tri_start = job->tri_start;
    }
    return mp;
}

/* The gathered columns of the sparse job for t's row block, 64 per tile. */
static void visit_columns(mi_tile *t, tile_mode mode, const mi_tensor *k, const mi_tensor *v,
                          const mi_attn_job *job, int64_t hk) {
    const mask_params mp = {0, INT64_MAX, INT64_MAX};
    const int64_t m = t->r0 / MI_BS, r1 = t->r0 + t->nr;
    const int64_t nc = mi_cpu_max64(0, mi_cpu_min64(job->column_count[m], job->max_columns));
    const int32_t *cols = job->column_index + m * job->max_columns;
    int64_t n = 0;
    for (int64_t i = 0; i < nc; i++) {
        if (cols[i] < 0 || cols[i] >= r1) continue; /* outside the sequence or invisible */
        t->kpos[n++] = cols[i];
        if (n == MI_BS) {
            visit_gathered(t, mode, k, v, job->b, hk, n, &mp);
            n = 0;
        }
    }
    if (n > 0) visit_gathered(t, mode, k, v, job->b, hk, n, &mp);
}

/* Sparse job, G consecutive row blocks (t[0..G), rows loaded). Phase 1 walks the blocks' range
 * lists merged by start key, so that ranges of neighbouring row blocks over the same keys (a
 * diagonal moves 64 keys per row block) run back to back and find K and V still in cache; each
 * block still sees its own ranges in its own order, so the result is the one of a lone block.
 * Phase 2: each block's gathered columns. */
static void visit_sparse_group(mi_tile *const *t, int G, tile_mode mode, const mi_tensor *k,
                               const mi_tensor *v, const mi_attn_job *job, int64_t hk) {
    const mask_params mp = {0, INT64_MAX, INT64_MAX};
    int64_t pos[GROUP], nb[GROUP];
    const int32_t *offs[GROUP];
    for (int g = 0; g < G; g++) {
        const int64_t m = t[g]->r0 / MI_BS;
        pos[g] = 0;
        nb[g] = mi_cpu_max64(0, mi_cpu_min64(job->block_count[m], job->max_blocks));
        offs[g] = job->block_offset + m * job->max_blocks;
    }
    for (;;) {
        int best = -1;
        int64_t start = 0;
        for (int g = 0; g < G; g++) {
            if (pos[g] < nb[g] && (best < 0 || offs[g][pos[g]] < start)) {
                best = g;
                start = offs[g][pos[g]];
            }
        }
        if (best < 0) break;
        pos[best]++;
        const int64_t lo = mi_cpu_max64(0, start);
        const int64_t hi = mi_cpu_min64(start + MI_BS, t[best]->r0 + t[best]->nr);
        if (lo < hi) visit_range(t[best], mode, k, v, job->b, hk, lo, hi, &mp, NULL, NULL);
    }
    for (int g = 0; g < G; g++) visit_columns(t[g], mode, k, v, job, hk);
}

/* Key ranges of an A-shape job for rows [r0, r1): [0, r1) when the block holds Tri-shape rows
 * or the sinks touch the window, else the sinks [0, min(n_init, r1)) and the window
 * [r0 - n_local + 1, r1). Returns the number of ranges (1 or 2). */
static int ashape_ranges(const mi_attn_job *job, int64_t r0, int64_t r1, int64_t *lo, int64_t *hi) {
    const int64_t sink_hi = mi_cpu_min64(mi_cpu_max64(job->n_init, 0), r1);
    const int64_t win_lo = mi_cpu_max64(0, r0 - job->n_local + 1);
    if (r1 - 1 >= job->tri_start || win_lo <= sink_hi) {
        lo[0] = 0;
        hi[0] = r1;
        return 1;
    }
    lo[0] = 0;
    hi[0] = sink_hi;
    lo[1] = win_lo;
    hi[1] = r1;
    return 2;
}

/* A-shape job, G consecutive row blocks. Key tiles are taken one at a time from the block whose
 * walk is furthest behind, so that neighbouring blocks, whose windows are the same keys shifted
 * by one tile, use each K/V tile back to back while it is in cache. Each block still sees its
 * own tiles in its own order (results equal those of a lone block). */
static void visit_ashape_group(mi_tile *const *t, int G, tile_mode mode, const mi_tensor *k,
                               const mi_tensor *v, const mi_attn_job *job, int64_t hk) {
    const mask_params mp = job_mask(job);
    int64_t lo[GROUP][2], hi[GROUP][2], pos[GROUP];
    int n[GROUP], ri[GROUP];
    for (int g = 0; g < G; g++) {
        n[g] = ashape_ranges(job, t[g]->r0, t[g]->r0 + t[g]->nr, lo[g], hi[g]);
        ri[g] = 0;
        pos[g] = lo[g][0];
    }
    for (;;) {
        int best = -1;
        for (int g = 0; g < G; g++) {
            while (ri[g] < n[g] && pos[g] >= hi[g][ri[g]]) {
                if (++ri[g] < n[g]) pos[g] = lo[g][ri[g]];
            }
            if (ri[g] < n[g] && (best < 0 || pos[g] < pos[best])) best = g;
        }
        if (best < 0) break;
        const int64_t end = mi_cpu_min64(pos[best] + MI_BS, hi[best][ri[best]]);
        visit_range(t[best], mode, k, v, job->b, hk, pos[best], end, &mp, NULL, NULL);
        pos[best] = end;
    }
}

/* Visits every key the job's pattern gives the current row block (t->r0 .. t->r0 + t->nr). Keys
 * after the block's last row are causally invisible to all its rows and are skipped. */
static void visit_job(mi_tile *t, tile_mode mode, const mi_tensor *k, const mi_tensor *v,
                      const mi_attn_job *job, int64_t hk) {
    const int64_t r1 = t->r0 + t->nr, b = job->b;
    const mask_params mp = job_mask(job);
    switch (job->kind) {
    case MI_JOB_DENSE: visit_range(t, mode, k, v, b, hk, 0, r1, &mp, NULL, NULL); break;
    case MI_JOB_ASHAPE: visit_ashape_group(&t, 1, mode, k, v, job, hk); break;
    case MI_JOB_SPARSE: visit_sparse_group(&t, 1, mode, k, v, job, hk); break;
    }
}

/* Writes rows [r0, r0 + nr) of out (normalised) and lse [B, Hq, Lq] from the tile state; out and
 * lse hold the query rows only (absolute row r at r - q_off). */
static void tile_finish(mi_tile *t, mi_tensor *out, float *lse, int64_t b, int64_t h, int64_t Lq,
                        int64_t Hq) {
    const int64_t D = t->D, r0 = t->r0 - t->q_off;
    for (int64_t i = 0; i < t->nr; i++) {
        const float l = t->l[i];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t d = 0; d < D; d++) t->row[d] = t->ot[d * MI_BS + i] * inv;
        mi_cpu_store((void *)mi_cpu_row(out, b, h, r0 + i), out->dtype, t->row, D);
        if (lse) {
            lse[(b * Hq + h) * Lq + r0 + i] =
                l > 0.0f ? (t->m[i] + log2f(l)) * 0.6931471805599453f : -INFINITY;
        }
    }
}

static void zero_rows(mi_tensor *out, float *lse, int64_t b, int64_t h, int64_t r0, int64_t r1,
                      int64_t L, int64_t Hq) {
    const size_t bytes = (size_t)out->shape[3] * (out->dtype == MI_DTYPE_F32 ? 4 : 2);
    for (int64_t r = r0; r < r1; r++) {
        memset((void *)mi_cpu_row(out, b, h, r), 0, bytes);
        if (lse) lse[(b * Hq + h) * L + r] = -INFINITY;
    }
}

mi_status ENGINE(mi_cpu_run_jobs)(mi_context *ctx, const mi_attn_shape *s, const mi_tensor *q,
                                  const mi_tensor *k, const mi_tensor *v, const mi_attn_job *jobs,
                                  int64_t n_jobs, float scale, mi_tensor *out, float *lse) {
    /* Row blocks are aligned to absolute positions: with queries at an offset the first one, fb,
     * may start mid-block (at q_off); blocks before it hold no query. */
    const int64_t L = s->len, R = (L + MI_BS - 1) / MI_BS, off = s->q_off, fb = off / MI_BS;
    const int64_t NG = (R - fb + GROUP - 1) / GROUP, Lq = L - off;
    const int nt = ctx->n_threads > 0 ? ctx->n_threads : 1;
    mi_tile *tiles[nt * GROUP];
    for (int i = 0; i < nt * GROUP; i++) {
        tiles[i] = mi_cpu_tile_alloc(s->head_dim);
        if (!tiles[i]) {
            for (int j = 0; j < i; j++) mi_cpu_tile_free(tiles[j]);
            return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "cpu attention: out of memory");
        }
    }
    const float mul = scale * 1.4426950408889634f;
    const int64_t n_items = n_jobs * NG;
    /* Later row blocks see more keys: hand them out first so the dynamic schedule ends evenly. */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; it++) {
        mi_tile **t = tiles + omp_get_thread_num() * GROUP;
        const int64_t grp = NG - 1 - it / n_jobs;
        const mi_attn_job *job = &jobs[it % n_jobs];
        const int64_t hk = job->h / s->group;
        int n_live = 0;
        for (int g = 0; g < GROUP; g++) {
            const int64_t m0 = (fb + grp * GROUP + g) * MI_BS, r0 = mi_cpu_max64(m0, off);
            if (r0 >= L) break;
            const int64_t r1 = mi_cpu_min64(m0 + MI_BS, L);
            const int64_t nr = mi_cpu_max64(0, mi_cpu_min64(r1, job->len) - r0);
            zero_rows(out, lse, job->b, job->h, r0 + nr - off, r1 - off, Lq, s->heads_q);
            if (nr == 0) continue;
            tile_begin(t[n_live++], q, off, job->b, job->h, r0, nr, mul);
        }
        if (n_live > 0) {
            if (job->kind == MI_JOB_DENSE) {
                visit_dense_group(t, n_live, k, v, job->b, hk);
            } else if (job->kind == MI_JOB_ASHAPE) {
                visit_ashape_group(t, n_live, MODE_ATTN, k, v, job, hk);
            } else {
                visit_sparse_group(t, n_live, MODE_ATTN, k, v, job, hk);
            }
            for (int g = 0; g < n_live; g++)
                tile_finish(t[g], out, lse, job->b, job->h, Lq, s->heads_q);
        }
    }
    for (int i = 0; i < nt * GROUP; i++) mi_cpu_tile_free(tiles[i]);
    return MI_STATUS_SUCCESS;
}

/* Base-2 LSE of the rows from the (finished) online-softmax statistics. */
static void tile_lse2(mi_tile *t) {
    for (int i = 0; i < MI_BS; i++) {
        t->lse2[i] = t->l[i] > 0.0f ? t->m[i] + log2f(t->l[i]) : INFINITY;
    }
}

void ENGINE(mi_cpu_job_mass)(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                             const mi_tensor *k, const mi_attn_job *job, float scale, int64_t r0,
                             double *mass, double *visited) {
    const int64_t nr = mi_cpu_min64(MI_BS, job->len - r0);
    const int64_t hk = job->h / s->group;
    const mask_params dense = {0, INT64_MAX, INT64_MAX};
    tile_begin(t, q, s->q_off, job->b, job->h, r0, nr, scale * 1.4426950408889634f);
    visit_range(t, MODE_LSE, k, NULL, job->b, hk, 0, r0 + nr, &dense, NULL, NULL);
    tile_lse2(t);
    t->visited = 0.0;
    visit_job(t, MODE_MASS, k, NULL, job, hk);
    for (int64_t i = 0; i < nr; i++) mass[i] = t->acc[i];
    *visited += t->visited;
}

void ENGINE(mi_cpu_vs_sums)(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                            const mi_tensor *k, int64_t b, int64_t h, int64_t len, int64_t n,
                            float scale, float *vert, float *slash) {
    const int64_t hk = h / s->group;
    const mask_params causal = {0, INT64_MAX, INT64_MAX};
    for (int64_t c0 = len - n; c0 < len; c0 += MI_BS) {
        const int64_t nr = mi_cpu_min64(MI_BS, len - c0);
        tile_begin(t, q, s->q_off, b, h, c0, nr, scale * 1.4426950408889634f);
        visit_range(t, MODE_LSE, k, NULL, b, hk, 0, c0 + nr, &causal, NULL, NULL);
        tile_lse2(t);
        visit_range(t, MODE_VS, k, NULL, b, hk, 0, c0 + nr, &causal, vert, slash);
    }
}

void ENGINE(mi_cpu_block_scores)(mi_tile *t, int64_t D, const float *qp, int64_t nq,
                                 const float *kp, int64_t nk, float *sc) {
    memset(t->qt, 0, (size_t)D * MI_BS * sizeof(float));
    for (int64_t i = 0; i < nq; i++) {
        for (int64_t d = 0; d < D; d++) t->qt[d * MI_BS + i] = qp[i * D + d];
    }
    gemm((int)nk, D, kp, D, 1, t->qt, t->st, NULL);
    memcpy(sc, t->st, (size_t)nk * MI_BS * sizeof(float));
}
