/* SPDX-License-Identifier: Apache-2.0 */
/* test_sim_graph_update.c - graph_exec_update on the sim, following
 * cuGraphExecUpdate's limitations (cuda.h): a graph of the same topology and
 * node kinds hands its parameters to the exec (the next launch uses them),
 * kernel function changes included; a changed node count, dependency or node
 * type, a memcpy operand's memory type or device, or a memset target's device
 * is refused with the driver's result code, the offending node's index (none
 * for a node-count change) and a reason, and the exec keeps running as before.
 */
#include "gca.h"
#include "support.h"

#define N 64

static const gca_device_ops_t *ops;
static gca_stream_t s, s2;
static gca_devptr_t a, b, c;

static int setup(void **state) {
  (void)state;
  ops = test_backend();
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s2));
  assert_ok(ops->mem_alloc(0, N * 4, &a));
  assert_ok(ops->mem_alloc(0, N * 4, &b));
  assert_ok(ops->mem_alloc(0, N * 4, &c));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(0, b));
  assert_ok(ops->mem_free(0, c));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->stream_destroy(s2));
  return 0;
}

static void reset(void) {
  assert_ok(ops->memset_d32_async(a, 0, N, s));
  assert_ok(ops->memset_d32_async(b, 0, N, s));
  assert_ok(ops->memset_d32_async(c, 0, N, s));
  assert_ok(ops->stream_synchronize(s));
}

static void expect_fill(gca_devptr_t p, uint32_t value, uint32_t step) {
  const uint32_t *h = (const uint32_t *)(uintptr_t)p; /* sim: device memory is host memory */
  for (uint32_t i = 0; i < N; i++)
    if (h[i] != value + i * step)
      fail_msg("word %u: %u, wanted %u", i, h[i], value + i * step);
}

typedef enum shape { FILL, FILL_FILL, MEMSET, ADD, FORKED, LINEAR2 } shape_t;

/* Captures a small graph of the given shape writing to dst. */
static gca_graph_t capture(shape_t shape, gca_devptr_t dst, uint32_t value) {
  gca_graph_t g;
  gca_event_t e1, e2;
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  switch (shape) {
  case FILL:
    assert_ok(ops->kernel_fill_u32(dst, value, 2, N, s));
    break;
  case FILL_FILL:
    assert_ok(ops->kernel_fill_u32(dst, value, 2, N, s));
    assert_ok(ops->kernel_fill_u32(dst, value, 3, N, s));
    break;
  case MEMSET:
    assert_ok(ops->memset_d32_async(dst, value, N, s));
    break;
  case ADD:
    assert_ok(ops->kernel_add_u32(dst, dst, dst, N, s));
    break;
  case FORKED:  /* two independent fills joined by an add: deps {}, {}, {0,1} */
  case LINEAR2: /* the same nodes in a chain: deps {}, {0}, {1} */
    assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &e1));
    assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &e2));
    if (shape == FORKED) {
      assert_ok(ops->event_record(e1, s));
      assert_ok(ops->stream_wait_event(s2, e1));
      assert_ok(ops->kernel_fill_u32(dst, value, 1, N, s));
      assert_ok(ops->kernel_fill_u32(c, value, 0, N, s2));
      assert_ok(ops->event_record(e2, s2));
      assert_ok(ops->stream_wait_event(s, e2));
    } else {
      assert_ok(ops->kernel_fill_u32(dst, value, 1, N, s));
      assert_ok(ops->kernel_fill_u32(c, value, 0, N, s));
    }
    assert_ok(ops->kernel_add_u32(dst, dst, c, N, s));
    assert_ok(ops->event_destroy(e1));
    assert_ok(ops->event_destroy(e2));
    break;
  }
  assert_ok(ops->stream_end_capture(s, &g));
  return g;
}

static void launch(gca_graph_exec_t x) {
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
}

