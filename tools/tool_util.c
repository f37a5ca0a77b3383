/* tool_util.c: helpers shared by the subcommands. */
#include "tool_util.h"

#include "minference_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double tool_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *tool_default_model(void) {
    const char *env = getenv("MI_MODEL"); /* the one place the CLI reads it */
    if (env && *env) return strdup(env);
    return mi_model_default_path();
}

char *tool_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = p;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (len) *len = buf ? n : 0;
    return buf;
}

char *tool_license_text(size_t *len) {
    static const char *files[] = {"GPL-3",    "GFDL-1.3", "Apache-2.0", "MPL-2.0",
                                  "LGPL-2.1", "Artistic", "GPL-2"};
    size_t total = 0;
    char *out = NULL;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "/usr/share/common-licenses/%s", files[i]);
        size_t n = 0;
        char *t = tool_read_file(path, &n);
        if (!t) continue;
        char *p = realloc(out, total + n + 3);
        if (!p) {
            free(t);
            break;
        }
        out = p;
        memcpy(out + total, t, n);
        total += n;
        out[total++] = '\n';
        out[total++] = '\n';
        out[total] = '\0';
        free(t);
    }
    if (len) *len = total;
    return out;
}
