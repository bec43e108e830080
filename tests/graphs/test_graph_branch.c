/* SPDX-License-Identifier: Apache-2.0 */
/* test_graph_branch.c - branching: A->B recorded, then A->B' recorded as a
 * sibling of B (the pool restored to A's checkpoint first). A's outputs stay
 * intact while B' records and replays, B still replays correctly afterwards,
 * and the pool of the branching tree holds about the larger branch, not the
 * sum: within one segment's slack of the larger single-branch tree. Uses
 * expandable segments, whose restore gives back the space a branch mapped.
 * The same holds when B' is B run at another shape (gca_graph_tree_run_shape):
 * the new shape is recorded at once as a re-record of its own branch, and
 * going back and forth between shapes replays each one's recording. */
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
  bool shaped; /* B' is B at the shape of bb[1] (b[1] == b[0], whose ctx is cur) */
  big_t cur;
  void *xd, *wd;
  uint32_t x[NW], w[NW];
} scene_t;

/* One step: A, then branch `which` on A's z; checks everything. */
static void scene_step(scene_t *s, int which, bool check_a_after) {
  void *in[2] = {s->xd, s->wd}, *oa[2], *ob[2];
  assert_ok(gca_graph_tree_run(s->t, s->a, in, 2, oa, 2));
  void *inb[1] = {oa[1]};
  if (s->shaped) {
    s->cur = s->bb[which];
    size_t inbytes = NW * 4, outbytes[2] = {s->cur.words * 4, s->cur.words * 4};
    assert_ok(gca_graph_tree_run_shape(s->t, s->b[which], &inbytes, outbytes, inb, 1, ob, 2));
  } else {
    assert_ok(gca_graph_tree_run(s->t, s->b[which], inb, 1, ob, 2));
  }
  static uint32_t z[NW];
  dev_read(s->t, z, oa[1], NW);
  big_expect(s->t, ob, &s->bb[which], z, which ? "B'" : "B");
  if (check_a_after)
    std_expect(s->t, oa, s->x, s->w, "A after the branch");
  assert_ok(gca_graph_tree_step(s->t));
  assert_ok(gca__allocator_check());
}

static scene_t *scene_new(bool shaped) {
  scene_t *s = calloc(1, sizeof(*s));
  assert_non_null(s);
  assert_ok(gca_graph_tree_create(0, NULL, &s->t));
  s->a = std_register(s->t, "A", NULL);
  s->bb[0] = (big_t){.words = 16 * MiB / 4, .c = 100};
  s->bb[1] = (big_t){.words = 24 * MiB / 4, .c = 900};
  s->shaped = shaped;
  if (shaped) {
    s->cur = s->bb[0];
    s->b[0] = s->b[1] = big_register(s->t, "B", &s->cur);
  } else {
    s->b[0] = big_register(s->t, "B", &s->bb[0]);
    s->b[1] = big_register(s->t, "B'", &s->bb[1]);
  }
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
  scene_t *s = scene_new(false);
  for (int i = 0; i < 5; i++)
    scene_step(s, which, true);
  return scene_free(s);
}

static void sibling_branches_share_memory_and_stay_correct(void **state) {
  (void)state;
  assert_ok(gca_set_config("expandable_segments:True"));
  size_t rb = one_branch(0), rb2 = one_branch(1);

  scene_t *s = scene_new(false);
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

/* B' is B at another shape: the same layout sharing, the new shape recorded
 * at once below A (a re-record for the shape, no warm-up). */
static void shape_branches_share_memory_and_stay_correct(void **state) {
  (void)state;
  assert_ok(gca_set_config("expandable_segments:True"));
  size_t rb = one_branch(0), rb2 = one_branch(1);

  scene_t *s = scene_new(true);
  for (int i = 0; i < 4; i++)
    scene_step(s, 0, true);
  for (int i = 0; i < 4; i++) /* B at the second shape below the same A */
    scene_step(s, 1, true);
  gca_graph_stats_t st = tree_stats(s->t);
  assert_int_equal(st.warmups, 3); /* A; B eagerly in A's warm-up step; B */
  assert_int_equal(st.records, 2);
  assert_int_equal(st.rerecords, 1);
  assert_int_equal(st.shape_rerecords, 1);
  assert_int_equal(st.shapes, 3);
  assert_int_equal(st.nodes, 3);
  assert_int_equal(st.updates + st.eager_fallbacks, 0);
  for (int i = 0; i < 3; i++) { /* back and forth: replays only */
    scene_step(s, 0, true);
    scene_step(s, 1, true);
  }
  st = tree_stats(s->t);
  assert_int_equal(st.records + st.rerecords, 3);
  assert_int_equal(st.instantiations, 3);
  size_t both = scene_free(s);
  size_t larger = rb > rb2 ? rb : rb2;
  printf("pool bytes: A->B %zu, A->B' %zu, B at both shapes %zu (sum %zu)\n", rb, rb2, both,
         rb + rb2);
  assert_true(both <= larger + 2 * MiB);
  assert_true(both < rb + rb2 - 2 * MiB);
}

/* y = fill(c, 1) + x over the run's words, z = fill(c + 1, 3) over half of them. */
typedef struct sized {
  size_t words;
  uint32_t c;
} sized_t;

static gca_status_t sized_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  const sized_t *z = ctx;
  gca_devptr_t y = (gca_devptr_t)(uintptr_t)out[0];
  GCA_CHECK(ops->kernel_fill_u32(y, z->c, 1, z->words, s));
  GCA_CHECK(ops->kernel_add_u32(y, y, (gca_devptr_t)(uintptr_t)in[0], z->words, s));
  return ops->kernel_fill_u32((gca_devptr_t)(uintptr_t)out[1], z->c + 1, 3, z->words / 2, s);
}

