/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot_html.c - gca-snapshot's page: one self-contained HTML file whose
 * inline script draws SVG from a JSON data island the C side writes, for one
 * snapshot or for two side by side (gca-snapshot A B).
 *
 * The split keeps each side simple: C decides every number (the timeline's
 * points, every block and event with its address, stream and stack, the
 * largest blocks) and prints them as JSON (by hand: numbers, and strings
 * through tool_json_string, which never writes a raw '<', so no "</script>"
 * can end the island early); the script (tools/snapshot_page.js, with
 * tools/snapshot_page.css, both embedded at build time by embed_text) only
 * lays them out and answers the pointer. The page fetches nothing.
 *
 * The island:
 *   {"snapshots": [{"title", "traces": [{device, hasTimes, t: [...],
 *                    a: [...], r: [...], ev: [[action, addr, size, stream,
 *                    stack], ...]}],
 *                   "segments": [{device, address, total, stream, large,
 *                    expandable, blocks: [[offset, size, state, address,
 *                    requested, stack], ...]}],
 *                   "largest": [{address, size, requested, segment, stack}]}],
 *    "actions": ["alloc", ...], "stacks": [["frame", ...], ...]}
 * where t/a/r hold one point before the first event and one after each, and
 * a stack is an index into "stacks" or -1 (Note [Stack table]). Addresses and
 * streams are "0x..." strings: they need not fit a double.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot_model.h"
#include "util.h"

/* tools/snapshot_page.js and tools/snapshot_page.css (embed_text). */
extern const char gca__snapshot_page_js[];
extern const char gca__snapshot_page_css[];

static void html_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '<':
      fputs("&lt;", f);
      break;
    case '>':
      fputs("&gt;", f);
      break;
    case '&':
      fputs("&amp;", f);
      break;
    case '"':
      fputs("&quot;", f);
      break;
    default:
      fputc(*s, f);
    }
  }
}

static void hex_string(FILE *f, uint64_t v) {
  fprintf(f, "\"0x%" PRIx64 "\"", v);
}

/* The shortest of %.15g..%.17g that reads back as v; null when not finite. */
static void json_double(FILE *f, double v) {
  if (!isfinite(v)) {
    fputs("null", f);
    return;
  }
  char b[32];
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(b, sizeof(b), "%.*g", prec, v);
    if (strtod(b, NULL) == v)
      break;
  }
  fputs(b, f);
}

/* Note [Stack table]: a history of many events carries the same few stacks
 * over and over (a training step allocates from the same places every
 * iteration), and each is a dozen frames of long names. Written per event the
 * island would grow by kilobytes an event; so every distinct stack is written
 * once, in "stacks", and blocks and events name it by index. Two stacks are
 * the same when their frames read the same as the page shows them. */
typedef struct stack_table {
  char **keys;      /* key i: stack i's frame lines, each NUL-terminated, back to back */
  size_t *key_lens; /* bytes of key i, its NULs included */
  size_t n, keys_cap;
  size_t *slots; /* open addressing over keys: 0 empty, else index + 1 */
  size_t nslots; /* a power of two, >= 2 * n */
  char *scratch; /* the key being looked up */
  size_t scratch_len, scratch_cap;
} stack_table_t;

static void stack_table_free(stack_table_t *t) {
  for (size_t i = 0; i < t->n; i++)
    free(t->keys[i]);
  free(t->keys);
  free(t->key_lens);
  free(t->slots);
  free(t->scratch);
}

static uint64_t hash_bytes(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
  return h;
}

/* Appends one frame as the page shows it, "name (file:line)", and a NUL. */
static gca_status_t scratch_frame(stack_table_t *t, const snap_frame_t *fr) {
  const char *name = fr->name[0] ? fr->name : "??";
  if (!t->scratch) { /* never an offset from NULL, even of zero */
    if (!(t->scratch = malloc(256)))
      return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: no memory for a stack of frames");
    t->scratch_cap = 256;
    t->scratch_len = 0;
  }
  for (;;) {
    size_t room = t->scratch_cap - t->scratch_len;
    int k;
    if (fr->filename[0] && fr->line > 0)
      k = snprintf(t->scratch + t->scratch_len, room, "%s (%s:%" PRId64 ")", name, fr->filename,
                   fr->line);
    else if (fr->filename[0])
      k = snprintf(t->scratch + t->scratch_len, room, "%s (%s)", name, fr->filename);
    else
      k = snprintf(t->scratch + t->scratch_len, room, "%s", name);
    if (k < 0)
      return tool_error(GCA_ERR_INVALID_ARGUMENT, "snapshot: a frame cannot be formatted");
    if ((size_t)k < room) {
      t->scratch_len += (size_t)k + 1;
      return GCA_OK;
    }
    size_t cap = t->scratch_cap * 2 + (size_t)k + 1;
    char *bigger = realloc(t->scratch, cap);
    if (!bigger)
      return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: no memory for a stack of frames");
    t->scratch = bigger;
    t->scratch_cap = cap;
  }
}

