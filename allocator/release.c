/* SPDX-License-Identifier: Apache-2.0 */
/* release.c - giving cached memory back to the driver, and getting a new
 * segment when the cache has nothing that fits: garbage collection before,
 * and the out-of-memory retries after a refusal (free the oversize blocks
 * that would make room, then every cached segment, then borrow from the
 * private pools that allow it).
 *
 * The one idea: PyTorch's order of remedies (garbage_collect_cached_blocks,
 * alloc_block, release_available_cached_blocks, release_cached_blocks) in one
 * place, so that the malloc path above asks once for a block and gets either
 * one or a real out-of-memory.
 *
 * Memory goes back in release batches (Note [No waits under the device lock],
 * alloc_core.h): the segments or free blocks chosen leave the tree under the
 * lock, the lock is let go while the streams are waited for and the driver
 * frees, then retaken to finish. A batch is run wherever PyTorch frees a
 * segment: with the lock let go, other threads may allocate and free
 * meanwhile, so every step after a batch looks at the pools afresh.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "expandable.h"
#include "fcache.h"
#include "recycle.h"
#include "tcache.h"

/* Puts an expandable segment's releasing block back in the tree, merging it
 * with neighbours freed meanwhile (its inactive_split share moves with it). */
static void reinsert(gca__devalloc_t *d, gca__block_t *b) {
  int64_t blocks, bytes;
  b->releasing = false;
  if (!gca__block_whole(b)) {
    gca__stat_pool(d, d->stats.inactive_split, b->pool, -1);
    gca__stat_pool(d, d->stats.inactive_split_bytes, b->pool, -(int64_t)b->size);
  }
  gca__block_coalesce(d, b, &blocks, &bytes);
  gca__stat_pool(d, d->stats.inactive_split, b->pool, blocks);
  gca__stat_pool(d, d->stats.inactive_split_bytes, b->pool, bytes);
}

gca_status_t gca__relbatch_run(gca__devalloc_t *d, gca__relbatch_t *bt, size_t *released) {
  gca_status_t st = GCA_OK;
  if (bt->n == 0)
    return GCA_OK;
  d->releasing += bt->bytes;
  d->nreleases++;
  bt->captures = d->ncaptures != 0;
  for (size_t i = 0; i < bt->n; i++) /* what a wait will cover (Note [Move horizons]) */
    if (bt->v[i].expandable && !bt->v[i].safe)
      bt->v[i].hz = ++bt->v[i].seg->pool->free_calls;
  gca__dev_let_go(d);
  gca__relbatch_wait(d, bt);
  gca__dev_lock(d);
  /* no cached block may sit near a block going back to the tree */
  if (d->fc_count != 0)
    gca__flush_caches(d);
  for (size_t i = 0; i < bt->n; i++) {
    gca__relent_t *e = &bt->v[i];
    gca_status_t est = GCA_OK;
    if (!e->expandable)
      est = gca__relbatch_finish_classic(d, e, released);
    else if (e->b != NULL)
      reinsert(d, e->b);
    if (st == GCA_OK)
      st = est;
  }
  for (size_t i = 0; i < bt->n; i++) {
    gca__relent_t *e = &bt->v[i];
    if (!e->expandable || e->st != GCA_OK)
      continue;
    bool last = true, last_waited = !e->safe; /* the segment's last entry may remove it */
    for (size_t k = i + 1; k < bt->n; k++) {
      if (bt->v[k].expandable && bt->v[k].seg == e->seg) {
        last = false;
        last_waited = last_waited && bt->v[k].safe;
      }
    }
    if (last_waited) /* its stream was waited for: its lent granules go (Note [Lent granules]) */
      gca__hz_retire(d, e->seg, e->hz);
    if (e->b == NULL && !last)
      continue;
    gca_status_t est = gca__expand_release_synced(d, e->seg, e->lo, e->hi, released,
                                                  last && !e->keep, e->lend, e->hz);
    if (st == GCA_OK)
      st = est;
  }
  for (size_t i = 0; i < bt->n; i++) /* a failed wait: the blocks are back, nothing unmapped */
    if (bt->v[i].expandable && bt->v[i].st != GCA_OK && bt->v[i].st != GCA_ERR_NOT_READY &&
        st == GCA_OK) /* NOT_READY: kept, its stream captures (segment.c) */
      st = gca__error_prefix(bt->v[i].st, "release of expandable segment 0x%" PRIx64,
                             bt->v[i].seg->base);
  d->releasing -= bt->bytes;
  d->nreleases--;
  pthread_mutex_lock(&d->rel_mu);
  d->release_gen++;
  pthread_cond_broadcast(&d->rel_cv);
  pthread_mutex_unlock(&d->rel_mu);
  bt->n = 0;
  bt->bytes = 0;
  return st;
}

