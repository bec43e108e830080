/* SPDX-License-Identifier: Apache-2.0 */
/* mempool.c - a private pool's memory over its life: once it is dying and
 * idle it is left for the reap (release.c: segments released through a
 * release batch, record freed here by gca__mempool_forget), and its
 * expandable segments' memory can be given back (suspend) and mapped again
 * at the same addresses (resume).
 *
 * The one idea: what happens to a private pool's memory is decided here,
 * below the frees that trigger it (a private pool's last block freed, in
 * blocks.c) and above the segments it releases; handles, use counts and
 * routing stay in pool.c, which calls down here.
 *
 * Suspending a pool releases the memory of its expandable segments' mappings
 * but keeps the segments, their maps[] (as places to map again) and every
 * block as they were: to the allocator a suspended pool looks unchanged, only
 * reserved_bytes drops and routing to it is refused until the resume.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "alloc_core.h"
#include "expandable.h"
#include "gca/pool.h"

/* ---- lifetime ---- */

bool gca__mempool_reapable(const gca__devalloc_t *d, const gca__mempool_t *m) {
  return m->use_count == 0 && m->nactive == 0 && !m->destroying && d->ncaptures == 0;
}

void gca__mempool_forget(gca__devalloc_t *d, gca__mempool_t *m) {
  GCA_ASSERT(m->nactive == 0 && m->use_count == 0 && m->small.segments == NULL &&
             m->large.segments == NULL);
  if (m->prev != NULL)
    m->prev->next = m->next;
  else
    d->mempools = m->next;
  if (m->next != NULL)
    m->next->prev = m->prev;
  gca__tree_fini(&m->small);
  gca__tree_fini(&m->large);
  if (m->observer_done != NULL)
    m->observer_done(m->observer_ctx);
  free(m);
}

/* A dying pool that became idle is destroyed by the reap at the end of the
 * entry point (release.c): here, deep in a free or a route's removal, the
 * lock cannot be let go for the waits (Note [No waits under the device lock]). */
static void maybe_destroy(gca__devalloc_t *d, gca__mempool_t *m) {
  if (gca__mempool_reapable(d, m))
    d->reap = true;
}

void gca__mempool_sweep_dying(gca__devalloc_t *d) {
  for (gca__mempool_t *m = d->mempools, *next; m != NULL; m = next) {
    next = m->next;
    maybe_destroy(d, m);
  }
}

void gca__mempool_unuse(gca__devalloc_t *d, gca__mempool_t *m) {
  GCA_ASSERT(m->use_count > 0);
  if (--m->use_count == 0)
    maybe_destroy(d, m);
}

void gca__mempool_block_freed(gca__devalloc_t *d, gca__mempool_t *m) {
  GCA_ASSERT(m->nactive > 0);
  if (--m->nactive == 0)
    maybe_destroy(d, m);
}

/* ---- accounting and teardown ---- */

size_t gca__pool_bytes(const gca__pool_t *p, bool allocated_only) {
  size_t n = 0;
  for (const gca__segment_t *s = p->segments; s != NULL; s = s->next) {
    if (!allocated_only) {
      n += s->suspended ? 0 : s->size;
      continue;
    }
    for (const gca__block_t *b = s->head; b != NULL; b = b->next)
      if (b->allocated)
        n += b->size;
  }
  return n;
}

size_t gca__mempools_reserved_locked(const gca__devalloc_t *d) {
  size_t n = 0;
  for (const gca__mempool_t *m = d->mempools; m != NULL; m = m->next)
    n += gca__pool_bytes(&m->small, false) + gca__pool_bytes(&m->large, false);
  return n;
}

void gca__mempools_destroy_locked(gca__devalloc_t *d) {
  for (gca__mempool_t *m = d->mempools, *next; m != NULL; m = next) {
    next = m->next;
    gca__pool_t *pools[2] = {&m->small, &m->large};
    for (size_t i = 0; i < m->nsusp; i++)
      free(m->susp[i].copy);
    free(m->susp);
    for (int k = 0; k < 2; k++) {
      for (gca__segment_t *s = pools[k]->segments, *snext; s != NULL; s = snext) {
        snext = s->next;
        if (s->suspended)
          s->nmaps = 0; /* nothing mapped to unmap or release */
        gca__segment_destroy(d, s);
      }
      gca__tree_fini(pools[k]);
    }
    if (m->observer_done != NULL)
      m->observer_done(m->observer_ctx);
    free(m);
  }
  d->mempools = NULL;
  free(d->routes);
  d->routes = NULL;
  d->nroutes = d->cap_routes = 0;
  atomic_store(&d->routing, 0);
  d->ncaptures = 0;
  free(d->deferred);
  d->deferred = NULL;
  d->ndeferred = d->cap_deferred = 0;
}

