/* SPDX-License-Identifier: Apache-2.0 */
/* estimate.c - the memory estimator and the time model of an order (the
 * format's "Memory" and "Time" semantics, shared by every tool that reports
 * figures).
 *
 * The one idea: one pass over the order computes, per storage, the step of
 * its allocation (its first writer; a collective allocates at issue) and of
 * its free (after the last op using it through any name, a collective using
 * its inputs and outputs until its wait), then a sweep adds and subtracts
 * bytes; a second pass runs the compute stream and one stream per
 * communicator. */
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

static void note_use(const gca_opgraph_t *g, const size_t *pos, size_t *first_write,
                     size_t *last_use, size_t op, size_t b, bool write) {
  size_t s = g->bufs[b].storage;
  size_t at = pos[gca__use_point(g, op)];
  if (write && (first_write[s] == GCA__NONE || pos[op] < first_write[s]))
    first_write[s] = pos[op];
  if (last_use[s] == GCA__NONE || at > last_use[s])
    last_use[s] = at;
}

gca_status_t gca__opgraph_lifetimes(const gca_opgraph_t *g, const size_t *order, size_t n,
                                    size_t *alloc_step, size_t *free_step) {
  size_t *pos = malloc((n + 1) * sizeof(size_t));
  size_t *first_write = malloc((g->nbufs + 1) * sizeof(size_t));
  size_t *last_use = malloc((g->nbufs + 1) * sizeof(size_t));
  gca_status_t st = GCA_OK;
  if (!pos || !first_write || !last_use) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_estimate: no host memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++)
    pos[order[i]] = i;
  for (size_t b = 0; b < g->nbufs; b++)
    first_write[b] = last_use[b] = GCA__NONE;
  for (size_t i = 0; i < n; i++) {
    const gca__sop_t *o = &g->ops[i];
    for (size_t k = 0; k < o->nreads; k++)
      note_use(g, pos, first_write, last_use, i, o->reads[k], false);
    for (size_t k = 0; k < o->nwrites; k++)
      note_use(g, pos, first_write, last_use, i, o->writes[k], true);
    for (size_t k = 0; k < o->nmut; k++) {
      note_use(g, pos, first_write, last_use, i, o->mold[k], false);
      note_use(g, pos, first_write, last_use, i, o->mnew[k], false);
    }
  }
  for (size_t b = 0; b < g->nbufs; b++) {
    const gca__sbuf_t *sb = &g->bufs[b];
    alloc_step[b] = free_step[b] = GCA__NONE;
    if (sb->storage != b || sb->kind == GCA_BUFFER_INPUT || first_write[b] == GCA__NONE)
      continue; /* a view, an input (live throughout), or never written (never allocated) */
    alloc_step[b] = first_write[b];
    if (sb->kind == GCA_BUFFER_TEMP)
      free_step[b] = last_use[b];
  }
out:
  free(pos);
  free(first_write);
  free(last_use);
  return st;
}

static gca_status_t memory(const gca_opgraph_t *g, const size_t *order, size_t n,
                           gca_schedule_figures_t *f, int64_t *live_after) {
  size_t *alloc_step = malloc((g->nbufs + 1) * sizeof(size_t));
  size_t *free_step = malloc((g->nbufs + 1) * sizeof(size_t));
  int64_t *delta_alloc = calloc(n + 1, sizeof(int64_t)),
          *delta_free = calloc(n + 1, sizeof(int64_t));
  gca_status_t st = GCA_OK;
  if (!alloc_step || !free_step || !delta_alloc || !delta_free) {
    st = gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_estimate: no host memory");
    goto out;
  }
  GCA_CHECK_GOTO(gca__opgraph_lifetimes(g, order, n, alloc_step, free_step), st, out);
  int64_t live = 0;
  for (size_t b = 0; b < g->nbufs; b++) {
    const gca__sbuf_t *sb = &g->bufs[b];
    if (sb->storage == b && sb->kind == GCA_BUFFER_INPUT)
      live += sb->bytes;
    if (alloc_step[b] != GCA__NONE)
      delta_alloc[alloc_step[b]] += sb->bytes;
    if (free_step[b] != GCA__NONE)
      delta_free[free_step[b]] += sb->bytes;
  }
  f->peak_bytes = live;
  f->peak_step = 0;
  for (size_t i = 0; i < n; i++) {
    live += delta_alloc[i];
    if (live_after)
      live_after[i] = live;
    if (live > f->peak_bytes) {
      f->peak_bytes = live;
      f->peak_step = i;
    }
    live -= delta_free[i];
  }
out:
  free(alloc_step);
  free(free_step);
  free(delta_alloc);
  free(delta_free);
  return st;
}

static gca_status_t timing(const gca_opgraph_t *g, const size_t *order, size_t n,
                           gca_schedule_figures_t *f) {
  double *comm_free = calloc(g->ncomms + 1, sizeof(double));
  double *end = calloc(n + 1, sizeof(double)); /* collectives: when they end */
  if (!comm_free || !end) {
    free(comm_free);
    free(end);
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "opgraph_estimate: no host memory");
  }
  double t = 0, last = 0;
  for (size_t i = 0; i < n; i++) {
    const gca__sop_t *o = &g->ops[order[i]];
    switch (o->kind) {
    case GCA_OP_COMPUTE:
      t += o->us;
      f->compute_us += o->us;
      break;
    case GCA_OP_COLLECTIVE: {
      double start = t > comm_free[o->comm_idx] ? t : comm_free[o->comm_idx];
      end[order[i]] = start + o->us;
      comm_free[o->comm_idx] = end[order[i]];
      if (end[order[i]] > last)
        last = end[order[i]];
      f->comm_us += o->us;
      f->collectives_total++;
      break;
    }
    case GCA_OP_WAIT: {
      double e = end[o->coll];
      if (e > t) {
        f->exposed_comm_us += e - t;
        t = e;
      } else {
        f->collectives_hidden++;
      }
      break;
    }
    }
  }
  f->makespan_us = t > last ? t : last;
  free(comm_free);
  free(end);
  return GCA_OK;
}

GCA_API gca_status_t gca_opgraph_estimate(const gca_opgraph_t *g, const size_t *order, size_t n,
                                          gca_schedule_figures_t *figures,
                                          int64_t *live_after_alloc) {
  GCA_CHECK(gca__check_graph_arg("opgraph_estimate", g, order, n));
  if (!figures || figures->size < sizeof(gca_schedule_figures_t))
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "opgraph_estimate: figures is NULL or its size is not set");
  GCA_CHECK(gca_opgraph_check_order(g, order, n));
  gca_schedule_figures_t f = {.size = sizeof(f)};
  GCA_CHECK(memory(g, order, n, &f, live_after_alloc));
  GCA_CHECK(timing(g, order, n, &f));
  *figures = f;
  return GCA_OK;
}

/* For the scheduler: figures of an order already known to be valid. */
gca_status_t gca__opgraph_estimate_valid(const gca_opgraph_t *g, const size_t *order, size_t n,
                                         gca_schedule_figures_t *f, int64_t *live_after) {
  memset(f, 0, sizeof(*f));
  f->size = sizeof(*f);
  GCA_CHECK(memory(g, order, n, f, live_after));
  return timing(g, order, n, f);
}
