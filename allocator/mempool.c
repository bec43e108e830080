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
    }
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
  gca__stat_pool(d->stats.reserved_bytes, seg->pool, n);
}

/* Unmaps and releases the memory of record r (contents already saved). */
static gca_status_t release_one(gca__devalloc_t *d, const struct gca__suspended *r) {
  gca__mapping_t *mp = &r->seg->maps[r->map];
  gca_devptr_t ptr = r->seg->base + mp->offset;
  gca_status_t st = d->ops->mem_unmap(ptr, mp->size);
  if (st == GCA_OK) {
    /* unmapped: the memory goes with the last mapping */
    GCA_CHECK_IGNORE(d->ops->mem_release(mp->handle));
    mp->handle = 0;
  }
  return st;
}

/* Maps fresh memory for record r and copies its contents back (queued on the
 * segment's stream). On failure nothing stays mapped. */
static gca_status_t map_one(gca__devalloc_t *d, const struct gca__suspended *r) {
  gca__mapping_t *mp = &r->seg->maps[r->map];
  gca_devptr_t ptr = r->seg->base + mp->offset;
  gca_memhandle_t h;
  gca_status_t st;
  GCA_CHECK(gca__vmm_map_new(d, ptr, mp->size, &h));
  if (r->copy != NULL)
    GCA_CHECK_GOTO(
        d->ops->memcpy_async(ptr, (gca_devptr_t)(uintptr_t)r->copy, mp->size, r->seg->stream), st,
        fail_unmap);
  mp->handle = h;
  return GCA_OK;

fail_unmap:
  GCA_CHECK_IGNORE(d->ops->mem_unmap(ptr, mp->size));
  GCA_CHECK_IGNORE(d->ops->mem_release(h));
  return st;
}

/* Waits for the copies queued on the streams of m's suspended segments. */
static gca_status_t sync_copies(gca__devalloc_t *d, gca__mempool_t *m) {
  for (size_t i = 0; i < m->nsusp; i++)
    if (i == 0 || m->susp[i].seg->stream != m->susp[i - 1].seg->stream)
      GCA_CHECK(GCA__WAIT_UNDER_LOCK(gca__stream_synchronize(d, m->susp[i].seg->stream)));
  return GCA_OK;
}

/* Waits for every copy queued on m's streams before their host buffers are
 * freed or their device memory unmapped on a failure path. A failed
 * synchronize leaves the copies queued all the same, so it falls back to the
 * whole device; false when that fails too (a broken device: the caller must
 * then leak rather than free what a copy may still touch). */
static bool drain_copies(gca__devalloc_t *d, gca__mempool_t *m) {
  if (sync_copies(d, m) == GCA_OK)
    return true;
  if (GCA__WAIT_UNDER_LOCK(d->ops->ctx_synchronize(d->device)) == GCA_OK)
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

gca_status_t gca__mempool_resume_locked(gca__devalloc_t *d, gca__mempool_t *m) {
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
    return gca__error_prefix(st, "pool_resume: pool %#" PRIx64 " stays suspended", m->handle);
  }
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

gca_status_t gca__mempool_suspend_locked(gca__devalloc_t *d, gca__mempool_t *m, unsigned flags) {
  gca_status_t st = GCA_OK;
  size_t n = 0, i = 0;
  bool copies_queued = false;
  void *pool = (void *)(uintptr_t)m->handle; /* the public handle, for messages */
  gca__pool_t *pools[2] = {&m->small, &m->large};
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next) {
      if (!s->expandable) {
        st = gca__error(GCA_ERR_NOT_SUPPORTED,
                        "pool_suspend: segment 0x%" PRIx64 " (%zu bytes) of pool %p is a classic "
                        "segment; only expandable segments (expandable_segments:True) can give "
                        "their memory back and keep their addresses",
                        s->base, s->size, (void *)pool);
        goto out;
      }
      n += s->nmaps;
    }
  }
  m->susp = calloc(n ? n : 1, sizeof(*m->susp));
  if (m->susp == NULL) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "pool_suspend: host out of memory");
    goto out;
  }
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next) {
      for (size_t j = 0; j < s->nmaps; j++, i++) {
        m->susp[i] = (struct gca__suspended){.seg = s, .map = j};
        if (!(flags & GCA_POOL_SUSPEND_SAVE))
          continue;
        m->susp[i].copy = malloc(s->maps[j].size);
        if (m->susp[i].copy == NULL) {
          m->nsusp = i + 1;
          st = gca__error(GCA_ERR_OUT_OF_MEMORY,
                          "pool_suspend: host out of memory for a %zu-byte copy of 0x%" PRIx64,
                          s->maps[j].size, s->base + s->maps[j].offset);
          goto fail;
        }
      }
    }
  }
  m->nsusp = n;
  /* suspend and resume still wait under the lock (Note [No waits under the device lock]) */
  GCA_CHECK_GOTO(GCA__WAIT_UNDER_LOCK(d->ops->ctx_synchronize(d->device)), st, fail);
  copies_queued = true; /* from here a failure waits for them (drain_copies) */
  for (i = 0; i < n; i++) {
    struct gca__suspended *r = &m->susp[i];
    if (r->copy == NULL)
      continue;
    gca__mapping_t *mp = &r->seg->maps[r->map];
    GCA_CHECK_GOTO(d->ops->memcpy_async((gca_devptr_t)(uintptr_t)r->copy, r->seg->base + mp->offset,
                                        mp->size, r->seg->stream),
                   st, fail);
  }
  GCA_CHECK_GOTO(sync_copies(d, m), st, fail);
  for (i = 0; i < n; i++) {
    st = release_one(d, &m->susp[i]);
    if (st != GCA_OK) {
      for (size_t k = 0; k < i; k++) /* map back what was released; contents from the copies */
        if (map_one(d, &m->susp[k]) != GCA_OK || m->susp[k].copy == NULL)
          GCA_LOG_ERR("pool_suspend: 0x%" PRIx64 " of pool %p lost its contents on the undo",
                      m->susp[k].seg->base + m->susp[k].seg->maps[m->susp[k].map].offset,
                      (void *)pool);
      goto fail;
    }
  }
  for (int k = 0; k < 2; k++)
    for (gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next)
      suspended_account(d, s, true);
  m->suspended = true;
  goto out;

fail:
  gca__error_prefix(st, "pool_suspend: pool %p", (void *)pool);
  if (copies_queued && !drain_copies(d, m)) {
    m->susp = NULL; /* a copy may still write into them: leaked, not freed */
    m->nsusp = 0;
  } else {
    susp_free(m);
  }
out:
  return st;
}
