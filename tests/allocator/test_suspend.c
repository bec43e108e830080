/* SPDX-License-Identifier: Apache-2.0 */
/* test_suspend.c - suspending a private pool (its memory released, its
 * addresses kept) and resuming it: contents survive when saved, a graph
 * recorded against the pool replays after the resume, reserved bytes drop to
 * zero meanwhile, and every refusal or driver failure leaves the pool usable. */
#include "alloc_fixture.h"

#define N 4096

static gca_stream_t s;

static int suspend_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("expandable_segments:True"));
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  return 0;
}

static int suspend_teardown(void **state) {
  assert_ok(gca_stream_destroy(s));
  return alloc_teardown(state);
}

static gca_pool_t *new_pool(void) {
  gca_pool_t *p = NULL;
  assert_ok(gca_pool_create(0, NULL, &p));
  return p;
}

static void *pool_alloc(gca_pool_t *pool, size_t size) {
  assert_ok(gca_pool_use_begin(pool));
  void *p = alloc_on(size, s);
  assert_ok(gca_pool_use_end(pool));
  return p;
}

static void fill(void *p, uint32_t v, size_t n) {
  assert_ok(gca_kernel_fill_u32(p, v, 3, n, s));
  assert_ok(gca_stream_synchronize(s));
}

static void assert_filled(const void *p, uint32_t v, size_t n) {
  const uint32_t *u = p;
  for (size_t i = 0; i < n; i += 97)
    assert_int_equal(u[i], v + 3 * i);
  assert_int_equal(u[n - 1], v + 3 * (n - 1));
}

static int64_t reserved_now(void) {
  return stats().reserved_bytes[GCA_STAT_ALL].current;
}

static void saved_contents_survive_and_reserved_drops_to_zero(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool();
  void *a = pool_alloc(pool, N * 4), *b = pool_alloc(pool, 5 * MiB);
  fill(a, 11, N);
  fill(b, 1000, 5 * MiB / 4);
  assert_true(reserved_now() > 0);
  uint64_t used = gca_sim_used_bytes(0);
  assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE));
  check();
  assert_int_equal(reserved_now(), 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
  size_t reserved = 1, allocated = 0;
  assert_ok(gca_pool_memory(pool, &reserved, &allocated));
  assert_int_equal(reserved, 0);
  assert_int_equal(allocated, block_size_of(a) + block_size_of(b)); /* blocks stay live */
  assert_ok(gca_pool_resume(pool));
  check();
  assert_int_equal(gca_sim_used_bytes(0), used);
  assert_filled(a, 11, N);
  assert_filled(b, 1000, 5 * MiB / 4);
  free_ok(a);
  free_ok(b);
  assert_ok(gca_pool_release(pool));
}

/* Note [Destroyed streams]: the stream the pool's memory was allocated on is
 * destroyed before the suspend; the copies out and back go on the device's
 * legacy stream instead (the sim aborts on any use of the destroyed one). */
static void suspend_and_resume_after_the_pools_stream_was_destroyed(void **state) {
  (void)state;
  gca_stream_t u;
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool = new_pool();
  assert_ok(gca_pool_use_begin(pool));
  void *a = alloc_on(5 * MiB, u);
  assert_ok(gca_pool_use_end(pool));
  fill(a, 77, 5 * MiB / 4);
  assert_ok(gca_stream_destroy(u));
  assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE));
  check();
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_ok(gca_pool_resume(pool));
  check();
  assert_filled(a, 77, 5 * MiB / 4);
  free_ok(a);
  assert_ok(gca_pool_release(pool));
}

