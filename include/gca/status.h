/* SPDX-License-Identifier: Apache-2.0 */
/* gca/status.h - status codes, the last error's detail, version and logging.
 *
 * Every fallible gca function returns gca_status_t; results travel through
 * out-parameters. The codes and their strings come from one X-macro list
 * (GCA_STATUS_MAP) so they cannot drift. On failure a human-readable detail is
 * left in a thread-local buffer that gca_last_error() returns.
 */
#ifndef GCA_STATUS_H
#define GCA_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(GCA_BUILDING_LIBRARY)
#define GCA_API __attribute__((visibility("default")))
#else
#define GCA_API
#endif

#define GCA_VERSION_MAJOR  0
#define GCA_VERSION_MINOR  1
#define GCA_VERSION_PATCH  0
#define GCA_VERSION_NUMBER (GCA_VERSION_MAJOR * 10000 + GCA_VERSION_MINOR * 100 + GCA_VERSION_PATCH)

/* X(name, value, description) */
#define GCA_STATUS_MAP(X)                                                              \
  X(OK, 0, "success")                                                                  \
  X(ERR_INVALID_ARGUMENT, 1, "invalid argument")                                       \
  X(ERR_OUT_OF_MEMORY, 2, "out of memory")                                             \
  X(ERR_NO_DEVICE, 3, "no usable device or driver")                                    \
  X(ERR_NOT_SUPPORTED, 4, "operation not supported")                                   \
  X(ERR_NOT_READY, 5, "work not yet complete")                                         \
  X(ERR_INVALID_HANDLE, 6, "invalid handle")                                           \
  X(ERR_INVALID_POINTER, 7, "pointer not owned by gca or not live")                    \
  X(ERR_INVALID_STATE, 8, "operation not valid in the current state")                  \
  X(ERR_CAPTURE_UNSUPPORTED, 9, "operation not permitted while a stream is capturing") \
  X(ERR_CAPTURE_INVALIDATED, 10, "stream capture was invalidated")                     \
  X(ERR_CAPTURE_IMPLICIT, 11, "implicit dependency on a capturing stream")             \
  X(ERR_CAPTURE_UNMATCHED, 12, "capture not begun or ended on this stream")            \
  X(ERR_CAPTURE_WRONG_THREAD, 13, "capture ended from the wrong thread")               \
  X(ERR_CAPTURE_UNJOINED, 14, "capture ended with a forked stream not joined back")    \
  X(ERR_GRAPH_UPDATE, 15, "graph exec update rejected")                                \
  X(ERR_CONFIG, 16, "invalid configuration")                                           \
  X(ERR_DRIVER, 17, "device driver error")                                             \
  X(ERR_IO, 18, "input/output error")                                                  \
  X(ERR_PARSE, 19, "malformed input")                                                  \
  X(ERR_NOT_FOUND, 20, "not found")                                                    \
  X(ERR_INTERNAL, 21, "internal error")                                                \
  X(ERR_NOT_PERMITTED, 22, "operation not permitted from this context")                \
  X(ERR_ILLEGAL_ADDRESS, 23, "device work touches memory its device cannot access")

typedef enum gca_status {
#define GCA__STATUS_ENUM(name, value, desc) GCA_##name = value,
  GCA_STATUS_MAP(GCA__STATUS_ENUM)
#undef GCA__STATUS_ENUM
} gca_status_t;

/* "GCA_ERR_OUT_OF_MEMORY" etc.; "GCA_UNKNOWN_STATUS" for values outside the map. */
GCA_API const char *gca_status_name(gca_status_t status);
/* A short description of the code ("out of memory"). */
GCA_API const char *gca_status_string(gca_status_t status);
/* Detail of the calling thread's last failure ("" when none). Valid until the
 * thread's next failing gca call. */
GCA_API const char *gca_last_error(void);
GCA_API void gca_clear_last_error(void);

/* Version of the library actually loaded, as GCA_VERSION_NUMBER. */
GCA_API int gca_version(void);
GCA_API const char *gca_version_string(void);

typedef enum gca_log_level {
  GCA_LOG_ERROR = 0,
  GCA_LOG_WARN = 1,
  GCA_LOG_INFO = 2,
  GCA_LOG_DEBUG = 3,
} gca_log_level_t;

/* Overrides GCA_LOG_LEVEL (error, warn, info, debug; default warn). */
GCA_API void gca_set_log_level(gca_log_level_t level);
GCA_API gca_log_level_t gca_get_log_level(void);

#ifdef __cplusplus
}
#endif
#endif
