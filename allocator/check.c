/* SPDX-License-Identifier: Apache-2.0 */
/* check.c - the invariant walker and the read-only walk over segments.
 *
 * The walker recomputes, from the segments and their blocks alone, everything
 * the allocator keeps incrementally (free-tree membership, the pointer map,
 * every current statistic) and compares; any difference is a broken
 * invariant, reported as GCA_ERR_INTERNAL naming the first one found. Tests
 * run it after every step, and debug builds (-Ddebug_checks=true) after every
 * mutation.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "expandable.h"
#include "fcache.h"
#include "introspect.h"
#include "recycle.h"
#include "tcache.h"

typedef struct sums {
  int64_t allocation, allocated_bytes, active, active_bytes, inactive_split, inactive_split_bytes,
      requested_bytes, segment, reserved_bytes;
} sums_t;

#define BROKEN(...) gca__error(GCA_ERR_INTERNAL, "allocator_check: " __VA_ARGS__)

/* Free and merged in the statistics' sense: in the tree, in the free cache,
 * or cached in a thread cache (Note [Thread caches]); a binned block is free
 * but a run of its own (Note [Recycle bins]), as is a thread cache's block
 * that counts so (Note [Thread cache runs]). */
static inline bool free_or_cached(const gca__block_t *b) {
  return b->in_tree || b->cached || (b->tc != NULL && !b->tc_apart && gca__tc_cached(b));
}

/* Whether the segment has more than one block once every free run is merged
 * (Note [Free cache]: statistics count cached blocks as merged). */
static bool logically_split(const gca__segment_t *s) {
  for (const gca__block_t *b = s->head; b != NULL; b = b->next)
    if (!free_or_cached(b))
      return s->head->next != NULL;
  return false;
}

static gca_status_t check_cached(gca__devalloc_t *d, const gca__pool_t *p, const gca__block_t *b) {
  if (gca__ptrmap_find(&d->ptrs, b->addr) != b)
    return BROKEN("block 0x%" PRIx64 ": cached but not in the pointer map", b->addr);
  if (b->allocated || b->in_tree || b->event_count != 0 || b->requested != 0 || b->nuses != 0 ||
      b->unmapped || p->owner != NULL)
    return BROKEN("block 0x%" PRIx64 ": cached in a state that may not be cached", b->addr);
  if (gca__fc_near(b))
    return BROKEN("block 0x%" PRIx64 ": another cached block shares its free run", b->addr);
  if (b->prev != NULL && b->prev->in_tree)
    return BROKEN("block 0x%" PRIx64 ": cached above a free block (Note [Exact hits])", b->addr);
  return GCA_OK;
}

static gca_status_t check_binned(gca__devalloc_t *d, const gca__pool_t *p, const gca__block_t *b) {
  if (gca__ptrmap_find(&d->ptrs, b->addr) != b)
    return BROKEN("block 0x%" PRIx64 ": binned but not in the pointer map", b->addr);
  if (b->allocated || b->in_tree || b->cached || b->tc != NULL || b->event_count != 0 ||
      b->requested != 0 || b->nuses != 0 || b->uses != NULL || b->releasing || p != &d->small ||
      b->seg->expandable || b->size > GCA__RB_MAX_SIZE)
    return BROKEN("block 0x%" PRIx64 ": binned in a state that may not be binned", b->addr);
  return GCA_OK;
}

/* A cached block, or an allocated one whose epoch is current (Note [Free
 * cache epochs]): no cached block near it, and the inactive_split change it
 * stored is the one its neighbours give now. */
static gca_status_t check_fc_facts(const gca__block_t *b) {
  int64_t blocks, bytes;
  if (b->allocated && (gca__fc_near(b)))
    return BROKEN("block 0x%" PRIx64 ": its epoch is current but a cached block is near", b->addr);
  gca__fc_run_delta(b, &blocks, &bytes);
  if (blocks != b->fc_blocks || bytes != b->fc_bytes)
    return BROKEN("block 0x%" PRIx64 ": free cache facts (%d, %" PRId64
                  "), neighbours give (%" PRId64 ", %" PRId64 ")",
                  b->addr, b->fc_blocks, b->fc_bytes, blocks, bytes);
  return GCA_OK;
}

