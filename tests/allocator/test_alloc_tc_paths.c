/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_tc_paths.c - the thread caches' and the device lock's paths
 * without atomic read-modify-writes, and the parking of a cache that wastes
 * its blocks (Note [Thread cache sections], Note [Biased device lock], Note
 * [Thread cache waste]): a calm owner turns quiet and a visit ends it, a
 * visitor waits for a section held open for it, folds racing quiet sections
 * read one instant, a second thread revokes the device lock's bias, and a
 * wasting cache is parked and tried again with backoff, its thread's pairs
 * then served by the recycle bins' leaf paths. The statistics are
 * exact throughout. Run with and without GCA_NO_MEMBARRIER=1 (meson.build):
 * without the fences, every path keeps its lock and the tests check that. */
#include <inttypes.h>
#include <sched.h>
#include <stdlib.h>

#include "alloc_fixture.h"
#include "recycle.h"
#include "tc_workers.h"

/* Whether tc is one of d's thread caches now. */
static bool linked(const gca__tcache_t *tc) {
  for (gca__tcache_t *x = gca__devalloc_peek(0)->tcs; x != NULL; x = x->next)
    if (x == tc)
      return true;
  return false;
}

/* Note [Thread cache waste]: a worker alternating 4 KiB and 12 KiB carved
 * from one run loses each cached block unused (the next request splits the
 * run beside it); after GCA__TC_WASTE_OFF such losses its next free parks
 * its cache (the other worker's is untouched), and its frees go the way of
 * a thread without one. Once the worker repeats one size, the probe after
 * GCA__TC_PROBE frees gives it its cache back, and the hits keep it. With
 * the other worker gone no cache is left and the statistics are plain. The
 * statistics stay exact throughout. */
static void a_cache_that_wastes_its_blocks_is_parked(void **state) {
  (void)state;
  worker_t a, b;
  engaged_workers(&a, &b);
  gca__tcache_t *tc = cache_of_worker(&a);
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_int_equal(d->ntcs, 2);
  for (int i = 0; i < 4 * GCA__TC_WASTE_OFF; i++)
    w_free(&a, w_alloc(&a, i & 1 ? 12288 : 4096, a.stream));
  assert_false(linked(tc)); /* parked */
  assert_int_equal(d->ntcs, 1);
  assert_int_equal(tcaches_cached(), 1); /* b's */
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
  for (int i = 0; i < GCA__TC_PROBE / 2; i++) /* no cache yet: the probe is further */
    w_free(&a, w_alloc(&a, 4096, a.stream));
  assert_int_equal(d->ntcs, 1);
  for (int i = 0; i < 2 * GCA__TC_PROBE; i++)
    w_free(&a, w_alloc(&a, 4096, a.stream));
  assert_int_equal(d->ntcs, 2);
  assert_true(linked(tc)); /* the parked one, taken back */
  assert_int_equal(tc->waste, 0);
  assert_int_equal(tc->ncached, 1);
  gca_stats_t s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 0);
  check();
  for (int i = 0; i < 4 * GCA__TC_WASTE_OFF; i++) /* parked again */
    w_free(&a, w_alloc(&a, i & 1 ? 12288 : 4096, a.stream));
  assert_false(linked(tc));
  /* the pattern goes on: each try loses its first block, and the next waits
   * twice as long (256, 512, ... frees), so 8,192 frees see about five
   * tries, not 32 */
  int64_t parks = stats().num_cache_parks;
  assert_int_equal(parks, 2);
  a.alt = 12288;
  w_pairs(&a, 4096, 32 * GCA__TC_PROBE);
  a.alt = 0;
  parks = stats().num_cache_parks - parks;
  assert_int_equal(parks, 5); /* tries at 256, 512, 1,024, 2,048 and 4,096 frees */
  worker_exit(&b);
  assert_null(d->tcs);
  assert_false(d->tc_count); /* no headroom to count: plain statistics */
  w_free(&a, w_alloc(&a, 12288, a.stream));
  s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].peak, 12288);
  assert_int_equal(s.num_cache_parks, 2 + parks);
  assert_ok(gca_reset_accumulated_stats(0));
  assert_int_equal(stats().num_cache_parks, 0);
  check();
  worker_exit(&a);
  assert_ok(gca_stream_destroy(a.stream));
  assert_ok(gca_stream_destroy(b.stream));
}

/* gca__allocator_reset makes every device's allocator again: a thread
 * whose cache was parked on the old one is not parked on the new one (the
 * parking names the allocator), so its first free there enters a cache.
 * Before, it skipped its frees on the new one for what was left of its
 * probe (256 frees). */
