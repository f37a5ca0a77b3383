/* test_kv_file.c: session files. save -> load == original (every dtype, bit for bit, metadata
 * rebuilt); truncated, bit-flipped, foreign-model and foreign-geometry files refused with a clear
 * status while the target sequence stays as it was; atomic writes leave no temporary file;
 * write errors carry the system's reason. */
#define _POSIX_C_SOURCE 200809L
#include "kv_test_util.h"

#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

static char dir[64];

static mi_kv_model_id model_id(void) {
    mi_kv_model_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.arch, sizeof id.arch, "llama");
    id.n_layers = 3, id.n_heads = 8, id.n_kv_heads = 2, id.head_dim = 16;
    id.hidden = 128, id.vocab = 1000;
    const char meta[] = "blk.0.attn_q.weight f16 [128, 128]";
    id.weights_hash = mi_kv_hash64(0, meta, sizeof meta);
    return id;
}

static mi_kv_pool *make_pool(mi_kv_dtype dt, int32_t P) {
    mi_kv_pool_params p = mi_kv_pool_default_params();
    p.n_layers = 3, p.n_kv_heads = 2, p.head_dim = 16, p.dtype = dt, p.page_tokens = P;
    p.meta_kinds = MI_KV_META_KEY_MINMAX;
    mi_kv_pool *pool = NULL;
    CHECK_STATUS(mi_kv_pool_create(NULL, &p, &pool), MI_STATUS_SUCCESS);
    return pool;
}

/* A sequence of chunks of awkward sizes; the last layer one chunk short, as in a forward pass
 * that stopped between two layers. */
static mi_kv_seq *make_seq(mi_kv_pool *pool, int64_t rows) {
    mi_kv_seq *s;
    CHECK_STATUS(mi_kv_seq_create(pool, &s), MI_STATUS_SUCCESS);
    for (int64_t done = 0; done < rows;) {
        int64_t n = rng_int(1, 90);
        if (n > rows - done) n = rows - done;
        chunk c = chunk_make(2, 16, n, MI_DTYPE_F32, rng_next() % 2, rng_next() % 2 ? 1.0f : 9.0f);
        for (int32_t l = 0; l < 3; l++)
            if (l < 2 || done + n < rows)
                CHECK_STATUS(mi_kv_seq_append(s, l, &c.tk, &c.tv), MI_STATUS_SUCCESS);
        chunk_free(&c);
        done += n;
    }
    return s;
}

/* Rows, page data and metadata of two sequences, compared exactly. */
static bool same_seq(const mi_kv_seq *a, const mi_kv_seq *b) {
    mi_kv_page_layout L;
    mi_kv_pool_layout(mi_kv_seq_pool(a), &L);
    for (int32_t l = 0; mi_kv_seq_length(a, l) >= 0; l++) {
        const int64_t n = mi_kv_seq_length(a, l);
        if (n != mi_kv_seq_length(b, l)) return false;
        const int32_t *ia, *ib;
        int64_t na, nb;
        mi_kv_seq_page_table(a, l, &ia, &na);
        mi_kv_seq_page_table(b, l, &ib, &nb);
        if (na != nb) return false;
        for (int64_t i = 0; i < na; i++) {
            mi_kv_page_view va, vb;
            mi_kv_seq_page(a, l, i, &va);
            mi_kv_seq_page(b, l, i, &vb);
            if (va.rows != vb.rows) return false;
            for (int kv = 0; kv < 2; kv++)
                for (int32_t h = 0; h < L.n_kv_heads; h++) {
                    const size_t off = (kv ? L.v_offset : L.k_offset) + (size_t)h * L.head_stride;
                    if (memcmp((const char *)va.data + off, (const char *)vb.data + off,
                               (size_t)va.rows * L.row_stride) != 0)
                        return false;
                }
            if (L.has_scales &&
                memcmp(va.k_scale, vb.k_scale, 2 * (size_t)L.n_kv_heads * sizeof(float)) != 0)
                return false;
            /* b was loaded: its metadata covers exactly its rows */
            for (int32_t h = 0; h < L.n_kv_heads && vb.key_minmax; h++)
                for (int32_t d = 0; d < L.head_dim; d++) {
                    float mn = INFINITY, mx = -INFINITY;
                    for (int32_t r = 0; r < vb.rows; r++) {
                        const float x = page_value(&L, vb.data, 0, h, r, d);
                        mn = x < mn ? x : mn, mx = x > mx ? x : mx;
                    }
                    if (vb.key_minmax[(size_t)h * 2 * L.head_dim + d] != mn ||
                        vb.key_minmax[(size_t)h * 2 * L.head_dim + L.head_dim + d] != mx)
                        return false;
                }
        }
    }
    return true;
}

