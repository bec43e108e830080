/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_rules.c - the size rules of the caching allocator, PyTorch's:
 * rounding (512-byte steps or roundup_power2_divisions), pool choice and
 * segment sizes, splitting, max_split_size and max_non_split_rounding, best
 * fit by (stream, size, address), and coalescing of free neighbours. Tables
 * pin the pure rules; the allocation cases show them on the sim device. */
#include "alloc_fixture.h"

static gca_alloc_config_t cfg_of(const char *conf) {
  gca_alloc_config_t c;
  gca__config_defaults(&c);
  if (conf != NULL)
    assert_ok(gca__config_parse(conf, &c));
  return c;
}

static void round_size_follows_pytorch(void **state) {
  (void)state;
  struct {
    const char *conf;
    size_t size, want;
  } cases[] = {
      {NULL, 1, 512},
      {NULL, 512, 512},
      {NULL, 513, 1024},
      {NULL, 1 * MiB, 1 * MiB},
      {NULL, 1 * MiB + 1, 1 * MiB + 512},
      {NULL, 100 * MiB + 1, 100 * MiB + 512},
      /* divisions apply above 512 * divisions, stepping the power-of-two interval */
      {"roundup_power2_divisions:4", 1200, 1536},
      {"roundup_power2_divisions:4", 2048, 2048},
      {"roundup_power2_divisions:4", 3000, 3072},
      {"roundup_power2_divisions:4", 9000, 10240},
      {"roundup_power2_divisions:4", 4096, 4096},
      {"roundup_power2_divisions:4", 100 * MiB + 1, 112 * MiB},
      {"roundup_power2_divisions:2", 65 * MiB, 96 * MiB},
      {"roundup_power2_divisions:8", 1 * MiB + 1, 1 * MiB + 128 * KiB},
      /* list form: key k MiB sets the interval [k, 2k) MiB (the first key also those
       * below it), '>' the rest */
      {"roundup_power2_divisions:[256:1,512:2,>:8]", 200 * MiB + 1, 200 * MiB + 512},
      {"roundup_power2_divisions:[256:1,512:2,>:8]", 300 * MiB + 1, 300 * MiB + 512},
      {"roundup_power2_divisions:[256:1,512:2,>:8]", 600 * MiB, 640 * MiB}, /* > from 512 on */
      {"roundup_power2_divisions:[256:1,512:2,>:8]", 1100 * MiB, 1152 * MiB},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(cases); i++) {
    gca_alloc_config_t c = cfg_of(cases[i].conf);
    size_t got = gca__alloc_round_size(&c, cases[i].size);
    if (got != cases[i].want)
      fail_msg("case %zu (%s, %zu): got %zu, want %zu", i, cases[i].conf ? cases[i].conf : "-",
               cases[i].size, got, cases[i].want);
  }
}

static void segment_size_by_pool(void **state) {
  (void)state;
  assert_int_equal(gca__alloc_segment_size(512), 2 * MiB);
  assert_int_equal(gca__alloc_segment_size(1 * MiB), 2 * MiB);
  assert_int_equal(gca__alloc_segment_size(1 * MiB + 512), 20 * MiB);
  assert_int_equal(gca__alloc_segment_size(10 * MiB - 512), 20 * MiB);
  assert_int_equal(gca__alloc_segment_size(10 * MiB), 10 * MiB);
  assert_int_equal(gca__alloc_segment_size(10 * MiB + 512), 12 * MiB);
  assert_int_equal(gca__alloc_segment_size(99 * MiB), 100 * MiB);
}

static void split_rules_per_pool(void **state) {
  (void)state;
  gca_alloc_config_t c = cfg_of(NULL);
  assert_true(gca__alloc_should_split(&c, true, 2 * MiB, 2 * MiB - 512));
  assert_false(gca__alloc_should_split(&c, true, 1024, 1024));
  assert_false(gca__alloc_should_split(&c, false, 20 * MiB, 19 * MiB));
  assert_true(gca__alloc_should_split(&c, false, 20 * MiB, 19 * MiB - 512));
  c = cfg_of("max_split_size_mb:100");
  assert_false(gca__alloc_should_split(&c, false, 200 * MiB, 150 * MiB));
  assert_true(gca__alloc_should_split(&c, false, 200 * MiB, 50 * MiB));
}

