/* SPDX-License-Identifier: Apache-2.0 */
/* fcache.c - the free cache: a plain free may wait, uncoalesced and out of
 * the free tree, in the slot of its (stream, pool) for the next request of
 * its size there, which takes it back when PyTorch's best fit would have
 * chosen it too; a miss evicts the slot, and every path that releases memory
 * flushes them all, back into the tree. fcache.h holds the hit and put paths
 * inline, for the entry points of allocator.c.
 *
 * Note [Free cache]. The cached alloc/free pair of PyTorch's rules splits a
 * free block on every malloc and merges it back on every free: with the tree
 * updates, the pointer map and the statistics that is several hundred
 * instructions, where glibc's malloc+free of a small size is a few dozen. So a
 * free may instead leave the block in a slot, one per (stream, default pool)
 * (hashed: 32 stream hashes, a newer stream evicting an older one's block),
 * without coalescing it, and a later malloc of exactly that rounded size on
 * that stream and pool takes it back: no tree, no split, no merge, and the
 * block never left the pointer map. Only plain frees are cached: the block has
 * no recorded streams, belongs to a default pool, no capture is under way,
 * caching is on, garbage collection is off, and the free_cache key is True
 * (its default).
 *
 * The cache never changes placement (Note [Exact hits]): a hit happens only
 * when PyTorch's best fit would return that very block, and anything else
 * searches the free tree with the slot's block merged back in first. So
 * free_cache:True and free_cache:False place every block alike, and reserved
 * memory, peaks and the layout are the same on every trace; the cache only
 * saves work.
 *
 * What stays exactly as without the cache:
 * - Placement, hence memory use: a miss evicts its (stream, pool)'s slot
 *   before it searches (blocks of other streams or the other pool are never
 *   found by that search, and never share a segment with its blocks), and
 *   every release path (empty_cache, out of memory, garbage collection,
 *   turning caching off, release batches) flushes every slot first.
 * - Statistics, peaks included, at every moment. A cached block counts as
 *   free, and inactive_split counts it as if it had been merged with its free
 *   neighbours (gca__fc_run_delta). That run cannot change while the block is
 *   cached: a segment's blocks share one slot, so no other block of it is
 *   cached; no block of a thread cache's domain is within two places of it
 *   (gca__fc_fits checks while thread caches are on, and a block enters a
 *   domain only with no held block near, Note [Thread caches]); and anything
 *   about to touch the run takes the block out of the cache first
 *   (gca__fcache_evict_near, called before a pending or uncached free
 *   completes beside it; a free beside a cached block is not cached).
 * - What snapshots show: the walk flushes first.
 * - Error reports: a cached pointer is not live (double free, record_stream,
 *   pointer_info, IPC export say so).
 *
 * Note [Exact hits]: PyTorch's best fit for (stream s, rounded size r) is the
 * lower bound of (s, r, 0) among the free blocks merged as its frees leave
 * them. With cached block X of (s, r) in its slot, those free blocks are the
 * tree's, except that X and its free neighbours form one run R instead. The
 * request lands at X exactly when
 *   - X's lower neighbour is not free (else R starts below X; such a block is
 *     not cached at all),
 *   - R is the lower bound: no tree block other than X's free upper
 *     neighbour N has a key from (s, r, 0) up to R's (s, r + |N|, X) (one
 *     lower bound, and the next block when that is N),
 *   - R passes the fit rules (max_split_size, max_non_split_rounding), and
 *   - when N exists, R is split (PyTorch's should_split), leaving N free as
 *     it is now.
 * Then the layout after the hit is the one PyTorch's free and malloc leave,
 * block for block. (Once thread caches are engaged, their blocks are
 * allocated for the tree, so "PyTorch's best fit" is the one over the tree
 * as it is: the free cache still hits only where the tree's best fit would
 * return its block; the thread caches' own hits are theirs, Note [Thread
 * caches].) The answer depends only on the (s, pool) tree and X's
 * neighbours, so it is kept in the block (fc_exact) for the layout of its
 * epoch (Note [Free cache epochs]): a put whose epoch has not moved keeps it,
 * and the alloc, free, alloc, free pattern of one size computes it once.
 *
 * Note [Free cache epochs]: a free into the cache must know that no cached
 * block lies within two places of the block and how caching it changes
 * inactive_split, and a hit whether it is exact; all depend only on the
 * block's neighbours and its stream's free blocks. d->epoch advances on every
 * change of block state except the cache's own hit (a hit turns a cached block
 * into an allocated one in the same place, and no other block of its segment
 * is cached, so it changes no fact of any other block): each time the lock is
 * taken by gca__dev_lock, at the start of the locked malloc and free paths,
 * and by each put into the cache and each eviction from it. A put records the
 * new epoch in the block; when the same block comes back to be freed and the
 * epoch has not moved (the pattern alloc, free, alloc, free of one size), the
 * facts it stored still hold and neither the neighbours nor the tree are
 * read. The invariant walker recomputes them for every block whose epoch is
 * current.
 *
 * Note [Free cache waste]: a put that is evicted unused (a miss of its
 * (stream, pool), another stream's put into the slot, a free beside it, a
 * release) costs more than the plain free it replaced: the pair of the
 * alternating 4 KiB / 12 KiB pattern, where every put is evicted by the next
 * request, paid about a tenth more than without the cache. A hit saves about
 * eight times what a wasted put costs, so a device adds one to fc_waste for
 * each wasted put and takes GCA__FC_HIT_PAYS off for each hit; at
 * GCA__FC_WASTE_OFF (hits below about one put in nine) it caches only one
 * free in GCA__FC_PROBE, a hit of which turns it back on, and the other frees
 * take the plain path (free_plain: a test and a count more than
 * free_cache:False, and none of its test of the cache). One count per device,
 * not per slot: the free path then needs no slot to decide. A miss of a
 * wasteful device also evicts the other slots' blocks (streams gone idle
 * leave theirs behind), so that its mallocs find nothing cached and skip the
 * cache altogether, as without it.
 */
