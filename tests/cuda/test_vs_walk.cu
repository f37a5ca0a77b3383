/*
 * test_vs_walk.cu: the walk of the vertical-slash index build (src/cuda/vs_walk.cuh), on the
 * host: the function the kernel runs a thread per row block, against the CPU builder
 * (mi_vs_build_index on a CPU context), row block by row block, with its shortcuts and without.
 * The lists are staged as the kernel stages them (sorted, the strictness checked, the run ends
 * marked), so this checks in CI, without a GPU, what the GPU test checks on a GPU: the same
 * block starts and columns as the CPU, in the same order.
 * Lists: bands of consecutive diagonals between scattered ones (gaps of every size around 64
 * and 128, where windows stop merging), runs with small gaps as the estimator writes them,
 * unsorted lists with duplicates and out-of-range entries, and verticals inside and outside the
 * bands; sequences of several lengths, a shorter second one (varlen).
 */
#include "vs_walk.cuh"

#include "host_expect.h"
#include "minference.h"

#include <algorithm>
#include <functional>
#include <stdlib.h>
#include <vector>

using namespace mi_cuda;

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd() { return (uint32_t)(xorshift64(&rng_state) >> 16); }

/* One (b, h)'s lists staged as vs_index_kernel stages them in shared memory. */
struct staged {
    std::vector<int32_t> V, S;
    std::vector<uint32_t> breaks, break_words;
    vs_walk_lists lists(bool shortcuts) const {
        vs_walk_lists l;
        l.V = V.data();
        l.S = S.data();
        l.nv = (int)V.size();
        l.ns = (int)S.size();
        bool strict_v = true, strict_s = true;
        for (size_t i = 0; i < V.size(); ++i)
            if (i == 0 ? V[0] < 0 : V[i] <= V[i - 1]) strict_v = false;
        for (size_t i = 0; i < S.size(); ++i)
            if ((i > 0 && S[i] >= S[i - 1]) || (i + 1 == S.size() && S[i] < 0)) strict_s = false;
        l.v_prefix = shortcuts && strict_v;
        l.s_runs = shortcuts && strict_s && !S.empty();
        l.breaks = breaks.data();
        l.break_words = break_words.data();
        return l;
    }
};

static staged stage(std::vector<int32_t> v, std::vector<int32_t> s) {
    staged st;
    std::sort(v.begin(), v.end());
    std::sort(s.begin(), s.end(), std::greater<int32_t>());
    st.V = v;
    st.S = s;
    const int ns = (int)s.size(), words = ns / 32 + 1;
    st.breaks.assign(words, 0u);
    st.break_words.assign(words / 32 + 1, 0u);
    for (int i = 0; i < ns; ++i)
        if (vs_walk_ends_run(st.S.data(), ns, i)) st.breaks[i >> 5] |= 1u << (i & 31);
    for (int w = 0; w < words; ++w)
        if (st.breaks[w]) st.break_words[w >> 5] |= 1u << (w & 31);
    return st;
}

/* The walk of every row block of (b, h) against the CPU index's rows, shortcuts on and off. */
static void compare(const char *what, const staged &st, const mi_sparse_index &cpu, int64_t bh,
                    int len) {
    const int R = cpu.row_blocks, mb = cpu.max_blocks, mc = cpu.max_columns;
    std::vector<int32_t> off(mb), col(mc);
    for (int shortcuts = 0; shortcuts < 2; ++shortcuts) {
        const vs_walk_lists l = st.lists(shortcuts != 0);
        for (int m = 0; m < R; ++m) {
            const int64_t row = bh * R + m;
            int nb = 0, nc = 0;
            if (m * 64 < len) {
                std::fill(col.begin(), col.end(), -7);
                const vs_walk_counts n = vs_walk_row(
                    l, m * 64, len, mb, mc, [&](int k, int x) { off[k] = x; },
                    [&](int, int k, int c) { col[k] = c; },
                    [&](int k) { std::copy(st.V.begin(), st.V.begin() + k, col.begin()); });
                nb = n.blocks;
                nc = n.columns;
                EXPECT(n.prefix <= nc && (shortcuts || n.prefix == 0),
                       "%s row %d: prefix %d of %d columns, shortcuts %d", what, m, n.prefix, nc,
                       shortcuts);
            }
            bool same = nb == cpu.block_count[row] && nc == cpu.column_count[row];
            for (int k = 0; same && k < nb; ++k) same = off[k] == cpu.block_offset[row * mb + k];
            for (int k = 0; same && k < nc; ++k) same = col[k] == cpu.column_index[row * mc + k];
            EXPECT(same, "%s (b, h) %lld row %d, shortcuts %d: %d blocks %d columns, CPU %d %d",
                   what, (long long)bh, m, shortcuts, nb, nc, cpu.block_count[row],
                   cpu.column_count[row]);
        }
    }
}

/* Builds the CPU index of these lists (one per (b, h), B = 2 with lengths L and len1) and walks
 * every row block of both. */
