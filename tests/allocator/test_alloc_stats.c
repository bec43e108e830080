/* test_alloc_stats.c - every statistic (PyTorch's names and meaning) after
 * scripted sequences: current, peak, allocated and freed per pool, the event
 * counters, resets of peaks and of accumulated values. */
#include "alloc_fixture.h"

#define expect_stat(st, cur, pk, al, fr)                                                       \
  do {                                                                                         \
    gca_stat_t s_ = (st);                                                                      \
    if (s_.current != (cur) || s_.peak != (pk) || s_.allocated != (al) || s_.freed != (fr))    \
      fail_msg(                                                                                \
          "%s = {cur %lld, peak %lld, alloc %lld, freed %lld}, want {%lld, %lld, %lld, %lld}", \
          #st, (long long)s_.current, (long long)s_.peak, (long long)s_.allocated,             \
          (long long)s_.freed, (long long)(cur), (long long)(pk), (long long)(al),             \
          (long long)(fr));                                                                    \
  } while (0)

enum { ALL = GCA_STAT_ALL, SMALL = GCA_STAT_SMALL, LARGE = GCA_STAT_LARGE };

static void scripted_sequence_counts_every_stat(void **state) {
  (void)state;
  const int64_t k = 1024, m = 1 << 20;
  void *a = alloc_on(1000, NULL);
  gca_stats_t s = stats();
  expect_stat(s.allocation[SMALL], 1, 1, 1, 0);
  expect_stat(s.allocation[LARGE], 0, 0, 0, 0);
  expect_stat(s.segment[SMALL], 1, 1, 1, 0);
  expect_stat(s.active[SMALL], 1, 1, 1, 0);
  expect_stat(s.inactive_split[SMALL], 1, 1, 1, 0);
  expect_stat(s.allocated_bytes[SMALL], k, k, k, 0);
  expect_stat(s.reserved_bytes[SMALL], 2 * m, 2 * m, 2 * m, 0);
  expect_stat(s.active_bytes[SMALL], k, k, k, 0);
  expect_stat(s.inactive_split_bytes[SMALL], 2 * m - k, 2 * m - k, 2 * m - k, 0);
  expect_stat(s.requested_bytes[SMALL], 1000, 1000, 1000, 0);
  assert_int_equal(s.num_device_alloc, 1);
  assert_int_equal(s.num_device_free, 0);

  void *b = alloc_on(5 * MiB, NULL);
  s = stats();
  expect_stat(s.allocation[LARGE], 1, 1, 1, 0);
  expect_stat(s.allocation[ALL], 2, 2, 2, 0);
  expect_stat(s.segment[ALL], 2, 2, 2, 0);
  expect_stat(s.reserved_bytes[LARGE], 20 * m, 20 * m, 20 * m, 0);
  expect_stat(s.reserved_bytes[ALL], 22 * m, 22 * m, 22 * m, 0);
  expect_stat(s.inactive_split[ALL], 2, 2, 2, 0);
  expect_stat(s.inactive_split_bytes[LARGE], 15 * m, 15 * m, 15 * m, 0);
  expect_stat(s.allocated_bytes[ALL], 5 * m + k, 5 * m + k, 5 * m + k, 0);
  expect_stat(s.requested_bytes[ALL], 5 * m + 1000, 5 * m + 1000, 5 * m + 1000, 0);
  assert_int_equal(s.num_device_alloc, 2);

  free_ok(a);
  s = stats();
  expect_stat(s.allocation[SMALL], 0, 1, 1, 1);
  expect_stat(s.active[SMALL], 0, 1, 1, 1);
  expect_stat(s.active_bytes[SMALL], 0, k, k, k);
  /* the remainder merged back: one whole block, not an inactive split */
  expect_stat(s.inactive_split[SMALL], 0, 1, 1, 1);
  expect_stat(s.inactive_split_bytes[SMALL], 0, 2 * m - k, 2 * m - k, 2 * m - k);
  expect_stat(s.requested_bytes[SMALL], 0, 1000, 1000, 1000);
  expect_stat(s.segment[SMALL], 1, 1, 1, 0);

  void *c = alloc_on(3 * MiB, NULL); /* from b's remainder: 15 -> 12 MiB, still split */
  s = stats();
  expect_stat(s.inactive_split[LARGE], 1, 1, 1, 0);
  expect_stat(s.inactive_split_bytes[LARGE], 12 * m, 15 * m, 15 * m, 3 * m);
  expect_stat(s.segment[LARGE], 1, 1, 1, 0);

  assert_ok(gca_reset_peak_stats(0));
  s = stats();
  expect_stat(s.allocation[ALL], 2, 2, 3, 1);
  expect_stat(s.inactive_split_bytes[LARGE], 12 * m, 12 * m, 15 * m, 3 * m);
  expect_stat(s.reserved_bytes[ALL], 22 * m, 22 * m, 22 * m, 0);

  free_ok(b);
  free_ok(c);
  assert_ok(gca_empty_cache());
  check();
  s = stats();
  expect_stat(s.segment[ALL], 0, 2, 2, 2);
  expect_stat(s.reserved_bytes[ALL], 0, 22 * m, 22 * m, 22 * m);
  expect_stat(s.allocated_bytes[LARGE], 0, 8 * m, 8 * m, 8 * m);
  expect_stat(s.inactive_split[ALL], 0, 2, 3, 3);
  assert_int_equal(s.num_device_alloc, 2);
  assert_int_equal(s.num_device_free, 2);
  assert_int_equal(s.num_alloc_retries, 0);
  assert_int_equal(s.num_ooms, 0);
  assert_int_equal(s.num_sync_all_streams, 1); /* empty_cache waits for pending frees */

  assert_ok(gca_reset_accumulated_stats(0));
  s = stats();
  expect_stat(s.segment[ALL], 0, 2, 0, 0);
  expect_stat(s.reserved_bytes[ALL], 0, 22 * m, 0, 0);
  expect_stat(s.allocation[ALL], 0, 2, 0, 0);
  assert_int_equal(s.num_device_alloc, 0);
  assert_int_equal(s.num_device_free, 0);
  assert_int_equal(s.num_sync_all_streams, 0);
  assert_ok(gca_reset_peak_stats(0));
  s = stats();
  expect_stat(s.reserved_bytes[ALL], 0, 0, 0, 0);
}

