/* SPDX-License-Identifier: Apache-2.0 */
/* gca-train - one FSDP-style training step of a small transformer-shaped
 * model, repeated, on several ranks, through every layer of gca at once: the
 * allocator with expandable segments, the pinned host allocator, collectives,
 * the overlap scheduler under a memory budget, the lifecycle verifier and a
 * graph tree (train_run.h, train_model.h).
 *
 * --mode all (the default) trains three times — eager in program order, the
 * scheduled plan eagerly, the scheduled plan in a graph tree — and checks
 * that the losses and the parameters are bit for bit the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peer_jemalloc.h"
#include "train_run.h"
#include "util.h"

static void usage(FILE *f) {
  fprintf(f, "usage: gca-train [--mode all|eager|scheduled|graph] [--ranks N] [--processes]\n"
             "                 [--steps K] [--layers L] [--batch B] [--hidden H] [--ffn F]\n"
             "                 [--seed S] [--change STEP:BATCH] [--time-scale X]\n"
             "                 [--budget-ratio R] [--fault SPEC@STEP] [--timeout SECONDS]\n"
             "                 [--capture-fallback] [--json] [--snapshot FILE] [--quiet]\n"
             "Trains on sim ranks (threads, or processes with --processes), or on the GPUs\n"
             "of the cuda backend, a thread rank per device (--ranks defaults to 4, or to\n"
             "the devices there are when fewer); on the sim the\n"
             "clock is virtual unless GCA_SIM_CLOCK says otherwise, so times are the cost\n"
             "model's. --change 5:16 runs steps from 5 on with a batch of 16 rows (the\n"
             "step at a new shape: a re-record of its own branch of the graph tree, then\n"
             "replays); --fault arms a sim fault (GCA_SIM_FAULTS syntax) at a step. A\n"
             "failed capture, instantiation or launch of the step's graph ends the run\n"
             "with the error; --capture-fallback runs that step eagerly instead.\n");
}

static const char *mode_name(train_mode_t m) {
  return m == TRAIN_EAGER ? "eager" : m == TRAIN_SCHEDULED ? "scheduled" : "graph";
}

static bool parse_int(const char *t, long lo, long hi, long *out) {
  char *end = NULL;
  long v = strtol(t, &end, 10);
  if (!t[0] || *end || v < lo || v > hi)
    return false;
  *out = v;
  return true;
}

static bool parse_double(const char *t, double *out) {
  char *end = NULL;
  double v = strtod(t, &end);
  if (!t[0] || *end)
    return false;
  *out = v;
  return true;
}

/* The integer options: name and bounds; set_int_option stores them. */
static const struct {
  const char *name;
  long lo, hi;
} int_opts[] = {{"--ranks", 1, 8},         {"--steps", 1, 100000}, {"--layers", 1, 64},
                {"--batch", 1, 4096},      {"--hidden", 1, 4096},  {"--ffn", 1, 16384},
                {"--seed", 0, 0x7fffffffL}};

static int int_option(const char *arg) {
  for (size_t i = 0; i < sizeof(int_opts) / sizeof(int_opts[0]); i++)
    if (strcmp(arg, int_opts[i].name) == 0)
      return (int)i;
  return -1;
}

static void set_int_option(train_cfg_t *c, int i, long v) {
  switch (i) {
  case 0:
    c->shape.ranks = (int)v;
    break;
  case 1:
    c->steps = (int)v;
    break;
  case 2:
    c->shape.layers = (int)v;
    break;
  case 3:
    c->shape.batch = (uint32_t)v;
    break;
  case 4:
    c->shape.hidden = (uint32_t)v;
    break;
  case 5:
    c->shape.ffn = (uint32_t)v;
    break;
  default:
    c->seed = (uint64_t)v;
    break;
  }
}

typedef struct opts {
  train_cfg_t cfg;
  bool all, json, quiet, ranks_given;
  char fault[256];
} opts_t;