static gca_status_t stack_table_grow(stack_table_t *t) {
  size_t nslots = t->nslots ? t->nslots * 2 : 256;
  size_t *slots = calloc(nslots, sizeof(*slots));
  if (!slots)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: no memory for the stack table");
  for (size_t i = 0; i < t->n; i++) {
    size_t s = (size_t)hash_bytes(t->keys[i], t->key_lens[i]) & (nslots - 1);
    while (slots[s])
      s = (s + 1) & (nslots - 1);
    slots[s] = i + 1;
  }
  free(t->slots);
  t->slots = slots;
  t->nslots = nslots;
  return GCA_OK;
}

/* *id = the index of the stack of these frames, added when new; -1 when
 * there are no frames. */
static gca_status_t stack_id(stack_table_t *t, const snap_frame_t *frames, size_t n, long *id) {
  *id = -1;
  if (n == 0)
    return GCA_OK;
  t->scratch_len = 0;
  for (size_t i = 0; i < n; i++)
    TOOL_CHECK(scratch_frame(t, &frames[i]));
  if (2 * (t->n + 1) > t->nslots)
    TOOL_CHECK(stack_table_grow(t));
  uint64_t h = hash_bytes(t->scratch, t->scratch_len);
  size_t s = (size_t)h & (t->nslots - 1);
  for (; t->slots[s]; s = (s + 1) & (t->nslots - 1)) {
    size_t k = t->slots[s] - 1;
    if (t->key_lens[k] == t->scratch_len && memcmp(t->keys[k], t->scratch, t->scratch_len) == 0) {
      *id = (long)k;
      return GCA_OK;
    }
  }
  if (t->n == t->keys_cap) {
    size_t cap = t->keys_cap ? t->keys_cap * 2 : 64;
    char **keys = realloc(t->keys, cap * sizeof(*keys));
    if (keys)
      t->keys = keys;
    size_t *lens = keys ? realloc(t->key_lens, cap * sizeof(*lens)) : NULL;
    if (!lens)
      return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: no memory for the stack table");
    t->key_lens = lens;
    t->keys_cap = cap;
  }
  char *key = malloc(t->scratch_len);
  if (!key)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "snapshot: no memory for the stack table");
  memcpy(key, t->scratch, t->scratch_len);
  t->keys[t->n] = key;
  t->key_lens[t->n] = t->scratch_len;
  t->slots[s] = ++t->n;
  *id = (long)(t->n - 1);
  return GCA_OK;
}

static void write_stacks(FILE *f, const stack_table_t *t) {
  fputs("\"stacks\":[", f);
  for (size_t i = 0; i < t->n; i++) {
    fputs(i ? ",[" : "[", f);
    for (size_t off = 0; off < t->key_lens[i]; off += strlen(t->keys[i] + off) + 1) {
      if (off)
        fputc(',', f);
      tool_json_string(f, t->keys[i] + off);
    }
    fputc(']', f);
  }
  fputc(']', f);
}

