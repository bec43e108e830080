/* SPDX-License-Identifier: Apache-2.0 */
/* json_reader.c - the JSON reader (json_reader.h): recursive descent over the
 * text with an explicit depth bound, building a tree whose every allocation
 * belongs to the root.
 *
 * The one idea: the parser never trusts the text — every read checks the end
 * first, every error says the offset and what was expected, and a failure
 * frees what was built so far. */
#include "json_reader.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
  const char *s;
  size_t len, pos;
  int depth;
} parser_t;

static gca_status_t perr(const parser_t *p, const char *what) {
  if (p->pos >= p->len)
    return gca__error(GCA_ERR_PARSE, "json: offset %zu: %s, found the end of the text", p->pos,
                      what);
  unsigned char c = (unsigned char)p->s[p->pos];
  if (c >= 0x20 && c < 0x7f)
    return gca__error(GCA_ERR_PARSE, "json: offset %zu: %s, found '%c'", p->pos, what, c);
  return gca__error(GCA_ERR_PARSE, "json: offset %zu: %s, found byte 0x%02x", p->pos, what, c);
}

static void skip_ws(parser_t *p) {
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' ||
                             p->s[p->pos] == '\r'))
    p->pos++;
}

static bool literal(parser_t *p, const char *word) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
    return false;
  p->pos += n;
  return true;
}

