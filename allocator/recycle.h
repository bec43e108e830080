/* SPDX-License-Identifier: Apache-2.0 */
/* recycle.h - the recycle bins (Note [Recycle bins], recycle.c): plain frees
 * of small blocks kept by (stream, size), uncoalesced, for the next requests
 * of their size; on by default (recycle_bins and free_cache).
 */
#ifndef GCA_RECYCLE_H
#define GCA_RECYCLE_H

#include "alloc_core.h"
#include "fcache.h"
#include "tcache.h"

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
  uint64_t fast; /* frees put from the pointer map's facts alone (a counter only) */
} gca__rbins_t;

/* The bin of a block of `size` bytes (a multiple of GCA__MIN_BLOCK_SIZE). */
static inline unsigned gca__rb_class(size_t size) {
  return (unsigned)(size / GCA__MIN_BLOCK_SIZE) - 1;
}
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
/* Whether frees of small plain blocks may enter the bins now: allowed, and
 * nothing pending, deferred or capturing on the device. */
static inline bool gca__rb_on(const gca__devalloc_t *d) {
  return gca__rb_allowed(d) && (d->npending | d->ndeferred | d->ncaptures) == 0;
}

/* Note [Free facts]: a pointer-map slot's facts, when nonzero, say that its
 * block is a live plain block a bin may take: GCA__PF_BIN, its bin's class
 * (bits 1-6) and its requested bytes (bits 16-31). */
#define GCA__PF_BIN 1u
_Static_assert(GCA__RB_MAX_SIZE <= 0xffff, "a binnable block's requested bytes fit 16 bits");
static inline uint32_t gca__pf_make(unsigned c, size_t requested) {
  return GCA__PF_BIN | c << 1 | (uint32_t)requested << 16;
}
static inline unsigned gca__pf_class(uint32_t facts) {
  return (facts >> 1) & (GCA__RB_CLASSES - 1);
}
static inline size_t gca__pf_requested(uint32_t facts) {
  return facts >> 16;
}
/* b's facts: what gca__pf_make says of a live plain block, else 0. */
static inline uint32_t gca__pf_of(const gca__devalloc_t *d, const gca__block_t *b) {
  if (b->pool != &d->small || b->size > GCA__RB_MAX_SIZE || b->seg->expandable || b->nuses != 0 ||
      b->tc != NULL || !b->allocated || b->cached || b->binned || b->oversize ||
      gca__block_whole(b))
    return 0;
  return gca__pf_make(gca__rb_class(b->size), b->requested);
}
/* Writes live block b's facts into its slot (d->lock held): what every
 * allocation of a block a bin may take does (a thread cache's take does
 * not: its blocks have none). Nothing while the bins are not allowed: the
 * change of setting that allows them bumps pf_epoch. */
static inline void gca__pf_note(gca__devalloc_t *d, const gca__block_t *b) {
  gca__ptrslot_t *e;
  if (b->pool == &d->small && b->size <= GCA__RB_MAX_SIZE && gca__rb_allowed(d) &&
      (e = gca__ptrmap_slot(&d->ptrs, b->addr)) != NULL) {
    e->facts = gca__pf_of(d, b);
    e->stream = b->stream;
    e->epoch = d->pf_epoch;
  }
}
/* Whether slot e's facts hold now. */
static inline bool gca__pf_hold(const gca__devalloc_t *d, const gca__ptrslot_t *e) {
  return e->facts != 0 && e->epoch == d->pf_epoch;
}
/* The free of the block of slot e, whose facts hold (d->lock held, nothing
 * pending), into its bin from the facts alone: its record is written, not
 * read, so a free misses once, in the pointer map. False (nothing changed)
 * when the bins take no free of it now; the caller then reads the record. */
bool gca__rb_put_fast(gca__devalloc_t *d, gca__ptrslot_t *e);

/* The bins of group g and the stack of class c in them, when they take the
 * free of slot e's block (its facts hold) now: the group is its stream's,
 * the stack not full, and it is not the block the last request got (whose
 * free tries the free cache first unless that wastes its puts). */
static inline __attribute__((always_inline)) bool
gca__rb_takes(const gca__devalloc_t *d, const gca__ptrslot_t *e, unsigned *g, unsigned *c) {
  const gca__rbins_t *rb = d->rb;
  *g = gca__rb_group(e->stream);
  *c = gca__pf_class(e->facts);
  return rb->stream[*g] == e->stream && rb->n[*g][*c] < GCA__RB_BIN_MAX &&
         (e->val != rb->last || gca__fc_wasteful(d));
}
/* Note [Owed bin statistics]: the bins' leaves (with no thread cache
 * counting) leave d->stats as it is and count what they owe it in
 * d->rb_owe, which anything else settles first (gca__fc_settled), as it
 * settles an owed put (Note [Lazy puts]). A take then adds three numbers
 * and a put three, instead of moving five statistics and their totals with
 * two peak tests each: in a churn over 10^6 live blocks, where an operation
 * waits for its pointer map slot, fewer instructions between two such waits
 * let the processor overlap them, and the statistics were a fifth of the
 * instructions. Peaks stay exact: when the first is owed, each quantity
 * that a leaf raises (allocation, allocated and requested bytes for a take;
 * inactive_split and its bytes for a put) notes how far it may rise before
 * its small or its all peak could pass, and a leaf whose rise would go
 * further leaves the operation to the full path, which settles and raises
 * the peak itself. Readers settle (gca_get_stats, snapshots, the walker). */
