/* SPDX-License-Identifier: Apache-2.0 */
/* verify.c - the lifecycle verifier: the allocations and frees that really
 * happen, seen through a trace observer, against the estimator's plan, op by
 * op.
 *
 * The one idea: the observer only appends what it sees (address, size, kind)
 * to a log under the verifier's own mutex — it runs with the allocator's lock
 * held — and all matching happens at end_op on the caller's thread: observed
 * allocations are matched to the storages the plan allocates at that step by
 * size (and remembered by address), observed frees are named through those
 * addresses, and whatever is left over on either side is a mismatch. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "sched_internal.h"

#define MISSED (GCA__NONE - 1) /* free_step of a storage reported as not freed in time */

typedef struct seen {
  bool alloc; /* else a free request */
  uint64_t addr, size;
} seen_t;

typedef struct addr_ent {
  uint64_t addr;
  size_t storage;
} addr_ent_t;

struct gca_verifier {
  const gca_opgraph_t *g;
  size_t *order, n;
  int device;
  gca_verify_mode_t mode;
  size_t *alloc_step, *free_step; /* per buffer (storages only) */
  gca_trace_observer_handle_t observer;
  pthread_mutex_t mu;
  bool open;   /* between begin_op and end_op */
  size_t step; /* the op being observed */
  seen_t *log; /* what the observer saw since begin_op */
  size_t nlog, caplog;
  bool log_failed;  /* the observer could not record an event (host memory) */
  addr_ent_t *live; /* live storages by address */
  size_t nlive, caplive;
  size_t mismatches;
  gca_mismatch_t first;
};

static void observe(const gca_trace_event_t *e, void *ctx) {
  gca_verifier_t *v = ctx;
  if (e->device != v->device ||
      (e->action != GCA_TRACE_ALLOC && e->action != GCA_TRACE_FREE_REQUESTED))
    return;
  pthread_mutex_lock(&v->mu);
  if (v->open) {
    if (v->nlog == v->caplog) {
      size_t ncap = v->caplog ? v->caplog * 2 : 16;
      seen_t *grown = GCA_FAILPOINT("verifier_log") ? NULL : realloc(v->log, ncap * sizeof(*grown));
      if (grown) {
        v->log = grown;
        v->caplog = ncap;
      }
    }
    if (v->nlog < v->caplog)
      v->log[v->nlog++] = (seen_t){e->action == GCA_TRACE_ALLOC, e->address, e->size};
    else
      v->log_failed = true;
  }
  pthread_mutex_unlock(&v->mu);
}

GCA_API const char *gca_mismatch_kind_name(gca_mismatch_kind_t kind) {
  static const char *const names[] = {"missing free", "unexpected free", "unexpected allocation",
                                      "missing allocation"};
  return (size_t)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "?";
}

GCA_API gca_status_t gca_verifier_create(const gca_opgraph_t *g, const size_t *order, size_t n,
                                         int device, gca_verify_mode_t mode, gca_verifier_t **out) {
  GCA_CHECK(gca__check_graph_arg("verifier_create", g, order, n));
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "verifier_create: out is NULL");
  if (mode != GCA_VERIFY_LOG && mode != GCA_VERIFY_ASSERT)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "verifier_create: unknown mode %d", (int)mode);
  GCA_CHECK(gca_opgraph_check_order(g, order, n));
  gca_verifier_t *v = calloc(1, sizeof(*v));
  gca_status_t st = GCA_OK;
  if (!v)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "verifier_create: no host memory for a verifier");
  pthread_mutex_init(&v->mu, NULL);
  v->g = g;
  v->n = n;
  v->device = device;
  v->mode = mode;
  v->order = malloc((n + 1) * sizeof(size_t));
  v->alloc_step = malloc((g->nbufs + 1) * sizeof(size_t));
  v->free_step = malloc((g->nbufs + 1) * sizeof(size_t));
  if (!v->order || !v->alloc_step || !v->free_step) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory for the verifier's tables");
    goto fail;
  }
  memcpy(v->order, order, n * sizeof(size_t));
  GCA_CHECK_GOTO(gca__opgraph_lifetimes(g, order, n, v->alloc_step, v->free_step), st, fail);
  for (size_t b = 0; b < g->nbufs; b++)
    if (g->bufs[b].bytes == 0) /* nothing to allocate: not observable */
      v->alloc_step[b] = v->free_step[b] = GCA__NONE;
  GCA_CHECK_GOTO(gca_trace_observer_add(observe, v, &v->observer), st, fail);
  *out = v;
  return GCA_OK;
