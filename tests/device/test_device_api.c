/* SPDX-License-Identifier: Apache-2.0 */
/* test_device_api.c - the public device API (gca/device.h) on the sim backend.
 *
 * Each call is exercised through the public names only; the internals this
 * file uses (the allocator walker, for the leak and validity checks after a
 * forced fault) come from support.h. Ordering is shown with a gate: a host
 * function blocked on a condition variable holds a stream back until the test
 * opens it, so "not yet done" is asserted while the gate is shut, never by
 * timing.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "device.h"
#include "gca.h"
#include "support.h"

#define N 4096u

static int setup(void **state) {
  (void)state;
  assert_ok(gca_device_init());
  assert_string_equal(gca_device_backend_name(), "sim");
  gca_sim_fault_clear();
  assert_ok(gca_set_device(0));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  gca_sim_fault_clear();
  assert_ok(gca_empty_cache());
  assert_ok(gca__allocator_check());
  assert_int_equal(gca_sim_used_bytes(0), 0);
  return 0;
}

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  assert_ok(gca_malloc(&p, bytes, NULL));
  assert_non_null(p);
  return p;
}

static void streams_create_query_synchronize_destroy(void **state) {
  (void)state;
  gca_stream_t a = NULL, b = NULL;
  assert_ok(gca_stream_create(&a, GCA_STREAM_DEFAULT));
  assert_ok(gca_stream_create(&b, GCA_STREAM_NON_BLOCKING));
  assert_non_null(a);
  assert_non_null(b);
  assert_true(a != b);
  assert_ok(gca_stream_query(a));
  assert_ok(gca_kernel_sleep(1000, b));
  assert_ok(gca_stream_synchronize(b));
  assert_ok(gca_stream_query(b));
  assert_ok(gca_stream_synchronize(NULL));
  assert_ok(gca_stream_query(NULL));
  assert_ok(gca_device_synchronize());
  assert_ok(gca_stream_destroy(a));
  assert_ok(gca_stream_destroy(b));
}

static void copies_and_memsets_round_trip_in_stream_order(void **state) {
  (void)state;
  uint32_t *host = calloc(N, sizeof(uint32_t));
  assert_non_null(host);
  uint32_t *d = dev_alloc(N * sizeof(uint32_t));
  gca_stream_t s = NULL;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));

  /* memset, then a copy out, queued back to back: the copy sees the memset. */
  assert_ok(gca_memset_d32_async(d, 0xabcd1234u, N, s));
  assert_ok(gca_memcpy_async(host, d, N * sizeof(uint32_t), s));
  assert_ok(gca_stream_synchronize(s));
  for (uint32_t i = 0; i < N; i++)
    assert_int_equal(host[i], 0xabcd1234u);

  /* Host to device, byte memset over the first quarter, device to host. */
  for (uint32_t i = 0; i < N; i++)
    host[i] = i * 3u;
  assert_ok(gca_memcpy(d, host, N * sizeof(uint32_t)));
  assert_ok(gca_memset_d8(d, 0x5a, N));
  memset(host, 0, N * sizeof(uint32_t));
  assert_ok(gca_memcpy(host, d, N * sizeof(uint32_t)));
  for (uint32_t i = 0; i < N / 4; i++)
    assert_int_equal(host[i], 0x5a5a5a5au);
  for (uint32_t i = N / 4; i < N; i++)
    assert_int_equal(host[i], i * 3u);

  /* Synchronous D32 memset and an async D8 one on the stream. */
  assert_ok(gca_memset_d32(d, 7u, N));
  assert_ok(gca_memset_d8_async(d, 0, sizeof(uint32_t), s));
  assert_ok(gca_memcpy_async(host, d, 2 * sizeof(uint32_t), s));
  assert_ok(gca_stream_synchronize(s));
  assert_int_equal(host[0], 0);
  assert_int_equal(host[1], 7u);

  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_free(d));
  free(host);
}

