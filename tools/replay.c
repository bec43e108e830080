/* SPDX-License-Identifier: Apache-2.0 */
/* replay.c - gca-replay: replays an RMM log CSV allocation trace through the
 * caching allocator and reports how much device memory it reserved.
 *
 *   gca-replay TRACE.csv [--config STR]... [--device-memory 80GiB] [--repeat N]
 *              [--lag N] [--lenient] [--json] [--no-progress] [--snapshot FILE] [--help]
 *
 * The one idea: all checking happens once, while the trace is read. A hash
 * table from trace pointer to its allocation resolves every free to the slot
 * of the allocate it ends (and rejects frees before allocation, frees of
 * unknown or dead pointers and duplicate allocates of a live pointer, naming
 * the line); the replay loop then runs over a compact array of
 * {action, stream, slot, size} with the live gca pointers in a slot array, so
 * it measures the allocator and little else. It uses the public API only.
 * Each --config replays the whole trace on an emptied allocator: every block
 * the previous one left is freed, gca_empty_cache returns the segments, the
 * statistics are reset (gca_reset_peak_stats, gca_reset_accumulated_stats),
 * and gca_set_config applies the settings in force at start, then the
 * configuration's own string. Peak live bytes come from the trace, peak
 * reserved from gca_get_stats, and the external fragmentation
 * (1 - largest free block / free bytes, gca_get_free_blocks) is sampled each
 * time reserved memory reaches a new peak, which a trace observer signals
 * (only a segment allocation or a mapping can grow it; the observer also
 * counts the mappings). Sampling time is excluded from ns per event, but the
 * measured pass runs with the observer attached, so it takes the allocator's
 * locked path (the free cache's lock-free hits are off while any observer or
 * recorder is on). After it, --repeat N further passes over the warm cache,
 * without the observer, give a steady-state ns per event. With --lag N the
 * trace's streams run N events behind the host (replay_lag.c), as an
 * engine's GPU runs behind its host: freed memory stays in use by queued
 * work for a while, and any wait the allocator makes for a stream shows as
 * a stall.
 */
#include <errno.h>
#include <getopt.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "gca.h"
#include "replay_lag.h"
#include "rmm_csv.h"
#include "torch_snapshot.h"
#include "util.h"

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
  bool torch;              /* read from a PyTorch snapshot pickle */
  uint64_t torch_reserved; /* its segments' total for the device: PyTorch's reserved bytes */
  size_t torch_devices, torch_live_before;
  double torch_read_mb_s; /* the pickle reader's speed */
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
  int64_t driver_calls, grown_bytes, handle_moves; /* of the measured pass */
  double warm_driver_calls, warm_handle_moves;     /* per warm pass: the steady state */
  double warm_retries, warm_ooms; /* per warm pass: out-of-memory retries, failed requests */
  int64_t lag_stalls;             /* --lag: the host blocked on a stream, all passes */
  int64_t peak_lent, lent_waits;  /* all passes: stats.lent_bytes' peak, num_lent_waits */
} run_result_t;

/* Driver calls per GiB of memory made usable: the cost of growth. */
static double calls_per_gib(const run_result_t *r) {
  return r->grown_bytes ? (double)r->driver_calls * 1073741824.0 / (double)r->grown_bytes : 0.0;
}

typedef struct options {
  const char *path;
  const char *configs[MAX_CONFIGS];
  int nconfigs;
  uint64_t device_memory;
  int repeat;
  uint64_t lag; /* --lag: events the streams run behind the host (0: none) */
  bool json, progress, lenient;
  const char *snapshot; /* --snapshot: JSON after the first configuration's measured pass */
  int device;           /* --device: the device trace of a PyTorch snapshot */
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
    return tool_error(GCA_ERR_OUT_OF_MEMORY,
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
    TOOL_CHECK(map_grow(m));
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
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "replay: %zu trace events: out of host memory", n);
  *p = q;
  *cap = n;
  return GCA_OK;
}

