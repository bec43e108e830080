/* SPDX-License-Identifier: Apache-2.0 */
/* test_expandable.c - expandable segments on the sim backend: one reservation
 * per (stream, pool) grown by one handle per granule, free space next to
 * unmapped space counted as one fit, release unmapping whole granules inside
 * free blocks, the out-of-memory retry, faults in the middle of a growth,
 * statistics, history, the walk, and peer access (GCA_SIM_DEVICES=2).
 * Driver-level effects are read from the sim's call counters and used bytes. */
#include <inttypes.h>
#include <sched.h>
#include <stdatomic.h>

#include "alloc_fixture.h"
#include "gca.h"
#include "support.h"

static int exp_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("expandable_segments:True,expandable_moves:True"));
  return 0;
}

/* A stream running hold_stream stays busy until the test opens the gate. */
static atomic_int gate = 1;

static void hold_stream(void *arg) {
  (void)arg;
  while (atomic_load(&gate) == 0)
    sched_yield();
}

static int exp_teardown(void **state) {
  atomic_store(&gate, 1); /* a failed test must not leave a stream held */
  return alloc_teardown(state);
}

static int64_t reserved_now(void) {
  return stats().reserved_bytes[GCA_STAT_ALL].current;
}

/* Everything freed and the cache emptied leaves nothing behind in the
 * driver: every handle created released, every reservation freed (calls
 * that an injected fault failed are counted too, so tests with faults pass
 * how many failed). */
