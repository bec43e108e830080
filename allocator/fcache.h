/* SPDX-License-Identifier: Apache-2.0 */
/* fcache.h - the free cache's fast paths, inline for the entry points of
 * allocator.c and the facts the walker checks (Note [Free cache], Note [Exact
 * hits], Note [Free cache epochs] and Note [Free cache waste], fcache.c): the
 * slot of a (stream, pool), whether a free may be cached, the put, and the
 * hit.
 */
#ifndef GCA_FCACHE_H
#define GCA_FCACHE_H

#include "alloc_core.h"
#include "history.h"

/* Note [Free cache waste]: a put evicted unused adds one to the device's
 * waste, a hit takes GCA__FC_HIT_PAYS off; at GCA__FC_WASTE_OFF the device
 * stops caching, and then caches one free in GCA__FC_PROBE to see whether
 * hits came back. */
#define GCA__FC_WASTE_OFF 8
#define GCA__FC_HIT_PAYS  8
#define GCA__FC_PROBE     64

/* fc_exact: not known for the block's epoch yet, or known. */
enum { GCA__FC_EXACT_UNKNOWN, GCA__FC_EXACT_YES, GCA__FC_EXACT_NO };

/* The slot of a stream in a default pool of d. */
static inline gca__block_t **gca__fc_slot(gca__devalloc_t *d, gca_stream_t stream,
                                          const gca__pool_t *pool) {
  uint64_t h = (uint64_t)(uintptr_t)stream * 0x9e3779b97f4a7c15ull;
  return &d->fc_slots[((h >> (64 - 5)) << 1) | (pool != &d->small)];
}
_Static_assert(GCA__FC_SLOTS == 64, "gca__fc_slot takes 5 bits of the hash and the pool");

/* The change in (inactive_split, inactive_split_bytes) when b, not free,
 * becomes free and merges with its free neighbours (PyTorch's free_block);
 * the negation when it stops being free again. */
static inline void gca__fc_run_delta(const gca__block_t *b, int64_t *blocks, int64_t *bytes) {
  const gca__block_t *p = b->prev, *n = b->next;
  bool pfree = p != NULL && p->in_tree, nfree = n != NULL && n->in_tree;
  int64_t nb = 0, nby = 0;
  size_t run = b->size;
  if (pfree) {
    nb--;
    nby -= (int64_t)p->size;
    run += p->size;
  }
  if (nfree) {
    nb--;
    nby -= (int64_t)n->size;
    run += n->size;
  }
  if ((pfree ? p->prev : p) != NULL || (nfree ? n->next : n) != NULL) {
    nb++;
    nby += (int64_t)run;
  }
  *blocks = nb;
  *bytes = nby;
}

/* Whether the allocated block b of the default pool, with no recorded
 * streams, may go into `slot` (its slot) now: the slot is empty (so no cached
 * block is near b: its segment's blocks all map to this slot), b's lower
 * neighbour is not free (Note [Exact hits]) and no block of a thread cache's
 * domain is near b. When it may, b->fc_blocks/fc_bytes
 * say how caching it changes inactive_split; they are computed only when b's
 * epoch is not current (Note [Free cache epochs]). */
static inline __attribute__((always_inline)) bool
gca__fc_fits(const gca__devalloc_t *d, gca__block_t *const *slot, gca__block_t *b) {
  if (*slot != NULL)
    return false;
  if (b->fc_epoch == d->epoch)
    return true;
  if (b->prev != NULL && b->prev->in_tree)
    return false;
  if (GCA_UNLIKELY(d->tc_on) && gca__fc_near(b))
    return false; /* a thread cache's block shares b's run (Note [Thread caches]) */
  int64_t blocks, bytes;
  gca__fc_run_delta(b, &blocks, &bytes);
  b->fc_blocks = (int32_t)blocks; /* the run cannot change while b is cached */
  b->fc_bytes = bytes;
  return true;
}

/* Whether d wastes its puts (Note [Free cache waste]): then it counts a free
 * it does not cache, and gca__fc_probe is true for the one in GCA__FC_PROBE
 * that it may. */
