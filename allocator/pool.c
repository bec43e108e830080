/* pool.c - private pools: their handles and use counts, and the routes that
 * send a device's allocations to them (stream filters, per-thread scopes,
 * stream captures).
 *
 * The one idea: a private pool is two more free trees (small, large) with
 * segments of their own, exactly like the default pools, so every allocation
 * rule applies unchanged; only the choice of tree differs. That choice is
 * made under the device lock from the device's route list, and costs the hot
 * path a single relaxed load (d->routing) while no route exists.
 *
 * A public handle is a name, not an address: its value is (serial << 8 |
 * device), serials are never reused, and every call looks the handle up in
 * its device's list under the device lock. A released or unknown handle is
 * therefore a status and a message, never a use-after-free.
 *
 * Note [Frees during capture]. While a capture is under way on a device, the
 * driver forbids querying events that may belong to it, and an event recorded
 * on a capturing stream would become a graph node. So the allocator queries
 * no event then (pending frees wait), and a free of a block used on other
 * streams is parked on d->deferred with event_count = 1; when the device's
 * last capture ends the events are recorded (PyTorch's
 * insert_events_deferred_until_no_capture).
 *
 * Suspending a pool releases the memory of its expandable segments' mappings
 * but keeps the segments, their maps[] (as places to map again) and every
 * block as they were: to the allocator a suspended pool looks unchanged, only
 * reserved_bytes drops and routing to it is refused until the resume.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_core.h"
#include "gca/pool.h"

#define MAX_SCOPES 16

typedef enum route_kind { ROUTE_FILTER, ROUTE_CAPTURE } route_kind_t;

/* A route: allocations matching it go to `pool`. Holds one use of the pool. */
struct gca__route {
  gca__mempool_t *pool;
  route_kind_t kind;
  gca_stream_filter_t filter; /* ROUTE_FILTER */
  void *ctx;
  gca_stream_t stream; /* ROUTE_CAPTURE: the stream named at begin */
  uint64_t capture_id; /* ROUTE_CAPTURE: its capture */
};

static atomic_uint_fast64_t g_serial;
/* The calling thread's use scopes, innermost last; each holds one use. */
static _Thread_local gca__mempool_t *t_scopes[MAX_SCOPES];
static _Thread_local int t_nscopes;

/* A mapping released by gca_pool_suspend, with its contents when saved. */
struct gca__suspended {
  gca__segment_t *seg;
  size_t map; /* index into seg->maps */
  void *copy;
};

static inline uint64_t handle_of(const void *pool) {
  return (uint64_t)(uintptr_t)pool;
}

/* ---- lookup and lifetime ---- */

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
    if (m->use_count == 0)
      break;
    *dout = d;
    *mout = m;
    return GCA_OK;
  }
  gca__mutex_unlock(&d->lock);
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

static gca_status_t pool_resume_locked(gca__devalloc_t *d, gca__mempool_t *m);

/* Releases every segment of m and unlinks and frees it; all its blocks are
 * free (nactive == 0). On a driver failure m stays, dying, for a later try. */
static gca_status_t mempool_destroy(gca__devalloc_t *d, gca__mempool_t *m) {
  GCA_ASSERT(m->nactive == 0 && m->use_count == 0);
  if (m->suspended)
    GCA_CHECK(pool_resume_locked(d, m)); /* the release path needs mappings to unmap */
  gca__pool_t *pools[2] = {&m->small, &m->large};
  for (int k = 0; k < 2; k++) {
    for (gca__segment_t *s = pools[k]->segments, *next; s != NULL; s = next) {
      next = s->next;
      gca_status_t st = gca__segment_release(d, s);
      if (st != GCA_OK)
        return gca__error_prefix(st, "pool_release: pool %#" PRIx64, m->handle);
    }
  }
  if (m->small.segments != NULL || m->large.segments != NULL)
    return gca__error(GCA_ERR_INTERNAL,
                      "pool_release: pool %#" PRIx64 " kept segments that hold "
                      "no live block",
                      m->handle);
  if (m->prev != NULL)
    m->prev->next = m->next;
  else
    d->mempools = m->next;
  if (m->next != NULL)
    m->next->prev = m->prev;
  free(m);
  return GCA_OK;
}

/* Destroys m if it is dying and idle, and no capture forbids freeing memory. */
static void mempool_maybe_destroy(gca__devalloc_t *d, gca__mempool_t *m) {
  if (m->use_count != 0 || m->nactive != 0 || d->ncaptures != 0)
    return;
  if (mempool_destroy(d, m) != GCA_OK)
    GCA_LOG_WARN("%s (the pool's memory stays until its next free or capture end)",
                 gca_last_error());
}

static void sweep_dying(gca__devalloc_t *d) {
  for (gca__mempool_t *m = d->mempools, *next; m != NULL; m = next) {
    next = m->next;
    mempool_maybe_destroy(d, m);
  }
}

