/* SPDX-License-Identifier: Apache-2.0 */
/* checkpoint.c - saving a private pool's block layout and restoring it
 * (DESIGN.md "Note [Checkpoints]", PyTorch's getCheckpointState /
 * setCheckpointPoolState).
 *
 * The one idea: a segment's layout is just the sequence of its block sizes
 * with a live flag each, so a restore needs no allocation calls at all. Under
 * the device lock it takes every block of a saved segment out of the pointer
 * map and the free tree, re-tiles the segment with the saved blocks, and puts
 * them back: live ones in the pointer map, free ones in the tree. Everything
 * that can fail (validation, host memory for block records, result arrays and
 * pointer-map growth) happens before the first change, so a refused restore
 * leaves the pool exactly as it was.
 *
 * Expandable segments are saved with their unmapped blocks, so the mapped
 * extent is part of the state. A restore refuses (stale) a segment that lost
 * memory mapped at the checkpoint; space mapped since is re-tiled as free and
 * then, once the state is applied, trimmed: every whole mapping lying inside
 * space the checkpoint had unmapped (or in a segment made since) is unmapped
 * by the release path of empty_cache (the segment's stream synchronized,
 * reserved_bytes, num_device_free and segment_unmap history as there). A
 * mapping that straddles the boundary stays mapped, its outside part free.
 * The trim is best effort: it runs after the all-or-nothing part, so a failed
 * unmap is a warning, leaves that mapping mapped and free (the next restore
 * tries again; the pool's release frees it), and the restore still succeeds.
 * While a capture is under way on the device the trim is skipped.
 *
 * Note [Checkpoints and stream uses]. A live block used on other streams
 * (gca_record_stream) may have work queued there when the pool is restored;
 * PyTorch's restore frees it through the normal free path, so its memory is
 * reused only after events recorded at that point. Here every block of the
 * target inherits the uses of each live block whose memory it overlaps: a
 * live target block keeps them (the same block keeps its own; its later free
 * waits for those streams), and a free one is parked as a deferred free
 * (gca__pending_park) instead of joining the tree, so it is handed out only
 * after events recorded on those streams at the restore have completed. The
 * events are recorded once the state is applied (gca__pending_flush_deferred);
 * during a capture on the device, or when recording fails (a warning), they
 * are recorded by the next malloc or free that processes pending frees, and
 * until then the memory stays parked. A parked block covers its whole target
 * block, so memory next to the used block may wait too.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_core.h"
#include "expandable.h"
#include "gca/pool.h"

typedef struct saved_block {
  size_t size;
  size_t requested; /* 0 unless allocated */
  bool allocated;
  bool unmapped; /* expandable segments: address space only */
} saved_block_t;

/* A saved segment; its blocks are blocks[first .. first + nblocks), in address
 * order, tiling [base, base + extent), no two free ones adjacent. extent is
 * the reservation of an expandable segment, else its size. */
typedef struct saved_seg {
  gca_devptr_t base;
  size_t extent;
  gca_stream_t stream;
  bool is_small;
  bool expandable;
  size_t first, nblocks;
} saved_seg_t;

struct gca_pool_state {
  uint64_t pool; /* handle of the pool it was taken from */
  int device;
  saved_seg_t *segs;
  size_t nsegs;
  saved_block_t *blocks;
  size_t nblocks;
};

GCA_API void gca_pool_state_free(gca_pool_state_t *state) {
  if (state == NULL)
    return;
  free(state->segs);
  free(state->blocks);
  free(state);
}

GCA_API void gca_pool_changes_free(gca_pool_changes_t *changes) {
  if (changes == NULL)
    return;
  free(changes->freed);
  free(changes->allocated);
  memset(changes, 0, sizeof(*changes));
}

static size_t seg_extent(const gca__segment_t *seg) {
  return seg->expandable ? seg->reserved_size : seg->size;
}

/* Appends b's saved form to blocks[*n], merging a free block into a free
 * predecessor (pending frees count as free: they are by the time of a
 * restore); returns whether a record was added. */
