/* SPDX-License-Identifier: Apache-2.0 */
/* bench_expand.c - gca-bench-expand: what expandable segments cost.
 *
 *   gca-bench-expand [--gib N] [--seconds S]
 *
 * Two figures, each next to the classic pool in the same run so that both
 * are measured under the same machine load:
 *   - driver calls per GiB grown: a pool is grown to N GiB (default 2) by a
 *     mix of request sizes, and the sim's call counters say how many
 *     mem_create / mem_map / mem_set_access (expandable) or mem_alloc
 *     (classic) calls that took;
 *   - ns per cached gca_malloc+gca_free pair, at several sizes, once the
 *     pool is warm (mean over as many pairs as fit in S seconds).
 * The one idea: a growth maps what the request lacks as one handle, so the
 * call count follows the number of growths, not the bytes grown. Runs on the
 * sim backend; nothing is asserted.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "util.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static const size_t grow_sizes[] = {3 * MiB / 2, 12 * MiB, 40 * MiB, 256 * MiB, 700 * 1024};
static const size_t pair_sizes[] = {4096, 512 * 1024, 8 * MiB, 64 * MiB};

static void die(const char *what) {
  fprintf(stderr, "gca-bench-expand: %s: %s\n", what, gca_last_error());
  exit(1);
}

static void fresh(bool expandable) {
  if (gca_empty_cache() != GCA_OK)
    die("empty_cache");
  gca_sim_fault_clear();
  if (gca_set_config(expandable ? "expandable_segments:True" : "expandable_segments:False") !=
      GCA_OK)
    die("set_config");
  gca_sim_counters_reset();
}

typedef struct grow_result {
  double gib;
  int64_t create, map, access, alloc;
} grow_result_t;

static grow_result_t grow(bool expandable, size_t target) {
  size_t cap = target / (512 * 1024) + 16, n = 0, live = 0;
  void **ptrs = calloc(cap, sizeof(*ptrs));
  if (ptrs == NULL)
    die("calloc");
  fresh(expandable);
  for (size_t i = 0; live < target && n < cap; i++) {
    size_t sz = grow_sizes[i % TOOL_ARRAY_SIZE(grow_sizes)];
    if (gca_malloc(&ptrs[n++], sz, NULL) != GCA_OK)
      die("malloc");
    live += sz;
  }
  gca_stats_t s;
  if (gca_get_stats(0, &s) != GCA_OK)
    die("get_stats");
  grow_result_t r = {(double)s.reserved_bytes[GCA_STAT_ALL].current / (double)GiB,
                     gca_sim_call_count("mem_create"), gca_sim_call_count("mem_map"),
                     gca_sim_call_count("mem_set_access"), gca_sim_call_count("mem_alloc")};
  for (size_t i = 0; i < n; i++)
    if (gca_free(ptrs[i]) != GCA_OK)
      die("free");
  if (gca_empty_cache() != GCA_OK)
    die("empty_cache");
  free(ptrs);
  return r;
}

static void *volatile sink;

static double pair_ns(bool expandable, size_t size, double seconds) {
  void *keep = NULL, *p = NULL;
  fresh(expandable);
  /* a live neighbour, so that the pair works inside a split segment */
  if (gca_malloc(&keep, size, NULL) != GCA_OK || gca_malloc(&p, size, NULL) != GCA_OK ||
      gca_free(p) != GCA_OK)
    die("warm-up");
  uint64_t pairs = 0, t0 = tool_now_ns(), t1 = t0;
  uint64_t budget = (uint64_t)(seconds * 1e9);
  while (t1 - t0 < budget) {
    for (int i = 0; i < 256; i++) {
      if (gca_malloc(&p, size, NULL) != GCA_OK)
        die("malloc");
      sink = p;
      if (gca_free(p) != GCA_OK)
        die("free");
    }
    pairs += 256;
    t1 = tool_now_ns();
  }
  if (gca_free(keep) != GCA_OK)
    die("free");
  return (double)(t1 - t0) / (double)pairs;
}

static void usage(FILE *f) {
  fprintf(f, "usage: gca-bench-expand [--gib N] [--seconds S] [--help]\n"
             "  --gib N       live GiB to grow to (default 2)\n"
             "  --seconds S   time per ns-per-pair figure (default 0.05)\n");
}

int main(int argc, char **argv) {
  double gib = 2.0, seconds = 0.05;
  static const struct option longopts[] = {{"gib", required_argument, NULL, 'g'},
                                           {"seconds", required_argument, NULL, 's'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
    if (c == 'g')
      gib = atof(optarg);
    else if (c == 's')
      seconds = atof(optarg);
    else {
      usage(c == 'h' ? stdout : stderr);
      return c == 'h' ? 0 : 2;
    }
  }
  if (optind < argc || gib <= 0 || seconds <= 0) {
    usage(stderr);
    return 2;
  }
  if (gca_device_init() != GCA_OK)
    die("device_init");
  if (strcmp(gca_device_backend_name(), "sim") != 0) {
    fprintf(stderr, "gca-bench-expand: needs the sim backend (GCA_DEVICE=sim) for call counts\n");
    return 2;
  }
  if (gca_sim_set_capacity(0, (uint64_t)(gib * (double)GiB) + 4 * GiB) != GCA_OK)
    die("sim_set_capacity");

  size_t target = (size_t)(gib * (double)GiB);
  grow_result_t e = grow(true, target), c = grow(false, target);
  printf("growth to %.2f GiB live (sizes 700 KiB .. 256 MiB)\n", gib);
  printf("  expandable: %.3f GiB mapped; per GiB: %.1f mem_create, %.1f mem_map, "
         "%.1f mem_set_access (%.1f driver calls)\n",
         e.gib, (double)e.create / e.gib, (double)e.map / e.gib, (double)e.access / e.gib,
         (double)(e.create + e.map + e.access) / e.gib);
  printf("  one handle per 20 MiB page would take %.1f calls per GiB\n", 3.0 * 1024.0 / 20.0);
  printf("  classic:    %.3f GiB reserved; per GiB: %.1f mem_alloc\n", c.gib,
         (double)c.alloc / c.gib);

  printf("\ncached gca_malloc+gca_free pair (ns), %.2f s per figure\n", seconds);
  printf("  %10s %12s %12s %8s\n", "size", "classic", "expandable", "ratio");
  for (size_t i = 0; i < TOOL_ARRAY_SIZE(pair_sizes); i++) {
    double nc = pair_ns(false, pair_sizes[i], seconds);
    double ne = pair_ns(true, pair_sizes[i], seconds);
    printf("  %10zu %12.1f %12.1f %8.2f\n", pair_sizes[i], nc, ne, ne / nc);
  }
  if (gca_empty_cache() != GCA_OK)
    die("empty_cache");
  return 0;
}
