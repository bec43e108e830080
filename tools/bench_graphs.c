/* SPDX-License-Identifier: Apache-2.0 */
/* bench_graphs.c - gca-bench-graphs: what the graph-tree layer costs.
 *
 *   replay_overhead_ns     host time of a tree replay (gca_graph_tree_run of a
 *                          recorded function) minus a bare graph launch of the
 *                          same work, medians over --replays interleaved calls
 *                          each (tree_replay_ns and bare_launch_ns: the two)
 *   updates, rerecords,    counters after a scripted run whose static input
 *   eager_fallbacks        moves (same topology, new topology, past the limit)
 *   branch_pool_bytes      pool bytes of a tree with branches A->B and A->B'
 *   sum_of_branches_bytes  pool bytes of A->B alone plus A->B' alone
 *
 * The one idea: every figure comes from the public API; only the bare-launch
 * baseline captures and launches a graph through the device layer's table.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "util.h"

#define WORDS 256u
#define MiB   ((size_t)1 << 20)

/* In a body: returns the failure to the tree, which reports it. */
#define TRY_ST(call)           \
  do {                         \
    gca_status_t st_ = (call); \
    if (st_ != GCA_OK)         \
      return st_;              \
  } while (0)

#define TRY(call)                                                                    \
  do {                                                                               \
    gca_status_t st_ = (call);                                                       \
    if (st_ != GCA_OK) {                                                             \
      fprintf(stderr, "gca-bench-graphs: %s: %s: %s\n", #call, gca_status_name(st_), \
              gca_last_error());                                                     \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, size_t n) {
  qsort(v, n, sizeof(*v), cmp_u64);
  return v[n / 2];
}

/* ---- replay overhead ---- */

static gca_status_t fill_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  (void)in, (void)ctx;
  return gca_kernel_fill_u32(out[0], 1, 1, WORDS, s);
}

/* Medians of the last replay_overhead() run. */
static uint64_t g_tree_ns, g_bare_ns;

static int64_t replay_overhead(size_t n) {
  gca_graph_tree_t *t;
  TRY(gca_graph_tree_create(0, NULL, &t));
  static const size_t outs[1] = {WORDS * 4};
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = "fill";
  d.body = fill_body;
  d.noutputs = 1;
  d.output_bytes = outs;
  gca_graph_fn_t *fn;
  TRY(gca_graph_fn_register(t, &d, &fn));
  gca_stream_t s;
  TRY(gca_graph_tree_stream(t, &s));
  uint64_t *tt = calloc(n, sizeof(uint64_t)), *tb = calloc(n, sizeof(uint64_t));
  if (!tt || !tb)
    exit(1);
  void *out;
  for (int i = 0; i < 3; i++) { /* warm-up, record, a first replay */
    TRY(gca_graph_tree_run(t, fn, NULL, 0, &out, 1));
    TRY(gca_graph_tree_step(t));
  }
  /* The same work as a bare graph on the same stream. */
  void *buf;
  TRY(gca_malloc(&buf, WORDS * 4, s));
  gca_graph_t g;
  gca_graph_exec_t x;
  TRY(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  TRY(gca_kernel_fill_u32(buf, 1, 1, WORDS, s));
  TRY(gca_stream_end_capture(s, &g));
  TRY(gca_graph_instantiate(&x, g));
  /* Interleaved, alternating which goes first, so that both see the same
   * machine (frequency, other load) and the difference is the tree's own. */
  for (size_t i = 0; i < n; i++) {
    for (int k = 0; k < 2; k++) {
      if ((k == 0) == (i % 2 == 0)) {
        uint64_t a = tool_now_ns();
        TRY(gca_graph_tree_run(t, fn, NULL, 0, &out, 1));
        tt[i] = tool_now_ns() - a;
        TRY(gca_graph_tree_step(t));
      } else {
        uint64_t a = tool_now_ns();
        TRY(gca_graph_launch(x, s));
        tb[i] = tool_now_ns() - a;
      }
    }
    if (i % 64 == 63)
      TRY(gca_graph_tree_synchronize(t));
  }
  TRY(gca_stream_synchronize(s));
  TRY(gca_graph_exec_destroy(x));
  TRY(gca_graph_destroy(g));
  TRY(gca_free(buf));
  TRY(gca_graph_tree_destroy(t));
  g_tree_ns = median(tt, n);
  g_bare_ns = median(tb, n);
  int64_t over = (int64_t)g_tree_ns - (int64_t)g_bare_ns;
  free(tt);
  free(tb);
  return over;
}

/* ---- scripted run ---- */

typedef struct script {
  void *w[4]; /* w[1] adds a kernel: moving to or from it changes the topology */
} script_t;

static gca_status_t script_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  script_t *sc = ctx;
  void *o = out[0];
  TRY_ST(gca_kernel_add_u32(o, in[0], in[1], WORDS, s));
  if (in[1] == sc->w[1])
    TRY_ST(gca_kernel_fill_u32(o, 3, 0, 1, s));
  return GCA_OK;
}

