/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot_model.c - loading a snapshot JSON (read with jansson) into
 * gca-snapshot's flat model: every field the renderers use is checked here,
 * once, and a failure names the field and its place in the document.
 * Integers may be JSON numbers or strings ("0x7f00..."), since addresses do
 * not always fit a double. Note [Snapshot sizes]: sizes and addresses must
 * fit int64, and every total they feed (reserved, requested and allocated
 * bytes, the timeline walked backwards) is added with an overflow check, so a
 * hostile or corrupt snapshot is an error naming the field, never signed
 * overflow.
 */
#include "snapshot_model.h"

#include "pickle.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_names[SNAP_STATES] = {"active_allocated", "active_pending_free",
                                                     "inactive"};

const char *gca__snapshot_state_name(snap_state_t state) {
  return (unsigned)state < SNAP_STATES ? state_names[state] : "?";
}

static const char *const action_names[SNAP_ACTIONS] = {
    [SNAP_EV_ALLOC] = "alloc",
    [SNAP_EV_FREE_REQUESTED] = "free_requested",
    [SNAP_EV_FREE_COMPLETED] = "free_completed",
    [SNAP_EV_SEGMENT_ALLOC] = "segment_alloc",
    [SNAP_EV_SEGMENT_FREE] = "segment_free",
    [SNAP_EV_SEGMENT_MAP] = "segment_map",
    [SNAP_EV_SEGMENT_UNMAP] = "segment_unmap",
    [SNAP_EV_SNAPSHOT] = "snapshot",
    [SNAP_EV_OOM] = "oom",
    [SNAP_EV_OTHER] = "other",
};

const char *gca__snapshot_action_name(snap_action_t action) {
  return (unsigned)action < SNAP_ACTIONS ? action_names[action] : "?";
}

/* A size or address member `key` of object v: a non-negative integer that
 * fits int64, as a number or as a string in decimal or 0x-hex. Absent or
 * null: *out = dflt when !required, else an error. */
static gca_status_t get_u64(const json_t *v, const char *key, bool required, uint64_t dflt,
                            const char *where, uint64_t *out) {
  const json_t *m = json_object_get(v, key);
  if (!m || json_is_null(m)) {
    if (required)
      return tool_error(GCA_ERR_PARSE, "snapshot: %s: missing '%s'", where, key);
    *out = dflt;
    return GCA_OK;
  }
  if (json_is_integer(m)) {
    json_int_t x = json_integer_value(m);
    if (x < 0)
      return tool_error(GCA_ERR_PARSE, "snapshot: %s: '%s' is negative (%lld)", where, key,
                        (long long)x);
    *out = (uint64_t)x;
    return GCA_OK;
  }
  const char *s = json_string_value(m);
  if (s && *s && !isspace((unsigned char)s[0]) && s[0] != '+') {
    if (s[0] == '-')
      return tool_error(GCA_ERR_PARSE, "snapshot: %s: '%s' is negative (%.40s)", where, key, s);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 0);
    if (*end == '\0') {
      if (errno == ERANGE || x > (unsigned long long)INT64_MAX)
        return tool_error(GCA_ERR_PARSE, "snapshot: %s: '%s' is beyond int64 (%.40s)", where, key,
                          s);
      *out = x;
      return GCA_OK;
    }
  }
  return tool_error(GCA_ERR_PARSE, "snapshot: %s: '%s' is not a non-negative integer", where, key);
}

static gca_status_t get_i64(const json_t *v, const char *key, int64_t dflt, const char *where,
                            int64_t *out) {
  const json_t *m = json_object_get(v, key);
  if (!m || json_is_null(m)) {
    *out = dflt;
    return GCA_OK;
  }
  if (json_is_integer(m)) {
    *out = json_integer_value(m);
    return GCA_OK;
  }
  return tool_error(GCA_ERR_PARSE, "snapshot: %s: '%s' is not an integer", where, key);
}

/* *total += x, both within [0, INT64_MAX]; else the error names the field
 * that took `what` beyond int64 (Note [Snapshot sizes]). */
