/* SPDX-License-Identifier: Apache-2.0 */
/* test_expand_moves.c - handle moves in expandable segments (Note [Expandable
 * segments]): a growth that would create handles while free granules sit
 * elsewhere in the segment moves their handles instead. Pinned here: live
 * blocks keep their data through any sequence of moves (stamps, seeded), a
 * fault in the unmaps or maps of a move leaves the allocator valid with no
 * leak, a move waits for the segment's stream with the device lock let go,
 * and nothing moves while a capture is under way. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "alloc_fixture.h"
#include "gca.h"
#include "support.h"

static int exp_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("expandable_segments:True,expandable_moves:True"));
  return 0;
}

static atomic_int gate = 1;

static int exp_teardown(void **state) {
  atomic_store(&gate, 1);
  return alloc_teardown(state);
}

static int64_t calls(const char *op) {
  return gca_sim_call_count(op);
}

/* Four 10 MiB blocks on `s`, the first and third freed: two 10 MiB holes
 * that a 16 MiB request does not fit. p[1] and p[3] are stamped. */
static void two_holes(char **p, gca_stream_t s) {
  for (int i = 0; i < 4; i++)
    p[i] = alloc_on(10 * MiB, s);
  stamp_fill(p[1], 10 * MiB, 0xb1);
  stamp_fill(p[3], 10 * MiB, 0xd3);
  free_ok(p[0]);
  free_ok(p[2]);
}

static void stamps_hold(char **p) {
  assert_int_equal(stamp_mismatch(p[1], 10 * MiB, 0xb1), -1);
  assert_int_equal(stamp_mismatch(p[3], 10 * MiB, 0xd3), -1);
}

static void release_holes(char **p) {
  free_ok(p[1]);
  free_ok(p[3]);
  assert_nothing_leaked();
  assert_int_equal(calls("mem_create"), calls("mem_release"));
}

/* ---- data ---- */

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Seeded churn over blocks of 4 KiB .. 24 MiB (GCA_TEST_SEED, default 1):
 * every live block carries its own stamp, checked when it is freed and, all
 * of them, every 64 operations with the invariant walker; the churn must
 * move handles, and no stamp may change. */
static void moves_keep_the_data_of_live_blocks(void **state) {
  (void)state;
  const char *env = getenv("GCA_TEST_SEED");
  uint64_t seed = env ? strtoull(env, NULL, 0) : 1, r = seed | 1;
  enum { LIVE = 48, OPS = 3000 };
  char *p[LIVE] = {0};
  size_t sz[LIVE] = {0};
  uint32_t st[LIVE] = {0};
  for (int op = 0; op < OPS; op++) {
    int i = (int)(rng_next(&r) % LIVE);
    if (p[i] != NULL) {
      long bad = stamp_mismatch(p[i], sz[i], st[i]);
      if (bad != -1)
        fail_msg("seed %" PRIu64 ": op %d: block %d (%zu bytes) differs at word %ld", seed, op, i,
                 sz[i], bad);
      free_ok(p[i]);
      p[i] = NULL;
      continue;
    }
    int shift = 12 + (int)(rng_next(&r) % 13); /* 4 KiB .. 16 MiB, then a spread */
    sz[i] = ((size_t)1 << shift) + (size_t)(rng_next(&r) % ((size_t)1 << shift) / 2);
    st[i] = (uint32_t)rng_next(&r);
    p[i] = alloc_on(sz[i], NULL);
    stamp_fill(p[i], sz[i], st[i]);
    if (op % 64 == 0) {
      check();
      for (int k = 0; k < LIVE; k++)
        if (p[k] != NULL && stamp_mismatch(p[k], sz[k], st[k]) != -1)
          fail_msg("seed %" PRIu64 ": op %d: block %d changed", seed, op, k);
    }
  }
  gca_stats_t s = stats();
  if (s.num_handle_moves == 0)
    fail_msg("seed %" PRIu64 ": no handle moved in %d operations", seed, OPS);
  for (int i = 0; i < LIVE; i++)
    if (p[i] != NULL) {
      assert_int_equal(stamp_mismatch(p[i], sz[i], st[i]), -1);
      free_ok(p[i]);
    }
  assert_nothing_leaked();
}

/* A seeded churn on stream `s` that is never idle (Note [Lent granules]):
 * every block allocated gets a stream-ordered memset of its own stamp; the
 * stream runs behind a gate, and every 150 operations a new gate is queued
 * and the previous one opened, so horizons complete while later work is
 * still held. At the end every live block must hold its stamp: what queued
 * work wrote through a lent or reused range came before it in stream order,
 * and the stream finishes without a fault (no queued write met an unmapped
 * range). Runs on any thread: a failure is written to `why` (the caller
 * asserts). *moves_held: num_handle_moves when the first gate opened. */
typedef struct churn {
  uint64_t seed;
  gca_stream_t s;
  int64_t moves_held;
  char why[256];
} churn_t;

#define CHURN_FAIL(c, ...)                             \
  do {                                                 \
    snprintf((c)->why, sizeof((c)->why), __VA_ARGS__); \
    goto out;                                          \
  } while (0)

static void *churn_run(void *arg) {
  churn_t *c = arg;
  enum { LIVE = 32, OPS = 600, EVERY = 150, LAST = (OPS - 1) / EVERY };
  uint64_t r = c->seed | 1;
  char *p[LIVE] = {0};
  size_t sz[LIVE] = {0};
  uint32_t st[LIVE] = {0};
  test_gate_t g[LAST + 1];
  int gates = 1;
  gca_stats_t stt;
  c->why[0] = 0;
  c->moves_held = -1;
  test_gate_init(&g[0]);
  if (gca_launch_host_func(c->s, test_gate_pass, &g[0]) != GCA_OK)
    CHURN_FAIL(c, "launch: %s", gca_last_error());
  for (int op = 0; op < OPS; op++) {
    if (op % EVERY == 0 && op > 0) {
      int k = op / EVERY;
      if (k == 1 && gca_get_stats(0, &stt) == GCA_OK)
        c->moves_held = stt.num_handle_moves;
      test_gate_init(&g[gates++]);
      if (gca_launch_host_func(c->s, test_gate_pass, &g[k]) != GCA_OK)
        CHURN_FAIL(c, "op %d: launch: %s", op, gca_last_error());
      test_gate_open(&g[k - 1]);
    }
    int i = (int)(rng_next(&r) % LIVE);
    if (p[i] != NULL) {
      if (gca_free(p[i]) != GCA_OK)
        CHURN_FAIL(c, "op %d: free: %s", op, gca_last_error());
      p[i] = NULL;
      continue;
    }
    int shift = 16 + (int)(rng_next(&r) % 9); /* 64 KiB .. 16 MiB, then a spread */
    sz[i] = ((size_t)1 << shift) + (size_t)(rng_next(&r) % ((size_t)1 << shift) / 2);
    sz[i] &= ~(size_t)3;
    st[i] = (uint32_t)rng_next(&r);
    void *q = NULL;
    if (gca_malloc(&q, sz[i], c->s) != GCA_OK)
      CHURN_FAIL(c, "op %d: malloc of %zu: %s", op, sz[i], gca_last_error());
    p[i] = q;
    if (gca_memset_d32_async(p[i], st[i], sz[i] / 4, c->s) != GCA_OK)
      CHURN_FAIL(c, "op %d: memset: %s", op, gca_last_error());
    if (op % 64 == 0 && gca__allocator_check() != GCA_OK)
      CHURN_FAIL(c, "op %d: %s", op, gca_last_error());
  }
  test_gate_open(&g[gates - 1]);
  if (gca_stream_synchronize(c->s) != GCA_OK)
    CHURN_FAIL(c, "the stream's work: %s", gca_last_error());
  for (int i = 0; i < LIVE; i++) {
    if (p[i] == NULL)
      continue;
    const uint32_t *w = (const uint32_t *)p[i];
    for (size_t k = 0; k < sz[i] / 4; k++)
      if (w[k] != st[i])
        CHURN_FAIL(c, "block %d (%zu bytes): word %zu is %#x, not %#x", i, sz[i], k, w[k], st[i]);
  }
out:
  test_gate_open(&g[gates - 1]); /* a failure leaves nothing held */
  (void)gca_stream_synchronize(c->s);
  for (int i = 0; i < LIVE; i++)
    if (p[i] != NULL)
      (void)gca_free(p[i]);
  for (int k = 0; k < gates; k++)
    test_gate_fini(&g[k]);
  return NULL;
}