/* ---- suspend and resume ---- */

static void suspended_account(gca__devalloc_t *d, gca__segment_t *seg, bool suspended) {
  int64_t n = suspended ? -(int64_t)seg->size : (int64_t)seg->size;
  seg->suspended = suspended;
  d->reserved = (size_t)((int64_t)d->reserved + n);
  gca__stat_pool(d, d->stats.reserved_bytes, seg->pool, n);
}

/* Note [Suspend and resume with the lock let go]. Suspend and resume wait for
 * queued work (the device before the copies out, the copies themselves), and
 * a host function queued on that work may call gca_free, which takes the
 * device lock (Note [No waits under the device lock]). So the records
 * (m->susp) are made under the lock, then m is marked busy (m->transition)
 * and holds a use, the lock is let go for the whole device work (waits,
 * copies, unmaps, maps), and it is retaken to finish: the mapping handles,
 * the accounting and m->suspended. Meanwhile other threads may:
 *  - free blocks of m, or complete their pending frees: that changes only
 *    blocks and free trees, never a segment or a mapping, since every path
 *    that gives memory back skips a busy pool (the reap: m holds a use; with
 *    caching off: release.c checks transition) and the paths that map or
 *    unmap for an allocation are not reached (next item);
 *  - allocate: a request routed to m fails ("... is being suspended"), and
 *    no OOM borrow takes from m's trees (release.c); other pools work;
 *  - call gca_pool_suspend, _resume, _checkpoint or _restore on m: refused
 *    (gca__mempool_settled), so m->susp and its map indices stay ours;
 *  - release m's last handle: m holds a use, so it is destroyed by the reap
 *    only after the transition ends (gca__mempool_unuse).
 * The unlocked work reads only the segments' base, maps[] offsets and sizes
 * and streams, which nothing changes while m is busy, and writes only the
 * records (r->handle); maps[].handle is written back under the lock. Until
 * then the statistics still count the memory being released (or not yet the
 * memory being mapped). */

gca_status_t gca__mempool_settled(const char *op, const gca__mempool_t *m) {
  if (m->transition == NULL)
    return GCA_OK;
  return gca__error(GCA_ERR_INVALID_STATE, "%s: pool %#" PRIx64 " is being %s; try again after", op,
                    m->handle, m->transition);
}

/* Marks m busy, takes a use of it and lets the lock go. */
static void transition_begin(gca__devalloc_t *d, gca__mempool_t *m, const char *what) {
  m->transition = what;
  m->use_count++;
  gca__dev_let_go(d);
}

/* Retakes the lock, writes the records' handles back and ends the busy mark;
 * a pool left dying and idle meanwhile goes to the reap (d->reap). */
static void transition_end(gca__devalloc_t *d, gca__mempool_t *m) {
  gca__dev_lock(d);
  for (size_t i = 0; i < m->nsusp; i++)
    m->susp[i].seg->maps[m->susp[i].map].handle = m->susp[i].handle;
  m->transition = NULL;
  gca__mempool_unuse(d, m);
}

/* Queues a copy for seg's contents on seg's stream, or when that stream was
 * destroyed (Note [Destroyed streams]) on the legacy stream of seg's device,
 * which gca__segment_stream_sync then waits for with the device. */
static gca_status_t copy_for(gca__devalloc_t *d, const gca__segment_t *seg, gca_devptr_t dst,
                             gca_devptr_t src, size_t bytes) {
  if (!seg->stream_gone)
    return d->ops->memcpy_async(dst, src, bytes, seg->stream);
  int cur = d->device;
  GCA_CHECK(d->ops->ctx_get_device(&cur));
  if (cur != d->device)
    GCA_CHECK(d->ops->ctx_set_device(d->device));
  gca_status_t st = d->ops->memcpy_async(dst, src, bytes, NULL);
  if (cur != d->device) {
    gca_status_t rst = d->ops->ctx_set_device(cur);
    if (st == GCA_OK)
      st = rst;
  }
  return st;
}

/* Unmaps and releases the memory of record r (contents already saved). No
 * lock held (Note [Suspend and resume with the lock let go]). */
static gca_status_t release_one(gca__devalloc_t *d, struct gca__suspended *r) {
  const gca__mapping_t *mp = &r->seg->maps[r->map];
  gca_devptr_t ptr = r->seg->base + mp->offset;
  gca_status_t st = d->ops->mem_unmap(ptr, mp->size);
  if (st == GCA_OK) {
    /* unmapped: the memory goes with the last mapping */
    GCA_CHECK_IGNORE(d->ops->mem_release(r->handle));
    r->handle = 0;
  }
  return st;
}

/* Maps fresh memory for record r and copies its contents back (queued on the
 * segment's stream). On failure nothing stays mapped. No lock held. */