static gca_status_t add_total(uint64_t *total, uint64_t x, const char *where, const char *key,
                              const char *what) {
  if (x > (uint64_t)INT64_MAX - *total)
    return tool_error(GCA_ERR_PARSE, "snapshot: %s: '%s' takes the %s bytes beyond int64", where,
                      key, what);
  *total += x;
  return GCA_OK;
}

static gca_status_t get_array(const json_t *v, const char *key, bool required, const char *where,
                              const json_t **out) {
  const json_t *m = json_object_get(v, key);
  *out = NULL;
  if (!m || json_is_null(m)) {
    if (required)
      return tool_error(GCA_ERR_PARSE, "snapshot: %s: missing '%s'", where, key);
    return GCA_OK;
  }
  if (!json_is_array(m))
    return tool_error(GCA_ERR_PARSE, "snapshot: %s: '%s' is not an array", where, key);
  *out = m;
  return GCA_OK;
}

static char *dup_string(const json_t *v) {
  const char *s = json_string_value(v);
  if (!s && json_is_number(v)) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%.17g", json_number_value(v));
    return strdup(buf);
  }
  return strdup(s ? s : "");
}

/* The frames of object v (a block or an event): its own "frames", else those
 * of its last "history" entry (the older PyTorch layout for blocks), into
 * *out / *nout (left NULL / 0 when there are none). */
static gca_status_t load_frames(const json_t *v, const char *where, snap_frame_t **out,
                                size_t *nout) {
  const json_t *frames;
  TOOL_CHECK(get_array(v, "frames", false, where, &frames));
  if (!frames) {
    const json_t *hist;
    TOOL_CHECK(get_array(v, "history", false, where, &hist));
    size_t n = json_array_size(hist);
    if (n > 0)
      TOOL_CHECK(get_array(json_array_get(hist, n - 1), "frames", false, where, &frames));
  }
  size_t n = json_array_size(frames);
  if (n == 0)
    return GCA_OK;
  *out = calloc(n, sizeof(**out));
  if (!*out)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: %s: no memory for %zu frames", where, n);
  for (size_t i = 0; i < n; i++) {
    const json_t *f = json_array_get(frames, i);
    snap_frame_t *fr = &(*out)[i];
    (*nout)++;
    if (json_is_string(f)) {
      fr->name = dup_string(f);
      fr->filename = strdup("");
    } else if (json_is_object(f)) {
      fr->name = dup_string(json_object_get(f, "name"));
      fr->filename = dup_string(json_object_get(f, "filename"));
      TOOL_CHECK(get_i64(f, "line", 0, where, &fr->line));
    } else {
      return tool_error(GCA_ERR_PARSE,
                        "snapshot: %s: frames[%zu] is neither an object nor a string", where, i);
    }
    if (!fr->name || !fr->filename)
      return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: %s: no memory for frame names", where);
  }
  return GCA_OK;
}

static gca_status_t load_block(const json_t *blk, const char *where, snap_block_t *b) {
  if (!json_is_object(blk))
    return tool_error(GCA_ERR_PARSE, "snapshot: %s: expected an object", where);
  TOOL_CHECK(get_u64(blk, "address", true, 0, where, &b->address));
  TOOL_CHECK(get_u64(blk, "size", true, 0, where, &b->size));
  TOOL_CHECK(get_u64(blk, "requested_size", false, UINT64_MAX, where, &b->requested_size));
  const json_t *st = json_object_get(blk, "state");
  const char *state = json_string_value(st);
  if (!st)
    return tool_error(GCA_ERR_PARSE, "snapshot: %s: missing 'state'", where);
  int found = -1;
  for (int i = 0; i < SNAP_STATES && state; i++)
    if (strcmp(state, state_names[i]) == 0)
      found = i;
  if (found < 0)
    return tool_error(GCA_ERR_PARSE,
                      "snapshot: %s: 'state' must be active_allocated, active_pending_free or "
                      "inactive, not '%s'",
                      where, state ? state : "(not a string)");
  b->state = (snap_state_t)found;
  if (b->requested_size == UINT64_MAX)
    b->requested_size = b->state == SNAP_INACTIVE ? 0 : b->size;
  return load_frames(blk, where, &b->frames, &b->nframes);
}