static uint64_t test_seed(void) {
  const char *env = getenv("GCA_TEST_SEED");
  return env ? strtoull(env, NULL, 0) : 1;
}

/* The churn above on this thread (seed GCA_TEST_SEED, default 1): moves
 * happen before the first gate opens (lent: nothing could be covered then). */
static void moves_under_a_busy_stream_keep_stream_ordered_data(void **state) {
  (void)state;
  churn_t c = {.seed = test_seed()};
  assert_ok(gca_stream_create(&c.s, GCA_STREAM_NON_BLOCKING));
  churn_run(&c);
  if (c.why[0] != 0)
    fail_msg("seed %" PRIu64 ": %s", c.seed, c.why);
  if (c.moves_held <= 0)
    fail_msg("seed %" PRIu64 ": no move while the stream was held", c.seed);
  assert_nothing_leaked();
  assert_ok(gca_stream_destroy(c.s));
}

/* The same churn on two threads at once, each on a stream of its own (seeds
 * GCA_TEST_SEED and the next): lends, horizons and the releases of lent
 * ranges of the two streams interleave under the device lock, and moves
 * across the two segments take covered granules only. */
static void moves_under_busy_streams_of_two_threads_keep_their_data(void **state) {
  (void)state;
  churn_t c[2];
  pthread_t t[2];
  for (int k = 0; k < 2; k++) {
    c[k] = (churn_t){.seed = test_seed() + (uint64_t)k};
    assert_ok(gca_stream_create(&c[k].s, GCA_STREAM_NON_BLOCKING));
  }
  for (int k = 0; k < 2; k++)
    assert_int_equal(pthread_create(&t[k], NULL, churn_run, &c[k]), 0);
  for (int k = 0; k < 2; k++)
    assert_int_equal(pthread_join(t[k], NULL), 0);
  for (int k = 0; k < 2; k++)
    if (c[k].why[0] != 0)
      fail_msg("thread %d, seed %" PRIu64 ": %s", k, c[k].seed, c[k].why);
  assert_true(stats().num_handle_moves > 0);
  assert_nothing_leaked();
  for (int k = 0; k < 2; k++)
    assert_ok(gca_stream_destroy(c[k].s));
}

/* ---- faults ---- */

/* The second unmap of a move fails: each hole's granules are unmapped in one
 * call (a run of adjacent mappings), so the first hole gives its five, the
 * second hole's three stay mapped and free (each free range of the batch is
 * released on its own), the growth creates the other three, the allocation
 * succeeds, and nothing is lost. */
static void an_unmap_fault_mid_move_falls_back_to_new_handles(void **state) {
  (void)state;
  char *p[4];
  two_holes(p, NULL);
  int64_t creates = calls("mem_create"), unmaps = calls("mem_unmap");
  assert_ok(gca_sim_fault_set("mem_unmap:nth=2"));
  char *e = alloc_on(16 * MiB, NULL);
  gca_sim_fault_clear();
  check();
  stamps_hold(p);
  gca_stats_t s = stats();
  assert_int_equal(s.num_handle_moves, 5);
  assert_int_equal(calls("mem_unmap") - unmaps, 2); /* five moved in one, three refused */
  assert_int_equal(calls("mem_create") - creates, 3);
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 40 * MiB - 10 * MiB + 16 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), s.reserved_bytes[GCA_STAT_ALL].current);
  stamp_fill(e, 16 * MiB, 0xee);
  free_ok(e);
  release_holes(p);
}

/* A map (or the range's set_access) of moved handles fails: the growth is
 * undone, the moved handles are released (their ranges were free and are
 * unmapped now), the status names the operation, and the next request
 * succeeds. */
static void a_map_fault_after_a_move_fails_the_request_cleanly(void **state) {
  (void)state;
  static const struct {
    const char *spec, *op, *progress;
  } f[] = {{"mem_map:nth=2", "mem_map", "(1 of 8 granules mapped, 1 moved)"},
           {"mem_set_access:nth=1", "mem_set_access", "(8 of 8 granules mapped, 8 moved)"}};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(f); k++) {
    char *p[4];
    two_holes(p, NULL);
    assert_ok(gca_reset_accumulated_stats(0));
    int64_t creates = calls("mem_create"), releases = calls("mem_release");
    assert_ok(gca_sim_fault_set(f[k].spec));
    void *q = NULL;
    assert_status(gca_malloc(&q, 16 * MiB, NULL), GCA_ERR_DRIVER, f[k].op);
    assert_non_null(strstr(gca_last_error(), "of an expandable segment"));
    assert_non_null(strstr(gca_last_error(), f[k].progress));
    gca_sim_fault_clear();
    assert_null(q);
    check();
    stamps_hold(p);
    gca_stats_t s = stats();
    assert_int_equal(s.num_handle_moves, 0);
    assert_int_equal(calls("mem_create"), creates);
    assert_int_equal(calls("mem_release") - releases, 8); /* the parked handles */
    assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 24 * MiB);
    assert_int_equal(gca_sim_used_bytes(0), 24 * MiB);
    char *e = alloc_on(16 * MiB, NULL); /* and now it works */
    stamp_fill(e, 16 * MiB, 0xee);
    stamps_hold(p);
    free_ok(e);
    release_holes(p);
  }
}

/* A growth fails (set_access) and the undo's second unmap fails too: the
 * granules below it stay mapped, are opened and cached as a free block, the
 * request fails naming the first failure, and the memory serves the next
 * request with no new handle; nothing leaks. */
