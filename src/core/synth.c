/*
 * synth.c: seeded synthetic q/k/v whose dense causal attention looks like a real long-context head:
 * attention sinks, a local band, slash lines at chosen distances, vertical heavy-hitter columns
 * and retrieval needles.
 *
 * Design (logits are q.k / sqrt(D); every component below lives in its own dimensions of D, so
 * components do not leak into each other):
 *
 *  - Background: Gaussian q and k entries in the leftover dimensions, logit std 0.5 * noise.
 *
 *  - Toeplitz part (a function of the distance x = i - j only), built like RoPE: a pair of
 *    dimensions rotated by t * theta at position t gives q_i . k_j = c * cos((i - j) * theta).
 *    The local band is one kernel K_l(x) = sum_m lambda_m cos(x theta_m) over M_l pairs with
 *    frequencies of order 1 / local_window: it peaks at x = 0 and decays over the window. Away
 *    from its peak the kernel is a sum of cosines with unrelated phases; its mass there is a
 *    product of per-pair factors e^-lambda I0(lambda), so it falls exponentially with the number
 *    of pairs, which is what makes the band stand out at any length. The amplitude is moderate
 *    on purpose: the far field has logit std Lambda / sqrt(2M), and a large one would drown
 *    everything else.
 *
 *  - Slash lines use position codes, not kernels: every ordinary key j carries a random unit
 *    vector h(j) (m random signs, drawn from a stream seeded by j), and query i carries
 *    sum_s A_s(i) h(i - d_s). Then q_i . k_j is exactly A_s(i) on each line j = i - d_s and
 *    zero-mean noise of std sqrt(sum_s A_s^2 / m) elsewhere. The leftover is unstructured noise,
 *    not a second Toeplitz field: a rotation kernel per slash would add its own far field to
 *    every diagonal, and a few of them together bury both the lines and the local band.
 *
 *  - Exact components: one dimension each for sinks and verticals, a small subspace for needles.
 *    Only the planted keys carry these dimensions (and carry no Toeplitz part or code), so every
 *    other key scores exactly 0 there.
 *
 *  - Calibration: the mass of a row's ordinary keys is known exactly (a prefix sum of e^K_l), so
 *    the query's coefficients are set per row to give each component a fixed share of the row at
 *    any length: relative to the ordinary keys, sinks 2, verticals 0.25, each slash line 0.1 (times
 *    e^(strength - 6)); a needle takes about 80% of its row. A constant logit boost cannot do
 *    that: at 1M keys the background alone weighs 10^6.
 *
 * Cost: O(B * H * L * D), about one logarithm per two random entries; single-threaded,
 * deterministic given the seed (every (batch, head, tensor) draws from its own stream).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Random numbers: splitmix64 seeds xoshiro256**; Marsaglia's polar method for normals.      */

typedef struct rng {
    uint64_t s[4];
    double spare;
    bool has_spare;
} rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = seed;
    /* Mix the stream coordinates in so that streams are independent, not shifted copies. */
    x ^= splitmix64(&a) + 0x632be59bd9b4e019ull;
    x ^= splitmix64(&b) * 3;
    x ^= splitmix64(&c) * 5;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
    r->has_spare = false;
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1). */
static double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* Uniform integer in [lo, hi] (hi >= lo). */
static int64_t rng_range(rng *r, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int64_t)(rng_next(r) % span);
}

