/* SPDX-License-Identifier: Apache-2.0 */
/* test_contract_capture.c - the stream-capture and graph contract of the
 * device table, written once against the ops and run on sim and on cuda:
 * capture records instead of running, replays run the recording, fork/join
 * across streams through events, the driver's illegal operations per capture
 * mode (and the invalidation they cause), and the ways end_capture fails.
 *
 * Each illegal-operation test ends the same way: the capture reports
 * INVALIDATED, its end returns no graph, and the stream works normally again.
 */
#include <pthread.h>

#include "gca.h"
#include "support.h"

#define N 128

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

static gca_stream_t mkstream(unsigned flags) {
  gca_stream_t s;
  assert_ok(ops->stream_create(0, flags, 0, &s));
  return s;
}

static gca_event_t mkevent(void) {
  gca_event_t e;
  assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &e));
  return e;
}

static void dread(uint32_t *host, gca_devptr_t src, size_t n) {
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
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

static void zero(gca_devptr_t p) {
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  assert_ok(ops->memset_d32_async(p, 0, N, s));
  assert_ok(ops->stream_synchronize(s));
  assert_ok(ops->stream_destroy(s));
}

static gca_capture_status_t capture_status(gca_stream_t s) {
  gca_capture_status_t st = GCA_CAPTURE_STATUS_NONE;
  assert_ok(ops->stream_capture_info(s, &st, NULL));
  return st;
}

/* The capture on s is invalidated: further work is refused, the end gives no
 * graph, and afterwards the stream runs work normally. */
static void expect_invalidated_then_usable(gca_stream_t s, gca_devptr_t p) {
  gca_graph_t g = (gca_graph_t)(uintptr_t)1;
  assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_INVALIDATED);
  assert_status(ops->kernel_fill_u32(p, 1, 1, N, s), GCA_ERR_CAPTURE_INVALIDATED, "");
  assert_status(ops->stream_end_capture(s, &g), GCA_ERR_CAPTURE_INVALIDATED, "");
  assert_null(g);
  assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_NONE);
  assert_ok(ops->kernel_fill_u32(p, 11, 1, N, s));
  assert_ok(ops->stream_synchronize(s));
  expect_fill(p, 11, 1);
}

static void capture_records_work_and_replay_runs_it(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4), b = dalloc(N * 4), out = dalloc(N * 4);
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_graph_t g;
  gca_graph_exec_t x;
  size_t count = 0;
  zero(a);
  zero(b);
  zero(out);
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_ACTIVE);
  assert_ok(ops->kernel_fill_u32(a, 1, 1, N, s));
  assert_ok(ops->kernel_add_u32(out, a, b, N, s));
  assert_ok(ops->stream_end_capture(s, &g));
  assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_NONE);
  assert_ok(ops->graph_node_count(g, &count));
  assert_int_equal(count, 2);
  expect_fill(a, 0, 0); /* recorded, not run */
  expect_fill(out, 0, 0);
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->graph_upload(x, s));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  expect_fill(out, 1, 1);
  /* inputs changed between launches are read by the next launch */
  assert_ok(ops->kernel_fill_u32(b, 100, 2, N, s));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  expect_fill(out, 101, 3);
  /* the exec outlives its graph */
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->kernel_fill_u32(b, 0, 0, N, s));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  expect_fill(out, 1, 1);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(0, b));
  assert_ok(ops->mem_free(0, out));
}

static void bump(void *arg) {
  __atomic_fetch_add((int *)arg, 1, __ATOMIC_SEQ_CST);
}

static void captured_host_func_memset_and_memcpy_run_per_launch(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4), b = dalloc(N * 4);
  gca_stream_t s = mkstream(GCA_STREAM_DEFAULT);
  gca_graph_t g;
  gca_graph_exec_t x;
  int calls = 0;
  zero(a);
  zero(b);
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  assert_ok(ops->memset_d32_async(a, 9, N, s));
  assert_ok(ops->memcpy_async(b, a, N * 4, s));
  assert_ok(ops->launch_host_func(s, bump, &calls));
  assert_ok(ops->memset_d8_async(a, 0, N * 4, s));
  assert_ok(ops->stream_end_capture(s, &g));
  assert_int_equal(__atomic_load_n(&calls, __ATOMIC_SEQ_CST), 0);
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  assert_int_equal(__atomic_load_n(&calls, __ATOMIC_SEQ_CST), 2);
  expect_fill(b, 9, 0);
  expect_fill(a, 0, 0);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(0, b));
}

