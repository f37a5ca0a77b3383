/* status.c: status strings, version, and the per-context error message. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

const char *mi_version(void) { return MI_VERSION_STRING; }

uint32_t mi_version_number(void) {
    return ((uint32_t)MI_VERSION_MAJOR << 16) | ((uint32_t)MI_VERSION_MINOR << 8) |
           (uint32_t)MI_VERSION_PATCH;
}

const char *mi_status_string(mi_status status) {
    switch (status) {
#define MI_STATUS_TEXT_(name, value, text)                                                         \
    case name: return text;
        MI_STATUS_LIST(MI_STATUS_TEXT_)
#undef MI_STATUS_TEXT_
    }
    return "unknown status";
}

const char *mi_status_name(mi_status status) {
    switch (status) {
#define MI_STATUS_NAME_(name, value, text)                                                         \
    case name: return #name;
        MI_STATUS_LIST(MI_STATUS_NAME_)
#undef MI_STATUS_NAME_
    }
    return "MI_STATUS_UNKNOWN";
}

mi_status mi_fail(mi_context *ctx, mi_status status, const char *fmt, ...) {
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->last_error, sizeof ctx->last_error, fmt, ap);
        va_end(ap);
    }
    return status;
}

void mi_clear_error(mi_context *ctx) {
    if (ctx) ctx->last_error[0] = '\0';
}

const char *mi_context_last_error(const mi_context *ctx) {
    return ctx ? ctx->last_error : "no context";
}

mi_status mi_context_set_error(mi_context *ctx, mi_status status, const char *message) {
    return mi_fail(ctx, status, "%s", message ? message : mi_status_string(status));
}