static void an_unmap_fault_while_undoing_a_growth_keeps_the_start_cached(void **state) {
  (void)state;
  char *keep = alloc_on(10 * MiB, NULL);
  stamp_fill(keep, 10 * MiB, 0x77);
  int64_t creates = calls("mem_create"), releases = calls("mem_release");
  assert_ok(gca_sim_fault_set("mem_set_access:nth=1,mem_unmap:nth=2"));
  void *q = NULL;
  assert_status(gca_malloc(&q, 30 * MiB, NULL), GCA_ERR_DRIVER, "mem_set_access");
  assert_non_null(strstr(gca_last_error(), "(15 of 15 granules mapped, 0 moved)"));
  gca_sim_fault_clear();
  assert_null(q);
  check();
  assert_int_equal(calls("mem_create") - creates, 15);
  assert_int_equal(calls("mem_release") - releases, 1); /* the last granule, unmapped */
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 10 * MiB + 28 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 38 * MiB);
  char *r = alloc_on(28 * MiB, NULL); /* the kept 28 MiB, cached */
  assert_ptr_equal(r, keep + 10 * MiB);
  assert_int_equal(calls("mem_create") - creates, 15);
  stamp_fill(r, 28 * MiB, 0x88); /* opened: writable */
  assert_int_equal(stamp_mismatch(keep, 10 * MiB, 0x77), -1);
  free_ok(r);
  free_ok(keep);
  assert_nothing_leaked();
  assert_int_equal(calls("mem_create"), calls("mem_release"));
}

/* Out of host memory for the mapping records, the handle list or the second
 * block record (the unmapped rest after the range) of a growth (Note [Host
 * fail points]): an out-of-memory condition before any driver call, so the
 * retry after releasing the cache succeeds. */
static void host_oom_in_a_growth_is_retried(void **state) {
  (void)state;
  static const char *const points[] = {"expand_maps", "expand_handles", "expand_spare"};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(points); k++) {
    int64_t creates = calls("mem_create"), retries = stats().num_alloc_retries;
    assert_ok(gca__failpoint_arm(points[k], 1));
    char *p = alloc_on(10 * MiB, NULL);
    gca__failpoint_clear();
    assert_int_equal(stats().num_alloc_retries - retries, 1);
    assert_int_equal(calls("mem_create") - creates, 5);
    stamp_fill(p, 10 * MiB, 0x99);
    free_ok(p);
    assert_nothing_leaked();
  }
}

/* Out of host memory for the parked-handle list: nothing moves, the growth
 * creates its handles, the request succeeds. */
static void host_oom_for_parked_handles_grows_instead(void **state) {
  (void)state;
  char *p[4];
  two_holes(p, NULL);
  int64_t creates = calls("mem_create"), unmaps = calls("mem_unmap");
  assert_ok(gca__failpoint_arm("expand_parked", 1));
  char *e = alloc_on(16 * MiB, NULL);
  gca__failpoint_clear();
  assert_int_equal(stats().num_handle_moves, 0);
  assert_int_equal(calls("mem_create") - creates, 8);
  assert_int_equal(calls("mem_unmap"), unmaps);
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 56 * MiB);
  stamps_hold(p);
  free_ok(e);
  release_holes(p);
}

/* ---- streams and captures ---- */

static void hold_stream(void *arg) {
  atomic_int *ran = arg;
  while (atomic_load(&gate) == 0)
    sched_yield();
  atomic_store(ran, 1);
}

/* Checks that every word of the n bytes at p is v. */
static void words_are(const char *p, size_t n, uint32_t v) {
  const uint32_t *w = (const uint32_t *)p;
  for (size_t i = 0; i < n / 4; i++)
    if (w[i] != v)
      fail_msg("word %zu of %p is %#x, not %#x", i, (const void *)p, w[i], v);
}

/* Note [Lent granules]: four 10 MiB blocks on s, the first and third used by
 * work queued behind a shut gate, then freed. A 16 MiB request moves eight
 * of their granules without waiting (the call returns with the gate shut, no
 * synchronize) and without unmapping them from under the queued work: they
 * are lent, mapped at both places until the stream has passed them. Work
 * queued for the new block runs after the old work (one stream), so its
 * memset is what the block holds; the old memsets found their ranges
 * mapped (the stream finishes without a fault). Once the stream is idle,
 * the lent ranges are unmapped (at the next growth or, here, the release)
 * and nothing is left behind. */
static void a_move_lends_ranges_that_queued_work_may_use(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  char *p[4];
  for (int i = 0; i < 4; i++)
    p[i] = alloc_on(10 * MiB, s);
  stamp_fill(p[1], 10 * MiB, 0xb1);
  stamp_fill(p[3], 10 * MiB, 0xd3);
  test_gate_t g = TEST_GATE_INIT;
  assert_ok(gca_launch_host_func(s, test_gate_pass, &g));
  assert_ok(gca_memset_d32_async(p[0], 0x5eed, 10 * MiB / 4, s));
  assert_ok(gca_memset_d32_async(p[2], 0x5eed, 10 * MiB / 4, s));
  free_ok(p[0]);
  free_ok(p[2]);
  int64_t creates = calls("mem_create"), syncs = calls("stream_synchronize");
  int64_t unmaps = calls("mem_unmap"), records = calls("event_record");
  char *e = alloc_on(16 * MiB, s);
  check();
  assert_ptr_equal(e, p[3] + 10 * MiB);
  assert_int_equal(stats().num_handle_moves, 8);
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 40 * MiB);
  assert_int_equal(calls("mem_create"), creates);
  assert_int_equal(calls("mem_unmap"), unmaps);
  assert_int_equal(calls("stream_synchronize"), syncs);
  assert_int_equal(calls("event_record") - records, 1); /* a horizon behind the queued work */
  assert_ok(gca_memset_d32_async(e, 0x77, 16 * MiB / 4, s));
  test_gate_open(&g);
  assert_ok(gca_stream_synchronize(s));
  words_are(e, 16 * MiB, 0x77);
  stamps_hold(p);
  assert_int_equal(calls("mem_unmap"), unmaps); /* still lent: nothing asked since */
  free_ok(e);
  release_holes(p);
  assert_true(calls("mem_unmap") >= unmaps + 2); /* the two lent ranges, at the release */
  assert_ok(gca_stream_destroy(s));
  test_gate_fini(&g);
}

/* Note [Move horizons]: a horizon recorded behind queued work covers what
 * was freed before it once the stream passes it, while the stream is still
 * busy with later work. A freed behind gate 1: a 16 MiB growth lends A's
 * five granules (no unmap) and records horizon H; gate 2 shuts the stream
 * again behind H and C is freed. Once H has completed, the next growth
 * unmaps A's lent range (one mem_unmap) and lends C's granules (C was freed
 * after H), with no synchronize and gate 2 still shut. */
