/* SPDX-License-Identifier: Apache-2.0 */
/* test_cuda_fake.c - the cuda backend's own logic against a pretend driver
 * (fake_libcuda.c, path in GCA_TEST_FAKE_CUDA): symbol resolution at explicit
 * ABI versions and the version guard, init's failure messages, optional entry
 * points, CUresult -> status mapping with the driver's names, per-thread
 * contexts and current devices, kernel argument marshalling, graph-update
 * reporting, fabric handles (requested at mem_create, exported and
 * imported as 64 bytes) and peer access (cuCtxEnablePeerAccess).
 *
 * The backend initializes once per process, so each case runs in a forked
 * child with its own FAKE_CUDA_* settings; the child reports through a
 * temporary file and its exit code (0 passed, 1 failed).
 */
#include <dlfcn.h>
#include <pthread.h>
#include "child.h"

static const char *fake_path(void) {
  return getenv("GCA_TEST_FAKE_CUDA");
}

/* Runs fn in a child whose environment has GCA_CUDA_LIBRARY at the fake and
 * the NULL-terminated name=value pairs in `env`. */
static void run_in_child(const char *const *env, child_fn fn) {
  if (!fake_path()) {
    printf("SKIP: GCA_TEST_FAKE_CUDA is not set\n");
    skip();
  }
  const char *all[32] = {"GCA_CUDA_LIBRARY", fake_path()};
  size_t n = 2;
  for (size_t i = 0; env && env[i]; i += 2) {
    assert_true(n + 3 < GCA_ARRAY_SIZE(all));
    all[n++] = env[i];
    all[n++] = env[i + 1];
  }
  all[n] = NULL;
  run_child(all, fn, NULL, 0);
}

/* The fake's inspection function `name` (the backend has it loaded already). */
static void *fake_fn(const char *name) {
  void *h = dlopen(fake_path(), RTLD_NOW | RTLD_NOLOAD);
  return h ? dlsym(h, name) : NULL;
}

static int fake_int(const char *name) {
  int (*fn)(void) = (int (*)(void))(uintptr_t)fake_fn(name);
  return fn ? fn() : -1;
}

typedef const char *(*last_kernel_fn)(unsigned *grid, unsigned *block, uint64_t args[4]);
typedef const char *(*last_launch_fn)(unsigned grid[3], unsigned block[3], uint64_t args[8]);

static uint64_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

/* ---- children ---- */

static int child_init_resolves_every_entry(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  EXPECT_OK(r, ops->init());
  int n = 0;
  EXPECT_OK(r, ops->device_count(&n));
  CHECK(r, n == 2);
  CHECK(r, fake_int("fake_cuda_over_version_asks") == 0);
  CHECK(r, fake_int("fake_cuda_max_version_asked") == 12080);
  char name[32];
  EXPECT_OK(r, ops->device_name(1, name, sizeof(name)));
  CHECK(r, strcmp(name, "Fake GPU") == 0);
  int v = 0;
  EXPECT_OK(r, ops->device_attr(0, GCA_ATTR_CC_MAJOR, &v));
  CHECK(r, v == 9);
  EXPECT(r, ops->device_attr(2, GCA_ATTR_CC_MAJOR, &v), GCA_ERR_INVALID_ARGUMENT,
         "device_attr: device 2 is not in [0, 2)");
  return CHILD_PASS;
}

static int child_old_driver(report_t *r) {
  EXPECT(r, gca__cuda_ops()->init(), GCA_ERR_NO_DEVICE, "supports CUDA 11.8; gca needs 12.0");
  EXPECT(r, gca__cuda_ops()->mem_alloc(0, 1, &(gca_devptr_t){0}), GCA_ERR_NO_DEVICE,
         "mem_alloc: cuda backend unavailable: init: ");
  return CHILD_PASS;
}

