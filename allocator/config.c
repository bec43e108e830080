/* SPDX-License-Identifier: Apache-2.0 */
/* config.c - the allocator's settings: defaults, the GCA_ALLOC_CONF /
 * PYTORCH_CUDA_ALLOC_CONF parser, the writer that prints them back, and the
 * roundup_power2_divisions lookup.
 *
 * The one idea: the text is cut into tokens exactly as PyTorch's tokenizer
 * does (',' ':' '[' ']' are tokens of their own, whitespace is dropped), then
 * read key by key into a copy of the settings, which replaces the caller's only
 * when the whole text was accepted. Every rejection quotes "key:value" and the
 * part of it that was wrong.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)
/* PyTorch's kLargeBuffer: the smallest large segment, and the floor of the
 * split and non-split rounding limits. */
#define LARGE_BUFFER_MB      20ull
#define ROUNDUP_FIRST_LOG2   20 /* interval 0 starts at 1 MiB */
#define MAX_REGISTER_THREADS 128u
/* No key or value is near this long; the bound keeps every message that
 * quotes a token (some quote it three times) inside the error detail. */
#define MAX_TOKEN_LEN 255

/* The text cut into tokens: tok[i] points into chars, where every token is
 * a NUL-terminated copy. Both arrays are sized from the text's length (a text
 * of n characters has at most n tokens and n + n terminators), so no input
 * can overrun them. */
typedef struct tokens {
  size_t count;
  const char **tok;
  char *chars;
} tokens_t;

void gca__config_defaults(gca_alloc_config_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->max_split_size = UINT64_MAX;
  cfg->max_non_split_rounding = LARGE_BUFFER_MB * MiB;
  cfg->garbage_collection_threshold = 0.0;
  cfg->pinned_num_register_threads = 1;
  cfg->per_process_memory_fraction = 0.0;
  cfg->free_cache = true;
  cfg->expandable_moves = true;
  cfg->thread_cache = true;
  cfg->recycle_bins = true;
  snprintf(cfg->backend, sizeof(cfg->backend), "native");
}

static bool is_pow2(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

static int log2_floor(uint64_t v) {
  return 63 - __builtin_clzll(v);
}

/* Splits text into tokens, as many as the text holds; GCA_ERR_CONFIG when a
 * token is longer than MAX_TOKEN_LEN (quoting where it starts). Release with
 * tokens_free, also after a failure. */
static gca_status_t lex(const char *text, tokens_t *t) {
  size_t n = strlen(text);
  t->count = 0;
  t->tok = NULL;
  t->chars = NULL;
  if (n > (SIZE_MAX - 1) / 2 || n + 1 > SIZE_MAX / sizeof(*t->tok))
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "config: a text of %zu characters is too long", n);
  t->tok = malloc((n + 1) * sizeof(*t->tok));
  t->chars = malloc(2 * n + 1);
  if (!t->tok || !t->chars)
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "config: cannot allocate the tokens of a %zu-character text", n);
  char *w = t->chars;
  const char *open = NULL; /* the word being read, if any */
  size_t open_at = 0;      /* where it starts in text */
  for (const char *p = text;; p++) {
    char c = *p;
    bool sep = c == ',' || c == ':' || c == '[' || c == ']';
    if ((sep || c == '\0') && open) {
      *w++ = '\0';
      t->tok[t->count++] = open;
      open = NULL;
    }
    if (c == '\0')
      break;
    if (sep) {
      t->tok[t->count++] = w;
      *w++ = c;
      *w++ = '\0';
    } else if (!isspace((unsigned char)c)) {
      if (!open) {
        open = w;
        open_at = (size_t)(p - text);
      }
      if ((size_t)(w - open) == MAX_TOKEN_LEN)
        return gca__error(GCA_ERR_CONFIG,
                          "config: the item at character %zu ('%.32s...') is longer than %d "
                          "characters",
                          open_at, text + open_at, MAX_TOKEN_LEN);
      *w++ = c;
    }
  }
  return GCA_OK;
}

static void tokens_free(tokens_t *t) {
  free(t->tok);
  free(t->chars);
}

static const char *tok_at(const tokens_t *t, size_t i) {
  return i < t->count ? t->tok[i] : "";
}

/* A decimal integer with no sign, fraction or exponent, in [0, UINT64_MAX]. */
static gca_status_t read_uint(const char *key, const char *val, uint64_t *out) {
  if (!isdigit((unsigned char)val[0]))
    return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is not a number (expected a whole number)", key,
                      val, val);
  errno = 0;
  char *end;
  unsigned long long v = strtoull(val, &end, 10);
  if (*end != '\0')
    return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is not a number (expected a whole number)", key,
                      val, val);
  if (errno == ERANGE)
    return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is out of range", key, val, val);
  *out = v;
  return GCA_OK;
}

