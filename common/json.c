/* json.c - the JSON writer and the strict JSON parser declared in json.h.
 *
 * Writer: one growable buffer and a sticky status, so a document is written as
 * a straight sequence of calls and checked once at the end. Parser: recursive
 * descent over the byte range with an explicit depth bound; every rejection
 * records where it happened, and values are built bottom-up so that a failure
 * at any depth frees exactly what was built.
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

/* ---------------------------------------------------------------- parser */

typedef struct parser {
  const char *s;
  size_t n, pos;
  const char *err; /* first error's description; pos marks where */
} parser_t;

static bool perr(parser_t *p, const char *what) {
  if (!p->err)
    p->err = what;
  return false;
}

static void skip_ws(parser_t *p) {
  while (p->pos < p->n) {
    char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      break;
    p->pos++;
  }
}

static bool parse_value(parser_t *p, gca_json_value_t *v, int depth);

static void free_value(gca_json_value_t *v) {
  switch (v->type) {
  case GCA_JSON_STRING:
    free(v->u.str.s);
    break;
  case GCA_JSON_ARRAY:
    for (size_t i = 0; i < v->u.arr.count; i++)
      free_value(&v->u.arr.items[i]);
    free(v->u.arr.items);
    break;
  case GCA_JSON_OBJECT:
    for (size_t i = 0; i < v->u.obj.count; i++) {
      free(v->u.obj.keys[i]);
      free_value(&v->u.obj.values[i]);
    }
    free(v->u.obj.keys);
    free(v->u.obj.values);
    break;
  default:
    break;
  }
  v->type = GCA_JSON_NULL;
}

static bool read_hex4(parser_t *p, uint32_t *out) {
  if (p->n - p->pos < 4)
    return perr(p, "four hex digits after \\u");
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    int h = gca__hexval(p->s[p->pos]);
    if (h < 0)
      return perr(p, "four hex digits after \\u");
    v = (v << 4) | (uint32_t)h;
    p->pos++;
  }
  *out = v;
  return true;
}

