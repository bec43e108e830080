/* SPDX-License-Identifier: Apache-2.0 */
/* pickle.c - the restricted pickle reader (pickle.h): a stack machine over
 * the plain-data opcodes, every value allocated in one arena.
 *
 * The one idea: an opcode is either one this file implements — each checks
 * the bytes it needs are there and the stack holds what it pops — or it is
 * refused by name before the machine does anything with it, so no input can
 * make the reader import, call or build an object. */
#include "pickle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH   100000     /* stack entries */
#define MAX_MEMO    (1u << 24) /* memo slots */
#define ARENA_BLOCK (64 * 1024)

struct py_doc {
  char **blocks;
  size_t nblocks, capblocks;
  size_t used; /* in the last block */
  size_t block_size;
};

static void *arena(py_doc_t *d, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (d->nblocks == 0 || d->used + n > d->block_size) {
    size_t bs = n > ARENA_BLOCK ? n : ARENA_BLOCK;
    if (d->nblocks == d->capblocks) {
      size_t nc = d->capblocks ? d->capblocks * 2 : 16;
      char **b = realloc(d->blocks, nc * sizeof(*b));
      if (!b)
        return NULL;
      d->blocks = b;
      d->capblocks = nc;
    }
    char *blk = malloc(bs);
    if (!blk)
      return NULL;
    d->blocks[d->nblocks++] = blk;
    d->used = 0;
    d->block_size = bs;
  }
  void *p = d->blocks[d->nblocks - 1] + d->used;
  d->used += n;
  return p;
}

void py_doc_free(py_doc_t *d) {
  if (!d)
    return;
  for (size_t i = 0; i < d->nblocks; i++)
    free(d->blocks[i]);
  free(d->blocks);
  free(d);
}

typedef struct machine {
  const unsigned char *p;
  size_t len, pos, op_at;
  const char *name;
  py_doc_t *doc;
  py_value_t **stack; /* NULL entries are marks */
  size_t sp, capstack;
  py_value_t **memo;
  size_t capmemo;
  size_t memo_next; /* MEMOIZE's next slot: one past the highest written */
  size_t *marks;    /* stack positions of marks */
  size_t nmarks, capmarks;
} machine_t;

static gca_status_t perr(const machine_t *m, const char *what) {
  return tool_error(GCA_ERR_PARSE, "%s: pickle offset %zu (opcode 0x%02x): %s", m->name, m->op_at,
                    m->op_at < m->len ? m->p[m->op_at] : 0, what);
}

static gca_status_t oom(const machine_t *m) {
  return tool_error(GCA_ERR_OUT_OF_MEMORY, "%s: pickle offset %zu: out of host memory", m->name,
                    m->op_at);
}

static bool need(const machine_t *m, size_t n) {
  return m->len - m->pos >= n;
}

static uint64_t le(const unsigned char *q, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--)
    v = v << 8 | q[i];
  return v;
}

static py_value_t *val(machine_t *m, py_kind_t k) {
  py_value_t *v = arena(m->doc, sizeof(*v));
  if (v) {
    memset(v, 0, sizeof(*v));
    v->kind = k;
  }
  return v;
}

static gca_status_t push(machine_t *m, py_value_t *v) {
  if (!v)
    return oom(m);
  if (m->sp == m->capstack) {
    if (m->capstack >= MAX_DEPTH)
      return perr(m, "the stack is deeper than the reader's limit");
    size_t nc = m->capstack ? m->capstack * 2 : 64;
    py_value_t **s = realloc(m->stack, nc * sizeof(*s));
    if (!s)
      return oom(m);
    m->stack = s;
    m->capstack = nc;
  }
  m->stack[m->sp++] = v;
  return GCA_OK;
}

static gca_status_t pop(machine_t *m, py_value_t **out) {
  size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
  if (m->sp <= floor)
    return perr(m, "pops from an empty stack (or past a mark)");
  *out = m->stack[--m->sp];
  return GCA_OK;
}

static gca_status_t top(machine_t *m, py_value_t **out) {
  size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
  if (m->sp <= floor)
    return perr(m, "reads an empty stack");
  *out = m->stack[m->sp - 1];
  return GCA_OK;
}

