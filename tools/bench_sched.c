/* SPDX-License-Identifier: Apache-2.0 */
/* bench_sched.c - gca-bench-sched: the overlap scheduler against the program
 * order, "every collective as early as possible" and "prefetch the next
 * layer" on FSDP step graphs of a 32-layer, 8B-parameter-like model, in two
 * shapes (activations dominate memory; one layer's gathered parameters are a
 * large share of it), at budgets of +1%, +3% and +10% over the program
 * order's peak; and the time to schedule a graph of about 10,000 ops.
 *
 * The one idea: every figure is the library's own estimate of the emitted
 * order (gca_opgraph_estimate), printed next to the baselines computed in
 * the same run. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp_gen.h"
#include "util.h"

typedef struct result {
  const char *policy;
  double ratio; /* budget ratio, or -1 */
  gca_schedule_figures_t f;
  double ms;
} result_t;

/* The share of communication time hidden (0 when the compute stream stalled
 * for all of it; rounding never shows a negative share). */
static double hidden_share(const gca_schedule_figures_t *f) {
  if (f->comm_us <= 0)
    return 1.0;
  double h = 1.0 - f->exposed_comm_us / f->comm_us;
  return h < 0 ? 0 : h;
}

static gca_status_t run(const gca_opgraph_t *g, gca_schedule_policy_t pol, double ratio,
                        result_t *r) {
  size_t n = gca_opgraph_op_count(g);
  size_t *order = malloc((n + 1) * sizeof(size_t));
  if (!order)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "gca-bench-sched: out of host memory");
  gca_schedule_options_t o = GCA_SCHEDULE_OPTIONS_INIT;
  o.policy = pol;
  o.budget_ratio = ratio < 0 ? 0 : ratio;
  r->f.size = sizeof(r->f);
  uint64_t t0 = tool_now_ns();
  gca_status_t st = gca_opgraph_schedule(g, &o, order, n, &r->f);
  r->ms = (double)(tool_now_ns() - t0) / 1e6;
  if (st == GCA_OK) /* the figures again, through the checked public path */
    st = gca_opgraph_estimate(g, order, n, &r->f, NULL);
  free(order);
  r->ratio = ratio;
  return st == GCA_OK ? GCA_OK : tool_error_gca(st, "gca-bench-sched: scheduling");
}

static void print_shape(const char *name, const fsdp_shape_t *s, const result_t *rs, size_t nr,
                        bool json, bool first) {
  const gca_schedule_figures_t *base = &rs[0].f;
  if (json) {
    printf("%s\n  \"%s\": {\"layers\": %d, \"ops\": %d, \"comm_us\": %.1f, \"rows\": [",
           first ? "" : ",", name, s->layers, 15 * s->layers + 1, base->comm_us);
    for (size_t i = 0; i < nr; i++) {
      const gca_schedule_figures_t *f = &rs[i].f;
      printf("%s\n    {\"policy\": \"%s\", \"budget_ratio\": %.2f, \"peak_bytes\": %lld, "
             "\"peak_vs_program\": %.4f, \"exposed_comm_us\": %.1f, \"hidden_fraction\": %.4f, "
             "\"collectives_hidden\": %zu, \"collectives_total\": %zu, \"makespan_us\": %.1f, "
             "\"schedule_ms\": %.3f}",
             i ? "," : "", rs[i].policy, rs[i].ratio, (long long)f->peak_bytes,
             (double)f->peak_bytes / (double)base->peak_bytes, f->exposed_comm_us, hidden_share(f),
             f->collectives_hidden, f->collectives_total, f->makespan_us, rs[i].ms);
    }
    printf("]}");
    return;
  }
  char b[32];
  printf("\n%s: %d layers, %d ops, communication %.1f ms, program peak %s\n", name, s->layers,
         15 * s->layers + 1, base->comm_us / 1e3,
         tool_format_size((uint64_t)base->peak_bytes, b, sizeof(b)));
  printf("  %-24s %10s %12s %10s %12s %12s %10s\n", "order", "peak", "peak/prog", "hidden",
         "colls hidden", "makespan ms", "sched ms");
  for (size_t i = 0; i < nr; i++) {
    const gca_schedule_figures_t *f = &rs[i].f;
    char label[40];
    if (rs[i].ratio >= 0)
      snprintf(label, sizeof(label), "%s +%.0f%%", rs[i].policy, rs[i].ratio * 100);
    else
      snprintf(label, sizeof(label), "%s", rs[i].policy);
    printf("  %-24s %10s %12.4f %9.1f%% %6zu / %-5zu %12.2f %10.2f\n", label,
           tool_format_size((uint64_t)f->peak_bytes, b, sizeof(b)),
           (double)f->peak_bytes / (double)base->peak_bytes, 100.0 * hidden_share(f),
           f->collectives_hidden, f->collectives_total, f->makespan_us / 1e3, rs[i].ms);
  }
}

