/* SPDX-License-Identifier: Apache-2.0 */
/* pending.c - frees that must wait: a block used on other streams
 * (gca_record_stream) is freed by recording an event on each of them and
 * parking the block until every event has completed; during a capture the
 * free is deferred until the capture ends. The events come from a pool per
 * device, created once and reused.
 *
 * The one idea is the Note:
 *
 * Note [Stream-ordered reuse]. A block belongs to the stream it was allocated
 * on, and work on one stream runs in order, so a block freed by the host may
 * be handed to later work on the same stream at once: that work queues behind
 * whatever still uses the block. Other streams are not ordered with it. When
 * gca_record_stream() marked a block as used on other streams, freeing it
 * records an event on each of those streams (events come from a per-device
 * pool, created once and reused) and parks the block as "pending free"; it
 * enters the free tree only when every one of its events has completed.
 * Pending events are polled without blocking (event_query) at the start of
 * each malloc and free, and only when some are pending, so the common path
 * makes no device call. Running out of memory synchronizes them instead
 * (event_synchronize), counted in num_sync_all_streams.
 *
 * Note [Frees during capture]. While a capture is under way on a device, the
 * driver forbids querying events that may belong to it, and an event recorded
 * on a capturing stream would become a graph node. So the allocator queries
 * no event then (pending frees wait), and a free of a block used on other
 * streams is parked on d->deferred with event_count = 1; when the device's
 * last capture ends the events are recorded (PyTorch's
 * insert_events_deferred_until_no_capture).
 */
#include <inttypes.h>
#include <stdlib.h>

#include "fcache.h"

/* Returns an event of device `dev` to its pool. */
static void event_put(gca__devalloc_t *d, int dev, gca_event_t ev) {
  gca__evpool_t *p = &d->events[dev];
  GCA_ASSERT(p->n < p->cap && p->out > 0);
  p->ev[p->n++] = ev;
  p->out--;
}

/* Takes a pooled event of device `dev` (events_reserve made one). */
static gca_event_t event_take(gca__devalloc_t *d, int dev) {
  gca__evpool_t *p = &d->events[dev];
  GCA_ASSERT(p->n > 0);
  p->out++;
  return p->ev[--p->n];
}

/* Makes room for b's uses: a pending entry each and a pooled event on each
 * use's device (created there once, then reused). */
static gca_status_t events_reserve(gca__devalloc_t *d, const gca__block_t *b) {
  if (d->npending + b->nuses > d->cap_pending) {
    size_t ncap = d->cap_pending ? d->cap_pending : 16;
    while (ncap < d->npending + b->nuses)
      ncap *= 2;
    gca__pending_t *p = realloc(d->pending, ncap * sizeof(*p));
    if (p == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "free: host out of memory for pending events");
    d->pending = p;
    d->cap_pending = ncap;
  }
  uint32_t needs[GCA__MAX_DEVICES] = {0};
  for (uint32_t i = 0; i < b->nuses; i++)
    needs[b->uses[i].dev]++;
  for (int dev = 0; dev < GCA__MAX_DEVICES; dev++) {
    size_t need = needs[dev];
    if (need == 0)
      continue;
    gca__evpool_t *p = &d->events[dev];
    /* every event is either pooled or out, so the pool never holds more */
    size_t want = p->n + p->out + need;
    if (want > p->cap) {
      gca_event_t *e = realloc(p->ev, want * 2 * sizeof(*e));
      if (e == NULL)
        return gca__error(GCA_ERR_OUT_OF_MEMORY, "free: host out of memory for the event pool");
      p->ev = e;
      p->cap = want * 2;
    }
    while (p->n < need) {
      gca_event_t ev;
      GCA_CHECK(d->ops->event_create(dev, GCA_EVENT_DISABLE_TIMING, &ev));
      p->ev[p->n++] = ev;
    }
  }
  return GCA_OK;
}

/* Runs a stream op for use u with u's device current when its stream is
 * NULL (that device's legacy stream), as PyTorch sets the device around it:
 * event_record of ev, or with ev NULL stream_synchronize, which waits and is
 * made with no lock held (gca__use_wait). */
