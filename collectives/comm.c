/* SPDX-License-Identifier: Apache-2.0 */
/* comm.c - communicators: unique ids, the cliques of ranks that share one,
 * the registry of live handles, argument checks, and collectives issued as
 * stream work (run by sim_run.c).
 *
 * The one idea: everything a call can check is checked at the call, with a
 * status and a message naming the collective and the argument (the handle is
 * live, the buffers are large enough and on the communicator's device, the
 * dtype and op go together); what only the run can see is reported through
 * the communicator's asynchronous error, never by hanging a stream. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "coll_internal.h"

#define COMM_MAGIC 0x636f6d6d67636121ull

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static gca__clique_t *cliques;
static gca_comm_t **live;
static size_t nlive, caplive;
static _Thread_local int group_depth;

const char *gca__coll_kind_name(gca__coll_kind_t kind) {
  static const char *const names[] = {"all_gather", "reduce_scatter", "all_reduce"};
  return (size_t)kind < 3 ? names[kind] : "?";
}

/* ---- handles ---- */

static bool live_has(const gca_comm_t *c) {
  for (size_t i = 0; i < nlive; i++)
    if (live[i] == c)
      return true;
  return false;
}

/* With reg_lock held: room for one more live handle. */
static gca_status_t live_reserve(void) {
  if (nlive < caplive)
    return GCA_OK;
  size_t ncap = caplive ? caplive * 2 : 16;
  gca_comm_t **grown = realloc(live, ncap * sizeof(*grown));
  if (!grown)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_create: no host memory");
  live = grown;
  caplive = ncap;
  return GCA_OK;
}

static gca_status_t check_comm(const char *fn, const gca_comm_t *c) {
  if (!c)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  pthread_mutex_lock(&reg_lock);
  bool ok = live_has(c);
  pthread_mutex_unlock(&reg_lock);
  if (!ok)
    return gca__error(GCA_ERR_INVALID_HANDLE, "%s: %p is not a live communicator (destroyed?)", fn,
                      (const void *)c);
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_get_unique_id(gca_comm_id_t *id) {
  if (!id)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_get_unique_id: id is NULL");
  memset(id, 0, sizeof(*id));
  GCA_CHECK(gca_device_init());
  const char *be = gca_device_backend_name();
  if (be && strcmp(be, "cuda") == 0)
    return gca__nccl_unique_id(id);
  if (getrandom(id->bytes, 32, 0) != 32) { /* fall back to time and pid */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t v[3] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid()};
    memcpy(id->bytes, v, sizeof(v));
  }
  memcpy(id->bytes + 32, "gca-sim", 7);
  return GCA_OK;
}

/* ---- cliques ---- */

static void clique_free(gca__clique_t *c) {
  gca__meet_destroy(&c->m);
  free(c->ranks);
  free(c->desc);
  free(c->staged);
  free(c);
}

/* With reg_lock held: the clique of id, made when new. */
static gca_status_t clique_get(const gca_comm_id_t *id, int nranks, gca__clique_t **out) {
  for (gca__clique_t *c = cliques; c; c = c->next)
    if (memcmp(c->id, id->bytes, GCA_COMM_ID_BYTES) == 0) {
      if (c->nranks != nranks)
        return gca__error(GCA_ERR_INVALID_ARGUMENT,
                          "comm_create: nranks %d, but the id's communicator has %d ranks", nranks,
                          c->nranks);
      *out = c;
      return GCA_OK;
    }
  gca__clique_t *c = calloc(1, sizeof(*c));
  if (!c)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_create: no host memory");
  c->ranks = calloc((size_t)nranks, sizeof(*c->ranks));
  c->desc = calloc((size_t)nranks, sizeof(*c->desc));
  c->staged = calloc((size_t)nranks, sizeof(*c->staged));
  gca__meet_init(&c->m, false);
  if (!c->ranks || !c->desc || !c->staged) {
    clique_free(c);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_create: no host memory");
  }
  memcpy(c->id, id->bytes, GCA_COMM_ID_BYTES);
  c->nranks = nranks;
  c->next = cliques;
  cliques = c;
  *out = c;
  return GCA_OK;
}