static int child_cuinit_fails(report_t *r) {
  EXPECT(r, gca__cuda_ops()->init(), GCA_ERR_NO_DEVICE, "cuInit");
  EXPECT(r, gca__cuda_ops()->init(), GCA_ERR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE (fake description)");
  EXPECT(r, gca__cuda_ops()->init(), GCA_ERR_NO_DEVICE, fake_path());
  return CHILD_PASS;
}

static int child_missing_required(report_t *r) {
  EXPECT(r, gca__cuda_ops()->init(), GCA_ERR_NO_DEVICE, "lacks cuMemCreate at ABI version 10020");
  return CHILD_PASS;
}

static int child_missing_optional(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  EXPECT_OK(r, ops->init());
  EXPECT(r, ops->graph_upload((gca_graph_exec_t)(uintptr_t)0x7100, NULL), GCA_ERR_NOT_SUPPORTED,
         "graph_upload: the driver lacks cuGraphUpload");
  EXPECT_OK(r, ops->graph_launch((gca_graph_exec_t)(uintptr_t)0x7100, NULL));
  return CHILD_PASS;
}

static int check_newest_forms(report_t *r, int want_form, uint64_t want_id, float want_ms) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  EXPECT_OK(r, ops->init());
  CHECK(r, fake_int("fake_cuda_over_version_asks") == 0);
  gca_stream_t s = NULL;
  EXPECT_OK(r, ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_ACTIVE;
  uint64_t id = 0;
  EXPECT_OK(r, ops->stream_capture_info(s, &cs, &id));
  CHECK(r, cs == GCA_CAPTURE_STATUS_NONE);
  EXPECT_OK(r, ops->stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  EXPECT_OK(r, ops->stream_capture_info(s, &cs, &id));
  CHECK(r, cs == GCA_CAPTURE_STATUS_ACTIVE);
  CHECK(r, id == want_id);
  CHECK(r, fake_int("fake_cuda_capture_info_form") == want_form);
  EXPECT_OK(r, ops->stream_capture_info(s, &cs, NULL));
  gca_graph_t g = NULL;
  EXPECT_OK(r, ops->stream_end_capture(s, &g));
  float ms = 0;
  gca_event_t a, b;
  EXPECT_OK(r, ops->event_create(0, GCA_EVENT_DEFAULT, &a));
  EXPECT_OK(r, ops->event_create(0, GCA_EVENT_DEFAULT, &b));
  EXPECT_OK(r, ops->event_elapsed(a, b, &ms));
  CHECK(r, ms == want_ms);
  EXPECT_OK(r, ops->stream_destroy(s));
  return CHILD_PASS;
}

static int child_driver_12_2(report_t *r) {
  return check_newest_forms(r, 2, 77, 1.0f);
}

static int child_driver_12_8(report_t *r) {
  return check_newest_forms(r, 3, 78, 2.0f);
}

static int child_errors_map(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  gca_devptr_t p = 0;
  EXPECT(r, ops->mem_alloc(0, 2ull << 30, &p), GCA_ERR_OUT_OF_MEMORY,
         "mem_alloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  CHECK(r, p == 0);
  EXPECT(r, ops->mem_create(1, 2ull << 30, &(gca_memhandle_t){0}), GCA_ERR_OUT_OF_MEMORY,
         "mem_create: CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT(r, ops->mem_free(0, 0), GCA_ERR_INVALID_ARGUMENT, "mem_free: CUDA_ERROR_INVALID_VALUE");
  gca_stream_t s = NULL;
  EXPECT_OK(r, ops->stream_create(1, GCA_STREAM_DEFAULT, 0, &s));
  EXPECT(r, ops->stream_query(s), GCA_ERR_NOT_READY, "stream_query: CUDA_ERROR_NOT_READY");
  EXPECT(r, ops->stream_destroy(NULL), GCA_ERR_INVALID_HANDLE, "stream_destroy: ");
  EXPECT(r, ops->mem_alloc(-1, 1, &p), GCA_ERR_INVALID_ARGUMENT, "mem_alloc: device -1");
  EXPECT_OK(r, ops->stream_destroy(s));
  return CHILD_PASS;
}

typedef struct thread_arg {
  gca_stream_t stream;
  gca_status_t st;
  char detail[512];
} thread_arg_t;

static void *memset_on_other_thread(void *p) {
  thread_arg_t *a = p;
  a->st = gca__cuda_ops()->memset_d32_async(0x1000, 5, 16, a->stream);
  snprintf(a->detail, sizeof(a->detail), "%s", gca_last_error());
  return NULL;
}

static int child_contexts(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  gca_devptr_t p0 = 0, p1 = 0;
  EXPECT_OK(r, ops->mem_alloc(1, 256, &p1));
  EXPECT_OK(r, ops->mem_alloc(0, 256, &p0));
  CHECK(r, p0 != p1);
  int calls = fake_int("fake_cuda_set_current_calls");
  EXPECT_OK(r, ops->mem_alloc(0, 256, &p0));
  EXPECT_OK(r, ops->mem_get_info(0, &(size_t){0}, &(size_t){0}));
  CHECK(r, fake_int("fake_cuda_set_current_calls") == calls);
  gca_stream_t s1 = NULL;
  EXPECT_OK(r, ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &s1));
  EXPECT_OK(r, ops->mem_alloc(0, 256, &p0));
  EXPECT_OK(r, ops->memcpy_async(p0, p1, 256, s1));
  thread_arg_t a = {.stream = s1, .st = GCA_ERR_INTERNAL};
  pthread_t t;
  CHECK(r, pthread_create(&t, NULL, memset_on_other_thread, &a) == 0);
  pthread_join(t, NULL);
  if (a.st != GCA_OK)
    return failf(r, "memset on a fresh thread: %s: %s", gca_status_name(a.st), a.detail);
  EXPECT_OK(r, ops->memset_d8_async(p0, 1, 256, NULL));
  int sdev = -1; /* a stream's device comes from its context */
  EXPECT_OK(r, ops->stream_get_device(s1, &sdev));
  CHECK(r, sdev == 1);
  EXPECT_OK(r, ops->stream_get_device(NULL, &sdev));
  CHECK(r, sdev == 0);
  EXPECT_OK(r, ops->stream_destroy(s1));
  return CHILD_PASS;
}

/* ctx_set_device makes the primary context current and NULL-stream work then
 * runs there, even after ops naming another device switched contexts; a
 * thread that never set a device uses device 0's. */
static int child_current_device(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  int dev = -1;
  gca_devptr_t p0 = 0;
  EXPECT_OK(r, ops->init());
  EXPECT_OK(r, ops->ctx_get_device(&dev));
  CHECK(r, dev == 0);
  EXPECT_OK(r, ops->ctx_set_device(1));
  CHECK(r, fake_int("fake_cuda_current_device") == 1);
  EXPECT_OK(r, ops->ctx_get_device(&dev));
  CHECK(r, dev == 1);
  EXPECT_OK(r, ops->mem_alloc(0, 256, &p0));
  CHECK(r, fake_int("fake_cuda_current_device") == 0);
  EXPECT_OK(r, ops->stream_synchronize(NULL));
  CHECK(r, fake_int("fake_cuda_null_stream_device") == 1);
  EXPECT_OK(r, ops->memset_d8_async(p0, 1, 256, NULL));
  CHECK(r, fake_int("fake_cuda_null_stream_device") == 1);
  /* the special handles go to the driver as they are, in the current device's
   * context (Note [Special streams]), and cannot be destroyed */
  EXPECT_OK(r, ops->mem_alloc(0, 256, &p0));
  CHECK(r, fake_int("fake_cuda_current_device") == 0);
  EXPECT_OK(r, ops->memset_d8_async(p0, 1, 256, GCA_STREAM_PER_THREAD));
  CHECK(r, fake_int("fake_cuda_special_stream_device") == 1);
  CHECK(r, fake_int("fake_cuda_special_stream_handle") == 2);
  EXPECT_OK(r, ops->mem_alloc(0, 256, &p0));
  EXPECT_OK(r, ops->stream_synchronize(GCA_STREAM_LEGACY));
  CHECK(r, fake_int("fake_cuda_special_stream_device") == 1);
  CHECK(r, fake_int("fake_cuda_special_stream_handle") == 1);
  int sdev = -1;
  EXPECT_OK(r, ops->mem_alloc(0, 256, &p0));
  EXPECT_OK(r, ops->stream_get_device(GCA_STREAM_PER_THREAD, &sdev));
  CHECK(r, sdev == 1);
  EXPECT(r, ops->stream_destroy(GCA_STREAM_PER_THREAD), GCA_ERR_INVALID_HANDLE,
         "stream_destroy: the per-thread default stream");
  CHECK(r, fake_int("fake_cuda_special_stream_device") == 1);
  EXPECT_OK(r, ops->ctx_get_device(&dev));
  CHECK(r, dev == 1);
  thread_arg_t a = {.stream = NULL, .st = GCA_ERR_INTERNAL};
  pthread_t t;
  CHECK(r, pthread_create(&t, NULL, memset_on_other_thread, &a) == 0);
  pthread_join(t, NULL);
  if (a.st != GCA_OK)
    return failf(r, "NULL-stream memset on a fresh thread: %s: %s", gca_status_name(a.st),
                 a.detail);
  CHECK(r, fake_int("fake_cuda_null_stream_device") == 0);
  EXPECT(r, ops->ctx_set_device(2), GCA_ERR_INVALID_ARGUMENT, "ctx_set_device: device 2");
  EXPECT(r, ops->ctx_get_device(NULL), GCA_ERR_INVALID_ARGUMENT, "ctx_get_device");
  EXPECT_OK(r, ops->ctx_get_device(&dev));
  CHECK(r, dev == 1);
  EXPECT_OK(r, ops->ctx_set_device(0));
  EXPECT_OK(r, ops->stream_synchronize(NULL));
  CHECK(r, fake_int("fake_cuda_null_stream_device") == 0);
  EXPECT_OK(r, ops->mem_free(0, p0));
  return CHILD_PASS;
}

static int host_fn_runs;
static void host_fn(void *p) {
  host_fn_runs += *(int *)p;
}

static int child_kernels(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  last_kernel_fn last = NULL;
  gca_stream_t s1 = NULL, s0 = NULL;
  EXPECT_OK(r, ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &s1));
  EXPECT_OK(r, ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s0));
  last = (last_kernel_fn)(uintptr_t)fake_fn("fake_cuda_last_kernel");
  CHECK(r, last != NULL);
  unsigned grid = 0, block = 0;
  uint64_t args[4];

  EXPECT_OK(r, ops->kernel_fill_u32(0xabc000, 7, 3, 1000, s1));
  CHECK(r, strcmp(last(&grid, &block, args), "gca_fill_u32") == 0);
  CHECK(r, args[0] == 0xabc000 && args[1] == 7 && args[2] == 3 && args[3] == 1000);
  CHECK(r, (uint64_t)grid * block >= 1000 && block == 256);
  CHECK(r, fake_int("fake_cuda_module_loads") == 1);

  EXPECT_OK(r, ops->kernel_add_u32(0x1000, 0x2000, 0x3000, 1ull << 40, s1));
  CHECK(r, strcmp(last(&grid, &block, args), "gca_add_u32") == 0);
  CHECK(r, args[0] == 0x1000 && args[1] == 0x2000 && args[2] == 0x3000 && args[3] == 1ull << 40);
  CHECK(r, grid == 4096);
  CHECK(r, fake_int("fake_cuda_module_loads") == 1);

  EXPECT_OK(r, ops->kernel_sleep(123456789, s0));
  CHECK(r, strcmp(last(&grid, &block, args), "gca_sleep_ns") == 0);
  CHECK(r, args[0] == 123456789 && grid == 1 && block == 1);
  CHECK(r, fake_int("fake_cuda_module_loads") == 2);

  EXPECT_OK(r, ops->kernel_fill_u32(0x1000, 1, 1, 0, s0));
  CHECK(r, strcmp(last(&grid, &block, args), "gca_sleep_ns") == 0);

  /* a copy batch: the table and its length; an entry per y block, at most 65535 */
  EXPECT_OK(r, ops->kernel_copy_batch(0x5000, 3, s0));
  CHECK(r, strcmp(last(&grid, &block, args), "gca_copy_batch") == 0);
  CHECK(r, args[0] == 0x5000 && args[1] == 3 && args[2] == 3 && grid == 32 * 3 && block == 256);
  EXPECT_OK(r, ops->kernel_copy_batch(0x5000, 100000, s0));
  last(&grid, &block, args);
  CHECK(r, args[1] == 100000 && args[2] == 65535);
  EXPECT(r, ops->kernel_copy_batch(0x5004, 2, s0), GCA_ERR_INVALID_ARGUMENT,
         "kernel_copy_batch: table 0x5004 must be an 8-byte aligned device pointer");
  EXPECT_OK(r, ops->kernel_copy_batch(0, 0, s0)); /* nothing to launch */
  last(&grid, &block, args);
  CHECK(r, args[1] == 100000);

  /* the compute kernels: every parameter in order and the launch's shape */
  last_launch_fn launch = (last_launch_fn)(uintptr_t)fake_fn("fake_cuda_last_launch");
  CHECK(r, launch != NULL);
  unsigned g3[3], b3[3];
  uint64_t a8[8];
  EXPECT_OK(r, ops->kernel_gemm_f32(0x10000, 0x20000, 0x30000, 33, 17, 65,
                                    GCA_GEMM_TRANS_A | GCA_GEMM_ACCUMULATE, s0));
  CHECK(r, strcmp(launch(g3, b3, a8), "gca_gemm_f32") == 0);
  CHECK(r, a8[0] == 0x10000 && a8[1] == 0x20000 && a8[2] == 0x30000 && a8[3] == 33 && a8[4] == 17 &&
               a8[5] == 65 && a8[6] == 5);
  CHECK(r, g3[0] == 2 && g3[1] == 3 && g3[2] == 1 && b3[0] == 16 && b3[1] == 16 && b3[2] == 1);
  /* a C of 10^10 elements: the grid is capped each way, the kernel strides */
  EXPECT_OK(r, ops->kernel_gemm_f32(0x1000000, 0x20000, 0x30000, 100000, 100000, 1, 0, s0));
  launch(g3, b3, a8);
  CHECK(r, a8[3] == 100000 && g3[0] == 4096 && g3[1] == 4096);
  /* nothing to do: no launch (m = 0; k = 0 when accumulating) */
  EXPECT_OK(r, ops->kernel_gemm_f32(0x10000, 0x20000, 0x30000, 0, 17, 65, 0, s0));
  EXPECT_OK(r, ops->kernel_gemm_f32(0x10000, 0, 0, 3, 4, 0, GCA_GEMM_ACCUMULATE, s0));
  launch(g3, b3, a8);
  CHECK(r, a8[3] == 100000);
  /* k = 0 without accumulating writes zeros: launched, A and B unused */
  EXPECT_OK(r, ops->kernel_gemm_f32(0x10000, 0, 0, 3, 4, 0, 0, s0));
  CHECK(r, strcmp(launch(g3, b3, a8), "gca_gemm_f32") == 0);
  CHECK(r, a8[0] == 0x10000 && a8[3] == 3 && a8[4] == 4 && a8[5] == 0);
  EXPECT(r, ops->kernel_gemm_f32(0x10000, 0x20000, 0x30000, 2, 2, 2, 8, s0),
         GCA_ERR_INVALID_ARGUMENT, "kernel_gemm_f32: flags 0x8 has bits outside");
  EXPECT(r, ops->kernel_gemm_f32(0x20008, 0x20000, 0x30000, 2, 2, 2, 0, s0),
         GCA_ERR_INVALID_ARGUMENT, "kernel_gemm_f32: C [0x20008, +16) overlaps A [0x20000, +16)");

  EXPECT_OK(
      r, ops->kernel_ew_f32(GCA_EW_DROPOUT, 0x40000, 0x50000, 0x60000, 2.5f, 0x40000000, 1000, s0));
  CHECK(r, strcmp(launch(g3, b3, a8), "gca_ew_f32") == 0);
  CHECK(r, a8[0] == 0x40000 && a8[1] == 0x50000 && a8[2] == 0x60000 && a8[3] == 1000 &&
               a8[4] == GCA_EW_DROPOUT && a8[5] == float_bits(2.5f) && a8[6] == 0x40000000);
  CHECK(r, (uint64_t)g3[0] * b3[0] >= 1000 && b3[0] == 256 && g3[1] == 1);
  /* a unary op does not read b: it is passed as 0 */
  EXPECT_OK(r, ops->kernel_ew_f32(GCA_EW_SCALE, 0x40000, 0x40000, 0x60000, -1.0f, 0, 10, s0));
  launch(g3, b3, a8);
  CHECK(r, a8[1] == 0x40000 && a8[2] == 0 && a8[4] == GCA_EW_SCALE && a8[5] == float_bits(-1.0f));
  EXPECT_OK(r, ops->kernel_ew_f32(GCA_EW_ADD, 0x40000, 0x50000, 0x60000, 0, 0, 0, s0));
  launch(g3, b3, a8);
  CHECK(r, a8[4] == GCA_EW_SCALE); /* count 0: nothing launched */
  EXPECT(r, ops->kernel_ew_f32((gca_ew_op_t)8, 0x40000, 0x50000, 0x60000, 1, 0, 10, s0),
         GCA_ERR_INVALID_ARGUMENT, "kernel_ew_f32: op 8 is not a gca_ew_op_t");

  EXPECT_OK(r, ops->kernel_dot_f32(0x70000, 0x50000, 0x60000, 100000, 0.5f, s0));
  CHECK(r, strcmp(launch(g3, b3, a8), "gca_dot_f32") == 0);
  CHECK(r, a8[0] == 0x70000 && a8[1] == 0x50000 && a8[2] == 0x60000 && a8[3] == 100000 &&
               a8[4] == float_bits(0.5f));
  CHECK(r, g3[0] == 1 && g3[1] == 1 && b3[0] == 256 && b3[1] == 1);
  EXPECT_OK(r, ops->kernel_dot_f32(0x70000, 0, 0, 0, 3.0f, s0)); /* writes s * 0 */
  launch(g3, b3, a8);
  CHECK(r, a8[0] == 0x70000 && a8[3] == 0 && a8[4] == float_bits(3.0f));
  EXPECT(r, ops->kernel_dot_f32(0x70002, 0x50000, 0x60000, 4, 1, s0), GCA_ERR_INVALID_ARGUMENT,
         "kernel_dot_f32: dst 0x70002 must be a 4-byte aligned device pointer");

  int two = 2;
  EXPECT_OK(r, ops->launch_host_func(s0, host_fn, &two));
  CHECK(r, host_fn_runs == 2);
  gca_capture_mode_t mode = GCA_CAPTURE_MODE_RELAXED;
  EXPECT_OK(r, ops->thread_exchange_capture_mode(&mode));
  CHECK(r, mode == GCA_CAPTURE_MODE_GLOBAL);
  EXPECT_OK(r, ops->stream_destroy(s0));
  EXPECT_OK(r, ops->stream_destroy(s1));
  return CHILD_PASS;
}

static int child_graphs(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  gca_stream_t s = NULL;
  gca_graph_t g = NULL;
  gca_graph_exec_t e = NULL;
  size_t n = 0;
  EXPECT_OK(r, ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  EXPECT_OK(r, ops->stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  EXPECT_OK(r, ops->stream_end_capture(s, &g));
  EXPECT_OK(r, ops->graph_node_count(g, &n));
  CHECK(r, n == 5);
  EXPECT_OK(r, ops->graph_instantiate(g, &e));
  EXPECT_OK(r, ops->graph_upload(e, s));
  EXPECT_OK(r, ops->graph_launch(e, s));
  gca_graph_update_info_t info;
  memset(&info, 0x5a, sizeof(info));
  EXPECT_OK(r, ops->graph_exec_update(e, g, &info));
  CHECK(r, info.result == GCA_GRAPH_UPDATE_SUCCESS && info.error_node_index == SIZE_MAX);
  gca_graph_t other = (gca_graph_t)(uintptr_t)0x7777;
  EXPECT(r, ops->graph_exec_update(e, other, &info), GCA_ERR_GRAPH_UPDATE,
         "graph_exec_update: rejected at node 2: topology changed");
  CHECK(r, info.result == GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED);
  CHECK(r, info.error_node_index == 2);
  CHECK(r, strstr(info.reason, "node 2") != NULL);
  EXPECT(r, ops->graph_exec_update(e, other, NULL), GCA_ERR_GRAPH_UPDATE, "node 2");
  /* each driver result keeps its own code; a NULL error node is no index */
  EXPECT(r, ops->graph_exec_update(e, (gca_graph_t)(uintptr_t)0x7778, &info), GCA_ERR_GRAPH_UPDATE,
         "node 1: kernel function changed in an unsupported way");
  CHECK(r, info.result == GCA_GRAPH_UPDATE_UNSUPPORTED_FUNCTION_CHANGE);
  CHECK(r, info.error_node_index == 1);
  EXPECT(r, ops->graph_exec_update(e, (gca_graph_t)(uintptr_t)0x7779, &info), GCA_ERR_GRAPH_UPDATE,
         "graph_exec_update: rejected: topology changed");
  CHECK(r, info.result == GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED);
  CHECK(r, info.error_node_index == SIZE_MAX);
  EXPECT_OK(r, ops->graph_exec_destroy(e));
  EXPECT_OK(r, ops->graph_destroy(g));
  EXPECT_OK(r, ops->stream_destroy(s));
  return CHILD_PASS;
}

/* gca__device_captures (Note [Releases during a capture]) counts capture
 * sequences the driver has open: a begin adds one, an end that leaves the
 * stream not capturing takes it back — also when the end fails because the
 * capture was invalidated — and calls the driver refuses change nothing. */
static int child_capture_count(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  EXPECT_OK(r, ops->init());
  gca_stream_t s = NULL, t = NULL;
  gca_graph_t g = NULL;
  EXPECT_OK(r, ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  EXPECT_OK(r, ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &t));
  int c0 = atomic_load(&gca__device_captures);
  EXPECT_OK(r, ops->stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  CHECK(r, atomic_load(&gca__device_captures) == c0 + 1);
  EXPECT_OK(r, ops->stream_begin_capture(t, GCA_CAPTURE_MODE_RELAXED));
  CHECK(r, atomic_load(&gca__device_captures) == c0 + 2);
  EXPECT(r, ops->stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL), GCA_ERR_DRIVER,
         "stream_begin_capture");
  CHECK(r, atomic_load(&gca__device_captures) == c0 + 2);
  EXPECT_OK(r, ops->stream_end_capture(s, &g));
  CHECK(r, g != NULL);
  CHECK(r, atomic_load(&gca__device_captures) == c0 + 1);
  EXPECT(r, ops->stream_end_capture(s, &g), GCA_ERR_CAPTURE_UNMATCHED, "stream_end_capture");
  CHECK(r, atomic_load(&gca__device_captures) == c0 + 1);
  void (*invalidate)(void) =
      (void (*)(void))(uintptr_t)fake_fn("fake_cuda_invalidate_next_capture");
  CHECK(r, invalidate != NULL);
  invalidate();
  EXPECT(r, ops->stream_end_capture(t, &g), GCA_ERR_CAPTURE_INVALIDATED, "stream_end_capture");
  CHECK(r, atomic_load(&gca__device_captures) == c0);
  EXPECT(r, ops->stream_begin_capture(NULL, GCA_CAPTURE_MODE_GLOBAL), GCA_ERR_CAPTURE_UNSUPPORTED,
         "stream_begin_capture");
  CHECK(r, atomic_load(&gca__device_captures) == c0);
  EXPECT_OK(r, ops->stream_destroy(s));
  EXPECT_OK(r, ops->stream_destroy(t));
  return CHILD_PASS;
}

static int child_vmm(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  size_t g = 0;
  EXPECT_OK(r, ops->mem_granularity(0, false, &g));
  CHECK(r, g == 2u << 20);
  EXPECT_OK(r, ops->mem_granularity(1, true, &g));
  CHECK(r, g == 4u << 20);
  gca_memhandle_t h0 = 0, h1 = 0;
  /* The fake reports POSIX-fd support on device 1 only; the handle records what was asked. */
  EXPECT_OK(r, ops->mem_create(0, 2u << 20, &h0));
  EXPECT_OK(r, ops->mem_create(1, 2u << 20, &h1));
  CHECK(r, h0 == 0x000);
  CHECK(r, h1 == 0x101);
  int fd = -1;
  EXPECT_OK(r, ops->mem_export_fd(h1, &fd));
  CHECK(r, fd == 42);
  EXPECT(r, ops->mem_export_fd(h0, &fd), GCA_ERR_INVALID_ARGUMENT, "mem_export_fd: ");
  gca_memhandle_t imp = 0;
  EXPECT_OK(r, ops->mem_import_fd(1, 42, &imp));
  CHECK(r, imp == 42);
  gca_devptr_t va = 0;
  EXPECT_OK(r, ops->mem_address_reserve(0, 4u << 20, 0, &va));
  EXPECT_OK(r, ops->mem_map(va, 2u << 20, 0, h1));
  int devs[] = {0, 1};
  EXPECT_OK(r, ops->mem_set_access(va, 2u << 20, devs, 2));
  int bad[] = {0, 5};
  EXPECT(r, ops->mem_set_access(va, 2u << 20, bad, 2), GCA_ERR_INVALID_ARGUMENT,
         "mem_set_access: device 5");
  EXPECT(r, ops->mem_set_access(va, 2u << 20, devs, 0), GCA_ERR_INVALID_ARGUMENT,
         "mem_set_access: no devices");
  EXPECT_OK(r, ops->mem_unmap(va, 2u << 20));
  EXPECT_OK(r, ops->mem_release(h1));
  EXPECT_OK(r, ops->mem_address_free(0, va, 4u << 20));
  int can = -1;
  EXPECT_OK(r, ops->device_can_access_peer(0, 1, &can));
  CHECK(r, can == 1);
  EXPECT_OK(r, ops->ctx_synchronize(1));
  return CHILD_PASS;
}

static uint64_t fake_u64(const char *name) {
  uint64_t (*fn)(void) = (uint64_t(*)(void))(uintptr_t)fake_fn(name);
  return fn ? fn() : UINT64_MAX;
}

static int child_fabric(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  int v = 0;
  EXPECT_OK(r, ops->device_attr(0, GCA_ATTR_FABRIC_SUPPORTED, &v));
  CHECK(r, v == 1);
  gca_memhandle_t h0 = 0, h1 = 0;
  /* Device 1 has POSIX fds too: both types are requested (0x1 | 0x8). */
  EXPECT_OK(r, ops->mem_create(0, 2u << 20, &h0));
  EXPECT_OK(r, ops->mem_create(1, 2u << 20, &h1));
  CHECK(r, h0 == 0x008);
  CHECK(r, h1 == 0x109);
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN];
  memset(bytes, 0xee, sizeof(bytes));
  EXPECT_OK(r, ops->mem_export_fabric(h1, bytes));
  CHECK(r, fake_int("fake_cuda_fabric_exports") == 1);
  CHECK(r, memcmp(bytes, "FAKEFAB", 8) == 0);
  uint64_t named = 0;
  memcpy(&named, bytes + 8, sizeof(named));
  CHECK(r, named == h1);
  CHECK(r, bytes[GCA_FABRIC_HANDLE_LEN - 1] == GCA_FABRIC_HANDLE_LEN - 1);
  gca_memhandle_t imp = 0;
  EXPECT_OK(r, ops->mem_import_fabric(0, bytes, &imp));
  CHECK(r, fake_int("fake_cuda_fabric_imports") == 1);
  CHECK(r, imp == (h1 | 0x10000));
  CHECK(r, fake_u64("fake_cuda_last_fabric_import") == imp);
  int fd = -1;
  EXPECT_OK(r, ops->mem_export_fd(h1, &fd));
  CHECK(r, fd == 42);

  uint8_t junk[GCA_FABRIC_HANDLE_LEN] = {0};
  gca_memhandle_t untouched = 5;
  EXPECT(r, ops->mem_import_fabric(0, junk, &untouched), GCA_ERR_INVALID_ARGUMENT,
         "mem_import_fabric: ");
  CHECK(r, untouched == 5);
  EXPECT(r, ops->mem_import_fabric(2, bytes, &untouched), GCA_ERR_INVALID_ARGUMENT,
         "mem_import_fabric: device 2 is not in [0, 2)");
  EXPECT(r, ops->mem_import_fabric(0, bytes, NULL), GCA_ERR_INVALID_ARGUMENT,
         "mem_import_fabric: out is NULL");
  EXPECT(r, ops->mem_export_fabric(h1, NULL), GCA_ERR_INVALID_ARGUMENT,
         "mem_export_fabric: out is NULL");
  CHECK(r, fake_int("fake_cuda_fabric_imports") == 1);
  EXPECT_OK(r, ops->mem_release(imp));
  EXPECT_OK(r, ops->mem_release(h0));
  EXPECT_OK(r, ops->mem_release(h1));
  return CHILD_PASS;
}

/* As on an H200 with driver 580 and no IMEX channel: the attribute says 1, but
 * cuMemCreate refuses FABRIC with CUDA_ERROR_NOT_PERMITTED. */
static int child_fabric_denied(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  gca_memhandle_t h = 0, h1 = 0;
  int v = -1;
  /* Device 1 is asked for the attribute first: a probe settles it. */
  EXPECT_OK(r, ops->device_attr(1, GCA_ATTR_FABRIC_SUPPORTED, &v));
  CHECK(r, v == 0);
  CHECK(r, fake_int("fake_cuda_fabric_refusals") == 1);
  EXPECT_OK(r, ops->mem_create(1, 2u << 20, &h1));
  CHECK(r, fake_int("fake_cuda_fabric_refusals") == 1);
  CHECK(r, h1 == 0x101);
  /* Device 0 still asks once, at its first mem_create: the refusal is per device. */
  EXPECT_OK(r, ops->mem_create(0, 2u << 20, &h));
  CHECK(r, fake_int("fake_cuda_fabric_refusals") == 2);
  CHECK(r, h == 0x000);
  EXPECT_OK(r, ops->mem_create(0, 2u << 20, &h));
  CHECK(r, fake_int("fake_cuda_fabric_refusals") == 2);
  v = -1;
  EXPECT_OK(r, ops->device_attr(0, GCA_ATTR_FABRIC_SUPPORTED, &v));
  CHECK(r, v == 0);
  CHECK(r, fake_int("fake_cuda_fabric_refusals") == 2); /* settled: no probe */
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN];
  EXPECT(r, ops->mem_export_fabric(h, bytes), GCA_ERR_NOT_SUPPORTED,
         "mem_export_fabric: handle 0x0 was made without fabric handles: device 0 refused them "
         "(no IMEX channel for this process; cuMemCreate with fabric handles requested answered "
         "CUDA_ERROR_NOT_PERMITTED");
  EXPECT(r, ops->mem_export_fabric(h1, bytes), GCA_ERR_NOT_SUPPORTED, "device 1 refused them");
  CHECK(r, fake_int("fake_cuda_fabric_exports") == 0);
  int fd = -1;
  EXPECT_OK(r, ops->mem_export_fd(h1, &fd)); /* fd-exportable all the same */
  CHECK(r, fd == 42);
  return CHILD_PASS;
}

/* Without cuMemGetAllocationPropertiesFromHandle the reason cannot be told: the
 * driver's own answer stands. */
static int child_fabric_denied_without_properties(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  gca_memhandle_t h = 0;
  int v = -1;
  EXPECT_OK(r, ops->device_attr(0, GCA_ATTR_FABRIC_SUPPORTED, &v));
  CHECK(r, v == 0);
  EXPECT_OK(r, ops->mem_create(0, 2u << 20, &h));
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN];
  EXPECT(r, ops->mem_export_fabric(h, bytes), GCA_ERR_INVALID_ARGUMENT,
         "mem_export_fabric: CUDA_ERROR_INVALID_VALUE");
  return CHILD_PASS;
}

