/* json.h - a small JSON writer and a small strict JSON parser.
 *
 * The writer appends to a growable buffer and keeps a sticky status: calls
 * after the first failure (out of memory, misuse such as a value in an object
 * without a key, nesting deeper than GCA_JSON_MAX_DEPTH) do nothing, and
 * gca__json_writer_finish() reports it. Commas and key/value colons are placed
 * by the writer, so call sites read as the document they produce. Strings are
 * escaped (quote, backslash, control characters) and bytes that are not valid
 * UTF-8 are written as \ufffd, so the output is always valid JSON.
 *
 * The parser accepts exactly RFC 8259 JSON (no comments, no trailing commas,
 * no lone surrogates, valid UTF-8 only) into a DOM; a malformed document is
 * GCA_ERR_PARSE with its line, column and byte offset in the detail.
 */
#ifndef GCA_COMMON_JSON_H
#define GCA_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define GCA_JSON_MAX_DEPTH 128

/* ---- writer ---- */

/* Invariants: buf[len] == '\0' whenever buf != NULL; len < cap;
 * 0 <= depth <= GCA_JSON_MAX_DEPTH; in_object[d] says whether level d is an
 * object; count[d] = items already written at level d (a comma precedes the
 * next one when > 0); after_key: a key was written and its value is due. */
typedef struct gca_json_writer {
  char *buf;
  size_t len, cap;
  int depth;
  bool after_key;
  bool done; /* the top-level value is complete */
  gca_status_t status;
  const char *error; /* what went wrong first, repeated by finish */
  bool in_object[GCA_JSON_MAX_DEPTH + 1];
  size_t count[GCA_JSON_MAX_DEPTH + 1];
} gca_json_writer_t;

/* ---- json.c ---- */

void gca__json_writer_init(gca_json_writer_t *w);
/* Releases the buffer (not needed after a successful finish). */
void gca__json_writer_free(gca_json_writer_t *w);
/* The sticky status, with the detail naming the first failure; on
 * success hands over the NUL-terminated text (*out malloc'd; len optional) and
 * resets the writer. Incomplete documents are GCA_ERR_INVALID_STATE. */
gca_status_t gca__json_writer_finish(gca_json_writer_t *w, char **out, size_t *len);

void gca__json_object_begin(gca_json_writer_t *w);
void gca__json_object_end(gca_json_writer_t *w);
void gca__json_array_begin(gca_json_writer_t *w);
void gca__json_array_end(gca_json_writer_t *w);
/* The key of the next member; valid only directly inside an object. */
void gca__json_key(gca_json_writer_t *w, const char *key);
void gca__json_string(gca_json_writer_t *w, const char *s); /* NULL writes null */
void gca__json_string_n(gca_json_writer_t *w, const char *s, size_t n);
void gca__json_int(gca_json_writer_t *w, int64_t v);
void gca__json_uint(gca_json_writer_t *w, uint64_t v);
/* Shortest text that reads back to the same double; NaN and infinities,
 * which JSON cannot spell, are written as null. */
void gca__json_double(gca_json_writer_t *w, double v);
void gca__json_bool(gca_json_writer_t *w, bool v);
void gca__json_null(gca_json_writer_t *w);

/* ---- parser (DOM) ---- */

typedef enum gca_json_type {
  GCA_JSON_NULL = 0,
  GCA_JSON_BOOL,
  GCA_JSON_NUMBER,
  GCA_JSON_STRING,
  GCA_JSON_ARRAY,
  GCA_JSON_OBJECT,
} gca_json_type_t;

typedef struct gca_json_value gca_json_value_t;

/* A parsed value. Numbers keep their exact integer value when the text is an
 * integer that fits (has_i64 / has_u64); d is always set. Strings are
 * NUL-terminated and may contain embedded NULs (len is authoritative).
 * Objects keep members in document order; keys[i] names values[i]. */
struct gca_json_value {
  gca_json_type_t type;
  union {
    bool b;
    struct {
      double d;
      bool has_i64, has_u64;
      int64_t i64;
      uint64_t u64;
    } num;
    struct {
      char *s;
      size_t len;
    } str;
    struct {
      gca_json_value_t *items;
      size_t count;
    } arr;
    struct {
      char **keys;
      gca_json_value_t *values;
      size_t count;
    } obj;
  } u;
};

/* Parses `len` bytes of `text` into *out (free with gca__json_free).
 * GCA_ERR_PARSE "json: line L column C (offset O): <what was expected>"; the
 * offset is also stored in *err_offset when given. */
gca_status_t gca__json_parse(const char *text, size_t len, gca_json_value_t **out,
                             size_t *err_offset);
void gca__json_free(gca_json_value_t *v);
/* The first member named `key` of an object; NULL when absent or v is not one. */
const gca_json_value_t *gca__json_get(const gca_json_value_t *v, const char *key);
/* Element i of an array; NULL when out of range or v is not one. */
const gca_json_value_t *gca__json_at(const gca_json_value_t *v, size_t i);
/* Elements of an array or members of an object; 0 otherwise. */
size_t gca__json_count(const gca_json_value_t *v);
/* Typed reads: false when v is missing or not of that kind. */
bool gca__json_as_u64(const gca_json_value_t *v, uint64_t *out);
bool gca__json_as_i64(const gca_json_value_t *v, int64_t *out);
bool gca__json_as_double(const gca_json_value_t *v, double *out);
bool gca__json_as_bool(const gca_json_value_t *v, bool *out);
/* The string of a string value; NULL otherwise. */
const char *gca__json_as_string(const gca_json_value_t *v);

#endif