static gca_status_t push_event(trace_t *t, replay_event_t ev, uint64_t line) {
  if (t->nevents == t->cap) {
    size_t c1 = t->cap, c2 = t->cap;
    TOOL_CHECK(grow((void **)&t->events, &c1, t->nevents + 1, sizeof(*t->events)));
    TOOL_CHECK(grow((void **)&t->line, &c2, t->nevents + 1, sizeof(*t->line)));
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
    return tool_error(GCA_ERR_NOT_SUPPORTED, "replay: line %llu: more than %d distinct streams",
                      (unsigned long long)line, MAX_STREAMS);
  t->stream_ids[t->nstreams] = id;
  *out = (uint32_t)t->nstreams++;
  return GCA_OK;
}

/* After a free of a pointer never seen, reads on to tell "before its
 * allocation" from "unknown"; always returns GCA_ERR_PARSE. */
static gca_status_t unknown_free(gca_rmm_reader_t *r, const char *path, uint64_t line,
                                 uint64_t ptr) {
  for (; r != NULL;) {
    gca_rmm_event_t ev;
    bool eof = false;
    if (gca__rmm_next(r, &ev, &eof) != GCA_OK || eof)
      break;
    if (ev.action == GCA_RMM_ALLOCATE && ev.pointer == ptr)
      return tool_error(GCA_ERR_PARSE,
                        "replay: %s line %llu: free of 0x%llx before its allocation at line %llu "
                        "(--lenient skips such frees)",
                        path, (unsigned long long)line, (unsigned long long)ptr,
                        (unsigned long long)ev.line);
  }
  return tool_error(GCA_ERR_PARSE,
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
  TOOL_CHECK(stream_index(t, ev->stream, ev->line, &sidx));
  ptr_entry_t *e;
  if (ev->action == GCA_RMM_ALLOCATE) {
    TOOL_CHECK(map_upsert(m, ev->pointer, &e));
    if (e->live)
      return tool_error(GCA_ERR_PARSE,
                        "replay: %s line %llu: allocate of 0x%llx, which is already live "
                        "(allocated at line %llu)",
                        path, (unsigned long long)ev->line, (unsigned long long)ev->pointer,
                        (unsigned long long)e->line);
    if (t->nallocs >= UINT32_MAX)
      return tool_error(GCA_ERR_NOT_SUPPORTED, "replay: line %llu: more than 2^32 allocations",
                        (unsigned long long)ev->line);
    TOOL_CHECK(grow((void **)&t->slot_size, &t->slot_cap, t->nallocs + 1, sizeof(uint64_t)));
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
    return tool_error(GCA_ERR_PARSE,
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

/* Note [Replaying a PyTorch snapshot] (torch_snapshot.c): the pickle's
 * device trace as rows, through the same checks as a CSV's. */
static gca_status_t load_pickle(const options_t *o, trace_t *t, const char *data, size_t len) {
  py_doc_t *doc = NULL;
  const py_value_t *root = NULL;
  torch_events_t te;
  uint64_t t0 = tool_now_ns();
  TOOL_CHECK(py_pickle_load(data, len, o->path, &doc, &root));
  double s = (double)(tool_now_ns() - t0) / 1e9;
  t->torch_read_mb_s = s > 0 ? (double)len / 1e6 / s : 0;
  gca_status_t st = torch_snapshot_events(root, o->path, o->device, &te);
  py_doc_free(doc);
  if (st != GCA_OK)
    return st;
  t->torch = true;
  t->torch_reserved = te.torch_reserved;
  t->torch_devices = te.ndevices;
  t->torch_live_before = te.live_before;
  ptr_map_t m = {0};
  uint64_t live = 0;
  t->stream_ids[0] = 0;
  t->nstreams = 1;
  for (size_t i = 0; i < te.n && st == GCA_OK; i++)
    st = add_row(t, &m, NULL, o, &te.events[i], &live);
  free(m.e);
  free(te.events);
  return st;
}

/* Whether the file at path starts like a pickle; then its bytes in *data.
 * Anything else is left to the CSV reader, which streams it. */
static gca_status_t read_if_pickle(const char *path, char **data, size_t *len) {
  *data = NULL;
  *len = 0;
  if (strcmp(path, "-") == 0)
    return GCA_OK;
  FILE *f = fopen(path, "rb");
  if (!f)
    return GCA_OK; /* the CSV reader reports it */
  unsigned char head[2] = {0, 0};
  size_t got = fread(head, 1, 2, f);
  fclose(f);
  if (!py_is_pickle(head, got))
    return GCA_OK;
  gca_status_t st = tool_read_file(path, data, len);
  return st == GCA_OK ? GCA_OK : tool_error_prefix(st, "replay");
}

static gca_status_t load_trace(const options_t *o, trace_t *t) {
  gca_status_t st;
  gca_rmm_reader_t *r = NULL;
  char *pk = NULL;
  size_t pklen = 0;
  TOOL_CHECK(read_if_pickle(o->path, &pk, &pklen));
  if (pk) {
    st = load_pickle(o, t, pk, pklen);
    free(pk);
    return st;
  }
  ptr_map_t m = {0};
  uint64_t live = 0;
  TOOL_CHECK((gca__rmm_open_file(o->path, &r)));
  t->stream_ids[0] = 0;
  t->nstreams = 1;
  uint64_t t0 = tool_now_ns();
  for (;;) {
    gca_rmm_event_t ev;
    bool eof = false;
    TOOL_CHECK_GOTO((gca__rmm_next(r, &ev, &eof)), st, out);
    if (eof)
      break;
    TOOL_CHECK_GOTO(add_row(t, &m, r, o, &ev, &live), st, out);
    if ((t->nrows & 0xffff) == 0)
      progress(o->progress, "reading trace", t->nrows, 0);
  }
  t->parse_ns_per_event = t->nrows ? (double)(tool_now_ns() - t0) / (double)t->nrows : 0;
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

/* ---- the trace observer: says when reserved memory may have grown ---- */

/* Set by the observer (allocator lock held, possibly on another thread than
 * the replay's only in principle: the replay is single-threaded). */
static atomic_bool may_have_grown;
static atomic_llong map_events;

static void on_trace_event(const gca_trace_event_t *ev, void *ctx) {
  (void)ctx;
  if (ev->action == GCA_TRACE_SEGMENT_ALLOC || ev->action == GCA_TRACE_SEGMENT_MAP)
    atomic_store_explicit(&may_have_grown, true, memory_order_relaxed);
  if (ev->action == GCA_TRACE_SEGMENT_MAP)
    atomic_fetch_add_explicit(&map_events, 1, memory_order_relaxed);
}

/* ---- replaying ---- */

static gca_status_t sample_peak(run_result_t *res, uint64_t *peak_seen) {
  gca_stats_t s;
  TOOL_CHECK_GCA(gca_get_stats(0, &s));
  uint64_t cur = (uint64_t)s.reserved_bytes[GCA_STAT_ALL].current;
  if (cur <= *peak_seen)
    return GCA_OK;
  *peak_seen = cur;
  uint64_t total_free = 0, largest_free = 0;
  TOOL_CHECK_GCA(gca_get_free_blocks(0, &total_free, &largest_free));
  res->free_at_peak = total_free;
  res->largest_free_at_peak = largest_free;
  res->fragmentation = total_free ? 1.0 - (double)largest_free / (double)total_free : 0.0;
  return GCA_OK;
}

/* One pass over the trace. With `sample`, checks for a new reserved peak after
 * each allocation that touched the device. Returns the loop's time in *ns,
 * sampling excluded. */
static gca_status_t replay_pass(const trace_t *t, void **live, bool sample, run_result_t *res,
                                uint64_t *ns, int64_t *ooms, bool show, uint64_t lag) {
  uint64_t peak_seen = 0, excluded = 0;
  const replay_event_t *ev = t->events;
  atomic_store(&may_have_grown, false);
  if (lag != 0)
    replay_lag_start(lag);
  uint64_t t0 = tool_now_ns();
  for (size_t i = 0; i < t->nevents; i++) {
    gca_status_t st;
    if (ev[i].action == EV_ALLOC) {
      st = gca_malloc(&live[ev[i].slot], ev[i].size, t->streams[ev[i].stream]);
      if (TOOL_UNLIKELY(st != GCA_OK)) {
        live[ev[i].slot] = NULL;
        if (st != GCA_ERR_OUT_OF_MEMORY)
          return tool_error_gca(st, "replay: line %llu: allocate of %llu bytes",
                                (unsigned long long)t->line[i], (unsigned long long)ev[i].size);
        (*ooms)++;
      }
      if (sample && atomic_load_explicit(&may_have_grown, memory_order_relaxed)) {
        uint64_t s0 = tool_now_ns();
        atomic_store_explicit(&may_have_grown, false, memory_order_relaxed);
        TOOL_CHECK(sample_peak(res, &peak_seen));
        excluded += tool_now_ns() - s0;
      }
    } else if (live[ev[i].slot]) {
      st = gca_free(live[ev[i].slot]);
      if (TOOL_UNLIKELY(st != GCA_OK))
        return tool_error_gca(st, "replay: line %llu: free", (unsigned long long)t->line[i]);
      live[ev[i].slot] = NULL;
    }
    if (lag != 0)
      TOOL_CHECK(replay_lag_after(i, t->streams[ev[i].stream]));
    if (TOOL_UNLIKELY(show && (i & 0xffff) == 0xffff)) {
      uint64_t s0 = tool_now_ns();
      progress(true, res->config && *res->config ? res->config : "default", i, t->nevents);
      excluded += tool_now_ns() - s0;
    }
  }
  *ns = tool_now_ns() - t0 - excluded;
  if (lag != 0)
    TOOL_CHECK(replay_lag_drain(t->streams, t->nstreams));
  if (show && t->nevents > 0xffff)
    progress(true, res->config && *res->config ? res->config : "default", 1, 1);
  return GCA_OK;
}

/* Frees what the trace left live, so a further pass starts from a warm cache. */
static gca_status_t free_remaining(const trace_t *t, void **live) {
  for (size_t s = 0; s < t->nallocs; s++) {
    if (live[s]) {
      TOOL_CHECK_GCA(gca_free(live[s]));
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
  TOOL_CHECK_GCA(gca_snapshot_json(&json, &len));
  gca_status_t st = GCA_OK;
  FILE *f = fopen(path, "w");
  if (f == NULL || fwrite(json, 1, len, f) != len)
    st = tool_error(GCA_ERR_IO, "replay: --snapshot %s: %s", path, strerror(errno));
  if (f != NULL && fclose(f) != 0 && st == GCA_OK)
    st = tool_error(GCA_ERR_IO, "replay: --snapshot %s: %s", path, strerror(errno));
  gca_string_free(json);
  return st;
}

/* Brings the allocator to the state of a fresh one, as far as the figures go:
 * nothing reserved, statistics reset, the settings in force at start (`base`)
 * then `conf`, the device memory option. */
static gca_status_t prepare_allocator(const options_t *o, const char *base, const char *conf) {
  gca_status_t st;
  TOOL_CHECK_GCA(gca_empty_cache());
  /* on the sim, main sized the device before the allocator first read its
   * memory (once, when it starts on the device: an expandable segment
   * reserves address space for all of it); on a GPU the option is a limit */
  const char *backend = gca_device_backend_name();
  if (o->device_memory && (!backend || strcmp(backend, "sim") != 0))
    TOOL_CHECK_GCA(gca_set_memory_limit(0, o->device_memory));
  if ((st = gca_set_config(base)) != GCA_OK)
    return tool_error_gca(st, "replay: restoring the settings '%s'", base);
  if (conf && *conf && (st = gca_set_config(conf)) != GCA_OK)
    return tool_error_gca(st, "replay: --config '%s'", conf);
  TOOL_CHECK_GCA(gca_reset_peak_stats(0));
  TOOL_CHECK_GCA(gca_reset_accumulated_stats(0));
  return GCA_OK;
}

static gca_status_t run_config(const options_t *o, const trace_t *t, const char *base,
                               const char *conf, bool snapshot, run_result_t *res) {
  gca_status_t st;
  gca_trace_observer_handle_t observer = 0;
  memset(res, 0, sizeof(*res));
  res->config = conf;
  TOOL_CHECK(prepare_allocator(o, base, conf));
  void **live = calloc(t->nallocs ? t->nallocs : 1, sizeof(void *));
  if (!live)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "replay: %zu live pointers: out of host memory",
                      t->nallocs);
  atomic_store(&map_events, 0);
  uint64_t ns = 0;
  if (snapshot && (st = gca_record_history(true, t->nevents * 2 + 64, false)) != GCA_OK) {
    /* slows the measured pass a little: every event is also recorded */
    st = tool_error_gca(st, "replay: --snapshot: recording history");
    goto out;
  }
  if ((st = gca_trace_observer_add(on_trace_event, NULL, &observer)) != GCA_OK) {
    st = tool_error_gca(st, "replay: attaching the trace observer");
    goto out;
  }
  int64_t stalls = replay_lag_stalls();
  TOOL_CHECK_GOTO(replay_pass(t, live, true, res, &ns, &res->ooms, o->progress, o->lag), st, out);
  TOOL_CHECK_GOTO(gca_trace_observer_remove(observer), st, out);
  observer = 0;
  if (snapshot) {
    TOOL_CHECK_GOTO(write_snapshot(o->snapshot), st, out);
    gca_record_history(false, 0, false); /* stopping cannot fail */
    snapshot = false;
  }
  res->ns_per_event = t->nevents ? (double)ns / (double)t->nevents : 0;
  gca_stats_t s;
  if ((st = gca_get_stats(0, &s)) != GCA_OK) {
    st = tool_error_gca(st, "replay: gca_get_stats");
    goto out;
  }
  res->peak_reserved = (uint64_t)s.reserved_bytes[GCA_STAT_ALL].peak;
  res->device_allocs = s.num_device_alloc;
  res->device_maps = atomic_load(&map_events);
  res->driver_calls = s.num_driver_calls;
  res->grown_bytes = s.grown_bytes;
  res->handle_moves = s.num_handle_moves;
  uint64_t warm_ns = 0;
  int64_t warm_ooms = 0;
  for (int k = 0; k < o->repeat; k++) {
    TOOL_CHECK_GOTO(free_remaining(t, live), st, out);
    TOOL_CHECK_GOTO(replay_pass(t, live, false, res, &ns, &warm_ooms, false, o->lag), st, out);
    warm_ns += ns;
  }
  res->ns_per_event_warm =
      o->repeat > 0 && t->nevents ? (double)warm_ns / ((double)t->nevents * o->repeat) : 0;
  if (o->repeat > 0) {
    gca_stats_t w;
    if ((st = gca_get_stats(0, &w)) != GCA_OK) {
      st = tool_error_gca(st, "replay: gca_get_stats");
      goto out;
    }
    res->warm_driver_calls = (double)(w.num_driver_calls - s.num_driver_calls) / o->repeat;
    res->warm_handle_moves = (double)(w.num_handle_moves - s.num_handle_moves) / o->repeat;
    res->warm_retries = (double)(w.num_alloc_retries - s.num_alloc_retries) / o->repeat;
    res->warm_ooms = (double)warm_ooms / o->repeat;
  }
  TOOL_CHECK_GOTO(free_remaining(t, live), st, out);
  res->lag_stalls = replay_lag_stalls() - stalls;
  if ((st = gca_get_stats(0, &s)) != GCA_OK) {
    st = tool_error_gca(st, "replay: gca_get_stats");
    goto out;
  }
  res->peak_lent = s.lent_bytes.peak;
  res->lent_waits = s.num_lent_waits;
  st = GCA_OK;
out:
  if (st != GCA_OK) { /* leave nothing behind for the next configuration (best effort) */
    if (o->lag != 0)
      (void)replay_lag_drain(t->streams, t->nstreams);
    if (observer != 0)
      gca_trace_observer_remove(observer);
    if (snapshot)
      gca_record_history(false, 0, false);
    for (size_t i = 0; i < t->nallocs; i++)
      if (live[i])
        gca_free(live[i]);
  }
  free(live);
  return st;
}

static gca_status_t create_streams(trace_t *t) {
  t->streams[0] = NULL;
  for (size_t i = 1; i < t->nstreams; i++)
    TOOL_CHECK_GCA(gca_stream_create(&t->streams[i], GCA_STREAM_NON_BLOCKING));
  return GCA_OK;
}

static void destroy_streams(trace_t *t) {
  for (size_t i = 1; i < t->nstreams; i++)
    if (t->streams[i] && gca_stream_destroy(t->streams[i]) != GCA_OK)
      fprintf(stderr, "gca-replay: destroying a stream: %s\n", gca_last_error());
}

/* ---- reporting ---- */

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* jansson values for the report; a string that is not UTF-8 (a path) and a
 * number that is not finite become null rather than failing the report. */
static json_t *j_str(const char *v) {
  json_t *j = v ? json_string(v) : NULL;
  return j ? j : json_null();
}

static json_t *j_uint(uint64_t v) {
  return json_integer((json_int_t)v);
}

static json_t *j_real(double v) {
  json_t *j = json_real(v);
  return j ? j : json_null();
}

/* Sets o[key] = v, noting a failure (v NULL: jansson out of memory) in *ok. */
static void j_set(json_t *o, const char *key, json_t *v, bool *ok) {
  if (v == NULL || json_object_set_new(o, key, v) != 0)
    *ok = false;
}

static gca_status_t print_json(const options_t *o, const trace_t *t, const run_result_t *res,
                               int n) {
  bool ok = true;
  json_t *root = json_object(), *runs = json_array();
  if (root == NULL || runs == NULL) {
    json_decref(root);
    json_decref(runs);
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "replay: JSON report: out of host memory");
  }
  j_set(root, "trace", j_str(o->path), &ok);
  j_set(root, "backend", j_str(gca_device_backend_name()), &ok);
  j_set(root, "device_memory", o->device_memory ? j_uint(o->device_memory) : json_null(), &ok);
  j_set(root, "events", j_uint(t->nrows), &ok);
  j_set(root, "allocations", j_uint(t->nallocs), &ok);
  j_set(root, "frees", j_uint(t->nfrees), &ok);
  j_set(root, "allocate_failures_skipped", j_uint(t->nfailures), &ok);
  j_set(root, "unmatched_frees_skipped", j_uint(t->nunmatched), &ok);
  j_set(root, "streams", j_uint(t->nstreams), &ok);
  j_set(root, "peak_live_bytes", j_uint(t->peak_live), &ok);
  j_set(root, "lag_events", j_uint(o->lag), &ok);
  j_set(root, "parse_ns_per_event", j_real(t->parse_ns_per_event), &ok);
  if (t->torch) {
    j_set(root, "torch_reserved_bytes", j_uint(t->torch_reserved), &ok);
    j_set(root, "torch_devices", j_uint(t->torch_devices), &ok);
    j_set(root, "torch_device", json_integer(o->device), &ok);
    j_set(root, "live_before_recording", j_uint(t->torch_live_before), &ok);
    j_set(root, "pickle_read_mb_per_s", j_real(t->torch_read_mb_s), &ok);
  }
  for (int i = 0; i < n; i++) {
    const run_result_t *r = &res[i];
    json_t *run = json_object();
    if (run == NULL || json_array_append_new(runs, run) != 0) {
      ok = false;
      break;
    }
    j_set(run, "config", j_str(r->config), &ok);
    j_set(run, "peak_reserved_bytes", j_uint(r->peak_reserved), &ok);
    j_set(run, "reserved_over_peak_live",
          j_real(t->peak_live ? (double)r->peak_reserved / (double)t->peak_live : 0), &ok);
    if (t->torch)
      j_set(run, "reserved_over_torch_reserved",
            j_real(t->torch_reserved ? (double)r->peak_reserved / (double)t->torch_reserved : 0),
            &ok);
    j_set(run, "fragmentation_at_peak_reserved", j_real(r->fragmentation), &ok);
    j_set(run, "free_bytes_at_peak_reserved", j_uint(r->free_at_peak), &ok);
    j_set(run, "largest_free_at_peak_reserved", j_uint(r->largest_free_at_peak), &ok);
    j_set(run, "ns_per_event", j_real(r->ns_per_event), &ok);
    j_set(run, "ns_per_event_warm", o->repeat > 0 ? j_real(r->ns_per_event_warm) : json_null(),
          &ok);
    j_set(run, "device_allocations", json_integer(r->device_allocs), &ok);
    j_set(run, "device_maps", json_integer(r->device_maps), &ok);
    j_set(run, "ooms", json_integer(r->ooms), &ok);
    j_set(run, "driver_calls", json_integer(r->driver_calls), &ok);
    j_set(run, "grown_bytes", json_integer(r->grown_bytes), &ok);
    j_set(run, "driver_calls_per_gib_grown", j_real(calls_per_gib(r)), &ok);
    j_set(run, "handle_moves", json_integer(r->handle_moves), &ok);
    j_set(run, "driver_calls_per_warm_pass",
          o->repeat > 0 ? j_real(r->warm_driver_calls) : json_null(), &ok);
    j_set(run, "handle_moves_per_warm_pass",
          o->repeat > 0 ? j_real(r->warm_handle_moves) : json_null(), &ok);
    j_set(run, "alloc_retries_per_warm_pass", o->repeat > 0 ? j_real(r->warm_retries) : json_null(),
          &ok);
    j_set(run, "ooms_per_warm_pass", o->repeat > 0 ? j_real(r->warm_ooms) : json_null(), &ok);
    j_set(run, "lag_stalls", o->lag ? json_integer(r->lag_stalls) : json_null(), &ok);
    j_set(run, "peak_lent_bytes", json_integer(r->peak_lent), &ok);
    j_set(run, "lent_waits", json_integer(r->lent_waits), &ok);
  }
  j_set(root, "runs", runs, &ok);
  char *text = ok ? json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  if (text == NULL)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "replay: JSON report: out of host memory");
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
  printf("peak live      %s (%llu bytes)\n", tool_format_size(t->peak_live, b1, sizeof(b1)),
         (unsigned long long)t->peak_live);
  if (t->torch)
    printf("PyTorch        device %d of %zu: reserved %s at the snapshot (its segments); %zu "
           "block%s live before the recording; pickle read at %.1f MB/s\n",
           o->device, t->torch_devices, tool_format_size(t->torch_reserved, b1, sizeof(b1)),
           t->torch_live_before, t->torch_live_before == 1 ? "" : "s", t->torch_read_mb_s);
  else
    printf("parsing        %.1f ns/event\n", t->parse_ns_per_event);
  printf("\n");
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
    printf("%*s", width, tool_format_size(res[i].peak_reserved, b1, sizeof(b1)));
  if (t->torch) {
    printf("\n%-32s", "PyTorch reserved (snapshot)");
    for (int i = 0; i < n; i++)
      printf("%*s", width, tool_format_size(t->torch_reserved, b1, sizeof(b1)));
    printf("\n%-32s", "gca peak / PyTorch reserved");
    for (int i = 0; i < n; i++)
      printf("%*.4f", width,
             t->torch_reserved ? (double)res[i].peak_reserved / (double)t->torch_reserved : 0.0);
  }
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
  printf("\n%-32s", "driver calls per GiB grown");
  for (int i = 0; i < n; i++)
    printf("%*.1f", width, calls_per_gib(&res[i]));
  printf("\n%-32s", "handle moves");
  for (int i = 0; i < n; i++)
    printf("%*lld", width, (long long)res[i].handle_moves);
  if (o->repeat > 0) {
    printf("\n%-32s", "driver calls per warm pass");
    for (int i = 0; i < n; i++)
      printf("%*.1f", width, res[i].warm_driver_calls);
  }
  printf("\n%-32s", "peak lent address space");
  for (int i = 0; i < n; i++)
    printf("%*.2f GiB", width - 4, (double)res[i].peak_lent / 1073741824.0);
  printf("\n%-32s", "waits for lent address space");
  for (int i = 0; i < n; i++)
    printf("%*lld", width, (long long)res[i].lent_waits);
  printf("\n%-32s", "OOMs");
  for (int i = 0; i < n; i++)
    printf("%*lld", width, (long long)res[i].ooms);
  if (o->repeat > 0) {
    printf("\n%-32s", "OOM retries per warm pass");
    for (int i = 0; i < n; i++)
      printf("%*.1f", width, res[i].warm_retries);
    printf("\n%-32s", "OOMs per warm pass");
    for (int i = 0; i < n; i++)
      printf("%*.1f", width, res[i].warm_ooms);
  }
  if (o->lag != 0) {
    printf("\n%-32s", "host stalls on a stream (lag)");
    for (int i = 0; i < n; i++)
      printf("%*lld", width, (long long)res[i].lag_stalls);
  }
  printf("\n");
}

/* ---- command line ---- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: gca-replay TRACE.csv|SNAPSHOT.pickle [--config STR]... [--device-memory SIZE]\n"
          "                  [--repeat N] [--lag N] [--lenient] [--json] [--no-progress]\n"
          "                  [--snapshot FILE]\n"
          "                  [--device N] [--help]\n"
          "Replays an RMM log CSV trace, or one device's trace of a PyTorch memory snapshot\n"
          "(the pickle torch.cuda.memory._dump_snapshot writes; read as plain data only,\n"
          "never run), through the caching allocator, once per --config\n"
          "(default: the settings from GCA_ALLOC_CONF, else the defaults), and reports peak\n"
          "live and reserved bytes, fragmentation at peak, ns per event and device calls.\n"
          "  --device-memory SIZE  capacity of the simulated device (e.g. 80GiB)\n"
          "  --repeat N            warm passes timed after the measured one (default 3)\n"
          "  --lag N               the streams run N events behind the host: freed memory\n"
          "                        stays in use by queued work; a wait for a stream is a\n"
          "                        stall (counted; the stream gives up on a host that\n"
          "                        replays no event for 0.1 s)\n"
          "  --lenient             skip (and count) frees of pointers that are not live, as\n"
          "                        in traces whose recording began after some allocations\n"
          "  --snapshot FILE       write a snapshot (JSON, for gca-snapshot) at the end of the\n"
          "                        first configuration's measured pass, with its history\n"
          "  --device N            the device trace of a PyTorch snapshot (default 0); its\n"
          "                        reserved bytes are reported beside gca's\n"
          "  --json                the report as one JSON object\n"
          "  --no-progress         no progress bar on stderr (default when it is not a tty)\n");
}

static int parse_args(int argc, char **argv, options_t *o) {
  enum {
    OPT_JSON = 256,
    OPT_LENIENT,
    OPT_NO_PROGRESS,
    OPT_SNAPSHOT,
    OPT_CONFIG,
    OPT_DEVMEM,
    OPT_REPEAT,
    OPT_DEVICE,
    OPT_LAG
  };
  static const struct option longopts[] = {{"config", required_argument, NULL, OPT_CONFIG},
                                           {"device-memory", required_argument, NULL, OPT_DEVMEM},
                                           {"repeat", required_argument, NULL, OPT_REPEAT},
                                           {"lag", required_argument, NULL, OPT_LAG},
                                           {"lenient", no_argument, NULL, OPT_LENIENT},
                                           {"json", no_argument, NULL, OPT_JSON},
                                           {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
                                           {"snapshot", required_argument, NULL, OPT_SNAPSHOT},
                                           {"device", required_argument, NULL, OPT_DEVICE},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  o->repeat = 3;
  o->progress = isatty(STDERR_FILENO);
  for (int c; (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
    switch (c) {
    case 'h':
      usage(stdout);
      exit(0);
    case OPT_JSON:
      o->json = true;
      break;
    case OPT_LENIENT:
      o->lenient = true;
      break;
    case OPT_NO_PROGRESS:
      o->progress = false;
      break;
    case OPT_SNAPSHOT:
      o->snapshot = optarg;
      break;
    case OPT_CONFIG:
      if (o->nconfigs == MAX_CONFIGS) {
        fprintf(stderr, "gca-replay: at most %d --config\n", MAX_CONFIGS);
        return -1;
      }
      o->configs[o->nconfigs++] = optarg;
      break;
    case OPT_DEVMEM:
      if (tool_parse_size(optarg, &o->device_memory) != GCA_OK || o->device_memory == 0) {
        fprintf(stderr, "gca-replay: --device-memory: %s\n",
                o->device_memory ? tool_last_error() : "must be more than 0");
        return -1;
      }
      break;
    case OPT_DEVICE: {
      char *end = NULL;
      long v = strtol(optarg, &end, 10);
      if (!end || *end || end == optarg || v < 0 || v > 4096) {
        fprintf(stderr, "gca-replay: --device '%s' is not a device number\n", optarg);
        return -1;
      }
      o->device = (int)v;
      break;
    }
    case OPT_REPEAT: {
      char *end = NULL;
      long v = strtol(optarg, &end, 10);
      if (!end || *end || end == optarg || v < 0 || v > 1000) {
        fprintf(stderr, "gca-replay: --repeat '%s' is not a count in 0..1000\n", optarg);
        return -1;
      }
      o->repeat = (int)v;
      break;
    }
    case OPT_LAG: {
      char *end = NULL;
      unsigned long long v = strtoull(optarg, &end, 10);
      if (!end || *end || end == optarg || optarg[0] == '-' || v > 100000000ull) {
        fprintf(stderr, "gca-replay: --lag '%s' is not a count of events in 0..100000000\n",
                optarg);
        return -1;
      }
      o->lag = v;
      break;
    }
    default: /* getopt_long said what was wrong */
      usage(stderr);
      return -1;
    }
  }
  for (int i = optind; i < argc; i++) {
    if (o->path) {
      fprintf(stderr, "gca-replay: more than one trace ('%s', '%s')\n", o->path, argv[i]);
      return -1;
    }
    o->path = argv[i];
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
  char base[1024];
  /* the backend is chosen first, so that --device-memory knows whether it
   * sizes the sim; the sim's capacity is set before anything starts the
   * allocator on the device (see prepare_allocator) */
  if ((st = gca_device_init()) != GCA_OK) {
    tool_error_gca(st, "replay: no device");
    goto fail_trace;
  }
  if (o.device_memory && strcmp(gca_device_backend_name(), "sim") == 0 &&
      (st = gca_sim_set_capacity(0, o.device_memory)) != GCA_OK) {
    tool_error_gca(st, "replay: --device-memory");
    goto fail_trace;
  }
  TOOL_CHECK_GOTO(load_trace(&o, t), st, fail_trace);
  if ((st = gca_get_config(base, sizeof(base))) != GCA_OK) {
    tool_error_gca(st, "replay: the settings in force (GCA_ALLOC_CONF)");
    goto fail_trace;
  }
  TOOL_CHECK_GOTO(create_streams(t), st, fail_streams);
  for (int i = 0; i < o.nconfigs; i++) {
    TOOL_CHECK_GOTO(run_config(&o, t, base, o.configs[i], o.snapshot != NULL && i == 0, &res[i]),
                    st, fail_streams);
  }
  if (gca_empty_cache() != GCA_OK)
    fprintf(stderr, "gca-replay: empty_cache at the end: %s\n", gca_last_error());
  if (o.json)
    TOOL_CHECK_GOTO(print_json(&o, t, res, o.nconfigs), st, fail_streams);
  else
    print_table(&o, t, res, o.nconfigs);
  rc = 0;
  st = GCA_OK;
fail_streams:
  destroy_streams(t);
fail_trace:
  if (st != GCA_OK)
    fprintf(stderr, "gca-replay: %s\n", tool_last_error());
  trace_free(t);
  free(t);
  return rc;
}
