/* SPDX-License-Identifier: Apache-2.0 */
/* test_graph_liveness.c - outputs belong to the tree until released or until
 * the next generation: a step makes every output of the previous generation
 * stale, the validity query reports it, releasing it again is refused, and
 * with poison_stale (sim) reading a stale output faults in a forked child
 * instead of returning whatever a later run wrote there. */

#include "graph_fixture.h"

typedef struct env {
  gca_graph_tree_t *t;
  gca_graph_fn_t *fn;
  void *xd, *wd;
  uint32_t x[NW], w[NW];
} env_t;

static env_t *env_new(bool poison) {
  env_t *e = calloc(1, sizeof(*e));
  assert_non_null(e);
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.poison_stale = poison;
  assert_ok(gca_graph_tree_create(0, &o, &e->t));
  e->fn = std_register(e->t, "std", NULL);
  e->xd = dev_alloc(NW * 4);
  e->wd = dev_alloc(NW * 4);
  for (uint32_t i = 0; i < NW; i++)
    e->x[i] = 3 * i, e->w[i] = 11 * i;
  dev_write(e->xd, e->x, NW);
  dev_write(e->wd, e->w, NW);
  return e;
}

static void env_run(env_t *e, void **out) {
  void *in[2] = {e->xd, e->wd};
  assert_ok(gca_graph_tree_run(e->t, e->fn, in, 2, out, 2));
  std_expect(e->t, out, e->x, e->w, "run");
}

static void env_free(env_t *e) {
  assert_ok(gca_graph_tree_destroy(e->t));
  assert_ok(gca_free(e->xd));
  assert_ok(gca_free(e->wd));
  free(e);
}

static bool valid(env_t *e, const void *p) {
  bool v = true;
  assert_ok(gca_graph_tree_output_valid(e->t, p, &v));
  return v;
}

static void a_new_generation_makes_old_outputs_stale(void **state) {
  (void)state;
  env_t *e = env_new(false);
  for (int step = 0; step < 4; step++) { /* warm-up, record, replays: every kind of output */
    void *out[2];
    env_run(e, out);
    assert_true(valid(e, out[0]));
    assert_true(valid(e, out[1]));
    assert_ok(gca_graph_tree_release(e->t, out[1]));
    assert_false(valid(e, out[1]));
    assert_status(gca_graph_tree_release(e->t, out[1]), GCA_ERR_INVALID_POINTER,
                  "is not a live output");
    assert_ok(gca_graph_tree_step(e->t));
    assert_false(valid(e, out[0]));
    assert_status(gca_graph_tree_release(e->t, out[0]), GCA_ERR_INVALID_POINTER,
                  "is not a live output");
    assert_ok(gca__allocator_check());
  }
  assert_false(valid(e, e->xd));
  env_free(e);
}

static void with_poison_a_stale_read_faults(void **state) {
  (void)state;
  if (!on_sim) {
    skip();
    return;
  }
  env_t *e = env_new(true);
  for (int step = 0; step < 4; step++) { /* warm-up, record, replay, replay */
    void *out[2];
    env_run(e, out);
    assert_false(test_read_faults(out[0])); /* live: readable */
    assert_ok(gca_graph_tree_step(e->t));
    assert_false(valid(e, out[0]));
    assert_true(test_read_faults(out[0]));
    assert_true(test_read_faults(out[1]));
  }
  /* The next run takes the memory back and computes correctly. */
  void *out[2];
  env_run(e, out);
  env_free(e);
}

static void poison_stale_needs_the_sim_backend(void **state) {
  (void)state;
  if (on_sim) {
    skip();
    return;
  }
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.poison_stale = true;
  gca_graph_tree_t *t = NULL;
  assert_status(gca_graph_tree_create(0, &o, &t), GCA_ERR_NOT_SUPPORTED, "poison_stale");
  assert_null(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(a_new_generation_makes_old_outputs_stale, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(with_poison_a_stale_read_faults, graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(poison_stale_needs_the_sim_backend, graph_setup,
                                      graph_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
