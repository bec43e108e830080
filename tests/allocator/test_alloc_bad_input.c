/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_bad_input.c - misuse by the caller: double free, foreign and
 * interior pointers, the wrong device, record_stream or pointer_info on a
 * freed pointer, sizes near SIZE_MAX or beyond the device, bad devices and
 * settings. Each is a status plus a detail naming the pointer or size, and
 * the allocator's state is unchanged afterwards. And whether such a pointer
 * lies in gca's memory all the same (gca__allocator_owns), which the preload
 * shim asks before it hands a refused free to the CUDA library. */
#include <inttypes.h>

#include "alloc_fixture.h"

static char hex[32];
static const char *hexof(const void *p) {
  snprintf(hex, sizeof(hex), "0x%" PRIx64, (uint64_t)(uintptr_t)p);
  return hex;
}

static void same_stats(const gca_stats_t *a, const gca_stats_t *b) {
  assert_memory_equal(a, b, sizeof(*a));
}

static void double_free_is_reported_and_harmless(void **state) {
  (void)state;
  void *keep = alloc_on(4096, NULL);
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  gca_stats_t before = stats();
  assert_status(gca_free(p), GCA_ERR_INVALID_POINTER, hexof(p));
  assert_non_null(strstr(gca_last_error(), "already freed"));
  check();
  gca_stats_t after = stats();
  same_stats(&before, &after);
  free_ok(keep);
}

static void foreign_pointer_is_rejected(void **state) {
  (void)state;
  void *keep = alloc_on(4096, NULL);
  int local;
  gca_stats_t before = stats();
  assert_status(gca_free(&local), GCA_ERR_INVALID_POINTER, hexof(&local));
  assert_non_null(strstr(gca_last_error(), "not allocated by gca"));
  assert_status(gca_free((void *)(uintptr_t)0x1000), GCA_ERR_INVALID_POINTER, "0x1000");
  check();
  gca_stats_t after = stats();
  same_stats(&before, &after);
  free_ok(keep);
}

static void interior_pointer_is_rejected(void **state) {
  (void)state;
  char *p = alloc_on(4096, NULL);
  gca_stats_t before = stats();
  assert_status(gca_free(p + 512), GCA_ERR_INVALID_POINTER, hexof(p + 512));
  assert_non_null(strstr(gca_last_error(), hexof(p)));
  assert_non_null(strstr(gca_last_error(), "inside"));
  check();
  gca_stats_t after = stats();
  same_stats(&before, &after);
  free_ok(p);
}

static void torch_free_on_wrong_device_keeps_pointer(void **state) {
  (void)state;
  void *p = gca_torch_malloc(1000, 0, NULL);
  assert_non_null(p);
  check();
  gca_clear_last_error();
  gca_torch_free(p, 1000, 3, NULL);
  assert_non_null(strstr(gca_last_error(), "belongs to device 0, not device 3"));
  assert_non_null(strstr(gca_last_error(), hexof(p)));
  check();
  assert_ok(gca_pointer_info(p, NULL, NULL));
  gca_torch_free(p, 1000, 0, NULL);
  check();
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
  assert_null(gca_torch_malloc(-5, 0, NULL));
  assert_non_null(strstr(gca_last_error(), "-5"));
  assert_null(gca_torch_malloc(1000, 42, NULL));
  assert_non_null(strstr(gca_last_error(), "device 42"));
}

static void record_stream_and_info_on_freed_pointer(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  gca_stats_t before = stats();
  assert_status(gca_record_stream(p, s), GCA_ERR_INVALID_POINTER, hexof(p));
  assert_non_null(strstr(gca_last_error(), "record_stream"));
  assert_status(gca_pointer_info(p, NULL, NULL), GCA_ERR_INVALID_POINTER, "pointer_info");
  int local;
  assert_status(gca_record_stream(&local, s), GCA_ERR_INVALID_POINTER, hexof(&local));
  check();
  gca_stats_t after = stats();
  same_stats(&before, &after);
  gca_sim_counters_reset();
  void *q = alloc_on(4096, NULL); /* nothing was left pending */
  assert_int_equal(gca_sim_call_count("event_query"), 0);
  free_ok(q);
  assert_ok(gca_stream_destroy(s));
}

