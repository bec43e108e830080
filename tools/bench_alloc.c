/* SPDX-License-Identifier: Apache-2.0 */
/* bench_alloc.c - gca-bench: the cost of a cached allocation, next to glibc.
 *
 *   gca-bench [--seconds S] [--rounds R] [--json] [--help]
 *
 * For each size (512 B to 64 MiB) it times gca_malloc+gca_free pairs served
 * from a warm cache, on one thread and on two threads at once (each thread on
 * its own stream), and times malloc+free of the same sizes in the same run, so
 * the ratio is measured under the same machine load. The 1-thread figures of
 * every size come first, while one thread has used the device: a
 * single-threaded program's path (the free cache); the 2-thread figures
 * engage the thread caches (Note [Thread caches]), and the thread and
 * pattern tables run with them engaged, their 1-thread rows included. "exact" is the single
 * thread pair with free_cache:False (PyTorch's placement: a split and a merge
 * on every pair) beside the default configuration. Each measurement is one
 * window of S seconds (default 0.08), from the first thread's start to the
 * moment the threads stop together; a figure is the pairs all threads did
 * in it over the window's wall time (ns per pair: per thread, the window
 * times the threads over the pairs). Each figure of the size, thread and
 * pattern tables is the median of R such windows (default 3); in each round
 * every allocator of the row is measured once, one after another, so a load
 * that comes and goes reaches them all alike and one slow window moves no
 * figure. A ratio (gca over a peer, a thread count over one thread: the
 * scaling table measures every thread count in each round) is the median of
 * each round's own ratio, not the ratio of the medians: on a 2-core VM whose
 * speed halved for seconds at a time, a slow phase moved gca's 512 B median
 * further than jemalloc's, and the ratio of medians between 1.26x and 1.65x
 * from run to run. A thread the scheduler leaves without a
 * core lowers the total as it should, and cannot make it collapse (a mean
 * of each thread's own time per pair did).
 * "shared lock" is the floor under any allocator that keeps one locked state
 * per device, as PyTorch's and gca's do: each pair is two critical sections
 * of a pthread mutex around four updates of shared counters, nothing else;
 * with two threads it shows what the lock's cache line and the counters'
 * moving between cores costs on this machine. (gca's own device lock is
 * internal; a pthread mutex is the lock any allocator could take, so the floor
 * is a property of the machine, not of gca's lock.) jemalloc (plain
 * malloc/free, loaded as a peer: peer_jemalloc.h) is measured beside glibc
 * when it can be loaded. Then a thread-scaling table (4 KiB pairs on 1, 2, 4
 * and 8 threads, each on its own stream: total Mpairs/s for gca, glibc and
 * jemalloc, and each over its own 1-thread figure), with under it the same
 * 1-thread gca loop in one process and in two processes at once (the
 * machine's ceiling for the table, bench_procs.h), and a size-pattern table
 * (1 thread, then 2 each on its own stream: pairs alternating 4 KiB and 12
 * KiB; mixed sizes, log-uniform 512 B .. 1 MiB with 16 blocks kept live) for
 * gca, gca with free_cache:False, glibc and jemalloc. It uses the public API only; the JSON
 * report is written with jansson (keys: results[], threads[], processes,
 * patterns[], host).
 * A host section follows (bench_host.c): pinned host pairs next to glibc and
 * plain jemalloc, and device pinning calls per GiB grown ("host" in JSON).
 * Nothing is asserted: the figures are printed for a person or a dashboard.
 */
#include <inttypes.h>
#include <pthread.h>
#include <getopt.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "bench_host.h"
#include "bench_procs.h"
#include "gca.h"
#include "peer_jemalloc.h"
#include "util.h"

#define NTHREADS_MAX 8  /* the thread-scaling table; the size table uses 1 and 2 */
#define ROUNDS_MAX   15 /* windows per figure, at most */
#define BATCH        256

static const size_t sizes[] = {512, 4u << 10, 64u << 10, 1u << 20, 8u << 20, 64u << 20};
#define NSIZES TOOL_ARRAY_SIZE(sizes)

enum { KIND_GCA = 0, KIND_MALLOC = 1, KIND_EXACT = 2, KIND_LOCK = 3, KIND_JE = 4, KINDS = 5 };

/* How a worker's pairs choose their sizes: all `size`; alternating 4 KiB and
 * 12 KiB; or mixed, log-uniform 512 B .. 1 MiB with 16 blocks kept live (a
 * pair frees a random one of them and allocates a new one in its place). */
enum { PAT_SAME = 0, PAT_ALTERNATE = 1, PAT_MIXED = 2, NPATS = 3 };
static const char *const pattern_names[NPATS] = {"same", "alternating_4k_12k", "mixed_512b_1m"};
#define MIXED_LIVE 16

