/* SPDX-License-Identifier: Apache-2.0 */
/* test_sim_clock.c - the sim's virtual time (Note [Sim virtual time],
 * GCA_SIM_CLOCK=virtual, set by meson for this test): event times are exact
 * sums of the modelled work, never the machine's; kernel_sleep takes virtual
 * time only (a 1000 s sleep completes at once), other kernels none; waits on events carry the
 * time across streams; the host's clock follows its synchronizes; a graph's
 * independent branches overlap in time; a sim collective ends at the latest
 * rank's start plus its cost, on every rank. A bad GCA_SIM_CLOCK is a clear
 * configuration error. */
#include <stdlib.h>

#include "device/child.h"
#include "support.h"

#define MS 1000000ull /* ns */

static gca_event_t ev(void) {
  gca_event_t e = NULL;
  assert_ok(gca_event_create(&e, 0));
  return e;
}

static float elapsed(gca_event_t a, gca_event_t b) {
  float ms = -1;
  assert_ok(gca_event_elapsed_time(&ms, a, b));
  return ms;
}

static void sleeps_take_virtual_time_only(void **state) {
  (void)state;
  gca_stream_t s = NULL;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  gca_event_t a = ev(), b = ev(), c = ev();
  assert_ok(gca_event_record(a, s));
  assert_ok(gca_kernel_sleep(5 * MS, s));
  assert_ok(gca_event_record(b, s));
  assert_ok(gca_kernel_sleep(1000000 * MS, s)); /* 1000 s: done at once, or the test times out */
  assert_ok(gca_event_record(c, s));
  assert_ok(gca_stream_synchronize(s));
  assert_float_equal(elapsed(a, b), 5.0, 0);
  assert_float_equal(elapsed(b, c), 1000000.0, 0);
  assert_ok(gca_event_destroy(a));
  assert_ok(gca_event_destroy(b));
  assert_ok(gca_event_destroy(c));
  assert_ok(gca_stream_destroy(s));
}

/* Kernels other than sleep take no virtual time, the compute kernels too:
 * a 2 ms sleep between a gemm, an elementwise op and a dot is all there is. */
static void compute_kernels_take_no_virtual_time(void **state) {
  (void)state;
  enum { D = 64 };
  gca_stream_t s = NULL;
  float *a = NULL, *c = NULL;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_malloc((void **)&a, D * D * 4, s));
  assert_ok(gca_malloc((void **)&c, D * D * 4, s));
  assert_ok(gca_memset_d32_async(a, 0x3f800000u, D * D, s)); /* 1.0f */
  gca_event_t e0 = ev(), e1 = ev();
  assert_ok(gca_event_record(e0, s));
  assert_ok(gca_kernel_gemm_f32(c, a, a, D, D, D, 0, s));
  assert_ok(gca_kernel_sleep(2 * MS, s));
  assert_ok(gca_kernel_ew_f32(GCA_EW_RELU, c, c, NULL, 0, 0, D * D, s));
  assert_ok(gca_kernel_dot_f32(c, a, a, D * D, 1, s));
  assert_ok(gca_event_record(e1, s));
  assert_ok(gca_stream_synchronize(s));
  assert_float_equal(elapsed(e0, e1), 2.0, 0);
  float got = 0;
  assert_ok(gca_memcpy(&got, c, 4));
  assert_true(got == D * D);
  assert_ok(gca_event_destroy(e0));
  assert_ok(gca_event_destroy(e1));
  assert_ok(gca_free(a));
  assert_ok(gca_free(c));
  assert_ok(gca_stream_destroy(s));
}

/* s1: a, 3 ms, b. s2: waits for b, 2 ms, c. Then the host synchronizes s2
 * (at a + 5 ms) and gives a fresh stream work: it starts no earlier. */
static void waits_and_synchronizes_carry_time(void **state) {
  (void)state;
  gca_stream_t s1 = NULL, s2 = NULL, s3 = NULL;
  assert_ok(gca_stream_create(&s1, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&s3, GCA_STREAM_NON_BLOCKING));
  gca_event_t a = ev(), b = ev(), c = ev(), d = ev(), e = ev();
  assert_ok(gca_event_record(a, s1));
  assert_ok(gca_kernel_sleep(3 * MS, s1));
  assert_ok(gca_event_record(b, s1));
  assert_ok(gca_stream_wait_event(s2, b));
  assert_ok(gca_kernel_sleep(2 * MS, s2));
  assert_ok(gca_event_record(c, s2));
  assert_ok(gca_stream_synchronize(s2));
  assert_float_equal(elapsed(a, c), 5.0, 0);
  assert_ok(gca_event_record(d, s3)); /* s3 had nothing: it starts at the host's time */
  assert_ok(gca_kernel_sleep(1 * MS, s3));
  assert_ok(gca_event_record(e, s3));
  assert_ok(gca_event_synchronize(e));
  assert_float_equal(elapsed(a, d), 5.0, 0);
  assert_float_equal(elapsed(a, e), 6.0, 0);
  gca_event_t all[] = {a, b, c, d, e};
  for (size_t i = 0; i < 5; i++)
    assert_ok(gca_event_destroy(all[i]));
  assert_ok(gca_stream_destroy(s1));
  assert_ok(gca_stream_destroy(s2));
  assert_ok(gca_stream_destroy(s3));
}

