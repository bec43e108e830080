/* SPDX-License-Identifier: Apache-2.0 */
/* plan.c - plans: an order of a graph's ops issued on the caller's stream,
 * run after run, through the allocator, with the lifecycle verifier alongside.
 *
 * The one idea: a run does exactly what the plan says and nothing the plan
 * does not — the estimator's lifetimes decide every gca_malloc and gca_free,
 * compute ops are the caller's work (or kernels of their duration) on the
 * caller's stream, and events carry the model's two orderings (a collective
 * starts after what the compute stream issued before it; a wait holds the
 * compute stream until its collective ends) — and nothing in a run waits on
 * the host, so the same run can be captured into a graph. Every
 * communicator's stream is joined back to the caller's stream at the end of a
 * run (Note [Plans under capture]). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "sched_internal.h"

struct gca_plan {
  const gca_opgraph_t *g;
  size_t *order;
  size_t n;
  gca_execute_options_t o;
  gca_comm_t **comms;             /* o.comms copied (NULL: modelled collectives) */
  gca_stream_t *comm;             /* per communicator */
  gca_event_t *issue, *done;      /* per op: a collective's start gate and end */
  gca_event_t *joined;            /* per communicator: its last work of a run */
  size_t *alloc_step, *free_step; /* per storage */
  /* this run's */
  gca_stream_t stream;
  void **ptr;  /* per storage: its memory while live */
  bool *bound; /* per storage: the caller's memory */
  void **bufs; /* per buffer (views resolved), for the compute callback */
  void *extra; /* the fault's extra allocation */
  size_t late; /* the fault's late free */
  gca_verifier_t *verifier;
  /* over every run */
  size_t mismatches;
  gca_mismatch_t first;
};

