/* replay.c - gca-replay: replays an RMM log CSV allocation trace through the
 * caching allocator and reports how much device memory it reserved.
 *
 *   gca-replay TRACE.csv [--config STR]... [--device-memory 80GiB] [--repeat N]
 *              [--lenient] [--json] [--no-progress] [--snapshot FILE]
 *
 * The one idea: all checking happens once, while the trace is read. A hash
 * table from trace pointer to its allocation resolves every free to the slot
 * of the allocate it ends (and rejects frees before allocation, frees of
 * unknown or dead pointers and duplicate allocates of a live pointer, naming
 * the line); the replay loop then runs over a compact array of
 * {action, stream, slot, size} with the live gca pointers in a slot array, so
 * it measures the allocator and little else. Each --config replays the whole
 * trace on a fresh allocator (gca__allocator_reset + gca_set_config); peak
 * live bytes come from the trace, peak reserved from gca_get_stats, and the
 * external fragmentation (1 - largest free block / free bytes) is sampled
 * through gca__allocator_walk each time reserved memory reaches a new peak,
 * which a wrapped device table signals (only mem_alloc, mem_create and
 * mem_map can grow it). Sampling time is excluded from ns per event. After
 * the measured pass, --repeat N further passes over the warm cache give a
 * steady-state ns per event.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gca.h"
#include "common.h"
#include "device.h"
#include "introspect.h"
#include "json.h"
#include "rmm_csv.h"

/* The RMM reader reports through the tools' detail (util.h); this tool still
 * reports through the library's, so a reader failure's text is carried over. */
static gca_status_t tool_detail(gca_status_t st) {
  return st == GCA_OK ? st : gca__error(st, "%s", tool_last_error());
}

#define MAX_CONFIGS 16
#define MAX_STREAMS 1024

enum { EV_ALLOC = 0, EV_FREE = 1 };

/* One replayed event. Invariant: for EV_FREE, slot names an EV_ALLOC earlier
 * in the array whose block is live at this point of the trace. */
typedef struct replay_event {
  uint32_t action : 1;
  uint32_t stream : 31; /* index into trace_t.streams */
  uint32_t slot;        /* allocation number, 0-based, in trace order */
  uint64_t size;
} replay_event_t;

/* The checked trace. Invariants: nevents == nallocs + nfrees;
 * slot_size[s] is the size of allocation s (s < nallocs);
 * line[i] is the CSV line of events[i]; stream_ids[0] == 0 (the NULL stream). */
typedef struct trace {
  replay_event_t *events;
  uint64_t *line;
  size_t nevents, cap;
  uint64_t *slot_size;
  size_t nallocs, slot_cap;
  size_t nfrees, nfailures, nrows;
  size_t nunmatched;        /* frees of non-live pointers skipped under --lenient */
  uint64_t first_unmatched; /* line of the first one */
  uint64_t peak_live;
  uint64_t stream_ids[MAX_STREAMS];
  gca_stream_t streams[MAX_STREAMS];
  size_t nstreams;
  double parse_ns_per_event;
} trace_t;

/* Trace pointer -> its latest allocation. Open addressing, linear probing,
 * never deletes (a freed pointer keeps its entry, marked dead, so that a
 * second free is told apart from an unknown one). Invariant: count <= cap/2,
 * cap a power of two. */
typedef struct ptr_entry {
  uint64_t ptr;
  uint64_t line; /* line of the allocate (live) or of the free (dead) */
  uint32_t slot;
  uint8_t used, live;
} ptr_entry_t;

typedef struct ptr_map {
  ptr_entry_t *e;
  size_t cap, count;
} ptr_map_t;

typedef struct run_result {
  const char *config;
  uint64_t peak_reserved;
  uint64_t free_at_peak, largest_free_at_peak;
  double fragmentation;
  double ns_per_event, ns_per_event_warm;
  int64_t device_allocs, device_maps, ooms;
} run_result_t;

typedef struct options {
  const char *path;
  const char *configs[MAX_CONFIGS];
  int nconfigs;
  uint64_t device_memory;
  int repeat;
  bool json, progress, lenient;
  const char *snapshot; /* --snapshot: JSON after the first configuration's measured pass */
} options_t;

