/* SPDX-License-Identifier: Apache-2.0 */
/* test_tool_util.c - the tools' shared helpers (tools/util.c): the JSON string
 * escaper writes a literal that a JSON reader gives back byte for byte and
 * never writes a raw '<' (the text may sit in an HTML <script> block). */
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(json_string_escapes_quotes_backslashes_controls_and_less_than),
      cmocka_unit_test(json_string_reads_back_the_same_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