static int parse(int argc, char **argv, opts_t *o) {
  train_cfg_default(&o->cfg);
  o->all = true;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long n = 0;
    double d = 0;
    int io;
    bool val = true;
#define NEED_VALUE()                                       \
  do {                                                     \
    if (!v) {                                              \
      fprintf(stderr, "gca-train: %s needs a value\n", a); \
      return 2;                                            \
    }                                                      \
    i++;                                                   \
  } while (0)
#define BAD()                                                          \
  do {                                                                 \
    fprintf(stderr, "gca-train: %s: bad value '%s'\n", a, v ? v : ""); \
    return 2;                                                          \
  } while (0)
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 1;
    } else if (strcmp(a, "--processes") == 0) {
      o->cfg.processes = true;
    } else if (strcmp(a, "--capture-fallback") == 0) {
      o->cfg.capture_fallback = true;
    } else if (strcmp(a, "--json") == 0) {
      o->json = true;
    } else if (strcmp(a, "--quiet") == 0) {
      o->quiet = true;
    } else if (strcmp(a, "--mode") == 0) {
      NEED_VALUE();
      o->all = strcmp(v, "all") == 0;
      if (strcmp(v, "eager") == 0)
        o->cfg.mode = TRAIN_EAGER;
      else if (strcmp(v, "scheduled") == 0)
        o->cfg.mode = TRAIN_SCHEDULED;
      else if (strcmp(v, "graph") == 0)
        o->cfg.mode = TRAIN_GRAPH;
      else if (!o->all)
        BAD();
    } else if ((io = int_option(a)) >= 0) {
      NEED_VALUE();
      val = parse_int(v, int_opts[io].lo, int_opts[io].hi, &n);
      o->ranks_given |= io == 0;
      set_int_option(&o->cfg, io, n);
    } else if (strcmp(a, "--change") == 0) {
      NEED_VALUE();
      unsigned s = 0, b = 0;
      char extra;
      val = sscanf(v, "%u:%u%c", &s, &b, &extra) == 2 && s > 0 && b > 0 && b <= 4096;
      o->cfg.change_step = (int)s;
      o->cfg.change_batch = b;
    } else if (strcmp(a, "--time-scale") == 0) {
      NEED_VALUE();
      val = parse_double(v, &d) && d >= 0;
      o->cfg.time_scale = d;
    } else if (strcmp(a, "--budget-ratio") == 0) {
      NEED_VALUE();
      val = parse_double(v, &d) && d >= 0;
      o->cfg.budget_ratio = d;
    } else if (strcmp(a, "--timeout") == 0) {
      NEED_VALUE();
      val = parse_double(v, &d) && d > 0;
      o->cfg.timeout_s = d;
    } else if (strcmp(a, "--snapshot") == 0) {
      NEED_VALUE();
      o->cfg.snapshot_path = v;
    } else if (strcmp(a, "--fault") == 0) {
      NEED_VALUE();
      const char *at = strrchr(v, '@');
      val =
          at && at != v && (size_t)(at - v) < sizeof(o->fault) && parse_int(at + 1, 0, 100000, &n);
      if (val) {
        memcpy(o->fault, v, (size_t)(at - v));
        o->fault[at - v] = 0;
        o->cfg.fault = o->fault;
        o->cfg.fault_step = (int)n;
      }
    } else {
      fprintf(stderr, "gca-train: unknown argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
    if (!val)
      BAD();
  }
  o->cfg.progress = !o->quiet && !o->json && isatty(STDERR_FILENO);
  return 0;
}

