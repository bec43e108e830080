/* SPDX-License-Identifier: Apache-2.0 */
/* json_reader.h - a small JSON reader for the documents libgca itself loads
 * (op graphs), so that libgca needs no JSON library (tools and tests read
 * JSON with jansson, which libgca never links).
 *
 * The reader parses a whole document (RFC 8259: one value, whitespace around
 * it) into a tree of gca_jv_t owned by the root. Errors are GCA_ERR_PARSE with
 * the byte offset and what was expected. Bounded: nesting deeper than
 * GCA_JSON_MAX_DEPTH is an error, never a stack overflow. Strings are decoded
 * (escapes, \u surrogate pairs to UTF-8) and may hold NUL bytes (len counts
 * them); object keys keep their order and duplicates (lookups find the first).
 */
#ifndef GCA_COMMON_JSON_READER_H
#define GCA_COMMON_JSON_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "json.h"

typedef enum gca_jv_kind {
  GCA_JV_NULL,
  GCA_JV_BOOL,
  GCA_JV_NUMBER,
  GCA_JV_STRING,
  GCA_JV_ARRAY,
  GCA_JV_OBJECT,
} gca_jv_kind_t;

typedef struct gca_jv {
  gca_jv_kind_t kind;
  size_t offset; /* byte offset of the value in the document */
  bool b;
  double num;
  bool is_int; /* a number written without fraction or exponent that fits int64 */
  int64_t i;
  char *str; /* strings: NUL-terminated, len bytes */
  size_t len;
  struct gca_jv *items; /* arrays: n items; objects: n values, keys[k] naming items[k] */
  char **keys;
  size_t n;
} gca_jv_t;

gca_status_t gca__json_parse(const char *text, size_t len, gca_jv_t **out);
void gca__json_free(gca_jv_t *root);
/* The first value of `key` in an object, or NULL (also for a non-object). */
const gca_jv_t *gca__json_get(const gca_jv_t *obj, const char *key);
const char *gca__json_kind_name(gca_jv_kind_t kind);

/* pickle_writer.c: the document as a pickle (protocol 4) of the same plain
 * data; *out is malloc'd. */
gca_status_t gca__json_to_pickle(const gca_jv_t *root, char **out, size_t *len);

#endif
