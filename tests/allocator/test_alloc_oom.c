/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_oom.c - running out of device memory on a small sim device:
 * cached blocks are freed and the allocation retried before anything fails
 * (oversize blocks first under max_split_size, then everything cached after
 * waiting for pending frees); an impossible request fails with the full
 * message, counts an OOM, calls the observers without locks held, and leaves
 * the allocator working; memory fraction and limit cap what is reserved. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include <time.h>

#include "alloc_fixture.h"

static void small_device(uint64_t bytes) {
  assert_ok(gca_sim_set_capacity(0, bytes));
}

static void retry_after_releasing_cache_succeeds(void **state) {
  (void)state;
  small_device(22 * MiB);
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *a = alloc_on(5 * MiB, NULL);
  void *b = alloc_on(1000, NULL);
  free_ok(a);                     /* its 20 MiB segment stays cached for the NULL stream */
  void *c = alloc_on(4 * MiB, s); /* needs a new segment: the cache is released first */
  gca_stats_t st = stats();
  assert_int_equal(st.num_alloc_retries, 1);
  assert_int_equal(st.num_ooms, 0);
  assert_int_equal(st.num_device_free, 1);
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 22 * MiB);
  free_ok(c);
  free_ok(b);
  assert_ok(gca_empty_cache());
  assert_ok(gca_stream_destroy(s));
}

typedef struct seen {
  int calls;
  int device;
  size_t requested, allocated, free_bytes;
  int64_t ooms_inside;
} seen_t;

static void observer(int device, size_t requested, size_t allocated, size_t free_bytes, void *ctx) {
  seen_t *s = ctx;
  s->calls++;
  s->device = device;
  s->requested = requested;
  s->allocated = allocated;
  s->free_bytes = free_bytes;
  gca_stats_t st;
  /* would deadlock if the allocator's lock were held */
  if (gca_get_stats(0, &st) == GCA_OK)
    s->ooms_inside = st.num_ooms;
}

/* gca__segments_stuck_bytes of device 0, under its lock. */
static bool stuck_walk(size_t *n) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  gca__dev_lock(d);
  bool counted = gca__segments_stuck_bytes(d, n);
  gca__dev_unlock(d);
  return counted;
}

/* The same, which must have counted. */
static size_t stuck_bytes(void) {
  size_t n;
  assert_true(stuck_walk(&n));
  return n;
}

/* A request of 100 MiB, more than any test's device holds: it fails with
 * GCA_ERR_OUT_OF_MEMORY and leaves the pointer NULL. Fails the test unless
 * the message holds every string of want. */
static void impossible_request(const char *const *want, size_t n) {
  void *p = (void *)1;
  assert_status(gca_malloc(&p, 100 * MiB, NULL), GCA_ERR_OUT_OF_MEMORY, "malloc: out of memory");
  const char *msg = gca_last_error();
  for (size_t i = 0; i < n; i++)
    if (strstr(msg, want[i]) == NULL)
      fail_msg("OOM message '%s' lacks '%s'", msg, want[i]);
  assert_null(p);
}

static void impossible_request_fails_with_full_message(void **state) {
  (void)state;
  small_device(8 * MiB);
  seen_t seen = {0};
  assert_ok(gca_register_oom_observer(observer, &seen));
  void *a = alloc_on(1000, NULL);
  /* the segment holds a: none of its free bytes can be given back */
  const char *want[] = {"device 0",
                        "tried to allocate 100.00 MiB",
                        "104857600 bytes",
                        "device total 8.00 MiB",
                        "6.00 MiB free",
                        "allocated 1.00 KiB",
                        "reserved 2.00 MiB",
                        "reserved but unallocated 2.00 MiB (2.00 MiB of it beside blocks in use)",
                        "private pools 0 B"};
  impossible_request(want, GCA_ARRAY_SIZE(want));
  check();
  gca_stats_t st = stats();
  assert_int_equal(st.num_ooms, 1);
  assert_int_equal(st.num_alloc_retries, 1);
  assert_int_equal(st.allocation[GCA_STAT_ALL].current, 1);
  assert_int_equal(seen.calls, 1);
  assert_int_equal(seen.device, 0);
  assert_int_equal(seen.requested, 100 * MiB);
  assert_int_equal(seen.allocated, 1024);
  assert_int_equal(seen.free_bytes, 6 * MiB);
  assert_int_equal(seen.ooms_inside, 1);
  /* still works */
  void *b = alloc_on(1 * MiB, NULL);
  free_ok(b);
  free_ok(a);
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 2 * MiB);
  assert_int_equal(stuck_bytes(), 0); /* a cached segment with no block in use */
}

