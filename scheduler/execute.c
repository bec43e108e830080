/* SPDX-License-Identifier: Apache-2.0 */
/* execute.c - the executor: runs an order of a graph's ops on gca streams
 * through the allocator, with the lifecycle verifier alongside.
 *
 * The one idea: the executor does exactly what the plan says and nothing the
 * plan does not — the estimator's lifetimes decide every gca_malloc and
 * gca_free, ops are kernels of their duration on the stream the time model
 * puts them on, and events carry the model's two orderings (a collective
 * starts after what the compute stream issued before it; a wait holds the
 * compute stream until its collective ends) — so what the verifier and the
 * timers measure can be compared with the prediction. Collectives are
 * modelled by their duration (one rank). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "sched_internal.h"

typedef struct exec {
  const gca_opgraph_t *g;
  const size_t *order;
  size_t n;
  const gca_execute_options_t *o;
  gca_stream_t compute, *comm;
  gca_event_t *issue, *done; /* per op: a collective's start gate and end */
  gca_event_t t0, t1;
  void **ptr; /* per storage */
  size_t *alloc_step, *free_step;
  void *extra; /* the fault's extra allocation */
  gca_verifier_t *verifier;
} exec_t;

static uint64_t ns_of(const exec_t *x, double us) {
  double ns = us * x->o->time_scale * 1000.0;
  return ns <= 0 ? 0 : (uint64_t)llround(ns);
}

/* Records that the op's buffers are used on `s` (frees wait for it). */
static gca_status_t use_on(exec_t *x, const gca__sop_t *o, gca_stream_t s) {
  const gca_opgraph_t *g = x->g;
  for (size_t k = 0; k < o->nreads + o->nwrites; k++) {
    size_t b = k < o->nreads ? o->reads[k] : o->writes[k - o->nreads];
    void *p = x->ptr[g->bufs[b].storage];
    if (p)
      GCA_CHECK(gca_record_stream(p, s));
  }
  return GCA_OK;
}

/* The shape of a collective op for <gca/collectives.h>: its input and output
 * storages, and how many elements of which dtype (Note [Collectives of a
 * plan]). */
typedef struct coll_shape {
  size_t in, out;
  size_t count;
  gca_dtype_t dtype;
} coll_shape_t;

/* Note [Collectives of a plan]: an op names its collective ("all_gather",
 * "reduce_scatter", "all_reduce") and reads one buffer and writes one; the
 * byte sizes must fit the kind on this many ranks (all_gather: out = nranks x
 * in; reduce_scatter: in = nranks x out; all_reduce: in = out). Elements are
 * f32 where the sizes allow, else bytes; reductions sum. */
static gca_status_t shape_of(const gca_opgraph_t *g, const gca__sop_t *o, int nranks,
                             coll_shape_t *sh) {
  if (o->nreads != 1 || o->nwrites != 1)
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "collective '%s' reads %zu and writes %zu buffers; one of each is needed",
                      o->name, o->nreads, o->nwrites);
  sh->in = g->bufs[o->reads[0]].storage;
  sh->out = g->bufs[o->writes[0]].storage;
  uint64_t bi = (uint64_t)g->bufs[sh->in].bytes, bo = (uint64_t)g->bufs[sh->out].bytes;
  uint64_t n = (uint64_t)nranks, elems;
  const char *k = o->collective ? o->collective : "";
  if (strcmp(k, "all_gather") == 0 && bo == n * bi)
    elems = bi;
  else if (strcmp(k, "reduce_scatter") == 0 && bi == n * bo)
    elems = bo;
  else if (strcmp(k, "all_reduce") == 0 && bi == bo)
    elems = bo;
  else
    return gca__error(GCA_ERR_NOT_SUPPORTED,
                      "collective '%s' (%s) of %llu bytes into %llu does not fit %d ranks", o->name,
                      k, (unsigned long long)bi, (unsigned long long)bo, nranks);
  sh->dtype = elems % 4 == 0 ? GCA_DTYPE_F32 : GCA_DTYPE_U8;
  sh->count = (size_t)(sh->dtype == GCA_DTYPE_F32 ? elems / 4 : elems);
  return GCA_OK;
}

