/* SPDX-License-Identifier: Apache-2.0 */
/* rmm_csv.c - the streaming RMM log CSV reader.
 *
 * A reader is a window [pos, len) over bytes not yet consumed: for memory input
 * the window is the caller's buffer; for files it is a fixed buffer refilled
 * by sliding the unread tail (a partial line) to the front, so a line (at most
 * GCA_RMM_MAX_LINE bytes) always fits after one refill and lines are parsed in
 * place. Fields are scanned by hand, without strtoull or sscanf, because
 * parsing sits on the replay's critical path.
 */
#include "rmm_csv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define FILE_BUF_SIZE (64u << 10)
#define QUOTE_MAX     48

/* Invariants: pos <= len <= cap; data[pos, len) is unread input; for files
 * data == owned and cap == FILE_BUF_SIZE; eof means no more bytes will come
 * after data[len); failed latches the first error. */
struct gca_rmm_reader {
  const char *data;
  size_t pos, len, cap;
  char *owned;
  FILE *file;
  bool close_file;
  bool eof;
  bool failed;
  gca_status_t fail_status;
  uint64_t line;
  char name[256];
};

static const char *const column_names[6] = {"Thread",  "Time", "Action",
                                            "Pointer", "Size", "Stream"};

const char *gca__rmm_action_name(gca_rmm_action_t action) {
  switch (action) {
  case GCA_RMM_ALLOCATE:
    return "allocate";
  case GCA_RMM_FREE:
    return "free";
  case GCA_RMM_ALLOCATE_FAILURE:
    return "allocate failure";
  }
  return "unknown";
}

/* Copies s[0, len) into buf as printable text, truncated with "..." to QUOTE_MAX. */
static const char *quote(const char *s, size_t len, char *buf, size_t cap) {
  size_t n = len < QUOTE_MAX ? len : QUOTE_MAX;
  if (n > cap - 4)
    n = cap - 4;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    buf[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  if (n < len) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o] = '\0';
  return buf;
}

static inline void trim(const char **s, size_t *len) {
  while (*len > 0 && ((*s)[0] == ' ' || (*s)[0] == '\t')) {
    (*s)++;
    (*len)--;
  }
  while (*len > 0 && ((*s)[*len - 1] == ' ' || (*s)[*len - 1] == '\t' || (*s)[*len - 1] == '\r'))
    (*len)--;
}

static int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static gca_status_t parse_hex(const char *s, size_t len, uint64_t line, const char *name,
                              const char *col, uint64_t *out) {
  char q[QUOTE_MAX + 4];
  const char *p = s;
  size_t n = len;
  if (n >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
    p += 2;
    n -= 2;
  }
  if (n == 0)
    return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: %s '%s' is not a hex number", name,
                      (unsigned long long)line, col, quote(s, len, q, sizeof(q)));
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    int d = hex_value((unsigned char)p[i]);
    if (d < 0)
      return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: %s '%s' is not a hex number", name,
                        (unsigned long long)line, col, quote(s, len, q, sizeof(q)));
    if (v >> 60)
      return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: %s '%s' does not fit in 64 bits",
                        name, (unsigned long long)line, col, quote(s, len, q, sizeof(q)));
    v = (v << 4) | (uint64_t)d;
  }
  *out = v;
  return GCA_OK;
}

static gca_status_t parse_dec(const char *s, size_t len, uint64_t line, const char *name,
                              const char *col, uint64_t *out) {
  char q[QUOTE_MAX + 4];
  if (len > 0 && s[0] == '-')
    return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: %s '%s' is negative", name,
                      (unsigned long long)line, col, quote(s, len, q, sizeof(q)));
  if (len == 0)
    return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: %s is empty", name,
                      (unsigned long long)line, col);
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < '0' || c > '9')
      return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: %s '%s' is not a decimal number",
                        name, (unsigned long long)line, col, quote(s, len, q, sizeof(q)));
    if (v > UINT64_MAX / 10 || v * 10 > UINT64_MAX - (uint64_t)(c - '0'))
      return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: %s '%s' does not fit in 64 bits",
                        name, (unsigned long long)line, col, quote(s, len, q, sizeof(q)));
    v = v * 10 + (uint64_t)(c - '0');
  }
  *out = v;
  return GCA_OK;
}