static inline bool gca__fc_wasteful(const gca__devalloc_t *d) {
  return d->fc_waste >= GCA__FC_WASTE_OFF;
}
static inline bool gca__fc_probe(gca__devalloc_t *d) {
  if (GCA_LIKELY(--d->fc_skips != 0))
    return false;
  d->fc_skips = GCA__FC_PROBE;
  d->fc_waste = GCA__FC_WASTE_OFF - 1; /* off again if this one goes unused */
  return true;
}

/* Whether the free of live block b may be cached now (Note [Free cache]):
 * the cache is on, nothing waits for events, no capture routes frees, and b
 * is a plain block of a default pool, in no thread cache's domain. */
static inline bool gca__fc_cacheable(const gca__devalloc_t *d, const gca__block_t *b) {
  return d->fc_on && (d->npending | d->ndeferred | d->ncaptures) == 0 && b->nuses == 0 &&
         b->pool->owner == NULL && b->tc == NULL;
}

/* Adds n to statistic array `arr` for type t as gca__stat_add_t does, on a
 * device whose thread caches count nothing (!d->tc_count, checked under the lock): no
 * headroom to count, so no call on the path, and the fast paths of
 * allocator.c keep their few registers (Note [Thread caches]). */
static inline __attribute__((always_inline)) void gca__fc_stat_plain(gca_stat_t *arr, int t,
                                                                     int64_t n) {
  gca_stat_t *x = &arr[t], *all = &arr[GCA_STAT_ALL];
  x->current += n;
  all->current += n;
  if (n < 0) {
    x->freed -= n;
    return;
  }
  x->allocated += n;
  if (x->current > x->peak)
    x->peak = x->current;
  if (all->current > all->peak)
    all->peak = all->current;
}

/* Note [Leaf hits]: whether n >= 0 added to arr[t] passes neither its
 * peak nor the all-types one less the thread caches' headroom
 * (gca__stat_below_peak, gca__stat_inc_t's test before the rise), so that
 * the plain rise is exact and no fold is due. */
static inline __attribute__((always_inline)) bool
gca__fc_stat_room(const gca__devalloc_t *d, const gca_stat_t *arr, int t, int64_t n) {
  int i = gca__stat_index(d, arr);
  return gca__stat_below_peak(d, &arr[t], i + t, n) &&
         gca__stat_below_peak(d, &arr[GCA_STAT_ALL], i + GCA_STAT_ALL, n);
}

/* gca__fc_stat_plain for n >= 0: no test of the sign. */
static inline __attribute__((always_inline)) void gca__fc_stat_rise(gca_stat_t *arr, int t,
                                                                    int64_t n) {
  gca_stat_t *x = &arr[t], *all = &arr[GCA_STAT_ALL];
  x->current += n;
  all->current += n;
  x->allocated += n;
  if (x->current > x->peak)
    x->peak = x->current;
  if (all->current > all->peak)
    all->peak = all->current;
}

/* A statistic of the free cache's paths: plain (no thread cache, the
 * caller checked) or with the thread caches' headroom counted. */
static inline __attribute__((always_inline)) void gca__fc_stat(gca__devalloc_t *d, gca_stat_t *arr,
                                                               int t, int64_t n, bool plain) {
  if (plain)
    gca__fc_stat_plain(arr, t, n);
  else
    gca__stat_add_t(d, arr, t, n);
}

/* Note [Lazy puts]: the peaks that a plain put's rise in inactive_split
 * (blocks, bytes) would set, set now while the rise itself is owed. */
static inline void gca__fc_lazy_peaks(gca__devalloc_t *d, int t, int64_t blocks, int64_t bytes) {
  gca_stat_t *s[2] = {d->stats.inactive_split, d->stats.inactive_split_bytes};
  int64_t n[2] = {blocks, bytes};
  for (int i = 0; i < 2; i++) {
    if (n[i] <= 0)
      continue;
    gca_stat_t *x = &s[i][t], *all = &s[i][GCA_STAT_ALL];
    if (x->current + n[i] > x->peak)
      x->peak = x->current + n[i];
    if (all->current + n[i] > all->peak)
      all->peak = all->current + n[i];
  }
}

/* Note [Lazy puts]: b, put by the owed put, is taken for `requested` bytes:
 * the put and the take together leave every current as it was but
 * requested_bytes, and count one allocation and one free of each, which
 * wait in the record's pair count for the next settle. */
