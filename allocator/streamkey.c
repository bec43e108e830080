/* SPDX-License-Identifier: Apache-2.0 */
/* streamkey.c - the allocator's key for a stream handle, the way back
 * from a key to the device (Note [Per-thread stream keys]), and what the
 * allocator lets go of a stream that is destroyed (Note [Destroyed streams]).
 *
 * Note [Per-thread stream keys]. Blocks, segments, free-cache slots and
 * recorded uses are keyed by stream (Note [Stream-ordered reuse]). A handle
 * names one stream for every thread except GCA_STREAM_PER_THREAD, which names
 * the calling thread's own default stream (Note [Special streams]), so it
 * cannot be a key: a block freed by one thread would look reusable at once on
 * another thread's stream. gca__stream_key gives each thread a key of its own
 * for it, a value no stream handle has (GCA__PTDS_TAG, a non-canonical
 * address, with a serial number from a process counter, never reused), and maps
 * GCA_STREAM_LEGACY to NULL, its equal. Going back, the calling thread's own
 * key is GCA_STREAM_PER_THREAD again (with the allocator's device current);
 * another thread's key reaches no stream from here, so what would wait for
 * that stream waits for the whole device instead (ctx_synchronize): a free of
 * a block used on another thread's per-thread stream, or a release of a
 * segment keyed by it. The free waits with the device lock released
 * (allocator.c); the release paths wait where they would wait for the
 * stream. A thread that exits leaves its key's cached blocks to empty_cache.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "alloc_core.h"
#include "recycle.h"
#include "tcache.h"

_Thread_local gca_stream_t gca__t_ptds_key __attribute__((tls_model("initial-exec")));
static atomic_uintptr_t next_key = 1;

gca_stream_t gca__ptds_key_slow(void) {
  uintptr_t id = atomic_fetch_add_explicit(&next_key, 1, memory_order_relaxed);
  gca__t_ptds_key = (gca_stream_t)(GCA__PTDS_TAG | id);
  return gca__t_ptds_key;
}

gca_status_t gca__stream_op(gca__devalloc_t *d, int dev, gca_stream_t s, gca_event_t ev) {
  gca_stream_t h = s;
  if (!gca__stream_is_ptds(s))
    return ev != NULL ? d->ops->event_record(ev, h) : d->ops->stream_synchronize(h);
  if (s == gca__t_ptds_key) {
    h = GCA_STREAM_PER_THREAD;
  } else {
    /* another thread's: the whole device, never during a capture (Note
     * [Capture gate], device.c; the callers keep the memory or the free for
     * later on GCA_ERR_NOT_READY) */
    if (!gca__device_wait_enter())
      return GCA_ERR_NOT_READY;
    gca_status_t st = d->ops->ctx_synchronize(dev);
    gca__device_wait_leave();
    GCA_CHECK(st);
    if (ev == NULL)
      return GCA_OK;
    h = NULL;
  }
  int cur = dev;
  GCA_CHECK(d->ops->ctx_get_device(&cur));
  if (cur != dev)
    GCA_CHECK(d->ops->ctx_set_device(dev));
  gca_status_t st = ev != NULL ? d->ops->event_record(ev, h) : d->ops->stream_synchronize(h);
  if (cur != dev) {
    gca_status_t rst = d->ops->ctx_set_device(cur);
    if (st == GCA_OK)
      st = rst;
  }
  return st;
}

gca_status_t gca__stream_synchronize(gca__devalloc_t *d, gca_stream_t s) {
  return gca__stream_op(d, d->device, s, NULL);
}

