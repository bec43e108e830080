/* SPDX-License-Identifier: Apache-2.0 */
/* fcache.c - the free cache: plain frees wait, uncoalesced and out of the
 * free tree, in per-device (stream, size) bins for the next request of that
 * size; a miss, and every path that releases memory, flushes them back into
 * the tree first. fcache.h holds the hit and put paths inline, for the entry
 * points of allocator.c.
 *
 * Note [Free cache]. The cached alloc/free pair of PyTorch's rules splits a
 * free block on every malloc and merges it back on every free: with the tree
 * updates, the pointer map and the statistics that is several hundred
 * instructions, where glibc's malloc+free of a small size is a few dozen. So a
 * free may instead put the block into a small per-device cache, binned by
 * (stream, size), without coalescing it, and a later malloc of exactly that
 * rounded size on that stream takes the newest one back: no tree, no split,
 * no merge, and the block never left the pointer map. Only plain frees are
 * cached: the block has no recorded streams, belongs to a default pool, no
 * capture is under way, caching is on, garbage collection is off, and the
 * free_cache key is True (its default).
 *
 * A malloc that misses (any other size or stream) flushes the whole cache
 * first, so it searches exactly the free blocks PyTorch's rules would have,
 * merged as they would be; the cache only defers coalescing until then.
 *
 * What stays exactly as without the cache:
 * - Statistics, peaks included, at every moment. A cached block counts as
 *   free, and inactive_split counts it as if it had been merged with its free
 *   neighbours (gca__fc_run_delta). For that to be computable in O(1), a block is
 *   cached only when no block within two places of it is cached, so the
 *   logical free run of a cached block X is just {prev if free, X, next if
 *   free}, and that run cannot change while X is cached: anything about to
 *   touch it takes X out of the cache first (gca__fcache_evict_near, called
 *   before a pending or uncached free completes beside it).
 * - Memory use: a miss flushes before it searches, and every release path
 *   (empty_cache, out of memory, garbage collection, turning caching off)
 *   flushes first, so cached blocks never cost a segment.
 * - What snapshots show: the walk flushes first.
 * - Error reports: a cached pointer is not live (double free, record_stream,
 *   pointer_info, IPC export say so).
 * What differs: which block a request of a cached (stream, size) receives.
 * PyTorch's best fit would search the merged free blocks (and could pick a
 * smaller-keyed one); the cache returns the block of that size freed last.
 * free_cache:False restores PyTorch's placement exactly.
 *
 * Note [Free cache epochs]: a free into the cache must know that no cached
 * block lies within two places of the block and how caching it changes
 * inactive_split; both depend only on its neighbours. d->epoch advances on
 * every change of block state except the cache's own hit (a cache hit turns
 * a cached block into an allocated one, and cached blocks are never near one
 * another, so it changes neither fact for any other block): each time the
 * lock is taken by gca__dev_lock, at the start of the locked malloc and free
 * paths, and by each put into the cache. A put records the new epoch in the
 * block; when the same block comes back to be freed and the epoch has not
 * moved (the pattern alloc, free, alloc, free of one size), the facts it
 * stored still hold and the neighbours are not read. The invariant walker
 * recomputes them for every block whose epoch is current.
 */
#include "fcache.h"
#include "tcache.h"

/* Takes b out of its bin; the caller clears b->cached. */
static void fc_unlink(gca__devalloc_t *d, gca__block_t *b) {
  gca__fcbin_t *bin = gca__fc_bin(d, b->stream, b->size);
  gca__block_t **link = &bin->head;
  while (*link != b) {
    GCA_ASSERT(*link != NULL);
    link = &(*link)->left;
  }
  *link = b->left;
  b->left = NULL;
  bin->n--;
  d->fc_count--;
}

/* Returns a cached block to the free tree: out of the pointer map, merged
 * with its free neighbours. Statistics already count it as merged. */
static void fc_evict(gca__devalloc_t *d, gca__block_t *b) {
  int64_t blocks, bytes;
  fc_unlink(d, b);
  b->cached = false;
  gca__block_t *taken = gca__ptrmap_take(&d->ptrs, b->addr);
  GCA_ASSERT(taken == b);
  gca__block_coalesce(d, b, &blocks, &bytes);
  GCA_ASSERT(blocks == b->fc_blocks && bytes == b->fc_bytes); /* its run did not change */
}

/* Evicts held block b: from the free cache or a thread cache's domain. */
static void evict_held(gca__devalloc_t *d, gca__block_t *b) {
  if (b->cached)
    fc_evict(d, b);
  else
    gca__tc_evict(d, b);
}

void gca__fcache_evict_near(gca__devalloc_t *d, gca__block_t *b) {
  /* both are found first: when b is in the tree, the first eviction merges b away */
  gca__block_t *below = gca__fc_cached_below(b), *above = gca__fc_cached_above(b);
  if (below != NULL)
    evict_held(d, below);
  if (above != NULL)
    evict_held(d, above);
}

static void fc_evict_bin(gca__devalloc_t *d, gca__fcbin_t *bin) {
  while (bin->head != NULL)
    fc_evict(d, bin->head);
}

void gca__fcache_flush(gca__devalloc_t *d) {
  for (size_t i = 0; i < GCA__FC_BINS && d->fc_count != 0; i++)
    fc_evict_bin(d, &d->fc_bins[i]);
}

void gca__fcache_update(gca__devalloc_t *d) {
  d->fc_on = d->cfg.free_cache && d->caching && !gca__gc_enabled(d); /* GC needs block ages */
  if (!d->fc_on)
    gca__fcache_flush(d);
  gca__tc_update(d, true);
}

bool gca__fcache_put_locked(gca__devalloc_t *d, gca__block_t *b) {
  gca__fcbin_t *bin = gca__fc_bin(d, b->stream, b->size);
  if (bin->n != 0 && (bin->stream != b->stream || bin->size != b->size))
    fc_evict_bin(d, bin); /* another (stream, size) hashed here: the newer wins */
  if (!gca__fc_fits(d, bin, b))
    return false;
  gca_devptr_t addr = b->addr;
  uint64_t requested = b->requested;
  gca__fc_put(d, bin, b, false);
  gca__history_event(GCA_HA_FREE_REQUESTED, d->device, addr, requested, b->stream);
  gca__history_event(GCA_HA_FREE_COMPLETED, d->device, addr, requested, b->stream);
  return true;
}