static void kernels_fill_and_add(void **state) {
  (void)state;
  uint32_t *a = dev_alloc(N * 4), *b = dev_alloc(N * 4), *c = dev_alloc(N * 4);
  uint32_t *host = calloc(N, sizeof(uint32_t));
  assert_non_null(host);
  assert_ok(gca_kernel_fill_u32(a, 10u, 1u, N, NULL));
  assert_ok(gca_kernel_fill_u32(b, 5u, 2u, N, NULL));
  assert_ok(gca_kernel_add_u32(c, a, b, N, NULL));
  assert_ok(gca_memcpy(host, c, N * 4));
  for (uint32_t i = 0; i < N; i++)
    assert_int_equal(host[i], 15u + 3u * i);
  free(host);
  assert_ok(gca_free(a));
  assert_ok(gca_free(b));
  assert_ok(gca_free(c));
}

/* The compute kernels through the public names: a 2x3 . 3x2 product, AXPY
 * and dot on it; bad arguments are refused before the backend is called,
 * the detail naming both the function and the kernel. */
static void compute_kernels_run_and_refuse_bad_arguments(void **state) {
  (void)state;
  const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1};
  float *da = dev_alloc(sizeof(a)), *db = dev_alloc(sizeof(b)), *dc = dev_alloc(4 * 4);
  float *dd = dev_alloc(4), c[4], dot;
  assert_ok(gca_memcpy(da, a, sizeof(a)));
  assert_ok(gca_memcpy(db, b, sizeof(b)));
  assert_ok(gca_kernel_gemm_f32(dc, da, db, 2, 2, 3, 0, NULL));
  assert_ok(gca_memcpy(c, dc, sizeof(c)));
  assert_true(c[0] == 4 && c[1] == 5 && c[2] == 10 && c[3] == 11);
  assert_ok(gca_kernel_ew_f32(GCA_EW_AXPY, dc, dc, dc, -0.5f, 0, 4, NULL)); /* c / 2 */
  assert_ok(gca_kernel_dot_f32(dd, dc, dc, 4, 2.0f, NULL));
  assert_ok(gca_memcpy(&dot, dd, 4));
  assert_true(dot == 2.0f * (4 + 6.25f + 25 + 30.25f));

  int64_t before = gca_sim_call_count("kernel_gemm_f32");
  assert_status(gca_kernel_gemm_f32(dc, da, db, 2, 2, 3, 0x10, NULL), GCA_ERR_INVALID_ARGUMENT,
                "gca_kernel_gemm_f32: kernel_gemm_f32: flags 0x10 has bits outside");
  assert_status(gca_kernel_gemm_f32(dc, da, dc, 2, 2, 2, 0, NULL), GCA_ERR_INVALID_ARGUMENT,
                "gca_kernel_gemm_f32: kernel_gemm_f32: C [0x");
  assert_int_equal(gca_sim_call_count("kernel_gemm_f32"), before);
  assert_status(gca_kernel_ew_f32(GCA_EW_MUL, dc, da, NULL, 1, 0, 4, NULL),
                GCA_ERR_INVALID_ARGUMENT, "gca_kernel_ew_f32: kernel_ew_f32: b is NULL");
  assert_status(gca_kernel_ew_f32((gca_ew_op_t)42, dc, da, db, 1, 0, 4, NULL),
                GCA_ERR_INVALID_ARGUMENT, "gca_kernel_ew_f32: kernel_ew_f32: op 42");
  assert_status(gca_kernel_dot_f32((char *)dd + 1, da, db, 4, 1, NULL), GCA_ERR_INVALID_ARGUMENT,
                "gca_kernel_dot_f32: kernel_dot_f32: dst 0x");
  assert_ok(gca_free(da));
  assert_ok(gca_free(db));
  assert_ok(gca_free(dc));
  assert_ok(gca_free(dd));
}

