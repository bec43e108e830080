/* SPDX-License-Identifier: Apache-2.0 */
/* bench_host.c - gca-bench's host section: the cost of a cached pinned
 * allocation (gca_host_alloc + gca_host_free of one size, warm thread cache)
 * at 64 B to 64 MiB on one and two threads, next to glibc's malloc+free and
 * plain jemalloc's mallocx+dallocx (the same libjemalloc.so.2, default
 * arena and thread cache) in the same run; and the device-layer calls made
 * per GiB of pinned memory grown (1 GiB as 1 MiB blocks, then as 64 MiB
 * blocks, from an empty cache). Nothing is asserted.
 */
#include "bench_host.h"
#include "peer_jemalloc.h"
#include "util.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { KIND_HOST, KIND_GLIBC, KIND_JEMALLOC, NKINDS };
static const char *const kind_names[NKINDS] = {"gca_host", "glibc", "jemalloc"};
static const size_t hsizes[] = {64, 4u << 10, 64u << 10, 1u << 20, 8u << 20, 64u << 20};
#define NH    (sizeof(hsizes) / sizeof(hsizes[0]))
#define BATCH 256

static void *(*je_mallocx)(size_t, int);
static void (*je_dallocx)(void *, int);
/* Keeps the compiler from pairing away alloc and free, with no store to a
 * line the threads share (a global volatile moved between cores on every pair). */
static inline void escape(void *p) {
  __asm__ __volatile__("" : : "r"(p) : "memory");
}

typedef struct job {
  _Alignas(64) int kind; /* a line of its own: each thread writes its job */
  size_t size;
  double seconds;
  double ns;
  gca_status_t st;
} job_t;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static gca_status_t pair(int kind, size_t size) {
  void *p = NULL;
  switch (kind) {
  case KIND_HOST: {
    gca_status_t st = gca_host_alloc(&p, size);
    if (st != GCA_OK)
      return st;
    escape(p);
    return gca_host_free(p);
  }
  case KIND_GLIBC:
    p = malloc(size);
    escape(p);
    free(p);
    return GCA_OK;
  default:
    p = je_mallocx(size, 0);
    escape(p);
    je_dallocx(p, 0);
    return GCA_OK;
  }
}

static void *job_main(void *arg) {
  job_t *j = arg;
  for (int i = 0; i < 16 && j->st == GCA_OK; i++) /* warm the caches */
    j->st = pair(j->kind, j->size);
  long n = 0;
  double t0 = now(), t;
  do {
    for (int i = 0; i < BATCH && j->st == GCA_OK; i++)
      j->st = pair(j->kind, j->size);
    n += BATCH;
    t = now();
  } while (t - t0 < j->seconds && j->st == GCA_OK);
  j->ns = (t - t0) * 1e9 / (double)n;
  return NULL;
}

static gca_status_t measure(int kind, size_t size, int nt, double seconds, double *ns) {
  job_t jobs[2];
  pthread_t th[2];
  for (int i = 0; i < nt; i++) {
    jobs[i] = (job_t){.kind = kind, .size = size, .seconds = seconds};
    if (pthread_create(&th[i], NULL, job_main, &jobs[i]) != 0)
      return tool_error(GCA_ERR_INTERNAL, "bench: cannot start a thread");
  }
  double sum = 0;
  gca_status_t st = GCA_OK;
  for (int i = 0; i < nt; i++) {
    pthread_join(th[i], NULL);
    sum += jobs[i].ns;
    if (jobs[i].st != GCA_OK)
      st = jobs[i].st;
  }
  *ns = sum / nt;
  if (st != GCA_OK)
    return tool_error_gca(st, "bench: %s pair of %zu bytes", kind_names[kind], size);
  return GCA_OK;
}

/* Device calls per GiB grown by `block`-sized allocations from an empty cache. */
static gca_status_t grow(size_t block, double *calls_per_gib, double *reserved_gib) {
  size_t n = ((size_t)1 << 30) / block;
  void **v = calloc(n, sizeof(*v));
  if (!v)
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
  gca_status_t st = gca_host_empty_cache();
  gca_host_stats_t a, b;
  if (st == GCA_OK)
    st = gca_host_get_stats(&a);
  for (size_t i = 0; i < n && st == GCA_OK; i++)
    st = gca_host_alloc(&v[i], block);
  if (st == GCA_OK)
    st = gca_host_get_stats(&b);
  for (size_t i = 0; i < n; i++)
    if (v[i] && gca_host_free(v[i]) != GCA_OK && st == GCA_OK)
      st = GCA_ERR_INTERNAL;
  free(v);
  if (st != GCA_OK)
    return tool_error_gca(st, "bench: growing pinned memory by %zu-byte blocks", block);
  double gib = (double)(b.reserved_bytes.allocated - a.reserved_bytes.allocated) / (1u << 30);
  *reserved_gib = gib;
  *calls_per_gib = gib > 0 ? (double)(b.num_host_alloc - a.num_host_alloc) / gib : 0;
  return gca_host_empty_cache();
}