static uint64_t ns_of(const gca_plan_t *p, double us) {
  double ns = us * p->o.time_scale * 1000.0;
  return ns <= 0 ? 0 : (uint64_t)llround(ns);
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

static gca_status_t collective(gca_plan_t *p, const gca__sop_t *o, gca_stream_t s) {
  gca_comm_t *comm = p->comms[o->comm_idx];
  int nranks = 0;
  GCA_CHECK(gca_comm_count(comm, &nranks));
  coll_shape_t sh;
  GCA_CHECK(shape_of(p->g, o, nranks, &sh));
  void *in = p->ptr[sh.in], *out = p->ptr[sh.out];
  if (!in || !out)
    return GCA_OK; /* a skipped allocation (a verifier test): nothing to move */
  const char *k = o->collective;
  if (strcmp(k, "all_gather") == 0)
    return gca_all_gather(in, out, sh.count, sh.dtype, comm, s);
  if (strcmp(k, "reduce_scatter") == 0)
    return gca_reduce_scatter(in, out, sh.count, sh.dtype, GCA_REDUCE_SUM, comm, s);
  return gca_all_reduce(in, out, sh.count, sh.dtype, GCA_REDUCE_SUM, comm, s);
}

static gca_status_t compute(gca_plan_t *p, size_t op) {
  const gca_opgraph_t *g = p->g;
  for (size_t b = 0; b < g->nbufs; b++)
    p->bufs[b] = p->ptr[g->bufs[b].storage];
  return p->o.compute(p->o.compute_ctx, op, p->bufs, p->stream);
}

static gca_status_t run_op(gca_plan_t *p, size_t op) {
  const gca__sop_t *o = &p->g->ops[op];
  switch (o->kind) {
  case GCA_OP_COMPUTE:
    if (p->o.compute)
      GCA_CHECK(compute(p, op));
    if (!p->o.compute || o->us > 0)
      return gca_kernel_sleep(ns_of(p, o->us), p->stream);
    return GCA_OK;
  case GCA_OP_COLLECTIVE: {
    gca_stream_t s = p->comm[o->comm_idx];
    GCA_CHECK(gca_event_record(p->issue[op], p->stream));
    GCA_CHECK(gca_stream_wait_event(s, p->issue[op]));
    if (p->comms)
      GCA_CHECK(collective(p, o, s));
    if (!p->comms || ns_of(p, o->us) > 0)
      GCA_CHECK(gca_kernel_sleep(ns_of(p, o->us), s));
    return gca_event_record(p->done[op], s);
  }
  case GCA_OP_WAIT:
    return gca_stream_wait_event(p->stream, p->done[o->coll]);
  }
  return GCA_OK;
}

static gca_status_t plan_malloc(gca_plan_t *p, size_t b) {
  return gca_malloc(&p->ptr[b], (size_t)p->g->bufs[b].bytes, p->stream);
}

static gca_status_t plan_free(gca_plan_t *p, size_t b) {
  void *q = p->ptr[b];
  p->ptr[b] = NULL;
  return p->bound[b] ? GCA_OK : gca_free(q);
}

/* The allocations of `step`, the op, then its frees, as the plan says (or
 * with the configured fault). */
static gca_status_t run_step(gca_plan_t *p, size_t step) {
  const gca_opgraph_t *g = p->g;
  const gca_execute_options_t *o = &p->o;
  bool faulty = o->fault != GCA_EXECUTE_FAULT_NONE && o->fault_step == step;
  bool skipped = false;
  for (size_t b = 0; b < g->nbufs; b++) {
    if (p->alloc_step[b] != step || g->bufs[b].bytes == 0 || p->bound[b])
      continue;
    if (faulty && o->fault == GCA_EXECUTE_FAULT_SKIP_ALLOC && !skipped) {
      skipped = true;
      continue;
    }
    GCA_CHECK(plan_malloc(p, b));
  }
  if (faulty && o->fault == GCA_EXECUTE_FAULT_EXTRA_ALLOC && !p->extra)
    GCA_CHECK(gca_malloc(&p->extra, 4096 + 512, p->stream));
  GCA_CHECK(run_op(p, p->order[step]));
  if (p->late != GCA__NONE) { /* the fault's late free, one step on */
    size_t b = p->late;
    p->late = GCA__NONE;
    GCA_CHECK(plan_free(p, b));
  }
  bool delayed = false, early = false;
  for (size_t b = 0; b < g->nbufs; b++) {
    if (!p->ptr[b] || p->bound[b])
      continue;
    if (p->free_step[b] == step) {
      if (faulty && o->fault == GCA_EXECUTE_FAULT_LATE_FREE && !delayed) {
        delayed = true;
        p->late = b;
        continue;
      }
      GCA_CHECK(plan_free(p, b));
    } else if (faulty && o->fault == GCA_EXECUTE_FAULT_EARLY_FREE && !early &&
               p->free_step[b] != GCA__NONE && p->free_step[b] > step && p->alloc_step[b] < step) {
      early = true;
      GCA_CHECK(plan_free(p, b));
    }
  }
  return GCA_OK;
}

GCA_API gca_status_t gca_plan_create(const gca_opgraph_t *g, const size_t *order, size_t n,
                                     const gca_execute_options_t *opts, gca_plan_t **out) {
  static const char fn[] = "plan_create";
  GCA_CHECK(gca__check_graph_arg(fn, g, order, n));
  if (!out)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  if (!opts || opts->size < sizeof(*opts))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: options are NULL or unsized", fn);
  if (!(opts->time_scale >= 0) || !isfinite(opts->time_scale))
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: time_scale %g is negative", fn,
                      opts->time_scale);
  if (opts->fault > GCA_EXECUTE_FAULT_SKIP_ALLOC)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: unknown fault %d", fn, (int)opts->fault);
  if (opts->verify && opts->verify_mode != GCA_VERIFY_LOG && opts->verify_mode != GCA_VERIFY_ASSERT)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: unknown verify mode %d", fn,
                      (int)opts->verify_mode);
  GCA_CHECK(gca_opgraph_check_order(g, order, n));
  for (size_t c = 0; opts->comms && c < g->ncomms; c++) {
    int nranks = 0;
    if (!opts->comms[c])
      return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: no communicator for '%s'", fn, g->comms[c]);
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
  gca_plan_t *p = calloc(1, sizeof(*p));
  if (!p)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "%s: no host memory for a plan", fn);
  p->g = g;
  p->n = n;
  p->o = *opts;
  p->late = GCA__NONE;
  size_t nb = g->nbufs + 1, no = n + 1, nc = g->ncomms + 1;
  gca_status_t st = GCA_OK;
  p->order = GCA_FAILPOINT("plan_create") ? NULL : malloc(no * sizeof(size_t));
  p->comm = calloc(nc, sizeof(gca_stream_t));
  p->joined = calloc(nc, sizeof(gca_event_t));
  p->issue = calloc(no, sizeof(gca_event_t));
  p->done = calloc(no, sizeof(gca_event_t));
  p->ptr = calloc(nb, sizeof(void *));
  p->bufs = calloc(nb, sizeof(void *));
  p->bound = calloc(nb, sizeof(bool));
  p->alloc_step = malloc(nb * sizeof(size_t));
  p->free_step = malloc(nb * sizeof(size_t));
  if (opts->comms)
    p->comms = malloc(nc * sizeof(gca_comm_t *));
  if (!p->order || !p->comm || !p->joined || !p->issue || !p->done || !p->ptr || !p->bufs ||
      !p->bound || !p->alloc_step || !p->free_step || (opts->comms && !p->comms)) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory for the plan's tables");
    goto fail;
  }
  memcpy(p->order, order, n * sizeof(size_t));
  if (p->comms)
    memcpy(p->comms, opts->comms, g->ncomms * sizeof(gca_comm_t *));
  p->o.comms = p->comms;
  GCA_CHECK_GOTO(gca__opgraph_lifetimes(g, order, n, p->alloc_step, p->free_step), st, fail);
  GCA_CHECK_GOTO(gca_set_device(opts->device), st, fail);
  for (size_t c = 0; c < g->ncomms; c++) {
    GCA_CHECK_GOTO(gca_stream_create(&p->comm[c], GCA_STREAM_NON_BLOCKING), st, fail);
    GCA_CHECK_GOTO(gca_event_create(&p->joined[c], GCA_EVENT_DISABLE_TIMING), st, fail);
  }
  for (size_t i = 0; i < n; i++)
    if (g->ops[i].kind == GCA_OP_COLLECTIVE) {
      GCA_CHECK_GOTO(gca_event_create(&p->issue[i], GCA_EVENT_DISABLE_TIMING), st, fail);
      GCA_CHECK_GOTO(gca_event_create(&p->done[i], GCA_EVENT_DISABLE_TIMING), st, fail);
    }
  *out = p;
  return GCA_OK;
