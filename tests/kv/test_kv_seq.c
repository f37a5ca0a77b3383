/* test_kv_seq.c: the paged KV cache against a plain contiguous reference: random appends of every
 * chunk size, rewinds, truncations, forks and destroys in every storage dtype; fork + divergent
 * appends == separate sequences; copy-on-write and reference counts; capacity and host-memory
 * failures that leave the sequence unchanged; min/max metadata == brute force; bad input. */
#include "kv_test_util.h"

#include <omp.h>
#include <stdio.h>

static const mi_kv_dtype DTYPES[] = {MI_KV_F32, MI_KV_F16, MI_KV_BF16, MI_KV_FP8_E4M3};

static mi_kv_pool *make_pool(int32_t n_layers, int32_t H, int32_t D, mi_kv_dtype dt, int32_t P,
                             int64_t capacity_tokens, uint32_t meta) {
    mi_kv_pool_params p = mi_kv_pool_default_params();
    p.n_layers = n_layers, p.n_kv_heads = H, p.head_dim = D, p.dtype = dt;
    if (P > 0) p.page_tokens = P;
    p.capacity_tokens = capacity_tokens;
    p.meta_kinds = meta;
    p.slab_pages = 5; /* several slabs even in small tests */
    mi_kv_pool *pool = NULL;
    CHECK_STATUS(mi_kv_pool_create(NULL, &p, &pool), MI_STATUS_SUCCESS);
    return pool;
}

/* All rows of one layer as f32 [len][H][D]. */
static float *read_layer(const mi_kv_seq *seq, int32_t l, int kv, int32_t H, int32_t D) {
    const int64_t n = mi_kv_seq_length(seq, l);
    float *buf = malloc(((size_t)n * H * D + 1) * sizeof(float));
    mi_tensor t = mi_tensor_blhd(buf, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, n, D);
    CHECK_STATUS(mi_kv_seq_read(seq, l, 0, n, kv ? NULL : &t, kv ? &t : NULL), MI_STATUS_SUCCESS);
    return buf;
}

/* Every page of every layer: its view agrees with the layout and the read rows, and its key
 * min/max equals the brute force over the rows it covers. */
static void check_pages(const mi_kv_seq *seq, const char *what) {
    const mi_kv_pool *pool = mi_kv_seq_pool(seq);
    mi_kv_page_layout L;
    CHECK_STATUS(mi_kv_pool_layout(pool, &L), MI_STATUS_SUCCESS);
    const int32_t H = L.n_kv_heads, D = L.head_dim, P = L.page_tokens;
    for (int32_t l = 0; mi_kv_seq_length(seq, l) >= 0; l++) {
        const int64_t len = mi_kv_seq_length(seq, l);
        const int32_t *ids;
        int64_t n_pages;
        CHECK_STATUS(mi_kv_seq_page_table(seq, l, &ids, &n_pages), MI_STATUS_SUCCESS);
        CHECK(n_pages == (len + P - 1) / P);
        float *k = read_layer(seq, l, 0, H, D), *v = read_layer(seq, l, 1, H, D);
        int bad = 0;
        for (int64_t i = 0; i < n_pages; i++) {
            mi_kv_page_view pv;
            CHECK_STATUS(mi_kv_seq_page(seq, l, i, &pv), MI_STATUS_SUCCESS);
            CHECK(pv.page_id == ids[i] && pv.data == mi_kv_pool_page_data(pool, ids[i]));
            CHECK(pv.first_row == i * P);
            CHECK(pv.rows == (len - i * P < P ? len - i * P : P));
            CHECK(pv.meta_rows >= pv.rows && pv.meta_rows <= P && pv.refcount >= 1);
            CHECK((pv.k_scale != NULL) == (L.dtype == MI_KV_FP8_E4M3));
            for (int32_t r = 0; r < pv.rows; r++)
                for (int32_t h = 0; h < H; h++)
                    for (int32_t d = 0; d < D; d++) {
                        const size_t at = ((size_t)(pv.first_row + r) * H + h) * D + d;
                        bad += page_value(&L, pv.data, 0, h, r, d) != k[at];
                        bad += page_value(&L, pv.data, 1, h, r, d) != v[at];
                    }
            if (!pv.key_minmax) continue;
            for (int32_t h = 0; h < H; h++)
                for (int32_t d = 0; d < D; d++) {
                    float mn = INFINITY, mx = -INFINITY;
                    for (int32_t r = 0; r < pv.meta_rows; r++) {
                        const float x = page_value(&L, pv.data, 0, h, r, d);
                        mn = x < mn ? x : mn;
                        mx = x > mx ? x : mx;
                    }
                    bad += pv.key_minmax[(size_t)h * 2 * D + d] != mn;
                    bad += pv.key_minmax[(size_t)h * 2 * D + D + d] != mx;
                }
        }
        if (bad) fprintf(stderr, "%s: layer %d: %d page values or bounds differ\n", what, l, bad);
        CHECK(bad == 0);
        free(k), free(v);
    }
}

/* The sequence holds the reference's rows within the storage dtype's tolerance. */
static void check_vs_ref(const mi_kv_seq *seq, const ref_seq *ref, mi_kv_dtype dt,
                         const char *what) {
    const int32_t H = ref->H, D = ref->D;
    mi_kv_page_layout L;
    mi_kv_pool_layout(mi_kv_seq_pool(seq), &L);
    for (int32_t l = 0; l < ref->n_layers; l++) {
        const int64_t len = ref->layers[l].len;
        CHECK(mi_kv_seq_length(seq, l) == len);
        if (mi_kv_seq_length(seq, l) != len) return;
        int bad = 0;
        for (int kv = 0; kv < 2; kv++) {
            float *got = read_layer(seq, l, kv, H, D);
            const float *want = kv ? ref->layers[l].v : ref->layers[l].k;
            for (int64_t r = 0; r < len; r++) {
                mi_kv_page_view pv;
                mi_kv_seq_page(seq, l, r / L.page_tokens, &pv);
                for (int32_t h = 0; h < H; h++) {
                    const float s = pv.k_scale ? (kv ? pv.v_scale : pv.k_scale)[h] : 0.0f;
                    const uint16_t *c =
                        pv.k_center ? (kv ? pv.v_center : pv.k_center) + (size_t)h * D : NULL;
                    for (int32_t d = 0; d < D; d++) {
                        const size_t at = ((size_t)r * H + h) * D + d;
                        if (!within_tol(dt, want[at], got[at], s,
                                        c ? mi_bf16_to_f32(c[d]) : 0.0f)) {
                            if (bad++ < 3)
                                fprintf(stderr, "%s: layer %d %c row %lld head %d [%d]: %g vs %g\n",
                                        what, l, kv ? 'v' : 'k', (long long)r, h, d, got[at],
                                        want[at]);
                        }
                    }
                }
            }
            free(got);
        }
        CHECK(bad == 0);
    }
    check_pages(seq, what);
}

