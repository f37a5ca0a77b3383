/*
 * flex_estimate.cu: FlexPrefill's block selection on the GPU (the rule and its CPU reference:
 * src/cpu/flex_estimate.c; the method: docs/prefill-methods.md). Per (b, h):
 *   1. the vertical-slash estimate's score passes (vs_estimate.cu) sum the probabilities of the
 *      last min(64, len - q_off) queries per key and per diagonal;
 *   2. fx_pool_k_kernel / fx_pool_q_kernel: 64-token means of the keys (per KV head), of the
 *      queries per row block and of the last queries (both times the softmax scale);
 *   3. fx_decide_kernel, one CTA per head: block sums of both distributions, the token budgets
 *      reaching gamma (a binary search on the values' bits), the Jensen-Shannon decision, then
 *      the top vertical and slash blocks (equal sums: lower block first) marked;
 *   4. query-aware heads only: fx_aware_kernel, one CTA per row block, the row's softmaxed
 *      pooled scores into [R][R] scratch; fx_cut_kernel, one CTA per head, the smallest kept
 *      value and how many of its ties (in row order) the cumulative threshold takes;
 *   5. fx_index_kernel, one CTA per row block: the kept blocks, ascending, into the index.
 * As many heads as the scratch holds go per launch. Sums, ties and orders follow the
 * reference; only the rounding of dot products and sums differs.
 * Entry points: mi_cuda_flex_scratch_bytes, mi_cuda_flex_estimate_run.
 */
#include "cta_reduce.cuh"
#include "cuda_common.cuh"

#include <math.h>
#include <string.h>

namespace mi_cuda {

constexpr int FX_NT = 1024;    /* per-head kernels */
constexpr int FX_ROW_NT = 256; /* per-row-block kernels */
constexpr int FX_MAX_PAIRS = 64;
/* the query-aware probabilities of one launch stay within this (one pair at least) */
constexpr size_t FX_PROB_BUDGET = (size_t)256 << 20;
/* info words per pair: state (0 nothing, 1 estimated, 2 every block), query-aware, the cut's
 * value bits, the ties at the cut it keeps */
constexpr int FX_INFO = 4;
constexpr uint32_t FX_INF_BITS = 0x7f800000u;

struct fx_params {
    const void *q, *k;
    int64_t q_stride[3], k_stride[3];
    int32_t heads, heads_kv, group, head_dim, q_off, row_blocks, len_pitch;
    int32_t dense_below;
    float scale;
    const float *vert, *slash; /* [B H][len_pitch] (slash by len - 1 - distance) */
    float *kpool;              /* [B][Hk][R][D] */
    float *qpool;              /* [pairs][R][D], times scale */
    float *qlast;              /* [pairs][D], times scale */
    double *vsb;               /* [pairs][2][R]: vertical, slash block sums */
    double *avg;               /* [pairs][R] */
    float *prob;               /* [pairs][R][R] */
    uint8_t *mark;             /* [pairs][R]: bit 0 vertical block, bit 1 slash distance */
    int32_t *tie_before;       /* [pairs][R] */
    int32_t *info;             /* [pairs][FX_INFO] */
    int32_t *block_count, *block_offset, *column_count;
    int32_t max_blocks;
    int32_t n_pairs;
    int16_t pair_b[FX_MAX_PAIRS], pair_h[FX_MAX_PAIRS];
    int32_t len[FX_MAX_PAIRS], gamma[FX_MAX_PAIRS], tau[FX_MAX_PAIRS];
    int32_t seq_lens[MI_CUDA_MAX_BATCH];
};

/* Order-keeping unsigned key of a float (larger float, larger key) and back. */
__device__ __forceinline__ uint32_t fx_key(float v) {
    const uint32_t u = __float_as_uint(v);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}
__device__ __forceinline__ float fx_unkey(uint32_t k) {
    return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

/* a . b over D floats, eight running sums as the reference's mi_cpu_dot8 */
__device__ __forceinline__ float fx_dot(const float *a, const float *b, int D) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int d = 0; d < D; d += 8) {
        const float4 x0 = *reinterpret_cast<const float4 *>(a + d);
        const float4 x1 = *reinterpret_cast<const float4 *>(a + d + 4);
        const float4 y0 = *reinterpret_cast<const float4 *>(b + d);
        const float4 y1 = *reinterpret_cast<const float4 *>(b + d + 4);
        acc[0] = fmaf(x0.x, y0.x, acc[0]);
        acc[1] = fmaf(x0.y, y0.y, acc[1]);
        acc[2] = fmaf(x0.z, y0.z, acc[2]);
        acc[3] = fmaf(x0.w, y0.w, acc[3]);
        acc[4] = fmaf(x1.x, y1.x, acc[4]);
        acc[5] = fmaf(x1.y, y1.y, acc[5]);
        acc[6] = fmaf(x1.z, y1.z, acc[6]);
        acc[7] = fmaf(x1.w, y1.w, acc[7]);
    }
    float s = 0.f;
    for (int u = 0; u < 8; u++) s += acc[u];
    return s;
}