#include <string.h>

#include "fcache.h"
#include "tcache.h"

/* Returns the cached block b, taken out of its slot, to the free tree: out of
 * the pointer map, merged with its free neighbours. Statistics already count
 * it as merged. An eviction is a wasted put (Note [Free cache waste]). */
static void fc_evict(gca__devalloc_t *d, gca__block_t *b) {
  gca__block_t **slot = gca__fc_slot(d, b->stream, b->pool);
  int64_t blocks, bytes;
  GCA_ASSERT(*slot == b);
  d->epoch++; /* a change of block state (Note [Free cache epochs]) */
  *slot = NULL;
  if (d->fc_waste < GCA__FC_WASTE_OFF && ++d->fc_waste == GCA__FC_WASTE_OFF)
    d->fc_skips = GCA__FC_PROBE; /* off: the next probe in GCA__FC_PROBE frees */
  d->fc_count--;
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

bool gca__fc_exact_now(const gca__devalloc_t *d, const gca__block_t *b) {
  const gca__pool_t *pool = b->pool;
  size_t r = b->size;
  const gca__block_t *n = b->next != NULL && b->next->in_tree ? b->next : NULL;
  size_t run = r + (n != NULL ? n->size : 0);
  if (b->prev != NULL && b->prev->in_tree)
    return false; /* R starts below b (such a block is not cached) */
  if (n != NULL && (pool->no_split || !gca__alloc_should_split(
                                          &d->cfg, pool->is_small || b->seg->expandable, run, r)))
    return false; /* R would be taken whole */
  if (!gca__alloc_block_fits(&d->cfg, run, r))
    return false; /* R would be passed over for a new segment */
  const gca__block_t *l = gca__tree_lower_bound(pool, b->stream, r);
  if (l != NULL && l == n)
    l = gca__tree_next(pool, n);
  return l == NULL || l->stream != b->stream || l->size > run ||
         (l->size == run && l->addr > b->addr);
}

bool gca__fc_exact_slow(const gca__devalloc_t *d, gca__block_t *b) {
  bool exact = gca__fc_exact_now(d, b);
  b->fc_exact = exact ? GCA__FC_EXACT_YES : GCA__FC_EXACT_NO;
  b->fc_gen = b->pool->gen;
  return exact;
}

void gca__fcache_evict_near(gca__devalloc_t *d, gca__block_t *b) {
  /* both are found first: when b is in the tree, the first eviction merges b away */
  gca__block_t *below = gca__fc_cached_below(b), *above = gca__fc_cached_above(b);
  if (below != NULL)
    evict_held(d, below);
  if (above != NULL)
    evict_held(d, above);
}

void gca__fcache_evict_slot(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream) {
  gca__block_t *b = *gca__fc_slot(d, stream, pool);
  if (b != NULL && b->stream == stream)
    fc_evict(d, b);
  /* a wasteful device keeps nothing: every malloc then skips the cache */
  if (GCA_UNLIKELY(gca__fc_wasteful(d)) && d->fc_count != 0)
    gca__fcache_flush(d);
}

void gca__fcache_flush(gca__devalloc_t *d) {
  for (size_t i = 0; i < GCA__FC_SLOTS && d->fc_count != 0; i++)
    if (d->fc_slots[i] != NULL)
      fc_evict(d, d->fc_slots[i]);
}

void gca__fcache_update(gca__devalloc_t *d) {
  d->fc_on = d->cfg.free_cache && d->caching && !gca__gc_enabled(d); /* GC needs block ages */
  if (!d->fc_on)
    gca__fcache_flush(d);
  gca__tc_update(d, true);
}

bool gca__fcache_put_locked(gca__devalloc_t *d, gca__block_t *b) {
  if (GCA_UNLIKELY(gca__fc_wasteful(d)) && !gca__fc_probe(d))
    return false;
  gca__block_t **slot = gca__fc_slot(d, b->stream, b->pool);
  if (*slot != NULL) {
    bool near = gca__fc_near(b);
    fc_evict(d, *slot); /* another stream's, or a block this free lands beside */
    if (near)
      return false; /* b now has a free neighbour that was cached: merge as PyTorch does */
  }
  if (!gca__fc_fits(d, slot, b))
    return false;
  gca_devptr_t addr = b->addr;
  uint64_t requested = b->requested;
  gca__fc_put(d, slot, b, false);
  gca__history_event(GCA_HA_FREE_REQUESTED, d->device, addr, requested, b->stream);
  gca__history_event(GCA_HA_FREE_COMPLETED, d->device, addr, requested, b->stream);
  return true;
}

/* Note [Lazy puts]. A same-size alloc+free pair served by the free cache
 * changes ten statistics twice (allocation, allocated_bytes, requested_bytes,
 * inactive_split and its bytes, each for its pool and for all, with their
 * peaks), about a third of the pair. Yet a put followed by the take of the
 * same block leaves every current as it was but requested_bytes. So a plain
 * put (no thread cache counts headroom) records what it owes the statistics
 * in d->fc_lazy instead of applying it, and sets now the peaks its rise in
 * inactive_split would set (a put can raise it: a block freed between two
 * live ones adds an inactive split block). The take of that block cancels
 * the record: it changes requested bytes (with their peaks) at once, when
 * the two requests differ, and adds one to the record's count of pairs, whose
 * allocations and frees (counters that only grow) are counted at the next
 * settle. Anything else settles the record first, in the order the
 * operations happened, so every peak stays exact: the device lock
 * (gca__dev_lock), the walker, the free cache's other put or take, and the
 * continuations of the fast entry points that took the lock by trylock
 * (dev_malloc_locked, the free paths). At most one put is owed at a time.
 *
 * A streak of pairs of one block goes further. The take leaves the block as
 * the record's `hot` one; when its free comes with the block's epoch still
 * current (no put, eviction or locked path since: Note [Free cache epochs]),
 * the record still describes the block, its slot and its facts, so the free
 * puts it back owed again (gca__fc_reput) with only the requested bytes
 * renewed: no pointer map lookup, slot hash or neighbour read. Any put clears
 * `hot`. The one-thread 512 B pair fell from about 360 to 260 instructions. */
/* Note [Owed bin statistics]: the bins' leaf takes and puts counted in,
 * as their eager updates would have left d->stats (peaks included: no rise
 * passed one). */
static void rb_owe_settle(gca__devalloc_t *d) {
  struct {
    gca_stat_t *s;
    int64_t up, down;
  } q[] = {{d->stats.allocation, d->rb_owe.tn, d->rb_owe.pn},
           {d->stats.allocated_bytes, d->rb_owe.tb, d->rb_owe.pb},
           {d->stats.requested_bytes, d->rb_owe.tr, d->rb_owe.pr},
           {d->stats.inactive_split, d->rb_owe.pn, d->rb_owe.tn},
           {d->stats.inactive_split_bytes, d->rb_owe.pb, d->rb_owe.tb}};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(q); i++) {
    /* all's allocated and freed are summed when read (Note [Statistics]) */
    q[i].s[GCA_STAT_SMALL].current += q[i].up - q[i].down;
    q[i].s[GCA_STAT_ALL].current += q[i].up - q[i].down;
    q[i].s[GCA_STAT_SMALL].allocated += q[i].up;
    q[i].s[GCA_STAT_SMALL].freed += q[i].down;
  }
  memset(&d->rb_owe, 0, sizeof(d->rb_owe));
}

