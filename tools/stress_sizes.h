/* SPDX-License-Identifier: Apache-2.0 */
/* stress_sizes.h - gca-stress's request-size distributions and its random
 * numbers.
 *
 * A distribution is parsed once from its --sizes text and then sampled by any
 * number of threads, each drawing from its own generator: the spec is
 * read-only after parsing, so sampling needs no lock, and a thread's sequence
 * of sizes depends only on its generator's seed.
 */
#ifndef GCA_TOOLS_STRESS_SIZES_H
#define GCA_TOOLS_STRESS_SIZES_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* splitmix64: one 64-bit word of state, any seed is valid. */
typedef struct stress_rng {
  uint64_t state;
} stress_rng_t;

typedef enum stress_size_kind {
  STRESS_SIZES_UNIFORM = 0,    /* every size in [min, max] equally likely */
  STRESS_SIZES_LOGUNIFORM = 1, /* log(size) uniform in [log min, log max] */
  STRESS_SIZES_TRACE = 2,      /* the `allocate` sizes of an RMM log CSV, equally likely */
} stress_size_kind_t;

/* Invariant: 1 <= min <= max; for TRACE, count >= 1 and min/max bound sizes[]. */
typedef struct stress_sizes {
  stress_size_kind_t kind;
  uint64_t min;
  uint64_t max;
  uint64_t *sizes; /* TRACE only, malloc'd */
  size_t count;
} stress_sizes_t;

/* ---- stress_sizes.c ---- */

/* The next 64 random bits. */
uint64_t gca__stress_rng_next(stress_rng_t *rng);
/* A value uniform in [0, n) (n > 0). */
uint64_t gca__stress_rng_below(stress_rng_t *rng, uint64_t n);
/* A double uniform in [0, 1). */
double gca__stress_rng_unit(stress_rng_t *rng);
/* A well-mixed 64-bit hash of (a, b): seeds threads and block patterns. */
uint64_t gca__stress_mix(uint64_t a, uint64_t b);

/* Parses "uniform:MIN:MAX", "loguniform:MIN:MAX" (sizes as tool_parse_size
 * reads them) or "trace:FILE.csv". GCA_ERR_PARSE quoting the text when
 * malformed, MIN is 0 or MIN > MAX; for a trace, the RMM reader's GCA_ERR_IO
 * or GCA_ERR_PARSE (naming the file and line) prefixed "sizes: ", and
 * GCA_ERR_PARSE when it holds no allocation. On failure *out is untouched. */
gca_status_t gca__stress_sizes_parse(const char *text, stress_sizes_t *out);
/* Draws one size from the distribution. */
uint64_t gca__stress_sizes_sample(const stress_sizes_t *sizes, stress_rng_t *rng);
void gca__stress_sizes_free(stress_sizes_t *sizes);

#endif
