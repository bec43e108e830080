/* test_json.c - the JSON writer's escaping, separators and misuse reports, and
 * the strict parser: what it accepts, what it rejects and where it says the
 * error is. */
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

static gca_json_value_t *parse_ok(const char *text) {
  gca_json_value_t *v = NULL;
  assert_ok(gca__json_parse(text, strlen(text), &v, NULL));
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
  /* What the writer produces, the parser reads back to the same bytes. */
  gca_json_value_t *v = parse_ok(out);
  assert_string_equal(gca__json_as_string(gca__json_at(v, 0)), "q\"b\\s/\b\f\n\r\t\x01\x1f\x7f");
  assert_string_equal(gca__json_as_string(gca__json_at(v, 1)),
                      "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  assert_int_equal(gca__json_at(v, 3)->u.str.len, 6);
  assert_memory_equal(gca__json_at(v, 3)->u.str.s, "nul\0in", 6);
  assert_int_equal(gca__json_at(v, 4)->type, GCA_JSON_NULL);
  gca__json_free(v);
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
  gca_json_value_t *v = parse_ok(out);
  for (size_t i = 0; i < GCA_ARRAY_SIZE(vals); i++) {
    double d;
    assert_true(gca__json_as_double(gca__json_at(v, i), &d));
    assert_true(d == vals[i]);
  }
  assert_int_equal(gca__json_at(v, GCA_ARRAY_SIZE(vals))->type, GCA_JSON_NULL);
  assert_int_equal(gca__json_at(v, GCA_ARRAY_SIZE(vals) + 1)->type, GCA_JSON_NULL);
  gca__json_free(v);
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
  gca_json_value_t *v = parse_ok(out);
  assert_int_equal(gca__json_count(v), 10000);
  int64_t x;
  assert_true(gca__json_as_i64(gca__json_at(v, 9999), &x));
  assert_int_equal(x, 9999);
  gca__json_free(v);
  free(out);
}

static void parser_reads_every_kind_of_value(void **state) {
  (void)state;
  const char *doc =
      " {\"s\": \"a\\u00e9\\ud83d\\ude00\\/\", \"n\": [0, -0, 12.5e1, -9223372036854775808,"
      " 18446744073709551615, 18446744073709551616, 1E2],"
      " \"t\": true, \"f\": false, \"z\": null, \"o\": {\"x\": {}}, \"dup\": 1,"
      " \"dup\": 2}\n";
  gca_json_value_t *v = parse_ok(doc);
  assert_int_equal(v->type, GCA_JSON_OBJECT);
  assert_int_equal(gca__json_count(v), 8);
  assert_string_equal(gca__json_as_string(gca__json_get(v, "s")), "a\xc3\xa9\xf0\x9f\x98\x80/");
  const gca_json_value_t *n = gca__json_get(v, "n");
  uint64_t u;
  int64_t i;
  double d;
  assert_true(gca__json_as_u64(gca__json_at(n, 0), &u));
  assert_int_equal(u, 0);
  assert_true(gca__json_as_i64(gca__json_at(n, 1), &i));
  assert_int_equal(i, 0);
  assert_false(gca__json_as_i64(gca__json_at(n, 2), &i));
  assert_true(gca__json_as_double(gca__json_at(n, 2), &d));
  assert_true(d == 125.0);
  assert_true(gca__json_as_i64(gca__json_at(n, 3), &i));
  assert_true(i == INT64_MIN);
  assert_false(gca__json_as_u64(gca__json_at(n, 3), &u));
  assert_true(gca__json_as_u64(gca__json_at(n, 4), &u));
  assert_true(u == UINT64_MAX);
  assert_false(gca__json_as_i64(gca__json_at(n, 4), &i));
  assert_false(gca__json_as_u64(gca__json_at(n, 5), &u));
  assert_true(gca__json_as_double(gca__json_at(n, 5), &d));
  assert_true(d == 18446744073709551616.0);
  assert_true(gca__json_as_double(gca__json_at(n, 6), &d));
  assert_true(d == 100.0);
  bool b;
  assert_true(gca__json_as_bool(gca__json_get(v, "t"), &b));
  assert_true(b);
  assert_true(gca__json_as_bool(gca__json_get(v, "f"), &b));
  assert_false(b);
  assert_int_equal(gca__json_get(v, "z")->type, GCA_JSON_NULL);
  assert_int_equal(gca__json_count(gca__json_get(gca__json_get(v, "o"), "x")), 0);
  assert_true(gca__json_as_i64(gca__json_get(v, "dup"), &i));
  assert_int_equal(i, 1); /* first member wins */
  assert_null(gca__json_get(v, "missing"));
  assert_null(gca__json_at(v, 0));
  assert_null(gca__json_at(n, 7));
  assert_null(gca__json_as_string(n));
  gca__json_free(v);

  v = parse_ok("\"top\"");
  assert_string_equal(gca__json_as_string(v), "top");
  gca__json_free(v);
  v = parse_ok("[]");
  assert_int_equal(gca__json_count(v), 0);
  gca__json_free(v);
}

static void parser_rejects_what_rfc8259_rejects(void **state) {
  (void)state;
  static const struct {
    const char *text;
    const char *needle;
  } bad[] = {
      {"", "expected a value"},
      {"   ", "expected a value"},
      {"[1,]", "expected a value"},
      {"{\"a\":1,}", "member name"},
      {"{a:1}", "member name"},
      {"{\"a\" 1}", "':'"},
      {"[1 2]", "',' or ']'"},
      {"{\"a\":1 \"b\":2}", "',' or '}'"},
      {"[1", "',' or ']'"},
      {"01", "end of the document"},
      {"-", "a digit"},
      {"1.", "after '.'"},
      {".5", "expected a value"},
      {"1e", "exponent"},
      {"+1", "expected a value"},
      {"tru", "expected a value"},
      {"nul", "expected a value"},
      {"True", "expected a value"},
      {"\"abc", "closing"},
      {"\"a\tb\"", "control"},
      {"\"\\x\"", "after '\\'"},
      {"\"\\u12g4\"", "hex digits"},
      {"\"\\ud800\"", "low surrogate"},
      {"\"\\ud800\\u0041\"", "low surrogate"},
      {"\"\\udc00\"", "high surrogate"},
      {"\"\xff\"", "UTF-8"},
      {"\"\xc0\xaf\"", "UTF-8"},
      {"\"\xed\xa0\x80\"", "UTF-8"},
      {"{} {}", "end of the document"},
      {"[1] x", "end of the document"},
      {"/* c */ 1", "expected a value"},
      {"NaN", "expected a value"},
  };
  for (size_t k = 0; k < GCA_ARRAY_SIZE(bad); k++) {
    gca_json_value_t *v = (gca_json_value_t *)0x1;
    gca_clear_last_error();
    gca_status_t st = gca__json_parse(bad[k].text, strlen(bad[k].text), &v, NULL);
    if (st != GCA_ERR_PARSE)
      fail_msg("'%s' was accepted", bad[k].text);
    if (!strstr(gca_last_error(), bad[k].needle))
      fail_msg("'%s': detail '%s' does not mention '%s'", bad[k].text, gca_last_error(),
               bad[k].needle);
    assert_ptr_equal(v, (gca_json_value_t *)0x1); /* untouched on failure */
  }
}

static void parser_error_names_line_column_and_offset(void **state) {
  (void)state;
  const char *doc = "{\n  \"a\": [1,\n        2,,]\n}";
  gca_json_value_t *v = NULL;
  size_t off = 0;
  assert_status(gca__json_parse(doc, strlen(doc), &v, &off), GCA_ERR_PARSE,
                "line 3 column 11 (offset 23)");
  assert_int_equal(off, 23);
  assert_int_equal(doc[off], ',');
  assert_null(v);
}

static void parser_limits_depth(void **state) {
  (void)state;
  char deep[2 * (GCA_JSON_MAX_DEPTH + 1) + 1];
  for (int i = 0; i < GCA_JSON_MAX_DEPTH; i++) {
    deep[i] = '[';
    deep[2 * GCA_JSON_MAX_DEPTH - 1 - i] = ']';
  }
  gca_json_value_t *v = NULL;
  assert_ok(gca__json_parse(deep, 2 * GCA_JSON_MAX_DEPTH, &v, NULL));
  gca__json_free(v);

  for (int i = 0; i <= GCA_JSON_MAX_DEPTH; i++) {
    deep[i] = '[';
    deep[2 * (GCA_JSON_MAX_DEPTH + 1) - 1 - i] = ']';
  }
  v = NULL;
  assert_status(gca__json_parse(deep, 2 * (GCA_JSON_MAX_DEPTH + 1), &v, NULL), GCA_ERR_PARSE,
                "deeper");
  assert_null(v);
}

static void parser_frees_partial_documents(void **state) {
  (void)state;
  /* Fails deep inside nested containers holding strings: ASan's leak check
   * proves everything built so far was released. */
  const char *doc =
      "{\"a\":[\"x\",{\"b\":[\"y\",\"z\",{\"c\":\"w\"}],\"d\":\"v\"}],\"e\":[1,2,bad]}";
  gca_json_value_t *v = NULL;
  assert_status(gca__json_parse(doc, strlen(doc), &v, NULL), GCA_ERR_PARSE, "expected a value");
  assert_null(v);
  gca__json_free(NULL);
}

static void parser_respects_the_given_length(void **state) {
  (void)state;
  gca_json_value_t *v = NULL;
  assert_ok(gca__json_parse("[1]garbage", 3, &v, NULL));
  assert_int_equal(gca__json_count(v), 1);
  gca__json_free(v);
  assert_status(gca__json_parse("\"abc\"", 4, &v, NULL), GCA_ERR_PARSE, "closing");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(writer_places_commas_and_colons),
      cmocka_unit_test(writer_escapes_quotes_controls_and_bad_utf8),
      cmocka_unit_test(writer_doubles_round_trip_and_non_finite_become_null),
      cmocka_unit_test(writer_reports_misuse_once_and_frees),
      cmocka_unit_test(writer_grows_past_its_first_buffer),
      cmocka_unit_test(parser_reads_every_kind_of_value),
      cmocka_unit_test(parser_rejects_what_rfc8259_rejects),
      cmocka_unit_test(parser_error_names_line_column_and_offset),
      cmocka_unit_test(parser_limits_depth),
      cmocka_unit_test(parser_frees_partial_documents),
      cmocka_unit_test(parser_respects_the_given_length),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
