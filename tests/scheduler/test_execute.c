/* SPDX-License-Identifier: Apache-2.0 */
/* test_execute.c - the executor and the lifecycle verifier on the sim: a
 * plan runs with zero mismatches and the allocator's peak equal to the
 * estimator's, each of the four mismatch kinds is provoked (a free one step
 * late, as a wrong estimate would show; a free too early; an allocation the
 * plan lacks; one it makes but the run skips) and reported with the op and
 * buffer named, assert mode stops the run with that message, and nothing
 * leaks whichever way a run ends. Timings are asserted only on the sim's
 * virtual clock (the execute_virtual run), where they are the model's. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_fixture.h"

static gca_opgraph_t *kept; /* the graph whose names a result points into; freed at teardown */

/* a (1 MiB) made by mk_a and read by mk_b and fin; b (2 MiB) made by mk_b,
 * read by mid; c (3 MiB) made by mid, read by fin; o (1 MiB) an output.
 * Plan: step 0 mk_a allocates a; 1 mk_b allocates b; 2 mid allocates c, frees
 * b; 3 fin allocates o, frees a and c. */
static const char small_graph[] =
    "{\"format\": \"gca-opgraph/1\", \"comms\": [\"dp\"], \"buffers\": ["
    "{\"name\": \"a\", \"bytes\": 1048576}, {\"name\": \"b\", \"bytes\": 2097152},"
    "{\"name\": \"c\", \"bytes\": 3145728}, {\"name\": \"o\", \"bytes\": 1048576, \"kind\": "
    "\"output\"}],"
    "\"ops\": [{\"name\": \"mk_a\", \"kind\": \"compute\", \"us\": 5, \"writes\": [\"a\"]},"
    "{\"name\": \"mk_b\", \"kind\": \"compute\", \"us\": 5, \"reads\": [\"a\"], \"writes\": "
    "[\"b\"]},"
    "{\"name\": \"mid\", \"kind\": \"compute\", \"us\": 5, \"reads\": [\"b\"], \"writes\": "
    "[\"c\"]},"
    "{\"name\": \"fin\", \"kind\": \"compute\", \"us\": 5, \"reads\": [\"a\", \"c\"], \"writes\": "
    "[\"o\"]}]}";

static void expect_nothing_allocated(void) {
  gca_stats_t s;
  assert_ok(gca_get_stats(0, &s));
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca__allocator_check());
}

/* On the sim's virtual clock (GCA_SIM_CLOCK=virtual: the execute_virtual
 * run; Note [Sim virtual time]) a run's times are the model's, not the
 * machine's: the measured exposed communication and makespan must be within
 * 5% of the estimator's. On the real clock they are only printed. */
static void expect_predicted_times(const gca_execute_result_t *r, const char *what) {
  print_message("%s: makespan %.1f us measured, %.1f predicted; exposed %.1f measured, %.1f "
                "predicted\n",
                what, r->measured_makespan_us, r->predicted.makespan_us,
                r->measured_exposed_comm_us, r->predicted.exposed_comm_us);
  const char *clock = getenv("GCA_SIM_CLOCK");
  if (!clock || strcmp(clock, "virtual") != 0)
    return;
  double de = r->measured_exposed_comm_us - r->predicted.exposed_comm_us;
  double dm = r->measured_makespan_us - r->predicted.makespan_us;
  if (fabs(de) > 0.05 * r->predicted.exposed_comm_us + 0.5 ||
      fabs(dm) > 0.05 * r->predicted.makespan_us + 0.5)
    fail_msg("%s: measured exposed %.3f / makespan %.3f us vs predicted %.3f / %.3f (beyond 5%%)",
             what, r->measured_exposed_comm_us, r->measured_makespan_us,
             r->predicted.exposed_comm_us, r->predicted.makespan_us);
}