/* A block of a thread cache's domain (Note [Thread caches]): allocated for
 * the structures, in the pointer map and its cache's table, alone in its
 * free run, and the facts it was cached with still hold. */
static gca_status_t check_domain(gca__devalloc_t *d, const gca__pool_t *p, const gca__block_t *b) {
  if (!b->allocated || b->in_tree || b->cached || b->event_count != 0 || b->nuses != 0 ||
      b->unmapped || b->releasing || b->seg->expandable || p->owner != NULL || b->oversize ||
      b->size > GCA__TC_MAX_SIZE)
    return BROKEN("block 0x%" PRIx64 ": in a thread cache in a state that may not be", b->addr);
  if (gca__ptrmap_find(&d->ptrs, b->addr) != b)
    return BROKEN("block 0x%" PRIx64 ": in a thread cache but not in the pointer map", b->addr);
  int slot = gca__tc_find(b->tc, b->addr);
  if (b->tc->d != d || slot < 0 || b->tc->vals[slot] != b)
    return BROKEN("block 0x%" PRIx64 ": not in the table of its thread cache", b->addr);
  if (gca__tc_cached(b) != (b->tc->req[slot] == 0)) /* the fast put's test of a double free */
    return BROKEN("block 0x%" PRIx64 ": %s in a thread cache with a requested size of %zu", b->addr,
                  gca__tc_cached(b) ? "cached" : "handed out", b->tc->req[slot]);
  if (!b->tc_apart && gca__fc_near(b))
    return BROKEN("block 0x%" PRIx64 ": in a thread cache with another held block in its run",
                  b->addr);
  int64_t blocks, bytes;
  if (b->tc_apart)
    gca__run_alone(b, &blocks, &bytes);
  else
    gca__fc_run_delta(b, &blocks, &bytes);
  if (blocks != b->fc_blocks || bytes != b->fc_bytes)
    return BROKEN("block 0x%" PRIx64 ": thread cache facts (%d, %" PRId64
                  "), neighbours give (%" PRId64 ", %" PRId64 ")",
                  b->addr, b->fc_blocks, b->fc_bytes, blocks, bytes);
  return GCA_OK;
}

/* A block, cached or allocated, that knows whether a hit on it is exact
 * while its pool's tree has not changed: what its neighbours and the tree
 * say now (Note [Exact hits]); an allocated block whose lower neighbour is
 * cached is not asked (it is not cached before that one is evicted). */
static gca_status_t check_fc_exact(const gca__devalloc_t *d, const gca__block_t *b) {
  if (b->fc_exact == GCA__FC_EXACT_UNKNOWN || b->fc_gen != b->pool->gen ||
      (!b->cached && b->prev != NULL && b->prev->cached))
    return GCA_OK;
  if ((b->fc_exact == GCA__FC_EXACT_YES) != gca__fc_exact_now(d, b))
    return BROKEN("block 0x%" PRIx64 ": free cache says a hit %s exact, the tree says otherwise",
                  b->addr, b->fc_exact == GCA__FC_EXACT_YES ? "is" : "is not");
  return GCA_OK;
}

