/* SPDX-License-Identifier: Apache-2.0 */
/* util.c - the tools' error detail, clock, size text and fail points (see
 * util.h).
 *
 * The detail is a per-thread buffer so the stress tool's worker threads can
 * fail independently; sizes use binary multiples for every unit spelling, as
 * the library's configuration keys do.
 */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static _Thread_local char detail[1024];

gca_status_t tool_error(gca_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof(detail), fmt, ap);
  va_end(ap);
  return status;
}

gca_status_t tool_error_prefix(gca_status_t status, const char *fmt, ...) {
  char head[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(head, sizeof(head) - 2, fmt, ap);
  va_end(ap);
  size_t h = n < 0 ? 0 : (size_t)n < sizeof(head) - 2 ? (size_t)n : sizeof(head) - 3;
  memcpy(head + h, ": ", 2);
  h += 2;
  size_t old = strnlen(detail, sizeof(detail) - 1);
  if (old > sizeof(detail) - 1 - h)
    old = sizeof(detail) - 1 - h;
  memmove(detail + h, detail, old);
  memcpy(detail, head, h);
  detail[h + old] = '\0';
  return status;
}

gca_status_t tool_error_gca(gca_status_t status, const char *fmt, ...) {
  char head[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof(head), fmt, ap);
  va_end(ap);
  snprintf(detail, sizeof(detail), "%s: %s", head, gca_last_error());
  return status;
}

const char *tool_last_error(void) {
  return detail;
}

int tool_failpoints_armed; /* read and written with __atomic builtins only */

static pthread_mutex_t fp_lock = PTHREAD_MUTEX_INITIALIZER;
static char fp_name[64];
static unsigned fp_left; /* passes until the failure; 0: none armed */

gca_status_t tool_failpoint_arm(const char *name, unsigned nth) {
  if (name == NULL || !*name || strlen(name) >= sizeof(fp_name) || nth == 0)
    return tool_error(GCA_ERR_INVALID_ARGUMENT,
                      "failpoint_arm: a name shorter than %zu bytes and nth >= 1 are needed",
                      sizeof(fp_name));
  pthread_mutex_lock(&fp_lock);
  strcpy(fp_name, name);
  fp_left = nth;
  __atomic_store_n(&tool_failpoints_armed, 1, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&fp_lock);
  return GCA_OK;
}

void tool_failpoint_clear(void) {
  pthread_mutex_lock(&fp_lock);
  fp_left = 0;
  fp_name[0] = '\0';
  __atomic_store_n(&tool_failpoints_armed, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&fp_lock);
}

bool tool_failpoint_hit(const char *name) {
  bool hit = false;
  pthread_mutex_lock(&fp_lock);
  if (fp_left != 0 && strcmp(fp_name, name) == 0 && --fp_left == 0) {
    hit = true;
    fp_name[0] = '\0';
    __atomic_store_n(&tool_failpoints_armed, 0, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&fp_lock);
  return hit;
}

uint64_t tool_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

gca_status_t tool_read_latency_ns(size_t mib, double *ns) {
  enum { READS = 1000000 };
  size_t bytes = mib << 20, n = bytes / 64;
  uint64_t *a = NULL;
  uint32_t *order = TOOL_FAILPOINT("read_latency_alloc") ? NULL : malloc(n * sizeof(*order));
  if (order == NULL || (TOOL_FAILPOINT("read_latency_alloc")
                            ? ENOMEM
                            : posix_memalign((void **)&a, (size_t)2 << 20, bytes)) != 0) {
    free(order);
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "read_latency: no host memory for a %zu MiB buffer",
                      mib);
  }
  madvise(a, bytes, MADV_HUGEPAGE);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++)
    order[i] = (uint32_t)i;
  for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates, xorshift64 */
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t j = (size_t)(x % (i + 1));
    uint32_t t = order[i];
    order[i] = order[j], order[j] = t;
  }
  for (size_t i = 0; i < n; i++)
    a[(size_t)order[i] * 8] = (uint64_t)order[(i + 1) % n] * 8;
  free(order);
  uint64_t at = 0;
  for (long i = 0; i < READS / 10; i++) /* warm: pages mapped, TLB filled */
    at = a[at];
  uint64_t t0 = tool_now_ns();
  for (long i = 0; i < READS; i++)
    at = a[at];
  *ns = (double)(tool_now_ns() - t0) / READS;
  volatile uint64_t end = at; /* kept, so that the reads stay */
  (void)end;
  free(a);
  return GCA_OK;
}

