/* SPDX-License-Identifier: Apache-2.0 */
/* tc_workers.h - worker threads for the thread-cache tests
 * (test_alloc_thread_cache.c, test_alloc_tc_paths.c): each carries out one
 * command at a time (allocate, free, record a stream, run pairs, exit),
 * handed to it through a gate by the test's thread, which waits for it; no
 * sleeps. And the small facts those tests read about the caches. */
#ifndef GCA_TESTS_TC_WORKERS_H
#define GCA_TESTS_TC_WORKERS_H

#include <pthread.h>
#include <string.h>

#include "alloc_fixture.h"
#include "tcache.h"

/* The fixture's, with the thread caches alone in front of PyTorch's free
 * tree (recycle_bins:False), whose merges these tests' models follow; the
 * recycle bins behind the thread caches are tested in test_recycle_bins.c. */
__attribute__((unused)) static int tc_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("recycle_bins:False"));
  return 0;
}

enum { CMD_NONE, CMD_ALLOC, CMD_FREE, CMD_RECORD, CMD_PAIRS, CMD_EXIT };

typedef struct worker {
  pthread_t th;
  gca_stream_t stream;
  int cmd;
  size_t size;
  gca_stream_t on; /* CMD_ALLOC: the stream; CMD_RECORD: the stream recorded */
  void *ptr;
  gca_status_t st;
  bool done;
  long pairs;       /* CMD_PAIRS: how many (size bytes on `on`); 0: until `stop` */
  size_t alt;       /* CMD_PAIRS: if not 0, every other pair is of this size */
  atomic_bool stop; /* CMD_PAIRS with pairs 0: set by the test's thread */
  atomic_long pairs_done;
} worker_t;

/* CMD_PAIRS: allocations of w->size freed at once, the first failure's status. */
static inline gca_status_t run_pairs(worker_t *w) {
  for (long i = 0; w->pairs == 0 ? !atomic_load(&w->stop) : i < w->pairs; i++) {
    void *p;
    gca_status_t st = gca_malloc(&p, w->alt != 0 && (i & 1) ? w->alt : w->size, w->on);
    if (st == GCA_OK)
      st = gca_free(p);
    if (st != GCA_OK)
      return st;
    atomic_fetch_add(&w->pairs_done, 1);
  }
  return GCA_OK;
}

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;

static inline void *worker_main(void *arg) {
  worker_t *w = arg;
  for (;;) {
    pthread_mutex_lock(&gate_mu);
    while (w->cmd == CMD_NONE)
      pthread_cond_wait(&gate_cv, &gate_mu);
    int cmd = w->cmd;
    pthread_mutex_unlock(&gate_mu);
    gca_status_t st = GCA_OK;
    if (cmd == CMD_ALLOC)
      st = gca_malloc(&w->ptr, w->size, w->on);
    else if (cmd == CMD_FREE)
      st = gca_free(w->ptr);
    else if (cmd == CMD_RECORD)
      st = gca_record_stream(w->ptr, w->on);
    else if (cmd == CMD_PAIRS)
      st = run_pairs(w);
    pthread_mutex_lock(&gate_mu);
    w->st = st;
    w->cmd = CMD_NONE;
    w->done = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    if (cmd == CMD_EXIT)
      return NULL;
  }
}

/* Hands w one command; cmd_wait waits until it is carried out. */
static inline void cmd_post(worker_t *w, int cmd) {
  pthread_mutex_lock(&gate_mu);
  w->done = false;
  w->cmd = cmd;
  pthread_cond_broadcast(&gate_cv);
  pthread_mutex_unlock(&gate_mu);
}

static inline gca_status_t cmd_wait(worker_t *w) {
  pthread_mutex_lock(&gate_mu);
  while (!w->done)
    pthread_cond_wait(&gate_cv, &gate_mu);
  gca_status_t st = w->st;
  pthread_mutex_unlock(&gate_mu);
  return st;
}

/* Hands w one command and waits until it is carried out. */
static inline gca_status_t run_cmd(worker_t *w, int cmd) {
  cmd_post(w, cmd);
  return cmd_wait(w);
}

static inline void worker_start(worker_t *w) {
  memset(w, 0, sizeof(*w));
  assert_ok(gca_stream_create(&w->stream, GCA_STREAM_NON_BLOCKING));
  assert_int_equal(pthread_create(&w->th, NULL, worker_main, w), 0);
}

static inline void worker_exit(worker_t *w) {
  assert_ok(run_cmd(w, CMD_EXIT));
  pthread_join(w->th, NULL);
}

static inline void *w_alloc(worker_t *w, size_t size, gca_stream_t on) {
  w->size = size;
  w->on = on;
  assert_ok(run_cmd(w, CMD_ALLOC));
  assert_non_null(w->ptr);
  return w->ptr;
}

static inline void w_free(worker_t *w, void *p) {
  w->ptr = p;
  assert_ok(run_cmd(w, CMD_FREE));
}

/* w carries out n pairs of `size` bytes on its stream. */
static inline void w_pairs(worker_t *w, size_t size, long n) {
  w->size = size;
  w->on = w->stream;
  w->pairs = n;
  assert_ok(run_cmd(w, CMD_PAIRS));
}

static inline size_t tcaches_cached(void) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  size_t n = 0;
  for (gca__tcache_t *tc = d != NULL ? d->tcs : NULL; tc != NULL; tc = tc->next)
    n += tc->ncached - tc->hot_out; /* a streak's block that is out still counts */
  return n;
}

/* Two workers engage the thread caches; a worker's free goes into its own
 * cache and its next allocation of that size takes the block back. */
static inline void engage(worker_t *a, worker_t *b) {
  w_free(a, w_alloc(a, 4096, a->stream));
  w_free(b, w_alloc(b, 4096, b->stream));
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_true(d->tc_on);
}

/* Two workers started and engaged. */
static inline void engaged_workers(worker_t *a, worker_t *b) {
  worker_start(a);
  worker_start(b);
  engage(a, b);
}

/* Both workers' threads and streams gone. */
static inline void workers_done(worker_t *a, worker_t *b) {
  worker_exit(a);
  worker_exit(b);
  assert_ok(gca_stream_destroy(a->stream));
  assert_ok(gca_stream_destroy(b->stream));
}

/* The thread cache whose domain holds p. */
static inline gca__tcache_t *tcache_of(void *p) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  for (gca__tcache_t *tc = d->tcs; tc != NULL; tc = tc->next)
    if (gca__tc_find(tc, (gca_devptr_t)(uintptr_t)p) >= 0)
      return tc;
  return NULL;
}

/* The cache holding the block a's next 4 KiB request takes (a's own). */
static inline gca__tcache_t *cache_of_worker(worker_t *a) {
  w_free(a, w_alloc(a, 4096, a->stream)); /* into a's cache */
  void *x = w_alloc(a, 4096, a->stream);
  gca__tcache_t *tc = tcache_of(x);
  w_free(a, x);
  assert_non_null(tc);
  return tc;
}

#endif