static gca_status_t use_op(gca__devalloc_t *d, const gca__use_t *u, gca_event_t ev) {
  int cur = u->dev;
  gca_status_t st;
  if (GCA_UNLIKELY(u->stream == GCA__STREAM_GONE)) { /* Note [Destroyed streams] */
    if (ev == NULL)
      return d->ops->ctx_synchronize(u->dev);
    /* the callers wait for the device with the lock let go, then count it done
     * (Note [Gone streams of deferred frees], and the free's own loop) */
    return gca__error(GCA_ERR_INVALID_HANDLE,
                      "a stream recorded on the block was destroyed; waiting for device %d",
                      u->dev);
  }
  if (GCA_UNLIKELY(gca__stream_is_ptds(u->stream))) /* Note [Per-thread stream keys] */
    return gca__stream_op(d, u->dev, u->stream, ev);
  if (u->stream == NULL) {
    GCA_CHECK(d->ops->ctx_get_device(&cur));
    if (cur != u->dev)
      GCA_CHECK(d->ops->ctx_set_device(u->dev));
  }
  st = ev != NULL ? d->ops->event_record(ev, u->stream) : d->ops->stream_synchronize(u->stream);
  if (cur != u->dev) {
    gca_status_t rst = d->ops->ctx_set_device(cur);
    if (st == GCA_OK)
      st = rst;
  }
  return st;
}

/* Parks a block used on other streams while a capture is under way: it is
 * pending (event_count 1) until gca__pending_flush_deferred records its events
 * (Note [Frees during capture]). */
static gca_status_t defer_free(gca__devalloc_t *d, gca__block_t *b) {
  if (d->ndeferred == d->cap_deferred) {
    size_t ncap = d->cap_deferred ? d->cap_deferred * 2 : 16;
    gca__block_t **n = GCA_FAILPOINT("defer_free") ? NULL : realloc(d->deferred, ncap * sizeof(*n));
    if (n == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY,
                        "free: host out of memory deferring the free of 0x%" PRIx64, b->addr);
    d->deferred = n;
    d->cap_deferred = ncap;
  }
  d->deferred[d->ndeferred++] = b;
  b->event_count = 1;
  return GCA_OK;
}

/* Whether use u's stream is capturing (only looked at while some capture
 * runs): an event recorded there would be a node of the graph, not work that
 * can be queried (Note [Uses on a capturing stream]). */
static bool use_captures(gca__devalloc_t *d, const gca__use_t *u) {
  gca_stream_t h = u->stream;
  if (GCA_LIKELY(atomic_load_explicit(&gca__device_captures, memory_order_relaxed) == 0) ||
      h == NULL || h == GCA__STREAM_GONE)
    return false;
  if (gca__stream_is_ptds(h)) {
    if (h != gca__t_ptds_key)
      return false; /* another thread's: waited for as the whole device */
    h = GCA_STREAM_PER_THREAD;
  }
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  return d->ops->stream_capture_info(h, &cs, NULL) == GCA_OK && cs != GCA_CAPTURE_STATUS_NONE;
}

/* Records an event on each stream that used b, on that stream's device; b
 * becomes pending. A use whose stream is gone fails with *gone_dev its
 * device, unless the caller already waited for that device (*gone_dev on
 * entry): then the use needs no event and is dropped for good, so that a
 * block with gone uses on several devices needs each device waited for once.
 * GCA_ERR_NOT_READY (no detail): a use's stream is capturing. On failure
 * nothing else changed. */