/* ---- pointer map ---- */

/* splitmix64's finalizer: trace pointers share their low (alignment) and high
 * bits, so every bit must reach the masked index. */
static size_t ptr_hash(uint64_t p, size_t cap) {
  p ^= p >> 30;
  p *= 0xbf58476d1ce4e5b9ull;
  p ^= p >> 27;
  p *= 0x94d049bb133111ebull;
  p ^= p >> 31;
  return (size_t)p & (cap - 1);
}

static ptr_entry_t *map_find(ptr_map_t *m, uint64_t p) {
  for (size_t i = ptr_hash(p, m->cap);; i = (i + 1) & (m->cap - 1)) {
    if (!m->e[i].used || m->e[i].ptr == p)
      return &m->e[i];
  }
}

static gca_status_t map_grow(ptr_map_t *m) {
  size_t ncap = m->cap ? m->cap * 2 : 1024;
  ptr_entry_t *old = m->e;
  size_t ocap = m->cap;
  m->e = calloc(ncap, sizeof(*m->e));
  if (!m->e) {
    m->e = old;
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "replay: pointer map of %zu entries: out of host memory", ncap);
  }
  m->cap = ncap;
  for (size_t i = 0; i < ocap; i++)
    if (old[i].used)
      *map_find(m, old[i].ptr) = old[i];
  free(old);
  return GCA_OK;
}

/* The entry for p, inserted (unused -> used, not live) when absent. */
static gca_status_t map_upsert(ptr_map_t *m, uint64_t p, ptr_entry_t **out) {
  if ((m->count + 1) * 2 > m->cap)
    GCA_CHECK(map_grow(m));
  ptr_entry_t *e = map_find(m, p);
  if (!e->used) {
    e->used = 1;
    e->ptr = p;
    e->live = 0;
    m->count++;
  }
  *out = e;
  return GCA_OK;
}

/* ---- loading and checking ---- */

static gca_status_t grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return GCA_OK;
  size_t n = *cap ? *cap : 4096;
  while (n < need)
    n *= 2;
  void *q = realloc(*p, n * elem);
  if (!q)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "replay: %zu trace events: out of host memory", n);
  *p = q;
  *cap = n;
  return GCA_OK;
}

static gca_status_t push_event(trace_t *t, replay_event_t ev, uint64_t line) {
  if (t->nevents == t->cap) {
    size_t c1 = t->cap, c2 = t->cap;
    GCA_CHECK(grow((void **)&t->events, &c1, t->nevents + 1, sizeof(*t->events)));
    GCA_CHECK(grow((void **)&t->line, &c2, t->nevents + 1, sizeof(*t->line)));
    t->cap = c1 < c2 ? c1 : c2;
  }
  t->events[t->nevents] = ev;
  t->line[t->nevents++] = line;
  return GCA_OK;
}

static gca_status_t stream_index(trace_t *t, uint64_t id, uint64_t line, uint32_t *out) {
  for (size_t i = 0; i < t->nstreams; i++) {
    if (t->stream_ids[i] == id) {
      *out = (uint32_t)i;
      return GCA_OK;
    }
  }
  if (t->nstreams == MAX_STREAMS)
    return gca__error(GCA_ERR_NOT_SUPPORTED, "replay: line %llu: more than %d distinct streams",
                      (unsigned long long)line, MAX_STREAMS);
  t->stream_ids[t->nstreams] = id;
  *out = (uint32_t)t->nstreams++;
  return GCA_OK;
}

/* After a free of a pointer never seen, reads on to tell "before its
 * allocation" from "unknown"; always returns GCA_ERR_PARSE. */
