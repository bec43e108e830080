/* SPDX-License-Identifier: Apache-2.0 */
/* test_graph_faults.c - failures and misuse. Faults injected (sim) into
 * capture, instantiate, exec-update and launch: the tree falls back as
 * documented (eager run outside the pool, or a re-record when the update
 * call fails), reports the rule and status, the results still match the
 * host reference, the allocator's invariants hold and nothing leaks. A
 * failed capture of a function's new shape falls back the same way and the
 * shape is recorded on its next run. Bad input gets a clear status and
 * message. */
#include "graph_fixture.h"

typedef struct rig {
  gca_graph_tree_t *t;
  decisions_t ds;
  gca_graph_fn_t *fn;
  void *xd, *wd[2];
  uint32_t x[NW], w[2][NW];
} rig_t;

static rig_t *rig_new_with(gca_graph_on_failure_t on_failure) {
  rig_t *r = calloc(1, sizeof(*r));
  assert_non_null(r);
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.on_failure = on_failure;
  o.on_decision = record_decision;
  o.decision_ctx = &r->ds;
  assert_ok(gca_graph_tree_create(0, &o, &r->t));
  r->fn = std_register(r->t, "std", NULL);
  r->xd = dev_alloc(NW * 4);
  for (uint32_t i = 0; i < NW; i++)
    r->x[i] = i ^ 0x5a5a;
  dev_write(r->xd, r->x, NW);
  for (int k = 0; k < 2; k++) {
    r->wd[k] = dev_alloc(NW * 4);
    for (uint32_t i = 0; i < NW; i++)
      r->w[k][i] = (uint32_t)k * 77 + i;
    dev_write(r->wd[k], r->w[k], NW);
  }
  return r;
}

static rig_t *rig_new(void) {
  return rig_new_with(GCA_GRAPH_ON_FAILURE_EAGER);
}

static void rig_step(rig_t *r, int wi) {
  void *in[2] = {r->xd, r->wd[wi]}, *out[2];
  assert_ok(gca_graph_tree_run(r->t, r->fn, in, 2, out, 2));
  std_expect(r->t, out, r->x, r->w[wi], "under faults");
  assert_ok(gca_graph_tree_step(r->t));
  assert_ok(gca__allocator_check());
}

static void rig_free(rig_t *r) {
  assert_ok(gca_graph_tree_destroy(r->t));
  assert_ok(gca_free(r->xd));
  assert_ok(gca_free(r->wd[0]));
  assert_ok(gca_free(r->wd[1]));
  free(r);
}

static const gca_graph_decision_t *last(rig_t *r) {
  assert_true(r->ds.n > 0);
  return &r->ds.d[r->ds.n - 1];
}

/* The record step fails at `op`: an eager run with `rule`; the next step records. */
static void record_fault(const char *spec, gca_graph_rule_t rule, const char *needle) {
  rig_t *r = rig_new();
  rig_step(r, 0); /* warm-up */
  assert_ok(gca_sim_fault_set(spec));
  rig_step(r, 0);
  gca_sim_fault_clear();
  const gca_graph_decision_t *d = last(r);
  assert_int_equal(d->action, GCA_GRAPH_EAGER);
  assert_int_equal(d->rule, rule);
  assert_int_not_equal(d->status, GCA_OK);
  if (!strstr(d->detail, needle))
    fail_msg("decision detail '%s' does not mention '%s'", d->detail, needle);
  gca_graph_stats_t s = tree_stats(r->t);
  assert_int_equal(s.eager_fallbacks, 1);
  assert_int_equal(s.records, 0);
  assert_int_equal(s.pool_allocated, 0); /* the failed capture left nothing in the pool */
  rig_step(r, 0);
  assert_int_equal(tree_stats(r->t).records, 1);
  rig_step(r, 0);
  rig_free(r);
}

static void capture_begin_fault_runs_eagerly(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  record_fault("stream_begin_capture:nth=1", GCA_GRAPH_RULE_CAPTURE_FAILED, "stream_begin_capture");
}

static void capture_end_fault_runs_eagerly(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  record_fault("stream_end_capture:nth=1", GCA_GRAPH_RULE_CAPTURE_FAILED, "stream_end_capture");
}