/* With expandable segments the memory beside blocks in use is what lies in
 * granules they share: a freed block's whole granule is given back before
 * the failure, its part of the granule it shares with a live block is not,
 * and the message says so. Freed, that granule goes back too. */
static void oom_message_counts_granules_shared_with_blocks_in_use(void **state) {
  (void)state;
  small_device(16 * MiB);
  assert_ok(gca_set_config("expandable_segments:True"));
  void *a = alloc_on(3 * MiB, NULL), *b = alloc_on(3 * MiB, NULL);
  assert_int_equal((uintptr_t)b - (uintptr_t)a, 3 * MiB); /* granule [2, 4) MiB holds both */
  free_ok(a);
  /* of a's 3 MiB, granule [0, 2) could go back; [2, 3) shares b's granule */
  assert_int_equal(stuck_bytes(), 1 * MiB);
  const char *want[] = {"allocated 3.00 MiB", "reserved 4.00 MiB",
                        "reserved but unallocated 1.00 MiB (1.00 MiB of it beside blocks in use)"};
  impossible_request(want, GCA_ARRAY_SIZE(want));
  check();
  gca_stats_t st = stats();
  assert_int_equal(st.num_ooms, 1);
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 4 * MiB);
  free_ok(b);
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
}

/* Past GCA__STUCK_WALK_MAX block records the message does not walk them
 * (it holds the device lock: at 10^6 blocks the walk took 100 ms) and says
 * so; the walk's own answer is false, nothing counted. */
static void oom_message_does_not_walk_many_blocks(void **state) {
  (void)state;
  small_device(64 * MiB);
  size_t n = GCA__STUCK_WALK_MAX + 1;
  void **v = calloc(n, sizeof(*v));
  assert_non_null(v);
  for (size_t i = 0; i < n; i++) /* no walk after each: checked once below */
    assert_ok(gca_malloc(&v[i], 512, NULL));
  check();
  size_t stuck = 1;
  assert_false(stuck_walk(&stuck));
  assert_int_equal(stuck, 0);
  const char *want[] = {"reserved but unallocated", "(beside blocks in use: not counted past 16384 "
                                                    "blocks)"};
  impossible_request(want, GCA_ARRAY_SIZE(want));
  check();
  for (size_t i = 0; i < n; i++)
    assert_ok(gca_free(v[i]));
  free(v);
  check();
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
}

static void oversize_blocks_are_released_first(void **state) {
  (void)state;
  small_device(100 * MiB);
  assert_ok(gca_set_config("max_split_size_mb:30"));
  void *a = alloc_on(40 * MiB, NULL);
  void *b = alloc_on(40 * MiB, NULL);
  void *keep = alloc_on(1000, NULL);
  free_ok(a);
  free_ok(b);
  void *c = alloc_on(60 * MiB, NULL); /* both cached 40 MiB blocks are given back */
  gca_stats_t st = stats();
  assert_int_equal(st.num_alloc_retries, 0);
  assert_int_equal(st.num_sync_all_streams, 0);
  assert_int_equal(st.num_device_free, 2);
  assert_int_equal(st.segment[GCA_STAT_ALL].current, 2);
  free_ok(c);
  free_ok(keep);
}

/* Work on a stream that lasts until the test opens the gate; the opener waits
 * until the allocator has begun to wait for it (the sim counts the
 * event_synchronize call at its entry), so the order is certain. */
static atomic_int oom_gate;
static int64_t sync_calls_before;

static void hold_until_open(void *arg) {
  (void)arg;
  while (atomic_load(&oom_gate) == 0)
    usleep(100);
}

static void *open_once_synchronizing(void *arg) {
  (void)arg;
  while (gca_sim_call_count("event_synchronize") <= sync_calls_before)
    usleep(100);
  atomic_store(&oom_gate, 1);
  return NULL;
}