static int64_t pick_chunk(void) {
    static const int64_t sizes[] = {1, 2, 3, 7, 63, 64, 65, 100, 127, 128, 129, 200};
    if (rng_next() % 3 == 0) return rng_int(1, 150);
    return sizes[rng_next() % (sizeof sizes / sizeof sizes[0])];
}

static void append_random(mi_kv_seq *seq, ref_seq *ref, int32_t l, int64_t n) {
    static const mi_dtype src[] = {MI_DTYPE_F32, MI_DTYPE_F16, MI_DTYPE_BF16};
    static const float mags[] = {0.01f, 1.0f, 50.0f};
    chunk c =
        chunk_make(ref->H, ref->D, n, src[rng_next() % 3], rng_next() % 2, mags[rng_next() % 3]);
    CHECK_STATUS(mi_kv_seq_append(seq, l, &c.tk, &c.tv), MI_STATUS_SUCCESS);
    ref_append(ref, l, c.k, c.v, n);
    chunk_free(&c);
}

/* Random operations on several sequences of one pool, each checked against its reference. */
static void test_random(mi_kv_dtype dt, int32_t P, int32_t H, int32_t D, int steps) {
    char what[96];
    snprintf(what, sizeof what, "random %s P=%d H=%d D=%d", mi_kv_dtype_name(dt), P, H, D);
    const int32_t NL = 3;
    mi_kv_pool *pool = make_pool(NL, H, D, dt, P, 0, MI_KV_META_KEY_MINMAX);
    enum { MAXS = 6 };
    mi_kv_seq *seqs[MAXS] = {0};
    ref_seq *refs[MAXS] = {0};
    CHECK_STATUS(mi_kv_seq_create(pool, &seqs[0]), MI_STATUS_SUCCESS);
    refs[0] = ref_new(NL, H, D);
    for (int step = 0; step < steps; step++) {
        int s;
        do s = (int)(rng_next() % MAXS);
        while (!seqs[s]);
        const int op = (int)(rng_next() % 100);
        if (op < 50) { /* a chunk for every layer, as a forward pass appends */
            const int64_t n = pick_chunk();
            if (mi_kv_seq_tokens(seqs[s]) + n > 1500) continue;
            for (int32_t l = 0; l < NL; l++) append_random(seqs[s], refs[s], l, n);
        } else if (op < 60) { /* one layer only: layers of different lengths */
            append_random(seqs[s], refs[s], (int32_t)(rng_next() % NL), pick_chunk());
        } else if (op < 72) {
            int64_t shortest = INT64_MAX;
            for (int32_t l = 0; l < NL; l++)
                if (refs[s]->layers[l].len < shortest) shortest = refs[s]->layers[l].len;
            const int64_t n = rng_int(0, shortest < 130 ? shortest : 130);
            CHECK_STATUS(mi_kv_seq_rewind(seqs[s], n), MI_STATUS_SUCCESS);
            for (int32_t l = 0; l < NL; l++) refs[s]->layers[l].len -= n;
        } else if (op < 78) {
            const int32_t l = (int32_t)(rng_next() % NL);
            const int64_t len = rng_int(0, refs[s]->layers[l].len);
            CHECK_STATUS(mi_kv_seq_truncate(seqs[s], l, len), MI_STATUS_SUCCESS);
            refs[s]->layers[l].len = len;
        } else if (op < 92) {
            int t = 0;
            while (t < MAXS && seqs[t]) t++;
            if (t == MAXS) continue;
            CHECK_STATUS(mi_kv_seq_fork(seqs[s], &seqs[t]), MI_STATUS_SUCCESS);
            refs[t] = ref_copy(refs[s]);
            check_vs_ref(seqs[t], refs[t], dt, what);
        } else {
            int live = 0;
            for (int t = 0; t < MAXS; t++) live += seqs[t] != NULL;
            if (live < 2) continue;
            mi_kv_seq_destroy(seqs[s]);
            ref_free(refs[s]);
            seqs[s] = NULL, refs[s] = NULL;
            continue;
        }
        check_vs_ref(seqs[s], refs[s], dt, what);
        if (step % 16 == 0)
            for (int t = 0; t < MAXS; t++)
                if (seqs[t]) check_vs_ref(seqs[t], refs[t], dt, what);
    }
    for (int t = 0; t < MAXS; t++)
        if (seqs[t]) check_vs_ref(seqs[t], refs[t], dt, what);
    /* the pool's count of used pages is the number of distinct pages the sequences reference */
    mi_kv_pool_stats ps;
    CHECK_STATUS(mi_kv_pool_stats_get(pool, &ps), MI_STATUS_SUCCESS);
    int64_t referenced = 0;
    for (int t = 0; t < MAXS; t++) {
        if (!seqs[t]) continue;
        mi_kv_seq_stats ss;
        mi_kv_seq_stats_get(seqs[t], &ss);
        referenced += ss.pages;
    }
    CHECK(ps.used_pages <= referenced && ps.used_pages <= ps.allocated_pages);
    for (int t = 0; t < MAXS; t++) {
        mi_kv_seq_destroy(seqs[t]);
        ref_free(refs[t]);
    }
    CHECK_STATUS(mi_kv_pool_stats_get(pool, &ps), MI_STATUS_SUCCESS);
    CHECK(ps.used_pages == 0 && ps.shared_pages == 0 && ps.live_sequences == 0);
    mi_kv_pool_destroy(pool);
}

/* The same chunks appended to a sequence: the replay of a fork's history. */
typedef struct history {
    chunk c[8];
    int n;
} history;

static void replay(mi_kv_seq *seq, const history *h, int32_t NL) {
    for (int i = 0; i < h->n; i++)
        for (int32_t l = 0; l < NL; l++)
            CHECK_STATUS(mi_kv_seq_append(seq, l, &h->c[i].tk, &h->c[i].tv), MI_STATUS_SUCCESS);
}