static inline int64_t gca__rb_owe_room(const gca_stat_t *a) {
  int64_t small = a[GCA_STAT_SMALL].peak - a[GCA_STAT_SMALL].current;
  int64_t all = a[GCA_STAT_ALL].peak - a[GCA_STAT_ALL].current;
  return small < all ? small : all;
}
static inline void gca__rb_owe_open(gca__devalloc_t *d) {
  d->rb_owe.on = true;
  d->rb_owe.room_n = gca__rb_owe_room(d->stats.allocation);
  d->rb_owe.room_b = gca__rb_owe_room(d->stats.allocated_bytes);
  d->rb_owe.room_r = gca__rb_owe_room(d->stats.requested_bytes);
  d->rb_owe.room_sn = gca__rb_owe_room(d->stats.inactive_split);
  d->rb_owe.room_sb = gca__rb_owe_room(d->stats.inactive_split_bytes);
}

/* The put of gca__rb_put_fast past its tests (settled; history is the
 * caller's). `plain`: no thread cache's headroom to count (gca__fc_stat);
 * `owe`: the statistics owed instead (Note [Owed bin statistics]). */
static inline __attribute__((always_inline)) void gca__rb_put_facts(gca__devalloc_t *d,
                                                                    gca__ptrslot_t *e, unsigned g,
                                                                    unsigned c, bool plain,
                                                                    bool owe) {
  gca__rbins_t *rb = d->rb;
  gca__block_t *b = e->val;
  int64_t size = (int64_t)(c + 1) * GCA__MIN_BLOCK_SIZE;
  int64_t requested = (int64_t)gca__pf_requested(e->facts);
  d->epoch++; /* Note [Free cache epochs] */
  e->facts = 0;
  /* gca__rb_put's updates: the facts say not oversize, not whole */
  if (owe) {
    d->rb_owe.pn++;
    d->rb_owe.pb += size;
    d->rb_owe.pr += requested;
  } else {
    gca__fc_stat(d, d->stats.allocation, GCA_STAT_SMALL, -1, plain);
    gca__fc_stat(d, d->stats.allocated_bytes, GCA_STAT_SMALL, -size, plain);
    gca__fc_stat(d, d->stats.requested_bytes, GCA_STAT_SMALL, -requested, plain);
    gca__fc_stat(d, d->stats.inactive_split, GCA_STAT_SMALL, 1, plain);
    gca__fc_stat(d, d->stats.inactive_split_bytes, GCA_STAT_SMALL, size, plain);
  }
  b->allocated = false;
  b->requested = 0;
  b->binned = true;
  b->left = rb->head[g][c];
  rb->head[g][c] = b;
  rb->n[g][c]++;
  rb->nonempty[g] |= (uint64_t)1 << c;
  d->rb_count++;
  rb->fast++;
}

/* Pops the block of bin (g, c), which holds one, made active for
 * `requested` bytes (statistics and facts are the caller's). */
static inline __attribute__((always_inline)) gca__block_t *
gca__rb_pop(gca__devalloc_t *d, unsigned g, unsigned c, size_t requested) {
  gca__rbins_t *rb = d->rb;
  gca__block_t *b = rb->head[g][c];
  d->epoch++; /* Note [Free cache epochs] */
  rb->head[g][c] = b->left;
  if (--rb->n[g][c] == 0)
    rb->nonempty[g] &= ~((uint64_t)1 << c);
  rb->hits++;
  rb->last = b;
  d->rb_count--;
  b->left = NULL;
  b->binned = false;
  b->allocated = true;
  b->requested = requested;
  return b;
}

/* Note [Leaf hits] (allocator.c): with d->lock held by the calling thread's
 * bias, the free of addr into its bin from its slot's facts as
 * gca__rb_put_fast, when nothing on the way calls a function (the bins'
 * gate open: nothing pending, no capture, no history; the free cache's put
 * settled; with thread caches on, the calling thread's cache parked and
 * their headroom leaving the peaks unpassed); false, nothing done, else.
 * Only a thread with no cache of d comes here (allocator.c's dispatch).
 * `counted` is d->tc_count, a constant where the caller inlines it. */