static bool save_block(saved_block_t *blocks, size_t *n, bool first, const gca__block_t *b) {
  saved_block_t *last = first ? NULL : &blocks[*n - 1];
  bool is_free = !b->allocated && !b->unmapped;
  if (is_free && last != NULL && !last->allocated && !last->unmapped) {
    last->size += b->size;
    return false;
  }
  blocks[(*n)++] = (saved_block_t){.size = b->size,
                                   .requested = b->allocated ? b->requested : 0,
                                   .allocated = b->allocated,
                                   .unmapped = b->unmapped};
  return true;
}

GCA_API gca_status_t gca_pool_checkpoint(gca_pool_t *pool, gca_pool_state_t **state) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  gca_status_t st = GCA_OK;
  if (state == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_checkpoint: the output pointer is NULL");
  *state = NULL;
  GCA_CHECK(gca__mempool_lookup("pool_checkpoint", pool, &d, &m));
  if ((st = gca__mempool_settled("pool_checkpoint", m)) != GCA_OK) {
    gca__dev_unlock(d);
    return st;
  }
  gca_pool_state_t *s = calloc(1, sizeof(*s));
  size_t nsegs = m->small.nsegments + m->large.nsegments, nblocks = 0;
  gca__pool_t *pools[2] = {&m->small, &m->large};
  for (int k = 0; k < 2; k++)
    for (gca__segment_t *seg = pools[k]->segments; seg != NULL; seg = seg->next)
      for (gca__block_t *b = seg->head; b != NULL; b = b->next)
        nblocks++;
  if (s != NULL) {
    s->segs = malloc((nsegs ? nsegs : 1) * sizeof(*s->segs));
    s->blocks = malloc((nblocks ? nblocks : 1) * sizeof(*s->blocks));
  }
  if (s == NULL || s->segs == NULL || s->blocks == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY,
                    "pool_checkpoint: host out of memory for %zu segments and %zu blocks", nsegs,
                    nblocks);
    goto fail;
  }
  s->pool = m->handle;
  s->device = d->device;
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *seg = pools[k]->segments; seg != NULL; seg = seg->next) {
      saved_seg_t *ss = &s->segs[s->nsegs++];
      *ss = (saved_seg_t){.base = seg->base,
                          .extent = seg_extent(seg),
                          .stream = seg->stream,
                          .is_small = pools[k]->is_small,
                          .expandable = seg->expandable,
                          .first = s->nblocks};
      for (gca__block_t *b = seg->head; b != NULL; b = b->next)
        ss->nblocks += save_block(s->blocks, &s->nblocks, ss->nblocks == 0, b);
    }
  }
  gca__dev_unlock(d);
  *state = s;
  return GCA_OK;

fail:
  gca__dev_unlock(d);
  gca_pool_state_free(s);
  return st;
}

/* ---- restore ---- */

/* What a segment becomes: its saved blocks, or (a segment made since the
 * checkpoint) its mapped runs as free blocks and its unmapped blocks kept. */
typedef struct inherit {
  gca__use_t *uses;
  uint32_t n, cap;
} inherit_t;

typedef struct target {
  const saved_block_t *blocks;
  size_t n;
  saved_block_t *owned; /* the derived list, freed after the restore */
  inherit_t *inh;       /* per target block, the uses it inherits; NULL when none
                           (Note [Checkpoints and stream uses]) */
} target_t;

static gca__segment_t *find_segment(gca__mempool_t *m, const saved_seg_t *ss) {
  gca__pool_t *p = ss->is_small ? &m->small : &m->large;
  for (gca__segment_t *seg = p->segments; seg != NULL; seg = seg->next)
    if (seg->base == ss->base)
      return seg;
  return NULL;
}

static const saved_seg_t *saved_of(const gca_pool_state_t *s, const gca__segment_t *seg) {
  for (size_t i = 0; i < s->nsegs; i++)
    if (s->segs[i].base == seg->base)
      return &s->segs[i];
  return NULL;
}

