/*
 * kv_retr.c: the inverted-file index over one head's keys, calibrated with query samples, and
 * the log-sum-exp merge of RetrievalAttention (kv_retr.h).
 */
#include "kv_retr.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct retr_list {
    float *keys; /* [cap, d] */
    int64_t *ids;
    int64_t len, cap;
} retr_list;

struct kv_retr_index {
    int32_t d;
    int64_t n_lists, size;
    float *cent; /* [n_lists, d] */
    retr_list *lists;
    double scan_frac; /* of size; >= 1: scan everything */
    int64_t max_len;  /* the longest list */
};

kv_retr_params kv_retr_default_params(void) {
    kv_retr_params p;
    memset(&p, 0, sizeof(p));
    p.list_size = 64;
    p.kmeans_iters = 10;
    p.train_max = 16384;
    p.target_recall = 0.95f;
    p.seed = 0x5eed;
    return p;
}

static float dot(const float *a, const float *b, int32_t d) {
    /* four partial sums: vectorises without reassociation flags */
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int32_t i = 0;
    for (; i + 4 <= d; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < d; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 17;
}

/* best[i] = the nearest of the K centroids cent to rows x [nb, d] (scores as one sgemm:
 * sc [nb, K]; half_norm[c] = |cent_c|^2 / 2). */
#define ASSIGN_ROWS 256
static void assign_block(const float *cent, int64_t K, const float *half_norm, const float *x,
                         int64_t nb, int32_t d, float *sc, int64_t *best) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)K, d, 1.0f, x, d, cent, d,
                0.0f, sc, (int)K);
    for (int64_t i = 0; i < nb; i++) {
        int64_t b = 0;
        float bv = -INFINITY;
        for (int64_t c = 0; c < K; c++) {
            const float v = sc[i * K + c] - half_norm[c];
            if (v > bv) {
                bv = v;
                b = c;
            }
        }
        best[i] = b;
    }
}

/* best[i] = the nearest of the K centroids to keys rows[i] (i < m), in blocks of ASSIGN_ROWS. */
static bool assign_rows(const float *cent, int64_t K, const float *keys, int64_t ld, int32_t d,
                        const int64_t *rows, int64_t m, int64_t *best) {
    float *hn = malloc((size_t)(K ? K : 1) * sizeof(float));
    float *xb = malloc((size_t)(ASSIGN_ROWS * d) * sizeof(float));
    float *sc = malloc((size_t)(ASSIGN_ROWS * K) * sizeof(float));
    const bool ok = hn && xb && sc;
    for (int64_t c = 0; ok && c < K; c++) hn[c] = 0.5f * dot(cent + c * d, cent + c * d, d);
    for (int64_t i0 = 0; ok && i0 < m; i0 += ASSIGN_ROWS) {
        const int64_t nb = m - i0 < ASSIGN_ROWS ? m - i0 : ASSIGN_ROWS;
        for (int64_t i = 0; i < nb; i++)
            memcpy(xb + i * d, keys + (rows ? rows[i0 + i] : i0 + i) * ld,
                   (size_t)d * sizeof(float));
        assign_block(cent, K, hn, xb, nb, d, sc, best + i0);
    }
    free(hn);
    free(xb);
    free(sc);
    return ok;
}

static bool list_push(retr_list *l, int32_t d, const float *key, int64_t id) {
    if (l->len == l->cap) {
        const int64_t cap = l->cap ? 2 * l->cap : 16;
        float *k = realloc(l->keys, (size_t)(cap * d) * sizeof(float));
        if (!k) return false;
        l->keys = k;
        int64_t *ids = realloc(l->ids, (size_t)cap * sizeof(int64_t));
        if (!ids) return false;
        l->ids = ids;
        l->cap = cap;
    }
    memcpy(l->keys + l->len * d, key, (size_t)d * sizeof(float));
    l->ids[l->len++] = id;
    return true;
}

