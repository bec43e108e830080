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
 * the error naming the collective (its kind and number on that rank). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_internal.h"

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

/* With c->mu held: the ranks that have not posted (for a timeout's message). */
static void missing_ranks(const gca__clique_t *c, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (int r = 0; r < c->nranks && at + 16 < len; r++)
    if (!c->posted[r])
      at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? ", " : "", r);
}

/* With c->mu held: waits at barrier b; false when the clique broke or the
 * wait timed out (which breaks it, naming what was waited for). */
static bool barrier(gca__clique_t *c, int b, const gca__coll_t *co, uint64_t index) {
  uint64_t g = c->gen[b];
  if (++c->arrived[b] == c->nranks) {
    c->arrived[b] = 0;
    c->gen[b]++;
    pthread_cond_broadcast(&c->cv);
    return true;
  }
  struct timespec dl;
  gca__deadline_after(co->comm->opts.timeout_s, &dl);
  int rc = 0;
  while (c->gen[b] == g && !c->broken && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&c->cv, &c->mu, &dl);
  if (c->gen[b] != g)
    return true;
  c->arrived[b]--;
  if (!c->broken) {
    char who[128], why[384];
    missing_ranks(c, who, sizeof(who));
    snprintf(why, sizeof(why),
             "%s #%llu: timed out after %.3g s waiting for rank(s) %s, which did not issue it",
             gca__coll_kind_name(co->kind), (unsigned long long)index, co->comm->opts.timeout_s,
             b == 0 ? who : "(still reading)");
    gca__clique_break(c, why);
  }
  return false;
}

/* With c->mu held: the first difference between the posted collectives, or
 * false when they agree. */
static bool differs(const gca__clique_t *c, uint64_t index, char *why, size_t len) {
  const gca__coll_t *a = c->posted[0];
  for (int r = 1; r < c->nranks; r++) {
    const gca__coll_t *b = c->posted[r];
    const char *what = a->kind != b->kind                             ? "kind"
                       : a->count != b->count                         ? "count"
                       : a->dtype != b->dtype                         ? "dtype"
                       : a->kind != GCA__ALL_GATHER && a->op != b->op ? "reduce op"
                                                                      : NULL;
    if (what) {
      snprintf(why, len,
               "collective #%llu differs between ranks (%s): rank 0 issued %s of %zu elements "
               "(dtype %d, op %d), rank %d issued %s of %zu elements (dtype %d, op %d)",
               (unsigned long long)index, what, gca__coll_kind_name(a->kind), a->count,
               (int)a->dtype, (int)a->op, r, gca__coll_kind_name(b->kind), b->count, (int)b->dtype,
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

static void compute(const gca__clique_t *c, const gca__coll_t *co) {
  size_t es = gca_dtype_size(co->dtype);
  int n = c->nranks, rank = co->comm->rank;
  switch (co->kind) {
  case GCA__ALL_GATHER:
    for (int j = 0; j < n; j++)
      memcpy((char *)co->recv + (size_t)j * co->count * es, c->staged[j], co->count * es);
    break;
  case GCA__REDUCE_SCATTER:
    gca__reduce(co->dtype, co->op, n, (const void *const *)c->staged, (size_t)rank * co->count,
                co->recv, co->count);
    break;
  case GCA__ALL_REDUCE:
    gca__reduce(co->dtype, co->op, n, (const void *const *)c->staged, 0, co->recv, co->count);
    break;
  }
}

/* The modelled time of the collective (Note [Sim rendezvous]): latency plus
 * the bytes a ring moves per rank over the bandwidth. */
static void model_cost(const gca__coll_t *co) {
  const gca_comm_options_t *o = &co->comm->opts;
  double n = co->comm->nranks, bytes = (double)input_bytes(co);
  if (co->kind == GCA__ALL_GATHER)
    bytes *= n - 1;
  else if (co->kind == GCA__REDUCE_SCATTER)
    bytes *= (n - 1) / n;
  else
    bytes *= 2 * (n - 1) / n;
  double ns = o->latency_us * 1000.0 + (o->bandwidth_gbps > 0 ? bytes / o->bandwidth_gbps : 0);
  if (ns <= 0)
    return;
  struct timespec ts = {(time_t)(ns / 1e9), (long)(ns - (double)(time_t)(ns / 1e9) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

void gca__sim_run(void *arg) {
  gca__coll_t *co = arg;
  gca_comm_t *comm = co->comm;
  gca__clique_t *c = comm->clique;
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
  size_t bytes = input_bytes(co);
  void *stage = malloc(bytes ? bytes : 1);
  if (stage)
    memcpy(stage, co->send, bytes);
  pthread_mutex_lock(&c->mu);
  if (!stage) {
    snprintf(why, sizeof(why), "%s #%llu: no host memory to stage %zu bytes",
             gca__coll_kind_name(co->kind), (unsigned long long)index, bytes);
    gca__clique_break(c, why);
  } else if (!c->broken) {
    c->posted[comm->rank] = co;
    c->staged[comm->rank] = stage;
    if (barrier(c, 0, co, index) && !c->broken) {
      if (differs(c, index, why, sizeof(why))) {
        gca__clique_break(c, why);
      } else {
        pthread_mutex_unlock(&c->mu);
        compute(c, co);
        pthread_mutex_lock(&c->mu);
        ok = barrier(c, 1, co, index);
      }
    }
    c->posted[comm->rank] = NULL;
    c->staged[comm->rank] = NULL;
    if (ok && comm->rank == 0)
      c->round++;
  }
  if (!ok)
    snprintf(why, sizeof(why), "%s", c->why);
  pthread_mutex_unlock(&c->mu);
  free(stage);
  if (ok) {
    model_cost(co);
  } else {
    char detail[512];
    snprintf(detail, sizeof(detail), "%s #%llu on rank %d of %d: %s", gca__coll_kind_name(co->kind),
             (unsigned long long)index, comm->rank, comm->nranks, why);
    gca__comm_fail(comm, GCA_ERR_INVALID_STATE, detail);
  }
  gca__comm_ran(comm, co, ok);
}