typedef struct bench_row {
  double ns[KINDS][2]; /* [kind][threads-1]: ns per pair per thread */
  /* [kind][threads-1]: gca's ns over that kind's (exact: exact's over
   * malloc's), the median of the rounds' own ratios */
  double vs[KINDS][2];
} bench_row_t;

static tool_jemalloc_t jem; /* plain jemalloc, when there */

/* One measurement's window, shared by its threads: it opens when the first
 * thread passes the barrier and closes when a thread sees `seconds` gone;
 * each thread stops at the end of its batch then. */
typedef struct window {
  _Atomic uint64_t start; /* 0 until the first thread starts */
  atomic_bool stop;
} window_t;

typedef struct worker {
  _Alignas(64) int kind, pattern; /* a line of its own: each thread writes its worker */
  uint64_t rng;
  void *live[MIXED_LIVE];
  size_t size;
  double seconds;
  gca_stream_t stream;
  pthread_barrier_t *barrier;
  window_t *window;
  uint64_t pairs, end; /* pairs done in the window, and when this thread stopped */
  gca_status_t status;
  char error[256];
} worker_t;

/* Keeps the compiler from pairing away malloc and free: p escapes, as far as
 * the compiler knows. (A global volatile did it before, and the store of
 * every thread's every pair to that one cache line moved it between cores:
 * two threads of any allocator ran at about half one thread's total.) */
static inline void escape(void *p) {
  __asm__ __volatile__("" : : "r"(p) : "memory");
}