/* Reads a run of 1..max_digits decimal digits at s[*i]; -1 when there is none. */
static int64_t digits(const char *s, size_t len, size_t *i, int max_digits, int *ndigits) {
  int64_t v = 0;
  int n = 0;
  while (*i < len && n < max_digits && s[*i] >= '0' && s[*i] <= '9') {
    v = v * 10 + (s[*i] - '0');
    (*i)++;
    n++;
  }
  if (ndigits)
    *ndigits = n;
  return n == 0 ? -1 : v;
}

/* HH:MM:SS with an optional fraction after '.' or ':' (up to nanoseconds). */
static gca_status_t parse_time(const char *s, size_t len, uint64_t line, const char *name,
                               uint64_t *out) {
  char q[QUOTE_MAX + 4];
  size_t i = 0;
  int64_t h = digits(s, len, &i, 6, NULL);
  int64_t m = -1, sec = -1, frac = 0;
  int nfrac = 0;
  if (h >= 0 && i < len && s[i] == ':') {
    i++;
    m = digits(s, len, &i, 2, NULL);
  }
  if (m >= 0 && m < 60 && i < len && s[i] == ':') {
    i++;
    sec = digits(s, len, &i, 2, NULL);
  }
  if (sec >= 0 && sec < 61 && i < len && (s[i] == '.' || s[i] == ':')) {
    i++;
    frac = digits(s, len, &i, 9, &nfrac);
  }
  if (sec < 0 || sec >= 61 || m >= 60 || frac < 0 || i != len)
    return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: Time '%s' is not HH:MM:SS.ffffff",
                      name, (unsigned long long)line, quote(s, len, q, sizeof(q)));
  for (int k = nfrac; k < 9; k++)
    frac *= 10;
  *out = ((uint64_t)h * 3600 + (uint64_t)m * 60 + (uint64_t)sec) * 1000000000ull + (uint64_t)frac;
  return GCA_OK;
}

static gca_status_t parse_action(const char *s, size_t len, uint64_t line, const char *name,
                                 gca_rmm_action_t *out) {
  char q[QUOTE_MAX + 4];
  if (len == 8 && memcmp(s, "allocate", 8) == 0)
    *out = GCA_RMM_ALLOCATE;
  else if (len == 4 && memcmp(s, "free", 4) == 0)
    *out = GCA_RMM_FREE;
  else if (len == 16 && memcmp(s, "allocate failure", 16) == 0)
    *out = GCA_RMM_ALLOCATE_FAILURE;
  else
    return tool_error(GCA_ERR_PARSE,
                      "rmm_csv: %s line %llu: unknown action '%s' (expected allocate, free or "
                      "allocate failure)",
                      name, (unsigned long long)line, quote(s, len, q, sizeof(q)));
  return GCA_OK;
}