/* Marsaglia's polar form of Box-Muller: no trigonometry, two normals per accepted pair. */
static double rng_normal(rng *r) {
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    double u, v, s;
    do {
        u = 2.0 * rng_uniform(r) - 1.0;
        v = 2.0 * rng_uniform(r) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = sqrt(-2.0 * log(s) / s);
    r->spare = v * f;
    r->has_spare = true;
    return u * f;
}

/* ------------------------------------------------------------------------------------------ */
/* Parameters                                                                                  */

#define SYNTH_MAX_PAIRS 16

mi_synth_params mi_synth_default_params(void) {
    mi_synth_params p;
    memset(&p, 0, sizeof p);
    p.seed = 1234;
    p.n_sinks = 4;
    p.n_verticals = 16;
    p.n_slashes = 4;
    p.slash_distances = NULL;
    p.local_window = 512;
    p.n_needles = 4;
    p.strength = 6.0f;
    p.noise = 1.0f;
    return p;
}

/* Dimension layout of one head. */
typedef struct layout {
    int d_sink, d_vert;     /* one dimension each (-1: absent) */
    int d_needle, n_needle; /* needle subspace */
    int d_local, m_local;   /* local kernel: m_local pairs */
    int d_code, m_code;     /* slash position codes */
    int d_bg, n_bg;         /* background */
} layout;

static void make_layout(int64_t D, int n_slashes, layout *lo) {
    int next = 0;
    memset(lo, 0, sizeof *lo);
    lo->d_sink = lo->d_vert = -1;
    if (D >= 4) {
        lo->d_sink = next++;
        lo->d_vert = next++;
    }
    lo->n_needle = D >= 32 ? 4 : (D >= 8 ? 1 : 0);
    lo->d_needle = next;
    next += lo->n_needle;
    /* Keep an eighth of D (at least 2) for the random background. */
    int budget = (int)D - next - (int)(D / 8 > 2 ? D / 8 : 2);
    if (budget < 0) budget = 0;
    lo->m_local = budget / 2 < 8 ? budget / 2 : 8;
    if (D < 128 && lo->m_local > 6) lo->m_local = 6;
    lo->d_local = next;
    next += 2 * lo->m_local;
    budget -= 2 * lo->m_local;
    /* The codes take what is left: the code noise falls as 1 / sqrt(m). */
    lo->d_code = next;
    lo->m_code = n_slashes > 0 && budget >= 2 ? budget : 0;
    next += lo->m_code;
    lo->d_bg = next;
    lo->n_bg = (int)D - next;
}

/* cos / sin of t * theta for consecutive t by rotation, recomputed exactly every 64 steps so
 * that rounding cannot accumulate (sincos of large arguments was most of the cost). */
typedef struct rotor {
    double c[SYNTH_MAX_PAIRS], s[SYNTH_MAX_PAIRS];   /* at position t */
    double dc[SYNTH_MAX_PAIRS], ds[SYNTH_MAX_PAIRS]; /* one step */
    int64_t t;
} rotor;

static void rotor_set(rotor *ro, const double *theta, int n, int64_t t) {
    for (int m = 0; m < n; m++) {
        ro->c[m] = cos((double)t * theta[m]);
        ro->s[m] = sin((double)t * theta[m]);
        ro->dc[m] = cos(theta[m]);
        ro->ds[m] = sin(theta[m]);
    }
    ro->t = t;
}

static void rotor_step(rotor *ro, const double *theta, int n) {
    if ((ro->t + 1) % 64 == 0) {
        rotor_set(ro, theta, n, ro->t + 1);
        return;
    }
    for (int m = 0; m < n; m++) {
        const double c = ro->c[m] * ro->dc[m] - ro->s[m] * ro->ds[m];
        ro->s[m] = ro->s[m] * ro->dc[m] + ro->c[m] * ro->ds[m];
        ro->c[m] = c;
    }
    ro->t++;
}

/* ------------------------------------------------------------------------------------------ */
/* Per KV head plan: what is planted and the kernels' frequencies                              */

typedef struct head_plan {
    int32_t *vertical_cols; /* [n_verticals] ascending */
    int32_t *slash_dists;   /* [n_slashes] */
    int32_t *needle_rows, *needle_cols;
    double *needle_dir; /* [n_needles, n_needle] unit vectors */
    double local_theta[SYNTH_MAX_PAIRS], local_amp[SYNTH_MAX_PAIRS];
    float *row_slash;            /* [L, n_slashes] code amplitude of each line in row i */
    double *row_sink, *row_vert; /* [L] logit of a sink / vertical key for row i */
    double *needle_logit;        /* [n_needles] */
    unsigned char *special;      /* [L]: 1 sink, 2 vertical, 4 needle key */
} head_plan;

static void plan_free(head_plan *hp) {
    free(hp->vertical_cols);
    free(hp->slash_dists);
    free(hp->needle_rows);
    free(hp->needle_cols);
    free(hp->needle_dir);
    free(hp->row_sink);
    free(hp->row_vert);
    free(hp->row_slash);
    free(hp->needle_logit);
    free(hp->special);
    memset(hp, 0, sizeof *hp);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The slash position code h(t) of KV head hk: m random signs / sqrt(m), the same wherever it is
 * drawn (queries draw it for t = i - d, keys for t = j). Signs rather than Gaussians: the dot
 * product of two codes is as close to normal (a sum of m independent terms) and 64 entries
 * cost one draw, which matters at a million positions. */
static void slash_code(uint64_t seed, uint64_t hk, int64_t t, int m, double *h) {
    rng r;
    uint64_t bits = 0;
    const double v = 1.0 / sqrt((double)m);
    rng_seed(&r, seed, 0xc0de, hk, (uint64_t)t);
    for (int e = 0; e < m; e++) {
        if (e % 64 == 0) bits = rng_next(&r);
        /* Branch-free: random signs defeat the branch predictor. */
        h[e] = v * (double)(1 - 2 * (int)((bits >> (e % 64)) & 1));
    }
}

static double local_kernel(const head_plan *hp, const layout *lo, double x) {
    double k = 0.0;
    for (int m = 0; m < lo->m_local; m++) k += hp->local_amp[m] * cos(x * hp->local_theta[m]);
    return k;
}

static mi_status plan_build(mi_context *ctx, const mi_synth_params *p, const layout *lo, int64_t L,
                            uint64_t kv_head, head_plan *hp) {
    rng r;
    const int nv = p->n_verticals, ns = p->n_slashes, nn = p->n_needles;
    const double strength = p->strength;
    rng_seed(&r, p->seed, 0x5eed, kv_head, 0);
    memset(hp, 0, sizeof *hp);
    hp->vertical_cols = calloc((size_t)nv + 1, sizeof(int32_t));
    hp->slash_dists = calloc((size_t)ns + 1, sizeof(int32_t));
    hp->needle_rows = calloc((size_t)nn + 1, sizeof(int32_t));
    hp->needle_cols = calloc((size_t)nn + 1, sizeof(int32_t));
    hp->needle_dir = calloc((size_t)nn * (size_t)(lo->n_needle + 1) + 1, sizeof(double));
    hp->row_sink = calloc((size_t)L, sizeof(double));
    hp->row_vert = calloc((size_t)L, sizeof(double));
    hp->row_slash = calloc((size_t)L * (size_t)ns + 1, sizeof(float));
    hp->needle_logit = calloc((size_t)nn + 1, sizeof(double));
    hp->special = calloc((size_t)L, 1);
    double *mass = malloc((size_t)L * sizeof(double));
    if (!hp->vertical_cols || !hp->slash_dists || !hp->needle_rows || !hp->needle_cols ||
        !hp->needle_dir || !hp->row_sink || !hp->row_vert || !hp->row_slash || !hp->needle_logit ||
        !hp->special || !mass) {
        free(mass);
        plan_free(hp);
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "mi_synth_generate: out of memory");
    }

    const int64_t n_sinks = p->n_sinks < L ? p->n_sinks : L;
    for (int64_t j = 0; j < n_sinks; j++) hp->special[j] |= 1;

    /* Vertical columns: distinct, after the sinks; fewer positions than columns only at tiny L,
     * where the leftover columns repeat the last position. */
    for (int v = 0; v < nv; v++) {
        int32_t c = (int32_t)(L - 1);
        if (L > n_sinks) {
            for (int tries = 0; tries < 64; tries++) {
                c = (int32_t)rng_range(&r, n_sinks, L - 1);
                if (!(hp->special[c] & 2)) break;
            }
        }
        hp->vertical_cols[v] = c;
        hp->special[c] |= 2;
    }
    qsort(hp->vertical_cols, (size_t)nv, sizeof(int32_t), cmp_i32);

    const int64_t w = p->local_window > 0 ? p->local_window : 1;
    /* Local kernel: frequencies spread log-uniformly over [0.3, 1] / w, then scaled so that the
     * logit has dropped by about 10 at x = w (K(0) - K(x) ~ x^2 sum(lambda theta^2) / 2). */
    const double lambda_local = lo->m_local > 0 ? 1.7 * strength / lo->m_local : 0.0;
    double curv = 0.0;
    for (int m = 0; m < lo->m_local; m++) {
        double u = (m + 0.25 + 0.5 * rng_uniform(&r)) / lo->m_local;
        hp->local_theta[m] = 0.3 * pow(1.0 / 0.3, u) / (double)w;
        hp->local_amp[m] = lambda_local;
        curv += lambda_local * hp->local_theta[m] * hp->local_theta[m];
    }
    if (curv > 0) {
        double f = sqrt(20.0 / ((double)w * (double)w) / curv);
        for (int m = 0; m < lo->m_local; m++) hp->local_theta[m] *= f;
    }
    /* Slash distances: given, or drawn past the local band, mostly within a few windows (real
     * heads show most slashes at short range). A line sits on top of the local kernel's far
     * field at its distance; of a few candidates keep the one where that field is highest, so
     * that the line carries visible mass instead of vanishing into a trough. */
    for (int s = 0; s < ns; s++) {
        int64_t d = 0;
        if (p->slash_distances) {
            d = p->slash_distances[s];
        } else {
            int64_t lo_d = 2 * w, hi_d = 16 * w;
            if (hi_d > L - 1) hi_d = L - 1;
            if (lo_d > hi_d) lo_d = hi_d / 2;
            double best = -INFINITY;
            for (int c = 0; c < 8 && hi_d > 0; c++) {
                int64_t cand = rng_range(&r, lo_d, hi_d);
                double f = local_kernel(hp, lo, (double)cand);
                if (f > best) best = f, d = cand;
            }
        }
        hp->slash_dists[s] = (int32_t)d;
    }
    /* Needles: a row in the second half, a key far before it (at least a quarter of the row
     * back), avoiding the other planted keys. */
    for (int n = 0; n < nn; n++) {
        int64_t row = L > 1 ? rng_range(&r, L / 2, L - 1) : 0;
        int64_t col = 0;
        for (int tries = 0; tries < 64; tries++) {
            int64_t hi = row - row / 4 - 1;
            col = hi > n_sinks ? rng_range(&r, n_sinks, hi) : (row > 0 ? row - 1 : 0);
            if (!hp->special[col]) break;
        }
        hp->needle_rows[n] = (int32_t)row;
        hp->needle_cols[n] = (int32_t)col;
        hp->special[col] |= 4;
        double norm = 0.0;
        double *dir = &hp->needle_dir[(size_t)n * (size_t)lo->n_needle];
        for (int e = 0; e < lo->n_needle; e++) {
            dir[e] = rng_normal(&r);
            norm += dir[e] * dir[e];
        }
        norm = sqrt(norm) > 0 ? sqrt(norm) : 1.0;
        for (int e = 0; e < lo->n_needle; e++) dir[e] /= norm;
    }

    /* Mass of the ordinary keys of each row: sum over x <= i of exp(Toeplitz logit(x)). Planted
     * keys have no Toeplitz part; leaving them in the sum changes it by a negligible amount. */
    const double peak = local_kernel(hp, lo, 0.0);
    double acc = 0.0;
    rotor ro;
    rotor_set(&ro, hp->local_theta, lo->m_local, 0);
    for (int64_t x = 0; x < L; x++) {
        if (x > 0) rotor_step(&ro, hp->local_theta, lo->m_local);
        double kx = 0.0;
        for (int m = 0; m < lo->m_local; m++) kx += hp->local_amp[m] * ro.c[m];
        acc += exp(kx - peak);
        mass[x] = acc;
    }
    /* Shares of a row's attention relative to its ordinary keys (local band and far field):
     * at the default strength, sinks 2, verticals 0.25, each slash line 0.1. */
    const double boost = exp(strength - 6.0);
    const double share_sink = 2.0 * boost, share_vert = 0.25 * boost, share_slash = 0.1 * boost;
    const double share_needle = exp(strength - 4.6);
    double *k_at_slash = calloc((size_t)ns + 1, sizeof(double));
    if (!k_at_slash) {
        free(mass);
        plan_free(hp);
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "mi_synth_generate: out of memory");
    }
    for (int s = 0; s < ns; s++) k_at_slash[s] = local_kernel(hp, lo, hp->slash_dists[s]);
    int v_seen = 0;
    for (int64_t i = 0; i < L; i++) {
        const double log_ordinary = log(mass[i]) + peak;
        /* A line's key already scores K(d) through the local kernel; its code adds the rest, so
         * that the key weighs share_slash times the row's ordinary mass. The codes' noise then
         * multiplies every ordinary key by e^(var / 2) on average, lines included. */
        double var = 0.0, lines = 0.0;
        for (int s = 0; s < ns && lo->m_code > 0; s++) {
            if (hp->slash_dists[s] > i) continue;
            double c = log(share_slash) + log_ordinary - k_at_slash[s];
            /* Bounded: a line in a deep trough of the far field is left weaker rather than
             * paid for with a code noise that would swamp the whole row. */
            c = c < 0.0 ? 0.0 : (c > peak + 4.0 ? peak + 4.0 : c);
            hp->row_slash[(size_t)i * (size_t)ns + (size_t)s] = (float)c;
            var += c * c / lo->m_code;
            lines += exp(k_at_slash[s] + c - log_ordinary);
        }
        const double log_mass = log_ordinary + log1p(lines) + 0.5 * var;
        mass[i] = log_mass; /* reused below for the needles */
        int64_t s_vis = i + 1 < n_sinks ? i + 1 : n_sinks;
        while (v_seen < nv && hp->vertical_cols[v_seen] <= i) v_seen++;
        hp->row_sink[i] = s_vis > 0 ? log(share_sink / (double)s_vis) + log_mass : 0.0;
        hp->row_vert[i] = v_seen > 0 ? log(share_vert / v_seen) + log_mass : 0.0;
    }
    free(k_at_slash);
    for (int n = 0; n < nn; n++) {
        int64_t row = hp->needle_rows[n];
        hp->needle_logit[n] = log(share_needle * (1.0 + share_sink + share_vert)) + mass[row];
    }
    free(mass);
    return MI_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Writing                                                                                     */

static void store(const mi_tensor *t, int64_t b, int64_t h, int64_t l, const float *row) {
    const int64_t D = t->shape[3];
    const size_t es = mi_dtype_size(t->dtype);
    const int64_t off = b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
    char *base = (char *)t->data + (size_t)off * es;
    switch (t->dtype) {
    case MI_DTYPE_F32: memcpy(base, row, (size_t)D * sizeof(float)); break;
    case MI_DTYPE_F16:
        for (int64_t d = 0; d < D; d++) ((uint16_t *)(void *)base)[d] = mi_f32_to_f16(row[d]);
        break;
    case MI_DTYPE_BF16:
        for (int64_t d = 0; d < D; d++) ((uint16_t *)(void *)base)[d] = mi_f32_to_bf16(row[d]);
        break;
    }
}

static mi_status check_tensor(mi_context *ctx, const mi_tensor *t, const char *name) {
    mi_status st = mi_check_tensor(ctx, t, name);
    if (st != MI_STATUS_SUCCESS) return st;
    if (t->device != MI_DEVICE_CPU)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "mi_synth_generate: %s must be a CPU tensor",
                       name);
    return MI_STATUS_SUCCESS;
}