/* Takes every cached whole segment (and every wholly free mapping of an
 * expandable one) of the pool into bt. */
static gca_status_t pool_take_all(gca__devalloc_t *d, gca__pool_t *pool, gca__relbatch_t *bt) {
  for (gca__segment_t *s = pool->segments; s != NULL; s = s->next)
    GCA_CHECK(gca__relbatch_take(d, bt, s));
  return GCA_OK;
}

static gca_status_t reap_dead_pools(gca__devalloc_t *d);

gca_status_t gca__release_cached(gca__devalloc_t *d) {
  gca__relbatch_t bt = {0};
  gca_status_t st;
  gca__flush_caches(d);
  gca__tc_flush_all(d, false);
  GCA_CHECK(gca__pending_sync(d));
  gca__flush_caches(d); /* others may have cached frees while the lock was let go */
  gca__tc_flush_all(d, false);
  st = pool_take_all(d, &d->large, &bt);
  if (st == GCA_OK)
    st = pool_take_all(d, &d->small, &bt);
  gca_status_t rst = gca__relbatch_run(d, &bt, NULL); /* what was taken goes back either way */
  free(bt.v);
  if (st == GCA_OK)
    st = rst;
  gca_status_t pst = reap_dead_pools(d); /* Note [Failed reaps] */
  return st != GCA_OK ? st : pst;
}

/* ---- the reap: what frees left to give back ---- */

/* Destroys dying idle pool m (Note [No waits under the device lock]): its
 * segments go back through one release batch while m holds a use and is
 * marked destroying, so that no lookup, route or OOM borrow reaches it while
 * the lock is let go; other threads meanwhile allocate and free in other
 * pools only (m has no live block, no handle and no route). Once the batch is
 * done m is unlinked and freed, or, if something failed, stays dying for a
 * later free or capture end. *next: m's successor, read under the lock. */
static gca_status_t reap_pool(gca__devalloc_t *d, gca__mempool_t *m, gca__mempool_t **next) {
  gca__relbatch_t bt = {0};
  gca_status_t st = GCA_OK, rst;
  m->use_count++;
  m->destroying = true;
  if (m->suspended) /* the release path needs mappings to unmap */
    st = gca__mempool_resume_locked(d, m);
  gca__pool_t *pools[2] = {&m->small, &m->large};
  for (int k = 0; k < 2 && st == GCA_OK; k++)
    st = pool_take_all(d, pools[k], &bt);
  rst = gca__relbatch_run(d, &bt, NULL); /* what was taken goes back either way */
  free(bt.v);
  if (st == GCA_OK)
    st = rst;
  for (int k = 0; k < 2 && st == GCA_OK; k++) /* wholly unmapped expandable segments */
    for (gca__segment_t *s = pools[k]->segments, *sn; s != NULL && st == GCA_OK; s = sn) {
      sn = s->next;
      if (s->expandable && s->nmaps == 0)
        st = gca__expand_release_synced(d, s, 0, 0, NULL, true, false, 0);
    }
  if (st == GCA_OK && (m->small.segments != NULL || m->large.segments != NULL))
    st = gca__error(GCA_ERR_INTERNAL, "kept segments that hold no live block");
  m->destroying = false;
  m->use_count--;
  *next = m->next;
  if (st == GCA_OK) {
    gca__mempool_forget(d, m);
    return GCA_OK;
  }
  st = gca__error_prefix(st, "pool %#" PRIx64, m->handle);
  GCA_LOG_WARN("pool_release: %s (the pool's memory stays until gca_empty_cache or a capture's "
               "end)",
               gca_last_error());
  return st;
}