static void expect_all_returned_after(int64_t failed_creates, int64_t failed_reserves) {
  assert_ok(gca_empty_cache());
  check();
  assert_int_equal(reserved_now(), 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_int_equal(gca_sim_call_count("mem_create") - failed_creates,
                   gca_sim_call_count("mem_release"));
  assert_int_equal(gca_sim_call_count("mem_address_reserve") - failed_reserves,
                   gca_sim_call_count("mem_address_free"));
  assert_int_equal(layout().nsegs, 0);
}

/* ... with no fault: every handle was mapped once and unmapped, one unmap
 * per run of adjacent mappings (Note [Sim whole mappings]), so no more
 * unmaps than maps. */
static void expect_all_returned(void) {
  expect_all_returned_after(0, 0);
  assert_true(gca_sim_call_count("mem_unmap") <= gca_sim_call_count("mem_map"));
  assert_true(gca_sim_call_count("mem_unmap") > 0 || gca_sim_call_count("mem_map") == 0);
}

/* Note [Expandable segments]: growth maps what the request lacks, one handle
 * per 2 MiB granule, and opens the range with one set_access. */
static void growth_maps_a_handle_per_granule_and_opens_the_range_once(void **state) {
  (void)state;
  char *a = alloc_on(10 * MiB, NULL);
  assert_int_equal(gca_sim_call_count("mem_create"), 5);
  assert_int_equal(gca_sim_call_count("mem_map"), 5);
  assert_int_equal(gca_sim_call_count("mem_set_access"), 1);
  assert_int_equal(gca_sim_call_count("mem_alloc"), 0);
  char *b = alloc_on(30 * MiB, NULL);
  assert_ptr_equal(b, a + 10 * MiB); /* the same range, extended */
  assert_int_equal(gca_sim_call_count("mem_create"), 20);
  assert_int_equal(gca_sim_call_count("mem_map"), 20);
  assert_int_equal(gca_sim_call_count("mem_set_access"), 2);
  assert_int_equal(gca_sim_call_count("mem_address_reserve"), 1);
  assert_int_equal(gca_sim_used_bytes(0), 40 * MiB);
  gca_stats_t s = stats();
  assert_int_equal(s.reserved_bytes[GCA_STAT_LARGE].current, 40 * MiB);
  assert_int_equal(s.segment[GCA_STAT_ALL].current, 0); /* PyTorch leaves them out */
  assert_int_equal(s.num_device_alloc, 2);
  /* the cost counters: 20 creates + 20 maps + 2 set_access (+ the reservation
   * is not counted), for 40 MiB grown */
  assert_int_equal(s.num_driver_calls, 42);
  assert_int_equal(s.grown_bytes, 40 * MiB);
  assert_int_equal(s.num_handle_moves, 0);
  layout_t l = layout();
  assert_int_equal(l.nsegs, 1);
  assert_int_equal(l.seg_size[0], 40 * MiB);
  free_ok(a);
  free_ok(b);
  expect_all_returned();
  assert_int_equal(stats().num_device_free, 20); /* one per handle */
}

static void small_requests_grow_the_small_pool_by_two_mib(void **state) {
  (void)state;
  char *p[5];
  for (int i = 0; i < 5; i++)
    p[i] = alloc_on(512 * KiB, NULL);
  assert_ptr_equal(p[1], p[0] + 512 * KiB);
  assert_int_equal(gca_sim_call_count("mem_create"), 2); /* 2 MiB, then 2 MiB more for the fifth */
  gca_stats_t s = stats();
  assert_int_equal(s.reserved_bytes[GCA_STAT_SMALL].current, 4 * MiB);
  assert_int_equal(s.reserved_bytes[GCA_STAT_LARGE].current, 0);
  for (int i = 0; i < 5; i++)
    free_ok(p[i]);
  expect_all_returned();
}

static void free_tail_block_plus_unmapped_space_is_one_fit(void **state) {
  (void)state;
  char *x = alloc_on(16 * MiB, NULL);
  free_ok(x);
  char *y = alloc_on(10 * MiB, NULL); /* cached fit: 10 MiB + a free 6 MiB tail */
  assert_ptr_equal(y, x);
  assert_int_equal(gca_sim_call_count("mem_create"), 8);
  char *z = alloc_on(10 * MiB, NULL); /* the free 6 MiB + 4 MiB newly mapped */
  assert_ptr_equal(z, y + 10 * MiB);
  assert_int_equal(gca_sim_call_count("mem_create"), 10);
  assert_int_equal(gca_sim_used_bytes(0), 20 * MiB);
  assert_int_equal(reserved_now(), 20 * MiB);
  free_ok(y);
  free_ok(z);
  expect_all_returned();
}

/* Of the holes that can serve a request, the one that maps the fewest bytes
 * wins, whatever their totals: a 20 MiB hole after a free 8 MiB block maps
 * 8 MiB for a 16 MiB request (total 28 MiB), where an 18 MiB hole between
 * live blocks (total 18 MiB) and the tail would map all 16 MiB. */
static void the_hole_that_maps_least_serves_a_growth(void **state) {
  (void)state;
  char *a = alloc_on(2 * MiB, NULL), *q = alloc_on(8 * MiB, NULL), *r = alloc_on(20 * MiB, NULL);
  char *c = alloc_on(2 * MiB, NULL), *s = alloc_on(18 * MiB, NULL), *e = alloc_on(2 * MiB, NULL);
  free_ok(r);
  free_ok(s);
  assert_ok(gca_empty_cache()); /* r and s become holes; a, q, c, e stay mapped */
  free_ok(q);                   /* mapped and free, before the hole at r */
  check();
  assert_int_equal(reserved_now(), 14 * MiB);
  int64_t creates = gca_sim_call_count("mem_create");
  char *x = alloc_on(16 * MiB, NULL);
  check();
  assert_ptr_equal(x, q);
  assert_int_equal(gca_sim_call_count("mem_create") - creates, 4); /* 8 MiB: 4 granules */
  assert_int_equal(reserved_now(), 22 * MiB);
  stamp_fill(x, 16 * MiB, 0x51);
  assert_int_equal(stamp_mismatch(x, 16 * MiB, 0x51), -1);
  free_ok(x);
  free_ok(a);
  free_ok(c);
  free_ok(e);
  expect_all_returned();
}

/* A hole with a free block after it and a live one before maps at its end:
 * a 10 MiB hole between A and a free 10 MiB block Z takes a 14 MiB request
 * with 4 MiB mapped at the hole's end (the block starts 6 MiB into the hole),
 * where mapping from the hole's start would have mapped all 10 MiB. */
static void a_hole_before_a_free_block_maps_at_its_end(void **state) {
  (void)state;
  char *a = alloc_on(10 * MiB, NULL), *y = alloc_on(10 * MiB, NULL), *z = alloc_on(10 * MiB, NULL);
  char *b = alloc_on(10 * MiB, NULL);
  stamp_fill(a, 10 * MiB, 0x61);
  stamp_fill(b, 10 * MiB, 0x62);
  free_ok(y);
  assert_ok(gca_empty_cache()); /* y becomes the hole */
  free_ok(z);                   /* mapped and free, after the hole */
  check();
  assert_int_equal(reserved_now(), 30 * MiB);
  int64_t creates = gca_sim_call_count("mem_create");
  char *x = alloc_on(14 * MiB, NULL);
  check();
  assert_ptr_equal(x, y + 6 * MiB);
  assert_int_equal(gca_sim_call_count("mem_create") - creates, 2); /* 4 MiB: 2 granules */
  assert_int_equal(reserved_now(), 34 * MiB);
  stamp_fill(x, 14 * MiB, 0x63);
  assert_int_equal(stamp_mismatch(a, 10 * MiB, 0x61), -1);
  assert_int_equal(stamp_mismatch(b, 10 * MiB, 0x62), -1);
  assert_int_equal(stamp_mismatch(x, 14 * MiB, 0x63), -1);
  free_ok(x);
  assert_ok(gca_empty_cache()); /* the hole's two pieces and the block between them merge */
  check();
  assert_int_equal(reserved_now(), 20 * MiB);
  free_ok(a);
  free_ok(b);
  expect_all_returned();
}

/* Four 10 MiB blocks; freeing the first and third leaves two 10 MiB holes. A
 * 16 MiB request fits neither hole and would grow the tail: instead the
 * handles of 8 free granules (5 of the first hole, 3 of the second) move
 * there (Note [Expandable segments]). Asserted: no handle created, 8 unmapped
 * (one unmap per hole) and mapped again, no synchronize (one stream_query
 * finds the segment's stream idle, Note [Move horizons]), mapped memory
 * stays 40 MiB (live 36 MiB), E sits right after D, and the holes' address
 * space is reused later. */
static void holes_move_to_serve_a_larger_request(void **state) {
  (void)state;
  char *p[4];
  for (int i = 0; i < 4; i++)
    p[i] = alloc_on(10 * MiB, NULL);
  free_ok(p[0]);
  free_ok(p[2]);
  static const char *const counted[] = {"mem_create",      "mem_release",    "mem_unmap",
                                        "mem_map",         "mem_set_access", "stream_synchronize",
                                        "ctx_synchronize", "stream_query",   "event_record"};
  int64_t was[GCA_ARRAY_SIZE(counted)];
  for (size_t i = 0; i < GCA_ARRAY_SIZE(counted); i++)
    was[i] = gca_sim_call_count(counted[i]);
  char *e = alloc_on(16 * MiB, NULL);
  assert_ptr_equal(e, p[3] + 10 * MiB);
  check();
  gca_stats_t s = stats();
  static const int64_t want[] = {0, 0, 2, 8, 1, 0, 0, 1, 0};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(counted); i++)
    if (gca_sim_call_count(counted[i]) - was[i] != want[i])
      fail_msg("%s: %" PRId64 " calls, expected %" PRId64, counted[i],
               gca_sim_call_count(counted[i]) - was[i], want[i]);
  assert_int_equal(s.num_handle_moves, 8);
  assert_int_equal(s.num_alloc_retries, 0);
  assert_int_equal(s.num_device_free, 0); /* moved, not freed */
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 40 * MiB);
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].peak, 40 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 40 * MiB);
  /* the walk shows the mapped runs: B, the rest of the second hole + D + E */
  layout_t l = layout();
  assert_int_equal(l.nsegs, 2);
  assert_int_equal(l.seg_size[0], 10 * MiB);
  assert_int_equal(l.seg_size[1], 30 * MiB);
  /* the first hole is address space again: a 10 MiB request takes the 4 MiB
   * left of the second and maps 6 MiB there (moved from nowhere: created) */
  char *f = alloc_on(10 * MiB, NULL);
  check();
  assert_int_equal(reserved_now(), 46 * MiB);
  free_ok(f);
  free_ok(e);
  free_ok(p[1]);
  free_ok(p[3]);
  expect_all_returned();
}

