/* SPDX-License-Identifier: Apache-2.0 */
/* test_free_cache.c - the free cache (Note [Free cache], fcache.c): a plain
 * free waits uncoalesced in its (stream, pool)'s slot for the next request of
 * its size, which takes it only where PyTorch's best fit would (Note [Exact
 * hits]); placement and statistics stay exactly those of PyTorch's rules at
 * every step, misses and release paths see every free merged, and a slot
 * whose puts go unused stops caching (Note [Free cache waste]). The slot is
 * tested alone here (recycle_bins:False): the recycle bins, on by default,
 * leave PyTorch's placement for small blocks (test_recycle_bins.c). */
#include <stdlib.h>

#include "alloc_fixture.h"
#include "fcache.h"

/* The fixture's, with the slot alone (recycle_bins:False). */
static int fc_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("recycle_bins:False"));
  return 0;
}

static size_t fc_count(void) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  return d != NULL ? d->fc_count : 0;
}

static int64_t total_device_calls(void) {
  int64_t n = 0;
  for (int i = 0; i < gca_sim_op_count(); i++)
    n += gca_sim_call_count(gca_sim_op_name(i));
  return n;
}

/* Every field of every statistic that does not depend on which block a
 * request receives. */
static void assert_usage_stats_equal(const gca_stats_t *a, const gca_stats_t *b, const char *when) {
  const gca_stat_t *arrs_a[] = {a->allocation, a->allocated_bytes, a->active, a->active_bytes,
                                a->requested_bytes};
  const gca_stat_t *arrs_b[] = {b->allocation, b->allocated_bytes, b->active, b->active_bytes,
                                b->requested_bytes};
  static const char *names[] = {"allocation", "allocated_bytes", "active", "active_bytes",
                                "requested_bytes"};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(arrs_a); k++) {
    for (int t = 0; t < GCA_STAT_TYPES; t++) {
      const gca_stat_t *x = &arrs_a[k][t], *y = &arrs_b[k][t];
      if (x->current != y->current || x->peak != y->peak || x->allocated != y->allocated ||
          x->freed != y->freed)
        fail_msg("%s: %s[%d] differs: %lld/%lld/%lld/%lld vs %lld/%lld/%lld/%lld", when, names[k],
                 t, (long long)x->current, (long long)x->peak, (long long)x->allocated,
                 (long long)x->freed, (long long)y->current, (long long)y->peak,
                 (long long)y->allocated, (long long)y->freed);
    }
  }
  assert_int_equal(a->oversize_allocations.current, b->oversize_allocations.current);
  assert_int_equal(a->oversize_allocations.peak, b->oversize_allocations.peak);
}

static void assert_all_stats_equal(const gca_stats_t *a, const gca_stats_t *b) {
  assert_usage_stats_equal(a, b, "pair");
  const gca_stat_t *xa[] = {a->segment, a->reserved_bytes, a->inactive_split,
                            a->inactive_split_bytes};
  const gca_stat_t *xb[] = {b->segment, b->reserved_bytes, b->inactive_split,
                            b->inactive_split_bytes};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(xa); k++)
    assert_memory_equal(xa[k], xb[k], sizeof(gca_stat_t) * GCA_STAT_TYPES);
  assert_int_equal(a->num_device_alloc, b->num_device_alloc);
  assert_int_equal(a->num_device_free, b->num_device_free);
}

/* The benchmark's pattern: alloc+free of one size on an otherwise idle
 * allocator. The block is reused, no device call is made, and every
 * statistic, peaks included, equals what PyTorch's rules give (measured here
 * with the cache off). */
static void pair_reuses_block_with_exact_statistics(void **state) {
  (void)state;
  gca_stats_t with[3], without[3];
  for (int pass = 0; pass < 2; pass++) {
    assert_nothing_leaked();
    gca__allocator_reset();
    assert_ok(
        gca_set_config(pass == 0 ? "free_cache:True,recycle_bins:False" : "free_cache:False"));
    gca_stats_t *out = pass == 0 ? with : without;
    void *p = alloc_on(600, NULL);
    free_ok(p);
    out[0] = stats();
    assert_int_equal(fc_count(), pass == 0 ? 1 : 0);
    gca_sim_counters_reset();
    for (int i = 0; i < 1000; i++) {
      void *q = alloc_on(700, NULL); /* same rounded size, another requested size */
      assert_ptr_equal(q, p);
      if (i == 0)
        out[1] = stats();
      free_ok(q);
    }
    assert_int_equal(total_device_calls(), 0);
    out[2] = stats();
  }
  assert_ok(gca_set_config("free_cache:True,recycle_bins:False"));
  for (int i = 0; i < 3; i++)
    assert_all_stats_equal(&with[i], &without[i]);
  /* a freed block merged back into its 2 MiB segment: nothing inactive split */
  assert_int_equal(with[0].inactive_split[GCA_STAT_ALL].current, 0);
  assert_int_equal(with[1].inactive_split[GCA_STAT_SMALL].current, 1);
  assert_int_equal(with[1].inactive_split_bytes[GCA_STAT_SMALL].current, 2 * MiB - 1024);
  assert_int_equal(with[2].requested_bytes[GCA_STAT_SMALL].allocated, 600 + 1000 * 700);
}