static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fclose(f);
    return n;
}

static unsigned char *slurp(const char *path, long *n) {
    *n = file_size(path);
    unsigned char *b = malloc((size_t)*n + 1);
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(b, 1, (size_t)*n, f) == (size_t)*n);
    if (f) fclose(f);
    return b;
}

static void spit(const char *path, const unsigned char *b, long n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b, 1, (size_t)n, f) == (size_t)n);
    if (f) fclose(f);
}

/* No temporary file left in the test folder. */
static int leftovers(void) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

static void test_round_trip(mi_kv_dtype dt, int32_t P, int64_t rows) {
    char path[128];
    snprintf(path, sizeof path, "%s/rt.kv", dir);
    const mi_kv_model_id id = model_id();
    mi_kv_pool *pool = make_pool(dt, P);
    mi_kv_seq *s = make_seq(pool, rows);
    CHECK_STATUS(mi_kv_seq_save(s, path, &id), MI_STATUS_SUCCESS);
    CHECK(leftovers() == 0);
    mi_kv_seq *t = make_seq(pool, 70); /* overwritten by the load */
    CHECK_STATUS(mi_kv_seq_load(t, path, &id), MI_STATUS_SUCCESS);
    CHECK(same_seq(s, t));
    if (rows < 300) { /* each save syncs the disk: the rest once per dtype */
        mi_kv_seq_destroy(s), mi_kv_seq_destroy(t);
        mi_kv_pool_destroy(pool);
        unlink(path);
        return;
    }
    /* a loaded sequence is an ordinary one: fork it, append, save again */
    mi_kv_seq *f;
    CHECK_STATUS(mi_kv_seq_fork(t, &f), MI_STATUS_SUCCESS);
    chunk c = chunk_make(2, 16, 3, MI_DTYPE_BF16, false, 1.0f);
    for (int32_t l = 0; l < 3; l++)
        CHECK_STATUS(mi_kv_seq_append(f, l, &c.tk, &c.tv), MI_STATUS_SUCCESS);
    chunk_free(&c);
    CHECK(same_seq(s, t));
    CHECK_STATUS(mi_kv_seq_save(f, path, &id), MI_STATUS_SUCCESS); /* replaces the file */
    mi_kv_seq *g;
    mi_kv_seq_create(pool, &g);
    CHECK_STATUS(mi_kv_seq_load(g, path, &id), MI_STATUS_SUCCESS);
    CHECK(same_seq(f, g));
    mi_kv_seq_destroy(s), mi_kv_seq_destroy(t), mi_kv_seq_destroy(f), mi_kv_seq_destroy(g);
    mi_kv_pool_stats ps;
    mi_kv_pool_stats_get(pool, &ps);
    CHECK(ps.used_pages == 0);
    mi_kv_pool_destroy(pool);
    unlink(path);
}

/* A load that must fail with want, leaving target as it was (target's copy: same). */
static void expect_refused(mi_kv_seq *target, const mi_kv_seq *same, const char *path,
                           const mi_kv_model_id *id, mi_status want, const char *needle) {
    mi_kv_pool *pool = mi_kv_seq_pool(target);
    mi_kv_pool_stats before, after;
    mi_kv_pool_stats_get(pool, &before);
    const mi_status st = mi_kv_seq_load(target, path, id);
    if (st != want)
        fprintf(stderr, "load of %s: %s (%s)\n", path, mi_status_name(st),
                mi_kv_pool_last_error(pool));
    CHECK(st == want);
    if (needle && !strstr(mi_kv_pool_last_error(pool), needle))
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", mi_kv_pool_last_error(pool), needle);
    CHECK(!needle || strstr(mi_kv_pool_last_error(pool), needle));
    CHECK(same_seq(same, target));
    mi_kv_pool_stats_get(pool, &after);
    CHECK(after.used_pages == before.used_pages); /* the partial load gave its pages back */
}

