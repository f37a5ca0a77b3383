/*
 * test_bs_scores.cu: the layout of the block-sparse estimate's scores in memory and its bit-by-bit
 * k-th largest (src/cuda/bs_scores.cuh), on the host. Properties: the rows of a pair follow each
 * other without gaps or overlaps and end at the pair's size; every row starts 16-byte aligned and
 * holds its m + 1 keys rounded up to 16 bytes, inside its group's tile width; a row's group
 * summaries fit its stride and the pair's; the k-th largest equals the one a sort gives, on random
 * keys of every spread (many equal ones, the extremes 0 and ~0), for every k and for bounds lo
 * anywhere at or below it. The group summaries of 16-bit keys: two lanes' top-two pairs of each
 * half word merged as the score kernels merge them give a group's two largest keys (16x2 max and
 * min run on the host as plain code); the summaries' bound searched to its end (slack -1)
 * equals the k-th largest nonzero 16-bit value a sort gives (0 where fewer than k), and at least
 * k keys of the row reach it, on rows of every length and spread with zeros past their end; the
 * search that stops early gives a bound too, within k + slack values of k or the exact one, and
 * the countdown form of the count agrees with the count. The k-th
 * largest in two phases (bsr_kth_largest_listed) is the same for every size of its list, which
 * never overflows.
 */
#include "bs_scores.cuh"

#include "host_expect.h"

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

using namespace mi_cuda;

static void test_layout(int64_t R) {
    const int64_t groups = (R + BSR_ROWS - 1) / BSR_ROWS, rows = groups * BSR_ROWS;
    const long long r = R;
    EXPECT(bsr_row_base(0) == 0, "R %lld", r);
    for (int64_t m = 0; m < rows; ++m) {
        const int64_t width = BSR_TILE_KEYS * (m / BSR_ROWS + 1), base = bsr_row_base(m);
        const long long mm = m;
        EXPECT(base % 8 == 0, "R %lld m %lld: 16-byte aligned", r, mm);
        EXPECT((m + 1 + 7) / 8 * 8 <= width, "R %lld m %lld: the keys fit", r, mm);
        const int64_t next = m + 1 < rows ? bsr_row_base(m + 1) : bsr_pair_keys(R);
        EXPECT(next == base + width, "R %lld m %lld: rows follow each other", r, mm);
        EXPECT(BSR_GROUPS * (m / BSR_ROWS + 1) <= bsr_summary_stride(R), "R %lld m %lld", r, mm);
    }
    EXPECT(rows * bsr_summary_stride(R) == bsr_pair_summaries(R), "R %lld: summaries", r);
    EXPECT(bsr_summary_stride(R) % 4 == 0, "R %lld: summary rows 16-byte aligned", r);
}

static void test_kth(std::mt19937 &rng, int n, uint32_t spread) {
    std::vector<uint32_t> v(n);
    for (auto &x : v) {
        const uint32_t pick = rng() % 16;
        x = pick == 0 ? 0u : pick == 1 ? ~0u : 0x80000000u + (uint32_t)(rng() % spread);
    }
    std::vector<uint32_t> sorted = v;
    std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
    auto count_ge = [&](uint32_t c) {
        int cnt = 0;
        for (uint32_t x : v) cnt += x >= c;
        return cnt;
    };
    for (int k = 1; k <= n; k += 1 + n / 40) {
        const uint32_t want = sorted[k - 1], hi = sorted[0];
        const uint32_t below = want ? (uint32_t)(rng() % (want / 64 + 1)) : 0u;
        const uint32_t los[] = {0u, want, want / 2, want - below};
        for (uint32_t lo : los) {
            const uint32_t got = bsr_kth_largest(count_ge, k, lo, hi);
            EXPECT(got == want, "n %d spread %u k %d lo %08x: %08x, want %08x", n, spread, k, lo,
                   got, want);
            for (int cap : {0, 1, 8, 32, 4096}) {
                std::vector<uint32_t> list;
                int lists = 0;
                const uint32_t listed = bsr_kth_largest_listed(
                    count_ge,
                    [&](uint32_t x, int bit) {
                        ++lists;
                        for (uint32_t y : v)
                            if (y >= lo && ((y - x) >> bit) <= 1) list.push_back(y);
                        EXPECT((int)list.size() <= cap, "n %d k %d cap %d: %zu listed", n, k, cap,
                               list.size());
                    },
                    [&](uint32_t c) {
                        int cnt = 0;
                        for (uint32_t y : list) cnt += y >= c;
                        return cnt;
                    },
                    k, lo, hi, cap, count_ge(lo));
                EXPECT(listed == want, "n %d spread %u k %d lo %08x cap %d: %08x, want %08x", n,
                       spread, k, lo, cap, listed, want);
                EXPECT(lists <= 1, "n %d k %d cap %d: listed %d times", n, k, cap, lists);
            }
        }
    }
}

/* The score kernels' summary of 16 16-bit keys: two lanes' two largest of each half of four
 * words (two keys a word, the first in the low half), merged with the other lane's, then the
 * halves merged (both lanes end with the same summary). */