gca_status_t gca__rmm_parse_line(const char *s, size_t len, uint64_t line, const char *name,
                                 gca_rmm_event_t *ev) {
  const char *field[6];
  size_t flen[6];
  size_t nf = 0, start = 0;
  for (;;) {
    const char *comma = memchr(s + start, ',', len - start);
    size_t i = comma ? (size_t)(comma - s) : len;
    if (nf == 6) {
      char q[QUOTE_MAX + 4];
      return tool_error(
          GCA_ERR_PARSE,
          "rmm_csv: %s line %llu: more than 6 columns in '%s' (expected " GCA_RMM_HEADER ")", name,
          (unsigned long long)line, quote(s, len, q, sizeof(q)));
    }
    field[nf] = s + start;
    flen[nf] = i - start;
    trim(&field[nf], &flen[nf]);
    nf++;
    if (!comma)
      break;
    start = i + 1;
  }
  if (nf < 6)
    return tool_error(GCA_ERR_PARSE,
                      "rmm_csv: %s line %llu: missing column %s (found %zu of 6: " GCA_RMM_HEADER
                      ")",
                      name, (unsigned long long)line, column_names[nf], nf);
  gca_rmm_event_t e;
  e.line = line;
  TOOL_CHECK(parse_dec(field[0], flen[0], line, name, "Thread", &e.thread));
  TOOL_CHECK(parse_time(field[1], flen[1], line, name, &e.time_ns));
  TOOL_CHECK(parse_action(field[2], flen[2], line, name, &e.action));
  TOOL_CHECK(parse_hex(field[3], flen[3], line, name, "Pointer", &e.pointer));
  TOOL_CHECK(parse_dec(field[4], flen[4], line, name, "Size", &e.size));
  TOOL_CHECK(parse_hex(field[5], flen[5], line, name, "Stream", &e.stream));
  *ev = e;
  return GCA_OK;
}

static gca_status_t fail(gca_rmm_reader_t *r, gca_status_t st) {
  r->failed = true;
  r->fail_status = st;
  return st;
}

/* Slides the unread tail to the front and reads more; sets eof at end of file. */
static gca_status_t refill(gca_rmm_reader_t *r) {
  size_t rest = r->len - r->pos;
  if (rest > 0 && r->pos > 0)
    memmove(r->owned, r->owned + r->pos, rest);
  r->pos = 0;
  r->len = rest;
  size_t n = fread(r->owned + r->len, 1, r->cap - r->len, r->file);
  r->len += n;
  if (n == 0) {
    if (ferror(r->file))
      return tool_error(GCA_ERR_IO, "rmm_csv: %s: read failed after line %llu: %s", r->name,
                        (unsigned long long)r->line, strerror(errno));
    r->eof = true;
  }
  return GCA_OK;
}

/* Points *s at the next line (terminator stripped); *got false at end of input. */
static gca_status_t next_line(gca_rmm_reader_t *r, const char **s, size_t *len, bool *got) {
  for (;;) {
    const char *start = r->data + r->pos;
    size_t avail = r->len - r->pos;
    const char *nl = memchr(start, '\n', avail);
    if (nl || (r->eof && avail > 0)) {
      size_t n = nl ? (size_t)(nl - start) : avail;
      r->line++;
      if (n > GCA_RMM_MAX_LINE)
        return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: longer than %d bytes", r->name,
                          (unsigned long long)r->line, GCA_RMM_MAX_LINE);
      r->pos += nl ? n + 1 : n;
      *s = start;
      *len = n;
      *got = true;
      return GCA_OK;
    }
    if (r->eof) {
      *got = false;
      return GCA_OK;
    }
    if (avail > GCA_RMM_MAX_LINE + 1)
      return tool_error(GCA_ERR_PARSE, "rmm_csv: %s line %llu: longer than %d bytes", r->name,
                        (unsigned long long)r->line + 1, GCA_RMM_MAX_LINE);
    TOOL_CHECK(refill(r));
  }
}

static gca_status_t check_header(gca_rmm_reader_t *r) {
  const char *s = NULL;
  size_t len = 0;
  bool got = false;
  TOOL_CHECK(next_line(r, &s, &len, &got));
  if (!got)
    return tool_error(GCA_ERR_PARSE,
                      "rmm_csv: %s line 1: bad header: the input is empty "
                      "(expected '" GCA_RMM_HEADER "')",
                      r->name);
  if (len >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) {
    s += 3;
    len -= 3;
  }
  trim(&s, &len);
  if (len != strlen(GCA_RMM_HEADER) || memcmp(s, GCA_RMM_HEADER, len) != 0) {
    char q[QUOTE_MAX + 4];
    return tool_error(GCA_ERR_PARSE,
                      "rmm_csv: %s line 1: bad header '%s' (expected '" GCA_RMM_HEADER "')",
                      r->name, quote(s, len, q, sizeof(q)));
  }
  return GCA_OK;
}

