/*
 * test_tri_split_plan.cu: the plan that splits Tri-shape heads' dense last rows over chunks of
 * keys (src/cuda/tri_split_plan.cuh), on the host. Properties, counted here from the launch
 * itself: where it must not split (switched off, too short, no Tri-shape heads, too many last
 * rows); when it splits, the heads and grid it names (which heads, their row blocks, chunks that
 * reach every key), chunks even for Hopper's pairs of row blocks, the CTAs of Hopper's kernel
 * within the wave(s) aimed at and the chunk the shortest that keeps them there, sm_80's four
 * CTAs an SM, and the scratch within its bound. Two shapes measured on the H200 have their
 * chunks worked out by hand. Random launches: batch, varlen, mixed head modes, dense_below,
 * SM counts and settings.
 */
#include "tri_split_plan.cuh"

#include "host_expect.h"

#include <vector>

using namespace mi_cuda;

static uint64_t rng_state = 0x6a09e667f3bcc909ull;
static int rnd(int n) { return (int)(xorshift64(&rng_state) % (uint64_t)n); }

static mi_cuda_attn_params params; /* 6 KB: off the stack */

/* A launch of len keys: batch sequences of lens[b] (len where lens is empty), every head
 * dense but tri_heads, which get 128 sinks, a 3968-key window and n_last[i] dense last rows. */
static void make_launch(int batch, int len, const std::vector<int> &lens, int heads,
                        const std::vector<int> &tri_heads, const std::vector<int> &n_last) {
    params = mi_cuda_attn_params{};
    params.batch = batch;
    params.len = len;
    params.heads = heads;
    params.heads_kv = heads;
    params.group = 1;
    params.head_dim = 128;
    params.use_head_modes = 1;
    for (int b = 0; b < batch; ++b) params.seq_lens[b] = lens.empty() ? len : lens[b];
    for (int h = 0; h < heads; ++h) params.head_modes[h] = {MI_CUDA_MODE_DENSE, 0, 0, 0, 0};
    for (size_t i = 0; i < tri_heads.size(); ++i)
        params.head_modes[tri_heads[i]] = {MI_CUDA_MODE_A_SHAPE, 128, 3968, n_last[i], 0};
}

/* The plan's rows of CTAs, counted from the launch: for each (b, Tri-shape h), the 64-key tiles
 * up to the last row of each row block (sm_80) or pair of row blocks (Hopper). */
struct rows_of_launch {
    std::vector<int> tri;       /* the Tri-shape heads */
    std::vector<int64_t> tiles; /* per row of CTAs */
    int64_t row_blocks = 0, tiles_sum = 0;
    int max_rb = 0;
};
static rows_of_launch count_rows(const mi_cuda_attn_params &p, bool pairs) {
    rows_of_launch r;
    for (int h = 0; h < p.heads; ++h)
        if (p.head_modes[h].mode == MI_CUDA_MODE_A_SHAPE && p.head_modes[h].n_last > 0)
            r.tri.push_back(h);
    for (int b = 0; b < p.batch; ++b) {
        const int len = p.seq_lens[b];
        for (int h : r.tri) {
            const int from = p.head_modes[h].dense_below; /* run dense below */
            if (from > 0 && len < from) continue;
            const int last = std::min(p.head_modes[h].n_last, len - 1); /* row 0 sees one key */
            if (last <= 0) continue;
            const int first_row = len - last, rb0 = first_row / 64, rb1 = (len - 1) / 64;
            r.row_blocks += rb1 - rb0 + 1;
            r.max_rb = std::max(r.max_rb, rb1 - rb0 + 1);
            for (int rb = rb0; rb <= rb1; rb += pairs ? 2 : 1) {
                const int last_row = std::min(rb * 64 + (pairs ? 128 : 64), len) - 1;
                r.tiles.push_back(last_row / 64 + 1);
                r.tiles_sum += last_row / 64 + 1;
            }
        }
    }
    return r;
}

static int64_t ctas_of(const rows_of_launch &r, int chunk_tiles) {
    int64_t n = 0;
    for (int64_t t : r.tiles) n += (t + chunk_tiles - 1) / chunk_tiles;
    return n;
}