static void the_scheduled_example_runs_with_zero_mismatches(void **state) {
  (void)state;
  gca_opgraph_t *g = load_example();
  size_t n = gca_opgraph_op_count(g);
  size_t *order = malloc(n * sizeof(size_t));
  assert_non_null(order);
  gca_schedule_figures_t f = {.size = sizeof(f)};
  assert_ok(gca_opgraph_schedule(g, NULL, order, n, &f));
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  o.time_scale = 0.05;
  o.verify_mode = GCA_VERIFY_ASSERT;
  gca_execute_result_t r = {.size = sizeof(r)};
  assert_ok(gca_opgraph_execute(g, order, n, &o, &r));
  assert_int_equal(r.mismatches, 0);
  assert_int_equal(r.measured_peak_bytes, f.peak_bytes); /* memory, not time: exact */
  assert_int_equal(r.predicted.peak_bytes, f.peak_bytes);
  expect_predicted_times(&r, "example, scheduled");
  /* and in program order, where more of the communication is exposed */
  assert_ok(gca_opgraph_program_order(g, order));
  r = (gca_execute_result_t){.size = sizeof(r)};
  assert_ok(gca_opgraph_execute(g, order, n, &o, &r));
  assert_int_equal(r.mismatches, 0);
  expect_predicted_times(&r, "example, program order");
  expect_nothing_allocated();
  free(order);
  gca_opgraph_destroy(g);
}

/* Runs the small graph in program order with a fault; returns the result. */
static gca_execute_result_t run_fault(gca_execute_fault_t fault, size_t step,
                                      gca_verify_mode_t mode, gca_status_t want, char *detail,
                                      size_t len) {
  gca_opgraph_t *g = load_text(small_graph, sizeof(small_graph) - 1);
  size_t order[4] = {0, 1, 2, 3};
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  o.time_scale = 0.1;
  o.verify_mode = mode;
  o.fault = fault;
  o.fault_step = step;
  gca_execute_result_t r = {.size = sizeof(r)};
  gca_clear_last_error();
  gca_status_t st = gca_opgraph_execute(g, order, 4, &o, &r);
  if (detail)
    snprintf(detail, len, "%s", gca_last_error());
  assert_int_equal(st, want);
  expect_nothing_allocated();
  kept = g;
  return r;
}

static void expect_first(const gca_execute_result_t *r, gca_mismatch_kind_t kind, size_t step,
                         const char *op, const char *buffer) {
  assert_true(r->mismatches >= 1);
  const gca_mismatch_t *m = &r->first_mismatch;
  if (m->kind != kind || m->step != step || strcmp(m->op, op) != 0 ||
      (buffer ? !m->buffer || strcmp(m->buffer, buffer) != 0 : m->buffer != NULL))
    fail_msg("first mismatch: %s at step %zu (op '%s', buffer '%s'); wanted %s at %zu ('%s', '%s')",
             gca_mismatch_kind_name(m->kind), m->step, m->op, m->buffer ? m->buffer : "(none)",
             gca_mismatch_kind_name(kind), step, op, buffer ? buffer : "(none)");
}

static void a_late_free_is_a_missing_free(void **state) {
  (void)state;
  gca_execute_result_t r =
      run_fault(GCA_EXECUTE_FAULT_LATE_FREE, 2, GCA_VERIFY_LOG, GCA_OK, NULL, 0);
  expect_first(&r, GCA_MISMATCH_MISSING_FREE, 2, "mid", "b");
  assert_int_equal(r.mismatches, 1); /* the free a step later is not counted again */
}

static void an_early_free_is_an_unexpected_free(void **state) {
  (void)state;
  gca_execute_result_t r =
      run_fault(GCA_EXECUTE_FAULT_EARLY_FREE, 2, GCA_VERIFY_LOG, GCA_OK, NULL, 0);
  expect_first(&r, GCA_MISMATCH_UNEXPECTED_FREE, 2, "mid", "a");
  assert_int_equal(r.mismatches, 1); /* not also a missing free at its planned step */
}

static void an_extra_allocation_is_unexpected(void **state) {
  (void)state;
  gca_execute_result_t r =
      run_fault(GCA_EXECUTE_FAULT_EXTRA_ALLOC, 1, GCA_VERIFY_LOG, GCA_OK, NULL, 0);
  expect_first(&r, GCA_MISMATCH_UNEXPECTED_ALLOC, 1, "mk_b", NULL);
  assert_int_equal(r.first_mismatch.bytes, 4608);
}

static void a_skipped_allocation_is_missing(void **state) {
  (void)state;
  gca_execute_result_t r =
      run_fault(GCA_EXECUTE_FAULT_SKIP_ALLOC, 1, GCA_VERIFY_LOG, GCA_OK, NULL, 0);
  expect_first(&r, GCA_MISMATCH_MISSING_ALLOC, 1, "mk_b", "b");
}

