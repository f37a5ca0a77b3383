/* context.c: context lifetime, device selection and build features. */
#include "backend.h"
#include "mi_build_commit.h"
#include "minference_cuda.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

mi_context_params mi_context_default_params(void) {
    mi_context_params p;
    p.device = MI_DEVICE_CPU;
    p.device_id = 0;
    p.n_threads = 0;
    return p;
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

mi_status mi_context_create(const mi_context_params *params, mi_context **out) {
    if (!out) return MI_STATUS_INVALID_ARGUMENT;
    *out = NULL;
    mi_context_params p = params ? *params : mi_context_default_params();
    if (p.device != MI_DEVICE_CPU && p.device != MI_DEVICE_CUDA) return MI_STATUS_INVALID_ARGUMENT;
    if (p.device_id < 0 || p.n_threads > MI_MAX_THREADS) return MI_STATUS_INVALID_ARGUMENT;
    mi_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return MI_STATUS_OUT_OF_MEMORY;
    ctx->params = p;
    ctx->n_threads = p.n_threads > 0 ? p.n_threads : online_cores();
    if (p.device == MI_DEVICE_CUDA) {
        mi_status st = mi_cuda_context_init(ctx);
        if (st != MI_STATUS_SUCCESS) {
            free(ctx);
            return st;
        }
    }
    *out = ctx;
    return MI_STATUS_SUCCESS;
}

void mi_context_destroy(mi_context *ctx) {
    if (!ctx) return;
    if (ctx->params.device == MI_DEVICE_CUDA) mi_cuda_context_release(ctx);
    free(ctx);
}

int mi_context_n_threads(const mi_context *ctx) { return ctx ? ctx->n_threads : 0; }

mi_device_type mi_context_device(const mi_context *ctx) {
    return ctx ? ctx->params.device : MI_DEVICE_CPU;
}

int mi_cuda_device_count(void) { return mi_cuda_devices(); }

const char *mi_build_features(void) {
    static char features[256];
    if (!features[0]) {
        /* Built once; the string is constant for the life of the process. */
        strcpy(features, "cpu openmp");
#ifdef MI_HAVE_OPENBLAS
        strcat(features, " openblas");
#endif
        const char *cuda = mi_cuda_features();
        if (cuda && cuda[0]) {
            strcat(features, " ");
            strncat(features, cuda, sizeof features - strlen(features) - 1);
        }
    }
    return features;
}

const char *mi_build_commit(void) { return MI_BUILD_COMMIT; }

mi_status mi_context_set_stream(mi_context *ctx, struct CUstream_st *stream) {
    if (!ctx) return MI_STATUS_INVALID_ARGUMENT;
    if (ctx->params.device != MI_DEVICE_CUDA)
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT, "streams apply to CUDA contexts only");
    ctx->stream = stream;
    return MI_STATUS_SUCCESS;
}

struct CUstream_st *mi_context_stream(const mi_context *ctx) {
    return ctx ? (struct CUstream_st *)ctx->stream : NULL;
}

mi_status mi_context_synchronize(mi_context *ctx) {
    if (!ctx) return MI_STATUS_INVALID_ARGUMENT;
    if (ctx->params.device != MI_DEVICE_CUDA) return MI_STATUS_SUCCESS;
    return mi_cuda_synchronize(ctx);
}