static gca_status_t load_segments(const json_t *segs, snapshot_t *s) {
  size_t nseg = json_array_size(segs), nblk = 0;
  char where[96];
  for (size_t i = 0; i < nseg; i++) {
    const json_t *seg = json_array_get(segs, i), *blocks;
    snprintf(where, sizeof(where), "segments[%zu]", i);
    if (!json_is_object(seg))
      return tool_error(GCA_ERR_PARSE, "snapshot: %s: expected an object", where);
    TOOL_CHECK(get_array(seg, "blocks", true, where, &blocks));
    nblk += json_array_size(blocks);
  }
  s->segments = calloc(nseg ? nseg : 1, sizeof(*s->segments));
  s->blocks = calloc(nblk ? nblk : 1, sizeof(*s->blocks));
  if (!s->segments || !s->blocks)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: no memory for %zu segments, %zu blocks",
                      nseg, nblk);
  for (size_t i = 0; i < nseg; i++) {
    const json_t *seg = json_array_get(segs, i), *blocks;
    snap_segment_t *sg = &s->segments[i];
    snprintf(where, sizeof(where), "segments[%zu]", i);
    s->nsegments++;
    TOOL_CHECK(get_i64(seg, "device", 0, where, &sg->device));
    TOOL_CHECK(get_u64(seg, "address", true, 0, where, &sg->address));
    TOOL_CHECK(get_u64(seg, "total_size", true, 0, where, &sg->total_size));
    TOOL_CHECK(add_total(&s->reserved, sg->total_size, where, "total_size", "reserved"));
    TOOL_CHECK(get_u64(seg, "stream", false, 0, where, &sg->stream));
    const char *type = json_string_value(json_object_get(seg, "segment_type"));
    sg->is_large = !type || strcmp(type, "small") != 0;
    sg->is_expandable = json_is_true(json_object_get(seg, "is_expandable"));
    TOOL_CHECK(get_array(seg, "blocks", true, where, &blocks));
    sg->first_block = s->nblocks;
    for (size_t j = 0; j < json_array_size(blocks); j++) {
      char bwhere[128];
      snprintf(bwhere, sizeof(bwhere), "%s.blocks[%zu]", where, j);
      snap_block_t *b = &s->blocks[s->nblocks++];
      sg->nblocks++;
      b->segment = i;
      TOOL_CHECK(load_block(json_array_get(blocks, j), bwhere, b));
      TOOL_CHECK(add_total(&s->by_state[b->state], b->size, bwhere, "size",
                           gca__snapshot_state_name(b->state)));
      s->count_by_state[b->state]++;
      if (b->state == SNAP_ACTIVE_ALLOCATED)
        TOOL_CHECK(
            add_total(&s->requested, b->requested_size, bwhere, "requested_size", "requested"));
    }
    bool seen = false;
    for (size_t k = 0; k < i; k++)
      seen = seen || s->segments[k].device == sg->device;
    if (!seen)
      s->ndevices++;
  }
  return GCA_OK;
}

/* Bytes a device holds at snapshot time: allocated (requested bytes of
 * active_allocated blocks, the measure alloc/free_requested events carry) and
 * reserved (segments). Both are parts of s->requested and s->reserved, which
 * load_segments kept within int64. */
static void device_totals(const snapshot_t *s, int64_t device, int64_t *alloc, int64_t *reserved) {
  *alloc = *reserved = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    const snap_segment_t *sg = &s->segments[i];
    if (sg->device != device)
      continue;
    *reserved += (int64_t)sg->total_size;
    for (size_t j = 0; j < sg->nblocks; j++) {
      const snap_block_t *b = &s->blocks[sg->first_block + j];
      if (b->state == SNAP_ACTIVE_ALLOCATED)
        *alloc += (int64_t)b->requested_size;
    }
  }
}

