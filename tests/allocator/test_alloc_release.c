/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_release.c - giving memory back without waiting under the device
 * lock (Note [No waits under the device lock]), and releases and frees that
 * meet a destroyed stream.
 *
 * The one idea: the device table is wrapped so that each waiting operation
 * (event_synchronize, stream_synchronize, ctx_synchronize, mem_free) opens a
 * gate as it starts to wait. A host function queued on a stream waits for
 * that gate and only then calls gca_free: if the waiting thread still held
 * the device lock, that free could never take it and the wait could never
 * end. Everything is ordered by gates; a watchdog (a timed wait of a minute)
 * turns a hang into a failure. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "alloc_fixture.h"

/* ---- gates ---- */

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;
} gate_t;

static void gate_init(gate_t *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = false;
}

static void gate_open(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Waits for the gate; false when the watchdog (60 s) ran out first. */
static bool gate_wait(gate_t *g) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += 60;
  int rc = 0;
  pthread_mutex_lock(&g->mu);
  while (!g->open && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&g->cv, &g->mu, &t);
  bool open = g->open;
  pthread_mutex_unlock(&g->mu);
  return open;
}

/* ---- the wrapped device table ---- */

static gca_device_ops_t wrapped;
static const gca_device_ops_t *real;
static gate_t waiting; /* opened by the first waiting operation after arming */
static atomic_bool armed;

static void note_wait(void) {
  if (atomic_exchange(&armed, false))
    gate_open(&waiting);
}

static gca_status_t w_event_synchronize(gca_event_t e) {
  note_wait();
  return real->event_synchronize(e);
}
static gca_status_t w_stream_synchronize(gca_stream_t s) {
  note_wait();
  return real->stream_synchronize(s);
}
static atomic_int nctx_syncs;
static gca_status_t w_ctx_synchronize(int dev) {
  atomic_fetch_add(&nctx_syncs, 1);
  note_wait();
  return real->ctx_synchronize(dev);
}
static gca_status_t w_mem_free(int dev, gca_devptr_t p) {
  note_wait();
  return real->mem_free(dev, p);
}

static int release_setup(void **state) {
  alloc_setup(state);
  real = ops;
  wrapped = *real;
  wrapped.event_synchronize = w_event_synchronize;
  wrapped.stream_synchronize = w_stream_synchronize;
  wrapped.ctx_synchronize = w_ctx_synchronize;
  wrapped.mem_free = w_mem_free;
  gca__device_override(&wrapped);
  gca__allocator_reset();
  gate_init(&waiting);
  atomic_store(&armed, false);
  return 0;
}

static int release_teardown(void **state) {
  alloc_teardown(state);
  gca__device_override(real);
  return 0;
}

/* ---- a host function that frees while another thread waits ---- */

typedef struct freer {
  void *p;
  gca_status_t st;
  bool timed_out;
  gate_t freed, done; /* freed: opened by it; done: opened by the test */
} freer_t;

/* Queued on a stream: waits until some thread waits for the device, frees p,
 * says so, and holds the stream until the test opens `done`. */
static void free_from_host_fn(void *arg) {
  freer_t *f = arg;
  if (!gate_wait(&waiting)) {
    f->timed_out = true;
    gate_open(&f->freed);
    return;
  }
  f->st = gca_free(f->p);
  gate_open(&f->freed);
  if (!gate_wait(&f->done))
    f->timed_out = true;
}

typedef struct job {
  gca_status_t (*fn)(struct job *);
  gca_status_t st;
  void *out;
  size_t size;
  gca_stream_t stream;
  const gca_pool_state_t *state;
} job_t;

static void *run_job(void *arg) {
  job_t *j = arg;
  j->st = j->fn(j);
  return NULL;
}

static gca_status_t job_empty_cache(job_t *j) {
  (void)j;
  return gca_empty_cache();
}

static gca_status_t job_malloc(job_t *j) {
  return gca_malloc(&j->out, j->size, j->stream);
}

/* Queues the freer of p on s, runs job on another thread, and checks that the
 * free from the host function went through while the job waited. */
/* While the job waits for the device (after the host function freed, before
 * the test lets the stream go on), `probe` runs on the test thread; it must
 * not assert (an assertion there would leave the stream held): it records. */
typedef void (*probe_fn)(void *ctx);
static probe_fn during_probe;
static void *during_ctx;

static void free_during(job_t *job, void *p, gca_stream_t s) {
  freer_t f = {.p = p};
  gate_init(&f.freed);
  gate_init(&f.done);
  assert_ok(gca_launch_host_func(s, free_from_host_fn, &f));
  atomic_store(&armed, true);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_job, job), 0);
  bool freed = gate_wait(&f.freed);
  if (freed && !f.timed_out && during_probe != NULL)
    during_probe(during_ctx);
  during_probe = NULL;
  gate_open(&f.done);
  if (!freed || f.timed_out)
    fail_msg("the free from a host function did not complete while another thread waited "
             "for the device (a wait under the device lock?)");
  pthread_join(t, NULL);
  assert_ok(f.st);
  assert_ok(gca_stream_synchronize(s));
  check();
}

