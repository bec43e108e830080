/* SPDX-License-Identifier: Apache-2.0 */
/* bench_churn.c - gca-bench-churn: random allocation churn over a live set,
 * gca beside glibc malloc and jemalloc in the same run.
 *
 *   gca-bench-churn [--ops N] [--max-live N] [--live N] [--holes yes|no]
 *                   [--peers LIST] [--seed S] [--json] [--help]
 *
 * For each live-set size (10, 1,000, 100,000, 1,000,000 blocks; --max-live
 * caps it, --live measures one size of any value instead) it allocates the
 * live set, optionally with as many free holes between the live blocks
 * (allocate twice as many, free every other one), then times N churn
 * operations: free a random live block and allocate a new one of a random
 * size in its place. Sizes are log-uniform in 512 B .. 4 KiB (gca's small
 * pool: 2 MiB segments, split and merged). One operation is a free and an
 * allocation; figures are nanoseconds per operation. gca runs on one stream
 * with its default settings (the free cache's slot and recycle bins: Note
 * [Recycle bins]), with free_cache:False (PyTorch's placement) and with
 * recycle_bins:False (the slot alone, which keeps PyTorch's placement), and
 * with its defaults once a second thread has used the device (gca tc: its
 * thread caches engaged, as in any program with a second allocating thread;
 * Note [Thread caches]; measured for every case after all the others, since
 * that lasts); jemalloc is loaded as a
 * peer (peer_jemalloc.h) and left out when absent. --holes and --peers (a comma-separated subset of
 * gca, gca-exact, gca-slot, glibc, jemalloc, gca-tc) narrow the run to one case, so
 * that a profiler (cachegrind, perf) sees that case alone; a peer left out
 * is null in --json. Then, for each live size, what destroying a stream
 * costs with that live set on another stream (gca's defaults; stream_rows in
 * --json), beside the destroy of a stream that allocated nothing. Last,
 * unless --peers narrowed the run, this machine's memory curve (Note [Churn
 * and the memory]; memory_latency in --json). Nothing is asserted; the seed
 * is printed.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
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
/* gca tc: a second thread allocates and frees once on the stream's device
 * after this one has, which engages that device's thread caches for good
 * (Note [Thread caches]); so gca tc runs after every other gca peer. Its
 * size is one no cache holds, so that the request takes the locked path,
 * where threads are noted. */
