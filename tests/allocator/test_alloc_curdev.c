/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_curdev.c - gca_set_device also makes the device current in the
 * device layer, so a NULL stream in the allocator's work (events recorded at
 * free, stream-ordered reuse) is the legacy stream of the thread's current
 * device, not device 0's; the device layer is told only when the device
 * changes, never on the alloc/free path. Runs with two sim devices. */
#include <sched.h>
#include <stdatomic.h>

#include "alloc_fixture.h"

/* Host function holding a stream until *arg becomes nonzero. */
static void hold_until(void *arg) {
  while (atomic_load((atomic_int *)arg) == 0)
    sched_yield();
}

static atomic_int gate0 = 1, gate1 = 1;

static int curdev_setup(void **state) {
  alloc_setup(state);
  int n = 0;
  assert_ok(gca_device_count(&n));
  assert_true(n >= 2);
  assert_ok(gca_sim_set_capacity(1, 16 * GiB));
  return 0;
}

static int curdev_teardown(void **state) {
  atomic_store(&gate0, 1); /* a failed test must not leave a stream held */
  atomic_store(&gate1, 1);
  alloc_teardown(state);
  assert_int_equal(gca_sim_used_bytes(1), 0);
  int dev = -1;
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 0);
  return 0;
}

static gca_stats_t stats_of(int dev) {
  gca_stats_t s;
  assert_ok(gca_get_stats(dev, &s));
  return s;
}

static void null_stream_frees_on_device_1_use_its_legacy_stream(void **state) {
  (void)state;
  /* device 0's legacy stream is held throughout: nothing below may wait on it */
  atomic_store(&gate0, 0);
  assert_ok(gca_launch_host_func(NULL, hold_until, &gate0));
  assert_ok(gca_set_device(1));
  int dev = -1;
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 1);

  void *p = alloc_on(4096, NULL);
  assert_ok(gca_pointer_info(p, NULL, &dev));
  assert_int_equal(dev, 1);
  assert_ok(gca_kernel_fill_u32(p, 7, 1, 1024, NULL));
  assert_ok(gca_record_stream(p, NULL));
  free_ok(p);

  gca_stream_t s1;
  assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &s1));
  void *q = alloc_on(8192, s1);
  assert_ok(gca_record_stream(q, NULL));
  atomic_store(&gate1, 0);
  assert_ok(gca_launch_host_func(NULL, hold_until, &gate1));
  free_ok(q); /* records a device-1 event on device 1's legacy stream */
  void *r = alloc_on(8192, s1);
  assert_ptr_not_equal(r, q);
  assert_int_equal(stats_of(1).active[GCA_STAT_ALL].current, 2);
  free_ok(r);
  atomic_store(&gate1, 1);
  assert_ok(gca_stream_synchronize(NULL));
  void *again = alloc_on(8192, s1); /* processing finds the event complete */
  assert_ptr_equal(again, q);
  free_ok(again);
  assert_int_equal(stats_of(1).active[GCA_STAT_ALL].current, 0);
  assert_int_equal(stats_of(0).allocation[GCA_STAT_ALL].allocated, 0);
  assert_ok(gca_stream_query(NULL));

  assert_ok(gca_set_device(0));
  assert_status(gca_stream_query(NULL), GCA_ERR_NOT_READY, "");
  atomic_store(&gate0, 1);
  assert_ok(gca_stream_synchronize(NULL));
  assert_ok(gca_stream_destroy(s1));
}

static void set_device_tells_the_device_layer_only_on_change(void **state) {
  (void)state;
  gca_sim_counters_reset();
  assert_ok(gca_set_device(1));
  assert_int_equal(gca_sim_call_count("ctx_set_device"), 1);
  assert_ok(gca_set_device(1));
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  assert_int_equal(gca_sim_call_count("ctx_set_device"), 1);
  assert_status(gca_set_device(2), GCA_ERR_INVALID_ARGUMENT, "set_device");
  assert_status(gca_set_device(-1), GCA_ERR_INVALID_ARGUMENT, "set_device");
  assert_int_equal(gca_sim_call_count("ctx_set_device"), 1);
  int dev = -1;
  assert_ok(gca_get_device(&dev));
  assert_int_equal(dev, 1);
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 1);
  assert_ok(gca_set_device(0));
  assert_int_equal(gca_sim_call_count("ctx_set_device"), 2);
}

static void failed_set_device_changes_nothing(void **state) {
  (void)state;
  assert_ok(gca_sim_fault_set("ctx_set_device:nth=1"));
  assert_status(gca_set_device(1), GCA_ERR_DRIVER, "set_device: ctx_set_device: injected");
  gca_sim_fault_clear();
  int dev = -1;
  assert_ok(gca_get_device(&dev));
  assert_int_equal(dev, 0);
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 0);
  assert_ok(gca_set_device(1));
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 1);
  void *p = alloc_on(4096, NULL);
  assert_ok(gca_pointer_info(p, NULL, &dev));
  assert_int_equal(dev, 1);
  free_ok(p);
  assert_ok(gca_set_device(0));
}

static void reset_returns_the_thread_to_device_0(void **state) {
  (void)state;
  assert_ok(gca_set_device(1));
  assert_nothing_leaked();
  gca__allocator_reset();
  int dev = -1;
  assert_ok(gca_get_device(&dev));
  assert_int_equal(dev, 0);
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 0);
  gca_sim_counters_reset();
  assert_ok(gca_set_device(0)); /* the layer is told again after a reset */
  assert_int_equal(gca_sim_call_count("ctx_set_device"), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(null_stream_frees_on_device_1_use_its_legacy_stream,
                                      curdev_setup, curdev_teardown),
      cmocka_unit_test_setup_teardown(set_device_tells_the_device_layer_only_on_change,
                                      curdev_setup, curdev_teardown),
      cmocka_unit_test_setup_teardown(failed_set_device_changes_nothing, curdev_setup,
                                      curdev_teardown),
      cmocka_unit_test_setup_teardown(reset_returns_the_thread_to_device_0, curdev_setup,
                                      curdev_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