static void host_fn_free_completes_during_empty_cache(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4096, s);
  void *q = alloc_on(30 * MiB, s);
  free_ok(q); /* a cached whole segment: empty_cache gives it back (mem_free waits) */
  job_t job = {.fn = job_empty_cache};
  free_during(&job, p, s);
  assert_ok(job.st);
  assert_int_equal(stats().num_device_free, 1);
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
}

static void host_fn_free_completes_during_the_oom_retry(void **state) {
  (void)state;
  assert_ok(gca_sim_set_capacity(0, 64 * MiB));
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4096, s);
  void *q = alloc_on(30 * MiB, s);
  free_ok(q); /* 2 + 30 MiB reserved: 40 more fit only once q's segment is given back */
  job_t job = {.fn = job_malloc, .size = 40 * MiB, .stream = s};
  free_during(&job, p, s);
  assert_ok(job.st);
  gca_stats_t st = stats();
  assert_int_equal(st.num_alloc_retries, 1);
  assert_int_equal(st.num_ooms, 0);
  free_ok(job.out);
  assert_ok(gca_empty_cache());
  assert_ok(gca_stream_destroy(s));
}

static void host_fn_free_completes_during_pending_sync(void **state) {
  (void)state;
  gca_stream_t s, u;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4096, s);
  void *r = alloc_on(4096, NULL);
  assert_ok(gca_record_stream(r, s));
  freer_t f = {.p = p};
  gate_init(&f.freed);
  gate_init(&f.done);
  assert_ok(gca_launch_host_func(s, free_from_host_fn, &f));
  free_ok(r); /* pending on an event of s, behind the host function */
  atomic_store(&armed, true);
  job_t job = {.fn = job_empty_cache};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_job, &job), 0);
  bool freed = gate_wait(&f.freed);
  if (freed && !f.timed_out && during_probe != NULL)
    during_probe(during_ctx);
  during_probe = NULL;
  gate_open(&f.done);
  if (!freed || f.timed_out)
    fail_msg("the free from a host function did not complete during empty_cache's event wait");
  pthread_join(t, NULL);
  assert_ok(f.st);
  assert_ok(job.st);
  assert_int_equal(stats().num_sync_all_streams, 1);
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(u));
}

/* ---- private pools and caching off ---- */

static gca_status_t job_pool_release(job_t *j) {
  return gca_pool_release(j->out);
}

static gca_status_t job_free(job_t *j) {
  return gca_free(j->out);
}

static void host_fn_free_completes_during_pool_destruction(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool;
  gca_pool_options_t opts = GCA_POOL_OPTIONS_INIT;
  assert_ok(gca_pool_create(0, &opts, &pool));
  assert_ok(gca_pool_use_begin(pool));
  void *q = alloc_on(30 * MiB, s);
  assert_ok(gca_pool_use_end(pool));
  free_ok(q); /* the pool's whole segment: its release (mem_free) waits */
  void *p = alloc_on(4096, s);
  job_t job = {.fn = job_pool_release, .out = pool};
  free_during(&job, p, s);
  assert_ok(job.st);
  assert_int_equal(stats().num_device_free, 1);
  int count;
  assert_int_equal(gca_pool_use_count(pool, &count), GCA_ERR_INVALID_HANDLE);
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
}

static void host_fn_free_completes_during_a_free_with_caching_off(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4096, s);
  void *q = alloc_on(30 * MiB, s);
  assert_ok(gca_set_caching(false));
  job_t job = {.fn = job_free, .out = q}; /* q's segment goes back at once (mem_free waits) */
  free_during(&job, p, s);
  assert_ok(job.st);
  assert_int_equal(stats().segment[GCA_STAT_LARGE].current, 0);
  assert_ok(gca_set_caching(true));
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
}

static void host_fn_free_completes_during_a_used_block_free_with_caching_off(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4096, s);
  void *q = alloc_on(4096, NULL);
  assert_ok(gca_record_stream(q, s)); /* the free waits for s (stream_synchronize) */
  assert_ok(gca_set_caching(false));
  job_t job = {.fn = job_free, .out = q};
  free_during(&job, p, s);
  assert_ok(job.st);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
  /* q's segment, and p's, left by the host function's refused release */
  assert_int_equal(stats().num_device_free, 2);
  assert_ok(gca_set_caching(true));
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
}

/* ---- checkpoints ---- */

static gca_status_t job_restore(job_t *j) {
  gca_pool_changes_t c;
  gca_status_t st = gca_pool_restore(j->out, j->state, &c);
  if (st == GCA_OK)
    gca_pool_changes_free(&c);
  return st;
}