static gca_status_t collective(exec_t *x, const gca__sop_t *o, gca_stream_t s) {
  gca_comm_t *comm = x->o->comms[o->comm_idx];
  int nranks = 0;
  GCA_CHECK(gca_comm_count(comm, &nranks));
  coll_shape_t sh;
  GCA_CHECK(shape_of(x->g, o, nranks, &sh));
  void *in = x->ptr[sh.in], *out = x->ptr[sh.out];
  if (!in || !out)
    return GCA_OK; /* a skipped allocation (a verifier test): nothing to move */
  const char *k = o->collective;
  if (strcmp(k, "all_gather") == 0)
    return gca_all_gather(in, out, sh.count, sh.dtype, comm, s);
  if (strcmp(k, "reduce_scatter") == 0)
    return gca_reduce_scatter(in, out, sh.count, sh.dtype, GCA_REDUCE_SUM, comm, s);
  return gca_all_reduce(in, out, sh.count, sh.dtype, GCA_REDUCE_SUM, comm, s);
}

static gca_status_t run_op(exec_t *x, size_t op) {
  const gca__sop_t *o = &x->g->ops[op];
  switch (o->kind) {
  case GCA_OP_COMPUTE:
    return gca_kernel_sleep(ns_of(x, o->us), x->compute);
  case GCA_OP_COLLECTIVE: {
    gca_stream_t s = x->comm[o->comm_idx];
    GCA_CHECK(gca_event_record(x->issue[op], x->compute));
    GCA_CHECK(gca_stream_wait_event(s, x->issue[op]));
    GCA_CHECK(use_on(x, o, s));
    if (x->o->comms)
      GCA_CHECK(collective(x, o, s));
    GCA_CHECK(gca_kernel_sleep(ns_of(x, o->us), s));
    return gca_event_record(x->done[op], s);
  }
  case GCA_OP_WAIT:
    return gca_stream_wait_event(x->compute, x->done[o->coll]);
  }
  return GCA_OK;
}

/* The allocations of `step`, the op, then its frees, as the plan says (or
 * with the configured fault). */
static gca_status_t run_step(exec_t *x, size_t step, size_t *late) {
  const gca_opgraph_t *g = x->g;
  const gca_execute_options_t *o = x->o;
  bool faulty = o->fault != GCA_EXECUTE_FAULT_NONE && o->fault_step == step;
  bool skipped = false;
  for (size_t b = 0; b < g->nbufs; b++) {
    if (x->alloc_step[b] != step || g->bufs[b].bytes == 0)
      continue;
    if (faulty && o->fault == GCA_EXECUTE_FAULT_SKIP_ALLOC && !skipped) {
      skipped = true;
      continue;
    }
    GCA_CHECK(gca_malloc(&x->ptr[b], (size_t)g->bufs[b].bytes, x->compute));
  }
  if (faulty && o->fault == GCA_EXECUTE_FAULT_EXTRA_ALLOC && !x->extra)
    GCA_CHECK(gca_malloc(&x->extra, 4096 + 512, x->compute));
  GCA_CHECK(run_op(x, x->order[step]));
  if (*late != GCA__NONE) { /* the fault's late free, one step on */
    GCA_CHECK(gca_free(x->ptr[*late]));
    x->ptr[*late] = NULL;
    *late = GCA__NONE;
  }
  bool delayed = false, early = false;
  for (size_t b = 0; b < g->nbufs; b++) {
    if (!x->ptr[b])
      continue;
    if (x->free_step[b] == step) {
      if (faulty && o->fault == GCA_EXECUTE_FAULT_LATE_FREE && !delayed) {
        delayed = true;
        *late = b;
        continue;
      }
      GCA_CHECK(gca_free(x->ptr[b]));
      x->ptr[b] = NULL;
    } else if (faulty && o->fault == GCA_EXECUTE_FAULT_EARLY_FREE && !early &&
               x->free_step[b] != GCA__NONE && x->free_step[b] > step && x->alloc_step[b] < step) {
      early = true;
      GCA_CHECK(gca_free(x->ptr[b]));
      x->ptr[b] = NULL;
    }
  }
  return GCA_OK;
}