/* Under a limit the move needs no room: the same sequence with a 40 MiB limit
 * succeeds without an out-of-memory retry. */
static void a_move_needs_no_room_under_the_limit(void **state) {
  (void)state;
  char *p[4];
  for (int i = 0; i < 4; i++)
    p[i] = alloc_on(10 * MiB, NULL);
  free_ok(p[0]);
  free_ok(p[2]);
  assert_ok(gca_set_memory_limit(0, 40 * MiB));
  char *e = alloc_on(16 * MiB, NULL);
  check();
  gca_stats_t s = stats();
  assert_int_equal(s.num_alloc_retries, 0);
  assert_int_equal(s.num_ooms, 0);
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 40 * MiB);
  assert_ok(gca_set_memory_limit(0, 0));
  free_ok(e);
  free_ok(p[1]);
  free_ok(p[3]);
  expect_all_returned();
}

/* Free granules are unmapped by empty_cache; the granule a live block touches
 * stays: a 9 MiB block keeps 10 MiB mapped of a 20 MiB growth. */
static void granules_a_live_block_touches_stay_mapped(void **state) {
  (void)state;
  char *x = alloc_on(20 * MiB, NULL);
  free_ok(x);
  char *a = alloc_on(9 * MiB, NULL);
  assert_ok(gca_empty_cache());
  check();
  assert_int_equal(reserved_now(), 10 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 10 * MiB);
  free_ok(a);
  expect_all_returned();
}