static void oversize_blocks_fit_only_close_large_requests(void **state) {
  (void)state;
  gca_alloc_config_t c = cfg_of(NULL);
  assert_true(gca__alloc_block_fits(&c, 1000 * MiB, 2 * MiB));
  c = cfg_of("max_split_size_mb:100");
  assert_false(gca__alloc_block_fits(&c, 120 * MiB, 50 * MiB));
  assert_true(gca__alloc_block_fits(&c, 90 * MiB, 50 * MiB));
  assert_true(gca__alloc_block_fits(&c, 120 * MiB, 110 * MiB));
  assert_false(gca__alloc_block_fits(&c, 130 * MiB, 110 * MiB));
  assert_false(gca__alloc_block_fits(&c, 140 * MiB, 110 * MiB));
  c = cfg_of("max_split_size_mb:100,max_non_split_rounding_mb:40");
  assert_true(gca__alloc_block_fits(&c, 140 * MiB, 110 * MiB));
}

static void small_request_splits_small_segment(void **state) {
  (void)state;
  char *a = alloc_on(1000, NULL);
  char *b = alloc_on(1000, NULL);
  assert_ptr_equal(b, a + 1024);
  assert_int_equal(block_size_of(a), 1024);
  gca_stats_t s = stats();
  assert_int_equal(s.segment[GCA_STAT_SMALL].current, 1);
  assert_int_equal(s.reserved_bytes[GCA_STAT_SMALL].current, 2 * MiB);
  assert_int_equal(s.allocated_bytes[GCA_STAT_SMALL].current, 2048);
  assert_int_equal(s.requested_bytes[GCA_STAT_SMALL].current, 2000);
  assert_int_equal(s.inactive_split[GCA_STAT_SMALL].current, 1);
  assert_int_equal(s.inactive_split_bytes[GCA_STAT_SMALL].current, 2 * MiB - 2048);
  assert_int_equal(s.segment[GCA_STAT_LARGE].current, 0);
  free_ok(a);
  free_ok(b);
  layout_t l = layout();
  assert_int_equal(l.nsegs, 1);
  assert_int_equal(l.nblocks[0], 1); /* coalesced back into one block */
  s = stats();
  assert_int_equal(s.inactive_split[GCA_STAT_ALL].current, 0);
}

static void freed_block_is_reused_at_once_on_same_stream(void **state) {
  (void)state;
  void *a = alloc_on(4096, NULL);
  free_ok(a);
  void *b = alloc_on(4000, NULL);
  assert_ptr_equal(a, b);
  assert_int_equal(stats().num_device_alloc, 1);
  free_ok(b);
}

static void large_remainder_split_only_above_one_mib(void **state) {
  (void)state;
  void *a = alloc_on(9 * MiB, NULL); /* 20 MiB segment, 11 MiB remainder split off */
  assert_int_equal(block_size_of(a), 9 * MiB);
  assert_int_equal(stats().reserved_bytes[GCA_STAT_LARGE].current, 20 * MiB);
  assert_int_equal(stats().inactive_split[GCA_STAT_LARGE].current, 1);
  free_ok(a);
  void *b = alloc_on(19 * MiB, NULL); /* 1 MiB remainder is not > 1 MiB: whole block */
  assert_ptr_equal(a, b);
  assert_int_equal(block_size_of(b), 20 * MiB);
  assert_int_equal(stats().inactive_split[GCA_STAT_LARGE].current, 0);
  free_ok(b);
  void *c = alloc_on(11 * MiB, NULL); /* the cached 20 MiB block fits: 9 MiB split off */
  assert_int_equal(block_size_of(c), 11 * MiB);
  free_ok(c);
  assert_ok(gca_empty_cache());
  check();
  void *d = alloc_on(11 * MiB, NULL); /* >= 10 MiB: a 12 MiB segment, 1 MiB stays attached */
  assert_int_equal(block_size_of(d), 12 * MiB);
  assert_int_equal(stats().reserved_bytes[GCA_STAT_LARGE].current, 12 * MiB);
  free_ok(d);
}

static void best_fit_picks_smallest_then_lowest_address(void **state) {
  (void)state;
  char *a = alloc_on(2 * MiB, NULL);
  char *b = alloc_on(4 * MiB, NULL);
  char *c = alloc_on(3 * MiB, NULL);
  char *e = alloc_on(2 * MiB, NULL);
  char *f = alloc_on(2 * MiB, NULL);
  assert_ptr_equal(b, a + 2 * MiB);
  assert_ptr_equal(c, b + 4 * MiB);
  free_ok(a); /* free 2 MiB at the start */
  free_ok(e); /* free 2 MiB between c and f */
  void *g = alloc_on(1536 * KiB, NULL);
  assert_ptr_equal(g, a);                      /* smallest fit, lowest address among equals */
  assert_int_equal(block_size_of(g), 2 * MiB); /* 512 KiB remainder stays attached */
  free_ok(g);
  free_ok(b);
  free_ok(c);
  free_ok(f);
  layout_t l = layout();
  assert_int_equal(l.nsegs, 1);
  assert_int_equal(l.nblocks[0], 1);
}