fail:
  gca_plan_destroy(p);
  return gca__error_prefix(st, "%s", fn);
}

GCA_API void gca_plan_destroy(gca_plan_t *p) {
  if (!p)
    return;
  const gca_opgraph_t *g = p->g;
  for (size_t c = 0; p->comm && c < g->ncomms; c++)
    if (p->comm[c])
      GCA_CHECK_IGNORE(gca_stream_synchronize(p->comm[c]));
  for (size_t i = 0; p->issue && p->done && i < p->n; i++) {
    if (p->issue[i])
      GCA_CHECK_IGNORE(gca_event_destroy(p->issue[i]));
    if (p->done[i])
      GCA_CHECK_IGNORE(gca_event_destroy(p->done[i]));
  }
  for (size_t c = 0; c < g->ncomms; c++) {
    if (p->joined && p->joined[c])
      GCA_CHECK_IGNORE(gca_event_destroy(p->joined[c]));
    if (p->comm && p->comm[c])
      GCA_CHECK_IGNORE(gca_stream_destroy(p->comm[c]));
  }
  free(p->order);
  free(p->comm);
  free(p->joined);
  free(p->issue);
  free(p->done);
  free(p->ptr);
  free(p->bufs);
  free(p->bound);
  free(p->alloc_step);
  free(p->free_step);
  free(p->comms);
  free(p);
}

/* Note [Plans under capture]: a run forks a communicator's stream from the
 * caller's stream only through events recorded on it, and before it returns
 * it makes the caller's stream wait for each communicator stream's last work
 * — so under stream capture every stream the run touched is joined back into
 * the capture, as the driver requires before the capture may end, and a
 * replay of the captured run orders the same way the eager run did.
 *
 * Memory a collective used needs no gca_record_stream: the plan frees it only
 * after the collective's wait (a collective uses its inputs and outputs until
 * its wait, Note [Op graph rules]), and the wait has made the caller's stream
 * — the stream every allocation is made on — wait for the collective's end.
 * So the free is already ordered after the communicator's use, and the block
 * is reusable at once instead of when the allocator next sees the
 * collective's event complete (which, with the host far ahead of the device,
 * is what made the pool grow by everything in flight). */
static gca_status_t join_comms(gca_plan_t *p) {
  for (size_t c = 0; c < p->g->ncomms; c++) {
    GCA_CHECK(gca_event_record(p->joined[c], p->comm[c]));
    GCA_CHECK(gca_stream_wait_event(p->stream, p->joined[c]));
  }
  return GCA_OK;
}

