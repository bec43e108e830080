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
 */
#include <stdlib.h>

#include "fcache.h"

/* Frees every cached whole segment of the pool. */
static gca_status_t pool_release_all(gca__devalloc_t *d, gca__pool_t *pool) {
  for (gca__segment_t *s = pool->segments, *next; s != NULL; s = next) {
    next = s->next;
    if (s->expandable)
      GCA_CHECK(gca__expand_release(d, s, NULL));
    else if (gca__block_whole(s->head) && s->head->in_tree)
      GCA_CHECK(gca__segment_release(d, s));
  }
  return GCA_OK;
}

gca_status_t gca__release_cached(gca__devalloc_t *d) {
  gca__fcache_flush(d);
  GCA_CHECK(gca__pending_sync(d));
  GCA_CHECK(pool_release_all(d, &d->large));
  GCA_CHECK(pool_release_all(d, &d->small));
  return GCA_OK;
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
    it = gca__tree_below(pool, stream, key);
    while (total < key && it != NULL && it->size >= msplit && it->stream == stream) {
      gca__block_t *cur = it;
      it = gca__tree_prev(pool, cur);
      if (gca__block_whole(cur)) {
        size_t sz = cur->size;
        GCA_CHECK(gca__segment_release(d, cur->seg));
        total += sz;
      }
    }
    if (total < key)
      return GCA_OK;
  } else {
    if (!gca__block_whole(it))
      return GCA_OK;
    GCA_CHECK(gca__segment_release(d, it->seg));
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
  while (reclaimed < target && freed && count > 0) {
    double age_threshold = (double)total_age / (double)count;
    freed = false;
    for (gca__segment_t *s = pool->segments, *next; s != NULL; s = next) {
      next = s->next;
      gca__block_t *b = s->head;
      if (!gca__block_whole(b) || !b->in_tree)
        continue;
      uint64_t age = pool->free_calls - b->gc_base;
      if ((double)age >= age_threshold) {
        size_t sz = s->size;
        GCA_CHECK(gca__segment_release(d, s));
        freed = true;
        reclaimed += sz;
        total_age -= age;
        count--;
      }
    }
  }
  for (gca__segment_t *s = pool->segments, *next; s != NULL && reclaimed < target; s = next) {
    next = s->next;
    if (s->expandable)
      GCA_CHECK(gca__expand_release(d, s, &reclaimed));
  }
  return GCA_OK;
}

/* Tries the free trees of the use_on_oom private pools; the block found is
 * still in its tree (Note [Tree places]). */
static gca__block_t *take_on_oom(gca__devalloc_t *d, gca_stream_t stream, size_t rounded) {
  for (gca__mempool_t *m = d->mempools; m != NULL; m = m->next) {
    if (!m->use_on_oom || m->use_count == 0 || m->suspended)
      continue;
    gca__pool_t *p = rounded <= GCA__SMALL_SIZE ? &m->small : &m->large;
    gca__block_t *b = gca__pool_take_fit(d, p, stream, rounded);
    if (b != NULL)
      return b;
  }
  return NULL;
}

gca_status_t gca__release_new_block(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                    size_t seg_size, size_t rounded, gca__block_t **out) {
  gca_status_t st;
  gca__block_t *b = NULL;
  /* a capture may be under way: segment calls must not invalidate it (PyTorch's
   * cudaMallocMaybeCapturing) */
  gca_capture_mode_t mode = GCA_CAPTURE_MODE_RELAXED;
  bool relaxed =
      GCA_UNLIKELY(d->ncaptures != 0) && d->ops->thread_exchange_capture_mode(&mode) == GCA_OK;
  if (GCA_UNLIKELY(gca__gc_enabled(d))) {
    st = garbage_collect(d);
    if (st != GCA_OK)
      goto out;
  }
  st = gca__segment_alloc(d, pool, stream, seg_size, rounded, false, &b);
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
out:
  if (GCA_UNLIKELY(relaxed))
    GCA_CHECK_IGNORE(d->ops->thread_exchange_capture_mode(&mode));
  if (st == GCA_ERR_OUT_OF_MEMORY && pool->owner == NULL && d->mempools != NULL &&
      (b = take_on_oom(d, stream, rounded)) != NULL)
    st = GCA_OK;
  if (st == GCA_OK)
    *out = b;
  return st;
}