static size_t utf8_encode(uint32_t cp, char *o) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  } else if (cp < 0x800) {
    o[0] = (char)(0xc0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  } else if (cp < 0x10000) {
    o[0] = (char)(0xe0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* Parses a string at p->pos (which is at the opening quote) into a malloc'd
 * NUL-terminated buffer. The decoded text is never longer than the source. */
static bool parse_string(parser_t *p, char **out, size_t *out_len) {
  size_t start = ++p->pos;
  size_t end = start;
  while (end < p->n && p->s[end] != '"') {
    if (p->s[end] == '\\')
      end++;
    end++;
  }
  char *buf = malloc((end > p->n ? p->n : end) - start + 1);
  if (!buf)
    return perr(p, "memory for a string");
  size_t o = 0;
  while (true) {
    if (p->pos >= p->n) {
      free(buf);
      return perr(p, "a closing '\"'");
    }
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '"') {
      p->pos++;
      break;
    }
    if (c < 0x20) {
      free(buf);
      return perr(p, "no raw control characters in a string (escape them)");
    }
    if (c == '\\') {
      if (++p->pos >= p->n) {
        free(buf);
        return perr(p, "an escape after '\\'");
      }
      char e = p->s[p->pos++];
      uint32_t cp;
      switch (e) {
      case '"':
        buf[o++] = '"';
        break;
      case '\\':
        buf[o++] = '\\';
        break;
      case '/':
        buf[o++] = '/';
        break;
      case 'b':
        buf[o++] = '\b';
        break;
      case 'f':
        buf[o++] = '\f';
        break;
      case 'n':
        buf[o++] = '\n';
        break;
      case 'r':
        buf[o++] = '\r';
        break;
      case 't':
        buf[o++] = '\t';
        break;
      case 'u':
        if (!read_hex4(p, &cp)) {
          free(buf);
          return false;
        }
        if (cp >= 0xdc00 && cp <= 0xdfff) {
          p->pos -= 6;
          free(buf);
          return perr(p, "a high surrogate before a low surrogate");
        }
        if (cp >= 0xd800 && cp <= 0xdbff) {
          uint32_t lo;
          if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
            free(buf);
            return perr(p, "a low surrogate \\uDC00-\\uDFFF after a high surrogate");
          }
          p->pos += 2;
          if (!read_hex4(p, &lo)) {
            free(buf);
            return false;
          }
          if (lo < 0xdc00 || lo > 0xdfff) {
            p->pos -= 6;
            free(buf);
            return perr(p, "a low surrogate \\uDC00-\\uDFFF after a high surrogate");
          }
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        o += utf8_encode(cp, buf + o);
        break;
      default:
        p->pos--;
        free(buf);
        return perr(p, "one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u after '\\'");
      }
      continue;
    }
    uint32_t cp;
    size_t k = utf8_seq((const unsigned char *)p->s + p->pos, p->n - p->pos, &cp);
    if (k == 0) {
      free(buf);
      return perr(p, "valid UTF-8");
    }
    memcpy(buf + o, p->s + p->pos, k);
    o += k;
    p->pos += k;
  }
  buf[o] = '\0';
  *out = buf;
  *out_len = o;
  return true;
}

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

static bool parse_number(parser_t *p, gca_json_value_t *v) {
  size_t start = p->pos;
  bool integral = true;
  if (p->pos < p->n && p->s[p->pos] == '-')
    p->pos++;
  if (p->pos >= p->n || !is_digit(p->s[p->pos]))
    return perr(p, "a digit");
  if (p->s[p->pos] == '0')
    p->pos++;
  else
    while (p->pos < p->n && is_digit(p->s[p->pos]))
      p->pos++;
  if (p->pos < p->n && p->s[p->pos] == '.') {
    integral = false;
    p->pos++;
    if (p->pos >= p->n || !is_digit(p->s[p->pos]))
      return perr(p, "a digit after '.'");
    while (p->pos < p->n && is_digit(p->s[p->pos]))
      p->pos++;
  }
  if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    integral = false;
    p->pos++;
    if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
      p->pos++;
    if (p->pos >= p->n || !is_digit(p->s[p->pos]))
      return perr(p, "a digit in the exponent");
    while (p->pos < p->n && is_digit(p->s[p->pos]))
      p->pos++;
  }
  char tmp[64];
  size_t len = p->pos - start;
  char *text = len < sizeof(tmp) ? tmp : malloc(len + 1);
  if (!text)
    return perr(p, "memory for a number");
  memcpy(text, p->s + start, len);
  text[len] = '\0';
  memset(v, 0, sizeof(*v));
  v->type = GCA_JSON_NUMBER;
  v->u.num.d = strtod(text, NULL);
  if (integral) {
    errno = 0;
    if (text[0] == '-') {
      long long x = strtoll(text, NULL, 10);
      if (errno == 0) {
        v->u.num.has_i64 = true;
        v->u.num.i64 = x;
      }
    } else {
      unsigned long long x = strtoull(text, NULL, 10);
      if (errno == 0) {
        v->u.num.has_u64 = true;
        v->u.num.u64 = x;
        if (x <= INT64_MAX) {
          v->u.num.has_i64 = true;
          v->u.num.i64 = (int64_t)x;
        }
      }
    }
  }
  if (text != tmp)
    free(text);
  return true;
}

static bool literal(parser_t *p, const char *word) {
  size_t k = strlen(word);
  if (p->n - p->pos < k || memcmp(p->s + p->pos, word, k) != 0)
    return perr(p, "a value (object, array, string, number, true, false or null)");
  p->pos += k;
  return true;
}

static bool grow(void **items, size_t elem, size_t count, size_t *cap) {
  if (count < *cap)
    return true;
  size_t ncap = *cap ? *cap * 2 : 4;
  void *n = realloc(*items, ncap * elem);
  if (!n)
    return false;
  *items = n;
  *cap = ncap;
  return true;
}

static bool parse_array(parser_t *p, gca_json_value_t *v, int depth) {
  size_t cap = 0;
  v->type = GCA_JSON_ARRAY;
  v->u.arr.items = NULL;
  v->u.arr.count = 0;
  p->pos++;
  skip_ws(p);
  if (p->pos < p->n && p->s[p->pos] == ']') {
    p->pos++;
    return true;
  }
  while (true) {
    if (!grow((void **)&v->u.arr.items, sizeof(gca_json_value_t), v->u.arr.count, &cap))
      return perr(p, "memory for an array");
    if (!parse_value(p, &v->u.arr.items[v->u.arr.count], depth + 1)) {
      free_value(&v->u.arr.items[v->u.arr.count]);
      return false;
    }
    v->u.arr.count++;
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->n && p->s[p->pos] == ']') {
      p->pos++;
      return true;
    }
    return perr(p, "',' or ']' in an array");
  }
}

static bool parse_object(parser_t *p, gca_json_value_t *v, int depth) {
  size_t kcap = 0, vcap = 0;
  v->type = GCA_JSON_OBJECT;
  v->u.obj.keys = NULL;
  v->u.obj.values = NULL;
  v->u.obj.count = 0;
  p->pos++;
  skip_ws(p);
  if (p->pos < p->n && p->s[p->pos] == '}') {
    p->pos++;
    return true;
  }
  while (true) {
    skip_ws(p);
    if (p->pos >= p->n || p->s[p->pos] != '"')
      return perr(p, "a '\"'-quoted member name");
    if (!grow((void **)&v->u.obj.keys, sizeof(char *), v->u.obj.count, &kcap) ||
        !grow((void **)&v->u.obj.values, sizeof(gca_json_value_t), v->u.obj.count, &vcap))
      return perr(p, "memory for an object");
    char *key;
    size_t klen;
    if (!parse_string(p, &key, &klen))
      return false;
    skip_ws(p);
    if (p->pos >= p->n || p->s[p->pos] != ':') {
      free(key);
      return perr(p, "':' after a member name");
    }
    p->pos++;
    if (!parse_value(p, &v->u.obj.values[v->u.obj.count], depth + 1)) {
      free_value(&v->u.obj.values[v->u.obj.count]);
      free(key);
      return false;
    }
    v->u.obj.keys[v->u.obj.count++] = key;
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->n && p->s[p->pos] == '}') {
      p->pos++;
      return true;
    }
    return perr(p, "',' or '}' in an object");
  }
}