static void a_horizon_covers_what_was_freed_before_it(void **state) {
  (void)state;
  gca_stream_t s;
  gca_event_t past_h;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_event_create(&past_h, 0));
  char *a = alloc_on(10 * MiB, s), *b = alloc_on(10 * MiB, s), *c = alloc_on(10 * MiB, s);
  char *x = alloc_on(10 * MiB, s);
  stamp_fill(b, 10 * MiB, 0xb2);
  stamp_fill(x, 10 * MiB, 0xb4);
  test_gate_t g1 = TEST_GATE_INIT, g2 = TEST_GATE_INIT;
  assert_ok(gca_launch_host_func(s, test_gate_pass, &g1));
  free_ok(a);
  int64_t syncs = calls("stream_synchronize"), records = calls("event_record");
  int64_t unmaps = calls("mem_unmap");
  char *e = alloc_on(16 * MiB, s); /* lends A's granules, records H */
  assert_int_equal(stats().num_handle_moves, 5);
  assert_int_equal(calls("event_record") - records, 1);
  assert_int_equal(calls("mem_unmap"), unmaps);
  assert_ok(gca_event_record(past_h, s));
  assert_ok(gca_launch_host_func(s, test_gate_pass, &g2));
  free_ok(c);
  test_gate_open(&g1);
  assert_ok(gca_event_synchronize(past_h)); /* H has completed */
  char *f = alloc_on(14 * MiB, s);          /* after e: lacks 14 MiB */
  check();
  assert_int_equal(stats().num_handle_moves, 10);
  assert_int_equal(calls("mem_unmap") - unmaps, 1); /* A's lent range; C's is lent */
  assert_int_equal(calls("stream_synchronize"), syncs);
  assert_int_equal(stamp_mismatch(b, 10 * MiB, 0xb2), -1);
  assert_int_equal(stamp_mismatch(x, 10 * MiB, 0xb4), -1);
  test_gate_open(&g2);
  assert_ok(gca_stream_synchronize(s));
  free_ok(e);
  free_ok(f);
  free_ok(b);
  free_ok(x);
  assert_nothing_leaked();
  assert_ok(gca_event_destroy(past_h));
  assert_ok(gca_stream_destroy(s));
  test_gate_fini(&g1);
  test_gate_fini(&g2);
}

/* A horizon step that fails (a sim fault in stream_query, event_create,
 * event_record or event_query) only delays when lent ranges are unmapped:
 * the 16 MiB request still moves the holes' eight granules, lent, and the
 * allocator stays valid; with no host memory for the segment's horizons
 * (fail point horizon_alloc) the growth records none and still lends (the
 * record of lent ranges is made next); with none to record the first hole's
 * lent range (fail point horizon_alias) that hole's granules stay where they
 * are, the second hole lends three and the growth creates five.
 * `busy`: the stream is held behind a gate; event_query fails on a second
 * growth (8 MiB: two granules lent from the second hole's rest, two
 * created), polling the horizon the first recorded. Either way the release
 * leaves nothing behind. */
static void a_failed_horizon_step_still_moves_or_creates(void **state) {
  (void)state;
  static const struct {
    const char *op, *point; /* a sim fault in op's first call, or a fail point */
    bool busy, second;
    int64_t moves, creates;
  } f[] = {{"stream_query", NULL, false, false, 8, 0}, {"event_create", NULL, true, false, 8, 0},
           {"event_record", NULL, true, false, 8, 0},  {"event_query", NULL, true, true, 10, 2},
           {NULL, "horizon_alloc", true, false, 8, 0}, {NULL, "horizon_alias", true, false, 3, 5}};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(f); k++) {
    gca_stream_t s;
    assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
    assert_ok(gca_reset_accumulated_stats(0));
    char *p[4];
    two_holes(p, s);
    test_gate_t g = TEST_GATE_INIT;
    if (f[k].busy)
      assert_ok(gca_launch_host_func(s, test_gate_pass, &g));
    int64_t creates = calls("mem_create"), syncs = calls("stream_synchronize");
    int64_t before = f[k].op ? calls(f[k].op) : 0;
    char spec[64];
    snprintf(spec, sizeof(spec), "%s:nth=1", f[k].op ? f[k].op : "");
    char *e = f[k].second ? alloc_on(16 * MiB, s) : NULL, *e2 = NULL;
    if (f[k].op != NULL)
      assert_ok(gca_sim_fault_set(spec));
    else
      assert_ok(gca__failpoint_arm(f[k].point, 1));
    if (f[k].second)
      e2 = alloc_on(8 * MiB, s);
    else
      e = alloc_on(16 * MiB, s);
    if (f[k].op != NULL && calls(f[k].op) == before) /* the faulty call was made */
      fail_msg("%s: not called", f[k].op);
    gca_sim_fault_clear();
    gca__failpoint_clear();
    check();
    if (stats().num_handle_moves != f[k].moves)
      fail_msg("%s: %lld moves", f[k].op ? f[k].op : f[k].point,
               (long long)stats().num_handle_moves);
    if (calls("mem_create") - creates != f[k].creates)
      fail_msg("%s: %lld created", f[k].op ? f[k].op : f[k].point,
               (long long)(calls("mem_create") - creates));
    if (calls("stream_synchronize") != syncs)
      fail_msg("%s: the stream was synchronized", f[k].op ? f[k].op : f[k].point);
    test_gate_open(&g);
    assert_ok(gca_stream_synchronize(s));
    stamps_hold(p);
    free_ok(e);
    if (e2 != NULL)
      free_ok(e2);
    release_holes(p);
    assert_ok(gca_stream_destroy(s));
    test_gate_fini(&g);
  }
}

/* The driver refuses every unmap while the release would let the lent ranges
 * go (Note [Lent granules]; sim fault mem_unmap:always): each failure is
 * logged and the range stays lent, the release reports the mappings it could
 * not unmap, the allocator stays valid and the memory stays held; with the
 * driver well again the next release unmaps them and nothing is left. */
static void a_lent_range_that_fails_to_unmap_is_unmapped_later(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  char *p[4];
  two_holes(p, s);
  test_gate_t g = TEST_GATE_INIT;
  assert_ok(gca_launch_host_func(s, test_gate_pass, &g));
  int64_t unmaps = calls("mem_unmap");
  char *e = alloc_on(16 * MiB, s); /* lends eight granules */
  assert_int_equal(stats().num_handle_moves, 8);
  assert_int_equal(calls("mem_unmap"), unmaps);
  test_gate_open(&g);
  assert_ok(gca_stream_synchronize(s));
  free_ok(e);
  free_ok(p[1]);
  free_ok(p[3]);
  assert_ok(gca_sim_fault_set("mem_unmap:always"));
  gca_status_t st = gca_empty_cache();
  gca_sim_fault_clear();
  assert_int_not_equal(st, GCA_OK);
  assert_non_null(strstr(gca_last_error(), "mem_unmap"));
  check();
  assert_true(gca_sim_used_bytes(0) > 0);
  assert_nothing_leaked(); /* the second release unmaps them */
  assert_int_equal(calls("mem_create"), calls("mem_release"));
  assert_ok(gca_stream_destroy(s));
  test_gate_fini(&g);
}