static gca_status_t check_pool(gca__devalloc_t *d, gca__pool_t *p, sums_t *sum,
                               int64_t *oversize_alloc, int64_t *oversize_seg, size_t *live,
                               size_t *ncached, size_t *nbinned, size_t *ndomain,
                               size_t *ntcached) {
  size_t nfree = 0, nseg = 0;
  long tree_count = gca__tree_validate(p);
  if (tree_count < 0)
    return BROKEN("device %d %s pool: free tree out of order or off its heap", d->device,
                  p->is_small ? "small" : "large");
  if ((size_t)tree_count != p->nfree)
    return BROKEN("device %d %s pool: tree holds %ld blocks, count says %zu", d->device,
                  p->is_small ? "small" : "large", tree_count, p->nfree);
  for (gca__segment_t *s = p->segments; s != NULL; s = s->next) {
    nseg++;
    if (s->pool != p || (s->next && s->next->prev != s) || (!s->prev && p->segments != s))
      return BROKEN("segment 0x%" PRIx64 ": bad pool or list links", s->base);
    if (s->head == NULL || s->head->prev != NULL || s->head->addr != s->base)
      return BROKEN("segment 0x%" PRIx64 ": head block does not start it", s->base);
    size_t extent = s->expandable ? s->reserved_size : s->size;
    /* either end may lie in a granule the map holds as shared (GCA__OWNER_ANY:
     * another device's segment touched it, and the map keeps no list), the
     * other in one of this device's alone */
    int first = gca__owner_device(s->base), last = gca__owner_device(s->base + extent - 1);
    if ((first != d->device && first != GCA__OWNER_ANY) ||
        (last != d->device && last != GCA__OWNER_ANY))
      return BROKEN("segment 0x%" PRIx64 ": the address map says device %d at its start and %d "
                    "at its end, not %d",
                    s->base, first, last, d->device);
    if (!s->expandable)
      sum->segment++; /* as PyTorch, the segment count leaves expandable segments out */
    if (!s->suspended)
      sum->reserved_bytes += (int64_t)s->size;
    if (s->oversize)
      (*oversize_seg)++;
    bool split = logically_split(s);
    gca_devptr_t at = s->base;
    for (gca__block_t *b = s->head; b != NULL; b = b->next) {
      (*live)++;
      if (b->addr != at)
        return BROKEN("segment 0x%" PRIx64 ": block at 0x%" PRIx64 " should start at 0x%" PRIx64,
                      s->base, b->addr, at);
      if (b->size == 0 || b->size % GCA__MIN_BLOCK_SIZE != 0)
        return BROKEN("block 0x%" PRIx64 ": size %zu is not a positive multiple of %zu", b->addr,
                      b->size, GCA__MIN_BLOCK_SIZE);
      if (b->seg != s || b->pool != p || b->stream != s->stream)
        return BROKEN("block 0x%" PRIx64 ": segment, pool or stream differ from its segment's",
                      b->addr);
      if (b->next && b->next->prev != b)
        return BROKEN("block 0x%" PRIx64 ": next block's prev link is wrong", b->addr);
      at += b->size;
      if (b->unmapped) {
        if (!s->expandable)
          return BROKEN("block 0x%" PRIx64 ": unmapped in a classic segment", b->addr);
        continue; /* gca__expand_check() covers it */
      }
      if (b->cached) {
        GCA_CHECK(check_cached(d, p, b));
        (*ncached)++;
      }
      if (b->binned) {
        GCA_CHECK(check_binned(d, p, b));
        (*nbinned)++;
      }
      bool tfree = b->tc != NULL && gca__tc_cached(b); /* allocated, free for the statistics */
      bool tfree_alone = tfree && b->tc_apart;         /* and a run of its own */
      size_t requested = b->tc != NULL ? gca__tc_requested(b) : b->requested;
      if (b->tc != NULL) {
        GCA_CHECK(check_domain(d, p, b));
        (*ndomain)++;
        *ntcached += tfree;
      }
      if (b->cached || (b->allocated && b->fc_epoch == d->epoch))
        GCA_CHECK(check_fc_facts(b));
      if (b->cached || b->allocated)
        GCA_CHECK(check_fc_exact(d, b));
      if (b->releasing && (b->allocated || b->event_count != 0 || b->cached || b->in_tree))
        return BROKEN("block 0x%" PRIx64 ": releasing but not a free block out of the tree",
                      b->addr);
      bool is_free =
          !b->allocated && b->event_count == 0 && !b->cached && !b->binned && !b->releasing;
      if (b->in_tree != is_free)
        return BROKEN("block 0x%" PRIx64 ": %s but %sin the free tree", b->addr,
                      is_free ? "free" : "in use", b->in_tree ? "" : "not ");
      if (is_free && !gca__tree_contains(p, b))
        return BROKEN("block 0x%" PRIx64 ": marked in the tree but not reachable by its key",
                      b->addr);
      if (b->in_tree && b->uses != NULL)
        return BROKEN("block 0x%" PRIx64 ": in the free tree with a uses array", b->addr);
      if ((b->uses == NULL) != (b->cap_uses == 0) || b->nuses > b->cap_uses)
        return BROKEN("block 0x%" PRIx64 ": %u of %u uses in the array at %p", b->addr, b->nuses,
                      b->cap_uses, (void *)b->uses);
      if (is_free && b->next && b->next->in_tree)
        return BROKEN("blocks 0x%" PRIx64 " and 0x%" PRIx64 ": adjacent free blocks not coalesced",
                      b->addr, b->next->addr);
      if (b->allocated) {
        if (gca__ptrmap_find(&d->ptrs, b->addr) != b)
          return BROKEN("block 0x%" PRIx64 ": allocated but not in the pointer map", b->addr);
        if (!tfree) {
          sum->allocation++;
          sum->allocated_bytes += (int64_t)b->size;
        }
        if (b->oversize)
          (*oversize_alloc)++;
      } else if (b->nuses != 0 && b->event_count == 0) { /* deferred frees keep theirs */
        return BROKEN("block 0x%" PRIx64 ": not allocated but still has recorded streams", b->addr);
      }
      if ((b->allocated && !tfree) || b->event_count > 0) {
        sum->active++;
        sum->active_bytes += (int64_t)b->size;
        sum->requested_bytes += (int64_t)requested;
      } else {
        nfree += !b->cached && !b->binned && !b->releasing && !tfree;
        if (requested != 0)
          return BROKEN("block 0x%" PRIx64 ": free with a requested size", b->addr);
        if (split) {
          /* one inactive split block per free run: a cached block and its free
           * neighbours count once (Note [Free cache]), a binned block alone
           * (Note [Recycle bins]), as does a thread cache's that counts so */
          if (b->releasing || b->binned || tfree_alone || b->prev == NULL ||
              !free_or_cached(b->prev))
            sum->inactive_split++;
          sum->inactive_split_bytes += (int64_t)b->size;
        }
      }
    }
    if (at != s->base + extent)
      return BROKEN("segment 0x%" PRIx64 ": blocks cover %" PRIu64 " of %zu bytes", s->base,
                    at - s->base, extent);
    if (s->expandable)
      GCA_CHECK(gca__expand_check(d, s));
  }
  if (nfree != p->nfree)
    return BROKEN("device %d %s pool: %zu free blocks but the tree holds %zu", d->device,
                  p->is_small ? "small" : "large", nfree, p->nfree);
  if (nseg != p->nsegments)
    return BROKEN("device %d %s pool: %zu segments listed, count says %zu", d->device,
                  p->is_small ? "small" : "large", nseg, p->nsegments);
  return GCA_OK;
}