static void graph_recorded_before_suspend_replays_after_resume(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool();
  gca_graph_t graph = NULL;
  gca_graph_exec_t exec = NULL;
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_pool_begin_capture(pool, s));
  void *x = alloc_on(N * 4, s), *y = alloc_on(N * 4, s), *z = alloc_on(N * 4, s);
  assert_ok(gca_kernel_fill_u32(x, 1, 1, N, s));
  assert_ok(gca_kernel_fill_u32(y, 50, 2, N, s));
  assert_ok(gca_kernel_add_u32(z, x, y, N, s));
  assert_ok(gca_stream_end_capture(s, &graph));
  assert_ok(gca_pool_end_capture(pool, s));
  assert_ok(gca_graph_instantiate(&exec, graph));
  assert_ok(gca_graph_launch(exec, s));
  assert_ok(gca_stream_synchronize(s));
  const uint32_t *zz = z;
  assert_int_equal(zz[100], 1 + 100 + 50 + 200);
  assert_ok(gca_pool_suspend(pool, 0));
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_ok(gca_pool_resume(pool));
  memset(z, 0, N * 4);
  assert_ok(gca_graph_launch(exec, s));
  assert_ok(gca_stream_synchronize(s));
  for (uint32_t i = 0; i < N; i += 101)
    assert_int_equal(zz[i], 1 + i + 50 + 2 * i);
  assert_ok(gca_graph_exec_destroy(exec));
  assert_ok(gca_graph_destroy(graph));
  free_ok(x);
  free_ok(y);
  free_ok(z);
  assert_ok(gca_pool_release(pool));
}

static void suspend_is_refused_for_classic_segments_and_during_capture(void **state) {
  (void)state;
  gca_graph_t graph = NULL;
  assert_ok(gca_set_config("expandable_segments:False"));
  gca_pool_t *classic = new_pool();
  void *a = pool_alloc(classic, 4096);
  assert_status(gca_pool_suspend(classic, GCA_POOL_SUSPEND_SAVE), GCA_ERR_NOT_SUPPORTED,
                "classic segment");
  assert_status(gca_pool_resume(classic), GCA_ERR_INVALID_STATE, "not suspended");
  free_ok(a);
  assert_ok(gca_pool_release(classic));
  assert_ok(gca_set_config("expandable_segments:True"));
  gca_pool_t *pool = new_pool();
  void *b = pool_alloc(pool, 4096);
  fill(b, 5, 1024);
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_pool_begin_capture(pool, s));
  assert_status(gca_pool_suspend(pool, 0), GCA_ERR_INVALID_STATE, "capture");
  assert_ok(gca_stream_end_capture(s, &graph));
  assert_non_null(graph);
  assert_ok(gca_pool_end_capture(pool, s));
  assert_status(gca_pool_suspend(pool, 0x80), GCA_ERR_INVALID_ARGUMENT, "flags");
  check();
  assert_filled(b, 5, 1024);
  assert_ok(gca_graph_destroy(graph));
  free_ok(b);
  assert_ok(gca_pool_release(pool));
}

/* Note [Suspend and resume during captures]: while another stream captures
 * (no pool routed), a suspend or a resume would wait for the device and
 * invalidate the capture: each is refused and changes nothing, and the
 * capture goes on; after it both work, contents intact. */
static void suspend_and_resume_wait_for_other_captures(void **state) {
  (void)state;
  gca_stream_t c;
  assert_ok(gca_stream_create(&c, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool = new_pool();
  void *b = pool_alloc(pool, 5 * MiB);
  fill(b, 7, 5 * MiB / 4);
  int64_t reserved = reserved_now();
  gca_graph_t graph = NULL;
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  assert_ok(gca_stream_begin_capture(c, GCA_CAPTURE_MODE_GLOBAL));
  assert_status(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE), GCA_ERR_CAPTURE_UNSUPPORTED,
                "a stream capture is under way");
  assert_ok(gca_stream_capture_status(c, &cs));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(reserved_now(), reserved);
  check();
  assert_ok(gca_stream_end_capture(c, &graph));
  assert_ok(gca_graph_destroy(graph));
  assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE));
  assert_int_equal(reserved_now(), 0);
  assert_ok(gca_stream_begin_capture(c, GCA_CAPTURE_MODE_GLOBAL));
  assert_status(gca_pool_resume(pool), GCA_ERR_CAPTURE_UNSUPPORTED, "try again once it has ended");
  assert_ok(gca_stream_capture_status(c, &cs));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(reserved_now(), 0); /* still suspended */
  assert_ok(gca_stream_end_capture(c, &graph));
  assert_ok(gca_graph_destroy(graph));
  assert_ok(gca_pool_resume(pool));
  check();
  assert_int_equal(reserved_now(), reserved);
  assert_filled(b, 7, 5 * MiB / 4);
  free_ok(b);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(c));
}