/* The end of a legacy-stream lend: the gate opens, the stream finishes, the
 * stamps hold, and once e is freed the release leaves nothing. */
static void legacy_lend_done(char **p, void *e, test_gate_t *g) {
  test_gate_open(g);
  assert_ok(gca_stream_synchronize(NULL));
  stamps_hold(p);
  free_ok(e);
  release_holes(p);
  test_gate_fini(g);
}

/* On the device's legacy stream a horizon runs with the device current: when
 * the driver cannot say which device is current (a sim fault in
 * ctx_get_device), the growth neither polls nor records a horizon and still
 * lends the holes' granules; once the stream is idle the release leaves
 * nothing. */
static void a_horizon_on_the_legacy_stream_that_cannot_find_the_device_still_lends(void **state) {
  (void)state;
  char *p[4];
  two_holes(p, NULL);
  test_gate_t g = TEST_GATE_INIT;
  assert_ok(gca_launch_host_func(NULL, test_gate_pass, &g));
  int64_t gets = calls("ctx_get_device"), records = calls("event_record");
  int64_t queries = calls("stream_query");
  assert_ok(gca_sim_fault_set("ctx_get_device:nth=1"));
  char *e = alloc_on(16 * MiB, NULL);
  gca_sim_fault_clear();
  check();
  assert_true(calls("ctx_get_device") > gets);
  assert_int_equal(calls("stream_query"), queries);
  assert_int_equal(calls("event_record"), records);
  assert_int_equal(stats().num_handle_moves, 8);
  legacy_lend_done(p, e, &g);
}

/* The same with another device current (GCA_SIM_DEVICES=2): the horizon
 * makes device 0 current for the legacy stream and device 1 current again
 * after. When the driver refuses the first switch (`nth` 1), nothing is
 * polled or recorded; when it refuses the switch back (`nth` 2), the horizon
 * was recorded and the failure is only logged. Either way the growth lends
 * the holes' granules and the release leaves nothing. */
static void legacy_stream_horizon_with_another_device_current(int nth) {
  assert_ok(gca_set_device(0));
  char *p[4];
  two_holes(p, NULL);
  test_gate_t g = TEST_GATE_INIT;
  assert_ok(gca_launch_host_func(NULL, test_gate_pass, &g));
  assert_ok(gca_set_device(1));
  int64_t sets = calls("ctx_set_device"), records = calls("event_record");
  int64_t queries = calls("stream_query");
  char fault[64];
  snprintf(fault, sizeof(fault), "ctx_set_device:nth=%d", nth);
  assert_ok(gca_sim_fault_set(fault));
  void *e = NULL;
  assert_ok(gca_malloc_device(0, &e, 16 * MiB, NULL));
  gca_sim_fault_clear();
  check();
  assert_true(calls("ctx_set_device") - sets >= nth);
  assert_int_equal(calls("stream_query") - queries, nth == 1 ? 0 : 1);
  assert_int_equal(calls("event_record") - records, nth == 1 ? 0 : 1);
  assert_int_equal(stats().num_handle_moves, 8);
  assert_ok(gca_set_device(0));
  legacy_lend_done(p, e, &g);
}

static void a_legacy_stream_horizon_that_cannot_switch_devices_still_lends(void **state) {
  (void)state;
  legacy_stream_horizon_with_another_device_current(1);
}

static void a_legacy_stream_horizon_that_cannot_switch_back_is_kept(void **state) {
  (void)state;
  legacy_stream_horizon_with_another_device_current(2);
}

static void *open_gate_after_using_the_allocator(void *arg) {
  gca_stream_t other = arg;
  struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
  void *x = NULL; /* would deadlock if the mover held the device lock */
  if (gca_malloc(&x, 4096, other) == GCA_OK)
    (void)gca_free(x);
  atomic_store(&gate, 1);
  return NULL;
}

/* Out of memory, a move takes free ranges of another stream's segment that
 * queued work may still use: it waits for that stream, with the device lock
 * let go (another thread allocates meanwhile), and unmaps only once the work
 * has run. S1 holds the two holes, S2 a 2 MiB block; the device is full when
 * S2 asks for 16 MiB. */
static void an_out_of_memory_move_waits_for_another_stream_with_the_lock_let_go(void **state) {
  (void)state;
  gca_stream_t s1, s2, other;
  assert_ok(gca_stream_create(&s1, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&other, GCA_STREAM_NON_BLOCKING));
  char *p[4];
  two_holes(p, s1);
  char *x = alloc_on(2 * MiB, s2);
  free_ok(alloc_on(4096, other)); /* cached: the other thread's request needs no memory */
  assert_ok(gca_sim_set_capacity(0, 44 * MiB));
  assert_ok(gca_set_config("expandable_moves:False")); /* a move only out of memory */
  atomic_int ran = 0;
  atomic_store(&gate, 0);
  assert_ok(gca_launch_host_func(s1, hold_stream, &ran)); /* "uses" the holes */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, open_gate_after_using_the_allocator, other), 0);
  char *e = alloc_on(16 * MiB, s2);
  assert_int_equal(atomic_load(&ran), 1); /* the queued work ran before the unmaps */
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_ptr_equal(e, x + 2 * MiB);
  assert_int_equal(stats().num_handle_moves, 8);
  stamps_hold(p);
  free_ok(e);
  free_ok(x);
  free_ok(p[1]);
  free_ok(p[3]);
  assert_nothing_leaked();
  assert_int_equal(calls("mem_create"), calls("mem_release") + 1); /* one was refused */
  assert_ok(gca_stream_destroy(s1));
  assert_ok(gca_stream_destroy(s2));
  assert_ok(gca_stream_destroy(other));
}

/* Out of memory, a move in the growing segment itself lends what queued work
 * may still use (Note [Lent granules]): the 16 MiB request on a full device
 * returns with the gate still shut, eight granules moved, no synchronize. */
static void an_out_of_memory_move_in_its_own_segment_lends_without_waiting(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  char *p[4];
  two_holes(p, s);
  assert_ok(gca_sim_set_capacity(0, 40 * MiB));
  assert_ok(gca_set_config("expandable_moves:False"));
  test_gate_t g = TEST_GATE_INIT;
  assert_ok(gca_launch_host_func(s, test_gate_pass, &g));
  int64_t syncs = calls("stream_synchronize"), unmaps = calls("mem_unmap");
  char *e = alloc_on(16 * MiB, s);
  check();
  assert_int_equal(stats().num_handle_moves, 8);
  assert_int_equal(stats().num_alloc_retries, 0);
  assert_int_equal(calls("stream_synchronize"), syncs);
  assert_int_equal(calls("mem_unmap"), unmaps);
  test_gate_open(&g);
  assert_ok(gca_stream_synchronize(s));
  stamps_hold(p);
  free_ok(e);
  free_ok(p[1]);
  free_ok(p[3]);
  assert_nothing_leaked();
  assert_int_equal(calls("mem_create"), calls("mem_release") + 1); /* one was refused */
  assert_ok(gca_stream_destroy(s));
  test_gate_fini(&g);
}

