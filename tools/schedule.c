/* SPDX-License-Identifier: Apache-2.0 */
/* schedule.c - gca-schedule: loads an op graph (gca-opgraph/1), schedules it
 * with the overlap scheduler under a memory budget and prints the program
 * order's and the schedule's peak bytes, makespan, exposed communication and
 * collectives hidden, as a table or as JSON (keys under "baseline" and
 * "scheduled", and "scheduled.order").
 *
 * The one idea: every figure comes from the library's estimator, the same
 * code the scheduler optimizes against, and the emitted order is checked
 * against the format's rules before it is printed. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "util.h"

#define EXIT_USAGE 2

static void usage(FILE *f) {
  fprintf(f,
          "usage: gca-schedule GRAPH.json [--budget BYTES | --budget-ratio R]\n"
          "                    [--policy overlap|earliest|prefetch-next|program]\n"
          "                    [--keep-comm-order] [--run [--time-scale S] [--ranks N]] [--json]\n"
          "\n"
          "Schedules an op graph (gca-opgraph/1) so that communication hides behind compute\n"
          "within a memory budget, and compares the result with the program order.\n"
          "\n"
          "  --budget BYTES      peak-bytes budget (e.g. 16GiB)\n"
          "  --budget-ratio R    budget as the program order's peak times 1+R (default 0.03)\n"
          "  --policy P          overlap (default), earliest (every collective as early as\n"
          "                      its inputs allow), prefetch-next (each collective issued\n"
          "                      at its predecessor's wait), program\n"
          "  --keep-comm-order   keep each communicator's collectives in program order\n"
          "  --run               execute the schedule on the device (compute ops and\n"
          "                      collectives as kernels of their duration, one rank) with\n"
          "                      the lifecycle verifier on; report measured against predicted\n"
          "  --time-scale S      multiply durations by S when running (default 1)\n"
          "  --ranks N           run N sim ranks (threads, devices 0..N-1; GCA_SIM_DEVICES\n"
          "                      defaults to N), the collectives moving data through\n"
          "                      <gca/collectives.h>; rank 0's figures are reported\n"
          "  --json              print the report as JSON\n");
}

static void json_figures(const char *key, const gca_schedule_figures_t *f) {
  printf("\"%s\": {\"peak_bytes\": %lld, \"makespan_us\": %.3f, \"exposed_comm_us\": %.3f, "
         "\"collectives_hidden\": %zu, \"collectives_total\": %zu, \"compute_us\": %.3f, "
         "\"comm_us\": %.3f",
         key, (long long)f->peak_bytes, f->makespan_us, f->exposed_comm_us, f->collectives_hidden,
         f->collectives_total, f->compute_us, f->comm_us);
}

static void row(const char *what, const gca_schedule_figures_t *f) {
  char b[32];
  printf("  %-10s %12s %14.1f %14.1f %9zu / %zu\n", what,
         tool_format_size((uint64_t)f->peak_bytes, b, sizeof(b)), f->makespan_us,
         f->exposed_comm_us, f->collectives_hidden, f->collectives_total);
}

typedef struct rank_job {
  const gca_opgraph_t *g;
  const size_t *order;
  size_t n;
  double scale;
  int rank;
  gca_comm_t *comm;
  gca_status_t st;
  char detail[512];
  gca_execute_result_t r;
} rank_job_t;

static void *rank_main(void *arg) {
  rank_job_t *j = arg;
  gca_execute_options_t eo = GCA_EXECUTE_OPTIONS_INIT;
  eo.time_scale = j->scale;
  eo.device = j->rank;
  gca_comm_t *comms[1] = {j->comm};
  eo.comms = j->comm ? comms : NULL;
  j->r.size = sizeof(j->r);
  j->st = gca_opgraph_execute(j->g, j->order, j->n, &eo, &j->r);
  snprintf(j->detail, sizeof(j->detail), "%s", gca_last_error());
  return NULL;
}

/* Runs the order on `ranks` sim ranks (one: collectives modelled by their
 * duration) and gives rank 0's result; every rank must succeed. */