static void host_fn_free_completes_during_restore_trim(void **state) {
  (void)state;
  assert_ok(gca_set_config("expandable_segments:True"));
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool;
  gca_pool_options_t opts = GCA_POOL_OPTIONS_INIT;
  assert_ok(gca_pool_create(0, &opts, &pool));
  gca_pool_state_t *saved;
  assert_ok(gca_pool_checkpoint(pool, &saved)); /* nothing mapped */
  assert_ok(gca_pool_use_begin(pool));
  void *q = alloc_on(30 * MiB, s);
  assert_ok(gca_pool_use_end(pool));
  free_ok(q); /* mapped since the checkpoint: the restore unmaps it after waiting for s */
  void *p = alloc_on(4096, s);
  job_t job = {.fn = job_restore, .out = pool, .state = saved};
  free_during(&job, p, s);
  assert_ok(job.st);
  size_t reserved;
  assert_ok(gca_pool_memory(pool, &reserved, NULL));
  assert_int_equal(reserved, 0);
  gca_pool_state_free(saved);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_empty_cache());
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_set_config(""));
}

static gca_status_t job_suspend(job_t *j) {
  return gca_pool_suspend(j->out, GCA_POOL_SUSPEND_SAVE);
}

static gca_status_t job_resume(job_t *j) {
  return gca_pool_resume(j->out);
}

/* A pool with one live 30 MiB block (expandable) whose bytes are 0x5a. */
static gca_pool_t *pool_with_block(gca_stream_t s, void **q) {
  assert_ok(gca_set_config("expandable_segments:True"));
  gca_pool_t *pool;
  gca_pool_options_t opts = GCA_POOL_OPTIONS_INIT;
  assert_ok(gca_pool_create(0, &opts, &pool));
  assert_ok(gca_pool_use_begin(pool));
  *q = alloc_on(30 * MiB, s);
  assert_ok(gca_pool_use_end(pool));
  assert_ok(gca_memset_d8(*q, 0x5a, 30 * MiB));
  return pool;
}

static void expect_bytes(void *q, unsigned char v) {
  unsigned char b[2];
  assert_ok(gca_memcpy(b, q, 1));
  assert_ok(gca_memcpy(b + 1, (char *)q + 30 * MiB - 1, 1));
  assert_int_equal(b[0], v);
  assert_int_equal(b[1], v);
}

static void release_pool_with_block(gca_pool_t *pool, void *q, gca_stream_t s) {
  free_ok(q);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_set_config(""));
}

/* What the probe saw while the pool was being suspended. */
typedef struct busy_probe {
  gca_pool_t *pool;
  gca_status_t st[4];
  char msg[4][256];
  void *r;
} busy_probe_t;

static void probe_note(busy_probe_t *b, int i, gca_status_t st) {
  b->st[i] = st;
  snprintf(b->msg[i], sizeof(b->msg[i]), "%s", gca_last_error());
}

static void probe_busy_pool(void *ctx) {
  busy_probe_t *b = ctx;
  gca_pool_state_t *state = NULL;
  probe_note(b, 0, gca_pool_suspend(b->pool, GCA_POOL_SUSPEND_SAVE));
  probe_note(b, 1, gca_pool_resume(b->pool));
  probe_note(b, 2, gca_pool_checkpoint(b->pool, &state));
  gca_pool_state_free(state);
  if (gca_pool_use_begin(b->pool) == GCA_OK) {
    probe_note(b, 3, gca_malloc(&b->r, 4096, NULL));
    GCA_CHECK_IGNORE(gca_pool_use_end(b->pool));
  } else {
    probe_note(b, 3, GCA_ERR_INTERNAL);
  }
}

static void host_fn_free_completes_during_pool_suspend(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *q;
  gca_pool_t *pool = pool_with_block(s, &q);
  void *p = alloc_on(4096, s); /* default pool: freed by the host function */
  job_t job = {.fn = job_suspend, .out = pool};
  /* meanwhile everything that would touch the pool's mappings is refused,
   * naming its state (Note [Suspend and resume with the lock let go]) */
  busy_probe_t b = {.pool = pool};
  during_probe = probe_busy_pool;
  during_ctx = &b;
  free_during(&job, p, s); /* the suspend waits for the device, then for the copies */
  assert_ok(job.st);
  for (int i = 0; i < 4; i++) {
    if (b.st[i] != GCA_ERR_INVALID_STATE || strstr(b.msg[i], "is being suspended") == NULL)
      fail_msg("call %d on a pool being suspended: %s: '%s'", i, gca_status_name(b.st[i]),
               b.msg[i]);
  }
  assert_null(b.r);
  size_t reserved;
  assert_ok(gca_pool_memory(pool, &reserved, NULL));
  assert_int_equal(reserved, 0);
  assert_ok(gca_pool_resume(pool));
  expect_bytes(q, 0x5a);
  check();
  release_pool_with_block(pool, q, s);
}