static gca_status_t block_insert_events(gca__devalloc_t *d, gca__block_t *b, int *gone_dev) {
  int waited = *gone_dev;
  *gone_dev = -1;
  GCA_CHECK(events_reserve(d, b));
  size_t first = d->npending;
  uint32_t kept = 0;
  for (uint32_t i = 0; i < b->nuses; i++) {
    const gca__use_t u = b->uses[i];
    gca_event_t ev = event_take(d, u.dev);
    gca_status_t st = GCA_UNLIKELY(use_captures(d, &u)) ? GCA_ERR_NOT_READY : use_op(d, &u, ev);
    if (st == GCA_ERR_INVALID_HANDLE && u.dev == waited) {
      event_put(d, u.dev, ev); /* destroyed before the wait: its work is done */
      continue;
    }
    if (st != GCA_OK) {
      if (st == GCA_ERR_INVALID_HANDLE)
        *gone_dev = u.dev;
      event_put(d, u.dev, ev);
      while (d->npending > first) {
        d->npending--;
        event_put(d, d->pending[d->npending].dev, d->pending[d->npending].event);
      }
      for (uint32_t k = i; k < b->nuses; k++) /* the uses left, after those kept */
        b->uses[kept++] = b->uses[k];
      gca__uses_set(d, b, kept);
      b->event_count = 0;
      return st == GCA_ERR_NOT_READY ? st : gca__error_prefix(st, "free: 0x%" PRIx64, b->addr);
    }
    b->uses[kept++] = u;
    d->pending[d->npending++] = (gca__pending_t){ev, u.stream, b, u.dev};
    b->event_count++;
  }
  gca__uses_set(d, b, 0);
  return GCA_OK;
}

/* Completes the free of b: held blocks beside it go back to the tree (or
 * leave their thread cache) first (Note [Free cache], Note [Thread caches]),
 * then b joins it (blocks.c). */
static void complete(gca__devalloc_t *d, gca__block_t *b, bool pending) {
  if (GCA_UNLIKELY(d->fc_count != 0 || d->tc_held != 0))
    gca__fcache_evict_near(d, b);
  gca__block_free_complete(d, b, pending);
}

static void pending_done(gca__devalloc_t *d, const gca__pending_t *e) {
  event_put(d, e->dev, e->event);
  if (--e->block->event_count == 0)
    complete(d, e->block, true);
}

/* Events on one stream complete in order, so a stream is skipped after its
 * first unfinished event. Called from a host function (gca_free there), where
 * the driver permits no call (GCA_ERR_NOT_PERMITTED), it leaves the rest for a
 * later malloc or free and succeeds: completing pending frees is never what
 * the caller asked for. */
/* Note [Queries during another thread's capture]: while any thread captures
 * in global mode, the driver refuses every event query or synchronization
 * from every thread whose own mode is not relaxed, of events and streams that have nothing to do
 * with the capture too, and invalidates the capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; H200,
 * driver 580). The allocator learns of a capture only when it is routed to a pool (d->ncaptures);
 * the device table counts every capture begun through it from its start (gca__device_captures).
 * While that count is not zero the queries and waits are made with the thread's capture mode
 * relaxed, which such a capture permits and is not invalidated by (measured
 * on the same H200); otherwise inside the capture gate, so that no capture
 * begins while they run (Note [Capture gate], device.c). A thread whose mode
 * cannot be relaxed leaves its pending frees for later. */
typedef struct query_guard {
  bool gated, relaxed;
  gca_capture_mode_t mode;
} query_guard_t;

static bool queries_begin(gca__devalloc_t *d, query_guard_t *g) {
  g->gated = gca__device_wait_enter();
  g->relaxed = !g->gated && gca__relax(d->ops, &g->mode);
  return g->gated || g->relaxed;
}

static void queries_end(gca__devalloc_t *d, const query_guard_t *g) {
  if (g->gated)
    gca__device_wait_leave();
  gca__unrelax(d->ops, g->relaxed, g->mode);
}