/* Note [Lazy puts]: pairs with no statistics read and no walker between them
 * (the raw API), so each take cancels the put before it: a block freed
 * between two live ones (its put raises inactive_split), an oversize block
 * (max_split_size_mb:21, 25 MiB), other requested sizes; then a put settled
 * by a read, by reset_peak_stats and by frees that miss. Every statistic,
 * peaks, allocated and freed counts included, equals the uncached run's. */
static void lazy_puts_keep_every_statistic_exact(void **state) {
  (void)state;
  gca_stats_t out[2][4];
  void *first_b = NULL;
  for (int pass = 0; pass < 2; pass++) {
    assert_nothing_leaked();
    gca__allocator_reset();
    assert_ok(gca_set_config(pass == 0 ? "free_cache:True,recycle_bins:False,max_split_size_mb:21"
                                       : "free_cache:False,max_split_size_mb:21"));
    void *a, *b, *c, *big;
    assert_ok(gca_malloc(&a, 4096, NULL));
    assert_ok(gca_malloc(&b, 4096, NULL));
    assert_ok(gca_malloc(&c, 4096, NULL));
    assert_ok(gca_malloc(&big, 25 * MiB, NULL));
    first_b = b;
    gca__devalloc_t *d = gca__devalloc_peek(0);
#ifdef GCA_DEBUG_CHECKS
    bool owed = false; /* the walker after every mutation settles each put at once */
#else
    bool owed = pass == 0;
#endif
    for (int i = 0; i < 100; i++) {
      assert_ok(gca_free(b));
      if (owed)
        assert_ptr_equal(d->fc_lazy.b, gca__ptrmap_find(&d->ptrs, (uintptr_t)b));
      assert_ok(gca_malloc(&b, 3000 + (size_t)i, NULL));
      if (pass == 0)
        assert_ptr_equal(b, first_b); /* the free cache's hit */
      assert_null(d->fc_lazy.b);      /* cancelled, or never owed */
      assert_ok(gca_free(big));
      assert_ok(gca_malloc(&big, 25 * MiB - (size_t)i, NULL));
    }
    out[pass][0] = stats();
    assert_ok(gca_free(b)); /* owed, then settled by the read */
    out[pass][1] = stats();
    assert_ok(gca_malloc(&b, 4096, NULL));
    assert_ok(gca_free(b)); /* owed, then settled by the reset */
    assert_ok(gca_reset_peak_stats(0));
    assert_ok(gca_malloc(&b, 4000, NULL));
    out[pass][2] = stats();
    assert_ok(gca_free(b)); /* owed, then settled by a free the cache cannot take */
    assert_ok(gca_free(a));
    assert_ok(gca_free(c));
    assert_ok(gca_free(big));
    out[pass][3] = stats();
    check();
  }
  assert_ok(gca_set_config("free_cache:True,recycle_bins:False"));
  for (int i = 0; i < 4; i++)
    assert_all_stats_equal(&out[0][i], &out[1][i]);
  assert_int_equal(out[0][0].inactive_split[GCA_STAT_SMALL].peak, 2); /* b's hole, the tail */
  assert_int_equal(out[0][0].oversize_allocations.allocated, 101);
  assert_int_equal(out[0][0].requested_bytes[GCA_STAT_SMALL].allocated,
                   3 * 4096 + 100 * 3000 + 99 * 100 / 2);
}

/* Note [Lazy puts]: a streak of pairs of one block (the requested size
 * varying within its 4 KiB) counts its pairs once, at the next read; each
 * free after the first puts the block back without the pointer map. The
 * streak is broken every 500 pairs by a statistics read, by another block's
 * pair and by empty_cache, and picked up again. At each break and at the end,
 * every statistic equals the uncached run's. */