static int child_fabric_off(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  int v = -1;
  EXPECT_OK(r, ops->device_attr(1, GCA_ATTR_FABRIC_SUPPORTED, &v));
  CHECK(r, v == 0);
  gca_memhandle_t h = 0;
  EXPECT_OK(r, ops->mem_create(1, 2u << 20, &h));
  CHECK(r, h == 0x101);
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN];
  EXPECT(r, ops->mem_export_fabric(h, bytes), GCA_ERR_NOT_SUPPORTED,
         "mem_export_fabric: handle 0x101 was made without fabric handles: device 1 does not "
         "offer them (GCA_ATTR_FABRIC_SUPPORTED is 0)");
  memset(bytes, 0, sizeof(bytes));
  EXPECT(r, ops->mem_import_fabric(1, bytes, &h), GCA_ERR_NOT_PERMITTED,
         "mem_import_fabric: CUDA_ERROR_NOT_PERMITTED");
  return CHILD_PASS;
}

static int child_fabric_without_export_entry(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  EXPECT_OK(r, ops->init());
  uint8_t bytes[GCA_FABRIC_HANDLE_LEN] = {0};
  gca_memhandle_t h = 0;
  EXPECT(r, ops->mem_export_fabric(0x109, bytes), GCA_ERR_NOT_SUPPORTED,
         "mem_export_fabric: the driver lacks cuMemExportToShareableHandle");
  EXPECT_OK(r, ops->mem_create(1, 2u << 20, &h));
  return CHILD_PASS;
}

