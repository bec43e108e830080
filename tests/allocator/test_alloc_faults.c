/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_faults.c - every device call the allocator makes, made to fail
 * (sim fault injection): the failing call returns a status whose detail names
 * the operation, the invariant walker passes, live pointers stay live, and
 * after freeing everything and emptying the cache nothing stays reserved. A
 * sweep injects each operation's n-th call into a scripted workload. */
#include <inttypes.h>

#include "alloc_fixture.h"

static void drain_and_expect_empty(void **live, int n) {
  gca_sim_fault_clear();
  for (int i = 0; i < n; i++)
    if (live[i] != NULL)
      assert_ok(gca_free(live[i]));
  assert_ok(gca_empty_cache());
  check();
  gca_stats_t s = stats();
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.active[GCA_STAT_ALL].current, 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

/* Caching off: the free of a block used on another stream copies its uses
 * before waiting for them; without host memory for that copy the free fails
 * with a clear status, the block stays live with its uses, and a later free
 * completes (Note [Host fail points]). */
static void free_with_caching_off_without_host_memory_keeps_the_block(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *q = alloc_on(4096, NULL);
  assert_ok(gca_record_stream(q, s));
  assert_ok(gca_set_caching(false));
  assert_ok(gca__failpoint_arm("free_wait_uses", 1));
  assert_status(gca_free(q), GCA_ERR_OUT_OF_MEMORY, "host out of memory");
  gca__failpoint_clear();
  check();
  size_t bs = 0;
  int dev = -1;
  assert_ok(gca_pointer_info(q, &bs, &dev)); /* still live */
  assert_int_equal(stats().allocated_bytes[GCA_STAT_ALL].current, (int64_t)bs);
  assert_ok(gca_free(q));
  assert_int_equal(stats().allocated_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_set_caching(true));
  assert_ok(gca_stream_destroy(s));
  drain_and_expect_empty(NULL, 0);
}

/* Allocates k 512-byte blocks, each of which must succeed, then expects the
 * next one to fail for want of host memory with a detail naming `what`. */
static void alloc_then_fail(void **live, int k, const char *what) {
  for (int i = 0; i < k; i++)
    live[i] = alloc_on(512, NULL);
  void *p = NULL;
  assert_status(gca_malloc(&p, 512, NULL), GCA_ERR_OUT_OF_MEMORY, what);
  assert_null(p);
  gca__failpoint_clear();
}

/* After a host allocation failed at the k-th block: the walker passes, the
 * k blocks are live and counted, the next allocation succeeds (the fail point
 * fired once), and freeing everything leaves nothing behind. */
static void after_host_failure(void **live, int k) {
  check();
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, k);
  for (int i = 0; i < k; i++) {
    size_t bs = 0;
    int dev = -1;
    assert_ok(gca_pointer_info(live[i], &bs, &dev));
    assert_int_equal(bs, 512);
  }
  live[k] = alloc_on(512, NULL);
  check();
  drain_and_expect_empty(live, k + 1);
}

/* Note [Records on huge pages]: a table below 2 MiB is plain host memory
 * aligned to a cache line; one of 2 MiB or more is its own mapping aligned to
 * 2 MiB (so that huge pages can back it); both read as zero and take writes
 * to their last byte. */
static void tables_are_zeroed_and_aligned_for_huge_pages(void **state) {
  (void)state;
  static const size_t sizes[] = {1000, (size_t)2 << 20, ((size_t)3 << 20) + 4096};
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t n = sizes[k];
    unsigned char *p = gca__table_alloc(n);
    assert_non_null(p);
    uintptr_t align = n < ((size_t)2 << 20) ? 64 : (uintptr_t)2 << 20;
    assert_int_equal((uintptr_t)p % align, 0);
    assert_int_equal(p[0], 0);
    assert_int_equal(p[n / 2], 0);
    assert_int_equal(p[n - 1], 0);
    p[0] = p[n - 1] = 0xa5;
    gca__table_free(p, n);
  }
  gca__table_free(NULL, 4096); /* nothing to give back */
}

/* Note [Records on huge pages]: the block records' second slab cannot be had;
 * the allocation that needed it fails with a clear status and changes
 * nothing. The first slab holds 256 records: the first allocation takes two
 * (the block and the segment's rest), each later one a third. */
static void host_oom_for_block_records_fails_the_allocation_cleanly(void **state) {
  (void)state;
  void *live[256];
  assert_ok(gca__failpoint_arm("block_slab", 2));
  alloc_then_fail(live, 255, "host out of memory for 512 more block records");
  after_host_failure(live, 255);
}

/* The list of slabs cannot grow (the first allocation makes it). */
static void host_oom_for_the_slab_list_fails_the_allocation_cleanly(void **state) {
  (void)state;
  void *live[1];
  assert_ok(gca__failpoint_arm("block_slab_index", 1));
  alloc_then_fail(live, 0, "host out of memory for block records");
  after_host_failure(live, 0);
}

