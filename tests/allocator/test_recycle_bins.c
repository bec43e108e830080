/* SPDX-License-Identifier: Apache-2.0 */
/* test_recycle_bins.c - the recycle bins (Note [Recycle bins], recycle.c):
 * with recycle_bins:True a plain free of a small block waits in the bin of
 * its (stream, size) and the next request of that size takes it back; the
 * statistics follow the layout at every step (checked against an eager
 * model and by the walker), bins never cost a segment, a binned pointer is
 * not live, and every release path, walk and change of setting returns them
 * to the free tree. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "alloc_fixture.h"
#include "recycle.h"
#include "tcache.h"

static size_t rb_count(void) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  return d != NULL ? d->rb_count : 0;
}

/* Note [Free facts]: p's pointer-map slot, and whether its facts hold. */
static gca__ptrslot_t *slot_of(const void *p) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  gca__ptrslot_t *e = gca__ptrmap_slot(&d->ptrs, (gca_devptr_t)(uintptr_t)p);
  assert_non_null(e);
  return e;
}
static bool facts_hold(const void *p) {
  return gca__pf_hold(gca__devalloc_peek(0), slot_of(p));
}
static uint64_t rb_fast(void) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  return d != NULL && d->rb != NULL ? d->rb->fast : 0;
}

/* The default settings, spelt out: the free cache with its bins. A free of
 * the block the last request got tries the free cache's slot first, so the
 * tests below allocate one more block after those they free. */
static void bins_on(void) {
  assert_ok(gca_set_config("free_cache:True,recycle_bins:True"));
}

/* A fresh allocator with settings conf, once nothing is left of the last
 * one (a test that runs several rounds). */
static void fresh(const char *conf) {
  assert_nothing_leaked();
  gca__allocator_reset();
  assert_ok(gca_set_config(conf));
}

/* A segment's worth of 1 KiB blocks on stream s: n of them, addresses in
 * order. */
static void fill(void **v, size_t n, gca_stream_t s) {
  for (size_t i = 0; i < n; i++) {
    assert_ok(gca_malloc(&v[i], 1 * KiB, s));
    if (i > 0)
      assert_ptr_equal((char *)v[i - 1] + KiB, v[i]);
  }
  check();
}

/* A free enters its bin: it stops counting as allocated and counts as an
 * inactive split block of its own; the next request of its rounded size
 * gets that very block back, with every statistic as before but the counts
 * of allocations and frees. Its free neighbour stays unmerged meanwhile. */
static void a_binned_block_is_reused_with_the_statistics_of_the_layout(void **state) {
  (void)state;
  bins_on();
  void *a = alloc_on(1 * KiB, NULL), *b = alloc_on(1000, NULL), *c = alloc_on(1 * KiB, NULL);
  void *edge = alloc_on(512, NULL);
  gca_stats_t s0 = stats();
  free_ok(b);
  assert_int_equal(rb_count(), 1);
  gca_stats_t s1 = stats();
  assert_int_equal(s1.allocation[GCA_STAT_ALL].current, s0.allocation[GCA_STAT_ALL].current - 1);
  assert_int_equal(s1.allocated_bytes[GCA_STAT_SMALL].current,
                   s0.allocated_bytes[GCA_STAT_SMALL].current - (int64_t)KiB);
  assert_int_equal(s1.requested_bytes[GCA_STAT_ALL].current,
                   s0.requested_bytes[GCA_STAT_ALL].current - 1000);
  assert_int_equal(s1.active[GCA_STAT_ALL].current, s0.active[GCA_STAT_ALL].current - 1);
  assert_int_equal(s1.inactive_split[GCA_STAT_ALL].current,
                   s0.inactive_split[GCA_STAT_ALL].current + 1);
  assert_int_equal(s1.inactive_split_bytes[GCA_STAT_SMALL].current,
                   s0.inactive_split_bytes[GCA_STAT_SMALL].current + (int64_t)KiB);
  /* c's free lands beside the binned b: c is binned too, neither merges */
  free_ok(c);
  assert_int_equal(rb_count(), 2);
  assert_int_equal(stats().inactive_split[GCA_STAT_ALL].current,
                   s0.inactive_split[GCA_STAT_ALL].current + 2);
  void *b2 = alloc_on(600, NULL); /* rounds to 1 KiB: the last one freed, c */
  assert_ptr_equal(b2, c);
  void *c2 = alloc_on(1 * KiB, NULL);
  assert_ptr_equal(c2, b);
  assert_int_equal(rb_count(), 0);
  gca_stats_t s2 = stats();
  assert_int_equal(s2.allocation[GCA_STAT_ALL].current, s0.allocation[GCA_STAT_ALL].current);
  assert_int_equal(s2.allocation[GCA_STAT_ALL].allocated,
                   s0.allocation[GCA_STAT_ALL].allocated + 2);
  assert_int_equal(s2.allocation[GCA_STAT_ALL].freed, s0.allocation[GCA_STAT_ALL].freed + 2);
  assert_int_equal(s2.inactive_split[GCA_STAT_ALL].current,
                   s0.inactive_split[GCA_STAT_ALL].current);
  assert_int_equal(s2.inactive_split[GCA_STAT_ALL].peak, s0.inactive_split[GCA_STAT_ALL].peak + 2);
  assert_int_equal(s2.requested_bytes[GCA_STAT_ALL].current,
                   s0.requested_bytes[GCA_STAT_ALL].current - 1000 + 600);
  assert_int_equal(s2.num_device_alloc, s0.num_device_alloc);
  free_ok(a);
  free_ok(b2);
  free_ok(c2);
  free_ok(edge);
}

