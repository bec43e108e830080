/* SPDX-License-Identifier: Apache-2.0 */
/* recycle.h - the recycle bins (Note [Recycle bins], recycle.c): plain frees
 * of small blocks kept by (stream, size), uncoalesced, for the next requests
 * of their size; on by default (recycle_bins and free_cache).
 */
#ifndef GCA_RECYCLE_H
#define GCA_RECYCLE_H

#include "alloc_core.h"
#include "fcache.h"

#define GCA__RB_CLASSES  64 /* rounded sizes 512 B .. 32 KiB, a bin each */
#define GCA__RB_MAX_SIZE ((size_t)GCA__RB_CLASSES * GCA__MIN_BLOCK_SIZE)
#define GCA__RB_GROUPS   8  /* streams with bins, by hash: a power of two */
#define GCA__RB_BIN_MAX  64 /* blocks a bin holds */

/* The bins of one device (d->rb). Group g holds the bins of stream[g] while
 * nonempty[g] != 0; head[g][c] is the bin of blocks of (c + 1) * 512 bytes, a
 * stack linked through the blocks' `left`, n[g][c] blocks long; bit c of
 * nonempty[g] is set while it holds any. d->rb_count counts them all. */
typedef struct gca__rbins {
  gca_stream_t stream[GCA__RB_GROUPS];
  uint64_t nonempty[GCA__RB_GROUPS];
  uint16_t n[GCA__RB_GROUPS][GCA__RB_CLASSES];
  gca__block_t *head[GCA__RB_GROUPS][GCA__RB_CLASSES];
  /* the block the last request got (from a bin or the locked path), only
   * compared: its free tries the free cache's slot before the bins, as a
   * same-size pair's does */
  const gca__block_t *last;
  uint64_t hits; /* requests served from a bin (a counter only) */
} gca__rbins_t;

/* The group of stream's bins. */
static inline unsigned gca__rb_group(gca_stream_t stream) {
  return (unsigned)(((uint64_t)(uintptr_t)stream * 0x9e3779b97f4a7c15ull) >> 61);
}
_Static_assert(GCA__RB_GROUPS == 8, "gca__rb_group takes 3 bits of the hash");

/* Whether the bins may hold blocks: the key and the free cache on (fc_on:
 * its key, caching on, no garbage collection, which needs block ages), so
 * that free_cache:False is PyTorch's placement. Else they are flushed
 * (gca__caches_update). */
static inline bool gca__rb_allowed(const gca__devalloc_t *d) {
  return d->cfg.recycle_bins && d->fc_on;
}
/* Whether frees of small plain blocks may enter the bins now: allowed, no
 * thread cache, and nothing pending, deferred or capturing on the device. */
static inline bool gca__rb_on(const gca__devalloc_t *d) {
  return gca__rb_allowed(d) && !d->tc_on && (d->npending | d->ndeferred | d->ncaptures) == 0;
}

/* The free of live block b (d->lock held, in the pointer map, pending frees
 * processed) into its bin, with the statistics and history of a completed
 * free; false (nothing changed) when b may not enter one or its bin is full. */
bool gca__rb_put(gca__devalloc_t *d, gca__block_t *b);
static inline bool gca__rb_try_put(gca__devalloc_t *d, gca__block_t *b) {
  return gca__rb_on(d) && b->size <= GCA__RB_MAX_SIZE && gca__rb_put(d, b);
}
/* Whether the free of b tries the bins before the free cache's slot: all
 * but the free of the block the last request got, which is a same-size
 * pair's while the slot serves (Note [Recycle bins]). */
static inline bool gca__rb_first(const gca__devalloc_t *d, const gca__block_t *b) {
  return d->rb != NULL && (b != d->rb->last || gca__fc_wasteful(d));
}
/* A block of exactly `rounded` bytes of the default small pool for `stream`
 * from its bin, made active for `requested` bytes, or NULL. */
gca__block_t *gca__rb_take(gca__devalloc_t *d, gca_stream_t stream, size_t rounded,
                           size_t requested);
/* Returns the blocks of stream's bins (all bins) to the free tree, merged as
 * PyTorch's free would merge them. */
void gca__rb_flush_stream(gca__devalloc_t *d, gca_stream_t stream);
void gca__rb_flush(gca__devalloc_t *d);
/* Every held free to the tree: the free cache's slots (gca__fcache_flush)
 * and the bins, what every release path and walk does first. */
void gca__flush_caches(gca__devalloc_t *d);
/* gca__fcache_update, then the bins flushed unless they are still allowed
 * and no thread cache is on: after any change of setting, caching or
 * garbage collection. */
void gca__caches_update(gca__devalloc_t *d);
/* Checks the bins against the blocks (the walker, gca__allocator_check):
 * `nbinned` is the number of binned blocks it found in the segments. */
gca_status_t gca__rb_check(const gca__devalloc_t *d, size_t nbinned);
/* Frees the bins' table (allocator teardown; the blocks go with their segments). */
void gca__rb_destroy(gca__devalloc_t *d);

#endif