static gca_status_t add_item(machine_t *m, py_value_t *c, py_value_t *item) {
  if (c->n == c->cap) {
    size_t nc = c->cap ? c->cap * 2 : 8;
    py_value_t **it = arena(m->doc, nc * sizeof(*it));
    if (!it)
      return oom(m);
    if (c->n)
      memcpy(it, c->items, c->n * sizeof(*it));
    c->items = it;
    c->cap = nc;
  }
  c->items[c->n++] = item;
  return GCA_OK;
}

/* Dict items are kept as pairs [k0, v0, k1, v1, ...]; n counts pairs. */
static gca_status_t dict_set(machine_t *m, py_value_t *d, py_value_t *k, py_value_t *v) {
  if (d->kind != PY_DICT)
    return perr(m, "sets an item of something that is not a dict");
  size_t pairs = d->n;
  d->n = 2 * pairs; /* add_item counts entries */
  gca_status_t st = add_item(m, d, k);
  if (st == GCA_OK)
    st = add_item(m, d, v);
  d->n = st == GCA_OK ? pairs + 1 : pairs;
  return st;
}

static gca_status_t memo_put(machine_t *m, uint64_t idx) {
  py_value_t *v = NULL;
  TOOL_CHECK(top(m, &v));
  if (idx >= MAX_MEMO)
    return perr(m, "memo index beyond the reader's limit");
  if (idx >= m->capmemo) {
    size_t nc = m->capmemo ? m->capmemo : 64;
    while (nc <= idx)
      nc *= 2;
    py_value_t **mm = realloc(m->memo, nc * sizeof(*mm));
    if (!mm)
      return oom(m);
    memset(mm + m->capmemo, 0, (nc - m->capmemo) * sizeof(*mm));
    m->memo = mm;
    m->capmemo = nc;
  }
  m->memo[idx] = v;
  if (idx >= m->memo_next)
    m->memo_next = idx + 1;
  return GCA_OK;
}

static gca_status_t memo_get(machine_t *m, uint64_t idx) {
  if (idx >= m->capmemo || !m->memo[idx])
    return perr(m, "reads a memo slot never written");
  return push(m, m->memo[idx]);
}

static gca_status_t string(machine_t *m, size_t n, py_kind_t k) {
  if (!need(m, n))
    return perr(m, "truncated: a string runs past the end");
  py_value_t *v = val(m, k);
  char *s = v ? arena(m->doc, n + 1) : NULL;
  if (!s)
    return oom(m);
  memcpy(s, m->p + m->pos, n);
  s[n] = '\0';
  m->pos += n;
  v->s = s;
  v->len = n;
  return push(m, v);
}

static gca_status_t mark(machine_t *m) {
  if (m->nmarks == m->capmarks) {
    size_t nc = m->capmarks ? m->capmarks * 2 : 16;
    size_t *mk = realloc(m->marks, nc * sizeof(*mk));
    if (!mk)
      return oom(m);
    m->marks = mk;
    m->capmarks = nc;
  }
  m->marks[m->nmarks++] = m->sp;
  return GCA_OK;
}

/* Pops the stack down to the last mark: items [*first, sp) before the pop. */
static gca_status_t pop_mark(machine_t *m, size_t *first) {
  if (!m->nmarks)
    return perr(m, "needs a mark that is not there");
  *first = m->marks[--m->nmarks];
  return GCA_OK;
}

static const char *refused(unsigned char op) {
  switch (op) {
  case 'c':
    return "GLOBAL";
  case 0x93:
    return "STACK_GLOBAL";
  case 'R':
    return "REDUCE";
  case 'b':
    return "BUILD";
  case 'i':
    return "INST";
  case 'o':
    return "OBJ";
  case 0x81:
    return "NEWOBJ";
  case 0x92:
    return "NEWOBJ_EX";
  case 'P':
    return "PERSID";
  case 'Q':
    return "BINPERSID";
  case 0x82:
  case 0x83:
  case 0x84:
    return "EXT";
  default:
    return NULL;
  }
}