typedef int (*peer_enabled_fn)(int dev, int peer);

static int child_peer_access(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  EXPECT_OK(r, ops->init());
  peer_enabled_fn enabled = (peer_enabled_fn)(uintptr_t)fake_fn("fake_cuda_peer_enabled");
  CHECK(r, enabled != NULL);
  EXPECT_OK(r, ops->ctx_enable_peer_access(0, 1));
  CHECK(r, enabled(0, 1) == 1 && enabled(1, 0) == 0); /* one way, in dev's context */
  CHECK(r, fake_int("fake_cuda_current_device") == 0);
  EXPECT(r, ops->ctx_enable_peer_access(0, 1), GCA_ERR_INVALID_STATE,
         "ctx_enable_peer_access: CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED");
  EXPECT(r, ops->ctx_enable_peer_access(1, 1), GCA_ERR_INVALID_ARGUMENT,
         "device 1 cannot be its own peer");
  EXPECT(r, ops->ctx_enable_peer_access(0, 2), GCA_ERR_INVALID_ARGUMENT, "device 2 is not in");
  EXPECT_OK(r, ops->ctx_enable_peer_access(1, 0));
  CHECK(r, enabled(1, 0) == 1);
  return CHILD_PASS;
}

static int child_peer_access_unsupported(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  int can = -1;
  EXPECT_OK(r, ops->device_can_access_peer(0, 1, &can));
  CHECK(r, can == 0);
  EXPECT(r, ops->ctx_enable_peer_access(0, 1), GCA_ERR_NOT_SUPPORTED,
         "ctx_enable_peer_access: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED");
  return CHILD_PASS;
}