static void a_streak_of_pairs_is_counted_at_the_next_read(void **state) {
  (void)state;
  enum { PAIRS = 3000, BREAK = 500 };
  gca_stats_t out[2][PAIRS / BREAK + 1];
  for (int pass = 0; pass < 2; pass++) {
    assert_nothing_leaked();
    gca__allocator_reset();
    assert_ok(
        gca_set_config(pass == 0 ? "free_cache:True,recycle_bins:False" : "free_cache:False"));
    void *a, *b, *c;
    assert_ok(gca_malloc(&a, 4096, NULL));
    assert_ok(gca_malloc(&b, 4096, NULL));
    assert_ok(gca_malloc(&c, 4096, NULL));
    void *first_b = b;
    gca__devalloc_t *d = gca__devalloc_peek(0);
    gca__block_t *rec = gca__ptrmap_find(&d->ptrs, (uintptr_t)b);
    (void)rec;
    int k = 0;
    for (int i = 1; i <= PAIRS; i++) {
      assert_ok(gca_free(b));
      assert_ok(gca_malloc(&b, 4096 - 100 * (size_t)(i % 3), NULL));
      assert_ptr_equal(b, first_b);
#ifndef GCA_DEBUG_CHECKS /* there the walker after every mutation settles at once */
      if (pass == 0) {
        assert_ptr_equal(d->fc_lazy.hot, rec); /* its next free puts it back as it is */
        assert_null(d->fc_lazy.b);
        assert_int_equal(d->fc_lazy.pairs, i % BREAK == 0 ? BREAK : i % BREAK);
      }
#endif
      if (i % BREAK != 0)
        continue;
      out[pass][k++] = stats(); /* settles the streak */
      assert_int_equal(d->fc_lazy.pairs, 0);
      if (i % (2 * BREAK) == 0) { /* another block's pair: the streak moves there and back */
        assert_ok(gca_free(a));
        assert_ok(gca_malloc(&a, 4096, NULL));
      } else {
        assert_ok(gca_empty_cache());
      }
      check();
    }
    assert_ok(gca_free(b));
    assert_ok(gca_free(a));
    assert_ok(gca_free(c));
    out[pass][k++] = stats();
    assert_int_equal(k, PAIRS / BREAK + 1);
    check();
  }
  assert_ok(gca_set_config("free_cache:True,recycle_bins:False"));
  for (int i = 0; i < PAIRS / BREAK + 1; i++)
    assert_all_stats_equal(&out[0][i], &out[1][i]);
  assert_int_equal(out[0][0].allocation[GCA_STAT_SMALL].allocated, 3 + BREAK);
  assert_int_equal(out[0][0].requested_bytes[GCA_STAT_SMALL].allocated,
                   3 * 4096 + BREAK * 4096 -
                       100 * (167 * 1 + 167 * 2)); /* i % 3: 167 ones, 167 twos */
}

/* Note [Leaf hits] (allocator.c): 10,000 pairs of one block with no read
 * between them bias the device lock to the test's thread (after 4,096
 * locks), and the rest take the leaf hits; the pair count owed covers all of
 * them, and every statistic read after equals the uncached run's. In a build
 * or on a kernel without the bias every pair takes the full path, and the
 * statistics agree all the same. */
static void pairs_held_by_the_bias_take_the_leaf_hits(void **state) {
  (void)state;
  enum { PAIRS = 10000 };
  gca_stats_t out[2];
  for (int pass = 0; pass < 2; pass++) {
    assert_nothing_leaked();
    gca__allocator_reset();
    assert_ok(
        gca_set_config(pass == 0 ? "free_cache:True,recycle_bins:False" : "free_cache:False"));
    void *a, *b;
    assert_ok(gca_malloc(&a, 4096, NULL));
    assert_ok(gca_malloc(&b, 4096, NULL));
    void *first_b = b;
    gca__devalloc_t *d = gca__devalloc_peek(0);
    for (int i = 1; i <= PAIRS; i++) {
      assert_ok(gca_free(b));
      assert_ok(gca_malloc(&b, 4096 - 100 * (size_t)(i % 2), NULL));
      assert_ptr_equal(b, first_b);
    }
#ifndef GCA_DEBUG_CHECKS /* there the walker settles each pair, and no leaf runs */
    if (pass == 0) {
      assert_int_equal(d->fc_lazy.pairs, PAIRS);
      if (gca__mutex_bias_after != UINT32_MAX)
        assert_true(atomic_load(&d->lock.bias) == gca__lock_me());
    }
#endif
    (void)d;
    out[pass] = stats();
    assert_ok(gca_free(b));
    assert_ok(gca_free(a));
    check();
  }
  assert_ok(gca_set_config("free_cache:True,recycle_bins:False"));
  assert_all_stats_equal(&out[0], &out[1]);
  assert_int_equal(out[0].allocation[GCA_STAT_SMALL].allocated, 2 + PAIRS);
  assert_int_equal(out[0].requested_bytes[GCA_STAT_SMALL].allocated,
                   2 * 4096 + PAIRS * 4096 - 100 * (PAIRS / 2));
}