static bool same_rows(const mi_kv_seq *a, const mi_kv_seq *b, int32_t NL, int32_t H, int32_t D) {
    bool same = true;
    for (int32_t l = 0; l < NL; l++) {
        const int64_t n = mi_kv_seq_length(a, l);
        if (n != mi_kv_seq_length(b, l)) return false;
        for (int kv = 0; kv < 2; kv++) {
            float *x = read_layer(a, l, kv, H, D), *y = read_layer(b, l, kv, H, D);
            same = same && memcmp(x, y, (size_t)n * H * D * sizeof(float)) == 0;
            free(x), free(y);
        }
    }
    return same;
}

/* fork + divergent appends == two sequences built separately, bit for bit; the parent is
 * unchanged by the child; the shared prefix is stored once. */
static void test_fork(mi_kv_dtype dt, int64_t prefix_chunk) {
    const int32_t NL = 2, H = 3, D = 8, P = 16;
    mi_kv_pool *pool = make_pool(NL, H, D, dt, P, 0, MI_KV_META_KEY_MINMAX);
    history pre = {.n = 2}, a = {.n = 2}, b = {.n = 1};
    pre.c[0] = chunk_make(H, D, prefix_chunk, MI_DTYPE_F32, false, 1.0f);
    pre.c[1] = chunk_make(H, D, 5, MI_DTYPE_F32, false, 0.5f);
    a.c[0] = chunk_make(H, D, 3, MI_DTYPE_F32, false, 4.0f); /* grows the fp8 scale */
    a.c[1] = chunk_make(H, D, 40, MI_DTYPE_BF16, true, 1.0f);
    b.c[0] = chunk_make(H, D, 1, MI_DTYPE_F16, false, 0.1f);

    mi_kv_seq *parent, *child, *sa, *sb, *snap;
    mi_kv_seq_create(pool, &parent);
    replay(parent, &pre, NL);
    mi_kv_seq_create(pool, &snap);
    replay(snap, &pre, NL);
    mi_kv_seq_stats st0;
    mi_kv_seq_stats_get(parent, &st0);
    mi_kv_pool_stats p0, p1;
    mi_kv_pool_stats_get(pool, &p0);
    CHECK_STATUS(mi_kv_seq_fork(parent, &child), MI_STATUS_SUCCESS);
    mi_kv_pool_stats_get(pool, &p1);
    CHECK(p1.used_pages == p0.used_pages); /* no copy */
    mi_kv_seq_stats sc;
    mi_kv_seq_stats_get(child, &sc);
    CHECK(sc.pages == st0.pages && sc.shared_pages == sc.pages && sc.shared_bytes == sc.bytes);
    CHECK(same_rows(parent, child, NL, H, D));

    replay(child, &a, NL);
    CHECK(same_rows(parent, snap, NL, H, D)); /* the parent did not see the child's rows */
    check_pages(parent, "fork parent");
    replay(parent, &b, NL);
    mi_kv_seq_create(pool, &sa);
    replay(sa, &pre, NL);
    replay(sa, &a, NL);
    mi_kv_seq_create(pool, &sb);
    replay(sb, &pre, NL);
    replay(sb, &b, NL);
    CHECK(same_rows(child, sa, NL, H, D));
    CHECK(same_rows(parent, sb, NL, H, D));
    check_pages(child, "fork child");
    check_pages(parent, "fork parent");
    /* the full pages of the prefix are still shared; the partly filled one was copied */
    mi_kv_seq_stats_get(child, &sc);
    const int64_t full = (prefix_chunk + 5) / P;
    CHECK(sc.shared_pages == NL * full);

    /* truncating into a shared page keeps it shared and the other side intact */
    mi_kv_seq *c2;
    mi_kv_seq_fork(child, &c2);
    CHECK_STATUS(mi_kv_seq_rewind(c2, 9), MI_STATUS_SUCCESS);
    CHECK(same_rows(child, sa, NL, H, D));
    check_pages(c2, "rewound fork");
    replay(c2, &b, NL); /* copy-on-write of a page whose other owner holds more rows */
    check_pages(c2, "rewound fork + append");
    CHECK(same_rows(child, sa, NL, H, D));
    mi_kv_seq_destroy(child);
    check_pages(c2, "after the sibling went");
    mi_kv_seq_destroy(c2);

    mi_kv_seq_destroy(parent);
    mi_kv_seq_destroy(sa);
    mi_kv_seq_destroy(sb);
    mi_kv_seq_destroy(snap);
    mi_kv_pool_stats_get(pool, &p1);
    CHECK(p1.used_pages == 0 && p1.live_sequences == 0);
    mi_kv_pool_destroy(pool);
    for (int i = 0; i < 2; i++) chunk_free(&pre.c[i]), chunk_free(&a.c[i]);
    chunk_free(&b.c[0]);
}