static gca_status_t compare(int device, const char *name, int type, int64_t kept, int64_t sum) {
  static const char *types[] = {"all", "small_pool", "large_pool"};
  if (kept != sum)
    return BROKEN("device %d: stat %s.%s is %" PRId64 " but the blocks add up to %" PRId64, device,
                  name, type >= 0 ? types[type] : "", kept, sum);
  return GCA_OK;
}

/* The thread caches (Note [Thread caches]): bins, tables and counts agree
 * with the blocks that name them; `ndomain` and `ntcached` are what the
 * segments hold. Every cache is locked and folded. */
static gca_status_t check_tcaches(gca__devalloc_t *d, size_t ndomain, size_t ntcached) {
  size_t dom_sum = 0, cached_sum = 0, ntcs = 0;
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next, ntcs++) {
    size_t n = 0, bytes = 0, dom = 0;
    if (tc->d != d || (tc->next != NULL && tc->next->prev != tc) ||
        (tc->prev == NULL) != (d->tcs == tc))
      return BROKEN("device %d: a thread cache with a bad device or list links", d->device);
    for (size_t i = 0; i < GCA__TC_BINS; i++) {
      const gca__tcbin_t *bin = &tc->bins[i];
      uint32_t k = 0;
      for (; k < bin->n; k++) {
        const gca__block_t *b = bin->blk[k];
        if (b->tc != tc || b->stream != bin->stream || b->size != bin->size ||
            gca__tc_bin(tc, b->stream, b->size) != bin || bin->n > GCA__TC_BIN_MAX)
          return BROKEN("device %d: thread cache bin %zu holds block 0x%" PRIx64
                        " that does not belong there",
                        d->device, i, b->addr);
        bytes += b->size;
      }
      n += k;
    }
    for (size_t i = 0; i < GCA__TC_SLOTS; i++) {
      if (tc->keys[i] == 0)
        continue;
      const gca__block_t *b = tc->vals[i];
      uint64_t bit = UINT64_C(1) << (gca__tc_slot(b->addr) >> 1);
      if (b->tc != tc || b->addr != tc->keys[i] || gca__tc_find(tc, b->addr) != (int)i ||
          !(atomic_load_explicit(&tc->filter, memory_order_relaxed) & bit))
        return BROKEN("device %d: a thread cache's table holds 0x%" PRIx64 " wrongly", d->device,
                      tc->keys[i]);
      dom++;
    }
    if (n != tc->ncached || bytes != tc->cached_bytes || dom != tc->ndomain ||
        dom > GCA__TC_DOMAIN || bytes > GCA__TC_BYTES)
      return BROKEN("device %d: a thread cache holds %zu blocks (%zu bytes) cached of %zu, counts "
                    "say %zu (%zu bytes) of %zu",
                    d->device, n, bytes, dom, tc->ncached, tc->cached_bytes, tc->ndomain);
    if (dom != 0 && !d->tc_on)
      return BROKEN("device %d: %zu blocks in a thread cache while thread caches are off",
                    d->device, dom);
    dom_sum += dom;
    cached_sum += n;
  }
  if (ntcs != d->ntcs || dom_sum != ndomain || cached_sum != ntcached || dom_sum != d->tc_held)
    return BROKEN("device %d: %zu thread caches (count says %zu) hold %zu blocks (count says "
                  "%zu), %zu cached; the segments hold %zu, %zu cached",
                  d->device, ntcs, d->ntcs, dom_sum, d->tc_held, cached_sum, ndomain, ntcached);
  return gca__tc_check_escrow(d);
}