static void event_completes_only_after_the_gate_opens(void **state) {
  (void)state;
  test_gate_t g;
  test_gate_init(&g);
  gca_stream_t s1 = NULL, s2 = NULL;
  gca_event_t start = NULL, done = NULL;
  assert_ok(gca_stream_create(&s1, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_event_create(&start, GCA_EVENT_DEFAULT));
  assert_ok(gca_event_create(&done, GCA_EVENT_BLOCKING_SYNC));
  uint32_t *d = dev_alloc(N * 4);
  uint32_t *host = calloc(N, sizeof(uint32_t));
  assert_non_null(host);
  /* pinned: a copy into pageable memory would return only once it landed */
  const gca_device_ops_t *ops = gca__device();
  assert_ok(ops->host_register(host, N * sizeof(uint32_t)));

  assert_ok(gca_memset_d32(d, 0, N));
  assert_ok(gca_event_record(start, s1));
  assert_ok(gca_launch_host_func(s1, test_gate_pass, &g));
  assert_ok(gca_kernel_fill_u32(d, 100u, 1u, N, s1));
  assert_ok(gca_event_record(done, s1));
  /* s2 copies out after `done`: the copy cannot run before the fill. */
  assert_ok(gca_stream_wait_event(s2, done));
  assert_ok(gca_memcpy_async(host, d, N * 4, s2));

  assert_status(gca_event_query(done), GCA_ERR_NOT_READY, "gca_event_query: event_query:");
  assert_status(gca_stream_query(s1), GCA_ERR_NOT_READY, "gca_stream_query: stream_query:");
  assert_status(gca_stream_query(s2), GCA_ERR_NOT_READY, "pending");
  float ms = -1.0f;
  assert_status(gca_event_elapsed_time(&ms, start, done), GCA_ERR_NOT_READY,
                "gca_event_elapsed_time: event_elapsed:");

  test_gate_open(&g);
  assert_ok(gca_event_synchronize(done));
  assert_ok(gca_event_query(done));
  assert_ok(gca_stream_synchronize(s2));
  for (uint32_t i = 0; i < N; i++)
    assert_int_equal(host[i], 100u + i);
  assert_ok(gca_event_elapsed_time(&ms, start, done));
  assert_true(ms >= 0.0f);

  assert_ok(gca_event_destroy(start));
  assert_ok(gca_event_destroy(done));
  assert_ok(gca_stream_destroy(s1));
  assert_ok(gca_stream_destroy(s2));
  assert_ok(gca_free(d));
  assert_ok(ops->host_unregister(host));
  free(host);
  test_gate_fini(&g);
}

static void elapsed_time_needs_timing_events(void **state) {
  (void)state;
  gca_event_t a = NULL, b = NULL;
  assert_ok(gca_event_create(&a, GCA_EVENT_DISABLE_TIMING));
  assert_ok(gca_event_create(&b, GCA_EVENT_DEFAULT));
  assert_ok(gca_event_record(a, NULL));
  assert_ok(gca_event_record(b, NULL));
  assert_ok(gca_event_synchronize(b));
  float ms = 0;
  assert_status(gca_event_elapsed_time(&ms, a, b), GCA_ERR_INVALID_HANDLE, "DISABLE_TIMING");
  assert_ok(gca_event_destroy(a));
  assert_ok(gca_event_destroy(b));
}

static void captured_graph_replays_the_work(void **state) {
  (void)state;
  gca_stream_t s = NULL;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  uint32_t *d = dev_alloc(N * 4);
  uint32_t *host = calloc(N, sizeof(uint32_t));
  assert_non_null(host);
  assert_ok(gca_memset_d32(d, 0, N));

  gca_capture_status_t cs = GCA_CAPTURE_STATUS_ACTIVE;
  assert_ok(gca_stream_capture_status(s, &cs));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_NONE);
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  assert_ok(gca_stream_capture_status(s, &cs));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_ACTIVE);
  assert_ok(gca_kernel_fill_u32(d, 9u, 0u, N, s));
  gca_graph_t graph = NULL;
  assert_ok(gca_stream_end_capture(s, &graph));
  assert_non_null(graph);

  /* Captured, not run: the memory still holds zeros. */
  assert_ok(gca_memcpy(host, d, N * 4));
  assert_int_equal(host[0], 0);

  gca_graph_exec_t exec = NULL;
  assert_ok(gca_graph_instantiate(&exec, graph));
  assert_ok(gca_graph_launch(exec, s));
  assert_ok(gca_memcpy_async(host, d, N * 4, s));
  assert_ok(gca_stream_synchronize(s));
  for (uint32_t i = 0; i < N; i++)
    assert_int_equal(host[i], 9u);

  assert_ok(gca_graph_exec_destroy(exec));
  assert_ok(gca_graph_destroy(graph));
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_free(d));
  free(host);
}

