/* SPDX-License-Identifier: Apache-2.0 */
/* test_free_blocks.c - gca_get_free_blocks(): the free bytes of a device's
 * segments and the largest free block, as the snapshot walk sees them (cached
 * frees included once flushed), zeros before the device has an allocator, and
 * bad arguments refused. */
#include "alloc_fixture.h"

static void free_bytes_and_largest_block_follow_the_layout(void **state) {
  (void)state;
  uint64_t total = 1, largest = 1;
  assert_ok(gca_get_free_blocks(0, &total, &largest));
  assert_int_equal(total, 0);
  assert_int_equal(largest, 0);
  void *a = alloc_on(4 * MiB, NULL); /* one 20 MiB segment: a, b, c and a 10 MiB tail */
  void *b = alloc_on(2 * MiB, NULL);
  void *c = alloc_on(4 * MiB, NULL);
  assert_ok(gca_get_free_blocks(0, &total, &largest));
  assert_int_equal(total, 10 * MiB);
  assert_int_equal(largest, 10 * MiB);
  free_ok(b); /* a 2 MiB hole between a and c */
  assert_ok(gca_get_free_blocks(0, &total, &largest));
  assert_int_equal(total, 12 * MiB);
  assert_int_equal(largest, 10 * MiB);
  check();
  free_ok(c); /* merges with the hole and the tail */
  assert_ok(gca_get_free_blocks(0, &total, &largest));
  assert_int_equal(total, 16 * MiB);
  assert_int_equal(largest, 16 * MiB);
  free_ok(a);
  assert_ok(gca_empty_cache());
  assert_ok(gca_get_free_blocks(0, &total, &largest));
  assert_int_equal(total, 0);
  assert_int_equal(largest, 0);
}

static void bad_arguments_are_refused(void **state) {
  (void)state;
  uint64_t total = 7, largest = 7;
  assert_status(gca_get_free_blocks(0, NULL, &largest), GCA_ERR_INVALID_ARGUMENT,
                "get_free_blocks: NULL output");
  assert_status(gca_get_free_blocks(0, &total, NULL), GCA_ERR_INVALID_ARGUMENT,
                "get_free_blocks: NULL output");
  assert_status(gca_get_free_blocks(-1, &total, &largest), GCA_ERR_INVALID_ARGUMENT,
                "device -1 is not in [0, 64)");
  assert_status(gca_get_free_blocks(64, &total, &largest), GCA_ERR_INVALID_ARGUMENT,
                "device 64 is not in [0, 64)");
  assert_int_equal(total, 7);
  assert_int_equal(largest, 7);
  check();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(free_bytes_and_largest_block_follow_the_layout, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(bad_arguments_are_refused, alloc_setup, alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
