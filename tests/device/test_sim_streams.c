/* SPDX-License-Identifier: Apache-2.0 */
/* test_sim_streams.c - sim rules for streams that are the driver's but cannot
 * be contract tests (a GPU may, not must, behave so): device calls from a host
 * function are refused (Note [Host functions]); a forked child of a process
 * that used the sim cannot use it (Note [Sim after fork]); copies of pageable
 * memory are staged at the call and copies or memsets of memory that is
 * neither device nor host memory fail at the call (Note [Sim copies]); work
 * that faults at run time (a kernel's, a copy batch's entry, a compute
 * kernel's operand) is reported by the next synchronize, never a crash
 * (Note [Sim memory faults]).
 *
 * Ordering is by gates (a host function that blocks until the test opens it),
 * never by sleeps.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "child.h"
#include "support.h"

static const gca_device_ops_t *ops;

static int setup(void **state) {
  (void)state;
  ops = test_backend();
  return 0;
}

/* What a host function got from the device calls it tried. */
typedef struct inside {
  gca_stream_t s;
  gca_status_t query, alloc, record;
  char detail[256];
  int runs;
} inside_t;

static void call_device(void *arg) {
  inside_t *in = arg;
  gca_devptr_t p = 0;
  in->query = ops->stream_query(in->s);
  snprintf(in->detail, sizeof(in->detail), "%s", gca_last_error());
  in->alloc = ops->mem_alloc(0, 4096, &p);
  in->record = ops->kernel_fill_u32(p, 1, 1, 1, in->s);
  in->runs++;
}

static void expect_refused(const inside_t *in, int runs) {
  assert_int_equal(in->runs, runs);
  assert_int_equal(in->query, GCA_ERR_NOT_PERMITTED);
  assert_int_equal(in->alloc, GCA_ERR_NOT_PERMITTED);
  assert_int_equal(in->record, GCA_ERR_NOT_PERMITTED);
  assert_non_null(strstr(in->detail, "stream_query: "));
  assert_non_null(strstr(in->detail, "host function"));
}

static void device_calls_from_a_host_function_are_not_permitted(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  uint64_t used = gca_sim_used_bytes(0);
  inside_t in = {.s = s, .query = GCA_OK, .alloc = GCA_OK, .record = GCA_OK};
  assert_ok(ops->launch_host_func(s, call_device, &in));
  assert_ok(ops->stream_synchronize(s));
  expect_refused(&in, 1);
  /* as a node of a replayed graph too */
  gca_graph_t g;
  gca_graph_exec_t x;
  in = (inside_t){.s = s, .query = GCA_OK, .alloc = GCA_OK, .record = GCA_OK};
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->launch_host_func(s, call_device, &in));
  assert_ok(ops->stream_end_capture(s, &g));
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  expect_refused(&in, 1);
  /* the worker and the calling thread are unaffected afterwards */
  gca_devptr_t p;
  assert_ok(ops->mem_alloc(0, 4096, &p));
  assert_ok(ops->kernel_fill_u32(p, 5, 1, 4, s));
  assert_ok(ops->stream_synchronize(s));
  assert_int_equal(((const uint32_t *)(uintptr_t)p)[3], 8);
  assert_ok(ops->mem_free(0, p));
  assert_int_equal(gca_sim_used_bytes(0), used); /* the refused mem_alloc took nothing */
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->stream_destroy(s));
}

static gca_stream_t fork_stream;

static int child_synchronize(report_t *r) {
  gca_status_t st = ops->stream_synchronize(fork_stream);
  if (st != GCA_ERR_NO_DEVICE)
    return failf(r, "stream_synchronize in the child: %s (%s)", gca_status_name(st),
                 gca_last_error());
  if (!strstr(gca_last_error(), "stream_synchronize: ") || !strstr(gca_last_error(), "forked"))
    return failf(r, "detail does not name the fork: %s", gca_last_error());
  st = ops->ctx_synchronize(0);
  if (st != GCA_ERR_NO_DEVICE)
    return failf(r, "ctx_synchronize in the child: %s", gca_status_name(st));
  gca_devptr_t p;
  st = ops->mem_alloc(0, 4096, &p);
  if (st != GCA_ERR_NO_DEVICE)
    return failf(r, "mem_alloc in the child: %s", gca_status_name(st));
  return CHILD_PASS;
}