/* Note [Destroyed streams]. The driver's behaviour on a destroyed stream is
 * undefined; on an H200 (driver 580) cuStreamGetCtx on one dies with SIGSEGV.
 * The allocator keeps stream handles long after the calls that gave them: a
 * segment's stream, waited for before the segment's memory is unmapped or
 * released (segment.c), and the streams recorded on a block
 * (gca_record_stream), on which its free records events. So every stream gca
 * destroys (gca_stream_destroy, the graph trees, the preload shim on cuda)
 * is first retired here, through gca__stream_retire_hook:
 *   - if segments were made on it (so blocks are keyed by it, cached or
 *     live), its work is waited for, unless a capture runs (the wait would
 *     invalidate it);
 *   - each such segment is marked stream_gone: a release of it waits for its
 *     device instead of the stream (a new stream with the same handle may be
 *     using it, so the wait cannot be skipped either);
 *   - a block's recorded use of it becomes GCA__STREAM_GONE, a key no thread
 *     has: the block's free waits for the device (with the lock let go, as
 *     the free does for a use whose stream the sim calls stale) instead of
 *     recording an event on the stream. That needs no wait here, and walks
 *     the blocks only when some hold recorded uses (d->nused): with 10^6
 *     live blocks the walk made every destroy cost 60-90 ms;
 *   - the cached memory of its segments is given back at once when it was
 *     waited for and no capture runs (gca__device_captures): nothing can use
 *     it again but a new stream that happens to get the same handle, and each
 *     expandable segment reserves twice the device's memory of address
 *     space, of which a GPU has about 128 TiB (an H200 with driver 580 took
 *     467 such reservations), so a program that creates and
 *     destroys streams would run out of address space with the segments of
 *     its dead streams
 *     (gca-stress --stream-churn with expandable segments did, in a capture,
 *     where nothing can be released);
 *   - the segments of the default pools are then re-keyed to GCA__STREAM_GONE,
 *     their blocks too, free or live (rekey): the driver may hand the same
 *     handle to a new stream at once, and nothing orders that stream after
 *     the old one's queued work (not waited for when a capture ran), so no
 *     request on any stream may reuse them. They are given back instead
 *     (gca__streams_reclaim) the next time a
 *     request needs a new block and no capture runs, if anything of theirs
 *     became free since (d->gone_dirty, set by the free of a re-keyed block):
 *     so the address space of an expandable segment made on a stream
 *     destroyed during a capture comes back once its blocks are free and the
 *     captures end. That release waits for the device only for the segments
 *     of a stream that was not waited for (seg->gone_waited): a block freed
 *     after the destroy reaches the tree only once the other streams' uses
 *     recorded on it are done. Private pools keep their keys: what their
 *     segments hold is the graph's (Note [Expandable segments]).
 * A stream destroyed behind gca's back (straight through the driver) must
 * outlive the memory allocated or recorded on it, as PyTorch's allocator
 * requires of external streams. The sim holds the tests to that: a use of a
 * destroyed stream aborts it (Note [Strict handles], sim_stream.c). */

/* Whether d made segments on s; with `scrub`, lets go of s as above. */
static bool retire_on(gca__devalloc_t *d, gca_stream_t s, bool scrub) {
  bool held = false;
  for (gca__pool_t *p = &d->small; p != NULL; p = gca__pool_next(d, p)) {
    for (gca__segment_t *seg = p->segments; seg != NULL; seg = seg->next) {
      if (seg->stream == s) {
        held = true;
        if (scrub)
          seg->stream_gone = true;
      }
      if (!scrub || d->nused == 0)
        continue;
      for (gca__block_t *b = seg->head; b != NULL; b = b->next)
        for (uint32_t i = 0; i < b->nuses; i++)
          if (b->uses[i].stream == s)
            b->uses[i].stream = GCA__STREAM_GONE;
    }
  }
  return held;
}

/* Gives back the cached memory of the default pools' segments keyed by
 * `key` (d->lock held, let go while the driver is called); `waited`: the
 * stream whose work was waited for, so the batch does not wait again. */
static gca_status_t release_keyed(gca__devalloc_t *d, gca_stream_t key, gca_stream_t waited) {
  gca__relbatch_t bt = {.waited = waited};
  gca_status_t st = GCA_OK;
  gca__flush_caches(d); /* a cached block keyed by it may sit beside a free one */
  gca__tc_flush_all(d, false);
  for (gca__pool_t *p = &d->small; p != NULL && st == GCA_OK; p = gca__pool_next(d, p)) {
    if (p->owner != NULL) /* private pools keep theirs (Note [Expandable segments]) */
      continue;
    for (gca__segment_t *seg = p->segments; seg != NULL && st == GCA_OK; seg = seg->next)
      if (seg->stream == key)
        st = gca__relbatch_take(d, &bt, seg);
  }
  gca_status_t rst = gca__relbatch_run(d, &bt, NULL);
  free(bt.v);
  return st != GCA_OK ? st : rst;
}