static inline __attribute__((always_inline)) void
gca__fc_lazy_cancel(gca__devalloc_t *d, gca__block_t *b, size_t requested) {
  int64_t old = d->fc_lazy.requested, req = (int64_t)requested;
  d->fc_lazy.b = NULL;
  d->fc_lazy.hot = b;
  d->fc_lazy.pairs++;
  d->fc_lazy.req_in += req;
  d->fc_lazy.req_out += old;
  if (GCA_UNLIKELY(req != old)) {
    int t = d->fc_lazy.t;
    gca_stat_t *r = &d->stats.requested_bytes[t], *ra = &d->stats.requested_bytes[GCA_STAT_ALL];
    r->current += req - old;
    ra->current += req - old;
    if (r->current > r->peak)
      r->peak = r->current;
    if (ra->current > ra->peak)
      ra->peak = ra->current;
  }
  b->allocated = true;
  b->requested = requested;
  b->oversize = d->fc_lazy.oversize;
}

/* Frees the allocated block b into `slot` (gca__fc_fits said yes) with the
 * statistics of a completed free; b stays in the pointer map. History is the
 * caller's. `plain`: the device has no thread cache (gca__fc_stat). */
static inline __attribute__((always_inline)) void
gca__fc_put(gca__devalloc_t *d, gca__block_t **slot, gca__block_t *b, bool plain) {
  int t = gca__stat_type(b->pool);
  int64_t blocks = b->fc_blocks, bytes = b->fc_bytes;
  b->fc_epoch = ++d->epoch;
  b->allocated = false;
  gca__fc_settled(d);
  d->fc_lazy.hot = NULL;
  if (plain) { /* owed (Note [Lazy puts]); a rise in inactive_split may set its peak now */
    d->fc_lazy.b = b;
    d->fc_lazy.slot = slot;
    d->fc_lazy.t = t;
    d->fc_lazy.oversize = b->oversize;
    d->fc_lazy.size = (int64_t)b->size;
    d->fc_lazy.leaf_key = b->pool == (b->size <= GCA__SMALL_SIZE ? &d->small : &d->large)
                              ? gca__round_key(b->size)
                              : SIZE_MAX;
    d->fc_lazy.requested = (int64_t)b->requested;
    d->fc_lazy.blocks = blocks;
    d->fc_lazy.bytes = bytes;
    if (GCA_UNLIKELY(blocks > 0 || bytes > 0))
      gca__fc_lazy_peaks(d, t, blocks, bytes);
    b->oversize = false;
  } else {
    gca__stat_block_free(d, b, t);
    gca__stat_add_t(d, d->stats.inactive_split, t, blocks);
    gca__stat_add_t(d, d->stats.inactive_split_bytes, t, bytes);
    gca__stat_dec_t(d, d->stats.requested_bytes, t, (int64_t)b->requested);
  }
  b->requested = 0;
  b->cached = true;
  gca__pf_forget(d, b->addr); /* Note [Free facts] */
  *slot = b;
  d->fc_count++;
}

/* The block the last cancel made active, when the free of addr is its own
 * and nothing changed its state since (its epoch is current, no stream was
 * recorded on it): the block half of gca__fc_reput's test; else NULL. */
static inline gca__block_t *gca__fc_hot_block(const gca__devalloc_t *d, gca_devptr_t addr) {
  gca__block_t *b = d->fc_lazy.hot;
  return b != NULL && b->addr == addr && b->allocated && b->fc_epoch == d->epoch && b->nuses == 0
             ? b
             : NULL;
}

/* gca__fc_reput past its checks. */
static inline __attribute__((always_inline)) void gca__fc_reput_now(gca__devalloc_t *d,
                                                                    gca__block_t *b) {
  b->fc_epoch = ++d->epoch;
  b->allocated = false;
  d->fc_lazy.b = b;
  d->fc_lazy.hot = NULL;
  d->fc_lazy.requested = (int64_t)b->requested;
  b->oversize = false;
  b->requested = 0;
  b->cached = true;
  *d->fc_lazy.slot = b;
  d->fc_count++;
}

/* Note [Lazy puts]: the free of `addr` puts back the block the last cancel
 * made active, when no put and no change of block state came since (its
 * epoch is current): then the record still describes it and its slot, its
 * facts hold and the slot is empty, so the put is owed again with the record
 * as it is but for the requested bytes, and no pointer map, slot or
 * neighbour is read. The caller holds d->lock and has no thread cache to
 * count (!d->tc_on). False: the usual path. */
