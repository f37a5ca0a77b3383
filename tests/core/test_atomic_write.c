/*
 * test_atomic_write.c: mi_file_write_atomic, the writer of every result file the tools produce:
 * the file appears whole, a failed write leaves the old target as it was and no temporary file
 * beside it, and the message names the cause.
 */
#include "../check.h"
#include "minference_tools.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 16);
    *n = buf ? fread(buf, 1, 1 << 16, f) : 0;
    fclose(f);
    return buf;
}

/* Entries of g_dir (besides . and ..): a leftover temporary file would show here. */
static int dir_entries(void) {
    DIR *d = opendir(g_dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    if (d) closedir(d);
    return n;
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/mi_atomic_test_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0755) == 0, "mkdir %s", g_dir);
    mi_context *ctx = NULL;
    CHECK_OK(mi_context_create(NULL, &ctx));
    char path[512], sub[512], missing[512];
    snprintf(path, sizeof path, "%s/out.json", g_dir);
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    snprintf(missing, sizeof missing, "%s/no/such/dir/out.json", g_dir);

    /* whole contents, replacing an older file */
    CHECK_OK(mi_file_write_atomic(ctx, path, "old contents\n", 13));
    const char text[] = "{\"rows\": [1, 2, 3]}\n";
    CHECK_OK(mi_file_write_atomic(ctx, path, text, sizeof text - 1));
    size_t n = 0;
    char *got = slurp(path, &n);
    CHECK(got && n == sizeof text - 1 && memcmp(got, text, n) == 0, "contents differ");
    free(got);
    CHECK_EQ(dir_entries(), 1);

    /* a folder that does not exist: IO error naming the cause, nothing created */
    CHECK_STATUS(mi_file_write_atomic(ctx, missing, text, sizeof text - 1), MI_STATUS_IO_ERROR);
    CHECK(strstr(mi_context_last_error(ctx), "No such file") != NULL, "message: %s",
          mi_context_last_error(ctx));
    /* the target is a directory: the rename fails, the directory and its file stay, no
     * temporary file is left beside them */
    CHECK(mkdir(sub, 0755) == 0, "mkdir");
    char inner[600];
    snprintf(inner, sizeof inner, "%s/keep", sub);
    CHECK_OK(mi_file_write_atomic(ctx, inner, "k", 1));
    CHECK_STATUS(mi_file_write_atomic(ctx, sub, text, sizeof text - 1), MI_STATUS_IO_ERROR);
    CHECK(strstr(mi_context_last_error(ctx), "cannot write") != NULL, "message: %s",
          mi_context_last_error(ctx));
    struct stat st;
    CHECK(stat(sub, &st) == 0 && S_ISDIR(st.st_mode), "the directory was replaced");
    CHECK(stat(inner, &st) == 0 && st.st_size == 1, "the directory's file was lost");
    CHECK_EQ(dir_entries(), 2); /* out.json and sub: no temporary file */
    got = slurp(path, &n);
    CHECK(got && n == sizeof text - 1 && memcmp(got, text, n) == 0, "earlier file changed");
    free(got);

    /* empty data is a valid (empty) file; bad arguments are refused */
    CHECK_OK(mi_file_write_atomic(ctx, path, NULL, 0));
    CHECK(stat(path, &st) == 0 && st.st_size == 0, "empty file");
    CHECK_STATUS(mi_file_write_atomic(ctx, NULL, text, 1), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_file_write_atomic(ctx, "", text, 1), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_file_write_atomic(ctx, path, NULL, 5), MI_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(mi_file_write_atomic(NULL, missing, text, 1), MI_STATUS_IO_ERROR);

    mi_context_destroy(ctx);
    unlink(inner);
    rmdir(sub);
    unlink(path);
    rmdir(g_dir);
    return check_finish("test_atomic_write");
}