void kv_retr_free(kv_retr_index *ix) {
    if (!ix) return;
    if (ix->lists)
        for (int64_t c = 0; c < ix->n_lists; c++) {
            free(ix->lists[c].keys);
            free(ix->lists[c].ids);
        }
    free(ix->lists);
    free(ix->cent);
    free(ix);
}

/* Lloyd's k-means of keys rows[0..m) into the K centroids cent, initialised from the first K
 * of those rows (a random sample: the rows come shuffled); an empty list takes a random row. */
static bool lloyd(const float *keys, int64_t ld, int32_t d, const int64_t *rows, int64_t m,
                  int64_t K, float *cent, int32_t iters, uint64_t *rs) {
    float *sum = malloc((size_t)(K * d) * sizeof(float));
    int64_t *cnt = malloc((size_t)K * sizeof(int64_t));
    int64_t *best = malloc((size_t)(m ? m : 1) * sizeof(int64_t));
    bool ok = sum && cnt && best;
    for (int64_t c = 0; ok && c < K; c++)
        memcpy(cent + c * d, keys + rows[c] * ld, (size_t)d * sizeof(float));
    for (int32_t it = 0; ok && it < iters; it++) {
        if (!(ok = assign_rows(cent, K, keys, ld, d, rows, m, best))) break;
        memset(sum, 0, (size_t)(K * d) * sizeof(float));
        memset(cnt, 0, (size_t)K * sizeof(int64_t));
        for (int64_t i = 0; i < m; i++) {
            const float *x = keys + rows[i] * ld;
            cnt[best[i]]++;
            for (int32_t k = 0; k < d; k++) sum[best[i] * d + k] += x[k];
        }
        for (int64_t c = 0; c < K; c++) {
            if (cnt[c] == 0) {
                const int64_t i = (int64_t)(rng_next(rs) % (uint64_t)m);
                memcpy(cent + c * d, keys + rows[i] * ld, (size_t)d * sizeof(float));
                continue;
            }
            for (int32_t k = 0; k < d; k++) cent[c * d + k] = sum[c * d + k] / (float)cnt[c];
        }
    }
    free(sum);
    free(cnt);
    free(best);
    return ok;
}

/* A counting sort of rows by cell: first[c]..first[c + 1] - 1 index the rows of cell c in order
 * (first [K1 + 1]); order holds ids[i] (NULL: i) of the rows i < n with cell[i] == c, in i's
 * order. */
