/* bench_alloc.c - gca-bench: the cost of a cached allocation, next to glibc.
 *
 *   gca-bench [--seconds S] [--json]
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
 * of gca's device lock type around four updates of shared counters, nothing
 * else; with two threads it shows what the lock's cache line and the
 * counters' moving between cores costs on this machine.
 * Nothing is asserted: the figures are printed for a person or a dashboard.
 */
#include <pthread.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "common.h"
#include "device.h"
#include "json.h"
#include "lock.h"

#define NTHREADS_MAX 2
#define BATCH        256

static const size_t sizes[] = {512, 4u << 10, 64u << 10, 1u << 20, 8u << 20, 64u << 20};
#define NSIZES GCA_ARRAY_SIZE(sizes)

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
    GCA_CHECK(gca_malloc(&p, w->size, w->stream));
    sink = p;
    GCA_CHECK(gca_free(p));
  }
  return GCA_OK;
}

static gca_status_t malloc_pairs(worker_t *w, int n) {
  for (int i = 0; i < n; i++) {
    void *p = malloc(w->size);
    if (!p)
      return gca__error(GCA_ERR_OUT_OF_MEMORY, "bench: malloc(%zu) failed", w->size);
    sink = p;
    free(p);
  }
  return GCA_OK;
}

/* The shared lock floor: one lock and a line of counters, as a device's. */
static gca__mutex_t floor_lock;
static struct { _Alignas(64) int64_t current, peak, allocated, freed; } floor_stats;

static gca_status_t lock_pairs(worker_t *w, int n) {
  for (int i = 0; i < n; i++) {
    gca__mutex_lock(&floor_lock);
    floor_stats.current += (int64_t)w->size;
    floor_stats.allocated += (int64_t)w->size;
    if (floor_stats.current > floor_stats.peak)
      floor_stats.peak = floor_stats.current;
    gca__mutex_unlock(&floor_lock);
    gca__mutex_lock(&floor_lock);
    floor_stats.current -= (int64_t)w->size;
    floor_stats.freed += (int64_t)w->size;
    gca__mutex_unlock(&floor_lock);
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
  uint64_t limit = (uint64_t)(w->seconds * 1e9), t0 = gca__now_ns(), t = t0;
  while (t - t0 < limit) {
    w->status = pairs(w, BATCH);
    if (w->status != GCA_OK)
      goto out;
    w->pairs += BATCH;
    t = gca__now_ns();
  }
  w->ns = t - t0;
out:
  if (w->status != GCA_OK)
    snprintf(w->error, sizeof(w->error), "%s", gca_last_error());
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
      st = gca__error(GCA_ERR_INTERNAL, "bench: pthread_create failed");
      break;
    }
  }
  if (st == GCA_OK)
    worker_main(&w[nthreads - 1]);
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
  GCA_CHECK(st);
  double sum = 0;
  for (int i = 0; i < nthreads; i++) {
    if (w[i].status != GCA_OK)
      return gca__error(w[i].status, "bench: %zu-byte pairs on thread %d: %s", size, i, w[i].error);
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
  printf("shared lock floor (two critical sections per pair, no allocator): 1T %.1f ns, 2T %.1f "
         "ns\n",
         lock_ns[0], lock_ns[1]);
}