static gca_status_t unknown_free(gca_rmm_reader_t *r, const char *path, uint64_t line,
                                 uint64_t ptr) {
  for (;;) {
    gca_rmm_event_t ev;
    bool eof = false;
    if (gca__rmm_next(r, &ev, &eof) != GCA_OK || eof)
      break;
    if (ev.action == GCA_RMM_ALLOCATE && ev.pointer == ptr)
      return gca__error(GCA_ERR_PARSE,
                        "replay: %s line %llu: free of 0x%llx before its allocation at line %llu "
                        "(--lenient skips such frees)",
                        path, (unsigned long long)line, (unsigned long long)ptr,
                        (unsigned long long)ev.line);
  }
  return gca__error(GCA_ERR_PARSE,
                    "replay: %s line %llu: free of unknown pointer 0x%llx (never allocated; "
                    "--lenient skips such frees)",
                    path, (unsigned long long)line, (unsigned long long)ptr);
}

static gca_status_t add_row(trace_t *t, ptr_map_t *m, gca_rmm_reader_t *r, const options_t *o,
                            const gca_rmm_event_t *ev, uint64_t *live) {
  const char *path = o->path;
  t->nrows++;
  if (ev->action == GCA_RMM_ALLOCATE_FAILURE) {
    t->nfailures++;
    return GCA_OK;
  }
  uint32_t sidx = 0;
  GCA_CHECK(stream_index(t, ev->stream, ev->line, &sidx));
  ptr_entry_t *e;
  if (ev->action == GCA_RMM_ALLOCATE) {
    GCA_CHECK(map_upsert(m, ev->pointer, &e));
    if (e->live)
      return gca__error(GCA_ERR_PARSE,
                        "replay: %s line %llu: allocate of 0x%llx, which is already live "
                        "(allocated at line %llu)",
                        path, (unsigned long long)ev->line, (unsigned long long)ev->pointer,
                        (unsigned long long)e->line);
    if (t->nallocs >= UINT32_MAX)
      return gca__error(GCA_ERR_NOT_SUPPORTED, "replay: line %llu: more than 2^32 allocations",
                        (unsigned long long)ev->line);
    GCA_CHECK(grow((void **)&t->slot_size, &t->slot_cap, t->nallocs + 1, sizeof(uint64_t)));
    uint32_t slot = (uint32_t)t->nallocs++;
    t->slot_size[slot] = ev->size;
    e->live = 1;
    e->slot = slot;
    e->line = ev->line;
    *live += ev->size;
    if (*live > t->peak_live)
      t->peak_live = *live;
    replay_event_t re = {.action = EV_ALLOC, .stream = sidx, .slot = slot, .size = ev->size};
    return push_event(t, re, ev->line);
  }
  e = m->cap ? map_find(m, ev->pointer) : NULL;
  if (o->lenient && (!e || !e->used || !e->live)) {
    if (t->nunmatched++ == 0)
      t->first_unmatched = ev->line;
    return GCA_OK;
  }
  if (!e || !e->used)
    return unknown_free(r, path, ev->line, ev->pointer);
  if (!e->live)
    return gca__error(GCA_ERR_PARSE,
                      "replay: %s line %llu: free of 0x%llx, which is not live (freed at line "
                      "%llu)",
                      path, (unsigned long long)ev->line, (unsigned long long)ev->pointer,
                      (unsigned long long)e->line);
  e->live = 0;
  e->line = ev->line;
  *live -= t->slot_size[e->slot];
  t->nfrees++;
  replay_event_t re = {.action = EV_FREE, .stream = sidx, .slot = e->slot, .size = 0};
  return push_event(t, re, ev->line);
}

/* Progress on stderr: a bar when total is known, else a count. */
static void progress(bool on, const char *what, size_t done, size_t total) {
  if (!on)
    return;
  if (total == 0) {
    fprintf(stderr, "\r%-24.24s %zu rows", what, done);
    return;
  }
  int pct = (int)(done * 100 / total);
  char bar[41];
  for (int i = 0; i < 40; i++)
    bar[i] = i < pct * 40 / 100 ? '#' : ' ';
  bar[40] = '\0';
  fprintf(stderr, "\r%-24.24s [%s] %3d%%", what, bar, pct);
  if (done >= total)
    fputc('\n', stderr);
}

