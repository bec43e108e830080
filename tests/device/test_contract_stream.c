/* SPDX-License-Identifier: Apache-2.0 */
/* test_contract_stream.c - the stream and event contract of the device table,
 * written once against the ops and run on sim and on cuda: in-order
 * asynchronous execution under load, events that complete only with the work
 * before them, cross-stream waits, the legacy stream's implicit ordering,
 * elapsed time, host functions in order, the NULL stream as the legacy stream
 * of the calling thread's current device (captures on one device leave the
 * others' legacy streams alone), and refusal of bad handles.
 *
 * Ordering tests do not rely on timing: a host function blocked on a gate
 * holds a stream back until the test opens the gate, so "not yet run" is
 * checked while the gate is shut and the data once it is open.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "gca.h"
#include "support.h"

#define N 256

static const gca_device_ops_t *ops;
static bool is_sim;

static int setup(void **state) {
  (void)state;
  ops = test_backend();
  is_sim = strcmp(ops->name, "sim") == 0;
  return 0;
}

static gca_devptr_t dalloc(size_t bytes) {
  gca_devptr_t p = 0;
  assert_ok(ops->mem_alloc(0, bytes, &p));
  return p;
}

/* Copies n words of device memory to host through a fresh stream. */
static void dread(uint32_t *host, gca_devptr_t src, size_t n) {
  gca_stream_t s;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)host, src, n * 4, s));
  assert_ok(ops->stream_synchronize(s));
  assert_ok(ops->stream_destroy(s));
}

static void expect_fill(gca_devptr_t p, uint32_t value, uint32_t step) {
  uint32_t h[N];
  dread(h, p, N);
  for (uint32_t i = 0; i < N; i++)
    if (h[i] != value + i * step)
      fail_msg("word %u: %u, wanted %u", i, h[i], value + i * step);
}

static void stream_order_holds_under_heavy_async_load(void **state) {
  (void)state;
  enum { NS = 4, ROUNDS = 5000 };
  gca_stream_t s[NS];
  gca_devptr_t buf[NS], ones = dalloc(N * 4);
  gca_stream_t init;
  assert_ok(ops->stream_create(0, GCA_STREAM_DEFAULT, 0, &init));
  assert_ok(ops->memset_d32_async(ones, 1, N, init));
  assert_ok(ops->stream_synchronize(init));
  for (int k = 0; k < NS; k++) {
    buf[k] = dalloc(N * 4);
    assert_ok(
        ops->stream_create(0, k % 2 ? GCA_STREAM_NON_BLOCKING : GCA_STREAM_DEFAULT, 0, &s[k]));
  }
  uint64_t t0 = gca__now_ns();
  for (int r = 0; r < ROUNDS; r++) {
    for (int k = 0; k < NS; k++) {
      if (r == 0)
        assert_ok(ops->kernel_fill_u32(buf[k], (uint32_t)k * 1000u, 1, N, s[k]));
      else if (r % 1000 == 500)
        assert_ok(ops->memcpy_async(buf[k], buf[k], N * 4, s[k]));
      else
        assert_ok(ops->kernel_add_u32(buf[k], buf[k], ones, N, s[k]));
    }
  }
  for (int k = 0; k < NS; k++)
    assert_ok(ops->stream_synchronize(s[k]));
  printf("# %d items on %d streams in %.1f ms\n", NS * ROUNDS, NS,
         (double)(gca__now_ns() - t0) / 1e6);
  for (int k = 0; k < NS; k++) {
    expect_fill(buf[k], (uint32_t)k * 1000u + ROUNDS - 1 - ROUNDS / 1000, 1);
    assert_ok(ops->stream_destroy(s[k]));
    assert_ok(ops->mem_free(0, buf[k]));
  }
  assert_ok(ops->stream_destroy(init));
  assert_ok(ops->mem_free(0, ones));
}

static void event_after_slow_work_completes_only_with_it(void **state) {
  (void)state;
  gca_devptr_t p = dalloc(N * 4);
  gca_stream_t s;
  gca_event_t e;
  test_gate_t g;
  test_gate_init(&g);
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->event_create(0, GCA_EVENT_DEFAULT, &e));
  assert_ok(ops->memset_d32_async(p, 0, N, s));
  assert_ok(ops->launch_host_func(s, test_gate_pass, &g));
  assert_ok(ops->kernel_sleep(20 * 1000 * 1000, s));
  assert_ok(ops->kernel_fill_u32(p, 7, 3, N, s));
  assert_ok(ops->event_record(e, s));
  assert_status(ops->event_query(e), GCA_ERR_NOT_READY, "");
  assert_status(ops->stream_query(s), GCA_ERR_NOT_READY, "");
  test_gate_open(&g);
  assert_ok(ops->event_synchronize(e));
  assert_ok(ops->event_query(e));
  expect_fill(p, 7, 3);
  assert_ok(ops->stream_synchronize(s));
  assert_ok(ops->stream_query(s));
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, p));
  test_gate_fini(&g);
}