/* Drops one use of m (the caller holds d->lock). */
static void mempool_unuse(gca__devalloc_t *d, gca__mempool_t *m) {
  GCA_ASSERT(m->use_count > 0);
  if (--m->use_count == 0)
    mempool_maybe_destroy(d, m);
}

void gca__mempool_block_freed(gca__devalloc_t *d, gca__mempool_t *m) {
  GCA_ASSERT(m->nactive > 0);
  if (--m->nactive == 0)
    mempool_maybe_destroy(d, m);
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
  pool_init(&m->small, d, m, true, o.no_split);
  pool_init(&m->large, d, m, false, o.no_split);
  gca__dev_lock(d);
  m->next = d->mempools;
  if (d->mempools != NULL)
    d->mempools->prev = m;
  d->mempools = m;
  gca__mutex_unlock(&d->lock);
  *pool = (gca_pool_t *)(uintptr_t)m->handle;
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_retain(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_retain", pool, &d, &m));
  m->use_count++;
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_release(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_release", pool, &d, &m));
  mempool_unuse(d, m);
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_use_count(gca_pool_t *pool, int *count) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  if (count == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_use_count: the output pointer is NULL");
  GCA_CHECK(gca__mempool_lookup("pool_use_count", pool, &d, &m));
  *count = m->use_count;
  gca__mutex_unlock(&d->lock);
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
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

static size_t pool_bytes(const gca__pool_t *p, bool allocated_only) {
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

GCA_API gca_status_t gca_pool_memory(gca_pool_t *pool, size_t *reserved, size_t *allocated) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_memory", pool, &d, &m));
  if (reserved != NULL)
    *reserved = pool_bytes(&m->small, false) + pool_bytes(&m->large, false);
  if (allocated != NULL)
    *allocated = pool_bytes(&m->small, true) + pool_bytes(&m->large, true);
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

size_t gca__mempools_reserved_locked(const gca__devalloc_t *d) {
  size_t n = 0;
  for (const gca__mempool_t *m = d->mempools; m != NULL; m = m->next)
    n += pool_bytes(&m->small, false) + pool_bytes(&m->large, false);
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

/* ---- routes ---- */

static gca_status_t route_add(const char *op, gca__devalloc_t *d, const gca__route_t *r) {
  if (d->nroutes == d->cap_routes) {
    size_t ncap = d->cap_routes ? d->cap_routes * 2 : 4;
    gca__route_t *n = realloc(d->routes, ncap * sizeof(*n));
    if (n == NULL)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: host out of memory for a route", op);
    d->routes = n;
    d->cap_routes = ncap;
  }
  d->routes[d->nroutes++] = *r;
  r->pool->use_count++;
  if (r->kind == ROUTE_CAPTURE)
    d->ncaptures++;
  atomic_fetch_add_explicit(&d->routing, 1, memory_order_relaxed);
  return GCA_OK;
}

/* Removes route i (order kept: later routes take precedence). */
static void route_remove(gca__devalloc_t *d, size_t i) {
  gca__route_t r = d->routes[i];
  memmove(&d->routes[i], &d->routes[i + 1], (d->nroutes - i - 1) * sizeof(*d->routes));
  d->nroutes--;
  atomic_fetch_sub_explicit(&d->routing, 1, memory_order_relaxed);
  if (r.kind == ROUTE_CAPTURE && --d->ncaptures == 0) {
    gca_status_t st = gca__pending_flush_deferred(d);
    if (st != GCA_OK)
      GCA_LOG_WARN("pool_end_capture: deferred frees stay pending: %s", gca_last_error());
  }
  mempool_unuse(d, r.pool);
  if (d->ncaptures == 0)
    sweep_dying(d);
}

bool gca__mempool_capturing_locked(const gca__devalloc_t *d, const gca__mempool_t *m) {
  for (size_t i = 0; i < d->nroutes; i++)
    if (d->routes[i].pool == m && d->routes[i].kind == ROUTE_CAPTURE)
      return true;
  return false;
}

gca__mempool_t *gca__route_select_locked(gca__devalloc_t *d, gca_stream_t stream) {
  for (int i = t_nscopes - 1; i >= 0; i--)
    if (t_scopes[i]->dev == d)
      return t_scopes[i];
  bool queried = false;
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  uint64_t id = 0;
  for (size_t i = d->nroutes; i-- > 0;) {
    const gca__route_t *r = &d->routes[i];
    if (r->kind == ROUTE_FILTER) {
      if (r->filter(stream, r->ctx))
        return r->pool;
      continue;
    }
    if (stream == NULL) /* the legacy stream is never captured; asking would invalidate */
      continue;
    if (!queried) {
      queried = true;
      if (d->ops->stream_capture_info(stream, &cs, &id) != GCA_OK)
        cs = GCA_CAPTURE_STATUS_NONE;
    }
    if (cs == GCA_CAPTURE_STATUS_ACTIVE && id == r->capture_id)
      return r->pool;
  }
  return NULL;
}

GCA_API gca_status_t gca_pool_begin_allocate(gca_pool_t *pool, gca_stream_filter_t filter,
                                             void *ctx) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  if (filter == NULL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_begin_allocate: the filter is NULL");
  GCA_CHECK(gca__mempool_lookup("pool_begin_allocate", pool, &d, &m));
  gca__route_t r = {.pool = m, .kind = ROUTE_FILTER, .filter = filter, .ctx = ctx};
  gca_status_t st = route_add("pool_begin_allocate", d, &r);
  gca__mutex_unlock(&d->lock);
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
      route_remove(d, i);
      found = true;
    }
  }
  mempool_unuse(d, m);
  gca__mutex_unlock(&d->lock);
  if (!found)
    return gca__error(GCA_ERR_INVALID_STATE,
                      "pool_end_allocate: pool %p has no allocation route to end", (void *)pool);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_use_begin(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_use_begin", pool, &d, &m));
  if (t_nscopes == MAX_SCOPES) {
    gca__mutex_unlock(&d->lock);
    return gca__error(GCA_ERR_INVALID_STATE,
                      "pool_use_begin: this thread already has %d nested pool scopes", MAX_SCOPES);
  }
  t_scopes[t_nscopes++] = m;
  m->use_count++;
  atomic_fetch_add_explicit(&d->routing, 1, memory_order_relaxed);
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
}

GCA_API gca_status_t gca_pool_use_end(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_use_end", pool, &d, &m));
  if (t_nscopes == 0 || t_scopes[t_nscopes - 1] != m) {
    gca__mutex_unlock(&d->lock);
    return gca__error(GCA_ERR_INVALID_STATE,
                      "pool_use_end: pool %p is not this thread's innermost pool scope",
                      (void *)pool);
  }
  t_scopes[--t_nscopes] = NULL;
  atomic_fetch_sub_explicit(&d->routing, 1, memory_order_relaxed);
  mempool_unuse(d, m);
  gca__mutex_unlock(&d->lock);
  return GCA_OK;
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
  st = route_add("pool_begin_capture", d, &r);
out:
  gca__mutex_unlock(&d->lock);
  return st;
}

GCA_API gca_status_t gca_pool_end_capture(gca_pool_t *pool, gca_stream_t stream) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  GCA_CHECK(gca__mempool_lookup("pool_end_capture", pool, &d, &m));
  for (size_t i = 0; i < d->nroutes; i++) {
    if (d->routes[i].pool == m && d->routes[i].kind == ROUTE_CAPTURE &&
        d->routes[i].stream == stream) {
      route_remove(d, i);
      gca__mutex_unlock(&d->lock);
      return GCA_OK;
    }
  }
  gca__mutex_unlock(&d->lock);
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
      GCA_CHECK(d->ops->stream_synchronize(m->susp[i].seg->stream));
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

static gca_status_t pool_resume_locked(gca__devalloc_t *d, gca__mempool_t *m) {
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

GCA_API gca_status_t gca_pool_suspend(gca_pool_t *pool, unsigned flags) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  gca_status_t st = GCA_OK;
  size_t n = 0, i = 0;
  bool copies_queued = false;
  if ((flags & ~GCA_POOL_SUSPEND_SAVE) != 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "pool_suspend: unknown flags %#x", flags);
  GCA_CHECK(gca__mempool_lookup("pool_suspend", pool, &d, &m));
  gca__pool_t *pools[2] = {&m->small, &m->large};
  if (m->suspended) {
    st = gca__error(GCA_ERR_INVALID_STATE, "pool_suspend: pool %p is already suspended",
                    (void *)pool);
    goto out;
  }
  if (d->ncaptures != 0) {
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "pool_suspend: a capture is under way on device %d%s; end it first", d->device,
                    gca__mempool_capturing_locked(d, m) ? " into this pool" : "");
    goto out;
  }
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
  GCA_CHECK_GOTO(d->ops->ctx_synchronize(d->device), st, fail);
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
  gca__mutex_unlock(&d->lock);
  return st;
}

GCA_API gca_status_t gca_pool_resume(gca_pool_t *pool) {
  gca__devalloc_t *d;
  gca__mempool_t *m;
  gca_status_t st = GCA_OK;
  GCA_CHECK(gca__mempool_lookup("pool_resume", pool, &d, &m));
  if (!m->suspended)
    st = gca__error(GCA_ERR_INVALID_STATE, "pool_resume: pool %p is not suspended", (void *)pool);
  else
    st = pool_resume_locked(d, m);
  gca__mutex_unlock(&d->lock);
  return st;
}