static gca_status_t setup(exec_t *x) {
  const gca_opgraph_t *g = x->g;
  size_t nb = g->nbufs + 1, no = x->n + 1, nc = g->ncomms + 1;
  x->comm = calloc(nc, sizeof(gca_stream_t));
  x->issue = calloc(no, sizeof(gca_event_t));
  x->done = calloc(no, sizeof(gca_event_t));
  x->ptr = calloc(nb, sizeof(void *));
  x->alloc_step = malloc(nb * sizeof(size_t));
  x->free_step = malloc(nb * sizeof(size_t));
  if (!x->comm || !x->issue || !x->done || !x->ptr || !x->alloc_step || !x->free_step)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_execute: no host memory");
  GCA_CHECK(gca__opgraph_lifetimes(g, x->order, x->n, x->alloc_step, x->free_step));
  GCA_CHECK(gca_set_device(x->o->device));
  GCA_CHECK(gca_stream_create(&x->compute, GCA_STREAM_NON_BLOCKING));
  for (size_t c = 0; c < g->ncomms; c++)
    GCA_CHECK(gca_stream_create(&x->comm[c], GCA_STREAM_NON_BLOCKING));
  for (size_t i = 0; i < x->n; i++)
    if (g->ops[i].kind == GCA_OP_COLLECTIVE) {
      GCA_CHECK(gca_event_create(&x->issue[i], GCA_EVENT_DISABLE_TIMING));
      GCA_CHECK(gca_event_create(&x->done[i], GCA_EVENT_DISABLE_TIMING));
    }
  GCA_CHECK(gca_event_create(&x->t0, GCA_EVENT_DEFAULT));
  GCA_CHECK(gca_event_create(&x->t1, GCA_EVENT_DEFAULT));
  /* inputs, live before the first op */
  for (size_t b = 0; b < g->nbufs; b++)
    if (g->bufs[b].storage == b && g->bufs[b].kind == GCA_BUFFER_INPUT && g->bufs[b].bytes > 0)
      GCA_CHECK(gca_malloc(&x->ptr[b], (size_t)g->bufs[b].bytes, x->compute));
  return GCA_OK;
}

/* Waits for everything and gives back what setup and the run made. */
static void teardown(exec_t *x) {
  const gca_opgraph_t *g = x->g;
  if (x->compute)
    GCA_CHECK_IGNORE(gca_stream_synchronize(x->compute));
  for (size_t c = 0; x->comm && c < g->ncomms; c++)
    if (x->comm[c])
      GCA_CHECK_IGNORE(gca_stream_synchronize(x->comm[c]));
  for (size_t b = 0; x->ptr && b < g->nbufs; b++)
    if (x->ptr[b])
      GCA_CHECK_IGNORE(gca_free(x->ptr[b]));
  if (x->extra)
    GCA_CHECK_IGNORE(gca_free(x->extra));
  for (size_t i = 0; i < x->n && x->issue; i++) {
    if (x->issue[i])
      GCA_CHECK_IGNORE(gca_event_destroy(x->issue[i]));
    if (x->done[i])
      GCA_CHECK_IGNORE(gca_event_destroy(x->done[i]));
  }
  if (x->t0)
    GCA_CHECK_IGNORE(gca_event_destroy(x->t0));
  if (x->t1)
    GCA_CHECK_IGNORE(gca_event_destroy(x->t1));
  for (size_t c = 0; x->comm && c < g->ncomms; c++)
    if (x->comm[c])
      GCA_CHECK_IGNORE(gca_stream_destroy(x->comm[c]));
  if (x->compute)
    GCA_CHECK_IGNORE(gca_stream_destroy(x->compute));
  gca_verifier_destroy(x->verifier);
  free(x->comm);
  free(x->issue);
  free(x->done);
  free(x->ptr);
  free(x->alloc_step);
  free(x->free_step);
}