static void group_by_cell(const int64_t *cell, const int64_t *ids, int64_t n, int64_t K1,
                          int64_t *first, int64_t *order) {
    memset(first, 0, (size_t)(K1 + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) first[cell[i] + 1]++;
    for (int64_t c = 0; c < K1; c++) first[c + 1] += first[c];
    for (int64_t i = 0; i < n; i++) order[first[cell[i]]++] = ids ? ids[i] : i;
    for (int64_t c = K1; c > 0; c--) first[c] = first[c - 1]; /* back to the starts */
    first[0] = 0;
}

/* Up to this many lists the centroids come from one k-means and every key is compared with
 * every centroid; more lists are trained in two levels (below). */
#define FLAT_LISTS 256

/*
 * The centroids of ix->n_lists lists, and assign[i] the list of key i (i < n).
 * Flat: Lloyd's k-means over a sample of at most train_max keys, then every key against every
 * centroid. Two levels (more than FLAT_LISTS lists, e.g. 2048 at 128K keys): the sample is
 * clustered into about sqrt(lists) coarse cells, each cell's sample into its share of the lists
 * (proportional to its size), and a key is compared with the coarse centroids and then with its
 * cell's lists only: about 2 sqrt(lists) products a key instead of lists, the bulk of an index's
 * build at long contexts. A key may then miss its globally nearest centroid; the calibration
 * that follows measures the recall as built and sets the scan to reach the target.
 */
static bool train_and_assign(kv_retr_index *ix, const float *keys, int64_t n, int64_t ld,
                             const kv_retr_params *p, int64_t *assign) {
    const int32_t d = ix->d;
    const int64_t K = ix->n_lists;
    uint64_t rs = p->seed ? p->seed : 1;
    int64_t nt = n < p->train_max ? n : p->train_max;
    if (nt < K) nt = K;
    if (nt > n) nt = n;
    int64_t *train = malloc((size_t)n * sizeof(int64_t));
    if (!train) return false;
    /* a seeded partial shuffle: the first nt entries are a uniform sample */
    for (int64_t i = 0; i < n; i++) train[i] = i;
    for (int64_t i = 0; i < nt; i++) {
        const int64_t j = i + (int64_t)(rng_next(&rs) % (uint64_t)(n - i));
        const int64_t t = train[i];
        train[i] = train[j];
        train[j] = t;
    }
    bool ok;
    if (K <= FLAT_LISTS) {
        ok = lloyd(keys, ld, d, train, nt, K, ix->cent, p->kmeans_iters, &rs) &&
             assign_rows(ix->cent, K, keys, ld, d, NULL, n, assign);
        free(train);
        return ok;
    }
    const int64_t K1 = (int64_t)ceil(sqrt((double)K));
    float *coarse = malloc((size_t)(K1 * d) * sizeof(float));
    int64_t *cell = malloc((size_t)n * sizeof(int64_t));          /* a row's coarse cell */
    int64_t *order = malloc((size_t)n * sizeof(int64_t));         /* rows grouped by cell */
    int64_t *best = malloc((size_t)n * sizeof(int64_t));          /* a key's list within its cell */
    int64_t *first = malloc((size_t)(K1 + 1) * sizeof(int64_t));  /* a cell's rows in order */
    int64_t *lfirst = malloc((size_t)(K1 + 1) * sizeof(int64_t)); /* a cell's first list */
    int64_t *lists = malloc((size_t)K1 * sizeof(int64_t));        /* lists per cell */
    ok = coarse && cell && order && best && first && lfirst && lists &&
         lloyd(keys, ld, d, train, nt, K1, coarse, p->kmeans_iters, &rs) &&
         assign_rows(coarse, K1, keys, ld, d, train, nt, cell);
    if (ok) {
        /* the sample grouped by cell (each cell keeps the shuffled order) */
        group_by_cell(cell, train, nt, K1, first, order);
        /* the lists per cell: proportional to its share of the sample, at least one where the
         * cell has samples, at most its samples; the rounding's excess or deficit goes to the
         * largest cells */
        int64_t total = 0;
        for (int64_t c = 0; c < K1; c++) {
            const int64_t m = first[c + 1] - first[c];
            lists[c] = (int64_t)((double)K * (double)m / (double)nt + 0.5);
            if (m > 0 && lists[c] < 1) lists[c] = 1;
            if (lists[c] > m) lists[c] = m;
            total += lists[c];
        }
        while (total != K) {
            int64_t pick = -1, pick_m = 0;
            for (int64_t c = 0; c < K1; c++) {
                const int64_t m = first[c + 1] - first[c];
                const bool can = total < K ? lists[c] < m : lists[c] > 1;
                if (can && (pick < 0 || m > pick_m)) pick = c, pick_m = m;
            }
            if (pick < 0) break; /* cannot happen: nt >= K samples, K >= K1 lists */
            lists[pick] += total < K ? 1 : -1;
            total += total < K ? 1 : -1;
        }
        ok = total == K;
        lfirst[0] = 0;
        for (int64_t c = 0; c < K1; c++) lfirst[c + 1] = lfirst[c] + lists[c];
        /* each cell's lists from its samples */
        for (int64_t c = 0; ok && c < K1; c++)
            if (lists[c] > 0)
                ok = lloyd(keys, ld, d, order + first[c], first[c + 1] - first[c], lists[c],
                           ix->cent + lfirst[c] * d, p->kmeans_iters, &rs);
    }
    /* every key: its cell, then the nearest of that cell's lists (of all lists, in a cell no
     * sample fell in) */
    if (ok) ok = assign_rows(coarse, K1, keys, ld, d, NULL, n, cell);
    if (ok) group_by_cell(cell, NULL, n, K1, first, order);
    for (int64_t c = 0; ok && c < K1; c++) {
        const int64_t mk = first[c + 1] - first[c], l0 = lists[c] ? lfirst[c] : 0;
        if (mk == 0) continue;
        ok = assign_rows(ix->cent + l0 * d, lists[c] ? lists[c] : K, keys, ld, d, order + first[c],
                         mk, best);
        for (int64_t i = 0; ok && i < mk; i++) assign[order[first[c] + i]] = l0 + best[i];
    }
    free(train);
    free(coarse);
    free(cell);
    free(order);
    free(best);
    free(first);
    free(lfirst);
    free(lists);
    return ok;
}

/* Min-heap of (score, id) of at most cap entries: the k largest seen. */
typedef struct topk_heap {
    float *s;
    int64_t *id;
    int64_t n, cap;
} topk_heap;

static void heap_offer(topk_heap *h, float s, int64_t id) {
    int64_t i;
    if (h->n < h->cap) {
        i = h->n++;
        while (i > 0) {
            const int64_t up = (i - 1) / 2;
            if (h->s[up] <= s) break;
            h->s[i] = h->s[up];
            h->id[i] = h->id[up];
            i = up;
        }
        h->s[i] = s;
        h->id[i] = id;
        return;
    }
    if (!(s > h->s[0])) return;
    i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->s[c + 1] < h->s[c]) c++;
        if (h->s[c] >= s) break;
        h->s[i] = h->s[c];
        h->id[i] = h->id[c];
        i = c;
    }
    h->s[i] = s;
    h->id[i] = id;
}