static void scripted(gca_graph_stats_t *out) {
  gca_graph_tree_options_t o = GCA_GRAPH_TREE_OPTIONS_INIT;
  o.rerecord_limit = 2;
  gca_graph_tree_t *t;
  TRY(gca_graph_tree_create(0, &o, &t));
  script_t sc;
  void *x;
  TRY(gca_malloc(&x, WORDS * 4, NULL));
  TRY(gca_memset_d32_async(x, 1, WORDS, NULL));
  for (int i = 0; i < 4; i++) {
    TRY(gca_malloc(&sc.w[i], WORDS * 4, NULL));
    TRY(gca_memset_d32_async(sc.w[i], (uint32_t)i, WORDS, NULL));
  }
  TRY(gca_stream_synchronize(NULL));
  static const gca_graph_input_t in[2] = {{GCA_GRAPH_INPUT_COPIED, WORDS * 4},
                                          {GCA_GRAPH_INPUT_STATIC, WORDS * 4}};
  static const size_t outs[1] = {WORDS * 4};
  gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
  d.name = "script";
  d.body = script_body;
  d.ctx = &sc;
  d.ninputs = 2;
  d.inputs = in;
  d.noutputs = 1;
  d.output_bytes = outs;
  gca_graph_fn_t *fn;
  TRY(gca_graph_fn_register(t, &d, &fn));
  /* warm-up, record, replay, update, update, re-record, re-record, eager (limit), eager */
  static const int order[] = {0, 0, 0, 2, 3, 1, 0, 1, 0, 2};
  for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
    void *args[2] = {x, sc.w[order[i]]}, *res;
    TRY(gca_graph_tree_run(t, fn, args, 2, &res, 1));
    TRY(gca_graph_tree_step(t));
  }
  out->size = sizeof(*out);
  TRY(gca_graph_tree_stats(t, out));
  TRY(gca_graph_tree_destroy(t));
  TRY(gca_free(x));
  for (int i = 0; i < 4; i++)
    TRY(gca_free(sc.w[i]));
}

/* ---- branching ---- */

static gca_status_t branch_body(gca_stream_t s, void *const *in, void *const *out, void *ctx) {
  size_t words = *(const size_t *)ctx;
  TRY_ST(gca_kernel_fill_u32(out[0], 5, 1, words, s));
  TRY_ST(gca_kernel_add_u32(out[0], out[0], in[0], WORDS, s));
  return GCA_OK;
}