/* Pinned host memory goes to cuMemHostAlloc / cuMemHostRegister with
 * PORTABLE, and the driver's host-memory errors map to their statuses. */
static int child_host_memory(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  EXPECT_OK(r, ops->init());
  void *p = NULL;
  EXPECT_OK(r, ops->host_alloc(4096, &p));
  CHECK(r,
        p != NULL && fake_int("fake_cuda_last_host_flags") == 0x01 /* CU_MEMHOSTALLOC_PORTABLE */);
  EXPECT_OK(r, ops->host_free(p));
  EXPECT(r, ops->host_alloc((size_t)1 << 40, &p), GCA_ERR_OUT_OF_MEMORY,
         "host_alloc: CUDA_ERROR_OUT_OF_MEMORY");
  static char buf[8192];
  EXPECT_OK(r, ops->host_register(buf, sizeof(buf)));
  CHECK(r, fake_int("fake_cuda_last_host_flags") == 0x01 /* CU_MEMHOSTREGISTER_PORTABLE */);
  EXPECT(r, ops->host_register(buf, sizeof(buf)), GCA_ERR_INVALID_STATE,
         "host_register: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED");
  EXPECT_OK(r, ops->host_unregister(buf));
  EXPECT(r, ops->host_unregister(buf), GCA_ERR_INVALID_ARGUMENT,
         "host_unregister: CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED");
  return CHILD_PASS;
}

