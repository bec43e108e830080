/* SPDX-License-Identifier: Apache-2.0 */
/* pool.c - private pools: their handles, use counts and public API.
 *
 * The one idea: a private pool is two more free trees (small, large) with
 * segments of their own, exactly like the default pools, so every allocation
 * rule applies unchanged; only the choice of tree differs, and that choice is
 * route.c's.
 *
 * A public handle is a name, not an address: its value is (serial << 8 |
 * device), serials are never reused, and every call looks the handle up in
 * its device's list under the device lock. A released or unknown handle is
 * therefore a status and a message, never a use-after-free.
 *
 * Routing (route.c) and a pool's memory over its life (mempool.c: destroying
 * a dying pool, suspend and resume) lie below; this file calls down to them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_core.h"
#include "gca/pool.h"

static atomic_uint_fast64_t g_serial;

static inline uint64_t handle_of(const void *pool) {
  return (uint64_t)(uintptr_t)pool;
}

/* ---- lookup and creation ---- */

gca_status_t gca__mempool_lookup(const char *op, const void *handle, gca__devalloc_t **dout,
                                 gca__mempool_t **mout) {
  uint64_t h = handle_of(handle);
  int device = (int)(h & 0xff);
  if (handle == NULL)
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: the pool handle is NULL", op);
  gca__devalloc_t *d = gca__devalloc_peek(device);
  if (d == NULL || (h >> 8) == 0 || (h >> 8) > atomic_load(&g_serial))
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: %p is not a pool handle", op, handle);
  gca__dev_lock(d);
  for (gca__mempool_t *m = d->mempools; m != NULL; m = m->next) {
    if (m->handle != h)
      continue;
    if (m->use_count == 0 || m->destroying)
      break;
    *dout = d;
    *mout = m;
    return GCA_OK;
  }
  gca__dev_unlock(d);
  return gca__error(GCA_ERR_INVALID_HANDLE,
                    "%s: pool %p (device %d) was released: its use count reached zero", op, handle,
                    device);
}

static void pool_init(gca__pool_t *p, gca__devalloc_t *d, gca__mempool_t *m, bool small,
                      bool no_split) {
  memset(p, 0, sizeof(*p));
  p->dev = d;
  p->is_small = small;
  p->no_split = no_split;
  p->owner = m;
  p->id[0] = 0;
  p->id[1] = m->handle >> 8;
}