/* The pointer map cannot grow past its first 64 slots (kept at most half
 * full): the 33rd allocation fails cleanly, and the 32 before it still find
 * their blocks. */
static void host_oom_growing_the_pointer_map_fails_the_allocation_cleanly(void **state) {
  (void)state;
  void *live[33];
  assert_ok(gca__failpoint_arm("ptrmap_grow", 2));
  alloc_then_fail(live, 32, "growing the pointer map to 128 entries");
  after_host_failure(live, 32);
}

static void mem_alloc_fault_once_is_retried(void **state) {
  (void)state;
  assert_ok(gca_sim_fault_set("mem_alloc:nth=1"));
  void *p = alloc_on(4096, NULL);
  assert_int_equal(stats().num_alloc_retries, 1);
  assert_int_equal(stats().num_ooms, 0);
  drain_and_expect_empty(&p, 1);
}

static void mem_alloc_failing_always_is_an_oom(void **state) {
  (void)state;
  void *keep = alloc_on(4096, NULL);
  assert_ok(gca_sim_fault_set("mem_alloc:always"));
  void *p;
  assert_status(gca_malloc(&p, 8 * MiB, NULL), GCA_ERR_OUT_OF_MEMORY, "out of memory");
  check();
  assert_int_equal(stats().num_ooms, 1);
  void *q = alloc_on(4096, NULL); /* cached memory still serves */
  free_ok(q);
  void *live[] = {keep};
  drain_and_expect_empty(live, 1);
}

static void mem_free_fault_leaves_segment_cached(void **state) {
  (void)state;
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  assert_ok(gca_sim_fault_set("mem_free:nth=1"));
  assert_status(gca_empty_cache(), GCA_ERR_DRIVER, "mem_free");
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 2 * MiB);
  assert_ok(gca_empty_cache());
  drain_and_expect_empty(NULL, 0);
}

static void event_faults_fail_the_free_and_keep_the_pointer(void **state) {
  (void)state;
  const char *faults[] = {"event_create:nth=1", "event_record:nth=1", "event_record:nth=2"};
  gca_stream_t b, c;
  assert_ok(gca_stream_create(&b, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&c, GCA_STREAM_NON_BLOCKING));
  for (size_t i = 0; i < GCA_ARRAY_SIZE(faults); i++) {
    void *p = alloc_on(4096, NULL);
    assert_ok(gca_record_stream(p, b));
    assert_ok(gca_record_stream(p, c));
    gca_stats_t before = stats();
    assert_ok(gca_sim_fault_set(faults[i]));
    gca_clear_last_error();
    gca_status_t st = gca_free(p);
    assert_int_not_equal(st, GCA_OK);
    if (strstr(gca_last_error(), faults[i][6] == 'c' ? "event_create" : "event_record") == NULL)
      fail_msg("%s: detail '%s'", faults[i], gca_last_error());
    gca_sim_fault_clear();
    check();
    gca_stats_t after = stats();
    assert_int_equal(after.allocation[GCA_STAT_ALL].current,
                     before.allocation[GCA_STAT_ALL].current);
    size_t sz;
    assert_ok(gca_pointer_info(p, &sz, NULL)); /* still live */
    free_ok(p);                                /* and still recorded on b and c */
    assert_int_equal(stats().active[GCA_STAT_ALL].current, 1);
    assert_ok(gca_stream_synchronize(b));
    assert_ok(gca_stream_synchronize(c));
  }
  drain_and_expect_empty(NULL, 0);
  assert_ok(gca_stream_destroy(b));
  assert_ok(gca_stream_destroy(c));
}