static void device_info_and_current_device(void **state) {
  (void)state;
  size_t free_b = 0, total_b = 0;
  assert_ok(gca_mem_get_info(&free_b, &total_b));
  assert_true(total_b > 0);
  assert_true(free_b <= total_b);
  char name[128];
  assert_ok(gca_device_name(0, name, sizeof(name)));
  assert_true(strlen(name) > 0);
  int dev = -1;
  assert_ok(gca_get_device(&dev));
  assert_int_equal(dev, 0);
  int n = 0;
  assert_ok(gca_device_count(&n));
  assert_status(gca_set_device(n), GCA_ERR_INVALID_ARGUMENT, "set_device");
}

static void bad_arguments_are_refused_with_a_clear_detail(void **state) {
  (void)state;
  gca_stream_t s = NULL;
  gca_event_t e = NULL;
  float ms;
  size_t x;
  assert_status(gca_stream_create(NULL, 0), GCA_ERR_INVALID_ARGUMENT,
                "gca_stream_create: the stream out-pointer is NULL");
  assert_status(gca_stream_create(&s, 0x8u), GCA_ERR_INVALID_ARGUMENT,
                "gca_stream_create: flags 0x8");
  assert_null(s);
  assert_status(gca_event_create(NULL, 0), GCA_ERR_INVALID_ARGUMENT,
                "gca_event_create: the event out-pointer is NULL");
  assert_status(gca_event_create(&e, 0x10u), GCA_ERR_INVALID_ARGUMENT,
                "gca_event_create: flags 0x10");
  assert_null(e);
  assert_status(gca_stream_destroy(NULL), GCA_ERR_INVALID_HANDLE, "legacy (NULL) stream");
  assert_status(gca_event_record(NULL, NULL), GCA_ERR_INVALID_ARGUMENT,
                "gca_event_record: event is NULL");
  assert_status(gca_stream_wait_event(NULL, NULL), GCA_ERR_INVALID_ARGUMENT,
                "gca_stream_wait_event: event is NULL");
  assert_status(gca_event_elapsed_time(NULL, NULL, NULL), GCA_ERR_INVALID_ARGUMENT,
                "milliseconds out-pointer");
  assert_status(gca_mem_get_info(NULL, &x), GCA_ERR_INVALID_ARGUMENT, "free_bytes is NULL");
  assert_status(gca_memcpy(NULL, &x, sizeof(x)), GCA_ERR_INVALID_ARGUMENT, "gca_memcpy: dst");
  assert_status(gca_memset_d32_async(NULL, 0, 4, NULL), GCA_ERR_INVALID_ARGUMENT, "dst is NULL");
  assert_status(gca_launch_host_func(NULL, NULL, NULL), GCA_ERR_INVALID_ARGUMENT,
                "host function is NULL");
  assert_status(gca_stream_begin_capture(NULL, (gca_capture_mode_t)7), GCA_ERR_INVALID_ARGUMENT,
                "capture mode 7");
  assert_status(gca_stream_end_capture(NULL, NULL), GCA_ERR_INVALID_ARGUMENT, "graph out-pointer");
  assert_status(gca_graph_instantiate(NULL, NULL), GCA_ERR_INVALID_ARGUMENT, "exec out-pointer");
  assert_status(gca_graph_launch(NULL, NULL), GCA_ERR_INVALID_ARGUMENT, "exec is NULL");
  assert_status(gca_device_name(0, NULL, 0), GCA_ERR_INVALID_ARGUMENT, "name buffer");
  (void)ms;

  /* Destroyed handles: the backend's own check, named. */
  assert_ok(gca_stream_create(&s, GCA_STREAM_DEFAULT));
  assert_ok(gca_stream_destroy(s));
  assert_status(gca_stream_query(s), GCA_ERR_INVALID_HANDLE,
                "gca_stream_query: stream_query: stream");
  assert_status(gca_stream_destroy(s), GCA_ERR_INVALID_HANDLE,
                "gca_stream_destroy: stream_destroy:");
  assert_ok(gca_event_create(&e, GCA_EVENT_DEFAULT));
  assert_ok(gca_event_destroy(e));
  assert_status(gca_event_query(e), GCA_ERR_INVALID_HANDLE, "gca_event_query: event_query:");
  assert_status(gca_event_synchronize(e), GCA_ERR_INVALID_HANDLE, "not a live event");
}