static gca_status_t load_trace(const options_t *o, trace_t *t) {
  gca_status_t st;
  gca_rmm_reader_t *r = NULL;
  ptr_map_t m = {0};
  uint64_t live = 0;
  GCA_CHECK(tool_detail(gca__rmm_open_file(o->path, &r)));
  t->stream_ids[0] = 0;
  t->nstreams = 1;
  uint64_t t0 = gca__now_ns();
  for (;;) {
    gca_rmm_event_t ev;
    bool eof = false;
    GCA_CHECK_GOTO(tool_detail(gca__rmm_next(r, &ev, &eof)), st, out);
    if (eof)
      break;
    GCA_CHECK_GOTO(add_row(t, &m, r, o, &ev, &live), st, out);
    if ((t->nrows & 0xffff) == 0)
      progress(o->progress, "reading trace", t->nrows, 0);
  }
  t->parse_ns_per_event = t->nrows ? (double)(gca__now_ns() - t0) / (double)t->nrows : 0;
  if (o->progress && t->nrows >= 0x10000)
    fputc('\n', stderr);
  st = GCA_OK;
out:
  free(m.e);
  gca__rmm_close(r);
  return st;
}

static void trace_free(trace_t *t) {
  free(t->events);
  free(t->line);
  free(t->slot_size);
}

/* ---- the device table wrapper: says when reserved memory may have grown ---- */

static const gca_device_ops_t *real_ops;
static gca_device_ops_t wrapped_ops;
static bool may_have_grown;
static int64_t map_calls;

static gca_status_t wrap_mem_alloc(int dev, size_t size, gca_devptr_t *out) {
  may_have_grown = true;
  return real_ops->mem_alloc(dev, size, out);
}

static gca_status_t wrap_mem_create(int dev, size_t size, gca_memhandle_t *out) {
  may_have_grown = true;
  return real_ops->mem_create(dev, size, out);
}

static gca_status_t wrap_mem_map(gca_devptr_t ptr, size_t size, size_t offset,
                                 gca_memhandle_t handle) {
  may_have_grown = true;
  gca_status_t st = real_ops->mem_map(ptr, size, offset, handle);
  if (st == GCA_OK)
    map_calls++;
  return st;
}

static gca_status_t install_wrapper(void) {
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops)
    return gca__error_prefix(st, "replay: device layer");
  if (ops == &wrapped_ops)
    return GCA_OK;
  real_ops = ops;
  wrapped_ops = *ops;
  wrapped_ops.mem_alloc = wrap_mem_alloc;
  wrapped_ops.mem_create = wrap_mem_create;
  wrapped_ops.mem_map = wrap_mem_map;
  gca__device_override(&wrapped_ops);
  return GCA_OK;
}

/* ---- replaying ---- */

typedef struct frag_sample {
  uint64_t total_free, largest_free;
} frag_sample_t;

static void frag_walk(const gca_segment_info_t *seg, const gca_block_info_t *blocks, size_t nblocks,
                      void *ctx) {
  frag_sample_t *f = ctx;
  for (size_t i = 0; i < nblocks; i++) {
    if (blocks[i].state != GCA_BLOCK_INACTIVE)
      continue;
    f->total_free += blocks[i].size;
    if (blocks[i].size > f->largest_free)
      f->largest_free = blocks[i].size;
  }
}

static gca_status_t sample_peak(run_result_t *res, uint64_t *peak_seen) {
  gca_stats_t s;
  GCA_CHECK(gca_get_stats(0, &s));
  uint64_t cur = (uint64_t)s.reserved_bytes[GCA_STAT_ALL].current;
  if (cur <= *peak_seen)
    return GCA_OK;
  *peak_seen = cur;
  frag_sample_t f = {0, 0};
  GCA_CHECK(gca__allocator_walk(0, frag_walk, &f));
  res->free_at_peak = f.total_free;
  res->largest_free_at_peak = f.largest_free;
  res->fragmentation = f.total_free ? 1.0 - (double)f.largest_free / (double)f.total_free : 0.0;
  return GCA_OK;
}

/* One pass over the trace. With `sample`, checks for a new reserved peak after
 * each allocation that touched the device. Returns the loop's time in *ns,
 * sampling excluded. */
