/* SPDX-License-Identifier: Apache-2.0 */
/* test_train.c - gca-train's step through every layer (tools/train_run.h):
 * eager program order, the scheduled plan and graph replays give the same
 * losses and parameters bit for bit, on threads and on processes; the
 * verifier sees no mismatch; peak live stays within the budget, peak
 * reserved within it plus one growth step per pool kind and steady after
 * the first two steps; a batch change runs the same step function at a new
 * shape, re-recorded once as a branch of its own and replayed after; faults
 * at the layers' boundaries end every rank with an error naming the layer and
 * op, and nothing leaks.
 *
 * The process test runs first: forked ranks need a parent that has not
 * started the sim (Note [Sim after fork]). With GCA_TEST_BACKEND=cuda (the
 * `gpu` suite) one rank runs the same equalities on the device, or the test
 * skips without one. */
#include <math.h>

#include "support.h"
#include "train_run.h"
#include "util.h"

static bool on_cuda(void) {
  const char *b = getenv("GCA_TEST_BACKEND");
  return b && strcmp(b, "cuda") == 0;
}

static train_cfg_t small(train_mode_t mode, int ranks) {
  train_cfg_t c;
  train_cfg_default(&c);
  c.shape.layers = 2;
  c.shape.ranks = ranks;
  c.shape.batch = 8;
  c.shape.hidden = 16;
  c.shape.ffn = 32;
  c.steps = 5;
  c.seed = 7;
  c.mode = mode;
  c.timeout_s = 20;
  return c;
}

static void run_ok(const train_cfg_t *c, train_results_t *r) {
  gca_status_t st = train_run(c, r);
  if (st != GCA_OK)
    fail_msg("train_run (mode %d, %d ranks, %s): %s", (int)c->mode, c->shape.ranks,
             c->processes ? "processes" : "threads", tool_last_error());
  for (int i = 0; i < r->ranks; i++) {
    assert_int_equal(r->rank[i].status, GCA_OK);
    assert_int_equal(r->rank[i].steps_done, c->steps);
    assert_int_equal(r->rank[i].leaked_bytes, 0);
  }
}

/* Every rank's loss at every step and its parameters after the run: the same bits. */
static void assert_same_bits(const train_results_t *a, const train_results_t *b) {
  assert_int_equal(a->ranks, b->ranks);
  assert_int_equal(a->layers * a->shard_elems, b->layers * b->shard_elems);
  for (int i = 0; i < a->ranks; i++) {
    for (int k = 0; k < a->steps; k++) {
      float la = a->rank[i].steps[k].loss, lb = b->rank[i].steps[k].loss;
      if (memcmp(&la, &lb, sizeof(float)) != 0)
        fail_msg("rank %d step %d: loss %.9g vs %.9g", i, k, (double)la, (double)lb);
      assert_true(isfinite(la) && la > 0);
    }
    if (memcmp(a->rank[i].params, b->rank[i].params, a->layers * a->shard_elems * 4) != 0)
      fail_msg("rank %d: parameters differ", i);
  }
}

static size_t mismatches(const train_results_t *r) {
  size_t n = 0;
  for (int i = 0; i < r->ranks; i++)
    for (int k = 0; k < r->rank[i].steps_done; k++)
      n += r->rank[i].steps[k].mismatches;
  return n;
}

static void processes_and_threads_give_the_same_bits(void **state) {
  (void)state;
  train_results_t p, t;
  train_cfg_t c = small(TRAIN_GRAPH, 4);
  c.processes = true;
  run_ok(&c, &p);
  c.processes = false;
  run_ok(&c, &t);
  assert_same_bits(&p, &t);
  assert_int_equal(mismatches(&p), 0);
  assert_int_equal(mismatches(&t), 0);
  /* the training moves: the loss of the last step differs from the first */
  assert_true(t.rank[0].steps[0].loss != t.rank[0].steps[c.steps - 1].loss);
  train_results_free(&p);
  train_results_free(&t);
}