fail:
  gca_verifier_destroy(v);
  return gca__error_prefix(st, "verifier_create");
}

void gca__verifier_ignore(gca_verifier_t *v, size_t storage) {
  if (v && storage < v->g->nbufs)
    v->alloc_step[storage] = v->free_step[storage] = GCA__NONE;
}

GCA_API void gca_verifier_destroy(gca_verifier_t *v) {
  if (!v)
    return;
  if (v->observer)
    GCA_CHECK_IGNORE(gca_trace_observer_remove(v->observer));
  pthread_mutex_destroy(&v->mu);
  free(v->order);
  free(v->alloc_step);
  free(v->free_step);
  free(v->log);
  free(v->live);
  free(v);
}

GCA_API gca_status_t gca_verifier_begin_op(gca_verifier_t *v, size_t step) {
  if (!v || step >= v->n)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "verifier_begin_op: no verifier or step %zu of %zu",
                      step, v ? v->n : 0);
  pthread_mutex_lock(&v->mu);
  bool was_open = v->open;
  if (!was_open) {
    v->open = true;
    v->step = step;
    v->nlog = 0;
    v->log_failed = false;
  }
  pthread_mutex_unlock(&v->mu);
  if (was_open)
    return gca__error(GCA_ERR_INVALID_STATE, "verifier_begin_op: step %zu is still open", v->step);
  return GCA_OK;
}

static bool live_add(gca_verifier_t *v, uint64_t addr, size_t storage) {
  if (v->nlive == v->caplive) {
    size_t ncap = v->caplive ? v->caplive * 2 : 16;
    addr_ent_t *grown = realloc(v->live, ncap * sizeof(*grown));
    if (!grown)
      return false;
    v->live = grown;
    v->caplive = ncap;
  }
  v->live[v->nlive++] = (addr_ent_t){addr, storage};
  return true;
}

static size_t live_take(gca_verifier_t *v, uint64_t addr) {
  for (size_t i = 0; i < v->nlive; i++)
    if (v->live[i].addr == addr) {
      size_t s = v->live[i].storage;
      v->live[i] = v->live[--v->nlive];
      return s;
    }
  return GCA__NONE;
}

/* Counts a mismatch, keeps the first, logs it; its text is the error detail. */
static void mismatch(gca_verifier_t *v, gca_mismatch_kind_t kind, size_t storage, uint64_t bytes,
                     uint64_t addr) {
  const gca_opgraph_t *g = v->g;
  gca_mismatch_t m = {.kind = kind,
                      .step = v->step,
                      .op = g->ops[v->order[v->step]].name,
                      .buffer = storage == GCA__NONE ? NULL : g->bufs[storage].name,
                      .bytes = bytes};
  if (v->mismatches++ == 0)
    v->first = m;
  if (storage == GCA__NONE)
    (void)gca__error(
        GCA_ERR_INVALID_STATE, "verifier: step %zu (op '%s'): %s of %llu bytes at 0x%llx", m.step,
        m.op, gca_mismatch_kind_name(kind), (unsigned long long)bytes, (unsigned long long)addr);
  else
    (void)gca__error(GCA_ERR_INVALID_STATE, "verifier: step %zu (op '%s'): %s of '%s' (%llu bytes)",
                     m.step, m.op, gca_mismatch_kind_name(kind), m.buffer,
                     (unsigned long long)bytes);
  if (v->mode == GCA_VERIFY_LOG)
    GCA_LOG_WARN("%s", gca_last_error());
}