gca_status_t gca__bench_host(double seconds, bool json, json_t **out) {
  tool_jemalloc_t jem;
  bool have_je = tool_jemalloc_load(&jem, NULL); /* main made room for it */
  je_mallocx = have_je ? jem.mallocx : NULL;
  je_dallocx = have_je ? jem.dallocx : NULL;
  void *probe = NULL;
  gca_status_t pst = gca_host_alloc(&probe, 64);
  if (pst == GCA_OK)
    pst = gca_host_free(probe);
  if (!je_mallocx || !je_dallocx || pst != GCA_OK) {
    char why[768];
    snprintf(why, sizeof(why), "%s",
             pst != GCA_OK ? gca_last_error()
                           : "cannot load plain jemalloc (Debian's needs "
                             "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384)");
    if (!json) {
      printf("\npinned host memory: skipped: %s\n", why);
      return GCA_OK;
    }
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "skipped", json_string(why)) != 0) {
      json_decref(o);
      return tool_error(GCA_ERR_OUT_OF_MEMORY, "bench: JSON report: out of host memory");
    }
    *out = o;
    return GCA_OK;
  }
  double ns[NH][NKINDS][2];
  for (size_t i = 0; i < NH; i++)
    for (int k = 0; k < NKINDS; k++)
      for (int nt = 1; nt <= 2; nt++)
        TOOL_CHECK(measure(k, hsizes[i], nt, seconds, &ns[i][k][nt - 1]));
  double per_gib[2], grown[2];
  static const size_t blocks[2] = {1u << 20, 64u << 20};
  for (int i = 0; i < 2; i++)
    TOOL_CHECK(grow(blocks[i], &per_gib[i], &grown[i]));
  if (!json) {
    printf("\npinned host memory (pair = alloc + free, warm cache; ns per pair)\n");
    printf("%10s %10s %10s %10s %8s %10s %10s %10s %8s\n", "size", "host 1t", "glibc 1t",
           "jemalloc 1t", "host/je", "host 2t", "glibc 2t", "jemalloc 2t", "host/je");
    for (size_t i = 0; i < NH; i++)
      printf("%10zu %10.1f %10.1f %10.1f %8.2f %10.1f %10.1f %10.1f %8.2f\n", hsizes[i],
             ns[i][0][0], ns[i][1][0], ns[i][2][0], ns[i][0][0] / ns[i][2][0], ns[i][0][1],
             ns[i][1][1], ns[i][2][1], ns[i][0][1] / ns[i][2][1]);
    for (int i = 0; i < 2; i++)
      printf("device pinning calls per GiB grown by %zu MiB blocks: %.1f (%.2f GiB pinned)\n",
             blocks[i] >> 20, per_gib[i], grown[i]);
    return GCA_OK;
  }
  json_t *o = json_object(), *rows = json_array();
  bool ok = o && rows && json_object_set_new(o, "pair_latency", rows) == 0;
  for (size_t i = 0; i < NH && ok; i++) {
    json_t *r = json_object();
    ok = r && json_array_append_new(rows, r) == 0;
    ok = ok && json_object_set_new(r, "size_bytes", json_integer((json_int_t)hsizes[i])) == 0;
    for (int k = 0; k < NKINDS && ok; k++)
      for (int nt = 1; nt <= 2 && ok; nt++) {
        char key[64];
        snprintf(key, sizeof(key), "%s_pair_ns_%d_threads", kind_names[k], nt);
        ok = json_object_set_new(r, key, json_real(ns[i][k][nt - 1])) == 0;
      }
    for (int nt = 1; nt <= 2 && ok; nt++) {
      char key[64];
      snprintf(key, sizeof(key), "gca_host_over_jemalloc_%d_threads", nt);
      ok = json_object_set_new(r, key, json_real(ns[i][0][nt - 1] / ns[i][2][nt - 1])) == 0;
    }
  }
  ok =
      ok &&
      json_object_set_new(o, "device_calls_per_gib_grown_1mib_blocks", json_real(per_gib[0])) ==
          0 &&
      json_object_set_new(o, "device_calls_per_gib_grown_64mib_blocks", json_real(per_gib[1])) == 0;
  if (!ok) {
    json_decref(o);
    return tool_error(GCA_ERR_OUT_OF_MEMORY, "bench: JSON report: out of host memory");
  }
  *out = o;
  return GCA_OK;
}