static void eager_scheduled_and_replayed_steps_are_bit_equal(void **state) {
  (void)state;
  int ranks = on_cuda() ? 1 : 4;
  train_results_t r[3];
  for (int m = 0; m < 3; m++) {
    train_cfg_t c = small((train_mode_t)m, ranks);
    run_ok(&c, &r[m]);
    assert_int_equal(mismatches(&r[m]), 0);
    for (int i = 0; i < ranks; i++)
      for (int k = 0; k < c.steps; k++) {
        const train_step_rec_t *s = &r[m].rank[i].steps[k];
        /* the live peak: the plan's (within the budget) plus what is bound */
        if (s->peak_live >
            (uint64_t)(r[m].rank[i].budget_bytes + r[m].rank[i].bound_bytes) + 64 * 512)
          fail_msg("mode %d rank %d step %d: peak live %llu over budget %lld + bound %lld", m, i, k,
                   (unsigned long long)s->peak_live, (long long)r[m].rank[i].budget_bytes,
                   (long long)r[m].rank[i].bound_bytes);
        assert_true(s->peak_reserved >= s->peak_live);
        /* reserved beyond that need is the allocator's growth rounding: the
         * step's memory is the comm pool's, a private pool, which grows by at
         * least PyTorch's kSmallBuffer (2 MiB) for small blocks and its
         * classic segment size (kLargeBuffer, 20 MiB) for large ones; one of
         * each, and no fragmentation on top */
        uint64_t need = (uint64_t)(r[m].rank[i].budget_bytes + r[m].rank[i].bound_bytes);
        if (s->peak_reserved > need + 64 * 512 + (22u << 20))
          fail_msg("mode %d rank %d step %d: peak reserved %llu over budget %lld + bound %lld + "
                   "one growth step of each pool",
                   m, i, k, (unsigned long long)s->peak_reserved,
                   (long long)r[m].rank[i].budget_bytes, (long long)r[m].rank[i].bound_bytes);
        /* and it stops growing once the steps repeat */
        if (k >= 2 && s->peak_reserved != r[m].rank[i].steps[1].peak_reserved)
          fail_msg("mode %d rank %d step %d: peak reserved %llu, step 1's %llu", m, i, k,
                   (unsigned long long)s->peak_reserved,
                   (unsigned long long)r[m].rank[i].steps[1].peak_reserved);
        /* the step's memory is the comm pool's: registered as it grows, never
         * once the steps repeat (warm-up and record made it) */
        if (k >= 2 && s->registrations != 0)
          fail_msg("mode %d rank %d step %d: %llu registrations", m, i, k,
                   (unsigned long long)s->registrations);
        int want = m != TRAIN_GRAPH ? -1
                   : k == 0         ? GCA_GRAPH_WARMUP
                   : k == 1         ? GCA_GRAPH_RECORD
                                    : GCA_GRAPH_REPLAY;
        if (s->decision != want)
          fail_msg("mode %d rank %d step %d: decision %s, wanted %s", m, i, k,
                   train_decision_name(s->decision), train_decision_name(want));
      }
  }
  for (int m = 0; m < 3 && !on_cuda(); m++)
    assert_true(r[m].rank[0].steps[0].registrations > 0);
  assert_same_bits(&r[0], &r[1]);
  assert_same_bits(&r[0], &r[2]);
  assert_true(r[2].rank[0].graph_nodes > 0);
  for (int m = 0; m < 3; m++)
    train_results_free(&r[m]);
}

