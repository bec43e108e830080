/* SPDX-License-Identifier: Apache-2.0 */
/* test_pools.c - private pools: routing by stream filter, by thread scope and
 * by stream capture (forked streams included), frees during capture, use
 * counts and the pool's lifetime, use_on_oom, no_split, and misuse of handles. */
#include <pthread.h>

#include "alloc_fixture.h"

typedef struct seg_pool {
  gca_devptr_t addr;
  uint64_t pool_id[2];
  bool found;
  gca_block_state_t state;
  size_t size;
} seg_pool_t;

static void find_fn(const gca_segment_info_t *seg, const gca_block_info_t *blocks, size_t n,
                    void *ctx) {
  seg_pool_t *q = ctx;
  if (q->addr < seg->address || q->addr >= seg->address + seg->total_size)
    return;
  q->found = true;
  q->pool_id[0] = seg->pool_id[0];
  q->pool_id[1] = seg->pool_id[1];
  for (size_t i = 0; i < n; i++) {
    if (blocks[i].address == q->addr) {
      q->state = blocks[i].state;
      q->size = blocks[i].size;
    }
  }
}

static seg_pool_t lookup(const void *p) {
  seg_pool_t q = {.addr = (gca_devptr_t)(uintptr_t)p};
  assert_ok(gca__allocator_walk(0, find_fn, &q));
  assert_true(q.found);
  return q;
}

/* Whether p lies in a segment of `pool` (NULL: the default pools). */
static bool in_pool(const void *p, gca_pool_t *pool) {
  uint64_t id[2] = {0, 0};
  if (pool != NULL)
    assert_ok(gca_pool_id(pool, id));
  seg_pool_t q = lookup(p);
  return q.pool_id[0] == id[0] && q.pool_id[1] == id[1];
}

static gca_stream_t new_stream(void) {
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  return s;
}

static bool accept_one(gca_stream_t stream, void *ctx) {
  return stream == (gca_stream_t)ctx;
}

static gca_pool_t *new_pool(bool use_on_oom, bool no_split) {
  gca_pool_options_t o = GCA_POOL_OPTIONS_INIT;
  o.use_on_oom = use_on_oom;
  o.no_split = no_split;
  gca_pool_t *p = NULL;
  assert_ok(gca_pool_create(0, &o, &p));
  assert_non_null(p);
  return p;
}

static void stream_filter_routes_matching_streams_only(void **state) {
  (void)state;
  gca_stream_t s1 = new_stream(), s2 = new_stream();
  gca_pool_t *pool = new_pool(false, false);
  assert_ok(gca_pool_begin_allocate(pool, accept_one, s1));
  void *a = alloc_on(4096, s1), *b = alloc_on(4096, s2), *c = alloc_on(3 * MiB, s1);
  assert_true(in_pool(a, pool));
  assert_true(in_pool(c, pool));
  assert_true(in_pool(b, NULL));
  assert_ok(gca_pool_end_allocate(pool));
  void *e = alloc_on(4096, s1);
  assert_true(in_pool(e, NULL));
  free_ok(a);
  free_ok(b);
  free_ok(c);
  free_ok(e);
  size_t reserved = 0, allocated = 1;
  assert_ok(gca_pool_memory(pool, &reserved, &allocated));
  assert_int_equal(reserved, 2 * MiB + 20 * MiB);
  assert_int_equal(allocated, 0);
  assert_ok(gca_pool_release(pool));
  check();
  assert_ok(gca_stream_destroy(s1));
  assert_ok(gca_stream_destroy(s2));
}

typedef struct thread_arg {
  void *p;
} thread_arg_t;

static void *other_thread(void *arg) {
  thread_arg_t *t = arg;
  if (gca_malloc(&t->p, 8192, NULL) != GCA_OK)
    t->p = NULL;
  return NULL;
}

static void thread_scope_routes_the_calling_thread_only(void **state) {
  (void)state;
  gca_pool_t *outer = new_pool(false, false), *inner = new_pool(false, false);
  assert_ok(gca_pool_use_begin(outer));
  void *a = alloc_on(8192, NULL);
  assert_ok(gca_pool_use_begin(inner));
  void *b = alloc_on(8192, NULL);
  thread_arg_t t = {0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, other_thread, &t), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_non_null(t.p);
  assert_status(gca_pool_use_end(outer), GCA_ERR_INVALID_STATE, "innermost");
  assert_ok(gca_pool_use_end(inner));
  void *c = alloc_on(8192, NULL);
  assert_ok(gca_pool_use_end(outer));
  void *e = alloc_on(8192, NULL);
  assert_true(in_pool(a, outer));
  assert_true(in_pool(b, inner));
  assert_true(in_pool(c, outer));
  assert_true(in_pool(t.p, NULL));
  assert_true(in_pool(e, NULL));
  int n = 0;
  assert_ok(gca_pool_use_count(outer, &n));
  assert_int_equal(n, 1);
  for (void **p = (void *[]){a, b, c, t.p, e, NULL}; *p != NULL; p++)
    free_ok(*p);
  assert_ok(gca_pool_release(outer));
  assert_ok(gca_pool_release(inner));
  check();
}

