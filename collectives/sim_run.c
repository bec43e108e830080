/* SPDX-License-Identifier: Apache-2.0 */
/* sim_run.c - one collective run on one sim rank, when its stream reaches it
 * (a host function: it touches the ranks' memory directly and calls nothing
 * of the device layer).
 *
 * Note [Sim rendezvous]: the ranks of a clique meet twice per collective.
 * At the first barrier every rank has posted its descriptor and a copy of its
 * input (staged, so in-place forms cannot race a peer's read); each rank then
 * checks that all posted the same collective and computes its own output
 * from the staged copies; at the second barrier everyone has finished
 * reading, so the copies are freed and the next collective may post. A rank
 * that waits longer than the timeout, a sequence that differs between ranks,
 * an abort or a failed allocation breaks the clique: every waiting rank wakes,
 * its collective ends without writing output, and each communicator keeps
 * the error naming the collective (its kind and number on that rank). A rank
 * let out by a break may not free its staged copy while a peer that passed
 * the first barrier still reads it: the meeting counts the ranks computing,
 * and a rank withdraws its copy only when none is. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_internal.h"
#include "device.h"

void gca__deadline_after(double s, struct timespec *ts) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  double whole = s < 0 ? 0 : s;
  time_t sec = (time_t)whole;
  long ns = (long)((whole - (double)sec) * 1e9);
  ts->tv_sec += sec;
  ts->tv_nsec += ns;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* ---- the meeting place ---- */

void gca__meet_init(gca__meet_t *m, bool shared) {
  memset(m, 0, sizeof(*m));
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  if (shared) {
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  }
  pthread_mutex_init(&m->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (shared)
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
  pthread_cond_init(&m->cv, &ca);
  pthread_condattr_destroy(&ca);
}

void gca__meet_destroy(gca__meet_t *m) {
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
}

void gca__meet_break(gca__meet_t *m, const char *why) {
  if (!m->broken) {
    m->broken = true;
    snprintf(m->why, sizeof(m->why), "%s", why);
  }
  pthread_cond_broadcast(&m->cv);
}

/* A process that died holding the mutex leaves it to the next locker
 * (robust mutexes): the state it was changing cannot be trusted, so the
 * meeting ends. */
static void owner_died(gca__meet_t *m) {
  pthread_mutex_consistent(&m->mu);
  gca__meet_break(m, "a rank's process ended while holding the rendezvous");
}

void gca__meet_lock(gca__meet_t *m) {
  if (pthread_mutex_lock(&m->mu) == EOWNERDEAD)
    owner_died(m);
}

void gca__meet_unlock(gca__meet_t *m) {
  pthread_mutex_unlock(&m->mu);
}

enum { MET, BROKEN, TIMED_OUT };

/* With m->mu held: waits at barrier b for n ranks. */
static int barrier(gca__meet_t *m, int b, int n, double timeout_s) {
  uint64_t g = m->gen[b];
  if (++m->arrived[b] == n) {
    m->arrived[b] = 0;
    m->gen[b]++;
    pthread_cond_broadcast(&m->cv);
    return MET;
  }
  struct timespec dl;
  gca__deadline_after(timeout_s, &dl);
  int rc = 0;
  while (m->gen[b] == g && !m->broken && rc != ETIMEDOUT) {
    rc = pthread_cond_timedwait(&m->cv, &m->mu, &dl);
    if (rc == EOWNERDEAD)
      owner_died(m);
  }
  if (m->gen[b] != g)
    return MET;
  m->arrived[b]--;
  return m->broken ? BROKEN : TIMED_OUT;
}

/* ---- one collective ---- */

/* A rank's view of the exchange: the meeting place, the descriptors, and
 * where each rank's staged input is. */
typedef struct xchg {
  gca__meet_t *m;
  gca__coll_desc_t *desc;
  void **staged;        /* ranks as threads: each rank's whole input */
  unsigned char *areas; /* ranks as processes: one chunk per rank */
  size_t chunk;
} xchg_t;

static const unsigned char *staged_of(const xchg_t *x, int rank) {
  return x->areas ? x->areas + (size_t)rank * x->chunk : x->staged[rank];
}

/* The ranks that have not posted (for a timeout's message). */
static void missing_ranks(const xchg_t *x, int n, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (int r = 0; r < n && at + 16 < len; r++)
    if (!x->desc[r].posted)
      at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? ", " : "", r);
}

/* The first difference between the posted collectives, or false when they
 * agree. */