GCA_API gca_status_t gca_verifier_end_op(gca_verifier_t *v, size_t step) {
  if (!v)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "verifier_end_op: verifier is NULL");
  pthread_mutex_lock(&v->mu);
  bool ok = v->open && v->step == step;
  v->open = false;
  size_t nlog = v->nlog;
  bool lost = v->log_failed;
  pthread_mutex_unlock(&v->mu);
  if (!ok)
    return gca__error(GCA_ERR_INVALID_STATE, "verifier_end_op: step %zu was not begun", step);
  if (lost)
    return gca__error(GCA_ERR_OUT_OF_MEMORY,
                      "verifier_end_op: step %zu: no host memory to record an event", step);
  const gca_opgraph_t *g = v->g;
  size_t before = v->mismatches;
  /* expected allocations at this step, matched by size in buffer order */
  size_t nexp = 0;
  for (size_t b = 0; b < g->nbufs; b++)
    nexp += v->alloc_step[b] == step;
  size_t *exp = malloc((nexp + 1) * sizeof(size_t));
  if (!exp)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "verifier_end_op: no host memory");
  nexp = 0;
  for (size_t b = 0; b < g->nbufs; b++)
    if (v->alloc_step[b] == step)
      exp[nexp++] = b;
  /* the log is stable now: the step is closed */
  for (size_t i = 0; i < nlog; i++) {
    const seen_t *e = &v->log[i];
    if (e->alloc) {
      size_t k = 0;
      while (k < nexp && (exp[k] == GCA__NONE || (uint64_t)g->bufs[exp[k]].bytes != e->size))
        k++;
      if (k == nexp) {
        mismatch(v, GCA_MISMATCH_UNEXPECTED_ALLOC, GCA__NONE, e->size, e->addr);
        continue;
      }
      if (!live_add(v, e->addr, exp[k])) {
        free(exp);
        return gca__error(GCA_ERR_OUT_OF_MEMORY, "verifier_end_op: no host memory");
      }
      exp[k] = GCA__NONE;
    } else {
      size_t s = live_take(v, e->addr);
      if (s == GCA__NONE)
        continue; /* not a storage of the plan (an input, or an unexpected allocation) */
      if (v->free_step[s] != step && v->free_step[s] != MISSED)
        mismatch(v, GCA_MISMATCH_UNEXPECTED_FREE, s, (uint64_t)g->bufs[s].bytes, e->addr);
      v->free_step[s] = GCA__NONE; /* freed: reported once, whenever it happened */
    }
  }
  for (size_t k = 0; k < nexp; k++)
    if (exp[k] != GCA__NONE) {
      v->free_step[exp[k]] = GCA__NONE; /* never allocated: its free is not due either */
      mismatch(v, GCA_MISMATCH_MISSING_ALLOC, exp[k], (uint64_t)g->bufs[exp[k]].bytes, 0);
    }
  free(exp);
  for (size_t b = 0; b < g->nbufs; b++)
    if (v->free_step[b] == step) {
      v->free_step[b] = MISSED; /* its late free is not a second mismatch */
      mismatch(v, GCA_MISMATCH_MISSING_FREE, b, (uint64_t)g->bufs[b].bytes, 0);
    }
  if (v->mismatches > before && v->mode == GCA_VERIFY_ASSERT)
    return GCA_ERR_INVALID_STATE; /* the detail names the step's last mismatch */
  return GCA_OK;
}

GCA_API gca_status_t gca_verifier_result(const gca_verifier_t *v, size_t *mismatches,
                                         gca_mismatch_t *first) {
  if (!v || !mismatches)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "verifier_result: NULL argument");
  *mismatches = v->mismatches;
  if (first && v->mismatches)
    *first = v->first;
  return GCA_OK;
}
