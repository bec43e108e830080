/* SPDX-License-Identifier: Apache-2.0 */
/* json.c - the JSON writer declared in json.h.
 *
 * One growable buffer and a sticky status, so a document is written as a
 * straight sequence of calls and checked once at the end. Reading JSON is not
 * libgca's business: the tools and tests that read it use jansson.
 */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- writer */

void gca__json_writer_init(gca_json_writer_t *w) {
  memset(w, 0, sizeof(*w));
  w->status = GCA_OK;
}

void gca__json_writer_free(gca_json_writer_t *w) {
  free(w->buf);
  gca__json_writer_init(w);
}

static void fail(gca_json_writer_t *w, gca_status_t st, const char *what) {
  if (w->status != GCA_OK)
    return;
  w->error = what;
  w->status = gca__error(st, "json_writer: %s", what);
}

static bool reserve(gca_json_writer_t *w, size_t extra) {
  if (w->status != GCA_OK)
    return false;
  if (w->len + extra < w->cap)
    return true;
  size_t cap = w->cap ? w->cap : 256;
  while (w->len + extra >= cap) {
    if (cap > SIZE_MAX / 2) {
      fail(w, GCA_ERR_OUT_OF_MEMORY, "document larger than the address space");
      return false;
    }
    cap *= 2;
  }
  char *nb = realloc(w->buf, cap);
  if (!nb) {
    fail(w, GCA_ERR_OUT_OF_MEMORY, "cannot grow the document buffer");
    return false;
  }
  w->buf = nb;
  w->cap = cap;
  return true;
}

static void put(gca_json_writer_t *w, const char *s, size_t n) {
  if (!reserve(w, n))
    return;
  memcpy(w->buf + w->len, s, n);
  w->len += n;
  w->buf[w->len] = '\0';
}

/* Writes the separator a new value needs and checks that one may start here. */
static bool value_prefix(gca_json_writer_t *w) {
  if (w->status != GCA_OK)
    return false;
  if (w->done) {
    fail(w, GCA_ERR_INVALID_STATE, "a second top-level value after a complete document");
    return false;
  }
  if (w->depth > 0 && w->in_object[w->depth]) {
    if (!w->after_key) {
      fail(w, GCA_ERR_INVALID_STATE, "a value inside an object without a key");
      return false;
    }
    w->after_key = false;
    return true;
  }
  if (w->depth > 0 && w->count[w->depth]++ > 0)
    put(w, ",", 1);
  return w->status == GCA_OK;
}

static void value_done(gca_json_writer_t *w) {
  if (w->depth == 0)
    w->done = true;
}

static void open_level(gca_json_writer_t *w, bool object) {
  if (!value_prefix(w))
    return;
  if (w->depth >= GCA_JSON_MAX_DEPTH) {
    fail(w, GCA_ERR_INVALID_STATE, "nesting deeper than GCA_JSON_MAX_DEPTH");
    return;
  }
  put(w, object ? "{" : "[", 1);
  w->depth++;
  w->in_object[w->depth] = object;
  w->count[w->depth] = 0;
}

static void close_level(gca_json_writer_t *w, bool object) {
  if (w->status != GCA_OK)
    return;
  if (w->depth == 0 || w->in_object[w->depth] != object || w->after_key) {
    fail(w, GCA_ERR_INVALID_STATE,
         object ? "object_end without a matching object_begin (or after a dangling key)"
                : "array_end without a matching array_begin");
    return;
  }
  put(w, object ? "}" : "]", 1);
  w->depth--;
  value_done(w);
}

void gca__json_object_begin(gca_json_writer_t *w) {
  open_level(w, true);
}
void gca__json_object_end(gca_json_writer_t *w) {
  close_level(w, true);
}
void gca__json_array_begin(gca_json_writer_t *w) {
  open_level(w, false);
}
void gca__json_array_end(gca_json_writer_t *w) {
  close_level(w, false);
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 when invalid
 * (overlong forms, surrogates and code points above U+10FFFF included). */
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned char c = s[0];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xe0) == 0xc0) {
    len = 2, v = c & 0x1f, min = 0x80;
  } else if ((c & 0xf0) == 0xe0) {
    len = 3, v = c & 0x0f, min = 0x800;
  } else if ((c & 0xf8) == 0xf0) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (len > n)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    v = (v << 6) | (s[i] & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
    return 0;
  *cp = v;
  return len;
}