/* Out of capacity: a clean status and message, the sequence and the pool unchanged. */
static void test_capacity(void) {
    const int32_t NL = 2, H = 2, D = 4, P = 64;
    mi_kv_pool *pool = make_pool(NL, H, D, MI_KV_BF16, P, 256, MI_KV_META_KEY_MINMAX); /* 8 pages */
    mi_kv_pool_stats ps;
    mi_kv_pool_stats_get(pool, &ps);
    CHECK(ps.capacity_pages == 8);
    mi_kv_seq *s;
    mi_kv_seq_create(pool, &s);
    ref_seq *ref = ref_new(NL, H, D);
    for (int32_t l = 0; l < NL; l++) append_random(s, ref, l, 200); /* 4 pages a layer */
    check_vs_ref(s, ref, MI_KV_BF16, "capacity fill");
    /* 250 rows would need a fifth page in layer 0 */
    chunk c = chunk_make(H, D, 57, MI_DTYPE_F32, false, 1.0f);
    CHECK_STATUS(mi_kv_seq_append(s, 0, &c.tk, &c.tv), MI_STATUS_OUT_OF_MEMORY);
    CHECK(strstr(mi_kv_pool_last_error(pool), "full") != NULL);
    check_vs_ref(s, ref, MI_KV_BF16, "capacity after a refused append");
    chunk_free(&c);
    /* the 56 rows that fit do fit */
    append_random(s, ref, 0, 56);
    check_vs_ref(s, ref, MI_KV_BF16, "capacity to the last row");

    /* a fork whose first append needs a copy of the shared page, in a full pool */
    mi_kv_seq *f;
    CHECK_STATUS(mi_kv_seq_fork(s, &f), MI_STATUS_SUCCESS);
    c = chunk_make(H, D, 1, MI_DTYPE_F32, false, 1.0f);
    CHECK_STATUS(mi_kv_seq_append(f, 1, &c.tk, &c.tv), MI_STATUS_OUT_OF_MEMORY);
    check_vs_ref(f, ref, MI_KV_BF16, "capacity: refused copy-on-write, child");
    check_vs_ref(s, ref, MI_KV_BF16, "capacity: refused copy-on-write, parent");
    mi_kv_seq_destroy(s); /* now f owns every page: it appends in place */
    CHECK_STATUS(mi_kv_seq_append(f, 1, &c.tk, &c.tv), MI_STATUS_SUCCESS);
    ref_append(ref, 1, c.k, c.v, 1);
    check_vs_ref(f, ref, MI_KV_BF16, "capacity: after the parent went");
    chunk_free(&c);
    mi_kv_seq_destroy(f);
    ref_free(ref);
    mi_kv_pool_destroy(pool);

    /* a byte limit */
    mi_kv_pool_params p = mi_kv_pool_default_params();
    p.n_layers = 1, p.n_kv_heads = 1, p.head_dim = 64; /* 64 * 64 * 4 * 2 = 32 KiB a page */
    p.capacity_bytes = 100 * 1024;
    mi_kv_pool *bp;
    CHECK_STATUS(mi_kv_pool_create(NULL, &p, &bp), MI_STATUS_SUCCESS);
    mi_kv_pool_stats_get(bp, &ps);
    CHECK(ps.capacity_pages == 3 && ps.page_bytes == 32768);
    mi_kv_pool_destroy(bp);
}

/* Host memory running out (the caller's allocator refuses): the same clean failure. */
static int alloc_budget;
static void *budget_alloc(void *user, size_t bytes) {
    (void)user;
    if (alloc_budget-- <= 0) return NULL;
    return aligned_alloc(256, bytes);
}
static void budget_free(void *user, void *ptr, size_t bytes) {
    (void)user, (void)bytes;
    free(ptr);
}

static void test_host_oom(void) {
    mi_kv_pool_params p = mi_kv_pool_default_params();
    p.n_layers = 2, p.n_kv_heads = 2, p.head_dim = 8, p.page_tokens = 8, p.slab_pages = 2;
    p.alloc = budget_alloc, p.free = budget_free;
    alloc_budget = 3; /* 6 pages */
    mi_kv_pool *pool;
    CHECK_STATUS(mi_kv_pool_create(NULL, &p, &pool), MI_STATUS_SUCCESS);
    mi_kv_seq *s;
    mi_kv_seq_create(pool, &s);
    ref_seq *ref = ref_new(2, 2, 8);
    append_random(s, ref, 0, 20); /* 3 pages */
    append_random(s, ref, 1, 20); /* 3 more */
    chunk c = chunk_make(2, 8, 5, MI_DTYPE_F32, false, 1.0f);
    CHECK_STATUS(mi_kv_seq_append(s, 0, &c.tk, &c.tv), MI_STATUS_OUT_OF_MEMORY);
    CHECK(strstr(mi_kv_pool_last_error(pool), "host memory") != NULL);
    check_vs_ref(s, ref, MI_KV_F32, "host out of memory");
    append_random(s, ref, 0, 4); /* fills the last page without a new one */
    check_vs_ref(s, ref, MI_KV_F32, "host out of memory, then in place");
    chunk_free(&c);
    mi_kv_seq_destroy(s);
    ref_free(ref);
    mi_kv_pool_destroy(pool);
}

/* The pages' metadata comes from the pool's allocator too (a CUDA model pins both, and its
 * device reads Quest's bounds from there): every key_minmax lies in a block the allocator gave,
 * every block goes back with the size it was asked for, and a refused metadata block fails the
 * append cleanly. */
#define TRACKED_MAX 64
static struct {
    unsigned char *ptr[TRACKED_MAX];
    size_t bytes[TRACKED_MAX];
    int n, live, budget;
    int bad_free;
} tracked;
static void *tracked_alloc(void *user, size_t bytes) {
    (void)user;
    if (tracked.budget-- <= 0 || tracked.n == TRACKED_MAX) return NULL;
    unsigned char *p = aligned_alloc(256, bytes);
    if (!p) return NULL;
    tracked.ptr[tracked.n] = p, tracked.bytes[tracked.n] = bytes;
    tracked.n++, tracked.live++;
    return p;
}
static void tracked_free(void *user, void *ptr, size_t bytes) {
    (void)user;
    int i = 0;
    while (i < tracked.n && tracked.ptr[i] != ptr) i++;
    if (i == tracked.n || tracked.bytes[i] != bytes) tracked.bad_free++;
    if (i < tracked.n) tracked.ptr[i] = NULL;
    tracked.live--;
    free(ptr);
}
static bool tracked_holds(const void *p, size_t size) {
    const unsigned char *c = p;
    for (int i = 0; i < tracked.n; i++)
        if (tracked.ptr[i] && c >= tracked.ptr[i] && c + size <= tracked.ptr[i] + tracked.bytes[i])
            return true;
    return false;
}

