/*
 * test_bs_scores.cu: the layout of the block-sparse estimate's scores in memory and its bit-by-bit
 * k-th largest (src/cuda/bs_scores.cuh), on the host. Properties: the rows of a pair follow each
 * other without gaps or overlaps and end at the pair's size; every row starts 16-byte aligned and
 * holds its m + 1 keys rounded up to 16 bytes, inside its group's tile width; a row's group
 * maxima fit its stride and the pair's; the k-th largest equals the one a sort gives, on random
 * keys of every spread (many equal ones, the extremes 0 and ~0), for every k and for bounds lo
 * anywhere at or below it.
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
        EXPECT(base % 4 == 0, "R %lld m %lld: 16-byte aligned", r, mm);
        EXPECT((m + 1 + 3) / 4 * 4 <= width, "R %lld m %lld: the keys fit", r, mm);
        const int64_t next = m + 1 < rows ? bsr_row_base(m + 1) : bsr_pair_keys(R);
        EXPECT(next == base + width, "R %lld m %lld: rows follow each other", r, mm);
        EXPECT(BSR_GROUPS * (m / BSR_ROWS + 1) <= bsr_max_stride(R), "R %lld m %lld", r, mm);
    }
    EXPECT(rows * bsr_max_stride(R) == bsr_pair_maxima(R), "R %lld: maxima", r);
    EXPECT(bsr_max_stride(R) % 4 == 0, "R %lld: maxima rows 16-byte aligned", r);
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
        }
    }
}

int main() {
    const int64_t lengths[] = {1, 2, 63, 64, 65, 127, 128, 129, 1000, 2048, 4097, 16384};
    for (int64_t R : lengths) test_layout(R);
    EXPECT(bsr_pair_keys(16384) * 4 == 538968064, "1M: 539 MB of keys");
    std::mt19937 rng(20261130);
    const int sizes[] = {1, 2, 3, 31, 32, 33, 100, 257, 1024, 2000};
    const uint32_t spreads[] = {1, 2, 7, 1000, 1u << 20, 0x7fffffffu};
    for (int n : sizes)
        for (uint32_t s : spreads)
            for (int rep = 0; rep < 3; ++rep) test_kth(rng, n, s);
    return CHECK_SUMMARY("bs_scores");
}