__device__ __forceinline__ const float *fx_kpool(const fx_params &p, int b, int h) {
    return p.kpool + ((size_t)b * p.heads_kv + h / p.group) * p.row_blocks * p.head_dim;
}

/* Mean of rows [r0, r1) of one (b, head) of t (rows from off on), times mul: thread d, dim d,
 * summed in row order as the reference. */
template <typename T>
__device__ __forceinline__ float fx_mean_rows(const T *t, int64_t pitch, int off, int r0, int r1,
                                              float mul) {
    float acc = 0.f;
    for (int r = r0; r < r1; r++)
        acc += dtype_traits<T>::to_float(t[(int64_t)(r - off) * pitch + threadIdx.x]);
    return acc * __fdiv_rn(mul, (float)(r1 - r0));
}

template <typename T> __global__ void fx_pool_k_kernel(const __grid_constant__ fx_params p) {
    const int n = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, len = p.seq_lens[b];
    if (n * 64 >= len) return;
    const T *kb = static_cast<const T *>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
    const float v = fx_mean_rows(kb, p.k_stride[2], 0, n * 64, min(n * 64 + 64, len), 1.f);
    p.kpool[(((size_t)b * p.heads_kv + hk) * p.row_blocks + n) * p.head_dim + threadIdx.x] = v;
}

/* blockIdx.x < R: row block m's mean query; R: the last queries' mean */
template <typename T> __global__ void fx_pool_q_kernel(const __grid_constant__ fx_params p) {
    const int pi = blockIdx.y, m = blockIdx.x, len = p.len[pi];
    const int b = p.pair_b[pi], h = p.pair_h[pi];
    const T *qb = static_cast<const T *>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    if (len < p.dense_below || len - p.q_off <= 0) return;
    if (m == p.row_blocks) {
        const int n_last = min(64, len - p.q_off);
        p.qlast[(size_t)pi * p.head_dim + threadIdx.x] =
            fx_mean_rows(qb, p.q_stride[2], p.q_off, len - n_last, len, p.scale);
        return;
    }
    if (m * 64 >= len || m < p.q_off / 64) return;
    p.qpool[((size_t)pi * p.row_blocks + m) * p.head_dim + threadIdx.x] = fx_mean_rows(
        qb, p.q_stride[2], p.q_off, max(m * 64, p.q_off), min(m * 64 + 64, len), p.scale);
}

struct fx_shared {
    double red[FX_NT / 32];
    uint32_t redu[FX_NT / 32];
    int64_t redc[FX_NT / 32];
    int scan[FX_NT + 1];
};

/* The reference's cover_count: the fewest of x[0..n) * inv (sorted descending) whose running
 * sum exceeds gamma, i.e. the count whose sum stays within it, plus one. u: the smallest value
 * bits whose values at or above it sum to at most gamma; then as many of the next value as fit. */