/* Note [Failed reaps]: a dead pool whose reap failed keeps its memory and is
 * not reaped again by itself (nothing of it is freed any more); gca_empty_cache
 * and a capture's end (gca__mempool_sweep_dying) try again. */
static gca_status_t reap_dead_pools(gca__devalloc_t *d) {
  gca_status_t st = GCA_OK;
  for (gca__mempool_t *m = d->mempools, *next; m != NULL; m = next) {
    if (gca__mempool_reapable(d, m)) {
      gca_status_t pst = reap_pool(d, m, &next);
      if (st == GCA_OK)
        st = pst;
    } else {
      next = m->next;
    }
  }
  return st;
}

/* Caching off: takes every segment of pool whose blocks are all free. */
static gca_status_t pool_take_whole(gca__devalloc_t *d, gca__pool_t *pool, gca__relbatch_t *bt) {
  for (gca__segment_t *s = pool->segments; s != NULL; s = s->next)
    if (gca__block_whole(s->head) && s->head->in_tree)
      GCA_CHECK(gca__relbatch_take(d, bt, s));
  return GCA_OK;
}

void gca__release_reap(gca__devalloc_t *d) {
  d->reap = false;
  /* Note [Gone streams of deferred frees]; Note [Capture gate] (device.c) */
  if (d->deferred_need != 0 && d->ncaptures == 0 && gca__device_wait_enter()) {
    int dev = d->deferred_need - 1;
    d->deferred_need = 0;
    gca__dev_let_go(d);
    gca_status_t st = d->ops->ctx_synchronize(dev);
    gca__device_wait_leave();
    gca__dev_lock(d);
    if (st == GCA_OK) {
      d->deferred_waited = dev + 1;
      st = gca__pending_flush_deferred(d);
      d->deferred_waited = 0;
    }
    if (st != GCA_OK)
      GCA_LOG_WARN("a deferred free recorded on a destroyed stream stays pending: %s",
                   gca_last_error());
  }
  if (!d->caching) {
    /* with the lock let go other threads may free (setting d->reap again:
     * their own unlock reaps) or allocate; the batch's blocks are out of reach */
    gca__relbatch_t bt = {0};
    gca_status_t st = GCA_OK;
    for (gca__pool_t *p = &d->small; p != NULL && st == GCA_OK; p = gca__pool_next(d, p))
      if (p->owner == NULL ||
          (!p->owner->suspended && !p->owner->destroying && p->owner->transition == NULL))
        st = pool_take_whole(d, p, &bt);
    gca_status_t rst = gca__relbatch_run(d, &bt, NULL);
    free(bt.v);
    if (st == GCA_OK)
      st = rst;
    if (st != GCA_OK)
      GCA_LOG_WARN("free: caching is off but a segment stays cached: %s", gca_last_error());
  }
  (void)reap_dead_pools(d); /* failures are logged; Note [Failed reaps] */
}

/* Waits, with no device lock held, until a release batch under way when it
 * was called has finished; false when none was under way. */
static bool wait_release(gca__devalloc_t *d) {
  if (d->nreleases == 0)
    return false;
  uint64_t gen = d->release_gen;
  gca__dev_let_go(d);
  pthread_mutex_lock(&d->rel_mu);
  while (d->release_gen == gen)
    pthread_cond_wait(&d->rel_cv, &d->rel_mu);
  pthread_mutex_unlock(&d->rel_mu);
  gca__dev_lock(d);
  return true;
}

void gca__release_wait_all(gca__devalloc_t *d) {
  while (wait_release(d))
    ;
}

/* PyTorch's release_available_cached_blocks: with max_split_size set, free
 * the smallest oversize block that covers the request, else the largest ones
 * until enough is freed. *released says whether the retry is worth it. */