static gca_status_t replay_pass(const trace_t *t, void **live, bool sample, run_result_t *res,
                                uint64_t *ns, int64_t *ooms, bool show) {
  uint64_t peak_seen = 0, excluded = 0;
  const replay_event_t *ev = t->events;
  may_have_grown = false;
  uint64_t t0 = gca__now_ns();
  for (size_t i = 0; i < t->nevents; i++) {
    gca_status_t st;
    if (ev[i].action == EV_ALLOC) {
      st = gca_malloc(&live[ev[i].slot], ev[i].size, t->streams[ev[i].stream]);
      if (GCA_UNLIKELY(st != GCA_OK)) {
        live[ev[i].slot] = NULL;
        if (st != GCA_ERR_OUT_OF_MEMORY)
          return gca__error_prefix(st, "replay: line %llu: allocate of %llu bytes",
                                   (unsigned long long)t->line[i], (unsigned long long)ev[i].size);
        (*ooms)++;
      }
      if (sample && may_have_grown) {
        uint64_t s0 = gca__now_ns();
        may_have_grown = false;
        GCA_CHECK(sample_peak(res, &peak_seen));
        excluded += gca__now_ns() - s0;
      }
    } else if (live[ev[i].slot]) {
      st = gca_free(live[ev[i].slot]);
      if (GCA_UNLIKELY(st != GCA_OK))
        return gca__error_prefix(st, "replay: line %llu: free", (unsigned long long)t->line[i]);
      live[ev[i].slot] = NULL;
    }
    if (GCA_UNLIKELY(show && (i & 0xffff) == 0xffff)) {
      uint64_t s0 = gca__now_ns();
      progress(true, res->config && *res->config ? res->config : "default", i, t->nevents);
      excluded += gca__now_ns() - s0;
    }
  }
  *ns = gca__now_ns() - t0 - excluded;
  if (show && t->nevents > 0xffff)
    progress(true, res->config && *res->config ? res->config : "default", 1, 1);
  return GCA_OK;
}

/* Frees what the trace left live, so a further pass starts from a warm cache. */
static gca_status_t free_remaining(const trace_t *t, void **live) {
  for (size_t s = 0; s < t->nallocs; s++) {
    if (live[s]) {
      GCA_CHECK(gca_free(live[s]));
      live[s] = NULL;
    }
  }
  return GCA_OK;
}

/* Writes gca_snapshot_json() to `path` (the history recorded during the pass
 * gives gca-snapshot its timeline). */
static gca_status_t write_snapshot(const char *path) {
  char *json = NULL;
  size_t len = 0;
  GCA_CHECK(gca_snapshot_json(&json, &len));
  gca_status_t st = GCA_OK;
  FILE *f = fopen(path, "w");
  if (f == NULL || fwrite(json, 1, len, f) != len)
    st = gca__error(GCA_ERR_IO, "replay: --snapshot %s: %s", path, strerror(errno));
  if (f != NULL && fclose(f) != 0 && st == GCA_OK)
    st = gca__error(GCA_ERR_IO, "replay: --snapshot %s: %s", path, strerror(errno));
  gca_string_free(json);
  return st;
}

static gca_status_t run_config(const options_t *o, const trace_t *t, const char *conf,
                               bool snapshot, run_result_t *res) {
  gca_status_t st;
  memset(res, 0, sizeof(*res));
  res->config = conf;
  gca__allocator_reset();
  if (conf && *conf && (st = gca_set_config(conf)) != GCA_OK)
    return gca__error_prefix(st, "replay: --config '%s'", conf);
  if (o->device_memory) {
    const char *backend = gca_device_backend_name();
    if (backend && strcmp(backend, "sim") == 0)
      GCA_CHECK(gca_sim_set_capacity(0, o->device_memory));
    else
      GCA_CHECK(gca_set_memory_limit(0, o->device_memory));
  }
  void **live = calloc(t->nallocs ? t->nallocs : 1, sizeof(void *));
  if (!live)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "replay: %zu live pointers: out of host memory",
                      t->nallocs);
  map_calls = 0;
  uint64_t ns = 0;
  if (snapshot) /* slows the measured pass a little: every event is also recorded */
    GCA_CHECK_GOTO(gca_record_history(true, t->nevents * 2 + 64, false), st, out);
  GCA_CHECK_GOTO(replay_pass(t, live, true, res, &ns, &res->ooms, o->progress), st, out);
  if (snapshot) {
    GCA_CHECK_GOTO(write_snapshot(o->snapshot), st, out);
    GCA_CHECK_GOTO(gca_record_history(false, 0, false), st, out);
  }
  res->ns_per_event = t->nevents ? (double)ns / (double)t->nevents : 0;
  gca_stats_t s;
  GCA_CHECK_GOTO(gca_get_stats(0, &s), st, out);
  res->peak_reserved = (uint64_t)s.reserved_bytes[GCA_STAT_ALL].peak;
  res->device_allocs = s.num_device_alloc;
  res->device_maps = map_calls;
  uint64_t warm_ns = 0;
  int64_t warm_ooms = 0;
  for (int k = 0; k < o->repeat; k++) {
    GCA_CHECK_GOTO(free_remaining(t, live), st, out);
    GCA_CHECK_GOTO(replay_pass(t, live, false, res, &ns, &warm_ooms, false), st, out);
    warm_ns += ns;
  }
  res->ns_per_event_warm =
      o->repeat > 0 && t->nevents ? (double)warm_ns / ((double)t->nevents * o->repeat) : 0;
  st = GCA_OK;
