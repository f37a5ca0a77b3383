/* index.c: layout of the caller-owned index buffers. Everything is int32 in one buffer, counts
 * first, so a single allocation (host or device) holds a whole index. */
#include "internal.h"

#include <stdint.h>

/* Returns 0 when the product overflows or a factor is negative: callers treat 0 as invalid. */
static size_t checked_elems(int64_t a, int64_t b, int64_t c, int64_t d) {
    if (a < 0 || b < 0 || c < 0 || d < 0) return 0;
    const int64_t limit = INT64_MAX / 8;
    int64_t r = a;
    const int64_t f[3] = {b, c, d};
    for (int i = 0; i < 3; i++) {
        if (f[i] != 0 && r > limit / f[i]) return 0;
        r *= f[i];
    }
    return (size_t)r;
}

size_t mi_vs_index_bytes(int32_t batch, int32_t heads, int32_t max_vertical, int32_t max_slash) {
    if (batch <= 0 || heads <= 0 || max_vertical < 0 || max_slash < 0) return 0;
    size_t bh = checked_elems(batch, heads, 1, 1);
    size_t v = checked_elems(batch, heads, max_vertical, 1);
    size_t s = checked_elems(batch, heads, max_slash, 1);
    if (!bh) return 0;
    return (2 * bh + v + s) * sizeof(int32_t);
}

size_t mi_sparse_index_bytes(int32_t batch, int32_t heads, int32_t row_blocks, int32_t max_blocks,
                             int32_t max_columns) {
    if (batch <= 0 || heads <= 0 || row_blocks <= 0 || max_blocks < 0 || max_columns < 0) return 0;
    size_t r = checked_elems(batch, heads, row_blocks, 1);
    size_t b = checked_elems(batch, heads, row_blocks, max_blocks);
    size_t c = checked_elems(batch, heads, row_blocks, max_columns);
    if (!r) return 0;
    return (2 * r + b + c) * sizeof(int32_t);
}

mi_status mi_vs_index_init(mi_vs_index *index, int32_t batch, int32_t heads, int32_t max_vertical,
                           int32_t max_slash, void *buffer, size_t buffer_bytes) {
    if (!index || !buffer) return MI_STATUS_INVALID_ARGUMENT;
    size_t need = mi_vs_index_bytes(batch, heads, max_vertical, max_slash);
    if (need == 0) return MI_STATUS_INVALID_ARGUMENT;
    if (buffer_bytes < need) return MI_STATUS_WORKSPACE_TOO_SMALL;
    if ((uintptr_t)buffer % sizeof(int32_t)) return MI_STATUS_INVALID_ARGUMENT;
    int32_t *p = buffer;
    const size_t bh = (size_t)batch * (size_t)heads;
    index->batch = batch;
    index->heads = heads;
    index->max_vertical = max_vertical;
    index->max_slash = max_slash;
    index->vertical_count = p;
    index->slash_count = p + bh;
    index->vertical_idx = p + 2 * bh;
    index->slash_idx = p + 2 * bh + bh * (size_t)max_vertical;
    return MI_STATUS_SUCCESS;
}

mi_status mi_sparse_index_init(mi_sparse_index *index, int32_t batch, int32_t heads,
                               int32_t row_blocks, int32_t max_blocks, int32_t max_columns,
                               void *buffer, size_t buffer_bytes) {
    if (!index || !buffer) return MI_STATUS_INVALID_ARGUMENT;
    size_t need = mi_sparse_index_bytes(batch, heads, row_blocks, max_blocks, max_columns);
    if (need == 0) return MI_STATUS_INVALID_ARGUMENT;
    if (buffer_bytes < need) return MI_STATUS_WORKSPACE_TOO_SMALL;
    if ((uintptr_t)buffer % sizeof(int32_t)) return MI_STATUS_INVALID_ARGUMENT;
    int32_t *p = buffer;
    const size_t r = (size_t)batch * (size_t)heads * (size_t)row_blocks;
    index->batch = batch;
    index->heads = heads;
    index->row_blocks = row_blocks;
    index->max_blocks = max_blocks;
    index->max_columns = max_columns;
    index->block_count = p;
    index->column_count = p + r;
    index->block_offset = p + 2 * r;
    index->column_index = p + 2 * r + r * (size_t)max_blocks;
    return MI_STATUS_SUCCESS;
}