static gca_status_t check_device(gca__devalloc_t *d) {
  sums_t sums[GCA_STAT_TYPES];
  int64_t oversize_alloc = 0, oversize_seg = 0;
  size_t live = 0, ncached = 0, nbinned = 0, ndomain = 0, ntcached = 0;
  memset(sums, 0, sizeof(sums));
  GCA_CHECK(check_pool(d, &d->small, &sums[GCA_STAT_SMALL], &oversize_alloc, &oversize_seg, &live,
                       &ncached, &nbinned, &ndomain, &ntcached));
  GCA_CHECK(check_pool(d, &d->large, &sums[GCA_STAT_LARGE], &oversize_alloc, &oversize_seg, &live,
                       &ncached, &nbinned, &ndomain, &ntcached));
  for (gca__mempool_t *m = d->mempools; m != NULL; m = m->next) {
    GCA_CHECK(check_pool(d, &m->small, &sums[GCA_STAT_SMALL], &oversize_alloc, &oversize_seg, &live,
                         &ncached, &nbinned, &ndomain, &ntcached));
    GCA_CHECK(check_pool(d, &m->large, &sums[GCA_STAT_LARGE], &oversize_alloc, &oversize_seg, &live,
                         &ncached, &nbinned, &ndomain, &ntcached));
    GCA_CHECK(gca__mempool_check_locked(d, m));
  }
  GCA_CHECK(check_tcaches(d, ndomain, ntcached));
  if (live != d->live_blocks)
    return BROKEN("device %d: %zu blocks in segments but %zu block records in use", d->device, live,
                  d->live_blocks);
  int64_t *a = (int64_t *)&sums[GCA_STAT_ALL];
  const int64_t *sm = (const int64_t *)&sums[GCA_STAT_SMALL];
  const int64_t *lg = (const int64_t *)&sums[GCA_STAT_LARGE];
  for (size_t i = 0; i < sizeof(sums_t) / sizeof(int64_t); i++)
    a[i] = sm[i] + lg[i];
  size_t in_map = d->ptrs.count;
  if ((int64_t)in_map != sums[GCA_STAT_ALL].allocation + (int64_t)(ncached + ntcached + nbinned))
    return BROKEN("device %d: pointer map holds %zu entries for %" PRId64
                  " allocated and %zu cached blocks",
                  d->device, in_map, sums[GCA_STAT_ALL].allocation, ncached + ntcached + nbinned);
  GCA_CHECK(gca__rb_check(d, nbinned));
  GCA_CHECK(gca__pf_check(d));
  size_t in_slots = 0;
  for (size_t i = 0; i < GCA__FC_SLOTS; i++) {
    const gca__block_t *b = d->fc_slots[i];
    if (b == NULL)
      continue;
    if (!b->cached || gca__fc_slot(d, b->stream, b->pool) != &d->fc_slots[i])
      return BROKEN("device %d: free cache slot %zu holds block 0x%" PRIx64
                    " that does not belong there",
                    d->device, i, b->addr);
    in_slots++;
  }
  if (in_slots != ncached || ncached != d->fc_count)
    return BROKEN("device %d: %zu cached blocks in segments, %zu in slots, count says %zu",
                  d->device, ncached, in_slots, d->fc_count);
  if (ncached != 0 && !d->fc_on)
    return BROKEN("device %d: %zu blocks cached while the free cache is off", d->device, ncached);
  if ((int64_t)d->reserved != sums[GCA_STAT_ALL].reserved_bytes)
    return BROKEN("device %d: reserved counter %zu, segments add up to %" PRId64, d->device,
                  d->reserved, sums[GCA_STAT_ALL].reserved_bytes);
  int64_t nused = 0;
  for (gca__pool_t *p = &d->small; p != NULL; p = gca__pool_next(d, p))
    for (const gca__segment_t *s = p->segments; s != NULL; s = s->next)
      for (const gca__block_t *b = s->head; b != NULL; b = b->next)
        nused += b->nuses != 0;
  if (nused != d->nused)
    return BROKEN("device %d: %" PRId64 " blocks hold recorded uses, the count says %" PRId64,
                  d->device, nused, d->nused);
  size_t pending_blocks = 0;
  for (size_t i = 0; i < d->npending; i++) {
    gca__block_t *b = d->pending[i].block;
    if (b->allocated || b->event_count == 0 || b->in_tree)
      return BROKEN("device %d: pending event for block 0x%" PRIx64 " that is not pending free",
                    d->device, b->addr);
    pending_blocks++;
  }
  for (int dev = 0; dev < GCA__MAX_DEVICES; dev++) {
    const gca__evpool_t *ep = &d->events[dev];
    size_t out = 0;
    for (size_t i = 0; i < d->npending; i++)
      out += d->pending[i].dev == dev;
    if (ep->out != out || ep->n > ep->cap)
      return BROKEN("device %d: %zu events of device %d out, %zu pending entries on it", d->device,
                    ep->out, dev, out);
  }
  gca_stats_t read;
  gca__stats_read(d, &read);
  const gca_stats_t *st = &read;
  for (int t = 0; t < GCA_STAT_TYPES; t++) {
    const sums_t *s = &sums[t];
    GCA_CHECK(compare(d->device, "allocation", t, st->allocation[t].current, s->allocation));
    GCA_CHECK(compare(d->device, "allocated_bytes", t, st->allocated_bytes[t].current,
                      s->allocated_bytes));
    GCA_CHECK(compare(d->device, "active", t, st->active[t].current, s->active));
    GCA_CHECK(compare(d->device, "active_bytes", t, st->active_bytes[t].current, s->active_bytes));
    GCA_CHECK(
        compare(d->device, "inactive_split", t, st->inactive_split[t].current, s->inactive_split));
    GCA_CHECK(compare(d->device, "inactive_split_bytes", t, st->inactive_split_bytes[t].current,
                      s->inactive_split_bytes));
    GCA_CHECK(compare(d->device, "requested_bytes", t, st->requested_bytes[t].current,
                      s->requested_bytes));
    GCA_CHECK(compare(d->device, "segment", t, st->segment[t].current, s->segment));
    GCA_CHECK(
        compare(d->device, "reserved_bytes", t, st->reserved_bytes[t].current, s->reserved_bytes));
  }
  GCA_CHECK(compare(d->device, "oversize_allocations", -1, st->oversize_allocations.current,
                    oversize_alloc));
  GCA_CHECK(
      compare(d->device, "oversize_segments", -1, st->oversize_segments.current, oversize_seg));
  return GCA_OK;
}