/* A fault injected in each underlying operation comes back as its status with
 * the public name and the operation's name in the detail. */
/* Opens the gate once the synchronous copy's first retry has begun waiting:
 * a condition on a call counter, never a time. */
typedef struct opener {
  test_gate_t *gate;
  int64_t base; /* stream_synchronize calls before the copy */
  _Atomic int stop;
} opener_t;

static void *open_on_retry(void *arg) {
  opener_t *o = arg;
  while (!atomic_load(&o->stop) && gca_sim_call_count("stream_synchronize") < o->base + 2)
    sched_yield();
  test_gate_open(o->gate);
  return NULL;
}

/* gca_memcpy's wait fails (an injected stream_synchronize fault) while the
 * copy is still held back: the call reports the failure with its name only
 * after the copy has landed in the caller's buffer, so nothing writes the
 * buffer after the error returns. */
static void failed_synchronous_copy_returns_after_the_copy_landed(void **state) {
  (void)state;
  test_gate_t g;
  test_gate_init(&g);
  uint32_t *d = dev_alloc(N * 4);
  uint32_t *host = calloc(N, sizeof(uint32_t));
  assert_non_null(host);
  /* pinned: into pageable memory the copy itself would wait, not gca_memcpy */
  const gca_device_ops_t *ops = gca__device();
  assert_ok(ops->host_register(host, N * sizeof(uint32_t)));
  assert_ok(gca_memset_d32(d, 0x5eedu, N));
  assert_ok(gca_launch_host_func(GCA_STREAM_LEGACY, test_gate_pass, &g));
  opener_t o = {.gate = &g, .base = gca_sim_call_count("stream_synchronize")};
  pthread_t th;
  assert_ok(gca_sim_fault_set("stream_synchronize:nth=1"));
  assert_int_equal(pthread_create(&th, NULL, open_on_retry, &o), 0);
  gca_status_t st = gca_memcpy(host, d, N * 4);
  char detail[512];
  snprintf(detail, sizeof(detail), "%s", gca_last_error());
  gca_sim_fault_clear();
  bool landed = true;
  for (uint32_t i = 0; i < N; i++)
    landed &= host[i] == 0x5eedu;
  atomic_store(&o.stop, 1);
  test_gate_open(&g);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_ok(gca_stream_synchronize(GCA_STREAM_LEGACY));
  assert_int_equal(st, GCA_ERR_DRIVER);
  if (!strstr(detail, "gca_memcpy") || !strstr(detail, "stream_synchronize: injected fault"))
    fail_msg("gca_memcpy's detail '%s' does not name the call and the failed wait", detail);
  assert_true(landed);
  assert_ok(gca__allocator_check());
  assert_ok(ops->host_unregister(host));
  assert_ok(gca_free(d));
  free(host);
  test_gate_fini(&g);
}