static void never_recorded_event_is_complete(void **state) {
  (void)state;
  gca_event_t e;
  gca_stream_t s;
  assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &e));
  assert_ok(ops->event_query(e));
  assert_ok(ops->event_synchronize(e));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->stream_wait_event(s, e));
  assert_ok(ops->stream_synchronize(s));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->event_destroy(e));
}

static void stream_wait_event_orders_cross_stream_work(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4), out = dalloc(N * 4);
  gca_stream_t s1, s2;
  gca_event_t e;
  test_gate_t g;
  test_gate_init(&g);
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s1));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s2));
  assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &e));
  assert_ok(ops->memset_d32_async(a, 0, N, s1));
  assert_ok(ops->memset_d32_async(out, 0, N, s1));
  assert_ok(ops->stream_synchronize(s1));
  assert_ok(ops->launch_host_func(s1, test_gate_pass, &g));
  assert_ok(ops->kernel_fill_u32(a, 5, 1, N, s1));
  assert_ok(ops->event_record(e, s1));
  assert_ok(ops->stream_wait_event(s2, e));
  assert_ok(ops->kernel_add_u32(out, a, a, N, s2));
  assert_status(ops->stream_query(s2), GCA_ERR_NOT_READY, "");
  test_gate_open(&g);
  assert_ok(ops->stream_synchronize(s2));
  expect_fill(out, 10, 2);
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->stream_destroy(s2));
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(0, out));
  test_gate_fini(&g);
}

static void legacy_stream_orders_with_blocking_streams_only(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4), out = dalloc(N * 4), x = dalloc(N * 4);
  gca_stream_t blk, nb;
  test_gate_t g1, g2;
  test_gate_init(&g1);
  test_gate_init(&g2);
  assert_ok(ops->stream_create(0, GCA_STREAM_DEFAULT, 0, &blk));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &nb));
  assert_ok(ops->memset_d32_async(a, 0, N, NULL));
  assert_ok(ops->memset_d32_async(out, 0, N, NULL));
  assert_ok(ops->memset_d32_async(x, 0, N, NULL));
  assert_ok(ops->stream_synchronize(NULL));
  /* blocking stream -> legacy -> blocking stream, ordered without events */
  assert_ok(ops->launch_host_func(blk, test_gate_pass, &g1));
  assert_ok(ops->kernel_fill_u32(a, 3, 0, N, blk));
  assert_ok(ops->kernel_add_u32(out, a, a, N, NULL));
  assert_ok(ops->kernel_fill_u32(a, 100, 0, N, blk));
  assert_status(ops->stream_query(NULL), GCA_ERR_NOT_READY, "");
  test_gate_open(&g1);
  assert_ok(ops->stream_synchronize(blk));
  expect_fill(out, 6, 0);
  expect_fill(a, 100, 0);
  /* a non-blocking stream is not waited for */
  assert_ok(ops->launch_host_func(nb, test_gate_pass, &g2));
  assert_ok(ops->kernel_fill_u32(x, 9, 1, N, NULL));
  assert_ok(ops->stream_synchronize(NULL));
  assert_status(ops->stream_query(nb), GCA_ERR_NOT_READY, "");
  expect_fill(x, 9, 1);
  test_gate_open(&g2);
  assert_ok(ops->stream_synchronize(nb));
  assert_ok(ops->stream_destroy(blk));
  assert_ok(ops->stream_destroy(nb));
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(0, out));
  assert_ok(ops->mem_free(0, x));
  test_gate_fini(&g1);
  test_gate_fini(&g2);
}

static void elapsed_time_needs_two_completed_timed_events(void **state) {
  (void)state;
  gca_stream_t s;
  gca_event_t e1, e2, untimed, unrecorded;
  float ms = -1;
  test_gate_t g;
  test_gate_init(&g);
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->event_create(0, GCA_EVENT_DEFAULT, &e1));
  assert_ok(ops->event_create(0, GCA_EVENT_DEFAULT, &e2));
  assert_ok(ops->event_create(0, GCA_EVENT_DEFAULT, &unrecorded));
  assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &untimed));
  assert_ok(ops->event_record(e1, s));
  assert_ok(ops->launch_host_func(s, test_gate_pass, &g));
  assert_ok(ops->kernel_sleep(5 * 1000 * 1000, s));
  assert_ok(ops->event_record(e2, s));
  assert_ok(ops->event_record(untimed, s));
  assert_status(ops->event_elapsed(e1, e2, &ms), GCA_ERR_NOT_READY, "");
  test_gate_open(&g);
  assert_ok(ops->event_synchronize(e2));
  assert_ok(ops->event_elapsed(e1, e2, &ms));
  assert_true(ms >= 0.0f);
  printf("# 5 ms of sleep measured as %.3f ms\n", (double)ms);
  assert_status(ops->event_elapsed(e1, untimed, &ms), GCA_ERR_INVALID_HANDLE, "");
  assert_status(ops->event_elapsed(e1, unrecorded, &ms), GCA_ERR_INVALID_HANDLE, "");
  assert_status(ops->event_elapsed(e1, e2, NULL), GCA_ERR_INVALID_ARGUMENT, "");
  assert_ok(ops->event_destroy(e1));
  assert_ok(ops->event_destroy(e2));
  assert_ok(ops->event_destroy(untimed));
  assert_ok(ops->event_destroy(unrecorded));
  assert_ok(ops->stream_destroy(s));
  test_gate_fini(&g);
}