static void a_reset_forgets_a_parked_thread(void **state) {
  (void)state;
  worker_t a, b;
  engaged_workers(&a, &b);
  for (int i = 0; i < 4 * GCA__TC_WASTE_OFF; i++) /* parks a's cache (above) */
    w_free(&a, w_alloc(&a, i & 1 ? 12288 : 4096, a.stream));
  assert_int_equal(stats().num_cache_parks, 1);
  assert_nothing_leaked();
  gca__allocator_reset();
  assert_ok(gca_set_config("recycle_bins:False"));
  engage(&a, &b);
  cache_of_worker(&a); /* a's free entered a's cache */
  assert_int_equal(stats().num_cache_parks, 0);
  check();
  workers_done(&a, &b);
}

/* Worker a alone with the recycle bins on: b engaged the caches with it and
 * is gone (its cache's block back in its segment, then whole and free). */
static gca__devalloc_t *lone_worker(worker_t *a, worker_t *b) {
  assert_ok(gca_set_config("recycle_bins:True"));
  engaged_workers(a, b);
  worker_exit(b);
  return gca__devalloc_peek(0);
}
/* a's thread and both streams gone. */
static void lone_worker_done(worker_t *a, worker_t *b) {
  worker_exit(a);
  assert_ok(gca_stream_destroy(a->stream));
  assert_ok(gca_stream_destroy(b->stream));
}

/* Note [Thread cache runs]: with the recycle bins on (the default) a block
 * of a thread cache counts as a free run of its own, so a free next to
 * another block of the cache enters it too: a worker alternating 4 KiB and
 * 12 KiB carved from one run keeps both cached, and once warm its pairs take
 * no device lock (the lock's last holder stays the test's thread), no cache
 * is parked and the bins hold nothing. The walker recounts each cached
 * block as an inactive split block of its own. (With the bins off the same
 * pattern parks the cache: above.) */
static void alternating_sizes_stay_cached_with_the_bins_on(void **state) {
  (void)state;
  worker_t a, b;
  gca__devalloc_t *d = lone_worker(&a, &b);
  int64_t parks = stats().num_cache_parks;
  a.alt = 12288;
  w_pairs(&a, 4096, 64);
  void *x = w_alloc(&a, 4096, a.stream);
  gca__tcache_t *tc = tcache_of(x);
  assert_non_null(tc);
  w_pairs(&a, 12288, 1); /* with the 4 KiB block handed out: its neighbour cached */
  assert_int_equal(tc->ncached - tc->hot_out, 1);
  gca_stats_t s = stats(); /* a fold: the 4 KiB block live, the 12 KiB cached alone */
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 4096);
  assert_int_equal(s.inactive_split[GCA_STAT_SMALL].current, 2); /* 12 KiB, and the rest */
  check();
  w_free(&a, x);
  gca__dev_lock(d);
  uint64_t me = gca__lock_me();
  gca__dev_unlock(d);
  w_pairs(&a, 4096, 4 * GCA__TC_PROBE);
  assert_true(d->lock.last == me); /* a took no device lock */
  a.alt = 0;
  assert_int_equal(stats().num_cache_parks, parks);
  assert_int_equal(d->rb_count, 0);
  assert_int_equal(tc->ncached - tc->hot_out, 2);
  s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].peak, 4096 + 12288); /* x and the other */
  assert_int_equal(s.inactive_split[GCA_STAT_SMALL].current, 3); /* each cached block alone */
  assert_int_equal(s.inactive_split_bytes[GCA_STAT_SMALL].current, 2 * (int64_t)MiB);
  check();
  lone_worker_done(&a, &b);
}

/* Note [Thread cache runs]: two blocks side by side in a worker's cache
 * (the bins on) count as two inactive split blocks beside the segment's
 * free rest; a change of setting sends them back to the tree, where they
 * merge into one free run: inactive_split falls by one, its bytes stay. */
static void cached_runs_merge_when_they_go_back(void **state) {
  (void)state;
  worker_t a, b;
  lone_worker(&a, &b);
  void *x = w_alloc(&a, 4096, a.stream), *y = w_alloc(&a, 8192, a.stream);
  void *z = w_alloc(&a, 4096, a.stream); /* keeps the rest apart */
  assert_ptr_equal((char *)y, (char *)x + 4096);
  w_free(&a, x);
  w_free(&a, y);
  gca__tcache_t *tc = tcache_of(x);
  assert_non_null(tc);
  assert_ptr_equal(tcache_of(y), tc);
  gca_stats_t s = stats();
  assert_int_equal(s.inactive_split[GCA_STAT_SMALL].current, 3); /* x, y, the rest */
  int64_t bytes = s.inactive_split_bytes[GCA_STAT_SMALL].current;
  assert_int_equal(bytes, 2 * (int64_t)MiB - 4096);
  check();
  assert_ok(gca_set_config("recycle_bins:True")); /* every cache flushed */
  assert_null(tcache_of(x));
  s = stats();
  assert_int_equal(s.inactive_split[GCA_STAT_SMALL].current, 2); /* x and y merged */
  assert_int_equal(s.inactive_split_bytes[GCA_STAT_SMALL].current, bytes);
  assert_int_equal(s.inactive_split[GCA_STAT_SMALL].peak, 3);
  check();
  w_free(&a, z);
  lone_worker_done(&a, &b);
}

