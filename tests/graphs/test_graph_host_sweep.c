/* SPDX-License-Identifier: Apache-2.0 */
/* test_graph_host_sweep.c - every host allocation of the graphs layer in a
 * short training loop, failed in turn (tests/sweep.h): a graph tree with two
 * graph-safe generators and a function that draws from both, run for four
 * steps (warm-up, recording, replays), the generators' state read and set,
 * then destroyed. For each k the k-th allocation fails: the loop must either
 * go on (a failed recording falls back to eager runs, which is the tree's
 * documented answer) or fail with GCA_ERR_OUT_OF_MEMORY and a detail; either
 * way the tree is destroyed, nothing stays allocated and the allocator is
 * sound. ASan builds check that nothing leaked. */
#include "graph_fixture.h"
#include "sweep.h"

typedef struct gens {
  gca_graph_rng_t *fwd, *bwd;
} gens_t;

static gca_status_t rng_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  (void)in;
  gens_t *g = ctx;
  GCA_CHECK(gca_graph_rng_uniform_u32(g->fwd, out[0], 10, s));
  GCA_CHECK(gca_graph_rng_uniform_u32(g->bwd, out[1], 7, s));
  GCA_CHECK(gca_graph_rng_uniform_u32(g->fwd, (uint32_t *)out[0] + 10, 5, s));
  return GCA_OK;
}

static const size_t rng_outs[2] = {15 * 4, 7 * 4};

static gca_status_t scenario(bool armed) {
  (void)armed;
  gca_status_t st = GCA_OK;
  gca_graph_tree_t *t = NULL;
  gens_t g = {NULL, NULL};
  detail[0] = '\0';
  SWEEP_STEP(gca_graph_tree_create(0, NULL, &t));
  SWEEP_STEP(gca_graph_rng_create(t, 1234, &g.fwd));
  SWEEP_STEP(gca_graph_rng_create(t, 98765, &g.bwd));
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = "rng";
  d.body = rng_body;
  d.ctx = &g;
  d.noutputs = 2;
  d.output_bytes = rng_outs;
  gca_graph_fn_t *fn = NULL;
  SWEEP_STEP(gca_graph_fn_register(t, &d, &fn));
  for (int k = 0; k < 4; k++) {
    void *o[2];
    st = gca_graph_tree_run(t, fn, NULL, 0, o, 2);
    if (st != GCA_OK) {
      snprintf(detail, sizeof(detail), "gca_graph_tree_run: %s", gca_last_error());
      /* the failed run drew nothing, and the tree runs again */
      bool was = sweep_armed;
      sweep_arm(false);
      uint64_t sd = 0, at = 0;
      assert_ok(gca_graph_rng_get_state(g.fwd, &sd, &at));
      assert_int_equal(at, (uint64_t)k * 20);
      assert_ok(gca_graph_tree_run(t, fn, NULL, 0, o, 2));
      assert_ok(gca_graph_tree_step(t));
      assert_ok(gca_graph_rng_get_state(g.fwd, &sd, &at));
      assert_int_equal(at, (uint64_t)(k + 1) * 20);
      sweep_arm(was);
      goto out;
    }
    uint32_t h[15];
    SWEEP_STEP(gca_memcpy(h, o[0], sizeof(h)));
    SWEEP_STEP(gca_graph_tree_step(t));
  }
  uint64_t seed = 0, off = 0;
  SWEEP_STEP(gca_graph_rng_get_state(g.fwd, &seed, &off));
  assert_int_equal(seed, 1234);
  assert_int_equal(off, 4 * 20); /* whether replayed or eager */
  SWEEP_STEP(gca_graph_rng_set_state(g.fwd, seed, 0));
out:
  if (t)
    GCA_CHECK_IGNORE(gca_graph_tree_destroy(t));
  return st;
}

static void expect_sound(void) {
  expect_nothing_leaked();
  assert_ok(gca_empty_cache());
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void every_graphs_host_allocation_failure_is_clean(void **state) {
  (void)state;
  sweep_every_allocation("graphs", scenario, detail, expect_sound);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(every_graphs_host_allocation_failure_is_clean, graph_setup,
                                      graph_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