typedef struct log {
  pthread_mutex_t mu;
  int v[2048];
  int n;
} log_t;

typedef struct entry {
  log_t *log;
  int value;
} entry_t;

static void log_append(void *arg) {
  entry_t *e = arg;
  pthread_mutex_lock(&e->log->mu);
  e->log->v[e->log->n++] = e->value;
  pthread_mutex_unlock(&e->log->mu);
}

static void host_funcs_run_in_stream_order(void **state) {
  (void)state;
  enum { PER = 1000 };
  static log_t logs[2];
  static entry_t entries[2][PER];
  gca_stream_t s[2];
  for (int k = 0; k < 2; k++) {
    pthread_mutex_init(&logs[k].mu, NULL);
    logs[k].n = 0;
    assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s[k]));
  }
  for (int i = 0; i < PER; i++)
    for (int k = 0; k < 2; k++) {
      entries[k][i] = (entry_t){&logs[k], i};
      assert_ok(ops->launch_host_func(s[k], log_append, &entries[k][i]));
    }
  assert_ok(ops->ctx_synchronize(0));
  for (int k = 0; k < 2; k++) {
    assert_int_equal(logs[k].n, PER);
    for (int i = 0; i < PER; i++)
      assert_int_equal(logs[k].v[i], i);
    assert_ok(ops->stream_destroy(s[k]));
    pthread_mutex_destroy(&logs[k].mu);
  }
}

static void destroyed_stream_still_completes_pending_work(void **state) {
  (void)state;
  gca_devptr_t p = dalloc(N * 4);
  gca_stream_t s;
  gca_event_t e;
  test_gate_t g;
  test_gate_init(&g);
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &e));
  assert_ok(ops->launch_host_func(s, test_gate_pass, &g));
  assert_ok(ops->kernel_fill_u32(p, 42, 1, N, s));
  assert_ok(ops->event_record(e, s));
  assert_ok(ops->stream_destroy(s));
  assert_status(ops->event_query(e), GCA_ERR_NOT_READY, "");
  test_gate_open(&g);
  assert_ok(ops->event_synchronize(e));
  assert_ok(ops->ctx_synchronize(0));
  expect_fill(p, 42, 1);
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->mem_free(0, p));
  test_gate_fini(&g);
}

static void ctx_synchronize_waits_for_every_stream(void **state) {
  (void)state;
  gca_devptr_t p[3];
  gca_stream_t s[3];
  for (int k = 0; k < 3; k++) {
    p[k] = dalloc(N * 4);
    assert_ok(
        ops->stream_create(0, k ? GCA_STREAM_NON_BLOCKING : GCA_STREAM_DEFAULT, k - 1, &s[k]));
    assert_ok(ops->kernel_sleep(2 * 1000 * 1000, s[k]));
    assert_ok(ops->kernel_fill_u32(p[k], (uint32_t)k, 2, N, s[k]));
  }
  assert_ok(ops->ctx_synchronize(0));
  for (int k = 0; k < 3; k++) {
    assert_ok(ops->stream_query(s[k]));
    expect_fill(p[k], (uint32_t)k, 2);
    assert_ok(ops->stream_destroy(s[k]));
    assert_ok(ops->mem_free(0, p[k]));
  }
}