/* A bin holds GCA__RB_BIN_MAX blocks; the next free of its size merges into
 * the tree as PyTorch's would. A request that the tree cannot serve takes
 * the bins of its stream back first, merged, and is served from them: no
 * new segment. */
static void bins_never_cost_a_segment(void **state) {
  (void)state;
  bins_on();
  enum { N = 2048 }; /* one 2 MiB segment of 1 KiB blocks */
  static void *v[N];
  fill(v, N, NULL);
  assert_int_equal(stats().segment[GCA_STAT_ALL].current, 1);
  for (size_t i = 100; i < 100 + GCA__RB_BIN_MAX + 1; i++)
    free_ok(v[i]);
  assert_int_equal(rb_count(), GCA__RB_BIN_MAX); /* the last free went to the tree */
  gca_stats_t s0 = stats();
  assert_int_equal(s0.inactive_split[GCA_STAT_ALL].current, GCA__RB_BIN_MAX + 1);
  void *big = alloc_on(64 * KiB, NULL);
  assert_ptr_equal(big, v[100]);
  gca_stats_t s1 = stats();
  assert_int_equal(rb_count(), 0);
  assert_int_equal(s1.num_device_alloc, s0.num_device_alloc);
  assert_int_equal(s1.segment[GCA_STAT_ALL].current, 1);
  /* the rest of the run (one block) is free and split */
  assert_int_equal(s1.inactive_split[GCA_STAT_ALL].current, 1);
  assert_int_equal(s1.inactive_split_bytes[GCA_STAT_ALL].current, (int64_t)KiB);
  assert_int_equal(s1.inactive_split[GCA_STAT_ALL].peak, GCA__RB_BIN_MAX + 1);
  free_ok(big);
  for (size_t i = 0; i < N; i++)
    if (i < 100 || i >= 100 + GCA__RB_BIN_MAX + 1)
      free_ok(v[i]);
}

/* A binned pointer is not live: a second free, record_stream and
 * pointer_info fail on it with the message of any freed pointer, and
 * change nothing. */
static void a_binned_pointer_is_not_live(void **state) {
  (void)state;
  bins_on();
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  void *keep = alloc_on(2 * KiB, NULL), *p = alloc_on(2 * KiB, NULL), *edge = alloc_on(512, NULL);
  free_ok(p);
  assert_int_equal(rb_count(), 1);
  gca_stats_t s0 = stats();
  assert_status(gca_free(p), GCA_ERR_INVALID_POINTER, "already freed (double free?)");
  assert_status(gca_record_stream(p, s2), GCA_ERR_INVALID_POINTER, "already freed");
  size_t size = 0;
  int dev = -1;
  assert_status(gca_pointer_info(p, &size, &dev), GCA_ERR_INVALID_POINTER, "already freed");
  check();
  gca_stats_t s1 = stats();
  assert_memory_equal(&s0, &s1, sizeof(s0));
  assert_int_equal(rb_count(), 1);
  free_ok(keep);
  free_ok(edge);
  assert_ok(gca_stream_destroy(s2));
}

/* Walks (snapshots), empty_cache, turning the key or caching off and
 * garbage collection each return every binned block to the tree first. */
static void walks_releases_and_settings_flush_the_bins(void **state) {
  (void)state;
  static const char *const flushers[] = {"walk",
                                         "empty_cache",
                                         "recycle_bins:False",
                                         "free_cache:False",
                                         "garbage_collection_threshold:0.5",
                                         "caching off"};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(flushers); k++) {
    fresh("free_cache:True,recycle_bins:True");
    void *keep = alloc_on(512, NULL), *p = alloc_on(3 * KiB, NULL), *q = alloc_on(8 * KiB, NULL);
    void *edge = alloc_on(512, NULL);
    free_ok(p);
    free_ok(q);
    assert_int_equal(rb_count(), 2);
    if (strcmp(flushers[k], "walk") == 0) {
      layout_t l = layout();
      assert_int_equal(l.nsegs, 1);
      assert_int_equal(l.nfree[0], 2); /* p and q merged into one, and the rest */
    } else if (strcmp(flushers[k], "empty_cache") == 0) {
      assert_ok(gca_empty_cache());
    } else if (strcmp(flushers[k], "caching off") == 0) {
      assert_ok(gca_set_caching(false));
    } else if (strncmp(flushers[k], "garbage", 7) == 0) {
      assert_ok(gca_set_memory_fraction(0, 0.9)); /* collection needs a fraction set */
      assert_ok(gca_set_config(flushers[k]));
    } else {
      assert_ok(gca_set_config(flushers[k]));
    }
    if (rb_count() != 0)
      fail_msg("%s left %zu blocks in the bins", flushers[k], rb_count());
    check();
    assert_int_equal(stats().inactive_split[GCA_STAT_ALL].current, 2);
    assert_int_equal(stats().inactive_split_bytes[GCA_STAT_ALL].current,
                     (int64_t)(2 * MiB - 1 * KiB));
    free_ok(keep);
    free_ok(edge);
    assert_ok(gca_set_caching(true));
  }
}

