/* SPDX-License-Identifier: Apache-2.0 */
/* test_trace_observer.c - the public trace observers (gca_trace_observer_add/
 * remove): every event the history records reaches each attached observer in
 * order, with the device's reserved and allocated bytes after the event;
 * removal stops the calls at once, even while another thread allocates; bad
 * arguments, a full registry and calls from inside a callback are refused; and
 * with no observer attached the allocator's recorder bit is clear (its fast
 * paths run). */
#include <pthread.h>
#include <stdatomic.h>

#include "alloc_fixture.h"

#define MAX_SEEN 64

typedef struct seen {
  gca_trace_event_t ev[MAX_SEEN];
  int n;
  int overflow;
} seen_t;

static void record(const gca_trace_event_t *ev, void *ctx) {
  seen_t *s = ctx;
  if (s->n < MAX_SEEN)
    s->ev[s->n++] = *ev;
  else
    s->overflow++;
}

static void expect(const seen_t *s, int i, gca_trace_action_t action, uint64_t address,
                   uint64_t size, uint64_t reserved, uint64_t allocated) {
  if (i >= s->n)
    fail_msg("event %d missing: only %d seen", i, s->n);
  const gca_trace_event_t *e = &s->ev[i];
  if (e->action != action || e->device != 0 || e->address != address || e->size != size ||
      e->reserved_bytes != reserved || e->allocated_bytes != allocated)
    fail_msg("event %d: action %d device %d address 0x%llx size %llu reserved %llu allocated "
             "%llu; wanted action %d device 0 address 0x%llx size %llu reserved %llu allocated "
             "%llu",
             i, (int)e->action, e->device, (unsigned long long)e->address,
             (unsigned long long)e->size, (unsigned long long)e->reserved_bytes,
             (unsigned long long)e->allocated_bytes, (int)action, (unsigned long long)address,
             (unsigned long long)size, (unsigned long long)reserved, (unsigned long long)allocated);
}

static uint64_t addr(const void *p) {
  return (uint64_t)(uintptr_t)p;
}