out:
  free(live);
  gca__allocator_reset();
  return st;
}

static gca_status_t create_streams(trace_t *t) {
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops)
    return gca__error_prefix(st, "replay: device layer");
  t->streams[0] = NULL;
  for (size_t i = 1; i < t->nstreams; i++)
    GCA_CHECK(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &t->streams[i]));
  return GCA_OK;
}

static void destroy_streams(trace_t *t) {
  const gca_device_ops_t *ops = gca__device();
  for (size_t i = 1; ops && i < t->nstreams; i++)
    if (t->streams[i])
      ops->stream_destroy(t->streams[i]);
}

/* ---- reporting ---- */

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static gca_status_t print_json(const options_t *o, const trace_t *t, const run_result_t *res,
                               int n) {
  gca_json_writer_t w;
  gca__json_writer_init(&w);
  gca__json_object_begin(&w);
  gca__json_key(&w, "trace");
  gca__json_string(&w, o->path);
  gca__json_key(&w, "backend");
  gca__json_string(&w, gca_device_backend_name());
  gca__json_key(&w, "device_memory");
  if (o->device_memory)
    gca__json_uint(&w, o->device_memory);
  else
    gca__json_null(&w);
  gca__json_key(&w, "events");
  gca__json_uint(&w, t->nrows);
  gca__json_key(&w, "allocations");
  gca__json_uint(&w, t->nallocs);
  gca__json_key(&w, "frees");
  gca__json_uint(&w, t->nfrees);
  gca__json_key(&w, "allocate_failures_skipped");
  gca__json_uint(&w, t->nfailures);
  gca__json_key(&w, "unmatched_frees_skipped");
  gca__json_uint(&w, t->nunmatched);
  gca__json_key(&w, "streams");
  gca__json_uint(&w, t->nstreams);
  gca__json_key(&w, "peak_live_bytes");
  gca__json_uint(&w, t->peak_live);
  gca__json_key(&w, "parse_ns_per_event");
  gca__json_double(&w, t->parse_ns_per_event);
  gca__json_key(&w, "runs");
  gca__json_array_begin(&w);
  for (int i = 0; i < n; i++) {
    const run_result_t *r = &res[i];
    gca__json_object_begin(&w);
    gca__json_key(&w, "config");
    gca__json_string(&w, r->config);
    gca__json_key(&w, "peak_reserved_bytes");
    gca__json_uint(&w, r->peak_reserved);
    gca__json_key(&w, "reserved_over_peak_live");
    gca__json_double(&w, t->peak_live ? (double)r->peak_reserved / (double)t->peak_live : 0);
    gca__json_key(&w, "fragmentation_at_peak_reserved");
    gca__json_double(&w, r->fragmentation);
    gca__json_key(&w, "free_bytes_at_peak_reserved");
    gca__json_uint(&w, r->free_at_peak);
    gca__json_key(&w, "largest_free_at_peak_reserved");
    gca__json_uint(&w, r->largest_free_at_peak);
    gca__json_key(&w, "ns_per_event");
    gca__json_double(&w, r->ns_per_event);
    gca__json_key(&w, "ns_per_event_warm");
    if (o->repeat > 0)
      gca__json_double(&w, r->ns_per_event_warm);
    else
      gca__json_null(&w);
    gca__json_key(&w, "device_allocations");
    gca__json_int(&w, r->device_allocs);
    gca__json_key(&w, "device_maps");
    gca__json_int(&w, r->device_maps);
    gca__json_key(&w, "ooms");
    gca__json_int(&w, r->ooms);
    gca__json_object_end(&w);
  }
  gca__json_array_end(&w);
  gca__json_object_end(&w);
  char *text = NULL;
  GCA_CHECK(gca__json_writer_finish(&w, &text, NULL));
  printf("%s\n", text);
  free(text);
  return GCA_OK;
}