static inline __attribute__((always_inline)) bool gca__fc_reput(gca__devalloc_t *d,
                                                                gca_devptr_t addr) {
  gca__block_t *b = gca__fc_hot_block(d, addr);
  if (b == NULL || !d->fc_on || d->ncaptures != 0 || GCA_UNLIKELY(gca__fc_wasteful(d)) ||
      !gca__fc_quiet(d))
    return false;
  gca__fc_reput_now(d, b);
  return true;
}

/* Whether a request for b's (stream, size) would receive b (cached, or
 * allocated and about to be) from PyTorch's best fit now (Note [Exact
 * hits]). */
bool gca__fc_exact_now(const gca__devalloc_t *d, const gca__block_t *b);
/* gca__fc_exact_now, kept in b while its pool's free tree does not change. */
bool gca__fc_exact_slow(const gca__devalloc_t *d, gca__block_t *b);
/* Whether a request for b's (stream, size) would receive b from PyTorch's
 * best fit now; computed only when the tree changed since it last was. */
static inline bool gca__fc_exact(const gca__devalloc_t *d, gca__block_t *b) {
  if (GCA_LIKELY(b->fc_gen == b->pool->gen && b->fc_exact != GCA__FC_EXACT_UNKNOWN))
    return b->fc_exact == GCA__FC_EXACT_YES;
  return gca__fc_exact_slow(d, b);
}

/* The cached block of exactly (stream, rounded) in `pool` when PyTorch's best
 * fit would return it too, made active for `requested` bytes (PyTorch's
 * statistics of an allocation that did not split), or NULL. `quiet`: nothing
 * is pending and the device has no thread cache (the caller checked), so
 * active's peak needs no update (Note [Active statistics]) and the statistics
 * are plain (gca__fc_stat). */
static inline __attribute__((always_inline)) gca__block_t *
gca__fc_take(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream, size_t rounded,
             size_t requested, bool quiet) {
  gca__block_t **slot, *b = d->fc_lazy.b;
  if (quiet && b != NULL && b->size == rounded && b->stream == stream && b->pool == pool) {
    slot = d->fc_lazy.slot; /* the owed put's block: no hash */
  } else {
    slot = gca__fc_slot(d, stream, pool);
    b = *slot;
    if (b == NULL || b->stream != stream || b->size != rounded || b->pool != pool)
      return NULL;
  }
  if (!gca__fc_exact(d, b))
    return NULL;
  *slot = NULL;
  if (GCA_UNLIKELY(d->fc_waste != 0))
    d->fc_waste = d->fc_waste > GCA__FC_HIT_PAYS ? d->fc_waste - GCA__FC_HIT_PAYS : 0;
  d->fc_count--;
  b->cached = false;
  if (GCA_LIKELY(quiet && d->fc_lazy.b == b)) { /* its own put's statistics cancel */
    gca__fc_lazy_cancel(d, b, requested);
    return b;
  }
  gca__fc_settled(d);
  int t = gca__stat_type(pool);
  gca__fc_stat(d, d->stats.inactive_split, t, -(int64_t)b->fc_blocks, quiet);
  gca__fc_stat(d, d->stats.inactive_split_bytes, t, -b->fc_bytes, quiet);
  b->allocated = true;
  b->requested = requested;
  if (quiet) { /* gca__stat_block_alloc, plain */
    gca__fc_stat_rise(d->stats.allocation, t, 1);
    gca__fc_stat_rise(d->stats.allocated_bytes, t, (int64_t)b->size);
    gca__fc_stat_rise(d->stats.requested_bytes, t, (int64_t)requested);
    b->oversize = b->size >= d->cfg.max_split_size;
    if (b->oversize) { /* one statistic, not an array by type */
      gca_stat_t *o = &d->stats.oversize_allocations;
      o->current++;
      o->allocated++;
      if (o->current > o->peak)
        o->peak = o->current;
    }
  } else {
    gca__stat_block_alloc(d, b, t, false);
  }
  return b;
}