static void forked_child_cannot_use_the_sim_and_does_not_hang(void **state) {
  (void)state;
  test_gate_t g;
  test_gate_init(&g);
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &fork_stream));
  assert_ok(
      ops->launch_host_func(fork_stream, test_gate_pass, &g)); /* work queued across the fork */
  assert_ok(ops->kernel_sleep(1, fork_stream));
  run_child(NULL, child_synchronize, NULL, 0);
  test_gate_open(&g);
  assert_ok(ops->stream_synchronize(fork_stream));
  assert_ok(ops->stream_destroy(fork_stream));
  test_gate_fini(&g);
}

static void pageable_host_to_device_copy_reads_the_source_at_the_call(void **state) {
  (void)state;
  test_gate_t g;
  test_gate_init(&g);
  gca_stream_t s;
  gca_devptr_t d;
  uint32_t src[64], back[64];
  for (int i = 0; i < 64; i++)
    src[i] = 1000u + (uint32_t)i;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->mem_alloc(0, sizeof(src), &d));
  assert_ok(ops->launch_host_func(s, test_gate_pass, &g)); /* the copy cannot run yet */
  assert_ok(ops->memcpy_async(d, (gca_devptr_t)(uintptr_t)src, sizeof(src), s));
  memset(src, 0xee, sizeof(src)); /* the caller reuses its buffer at once */
  test_gate_open(&g);
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)back, d, sizeof(back), s));
  assert_ok(ops->stream_synchronize(s));
  for (int i = 0; i < 64; i++)
    assert_int_equal(back[i], 1000u + (uint32_t)i);
  assert_ok(ops->mem_free(0, d));
  assert_ok(ops->stream_destroy(s));
  test_gate_fini(&g);
}