/* On failure *v holds whatever was built so far, valid for free_value(). */
static bool parse_value(parser_t *p, gca_json_value_t *v, int depth) {
  v->type = GCA_JSON_NULL;
  skip_ws(p);
  if (p->pos >= p->n)
    return perr(p, "a value (object, array, string, number, true, false or null)");
  char c = p->s[p->pos];
  if ((c == '[' || c == '{') && depth >= GCA_JSON_MAX_DEPTH)
    return perr(p, "nesting no deeper than GCA_JSON_MAX_DEPTH (128)");
  switch (c) {
  case '{':
    return parse_object(p, v, depth);
  case '[':
    return parse_array(p, v, depth);
  case '"':
    v->type = GCA_JSON_STRING;
    v->u.str.s = NULL;
    if (!parse_string(p, &v->u.str.s, &v->u.str.len)) {
      v->type = GCA_JSON_NULL;
      return false;
    }
    return true;
  case 't':
    v->type = GCA_JSON_BOOL;
    v->u.b = true;
    return literal(p, "true");
  case 'f':
    v->type = GCA_JSON_BOOL;
    v->u.b = false;
    return literal(p, "false");
  case 'n':
    return literal(p, "null");
  default:
    if (c == '-' || is_digit(c))
      return parse_number(p, v);
    return perr(p, "a value (object, array, string, number, true, false or null)");
  }
}

gca_status_t gca__json_parse(const char *text, size_t len, gca_json_value_t **out,
                             size_t *err_offset) {
  if (!out || (!text && len > 0))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "json: NULL argument");
  parser_t p = {.s = text, .n = len, .pos = 0, .err = NULL};
  gca_json_value_t *v = calloc(1, sizeof(*v));
  if (!v)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "json: cannot allocate the document");
  bool ok = parse_value(&p, v, 0);
  if (ok) {
    skip_ws(&p);
    if (p.pos < p.n)
      ok = perr(&p, "the end of the document after the top-level value");
  }
  if (!ok) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p.pos && i < p.n; i++) {
      if (text[i] == '\n') {
        line++;
        col = 1;
      } else {
        col++;
      }
    }
    free_value(v);
    free(v);
    if (err_offset)
      *err_offset = p.pos;
    return gca__error(GCA_ERR_PARSE, "json: line %zu column %zu (offset %zu): expected %s", line,
                      col, p.pos, p.err);
  }
  *out = v;
  return GCA_OK;
}

void gca__json_free(gca_json_value_t *v) {
  if (!v)
    return;
  free_value(v);
  free(v);
}

const gca_json_value_t *gca__json_get(const gca_json_value_t *v, const char *key) {
  if (!v || v->type != GCA_JSON_OBJECT || !key)
    return NULL;
  for (size_t i = 0; i < v->u.obj.count; i++)
    if (strcmp(v->u.obj.keys[i], key) == 0)
      return &v->u.obj.values[i];
  return NULL;
}

const gca_json_value_t *gca__json_at(const gca_json_value_t *v, size_t i) {
  if (!v || v->type != GCA_JSON_ARRAY || i >= v->u.arr.count)
    return NULL;
  return &v->u.arr.items[i];
}

size_t gca__json_count(const gca_json_value_t *v) {
  if (!v)
    return 0;
  if (v->type == GCA_JSON_ARRAY)
    return v->u.arr.count;
  if (v->type == GCA_JSON_OBJECT)
    return v->u.obj.count;
  return 0;
}

bool gca__json_as_u64(const gca_json_value_t *v, uint64_t *out) {
  if (!v || v->type != GCA_JSON_NUMBER || !v->u.num.has_u64)
    return false;
  *out = v->u.num.u64;
  return true;
}

bool gca__json_as_i64(const gca_json_value_t *v, int64_t *out) {
  if (!v || v->type != GCA_JSON_NUMBER || !v->u.num.has_i64)
    return false;
  *out = v->u.num.i64;
  return true;
}

bool gca__json_as_double(const gca_json_value_t *v, double *out) {
  if (!v || v->type != GCA_JSON_NUMBER)
    return false;
  *out = v->u.num.d;
  return true;
}

bool gca__json_as_bool(const gca_json_value_t *v, bool *out) {
  if (!v || v->type != GCA_JSON_BOOL)
    return false;
  *out = v->u.b;
  return true;
}

const char *gca__json_as_string(const gca_json_value_t *v) {
  if (!v || v->type != GCA_JSON_STRING)
    return NULL;
  return v->u.str.s;
}
