/* SPDX-License-Identifier: Apache-2.0 */
/* test_tool_util.c - the tools' shared helpers (tools/util.c): the JSON string
 * escaper writes a literal that a JSON reader gives back byte for byte and
 * never writes a raw '<' (the text may sit in an HTML <script> block); a
 * fail point fails its nth pass once, and a bad arming is refused. */
#include "support.h"
#include "json_read.h"
#include "util.h"

static char *escaped(const char *s) {
  static char buf[512];
  FILE *f = fmemopen(buf, sizeof(buf), "w");
  assert_non_null(f);
  tool_json_string(f, s);
  assert_int_equal(fclose(f), 0);
  return buf;
}

static void json_string_escapes_quotes_backslashes_controls_and_less_than(void **state) {
  (void)state;
  assert_string_equal(escaped("plain"), "\"plain\"");
  assert_string_equal(escaped("a\"b\\c"), "\"a\\\"b\\\\c\"");
  assert_string_equal(escaped("l1\nl2\tx\r\x01"), "\"l1\\nl2\\tx\\r\\u0001\"");
  assert_string_equal(escaped("</script>"), "\"\\u003c/script>\"");
  assert_string_equal(escaped("caf\xc3\xa9"), "\"caf\xc3\xa9\""); /* UTF-8 passes through */
  assert_string_equal(escaped(""), "\"\"");
}

static void json_string_reads_back_the_same_text(void **state) {
  (void)state;
  const char *text = "f(\"x\") <a\\b>\n\t\x1f end";
  const char *lit = escaped(text);
  json_t *v = jload(lit, strlen(lit));
  assert_true(json_is_string(v));
  assert_string_equal(json_string_value(v), text);
  assert_null(strchr(lit, '<'));
  json_decref(v);
}

/* Note [Tool fail points]: an armed point fails its nth pass and no other;
 * an arming with no name, a name of 64 bytes or more, or nth 0 is refused
 * with a message and leaves the armed point as it was; clear disarms. */
static void a_fail_point_fails_its_nth_pass_and_bad_armings_are_refused(void **state) {
  (void)state;
  assert_false(TOOL_FAILPOINT("p")); /* nothing armed */
  assert_int_equal(tool_failpoint_arm("p", 2), GCA_OK);
  char long_name[65];
  memset(long_name, 'x', 64);
  long_name[64] = '\0';
  const char *bad[] = {NULL, "", long_name, "q"};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(tool_failpoint_arm(bad[i], i == 3 ? 0 : 1), GCA_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tool_last_error(), "failpoint_arm: a name shorter than 64 bytes"));
  }
  assert_false(TOOL_FAILPOINT("q")); /* another name: not this pass's */
  assert_false(TOOL_FAILPOINT("p"));
  assert_true(TOOL_FAILPOINT("p"));  /* the second pass */
  assert_false(TOOL_FAILPOINT("p")); /* once */
  assert_int_equal(tool_failpoint_arm("p", 1), GCA_OK);
  tool_failpoint_clear();
  assert_false(TOOL_FAILPOINT("p"));
}

/* Note [Churn and the memory]: the read latency of a 4 MiB buffer is a
 * positive time; with no host memory for either of its two buffers it
 * fails with a message, and the next call works again (ASan: nothing leaked). */
static void read_latency_measures_and_fails_cleanly_without_memory(void **state) {
  (void)state;
  double ns = -1;
  assert_int_equal(tool_read_latency_ns(4, &ns), GCA_OK);
  assert_true(ns > 0);
  for (unsigned nth = 1; nth <= 2; nth++) { /* the index array, then the buffer */
    assert_int_equal(tool_failpoint_arm("read_latency_alloc", nth), GCA_OK);
    ns = -1;
    assert_int_equal(tool_read_latency_ns(4, &ns), GCA_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(tool_last_error(), "read_latency: no host memory for a 4 MiB buffer"));
    assert_true(ns == -1); /* untouched */
    tool_failpoint_clear();
  }
  assert_int_equal(tool_read_latency_ns(4, &ns), GCA_OK);
  assert_true(ns > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(json_string_escapes_quotes_backslashes_controls_and_less_than),
      cmocka_unit_test(json_string_reads_back_the_same_text),
      cmocka_unit_test(a_fail_point_fails_its_nth_pass_and_bad_armings_are_refused),
      cmocka_unit_test(read_latency_measures_and_fails_cleanly_without_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