static gca_status_t step(machine_t *m, unsigned char op, bool *stop) {
  py_value_t *a = NULL, *b = NULL, *c = NULL;
  size_t first = 0;
  switch (op) {
  case 0x80: /* PROTO */
    if (!need(m, 1))
      return perr(m, "truncated PROTO");
    if (m->p[m->pos] < 2 || m->p[m->pos] > 5)
      return perr(m, "protocol is not 2 to 5");
    m->pos++;
    return GCA_OK;
  case 0x95: /* FRAME: a length hint */
    if (!need(m, 8))
      return perr(m, "truncated FRAME");
    m->pos += 8;
    return GCA_OK;
  case '.': /* STOP */
    *stop = true;
    return GCA_OK;
  case '(':
    return mark(m);
  case '}':
    return push(m, val(m, PY_DICT));
  case ']':
    return push(m, val(m, PY_LIST));
  case ')':
    return push(m, val(m, PY_TUPLE));
  case 'N':
    return push(m, val(m, PY_NONE));
  case 0x88:
  case 0x89:
    a = val(m, PY_BOOL);
    if (a)
      a->b = op == 0x88;
    return push(m, a);
  case 'J':
  case 'K':
  case 'M': {
    int n = op == 'J' ? 4 : op == 'K' ? 1 : 2;
    if (!need(m, (size_t)n))
      return perr(m, "truncated integer");
    a = val(m, PY_INT);
    if (a) {
      uint64_t v = le(m->p + m->pos, n);
      a->i = n == 4 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v;
    }
    m->pos += (size_t)n;
    return push(m, a);
  }
  case 0x8a:
  case 0x8b: { /* LONG1, LONG4: little-endian two's complement */
    size_t hdr = op == 0x8a ? 1 : 4;
    if (!need(m, hdr))
      return perr(m, "truncated LONG");
    uint64_t n = le(m->p + m->pos, (int)hdr);
    m->pos += hdr;
    if (n > m->len - m->pos)
      return perr(m, "truncated: a LONG runs past the end");
    a = val(m, PY_INT);
    if (!a)
      return oom(m);
    if (n > 8) {
      a->big = true;
    } else if (n > 0) {
      uint64_t v = le(m->p + m->pos, (int)n);
      if (n < 8 && (m->p[m->pos + n - 1] & 0x80))
        v |= ~(uint64_t)0 << (8 * n);
      a->i = (int64_t)v;
    }
    m->pos += (size_t)n;
    return push(m, a);
  }
  case 'G': { /* BINFLOAT: big-endian double */
    if (!need(m, 8))
      return perr(m, "truncated BINFLOAT");
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
      v = v << 8 | m->p[m->pos + (size_t)i];
    m->pos += 8;
    a = val(m, PY_FLOAT);
    if (a)
      memcpy(&a->f, &v, 8);
    return push(m, a);
  }
  case 0x8c:
  case 'X':
  case 0x8d:
  case 'C':
  case 'B':
  case 0x8e: {
    size_t hdr = op == 0x8c || op == 'C' ? 1 : op == 'X' || op == 'B' ? 4 : 8;
    if (!need(m, hdr))
      return perr(m, "truncated string length");
    uint64_t n = le(m->p + m->pos, (int)hdr);
    m->pos += hdr;
    if (n > m->len - m->pos)
      return perr(m, "truncated: a string runs past the end");
    return string(m, (size_t)n, op == 0x8c || op == 'X' || op == 0x8d ? PY_STR : PY_BYTES);
  }
  case 't': /* TUPLE */
    TOOL_CHECK(pop_mark(m, &first));
    a = val(m, PY_TUPLE);
    if (!a)
      return oom(m);
    for (size_t i = first; i < m->sp; i++)
      TOOL_CHECK(add_item(m, a, m->stack[i]));
    m->sp = first;
    return push(m, a);
  case 0x85:
  case 0x86:
  case 0x87: { /* TUPLE1..3 */
    int n = op - 0x84;
    py_value_t *it[3];
    for (int i = n - 1; i >= 0; i--)
      TOOL_CHECK(pop(m, &it[i]));
    a = val(m, PY_TUPLE);
    if (!a)
      return oom(m);
    for (int i = 0; i < n; i++)
      TOOL_CHECK(add_item(m, a, it[i]));
    return push(m, a);
  }
  case 'a': /* APPEND */
    TOOL_CHECK(pop(m, &b));
    TOOL_CHECK(top(m, &a));
    if (a->kind != PY_LIST)
      return perr(m, "appends to something that is not a list");
    return add_item(m, a, b);
  case 'e': /* APPENDS */
    TOOL_CHECK(pop_mark(m, &first));
    if (first == 0)
      return perr(m, "APPENDS without a list below its mark");
    a = m->stack[first - 1];
    if (!a || a->kind != PY_LIST)
      return perr(m, "appends to something that is not a list");
    for (size_t i = first; i < m->sp; i++)
      TOOL_CHECK(add_item(m, a, m->stack[i]));
    m->sp = first;
    return GCA_OK;
  case 's': /* SETITEM */
    TOOL_CHECK(pop(m, &c));
    TOOL_CHECK(pop(m, &b));
    TOOL_CHECK(top(m, &a));
    return dict_set(m, a, b, c);
  case 'u': /* SETITEMS */
    TOOL_CHECK(pop_mark(m, &first));
    if (first == 0 || (m->sp - first) % 2)
      return perr(m, "SETITEMS without a dict below its mark, or with an odd count");
    a = m->stack[first - 1];
    for (size_t i = first; i < m->sp; i += 2)
      TOOL_CHECK(dict_set(m, a, m->stack[i], m->stack[i + 1]));
    m->sp = first;
    return GCA_OK;
  case 'q':
  case 'r': { /* BINPUT, LONG_BINPUT */
    size_t n = op == 'q' ? 1 : 4;
    if (!need(m, n))
      return perr(m, "truncated PUT");
    uint64_t idx = le(m->p + m->pos, (int)n);
    m->pos += n;
    return memo_put(m, idx);
  }
  case 0x94: /* MEMOIZE: the next slot (the memo's length, as Python counts it) */
    return memo_put(m, m->memo_next);
  case 'h':
  case 'j': { /* BINGET, LONG_BINGET */
    size_t n = op == 'h' ? 1 : 4;
    if (!need(m, n))
      return perr(m, "truncated GET");
    uint64_t idx = le(m->p + m->pos, (int)n);
    m->pos += n;
    return memo_get(m, idx);
  }
  case '0': /* POP */
    if (m->nmarks && m->marks[m->nmarks - 1] == m->sp) {
      m->nmarks--;
      return GCA_OK;
    }
    return pop(m, &a);
  case '1': /* POP_MARK */
    TOOL_CHECK(pop_mark(m, &first));
    m->sp = first;
    return GCA_OK;
  case '2': /* DUP */
    TOOL_CHECK(top(m, &a));
    return push(m, a);
  default: {
    const char *name = refused(op);
    if (name)
      return tool_error(GCA_ERR_PARSE,
                        "%s: pickle offset %zu: opcode %s (0x%02x) refused: it would import or "
                        "call code; only plain data is read",
                        m->name, m->op_at, name, op);
    return perr(m, "an opcode this reader does not support (plain data, protocols 2 to 5)");
  }
  }
}