static gca_status_t release_available(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                      size_t rounded, bool *released) {
  *released = false;
  uint64_t msplit = d->cfg.max_split_size;
  if (msplit == UINT64_MAX)
    return GCA_OK;
  size_t key = rounded < msplit ? (size_t)msplit : rounded;
  gca__block_t *it = gca__tree_lower_bound(pool, stream, key);
  if (it == NULL || it->stream != stream) {
    size_t total = 0;
    gca__relbatch_t bt = {0};
    gca_status_t st = GCA_OK;
    it = gca__tree_below(pool, stream, key);
    while (total < key && it != NULL && it->size >= msplit && it->stream == stream) {
      gca__block_t *cur = it;
      it = gca__tree_prev(pool, cur);
      if (gca__block_whole(cur)) {
        size_t sz = cur->size;
        if ((st = gca__relbatch_take(d, &bt, cur->seg)) != GCA_OK)
          break;
        total += sz;
      }
    }
    size_t freed = 0;
    gca_status_t rst = gca__relbatch_run(d, &bt, &freed);
    free(bt.v);
    GCA_CHECK(st);
    GCA_CHECK(rst);
    if (total < key)
      return GCA_OK;
  } else {
    if (!gca__block_whole(it))
      return GCA_OK;
    gca__relbatch_t bt = {0};
    gca_status_t st = gca__relbatch_take(d, &bt, it->seg);
    gca_status_t rst = gca__relbatch_run(d, &bt, NULL);
    free(bt.v);
    GCA_CHECK(st);
    GCA_CHECK(rst);
  }
  *released = true;
  return GCA_OK;
}

/* Garbage collection by age (PyTorch's garbage_collect_cached_blocks): once
 * reserved memory passes threshold * limit, free cached whole large segments
 * that have waited longer than average, oldest first by rounds, until the
 * excess is reclaimed. Ages count get_free_block calls. */
static gca_status_t garbage_collect(gca__devalloc_t *d) {
  gca__pool_t *pool = &d->large;
  size_t threshold = (size_t)(d->cfg.garbage_collection_threshold * (double)d->allowed_max);
  if (d->reserved <= threshold)
    return GCA_OK;
  size_t target = d->reserved - threshold, reclaimed = 0; /* GC on: the free cache is off */
  uint64_t total_age = 0;
  size_t count = 0;
  for (gca__segment_t *s = pool->segments; s != NULL; s = s->next) {
    if (gca__block_whole(s->head) && s->head->in_tree) {
      total_age += pool->free_calls - s->head->gc_base;
      count++;
    }
  }
  bool freed = true;
  gca__relbatch_t bt = {0};
  gca_status_t st = GCA_OK;
  /* the rounds choose; one batch frees what they chose */
  while (reclaimed < target && freed && count > 0 && st == GCA_OK) {
    double age_threshold = (double)total_age / (double)count;
    freed = false;
    for (gca__segment_t *s = pool->segments; s != NULL && st == GCA_OK; s = s->next) {
      gca__block_t *b = s->head;
      if (s->expandable || !gca__block_whole(b) || !b->in_tree)
        continue;
      uint64_t age = pool->free_calls - b->gc_base;
      if ((double)age >= age_threshold) {
        if ((st = gca__relbatch_take(d, &bt, s)) != GCA_OK)
          break;
        freed = true;
        reclaimed += s->size;
        total_age -= age;
        count--;
      }
    }
  }
  for (gca__segment_t *s = pool->segments; s != NULL && reclaimed < target && st == GCA_OK;
       s = s->next) {
    if (s->expandable) {
      size_t before = bt.bytes;
      st = gca__relbatch_take(d, &bt, s);
      reclaimed += bt.bytes - before;
    }
  }
  gca_status_t rst = gca__relbatch_run(d, &bt, NULL);
  free(bt.v);
  return st != GCA_OK ? st : rst;
}

/* Tries the free trees of the use_on_oom private pools; the block found is
 * still in its tree (Note [Tree places]). */
static gca__block_t *take_on_oom(gca__devalloc_t *d, gca_stream_t stream, size_t rounded) {
  for (gca__mempool_t *m = d->mempools; m != NULL; m = m->next) {
    if (!m->use_on_oom || m->use_count == 0 || m->suspended || m->destroying ||
        m->transition != NULL)
      continue;
    gca__pool_t *p = rounded <= GCA__SMALL_SIZE ? &m->small : &m->large;
    gca__block_t *b = gca__pool_take_fit(d, p, stream, rounded);
    if (b != NULL)
      return b;
  }
  return NULL;
}