static void same_topology_update_takes_new_parameters(void **state) {
  (void)state;
  gca_graph_t g1 = capture(FILL, a, 1), g2 = capture(FILL, b, 7);
  gca_graph_exec_t x;
  gca_graph_update_info_t info;
  reset();
  assert_ok(ops->graph_instantiate(g1, &x));
  launch(x);
  expect_fill(a, 1, 2);
  expect_fill(b, 0, 0);
  reset();
  assert_ok(ops->graph_exec_update(x, g2, &info));
  assert_int_equal(info.result, GCA_GRAPH_UPDATE_SUCCESS);
  assert_int_equal(info.error_node_index, SIZE_MAX);
  expect_fill(b, 0, 0); /* an update runs nothing */
  /* the exec keeps its own copy: the source graph may go */
  assert_ok(ops->graph_destroy(g2));
  launch(x);
  expect_fill(a, 0, 0);
  expect_fill(b, 7, 2);
  /* a forked graph updates from another forked graph */
  gca_graph_t f1 = capture(FORKED, a, 1), f2 = capture(FORKED, b, 5);
  gca_graph_exec_t xf;
  assert_ok(ops->graph_instantiate(f1, &xf));
  assert_ok(ops->graph_exec_update(xf, f2, &info));
  reset();
  launch(xf);
  expect_fill(b, 10, 1);
  assert_ok(ops->graph_exec_destroy(xf));
  assert_ok(ops->graph_destroy(f1));
  assert_ok(ops->graph_destroy(f2));
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g1));
}

/* The update of an exec of `from` by a graph of `to` is refused with `result`
 * at node `index`, the reason mentions `needle`, and the exec still runs `from`. */
static void expect_refused(shape_t from, shape_t to, gca_graph_update_result_t result, size_t index,
                           const char *needle) {
  gca_graph_t g1 = capture(from, a, 1), g2 = capture(to, b, 7);
  gca_graph_exec_t x;
  gca_graph_update_info_t info;
  assert_ok(ops->graph_instantiate(g1, &x));
  assert_status(ops->graph_exec_update(x, g2, &info), GCA_ERR_GRAPH_UPDATE, needle);
  assert_int_equal(info.result, result);
  assert_int_equal(info.error_node_index, index);
  if (strstr(info.reason, needle) == NULL)
    fail_msg("reason '%s' does not mention '%s'", info.reason, needle);
  reset();
  launch(x);
  expect_fill(b, 0, 0);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g1));
  assert_ok(ops->graph_destroy(g2));
}

static void node_count_change_is_topology_changed(void **state) {
  (void)state;
  /* cuda.h: "The count of nodes ... differ, in which case resultInfo->errorNode is set to NULL" */
  expect_refused(FILL, FILL_FILL, GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED, SIZE_MAX,
                 "2 nodes, the exec 1");
  expect_refused(FILL_FILL, FILL, GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED, SIZE_MAX,
                 "1 nodes, the exec 2");
}

static void dependency_change_is_topology_changed(void **state) {
  (void)state;
  expect_refused(FORKED, LINEAR2, GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED, 1, "dependencies changed");
}

static void node_kind_change_is_node_type_changed(void **state) {
  (void)state;
  expect_refused(FILL, MEMSET, GCA_GRAPH_UPDATE_NODE_TYPE_CHANGED, 0,
                 "kernel fill_u32 became memset");
}

/* Kernel nodes may change function within cuda.h's limits (same context, no
 * CDP, device-side launch or cooperative change): the sim's kernels qualify. */
static void kernel_function_change_is_accepted(void **state) {
  (void)state;
  gca_graph_t g1 = capture(FILL, b, 1), g2 = capture(ADD, b, 0);
  gca_graph_exec_t x;
  gca_graph_update_info_t info;
  assert_ok(ops->graph_instantiate(g1, &x));
  assert_ok(ops->graph_exec_update(x, g2, &info));
  assert_int_equal(info.result, GCA_GRAPH_UPDATE_SUCCESS);
  assert_int_equal(info.error_node_index, SIZE_MAX);
  reset();
  assert_ok(ops->kernel_fill_u32(b, 3, 1, N, s));
  launch(x); /* b = b + b now, no longer a fill */
  expect_fill(b, 6, 2);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g1));
  assert_ok(ops->graph_destroy(g2));
}