/* Plans the launch in params and checks every property; returns the chunk length (0: no split). */
static int check_plan(const tri_split_knobs &k, const char *what) {
    tri_split_args sa;
    int64_t z = -1;
    const int64_t items = tri_split_plan(params, k, sa, z);
    const rows_of_launch r = count_rows(params, k.pairs);
    const mi_cuda_attn_params &p = params;
    if (k.from <= 0 || p.len < k.from / 2 || r.row_blocks == 0 || r.row_blocks > 4096) {
        EXPECT(items == 0, "%s: a split where none may be (%lld row blocks)", what,
               (long long)r.row_blocks);
        return 0;
    }
    if (items == 0) return 0; /* the other reasons are checked by the cases that reach them */
    const int step = k.pairs ? 2 : 1;
    EXPECT(sa.n_tri == (int)r.tri.size(), "%s: %d Tri-shape heads named, %zu in the launch", what,
           sa.n_tri, r.tri.size());
    for (int i = 0; i < std::min(sa.n_tri, (int)r.tri.size()); ++i)
        EXPECT(sa.tri_head[i] == r.tri[i], "%s: Tri-shape head %d is %d, not %d", what, i,
               sa.tri_head[i], r.tri[i]);
    EXPECT(z == (int64_t)p.batch * (int64_t)r.tri.size(), "%s: z %lld", what, (long long)z);
    EXPECT(sa.max_rb == r.max_rb, "%s: max_rb %d, not %d", what, sa.max_rb, r.max_rb);
    EXPECT(items == z * sa.max_rb * sa.max_chunks, "%s: %lld items", what, (long long)items);
    EXPECT(items * tri_split_item_bytes(p.head_dim) <= TRI_SPLIT_MAX_BYTES,
           "%s: %lld bytes of scratch", what,
           (long long)(items * tri_split_item_bytes(p.head_dim)));
    const int ct = sa.chunk_tiles;
    EXPECT(ct >= 16 * step && ct % step == 0, "%s: chunks of %d tiles", what, ct);
    /* the chunks reach every key of the longest sequence, and no chunk is past them all */
    EXPECT((int64_t)sa.max_chunks * ct * 64 >= p.len &&
               (int64_t)(sa.max_chunks - 1) * ct * 64 < p.len,
           "%s: %d chunks of %d tiles for %d keys", what, sa.max_chunks, ct, p.len);
    const int64_t sms = std::max(k.sms, 1);
    if (k.pairs) {
        const int per_sm = k.per_sm > 0 ? k.per_sm : 1;
        const int64_t rows = (int64_t)r.tiles.size();
        const int64_t target = std::max<int64_t>(per_sm * sms, (rows + sms - 1) / sms * sms);
        EXPECT(ctas_of(r, ct) <= target, "%s: %lld CTAs for %lld", what, (long long)ctas_of(r, ct),
               (long long)target);
        EXPECT(ct == 32 || ctas_of(r, ct - 2) > target,
               "%s: chunks of %d tiles where %d would do (%lld CTAs for %lld)", what, ct, ct - 2,
               (long long)ctas_of(r, ct - 2), (long long)target);
    } else {
        const int per_sm = k.per_sm > 0 ? k.per_sm : 4;
        const int64_t target = per_sm * sms;
        EXPECT(ct == std::max<int64_t>(16, (r.tiles_sum + target - 1) / target),
               "%s: chunks of %d tiles for %lld tiles on %lld SMs", what, ct,
               (long long)r.tiles_sum, (long long)sms);
    }
    return ct;
}