static void put_escaped(gca_json_writer_t *w, const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  put(w, "\"", 1);
  size_t i = 0;
  while (i < n && w->status == GCA_OK) {
    size_t run = i;
    while (run < n && s[run] >= 0x20 && s[run] < 0x80 && s[run] != '"' && s[run] != '\\')
      run++;
    if (run > i) {
      put(w, (const char *)s + i, run - i);
      i = run;
      continue;
    }
    unsigned char c = s[i];
    char esc[8];
    uint32_t cp;
    size_t k;
    switch (c) {
    case '"':
      put(w, "\\\"", 2);
      i++;
      break;
    case '\\':
      put(w, "\\\\", 2);
      i++;
      break;
    case '\b':
      put(w, "\\b", 2);
      i++;
      break;
    case '\f':
      put(w, "\\f", 2);
      i++;
      break;
    case '\n':
      put(w, "\\n", 2);
      i++;
      break;
    case '\r':
      put(w, "\\r", 2);
      i++;
      break;
    case '\t':
      put(w, "\\t", 2);
      i++;
      break;
    default:
      if (c < 0x20) {
        snprintf(esc, sizeof(esc), "\\u%04x", c);
        put(w, esc, 6);
        i++;
      } else if ((k = utf8_seq(s + i, n - i, &cp)) > 0) {
        put(w, (const char *)s + i, k);
        i += k;
      } else {
        put(w, "\\ufffd", 6);
        i++;
      }
    }
  }
  put(w, "\"", 1);
}

void gca__json_key(gca_json_writer_t *w, const char *key) {
  if (w->status != GCA_OK)
    return;
  if (w->depth == 0 || !w->in_object[w->depth] || w->after_key) {
    fail(w, GCA_ERR_INVALID_STATE, "a key outside an object or right after another key");
    return;
  }
  if (!key) {
    fail(w, GCA_ERR_INVALID_ARGUMENT, "NULL key");
    return;
  }
  if (w->count[w->depth]++ > 0)
    put(w, ",", 1);
  put_escaped(w, key, strlen(key));
  put(w, ":", 1);
  w->after_key = true;
}

void gca__json_string_n(gca_json_writer_t *w, const char *s, size_t n) {
  if (!value_prefix(w))
    return;
  put_escaped(w, s, n);
  value_done(w);
}

void gca__json_string(gca_json_writer_t *w, const char *s) {
  if (!s) {
    gca__json_null(w);
    return;
  }
  gca__json_string_n(w, s, strlen(s));
}

static void put_literal(gca_json_writer_t *w, const char *text) {
  if (!value_prefix(w))
    return;
  put(w, text, strlen(text));
  value_done(w);
}

void gca__json_int(gca_json_writer_t *w, int64_t v) {
  char b[24];
  snprintf(b, sizeof(b), "%lld", (long long)v);
  put_literal(w, b);
}

void gca__json_uint(gca_json_writer_t *w, uint64_t v) {
  char b[24];
  snprintf(b, sizeof(b), "%llu", (unsigned long long)v);
  put_literal(w, b);
}

void gca__json_double(gca_json_writer_t *w, double v) {
  if (!isfinite(v)) {
    put_literal(w, "null");
    return;
  }
  char b[32];
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(b, sizeof(b), "%.*g", prec, v);
    if (strtod(b, NULL) == v)
      break;
  }
  put_literal(w, b);
}

void gca__json_bool(gca_json_writer_t *w, bool v) {
  put_literal(w, v ? "true" : "false");
}

void gca__json_null(gca_json_writer_t *w) {
  put_literal(w, "null");
}

gca_status_t gca__json_writer_finish(gca_json_writer_t *w, char **out, size_t *len) {
  if (w->status == GCA_OK && (!w->done || w->depth != 0))
    fail(w, GCA_ERR_INVALID_STATE, "finish before the document is complete");
  if (w->status != GCA_OK) {
    gca_status_t st = gca__error(w->status, "json_writer: %s", w->error);
    free(w->buf);
    gca__json_writer_init(w);
    return st;
  }
  *out = w->buf;
  if (len)
    *len = w->len;
  gca__json_writer_init(w);
  return GCA_OK;
}