/* Note [Leaf gate]: a recorder turned on while this thread's pairs take the
 * leaf hits (the lock biased to it, the gate open) shuts the gate before the
 * call returns, so every pair after it is recorded: by a trace observer, then
 * by the history ring. Without gca__fc_gates_shut the leaves would keep
 * running until some full path let the lock go, and record nothing. */
static void a_recorder_turned_on_stops_the_leaf_hits(void **state) {
  (void)state;
  enum { PAIRS = 10 };
  void *a, *b;
  assert_ok(gca_malloc(&a, 4096, NULL));
  assert_ok(gca_malloc(&b, 4096, NULL));
  void *first_b = b;
  gca__devalloc_t *d = gca__devalloc_peek(0);
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 1000; i++) {
      assert_ok(gca_free(b));
      assert_ok(gca_malloc(&b, 4096, NULL));
    }
#ifndef GCA_DEBUG_CHECKS /* there no leaf runs */
    assert_int_equal(d->fc_gate & GCA__GATE_FC, 0);
    assert_true(d->fc_lazy.pairs > 0); /* the leaves took the last pairs */
#endif
    counts_t c = {(uint64_t)(uintptr_t)first_b, 0, 0};
    gca_trace_observer_handle_t h = 0;
    if (round == 0)
      assert_ok(gca_trace_observer_add(count_events, &c, &h));
    else
      assert_ok(gca_record_history(true, 1000, false));
    assert_int_equal(d->fc_gate, GCA__GATE_FC | GCA__GATE_RB); /* both leaves shut */
    for (int i = 0; i < PAIRS; i++) {
      assert_ok(gca_free(b));
      assert_ok(gca_malloc(&b, 4096, NULL));
      assert_ptr_equal(b, first_b);
    }
    if (round == 0) {
      assert_ok(gca_trace_observer_remove(h));
    } else {
      gca_history_entry_t *e;
      size_t n;
      assert_ok(gca__history_copy(0, &e, &n));
      for (size_t i = 0; i < n; i++) {
        c.allocs += e[i].addr == c.addr && e[i].action == GCA_HA_ALLOC;
        c.frees += e[i].addr == c.addr && e[i].action == GCA_HA_FREE_REQUESTED;
      }
      free(e);
      assert_ok(gca_record_history(false, 0, false));
    }
    assert_int_equal(c.allocs, PAIRS);
    assert_int_equal(c.frees, PAIRS);
  }
  assert_ok(gca_free(b));
  assert_ok(gca_free(a));
  check();
}

/* Random scripts on two streams, run with and without the cache: after every
 * step the usage statistics (every field) are equal and the walker, which
 * recomputes inactive_split from the layout, passes; at the end everything
 * returns to the device. Three allocations in four after a free ask again for
 * what was freed, the pattern the cache serves. */
static void random_scripts_keep_statistics_exact(void **state) {
  (void)state;
  static const size_t sizes[] = {512, 1000, 4096, 65536, 1 << 20, 3 << 20, 12 << 20};
  gca_stream_t streams[2] = {NULL, NULL};
  assert_ok(gca_stream_create(&streams[1], GCA_STREAM_NON_BLOCKING));
  enum { STEPS = 1500, LIVE = 48 };
  for (unsigned seed = 1; seed <= 6; seed++) {
    gca_stats_t *trace[2];
    for (int pass = 0; pass < 2; pass++) {
      assert_nothing_leaked();
      gca__allocator_reset();
      assert_ok(
          gca_set_config(pass == 0 ? "free_cache:True,recycle_bins:False" : "free_cache:False"));
      trace[pass] = calloc(STEPS, sizeof(gca_stats_t));
      assert_non_null(trace[pass]);
      void *live[LIVE] = {0};
      size_t lsize[LIVE] = {0}, again = 0;
      int lstream[LIVE] = {0}, again_stream = 0;
      unsigned r = seed;
      size_t hits = 0;
      for (int step = 0; step < STEPS; step++) {
        r = r * 1103515245u + 12345u;
        unsigned slot = (r >> 8) % LIVE;
        if (live[slot] != NULL) {
          free_ok(live[slot]);
          live[slot] = NULL;
          again = (r >> 24) % 4 != 0 ? lsize[slot] : 0;
          again_stream = lstream[slot];
        } else {
          size_t size = sizes[(r >> 16) % GCA_ARRAY_SIZE(sizes)] - ((r >> 4) & 7);
          int si = (r >> 20) & 1;
          if (again != 0) {
            size = again;
            si = again_stream;
            again = 0;
          }
          size_t before = fc_count();
          live[slot] = alloc_on(size, streams[si]);
          lsize[slot] = size;
          lstream[slot] = si;
          hits += fc_count() + 1 == before;
        }
        trace[pass][step] = stats();
      }
      for (int i = 0; i < LIVE; i++)
        if (live[i] != NULL)
          free_ok(live[i]);
      assert_ok(gca_empty_cache());
      check();
      assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
      assert_int_equal(fc_count(), 0);
      if (pass == 0)
        assert_true(hits > 50); /* the scripts do exercise the cache */
    }
    for (int step = 0; step < STEPS; step++) {
      char when[64];
      snprintf(when, sizeof(when), "seed %u step %d", seed, step);
      assert_usage_stats_equal(&trace[0][step], &trace[1][step], when);
    }
    free(trace[0]);
    free(trace[1]);
  }
  assert_ok(gca_set_config("free_cache:True,recycle_bins:False"));
  assert_ok(gca_stream_destroy(streams[1]));
}