gca_status_t py_pickle_load(const void *data, size_t len, const char *name, py_doc_t **doc,
                            const py_value_t **root) {
  *doc = NULL;
  *root = NULL;
  machine_t m = {.p = data, .len = len, .name = name ? name : "pickle"};
  m.doc = calloc(1, sizeof(*m.doc));
  if (!m.doc)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "%s: out of host memory", m.name);
  gca_status_t st = GCA_OK;
  bool stop = false;
  if (len == 0 || !data)
    st = tool_error(GCA_ERR_PARSE, "%s: an empty pickle", m.name);
  while (st == GCA_OK && !stop) {
    if (m.pos >= m.len) {
      m.op_at = m.pos;
      st = tool_error(GCA_ERR_PARSE, "%s: pickle offset %zu: truncated: no STOP opcode", m.name,
                      m.pos);
      break;
    }
    m.op_at = m.pos;
    unsigned char op = m.p[m.pos++];
    st = step(&m, op, &stop);
  }
  if (st == GCA_OK && (m.sp != 1 || m.nmarks))
    st = tool_error(GCA_ERR_PARSE, "%s: pickle offset %zu: STOP with %zu values on the stack",
                    m.name, m.op_at, m.sp);
  if (st == GCA_OK && m.pos != m.len)
    st = tool_error(GCA_ERR_PARSE, "%s: pickle offset %zu: %zu bytes after STOP", m.name, m.pos,
                    m.len - m.pos);
  if (st == GCA_OK)
    *root = m.stack[0];
  free(m.stack);
  free(m.memo);
  free(m.marks);
  if (st != GCA_OK) {
    py_doc_free(m.doc);
    return st;
  }
  *doc = m.doc;
  return GCA_OK;
}

const py_value_t *py_dict_key(const py_value_t *d, size_t i) {
  return d && d->kind == PY_DICT && i < d->n ? d->items[2 * i] : NULL;
}

