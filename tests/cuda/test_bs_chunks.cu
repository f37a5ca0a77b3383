/*
 * test_bs_chunks.cu: the block-sparse estimate's division of row groups into chunks of key tiles
 * (src/cuda/bs_chunks.cuh), on the host: the functions the bound and streaming kernels call to
 * find their work, checked without a GPU over many sequence lengths, head counts, GPU sizes and
 * forced chunk lengths. Properties: every (group, chunk) is one work item, longest groups first;
 * a group's chunks cover its tiles exactly once, nearest the diagonal first, each at most the
 * chunk length; clipped to a shorter sequence they cover exactly its tiles; the chunk length
 * respects its limits and the documented choices.
 */
#include "bs_chunks.cuh"

#include "host_expect.h"

#include <vector>

using namespace mi_cuda;

/* The chunk lengths the source documents (bss_chunk_tiles_for), on an H200's 132 SMs. */
static void test_documented_choices() {
    const int64_t slots = 264;
    EXPECT(bss_chunk_tiles_for(1, 256, slots, -1) == 64, "1M x 1 head");
    EXPECT(bss_chunk_tiles_for(1, 128, slots, -1) == 32, "512K x 1 head");
    EXPECT(bss_chunk_tiles_for(8, 32, slots, -1) == 16, "128K x 8 heads");
    EXPECT(bss_chunk_tiles_for(2, 256, slots, -1) == 0, "1M x 2 heads");
    EXPECT(bss_chunk_tiles_for(16, 32, slots, -1) == 0, "128K x 16 heads");
    EXPECT(bss_chunk_tiles_for(32, 32, slots, -1) == 0, "128K x 32 heads");
    EXPECT(bss_chunk_tiles_for(32, 256, slots, -1) == 0, "1M x 32 heads");
    EXPECT(bss_chunk_tiles_for(1, 256, slots, 0) == 0, "never split");
    EXPECT(bss_chunk_tiles_for(4, 10, slots, 1) == 3, "forced 1 tile, 10 groups: 4 chunks");
    EXPECT(bss_chunk_tiles_for(4, 10, slots, 50) == 0, "forced past the longest group");
    EXPECT(bss_chunk_tiles_for(1, 1, slots, 1) == 0, "one group");
}

/* The limits of the chunk length, whatever the inputs. */
static void test_chunk_length(int64_t pairs, int64_t groups, int64_t slots, int forced) {
    const int C = bss_chunk_tiles_for(pairs, groups, slots, forced);
    const char *fmt = "pairs %lld groups %lld slots %lld forced %d: C %d";
    const long long p = pairs, g = groups, s = slots;
    EXPECT(C == 0 || (C > 0 && C < groups), fmt, p, g, s, forced, C);
    if (forced == 0) EXPECT(C == 0, fmt, p, g, s, forced, C);
    if (C == 0) return;
    EXPECT(bss_group_chunks((int)groups - 1, C) <= BSS_SPLIT_MAX, fmt, p, g, s, forced, C);
    EXPECT(bss_group_chunks((int)groups - 1, C) >= 2, fmt, p, g, s, forced, C);
    if (forced > 0) EXPECT(C >= forced, fmt, p, g, s, forced, C);
    if (forced < 0) {
        const int64_t tiles = pairs * groups * (groups + 1) / 2;
        EXPECT(C >= BSS_SPLIT_MIN_TILES, fmt, p, g, s, forced, C);
        EXPECT(4 * tiles <= 3 * groups * slots, fmt, p, g, s, forced, C);
    }
}

/* The work items of a launch over `groups` row groups, `groups_r` of them with tiles, in chunks
 * of chunk_tiles (0: none). */