__device__ int64_t fx_cover_count(const float *x, int n, float inv, double gamma, fx_shared &sh) {
    uint32_t lo = 0, hi = FX_INF_BITS;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        double s = 0.0;
        for (int j = threadIdx.x; j < n; j += FX_NT) {
            const float v = __fmul_rn(x[j], inv);
            if (__float_as_uint(v) >= mid) s += v;
        }
        if (cta_sum<FX_NT>(s, sh.red) <= gamma)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo == 0) return (int64_t)n + 1;
    double s = 0.0;
    int64_t c = 0;
    uint32_t below = 0;
    for (int j = threadIdx.x; j < n; j += FX_NT) {
        const float v = __fmul_rn(x[j], inv);
        const uint32_t u = __float_as_uint(v);
        if (u >= lo)
            s += v, c++;
        else
            below = max(below, u);
    }
    const double in = cta_sum<FX_NT>(s, sh.red);
    const int64_t above = cta_count<FX_NT>(c, sh.redc);
    below = cta_max<FX_NT>(below, sh.redu);
    int64_t ties = 0;
    for (int j = threadIdx.x; j < n; j += FX_NT)
        ties += __float_as_uint(__fmul_rn(x[j], inv)) == below;
    ties = cta_count<FX_NT>(ties, sh.redc);
    const float bv = __uint_as_float(below);
    int64_t fit = ties;
    if (bv > 0.f) {
        const double r = floor((gamma - in) / (double)bv);
        fit = r<0.0 ? 0 : r>(double) ties ? ties : (int64_t)r;
    }
    return above + fit + 1;
}

/* Marks (bit) the k largest of val[0..nb) (block 0 counting as +inf; equal values: lower index
 * first). Thread t owns blocks [t span, (t + 1) span). */
__device__ void fx_mark_top(const double *val, int nb, int k, uint8_t bit, uint8_t *mark,
                            fx_shared &sh) {
    const int span = (nb + FX_NT - 1) / FX_NT, j0 = threadIdx.x * span, j1 = min(j0 + span, nb);
    auto key = [&](int j) { return j == 0 ? FX_INF_BITS : __float_as_uint((float)val[j]); };
    /* t: the largest bits with at least k values at or above */
    uint32_t lo = 0, hi = FX_INF_BITS;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        int64_t c = 0;
        for (int j = j0; j < j1; j++) c += key(j) >= mid;
        if (cta_count<FX_NT>(c, sh.redc) >= k)
            lo = mid;
        else
            hi = mid - 1;
    }
    int64_t gt = 0;
    int ties = 0;
    for (int j = j0; j < j1; j++) gt += key(j) > lo, ties += key(j) == lo;
    const int64_t need = k - cta_count<FX_NT>(gt, sh.redc);
    int rank = 0;
    cta_scan<FX_NT>(ties, sh.scan, &rank);
    for (int j = j0; j < j1; j++) {
        const uint32_t u = key(j);
        const bool tie = u == lo;
        if (u > lo || (tie && rank < need)) mark[j] |= bit;
        rank += tie;
    }
}

__global__ void __launch_bounds__(FX_NT) fx_decide_kernel(const __grid_constant__ fx_params p) {
    __shared__ fx_shared sh;
    const int pi = blockIdx.x, tid = threadIdx.x, R = p.row_blocks, D = p.head_dim;
    const int b = p.pair_b[pi], h = p.pair_h[pi], len = p.len[pi];
    const int nb = (len + 63) / 64, n_last = min(64, len - p.q_off);
    int32_t *info = p.info + pi * FX_INFO;
    uint8_t *mark = p.mark + (size_t)pi * R;
    const int span = (R + FX_NT - 1) / FX_NT, j0 = tid * span, j1 = min(j0 + span, R);
    for (int j = j0; j < j1; j++) mark[j] = 0;
    const int state = len <= 0 || len < p.dense_below      ? 0
                      : p.gamma[pi] >= 1000 || n_last <= 0 ? 2
                                                           : 1;
    if (tid == 0) info[0] = state, info[1] = 0;
    if (state != 1) return;
    const size_t bh = (size_t)b * p.heads + h;
    const float *vert = p.vert + bh * p.len_pitch, *slash = p.slash + bh * p.len_pitch;
    const float inv = __frcp_rn((float)n_last);
    const double gamma = (double)p.gamma[pi] / 1000.0;
    double *vb = p.vsb + (size_t)pi * 2 * R, *sb = vb + R;
    for (int n = tid; n < nb; n += FX_NT) {
        double a = 0.0, c = 0.0;
        for (int j = n * 64; j < min(n * 64 + 64, len); j++) {
            a += __fmul_rn(vert[j], inv);
            c += __fmul_rn(slash[len - 1 - j], inv);
        }
        vb[n] = a;
        sb[n] = c;
    }
    int64_t nv = fx_cover_count(vert, len, inv, gamma, sh) / 64 + 1;
    int64_t ns = fx_cover_count(slash, len, inv, gamma, sh) / 64 + 1;
    /* the decision: the last queries' mean against the key blocks' means, softmaxed, vs vb */
    const float *kp = fx_kpool(p, b, h), *qm = p.qlast + (size_t)pi * D;
    double *avg = p.avg + (size_t)pi * R;
    uint32_t mk = 0;
    for (int n = tid; n < nb; n += FX_NT) {
        const float d = fx_dot(qm, kp + (size_t)n * D, D);
        avg[n] = d;
        mk = max(mk, fx_key(d));
    }
    const double mx = fx_unkey(cta_max<FX_NT>(mk, sh.redu));
    double s = 0.0;
    for (int n = tid; n < nb; n += FX_NT) s += (avg[n] = exp(avg[n] - mx));
    const double sum = cta_sum<FX_NT>(s, sh.red);
    double js = 0.0;
    for (int n = tid; n < nb; n += FX_NT) {
        const double a = avg[n] / sum, v = vb[n], m = 0.5 * (a + v);
        if (a > 0.0) js += 0.5 * a * log(a / m);
        if (v > 0.0) js += 0.5 * v * log(v / m);
    }
    js = cta_sum<FX_NT>(js, sh.red);
    const bool aware = sqrt(js > 0.0 ? js : 0.0) < (double)p.tau[pi] / 1000.0;
    if (aware) nv = ns = 1;
    nv = min(nv, (int64_t)nb);
    ns = min(ns, (int64_t)nb);
    fx_mark_top(vb, nb, (int)nv, 1, mark, sh);
    fx_mark_top(sb, nb, (int)ns, 2, mark, sh);
    if (tid == 0) info[1] = aware;
}