static void bad_arguments_and_handles_are_refused(void **state) {
  (void)state;
  gca_stream_t s;
  gca_event_t e;
  float ms;
  assert_status(ops->stream_create(0, 0, 0, NULL), GCA_ERR_INVALID_ARGUMENT, "");
  assert_status(ops->event_create(0, 0, NULL), GCA_ERR_INVALID_ARGUMENT, "");
  assert_status(ops->stream_create(4096, 0, 0, &s), GCA_ERR_INVALID_ARGUMENT, "");
  assert_status(ops->event_create(4096, 0, &e), GCA_ERR_INVALID_ARGUMENT, "");
  assert_status(ops->launch_host_func(NULL, NULL, NULL), GCA_ERR_INVALID_ARGUMENT, "");
  if (!is_sim)
    return; /* the driver may crash on destroyed handles; the sim must not */
  assert_status(ops->stream_create(0, 0x80, 0, &s), GCA_ERR_INVALID_ARGUMENT, "flags");
  assert_status(ops->event_create(0, 0x80, &e), GCA_ERR_INVALID_ARGUMENT, "flags");
  assert_status(ops->stream_destroy(NULL), GCA_ERR_INVALID_HANDLE, "stream_destroy");
  assert_status(ops->event_query(NULL), GCA_ERR_INVALID_HANDLE, "event_query");
  assert_status(ops->kernel_fill_u32(0, 1, 1, N, NULL), GCA_ERR_INVALID_ARGUMENT,
                "kernel_fill_u32");
  assert_status(ops->memset_d32_async(2, 1, N, NULL), GCA_ERR_INVALID_ARGUMENT, "aligned");
  assert_status(ops->memcpy_async(0, 8, 4, NULL), GCA_ERR_INVALID_ARGUMENT, "memcpy_async");
  assert_ok(ops->stream_create(0, 0, 0, &s));
  assert_ok(ops->event_create(0, 0, &e));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->event_destroy(e));
  assert_status(ops->stream_synchronize(s), GCA_ERR_INVALID_HANDLE, "stream_synchronize");
  assert_status(ops->stream_query(s), GCA_ERR_INVALID_HANDLE, "not a live stream");
  assert_status(ops->kernel_sleep(1, s), GCA_ERR_INVALID_HANDLE, "kernel_sleep");
  assert_status(ops->stream_destroy(s), GCA_ERR_INVALID_HANDLE, "stream_destroy");
  assert_status(ops->event_record(e, NULL), GCA_ERR_INVALID_HANDLE, "not a live event");
  assert_status(ops->event_synchronize(e), GCA_ERR_INVALID_HANDLE, "event_synchronize");
  assert_status(ops->event_elapsed(e, e, &ms), GCA_ERR_INVALID_HANDLE, "event_elapsed");
  assert_status(ops->stream_wait_event(NULL, e), GCA_ERR_INVALID_HANDLE, "stream_wait_event");
  assert_status(ops->event_destroy(e), GCA_ERR_INVALID_HANDLE, "event_destroy");
  /* a handle of one kind is not accepted as another */
  assert_ok(ops->event_create(0, 0, &e));
  assert_status(ops->stream_query((gca_stream_t)(void *)e), GCA_ERR_INVALID_HANDLE, "");
  assert_status(ops->stream_query((gca_stream_t)(uintptr_t)0x1234), GCA_ERR_INVALID_HANDLE, "");
  assert_ok(ops->event_destroy(e));
}

/* cuMemcpyAsync, "API synchronization behavior": a transfer from any host
 * memory to any host memory is fully synchronous with respect to the host. */
static void host_to_host_async_copy_is_complete_at_return(void **state) {
  (void)state;
  gca_stream_t s;
  uint32_t src[256], dst[256];
  for (int i = 0; i < 256; i++) {
    src[i] = 7u * (uint32_t)i + 1;
    dst[i] = 0;
  }
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)dst, (gca_devptr_t)(uintptr_t)src,
                              sizeof(src), s));
  for (int i = 0; i < 256; i++)
    assert_int_equal(dst[i], 7u * (uint32_t)i + 1);
  assert_ok(ops->stream_synchronize(s));
  assert_ok(ops->stream_destroy(s));
}

/* Fills one word on GCA_STREAM_PER_THREAD from another thread and waits for it
 * there, while the main thread's per-thread stream is held. */
typedef struct pt_work {
  gca_devptr_t buf;
  uint32_t word;
  gca_status_t st;
  char detail[256];
} pt_work_t;

static void *per_thread_fill(void *arg) {
  pt_work_t *w = arg;
  w->st = ops->kernel_fill_u32(w->buf, 77, 0, 1, GCA_STREAM_PER_THREAD);
  if (w->st == GCA_OK)
    w->st = ops->memcpy_async((gca_devptr_t)(uintptr_t)&w->word, w->buf, 4, GCA_STREAM_PER_THREAD);
  if (w->st == GCA_OK)
    w->st = ops->stream_synchronize(GCA_STREAM_PER_THREAD);
  if (w->st != GCA_OK)
    snprintf(w->detail, sizeof(w->detail), "%s", gca_last_error());
  return NULL;
}

/* CU_STREAM_PER_THREAD: each thread has its own implicit stream. */
static void per_thread_stream_is_each_threads_own(void **state) {
  (void)state;
  test_gate_t g;
  test_gate_init(&g);
  pt_work_t w = {.st = GCA_OK};
  assert_ok(ops->mem_alloc(0, 256, &w.buf));
  assert_ok(ops->launch_host_func(GCA_STREAM_PER_THREAD, test_gate_pass, &g));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, per_thread_fill, &w), 0);
  pthread_join(t, NULL);
  if (w.st != GCA_OK) {
    test_gate_open(&g);
    fail_msg("other thread: %s: %s", gca_status_name(w.st), w.detail);
  }
  assert_int_equal(w.word, 77);
  assert_status(ops->stream_query(GCA_STREAM_PER_THREAD), GCA_ERR_NOT_READY, "");
  test_gate_open(&g);
  assert_ok(ops->stream_synchronize(GCA_STREAM_PER_THREAD));
  assert_ok(ops->stream_query(GCA_STREAM_PER_THREAD));
  assert_ok(ops->mem_free(0, w.buf));
  test_gate_fini(&g);
}

/* The per-thread stream is not non-blocking: it synchronizes with the legacy
 * stream (both ways), but not with other blocking streams. CU_STREAM_LEGACY is
 * the legacy stream, the same as NULL. Neither handle can be destroyed. */