int64_t kv_retr_exact_topk(const float *keys, int64_t n, int64_t ld, int32_t d, int64_t id0,
                           const float *q, int32_t k, int64_t *ids, float *scores) {
    topk_heap h = {scores, ids, 0, k < n ? k : n};
    if (h.cap <= 0) return 0;
    for (int64_t i = 0; i < n; i++) heap_offer(&h, dot(keys + i * ld, q, d), id0 + i);
    return h.n;
}

/* Order of the lists by q.centroid, descending (an index sort; lists are few). */
typedef struct rank_item {
    float s;
    int64_t c;
} rank_item;

static int rank_cmp(const void *a, const void *b) {
    const rank_item *x = a, *y = b;
    if (x->s > y->s) return -1;
    if (x->s < y->s) return 1;
    return x->c < y->c ? -1 : (x->c > y->c);
}

static void rank_lists(const kv_retr_index *ix, const float *q, rank_item *r) {
    for (int64_t c = 0; c < ix->n_lists; c++) {
        r[c].s = dot(q, ix->cent + c * ix->d, ix->d);
        r[c].c = c;
    }
    qsort(r, (size_t)ix->n_lists, sizeof(rank_item), rank_cmp);
}

#define CAL_ROWS 16

/* The smallest scan (in keys, scanning whole lists in each query's order as a search does) at
 * which the sample queries' mean recall of their exact top-k reaches the target; kept as a
 * fraction of the keys. */