/* e->size <= INT64_MAX (get_u64), so -sz is defined. */
static void event_delta(const snap_event_t *e, int64_t *da, int64_t *dr) {
  int64_t sz = (int64_t)e->size;
  *da = e->action == SNAP_EV_ALLOC ? sz : e->action == SNAP_EV_FREE_REQUESTED ? -sz : 0;
  *dr = (e->action == SNAP_EV_SEGMENT_ALLOC || e->action == SNAP_EV_SEGMENT_MAP)    ? sz
        : (e->action == SNAP_EV_SEGMENT_FREE || e->action == SNAP_EV_SEGMENT_UNMAP) ? -sz
                                                                                    : 0;
}

static gca_status_t load_trace(const json_t *tr, size_t dev, snapshot_t *s) {
  snap_trace_t *t = &s->traces[dev];
  char where[96];
  t->device = (int64_t)dev;
  if (!json_is_array(tr))
    return tool_error(GCA_ERR_PARSE, "snapshot: device_traces[%zu] is not an array", dev);
  size_t n = json_array_size(tr);
  t->events = calloc(n ? n : 1, sizeof(*t->events));
  if (!t->events)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: no memory for %zu events", n);
  t->has_times = true;
  for (size_t i = 0; i < n; i++) {
    const json_t *e = json_array_get(tr, i);
    snap_event_t *ev = &t->events[i];
    snprintf(where, sizeof(where), "device_traces[%zu][%zu]", dev, i);
    t->nevents++;
    if (!json_is_object(e))
      return tool_error(GCA_ERR_PARSE, "snapshot: %s: expected an object", where);
    const json_t *a = json_object_get(e, "action");
    const char *action = json_string_value(a);
    if (!action)
      return tool_error(GCA_ERR_PARSE, "snapshot: %s: %s 'action'", where,
                        a ? "non-string" : "missing");
    ev->action = SNAP_EV_OTHER;
    for (int k = 0; k < SNAP_EV_OTHER; k++)
      if (strcmp(action, action_names[k]) == 0)
        ev->action = (snap_action_t)k;
    TOOL_CHECK(get_u64(e, "addr", false, 0, where, &ev->addr));
    TOOL_CHECK(get_u64(e, "size", ev->action < SNAP_EV_SNAPSHOT, 0, where, &ev->size));
    TOOL_CHECK(get_u64(e, "stream", false, 0, where, &ev->stream));
    TOOL_CHECK(load_frames(e, where, &ev->frames, &ev->nframes));
    const json_t *tm = json_object_get(e, "time_us");
    if (json_is_number(tm)) {
      ev->time_us = json_number_value(tm);
    } else {
      if (tm && !json_is_null(tm))
        return tool_error(GCA_ERR_PARSE, "snapshot: %s: 'time_us' is not a number", where);
      t->has_times = false;
    }
  }
  if (!t->has_times) {
    for (size_t i = 0; i < n; i++)
      t->events[i].time_us = (double)i;
  }
  int64_t alloc, reserved, da, dr;
  device_totals(s, t->device, &alloc, &reserved);
  for (size_t i = n; i-- > 0;) {
    t->events[i].allocated_after = alloc;
    t->events[i].reserved_after = reserved;
    event_delta(&t->events[i], &da, &dr);
    bool alloc_overflows = __builtin_sub_overflow(alloc, da, &alloc);
    if (alloc_overflows || __builtin_sub_overflow(reserved, dr, &reserved))
      return tool_error(GCA_ERR_PARSE,
                        "snapshot: device_traces[%zu][%zu]: 'size' takes the %s bytes beyond int64",
                        dev, i, alloc_overflows ? "allocated" : "reserved");
  }
  t->allocated_before = t->peak_allocated = alloc;
  t->reserved_before = t->peak_reserved = reserved;
  for (size_t i = 0; i < n; i++) {
    if (t->events[i].allocated_after > t->peak_allocated)
      t->peak_allocated = t->events[i].allocated_after;
    if (t->events[i].reserved_after > t->peak_reserved)
      t->peak_reserved = t->events[i].reserved_after;
  }
  return GCA_OK;
}