static int child_host_memory_without_entry(report_t *r) {
  const gca_device_ops_t *ops = gca__cuda_ops();
  EXPECT_OK(r, ops->init());
  void *p = NULL;
  EXPECT(r, ops->host_alloc(4096, &p), GCA_ERR_NOT_SUPPORTED,
         "host_alloc: the driver has no cuMemHostAlloc");
  CHECK(r, p == NULL);
  return CHILD_PASS;
}

/* ---- tests ---- */

static void host_memory_is_pinned_portable_and_errors_map(void **state) {
  (void)state;
  run_in_child(NULL, child_host_memory);
}

static void host_alloc_without_the_entry_point_is_not_supported(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_MISSING", "cuMemHostAlloc", NULL};
  run_in_child(env, child_host_memory_without_entry);
}

static void init_resolves_every_entry_within_the_driver_version(void **state) {
  (void)state;
  run_in_child(NULL, child_init_resolves_every_entry);
}

static void driver_older_than_12_is_no_device_naming_versions(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_VERSION", "11080", NULL};
  run_in_child(env, child_old_driver);
}

static void cuinit_failure_is_no_device_with_the_driver_error_name(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_INIT", "100", NULL};
  run_in_child(env, child_cuinit_fails);
}

static void missing_required_entry_fails_init_naming_it(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_MISSING", "cuMemCreate", NULL};
  run_in_child(env, child_missing_required);
}