/* Note [Thread cache waste]: a cache whose hits all take the locked way is
 * no use either. While history is recorded every operation takes the locked
 * path (the gate is shut), so a worker's pairs of one size find its block
 * in its cache only under the lock: such a hit counts as waste, the cache is
 * parked (and tried again ever more rarely) and the pairs take the paths
 * of a thread without one. The statistics stay exact. */
static void a_cache_that_only_hits_under_the_lock_is_parked(void **state) {
  (void)state;
  worker_t a, b;
  gca__devalloc_t *d = lone_worker(&a, &b);
  int64_t parks = stats().num_cache_parks;
  assert_ok(gca_record_history(true, 64, false));
  w_pairs(&a, 4096, 4 * GCA__TC_PROBE);
  int64_t first = stats().num_cache_parks - parks;
  print_message("parks after %d pairs: %" PRId64 "\n", 4 * GCA__TC_PROBE, first);
  assert_true(first >= 2);
  w_pairs(&a, 4096, 28 * GCA__TC_PROBE);
  int64_t all = stats().num_cache_parks - parks;
  assert_true(all > first && all <= first + 4); /* tries with backoff */
  assert_ok(gca_record_history(false, 0, false));
  assert_int_equal(d->ntcs, 0);
  gca_stats_t s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 0);
  check();
  lone_worker_done(&a, &b);
}

/* Note [Leaf hits]: a thread whose cache is parked is served by the bins'
 * leaf paths while the thread caches are on and another thread's cache
 * counts headroom. The test's thread alternates 4 KiB and 12 KiB with its
 * cache parked while worker b holds a block of its cache's domain;
 * then its pairs run with the device lock biased to it: none ends in a full
 * path's let-go (a bit of the gate that no path reads and only that let-go
 * clears stays set), the bins serve every one, and each free counts towards
 * the parked cache's next probe. Then the peaks are reset while b's block is
 * live, b frees it into its cache and a read turns that fall into b's
 * headroom: the peak is b's block, and a rise of 12 KiB with that headroom
 * held could be carried past it, so the leaf leaves it to the full path,
 * which folds; b's take of its block back then goes the locked way, and the
 * peak read after counts both blocks (a leaf's plain rise would have left it
 * at 12 KiB). A put whose rise in inactive_split such headroom could carry
 * past its peak is turned down the same way (forced: the headroom set). */
/* Pair i of the test's thread: 4 KiB, or 12 KiB for odd i. */
static void alternate(gca_stream_t s, long i) {
  void *p;
  assert_ok(gca_malloc(&p, i & 1 ? 12288 : 4096, s));
  assert_ok(gca_free(p));
}

/* Alternates until the thread's cache is parked with more than probe_left
 * frees to its next probe and the lock is biased to it; the pairs it took.
 * Its cache serves both sizes (Note [Thread cache runs]), so the loop parks
 * it as a wasting cache's next free would (gca__tc_park_mine). */
static long park_and_bias(gca__devalloc_t *d, gca_stream_t s, uint32_t probe_left) {
  long n = 0;
  for (; n < 200000; n++) {
    if (n % 2 == 0 && gca__tc_mine(0) != NULL) {
      gca__dev_lock(d);
      gca__tc_park_mine(d);
      gca__dev_unlock(d);
    }
    if (n % 2 == 0 && gca__tc_mine(0) == NULL && gca__t_tc != NULL &&
        gca__t_tc->probe[0] > probe_left && atomic_load(&d->lock.bias) == gca__lock_me())
      break;
    alternate(s, n);
  }
  return n;
}