static gca_graph_t capture_copy(gca_devptr_t dst, gca_devptr_t src) {
  gca_graph_t g;
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->kernel_fill_u32(c, 1, 1, N, s));
  assert_ok(ops->memcpy_async(dst, src, N * 4, s));
  assert_ok(ops->stream_end_capture(s, &g));
  return g;
}

static gca_graph_t capture_memset(gca_devptr_t dst) {
  gca_graph_t g;
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->memset_d32_async(dst, 9, N, s));
  assert_ok(ops->stream_end_capture(s, &g));
  return g;
}

/* Updates an exec of g1 with g2 and expects PARAMETERS_CHANGED at node `index`. */
static void expect_parameters_changed(gca_graph_t g1, gca_graph_t g2, size_t index,
                                      const char *needle) {
  gca_graph_exec_t x;
  gca_graph_update_info_t info;
  assert_ok(ops->graph_instantiate(g1, &x));
  assert_status(ops->graph_exec_update(x, g2, &info), GCA_ERR_GRAPH_UPDATE, needle);
  assert_int_equal(info.result, GCA_GRAPH_UPDATE_PARAMETERS_CHANGED);
  assert_int_equal(info.error_node_index, index);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g1));
  assert_ok(ops->graph_destroy(g2));
}

/* cuda.h: "Changing either the source or destination memory type ... is not
 * supported". A copy captured from memcpy_async names both sides by unified
 * address, whose type never changes: on an H200 (driver 580) an update that
 * turns a device side into pinned host memory succeeds, and launches copy
 * there (contract test exec_update_follows_the_drivers_limitations). */
static void memcpy_memory_type_change_updates(void **state) {
  (void)state;
  static uint32_t host[N]; /* registered, as a program keeps copy targets pinned */
  assert_ok(ops->host_register(host, sizeof(host)));
  gca_devptr_t h = (gca_devptr_t)(uintptr_t)host;
  gca_graph_t g1 = capture_copy(a, c), g2 = capture_copy(b, c), g3 = capture_copy(h, c),
              g4 = capture_copy(a, h);
  gca_graph_exec_t x;
  gca_graph_update_info_t info;
  assert_ok(ops->graph_instantiate(g1, &x));
  assert_ok(ops->graph_exec_update(x, g2, &info));
  reset();
  launch(x);
  expect_fill(b, 1, 1);
  assert_ok(ops->graph_exec_update(x, g3, &info)); /* device destination -> host */
  assert_int_equal(info.result, GCA_GRAPH_UPDATE_SUCCESS);
  reset();
  launch(x);
  for (uint32_t i = 0; i < N; i++)
    assert_int_equal(host[i], 1 + i);
  assert_ok(ops->graph_exec_update(x, g4, &info)); /* device source -> host */
  assert_int_equal(info.result, GCA_GRAPH_UPDATE_SUCCESS);
  for (uint32_t i = 0; i < N; i++)
    host[i] = 50 + i;
  reset();
  launch(x);
  expect_fill(a, 50, 1);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g1));
  assert_ok(ops->graph_destroy(g2));
  assert_ok(ops->graph_destroy(g3));
  assert_ok(ops->graph_destroy(g4));
  assert_ok(ops->host_unregister(host));
}

/* "The CUDA device(s) to which the operand(s) was allocated/mapped cannot change." */
static void memset_target_on_another_device_is_parameters_changed(void **state) {
  (void)state;
  int n = 0;
  assert_ok(ops->device_count(&n));
  if (n < 2) {
    printf("SKIP: needs two devices (found %d)\n", n);
    skip();
  }
  gca_devptr_t d1;
  gca_status_t pst = ops->ctx_enable_peer_access(0, 1); /* device 0's stream writes d1 */
  if (pst != GCA_OK && pst != GCA_ERR_INVALID_STATE)
    fail_msg("ctx_enable_peer_access(0, 1): %s", gca_last_error());
  assert_ok(ops->mem_alloc(1, N * 4, &d1));
  expect_parameters_changed(capture_memset(a), capture_memset(d1), 0,
                            "memset target moved from device 0 to 1");
  expect_parameters_changed(capture_copy(a, c), capture_copy(d1, c), 1,
                            "memcpy destination moved from device 0 to 1");
  assert_ok(ops->mem_free(1, d1));
}