/* The out-of-memory remedies return every stream's bins: a request on
 * another stream, with the device full, gets the memory a binned block held
 * its segment on. */
static void out_of_memory_flushes_every_streams_bins(void **state) {
  (void)state;
  bins_on();
  assert_ok(gca_sim_set_capacity(0, 2 * MiB));
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(32 * KiB, NULL), *e = alloc_on(512, NULL);
  free_ok(p);
  assert_int_equal(rb_count(), 1);
  free_ok(e);                      /* the last request's block: into the free cache's slot */
  void *q = alloc_on(1 * KiB, s2); /* needs a segment: the first must go */
  assert_int_equal(rb_count(), 0);
  gca_stats_t s = stats();
  assert_int_equal(s.num_device_free, 1);
  assert_int_equal(s.segment[GCA_STAT_ALL].current, 1);
  free_ok(q);
  assert_ok(gca_stream_destroy(s2));
}

/* Two streams whose bins share a group: the second stream's free returns
 * the first's blocks to the tree, merged. */
static void a_stream_taking_a_group_flushes_the_other_streams_bins(void **state) {
  (void)state;
  bins_on();
  gca_stream_t first, other = NULL, made[64];
  size_t nmade = 0;
  assert_ok(gca_stream_create(&first, GCA_STREAM_NON_BLOCKING));
  while (other == NULL && nmade < GCA_ARRAY_SIZE(made)) {
    assert_ok(gca_stream_create(&made[nmade], GCA_STREAM_NON_BLOCKING));
    if (gca__rb_group(made[nmade]) == gca__rb_group(first))
      other = made[nmade];
    nmade++;
  }
  assert_non_null(other);
  void *a = alloc_on(4 * KiB, first), *a2 = alloc_on(4 * KiB, first);
  void *b = alloc_on(4 * KiB, other), *b2 = alloc_on(4 * KiB, other);
  free_ok(a);
  assert_int_equal(rb_count(), 1);
  int64_t split = stats().inactive_split[GCA_STAT_ALL].current;
  free_ok(b);
  /* b is binned, and a went back to first's tree: alone there, between the
   * segment's start and a2 (live), so inactive_split is what it was plus b */
  assert_int_equal(rb_count(), 1);
  assert_int_equal(stats().inactive_split[GCA_STAT_ALL].current, split + 1);
  void *a3 = alloc_on(4 * KiB, first); /* first's tree: a, by PyTorch's best fit */
  assert_ptr_equal(a3, a);
  for (void **p = (void *[]){a2, a3, b2, NULL}; *p != NULL; p++)
    free_ok(*p);
  for (size_t i = 0; i < nmade; i++)
    assert_ok(gca_stream_destroy(made[i]));
  assert_ok(gca_stream_destroy(first));
}

/* The bins' table cannot be had (host memory) when the key is turned on:
 * frees take the tree's path, the allocator stays valid, and the next change
 * of setting makes the table. */
