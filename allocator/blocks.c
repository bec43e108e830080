/* SPDX-License-Identifier: Apache-2.0 */
/* blocks.c - blocks within their pool: the best fit for a request, making a
 * found block active (splitting off the remainder), and a freed block's return
 * to the free tree (merging with its free neighbours), with the statistics of
 * each step.
 *
 * The one idea: these are PyTorch's get_free_block, alloc_found_block and
 * free_block over one free tree per pool, so that the rules and the numbers
 * are PyTorch's while each step is an O(log n) tree operation.
 *
 * Note [Tree places]: a fitting block found in its pool's free tree stays there
 * until gca__block_activate; a split remainder (key: same stream, smaller
 * size, higher address) then usually takes the block's own place, and a freed
 * block merged with one free neighbour usually takes that neighbour's, each
 * without rebalancing (gca__tree_swap). Blocks from a new segment arrive
 * outside the tree.
 */
#include "alloc_core.h"
#include "history.h"

void gca__block_coalesce(gca__devalloc_t *d, gca__block_t *b, int64_t *blocks, int64_t *bytes) {
  gca__pool_t *pool = b->pool;
  int64_t net_blocks = 0, net_bytes = 0;
  gca__block_t *p = b->prev, *n = b->next;
  bool pfree = p != NULL && p->in_tree, nfree = n != NULL && n->in_tree;
  /* with exactly one free neighbour, b may take its tree place (Note [Tree places]) */
  gca__block_t *slot = pfree != nfree ? (pfree ? p : n) : NULL;
  if (GCA_UNLIKELY(b->cap_uses != 0))
    gca__block_drop_uses(d, b); /* a free block holds none (Note [Record lines]) */
  if (pfree) {
    if (p != slot)
      gca__tree_erase_of(pool, p, b->stream);
    b->addr = p->addr;
    b->size += p->size;
    b->prev = p->prev;
    if (b->prev != NULL)
      b->prev->next = b;
    else
      b->seg->head = b;
    net_blocks--;
    net_bytes -= (int64_t)p->size;
  }
  if (nfree) {
    if (n != slot)
      gca__tree_erase_of(pool, n, b->stream);
    b->size += n->size;
    b->next = n->next;
    if (b->next != NULL)
      b->next->prev = b;
    net_blocks--;
    net_bytes -= (int64_t)n->size;
  }
  b->gc_base = pool->free_calls;
  if (slot != NULL)
    gca__tree_swap(pool, slot, b);
  else
    gca__tree_insert(pool, b);
  if (pfree)
    gca__block_free_merged(d, p);
  if (nfree)
    gca__block_free_merged(d, n);
  if (!gca__block_whole(b)) {
    net_blocks++;
    net_bytes += (int64_t)b->size;
  }
  *blocks = net_blocks;
  *bytes = net_bytes;
}

void gca__block_free_complete(gca__devalloc_t *d, gca__block_t *b, bool pending) {
  gca__pool_t *pool = b->pool;
  gca__mempool_t *owner = pool->owner;
  size_t requested = b->requested;
  int64_t net_blocks, net_bytes;
  GCA_ASSERT_DEBUG((d->fc_count == 0 && d->tcs == NULL) || !gca__fc_near(b));
  gca__history_event(GCA_HA_FREE_COMPLETED, d->device, b->addr, requested, b->stream);
  b->requested = 0;
  if (pending)
    gca__pend_add(d, pool, -1, b->size);
  gca__block_coalesce(d, b, &net_blocks, &net_bytes);
  gca__stat_pool(d, d->stats.inactive_split, pool, net_blocks);
  gca__stat_pool(d, d->stats.inactive_split_bytes, pool, net_bytes);
  gca__stat_dec(d, d->stats.requested_bytes, pool, (int64_t)requested);
  if (!d->caching && gca__block_whole(b))
    d->reap = true; /* the segment goes back at the entry point's end (release.c) */
  if (GCA_UNLIKELY(b->stream == GCA__STREAM_GONE))
    d->gone_dirty = true; /* Note [Destroyed streams] */
  if (GCA_UNLIKELY(owner != NULL))
    gca__mempool_block_freed(d, owner); /* may leave the pool for the reap */
}

/* Whether a block of the free cache (not a thread cache's) shares a free
 * run with b's neighbours. */
static inline bool fc_cached_near(const gca__block_t *b) {
  const gca__block_t *below = gca__fc_cached_below(b), *above = gca__fc_cached_above(b);
  return (below != NULL && below->cached) || (above != NULL && above->cached);
}

gca__block_t *gca__pool_take_fit(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                 size_t rounded) {
  if (GCA_UNLIKELY(gca__gc_enabled(d)))
    pool->free_calls++;
  gca__block_t *b = gca__tree_lower_bound(pool, stream, rounded);
  /* Note [Free cache]: a default pool is searched only after its (stream,
   * pool)'s slot was evicted (a segment's blocks share one slot), and a
   * private pool's blocks are never cached, so no block of the free cache is
   * near b; a thread cache's may be (take_fit clears those, Note [Thread
   * caches]) */
  GCA_ASSERT_DEBUG(b == NULL || d->fc_count == 0 || !fc_cached_near(b));
  GCA_ASSERT_DEBUG(b == NULL || b->stream == stream); /* the lower bound keeps to its stream */
  if (b == NULL || !gca__alloc_block_fits(&d->cfg, b->size, rounded))
    return NULL;
  return b; /* still in the tree: gca__block_activate takes it out (Note [Tree places]) */
}

void gca__block_activate(gca__devalloc_t *d, gca__block_t *b, size_t rounded, size_t requested) {
  gca__pool_t *pool = b->pool;
  bool already_split = !gca__block_whole(b);
  bool in_tree = b->in_tree;
  if (!pool->no_split &&
      gca__alloc_should_split(&d->cfg, pool->is_small || b->seg->expandable, b->size, rounded)) {
    gca__block_t *r = gca__block_take(d);
    r->addr = b->addr + rounded;
    r->size = b->size - rounded;
    r->stream = b->stream;
    r->pool = pool;
    r->seg = b->seg;
    r->gc_base = b->gc_base; /* GC reads whole segments only; Note [Move horizons] */
    if (in_tree)
      gca__tree_swap(pool, b, r);
    else
      gca__tree_insert(pool, r);
    r->prev = b;
    r->next = b->next;
    if (r->next != NULL)
      r->next->prev = r;
    b->next = r;
    b->size = rounded;
    if (already_split) {
      gca__stat_pool(d, d->stats.inactive_split_bytes, pool, -(int64_t)rounded);
    } else {
      gca__stat_pool(d, d->stats.inactive_split_bytes, pool, (int64_t)r->size);
      gca__stat_pool(d, d->stats.inactive_split, pool, 1);
    }
  } else {
    if (in_tree)
      gca__tree_erase(pool, b);
    if (already_split) {
      gca__stat_pool(d, d->stats.inactive_split_bytes, pool, -(int64_t)b->size);
      gca__stat_pool(d, d->stats.inactive_split, pool, -1);
    }
  }
  b->allocated = true;
  b->requested = requested;
  gca__stat_block_alloc(d, b, gca__stat_type(pool), false);
}