/* Out of host memory for the suspend's table or for a saved copy: the
 * suspend fails naming it and changes nothing (the pool stays mapped, its
 * contents intact, no copy leaked). During a capture the refusal comes before
 * either is allocated: an armed fail point outlives the refused suspend and
 * fails the next one. */
static void save_buffers_out_of_host_memory_fail_cleanly(void **state) {
  (void)state;
  static const char *const points[] = {"suspend_table", "suspend_copy"};
  gca_stream_t c;
  assert_ok(gca_stream_create(&c, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool = new_pool();
  void *b = pool_alloc(pool, 5 * MiB);
  fill(b, 9, 5 * MiB / 4);
  int64_t reserved = reserved_now();
  for (size_t k = 0; k < 2; k++) {
    assert_ok(gca__failpoint_arm(points[k], 1));
    assert_status(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE), GCA_ERR_OUT_OF_MEMORY,
                  "host out of memory");
    gca__failpoint_clear();
    check();
    assert_int_equal(reserved_now(), reserved);
    assert_filled(b, 9, 5 * MiB / 4);
  }
  gca_graph_t graph = NULL;
  assert_ok(gca__failpoint_arm("suspend_copy", 1));
  assert_ok(gca_stream_begin_capture(c, GCA_CAPTURE_MODE_GLOBAL));
  assert_status(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE), GCA_ERR_CAPTURE_UNSUPPORTED,
                "a stream capture is under way");
  assert_ok(gca_stream_end_capture(c, &graph));
  assert_ok(gca_graph_destroy(graph));
  assert_status(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE), GCA_ERR_OUT_OF_MEMORY,
                "host out of memory for a 20971520-byte copy");
  const char *msg = gca_last_error(); /* the operation named once, first */
  assert_ptr_equal(strstr(msg, "pool_suspend: pool "), msg);
  assert_null(strstr(msg + 1, "pool_suspend"));
  gca__failpoint_clear();
  assert_int_equal(reserved_now(), reserved);
  assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE));
  assert_int_equal(reserved_now(), 0);
  assert_ok(gca_pool_resume(pool));
  check();
  assert_filled(b, 9, 5 * MiB / 4);
  free_ok(b);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(c));
}

