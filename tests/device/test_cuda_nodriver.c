/* SPDX-License-Identifier: Apache-2.0 */
/* test_cuda_nodriver.c - the cuda backend on a machine without a usable
 * driver: init fails cleanly with GCA_ERR_NO_DEVICE and a message naming what
 * was missing, and every op afterwards returns an error instead of crashing.
 *
 * The backend initializes once per process, so each case runs in a forked
 * child with its own environment (GCA_CUDA_LIBRARY) and reports back through a
 * temporary file: exit 0 passed, 1 failed (the file says why), 77 skipped.
 * Cases that expect no driver skip when a real driver and device are present;
 * a build without cuda.h checks only that every op fails with NOT_SUPPORTED.
 */
#include "child.h"

#define MISSING_LIBRARY "/nonexistent/gca-test/libcuda.so.1"

GCA_PRINTF(2, 3) static int skipf(report_t *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->text, sizeof(r->text), fmt, ap);
  va_end(ap);
  return CHILD_SKIP;
}

/* Runs fn in a child with GCA_CUDA_LIBRARY set to `library` (NULL: unset) and
 * turns its exit code into a cmocka pass, failure or skip. */
static void run_in_child(const char *library, child_fn fn) {
  const char *env[] = {"GCA_CUDA_LIBRARY", library, NULL};
  run_child(env, fn, NULL, 0);
}

static bool built_without_cuda_h(gca_status_t st) {
  return st == GCA_ERR_NOT_SUPPORTED && strstr(gca_last_error(), "built without cuda.h");
}

/* ---- every op, called with harmless arguments ---- */

#define FAKE_STREAM ((gca_stream_t)(uintptr_t)0x1000)
#define FAKE_EVENT  ((gca_event_t)(uintptr_t)0x2000)
#define FAKE_GRAPH  ((gca_graph_t)(uintptr_t)0x3000)
#define FAKE_EXEC   ((gca_graph_exec_t)(uintptr_t)0x4000)

static void host_fn(void *p) {
  (void)p;
}

