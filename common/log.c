/* SPDX-License-Identifier: Apache-2.0 */
/* log.c - the one logging function. The level comes from GCA_LOG_LEVEL (read
 * once) unless gca_set_log_level() overrides it; messages go to stderr as
 * "gca: <level>: <text>". */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <strings.h>

#include "common.h"

static atomic_int log_level = -1;

static int level_from_env(void) {
  const char *v = gca__getenv("GCA_LOG_LEVEL");
  if (!v || !*v)
    return GCA_LOG_WARN;
  static const char *names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (strcasecmp(v, names[i]) == 0)
      return i;
  if (strcasecmp(v, "warning") == 0)
    return GCA_LOG_WARN;
  fprintf(stderr,
          "gca: warn: GCA_LOG_LEVEL='%s' is not one of error, warn, info, debug; using warn\n", v);
  return GCA_LOG_WARN;
}

static int current_level(void) {
  int l = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (GCA_UNLIKELY(l < 0)) {
    int expected = -1;
    l = level_from_env();
    if (!atomic_compare_exchange_strong(&log_level, &expected, l))
      l = expected;
  }
  return l;
}

GCA_API void gca_set_log_level(gca_log_level_t level) {
  atomic_store(&log_level, (int)level);
}

GCA_API gca_log_level_t gca_get_log_level(void) {
  return (gca_log_level_t)current_level();
}

bool gca__log_enabled(gca_log_level_t level) {
  return (int)level <= current_level();
}

void gca__log(gca_log_level_t level, const char *fmt, ...) {
  static const char *tags[] = {"error", "warn", "info", "debug"};
  if (!gca__log_enabled(level))
    return;
  char buf[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  fprintf(stderr, "gca: %s: %s\n", tags[level], buf);
}