static void capture_routes_to_the_pool_including_a_joined_stream(void **state) {
  (void)state;
  gca_stream_t s = new_stream(), side = new_stream();
  gca_event_t fork, join;
  gca_graph_t graph = NULL;
  gca_graph_exec_t exec = NULL;
  gca_pool_t *pool = new_pool(false, false);
  void *before = alloc_on(4096, s);
  assert_ok(gca_event_create(&fork, GCA_EVENT_DISABLE_TIMING));
  assert_ok(gca_event_create(&join, GCA_EVENT_DISABLE_TIMING));
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_pool_begin_capture(pool, s));
  void *a = alloc_on(4096 * sizeof(uint32_t), s);
  assert_ok(gca_kernel_fill_u32(a, 7, 1, 4096, s));
  assert_ok(gca_event_record(fork, s));
  assert_ok(gca_stream_wait_event(side, fork));
  void *b = alloc_on(4096 * sizeof(uint32_t), side);
  assert_ok(gca_kernel_fill_u32(b, 100, 2, 4096, side));
  assert_ok(gca_event_record(join, side));
  assert_ok(gca_stream_wait_event(s, join));
  void *c = alloc_on(4096 * sizeof(uint32_t), s);
  assert_ok(gca_kernel_add_u32(c, a, b, 4096, s));
  assert_ok(gca_stream_end_capture(s, &graph));
  assert_non_null(graph);
  assert_ok(gca_pool_end_capture(pool, s));
  assert_true(in_pool(a, pool));
  assert_true(in_pool(b, pool));
  assert_true(in_pool(c, pool));
  assert_true(in_pool(before, NULL));
  assert_ok(gca_graph_instantiate(&exec, graph));
  assert_ok(gca_graph_launch(exec, s));
  assert_ok(gca_stream_synchronize(s));
  const uint32_t *cv = c;
  for (uint32_t i = 0; i < 4096; i += 511)
    assert_int_equal(cv[i], 7 + i + 100 + 2 * i);
  assert_ok(gca_graph_exec_destroy(exec));
  assert_ok(gca_graph_destroy(graph));
  for (void **p = (void *[]){a, b, c, before, NULL}; *p != NULL; p++)
    free_ok(*p);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_event_destroy(fork));
  assert_ok(gca_event_destroy(join));
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(side));
}

static void frees_during_capture_query_no_event_and_complete_after(void **state) {
  (void)state;
  gca_stream_t s = new_stream(), user = new_stream(), other = new_stream();
  gca_graph_t graph = NULL;
  gca_pool_t *pool = new_pool(false, false);
  void *p = alloc_on(8192, other); /* default pool, used on `user` too */
  assert_ok(gca_record_stream(p, user));
  void *q = alloc_on(8192, other);
  assert_ok(gca_record_stream(q, user));
  assert_ok(gca_free(q)); /* pending before the capture begins */
  assert_int_equal(lookup(q).state, GCA_BLOCK_ACTIVE_PENDING_FREE);
  assert_ok(gca_kernel_sleep(20000000, user)); /* keeps q's event from completing */
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_pool_begin_capture(pool, s));
  gca_sim_counters_reset();
  free_ok(p);
  assert_int_equal(lookup(p).state, GCA_BLOCK_ACTIVE_PENDING_FREE);
  void *a = alloc_on(3 * MiB, s);
  free_ok(a);
  void *a2 = alloc_on(3 * MiB, s); /* the freed block is reused inside the capture */
  assert_ptr_equal(a, a2);
  free_ok(a2);
  assert_int_equal(gca_sim_call_count("event_query"), 0);
  assert_int_equal(gca_sim_call_count("event_record"), 0);
  assert_int_equal(gca_sim_call_count("event_synchronize"), 0);
  assert_ok(gca_stream_end_capture(s, &graph));
  assert_non_null(graph); /* not invalidated by the allocator */
  assert_ok(gca_pool_end_capture(pool, s));
  assert_int_equal(gca_sim_call_count("event_record"), 1);
  assert_ok(gca_stream_synchronize(user));
  void *z = alloc_on(512, other); /* processes the completed events, then reuses p */
  assert_ptr_equal(z, p);
  free_ok(z);
  assert_ok(gca_graph_destroy(graph));
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(user));
  assert_ok(gca_stream_destroy(other));
}

