/* SPDX-License-Identifier: Apache-2.0 */
/* test_expand_space.c - the address space of expandable segments: ranges
 * lent to a growth (Note [Lent granules]) hold address space until the
 * segment's stream has passed them, and a growth that finds no hole because
 * of them waits for that stream alone, not for the whole cache's release
 * (Note [Lent address space], release.c). Its stream is held by a host
 * function until another thread sees the wait begin; faults in the wait and
 * host out-of-memory for its batch leave the cache's release to serve it. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "alloc_fixture.h"
#include "gca.h"
#include "support.h"

static atomic_int gate = 1;
static atomic_int ran; /* set by hold_stream once the gate let it through */

static int exp_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("expandable_segments:True,expandable_moves:True"));
  return 0;
}

static int exp_teardown(void **state) {
  atomic_store(&gate, 1);
  return alloc_teardown(state);
}

static int64_t calls(const char *op) {
  return gca_sim_call_count(op);
}

/* A host function that holds its stream until the gate opens. */
static void hold_stream(void *arg) {
  (void)arg;
  while (atomic_load(&gate) == 0)
    sched_yield();
  atomic_store(&ran, 1);
}

static void *open_gate_at_a_synchronize(void *arg) {
  int64_t before = *(int64_t *)arg;
  while (calls("stream_synchronize") == before)
    sched_yield();
  atomic_store(&gate, 1);
  return NULL;
}

/* The layout of Note [Lent address space] (release.c) on a 66 MiB device,
 * whose segment reserves 132 MiB: X (2 MiB), A (60) and Y (2) on s; A freed
 * behind a shut gate, B (62) lends A's granules and creates one; B freed and
 * split into E1 (30, freed), W (2) and E2 (30, freed). A 50 MiB request then
 * finds no hole (6 MiB after E2, A's range lent) while 60 MiB of the device
 * are free. *x, *y, *w are stamped. */
static void lent_range_in_the_way(gca_stream_t s, char **x, char **y, char **w) {
  assert_ok(gca_sim_set_capacity(0, 66 * MiB));
  *x = alloc_on(2 * MiB, s);
  char *a = alloc_on(60 * MiB, s);
  *y = alloc_on(2 * MiB, s);
  assert_ptr_equal(a, *x + 2 * MiB);
  assert_ptr_equal(*y, a + 60 * MiB);
  atomic_store(&ran, 0);
  atomic_store(&gate, 0);
  assert_ok(gca_launch_host_func(s, hold_stream, NULL)); /* "uses" A */
  free_ok(a);
  char *b = alloc_on(62 * MiB, s);
  assert_ptr_equal(b, *y + 2 * MiB);
  assert_int_equal(stats().num_handle_moves, 30); /* A's granules, lent */
  free_ok(b);
  char *e1 = alloc_on(30 * MiB, s);
  *w = alloc_on(2 * MiB, s);
  char *e2 = alloc_on(30 * MiB, s);
  assert_ptr_equal(e1, b);
  assert_ptr_equal(e2, *w + 2 * MiB);
  free_ok(e1);
  free_ok(e2);
  stamp_fill(*x, 2 * MiB, 0x11);
  stamp_fill(*y, 2 * MiB, 0x22);
  stamp_fill(*w, 2 * MiB, 0x33);
  check();
  assert_int_equal(atomic_load(&ran), 0);
  gca_stats_t st = stats();
  assert_int_equal(st.lent_bytes.current, 60 * MiB); /* A's range */
  assert_int_equal(st.lent_bytes.peak, 60 * MiB);
  assert_int_equal(st.num_lent_waits, 0);
}

static void lent_range_gone(gca_stream_t s, char *x, char *y, char *w, char *r, int refused) {
  assert_int_equal(atomic_load(&ran), 1); /* the wait let A's work run first */
  assert_int_equal(stamp_mismatch(x, 2 * MiB, 0x11), -1);
  assert_int_equal(stamp_mismatch(y, 2 * MiB, 0x22), -1);
  assert_int_equal(stamp_mismatch(w, 2 * MiB, 0x33), -1);
  stamp_fill(r, 50 * MiB, 0x44);
  assert_int_equal(stamp_mismatch(r, 50 * MiB, 0x44), -1);
  free_ok(r);
  free_ok(x);
  free_ok(y);
  free_ok(w);
  assert_nothing_leaked();
  assert_int_equal(calls("mem_create"), calls("mem_release") + refused);
  assert_ok(gca_stream_destroy(s));
}