static void injected_faults_surface_with_the_operation_name(void **state) {
  (void)state;
  uint32_t *d = dev_alloc(64);
  uint32_t host[16];
  gca_stream_t s = NULL;
  gca_event_t e = NULL;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_event_create(&e, GCA_EVENT_DEFAULT));
  gca_stream_t s2 = NULL;
  gca_event_t e2 = NULL;
  gca_graph_t g = NULL;

  struct {
    const char *fault, *needle;
  } cases[] = {
      {"stream_create:nth=1", "gca_stream_create: stream_create: injected fault"},
      {"event_create:nth=1", "gca_event_create: event_create: injected fault"},
      {"memcpy_async:nth=1", "gca_memcpy: memcpy_async: injected fault"},
      {"stream_synchronize:nth=1", "gca_memset_d8: stream_synchronize: injected fault"},
      {"memset_d32_async:nth=1", "gca_memset_d32_async: memset_d32_async: injected fault"},
      {"event_record:nth=1", "gca_event_record: event_record: injected fault"},
      {"kernel_fill_u32:nth=1", "gca_kernel_fill_u32: kernel_fill_u32: injected fault"},
      {"ctx_synchronize:nth=1", "gca_device_synchronize: ctx_synchronize: injected fault"},
      {"stream_begin_capture:nth=1",
       "gca_stream_begin_capture: stream_begin_capture: injected fault"},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(cases); i++) {
    assert_ok(gca_sim_fault_set(cases[i].fault));
    gca_status_t st;
    gca_clear_last_error();
    switch (i) {
    case 0:
      st = gca_stream_create(&s2, 0);
      break;
    case 1:
      st = gca_event_create(&e2, 0);
      break;
    case 2:
      st = gca_memcpy(host, d, sizeof(host));
      break;
    case 3:
      st = gca_memset_d8(d, 1, 64);
      break;
    case 4:
      st = gca_memset_d32_async(d, 1, 16, s);
      break;
    case 5:
      st = gca_event_record(e, s);
      break;
    case 6:
      st = gca_kernel_fill_u32(d, 1, 1, 16, s);
      break;
    case 7:
      st = gca_device_synchronize();
      break;
    default:
      st = gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL);
      break;
    }
    gca_sim_fault_clear();
    if (st == GCA_OK || strstr(gca_last_error(), cases[i].needle) == NULL)
      fail_msg("%s: %s: '%s' does not mention '%s'", cases[i].fault, gca_status_name(st),
               gca_last_error(), cases[i].needle);
    assert_ok(gca__allocator_check());
  }
  assert_null(s2);
  assert_null(e2);
  assert_null(g);
  /* Everything still works once the faults are cleared. The memset whose
   * synchronize failed may still be queued on the legacy stream, which the
   * non-blocking stream s does not wait for: drain the device first. */
  assert_ok(gca_device_synchronize());
  assert_ok(gca_kernel_fill_u32(d, 4u, 0u, 16, s));
  assert_ok(gca_memcpy_async(host, d, sizeof(host), s));
  assert_ok(gca_stream_synchronize(s));
  assert_int_equal(host[15], 4u);
  assert_ok(gca_event_destroy(e));
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_free(d));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(streams_create_query_synchronize_destroy, setup, teardown),
      cmocka_unit_test_setup_teardown(copies_and_memsets_round_trip_in_stream_order, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(kernels_fill_and_add, setup, teardown),
      cmocka_unit_test_setup_teardown(compute_kernels_run_and_refuse_bad_arguments, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(event_completes_only_after_the_gate_opens, setup, teardown),
      cmocka_unit_test_setup_teardown(elapsed_time_needs_timing_events, setup, teardown),
      cmocka_unit_test_setup_teardown(captured_graph_replays_the_work, setup, teardown),
      cmocka_unit_test_setup_teardown(device_info_and_current_device, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_arguments_are_refused_with_a_clear_detail, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(failed_synchronous_copy_returns_after_the_copy_landed, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(injected_faults_surface_with_the_operation_name, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