static void a_batch_change_rerecords_its_own_branch(void **state) {
  (void)state;
  train_results_t e, g;
  train_cfg_t c = small(TRAIN_EAGER, 2);
  c.steps = 7;
  c.change_step = 3;
  c.change_batch = 4;
  run_ok(&c, &e);
  c.mode = TRAIN_GRAPH;
  run_ok(&c, &g);
  assert_same_bits(&e, &g);
  assert_int_equal(mismatches(&g), 0);
  /* the step function at batch 4: a re-record for the shape (no second
   * warm-up), then replays */
  const int want[] = {GCA_GRAPH_WARMUP, GCA_GRAPH_RECORD, GCA_GRAPH_REPLAY, GCA_GRAPH_RERECORD,
                      GCA_GRAPH_REPLAY, GCA_GRAPH_REPLAY, GCA_GRAPH_REPLAY};
  for (int i = 0; i < g.ranks; i++)
    for (int k = 0; k < c.steps; k++) {
      const train_step_rec_t *s = &g.rank[i].steps[k];
      if (s->decision != want[k])
        fail_msg("rank %d step %d: %s, wanted %s", i, k, train_decision_name(s->decision),
                 train_decision_name(want[k]));
      if (k == c.change_step) {
        printf("# rank %d step %d: %s: %s\n", i, k, train_decision_name(s->decision), s->why);
        /* x0 of 8 rows of 16 floats, then of 4 */
        assert_string_equal(s->why, "step: shape changed: input 0 512 -> 256 bytes");
        assert_string_equal(train_decision_name(s->decision), "re-record");
      } else {
        assert_string_equal(s->why, "");
      }
    }
  train_results_free(&e);
  train_results_free(&g);
}

/* A failed run: every rank failed, the first failure's text names `needle`,
 * and no rank left memory allocated. */
static void assert_all_failed(const train_results_t *r, const char *needle) {
  const char *err = tool_last_error();
  if (!strstr(err, needle))
    fail_msg("error '%s' does not name '%s'", err, needle);
  for (int i = 0; i < r->ranks; i++) {
    printf("#   rank %d: %s\n", i, r->rank[i].error);
    if (r->rank[i].status == GCA_OK)
      fail_msg("rank %d finished", i);
    assert_int_equal(r->rank[i].leaked_bytes, 0);
  }
}

static void a_fault_in_a_collective_ends_every_rank_naming_it(void **state) {
  (void)state;
  train_cfg_t c = small(TRAIN_SCHEDULED, 4);
  c.fault = "launch_host_func:nth=3";
  c.fault_step = 1;
  train_results_t r;
  assert_int_not_equal(train_run(&c, &r), GCA_OK);
  printf("# collective fault: %s\n", tool_last_error());
  assert_all_failed(&r, "op 'ag_");
  assert_all_failed(&r, "launch_host_func");
  train_results_free(&r);
  /* the sim is sound afterwards: a clean run passes */
  c.fault = NULL;
  run_ok(&c, &r);
  train_results_free(&r);
}

/* A collective that fails while it runs (its transport, not its issue): the
 * error surfaces on every rank's stream, naming the collective. */
static void a_transport_fault_ends_every_rank_naming_the_collective(void **state) {
  (void)state;
  train_cfg_t c = small(TRAIN_GRAPH, 4);
  train_results_t r;
  /* six collectives a step on each of four ranks: the 27th pass is in step 1 */
  assert_ok(gca__failpoint_arm("sim_collective", 27));
  assert_int_not_equal(train_run(&c, &r), GCA_OK);
  gca__failpoint_clear();
  printf("# transport fault: %s\n", tool_last_error());
  assert_all_failed(&r, "the transport failed on rank");
  assert_all_failed(&r, "(injected fault)");
  assert_all_failed(&r, " #");
  train_results_free(&r);
  run_ok(&c, &r);
  train_results_free(&r);
}

static void a_map_fault_ends_every_rank_naming_the_op(void **state) {
  (void)state;
  train_cfg_t c = small(TRAIN_EAGER, 4);
  c.shape.hidden = 128; /* a flat parameter of 1 MiB: the large pool grows in step 0 */
  c.shape.ffn = 1024;
  c.shape.batch = 4;
  c.fault = "mem_map:nth=1";
  c.fault_step = 0;
  train_results_t r;
  assert_int_not_equal(train_run(&c, &r), GCA_OK);
  printf("# map fault: %s\n", tool_last_error());
  assert_all_failed(&r, "plan_run: step ");
  assert_all_failed(&r, "mem_map");
  train_results_free(&r);
  c.fault = NULL;
  run_ok(&c, &r);
  train_results_free(&r);
}

/* A capture failing ends every rank; the first error names the tree's step
 * (capture), the step's function and the operation. */