static void fork_and_join_through_events_capture_both_streams(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4), b = dalloc(N * 4), out = dalloc(N * 4);
  gca_stream_t s1 = mkstream(GCA_STREAM_NON_BLOCKING), s2 = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_event_t fork = mkevent(), join = mkevent();
  gca_graph_t g;
  gca_graph_exec_t x;
  size_t count;
  uint64_t id1 = 0, id2 = 0;
  gca_capture_status_t cs;
  zero(out);
  assert_ok(ops->stream_begin_capture(s1, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->event_record(fork, s1));
  assert_ok(ops->stream_wait_event(s2, fork));
  assert_ok(ops->stream_capture_info(s1, &cs, &id1));
  assert_ok(ops->stream_capture_info(s2, &cs, &id2));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(id1, id2);
  assert_ok(ops->kernel_fill_u32(a, 1, 1, N, s1));
  assert_ok(ops->kernel_fill_u32(b, 10, 0, N, s2));
  assert_ok(ops->event_record(join, s2));
  assert_ok(ops->stream_wait_event(s1, join));
  assert_ok(ops->kernel_add_u32(out, a, b, N, s1));
  assert_ok(ops->stream_end_capture(s1, &g));
  assert_int_equal(capture_status(s2), GCA_CAPTURE_STATUS_NONE);
  assert_ok(ops->graph_node_count(g, &count));
  assert_int_equal(count, 3);
  expect_fill(out, 0, 0);
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->graph_launch(x, s2));
  assert_ok(ops->stream_synchronize(s2));
  expect_fill(out, 11, 1);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->event_destroy(fork));
  assert_ok(ops->event_destroy(join));
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->stream_destroy(s2));
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(0, b));
  assert_ok(ops->mem_free(0, out));
}

static void concurrent_captures_have_distinct_ids(void **state) {
  (void)state;
  gca_stream_t s1 = mkstream(GCA_STREAM_NON_BLOCKING), s2 = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_capture_status_t cs;
  uint64_t id1 = 0, id2 = 0;
  gca_graph_t g1, g2;
  assert_ok(ops->stream_begin_capture(s1, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(ops->stream_begin_capture(s2, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(ops->stream_capture_info(s1, &cs, &id1));
  assert_ok(ops->stream_capture_info(s2, &cs, &id2));
  assert_int_not_equal(id1, id2);
  assert_ok(ops->stream_end_capture(s2, &g2));
  assert_ok(ops->stream_end_capture(s1, &g1));
  assert_ok(ops->graph_destroy(g1));
  assert_ok(ops->graph_destroy(g2));
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->stream_destroy(s2));
}

static void unjoined_fork_fails_the_end(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4);
  gca_stream_t s1 = mkstream(GCA_STREAM_NON_BLOCKING), s2 = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_event_t fork = mkevent();
  gca_graph_t g = (gca_graph_t)(uintptr_t)1;
  zero(a);
  assert_ok(ops->stream_begin_capture(s1, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->event_record(fork, s1));
  assert_ok(ops->stream_wait_event(s2, fork));
  assert_ok(ops->kernel_fill_u32(a, 5, 5, N, s2));
  assert_status(ops->stream_end_capture(s1, &g), GCA_ERR_CAPTURE_UNJOINED, "");
  assert_null(g);
  assert_int_equal(capture_status(s1), GCA_CAPTURE_STATUS_NONE);
  assert_int_equal(capture_status(s2), GCA_CAPTURE_STATUS_NONE);
  expect_fill(a, 0, 0);
  assert_ok(ops->event_destroy(fork));
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->stream_destroy(s2));
  assert_ok(ops->mem_free(0, a));
}

static void end_without_capture_is_unmatched(void **state) {
  (void)state;
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_graph_t g;
  assert_status(ops->stream_end_capture(s, &g), GCA_ERR_CAPTURE_UNMATCHED, "");
  assert_status(ops->stream_begin_capture(NULL, GCA_CAPTURE_MODE_GLOBAL),
                GCA_ERR_CAPTURE_UNSUPPORTED, "");
  assert_ok(ops->stream_destroy(s));
}

typedef struct end_arg {
  gca_stream_t s;
  gca_status_t st;
  gca_graph_t g;
} end_arg_t;

static void *end_elsewhere(void *p) {
  end_arg_t *arg = p;
  arg->st = ops->stream_end_capture(arg->s, &arg->g);
  return NULL;
}

static void end_from_another_thread_needs_relaxed_mode(void **state) {
  (void)state;
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_graph_t g = NULL;
  pthread_t t;
  end_arg_t arg = {.s = s};
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  pthread_create(&t, NULL, end_elsewhere, &arg);
  pthread_join(t, NULL);
  assert_int_equal(arg.st, GCA_ERR_CAPTURE_WRONG_THREAD);
  gca_status_t st = ops->stream_end_capture(s, &g);
  if (is_sim)
    assert_int_equal(st, GCA_ERR_CAPTURE_INVALIDATED);
  if (g)
    assert_ok(ops->graph_destroy(g));
  assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_NONE);
  /* relaxed: any thread may end it */
  arg = (end_arg_t){.s = s};
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  pthread_create(&t, NULL, end_elsewhere, &arg);
  pthread_join(t, NULL);
  assert_int_equal(arg.st, GCA_OK);
  assert_non_null(arg.g);
  assert_ok(ops->graph_destroy(arg.g));
  assert_ok(ops->stream_destroy(s));
}

static void synchronizing_a_capturing_stream_invalidates_the_capture(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4);
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(ops->kernel_fill_u32(a, 1, 1, N, s));
  assert_status(ops->stream_synchronize(s), GCA_ERR_CAPTURE_UNSUPPORTED, "");
  expect_invalidated_then_usable(s, a);
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  assert_status(ops->stream_query(s), GCA_ERR_CAPTURE_UNSUPPORTED, "");
  expect_invalidated_then_usable(s, a);
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, a));
}