/* A graph: 1 ms, then branches of 4 ms and 2 ms, joined: 5 ms a launch. */
static void a_graphs_branches_overlap_in_time(void **state) {
  (void)state;
  gca_stream_t s = NULL, side = NULL;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&side, GCA_STREAM_NON_BLOCKING));
  gca_event_t fork = NULL, join = NULL;
  assert_ok(gca_event_create(&fork, GCA_EVENT_DISABLE_TIMING));
  assert_ok(gca_event_create(&join, GCA_EVENT_DISABLE_TIMING));
  gca_graph_t g = NULL;
  gca_graph_exec_t x = NULL;
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  assert_ok(gca_kernel_sleep(1 * MS, s));
  assert_ok(gca_event_record(fork, s));
  assert_ok(gca_stream_wait_event(side, fork));
  assert_ok(gca_kernel_sleep(4 * MS, s));
  assert_ok(gca_kernel_sleep(2 * MS, side));
  assert_ok(gca_event_record(join, side));
  assert_ok(gca_stream_wait_event(s, join));
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_graph_instantiate(&x, g));
  gca_event_t a = ev(), b = ev(), c = ev();
  assert_ok(gca_event_record(a, s));
  assert_ok(gca_graph_launch(x, s));
  assert_ok(gca_event_record(b, s));
  assert_ok(gca_graph_launch(x, s));
  assert_ok(gca_event_record(c, s));
  assert_ok(gca_stream_synchronize(s));
  assert_float_equal(elapsed(a, b), 5.0, 0); /* not 7 (serial), not 1 */
  assert_float_equal(elapsed(b, c), 5.0, 0);
  assert_ok(gca_graph_exec_destroy(x));
  assert_ok(gca_graph_destroy(g));
  gca_event_t all[] = {a, b, c, fork, join};
  for (size_t i = 0; i < 5; i++)
    assert_ok(gca_event_destroy(all[i]));
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(side));
}

/* Rank 0 starts its all-reduce 1 ms later than rank 1: both end at 1 ms +
 * the cost (100 us + ring bytes over 1 GB/s). */
static void a_collective_ends_at_the_latest_start_plus_its_cost(void **state) {
  (void)state;
  int devs[2] = {0, 1};
  gca_comm_t *c[2] = {NULL, NULL};
  gca_comm_options_t o = GCA_COMM_OPTIONS_INIT;
  o.latency_us = 100;
  o.bandwidth_gbps = 1; /* bytes per ns */
  assert_ok(gca_comm_create_all(2, devs, &o, c));
  gca_stream_t s[2];
  void *buf[2];
  gca_event_t a[2], b[2];
  for (int r = 0; r < 2; r++) {
    assert_ok(gca_set_device(r));
    assert_ok(gca_stream_create(&s[r], GCA_STREAM_NON_BLOCKING));
    assert_ok(gca_malloc(&buf[r], 4096, s[r]));
    a[r] = ev();
    b[r] = ev();
    assert_ok(gca_event_record(a[r], s[r]));
  }
  assert_ok(gca_kernel_sleep(1 * MS, s[0]));
  for (int r = 0; r < 2; r++) {
    assert_ok(gca_all_reduce(buf[r], buf[r], 1000, GCA_DTYPE_F32, GCA_REDUCE_SUM, c[r], s[r]));
    assert_ok(gca_event_record(b[r], s[r]));
  }
  for (int r = 0; r < 2; r++)
    assert_ok(gca_stream_synchronize(s[r]));
  /* 4000 bytes, all-reduce on 2 ranks: 2 * (2 - 1) / 2 * 4000 = 4000 bytes, 4 us */
  for (int r = 0; r < 2; r++) {
    assert_ok(gca_comm_async_error(c[r]));
    assert_float_equal(elapsed(a[r], b[r]), 1.104, 1e-6);
  }
  for (int r = 0; r < 2; r++) {
    assert_ok(gca_set_device(r));
    assert_ok(gca_free(buf[r]));
    assert_ok(gca_event_destroy(a[r]));
    assert_ok(gca_event_destroy(b[r]));
    assert_ok(gca_stream_destroy(s[r]));
    assert_ok(gca_comm_destroy(c[r]));
  }
  assert_ok(gca_set_device(0));
}

static int bad_clock_child(report_t *r) {
  EXPECT(r, gca_device_init(), GCA_ERR_CONFIG, "GCA_SIM_CLOCK='sometimes' is not 'real' or");
  return CHILD_PASS;
}

static void a_bad_clock_setting_is_a_clear_error(void **state) {
  (void)state;
  const char *env[] = {"GCA_SIM_CLOCK", "sometimes", NULL};
  run_child(env, bad_clock_child, NULL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* forks before the library starts its threads */
      cmocka_unit_test(a_bad_clock_setting_is_a_clear_error),
      cmocka_unit_test(sleeps_take_virtual_time_only),
      cmocka_unit_test(waits_and_synchronizes_carry_time),
      cmocka_unit_test(compute_kernels_take_no_virtual_time),
      cmocka_unit_test(a_graphs_branches_overlap_in_time),
      cmocka_unit_test(a_collective_ends_at_the_latest_start_plus_its_cost),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
