/* SPDX-License-Identifier: Apache-2.0 */
/* env.c - the one place the environment and the clock are read, each through
 * a hook that tests can set, plus parsers for the values found there. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common.h"

static gca__getenv_fn env_hook;
static void *env_ctx;
static gca__clock_fn clock_hook;
static void *clock_ctx;

const char *gca__getenv(const char *name) {
  if (env_hook)
    return env_hook(name, env_ctx);
  return getenv(name);
}

void gca__env_set_hook(gca__getenv_fn fn, void *ctx) {
  env_ctx = ctx;
  env_hook = fn;
}

uint64_t gca__now_ns(void) {
  if (GCA_UNLIKELY(clock_hook != NULL))
    return clock_hook(clock_ctx);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void gca__clock_set_hook(gca__clock_fn fn, void *ctx) {
  clock_ctx = ctx;
  clock_hook = fn;
}

gca_status_t gca__parse_size(const char *text, uint64_t *out) {
  static const struct {
    const char *suffix;
    uint64_t mult;
  } units[] = {
      {"", 1},
      {"b", 1},
      {"k", 1ull << 10},
      {"kb", 1ull << 10},
      {"kib", 1ull << 10},
      {"m", 1ull << 20},
      {"mb", 1ull << 20},
      {"mib", 1ull << 20},
      {"g", 1ull << 30},
      {"gb", 1ull << 30},
      {"gib", 1ull << 30},
      {"t", 1ull << 40},
      {"tb", 1ull << 40},
      {"tib", 1ull << 40},
  };
  if (!text || !out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "size: null argument");
  const char *p = text;
  while (isspace((unsigned char)*p))
    p++;
  if (!isdigit((unsigned char)*p) && *p != '.')
    return gca__error(GCA_ERR_PARSE, "'%s' is not a size (expected e.g. 4096, 512MiB, 80GiB)",
                      text);
  errno = 0;
  char *end;
  double v = strtod(p, &end);
  if (errno != 0 || end == p || !isfinite(v) || v < 0)
    return gca__error(GCA_ERR_PARSE, "'%s' is not a size (expected e.g. 4096, 512MiB, 80GiB)",
                      text);
  char suffix[8];
  size_t n = 0;
  while (*end && !isspace((unsigned char)*end)) {
    if (n + 1 >= sizeof(suffix))
      return gca__error(GCA_ERR_PARSE, "'%s': unknown size unit", text);
    suffix[n++] = (char)tolower((unsigned char)*end++);
  }
  suffix[n] = '\0';
  while (isspace((unsigned char)*end))
    end++;
  if (*end)
    return gca__error(GCA_ERR_PARSE, "'%s': trailing text after the size", text);
  for (size_t i = 0; i < GCA_ARRAY_SIZE(units); i++) {
    if (strcmp(suffix, units[i].suffix) == 0) {
      double bytes = v * (double)units[i].mult;
      if (bytes >= 18446744073709551616.0)
        return gca__error(GCA_ERR_PARSE, "'%s': size overflows 64 bits", text);
      *out = (uint64_t)bytes;
      return GCA_OK;
    }
  }
  return gca__error(GCA_ERR_PARSE, "'%s': unknown size unit '%s' (use B, KiB, MiB, GiB, TiB)", text,
                    suffix);
}

gca_status_t gca__parse_bool(const char *text, bool *out) {
  static const char *yes[] = {"1", "true", "yes", "on"};
  static const char *no[] = {"0", "false", "no", "off"};
  if (!text || !out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "bool: null argument");
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(text, yes[i]) == 0) {
      *out = true;
      return GCA_OK;
    }
    if (strcasecmp(text, no[i]) == 0) {
      *out = false;
      return GCA_OK;
    }
  }
  return gca__error(GCA_ERR_PARSE, "'%s' is not a boolean (expected True/False, 1/0)", text);
}

const char *gca__format_size(uint64_t bytes, char *buf, size_t len) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%llu B", (unsigned long long)bytes);
  else
    snprintf(buf, len, "%.2f %s", v, units[u]);
  return buf;
}