/* With reg_lock held: drops one reference; the last frees the clique. */
static void clique_unref(gca__clique_t *c) {
  if (--c->refs > 0)
    return;
  for (gca__clique_t **p = &cliques; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  clique_free(c);
}

/* ---- creation ---- */

static gca_status_t check_options(const gca_comm_options_t *o, gca_comm_options_t *out) {
  *out = (gca_comm_options_t)GCA_COMM_OPTIONS_INIT;
  if (o) {
    /* callers built before the sim_processes fields came pass a shorter struct */
    size_t oldest = offsetof(gca_comm_options_t, sim_processes);
    if (o->size < oldest || o->size > 4096)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "comm_create: options' size %zu is not set (sizeof is %zu)", o->size,
                        sizeof(*o));
    memcpy(out, o, o->size < sizeof(*o) ? o->size : sizeof(*o));
    out->size = sizeof(*out);
  }
  if (out->backend != GCA_COMM_BACKEND_AUTO && out->backend != GCA_COMM_BACKEND_SIM &&
      out->backend != GCA_COMM_BACKEND_NCCL)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_create: unknown backend %d",
                      (int)out->backend);
  if (!(out->latency_us >= 0) || !(out->bandwidth_gbps >= 0) || !(out->timeout_s > 0) ||
      out->timeout_s > 86400)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "comm_create: bad options (latency %g us, bandwidth %g GB/s, timeout %g s)",
                      out->latency_us, out->bandwidth_gbps, out->timeout_s);
  if (out->sim_chunk_bytes == 0)
    out->sim_chunk_bytes = GCA_COMM_SIM_CHUNK_DEFAULT;
  if (out->sim_chunk_bytes < ((size_t)64 << 10) || out->sim_chunk_bytes > ((size_t)1 << 30))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "comm_create: sim_chunk_bytes %zu is not 64 KiB .. 1 GiB",
                      out->sim_chunk_bytes);
  GCA_CHECK(gca_device_init());
  const char *be = gca_device_backend_name();
  bool cuda = be && strcmp(be, "cuda") == 0;
  if (out->backend == GCA_COMM_BACKEND_AUTO)
    out->backend = cuda ? GCA_COMM_BACKEND_NCCL : GCA_COMM_BACKEND_SIM;
  if (out->backend == GCA_COMM_BACKEND_NCCL) {
    if (!cuda)
      return gca__error(GCA_ERR_NOT_SUPPORTED,
                        "comm_create: the NCCL backend needs the cuda device backend (now '%s')",
                        be ? be : "none");
    gca_status_t lst = gca__nccl_load();
    return lst == GCA_OK ? GCA_OK : gca__error_prefix(lst, "comm_create");
  }
  if (cuda || !be)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "comm_create: the sim communicator needs the sim device backend (now '%s')",
                      be ? be : "none");
  return GCA_OK;
}

static _Atomic uint64_t serials; /* Note [Comm pools] */
static _Atomic int nccl_comms;   /* live NCCL communicators: groups bracket NCCL then */

/* A communicator record for an NCCL communicator, registered as live. */
static gca_status_t nccl_wrap(void *nc, int rank, int nranks, int device,
                              const gca_comm_options_t *o, bool wrapped, gca_comm_t **out) {
  gca_comm_t *c = calloc(1, sizeof(*c));
  if (!c)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_create: no host memory");
  c->magic = COMM_MAGIC;
  c->serial = atomic_fetch_add(&serials, 1) + 1;
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->opts = *o;
  c->opts.backend = GCA_COMM_BACKEND_NCCL;
  c->nccl = nc;
  c->wrapped = wrapped;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_mutex_lock(&reg_lock);
  gca_status_t st = live_reserve();
  if (st == GCA_OK)
    live[nlive++] = c;
  pthread_mutex_unlock(&reg_lock);
  if (st != GCA_OK) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    return st;
  }
  atomic_fetch_add(&nccl_comms, 1);
  *out = c;
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_wrap_nccl(void *nc, int device, gca_comm_t **comm) {
  if (!nc || !comm)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_wrap_nccl: nccl_comm or comm is NULL");
  *comm = NULL;
  gca_status_t lst = gca__nccl_load();
  if (lst != GCA_OK)
    return gca__error_prefix(lst, "comm_wrap_nccl");
  int rank = 0, nranks = 0;
  GCA_CHECK(gca__nccl_describe(nc, &rank, &nranks));
  gca_comm_options_t o = GCA_COMM_OPTIONS_INIT;
  return nccl_wrap(nc, rank, nranks, device, &o, true, comm);
}