/* The pool's capture route asks the driver about the capture first. */
static void pool_capture_route_fault_runs_eagerly(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  record_fault("stream_capture_info:nth=1", GCA_GRAPH_RULE_CAPTURE_FAILED, "pool_begin_capture");
}

static void instantiate_fault_runs_eagerly(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  record_fault("graph_instantiate:nth=1", GCA_GRAPH_RULE_INSTANTIATE_FAILED, "graph_instantiate");
}

/* Note [Uploading recordings]: the upload right after instantiation failing
 * drops the new executable graph like a failed instantiation. */
static void upload_fault_runs_eagerly(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  record_fault("graph_upload:nth=1", GCA_GRAPH_RULE_INSTANTIATE_FAILED,
               "uploading the recording of std");
  assert_int_equal(gca_sim_call_count("graph_exec_destroy"),
                   gca_sim_call_count("graph_instantiate"));
}

/* Counting the captured operations is part of the capture. */
static void node_count_fault_runs_eagerly(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  record_fault("graph_node_count:nth=1", GCA_GRAPH_RULE_CAPTURE_FAILED,
               "counting the nodes captured for std");
}

static void exec_update_fault_rerecords(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  rig_t *r = rig_new();
  rig_step(r, 0);
  rig_step(r, 0);
  assert_ok(gca_sim_fault_set("graph_exec_update:nth=1"));
  rig_step(r, 1);
  gca_sim_fault_clear();
  const gca_graph_decision_t *d = last(r);
  assert_int_equal(d->action, GCA_GRAPH_RERECORD);
  assert_int_equal(d->rule, GCA_GRAPH_RULE_STATIC_INPUT_MOVED);
  assert_non_null(strstr(d->detail, "graph_exec_update"));
  gca_graph_stats_t s = tree_stats(r->t);
  assert_int_equal(s.rerecords, 1);
  assert_int_equal(s.updates, 0);
  assert_int_equal(s.instantiations, 2);
  rig_step(r, 1);
  rig_step(r, 0); /* and an update that works */
  assert_int_equal(tree_stats(r->t).updates, 1);
  rig_free(r);
}

static void launch_fault_runs_eagerly(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  rig_t *r = rig_new();
  rig_step(r, 0);
  rig_step(r, 0);
  assert_ok(gca_sim_fault_set("graph_launch:nth=1"));
  rig_step(r, 0);
  gca_sim_fault_clear();
  const gca_graph_decision_t *d = last(r);
  assert_int_equal(d->action, GCA_GRAPH_EAGER);
  assert_int_equal(d->rule, GCA_GRAPH_RULE_LAUNCH_FAILED);
  assert_non_null(strstr(d->detail, "graph_launch"));
  rig_step(r, 0);
  gca_graph_stats_t s = tree_stats(r->t);
  assert_int_equal(s.eager_fallbacks, 1);
  assert_int_equal(s.replays, 2);
  rig_free(r);
}

/* on_failure ERROR: the run that meets the fault fails with its status and a
 * message naming the function, the step and the operation; no decision, no
 * output, nothing left in the pool; the allocator stays valid, and the next
 * run does what the failed one would have done. `warm` runs precede the
 * fault (1: it hits the record, 2: a replay). */
