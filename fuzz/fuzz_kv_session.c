/*
 * fuzz_kv_session: the KV cache's session-file reader (mi_kv_seq_load). The input is the file,
 * except that both CRC32C fields (docs/kv-cache.md: header bytes 124..127, the last 4 bytes for
 * the body) are recomputed before it is written, so that mutations reach the fields behind the
 * checksums. The storage dtype field (offset 80) picks one of four pools (f32, f16, bf16, fp8) of
 * the same model: 2 layers, 2 KV heads of 8, 4 rows per page. A file that loads is read back,
 * saved and loaded again: the writer's file must load.
 */
#include "minference_kv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FZ_LAYERS 2
#define FZ_KV_HEADS 2
#define FZ_HEAD_DIM 8
#define FZ_PAGE 4
#define FZ_MAX_ROWS 4096

static mi_kv_pool *pools[4];
static mi_kv_seq *seqs[4];
static mi_kv_model_id id;
static char path_in[512], path_out[512];
static float *rows_k, *rows_v;

static uint32_t crc32c(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void remove_files(void) {
    unlink(path_in);
    unlink(path_out);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(id.arch, sizeof(id.arch), "llama");
    id.n_layers = FZ_LAYERS;
    id.n_heads = 4;
    id.n_kv_heads = FZ_KV_HEADS;
    id.head_dim = FZ_HEAD_DIM;
    id.hidden = 32;
    id.vocab = 300;
    id.weights_hash = 0x0123456789ABCDEFull;
    for (int d = 0; d < 4; d++) {
        mi_kv_pool_params p = mi_kv_pool_default_params();
        p.n_layers = FZ_LAYERS;
        p.n_kv_heads = FZ_KV_HEADS;
        p.head_dim = FZ_HEAD_DIM;
        p.dtype = (mi_kv_dtype)d;
        p.page_tokens = FZ_PAGE;
        p.capacity_tokens = FZ_MAX_ROWS;
        p.meta_kinds = MI_KV_META_KEY_MINMAX;
        mi_context *ectx = NULL; /* receives the pool's message */
        mi_context_create(NULL, &ectx);
        if (mi_kv_pool_create(ectx, &p, &pools[d]) != MI_STATUS_SUCCESS ||
            mi_kv_seq_create(pools[d], &seqs[d]) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "fuzz_kv_session: %s\n", mi_context_last_error(ectx));
            abort();
        }
        mi_context_destroy(ectx);
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(path_in, sizeof(path_in), "%s/mi_fuzz_kv_%d.in", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    snprintf(path_out, sizeof(path_out), "%s/mi_fuzz_kv_%d.out", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    atexit(remove_files);
    size_t n = (size_t)FZ_KV_HEADS * FZ_MAX_ROWS * FZ_HEAD_DIM;
    rows_k = malloc(n * sizeof(float));
    rows_v = malloc(n * sizeof(float));
    if (!rows_k || !rows_v) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) abort();
    memcpy(buf, data, size);
    if (size >= 132) {
        put_u32(buf + 124, crc32c(buf, 124));
        put_u32(buf + size - 4, crc32c(buf + 128, size - 132));
    }
    int d = size >= 84 ? buf[80] & 3 : 0;
    FILE *f = fopen(path_in, "wb");
    if (!f || fwrite(buf, 1, size, f) != size || fclose(f) != 0) abort();
    free(buf);

    mi_kv_seq *seq = seqs[d];
    if (mi_kv_seq_load(seq, path_in, &id) == MI_STATUS_SUCCESS) {
        int64_t tokens = mi_kv_seq_tokens(seq);
        if (tokens < 0 || tokens > FZ_MAX_ROWS) abort();
        for (int32_t l = 0; l < FZ_LAYERS; l++) {
            int64_t len = mi_kv_seq_length(seq, l);
            if (len < 0 || len > tokens) abort();
            if (len == 0) continue;
            mi_tensor k = mi_tensor_bhld(rows_k, MI_DTYPE_F32, MI_DEVICE_CPU, 1, FZ_KV_HEADS, len,
                                         FZ_HEAD_DIM);
            mi_tensor v = mi_tensor_bhld(rows_v, MI_DTYPE_F32, MI_DEVICE_CPU, 1, FZ_KV_HEADS, len,
                                         FZ_HEAD_DIM);
            if (mi_kv_seq_read(seq, l, 0, len, &k, &v) != MI_STATUS_SUCCESS) abort();
        }
        if (mi_kv_seq_save(seq, path_out, &id) != MI_STATUS_SUCCESS) abort();
        mi_kv_seq *again = NULL;
        if (mi_kv_seq_create(pools[d], &again) != MI_STATUS_SUCCESS) abort();
        if (mi_kv_seq_load(again, path_out, &id) != MI_STATUS_SUCCESS) {
            fprintf(stderr, "a saved session does not load: %s\n", mi_kv_pool_last_error(pools[d]));
            abort();
        }
        if (mi_kv_seq_tokens(again) != tokens) abort();
        mi_kv_seq_destroy(again);
        mi_kv_seq_truncate(seq, MI_KV_ALL_LAYERS, 0);
    }
    return 0;
}