static void captured_event_cannot_be_queried_or_synchronized(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4);
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_event_t e = mkevent();
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(ops->event_record(e, s));
  assert_status(ops->event_query(e), GCA_ERR_DRIVER, is_sim ? "CAPTURED_EVENT" : "");
  expect_invalidated_then_usable(s, a);
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(ops->event_record(e, s));
  assert_status(ops->event_synchronize(e), GCA_ERR_DRIVER, is_sim ? "CAPTURED_EVENT" : "");
  expect_invalidated_then_usable(s, a);
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, a));
}

static void legacy_stream_use_during_blocking_capture_is_implicit(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4), b = dalloc(N * 4);
  gca_stream_t blk = mkstream(GCA_STREAM_DEFAULT), nb = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_graph_t g;
  assert_ok(ops->stream_begin_capture(blk, GCA_CAPTURE_MODE_RELAXED));
  assert_status(ops->kernel_fill_u32(b, 1, 1, N, NULL), GCA_ERR_CAPTURE_IMPLICIT, "");
  expect_invalidated_then_usable(blk, a);
  /* a non-blocking capture does not involve the legacy stream */
  zero(b);
  assert_ok(ops->stream_begin_capture(nb, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(ops->kernel_fill_u32(a, 2, 0, N, nb));
  assert_ok(ops->kernel_fill_u32(b, 3, 0, N, NULL));
  assert_ok(ops->stream_synchronize(NULL));
  assert_ok(ops->stream_end_capture(nb, &g));
  expect_fill(b, 3, 0);
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->stream_destroy(blk));
  assert_ok(ops->stream_destroy(nb));
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(0, b));
}

static void waiting_on_an_uncaptured_event_invalidates_the_capture(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4);
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING), o = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_event_t e = mkevent();
  assert_ok(ops->event_record(e, o));
  assert_ok(ops->stream_synchronize(o));
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  assert_status(ops->stream_wait_event(s, e), GCA_ERR_DRIVER, is_sim ? "ISOLATION" : "");
  expect_invalidated_then_usable(s, a);
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->stream_destroy(o));
  assert_ok(ops->mem_free(0, a));
}

/* mem_alloc on this thread while s captures in `mode`: refused (and the
 * capture invalidated) unless the mode is relaxed. */
static void check_alloc_in_mode(gca_capture_mode_t mode, bool refused) {
  gca_devptr_t a = dalloc(N * 4), p = 0;
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_graph_t g;
  assert_ok(ops->stream_begin_capture(s, mode));
  assert_ok(ops->kernel_fill_u32(a, 1, 1, N, s));
  if (refused) {
    assert_status(ops->mem_alloc(0, 4096, &p), GCA_ERR_CAPTURE_UNSUPPORTED, "");
    expect_invalidated_then_usable(s, a);
  } else {
    assert_ok(ops->mem_alloc(0, 4096, &p));
    assert_ok(ops->mem_free(0, p));
    assert_ok(ops->stream_end_capture(s, &g));
    assert_ok(ops->graph_destroy(g));
  }
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, a));
}

static void mem_alloc_is_refused_in_global_and_thread_local_capture_only(void **state) {
  (void)state;
  check_alloc_in_mode(GCA_CAPTURE_MODE_GLOBAL, true);
  check_alloc_in_mode(GCA_CAPTURE_MODE_THREAD_LOCAL, true);
  check_alloc_in_mode(GCA_CAPTURE_MODE_RELAXED, false);
}

typedef struct alloc_arg {
  gca_capture_mode_t thread_mode;
  gca_status_t st;
} alloc_arg_t;

static void *alloc_elsewhere(void *p) {
  alloc_arg_t *arg = p;
  gca_capture_mode_t m = arg->thread_mode;
  gca_devptr_t d = 0;
  assert_ok(ops->thread_exchange_capture_mode(&m));
  assert_int_equal(m, GCA_CAPTURE_MODE_GLOBAL); /* a new thread starts in global mode */
  arg->st = ops->mem_alloc(0, 4096, &d);
  if (arg->st == GCA_OK)
    assert_ok(ops->mem_free(0, d));
  m = GCA_CAPTURE_MODE_GLOBAL;
  assert_ok(ops->thread_exchange_capture_mode(&m));
  return NULL;
}

/* Another thread, in `thread_mode`, allocates while this one captures in `mode`. */
static void check_other_thread_alloc(gca_capture_mode_t mode, gca_capture_mode_t thread_mode,
                                     bool refused) {
  gca_devptr_t a = dalloc(N * 4);
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_graph_t g;
  pthread_t t;
  alloc_arg_t arg = {.thread_mode = thread_mode};
  assert_ok(ops->stream_begin_capture(s, mode));
  pthread_create(&t, NULL, alloc_elsewhere, &arg);
  pthread_join(t, NULL);
  if (refused) {
    assert_int_equal(arg.st, GCA_ERR_CAPTURE_UNSUPPORTED);
    expect_invalidated_then_usable(s, a);
  } else {
    assert_int_equal(arg.st, GCA_OK);
    assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_ACTIVE);
    assert_ok(ops->stream_end_capture(s, &g));
    assert_ok(ops->graph_destroy(g));
  }
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, a));
}