static void error_fault(const char *spec, int warm, const char *step, const char *op) {
  rig_t *r = rig_new_with(GCA_GRAPH_ON_FAILURE_ERROR);
  for (int i = 0; i < warm; i++)
    rig_step(r, 0);
  size_t decisions = r->ds.n;
  gca_graph_stats_t before = tree_stats(r->t);
  void *in[2] = {r->xd, r->wd[0]}, *out[2] = {NULL, NULL};
  assert_ok(gca_sim_fault_set(spec));
  gca_status_t st = gca_graph_tree_run(r->t, r->fn, in, 2, out, 2);
  gca_sim_fault_clear();
  assert_int_equal(st, GCA_ERR_DRIVER);
  const char *msg = gca_last_error();
  char want[96];
  snprintf(want, sizeof(want), "graph_tree_run: std: %s", step);
  if (!strstr(msg, want) || !strstr(msg, op) || !strstr(msg, "injected fault"))
    fail_msg("error '%s' does not name '%s' and '%s'", msg, want, op);
  assert_null(out[0]);
  assert_null(out[1]);
  assert_int_equal(r->ds.n, decisions);
  gca_graph_stats_t s = tree_stats(r->t);
  assert_int_equal(s.failures, 1);
  assert_int_equal(s.eager_fallbacks, 0);
  assert_int_equal(s.records, before.records);
  assert_int_equal(s.replays, before.replays);
  assert_int_equal(s.pool_allocated, before.pool_allocated);
  assert_ok(gca__allocator_check());
  /* The same run again, fault gone: a record (or a replay of the recording). */
  rig_step(r, 0);
  s = tree_stats(r->t);
  assert_int_equal(s.records, 1);
  assert_int_equal(s.replays, before.replays + 1);
  rig_step(r, 0);
  assert_int_equal(tree_stats(r->t).eager_fallbacks, 0);
  rig_free(r);
}

static void capture_fault_fails_the_run_when_told(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  error_fault("stream_begin_capture:nth=1", 1, "capture failed", "stream_begin_capture");
  error_fault("stream_end_capture:nth=1", 1, "capture failed", "stream_end_capture");
}

static void instantiate_fault_fails_the_run_when_told(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  error_fault("graph_instantiate:nth=1", 1, "instantiate failed", "graph_instantiate");
  /* every executable graph made was destroyed (the faulted call made none) */
  assert_int_equal(gca_sim_call_count("graph_exec_destroy"),
                   gca_sim_call_count("graph_instantiate") - 1);
  error_fault("graph_upload:nth=1", 1, "instantiate failed", "uploading the recording of std");
}

static void launch_fault_fails_the_run_when_told(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  error_fault("graph_launch:nth=1", 2, "launch failed", "graph_launch");
}

/* The standard function at a second shape: outputs of twice the words (the
 * body writes the first NW of each, std_expect checks those). */
static const size_t wide_in[2] = {NW * 4, NW * 4}, wide_out[2] = {2 * NW * 4, 2 * NW * 4};

static void rig_step_wide(rig_t *r, int wi) {
  void *in[2] = {r->xd, r->wd[wi]}, *out[2];
  assert_ok(gca_graph_tree_run_shape(r->t, r->fn, wide_in, wide_out, in, 2, out, 2));
  std_expect(r->t, out, r->x, r->w[wi], "at the wide shape");
  assert_ok(gca_graph_tree_step(r->t));
  assert_ok(gca__allocator_check());
}

static void capture_fault_at_a_new_shape_runs_eagerly(void **state) {
  (void)state;
  if (!on_sim)
    skip();
  rig_t *r = rig_new();
  rig_step(r, 0); /* warm-up, record, replay at the registered shape */
  rig_step(r, 0);
  rig_step(r, 0);
  size_t before = r->ds.n;
  assert_ok(gca_sim_fault_set("stream_begin_capture:nth=1"));
  rig_step_wide(r, 0);
  gca_sim_fault_clear();
  assert_int_equal(r->ds.n, before + 1);
  const gca_graph_decision_t *d = last(r);
  assert_int_equal(d->action, GCA_GRAPH_EAGER);
  assert_int_equal(d->rule, GCA_GRAPH_RULE_CAPTURE_FAILED);
  assert_int_not_equal(d->status, GCA_OK);
  if (!strstr(d->detail, "stream_begin_capture"))
    fail_msg("decision detail '%s' does not mention stream_begin_capture", d->detail);
  gca_graph_stats_t s = tree_stats(r->t);
  assert_int_equal(s.eager_fallbacks, 1);
  assert_int_equal(s.rerecords + s.shape_rerecords, 0);
  assert_int_equal(s.shapes, 1); /* the wide shape is not known yet */
  assert_int_equal(s.nodes, 1);
  rig_step(r, 0); /* the registered shape still replays */
  assert_int_equal(r->ds.n, before + 1);
  rig_step_wide(r, 0); /* the wide shape's re-record, now that capture works */
  d = last(r);
  assert_int_equal(d->action, GCA_GRAPH_RERECORD);
  assert_int_equal(d->rule, GCA_GRAPH_RULE_SHAPE_CHANGED);
  assert_int_equal(d->arg, -1); /* only output bytes differ */
  assert_string_equal(d->detail, "std: shape changed: output 0 4096 -> 8192 bytes");
  rig_step_wide(r, 0);
  rig_step(r, 0);
  s = tree_stats(r->t);
  assert_int_equal(r->ds.n, before + 2);
  assert_int_equal(s.shape_rerecords, 1);
  assert_int_equal(s.shapes, 2);
  assert_int_equal(s.nodes, 2);
  assert_int_equal(s.eager_fallbacks, 1);
  rig_free(r);
}