/* Whether every block mapped in the checkpoint is mapped now (the segment
 * may have grown since, never shrunk). */
static bool saved_still_mapped(const gca__segment_t *seg, const gca_pool_state_t *s,
                               const saved_seg_t *ss) {
  gca_devptr_t at = seg->base;
  const gca__block_t *b = seg->head;
  for (size_t i = 0; i < ss->nblocks; i++) {
    const saved_block_t *sb = &s->blocks[ss->first + i];
    gca_devptr_t end = at + sb->size;
    if (!sb->unmapped) {
      while (b != NULL && b->addr + b->size <= at)
        b = b->next;
      for (const gca__block_t *c = b; c != NULL && c->addr < end; c = c->next)
        if (c->unmapped)
          return false;
    }
    at = end;
  }
  return true;
}

/* Refuses a state that cannot be applied to m, naming why. */
static gca_status_t restore_validate(gca__devalloc_t *d, gca__mempool_t *m,
                                     const gca_pool_state_t *s, const void *pool) {
  if (s->pool != m->handle)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "pool_restore: the state was taken from pool %#" PRIx64 ", not from pool %p",
                      s->pool, pool);
  if (gca__mempool_capturing_locked(d, m))
    return gca__error(GCA_ERR_INVALID_STATE,
                      "pool_restore: pool %p has a capture under way; end it first", pool);
  for (size_t i = 0; i < s->nsegs; i++) {
    const saved_seg_t *ss = &s->segs[i];
    gca__segment_t *seg = find_segment(m, ss);
    if (seg == NULL)
      return gca__error(GCA_ERR_INVALID_STATE,
                        "pool_restore: stale state: segment 0x%" PRIx64 " (%zu bytes) of the "
                        "checkpoint is no longer in pool %p",
                        ss->base, ss->extent, pool);
    if (seg_extent(seg) != ss->extent || seg->stream != ss->stream ||
        seg->expandable != ss->expandable)
      return gca__error(GCA_ERR_INVALID_STATE,
                        "pool_restore: stale state: segment 0x%" PRIx64 " is now %zu bytes on "
                        "stream %p, the checkpoint saved %zu bytes on stream %p",
                        ss->base, seg_extent(seg), (void *)seg->stream, ss->extent,
                        (void *)ss->stream);
    if (seg->expandable && !saved_still_mapped(seg, s, ss))
      return gca__error(GCA_ERR_INVALID_STATE,
                        "pool_restore: stale state: memory of expandable segment 0x%" PRIx64
                        " mapped at the checkpoint was unmapped since (%zu bytes mapped now)",
                        ss->base, seg->size);
  }
  return GCA_OK;
}

/* Whether a block of m waits for stream events (pending or deferred free). */
static bool pool_has_pending(gca__mempool_t *m) {
  gca__pool_t *pools[2] = {&m->small, &m->large};
  for (int k = 0; k < 2; k++)
    for (gca__segment_t *seg = pools[k]->segments; seg != NULL; seg = seg->next)
      for (gca__block_t *b = seg->head; b != NULL; b = b->next)
        if (!b->allocated && b->event_count > 0)
          return true;
  return false;
}

/* Appends a free or unmapped piece to t->owned, merging it with a last piece
 * of the same kind. */
static void emit_piece(target_t *t, size_t size, bool unmapped) {
  saved_block_t *last = t->n ? &t->owned[t->n - 1] : NULL;
  if (last != NULL && !last->allocated && last->unmapped == unmapped) {
    last->size += size;
    return;
  }
  t->owned[t->n++] = (saved_block_t){.size = size, .unmapped = unmapped};
}

/* The target of seg: the saved blocks, except that space mapped since the
 * checkpoint (inside a saved unmapped block) becomes free; a segment made
 * since the checkpoint becomes its mapped runs as free blocks. */