static gca_status_t run_ranks(const gca_opgraph_t *g, const size_t *order, size_t n, double scale,
                              int ranks, gca_execute_result_t *out) {
  rank_job_t jobs[64];
  pthread_t th[64];
  gca_comm_t *comms[64] = {NULL};
  int devs[64];
  gca_status_t st = GCA_OK;
  for (int r = 0; r < ranks; r++)
    devs[r] = r;
  if (ranks > 1 && (st = gca_comm_create_all(ranks, devs, NULL, comms)) != GCA_OK)
    return tool_error_gca(st, "gca-schedule: --ranks %d", ranks);
  int started = 0;
  for (int r = 0; r < ranks; r++) {
    jobs[r] =
        (rank_job_t){.g = g, .order = order, .n = n, .scale = scale, .rank = r, .comm = comms[r]};
    if (pthread_create(&th[r], NULL, rank_main, &jobs[r]) != 0) {
      st = tool_error(GCA_ERR_OUT_OF_MEMORY, "gca-schedule: cannot start rank %d", r);
      break;
    }
    started++;
  }
  for (int r = 0; r < started; r++)
    pthread_join(th[r], NULL);
  for (int r = 0; r < started && st == GCA_OK; r++)
    if (jobs[r].st != GCA_OK)
      st = tool_error(jobs[r].st, "gca-schedule: --run: rank %d: %s", r, jobs[r].detail);
  for (int r = 0; r < ranks; r++)
    if (comms[r])
      gca_comm_destroy(comms[r]);
  if (st == GCA_OK)
    *out = jobs[0].r;
  return st;
}