void gca__fc_settle(gca__devalloc_t *d) {
  if (d->rb_owe.on)
    rb_owe_settle(d); /* never beside an owed put (the bins' leaves wait for its settle) */
  int t = d->fc_lazy.t;
  int64_t k = d->fc_lazy.pairs;
  if (k != 0) { /* one allocation and one free of each, k times */
    int64_t blocks = d->fc_lazy.blocks < 0 ? -d->fc_lazy.blocks : d->fc_lazy.blocks;
    int64_t bytes = d->fc_lazy.bytes < 0 ? -d->fc_lazy.bytes : d->fc_lazy.bytes;
    struct {
      gca_stat_t *s;
      int64_t n;
    } both[] = {{&d->stats.allocation[t], k},
                {&d->stats.allocated_bytes[t], k * d->fc_lazy.size},
                {&d->stats.inactive_split[t], k * blocks},
                {&d->stats.inactive_split_bytes[t], k * bytes},
                {&d->stats.oversize_allocations, d->fc_lazy.oversize ? k : 0}};
    for (size_t i = 0; i < GCA_ARRAY_SIZE(both); i++) {
      both[i].s->allocated += both[i].n;
      both[i].s->freed += both[i].n;
    }
    d->stats.requested_bytes[t].allocated += d->fc_lazy.req_in;
    d->stats.requested_bytes[t].freed += d->fc_lazy.req_out;
    d->fc_lazy.pairs = d->fc_lazy.req_in = d->fc_lazy.req_out = 0;
  }
  if (d->fc_lazy.b == NULL)
    return;
  d->fc_lazy.b = NULL;
  gca__stat_dec_t(d, d->stats.allocation, t, 1);
  gca__stat_dec_t(d, d->stats.allocated_bytes, t, d->fc_lazy.size);
  if (d->fc_lazy.oversize)
    gca__stat_add(d, &d->stats.oversize_allocations, -1);
  gca__stat_add_t(d, d->stats.inactive_split, t, d->fc_lazy.blocks);
  gca__stat_add_t(d, d->stats.inactive_split_bytes, t, d->fc_lazy.bytes);
  gca__stat_dec_t(d, d->stats.requested_bytes, t, d->fc_lazy.requested);
}

void gca__fc_gates_shut(void) {
  for (int i = 0; i < GCA__MAX_DEVICES; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d != NULL) {
      gca__mutex_lock(&d->lock);
      gca__dev_let_go(d); /* the gate reads the recorders' word (Note [Leaf gate]) */
    }
  }
}