/* Multiplier for a unit spelled k, kb, kib (any case), or none / b. */
static int unit_shift(const char *u, size_t n) {
  static const char letters[] = "kmgt";
  if (n == 0 || (n == 1 && tolower((unsigned char)u[0]) == 'b'))
    return 0;
  const char *l = strchr(letters, tolower((unsigned char)u[0]));
  if (!l || u[0] == '\0')
    return -1;
  if (n == 1 || (n == 2 && tolower((unsigned char)u[1]) == 'b') ||
      (n == 3 && tolower((unsigned char)u[1]) == 'i' && tolower((unsigned char)u[2]) == 'b'))
    return 10 * (int)(l - letters + 1);
  return -1;
}

gca_status_t tool_parse_size(const char *text, uint64_t *out) {
  if (!text || !out)
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "size: NULL argument");
  const char *p = text;
  while (isspace((unsigned char)*p))
    p++;
  char *end = NULL;
  errno = 0;
  double v = (isdigit((unsigned char)*p) || *p == '.') ? strtod(p, &end) : NAN;
  if (errno != 0 || end == p || !isfinite(v) || v < 0)
    return tool_error(GCA_ERR_PARSE, "'%s' is not a size (expected e.g. 4096, 512MiB, 80GiB)",
                      text);
  size_t n = 0;
  while (end[n] && !isspace((unsigned char)end[n]))
    n++;
  int shift = unit_shift(end, n);
  const char *rest = end + n;
  while (isspace((unsigned char)*rest))
    rest++;
  if (shift < 0 || *rest)
    return tool_error(GCA_ERR_PARSE, "'%s': unknown size unit", text);
  double bytes = ldexp(v, shift);
  if (bytes >= 18446744073709551616.0)
    return tool_error(GCA_ERR_PARSE, "'%s': size too large", text);
  *out = (uint64_t)bytes;
  return GCA_OK;
}

const char *tool_format_size(uint64_t bytes, char *buf, size_t len) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < TOOL_ARRAY_SIZE(units)) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%llu B", (unsigned long long)bytes);
  else
    snprintf(buf, len, "%.2f %s", v, units[u]);
  return buf;
}

void tool_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"':
      fputs("\\\"", f);
      break;
    case '\\':
      fputs("\\\\", f);
      break;
    case '\n':
      fputs("\\n", f);
      break;
    case '\r':
      fputs("\\r", f);
      break;
    case '\t':
      fputs("\\t", f);
      break;
    default:
      if (*p < 0x20 || *p == '<' || *p == 0x7f)
        fprintf(f, "\\u%04x", *p);
      else
        fputc(*p, f);
    }
  }
  fputc('"', f);
}

gca_status_t tool_read_file(const char *path, char **data, size_t *len) {
  *data = NULL;
  *len = 0;
  FILE *f = fopen(path, "rb");
  if (!f)
    return tool_error(GCA_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap)
      break;
    char *grown = realloc(buf, 2 * cap + 1);
    if (!grown) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = grown;
    cap *= 2;
  }
  bool failed = ferror(f);
  fclose(f);
  if (!buf)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "%s: out of host memory", path);
  if (failed) {
    free(buf);
    return tool_error(GCA_ERR_IO, "error reading %s", path);
  }
  buf[n] = '\0';
  *data = buf;
  *len = n;
  return GCA_OK;
}