static void missing_optional_entry_makes_its_op_not_supported(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_MISSING", "cuGraphUpload", NULL};
  run_in_child(env, child_missing_optional);
}

static void driver_12_2_gets_the_older_capture_info_and_elapsed_forms(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_VERSION", "12020", NULL};
  run_in_child(env, child_driver_12_2);
}

static void driver_12_8_gets_the_newest_capture_info_and_elapsed_forms(void **state) {
  (void)state;
  run_in_child(NULL, child_driver_12_8);
}

static void driver_errors_map_to_statuses_with_the_driver_name(void **state) {
  (void)state;
  run_in_child(NULL, child_errors_map);
}

static void ops_make_the_right_context_current_on_each_thread(void **state) {
  (void)state;
  run_in_child(NULL, child_contexts);
}

static void set_device_makes_its_primary_context_current_for_null_streams(void **state) {
  (void)state;
  run_in_child(NULL, child_current_device);
}

static void kernels_load_once_per_device_and_marshal_arguments(void **state) {
  (void)state;
  run_in_child(NULL, child_kernels);
}

static void captures_are_counted_while_the_driver_has_them_open(void **state) {
  (void)state;
  run_in_child(NULL, child_capture_count);
}

static void graph_update_rejection_reports_node_index(void **state) {
  (void)state;
  run_in_child(NULL, child_graphs);
}