/* While any capture is under way nothing is unmapped: the growth creates
 * handles (the device pool's free granules stay where they are); after the
 * capture the same request moves them. */
static void nothing_moves_during_a_capture(void **state) {
  (void)state;
  gca_stream_t u, cs;
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&cs, GCA_STREAM_NON_BLOCKING));
  char *p[4];
  two_holes(p, u);
  gca_pool_t *pool;
  assert_ok(gca_pool_create(0, NULL, &pool));
  assert_ok(gca_stream_begin_capture(cs, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(gca_pool_begin_capture(pool, cs));
  int64_t unmaps = calls("mem_unmap"), syncs = calls("stream_synchronize");
  char *e = alloc_on(16 * MiB, u);
  assert_int_equal(calls("mem_unmap"), unmaps);
  assert_int_equal(calls("stream_synchronize"), syncs);
  assert_int_equal(stats().num_handle_moves, 0);
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 56 * MiB);
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(cs, &g));
  assert_ok(gca_pool_end_capture(pool, cs));
  assert_ok(gca_graph_destroy(g));
  assert_ok(gca_pool_release(pool));
  char *f = alloc_on(16 * MiB, u); /* no capture: the holes' granules move */
  assert_int_equal(stats().num_handle_moves, 8);
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 56 * MiB);
  stamps_hold(p);
  free_ok(e);
  free_ok(f);
  release_holes(p);
  assert_ok(gca_stream_destroy(u));
  assert_ok(gca_stream_destroy(cs));
}

/* Private pools keep one handle per growth and never give handles away. */
static void private_pools_neither_split_nor_move_handles(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool;
  assert_ok(gca_pool_create(0, NULL, &pool));
  assert_ok(gca_pool_use_begin(pool));
  int64_t creates = calls("mem_create");
  char *p[4];
  for (int i = 0; i < 4; i++)
    p[i] = alloc_on(10 * MiB, s);
  assert_int_equal(calls("mem_create") - creates, 4); /* one handle per growth */
  free_ok(p[0]);
  free_ok(p[2]);
  char *e = alloc_on(16 * MiB, s);
  assert_int_equal(stats().num_handle_moves, 0);
  assert_int_equal(calls("mem_create") - creates, 5);
  assert_ok(gca_pool_use_end(pool));
  free_ok(e);
  free_ok(p[1]);
  free_ok(p[3]);
  assert_ok(gca_pool_release(pool));
  assert_nothing_leaked();
  assert_ok(gca_stream_destroy(s));
}

/* Moves are opt-in (expandable_moves, default False): without them a request
 * the holes do not fit maps new handles at the frontier and nothing moves,
 * so a steady loop makes no driver calls once grown. */
static void without_expandable_moves_nothing_moves(void **state) {
  (void)state;
  assert_ok(gca_set_config("expandable_segments:True,expandable_moves:False"));
  gca_stream_t s = NULL;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  char *p[4];
  two_holes(p, s);
  int64_t unmaps = calls("mem_unmap"), creates = calls("mem_create");
  gca_stats_t st;
  assert_ok(gca_get_stats(0, &st));
  int64_t moves = st.num_handle_moves;
  char *q = alloc_on(16 * MiB, s);
  assert_int_equal(calls("mem_unmap"), unmaps); /* no free granule was taken */
  assert_true(calls("mem_create") > creates);   /* new granules instead */
  assert_ok(gca_get_stats(0, &st));
  assert_int_equal(st.num_handle_moves, moves);
  stamps_hold(p);
  free_ok(q);
  assert_ok(gca_stream_synchronize(s));
  release_holes(p);
  assert_ok(gca_stream_destroy(s));
}

/* Note [Moves within a bound]: with moves on, a growth moves free granules
 * only when creating would take reserved memory past peak live by more than
 * 1/256. A 24 MiB hole A beside a live block B, and a 28 MiB request past
 * B: with B = 8 GiB creating keeps reserved within the bound (8244 MiB
 * against 8220 live), so nothing moves; with B = 256 MiB it
 * would not (308 against 284), so A's twelve granules move and two are
 * created (A, just freed, sits in the free cache: the move returns it to the
 * tree first). The third round, B = 256 MiB again, moves as the first: the
 * empty_cache that ended the 8 GiB round started the bound's peak over. Data
 * intact throughout. */
static void moves_wait_for_waste_past_the_bound(void **state) {
  (void)state;
  static const struct {
    size_t live;
    int64_t moves, creates;
  } r[] = {{256 * MiB, 12, 2}, {8192 * MiB, 0, 14}, {256 * MiB, 12, 2}};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(r); k++) {
    assert_ok(gca_reset_peak_stats(0));
    assert_ok(gca_reset_accumulated_stats(0));
    char *a = alloc_on(24 * MiB, NULL), *b = alloc_on(r[k].live, NULL);
    stamp_fill(b + r[k].live - 4 * MiB, 4 * MiB, 0xc0); /* the end beside the growth */
    free_ok(a);
    int64_t creates = calls("mem_create");
    char *c = alloc_on(28 * MiB, NULL);
    gca_stats_t st = stats();
    assert_int_equal(st.num_handle_moves, r[k].moves);
    assert_int_equal(calls("mem_create") - creates, r[k].creates);
    assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current,
                     (int64_t)r[k].live + (r[k].moves ? 28 : 52) * (int64_t)MiB);
    stamp_fill(c, 28 * MiB, 0xc1);
    assert_int_equal(stamp_mismatch(b + r[k].live - 4 * MiB, 4 * MiB, 0xc0), -1);
    check();
    free_ok(c);
    free_ok(b);
    assert_nothing_leaked();
  }
}

/* Note [Moves across segments]: a growth on stream S2 whose own segment
 * holds no free granule takes them from S1's segment: S1 holds A (10 MiB,
 * freed) and B (10 MiB), S2 holds X (2 MiB); a 16 MiB request on S2 moves
 * A's five granules (S1's stream found idle) and creates three. Out
 * of host memory to gather them (fail point expand_gather), the five are
 * released and the growth creates all eight. Data intact, the growth at X's
 * end, nothing leaked either way. */