static void huge_sizes_fail_cleanly(void **state) {
  (void)state;
  void *keep = alloc_on(4096, NULL);
  gca_stats_t before = stats();
  const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 511, (size_t)1 << 63};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(sizes); i++) {
    char want[32];
    snprintf(want, sizeof(want), "%zu bytes", sizes[i]);
    void *p = (void *)1;
    assert_status(gca_malloc(&p, sizes[i], NULL), GCA_ERR_OUT_OF_MEMORY, want);
    assert_null(p);
    check();
  }
  gca_stats_t after = stats();
  same_stats(&before, &after);
  void *p;
  assert_status(gca_malloc(&p, (size_t)1 << 40, NULL), GCA_ERR_OUT_OF_MEMORY, "1099511627776");
  check();
  assert_int_equal(stats().num_ooms, 1);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 1);
  free_ok(keep);
}

static void bad_devices_and_arguments(void **state) {
  (void)state;
  void *p;
  assert_status(gca_malloc(NULL, 16, NULL), GCA_ERR_INVALID_ARGUMENT, "malloc");
  assert_status(gca_malloc_device(-1, &p, 16, NULL), GCA_ERR_INVALID_ARGUMENT, "device -1");
  assert_status(gca_malloc_device(99, &p, 16, NULL), GCA_ERR_INVALID_ARGUMENT, "device 99");
  assert_status(gca_set_device(99), GCA_ERR_INVALID_ARGUMENT, "device 99");
  int dev = -1;
  assert_ok(gca_get_device(&dev));
  assert_int_equal(dev, 0);
  assert_status(gca_get_device(NULL), GCA_ERR_INVALID_ARGUMENT, "get_device");
  assert_status(gca_register_oom_observer(NULL, NULL), GCA_ERR_INVALID_ARGUMENT, "observer");
  assert_status(gca_get_config(NULL, 0), GCA_ERR_INVALID_ARGUMENT, "get_config");
  check();
}

static void bad_config_changes_nothing(void **state) {
  (void)state;
  char before[512], after[512];
  assert_ok(gca_set_config("max_split_size_mb:64"));
  assert_ok(gca_get_config(before, sizeof(before)));
  assert_status(gca_set_config("max_split_size_mb:128,bogus_key:1"), GCA_ERR_CONFIG, "bogus_key");
  assert_ok(gca_get_config(after, sizeof(after)));
  assert_string_equal(before, after);
  assert_int_equal(stats().max_split_size, 64 * MiB);
  assert_status(gca_set_config(NULL), GCA_ERR_INVALID_ARGUMENT, "set_config");
}

static void torch_entry_points_round_trip(void **state) {
  (void)state;
  void *p = gca_torch_malloc(3 * 1024 * 1024, 0, NULL);
  assert_non_null(p);
  assert_int_equal(block_size_of(p), 3 * MiB);
  gca_torch_free(p, 3 * 1024 * 1024, 0, NULL);
  check();
  assert_null(gca_torch_malloc(0, 0, NULL));
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
}

/* Run with GCA_SIM_DEVICES=2 (meson sets it): pointers find their own device
 * and a free naming the other device is refused. */
static void two_devices_keep_their_pointers(void **state) {
  (void)state;
  int n = 0;
  assert_ok(gca_device_count(&n));
  if (n < 2)
    skip();
  assert_ok(gca_sim_set_capacity(1, 1 * GiB));
  void *a = alloc_on(4096, NULL);
  void *b = NULL;
  assert_ok(gca_malloc_device(1, &b, 4096, NULL));
  check();
  int dev = -1;
  assert_ok(gca_pointer_info(b, NULL, &dev));
  assert_int_equal(dev, 1);
  gca_clear_last_error();
  gca_torch_free(b, 4096, 0, NULL);
  assert_non_null(strstr(gca_last_error(), "belongs to device 1, not device 0"));
  assert_ok(gca_set_device(1));
  void *c = alloc_on(8192, NULL);
  assert_ok(gca_pointer_info(c, NULL, &dev));
  assert_int_equal(dev, 1);
  assert_ok(gca_set_device(0));
  gca_stats_t s1;
  assert_ok(gca_get_stats(1, &s1));
  assert_int_equal(s1.allocation[GCA_STAT_ALL].current, 2);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 1);
  free_ok(c);
  free_ok(b);
  assert_status(gca_free(b), GCA_ERR_INVALID_POINTER, "device 1");
  free_ok(a);
  assert_ok(gca_empty_cache());
  check();
  assert_int_equal(gca_sim_used_bytes(1), 0);
}

