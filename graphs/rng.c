/* SPDX-License-Identifier: Apache-2.0 */
/* rng.c - graph-safe random number generators: Philox4x32-10 (common/philox.h)
 * with the seed and the offset in device memory, so that a recorded draw
 * reads them when the graph is replayed rather than when it was captured.
 *
 * The one idea: a captured draw names the generator's device offset plus the
 * units drawn before it in the same recording; a replay writes the host
 * offset into the device scalar (two 32-bit memsets whose values travel with
 * the call) and advances the host offset by the recording's total, which is
 * exactly what the same draws made eagerly would have done. A recording that
 * draws nothing has no generator uses and its replay writes nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "graphs_internal.h"
#include "philox.h"

#define RNG_SEED   0u  /* byte offsets of the device scalars */
#define RNG_OFFSET 8u  /* what a replay's draws add to */
#define RNG_ZERO   16u /* what an eager draw adds to (always 0) */

static gca_status_t write_u64(gca_graph_tree_t *t, gca_devptr_t at, uint64_t v) {
  GCA_CHECK(t->ops->memset_d32_async(at, (uint32_t)v, 1, t->stream));
  GCA_CHECK(t->ops->memset_d32_async(at + 4, (uint32_t)(v >> 32), 1, t->stream));
  return GCA_OK;
}

static gca_status_t rng_check(const char *op, const gca_graph_rng_t *rng) {
  if (!rng)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: rng is NULL", op);
  return gca__graph_tree_check(op, rng->tree);
}

GCA_API gca_status_t gca_graph_rng_create(gca_graph_tree_t *t, uint64_t seed,
                                          gca_graph_rng_t **out) {
  GCA_CHECK(gca__graph_tree_check("graph_rng_create", t));
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_rng_create: rng is NULL");
  *out = NULL;
  if (t->capturing)
    return gca__error(GCA_ERR_INVALID_STATE, "graph_rng_create: called from a body");
  gca_graph_rng_t *r = calloc(1, sizeof(*r));
  if (!r)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_rng_create: no host memory");
  /* Outside the tree's pool: a restore must never take the scalars back. */
  void *p = NULL;
  gca_status_t st = gca_malloc_device(t->device, &p, 3 * sizeof(uint64_t), t->stream);
  if (st != GCA_OK) {
    free(r);
    return gca__error_prefix(st, "graph_rng_create");
  }
  r->tree = t;
  r->seed = seed;
  r->dev = (gca_devptr_t)(uintptr_t)p;
  st = write_u64(t, r->dev + RNG_SEED, seed);
  if (st == GCA_OK)
    st = write_u64(t, r->dev + RNG_OFFSET, 0);
  if (st == GCA_OK)
    st = write_u64(t, r->dev + RNG_ZERO, 0);
  if (st != GCA_OK) {
    GCA_CHECK_IGNORE(gca_free(p));
    free(r);
    return gca__error_prefix(st, "graph_rng_create");
  }
  r->next = t->rngs;
  t->rngs = r;
  *out = r;
  return GCA_OK;
}

/* Adds n units of rng to the capture's uses; returns the units drawn before. */
static gca_status_t capture_use(gca_graph_tree_t *t, gca_graph_rng_t *rng, uint64_t n,
                                uint64_t *before) {
  for (size_t i = 0; i < t->ncap_rng; i++)
    if (t->cap_rng[i].rng == rng) {
      *before = t->cap_rng[i].total;
      t->cap_rng[i].total += n;
      return GCA_OK;
    }
  if (t->ncap_rng == t->capcap_rng) {
    size_t cap = t->capcap_rng ? 2 * t->capcap_rng : 4;
    gca__rng_use_t *u = realloc(t->cap_rng, cap * sizeof(*u));
    if (!u)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "graph_rng_uniform_u32: no host memory");
    t->cap_rng = u;
    t->capcap_rng = cap;
  }
  t->cap_rng[t->ncap_rng++] = (gca__rng_use_t){rng, n};
  *before = 0;
  return GCA_OK;
}

GCA_API gca_status_t gca_graph_rng_uniform_u32(gca_graph_rng_t *rng, void *dst, size_t count,
                                               gca_stream_t stream) {
  GCA_CHECK(rng_check("graph_rng_uniform_u32", rng));
  gca_graph_tree_t *t = rng->tree;
  if (count == 0)
    return GCA_OK;
  if (!dst || ((uintptr_t)dst & 3u))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "graph_rng_uniform_u32: dst %p is not a 4-byte aligned device pointer", dst);
  uint64_t n = gca__philox_increment(count);
  if (t->capturing && stream == t->stream) {
    uint64_t before = 0;
    GCA_CHECK(capture_use(t, rng, n, &before));
    return t->ops->kernel_philox_u32((gca_devptr_t)(uintptr_t)dst, count, rng->dev + RNG_SEED,
                                     rng->dev + RNG_OFFSET, before, stream);
  }
  GCA_CHECK(t->ops->kernel_philox_u32((gca_devptr_t)(uintptr_t)dst, count, rng->dev + RNG_SEED,
                                      rng->dev + RNG_ZERO, rng->offset, stream));
  rng->offset += n;
  return GCA_OK;
}

GCA_API gca_status_t gca_graph_rng_get_state(gca_graph_rng_t *rng, uint64_t *seed,
                                             uint64_t *offset) {
  GCA_CHECK(rng_check("graph_rng_get_state", rng));
  if (!seed || !offset)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "graph_rng_get_state: %s is NULL",
                      seed ? "offset" : "seed");
  *seed = rng->seed;
  *offset = rng->offset;
  return GCA_OK;
}

GCA_API gca_status_t gca_graph_rng_set_state(gca_graph_rng_t *rng, uint64_t seed, uint64_t offset) {
  GCA_CHECK(rng_check("graph_rng_set_state", rng));
  if (rng->tree->capturing)
    return gca__error(GCA_ERR_INVALID_STATE, "graph_rng_set_state: called from a body");
  if (seed != rng->seed)
    GCA_CHECK(write_u64(rng->tree, rng->dev + RNG_SEED, seed));
  rng->seed = seed;
  rng->offset = gca__philox_increment(offset);
  return GCA_OK;
}

gca_status_t gca__graph_rng_prologue(gca_graph_tree_t *t, const gca__gnode_t *node) {
  for (size_t i = 0; i < node->nrng; i++) {
    gca_graph_rng_t *r = node->rng[i].rng;
    GCA_CHECK(write_u64(t, r->dev + RNG_OFFSET, r->offset));
    t->stats.prologue_writes += 2;
  }
  for (size_t i = 0; i < node->nrng; i++)
    node->rng[i].rng->offset += node->rng[i].total;
  return GCA_OK;
}

void gca__graph_rng_unadvance(const gca__gnode_t *node) {
  for (size_t i = 0; i < node->nrng; i++)
    node->rng[i].rng->offset -= node->rng[i].total;
}

void gca__graph_rng_free_all(gca_graph_tree_t *t) {
  for (gca_graph_rng_t *r = t->rngs; r;) {
    gca_graph_rng_t *next = r->next;
    GCA_CHECK_IGNORE(gca_free((void *)(uintptr_t)r->dev));
    free(r);
    r = next;
  }
  t->rngs = NULL;
}