static gca_status_t map_one(gca__devalloc_t *d, struct gca__suspended *r) {
  const gca__mapping_t *mp = &r->seg->maps[r->map];
  gca_devptr_t ptr = r->seg->base + mp->offset;
  gca_memhandle_t h;
  gca_status_t st;
  GCA_CHECK(gca__vmm_map_new(d, ptr, mp->size, &h));
  if (r->copy != NULL)
    GCA_CHECK_GOTO(copy_for(d, r->seg, ptr, (gca_devptr_t)(uintptr_t)r->copy, mp->size), st,
                   fail_unmap);
  r->handle = h;
  return GCA_OK;

fail_unmap:
  GCA_CHECK_IGNORE(d->ops->mem_unmap(ptr, mp->size));
  GCA_CHECK_IGNORE(d->ops->mem_release(h));
  return st;
}

/* Waits for the copies queued on the streams of m's suspended segments. No
 * lock held. */
static gca_status_t sync_copies(gca__devalloc_t *d, gca__mempool_t *m) {
  for (size_t i = 0; i < m->nsusp; i++)
    if (i == 0 || m->susp[i].seg->stream != m->susp[i - 1].seg->stream)
      GCA_CHECK(gca__segment_stream_sync(d, m->susp[i].seg));
  return GCA_OK;
}

/* Waits for every copy queued on m's streams before their host buffers are
 * freed or their device memory unmapped on a failure path. A failed
 * synchronize leaves the copies queued all the same, so it falls back to the
 * whole device; false when that fails too (a broken device: the caller must
 * then leak rather than free what a copy may still touch). No lock held. */
static bool drain_copies(gca__devalloc_t *d, gca__mempool_t *m) {
  if (sync_copies(d, m) == GCA_OK)
    return true;
  if (d->ops->ctx_synchronize(d->device) == GCA_OK)
    return true;
  GCA_LOG_ERR("pool: cannot wait for the copies of pool %#" PRIx64
              " on device %d; their memory is left in place",
              m->handle, d->device);
  return false;
}

static void susp_free(gca__mempool_t *m) {
  for (size_t i = 0; i < m->nsusp; i++)
    free(m->susp[i].copy);
  free(m->susp);
  m->susp = NULL;
  m->nsusp = 0;
}

/* The device work of a resume, no lock held: maps every record again and
 * waits for the copies back; on failure unmaps what it mapped. */
static gca_status_t resume_unlocked(gca__devalloc_t *d, gca__mempool_t *m) {
  gca_status_t st = GCA_OK;
  size_t i;
  for (i = 0; i < m->nsusp; i++) {
    st = map_one(d, &m->susp[i]);
    if (st != GCA_OK)
      break;
  }
  if (st == GCA_OK)
    st = sync_copies(d, m);
  if (st != GCA_OK) {
    char why[512];
    snprintf(why, sizeof(why), "%s", gca_last_error());
    if (drain_copies(d, m)) /* copies back may still target what we unmap */
      for (size_t k = 0; k < i && k < m->nsusp; k++)
        GCA_CHECK_IGNORE(release_one(d, &m->susp[k]));
    gca__error(st, "%s", why);
  }
  return st;
}

/* Note [Suspend and resume during captures]: a suspend waits for the whole
 * device, and both wait for their copies' streams (the whole device when a
 * stream is gone): during a capture, on any thread, the driver refuses such
 * waits and invalidates the capture. So both run inside the capture gate
 * (Note [Capture gate], device.c), and while a capture runs they fail with
 * GCA_ERR_CAPTURE_UNSUPPORTED and change nothing (a dying pool's reap tries
 * again later). */
static gca_status_t capture_refusal(const char *op, const gca__mempool_t *m) {
  return gca__error(GCA_ERR_CAPTURE_UNSUPPORTED,
                    "pool_%s: pool %#" PRIx64 ": a stream capture is under way, which the device "
                    "waits of a %s would invalidate; try again once it has ended",
                    op, m->handle, op);
}

gca_status_t gca__mempool_resume_locked(gca__devalloc_t *d, gca__mempool_t *m) {
  if (!gca__device_wait_enter())
    return capture_refusal("resume", m);
  transition_begin(d, m, "resumed");
  gca_status_t st = resume_unlocked(d, m);
  gca__device_wait_leave();
  transition_end(d, m);
  if (st != GCA_OK)
    return gca__error_prefix(st, "pool_resume: pool %#" PRIx64 " stays suspended", m->handle);
  for (size_t k = 0; k < m->nsusp; k++)
    if (m->susp[k].seg->suspended)
      suspended_account(d, m->susp[k].seg, false);
  gca__pool_t *pools[2] = {&m->small, &m->large};
  for (int k = 0; k < 2; k++)
    for (gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next)
      if (s->suspended)
        suspended_account(d, s, false); /* nothing was mapped in it */
  susp_free(m);
  m->suspended = false;
  return GCA_OK;
}

