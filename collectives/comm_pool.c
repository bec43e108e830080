/* SPDX-License-Identifier: Apache-2.0 */
/* comm_pool.c - comm pools: private pools whose physical memory is
 * registered with a communicator for as long as it exists.
 *
 * Note [Comm pools]: the pool's segment observer (Note [Segment observers],
 * gca/pool.h) registers each physical allocation with the communicator when
 * the allocator creates or maps it, before any block of it is handed out, and
 * deregisters it before the allocator releases or unmaps it. So every
 * allocation from the pool, whenever made, lies in registered memory, and a
 * step that reuses cached blocks registers nothing (NCCL's ncclCommRegister
 * is costly and keeps the buffer pinned for the communicator's transports).
 * A registration covers one physical allocation and never spans two, as a
 * symmetric-memory window needs. A failed registration fails the allocation
 * that needed the memory, with the backend's message. The pool may outlive
 * its communicator: the records name it by pointer and serial, and once it
 * is destroyed (which drops its registrations, as ncclCommDestroy does) the
 * releases only forget them. */
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "gca/pool.h"

typedef struct creg {
  uintptr_t base;
  size_t bytes;
  void *handle;
} creg_t;

typedef struct cpool {
  gca_comm_t *comm;
  uint64_t serial;
  bool sim;
  pthread_mutex_t mu; /* releases run without the allocator's lock */
  creg_t *v;
  size_t n, cap;
} cpool_t;

static gca_status_t on_segment(gca_segment_event_t ev, int device, void *base, size_t bytes,
                               void *ctx) {
  (void)device;
  cpool_t *p = ctx;
  gca_status_t st = GCA_OK;
  pthread_mutex_lock(&p->mu);
  if (ev == GCA_SEGMENT_CREATED || ev == GCA_SEGMENT_MAPPED) {
    if (p->n == p->cap) {
      size_t ncap = p->cap ? p->cap * 2 : 8;
      creg_t *nv = realloc(p->v, ncap * sizeof(*nv));
      if (!nv) {
        pthread_mutex_unlock(&p->mu);
        return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm pool: no host memory for a registration");
      }
      p->v = nv;
      p->cap = ncap;
    }
    void *h = NULL;
    st = gca__comm_pool_register(p->comm, p->serial, base, bytes, &h);
    if (st == GCA_OK)
      p->v[p->n++] = (creg_t){(uintptr_t)base, bytes, h};
  } else {
    for (size_t i = 0; i < p->n; i++)
      if (p->v[i].base == (uintptr_t)base) {
        gca__comm_pool_deregister(p->comm, p->serial, p->sim, p->v[i].handle, &st);
        p->v[i] = p->v[--p->n];
        break;
      }
  }
  pthread_mutex_unlock(&p->mu);
  return st;
}

/* The pool is gone with all its memory: nothing is registered any more. */
static void on_done(void *ctx) {
  cpool_t *p = ctx;
  for (size_t i = 0; i < p->n; i++) { /* none: every release said so; kept for safety */
    gca_status_t st;
    gca__comm_pool_deregister(p->comm, p->serial, p->sim, p->v[i].handle, &st);
  }
  pthread_mutex_destroy(&p->mu);
  free(p->v);
  free(p);
}

GCA_API gca_status_t gca_comm_pool_create(gca_comm_t *comm, const gca_pool_options_t *opts,
                                          gca_pool_t **pool) {
  if (!pool)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_pool_create: pool is NULL");
  *pool = NULL;
  int device = 0;
  GCA_CHECK(gca_comm_device(comm, &device)); /* a live communicator */
  gca_pool_options_t o = GCA_POOL_OPTIONS_INIT;
  if (opts) {
    if (opts->size != sizeof(o))
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "comm_pool_create: options size %zu is not that of gca_pool_options_t "
                        "(%zu)",
                        opts->size, sizeof(o));
    o = *opts;
    if (o.segment_observer || o.observer_done)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "comm_pool_create: a comm pool's segment observer is its own");
  }
  cpool_t *p = calloc(1, sizeof(*p));
  if (!p)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_pool_create: no host memory");
  p->comm = comm;
  p->serial = comm->serial;
  p->sim = comm->nccl == NULL;
  pthread_mutex_init(&p->mu, NULL);
  o.segment_observer = on_segment;
  o.observer_ctx = p;
  o.observer_done = on_done;
  gca_status_t st = gca_pool_create(device, &o, pool);
  if (st != GCA_OK) {
    pthread_mutex_destroy(&p->mu);
    free(p);
    return gca__error_prefix(st, "comm_pool_create");
  }
  return GCA_OK;
}