static void host_oom_for_the_bins_takes_the_plain_free(void **state) {
  (void)state;
  assert_ok(gca_set_config("recycle_bins:False"));
  void *keep = alloc_on(512, NULL); /* the device, with no bins' table */
  assert_ok(gca_set_caching(false));
  bins_on(); /* not allowed with caching off: no table yet */
  assert_null(gca__devalloc_peek(0)->rb);
  assert_ok(gca__failpoint_arm("recycle_bins", 1));
  char errpath[] = "/tmp/gca-test-rb-XXXXXX";
  int fd = mkstemp(errpath);
  assert_true(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  gca_log_level_t level = gca_get_log_level();
  gca_set_log_level(GCA_LOG_WARN);
  gca_status_t st = gca_set_caching(true); /* allowed now, but no table */
  gca_set_log_level(level);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  gca__failpoint_clear();
  assert_ok(st);
  char text[512] = {0};
  ssize_t got = pread(fd, text, sizeof(text) - 1, 0);
  close(fd);
  unlink(errpath);
  assert_true(got > 0);
  assert_non_null(strstr(text, "device 0: host out of memory for the recycle bins; frees take "
                               "the tree's path"));
  assert_null(gca__devalloc_peek(0)->rb);
  void *p = alloc_on(1 * KiB, NULL), *q = alloc_on(1 * KiB, NULL), *edge = alloc_on(512, NULL);
  free_ok(p); /* into the free cache or the tree, alone between keep and q */
  assert_int_equal(rb_count(), 0);
  assert_int_equal(stats().inactive_split[GCA_STAT_ALL].current, 2);
  assert_ok(gca_set_caching(true)); /* the next change of setting makes it */
  assert_non_null(gca__devalloc_peek(0)->rb);
  free_ok(q); /* binned: p stays where it went */
  assert_int_equal(rb_count(), 1);
  assert_int_equal(stats().inactive_split[GCA_STAT_ALL].current, 3);
  void *again = alloc_on(1 * KiB, NULL), *again2 = alloc_on(1 * KiB, NULL);
  assert_true((again == p && again2 == q) || (again == q && again2 == p));
  assert_int_equal(rb_count(), 0);
  free_ok(again2);
  free_ok(again);
  free_ok(keep);
  free_ok(edge);
}

/* Blocks the bins do not take: larger than GCA__RB_MAX_SIZE, with recorded
 * streams, or on an expandable segment; and nothing is binned with the key
 * off. */
static void what_the_bins_do_not_take(void **state) {
  (void)state;
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_set_config("recycle_bins:False"));
  void *keep = alloc_on(512, NULL);
  void *p = alloc_on(1 * KiB, NULL), *edge = alloc_on(512, NULL);
  assert_false(facts_hold(p)); /* none written while the bins are off */
  free_ok(p);                  /* the key is off */
  assert_int_equal(rb_count(), 0);
  bins_on();
  void *big = alloc_on(GCA__RB_MAX_SIZE + 512, NULL), *edge2 = alloc_on(512, NULL);
  free_ok(big);
  assert_int_equal(rb_count(), 0);
  void *used = alloc_on(2 * KiB, NULL), *edge3 = alloc_on(512, NULL);
  assert_ok(gca_record_stream(used, s2));
  free_ok(used);
  assert_int_equal(rb_count(), 0);
  assert_ok(gca_stream_synchronize(s2));
  void *plain = alloc_on(2 * KiB, NULL), *edge4 = alloc_on(512, NULL);
  free_ok(plain); /* a plain one is binned */
  assert_int_equal(rb_count(), 1);
  assert_ok(gca_empty_cache());
  for (void **q = (void *[]){keep, edge, edge2, edge3, edge4, NULL}; *q != NULL; q++)
    free_ok(*q);
  assert_nothing_leaked();
  assert_ok(gca_set_config("expandable_segments:True"));
  void *e = alloc_on(2 * KiB, NULL), *e2 = alloc_on(2 * KiB, NULL);
  free_ok(e);
  assert_int_equal(rb_count(), 0);
  free_ok(e2);
  assert_nothing_leaked();
  assert_ok(gca_set_config("expandable_segments:False"));
  assert_ok(gca_stream_destroy(s2));
}

/* With the free cache on too, the free of the block the last request got
 * tries the free cache's slot first, as a same-size pair's does (its leaf
 * path is the cheaper one); any other free goes to the bins first. */
static void the_last_requests_block_goes_to_the_free_cache_first(void **state) {
  (void)state;
  assert_ok(gca_set_config("free_cache:True,recycle_bins:True"));
  gca__devalloc_t *d = NULL;
  void *keep = alloc_on(512, NULL), *a = alloc_on(2 * KiB, NULL), *b = alloc_on(2 * KiB, NULL);
  void *edge = alloc_on(512, NULL);
  d = gca__devalloc_peek(0);
  free_ok(a); /* the last request got edge: a is binned */
  assert_int_equal(rb_count(), 1);
  void *a2 = alloc_on(2 * KiB, NULL);
  assert_ptr_equal(a2, a);
  assert_int_equal(rb_count(), 0);
  void *c = alloc_on(4 * KiB, NULL); /* the last request's block */
  free_ok(b);                        /* not it: the bins */
  assert_int_equal(rb_count(), 1);
  free_ok(c); /* it: the free cache's slot */
  assert_int_equal(rb_count(), 1);
  assert_int_equal(d->fc_count, 1);
  for (void **p = (void *[]){keep, a2, edge, NULL}; *p != NULL; p++)
    free_ok(*p);
}

static void *use_the_device(void *arg) {
  void *p = NULL;
  if (gca_malloc(&p, 3 * MiB, NULL) == GCA_OK)
    gca_free(p);
  return arg;
}

/* A second thread's first call: the free of arg. */
static void *free_on_another_thread(void *arg) {
  gca_free(arg);
  return NULL;
}

/* Once a second thread has used the device, its thread caches come first,
 * and the bins keep working behind them: what they held stays binned, a
 * free this thread's cache does not take (a size above what it takes) is
 * binned, and a request its cache misses takes from the bins; statistics
 * exact (the walker recounts them) and nothing lost. Both ways in: a
 * request, and a free. */