/* Adds rank `rank` to the clique of id without waiting for the others. */
static gca_status_t join(const gca_comm_id_t *id, int nranks, int rank, int device,
                         const gca_comm_options_t *o, gca_comm_t **out) {
  int ndev = 0;
  GCA_CHECK(gca_device_count(&ndev));
  if (device < 0 || device >= ndev)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_create: device %d of %d", device, ndev);
  gca_comm_t *c = calloc(1, sizeof(*c));
  if (!c)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_create: no host memory");
  c->magic = COMM_MAGIC;
  c->serial = atomic_fetch_add(&serials, 1) + 1;
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->opts = *o;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  gca_status_t st = GCA_OK;
  if (o->sim_processes) {
    st = gca__proc_join(id, nranks, rank, o, &c->proc);
    pthread_mutex_lock(&reg_lock);
    if (st == GCA_OK)
      st = live_reserve();
    if (st == GCA_OK)
      live[nlive++] = c;
    pthread_mutex_unlock(&reg_lock);
    if (st != GCA_OK) {
      if (c->proc)
        gca__proc_leave(c->proc);
      pthread_mutex_destroy(&c->mu);
      pthread_cond_destroy(&c->cv);
      free(c);
      return st;
    }
    *out = c;
    return GCA_OK;
  }
  pthread_mutex_lock(&reg_lock);
  gca__clique_t *q = NULL;
  st = live_reserve();
  if (st == GCA_OK)
    st = clique_get(id, nranks, &q);
  if (st == GCA_OK) {
    pthread_mutex_lock(&q->m.mu);
    if (q->ranks[rank])
      st = gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "comm_create: rank %d of this id has joined already", rank);
    else if (q->m.broken)
      st = gca__error(GCA_ERR_INVALID_STATE, "comm_create: the communicator failed: %s", q->m.why);
    if (st == GCA_OK) {
      q->ranks[rank] = c;
      q->joined++;
      q->refs++;
      c->clique = q;
      live[nlive++] = c;
      pthread_cond_broadcast(&q->m.cv);
    }
    pthread_mutex_unlock(&q->m.mu);
    if (st != GCA_OK && q->refs == 0)
      clique_unref((q->refs++, q));
  }
  pthread_mutex_unlock(&reg_lock);
  if (st != GCA_OK) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    return st;
  }
  *out = c;
  return GCA_OK;
}

static void release(gca_comm_t *c);

/* Waits until every rank of c's clique has joined. */
static gca_status_t wait_joined(gca_comm_t *c) {
  gca__clique_t *q = c->clique;
  struct timespec dl;
  gca__deadline_after(c->opts.timeout_s, &dl);
  pthread_mutex_lock(&q->m.mu);
  int rc = 0;
  while (q->joined < q->nranks && !q->m.broken && rc == 0)
    rc = pthread_cond_timedwait(&q->m.cv, &q->m.mu, &dl);
  gca_status_t st = GCA_OK;
  if (q->joined < q->nranks) {
    char who[128] = "";
    size_t at = 0;
    for (int r = 0; r < q->nranks && at + 16 < sizeof(who); r++)
      if (!q->ranks[r])
        at += (size_t)snprintf(who + at, sizeof(who) - at, "%s%d", at ? ", " : "", r);
    st = gca__error(GCA_ERR_INVALID_STATE,
                    "comm_create: rank %d of %d: rank(s) %s did not join within %.3g s", c->rank,
                    c->nranks, who, c->opts.timeout_s);
  }
  pthread_mutex_unlock(&q->m.mu);
  return st;
}