typedef struct addr_index {
  uint64_t address;
  size_t block;
} addr_index_t;

static int cmp_addr(const void *a, const void *b) {
  uint64_t x = ((const addr_index_t *)a)->address, y = ((const addr_index_t *)b)->address;
  return x < y ? -1 : x > y;
}

/* Live blocks recorded without frames take those of the latest alloc event at
 * their address on their device (gca's snapshots keep frames in the history
 * only). */
static gca_status_t attach_alloc_frames(snapshot_t *s, const json_t *traces) {
  size_t n = 0;
  addr_index_t *idx = malloc((s->nblocks ? s->nblocks : 1) * sizeof(*idx));
  if (!idx)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: no memory to index %zu blocks", s->nblocks);
  for (size_t i = 0; i < s->nblocks; i++)
    if (s->blocks[i].state == SNAP_ACTIVE_ALLOCATED && s->blocks[i].nframes == 0)
      idx[n++] = (addr_index_t){s->blocks[i].address, i};
  qsort(idx, n, sizeof(*idx), cmp_addr);
  gca_status_t st = GCA_OK;
  char where[96];
  for (size_t d = 0; d < s->ntraces && n > 0; d++) {
    const snap_trace_t *t = &s->traces[d];
    for (size_t i = t->nevents; i-- > 0;) {
      if (t->events[i].action != SNAP_EV_ALLOC)
        continue;
      addr_index_t key = {t->events[i].addr, 0};
      addr_index_t *hit = bsearch(&key, idx, n, sizeof(*idx), cmp_addr);
      if (!hit)
        continue;
      snap_block_t *b = &s->blocks[hit->block];
      if (b->nframes > 0 || s->segments[b->segment].device != t->device)
        continue;
      snprintf(where, sizeof(where), "device_traces[%zu][%zu]", d, i);
      TOOL_CHECK_GOTO(
          load_frames(json_array_get(json_array_get(traces, d), i), where, &b->frames, &b->nframes),
          st, out);
    }
  }
out:
  free(idx);
  return st;
}

/* The member name written just before the number that ends at byte `end`
 * ("size": 123...), so that an integer jansson refuses can be named; false
 * when the number is not an object member's value. */
static bool member_before(const char *text, size_t end, char *key, size_t cap) {
  size_t i = end;
  while (i > 0 && (isdigit((unsigned char)text[i - 1]) || strchr("+-.eE", text[i - 1])))
    i--;
  while (i > 0 && isspace((unsigned char)text[i - 1]))
    i--;
  if (i == 0 || text[--i] != ':')
    return false;
  while (i > 0 && isspace((unsigned char)text[i - 1]))
    i--;
  if (i == 0 || text[--i] != '"')
    return false;
  size_t close = i;
  while (i > 0 && text[i - 1] != '"')
    i--;
  if (i == 0 || close - i >= cap)
    return false;
  memcpy(key, text + i, close - i);
  key[close - i] = '\0';
  return true;
}

/* Parses the text with jansson: GCA_ERR_PARSE "json: line L column C
 * (offset O): ..." with jansson's words, naming the member whose integer does
 * not fit int64 (jansson's integers are int64). */
static gca_status_t parse_json(const char *text, size_t len, json_t **out) {
  json_error_t err;
  *out = json_loadb(text, len, JSON_DECODE_ANY, &err);
  if (*out)
    return GCA_OK;
  char key[64];
  if (strncmp(err.text, "too big", 7) == 0 && err.position >= 0 && (size_t)err.position <= len &&
      member_before(text, (size_t)err.position, key, sizeof(key)))
    return tool_error(GCA_ERR_PARSE,
                      "snapshot: json: line %d column %d (offset %d): '%s' is beyond int64 (%s)",
                      err.line, err.column, err.position, key, err.text);
  return tool_error(GCA_ERR_PARSE, "snapshot: json: line %d column %d (offset %d): %s", err.line,
                    err.column, err.position, err.text);
}