static void deferred_free_survives_an_event_record_fault(void **state) {
  (void)state;
  gca_stream_t s = new_stream(), user = new_stream();
  gca_graph_t graph = NULL;
  gca_pool_t *pool = new_pool(false, false);
  void *p = alloc_on(8192, NULL);
  assert_ok(gca_record_stream(p, user));
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_pool_begin_capture(pool, s));
  free_ok(p);
  assert_ok(gca_stream_end_capture(s, &graph));
  assert_ok(gca_sim_fault_set("event_record:nth=1"));
  assert_ok(gca_pool_end_capture(pool, s)); /* the record fails: the free stays deferred */
  check();
  assert_int_equal(lookup(p).state, GCA_BLOCK_ACTIVE_PENDING_FREE);
  gca_sim_fault_clear();
  void *z = alloc_on(512, NULL); /* retries the deferred free: records its event */
  assert_int_equal(gca_sim_call_count("event_record"), 2);
  assert_ok(gca_stream_synchronize(user));
  free_ok(z); /* processes the completed event */
  assert_int_equal(lookup(p).state, GCA_BLOCK_INACTIVE);
  assert_ok(gca_graph_destroy(graph));
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(user));
}

static void use_count_frees_the_pool_at_zero_and_not_before(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool(false, false);
  uint64_t base = gca_sim_used_bytes(0);
  assert_ok(gca_pool_use_begin(pool));
  void *p = alloc_on(12 * MiB, NULL);
  assert_ok(gca_pool_use_end(pool));
  uint64_t with = gca_sim_used_bytes(0);
  assert_int_equal(with - base, 12 * MiB);
  int n = 0;
  assert_ok(gca_pool_retain(pool));
  assert_ok(gca_pool_use_count(pool, &n));
  assert_int_equal(n, 2);
  assert_ok(gca_pool_release(pool));
  assert_int_equal(gca_sim_used_bytes(0), with);
  assert_ok(gca_pool_release(pool)); /* zero, but a block is live */
  assert_int_equal(gca_sim_used_bytes(0), with);
  check();
  assert_status(gca_pool_use_count(pool, &n), GCA_ERR_INVALID_HANDLE, "released");
  free_ok(p);
  assert_int_equal(gca_sim_used_bytes(0), base);
  assert_status(gca_pool_retain(pool), GCA_ERR_INVALID_HANDLE, "pool_retain");
  /* an idle pool goes at once */
  gca_pool_t *idle = new_pool(false, false);
  assert_ok(gca_pool_use_begin(idle));
  free_ok(alloc_on(4096, NULL));
  assert_ok(gca_pool_use_end(idle));
  assert_int_equal(gca_sim_used_bytes(0), base + 2 * MiB);
  assert_ok(gca_pool_release(idle));
  assert_int_equal(gca_sim_used_bytes(0), base);
  check();
}

static void routes_hold_the_pool_until_they_end(void **state) {
  (void)state;
  gca_stream_t s = new_stream();
  gca_pool_t *pool = new_pool(false, false);
  assert_ok(gca_pool_begin_allocate(pool, accept_one, s));
  assert_ok(gca_pool_release(pool)); /* the route still holds it */
  void *p = alloc_on(4096, s);
  assert_true(in_pool(p, pool));
  free_ok(p);
  assert_int_equal(gca_sim_used_bytes(0), 2 * MiB);
  assert_ok(gca_pool_end_allocate(pool));
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_status(gca_pool_end_allocate(pool), GCA_ERR_INVALID_HANDLE, "released");
  assert_ok(gca_stream_destroy(s));
}

/* The reap of a dead pool whose last block was freed fails (the driver
 * refuses a mem_free): the free itself succeeded, the pool's memory stays
 * reserved and accounted, and gca_empty_cache gives it back once the driver
 * works again; nothing leaks. */