GCA_API gca_status_t gca_opgraph_execute(const gca_opgraph_t *g, const size_t *order, size_t n,
                                         const gca_execute_options_t *opts,
                                         gca_execute_result_t *result) {
  static const char fn[] = "opgraph_execute";
  GCA_CHECK(gca__check_graph_arg(fn, g, order, n));
  if (!opts || opts->size < sizeof(*opts) || !result || result->size < sizeof(*result))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: options or result is NULL or unsized", fn);
  if (!(opts->time_scale > 0) || !isfinite(opts->time_scale))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: time_scale %g is not positive", fn,
                      opts->time_scale);
  if (opts->fault > GCA_EXECUTE_FAULT_SKIP_ALLOC)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: unknown fault %d", fn, (int)opts->fault);
  gca_execute_result_t r = {.size = sizeof(r)};
  r.predicted.size = sizeof(r.predicted);
  GCA_CHECK(gca_opgraph_estimate(g, order, n, &r.predicted, NULL));
  for (size_t c = 0; opts->comms && c < g->ncomms; c++) {
    int nranks = 0;
    GCA_CHECK(gca_comm_count(opts->comms[c], &nranks));
    for (size_t i = 0; i < n; i++) {
      coll_shape_t sh;
      if (g->ops[i].kind != GCA_OP_COLLECTIVE || g->ops[i].comm_idx != c)
        continue;
      gca_status_t sst = shape_of(g, &g->ops[i], nranks, &sh);
      if (sst != GCA_OK)
        return gca__error_prefix(sst, "%s", fn);
    }
  }
  exec_t x = {.g = g, .order = order, .n = n, .o = opts};
  size_t late = GCA__NONE;
  gca_stats_t before;
  gca_status_t st = setup(&x);
  if (st == GCA_OK)
    st = gca_stream_synchronize(x.compute); /* the inputs exist before timing starts */
  /* Note [Measuring exposed communication]: the compute stream's time in the
   * run minus its time running the same compute kernels alone (measured here,
   * before the run) is the time it spent stalled at waits, without the
   * per-kernel launch costs of the device that the model does not have. */
  float alone_ms = 0;
  if (st == GCA_OK)
    st = gca_event_record(x.t0, x.compute);
  for (size_t i = 0; i < n && st == GCA_OK; i++)
    if (g->ops[order[i]].kind == GCA_OP_COMPUTE)
      st = gca_kernel_sleep(ns_of(&x, g->ops[order[i]].us), x.compute);
  if (st == GCA_OK)
    st = gca_event_record(x.t1, x.compute);
  if (st == GCA_OK)
    st = gca_event_synchronize(x.t1);
  if (st == GCA_OK)
    st = gca_event_elapsed_time(&alone_ms, x.t0, x.t1);
  if (st == GCA_OK)
    st = gca_reset_peak_stats(opts->device);
  if (st == GCA_OK && opts->verify)
    st = gca_verifier_create(g, order, n, opts->device, opts->verify_mode, &x.verifier);
  if (st == GCA_OK)
    st = gca_event_record(x.t0, x.compute);
  for (size_t i = 0; i < n && st == GCA_OK; i++) {
    if (x.verifier)
      GCA_CHECK_GOTO(gca_verifier_begin_op(x.verifier, i), st, out);
    st = run_step(&x, i, &late);
    if (x.verifier) {
      gca_status_t vst = gca_verifier_end_op(x.verifier, i);
      if (st == GCA_OK)
        st = vst;
    }
  }
  /* the compute stream's own end, then every communicator's */
  float compute_ms = 0, total_ms = 0;
  if (st == GCA_OK)
    st = gca_event_record(x.t1, x.compute);
  if (st == GCA_OK)
    st = gca_event_synchronize(x.t1);
  if (st == GCA_OK)
    st = gca_event_elapsed_time(&compute_ms, x.t0, x.t1);
  for (size_t c = 0; c < g->ncomms && st == GCA_OK; c++) {
    gca_event_t e = NULL;
    st = gca_event_create(&e, GCA_EVENT_DISABLE_TIMING);
    if (st == GCA_OK)
      st = gca_event_record(e, x.comm[c]);
    if (st == GCA_OK)
      st = gca_stream_wait_event(x.compute, e);
    if (e)
      GCA_CHECK_IGNORE(gca_event_destroy(e));
  }
  if (st == GCA_OK)
    st = gca_event_record(x.t1, x.compute);
  if (st == GCA_OK)
    st = gca_event_synchronize(x.t1);
  if (st == GCA_OK)
    st = gca_event_elapsed_time(&total_ms, x.t0, x.t1);
  if (st == GCA_OK)
    st = gca_get_stats(opts->device, &before);
  if (st == GCA_OK) {
    double scale = opts->time_scale;
    r.measured_makespan_us = (double)total_ms * 1000.0 / scale;
    r.measured_exposed_comm_us = (double)(compute_ms - alone_ms) * 1000.0 / scale;
    if (r.measured_exposed_comm_us < 0)
      r.measured_exposed_comm_us = 0;
    r.measured_peak_bytes = before.allocated_bytes[GCA_STAT_ALL].peak;
  }
out:
  if (x.verifier)
    GCA_CHECK_IGNORE(gca_verifier_result(x.verifier, &r.mismatches, &r.first_mismatch));
  if (st != GCA_OK) {
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", gca_last_error());
    teardown(&x);
    *result = r;
    return gca__error(st, "%s: %s", fn, detail);
  }
  teardown(&x);
  *result = r;
  return GCA_OK;
}
