/* SPDX-License-Identifier: Apache-2.0 */
/* test_common.c - status names and strings, the thread-local last error,
 * the size/bool parsers that configuration and tools rely on, and the device
 * lock's sleepers. */
#include <pthread.h>
#include <sched.h>

#include "gca.h"
#include "support.h"

static void status_names_and_strings_come_from_one_list(void **state) {
  (void)state;
  assert_string_equal(gca_status_name(GCA_OK), "GCA_OK");
  assert_string_equal(gca_status_name(GCA_ERR_OUT_OF_MEMORY), "GCA_ERR_OUT_OF_MEMORY");
  assert_string_equal(gca_status_string(GCA_ERR_OUT_OF_MEMORY), "out of memory");
  assert_string_equal(gca_status_name((gca_status_t)999), "GCA_UNKNOWN_STATUS");
  assert_string_equal(gca_status_string((gca_status_t)999), "unknown status");
}

static void *set_error_on_other_thread(void *arg) {
  (void)arg;
  gca__error(GCA_ERR_IO, "other thread's failure");
  return NULL;
}

static void last_error_is_per_thread(void **state) {
  (void)state;
  gca_status_t st = gca__error(GCA_ERR_PARSE, "mine: %d", 42);
  assert_int_equal(st, GCA_ERR_PARSE);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, set_error_on_other_thread, NULL), 0);
  pthread_join(t, NULL);
  assert_string_equal(gca_last_error(), "mine: 42");
  gca__error_prefix(GCA_ERR_PARSE, "line %d", 7);
  assert_string_equal(gca_last_error(), "line 7: mine: 42");
  gca_clear_last_error();
  assert_string_equal(gca_last_error(), "");
}

/* A new detail may quote the one before it (gca_last_error() as an argument
 * of the next error): it reads what was there, whole. */
static void a_detail_may_quote_the_last_one(void **state) {
  (void)state;
  assert_int_equal(gca__error(GCA_ERR_DRIVER, "mem_map: injected fault (sim, call %d)", 7),
                   GCA_ERR_DRIVER);
  assert_int_equal(gca__error(GCA_ERR_INVALID_HANDLE, "stream %p is not live (%s)", (void *)0x10,
                              gca_last_error()),
                   GCA_ERR_INVALID_HANDLE);
  assert_string_equal(gca_last_error(),
                      "stream 0x10 is not live (mem_map: injected fault (sim, call 7))");
  gca_clear_last_error();
}

static void sizes_parse_with_binary_units(void **state) {
  (void)state;
  uint64_t v;
  assert_ok(gca__parse_size("4096", &v));
  assert_int_equal(v, 4096);
  assert_ok(gca__parse_size("80GiB", &v));
  assert_int_equal(v, 80ull << 30);
  assert_ok(gca__parse_size("512mb", &v));
  assert_int_equal(v, 512ull << 20);
  assert_ok(gca__parse_size("1.5GiB", &v));
  assert_int_equal(v, 3ull << 29);
  assert_status(gca__parse_size("lots", &v), GCA_ERR_PARSE, "'lots'");
  assert_status(gca__parse_size("12 parsecs", &v), GCA_ERR_PARSE, "parsecs");
  assert_status(gca__parse_size("-5", &v), GCA_ERR_PARSE, "'-5'");
  assert_status(gca__parse_size("99999999TiB", &v), GCA_ERR_PARSE, "overflow");
}

static void bools_parse_in_pytorch_spelling(void **state) {
  (void)state;
  bool b = false;
  assert_ok(gca__parse_bool("True", &b));
  assert_true(b);
  assert_ok(gca__parse_bool("0", &b));
  assert_false(b);
  assert_status(gca__parse_bool("maybe", &b), GCA_ERR_PARSE, "'maybe'");
}

static void version_matches_header(void **state) {
  (void)state;
  assert_int_equal(gca_version(), GCA_VERSION_NUMBER);
  assert_string_equal(gca_version_string(), "0.1.0");
}

static gca__mutex_t sleeper_mu;
static atomic_int sleeper_got;

static void *take_and_let_go(void *arg) {
  (void)arg;
  gca__mutex_lock(&sleeper_mu);
  atomic_store(&sleeper_got, 1);
  gca__mutex_unlock(&sleeper_mu);
  return NULL;
}

/* lock.h: an unlock may miss a sleeper that counted itself just then (its
 * store and its look at the sleepers are not fenced); the sleeper's nap
 * bounds that, so it takes the lock with no wake-up at all. */
static void a_sleeper_gets_the_lock_without_a_wake_up(void **state) {
  (void)state;
  gca__mutex_init(&sleeper_mu);
  gca__mutex_lock(&sleeper_mu);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, take_and_let_go, NULL), 0);
  while (atomic_load(&sleeper_mu.sleepers) == 0) /* it spun, yielded, and sleeps */
    sched_yield();
  GCA__LOCK_DEPTH_ADD(-1);
  atomic_store_explicit(&sleeper_mu.locked, 0, memory_order_release); /* an unlock that missed it */
  pthread_join(t, NULL);
  assert_int_equal(atomic_load(&sleeper_got), 1);
  assert_int_equal(atomic_load(&sleeper_mu.sleepers), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(status_names_and_strings_come_from_one_list),
      cmocka_unit_test(last_error_is_per_thread),
      cmocka_unit_test(a_detail_may_quote_the_last_one),
      cmocka_unit_test(sizes_parse_with_binary_units),
      cmocka_unit_test(bools_parse_in_pytorch_spelling),
      cmocka_unit_test(version_matches_header),
      cmocka_unit_test(a_sleeper_gets_the_lock_without_a_wake_up),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