static void a_parked_caches_pairs_take_the_bins_leaf_paths(void **state) {
  (void)state;
  enum { PAIRS = 100, SENTINEL = 0x80, HELD = 4096 };
  _Static_assert((SENTINEL & (GCA__GATE_FC | GCA__GATE_RB)) == 0, "a bit no path reads");
  assert_ok(gca_set_config("recycle_bins:True"));
  worker_t b;
  worker_start(&b);
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *p;
  assert_ok(gca_malloc(&p, 4096, s));
  assert_ok(gca_free(p));
  w_free(&b, w_alloc(&b, HELD, b.stream)); /* a second thread: the caches engage */
  w_pairs(&b, HELD, 64);
  void *held = w_alloc(&b, HELD, b.stream);
  assert_non_null(tcache_of(held)); /* handed out by b's cache: its free is b's fast put */
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_true(d->tc_on);
  if (gca__mutex_bias_after == UINT32_MAX) { /* no bias in this build or on this kernel */
    print_message("no biased lock: the full paths serve the parked thread\n");
    for (int i = 0; i < 2 * PAIRS; i++)
      alternate(s, i);
    assert_int_equal(stats().allocated_bytes[GCA_STAT_ALL].current, HELD);
    w_free(&b, held);
    assert_int_equal(stats().allocated_bytes[GCA_STAT_ALL].current, 0);
    check();
    goto out;
  }
  long n = park_and_bias(d, s, 2 * PAIRS + 2);
  print_message("parked and biased after %ld pairs\n", n);
  assert_true(n < 200000);
  assert_true(d->tc_count); /* b's cache counts headroom */
  assert_int_equal(d->fc_gate & GCA__GATE_RB, 0);
  uint64_t fast = d->rb->fast, hits = d->rb->hits;
  uint32_t probe = gca__t_tc->probe[0];
  d->fc_gate |= SENTINEL; /* the lock is biased to this thread, which holds nothing now */
  for (int i = 0; i < 2 * PAIRS; i++)
    alternate(s, i);
#ifndef GCA_DEBUG_CHECKS /* there every operation takes the full path */
  assert_true(d->fc_gate & SENTINEL);
  assert_int_equal(d->rb->fast, fast + 2 * PAIRS);
  assert_int_equal(d->rb->hits, hits + 2 * PAIRS);
  assert_int_equal(gca__t_tc->probe[0], probe - 2 * PAIRS);
#else
  (void)fast, (void)hits, (void)probe;
#endif
  gca_stats_t st = stats();
  assert_int_equal(st.allocation[GCA_STAT_ALL].current, 1);
  assert_int_equal(st.allocated_bytes[GCA_STAT_ALL].current, HELD);
  assert_int_equal(st.allocated_bytes[GCA_STAT_ALL].peak, HELD + 12288);
  /* the peak is b's block; its fall becomes b's headroom. The reset took
   * back the room for inactive_split that b's put of its block needs (Note
   * [Thread cache runs]): that put takes the locked way, and so does b's
   * next take, which gives the room back; the put after it is fast */
  assert_ok(gca_reset_peak_stats(0));
  w_free(&b, held);
  held = w_alloc(&b, HELD, b.stream);
  for (uint32_t i = 0; i <= gca__mutex_bias_after && atomic_load(&d->lock.bias) != gca__lock_me();
       i++) { /* b's locked paths revoked the bias: this thread takes it back */
    gca__dev_lock(d);
    gca__dev_unlock(d);
  }
  assert_true(atomic_load(&d->lock.bias) == gca__lock_me());
  w_free(&b, held);
  assert_true(atomic_load(&d->lock.bias) == gca__lock_me()); /* b's put took no lock */
  st = stats();
  assert_int_equal(st.allocated_bytes[GCA_STAT_ALL].peak, HELD);
  int esc = gca__stat_index(d, d->stats.allocated_bytes) + GCA_STAT_ALL;
  assert_true(d->tc_esc[esc] >= HELD);
  d->fc_gate |= SENTINEL;
  assert_ok(gca_malloc(&p, 12288, s));
#ifndef GCA_DEBUG_CHECKS
  assert_false(d->fc_gate & SENTINEL); /* the leaf stepped aside */
#endif
  held = w_alloc(&b, HELD, b.stream);
  w_free(&b, held);
  assert_ok(gca_free(p));
  st = stats();
  assert_int_equal(st.allocated_bytes[GCA_STAT_ALL].peak, 12288 + HELD);
  assert_int_equal(st.allocation[GCA_STAT_ALL].peak, 2);
  assert_int_equal(st.allocation[GCA_STAT_ALL].current, 0);
#ifndef GCA_DEBUG_CHECKS
  /* the put's check, forced: headroom for inactive_split up to its peak
   * turns the leaf's put of a block of the bins' down; without it, the put */
  assert_ok(gca_malloc(&p, 4096, s));
  gca__dev_lock(d);
  gca_stat_t *split = &d->stats.inactive_split[GCA_STAT_SMALL];
  int at = gca__stat_index(d, d->stats.inactive_split) + GCA_STAT_SMALL;
  int64_t saved = d->tc_esc[at];
  d->tc_esc[at] = split->peak - split->current;
  bool refused = !gca__rb_leaf_put(d, (gca_devptr_t)(uintptr_t)p, d->tc_count);
  d->tc_esc[at] = saved;
  bool put = refused && gca__rb_leaf_put(d, (gca_devptr_t)(uintptr_t)p, d->tc_count);
  gca__dev_unlock(d); /* before any assertion: a failed one must not leave it held */
  assert_true(refused);
  assert_true(put);
#endif
  check();
out:
  worker_exit(&b);
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(b.stream));
}

/* ---- sections (Note [Thread cache sections]) ---- */

/* An owner whose cache nobody visits for GCA__TC_CALM fast paths enters it
 * without the lock from then on (its calm count stops moving); a read of
 * the statistics (a fold, a visitor) puts it back on the lock, and the
 * count starts again. The statistics are exact throughout. In a build
 * without sections (a thread sanitizer's, or no membarrier) no cache ever
 * turns quiet. */
