/*
 * xattn_estimate.c: XAttention's block selection (docs/prefill-methods.md).
 *
 * With stride S, reshaped row r of the keys is K[rS], K[rS + 1], ..., K[rS + S - 1] side by side
 * (S * D values), and reshaped row r of the queries is Q[rS + S - 1], ..., Q[rS] (reversed), so
 * that their dot product is the sum of q.k over the antidiagonal of the S x S tile (r, r'). Each
 * reshaped query row takes a softmax (scale / S) over the reshaped keys r' <= r; the
 * probabilities summed over the 64 / S x 64 / S reshaped cells of 64-token blocks (m, n) give the
 * block mass A[m][n]. Row block m keeps block 0 and its diagonal block m, then the other blocks by
 * descending mass while the mass kept before each is below threshold / 1000 of the row's total
 * (the smallest such set that reaches the threshold); a threshold of 1000 keeps every block.
 * Positions past the sequence (and before q_off, for queries at an offset) enter as zero rows.
 */
#include "cpu_common.h"

#include <math.h>
#include <stdlib.h>

size_t mi_cpu_xattn_ws_floats(int64_t len, int64_t D, int32_t stride) {
    const size_t S = stride > 0 ? (size_t)stride : 1;
    const size_t nr = ((size_t)len + S - 1) / S + 2 * MI_BS; /* reshaped rows, with padding */
    const size_t nb = ((size_t)len + MI_BS - 1) / MI_BS + 1;
    /* QR and KR, the score rows of 64 reshaped queries, one 64 x 64 score tile, the block mass
     * (double) and a row block's candidates (16 bytes each) */
    return 2 * nr * S * (size_t)D + (size_t)MI_BS * nr + (size_t)MI_BS * MI_BS + 2 * (nb + 1) +
           4 * nb + 16;
}

typedef struct mi_cpu_cand {
    double v;
    int32_t j;
} mi_cpu_cand;

/* Descending mass, then ascending block: a strict order. */
static int by_mass(const void *a, const void *b) {
    const mi_cpu_cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->j > y->j) - (x->j < y->j);
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int32_t mi_cpu_threshold_select(const double *a, int64_t m, int32_t threshold, void *scratch,
                                int32_t *offs, int64_t max_blocks) {
    int32_t n = 0;
    if (threshold >= 1000 || m < 2) {
        for (int64_t j = 0; j <= m && n < max_blocks; j++) offs[n++] = (int32_t)(j * MI_BS);
        return n;
    }
    double total = 0.0;
    for (int64_t j = 0; j <= m; j++) total += a[j];
    const double need = total * (double)threshold / 1000.0;
    double kept = a[0] + a[m];
    offs[n++] = 0;
    if (n < max_blocks) offs[n++] = (int32_t)(m * MI_BS);
    mi_cpu_cand *c = scratch;
    int32_t nc = 0;
    for (int64_t j = 1; j < m; j++) c[nc++] = (mi_cpu_cand){a[j], (int32_t)j};
    qsort(c, (size_t)nc, sizeof *c, by_mass);
    for (int32_t i = 0; i < nc && kept < need && n < max_blocks; i++) {
        offs[n++] = c[i].j * MI_BS;
        kept += c[i].v;
    }
    qsort(offs, (size_t)n, sizeof *offs, cmp_i32);
    return n;
}

/* Reshaped rows of (b, hh) of t: out[r][u * D + d] = t[r * S + (rev ? S - 1 - u : u)][d] for
 * r < nr, positions from off (earlier ones, and those at or past len, as zeros). */
static void reshape(const mi_tensor *t, int64_t b, int64_t hh, int64_t off, int64_t len, int64_t D,
                    int64_t S, int64_t nr, bool rev, float *out) {
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t u = 0; u < S; u++) {
            const int64_t pos = r * S + (rev ? S - 1 - u : u);
            float *dst = out + (r * S + u) * D;
            if (pos < off || pos >= len) {
                for (int64_t d = 0; d < D; d++) dst[d] = 0.0f;
            } else {
                mi_cpu_load_f32(dst, mi_cpu_row(t, b, hh, pos - off), t->dtype, D, 1.0f);
            }
        }
    }
}