gca_status_t gca__snapshot_load(const char *text, size_t len, snapshot_t *out) {
  json_t *root = NULL;
  snapshot_t s = {0};
  gca_status_t st = parse_json(text, len, &root);
  if (st != GCA_OK)
    return st;
  const json_t *segs, *traces;
  if (!json_is_object(root)) {
    st = tool_error(GCA_ERR_PARSE, "snapshot: the document is not an object");
    goto fail;
  }
  TOOL_CHECK_GOTO(get_array(root, "segments", true, "top level", &segs), st, fail);
  TOOL_CHECK_GOTO(get_array(root, "device_traces", true, "top level", &traces), st, fail);
  TOOL_CHECK_GOTO(load_segments(segs, &s), st, fail);
  size_t nt = json_array_size(traces);
  s.traces = calloc(nt ? nt : 1, sizeof(*s.traces));
  if (!s.traces) {
    st = tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: no memory for %zu traces", nt);
    goto fail;
  }
  for (size_t d = 0; d < nt; d++) {
    s.ntraces++;
    TOOL_CHECK_GOTO(load_trace(json_array_get(traces, d), d, &s), st, fail);
  }
  TOOL_CHECK_GOTO(attach_alloc_frames(&s, traces), st, fail);
  json_decref(root);
  *out = s;
  return GCA_OK;

fail:
  gca__snapshot_free(&s);
  json_decref(root);
  return st;
}

gca_status_t gca__snapshot_load_file(const char *path, snapshot_t *out) {
  char *buf = NULL;
  size_t len = 0;
  gca_status_t st = tool_read_file(path, &buf, &len);
  if (st != GCA_OK)
    return tool_error_prefix(st, "snapshot");
  if (py_is_pickle(buf, len)) { /* a PyTorch snapshot pickle: read as plain data */
    py_doc_t *doc = NULL;
    const py_value_t *root = NULL;
    char *json = NULL;
    size_t jlen = 0;
    st = py_pickle_load(buf, len, path, &doc, &root);
    if (st == GCA_OK)
      st = py_to_json(root, &json, &jlen);
    py_doc_free(doc);
    if (st != GCA_OK)
      goto out;
    free(buf);
    buf = json;
    len = jlen;
  }
  st = gca__snapshot_load(buf, len, out);
  if (st != GCA_OK)
    tool_error_prefix(st, "%s", path);
out:
  free(buf);
  return st;
}

static void free_frames(snap_frame_t *frames, size_t n) {
  for (size_t j = 0; j < n; j++) {
    free(frames[j].name);
    free(frames[j].filename);
  }
  free(frames);
}

void gca__snapshot_free(snapshot_t *s) {
  for (size_t i = 0; i < s->nblocks; i++)
    free_frames(s->blocks[i].frames, s->blocks[i].nframes);
  for (size_t i = 0; i < s->ntraces; i++) {
    for (size_t j = 0; j < s->traces[i].nevents; j++)
      free_frames(s->traces[i].events[j].frames, s->traces[i].events[j].nframes);
    free(s->traces[i].events);
  }
  free(s->blocks);
  free(s->segments);
  free(s->traces);
  *s = (snapshot_t){0};
}

size_t gca__snapshot_largest(const snapshot_t *s, size_t *idx, size_t max) {
  size_t n = 0;
  for (size_t i = 0; i < s->nblocks; i++) {
    const snap_block_t *b = &s->blocks[i];
    if (b->state != SNAP_ACTIVE_ALLOCATED)
      continue;
    size_t pos = n;
    while (pos > 0) {
      const snap_block_t *p = &s->blocks[idx[pos - 1]];
      if (p->size > b->size || (p->size == b->size && p->address < b->address))
        break;
      pos--;
    }
    if (pos >= max)
      continue;
    if (n < max)
      n++;
    memmove(&idx[pos + 1], &idx[pos], (n - 1 - pos) * sizeof(*idx));
    idx[pos] = i;
  }
  return n;
}
