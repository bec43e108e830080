/* SPDX-License-Identifier: Apache-2.0 */
/* execute.c - the executor: one measured run of a plan (plan.c) on a stream
 * of its own, timed against the same compute kernels run alone, so what the
 * verifier and the timers measure can be compared with the prediction. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "sched_internal.h"

/* One measured run: the compute stream, the timing events and the inputs
 * (allocated before timing starts and bound into the plan's run). */
typedef struct run {
  const gca_opgraph_t *g;
  gca_stream_t compute;
  gca_event_t t0, t1;
  void **bind; /* per buffer */
} run_t;

static uint64_t ns_of(const gca_execute_options_t *o, double us) {
  double ns = us * o->time_scale * 1000.0;
  return ns <= 0 ? 0 : (uint64_t)llround(ns);
}

static gca_status_t setup(run_t *x, const gca_execute_options_t *o) {
  const gca_opgraph_t *g = x->g;
  x->bind = calloc(g->nbufs + 1, sizeof(void *));
  if (!x->bind)
    return gca__error(GCA_ERR_OUT_OF_MEMORY, "no host memory for the buffer table");
  GCA_CHECK(gca_set_device(o->device));
  GCA_CHECK(gca_stream_create(&x->compute, GCA_STREAM_NON_BLOCKING));
  GCA_CHECK(gca_event_create(&x->t0, GCA_EVENT_DEFAULT));
  GCA_CHECK(gca_event_create(&x->t1, GCA_EVENT_DEFAULT));
  for (size_t b = 0; b < g->nbufs; b++)
    if (g->bufs[b].storage == b && g->bufs[b].kind == GCA_BUFFER_INPUT && g->bufs[b].bytes > 0)
      GCA_CHECK(gca_malloc(&x->bind[b], (size_t)g->bufs[b].bytes, x->compute));
  return GCA_OK;
}

/* Ends the interval begun by t0 on the compute stream: *ms its length. */
static gca_status_t timed(run_t *x, float *ms) {
  GCA_CHECK(gca_event_record(x->t1, x->compute));
  GCA_CHECK(gca_event_synchronize(x->t1));
  return gca_event_elapsed_time(ms, x->t0, x->t1);
}

/* Waits for everything and gives back what setup made. */
static void teardown(run_t *x) {
  if (x->compute)
    GCA_CHECK_IGNORE(gca_stream_synchronize(x->compute));
  for (size_t b = 0; x->bind && b < x->g->nbufs; b++)
    if (x->bind[b])
      GCA_CHECK_IGNORE(gca_free(x->bind[b]));
  if (x->t0)
    GCA_CHECK_IGNORE(gca_event_destroy(x->t0));
  if (x->t1)
    GCA_CHECK_IGNORE(gca_event_destroy(x->t1));
  if (x->compute)
    GCA_CHECK_IGNORE(gca_stream_destroy(x->compute));
  free(x->bind);
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
  gca_execute_result_t r = {.size = sizeof(r)};
  r.predicted.size = sizeof(r.predicted);
  GCA_CHECK(gca_opgraph_estimate(g, order, n, &r.predicted, NULL));
  gca_plan_t *plan = NULL;
  gca_status_t st = gca_plan_create(g, order, n, opts, &plan);
  if (st != GCA_OK)
    return gca__error_prefix(st, "%s", fn);
  run_t x = {.g = g};
  st = setup(&x, opts);
  if (st == GCA_OK)
    st = gca_stream_synchronize(x.compute); /* the inputs exist before timing starts */
  /* Note [Measuring exposed communication]: the compute stream's time in the
   * run minus its time running the same compute kernels alone (measured here,
   * before the run) is the time it spent stalled at waits, without the
   * per-kernel launch costs of the device that the model does not have. With
   * a compute callback, only the kernels of the ops' durations run alone. */
  float alone_ms = 0, total_ms = 0;
  if (st == GCA_OK)
    st = gca_event_record(x.t0, x.compute);
  for (size_t i = 0; i < n && st == GCA_OK; i++)
    if (g->ops[order[i]].kind == GCA_OP_COMPUTE)
      st = gca_kernel_sleep(ns_of(opts, g->ops[order[i]].us), x.compute);
  if (st == GCA_OK)
    st = timed(&x, &alone_ms);
  if (st == GCA_OK)
    st = gca_reset_peak_stats(opts->device);
  if (st == GCA_OK)
    st = gca_event_record(x.t0, x.compute);
  if (st == GCA_OK)
    st = gca_plan_run(plan, x.compute, x.bind, NULL);
  /* the run ends with every communicator's stream joined to the compute
   * stream, whose last op is a wait for each collective (Note [Op graph
   * rules]): its end is the makespan, and its time less alone_ms the stalls */
  if (st == GCA_OK)
    st = timed(&x, &total_ms);
  gca_stats_t after;
  if (st == GCA_OK)
    st = gca_get_stats(opts->device, &after);
  if (st == GCA_OK) {
    double scale = opts->time_scale;
    r.measured_makespan_us = (double)total_ms * 1000.0 / scale;
    r.measured_exposed_comm_us = (double)(total_ms - alone_ms) * 1000.0 / scale;
    if (r.measured_exposed_comm_us < 0)
      r.measured_exposed_comm_us = 0;
    r.measured_peak_bytes = after.allocated_bytes[GCA_STAT_ALL].peak;
  }
  GCA_CHECK_IGNORE(gca_plan_result(plan, &r.mismatches, &r.first_mismatch));
  char detail[512] = "";
  if (st != GCA_OK)
    snprintf(detail, sizeof(detail), "%s", gca_last_error());
  teardown(&x);
  gca_plan_destroy(plan);
  *result = r;
  if (st != GCA_OK)
    return gca__error(st, "%s: %s", fn, detail);
  return GCA_OK;
}