/* One step at `words`: runs the function at that shape (x copied in, a fresh
 * pattern each step) and checks both outputs word by word. */
static void sized_step(gca_graph_tree_t *t, gca_graph_fn_t *fn, sized_t *ctx, void *xd,
                       size_t words, uint32_t k) {
  uint32_t *x = malloc(words * 4), *h = malloc(words * 4);
  assert_non_null(x);
  assert_non_null(h);
  for (uint32_t i = 0; i < words; i++)
    x[i] = i * 3u + k * 1000u;
  dev_write(xd, x, words);
  ctx->words = words;
  size_t ib = words * 4, ob[2] = {words * 4, words * 2};
  void *in[1] = {xd}, *out[2];
  assert_ok(gca_graph_tree_run_shape(t, fn, &ib, ob, in, 1, out, 2));
  dev_read(t, h, out[0], words);
  for (uint32_t i = 0; i < words; i++)
    if (h[i] != ctx->c + i + x[i])
      fail_msg("step %u (%zu words): y[%u] = %u, eager gives %u", k, words, i, h[i],
               ctx->c + i + x[i]);
  dev_read(t, h, out[1], words / 2);
  for (uint32_t i = 0; i < words / 2; i++)
    if (h[i] != ctx->c + 1 + 3 * i)
      fail_msg("step %u (%zu words): z[%u] = %u, eager gives %u", k, words, i, h[i],
               ctx->c + 1 + 3 * i);
  free(x);
  free(h);
  assert_ok(gca_graph_tree_step(t));
  assert_ok(gca__allocator_check());
}

/* S1 twice (warm-up, record), S2 (a re-record for the shape), then back and
 * forth: each shape replays its own recording. rerecord_limit 0: shape
 * changes are no invalidations and never push the function to eager runs. */