static void a_calm_owner_enters_without_the_lock_until_a_visit(void **state) {
  (void)state;
  worker_t a, b;
  engaged_workers(&a, &b);
  gca__tcache_t *tc = cache_of_worker(&a);
  int64_t before = stats().allocation[GCA_STAT_ALL].allocated;
  w_pairs(&a, 4096, GCA__TC_CALM + 8);
  if (gca__tc_calm_limit == UINT32_MAX) {
    print_message("no sections in this build or on this kernel: the lock throughout\n");
    assert_int_equal(atomic_load(&tc->quiet), 0);
    assert_int_equal(tc->calm, 2 * (GCA__TC_CALM + 8) + 2); /* two paths a pair */
  } else {
    assert_int_equal(gca__tc_calm_limit, GCA__TC_CALM);
    assert_int_equal(atomic_load(&tc->quiet), 1);
    assert_int_equal(tc->calm, GCA__TC_CALM); /* the paths after it were sections */
    w_pairs(&a, 4096, 100);
    assert_int_equal(tc->calm, GCA__TC_CALM);
    assert_int_equal(atomic_load(&tc->active), 0);
    assert_int_equal(atomic_load(&tc->lock), 0);
  }
  uint32_t calm = tc->calm;
  gca_stats_t s = stats(); /* a visit */
  bool sections = gca__tc_calm_limit != UINT32_MAX;
  assert_int_equal(atomic_load(&tc->quiet), GCA__TC_LOUD);
  assert_int_equal(tc->calm, sections ? 0 : calm); /* without sections a visit changes nothing */
  assert_int_equal(s.num_cache_fences, sections ? 1 : 0);
  int64_t pairs = sections ? GCA__TC_CALM + 8 + 100 : GCA__TC_CALM + 8;
  assert_int_equal(s.allocation[GCA_STAT_ALL].allocated - before, pairs);
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.allocation[GCA_STAT_ALL].peak, 1);
  assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 0);
  w_pairs(&a, 4096, 10);
  assert_int_equal(tc->calm, (sections ? 0 : calm) + 20); /* on the lock again */
  check();
  workers_done(&a, &b);
}

typedef struct visit {
  gca_stats_t st;
  gca_status_t rc;
  atomic_bool done;
} visit_t;

static void *visit_main(void *arg) {
  visit_t *v = arg;
  v->rc = gca_get_stats(0, &v->st);
  atomic_store(&v->done, true);
  return NULL;
}

/* A visitor that finds the owner inside a section (here the test's thread
 * holds the section open for it) marks the cache blocked, fences and waits
 * until the section ends; meanwhile the owner's entry misses. After it the
 * cache is on the lock again, and the statistics read are exact. */
static void a_visitor_waits_for_a_quiet_owners_section(void **state) {
  (void)state;
  if (gca__tc_calm_limit == UINT32_MAX) {
    print_message("no sections in this build or on this kernel: nothing to wait for\n");
    skip();
  }
  worker_t a, b;
  engaged_workers(&a, &b);
  gca__tcache_t *tc = cache_of_worker(&a);
  w_pairs(&a, 4096, GCA__TC_CALM);
  assert_int_equal(atomic_load(&tc->quiet), 1);
  void *x = w_alloc(&a, 4096, a.stream); /* handed out by a section */
  atomic_store(&tc->active, 1);          /* as a's next path would, inside its section */
  visit_t v = {0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, visit_main, &v), 0);
  while (atomic_load(&tc->quiet) != GCA__TC_BLOCKED) /* the gate: the visitor marked it */
    sched_yield();
  assert_false(atomic_load(&v.done)); /* it cannot pass the open section */
  /* an entry now finds the cache blocked and misses (the visitor holds the
   * lock); the section held open for the visitor then ends */
  assert_int_equal(gca__tc_enter(tc), GCA__TC_OUT);
  assert_int_equal(atomic_load(&tc->active), 1);
  gca__tc_exit(tc, GCA__TC_SECTION);
  pthread_join(th, NULL);
  assert_ok(v.rc);
  assert_int_equal(v.st.allocation[GCA_STAT_ALL].current, 1);
  assert_int_equal(v.st.allocated_bytes[GCA_STAT_ALL].current, 4096);
  assert_int_equal(v.st.requested_bytes[GCA_STAT_ALL].current, 4096);
  assert_int_equal(atomic_load(&tc->quiet), GCA__TC_LOUD);
  assert_int_equal(atomic_load(&tc->lock), 0);
  w_free(&a, x); /* back by the lock */
  assert_int_equal(tc->calm, 1);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
  check();
  workers_done(&a, &b);
}