/* gca_graph_tree_run_shape refuses what cannot be a shape, with the tree as
 * it was: it still runs, and nothing leaks. */
static void bad_shapes_are_refused_and_the_tree_goes_on(void **state) {
  (void)state;
  rig_t *r = rig_new();
  rig_step(r, 0);
  void *in[2] = {r->xd, r->wd[0]}, *out[2] = {NULL, NULL};
  const size_t zero_out[2] = {NW * 4, 0};
  assert_status(gca_graph_tree_run_shape(r->t, r->fn, NULL, wide_out, in, 2, out, 2),
                GCA_ERR_INVALID_ARGUMENT,
                "graph_tree_run_shape: std: input_bytes is NULL (the bytes of each of its 2 "
                "inputs)");
  assert_status(gca_graph_tree_run_shape(r->t, r->fn, wide_in, NULL, in, 2, out, 2),
                GCA_ERR_INVALID_ARGUMENT, "std: output_bytes is NULL");
  assert_status(gca_graph_tree_run_shape(r->t, r->fn, wide_in, zero_out, in, 2, out, 2),
                GCA_ERR_INVALID_ARGUMENT, "graph_tree_run_shape: std output 1 has 0 bytes");
  assert_status(gca_graph_tree_run_shape(r->t, r->fn, wide_in, wide_out, in, 1, out, 2),
                GCA_ERR_INVALID_ARGUMENT, "std takes 2 inputs and 2 outputs, called with 1 and 2");
  assert_status(gca_graph_tree_run_shape(r->t, r->fn, wide_in, wide_out, in, 2, out, 3),
                GCA_ERR_INVALID_ARGUMENT, "called with 2 and 3");
  assert_status(gca_graph_tree_run_shape(r->t, NULL, wide_in, wide_out, in, 2, out, 2),
                GCA_ERR_INVALID_ARGUMENT, "graph_tree_run_shape: fn is NULL");
  assert_status(gca_graph_tree_run_shape(NULL, r->fn, wide_in, wide_out, in, 2, out, 2),
                GCA_ERR_INVALID_ARGUMENT, "graph_tree_run_shape: tree is NULL");
  void *null_in[2] = {NULL, r->wd[0]};
  assert_status(gca_graph_tree_run_shape(r->t, r->fn, wide_in, wide_out, null_in, 2, out, 2),
                GCA_ERR_INVALID_ARGUMENT, "graph_tree_run_shape: std input 0 is NULL");
  assert_null(out[0]);
  assert_null(out[1]);
  gca_graph_stats_t s = tree_stats(r->t);
  assert_int_equal(s.generation, 1);
  assert_int_equal(s.warmups, 1);
  assert_int_equal(s.records + s.rerecords + s.eager_fallbacks, 0);
  assert_int_equal(s.shapes, 1);
  assert_int_equal(r->ds.n, 1);
  rig_step(r, 0); /* record */
  rig_step(r, 0);
  rig_step_wide(r, 0);
  assert_int_equal(tree_stats(r->t).shape_rerecords, 1);
  rig_free(r);
}

static unsigned body_runs;
static gca_status_t counted_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  (void)ctx;
  body_runs++;
  return std_body(s, in, out, NULL);
}