static void oversize_stats_follow_max_split_size(void **state) {
  (void)state;
  assert_ok(gca_set_config("max_split_size_mb:32"));
  void *a = alloc_on(40 * MiB, NULL);
  void *b = alloc_on(8 * MiB, NULL);
  gca_stats_t s = stats();
  expect_stat(s.oversize_allocations, 1, 1, 1, 0);
  expect_stat(s.oversize_segments, 1, 1, 1, 0);
  assert_int_equal(s.max_split_size, 32 * MiB);
  free_ok(a);
  free_ok(b);
  assert_ok(gca_empty_cache());
  s = stats();
  expect_stat(s.oversize_allocations, 0, 1, 1, 1);
  expect_stat(s.oversize_segments, 0, 1, 1, 1);
}

static void peaks_track_high_water_marks(void **state) {
  (void)state;
  void *p[8];
  for (int i = 0; i < 8; i++)
    p[i] = alloc_on(64 * KiB, NULL);
  for (int i = 0; i < 8; i++)
    free_ok(p[i]);
  for (int i = 0; i < 3; i++)
    p[i] = alloc_on(64 * KiB, NULL);
  gca_stats_t s = stats();
  expect_stat(s.allocation[ALL], 3, 8, 11, 8);
  expect_stat(s.allocated_bytes[ALL], 3 * 64 * 1024, 8 * 64 * 1024, 11 * 64 * 1024, 8 * 64 * 1024);
  assert_int_equal(s.segment[ALL].current, 1);
  for (int i = 0; i < 3; i++)
    free_ok(p[i]);
}

static void stats_of_unused_device_are_zero(void **state) {
  (void)state;
  gca_stats_t s = stats();
  expect_stat(s.allocation[ALL], 0, 0, 0, 0);
  expect_stat(s.reserved_bytes[ALL], 0, 0, 0, 0);
  assert_int_equal(s.num_device_alloc, 0);
  assert_status(gca_get_stats(0, NULL), GCA_ERR_INVALID_ARGUMENT, "get_stats");
  assert_status(gca_get_stats(9999, &s), GCA_ERR_INVALID_ARGUMENT, "device 9999");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(scripted_sequence_counts_every_stat, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(oversize_stats_follow_max_split_size, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(peaks_track_high_water_marks, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(stats_of_unused_device_are_zero, alloc_setup, alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