static void per_thread_stream_orders_with_legacy_only(void **state) {
  (void)state;
  test_gate_t g;
  gca_devptr_t p;
  gca_stream_t blk;
  assert_ok(ops->mem_alloc(0, 256, &p));
  assert_ok(ops->stream_create(0, GCA_STREAM_DEFAULT, 0, &blk));
  /* held legacy stream (named by its handle): per-thread work waits behind it */
  test_gate_init(&g);
  assert_ok(ops->launch_host_func(GCA_STREAM_LEGACY, test_gate_pass, &g));
  assert_status(ops->stream_query(NULL), GCA_ERR_NOT_READY, "");
  assert_ok(ops->kernel_fill_u32(p, 5, 0, 1, GCA_STREAM_PER_THREAD));
  assert_status(ops->stream_query(GCA_STREAM_PER_THREAD), GCA_ERR_NOT_READY, "");
  test_gate_open(&g);
  assert_ok(ops->stream_synchronize(GCA_STREAM_PER_THREAD));
  assert_ok(ops->stream_query(GCA_STREAM_LEGACY));
  test_gate_fini(&g);
  /* held per-thread stream: legacy work waits behind it */
  test_gate_init(&g);
  assert_ok(ops->launch_host_func(GCA_STREAM_PER_THREAD, test_gate_pass, &g));
  assert_ok(ops->kernel_fill_u32(p, 6, 0, 1, NULL));
  assert_status(ops->stream_query(NULL), GCA_ERR_NOT_READY, "");
  test_gate_open(&g);
  assert_ok(ops->stream_synchronize(NULL));
  test_gate_fini(&g);
  /* held blocking stream: per-thread work does not wait for it */
  test_gate_init(&g);
  assert_ok(ops->launch_host_func(blk, test_gate_pass, &g));
  assert_ok(ops->kernel_fill_u32(p, 7, 0, 1, GCA_STREAM_PER_THREAD));
  assert_ok(ops->stream_synchronize(GCA_STREAM_PER_THREAD));
  assert_status(ops->stream_query(blk), GCA_ERR_NOT_READY, "");
  test_gate_open(&g);
  assert_ok(ops->stream_synchronize(blk));
  test_gate_fini(&g);
  assert_status(ops->stream_destroy(GCA_STREAM_PER_THREAD), GCA_ERR_INVALID_HANDLE,
                "stream_destroy");
  assert_status(ops->stream_destroy(GCA_STREAM_LEGACY), GCA_ERR_INVALID_HANDLE, "stream_destroy");
  assert_ok(ops->stream_synchronize(GCA_STREAM_PER_THREAD));
  assert_ok(ops->stream_destroy(blk));
  assert_ok(ops->mem_free(0, p));
}

static void flag_set(void *arg) {
  atomic_store((atomic_int *)arg, 1);
}

/* What a thread on device 1 did with the NULL stream: the first failure, if any. */
typedef struct dev1_work {
  gca_event_t ev1, ev0; /* created on device 1 and device 0 */
  gca_devptr_t buf1;    /* device-1 memory the thread fills */
  uint32_t word1;       /* what it read back */
  atomic_int ran0;
  int seen_dev;
  gca_status_t st;
  char detail[256];
  const char *what;
} dev1_work_t;

#define DEV1_TRY(w, call)                                                 \
  do {                                                                    \
    gca_status_t d_st_ = (call);                                          \
    if (d_st_ != GCA_OK) {                                                \
      (w)->st = d_st_;                                                    \
      (w)->what = #call;                                                  \
      snprintf((w)->detail, sizeof((w)->detail), "%s", gca_last_error()); \
      return NULL;                                                        \
    }                                                                     \
  } while (0)

/* Sets device 1, runs work on its legacy stream to completion, then sets
 * device 0 again and queues more NULL-stream work (behind the main gate).
 * The device-1 work is a kernel, not a host function: host functions of
 * different streams may run one at a time (Note [Host functions]), and device
 * 0's is blocked on the gate meanwhile. */
static void *null_stream_on_device_1(void *arg) {
  dev1_work_t *w = arg;
  DEV1_TRY(w, ops->ctx_set_device(1));
  DEV1_TRY(w, ops->ctx_get_device(&w->seen_dev));
  DEV1_TRY(w, ops->kernel_fill_u32(w->buf1, 41, 0, 1, NULL));
  DEV1_TRY(w, ops->event_record(w->ev1, NULL));
  DEV1_TRY(w, ops->stream_wait_event(NULL, w->ev1));
  DEV1_TRY(w, ops->event_synchronize(w->ev1));
  DEV1_TRY(w, ops->memcpy_async((gca_devptr_t)(uintptr_t)&w->word1, w->buf1, 4, NULL));
  DEV1_TRY(w, ops->stream_synchronize(NULL));
  DEV1_TRY(w, ops->stream_query(NULL));
  DEV1_TRY(w, ops->ctx_set_device(0));
  DEV1_TRY(w, ops->launch_host_func(NULL, flag_set, &w->ran0));
  DEV1_TRY(w, ops->event_record(w->ev0, NULL));
  return NULL;
}

