/*
 * test_rowmask_plan.cu: the layout of the dilated and strided kernel (src/cuda/rowmask_plan.cuh)
 * on the host, in CI, without a GPU. For random rules, lengths, offsets and varlen lengths, the
 * kernel's CTAs, warps and tiles are walked as rm_mma_kernel walks them, in one pass and in two;
 * every query row must then keep exactly the keys of the CPU rule (restated here as
 * docs/prefill-methods.md and src/cpu/rowmask.c define it: sinks, the dense band, every
 * stride-th distance of the span; strided: the period's nearest keys and its multiples), no key
 * twice, none in the future; a tile a warp skips must hold none of its rows' keys and a tile it
 * leaves unmasked all of them; and the first pass must write each row exactly once.
 */
#include "rowmask_plan.cuh"

#include "host_expect.h"

#include <algorithm>
#include <vector>

using namespace mi_cuda;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static int rnd(int lo, int hi) { /* uniform in [lo, hi] */
    return lo + (int)(xorshift64(&rng_state) % (uint64_t)(hi - lo + 1));
}

/* The CPU rule: the keys of the row at position p. */
static std::vector<int> rule_keys(const mi_head_plan &hp, int64_t p) {
    std::vector<int> keys;
    const int64_t step = hp.stride > 1 ? hp.stride : 1;
    if (hp.strided) {
        for (int64_t d = 0; d < step && d <= p; d++) keys.push_back((int)(p - d));
        for (int64_t d = step; d <= p; d += step) keys.push_back((int)(p - d));
        return keys;
    }
    const int64_t sinks = std::min<int64_t>(std::max(hp.n_init, 0), p + 1);
    for (int64_t j = 0; j < sinks; j++) keys.push_back((int)j);
    const int64_t dense = std::max(hp.dense_local, 0), span = std::max(hp.n_local, 0);
    for (int64_t d = 0; d < dense && p - d >= sinks; d++) keys.push_back((int)(p - d));
    for (int64_t d = dense; d < span && p - d >= sinks; d += step) keys.push_back((int)(p - d));
    return keys;
}

/* One launch pass of head hd (rows rs apart, the segments parts names, fold: the second pass)
 * over positions q_off..L-1 of a sequence of len: the keys each row keeps go to got, the rows
 * the pass writes to written. */
static void walk_pass(rm_head hd, int L, int q_off, int len, int rs, int parts, int fold,
                      std::vector<std::vector<int>> &got, std::vector<int> &written,
                      const char *what) {
    const int64_t Lq = L - q_off;
    hd.rs = rs, hd.parts = parts, hd.fold = fold;
    hd.groups = (int32_t)rm_ctas(Lq, rs);
    for (int x = 0; x < hd.groups; x++) {
        const int p0 = rm_first_row(q_off, hd, x, RM_BM);
        if (p0 >= L) continue;
        const int n_rows = std::min(RM_BM, (L - 1 - p0) / rs + 1);
        const int n_live = p0 < len ? std::min(n_rows, (len - 1 - p0) / rs + 1) : 0;
        rm_seg sg[3] = {};
        if (n_live > 0) rm_segments(hd, p0, p0 + (n_live - 1) * rs, sg);
        if (!(parts & 1)) sg[0].count = sg[1].count = 0;
        if (!(parts & 2)) sg[2].count = 0;
        const int n_tiles = n_live > 0 ? rm_tiles(sg) : 0;
        if (fold && n_tiles == 0) continue;
        if (!fold)
            for (int i = 0; i < n_rows; i++) written[p0 + i * rs - q_off]++;
        const int last = std::max(n_live - 1, 0);
        for (int t = 0; t < n_tiles; t++) {
            const rm_seg ts = rm_tile(sg, t);
            for (int w0 = 0; w0 < RM_BM; w0 += 16) {
                const bool wlive = w0 < n_live;
                const int wlo = p0 + std::min(w0, last) * rs;
                const int whi = p0 + std::min(w0 + 15, last) * rs;
                const bool any = wlive && rm_tile_any(ts, wlo, whi);
                const bool full = rm_tile_full(ts, wlo, whi);
                for (int i = w0; i < w0 + 16 && i < n_live; i++) {
                    const int pr = p0 + i * rs;
                    for (int col = 0; col < RM_BN; col++) {
                        const bool keep = rm_keeps(ts, col, pr - ts.key0);
                        EXPECT(!full || keep, "%s: row %d, tile %d unmasked, col %d dropped", what,
                               pr, t, col);
                        EXPECT(any || !keep, "%s: row %d, tile %d skipped, col %d kept", what, pr,
                               t, col);
                        if (keep && any) got[pr - q_off].push_back(ts.key0 + col * ts.step);
                    }
                }
            }
        }
    }
}