static bool calibrate(kv_retr_index *ix, const float *keys, int64_t n, int64_t ld,
                      const int64_t *assign, const float *queries, int64_t nq, int64_t ld_q,
                      int32_t top_k, float target) {
    const int64_t L = ix->n_lists;
    int64_t *ids = malloc((size_t)top_k * sizeof(int64_t));
    float *sc = malloc((size_t)top_k * sizeof(float));
    int64_t *hits = malloc((size_t)L * sizeof(int64_t));
    rank_item *r = malloc((size_t)L * sizeof(rank_item));
    /* per sample, after each list in its order: keys scanned and top-k found */
    int64_t *cum_s = malloc((size_t)(nq * L) * sizeof(int64_t));
    int64_t *cum_f = malloc((size_t)(nq * L) * sizeof(int64_t));
    int64_t *got_k = malloc((size_t)nq * sizeof(int64_t));
    /* the samples' scores against every key, CAL_ROWS queries at a time, as one sgemm */
    float *all = malloc((size_t)(CAL_ROWS * n) * sizeof(float));
    bool ok = ids && sc && hits && r && cum_s && cum_f && got_k && all;
    for (int64_t i = 0; ok && i < nq; i++) {
        const float *q = queries + i * ld_q;
        if (i % CAL_ROWS == 0) {
            const int64_t nb = nq - i < CAL_ROWS ? nq - i : CAL_ROWS;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)n, ix->d, 1.0f, q,
                        (int)ld_q, keys, (int)ld, 0.0f, all, (int)n);
        }
        {
            topk_heap h = {sc, ids, 0, top_k < n ? top_k : n};
            const float *row = all + (i % CAL_ROWS) * n;
            for (int64_t j = 0; j < n; j++) heap_offer(&h, row[j], j);
            got_k[i] = h.n;
        }
        memset(hits, 0, (size_t)L * sizeof(int64_t));
        for (int64_t j = 0; j < got_k[i]; j++) hits[assign[ids[j]]]++;
        rank_lists(ix, q, r);
        int64_t s = 0, f = 0;
        for (int64_t j = 0; j < L; j++) {
            s += ix->lists[r[j].c].len;
            f += hits[r[j].c];
            cum_s[i * L + j] = s;
            cum_f[i * L + j] = f;
        }
    }
    if (ok) {
        /* binary search on the scan budget: a search stops after the list that reaches it */
        int64_t lo = top_k, hi = n;
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            double rec = 0;
            for (int64_t i = 0; i < nq; i++) {
                int64_t j = 0;
                while (j < L - 1 && cum_s[i * L + j] < mid) j++;
                rec += got_k[i] ? (double)cum_f[i * L + j] / (double)got_k[i] : 1.0;
            }
            if (rec / (double)nq >= (double)target)
                hi = mid;
            else
                lo = mid + 1;
        }
        ix->scan_frac = n > 0 ? (double)lo / (double)n : 1.0;
    }
    free(ids);
    free(sc);
    free(hits);
    free(r);
    free(cum_s);
    free(cum_f);
    free(got_k);
    free(all);
    return ok;
}

kv_retr_index *kv_retr_build(const float *keys, int64_t n, int64_t ld, int32_t d, int64_t id0,
                             const float *queries, int64_t nq, int64_t ld_q, int32_t top_k,
                             const kv_retr_params *params) {
    const kv_retr_params p = params ? *params : kv_retr_default_params();
    if (d <= 0 || n < 0 || (n > 0 && !keys) || p.list_size <= 0) return NULL;
    kv_retr_index *ix = calloc(1, sizeof(*ix));
    if (!ix) return NULL;
    ix->d = d;
    ix->n_lists = n > 0 ? (n + p.list_size - 1) / p.list_size : 1;
    ix->scan_frac = 1.0;
    ix->cent = calloc((size_t)(ix->n_lists * d), sizeof(float));
    ix->lists = calloc((size_t)ix->n_lists, sizeof(retr_list));
    int64_t *assign = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    bool ok = ix->cent && ix->lists && assign;
    if (ok && n > 0) {
        if (ix->n_lists > 1)
            ok = train_and_assign(ix, keys, n, ld, &p, assign);
        else
            memset(assign, 0, (size_t)n * sizeof(int64_t));
        for (int64_t i = 0; i < n && ok; i++)
            ok = list_push(&ix->lists[assign[i]], d, keys + i * ld, id0 + i);
        ix->size = n;
        for (int64_t c = 0; c < ix->n_lists; c++)
            if (ix->lists[c].len > ix->max_len) ix->max_len = ix->lists[c].len;
        if (ok && ix->n_lists == 1) /* one list: its centroid is the mean (for later adds) */
            for (int64_t i = 0; i < n; i++)
                for (int32_t k = 0; k < d; k++) ix->cent[k] += keys[i * ld + k] / (float)n;
    }
    /* a target of 1 asks for the exact top-k: the whole index is scanned */
    if (ok && queries && nq > 0 && top_k > 0 && top_k < n && ix->n_lists > 1 &&
        p.target_recall < 1.0f)
        ok = calibrate(ix, keys, n, ld, assign, queries, nq, ld_q, top_k, p.target_recall);
    free(assign);
    if (!ok) {
        kv_retr_free(ix);
        return NULL;
    }
    return ix;
}