static gca_status_t read_double(const char *key, const char *val, double *out) {
  char *end;
  errno = 0;
  double v = strtod(val, &end);
  if (val[0] == '\0' || *end != '\0' || errno == ERANGE || !isfinite(v) ||
      !(isdigit((unsigned char)val[0]) || val[0] == '.' || val[0] == '-' || val[0] == '+'))
    return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is not a number", key, val, val);
  *out = v;
  return GCA_OK;
}

/* PyTorch spells booleans True and False, and accepts nothing else. */
static gca_status_t read_bool(const char *key, const char *val, bool *out) {
  if (strcmp(val, "True") == 0) {
    *out = true;
    return GCA_OK;
  }
  if (strcmp(val, "False") == 0) {
    *out = false;
    return GCA_OK;
  }
  return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is not True or False", key, val, val);
}

/* A size in MiB at least `min_mb` (or above it when `strict`), stored in bytes. */
static gca_status_t read_mb(const char *key, const char *val, uint64_t min_mb, bool strict,
                            uint64_t *out) {
  uint64_t mb = 0; /* set by read_uint on success */
  GCA_CHECK(read_uint(key, val, &mb));
  if (strict ? mb <= min_mb : mb < min_mb)
    return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is too small, must be %s %llu (MiB)", key, val,
                      val, strict ? ">" : ">=", (unsigned long long)min_mb);
  if (mb > UINT64_MAX / MiB)
    mb = UINT64_MAX / MiB;
  *out = mb * MiB;
  return GCA_OK;
}

/* roundup_power2_divisions: either one power of two for every interval, or a
 * list [k:v,...,>:v] of MiB keys; as PyTorch fills it: the first key's value
 * also covers every interval below it, each key sets the interval that starts
 * at that many MiB, and '>' sets every interval from the last key's onwards. */
static gca_status_t parse_roundup(const tokens_t *t, size_t *ip, gca_alloc_config_t *cfg) {
  const char *key = "roundup_power2_divisions";
  size_t i = *ip;
  const char *val = tok_at(t, i);
  uint32_t div[GCA_ROUNDUP_INTERVALS];
  if (strcmp(val, "[") != 0) {
    uint64_t v;
    GCA_CHECK(read_uint(key, val, &v));
    if (!is_pow2(v) || v > (1u << 31))
      return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is not a power of two (divisions must be)",
                        key, val, val);
    for (int k = 0; k < GCA_ROUNDUP_INTERVALS; k++)
      cfg->roundup_power2_divisions[k] = (uint32_t)v;
    return GCA_OK;
  }
  memset(div, 0, sizeof(div));
  bool first = true;
  int last_index = 0;
  uint64_t last_key = 0;
  i++;
  while (true) {
    const char *k = tok_at(t, i);
    if (i >= t->count)
      return gca__error(GCA_ERR_CONFIG, "%s:[...: missing ']' at the end of the list", key);
    if (strcmp(k, "]") == 0)
      break;
    const char *colon = tok_at(t, i + 1);
    const char *v = tok_at(t, i + 2);
    if (strcmp(colon, ":") != 0 || i + 2 >= t->count || strcmp(v, ",") == 0 ||
        strcmp(v, "]") == 0 || strcmp(v, ":") == 0)
      return gca__error(GCA_ERR_CONFIG, "%s:[...%s...]: '%s' is not an entry 'MiB:divisions'", key,
                        k, k);
    uint64_t d;
    GCA_CHECK(read_uint(key, v, &d));
    if (d != 0 && (!is_pow2(d) || d > (1u << 31)))
      return gca__error(GCA_ERR_CONFIG,
                        "%s:[...%s:%s...]: '%s' is not a power of two or 0 (divisions must be)",
                        key, k, v, v);
    if (strcmp(k, ">") == 0) {
      for (int x = last_index; x < GCA_ROUNDUP_INTERVALS; x++)
        div[x] = (uint32_t)d;
    } else {
      uint64_t mb;
      if (!isdigit((unsigned char)k[0]) || read_uint(key, k, &mb) != GCA_OK)
        return gca__error(GCA_ERR_CONFIG,
                          "%s:[...%s:%s...]: '%s' is not a number of MiB or '>' (interval keys)",
                          key, k, v, k);
      if (!is_pow2(mb))
        return gca__error(GCA_ERR_CONFIG,
                          "%s:[...%s:%s...]: '%s' is not a power of two (interval keys must be)",
                          key, k, v, k);
      if (!first && mb <= last_key)
        return gca__error(GCA_ERR_CONFIG,
                          "%s:[...%s:%s...]: '%s' does not follow %llu (interval keys ascend)", key,
                          k, v, k, (unsigned long long)last_key);
      int index = log2_floor(mb);
      if (index > GCA_ROUNDUP_INTERVALS - 1)
        index = GCA_ROUNDUP_INTERVALS - 1;
      if (first) {
        for (int x = 0; x < index; x++)
          div[x] = (uint32_t)d;
        first = false;
      }
      div[index] = (uint32_t)d;
      last_index = index;
      last_key = mb;
    }
    i += 3;
    const char *sep = tok_at(t, i);
    if (strcmp(sep, ",") == 0) {
      i++;
    } else if (strcmp(sep, "]") != 0) {
      if (i >= t->count)
        return gca__error(GCA_ERR_CONFIG, "%s:[...: missing ']' at the end of the list", key);
      return gca__error(GCA_ERR_CONFIG, "%s:[...%s...]: '%s' where ',' or ']' was expected", key,
                        sep, sep);
    }
  }
  memcpy(cfg->roundup_power2_divisions, div, sizeof(div));
  *ip = i;
  return GCA_OK;
}