/* A block freed next to a cached one merges with it, as PyTorch's free does. */
static void freeing_a_neighbour_merges_the_cached_block(void **state) {
  (void)state;
  char *a = alloc_on(512, NULL);
  char *b = alloc_on(512, NULL);
  char *c = alloc_on(512, NULL);
  assert_ptr_equal(b, a + 512);
  assert_ptr_equal(c, b + 512);
  free_ok(b); /* cached: a and c are in use */
  assert_int_equal(fc_count(), 1);
  gca_stats_t s = stats();
  assert_int_equal(s.inactive_split[GCA_STAT_SMALL].current, 2); /* b, and the remainder */
  assert_int_equal(s.inactive_split_bytes[GCA_STAT_SMALL].current, 2 * MiB - 1024);
  free_ok(a); /* a's neighbour b is cached: a is freed into the tree and b merged into it */
  assert_int_equal(fc_count(), 0);
  s = stats();
  assert_int_equal(s.inactive_split[GCA_STAT_SMALL].current, 2); /* a+b, and the remainder */
  assert_int_equal(s.inactive_split_bytes[GCA_STAT_SMALL].current, 2 * MiB - 512);
  layout_t l = layout();
  assert_int_equal(l.nsegs, 1);
  assert_int_equal(l.nblocks[0], 3); /* [a+b free][c][rest free] */
  assert_int_equal(l.nfree[0], 2);
  void *ab = alloc_on(1024, NULL); /* the merged block fits exactly */
  assert_ptr_equal(ab, a);
  free_ok(ab);
  free_ok(c);
  l = layout();
  assert_int_equal(l.nblocks[0], 1);
  assert_int_equal(stats().inactive_split[GCA_STAT_ALL].current, 0);
}

/* A request of another size flushes the cache first, so it finds the cached
 * memory merged, exactly where PyTorch's best fit would, and no segment is
 * created for it. */
static void a_miss_sees_cached_blocks_merged(void **state) {
  (void)state;
  char *a = alloc_on(1 * MiB, NULL);
  char *b = alloc_on(1 * MiB, NULL); /* the 2 MiB segment is full */
  assert_ptr_equal(b, a + MiB);
  free_ok(a);
  assert_int_equal(fc_count(), 1);
  int64_t segs = stats().num_device_alloc;
  char *c = alloc_on(512 * KiB, NULL);
  assert_ptr_equal(c, a); /* best fit: a's block, split */
  assert_int_equal(fc_count(), 0);
  assert_int_equal(stats().num_device_alloc, segs);
  char *e = alloc_on(512 * KiB, NULL);
  assert_ptr_equal(e, a + 512 * KiB);
  free_ok(c);
  free_ok(e);
  free_ok(b);
}

/* The cache never changes placement (Note [Exact hits]): a request of a
 * cached (stream, size) gets an older free block of that size that lies
 * lower, as PyTorch's best fit does, and the cached block is merged back
 * instead; with free_cache:False the same. Statistics agree either way. */
static void the_cache_keeps_pytorch_placement(void **state) {
  (void)state;
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  gca_stats_t st[2];
  for (int pass = 0; pass < 2; pass++) {
    assert_nothing_leaked();
    gca__allocator_reset();
    assert_ok(
        gca_set_config(pass == 0 ? "free_cache:True,recycle_bins:False" : "free_cache:False"));
    char *y = alloc_on(512 * KiB, NULL);
    char *g1 = alloc_on(512 * KiB, NULL);
    char *x = alloc_on(512 * KiB, NULL);
    char *g2 = alloc_on(512 * KiB, NULL);
    free_ok(y);
    free_ok(x); /* y's slot: y goes to the tree, x is cached */
    assert_int_equal(fc_count(), pass == 0 ? 1 : 0);
    void *z = alloc_on(512 * KiB, NULL);
    assert_ptr_equal(z, y); /* the lower one, not the one freed last */
    assert_int_equal(fc_count(), 0);
    void *w = alloc_on(512 * KiB, NULL);
    assert_ptr_equal(w, x);
    st[pass] = stats();
    free_ok(w);
    free_ok(z);
    free_ok(g1);
    free_ok(g2);
  }
  assert_all_stats_equal(&st[0], &st[1]);
  assert_ok(gca_set_config("free_cache:True,recycle_bins:False"));
  assert_ok(gca_stream_destroy(s2));
}