static void other_threads_are_refused_only_by_a_global_capture(void **state) {
  (void)state;
  check_other_thread_alloc(GCA_CAPTURE_MODE_GLOBAL, GCA_CAPTURE_MODE_GLOBAL, true);
  check_other_thread_alloc(GCA_CAPTURE_MODE_GLOBAL, GCA_CAPTURE_MODE_THREAD_LOCAL, false);
  check_other_thread_alloc(GCA_CAPTURE_MODE_GLOBAL, GCA_CAPTURE_MODE_RELAXED, false);
  check_other_thread_alloc(GCA_CAPTURE_MODE_THREAD_LOCAL, GCA_CAPTURE_MODE_GLOBAL, false);
  check_other_thread_alloc(GCA_CAPTURE_MODE_RELAXED, GCA_CAPTURE_MODE_GLOBAL, false);
}

/* What another thread (in the default global mode) may do while this one
 * captures on s in `mode`, as an H200 (driver 580) answers: in a global-mode
 * capture every synchronizing or querying call (streams and events that have
 * nothing to do with the capture included) is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 * and invalidates the capture, and so is cuMemFree (it synchronizes); in any
 * mode so is cuCtxSynchronize; work queued on another stream is always fine,
 * and so is every virtual memory call: reserve, create, map, set access,
 * unmap, release and address free (the calls that expandable segments grow
 * and shrink with). */
enum {
  OT_STREAM_SYNC,
  OT_STREAM_QUERY,
  OT_EVENT_QUERY,
  OT_EVENT_SYNC,
  OT_MEM_FREE,
  OT_CTX_SYNC,
  OT_EVENT_RECORD,
  OT_WAIT_EVENT,
  OT_MEMSET,
  OT_VMM,
  OT_COUNT
};
static const char *const ot_names[OT_COUNT] = {
    "stream_synchronize", "stream_query",
    "event_query",        "event_synchronize",
    "mem_free",           "ctx_synchronize",
    "event_record",       "stream_wait_event",
    "memset_d32_async",   "mem_address_reserve..mem_address_free"};

typedef struct other_call {
  int op;
  gca_stream_t b;
  gca_event_t e;
  gca_devptr_t p, own; /* own: an allocation of its own, for mem_free */
  bool relaxed;        /* the other thread sets its own capture mode to relaxed first */
  gca_status_t st;
} other_call_t;

/* Reserve, create, map, set access, unmap, release, free the address range:
 * the first call that fails, else GCA_OK. */
static gca_status_t vmm_round_trip(void) {
  size_t g = 0;
  gca_devptr_t va = 0;
  gca_memhandle_t h;
  int dev = 0;
  gca_status_t st = ops->mem_granularity(0, false, &g);
  if (st == GCA_OK)
    st = ops->mem_address_reserve(0, 2 * g, 0, &va);
  if (st != GCA_OK)
    return st;
  st = ops->mem_create(0, g, &h);
  if (st == GCA_OK) {
    st = ops->mem_map(va, g, 0, h);
    if (st == GCA_OK) {
      st = ops->mem_set_access(va, g, &dev, 1);
      gca_status_t ust = ops->mem_unmap(va, g);
      if (st == GCA_OK)
        st = ust;
    }
    gca_status_t rst = ops->mem_release(h);
    if (st == GCA_OK)
      st = rst;
  }
  gca_status_t fst = ops->mem_address_free(0, va, 2 * g);
  return st != GCA_OK ? st : fst;
}

static void *call_elsewhere(void *v) {
  other_call_t *c = v;
  gca_capture_mode_t mode = GCA_CAPTURE_MODE_RELAXED;
  if (c->relaxed && (c->st = ops->thread_exchange_capture_mode(&mode)) != GCA_OK)
    return NULL;
  switch (c->op) {
  case OT_STREAM_SYNC:
    c->st = ops->stream_synchronize(c->b);
    break;
  case OT_STREAM_QUERY:
    c->st = ops->stream_query(c->b);
    break;
  case OT_EVENT_QUERY:
    c->st = ops->event_query(c->e);
    break;
  case OT_EVENT_SYNC:
    c->st = ops->event_synchronize(c->e);
    break;
  case OT_MEM_FREE:
    c->st = ops->mem_free(0, c->own);
    break;
  case OT_CTX_SYNC:
    c->st = ops->ctx_synchronize(0);
    break;
  case OT_VMM:
    c->st = vmm_round_trip();
    break;
  case OT_EVENT_RECORD:
    c->st = ops->event_record(c->e, c->b);
    break;
  case OT_WAIT_EVENT:
    c->st = ops->stream_wait_event(c->b, c->e);
    break;
  default:
    c->st = ops->memset_d32_async(c->p, 3, N, c->b);
    break;
  }
  if (c->relaxed)
    GCA_CHECK_IGNORE(ops->thread_exchange_capture_mode(&mode));
  return NULL;
}

/* A thread that sets its own mode to relaxed (cuThreadExchangeStreamCaptureMode)
 * may make every one of those calls during another thread's global-mode
 * capture but cuCtxSynchronize (measured on an H200, driver 580). */
static void other_threads_calls_in_relaxed_mode(bool relaxed);

static void other_threads_calls_follow_the_captures_mode(void **state) {
  (void)state;
  other_threads_calls_in_relaxed_mode(false);
  other_threads_calls_in_relaxed_mode(true);
}