static void assert_mode_stops_the_run_with_the_mismatch_named(void **state) {
  (void)state;
  char detail[512];
  gca_execute_result_t r = run_fault(GCA_EXECUTE_FAULT_EARLY_FREE, 2, GCA_VERIFY_ASSERT,
                                     GCA_ERR_INVALID_STATE, detail, sizeof(detail));
  if (!strstr(detail, "step 2 (op 'mid'): unexpected free of 'a'"))
    fail_msg("detail '%s' does not name the mismatch", detail);
  assert_int_equal(r.mismatches, 1);
}

static void bad_options_are_refused(void **state) {
  (void)state;
  gca_opgraph_t *g = load_text(small_graph, sizeof(small_graph) - 1);
  size_t order[4] = {0, 1, 2, 3}, bad[4] = {1, 0, 2, 3};
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  gca_execute_result_t r = {.size = sizeof(r)};
  o.time_scale = 0;
  assert_status(gca_opgraph_execute(g, order, 4, &o, &r), GCA_ERR_INVALID_ARGUMENT, "time_scale");
  o.time_scale = 1;
  assert_status(gca_opgraph_execute(g, bad, 4, &o, &r), GCA_ERR_INVALID_ARGUMENT,
                "op 'mk_b' (step 0) reads 'a'");
  assert_status(gca_opgraph_execute(g, order, 4, NULL, &r), GCA_ERR_INVALID_ARGUMENT, "options");
  gca_verifier_t *v = NULL;
  assert_status(gca_verifier_create(g, order, 4, 0, (gca_verify_mode_t)7, &v),
                GCA_ERR_INVALID_ARGUMENT, "unknown mode");
  assert_ok(gca_verifier_create(g, order, 4, 0, GCA_VERIFY_LOG, &v));
  assert_status(gca_verifier_end_op(v, 0), GCA_ERR_INVALID_STATE, "was not begun");
  assert_ok(gca_verifier_begin_op(v, 0));
  assert_status(gca_verifier_begin_op(v, 1), GCA_ERR_INVALID_STATE, "still open");
  assert_status(gca_verifier_begin_op(v, 9), GCA_ERR_INVALID_ARGUMENT, "step 9");
  gca_verifier_destroy(v);
  expect_nothing_allocated();
  gca_opgraph_destroy(g);
}

/* A fault in the device while the plan runs: a clear status naming the
 * call, and everything the run made is given back. */
static void a_device_fault_mid_run_fails_cleanly(void **state) {
  (void)state;
  gca_opgraph_t *g = load_example();
  size_t n = gca_opgraph_op_count(g);
  size_t *order = malloc(n * sizeof(size_t));
  assert_non_null(order);
  assert_ok(gca_opgraph_program_order(g, order));
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  o.time_scale = 0.01;
  gca_execute_result_t r = {.size = sizeof(r)};
  assert_ok(gca_sim_fault_set("kernel_sleep:nth=40"));
  gca_status_t st = gca_opgraph_execute(g, order, n, &o, &r);
  char detail[512];
  snprintf(detail, sizeof(detail), "%s", gca_last_error());
  gca_sim_fault_clear();
  assert_int_equal(st, GCA_ERR_DRIVER);
  if (!strstr(detail, "opgraph_execute") || !strstr(detail, "kernel_sleep: injected fault"))
    fail_msg("detail '%s'", detail);
  expect_nothing_allocated();
  free(order);
  gca_opgraph_destroy(g);
}

/* ---- several ranks ---- */

#define RANKS 4

typedef struct rank_job {
  const gca_opgraph_t *g;
  const size_t *order;
  size_t n;
  gca_comm_t *comm;
  int device;
  gca_status_t st;
  char detail[512];
  gca_execute_result_t r;
} rank_job_t;

/* One rank's run (no assertion here: the test checks what it recorded). */
static void *rank_run(void *arg) {
  rank_job_t *j = arg;
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  o.device = j->device;
  o.time_scale = 0.05;
  o.verify_mode = GCA_VERIFY_ASSERT;
  gca_comm_t *comms[1] = {j->comm};
  o.comms = comms;
  j->r.size = sizeof(j->r);
  j->st = gca_opgraph_execute(j->g, j->order, j->n, &o, &j->r);
  snprintf(j->detail, sizeof(j->detail), "%s", gca_last_error());
  return NULL;
}

