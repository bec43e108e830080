/* SPDX-License-Identifier: Apache-2.0 */
/* test_host_sweep.c - every host allocation the scheduler makes in a
 * realistic step, failed in turn (tests/sweep.h): an op graph built through
 * the API (two communicators, a view, an in-place mutation, a group, an
 * order_after) and one loaded from JSON, checked, scheduled under each
 * policy (and a budget nothing fits), estimated, planned and run three times
 * under the verifier, run by the executor, and planned and run through a
 * communicator of one rank. The scenario counts its allocations once (n); then
 * for each k in 1..n the k-th fails: the scenario must fail with
 * GCA_ERR_OUT_OF_MEMORY (or a status whose detail says host memory) and a
 * detail, leave nothing allocated and the allocator sound. ASan builds check
 * that nothing leaked. */
#include "sched_fixture.h"
#include "sweep.h"

/* The same graph as JSON, so that the loader's allocations are swept too. */
static const char graph_json[] =
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
    "\"mutates\": {\"w\": \"w2\"}}],"
    "\"groups\": [[\"use\", \"upd\"]], \"order_after\": [[\"upd\", \"fill\"]]}";

#define KIB 1024

static gca_status_t add_op(gca_opgraph_t *g, const char *name, gca_op_kind_t kind, double us,
                           const char *coll, const char *comm, const char *waits,
                           const char *const *reads, size_t nreads, const char *const *writes,
                           size_t nwrites, const char *mold, const char *mnew) {
  gca_op_desc_t d = GCA_OP_DESC_INIT;
  d.name = name;
  d.kind = kind;
  d.us = us;
  d.collective = coll;
  d.comm = comm;
  d.waits = waits;
  d.reads = reads;
  d.nreads = nreads;
  d.writes = writes;
  d.nwrites = nwrites;
  d.mutates_old = mold ? &mold : NULL;
  d.mutates_new = mnew ? &mnew : NULL;
  d.nmutates = mold ? 1 : 0;
  return gca_opgraph_add_op(g, &d);
}

/* x, w: inputs (w2 is w after the update); a (av: a view of it), h, h2, g,
 * r: temporaries; o: an output. ag gathers w into g on dp while mm1 and mm2
 * (a group) run; rs reduces h2 into r on tp; upd mutates w in place. */