static void other_threads_calls_in_relaxed_mode(bool relaxed) {
  const gca_capture_mode_t modes[] = {GCA_CAPTURE_MODE_GLOBAL, GCA_CAPTURE_MODE_THREAD_LOCAL,
                                      GCA_CAPTURE_MODE_RELAXED};
  gca_devptr_t a = dalloc(N * 4), p = dalloc(N * 4);
  gca_stream_t b = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_event_t e = mkevent();
  for (size_t m = 0; m < 3; m++) {
    for (int op = 0; op < OT_COUNT; op++) {
      gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
      gca_graph_t g = NULL;
      gca_devptr_t own = dalloc(4096);
      assert_ok(ops->event_record(e, b));
      assert_ok(ops->stream_synchronize(b));
      assert_ok(ops->stream_begin_capture(s, modes[m]));
      assert_ok(ops->kernel_fill_u32(a, 1, 1, N, s));
      other_call_t c = {.op = op, .b = b, .e = e, .p = p, .own = own, .relaxed = relaxed};
      pthread_t t;
      assert_int_equal(pthread_create(&t, NULL, call_elsewhere, &c), 0);
      pthread_join(t, NULL);
      bool refused = op == OT_CTX_SYNC ||
                     (modes[m] == GCA_CAPTURE_MODE_GLOBAL && op < OT_CTX_SYNC && !relaxed);
      if (refused != (c.st == GCA_ERR_CAPTURE_UNSUPPORTED) || (!refused && c.st != GCA_OK))
        fail_msg("mode %d, %s from another thread%s: %s, wanted %s", (int)modes[m], ot_names[op],
                 relaxed ? " in relaxed mode" : "", gca_status_name(c.st),
                 refused ? "GCA_ERR_CAPTURE_UNSUPPORTED" : "GCA_OK");
      if (refused) {
        expect_invalidated_then_usable(s, a);
      } else {
        assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_ACTIVE);
        assert_ok(ops->stream_end_capture(s, &g));
        assert_ok(ops->graph_destroy(g));
      }
      assert_ok(ops->stream_synchronize(b));
      assert_ok(ops->stream_destroy(s));
      if (op != OT_MEM_FREE || refused)
        assert_ok(ops->mem_free(0, c.own));
    }
  }
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(b));
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(0, p));
}

static void relaxed_thread_mode_permits_unsafe_calls_during_own_capture(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4), p = 0;
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_event_t e = mkevent();
  gca_graph_t g;
  gca_capture_mode_t m = GCA_CAPTURE_MODE_RELAXED;
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->thread_exchange_capture_mode(&m));
  assert_int_equal(m, GCA_CAPTURE_MODE_GLOBAL);
  assert_ok(ops->mem_alloc(0, 4096, &p));
  assert_ok(ops->mem_free(0, p));
  assert_ok(ops->event_query(e)); /* an event outside the capture */
  /* a call that conflicts with capture itself stays refused */
  assert_ok(ops->event_record(e, s));
  assert_status(ops->event_query(e), GCA_ERR_DRIVER, "");
  m = GCA_CAPTURE_MODE_GLOBAL;
  assert_ok(ops->thread_exchange_capture_mode(&m));
  assert_int_equal(m, GCA_CAPTURE_MODE_RELAXED);
  assert_status(ops->stream_end_capture(s, &g), GCA_ERR_CAPTURE_INVALIDATED, "");
  /* back in global mode, the same unsafe call is refused */
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_status(ops->mem_alloc(0, 4096, &p), GCA_ERR_CAPTURE_UNSUPPORTED, "");
  expect_invalidated_then_usable(s, a);
  assert_status(ops->thread_exchange_capture_mode(NULL), GCA_ERR_INVALID_ARGUMENT, "");
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, a));
}

static void ctx_synchronize_during_capture_is_refused(void **state) {
  (void)state;
  gca_devptr_t a = dalloc(N * 4);
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  assert_status(ops->ctx_synchronize(0), GCA_ERR_CAPTURE_UNSUPPORTED, "");
  expect_invalidated_then_usable(s, a);
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, a));
}

static void launches_of_one_exec_are_ordered_across_streams(void **state) {
  (void)state;
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING), s1 = mkstream(GCA_STREAM_NON_BLOCKING),
               s2 = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_event_t e = mkevent();
  gca_graph_t g;
  gca_graph_exec_t x;
  int calls = 0;
  test_gate_t gate = TEST_GATE_INIT;
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->launch_host_func(s, bump, &calls));
  assert_ok(ops->stream_end_capture(s, &g));
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->launch_host_func(s1, test_gate_pass, &gate));
  assert_ok(ops->graph_launch(x, s1));
  assert_ok(ops->graph_launch(x, s2));
  assert_ok(ops->event_record(e, s2));
  assert_status(ops->event_query(e), GCA_ERR_NOT_READY, "");
  assert_int_equal(__atomic_load_n(&calls, __ATOMIC_SEQ_CST), 0);
  test_gate_open(&gate);
  assert_ok(ops->event_synchronize(e));
  assert_int_equal(__atomic_load_n(&calls, __ATOMIC_SEQ_CST), 2);
  assert_ok(ops->stream_synchronize(s1));
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->stream_destroy(s2));
}