/* The example's plan on four sim ranks, each a thread with its own device
 * and communicator: the all-gathers and reduce-scatters move data through
 * the collectives layer, and every rank's verifier sees its plan exactly. */
static void the_example_runs_on_four_ranks_through_the_collectives(void **state) {
  (void)state;
  gca_opgraph_t *g = load_example();
  size_t n = gca_opgraph_op_count(g);
  size_t *order = malloc(n * sizeof(size_t));
  assert_non_null(order);
  gca_schedule_figures_t f = {.size = sizeof(f)};
  assert_ok(gca_opgraph_schedule(g, NULL, order, n, &f));
  int devs[RANKS] = {0, 1, 2, 3};
  gca_comm_t *comms[RANKS];
  assert_ok(gca_comm_create_all(RANKS, devs, NULL, comms));
  rank_job_t jobs[RANKS];
  pthread_t th[RANKS];
  for (int r = 0; r < RANKS; r++) {
    jobs[r] = (rank_job_t){.g = g, .order = order, .n = n, .comm = comms[r], .device = r};
    assert_int_equal(pthread_create(&th[r], NULL, rank_run, &jobs[r]), 0);
  }
  for (int r = 0; r < RANKS; r++)
    assert_int_equal(pthread_join(th[r], NULL), 0);
  for (int r = 0; r < RANKS; r++) {
    if (jobs[r].st != GCA_OK)
      fail_msg("rank %d: %s: %s", r, gca_status_name(jobs[r].st), jobs[r].detail);
    assert_int_equal(jobs[r].r.mismatches, 0);
    assert_int_equal(jobs[r].r.measured_peak_bytes, f.peak_bytes);
    char what[32];
    snprintf(what, sizeof(what), "rank %d of %d", r, RANKS);
    expect_predicted_times(&jobs[r].r, what);
    assert_ok(gca_comm_async_error(comms[r]));
    gca_comm_stats_t cs = {.size = sizeof(cs)};
    assert_ok(gca_comm_stats(comms[r], &cs));
    assert_int_equal(cs.completed, f.collectives_total);
    assert_ok(gca_comm_destroy(comms[r]));
    gca_stats_t s;
    assert_ok(gca_get_stats(r, &s));
    assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 0);
  }
  free(order);
  gca_opgraph_destroy(g);
}

/* A plan whose collective does not fit the communicator is refused before
 * anything runs, naming the op. */
static void a_collective_that_does_not_fit_the_ranks_is_refused(void **state) {
  (void)state;
  gca_opgraph_t *g = load_example();
  size_t n = gca_opgraph_op_count(g);
  size_t *order = malloc(n * sizeof(size_t));
  assert_non_null(order);
  assert_ok(gca_opgraph_program_order(g, order));
  int devs[2] = {0, 1};
  gca_comm_t *comms[2];
  assert_ok(gca_comm_create_all(2, devs, NULL, comms));
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  o.comms = comms;
  gca_execute_result_t r = {.size = sizeof(r)};
  assert_status(gca_opgraph_execute(g, order, n, &o, &r), GCA_ERR_NOT_SUPPORTED,
                "collective 'ag_f0' (all_gather) of 6291456 bytes into 25165824 does not fit 2 "
                "ranks");
  for (int i = 0; i < 2; i++)
    assert_ok(gca_comm_destroy(comms[i]));
  expect_nothing_allocated();
  free(order);
  gca_opgraph_destroy(g);
}

/* The verifier cannot record an allocation it observes (no host memory):
 * the step fails with a clear status instead of a wrong verdict, and the run
 * gives everything back (Note [Host fail points]). */
static void a_verifier_without_host_memory_fails_the_step(void **state) {
  (void)state;
  gca_opgraph_t *g = load_text(small_graph, sizeof(small_graph) - 1);
  size_t order[4] = {0, 1, 2, 3};
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  o.time_scale = 0.1;
  gca_execute_result_t r = {.size = sizeof(r)};
  assert_ok(gca__failpoint_arm("verifier_log", 1));
  gca_status_t st = gca_opgraph_execute(g, order, 4, &o, &r);
  char detail[512];
  snprintf(detail, sizeof(detail), "%s", gca_last_error());
  gca__failpoint_clear();
  assert_int_equal(st, GCA_ERR_OUT_OF_MEMORY);
  if (!strstr(detail, "step 0: no host memory to record an event"))
    fail_msg("detail '%s'", detail);
  expect_nothing_allocated();
  gca_opgraph_destroy(g);
}