static void test_meta_allocator(void) {
    memset(&tracked, 0, sizeof tracked);
    tracked.budget = 1000;
    mi_kv_pool_params p = mi_kv_pool_default_params();
    p.n_layers = 2, p.n_kv_heads = 2, p.head_dim = 8, p.page_tokens = 8, p.slab_pages = 3;
    p.meta_kinds = MI_KV_META_KEY_MINMAX;
    p.alloc = tracked_alloc, p.free = tracked_free;
    mi_kv_pool *pool;
    CHECK_STATUS(mi_kv_pool_create(NULL, &p, &pool), MI_STATUS_SUCCESS);
    mi_kv_seq *s;
    CHECK_STATUS(mi_kv_seq_create(pool, &s), MI_STATUS_SUCCESS);
    ref_seq *ref = ref_new(2, 2, 8);
    for (int32_t l = 0; l < 2; l++) append_random(s, ref, l, 37); /* 5 pages a layer: 4 slabs */
    const size_t meta = (size_t)2 * 2 * 8 * sizeof(float);
    int outside = 0;
    for (int32_t l = 0; l < 2; l++)
        for (int64_t i = 0; i < 5; i++) {
            mi_kv_page_view v;
            CHECK_STATUS(mi_kv_seq_page(s, l, i, &v), MI_STATUS_SUCCESS);
            outside +=
                !v.key_minmax || !tracked_holds(v.key_minmax, meta) || !tracked_holds(v.data, 1);
        }
    CHECK(outside == 0);
    CHECK(tracked.n == 8); /* 4 slabs: pages and metadata each */
    check_vs_ref(s, ref, MI_KV_F32, "metadata from the allocator");
    /* the next slab's pages are given, its metadata refused: nothing appended, nothing leaked */
    tracked.budget = 1;
    const int64_t before = mi_kv_seq_length(s, 0);
    chunk c = chunk_make(2, 8, 8, MI_DTYPE_F32, false, 1.0f);
    for (int k = 0; k < 3; k++) mi_kv_seq_append(s, 0, &c.tk, &c.tv); /* fills the pool */
    CHECK(mi_kv_seq_length(s, 0) < before + 24);
    CHECK(strstr(mi_kv_pool_last_error(pool), "host memory") != NULL);
    chunk_free(&c);
    mi_kv_seq_destroy(s);
    ref_free(ref);
    mi_kv_pool_destroy(pool);
    CHECK(tracked.live == 0 && tracked.bad_free == 0);
}

/* The e4m3 rounding written with libm (round to nearest even), against which the library's
 * bit-level form is checked. */
static uint8_t fp8_reference(float x) {
    if (isnan(x)) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0.015625f) return sign | (uint8_t)rintf(a * 512.0f);
    int e;
    frexpf(a, &e);
    const int q = (int)rintf(ldexpf(a, 4 - e));
    int code = ((e + 6) << 3) + q - 8;
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

static void test_fp8_codec(void) {
    int bad = 0;
    /* every 251st float bit pattern (each exponent, both signs, NaNs and infinities), and a few
     * values each side of every midpoint between two codes, where the rounding decides */
    for (uint64_t u = 0; u < (1ull << 32); u += 251) {
        float x;
        const uint32_t w = (uint32_t)u;
        memcpy(&x, &w, sizeof x);
        bad += mi_fp8_e4m3_from_f32(x) != fp8_reference(x);
    }
    for (int c = 0; c < 0x7e; c++) {
        const float mid =
            0.5f * (mi_fp8_e4m3_to_f32((uint8_t)c) + mi_fp8_e4m3_to_f32((uint8_t)(c + 1)));
        for (int sgn = 0; sgn < 2; sgn++) {
            float x = sgn ? -mid : mid;
            for (int i = 0; i < 3; i++) x = nextafterf(x, 0.0f);
            for (int i = 0; i < 7; i++, x = nextafterf(x, sgn ? -INFINITY : INFINITY))
                bad += mi_fp8_e4m3_from_f32(x) != fp8_reference(x);
        }
    }
    CHECK(bad == 0, "%d values code differently from the libm rounding", bad);
    /* every code's value against the format's definition (libm's ldexpf), bit for bit */
    for (int c = 0; c < 256; c++) {
        const int e = (c >> 3) & 15, m = c & 7;
        float want = e == 15 && m == 7 ? NAN
                     : e == 0          ? ldexpf((float)m, -9)
                                       : ldexpf((float)(8 + m), e - 10);
        if (c & 0x80) want = -want;
        const float got = mi_fp8_e4m3_to_f32((uint8_t)c);
        bad += isnan(want) ? !isnan(got) || signbit(got) != signbit(want)
                           : memcmp(&got, &want, sizeof got) != 0;
    }
    CHECK(bad == 0, "%d codes decode differently from their definition", bad);
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) {
            bad += !isnan(mi_fp8_e4m3_to_f32((uint8_t)c));
            continue;
        }
        const float x = mi_fp8_e4m3_to_f32((uint8_t)c);
        bad += mi_fp8_e4m3_from_f32(x) != c;
        /* codes are monotonic in magnitude */
        if ((c & 0x7f) > 0) bad += fabsf(x) <= fabsf(mi_fp8_e4m3_to_f32((uint8_t)(c - 1)));
    }
    CHECK(bad == 0);
    CHECK(mi_fp8_e4m3_to_f32(0x7e) == 448.0f && mi_fp8_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    CHECK(mi_fp8_e4m3_from_f32(1e6f) == 0x7e && mi_fp8_e4m3_from_f32(-INFINITY) == 0xfe);
    CHECK(isnan(mi_fp8_e4m3_to_f32(mi_fp8_e4m3_from_f32(NAN))));
    /* ties to even: 1.0625 is between 1 (mantissa 0) and 1.125 (mantissa 1) */
    CHECK(mi_fp8_e4m3_to_f32(mi_fp8_e4m3_from_f32(1.0625f)) == 1.0f);
    CHECK(mi_fp8_e4m3_to_f32(mi_fp8_e4m3_from_f32(1.1875f)) == 1.25f);
    CHECK(mi_fp8_e4m3_to_f32(mi_fp8_e4m3_from_f32(ldexpf(3.0f, -10))) == ldexpf(1.0f, -8));
    for (int i = 0; i < 100000; i++) {
        const float x = rng_value(1000.0f);
        const float y = mi_fp8_e4m3_to_f32(mi_fp8_e4m3_from_f32(x));
        const float a = fabsf(x) < 448.0f ? fabsf(x) : 448.0f;
        bad += fabsf(y - (x < 0 ? -a : a)) > ldexpf(a, -4) + ldexpf(1.0f, -10);
    }
    CHECK(bad == 0);
}

/* Every fp8 code through the readers (mi_kv_seq_read, read_tile): the page's codes overwritten
 * with all 256 values (NaN codes, subnormals, both signs) under a few scales and random centres,
 * each read value equal to centre + mi_fp8_e4m3_to_f32(code) * scale bit for bit. */