static inline __attribute__((always_inline)) bool
gca__rb_leaf_put(gca__devalloc_t *d, gca_devptr_t addr, bool counted) {
  gca__ptrslot_t *e;
  unsigned g, c;
  if ((d->fc_gate & GCA__GATE_RB) || d->rb == NULL || d->fc_lazy.b != NULL ||
      d->fc_lazy.pairs != 0 || (e = gca__ptrmap_slot(&d->ptrs, addr)) == NULL ||
      !gca__pf_hold(d, e) || !gca__rb_takes(d, e, &g, &c))
    return false;
  if (d->tc_on && !gca__tc_leaf_declines(d))
    return false;
  int64_t size = (int64_t)(c + 1) * GCA__MIN_BLOCK_SIZE;
  if (counted) {
    if (!(gca__fc_stat_room(d, d->stats.inactive_split, GCA_STAT_SMALL, 1) &&
          gca__fc_stat_room(d, d->stats.inactive_split_bytes, GCA_STAT_SMALL, size)))
      return false;
    gca__tc_leaf_skip(d);
    gca__rb_put_facts(d, e, g, c, true, false); /* plain: no peak is passed */
    return true;
  }
  /* Note [Owed bin statistics]: within the rises the peaks allow */
  if (!d->rb_owe.on)
    gca__rb_owe_open(d);
  if (d->rb_owe.pn + 1 - d->rb_owe.tn > d->rb_owe.room_sn ||
      d->rb_owe.pb + size - d->rb_owe.tb > d->rb_owe.room_sb)
    return false;
  if (d->tc_on)
    gca__tc_leaf_skip(d);
  gca__rb_put_facts(d, e, g, c, true, true);
  return true;
}

/* Note [Leaf hits]: with d->lock held by the calling thread's bias, the
 * block of its bin for a request of `size` bytes on `stream` as
 * gca__rb_take, when nothing on the way calls a function (the bins' gate
 * open, the plain rounding, the statistics plain: nothing settled, pending
 * or oversize, not whole, no peak passed less the thread caches' headroom);
 * else NULL, nothing done. `counted` as gca__rb_leaf_put's. */
static inline __attribute__((always_inline)) gca__block_t *
gca__rb_leaf_take(gca__devalloc_t *d, size_t size, gca_stream_t stream, bool counted) {
  gca__rbins_t *rb = d->rb;
  size_t c = gca__round_key(size); /* the bin: gca__rb_class of the rounded size */
  size_t rounded = (c + 1) * GCA__MIN_BLOCK_SIZE;
  if ((d->fc_gate & GCA__GATE_RB) || rb == NULL || c >= GCA__RB_CLASSES || d->fc_lazy.b != NULL ||
      d->fc_lazy.pairs != 0 || d->pend[GCA_STAT_ALL].current != 0)
    return NULL;
  /* with thread caches counting, the rises below within their headroom */
  if (counted &&
      !(gca__fc_stat_room(d, d->stats.allocation, GCA_STAT_SMALL, 1) &&
        gca__fc_stat_room(d, d->stats.allocated_bytes, GCA_STAT_SMALL, (int64_t)rounded) &&
        gca__fc_stat_room(d, d->stats.requested_bytes, GCA_STAT_SMALL, (int64_t)size)))
    return NULL;
  gca_stream_t key = gca__stream_key_nocall(stream);
  unsigned g = gca__rb_group(key);
  gca__block_t *b = rb->head[g][c];
  gca__ptrslot_t *e;
  if (b == NULL || rb->stream[g] != key || gca__block_whole(b) ||
      b->size >= d->cfg.max_split_size || (e = gca__ptrmap_slot(&d->ptrs, b->addr)) == NULL)
    return NULL;
  bool owe = !counted; /* Note [Owed bin statistics] */
  if (owe) {
    if (!d->rb_owe.on)
      gca__rb_owe_open(d);
    if (d->rb_owe.tn + 1 - d->rb_owe.pn > d->rb_owe.room_n ||
        d->rb_owe.tb + (int64_t)rounded - d->rb_owe.pb > d->rb_owe.room_b ||
        d->rb_owe.tr + (int64_t)size - d->rb_owe.pr > d->rb_owe.room_r)
      return NULL;
  }
  gca__rb_pop(d, g, c, size);
  b->oversize = false;
  if (owe) {
    d->rb_owe.tn++;
    d->rb_owe.tb += (int64_t)rounded;
    d->rb_owe.tr += (int64_t)size;
  } else {
    gca__fc_stat_plain(d->stats.inactive_split, GCA_STAT_SMALL, -1);
    gca__fc_stat_plain(d->stats.inactive_split_bytes, GCA_STAT_SMALL, -(int64_t)rounded);
    gca__fc_stat_rise(d->stats.allocation, GCA_STAT_SMALL, 1);
    gca__fc_stat_rise(d->stats.allocated_bytes, GCA_STAT_SMALL, (int64_t)rounded);
    gca__fc_stat_rise(d->stats.requested_bytes, GCA_STAT_SMALL, (int64_t)size);
  }
  /* its facts (gca__pf_of): a bin holds plain blocks of the default small pool */
  e->facts = gca__pf_make(c, size);
  e->stream = key;
  e->epoch = d->pf_epoch;
  return b;
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
/* Checks every fact of the pointer map that holds against its block's
 * record (the walker; Note [Free facts]). */
gca_status_t gca__pf_check(const gca__devalloc_t *d);
/* Frees the bins' table (allocator teardown; the blocks go with their segments). */
void gca__rb_destroy(gca__devalloc_t *d);

#endif
