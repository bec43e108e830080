/* SPDX-License-Identifier: Apache-2.0 */
/* pickle.h - a restricted reader of Python pickles: plain data only.
 *
 * It accepts the binary opcodes that dicts, lists, tuples, strings, bytes,
 * ints, floats, bools, None and the memo need (protocols 2 to 5, frames
 * included) and refuses every opcode that would import a name or call
 * anything (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ,
 * PERSID, EXT...) with an error naming it and its offset, so a malicious
 * pickle is refused before anything of it is used. The text opcodes of
 * protocols 0 and 1 are refused as unsupported. Bounded: a document's values
 * live in one arena freed with it; truncated or corrupted input is
 * GCA_ERR_PARSE with the offset and what was expected. */
#ifndef GCA_TOOLS_PICKLE_H
#define GCA_TOOLS_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef enum py_kind {
  PY_NONE,
  PY_BOOL,
  PY_INT,
  PY_FLOAT,
  PY_STR,
  PY_BYTES,
  PY_LIST,
  PY_TUPLE,
  PY_DICT,
} py_kind_t;

typedef struct py_value py_value_t;
struct py_value {
  py_kind_t kind;
  bool b;
  int64_t i;
  bool big; /* an int beyond int64: i is not meaningful */
  double f;
  const char *s; /* PY_STR, PY_BYTES: len bytes, NUL-terminated */
  size_t len;
  py_value_t **items; /* PY_LIST, PY_TUPLE: n items; PY_DICT: n keys then n values */
  size_t n, cap;
};

typedef struct py_doc py_doc_t;

/* Parses data[0, len); *root is owned by *doc. `name` labels errors. */
gca_status_t py_pickle_load(const void *data, size_t len, const char *name, py_doc_t **doc,
                            const py_value_t **root);
void py_doc_free(py_doc_t *doc);

/* Dict lookup by string key (NULL when absent or not a dict). */
const py_value_t *py_dict_get(const py_value_t *dict, const char *key);
/* The i-th key and value of a dict. */
const py_value_t *py_dict_key(const py_value_t *dict, size_t i);
const py_value_t *py_dict_value(const py_value_t *dict, size_t i);
/* The value as JSON text (dicts' integer keys as strings; non-finite floats
 * as null; bytes as strings); *out is malloc'd and NUL-terminated. */
gca_status_t py_to_json(const py_value_t *v, char **out, size_t *len);
/* Whether data starts like a pickle (PROTO opcode, protocol 2..5). */
bool py_is_pickle(const void *data, size_t len);

#endif