gca_status_t gca__pending_process(gca__devalloc_t *d) {
  gca__use_t busy[16]; /* (stream, device): NULL names a different stream on each device */
  size_t nbusy = 0, w = 0, i;
  gca_status_t st = GCA_OK;
  if (d->ncaptures != 0) /* Note [Frees during capture] */
    return GCA_OK;
  if (d->ndeferred != 0) {
    st = gca__pending_flush_deferred(d);
    if (st == GCA_ERR_NOT_PERMITTED) /* from a host function: left for a later call */
      return GCA_OK;
    GCA_CHECK(st);
  }
  query_guard_t guard;
  if (d->npending == 0 || !queries_begin(d, &guard))
    return GCA_OK;
  for (i = 0; i < d->npending; i++) {
    gca__pending_t e = d->pending[i];
    bool skip = false;
    for (size_t k = 0; k < nbusy && !skip; k++)
      skip = busy[k].stream == e.stream && busy[k].dev == e.dev;
    if (!skip) {
      st = d->ops->event_query(e.event);
      if (st == GCA_OK) {
        pending_done(d, &e);
        continue;
      }
      if (st == GCA_ERR_NOT_PERMITTED) { /* a host function may not query: later */
        st = GCA_OK;
        break;
      }
      if (st != GCA_ERR_NOT_READY)
        break;
      st = GCA_OK;
      if (nbusy < GCA_ARRAY_SIZE(busy))
        busy[nbusy++] = (gca__use_t){e.stream, e.dev};
    }
    d->pending[w++] = e;
  }
  queries_end(d, &guard);
  for (; i < d->npending; i++)
    d->pending[w++] = d->pending[i];
  d->npending = w;
  return st;
}

/* The events are snapshot and waited for with the lock let go (Note [No
 * waits under the device lock]); meanwhile other threads may complete them,
 * and pooled events may be recorded again (a wait then lasts longer, nothing
 * worse). Back under the lock, queries complete what is done. */
gca_status_t gca__pending_sync(gca__devalloc_t *d) {
  gca_status_t st = GCA_OK;
  d->stats.num_sync_all_streams++;
  size_t n = d->npending;
  if (n == 0)
    return GCA_OK;
  gca_event_t *evs = malloc(n * sizeof(*evs));
  if (evs == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "host out of memory waiting for %zu events", n);
  query_guard_t guard;
  if (!queries_begin(d, &guard)) { /* Note [Queries during another thread's capture] */
    free(evs);
    return GCA_OK;
  }
  for (size_t i = 0; i < n; i++)
    evs[i] = d->pending[i].event;
  gca__dev_let_go(d);
  for (size_t i = 0; i < n && st == GCA_OK; i++)
    st = d->ops->event_synchronize(evs[i]);
  queries_end(d, &guard);
  gca__dev_lock(d);
  free(evs);
  if (st != GCA_OK) /* the rest completes on a later query */
    return gca__error_prefix(st, "waiting for pending frees");
  return gca__pending_process(d);
}

/* The free of b is requested: it completes now, or once its events have. */
static void free_requested(gca__devalloc_t *d, gca__block_t *b) {
  gca__pool_t *pool = b->pool;
  b->allocated = false;
  gca__stat_block_free(d, b, gca__stat_type(pool));
  gca__history_event(GCA_HA_FREE_REQUESTED, d->device, b->addr, b->requested, b->stream);
  if (b->event_count == 0)
    complete(d, b, false);
  else
    gca__pend_add(d, pool, 1, b->size);
}

gca_status_t gca__free_request(gca__devalloc_t *d, gca__block_t *b, int *gone_dev) {
  int waited = *gone_dev;
  *gone_dev = -1;
  if (b->nuses != 0) {
    if (GCA_UNLIKELY(d->ncaptures != 0)) {
      GCA_CHECK(defer_free(d, b));
    } else {
      /* caching off, the caller waited for the uses it saw (gca__use_wait);
       * uses recorded since are waited for by events, as with caching on */
      *gone_dev = waited;
      gca_status_t st = block_insert_events(d, b, gone_dev);
      if (st == GCA_ERR_NOT_READY) /* Note [Uses on a capturing stream] */
        st = defer_free(d, b);
      GCA_CHECK(st);
    }
  }
  free_requested(d, b);
  return GCA_OK;
}

gca_status_t gca__free_request_deferred(gca__devalloc_t *d, gca__block_t *b, int gone) {
  GCA_CHECK(defer_free(d, b));
  d->deferred_need = gone + 1;
  d->reap = true;
  free_requested(d, b);
  return GCA_OK;
}

