/* SPDX-License-Identifier: Apache-2.0 */
/* util.h - what the tools share beyond the public API: their own error detail,
 * a monotonic clock, and byte sizes written and read the way the library's
 * configuration does ("512MiB").
 *
 * It also holds the one JSON helper tools that write JSON by hand need, a
 * string escaper, and the tools' fail points (Note [Tool fail points]).
 *
 * Tools see only include/ (the build gives them nothing else), so the
 * library's internal error detail is out of reach. Tool modules (the RMM CSV
 * reader, the size distributions) keep theirs in a thread-local buffer of
 * their own: tool_error() sets it, tool_error_prefix() adds context, and
 * tool_error_gca() carries a failed gca call's detail (gca_last_error) into
 * it, so a tool prints one buffer, tool_last_error(), whoever failed.
 */
#ifndef GCA_TOOL_UTIL_H
#define GCA_TOOL_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gca.h"

#define TOOL_PRINTF(f, a)  __attribute__((format(printf, f, a)))
#define TOOL_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Sets the tool detail and returns `status`. */
gca_status_t tool_error(gca_status_t status, const char *fmt, ...) TOOL_PRINTF(2, 3);
/* Prepends "context: " to the tool detail and returns `status`. */
gca_status_t tool_error_prefix(gca_status_t status, const char *fmt, ...) TOOL_PRINTF(2, 3);
/* Sets the tool detail to "context: <gca_last_error()>" and returns `status`. */
gca_status_t tool_error_gca(gca_status_t status, const char *fmt, ...) TOOL_PRINTF(2, 3);
/* The calling thread's tool detail ("" when none). */
const char *tool_last_error(void);

/* Propagates a failed tool function (its detail already set). */
#define TOOL_CHECK(call)            \
  do {                              \
    gca_status_t tool_st_ = (call); \
    if (tool_st_ != GCA_OK)         \
      return tool_st_;              \
  } while (0)
/* Propagates a failed gca call, carrying its detail into the tool detail. */
#define TOOL_CHECK_GCA(call)                        \
  do {                                              \
    gca_status_t tool_st_ = (call);                 \
    if (tool_st_ != GCA_OK)                         \
      return tool_error_gca(tool_st_, "%s", #call); \
  } while (0)

/* Stores a failed status in `st` and jumps to `label`. */
#define TOOL_CHECK_GOTO(call, st, label) \
  do {                                   \
    (st) = (call);                       \
    if ((st) != GCA_OK)                  \
      goto label;                        \
  } while (0)
#define TOOL_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Note [Tool fail points]: the library's host fail points (common.h) are out
 * of the tools' reach, so the tools keep their own, made the same way: a
 * call whose failure no input can provoke (a socketpair, a posix_spawn) is
 * written `TOOL_FAILPOINT("name") ? (errno = E, -1) : call(...)`, so that a
 * test arms the place by name and checks the failure path: the nth pass
 * through it after arming fails once. Unarmed the check is one relaxed
 * atomic load. */
extern int tool_failpoints_armed;
/* Arms `name` (shorter than 64 bytes) to fail on its nth pass, nth >= 1, in
 * place of any armed point; GCA_ERR_INVALID_ARGUMENT otherwise. */
gca_status_t tool_failpoint_arm(const char *name, unsigned nth);
/* Disarms the armed point, if any. */
void tool_failpoint_clear(void);
/* Whether this pass through `name` is the one to fail (TOOL_FAILPOINT's slow path). */
bool tool_failpoint_hit(const char *name);
#define TOOL_FAILPOINT(name)                                                        \
  (TOOL_UNLIKELY(__atomic_load_n(&tool_failpoints_armed, __ATOMIC_RELAXED) != 0) && \
   tool_failpoint_hit(name))

/* Monotonic nanoseconds (CLOCK_MONOTONIC). */
uint64_t tool_now_ns(void);
/* This machine's memory (Note [Churn and the memory], bench_churn.c): the
 * ns one dependent read costs at random over a buffer of `mib` MiB on huge
 * pages (a hint: plain pages where there are none), a random cycle through
 * all its cache lines each holding the index of the next; GCA_ERR_OUT_OF_MEMORY
 * with the tool detail set when the host has no memory for it. */
gca_status_t tool_read_latency_ns(size_t mib, double *ns);
/* "4096", "512MiB", "2MB", "1.5GiB" (binary multiples either way); GCA_ERR_PARSE
 * with the text quoted in the tool detail when malformed or overflowing. */
gca_status_t tool_parse_size(const char *text, uint64_t *out);
/* "1.50 GiB" into buf; returns buf. */
const char *tool_format_size(uint64_t bytes, char *buf, size_t len);
/* Writes `s` to f as a JSON string literal, quotes included: '"', '\\' and
 * control characters escaped, and '<' written as \u003c so that the text may
 * sit inside an HTML <script> block; other bytes (UTF-8) pass through. */
void tool_json_string(FILE *f, const char *s);
/* The whole file at `path` in *data (malloc'd, NUL-terminated, *len bytes
 * before the NUL). GCA_ERR_IO naming the path and the reason when it cannot
 * be read; GCA_ERR_OUT_OF_MEMORY when it does not fit. */
gca_status_t tool_read_file(const char *path, char **data, size_t *len);

#endif