static uint64_t next_rand(worker_t *w) { /* splitmix64 */
  uint64_t z = (w->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The size of pair i of a worker's pattern. */
static size_t pair_size(worker_t *w, int i) {
  if (w->pattern == PAT_ALTERNATE)
    return i & 1 ? 12u << 10 : 4u << 10;
  if (w->pattern == PAT_MIXED) /* 512 B * 2^(11 u), u uniform in [0, 1) */
    return (size_t)(512.0 * exp2(11.0 * (double)(next_rand(w) >> 11) / 9007199254740992.0));
  return w->size;
}

static void *peer_alloc(const worker_t *w, size_t size) {
  void *p = NULL;
  if (w->kind == KIND_MALLOC)
    p = malloc(size);
  else if (w->kind == KIND_JE)
    p = jem.malloc(size);
  else if (gca_malloc(&p, size, w->stream) != GCA_OK)
    return NULL;
  return p;
}

static void peer_free(const worker_t *w, void *p) {
  if (w->kind == KIND_MALLOC)
    free(p);
  else if (w->kind == KIND_JE)
    jem.free(p);
  else
    gca_free(p);
}

/* n pairs of the worker's allocator and pattern. */
static gca_status_t alloc_pairs(worker_t *w, int n) {
  for (int i = 0; i < n; i++) {
    size_t size = pair_size(w, i);
    void *p = peer_alloc(w, size);
    if (!p)
      return w->kind == KIND_GCA || w->kind == KIND_EXACT
                 ? tool_error_gca(GCA_ERR_OUT_OF_MEMORY, "bench: gca_malloc(%zu)", size)
                 : tool_error(GCA_ERR_OUT_OF_MEMORY, "bench: malloc(%zu) failed", size);
    escape(p);
    if (w->pattern == PAT_MIXED) { /* the new block replaces a random live one */
      size_t k = next_rand(w) % MIXED_LIVE;
      void *old = w->live[k];
      w->live[k] = p;
      p = old;
    }
    if (p)
      peer_free(w, p);
  }
  return GCA_OK;
}

/* The shared lock floor: one lock and a line of counters, as a device's. */
static pthread_mutex_t floor_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { _Alignas(64) int64_t current, peak, allocated, freed; } floor_stats;

static gca_status_t lock_pairs(worker_t *w, int n) {
  for (int i = 0; i < n; i++) {
    pthread_mutex_lock(&floor_lock);
    floor_stats.current += (int64_t)w->size;
    floor_stats.allocated += (int64_t)w->size;
    if (floor_stats.current > floor_stats.peak)
      floor_stats.peak = floor_stats.current;
    pthread_mutex_unlock(&floor_lock);
    pthread_mutex_lock(&floor_lock);
    floor_stats.current -= (int64_t)w->size;
    floor_stats.freed += (int64_t)w->size;
    pthread_mutex_unlock(&floor_lock);
  }
  return GCA_OK;
}

static gca_status_t pairs(worker_t *w, int n) {
  return w->kind == KIND_LOCK ? lock_pairs(w, n) : alloc_pairs(w, n);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  w->status = pairs(w, 64);
  pthread_barrier_wait(w->barrier);
  if (w->status != GCA_OK)
    goto out;
  uint64_t limit = (uint64_t)(w->seconds * 1e9), t = tool_now_ns(), start = 0;
  if (atomic_compare_exchange_strong(&w->window->start, &start, t))
    start = t; /* else another thread opened the window at `start` */
  while (!atomic_load_explicit(&w->window->stop, memory_order_relaxed)) {
    w->status = pairs(w, BATCH);
    if (w->status != GCA_OK)
      goto out;
    w->pairs += BATCH;
    t = tool_now_ns();
    if (t - start >= limit)
      atomic_store_explicit(&w->window->stop, true, memory_order_relaxed);
  }
  w->end = t;
out:
  for (int k = 0; k < MIXED_LIVE; k++)
    if (w->live[k])
      peer_free(w, w->live[k]);
  if (w->status != GCA_OK)
    snprintf(w->error, sizeof(w->error), "%s", tool_last_error());
  return NULL;
}

static gca_status_t measure_pattern(int kind, int pattern, size_t size, int nthreads,
                                    double seconds, gca_stream_t *streams, double *ns_per_pair) {
  worker_t w[NTHREADS_MAX];
  pthread_t th[NTHREADS_MAX];
  pthread_barrier_t barrier;
  window_t window = {0};
  gca_status_t st = GCA_OK;
  pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
  for (int i = 0; i < nthreads; i++) {
    w[i] = (worker_t){.kind = kind,
                      .pattern = pattern,
                      .rng = 0x5eed + (uint64_t)i,
                      .size = size,
                      .seconds = seconds,
                      .stream = streams[i],
                      .barrier = &barrier,
                      .window = &window};
  }
  int started = 0;
  for (; started < nthreads - 1; started++) {
    if (pthread_create(&th[started], NULL, worker_main, &w[started]) != 0) {
      st = tool_error(GCA_ERR_INTERNAL, "bench: pthread_create failed");
      break;
    }
  }
  if (st == GCA_OK)
    worker_main(&w[nthreads - 1]);
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
  TOOL_CHECK(st);
  uint64_t total = 0, end = 0;
  for (int i = 0; i < nthreads; i++) {
    if (w[i].status != GCA_OK)
      return tool_error(w[i].status, "bench: %zu-byte pairs on thread %d: %s", size, i, w[i].error);
    total += w[i].pairs;
    end = w[i].end > end ? w[i].end : end;
  }
  /* each thread's share of the window: a thread that got little of the
   * machine lowers the total, not the figure of the whole */
  uint64_t start = atomic_load(&window.start);
  *ns_per_pair = total ? (double)(end - start) * nthreads / (double)total : 0;
  return GCA_OK;
}

static gca_status_t measure(int kind, size_t size, int nthreads, double seconds,
                            gca_stream_t *streams, double *ns_per_pair) {
  return measure_pattern(kind, PAT_SAME, size, nthreads, seconds, streams, ns_per_pair);
}

static void size_name(size_t size, char *buf, size_t len) {
  if (size >= (1u << 20))
    snprintf(buf, len, "%zu MiB", size >> 20);
  else if (size >= (1u << 10))
    snprintf(buf, len, "%zu KiB", size >> 10);
  else
    snprintf(buf, len, "%zu B", size);
}

/* The median of v[0..n) (n >= 1; sorts v). A window that measured nothing
 * (0: a peer that is not there) makes the figure 0 as well. */
static double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int k = i; k > 0 && v[k - 1] > v[k]; k--) {
      double t = v[k];
      v[k] = v[k - 1];
      v[k - 1] = t;
    }
  return v[0] <= 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The median over n rounds of a[r] / b[r] * scale: each round's figures
 * were measured one after the other, so a slow phase of the machine that
 * reaches one round moves both and not their ratio. 0 when a window measured
 * nothing. Leaves a and b as they were. */
static double paired(const double *a, const double *b, int n, double scale) {
  double q[ROUNDS_MAX];
  for (int r = 0; r < n; r++)
    q[r] = a[r] > 0 && b[r] > 0 ? a[r] / b[r] * scale : 0;
  return median(q, n);
}

/* The thread-scaling table's thread counts and allocators. */
static const int thread_counts[] = {1, 2, 4, 8};
#define NTC TOOL_ARRAY_SIZE(thread_counts)
static const int scale_kinds[] = {KIND_GCA, KIND_MALLOC, KIND_JE};
static const char *const scale_names[] = {"gca", "malloc", "jemalloc"};
/* The pattern table's allocators. */
static const int pattern_kinds[] = {KIND_GCA, KIND_EXACT, KIND_MALLOC, KIND_JE};
static const char *const pattern_kind_names[] = {"gca", "exact", "malloc", "jemalloc"};

typedef struct report {
  bench_row_t rows[NSIZES];
  double lock_ns[2];
  double mpairs[NTC][3];  /* total Mpairs/s: [thread count][gca, malloc, jemalloc] */
  double scaling[NTC][3]; /* over 1 thread, the median of the rounds' own ratios */
  /* the process ceiling (bench_procs.h): Mpairs/s of 1 and of BENCH_PROCS
   * partners at once, and the latter over the former (paired per round);
   * 0 and procs_why when a partner failed */
  double procs_mpairs[2], procs_scaling;
  char procs_why[256];
  /* ns per pair per thread, [1 or 2 threads - 1][pattern][gca, exact, malloc, je] */
  double pattern_ns[2][NPATS][4];
  double pattern_vs_je[2][NPATS]; /* gca over jemalloc, the median of the rounds' own ratios */
  gca_stats_t stats;              /* device 0's at the end: what the lock-free paths cost */
  int rounds;                     /* windows per figure (the median of them) */
} report_t;

static void print_cell(double v, const char *fmt) {
  if (v > 0)
    printf(fmt, v);
  else
    printf("%10s", "-");
}

static void print_table(const report_t *rep) {
  printf("ns per alloc+free pair, warm cache (2 threads: per thread, window x threads / pairs, "
         "each on its own stream); each figure the median of %d windows\n",
         rep->rounds);
  printf("%-8s %10s %10s %10s %8s %8s %10s %10s %10s %10s %8s\n", "size", "gca 1T", "malloc 1T",
         "jemal 1T", "/malloc", "/jemal", "exact 1T", "gca 2T", "malloc 2T", "jemal 2T", "/jemal");
  for (size_t i = 0; i < NSIZES; i++) {
    char name[32];
    size_name(sizes[i], name, sizeof(name));
    const bench_row_t *r = &rep->rows[i];
    printf("%-8s %10.1f %10.1f ", name, r->ns[KIND_GCA][0], r->ns[KIND_MALLOC][0]);
    print_cell(r->ns[KIND_JE][0], "%10.1f");
    printf(" %8.2f %8.2f %10.1f %10.1f %10.1f ", r->vs[KIND_MALLOC][0], r->vs[KIND_JE][0],
           r->ns[KIND_EXACT][0], r->ns[KIND_GCA][1], r->ns[KIND_MALLOC][1]);
    print_cell(r->ns[KIND_JE][1], "%10.1f");
    printf(" %8.2f\n", r->vs[KIND_JE][1]);
  }
  printf("/malloc, /jemal = gca / that peer (below 1: gca is faster), the median of each round's "
         "own ratio; exact = free_cache:False\n");
  printf("shared lock floor (pthread mutex, two critical sections per pair, no allocator): "
         "1T %.1f ns, 2T %.1f ns\n",
         rep->lock_ns[0], rep->lock_ns[1]);
  printf("\nthread scaling: 4 KiB pairs, each thread on its own stream, total Mpairs/s "
         "(x = over 1 thread in the same round, the median of the rounds)\n");
  printf("%-8s", "threads");
  for (size_t k = 0; k < 3; k++)
    printf(" %10s %6s", scale_names[k], "x");
  printf("\n");
  for (size_t t = 0; t < NTC; t++) {
    printf("%-8d", thread_counts[t]);
    for (size_t k = 0; k < 3; k++) {
      printf(" ");
      print_cell(rep->mpairs[t][k], "%10.2f");
      printf(" %6.2f", rep->scaling[t][k]);
    }
    printf("\n");
  }
  if (rep->procs_scaling > 0)
    printf("%d processes at once, each the 1-thread gca loop, nothing shared (this machine's "
           "ceiling for the rows above): %.2f Mpairs/s, x %.2f over one process alone (%.2f)\n",
           BENCH_PROCS, rep->procs_mpairs[1], rep->procs_scaling, rep->procs_mpairs[0]);
  else
    printf("%d processes at once: not measured (%s)\n", BENCH_PROCS, rep->procs_why);
  for (int nt = 1; nt <= 2; nt++) {
    printf(nt == 1 ? "\nsize patterns, 1 thread, ns per alloc+free pair\n"
                   : "size patterns, 2 threads (each on its own stream), ns per pair per thread\n");
    printf("%-20s", "pattern");
    for (size_t k = 0; k < 4; k++)
      printf(" %10s", pattern_kind_names[k]);
    printf(" %8s\n", "gca/jemal");
    for (int pt = PAT_ALTERNATE; pt < NPATS; pt++) {
      printf("%-20s", pattern_names[pt]);
      for (size_t k = 0; k < 4; k++) {
        printf(" ");
        print_cell(rep->pattern_ns[nt - 1][pt][k], "%10.1f");
      }
      printf(" %8.2f\n", rep->pattern_vs_je[nt - 1][pt]);
    }
  }
  printf("\nlock-free paths over the run (each a membarrier call or a cache given back): "
         "%" PRId64 " device-lock revocations, %" PRId64 " thread-cache fences, %" PRId64
         " caches parked, for %" PRId64 " allocations\n",
         rep->stats.num_lock_revocations, rep->stats.num_cache_fences, rep->stats.num_cache_parks,
         rep->stats.allocation[GCA_STAT_ALL].allocated);
}

/* Sets o[key] = v, noting a failure (v NULL: jansson out of memory, or a
 * number that is not finite) in *ok. */
static void j_set(json_t *o, const char *key, json_t *v, bool *ok) {
  if (v == NULL || json_object_set_new(o, key, v) != 0)
    *ok = false;
}

/* Appends a new object to array a; NULL (and *ok false) without memory. */
static json_t *j_push(json_t *a, bool *ok) {
  json_t *o = json_object();
  if (o == NULL || json_array_append_new(a, o) != 0) {
    *ok = false;
    return NULL;
  }
  return o;
}

static gca_status_t print_json(const report_t *rep, double seconds, json_t *host) {
  bool ok = true;
  const char *backend = gca_device_backend_name();
  json_t *root = json_object(), *results = json_array(), *threads = json_array(),
         *patterns = json_array();
  if (root == NULL || results == NULL || threads == NULL || patterns == NULL) {
    json_decref(root);
    json_decref(results);
    json_decref(threads);
    json_decref(patterns);
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "bench: JSON report: out of host memory");
  }
  j_set(root, "backend", backend ? json_string(backend) : json_null(), &ok);
  j_set(root, "seconds_per_measurement", json_real(seconds), &ok);
  j_set(root, "rounds", json_integer(rep->rounds), &ok);
  j_set(root, "lock_ns_1t", json_real(rep->lock_ns[0]), &ok);
  j_set(root, "lock_ns_2t", json_real(rep->lock_ns[1]), &ok);
  j_set(root, "jemalloc", jem.malloc ? json_true() : json_string(jem.why), &ok);
  json_t *lf = json_object();
  j_set(root, "lockfree", lf, &ok);
  if (lf != NULL) {
    j_set(lf, "lock_revocations", json_integer(rep->stats.num_lock_revocations), &ok);
    j_set(lf, "cache_fences", json_integer(rep->stats.num_cache_fences), &ok);
    j_set(lf, "cache_parks", json_integer(rep->stats.num_cache_parks), &ok);
    j_set(lf, "allocations", json_integer(rep->stats.allocation[GCA_STAT_ALL].allocated), &ok);
  }
  for (size_t i = 0; i < NSIZES && ok; i++) {
    const bench_row_t *r = &rep->rows[i];
    json_t *o = j_push(results, &ok);
    if (!o)
      break;
    j_set(o, "size", json_integer((json_int_t)sizes[i]), &ok);
    j_set(o, "gca_ns_1t", json_real(r->ns[KIND_GCA][0]), &ok);
    j_set(o, "malloc_ns_1t", json_real(r->ns[KIND_MALLOC][0]), &ok);
    j_set(o, "ratio_1t", json_real(r->vs[KIND_MALLOC][0]), &ok);
    j_set(o, "jemalloc_ns_1t", json_real(r->ns[KIND_JE][0]), &ok);
    j_set(o, "ratio_jemalloc_1t", json_real(r->vs[KIND_JE][0]), &ok);
    j_set(o, "exact_ns_1t", json_real(r->ns[KIND_EXACT][0]), &ok);
    j_set(o, "ratio_exact_1t", json_real(r->vs[KIND_EXACT][0]), &ok);
    j_set(o, "gca_ns_2t", json_real(r->ns[KIND_GCA][1]), &ok);
    j_set(o, "malloc_ns_2t", json_real(r->ns[KIND_MALLOC][1]), &ok);
    j_set(o, "ratio_2t", json_real(r->vs[KIND_MALLOC][1]), &ok);
    j_set(o, "jemalloc_ns_2t", json_real(r->ns[KIND_JE][1]), &ok);
    j_set(o, "ratio_jemalloc_2t", json_real(r->vs[KIND_JE][1]), &ok);
  }
  for (size_t t = 0; t < NTC && ok; t++) {
    json_t *o = j_push(threads, &ok);
    if (!o)
      break;
    j_set(o, "threads", json_integer(thread_counts[t]), &ok);
    for (size_t k = 0; k < 3; k++) {
      char key[64];
      snprintf(key, sizeof(key), "%s_mpairs_per_s", scale_names[k]);
      j_set(o, key, json_real(rep->mpairs[t][k]), &ok);
      snprintf(key, sizeof(key), "%s_scaling", scale_names[k]);
      j_set(o, key, json_real(rep->scaling[t][k]), &ok);
    }
  }
  json_t *procs = json_object();
  j_set(root, "processes", procs, &ok);
  if (procs != NULL) {
    j_set(procs, "count", json_integer(BENCH_PROCS), &ok);
    if (rep->procs_scaling > 0) {
      j_set(procs, "gca_mpairs_per_s_alone", json_real(rep->procs_mpairs[0]), &ok);
      j_set(procs, "gca_mpairs_per_s", json_real(rep->procs_mpairs[1]), &ok);
      j_set(procs, "gca_scaling", json_real(rep->procs_scaling), &ok);
    } else {
      j_set(procs, "error", json_string(rep->procs_why), &ok);
    }
  }
  for (int pt = PAT_ALTERNATE; pt < NPATS && ok; pt++) {
    json_t *o = j_push(patterns, &ok);
    if (!o)
      break;
    j_set(o, "pattern", json_string(pattern_names[pt]), &ok);
    for (int nt = 1; nt <= 2; nt++) {
      for (size_t k = 0; k < 4; k++) {
        char key[64];
        snprintf(key, sizeof(key), nt == 1 ? "%s_ns" : "%s_ns_2t", pattern_kind_names[k]);
        j_set(o, key, json_real(rep->pattern_ns[nt - 1][pt][k]), &ok);
      }
      j_set(o, nt == 1 ? "ratio_jemalloc_1t" : "ratio_jemalloc_2t",
            json_real(rep->pattern_vs_je[nt - 1][pt]), &ok);
    }
  }
  j_set(root, "results", results, &ok);
  j_set(root, "threads", threads, &ok);
  j_set(root, "patterns", patterns, &ok);
  if (host)
    j_set(root, "host", host, &ok);
  char *text = ok ? json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  if (text == NULL)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "bench: JSON report: out of host memory");
  printf("%s\n", text);
  free(text);
  return GCA_OK;
}

