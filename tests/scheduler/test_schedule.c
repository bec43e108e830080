/* SPDX-License-Identifier: Apache-2.0 */
/* test_schedule.c - the overlap scheduler and its baselines: every order they
 * emit passes the independent checker, budgets hold, groups stay contiguous,
 * a communicator's program order is kept when asked, the same graph and
 * options give the same order, and on the example FSDP graph the schedule
 * hides more communication than the program order within the budget. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp_gen.h"
#include "sched_fixture.h"

static gca_opgraph_t *fsdp(int layers, bool params_dominate) {
  fsdp_shape_t s = {.layers = layers,
                    .ranks = 8,
                    .param_bytes = 500ll << 20,
                    .x_bytes = 64ll << 20,
                    .act_saved_bytes = params_dominate ? 256ll << 20 : 1024ll << 20,
                    .act_temp_bytes = 128ll << 20,
                    .fwd_us = params_dominate ? 5000 : 10000,
                    .bw_bytes_per_us = 100e3,
                    .lat_us = 20};
  gca_opgraph_t *g = NULL;
  assert_ok(fsdp_graph(&s, &g));
  return g;
}

static size_t *sched(const gca_opgraph_t *g, gca_schedule_policy_t pol, double ratio, int64_t bytes,
                     bool keep, gca_schedule_figures_t *f) {
  size_t n = gca_opgraph_op_count(g);
  size_t *order = malloc((n + 1) * sizeof(size_t));
  assert_non_null(order);
  gca_schedule_options_t o = GCA_SCHEDULE_OPTIONS_INIT;
  o.policy = pol;
  o.budget_ratio = ratio;
  o.budget_bytes = bytes;
  o.keep_comm_order = keep;
  f->size = sizeof(*f);
  assert_ok(gca_opgraph_schedule(g, &o, order, n, f));
  assert_ok(gca_opgraph_check_order(g, order, n)); /* the independent checker */
  gca_schedule_figures_t again = {.size = sizeof(again)};
  assert_ok(gca_opgraph_estimate(g, order, n, &again, NULL));
  assert_int_equal(again.peak_bytes, f->peak_bytes);
  return order;
}

static gca_schedule_figures_t program(const gca_opgraph_t *g) {
  gca_schedule_figures_t f;
  free(sched(g, GCA_SCHEDULE_PROGRAM, 0, 0, false, &f));
  return f;
}

static void every_policy_emits_valid_orders_within_the_budget(void **state) {
  (void)state;
  gca_opgraph_t *graphs[3] = {load_example(), fsdp(8, false), fsdp(8, true)};
  const double ratios[] = {0.0, 0.01, 0.03, 0.10, 0.5};
  for (int k = 0; k < 3; k++) {
    gca_schedule_figures_t base = program(graphs[k]), f;
    for (int pol = 0; pol <= GCA_SCHEDULE_PREFETCH_NEXT; pol++)
      for (size_t r = 0; r < sizeof(ratios) / sizeof(ratios[0]); r++)
        for (int keep = 0; keep < 2; keep++) {
          free(sched(graphs[k], (gca_schedule_policy_t)pol, ratios[r], 0, keep, &f));
          if (pol == GCA_SCHEDULE_OVERLAP) {
            int64_t budget = (int64_t)((double)base.peak_bytes * (1.0 + ratios[r]));
            if (f.peak_bytes > budget)
              fail_msg("graph %d ratio %.2f: peak %lld over the budget %lld", k, ratios[r],
                       (long long)f.peak_bytes, (long long)budget);
            assert_true(f.exposed_comm_us <= base.exposed_comm_us + 1e-6);
          }
        }
    gca_opgraph_destroy(graphs[k]);
  }
}

static void an_absolute_budget_below_the_program_peak_gives_the_program_order(void **state) {
  (void)state;
  gca_opgraph_t *g = fsdp(4, false);
  gca_schedule_figures_t base = program(g), f;
  size_t *order = sched(g, GCA_SCHEDULE_OVERLAP, 0, base.peak_bytes / 2, false, &f);
  for (size_t i = 0; i < gca_opgraph_op_count(g); i++)
    assert_int_equal(order[i], i);
  free(order);
  gca_opgraph_destroy(g);
}