static bool differs(const xchg_t *x, int n, uint64_t index, char *why, size_t len) {
  const gca__coll_desc_t *a = &x->desc[0];
  for (int r = 1; r < n; r++) {
    const gca__coll_desc_t *b = &x->desc[r];
    const char *what = a->kind != b->kind                             ? "kind"
                       : a->count != b->count                         ? "count"
                       : a->dtype != b->dtype                         ? "dtype"
                       : a->kind != GCA__ALL_GATHER && a->op != b->op ? "reduce op"
                                                                      : NULL;
    if (what) {
      snprintf(why, len,
               "collective #%llu differs between ranks (%s): rank 0 issued %s of %llu elements "
               "(dtype %d, op %d), rank %d issued %s of %llu elements (dtype %d, op %d)",
               (unsigned long long)index, what, gca__coll_kind_name(a->kind),
               (unsigned long long)a->count, (int)a->dtype, (int)a->op, r,
               gca__coll_kind_name(b->kind), (unsigned long long)b->count, (int)b->dtype,
               (int)b->op);
      return true;
    }
  }
  return false;
}

static size_t input_bytes(const gca__coll_t *co) {
  size_t es = gca_dtype_size(co->dtype);
  return co->kind == GCA__REDUCE_SCATTER ? co->count * (size_t)co->comm->nranks * es
                                         : co->count * es;
}

/* Ranks as processes move a collective in rounds of at most `per` elements
 * of each rank block (Note [Sim ranks as processes]): round k covers
 * elements [k * per, k * per + e) of every block. Stages this rank's part. */
static void stage_round(const xchg_t *x, const gca__coll_t *co, size_t k, size_t per, size_t e) {
  size_t es = gca_dtype_size(co->dtype);
  unsigned char *area = x->areas + (size_t)co->comm->rank * x->chunk;
  const unsigned char *send = co->send;
  if (co->kind != GCA__REDUCE_SCATTER) {
    memcpy(area, send + k * per * es, e * es);
    return;
  }
  for (int j = 0; j < co->comm->nranks; j++)
    memcpy(area + (size_t)j * e * es, send + ((size_t)j * co->count + k * per) * es, e * es);
}

/* This rank's output for round k from every rank's staged part (a staged
 * reduce-scatter part holds every block's e elements, block after block). */
static void compute_round(const xchg_t *x, const gca__coll_t *co, size_t k, size_t per, size_t e) {
  size_t es = gca_dtype_size(co->dtype);
  int n = co->comm->nranks, rank = co->comm->rank;
  unsigned char *recv = co->recv;
  const void *in[4096];
  for (int j = 0; j < n; j++)
    in[j] = staged_of(x, j);
  switch (co->kind) {
  case GCA__ALL_GATHER:
    for (int j = 0; j < n; j++)
      memcpy(recv + ((size_t)j * co->count + k * per) * es, in[j], e * es);
    break;
  case GCA__REDUCE_SCATTER:
    gca__reduce(co->dtype, co->op, n, in, (size_t)rank * e, recv + k * per * es, e);
    break;
  case GCA__ALL_REDUCE:
    gca__reduce(co->dtype, co->op, n, in, 0, recv + k * per * es, e);
    break;
  }
}

/* The modelled time of the collective (Note [Sim rendezvous]): latency plus
 * the bytes a ring moves per rank over the bandwidth. Slept, or with the
 * sim's virtual clock added to the latest rank's start (start_vt). */