static void host_fn_free_completes_during_pool_resume(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *q;
  gca_pool_t *pool = pool_with_block(s, &q);
  assert_ok(gca_pool_suspend(pool, GCA_POOL_SUSPEND_SAVE));
  void *p = alloc_on(4096, s);
  job_t job = {.fn = job_resume, .out = pool};
  free_during(&job, p, s); /* the resume waits for the copies back on s */
  assert_ok(job.st);
  size_t reserved;
  assert_ok(gca_pool_memory(pool, &reserved, NULL));
  assert_int_equal(reserved, 30 * MiB);
  expect_bytes(q, 0x5a);
  release_pool_with_block(pool, q, s);
}

/* ---- destroyed streams ---- */

/* Note [Destroyed streams]: the cached memory of a stream's segments goes
 * back to the driver when the stream is destroyed (its work waited for), so
 * that a program that creates and destroys streams does not pile up the
 * address space of dead streams' expandable segments; a block still live at
 * the destroy keeps its segment until it is freed and the cache emptied,
 * with no wait then: the stream's work was waited for at the destroy. */
static void release_of_memory_whose_stream_was_destroyed(const char *conf) {
  assert_ok(gca_set_config(conf));
  for (int k = 0; k < 3; k++) {
    gca_stream_t u;
    assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
    void *p = alloc_on(4 * MiB, u), *q = alloc_on(4096, u);
    free_ok(p);
    free_ok(q);
    assert_true(stats().reserved_bytes[GCA_STAT_ALL].current >= (int64_t)(4 * MiB));
    assert_ok(gca_stream_destroy(u));
    assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  }
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *live = alloc_on(4 * MiB, s);
  assert_ok(gca_stream_destroy(s));
  assert_true(stats().reserved_bytes[GCA_STAT_ALL].current >= (int64_t)(4 * MiB));
  free_ok(live);
  int syncs = atomic_load(&nctx_syncs);
  assert_ok(gca_empty_cache());
  assert_int_equal(atomic_load(&nctx_syncs), syncs);
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  void *q = alloc_on(4 * MiB, NULL); /* later allocations are served */
  free_ok(q);
  assert_ok(gca_empty_cache());
  assert_ok(gca_set_config(""));
}

static void expandable_segment_of_a_destroyed_stream_is_released(void **state) {
  (void)state;
  release_of_memory_whose_stream_was_destroyed("expandable_segments:True");
}

static void vmm_segment_of_a_destroyed_stream_is_released(void **state) {
  (void)state;
  release_of_memory_whose_stream_was_destroyed("ipc_handles:True");
}

/* The error paths of a retirement (Note [Destroyed streams]): when the wait
 * for the dying stream fails, its segments are kept (marked gone) and
 * released later with the device waited for; when the release fails, the
 * memory stays cached. Either way the destroy succeeds, the allocator stays
 * valid and empty_cache gives everything back. */
static void failed_retirement_keeps_the_memory_for_later(const char *fault) {
  assert_ok(gca_set_config("expandable_segments:True"));
  gca_stream_t u;
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4 * MiB, u);
  free_ok(p);
  int64_t reserved = stats().reserved_bytes[GCA_STAT_ALL].current;
  assert_true(reserved >= (int64_t)(4 * MiB));
  assert_ok(gca_sim_fault_set(fault));
  assert_ok(gca_stream_destroy(u));
  gca_sim_fault_clear();
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, reserved);
  assert_ok(gca_empty_cache());
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_set_config(""));
}

static void retirement_whose_wait_fails_keeps_the_memory(void **state) {
  (void)state;
  failed_retirement_keeps_the_memory_for_later("stream_synchronize:nth=1");
}

static void retirement_whose_release_fails_keeps_the_memory(void **state) {
  (void)state;
  failed_retirement_keeps_the_memory_for_later("mem_unmap:nth=1");
}

static void classic_segment_of_a_destroyed_stream_is_released(void **state) {
  (void)state;
  release_of_memory_whose_stream_was_destroyed("");
}

/* Note [Releases during a capture]: empty_cache on another thread while a
 * stream with a cached segment captures (thread-local mode) keeps that
 * segment instead of synchronizing the capturing stream, which would fail
 * and invalidate the capture; the segment goes once the capture has ended.
 * A segment of another stream is released during a global-mode capture
 * without invalidating it: its stream's synchronize, and a classic
 * segment's mem_free, run in relaxed mode (Note [Capture gate]). `on`: the
 * segment's stream is the capturing one (ON_CAPTURING), another destroyed
 * before the capture (ON_GONE), another alive (ON_OTHER), or another thread's
 * per-thread stream (ON_PTDS: no handle reaches it, so its wait is one for
 * the whole device, which the capture forbids). */
enum { ON_CAPTURING, ON_GONE, ON_OTHER, ON_PTDS };

