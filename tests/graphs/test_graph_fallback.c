/* SPDX-License-Identifier: Apache-2.0 */
/* test_graph_fallback.c - what the tree does when a recording's invariant
 * breaks: a static input that moved is taken by an in-place exec update when
 * the new capture has the same topology (no instantiation), by a re-record
 * when it does not, and past rerecord_limit re-records the function runs
 * eagerly for good; each decision reaches the callback with the rule, the
 * argument index and the old and new addresses. An output of an earlier
 * recording that the recording reused but that is live now forces a
 * re-record that keeps it intact. Results are checked against the host
 * reference throughout. */
#include "graph_fixture.h"

/* std_body plus `extra` fills of a temporary, where extra is the index of the
 * static input's address in w[] (so moving it changes the topology). */
typedef struct variant {
  void *w[4];
  bool topology_follows_w;
} variant_t;

static gca_status_t variant_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  variant_t *v = ctx;
  GCA_CHECK(std_body(s, in, out, NULL));
  int extra = 0;
  for (int i = 0; i < 4 && v->topology_follows_w; i++)
    if (v->w[i] == in[1])
      extra = i;
  if (!extra)
    return GCA_OK;
  void *tmp = NULL;
  GCA_CHECK(gca_malloc(&tmp, 256, s));
  gca_status_t st = GCA_OK;
  for (int i = 0; i < extra && st == GCA_OK; i++)
    st = ops->kernel_fill_u32((gca_devptr_t)(uintptr_t)tmp, (uint32_t)i, 0, 64, s);
  gca_status_t st2 = gca_free(tmp);
  return st != GCA_OK ? st : st2;
}

typedef struct world {
  gca_graph_tree_t *t;
  decisions_t ds;
  variant_t v;
  gca_graph_fn_t *fn;
  void *xd;
  uint32_t x[NW], w[4][NW];
} world_t;

static world_t *world_new(unsigned limit, bool topology) {
  world_t *wd = calloc(1, sizeof(*wd));
  assert_non_null(wd);
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.rerecord_limit = limit;
  o.on_decision = record_decision;
  o.decision_ctx = &wd->ds;
  assert_ok(gca_graph_tree_create(0, &o, &wd->t));
  wd->v.topology_follows_w = topology;
  for (int i = 0; i < 4; i++) {
    wd->v.w[i] = dev_alloc(NW * 4);
    for (uint32_t j = 0; j < NW; j++)
      wd->w[i][j] = (uint32_t)(i + 1) * 1000u + j;
    dev_write(wd->v.w[i], wd->w[i], NW);
  }
  for (uint32_t j = 0; j < NW; j++)
    wd->x[j] = j * 3u;
  wd->xd = dev_alloc(NW * 4);
  dev_write(wd->xd, wd->x, NW);
  wd->fn = std_register_ctx(wd->t, "variant", variant_body, &wd->v);
  return wd;
}

static void world_free(world_t *wd) {
  assert_ok(gca_graph_tree_destroy(wd->t));
  for (int i = 0; i < 4; i++)
    assert_ok(gca_free(wd->v.w[i]));
  assert_ok(gca_free(wd->xd));
  free(wd);
}

/* One step with the static input at w[wi]; outputs checked. */
static void world_step(world_t *wd, int wi) {
  void *in[2] = {wd->xd, wd->v.w[wi]}, *out[2];
  assert_ok(gca_graph_tree_run(wd->t, wd->fn, in, 2, out, 2));
  char what[48];
  snprintf(what, sizeof(what), "w[%d]", wi);
  std_expect(wd->t, out, wd->x, wd->w[wi], what);
  assert_ok(gca_graph_tree_step(wd->t));
  assert_ok(gca__allocator_check());
}

static const gca_graph_decision_t *last_decision(world_t *wd) {
  assert_true(wd->ds.n > 0);
  return &wd->ds.d[wd->ds.n - 1];
}

static void moved_static_input_is_updated_in_place_without_instantiation(void **state) {
  (void)state;
  world_t *wd = world_new(8, false);
  world_step(wd, 0); /* warm-up */
  world_step(wd, 0); /* record */
  gca_graph_stats_t before = tree_stats(wd->t);
  assert_int_equal(before.instantiations, 1);
  size_t nd = wd->ds.n;
  world_step(wd, 1);
  assert_int_equal(wd->ds.n, nd + 1);
  const gca_graph_decision_t *d = last_decision(wd);
  assert_int_equal(d->action, GCA_GRAPH_UPDATE);
  assert_int_equal(d->rule, GCA_GRAPH_RULE_STATIC_INPUT_MOVED);
  assert_int_equal(d->arg, 1);
  assert_ptr_equal(d->old_address, wd->v.w[0]);
  assert_ptr_equal(d->new_address, wd->v.w[1]);
  gca_graph_stats_t s = tree_stats(wd->t);
  assert_int_equal(s.updates, 1);
  assert_int_equal(s.instantiations, 1);
  assert_int_equal(s.rerecords, 0);
  /* Now recorded at w[1]: plain replays, no further decisions. */
  world_step(wd, 1);
  world_step(wd, 1);
  assert_int_equal(wd->ds.n, nd + 1);
  assert_int_equal(tree_stats(wd->t).replays, before.replays + 3);
  world_free(wd);
}