/* A request that would make allocator state for a stream (a new segment, an
 * expandable segment) first asks the device whether the stream is live and
 * belongs to the request's device. */
static void bad_streams_are_refused_before_any_segment(bool expandable) {
  if (expandable)
    assert_ok(gca_set_config("expandable_segments:True"));
  void *p = (void *)1;
  gca_stream_t garbage = (gca_stream_t)(uintptr_t)0x12345678;
  assert_status(gca_malloc(&p, 4096, garbage), GCA_ERR_INVALID_HANDLE,
                "stream 0x12345678 is not a live stream");
  assert_null(p);
  gca_stream_t dead;
  assert_ok(gca_stream_create(&dead, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_destroy(dead));
  assert_status(gca_malloc(&p, 3 * MiB, dead), GCA_ERR_INVALID_HANDLE, "is not a live stream");
  int n = 0;
  assert_ok(gca_device_count(&n));
  if (n >= 2) {
    gca_stream_t other;
    assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &other));
    assert_status(gca_malloc_device(0, &p, 4096, other), GCA_ERR_INVALID_HANDLE,
                  "belongs to device 1, not device 0");
    assert_ok(ops->stream_destroy(other));
  }
  gca_stream_t live;
  assert_ok(gca_stream_create(&live, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_sim_fault_set("stream_get_device:nth=1"));
  assert_status(gca_malloc(&p, 4096, live), GCA_ERR_DRIVER, "stream_get_device");
  gca_sim_fault_clear();
  check();
  gca_stats_t s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
  /* a live stream still works, and its cache hits ask the device nothing */
  p = alloc_on(4096, live);
  free_ok(p);
  int64_t asks = gca_sim_call_count("stream_get_device");
  free_ok(alloc_on(4096, live));
  assert_int_equal(gca_sim_call_count("stream_get_device"), asks);
  assert_ok(gca_empty_cache());
  assert_ok(gca_stream_destroy(live));
  if (expandable)
    assert_ok(gca_set_config(""));
}

static void bad_streams_are_refused_on_a_miss(void **state) {
  (void)state;
  bad_streams_are_refused_before_any_segment(false);
}

static void bad_streams_are_refused_before_an_expandable_segment(void **state) {
  (void)state;
  bad_streams_are_refused_before_any_segment(true);
}

/* ---- gca__allocator_owns ---- */

static bool owned(const void *p, int *dev) {
  return gca__allocator_owns((gca_devptr_t)(uintptr_t)p, dev);
}

typedef struct seg_range {
  gca_devptr_t base;
  size_t extent; /* an expandable segment's whole reservation */
} seg_range_t;

/* The address ranges of device 0's segments, read under its lock. */
static size_t segment_ranges(seg_range_t *out, size_t max) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  size_t n = 0;
  if (d == NULL)
    return 0;
  gca__dev_lock(d);
  for (gca__pool_t *p = &d->small; p != NULL; p = gca__pool_next(d, p))
    for (gca__segment_t *s = p->segments; s != NULL; s = s->next)
      if (n < max)
        out[n++] = (seg_range_t){s->base, s->expandable ? s->reserved_size : s->size};
  gca__dev_unlock(d);
  return n;
}

/* Each segment's first and last byte is device 0's memory of gca; the byte
 * past its end is not, unless another segment starts there. */