static void check_lists(mi_context *ctx, const char *what, int64_t L, int32_t len1,
                        const std::vector<int32_t> (&v)[2], const std::vector<int32_t> (&s)[2]) {
    int32_t mv = 1, ms = 1;
    for (int i = 0; i < 2; ++i) {
        mv = std::max(mv, (int32_t)v[i].size());
        ms = std::max(ms, (int32_t)s[i].size());
    }
    std::vector<char> vbuf(mi_vs_index_bytes(2, 1, mv, ms));
    mi_vs_index vs;
    CHECK_STATUS(mi_vs_index_init(&vs, 2, 1, mv, ms, vbuf.data(), vbuf.size()), MI_STATUS_SUCCESS);
    for (int i = 0; i < 2; ++i) {
        vs.vertical_count[i] = (int32_t)v[i].size();
        vs.slash_count[i] = (int32_t)s[i].size();
        std::copy(v[i].begin(), v[i].end(), vs.vertical_idx + (int64_t)i * mv);
        std::copy(s[i].begin(), s[i].end(), vs.slash_idx + (int64_t)i * ms);
    }
    const int32_t R = (int32_t)((L + 63) / 64), mb = std::min<int64_t>(ms + 1, R + 1);
    const int32_t mc = (int32_t)std::min<int64_t>(mv, L);
    std::vector<char> sbuf(mi_sparse_index_bytes(2, 1, R, mb, mc));
    mi_sparse_index cpu;
    CHECK_STATUS(mi_sparse_index_init(&cpu, 2, 1, R, mb, mc, sbuf.data(), sbuf.size()),
                 MI_STATUS_SUCCESS);
    const int32_t lens[2] = {(int32_t)L, len1};
    CHECK_STATUS(mi_vs_build_index(ctx, L, lens, &vs, &cpu), MI_STATUS_SUCCESS);
    for (int i = 0; i < 2; ++i) compare(what, stage(v[i], s[i]), cpu, i, lens[i]);
}

/* Bands of consecutive diagonals at the start, in the middle and reaching the end, between
 * scattered ones; verticals one in vstep, and the first 30. */
static void bands(mi_context *ctx, int64_t L, uint32_t vstep) {
    std::vector<int32_t> v[2], s[2];
    for (int i = 0; i < 2; ++i)
        for (int64_t d = 0; d < L; ++d) {
            const bool band =
                d < 300 || (d >= 1000 && d < 1100) || (d >= 5000 && d < 5040) || d >= L - 200;
            if (band || rnd() % 97 == 0 || (d % 700 > 600 && rnd() % 3 == 0))
                s[i].push_back((int32_t)d);
            if (d < 30 || rnd() % vstep == 0) v[i].push_back((int32_t)d);
        }
    check_lists(ctx, "bands", L, (int32_t)(L / 2 + 7), v, s);
}

/* Runs as the estimator's lists have them: mostly consecutive diagonals near 0, then runs
 * whose gaps are small (1 .. gap), and beyond them scattered diagonals. */
static void runs(mi_context *ctx, int64_t L, int gap) {
    std::vector<int32_t> v[2], s[2];
    for (int i = 0; i < 2; ++i) {
        int64_t d = 0;
        while (d < L && d < L / 3) {
            s[i].push_back((int32_t)d);
            d += d < 2000 ? 1 : 1 + rnd() % gap;
        }
        for (; d < L; d += 60 + rnd() % 400) s[i].push_back((int32_t)d);
        for (int64_t c = 0; c < L; c += 1 + rnd() % 90) v[i].push_back((int32_t)c);
    }
    check_lists(ctx, "runs", L, (int32_t)(L * 3 / 4), v, s);
}

/* Unsorted lists with duplicates and entries outside [0, L). */
static void messy(mi_context *ctx, int64_t L, int nv, int ns) {
    std::vector<int32_t> v[2], s[2];
    for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < nv; ++j) v[i].push_back((int32_t)(rnd() % (L + 40)) - 20);
        for (int j = 0; j < ns; ++j) s[i].push_back((int32_t)(rnd() % (L + 40)) - 20);
        s[i].push_back(5);
        s[i].push_back(5);
    }
    check_lists(ctx, "messy", L, (int32_t)(L * 2 / 3 + 1), v, s);
}

int main() {
    mi_context_params cp = mi_context_default_params();
    cp.device = MI_DEVICE_CPU;
    cp.n_threads = 1;
    mi_context *ctx = nullptr;
    CHECK_STATUS(mi_context_create(&cp, &ctx), MI_STATUS_SUCCESS);
    if (!ctx) return check_finish("test_vs_walk");
    bands(ctx, 30000, 53);
    bands(ctx, 30000, 9);
    bands(ctx, 4099, 3);
    for (int gap : {2, 8, 64, 65, 127, 200}) runs(ctx, 20000 + 37 * gap, gap);
    messy(ctx, 1000, 40, 60);
    messy(ctx, 4099, 300, 700);
    messy(ctx, 70, 5, 8);
    mi_context_destroy(ctx);
    return check_finish("test_vs_walk");
}