static gca_status_t target_of(const gca__segment_t *seg, const gca_pool_state_t *s, target_t *t) {
  const saved_seg_t *ss = saved_of(s, seg);
  *t = (target_t){0};
  if (ss != NULL && !seg->expandable) {
    t->blocks = &s->blocks[ss->first];
    t->n = ss->nblocks;
    return GCA_OK;
  }
  size_t n = ss ? ss->nblocks : 0;
  for (const gca__block_t *b = seg->head; b != NULL; b = b->next)
    n += 2;
  t->owned = malloc(n * sizeof(*t->owned));
  if (t->owned == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "pool_restore: host out of memory");
  t->blocks = t->owned;
  gca_devptr_t at = seg->base, end = seg->base + seg_extent(seg);
  size_t i = 0;
  const gca__block_t *b = seg->head;
  while (at < end) {
    const saved_block_t *sb = ss && i < ss->nblocks ? &s->blocks[ss->first + i] : NULL;
    gca_devptr_t stop = sb ? at + sb->size : end;
    if (sb != NULL && !sb->unmapped) {
      if (sb->allocated)
        t->owned[t->n++] = *sb;
      else
        emit_piece(t, sb->size, false);
    } else {
      /* the current blocks decide, piece by piece */
      for (gca_devptr_t p = at; p < stop;) {
        while (b->addr + b->size <= p)
          b = b->next;
        gca_devptr_t q = b->addr + b->size < stop ? b->addr + b->size : stop;
        emit_piece(t, q - p, b->unmapped);
        p = q;
      }
    }
    at = stop;
    i++;
  }
  return GCA_OK;
}

static gca_status_t inherit_add(inherit_t *h, const gca__use_t *u) {
  for (uint32_t k = 0; k < h->n; k++)
    if (h->uses[k].stream == u->stream && h->uses[k].dev == u->dev)
      return GCA_OK;
  if (h->n == h->cap) {
    uint32_t ncap = h->cap ? h->cap * 2 : 4;
    gca__use_t *n = realloc(h->uses, ncap * sizeof(*n));
    if (n == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "pool_restore: host out of memory for stream uses");
    h->uses = n;
    h->cap = ncap;
  }
  h->uses[h->n++] = *u;
  return GCA_OK;
}

/* Fills t->inh (Note [Checkpoints and stream uses]): each mapped target
 * block gets the uses of the live blocks of seg it overlaps. *parks counts
 * the free target blocks that inherit some. */
static gca_status_t target_uses(const gca__segment_t *seg, target_t *t, size_t *parks) {
  const gca__block_t *b = seg->head;
  while (b != NULL && !(b->allocated && b->nuses != 0))
    b = b->next;
  if (b == NULL)
    return GCA_OK;
  t->inh = calloc(t->n, sizeof(*t->inh));
  if (t->inh == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "pool_restore: host out of memory for stream uses");
  gca_devptr_t at = seg->base;
  b = seg->head;
  for (size_t i = 0; i < t->n; i++) {
    gca_devptr_t end = at + t->blocks[i].size;
    while (b != NULL && b->addr + b->size <= at)
      b = b->next;
    for (const gca__block_t *c = b; c != NULL && c->addr < end && !t->blocks[i].unmapped;
         c = c->next)
      if (c->allocated)
        for (uint32_t k = 0; k < c->nuses; k++)
          GCA_CHECK(inherit_add(&t->inh[i], &c->uses[k]));
    if (t->inh[i].n != 0 && !t->blocks[i].allocated)
      (*parks)++;
    at = end;
  }
  return GCA_OK;
}

static void target_free(target_t *t) {
  if (t->inh != NULL)
    for (size_t i = 0; i < t->n; i++)
      free(t->inh[i].uses);
  free(t->inh);
  free(t->owned);
}

