/* SPDX-License-Identifier: Apache-2.0 */
/* bench_churn.c - gca-bench-churn: random allocation churn over a live set,
 * gca beside glibc malloc and jemalloc in the same run.
 *
 *   gca-bench-churn [--ops N] [--max-live N] [--seed S] [--json] [--help]
 *
 * For each live-set size (10, 1,000, 100,000, 1,000,000 blocks; --max-live
 * caps it) it allocates the live set, optionally with as many free holes
 * between the live blocks (allocate twice as many, free every other one),
 * then times N churn operations: free a random live block and allocate a new
 * one of a random size in its place. Sizes are log-uniform in 512 B .. 4 KiB
 * (gca's small pool: 2 MiB segments, split and merged). One operation is a
 * free and an allocation; figures are nanoseconds per operation. gca runs on
 * one stream with its default settings and with free_cache:False (PyTorch's
 * placement); jemalloc is loaded as a peer (peer_jemalloc.h) and left out
 * when absent. Nothing is
 * asserted; the seed is printed.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gca.h"
#include "peer_jemalloc.h"
#include "util.h"

typedef struct peer {
  const char *name;
  void *(*alloc)(size_t size, void *ctx);
  void (*release)(void *p, void *ctx);
  void *ctx;
} peer_t;

static uint64_t rng;
static uint64_t next(void) { /* splitmix64 */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Sizes log-uniform in 512 B .. 4 KiB, drawn ahead into a table so that the
 * timed loop pays for a table lookup, not for pow(). */
#define SIZE_TABLE 4096
static size_t size_table[SIZE_TABLE];
static void draw_sizes(void) {
  for (size_t i = 0; i < SIZE_TABLE; i++) {
    double u = (double)(next() >> 11) / 9007199254740992.0;
    size_table[i] = (size_t)(512.0 * pow(8.0, u));
  }
}
static size_t some_size(void) {
  return size_table[next() & (SIZE_TABLE - 1)];
}

static void *gca_alloc(size_t size, void *ctx) {
  void *p = NULL;
  return gca_malloc(&p, size, (gca_stream_t)ctx) == GCA_OK ? p : NULL;
}
static void gca_release(void *p, void *ctx) {
  (void)ctx;
  gca_free(p);
}
static void *libc_alloc(size_t size, void *ctx) {
  (void)ctx;
  void *p = malloc(size);
  if (p)
    *(volatile char *)p = 1; /* the peer writes its block, as a user would */
  return p;
}
static void libc_release(void *p, void *ctx) {
  (void)ctx;
  free(p);
}

static void *(*je_malloc)(size_t);
static void (*je_free)(void *);
static void *je_alloc(size_t size, void *ctx) {
  (void)ctx;
  void *p = je_malloc(size);
  if (p)
    *(volatile char *)p = 1;
  return p;
}
static void je_release(void *p, void *ctx) {
  (void)ctx;
  je_free(p);
}

/* ns per operation for one peer at one live size; -1 when it failed. */
static double run(const peer_t *peer, size_t live, bool holes, long ops, uint64_t seed) {
  size_t n = holes ? 2 * live : live;
  void **v = calloc(n, sizeof(void *));
  if (!v)
    return -1;
  rng = seed;
  draw_sizes();
  double result = -1;
  for (size_t i = 0; i < n; i++)
    if ((v[i] = peer->alloc(some_size(), peer->ctx)) == NULL)
      goto out;
  size_t nlive = n;
  if (holes) { /* free every other block: the live ones move to the front */
    for (size_t i = 0; i < n; i += 2)
      peer->release(v[i], peer->ctx);
    for (size_t i = 1, k = 0; i < n; i += 2)
      v[k++] = v[i];
    nlive = live;
  }
  uint64_t t0 = tool_now_ns();
  for (long k = 0; k < ops; k++) {
    size_t i = (size_t)(next() % nlive);
    peer->release(v[i], peer->ctx);
    if ((v[i] = peer->alloc(some_size(), peer->ctx)) == NULL) {
      nlive = i; /* free what is left below */
      goto out_live;
    }
  }
  result = (double)(tool_now_ns() - t0) / (double)ops;
out_live:
  for (size_t i = 0; i < nlive; i++)
    peer->release(v[i], peer->ctx);
  free(v);
  return result;
out:
  for (size_t i = 0; i < n && v[i]; i++)
    peer->release(v[i], peer->ctx);
  free(v);
  return -1;
}