/* Row block m of a query-aware head: softmax over blocks n <= m of its pooled scores. */
__global__ void __launch_bounds__(FX_ROW_NT) fx_aware_kernel(const __grid_constant__ fx_params p) {
    __shared__ __align__(16) float qs[128];
    __shared__ double red[FX_ROW_NT / 32];
    __shared__ uint32_t redu[FX_ROW_NT / 32];
    const int pi = blockIdx.y, m = blockIdx.x, tid = threadIdx.x, D = p.head_dim, R = p.row_blocks;
    const int32_t *info = p.info + pi * FX_INFO;
    const int len = p.len[pi], nb = (len + 63) / 64;
    if (info[0] != 1 || !info[1] || m >= nb || m < p.q_off / 64) return;
    for (int d = tid; d < D; d += FX_ROW_NT) qs[d] = p.qpool[((size_t)pi * R + m) * D + d];
    __syncthreads();
    const float *kp = fx_kpool(p, p.pair_b[pi], p.pair_h[pi]);
    float *row = p.prob + ((size_t)pi * R + m) * R;
    uint32_t mk = 0;
    for (int n = tid; n <= m; n += FX_ROW_NT) {
        const float d = fx_dot(qs, kp + (size_t)n * D, D);
        row[n] = d;
        mk = max(mk, fx_key(d));
    }
    const float rm = fx_unkey(cta_max<FX_ROW_NT>(mk, redu));
    double s = 0.0;
    for (int n = tid; n <= m; n += FX_ROW_NT) s += (row[n] = (float)exp((double)(row[n] - rm)));
    const double rs = cta_sum<FX_ROW_NT>(s, red);
    for (int n = tid; n <= m; n += FX_ROW_NT) row[n] = (float)((double)row[n] / rs);
}

/* A query-aware head's cut: the pairs by descending probability (equal ones in row order) kept
 * until their sum reaches gamma times the rows. info[2]: the smallest kept value's bits,
 * info[3]: how many pairs of exactly that value are kept; tie_before[m]: such pairs in rows
 * before m. */