static uint32_t summary_of(const uint32_t *g) {
    uint32_t top[2], second[2];
    for (int l = 0; l < 2; ++l) {
        uint32_t w[4];
        for (int i = 0; i < 4; ++i) w[i] = g[8 * l + 2 * i] | g[8 * l + 2 * i + 1] << 16;
        bsr_top2_16x2_of4(w, top[l], second[l]);
    }
    uint32_t sum[2];
    for (int l = 0; l < 2; ++l) {
        uint32_t t = top[l], s = second[l];
        bsr_top2_16x2_merge(t, s, top[l ^ 1], second[l ^ 1]);
        sum[l] = bsr_summary_16x2(t, s);
    }
    EXPECT(sum[1] == sum[0], "lanes agree");
    return sum[0];
}

/* A row of n 16-bit keys (zeros past its end) in groups: each group's summary is its two
 * largest; the summaries' bound is the k-th largest nonzero value of those, and reached by at
 * least k keys. */
static void test_summaries(std::mt19937 &rng, int n, uint32_t spread) {
    const int groups = (n + BSR_GROUP_KEYS - 1) / BSR_GROUP_KEYS + (int)(rng() % 2);
    std::vector<uint32_t> keys(groups * BSR_GROUP_KEYS, 0u); /* zeros past the row's end */
    for (int j = 0; j < n; ++j) {
        const uint32_t pick = rng() % 16;
        keys[j] = pick == 0 ? 0xffffu : pick == 1 ? 1u : 0x8000u + (uint32_t)(rng() % spread);
    }
    std::vector<uint32_t> sums(groups), halves;
    for (int gi = 0; gi < groups; ++gi) {
        std::vector<uint32_t> g(keys.begin() + gi * BSR_GROUP_KEYS,
                                keys.begin() + (gi + 1) * BSR_GROUP_KEYS);
        sums[gi] = summary_of(g.data());
        std::sort(g.begin(), g.end(), std::greater<uint32_t>());
        EXPECT(sums[gi] == bsr_group_summary(g[0] << 16, g[1] << 16),
               "n %d group %d: the two largest", n, gi);
        for (int i = 0; i < 2; ++i)
            if (g[i]) halves.push_back(g[i]);
    }
    std::sort(halves.begin(), halves.end(), std::greater<uint32_t>());
    uint32_t lo16 = 0xffffu, hi16 = 0u;
    for (uint32_t w : sums) bsr_summary_range(w, lo16, hi16);
    auto count_ge = [&](uint32_t c) {
        int cnt = 0;
        for (uint32_t w : sums) cnt += bsr_summary_count(w, c);
        return cnt;
    };
    std::vector<uint32_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
    for (int k = 1; k <= n; k += 1 + n / 30) {
        const uint32_t x16 = bsr_summary_bound(count_ge, k, -1, lo16, hi16);
        const uint32_t want = k <= (int)halves.size() ? halves[k - 1] : 0u;
        EXPECT(x16 == want, "n %d spread %u k %d: %04x, want %04x", n, spread, k, x16, want);
        EXPECT(x16 <= sorted[k - 1], "n %d spread %u k %d: %04x bounds %04x", n, spread, k, x16,
               sorted[k - 1]);
        /* the search that stops early: a bound still (at or below the k-th largest value, so at
         * least k values reach it), never below the smallest value, and within k + slack values
         * unless it is the k-th largest itself */
        for (int slack : {0, 1, 7, 32, 200}) {
            const uint32_t near = bsr_summary_bound(count_ge, k, slack, lo16, hi16);
            if (want == 0) {
                EXPECT(near == want, "n %d spread %u k %d slack %d: %04x, want %04x", n, spread, k,
                       slack, near, want);
                continue;
            }
            const int reach = count_ge(near);
            EXPECT(near <= want && near >= lo16, "n %d spread %u k %d slack %d: %04x, at most %04x",
                   n, spread, k, slack, near, want);
            EXPECT(near == want || reach <= k + slack,
                   "n %d spread %u k %d slack %d: %d values reach %04x", n, spread, k, slack, reach,
                   near);
        }
    }
    /* the countdown form of the count */
    for (uint32_t c : {1u, lo16, hi16, (lo16 + hi16) / 2, 0xffffu}) {
        if (c == 0) continue;
        int n_top = 0, n_second = 0, want = 0;
        for (uint32_t w : sums) {
            bsr_summary_count_down(w, c << 16, n_top, n_second);
            want += bsr_summary_count(w, c);
        }
        EXPECT(2 * (int)sums.size() + n_top + n_second == want, "n %d spread %u x16 %04x", n,
               spread, c);
    }
}

int main() {
    const int64_t lengths[] = {1, 2, 63, 64, 65, 127, 128, 129, 1000, 2048, 4097, 16384};
    for (int64_t R : lengths) test_layout(R);
    EXPECT(bsr_pair_keys(16384) * 2 == 269484032, "1M: 269 MB of keys");
    std::mt19937 rng(20261130);
    const int sizes[] = {1, 2, 3, 31, 32, 33, 100, 257, 1024, 2000};
    const uint32_t spreads[] = {1, 2, 7, 1000, 1u << 20, 0x7fffffffu};
    for (int n : sizes)
        for (uint32_t s : spreads)
            for (int rep = 0; rep < 3; ++rep) test_kth(rng, n, s);
    const int rows[] = {1, 2, 15, 16, 17, 100, 257, 1000, 2048, 4000};
    const uint32_t key_spreads[] = {1, 3, 100, 0x1000, 0x7fffu};
    for (int n : rows)
        for (uint32_t s : key_spreads)
            for (int rep = 0; rep < 3; ++rep) test_summaries(rng, n, s);
    return check_finish("bs_scores");
}