GCA_API gca_status_t gca_pool_create(int device, const gca_pool_options_t *opts,
                                     gca_pool_t **pool) {
  gca_pool_options_t o = GCA_POOL_OPTIONS_INIT;
  if (pool == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_create: the output pointer is NULL");
  *pool = NULL;
  if (opts != NULL) {
    if (opts->size < offsetof(gca_pool_options_t, no_split) + sizeof(bool) ||
        opts->size > sizeof(o))
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "pool_create: options size %zu is not that of gca_pool_options_t (%zu); "
                        "initialize them with GCA_POOL_OPTIONS_INIT",
                        opts->size, sizeof(o));
    memcpy(&o, opts, opts->size);
  }
  /* creates the device allocator on first use, as a malloc would */
  gca_stats_t probe;
  gca_status_t st = gca_get_stats(device, &probe);
  if (st != GCA_OK)
    return gca__error_prefix(st, "pool_create");
  gca__devalloc_t *d = gca__devalloc_peek(device);
  GCA_ASSERT(d != NULL);
  gca__mempool_t *m = calloc(1, sizeof(*m));
  if (m == NULL)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "pool_create: host out of memory for a pool");
  m->dev = d;
  m->handle = (atomic_fetch_add(&g_serial, 1) + 1) << 8 | (uint64_t)device;
  m->use_count = 1;
  m->use_on_oom = o.use_on_oom;
  m->observer = o.segment_observer; /* NULL for callers whose options end before it */
  m->observer_ctx = o.observer_ctx;
  m->observer_done = o.observer_done;
  pool_init(&m->small, d, m, true, o.no_split);
  pool_init(&m->large, d, m, false, o.no_split);
  gca__dev_lock(d);
  m->next = d->mempools;
  if (d->mempools != NULL)
    d->mempools->prev = m;
  d->mempools = m;
  gca__dev_unlock(d);
  *pool = (gca_pool_t *)(uintptr_t)m->handle;
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_retain(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_retain", pool, &d, &m));
  m->use_count++;
  gca__dev_unlock(d);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_release(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_release", pool, &d, &m));
  gca__mempool_unuse(d, m);
  gca__dev_unlock(d);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_use_count(gca_pool_t *pool, int *count) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  if (count == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_use_count: the output pointer is NULL");
  GCA_CHECK(gca__mempool_lookup("pool_use_count", pool, &d, &m));
  *count = m->use_count;
  gca__dev_unlock(d);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_id(gca_pool_t *pool, uint64_t id[2]) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  if (id == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_id: the output pointer is NULL");
  GCA_CHECK(gca__mempool_lookup("pool_id", pool, &d, &m));
  id[0] = m->small.id[0];
  id[1] = m->small.id[1];
  gca__dev_unlock(d);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_memory(gca_pool_t *pool, size_t *reserved, size_t *allocated) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_memory", pool, &d, &m));
  if (reserved != NULL)
    *reserved = gca__pool_bytes(&m->small, false) + gca__pool_bytes(&m->large, false);
  if (allocated != NULL)
    *allocated = gca__pool_bytes(&m->small, true) + gca__pool_bytes(&m->large, true);
  gca__dev_unlock(d);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_begin_allocate(gca_pool_t *pool, gca_stream_filter_t filter,
                                             void *ctx) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  if (filter == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_begin_allocate: the filter is NULL");
  GCA_CHECK(gca__mempool_lookup("pool_begin_allocate", pool, &d, &m));
  gca__route_t r = {.pool = m, .kind = ROUTE_FILTER, .filter = filter, .ctx = ctx};
  gca_status_t st = gca__route_add("pool_begin_allocate", d, &r);
  gca__dev_unlock(d);
  return st;
}

GCA_API gca_status_t gca_pool_end_allocate(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  bool found = false;
  GCA_CHECK(gca__mempool_lookup("pool_end_allocate", pool, &d, &m));
  m->use_count++; /* keeps m while its routes go */
  for (size_t i = d->nroutes; i-- > 0;) {
    if (d->routes[i].pool == m && d->routes[i].kind == ROUTE_FILTER) {
      gca__route_remove(d, i);
      found = true;
    }
  }
  gca__mempool_unuse(d, m);
  gca__dev_unlock(d);
  if (!found)
    return gca__error(GCA_ERR_INVALID_STATE,
                      "pool_end_allocate: pool %p has no allocation route to end", (void *)pool);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_use_begin(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_use_begin", pool, &d, &m));
  gca_status_t st = gca__route_scope_push(d, m);
  gca__dev_unlock(d);
  return st;
}

GCA_API gca_status_t gca_pool_use_end(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_use_end", pool, &d, &m));
  gca_status_t st = gca__route_scope_pop(d, m);
  gca__dev_unlock(d);
  return st;
}

GCA_API gca_status_t gca_pool_begin_capture(gca_pool_t *pool, gca_stream_t stream) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  uint64_t id = 0;
  gca_status_t st;
  if (stream == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "pool_begin_capture: the legacy stream (NULL) cannot capture");
  GCA_CHECK(gca__mempool_lookup("pool_begin_capture", pool, &d, &m));
  st = d->ops->stream_capture_info(stream, &cs, &id);
  if (st != GCA_OK) {
    st = gca__error_prefix(st, "pool_begin_capture: stream %p", (void *)stream);
    goto out;
  }
  if (cs != GCA_CAPTURE_STATUS_ACTIVE) {
    st = gca__error(GCA_ERR_INVALID_STATE, "pool_begin_capture: stream %p is not capturing (%s)",
                    (void *)stream, cs == GCA_CAPTURE_STATUS_NONE ? "no capture" : "invalidated");
    goto out;
  }
  for (size_t i = 0; i < d->nroutes; i++) {
    if (d->routes[i].kind == ROUTE_CAPTURE && d->routes[i].capture_id == id) {
      st = gca__error(GCA_ERR_INVALID_STATE,
                      "pool_begin_capture: capture %" PRIu64 " of stream %p is already routed", id,
                      (void *)stream);
      goto out;
    }
  }
  gca__route_t r = {.pool = m, .kind = ROUTE_CAPTURE, .stream = stream, .capture_id = id};
  st = gca__route_add("pool_begin_capture", d, &r);
out:
  gca__dev_unlock(d);
  return st;
}

GCA_API gca_status_t gca_pool_end_capture(gca_pool_t *pool, gca_stream_t stream) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_end_capture", pool, &d, &m));
  for (size_t i = 0; i < d->nroutes; i++) {
    if (d->routes[i].pool == m && d->routes[i].kind == ROUTE_CAPTURE &&
        d->routes[i].stream == stream) {
      gca__route_remove(d, i);
      gca__dev_unlock(d);
      return GCA_OK;
    }
  }
  gca__dev_unlock(d);
  return gca__error(GCA_ERR_INVALID_STATE,
                    "pool_end_capture: pool %p has no capture begun on stream %p", (void *)pool,
                    (void *)stream);
}

gca_status_t gca__mempool_check_locked(const gca__devalloc_t *d, const gca__mempool_t *m) {
  size_t active = 0;
  const gca__pool_t *pools[2] = {&m->small, &m->large};
  if (m->dev != d || m->small.owner != m || m->large.owner != m || !m->small.is_small ||
      m->large.is_small)
    return gca__error(GCA_ERR_INTERNAL, "allocator_check: pool %#" PRIx64 ": bad owner links",
                      m->handle);
  for (int k = 0; k < 2; k++)
    for (const gca__segment_t *s = pools[k]->segments; s != NULL; s = s->next)
      for (const gca__block_t *b = s->head; b != NULL; b = b->next)
        active += b->allocated || b->event_count > 0;
  if (active != m->nactive)
    return gca__error(GCA_ERR_INTERNAL,
                      "allocator_check: pool %#" PRIx64 ": %zu active blocks, count says %zu",
                      m->handle, active, m->nactive);
  return GCA_OK;
}

/* ---- suspend and resume (the work: mempool.c) ---- */

GCA_API gca_status_t gca_pool_suspend(gca_pool_t *pool, unsigned flags) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  gca_status_t st;
  if ((flags & ~GCA_POOL_SUSPEND_SAVE) != 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_suspend: unknown flags %#x", flags);
  GCA_CHECK(gca__mempool_lookup("pool_suspend", pool, &d, &m));
  if ((st = gca__mempool_settled("pool_suspend", m)) != GCA_OK)
    ;
  else if (m->suspended)
    st = gca__error(GCA_ERR_INVALID_STATE, "pool_suspend: pool %p is already suspended",
                    (void *)pool);
  else if (m->observer != NULL)
    st = gca__error(GCA_ERR_NOT_SUPPORTED,
                    "pool_suspend: pool %p has a segment observer (its memory is registered; "
                    "Note [Segment observers])",
                    (void *)pool);
  else if (d->ncaptures != 0)
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "pool_suspend: a capture is under way on device %d%s; end it first", d->device,
                    gca__mempool_capturing_locked(d, m) ? " into this pool" : "");
  else
    st = gca__mempool_suspend_locked(d, m, flags);
  gca__dev_unlock(d);
  return st;
}

GCA_API gca_status_t gca_pool_resume(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  gca_status_t st = GCA_OK;
  GCA_CHECK(gca__mempool_lookup("pool_resume", pool, &d, &m));
  if ((st = gca__mempool_settled("pool_resume", m)) != GCA_OK)
    ;
  else if (!m->suspended)
    st = gca__error(GCA_ERR_INVALID_STATE, "pool_resume: pool %p is not suspended", (void *)pool);
  else
    st = gca__mempool_resume_locked(d, m);
  gca__dev_unlock(d);
  return st;
}