#define EVERY_OP(X)                                                                        \
  X(init, ops->init())                                                                     \
  X(device_count, ops->device_count(&i))                                                   \
  X(device_attr, ops->device_attr(0, GCA_ATTR_CC_MAJOR, &i))                               \
  X(device_name, ops->device_name(0, name, sizeof(name)))                                  \
  X(device_can_access_peer, ops->device_can_access_peer(0, 1, &i))                         \
  X(mem_get_info, ops->mem_get_info(0, &sz, &sz2))                                         \
  X(mem_alloc, ops->mem_alloc(0, 1 << 20, &ptr))                                           \
  X(mem_free, ops->mem_free(0, 0x10000))                                                   \
  X(mem_granularity, ops->mem_granularity(0, false, &sz))                                  \
  X(mem_address_reserve, ops->mem_address_reserve(0, 2 << 20, 0, &ptr))                    \
  X(mem_address_free, ops->mem_address_free(0, 0x200000, 2 << 20))                         \
  X(mem_create, ops->mem_create(0, 2 << 20, &handle))                                      \
  X(mem_release, ops->mem_release(1))                                                      \
  X(mem_map, ops->mem_map(0x200000, 2 << 20, 0, 1))                                        \
  X(mem_unmap, ops->mem_unmap(0x200000, 2 << 20))                                          \
  X(mem_set_access, ops->mem_set_access(0x200000, 2 << 20, devs, 2))                       \
  X(mem_export_fd, ops->mem_export_fd(1, &i))                                              \
  X(mem_import_fd, ops->mem_import_fd(0, 0, &handle))                                      \
  X(ctx_synchronize, ops->ctx_synchronize(0))                                              \
  X(stream_create, ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &stream))             \
  X(stream_destroy, ops->stream_destroy(FAKE_STREAM))                                      \
  X(stream_synchronize, ops->stream_synchronize(NULL))                                     \
  X(stream_query, ops->stream_query(FAKE_STREAM))                                          \
  X(stream_wait_event, ops->stream_wait_event(FAKE_STREAM, FAKE_EVENT))                    \
  X(event_create, ops->event_create(0, GCA_EVENT_DEFAULT, &event))                         \
  X(event_destroy, ops->event_destroy(FAKE_EVENT))                                         \
  X(event_record, ops->event_record(FAKE_EVENT, NULL))                                     \
  X(event_query, ops->event_query(FAKE_EVENT))                                             \
  X(event_synchronize, ops->event_synchronize(FAKE_EVENT))                                 \
  X(event_elapsed, ops->event_elapsed(FAKE_EVENT, FAKE_EVENT, &ms))                        \
  X(launch_host_func, ops->launch_host_func(NULL, host_fn, NULL))                          \
  X(memcpy_async, ops->memcpy_async(0x200000, 0x400000, 64, NULL))                         \
  X(memset_d8_async, ops->memset_d8_async(0x200000, 7, 64, NULL))                          \
  X(memset_d32_async, ops->memset_d32_async(0x200000, 7, 16, NULL))                        \
  X(kernel_fill_u32, ops->kernel_fill_u32(0x200000, 1, 1, 16, NULL))                       \
  X(kernel_add_u32, ops->kernel_add_u32(0x200000, 0x400000, 0x600000, 16, NULL))           \
  X(kernel_sleep, ops->kernel_sleep(1000, NULL))                                           \
  X(stream_begin_capture, ops->stream_begin_capture(FAKE_STREAM, GCA_CAPTURE_MODE_GLOBAL)) \
  X(stream_end_capture, ops->stream_end_capture(FAKE_STREAM, &graph))                      \
  X(stream_capture_info, ops->stream_capture_info(FAKE_STREAM, &cstatus, &id))             \
  X(thread_exchange_capture_mode, ops->thread_exchange_capture_mode(&mode))                \
  X(graph_node_count, ops->graph_node_count(FAKE_GRAPH, &sz))                              \
  X(graph_instantiate, ops->graph_instantiate(FAKE_GRAPH, &exec))                          \
  X(graph_upload, ops->graph_upload(FAKE_EXEC, NULL))                                      \
  X(graph_launch, ops->graph_launch(FAKE_EXEC, NULL))                                      \
  X(graph_exec_update, ops->graph_exec_update(FAKE_EXEC, FAKE_GRAPH, &info))               \
  X(graph_destroy, ops->graph_destroy(FAKE_GRAPH))                                         \
  X(graph_exec_destroy, ops->graph_exec_destroy(FAKE_EXEC))                                \
  X(mem_export_fabric, ops->mem_export_fabric(1, fabric))                                  \
  X(mem_import_fabric, ops->mem_import_fabric(0, fabric, &handle))                         \
  X(ctx_set_device, ops->ctx_set_device(1))                                                \
  X(ctx_get_device, ops->ctx_get_device(&i))                                               \
  X(stream_get_device, ops->stream_get_device(NULL, &i))                                   \
  X(kernel_philox_u32, ops->kernel_philox_u32(0x200000, 16, 0x400000, 0x600000, 4, NULL))  \
  X(ctx_enable_peer_access, ops->ctx_enable_peer_access(0, 1))                             \
  X(kernel_copy_batch, ops->kernel_copy_batch(0x200000, 1, NULL))                          \
  X(host_alloc, ops->host_alloc(4096, &hp))                                                \
  X(host_free, ops->host_free(hbuf))                                                       \
  X(host_register, ops->host_register(hbuf, sizeof(hbuf)))                                 \
  X(host_unregister, ops->host_unregister(hbuf))                                           \
  X(kernel_gemm_f32, ops->kernel_gemm_f32(0x200000, 0x400000, 0x600000, 4, 4, 4, 0, NULL)) \
  X(kernel_ew_f32, ops->kernel_ew_f32(GCA_EW_RELU, 0x200000, 0x400000, 0, 1, 0, 16, NULL)) \
  X(kernel_dot_f32, ops->kernel_dot_f32(0x200000, 0x400000, 0x600000, 16, 1, NULL))

#define COUNT_ONE(name, call) +1
enum { EVERY_OP_COUNT = 0 EVERY_OP(COUNT_ONE) };
#undef COUNT_ONE

/* Calls every op; each must fail with the init error's status and a detail
 * that starts with its own name (init's own detail starts with "init:") and
 * contains `needle`. Out-parameters must be left alone. */