static void other_stream_does_not_reuse_free_block(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *a = alloc_on(4096, NULL);
  free_ok(a);
  void *b = alloc_on(4096, s);
  assert_ptr_not_equal(a, b);
  assert_int_equal(stats().segment[GCA_STAT_SMALL].current, 2);
  free_ok(b);
  void *c = alloc_on(4096, s);
  assert_ptr_equal(b, c);
  free_ok(c);
  assert_ok(gca_empty_cache());
  assert_ok(gca_stream_destroy(s));
}

static void max_split_size_makes_oversize_blocks(void **state) {
  (void)state;
  assert_ok(gca_set_config("max_split_size_mb:40"));
  gca_stats_t s = stats();
  assert_int_equal(s.max_split_size, 40 * MiB);
  void *a = alloc_on(50 * MiB, NULL);
  s = stats();
  assert_int_equal(s.oversize_allocations.current, 1);
  assert_int_equal(s.oversize_segments.current, 1);
  free_ok(a);
  assert_int_equal(stats().oversize_allocations.current, 0);
  void *b = alloc_on(30 * MiB, NULL); /* splittable request: the oversize block is not used */
  assert_ptr_not_equal(a, b);
  assert_int_equal(stats().segment[GCA_STAT_LARGE].current, 2);
  void *c = alloc_on(45 * MiB, NULL); /* oversize request within 20 MiB: reuses, unsplit */
  assert_ptr_equal(a, c);
  assert_int_equal(block_size_of(c), 50 * MiB);
  free_ok(c);
  void *d = alloc_on(41 * MiB - 512 * KiB, NULL); /* 50 - 40.5 < 20: reused */
  assert_ptr_equal(a, d);
  free_ok(d);
  free_ok(b);
  assert_ok(gca_empty_cache());
  void *big = alloc_on(70 * MiB, NULL);
  free_ok(big);
  void *e = alloc_on(44 * MiB, NULL); /* 70 - 44 >= 20: a new segment */
  assert_ptr_not_equal(big, e);
  free_ok(e);
  s = stats();
  assert_int_equal(s.oversize_segments.current, 2);
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().oversize_segments.current, 0);
}

static void unlimited_max_split_size_reads_minus_one(void **state) {
  (void)state;
  assert_int_equal(stats().max_split_size, -1);
}

static void roundup_divisions_change_block_sizes(void **state) {
  (void)state;
  assert_ok(gca_set_config("roundup_power2_divisions:4"));
  void *a = alloc_on(9000, NULL);
  assert_int_equal(block_size_of(a), 10240);
  assert_int_equal(stats().requested_bytes[GCA_STAT_ALL].current, 9000);
  free_ok(a);
}

static void coalescing_merges_both_neighbours(void **state) {
  (void)state;
  char *p[4];
  for (int i = 0; i < 4; i++)
    p[i] = alloc_on(4096, NULL);
  free_ok(p[0]);
  free_ok(p[2]);
  layout_t l = layout();
  assert_int_equal(l.nblocks[0], 5); /* free, used, free, used, free remainder */
  assert_int_equal(stats().inactive_split[GCA_STAT_SMALL].current, 3);
  free_ok(p[1]); /* merges with p[0] and p[2] */
  l = layout();
  assert_int_equal(l.nblocks[0], 3);
  assert_int_equal(stats().inactive_split[GCA_STAT_SMALL].current, 2);
  free_ok(p[3]);
  l = layout();
  assert_int_equal(l.nblocks[0], 1);
  assert_int_equal(stats().inactive_split[GCA_STAT_SMALL].current, 0);
  assert_int_equal(stats().inactive_split_bytes[GCA_STAT_SMALL].current, 0);
}

static void zero_size_yields_null(void **state) {
  (void)state;
  void *p = (void *)1;
  assert_ok(gca_malloc(&p, 0, NULL));
  assert_null(p);
  assert_ok(gca_free(NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(round_size_follows_pytorch, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(segment_size_by_pool, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(split_rules_per_pool, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(oversize_blocks_fit_only_close_large_requests, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(small_request_splits_small_segment, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(freed_block_is_reused_at_once_on_same_stream, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(large_remainder_split_only_above_one_mib, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(best_fit_picks_smallest_then_lowest_address, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(other_stream_does_not_reuse_free_block, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(max_split_size_makes_oversize_blocks, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(unlimited_max_split_size_reads_minus_one, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(roundup_divisions_change_block_sizes, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(coalescing_merges_both_neighbours, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(zero_size_yields_null, alloc_setup, alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