static gca_status_t job_ptds_alloc_free(job_t *j) {
  gca_status_t st = gca_malloc(&j->out, j->size, GCA_STREAM_PER_THREAD);
  return st == GCA_OK ? gca_free(j->out) : st;
}
static void release_during_a_capture(const char *conf, int on, gca_capture_mode_t mode,
                                     bool released) {
  assert_ok(gca_set_config(conf));
  gca_stream_t u = NULL, s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  if (on != ON_CAPTURING && on != ON_PTDS)
    assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  if (on == ON_PTDS) {
    job_t pj = {.fn = job_ptds_alloc_free, .size = 4 * MiB};
    pthread_t pt;
    assert_int_equal(pthread_create(&pt, NULL, run_job, &pj), 0);
    pthread_join(pt, NULL);
    assert_ok(pj.st);
  } else {
    free_ok(alloc_on(4 * MiB, on != ON_CAPTURING ? u : s));
  }
  size_t reserved = (size_t)stats().reserved_bytes[GCA_STAT_ALL].current;
  assert_true(reserved >= 4 * MiB);
  assert_ok(gca_stream_begin_capture(s, mode));
  /* destroyed while the capture runs: its cached segment cannot be given back
   * then (Note [Destroyed streams]) */
  if (on == ON_GONE)
    assert_ok(gca_stream_destroy(u));
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, reserved);
  job_t job = {.fn = job_empty_cache};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_job, &job), 0);
  pthread_join(t, NULL);
  assert_ok(job.st);
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  assert_ok(gca_stream_capture_status(s, &cs));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_ACTIVE); /* not invalidated */
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, released ? 0 : reserved);
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_graph_destroy(g));
  assert_ok(gca_empty_cache());
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
  if (on == ON_OTHER)
    assert_ok(gca_stream_destroy(u));
  assert_ok(gca_set_config(""));
}

/* Note [Destroyed streams]: a stream destroyed while a capture runs is not
 * waited for, and the driver may hand its handle to the next stream it makes
 * (the sim does with GCA_SIM_RECYCLE_HANDLES=1, switched on here for the one
 * stream). The memory cached on the old
 * stream must not serve the new one, whose work nothing orders after the old
 * one's: the next request makes new memory, and the old stream's cached
 * memory goes back then, the capture having ended (a wait for the device). */
static void recycled_handle_gets_none_of_the_old_streams_memory(const char *conf) {
  assert_ok(gca_set_config(conf));
  gca_stream_t s, u, u2;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4 * MiB, u), *live = alloc_on(4096, u);
  free_ok(p);
  gca_stats_t before = stats();
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  assert_ok(gca_stream_destroy(u));
  gca__sim_set_recycle_handles(true);
  gca_status_t cst = gca_stream_create(&u2, GCA_STREAM_NON_BLOCKING);
  gca__sim_set_recycle_handles(false);
  assert_ok(cst);
  assert_ptr_equal(u2, u); /* the handle came back */
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_graph_destroy(g));
  /* nothing was waited for or given back while the capture ran */
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current,
                   before.reserved_bytes[GCA_STAT_ALL].current);
  int syncs = atomic_load(&nctx_syncs);
  void *p2 = alloc_on(4 * MiB, u2);
  gca_stats_t after = stats();
  /* u was not waited for: the device is (mem_free waits for it by itself) */
  assert_true(atomic_load(&nctx_syncs) > syncs || strcmp(conf, "") == 0);
  assert_true(after.num_device_alloc > before.num_device_alloc); /* new memory, not u's */
  assert_true(after.num_device_free > before.num_device_free);   /* u's cached block went back */
  check();
  free_ok(p2);
  free_ok(live); /* a block of the old stream, freed after its destroy */
  assert_ok(gca_stream_destroy(u2));
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_empty_cache());
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_set_config(""));
}

/* The reclaim's error path (Note [Destroyed streams]): giving back a dead
 * stream's segment fails at its unmap; the request that triggered it is
 * served with new memory, the segment stays (still serving no request), the
 * allocator stays valid and empty_cache gives everything back. */
static void failed_reclaim_keeps_the_dead_streams_memory(void **state) {
  (void)state;
  assert_ok(gca_set_config("expandable_segments:True"));
  gca_stream_t s, u;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  void *p = alloc_on(4 * MiB, u);
  free_ok(p);
  int64_t reserved = stats().reserved_bytes[GCA_STAT_ALL].current;
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  assert_ok(gca_stream_destroy(u)); /* not waited for, nothing given back */
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_graph_destroy(g));
  assert_ok(gca_sim_fault_set("mem_unmap:nth=1"));
  void *q = alloc_on(4 * MiB, s); /* the reclaim runs first, and fails */
  gca_sim_fault_clear();
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, reserved + 4 * MiB);
  free_ok(q);
  assert_ok(gca_empty_cache());
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_set_config(""));
}

static void recycled_handle_of_an_expandable_segments_stream(void **state) {
  (void)state;
  recycled_handle_gets_none_of_the_old_streams_memory("expandable_segments:True");
}

static void recycled_handle_of_a_classic_segments_stream(void **state) {
  (void)state;
  recycled_handle_gets_none_of_the_old_streams_memory("");
}