/* Note [Leaf gate]: the leaf hits below ask, on every call, whether anything
 * they cannot handle is under way: thread caches, something to give back,
 * divisions of the rounding, the free cache off or wasting its puts, a
 * capture, pending or deferred frees, a route to a private pool. Each is a
 * field written under d->lock, so instead of a dozen loads and tests a leaf
 * reads one byte, d->fc_gate, which every holder recomputes as it lets the
 * lock go (gca__dev_let_go, also the end of gca__dev_unlock): a leaf holds
 * the lock, so the gate it reads is the one the last holder left, with every
 * change that holder made in it. A new device starts shut. The history
 * recorders (a trace, the history ring, trace observers) are process-wide and
 * turn on without any device lock: whoever turns one on then takes and lets
 * go every device's lock (gca__fc_gates_shut), after its own locks, which a
 * holder of a device lock may take to record. A leaf running meanwhile
 * overlaps the call that turns recording on; none runs after it returns.
 * Turning them off needs nothing: the gates open at the next let-go. The
 * full paths keep their own tests. The thread caches' gate (d->tc_gate,
 * which their fast paths read without the lock) is kept at the same moments
 * and carries the routes and the recorders the same way. */
/* Note [Leaf hits] (allocator.c): with d->lock held by the calling
 * thread's bias, the owed put's block taken for `size` bytes on `stream`
 * when it is gca__fc_take's hit and nothing on the way calls a function (no
 * thread caches, nothing to give back, the plain rounding, no waste to pay
 * back, the exact-fit memo known); else NULL, nothing done. */
static inline __attribute__((always_inline)) gca__block_t *
gca__fc_leaf_take(gca__devalloc_t *d, size_t size, gca_stream_t stream) {
  gca__block_t *b = d->fc_lazy.b;
  /* the put's leaf_key: b's size, with b in the default pool of that size
   * (b->size is a multiple of 512, so a request of the same key rounds to it) */
  if (b == NULL || d->fc_lazy.leaf_key != gca__round_key(size) ||
      !gca__stream_keyed(b->stream, stream) || (d->fc_gate & GCA__GATE_FC) ||
      b->fc_gen != b->pool->gen || b->fc_exact != GCA__FC_EXACT_YES)
    return NULL;
  *d->fc_lazy.slot = NULL;
  d->fc_count--;
  b->cached = false;
  gca__fc_lazy_cancel(d, b, size);
  return b;
}

/* Note [Leaf hits]: with d->lock held by the calling thread's bias, the
 * free of `addr` as gca__fc_reput, when nothing on the way calls a function
 * (no thread caches, nothing to give back); false, nothing done, else. */
static inline __attribute__((always_inline)) bool gca__fc_leaf_put(gca__devalloc_t *d,
                                                                   gca_devptr_t addr) {
  gca__block_t *b = gca__fc_hot_block(d, addr);
  if (b == NULL || (d->fc_gate & GCA__GATE_FC))
    return false;
  gca__fc_reput_now(d, b);
  return true;
}

/* ---- fcache.c ---- */

/* Returns every block of the free cache to its pool's free tree, coalesced;
 * statistics do not change (gca__flush_caches also empties the recycle
 * bins). */
void gca__fcache_flush(gca__devalloc_t *d);
/* Returns the block of `stream`'s slot in `pool`, if it is that stream's, to
 * the free tree: what a miss of that (stream, pool) does before its search. */
void gca__fcache_evict_slot(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream);
/* Recomputes d->fc_on after a setting changed; flushes when caching stops.
 * The thread caches give back everything (Note [Thread caches]). */
void gca__fcache_update(gca__devalloc_t *d);
/* Evicts the held blocks that share a free run with b's neighbours, before
 * b's state changes: cached ones go back to the tree, a thread cache's
 * handed-out one leaves its domain. */
void gca__fcache_evict_near(gca__devalloc_t *d, gca__block_t *b);
/* gca__fcache_try_put past its cacheability test. */
bool gca__fcache_put_locked(gca__devalloc_t *d, gca__block_t *b);
/* The free path's attempt at the cache, with history: true when b (live,
 * d->lock held, events processed) is now cached. Inline: with the cache off
 * (free_cache:False) the free path pays one test. */
static inline bool gca__fcache_try_put(gca__devalloc_t *d, gca__block_t *b) {
  return gca__fc_cacheable(d, b) && gca__fcache_put_locked(d, b);
}

#endif
