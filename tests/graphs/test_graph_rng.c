/* SPDX-License-Identifier: Apache-2.0 */
/* test_graph_rng.c - graph-safe RNG: Philox4x32-10 gives the published
 * Random123 known answers (block function and the device kernel); N replays
 * of a recording that draws from two generators give bit for bit what N eager
 * steps give (an all-eager tree with the same seeds, and the host reference);
 * a recording without RNG makes no prologue write, one with RNG two per
 * generator per replay. */
#include "graph_fixture.h"
#include "philox.h"

static void philox_matches_the_random123_known_answers(void **state) {
  (void)state;
  static const struct {
    uint32_t ctr[4], key[2], out[4];
  } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (size_t k = 0; k < GCA_ARRAY_SIZE(kat); k++) {
    uint32_t out[4];
    gca__philox4x32_10(kat[k].ctr, kat[k].key, out);
    assert_memory_equal(out, kat[k].out, sizeof(out));
  }
  /* The kernel: counter {0,0,0,0} under key {0,0} is seed 0, offset 0. */
  uint64_t *scal = dev_alloc(16);
  uint32_t *dst = dev_alloc(64 * 4);
  uint32_t zero[4] = {0, 0, 0, 0};
  dev_write(scal, zero, 4);
  assert_ok(ops->kernel_philox_u32((gca_devptr_t)(uintptr_t)dst, 4, (gca_devptr_t)(uintptr_t)scal,
                                   (gca_devptr_t)(uintptr_t)(scal + 1), 0, NULL));
  uint32_t h[64];
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)h, (gca_devptr_t)(uintptr_t)dst, 16, NULL));
  assert_ok(ops->stream_synchronize(NULL));
  assert_memory_equal(h, kat[0].out, 16);
  /* And any seed/offset: the kernel equals the host reference (odd count). */
  uint32_t sv[4] = {0xa4093822, 0x299f31d0, 40, 0}; /* seed, device offset 40 */
  dev_write(scal, sv, 4);
  assert_ok(ops->kernel_philox_u32((gca_devptr_t)(uintptr_t)dst, 63, (gca_devptr_t)(uintptr_t)scal,
                                   (gca_devptr_t)(uintptr_t)(scal + 1), 8, NULL));
  memset(h, 0, sizeof(h));
  assert_ok(
      ops->memcpy_async((gca_devptr_t)(uintptr_t)h, (gca_devptr_t)(uintptr_t)dst, 63 * 4, NULL));
  assert_ok(ops->stream_synchronize(NULL));
  uint32_t want[63];
  gca__philox_fill(want, 63, 0x299f31d0a4093822ull, 48);
  assert_memory_equal(h, want, sizeof(want));
  assert_ok(gca_free(scal));
  assert_ok(gca_free(dst));
}

/* Draws: out0 = fwd(10) then fwd(5) at out0 + 10 words; out1 = bwd(7). */
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

static gca_graph_fn_t *rng_register(gca_graph_tree_t *t, gens_t *g) {
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = "rng";
  d.body = rng_body;
  d.ctx = g;
  d.noutputs = 2;
  d.output_bytes = rng_outs;
  gca_graph_fn_t *fn = NULL;
  assert_ok(gca_graph_fn_register(t, &d, &fn));
  return fn;
}