/* A cached block with a free block above it is PyTorch's choice only while
 * that run is the best fit: a smaller free block that still fits comes first
 * (the request splits it, and the cached block is merged back), and so does
 * an older one of the run's size that lies lower. */
static void a_hit_needs_the_cached_run_to_be_the_best_fit(void **state) {
  (void)state;
  for (int pass = 0; pass < 2; pass++) {
    assert_nothing_leaked();
    gca__allocator_reset();
    assert_ok(
        gca_set_config(pass == 0 ? "free_cache:True,recycle_bins:False" : "free_cache:False"));
    /* [a 8K][g 4K][x 4K][rest free]: free a (8K, fits a 4K request), then x */
    char *a = alloc_on(8 * KiB, NULL);
    char *g = alloc_on(4 * KiB, NULL);
    char *x = alloc_on(4 * KiB, NULL);
    free_ok(a);
    free_ok(x); /* a goes to the tree, x is cached above the free remainder */
    void *p = alloc_on(4 * KiB, NULL);
    assert_ptr_equal(p, a); /* a's 8K is smaller than x's run (x + remainder) */
    void *q = alloc_on(4 * KiB, NULL);
    assert_ptr_equal(q, a + 4 * KiB);
    void *r = alloc_on(4 * KiB, NULL);
    assert_ptr_equal(r, x);
    free_ok(p);
    free_ok(q);
    free_ok(r);
    free_ok(g);
  }
  assert_ok(gca_set_config("free_cache:True,recycle_bins:False"));
}

typedef struct script_step {
  void *ptr;        /* what the allocation returned, or NULL for a free */
  int64_t reserved; /* reserved bytes after the step */
  int64_t inactive; /* inactive_split_bytes after the step */
} script_step_t;

/* One random script (seed) under `conf`, recording every step. Returns the
 * hits of the free cache. */
static size_t run_script(unsigned seed, const char *conf, gca_stream_t s2, script_step_t *out,
                         int steps) {
  static const size_t sizes[] = {512,     1000,    4096,     12288,    65536,
                                 1 << 20, 3 << 20, 12 << 20, 30 << 20, (41 << 20) + 512};
  enum { LIVE = 40 };
  gca_stream_t streams[2] = {NULL, s2};
  assert_nothing_leaked();
  gca__allocator_reset();
  assert_ok(gca_set_config(conf));
  void *live[LIVE] = {0};
  size_t lsize[LIVE] = {0}, again = 0;
  int lstream[LIVE] = {0}, again_stream = 0;
  unsigned r = seed;
  size_t hits = 0;
  for (int step = 0; step < steps; step++) {
    r = r * 1103515245u + 12345u;
    unsigned slot = (r >> 8) % LIVE;
    out[step].ptr = NULL;
    if (live[slot] != NULL) {
      free_ok(live[slot]);
      live[slot] = NULL;
      /* two allocations in three after a free ask again for what was freed */
      again = (r >> 24) % 3 != 0 ? lsize[slot] : 0;
      again_stream = lstream[slot];
    } else {
      size_t size = sizes[(r >> 16) % GCA_ARRAY_SIZE(sizes)] - ((r >> 4) & 7);
      int si = (r >> 20) & 1;
      if (again != 0) {
        size = again;
        si = again_stream;
        again = 0;
      }
      size_t before = fc_count();
      live[slot] = alloc_on(size, streams[si]);
      lsize[slot] = size;
      lstream[slot] = si;
      out[step].ptr = live[slot];
      hits += fc_count() + 1 == before;
    }
    gca_stats_t s = stats();
    out[step].reserved = s.reserved_bytes[GCA_STAT_ALL].current;
    out[step].inactive = s.inactive_split_bytes[GCA_STAT_ALL].current;
  }
  for (int i = 0; i < LIVE; i++)
    if (live[i] != NULL)
      free_ok(live[i]);
  return hits;
}

/* Random scripts on two streams, under settings that change the rules (the
 * classic and the expandable segments, max_split_size, rounding divisions):
 * with the cache, every allocation returns the address it returns without,
 * and reserved memory and inactive_split_bytes are equal after every step
 * (Note [Exact hits]), while the cache does serve many of them. */