static int every_op_fails(report_t *r, gca_status_t want, const char *needle) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  int i = -5, devs[2] = {0, 1};
  char name[64] = "untouched";
  size_t sz = 5, sz2 = 5;
  gca_devptr_t ptr = 5;
  gca_memhandle_t handle = 5;
  gca_stream_t stream = FAKE_STREAM;
  gca_event_t event = FAKE_EVENT;
  gca_graph_t graph = FAKE_GRAPH;
  gca_graph_exec_t exec = FAKE_EXEC;
  gca_capture_status_t cstatus = GCA_CAPTURE_STATUS_INVALIDATED;
  gca_capture_mode_t mode = GCA_CAPTURE_MODE_RELAXED;
  gca_graph_update_info_t info;
  memset(&info, 0x5a, sizeof(info));
  uint64_t id = 5;
  float ms = 5.0f;
  uint8_t fabric[GCA_FABRIC_HANDLE_LEN] = {0};
  static char hbuf[4096];
  void *hp = hbuf;
  char prefix[64];
#define CALL_ONE(op, call)                                                                       \
  do {                                                                                           \
    gca_clear_last_error();                                                                      \
    gca_status_t st = (call);                                                                    \
    snprintf(prefix, sizeof(prefix), "%s:", #op);                                                \
    if (st != want)                                                                              \
      return failf(r, "%s returned %s, wanted %s: %s", #call, gca_status_name(st),               \
                   gca_status_name(want), gca_last_error());                                     \
    if (strncmp(gca_last_error(), prefix, strlen(prefix)) != 0)                                  \
      return failf(r, "%s: detail '%s' does not start with '%s'", #call, gca_last_error(),       \
                   prefix);                                                                      \
    if (needle && !strstr(gca_last_error(), needle))                                             \
      return failf(r, "%s: detail '%s' does not mention '%s'", #call, gca_last_error(), needle); \
  } while (0);
  EVERY_OP(CALL_ONE)
#undef CALL_ONE
  if (i != -5 || sz != 5 || sz2 != 5 || ptr != 5 || handle != 5 || stream != FAKE_STREAM ||
      event != FAKE_EVENT || graph != FAKE_GRAPH || exec != FAKE_EXEC || id != 5 || ms != 5.0f ||
      hp != hbuf || cstatus != GCA_CAPTURE_STATUS_INVALIDATED || mode != GCA_CAPTURE_MODE_RELAXED ||
      strcmp(name, "untouched") != 0)
    return failf(r, "a failing op wrote to an out-parameter");
  return CHILD_PASS;
}

/* ---- children ---- */

static int child_default_library(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  gca_status_t st = ops->init();
  if (st == GCA_OK)
    return skipf(r, "a CUDA driver with a device is present; no-driver expectations do not apply");
  if (built_without_cuda_h(st))
    return skipf(r, "built without cuda.h: %s", gca_last_error());
  if (st != GCA_ERR_NO_DEVICE)
    return failf(r, "init returned %s, wanted GCA_ERR_NO_DEVICE: %s", gca_status_name(st),
                 gca_last_error());
  char first[1024];
  snprintf(first, sizeof(first), "%s", gca_last_error());
  if (strncmp(first, "init: ", 6) != 0 || !strstr(first, "libcuda.so.1"))
    return failf(r, "init detail '%s' does not start with 'init: ' and name libcuda.so.1", first);
  gca_clear_last_error();
  st = ops->init();
  if (st != GCA_ERR_NO_DEVICE || strcmp(gca_last_error(), first) != 0)
    return failf(r, "second init gave %s '%s', not the first result '%s'", gca_status_name(st),
                 gca_last_error(), first);
  return CHILD_PASS;
}

static int child_missing_library(report_t *r) {
  gca_status_t st = gca__cuda_ops()->init();
  if (built_without_cuda_h(st))
    return skipf(r, "built without cuda.h: %s", gca_last_error());
  if (st != GCA_ERR_NO_DEVICE)
    return failf(r, "init returned %s, wanted GCA_ERR_NO_DEVICE: %s", gca_status_name(st),
                 gca_last_error());
  if (!strstr(gca_last_error(), MISSING_LIBRARY))
    return failf(r, "init detail '%s' does not name %s", gca_last_error(), MISSING_LIBRARY);
  if (!strstr(gca_last_error(), "cannot load"))
    return failf(r, "init detail '%s' does not say the library could not be loaded",
                 gca_last_error());
  return CHILD_PASS;
}

static const char *stub_library(void) {
  static char path[512];
  const char *home = getenv("CUDA_HOME");
  const char *dirs[] = {home, "/usr/local/cuda"};
  const char *subs[] = {"lib64/stubs/libcuda.so", "targets/x86_64-linux/lib/stubs/libcuda.so",
                        "lib/stubs/libcuda.so"};
  for (size_t d = 0; d < GCA_ARRAY_SIZE(dirs); d++) {
    for (size_t s = 0; dirs[d] && s < GCA_ARRAY_SIZE(subs); s++) {
      snprintf(path, sizeof(path), "%s/%s", dirs[d], subs[s]);
      if (access(path, R_OK) == 0)
        return path;
    }
  }
  return NULL;
}

static int child_stub_library(report_t *r) {
  gca_status_t st = gca__cuda_ops()->init();
  if (built_without_cuda_h(st))
    return skipf(r, "built without cuda.h: %s", gca_last_error());
  if (st != GCA_ERR_NO_DEVICE)
    return failf(r, "init with the stub library returned %s, wanted GCA_ERR_NO_DEVICE: %s",
                 gca_status_name(st), gca_last_error());
  if (!strstr(gca_last_error(), "CUDA_ERROR_STUB_LIBRARY"))
    return failf(r, "init detail '%s' does not name CUDA_ERROR_STUB_LIBRARY", gca_last_error());
  if (!strstr(gca_last_error(), getenv("GCA_CUDA_LIBRARY")))
    return failf(r, "init detail '%s' does not name the library path", gca_last_error());
  return every_op_fails(r, GCA_ERR_NO_DEVICE, "CUDA_ERROR_STUB_LIBRARY");
}

static int child_ops_after_failed_init(report_t *r) {
  gca_status_t st = gca__cuda_ops()->init();
  if (built_without_cuda_h(st))
    return every_op_fails(r, GCA_ERR_NOT_SUPPORTED, "built without cuda.h");
  if (st != GCA_ERR_NO_DEVICE)
    return failf(r, "init returned %s, wanted GCA_ERR_NO_DEVICE: %s", gca_status_name(st),
                 gca_last_error());
  return every_op_fails(r, GCA_ERR_NO_DEVICE, MISSING_LIBRARY);
}

static int child_ops_without_init(report_t *r) {
  gca_status_t st = gca__cuda_ops()->device_count(&(int){0});
  gca_status_t want = built_without_cuda_h(st) ? GCA_ERR_NOT_SUPPORTED : GCA_ERR_NO_DEVICE;
  return every_op_fails(r, want, want == GCA_ERR_NO_DEVICE ? MISSING_LIBRARY : NULL);
}

/* ---- tests ---- */

static void table_has_every_op_and_is_named_cuda(void **state) {
  (void)state;
  const gca_device_ops_t *ops = gca__cuda_ops();
  assert_non_null(ops);
  assert_string_equal(ops->name, "cuda");
#define CHECK_SLOT(name) assert_non_null((void *)(uintptr_t)ops->name);
  GCA_DEVICE_OP_MAP(CHECK_SLOT)
#undef CHECK_SLOT
  assert_int_equal(EVERY_OP_COUNT, GCA_OP_COUNT);
}

static void init_without_driver_is_no_device_naming_libcuda(void **state) {
  (void)state;
  run_in_child(NULL, child_default_library);
}

static void init_with_missing_library_names_its_path(void **state) {
  (void)state;
  run_in_child(MISSING_LIBRARY, child_missing_library);
}

static void init_with_stub_library_names_cuda_error_stub_library(void **state) {
  (void)state;
  const char *stub = stub_library();
  if (!stub) {
    printf("SKIP: no stub libcuda.so found under CUDA_HOME or /usr/local/cuda\n");
    skip();
  }
  run_in_child(stub, child_stub_library);
}

static void every_op_fails_after_failed_init(void **state) {
  (void)state;
  run_in_child(MISSING_LIBRARY, child_ops_after_failed_init);
}

static void every_op_fails_when_called_before_init(void **state) {
  (void)state;
  run_in_child(MISSING_LIBRARY, child_ops_without_init);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(table_has_every_op_and_is_named_cuda),
      cmocka_unit_test(init_without_driver_is_no_device_naming_libcuda),
      cmocka_unit_test(init_with_missing_library_names_its_path),
      cmocka_unit_test(init_with_stub_library_names_cuda_error_stub_library),
      cmocka_unit_test(every_op_fails_after_failed_init),
      cmocka_unit_test(every_op_fails_when_called_before_init),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
