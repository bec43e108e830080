/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_threads.c - many threads, each allocating on its own stream and
 * the legacy stream with random sizes, stamping every block by writing its
 * memory directly (sim device memory is host memory), handing blocks to other
 * threads that check the stamps and free them, sometimes after recording them
 * on yet another stream. With two sim devices (meson sets GCA_SIM_DEVICES=2)
 * half the threads allocate on device 1, so frees must find the device. Run
 * under TSan and ASan too. The seed is printed. Also
 * release_lock_on_cudamalloc: while one thread is inside the driver (the sim
 * holds its mem_alloc: a gate, no timing), the device lock is free and others
 * are served from the cache, and the bytes it is allocating count against the
 * device's limit. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "alloc_fixture.h"

#define NTHREADS 4
#define ITERS    3000
#define QCAP     256

typedef struct item {
  uint64_t *p;
  size_t size;
  uint64_t tag;
} item_t;

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static item_t queue[QCAP];
static int q_len;
static gca_stream_t streams[NTHREADS];
static int ndevices;
static unsigned seed;
static int failures;
static char first_failure[512];

static void note_failure(const char *what) {
  pthread_mutex_lock(&q_lock);
  if (failures++ == 0)
    snprintf(first_failure, sizeof(first_failure), "%s: %s", what, gca_last_error());
  pthread_mutex_unlock(&q_lock);
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static size_t pick_size(uint64_t *r) {
  uint64_t x = rnd(r);
  switch (x % 8) {
  case 0:
    return 1 + x % 512;
  case 1:
  case 2:
  case 3:
    return 512 + (x >> 8) % (64 * KiB);
  case 4:
  case 5:
    return 64 * KiB + (x >> 8) % (1 * MiB);
  case 6:
    return 1 * MiB + (x >> 8) % (8 * MiB);
  default:
    return 10 * MiB + (x >> 8) % (24 * MiB);
  }
}

/* Stamps the first and last words of the block with its tag. */
static void stamp(uint64_t *p, size_t size, uint64_t tag) {
  size_t words = size / 8, n = words / 2 < 64 ? words / 2 : 64;
  for (size_t i = 0; i < n; i++) {
    p[i] = tag ^ i;
    p[words - 1 - i] = tag ^ (i << 32);
  }
}

static bool stamp_ok(const uint64_t *p, size_t size, uint64_t tag) {
  size_t words = size / 8, n = words / 2 < 64 ? words / 2 : 64;
  for (size_t i = 0; i < n; i++)
    if (p[i] != (tag ^ i) || p[words - 1 - i] != (tag ^ (i << 32)))
      return false;
  return true;
}

static bool release(const item_t *it) {
  if (it->size >= 8 && !stamp_ok(it->p, it->size, it->tag)) {
    gca__error(GCA_ERR_INTERNAL, "stamp of %p (%zu bytes) is broken", (void *)it->p, it->size);
    return false;
  }
  return gca_free(it->p) == GCA_OK;
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  uint64_t r = ((uint64_t)seed << 8) + (uint64_t)id + 1;
  for (int i = 0; i < ITERS; i++) {
    gca_stream_t s = (rnd(&r) & 1) ? streams[id] : NULL;
    size_t size = pick_size(&r);
    void *p = NULL;
    int dev = ndevices > 1 ? id % 2 : 0;
    if (gca_malloc_device(dev, &p, size, dev == 0 ? s : NULL) != GCA_OK || p == NULL) {
      note_failure("malloc");
      continue;
    }
    uint64_t tag = rnd(&r) | 1;
    if (size >= 8)
      stamp(p, size, tag);
    if (dev == 0 && rnd(&r) % 5 == 0 &&
        gca_record_stream(p, streams[(id + 1) % NTHREADS]) != GCA_OK)
      note_failure("record_stream");
    item_t mine = {p, size, tag}, victim = {0};
    bool have_victim = false;
    pthread_mutex_lock(&q_lock);
    if (q_len == QCAP || (q_len > 0 && rnd(&r) % 2 == 0)) {
      int k = (int)(rnd(&r) % (uint64_t)q_len);
      victim = queue[k];
      queue[k] = queue[--q_len];
      have_victim = true;
    }
    queue[q_len++] = mine;
    pthread_mutex_unlock(&q_lock);
    if (have_victim && !release(&victim))
      note_failure("free");
  }
  return NULL;
}

static void threads_share_blocks_across_streams(void **state) {
  (void)state;
  seed = (unsigned)time(NULL);
  const char *env = getenv("GCA_TEST_SEED");
  if (env != NULL)
    seed = (unsigned)strtoul(env, NULL, 10);
  print_message("seed %u (GCA_TEST_SEED to repeat)\n", seed);
  assert_ok(gca_device_count(&ndevices));
  if (ndevices > 1)
    assert_ok(gca_sim_set_capacity(1, 16 * GiB));
  for (int i = 0; i < NTHREADS; i++)
    assert_ok(gca_stream_create(&streams[i], GCA_STREAM_NON_BLOCKING));
  pthread_t t[NTHREADS];
  for (int i = 0; i < NTHREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
  for (int i = 0; i < NTHREADS; i++)
    pthread_join(t[i], NULL);
  check();
  for (int i = 0; i < q_len; i++)
    if (!release(&queue[i]))
      note_failure("final free");
  q_len = 0;
  if (failures != 0)
    fail_msg("seed %u: %d failed operations or broken stamps; first: %s", seed, failures,
             first_failure);
  check();
  assert_ok(gca_empty_cache());
  check();
  int64_t total = 0;
  for (int dev = 0; dev < (ndevices > 1 ? 2 : 1); dev++) {
    gca_stats_t s;
    assert_ok(gca_get_stats(dev, &s));
    assert_int_equal(s.allocation[GCA_STAT_ALL].current, 0);
    assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 0);
    total += s.allocation[GCA_STAT_ALL].allocated;
  }
  assert_int_equal(total, NTHREADS * ITERS);
  for (int i = 0; i < NTHREADS; i++)
    assert_ok(gca_stream_destroy(streams[i]));
}

typedef struct free_arg {
  void *p;
  gca_status_t out;
} free_arg_t;

static void *free_thread(void *a) {
  free_arg_t *x = a;
  x->out = gca_free(x->p);
  return NULL;
}

static void concurrent_double_free_only_one_wins(void **state) {
  (void)state;
  for (int round = 0; round < 200; round++) {
    void *p = alloc_on(4096, NULL);
    pthread_t t[2];
    free_arg_t args[2] = {{p, GCA_OK}, {p, GCA_OK}};
    for (int i = 0; i < 2; i++)
      assert_int_equal(pthread_create(&t[i], NULL, free_thread, &args[i]), 0);
    for (int i = 0; i < 2; i++)
      pthread_join(t[i], NULL);
    assert_true((args[0].out == GCA_OK) != (args[1].out == GCA_OK));
    assert_true(args[0].out == GCA_ERR_INVALID_POINTER || args[1].out == GCA_ERR_INVALID_POINTER);
    check();
  }
}

/* ---- release_lock_on_cudamalloc ---- */

static int threads_setup(void **state) {
  alloc_setup(state);
  for (int i = 0; i < 2; i++)
    assert_ok(gca_stream_create(&streams[i], GCA_STREAM_NON_BLOCKING));
  return 0;
}

static int threads_teardown(void **state) {
  (void)gca_sim_hold("mem_alloc", false);
  (void)gca_set_config("");
  for (int i = 0; i < 2; i++)
    (void)gca_stream_destroy(streams[i]);
  return alloc_teardown(state);
}

typedef struct {
  size_t size;
  gca_stream_t stream;
  void *p;
  gca_status_t st;
  atomic_int done;
} slow_alloc_t;

static void *slow_alloc(void *arg) {
  slow_alloc_t *a = arg;
  a->st = gca_malloc(&a->p, a->size, a->stream);
  atomic_store(&a->done, 1);
  return NULL;
}

/* Starts a thread whose malloc needs a new segment and returns once that
 * thread is inside the driver call, where the sim holds it (gca_sim_hold)
 * until hold_end. */
static void start_held_alloc(slow_alloc_t *a, pthread_t *t) {
  int64_t calls = gca_sim_call_count("mem_alloc");
  atomic_init(&a->done, 0);
  assert_ok(gca_sim_hold("mem_alloc", true));
  assert_int_equal(pthread_create(t, NULL, slow_alloc, a), 0);
  while (gca_sim_call_count("mem_alloc") == calls)
    sched_yield();
}

static void hold_end(slow_alloc_t *a, pthread_t t) {
  assert_ok(gca_sim_hold("mem_alloc", false));
  pthread_join(t, NULL);
  assert_ok(a->st);
}

/* Whether some thread holds device 0's allocator lock now. */
static bool device_lock_held(void) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_non_null(d);
  if (!gca__mutex_trylock(&d->lock))
    return true;
  gca__mutex_unlock(&d->lock);
  return false;
}