static void print_steps(const opts_t *o, const train_cfg_t *c, const train_results_t *r) {
  char a[32], b[32];
  printf("%s: %d ranks (%s), %d layers, batch %u, hidden %u, ffn %u\n", mode_name(c->mode),
         c->shape.ranks, c->processes ? "processes" : "threads", c->shape.layers, c->shape.batch,
         c->shape.hidden, c->shape.ffn);
  printf("  %4s %12s %12s %11s %12s %12s %-9s %10s %5s %12s\n", "step", "time (us)", "exposed (us)",
         "host (us)", "peak rsvd", "peak live", "graph", "mismatches", "regs", "loss (rank 0)");
  const train_rank_result_t *r0 = &r->rank[0];
  for (int k = 0; k < r0->steps_done; k++) {
    const train_step_rec_t *s = &r0->steps[k];
    size_t mm = 0;
    for (int i = 0; i < r->ranks; i++)
      mm += k < r->rank[i].steps_done ? r->rank[i].steps[k].mismatches : 0;
    printf("  %4d %12.1f %12.1f %11.1f %12s %12s %-9s %10zu %5llu %12.7f\n", k, s->step_us,
           s->exposed_us, s->host_us, tool_format_size(s->peak_reserved, a, sizeof(a)),
           tool_format_size(s->peak_live, b, sizeof(b)), train_decision_name(s->decision), mm,
           (unsigned long long)s->registrations, (double)s->loss);
  }
  for (int i = 0; i < r->ranks; i++) /* why a step ran eagerly, re-recorded or updated */
    for (int k = 0; k < r->rank[i].steps_done; k++)
      if (r->rank[i].steps[k].why[0])
        printf("  rank %d step %d: %s: %s\n", i, k,
               train_decision_name(r->rank[i].steps[k].decision), r->rank[i].steps[k].why);
  (void)o;
}

/* Mean over the ranks and steps [from, to) of a step field. */
static double mean_of(const train_results_t *r, int from, int to, size_t off) {
  double sum = 0;
  int n = 0;
  for (int i = 0; i < r->ranks; i++)
    for (int k = from; k < to && k < r->rank[i].steps_done; k++, n++)
      sum += *(const double *)((const char *)&r->rank[i].steps[k] + off);
  return n ? sum / n : 0;
}

static void print_summary(const train_cfg_t *c, const train_results_t *r) {
  int K = r->rank[0].steps_done, from = K > 2 ? 2 : 0;
  if (K == 0)
    return;
  char a[32], b[32], bb[32], bd[32];
  uint64_t pr = 0, pl = 0;
  size_t mm = 0;
  for (int i = 0; i < r->ranks; i++)
    for (int k = 0; k < r->rank[i].steps_done; k++) {
      const train_step_rec_t *s = &r->rank[i].steps[k];
      pr = s->peak_reserved > pr ? s->peak_reserved : pr;
      pl = s->peak_live > pl ? s->peak_live : pl;
      mm += s->mismatches;
    }
  printf("  model: step %.1f us, exposed %.1f us (time scale %g)\n", r->rank[0].predicted_us,
         r->rank[0].predicted_exposed_us, c->time_scale);
  printf("  summary (steps %d..%d, mean over ranks): time %.1f us, exposed %.1f us, host %.1f us; "
         "peak reserved %s / peak live %s = %.4f; budget %s + bound %s; verifier mismatches %zu; "
         "leaked %llu bytes\n",
         from, K - 1, mean_of(r, from, K, offsetof(train_step_rec_t, step_us)),
         mean_of(r, from, K, offsetof(train_step_rec_t, exposed_us)),
         mean_of(r, from, K, offsetof(train_step_rec_t, host_us)),
         tool_format_size(pr, a, sizeof(a)), tool_format_size(pl, b, sizeof(b)),
         pl ? (double)pr / (double)pl : 0,
         tool_format_size((uint64_t)r->rank[0].budget_bytes, bd, sizeof(bd)),
         tool_format_size((uint64_t)r->rank[0].bound_bytes, bb, sizeof(bb)), mm,
         (unsigned long long)r->rank[0].leaked_bytes);
}