static void test_work_items(int groups, int groups_r, int C) {
    const char *fmt = "groups %d groups_r %d C %d x %d";
    bss_plan plan;
    plan.chunk_tiles = C;
    plan.groups = groups;
    plan.groups_r = groups_r;
    plan.split_items = C > 0 ? bss_split_items(groups_r, C) : 0;
    const int items = C > 0 ? plan.split_items + groups - groups_r : groups;
    std::vector<std::vector<int>> seen(groups, std::vector<int>(BSS_SPLIT_MAX, 0));
    int last_group = groups;
    for (int x = 0; x < items; ++x) {
        const bss_work w = bss_work_of(plan, x);
        const bool ok = w.group >= 0 && w.group < groups && w.chunk >= 0 && w.chunk < w.chunks &&
                        w.chunks >= 1 && w.chunks <= BSS_SPLIT_MAX;
        EXPECT(ok, fmt, groups, groups_r, C, x);
        if (!ok) continue;
        const int want = C > 0 && w.group < groups_r ? bss_group_chunks(w.group, C) : 1;
        EXPECT(w.chunks == want, fmt, groups, groups_r, C, x);
        seen[w.group][w.chunk]++;
        /* longest first: the groups with tiles come in descending order */
        if (C == 0 || x < plan.split_items) {
            EXPECT(w.group <= last_group, fmt, groups, groups_r, C, x);
            last_group = w.group;
        }
    }
    for (int g = 0; g < groups; ++g) {
        const int chunks = C > 0 && g < groups_r ? bss_group_chunks(g, C) : 1;
        for (int s = 0; s < BSS_SPLIT_MAX; ++s)
            EXPECT(seen[g][s] == (s < chunks ? 1 : 0), fmt, groups, groups_r, C, g);
    }
}

/* A group's chunks against its tiles, and clipped to n_tiles of a shorter sequence. */
static void test_ranges(int group, int C) {
    const int n = group + 1, chunks = C > 0 ? bss_group_chunks(group, C) : 1;
    const char *fmt = "group %d C %d n_tiles %d";
    const int clips[] = {n, n - 1, n / 2, 1, 0};
    for (int n_tiles : clips) {
        if (n_tiles < 0) continue;
        std::vector<int> cover(n, 0);
        int prev_lo = n, min_span = n, max_span = 0;
        for (int s = 0; s < chunks; ++s) {
            const bss_range r = bss_range_of(bss_work{group, s, chunks}, n_tiles);
            EXPECT(r.lo >= 0 && r.lo <= r.hi && r.hi <= n_tiles, fmt, group, C, n_tiles);
            if (!(r.lo >= 0 && r.lo <= r.hi && r.hi <= n_tiles)) return;
            for (int t = r.lo; t < r.hi; ++t) cover[t]++;
            /* chunk 0 the highest tiles, each chunk below the one before */
            EXPECT(r.hi <= prev_lo || r.lo == r.hi, fmt, group, C, n_tiles);
            if (r.lo < r.hi) prev_lo = r.lo;
            if (chunks > 1) EXPECT(r.span <= C, fmt, group, C, n_tiles);
            min_span = r.span < min_span ? r.span : min_span;
            max_span = r.span > max_span ? r.span : max_span;
        }
        for (int t = 0; t < n; ++t)
            EXPECT(cover[t] == (t < n_tiles ? 1 : 0), fmt, group, C, n_tiles);
        EXPECT(max_span - min_span <= 1, fmt, group, C, n_tiles);
    }
}

int main() {
    test_documented_choices();
    const int64_t slots[] = {264, 216, 156, 16};
    const int forced[] = {-1, 0, 1, 2, 3, 5, 16, 43, 64, 200};
    const int64_t pairs[] = {1, 2, 3, 4, 8, 16, 31, 32, 64};
    for (int64_t groups = 1; groups <= 300; ++groups)
        for (int64_t p : pairs)
            for (int64_t s : slots)
                for (int f : forced) test_chunk_length(p, groups, s, f);
    /* every chunk length a launch can take, with and without groups past the sequence */
    for (int groups_r = 1; groups_r <= 300; groups_r += (groups_r < 40 ? 1 : 7)) {
        test_work_items(groups_r, groups_r, 0);
        test_work_items(groups_r + 3, groups_r, 0);
        for (int C = (groups_r + BSS_SPLIT_MAX - 1) / BSS_SPLIT_MAX; C < groups_r; ++C) {
            test_work_items(groups_r, groups_r, C);
            test_work_items(groups_r + 2, groups_r, C);
        }
    }
    for (int group = 0; group < 300; ++group) {
        test_ranges(group, 0);
        for (int C = (group + 1 + BSS_SPLIT_MAX - 1) / BSS_SPLIT_MAX; C <= group; ++C)
            test_ranges(group, C);
    }
    return check_finish("bs_chunks");
}