static void expect_segments_owned(size_t at_least) {
  seg_range_t r[16];
  size_t n = segment_ranges(r, GCA_ARRAY_SIZE(r));
  assert_true(n >= at_least && n < GCA_ARRAY_SIZE(r));
  for (size_t i = 0; i < n; i++) {
    int dev = -1;
    assert_true(gca__allocator_owns(r[i].base, &dev));
    assert_int_equal(dev, 0);
    assert_true(gca__allocator_owns(r[i].base + r[i].extent - 1, NULL));
    bool next = false;
    for (size_t j = 0; j < n; j++)
      next = next || r[j].base == r[i].base + r[i].extent;
    assert_int_equal(gca__allocator_owns(r[i].base + r[i].extent, NULL), next);
  }
}

static bool only_stream(gca_stream_t stream, void *ctx) {
  return stream == (gca_stream_t)ctx;
}

/* Live, cached and private-pool memory, small and large segments, are gca's
 * from their first byte to their last; foreign memory is not; memory given
 * back to the device is not any more. */
static void ownership_covers_every_segment_whatever_its_blocks_hold(void **state) {
  (void)state;
  gca_pool_options_t o = GCA_POOL_OPTIONS_INIT;
  gca_pool_t *pool = NULL;
  gca_stream_t s;
  assert_ok(gca_pool_create(0, &o, &pool));
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_pool_begin_allocate(pool, only_stream, s));
  char *pooled = alloc_on(4096, s);
  assert_ok(gca_pool_end_allocate(pool));
  char *small = alloc_on(4096, NULL), *large = alloc_on(8 * MiB, NULL);
  int dev = -1;
  assert_true(owned(small, &dev));
  assert_int_equal(dev, 0);
  assert_true(owned(small + 4095, NULL) && owned(large + 8 * MiB - 1, NULL));
  assert_true(owned(pooled + 100, NULL));
  expect_segments_owned(3);
  free_ok(small);
  free_ok(large);
  free_ok(pooled);
  assert_true(owned(small, NULL) && owned(large, NULL) && owned(pooled, NULL)); /* cached */
  expect_segments_owned(3);
  int local;
  assert_false(owned(&local, NULL));
  assert_false(owned((void *)(uintptr_t)0x1000, NULL));
  assert_false(owned(NULL, NULL));
  check();
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_empty_cache());
  assert_false(owned(small, NULL) || owned(large, NULL) || owned(pooled, NULL));
  assert_ok(gca_stream_destroy(s));
}

/* An expandable segment's whole reservation is gca's, mapped or not. */
static void ownership_covers_an_expandable_reservation_mapped_or_not(void **state) {
  (void)state;
  assert_ok(gca_set_config("expandable_segments:True"));
  char *p = alloc_on(4096, NULL);
  seg_range_t r[2];
  assert_int_equal(segment_ranges(r, GCA_ARRAY_SIZE(r)), 1);
  assert_true(stats().reserved_bytes[GCA_STAT_ALL].current < (int64_t)r[0].extent);
  assert_true(owned(p, NULL));
  assert_true(gca__allocator_owns(r[0].base + r[0].extent - 1, NULL)); /* reserved, unmapped */
  expect_segments_owned(1);
  free_ok(p);
  assert_true(owned(p, NULL));
  assert_ok(gca_empty_cache());
  assert_false(owned(p, NULL));
  assert_false(gca__allocator_owns(r[0].base + r[0].extent - 1, NULL));
  assert_ok(gca_set_config(""));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(double_free_is_reported_and_harmless, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(foreign_pointer_is_rejected, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(interior_pointer_is_rejected, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(torch_free_on_wrong_device_keeps_pointer, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(record_stream_and_info_on_freed_pointer, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(huge_sizes_fail_cleanly, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(bad_devices_and_arguments, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(bad_config_changes_nothing, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(torch_entry_points_round_trip, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(two_devices_keep_their_pointers, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(bad_streams_are_refused_on_a_miss, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(bad_streams_are_refused_before_an_expandable_segment,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(ownership_covers_every_segment_whatever_its_blocks_hold,
                                      alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(ownership_covers_an_expandable_reservation_mapped_or_not,
                                      alloc_setup, alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