static void the_same_graph_and_options_give_the_same_order(void **state) {
  (void)state;
  gca_opgraph_t *a = fsdp(12, false), *b = fsdp(12, false);
  gca_schedule_figures_t fa, fb;
  size_t n = gca_opgraph_op_count(a);
  size_t *oa = sched(a, GCA_SCHEDULE_OVERLAP, 0.03, 0, false, &fa);
  size_t *ob = sched(b, GCA_SCHEDULE_OVERLAP, 0.03, 0, false, &fb);
  assert_memory_equal(oa, ob, n * sizeof(size_t));
  free(oa);
  free(ob);
  gca_opgraph_destroy(a);
  gca_opgraph_destroy(b);
}

/* The collectives in the order they are issued (their positions). */
static size_t collectives_of(const gca_opgraph_t *g, const size_t *order, size_t *out) {
  size_t m = 0;
  for (size_t i = 0; i < gca_opgraph_op_count(g); i++)
    if (gca_opgraph_op_kind(g, order[i]) == GCA_OP_COLLECTIVE)
      out[m++] = order[i];
  return m;
}

static void keeping_communicator_order_issues_collectives_in_program_order(void **state) {
  (void)state;
  gca_opgraph_t *g = fsdp(8, false);
  size_t n = gca_opgraph_op_count(g);
  size_t *seq = malloc(n * sizeof(size_t));
  assert_non_null(seq);
  gca_schedule_figures_t f;
  size_t *kept = sched(g, GCA_SCHEDULE_OVERLAP, 0.10, 0, true, &f);
  size_t m = collectives_of(g, kept, seq);
  for (size_t i = 1; i < m; i++)
    assert_true(seq[i - 1] < seq[i]);
  /* without the option the scheduler reorders them (a gather of the next
   * layer ahead of this layer's reduce-scatter) */
  size_t *free_order = sched(g, GCA_SCHEDULE_OVERLAP, 0.10, 0, false, &f);
  m = collectives_of(g, free_order, seq);
  bool reordered = false;
  for (size_t i = 1; i < m; i++)
    reordered |= seq[i - 1] > seq[i];
  assert_true(reordered);
  free(kept);
  free(free_order);
  free(seq);
  gca_opgraph_destroy(g);
}

static void the_example_schedule_hides_more_within_the_budget(void **state) {
  (void)state;
  gca_opgraph_t *g = load_example();
  gca_schedule_figures_t base = program(g), f;
  free(sched(g, GCA_SCHEDULE_OVERLAP, 0.03, 0, false, &f));
  print_message("example graph: program exposed %.1f us peak %lld, scheduled exposed %.1f us "
                "peak %lld, hidden %zu of %zu\n",
                base.exposed_comm_us, (long long)base.peak_bytes, f.exposed_comm_us,
                (long long)f.peak_bytes, f.collectives_hidden, f.collectives_total);
  assert_true(f.exposed_comm_us < base.exposed_comm_us);
  assert_true(f.collectives_hidden > base.collectives_hidden);
  assert_true((double)f.peak_bytes <= (double)base.peak_bytes * 1.03);
  gca_opgraph_destroy(g);
}

static void bad_options_are_refused(void **state) {
  (void)state;
  gca_opgraph_t *g = load_example();
  size_t n = gca_opgraph_op_count(g);
  size_t *order = malloc(n * sizeof(size_t));
  gca_schedule_options_t o = GCA_SCHEDULE_OPTIONS_INIT;
  o.budget_ratio = -1;
  assert_status(gca_opgraph_schedule(g, &o, order, n, NULL), GCA_ERR_INVALID_ARGUMENT,
                "bad budget");
  o = (gca_schedule_options_t)GCA_SCHEDULE_OPTIONS_INIT;
  o.policy = (gca_schedule_policy_t)9;
  assert_status(gca_opgraph_schedule(g, &o, order, n, NULL), GCA_ERR_INVALID_ARGUMENT,
                "unknown policy");
  assert_status(gca_opgraph_schedule(g, NULL, order, n - 1, NULL), GCA_ERR_INVALID_ARGUMENT,
                "entries");
  free(order);
  gca_opgraph_destroy(g);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s fsdp-4L.json\n", argv[0]);
    return 1;
  }
  example_path = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_policy_emits_valid_orders_within_the_budget),
      cmocka_unit_test(an_absolute_budget_below_the_program_peak_gives_the_program_order),
      cmocka_unit_test(the_same_graph_and_options_give_the_same_order),
      cmocka_unit_test(keeping_communicator_order_issues_collectives_in_program_order),
      cmocka_unit_test(the_example_schedule_hides_more_within_the_budget),
      cmocka_unit_test(bad_options_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