/* Expandable segments: unmaps (or lends) the whole granules of free ranges
 * that the growth for `rounded` would otherwise create anew, keeping their
 * handles for it (Note [Expandable segments]); a release batch, which waits,
 * with the lock let go, only for another stream whose granules an
 * out-of-memory growth takes while queued work may still use them (Note
 * [Move horizons]). A failure only means the growth creates new handles
 * instead: it is logged, and what failed stays mapped and free. */
static bool move_handles(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream, size_t rounded,
                         bool oom) {
  gca__relbatch_t bt = {0};
  bool held;
  gca_status_t st = gca__expand_take_donors(d, &bt, pool, stream, rounded, oom, &held);
  if (st == GCA_OK && held) { /* held frees may be donors: to the tree first */
    gca__flush_caches(d);
    st = gca__expand_take_donors(d, &bt, pool, stream, rounded, oom, &held);
  }
  bool taken = bt.n != 0;
  gca_status_t rst = gca__relbatch_run(d, &bt, NULL); /* what was taken goes back either way */
  if (taken)
    gca__expand_gather(pool, stream); /* Note [Moves across segments] */
  free(bt.v);
  if (st == GCA_OK)
    st = rst;
  if (st != GCA_OK)
    GCA_LOG_WARN("malloc: moving free memory within an expandable segment failed, mapping new "
                 "memory instead: %s",
                 gca_last_error());
  return taken;
}

/* Note [Lent address space]: lent ranges (Note [Lent granules], horizon.c)
 * hold address space until a horizon covers them, so a growth may find no
 * hole of its size in a segment that would have one once they are unmapped:
 * under gca-replay --lag 1000 on a device capped at 1.005x peak live memory,
 * serving seed 1 once per run asked for 168 MiB with 3.2 GB of the device
 * free and no such hole in the segment's 2x reservation. The remedy that
 * followed, releasing the whole cache, waits for every stream and gives
 * back (and creates again) everything cached. Waiting for the segment's own
 * stream alone, with the lock let go (a release batch of one wait-only
 * entry, which unmaps the lent ranges once the wait is done), is enough; it
 * is taken only when that frees a hole the request fits, and never while a
 * capture runs. On that trace the wait still stalls the host once per run
 * (as the release did: a wait for the stream), and nothing cached is given
 * back and created again. A failed wait is logged, and the cache's release
 * follows as before. Returns whether the lent ranges were let go. */
static bool wait_for_lent(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                          size_t rounded) {
  gca__segment_t *seg = gca__expand_lent_in_way(pool, stream, rounded);
  if (seg == NULL)
    return false;
  gca__relbatch_t bt = {0};
  gca_status_t st =
      GCA_FAILPOINT("lent_wait")
          ? gca__error(GCA_ERR_OUT_OF_MEMORY, "host out of memory for a release batch")
          : gca__relbatch_room(&bt, 1);
  if (st == GCA_OK) {
    bt.v[bt.n++] = (gca__relent_t){.seg = seg, .expandable = true, .keep = true};
    st = gca__relbatch_run(d, &bt, NULL);
    d->stats.num_lent_waits++;
  }
  free(bt.v);
  if (st != GCA_OK)
    GCA_LOG_WARN("malloc: waiting for stream %p to unmap the ranges lent from its expandable "
                 "segment 0x%" PRIx64 " failed, releasing the cache instead: %s",
                 (void *)stream, seg->base, gca_last_error());
  return st == GCA_OK;
}

/* A new segment or growth for `rounded`; with `oom_moves` (Note [Moves on
 * out of memory], below) a refused growth keeps the start it mapped and, the
 * free granules moved to it, is tried once more. */
static gca_status_t grow(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                         size_t seg_size, size_t rounded, bool oom_moves, gca__block_t **b) {
  d->keep_partial = oom_moves;
  gca_status_t st = gca__segment_alloc(d, pool, stream, seg_size, rounded, false, b);
  d->keep_partial = false;
  if (d->cfg.expandable_segments)
    gca__expand_unpark(d, pool);
  if (st == GCA_ERR_OUT_OF_MEMORY && oom_moves && move_handles(d, pool, stream, rounded, true)) {
    st = gca__segment_alloc(d, pool, stream, seg_size, rounded, false, b);
    gca__expand_unpark(d, pool);
  }
  return st;
}

