/* SPDX-License-Identifier: Apache-2.0 */
/* bench_alloc.c - gca-bench: the cost of a cached allocation, next to glibc.
 *
 *   gca-bench [--seconds S] [--json] [--help]
 *
 * For each size (512 B to 64 MiB) it times gca_malloc+gca_free pairs served
 * from a warm cache, on one thread and on two threads at once (each thread on
 * its own stream), and times malloc+free of the same sizes in the same run, so
 * the ratio is measured under the same machine load. "exact" is the single
 * thread pair with free_cache:False (PyTorch's placement: a split and a merge
 * on every pair) beside the default configuration. Each figure is the mean
 * over as many pairs as fit in S seconds (default 0.08) per measurement.
 * "shared lock" is the floor under any allocator that keeps one locked state
 * per device, as PyTorch's and gca's do: each pair is two critical sections
 * of a pthread mutex around four updates of shared counters, nothing else;
 * with two threads it shows what the lock's cache line and the counters'
 * moving between cores costs on this machine. (gca's own device lock is
 * internal; a pthread mutex is the lock any allocator could take, so the floor
 * is a property of the machine, not of gca's lock.) It uses the public API
 * only; the JSON report is written with jansson.
 * A host section follows (bench_host.c): pinned host pairs next to glibc and
 * plain jemalloc, and device pinning calls per GiB grown ("host" in JSON).
 * Nothing is asserted: the figures are printed for a person or a dashboard.
 */
#include <pthread.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "bench_host.h"
#include "gca.h"
#include "util.h"

#define NTHREADS_MAX 2
#define BATCH        256

static const size_t sizes[] = {512, 4u << 10, 64u << 10, 1u << 20, 8u << 20, 64u << 20};
#define NSIZES TOOL_ARRAY_SIZE(sizes)

enum { KIND_GCA = 0, KIND_MALLOC = 1, KIND_EXACT = 2, KIND_LOCK = 3, KINDS = 4 };

typedef struct bench_row {
  double ns[KINDS][NTHREADS_MAX]; /* [kind][threads-1]: ns per pair, mean over threads */
} bench_row_t;

typedef struct worker {
  int kind;
  size_t size;
  double seconds;
  gca_stream_t stream;
  pthread_barrier_t *barrier;
  uint64_t pairs, ns;
  gca_status_t status;
  char error[256];
} worker_t;

/* Keeps the compiler from pairing away malloc and free. */
static void *volatile sink;

static gca_status_t gca_pairs(worker_t *w, int n) {
  for (int i = 0; i < n; i++) {
    void *p = NULL;
    TOOL_CHECK_GCA(gca_malloc(&p, w->size, w->stream));
    sink = p;
    TOOL_CHECK_GCA(gca_free(p));
  }
  return GCA_OK;
}