static void a_capture_fault_ends_every_rank_naming_it(void **state) {
  (void)state;
  train_cfg_t c = small(TRAIN_GRAPH, 4);
  c.fault = "stream_begin_capture:nth=1";
  c.fault_step = 1;
  train_results_t r;
  assert_int_not_equal(train_run(&c, &r), GCA_OK);
  printf("# capture fault: %s\n", tool_last_error());
  assert_all_failed(&r, "step 1: graphs: graph_tree_run: step: capture failed");
  assert_all_failed(&r, "capture failed");
  assert_all_failed(&r, "stream_begin_capture");
  train_results_free(&r);
  /* an instantiation failing is the same kind of error */
  c.fault = "graph_instantiate:nth=2";
  assert_int_not_equal(train_run(&c, &r), GCA_OK);
  printf("# instantiate fault: %s\n", tool_last_error());
  assert_all_failed(&r, "instantiate failed");
  assert_all_failed(&r, "graph_instantiate");
  train_results_free(&r);
  c.fault = NULL;
  run_ok(&c, &r);
  train_results_free(&r);
}

/* With capture_fallback, the rank whose capture failed runs that step
 * eagerly and the bits stay those of eager execution. */
static void a_capture_fault_falls_back_to_eager_with_the_same_bits(void **state) {
  (void)state;
  train_cfg_t c = small(TRAIN_GRAPH, 2);
  c.fault = "stream_begin_capture:nth=1";
  c.fault_step = 1;
  c.capture_fallback = true;
  train_results_t g, e;
  run_ok(&c, &g);
  int eager = 0;
  for (int i = 0; i < g.ranks; i++)
    if (g.rank[i].steps[1].decision == GCA_GRAPH_EAGER) {
      eager++; /* the reason names the failed operation */
      printf("# capture fault: rank %d: %s\n", i, g.rank[i].steps[1].why);
      assert_non_null(strstr(g.rank[i].steps[1].why, "stream_begin_capture"));
    }
  assert_int_equal(eager, 1); /* the rank whose capture failed ran the step eagerly */
  c.fault = NULL;
  c.mode = TRAIN_EAGER;
  run_ok(&c, &e);
  assert_same_bits(&e, &g);
  train_results_free(&g);
  train_results_free(&e);
}

static void bad_shapes_are_refused_with_the_reason(void **state) {
  (void)state;
  train_results_t r;
  train_cfg_t c = small(TRAIN_EAGER, 3);
  c.shape.hidden = 5;
  c.shape.ffn = 7; /* 70 elements over 3 ranks */
  assert_int_equal(train_run(&c, &r), GCA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(tool_last_error(), "does not split evenly over 3 ranks"));
  c = small(TRAIN_EAGER, 2);
  c.shape.dropout = 1.0f;
  assert_int_equal(train_run(&c, &r), GCA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(tool_last_error(), "dropout"));
  c = small(TRAIN_EAGER, 2);
  c.steps = 0;
  assert_int_equal(train_run(&c, &r), GCA_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(tool_last_error(), "steps 0"));
}

int main(void) {
  test_filter_from_env();
  setenv("GCA_SIM_DEVICES", "4", 0);
  setenv("GCA_SIM_CLOCK", "virtual", 0);
  setenv("GCA_ALLOC_CONF", "expandable_segments:True", 0);
  if (on_cuda()) {
    (void)test_backend(); /* exits 77 without a device */
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test(eager_scheduled_and_replayed_steps_are_bit_equal),
    };
    return cmocka_run_group_tests(gpu, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(processes_and_threads_give_the_same_bits),
      cmocka_unit_test(eager_scheduled_and_replayed_steps_are_bit_equal),
      cmocka_unit_test(a_batch_change_rerecords_its_own_branch),
      cmocka_unit_test(a_fault_in_a_collective_ends_every_rank_naming_it),
      cmocka_unit_test(a_transport_fault_ends_every_rank_naming_the_collective),
      cmocka_unit_test(a_map_fault_ends_every_rank_naming_the_op),
      cmocka_unit_test(a_capture_fault_ends_every_rank_naming_it),
      cmocka_unit_test(a_capture_fault_falls_back_to_eager_with_the_same_bits),
      cmocka_unit_test(bad_shapes_are_refused_with_the_reason),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