static void the_bins_work_behind_thread_caches(void **state) {
  (void)state;
  for (int way = 0; way < 2; way++) {
    fresh("free_cache:True,recycle_bins:True");
    void *keep = alloc_on(512, NULL), *p = alloc_on(2 * KiB, NULL), *mine = alloc_on(1 * KiB, NULL);
    void *edge = alloc_on(512, NULL);
    free_ok(p);
    assert_int_equal(rb_count(), 1);
    pthread_t t;
    gca_stream_t s2 = NULL;
    if (way == 0) {
      assert_int_equal(pthread_create(&t, NULL, use_the_device, NULL), 0);
    } else {
      /* used on another stream, its free takes the locked path */
      assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
      assert_ok(gca_record_stream(mine, s2));
      assert_int_equal(pthread_create(&t, NULL, free_on_another_thread, mine), 0);
      mine = NULL;
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    if (s2 != NULL) {
      assert_ok(gca_stream_synchronize(s2));
      assert_ok(gca_stream_destroy(s2));
    }
    assert_true(gca__devalloc_peek(0)->tc_on);
    assert_int_equal(rb_count(), 1); /* p, still binned */
    check();
    /* this thread's cache takes the frees of v[0..7] (a bin of it holds
     * GCA__TC_BIN_MAX blocks of a size); v[8] it does not take: the bins do */
    enum { N = GCA__TC_BIN_MAX + 1 };
    void *v[N], *w[N];
    for (int i = 0; i < N; i++)
      v[i] = alloc_on(4 * KiB, NULL);
    void *q2 = alloc_on(512, NULL);
    assert_true(facts_hold(v[0]));
    for (int i = 0; i < N - 1; i++)
      free_ok(v[i]);
    assert_int_equal(rb_count(), 1);
    assert_false(facts_hold(v[0])); /* in the cache's domain: no facts (Note [Free facts]) */
    gca_stats_t s0 = stats();
    free_ok(v[N - 1]);
    assert_int_equal(rb_count(), 2);
    gca_stats_t s1 = stats();
    assert_int_equal(s1.allocated_bytes[GCA_STAT_ALL].current,
                     s0.allocated_bytes[GCA_STAT_ALL].current - 4 * (int64_t)KiB);
    assert_int_equal(s1.allocation[GCA_STAT_ALL].current, s0.allocation[GCA_STAT_ALL].current - 1);
    check();
    for (int i = 0; i < N - 1; i++) { /* the thread cache's, last freed first */
      w[i] = alloc_on(4 * KiB, NULL);
      assert_ptr_equal(w[i], v[N - 2 - i]);
      assert_false(facts_hold(w[i])); /* handed out by the cache: still none */
    }
    w[N - 1] = alloc_on(4 * KiB, NULL); /* it misses: the bin's */
    assert_ptr_equal(w[N - 1], v[N - 1]);
    void *p2 = alloc_on(2 * KiB, NULL);
    assert_ptr_equal(p2, p);
    assert_int_equal(rb_count(), 0);
    check();
    for (int i = 0; i < N; i++)
      free_ok(w[i]);
    for (void **x = (void *[]){q2, p2, keep, edge, NULL}; *x != NULL; x++)
      free_ok(*x);
    if (mine != NULL)
      free_ok(mine);
    check();
  }
}

/* The walker checks the bins against the blocks: a binned block in a state
 * that may not be binned, a bin whose count is off, a block in the bin of
 * another size, and a device count that is off each fail it with their
 * message; put back, it passes. */
static void the_walker_checks_the_bins(void **state) {
  (void)state;
  bins_on();
  void *keep = alloc_on(512, NULL), *p = alloc_on(2 * KiB, NULL), *edge = alloc_on(512, NULL);
  free_ok(p);
  assert_int_equal(rb_count(), 1);
  gca__devalloc_t *d = gca__devalloc_peek(0);
  gca__rbins_t *rb = d->rb;
  unsigned g = gca__rb_group(NULL), c = 2 * KiB / 512 - 1;
  gca__block_t *b = rb->head[g][c];
  assert_non_null(b);
  assert_ptr_equal((void *)(uintptr_t)b->addr, p);

  b->requested = 1;
  assert_status(gca__allocator_check(), GCA_ERR_INTERNAL,
                "binned in a state that may not be binned");
  b->requested = 0;
  check();

  rb->n[g][c]++;
  assert_status(gca__allocator_check(), GCA_ERR_INTERNAL,
                "recycle bin of 2048 bytes, stream group");
  rb->n[g][c]--;
  check();

  rb->head[g][c] = NULL; /* into the bin of 1 KiB */
  rb->head[g][c - 2] = b;
  assert_status(gca__allocator_check(), GCA_ERR_INTERNAL,
                "in the recycle bin of 1024 bytes of stream group");
  rb->head[g][c - 2] = NULL;
  rb->head[g][c] = b;
  check();

  d->rb_count++;
  assert_status(gca__allocator_check(), GCA_ERR_INTERNAL,
                "recycle bins hold 1 blocks; the count says 2, the segments hold 1 binned");
  d->rb_count--;
  check();

  b->left = b; /* a bin's stack that loops */
  assert_status(gca__allocator_check(), GCA_ERR_INTERNAL,
                "a recycle bin holds more than 64 blocks");
  b->left = NULL;
  check();

  d->rb = NULL; /* a binned block and no table */
  assert_status(gca__allocator_check(), GCA_ERR_INTERNAL,
                "1 binned blocks (count 1) and no recycle bins");
  d->rb = rb;
  check();
  free_ok(keep);
  free_ok(edge);
}

/* An allocation of a block the bins may take writes its facts into its
 * pointer-map slot (its class, requested bytes and stream); its free is
 * decided from them and binned as any other, the slot's facts cleared; a
 * second free then reads the record and fails as a double free, changing
 * nothing; the block's next allocation writes its facts again. */
static void a_free_decides_from_the_pointer_maps_facts(void **state) {
  (void)state;
  bins_on();
  void *keep = alloc_on(512, NULL), *p = alloc_on(1500, NULL), *edge = alloc_on(512, NULL);
  gca__ptrslot_t *e = slot_of(p);
  gca__block_t *b = e->val;
  assert_true(facts_hold(p));
  size_t size = block_size_of(p); /* 1536 */
  assert_int_equal(e->facts, GCA__PF_BIN | (uint32_t)(size / 512 - 1) << 1 | 1500u << 16);
  assert_ptr_equal(e->stream, b->stream);
  uint64_t fast = rb_fast();
  gca_stats_t s0 = stats();
  free_ok(p);
  assert_int_equal(rb_fast(), fast + 1);
  assert_int_equal(rb_count(), 1);
  assert_true(b->binned && !b->allocated && b->requested == 0);
  assert_int_equal(slot_of(p)->facts, 0);
  gca_stats_t s1 = stats();
  assert_int_equal(s1.requested_bytes[GCA_STAT_ALL].current,
                   s0.requested_bytes[GCA_STAT_ALL].current - 1500);
  assert_int_equal(s1.allocated_bytes[GCA_STAT_SMALL].current,
                   s0.allocated_bytes[GCA_STAT_SMALL].current - (int64_t)size);
  assert_int_equal(s1.inactive_split[GCA_STAT_ALL].current,
                   s0.inactive_split[GCA_STAT_ALL].current + 1);
  assert_status(gca_free(p), GCA_ERR_INVALID_POINTER, "already freed (double free?)");
  gca_stats_t s2 = stats();
  assert_memory_equal(&s1, &s2, sizeof(s1));
  assert_int_equal(rb_count(), 1);
  check();
  void *again = alloc_on(1100, NULL); /* 1536 again */
  assert_ptr_equal(again, p);
  assert_true(facts_hold(again));
  assert_int_equal(slot_of(again)->facts >> 16, 1100);
  for (void **q = (void *[]){keep, again, edge, NULL}; *q != NULL; q++)
    free_ok(*q);
}

/* What voids a block's facts, so that its free reads the record: a
 * recorded stream (the block is then not binned), the free cache's put (a
 * second free fails as a double free), and a change of any setting (the
 * free still bins the block, by the full path). */
static void what_voids_the_facts(void **state) {
  (void)state;
  bins_on();
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  void *keep = alloc_on(512, NULL), *used = alloc_on(2 * KiB, NULL), *edge = alloc_on(512, NULL);
  assert_true(facts_hold(used));
  assert_ok(gca_record_stream(used, s2));
  assert_false(facts_hold(used));
  free_ok(used);
  assert_int_equal(rb_count(), 0);
  assert_ok(gca_stream_synchronize(s2));

  void *last = alloc_on(4 * KiB, NULL); /* the last request's block: the free cache's slot */
  assert_true(facts_hold(last));
  free_ok(last);
  assert_int_equal(gca__devalloc_peek(0)->fc_count, 1);
  assert_false(facts_hold(last));
  assert_status(gca_free(last), GCA_ERR_INVALID_POINTER, "already freed (double free?)");
  check();

  void *p = alloc_on(3 * KiB, NULL), *edge2 = alloc_on(512, NULL);
  assert_true(facts_hold(p));
  assert_ok(gca_set_config("max_split_size_mb:1024")); /* any setting */
  assert_false(facts_hold(p));
  uint64_t fast = rb_fast();
  free_ok(p);
  assert_int_equal(rb_fast(), fast);
  assert_int_equal(rb_count(), 1);
  check();
  for (void **q = (void *[]){keep, edge, edge2, NULL}; *q != NULL; q++)
    free_ok(*q);
  assert_ok(gca_stream_destroy(s2));
}

/* Note [Leaf gate]: the bins' leaf paths (a put from the facts, a take) run
 * while this thread holds the lock by its bias and the gate is open; a
 * trace observer turned on shuts it before the call returns, so the next
 * put and take are recorded, by the full paths, and still use the bins. */
static void a_recorder_turned_on_stops_the_bins_leaf_paths(void **state) {
  (void)state;
  bins_on();
  void *keep = alloc_on(512, NULL), *v[4], *edge;
  for (int i = 0; i < 4; i++)
    v[i] = alloc_on(2 * KiB, NULL);
  edge = alloc_on(512, NULL);
  gca__devalloc_t *d = gca__devalloc_peek(0);
  uint64_t fast = rb_fast();
  free_ok(v[1]);
  assert_int_equal(rb_fast(), fast + 1);
  void *again = alloc_on(2 * KiB, NULL);
  assert_ptr_equal(again, v[1]);
  void *last = alloc_on(512, NULL); /* again is not the last request's block */
#ifndef GCA_DEBUG_CHECKS            /* there no leaf runs */
  assert_int_equal(d->fc_gate & GCA__GATE_RB, 0);
#endif
  counts_t c = {(uint64_t)(uintptr_t)v[1], 0, 0};
  gca_trace_observer_handle_t h = 0;
  assert_ok(gca_trace_observer_add(count_events, &c, &h));
  assert_true(d->fc_gate & GCA__GATE_RB);
  free_ok(again);
  assert_int_equal(rb_fast(), fast + 2);
  again = alloc_on(2 * KiB, NULL);
  assert_ptr_equal(again, v[1]);
  assert_int_equal(c.frees, 1);
  assert_int_equal(c.allocs, 1);
  assert_ok(gca_trace_observer_remove(h));
  v[1] = again;
  for (int i = 0; i < 4; i++)
    free_ok(v[i]);
  free_ok(keep);
  free_ok(edge);
  free_ok(last);
}

/* The walker checks every fact that holds against its block's record. */
static void the_walker_checks_the_facts(void **state) {
  (void)state;
  bins_on();
  void *keep = alloc_on(512, NULL), *p = alloc_on(1 * KiB, NULL), *edge = alloc_on(512, NULL);
  gca__ptrslot_t *e = slot_of(p);
  uint32_t facts = e->facts;
  e->facts = facts + (1u << 16); /* a requested byte more than the record says */
  assert_status(gca__allocator_check(), GCA_ERR_INTERNAL, "the pointer map's facts of block");
  e->facts = facts;
  check();
  gca_stream_t other = e->stream;
  e->stream = (gca_stream_t)(uintptr_t)0x1000;
  assert_status(gca__allocator_check(), GCA_ERR_INTERNAL, "say what its record does not");
  e->stream = other;
  check();
  for (void **q = (void *[]){keep, p, edge, NULL}; *q != NULL; q++)
    free_ok(*q);
}

/* Seeded churn over two streams with the bins on, every statistic that the
 * layout does not decide checked after each step against an eager model of
 * PyTorch's counting (allocation, allocated_bytes, requested_bytes, active:
 * current, peak, allocated and freed), and the walker after each step,
 * which recounts inactive_split from the blocks. GCA_TEST_SEED repeats a
 * run. */
typedef struct model {
  int64_t cur[4], peak[4], in[4], out[4];
} model_t;

static void model_add(model_t *m, int k, int64_t n) {
  m->cur[k] += n;
  if (n > 0)
    m->in[k] += n;
  else
    m->out[k] -= n;
  if (m->cur[k] > m->peak[k])
    m->peak[k] = m->cur[k];
}

static void model_check(const model_t *m, long step) {
  gca_stats_t s = stats();
  const gca_stat_t *x[4] = {&s.allocation[GCA_STAT_ALL], &s.allocated_bytes[GCA_STAT_ALL],
                            &s.requested_bytes[GCA_STAT_ALL], &s.active[GCA_STAT_ALL]};
  for (int k = 0; k < 4; k++)
    if (x[k]->current != m->cur[k] || x[k]->peak != m->peak[k] || x[k]->allocated != m->in[k] ||
        x[k]->freed != m->out[k])
      fail_msg("step %ld, statistic %d: %lld/%lld/%lld/%lld, model %lld/%lld/%lld/%lld", step, k,
               (long long)x[k]->current, (long long)x[k]->peak, (long long)x[k]->allocated,
               (long long)x[k]->freed, (long long)m->cur[k], (long long)m->peak[k],
               (long long)m->in[k], (long long)m->out[k]);
}

static uint64_t rb_hits(void) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  return d != NULL && d->rb != NULL ? d->rb->hits : 0;
}