gca_status_t gca__devalloc_check_locked(gca__devalloc_t *d) {
  gca__fc_settled(d); /* Note [Lazy puts]: the statistics it reads are whole */
  /* the thread caches hold still and their deltas are in (Note [Thread caches]) */
  gca__tc_lock_all(d);
  gca__tc_fold_locked(d, 0);
  gca_status_t st = check_device(d);
  gca__tc_unlock_all(d);
  return st;
}

gca_status_t gca__allocator_check(void) {
  int n = gca__allocator_device_count();
  for (int i = 0; i < n; i++) {
    gca__devalloc_t *d = gca__devalloc_peek(i);
    if (d == NULL)
      continue;
    gca__mutex_lock(&d->lock); /* read only: the epoch stays (Note [Free cache epochs]) */
    gca_status_t st = gca__devalloc_check_locked(d);
    gca__dev_let_go(d);
    GCA_CHECK(st);
  }
  return GCA_OK;
}

GCA_API gca_status_t gca_allocator_check(void) {
  return gca__allocator_check();
}

static int seg_cmp(const void *a, const void *b) {
  gca_devptr_t x = (*(gca__segment_t *const *)a)->base, y = (*(gca__segment_t *const *)b)->base;
  return x < y ? -1 : x > y;
}

gca_status_t gca__allocator_walk(int device, gca_walk_fn fn, void *ctx) {
  gca__devalloc_t *d = gca__devalloc_peek(device);
  gca_status_t st = GCA_OK;
  gca__segment_t **segs = NULL;
  gca_block_info_t *blocks = NULL;
  if (d == NULL || fn == NULL)
    return GCA_OK;
  gca__dev_lock(d);
  gca__flush_caches(d); /* the layout as PyTorch's rules leave it (Note [Free cache]) */
  gca__tc_flush_all(d, false);
  gca__tc_lock_all(d); /* what they hand out holds still (Note [Thread caches]) */
  size_t nseg = 0, k = 0, maxb = 0;
  for (gca__pool_t *p = &d->small; p != NULL; p = gca__pool_next(d, p))
    nseg += p->nsegments;
  segs = malloc((nseg ? nseg : 1) * sizeof(*segs));
  if (segs == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "allocator_walk: host out of memory");
    goto out;
  }
  for (gca__pool_t *p = &d->small; p != NULL; p = gca__pool_next(d, p)) {
    for (gca__segment_t *s = p->segments; s != NULL; s = s->next) {
      size_t nb = 0;
      for (gca__block_t *b = s->head; b != NULL; b = b->next)
        nb++;
      if (nb > maxb)
        maxb = nb;
      segs[k++] = s;
    }
  }
  qsort(segs, nseg, sizeof(*segs), seg_cmp);
  blocks = malloc((maxb ? maxb : 1) * sizeof(*blocks));
  if (blocks == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "allocator_walk: host out of memory");
    goto out;
  }
  /* an expandable segment is reported as PyTorch does: one segment per
   * contiguous mapped run, total_size its mapped bytes */
  for (size_t i = 0; i < nseg; i++) {
    gca__segment_t *s = segs[i];
    for (gca__block_t *b = s->head; b != NULL;) {
      if (b->unmapped) {
        b = b->next;
        continue;
      }
      gca_segment_info_t si = {.device = device,
                               .address = b->addr,
                               .stream = s->stream,
                               .is_large = !s->pool->is_small,
                               .is_expandable = s->expandable,
                               .pool_id = {s->pool->id[0], s->pool->id[1]}};
      size_t nb = 0;
      for (; b != NULL && !b->unmapped; b = b->next, nb++) {
        gca_block_info_t *bi = &blocks[nb];
        bi->address = b->addr;
        bi->size = b->size;
        size_t requested = b->tc != NULL ? gca__tc_requested(b) : b->requested;
        bi->requested_size = requested;
        si.total_size += b->size;
        if (b->allocated) {
          bi->state = GCA_BLOCK_ACTIVE_ALLOCATED;
          si.allocated_size += b->size;
        } else if (b->event_count > 0) {
          bi->state = GCA_BLOCK_ACTIVE_PENDING_FREE;
        } else {
          bi->state = GCA_BLOCK_INACTIVE;
        }
        if (bi->state != GCA_BLOCK_INACTIVE) {
          si.active_size += b->size;
          si.requested_size += requested;
        }
      }
      fn(&si, blocks, nb, ctx);
    }
  }
out:
  gca__tc_unlock_all(d);
  gca__dev_let_go(d);
  free(blocks);
  free(segs);
  return st;
}
