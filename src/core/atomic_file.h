/*
 * atomic_file.h: files that appear whole or not at all. A writer gets a temporary file in the
 * target's folder; commit flushes it, syncs it and renames it over the target, abort removes
 * it. So a failure or an interruption leaves the old file (or none) in place, never half of a
 * new one, and errors carry the errno of the call that failed, read before anything else.
 */
#ifndef MI_ATOMIC_FILE_H
#define MI_ATOMIC_FILE_H

#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mi_atomic_file {
    FILE *f; /* write here */
    char *tmp, *path;
} mi_atomic_file;

/* Opens a temporary file beside path with the given permission bits (before the umask).
 * 0 or an errno. */
int mi_atomic_open(mi_atomic_file *af, const char *path, mode_t mode);
/* Flushes, syncs and renames the file over its target, then frees af; on failure the target is
 * untouched and the temporary file removed. 0 or an errno. */
int mi_atomic_commit(mi_atomic_file *af);
/* Removes the temporary file and frees af. */
void mi_atomic_abort(mi_atomic_file *af);
/* The whole of data [n] as path, atomically. 0 or an errno. */
int mi_atomic_write(const char *path, const void *data, size_t n, mode_t mode);

#ifdef __cplusplus
}
#endif

#endif /* MI_ATOMIC_FILE_H */