static int setup(void **state) {
  (void)state;
  gca_sim_fault_clear();
  return 0;
}

/* ---- plans ----
 * w (an input, 4 KiB of u32) is bound to the test's memory and updated in
 * place each run; a = 1 + i; the collective (modelled) gathers a into g; o (an
 * output, bound) = a + w as it was; the update w += a mutates the input. */
static const char plan_graph[] =
    "{\"format\": \"gca-opgraph/1\", \"comms\": [\"dp\"], \"buffers\": ["
    "{\"name\": \"w\", \"bytes\": 4096, \"kind\": \"input\"}, {\"name\": \"w2\", \"alias_of\": "
    "\"w\"},"
    "{\"name\": \"a\", \"bytes\": 4096}, {\"name\": \"g\", \"bytes\": 4096},"
    "{\"name\": \"o\", \"bytes\": 4096, \"kind\": \"output\"}],"
    "\"ops\": [{\"name\": \"fill\", \"kind\": \"compute\", \"us\": 2, \"writes\": [\"a\"]},"
    "{\"name\": \"ar\", \"kind\": \"collective\", \"collective\": \"all_reduce\", \"comm\": "
    "\"dp\", \"us\": 3, \"reads\": [\"a\"], \"writes\": [\"g\"]},"
    "{\"name\": \"ar_wait\", \"kind\": \"wait\", \"waits\": \"ar\"},"
    "{\"name\": \"use\", \"kind\": \"compute\", \"us\": 2, \"reads\": [\"a\", \"g\", \"w\"], "
    "\"writes\": [\"o\"]},"
    "{\"name\": \"upd\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"a\", \"o\"], "
    "\"mutates\": {\"w\": \"w2\"}}]}";

enum { PW, PW2, PA, PG, PO }; /* buffer indices, in the order declared */

static gca_status_t plan_compute(void *ctx, size_t op, void *const *bufs, gca_stream_t s) {
  int *calls = ctx;
  calls[op]++;
  if (op == 0)
    return gca_kernel_fill_u32(bufs[PA], 1, 1, 1024, s);
  if (op == 3)
    return gca_kernel_add_u32(bufs[PO], bufs[PA], bufs[PW], 1024, s);
  if (op == 4) {
    assert_ptr_equal(bufs[PW2], bufs[PW]); /* a view: its storage's address */
    return gca_kernel_add_u32(bufs[PW2], bufs[PW], bufs[PA], 1024, s);
  }
  return GCA_ERR_INTERNAL;
}

/* w after k runs is w0 + k (1 + i); o of run k is w0 + (k + 1)(1 + i). */
static void expect_plan_values(void *w, void *o, int runs) {
  uint32_t hw[1024], ho[1024];
  assert_ok(gca_memcpy(hw, w, sizeof(hw)));
  assert_ok(gca_memcpy(ho, o, sizeof(ho)));
  for (uint32_t i = 0; i < 1024; i++) {
    assert_int_equal(hw[i], 7 * i + (uint32_t)runs * (1 + i));
    assert_int_equal(ho[i], 7 * i + (uint32_t)runs * (1 + i));
  }
}

