/* SPDX-License-Identifier: Apache-2.0 */
/* route.c - the routes that send a device's allocations to a private pool:
 * stream filters (gca_pool_begin_allocate), per-thread use scopes
 * (gca_pool_use_begin) and stream captures (gca_pool_begin_capture).
 *
 * The one idea: the choice of tree is made under the device lock from the
 * device's route list and the calling thread's scopes, and costs the hot path
 * a single relaxed load (d->routing) while no route exists; a route holds one
 * use of its pool, and the end of a device's last capture records the frees
 * deferred during it (Note [Frees during capture], pending.c).
 */
#include <stdlib.h>
#include <string.h>

#include "alloc_core.h"

#define MAX_SCOPES 16

/* The calling thread's use scopes, innermost last; each holds one use. */
static _Thread_local gca__mempool_t *t_scopes[MAX_SCOPES];
static _Thread_local int t_nscopes;

gca_status_t gca__route_add(const char *op, gca__devalloc_t *d, const gca__route_t *r) {
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

void gca__route_remove(gca__devalloc_t *d, size_t i) {
  gca__route_t r = d->routes[i];
  memmove(&d->routes[i], &d->routes[i + 1], (d->nroutes - i - 1) * sizeof(*d->routes));
  d->nroutes--;
  atomic_fetch_sub_explicit(&d->routing, 1, memory_order_relaxed);
  if (r.kind == ROUTE_CAPTURE && --d->ncaptures == 0) {
    gca_status_t st = gca__pending_flush_deferred(d);
    if (st != GCA_OK)
      GCA_LOG_WARN("pool_end_capture: deferred frees stay pending: %s", gca_last_error());
  }
  gca__mempool_unuse(d, r.pool);
  if (d->ncaptures == 0)
    gca__mempool_sweep_dying(d);
}

bool gca__mempool_capturing_locked(const gca__devalloc_t *d, const gca__mempool_t *m) {
  for (size_t i = 0; i < d->nroutes; i++)
    if (d->routes[i].pool == m && d->routes[i].kind == ROUTE_CAPTURE)
      return true;
  return false;
}

gca_status_t gca__route_select_locked(gca__devalloc_t *d, gca_stream_t stream,
                                      gca__mempool_t **out) {
  *out = NULL;
  for (int i = t_nscopes - 1; i >= 0; i--)
    if (t_scopes[i]->dev == d) {
      *out = t_scopes[i];
      return GCA_OK;
    }
  bool queried = false;
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  uint64_t id = 0;
  for (size_t i = d->nroutes; i-- > 0;) {
    const gca__route_t *r = &d->routes[i];
    if (r->kind == ROUTE_FILTER) {
      if (r->filter(stream, r->ctx)) {
        *out = r->pool;
        return GCA_OK;
      }
      continue;
    }
    if (stream == NULL) /* the legacy stream is never captured; asking would invalidate */
      continue;
    if (!queried) {
      queried = true;
      /* not knowing whether the stream captures is not "it does not": taken
       * for no, a captured allocation would come from the default pools */
      gca_status_t st = d->ops->stream_capture_info(stream, &cs, &id);
      if (st != GCA_OK)
        return gca__error_prefix(st, "malloc: routing a request on stream %p", (void *)stream);
    }
    if (cs == GCA_CAPTURE_STATUS_ACTIVE && id == r->capture_id) {
      *out = r->pool;
      return GCA_OK;
    }
  }
  return GCA_OK;
}

gca_status_t gca__route_scope_push(gca__devalloc_t *d, gca__mempool_t *m) {
  if (t_nscopes == MAX_SCOPES)
    return gca__error(GCA_ERR_INVALID_STATE,
                      "pool_use_begin: this thread already has %d nested pool scopes", MAX_SCOPES);
  t_scopes[t_nscopes++] = m;
  m->use_count++;
  atomic_fetch_add_explicit(&d->routing, 1, memory_order_relaxed);
  return GCA_OK;
}

gca_status_t gca__route_scope_pop(gca__devalloc_t *d, gca__mempool_t *m) {
  if (t_nscopes == 0 || t_scopes[t_nscopes - 1] != m)
    return gca__error(GCA_ERR_INVALID_STATE,
                      "pool_use_end: pool %p is not this thread's innermost pool scope",
                      (void *)(uintptr_t)m->handle);
  t_scopes[--t_nscopes] = NULL;
  atomic_fetch_sub_explicit(&d->routing, 1, memory_order_relaxed);
  gca__mempool_unuse(d, m);
  return GCA_OK;
}