/* Takes a segment's blocks out of the pointer map, the tree and the stats. */
static void seg_unaccount(gca__devalloc_t *d, gca__segment_t *seg) {
  gca__pool_t *p = seg->pool;
  bool split = seg->head->next != NULL;
  for (gca__block_t *b = seg->head; b != NULL; b = b->next) {
    if (b->unmapped)
      continue;
    if (b->allocated) {
      gca__block_t *taken = gca__ptrmap_take(&d->ptrs, b->addr);
      GCA_ASSERT(taken == b);
      gca__stat_block_free(d, b, gca__stat_type(p));
      gca__stat_pool(d, d->stats.requested_bytes, p, -(int64_t)b->requested);
      p->owner->nactive--;
    } else {
      gca__tree_erase(p, b);
      if (split) {
        gca__stat_pool(d, d->stats.inactive_split, p, -1);
        gca__stat_pool(d, d->stats.inactive_split_bytes, p, -(int64_t)b->size);
      }
    }
  }
}

/* Puts a re-tiled segment's blocks back (the inverse of seg_unaccount). */
static void seg_account(gca__devalloc_t *d, gca__segment_t *seg) {
  gca__pool_t *p = seg->pool;
  bool split = seg->head->next != NULL;
  for (gca__block_t *b = seg->head; b != NULL; b = b->next) {
    if (b->unmapped)
      continue;
    if (b->allocated) {
      gca_status_t st = gca__ptrmap_insert(&d->ptrs, b->addr, b);
      GCA_ASSERT(st == GCA_OK); /* grown beforehand */
      gca__stat_block_alloc(d, b, gca__stat_type(p), false);
      p->owner->nactive++;
    } else if (b->nuses != 0) {
      gca__pending_park(d, b); /* Note [Checkpoints and stream uses] */
      p->owner->nactive++;
    } else {
      b->gc_base = p->free_calls;
      gca__tree_insert(p, b);
      if (split) {
        gca__stat_pool(d, d->stats.inactive_split, p, 1);
        gca__stat_pool(d, d->stats.inactive_split_bytes, p, (int64_t)b->size);
      }
    }
  }
}

/* Replaces seg's blocks by the target's, taking block records from *spare;
 * the new blocks take the uses they inherit. */
static void seg_retile(gca__devalloc_t *d, gca__segment_t *seg, target_t *t, gca__block_t **spare) {
  for (gca__block_t *b = seg->head, *next; b != NULL; b = next) {
    next = b->next;
    free(b->uses);
    b->uses = NULL;
    gca__uses_set(d, b, 0);
    b->cap_uses = 0;
    b->unmapped = false;
    gca__block_free(d, b);
  }
  gca_devptr_t at = seg->base;
  gca__block_t *prev = NULL;
  for (size_t i = 0; i < t->n; i++) {
    gca__block_t *b = *spare;
    *spare = b->next;
    memset(b, 0, sizeof(*b));
    b->addr = at;
    b->size = t->blocks[i].size;
    b->requested = t->blocks[i].requested;
    b->allocated = t->blocks[i].allocated;
    b->unmapped = t->blocks[i].unmapped;
    b->stream = seg->stream;
    b->pool = seg->pool;
    b->seg = seg;
    if (t->inh != NULL && t->inh[i].n != 0) {
      b->uses = t->inh[i].uses;
      gca__uses_set(d, b, t->inh[i].n);
      b->cap_uses = t->inh[i].n;
      t->inh[i] = (inherit_t){0};
    }
    b->prev = prev;
    if (prev != NULL)
      prev->next = b;
    else
      seg->head = b;
    prev = b;
    at += b->size;
  }
  GCA_ASSERT(at == seg->base + seg_extent(seg));
}

static int addr_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Fills the changes of one segment: live blocks before (current) and after
 * (the target) compared by address and size. */
static void seg_changes(const gca__segment_t *seg, const target_t *t, gca_pool_changes_t *c) {
  const gca__block_t *b = seg->head;
  size_t i = 0;
  gca_devptr_t at = seg->base;
  for (;;) {
    while (i < t->n && !t->blocks[i].allocated)
      at += t->blocks[i++].size;
    while (b != NULL && !b->allocated)
      b = b->next;
    if (b == NULL && i >= t->n)
      break;
    if (b != NULL && i < t->n && b->addr == at && b->size == t->blocks[i].size) {
      b = b->next;
      at += t->blocks[i++].size;
    } else if (i >= t->n || (b != NULL && b->addr < at)) {
      c->freed[c->nfreed++] = (void *)(uintptr_t)b->addr;
      b = b->next;
    } else {
      c->allocated[c->nallocated++] = (void *)(uintptr_t)at;
      at += t->blocks[i++].size;
    }
  }
}