gca_status_t gca__use_wait(gca__devalloc_t *d, const gca__use_t *u) {
  return use_op(d, u, NULL);
}

/* Note [Uses on a capturing stream]: a block recorded on a stream that is
 * capturing, freed while the allocator routes no capture (the program began
 * it, or the capture is not routed to a pool), cannot get an event there: the
 * record would be a node of the graph, and a query of that event fails
 * (CUDA_ERROR_CAPTURED_EVENT on the sim, INVALID_VALUE once the capture has
 * ended on an H200) and would fail every later malloc and free. While some
 * capture runs (gca__device_captures) each use's stream is asked whether it
 * captures; if one does, the free is deferred as during a routed capture and
 * its events are recorded by the first flush after that stream's capture. */

/* Note [Gone streams of deferred frees]: a free deferred during a capture
 * records its events once the capture is over; a stream it was used on may
 * have been destroyed meanwhile, and its work still runs. Then the block stays
 * deferred, the device is named in d->deferred_need and the reap (on the way
 * out of the lock) waits for that device with the lock let go and flushes
 * again with that use counted as done; the caller that ran into it, which
 * asked for something else, is not failed. A free outside a capture that
 * meets such a use waits for the device itself, unless a capture runs on any
 * thread (Note [Capture gate], device.c: the wait would invalidate it); then
 * it is deferred the same way (gca__free_request_deferred). */
gca_status_t gca__pending_flush_deferred(gca__devalloc_t *d) {
  while (d->ndeferred > 0) {
    gca__block_t *b = d->deferred[d->ndeferred - 1];
    b->event_count = 0;
    int gone = d->deferred_waited - 1;
    gca_status_t st = block_insert_events(d, b, &gone);
    if (st == GCA_ERR_NOT_READY) { /* Note [Uses on a capturing stream]: later */
      b->event_count = 1;
      return GCA_OK;
    }
    if (st == GCA_ERR_INVALID_HANDLE && gone >= 0) {
      b->event_count = 1;
      d->deferred_need = gone + 1;
      d->reap = true;
      return GCA_OK;
    }
    if (st != GCA_OK) {
      b->event_count = 1;
      return st;
    }
    d->ndeferred--;
    if (b->event_count == 0)
      complete(d, b, true);
  }
  return GCA_OK;
}

gca_status_t gca__pending_park_reserve(gca__devalloc_t *d, size_t n) {
  if (d->ndeferred + n <= d->cap_deferred)
    return GCA_OK;
  size_t ncap = d->cap_deferred ? d->cap_deferred : 16;
  while (ncap < d->ndeferred + n)
    ncap *= 2;
  gca__block_t **p = realloc(d->deferred, ncap * sizeof(*p));
  if (p == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "host out of memory parking %zu blocks", n);
  d->deferred = p;
  d->cap_deferred = ncap;
  return GCA_OK;
}

void gca__pending_park(gca__devalloc_t *d, gca__block_t *b) {
  GCA_ASSERT(d->ndeferred < d->cap_deferred && b->nuses != 0 && !b->allocated && !b->in_tree);
  d->deferred[d->ndeferred++] = b;
  b->event_count = 1;
  gca__pend_add(d, b->pool, 1, b->size);
  if (GCA_UNLIKELY(d->tcs !=
                   NULL)) /* active rose: no headroom may hide it (Note [Thread caches]) */
    gca__pend_peak_slow(d, gca__stat_type(b->pool));
}

void gca__pending_destroy(gca__devalloc_t *d) {
  for (size_t i = 0; i < d->npending; i++) {
    GCA_CHECK_IGNORE(d->ops->event_synchronize(d->pending[i].event));
    GCA_CHECK_IGNORE(d->ops->event_destroy(d->pending[i].event));
  }
  for (int dev = 0; dev < GCA__MAX_DEVICES; dev++) {
    for (size_t i = 0; i < d->events[dev].n; i++)
      GCA_CHECK_IGNORE(d->ops->event_destroy(d->events[dev].ev[i]));
    free(d->events[dev].ev);
  }
  free(d->pending);
}