/* Folds while an owner runs pairs in and out of quiet sections (the calm
 * limit lowered to 16 so that it turns quiet again between folds): every
 * read sees one instant (at most its one block live, bytes and requested
 * bytes agreeing, allocated less freed the current, the peak not passed),
 * and the totals are exact at the end. */
static void folds_against_sections_read_one_instant(void **state) {
  (void)state;
  uint32_t saved = gca__tc_calm_limit;
  if (saved != UINT32_MAX)
    gca__tc_calm_limit = 16;
  worker_t a, b;
  engaged_workers(&a, &b);
  int64_t before = stats().allocation[GCA_STAT_ALL].allocated;
  a.size = 4096;
  a.on = a.stream;
  a.pairs = 0;
  cmd_post(&a, CMD_PAIRS);
  for (int i = 0; i < 2000; i++) {
    /* the gate: enough pairs since the last fold for the cache to turn quiet */
    for (long last = atomic_load(&a.pairs_done); atomic_load(&a.pairs_done) < last + 9;)
      sched_yield();
    gca_stats_t s = stats();
    int64_t n = s.allocation[GCA_STAT_ALL].current;
    assert_true(n == 0 || n == 1);
    assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 4096 * n);
    assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 4096 * n);
    assert_int_equal(s.active_bytes[GCA_STAT_ALL].current, 4096 * n);
    assert_int_equal(s.allocation[GCA_STAT_ALL].peak, 1);
    for (int k = 0; k < GCA_STAT_TYPES; k++) {
      assert_int_equal(s.allocation[k].allocated - s.allocation[k].freed, s.allocation[k].current);
      assert_int_equal(s.allocated_bytes[k].allocated - s.allocated_bytes[k].freed,
                       s.allocated_bytes[k].current);
    }
  }
  atomic_store(&a.stop, true);
  assert_ok(cmd_wait(&a));
  gca__tc_calm_limit = saved;
  gca_stats_t s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].allocated - before, atomic_load(&a.pairs_done));
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  check();
  workers_done(&a, &b);
}

/* ---- streaks (Note [Thread cache streaks]) ---- */

/* Checks the usage statistics against an eager count: `live` blocks of 4 KiB
 * (requested 4096 each) out, `allocs` allocations since `base`. */
static void expect_usage(const gca_stats_t *base, int64_t live, int64_t allocs) {
  gca_stats_t s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, live);
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 4096 * live);
  assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 4096 * live);
  assert_int_equal(s.allocation[GCA_STAT_ALL].allocated - base->allocation[GCA_STAT_ALL].allocated,
                   allocs);
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].allocated -
                       base->allocated_bytes[GCA_STAT_ALL].allocated,
                   4096 * allocs);
  assert_int_equal(s.requested_bytes[GCA_STAT_ALL].freed -
                       base->requested_bytes[GCA_STAT_ALL].freed,
                   4096 * (allocs - live));
  for (int k = 0; k < GCA_STAT_TYPES; k++)
    assert_int_equal(s.allocation[k].allocated - s.allocation[k].freed, s.allocation[k].current);
}

/* An owner repeating pairs of one block owes their moves: the pairs' rises
 * wait in the cache, and a block it took is out with its take owed (and its
 * place in the cache's counts of blocks and bytes). A read
 * settles both (the cache is visited), as does a free that goes the locked
 * way while the block is out (history recording closes the fast paths), and
 * an eviction. Each time the statistics equal an eager count. */
static void a_streak_owes_its_moves_until_a_visit(void **state) {
  (void)state;
  worker_t a, b;
  engaged_workers(&a, &b);
  gca__tcache_t *tc = cache_of_worker(&a);
  gca_stats_t base = stats();
  w_pairs(&a, 4096, 100);
  assert_non_null(atomic_load(&tc->hot));
  assert_false(tc->hot_out);
  assert_int_equal(tc->hot_pairs, 99); /* the first pair's put started the streak */
  expect_usage(&base, 0, 100);         /* a visit: settled */
  assert_null(atomic_load(&tc->hot));
  w_pairs(&a, 4096, 10);
  size_t ncached = tc->ncached, cached_bytes = tc->cached_bytes;
  void *x = w_alloc(&a, 4096, a.stream); /* out, its take owed */
  assert_true(tc->hot_out);
  assert_int_equal(tc->hot_pairs, 9);
  assert_int_equal(tc->ncached, ncached); /* still counted while out: owed */
  assert_int_equal(tc->cached_bytes, cached_bytes);
  expect_usage(&base, 1, 111);
  assert_null(atomic_load(&tc->hot));
  assert_int_equal(tc->ncached, ncached - 1); /* the visit settled the counts */
  assert_int_equal(tc->cached_bytes, cached_bytes - 4096);
  w_free(&a, x); /* a plain put, which starts a streak again */
  w_pairs(&a, 4096, 5);
  x = w_alloc(&a, 4096, a.stream);
  assert_true(tc->hot_out);
  assert_ok(gca_record_history(true, 64, false)); /* the fast paths close */
  w_free(&a, x);                                  /* the locked way: it settles first */
  assert_ok(gca_record_history(false, 0, false));
  assert_null(atomic_load(&tc->hot));
  expect_usage(&base, 0, 117);
  w_pairs(&a, 4096, 5);
  assert_non_null(atomic_load(&tc->hot));
  assert_ok(gca_empty_cache()); /* evicts every cached block: settled first */
  assert_null(atomic_load(&tc->hot));
  expect_usage(&base, 0, 122);
  check();
  workers_done(&a, &b);
}

