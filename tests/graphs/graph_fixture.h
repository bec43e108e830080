/* SPDX-License-Identifier: Apache-2.0 */
/* graph_fixture.h - what the graph-tree tests share: a fresh allocator per
 * test on the backend under test (sim by default, cuda for the gpu suite),
 * faults cleared and counters zeroed; after the test the allocator's
 * invariants are checked and nothing may be left allocated. Helpers move data
 * between host and device through the device table (so they work on both
 * backends) and a small multi-kernel function with its host reference. */
#ifndef GCA_TEST_GRAPH_FIXTURE_H
#define GCA_TEST_GRAPH_FIXTURE_H

#include "support.h"

#include "gca.h"

#define NW 1024u /* words per buffer in the standard function */

static const gca_device_ops_t *ops __attribute__((unused));
static bool on_sim __attribute__((unused));

__attribute__((unused)) static int graph_setup(void **state) {
  (void)state;
  ops = test_backend();
  on_sim = strcmp(ops->name, "sim") == 0;
  gca__allocator_reset();
  gca_sim_fault_clear();
  gca_sim_counters_reset();
  return 0;
}

/* Nothing of the allocator's is live and its structures are sound. */
__attribute__((unused)) static void expect_nothing_leaked(void) {
  assert_ok(gca__allocator_check());
  gca_stats_t s;
  assert_ok(gca_get_stats(0, &s));
  if (s.allocated_bytes[GCA_STAT_ALL].current != 0)
    fail_msg("%lld bytes still allocated", (long long)s.allocated_bytes[GCA_STAT_ALL].current);
}

__attribute__((unused)) static int graph_teardown(void **state) {
  (void)state;
  gca_sim_fault_clear();
  expect_nothing_leaked();
  gca__allocator_reset();
  if (on_sim)
    assert_int_equal(gca_sim_used_bytes(0), 0);
  return 0;
}

/* A device buffer outside any pool. */
__attribute__((unused)) static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  assert_ok(gca_malloc(&p, bytes, NULL));
  return p;
}

/* Copies device memory to the host after the tree's work (and NULL-stream work) finished. */
__attribute__((unused)) static void dev_read(gca_graph_tree_t *t, uint32_t *host, const void *src,
                                             size_t words) {
  gca_stream_t s;
  assert_ok(gca_graph_tree_stream(t, &s));
  assert_ok(ops->stream_synchronize(NULL));
  assert_ok(
      ops->memcpy_async((gca_devptr_t)(uintptr_t)host, (gca_devptr_t)(uintptr_t)src, words * 4, s));
  assert_ok(ops->stream_synchronize(s));
}

__attribute__((unused)) static void dev_write(void *dst, const uint32_t *host, size_t words) {
  assert_ok(ops->memcpy_async((gca_devptr_t)(uintptr_t)dst, (gca_devptr_t)(uintptr_t)host,
                              words * 4, NULL));
  assert_ok(ops->stream_synchronize(NULL));
}

/* The standard function: inputs x (copied), w (static); outputs y, z:
 *   tmp = x + w;  y = fill(7, 1) + tmp;  z = y + x   (tmp a temporary)
 * Four kernels over NW words, one temporary from the pool. */
static gca_status_t std_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  (void)ctx;
  gca_devptr_t x = (gca_devptr_t)(uintptr_t)in[0], w = (gca_devptr_t)(uintptr_t)in[1];
  gca_devptr_t y = (gca_devptr_t)(uintptr_t)out[0], z = (gca_devptr_t)(uintptr_t)out[1];
  void *tmp = NULL;
  GCA_CHECK(gca_malloc(&tmp, NW * 4, s));
  gca_devptr_t tp = (gca_devptr_t)(uintptr_t)tmp;
  gca_status_t st = ops->kernel_add_u32(tp, x, w, NW, s);
  if (st == GCA_OK)
    st = ops->kernel_fill_u32(y, 7, 1, NW, s);
  if (st == GCA_OK)
    st = ops->kernel_add_u32(y, y, tp, NW, s);
  if (st == GCA_OK)
    st = ops->kernel_add_u32(z, y, x, NW, s);
  gca_status_t st2 = gca_free(tmp);
  return st != GCA_OK ? st : st2;
}

static const gca_graph_input_t std_inputs[2] = {{GCA_GRAPH_INPUT_COPIED, NW * 4},
                                                {GCA_GRAPH_INPUT_STATIC, NW * 4}};
static const size_t std_outputs[2] = {NW * 4, NW * 4};

/* A function of the standard shape (two inputs, two NW-word outputs) whose
 * body (std_body when NULL) gets `ctx`. */
__attribute__((unused)) static gca_graph_fn_t *
std_register_ctx(gca_graph_tree_t *t, const char *name, gca_graph_body_t body, void *ctx) {
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = name;
  d.body = body ? body : std_body;
  d.ctx = ctx;
  d.ninputs = 2;
  d.inputs = std_inputs;
  d.noutputs = 2;
  d.output_bytes = std_outputs;
  gca_graph_fn_t *fn = NULL;
  assert_ok(gca_graph_fn_register(t, &d, &fn));
  return fn;
}

__attribute__((unused)) static gca_graph_fn_t *std_register(gca_graph_tree_t *t, const char *name,
                                                            gca_graph_body_t body) {
  return std_register_ctx(t, name, body, NULL);
}

/* Checks y and z of the standard function against the host reference, word by word. */
__attribute__((unused)) static void std_expect(gca_graph_tree_t *t, void *const *outs,
                                               const uint32_t *x, const uint32_t *w,
                                               const char *what) {
  static uint32_t y[NW], z[NW];
  dev_read(t, y, outs[0], NW);
  dev_read(t, z, outs[1], NW);
  for (uint32_t i = 0; i < NW; i++) {
    uint32_t ey = 7 + i + x[i] + w[i];
    if (y[i] != ey)
      fail_msg("%s: y[%u] = %u, eager gives %u", what, i, y[i], ey);
    if (z[i] != ey + x[i])
      fail_msg("%s: z[%u] = %u, eager gives %u", what, i, z[i], ey + x[i]);
  }
}

__attribute__((unused)) static gca_graph_stats_t tree_stats(gca_graph_tree_t *t) {
  gca_graph_stats_t s;
  memset(&s, 0, sizeof(s));
  s.size = sizeof(s);
  assert_ok(gca_graph_tree_stats(t, &s));
  return s;
}

/* Decisions seen by the on_decision callback. */
typedef struct decisions {
  size_t n;
  gca_graph_decision_t d[64];
  char detail[64][320];
} decisions_t;

__attribute__((unused)) static void record_decision(const gca_graph_decision_t *d, void *ctx) {
  decisions_t *ds = ctx;
  if (ds->n < 64) {
    ds->d[ds->n] = *d;
    snprintf(ds->detail[ds->n], sizeof(ds->detail[0]), "%s", d->detail);
    ds->d[ds->n].detail = ds->detail[ds->n];
    ds->n++;
  }
}

#endif