static void every_stream_and_pool_has_its_own_segment(void **state) {
  (void)state;
  gca_stream_t s1;
  assert_ok(gca_stream_create(&s1, GCA_STREAM_NON_BLOCKING));
  void *a = alloc_on(12 * MiB, NULL);
  void *b = alloc_on(12 * MiB, s1);
  void *c = alloc_on(4 * KiB, s1);
  assert_int_equal(gca_sim_call_count("mem_address_reserve"), 3);
  free_ok(a);
  free_ok(b);
  free_ok(c);
  expect_all_returned();
  assert_ok(gca_stream_destroy(s1));
}

static void data_survives_growth_and_release(void **state) {
  (void)state;
  size_t n = 10 * MiB / sizeof(uint32_t);
  uint32_t *a = alloc_on(10 * MiB, NULL);
  for (size_t i = 0; i < n; i += 1024)
    a[i] = (uint32_t)(i * 2654435761u);
  uint32_t *hole = alloc_on(10 * MiB, NULL);
  uint32_t *b = alloc_on(30 * MiB, NULL); /* growth after a and the hole */
  for (size_t i = 0; i < 3 * n; i += 1024)
    b[i] = (uint32_t)~i;
  free_ok(hole);
  assert_ok(gca_empty_cache()); /* unmaps the hole between a and b */
  check();
  assert_int_equal(reserved_now(), 40 * MiB);
  for (size_t i = 0; i < n; i += 1024)
    assert_int_equal(a[i], (uint32_t)(i * 2654435761u));
  for (size_t i = 0; i < 3 * n; i += 1024)
    assert_int_equal(b[i], (uint32_t)~i);
  free_ok(a);
  free_ok(b);
  expect_all_returned();
}

/* A fault in the middle of a growth: the partial mapping is undone (handle
 * released, range unmapped), the status names the operation, the live block
 * keeps its data, and nothing leaks. */
static void fault_mid_growth_is_undone(void **state) {
  (void)state;
  /* the third granule's map fails (2 mapped, 3 created), or the range's
   * set_access once all 15 are mapped */
  const char *ops_[] = {"mem_map", "mem_set_access"};
  const char *specs[] = {"mem_map:nth=3", "mem_set_access:nth=1"};
  const int64_t made[] = {3, 15};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(ops_); k++) {
    uint32_t *live = alloc_on(10 * MiB, NULL);
    live[0] = 0xfeedu;
    int64_t creates = gca_sim_call_count("mem_create"),
            releases = gca_sim_call_count("mem_release");
    gca_stats_t before = stats();
    assert_ok(gca_sim_fault_set(specs[k]));
    void *p = NULL;
    assert_status(gca_malloc(&p, 30 * MiB, NULL), GCA_ERR_DRIVER, ops_[k]);
    gca_sim_fault_clear();
    assert_null(p);
    check();
    assert_int_equal(gca_sim_call_count("mem_create") - creates, made[k]);
    assert_int_equal(gca_sim_call_count("mem_release") - releases, made[k]);
    assert_int_equal(gca_sim_used_bytes(0), 10 * MiB);
    gca_stats_t after = stats();
    assert_int_equal(after.reserved_bytes[GCA_STAT_ALL].current,
                     before.reserved_bytes[GCA_STAT_ALL].current);
    assert_int_equal(after.num_device_alloc, before.num_device_alloc);
    assert_int_equal(live[0], 0xfeedu);
    void *q = alloc_on(30 * MiB, NULL); /* the range is usable again */
    assert_ptr_equal(q, (char *)live + 10 * MiB);
    free_ok(q);
    free_ok(live);
    expect_all_returned_after(0, 0);
  }
}