/* p's block size read without the device lock, whose taking would settle
 * what the bins' leaves owe (the test's thread is the only one). */
static size_t block_size_unlocked(const void *p) {
  const gca__block_t *b =
      gca__ptrmap_find(&gca__devalloc_peek(0)->ptrs, (gca_devptr_t)(uintptr_t)p);
  assert_non_null(b);
  return b->size;
}

/* One seeded churn round (pass: 0 the defaults, 1 a rounding of their own,
 * 2 the defaults with thread caches engaged first, the bins behind them, 3
 * the defaults read only now and then: Note [Owed bin statistics]). */
static void churn_round(int pass, uint64_t seed) {
  srand((unsigned)(seed + (uint64_t)pass));
  enum { LIVE = 300, STEPS = 6000 };
  static void *v[LIVE];
  static size_t req[LIVE], rounded[LIVE];
  fresh(pass == 1 ? "recycle_bins:True,roundup_power2_divisions:4"
                  : "free_cache:True,recycle_bins:True");
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  if (pass < 2) {
    assert_null(gca__tc_mine(0)); /* the leaf paths (Note [Leaf hits]) serve this thread */
  } else {
    free_ok(alloc_on(512, NULL)); /* this thread first, then another: they engage */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, use_the_device, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(gca__devalloc_peek(0)->tc_on);
    assert_ok(gca_reset_accumulated_stats(0)); /* the model starts from nothing */
    assert_ok(gca_reset_peak_stats(0));
  }
  model_t m = {0};
  /* pass 3: a read (which settles what the bins' leaves owe) after 1 to 200
   * steps, and the peaks reset now and then, so that the leaves carry long
   * owed runs and meet peaks they may not pass unseen */
  long next_read = 0, owed_reads = 0;
  for (long step = 0; step < STEPS; step++) {
    size_t i = (size_t)rand() % LIVE;
    if (v[i] != NULL) {
      if (pass == 3)
        assert_ok(gca_free(v[i])); /* no walk: it would settle */
      else
        free_ok(v[i]);
      v[i] = NULL;
      model_add(&m, 0, -1);
      model_add(&m, 1, -(int64_t)rounded[i]);
      model_add(&m, 2, -(int64_t)req[i]);
      model_add(&m, 3, -1);
    } else {
      /* mostly sizes the bins take, some they do not; two streams */
      size_t size =
          (size_t)(rand() % 8 == 0 ? 40 * KiB + rand() % (200 * KiB) : 1 + rand() % (12 * KiB));
      v[i] = NULL;
      if (pass == 3)
        assert_ok(gca_malloc(&v[i], size, i % 3 == 0 ? s2 : NULL));
      else
        v[i] = alloc_on(size, i % 3 == 0 ? s2 : NULL);
      req[i] = size;
      rounded[i] = pass == 3 ? block_size_unlocked(v[i]) : block_size_of(v[i]);
      model_add(&m, 0, 1);
      model_add(&m, 1, (int64_t)rounded[i]);
      model_add(&m, 2, (int64_t)size);
      model_add(&m, 3, 1);
    }
    if (pass == 3 && step < next_read)
      continue;
    next_read = step + 1 + rand() % 200;
    const gca__devalloc_t *d = gca__devalloc_peek(0);
    owed_reads += d->rb_owe.on && (d->rb_owe.tn | d->rb_owe.pn) != 0;
    model_check(&m, step);
    check(); /* the leaf paths too, which a debug_checks build does not take */
    if (pass == 3 && step % 1000 == 999) {
      assert_ok(gca_reset_peak_stats(0));
      for (int k = 0; k < 4; k++)
        m.peak[k] = m.cur[k];
    }
    if (step % 1500 == 1499) { /* a release path now and then */
      assert_ok(gca_empty_cache());
      assert_int_equal(rb_count(), 0);
      model_check(&m, step);
    }
  }
  uint64_t hits = rb_hits(), fast = rb_fast();
  printf("churn pass %d: %llu allocations served from the bins, %llu frees put from the "
         "pointer map's facts\n",
         pass, (unsigned long long)hits, (unsigned long long)fast);
  assert_true(hits > STEPS / 8);
  assert_true(fast > STEPS / 8); /* with thread caches too: their domains full or parked */
  if (pass == 3) {               /* the leaves owed, and the reads settled it */
    printf("churn pass 3: %ld reads found statistics owed\n", owed_reads);
#ifndef GCA_DEBUG_CHECKS /* there no leaf runs */
    assert_true(owed_reads > 10);
#endif
  }
  for (size_t i = 0; i < LIVE; i++)
    if (v[i] != NULL) {
      free_ok(v[i]);
      v[i] = NULL;
    }
  assert_ok(gca_stream_destroy(s2));
}