/* Note [Capture gate] (device.c): a capture begun on another thread while a
 * call is inside the gate does not begin before the call has left; while it
 * runs no call enters; once it has ended, calls enter again. */
typedef struct gate_capture {
  gca_stream_t s;
  gca_status_t st, end_st;
  atomic_bool begun;
  test_gate_t began, end; /* the thread has begun; the thread may end */
} gate_capture_t;

static void *capture_job(void *arg) {
  gate_capture_t *c = arg;
  c->st = gca_stream_begin_capture(c->s, GCA_CAPTURE_MODE_GLOBAL);
  atomic_store(&c->begun, true);
  test_gate_open(&c->began);
  test_gate_pass(&c->end);
  gca_graph_t g = NULL;
  c->end_st = gca_stream_end_capture(c->s, &g);
  if (g != NULL)
    GCA_CHECK_IGNORE(gca_graph_destroy(g));
  return NULL;
}

static void a_capture_waits_for_the_calls_inside_the_gate(void **state) {
  (void)state;
  gate_capture_t c = {.st = GCA_ERR_INTERNAL, .end_st = GCA_ERR_INTERNAL};
  test_gate_init(&c.began);
  test_gate_init(&c.end);
  assert_ok(gca_stream_create(&c.s, GCA_STREAM_NON_BLOCKING));
  int c0 = atomic_load(&gca__device_captures);
  assert_true(gca__device_wait_enter());
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, capture_job, &c), 0);
  while (atomic_load(&gca__device_captures) == c0) /* counted: the thread is at the gate */
    sched_yield();
  assert_false(atomic_load(&c.begun)); /* and cannot begin while this call is inside */
  gca__device_wait_leave();
  test_gate_pass(&c.began);
  assert_ok(c.st);
  assert_false(gca__device_wait_enter()); /* a capture runs: calls are skipped */
  test_gate_open(&c.end);
  pthread_join(t, NULL);
  assert_ok(c.end_st);
  assert_int_equal(atomic_load(&gca__device_captures), c0);
  /* a begin the driver refuses (the stream is capturing already) leaves the
   * count as it was */
  assert_ok(gca_stream_begin_capture(c.s, GCA_CAPTURE_MODE_THREAD_LOCAL));
  assert_status(gca_stream_begin_capture(c.s, GCA_CAPTURE_MODE_THREAD_LOCAL), GCA_ERR_DRIVER,
                "already takes part");
  assert_int_equal(atomic_load(&gca__device_captures), c0 + 1);
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(c.s, &g));
  assert_ok(gca_graph_destroy(g));
  assert_int_equal(atomic_load(&gca__device_captures), c0);
  assert_true(gca__device_wait_enter()); /* none runs: calls enter again */
  gca__device_wait_leave();
  assert_ok(gca_stream_destroy(c.s));
  test_gate_fini(&c.began);
  test_gate_fini(&c.end);
}

static void expandable_segment_of_a_capturing_stream_is_kept(void **state) {
  (void)state;
  release_during_a_capture("expandable_segments:True", ON_CAPTURING, GCA_CAPTURE_MODE_THREAD_LOCAL,
                           false);
}

static void expandable_segment_of_another_stream_goes_during_a_global_capture(void **state) {
  (void)state;
  release_during_a_capture("expandable_segments:True", ON_OTHER, GCA_CAPTURE_MODE_GLOBAL, true);
}

static void classic_segment_goes_while_another_thread_captures(void **state) {
  (void)state;
  release_during_a_capture("", ON_CAPTURING, GCA_CAPTURE_MODE_GLOBAL, true);
}

static void classic_segment_of_a_gone_stream_goes_while_another_captures(void **state) {
  (void)state;
  release_during_a_capture("", ON_GONE, GCA_CAPTURE_MODE_GLOBAL, true);
}

static void expandable_segment_of_another_threads_ptds_is_kept_during_a_capture(void **state) {
  (void)state;
  release_during_a_capture("expandable_segments:True", ON_PTDS, GCA_CAPTURE_MODE_GLOBAL, false);
}

static void vmm_segment_of_a_capturing_stream_is_kept(void **state) {
  (void)state;
  release_during_a_capture("ipc_handles:True", ON_CAPTURING, GCA_CAPTURE_MODE_THREAD_LOCAL, false);
}

/* A segment whose stream is gone is released after a device-wide
 * synchronize; while another stream captures (begun, not yet routed to a
 * pool, so the allocator has not heard of it) that synchronize would fail
 * and invalidate the capture, so empty_cache keeps the segment until the
 * capture has ended (gca__device_captures, Note [Releases during a
 * capture]). release_during_a_capture(conf, true) is that case. */
static void vmm_segment_of_a_gone_stream_is_kept_while_another_captures(void **state) {
  (void)state;
  release_during_a_capture("ipc_handles:True", ON_GONE, GCA_CAPTURE_MODE_THREAD_LOCAL, false);
}