static void a_growth_takes_granules_from_another_streams_segment(void **state) {
  (void)state;
  static const struct {
    const char *point;
    int64_t moves, creates, releases;
  } r[] = {{NULL, 5, 3, 0}, {"expand_gather", 0, 8, 5}};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(r); k++) {
    gca_stream_t s1, s2;
    assert_ok(gca_stream_create(&s1, GCA_STREAM_NON_BLOCKING));
    assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
    assert_ok(gca_reset_accumulated_stats(0));
    char *a = alloc_on(10 * MiB, s1), *b = alloc_on(10 * MiB, s1), *x = alloc_on(2 * MiB, s2);
    stamp_fill(b, 10 * MiB, 0xe1);
    stamp_fill(x, 2 * MiB, 0xe2);
    free_ok(a);
    int64_t creates = calls("mem_create"), releases = calls("mem_release");
    int64_t syncs = calls("stream_synchronize"), queries = calls("stream_query");
    if (r[k].point != NULL)
      assert_ok(gca__failpoint_arm(r[k].point, 1));
    char *c = alloc_on(16 * MiB, s2);
    gca__failpoint_clear();
    check();
    gca_stats_t st = stats();
    assert_ptr_equal(c, x + 2 * MiB);
    assert_int_equal(st.num_handle_moves, r[k].moves);
    assert_int_equal(calls("mem_create") - creates, r[k].creates);
    assert_int_equal(calls("mem_release") - releases, r[k].releases);
    assert_int_equal(calls("stream_synchronize"), syncs); /* S1 idle: Note [Move horizons] */
    assert_true(calls("stream_query") > queries);
    assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 28 * MiB);
    stamp_fill(c, 16 * MiB, 0xe3);
    assert_int_equal(stamp_mismatch(b, 10 * MiB, 0xe1), -1);
    assert_int_equal(stamp_mismatch(x, 2 * MiB, 0xe2), -1);
    free_ok(c);
    free_ok(b);
    free_ok(x);
    assert_ok(gca_stream_synchronize(s1));
    assert_ok(gca_stream_synchronize(s2));
    assert_nothing_leaked();
    assert_ok(gca_stream_destroy(s1));
    assert_ok(gca_stream_destroy(s2));
  }
}

/* Note [Moves across segments]: the small and the large pool's granules are
 * handles of one size, so a large growth takes the free granules of its
 * stream's small-pool segment: X (4 MiB, large) live, six 1 MiB blocks
 * (small, three granules) freed; an 8 MiB request after X lacks 8 MiB and
 * moves the three granules, creating one; behind a shut gate the small
 * segment's granules are lent instead, with no wait. Data intact, nothing
 * leaked. */
static void a_large_growth_takes_granules_from_the_small_pool(void **state) {
  (void)state;
  for (int busy = 0; busy < 2; busy++) {
    gca_stream_t s;
    assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
    assert_ok(gca_reset_accumulated_stats(0));
    char *x = alloc_on(4 * MiB, s), *q[6];
    stamp_fill(x, 4 * MiB, 0xf1);
    for (int i = 0; i < 6; i++)
      q[i] = alloc_on(MiB, s);
    for (int i = 0; i < 6; i++)
      free_ok(q[i]);
    test_gate_t g = TEST_GATE_INIT;
    if (busy)
      assert_ok(gca_launch_host_func(s, test_gate_pass, &g));
    int64_t creates = calls("mem_create"), unmaps = calls("mem_unmap");
    int64_t syncs = calls("stream_synchronize");
    char *c = alloc_on(8 * MiB, s);
    check();
    gca_stats_t st = stats();
    assert_ptr_equal(c, x + 4 * MiB);
    assert_int_equal(st.num_handle_moves, 3);
    assert_int_equal(calls("mem_create") - creates, 1);
    assert_int_equal(calls("mem_unmap") - unmaps, busy ? 0 : 1);
    assert_int_equal(calls("stream_synchronize"), syncs);
    assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 12 * MiB);
    assert_int_equal(st.reserved_bytes[GCA_STAT_SMALL].current, 0);
    stamp_fill(c, 8 * MiB, 0xf2);
    assert_int_equal(stamp_mismatch(x, 4 * MiB, 0xf1), -1);
    test_gate_open(&g);
    assert_ok(gca_stream_synchronize(s));
    free_ok(c);
    free_ok(x);
    assert_nothing_leaked();
    assert_int_equal(calls("mem_create"), calls("mem_release"));
    assert_ok(gca_stream_destroy(s));
    test_gate_fini(&g);
  }
}

/* The bound's peak outlives gca_reset_peak_stats (as a training loop calls
 * it every step): A (512 MiB), a 2 MiB spacer and C (512 MiB), A and C freed,
 * the peak statistics reset; a 514 MiB request grows C's range by one granule
 * without moving A's: reserved 1028 MiB is within the bound of the 1026 MiB
 * peak reached before the reset, not of the 516 MiB live now. */
static void the_bound_remembers_peaks_reset_by_the_statistics(void **state) {
  (void)state;
  char *a = alloc_on(512 * MiB, NULL), *spacer = alloc_on(2 * MiB, NULL);
  char *c = alloc_on(512 * MiB, NULL);
  free_ok(a);
  free_ok(c);
  assert_ok(gca_reset_peak_stats(0));
  int64_t creates = calls("mem_create");
  char *d = alloc_on(514 * MiB, NULL);
  gca_stats_t st = stats();
  assert_ptr_equal(d, c);
  assert_int_equal(st.num_handle_moves, 0);
  assert_int_equal(calls("mem_create") - creates, 1);
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 1028 * MiB);
  check();
  free_ok(d);
  free_ok(spacer);
  assert_nothing_leaked();
}

/* A 64 MiB device, moves off: three 20 MiB blocks, the first freed; a 24 MiB
 * request lacks memory for new handles. With `fault` set while it is served,
 * it must still succeed with ten granules moved and no retry, having created
 * `creates` handles and released `releases`; data intact, nothing leaked. */
static void full_device_serves_24_mib(const char *fault, int64_t creates, int64_t releases) {
  assert_ok(gca_sim_set_capacity(0, 64 * MiB));
  assert_ok(gca_set_config("expandable_segments:True,expandable_moves:False"));
  char *p[3];
  for (int i = 0; i < 3; i++)
    p[i] = alloc_on(20 * MiB, NULL);
  stamp_fill(p[1], 20 * MiB, 0xa1);
  stamp_fill(p[2], 20 * MiB, 0xa2);
  free_ok(p[0]);
  int64_t released = calls("mem_release"), created = calls("mem_create");
  if (fault != NULL)
    assert_ok(gca_sim_fault_set(fault));
  char *q = alloc_on(24 * MiB, NULL);
  gca_sim_fault_clear();
  check();
  gca_stats_t st = stats();
  assert_int_equal(st.num_handle_moves, 10);
  assert_int_equal(st.num_alloc_retries, 0); /* the cache was not released */
  assert_int_equal(calls("mem_create") - created, creates);
  assert_int_equal(calls("mem_release") - released, releases);
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 64 * MiB);
  stamp_fill(q, 24 * MiB, 0xa3);
  assert_int_equal(stamp_mismatch(p[1], 20 * MiB, 0xa1), -1);
  assert_int_equal(stamp_mismatch(p[2], 20 * MiB, 0xa2), -1);
  assert_int_equal(stamp_mismatch(q, 24 * MiB, 0xa3), -1);
  free_ok(q);
  free_ok(p[1]);
  free_ok(p[2]);
  assert_nothing_leaked();
  assert_int_equal(calls("mem_create"), calls("mem_release") + 1); /* one was refused */
}