/* mem_create failing is an out-of-memory condition: released cache, retried. */
static void mem_create_fault_is_retried(void **state) {
  (void)state;
  assert_ok(gca_sim_fault_set("mem_create:nth=1"));
  void *p = alloc_on(10 * MiB, NULL);
  gca_sim_fault_clear();
  assert_int_equal(stats().num_alloc_retries, 1);
  assert_int_equal(gca_sim_call_count("mem_create"), 6); /* 1 failed, 5 granules */
  assert_int_equal(gca_sim_call_count("mem_release"), 0);
  free_ok(p);
  expect_all_returned_after(1, 0);
}

static void mem_create_failing_always_is_an_oom_with_the_usual_fields(void **state) {
  (void)state;
  void *keep = alloc_on(10 * MiB, NULL);
  assert_ok(gca_sim_fault_set("mem_create:always"));
  void *p;
  assert_status(gca_malloc(&p, 30 * MiB, NULL), GCA_ERR_OUT_OF_MEMORY, "reserved 10.00 MiB");
  assert_non_null(strstr(gca_last_error(), "allocated 10.00 MiB"));
  gca_sim_fault_clear();
  check();
  assert_int_equal(stats().num_ooms, 1);
  assert_int_equal(gca_sim_used_bytes(0), 10 * MiB);
  int64_t failed = gca_sim_call_count("mem_create") - 5; /* keep's 5 granules */
  free_ok(keep);
  expect_all_returned_after(failed, 0);
}

/* A refused reservation is an out-of-memory condition: retried once, and
 * when it keeps failing, an OOM that leaves no segment behind. */