static void print_table(const options_t *o, const trace_t *t, const run_result_t *res, int n) {
  char b1[32];
  printf("trace          %s: %zu events (%zu allocate, %zu free, %zu allocate failure skipped), "
         "%zu stream%s\n",
         base_name(o->path), t->nrows, t->nallocs, t->nfrees, t->nfailures, t->nstreams,
         t->nstreams == 1 ? "" : "s");
  if (t->nunmatched)
    printf("skipped        %zu free%s of pointers not live (--lenient), the first at line %llu\n",
           t->nunmatched, t->nunmatched == 1 ? "" : "s", (unsigned long long)t->first_unmatched);
  printf("peak live      %s (%llu bytes)\n", gca__format_size(t->peak_live, b1, sizeof(b1)),
         (unsigned long long)t->peak_live);
  printf("parsing        %.1f ns/event\n\n", t->parse_ns_per_event);
  int width = 16;
  for (int i = 0; i < n; i++) {
    int len = res[i].config && *res[i].config ? (int)strlen(res[i].config) : 7;
    if (len + 2 > width)
      width = len + 2;
  }
  printf("%-32s", "configuration");
  for (int i = 0; i < n; i++)
    printf("%*s", width, res[i].config && *res[i].config ? res[i].config : "default");
  printf("\n%-32s", "peak reserved bytes");
  for (int i = 0; i < n; i++)
    printf("%*llu", width, (unsigned long long)res[i].peak_reserved);
  printf("\n%-32s", "peak reserved");
  for (int i = 0; i < n; i++)
    printf("%*s", width, gca__format_size(res[i].peak_reserved, b1, sizeof(b1)));
  printf("\n%-32s", "reserved / peak live");
  for (int i = 0; i < n; i++)
    printf("%*.4f", width,
           t->peak_live ? (double)res[i].peak_reserved / (double)t->peak_live : 0.0);
  printf("\n%-32s", "fragmentation at peak reserved");
  for (int i = 0; i < n; i++)
    printf("%*.4f", width, res[i].fragmentation);
  printf("\n%-32s", "ns per event (first pass)");
  for (int i = 0; i < n; i++)
    printf("%*.1f", width, res[i].ns_per_event);
  if (o->repeat > 0) {
    printf("\n%-32s", "ns per event (warm passes)");
    for (int i = 0; i < n; i++)
      printf("%*.1f", width, res[i].ns_per_event_warm);
  }
  printf("\n%-32s", "device allocations");
  for (int i = 0; i < n; i++)
    printf("%*lld", width, (long long)res[i].device_allocs);
  printf("\n%-32s", "device maps");
  for (int i = 0; i < n; i++)
    printf("%*lld", width, (long long)res[i].device_maps);
  printf("\n%-32s", "OOMs");
  for (int i = 0; i < n; i++)
    printf("%*lld", width, (long long)res[i].ooms);
  printf("\n");
}

/* ---- command line ---- */