static gca_status_t bench_shape(const char *name, const fsdp_shape_t *s, bool json, bool first) {
  gca_opgraph_t *g = NULL;
  gca_status_t st = fsdp_graph(s, &g);
  if (st != GCA_OK)
    return tool_error_gca(st, "gca-bench-sched: building the %s graph", name);
  result_t rs[6] = {{.policy = "program"}, {.policy = "earliest"}, {.policy = "prefetch-next"},
                    {.policy = "overlap"}, {.policy = "overlap"},  {.policy = "overlap"}};
  const gca_schedule_policy_t pols[6] = {GCA_SCHEDULE_PROGRAM,       GCA_SCHEDULE_EARLIEST,
                                         GCA_SCHEDULE_PREFETCH_NEXT, GCA_SCHEDULE_OVERLAP,
                                         GCA_SCHEDULE_OVERLAP,       GCA_SCHEDULE_OVERLAP};
  const double ratios[6] = {-1, -1, -1, 0.01, 0.03, 0.10};
  for (size_t i = 0; i < 6 && st == GCA_OK; i++)
    st = run(g, pols[i], ratios[i], &rs[i]);
  if (st == GCA_OK)
    print_shape(name, s, rs, 6, json, first);
  gca_opgraph_destroy(g);
  return st;
}

int main(int argc, char **argv) {
  int layers = 32;
  bool json = false;
  static const struct option longopts[] = {{"layers", required_argument, NULL, 'l'},
                                           {"json", no_argument, NULL, 'j'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    if (c == 'l') {
      layers = atoi(optarg);
      if (layers < 1 || layers > 100000) {
        fprintf(stderr, "gca-bench-sched: --layers '%s' is not 1..100000\n", optarg);
        return 2;
      }
    } else if (c == 'j') {
      json = true;
    } else {
      fprintf(c == 'h' ? stdout : stderr, "usage: gca-bench-sched [--layers N] [--json]\n");
      return c == 'h' ? 0 : 2;
    }
  }
  /* 8B parameters over 32 layers in bf16: 500 MB gathered per layer, 8 ranks,
   * 100 GB/s collectives. Activation-dominated: 8k tokens (10 ms of forward
   * compute per layer, 1 GB of saved activations). Parameter-dominated: 4k
   * tokens (5 ms, 256 MB saved: one gathered layer is 6% of the peak). */
  fsdp_shape_t act = {.layers = layers,
                      .ranks = 8,
                      .param_bytes = 500ll << 20,
                      .x_bytes = 64ll << 20,
                      .act_saved_bytes = 1024ll << 20,
                      .act_temp_bytes = 256ll << 20,
                      .fwd_us = 10000,
                      .bw_bytes_per_us = 100e3,
                      .lat_us = 20};
  fsdp_shape_t par = act;
  par.x_bytes = 32ll << 20;
  par.act_saved_bytes = 256ll << 20;
  par.act_temp_bytes = 128ll << 20;
  par.fwd_us = 5000;
  fsdp_shape_t big = act;
  big.layers = 667; /* 10,006 ops */
  if (json)
    printf("{");
  gca_status_t st = bench_shape("activation_dominated", &act, json, true);
  if (st == GCA_OK)
    st = bench_shape("parameter_dominated", &par, json, false);
  if (st == GCA_OK)
    st = bench_shape("ten_thousand_ops", &big, json, false);
  if (json)
    printf("\n}\n");
  if (st != GCA_OK) {
    fprintf(stderr, "%s\n", tool_last_error());
    return 1;
  }
  return 0;
}