static void copies_and_memsets_of_non_device_memory_fail_at_the_call(void **state) {
  (void)state;
  gca_stream_t s;
  gca_devptr_t d, resv;
  size_t gran;
  uint32_t host[16] = {0};
  gca_devptr_t h = (gca_devptr_t)(uintptr_t)host;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->mem_alloc(0, 4096, &d));
  assert_ok(ops->mem_granularity(0, false, &gran));
  assert_ok(ops->mem_address_reserve(0, gran, 0, &resv)); /* reserved, nothing mapped */
  /* what cudaMemset((void*)0x10, 0, 16) sends through the preload shim */
  assert_status(ops->memset_d8_async(0x10, 0, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "memset_d8_async: [0x10, +16) is not mapped device memory");
  assert_status(ops->memset_d32_async(resv, 0, 4, s), GCA_ERR_INVALID_ARGUMENT,
                "is not mapped device memory");
  assert_status(ops->memset_d8_async(h, 0, sizeof(host), s), GCA_ERR_INVALID_ARGUMENT,
                "memset_d8_async: ");
  assert_status(ops->memcpy_async(d, 0x10, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "memcpy_async: source [0x10, +16) is neither mapped device memory nor host");
  assert_status(ops->memcpy_async(resv, d, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "memcpy_async: destination");
  assert_status(ops->memcpy_async(h, resv + 64, 16, s), GCA_ERR_INVALID_ARGUMENT,
                "memcpy_async: source");
  /* nothing was queued: the stream is clean and works */
  assert_ok(ops->memset_d32_async(d, 7, 16, s));
  assert_ok(ops->memcpy_async(h, d, sizeof(host), s));
  assert_ok(ops->stream_synchronize(s));
  assert_int_equal(host[15], 7);
  assert_ok(ops->mem_address_free(0, resv, gran));
  assert_ok(ops->mem_free(0, d));
  assert_ok(ops->stream_destroy(s));
}

static void work_on_unmapped_memory_fails_the_next_synchronize_not_the_process(void **state) {
  (void)state;
  gca_stream_t s;
  gca_event_t e;
  gca_devptr_t resv;
  gca_memhandle_t mh;
  size_t gran;
  int dev0 = 0;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &e));
  assert_ok(ops->mem_granularity(0, false, &gran));
  assert_ok(ops->mem_address_reserve(0, gran, 0, &resv));
  /* a kernel's pointer is not checked at launch: it faults when it runs */
  assert_ok(ops->kernel_fill_u32(resv, 1, 1, 16, s));
  assert_ok(ops->event_record(e, s));
  assert_status(ops->stream_synchronize(s), GCA_ERR_ILLEGAL_ADDRESS,
                "stream_synchronize: CUDA_ERROR_ILLEGAL_ADDRESS: a kernel fill_u32");
  assert_status(ops->stream_query(s), GCA_ERR_ILLEGAL_ADDRESS, "ILLEGAL_ADDRESS");
  assert_status(ops->event_synchronize(e), GCA_ERR_ILLEGAL_ADDRESS, "event_synchronize: ");
  assert_status(ops->ctx_synchronize(0), GCA_ERR_ILLEGAL_ADDRESS, "ctx_synchronize: ");
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->ctx_synchronize(0));
  /* a replay whose memory was unmapped after the capture */
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->mem_create(0, gran, &mh));
  assert_ok(ops->mem_map(resv, gran, 0, mh));
  assert_ok(ops->mem_set_access(resv, gran, &dev0, 1));
  gca_graph_t g;
  gca_graph_exec_t x;
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->memset_d32_async(resv, 3, 16, s));
  assert_ok(ops->stream_end_capture(s, &g));
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  assert_int_equal(((const uint32_t *)(uintptr_t)resv)[15], 3);
  assert_ok(ops->mem_unmap(resv, gran));
  assert_ok(ops->graph_launch(x, s));
  assert_status(ops->stream_synchronize(s), GCA_ERR_ILLEGAL_ADDRESS, "a memset");
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_release(mh));
  assert_ok(ops->mem_address_free(0, resv, gran));
}

/* A copy batch reads its entries when it runs: an entry naming memory that
 * is not mapped then faults the stream (the other entries do not run), as
 * does a table that is not device memory. */
static void a_copy_batch_entry_on_unmapped_memory_faults_when_it_runs(void **state) {
  (void)state;
  gca_stream_t s;
  gca_devptr_t table = 0, buf = 0, resv = 0;
  size_t gran;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->mem_alloc(0, 4096, &table));
  assert_ok(ops->mem_alloc(0, 4096, &buf));
  assert_ok(ops->mem_granularity(0, false, &gran));
  assert_ok(ops->mem_address_reserve(0, gran, 0, &resv));
  memset((void *)(uintptr_t)buf, 0x11, 4096);
  gca_copy_entry_t e[2] = {{buf + 2048, buf, 64}, {resv, buf, 64}};
  memcpy((void *)(uintptr_t)table, e, sizeof(e));
  memset((void *)(uintptr_t)(buf + 2048), 0, 64);
  assert_ok(ops->kernel_copy_batch(table, 2, s));
  assert_status(ops->stream_synchronize(s), GCA_ERR_ILLEGAL_ADDRESS, "a kernel copy_batch");
  assert_int_equal(((const unsigned char *)(uintptr_t)buf)[2048], 0); /* nothing ran */
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  uint64_t host_table[3] = {0};
  assert_ok(ops->kernel_copy_batch((gca_devptr_t)(uintptr_t)host_table, 1, s));
  assert_status(ops->stream_synchronize(s), GCA_ERR_ILLEGAL_ADDRESS, "a kernel copy_batch (table)");
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_address_free(0, resv, gran));
  assert_ok(ops->mem_free(0, table));
  assert_ok(ops->mem_free(0, buf));
}