static void reserve_fault_leaves_nothing(void **state) {
  (void)state;
  assert_ok(gca_sim_fault_set("mem_address_reserve:nth=1"));
  void *p = alloc_on(10 * MiB, NULL);
  assert_int_equal(stats().num_alloc_retries, 1);
  free_ok(p);
  expect_all_returned_after(0, 1);
  assert_ok(gca_sim_fault_set("mem_address_reserve:always"));
  /* the report speaks of physical memory; a warning says what ran out */
  char errpath[] = "/tmp/gca-test-reserve-XXXXXX";
  int cap = mkstemp(errpath);
  assert_true(cap >= 0);
  unlink(errpath);
  fflush(stderr);
  int saved = dup(2);
  dup2(cap, 2);
  gca_log_level_t level = gca_get_log_level();
  gca_set_log_level(GCA_LOG_WARN);
  gca_status_t st = gca_malloc(&p, 10 * MiB, NULL);
  gca_set_log_level(level);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char text[1024] = {0};
  ssize_t got = pread(cap, text, sizeof(text) - 1, 0);
  close(cap);
  assert_true(got > 0);
  assert_int_equal(st, GCA_ERR_OUT_OF_MEMORY);
  assert_non_null(strstr(gca_last_error(), "out of memory"));
  assert_non_null(strstr(text, "no address space left for another expandable segment"));
  assert_non_null(strstr(text, "mem_address_reserve"));
  gca_sim_fault_clear();
  check();
  assert_int_equal(layout().nsegs, 0);
  assert_int_equal(gca_sim_call_count("mem_create"), gca_sim_call_count("mem_release"));
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void unmap_fault_keeps_the_mapping(void **state) {
  (void)state;
  void *a = alloc_on(10 * MiB, NULL);
  void *b = alloc_on(10 * MiB, NULL);
  free_ok(a);
  assert_ok(gca_sim_fault_set("mem_unmap:nth=1"));
  assert_status(gca_empty_cache(), GCA_ERR_DRIVER, "mem_unmap");
  gca_sim_fault_clear();
  check();
  assert_int_equal(reserved_now(), 20 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 20 * MiB);
  free_ok(b);
  expect_all_returned_after(0, 0);
}

/* Unmapping synchronizes the owning stream only: slow work on another stream
 * is still held when empty_cache returns. */
static void unmap_syncs_only_the_owning_stream(void **state) {
  (void)state;
  gca_stream_t own, other;
  gca_event_t ev;
  assert_ok(gca_stream_create(&own, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&other, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_event_create(&ev, GCA_EVENT_DISABLE_TIMING));
  void *p = alloc_on(10 * MiB, own);
  free_ok(p);
  atomic_store(&gate, 0);
  assert_ok(gca_launch_host_func(other, hold_stream, NULL));
  assert_ok(gca_event_record(ev, other));
  gca_sim_counters_reset();
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_call_count("stream_synchronize"), 1);
  assert_int_equal(gca_sim_call_count("ctx_synchronize"), 0);
  /* 5 granules, 5 releases, one unmap of the run (Note [Sim whole mappings]) */
  assert_int_equal(gca_sim_call_count("mem_unmap"), 1);
  assert_int_equal(gca_sim_call_count("mem_release"), 5);
  assert_int_equal(gca_event_query(ev), GCA_ERR_NOT_READY);
  check();
  assert_int_equal(gca_sim_used_bytes(0), 0);
  atomic_store(&gate, 1);
  assert_ok(gca_stream_synchronize(other));
  assert_ok(gca_event_destroy(ev));
  assert_ok(gca_stream_destroy(own));
  assert_ok(gca_stream_destroy(other));
}

static void history_records_map_and_unmap(void **state) {
  (void)state;
  assert_ok(gca_record_history(true, 64, false));
  void *p = alloc_on(10 * MiB, NULL);
  free_ok(p);
  assert_ok(gca_empty_cache());
  gca_history_entry_t *e = NULL;
  size_t n = 0;
  assert_ok(gca__history_copy(0, &e, &n));
  int maps = 0, unmaps = 0, seg_allocs = 0;
  for (size_t i = 0; i < n; i++) {
    maps += e[i].action == GCA_HA_SEGMENT_MAP && e[i].addr == (uintptr_t)p && e[i].size == 10 * MiB;
    unmaps += e[i].action == GCA_HA_SEGMENT_UNMAP && e[i].addr == (uintptr_t)p;
    seg_allocs += e[i].action == GCA_HA_SEGMENT_ALLOC;
  }
  free(e);
  assert_int_equal(maps, 1);
  assert_int_equal(unmaps, 1);
  assert_int_equal(seg_allocs, 0);
  assert_ok(gca_record_history(false, 0, false));
}

typedef struct seen {
  int n;
  bool expandable;
  size_t total;
} seen_t;

static void walk_fn(const gca_segment_info_t *seg, const gca_block_info_t *blocks, size_t nblocks,
                    void *ctx) {
  seen_t *seen = ctx;
  size_t sum = 0;
  for (size_t i = 0; i < nblocks; i++)
    sum += blocks[i].size;
  assert_int_equal(sum, seg->total_size);
  seen->n++;
  seen->expandable = seg->is_expandable;
  seen->total += seg->total_size;
}

static void walk_reports_expandable_with_mapped_size(void **state) {
  (void)state;
  seen_t seen = {0, false, 0};
  void *p = alloc_on(12 * MiB, NULL);
  assert_ok(gca__allocator_walk(0, walk_fn, &seen));
  assert_int_equal(seen.n, 1);
  assert_true(seen.expandable);
  assert_int_equal(seen.total, 12 * MiB);
  free_ok(p);
  expect_all_returned();
}

/* ---- peer access: a recording wrapper around the sim's mem_set_access ---- */

static gca_device_ops_t wrapped;
static int last_ndevs, set_access_calls;
static bool last_has_peer;

static gca_status_t rec_set_access(gca_devptr_t ptr, size_t size, const int *devs, int ndevs) {
  last_ndevs = ndevs;
  last_has_peer = false;
  for (int i = 0; i < ndevs; i++)
    last_has_peer |= devs[i] == 1;
  set_access_calls++;
  return gca__sim_ops()->mem_set_access(ptr, size, devs, ndevs);
}

static void peer_access_covers_existing_and_new_mappings(void **state) {
  (void)state;
  assert_nothing_leaked();
  gca__allocator_reset();
  wrapped = *gca__sim_ops();
  wrapped.mem_set_access = rec_set_access;
  gca__device_override(&wrapped);
  assert_ok(gca_set_config("expandable_segments:True"));
  set_access_calls = 0;
  void *a = alloc_on(10 * MiB, NULL);
  void *b = alloc_on(4 * KiB, NULL);
  assert_int_equal(set_access_calls, 2);
  assert_int_equal(last_ndevs, 1);
  assert_ok(gca_enable_peer_access(0, 1));
  assert_int_equal(set_access_calls, 4); /* one per existing mapping */
  assert_int_equal(last_ndevs, 2);
  assert_true(last_has_peer);
  assert_ok(gca_enable_peer_access(0, 1)); /* already on: nothing to do */
  assert_int_equal(set_access_calls, 4);
  void *c = alloc_on(30 * MiB, NULL);
  assert_int_equal(set_access_calls, 5);
  assert_int_equal(last_ndevs, 2);
  assert_true(last_has_peer);
  assert_status(gca_enable_peer_access(0, 7), GCA_ERR_INVALID_ARGUMENT, "enable_peer_access");
  assert_status(gca_enable_peer_access(0, 0), GCA_ERR_INVALID_ARGUMENT,
                "device 0 is not a peer of itself"); /* as cuCtxEnablePeerAccess */
  check();
  free_ok(a);
  free_ok(b);
  free_ok(c);
  expect_all_returned();
  gca__device_override(gca__sim_ops());
}

static gca_status_t small_granularity(int device, bool recommended, size_t *out) {
  (void)device;
  (void)recommended;
  *out = 256; /* a power of two, but below the 512-byte block size */
  return GCA_OK;
}

/* One granularity rule for both kinds of VMM segment: a granularity that is
 * not a multiple of 512 bytes is refused by VMM-backed classic segments
 * (ipc_handles) as by expandable ones, and nothing is cached, so the next
 * query (a sane driver) succeeds. */
static void granularity_below_512_bytes_is_refused_by_both_segment_kinds(void **state) {
  (void)state;
  void *p = NULL;
  assert_nothing_leaked();
  gca__allocator_reset();
  wrapped = *gca__sim_ops();
  wrapped.mem_granularity = small_granularity;
  gca__device_override(&wrapped);
  assert_ok(gca_set_config("expandable_segments:False,ipc_handles:True"));
  assert_status(gca_malloc(&p, 4 * KiB, NULL), GCA_ERR_DRIVER, "power of two multiple of 512");
  assert_null(p);
  check();
  assert_int_equal(gca__devalloc_peek(0)->granularity, 0);
  assert_ok(gca_set_config("ipc_handles:False,expandable_segments:True"));
  assert_status(gca_malloc(&p, 4 * KiB, NULL), GCA_ERR_DRIVER, "power of two multiple of 512");
  assert_null(p);
  check();
  assert_int_equal(gca__devalloc_peek(0)->granularity, 0);
  wrapped.mem_granularity = gca__sim_ops()->mem_granularity; /* the allocator holds &wrapped */
  assert_ok(gca_set_config("expandable_segments:False,ipc_handles:True"));
  void *a = alloc_on(4 * KiB, NULL);
  assert_int_equal(gca__devalloc_peek(0)->granularity, 2 * MiB);
  free_ok(a);
  expect_all_returned();
  gca__device_override(gca__sim_ops());
}

/* Classic segments backed by VMM handles (ipc_handles:True) carry their one
 * mapping in seg->maps too, and a peer enabled later must reach it. */
static void peer_access_covers_existing_vmm_backed_classic_segments(void **state) {
  (void)state;
  assert_nothing_leaked();
  gca__allocator_reset();
  wrapped = *gca__sim_ops();
  wrapped.mem_set_access = rec_set_access;
  gca__device_override(&wrapped);
  assert_ok(gca_set_config("ipc_handles:True"));
  set_access_calls = 0;
  void *a = alloc_on(10 * MiB, NULL);
  assert_int_equal(set_access_calls, 1);
  assert_int_equal(last_ndevs, 1);
  assert_ok(gca_enable_peer_access(0, 1));
  assert_int_equal(set_access_calls, 2);
  assert_int_equal(last_ndevs, 2);
  assert_true(last_has_peer);
  void *b = alloc_on(30 * MiB, NULL);
  assert_int_equal(set_access_calls, 3);
  assert_true(last_has_peer);
  check();
  free_ok(a);
  free_ok(b);
  expect_all_returned();
  gca__device_override(gca__sim_ops());
}

static void peer_access_fault_leaves_the_peer_off(void **state) {
  (void)state;
  void *a = alloc_on(10 * MiB, NULL);
  assert_ok(gca_sim_fault_set("mem_set_access:nth=1"));
  assert_status(gca_enable_peer_access(0, 1), GCA_ERR_DRIVER, "mem_set_access");
  gca_sim_fault_clear();
  check();
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_int_equal(d->npeers, 0);
  assert_ok(gca_enable_peer_access(0, 1));
  assert_int_equal(d->npeers, 1);
  free_ok(a);
  expect_all_returned();
}

/* Classic segments (cudaMalloc'd) are reached by a peer once
 * gca_enable_peer_access has enabled peer access between the contexts, as
 * PyTorch's cudaDeviceEnablePeerAccess does. Runs first: peer access, once
 * enabled, stays enabled for the process. */
static void peer_access_reaches_classic_segments(void **state) {
  (void)state;
  const gca_device_ops_t *ops = gca__sim_ops();
  assert_ok(gca_set_config("expandable_segments:False"));
  char *a = alloc_on(4 * MiB, NULL);
  gca_devptr_t p = (gca_devptr_t)(uintptr_t)a;
  gca_stream_t s1;
  assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &s1));
  assert_status(ops->kernel_fill_u32(p, 1, 1, 16, s1), GCA_ERR_ILLEGAL_ADDRESS,
                "device 1 has not enabled peer access to device 0");
  assert_ok(gca_enable_peer_access(0, 1));
  assert_ok(ops->kernel_fill_u32(p, 1, 1, 16, s1));
  assert_ok(ops->stream_synchronize(s1));
  assert_int_equal(((uint32_t *)a)[5], 6);
  assert_ok(gca_enable_peer_access(0, 1)); /* the driver's "already enabled" is no error */
  assert_ok(ops->stream_destroy(s1));
  check();
  free_ok(a);
  expect_all_returned();
}