static gca_status_t write_traces(FILE *f, const snapshot_t *s, stack_table_t *stacks) {
  fputs("\"traces\":[", f);
  bool first = true;
  for (size_t i = 0; i < s->ntraces; i++) {
    const snap_trace_t *t = &s->traces[i];
    if (t->nevents == 0)
      continue;
    fprintf(f, "%s{\"device\":%lld,\"hasTimes\":%s,\"t\":[", first ? "" : ",", (long long)t->device,
            t->has_times ? "true" : "false");
    first = false;
    json_double(f, t->events[0].time_us);
    for (size_t j = 0; j < t->nevents; j++) {
      fputc(',', f);
      json_double(f, t->events[j].time_us);
    }
    fprintf(f, "],\"a\":[%lld", (long long)t->allocated_before);
    for (size_t j = 0; j < t->nevents; j++)
      fprintf(f, ",%lld", (long long)t->events[j].allocated_after);
    fprintf(f, "],\"r\":[%lld", (long long)t->reserved_before);
    for (size_t j = 0; j < t->nevents; j++)
      fprintf(f, ",%lld", (long long)t->events[j].reserved_after);
    fputs("],\"ev\":[", f);
    for (size_t j = 0; j < t->nevents; j++) {
      const snap_event_t *e = &t->events[j];
      long stack;
      TOOL_CHECK(stack_id(stacks, e->frames, e->nframes, &stack));
      fprintf(f, "%s[%d,", j ? "," : "", (int)e->action);
      hex_string(f, e->addr);
      fprintf(f, ",%" PRIu64 ",", e->size);
      hex_string(f, e->stream);
      fprintf(f, ",%ld]", stack);
    }
    fputs("]}", f);
  }
  fputc(']', f);
  return GCA_OK;
}

static gca_status_t write_segments(FILE *f, const snapshot_t *s, stack_table_t *stacks) {
  fputs("\"segments\":[", f);
  for (size_t i = 0; i < s->nsegments; i++) {
    const snap_segment_t *sg = &s->segments[i];
    fprintf(f, "%s{\"device\":%lld,\"address\":", i ? "," : "", (long long)sg->device);
    hex_string(f, sg->address);
    fprintf(f, ",\"total\":%" PRIu64 ",\"stream\":", sg->total_size);
    hex_string(f, sg->stream);
    fprintf(f, ",\"large\":%s,\"expandable\":%s,\"blocks\":[", sg->is_large ? "true" : "false",
            sg->is_expandable ? "true" : "false");
    for (size_t j = 0; j < sg->nblocks; j++) {
      const snap_block_t *b = &s->blocks[sg->first_block + j];
      long stack;
      TOOL_CHECK(stack_id(stacks, b->frames, b->nframes, &stack));
      fprintf(f, "%s[%" PRIu64 ",%" PRIu64 ",%d,", j ? "," : "",
              b->address >= sg->address ? b->address - sg->address : 0, b->size, (int)b->state);
      hex_string(f, b->address);
      fprintf(f, ",%" PRIu64 ",%ld]", b->requested_size, stack);
    }
    fputs("]}", f);
  }
  fputc(']', f);
  return GCA_OK;
}

static gca_status_t write_largest(FILE *f, const snapshot_t *s, size_t top, stack_table_t *stacks) {
  size_t idx[256];
  if (top > TOOL_ARRAY_SIZE(idx))
    top = TOOL_ARRAY_SIZE(idx);
  size_t n = gca__snapshot_largest(s, idx, top);
  fputs("\"largest\":[", f);
  for (size_t i = 0; i < n; i++) {
    const snap_block_t *b = &s->blocks[idx[i]];
    long stack;
    TOOL_CHECK(stack_id(stacks, b->frames, b->nframes, &stack));
    fputs(i ? ",{\"address\":" : "{\"address\":", f);
    hex_string(f, b->address);
    fprintf(f, ",\"size\":%" PRIu64 ",\"requested\":%" PRIu64 ",\"segment\":", b->size,
            b->requested_size);
    hex_string(f, s->segments[b->segment].address);
    fprintf(f, ",\"stack\":%ld}", stack);
  }
  fputc(']', f);
  return GCA_OK;
}

/* The data island: one JSON object, written straight into the page. */
static gca_status_t write_island(FILE *f, const snapshot_t *snaps, const char *const *titles,
                                 size_t n, size_t top) {
  stack_table_t stacks = {0};
  gca_status_t st = GCA_OK;
  fputs("{\"snapshots\":[", f);
  for (size_t i = 0; i < n; i++) {
    fputs(i ? ",{\"title\":" : "{\"title\":", f);
    tool_json_string(f, titles[i]);
    fputc(',', f);
    TOOL_CHECK_GOTO(write_traces(f, &snaps[i], &stacks), st, out);
    fputc(',', f);
    TOOL_CHECK_GOTO(write_segments(f, &snaps[i], &stacks), st, out);
    fputc(',', f);
    TOOL_CHECK_GOTO(write_largest(f, &snaps[i], top, &stacks), st, out);
    fputc('}', f);
  }
  fputs("],\"actions\":[", f);
  for (int a = 0; a < SNAP_ACTIONS; a++) {
    if (a)
      fputc(',', f);
    tool_json_string(f, gca__snapshot_action_name((snap_action_t)a));
  }
  fputs("],", f);
  write_stacks(f, &stacks);
  fputc('}', f);
out:
  stack_table_free(&stacks);
  return st;
}