const char *const gca__config_keys[GCA__CONFIG_NKEYS] = {
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "per_process_memory_fraction",
    "graph_capture_record_stream_reuse",
    "backend",
    "ipc_handles",
    "free_cache",
    "expandable_moves",
    "thread_cache",
    "recycle_bins",
};

bool gca__config_equal(const gca_alloc_config_t *a, const gca_alloc_config_t *b) {
  return a->max_split_size == b->max_split_size &&
         a->max_non_split_rounding == b->max_non_split_rounding &&
         a->garbage_collection_threshold == b->garbage_collection_threshold &&
         memcmp(a->roundup_power2_divisions, b->roundup_power2_divisions,
                sizeof(a->roundup_power2_divisions)) == 0 &&
         a->expandable_segments == b->expandable_segments &&
         a->release_lock_on_device_alloc == b->release_lock_on_device_alloc &&
         a->pinned_use_host_register == b->pinned_use_host_register &&
         a->pinned_num_register_threads == b->pinned_num_register_threads &&
         a->pinned_use_background_threads == b->pinned_use_background_threads &&
         a->per_process_memory_fraction == b->per_process_memory_fraction &&
         a->graph_capture_record_stream_reuse == b->graph_capture_record_stream_reuse &&
         a->ipc_handles == b->ipc_handles && a->free_cache == b->free_cache &&
         a->expandable_moves == b->expandable_moves && a->thread_cache == b->thread_cache &&
         a->recycle_bins == b->recycle_bins && strcmp(a->backend, b->backend) == 0;
}