static void usage(FILE *f) {
  fprintf(f, "usage: gca-bench-churn [--ops N] [--max-live N] [--seed S] [--json] [--help]\n");
}

int main(int argc, char **argv) {
  long ops = 1000000;
  size_t max_live = 1000000;
  uint64_t seed = 20261125;
  bool json = false;
  static const struct option longopts[] = {
      {"ops", required_argument, NULL, 'o'},  {"max-live", required_argument, NULL, 'm'},
      {"seed", required_argument, NULL, 's'}, {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case 'o':
      ops = atol(optarg);
      break;
    case 'm':
      max_live = (size_t)strtoull(optarg, NULL, 0);
      break;
    case 's':
      seed = strtoull(optarg, NULL, 0);
      break;
    case 'j':
      json = true;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc || ops <= 0 || max_live == 0) {
    usage(stderr);
    return 2;
  }
  tool_jemalloc_t jem;
  bool have_je = tool_jemalloc_load(&jem, argv); /* first: it may run the program again */
  gca_stream_t s = NULL;
  if (gca_stream_create(&s, GCA_STREAM_NON_BLOCKING) != GCA_OK) {
    fprintf(stderr, "gca-bench-churn: %s\n", gca_last_error());
    return 1;
  }
  if (have_je) {
    je_malloc = jem.malloc;
    je_free = jem.free;
  }
  peer_t peers[4] = {{"gca", gca_alloc, gca_release, s},
                     {"gca exact", gca_alloc, gca_release, s},
                     {"glibc", libc_alloc, libc_release, NULL},
                     {"jemalloc", je_alloc, je_release, NULL}};
  int npeers = je_malloc && je_free ? 4 : 3;
  static const size_t lives[] = {10, 1000, 100000, 1000000};
  if (!json)
    printf("gca-bench-churn: seed %llu, %ld operations (a free and an allocation, 512 B .. 4 KiB "
           "log-uniform), ns per operation%s\n",
           (unsigned long long)seed, ops, npeers < 4 ? "; jemalloc not found" : "");
  else
    printf("{\"seed\": %llu, \"ops\": %ld, \"rows\": [", (unsigned long long)seed, ops);
  if (!json)
    printf("  %10s %6s %10s %10s %10s %10s\n", "live", "holes", "gca", "gca exact", "glibc",
           "jemalloc");
  bool first = true;
  for (size_t li = 0; li < TOOL_ARRAY_SIZE(lives); li++) {
    if (lives[li] > max_live)
      continue;
    for (int holes = 0; holes < 2; holes++) {
      double ns[4] = {-1, -1, -1, -1};
      for (int k = 0; k < npeers; k++) {
        if (k <= 1 && gca_set_config(k == 0 ? "free_cache:True" : "free_cache:False") != GCA_OK)
          continue;
        ns[k] = run(&peers[k], lives[li], holes, ops, seed);
        if (k <= 1)
          gca_empty_cache();
      }
      if (json) {
        printf("%s{\"live_blocks\": %zu, \"holes\": %s, \"gca_ns_per_op\": %.1f, "
               "\"gca_exact_ns_per_op\": %.1f, \"glibc_ns_per_op\": %.1f, "
               "\"jemalloc_ns_per_op\": %.1f}",
               first ? "" : ", ", lives[li], holes ? "true" : "false", ns[0], ns[1], ns[2], ns[3]);
        first = false;
      } else {
        printf("  %10zu %6s %10.0f %10.0f %10.0f %10.0f\n", lives[li], holes ? "yes" : "no", ns[0],
               ns[1], ns[2], ns[3]);
      }
      fflush(stdout);
    }
  }
  if (json)
    printf("]}\n");
  gca_set_config("free_cache:True");
  gca_stream_destroy(s);
  return 0;
}