int main(int argc, char **argv) {
  enum { O_BUDGET = 256, O_RATIO, O_POLICY, O_KEEP, O_JSON, O_RUN, O_SCALE, O_RANKS };
  static const struct option longopts[] = {
      {"budget", required_argument, NULL, O_BUDGET},
      {"budget-ratio", required_argument, NULL, O_RATIO},
      {"policy", required_argument, NULL, O_POLICY},
      {"keep-comm-order", no_argument, NULL, O_KEEP},
      {"json", no_argument, NULL, O_JSON},
      {"run", no_argument, NULL, O_RUN},
      {"time-scale", required_argument, NULL, O_SCALE},
      {"ranks", required_argument, NULL, O_RANKS},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  gca_schedule_options_t so = GCA_SCHEDULE_OPTIONS_INIT;
  bool json = false, have_budget = false, have_ratio = false, do_run = false;
  double scale = 1.0;
  int ranks = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    const char *a = optarg;
    switch (c) {
    case O_BUDGET: {
      uint64_t v;
      if (tool_parse_size(a, &v) != GCA_OK || v == 0 || v > INT64_MAX) {
        fprintf(stderr, "gca-schedule: --budget '%s' is not a size (e.g. 16GiB)\n", a);
        return EXIT_USAGE;
      }
      so.budget_bytes = (int64_t)v;
      have_budget = true;
      break;
    }
    case O_RATIO: {
      char *end;
      errno = 0;
      so.budget_ratio = strtod(a, &end);
      if (errno || *end || !(so.budget_ratio >= 0) || so.budget_ratio > 1e6) {
        fprintf(stderr, "gca-schedule: --budget-ratio '%s' is not a ratio >= 0\n", a);
        return EXIT_USAGE;
      }
      have_ratio = true;
      break;
    }
    case O_POLICY:
      if (strcmp(a, "overlap") == 0)
        so.policy = GCA_SCHEDULE_OVERLAP;
      else if (strcmp(a, "earliest") == 0)
        so.policy = GCA_SCHEDULE_EARLIEST;
      else if (strcmp(a, "prefetch-next") == 0)
        so.policy = GCA_SCHEDULE_PREFETCH_NEXT;
      else if (strcmp(a, "program") == 0)
        so.policy = GCA_SCHEDULE_PROGRAM;
      else {
        fprintf(stderr,
                "gca-schedule: --policy '%s' is not overlap, earliest, prefetch-next "
                "or program\n",
                a);
        return EXIT_USAGE;
      }
      break;
    case O_KEEP:
      so.keep_comm_order = true;
      break;
    case O_JSON:
      json = true;
      break;
    case O_RUN:
      do_run = true;
      break;
    case O_RANKS: {
      char *end;
      long v = strtol(a, &end, 10);
      if (*end || v < 1 || v > 64) {
        fprintf(stderr, "gca-schedule: --ranks '%s' is not 1..64\n", a);
        return EXIT_USAGE;
      }
      ranks = (int)v;
      break;
    }
    case O_SCALE: {
      char *end;
      errno = 0;
      scale = strtod(a, &end);
      if (errno || *end || !(scale > 0) || scale > 1e6) {
        fprintf(stderr, "gca-schedule: --time-scale '%s' is not a positive number\n", a);
        return EXIT_USAGE;
      }
      break;
    }
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return EXIT_USAGE;
    }
  }
  if (optind + 1 != argc || (have_budget && have_ratio)) {
    fprintf(stderr, "gca-schedule: %s\n",
            have_budget && have_ratio ? "--budget and --budget-ratio exclude each other"
                                      : "one graph file is needed");
    usage(stderr);
    return EXIT_USAGE;
  }
  const char *path = argv[optind];
  if (do_run && ranks > 1 && !getenv("GCA_SIM_DEVICES")) {
    char v[16];
    snprintf(v, sizeof(v), "%d", ranks);
    setenv("GCA_SIM_DEVICES", v, 1); /* before the device layer starts */
  }
  char *text = NULL;
  size_t len = 0;
  gca_opgraph_t *g = NULL;
  size_t *order = NULL, *prog = NULL;
  int rc = 1;
  gca_status_t st = tool_read_file(path, &text, &len);
  if (st != GCA_OK)
    st = tool_error_prefix(st, "gca-schedule");
  else if ((st = gca_opgraph_load_json(text, len, &g)) != GCA_OK)
    st = tool_error_gca(st, "gca-schedule: %s", path);
  if (st != GCA_OK)
    goto out;
  size_t n = gca_opgraph_op_count(g);
  order = malloc((n + 1) * sizeof(size_t));
  prog = malloc((n + 1) * sizeof(size_t));
  if (!order || !prog) {
    st = tool_error(GCA_ERR_OUT_OF_MEMORY, "gca-schedule: out of host memory");
    goto out;
  }
  gca_schedule_figures_t base = {.size = sizeof(base)}, sched = {.size = sizeof(sched)};
  TOOL_CHECK_GOTO(gca_opgraph_program_order(g, prog), st, out);
  if ((st = gca_opgraph_estimate(g, prog, n, &base, NULL)) != GCA_OK) {
    st = tool_error_gca(st, "gca-schedule: estimating the program order");
    goto out;
  }
  uint64_t t0 = tool_now_ns();
  if ((st = gca_opgraph_schedule(g, &so, order, n, &sched)) != GCA_OK) {
    st = tool_error_gca(st, "gca-schedule: scheduling");
    goto out;
  }
  double ms = (double)(tool_now_ns() - t0) / 1e6;
  gca_execute_result_t run = {.size = sizeof(run)};
  if (do_run && (st = run_ranks(g, order, n, scale, ranks, &run)) != GCA_OK)
    goto out;
  int64_t budget = so.budget_bytes > 0
                       ? so.budget_bytes
                       : (int64_t)((double)base.peak_bytes * (1.0 + so.budget_ratio));
  if (json) {
    printf("{\"graph\": ");
    tool_json_string(stdout, path);
    printf(", \"ops\": %zu, \"budget_bytes\": %lld, \"schedule_ms\": %.3f,\n ", n,
           (long long)budget, ms);
    json_figures("baseline", &base);
    printf("},\n ");
    json_figures("scheduled", &sched);
    printf(",\n  \"order\": [");
    for (size_t i = 0; i < n; i++) {
      printf(i ? ", " : "");
      tool_json_string(stdout, gca_opgraph_op_name(g, order[i]));
    }
    printf("]}");
    if (do_run)
      printf(",\n \"run\": {\"time_scale\": %g, \"measured_makespan_us\": %.1f, "
             "\"predicted_makespan_us\": %.1f, \"measured_exposed_comm_us\": %.1f, "
             "\"predicted_exposed_comm_us\": %.1f, \"measured_peak_bytes\": %lld, "
             "\"predicted_peak_bytes\": %lld, \"mismatches\": %zu}",
             scale, run.measured_makespan_us, run.predicted.makespan_us,
             run.measured_exposed_comm_us, run.predicted.exposed_comm_us,
             (long long)run.measured_peak_bytes, (long long)run.predicted.peak_bytes,
             run.mismatches);
    printf("}\n");
  } else {
    char b[32];
    printf("gca-schedule: %s: %zu ops, budget %s, scheduled in %.2f ms\n", path, n,
           tool_format_size((uint64_t)budget, b, sizeof(b)), ms);
    printf("  %-10s %12s %14s %14s %15s\n", "order", "peak", "makespan_us", "exposed_us",
           "hidden/total");
    row("program", &base);
    row("scheduled", &sched);
    if (do_run) {
      printf("  run (time scale %g): makespan %.1f us (predicted %.1f), exposed %.1f us "
             "(predicted %.1f), peak %lld bytes (predicted %lld), verifier mismatches %zu\n",
             scale, run.measured_makespan_us, run.predicted.makespan_us,
             run.measured_exposed_comm_us, run.predicted.exposed_comm_us,
             (long long)run.measured_peak_bytes, (long long)run.predicted.peak_bytes,
             run.mismatches);
      if (run.mismatches)
        printf("  first mismatch: step %zu (op '%s'): %s of %s (%llu bytes)\n",
               run.first_mismatch.step, run.first_mismatch.op,
               gca_mismatch_kind_name(run.first_mismatch.kind),
               run.first_mismatch.buffer ? run.first_mismatch.buffer : "an unplanned block",
               (unsigned long long)run.first_mismatch.bytes);
    }
  }
  rc = 0;
out:
  if (st != GCA_OK)
    fprintf(stderr, "%s\n", tool_last_error());
  free(text);
  free(order);
  free(prog);
  gca_opgraph_destroy(g);
  return rc;
}