/* Nine outputs, output i filled with 100 + i (the first NW words). */
static gca_status_t fill_nine(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  (void)in;
  (void)ctx;
  for (uint32_t i = 0; i < 9; i++)
    GCA_CHECK(ops->kernel_fill_u32((gca_devptr_t)(uintptr_t)out[i], 100 + i, 0, NW, s));
  return GCA_OK;
}

static void expect_nine(gca_graph_tree_t *t, void *const *outs) {
  static uint32_t got[NW];
  for (uint32_t i = 0; i < 9; i++) {
    dev_read(t, got, outs[i], NW);
    for (uint32_t w = 0; w < NW; w++)
      if (got[w] != 100 + i)
        fail_msg("output %u word %u: %u, wanted %u", i, w, got[w], 100 + i);
  }
}

/* Note [Host fail points]: every host allocation of the tree that can fail
 * is forced to. A failure before any work is issued fails the run with
 * GCA_ERR_OUT_OF_MEMORY and a message naming what it was for, and nothing
 * ran; one while recording is a failed recording (an eager run, rule
 * CAPTURE_FAILED). Either way the tree goes on: the next runs warm up,
 * record and replay with correct results, the allocator's invariants hold
 * and the teardown finds no leak. */
static void host_memory_failures_are_clear_and_leave_the_tree_sound(void **state) {
  (void)state;
  /* a node: the first run fails before anything ran */
  rig_t *r = rig_new();
  void *in[2] = {r->xd, r->wd[0]}, *out[2] = {NULL, NULL};
  assert_ok(gca__failpoint_arm("graph_node", 1));
  assert_status(gca_graph_tree_run(r->t, r->fn, in, 2, out, 2), GCA_ERR_OUT_OF_MEMORY,
                "no host memory for a node of std");
  gca__failpoint_clear();
  assert_null(out[0]);
  assert_int_equal(r->ds.n, 0);
  assert_int_equal(tree_stats(r->t).warmups, 0);
  rig_step(r, 0);
  rig_step(r, 0);
  rig_step(r, 0);
  gca_graph_stats_t s = tree_stats(r->t);
  assert_int_equal(s.warmups, 1);
  assert_int_equal(s.records, 1);
  assert_int_equal(s.replays, 2);
  rig_free(r);

  /* the live-output table: the body never runs, and the failed run was no
   * warm-up (the next one is) */
  gca_graph_tree_t *t = NULL;
  decisions_t ds = {0};
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.on_decision = record_decision;
  o.decision_ctx = &ds;
  assert_ok(gca_graph_tree_create(0, &o, &t));
  gca_graph_fn_t *fn = std_register(t, "counted", counted_body);
  void *xd = dev_alloc(NW * 4), *wd = dev_alloc(NW * 4);
  uint32_t x[NW], w[NW];
  for (uint32_t i = 0; i < NW; i++) {
    x[i] = 3 * i + 1;
    w[i] = i ^ 0x77;
  }
  dev_write(xd, x, NW);
  dev_write(wd, w, NW);
  void *in2[2] = {xd, wd}, *out2[2] = {NULL, NULL};
  body_runs = 0;
  assert_ok(gca__failpoint_arm("graph_outputs", 1));
  assert_status(gca_graph_tree_run(t, fn, in2, 2, out2, 2), GCA_ERR_OUT_OF_MEMORY,
                "no host memory to track");
  gca__failpoint_clear();
  assert_int_equal(body_runs, 0);
  assert_null(out2[0]);
  assert_int_equal(ds.n, 0);
  assert_int_equal(tree_stats(t).warmups, 0);
  static const gca_graph_action_t want[] = {GCA_GRAPH_WARMUP, GCA_GRAPH_RECORD};
  for (int k = 0; k < 3; k++) {
    assert_ok(gca_graph_tree_run(t, fn, in2, 2, out2, 2));
    std_expect(t, out2, x, w, "after a failed output table");
    assert_ok(gca_graph_tree_step(t));
    if (k < 2)
      assert_int_equal(ds.d[ds.n - 1].action, want[k]);
  }
  assert_int_equal(ds.n, 2); /* the replay is not reported */
  assert_int_equal(body_runs, 2);
  assert_ok(gca_graph_tree_destroy(t));
  assert_ok(gca_free(xd));
  assert_ok(gca_free(wd));

  /* the live-output table when a recording is launched: a function of nine
   * outputs, recorded, then recorded at once at a second shape in the same
   * step (no warm-up: Note on shapes), whose launch is the first run to need
   * more than the 16 entries warm-up and record made; it runs eagerly, rule
   * LAUNCH_FAILED, and its outputs are right */
  {
    ds.n = 0;
    o.on_decision = record_decision;
    o.decision_ctx = &ds;
    assert_ok(gca_graph_tree_create(0, &o, &t));
    size_t nine[9], nine_wide[9];
    for (int i = 0; i < 9; i++) {
      nine[i] = NW * 4;
      nine_wide[i] = 2 * NW * 4;
    }
    gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
    d.name = "nine";
    d.body = fill_nine;
    d.noutputs = 9;
    d.output_bytes = nine;
    gca_graph_fn_t *f9 = NULL;
    assert_ok(gca_graph_fn_register(t, &d, &f9));
    void *o9[9];
    for (int k = 0; k < 2; k++) { /* warm-up, record */
      assert_ok(gca_graph_tree_run(t, f9, NULL, 0, o9, 9));
      expect_nine(t, o9);
      assert_ok(gca_graph_tree_step(t));
    }
    assert_ok(gca_graph_tree_run(t, f9, NULL, 0, o9, 9)); /* a replay: 9 entries */
    assert_ok(gca__failpoint_arm("graph_outputs", 1));
    assert_ok(gca_graph_tree_run_shape(t, f9, NULL, nine_wide, NULL, 0, o9, 9));
    gca__failpoint_clear();
    const gca_graph_decision_t *dd = &ds.d[ds.n - 1];
    assert_int_equal(dd->action, GCA_GRAPH_EAGER);
    assert_int_equal(dd->rule, GCA_GRAPH_RULE_LAUNCH_FAILED);
    assert_int_equal(dd->status, GCA_ERR_OUT_OF_MEMORY);
    if (!strstr(dd->detail, "no host memory to track"))
      fail_msg("decision detail '%s'", dd->detail);
    expect_nine(t, o9);
    assert_ok(gca_graph_tree_step(t));
    assert_ok(gca__allocator_check());
    assert_ok(gca_graph_tree_destroy(t));
  }

  /* the capture's and the liveness record's: a failed recording */
  static const struct {
    const char *point, *needle;
  } rec[] = {{"graph_capture", "no host memory to record std"},
             {"graph_liveness", "no host memory to record std"}};
  for (size_t i = 0; i < sizeof(rec) / sizeof(rec[0]); i++) {
    r = rig_new();
    rig_step(r, 0); /* warm-up */
    assert_ok(gca__failpoint_arm(rec[i].point, 1));
    rig_step(r, 0);
    gca__failpoint_clear();
    const gca_graph_decision_t *d = last(r);
    assert_int_equal(d->action, GCA_GRAPH_EAGER);
    assert_int_equal(d->rule, GCA_GRAPH_RULE_CAPTURE_FAILED);
    assert_int_equal(d->status, GCA_ERR_OUT_OF_MEMORY);
    if (!strstr(d->detail, rec[i].needle))
      fail_msg("%s: decision detail '%s' does not say '%s'", rec[i].point, d->detail,
               rec[i].needle);
    rig_step(r, 0);
    rig_step(r, 0);
    s = tree_stats(r->t);
    assert_int_equal(s.records, 1);
    assert_int_equal(s.eager_fallbacks, 1);
    rig_free(r);
  }

  /* a new shape: refused before anything ran; the shape works afterwards */
  r = rig_new();
  rig_step(r, 0);
  assert_ok(gca__failpoint_arm("graph_shape", 1));
  void *in3[2] = {r->xd, r->wd[0]}, *out3[2] = {NULL, NULL};
  assert_status(gca_graph_tree_run_shape(r->t, r->fn, wide_in, wide_out, in3, 2, out3, 2),
                GCA_ERR_OUT_OF_MEMORY, "no host memory for a shape of std");
  gca__failpoint_clear();
  assert_null(out3[0]);
  rig_step_wide(r, 0);
  rig_step_wide(r, 0);
  assert_int_equal(tree_stats(r->t).shapes, 2);
  rig_free(r);
}

