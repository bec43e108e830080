/* SPDX-License-Identifier: Apache-2.0 */
/* pickle_writer.c - a parsed JSON document (json_reader.h) written as a
 * Python pickle (protocol 4) of the same plain data: objects as dicts,
 * arrays as lists, strings, integers (int64), floats, booleans and None. It
 * is how a gca snapshot becomes the pickle PyTorch's memory viewer opens.
 *
 * The one idea: only the opcodes a plain-data pickle needs, each written by
 * one function, with no memo (values are written where they occur). */
#include <stdlib.h>
#include <string.h>

#include "json_reader.h"

typedef struct pbuf {
  char *p;
  size_t len, cap;
  bool failed;
} pbuf_t;

static void put(pbuf_t *b, const void *data, size_t n) {
  if (b->failed)
    return;
  if (b->len + n > b->cap) {
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->len + n)
      nc *= 2;
    char *g = realloc(b->p, nc);
    if (!g) {
      b->failed = true;
      return;
    }
    b->p = g;
    b->cap = nc;
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
}

static void op(pbuf_t *b, unsigned char c) {
  put(b, &c, 1);
}

static void le(pbuf_t *b, uint64_t v, int n) {
  unsigned char q[8];
  for (int i = 0; i < n; i++)
    q[i] = (unsigned char)(v >> (8 * i));
  put(b, q, (size_t)n);
}

static void put_int(pbuf_t *b, int64_t v) {
  if (v >= 0 && v < 256) {
    op(b, 'K'); /* BININT1 */
    le(b, (uint64_t)v, 1);
  } else if (v >= 0 && v < 65536) {
    op(b, 'M'); /* BININT2 */
    le(b, (uint64_t)v, 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    op(b, 'J'); /* BININT */
    le(b, (uint64_t)(uint32_t)(int32_t)v, 4);
  } else {
    op(b, 0x8a); /* LONG1: 8 bytes of two's complement */
    le(b, 8, 1);
    le(b, (uint64_t)v, 8);
  }
}

static void put_str(pbuf_t *b, const char *s, size_t n) {
  if (n < 256) {
    op(b, 0x8c); /* SHORT_BINUNICODE */
    le(b, n, 1);
  } else {
    op(b, 'X'); /* BINUNICODE */
    le(b, n, 4);
  }
  put(b, s, n);
}

static void put_value(pbuf_t *b, const gca_jv_t *v) {
  switch (v->kind) {
  case GCA_JV_NULL:
    op(b, 'N');
    break;
  case GCA_JV_BOOL:
    op(b, v->b ? 0x88 : 0x89);
    break;
  case GCA_JV_NUMBER:
    if (v->is_int) {
      put_int(b, v->i);
    } else {
      uint64_t bits;
      memcpy(&bits, &v->num, 8);
      op(b, 'G'); /* BINFLOAT, big-endian */
      unsigned char q[8];
      for (int i = 0; i < 8; i++)
        q[i] = (unsigned char)(bits >> (56 - 8 * i));
      put(b, q, 8);
    }
    break;
  case GCA_JV_STRING:
    put_str(b, v->str, v->len);
    break;
  case GCA_JV_ARRAY:
    op(b, ']'); /* EMPTY_LIST, then APPENDS in batches */
    for (size_t i = 0; i < v->n; i += 1000) {
      op(b, '(');
      for (size_t k = i; k < v->n && k < i + 1000; k++)
        put_value(b, &v->items[k]);
      op(b, 'e');
    }
    break;
  case GCA_JV_OBJECT:
    op(b, '}'); /* EMPTY_DICT, then SETITEMS in batches */
    for (size_t i = 0; i < v->n; i += 1000) {
      op(b, '(');
      for (size_t k = i; k < v->n && k < i + 1000; k++) {
        put_str(b, v->keys[k], strlen(v->keys[k]));
        put_value(b, &v->items[k]);
      }
      op(b, 'u');
    }
    break;
  }
}

gca_status_t gca__json_to_pickle(const gca_jv_t *root, char **out, size_t *len) {
  pbuf_t b = {0};
  op(&b, 0x80); /* PROTO 4 */
  op(&b, 4);
  put_value(&b, root);
  op(&b, '.');
  if (b.failed) {
    free(b.p);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "pickle: no host memory for %zu bytes", b.len);
  }
  *out = b.p;
  *len = b.len;
  return GCA_OK;
}
