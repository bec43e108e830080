/* SPDX-License-Identifier: Apache-2.0 */
/* recycle.c - the recycle bins: a plain free of a small block (up to
 * GCA__RB_MAX_SIZE) waits, uncoalesced and out of the free tree, in a bin of
 * its (stream, size), and a later request of exactly that rounded size on
 * that stream takes it back. On by default; recycle_bins:False turns them
 * off, and free_cache:False turns them off with the rest of the free cache.
 *
 * Note [Recycle bins]. With many live blocks and random frees, PyTorch's
 * rules cost a free its neighbours' records, the merge, two removals from
 * the free tree and an insert, and an allocation a search, a split and
 * another insert: at 10^6 live blocks about a dozen cache misses per free
 * and allocation (README, gca-bench-churn). The free cache (Note [Free
 * cache]) saves that work only where PyTorch's best fit would return the
 * cached block, which random churn almost never gives. A bin gives up that
 * placement for small blocks: a free pushes the block on the stack of its
 * (stream, rounded size) and leaves it in the pointer map, touching only its
 * own record; a request of that rounded size pops the last one freed, with
 * no search and no split. Larger blocks, private pools, expandable segments,
 * blocks with recorded streams, and everything while a thread cache, a
 * pending or deferred free or a capture is on the device take PyTorch's
 * paths as before.
 *
 * Memory. A binned block is free but out of reach of every other size and
 * stream, so bins never cost a segment: a request whose stream's tree has
 * nothing that fits returns that stream's bins to the tree and searches
 * again before it asks for memory (dev_malloc_locked), and every path that
 * releases memory (empty_cache, the out-of-memory remedies, garbage
 * collection, turning caching, the free cache or the key off) and every
 * walk (snapshots)
 * returns all of them first (gca__flush_caches). A bin holds at most
 * GCA__RB_BIN_MAX blocks; a free that finds it full takes the tree's path.
 * The layout differs from PyTorch's (the bins choose which block of a size a
 * request gets, and leave free neighbours unmerged until they go back);
 * free_cache:False keeps PyTorch's placement exactly. On every trace
 * measured (README) peak reserved memory is the same with the bins as
 * without; gca-replay reports it for any trace.
 *
 * Statistics follow the layout as it is. A binned block counts as freed when
 * it enters the bin (allocation, allocated_bytes, requested_bytes, active),
 * and as one inactive split block of its own size unless it is its
 * segment's only block: it is not merged, so no neighbour changes that, and
 * nothing can make it whole while it waits (its neighbours do not merge into
 * it). Going back to the tree, it stops counting so and merges as a free
 * completing then would, which can only lower inactive_split, so no peak
 * moves. Its way out of a bin is an allocation counted as any other. The
 * walker counts a binned block as a free run of its own.
 *
 * Order. The free of the block the last request got tries the free cache's
 * slot first (rb->last): that is a same-size pair, whose leaf path (Note
 * [Leaf hits]) costs a fraction of a bin's put and take; any other free, and
 * that one once the free cache wastes its puts, tries the bins first. Thread
 * caches, once a second thread has engaged them, come before both: they
 * serve their thread without the device lock, which the bins need. A free
 * that reaches the locked path because its thread's cache did not take it
 * (a size it does not take, a full or parked cache) goes to the bins, and a
 * request its thread's cache misses takes from them on the locked path. The
 * bins' leaf paths are for a device without thread caches, whose statistics
 * are plain; the put from a slot's facts (Note [Free facts]) also serves a
 * thread whose cache declines the free unread (parked, or its domain full),
 * counting the caches' headroom.
 *
 * The free cache counts its blocks as merged with their free neighbours
 * (Note [Free cache]), and so do the thread caches with the bins off (with
 * them on, a thread cache's block is a run of its own, as a binned block
 * is: Note [Thread cache runs]); for them a binned block is an
 * allocated one: it is never in the tree, so entering or leaving a bin
 * changes no run of theirs, and its return to the tree is a free completing
 * beside them, which evicts them first (gca__fcache_evict_near), as any
 * other does. A binned block is not live: a second free, record_stream,
 * pointer_info and IPC export fail on it as on any freed pointer.
 *
 * Note [Free facts]. With a million live blocks a free misses in the pointer
 * map and then again in the block's record, one after the other, before it
 * knows whether a bin may take the block: about as long again as the rest
 * of the free and the allocation together. So the slot keeps what that
 * decision reads of the record (gca__pf_of): that the block is a live plain
 * block of the default small pool in a classic segment, not whole, with no
 * recorded stream, no thread cache and no oversize count, its stream, its
 * bin's class and its requested bytes. gca__rb_put_fast decides from the
 * slot alone and writes the record without reading it; the next request of
 * that size takes the block back soon, while the lines those writes brought
 * in are still near. Facts are written where such a block becomes live
 * (gca__pf_note: an allocation from the tree or from a bin) and are zero
 * where anything else put it in the map (gca__ptrmap_insert). They hold only
 * while nothing changed what they say: everything that makes a live block
 * stop being one and keeps it in the map clears them (the free cache's put,
 * a bin's put, a thread cache's domain taking it in: gca__pf_forget), as does
 * a recorded stream; a thread cache hands its blocks out with no map in
 * sight, so they stay without; and a change of the thread caches or of any
 * cache setting bumps the device's pf_epoch, which voids every fact at once.
 * A free whose slot has no facts reads the record as before. The walker
 * checks every fact that holds against its record.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "fcache.h"
#include "history.h"
#include "recycle.h"
#include "tcache.h"

_Static_assert(GCA__RB_CLASSES == 64, "a group's nonempty bins are one 64-bit mask");

/* b's share of inactive_split while binned (gca__run_alone). */
static inline void rb_split_stat(gca__devalloc_t *d, const gca__block_t *b, int sign) {
  int64_t blocks, bytes;
  gca__run_alone(b, &blocks, &bytes);
  if (blocks == 0)
    return;
  gca__stat_pool(d, d->stats.inactive_split, b->pool, sign * blocks);
  gca__stat_pool(d, d->stats.inactive_split_bytes, b->pool, sign * bytes);
}