bool kv_retr_add(kv_retr_index *ix, const float *key, int64_t id) {
    int64_t best = 0;
    float bv = -INFINITY;
    for (int64_t c = 0; c < ix->n_lists && ix->n_lists > 1; c++) {
        const float *ce = ix->cent + c * ix->d;
        const float v = dot(key, ce, ix->d) - 0.5f * dot(ce, ce, ix->d);
        if (v > bv) {
            bv = v;
            best = c;
        }
    }
    if (!list_push(&ix->lists[best], ix->d, key, id)) return false;
    if (ix->lists[best].len > ix->max_len) ix->max_len = ix->lists[best].len;
    ix->size++;
    return true;
}

int64_t kv_retr_size(const kv_retr_index *ix) { return ix ? ix->size : 0; }
int64_t kv_retr_lists(const kv_retr_index *ix) { return ix ? ix->n_lists : 0; }

int64_t kv_retr_scan_keys(const kv_retr_index *ix, int32_t k) {
    if (ix->scan_frac >= 1.0) return ix->size;
    int64_t s = (int64_t)ceil(ix->scan_frac * (double)ix->size);
    if (s < k) s = k;
    return s < ix->size ? s : ix->size;
}

kv_retr_index *kv_retr_clone(const kv_retr_index *ix) {
    kv_retr_index *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    *c = *ix;
    c->cent = malloc((size_t)(ix->n_lists * ix->d) * sizeof(float));
    c->lists = calloc((size_t)ix->n_lists, sizeof(retr_list));
    if (!c->cent || !c->lists) {
        c->n_lists = c->lists ? c->n_lists : 0;
        kv_retr_free(c);
        return NULL;
    }
    memcpy(c->cent, ix->cent, (size_t)(ix->n_lists * ix->d) * sizeof(float));
    for (int64_t l = 0; l < ix->n_lists; l++) {
        const retr_list *s = &ix->lists[l];
        retr_list *t = &c->lists[l];
        if (!s->len) continue;
        t->keys = malloc((size_t)(s->len * ix->d) * sizeof(float));
        t->ids = malloc((size_t)s->len * sizeof(int64_t));
        if (!t->keys || !t->ids) {
            kv_retr_free(c);
            return NULL;
        }
        memcpy(t->keys, s->keys, (size_t)(s->len * ix->d) * sizeof(float));
        memcpy(t->ids, s->ids, (size_t)s->len * sizeof(int64_t));
        t->len = t->cap = s->len;
    }
    return c;
}

size_t kv_retr_scratch_floats(const kv_retr_index *ix) {
    return (size_t)ix->n_lists * (sizeof(rank_item) / sizeof(float) + 1);
}