static gca_status_t parse_item(const tokens_t *t, size_t *ip, gca_alloc_config_t *cfg) {
  size_t i = *ip;
  const char *key = tok_at(t, i);
  const char *const *keys = gca__config_keys;
  size_t k = 0;
  while (k < GCA__CONFIG_NKEYS && strcmp(key, keys[k]) != 0)
    k++;
  if (k == GCA__CONFIG_NKEYS)
    return gca__error(GCA_ERR_CONFIG,
                      "'%s' is not a configuration key (known: max_split_size_mb, "
                      "max_non_split_rounding_mb, garbage_collection_threshold, "
                      "roundup_power2_divisions, expandable_segments, release_lock_on_cudamalloc, "
                      "pinned_use_cuda_host_register, pinned_num_register_threads, "
                      "pinned_use_background_threads, per_process_memory_fraction, "
                      "graph_capture_record_stream_reuse, backend, ipc_handles, free_cache, "
                      "expandable_moves, thread_cache, recycle_bins)",
                      key);
  if (strcmp(tok_at(t, i + 1), ":") != 0)
    return gca__error(GCA_ERR_CONFIG, "%s%s: expected ':' and a value after '%s'", key,
                      tok_at(t, i + 1), key);
  i += 2;
  const char *val = tok_at(t, i);
  if (i >= t->count || strcmp(val, ",") == 0 || strcmp(val, ":") == 0 || strcmp(val, "]") == 0)
    return gca__error(GCA_ERR_CONFIG, "%s:%s: expected a value after '%s:'", key, val, key);
  uint64_t u;
  double d;
  switch (k) {
  case 0:
    GCA_CHECK(read_mb(key, val, LARGE_BUFFER_MB, true, &cfg->max_split_size));
    break;
  case 1:
    GCA_CHECK(read_mb(key, val, LARGE_BUFFER_MB, false, &cfg->max_non_split_rounding));
    break;
  case 2:
    GCA_CHECK(read_double(key, val, &d));
    if (!(d > 0.0 && d < 1.0))
      return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is out of range, must be in (0, 1)", key, val,
                        val);
    cfg->garbage_collection_threshold = d;
    break;
  case 3:
    GCA_CHECK(parse_roundup(t, &i, cfg));
    break;
  case 4:
    GCA_CHECK(read_bool(key, val, &cfg->expandable_segments));
    break;
  case 5:
    GCA_CHECK(read_bool(key, val, &cfg->release_lock_on_device_alloc));
    break;
  case 6:
    GCA_CHECK(read_bool(key, val, &cfg->pinned_use_host_register));
    break;
  case 7:
    GCA_CHECK(read_uint(key, val, &u));
    if (!is_pow2(u))
      return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is not a power of two (thread counts must be)",
                        key, val, val);
    if (u > MAX_REGISTER_THREADS)
      return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is out of range, must be <= %u", key, val, val,
                        MAX_REGISTER_THREADS);
    cfg->pinned_num_register_threads = (uint32_t)u;
    break;
  case 8:
    GCA_CHECK(read_bool(key, val, &cfg->pinned_use_background_threads));
    break;
  case 9:
    GCA_CHECK(read_double(key, val, &d));
    if (!(d > 0.0 && d <= 1.0))
      return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is out of range, must be in (0, 1]", key, val,
                        val);
    cfg->per_process_memory_fraction = d;
    break;
  case 10:
    GCA_CHECK(read_bool(key, val, &cfg->graph_capture_record_stream_reuse));
    break;
  case 12:
    GCA_CHECK(read_bool(key, val, &cfg->ipc_handles));
    break;
  case 13:
    GCA_CHECK(read_bool(key, val, &cfg->free_cache));
    break;
  case 14:
    GCA_CHECK(read_bool(key, val, &cfg->expandable_moves));
    break;
  case 15:
    GCA_CHECK(read_bool(key, val, &cfg->thread_cache));
    break;
  case 16:
    GCA_CHECK(read_bool(key, val, &cfg->recycle_bins));
    break;
  default:
    if (strcmp(val, "cudaMallocAsync") == 0)
      return gca__error(GCA_ERR_CONFIG,
                        "%s:%s: gca is the allocator; backend:cudaMallocAsync is not supported",
                        key, val);
    if (strcmp(val, "native") != 0)
      return gca__error(GCA_ERR_CONFIG, "%s:%s: '%s' is not an allocator backend (expected native)",
                        key, val, val);
    snprintf(cfg->backend, sizeof(cfg->backend), "native");
    break;
  }
  *ip = i;
  return GCA_OK;
}

gca_status_t gca__config_parse(const char *text, gca_alloc_config_t *cfg) {
  if (!cfg)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "config_parse: NULL settings");
  if (!text)
    return GCA_OK;
  tokens_t toks;
  const tokens_t *t = &toks;
  gca_alloc_config_t next = *cfg;
  gca_status_t st;
  GCA_CHECK_GOTO(lex(text, &toks), st, out);
  for (size_t i = 0; i < t->count; i++) {
    size_t item = i;
    GCA_CHECK_GOTO(parse_item(t, &i, &next), st, out);
    if (i + 1 < t->count) {
      const char *sep = tok_at(t, ++i);
      if (strcmp(sep, ",") != 0) {
        st = gca__error(GCA_ERR_CONFIG, "%s:%s%s: '%s' where ',' was expected", tok_at(t, item),
                        tok_at(t, i - 1), sep, sep);
        goto out;
      }
    }
  }
  *cfg = next;
  st = GCA_OK;
out:
  tokens_free(&toks);
  return st;
}

gca_status_t gca__config_from_env(gca_alloc_config_t *cfg) {
  if (!cfg)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "config_from_env: NULL settings");
  const char *name = "GCA_ALLOC_CONF";
  const char *text = gca__getenv(name);
  if (!text || !*text) {
    name = "PYTORCH_CUDA_ALLOC_CONF";
    text = gca__getenv(name);
  }
  gca_alloc_config_t next;
  gca__config_defaults(&next);
  gca_status_t st = text ? gca__config_parse(text, &next) : GCA_OK;
  if (st != GCA_OK)
    return gca__error_prefix(st, "%s", name);
  *cfg = next;
  return GCA_OK;
}

