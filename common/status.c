/* SPDX-License-Identifier: Apache-2.0 */
/* status.c - status names and strings from GCA_STATUS_MAP, the thread-local
 * last-error detail, and the version. See Note [Error detail] in common.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define DETAIL_MAX 1024

static _Thread_local char last_detail[DETAIL_MAX];

GCA_API const char *gca_status_name(gca_status_t status) {
  switch (status) {
#define NAME_CASE(name, value, desc) \
  case GCA_##name:                   \
    return "GCA_" #name;
    GCA_STATUS_MAP(NAME_CASE)
#undef NAME_CASE
  }
  return "GCA_UNKNOWN_STATUS";
}

GCA_API const char *gca_status_string(gca_status_t status) {
  switch (status) {
#define STRING_CASE(name, value, desc) \
  case GCA_##name:                     \
    return desc;
    GCA_STATUS_MAP(STRING_CASE)
#undef STRING_CASE
  }
  return "unknown status";
}

GCA_API const char *gca_last_error(void) {
  return last_detail;
}

GCA_API void gca_clear_last_error(void) {
  last_detail[0] = '\0';
}

/* Formatted aside first: an argument may be gca_last_error() itself (a new
 * detail that quotes the one before), and vsnprintf must not read the
 * buffer it writes. */
gca_status_t gca__verror(gca_status_t status, const char *fmt, va_list ap) {
  char detail[DETAIL_MAX];
  vsnprintf(detail, sizeof(detail), fmt, ap);
  memcpy(last_detail, detail, sizeof(last_detail));
  GCA_LOG_DEBUG("%s: %s", gca_status_name(status), last_detail);
  return status;
}

gca_status_t gca__error(gca_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gca__verror(status, fmt, ap);
  va_end(ap);
  return status;
}

gca_status_t gca__error_prefix(gca_status_t status, const char *fmt, ...) {
  char prefix[256];
  char old[DETAIL_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof(prefix), fmt, ap);
  va_end(ap);
  memcpy(old, last_detail, sizeof(old));
  size_t n = strlen(prefix);
  if (n + 2 < sizeof(last_detail)) {
    memcpy(last_detail, prefix, n);
    memcpy(last_detail + n, ": ", 2);
    size_t rest = sizeof(last_detail) - n - 3;
    size_t olen = strnlen(old, rest);
    memcpy(last_detail + n + 2, old, olen);
    last_detail[n + 2 + olen] = 0;
  }
  return status;
}

void gca__error_trace(const char *file, int line, const char *expr, gca_status_t status) {
  GCA_LOG_DEBUG("%s:%d: %s -> %s", file, line, expr, gca_status_name(status));
}

void gca__error_ignored(const char *file, int line, const char *expr, gca_status_t status) {
  GCA_LOG_WARN("%s:%d: %s -> %s (ignored): %s", file, line, expr, gca_status_name(status),
               gca_last_error());
}

void gca__assert_fail(const char *file, int line, const char *cond) {
  fprintf(stderr, "gca: internal invariant broken at %s:%d: %s\n", file, line, cond);
  fflush(stderr);
  abort();
}

GCA_API int gca_version(void) {
  return GCA_VERSION_NUMBER;
}

#define STR_(x) #x
#define STR(x)  STR_(x)
GCA_API const char *gca_version_string(void) {
  return STR(GCA_VERSION_MAJOR) "." STR(GCA_VERSION_MINOR) "." STR(GCA_VERSION_PATCH);
}
