/* SPDX-License-Identifier: Apache-2.0 */
/* json.h - a small JSON writer (snapshots, traces, tool reports).
 *
 * The writer appends to a growable buffer and keeps a sticky status: calls
 * after the first failure (out of memory, misuse such as a value in an object
 * without a key, nesting deeper than GCA_JSON_MAX_DEPTH) do nothing, and
 * gca__json_writer_finish() reports it. Commas and key/value colons are placed
 * by the writer, so call sites read as the document they produce. Strings are
 * escaped (quote, backslash, control characters) and bytes that are not valid
 * UTF-8 are written as \ufffd, so the output is always valid JSON.
 *
 * There is no reader here: libgca only writes JSON. The snapshot tool and the
 * tests read it with jansson, which libgca never links.
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

#endif