/* Returns binned block b, out of its bin, to the free tree: out of the
 * pointer map, merged with its free neighbours. (Caching turned off releases
 * what that frees right after: gca_set_caching.) */
static void rb_return(gca__devalloc_t *d, gca__block_t *b) {
  int64_t blocks, bytes;
  d->epoch++; /* a change of block state (Note [Free cache epochs]) */
  if (d->fc_count != 0 || d->tc_held != 0)
    gca__fcache_evict_near(d, b); /* their runs grow by b: they go first */
  rb_split_stat(d, b, -1);
  d->rb_count--;
  b->binned = false;
  b->left = NULL;
  gca__block_t *taken = gca__ptrmap_take(&d->ptrs, b->addr);
  GCA_ASSERT(taken == b);
  gca__block_coalesce(d, b, &blocks, &bytes);
  gca__stat_pool(d, d->stats.inactive_split, b->pool, blocks);
  gca__stat_pool(d, d->stats.inactive_split_bytes, b->pool, bytes);
}

static void rb_flush_group(gca__devalloc_t *d, unsigned g) {
  gca__rbins_t *rb = d->rb;
  gca__fc_settled(d); /* Note [Lazy puts]: the owed put's statistics come first */
  while (rb->nonempty[g] != 0) {
    unsigned c = (unsigned)__builtin_ctzll(rb->nonempty[g]);
    gca__block_t *b = rb->head[g][c];
    rb->head[g][c] = b->left;
    if (--rb->n[g][c] == 0)
      rb->nonempty[g] &= ~((uint64_t)1 << c);
    rb_return(d, b);
  }
}