static gca_status_t build_graph(gca_opgraph_t *g) {
  static const char *const x[] = {"x"}, *const a[] = {"a"}, *const av[] = {"av"},
                           *const w[] = {"w"}, *const gg[] = {"g"}, *const h[] = {"h"},
                           *const h2[] = {"h2"}, *const r[] = {"r"}, *const o[] = {"o"},
                           *const ga[] = {"g", "a"}, *const grp[] = {"mm1", "mm2"};
  GCA_CHECK(gca_opgraph_add_comm(g, "dp"));
  GCA_CHECK(gca_opgraph_add_comm(g, "tp"));
  GCA_CHECK(gca_opgraph_add_buffer(g, "x", 16 * KIB, GCA_BUFFER_INPUT));
  GCA_CHECK(gca_opgraph_add_buffer(g, "w", 64 * KIB, GCA_BUFFER_INPUT));
  GCA_CHECK(gca_opgraph_add_view(g, "w2", "w"));
  GCA_CHECK(gca_opgraph_add_buffer(g, "a", 32 * KIB, GCA_BUFFER_TEMP));
  GCA_CHECK(gca_opgraph_add_view(g, "av", "a"));
  GCA_CHECK(gca_opgraph_add_buffer(g, "g", 128 * KIB, GCA_BUFFER_TEMP));
  GCA_CHECK(gca_opgraph_add_buffer(g, "h", 32 * KIB, GCA_BUFFER_TEMP));
  GCA_CHECK(gca_opgraph_add_buffer(g, "h2", 32 * KIB, GCA_BUFFER_TEMP));
  GCA_CHECK(gca_opgraph_add_buffer(g, "r", 16 * KIB, GCA_BUFFER_TEMP));
  GCA_CHECK(gca_opgraph_add_buffer(g, "o", 16 * KIB, GCA_BUFFER_OUTPUT));
  GCA_CHECK(add_op(g, "fill", GCA_OP_COMPUTE, 2, NULL, NULL, NULL, x, 1, a, 1, NULL, NULL));
  GCA_CHECK(
      add_op(g, "ag", GCA_OP_COLLECTIVE, 5, "all_gather", "dp", NULL, w, 1, gg, 1, NULL, NULL));
  GCA_CHECK(add_op(g, "mm1", GCA_OP_COMPUTE, 3, NULL, NULL, NULL, av, 1, h, 1, NULL, NULL));
  GCA_CHECK(add_op(g, "mm2", GCA_OP_COMPUTE, 3, NULL, NULL, NULL, h, 1, h2, 1, NULL, NULL));
  GCA_CHECK(add_op(g, "ag_wait", GCA_OP_WAIT, 0, NULL, NULL, "ag", NULL, 0, NULL, 0, NULL, NULL));
  GCA_CHECK(
      add_op(g, "rs", GCA_OP_COLLECTIVE, 4, "reduce_scatter", "tp", NULL, h2, 1, r, 1, NULL, NULL));
  GCA_CHECK(add_op(g, "use_g", GCA_OP_COMPUTE, 2, NULL, NULL, NULL, ga, 2, o, 1, NULL, NULL));
  GCA_CHECK(add_op(g, "rs_wait", GCA_OP_WAIT, 0, NULL, NULL, "rs", NULL, 0, NULL, 0, NULL, NULL));
  GCA_CHECK(add_op(g, "upd", GCA_OP_COMPUTE, 1, NULL, NULL, NULL, r, 1, NULL, 0, "w", "w2"));
  GCA_CHECK(gca_opgraph_add_group(g, grp, 2));
  GCA_CHECK(gca_opgraph_add_order_after(g, "upd", "use_g"));
  return GCA_OK;
}