static void graph_handles_are_validated(void **state) {
  (void)state;
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_graph_t g;
  gca_graph_exec_t x;
  size_t count;
  assert_status(ops->stream_end_capture(s, NULL), GCA_ERR_INVALID_ARGUMENT, "");
  assert_status(ops->stream_capture_info(s, NULL, NULL), GCA_ERR_INVALID_ARGUMENT, "");
  if (!is_sim) {
    assert_ok(ops->stream_destroy(s));
    return;
  }
  assert_status(ops->stream_begin_capture(s, (gca_capture_mode_t)7), GCA_ERR_INVALID_ARGUMENT,
                "mode");
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_status(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL), GCA_ERR_DRIVER,
                "ILLEGAL_STATE");
  assert_ok(ops->stream_end_capture(s, &g));
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->graph_exec_destroy(x));
  assert_status(ops->graph_node_count(g, &count), GCA_ERR_INVALID_HANDLE, "graph_node_count");
  assert_status(ops->graph_instantiate(g, &x), GCA_ERR_INVALID_HANDLE, "graph_instantiate");
  assert_status(ops->graph_destroy(g), GCA_ERR_INVALID_HANDLE, "graph_destroy");
  assert_status(ops->graph_launch(x, s), GCA_ERR_INVALID_HANDLE, "graph_launch");
  assert_status(ops->graph_upload(x, s), GCA_ERR_INVALID_HANDLE, "graph_upload");
  assert_status(ops->graph_exec_destroy(x), GCA_ERR_INVALID_HANDLE, "graph_exec_destroy");
  assert_status(ops->graph_launch((gca_graph_exec_t)(void *)s, s), GCA_ERR_INVALID_HANDLE, "");
  assert_ok(ops->stream_destroy(s));
}

static void injected_capture_faults_leave_no_capture_behind(void **state) {
  (void)state;
  if (!is_sim)
    skip();
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_graph_t g;
  gca_graph_exec_t x;
  assert_ok(gca_sim_fault_set("stream_begin_capture:nth=1"));
  assert_status(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL), GCA_ERR_DRIVER,
                "stream_begin_capture: injected");
  gca_sim_fault_clear();
  assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_NONE);
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_sim_fault_set("stream_end_capture:nth=1,graph_instantiate:nth=1"));
  assert_status(ops->stream_end_capture(s, &g), GCA_ERR_DRIVER, "stream_end_capture");
  assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_ACTIVE);
  assert_ok(ops->stream_end_capture(s, &g));
  assert_status(ops->graph_instantiate(g, &x), GCA_ERR_DRIVER, "graph_instantiate");
  gca_sim_fault_clear();
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->stream_destroy(s));
}

static void destroying_a_capturing_stream_ends_its_part(void **state) {
  (void)state;
  if (!is_sim)
    skip(); /* the driver leaves this undefined */
  gca_stream_t s1 = mkstream(GCA_STREAM_NON_BLOCKING), s2 = mkstream(GCA_STREAM_NON_BLOCKING),
               s3 = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_event_t e = mkevent();
  gca_graph_t g;
  /* a forked stream goes: the capture is invalidated */
  assert_ok(ops->stream_begin_capture(s1, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->event_record(e, s1));
  assert_ok(ops->stream_wait_event(s2, e));
  assert_ok(ops->stream_destroy(s2));
  assert_status(ops->stream_end_capture(s1, &g), GCA_ERR_CAPTURE_INVALIDATED, "");
  /* the origin goes: the forked stream leaves the capture */
  assert_ok(ops->stream_begin_capture(s1, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->event_record(e, s1));
  assert_ok(ops->stream_wait_event(s3, e));
  assert_ok(ops->stream_destroy(s1));
  assert_int_equal(capture_status(s3), GCA_CAPTURE_STATUS_NONE);
  assert_status(ops->stream_end_capture(s3, &g), GCA_ERR_CAPTURE_UNMATCHED, "");
  /* e's last record was captured (Note [Captured events]) until recorded again */
  assert_status(ops->event_query(e), GCA_ERR_INVALID_ARGUMENT, "CUDA_ERROR_INVALID_VALUE");
  assert_ok(ops->event_record(e, s3));
  assert_ok(ops->event_synchronize(e));
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s3));
}

/* cuStreamIsCapturing on the legacy stream while a blocking stream captures:
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, and "the blocking stream capture is not
 * invalidated" (cuda.h). */
static void
legacy_capture_info_during_blocking_capture_is_implicit_without_invalidating(void **state) {
  (void)state;
  gca_stream_t blk = mkstream(GCA_STREAM_DEFAULT);
  gca_capture_status_t cs;
  gca_graph_t g;
  assert_ok(ops->stream_capture_info(NULL, &cs, NULL));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_NONE);
  assert_ok(ops->stream_begin_capture(blk, GCA_CAPTURE_MODE_RELAXED));
  assert_status(ops->stream_capture_info(NULL, &cs, NULL), GCA_ERR_CAPTURE_IMPLICIT, "");
  assert_int_equal(capture_status(blk), GCA_CAPTURE_STATUS_ACTIVE);
  assert_ok(ops->stream_end_capture(blk, &g));
  assert_non_null(g);
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->stream_destroy(blk));
}