bool gca__rb_put(gca__devalloc_t *d, gca__block_t *b) {
  gca__pool_t *pool = b->pool;
  if (pool != &d->small || b->seg->expandable || b->nuses != 0 || b->event_count != 0 ||
      b->tc != NULL || !b->allocated)
    return false;
  gca__rbins_t *rb = d->rb;
  if (GCA_UNLIKELY(rb == NULL))
    return false; /* no table (host memory): the plain free */
  unsigned g = gca__rb_group(b->stream), c = gca__rb_class(b->size);
  if (rb->stream[g] != b->stream) {
    if (rb->nonempty[g] != 0)
      rb_flush_group(d, g); /* another stream's: the newer stream takes the group */
    rb->stream[g] = b->stream;
  }
  if (rb->n[g][c] >= GCA__RB_BIN_MAX)
    return false;
  gca__fc_settled(d);
  d->epoch++;
  int t = gca__stat_type(pool);
  gca_devptr_t addr = b->addr;
  size_t requested = b->requested;
  b->allocated = false;
  if (GCA_LIKELY(!d->tc_count && !b->oversize && !gca__block_whole(b))) {
    /* no headroom to count: the plain updates (gca__fc_stat_plain) */
    gca__fc_stat_plain(d->stats.allocation, t, -1);
    gca__fc_stat_plain(d->stats.allocated_bytes, t, -(int64_t)b->size);
    gca__fc_stat_plain(d->stats.requested_bytes, t, -(int64_t)requested);
    gca__fc_stat_rise(d->stats.inactive_split, t, 1);
    gca__fc_stat_rise(d->stats.inactive_split_bytes, t, (int64_t)b->size);
  } else {
    gca__stat_block_free(d, b, t);
    gca__stat_dec_t(d, d->stats.requested_bytes, t, (int64_t)requested);
    rb_split_stat(d, b, 1);
  }
  b->requested = 0;
  b->binned = true;
  gca__pf_forget(d, addr);
  b->left = rb->head[g][c];
  rb->head[g][c] = b;
  rb->n[g][c]++;
  rb->nonempty[g] |= (uint64_t)1 << c;
  d->rb_count++;
  gca__history_event(GCA_HA_FREE_REQUESTED, d->device, addr, requested, b->stream);
  gca__history_event(GCA_HA_FREE_COMPLETED, d->device, addr, requested, b->stream);
  return true;
}

bool gca__rb_put_fast(gca__devalloc_t *d, gca__ptrslot_t *e) {
  unsigned g, c;
  gca_devptr_t key = e->key;
  /* gca__rb_on; a group to hand over or a full bin take the full path, as
   * does a free the calling thread's cache may take (it comes first) */
  if (d->rb == NULL || !gca__rb_on(d) || !gca__rb_takes(d, e, &g, &c) ||
      (d->tc_on && !gca__tc_declines(d)))
    return false;
  gca__fc_settled(d);
  /* a cache parked just now (gca__tc_declines) returned its blocks to the
   * tree and took them out of the map, whose deletions move slots: e again */
  e = gca__ptrmap_slot(&d->ptrs, key);
  GCA_ASSERT(e != NULL && gca__pf_hold(d, e));
  size_t requested = gca__pf_requested(e->facts);
  gca__rb_put_facts(d, e, g, c, !d->tc_count, false);
  gca__history_event(GCA_HA_FREE_REQUESTED, d->device, e->key, (size_t)requested, e->stream);
  gca__history_event(GCA_HA_FREE_COMPLETED, d->device, e->key, (size_t)requested, e->stream);
  return true;
}

gca__block_t *gca__rb_take(gca__devalloc_t *d, gca_stream_t stream, size_t rounded,
                           size_t requested) {
  gca__rbins_t *rb = d->rb;
  if (rounded > GCA__RB_MAX_SIZE)
    return NULL;
  unsigned g = gca__rb_group(stream), c = gca__rb_class(rounded);
  gca__block_t *b = rb->head[g][c];
  if (b == NULL || rb->stream[g] != stream)
    return NULL;
  gca__fc_settled(d);
  gca__rb_pop(d, g, c, requested);
  int t = gca__stat_type(b->pool);
  if (GCA_LIKELY(!d->tc_count && d->pend[GCA_STAT_ALL].current == 0 &&
                 b->size < d->cfg.max_split_size && !gca__block_whole(b))) {
    /* no headroom to count, nothing pending (active's peak is allocation's,
     * Note [Active statistics]), not oversize: the plain updates */
    gca__fc_stat_plain(d->stats.inactive_split, t, -1);
    gca__fc_stat_plain(d->stats.inactive_split_bytes, t, -(int64_t)b->size);
    gca__fc_stat_rise(d->stats.allocation, t, 1);
    gca__fc_stat_rise(d->stats.allocated_bytes, t, (int64_t)b->size);
    gca__fc_stat_rise(d->stats.requested_bytes, t, (int64_t)requested);
    b->oversize = false;
  } else {
    rb_split_stat(d, b, -1);
    gca__stat_block_alloc(d, b, t, false);
  }
  gca__pf_note(d, b);
  return b;
}

