/* SPDX-License-Identifier: Apache-2.0 */
/* test_graph_branch.c - branching: A->B recorded, then A->B' recorded as a
 * sibling of B (the pool restored to A's checkpoint first). A's outputs stay
 * intact while B' records and replays, B still replays correctly afterwards,
 * and the pool of the branching tree holds about the larger branch, not the
 * sum: within one segment's slack of the larger single-branch tree. Uses
 * expandable segments, whose restore gives back the space a branch mapped. */
#include "graph_fixture.h"

#define MiB ((size_t)1 << 20)

/* out0 = fill(c, 1) with x added to its first NW words; out1 = fill(c + 1, 2). */
typedef struct big {
  size_t words;
  uint32_t c;
} big_t;

static gca_status_t big_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  big_t *b = ctx;
  gca_devptr_t o0 = (gca_devptr_t)(uintptr_t)out[0], o1 = (gca_devptr_t)(uintptr_t)out[1];
  GCA_CHECK(ops->kernel_fill_u32(o0, b->c, 1, b->words, s));
  GCA_CHECK(ops->kernel_add_u32(o0, o0, (gca_devptr_t)(uintptr_t)in[0], NW, s));
  GCA_CHECK(ops->kernel_fill_u32(o1, b->c + 1, 2, b->words, s));
  return GCA_OK;
}

static gca_graph_fn_t *big_register(gca_graph_tree_t *t, const char *name, big_t *b) {
  static const gca_graph_input_t in[1] = {{GCA_GRAPH_INPUT_COPIED, NW * 4}};
  size_t *outs = malloc(2 * sizeof(size_t));
  assert_non_null(outs);
  outs[0] = outs[1] = b->words * 4;
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = name;
  d.body = big_body;
  d.ctx = b;
  d.ninputs = 1;
  d.inputs = in;
  d.noutputs = 2;
  d.output_bytes = outs;
  gca_graph_fn_t *fn = NULL;
  assert_ok(gca_graph_fn_register(t, &d, &fn));
  free(outs);
  return fn;
}

static void big_expect(gca_graph_tree_t *t, void *const *out, const big_t *b, const uint32_t *x,
                       const char *what) {
  uint32_t *h = malloc(b->words * 4);
  assert_non_null(h);
  dev_read(t, h, out[0], b->words);
  for (uint32_t i = 0; i < b->words; i++) {
    uint32_t e = b->c + i + (i < NW ? x[i] : 0);
    if (h[i] != e)
      fail_msg("%s: out0[%u] = %u, eager gives %u", what, i, h[i], e);
  }
  dev_read(t, h, out[1], b->words);
  for (uint32_t i = 0; i < b->words; i++)
    if (h[i] != b->c + 1 + 2 * i)
      fail_msg("%s: out1[%u] = %u, eager gives %u", what, i, h[i], b->c + 1 + 2 * i);
  free(h);
}

typedef struct scene {
  gca_graph_tree_t *t;
  gca_graph_fn_t *a, *b[2];
  big_t bb[2];
  void *xd, *wd;
  uint32_t x[NW], w[NW];
} scene_t;

/* One step: A, then branch `which` on A's z; checks everything. */
static void scene_step(scene_t *s, int which, bool check_a_after) {
  void *in[2] = {s->xd, s->wd}, *oa[2], *ob[2];
  assert_ok(gca_graph_tree_run(s->t, s->a, in, 2, oa, 2));
  void *inb[1] = {oa[1]};
  assert_ok(gca_graph_tree_run(s->t, s->b[which], inb, 1, ob, 2));
  static uint32_t z[NW];
  dev_read(s->t, z, oa[1], NW);
  big_expect(s->t, ob, &s->bb[which], z, which ? "B'" : "B");
  if (check_a_after)
    std_expect(s->t, oa, s->x, s->w, "A after the branch");
  assert_ok(gca_graph_tree_step(s->t));
  assert_ok(gca__allocator_check());
}

static scene_t *scene_new(void) {
  scene_t *s = calloc(1, sizeof(*s));
  assert_non_null(s);
  assert_ok(gca_graph_tree_create(0, NULL, &s->t));
  s->a = std_register(s->t, "A", NULL);
  s->bb[0] = (big_t){.words = 16 * MiB / 4, .c = 100};
  s->bb[1] = (big_t){.words = 24 * MiB / 4, .c = 900};
  s->b[0] = big_register(s->t, "B", &s->bb[0]);
  s->b[1] = big_register(s->t, "B'", &s->bb[1]);
  s->xd = dev_alloc(NW * 4);
  s->wd = dev_alloc(NW * 4);
  for (uint32_t i = 0; i < NW; i++)
    s->x[i] = i, s->w[i] = 5 * i;
  dev_write(s->xd, s->x, NW);
  dev_write(s->wd, s->w, NW);
  return s;
}

static size_t scene_free(scene_t *s) {
  size_t reserved = tree_stats(s->t).pool_reserved;
  assert_ok(gca_graph_tree_destroy(s->t));
  assert_ok(gca_free(s->xd));
  assert_ok(gca_free(s->wd));
  free(s);
  return reserved;
}

static size_t one_branch(int which) {
  scene_t *s = scene_new();
  for (int i = 0; i < 5; i++)
    scene_step(s, which, true);
  return scene_free(s);
}

static void sibling_branches_share_memory_and_stay_correct(void **state) {
  (void)state;
  assert_ok(gca_set_config("expandable_segments:True"));
  size_t rb = one_branch(0), rb2 = one_branch(1);

  scene_t *s = scene_new();
  for (int i = 0; i < 4; i++) /* A warms, records; B warms, records, replays */
    scene_step(s, 0, true);
  gca_graph_stats_t st = tree_stats(s->t);
  assert_int_equal(st.records, 2);
  for (int i = 0; i < 4; i++) /* B' below the same A, A's outputs checked after it */
    scene_step(s, 1, true);
  st = tree_stats(s->t);
  assert_int_equal(st.records, 3);
  assert_int_equal(st.nodes, 3);
  assert_int_equal(st.rerecords + st.updates + st.eager_fallbacks, 0);
  for (int i = 0; i < 3; i++) { /* back to B: replayed, not recorded again */
    scene_step(s, 0, true);
    scene_step(s, 1, true);
  }
  st = tree_stats(s->t);
  assert_int_equal(st.records, 3);
  assert_int_equal(st.instantiations, 3);
  size_t both = scene_free(s);
  size_t larger = rb > rb2 ? rb : rb2;
  printf("pool bytes: A->B %zu, A->B' %zu, both branches %zu (sum %zu)\n", rb, rb2, both, rb + rb2);
  assert_true(both <= larger + 2 * MiB);
  assert_true(both < rb + rb2 - 2 * MiB);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(sibling_branches_share_memory_and_stay_correct, graph_setup,
                                      graph_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
