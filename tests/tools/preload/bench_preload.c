/* SPDX-License-Identifier: Apache-2.0 */
/* bench_preload.c - what the preload shim adds to an allocation: the time of a
 * cudaMalloc+cudaFree pair through libgca_preload.so against a
 * gca_malloc+gca_free pair called directly, both served from gca's cache.
 *
 * The shim is opened with dlopen (GCA_PRELOAD_LIB) and keeps its own copy of
 * gca, hidden inside it; this program links another copy for the direct
 * calls, so both sides run the same code on their own sim device. Prints
 * nanoseconds per pair (best of several rounds) for a few sizes; no
 * assertion on timings. Usage: bench_preload [pairs per round].
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "gca.h"

typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double time_shim(malloc_fn m, free_fn f, size_t size, long pairs) {
  uint64_t t0 = now_ns();
  for (long i = 0; i < pairs; i++) {
    void *p = NULL;
    if (m(&p, size) != cudaSuccess || f(p) != cudaSuccess) {
      fprintf(stderr, "bench_preload: cudaMalloc/cudaFree(%zu) failed\n", size);
      exit(1);
    }
  }
  return (double)(now_ns() - t0) / (double)pairs;
}

static double time_direct(size_t size, long pairs) {
  uint64_t t0 = now_ns();
  for (long i = 0; i < pairs; i++) {
    void *p = NULL;
    if (gca_malloc(&p, size, NULL) != GCA_OK || gca_free(p) != GCA_OK) {
      fprintf(stderr, "bench_preload: gca_malloc/gca_free(%zu) failed: %s\n", size,
              gca_last_error());
      exit(1);
    }
  }
  return (double)(now_ns() - t0) / (double)pairs;
}

int main(int argc, char **argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 200000;
  const char *path = getenv("GCA_PRELOAD_LIB");
  if (!path || !*path) {
    printf("SKIP: GCA_PRELOAD_LIB is not set\n");
    return 77;
  }
  void *shim = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!shim) {
    fprintf(stderr, "bench_preload: dlopen(%s): %s\n", path, dlerror());
    return 1;
  }
  malloc_fn shim_malloc = (malloc_fn)dlsym(shim, "cudaMalloc");
  free_fn shim_free = (free_fn)dlsym(shim, "cudaFree");
  if (!shim_malloc || !shim_free) {
    fprintf(stderr, "bench_preload: the shim lacks cudaMalloc/cudaFree\n");
    return 1;
  }
  if (gca_device_init() != GCA_OK) {
    printf("SKIP: no device backend: %s\n", gca_last_error());
    return 77;
  }
  static const size_t sizes[] = {512, 64 << 10, 8 << 20};
  const int rounds = 5;
  printf("bench_preload: %ld cached cudaMalloc+cudaFree pairs per round, best of %d, backend %s\n",
         pairs, rounds, gca_device_backend_name());
  printf("%10s %14s %14s %12s\n", "size", "shim ns/pair", "gca ns/pair", "added ns");
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    double best_shim = 1e30, best_direct = 1e30;
    time_shim(shim_malloc, shim_free, sizes[s], pairs / 10 + 1); /* warm both caches */
    time_direct(sizes[s], pairs / 10 + 1);
    for (int r = 0; r < rounds; r++) {
      double a = time_shim(shim_malloc, shim_free, sizes[s], pairs);
      double b = time_direct(sizes[s], pairs);
      best_shim = a < best_shim ? a : best_shim;
      best_direct = b < best_direct ? b : best_direct;
    }
    printf("%10zu %14.1f %14.1f %12.1f\n", sizes[s], best_shim, best_direct,
           best_shim - best_direct);
  }
  dlclose(shim);
  return 0;
}
