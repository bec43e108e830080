/* SPDX-License-Identifier: Apache-2.0 */
/* fcache.h - the free cache's fast paths, inline for the entry points of
 * allocator.c and the facts the walker checks (Note [Free cache] and Note
 * [Free cache epochs], fcache.c): the bin of a (stream, size), whether a free
 * may be cached, the put, and the hit.
 */
#ifndef GCA_FCACHE_H
#define GCA_FCACHE_H

#include "alloc_core.h"
#include "history.h"

static inline gca__fcbin_t *gca__fc_bin(gca__devalloc_t *d, gca_stream_t stream, size_t size) {
  uint64_t h = ((uint64_t)(uintptr_t)stream ^ (size >> 9)) * 0x9e3779b97f4a7c15ull;
  return &d->fc_bins[h >> (64 - 6)];
}
_Static_assert(GCA__FC_BINS == 64, "gca__fc_bin takes 6 bits of the hash");

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
 * streams, may go into `bin` (its bin) now: the bin holds its (stream, size)
 * or nothing and has room, and no cached block is too near. When it may,
 * b->fc_blocks/fc_bytes say how caching it changes inactive_split; they are
 * computed only when b's epoch is not current (Note [Free cache epochs]). */
static inline __attribute__((always_inline)) bool
gca__fc_fits(const gca__devalloc_t *d, const gca__fcbin_t *bin, gca__block_t *b) {
  if ((bin->n != 0 && (bin->stream != b->stream || bin->size != b->size)) ||
      bin->n == GCA__FC_BIN_MAX)
    return false;
  if (b->fc_epoch == d->epoch)
    return true;
  if (gca__fc_near(b))
    return false;
  int64_t blocks, bytes;
  gca__fc_run_delta(b, &blocks, &bytes);
  b->fc_blocks = (int32_t)blocks; /* the run cannot change while b is cached */
  b->fc_bytes = bytes;
  return true;
}

/* Whether the free of live block b may be cached now (Note [Free cache]):
 * the cache is on, nothing waits for events, no capture routes frees, and b
 * is a plain block of a default pool, in no thread cache's domain. */
static inline bool gca__fc_cacheable(const gca__devalloc_t *d, const gca__block_t *b) {
  return d->fc_on && (d->npending | d->ndeferred | d->ncaptures) == 0 && b->nuses == 0 &&
         b->pool->owner == NULL && b->tc == NULL;
}

/* Whether the free cache's fast paths may run on device d now (d->lock held):
 * nothing is pending, no request is routed to a private pool and no history
 * is recorded, so a hit or a put is the whole operation. */
static inline bool gca__fc_quiet(const gca__devalloc_t *d) {
  return (d->npending | d->ndeferred) == 0 &&
         atomic_load_explicit(&d->routing, memory_order_relaxed) == 0 &&
         atomic_load_explicit(&gca__history_recorders, memory_order_relaxed) == 0;
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

/* A statistic of the free cache's paths: plain (no thread cache, the
 * caller checked) or with the thread caches' headroom counted. */
static inline __attribute__((always_inline)) void gca__fc_stat(gca__devalloc_t *d, gca_stat_t *arr,
                                                               int t, int64_t n, bool plain) {
  if (plain)
    gca__fc_stat_plain(arr, t, n);
  else
    gca__stat_add_t(d, arr, t, n);
}

/* Frees the allocated block b into `bin` (gca__fc_fits said yes) with the
 * statistics of a completed free; b stays in the pointer map. History is the
 * caller's. `plain`: the device has no thread cache (gca__fc_stat). */
static inline __attribute__((always_inline)) void gca__fc_put(gca__devalloc_t *d, gca__fcbin_t *bin,
                                                              gca__block_t *b, bool plain) {
  int t = gca__stat_type(b->pool);
  int64_t blocks = b->fc_blocks, bytes = b->fc_bytes;
  b->fc_epoch = ++d->epoch;
  b->allocated = false;
  gca__stat_block_free(d, b, t);
  gca__fc_stat(d, d->stats.inactive_split, t, blocks, plain);
  gca__fc_stat(d, d->stats.inactive_split_bytes, t, bytes, plain);
  gca__stat_dec_t(d, d->stats.requested_bytes, t, (int64_t)b->requested);
  b->requested = 0;
  b->cached = true;
  bin->stream = b->stream;
  bin->size = b->size;
  b->left = bin->head;
  bin->head = b;
  bin->n++;
  d->fc_count++;
}

/* The newest cached block of exactly (stream, rounded) in `pool`, made
 * active for `requested` bytes (PyTorch's statistics of an allocation that
 * did not split), or NULL. `quiet`: nothing is pending and the device has no
 * thread cache (the caller checked), so active's peak needs no update (Note
 * [Active statistics]) and the statistics are plain (gca__fc_stat). */
static inline __attribute__((always_inline)) gca__block_t *
gca__fc_take(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream, size_t rounded,
             size_t requested, bool quiet) {
  gca__fcbin_t *bin = gca__fc_bin(d, stream, rounded);
  gca__block_t *b = bin->head;
  if (b == NULL || bin->stream != stream || bin->size != rounded || b->pool != pool)
    return NULL;
  bin->head = b->left;
  b->left = NULL;
  bin->n--;
  d->fc_count--;
  b->cached = false;
  int t = gca__stat_type(pool);
  gca__fc_stat(d, d->stats.inactive_split, t, -(int64_t)b->fc_blocks, quiet);
  gca__fc_stat(d, d->stats.inactive_split_bytes, t, -b->fc_bytes, quiet);
  b->allocated = true;
  b->requested = requested;
  if (quiet) { /* gca__stat_block_alloc, plain */
    gca__fc_stat_plain(d->stats.allocation, t, 1);
    gca__fc_stat_plain(d->stats.allocated_bytes, t, (int64_t)b->size);
    gca__fc_stat_plain(d->stats.requested_bytes, t, (int64_t)requested);
    b->oversize = b->size >= d->cfg.max_split_size;
    if (b->oversize)
      gca__fc_stat_plain(&d->stats.oversize_allocations, 0, 1);
  } else {
    gca__stat_block_alloc(d, b, t, false);
  }
  return b;
}

/* ---- fcache.c ---- */

/* Returns every block of the free cache to its pool's free tree, coalesced;
 * statistics do not change. */
void gca__fcache_flush(gca__devalloc_t *d);
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
