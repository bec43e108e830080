/* SPDX-License-Identifier: Apache-2.0 */
/* test_json.c - the JSON writer's escaping, separators and misuse reports,
 * and the reader's decoding and errors. What the writer writes is read back with jansson, an
 * independent reader, so "always valid JSON" is checked by something other than the writer. */
#include <jansson.h>
#include <math.h>

#include "gca.h"
#include "support.h"
#include "json_reader.h"

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

/* ---- the reader ---- */

static gca_jv_t *reader_parse_ok(const char *text) {
  gca_jv_t *v = NULL;
  gca_status_t st = gca__json_parse(text, strlen(text), &v);
  if (st != GCA_OK)
    fail_msg("'%s': %s", text, gca_last_error());
  return v;
}

static void reader_decodes_values_escapes_and_surrogates(void **state) {
  (void)state;
  gca_jv_t *v =
      reader_parse_ok("{\"i\": 42, \"x\": -2.5e1, \"big\": 9223372036854775808, \"s\": "
                      "\"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\\u0000z\", \"t\": true, "
                      "\"n\": null, \"i\": 7}");
  const gca_jv_t *i = gca__json_get(v, "i"), *x = gca__json_get(v, "x"),
                 *big = gca__json_get(v, "big");
  assert_true(i->is_int && i->i == 42); /* the first of duplicate keys */
  assert_false(x->is_int);
  assert_true(x->num == -25.0);
  assert_false(big->is_int); /* beyond int64: a double only */
  const gca_jv_t *str = gca__json_get(v, "s");
  static const char want[] = "q\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80\0z";
  assert_int_equal(str->len, sizeof(want) - 1);
  assert_memory_equal(str->str, want, sizeof(want) - 1);
  assert_int_equal(gca__json_get(v, "t")->kind, GCA_JV_BOOL);
  assert_int_equal(gca__json_get(v, "n")->kind, GCA_JV_NULL);
  assert_null(gca__json_get(v, "missing"));
  gca__json_free(v);
}

static void reader_errors_give_the_offset_and_what_was_expected(void **state) {
  (void)state;
  static const struct {
    const char *text, *needle;
  } bad[] = {
      {"", "offset 0: expected a value"},
      {"{\"a\" 1}", "offset 5: expected ':'"},
      {"[1 2]", "offset 3: expected ',' or ']'"},
      {"\"abc", "unterminated string"},
      {"\"a\\qb\"", "bad escape"},
      {"\"\\ud800x\"", "bad escape"},
      {"01", "offset 1: expected the end of the text"},
      {"1.", "expected a digit after '.'"},
      {"1e400", "out of range"},
      {"tru", "expected a value"},
      {"[1] x", "offset 4: expected the end"},
      {"\"a\x01\"", "control character"},
  };
  for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
    gca_jv_t *v = (gca_jv_t *)1;
    gca_status_t st = gca__json_parse(bad[k].text, strlen(bad[k].text), &v);
    if (st != GCA_ERR_PARSE || !strstr(gca_last_error(), bad[k].needle))
      fail_msg("'%s': %s: '%s' (wanted '%s')", bad[k].text, gca_status_name(st), gca_last_error(),
               bad[k].needle);
    assert_null(v);
  }
  /* nesting past the limit is an error, not a stack overflow */
  size_t depth = 100000;
  char *deep = malloc(depth + 1);
  assert_non_null(deep);
  memset(deep, '[', depth);
  deep[depth] = '\0';
  gca_jv_t *v = NULL;
  assert_int_equal(gca__json_parse(deep, depth, &v), GCA_ERR_PARSE);
  assert_non_null(strstr(gca_last_error(), "nesting deeper"));
  free(deep);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(writer_places_commas_and_colons),
      cmocka_unit_test(writer_escapes_quotes_controls_and_bad_utf8),
      cmocka_unit_test(writer_doubles_round_trip_and_non_finite_become_null),
      cmocka_unit_test(writer_reports_misuse_once_and_frees),
      cmocka_unit_test(writer_grows_past_its_first_buffer),
      cmocka_unit_test(reader_decodes_values_escapes_and_surrogates),
      cmocka_unit_test(reader_errors_give_the_offset_and_what_was_expected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