static void bad_input_is_a_clear_status(void **state) {
  (void)state;
  gca_graph_tree_t *t, *other;
  assert_ok(gca_graph_tree_create(0, NULL, &t));
  assert_ok(gca_graph_tree_create(0, NULL, &other));
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = "nobody";
  gca_graph_fn_t *fn = NULL;
  assert_status(gca_graph_fn_register(t, &d, &fn), GCA_ERR_INVALID_ARGUMENT,
                "nobody has a NULL body");
  assert_null(fn);
  gca_graph_fn_t *f = std_register(t, "std", NULL), *g = std_register(other, "theirs", NULL);
  void *xd = dev_alloc(NW * 4), *wd = dev_alloc(NW * 4);
  void *in[2] = {xd, wd}, *out[2];
  assert_status(gca_graph_tree_run(t, f, in, 1, out, 2), GCA_ERR_INVALID_ARGUMENT,
                "std takes 2 inputs and 2 outputs, called with 1 and 2");
  assert_status(gca_graph_tree_run(t, g, in, 2, out, 2), GCA_ERR_INVALID_ARGUMENT,
                "function theirs belongs to tree");
  assert_status(gca_graph_tree_run(t, NULL, in, 2, out, 2), GCA_ERR_INVALID_ARGUMENT, "fn is NULL");
  assert_status(gca_graph_tree_release(t, xd), GCA_ERR_INVALID_POINTER, "is not a live output");
  assert_status(gca_graph_tree_run(NULL, f, in, 2, out, 2), GCA_ERR_INVALID_ARGUMENT,
                "tree is NULL");
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.size = 3;
  gca_graph_tree_t *bad = NULL;
  assert_status(gca_graph_tree_create(0, &o, &bad), GCA_ERR_INVALID_ARGUMENT, "options size");
  assert_status(gca_graph_tree_create(99, NULL, &bad), GCA_ERR_INVALID_ARGUMENT, "device 99");
  o = (gca_graph_tree_options_t)GCA_GRAPH_TREE_OPTIONS_INIT;
  o.on_failure = (gca_graph_on_failure_t)7;
  assert_status(gca_graph_tree_create(0, &o, &bad), GCA_ERR_INVALID_ARGUMENT, "on_failure 7");
  assert_null(bad);
  assert_ok(gca_graph_tree_run(t, f, in, 2, out, 2));
  assert_ok(gca_graph_tree_destroy(t));
  assert_status(gca_graph_tree_run(t, f, in, 2, out, 2), GCA_ERR_INVALID_HANDLE,
                "is not a live graph tree");
  assert_status(gca_graph_tree_step(t), GCA_ERR_INVALID_HANDLE, "graph_tree_step");
  assert_status(gca_graph_tree_destroy(t), GCA_ERR_INVALID_HANDLE, "graph_tree_destroy");
  assert_ok(gca_graph_tree_destroy(other));
  assert_ok(gca_free(xd));
  assert_ok(gca_free(wd));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(capture_begin_fault_runs_eagerly, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(capture_end_fault_runs_eagerly, graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(pool_capture_route_fault_runs_eagerly, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(instantiate_fault_runs_eagerly, graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(upload_fault_runs_eagerly, graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(node_count_fault_runs_eagerly, graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(exec_update_fault_rerecords, graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(launch_fault_runs_eagerly, graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(capture_fault_fails_the_run_when_told, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(instantiate_fault_fails_the_run_when_told, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(launch_fault_fails_the_run_when_told, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(capture_fault_at_a_new_shape_runs_eagerly, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(bad_shapes_are_refused_and_the_tree_goes_on, graph_setup,
                                      graph_teardown),
      cmocka_unit_test_setup_teardown(host_memory_failures_are_clear_and_leave_the_tree_sound,
                                      graph_setup, graph_teardown),
      cmocka_unit_test_setup_teardown(bad_input_is_a_clear_status, graph_setup, graph_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