static gca_status_t scenario(bool armed) {
  (void)armed;
  gca_status_t st = GCA_OK;
  gca_opgraph_t *g = NULL, *j = NULL;
  gca_plan_t *plan = NULL, *cplan = NULL;
  gca_comm_t *comm = NULL;
  gca_stream_t s = NULL;
  size_t n = 0, *order = NULL;
  detail[0] = '\0';

  SWEEP_STEP(gca_opgraph_load_json(graph_json, sizeof(graph_json) - 1, &j));
  SWEEP_STEP(gca_opgraph_create(&g));
  SWEEP_STEP(build_graph(g));
  st = gca_opgraph_finish(g);
  if (st != GCA_OK) {
    snprintf(detail, sizeof(detail), "gca_opgraph_finish: %s", gca_last_error());
    /* a finish that ran out of host memory can be tried again */
    bool was = sweep_armed;
    sweep_arm(false);
    assert_ok(gca_opgraph_finish(g));
    sweep_arm(was);
    goto out;
  }
  n = gca_opgraph_op_count(g);
  order = malloc(n * sizeof(size_t)); /* the test's own: never failed */
  assert_non_null(order);
  SWEEP_STEP(gca_opgraph_program_order(g, order));
  SWEEP_STEP(gca_opgraph_check_order(g, order, n));
  gca_schedule_figures_t f = {.size = sizeof(f)};
  int64_t live[16];
  assert_true(n <= GCA_ARRAY_SIZE(live));
  SWEEP_STEP(gca_opgraph_estimate(g, order, n, &f, live));
  static const gca_schedule_policy_t policies[] = {GCA_SCHEDULE_PROGRAM, GCA_SCHEDULE_EARLIEST,
                                                   GCA_SCHEDULE_PREFETCH_NEXT,
                                                   GCA_SCHEDULE_OVERLAP};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(policies); i++) {
    gca_schedule_options_t so = GCA_SCHEDULE_OPTIONS_INIT;
    so.policy = policies[i];
    so.budget_ratio = 0.5;
    so.keep_comm_order = i % 2 == 1;
    SWEEP_STEP(gca_opgraph_schedule(g, &so, order, n, &f));
  }
  /* a budget nothing fits: the repairs give up and the greedy pass runs */
  gca_schedule_options_t tight = GCA_SCHEDULE_OPTIONS_INIT;
  tight.budget_bytes = 1;
  SWEEP_STEP(gca_opgraph_schedule(g, &tight, order, n, &f));
  SWEEP_STEP(gca_opgraph_check_order(g, order, n));
  SWEEP_STEP(gca_opgraph_estimate(g, order, n, &f, live));

  gca_execute_options_t o = GCA_EXECUTE_OPTIONS_INIT;
  o.time_scale = 0;
  o.verify_mode = GCA_VERIFY_ASSERT;
  SWEEP_STEP(gca_plan_create(g, order, n, &o, &plan));
  SWEEP_STEP(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  for (int run = 0; run < 3; run++) {
    size_t mm = 99;
    st = gca_plan_run(plan, s, NULL, &mm);
    if (st != GCA_OK) {
      snprintf(detail, sizeof(detail), "gca_plan_run: %s", gca_last_error());
      /* the failed run gave its memory back, and the plan runs again */
      bool was = sweep_armed;
      sweep_arm(false);
      assert_ok(gca_stream_synchronize(s));
      gca_stats_t a;
      assert_ok(gca_get_stats(0, &a));
      assert_int_equal(a.allocated_bytes[GCA_STAT_ALL].current, 0);
      assert_ok(gca_plan_run(plan, s, NULL, &mm));
      assert_ok(gca_stream_synchronize(s));
      assert_int_equal(mm, 0);
      sweep_arm(was);
      goto out;
    }
    SWEEP_STEP(gca_stream_synchronize(s));
    assert_int_equal(mm, 0);
  }
  size_t total = 99;
  SWEEP_STEP(gca_plan_result(plan, &total, NULL));
  assert_int_equal(total, 0);

  size_t jn = gca_opgraph_op_count(j), jorder[8];
  assert_true(jn <= GCA_ARRAY_SIZE(jorder));
  gca_schedule_options_t so = GCA_SCHEDULE_OPTIONS_INIT;
  SWEEP_STEP(gca_opgraph_schedule(j, &so, jorder, jn, NULL));
  gca_execute_options_t xo = GCA_EXECUTE_OPTIONS_INIT;
  xo.time_scale = 0.001;
  gca_execute_result_t xr = {.size = sizeof(xr)};
  SWEEP_STEP(gca_opgraph_execute(j, jorder, jn, &xo, &xr));
  assert_int_equal(xr.mismatches, 0);
  /* the JSON graph's collective through a communicator of one rank */
  int dev0 = 0;
  SWEEP_STEP(gca_comm_create_all(1, &dev0, NULL, &comm));
  gca_execute_options_t co = GCA_EXECUTE_OPTIONS_INIT;
  co.time_scale = 0;
  co.comms = &comm;
  SWEEP_STEP(gca_plan_create(j, jorder, jn, &co, &cplan));
  SWEEP_STEP(gca_plan_run(cplan, s, NULL, NULL));
  SWEEP_STEP(gca_stream_synchronize(s));
  SWEEP_STEP(gca_comm_async_error(comm));

out:
  if (s) {
    GCA_CHECK_IGNORE(gca_stream_synchronize(s));
    GCA_CHECK_IGNORE(gca_stream_destroy(s));
  }
  gca_plan_destroy(plan);
  gca_plan_destroy(cplan);
  if (comm)
    GCA_CHECK_IGNORE(gca_comm_destroy(comm));
  free(order);
  gca_opgraph_destroy(g);
  gca_opgraph_destroy(j);
  return st;
}

static void expect_sound(void) {
  gca_stats_t s;
  assert_ok(gca_get_stats(0, &s));
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca__allocator_check());
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void every_scheduler_host_allocation_failure_is_clean(void **state) {
  (void)state;
  sweep_every_allocation("scheduler", scenario, detail, expect_sound);
}

int main(void) {
  test_backend();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_scheduler_host_allocation_failure_is_clean),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