static void a_plan_runs_step_after_step_on_bound_memory(void **state) {
  (void)state;
  gca_opgraph_t *g = load_text(plan_graph, sizeof(plan_graph) - 1);
  assert_int_equal(gca_opgraph_buffer_count(g), 5);
  size_t b = 0;
  assert_ok(gca_opgraph_buffer_index(g, "o", &b));
  assert_int_equal(b, PO);
  assert_status(gca_opgraph_buffer_index(g, "nope", &b), GCA_ERR_NOT_FOUND, "'nope'");
  size_t order[5] = {0, 1, 2, 3, 4};
  int calls[5] = {0};
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  o.time_scale = 0; /* no modelled durations */
  o.verify_mode = GCA_VERIFY_ASSERT;
  o.compute = plan_compute;
  o.compute_ctx = calls;
  gca_plan_t *plan = NULL;
  assert_ok(gca_plan_create(g, order, 5, &o, &plan));
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *w, *out;
  assert_ok(gca_malloc(&w, 4096, s));
  assert_ok(gca_malloc(&out, 4096, s));
  assert_ok(gca_kernel_fill_u32(w, 0, 7, 1024, s));
  void *bind[5] = {[PW] = w, [PO] = out};
  for (int k = 1; k <= 3; k++) {
    size_t mm = 99;
    assert_ok(gca_plan_run(plan, s, bind, &mm));
    assert_int_equal(mm, 0);
    assert_ok(gca_stream_synchronize(s));
    gca_stats_t st;
    assert_ok(gca_get_stats(0, &st)); /* only the bound memory stays allocated */
    assert_int_equal(st.allocated_bytes[GCA_STAT_ALL].current, 8192);
  }
  assert_int_equal(calls[0], 3);
  assert_int_equal(calls[1], 0); /* collectives and waits are not compute */
  assert_int_equal(calls[4], 3);
  uint32_t hw[1024];
  assert_ok(gca_memcpy(hw, w, sizeof(hw)));
  for (uint32_t i = 0; i < 1024; i++)
    assert_int_equal(hw[i], 7 * i + 3 * (1 + i));
  size_t total = 9;
  assert_ok(gca_plan_result(plan, &total, NULL));
  assert_int_equal(total, 0);
  /* unbound, the plan allocates the input and the output itself, and frees them */
  assert_ok(gca_plan_run(plan, s, NULL, NULL));
  assert_ok(gca_stream_synchronize(s));
  gca_stats_t st;
  assert_ok(gca_get_stats(0, &st));
  assert_int_equal(st.allocated_bytes[GCA_STAT_ALL].current, 8192);
  gca_plan_destroy(plan);
  assert_ok(gca_free(w));
  assert_ok(gca_free(out));
  assert_ok(gca_stream_destroy(s));
  expect_nothing_allocated();
  gca_opgraph_destroy(g);
}

typedef struct tree_ctx {
  gca_plan_t *plan;
} tree_ctx_t;

static gca_status_t plan_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  tree_ctx_t *t = ctx;
  void *bind[5] = {[PW] = in[0], [PO] = out[0]};
  return gca_plan_run(t->plan, s, bind, NULL);
}

/* Note [Plans under capture]: the run (with a communicator stream forked and
 * joined) is a graph tree's body: warm-up, record, then replays that update
 * the bound input in place each time. */
static void a_plan_run_is_recorded_and_replayed_by_a_graph_tree(void **state) {
  (void)state;
  gca_opgraph_t *g = load_text(plan_graph, sizeof(plan_graph) - 1);
  size_t order[5] = {0, 1, 2, 3, 4};
  int calls[5] = {0};
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  o.time_scale = 0.01;
  o.compute = plan_compute;
  o.compute_ctx = calls;
  tree_ctx_t t = {0};
  assert_ok(gca_plan_create(g, order, 5, &o, &t.plan));
  gca_graph_tree_t *tree = NULL;
  assert_ok(gca_graph_tree_create(0, NULL, &tree));
  gca_stream_t s;
  assert_ok(gca_graph_tree_stream(tree, &s));
  void *w;
  assert_ok(gca_malloc(&w, 4096, s));
  assert_ok(gca_kernel_fill_u32(w, 0, 7, 1024, s));
  gca_graph_input_t in = {GCA_GRAPH_INPUT_MUTATED, 4096};
  size_t ob = 4096;
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = "plan";
  d.body = plan_body;
  d.ctx = &t;
  d.ninputs = 1;
  d.inputs = &in;
  d.noutputs = 1;
  d.output_bytes = &ob;
  gca_graph_fn_t *fn = NULL;
  assert_ok(gca_graph_fn_register(tree, &d, &fn));
  for (int k = 1; k <= 5; k++) {
    void *out = NULL;
    assert_ok(gca_graph_tree_step(tree));
    assert_ok(gca_graph_tree_run(tree, fn, &w, 1, &out, 1));
    assert_ok(gca_graph_tree_synchronize(tree));
    expect_plan_values(w, out, k);
  }
  gca_graph_stats_t gs = {.size = sizeof(gs)};
  assert_ok(gca_graph_tree_stats(tree, &gs));
  assert_int_equal(gs.warmups, 1);
  assert_int_equal(gs.records, 1);
  assert_int_equal(gs.replays, 4); /* the record's own launch and three replays */
  assert_int_equal(calls[0], 2);   /* the body ran twice: warm-up and record */
  size_t mm = 9;
  assert_ok(gca_plan_result(t.plan, &mm, NULL));
  assert_int_equal(mm, 0);
  assert_ok(gca_free(w));
  assert_ok(gca_graph_tree_destroy(tree));
  gca_plan_destroy(t.plan);
  expect_nothing_allocated();
  gca_opgraph_destroy(g);
}

