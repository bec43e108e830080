/* SPDX-License-Identifier: Apache-2.0 */
/* test_json.c - the JSON writer's escaping, separators and misuse reports.
 * What it writes is read back with jansson, an independent reader, so
 * "always valid JSON" is checked by something other than the writer. */
#include <jansson.h>
#include <math.h>

#include "gca.h"
#include "support.h"

static char *finish(gca_json_writer_t *w) {
  char *out = NULL;
  size_t len = 0;
  assert_ok(gca__json_writer_finish(w, &out, &len));
  assert_int_equal(len, strlen(out));
  return out;
}

/* The writer's output parsed by jansson (NULs in strings allowed, as the
 * writer escapes them); a rejection fails the test with jansson's words. */
static json_t *parse_ok(const char *text) {
  json_error_t err;
  json_t *v = json_loadb(text, strlen(text), JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
  if (!v)
    fail_msg("jansson rejects '%s': %s at line %d column %d", text, err.text, err.line, err.column);
  return v;
}

static void writer_places_commas_and_colons(void **state) {
  (void)state;
  gca_json_writer_t w;
  gca__json_writer_init(&w);
  gca__json_object_begin(&w);
  gca__json_key(&w, "a");
  gca__json_int(&w, -5);
  gca__json_key(&w, "b");
  gca__json_array_begin(&w);
  gca__json_uint(&w, UINT64_MAX);
  gca__json_bool(&w, true);
  gca__json_bool(&w, false);
  gca__json_null(&w);
  gca__json_object_begin(&w);
  gca__json_object_end(&w);
  gca__json_array_begin(&w);
  gca__json_array_end(&w);
  gca__json_array_end(&w);
  gca__json_key(&w, "c");
  gca__json_double(&w, 0.8);
  gca__json_object_end(&w);
  char *out = finish(&w);
  assert_string_equal(out,
                      "{\"a\":-5,\"b\":[18446744073709551615,true,false,null,{},[]],\"c\":0.8}");
  free(out);
}

static void writer_escapes_quotes_controls_and_bad_utf8(void **state) {
  (void)state;
  gca_json_writer_t w;
  gca__json_writer_init(&w);
  gca__json_array_begin(&w);
  gca__json_string(&w, "q\"b\\s/\b\f\n\r\t\x01\x1f\x7f");
  gca__json_string(&w, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  gca__json_string(&w, "bad\xff\xc3(\xed\xa0\x80x");
  gca__json_string_n(&w, "nul\0in", 6);
  gca__json_string(&w, NULL);
  gca__json_array_end(&w);
  char *out = finish(&w);
  assert_string_equal(out, "[\"q\\\"b\\\\s/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\","
                           "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\","
                           "\"bad\\ufffd\\ufffd(\\ufffd\\ufffd\\ufffdx\","
                           "\"nul\\u0000in\",null]");
  /* What the writer produces, jansson reads back to the same bytes. */
  json_t *v = parse_ok(out);
  assert_string_equal(json_string_value(json_array_get(v, 0)), "q\"b\\s/\b\f\n\r\t\x01\x1f\x7f");
  assert_string_equal(json_string_value(json_array_get(v, 1)),
                      "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  assert_string_equal(json_string_value(json_array_get(v, 2)),
                      "bad\xef\xbf\xbd\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx");
  assert_int_equal(json_string_length(json_array_get(v, 3)), 6);
  assert_memory_equal(json_string_value(json_array_get(v, 3)), "nul\0in", 6);
  assert_true(json_is_null(json_array_get(v, 4)));
  json_decref(v);
  free(out);
}

static void writer_doubles_round_trip_and_non_finite_become_null(void **state) {
  (void)state;
  const double vals[] = {0.0, -1.5, 1e300, 5e-324, 0.1, 1.0 / 3.0, 123456789.125};
  gca_json_writer_t w;
  gca__json_writer_init(&w);
  gca__json_array_begin(&w);
  for (size_t i = 0; i < GCA_ARRAY_SIZE(vals); i++)
    gca__json_double(&w, vals[i]);
  gca__json_double(&w, NAN);
  gca__json_double(&w, INFINITY);
  gca__json_array_end(&w);
  char *out = finish(&w);
  json_t *v = parse_ok(out);
  for (size_t i = 0; i < GCA_ARRAY_SIZE(vals); i++) {
    const json_t *x = json_array_get(v, i);
    assert_true(json_is_number(x));
    assert_true(json_number_value(x) == vals[i]);
  }
  assert_true(json_is_null(json_array_get(v, GCA_ARRAY_SIZE(vals))));
  assert_true(json_is_null(json_array_get(v, GCA_ARRAY_SIZE(vals) + 1)));
  json_decref(v);
  free(out);
}

static void writer_reports_misuse_once_and_frees(void **state) {
  (void)state;
  gca_json_writer_t w;
  char *out = NULL;

  gca__json_writer_init(&w);
  gca__json_object_begin(&w);
  gca__json_int(&w, 1); /* no key */
  gca__json_key(&w, "later");
  gca__json_object_end(&w);
  assert_status(gca__json_writer_finish(&w, &out, NULL), GCA_ERR_INVALID_STATE, "without a key");
  assert_null(out);

  gca__json_writer_init(&w);
  gca__json_array_begin(&w);
  gca__json_key(&w, "k");
  assert_status(gca__json_writer_finish(&w, &out, NULL), GCA_ERR_INVALID_STATE, "key outside");

  gca__json_writer_init(&w);
  gca__json_array_begin(&w);
  gca__json_object_end(&w);
  assert_status(gca__json_writer_finish(&w, &out, NULL), GCA_ERR_INVALID_STATE, "object_end");

  gca__json_writer_init(&w);
  gca__json_array_begin(&w);
  assert_status(gca__json_writer_finish(&w, &out, NULL), GCA_ERR_INVALID_STATE, "complete");

  gca__json_writer_init(&w);
  gca__json_int(&w, 1);
  gca__json_int(&w, 2);
  assert_status(gca__json_writer_finish(&w, &out, NULL), GCA_ERR_INVALID_STATE, "second");

  gca__json_writer_init(&w);
  for (int i = 0; i < GCA_JSON_MAX_DEPTH + 1; i++)
    gca__json_array_begin(&w);
  assert_status(gca__json_writer_finish(&w, &out, NULL), GCA_ERR_INVALID_STATE, "nesting");

  /* A writer abandoned midway is released by writer_free. */
  gca__json_writer_init(&w);
  gca__json_array_begin(&w);
  gca__json_string(&w, "abandoned");
  gca__json_writer_free(&w);
  assert_null(w.buf);
}

static void writer_grows_past_its_first_buffer(void **state) {
  (void)state;
  gca_json_writer_t w;
  gca__json_writer_init(&w);
  gca__json_array_begin(&w);
  for (int i = 0; i < 10000; i++)
    gca__json_int(&w, i);
  gca__json_array_end(&w);
  char *out = finish(&w);
  json_t *v = parse_ok(out);
  assert_int_equal(json_array_size(v), 10000);
  assert_true(json_is_integer(json_array_get(v, 9999)));
  assert_int_equal(json_integer_value(json_array_get(v, 9999)), 9999);
  json_decref(v);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(writer_places_commas_and_colons),
      cmocka_unit_test(writer_escapes_quotes_controls_and_bad_utf8),
      cmocka_unit_test(writer_doubles_round_trip_and_non_finite_become_null),
      cmocka_unit_test(writer_reports_misuse_once_and_frees),
      cmocka_unit_test(writer_grows_past_its_first_buffer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