/* A thread's segment allocation is held inside the driver call (a gate:
 * gca_sim_hold, the call counted on arrival). With
 * release_lock_on_cudamalloc the device lock is free meanwhile and this
 * thread's cached pairs complete while the other cannot have left the
 * driver; without it the lock is held for the whole call. */
static void release_lock_on_cudamalloc_serves_others_meanwhile(void **state) {
  (void)state;
  for (int release = 1; release >= 0; release--) {
    assert_ok(gca_set_config(release ? "release_lock_on_cudamalloc:True"
                                     : "release_lock_on_cudamalloc:False"));
    void *warm = alloc_on(4096, NULL);
    free_ok(warm);
    slow_alloc_t a = {.size = 8 * MiB, .stream = streams[0]};
    pthread_t t;
    start_held_alloc(&a, &t);
    bool held = device_lock_held();
    if (held == (bool)release)
      fail_msg("release_lock_on_cudamalloc:%s: the device lock is %s during the segment's "
               "driver call",
               release ? "True" : "False", held ? "held" : "free");
    if (release) {
      for (int i = 0; i < 100; i++) {
        void *p = alloc_on(4096, NULL);
        free_ok(p);
      }
      assert_int_equal(atomic_load(&a.done), 0); /* still held in the driver */
    }
    hold_end(&a, t);
    free_ok(a.p);
    assert_ok(gca_empty_cache());
    check();
  }
  assert_ok(gca_set_config(""));
}