static void random_scripts_place_every_block_as_pytorch(void **state) {
  (void)state;
  static const char *const confs[] = {"", "expandable_segments:True", "max_split_size_mb:24",
                                      "roundup_power2_divisions:4"};
  enum { STEPS = 2000 };
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  script_step_t *with = calloc(STEPS, sizeof(*with)), *without = calloc(STEPS, sizeof(*without));
  assert_non_null(with);
  assert_non_null(without);
  for (size_t c = 0; c < GCA_ARRAY_SIZE(confs); c++) {
    for (unsigned seed = 1; seed <= 4; seed++) {
      char on[128], off[128];
      snprintf(on, sizeof(on), "%s%sfree_cache:True,recycle_bins:False", confs[c],
               *confs[c] ? "," : "");
      snprintf(off, sizeof(off), "%s%sfree_cache:False", confs[c], *confs[c] ? "," : "");
      size_t hits = run_script(seed, on, s2, with, STEPS);
      run_script(seed, off, s2, without, STEPS);
      for (int step = 0; step < STEPS; step++)
        if (with[step].ptr != without[step].ptr || with[step].reserved != without[step].reserved ||
            with[step].inactive != without[step].inactive)
          fail_msg("'%s' seed %u step %d: %p reserved %lld inactive %lld with the cache, %p "
                   "%lld %lld without",
                   confs[c], seed, step, with[step].ptr, (long long)with[step].reserved,
                   (long long)with[step].inactive, without[step].ptr,
                   (long long)without[step].reserved, (long long)without[step].inactive);
      print_message("'%s' seed %u: %zu hits\n", confs[c], seed, hits);
      if (hits < 50)
        fail_msg("'%s' seed %u: only %zu hits: the script does not exercise the cache", confs[c],
                 seed, hits);
    }
  }
  free(with);
  free(without);
  assert_ok(gca_stream_destroy(s2)); /* the fixture's reset restores the settings */
}

/* Note [Free cache waste]: alternating 4 KiB and 12 KiB, every cached free
 * is evicted by the next request; after GCA__FC_WASTE_OFF such puts the
 * device stops caching but for one probe in GCA__FC_PROBE frees, and a miss
 * evicts what another stream left cached, so nothing stays cached. A run of
 * one size then turns it back on at the next probe, and from there every free
 * is cached and every request a hit. */
static void a_device_whose_puts_go_unused_stops_caching(void **state) {
  (void)state;
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  free_ok(alloc_on(64 * KiB, s2)); /* cached, and left there */
  assert_int_equal(fc_count(), 1);
  int cached = 0;
  for (int i = 0; i < 160; i++) {
    void *p = alloc_on(i & 1 ? 12 * KiB : 4 * KiB, NULL);
    size_t before = fc_count();
    free_ok(p);
    cached += fc_count() == before + 1;
  }
  /* off after GCA__FC_WASTE_OFF puts; then each probe is wasted too */
  assert_int_equal(cached, GCA__FC_WASTE_OFF + (160 - GCA__FC_WASTE_OFF) / GCA__FC_PROBE);
  free_ok(alloc_on(12 * KiB, NULL)); /* a miss (then a free not cached) */
  assert_int_equal(fc_count(), 0);   /* s2's block went too */
  int first_hit = -1;
  void *p = alloc_on(8 * KiB, NULL);
  for (int i = 0; i < GCA__FC_PROBE + 20; i++) {
    size_t before = fc_count();
    free_ok(p);
    bool put = fc_count() == before + 1;
    p = alloc_on(8 * KiB, NULL);
    if (put && fc_count() == before && first_hit < 0)
      first_hit = i;
    if (first_hit >= 0)
      assert_true(put); /* on again: every free cached, every request a hit */
  }
  free_ok(p);
  print_message("caching resumed at the %d-th free of one size\n", first_hit);
  assert_true(first_hit >= 0 && first_hit < GCA__FC_PROBE);
  assert_ok(gca_stream_destroy(s2));
}

/* A cached pointer is not live: a second free, record_stream and
 * pointer_info say so, and nothing changes. */
static void cached_pointer_is_not_live(void **state) {
  (void)state;
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  gca_stats_t before = stats();
  assert_status(gca_free(p), GCA_ERR_INVALID_POINTER, "already freed");
  assert_status(gca_record_stream(p, NULL), GCA_ERR_INVALID_POINTER, "record_stream");
  size_t sz;
  assert_status(gca_pointer_info(p, &sz, NULL), GCA_ERR_INVALID_POINTER, "pointer_info");
  assert_status(gca_free((char *)p + 512), GCA_ERR_INVALID_POINTER, "not live");
  check();
  gca_stats_t after = stats();
  assert_all_stats_equal(&before, &after);
  assert_int_equal(fc_count(), 1);
  void *q = alloc_on(4096, NULL); /* still served from the cache */
  assert_ptr_equal(q, p);
  free_ok(q);
}

