/* SPDX-License-Identifier: Apache-2.0 */
/* segment.c - classic segments: one device allocation each (mem_alloc, or one
 * mem_create handle when ipc_handles is on), linked into its pool, carved into
 * blocks by the floors above, given back whole; and the two entry points that
 * pick a segment's kind: a new segment for a request, and the release of one.
 *
 * The one idea: a segment enters and leaves the pool's list, the reserved
 * count, the owner map and the statistics in one place each, whichever kind it
 * is: classic here, expandable in expandable.c, their driver steps in vmm.c.
 *
 * Note [VMM-backed classic segments]. With ipc_handles:True a classic segment
 * is one mem_create handle of the segment's size, reserved and mapped once at
 * offset 0 (seg->maps[0], nmaps == 1, expandable false), instead of a
 * mem_alloc allocation, so that gca_ipc_export can hand it to another process
 * as a file descriptor. It behaves as any classic segment: it never grows,
 * counts one num_device_alloc / num_device_free, and is released whole.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "alloc_core.h"
#include "expandable.h"
#include "history.h"

/* Reserves, maps and opens [*out, *out + size) for d's device and its peers
 * (vmm.c), recording the handle in seg->maps; on failure nothing is left. */
static gca_status_t vmm_segment_create(gca__devalloc_t *d, gca__segment_t *seg, size_t size,
                                       gca_devptr_t *out) {
  gca_status_t st;
  gca_memhandle_t h = 0;
  gca_devptr_t ptr = 0;
  gca__mapping_t *m = calloc(1, sizeof(*m));
  if (m == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for a segment mapping");
  GCA_CHECK_GOTO(d->ops->mem_address_reserve(d->device, size, 0, &ptr), st, fail_rec);
  GCA_CHECK_GOTO(gca__vmm_map_new(d, ptr, size, &h), st, fail_range);
  m->offset = 0;
  m->size = size;
  m->handle = h;
  seg->maps = m;
  seg->nmaps = seg->cap_maps = 1;
  *out = ptr;
  return GCA_OK;

fail_range:
  GCA_CHECK_IGNORE(d->ops->mem_address_free(d->device, ptr, size));
fail_rec:
  free(m);
  return st;
}

gca_status_t gca__segment_stream_sync(gca__devalloc_t *d, const gca__segment_t *seg) {
  if (seg->stream_gone) /* Note [Destroyed streams] */
    return d->ops->ctx_synchronize(d->device);
  return gca__stream_synchronize(d, seg->stream);
}

gca_status_t gca__segment_memory_free(gca__devalloc_t *d, gca__segment_t *seg, bool sync) {
  bool unmapped;
  if (seg->maps == NULL)
    return d->ops->mem_free(d->device, seg->base);
  if (sync)
    GCA_CHECK(gca__segment_stream_sync(d, seg));
  gca_status_t st = gca__vmm_unmap(d, seg->base, seg->size, seg->maps[0].handle, &unmapped);
  if (!unmapped)
    return st;
  if (st == GCA_OK)
    st = d->ops->mem_address_free(d->device, seg->base, seg->size);
  if (st != GCA_OK)
    GCA_LOG_WARN("segment 0x%" PRIx64 " (%zu bytes) unmapped but not fully released: %s", seg->base,
                 seg->size, gca_last_error());
  free(seg->maps);
  seg->maps = NULL;
  seg->nmaps = seg->cap_maps = 0;
  return GCA_OK;
}

gca_status_t gca__observe(gca__pool_t *pool, gca_segment_event_t ev, gca_devptr_t base,
                          size_t bytes) {
  static const char *const names[] = {"created", "releasing", "mapped", "unmapping"};
  gca__mempool_t *m = pool->owner;
  if (m == NULL || m->observer == NULL)
    return GCA_OK;
  gca_status_t st =
      m->observer(ev, pool->dev->device, (void *)(uintptr_t)base, bytes, m->observer_ctx);
  if (st == GCA_OK)
    return GCA_OK;
  if (ev == GCA_SEGMENT_CREATED || ev == GCA_SEGMENT_MAPPED)
    return gca__error_prefix(st, "segment observer (%s 0x%" PRIx64 ", %zu bytes)", names[ev], base,
                             bytes);
  GCA_LOG_WARN("segment observer (%s 0x%" PRIx64 ", %zu bytes) failed: %s", names[ev], base, bytes,
               gca_last_error());
  return GCA_OK;
}

/* A new classic segment of `size` bytes; its single block is returned free
 * and outside the tree. */
static gca_status_t classic_alloc(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                  size_t size, gca__block_t **out) {
  gca_status_t st;
  gca_devptr_t ptr = 0;
  if (d->cfg.ipc_handles) {
    size_t g;
    GCA_CHECK(gca__vmm_granularity(d, &g));
    size = (size + g - 1) & ~(g - 1);
  }
  GCA_CHECK(gca__limit_check(d, size, "a segment"));
  gca__segment_t *seg = calloc(1, sizeof(*seg));
  if (seg == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "malloc: host out of memory for a segment record");
  if (d->cfg.ipc_handles) {
    GCA_CHECK_GOTO(vmm_segment_create(d, seg, size, &ptr), st, fail_seg);
  } else if (d->cfg.release_lock_on_device_alloc && pool->owner == NULL && d->ncaptures == 0) {
    /* PyTorch's release_lock_on_cudamalloc: other threads use the cache while
     * the driver allocates; the bytes count against the limit meanwhile. The
     * new segment is this thread's alone until it is linked in below. */
    d->reserving += size;
    gca__dev_let_go(d);
    st = d->ops->mem_alloc(d->device, size, &ptr);
    gca__dev_lock(d);
    d->reserving -= size;
    GCA_CHECK_GOTO(st, st, fail_seg);
  } else {
    GCA_CHECK_GOTO(d->ops->mem_alloc(d->device, size, &ptr), st, fail_seg);
  }
  seg->base = ptr;
  seg->size = size;
  seg->stream = stream;
  GCA_CHECK_GOTO(gca__observe(pool, GCA_SEGMENT_CREATED, ptr, size), st, fail_mem);
  /* block_reserve after the driver call: the lock may have been let go */
  if ((st = gca__block_reserve(d)) != GCA_OK ||
      (st = gca__owner_add(ptr, size, d->device)) != GCA_OK)
    goto fail_observed;
  gca__block_t *b = gca__block_take(d);
  b->addr = ptr;
  b->size = size;
  b->stream = stream;
  b->pool = pool;
  b->seg = seg;
  seg->pool = pool;
  seg->head = b;
  seg->oversize = size >= d->cfg.max_split_size;
  gca__segment_link(pool, seg);
  d->reserved += size;
  gca__stat_pool(d, d->stats.segment, pool, 1);
  gca__stat_pool(d, d->stats.reserved_bytes, pool, (int64_t)size);
  if (seg->oversize)
    gca__stat_add(d, &d->stats.oversize_segments, 1);
  d->stats.num_device_alloc++;
  if (seg->maps == NULL) { /* VMM-backed ones count in vmm.c */
    d->stats.num_driver_calls++;
    d->stats.grown_bytes += (int64_t)size;
  }
  gca__history_event(GCA_HA_SEGMENT_ALLOC, d->device, ptr, size, stream);
  *out = b;
  return GCA_OK;

fail_observed:
  GCA_CHECK_IGNORE(gca__observe(pool, GCA_SEGMENT_RELEASING, ptr, size));
fail_mem:
  /* the driver's free waits for the device (Note [No waits under the device
   * lock]); the new segment is this thread's alone, so the lock can go, as
   * for release_lock_on_cudamalloc, except while a capture is under way */
  if (d->ncaptures == 0) {
    gca__dev_let_go(d);
    GCA_CHECK_IGNORE(gca__segment_memory_free(d, seg, false));
    gca__dev_lock(d);
  } else {
    GCA_CHECK_IGNORE(gca__segment_memory_free(d, seg, false));
  }
fail_seg:
  free(seg);
  return st;
}

gca_status_t gca__segment_alloc(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                                size_t size, size_t rounded, bool retry, gca__block_t **out) {
  if (retry)
    d->stats.num_alloc_retries++;
  if (d->cfg.expandable_segments)
    return gca__expand_alloc(d, pool, stream, rounded, size, out);
  return classic_alloc(d, pool, stream, size, out);
}

void gca__segment_destroy(gca__devalloc_t *d, gca__segment_t *seg) {
  for (gca__block_t *b = seg->head; b != NULL; b = b->next)
    free(b->uses);
  if (seg->expandable) {
    gca__expand_destroy(d, seg);
  } else {
    GCA_CHECK_IGNORE(gca__observe(seg->pool, GCA_SEGMENT_RELEASING, seg->base, seg->size));
    GCA_CHECK_IGNORE(gca__segment_memory_free(d, seg, false));
    gca__owner_remove(seg->base, seg->size, d->device);
    /* a failed unmap left them: the memory is lost, not the records */
    gca__segment_maps_forget(seg);
  }
  free(seg);
}

void gca__segment_maps_forget(gca__segment_t *seg) {
  free(seg->maps);
  seg->maps = NULL;
  seg->nmaps = seg->cap_maps = 0;
}

/* ---- release batches (Note [No waits under the device lock]) ---- */

/* Adds releasing block b of seg to bt (room made by the caller). */
static void batch_add(gca__relbatch_t *bt, gca__segment_t *seg, gca__block_t *b, size_t bytes) {
  gca__tree_erase(b->pool, b);
  b->releasing = true;
  bt->v[bt->n++] = (gca__relent_t){.seg = seg,
                                   .b = b,
                                   .lo = b->addr - seg->base,
                                   .hi = b->addr - seg->base + b->size,
                                   .st = GCA_OK,
                                   .expandable = seg->expandable};
  bt->bytes += bytes;
}

gca_status_t gca__relbatch_take(gca__devalloc_t *d, gca__relbatch_t *bt, gca__segment_t *seg) {
  if (seg->expandable)
    return gca__expand_take(d, bt, seg);
  if (!gca__block_whole(seg->head) || !seg->head->in_tree)
    return GCA_OK;
  GCA_CHECK(gca__relbatch_room(bt, 1));
  batch_add(bt, seg, seg->head, seg->size);
  return GCA_OK;
}

gca_status_t gca__relbatch_room(gca__relbatch_t *bt, size_t more) {
  if (bt->n + more <= bt->cap)
    return GCA_OK;
  size_t ncap = bt->cap ? bt->cap * 2 : 8;
  while (ncap < bt->n + more)
    ncap *= 2;
  gca__relent_t *v = realloc(bt->v, ncap * sizeof(*v));
  if (v == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "release: host out of memory for a release batch");
  bt->v = v;
  bt->cap = ncap;
  return GCA_OK;
}

void gca__relbatch_add(gca__relbatch_t *bt, gca__segment_t *seg, gca__block_t *b, size_t bytes) {
  batch_add(bt, seg, b, bytes);
}

/* Waits for s's work; when s is gone (destroyed: `gone`, Note [Destroyed
 * streams]; or a handle the sim calls stale) for the whole device instead,
 * once (*dev_synced).
 * Note [Releases during a capture]: a stream that is capturing (on any thread,
 * possibly before the allocator was told of the capture) may not be
 * synchronized, and synchronizing it would invalidate the capture; its
 * segments are kept cached instead (GCA_ERR_NOT_READY: kept, not a failure). */
/* Note [Capture gate] (device.c): a wait the allocator makes for itself runs
 * with this thread's capture mode relaxed (gca__relax), so that a global-mode
 * capture on another thread neither refuses it nor is invalidated by it (H200,
 * driver 580: stream synchronize, event query and mem_free are then
 * permitted; ctx_synchronize never is, so that one goes through the gate). */
static gca_status_t stream_wait(gca__devalloc_t *d, const gca__relbatch_t *bt, gca_stream_t s,
                                bool gone, bool *dev_synced) {
  if (*dev_synced)
    return GCA_OK;
  gca_status_t st;
  if (!gone) {
    gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
    if (s != NULL && !gca__stream_is_ptds(s) &&
        d->ops->stream_capture_info(s, &cs, NULL) == GCA_OK && cs != GCA_CAPTURE_STATUS_NONE)
      return GCA_ERR_NOT_READY;
    gca_capture_mode_t mode;
    bool relaxed = gca__relax(d->ops, &mode);
    st = gca__stream_synchronize(d, s); /* Note [Per-thread stream keys] */
    gca__unrelax(d->ops, relaxed, mode);
    if (st != GCA_ERR_INVALID_HANDLE)
      return st;
  }
  /* synchronizing the device while one of its streams captures would fail
   * and invalidate that capture: keep the segment until none does. The
   * allocator hears of a capture only once it is routed to a pool, after the
   * stream began capturing; the device table counts it from its start. */
  if (bt->captures || !gca__device_wait_enter()) /* Note [Capture gate] (device.c) */
    return GCA_ERR_NOT_READY;
  st = d->ops->ctx_synchronize(d->device);
  gca__device_wait_leave();
  *dev_synced = st == GCA_OK;
  return st;
}

void gca__relbatch_wait(gca__devalloc_t *d, gca__relbatch_t *bt) {
  bool dev_synced = false;
  for (size_t i = 0; i < bt->n; i++) {
    gca__relent_t *e = &bt->v[i];
    gca__segment_t *seg = e->seg;
    if (!seg->expandable && seg->maps == NULL) {
      /* mem_free synchronizes the device first: not while a capture is routed
       * here, and in relaxed mode (gca__relax); the observer's pool is fixed */
      if (bt->captures) {
        e->st = GCA_ERR_NOT_READY; /* kept: Note [Releases during a capture] */
        continue;
      }
      GCA_CHECK_IGNORE(gca__observe(seg->pool, GCA_SEGMENT_RELEASING, seg->base, seg->size));
      gca_capture_mode_t mode;
      bool relaxed = gca__relax(d->ops, &mode);
      e->st = d->ops->mem_free(d->device, seg->base);
      gca__unrelax(d->ops, relaxed, mode);
      continue;
    }
    if (e->safe) { /* no queued work uses it (Note [Move horizons]) */
      e->st = GCA_OK;
      continue;
    }
    bool seen = false; /* one wait per stream */
    for (size_t k = 0; k < i && !seen; k++)
      seen = bt->v[k].seg->stream == seg->stream && bt->v[k].st == GCA_OK && !bt->v[k].safe &&
             (bt->v[k].seg->expandable || bt->v[k].seg->maps != NULL);
    bool waited =
        seg->gone_waited || (seg->stream_gone && seg->stream == bt->waited && bt->waited != NULL);
    e->st =
        seen || waited ? GCA_OK : stream_wait(d, bt, seg->stream, seg->stream_gone, &dev_synced);
    if (e->st != GCA_OK || seg->expandable)
      continue;
    GCA_CHECK_IGNORE(gca__observe(seg->pool, GCA_SEGMENT_RELEASING, seg->base, seg->size));
    bool unmapped;
    e->st = gca__vmm_unmap(d, seg->base, seg->size, seg->maps[0].handle, &unmapped);
    if (!unmapped)
      continue;
    if (e->st == GCA_OK)
      e->st = d->ops->mem_address_free(d->device, seg->base, seg->size);
    if (e->st != GCA_OK)
      GCA_LOG_WARN("segment 0x%" PRIx64 " (%zu bytes) unmapped but not fully released: %s",
                   seg->base, seg->size, gca_last_error());
    e->st = GCA_OK; /* once unmapped the memory is gone */
  }
}

gca_status_t gca__relbatch_finish_classic(gca__devalloc_t *d, gca__relent_t *e, size_t *released) {
  gca__segment_t *seg = e->seg;
  gca__block_t *b = e->b;
  gca__pool_t *pool = seg->pool;
  b->releasing = false;
  if (e->st == GCA_ERR_NOT_READY) { /* Note [Releases during a capture] */
    gca__tree_insert(pool, b);
    return GCA_OK;
  }
  if (e->st != GCA_OK) {
    gca__tree_insert(pool, b);
    return gca__error_prefix(e->st, "release of segment 0x%" PRIx64 " (%zu bytes)", seg->base,
                             seg->size);
  }
  if (seg->maps == NULL) /* mem_free; VMM-backed ones count in vmm.c */
    d->stats.num_driver_calls++;
  gca__segment_maps_forget(seg);
  gca__owner_remove(seg->base, seg->size, d->device);
  gca__block_free(d, b);
  gca__segment_unlink(pool, seg);
  d->reserved -= seg->size;
  gca__stat_pool(d, d->stats.segment, pool, -1);
  gca__stat_pool(d, d->stats.reserved_bytes, pool, -(int64_t)seg->size);
  if (seg->oversize)
    gca__stat_add(d, &d->stats.oversize_segments, -1);
  d->stats.num_device_free++;
  gca__history_event(GCA_HA_SEGMENT_FREE, d->device, seg->base, seg->size, seg->stream);
  if (released != NULL)
    *released += seg->size;
  free(seg);
  return GCA_OK;
}

bool gca__segments_stuck_bytes(gca__devalloc_t *d, size_t *out) {
  size_t stuck = 0;
  *out = 0;
  if (d->live_blocks > GCA__STUCK_WALK_MAX)
    return false;
  for (gca__pool_t *p = &d->small; p != NULL; p = gca__pool_next(d, p)) {
    for (const gca__segment_t *seg = p->segments; seg != NULL; seg = seg->next) {
      size_t free_bytes = 0;
      bool used = false;
      for (const gca__block_t *b = seg->head; b != NULL; b = b->next) {
        if (b->unmapped || b->releasing) /* no memory, or on its way back */
          continue;
        if (!b->in_tree && !b->cached && !b->binned) {
          used = true;
        } else if (seg->expandable) {
          size_t lo = b->addr - seg->base;
          stuck += b->size - gca__expand_mapped_inside(seg, lo, lo + b->size);
        } else {
          free_bytes += b->size;
        }
      }
      if (used)
        stuck += free_bytes;
    }
  }
  *out = stuck;
  return true;
}
