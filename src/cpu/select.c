/*
 * select.c: deterministic top-k selection and integer set helpers for the estimators.
 *
 * Top-k ranks by value, NaN lowest, ties broken by the lower index: a strict total order, so the
 * result does not depend on the algorithm and is reproducible across runs, thread counts and the
 * GPU backend. Selection is quickselect (median-of-three, Hoare partition) in expected O(n), then
 * the k winners are sorted by index.
 */
#include "cpu_common.h"

#include <math.h>

static inline float rank_key(const float *v, int32_t i) {
    const float x = v[i];
    return x != x ? -INFINITY : x;
}

/* a ranks strictly before b */
static inline int better(const float *v, int32_t a, int32_t b) {
    const float x = rank_key(v, a), y = rank_key(v, b);
    return x > y || (x == y && a < b);
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void mi_cpu_topk(const float *val, int32_t n, int32_t k, int32_t *tmp, int32_t *idx) {
    if (k <= 0 || n <= 0) return;
    if (k > n) k = n;
    for (int32_t i = 0; i < n; i++) tmp[i] = i;
    int32_t lo = 0, hi = n - 1;
    const int32_t target = k - 1;
    while (k < n && lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        int32_t a = tmp[lo], b = tmp[mid], c = tmp[hi];
        /* median of three */
        if (better(val, b, a)) {
            const int32_t x = a;
            a = b;
            b = x;
        }
        if (better(val, c, b)) {
            const int32_t x = b;
            b = c;
            c = x;
        }
        if (better(val, b, a)) {
            const int32_t x = a;
            a = b;
            b = x;
        }
        const int32_t p = b;
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (better(val, tmp[i], p)) i++;
            while (better(val, p, tmp[j])) j--;
            if (i <= j) {
                const int32_t x = tmp[i];
                tmp[i] = tmp[j];
                tmp[j] = x;
                i++;
                j--;
            }
        }
        if (target <= j) {
            hi = j;
        } else if (target >= i) {
            lo = i;
        } else {
            break;
        }
    }
    memcpy(idx, tmp, (size_t)k * sizeof(int32_t));
    qsort(idx, (size_t)k, sizeof(int32_t), cmp_i32);
}

int32_t mi_cpu_sort_unique(int32_t *a, int32_t n) {
    if (n <= 1) return n < 0 ? 0 : n;
    qsort(a, (size_t)n, sizeof(int32_t), cmp_i32);
    int32_t w = 1;
    for (int32_t i = 1; i < n; i++) {
        if (a[i] != a[w - 1]) a[w++] = a[i];
    }
    return w;
}