static void a_suspended_pool_refuses_allocations_and_a_second_suspend(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool();
  void *a = pool_alloc(pool, 4096);
  assert_ok(gca_pool_suspend(pool, 0));
  assert_status(gca_pool_suspend(pool, 0), GCA_ERR_INVALID_STATE, "already suspended");
  assert_ok(gca_pool_use_begin(pool));
  void *p = NULL;
  assert_status(gca_malloc(&p, 4096, s), GCA_ERR_INVALID_STATE, "suspended");
  assert_null(p);
  assert_ok(gca_pool_use_end(pool));
  free_ok(a); /* bookkeeping only: allowed while suspended */
  assert_ok(gca_pool_resume(pool));
  check();
  assert_ok(gca_pool_release(pool));
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void releasing_a_suspended_pool_frees_everything(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool();
  void *a = pool_alloc(pool, 3 * MiB);
  assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE));
  free_ok(a);
  assert_ok(gca_pool_release(pool));
  check();
  assert_int_equal(reserved_now(), 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void driver_failures_leave_the_pool_as_it_was(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool();
  void *a = pool_alloc(pool, N * 4);
  fill(a, 77, N);
  int64_t reserved = reserved_now();
  assert_ok(gca_sim_fault_set("mem_unmap:nth=1"));
  assert_status(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE), GCA_ERR_DRIVER, "pool_suspend");
  gca_sim_fault_clear();
  check();
  assert_int_equal(reserved_now(), reserved);
  assert_filled(a, 77, N);
  assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE));
  assert_ok(gca_sim_fault_set("mem_create:nth=1"));
  assert_status(gca_pool_resume(pool), GCA_ERR_OUT_OF_MEMORY, "stays suspended");
  gca_sim_fault_clear();
  check();
  assert_int_equal(reserved_now(), 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_ok(gca_sim_fault_set("mem_map:nth=1"));
  assert_status(gca_pool_resume(pool), GCA_ERR_DRIVER, "stays suspended");
  gca_sim_fault_clear();
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_ok(gca_pool_resume(pool));
  check();
  assert_int_equal(reserved_now(), reserved);
  assert_filled(a, 77, N);
  free_ok(a);
  assert_ok(gca_pool_release(pool));
}

static void suspend_copy_failures_leave_the_pool_as_it_was(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool();
  void *a = pool_alloc(pool, N * 4), *b = pool_alloc(pool, 5 * MiB); /* two segments */
  fill(a, 21, N);
  fill(b, 400, 5 * MiB / 4);
  int64_t reserved = reserved_now();
  uint64_t used = gca_sim_used_bytes(0);
  static const char *const faults[][2] = {
      {"ctx_synchronize:nth=1", "ctx_synchronize"},
      {"memcpy_async:nth=1", "memcpy_async"},
      {"mem_unmap:nth=2", "pool_suspend"}, /* the first mapping is mapped back from its copy */
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(faults); i++) {
    assert_ok(gca_sim_fault_set(faults[i][0]));
    assert_status(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE), GCA_ERR_DRIVER, faults[i][1]);
    gca_sim_fault_clear();
    check();
    assert_int_equal(reserved_now(), reserved);
    assert_int_equal(gca_sim_used_bytes(0), used);
    assert_filled(a, 21, N);
    assert_filled(b, 400, 5 * MiB / 4);
    assert_status(gca_pool_resume(pool), GCA_ERR_INVALID_STATE, "not suspended");
  }
  assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE)); /* and a later suspend works */
  assert_ok(gca_pool_resume(pool));
  assert_filled(a, 21, N);
  assert_filled(b, 400, 5 * MiB / 4);
  free_ok(a);
  free_ok(b);
  assert_ok(gca_pool_release(pool));
}

static void resume_failures_before_any_copy_keep_the_pool_suspended(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool();
  void *a = pool_alloc(pool, N * 4), *b = pool_alloc(pool, 5 * MiB);
  fill(a, 9, N);
  fill(b, 123, 5 * MiB / 4);
  int64_t reserved = reserved_now();
  assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE));
  static const char *const faults[][2] = {
      {"mem_set_access:nth=1", "mem_set_access"},
      {"memcpy_async:nth=1", "memcpy_async"},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(faults); i++) {
    gca_sim_counters_reset();
    assert_ok(gca_sim_fault_set(faults[i][0]));
    assert_status(gca_pool_resume(pool), GCA_ERR_DRIVER, "stays suspended");
    assert_non_null(strstr(gca_last_error(), faults[i][1]));
    gca_sim_fault_clear();
    check();
    assert_int_equal(reserved_now(), 0);
    assert_int_equal(gca_sim_used_bytes(0), 0);
    assert_int_equal(gca_sim_call_count("mem_unmap"), gca_sim_call_count("mem_map"));
    assert_int_equal(gca_sim_call_count("mem_release"), gca_sim_call_count("mem_create"));
    assert_status(gca_pool_suspend(pool, 0), GCA_ERR_INVALID_STATE, "already suspended");
  }
  assert_ok(gca_pool_resume(pool));
  check();
  assert_int_equal(reserved_now(), reserved);
  assert_filled(a, 9, N);
  assert_filled(b, 123, 5 * MiB / 4);
  free_ok(a);
  free_ok(b);
  assert_ok(gca_pool_release(pool));
}