/* The device work of a suspend, no lock held: waits for the device, copies
 * the contents out when saved, waits for the copies and releases every
 * mapping; a failed release maps back what was released. *copies_queued:
 * whether copies may have been queued (a failure must then drain them). */
static gca_status_t suspend_unlocked(gca__devalloc_t *d, gca__mempool_t *m, void *pool,
                                     bool *copies_queued) {
  size_t n = m->nsusp;
  GCA_CHECK(d->ops->ctx_synchronize(d->device));
  *copies_queued = true;
  for (size_t i = 0; i < n; i++) {
    struct gca__suspended *r = &m->susp[i];
    if (r->copy == NULL)
      continue;
    const gca__mapping_t *mp = &r->seg->maps[r->map];
    GCA_CHECK(
        copy_for(d, r->seg, (gca_devptr_t)(uintptr_t)r->copy, r->seg->base + mp->offset, mp->size));
  }
  GCA_CHECK(sync_copies(d, m));
  for (size_t i = 0; i < n; i++) {
    gca_status_t st = release_one(d, &m->susp[i]);
    if (st != GCA_OK) {
      for (size_t k = 0; k < i; k++) /* map back what was released; contents from the copies */
        if (map_one(d, &m->susp[k]) != GCA_OK || m->susp[k].copy == NULL)
          GCA_LOG_ERR("pool_suspend: 0x%" PRIx64 " of pool %p lost its contents on the undo",
                      m->susp[k].seg->base + m->susp[k].seg->maps[m->susp[k].map].offset, pool);
      return st;
    }
  }
  return GCA_OK;
}

gca_status_t gca__mempool_suspend_locked(gca__devalloc_t *d, gca__mempool_t *m, unsigned flags) {
  gca_status_t st = GCA_OK;
  size_t n = 0, i = 0;
  bool copies_queued = false, drained = true;
  void *pool = (void *)(uintptr_t)m->handle; /* the public handle, for messages */
  gca__pool_t *pools[2] = {&m->small, &m->large};
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next) {
      if (!s->expandable) {
        return gca__error(GCA_ERR_NOT_SUPPORTED,
                          "pool_suspend: segment 0x%" PRIx64 " (%zu bytes) of pool %p is a "
                          "classic segment; only expandable segments (expandable_segments:True) "
                          "can give their memory back and keep their addresses",
                          s->base, s->size, pool);
      }
      n += s->nmaps;
    }
  }
  /* Note [Suspend and resume during captures]; before the save buffers,
   * which may be as large as the pool */
  if (!gca__device_wait_enter())
    return capture_refusal("suspend", m);
  m->susp = GCA_FAILPOINT("suspend_table") ? NULL : calloc(n ? n : 1, sizeof(*m->susp));
  if (m->susp == NULL) {
    gca__device_wait_leave();
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "pool_suspend: host out of memory");
  }
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next) {
      for (size_t j = 0; j < s->nmaps; j++, i++) {
        m->susp[i] = (struct gca__suspended){.seg = s, .map = j, .handle = s->maps[j].handle};
        m->nsusp = i + 1;
        if (!(flags & GCA_POOL_SUSPEND_SAVE))
          continue;
        m->susp[i].copy = GCA_FAILPOINT("suspend_copy") ? NULL : malloc(s->maps[j].size);
        if (m->susp[i].copy == NULL) {
          st = gca__error(GCA_ERR_OUT_OF_MEMORY,
                          "host out of memory for a %zu-byte copy of 0x%" PRIx64, s->maps[j].size,
                          s->base + s->maps[j].offset);
          goto fail;
        }
      }
    }
  }
  m->nsusp = n;
  /* Note [Suspend and resume with the lock let go] */
  transition_begin(d, m, "suspended");
  st = suspend_unlocked(d, m, pool, &copies_queued);
  if (st != GCA_OK) {
    gca__error_prefix(st, "pool_suspend: pool %p", pool);
    if (copies_queued)
      drained = drain_copies(d, m);
  }
  gca__device_wait_leave();
  transition_end(d, m);
  if (st != GCA_OK)
    goto fail_drained;
  for (int k = 0; k < 2; k++)
    for (gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next)
      suspended_account(d, s, true);
  m->suspended = true;
  return GCA_OK;

fail:
  gca__device_wait_leave();
  gca__error_prefix(st, "pool_suspend: pool %p", pool);
fail_drained:
  if (!drained) {
    m->susp = NULL; /* a copy may still write into them: leaked, not freed */
    m->nsusp = 0;
  } else {
    susp_free(m);
  }
  return st;
}