static void moved_static_input_with_new_topology_is_rerecorded(void **state) {
  (void)state;
  world_t *wd = world_new(8, true);
  world_step(wd, 0);
  world_step(wd, 0);
  world_step(wd, 2); /* two extra kernels: exec update refuses, re-record */
  const gca_graph_decision_t *d = last_decision(wd);
  assert_int_equal(d->action, GCA_GRAPH_RERECORD);
  assert_int_equal(d->rule, GCA_GRAPH_RULE_STATIC_INPUT_MOVED);
  assert_int_equal(d->arg, 1);
  assert_ptr_equal(d->old_address, wd->v.w[0]);
  assert_ptr_equal(d->new_address, wd->v.w[2]);
  assert_non_null(strstr(d->detail, "exec update refused"));
  gca_graph_stats_t s = tree_stats(wd->t);
  assert_int_equal(s.rerecords, 1);
  assert_int_equal(s.updates, 0);
  assert_int_equal(s.instantiations, 2);
  assert_int_equal(s.nodes, 1);
  world_step(wd, 2);
  assert_int_equal(tree_stats(wd->t).rerecords, 1);
  world_free(wd);
}

static void past_the_rerecord_limit_the_function_runs_eagerly(void **state) {
  (void)state;
  world_t *wd = world_new(2, true);
  world_step(wd, 0);
  world_step(wd, 0);
  world_step(wd, 1); /* re-record 1 */
  world_step(wd, 2); /* re-record 2 */
  assert_int_equal(tree_stats(wd->t).rerecords, 2);
  world_step(wd, 3); /* limit: eager */
  const gca_graph_decision_t *d = last_decision(wd);
  assert_int_equal(d->action, GCA_GRAPH_EAGER);
  assert_true(d->limit_reached);
  assert_int_equal(d->rule, GCA_GRAPH_RULE_STATIC_INPUT_MOVED);
  assert_int_equal(d->arg, 1);
  assert_ptr_equal(d->old_address, wd->v.w[2]);
  assert_ptr_equal(d->new_address, wd->v.w[3]);
  gca_graph_stats_t s = tree_stats(wd->t);
  assert_int_equal(s.rerecords, 2);
  assert_int_equal(s.eager_fallbacks, 1);
  /* From now on eager, even at the recorded address. */
  world_step(wd, 2);
  world_step(wd, 0);
  d = last_decision(wd);
  assert_int_equal(d->action, GCA_GRAPH_EAGER);
  assert_int_equal(d->rule, GCA_GRAPH_RULE_EAGER_FOREVER);
  s = tree_stats(wd->t);
  assert_int_equal(s.eager_fallbacks, 3);
  assert_int_equal(s.rerecords, 2);
  world_free(wd);
}

/* a's first output is released before b is recorded (b may reuse it); in a
 * later step it is kept: b must not overwrite it, so b is re-recorded. */
static void a_live_output_the_recording_reused_forces_a_rerecord(void **state) {
  (void)state;
  world_t *wd = world_new(8, false);
  gca_graph_fn_t *b = std_register(wd->t, "b", NULL);
  static uint32_t keep[NW], now[NW];
  for (int step = 0; step < 5; step++) {
    bool release = step < 3;
    void *in[2] = {wd->xd, wd->v.w[0]}, *oa[2], *ob[2];
    assert_ok(gca_graph_tree_run(wd->t, wd->fn, in, 2, oa, 2));
    dev_read(wd->t, keep, oa[0], NW);
    if (release)
      assert_ok(gca_graph_tree_release(wd->t, oa[0]));
    void *in2[2] = {wd->xd, wd->v.w[1]};
    assert_ok(gca_graph_tree_run(wd->t, b, in2, 2, ob, 2));
    std_expect(wd->t, ob, wd->x, wd->w[1], "b");
    if (!release) {
      dev_read(wd->t, now, oa[0], NW);
      assert_memory_equal(keep, now, sizeof(keep));
    }
    if (step == 3) {
      const gca_graph_decision_t *d = last_decision(wd);
      assert_int_equal(d->action, GCA_GRAPH_RERECORD);
      assert_int_equal(d->rule, GCA_GRAPH_RULE_OUTPUT_STILL_LIVE);
      assert_ptr_equal(d->old_address, oa[0]);
    }
    assert_ok(gca_graph_tree_step(wd->t));
    assert_ok(gca__allocator_check());
  }
  assert_int_equal(tree_stats(wd->t).rerecords, 1);
  world_free(wd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(moved_static_input_is_updated_in_place_without_instantiation,
                                      graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(moved_static_input_with_new_topology_is_rerecorded,
                                      graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(past_the_rerecord_limit_the_function_runs_eagerly,
                                      graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(a_live_output_the_recording_reused_forces_a_rerecord,
                                      graph_setup, graph_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