static gca_rmm_reader_t *reader_new(const char *name) {
  gca_rmm_reader_t *r = calloc(1, sizeof(*r));
  if (r)
    snprintf(r->name, sizeof(r->name), "%s", name ? name : "(memory)");
  return r;
}

gca_status_t gca__rmm_open_stdio(FILE *f, const char *name, bool close_file,
                                 gca_rmm_reader_t **out) {
  gca_status_t st;
  if (!f || !out)
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "rmm_csv: open: file or out is NULL");
  gca_rmm_reader_t *r = reader_new(name);
  if (!r)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "rmm_csv: open %s: out of host memory",
                      name ? name : "(stream)");
  r->owned = malloc(FILE_BUF_SIZE);
  if (!r->owned) {
    st = tool_error(GCA_ERR_OUT_OF_MEMORY, "rmm_csv: open %s: out of host memory", r->name);
    goto fail_reader;
  }
  r->data = r->owned;
  r->cap = FILE_BUF_SIZE;
  r->file = f;
  TOOL_CHECK_GOTO(check_header(r), st, fail_buf);
  r->close_file = close_file;
  *out = r;
  return GCA_OK;

fail_buf:
  free(r->owned);
fail_reader:
  free(r);
  return st;
}

gca_status_t gca__rmm_open_file(const char *path, gca_rmm_reader_t **out) {
  if (!path || !out)
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "rmm_csv: open: path or out is NULL");
  if (strcmp(path, "-") == 0)
    return gca__rmm_open_stdio(stdin, "(stdin)", false, out);
  FILE *f = fopen(path, "rb");
  if (!f)
    return tool_error(GCA_ERR_IO, "rmm_csv: cannot open %s: %s", path, strerror(errno));
  gca_status_t st = gca__rmm_open_stdio(f, path, true, out);
  if (st != GCA_OK)
    fclose(f);
  return st;
}

gca_status_t gca__rmm_open_memory(const void *data, size_t len, const char *name,
                                  gca_rmm_reader_t **out) {
  gca_status_t st;
  if ((!data && len > 0) || !out)
    return tool_error(GCA_ERR_INVALID_ARGUMENT, "rmm_csv: open: data or out is NULL");
  gca_rmm_reader_t *r = reader_new(name);
  if (!r)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "rmm_csv: open %s: out of host memory",
                      name ? name : "(memory)");
  r->data = data ? data : "";
  r->len = r->cap = len;
  r->eof = true;
  TOOL_CHECK_GOTO(check_header(r), st, fail_reader);
  *out = r;
  return GCA_OK;

fail_reader:
  free(r);
  return st;
}

gca_status_t gca__rmm_next(gca_rmm_reader_t *r, gca_rmm_event_t *ev, bool *eof) {
  if (TOOL_UNLIKELY(r->failed))
    return tool_error(r->fail_status, "rmm_csv: %s: reading past an error at line %llu", r->name,
                      (unsigned long long)r->line);
  for (;;) {
    const char *s;
    size_t len;
    bool got;
    gca_status_t st = next_line(r, &s, &len, &got);
    if (st != GCA_OK)
      return fail(r, st);
    if (!got) {
      *eof = true;
      return GCA_OK;
    }
    size_t k = 0;
    while (k < len && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r'))
      k++;
    if (k == len)
      continue;
    st = gca__rmm_parse_line(s, len, r->line, r->name, ev);
    if (st != GCA_OK)
      return fail(r, st);
    *eof = false;
    return GCA_OK;
  }
}

uint64_t gca__rmm_line(const gca_rmm_reader_t *r) {
  return r->line;
}

void gca__rmm_close(gca_rmm_reader_t *r) {
  if (!r)
    return;
  if (r->close_file)
    fclose(r->file);
  free(r->owned);
  free(r);
}