__global__ void __launch_bounds__(FX_NT) fx_cut_kernel(const __grid_constant__ fx_params p) {
    __shared__ fx_shared sh;
    const int pi = blockIdx.x, tid = threadIdx.x, R = p.row_blocks;
    int32_t *info = p.info + pi * FX_INFO;
    if (info[0] != 1 || !info[1]) return;
    const int len = p.len[pi], nb = (len + 63) / 64, m0 = p.q_off / 64;
    const float *prob = p.prob + (size_t)pi * R * R;
    const double need = (double)p.gamma[pi] / 1000.0 * (double)(nb - m0);
    auto above = [&](uint32_t u, bool strict) {
        double s = 0.0;
        for (int m = m0; m < nb; m++)
            for (int n = tid; n <= m; n += FX_NT) {
                const float v = prob[(size_t)m * R + n];
                const uint32_t b = __float_as_uint(v);
                if (strict ? b > u : b >= u) s += v;
            }
        return cta_sum<FX_NT>(s, sh.red);
    };
    /* the largest bits whose values at or above sum to need; none: every pair */
    uint32_t lo = 0, hi = FX_INF_BITS;
    const bool every = above(0, false) < need;
    while (!every && lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        if (above(mid, false) >= need)
            lo = mid;
        else
            hi = mid - 1;
    }
    const uint32_t cut = every ? 0u : lo;
    /* ties per thread's rows (contiguous, for row order), then their prefix */
    const int rows = nb - m0, span = (rows + FX_NT - 1) / FX_NT;
    const int r0 = m0 + tid * span, r1 = min(r0 + span, nb);
    int ties = 0;
    for (int m = r0; m < r1; m++)
        for (int n = 0; n <= m; n++) ties += __float_as_uint(prob[(size_t)m * R + n]) == cut;
    int before = 0;
    const int tie_total = cta_scan<FX_NT>(ties, sh.scan, &before);
    int32_t *tb = p.tie_before + (size_t)pi * R;
    for (int m = r0; m < r1; m++) {
        tb[m] = before;
        for (int n = 0; n <= m; n++) before += __float_as_uint(prob[(size_t)m * R + n]) == cut;
    }
    const double kept = every ? 0.0 : above(cut, true);
    const float cv = __uint_as_float(cut);
    int take = tie_total;
    if (!every && cv > 0.f) {
        const double r = ceil((need - kept) / (double)cv);
        take = r<1.0 ? 1 : r>(double) tie_total ? tie_total : (int)r;
    }
    if (tid == 0) info[2] = (int32_t)cut, info[3] = take;
}

__global__ void __launch_bounds__(FX_ROW_NT) fx_index_kernel(const __grid_constant__ fx_params p) {
    __shared__ int scan[FX_ROW_NT + 1];
    const int pi = blockIdx.y, m = blockIdx.x, tid = threadIdx.x, R = p.row_blocks;
    const int b = p.pair_b[pi], h = p.pair_h[pi], len = p.len[pi], nb = (len + 63) / 64;
    const size_t row = ((size_t)b * p.heads + h) * R + m;
    const int32_t *info = p.info + pi * FX_INFO;
    if (tid == 0) p.column_count[row] = 0;
    if (info[0] == 0 || m >= nb || m < p.q_off / 64) {
        if (tid == 0) p.block_count[row] = 0;
        return;
    }
    const bool all = info[0] == 2, aware = !all && info[1];
    const uint32_t cut = aware ? (uint32_t)info[2] : 0u;
    const int take = aware ? info[3] : 0;
    const uint8_t *mark = p.mark + (size_t)pi * R;
    const float *prow = p.prob + ((size_t)pi * R + m) * R;
    const int span = (m + 1 + FX_ROW_NT - 1) / FX_ROW_NT, j0 = tid * span,
              j1 = min(j0 + span, m + 1);
    int ties = 0;
    if (aware)
        for (int j = j0; j < j1; j++) ties += __float_as_uint(prow[j]) == cut;
    int rank = 0;
    cta_scan<FX_ROW_NT>(ties, scan, &rank);
    if (aware) rank += p.tie_before[(size_t)pi * R + m];
    auto keep = [&](int j, int &r) {
        bool k = all || (mark[j] & 1) || (mark[m - j] & 2);
        if (aware) {
            const uint32_t u = __float_as_uint(prow[j]);
            const bool tie = u == cut;
            k = k || u > cut || (tie && r < take);
            r += tie;
        }
        return k;
    };
    int count = 0, r = rank;
    for (int j = j0; j < j1; j++) count += keep(j, r);
    int at = 0;
    const int n = cta_scan<FX_ROW_NT>(count, scan, &at);
    int32_t *out = p.block_offset + row * p.max_blocks;
    r = rank;
    for (int j = j0; j < j1; j++)
        if (keep(j, r) && at < p.max_blocks) out[at++] = j * 64;
    if (tid == 0) p.block_count[row] = min(n, p.max_blocks);
}

