/* SPDX-License-Identifier: Apache-2.0 */
/* json_read.h - reading JSON in tests with jansson: loading with the
 * reader's line and column in the failure, and typed reads that answer
 * false for a missing member or another kind, so a test says what it wanted. */
#ifndef GCA_TEST_JSON_READ_H
#define GCA_TEST_JSON_READ_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include <cmocka.h>

/* Parses len bytes of text (any value at the top), failing the test with
 * jansson's message, line and column when it is not JSON. */
static inline json_t *jload(const char *text, size_t len) {
  json_error_t err;
  json_t *v = json_loadb(text, len, JSON_DECODE_ANY, &err);
  if (!v)
    fail_msg("not JSON: %s at line %d column %d: '%.60s'", err.text, err.line, err.column, text);
  return v;
}

/* Elements of an array or members of an object; 0 for anything else. */
static inline size_t jcount(const json_t *v) {
  return json_is_object(v) ? json_object_size(v) : json_array_size(v);
}

static inline bool ju64(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return false;
  *out = (uint64_t)json_integer_value(v);
  return true;
}

static inline bool ji64(const json_t *v, int64_t *out) {
  if (!json_is_integer(v))
    return false;
  *out = json_integer_value(v);
  return true;
}

static inline bool jdouble(const json_t *v, double *out) {
  if (!json_is_number(v))
    return false;
  *out = json_number_value(v);
  return true;
}

static inline bool jbool(const json_t *v, bool *out) {
  if (!json_is_boolean(v))
    return false;
  *out = json_is_true(v);
  return true;
}

#endif