gca_status_t gca__release_new_block(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                    size_t seg_size, size_t rounded, gca__block_t **out) {
  gca_status_t st;
  gca__block_t *b = NULL;
  /* a capture may be under way, here or on another thread, or begin on one
   * meanwhile: segment calls must not invalidate it (PyTorch's
   * cudaMallocMaybeCapturing; a global-mode capture on another thread permits
   * mem_alloc in relaxed mode, Note [Capture gate]) */
  gca_capture_mode_t mode;
  bool relaxed = gca__relax(d->ops, &mode);
  gca__mempool_t *owner = pool->owner;
  if (owner != NULL) /* the lock may be let go (release batches): the pool stays */
    owner->use_count++;
  if (GCA_UNLIKELY(gca__gc_enabled(d))) {
    st = garbage_collect(d);
    if (st != GCA_OK)
      goto out;
  }
  if (GCA_UNLIKELY(d->gone_dirty) && d->ncaptures == 0)
    gca__streams_reclaim(d);
  if (d->cfg.expandable_segments && d->ncaptures == 0)
    (void)move_handles(d, pool, stream, rounded, false);
  /* Note [Moves on out of memory]: with expandable_moves off (or on, within
   * its bound: Note [Moves within a bound]), a growth the
   * device (or the memory fraction) has no room for moves the segment's free
   * granules to where the request needs them before anything else: the
   * retries below would release the whole cache and create it again, which
   * on the serving traces of gca-trace-gen, with the device 1-2% larger than
   * peak live memory, cost 136,000-185,000 driver calls per pass (moves:
   * 4,000-25,000, and no failed request). While memory lasts nothing moves.
   * Out of memory a move takes any free granule: the growing segment's own
   * are lent when queued work may still use them (Note [Lent granules]),
   * other streams' segments' are taken after a wait for their stream.
   * The granules the refused growth did create stay mapped, a free block at
   * the start of the range it mapped (d->keep_partial, map_range), so the moves fill only what
   * is still lacking; given back, they would be created again by the retry. */
  bool oom_moves = d->cfg.expandable_segments && d->ncaptures == 0 && pool->owner == NULL;
  st = grow(d, pool, stream, seg_size, rounded, oom_moves, &b);
  /* Note [Lent address space]: the hole found, memory may still lack */
  if (st == GCA_ERR_OUT_OF_MEMORY && oom_moves && wait_for_lent(d, pool, stream, rounded))
    st = grow(d, pool, stream, seg_size, rounded, true, &b);
  if (st == GCA_ERR_OUT_OF_MEMORY) {
    bool released = false;
    gca_status_t rst = release_available(d, pool, stream, rounded, &released);
    if (rst != GCA_OK)
      st = rst;
    else if (released)
      st = gca__segment_alloc(d, pool, stream, seg_size, rounded, false, &b);
  }
  if (st == GCA_ERR_OUT_OF_MEMORY && d->ncaptures == 0) {
    gca_status_t rst = gca__release_cached(d);
    st = rst != GCA_OK ? rst : gca__segment_alloc(d, pool, stream, seg_size, rounded, true, &b);
  }
  /* memory another thread is giving back is not gone: wait for it and retry */
  while (st == GCA_ERR_OUT_OF_MEMORY && wait_release(d))
    st = gca__segment_alloc(d, pool, stream, seg_size, rounded, true, &b);
out:
  gca__unrelax(d->ops, relaxed, mode);
  if (st == GCA_ERR_OUT_OF_MEMORY && pool->owner == NULL && d->mempools != NULL &&
      (b = take_on_oom(d, stream, rounded)) != NULL)
    st = GCA_OK;
  if (owner != NULL) /* not gca__mempool_unuse: b, still free, is about to become active */
    owner->use_count--;
  if (st == GCA_OK)
    *out = b;
  return st;
}