/* One figure under free_cache:False when kind is KIND_EXACT, the caller's
 * settings again afterwards. */
static gca_status_t measure_in(int kind, int pattern, size_t size, int nthreads, double seconds,
                               gca_stream_t *streams, const char *saved, double *ns) {
  *ns = 0;
  if (kind == KIND_JE && !jem.malloc)
    return GCA_OK; /* no jemalloc: the cell stays empty */
  if (kind != KIND_EXACT)
    return measure_pattern(kind, pattern, size, nthreads, seconds, streams, ns);
  gca_status_t st = gca_set_config("free_cache:False");
  if (st != GCA_OK)
    return tool_error_gca(st, "bench: set_config");
  gca_status_t mst = measure_pattern(kind, pattern, size, nthreads, seconds, streams, ns);
  if ((st = gca_set_config(saved)) != GCA_OK)
    return tool_error_gca(st, "bench: restoring the settings '%s'", saved);
  return mst;
}

static gca_status_t run(double seconds, int rounds, bool json) {
  gca_status_t st;
  gca_stream_t streams[NTHREADS_MAX] = {NULL};
  int nstreams = 0;
  bench_procs_t bp = {0}; /* the process ceiling's partners, while they run */
  report_t *rep = calloc(1, sizeof(*rep));
  if (!rep)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
  char saved[1024];
  if ((st = gca_get_config(saved, sizeof(saved))) != GCA_OK) {
    tool_error_gca(st, "bench: get_config");
    goto out;
  }
  for (; nstreams < NTHREADS_MAX; nstreams++) {
    if ((st = gca_stream_create(&streams[nstreams], GCA_STREAM_NON_BLOCKING)) != GCA_OK) {
      tool_error_gca(st, "bench: stream_create");
      goto out;
    }
  }
  /* every 1-thread figure first: a single-threaded program's path (the free
   * cache); the first 2-thread figure engages the thread caches for good */
  static const int size_kinds[] = {KIND_GCA, KIND_MALLOC, KIND_JE};
  /* an untimed run of each first, four windows long: the first row would
   * otherwise pay the process's one-time costs (the allocators' first
   * touches, the device lock's bias streak, the core's clock coming up; on a
   * 2-core VM gca's first 0.2 s of 512 B pairs ran at 18-20 ns, the rest at
   * 12, and one window of warm-up left the 512 B row 1.4-1.7x jemalloc) */
  for (size_t k = 0; k < TOOL_ARRAY_SIZE(size_kinds); k++) {
    double ignored;
    TOOL_CHECK_GOTO(
        measure_in(size_kinds[k], PAT_SAME, sizes[0], 1, 4 * seconds, streams, saved, &ignored), st,
        out);
  }
  for (int nt = 1; nt <= 2; nt++) {
    for (size_t i = 0; i < NSIZES; i++) {
      double w[KINDS][ROUNDS_MAX] = {{0}};
      for (int r = 0; r < rounds; r++) {
        for (size_t k = 0; k < TOOL_ARRAY_SIZE(size_kinds); k++)
          TOOL_CHECK_GOTO(measure_in(size_kinds[k], PAT_SAME, sizes[i], nt, seconds, streams, saved,
                                     &w[size_kinds[k]][r]),
                          st, out);
        if (nt == 1)
          TOOL_CHECK_GOTO(measure_in(KIND_EXACT, PAT_SAME, sizes[i], 1, seconds, streams, saved,
                                     &w[KIND_EXACT][r]),
                          st, out);
      }
      bench_row_t *row = &rep->rows[i];
      row->vs[KIND_MALLOC][nt - 1] = paired(w[KIND_GCA], w[KIND_MALLOC], rounds, 1);
      row->vs[KIND_JE][nt - 1] = paired(w[KIND_GCA], w[KIND_JE], rounds, 1);
      if (nt == 1)
        row->vs[KIND_EXACT][0] = paired(w[KIND_EXACT], w[KIND_MALLOC], rounds, 1);
      for (size_t k = 0; k < TOOL_ARRAY_SIZE(size_kinds); k++)
        row->ns[size_kinds[k]][nt - 1] = median(w[size_kinds[k]], rounds);
      if (nt == 1)
        row->ns[KIND_EXACT][0] = median(w[KIND_EXACT], rounds);
    }
  }
  for (int nt = 1; nt <= 2; nt++)
    TOOL_CHECK_GOTO(measure(KIND_LOCK, 512, nt, seconds, streams, &rep->lock_ns[nt - 1]), st, out);
  /* each round measures every thread count, so a count's figure is paired
   * with the 1-thread one of its round */
  double sw[NTC][3][ROUNDS_MAX] = {{{0}}};
  /* and the process ceiling in the same rounds: Mpairs/s alone, all at once,
   * and the latter over the former */
  double pm[2][ROUNDS_MAX] = {{0}}, px[ROUNDS_MAX] = {0};
  bool procs = bench_procs_start(&bp, gca_device_backend_name());
  for (int r = 0; r < rounds; r++) {
    for (size_t t = 0; t < NTC; t++)
      for (size_t k = 0; k < 3; k++)
        TOOL_CHECK_GOTO(measure_in(scale_kinds[k], PAT_SAME, 4u << 10, thread_counts[t], seconds,
                                   streams, saved, &sw[t][k][r]),
                        st, out);
    double alone, both[BENCH_PROCS];
    if (procs && (procs = bench_procs_round(&bp, seconds, &alone, both))) {
      pm[0][r] = 1e3 / alone;
      for (int i = 0; i < BENCH_PROCS; i++)
        pm[1][r] += 1e3 / both[i];
      px[r] = pm[1][r] / pm[0][r];
    }
  }
  bench_procs_stop(&bp);
  if (procs) {
    rep->procs_scaling = median(px, rounds);
    for (int i = 0; i < 2; i++)
      rep->procs_mpairs[i] = median(pm[i], rounds);
  } else {
    snprintf(rep->procs_why, sizeof(rep->procs_why), "%s", bp.why);
    fprintf(stderr, "gca-bench: the %d-process ceiling is left out: %s\n", BENCH_PROCS, bp.why);
  }
  for (size_t t = 0; t < NTC; t++)
    for (size_t k = 0; k < 3; k++) /* ns per pair per thread: t x the 1-thread ns over t's */
      rep->scaling[t][k] = paired(sw[0][k], sw[t][k], rounds, thread_counts[t]);
  for (size_t t = 0; t < NTC; t++)
    for (size_t k = 0; k < 3; k++) {
      double ns = median(sw[t][k], rounds);
      rep->mpairs[t][k] = ns > 0 ? thread_counts[t] * 1e3 / ns : 0;
    }
  for (int nt = 1; nt <= 2; nt++) /* 2: what threads with mixed sizes share */
    for (int pt = PAT_ALTERNATE; pt < NPATS; pt++) {
      double w[4][ROUNDS_MAX] = {{0}};
      for (int r = 0; r < rounds; r++)
        for (size_t k = 0; k < 4; k++)
          TOOL_CHECK_GOTO(
              measure_in(pattern_kinds[k], pt, 4u << 10, nt, seconds, streams, saved, &w[k][r]), st,
              out);
      rep->pattern_vs_je[nt - 1][pt] = paired(w[0], w[3], rounds, 1);
      for (size_t k = 0; k < 4; k++)
        rep->pattern_ns[nt - 1][pt][k] = median(w[k], rounds);
    }
  TOOL_CHECK_GOTO(gca_get_stats(0, &rep->stats), st, out);
  json_t *host = NULL;
  rep->rounds = rounds;
  if (!json)
    print_table(rep);
  TOOL_CHECK_GOTO(gca__bench_host(seconds, json, json ? &host : NULL), st, out);
  if (json)
    TOOL_CHECK_GOTO(print_json(rep, seconds, host), st, out);
  st = GCA_OK;
out:
  bench_procs_stop(&bp);
  free(rep);
  if (gca_empty_cache() != GCA_OK)
    fprintf(stderr, "gca-bench: empty_cache: %s\n", gca_last_error());
  for (int i = 0; i < nstreams; i++)
    if (gca_stream_destroy(streams[i]) != GCA_OK)
      fprintf(stderr, "gca-bench: stream_destroy: %s\n", gca_last_error());
  return st;
}