/* Takes into bt the free mappings of seg that lie wholly inside space the
 * checkpoint had unmapped (all of a segment made since it, the reservation
 * included). */
static gca_status_t trim_segment(gca__devalloc_t *d, gca__relbatch_t *bt, gca__segment_t *seg,
                                 const gca_pool_state_t *s) {
  const saved_seg_t *ss = saved_of(s, seg);
  if (ss == NULL)
    return gca__relbatch_take(d, bt, seg);
  size_t off = 0;
  for (size_t i = 0; i < ss->nblocks; i++) {
    const saved_block_t *sb = &s->blocks[ss->first + i];
    if (sb->unmapped)
      GCA_CHECK(gca__expand_take_range(d, bt, seg, off, off + sb->size));
    off += sb->size;
  }
  return GCA_OK;
}

/* Note [Checkpoints]: after the state is applied, memory mapped since the
 * checkpoint outside its mapped space goes back to the driver, through a
 * release batch (the path of empty_cache: Note [No waits under the device
 * lock]). While the lock is let go for the stream waits, other threads may
 * allocate from m and free into it (the batch's blocks are out of the tree,
 * and the finish looks at the segments afresh), or release its last handle:
 * m holds a use meanwhile, so it is destroyed only after. A mapping that
 * straddles the boundary (part of it mapped at the checkpoint) stays mapped;
 * its part outside the saved mapped space is free. Suspended segments keep
 * their mapping records for the resume and are left alone; while a capture is
 * under way on the device nothing is trimmed, since unmapping synchronizes a
 * stream (the next restore trims). Best effort: a failure is a warning and
 * leaves that memory mapped and free. Called last, at the entry point. */
static void trim(gca__devalloc_t *d, gca__mempool_t *m, const gca_pool_state_t *s) {
  gca__pool_t *pools[2] = {&m->small, &m->large};
  gca__relbatch_t bt = {0};
  gca_status_t st = GCA_OK;
  if (d->ncaptures != 0)
    return;
  for (int k = 0; k < 2 && st == GCA_OK; k++)
    for (gca__segment_t *seg = pools[k]->segments; seg != NULL && st == GCA_OK; seg = seg->next)
      if (seg->expandable && !seg->suspended)
        st = trim_segment(d, &bt, seg, s);
  m->use_count++;
  gca_status_t rst = gca__relbatch_run(d, &bt, NULL); /* what was taken goes back either way */
  free(bt.v);
  if (st == GCA_OK)
    st = rst;
  if (st != GCA_OK)
    GCA_LOG_WARN("pool_restore: memory mapped since the checkpoint stays partly mapped: %s",
                 gca_last_error());
  gca__mempool_unuse(d, m);
}