static void jv_clear(gca_jv_t *v) {
  if (v->kind == GCA_JV_STRING) {
    free(v->str);
  } else if (v->kind == GCA_JV_ARRAY || v->kind == GCA_JV_OBJECT) {
    for (size_t i = 0; i < v->n; i++) {
      jv_clear(&v->items[i]);
      if (v->keys)
        free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
  }
  memset(v, 0, sizeof(*v));
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static bool hex4(parser_t *p, uint32_t *out) {
  if (p->len - p->pos < 4)
    return false;
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval(p->s[p->pos + (size_t)i]);
    if (h < 0)
      return false;
    v = v << 4 | (uint32_t)h;
  }
  p->pos += 4;
  *out = v;
  return true;
}

static size_t put_utf8(char *dst, uint32_t cp) {
  if (cp < 0x80) {
    dst[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    dst[0] = (char)(0xc0 | cp >> 6);
    dst[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    dst[0] = (char)(0xe0 | cp >> 12);
    dst[1] = (char)(0x80 | (cp >> 6 & 0x3f));
    dst[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  dst[0] = (char)(0xf0 | cp >> 18);
  dst[1] = (char)(0x80 | (cp >> 12 & 0x3f));
  dst[2] = (char)(0x80 | (cp >> 6 & 0x3f));
  dst[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* At the opening quote: the decoded string (its bytes never exceed the
 * escaped text's, so one buffer of the remaining length suffices). */
static gca_status_t parse_string(parser_t *p, char **out, size_t *outlen) {
  if (p->pos >= p->len || p->s[p->pos] != '"')
    return perr(p, "expected a string");
  p->pos++;
  size_t end = p->pos;
  while (end < p->len && p->s[end] != '"')
    end += p->s[end] == '\\' ? 2 : 1;
  if (end >= p->len) {
    p->pos = p->len;
    return perr(p, "unterminated string");
  }
  char *buf = malloc(end - p->pos + 1);
  if (!buf)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "json: no host memory for a string");
  size_t n = 0;
  while (p->s[p->pos] != '"') {
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c < 0x20) {
      free(buf);
      return perr(p, "control character in a string");
    }
    if (c != '\\') {
      buf[n++] = (char)c;
      p->pos++;
      continue;
    }
    p->pos++;
    char e = p->s[p->pos++];
    uint32_t cp;
    switch (e) {
    case '"':
      buf[n++] = '"';
      break;
    case '\\':
      buf[n++] = '\\';
      break;
    case '/':
      buf[n++] = '/';
      break;
    case 'b':
      buf[n++] = '\b';
      break;
    case 'f':
      buf[n++] = '\f';
      break;
    case 'n':
      buf[n++] = '\n';
      break;
    case 'r':
      buf[n++] = '\r';
      break;
    case 't':
      buf[n++] = '\t';
      break;
    case 'u':
      if (!hex4(p, &cp))
        goto bad_escape;
      if (cp >= 0xd800 && cp < 0xdc00) {
        uint32_t lo;
        if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
          goto bad_escape;
        p->pos += 2;
        if (!hex4(p, &lo) || lo < 0xdc00 || lo >= 0xe000)
          goto bad_escape;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      } else if (cp >= 0xdc00 && cp < 0xe000) {
        goto bad_escape;
      }
      n += put_utf8(buf + n, cp);
      break;
    default:
      goto bad_escape;
    }
  }
  p->pos++;
  buf[n] = '\0';
  *out = buf;
  *outlen = n;
  return GCA_OK;
bad_escape:
  free(buf);
  p->pos--;
  return perr(p, "bad escape in a string");
}

static gca_status_t parse_number(parser_t *p, gca_jv_t *v) {
  size_t start = p->pos;
  bool integral = true;
  if (p->pos < p->len && p->s[p->pos] == '-')
    p->pos++;
  if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
    return perr(p, "expected a digit");
  if (p->s[p->pos] == '0')
    p->pos++;
  else
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
      p->pos++;
  if (p->pos < p->len && p->s[p->pos] == '.') {
    integral = false;
    p->pos++;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
      return perr(p, "expected a digit after '.'");
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
      p->pos++;
  }
  if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    integral = false;
    p->pos++;
    if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
      p->pos++;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
      return perr(p, "expected a digit in the exponent");
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
      p->pos++;
  }
  char tmp[64];
  size_t n = p->pos - start;
  if (n >= sizeof(tmp)) {
    p->pos = start;
    return perr(p, "number longer than 63 characters");
  }
  memcpy(tmp, p->s + start, n);
  tmp[n] = '\0';
  v->kind = GCA_JV_NUMBER;
  v->num = strtod(tmp, NULL);
  if (!isfinite(v->num)) {
    p->pos = start;
    return perr(p, "number out of range");
  }
  if (integral) {
    errno = 0;
    long long i = strtoll(tmp, NULL, 10);
    if (errno == 0) {
      v->is_int = true;
      v->i = (int64_t)i;
    }
  }
  return GCA_OK;
}

static gca_status_t parse_value(parser_t *p, gca_jv_t *v);

static gca_status_t grow(gca_jv_t *v, size_t *cap, bool keys) {
  if (v->n < *cap)
    return GCA_OK;
  size_t ncap = *cap ? *cap * 2 : 4;
  gca_jv_t *items = realloc(v->items, ncap * sizeof(*items));
  if (!items)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "json: no host memory");
  v->items = items;
  if (keys) {
    char **k = realloc(v->keys, ncap * sizeof(*k));
    if (!k)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "json: no host memory");
    v->keys = k;
  }
  *cap = ncap;
  return GCA_OK;
}

static gca_status_t parse_container(parser_t *p, gca_jv_t *v, bool object) {
  char close = object ? '}' : ']';
  size_t cap = 0;
  v->kind = object ? GCA_JV_OBJECT : GCA_JV_ARRAY;
  if (++p->depth > GCA_JSON_MAX_DEPTH)
    return perr(p, "nesting deeper than the reader's limit");
  p->pos++;
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    p->depth--;
    return GCA_OK;
  }
  for (;;) {
    GCA_CHECK(grow(v, &cap, object));
    gca_jv_t *item = &v->items[v->n];
    memset(item, 0, sizeof(*item));
    if (object) {
      char *key = NULL;
      size_t klen;
      skip_ws(p);
      GCA_CHECK(parse_string(p, &key, &klen));
      v->keys[v->n] = key;
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') {
        v->n++; /* the key is freed with the object */
        return perr(p, "expected ':' after a key");
      }
      p->pos++;
    }
    v->n++;
    GCA_CHECK(parse_value(p, item));
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->len && p->s[p->pos] == close) {
      p->pos++;
      p->depth--;
      return GCA_OK;
    }
    return perr(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static gca_status_t parse_value(parser_t *p, gca_jv_t *v) {
  skip_ws(p);
  v->offset = p->pos;
  if (p->pos >= p->len)
    return perr(p, "expected a value");
  switch (p->s[p->pos]) {
  case '{':
    return parse_container(p, v, true);
  case '[':
    return parse_container(p, v, false);
  case '"':
    v->kind = GCA_JV_STRING;
    return parse_string(p, &v->str, &v->len);
  case 't':
  case 'f':
  case 'n':
    if (literal(p, "true") || literal(p, "false")) {
      v->kind = GCA_JV_BOOL;
      v->b = p->s[v->offset] == 't';
      return GCA_OK;
    }
    if (literal(p, "null")) {
      v->kind = GCA_JV_NULL;
      return GCA_OK;
    }
    return perr(p, "expected a value");
  default:
    if (p->s[p->pos] != '-' && (p->s[p->pos] < '0' || p->s[p->pos] > '9'))
      return perr(p, "expected a value");
    return parse_number(p, v);
  }
}

gca_status_t gca__json_parse(const char *text, size_t len, gca_jv_t **out) {
  if (!out || (!text && len))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "json: text or out is NULL");
  *out = NULL;
  gca_jv_t *root = calloc(1, sizeof(*root));
  if (!root)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "json: no host memory");
  parser_t p = {.s = text, .len = len};
  gca_status_t st = parse_value(&p, root);
  if (st == GCA_OK) {
    skip_ws(&p);
    if (p.pos != p.len)
      st = perr(&p, "expected the end of the text after the value");
  }
  if (st != GCA_OK) {
    gca__json_free(root);
    return st;
  }
  *out = root;
  return GCA_OK;
}

void gca__json_free(gca_jv_t *root) {
  if (!root)
    return;
  jv_clear(root);
  free(root);
}

const gca_jv_t *gca__json_get(const gca_jv_t *obj, const char *key) {
  if (!obj || obj->kind != GCA_JV_OBJECT)
    return NULL;
  for (size_t i = 0; i < obj->n; i++)
    if (strcmp(obj->keys[i], key) == 0)
      return &obj->items[i];
  return NULL;
}

const char *gca__json_kind_name(gca_jv_kind_t kind) {
  static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
  return (size_t)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "?";
}