/* gca-bench --partner (bench_procs.h): the thread-scaling table's 1-thread
 * loop (4 KiB pairs on a stream of its own), measured by the same code, on
 * request. */
typedef struct partner {
  gca_stream_t stream;
  bool warm;
} partner_t;

static gca_status_t partner_prepare(void *ctx, double seconds) {
  partner_t *p = ctx;
  gca_status_t st;
  if (p->stream == NULL && (st = gca_stream_create(&p->stream, GCA_STREAM_NON_BLOCKING)) != GCA_OK)
    return tool_error_gca(st, "bench partner: stream_create");
  if (!p->warm) { /* as the benchmark's own warm-up: four windows, untimed */
    double ignored;
    TOOL_CHECK(measure(KIND_GCA, 4u << 10, 1, 4 * seconds, &p->stream, &ignored));
    p->warm = true;
  }
  return GCA_OK;
}

static gca_status_t partner_window(void *ctx, double seconds, double *ns) {
  partner_t *p = ctx;
  return measure(KIND_GCA, 4u << 10, 1, seconds, &p->stream, ns);
}

static int partner_main(void) {
  static const bench_partner_ops_t ops = {partner_prepare, partner_window};
  partner_t p = {0};
  int rc = bench_partner_serve(&ops, &p);
  if (p.stream != NULL && gca_stream_destroy(p.stream) != GCA_OK) {
    fprintf(stderr, "gca-bench --partner: stream_destroy: %s\n", gca_last_error());
    rc = 1;
  }
  return rc;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: gca-bench [--seconds S] [--rounds R] [--json] [--help]\n"
          "  --seconds S   time per window, in (0, 60] (default 0.08)\n"
          "  --rounds R    windows per figure, its median, in [1, %d] (default 3)\n"
          "  --json        one JSON object instead of the table\n"
          "  --partner     (internal) serve the 2-process ceiling on stdin/stdout\n",
          ROUNDS_MAX);
}