GCA_API gca_status_t gca_pool_restore(gca_pool_t *pool, const gca_pool_state_t *state,
                                      gca_pool_changes_t *changes) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  gca_status_t st;
  gca_pool_changes_t c = {0};
  gca__block_t *spare = NULL;
  target_t *targets = NULL;
  size_t ntargets = 0;
  if (changes != NULL)
    memset(changes, 0, sizeof(*changes));
  if (state == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_restore: the state is NULL");
  GCA_CHECK(gca__mempool_lookup("pool_restore", pool, &d, &m));
  GCA_CHECK_GOTO(gca__mempool_settled("pool_restore", m), st, out);
  GCA_CHECK_GOTO(restore_validate(d, m, state, pool), st, out);
  if (pool_has_pending(m)) {
    if (d->ncaptures == 0 && d->ndeferred != 0)
      GCA_CHECK_GOTO(gca__pending_flush_deferred(d), st, out);
    if (d->ncaptures == 0)
      GCA_CHECK_GOTO(gca__pending_sync(d), st, out);
    if (pool_has_pending(m)) {
      st = gca__error(GCA_ERR_INVALID_STATE,
                      "pool_restore: blocks of pool %p wait for stream events while a capture is "
                      "under way on device %d",
                      (void *)pool, d->device);
      goto out;
    }
  }
  gca__pool_t *pools[2] = {&m->small, &m->large};
  size_t nsegs = m->small.nsegments + m->large.nsegments;
  targets = calloc(nsegs ? nsegs : 1, sizeof(*targets));
  if (targets == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "pool_restore: host out of memory");
    goto out;
  }
  size_t live_now = 0, live_then = 0, records = 0, parks = 0;
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *seg = pools[k]->segments; seg != NULL; seg = seg->next) {
      target_t *t = &targets[ntargets++];
      GCA_CHECK_GOTO(target_of(seg, state, t), st, out);
      GCA_CHECK_GOTO(target_uses(seg, t, &parks), st, out);
      records += t->n;
      for (size_t i = 0; i < t->n; i++)
        live_then += t->blocks[i].allocated;
      for (gca__block_t *b = seg->head; b != NULL; b = b->next)
        live_now += b->allocated;
    }
  }
  c.freed = malloc((live_now ? live_now : 1) * sizeof(void *));
  c.allocated = malloc((live_then ? live_then : 1) * sizeof(void *));
  if (c.freed == NULL || c.allocated == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "pool_restore: host out of memory for the changes");
    goto out;
  }
  GCA_CHECK_GOTO(gca__pending_park_reserve(d, parks), st, out);
  for (size_t i = 0; i < records; i++) {
    gca__block_t *b;
    GCA_CHECK_GOTO(gca__block_new(d, &b), st, out);
    b->next = spare;
    spare = b;
  }
  /* grow the pointer map now so that re-inserting the live blocks cannot fail;
   * odd addresses are never block addresses */
  size_t extra = live_then > live_now ? live_then - live_now : 0;
  for (size_t i = 0; i < extra; i++) {
    st = gca__ptrmap_insert(&d->ptrs, (gca_devptr_t)(2 * i + 1), NULL);
    if (st != GCA_OK) {
      while (i-- > 0)
        gca__ptrmap_take(&d->ptrs, (gca_devptr_t)(2 * i + 1));
      goto out;
    }
  }
  for (size_t i = 0; i < extra; i++)
    gca__ptrmap_take(&d->ptrs, (gca_devptr_t)(2 * i + 1));

  size_t ti = 0;
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *seg = pools[k]->segments; seg != NULL; seg = seg->next, ti++) {
      seg_changes(seg, &targets[ti], &c);
      seg_unaccount(d, seg);
      seg_retile(d, seg, &targets[ti], &spare);
      seg_account(d, seg);
    }
  }
  GCA_ASSERT(spare == NULL);
  if (parks != 0 && d->ncaptures == 0 && gca__pending_flush_deferred(d) != GCA_OK)
    GCA_LOG_WARN("pool_restore: events for blocks used on other streams are not recorded yet; "
                 "their memory stays parked until they are: %s",
                 gca_last_error());
  trim(d, m, state);
  st = GCA_OK;
out:
  while (spare != NULL) {
    gca__block_t *next = spare->next;
    gca__block_free(d, spare);
    spare = next;
  }
  gca__dev_unlock(d);
  for (size_t i = 0; i < ntargets; i++)
    target_free(&targets[i]);
  free(targets);
  if (st != GCA_OK) {
    gca_pool_changes_free(&c);
    return st;
  }
  qsort(c.freed, c.nfreed, sizeof(void *), addr_cmp);
  qsort(c.allocated, c.nallocated, sizeof(void *), addr_cmp);
  if (changes != NULL)
    *changes = c;
  else
    gca_pool_changes_free(&c);
  return GCA_OK;
}