/* An injected failure of the peer-access op comes back through
 * gca_enable_peer_access naming both devices, grants nothing (device 1's
 * kernels still cannot reach device 0's segment) and leaves the allocator
 * valid; enabling again then gives device 1 access. */
static void peer_access_op_fault_surfaces_and_grants_nothing(void **state) {
  (void)state;
  const gca_device_ops_t *ops = gca__sim_ops();
  char *a = alloc_on(10 * MiB, NULL);
  gca_devptr_t p = (gca_devptr_t)(uintptr_t)a;
  gca_stream_t s1;
  assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &s1));
  assert_ok(gca_sim_fault_set("ctx_enable_peer_access:nth=1"));
  assert_status(gca_enable_peer_access(0, 1), GCA_ERR_DRIVER,
                "enable_peer_access: device 1 to device 0: ctx_enable_peer_access: injected fault");
  gca_sim_fault_clear();
  check();
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_int_equal(d->npeers, 0);
  assert_status(ops->kernel_fill_u32(p, 1, 1, 16, s1), GCA_ERR_ILLEGAL_ADDRESS,
                "device 1 cannot access");
  assert_ok(gca_enable_peer_access(0, 1));
  assert_int_equal(d->npeers, 1);
  assert_ok(ops->kernel_fill_u32(p, 1, 1, 16, s1));
  assert_ok(ops->stream_synchronize(s1));
  assert_int_equal(((uint32_t *)a)[3], 4);
  assert_ok(ops->stream_destroy(s1));
  free_ok(a);
  expect_all_returned();
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, exp_setup, exp_teardown)
      T(peer_access_reaches_classic_segments),
      T(growth_maps_a_handle_per_granule_and_opens_the_range_once),
      T(small_requests_grow_the_small_pool_by_two_mib),
      T(free_tail_block_plus_unmapped_space_is_one_fit),
      T(the_hole_that_maps_least_serves_a_growth),
      T(a_hole_before_a_free_block_maps_at_its_end),
      T(holes_move_to_serve_a_larger_request),
      T(a_move_needs_no_room_under_the_limit),
      T(granules_a_live_block_touches_stay_mapped),
      T(every_stream_and_pool_has_its_own_segment),
      T(data_survives_growth_and_release),
      T(fault_mid_growth_is_undone),
      T(mem_create_fault_is_retried),
      T(mem_create_failing_always_is_an_oom_with_the_usual_fields),
      T(reserve_fault_leaves_nothing),
      T(unmap_fault_keeps_the_mapping),
      T(unmap_syncs_only_the_owning_stream),
      T(history_records_map_and_unmap),
      T(walk_reports_expandable_with_mapped_size),
      T(peer_access_covers_existing_and_new_mappings),
      T(granularity_below_512_bytes_is_refused_by_both_segment_kinds),
      T(peer_access_covers_existing_vmm_backed_classic_segments),
      T(peer_access_fault_leaves_the_peer_off),
      T(peer_access_op_fault_surfaces_and_grants_nothing),
#undef T
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