/* One snapshot's section: its title and totals; the script fills the
 * placeholders (timelines, segment map, the list of a clicked segment's
 * blocks, largest blocks). */
static void write_section(FILE *f, const snapshot_t *s, const char *title, size_t index) {
  char b[5][32];
  fprintf(f, "<section class=\"snapshot\" data-index=\"%zu\">\n<h2>", index);
  html_escape(f, title);
  fprintf(f, "</h2><div class=\"note\">%zu segments, %zu blocks</div>\n", s->nsegments, s->nblocks);
  fprintf(f,
          "<h3>Totals</h3>\n<table class=\"totals\">"
          "<tr><td>reserved</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr>"
          "<tr><td>active_allocated</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr>"
          "<tr><td>active_pending_free</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr>"
          "<tr><td>inactive</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr>"
          "<tr><td>requested</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr></table>\n",
          s->reserved, tool_format_size(s->reserved, b[0], sizeof(b[0])),
          s->by_state[SNAP_ACTIVE_ALLOCATED],
          tool_format_size(s->by_state[SNAP_ACTIVE_ALLOCATED], b[1], sizeof(b[1])),
          s->by_state[SNAP_ACTIVE_PENDING_FREE],
          tool_format_size(s->by_state[SNAP_ACTIVE_PENDING_FREE], b[2], sizeof(b[2])),
          s->by_state[SNAP_INACTIVE],
          tool_format_size(s->by_state[SNAP_INACTIVE], b[3], sizeof(b[3])), s->requested,
          tool_format_size(s->requested, b[4], sizeof(b[4])));
  fputs(
      "<h3>Allocated and reserved bytes over the history</h3>\n"
      "<div class=\"legend\"><span style=\"background:#d9534f\"></span>allocated"
      "<span style=\"background:#337ab7\"></span>reserved</div>\n<div class=\"timelines\"></div>\n"
      "<h3>Segments</h3>\n<div class=\"legend\"><span style=\"background:#d9534f\"></span>"
      "active_allocated<span style=\"background:#f0ad4e\"></span>active_pending_free"
      "<span style=\"background:#9fd39f\"></span>inactive</div>\n<div class=\"segmap\"></div>\n"
      "<div class=\"seglist\"></div>\n"
      "<h3>Largest live blocks</h3>\n<div class=\"largest\"></div>\n</section>\n",
      f);
}

gca_status_t gca__snapshot_write_html(const snapshot_t *snaps, const char *const *titles, size_t n,
                                      size_t top, FILE *f) {
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<style>\n",
        f);
  fputs(gca__snapshot_page_css, f);
  fputs("</style>\n<title>gca snapshot: ", f);
  for (size_t i = 0; i < n; i++) {
    if (i)
      fputs(" vs ", f);
    html_escape(f, titles[i]);
  }
  fprintf(f,
          "</title></head>\n<body data-gca-snapshots=\"%zu\">\n<h1>gca snapshot%s</h1>\n"
          "<div class=\"toolbar\"><button type=\"button\" id=\"gca-reset\">Reset zoom</button>"
          "<span class=\"note\">Timeline: the wheel zooms about the pointer, a drag pans, keys "
          "+ and &minus; zoom, &larr; and &rarr; pan, 0 resets%s. Hover a block or the timeline "
          "for details; click a segment to list its blocks.</span></div>\n"
          "<div class=\"snapshots%s\">\n",
          n, n > 1 ? "s side by side" : "",
          n > 1 ? "; the timelines share their time axis, from each snapshot's first event" : "",
          n > 1 ? " pair" : "");
  for (size_t i = 0; i < n; i++)
    write_section(f, &snaps[i], titles[i], i);
  fputs("</div>\n<div id=\"gca-detail\" hidden></div>\n"
        "<script type=\"application/json\" id=\"gca-data\">",
        f);
  gca_status_t st = write_island(f, snaps, titles, n, top);
  if (st != GCA_OK)
    return st;
  fputs("</script>\n<script>\n", f);
  fputs(gca__snapshot_page_js, f);
  fputs("</script>\n</body></html>\n", f);
  if (fflush(f) != 0 || ferror(f))
    return tool_error(GCA_ERR_IO, "snapshot: writing the page failed");
  return GCA_OK;
}
