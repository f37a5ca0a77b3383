/*
 * minference_export.h: MI_API, the mark of a public function. The libraries are built with
 * hidden symbol visibility, so only the functions declared with MI_API in the public headers
 * are exported; everything else stays internal to its library.
 */
#ifndef MINFERENCE_EXPORT_H
#define MINFERENCE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define MI_API __attribute__((visibility("default")))
#else
#define MI_API
#endif

#endif /* MINFERENCE_EXPORT_H */