/* The compute kernels check the bytes they touch when they run: an operand
 * in an unmapped reservation, one that runs off the end of a mapping, and a
 * captured kernel replayed after its memory was unmapped each fault the
 * stream, and the kernel writes nothing. */
static void a_compute_kernel_on_unmapped_memory_faults_when_it_runs(void **state) {
  (void)state;
  gca_stream_t s;
  gca_devptr_t buf = 0, resv = 0;
  gca_memhandle_t mh;
  size_t gran;
  int dev0 = 0;
  assert_ok(ops->mem_alloc(0, 4096, &buf));
  assert_ok(ops->mem_granularity(0, false, &gran));
  assert_ok(ops->mem_address_reserve(0, 2 * gran, 0, &resv));
  float *host = (float *)(uintptr_t)buf;
  for (int i = 0; i < 1024; i++)
    host[i] = 1.0f;

  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->kernel_gemm_f32(buf, resv, buf + 1024, 4, 4, 4, 0, s));
  assert_status(ops->stream_synchronize(s), GCA_ERR_ILLEGAL_ADDRESS, "a kernel gemm_f32");
  assert_true(host[0] == 1.0f); /* nothing written */
  assert_ok(ops->stream_destroy(s));

  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->kernel_ew_f32(GCA_EW_ADD, buf, buf, resv + 64, 0, 0, 16, s));
  assert_status(ops->stream_synchronize(s), GCA_ERR_ILLEGAL_ADDRESS, "a kernel ew_f32");
  assert_true(host[0] == 1.0f);
  assert_ok(ops->stream_destroy(s));

  /* the first granule mapped, a dot whose a runs into the second */
  assert_ok(ops->mem_create(0, gran, &mh));
  assert_ok(ops->mem_map(resv, gran, 0, mh));
  assert_ok(ops->mem_set_access(resv, gran, &dev0, 1));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->kernel_dot_f32(buf, resv + gran - 8, buf + 1024, 4, 1, s));
  assert_status(ops->stream_synchronize(s), GCA_ERR_ILLEGAL_ADDRESS, "a kernel dot_f32");
  assert_true(host[0] == 1.0f);
  assert_ok(ops->stream_destroy(s));

  /* a replay after the memory it names was unmapped */
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  gca_graph_t g;
  gca_graph_exec_t x;
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->kernel_gemm_f32(buf, resv, resv + 64, 4, 4, 4, 0, s));
  assert_ok(ops->stream_end_capture(s, &g));
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  assert_true(host[0] == 0.0f); /* the fresh mapping reads as zeros */
  host[0] = 1.0f;
  assert_ok(ops->mem_unmap(resv, gran));
  assert_ok(ops->graph_launch(x, s));
  assert_status(ops->stream_synchronize(s), GCA_ERR_ILLEGAL_ADDRESS, "a kernel gemm_f32");
  assert_true(host[0] == 1.0f);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_release(mh));
  assert_ok(ops->mem_address_free(0, resv, 2 * gran));
  assert_ok(ops->mem_free(0, buf));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(device_calls_from_a_host_function_are_not_permitted),
      cmocka_unit_test(forked_child_cannot_use_the_sim_and_does_not_hang),
      cmocka_unit_test(pageable_host_to_device_copy_reads_the_source_at_the_call),
      cmocka_unit_test(copies_and_memsets_of_non_device_memory_fail_at_the_call),
      cmocka_unit_test(work_on_unmapped_memory_fails_the_next_synchronize_not_the_process),
      cmocka_unit_test(a_copy_batch_entry_on_unmapped_memory_faults_when_it_runs),
      cmocka_unit_test(a_compute_kernel_on_unmapped_memory_faults_when_it_runs),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