static void model_cost(const gca__coll_t *co, uint64_t start_vt) {
  const gca_comm_options_t *o = &co->comm->opts;
  double n = co->comm->nranks, bytes = (double)input_bytes(co);
  if (co->kind == GCA__ALL_GATHER)
    bytes *= n - 1;
  else if (co->kind == GCA__REDUCE_SCATTER)
    bytes *= (n - 1) / n;
  else
    bytes *= 2 * (n - 1) / n;
  double ns = o->latency_us * 1000.0 + (o->bandwidth_gbps > 0 ? bytes / o->bandwidth_gbps : 0);
  if (gca__device_virtual_clock()) {
    gca__device_clock_advance_to(start_vt + (ns > 0 ? (uint64_t)ns : 0));
    return;
  }
  if (ns <= 0)
    return;
  struct timespec ts = {(time_t)(ns / 1e9), (long)(ns - (double)(time_t)(ns / 1e9) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* With x->m->mu held: the rounds of one collective; false when the meeting
 * broke (the reason in x->m->why). *start_vt: the latest rank's clock at its
 * post. */
static bool exchange(const xchg_t *x, const gca__coll_t *co, uint64_t index, uint64_t *start_vt) {
  gca_comm_t *comm = co->comm;
  int n = comm->nranks;
  double t = comm->opts.timeout_s;
  size_t es = gca_dtype_size(co->dtype);
  size_t per = co->count ? co->count : 1, rounds = 1;
  if (x->areas) {
    per = x->chunk / es / (co->kind == GCA__REDUCE_SCATTER ? (size_t)n : 1);
    rounds = co->count ? (co->count + per - 1) / per : 1;
  }
  char why[384];
  for (size_t k = 0; k < rounds; k++) {
    size_t e = co->count - k * per < per ? co->count - k * per : per;
    if (x->areas) {
      gca__meet_unlock(x->m);
      stage_round(x, co, k, per, e);
      gca__meet_lock(x->m);
    }
    for (int b = 0; b < 2; b++) {
      int got = barrier(x->m, b, n, t);
      if (got == TIMED_OUT) {
        char who[128];
        missing_ranks(x, n, who, sizeof(who));
        snprintf(why, sizeof(why),
                 "%s #%llu: timed out after %.3g s waiting for rank(s) %s, which did not issue it",
                 gca__coll_kind_name(co->kind), (unsigned long long)index, t,
                 b == 0 && k == 0 ? who : "(still exchanging)");
        gca__meet_break(x->m, why);
      }
      if (got != MET || x->m->broken)
        return false;
      if (b == 1)
        break;
      if (k == 0 && differs(x, n, index, why, sizeof(why))) {
        gca__meet_break(x->m, why);
        return false;
      }
      for (int r = 0; k == 0 && r < n; r++)
        if (x->desc[r].vt > *start_vt)
          *start_vt = x->desc[r].vt;
      x->m->computing++;
      gca__meet_unlock(x->m);
      compute_round(x, co, k, per, e);
      gca__meet_lock(x->m);
      if (--x->m->computing == 0)
        pthread_cond_broadcast(&x->m->cv);
    }
  }
  return true;
}

void gca__sim_run(void *arg) {
  gca__coll_t *co = arg;
  gca_comm_t *comm = co->comm;
  uint64_t index = atomic_fetch_add(&comm->ran, 1);
  char why[384] = "";
  bool ok = false;
  pthread_mutex_lock(&comm->mu);
  bool failed = comm->error != GCA_OK;
  pthread_mutex_unlock(&comm->mu);
  if (failed) {
    gca__comm_ran(comm, co, false);
    return;
  }
  xchg_t x = {0};
  void *stage = NULL;
  uint64_t start_vt = 0;
  if (comm->proc) {
    x = (xchg_t){comm->proc->m, comm->proc->desc, NULL, comm->proc->areas, comm->proc->chunk};
  } else {
    x = (xchg_t){&comm->clique->m, comm->clique->desc, comm->clique->staged, NULL, 0};
    size_t bytes = input_bytes(co);
    stage = malloc(bytes ? bytes : 1);
    if (stage)
      memcpy(stage, co->send, bytes);
  }
  gca__meet_lock(x.m);
  if (!comm->proc && !stage) {
    snprintf(why, sizeof(why), "%s #%llu: no host memory to stage %zu bytes",
             gca__coll_kind_name(co->kind), (unsigned long long)index, input_bytes(co));
    gca__meet_break(x.m, why);
  } else if (GCA_FAILPOINT("sim_collective")) { /* a transport failure, as a test asks */
    snprintf(why, sizeof(why), "%s #%llu: the transport failed on rank %d (injected fault)",
             gca__coll_kind_name(co->kind), (unsigned long long)index, comm->rank);
    gca__meet_break(x.m, why);
  } else if (!x.m->broken) {
    x.desc[comm->rank] = (gca__coll_desc_t){.kind = (int32_t)co->kind,
                                            .dtype = (int32_t)co->dtype,
                                            .op = (int32_t)co->op,
                                            .posted = 1,
                                            .count = co->count,
                                            .vt = gca__device_clock_now()};
    if (x.staged)
      x.staged[comm->rank] = stage;
    ok = exchange(&x, co, index, &start_vt);
    x.desc[comm->rank].posted = 0;
    if (x.staged) {
      /* a broken meeting lets a rank out while others still read its input:
       * it is withdrawn (and freed below) only once nobody reads */
      while (x.m->computing > 0)
        pthread_cond_wait(&x.m->cv, &x.m->mu);
      x.staged[comm->rank] = NULL;
    }
  }
  if (!ok)
    snprintf(why, sizeof(why), "%s", x.m->why);
  gca__meet_unlock(x.m);
  free(stage);
  if (ok) {
    model_cost(co, start_vt);
  } else {
    char detail[512];
    snprintf(detail, sizeof(detail), "%s #%llu on rank %d of %d: %s", gca__coll_kind_name(co->kind),
             (unsigned long long)index, comm->rank, comm->nranks, why);
    gca__comm_fail(comm, GCA_ERR_INVALID_STATE, detail);
  }
  gca__comm_ran(comm, co, ok);
}