/* cuGraphExecUpdate (cuda.h): a kernel node may change its function within
 * the listed limits (fill -> add: same module and context, no CDP); differing
 * node counts are TOPOLOGY_CHANGED with no error node. cuda.h refuses a memcpy
 * whose memory type changes, but a copy captured from cuMemcpyAsync names both
 * sides by unified address: on an H200 (driver 580) a destination that turns
 * from device into pinned host memory updates, and the launch copies there. */
static void exec_update_follows_the_drivers_limitations(void **state) {
  (void)state;
  static uint32_t host[N]; /* registered, as a program keeps copy targets pinned */
  assert_ok(ops->host_register(host, sizeof(host)));
  gca_devptr_t a = dalloc(N * 4), b = dalloc(N * 4);
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_graph_t g[4];
  gca_graph_exec_t x;
  gca_graph_update_info_t info;
  for (int k = 0; k < 4; k++) {
    assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
    if (k == 1)
      assert_ok(ops->kernel_add_u32(a, b, b, N, s));
    else
      assert_ok(ops->kernel_fill_u32(a, 4, 1, N, s));
    if (k == 2)
      assert_ok(ops->kernel_fill_u32(b, 4, 1, N, s));
    assert_ok(ops->memcpy_async(k == 3 ? (gca_devptr_t)(uintptr_t)host : b, a, N * 4, s));
    assert_ok(ops->stream_end_capture(s, &g[k]));
  }
  zero(a);
  zero(b);
  assert_ok(ops->graph_instantiate(g[0], &x));
  assert_ok(ops->graph_exec_update(x, g[1], &info)); /* fill -> add */
  assert_int_equal(info.result, GCA_GRAPH_UPDATE_SUCCESS);
  assert_int_equal(info.error_node_index, SIZE_MAX);
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  expect_fill(a, 0, 0); /* a = b + b with b zero, then b = a */
  assert_status(ops->graph_exec_update(x, g[2], &info), GCA_ERR_GRAPH_UPDATE, "");
  assert_int_equal(info.result, GCA_GRAPH_UPDATE_TOPOLOGY_CHANGED);
  assert_int_equal(info.error_node_index, SIZE_MAX);
  assert_ok(ops->graph_exec_update(x, g[3], &info)); /* copy to host memory now */
  assert_int_equal(info.result, GCA_GRAPH_UPDATE_SUCCESS);
  assert_int_equal(info.error_node_index, SIZE_MAX);
  memset(host, 0, sizeof(host));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  for (uint32_t i = 0; i < N; i++)
    assert_int_equal(host[i], 4 + i);
  assert_ok(ops->graph_exec_destroy(x));
  for (int k = 0; k < 4; k++)
    assert_ok(ops->graph_destroy(g[k]));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, a));
  assert_ok(ops->mem_free(0, b));
  assert_ok(ops->host_unregister(host));
}

/* An event whose last record was captured, after that capture ended: the
 * driver refuses it with CUDA_ERROR_INVALID_VALUE (query, synchronize, and a
 * stream's wait on it; H200, driver 580) until it is recorded again outside a
 * capture. (During the capture a query is CUDA_ERROR_CAPTURED_EVENT and
 * invalidates it: relaxed_thread_mode_permits_unsafe_calls_during_own_capture.) */
static void event_recorded_in_a_finished_capture_is_refused_until_recorded_again(void **state) {
  (void)state;
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_event_t e = mkevent();
  gca_devptr_t p = dalloc(N * 4);
  gca_graph_t g;
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->kernel_fill_u32(p, 1, 1, N, s));
  assert_ok(ops->event_record(e, s));
  assert_ok(ops->stream_end_capture(s, &g));
  gca_stream_t o = mkstream(GCA_STREAM_NON_BLOCKING);
  assert_status(ops->event_query(e), GCA_ERR_INVALID_ARGUMENT, "event_query");
  assert_status(ops->event_synchronize(e), GCA_ERR_INVALID_ARGUMENT, "event_synchronize");
  assert_status(ops->stream_wait_event(o, e), GCA_ERR_INVALID_ARGUMENT, "stream_wait_event");
  assert_ok(ops->stream_synchronize(o));
  assert_ok(ops->stream_destroy(o));
  assert_ok(ops->event_record(e, s)); /* outside a capture: an ordinary event again */
  assert_ok(ops->event_synchronize(e));
  assert_ok(ops->event_query(e));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->event_destroy(e));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, p));
}

/* Unknown until a GPU answers. VMM calls (cuMemCreate, cuMemAddressReserve,
 * cuMemMap, cuMemSetAccess) by the capturing thread while another stream
 * captures in global mode. The sim permits them and leaves the capture
 * active: the driver's "potentially unsafe" calls are the legacy allocation
 * and synchronizing ones (cuMemAlloc is refused, see
 * mem_alloc_is_refused_in_global_and_thread_local_capture_only), and PyTorch's
 * expandable segments map new pages while a graph is being captured. */