/* Moves the k largest of s[0..n) (with their ids) to the front, in no order (quickselect). */
static void select_top(float *s, int64_t *id, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const float pivot = s[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (s[i] > pivot) i++;
            while (s[j] < pivot) j--;
            if (i <= j) {
                const float ts = s[i];
                s[i] = s[j];
                s[j] = ts;
                const int64_t ti = id[i];
                id[i] = id[j];
                id[j] = ti;
                i++;
                j--;
            }
        }
        /* [lo, j] >= pivot >= [i, hi] */
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

int64_t kv_retr_search(const kv_retr_index *ix, const float *q, int32_t k, int64_t *ids,
                       float *scores, float *scratch) {
    const int64_t cap = k < ix->size ? k : ix->size;
    if (cap <= 0) return 0;
    const int64_t budget = kv_retr_scan_keys(ix, k);
    const int32_t d = ix->d;
    rank_item *r = (rank_item *)scratch;
    const bool all = budget >= ix->size;
    if (!all) rank_lists(ix, q, r);
    /* every scanned key's score (one sgemv per list), then the top k of them */
    int64_t most = all ? ix->size : budget + ix->max_len;
    float *s = malloc((size_t)most * sizeof(float));
    int64_t *id = malloc((size_t)most * sizeof(int64_t));
    if (!s || !id) { /* out of memory: the heap over the same keys, no buffer needed */
        free(s);
        free(id);
        topk_heap h = {scores, ids, 0, cap};
        int64_t scanned = 0;
        for (int64_t j = 0; j < ix->n_lists && (all || scanned < budget); j++) {
            const retr_list *l = &ix->lists[all ? j : r[j].c];
            for (int64_t i = 0; i < l->len; i++)
                heap_offer(&h, dot(l->keys + i * d, q, d), l->ids[i]);
            scanned += l->len;
        }
        return h.n;
    }
    int64_t n = 0;
    for (int64_t j = 0; j < ix->n_lists && (all || n < budget); j++) {
        const retr_list *l = &ix->lists[all ? j : r[j].c];
        if (!l->len) continue;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)l->len, d, 1.0f, l->keys, d, q, 1, 0.0f,
                    s + n, 1);
        memcpy(id + n, l->ids, (size_t)l->len * sizeof(int64_t));
        n += l->len;
    }
    const int64_t got = cap < n ? cap : n;
    if (got < n) select_top(s, id, n, got);
    memcpy(scores, s, (size_t)got * sizeof(float));
    memcpy(ids, id, (size_t)got * sizeof(int64_t));
    free(s);
    free(id);
    return got;
}

void kv_retr_partial(const float *s, int64_t n, const float *const *vals, int32_t d, float *out,
                     double *lse) {
    for (int32_t k = 0; k < d; k++) out[k] = 0.0f;
    if (n <= 0) {
        *lse = -INFINITY;
        return;
    }
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float w = expf(s[i] - mx);
        sum += w;
        const float *v = vals[i];
        for (int32_t k = 0; k < d; k++) out[k] += w * v[k];
    }
    const float inv = 1.0f / sum;
    for (int32_t k = 0; k < d; k++) out[k] *= inv;
    *lse = (double)mx + log((double)sum);
}

void kv_retr_merge(const float *out_a, double lse_a, const float *out_b, double lse_b, int32_t d,
                   float *out, double *lse) {
    if (lse_b == -INFINITY) { /* nothing on one side */
        if (out != out_a) memcpy(out, out_a, (size_t)d * sizeof(float));
        *lse = lse_a;
        return;
    }
    if (lse_a == -INFINITY) {
        if (out != out_b) memcpy(out, out_b, (size_t)d * sizeof(float));
        *lse = lse_b;
        return;
    }
    const double mx = lse_a > lse_b ? lse_a : lse_b;
    const double wa = exp(lse_a - mx), wb = exp(lse_b - mx);
    const double inv = 1.0 / (wa + wb);
    for (int32_t k = 0; k < d; k++) out[k] = (float)((wa * out_a[k] + wb * out_b[k]) * inv);
    *lse = mx + log(wa + wb);
}
