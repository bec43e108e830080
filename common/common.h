/* SPDX-License-Identifier: Apache-2.0 */
/* common.h - internals shared by every layer: error reporting, logging, the
 * environment and clock seams, size parsing.
 *
 * Module map (prototypes grouped by the file that defines them).
 * Note [Error detail]: a failing function sets the thread-local detail with
 * gca__error() at the point where the reason is known and returns the status;
 * callers that merely propagate use GCA_CHECK, which leaves the detail alone
 * and logs file:line at debug level so a failure reads like a trace.
 */
#ifndef GCA_COMMON_H
#define GCA_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gca/status.h"

#define GCA_UNUSED(x)     ((void)(x))
#define GCA_LIKELY(x)     __builtin_expect(!!(x), 1)
#define GCA_UNLIKELY(x)   __builtin_expect(!!(x), 0)
#define GCA_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define GCA_PRINTF(f, a)  __attribute__((format(printf, f, a)))

/* ---- status.c ---- */

/* Sets the calling thread's last-error detail and returns `status`. */
gca_status_t gca__error(gca_status_t status, const char *fmt, ...) GCA_PRINTF(2, 3);
gca_status_t gca__verror(gca_status_t status, const char *fmt, va_list ap);
/* Prepends "prefix: " to the current detail (for adding context while
 * propagating) and returns `status`. */
gca_status_t gca__error_prefix(gca_status_t status, const char *fmt, ...) GCA_PRINTF(2, 3);
/* Logs a propagated failure at debug level with its origin. */
void gca__error_trace(const char *file, int line, const char *expr, gca_status_t status);

#define GCA_CHECK(call)                                     \
  do {                                                      \
    gca_status_t gca_st_ = (call);                          \
    if (GCA_UNLIKELY(gca_st_ != GCA_OK)) {                  \
      gca__error_trace(__FILE__, __LINE__, #call, gca_st_); \
      return gca_st_;                                       \
    }                                                       \
  } while (0)

/* Stores the failing status in `st` and jumps to `label`. */
#define GCA_CHECK_GOTO(call, st, label)                  \
  do {                                                   \
    (st) = (call);                                       \
    if (GCA_UNLIKELY((st) != GCA_OK)) {                  \
      gca__error_trace(__FILE__, __LINE__, #call, (st)); \
      goto label;                                        \
    }                                                    \
  } while (0)

/* A cleanup call that may fail (undoing a step, tearing down): a failure is
 * logged as a warning with file:line, the call and its detail, and the caller
 * goes on. The one way to ignore a status; no silent (void) casts. */
#define GCA_CHECK_IGNORE(call)                                \
  do {                                                        \
    gca_status_t gca_st_ = (call);                            \
    if (GCA_UNLIKELY(gca_st_ != GCA_OK))                      \
      gca__error_ignored(__FILE__, __LINE__, #call, gca_st_); \
  } while (0)
/* Logs a failure that GCA_CHECK_IGNORE let pass. */
void gca__error_ignored(const char *file, int line, const char *expr, gca_status_t status);

/* A broken internal invariant: abort with file:line. Never put a call with a
 * side effect inside: evaluate it first, then assert on the result. */
#define GCA_ASSERT(cond)                           \
  do {                                             \
    if (GCA_UNLIKELY(!(cond)))                     \
      gca__assert_fail(__FILE__, __LINE__, #cond); \
  } while (0)
#ifdef GCA_DEBUG_CHECKS
#define GCA_ASSERT_DEBUG(cond) GCA_ASSERT(cond)
#else
#define GCA_ASSERT_DEBUG(cond) ((void)0)
#endif
__attribute__((noreturn)) void gca__assert_fail(const char *file, int line, const char *cond);

/* The value of hex digit c, or -1 when c is not one. */
static inline int gca__hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* ---- log.c ---- */

bool gca__log_enabled(gca_log_level_t level);
void gca__log(gca_log_level_t level, const char *fmt, ...) GCA_PRINTF(2, 3);
#define GCA_LOG_ERR(...)  gca__log(GCA_LOG_ERROR, __VA_ARGS__)
#define GCA_LOG_WARN(...) gca__log(GCA_LOG_WARN, __VA_ARGS__)
#define GCA_LOG_INFO(...) gca__log(GCA_LOG_INFO, __VA_ARGS__)
#define GCA_LOG_DEBUG(...)                  \
  do {                                      \
    if (gca__log_enabled(GCA_LOG_DEBUG))    \
      gca__log(GCA_LOG_DEBUG, __VA_ARGS__); \
  } while (0)

/* ---- env.c ---- (the one place environment and clock are read) */

/* getenv() through a test-settable hook. */
const char *gca__getenv(const char *name);
typedef const char *(*gca__getenv_fn)(const char *name, void *ctx);
/* Tests: route environment reads through `fn` (NULL restores getenv). */
void gca__env_set_hook(gca__getenv_fn fn, void *ctx);

/* Monotonic nanoseconds through a test-settable hook. */
uint64_t gca__now_ns(void);
typedef uint64_t (*gca__clock_fn)(void *ctx);
void gca__clock_set_hook(gca__clock_fn fn, void *ctx);

/* Parses "80GiB", "512MiB", "4096", "2MB", "1.5GiB" (binary multiples for both
 * spellings, as memory sizes conventionally are). GCA_ERR_PARSE with the text
 * quoted when malformed or overflowing. */
gca_status_t gca__parse_size(const char *text, uint64_t *out);
/* Parses a boolean: 1/0, true/false, yes/no, on/off (case-insensitive). */
gca_status_t gca__parse_bool(const char *text, bool *out);
/* Formats bytes as "1.50 GiB" into buf; returns buf. */
const char *gca__format_size(uint64_t bytes, char *buf, size_t len);

/* ---- failpoint.c ----
 * Note [Host fail points]: a host allocation whose failure no device fault
 * can provoke is written `GCA_FAILPOINT("name") ? NULL : malloc(n)`, so that a
 * test arms the place by name (gca__failpoint_arm, internal: tests only) and
 * checks the out-of-host-memory path: the nth pass through it after arming
 * fails once. Unarmed the check is one relaxed atomic load. */
extern _Atomic int gca__failpoints_armed;
gca_status_t gca__failpoint_arm(const char *name, unsigned nth);
void gca__failpoint_clear(void);
bool gca__failpoint_hit(const char *name);
#define GCA_FAILPOINT(name)                                                                     \
  (GCA_UNLIKELY(__atomic_load_n((const int *)&gca__failpoints_armed, __ATOMIC_RELAXED) != 0) && \
   gca__failpoint_hit(name))

#endif