static void *engage_thread(void *ctx) {
  void *p = gca_alloc((1 << 20) + 512, ctx);
  gca_free(p);
  return p;
}
static bool engage_thread_caches(gca_stream_t s) {
  pthread_t t;
  void *p = gca_alloc(512, s), *q = NULL;
  gca_free(p);
  if (p == NULL || pthread_create(&t, NULL, engage_thread, s) != 0)
    return false;
  pthread_join(t, &q);
  return q != NULL;
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

/* The timed loop: ops times, a random live block of v freed and a new one
 * allocated in its place; false when an allocation failed (its slot left
 * NULL). Out of line, so that a profiler counts it alone: valgrind
 * --tool=callgrind --cache-sim=yes --toggle-collect=churn_ops. */
static __attribute__((noinline)) bool churn_ops(const peer_t *peer, void **v, size_t nlive,
                                                long ops) {
  for (long k = 0; k < ops; k++) {
    size_t i = (size_t)(next() % nlive);
    peer->release(v[i], peer->ctx);
    if ((v[i] = peer->alloc(some_size(), peer->ctx)) == NULL)
      return false;
  }
  return true;
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
  if (churn_ops(peer, v, nlive, ops))
    result = (double)(tool_now_ns() - t0) / (double)ops;
  for (size_t i = 0; i < nlive; i++)
    if (v[i] != NULL) /* NULL: the allocation that failed */
      peer->release(v[i], peer->ctx);
  free(v);
  return result;
out:
  for (size_t i = 0; i < n && v[i]; i++)
    peer->release(v[i], peer->ctx);
  free(v);
  return -1;
}

/* Note [Destroyed streams] (allocator/streamkey.c): what a stream's destroy
 * costs with `live` blocks live on another stream: ns per create + allocate +
 * free + gca_stream_destroy of a stream, and per create + destroy of one that
 * allocated nothing (the reference: the device's own stream calls and a
 * retirement that finds no segment), in *with and *bare; false on a failure. */
static bool stream_destroy_cost(gca_stream_t s, size_t live, double *with, double *bare) {
  enum { ROUNDS = 50 };
  void **v = calloc(live, sizeof(void *));
  bool ok = v != NULL;
  for (size_t i = 0; ok && i < live; i++)
    ok = gca_malloc(&v[i], some_size(), s) == GCA_OK;
  for (int kind = 0; ok && kind < 2; kind++) {
    uint64_t t0 = tool_now_ns();
    for (int r = 0; ok && r < ROUNDS; r++) {
      gca_stream_t u;
      void *p = NULL;
      ok = gca_stream_create(&u, GCA_STREAM_NON_BLOCKING) == GCA_OK;
      if (ok && kind == 0 && (ok = gca_malloc(&p, 4096, u) == GCA_OK))
        gca_free(p);
      if (ok)
        ok = gca_stream_destroy(u) == GCA_OK;
    }
    *(kind == 0 ? with : bare) = (double)(tool_now_ns() - t0) / ROUNDS;
  }
  for (size_t i = 0; v != NULL && i < live && v[i] != NULL; i++)
    gca_free(v[i]);
  free(v);
  return ok;
}

/* Note [Churn and the memory]: at 10^6 live blocks a churn operation is
 * bound by a few random reads of memory the caches do not hold: the free
 * reads the pointer's slot in gca's pointer map (4 M slots of 32 bytes once
 * 2 M blocks were live), jemalloc its radix tree's leaf for the page, and
 * this loop its own v[i]. Which of those miss the last-level cache depends
 * on how much of it the machine gives this process, so the ratio between
 * peers moves from host to host (1.2x to over 2x at 10^6 live with holes).
 * The run ends with this machine's curve: ns per dependent read at random
 * over buffers of 4 to 256 MiB on huge pages, where the step from tens of
 * ns to DRAM's latency is where that cache ends. */
static const size_t chase_mib[] = {4, 16, 64, 256};

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: gca-bench-churn [--ops N] [--max-live N] [--live N] [--holes yes|no]\n"
      "                       [--peers LIST] [--seed S] [--json] [--help]\n"
      "  --ops N        churn operations per case (default 1000000)\n"
      "  --max-live N   largest of the live sizes 10, 1000, 100000, 1000000 to run\n"
      "  --live N       run this one live size instead\n"
      "  --holes yes|no only the cases with (yes) or without (no) free holes\n"
      "  --peers LIST   comma-separated subset of gca,gca-exact,gca-slot,glibc,jemalloc,gca-tc\n");
}

/* A whole number in [min, max] from the whole of text (decimal, or hex with
 * 0x), else false. */
static bool parse_count(const char *text, unsigned long long min, unsigned long long max,
                        unsigned long long *out) {
  char *end = NULL;
  if (text[0] < '0' || text[0] > '9')
    return false; /* no sign, no space: strtoull would take "-1" */
  errno = 0;
  bool hex = text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
  unsigned long long v = strtoull(text, &end, hex ? 16 : 10); /* "010" is ten, not octal */
  if (errno != 0 || *end != '\0' || v < min || v > max)
    return false;
  *out = v;
  return true;
}

#define NPEERS 6
static const char *const peer_names[NPEERS] = {"gca",   "gca-exact", "gca-slot",
                                               "glibc", "jemalloc",  "gca-tc"};

/* The peers named in list as a mask of peer_names' bits, or 0 for a name
 * that is not one of them (*bad points at it). */
static unsigned parse_peers(const char *list, char *bad, size_t bad_len) {
  unsigned mask = 0;
  const char *p = list;
  for (;;) {
    size_t n = strcspn(p, ",");
    int k = 0;
    while (k < NPEERS && !(strlen(peer_names[k]) == n && strncmp(peer_names[k], p, n) == 0))
      k++;
    if (k == NPEERS) {
      snprintf(bad, bad_len, "%.*s", (int)n, p);
      return 0;
    }
    mask |= 1u << k;
    if (p[n] == '\0')
      return mask;
    p += n + 1;
  }
}