static void update_refuses_bad_arguments_and_injected_faults(void **state) {
  (void)state;
  gca_graph_t g1 = capture(FILL, a, 1), g2 = capture(FILL, b, 7);
  gca_graph_exec_t x;
  gca_graph_update_info_t info;
  assert_ok(ops->graph_instantiate(g1, &x));
  assert_status(ops->graph_exec_update(x, g2, NULL), GCA_ERR_INVALID_ARGUMENT, "info");
  assert_status(ops->graph_exec_update(x, (gca_graph_t)(void *)x, &info), GCA_ERR_INVALID_HANDLE,
                "not a live graph");
  assert_ok(gca_sim_fault_set("graph_exec_update:nth=1"));
  assert_status(ops->graph_exec_update(x, g2, &info), GCA_ERR_DRIVER, "graph_exec_update");
  gca_sim_fault_clear();
  reset();
  launch(x); /* still the original parameters */
  expect_fill(a, 1, 2);
  expect_fill(b, 0, 0);
  assert_ok(ops->graph_exec_destroy(x));
  assert_status(ops->graph_exec_update(x, g2, &info), GCA_ERR_INVALID_HANDLE, "not a live exec");
  assert_ok(ops->graph_destroy(g1));
  assert_ok(ops->graph_destroy(g2));
}

/* Captures a launch of an exec of `inner` (a child-graph node) followed by a memset of c. */
static gca_graph_t capture_outer(shape_t inner, gca_devptr_t dst, uint32_t value) {
  gca_graph_t gi = capture(inner, dst, value), g;
  gca_graph_exec_t xi;
  assert_ok(ops->graph_instantiate(gi, &xi));
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->graph_launch(xi, s));
  assert_ok(ops->memset_d32_async(c, 3, N, s));
  assert_ok(ops->stream_end_capture(s, &g));
  assert_ok(ops->graph_exec_destroy(xi));
  assert_ok(ops->graph_destroy(gi));
  return g;
}

static void captured_graph_launch_is_a_child_graph_node(void **state) {
  (void)state;
  gca_graph_t g1 = capture_outer(FILL, a, 1), g2 = capture_outer(FILL, b, 7),
              g3 = capture_outer(MEMSET, b, 7);
  gca_graph_exec_t x;
  gca_graph_update_info_t info;
  size_t count;
  assert_ok(ops->graph_node_count(g1, &count));
  assert_int_equal(count, 2);
  reset();
  assert_ok(ops->graph_instantiate(g1, &x));
  launch(x);
  expect_fill(a, 1, 2);
  expect_fill(c, 3, 0);
  assert_ok(ops->graph_exec_update(x, g2, &info));
  reset();
  launch(x);
  expect_fill(a, 0, 0);
  expect_fill(b, 7, 2);
  assert_status(ops->graph_exec_update(x, g3, &info), GCA_ERR_GRAPH_UPDATE, "child graph");
  assert_int_equal(info.result, GCA_GRAPH_UPDATE_NODE_TYPE_CHANGED);
  assert_int_equal(info.error_node_index, 0);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g1));
  assert_ok(ops->graph_destroy(g2));
  assert_ok(ops->graph_destroy(g3));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_topology_update_takes_new_parameters),
      cmocka_unit_test(node_count_change_is_topology_changed),
      cmocka_unit_test(dependency_change_is_topology_changed),
      cmocka_unit_test(node_kind_change_is_node_type_changed),
      cmocka_unit_test(kernel_function_change_is_accepted),
      cmocka_unit_test(memcpy_memory_type_change_updates),
      cmocka_unit_test(memset_target_on_another_device_is_parameters_changed),
      cmocka_unit_test(update_refuses_bad_arguments_and_injected_faults),
      cmocka_unit_test(captured_graph_launch_is_a_child_graph_node),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
