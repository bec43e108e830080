/* SPDX-License-Identifier: Apache-2.0 */
/* stress_sizes.c - request-size distributions for gca-stress: uniform and
 * log-uniform ranges, and the empirical distribution of a recorded RMM log
 * CSV (read with rmm_csv.h). A log-uniform range spends as many draws on 1-2 KiB as on 1-2 GiB,
 * which is what exercises both the small and the large pool in one run.
 */
#include "stress_sizes.h"

#include "rmm_csv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t gca__stress_rng_next(stress_rng_t *rng) {
  uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t gca__stress_rng_below(stress_rng_t *rng, uint64_t n) {
  return n <= 1 ? 0 : gca__stress_rng_next(rng) % n;
}

double gca__stress_rng_unit(stress_rng_t *rng) {
  return (double)(gca__stress_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t gca__stress_mix(uint64_t a, uint64_t b) {
  stress_rng_t r = {a ^ (b * 0xd6e8feb86659fd93ull)};
  gca__stress_rng_next(&r);
  return gca__stress_rng_next(&r);
}

static gca_status_t parse_range(const char *text, const char *range, stress_sizes_t *out) {
  char buf[128];
  if (strlen(range) >= sizeof(buf))
    return tool_error(GCA_ERR_PARSE, "sizes: '%s' is too long", text);
  strcpy(buf, range);
  char *colon = strchr(buf, ':');
  if (!colon)
    return tool_error(GCA_ERR_PARSE, "sizes: '%s': expected KIND:MIN:MAX", text);
  *colon = '\0';
  uint64_t lo, hi;
  if (tool_parse_size(buf, &lo) != GCA_OK || tool_parse_size(colon + 1, &hi) != GCA_OK)
    return tool_error(GCA_ERR_PARSE, "sizes: '%s': MIN and MAX must be sizes (e.g. 512, 4MiB)",
                      text);
  if (lo == 0 || lo > hi)
    return tool_error(GCA_ERR_PARSE, "sizes: '%s': expected 0 < MIN <= MAX", text);
  out->min = lo;
  out->max = hi;
  return GCA_OK;
}

static gca_status_t parse_trace(const char *path, stress_sizes_t *out) {
  gca_rmm_reader_t *r = NULL;
  gca_status_t st = gca__rmm_open_file(path, &r);
  if (st != GCA_OK)
    return tool_error_prefix(st, "sizes");
  size_t cap = 0;
  for (;;) {
    gca_rmm_event_t ev;
    bool eof = false;
    TOOL_CHECK_GOTO(gca__rmm_next(r, &ev, &eof), st, fail);
    if (eof)
      break;
    if (ev.action != GCA_RMM_ALLOCATE || ev.size == 0)
      continue;
    if (out->count == cap) {
      size_t ncap = cap ? cap * 2 : 1024;
      uint64_t *grown = realloc(out->sizes, ncap * sizeof(*grown));
      if (!grown) {
        st = tool_error(GCA_ERR_OUT_OF_MEMORY, "sizes: no host memory for %zu trace sizes", ncap);
        goto fail;
      }
      out->sizes = grown;
      cap = ncap;
    }
    out->sizes[out->count++] = ev.size;
    if (out->count == 1 || ev.size < out->min)
      out->min = ev.size;
    if (ev.size > out->max)
      out->max = ev.size;
  }
  if (out->count == 0) {
    st = tool_error(GCA_ERR_PARSE, "sizes: trace '%s' has no allocate rows with a size", path);
    goto fail;
  }
  gca__rmm_close(r);
  return GCA_OK;

fail:
  free(out->sizes);
  out->sizes = NULL;
  out->count = 0;
  gca__rmm_close(r);
  return st;
}

gca_status_t gca__stress_sizes_parse(const char *text, stress_sizes_t *out) {
  stress_sizes_t s = {0};
  gca_status_t st;
  if (strncmp(text, "uniform:", 8) == 0) {
    s.kind = STRESS_SIZES_UNIFORM;
    st = parse_range(text, text + 8, &s);
  } else if (strncmp(text, "loguniform:", 11) == 0) {
    s.kind = STRESS_SIZES_LOGUNIFORM;
    st = parse_range(text, text + 11, &s);
  } else if (strncmp(text, "trace:", 6) == 0 && text[6] != '\0') {
    s.kind = STRESS_SIZES_TRACE;
    st = parse_trace(text + 6, &s);
  } else {
    st = tool_error(GCA_ERR_PARSE,
                    "sizes: '%s': expected uniform:MIN:MAX, loguniform:MIN:MAX or trace:FILE.csv",
                    text);
  }
  if (st == GCA_OK)
    *out = s;
  return st;
}

uint64_t gca__stress_sizes_sample(const stress_sizes_t *sizes, stress_rng_t *rng) {
  switch (sizes->kind) {
  case STRESS_SIZES_UNIFORM:
    return sizes->min + gca__stress_rng_below(rng, sizes->max - sizes->min + 1);
  case STRESS_SIZES_LOGUNIFORM: {
    double lo = log((double)sizes->min), hi = log((double)sizes->max + 1.0);
    uint64_t v = (uint64_t)exp(lo + (hi - lo) * gca__stress_rng_unit(rng));
    return v < sizes->min ? sizes->min : v > sizes->max ? sizes->max : v;
  }
  case STRESS_SIZES_TRACE:
    return sizes->sizes[gca__stress_rng_below(rng, sizes->count)];
  }
  return sizes->min;
}

void gca__stress_sizes_free(stress_sizes_t *sizes) {
  free(sizes->sizes);
  sizes->sizes = NULL;
  sizes->count = 0;
}