void mi_cpu_xattn_estimate_head(mi_tile *t, const mi_attn_shape *s, const mi_tensor *q,
                                const mi_tensor *k, int64_t b, int64_t h, int64_t len,
                                int64_t row_blocks, int32_t stride, int32_t threshold, float scale,
                                float *ws, int32_t *block_count, int32_t *block_offset,
                                int64_t max_blocks, int32_t *column_count, double *mass_out) {
    const int64_t D = s->head_dim, S = stride > 0 ? stride : 1, DS = D * S;
    const int64_t nb = (len + MI_BS - 1) / MI_BS, per = MI_BS / S; /* reshaped rows per block */
    const int64_t nr = nb * per;
    for (int64_t m = 0; m < row_blocks; m++) block_count[m] = column_count[m] = 0;
    if (nb <= 0 || max_blocks <= 0) return;
    const int64_t nrp = (nr + MI_BS - 1) / MI_BS * MI_BS;
    float *qr = ws, *kr = qr + nrp * DS, *rows = kr + nrp * DS, *sc = rows + MI_BS * nrp;
    double *mass = (double *)(sc + MI_BS * MI_BS);
    void *cand = mass + nb + 1;
    reshape(q, b, h, s->q_off, len, D, S, nr, true, qr);
    reshape(k, b, h / s->group, 0, len, D, S, nr, false, kr);
    const float mul = scale / (float)S;
    /* 64 reshaped query rows (64 / per row blocks) at a time, row blocks holding queries only */
    const int64_t first = (s->q_off / MI_BS) * per;
    for (int64_t r0 = first / MI_BS * MI_BS; r0 < nr; r0 += MI_BS) {
        const int64_t nq = mi_cpu_min64(MI_BS, nr - r0);
        for (int64_t n0 = 0; n0 < r0 + nq; n0 += MI_BS) {
            const int64_t nk = mi_cpu_min64(MI_BS, r0 + nq - n0);
            mi_cpu_block_scores(t, DS, qr + r0 * DS, nq, kr + n0 * DS, nk, sc);
            for (int64_t j = 0; j < nk; j++)
                for (int64_t i = 0; i < nq; i++) rows[i * nrp + n0 + j] = sc[j * MI_BS + i] * mul;
        }
        /* softmax of each reshaped row over r' <= r, summed into its row block's mass */
        for (int64_t m0 = r0 / per; m0 * per < r0 + nq; m0++) {
            if (m0 >= row_blocks || m0 * per < first) continue;
            for (int64_t n = 0; n <= m0; n++) mass[n] = 0.0;
            for (int64_t r = m0 * per; r < m0 * per + per; r++) {
                /* rows of padding only carry no query (the original zeroes them too) */
                if (r * S >= len || r * S + S - 1 < s->q_off) continue;
                float *row = rows + (r - r0) * nrp;
                float mx = -INFINITY;
                for (int64_t j = 0; j <= r; j++) mx = row[j] > mx ? row[j] : mx;
                double sum = 0.0;
                for (int64_t j = 0; j <= r; j++) sum += (row[j] = expf(row[j] - mx));
                const double inv = 1.0 / sum;
                for (int64_t n = 0; n * per <= r; n++) {
                    float part = 0.0f;
                    const int64_t j1 = mi_cpu_min64(n * per + per, r + 1);
                    for (int64_t j = n * per; j < j1; j++) part += row[j];
                    mass[n] += (double)part * inv;
                }
            }
            if (mass_out)
                for (int64_t n = 0; n <= m0; n++) mass_out[m0 * nb + n] = mass[n];
            block_count[m0] = mi_cpu_threshold_select(mass, m0, threshold, cand,
                                                      block_offset + m0 * max_blocks, max_blocks);
        }
    }
}