GCA_API gca_status_t gca_comm_create(const gca_comm_id_t *id, int nranks, int rank, int device,
                                     const gca_comm_options_t *opts, gca_comm_t **comm) {
  if (!id || !comm)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_create: id or comm is NULL");
  *comm = NULL;
  if (nranks < 1 || nranks > 4096)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_create: nranks %d is not 1..4096", nranks);
  if (rank < 0 || rank >= nranks)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_create: rank %d is out of range (0..%d)",
                      rank, nranks - 1);
  gca_comm_options_t o;
  GCA_CHECK(check_options(opts, &o));
  gca_comm_t *c = NULL;
  if (o.backend == GCA_COMM_BACKEND_NCCL) {
    void *nc = NULL;
    GCA_CHECK(gca_set_device(device));
    GCA_CHECK(gca__nccl_init_rank(id, nranks, rank, &nc));
    gca_status_t st = nccl_wrap(nc, rank, nranks, device, &o, false, comm);
    if (st != GCA_OK)
      GCA_CHECK_IGNORE(gca__nccl_destroy(nc, false));
    return st;
  }
  GCA_CHECK(join(id, nranks, rank, device, &o, &c));
  gca_status_t st = c->proc ? GCA_OK : wait_joined(c); /* processes join in gca__proc_join */
  if (st != GCA_OK) {
    release(c);
    return st;
  }
  *comm = c;
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_create_all(int nranks, const int *devices,
                                         const gca_comm_options_t *opts, gca_comm_t **comms) {
  if (!devices || !comms || nranks < 1 || nranks > 4096)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_create_all: bad arguments (nranks %d)",
                      nranks);
  for (int r = 0; r < nranks; r++)
    comms[r] = NULL; /* on failure too: never a handle already freed */
  gca_comm_options_t o;
  GCA_CHECK(check_options(opts, &o));
  if (o.backend == GCA_COMM_BACKEND_NCCL) {
    void *ncs[4096];
    GCA_CHECK(gca__nccl_init_all(nranks, devices, ncs));
    for (int r = 0; r < nranks; r++) {
      gca_status_t st = nccl_wrap(ncs[r], r, nranks, devices[r], &o, false, &comms[r]);
      if (st != GCA_OK) {
        for (int k = 0; k < nranks; k++)
          if (k >= r)
            GCA_CHECK_IGNORE(gca__nccl_destroy(ncs[k], false));
          else {
            GCA_CHECK_IGNORE(gca_comm_destroy(comms[k]));
            comms[k] = NULL;
          }
        return st;
      }
    }
    return GCA_OK;
  }
  if (o.sim_processes)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "comm_create_all: ranks as processes each call gca_comm_create (one thread "
                      "cannot be every process)");
  gca_comm_id_t id;
  GCA_CHECK(gca_comm_get_unique_id(&id));
  for (int r = 0; r < nranks; r++) {
    gca_status_t st = join(&id, nranks, r, devices[r], &o, &comms[r]);
    if (st != GCA_OK) {
      for (int k = 0; k < r; k++) {
        release(comms[k]);
        comms[k] = NULL;
      }
      return st;
    }
  }
  return GCA_OK;
}

/* ---- the end of a communicator ---- */

static void release(gca_comm_t *c) {
  pthread_mutex_lock(&reg_lock);
  for (size_t i = 0; i < nlive; i++)
    if (live[i] == c) {
      live[i] = live[--nlive];
      break;
    }
  gca__clique_t *q = c->clique;
  if (q) {
    pthread_mutex_lock(&q->m.mu);
    q->ranks[c->rank] = NULL;
    q->joined--;
    pthread_mutex_unlock(&q->m.mu);
    clique_unref(q);
  }
  pthread_mutex_unlock(&reg_lock);
  if (c->proc)
    gca__proc_leave(c->proc);
  if (c->nccl)
    atomic_fetch_sub(&nccl_comms, 1);
  for (gca__coll_t *p = c->persistent, *next; p; p = next) {
    next = p->next;
    free(p);
  }
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  c->magic = 0;
  free(c);
}