/* The shortest %g text that reads back as exactly v. */
static const char *fmt_double(double v, char *b, size_t len) {
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(b, len, "%.*g", prec, v);
    if (strtod(b, NULL) == v)
      break;
  }
  return b;
}

typedef struct out_buf {
  char *buf;
  size_t len, used;
  bool overflow;
} out_buf_t;

static void emit(out_buf_t *o, const char *fmt, ...) GCA_PRINTF(2, 3);
static void emit(out_buf_t *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = o->used < o->len ? o->len - o->used : 0;
  int n = vsnprintf(room ? o->buf + o->used : NULL, room, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= room)
    o->overflow = true;
  o->used += n > 0 ? (size_t)n : 0;
}

gca_status_t gca__config_format(const gca_alloc_config_t *cfg, char *buf, size_t len) {
  if (!cfg || !buf || len == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "config_format: NULL settings or empty buffer");
  out_buf_t o = {.buf = buf, .len = len, .used = 0, .overflow = false};
  char num[32];
  buf[0] = '\0';
  if (cfg->max_split_size != UINT64_MAX)
    emit(&o, "max_split_size_mb:%llu,", (unsigned long long)(cfg->max_split_size / MiB));
  emit(&o, "max_non_split_rounding_mb:%llu,",
       (unsigned long long)(cfg->max_non_split_rounding / MiB));
  if (cfg->garbage_collection_threshold > 0.0)
    emit(&o, "garbage_collection_threshold:%s,",
         fmt_double(cfg->garbage_collection_threshold, num, sizeof(num)));
  const uint32_t *div = cfg->roundup_power2_divisions;
  bool uniform = true;
  for (int i = 1; i < GCA_ROUNDUP_INTERVALS; i++)
    uniform = uniform && div[i] == div[0];
  if (uniform && div[0] != 0) {
    emit(&o, "roundup_power2_divisions:%u,", div[0]);
  } else if (!uniform) {
    emit(&o, "roundup_power2_divisions:[");
    for (int i = 0; i < GCA_ROUNDUP_INTERVALS; i++)
      emit(&o, "%s%u:%u", i ? "," : "", 1u << i, div[i]);
    emit(&o, "],");
  }
  emit(&o, "expandable_segments:%s,", cfg->expandable_segments ? "True" : "False");
  emit(&o, "release_lock_on_cudamalloc:%s,", cfg->release_lock_on_device_alloc ? "True" : "False");
  emit(&o, "pinned_use_cuda_host_register:%s,", cfg->pinned_use_host_register ? "True" : "False");
  emit(&o, "pinned_num_register_threads:%u,", cfg->pinned_num_register_threads);
  emit(&o, "pinned_use_background_threads:%s,",
       cfg->pinned_use_background_threads ? "True" : "False");
  if (cfg->per_process_memory_fraction > 0.0)
    emit(&o, "per_process_memory_fraction:%s,",
         fmt_double(cfg->per_process_memory_fraction, num, sizeof(num)));
  emit(&o, "graph_capture_record_stream_reuse:%s,",
       cfg->graph_capture_record_stream_reuse ? "True" : "False");
  emit(&o, "ipc_handles:%s,", cfg->ipc_handles ? "True" : "False");
  emit(&o, "free_cache:%s,", cfg->free_cache ? "True" : "False");
  emit(&o, "expandable_moves:%s,", cfg->expandable_moves ? "True" : "False");
  emit(&o, "thread_cache:%s,", cfg->thread_cache ? "True" : "False");
  if (!cfg->recycle_bins) /* on by default: formatted only when off */
    emit(&o, "recycle_bins:False,");
  emit(&o, "backend:%s", cfg->backend[0] ? cfg->backend : "native");
  if (o.overflow)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "config_format: buffer of %zu bytes is too small, %zu needed", len,
                      o.used + 1);
  return GCA_OK;
}

uint32_t gca__config_roundup_divisions(const gca_alloc_config_t *cfg, size_t size) {
  int index = size ? log2_floor(size) - ROUNDUP_FIRST_LOG2 : 0;
  if (index < 0)
    index = 0;
  if (index > GCA_ROUNDUP_INTERVALS - 1)
    index = GCA_ROUNDUP_INTERVALS - 1;
  return cfg->roundup_power2_divisions[index];
}