/* Only plain frees are cached: not with recorded streams, not in a private
 * pool, not while garbage collection or caching-off is in force; turning
 * caching off or emptying the cache flushes. */
static void only_plain_frees_are_cached(void **state) {
  (void)state;
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(8192, NULL);
  assert_ok(gca_record_stream(p, s2));
  free_ok(p);
  assert_int_equal(fc_count(), 0);
  assert_ok(gca_stream_synchronize(s2));

  gca_pool_t *pool;
  assert_ok(gca_pool_create(0, NULL, &pool));
  assert_ok(gca_pool_use_begin(pool));
  void *q = alloc_on(8192, NULL);
  assert_ok(gca_pool_use_end(pool));
  free_ok(q);
  assert_int_equal(fc_count(), 0);
  assert_ok(gca_pool_release(pool));

  void *r = alloc_on(8192, NULL);
  free_ok(r);
  assert_int_equal(fc_count(), 1);
  assert_ok(gca_empty_cache());
  assert_int_equal(fc_count(), 0);
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);

  r = alloc_on(8192, NULL);
  free_ok(r);
  assert_int_equal(fc_count(), 1);
  assert_ok(gca_set_caching(false));
  assert_int_equal(fc_count(), 0);
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  r = alloc_on(8192, NULL);
  free_ok(r);
  assert_int_equal(fc_count(), 0);
  assert_ok(gca_set_caching(true));

  assert_ok(gca_set_config("garbage_collection_threshold:0.5"));
  assert_ok(gca_set_memory_fraction(0, 0.5));
  r = alloc_on(8192, NULL);
  free_ok(r);
  assert_int_equal(fc_count(), 0);       /* block ages must be kept: no cache under GC */
  assert_ok(gca_set_memory_limit(0, 0)); /* no limit: no GC, frees are cached again */
  r = alloc_on(8192, NULL);
  free_ok(r);
  assert_int_equal(fc_count(), 1);
  assert_ok(gca_stream_destroy(s2));
}

/* The snapshot walk shows the layout PyTorch's rules leave (cached blocks
 * merged), and its free bytes add up to the statistics. */
static void snapshot_walk_shows_merged_layout(void **state) {
  (void)state;
  void *a = alloc_on(2048, NULL);
  void *b = alloc_on(2048, NULL);
  free_ok(b); /* cached, next to the free remainder */
  gca_stats_t s = stats();
  assert_int_equal(s.inactive_split[GCA_STAT_ALL].current, 1);
  layout_t l = layout();
  assert_int_equal(l.nblocks[0], 2); /* [a][b + remainder] */
  assert_int_equal(l.nfree[0], 1);
  assert_int_equal(fc_count(), 0);
  gca_stats_t s2 = stats();
  assert_all_stats_equal(&s, &s2);
  free_ok(a);
}

/* The key parses, prints back only when False, and a bad value is quoted. */
static void free_cache_key_parses(void **state) {
  (void)state;
  char buf[1024];
  assert_ok(gca_set_config("free_cache:False"));
  assert_ok(gca_get_config(buf, sizeof(buf)));
  assert_non_null(strstr(buf, "free_cache:False"));
  char off[1024];
  memcpy(off, buf, sizeof(off));
  assert_ok(gca_set_config("free_cache:True,recycle_bins:False"));
  assert_ok(gca_get_config(buf, sizeof(buf)));
  assert_non_null(strstr(buf, "free_cache:True,"));
  assert_ok(gca_set_config(off)); /* a formatted string restores the key */
  assert_ok(gca_get_config(buf, sizeof(buf)));
  assert_string_equal(buf, off);
  assert_status(gca_set_config("free_cache:sometimes"), GCA_ERR_CONFIG, "free_cache:sometimes");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(pair_reuses_block_with_exact_statistics, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(a_streak_of_pairs_is_counted_at_the_next_read, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(pairs_held_by_the_bias_take_the_leaf_hits, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(a_recorder_turned_on_stops_the_leaf_hits, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(lazy_puts_keep_every_statistic_exact, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(random_scripts_keep_statistics_exact, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(freeing_a_neighbour_merges_the_cached_block, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(a_miss_sees_cached_blocks_merged, fc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(the_cache_keeps_pytorch_placement, fc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(a_hit_needs_the_cached_run_to_be_the_best_fit, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(random_scripts_place_every_block_as_pytorch, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(a_device_whose_puts_go_unused_stops_caching, fc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(cached_pointer_is_not_live, fc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(only_plain_frees_are_cached, fc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(snapshot_walk_shows_merged_layout, fc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(free_cache_key_parses, fc_setup, alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