size_t fx_al(size_t x) { return (x + 255) & ~(size_t)255; }

/* Scratch: the score sums, the pooled keys, then per pair of a launch its own parts. */
struct fx_layout {
    size_t sums, kpool, fixed;
    size_t qpool, qlast, vsb, avg, prob, mark, tie, info, per_pair;
};

fx_layout fx_layout_of(int64_t B, int64_t H, int64_t Hk, int64_t L, int64_t D) {
    fx_layout lo;
    const size_t R = (size_t)((L + 63) / 64);
    lo.sums = fx_al(mi_cuda_vs_sums_bytes(B, H, L));
    lo.kpool = fx_al((size_t)(B * Hk) * R * (size_t)D * sizeof(float));
    lo.fixed = lo.sums + lo.kpool;
    lo.qpool = fx_al(R * (size_t)D * sizeof(float));
    lo.qlast = fx_al((size_t)D * sizeof(float));
    lo.vsb = fx_al(2 * R * sizeof(double));
    lo.avg = fx_al(R * sizeof(double));
    lo.prob = fx_al(R * R * sizeof(float));
    lo.mark = fx_al(R);
    lo.tie = fx_al(R * sizeof(int32_t));
    lo.info = fx_al(FX_INFO * sizeof(int32_t));
    lo.per_pair = lo.qpool + lo.qlast + lo.vsb + lo.avg + lo.prob + lo.mark + lo.tie + lo.info;
    return lo;
}

} // namespace mi_cuda

using namespace mi_cuda;

extern "C" size_t mi_cuda_flex_scratch_bytes(int64_t batch, int64_t heads, int64_t heads_kv,
                                             int64_t len, int64_t head_dim) {
    const fx_layout lo = fx_layout_of(batch, heads, heads_kv, len, head_dim);
    int64_t n = (int64_t)(FX_PROB_BUDGET / lo.prob);
    if (n > batch * heads) n = batch * heads;
    if (n > FX_MAX_PAIRS) n = FX_MAX_PAIRS;
    if (n < 1) n = 1;
    return lo.fixed + (size_t)n * lo.per_pair;
}

