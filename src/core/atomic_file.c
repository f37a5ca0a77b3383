/* atomic_file.c: temporary file, fsync, rename (see atomic_file.h). */
#include "atomic_file.h"
#include "internal.h"
#include "minference_tools.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Best effort: the rename is durable once the folder's entry is on disk. */
static void sync_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        return;
    const int fd = open(dir, O_RDONLY);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

static void release(mi_atomic_file *af) {
    free(af->tmp);
    free(af->path);
    af->tmp = af->path = NULL;
    af->f = NULL;
}

int mi_atomic_open(mi_atomic_file *af, const char *path, mode_t mode) {
    static atomic_uint counter;
    memset(af, 0, sizeof *af);
    if (!path || !path[0]) return EINVAL;
    const size_t n = strlen(path) + 48;
    af->tmp = malloc(n);
    af->path = strdup(path);
    if (!af->tmp || !af->path) {
        release(af);
        return ENOMEM;
    }
    /* open(O_EXCL) rather than mkstemp, so that the umask applies to mode as for any new file */
    int fd = -1, e = 0;
    for (int attempt = 0; attempt < 64 && fd < 0; attempt++) {
        snprintf(af->tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1u));
        fd = open(af->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        e = fd < 0 ? errno : 0;
        if (fd < 0 && e != EEXIST) break;
    }
    if (fd < 0) {
        release(af);
        return e ? e : EEXIST;
    }
    af->f = fdopen(fd, "wb");
    if (!af->f) {
        e = errno;
        close(fd);
        unlink(af->tmp);
        release(af);
        return e;
    }
    return 0;
}

int mi_atomic_commit(mi_atomic_file *af) {
    int e = 0;
    if (ferror(af->f)) e = EIO;
    if (!e && fflush(af->f) != 0) e = errno;
    if (!e && fsync(fileno(af->f)) != 0) e = errno;
    /* fclose's own failure (a deferred write error) counts too */
    if (fclose(af->f) != 0 && !e) e = errno ? errno : EIO;
    af->f = NULL;
    if (!e && rename(af->tmp, af->path) != 0) e = errno;
    if (e)
        unlink(af->tmp);
    else
        sync_dir_of(af->path);
    release(af);
    return e;
}

void mi_atomic_abort(mi_atomic_file *af) {
    if (af->f) fclose(af->f);
    if (af->tmp) unlink(af->tmp);
    release(af);
}

int mi_atomic_write(const char *path, const void *data, size_t n, mode_t mode) {
    mi_atomic_file af;
    int e = mi_atomic_open(&af, path, mode);
    if (e) return e;
    if (n && fwrite(data, 1, n, af.f) != n) {
        e = errno ? errno : EIO;
        mi_atomic_abort(&af);
        return e;
    }
    return mi_atomic_commit(&af);
}

mi_status mi_file_write_atomic(mi_context *ctx, const char *path, const void *data, size_t n) {
    mi_clear_error(ctx);
    if (!path || !path[0] || (!data && n))
        return mi_fail(ctx, MI_STATUS_INVALID_ARGUMENT,
                       "mi_file_write_atomic: a path and the data are required");
    const int e = mi_atomic_write(path, data ? data : "", n, 0666);
    if (e) return mi_fail(ctx, MI_STATUS_IO_ERROR, "%s: cannot write: %s", path, strerror(e));
    return MI_STATUS_SUCCESS;
}