static void test_fp8_read_all_codes(void) {
    const int32_t H = 2, D = 256, P = 16, N = 20;
    mi_kv_pool *pool = make_pool(1, H, D, MI_KV_FP8_E4M3, P, 0, 0);
    mi_kv_seq *s;
    mi_kv_seq_create(pool, &s);
    ref_seq *ref = ref_new(1, H, D);
    append_random(s, ref, 0, N);
    mi_kv_page_layout L;
    CHECK_OK(mi_kv_pool_layout(pool, &L));
    static const float scales[] = {1.0f, 0x1p-7f, 0x1p+5f, 0x1p-120f};
    int bad = 0;
    for (int si = 0; si < 4; si++) {
        for (int64_t pg = 0; pg * P < N; pg++) {
            mi_kv_page_view v;
            CHECK_OK(mi_kv_seq_page(s, 0, pg, &v));
            unsigned char *base = (unsigned char *)v.data; /* the test writes codes directly */
            for (int kv = 0; kv < 2; kv++)
                for (int32_t h = 0; h < H; h++) {
                    memcpy(base + L.scale_offset + ((size_t)kv * H + h) * 4, &scales[si], 4);
                    for (int32_t d = 0; d < D; d++) {
                        const uint16_t c = mi_f32_to_bf16(rng_value(3.0f));
                        memcpy(base + L.center_offset + (((size_t)kv * H + h) * D + d) * 2, &c, 2);
                    }
                    for (int32_t r = 0; r < v.rows; r++)
                        for (int32_t d = 0; d < D; d++)
                            base[(kv ? L.v_offset : L.k_offset) + h * L.head_stride +
                                 r * L.row_stride + d] = (unsigned char)(d * 7 + r * 13 + h + kv);
                }
        }
        float *k = read_layer(s, 0, 0, H, D), *v = read_layer(s, 0, 1, H, D);
        float tile[P * 256];
        for (int64_t i = 0; i < N; i++) {
            mi_kv_page_view pv;
            CHECK_OK(mi_kv_seq_page(s, 0, i / P, &pv));
            for (int kv = 0; kv < 2; kv++)
                for (int32_t h = 0; h < H; h++) {
                    CHECK_OK(mi_kv_seq_read_tile(s, 0, h, kv, i, 1, tile));
                    for (int32_t d = 0; d < D; d++) {
                        const float want = page_value(&L, pv.data, kv, h, (int32_t)(i % P), d);
                        const float got = (kv ? v : k)[((size_t)i * H + h) * D + d];
                        bad += memcmp(&want, &got, 4) != 0 || memcmp(&want, &tile[d], 4) != 0;
                    }
                }
        }
        free(k), free(v);
    }
    CHECK(bad == 0, "%d fp8 values read differently from their codes' values", bad);
    ref_free(ref);
    mi_kv_seq_destroy(s);
    mi_kv_pool_destroy(pool);
}