int main(int argc, char **argv) {
  tool_jemalloc_load(&jem, argv); /* first: it may run the program again with room for its TLS */
  double seconds = 0.08;
  int rounds = 3;
  bool json = false;
  static const struct option longopts[] = {
      {"json", no_argument, NULL, 'j'},         {"seconds", required_argument, NULL, 's'},
      {"rounds", required_argument, NULL, 'r'}, {"help", no_argument, NULL, 'h'},
      {"partner", no_argument, NULL, 'p'},      {NULL, 0, NULL, 0}};
  bool partner = false;
  for (int c; (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
    if (c == 'p') {
      partner = true;
    } else if (c == 'j') {
      json = true;
    } else if (c == 's') {
      char *end = NULL;
      seconds = strtod(optarg, &end);
      if (!end || *end || !(seconds > 0 && seconds <= 60)) {
        fprintf(stderr, "gca-bench: --seconds '%s' is not in (0, 60]\n", optarg);
        return 2;
      }
    } else if (c == 'r') {
      char *end = NULL;
      long r = strtol(optarg, &end, 10);
      if (!end || end == optarg || *end || r < 1 || r > ROUNDS_MAX) {
        fprintf(stderr, "gca-bench: --rounds '%s' is not a whole number in [1, %d]\n", optarg,
                ROUNDS_MAX);
        return 2;
      }
      rounds = (int)r;
    } else {
      usage(c == 'h' ? stdout : stderr);
      return c == 'h' ? 0 : 2;
    }
  }
  if (optind < argc) {
    usage(stderr);
    return 2;
  }
  if (partner)
    return partner_main();
  gca_status_t st = run(seconds, rounds, json);
  if (st != GCA_OK) {
    fprintf(stderr, "gca-bench: %s\n", tool_last_error());
    return 1;
  }
  return 0;
}