static void null_stream_is_the_calling_threads_current_device(void **state) {
  (void)state;
  int n = 0, dev = -1;
  assert_ok(ops->device_count(&n));
  if (n < 2) {
    printf("SKIP: needs two devices for per-thread legacy streams (found %d)\n", n);
    skip();
  }
  test_gate_t g;
  test_gate_init(&g);
  dev1_work_t w = {.st = GCA_OK, .seen_dev = -1};
  atomic_init(&w.ran0, 0);
  assert_ok(ops->mem_alloc(1, 256, &w.buf1));
  assert_ok(ops->event_create(1, GCA_EVENT_DISABLE_TIMING, &w.ev1));
  assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &w.ev0));
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 0);
  assert_ok(ops->launch_host_func(NULL, test_gate_pass, &g));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, null_stream_on_device_1, &w), 0);
  pthread_join(t, NULL);
  if (w.st != GCA_OK) {
    test_gate_open(&g);
    fail_msg("device-1 thread: %s -> %s: %s", w.what, gca_status_name(w.st), w.detail);
  }
  assert_int_equal(w.seen_dev, 1);
  assert_int_equal(w.word1, 41);
  /* this thread never set a device: still device 0, whose legacy stream is held */
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 0);
  assert_int_equal(atomic_load(&w.ran0), 0);
  assert_status(ops->event_query(w.ev0), GCA_ERR_NOT_READY, "");
  assert_status(ops->stream_query(NULL), GCA_ERR_NOT_READY, "");
  test_gate_open(&g);
  assert_ok(ops->stream_synchronize(NULL));
  assert_int_equal(atomic_load(&w.ran0), 1);
  assert_ok(ops->event_query(w.ev0));
  assert_ok(ops->event_destroy(w.ev0));
  assert_ok(ops->event_destroy(w.ev1));
  assert_ok(ops->mem_free(1, w.buf1));
  test_gate_fini(&g);
}

static void count_up(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
}

/* Device 1's legacy stream work, as a thread that set device 1 (status of the first failure). */
typedef struct dev1_legacy {
  atomic_int ran;
  gca_status_t st;
} dev1_legacy_t;

static void *legacy_work_on_device_1(void *arg) {
  dev1_legacy_t *w = arg;
  w->st = ops->ctx_set_device(1);
  if (w->st == GCA_OK)
    w->st = ops->launch_host_func(NULL, count_up, &w->ran);
  if (w->st == GCA_OK)
    w->st = ops->stream_synchronize(NULL);
  return NULL;
}

static void capture_on_device_0_leaves_device_1_legacy_stream_usable(void **state) {
  (void)state;
  int n = 0;
  assert_ok(ops->device_count(&n));
  if (n < 2) {
    printf("SKIP: needs two devices for per-thread legacy streams (found %d)\n", n);
    skip();
  }
  gca_stream_t s0;
  gca_graph_t g = NULL;
  atomic_int captured_runs;
  atomic_init(&captured_runs, 0);
  dev1_legacy_t w = {.st = GCA_ERR_INTERNAL};
  atomic_init(&w.ran, 0);
  assert_ok(ops->stream_create(0, GCA_STREAM_DEFAULT, 0, &s0));
  assert_ok(ops->stream_begin_capture(s0, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(ops->launch_host_func(s0, count_up, &captured_runs));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, legacy_work_on_device_1, &w), 0);
  pthread_join(t, NULL);
  assert_int_equal(w.st, GCA_OK);
  assert_int_equal(atomic_load(&w.ran), 1);
  assert_ok(ops->stream_end_capture(s0, &g));
  assert_non_null(g);
  assert_int_equal(atomic_load(&captured_runs), 0);
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->stream_destroy(s0));
}

static void *set_device_1_and_read(void *arg) {
  int *seen = arg;
  if (ops->ctx_set_device(1) != GCA_OK || ops->ctx_get_device(seen) != GCA_OK)
    *seen = -2;
  return NULL;
}

/* stream_get_device: a stream's creation device; NULL follows the thread. */
static void *null_stream_device_on_1(void *arg) {
  int *seen = arg;
  if (ops->ctx_set_device(1) != GCA_OK || ops->stream_get_device(NULL, seen) != GCA_OK)
    *seen = -2;
  return NULL;
}

static void stream_device_is_where_it_was_created(void **state) {
  (void)state;
  int n = 0, dev = -1;
  assert_ok(ops->device_count(&n));
  gca_stream_t s[2] = {NULL, NULL};
  for (int d = 0; d < n && d < 2; d++) {
    assert_ok(ops->stream_create(d, GCA_STREAM_NON_BLOCKING, 0, &s[d]));
    assert_ok(ops->stream_get_device(s[d], &dev));
    assert_int_equal(dev, d);
  }
  assert_ok(ops->stream_get_device(NULL, &dev));
  assert_int_equal(dev, 0);
  if (n >= 2) {
    int seen = -1;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, null_stream_device_on_1, &seen), 0);
    pthread_join(t, NULL);
    assert_int_equal(seen, 1);
    assert_ok(ops->stream_get_device(NULL, &dev)); /* this thread is still on device 0 */
    assert_int_equal(dev, 0);
  }
  assert_status(ops->stream_get_device(s[0], NULL), GCA_ERR_INVALID_ARGUMENT, "stream_get_device");
  for (int d = 0; d < 2; d++)
    if (s[d] != NULL)
      assert_ok(ops->stream_destroy(s[d]));
  if (is_sim) /* the driver dereferences a destroyed stream: SIGSEGV in cuStreamGetCtx (H200, 580)
               */
    assert_status(ops->stream_get_device(s[0], &dev), GCA_ERR_INVALID_HANDLE, "stream_get_device");
}