static void check_case(const mi_head_plan &hp, int L, int q_off, int len, bool two) {
    char what[200];
    snprintf(what, sizeof what,
             "%s n_init %d n_local %d stride %d dense %d, L %d q_off %d len %d, %s pass%s",
             hp.strided ? "strided" : "dilated", hp.n_init, hp.n_local, hp.stride, hp.dense_local,
             L, q_off, len, two ? "two" : "one", two ? "es" : "");
    const rm_head hd = rm_head_of(hp, 0, L);
    const int64_t Lq = L - q_off;
    std::vector<std::vector<int>> got(Lq);
    std::vector<int> written(Lq, 0);
    /* the host's layouts (mi_cuda_rowmask_run): two passes only where they apply */
    if (two && hd.span > hd.dense && hd.step > 1 && hd.n_init + hd.dense > 0) {
        walk_pass(hd, L, q_off, len, 1, 1, 0, got, written, what);
        walk_pass(hd, L, q_off, len, hd.step, 2, 1, got, written, what);
    } else {
        walk_pass(hd, L, q_off, len, hd.span > hd.dense ? hd.step : 1, 3, 0, got, written, what);
    }
    for (int64_t i = 0; i < Lq; i++) {
        const int64_t p = q_off + i;
        EXPECT(written[i] == 1, "%s: row %lld written %d times", what, (long long)p, written[i]);
        std::vector<int> want = p < len ? rule_keys(hp, p) : std::vector<int>();
        std::sort(want.begin(), want.end());
        std::sort(got[i].begin(), got[i].end());
        EXPECT(want == got[i], "%s: row %lld keeps %zu keys, the rule %zu", what, (long long)p,
               got[i].size(), want.size());
        for (int k : got[i])
            EXPECT(k >= 0 && k <= p, "%s: row %lld, key %d", what, (long long)p, k);
    }
}

int main(void) {
    int cases = 0, two_chosen = 0;
    for (int it = 0; it < 1500; it++) {
        mi_head_plan hp;
        memset(&hp, 0, sizeof hp);
        hp.kernel = MI_PLAN_KERNEL_ROWMASK;
        const int L = rnd(1, it < 1200 ? 400 : 3000);
        hp.strided = rnd(0, 2) == 0;
        hp.stride = rnd(0, 4) == 0 ? rnd(1, L + 10) : rnd(0, 9);
        hp.n_init = rnd(0, 3) ? rnd(0, L) : rnd(-5, 0);
        hp.n_local = rnd(0, 4) ? rnd(0, L + 20) : rnd(-3, 1000000);
        hp.dense_local = rnd(0, 2) ? 0 : rnd(0, L);
        /* a row with no key at all (no sinks, band or span past the sinks) is its own case */
        const int q_off = rnd(0, 2) ? 0 : rnd(0, L - 1);
        const int len = rnd(0, 2) ? L : rnd(0, L);
        check_case(hp, L, q_off, len, false);
        check_case(hp, L, q_off, len, true);
        two_chosen += rm_two_passes(rm_head_of(hp, 0, L), L, L - q_off);
        cases++;
    }
    /* the defaults at a length where their windows and strides matter */
    mi_head_plan dil;
    memset(&dil, 0, sizeof dil);
    dil.kernel = MI_PLAN_KERNEL_ROWMASK;
    dil.n_init = 1024, dil.n_local = 8192, dil.stride = 2;
    check_case(dil, 20000, 0, 20000, false);
    mi_head_plan str = dil;
    str.strided = true, str.stride = 128;
    check_case(str, 20000, 0, 20000, false);
    check_case(str, 20000, 0, 20000, true);
    check_case(str, 20000, 19000, 20000, true);
    printf("test_rowmask_plan: %d random rules (two passes chosen for %d) and the defaults\n",
           cases, two_chosen);
    return check_finish("test_rowmask_plan");
}