static void json_run(const train_cfg_t *c, const train_results_t *r, bool last) {
  printf("    {\"mode\": \"%s\", \"ranks\": %d, \"processes\": %s, \"budget_bytes\": %lld, "
         "\"bound_bytes\": %lld, \"predicted_peak_bytes\": %lld, \"predicted_time_us\": %.3f, "
         "\"predicted_exposed_comm_us\": %.3f, \"graph_nodes\": %llu,\n",
         mode_name(c->mode), r->ranks, c->processes ? "true" : "false",
         (long long)r->rank[0].budget_bytes, (long long)r->rank[0].bound_bytes,
         (long long)r->rank[0].predicted_peak, r->rank[0].predicted_us,
         r->rank[0].predicted_exposed_us, (unsigned long long)r->rank[0].graph_nodes);
  printf("     \"steps\": [");
  const train_rank_result_t *r0 = &r->rank[0];
  for (int k = 0; k < r0->steps_done; k++) {
    const train_step_rec_t *s = &r0->steps[k];
    size_t mm = 0;
    for (int i = 0; i < r->ranks; i++)
      mm += k < r->rank[i].steps_done ? r->rank[i].steps[k].mismatches : 0;
    printf("%s\n       {\"step\": %d, \"time_us\": %.3f, \"exposed_comm_us\": %.3f, "
           "\"host_us\": %.3f, \"peak_reserved_bytes\": %llu, \"peak_live_bytes\": %llu, "
           "\"graph\": \"%s\", \"verifier_mismatches\": %zu, \"registrations\": %llu, "
           "\"loss\": %.9g}",
           k ? "," : "", k, s->step_us, s->exposed_us, s->host_us,
           (unsigned long long)s->peak_reserved, (unsigned long long)s->peak_live,
           train_decision_name(s->decision), mm, (unsigned long long)s->registrations,
           (double)s->loss);
  }
  printf("]}%s\n", last ? "" : ",");
}

/* Whether two runs' losses (every rank, every step) and parameters are the
 * same bits; *what names the first difference. */
static bool same_bits(const train_results_t *a, const train_results_t *b, char *what, size_t len) {
  for (int i = 0; i < a->ranks; i++) {
    if (a->rank[i].steps_done != b->rank[i].steps_done) {
      snprintf(what, len, "rank %d ran %d and %d steps", i, a->rank[i].steps_done,
               b->rank[i].steps_done);
      return false;
    }
    for (int k = 0; k < a->rank[i].steps_done; k++)
      if (memcmp(&a->rank[i].steps[k].loss, &b->rank[i].steps[k].loss, sizeof(float)) != 0) {
        snprintf(what, len, "rank %d step %d: loss %.9g vs %.9g", i, k,
                 (double)a->rank[i].steps[k].loss, (double)b->rank[i].steps[k].loss);
        return false;
      }
    size_t n = a->layers * a->shard_elems;
    for (size_t e = 0; e < n; e++)
      if (memcmp(&a->rank[i].params[e], &b->rank[i].params[e], sizeof(float)) != 0) {
        snprintf(what, len, "rank %d parameter %zu (layer %zu): %.9g vs %.9g", i, e,
                 e / a->shard_elems, (double)a->rank[i].params[e], (double)b->rank[i].params[e]);
        return false;
      }
  }
  return true;
}

/* Thread ranks each drive a device of their own. On a real backend the
 * default rank count shrinks to the devices there are; asking for more is
 * refused here, before NCCL refuses a device index that does not exist.
 * (Process ranks are left alone: the parent must not start the driver before
 * it forks them.) 0, or the exit status. */
static int fit_devices(opts_t *o) {
  gca_status_t st = gca_device_init();
  if (st != GCA_OK) {
    fprintf(stderr, "gca-train: no device: %s\n", gca_last_error());
    return 1;
  }
  if (strcmp(gca_device_backend_name(), "sim") == 0)
    return 0;
  int n = 0;
  if ((st = gca_device_count(&n)) != GCA_OK || n < 1) {
    fprintf(stderr, "gca-train: no device on %s: %s\n", gca_device_backend_name(),
            st != GCA_OK ? gca_last_error() : "none found");
    return 1;
  }
  if (o->cfg.shape.ranks <= n)
    return 0;
  if (o->ranks_given) {
    fprintf(stderr, "gca-train: --ranks %d needs %d devices on %s (found %d)\n", o->cfg.shape.ranks,
            o->cfg.shape.ranks, gca_device_backend_name(), n);
    return 2;
  }
  o->cfg.shape.ranks = n;
  return 0;
}