/* A failure after copies were queued (a later copy, or the wait for them)
 * must not free the host copies or unmap device memory under them: the
 * cleanup waits for the queued copies first. Two 64 MiB mappings keep the
 * first copy in flight when the second step fails. */
static void failures_after_copies_were_queued_wait_for_them(void **state) {
  (void)state;
  const size_t big = 64 * MiB;
  static const char *const faults[] = {"memcpy_async:nth=2", "stream_synchronize:nth=1"};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(faults); i++) {
    gca_pool_t *pool = new_pool();
    void *a = pool_alloc(pool, big), *b = pool_alloc(pool, big); /* one mapping each */
    fill(a, 7, big / 4);
    fill(b, 70, big / 4);
    int64_t reserved = reserved_now();
    /* suspend fails after the first copy was queued: nothing changes */
    assert_ok(gca_sim_fault_set(faults[i]));
    assert_status(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE), GCA_ERR_DRIVER, "pool_suspend");
    gca_sim_fault_clear();
    check();
    assert_int_equal(reserved_now(), reserved);
    assert_filled(a, 7, big / 4);
    assert_filled(b, 70, big / 4);
    /* resume fails after the first copy back was queued: still suspended */
    assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE));
    assert_ok(gca_sim_fault_set(faults[i]));
    assert_status(gca_pool_resume(pool), GCA_ERR_DRIVER, "stays suspended");
    gca_sim_fault_clear();
    check();
    assert_int_equal(reserved_now(), 0);
    assert_int_equal(gca_sim_used_bytes(0), 0);
    assert_ok(gca_pool_resume(pool));
    assert_filled(a, 7, big / 4);
    assert_filled(b, 70, big / 4);
    free_ok(a);
    free_ok(b);
    assert_ok(gca_pool_release(pool));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(saved_contents_survive_and_reserved_drops_to_zero,
                                      suspend_setup, suspend_teardown),
      cmocka_unit_test_setup_teardown(suspend_and_resume_after_the_pools_stream_was_destroyed,
                                      suspend_setup, suspend_teardown),
      cmocka_unit_test_setup_teardown(graph_recorded_before_suspend_replays_after_resume,
                                      suspend_setup, suspend_teardown),
      cmocka_unit_test_setup_teardown(suspend_is_refused_for_classic_segments_and_during_capture,
                                      suspend_setup, suspend_teardown),
      cmocka_unit_test_setup_teardown(suspend_and_resume_wait_for_other_captures, suspend_setup,
                                      suspend_teardown),
      cmocka_unit_test_setup_teardown(save_buffers_out_of_host_memory_fail_cleanly, suspend_setup,
                                      suspend_teardown),
      cmocka_unit_test_setup_teardown(a_suspended_pool_refuses_allocations_and_a_second_suspend,
                                      suspend_setup, suspend_teardown),
      cmocka_unit_test_setup_teardown(releasing_a_suspended_pool_frees_everything, suspend_setup,
                                      suspend_teardown),
      cmocka_unit_test_setup_teardown(driver_failures_leave_the_pool_as_it_was, suspend_setup,
                                      suspend_teardown),
      cmocka_unit_test_setup_teardown(suspend_copy_failures_leave_the_pool_as_it_was, suspend_setup,
                                      suspend_teardown),
      cmocka_unit_test_setup_teardown(failures_after_copies_were_queued_wait_for_them,
                                      suspend_setup, suspend_teardown),
      cmocka_unit_test_setup_teardown(resume_failures_before_any_copy_keep_the_pool_suspended,
                                      suspend_setup, suspend_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