static gca_status_t malloc_pairs(worker_t *w, int n) {
  for (int i = 0; i < n; i++) {
    void *p = malloc(w->size);
    if (!p)
      return tool_error(GCA_ERR_OUT_OF_MEMORY, "bench: malloc(%zu) failed", w->size);
    sink = p;
    free(p);
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
  switch (w->kind) {
  case KIND_MALLOC:
    return malloc_pairs(w, n);
  case KIND_LOCK:
    return lock_pairs(w, n);
  default:
    return gca_pairs(w, n);
  }
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  w->status = pairs(w, 64);
  pthread_barrier_wait(w->barrier);
  if (w->status != GCA_OK)
    goto out;
  uint64_t limit = (uint64_t)(w->seconds * 1e9), t0 = tool_now_ns(), t = t0;
  while (t - t0 < limit) {
    w->status = pairs(w, BATCH);
    if (w->status != GCA_OK)
      goto out;
    w->pairs += BATCH;
    t = tool_now_ns();
  }
  w->ns = t - t0;
out:
  if (w->status != GCA_OK)
    snprintf(w->error, sizeof(w->error), "%s", tool_last_error());
  return NULL;
}

static gca_status_t measure(int kind, size_t size, int nthreads, double seconds,
                            gca_stream_t *streams, double *ns_per_pair) {
  worker_t w[NTHREADS_MAX];
  pthread_t th[NTHREADS_MAX];
  pthread_barrier_t barrier;
  gca_status_t st = GCA_OK;
  pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
  for (int i = 0; i < nthreads; i++) {
    w[i] = (worker_t){
        .kind = kind, .size = size, .seconds = seconds, .stream = streams[i], .barrier = &barrier};
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
  double sum = 0;
  for (int i = 0; i < nthreads; i++) {
    if (w[i].status != GCA_OK)
      return tool_error(w[i].status, "bench: %zu-byte pairs on thread %d: %s", size, i, w[i].error);
    sum += w[i].pairs ? (double)w[i].ns / (double)w[i].pairs : 0;
  }
  *ns_per_pair = sum / nthreads;
  return GCA_OK;
}

static void size_name(size_t size, char *buf, size_t len) {
  if (size >= (1u << 20))
    snprintf(buf, len, "%zu MiB", size >> 20);
  else if (size >= (1u << 10))
    snprintf(buf, len, "%zu KiB", size >> 10);
  else
    snprintf(buf, len, "%zu B", size);
}

static double ratio(double a, double b) {
  return b > 0 ? a / b : 0;
}

static void print_table(const bench_row_t *rows, const double *lock_ns) {
  printf("ns per alloc+free pair, warm cache (2 threads: mean per thread, each on its own "
         "stream)\n");
  printf("%-8s %10s %10s %8s %10s %8s %10s %10s %8s\n", "size", "gca 1T", "malloc 1T", "ratio",
         "exact 1T", "ratio", "gca 2T", "malloc 2T", "ratio");
  for (size_t i = 0; i < NSIZES; i++) {
    char name[32];
    size_name(sizes[i], name, sizeof(name));
    const bench_row_t *r = &rows[i];
    printf("%-8s %10.1f %10.1f %8.2f %10.1f %8.2f %10.1f %10.1f %8.2f\n", name, r->ns[KIND_GCA][0],
           r->ns[KIND_MALLOC][0], ratio(r->ns[KIND_GCA][0], r->ns[KIND_MALLOC][0]),
           r->ns[KIND_EXACT][0], ratio(r->ns[KIND_EXACT][0], r->ns[KIND_MALLOC][0]),
           r->ns[KIND_GCA][1], r->ns[KIND_MALLOC][1],
           ratio(r->ns[KIND_GCA][1], r->ns[KIND_MALLOC][1]));
  }
  printf("ratio = gca / malloc (below 1: gca is faster); exact = free_cache:False\n");
  printf("shared lock floor (pthread mutex, two critical sections per pair, no allocator): "
         "1T %.1f ns, 2T %.1f ns\n",
         lock_ns[0], lock_ns[1]);
}

/* Sets o[key] = v, noting a failure (v NULL: jansson out of memory, or a
 * number that is not finite) in *ok. */
static void j_set(json_t *o, const char *key, json_t *v, bool *ok) {
  if (v == NULL || json_object_set_new(o, key, v) != 0)
    *ok = false;
}

static gca_status_t print_json(const bench_row_t *rows, const double *lock_ns, double seconds,
                               json_t *host) {
  bool ok = true;
  const char *backend = gca_device_backend_name();
  json_t *root = json_object(), *results = json_array();
  if (root == NULL || results == NULL) {
    json_decref(root);
    json_decref(results);
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "bench: JSON report: out of host memory");
  }
  j_set(root, "backend", backend ? json_string(backend) : json_null(), &ok);
  j_set(root, "seconds_per_measurement", json_real(seconds), &ok);
  j_set(root, "lock_ns_1t", json_real(lock_ns[0]), &ok);
  j_set(root, "lock_ns_2t", json_real(lock_ns[1]), &ok);
  for (size_t i = 0; i < NSIZES && ok; i++) {
    const bench_row_t *r = &rows[i];
    json_t *o = json_object();
    if (o == NULL || json_array_append_new(results, o) != 0) {
      ok = false;
      break;
    }
    j_set(o, "size", json_integer((json_int_t)sizes[i]), &ok);
    j_set(o, "gca_ns_1t", json_real(r->ns[KIND_GCA][0]), &ok);
    j_set(o, "malloc_ns_1t", json_real(r->ns[KIND_MALLOC][0]), &ok);
    j_set(o, "ratio_1t", json_real(ratio(r->ns[KIND_GCA][0], r->ns[KIND_MALLOC][0])), &ok);
    j_set(o, "exact_ns_1t", json_real(r->ns[KIND_EXACT][0]), &ok);
    j_set(o, "ratio_exact_1t", json_real(ratio(r->ns[KIND_EXACT][0], r->ns[KIND_MALLOC][0])), &ok);
    j_set(o, "gca_ns_2t", json_real(r->ns[KIND_GCA][1]), &ok);
    j_set(o, "malloc_ns_2t", json_real(r->ns[KIND_MALLOC][1]), &ok);
    j_set(o, "ratio_2t", json_real(ratio(r->ns[KIND_GCA][1], r->ns[KIND_MALLOC][1])), &ok);
  }
  j_set(root, "results", results, &ok);
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

static gca_status_t run(double seconds, bool json) {
  gca_status_t st;
  gca_stream_t streams[NTHREADS_MAX] = {NULL, NULL};
  int nstreams = 0;
  bench_row_t rows[NSIZES];
  double lock_ns[NTHREADS_MAX] = {0, 0};
  memset(rows, 0, sizeof(rows));
  char saved[1024];
  TOOL_CHECK_GCA(gca_get_config(saved, sizeof(saved)));
  for (; nstreams < NTHREADS_MAX; nstreams++) {
    if ((st = gca_stream_create(&streams[nstreams], GCA_STREAM_NON_BLOCKING)) != GCA_OK) {
      tool_error_gca(st, "bench: stream_create");
      goto out;
    }
  }
  for (size_t i = 0; i < NSIZES; i++) {
    for (int nt = 1; nt <= NTHREADS_MAX; nt++) {
      TOOL_CHECK_GOTO(
          measure(KIND_GCA, sizes[i], nt, seconds, streams, &rows[i].ns[KIND_GCA][nt - 1]), st,
          out);
      TOOL_CHECK_GOTO(
          measure(KIND_MALLOC, sizes[i], nt, seconds, streams, &rows[i].ns[KIND_MALLOC][nt - 1]),
          st, out);
    }
    if ((st = gca_set_config("free_cache:False")) != GCA_OK) {
      tool_error_gca(st, "bench: set_config");
      goto out;
    }
    gca_status_t mst =
        measure(KIND_EXACT, sizes[i], 1, seconds, streams, &rows[i].ns[KIND_EXACT][0]);
    if ((st = gca_set_config(saved)) != GCA_OK) { /* the caller's settings again */
      tool_error_gca(st, "bench: restoring the settings '%s'", saved);
      goto out;
    }
    TOOL_CHECK_GOTO(mst, st, out);
  }
  for (int nt = 1; nt <= NTHREADS_MAX; nt++)
    TOOL_CHECK_GOTO(measure(KIND_LOCK, 512, nt, seconds, streams, &lock_ns[nt - 1]), st, out);
  json_t *host = NULL;
  if (!json)
    print_table(rows, lock_ns);
  TOOL_CHECK_GOTO(gca__bench_host(seconds, json, json ? &host : NULL), st, out);
  if (json)
    TOOL_CHECK_GOTO(print_json(rows, lock_ns, seconds, host), st, out);
  st = GCA_OK;
out:
  if (gca_empty_cache() != GCA_OK)
    fprintf(stderr, "gca-bench: empty_cache: %s\n", gca_last_error());
  for (int i = 0; i < nstreams; i++)
    if (gca_stream_destroy(streams[i]) != GCA_OK)
      fprintf(stderr, "gca-bench: stream_destroy: %s\n", gca_last_error());
  return st;
}

static void usage(FILE *f) {
  fprintf(f, "usage: gca-bench [--seconds S] [--json] [--help]\n"
             "  --seconds S   time per figure, in (0, 60] (default 0.08)\n"
             "  --json        one JSON object instead of the table\n");
}

int main(int argc, char **argv) {
  double seconds = 0.08;
  bool json = false;
  static const struct option longopts[] = {{"json", no_argument, NULL, 'j'},
                                           {"seconds", required_argument, NULL, 's'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
    if (c == 'j') {
      json = true;
    } else if (c == 's') {
      char *end = NULL;
      seconds = strtod(optarg, &end);
      if (!end || *end || !(seconds > 0 && seconds <= 60)) {
        fprintf(stderr, "gca-bench: --seconds '%s' is not in (0, 60]\n", optarg);
        return 2;
      }
    } else {
      usage(c == 'h' ? stdout : stderr);
      return c == 'h' ? 0 : 2;
    }
  }
  if (optind < argc) {
    usage(stderr);
    return 2;
  }
  gca_status_t st = run(seconds, json);
  if (st != GCA_OK) {
    fprintf(stderr, "gca-bench: %s\n", tool_last_error());
    return 1;
  }
  return 0;
}