static void failed_reap_keeps_the_dead_pools_memory_until_empty_cache(void **state) {
  (void)state;
  gca_stream_t s = new_stream();
  gca_pool_t *pool = new_pool(false, false);
  assert_ok(gca_pool_use_begin(pool));
  void *p = alloc_on(3 * MiB, s);
  assert_ok(gca_pool_use_end(pool));
  assert_true(in_pool(p, pool));
  assert_ok(gca_pool_release(pool)); /* dead handle; the block keeps the pool's memory */
  gca_stats_t st;
  assert_ok(gca_get_stats(0, &st));
  int64_t reserved = st.reserved_bytes[GCA_STAT_ALL].current;
  assert_true(reserved > 0);
  int64_t frees = gca_sim_call_count("mem_free") + gca_sim_call_count("mem_unmap");
  assert_ok(gca_sim_fault_set("mem_free:always,mem_unmap:always"));
  assert_ok(gca_free(p)); /* the block is freed; giving the segment back fails */
  gca_sim_fault_clear();
  assert_true(gca_sim_call_count("mem_free") + gca_sim_call_count("mem_unmap") > frees);
  assert_ok(gca_get_stats(0, &st));
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, reserved);
  assert_int_equal(st.allocated_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca__allocator_check());
  /* empty_cache retries the reap: a failure is its status, naming the pool */
  assert_ok(gca_sim_fault_set("mem_free:always,mem_unmap:always"));
  assert_int_equal(gca_empty_cache(), GCA_ERR_DRIVER);
  gca_sim_fault_clear();
  assert_non_null(strstr(gca_last_error(), "pool 0x"));
  assert_non_null(strstr(gca_last_error(), "injected fault"));
  assert_ok(gca__allocator_check());
  assert_ok(gca_get_stats(0, &st));
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, reserved);
  assert_ok(gca_empty_cache());
  assert_ok(gca_get_stats(0, &st));
  assert_int_equal(st.reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
  assert_nothing_leaked();
}

static void use_on_oom_serves_default_requests_from_the_pool(void **state) {
  (void)state;
  gca_pool_t *helpful = new_pool(true, false), *plain = new_pool(false, false);
  assert_ok(gca_pool_use_begin(helpful));
  free_ok(alloc_on(4 * MiB, NULL)); /* a cached 20 MiB segment in the pool */
  assert_ok(gca_pool_use_end(helpful));
  assert_ok(gca_set_memory_limit(0, 20 * MiB));
  void *p = alloc_on(4 * MiB, NULL);
  assert_true(in_pool(p, helpful));
  free_ok(p);
  assert_ok(gca_pool_release(helpful)); /* its memory goes */
  assert_ok(gca_pool_use_begin(plain));
  free_ok(alloc_on(4 * MiB, NULL));
  assert_ok(gca_pool_use_end(plain));
  void *q = NULL;
  assert_status(gca_malloc(&q, 4 * MiB, NULL), GCA_ERR_OUT_OF_MEMORY, "private pools 20.00 MiB");
  assert_null(q);
  check();
  assert_ok(gca_pool_release(plain));
  assert_ok(gca_set_memory_limit(0, 0));
}

static void no_split_gives_each_allocation_its_own_block(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool(false, true);
  assert_ok(gca_pool_use_begin(pool));
  void *a = alloc_on(1024, NULL), *b = alloc_on(1024, NULL), *c = alloc_on(3 * MiB, NULL);
  assert_ok(gca_pool_use_end(pool));
  void *d = alloc_on(3 * MiB, NULL);
  assert_int_equal(block_size_of(a), 2 * MiB);
  assert_int_equal(block_size_of(b), 2 * MiB);
  assert_int_equal(block_size_of(c), 4 * MiB);
  assert_int_equal(block_size_of(d), 3 * MiB);
  layout_t l = layout();
  assert_int_equal(l.nsegs, 4);
  free_ok(a);
  assert_ok(gca_pool_use_begin(pool));
  void *e = alloc_on(512, NULL); /* reuses a's whole block */
  assert_ok(gca_pool_use_end(pool));
  assert_ptr_equal(e, a);
  for (void **p = (void *[]){b, c, d, e, NULL}; *p != NULL; p++)
    free_ok(*p);
  assert_ok(gca_pool_release(pool));
}