/* CRC32C, to forge files whose header checksum still holds */
static uint32_t crc32c(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void test_refusals(mi_kv_dtype dt) {
    char path[128], bad[128];
    snprintf(path, sizeof path, "%s/good.kv", dir);
    snprintf(bad, sizeof bad, "%s/bad.kv", dir);
    const mi_kv_model_id id = model_id();
    mi_kv_pool *pool = make_pool(dt, 64);
    mi_kv_seq *src = make_seq(pool, 150);
    CHECK_STATUS(mi_kv_seq_save(src, path, &id), MI_STATUS_SUCCESS);
    mi_kv_seq *target = make_seq(pool, 40), *copy;
    mi_kv_seq_fork(target, &copy);
    long n;
    unsigned char *good = slurp(path, &n);
    CHECK(n > 128 + 4);

    /* truncated anywhere: header, row counts, pages, checksum */
    const long cuts[] = {0, 1, 64, 127, 128, 129, 136, 137, 500, n / 2, n - 5, n - 4, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(bad, good, cuts[i]);
        expect_refused(target, copy, bad, &id, MI_STATUS_PARSE_ERROR, "truncated");
    }
    /* a byte more */
    unsigned char *longer = malloc((size_t)n + 1);
    memcpy(longer, good, (size_t)n);
    longer[n] = 0;
    spit(bad, longer, n + 1);
    expect_refused(target, copy, bad, &id, MI_STATUS_PARSE_ERROR, "corrupt");
    free(longer);

    /* one flipped bit anywhere: every header byte, then bytes across the body */
    for (long at = 0; at < n; at += at < 128 ? 1 : 1 + (long)(rng_next() % 509)) {
        const unsigned char orig = good[at];
        good[at] ^= (unsigned char)(1u << (rng_next() % 8));
        spit(bad, good, n);
        /* the version field may read as a newer version; everything else is corrupt */
        const uint32_t version = (uint32_t)good[8] | (uint32_t)good[9] << 8 |
                                 (uint32_t)good[10] << 16 | (uint32_t)good[11] << 24;
        expect_refused(target, copy, bad, &id,
                       version > 3 ? MI_STATUS_UNSUPPORTED : MI_STATUS_PARSE_ERROR, NULL);
        good[at] = orig;
    }
    spit(bad, good, n);
    CHECK_STATUS(mi_kv_seq_load(target, bad, &id), MI_STATUS_SUCCESS); /* restored: it loads */
    CHECK(same_seq(src, target));
    mi_kv_seq_destroy(copy);
    mi_kv_seq_fork(target, &copy);

    /* another model: each field of the identity */
    for (int f = 0; f < 8; f++) {
        mi_kv_model_id other = id;
        switch (f) {
        case 0: other.arch[0] = 'q'; break;
        case 1: other.n_heads = 16; break;
        case 2: other.hidden = 256; break;
        case 3: other.vocab = 1001; break;
        case 4: other.weights_hash ^= 1; break;
        default: continue; /* the shapes the pool holds are checked against the pool first */
        }
        expect_refused(target, copy, path, &other, MI_STATUS_INVALID_ARGUMENT, "another model");
    }
    mi_kv_model_id wrong = id;
    wrong.head_dim = 32;
    expect_refused(target, copy, path, &wrong, MI_STATUS_INVALID_ARGUMENT, "pool");
    CHECK_STATUS(mi_kv_seq_save(src, bad, &wrong), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_load(target, path, NULL), MI_STATUS_INVALID_ARGUMENT);
    CHECK(same_seq(copy, target));

    /* another pool geometry: dtype, page size */
    mi_kv_pool *other_pool = make_pool(dt == MI_KV_F32 ? MI_KV_BF16 : MI_KV_F32, 64);
    mi_kv_seq *o = make_seq(other_pool, 10), *ocopy;
    mi_kv_seq_fork(o, &ocopy);
    expect_refused(o, ocopy, path, &id, MI_STATUS_INVALID_ARGUMENT, "pages of");
    mi_kv_seq_destroy(o), mi_kv_seq_destroy(ocopy);
    mi_kv_pool_destroy(other_pool);
    other_pool = make_pool(dt, 32);
    o = make_seq(other_pool, 10);
    mi_kv_seq_fork(o, &ocopy);
    expect_refused(o, ocopy, path, &id, MI_STATUS_INVALID_ARGUMENT, "pages of");
    mi_kv_seq_destroy(o), mi_kv_seq_destroy(ocopy);
    mi_kv_pool_destroy(other_pool);

    /* not a session file; a newer version with a valid header; no such file */
    spit(bad, (const unsigned char *)"{\"json\": true}\n", 15);
    expect_refused(target, copy, bad, &id, MI_STATUS_PARSE_ERROR, "truncated");
    memset(good, 'x', 200);
    spit(bad, good, 200);
    expect_refused(target, copy, bad, &id, MI_STATUS_PARSE_ERROR, "not a KV session file");
    free(good);
    good = slurp(path, &n);
    good[8] = 4;
    spit(bad, good, n);
    expect_refused(target, copy, bad, &id, MI_STATUS_UNSUPPORTED, "version 4");
    /* a huge token count behind a valid header checksum (and rows to match): refused before
     * any page arithmetic on it */
    good[8] = 1;
    for (int huge = 0; huge < 2; huge++) {
        const uint64_t count = huge ? 0x7FFFFFFFFFFFFFFFull : (uint64_t)n + 1;
        put_le(good + 88, count, 8);
        put_le(good + 128, count, 8);
        put_le(good + 124, crc32c(good, 124), 4);
        spit(bad, good, n);
        expect_refused(target, copy, bad, &id, MI_STATUS_PARSE_ERROR, "claims");
    }
    snprintf(bad, sizeof bad, "%s/missing.kv", dir);
    expect_refused(target, copy, bad, &id, MI_STATUS_IO_ERROR, "No such file");
    expect_refused(target, copy, dir, &id, MI_STATUS_IO_ERROR, NULL); /* a folder */
    free(good);

    /* a pool too small for the file: out of memory, target unchanged */
    mi_kv_pool_params p = mi_kv_pool_default_params();
    p.n_layers = 3, p.n_kv_heads = 2, p.head_dim = 16, p.dtype = dt, p.capacity_tokens = 128;
    mi_kv_pool *small;
    CHECK_STATUS(mi_kv_pool_create(NULL, &p, &small), MI_STATUS_SUCCESS);
    o = make_seq(small, 20);
    mi_kv_seq_fork(o, &ocopy);
    expect_refused(o, ocopy, path, &id, MI_STATUS_OUT_OF_MEMORY, "full");
    mi_kv_seq_destroy(o), mi_kv_seq_destroy(ocopy);
    mi_kv_pool_destroy(small);

    /* write errors: a missing folder; the reason is the system's */
    snprintf(bad, sizeof bad, "%s/no/such/folder/x.kv", dir);
    CHECK_STATUS(mi_kv_seq_save(src, bad, &id), MI_STATUS_IO_ERROR);
    CHECK(strstr(mi_kv_pool_last_error(pool), "No such file") != NULL);
    CHECK_STATUS(mi_kv_seq_save(src, dir, &id), MI_STATUS_IO_ERROR); /* over a folder */
    CHECK(leftovers() == 0);
    CHECK_STATUS(mi_kv_seq_save(NULL, path, &id), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_save(src, NULL, &id), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_kv_seq_save(src, "", &id), MI_STATUS_INVALID_ARGUMENT);
    mi_kv_model_id unterminated = id;
    memset(unterminated.arch, 'a', sizeof unterminated.arch);
    CHECK_STATUS(mi_kv_seq_save(src, path, &unterminated), MI_STATUS_INVALID_ARGUMENT);
    CHECK(file_size(path) > 0); /* the refused saves left the earlier file alone */

    /* an empty sequence round-trips */
    mi_kv_seq *e, *e2;
    mi_kv_seq_create(pool, &e);
    CHECK_STATUS(mi_kv_seq_save(e, path, &id), MI_STATUS_SUCCESS);
    CHECK(file_size(path) == 128 + 3 * 8 + 4);
    mi_kv_seq_fork(src, &e2);
    CHECK_STATUS(mi_kv_seq_load(e2, path, &id), MI_STATUS_SUCCESS);
    CHECK(mi_kv_seq_tokens(e2) == 0 && same_seq(e, e2));
    mi_kv_seq_destroy(e), mi_kv_seq_destroy(e2);
    unlink(path);
    snprintf(bad, sizeof bad, "%s/bad.kv", dir);
    unlink(bad);
    mi_kv_seq_destroy(src), mi_kv_seq_destroy(target), mi_kv_seq_destroy(copy);
    mi_kv_pool_destroy(pool);
}

int main(void) {
    rng_state = 47;
    fprintf(stderr, "seed %llu\n", (unsigned long long)rng_state);
    snprintf(dir, sizeof dir, "kvtest_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    const mi_kv_dtype dts[] = {MI_KV_F32, MI_KV_F16, MI_KV_BF16, MI_KV_FP8_E4M3};
    for (int i = 0; i < 4; i++) {
        test_round_trip(dts[i], 64, 300);
        test_round_trip(dts[i], 64, 64);
        test_round_trip(dts[i], 5, 1);
        test_refusals(dts[i]);
    }
    rmdir(dir);
    return check_finish("kv.file");
}