static void replays_draw_bit_for_bit_what_eager_steps_draw(void **state) {
  (void)state;
  gca_graph_tree_t *tg, *te;
  gca_graph_tree_options_t eager = GCA_GRAPH_TREE_OPTIONS_INIT;
  eager.warmup_runs = 1000000; /* never records */
  assert_ok(gca_graph_tree_create(0, NULL, &tg));
  assert_ok(gca_graph_tree_create(0, &eager, &te));
  gens_t gg, ge;
  assert_ok(gca_graph_rng_create(tg, 1234, &gg.fwd));
  assert_ok(gca_graph_rng_create(tg, 98765, &gg.bwd));
  assert_ok(gca_graph_rng_create(te, 1234, &ge.fwd));
  assert_ok(gca_graph_rng_create(te, 98765, &ge.bwd));
  gca_graph_fn_t *fg = rng_register(tg, &gg), *fe = rng_register(te, &ge);
  uint64_t fwd_off = 0, bwd_off = 0;
  enum { STEPS = 20 };
  for (int k = 0; k < STEPS; k++) {
    void *og[2], *oe[2];
    assert_ok(gca_graph_tree_run(tg, fg, NULL, 0, og, 2));
    assert_ok(gca_graph_tree_run(te, fe, NULL, 0, oe, 2));
    uint32_t a0[15], a1[7], b0[15], b1[7], r0[15], r1[7];
    dev_read(tg, a0, og[0], 15);
    dev_read(tg, a1, og[1], 7);
    dev_read(te, b0, oe[0], 15);
    dev_read(te, b1, oe[1], 7);
    gca__philox_fill(r0, 10, 1234, fwd_off);
    gca__philox_fill(r0 + 10, 5, 1234, fwd_off + 12);
    gca__philox_fill(r1, 7, 98765, bwd_off);
    fwd_off += 12 + 8;
    bwd_off += 8;
    if (memcmp(a0, b0, sizeof(a0)) || memcmp(a1, b1, sizeof(a1)))
      fail_msg("step %d: the replay's draws differ from the eager step's", k);
    if (memcmp(a0, r0, sizeof(a0)) || memcmp(a1, r1, sizeof(a1)))
      fail_msg("step %d: draws differ from the host reference", k);
    assert_ok(gca_graph_tree_step(tg));
    assert_ok(gca_graph_tree_step(te));
  }
  uint64_t seed, off;
  assert_ok(gca_graph_rng_get_state(gg.fwd, &seed, &off));
  assert_int_equal(off, fwd_off);
  assert_ok(gca_graph_rng_get_state(gg.bwd, &seed, &off));
  assert_int_equal(off, bwd_off);
  gca_graph_stats_t s = tree_stats(tg);
  assert_int_equal(s.records, 1);
  assert_int_equal(s.replays, STEPS - 1);
  assert_int_equal(tree_stats(te).records, 0);
  assert_ok(gca_graph_tree_destroy(tg));
  assert_ok(gca_graph_tree_destroy(te));
}

static void a_recording_without_rng_makes_no_prologue_write(void **state) {
  (void)state;
  gca_graph_tree_t *t;
  assert_ok(gca_graph_tree_create(0, NULL, &t));
  gens_t g;
  assert_ok(gca_graph_rng_create(t, 5, &g.fwd));
  assert_ok(gca_graph_rng_create(t, 6, &g.bwd));
  gca_graph_fn_t *plain = std_register(t, "plain", NULL), *rng = rng_register(t, &g);
  void *xd = dev_alloc(NW * 4), *wd = dev_alloc(NW * 4);
  void *in[2] = {xd, wd}, *out[2];
  for (int k = 0; k < 3; k++) { /* warm-up, record, replay */
    assert_ok(gca_graph_tree_run(t, plain, in, 2, out, 2));
    assert_ok(gca_graph_tree_step(t));
  }
  gca_sim_counters_reset();
  uint64_t writes = tree_stats(t).prologue_writes;
  for (int k = 0; k < 10; k++) {
    assert_ok(gca_graph_tree_run(t, plain, in, 2, out, 2));
    assert_ok(gca_graph_tree_step(t));
  }
  assert_int_equal(tree_stats(t).prologue_writes, writes);
  if (on_sim) {
    assert_int_equal(gca_sim_call_count("memset_d32_async"), 0);
    assert_int_equal(gca_sim_call_count("graph_launch"), 10);
  }
  for (int k = 0; k < 3; k++) {
    assert_ok(gca_graph_tree_run(t, rng, NULL, 0, out, 2));
    assert_ok(gca_graph_tree_step(t));
  }
  gca_sim_counters_reset();
  writes = tree_stats(t).prologue_writes;
  for (int k = 0; k < 10; k++) {
    assert_ok(gca_graph_tree_run(t, rng, NULL, 0, out, 2));
    assert_ok(gca_graph_tree_step(t));
  }
  assert_int_equal(tree_stats(t).prologue_writes, writes + 10 * 2 * 2);
  if (on_sim)
    assert_int_equal(gca_sim_call_count("memset_d32_async"), 10 * 2 * 2);
  assert_ok(gca_graph_tree_destroy(t));
  assert_ok(gca_free(xd));
  assert_ok(gca_free(wd));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(philox_matches_the_random123_known_answers, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(replays_draw_bit_for_bit_what_eager_steps_draw, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(a_recording_without_rng_makes_no_prologue_write, graph_setup,
                                      graph_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