static void bad_plan_arguments_are_refused(void **state) {
  (void)state;
  gca_opgraph_t *g = load_text(plan_graph, sizeof(plan_graph) - 1);
  size_t order[5] = {0, 1, 2, 3, 4}, bad[5] = {3, 0, 1, 2, 4};
  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  gca_plan_t *plan = NULL;
  assert_status(gca_plan_create(g, order, 5, NULL, &plan), GCA_ERR_INVALID_ARGUMENT, "options");
  assert_status(gca_plan_create(g, order, 5, &o, NULL), GCA_ERR_INVALID_ARGUMENT, "out is NULL");
  o.time_scale = -1;
  assert_status(gca_plan_create(g, order, 5, &o, &plan), GCA_ERR_INVALID_ARGUMENT, "negative");
  o.time_scale = 0;
  assert_status(gca_plan_create(g, bad, 5, &o, &plan), GCA_ERR_INVALID_ARGUMENT, "'use'");
  assert_null(plan);
  assert_status(gca_plan_run(NULL, NULL, NULL, NULL), GCA_ERR_INVALID_ARGUMENT, "plan is NULL");
  /* no host memory for the plan: a clear error, nothing made */
  assert_ok(gca__failpoint_arm("plan_create", 1));
  assert_status(gca_plan_create(g, order, 5, &o, &plan), GCA_ERR_OUT_OF_MEMORY, "no host memory");
  gca__failpoint_clear();
  assert_null(plan);
  /* a device fault mid-run: the step and op are named, the run's memory is back */
  assert_ok(gca_plan_create(g, order, 5, &o, &plan));
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_sim_fault_set("kernel_sleep:nth=1"));
  assert_status(gca_plan_run(plan, s, NULL, NULL), GCA_ERR_DRIVER, "step 0 (op 'fill')");
  gca_sim_fault_clear();
  assert_ok(gca_stream_synchronize(s));
  expect_nothing_allocated();
  /* and the plan runs again */
  assert_ok(gca_plan_run(plan, s, NULL, NULL));
  assert_ok(gca_stream_synchronize(s));
  gca_plan_destroy(plan);
  assert_ok(gca_stream_destroy(s));
  expect_nothing_allocated();
  gca_opgraph_destroy(g);
}

static int teardown(void **state) {
  (void)state;
  gca_opgraph_destroy(kept);
  kept = NULL;
  gca_sim_fault_clear();
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s fsdp-4L.json\n", argv[0]);
    return 1;
  }
  example_path = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(the_scheduled_example_runs_with_zero_mismatches, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_late_free_is_a_missing_free, setup, teardown),
      cmocka_unit_test_setup_teardown(an_early_free_is_an_unexpected_free, setup, teardown),
      cmocka_unit_test_setup_teardown(an_extra_allocation_is_unexpected, setup, teardown),
      cmocka_unit_test_setup_teardown(a_skipped_allocation_is_missing, setup, teardown),
      cmocka_unit_test_setup_teardown(assert_mode_stops_the_run_with_the_mismatch_named, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(bad_options_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(a_verifier_without_host_memory_fails_the_step, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_device_fault_mid_run_fails_cleanly, setup, teardown),
      cmocka_unit_test_setup_teardown(the_example_runs_on_four_ranks_through_the_collectives, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_plan_runs_step_after_step_on_bound_memory, setup, teardown),
      cmocka_unit_test_setup_teardown(a_plan_run_is_recorded_and_replayed_by_a_graph_tree, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(bad_plan_arguments_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(a_collective_that_does_not_fit_the_ranks_is_refused, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