void gca__rb_flush_stream(gca__devalloc_t *d, gca_stream_t stream) {
  unsigned g = gca__rb_group(stream);
  if (d->rb != NULL && d->rb->nonempty[g] != 0 && d->rb->stream[g] == stream)
    rb_flush_group(d, g);
}

void gca__rb_flush(gca__devalloc_t *d) {
  for (unsigned g = 0; g < GCA__RB_GROUPS && d->rb_count != 0; g++)
    if (d->rb->nonempty[g] != 0)
      rb_flush_group(d, g);
}

void gca__flush_caches(gca__devalloc_t *d) {
  gca__fcache_flush(d);
  if (d->rb_count != 0)
    gca__rb_flush(d);
}

void gca__caches_update(gca__devalloc_t *d) {
  d->pf_epoch++; /* Note [Free facts] */
  gca__fcache_update(d);
  if (!gca__rb_allowed(d) && d->rb_count != 0)
    gca__rb_flush(d);
  if (gca__rb_allowed(d) && d->rb == NULL) {
    /* the table, once: without it (host memory) frees take the tree's path
     * until the next change of setting tries again */
    d->rb = GCA_FAILPOINT("recycle_bins") ? NULL : calloc(1, sizeof(*d->rb));
    if (d->rb == NULL)
      GCA_LOG_WARN("device %d: host out of memory for the recycle bins; frees take the tree's "
                   "path",
                   d->device);
  }
}

#define BROKEN(...) gca__error(GCA_ERR_INTERNAL, "allocator_check: " __VA_ARGS__)

gca_status_t gca__rb_check(const gca__devalloc_t *d, size_t nbinned) {
  const gca__rbins_t *rb = d->rb;
  size_t total = 0;
  if (rb == NULL)
    return nbinned == 0 && d->rb_count == 0
               ? GCA_OK
               : BROKEN("%zu binned blocks (count %zu) and no recycle bins", nbinned, d->rb_count);
  for (unsigned g = 0; g < GCA__RB_GROUPS; g++) {
    for (unsigned c = 0; c < GCA__RB_CLASSES; c++) {
      size_t n = 0;
      for (const gca__block_t *b = rb->head[g][c]; b != NULL; b = b->left) {
        if (!b->binned || b->size != (size_t)(c + 1) * GCA__MIN_BLOCK_SIZE ||
            b->stream != rb->stream[g] || gca__rb_group(b->stream) != g)
          return BROKEN("block 0x%" PRIx64 " (%zu bytes) in the recycle bin of %zu bytes of "
                        "stream group %u, where it does not belong",
                        b->addr, b->size, (size_t)(c + 1) * GCA__MIN_BLOCK_SIZE, g);
        if (++n > GCA__RB_BIN_MAX)
          return BROKEN("a recycle bin holds more than %d blocks", GCA__RB_BIN_MAX);
      }
      if (n != rb->n[g][c] || (n != 0) != ((rb->nonempty[g] >> c) & 1))
        return BROKEN("recycle bin of %zu bytes, stream group %u: %zu blocks, count says %u",
                      (size_t)(c + 1) * GCA__MIN_BLOCK_SIZE, g, n, (unsigned)rb->n[g][c]);
      total += n;
    }
  }
  if (total != d->rb_count || total != nbinned)
    return BROKEN("recycle bins hold %zu blocks; the count says %zu, the segments hold %zu binned",
                  total, d->rb_count, nbinned);
  return GCA_OK;
}

gca_status_t gca__pf_check(const gca__devalloc_t *d) {
  for (uint32_t i = 0; i < d->ptrs.cap; i++) {
    const gca__ptrslot_t *e = &d->ptrs.slots[i];
    if (e->key != 0 && e->val != NULL && gca__pf_hold(d, e) &&
        (e->facts != gca__pf_of(d, e->val) || e->stream != e->val->stream))
      return BROKEN("the pointer map's facts of block 0x%" PRIx64 " (%#x) say what its record "
                    "does not (%#x)",
                    e->key, e->facts, gca__pf_of(d, e->val));
  }
  return GCA_OK;
}

void gca__rb_destroy(gca__devalloc_t *d) {
  free(d->rb);
  d->rb = NULL;
  d->rb_count = 0;
}
