/* SPDX-License-Identifier: Apache-2.0 */
/* test_graph_replay.c - the tree's main path: warm-up, record, replay. A
 * multi-kernel function with a copied and a static input computes, replay
 * after replay, exactly what its host reference (the eager semantics) gives,
 * element by element, with the copied input at a different address and with
 * different contents each step; the counters show one warm-up, one record,
 * one instantiation and replays for the rest. */
#include "graph_fixture.h"

static unsigned seed;

static void fill_host(uint32_t *h, uint32_t k) {
  for (uint32_t i = 0; i < NW; i++)
    h[i] = (k * 2654435761u) ^ (i * 40503u) ^ seed;
}

static void replays_compute_what_eager_runs_do_over_many_steps(void **state) {
  (void)state;
  gca_graph_tree_t *t;
  assert_ok(gca_graph_tree_create(0, NULL, &t));
  gca_graph_fn_t *fn = std_register(t, "std", NULL);
  static uint32_t x[NW], w[NW];
  void *xs[2] = {dev_alloc(NW * 4), dev_alloc(NW * 4)};
  void *wd = dev_alloc(NW * 4);
  fill_host(w, 1000);
  dev_write(wd, w, NW);
  enum { STEPS = 60 };
  for (uint32_t k = 0; k < STEPS; k++) {
    fill_host(x, k);
    void *xd = xs[k % 2]; /* a copied input may move */
    dev_write(xd, x, NW);
    void *in[2] = {xd, wd}, *out[2] = {NULL, NULL};
    assert_ok(gca_graph_tree_run(t, fn, in, 2, out, 2));
    char what[64];
    snprintf(what, sizeof(what), "step %u", k);
    std_expect(t, out, x, w, what);
    bool valid = false;
    assert_ok(gca_graph_tree_output_valid(t, out[0], &valid));
    assert_true(valid);
    assert_ok(gca_graph_tree_step(t));
    assert_ok(gca__allocator_check());
  }
  gca_graph_stats_t s = tree_stats(t);
  assert_int_equal(s.warmups, 1);
  assert_int_equal(s.records, 1);
  assert_int_equal(s.instantiations, 1);
  assert_int_equal(s.replays, STEPS - 1);
  assert_int_equal(s.updates + s.rerecords + s.eager_fallbacks, 0);
  assert_int_equal(s.generation, STEPS);
  assert_int_equal(s.nodes, 1);
  assert_int_equal(s.graph_nodes,
                   4); /* std_body's four kernels; the staging copy is not captured */
  assert_true(s.pool_reserved > 0);
  assert_ok(gca_graph_tree_destroy(t));
  for (int i = 0; i < 2; i++)
    assert_ok(gca_free(xs[i]));
  assert_ok(gca_free(wd));
}

/* A tree given a pool records into it (its outputs and the recording's
 * memory are the pool's), keeps it alive while it lives and leaves the
 * caller's use; a pool holding allocated blocks is refused. */