/* Bad input: a status and a message, nothing changed. */
static void test_bad_input(void) {
    mi_context *ctx = NULL; /* receives the messages */
    CHECK_OK(mi_context_create(NULL, &ctx));
    mi_kv_pool_params p = mi_kv_pool_default_params();
    mi_kv_pool *pool = NULL;
    CHECK_STATUS(mi_kv_pool_create(ctx, NULL, &pool), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    CHECK(mi_context_last_error(ctx)[0] != 0 && pool == NULL);
    p.n_layers = 2, p.n_kv_heads = 2, p.head_dim = 2000;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_context_last_error(ctx), "head_dim") != NULL);
    p.head_dim = 8, p.dtype = (mi_kv_dtype)9;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    p.dtype = MI_KV_F32, p.page_tokens = 0;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    p.page_tokens = 64, p.meta_kinds = 0x80;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    p.meta_kinds = 0, p.alloc = budget_alloc;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    p.alloc = NULL, p.capacity_bytes = 100;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, &pool), MI_STATUS_INVALID_ARGUMENT);
    p.capacity_bytes = 0;
    CHECK_STATUS(mi_kv_pool_create(ctx, &p, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_pool_create(NULL, &p, &pool), MI_STATUS_SUCCESS);

    mi_kv_pool_destroy(NULL);
    mi_kv_seq_destroy(NULL);
    CHECK_STATUS(mi_kv_seq_create(NULL, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_create(pool, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK(mi_kv_pool_last_error(pool)[0] != 0);
    mi_kv_seq *s;
    CHECK_STATUS(mi_kv_seq_create(pool, &s), MI_STATUS_SUCCESS);
    CHECK(mi_kv_pool_last_error(pool)[0] == 0);
    ref_seq *ref = ref_new(2, 2, 8);
    append_random(s, ref, 0, 10);
    append_random(s, ref, 1, 10);

    chunk c = chunk_make(2, 8, 4, MI_DTYPE_F32, false, 1.0f);
    CHECK_STATUS(mi_kv_seq_append(NULL, 0, &c.tk, &c.tv), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_append(s, 2, &c.tk, &c.tv), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_append(s, -1, &c.tk, &c.tv), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_append(s, 0, NULL, &c.tv), MI_STATUS_INVALID_ARGUMENT);
    mi_tensor t = c.tk;
    t.shape[1] = 3;
    CHECK_STATUS(mi_kv_seq_append(s, 0, &t, &c.tv), MI_STATUS_SHAPE_MISMATCH);
    CHECK(strstr(mi_kv_pool_last_error(pool), "expected [1, 2") != NULL);
    t = c.tv;
    t.shape[2] = 3;
    CHECK_STATUS(mi_kv_seq_append(s, 0, &c.tk, &t), MI_STATUS_SHAPE_MISMATCH);
    t = c.tk;
    t.shape[2] = 0;
    CHECK_STATUS(mi_kv_seq_append(s, 0, &t, &t), MI_STATUS_SHAPE_MISMATCH);
    t = c.tk;
    t.device = MI_DEVICE_CUDA;
    CHECK_STATUS(mi_kv_seq_append(s, 0, &t, &c.tv), MI_STATUS_UNSUPPORTED);
    t = c.tk;
    t.dtype = (mi_dtype)7;
    CHECK_STATUS(mi_kv_seq_append(s, 0, &t, &c.tv), MI_STATUS_UNSUPPORTED);
    t = c.tk;
    t.stride[3] = 2;
    CHECK_STATUS(mi_kv_seq_append(s, 0, &t, &c.tv), MI_STATUS_INVALID_ARGUMENT);
    t = c.tk;
    t.data = NULL;
    CHECK_STATUS(mi_kv_seq_append(s, 0, &t, &c.tv), MI_STATUS_INVALID_ARGUMENT);

    float out[2 * 8 * 4];
    mi_tensor o = mi_tensor_blhd(out, MI_DTYPE_F32, MI_DEVICE_CPU, 1, 2, 4, 8);
    CHECK_STATUS(mi_kv_seq_read(s, 0, 8, 4, &o, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_read(s, 0, -1, 4, &o, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_read(s, 0, 0, 3, &o, NULL), MI_STATUS_SHAPE_MISMATCH);
    CHECK_STATUS(mi_kv_seq_read(s, 5, 0, 4, &o, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_read(s, 0, 6, 4, &o, &o), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_kv_seq_read(s, 0, 10, 0, NULL, NULL), MI_STATUS_SUCCESS);
    CHECK_STATUS(mi_kv_seq_truncate(s, 0, 11), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_truncate(s, 3, 1), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_truncate(s, MI_KV_ALL_LAYERS, -1), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_rewind(s, 11), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_rewind(s, -1), MI_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(mi_kv_pool_last_error(pool), "rewind") != NULL);
    mi_kv_page_view pv;
    CHECK_STATUS(mi_kv_seq_page(s, 0, 1, &pv), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_page(s, 0, 0, NULL), MI_STATUS_INVALID_ARGUMENT);
    const int32_t *ids;
    int64_t np;
    CHECK_STATUS(mi_kv_seq_page_table(s, 0, NULL, &np), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_page_table(s, 9, &ids, &np), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_fork(s, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_stats_get(s, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_pool_stats_get(pool, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_pool_layout(NULL, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK(mi_kv_seq_length(NULL, 0) == -1 && mi_kv_seq_length(s, 2) == -1);
    CHECK(mi_kv_seq_tokens(NULL) == -1 && mi_kv_pool_page_data(pool, -1) == NULL);
    CHECK(mi_kv_pool_page_data(pool, 1 << 30) == NULL && mi_kv_pool_page_data(NULL, 0) == NULL);
    check_vs_ref(s, ref, MI_KV_F32, "after bad input");
    chunk_free(&c);
    ref_free(ref);

    /* destroying the pool first is fine: the sequence keeps it alive */
    mi_kv_pool_destroy(pool);
    CHECK(mi_kv_seq_tokens(s) == 10);
    mi_kv_seq_destroy(s);
    mi_context_destroy(ctx);
}

/* Reads into every dtype and both layouts, and a window in the middle, agree with the f32 read. */
static void test_read_formats(void) {
    const int32_t H = 3, D = 10;
    mi_kv_pool *pool = make_pool(1, H, D, MI_KV_F16, 16, 0, 0);
    mi_kv_seq *s;
    mi_kv_seq_create(pool, &s);
    ref_seq *ref = ref_new(1, H, D);
    append_random(s, ref, 0, 37);
    float *k = read_layer(s, 0, 0, H, D), *v = read_layer(s, 0, 1, H, D);
    const int64_t start = 13, n = 20;
    int bad = 0;
    for (int dt = 0; dt < 3; dt++)
        for (int bhld = 0; bhld < 2; bhld++) {
            const mi_dtype dtype = (mi_dtype)dt;
            unsigned char *kb = malloc((size_t)n * H * D * 4), *vb = malloc((size_t)n * H * D * 4);
            mi_tensor tk = bhld ? mi_tensor_bhld(kb, dtype, MI_DEVICE_CPU, 1, H, n, D)
                                : mi_tensor_blhd(kb, dtype, MI_DEVICE_CPU, 1, H, n, D);
            mi_tensor tv = tk;
            tv.data = vb;
            CHECK_STATUS(mi_kv_seq_read(s, 0, start, n, &tk, &tv), MI_STATUS_SUCCESS);
            for (int kv = 0; kv < 2; kv++)
                for (int64_t i = 0; i < n; i++)
                    for (int32_t h = 0; h < H; h++)
                        for (int32_t d = 0; d < D; d++) {
                            const unsigned char *base = kv ? vb : kb;
                            const size_t at = (size_t)(h * tk.stride[1] + i * tk.stride[2] + d);
                            float x = (kv ? v : k)[((size_t)(start + i) * H + h) * D + d], got;
                            uint16_t u;
                            if (dtype == MI_DTYPE_F32) {
                                memcpy(&got, base + at * 4, 4);
                            } else {
                                memcpy(&u, base + at * 2, 2);
                                got = dtype == MI_DTYPE_F16 ? mi_f16_to_f32(u) : mi_bf16_to_f32(u);
                                x = dtype == MI_DTYPE_F16 ? mi_f16_to_f32(mi_f32_to_f16(x))
                                                          : mi_bf16_to_f32(mi_f32_to_bf16(x));
                            }
                            bad += got != x;
                        }
            free(kb), free(vb);
        }
    CHECK(bad == 0);
    free(k), free(v);
    ref_free(ref);
    mi_kv_seq_destroy(s);
    mi_kv_pool_destroy(pool);
}

/* The page version's promise (bf16 and fp8 pages), checked as a device mirror uses it: one mirror slot per page index
 * (like a contiguous device cache) records a page id, its version and a copy of its rows; after
 * random appends, rewinds, forks and destroys over three sequences, a slot whose id and version
 * still match must hold the page's current values in the rows both have. */
static void test_versions(mi_kv_dtype dt) {
    enum { H = 2, D = 4, P = 8, SLOTS = 64, N_SEQ = 3 };
    mi_kv_pool *pool = make_pool(1, H, D, dt, P, 0, 0);
    typedef struct slot {
        int32_t id, rows;
        uint64_t version;
        float k[P * H * D];
    } slot;
    slot *mirror = calloc(SLOTS, sizeof *mirror);
    for (int i = 0; i < SLOTS; i++) mirror[i].id = -1;
    mi_kv_seq *seqs[N_SEQ] = {NULL};
    float rows[20 * H * D], now[P * H * D];
    int64_t checked = 0, refreshed = 0;
    for (int step = 0; step < 600; step++) {
        const int s = (int)rng_int(0, N_SEQ - 1);
        if (!seqs[s]) {
            const int from = (int)rng_int(0, N_SEQ - 1);
            if (seqs[from])
                CHECK_STATUS(mi_kv_seq_fork(seqs[from], &seqs[s]), MI_STATUS_SUCCESS);
            else
                CHECK_STATUS(mi_kv_seq_create(pool, &seqs[s]), MI_STATUS_SUCCESS);
        }
        const int64_t len = mi_kv_seq_length(seqs[s], 0);
        const int op = (int)rng_int(0, 9);
        if (op < 6 && len < (SLOTS - 3) * P) {
            const int64_t c = rng_int(1, 20);
            /* magnitudes that vary by chunk, so that fp8 scales grow inside pages */
            const float mag = (float)(1 << rng_int(0, 14)) / 1024.0f;
            for (int64_t i = 0; i < c * H * D; i++) rows[i] = mag * (float)rng_int(-100, 100);
            mi_tensor t = mi_tensor_blhd(rows, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, c, D);
            CHECK_STATUS(mi_kv_seq_append(seqs[s], 0, &t, &t), MI_STATUS_SUCCESS);
        } else if (op < 9) {
            CHECK_STATUS(mi_kv_seq_rewind(seqs[s], rng_int(0, len)), MI_STATUS_SUCCESS);
        } else {
            mi_kv_seq_destroy(seqs[s]);
            seqs[s] = NULL;
            continue;
        }
        /* now and then (so that changes pile up between syncs), bring the mirror up to this
         * sequence, checking every slot it keeps */
        if (rng_int(0, 2) == 0) continue;
        const int64_t n = mi_kv_seq_length(seqs[s], 0);
        for (int64_t i = 0; i * P < n; i++) {
            mi_kv_page_view pv;
            CHECK_STATUS(mi_kv_seq_page(seqs[s], 0, i, &pv), MI_STATUS_SUCCESS);
            mi_tensor t = mi_tensor_blhd(now, MI_DTYPE_F32, MI_DEVICE_CPU, 1, H, pv.rows, D);
            CHECK_STATUS(mi_kv_seq_read(seqs[s], 0, i * P, pv.rows, &t, NULL), MI_STATUS_SUCCESS);
            slot *m = &mirror[i];
            if (m->id == pv.page_id && m->version == pv.version) {
                const int32_t both = m->rows < pv.rows ? m->rows : pv.rows;
                CHECK(memcmp(m->k, now, (size_t)both * H * D * sizeof(float)) == 0);
                checked += both;
            } else {
                refreshed++;
            }
            m->id = pv.page_id, m->version = pv.version, m->rows = pv.rows;
            memcpy(m->k, now, (size_t)pv.rows * H * D * sizeof(float));
        }
    }
    CHECK(checked > 1000 && refreshed > 50); /* both branches ran, many times */
    for (int i = 0; i < N_SEQ; i++) mi_kv_seq_destroy(seqs[i]);
    free(mirror);
    mi_kv_pool_destroy(pool);
}

/* A long append copies its middle pages on threads: every page byte, fill and version the same
 * as with one thread, for each storage dtype from f32 and bf16 rows, after a prefix that leaves
 * the first page partial (and, for fp8, with small rows, so the big rows grow its scale). */
static void test_threads(mi_kv_dtype dt, mi_dtype src) {
    char what[96];
    snprintf(what, sizeof what, "threads %s from %s", mi_kv_dtype_name(dt), mi_dtype_name(src));
    const int32_t H = 2, D = 24, P = 64;
    const int64_t n0 = 37, n = 5000; /* past KV_PARALLEL_ROWS, many pages */
    chunk c0 = chunk_make(H, D, n0, src, false, 0.5f), c1 = chunk_make(H, D, n, src, true, 40.f);
    mi_kv_seq *seq[2] = {NULL, NULL};
    mi_kv_pool *pool[2];
    const int saved = omp_get_max_threads();
    for (int t = 0; t < 2; t++) {
        pool[t] = make_pool(1, H, D, dt, P, 0, MI_KV_META_KEY_MINMAX);
        CHECK_STATUS(mi_kv_seq_create(pool[t], &seq[t]), MI_STATUS_SUCCESS);
        omp_set_num_threads(t ? 4 : 1);
        CHECK_STATUS(mi_kv_seq_append(seq[t], 0, &c0.tk, &c0.tv), MI_STATUS_SUCCESS);
        CHECK_STATUS(mi_kv_seq_append(seq[t], 0, &c1.tk, &c1.tv), MI_STATUS_SUCCESS);
    }
    omp_set_num_threads(saved);
    mi_kv_page_layout L;
    CHECK_STATUS(mi_kv_pool_layout(pool[0], &L), MI_STATUS_SUCCESS);
    const int64_t pages = (n0 + n + P - 1) / P;
    int bad = 0;
    for (int64_t i = 0; i < pages; i++) {
        mi_kv_page_view a, b;
        CHECK_STATUS(mi_kv_seq_page(seq[0], 0, i, &a), MI_STATUS_SUCCESS);
        CHECK_STATUS(mi_kv_seq_page(seq[1], 0, i, &b), MI_STATUS_SUCCESS);
        int differ = a.rows != b.rows || a.meta_rows != b.meta_rows || a.version != b.version;
        for (int kv = 0; kv < 2; kv++) /* the rows' values, bit for bit (past them: garbage) */
            for (int32_t h = 0; h < H; h++)
                for (int32_t r = 0; r < a.rows && !differ; r++)
                    for (int32_t d = 0; d < D; d++) {
                        const float x = page_value(&L, a.data, kv, h, r, d),
                                    y = page_value(&L, b.data, kv, h, r, d);
                        differ |= memcmp(&x, &y, sizeof x) != 0;
                    }
        bad += differ;
    }
    CHECK(bad == 0, "%s: %d of %lld pages differ", what, bad, (long long)pages);
    check_pages(seq[1], what);
    for (int t = 0; t < 2; t++) {
        mi_kv_seq_destroy(seq[t]);
        mi_kv_pool_destroy(pool[t]);
    }
    chunk_free(&c0);
    chunk_free(&c1);
}

int main(void) {
    rng_state = 20261206;
    fprintf(stderr, "seed %llu\n", (unsigned long long)rng_state);
    test_fp8_codec();
    test_fp8_read_all_codes();
    test_bad_input();
    test_read_formats();
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++) {
        test_random(DTYPES[i], 64, 2, 24, 160);
        test_random(DTYPES[i], 7, 1, 5, 160);
        test_fork(DTYPES[i], 32);
        test_fork(DTYPES[i], 27);
    }
    test_random(MI_KV_BF16, 64, 8, 128, 40); /* a real model's head shape */
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++) {
        test_threads(DTYPES[i], MI_DTYPE_F32);
        test_threads(DTYPES[i], MI_DTYPE_BF16);
    }
    test_capacity();
    test_host_oom();
    test_meta_allocator();
    test_versions(MI_KV_BF16);
    test_versions(MI_KV_FP8_E4M3);
    return check_finish("kv.seq");
}