/* Pool bytes of a tree that runs A then, per step, the branches in `mask`. */
static size_t branch_tree(unsigned mask) {
  gca_graph_tree_t *t;
  TRY(gca_graph_tree_create(0, NULL, &t));
  static size_t words[3] = {WORDS, 32 * MiB / 4, 48 * MiB / 4}; /* A, B, B' */
  static const gca_graph_input_t in[1] = {{GCA_GRAPH_INPUT_STATIC, WORDS * 4}};
  gca_graph_fn_t *fn[3];
  for (int i = 0; i < 3; i++) {
    size_t ob[1] = {words[i] * 4};
    gca_graph_fn_desc_t d = GCA_GRAPH_FN_DESC_INIT;
    d.name = i == 0 ? "A" : i == 1 ? "B" : "B'";
    d.body = branch_body;
    d.ctx = &words[i];
    d.ninputs = 1;
    d.inputs = in;
    d.noutputs = 1;
    d.output_bytes = ob;
    TRY(gca_graph_fn_register(t, &d, &fn[i]));
  }
  void *x;
  TRY(gca_malloc(&x, WORDS * 4, NULL));
  TRY(gca_memset_d32_async(x, 9, WORDS, NULL));
  TRY(gca_stream_synchronize(NULL));
  for (int b = 1; b <= 2; b++) {
    if (!(mask & (1u << b)))
      continue;
    for (int step = 0; step < 4; step++) {
      void *a_in[1] = {x}, *a_out, *b_out;
      TRY(gca_graph_tree_run(t, fn[0], a_in, 1, &a_out, 1));
      void *b_in[1] = {a_out};
      TRY(gca_graph_tree_run(t, fn[b], b_in, 1, &b_out, 1));
      TRY(gca_graph_tree_step(t));
    }
  }
  gca_graph_stats_t s = {.size = sizeof(s)};
  TRY(gca_graph_tree_stats(t, &s));
  TRY(gca_graph_tree_destroy(t));
  TRY(gca_free(x));
  return s.pool_reserved;
}

static void usage(FILE *f) {
  fprintf(f, "usage: gca-bench-graphs [--json] [--replays N]\n"
             "  Host overhead of a graph-tree replay over a bare graph launch, the\n"
             "  update/re-record/eager counts of a scripted run, and the pool bytes of\n"
             "  a branching tree against the sum of its branches.\n"
             "  --json        one JSON object (replay_overhead_ns, updates, rerecords,\n"
             "                eager_fallbacks, branch_pool_bytes, sum_of_branches_bytes)\n"
             "  --replays N   timed calls for each median (default 2000, at least 1000)\n"
             "  --help        this text\n");
}

int main(int argc, char **argv) {
  bool json = false;
  long replays = 2000;
  static const struct option longopts[] = {{"json", no_argument, NULL, 'j'},
                                           {"replays", required_argument, NULL, 'n'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "jn:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'j':
      json = true;
      break;
    case 'n': {
      char *end;
      replays = strtol(optarg, &end, 10);
      if (*end || replays < 1000) {
        fprintf(stderr, "gca-bench-graphs: --replays wants a number >= 1000, not '%s'\n", optarg);
        return 2;
      }
      break;
    }
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return 2;
  }
  TRY(gca_device_init());
  int64_t over = replay_overhead((size_t)replays);
  gca_graph_stats_t s;
  scripted(&s);
  TRY(gca_set_config("expandable_segments:True"));
  size_t rb = branch_tree(1u << 1), rb2 = branch_tree(1u << 2), both = branch_tree(6u);
  if (json) {
    printf("{\"replay_overhead_ns\": %lld, \"tree_replay_ns\": %llu, \"bare_launch_ns\": %llu, "
           "\"updates\": %llu, \"rerecords\": %llu, "
           "\"eager_fallbacks\": %llu, \"branch_pool_bytes\": %zu, "
           "\"sum_of_branches_bytes\": %zu}\n",
           (long long)over, (unsigned long long)g_tree_ns, (unsigned long long)g_bare_ns,
           (unsigned long long)s.updates, (unsigned long long)s.rerecords,
           (unsigned long long)s.eager_fallbacks, both, rb + rb2);
  } else {
    printf("backend %s\n", gca_device_backend_name());
    printf("replay overhead over a bare launch: %lld ns (tree replay %llu ns, bare launch %llu ns, "
           "medians of %ld interleaved calls)\n",
           (long long)over, (unsigned long long)g_tree_ns, (unsigned long long)g_bare_ns, replays);
    printf("scripted run: %llu updates, %llu re-records, %llu eager fallbacks\n",
           (unsigned long long)s.updates, (unsigned long long)s.rerecords,
           (unsigned long long)s.eager_fallbacks);
    printf("pool bytes: branching tree %zu, A->B %zu + A->B' %zu = %zu\n", both, rb, rb2, rb + rb2);
  }
  return 0;
}