const py_value_t *py_dict_value(const py_value_t *d, size_t i) {
  return d && d->kind == PY_DICT && i < d->n ? d->items[2 * i + 1] : NULL;
}

const py_value_t *py_dict_get(const py_value_t *d, const char *key) {
  if (!d || d->kind != PY_DICT)
    return NULL;
  size_t kl = strlen(key);
  for (size_t i = 0; i < d->n; i++) {
    const py_value_t *k = d->items[2 * i];
    if (k->kind == PY_STR && k->len == kl && memcmp(k->s, key, kl) == 0)
      return d->items[2 * i + 1];
  }
  return NULL;
}

bool py_is_pickle(const void *data, size_t len) {
  const unsigned char *p = data;
  return len >= 2 && p[0] == 0x80 && p[1] >= 2 && p[1] <= 5;
}

/* ---- as JSON ---- */

typedef struct jbuf {
  char *p;
  size_t len, cap;
  bool failed;
} jbuf_t;

static void jput(jbuf_t *b, const char *s, size_t n) {
  if (b->failed)
    return;
  if (b->len + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->len + n + 1)
      nc *= 2;
    char *g = realloc(b->p, nc);
    if (!g) {
      b->failed = true;
      return;
    }
    b->p = g;
    b->cap = nc;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void jstr(jbuf_t *b, const char *s, size_t n) {
  jput(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      jput(b, esc, 2);
    } else if (c < 0x20) {
      snprintf(esc, sizeof(esc), "\\u%04x", c);
      jput(b, esc, 6);
    } else {
      jput(b, (const char *)&c, 1);
    }
  }
  jput(b, "\"", 1);
}

static gca_status_t jvalue(jbuf_t *b, const py_value_t *v, int depth) {
  char num[64];
  if (depth > 512)
    return tool_error(GCA_ERR_PARSE, "pickle: nested deeper than 512 levels");
  switch (v->kind) {
  case PY_NONE:
    jput(b, "null", 4);
    break;
  case PY_BOOL:
    jput(b, v->b ? "true" : "false", v->b ? 4 : 5);
    break;
  case PY_INT:
    if (v->big)
      return tool_error(GCA_ERR_PARSE, "pickle: an integer beyond 64 bits");
    snprintf(num, sizeof(num), "%lld", (long long)v->i);
    jput(b, num, strlen(num));
    break;
  case PY_FLOAT:
    if (v->f != v->f || v->f > 1.7976931348623157e308 || v->f < -1.7976931348623157e308)
      jput(b, "null", 4);
    else {
      snprintf(num, sizeof(num), "%.17g", v->f);
      jput(b, num, strlen(num));
    }
    break;
  case PY_STR:
  case PY_BYTES:
    jstr(b, v->s, v->len);
    break;
  case PY_LIST:
  case PY_TUPLE:
    jput(b, "[", 1);
    for (size_t i = 0; i < v->n; i++) {
      if (i)
        jput(b, ",", 1);
      TOOL_CHECK(jvalue(b, v->items[i], depth + 1));
    }
    jput(b, "]", 1);
    break;
  case PY_DICT:
    jput(b, "{", 1);
    for (size_t i = 0; i < v->n; i++) {
      const py_value_t *k = v->items[2 * i];
      if (i)
        jput(b, ",", 1);
      if (k->kind == PY_STR) {
        jstr(b, k->s, k->len);
      } else if (k->kind == PY_INT && !k->big) {
        snprintf(num, sizeof(num), "\"%lld\"", (long long)k->i);
        jput(b, num, strlen(num));
      } else {
        return tool_error(GCA_ERR_PARSE, "pickle: a dict key that is not a string or an integer");
      }
      jput(b, ":", 1);
      TOOL_CHECK(jvalue(b, v->items[2 * i + 1], depth + 1));
    }
    jput(b, "}", 1);
    break;
  }
  return GCA_OK;
}

gca_status_t py_to_json(const py_value_t *v, char **out, size_t *len) {
  jbuf_t b = {0};
  gca_status_t st = jvalue(&b, v, 0);
  if (st == GCA_OK && b.failed)
    st = tool_error(GCA_ERR_OUT_OF_MEMORY, "pickle: no memory for its JSON");
  if (st != GCA_OK) {
    free(b.p);
    return st;
  }
  *out = b.p;
  *len = b.len;
  return GCA_OK;
}