static void pending_frees_are_awaited_before_failing(void **state) {
  (void)state;
  small_device(2 * MiB);
  gca_stream_t s, u;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  void *a = alloc_on(1000, NULL);
  assert_ok(gca_record_stream(a, u));
  atomic_store(&oom_gate, 0);
  assert_ok(gca_launch_host_func(u, hold_until_open, NULL));
  free_ok(a); /* pending on u's event, which cannot complete before the gate opens */
  sync_calls_before = gca_sim_call_count("event_synchronize");
  pthread_t opener;
  assert_int_equal(pthread_create(&opener, NULL, open_once_synchronizing, NULL), 0);
  void *b = alloc_on(1000, s); /* the device is full: must wait for u */
  pthread_join(opener, NULL);
  gca_stats_t st = stats();
  assert_int_equal(st.num_sync_all_streams, 1);
  assert_int_equal(st.num_alloc_retries, 1);
  assert_int_equal(st.num_ooms, 0);
  free_ok(b);
  assert_ok(gca_empty_cache());
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(u));
}

static void memory_limit_caps_reserved(void **state) {
  (void)state;
  assert_ok(gca_set_memory_limit(0, 4 * MiB));
  void *a = alloc_on(1000, NULL);
  void *p;
  assert_status(gca_malloc(&p, 3 * MiB, NULL), GCA_ERR_OUT_OF_MEMORY, "limit 4.00 MiB");
  check();
  assert_int_equal(stats().num_ooms, 1);
  assert_ok(gca_set_memory_limit(0, 0));
  void *b = alloc_on(3 * MiB, NULL);
  free_ok(b);
  free_ok(a);
}

static void memory_fraction_caps_reserved(void **state) {
  (void)state;
  small_device(40 * MiB);
  assert_ok(gca_set_memory_fraction(0, 0.5));
  void *a = alloc_on(5 * MiB, NULL);
  void *p;
  assert_status(gca_malloc(&p, 1000, NULL), GCA_ERR_OUT_OF_MEMORY, "limit 20.00 MiB");
  check();
  free_ok(a);
  assert_status(gca_set_memory_fraction(0, 0.0), GCA_ERR_INVALID_ARGUMENT, "fraction");
  assert_status(gca_set_memory_fraction(0, 1.5), GCA_ERR_INVALID_ARGUMENT, "fraction");
  assert_status(gca_set_memory_fraction(0, NAN), GCA_ERR_INVALID_ARGUMENT, "fraction");
  assert_status(gca_set_memory_fraction(77, 0.5), GCA_ERR_INVALID_ARGUMENT, "device 77");
}

static void garbage_collection_frees_old_cached_segments(void **state) {
  (void)state;
  small_device(200 * MiB);
  assert_ok(gca_set_config("garbage_collection_threshold:0.5"));
  assert_ok(gca_set_memory_fraction(0, 1.0));
  void *big[4];
  for (int i = 0; i < 4; i++)
    big[i] = alloc_on(30 * MiB, NULL); /* 120 MiB reserved, > 0.5 * 200 */
  for (int i = 0; i < 4; i++)
    free_ok(big[i]);
  for (int i = 0; i < 3; i++) { /* reuse one; the other three age (get_free_block calls) */
    void *x = alloc_on(30 * MiB, NULL);
    free_ok(x);
  }
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *y = alloc_on(1 * MiB + 512, s); /* cannot reuse: GC runs before a new segment */
  gca_stats_t st = stats();
  assert_int_equal(st.num_device_free, 3); /* the three older than average */
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 30 * MiB + 20 * MiB);
  assert_int_equal(st.num_ooms, 0);
  free_ok(y);
  assert_ok(gca_empty_cache());
  assert_ok(gca_stream_destroy(s));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(retry_after_releasing_cache_succeeds, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(impossible_request_fails_with_full_message, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(oom_message_counts_granules_shared_with_blocks_in_use,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(oom_message_does_not_walk_many_blocks, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(oversize_blocks_are_released_first, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(pending_frees_are_awaited_before_failing, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(memory_limit_caps_reserved, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(memory_fraction_caps_reserved, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(garbage_collection_frees_old_cached_segments, alloc_setup,
                                      alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