/* The cached memory of s's segments, s having been waited for. */
static void release_retired(gca__devalloc_t *d, gca_stream_t s) {
  if (release_keyed(d, s, s) != GCA_OK)
    GCA_LOG_WARN("retiring stream %p: its cached memory stays: %s", (void *)s, gca_last_error());
}

/* Re-keys the segments of s in d's default pools, and their blocks, to
 * GCA__STREAM_GONE (d->lock held). The caches hold no block of theirs after
 * it: the free cache and the recycle bins are flushed, and the thread
 * caches let go of their domains, whose bins are keyed by stream. */
static void rekey(gca__devalloc_t *d, gca_stream_t s, bool waited) {
  bool flushed = false;
  for (gca__pool_t *p = &d->small; p != NULL; p = gca__pool_next(d, p)) {
    if (p->owner != NULL)
      continue;
    for (gca__segment_t *seg = p->segments; seg != NULL; seg = seg->next) {
      if (seg->stream != s)
        continue;
      if (!flushed) {
        gca__flush_caches(d);
        gca__tc_flush_all(d, true);
        d->pf_epoch++; /* Note [Free facts]: no fast free may take a bin now */
        flushed = true;
      }
      seg->stream = GCA__STREAM_GONE;
      seg->gone_waited = waited;
      for (gca__block_t *b = seg->head; b != NULL; b = b->next) {
        bool in_tree = b->in_tree;
        if (in_tree)
          gca__tree_erase(p, b);
        b->stream = GCA__STREAM_GONE;
        if (in_tree) {
          gca__tree_insert(p, b);
          d->gone_dirty = true;
        }
      }
    }
  }
}

void gca__streams_reclaim(gca__devalloc_t *d) {
  d->gone_dirty = false;
  if (release_keyed(d, GCA__STREAM_GONE, NULL) != GCA_OK)
    GCA_LOG_WARN("device %d: giving back the memory of destroyed streams' segments: %s", d->device,
                 gca_last_error());
}

void gca__streams_retire(gca_stream_t s) {
  if (s == NULL || GCA_STREAM_IS_SPECIAL(s) || gca__stream_is_ptds(s))
    return;
  gca__devalloc_t *held = NULL;
  for (int i = 0; i < GCA__MAX_DEVICES && held == NULL; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    if (retire_on(d, s, false))
      held = d;
    gca__dev_let_go(d);
  }
  /* the stream is still alive: its work is waited for with no lock held */
  /* not while a capture runs: a synchronize by the capturing thread (or by
   * any thread, in a global-mode capture) would invalidate it (Note [Queries
   * during another thread's capture], pending.c) */
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  bool waited = false;
  if (held != NULL && gca__device_wait_enter()) { /* Note [Capture gate] (device.c) */
    if (held->ops->stream_capture_info(s, &cs, NULL) == GCA_OK && cs == GCA_CAPTURE_STATUS_NONE) {
      waited = held->ops->stream_synchronize(s) == GCA_OK;
      if (!waited)
        GCA_LOG_WARN("retiring stream %p: waiting for its work: %s", (void *)s, gca_last_error());
    }
    gca__device_wait_leave();
  }
  for (int i = 0; i < GCA__MAX_DEVICES; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__dev_lock(d);
    /* a release batch under way read stream_gone with no lock held and may
     * be waiting for s: it finishes first, while s is still alive */
    gca__release_wait_all(d);
    (void)retire_on(d, s, true);
    if (waited && d->ncaptures == 0 &&
        atomic_load_explicit(&gca__device_captures, memory_order_relaxed) == 0)
      release_retired(d, s);
    gca__release_wait_all(d); /* a batch let go of the lock: none may hold s's blocks */
    rekey(d, s, waited);
    gca__dev_let_go(d);
  }
}