static void vmm_requests_fd_handles_where_supported(void **state) {
  (void)state;
  run_in_child(NULL, child_vmm);
}

static void fabric_handles_are_requested_exported_and_imported_as_64_bytes(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_FABRIC", "on", NULL};
  run_in_child(env, child_fabric);
}

static void fabric_refused_at_create_falls_back_once_per_device(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_FABRIC", "denied", NULL};
  run_in_child(env, child_fabric_denied);
}

static void fabric_refused_without_the_properties_entry_is_the_drivers_error(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_FABRIC", "denied", "FAKE_CUDA_MISSING",
                       "cuMemGetAllocationPropertiesFromHandle", NULL};
  run_in_child(env, child_fabric_denied_without_properties);
}

static void fabric_ops_without_fabric_support_are_refused(void **state) {
  (void)state;
  run_in_child(NULL, child_fabric_off);
}

static void fabric_export_without_the_entry_point_is_not_supported(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_FABRIC", "on", "FAKE_CUDA_MISSING",
                       "cuMemExportToShareableHandle", NULL};
  run_in_child(env, child_fabric_without_export_entry);
}

static void peer_access_is_enabled_once_one_way_and_errors_map(void **state) {
  (void)state;
  run_in_child(NULL, child_peer_access);
}

static void peer_access_the_driver_says_unsupported_is_not_supported(void **state) {
  (void)state;
  const char *env[] = {"FAKE_CUDA_PEERLESS", "1", NULL};
  run_in_child(env, child_peer_access_unsupported);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(init_resolves_every_entry_within_the_driver_version),
      cmocka_unit_test(driver_older_than_12_is_no_device_naming_versions),
      cmocka_unit_test(cuinit_failure_is_no_device_with_the_driver_error_name),
      cmocka_unit_test(missing_required_entry_fails_init_naming_it),
      cmocka_unit_test(missing_optional_entry_makes_its_op_not_supported),
      cmocka_unit_test(driver_12_2_gets_the_older_capture_info_and_elapsed_forms),
      cmocka_unit_test(driver_12_8_gets_the_newest_capture_info_and_elapsed_forms),
      cmocka_unit_test(driver_errors_map_to_statuses_with_the_driver_name),
      cmocka_unit_test(ops_make_the_right_context_current_on_each_thread),
      cmocka_unit_test(set_device_makes_its_primary_context_current_for_null_streams),
      cmocka_unit_test(kernels_load_once_per_device_and_marshal_arguments),
      cmocka_unit_test(graph_update_rejection_reports_node_index),
      cmocka_unit_test(captures_are_counted_while_the_driver_has_them_open),
      cmocka_unit_test(vmm_requests_fd_handles_where_supported),
      cmocka_unit_test(fabric_handles_are_requested_exported_and_imported_as_64_bytes),
      cmocka_unit_test(fabric_refused_at_create_falls_back_once_per_device),
      cmocka_unit_test(fabric_refused_without_the_properties_entry_is_the_drivers_error),
      cmocka_unit_test(fabric_ops_without_fabric_support_are_refused),
      cmocka_unit_test(fabric_export_without_the_entry_point_is_not_supported),
      cmocka_unit_test(peer_access_is_enabled_once_one_way_and_errors_map),
      cmocka_unit_test(peer_access_the_driver_says_unsupported_is_not_supported),
      cmocka_unit_test(host_memory_is_pinned_portable_and_errors_map),
      cmocka_unit_test(host_alloc_without_the_entry_point_is_not_supported),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