static void vmm_calls_during_a_global_capture_on_another_stream_are_permitted(void **state) {
  (void)state;
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  gca_devptr_t p = dalloc(N * 4), va = 0;
  gca_memhandle_t h = 0;
  gca_graph_t g;
  size_t gran = 0;
  int dev0 = 0;
  assert_ok(ops->mem_granularity(0, false, &gran));
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->kernel_fill_u32(p, 1, 1, N, s));
  assert_ok(ops->mem_create(0, gran, &h));
  assert_ok(ops->mem_address_reserve(0, gran, 0, &va));
  assert_ok(ops->mem_map(va, gran, 0, h));
  assert_ok(ops->mem_set_access(va, gran, &dev0, 1));
  assert_int_equal(capture_status(s), GCA_CAPTURE_STATUS_ACTIVE);
  assert_ok(ops->memset_d32_async(va, 5, N, s)); /* the new memory is usable in the capture */
  assert_ok(ops->stream_end_capture(s, &g));
  gca_graph_exec_t x;
  assert_ok(ops->graph_instantiate(g, &x));
  assert_ok(ops->graph_launch(x, s));
  assert_ok(ops->stream_synchronize(s));
  expect_fill(va, 5, 0);
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->mem_unmap(va, gran));
  assert_ok(ops->mem_release(h));
  assert_ok(ops->mem_address_free(0, va, gran));
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->mem_free(0, p));
}

/* A copy of host memory is captured whether the memory is pinned or pageable
 * (cuMemcpyAsync from pageable memory captures on an H200 with driver 580;
 * cuda.h does not say), and its node reads the host memory when a launch
 * reaches it, not at the capture; a copy to pageable memory writes it then. */
static void a_captured_host_copy_reads_the_host_memory_at_launch(void **state) {
  (void)state;
  gca_devptr_t d = dalloc(N * 4);
  gca_stream_t s = mkstream(GCA_STREAM_NON_BLOCKING);
  uint32_t *pageable = calloc(N, 4), *back = calloc(N, 4), *pinned = NULL;
  assert_non_null(pageable);
  assert_non_null(back);
  assert_ok(ops->host_alloc(N * 4, (void **)&pinned));
  for (int k = 0; k < 2; k++) {
    uint32_t *src = k == 0 ? pageable : pinned;
    gca_graph_t g = NULL;
    for (uint32_t i = 0; i < N; i++)
      src[i] = 7;
    assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
    assert_ok(ops->memcpy_async(d, (gca_devptr_t)(uintptr_t)src, N * 4, s));
    assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)back, d, N * 4, s));
    assert_ok(ops->stream_end_capture(s, &g));
    assert_non_null(g);
    gca_graph_exec_t x;
    assert_ok(ops->graph_instantiate(g, &x));
    for (uint32_t round = 1; round <= 3; round++) {
      for (uint32_t i = 0; i < N; i++)
        src[i] = round * 100 + i;
      memset(back, 0, N * 4);
      assert_ok(ops->graph_launch(x, s));
      assert_ok(ops->stream_synchronize(s));
      expect_fill(d, round * 100, 1);
      for (uint32_t i = 0; i < N; i++)
        if (back[i] != round * 100 + i)
          fail_msg("%s round %u word %u: %u", k == 0 ? "pageable" : "pinned", round, i, back[i]);
    }
    assert_ok(ops->graph_exec_destroy(x));
    assert_ok(ops->graph_destroy(g));
  }
  assert_ok(ops->stream_destroy(s));
  assert_ok(ops->host_free(pinned));
  free(pageable);
  free(back);
  assert_ok(ops->mem_free(0, d));
}

int main(void) {
  test_filter_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(capture_records_work_and_replay_runs_it),
      cmocka_unit_test(captured_host_func_memset_and_memcpy_run_per_launch),
      cmocka_unit_test(fork_and_join_through_events_capture_both_streams),
      cmocka_unit_test(concurrent_captures_have_distinct_ids),
      cmocka_unit_test(unjoined_fork_fails_the_end),
      cmocka_unit_test(end_without_capture_is_unmatched),
      cmocka_unit_test(end_from_another_thread_needs_relaxed_mode),
      cmocka_unit_test(synchronizing_a_capturing_stream_invalidates_the_capture),
      cmocka_unit_test(captured_event_cannot_be_queried_or_synchronized),
      cmocka_unit_test(legacy_stream_use_during_blocking_capture_is_implicit),
      cmocka_unit_test(waiting_on_an_uncaptured_event_invalidates_the_capture),
      cmocka_unit_test(mem_alloc_is_refused_in_global_and_thread_local_capture_only),
      cmocka_unit_test(other_threads_are_refused_only_by_a_global_capture),
      cmocka_unit_test(other_threads_calls_follow_the_captures_mode),
      cmocka_unit_test(relaxed_thread_mode_permits_unsafe_calls_during_own_capture),
      cmocka_unit_test(ctx_synchronize_during_capture_is_refused),
      cmocka_unit_test(launches_of_one_exec_are_ordered_across_streams),
      cmocka_unit_test(graph_handles_are_validated),
      cmocka_unit_test(injected_capture_faults_leave_no_capture_behind),
      cmocka_unit_test(destroying_a_capturing_stream_ends_its_part),
      cmocka_unit_test(
          legacy_capture_info_during_blocking_capture_is_implicit_without_invalidating),
      cmocka_unit_test(exec_update_follows_the_drivers_limitations),
      cmocka_unit_test(a_captured_host_copy_reads_the_host_memory_at_launch),
      cmocka_unit_test(event_recorded_in_a_finished_capture_is_refused_until_recorded_again),
      cmocka_unit_test(vmm_calls_during_a_global_capture_on_another_stream_are_permitted),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