extern "C" mi_status mi_cuda_flex_estimate_run(mi_context *ctx, const mi_attn_shape *s,
                                               const mi_tensor *q, const mi_tensor *k,
                                               const int32_t *seq_lens, const int32_t *gamma,
                                               const int32_t *tau, float scale,
                                               const uint8_t *active, int32_t dense_below,
                                               void *scratch, size_t scratch_bytes,
                                               mi_sparse_index *index) {
    mi_cuda_attn_params ap;
    mi_status st =
        mi_cuda_fill_attn_params(ctx, s, q, k, nullptr, nullptr, seq_lens, scale, nullptr, &ap);
    if (st != MI_STATUS_SUCCESS) return st;
    const int64_t R = (s->len + 63) / 64, D = s->head_dim;
    if (index->row_blocks != R || index->max_blocks < R)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "FlexPrefill estimate: the index needs %lld row blocks of up to %lld blocks",
                       (long long)R, (long long)R);
    const fx_layout lo = fx_layout_of(s->batch, s->heads_q, s->heads_kv, s->len, D);
    if (scratch_bytes < lo.fixed + lo.per_pair)
        return mi_fail(ctx, MI_STATUS_WORKSPACE_TOO_SMALL,
                       "FlexPrefill estimate: scratch of %zu bytes, needs %zu", scratch_bytes,
                       lo.fixed + lo.per_pair);
    int64_t cap = (int64_t)((scratch_bytes - lo.fixed) / lo.per_pair);
    if (cap > FX_MAX_PAIRS) cap = FX_MAX_PAIRS;
    if (s->len <= 0) return MI_STATUS_SUCCESS;
    /* heads that keep every block (gamma >= 1000) never read the sums: not scored */
    uint8_t scored[MI_CUDA_MAX_HEADS];
    for (int64_t h = 0; h < s->heads_q; h++) scored[h] = (!active || active[h]) && gamma[h] < 1000;
    const float *vert = nullptr, *slash = nullptr;
    st = mi_cuda_vs_sums_run(ctx, s, q, k, seq_lens, scale, scored, dense_below, scratch, &vert,
                             &slash);
    if (st != MI_STATUS_SUCCESS) return st;

    fx_params p;
    memset(&p, 0, sizeof(p));
    p.q = q->data;
    p.k = k->data;
    for (int i = 0; i < 3; i++) p.q_stride[i] = q->stride[i], p.k_stride[i] = k->stride[i];
    p.heads = (int32_t)s->heads_q;
    p.heads_kv = (int32_t)s->heads_kv;
    p.group = (int32_t)s->group;
    p.head_dim = (int32_t)D;
    p.q_off = (int32_t)s->q_off;
    p.row_blocks = (int32_t)R;
    p.len_pitch = (int32_t)s->len;
    p.dense_below = dense_below;
    p.scale = scale;
    p.vert = vert;
    p.slash = slash;
    char *w = static_cast<char *>(scratch);
    p.kpool = reinterpret_cast<float *>(w + lo.sums);
    char *g = w + lo.fixed; /* the launch's pairs, part by part */
    p.qpool = reinterpret_cast<float *>(g), g += cap * lo.qpool;
    p.qlast = reinterpret_cast<float *>(g), g += cap * lo.qlast;
    p.vsb = reinterpret_cast<double *>(g), g += cap * lo.vsb;
    p.avg = reinterpret_cast<double *>(g), g += cap * lo.avg;
    p.prob = reinterpret_cast<float *>(g), g += cap * lo.prob;
    p.mark = reinterpret_cast<uint8_t *>(g), g += cap * lo.mark;
    p.tie_before = reinterpret_cast<int32_t *>(g), g += cap * lo.tie;
    p.info = reinterpret_cast<int32_t *>(g);
    p.block_count = index->block_count;
    p.block_offset = index->block_offset;
    p.column_count = index->column_count;
    p.max_blocks = index->max_blocks;
    memcpy(p.seq_lens, ap.seq_lens, sizeof(p.seq_lens));

    cudaStream_t stream = mi_stream(ctx);
    const bool bf = s->dtype == MI_DTYPE_BF16;
    const dim3 kgrid((unsigned)R, (unsigned)s->heads_kv, (unsigned)s->batch);
    if (bf)
        fx_pool_k_kernel<__nv_bfloat16><<<kgrid, (unsigned)D, 0, stream>>>(p);
    else
        fx_pool_k_kernel<__half><<<kgrid, (unsigned)D, 0, stream>>>(p);
    cudaError_t e = cudaGetLastError();
    auto flush = [&]() {
        const unsigned P = (unsigned)p.n_pairs;
        if (bf)
            fx_pool_q_kernel<__nv_bfloat16>
                <<<dim3((unsigned)R + 1, P), (unsigned)D, 0, stream>>>(p);
        else
            fx_pool_q_kernel<__half><<<dim3((unsigned)R + 1, P), (unsigned)D, 0, stream>>>(p);
        fx_decide_kernel<<<P, FX_NT, 0, stream>>>(p);
        fx_aware_kernel<<<dim3((unsigned)R, P), FX_ROW_NT, 0, stream>>>(p);
        fx_cut_kernel<<<P, FX_NT, 0, stream>>>(p);
        fx_index_kernel<<<dim3((unsigned)R, P), FX_ROW_NT, 0, stream>>>(p);
        p.n_pairs = 0;
        return cudaGetLastError();
    };
    for (int64_t b = 0; b < s->batch && e == cudaSuccess; b++) {
        for (int64_t h = 0; h < s->heads_q && e == cudaSuccess; h++) {
            if (active && !active[h]) continue;
            const int i = p.n_pairs++;
            p.pair_b[i] = (int16_t)b;
            p.pair_h[i] = (int16_t)h;
            p.len[i] = ap.seq_lens[b];
            p.gamma[i] = gamma[h];
            p.tau[i] = tau[h];
            if (p.n_pairs == cap) e = flush();
        }
    }
    if (e == cudaSuccess && p.n_pairs > 0) e = flush();
    if (e != cudaSuccess)
        return mi_fail(ctx, MI_STATUS_DEVICE_ERROR, "CUDA FlexPrefill estimate: %s",
                       cudaGetErrorString(e));
    return MI_STATUS_SUCCESS;
}