static void event_query_fault_fails_malloc_cleanly(void **state) {
  (void)state;
  gca_stream_t b;
  assert_ok(gca_stream_create(&b, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4096, NULL);
  assert_ok(gca_record_stream(p, b));
  free_ok(p);
  assert_ok(gca_stream_synchronize(b));
  assert_ok(gca_sim_fault_set("event_query:nth=1"));
  void *q;
  assert_status(gca_malloc(&q, 4096, NULL), GCA_ERR_DRIVER, "event_query");
  check();
  gca_sim_fault_clear();
  q = alloc_on(4096, NULL);
  assert_ptr_equal(p, q);
  drain_and_expect_empty(&q, 1);
  assert_ok(gca_stream_destroy(b));
}

static void event_synchronize_fault_fails_empty_cache_cleanly(void **state) {
  (void)state;
  gca_stream_t b;
  assert_ok(gca_stream_create(&b, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4096, NULL);
  assert_ok(gca_record_stream(p, b));
  assert_ok(gca_kernel_sleep(20ull * 1000 * 1000, b));
  free_ok(p);
  assert_ok(gca_sim_fault_set("event_synchronize:nth=1"));
  assert_status(gca_empty_cache(), GCA_ERR_DRIVER, "event_synchronize");
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 2 * MiB);
  drain_and_expect_empty(NULL, 0);
  assert_ok(gca_stream_destroy(b));
}

static void stream_synchronize_fault_without_caching(void **state) {
  (void)state;
  gca_stream_t b;
  assert_ok(gca_stream_create(&b, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_set_caching(false));
  void *p = alloc_on(4096, NULL);
  assert_ok(gca_record_stream(p, b));
  assert_ok(gca_sim_fault_set("stream_synchronize:nth=1"));
  assert_status(gca_free(p), GCA_ERR_DRIVER, "stream_synchronize");
  check();
  assert_ok(gca_pointer_info(p, NULL, NULL));
  drain_and_expect_empty(&p, 1);
  assert_ok(gca_set_caching(true));
  assert_ok(gca_stream_destroy(b));
}

static void mem_get_info_fault_fails_first_use(void **state) {
  (void)state;
  assert_ok(gca_sim_fault_set("mem_get_info:nth=1"));
  void *p;
  assert_status(gca_malloc(&p, 4096, NULL), GCA_ERR_DRIVER, "mem_get_info");
  check();
  gca_sim_fault_clear();
  p = alloc_on(4096, NULL);
  drain_and_expect_empty(&p, 1);
}

/* A workload touching every device call: new segments in both pools,
 * cached reuse, recorded streams, an OOM retry path, empty_cache. Failures
 * are tolerated; the invariants must hold after every step. */
static void workload(gca_stream_t s1, gca_stream_t s2, void **live, int *nlive) {
  static const size_t sizes[] = {512, 3000, 1 * MiB, 3 * MiB, 12 * MiB, 64 * KiB};
  for (int i = 0; i < 14; i++) {
    void *p = NULL;
    gca_status_t st = gca_malloc(&p, sizes[i % 6], (i & 1) ? s1 : NULL);
    check();
    if (st == GCA_OK) {
      if (i % 3 == 0)
        (void)gca_record_stream(p, s2);
      if (i % 4 == 1) /* p is on s1: the legacy stream is another stream */
        (void)gca_record_stream(p, NULL);
      live[(*nlive)++] = p;
    }
    if ((i & 1) && *nlive > 0) {
      if (gca_free(live[0]) == GCA_OK) {
        memmove(live, live + 1, (size_t)(*nlive - 1) * sizeof(void *));
        (*nlive)--;
      }
      check();
    }
    if (i == 9) {
      (void)gca_empty_cache();
      check();
    }
  }
}

static void sweep_every_call_of_every_op(void **state) {
  (void)state;
  static const char *op_names[] = {"mem_get_info",      "mem_alloc",          "mem_free",
                                   "event_create",      "event_record",       "event_query",
                                   "event_synchronize", "stream_synchronize", "stream_get_device",
                                   "ctx_get_device"};
  int injected = 0, per_op[GCA_ARRAY_SIZE(op_names)] = {0};
  for (int caching = 1; caching >= 0; caching--) {
    for (size_t o = 0; o < GCA_ARRAY_SIZE(op_names); o++) {
      for (int nth = 1; nth <= 6; nth++) {
        assert_nothing_leaked();
        gca__allocator_reset();
        assert_ok(gca_sim_set_capacity(0, 40 * MiB));
        gca_stream_t s1, s2;
        assert_ok(gca_stream_create(&s1, GCA_STREAM_NON_BLOCKING));
        assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
        if (!caching)
          assert_ok(gca_set_caching(false));
        char spec[64];
        snprintf(spec, sizeof(spec), "%s:nth=%d", op_names[o], nth);
        gca_sim_counters_reset();
        assert_ok(gca_sim_fault_set(spec));
        void *live[32];
        int nlive = 0;
        workload(s1, s2, live, &nlive);
        if (gca_sim_call_count(op_names[o]) >= nth) {
          injected++;
          per_op[o]++;
        }
        drain_and_expect_empty(live, nlive);
        assert_ok(gca_stream_synchronize(s2));
        assert_ok(gca_stream_destroy(s1));
        assert_ok(gca_stream_destroy(s2));
      }
    }
  }
  print_message("faults injected into the workload: %d\n", injected);
  /* how often event_synchronize is reached depends on when events complete */
  for (size_t o = 0; o < GCA_ARRAY_SIZE(op_names); o++)
    if (per_op[o] == 0 && strcmp(op_names[o], "event_synchronize") != 0)
      fail_msg("the workload never reached %s", op_names[o]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(mem_alloc_fault_once_is_retried, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(tables_are_zeroed_and_aligned_for_huge_pages, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(host_oom_for_block_records_fails_the_allocation_cleanly,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(host_oom_for_the_slab_list_fails_the_allocation_cleanly,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(host_oom_growing_the_pointer_map_fails_the_allocation_cleanly,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(free_with_caching_off_without_host_memory_keeps_the_block,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(mem_alloc_failing_always_is_an_oom, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(mem_free_fault_leaves_segment_cached, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(event_faults_fail_the_free_and_keep_the_pointer, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(event_query_fault_fails_malloc_cleanly, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(event_synchronize_fault_fails_empty_cache_cleanly,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(stream_synchronize_fault_without_caching, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(mem_get_info_fault_fails_first_use, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(sweep_every_call_of_every_op, alloc_setup, alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