int main(void) {
    const tri_split_knobs hopper = {16384, 0, 132, true}, sm80 = {16384, 0, 132, false};
    std::vector<int> all32;
    for (int h = 0; h < 32; ++h) all32.push_back(h);

    /* 128K, 32 heads, 100 last rows: a pair of row blocks a head, 2048 tiles each; 4 chunks of
     * 512 make 128 CTAs (5 of 410 would be 160, over the 132 SMs) */
    make_launch(1, 131072, {}, 32, all32, std::vector<int>(32, 100));
    EXPECT(check_plan(hopper, "128K x 32") == 512, "128K x 32: chunks of 512 tiles");
    /* 1M, one head: one pair, 16384 tiles; 131 chunks of 126 (124 would make 133) */
    make_launch(1, 1 << 20, {}, 1, {0}, {100});
    EXPECT(check_plan(hopper, "1M x 1") == 126, "1M x 1: chunks of 126 tiles");
    /* on sm_80 a row block a CTA: 16383 + 16384 tiles over 528 CTAs, chunks of 63 */
    EXPECT(check_plan(sm80, "1M x 1, sm_80") == 63, "1M x 1 on sm_80: chunks of 63 tiles");

    /* where it must not split */
    const tri_split_knobs off = {0, 0, 132, true};
    EXPECT(check_plan(off, "switched off") == 0, "tuning tri_split=-1");
    make_launch(1, 8000, {}, 1, {0}, {100}); /* under half of 16384 */
    EXPECT(check_plan(hopper, "8000 keys") == 0, "8000 keys");
    make_launch(1, 1 << 20, {}, 4, {}, {}); /* no Tri-shape head */
    EXPECT(check_plan(hopper, "no Tri-shape head") == 0, "no Tri-shape head");
    make_launch(1, 1 << 20, {}, 1, {0}, {(1 << 20) - 1}); /* 16384 row blocks */
    EXPECT(check_plan(hopper, "1M of last rows") == 0, "1M of last rows");
    /* 12K keys (under 16384, over half): one head splits, 32 heads' windows fill the SMs */
    make_launch(1, 12288, {}, 1, {0}, {100});
    EXPECT(check_plan(hopper, "12K x 1") > 0, "12K x 1 splits");
    make_launch(1, 12288, {}, 32, all32, std::vector<int>(32, 100));
    EXPECT(check_plan(hopper, "12K x 32") == 0, "12K x 32 does not split");
    /* 256 heads at 1M, one of 4000 last rows (63 row blocks), the others of one: 318 row blocks,
     * under their bound, but the scratch is laid out for 256 heads x 63 row blocks x a chunk,
     * 16128 x 33 KB, over 256 MiB */
    std::vector<int> all256, last256(256, 1);
    for (int h = 0; h < 256; ++h) all256.push_back(h);
    last256[0] = 4000;
    make_launch(1, 1 << 20, {}, 256, all256, last256);
    EXPECT(check_plan(hopper, "1M x 256, scratch") == 0, "scratch over its bound");
    EXPECT(check_plan(sm80, "1M x 256, scratch, sm_80") == 0, "scratch over its bound (sm_80)");
    last256[0] = 100; /* 2 row blocks: 256 x 2 x a chunk, 17 MB */
    make_launch(1, 1 << 20, {}, 256, all256, last256);
    EXPECT(check_plan(hopper, "1M x 256") > 0, "1M x 256 splits");

    /* random launches */
    for (int round = 0; round < 3000; ++round) {
        const int batch = 1 + rnd(4), heads = 1 + rnd(48);
        const int len = rnd(4) == 0 ? 1 + rnd(300000) : 8192 + rnd(120000);
        std::vector<int> lens, tri, last;
        for (int b = 0; b < batch; ++b) lens.push_back(rnd(3) == 0 ? 1 + rnd(len) : len);
        for (int h = 0; h < heads; ++h)
            if (rnd(3) == 0) {
                tri.push_back(h);
                last.push_back(rnd(5) == 0 ? rnd(len + 2) : 1 + rnd(300));
            }
        make_launch(batch, len, lens, heads, tri, last);
        for (int h = 0; h < heads; ++h) /* each head's own crossover, some straddled */
            params.head_modes[h].dense_below = rnd(4) == 0 ? rnd(len + 1) : 0;
        for (int h = 0; h < heads; ++h) /* some heads of other modes */
            if (params.head_modes[h].mode == MI_CUDA_MODE_DENSE && rnd(4) == 0)
                params.head_modes[h].mode = rnd(2) ? MI_CUDA_MODE_SPARSE : MI_CUDA_MODE_A_SHAPE;
        static const int sm_counts[] = {1, 8, 108, 132};
        tri_split_knobs k;
        k.from = rnd(8) == 0 ? rnd(4) * 4096 : 16384;
        k.per_sm = rnd(3) == 0 ? rnd(5) : 0;
        k.sms = sm_counts[rnd(4)];
        k.pairs = rnd(2) == 0;
        char what[96];
        snprintf(what, sizeof what, "round %d (B %d, H %d, L %d)", round, batch, heads, len);
        check_plan(k, what);
    }
    return check_finish("tri_split_plan");
}