static void usage(FILE *f) {
  fprintf(f, "usage: gca-replay TRACE.csv [--config STR]... [--device-memory SIZE] [--repeat N]\n"
             "                  [--lenient] [--json] [--no-progress] [--snapshot FILE]\n"
             "Replays an RMM log CSV trace through the caching allocator, once per --config\n"
             "(default: the settings from GCA_ALLOC_CONF, else the defaults), and reports peak\n"
             "live and reserved bytes, fragmentation at peak, ns per event and device calls.\n"
             "  --device-memory SIZE  capacity of the simulated device (e.g. 80GiB)\n"
             "  --repeat N            warm passes timed after the measured one (default 3)\n"
             "  --lenient             skip (and count) frees of pointers that are not live, as\n"
             "                        in traces whose recording began after some allocations\n"
             "  --snapshot FILE       write a snapshot (JSON, for gca-snapshot) at the end of the\n"
             "                        first configuration's measured pass, with its history\n");
}

static int parse_args(int argc, char **argv, options_t *o) {
  o->repeat = 3;
  o->progress = isatty(STDERR_FILENO);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      exit(0);
    } else if (strcmp(a, "--json") == 0) {
      o->json = true;
    } else if (strcmp(a, "--lenient") == 0) {
      o->lenient = true;
    } else if (strcmp(a, "--no-progress") == 0) {
      o->progress = false;
    } else if (strcmp(a, "--snapshot") == 0 && i + 1 < argc) {
      o->snapshot = argv[++i];
    } else if (strcmp(a, "--config") == 0 && i + 1 < argc) {
      if (o->nconfigs == MAX_CONFIGS) {
        fprintf(stderr, "gca-replay: at most %d --config\n", MAX_CONFIGS);
        return -1;
      }
      o->configs[o->nconfigs++] = argv[++i];
    } else if (strcmp(a, "--device-memory") == 0 && i + 1 < argc) {
      if (gca__parse_size(argv[++i], &o->device_memory) != GCA_OK || o->device_memory == 0) {
        fprintf(stderr, "gca-replay: --device-memory: %s\n",
                o->device_memory ? gca_last_error() : "must be more than 0");
        return -1;
      }
    } else if (strcmp(a, "--repeat") == 0 && i + 1 < argc) {
      char *end = NULL;
      long v = strtol(argv[++i], &end, 10);
      if (!end || *end || v < 0 || v > 1000) {
        fprintf(stderr, "gca-replay: --repeat '%s' is not a count in 0..1000\n", argv[i]);
        return -1;
      }
      o->repeat = (int)v;
    } else if (a[0] == '-' && a[1] != '\0') {
      fprintf(stderr, "gca-replay: unknown or incomplete option '%s'\n", a);
      return -1;
    } else if (!o->path) {
      o->path = a;
    } else {
      fprintf(stderr, "gca-replay: more than one trace ('%s', '%s')\n", o->path, a);
      return -1;
    }
  }
  if (!o->path) {
    usage(stderr);
    return -1;
  }
  if (o->nconfigs == 0)
    o->configs[o->nconfigs++] = "";
  return 0;
}

int main(int argc, char **argv) {
  options_t o = {0};
  if (parse_args(argc, argv, &o) != 0)
    return 2;
  trace_t *t = calloc(1, sizeof(*t));
  run_result_t res[MAX_CONFIGS];
  gca_status_t st;
  int rc = 1;
  if (!t) {
    fprintf(stderr, "gca-replay: out of host memory\n");
    return 1;
  }
  GCA_CHECK_GOTO(load_trace(&o, t), st, fail_trace);
  GCA_CHECK_GOTO(install_wrapper(), st, fail_trace);
  GCA_CHECK_GOTO(create_streams(t), st, fail_streams);
  for (int i = 0; i < o.nconfigs; i++) {
    GCA_CHECK_GOTO(run_config(&o, t, o.configs[i], o.snapshot != NULL && i == 0, &res[i]), st,
                   fail_streams);
  }
  if (o.json)
    GCA_CHECK_GOTO(print_json(&o, t, res, o.nconfigs), st, fail_streams);
  else
    print_table(&o, t, res, o.nconfigs);
  rc = 0;
  st = GCA_OK;
fail_streams:
  destroy_streams(t);
fail_trace:
  if (st != GCA_OK)
    fprintf(stderr, "gca-replay: %s\n", gca_last_error());
  trace_free(t);
  free(t);
  return rc;
}
