/* SPDX-License-Identifier: Apache-2.0 */
/* alloc_fixture.h - what the allocator tests share: a fixture that gives each
 * test a fresh allocator on a fresh sim device (faults cleared, counters
 * zeroed, 16 GiB unless the test shrinks it), checks the allocator's
 * invariants after the test, and small helpers for reading statistics and
 * segment layouts. */
#ifndef GCA_TEST_ALLOC_FIXTURE_H
#define GCA_TEST_ALLOC_FIXTURE_H

#include "gca.h"
#include "support.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static const gca_device_ops_t *ops __attribute__((unused));

__attribute__((unused)) static int alloc_setup(void **state) {
  (void)state;
  ops = test_backend();
  gca__allocator_reset();
  gca_sim_fault_clear();
  assert_ok(gca_sim_set_capacity(0, 16 * GiB));
  gca_sim_counters_reset();
  return 0;
}

/* The leak check of a teardown, before any forced reset: nothing the test
 * allocated is still allocated, and once the cache is emptied no device
 * memory is in use, so a leak (a block or a private pool left behind, a
 * segment the allocator lost) fails the test instead of vanishing in the
 * reset. A test that keeps memory on purpose frees it first. */
__attribute__((unused)) static void assert_nothing_leaked(void) {
  int n = 0;
  assert_ok(gca_device_count(&n));
  for (int dev = 0; dev < n; dev++) {
    gca_stats_t s;
    assert_ok(gca_get_stats(dev, &s));
    assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 0);
    assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  }
  assert_ok(gca_empty_cache());
  assert_ok(gca__allocator_check());
  for (int dev = 0; dev < n; dev++)
    assert_int_equal(gca_sim_used_bytes(dev), 0);
}

__attribute__((unused)) static int alloc_teardown(void **state) {
  (void)state;
  gca_sim_fault_clear();
  assert_ok(gca__allocator_check());
  assert_nothing_leaked();
  gca__allocator_reset();
  assert_int_equal(gca_sim_used_bytes(0), 0);
  return 0;
}

/* A trace observer (gca_trace_observer_add) counting the allocations and
 * free requests of one address (ctx: counts_t). */
typedef struct counts {
  uint64_t addr;
  int allocs, frees;
} counts_t;
__attribute__((unused)) static void count_events(const gca_trace_event_t *e, void *ctx) {
  counts_t *c = ctx;
  c->allocs += e->address == c->addr && e->action == GCA_TRACE_ALLOC;
  c->frees += e->address == c->addr && e->action == GCA_TRACE_FREE_REQUESTED;
}

/* Runs the invariant walker; every test calls it after each step. */
#define check() assert_ok(gca__allocator_check())

static inline gca_stats_t stats(void) {
  gca_stats_t s;
  assert_ok(gca_get_stats(0, &s));
  return s;
}

static inline void *alloc_on(size_t size, gca_stream_t stream) {
  void *p = NULL;
  assert_ok(gca_malloc(&p, size, stream));
  assert_non_null(p);
  check();
  return p;
}

static inline void free_ok(void *p) {
  assert_ok(gca_free(p));
  check();
}

static inline size_t block_size_of(const void *p) {
  size_t sz = 0;
  int dev = -1;
  assert_ok(gca_pointer_info(p, &sz, &dev));
  assert_int_equal(dev, 0);
  return sz;
}

/* Layout of the device's segments: count, and blocks per segment. */
typedef struct layout {
  size_t nsegs;
  size_t seg_size[64];
  size_t nblocks[64];
  size_t nfree[64];
} layout_t;

__attribute__((unused)) static void layout_fn(const gca_segment_info_t *seg,
                                              const gca_block_info_t *blocks, size_t nblocks,
                                              void *ctx) {
  layout_t *l = ctx;
  if (l->nsegs < 64) {
    l->seg_size[l->nsegs] = seg->total_size;
    l->nblocks[l->nsegs] = nblocks;
    size_t nf = 0;
    for (size_t i = 0; i < nblocks; i++)
      nf += blocks[i].state == GCA_BLOCK_INACTIVE;
    l->nfree[l->nsegs] = nf;
  }
  l->nsegs++;
}

static inline layout_t layout(void) {
  layout_t l;
  memset(&l, 0, sizeof(l));
  assert_ok(gca__allocator_walk(0, layout_fn, &l));
  return l;
}

/* A per-word pattern derived from `seed`, written through host access (device
 * memory is host memory on sim), and the index of the first word that differs
 * from it (-1 when none). */
static inline void stamp_fill(void *p, size_t size, uint32_t seed) {
  uint32_t *w = p;
  for (size_t i = 0; i < size / 4; i++)
    w[i] = seed ^ (uint32_t)(i * 2654435761u);
}

static inline long stamp_mismatch(const void *p, size_t size, uint32_t seed) {
  const uint32_t *w = p;
  for (size_t i = 0; i < size / 4; i++)
    if (w[i] != (seed ^ (uint32_t)(i * 2654435761u)))
      return (long)i;
  return -1;
}

#endif