static void released_lock_keeps_the_memory_limit(void **state) {
  (void)state;
  assert_ok(gca_set_config("release_lock_on_cudamalloc:True"));
  void *warm = alloc_on(4096, NULL); /* creates the allocator; then the limit */
  free_ok(warm);
  assert_ok(gca_set_memory_limit(0, 30 * MiB));
  slow_alloc_t a = {.size = 8 * MiB, .stream = streams[0]}; /* a 20 MiB segment */
  pthread_t t;
  start_held_alloc(&a, &t);
  void *p = NULL;
  /* another 20 MiB segment would pass 30 MiB with the one being allocated */
  assert_status(gca_malloc(&p, 8 * MiB, streams[1]), GCA_ERR_OUT_OF_MEMORY, "out of memory");
  hold_end(&a, t);
  check();
  gca_stats_t s = stats();
  assert_true(s.reserved_bytes[GCA_STAT_ALL].peak <= (int64_t)(30 * MiB));
  assert_int_equal(s.num_ooms, 1);
  free_ok(a.p);
  assert_ok(gca_empty_cache());
  assert_ok(gca_set_config(""));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(threads_share_blocks_across_streams, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(release_lock_on_cudamalloc_serves_others_meanwhile,
                                      threads_setup, threads_teardown),
      cmocka_unit_test_setup_teardown(released_lock_keeps_the_memory_limit, threads_setup,
                                      threads_teardown),
      cmocka_unit_test_setup_teardown(concurrent_double_free_only_one_wins, alloc_setup,
                                      alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