static void dead_and_foreign_handles_are_refused(void **state) {
  (void)state;
  gca_pool_t *pool = new_pool(false, false), *bogus = (gca_pool_t *)(uintptr_t)0x12345600;
  int n;
  gca_stream_t s = new_stream();
  assert_ok(gca_pool_release(pool));
  assert_status(gca_pool_release(pool), GCA_ERR_INVALID_HANDLE, "pool_release");
  assert_status(gca_pool_begin_allocate(pool, accept_one, NULL), GCA_ERR_INVALID_HANDLE,
                "released");
  assert_status(gca_pool_use_begin(pool), GCA_ERR_INVALID_HANDLE, "released");
  assert_status(gca_pool_use_count(NULL, &n), GCA_ERR_INVALID_HANDLE, "NULL");
  assert_status(gca_pool_use_count(bogus, &n), GCA_ERR_INVALID_HANDLE, "not a pool handle");
  gca_pool_t *live = new_pool(false, false);
  assert_status(gca_pool_end_allocate(live), GCA_ERR_INVALID_STATE, "no allocation route");
  assert_status(gca_pool_use_end(live), GCA_ERR_INVALID_STATE, "innermost");
  assert_status(gca_pool_begin_capture(live, s), GCA_ERR_INVALID_STATE, "not capturing");
  assert_status(gca_pool_end_capture(live, s), GCA_ERR_INVALID_STATE, "no capture");
  assert_status(gca_pool_begin_allocate(live, NULL, NULL), GCA_ERR_INVALID_ARGUMENT, "filter");
  gca_pool_options_t bad = {.size = 1};
  gca_pool_t *out = NULL;
  assert_status(gca_pool_create(0, &bad, &out), GCA_ERR_INVALID_ARGUMENT, "GCA_POOL_OPTIONS_INIT");
  assert_null(out);
  assert_status(gca_pool_create(7, NULL, &out), GCA_ERR_INVALID_ARGUMENT, "device 7");
  assert_ok(gca_pool_use_count(live, &n));
  assert_int_equal(n, 1);
  assert_ok(gca_pool_release(live));
  check();
  assert_ok(gca_stream_destroy(s));
}

static void capture_info_fault_leaves_the_pool_unrouted(void **state) {
  (void)state;
  gca_stream_t s = new_stream();
  gca_graph_t graph = NULL;
  gca_pool_t *pool = new_pool(false, false);
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_sim_fault_set("stream_capture_info:nth=1"));
  assert_status(gca_pool_begin_capture(pool, s), GCA_ERR_DRIVER, "pool_begin_capture");
  gca_sim_fault_clear();
  int n = 0;
  assert_ok(gca_pool_use_count(pool, &n));
  assert_int_equal(n, 1);
  assert_status(gca_pool_end_capture(pool, s), GCA_ERR_INVALID_STATE, "no capture");
  assert_ok(gca_stream_end_capture(s, &graph));
  if (graph != NULL)
    assert_ok(gca_graph_destroy(graph));
  check();
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(s));
}

/* A routed request whose stream cannot be asked whether it captures fails
 * with the driver's status; it does not quietly come from the default pools
 * (where a graph would write memory the default pools hand out again). */
static void capture_info_fault_on_a_routed_malloc_fails_it(void **state) {
  (void)state;
  gca_stream_t s = new_stream();
  gca_graph_t graph = NULL;
  gca_pool_t *pool = new_pool(false, false);
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_pool_begin_capture(pool, s));
  gca_stats_t before;
  assert_ok(gca_get_stats(0, &before));
  assert_ok(gca_sim_fault_set("stream_capture_info:nth=1"));
  void *p = NULL;
  assert_status(gca_malloc(&p, 4096, s), GCA_ERR_DRIVER, "malloc: routing a request on stream");
  gca_sim_fault_clear();
  assert_null(p);
  gca_stats_t after;
  assert_ok(gca_get_stats(0, &after));
  assert_int_equal(after.allocation[GCA_STAT_ALL].current, before.allocation[GCA_STAT_ALL].current);
  void *q = alloc_on(4096, s); /* and the next one is routed to the pool */
  assert_true(in_pool(q, pool));
  assert_ok(gca_free(q));
  assert_ok(gca_stream_end_capture(s, &graph));
  assert_ok(gca_pool_end_capture(pool, s));
  if (graph != NULL)
    assert_ok(gca_graph_destroy(graph));
  check();
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(s));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(stream_filter_routes_matching_streams_only, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(thread_scope_routes_the_calling_thread_only, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(capture_routes_to_the_pool_including_a_joined_stream,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(frees_during_capture_query_no_event_and_complete_after,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(deferred_free_survives_an_event_record_fault, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(use_count_frees_the_pool_at_zero_and_not_before, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(routes_hold_the_pool_until_they_end, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(use_on_oom_serves_default_requests_from_the_pool, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(no_split_gives_each_allocation_its_own_block, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(dead_and_foreign_handles_are_refused, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(capture_info_fault_on_a_routed_malloc_fails_it, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(failed_reap_keeps_the_dead_pools_memory_until_empty_cache,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(capture_info_fault_leaves_the_pool_unrouted, alloc_setup,
                                      alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