mi_status mi_synth_generate(mi_context *ctx, const mi_synth_params *params, mi_tensor *q,
                            mi_tensor *k, mi_tensor *v, mi_synth_truth *truth) {
    mi_clear_error(ctx);
    if (!params || !q || !k || !v)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_synth_generate: params, q, k and v are required");
    const mi_synth_params *p = params;
    if (p->n_sinks < 0 || p->n_verticals < 0 || p->n_slashes < 0 || p->n_needles < 0 ||
        p->local_window < 1 || !(p->strength >= 0.0f && p->strength <= 64.0f) ||
        !(p->noise >= 0.0f && p->noise <= 64.0f))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_synth_generate: counts must be >= 0, local_window >= 1, strength and "
                       "noise in [0, 64]");
    mi_status st;
    if ((st = check_tensor(ctx, q, "q")) || (st = check_tensor(ctx, k, "k")) ||
        (st = check_tensor(ctx, v, "v")))
        return st;
    const int64_t B = q->shape[0], Hq = q->shape[1], L = q->shape[2], D = q->shape[3];
    const int64_t Hkv = k->shape[1];
    for (int i = 0; i < 4; i++) {
        if (k->shape[i] != v->shape[i])
            return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH, "mi_synth_generate: k and v differ");
    }
    if (k->shape[0] != B || k->shape[2] != L || k->shape[3] != D || Hq % Hkv != 0)
        return mi_fail(ctx, MI_STATUS_SHAPE_MISMATCH,
                       "mi_synth_generate: q [%lld,%lld,%lld,%lld] and k [%lld,%lld,%lld,%lld] "
                       "do not match (need equal B, L, D and H_q %% H_kv == 0)",
                       (long long)B, (long long)Hq, (long long)L, (long long)D,
                       (long long)k->shape[0], (long long)Hkv, (long long)k->shape[2],
                       (long long)k->shape[3]);
    if (L > INT32_MAX)
        return mi_fail(ctx, MI_STATUS_UNSUPPORTED, "mi_synth_generate: L beyond int32");
    if (p->slash_distances) {
        for (int s = 0; s < p->n_slashes; s++) {
            if (p->slash_distances[s] < 0)
                return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                               "mi_synth_generate: slash distance %d is negative",
                               (int)p->slash_distances[s]);
        }
    }

    layout lo;
    make_layout(D, p->n_slashes, &lo);
    const int64_t group = Hq / Hkv;
    const double r4 = pow((double)D, 0.25); /* q.k = sqrt(D) * logit, split evenly */
    const double bg_logit = 0.5 * p->noise;
    const double bg_scale = lo.n_bg > 0 ? r4 * sqrt(bg_logit) / pow((double)lo.n_bg, 0.25) : 0;
    float *row = malloc((size_t)D * sizeof(float));
    double *code = malloc((size_t)(D + 1) * sizeof(double));
    if (!row || !code) {
        free(row);
        free(code);
        return mi_fail(ctx, MI_STATUS_OUT_OF_MEMORY, "mi_synth_generate: out of memory");
    }

    for (int64_t hk = 0; hk < Hkv; hk++) {
        head_plan hp;
        st = plan_build(ctx, p, &lo, L, (uint64_t)hk, &hp);
        if (st != MI_STATUS_SUCCESS) {
            free(row);
            free(code);
            return st;
        }
        /* Sink and vertical keys carry sqrt of the last row's boost, so q and k entries have
         * similar magnitudes (half-precision friendly). */
        const double ks = sqrt(fabs(hp.row_sink[L - 1]) + 1.0);
        const double kv = sqrt(fabs(hp.row_vert[L - 1]) + 1.0);
        const double kc = sqrt(hp.row_slash[(size_t)(L - 1) * (size_t)p->n_slashes] + 1.0);
        for (int64_t b = 0; b < B; b++) {
            rng r;
            /* Keys and values. */
            rng_seed(&r, p->seed, 1 + (uint64_t)b, (uint64_t)hk, 1);
            rotor ro;
            rotor_set(&ro, hp.local_theta, lo.m_local, 0);
            for (int64_t j = 0; j < L; j++) {
                if (j > 0) rotor_step(&ro, hp.local_theta, lo.m_local);
                memset(row, 0, (size_t)D * sizeof(float));
                const unsigned char sp = hp.special[j];
                if ((sp & 1) && lo.d_sink >= 0) row[lo.d_sink] = (float)(r4 * ks);
                if ((sp & 2) && lo.d_vert >= 0) row[lo.d_vert] = (float)(r4 * kv);
                if (sp & 4) {
                    for (int n = 0; n < p->n_needles; n++) {
                        if (hp.needle_cols[n] != j) continue;
                        const double a = r4 * sqrt(fabs(hp.needle_logit[n]));
                        for (int e = 0; e < lo.n_needle; e++)
                            row[lo.d_needle + e] +=
                                (float)(a * hp.needle_dir[(size_t)n * (size_t)lo.n_needle + e]);
                    }
                }
                if (!sp) {
                    for (int m = 0; m < lo.m_local; m++) {
                        const double a = r4 * sqrt(hp.local_amp[m]);
                        row[lo.d_local + 2 * m] = (float)(a * ro.c[m]);
                        row[lo.d_local + 2 * m + 1] = (float)(a * ro.s[m]);
                    }
                    if (lo.m_code > 0) {
                        slash_code(p->seed, (uint64_t)hk, j, lo.m_code, code);
                        for (int e = 0; e < lo.m_code; e++)
                            row[lo.d_code + e] = (float)(r4 * kc * code[e]);
                    }
                }
                for (int e = 0; e < lo.n_bg; e++)
                    row[lo.d_bg + e] = (float)(bg_scale * rng_normal(&r));
                store(k, b, hk, j, row);
            }
            rng_seed(&r, p->seed, 1 + (uint64_t)b, (uint64_t)hk, 2);
            for (int64_t j = 0; j < L; j++) {
                for (int64_t d = 0; d < D; d++) row[d] = (float)rng_normal(&r);
                store(v, b, hk, j, row);
            }
            /* Queries of every head in this KV head's group share the planted structure. */
            for (int64_t g = 0; g < group; g++) {
                const int64_t hq = hk * group + g;
                rng_seed(&r, p->seed, 1 + (uint64_t)b, (uint64_t)hq, 3);
                rotor ro;
                rotor_set(&ro, hp.local_theta, lo.m_local, 0);
                for (int64_t i = 0; i < L; i++) {
                    if (i > 0) rotor_step(&ro, hp.local_theta, lo.m_local);
                    memset(row, 0, (size_t)D * sizeof(float));
                    if (lo.d_sink >= 0) row[lo.d_sink] = (float)(r4 * hp.row_sink[i] / ks);
                    if (lo.d_vert >= 0) row[lo.d_vert] = (float)(r4 * hp.row_vert[i] / kv);
                    for (int n = 0; n < p->n_needles; n++) {
                        if (hp.needle_rows[n] != i) continue;
                        const double a = r4 * hp.needle_logit[n] / sqrt(fabs(hp.needle_logit[n]));
                        for (int e = 0; e < lo.n_needle; e++)
                            row[lo.d_needle + e] +=
                                (float)(a * hp.needle_dir[(size_t)n * (size_t)lo.n_needle + e]);
                    }
                    for (int m = 0; m < lo.m_local; m++) {
                        const double a = r4 * sqrt(hp.local_amp[m]);
                        row[lo.d_local + 2 * m] = (float)(a * ro.c[m]);
                        row[lo.d_local + 2 * m + 1] = (float)(a * ro.s[m]);
                    }
                    /* Slash s: the code of the key d_s behind this row. */
                    for (int s = 0; s < p->n_slashes && lo.m_code > 0; s++) {
                        if (hp.slash_dists[s] > i) continue;
                        slash_code(p->seed, (uint64_t)hk, i - hp.slash_dists[s], lo.m_code, code);
                        const double c = hp.row_slash[(size_t)i * (size_t)p->n_slashes + (size_t)s];
                        const double a = r4 * c / kc;
                        for (int e = 0; e < lo.m_code; e++)
                            row[lo.d_code + e] += (float)(a * code[e]);
                    }
                    for (int e = 0; e < lo.n_bg; e++)
                        row[lo.d_bg + e] = (float)(bg_scale * rng_normal(&r));
                    store(q, b, hq, i, row);
                }
            }
        }
        if (truth) {
            for (int64_t g = 0; g < group; g++) {
                const int64_t hq = hk * group + g;
                if (truth->vertical_cols && p->n_verticals)
                    memcpy(&truth->vertical_cols[hq * p->n_verticals], hp.vertical_cols,
                           (size_t)p->n_verticals * sizeof(int32_t));
                if (truth->slash_dists && p->n_slashes)
                    memcpy(&truth->slash_dists[hq * p->n_slashes], hp.slash_dists,
                           (size_t)p->n_slashes * sizeof(int32_t));
                if (truth->needle_rows && p->n_needles)
                    memcpy(&truth->needle_rows[hq * p->n_needles], hp.needle_rows,
                           (size_t)p->n_needles * sizeof(int32_t));
                if (truth->needle_cols && p->n_needles)
                    memcpy(&truth->needle_cols[hq * p->n_needles], hp.needle_cols,
                           (size_t)p->n_needles * sizeof(int32_t));
            }
        }
        plan_free(&hp);
    }
    free(row);
    free(code);
    return MI_STATUS_SUCCESS;
}