static void expandable_segment_of_a_gone_stream_is_kept_while_another_captures(void **state) {
  (void)state;
  release_during_a_capture("expandable_segments:True", ON_GONE, GCA_CAPTURE_MODE_THREAD_LOCAL,
                           false);
}

/* Note [Gone streams of deferred frees]: a free deferred during a capture,
 * of a block used on a stream destroyed before the capture ends, completes
 * later (the device is waited for with the lock let go); the unrelated call
 * that finds it is not failed. */
static void deferred_free_of_a_destroyed_streams_block_completes(void **state) {
  (void)state;
  gca_stream_t s, u, s2;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool;
  assert_ok(gca_pool_create(0, NULL, &pool));
  void *x = alloc_on(4096, u);
  assert_ok(gca_record_stream(x, s2));
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(gca_pool_begin_capture(pool, s));
  free_ok(x); /* deferred: a capture is under way */
  assert_ok(gca_stream_destroy(s2));
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_pool_end_capture(pool, s));
  assert_ok(gca_graph_destroy(g));
  void *y = alloc_on(4096, u); /* flushes the deferred free: must not fail */
  free_ok(y);
  gca_stats_t st = stats();
  assert_int_equal(st.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(st.active[GCA_STAT_ALL].current, 0);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_empty_cache());
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(u));
}

/* A free and an allocation on another thread while this one captures in
 * global mode, begun through gca with no pool routed: the block freed was
 * recorded on a second stream, so its free leaves an event pending. The
 * allocation queries that event in relaxed mode only: the driver refuses
 * such calls from any other thread during a global-mode capture and
 * invalidates the capture, unless the calling thread's mode is relaxed
 * (H200, driver 580; contract test other_threads_calls_follow_the_captures_mode).
 * So the free completes during the capture, which stays active. */
static gca_stream_t job_used_stream; /* the stream x was recorded on */
static gca_status_t job_free_then_malloc(job_t *j) {
  gca_status_t st = gca_free(j->out);
  void *y = NULL;
  /* the recorded stream's work (the event) done, waited for in relaxed mode
   * as a program would, so that the allocation finds the event complete */
  gca_capture_mode_t mode = GCA_CAPTURE_MODE_RELAXED;
  if (st == GCA_OK && (st = real->thread_exchange_capture_mode(&mode)) == GCA_OK) {
    st = real->stream_synchronize(job_used_stream);
    gca_status_t rst = real->thread_exchange_capture_mode(&mode);
    if (st == GCA_OK)
      st = rst;
  }
  if (st == GCA_OK)
    st = gca_malloc(&y, j->size, NULL);
  if (st == GCA_OK)
    st = gca_free(y);
  return st;
}

static void another_threads_frees_leave_a_global_capture_alone(void **state) {
  (void)state;
  gca_stream_t s, u;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  void *warm = alloc_on(64 * KiB, NULL); /* the segment the other thread reuses */
  void *x = alloc_on(4096, NULL);
  free_ok(warm);
  assert_ok(gca_record_stream(x, u));
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  job_used_stream = u;
  job_t job = {.fn = job_free_then_malloc, .out = x, .size = 8 * MiB}; /* a locked request */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_job, &job), 0);
  pthread_join(t, NULL);
  assert_ok(job.st);
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  assert_ok(gca_stream_capture_status(s, &cs));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_ACTIVE);
  /* the other thread queried the event in relaxed mode: x's free completed */
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 0);
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_graph_destroy(g));
  void *z = alloc_on(4096, NULL);
  free_ok(z);
  assert_ok(gca_device_synchronize());
  z = alloc_on(4096, NULL);
  free_ok(z);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 0);
  assert_ok(gca_empty_cache());
  check();
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(u));
}

/* Caching off: a free waits for the streams the block was used on (PyTorch
 * synchronizes them). Made on another thread while this one captures in
 * global mode, that wait runs in relaxed mode (Note [Capture gate],
 * device.c): it does not invalidate the capture, and the memory goes back. */
static void caching_off_free_leaves_a_global_capture_alone(void **state) {
  (void)state;
  gca_stream_t s, u;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&u, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_set_caching(false));
  void *x = alloc_on(4096, NULL);
  assert_ok(gca_record_stream(x, u));
  int64_t syncs = gca_sim_call_count("stream_synchronize");
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  job_t job = {.fn = job_free, .out = x};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_job, &job), 0);
  pthread_join(t, NULL);
  assert_ok(job.st);
  assert_true(gca_sim_call_count("stream_synchronize") > syncs); /* u was waited for */
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  assert_ok(gca_stream_capture_status(s, &cs));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 0);
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_graph_destroy(g));
  check();
  assert_ok(gca_set_caching(true));
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(u));
}

typedef struct stamper {
  void *p;
  size_t size;
  gate_t go;
  bool timed_out;
} stamper_t;

/* Queued on the stream to be destroyed: the write that must land before the
 * block is handed out again. */