static uint64_t churn_seed(void) {
  const char *env = getenv("GCA_TEST_SEED");
  uint64_t seed = env != NULL ? strtoull(env, NULL, 0) : 20261126;
  printf("churn seed %llu (GCA_TEST_SEED)\n", (unsigned long long)seed);
  return seed;
}

static void churn_keeps_statistics_exact_against_a_model(void **state) {
  (void)state;
  uint64_t seed = churn_seed();
  churn_round(0, seed);
  churn_round(1, seed);
}

/* The same behind thread caches: the statistics counted with their
 * headroom (folded on read) stay exact against the model. */
static void churn_behind_thread_caches_keeps_statistics_exact(void **state) {
  (void)state;
  churn_round(2, churn_seed());
}

/* Read only now and then: what the bins' leaves owe between two reads is
 * settled exactly by the read, peaks included, and a reset of the peaks
 * leaves them no rise above the current until something settles. */
static void owed_bin_statistics_are_exact_when_read(void **state) {
  (void)state;
  churn_round(3, churn_seed());
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, alloc_setup, alloc_teardown)
  const struct CMUnitTest tests[] = {
      T(a_binned_block_is_reused_with_the_statistics_of_the_layout),
      T(bins_never_cost_a_segment),
      T(a_binned_pointer_is_not_live),
      T(walks_releases_and_settings_flush_the_bins),
      T(out_of_memory_flushes_every_streams_bins),
      T(a_stream_taking_a_group_flushes_the_other_streams_bins),
      T(host_oom_for_the_bins_takes_the_plain_free),
      T(what_the_bins_do_not_take),
      T(the_last_requests_block_goes_to_the_free_cache_first),
      /* before any thread cache is made: this thread takes the leaf paths */
      T(a_recorder_turned_on_stops_the_bins_leaf_paths),
      T(churn_keeps_statistics_exact_against_a_model),
      T(the_bins_work_behind_thread_caches),
      T(the_walker_checks_the_bins),
      T(a_free_decides_from_the_pointer_maps_facts),
      T(what_voids_the_facts),
      T(the_walker_checks_the_facts),
      T(churn_behind_thread_caches_keeps_statistics_exact),
      T(owed_bin_statistics_are_exact_when_read),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