/* Note [Lent address space]: a growth that finds no hole because lent
 * ranges hold the address space waits for its own stream alone (with the
 * lock let go: the gate is opened by another thread once the synchronize
 * began), unmaps them and is served in A's range with E1's and E2's granules
 * moved there: no release of the cache, no retry, nothing created again. */
static void a_growth_that_lent_ranges_block_waits_for_its_stream_only(void **state) {
  (void)state;
  gca_stream_t s;
  char *x, *y, *w;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  lent_range_in_the_way(s, &x, &y, &w);
  int64_t syncs = calls("stream_synchronize"), releases = calls("mem_release");
  int64_t creates = calls("mem_create");
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, open_gate_at_a_synchronize, &syncs), 0);
  char *r = alloc_on(50 * MiB, s);
  assert_int_equal(pthread_join(t, NULL), 0);
  check();
  gca_stats_t st = stats();
  assert_ptr_equal(r, x + 2 * MiB);
  assert_int_equal(calls("stream_synchronize") - syncs, 1);
  assert_int_equal(st.num_alloc_retries, 0);
  assert_int_equal(calls("mem_release"), releases);
  assert_int_equal(calls("mem_create") - creates, 1); /* refused: the device is full */
  assert_int_equal(st.num_handle_moves, 30 + 25);
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 66 * MiB);
  assert_int_equal(st.num_lent_waits, 1);
  assert_int_equal(st.lent_bytes.current, 0);
  assert_int_equal(st.lent_bytes.freed, 60 * MiB);
  assert_ok(gca_reset_peak_stats(0)); /* the lent statistics reset with the others */
  assert_int_equal(stats().lent_bytes.peak, 0);
  assert_ok(gca_reset_accumulated_stats(0));
  st = stats();
  assert_int_equal(st.num_lent_waits, 0);
  assert_int_equal(st.lent_bytes.allocated, 0);
  assert_int_equal(st.lent_bytes.freed, 0);
  lent_range_gone(s, x, y, w, r, 1);
}

/* The same with the wait refused (the synchronize faulted) or no host
 * memory for its batch (fail point lent_wait): logged, the cache is
 * released and the retry serves the request; valid, nothing leaked. */
static void failed_wait_for_lent_ranges(bool fault) {
  gca_stream_t s;
  char *x, *y, *w;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  lent_range_in_the_way(s, &x, &y, &w);
  int64_t syncs = calls("stream_synchronize"), releases = calls("mem_release");
  int64_t retries = stats().num_alloc_retries;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, open_gate_at_a_synchronize, &syncs), 0);
  if (fault)
    assert_ok(gca_sim_fault_set("stream_synchronize:nth=1"));
  else
    assert_ok(gca__failpoint_arm("lent_wait", 1));
  char *r = alloc_on(50 * MiB, s);
  gca_sim_fault_clear();
  gca__failpoint_clear();
  assert_int_equal(pthread_join(t, NULL), 0);
  check();
  gca_stats_t st = stats();
  assert_int_equal(st.num_alloc_retries - retries, 1); /* the cache's release */
  assert_int_equal(st.num_lent_waits, fault ? 1 : 0);  /* a wait made, and refused */
  assert_int_equal(st.lent_bytes.current, 0);          /* the release waited too */
  assert_true(calls("mem_release") > releases);
  assert_ptr_equal(r, x + 2 * MiB);
  lent_range_gone(s, x, y, w, r, 0); /* the retry found the memory released */
}

static void a_failed_wait_for_lent_ranges_releases_the_cache(void **state) {
  (void)state;
  failed_wait_for_lent_ranges(true);
}

static void no_host_memory_to_wait_for_lent_ranges_releases_the_cache(void **state) {
  (void)state;
  failed_wait_for_lent_ranges(false);
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, exp_setup, exp_teardown)
      T(a_growth_that_lent_ranges_block_waits_for_its_stream_only),
      T(a_failed_wait_for_lent_ranges_releases_the_cache),
      T(no_host_memory_to_wait_for_lent_ranges_releases_the_cache),
#undef T
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