/* Gives back what the run allocated (stream-ordered) and closes its
 * verifier; returns the first failure of the two. */
static gca_status_t end_run(gca_plan_t *p, gca_status_t st) {
  const gca_opgraph_t *g = p->g;
  if (p->late != GCA__NONE)
    p->late = GCA__NONE;
  for (size_t b = 0; b < g->nbufs; b++)
    if (p->ptr[b]) {
      gca_status_t fst = plan_free(p, b);
      if (st == GCA_OK)
        st = fst;
    }
  if (p->extra) {
    gca_status_t fst = gca_free(p->extra);
    p->extra = NULL;
    if (st == GCA_OK)
      st = fst;
  }
  if (p->verifier) {
    size_t nm = 0;
    gca_mismatch_t first;
    GCA_CHECK_IGNORE(gca_verifier_result(p->verifier, &nm, &first));
    if (nm && !p->mismatches)
      p->first = first;
    p->mismatches += nm;
    gca_verifier_destroy(p->verifier);
    p->verifier = NULL;
  }
  memset(p->bound, 0, g->nbufs * sizeof(bool));
  return st;
}

GCA_API gca_status_t gca_plan_run(gca_plan_t *p, gca_stream_t stream, void *const *bind,
                                  size_t *mismatches) {
  static const char fn[] = "plan_run";
  if (!p)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "%s: plan is NULL", fn);
  const gca_opgraph_t *g = p->g;
  size_t before = p->mismatches;
  p->stream = stream;
  gca_status_t st = gca_set_device(p->o.device);
  for (size_t b = 0; b < g->nbufs && st == GCA_OK; b++) {
    if (g->bufs[b].storage != b || !bind || !bind[b])
      continue;
    p->ptr[b] = bind[b];
    p->bound[b] = true;
  }
  if (st == GCA_OK && p->o.verify) {
    st = gca_verifier_create(g, p->order, p->n, p->o.device, p->o.verify_mode, &p->verifier);
    for (size_t b = 0; b < g->nbufs && st == GCA_OK; b++)
      if (p->bound[b])
        gca__verifier_ignore(p->verifier, b);
  }
  /* inputs the caller did not bind, live before the first op */
  for (size_t b = 0; b < g->nbufs && st == GCA_OK; b++)
    if (g->bufs[b].storage == b && g->bufs[b].kind == GCA_BUFFER_INPUT && g->bufs[b].bytes > 0 &&
        !p->bound[b])
      st = plan_malloc(p, b);
  size_t failed = GCA__NONE;
  char detail[512] = "";
  for (size_t i = 0; i < p->n && st == GCA_OK; i++) {
    if (p->verifier && (st = gca_verifier_begin_op(p->verifier, i)) != GCA_OK)
      break;
    st = run_step(p, i);
    if (st != GCA_OK) /* before the verifier's end of the step speaks */
      snprintf(detail, sizeof(detail), "%s", gca_last_error());
    if (p->verifier) {
      gca_status_t vst = gca_verifier_end_op(p->verifier, i);
      if (st == GCA_OK)
        st = vst;
    }
    if (st != GCA_OK)
      failed = i;
  }
  if (st == GCA_OK)
    st = join_comms(p);
  else
    GCA_CHECK_IGNORE(join_comms(p));
  if (st != GCA_OK && !detail[0])
    snprintf(detail, sizeof(detail), "%s", gca_last_error());
  gca_status_t est = end_run(p, st);
  if (mismatches)
    *mismatches = p->mismatches - before;
  if (st != GCA_OK && failed != GCA__NONE)
    return gca__error(st, "%s: step %zu (op '%s'): %s", fn, failed, g->ops[p->order[failed]].name,
                      detail);
  if (st != GCA_OK)
    return gca__error(st, "%s: %s", fn, detail);
  if (est != GCA_OK)
    return gca__error_prefix(est, "%s", fn);
  return GCA_OK;
}

GCA_API gca_status_t gca_plan_result(const gca_plan_t *p, size_t *mismatches,
                                     gca_mismatch_t *first) {
  if (!p || !mismatches)
    return gca__error(GCA_ERR_INVALID_ARGUMENT, "plan_result: NULL argument");
  *mismatches = p->mismatches;
  if (first && p->mismatches)
    *first = p->first;
  return GCA_OK;
}