GCA_API gca_status_t gca_comm_destroy(gca_comm_t *c) {
  GCA_CHECK(check_comm("comm_destroy", c));
  if (c->nccl) {
    if (!c->wrapped)
      GCA_CHECK(gca__nccl_destroy(c->nccl, false));
    release(c);
    return GCA_OK;
  }
  pthread_mutex_lock(&c->mu);
  while (c->inflight > 0)
    pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  release(c);
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_abort(gca_comm_t *c) {
  GCA_CHECK(check_comm("comm_abort", c));
  if (c->nccl) {
    gca_status_t st = c->wrapped ? GCA_OK : gca__nccl_destroy(c->nccl, true);
    release(c);
    return st;
  }
  gca__clique_t *q = c->clique;
  char why[128];
  snprintf(why, sizeof(why), "rank %d aborted the communicator", c->rank);
  gca__meet_t *m = c->proc ? c->proc->m : &q->m;
  gca__meet_lock(m);
  gca__meet_break(m, why);
  gca__meet_unlock(m);
  gca__comm_fail(c, GCA_ERR_INVALID_STATE, why);
  /* the queued collectives fail fast now; they end before the memory goes */
  pthread_mutex_lock(&c->mu);
  while (c->inflight > 0)
    pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  release(c);
  return GCA_OK;
}

void gca__comm_fail(gca_comm_t *c, gca_status_t st, const char *detail) {
  pthread_mutex_lock(&c->mu);
  if (c->error == GCA_OK) {
    c->error = st;
    snprintf(c->error_detail, sizeof(c->error_detail), "%s", detail);
  }
  pthread_mutex_unlock(&c->mu);
}

void gca__comm_ran(gca_comm_t *c, gca__coll_t *co, bool ok) {
  if (ok)
    atomic_fetch_add(&c->completed, 1);
  if (!co->persistent)
    free(co);
  pthread_mutex_lock(&c->mu);
  if (c->inflight > 0)
    c->inflight--;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* ---- queries ---- */

/* A query's common part: a live communicator and somewhere to write. */
static gca_status_t query(const char *fn, const gca_comm_t *c, const void *out) {
  GCA_CHECK(check_comm(fn, c));
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: the output pointer is NULL", fn);
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_rank(const gca_comm_t *c, int *rank) {
  GCA_CHECK(query("comm_rank", c, rank));
  *rank = c->rank;
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_count(const gca_comm_t *c, int *nranks) {
  GCA_CHECK(query("comm_count", c, nranks));
  *nranks = c->nranks;
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_device(const gca_comm_t *c, int *device) {
  GCA_CHECK(query("comm_device", c, device));
  *device = c->device;
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_backend_of(const gca_comm_t *c, gca_comm_backend_t *backend) {
  GCA_CHECK(query("comm_backend_of", c, backend));
  *backend = c->opts.backend;
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_async_error(gca_comm_t *c) {
  GCA_CHECK(check_comm("comm_async_error", c));
  if (c->nccl)
    return gca__nccl_async_error(c->nccl);
  pthread_mutex_lock(&c->mu);
  gca_status_t st = c->error;
  char detail[sizeof(c->error_detail)];
  memcpy(detail, c->error_detail, sizeof(detail));
  pthread_mutex_unlock(&c->mu);
  if (st != GCA_OK)
    return gca__error(st, "%s", detail);
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_stats(const gca_comm_t *c, gca_comm_stats_t *out) {
  GCA_CHECK(check_comm("comm_stats", c));
  if (!out || out->size < sizeof(*out))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_stats: out is NULL or its size is not set");
  out->collectives = atomic_load(&c->issued);
  out->bytes = atomic_load(&c->bytes);
  out->completed = atomic_load(&c->completed);
  out->registrations = atomic_load(&c->registrations);
  out->registrations_total = atomic_load(&c->registrations_total);
  out->deregistrations_total = atomic_load(&c->deregistrations_total);
  return GCA_OK;
}

/* ---- issuing ---- */

GCA_API gca_status_t gca_group_start(void) {
  if (atomic_load(&nccl_comms) > 0)
    GCA_CHECK(gca__nccl_group(true));
  group_depth++;
  return GCA_OK;
}

GCA_API gca_status_t gca_group_end(void) {
  if (group_depth == 0)
    return gca__error(GCA_ERR_INVALID_STATE, "group_end: no group_start");
  group_depth--;
  if (atomic_load(&nccl_comms) > 0)
    GCA_CHECK(gca__nccl_group(false));
  return GCA_OK;
}

/* The buffer [p, p + bytes) must fit in its gca block when p is gca memory
 * (interior pointers are checked through base), and be on the comm's device. */
static gca_status_t check_buffer(const char *fn, const gca_comm_t *c, const char *what,
                                 const void *base, const void *p, size_t bytes) {
  size_t block = 0;
  int dev = -1;
  if (gca_pointer_info(base, &block, &dev) != GCA_OK) {
    gca_clear_last_error();
    return GCA_OK; /* not gca memory: the caller's (e.g. memory of its own) */
  }
  if (dev != c->device)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s %p is on device %d, the communicator on %d",
                      fn, what, p, dev, c->device);
  size_t off = (size_t)((const char *)p - (const char *)base);
  if (off > block || bytes > block - off)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "%s: %s %p is too small: %zu bytes needed, the block has %zu from there", fn,
                      what, p, bytes, off > block ? 0 : block - off);
  return GCA_OK;
}

static gca_status_t issue(const char *fn, gca__coll_kind_t kind, const void *send, void *recv,
                          size_t count, gca_dtype_t dtype, gca_reduce_op_t op, gca_comm_t *c,
                          gca_stream_t stream) {
  GCA_CHECK(check_comm(fn, c));
  pthread_mutex_lock(&c->mu);
  gca_status_t err = c->error;
  char detail[sizeof(c->error_detail)];
  memcpy(detail, c->error_detail, sizeof(detail));
  pthread_mutex_unlock(&c->mu);
  if (err != GCA_OK)
    return gca__error(err, "%s: the communicator failed earlier: %s", fn, detail);
  size_t es = gca_dtype_size(dtype);
  if (es == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dtype);
  if (kind != GCA__ALL_GATHER) {
    if ((int)op < GCA_REDUCE_SUM || op > GCA_REDUCE_AVG)
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: unknown reduce op %d", fn, (int)op);
    if (op == GCA_REDUCE_AVG && dtype != GCA_DTYPE_F32 && dtype != GCA_DTYPE_F16 &&
        dtype != GCA_DTYPE_BF16 && dtype != GCA_DTYPE_F64)
      return gca__error(GCA_ERR_INVALID_ARGUMENT,
                        "%s: avg needs a floating dtype (dtype %d is an integer)", fn, (int)dtype);
  }
  size_t n = (size_t)c->nranks;
  size_t in_elems = kind == GCA__REDUCE_SCATTER ? count * n : count;
  size_t out_elems = kind == GCA__ALL_GATHER ? count * n : count;
  if (count && (count > SIZE_MAX / n / es))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: count %zu overflows", fn, count);
  if (count && (!send || !recv))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, send ? "recv" : "send");
  if (count) {
    /* in-place forms: check the whole buffer through its base */
    const void *sbase = send, *rbase = recv;
    if (kind == GCA__ALL_GATHER && send == (const char *)recv + (size_t)c->rank * count * es)
      sbase = recv;
    if (kind == GCA__REDUCE_SCATTER && recv == (const char *)send + (size_t)c->rank * count * es)
      rbase = send;
    GCA_CHECK(check_buffer(fn, c, "send", sbase, send, in_elems * es));
    GCA_CHECK(check_buffer(fn, c, "recv", rbase, recv, out_elems * es));
  }
  if (c->nccl) {
    GCA_CHECK(gca__nccl_issue(fn, kind, send, recv, count, dtype, op, c->nccl, stream));
    atomic_fetch_add(&c->issued, 1);
    atomic_fetch_add(&c->bytes, in_elems * es);
    return GCA_OK;
  }
  gca__coll_t *co = calloc(1, sizeof(*co));
  if (!co)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory", fn);
  *co = (gca__coll_t){.comm = c,
                      .kind = kind,
                      .send = send,
                      .recv = recv,
                      .count = count,
                      .dtype = dtype,
                      .op = kind == GCA__ALL_GATHER ? GCA_REDUCE_SUM : op};
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  gca_status_t st = gca_stream_capture_status(stream, &cs);
  if (st != GCA_OK) {
    free(co);
    return gca__error_prefix(st, "%s", fn);
  }
  pthread_mutex_lock(&c->mu);
  co->persistent = cs == GCA_CAPTURE_STATUS_ACTIVE;
  if (co->persistent) {
    co->next = c->persistent;
    c->persistent = co;
  } else {
    c->inflight++;
  }
  pthread_mutex_unlock(&c->mu);
  st = gca_launch_host_func(stream, gca__sim_run, co);
  if (st != GCA_OK) {
    pthread_mutex_lock(&c->mu);
    if (co->persistent) {
      c->persistent = co->next;
    } else {
      c->inflight--;
    }
    pthread_mutex_unlock(&c->mu);
    free(co);
    return gca__error_prefix(st, "%s: queueing on the stream", fn);
  }
  atomic_fetch_add(&c->issued, 1);
  atomic_fetch_add(&c->bytes, in_elems * es);
  return GCA_OK;
}

GCA_API gca_status_t gca_all_gather(const void *send, void *recv, size_t sendcount,
                                    gca_dtype_t dtype, gca_comm_t *comm, gca_stream_t stream) {
  return issue("all_gather", GCA__ALL_GATHER, send, recv, sendcount, dtype, GCA_REDUCE_SUM, comm,
               stream);
}

GCA_API gca_status_t gca_reduce_scatter(const void *send, void *recv, size_t recvcount,
                                        gca_dtype_t dtype, gca_reduce_op_t op, gca_comm_t *comm,
                                        gca_stream_t stream) {
  return issue("reduce_scatter", GCA__REDUCE_SCATTER, send, recv, recvcount, dtype, op, comm,
               stream);
}

GCA_API gca_status_t gca_all_reduce(const void *send, void *recv, size_t count, gca_dtype_t dtype,
                                    gca_reduce_op_t op, gca_comm_t *comm, gca_stream_t stream) {
  return issue("all_reduce", GCA__ALL_REDUCE, send, recv, count, dtype, op, comm, stream);
}

/* ---- registration ---- */

/* The sim's record of a registered range (its handle). */
typedef struct sim_reg {
  uint64_t magic;
  gca_comm_t *comm;
  void *ptr;
  size_t bytes;
} sim_reg_t;

#define REG_MAGIC 0x7265676973746572ull

/* The registration itself, the range checked by the caller. */
static gca_status_t register_range(gca_comm_t *c, void *ptr, size_t bytes, void **handle) {
  if (c->nccl) {
    GCA_CHECK(gca__nccl_register(c->nccl, ptr, bytes, handle));
  } else {
    /* the sim's registration cannot fail by itself: a test makes it fail here */
    if (GCA_FAILPOINT("sim_comm_register"))
      return gca__error(GCA_ERR_DRIVER,
                        "comm_register: the sim refused to register [%p, +%zu) (injected fault)",
                        ptr, bytes);
    sim_reg_t *r = malloc(sizeof(*r));
    if (!r)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "comm_register: no host memory");
    *r = (sim_reg_t){REG_MAGIC, c, ptr, bytes};
    *handle = r;
  }
  atomic_fetch_add(&c->registrations, 1);
  atomic_fetch_add(&c->registrations_total, 1);
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_register(gca_comm_t *c, void *ptr, size_t bytes, void **handle) {
  GCA_CHECK(check_comm("comm_register", c));
  if (!ptr || !bytes || !handle)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_register: ptr %p, bytes %zu, handle %p", ptr,
                      bytes, (void *)handle);
  GCA_CHECK(check_buffer("comm_register", c, "range", ptr, ptr, bytes));
  return register_range(c, ptr, bytes, handle);
}

static gca_status_t deregister_handle(gca_comm_t *c, void *handle) {
  if (c->nccl) {
    GCA_CHECK(gca__nccl_deregister(c->nccl, handle));
  } else {
    sim_reg_t *r = handle;
    if (r->magic != REG_MAGIC || r->comm != c)
      return gca__error(GCA_ERR_INVALID_HANDLE,
                        "comm_deregister: %p is not a registration of this communicator", handle);
    r->magic = 0;
    free(r);
  }
  atomic_fetch_sub(&c->registrations, 1);
  atomic_fetch_add(&c->deregistrations_total, 1);
  return GCA_OK;
}

GCA_API gca_status_t gca_comm_deregister(gca_comm_t *c, void *handle) {
  GCA_CHECK(check_comm("comm_deregister", c));
  if (!handle)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "comm_deregister: handle is NULL");
  return deregister_handle(c, handle);
}

/* Note [Comm pools] (comm_pool.c): the pool's records name their
 * communicator by pointer and serial, and each call checks, under the
 * registry's lock, that it is still the live one. */
gca_status_t gca__comm_pool_register(gca_comm_t *c, uint64_t serial, void *ptr, size_t bytes,
                                     void **handle) {
  pthread_mutex_lock(&reg_lock);
  gca_status_t st = live_has(c) && c->serial == serial
                        ? register_range(c, ptr, bytes, handle)
                        : gca__error(GCA_ERR_INVALID_HANDLE,
                                     "comm_register: the comm pool's communicator was destroyed");
  pthread_mutex_unlock(&reg_lock);
  return st;
}

bool gca__comm_pool_deregister(gca_comm_t *c, uint64_t serial, bool sim, void *handle,
                               gca_status_t *st) {
  pthread_mutex_lock(&reg_lock);
  bool live = live_has(c) && c->serial == serial;
  *st = live ? deregister_handle(c, handle) : GCA_OK;
  pthread_mutex_unlock(&reg_lock);
  sim_reg_t *r = handle;
  if (!live && sim && r->magic == REG_MAGIC) { /* NCCL dropped its own with the communicator */
    r->magic = 0;
    free(r);
  }
  return live;
}