static void each_shape_records_once_then_replays(void **state) {
  (void)state;
  decisions_t ds = {0};
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.rerecord_limit = 0;
  o.on_decision = record_decision;
  o.decision_ctx = &ds;
  gca_graph_tree_t *t;
  assert_ok(gca_graph_tree_create(0, &o, &t));
  static const gca_graph_input_t in[1] = {{GCA_GRAPH_INPUT_COPIED, NW * 4}};
  static const size_t outs[2] = {NW * 4, NW * 2};
  sized_t ctx = {.words = NW, .c = 40};
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = "sized";
  d.body = sized_body;
  d.ctx = &ctx;
  d.ninputs = 1;
  d.inputs = in;
  d.noutputs = 2;
  d.output_bytes = outs;
  gca_graph_fn_t *fn = NULL;
  assert_ok(gca_graph_fn_register(t, &d, &fn));
  void *xd = dev_alloc(4 * NW * 4);
  const size_t s1 = NW, s2 = 2 * NW, s3 = 4 * NW;
  const size_t seq[] = {s1, s1, s2, s2, s1, s2, s1, s3, s2, s3};
  for (uint32_t k = 0; k < GCA_ARRAY_SIZE(seq); k++)
    sized_step(t, fn, &ctx, xd, seq[k], k);

  /* reported: warm-up, record, the two shape changes; replays are silent */
  assert_int_equal(ds.n, 4);
  assert_int_equal(ds.d[0].action, GCA_GRAPH_WARMUP);
  assert_int_equal(ds.d[1].action, GCA_GRAPH_RECORD);
  for (int i = 2; i < 4; i++) {
    assert_int_equal(ds.d[i].action, GCA_GRAPH_RERECORD);
    assert_int_equal(ds.d[i].rule, GCA_GRAPH_RULE_SHAPE_CHANGED);
    assert_int_equal(ds.d[i].arg, 0);
    assert_false(ds.d[i].limit_reached);
    assert_int_equal(ds.d[i].status, GCA_OK);
    assert_string_equal(ds.d[i].function, "sized");
  }
  assert_string_equal(ds.d[2].detail, "sized: shape changed: input 0 4096 -> 8192 bytes");
  /* the change is from the shape the function last ran at (S1, then S2) */
  assert_string_equal(ds.d[3].detail, "sized: shape changed: input 0 4096 -> 16384 bytes");

  gca_graph_stats_t st = tree_stats(t);
  assert_int_equal(st.warmups, 1);
  assert_int_equal(st.records, 1);
  assert_int_equal(st.rerecords, 2);
  assert_int_equal(st.shape_rerecords, 2);
  assert_int_equal(st.shapes, 3);
  assert_int_equal(st.nodes, 3);
  assert_int_equal(st.instantiations, 3);
  assert_int_equal(st.replays, GCA_ARRAY_SIZE(seq) - 1);
  assert_int_equal(st.updates + st.eager_fallbacks, 0);
  assert_ok(gca_graph_tree_destroy(t));
  assert_ok(gca_free(xd));
}

/* A new shape right after the first warm-up: recorded at once; the first
 * shape then records (its node warmed up already) and both replay. The
 * registered sizes through gca_graph_tree_run are the same shape as through
 * gca_graph_tree_run_shape. */
static void a_shape_change_after_the_warm_up_needs_no_second_one(void **state) {
  (void)state;
  decisions_t ds = {0};
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.on_decision = record_decision;
  o.decision_ctx = &ds;
  gca_graph_tree_t *t;
  assert_ok(gca_graph_tree_create(0, &o, &t));
  static const gca_graph_input_t in[1] = {{GCA_GRAPH_INPUT_COPIED, NW * 4}};
  static const size_t outs[2] = {NW * 4, NW * 2};
  sized_t ctx = {.words = NW, .c = 3};
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = "sized";
  d.body = sized_body;
  d.ctx = &ctx;
  d.ninputs = 1;
  d.inputs = in;
  d.noutputs = 2;
  d.output_bytes = outs;
  gca_graph_fn_t *fn = NULL;
  assert_ok(gca_graph_fn_register(t, &d, &fn));
  void *xd = dev_alloc(NW * 4);
  sized_step(t, fn, &ctx, xd, NW, 0);     /* warm-up */
  sized_step(t, fn, &ctx, xd, NW / 2, 1); /* re-record for the shape */
  sized_step(t, fn, &ctx, xd, NW, 2);     /* record */
  sized_step(t, fn, &ctx, xd, NW / 2, 3); /* replays */
  ctx.words = NW;
  void *inp[1] = {xd}, *out[2];
  assert_ok(gca_graph_tree_run(t, fn, inp, 1, out, 2));
  assert_ok(gca_graph_tree_step(t));
  const gca_graph_action_t want[] = {GCA_GRAPH_WARMUP, GCA_GRAPH_RERECORD, GCA_GRAPH_RECORD};
  assert_int_equal(ds.n, GCA_ARRAY_SIZE(want));
  for (size_t i = 0; i < ds.n; i++)
    assert_int_equal(ds.d[i].action, want[i]);
  assert_int_equal(ds.d[1].rule, GCA_GRAPH_RULE_SHAPE_CHANGED);
  assert_string_equal(ds.d[1].detail, "sized: shape changed: input 0 4096 -> 2048 bytes");
  gca_graph_stats_t st = tree_stats(t);
  assert_int_equal(st.warmups, 1);
  assert_int_equal(st.shapes, 2);
  assert_int_equal(st.replays, 4);
  assert_int_equal(st.nodes, 2);
  assert_ok(gca_graph_tree_destroy(t));
  assert_ok(gca_free(xd));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(sibling_branches_share_memory_and_stay_correct, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(shape_branches_share_memory_and_stay_correct, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(each_shape_records_once_then_replays, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(a_shape_change_after_the_warm_up_needs_no_second_one,
                                      graph_setup, graph_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