static gca_status_t print_json(const bench_row_t *rows, const double *lock_ns, double seconds) {
  gca_json_writer_t w;
  gca__json_writer_init(&w);
  gca__json_object_begin(&w);
  gca__json_key(&w, "backend");
  gca__json_string(&w, gca_device_backend_name());
  gca__json_key(&w, "seconds_per_measurement");
  gca__json_double(&w, seconds);
  gca__json_key(&w, "lock_ns_1t");
  gca__json_double(&w, lock_ns[0]);
  gca__json_key(&w, "lock_ns_2t");
  gca__json_double(&w, lock_ns[1]);
  gca__json_key(&w, "results");
  gca__json_array_begin(&w);
  for (size_t i = 0; i < NSIZES; i++) {
    const bench_row_t *r = &rows[i];
    gca__json_object_begin(&w);
    gca__json_key(&w, "size");
    gca__json_uint(&w, sizes[i]);
    gca__json_key(&w, "gca_ns_1t");
    gca__json_double(&w, r->ns[KIND_GCA][0]);
    gca__json_key(&w, "malloc_ns_1t");
    gca__json_double(&w, r->ns[KIND_MALLOC][0]);
    gca__json_key(&w, "ratio_1t");
    gca__json_double(&w, ratio(r->ns[KIND_GCA][0], r->ns[KIND_MALLOC][0]));
    gca__json_key(&w, "exact_ns_1t");
    gca__json_double(&w, r->ns[KIND_EXACT][0]);
    gca__json_key(&w, "ratio_exact_1t");
    gca__json_double(&w, ratio(r->ns[KIND_EXACT][0], r->ns[KIND_MALLOC][0]));
    gca__json_key(&w, "gca_ns_2t");
    gca__json_double(&w, r->ns[KIND_GCA][1]);
    gca__json_key(&w, "malloc_ns_2t");
    gca__json_double(&w, r->ns[KIND_MALLOC][1]);
    gca__json_key(&w, "ratio_2t");
    gca__json_double(&w, ratio(r->ns[KIND_GCA][1], r->ns[KIND_MALLOC][1]));
    gca__json_object_end(&w);
  }
  gca__json_array_end(&w);
  gca__json_object_end(&w);
  char *text = NULL;
  GCA_CHECK(gca__json_writer_finish(&w, &text, NULL));
  printf("%s\n", text);
  free(text);
  return GCA_OK;
}

static gca_status_t run(double seconds, bool json) {
  gca_status_t st;
  const gca_device_ops_t *ops = gca__device_get(&st);
  if (!ops)
    return gca__error_prefix(st, "bench: device layer");
  gca_stream_t streams[NTHREADS_MAX] = {NULL, NULL};
  int nstreams = 0;
  bench_row_t rows[NSIZES];
  double lock_ns[NTHREADS_MAX] = {0, 0};
  memset(rows, 0, sizeof(rows));
  gca__mutex_init(&floor_lock);
  char saved[1024];
  GCA_CHECK(gca_get_config(saved, sizeof(saved)));
  for (; nstreams < NTHREADS_MAX; nstreams++)
    GCA_CHECK_GOTO(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &streams[nstreams]), st, out);
  for (size_t i = 0; i < NSIZES; i++) {
    for (int nt = 1; nt <= NTHREADS_MAX; nt++) {
      GCA_CHECK_GOTO(
          measure(KIND_GCA, sizes[i], nt, seconds, streams, &rows[i].ns[KIND_GCA][nt - 1]), st,
          out);
      GCA_CHECK_GOTO(
          measure(KIND_MALLOC, sizes[i], nt, seconds, streams, &rows[i].ns[KIND_MALLOC][nt - 1]),
          st, out);
    }
    GCA_CHECK_GOTO(gca_set_config("free_cache:False"), st, out);
    gca_status_t mst =
        measure(KIND_EXACT, sizes[i], 1, seconds, streams, &rows[i].ns[KIND_EXACT][0]);
    GCA_CHECK_GOTO(gca_set_config(saved), st, out); /* the caller's settings again */
    GCA_CHECK_GOTO(mst, st, out);
  }
  for (int nt = 1; nt <= NTHREADS_MAX; nt++)
    GCA_CHECK_GOTO(measure(KIND_LOCK, 512, nt, seconds, streams, &lock_ns[nt - 1]), st, out);
  if (json)
    GCA_CHECK_GOTO(print_json(rows, lock_ns, seconds), st, out);
  else
    print_table(rows, lock_ns);
  st = GCA_OK;
out:
  gca_empty_cache();
  for (int i = 0; i < nstreams; i++)
    ops->stream_destroy(streams[i]);
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
    fprintf(stderr, "gca-bench: %s\n", gca_last_error());
    return 1;
  }
  return 0;
}