static void current_device_is_per_thread_and_validated(void **state) {
  (void)state;
  int n = 0, dev = -1;
  assert_ok(ops->device_count(&n));
  assert_status(ops->ctx_set_device(99), GCA_ERR_INVALID_ARGUMENT, "ctx_set_device");
  assert_status(ops->ctx_set_device(-1), GCA_ERR_INVALID_ARGUMENT, "ctx_set_device");
  assert_status(ops->ctx_get_device(NULL), GCA_ERR_INVALID_ARGUMENT, "ctx_get_device");
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 0);
  assert_ok(ops->ctx_set_device(n - 1));
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, n - 1);
  assert_status(ops->ctx_set_device(n), GCA_ERR_INVALID_ARGUMENT, "ctx_set_device");
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, n - 1);
  assert_ok(ops->ctx_set_device(0));
  if (n < 2)
    return;
  int seen = -1;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, set_device_1_and_read, &seen), 0);
  pthread_join(t, NULL);
  assert_int_equal(seen, 1);
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 0);
}

static void injected_faults_fail_one_call_and_leave_streams_usable(void **state) {
  (void)state;
  if (!is_sim)
    skip();
  gca_devptr_t p = dalloc(N * 4);
  gca_stream_t s;
  gca_event_t e;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  assert_ok(ops->event_create(0, 0, &e));
  assert_ok(gca_sim_fault_set("kernel_fill_u32:nth=1,event_record:nth=1,stream_create:nth=1"));
  gca_stream_t s2;
  assert_status(ops->stream_create(0, 0, 0, &s2), GCA_ERR_DRIVER, "stream_create: injected");
  assert_status(ops->kernel_fill_u32(p, 1, 1, N, s), GCA_ERR_DRIVER, "kernel_fill_u32");
  assert_status(ops->event_record(e, s), GCA_ERR_DRIVER, "event_record");
  gca_sim_fault_clear();
  assert_ok(ops->event_query(e));
  assert_ok(ops->kernel_fill_u32(p, 4, 4, N, s));
  assert_ok(ops->event_record(e, s));
  assert_ok(ops->event_synchronize(e));
  expect_fill(p, 4, 4);
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, p));
}

/* ---- copy batches ---- */

/* A table of entries in device memory, read when the kernel runs: entries of
 * several alignments (16-byte words and bytes), a zero-length one; a second
 * launch after the sources changed copies the new bytes (the table stays). */
static void a_copy_batch_copies_every_entry_when_it_runs(void **state) {
  (void)state;
  enum { BYTES = 1 << 16 };
  gca_devptr_t src = dalloc(BYTES), dst = dalloc(BYTES), table = dalloc(4096);
  gca_stream_t s;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  gca_copy_entry_t e[4] = {{dst, src, 4096},                          /* aligned: 16-byte words */
                           {dst + 8192 + 3, src + 20000 + 1, 1001},   /* unaligned: bytes */
                           {dst + 16384, src + 16384, 0},             /* nothing */
                           {dst + 32768, src + 40000, 16 * 100 + 8}}; /* aligned ends, odd length */
  unsigned char *host = malloc(BYTES), *back = malloc(BYTES);
  assert_non_null(host);
  assert_non_null(back);
  for (int round = 0; round < 2; round++) {
    for (size_t i = 0; i < BYTES; i++)
      host[i] = (unsigned char)(i * 7 + 1 + round * 13);
    assert_ok(ops->memcpy_async(src, (gca_devptr_t)(uintptr_t)host, BYTES, s));
    assert_ok(ops->memset_d8_async(dst, 0xee, BYTES, s));
    if (round == 0)
      assert_ok(ops->memcpy_async(table, (gca_devptr_t)(uintptr_t)e, sizeof(e), s));
    assert_ok(ops->kernel_copy_batch(table, 4, s));
    assert_ok(ops->stream_synchronize(s));
    assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)back, dst, BYTES, s));
    assert_ok(ops->stream_synchronize(s));
    for (size_t i = 0; i < BYTES; i++) {
      unsigned char want = 0xee;
      for (int k = 0; k < 4; k++) {
        size_t d0 = (size_t)(e[k].dst - dst);
        if (i >= d0 && i < d0 + e[k].bytes)
          want = host[(size_t)(e[k].src - src) + (i - d0)];
      }
      if (back[i] != want)
        fail_msg("round %d: byte %zu is %#x, wanted %#x", round, i, back[i], want);
    }
  }
  assert_ok(ops->kernel_copy_batch(0, 0, s)); /* an empty batch */
  assert_status(ops->kernel_copy_batch(table + 4, 1, s), GCA_ERR_INVALID_ARGUMENT,
                "8-byte aligned");
  assert_ok(ops->stream_synchronize(s));
  assert_ok(ops->stream_destroy(s));
  free(host);
  free(back);
  assert_ok(ops->mem_free(0, src));
  assert_ok(ops->mem_free(0, dst));
  assert_ok(ops->mem_free(0, table));
}