static void stamp_when_open(void *arg) {
  stamper_t *w = arg;
  if (!gate_wait(&w->go)) {
    w->timed_out = true;
    return;
  }
  stamp_fill(w->p, w->size, 0x5eed);
}

static void *open_when_waiting(void *arg) {
  stamper_t *w = arg;
  if (gate_wait(&waiting))
    gate_open(&w->go);
  return NULL;
}

static void free_of_block_recorded_on_destroyed_stream_waits_for_its_work(void **state) {
  (void)state;
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  size_t size = 64 * KiB;
  void *p = alloc_on(size, NULL);
  memset(p, 0, size);
  assert_ok(gca_record_stream(p, s2));
  stamper_t w = {.p = p, .size = size};
  gate_init(&w.go);
  assert_ok(gca_launch_host_func(s2, stamp_when_open, &w));
  assert_ok(gca_stream_destroy(s2)); /* returns at once; the write stays queued */
  atomic_store(&armed, true);
  pthread_t opener;
  assert_int_equal(pthread_create(&opener, NULL, open_when_waiting, &w), 0);
  free_ok(p); /* waits for the device: the write lands first */
  pthread_join(opener, NULL);
  assert_false(w.timed_out);
  assert_int_equal(stamp_mismatch(p, size, 0x5eed), -1);
  void *q = alloc_on(size, NULL);
  assert_ptr_equal(q, p); /* reused only now */
  free_ok(q);
  assert_ok(gca_empty_cache());
}

/* ---- teardown ---- */

static void failed_unmap_at_teardown_frees_the_records(void **state) {
  (void)state;
  assert_ok(gca_set_config("ipc_handles:True"));
  void *p = alloc_on(4096, NULL);
  void *q = alloc_on(30 * MiB, NULL);
  free_ok(q);
  assert_ok(gca_sim_fault_set("mem_unmap:nth=1"));
  /* one segment's unmap fails: its memory is lost (logged), its records are
   * freed all the same, which the ASan build's leak check sees */
  gca__allocator_reset();
  gca_sim_fault_clear();
  assert_int_equal(gca_sim_call_count("mem_unmap"), 2);
  (void)p;
  assert_ok(gca_set_config(""));
}

/* The failed unmap left one segment's memory on the sim: the usual teardown's
 * check that the device is empty does not apply. */
static int lost_memory_teardown(void **state) {
  (void)state;
  gca_sim_fault_clear();
  assert_ok(gca__allocator_check());
  gca__allocator_reset();
  gca__device_override(real);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(host_fn_free_completes_during_empty_cache, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(host_fn_free_completes_during_the_oom_retry, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(host_fn_free_completes_during_pending_sync, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(host_fn_free_completes_during_pool_destruction, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(host_fn_free_completes_during_a_free_with_caching_off,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(
          host_fn_free_completes_during_a_used_block_free_with_caching_off, release_setup,
          release_teardown),
      cmocka_unit_test_setup_teardown(host_fn_free_completes_during_restore_trim, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(host_fn_free_completes_during_pool_suspend, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(host_fn_free_completes_during_pool_resume, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(expandable_segment_of_a_destroyed_stream_is_released,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(vmm_segment_of_a_destroyed_stream_is_released, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(deferred_free_of_a_destroyed_streams_block_completes,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(another_threads_frees_leave_a_global_capture_alone,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(caching_off_free_leaves_a_global_capture_alone, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(classic_segment_of_a_destroyed_stream_is_released,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(retirement_whose_wait_fails_keeps_the_memory, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(retirement_whose_release_fails_keeps_the_memory,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(expandable_segment_of_a_capturing_stream_is_kept,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(failed_reclaim_keeps_the_dead_streams_memory, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(recycled_handle_of_an_expandable_segments_stream,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(recycled_handle_of_a_classic_segments_stream, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(a_capture_waits_for_the_calls_inside_the_gate, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(vmm_segment_of_a_capturing_stream_is_kept, release_setup,
                                      release_teardown),
      cmocka_unit_test_setup_teardown(
          expandable_segment_of_another_threads_ptds_is_kept_during_a_capture, release_setup,
          release_teardown),
      cmocka_unit_test_setup_teardown(classic_segment_goes_while_another_thread_captures,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(classic_segment_of_a_gone_stream_goes_while_another_captures,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(
          expandable_segment_of_another_stream_goes_during_a_global_capture, release_setup,
          release_teardown),
      cmocka_unit_test_setup_teardown(vmm_segment_of_a_gone_stream_is_kept_while_another_captures,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(
          expandable_segment_of_a_gone_stream_is_kept_while_another_captures, release_setup,
          release_teardown),
      cmocka_unit_test_setup_teardown(free_of_block_recorded_on_destroyed_stream_waits_for_its_work,
                                      release_setup, release_teardown),
      cmocka_unit_test_setup_teardown(failed_unmap_at_teardown_frees_the_records, release_setup,
                                      lost_memory_teardown),
  };
  test_filter_from_env();
  return cmocka_run_group_tests(tests, NULL, NULL);
}