int main(int argc, char **argv) {
  /* the pinned host allocator's jemalloc needs static TLS room: this runs the
   * program again with it when a late load would fail (before any thread) */
  tool_jemalloc_t je;
  (void)tool_jemalloc_load(&je, argv);
  opts_t o;
  memset(&o, 0, sizeof(o));
  int pr = parse(argc, argv, &o);
  if (pr)
    return pr == 1 ? 0 : 2;
  /* the sim's settings, unless the environment has its own: a device per
   * thread rank, and the virtual clock (times are the cost model's) */
  char ndev[16];
  snprintf(ndev, sizeof(ndev), "%d", o.cfg.processes ? 1 : o.cfg.shape.ranks);
  setenv("GCA_SIM_DEVICES", ndev, 0);
  setenv("GCA_SIM_CLOCK", "virtual", 0);
  if (!getenv("PYTORCH_CUDA_ALLOC_CONF") && !getenv("GCA_ALLOC_CONF"))
    setenv("GCA_ALLOC_CONF", "expandable_segments:True", 0);
  if (!o.cfg.processes && (pr = fit_devices(&o)) != 0)
    return pr;
  train_mode_t modes[3] = {TRAIN_EAGER, TRAIN_SCHEDULED, TRAIN_GRAPH};
  int nmodes = o.all ? 3 : 1;
  if (!o.all)
    modes[0] = o.cfg.mode;
  train_results_t res[3];
  memset(res, 0, sizeof(res));
  int rc = 0;
  if (o.json)
    printf("{\n  \"tool\": \"gca-train\",\n  \"runs\": [\n");
  int done = 0;
  for (int m = 0; m < nmodes; m++) {
    train_cfg_t c = o.cfg;
    c.mode = modes[m];
    if (c.snapshot_path && m != nmodes - 1)
      c.snapshot_path = NULL;
    gca_status_t st = train_run(&c, &res[m]);
    done = m + 1;
    if (!res[m].rank) {
      /* nothing ran */
    } else if (o.json)
      json_run(&c, &res[m], m == nmodes - 1 || st != GCA_OK);
    else if (!o.quiet) {
      print_steps(&o, &c, &res[m]);
      print_summary(&c, &res[m]);
    }
    if (st != GCA_OK) {
      fprintf(stderr, "gca-train: %s: %s\n", mode_name(c.mode), tool_last_error());
      rc = 1;
      break;
    }
  }
  if (rc == 0 && o.cfg.fault)
    fprintf(stderr,
            "gca-train: the run completed with the fault '%s' armed at step %d: it did not fire, "
            "or the layer it hit recovered (see the graph decisions)\n",
            o.cfg.fault, o.cfg.fault_step);
  bool equal = true;
  char what[256] = "";
  for (int m = 1; m < done && rc == 0; m++)
    if (!same_bits(&res[0], &res[m], what, sizeof(what))) {
      equal = false;
      fprintf(stderr, "gca-train: %s and %s differ: %s\n", mode_name(modes[0]), mode_name(modes[m]),
              what);
      rc = 1;
    }
  if (o.json)
    printf("  ],\n  \"bit_equal\": %s\n}\n", nmodes == 1        ? "null"
                                             : rc == 0 && equal ? "true"
                                                                : "false");
  else if (nmodes > 1 && rc == 0)
    printf("eager, scheduled and graph replay: losses and parameters bit-for-bit equal over %d "
           "steps on %d ranks\n",
           o.cfg.steps, o.cfg.shape.ranks);
  for (int m = 0; m < done; m++)
    train_results_free(&res[m]);
  return rc;
}
