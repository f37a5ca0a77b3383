/* tool_util.h: small helpers the subcommands share (timing, whole-file reads, default text). */
#ifndef MI_TOOL_UTIL_H
#define MI_TOOL_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Monotonic wall-clock seconds. */
double tool_now_s(void);

/* The whole of a regular file of at most TOOL_MAX_FILE_BYTES, NUL-terminated, malloc'ed; *len
 * gets its size. NULL if it cannot be read, with *why (may be NULL) saying why. */
#define TOOL_MAX_FILE_BYTES ((uint64_t)1 << 30)
char *tool_read_file(const char *path, size_t *len, const char **why);

/* The model a subcommand loads when none is given: $MI_MODEL when set, else the demo model
 * (mi_model_default_path). malloc'ed, or NULL. */
char *tool_default_model(void);

/* Real English text present on every Debian system: the license texts of
 * /usr/share/common-licenses, concatenated with blank lines between them. NULL if none. */
char *tool_license_text(size_t *len);

#endif