static bool accept_every_stream(gca_stream_t stream, void *ctx) {
  (void)stream;
  (void)ctx;
  return true;
}

/* Note [Leaf gate]: a route to a private pool, begun by another thread while
 * a worker's pairs run a streak in its cache, closes the thread caches' gate
 * before gca_pool_begin_allocate returns: the worker's next allocation comes
 * from the pool, not from its streak. When the route ends the streak's block
 * is served again. */
static void a_route_begun_elsewhere_closes_the_streak(void **state) {
  (void)state;
  worker_t a, b;
  engaged_workers(&a, &b);
  gca__tcache_t *tc = cache_of_worker(&a);
  w_pairs(&a, 4096, 50);
  assert_non_null(atomic_load(&tc->hot));
  void *streak = (void *)(uintptr_t)atomic_load(&tc->hot)->addr;
  gca_pool_t *pool;
  assert_ok(gca_pool_create(0, NULL, &pool));
  assert_ok(gca_pool_begin_allocate(pool, accept_every_stream, NULL));
  assert_int_not_equal(atomic_load(&gca__devalloc_peek(0)->tc_gate), 0);
  void *x = w_alloc(&a, 4096, a.stream);
  assert_ptr_not_equal(x, streak);
  size_t reserved = 0, allocated = 0;
  assert_ok(gca_pool_memory(pool, &reserved, &allocated));
  assert_int_equal(allocated, 4096);
  w_free(&a, x);
  assert_ok(gca_pool_end_allocate(pool));
  assert_ok(gca_pool_release(pool));
  assert_ptr_equal(x = w_alloc(&a, 4096, a.stream), streak);
  w_free(&a, x);
  check();
  workers_done(&a, &b);
}

/* Note [Biased device lock]: the test's thread, using the device alone,
 * gets its lock biased to it; a worker's first request revokes the bias
 * (counted in num_lock_revocations), and both threads' pairs go on with the
 * statistics exact. Without membarrier nothing is biased or counted. */
static void a_second_thread_revokes_the_device_locks_bias(void **state) {
  (void)state;
  bool biasing = gca__mutex_bias_after != UINT32_MAX;
  for (int i = 0; i <= GCA__MUTEX_BIAS_AFTER; i++) {
    void *p = NULL;
    assert_ok(gca_malloc(&p, 4096, NULL));
    assert_ok(gca_free(p));
  }
  gca__devalloc_t *d = gca__devalloc_peek(0); /* made by the first request */
  assert_int_equal(atomic_load(&d->lock.bias), biasing ? gca__lock_me() : GCA__MUTEX_NO_BIAS);
  worker_t a;
  worker_start(&a);
  w_free(&a, w_alloc(&a, 4096, a.stream));
  assert_true(atomic_load(&d->lock.bias) == GCA__MUTEX_NO_BIAS);
  gca_stats_t s = stats();
  assert_int_equal(s.num_lock_revocations, biasing ? 1 : 0);
  assert_int_equal(s.allocation[GCA_STAT_ALL].allocated, GCA__MUTEX_BIAS_AFTER + 2);
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_ok(gca_reset_accumulated_stats(0));
  assert_int_equal(stats().num_lock_revocations, 0);
  check();
  worker_exit(&a);
  assert_ok(gca_stream_destroy(a.stream));
}

/* Whether p's pointer-map slot lies past the slot of one of the n blocks
 * of q that a thread cache holds cached, on p's probe path from its home:
 * taking that one out of the map moves p's entry back. */
static bool probes_past_a_cached_one(gca__devalloc_t *d, void *p, void **q, int n) {
  const gca__ptrmap_t *m = &d->ptrs;
  uint32_t mask = m->cap - 1,
           pos = (uint32_t)(gca__ptrmap_slot(m, (gca_devptr_t)(uintptr_t)p) - m->slots);
  uint32_t home = (uint32_t)gca__ptrmap_hash((gca_devptr_t)(uintptr_t)p) & mask;
  for (int i = 0; i < n; i++) {
    gca__ptrslot_t *f = gca__ptrmap_slot(m, (gca_devptr_t)(uintptr_t)q[i]);
    if (f == NULL || f->val->tc == NULL)
      continue;
    uint32_t at = (uint32_t)(f - m->slots);
    if (((at - home) & mask) < ((pos - home) & mask))
      return true;
  }
  return false;
}