static void scripted_sequence_is_seen_in_order_with_sizes_after_each_event(void **state) {
  (void)state;
  seen_t s = {0};
  gca_trace_observer_handle_t h = 0;
  gca_stream_t stream;
  assert_ok(gca_stream_create(&stream, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_trace_observer_add(record, &s, &h));
  assert_true(h != 0);
  void *a = alloc_on(1000, stream); /* a 2 MiB small segment, a 1 KiB block */
  void *b = alloc_on(3 * MiB, stream);
  free_ok(a);
  free_ok(b);
  assert_ok(gca_empty_cache());
  check();
  assert_ok(gca_trace_observer_remove(h));
  expect(&s, 0, GCA_TRACE_SEGMENT_ALLOC, addr(a), 2 * MiB, 2 * MiB, 0);
  expect(&s, 1, GCA_TRACE_ALLOC, addr(a), 1000, 2 * MiB, KiB);
  expect(&s, 2, GCA_TRACE_SEGMENT_ALLOC, addr(b), 20 * MiB, 22 * MiB, KiB);
  expect(&s, 3, GCA_TRACE_ALLOC, addr(b), 3 * MiB, 22 * MiB, KiB + 3 * MiB);
  expect(&s, 4, GCA_TRACE_FREE_REQUESTED, addr(a), 1000, 22 * MiB, 3 * MiB);
  expect(&s, 5, GCA_TRACE_FREE_COMPLETED, addr(a), 1000, 22 * MiB, 3 * MiB);
  expect(&s, 6, GCA_TRACE_FREE_REQUESTED, addr(b), 3 * MiB, 22 * MiB, 0);
  expect(&s, 7, GCA_TRACE_FREE_COMPLETED, addr(b), 3 * MiB, 22 * MiB, 0);
  /* empty_cache releases the segments in its own order: check the set */
  assert_int_equal(s.n, 10);
  uint64_t released = 0, reserved_last = UINT64_MAX;
  for (int i = 8; i < 10; i++) {
    assert_int_equal(s.ev[i].action, GCA_TRACE_SEGMENT_FREE);
    released += s.ev[i].size;
    reserved_last = s.ev[i].reserved_bytes;
  }
  assert_int_equal(released, 22 * MiB);
  assert_int_equal(reserved_last, 0);
  for (int i = 0; i < s.n; i++)
    assert_ptr_equal(s.ev[i].stream, stream);
  assert_ok(gca_stream_destroy(stream));
}

static void expandable_segments_report_map_and_unmap(void **state) {
  (void)state;
  seen_t s = {0};
  gca_trace_observer_handle_t h = 0;
  assert_ok(gca_set_config("expandable_segments:True"));
  assert_ok(gca_trace_observer_add(record, &s, &h));
  void *p = alloc_on(3 * MiB, NULL);
  free_ok(p);
  assert_ok(gca_empty_cache());
  assert_ok(gca_trace_observer_remove(h));
  assert_ok(gca_set_config("expandable_segments:False"));
  /* map what 3 MiB lacks, in 2 MiB granules (Note [Expandable segments]), alloc, free, unmap */
  int maps = 0, unmaps = 0, allocs = 0;
  uint64_t mapped = 0;
  for (int i = 0; i < s.n; i++) {
    const gca_trace_event_t *e = &s.ev[i];
    if (e->action == GCA_TRACE_SEGMENT_MAP) {
      maps++;
      mapped += e->size;
      assert_int_equal(e->reserved_bytes, mapped);
    } else if (e->action == GCA_TRACE_SEGMENT_UNMAP) {
      unmaps++;
      assert_int_equal(allocs, 1); /* after the allocation */
    } else if (e->action == GCA_TRACE_ALLOC) {
      allocs++;
      assert_int_equal(e->address, addr(p));
      assert_int_equal(e->reserved_bytes, mapped);
      assert_int_equal(e->allocated_bytes, 3 * MiB);
    }
  }
  assert_int_equal(allocs, 1);
  assert_true(maps >= 1);
  assert_int_equal(mapped, 4 * MiB);
  assert_true(unmaps >= 1);
  assert_int_equal(s.ev[s.n - 1].reserved_bytes, 0);
}

static void out_of_memory_is_reported_with_device_free_bytes(void **state) {
  (void)state;
  seen_t s = {0};
  gca_trace_observer_handle_t h = 0;
  assert_ok(gca_sim_set_capacity(0, 8 * MiB));
  assert_ok(gca_trace_observer_add(record, &s, &h));
  void *p = (void *)1;
  assert_status(gca_malloc(&p, 100 * MiB, NULL), GCA_ERR_OUT_OF_MEMORY, "out of memory");
  assert_null(p);
  assert_ok(gca_trace_observer_remove(h));
  assert_int_equal(s.n, 1);
  expect(&s, 0, GCA_TRACE_OOM, 8 * MiB, 100 * MiB, 0, 0);
}

static void two_observers_each_see_every_event(void **state) {
  (void)state;
  seen_t s1 = {0}, s2 = {0};
  gca_trace_observer_handle_t h1 = 0, h2 = 0;
  assert_ok(gca_trace_observer_add(record, &s1, &h1));
  assert_ok(gca_trace_observer_add(record, &s2, &h2));
  assert_true(h1 != h2);
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  assert_ok(gca_trace_observer_remove(h1));
  assert_ok(gca_trace_observer_remove(h2));
  assert_int_equal(s1.n, 4); /* segment_alloc, alloc, free_requested, free_completed */
  assert_int_equal(s2.n, s1.n);
  assert_memory_equal(s1.ev, s2.ev, sizeof(s1.ev[0]) * (size_t)s1.n);
}

static void removed_observer_is_not_called_and_the_other_still_is(void **state) {
  (void)state;
  seen_t s1 = {0}, s2 = {0};
  gca_trace_observer_handle_t h1 = 0, h2 = 0;
  assert_ok(gca_trace_observer_add(record, &s1, &h1));
  assert_ok(gca_trace_observer_add(record, &s2, &h2));
  void *p = alloc_on(4096, NULL);
  assert_ok(gca_trace_observer_remove(h1));
  free_ok(p);
  assert_ok(gca_trace_observer_remove(h2));
  assert_int_equal(s1.n, 2);
  assert_int_equal(s2.n, 4);
  assert_int_equal(s2.ev[2].action, GCA_TRACE_FREE_REQUESTED);
  assert_int_equal(s2.ev[3].action, GCA_TRACE_FREE_COMPLETED);
  /* the same handle cannot be removed twice */
  assert_status(gca_trace_observer_remove(h1), GCA_ERR_INVALID_HANDLE, "not an attached observer");
}

static void bad_arguments_are_refused(void **state) {
  (void)state;
  seen_t s = {0};
  gca_trace_observer_handle_t h = 0;
  assert_status(gca_trace_observer_add(NULL, &s, &h), GCA_ERR_INVALID_ARGUMENT,
                "trace_observer_add: the function is NULL");
  assert_status(gca_trace_observer_add(record, &s, NULL), GCA_ERR_INVALID_ARGUMENT,
                "the handle output is NULL");
  assert_status(gca_trace_observer_remove(0), GCA_ERR_INVALID_HANDLE, "handle 0 is not");
  assert_status(gca_trace_observer_remove(0xdead), GCA_ERR_INVALID_HANDLE,
                "handle 57005 is not an attached observer");
  assert_int_equal(atomic_load(&gca__history_recorders), 0);
  check();
}

static void a_full_registry_refuses_one_more(void **state) {
  (void)state;
  seen_t s = {0};
  gca_trace_observer_handle_t h[GCA_TRACE_OBSERVERS_MAX], extra = 0;
  for (int i = 0; i < GCA_TRACE_OBSERVERS_MAX; i++)
    assert_ok(gca_trace_observer_add(record, &s, &h[i]));
  assert_status(gca_trace_observer_add(record, &s, &extra), GCA_ERR_INVALID_STATE,
                "all 16 observer slots are taken");
  assert_int_equal(extra, 0);
  void *p = alloc_on(512, NULL);
  assert_int_equal(s.n, 2 * GCA_TRACE_OBSERVERS_MAX); /* segment_alloc and alloc, 16 times */
  for (int i = 0; i < GCA_TRACE_OBSERVERS_MAX; i++)
    assert_ok(gca_trace_observer_remove(h[i]));
  free_ok(p);
  assert_int_equal(s.n, 2 * GCA_TRACE_OBSERVERS_MAX);
}

/* A callback that tries to change the registry from inside. */
typedef struct reentrant {
  gca_status_t add_st, remove_st;
  char add_detail[160], remove_detail[160];
  gca_trace_observer_handle_t self;
  int calls;
} reentrant_t;

static void reenter(const gca_trace_event_t *ev, void *ctx) {
  reentrant_t *r = ctx;
  (void)ev;
  if (r->calls++ != 0)
    return;
  gca_trace_observer_handle_t h = 0;
  r->add_st = gca_trace_observer_add(reenter, r, &h);
  snprintf(r->add_detail, sizeof(r->add_detail), "%s", gca_last_error());
  r->remove_st = gca_trace_observer_remove(r->self);
  snprintf(r->remove_detail, sizeof(r->remove_detail), "%s", gca_last_error());
}

static void add_or_remove_inside_a_callback_is_refused(void **state) {
  (void)state;
  reentrant_t r = {0};
  assert_ok(gca_trace_observer_add(reenter, &r, &r.self));
  void *p = alloc_on(512, NULL);
  free_ok(p);
  assert_int_equal(r.add_st, GCA_ERR_INVALID_STATE);
  assert_non_null(strstr(r.add_detail, "trace_observer_add: called from inside a trace observer"));
  assert_int_equal(r.remove_st, GCA_ERR_INVALID_STATE);
  assert_non_null(
      strstr(r.remove_detail, "trace_observer_remove: called from inside a trace observer"));
  assert_int_equal(r.calls, 4); /* still attached after the refused remove */
  assert_ok(gca_trace_observer_remove(r.self));
}

static void no_observer_means_no_calls_and_a_clear_recorder_bit(void **state) {
  (void)state;
  seen_t s = {0};
  gca_trace_observer_handle_t h = 0;
  assert_int_equal(atomic_load(&gca__history_recorders), 0);
  assert_ok(gca_trace_observer_add(record, &s, &h));
  assert_int_not_equal(atomic_load(&gca__history_recorders), 0);
  assert_ok(gca_trace_observer_remove(h));
  assert_int_equal(atomic_load(&gca__history_recorders), 0);
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  p = alloc_on(4096, NULL); /* a free cache hit: the fast path runs again */
  free_ok(p);
  assert_ok(gca_empty_cache());
  assert_int_equal(s.n, 0);
  assert_int_equal(s.overflow, 0);
}

/* ---- removal while another thread allocates ---- */

static atomic_int removed, stop, calls, calls_after_removal;

static void count_calls(const gca_trace_event_t *ev, void *ctx) {
  (void)ev;
  (void)ctx;
  atomic_fetch_add(&calls, 1);
  if (atomic_load(&removed))
    atomic_fetch_add(&calls_after_removal, 1);
}

typedef struct worker {
  gca_status_t st;
  atomic_long pairs;
  atomic_int done; /* the loop ended (stop, or a failure in st) */
} worker_t;

static void *alloc_loop(void *arg) {
  worker_t *w = arg;
  while (!atomic_load(&stop)) {
    void *p = NULL;
    if ((w->st = gca_malloc(&p, 4096, NULL)) != GCA_OK || (w->st = gca_free(p)) != GCA_OK)
      break;
    atomic_fetch_add(&w->pairs, 1);
  }
  atomic_store(&w->done, 1);
  return NULL;
}

static void no_call_starts_after_remove_returns(void **state) {
  (void)state;
  atomic_store(&removed, 0);
  atomic_store(&stop, 0);
  atomic_store(&calls, 0);
  atomic_store(&calls_after_removal, 0);
  gca_trace_observer_handle_t h = 0;
  assert_ok(gca_trace_observer_add(count_calls, NULL, &h));
  static worker_t w;
  w.st = GCA_OK;
  atomic_store(&w.pairs, 0);
  atomic_store(&w.done, 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, alloc_loop, &w), 0);
  while (atomic_load(&calls) < 1000 && !atomic_load(&w.done)) /* the worker reaches observers */
    ;
  assert_ok(gca_trace_observer_remove(h));
  atomic_store(&removed, 1);
  long at_removal = atomic_load(&w.pairs);
  while (atomic_load(&w.pairs) < at_removal + 1000 && !atomic_load(&w.done)) /* runs on */
    ;
  atomic_store(&stop, 1);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_ok(w.st);
  assert_true(atomic_load(&calls) >= 1000);
  assert_int_equal(atomic_load(&calls_after_removal), 0);
  check();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          scripted_sequence_is_seen_in_order_with_sizes_after_each_event, alloc_setup,
          alloc_teardown),
      cmocka_unit_test_setup_teardown(expandable_segments_report_map_and_unmap, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(out_of_memory_is_reported_with_device_free_bytes, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(two_observers_each_see_every_event, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(removed_observer_is_not_called_and_the_other_still_is,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(bad_arguments_are_refused, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(a_full_registry_refuses_one_more, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(add_or_remove_inside_a_callback_is_refused, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(no_observer_means_no_calls_and_a_clear_recorder_bit,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(no_call_starts_after_remove_returns, alloc_setup,
                                      alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