/* Note [Moves on out of memory] (release.c): with moves off, a growth the
 * device has no memory for moves the free granules of the segment to where
 * the request needs them, before releasing the whole cache and retrying (which
 * would give back everything cached and create it again). The first try
 * creates the two granules that fit and is refused the third; the two stay
 * mapped (the request's first 4 MiB) and the move brings the hole's ten:
 * nothing created twice, nothing given back. */
static void out_of_memory_moves_free_granules_with_moves_off(void **state) {
  (void)state;
  full_device_serves_24_mib(NULL, 3, 0);
  assert_int_equal(stats().num_device_alloc, 5); /* three blocks, the kept start, the moved rest */
}

/* The kept start of a refused growth cannot be opened (set_access fails):
 * the growth is undone as before (the two granules given back), the moves
 * bring the hole's ten and the retry creates the two again. */
static void a_kept_start_that_cannot_be_opened_is_given_back(void **state) {
  (void)state;
  full_device_serves_24_mib("mem_set_access:nth=1", 5, 2);
}

/* A growth at a hole's end leaves the free block before the hole to the
 * moves: A, P (4 MiB, free), a 10 MiB hole, N (10 MiB, free), B on a device
 * with no memory left. A 14 MiB request maps 4 MiB at the hole's end beside
 * N, and P's two granules move there: no release of the cache, no retry. */
static void a_growth_at_a_holes_end_takes_the_free_block_before_it(void **state) {
  (void)state;
  assert_ok(gca_sim_set_capacity(0, 64 * MiB));
  assert_ok(gca_set_config("expandable_segments:True,expandable_moves:False"));
  char *a = alloc_on(10 * MiB, NULL), *p = alloc_on(4 * MiB, NULL), *y = alloc_on(10 * MiB, NULL);
  char *n = alloc_on(10 * MiB, NULL), *b = alloc_on(10 * MiB, NULL);
  stamp_fill(a, 10 * MiB, 0xd1);
  stamp_fill(b, 10 * MiB, 0xd2);
  free_ok(y);
  assert_ok(gca_empty_cache()); /* y becomes the hole */
  free_ok(p);
  free_ok(n);
  assert_ok(gca_sim_set_capacity(0, 34 * MiB)); /* all of it mapped */
  int64_t releases = calls("mem_release");
  char *x = alloc_on(14 * MiB, NULL);
  check();
  assert_ptr_equal(x, y + 6 * MiB);
  gca_stats_t st = stats();
  assert_int_equal(st.num_handle_moves, 2);
  assert_int_equal(st.num_alloc_retries, 0);
  assert_int_equal(calls("mem_release"), releases);
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 34 * MiB);
  stamp_fill(x, 14 * MiB, 0xd3);
  assert_int_equal(stamp_mismatch(a, 10 * MiB, 0xd1), -1);
  assert_int_equal(stamp_mismatch(b, 10 * MiB, 0xd2), -1);
  free_ok(x);
  free_ok(a);
  free_ok(b);
  assert_nothing_leaked();
}

/* An expandable segment reserves twice the device's memory: holes between
 * live blocks leave address space that no request fits, and under memory
 * pressure the request that fits physically must still find a range. On a
 * 100 MiB device, 40 MiB blocks A and B with A freed: a 50 MiB request fits
 * only after B (80 MiB into the segment, past 1.125 x 100 MiB), with A's
 * granules moved there for what the device could not create. */
static void a_request_past_the_holes_finds_address_space(void **state) {
  (void)state;
  assert_ok(gca_sim_set_capacity(0, 100 * MiB));
  assert_ok(gca_set_config("expandable_segments:True,expandable_moves:False"));
  char *a = alloc_on(40 * MiB, NULL), *b = alloc_on(40 * MiB, NULL);
  stamp_fill(b, 40 * MiB, 0xb0);
  free_ok(a);
  int64_t creates = calls("mem_create");
  char *c = alloc_on(50 * MiB, NULL);
  assert_true(c >= b + 40 * MiB); /* past B: A's range is too small */
  gca_stats_t st = stats();
  /* the ten granules the device had left, created and kept, then fifteen of A's */
  assert_int_equal(calls("mem_create"), creates + 11); /* the eleventh refused */
  assert_int_equal(st.num_handle_moves, 15);
  assert_int_equal(st.num_alloc_retries, 0);
  assert_int_equal(stamp_mismatch(b, 40 * MiB, 0xb0), -1);
  free_ok(c);
  free_ok(b);
  assert_nothing_leaked();
}

int main(void) {
  /* the legacy-stream horizon tests switch to device 1 (meson.build sets it
   * too): run by hand, the binary gets the same sim */
  setenv("GCA_SIM_DEVICES", "2", 0);
  const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, exp_setup, exp_teardown)
      T(moves_keep_the_data_of_live_blocks),
      T(moves_under_a_busy_stream_keep_stream_ordered_data),
      T(moves_under_busy_streams_of_two_threads_keep_their_data),
      T(an_unmap_fault_mid_move_falls_back_to_new_handles),
      T(a_map_fault_after_a_move_fails_the_request_cleanly),
      T(an_unmap_fault_while_undoing_a_growth_keeps_the_start_cached),
      T(host_oom_in_a_growth_is_retried),
      T(host_oom_for_parked_handles_grows_instead),
      T(a_move_lends_ranges_that_queued_work_may_use),
      T(a_horizon_covers_what_was_freed_before_it),
      T(an_out_of_memory_move_waits_for_another_stream_with_the_lock_let_go),
      T(an_out_of_memory_move_in_its_own_segment_lends_without_waiting),
      T(a_failed_horizon_step_still_moves_or_creates),
      T(a_lent_range_that_fails_to_unmap_is_unmapped_later),
      T(a_horizon_on_the_legacy_stream_that_cannot_find_the_device_still_lends),
      T(a_legacy_stream_horizon_that_cannot_switch_devices_still_lends),
      T(a_legacy_stream_horizon_that_cannot_switch_back_is_kept),
      T(nothing_moves_during_a_capture),
      T(private_pools_neither_split_nor_move_handles),
      T(without_expandable_moves_nothing_moves),
      T(moves_wait_for_waste_past_the_bound),
      T(the_bound_remembers_peaks_reset_by_the_statistics),
      T(a_growth_takes_granules_from_another_streams_segment),
      T(a_large_growth_takes_granules_from_the_small_pool),
      T(out_of_memory_moves_free_granules_with_moves_off),
      T(a_kept_start_that_cannot_be_opened_is_given_back),
      T(a_growth_at_a_holes_end_takes_the_free_block_before_it),
      T(a_request_past_the_holes_finds_address_space),
#undef T
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