int main(int argc, char **argv) {
  unsigned long long ops = 1000000, max_live = 1000000, one_live = 0, seed = 20261125;
  int holes_from = 0, holes_to = 1; /* the cases: without holes (0), with (1) */
  unsigned peer_mask = (1u << NPEERS) - 1;
  bool json = false, peers_named = false;
  static const struct option longopts[] = {{"ops", required_argument, NULL, 'o'},
                                           {"max-live", required_argument, NULL, 'm'},
                                           {"live", required_argument, NULL, 'l'},
                                           {"holes", required_argument, NULL, 'H'},
                                           {"peers", required_argument, NULL, 'p'},
                                           {"seed", required_argument, NULL, 's'},
                                           {"json", no_argument, NULL, 'j'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  int c;
  char bad[64];
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case 'o':
      if (!parse_count(optarg, 1, 1ull << 40, &ops)) {
        fprintf(stderr, "gca-bench-churn: --ops '%s' is not a whole number in [1, 2^40]\n", optarg);
        return 2;
      }
      break;
    case 'm':
    case 'l':
      if (!parse_count(optarg, 1, 100000000, c == 'm' ? &max_live : &one_live)) {
        fprintf(stderr, "gca-bench-churn: --%s '%s' is not a whole number in [1, 100000000]\n",
                c == 'm' ? "max-live" : "live", optarg);
        return 2;
      }
      break;
    case 'H':
      if (strcmp(optarg, "yes") != 0 && strcmp(optarg, "no") != 0) {
        fprintf(stderr, "gca-bench-churn: --holes '%s' is neither yes nor no\n", optarg);
        return 2;
      }
      holes_from = holes_to = strcmp(optarg, "yes") == 0;
      break;
    case 'p':
      peers_named = true;
      if ((peer_mask = parse_peers(optarg, bad, sizeof bad)) == 0) {
        fprintf(stderr,
                "gca-bench-churn: --peers names '%s', not one of gca, gca-exact, gca-slot, "
                "glibc, jemalloc, gca-tc\n",
                bad);
        return 2;
      }
      break;
    case 's':
      if (!parse_count(optarg, 0, ULLONG_MAX, &seed)) {
        fprintf(stderr, "gca-bench-churn: --seed '%s' is not a whole number\n", optarg);
        return 2;
      }
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
  if (optind != argc) {
    fprintf(stderr, "gca-bench-churn: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  tool_jemalloc_t jem;
  bool have_je = (peer_mask & 16) && tool_jemalloc_load(&jem, argv); /* first: it may rerun us */
  gca_stream_t s = NULL;
  if (gca_stream_create(&s, GCA_STREAM_NON_BLOCKING) != GCA_OK) {
    fprintf(stderr, "gca-bench-churn: %s\n", gca_last_error());
    return 1;
  }
  if (have_je) {
    je_malloc = jem.malloc;
    je_free = jem.free;
  }
  peer_t peers[NPEERS] = {
      {"gca", gca_alloc, gca_release, s},       {"gca exact", gca_alloc, gca_release, s},
      {"gca slot", gca_alloc, gca_release, s},  {"glibc", libc_alloc, libc_release, NULL},
      {"jemalloc", je_alloc, je_release, NULL}, {"gca tc", gca_alloc, gca_release, s}};
  bool je_missing = (peer_mask & 16) && !(je_malloc && je_free);
  if (je_missing)
    peer_mask &= ~16u;
  static const size_t all_lives[] = {10, 1000, 100000, 1000000};
  size_t lives[4], nlives = 0;
  if (one_live)
    lives[nlives++] = (size_t)one_live;
  else
    for (size_t li = 0; li < TOOL_ARRAY_SIZE(all_lives); li++)
      if (all_lives[li] <= max_live)
        lives[nlives++] = all_lives[li];
  /* every case for the peers but gca tc, then gca tc for every case */
  enum { MAX_CASES = 8 };
  static const char *const confs[3] = {"free_cache:True,recycle_bins:True", "free_cache:False",
                                       "free_cache:True,recycle_bins:False"};
  double ns[MAX_CASES][NPEERS];
  size_t ncases = 0;
  for (size_t li = 0; li < nlives; li++)
    for (int holes = holes_from; holes <= holes_to; holes++, ncases++)
      for (int k = 0; k < NPEERS; k++)
        ns[ncases][k] = -1;
  bool tc_missing = false;
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1 && (peer_mask & 32) && !(tc_missing = !engage_thread_caches(s)))
      gca_empty_cache();
    for (size_t ci = 0; ci < ncases; ci++) {
      size_t live = lives[ci / (size_t)(holes_to - holes_from + 1)];
      int holes = holes_from + (int)(ci % (size_t)(holes_to - holes_from + 1));
      for (int k = pass == 0 ? 0 : 5; k < (pass == 0 ? 5 : NPEERS); k++) {
        bool is_gca = k <= 2 || k == 5;
        if (!(peer_mask & (1u << k)) || (k == 5 && tc_missing))
          continue;
        if (is_gca && gca_set_config(confs[k == 5 ? 0 : k]) != GCA_OK)
          continue;
        ns[ci][k] = run(&peers[k], live, holes, (long)ops, seed);
        if (is_gca)
          gca_empty_cache();
      }
    }
  }
  if (tc_missing)
    peer_mask &= ~32u;
  if (!json)
    printf("gca-bench-churn: seed %llu, %llu operations (a free and an allocation, 512 B .. 4 KiB "
           "log-uniform), ns per operation%s%s\n",
           seed, ops, je_missing ? "; jemalloc not found" : "",
           tc_missing ? "; gca tc left out (its thread caches could not be engaged)" : "");
  else
    printf("{\"seed\": %llu, \"ops\": %llu, \"rows\": [", seed, ops);
  if (!json)
    printf("  %10s %6s %10s %10s %10s %10s %10s %10s\n", "live", "holes", "gca", "gca exact",
           "gca slot", "glibc", "jemalloc", "gca tc");
  for (size_t ci = 0; ci < ncases; ci++) {
    size_t live = lives[ci / (size_t)(holes_to - holes_from + 1)];
    int holes = holes_from + (int)(ci % (size_t)(holes_to - holes_from + 1));
    if (json) {
      static const char *const keys[NPEERS] = {"gca_ns_per_op",      "gca_exact_ns_per_op",
                                               "gca_slot_ns_per_op", "glibc_ns_per_op",
                                               "jemalloc_ns_per_op", "gca_tc_ns_per_op"};
      printf("%s{\"live_blocks\": %zu, \"holes\": %s", ci == 0 ? "" : ", ", live,
             holes ? "true" : "false");
      for (int k = 0; k < NPEERS; k++)
        if (peer_mask & (1u << k))
          printf(", \"%s\": %.1f", keys[k], ns[ci][k]);
        else
          printf(", \"%s\": null", keys[k]);
      printf("}");
    } else {
      printf("  %10zu %6s", live, holes ? "yes" : "no");
      for (int k = 0; k < NPEERS; k++)
        if (peer_mask & (1u << k))
          printf(" %10.0f", ns[ci][k]);
        else
          printf(" %10s", "-");
      printf("\n");
    }
  }
  /* a stream's destroy against the live set (gca's defaults) */
  gca_set_config("free_cache:True,recycle_bins:True");
  if (!json)
    printf("\nstream destroy with a live set (another stream's blocks), us per stream: create + "
           "allocate + free + destroy, and create + destroy of a stream that allocated nothing\n"
           "  %10s %12s %12s\n",
           "live", "alloc+destroy", "bare");
  else
    printf("], \"stream_rows\": [");
  for (size_t li = 0; li < nlives; li++) {
    double with = -1, bare = -1;
    if (!stream_destroy_cost(s, lives[li], &with, &bare))
      with = bare = -1;
    gca_empty_cache();
    if (json)
      printf("%s{\"live_blocks\": %zu, \"destroy_ns\": %.0f, \"bare_destroy_ns\": %.0f}",
             li == 0 ? "" : ", ", lives[li], with, bare);
    else
      printf("  %10zu %12.1f %12.1f\n", lives[li], with / 1e3, bare / 1e3);
  }
  /* the machine's memory (Note [Churn and the memory]); not when --peers
   * narrows the run for a profiler */
  bool chase = !peers_named;
  if (json)
    printf("], \"memory_latency\": %s", chase ? "[" : "null");
  else if (chase)
    printf("\nthis machine's memory: ns per dependent read at random over a buffer (huge pages)\n");
  for (size_t i = 0; chase && i < TOOL_ARRAY_SIZE(chase_mib); i++) {
    double lat = 0;
    bool ok = tool_read_latency_ns(chase_mib[i], &lat) == GCA_OK; /* else null, or "-" */
    if (json && ok)
      printf("%s{\"mib\": %zu, \"ns\": %.1f}", i == 0 ? "" : ", ", chase_mib[i], lat);
    else if (json)
      printf("%s{\"mib\": %zu, \"ns\": null}", i == 0 ? "" : ", ", chase_mib[i]);
    else if (ok)
      printf("  %4zu MiB %7.1f\n", chase_mib[i], lat);
    else
      printf("  %4zu MiB %7s (%s)\n", chase_mib[i], "-", tool_last_error());
  }
  if (json)
    printf("%s}\n", chase ? "]" : "");
  gca_stream_destroy(s);
  return 0;
}