/* cuMemcpyAsync's "API synchronization behavior": a pageable source is read at
 * the call (staged), so overwriting it right after the call does not change
 * what lands; a pinned source (host_alloc, host_register) is read when the
 * stream reaches the copy, so a write made while the stream is held back by a
 * gate is what lands. A copy into pageable memory returns once it landed;
 * into pinned memory it returns at once and lands when the stream runs. */
static void pinned_copies_are_asynchronous_pageable_ones_are_staged(void **state) {
  (void)state;
  gca_devptr_t d = dalloc(N * 4);
  gca_stream_t s;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  uint32_t *pageable = malloc(N * 4), *pinned = NULL, reg[N];
  assert_non_null(pageable);
  assert_ok(ops->host_alloc(N * 4, (void **)&pinned));
  assert_ok(ops->host_register(reg, sizeof(reg)));
  for (uint32_t i = 0; i < N; i++)
    pageable[i] = pinned[i] = reg[i] = 1;

  test_gate_t g;
  test_gate_init(&g);
  assert_ok(ops->launch_host_func(s, test_gate_pass, &g));
  assert_ok(ops->memcpy_async(d, (gca_devptr_t)(uintptr_t)pageable, N * 4, s));
  for (uint32_t i = 0; i < N; i++)
    pageable[i] = 2; /* after the call: not what lands */
  test_gate_open(&g);
  assert_ok(ops->stream_synchronize(s));
  expect_fill(d, 1, 0);

  uint32_t *srcs[2] = {pinned, reg};
  for (int k = 0; k < 2; k++) {
    test_gate_init(&g);
    assert_ok(ops->launch_host_func(s, test_gate_pass, &g));
    assert_ok(ops->memcpy_async(d, (gca_devptr_t)(uintptr_t)srcs[k], N * 4, s));
    for (uint32_t i = 0; i < N; i++)
      srcs[k][i] = 3 + (uint32_t)k; /* before the stream runs the copy: what lands */
    test_gate_open(&g);
    assert_ok(ops->stream_synchronize(s));
    expect_fill(d, 3 + (uint32_t)k, 0);
  }

  /* device to pinned: returns before the copy ran (the gate still holds it) */
  test_gate_init(&g);
  assert_ok(ops->launch_host_func(s, test_gate_pass, &g));
  assert_ok(ops->memset_d32_async(d, 7, N, s));
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)pinned, d, N * 4, s));
  assert_int_equal(pinned[0], 3);
  test_gate_open(&g);
  assert_ok(ops->stream_synchronize(s));
  assert_int_equal(pinned[N - 1], 7);
  /* device to pageable: returns once landed */
  assert_ok(ops->memset_d32_async(d, 9, N, s));
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)pageable, d, N * 4, s));
  assert_int_equal(pageable[N - 1], 9);
  assert_ok(ops->stream_synchronize(s));

  assert_status(ops->host_register(reg, sizeof(reg)), GCA_ERR_INVALID_STATE, "host_register:");
  assert_status(ops->host_unregister(pageable), GCA_ERR_INVALID_ARGUMENT, "host_unregister:");
  assert_status(ops->host_free(pageable), GCA_ERR_INVALID_ARGUMENT, "host_free:");
  assert_ok(ops->host_unregister(reg));
  assert_ok(ops->host_free(pinned));
  free(pageable);
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, d));
}

int main(void) {
  test_filter_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(stream_order_holds_under_heavy_async_load),
      cmocka_unit_test(host_to_host_async_copy_is_complete_at_return),
      cmocka_unit_test(per_thread_stream_is_each_threads_own),
      cmocka_unit_test(per_thread_stream_orders_with_legacy_only),
      cmocka_unit_test(event_after_slow_work_completes_only_with_it),
      cmocka_unit_test(never_recorded_event_is_complete),
      cmocka_unit_test(stream_wait_event_orders_cross_stream_work),
      cmocka_unit_test(legacy_stream_orders_with_blocking_streams_only),
      cmocka_unit_test(elapsed_time_needs_two_completed_timed_events),
      cmocka_unit_test(host_funcs_run_in_stream_order),
      cmocka_unit_test(destroyed_stream_still_completes_pending_work),
      cmocka_unit_test(ctx_synchronize_waits_for_every_stream),
      cmocka_unit_test(bad_arguments_and_handles_are_refused),
      cmocka_unit_test(null_stream_is_the_calling_threads_current_device),
      cmocka_unit_test(current_device_is_per_thread_and_validated),
      cmocka_unit_test(stream_device_is_where_it_was_created),
      cmocka_unit_test(capture_on_device_0_leaves_device_1_legacy_stream_usable),
      cmocka_unit_test(injected_faults_fail_one_call_and_leave_streams_usable),
      cmocka_unit_test(a_copy_batch_copies_every_entry_when_it_runs),
      cmocka_unit_test(pinned_copies_are_asynchronous_pageable_ones_are_staged),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