/* Note [Free facts]: a free put into a recycle bin from its pointer-map
 * slot's facts may be the one that parks its thread's cache
 * (gca__tc_declines): the cache's blocks go back to the tree and out of the
 * pointer map, whose deletions move slots, and the put finds its block's
 * slot again. The bins on here (recycle_bins:True). */
static void a_free_from_the_facts_parks_its_threads_cache(void **state) {
  (void)state;
  assert_ok(gca_set_config("recycle_bins:True"));
  worker_t a, b;
  engaged_workers(&a, &b);
  enum { N = 64 };
  static void *c[N], *sp[2 * N];
  for (int i = 0; i < N; i++) { /* two spacers apart: no cached block near another */
    c[i] = w_alloc(&a, 512 * (size_t)(1 + i % 8), a.stream);
    sp[2 * i] = w_alloc(&a, 512, a.stream);
    sp[2 * i + 1] = w_alloc(&a, 512, a.stream);
  }
  for (int i = 0; i < N; i++)
    w_free(&a, c[i]);
  gca__tcache_t *tc = cache_of_worker(&a);
  assert_true(atomic_load(&tc->ncached) >= N / 2);
  gca__devalloc_t *d = gca__devalloc_peek(0);
  w_free(&a, sp[0]); /* next to c[0], cached: binned, a's stream owns its group */
  assert_int_equal(d->rb_count, 1);
  /* x: a block whose home slot holds a cached block's entry. Taken out of
   * the map and put back, it lands past that entry, so the park's taking
   * that entry out moves x's. Candidates of sizes the cache does not hold,
   * of irregular sizes, until one does: the hash spreads evenly spaced
   * addresses so well that their homes seldom meet (the cached entries fill
   * a sixteenth of the map or more, so a candidate meets one about one time
   * in sixteen; a thousand without one is beyond any odds). The workers
   * wait at their gates meanwhile. */
  enum { NC = 1000 };
  static void *cand[NC];
  uint32_t r = 20261126;
  int ncand = 0;
  void *x = NULL;
  const gca__ptrmap_t *m = &d->ptrs;
  while (x == NULL && ncand < NC) { /* until one meets a cached entry */
    r = r * 1103515245u + 12345u;
    void *p = cand[ncand++] = w_alloc(&a, 512 * (size_t)(9 + (r >> 16) % 8), a.stream);
    gca__ptrslot_t *at =
        &m->slots[(uint32_t)gca__ptrmap_hash((gca_devptr_t)(uintptr_t)p) & (m->cap - 1)];
    if (at->key != 0 && at->val->tc != NULL)
      x = p;
  }
  assert_non_null(x);
  gca__dev_lock(d);
  gca__block_t *xb = gca__ptrmap_take(&d->ptrs, (gca_devptr_t)(uintptr_t)x);
  assert_ok(gca__ptrmap_insert(&d->ptrs, xb->addr, xb));
  gca__pf_note(d, xb);
  d->rb->last = NULL; /* x was the last request's block: its free would try the free cache */
  gca__dev_unlock(d);
  assert_true(probes_past_a_cached_one(d, x, c, N));
  gca__ptrslot_t *e = gca__ptrmap_slot(&d->ptrs, (gca_devptr_t)(uintptr_t)x);
  assert_non_null(e);
  assert_true(gca__pf_hold(d, e));
  tc->waste = GCA__TC_WASTE_OFF; /* a's next free parks it */
  int64_t parks = stats().num_cache_parks;
  uint64_t fast = d->rb->fast;
  w_free(&a, x);
  assert_int_equal(stats().num_cache_parks, parks + 1);
  assert_int_equal(d->rb->fast, fast + 1);
  assert_int_equal(d->rb_count, 2);
  check();
  for (int i = 1; i < 2 * N; i++)
    w_free(&a, sp[i]);
  for (int k = 0; k < ncand; k++)
    if (cand[k] != x)
      w_free(&a, cand[k]);
  workers_done(&a, &b);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, tc_setup, alloc_teardown)
  const struct CMUnitTest tests[] = {
      T(a_cache_that_wastes_its_blocks_is_parked),
      T(a_reset_forgets_a_parked_thread),
      T(alternating_sizes_stay_cached_with_the_bins_on),
      T(cached_runs_merge_when_they_go_back),
      T(a_cache_that_only_hits_under_the_lock_is_parked),
      T(a_parked_caches_pairs_take_the_bins_leaf_paths),
      T(a_calm_owner_enters_without_the_lock_until_a_visit),
      T(a_visitor_waits_for_a_quiet_owners_section),
      T(a_streak_owes_its_moves_until_a_visit),
      T(a_route_begun_elsewhere_closes_the_streak),
      T(folds_against_sections_read_one_instant),
      T(a_second_thread_revokes_the_device_locks_bias),
      T(a_free_from_the_facts_parks_its_threads_cache),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