static void a_tree_records_into_a_pool_it_is_given(void **state) {
  (void)state;
  gca_pool_t *pool = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  void *held = NULL;
  assert_ok(gca_pool_use_begin(pool));
  assert_ok(gca_malloc(&held, 4096, NULL));
  assert_ok(gca_pool_use_end(pool));
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.pool = pool;
  gca_graph_tree_t *t = NULL;
  assert_status(gca_graph_tree_create(0, &o, &t), GCA_ERR_INVALID_ARGUMENT,
                "holds 4096 allocated bytes");
  assert_null(t);
  assert_ok(gca_free(held));
  int uses = 0;
  assert_ok(gca_pool_use_count(pool, &uses));
  assert_int_equal(uses, 1);
  assert_ok(gca_graph_tree_create(0, &o, &t));
  assert_ok(gca_pool_use_count(pool, &uses));
  assert_int_equal(uses, 2);
  gca_pool_t *tp = NULL;
  assert_ok(gca_graph_tree_pool(t, &tp));
  assert_ptr_equal(tp, pool);
  gca_graph_fn_t *fn = std_register(t, "std", NULL);
  static uint32_t x[NW], w[NW];
  void *xd = dev_alloc(NW * 4), *wd = dev_alloc(NW * 4);
  fill_host(w, 7);
  dev_write(wd, w, NW);
  for (uint32_t k = 0; k < 4; k++) {
    fill_host(x, k);
    dev_write(xd, x, NW);
    void *in[2] = {xd, wd}, *out[2] = {NULL, NULL};
    assert_ok(gca_graph_tree_run(t, fn, in, 2, out, 2));
    std_expect(t, out, x, w, "given pool");
    assert_ok(gca_graph_tree_step(t));
  }
  size_t reserved = 0, allocated = 0;
  assert_ok(gca_pool_memory(pool, &reserved, &allocated));
  assert_true(reserved > 0 && allocated > 0); /* the recording's memory is the pool's */
  assert_int_equal(tree_stats(t).replays, 3);
  assert_ok(gca_graph_tree_destroy(t));
  assert_ok(gca_pool_memory(pool, &reserved, &allocated));
  assert_int_equal(allocated, 0);
  assert_ok(gca_pool_use_count(pool, &uses));
  assert_int_equal(uses, 1);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_free(xd));
  assert_ok(gca_free(wd));
}

/* A chain of two functions in one step: the second reads the first's output
 * (an ancestor output, not copied) and is recorded as its child. */
static void a_chain_records_children_and_replays_them(void **state) {
  (void)state;
  gca_graph_tree_t *t;
  assert_ok(gca_graph_tree_create(0, NULL, &t));
  gca_graph_fn_t *a = std_register(t, "a", NULL), *b = std_register(t, "b", NULL);
  static uint32_t x[NW], w[NW], y[NW], z[NW], x2[NW];
  void *xd = dev_alloc(NW * 4), *wd = dev_alloc(NW * 4);
  fill_host(w, 7);
  dev_write(wd, w, NW);
  for (uint32_t k = 0; k < 6; k++) {
    fill_host(x, k + 100);
    dev_write(xd, x, NW);
    void *in[2] = {xd, wd}, *oa[2], *ob[2];
    assert_ok(gca_graph_tree_run(t, a, in, 2, oa, 2));
    void *in2[2] = {oa[1], wd}; /* b(x = a.z, w) */
    assert_ok(gca_graph_tree_run(t, b, in2, 2, ob, 2));
    std_expect(t, oa, x, w, "a");
    dev_read(t, z, oa[1], NW);
    memcpy(x2, z, sizeof(x2));
    std_expect(t, ob, x2, w, "b");
    (void)y;
    assert_ok(gca_graph_tree_step(t));
  }
  gca_graph_stats_t s = tree_stats(t);
  /* step 0: a warms up (then b eagerly in the pool); 1: a records, b warms
   * up; 2: a replays, b records; 3..5: both replay. */
  assert_int_equal(s.records, 2);
  assert_int_equal(s.nodes, 2);
  assert_int_equal(s.instantiations, 2);
  assert_int_equal(s.replays, 1 + 2 + 2 * 3);
  assert_int_equal(s.rerecords + s.updates + s.eager_fallbacks, 0);
  assert_ok(gca_graph_tree_destroy(t));
  assert_ok(gca_free(xd));
  assert_ok(gca_free(wd));
}

int main(void) {
  const char *env = getenv("GCA_TEST_SEED");
  seed = env ? (unsigned)strtoul(env, NULL, 0) : 12345u;
  printf("seed %u (GCA_TEST_SEED)\n", seed);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(replays_compute_what_eager_runs_do_over_many_steps,
                                      graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(a_tree_records_into_a_pool_it_is_given, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(a_chain_records_children_and_replays_them, graph_setup,
                                      graph_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
