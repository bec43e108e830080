/* SPDX-License-Identifier: Apache-2.0 */
/* test_host.c - the pinned host allocator (gca/host.h) on the sim: stream
 * uses defer reuse, jemalloc's arena and thread caches are the source and the
 * cache, empty_cache gives the extents back, faults and bad input leave it
 * usable with nothing leaked. Run twice by meson: host_alloc extents and
 * (GCA_ALLOC_CONF pinned_use_cuda_host_register:True) registered mmaps; a
 * third run without jemalloc checks the message (GCA_TEST_NO_JEMALLOC). */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "gca.h"
#include "host_internal.h"
#include "sim.h"
#include "support.h"

#define KIB (1024u)
#define MIB (1024u * 1024u)

static bool use_register;
static const char *pin_op; /* "host_alloc" or "host_register" */

static int setup(void **state) {
  (void)state;
  const char *conf = getenv("GCA_ALLOC_CONF");
  use_register = conf && strstr(conf, "pinned_use_cuda_host_register:True");
  pin_op = use_register ? "host_register" : "host_alloc";
  return gca_device_init() == GCA_OK ? 0 : -1;
}

static void stamp(void *p, size_t n, uint32_t key) {
  uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    b[i] = (uint8_t)(key * 31u + i * 7u);
}

static bool stamped(const void *p, size_t n, uint32_t key) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != (uint8_t)(key * 31u + i * 7u))
      return false;
  return true;
}

static gca_host_stats_t stats(void) {
  gca_host_stats_t s;
  assert_ok(gca_host_get_stats(&s));
  return s;
}

/* Nothing live, nothing parked, and after empty_cache nothing pinned. */
static void expect_empty_after_empty_cache(void) {
  assert_ok(gca_host_empty_cache());
  gca_host_stats_t s = stats();
  assert_int_equal(s.allocation.current, 0);
  assert_int_equal(s.allocated_bytes.current, 0);
  assert_int_equal(s.pending_frees, 0);
  assert_int_equal(s.segment.current, 0);
  assert_int_equal(s.reserved_bytes.current, 0);
  assert_int_equal(gca__sim_host_pinned_bytes(), 0);
}

/* A block recorded on a stream whose copy from it is held back by a gate is
 * not handed out again until the copy ran; the copy reads the block's stamp
 * intact (pinned: read when the stream runs, not at the call). */
static void a_block_in_use_by_a_gated_copy_is_not_reused_until_it_ran(void **state) {
  (void)state;
  enum { SIZE = 64 * KIB };
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  void *d = NULL;
  assert_ok(gca_malloc(&d, SIZE, s));
  uint8_t *a = NULL;
  assert_ok(gca_host_alloc((void **)&a, SIZE));
  stamp(a, SIZE, 7);
  test_gate_t g;
  test_gate_init(&g);
  assert_ok(gca_launch_host_func(s, test_gate_pass, &g));
  assert_ok(gca_memcpy_async(d, a, SIZE, s));
  assert_ok(gca_host_record_stream(a, s));
  assert_ok(gca_host_free(a));
  assert_int_equal(stats().pending_frees, 1);
  void *again[64];
  for (int i = 0; i < 64; i++) {
    assert_ok(gca_host_alloc(&again[i], SIZE));
    assert_ptr_not_equal(again[i], a);
    stamp(again[i], SIZE, 100 + (uint32_t)i);
  }
  for (int i = 0; i < 64; i++)
    assert_ok(gca_host_free(again[i]));
  test_gate_open(&g);
  assert_ok(gca_stream_synchronize(s));
  uint8_t *back = malloc(SIZE);
  assert_non_null(back);
  assert_ok(gca_memcpy(back, d, SIZE));
  assert_true(stamped(back, SIZE, 7));
  /* the copy ran: the next allocation completes the deferred free */
  void *p = NULL;
  assert_ok(gca_host_alloc(&p, SIZE));
  assert_int_equal(stats().pending_frees, 0);
  assert_ok(gca_host_free(p));
  free(back);
  assert_ok(gca_free(d));
  assert_ok(gca_stream_destroy(s));
  test_gate_fini(&g);
  expect_empty_after_empty_cache();
}

typedef struct worker {
  uint32_t seed;
  _Atomic int *failures;
} worker_t;

static void *churn(void *arg) {
  worker_t *w = arg;
  enum { LIVE = 32 };
  void *live[LIVE] = {0};
  size_t sizes[LIVE] = {0};
  uint32_t r = w->seed;
  for (int it = 0; it < 3000; it++) {
    r = r * 1664525u + 1013904223u;
    int k = (int)((r >> 8) % LIVE);
    if (live[k]) {
      if (!stamped(live[k], sizes[k], w->seed + (uint32_t)k) || gca_host_free(live[k]) != GCA_OK)
        atomic_fetch_add(w->failures, 1);
      live[k] = NULL;
    } else {
      sizes[k] = (size_t)8 << ((r >> 16) % 18); /* 8 B .. 1 MiB */
      sizes[k] += (r >> 4) % 64;
      if (gca_host_alloc(&live[k], sizes[k]) != GCA_OK ||
          !gca__sim_host_is_pinned((gca_devptr_t)(uintptr_t)live[k], sizes[k])) {
        atomic_fetch_add(w->failures, 1);
        continue;
      }
      stamp(live[k], sizes[k], w->seed + (uint32_t)k);
    }
  }
  for (int k = 0; k < LIVE; k++)
    if (live[k] &&
        (!stamped(live[k], sizes[k], w->seed + (uint32_t)k) || gca_host_free(live[k]) != GCA_OK))
      atomic_fetch_add(w->failures, 1);
  return NULL;
}

/* jemalloc's arena is the source: every extent comes from the hooks (one
 * device-layer pin per hook call, accounted in the stats), blocks of many
 * sizes from four threads are pinned and keep their stamps, a repeated size
 * is served from the thread cache without a hook call, and empty_cache gives
 * every extent back (destroy/dalloc hooks, unpins, pinned bytes to zero). */
static void jemalloc_arena_is_the_source_and_the_cache(void **state) {
  (void)state;
  gca__host_extent_stats_t e0, e1, e2;
  gca__host_extent_stats(&e0);
  int64_t pins0 = gca_sim_call_count(pin_op);
  enum { T = 4 };
  pthread_t th[T];
  worker_t w[T];
  _Atomic int failures = 0;
  for (int i = 0; i < T; i++) {
    w[i] = (worker_t){.seed = 1000u * (uint32_t)(i + 1), .failures = &failures};
    assert_int_equal(pthread_create(&th[i], NULL, churn, &w[i]), 0);
  }
  for (int i = 0; i < T; i++)
    assert_int_equal(pthread_join(th[i], NULL), 0);
  assert_int_equal(atomic_load(&failures), 0);
  gca__host_extent_stats(&e1);
  int64_t pins = gca_sim_call_count(pin_op) - pins0;
  assert_true(e1.hook_alloc > e0.hook_alloc);
  assert_int_equal(pins, e1.num_host_alloc - e0.num_host_alloc);
  assert_true(pins <= e1.hook_alloc - e0.hook_alloc);
  gca_host_stats_t s = stats();
  assert_int_equal(s.allocation.current, 0);
  assert_true(s.allocation.allocated > 1000);
  assert_true(s.segment.current > 0);
  assert_int_equal((size_t)s.reserved_bytes.current, gca__sim_host_pinned_bytes());
  assert_int_equal(s.num_host_alloc, e1.num_host_alloc);

  /* repeats come from the thread cache: no hook, no device call */
  void *p = NULL;
  assert_ok(gca_host_alloc(&p, 4096));
  assert_ok(gca_host_free(p));
  gca__host_extent_stats(&e1);
  pins0 = gca_sim_call_count(pin_op);
  for (int i = 0; i < 10000; i++) {
    void *q = NULL;
    assert_ok(gca_host_alloc(&q, 4096));
    assert_ptr_equal(q, p);
    assert_ok(gca_host_free(q));
  }
  gca__host_extent_stats(&e2);
  assert_int_equal(e2.hook_alloc, e1.hook_alloc);
  assert_int_equal(gca_sim_call_count(pin_op), pins0);

  int64_t frees0 = gca_sim_call_count(use_register ? "host_unregister" : "host_free");
  expect_empty_after_empty_cache();
  gca__host_extent_stats(&e2);
  assert_true(e2.hook_destroy + e2.hook_dalloc > e1.hook_destroy + e1.hook_dalloc);
  assert_true(gca_sim_call_count(use_register ? "host_unregister" : "host_free") > frees0);
  assert_int_equal(stats().num_host_free, e2.num_host_free);
  /* and the allocator starts over on a fresh arena */
  assert_ok(gca_host_alloc(&p, 100));
  stamp(p, 100, 3);
  assert_true(stamped(p, 100, 3));
  assert_ok(gca_host_free(p));
  expect_empty_after_empty_cache();
}

typedef struct cycler {
  uint32_t key;
  _Atomic int *stop, *failures;
  long rounds;
} cycler_t;

static void *cycle(void *arg) {
  cycler_t *c = arg;
  while (!atomic_load(c->stop)) {
    size_t size = 16 + (size_t)((c->key * 2654435761u + (uint32_t)c->rounds * 40503u) % 70000u);
    void *p = NULL;
    if (gca_host_alloc(&p, size) != GCA_OK) {
      atomic_fetch_add(c->failures, 1);
      break;
    }
    stamp(p, size, c->key + (uint32_t)c->rounds);
    sched_yield();
    if (!stamped(p, size, c->key + (uint32_t)c->rounds) || gca_host_free(p) != GCA_OK)
      atomic_fetch_add(c->failures, 1);
    __atomic_store_n(&c->rounds, c->rounds + 1, __ATOMIC_RELAXED);
    if (c->rounds % 4 == 0) /* holding nothing for a while: moments when the arena is idle */
      usleep(20);
  }
  return NULL;
}

/* empty_cache while three threads allocate and free: it shuts their thread
 * caches' sections (Note [Host thread caches]), flushes them, and destroys the
 * arena whenever nothing is live, while the threads keep allocating from
 * whichever arena is current; every stamp survives and nothing is left. */
static void empty_cache_races_allocating_threads_safely(void **state) {
  (void)state;
  enum { T = 3 };
  pthread_t th[T];
  cycler_t c[T];
  _Atomic int stop = 0, failures = 0;
  for (int i = 0; i < T; i++) {
    c[i] = (cycler_t){.key = 77u * (uint32_t)(i + 1), .stop = &stop, .failures = &failures};
    assert_int_equal(pthread_create(&th[i], NULL, cycle, &c[i]), 0);
  }
  gca__host_extent_stats_t e0, e1;
  gca__host_extent_stats(&e0);
  long least = 0;
  for (int i = 0; i < 300 || least < 200; i++) {
    assert_ok(gca_host_empty_cache());
    least = LONG_MAX;
    for (int k = 0; k < T; k++) {
      long r = __atomic_load_n(&c[k].rounds, __ATOMIC_RELAXED);
      least = r < least ? r : least;
    }
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < T; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_true(c[i].rounds > 0);
  }
  assert_int_equal(atomic_load(&failures), 0);
  gca__host_extent_stats(&e1);
  print_message("empty_cache raced %ld+ rounds per thread; %lld extents pinned meanwhile\n", least,
                (long long)(e1.hook_alloc - e0.hook_alloc));
  expect_empty_after_empty_cache();
}

/* With blocks live, empty_cache keeps them intact and returns only what it can. */
static void empty_cache_with_live_blocks_keeps_them(void **state) {
  (void)state;
  void *big = NULL, *small = NULL;
  assert_ok(gca_host_alloc(&big, 8 * MIB));
  assert_ok(gca_host_alloc(&small, 200));
  stamp(big, 8 * MIB, 1);
  stamp(small, 200, 2);
  assert_ok(gca_host_empty_cache());
  assert_true(stamped(big, 8 * MIB, 1));
  assert_true(stamped(small, 200, 2));
  assert_true(stats().reserved_bytes.current >= (int64_t)(8 * MIB));
  assert_ok(gca_host_free(big));
  assert_ok(gca_host_free(small));
  expect_empty_after_empty_cache();
}

/* The settings reach the extents: registered mmaps under
 * pinned_use_cuda_host_register:True, host_alloc otherwise; a 64 MiB block
 * (touched by pinned_num_register_threads threads first) is one pin. */
static void the_configured_pinning_call_makes_the_extents(void **state) {
  (void)state;
  int64_t a0 = gca_sim_call_count("host_alloc"), r0 = gca_sim_call_count("host_register");
  void *p = NULL;
  assert_ok(gca_host_alloc(&p, 64 * MIB));
  stamp(p, 64 * MIB, 5);
  assert_true(gca__sim_host_is_pinned((gca_devptr_t)(uintptr_t)p, 64 * MIB));
  if (use_register) {
    assert_int_equal(gca_sim_call_count("host_alloc"), a0);
    assert_true(gca_sim_call_count("host_register") > r0);
  } else {
    assert_int_equal(gca_sim_call_count("host_register"), r0);
    assert_true(gca_sim_call_count("host_alloc") > a0);
  }
  assert_true(stamped(p, 64 * MIB, 5));
  assert_ok(gca_host_free(p));
  expect_empty_after_empty_cache();
}

/* A device fault in the pinning call: a clear error naming the call and the
 * op, nothing leaked, the allocator usable; a fault while giving extents back
 * keeps them tracked until a later empty_cache succeeds. */
static void device_faults_fail_cleanly_and_leak_nothing(void **state) {
  (void)state;
  expect_empty_after_empty_cache();
  char spec[64];
  snprintf(spec, sizeof(spec), "%s:nth=1", pin_op);
  /* creating the arena pins its metadata: that failure is an error too */
  assert_ok(gca_sim_fault_set(spec));
  void *p = (void *)1;
  assert_status(gca_host_alloc(&p, 64), GCA_ERR_OUT_OF_MEMORY,
                "gca_host_alloc: cannot pin host memory for a new arena's metadata");
  gca_sim_fault_clear();
  assert_ok(gca_host_alloc(&p, 64));
  assert_ok(gca_host_free(p));
  /* every pin fails (jemalloc retries a failed grow with an exact-size extent) */
  snprintf(spec, sizeof(spec), "%s:always", pin_op);
  assert_ok(gca_sim_fault_set(spec));
  gca_status_t st = gca_host_alloc(&p, 64 * MIB); /* beyond what the arena retains */
  gca_sim_fault_clear();
  assert_int_equal(st, GCA_ERR_OUT_OF_MEMORY);
  assert_null(p);
  if (!strstr(gca_last_error(), "gca_host_alloc: cannot pin"))
    fail_msg("detail: %s", gca_last_error());
  char want[64];
  snprintf(want, sizeof(want), "%s: injected fault", pin_op);
  assert_non_null(strstr(gca_last_error(), want));
  assert_int_equal(stats().allocation.current, 0);
  assert_ok(gca_host_alloc(&p, 3 * MIB));
  stamp(p, 3 * MIB, 9);
  assert_true(stamped(p, 3 * MIB, 9));
  assert_ok(gca_host_free(p));

  /* giving back fails: the extents stay tracked (and pinned), a later call frees them */
  const char *unpin = use_register ? "host_unregister" : "host_free";
  snprintf(spec, sizeof(spec), "%s:always", unpin);
  assert_ok(gca_sim_fault_set(spec));
  assert_ok(gca_host_empty_cache());
  gca_sim_fault_clear();
  assert_true(stats().reserved_bytes.current > 0);
  assert_int_equal((size_t)stats().reserved_bytes.current, gca__sim_host_pinned_bytes());
  expect_empty_after_empty_cache();

  /* an event that cannot be recorded: the free fails and the block stays live */
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_host_alloc(&p, 1000));
  assert_ok(gca_host_record_stream(p, s));
  assert_ok(gca_sim_fault_set("event_record:nth=1"));
  assert_status(gca_host_free(p), GCA_ERR_DRIVER, "gca_host_free: deferring the free of");
  gca_sim_fault_clear();
  assert_int_equal(stats().allocation.current, 1);
  assert_ok(gca_host_free(p));
  assert_ok(gca_stream_synchronize(s));
  assert_ok(gca_stream_destroy(s));
  expect_empty_after_empty_cache();
}

/* Host fail points on the allocator's own bookkeeping. */
static void host_memory_failures_fail_cleanly(void **state) {
  (void)state;
  void *p = NULL;
  assert_ok(gca_host_alloc(&p, 64)); /* the table exists */
  assert_ok(gca_host_free(p));
  static const struct {
    const char *point;
    gca_status_t st;
    const char *needle;
  } cases[] = {
      {"host_chunk_table", GCA_OK, ""}, /* the grow fails; jemalloc's exact-size retry does not */
      {"host_park", GCA_ERR_OUT_OF_MEMORY, "gca_host_free: no host memory to defer the free"},
      {"host_record_stream", GCA_ERR_OUT_OF_MEMORY, "gca_host_record_stream: no host memory"},
  };
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  for (size_t i = 0; i < GCA_ARRAY_SIZE(cases); i++) {
    void *q = NULL;
    assert_ok(gca_host_alloc(&q, 512)); /* the arena exists */
    if (i == 0) {
      assert_ok(gca_host_free(q));
      q = NULL;
    }
    if (i == 1)
      assert_ok(gca_host_record_stream(q, s));
    assert_ok(gca__failpoint_arm(cases[i].point, 1));
    gca_status_t st = i == 0   ? gca_host_alloc(&q, 64 * MIB)
                      : i == 1 ? gca_host_free(q)
                               : gca_host_record_stream(q, s);
    gca__failpoint_clear();
    assert_int_equal(st, cases[i].st);
    if (!strstr(gca_last_error(), cases[i].needle))
      fail_msg("%s: detail '%s' lacks '%s'", cases[i].point, gca_last_error(), cases[i].needle);
    if (i == 0) /* the pin whose record failed was undone */
      assert_int_equal((size_t)stats().reserved_bytes.current, gca__sim_host_pinned_bytes());
    if (q)
      assert_ok(gca_host_free(q));
  }
  assert_ok(gca_stream_synchronize(s));
  assert_ok(gca_stream_destroy(s));
  expect_empty_after_empty_cache();
}

static void *alloc_on_a_new_thread(void *arg) {
  void *p = NULL;
  gca_status_t st = gca_host_alloc(&p, 100);
  *(gca_status_t *)arg = st;
  if (st == GCA_OK)
    gca_host_free(p);
  return NULL;
}

/* A thread whose thread cache cannot be made, and a block the table cannot
 * track when it grows: clear errors, nothing counted, nothing leaked. */
static void bookkeeping_growth_failures_fail_cleanly(void **state) {
  (void)state;
  gca_status_t st = GCA_OK;
  pthread_t th;
  assert_ok(gca__failpoint_arm("host_tcache", 1));
  assert_int_equal(pthread_create(&th, NULL, alloc_on_a_new_thread, &st), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  gca__failpoint_clear();
  assert_int_equal(st, GCA_ERR_OUT_OF_MEMORY);
  assert_int_equal(pthread_create(&th, NULL, alloc_on_a_new_thread, &st), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_ok(st);

  enum { MAX = 20000 };
  void **v = calloc(MAX, sizeof(*v));
  assert_non_null(v);
  assert_ok(gca__failpoint_arm("host_block_table", 1));
  int n = 0;
  for (; n < MAX; n++) {
    st = gca_host_alloc(&v[n], 48);
    if (st != GCA_OK)
      break;
  }
  gca__failpoint_clear();
  assert_true(n < MAX); /* the table grew and that growth failed */
  assert_int_equal(st, GCA_ERR_OUT_OF_MEMORY);
  assert_non_null(strstr(gca_last_error(), "gca_host_alloc: no host memory to track a block"));
  assert_null(v[n]);
  assert_int_equal(stats().allocation.current, n);
  for (int i = 0; i < n; i++)
    assert_ok(gca_host_free(v[i]));
  free(v);
  expect_empty_after_empty_cache();
}

/* Foreign pointers, double frees, size 0 and sizes that cannot exist. */
static void bad_input_is_refused_and_changes_nothing(void **state) {
  (void)state;
  void *dev = NULL, *p = NULL;
  assert_ok(gca_malloc(&dev, 4096, NULL));
  assert_status(gca_host_free(dev), GCA_ERR_INVALID_POINTER, "gca_host_free:");
  char *heap = malloc(100);
  assert_non_null(heap);
  assert_status(gca_host_free(heap), GCA_ERR_INVALID_POINTER, "not a live block");
  assert_status(gca_host_record_stream(heap, NULL), GCA_ERR_INVALID_POINTER,
                "gca_host_record_stream:");
  free(heap);
  assert_ok(gca_host_alloc(&p, 256));
  assert_status(gca_host_free((char *)p + 16), GCA_ERR_INVALID_POINTER, "gca_host_free:");
  assert_ok(gca_host_free(p));
  assert_status(gca_host_free(p), GCA_ERR_INVALID_POINTER, "freed already");
  assert_ok(gca_host_free(NULL));
  p = (void *)1;
  assert_ok(gca_host_alloc(&p, 0));
  assert_null(p);
  assert_status(gca_host_alloc(&p, SIZE_MAX), GCA_ERR_OUT_OF_MEMORY, "gca_host_alloc:");
  assert_status(gca_host_alloc(&p, (size_t)1 << 45), GCA_ERR_OUT_OF_MEMORY, "gca_host_alloc:");
  assert_null(p);
  assert_status(gca_host_alloc(NULL, 8), GCA_ERR_INVALID_ARGUMENT, "gca_host_alloc: ptr");
  assert_status(gca_host_get_stats(NULL), GCA_ERR_INVALID_ARGUMENT, "gca_host_get_stats");
  assert_ok(gca_free(dev));
  expect_empty_after_empty_cache();
}

/* The snapshot (the host allocator's own and gca_snapshot_json's
 * host_blocks) lists live and parked blocks with their state. */
static void the_snapshot_lists_live_and_pending_blocks(void **state) {
  (void)state;
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  test_gate_t g;
  test_gate_init(&g);
  assert_ok(gca_launch_host_func(s, test_gate_pass, &g));
  void *a = NULL, *b = NULL;
  assert_ok(gca_host_alloc(&a, 1000));
  assert_ok(gca_host_alloc(&b, 3000));
  assert_ok(gca_host_record_stream(b, s));
  assert_ok(gca_host_free(b));
  char *json = NULL;
  assert_ok(gca_host_snapshot_json(&json));
  char want[128];
  snprintf(want, sizeof(want), "{\"address\":%llu,\"size\":1000,\"state\":\"active_allocated\"",
           (unsigned long long)(uintptr_t)a);
  assert_non_null(strstr(json, want));
  snprintf(want, sizeof(want), "{\"address\":%llu,\"size\":3000,\"state\":\"active_pending_free\"",
           (unsigned long long)(uintptr_t)b);
  assert_non_null(strstr(json, want));
  gca_string_free(json);
  /* the allocator's snapshot carries the same blocks under host_blocks */
  assert_ok(gca_snapshot_json(&json, NULL));
  const char *hb = strstr(json, "\"host_blocks\":[");
  assert_non_null(hb);
  snprintf(want, sizeof(want), "{\"address\":%llu,\"size\":1000,\"state\":\"active_allocated\"",
           (unsigned long long)(uintptr_t)a);
  assert_non_null(strstr(hb, want));
  snprintf(want, sizeof(want), "{\"address\":%llu,\"size\":3000,\"state\":\"active_pending_free\"",
           (unsigned long long)(uintptr_t)b);
  assert_non_null(strstr(hb, want));
  gca_string_free(json);
  test_gate_open(&g);
  assert_ok(gca_stream_synchronize(s));
  assert_ok(gca_host_free(a));
  assert_ok(gca_stream_destroy(s));
  test_gate_fini(&g);
  expect_empty_after_empty_cache();
}

typedef struct handoff {
  void *p;
  size_t size;
  gca_status_t st, again;
} handoff_t;

static void *free_elsewhere(void *arg) {
  handoff_t *h = arg;
  h->st = gca_host_free(h->p);
  h->again = gca_host_free(h->p);
  return NULL;
}

/* A block freed by another thread than the one that allocated it (no hint
 * there: the table finds it) goes into that thread's front cache; a second
 * free, from either thread, is refused (the allocating thread's hint still
 * names the block's record, now cached elsewhere), and nothing is lost. */
static void a_free_on_another_thread_is_checked_and_a_second_refused(void **state) {
  (void)state;
  static const size_t sizes[] = {64, 4 * KIB, 64 * KIB, MIB, 8 * MIB};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(sizes); i++) {
    handoff_t h = {.size = sizes[i]};
    assert_ok(gca_host_alloc(&h.p, h.size));
    stamp(h.p, h.size, 11);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, free_elsewhere, &h), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_ok(h.st);
    assert_int_equal(h.again, GCA_ERR_INVALID_POINTER);
    assert_status(gca_host_free(h.p), GCA_ERR_INVALID_POINTER, "freed already");
    assert_status(gca_host_record_stream(h.p, NULL), GCA_ERR_INVALID_POINTER,
                  "gca_host_record_stream:");
    assert_int_equal(stats().allocation.current, 0);
  }
  expect_empty_after_empty_cache();
}

typedef struct leaver {
  void *p[8];
} leaver_t;

static void *alloc_free_and_exit(void *arg) {
  leaver_t *l = arg;
  for (int i = 0; i < 8; i++) {
    size_t size = (size_t)64 << (2 * i % 16);
    if (gca_host_alloc(&l->p[i], size) != GCA_OK)
      return NULL;
    stamp(l->p[i], size, (uint32_t)i);
  }
  for (int i = 0; i < 8; i++)
    if (gca_host_free(l->p[i]) != GCA_OK)
      l->p[i] = NULL;
  return l;
}

/* Note [Host front cache]: a thread's freed blocks wait in its front cache,
 * on the table as cached (not live: a free of one is refused); when the
 * thread exits they go back to jemalloc and off the table, so empty_cache
 * then finds the allocator idle and gives every extent back. */
static void a_thread_front_cache_goes_back_when_it_exits(void **state) {
  (void)state;
  leaver_t l = {0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, alloc_free_and_exit, &l), 0);
  void *ret = NULL;
  assert_int_equal(pthread_join(th, &ret), 0);
  assert_ptr_equal(ret, &l);
  for (int i = 0; i < 8; i++) {
    assert_non_null(l.p[i]);
    assert_null(gca__host_rec_find(l.p[i]));
  }
  /* while cached, a block is on the table but not live */
  void *p = NULL;
  assert_ok(gca_host_alloc(&p, 4 * KIB));
  assert_ok(gca_host_free(p));
  gca__host_rec_t *r = gca__host_rec_find(p);
  assert_non_null(r);
  assert_int_equal(atomic_load(&r->state), GCA__HREC_CACHED);
  assert_status(gca_host_free(p), GCA_ERR_INVALID_POINTER, "freed already");
  expect_empty_after_empty_cache();
  assert_null(gca__host_rec_find(p));
}

/* The front cache is bounded (Note [Host front cache]): a thread that frees
 * 5 MiB of blocks in six classes near 1 MiB keeps at most one block of a
 * class above 512 KiB, two of 512 and 448 KiB, and 4 MiB in all; the rest go
 * back to jemalloc, off the table. */
static void the_front_cache_keeps_at_most_its_bound(void **state) {
  (void)state;
  static const size_t sizes[] = {MIB, 896 * KIB, 768 * KIB, 640 * KIB, 512 * KIB, 448 * KIB};
  enum { N = GCA_ARRAY_SIZE(sizes) * 3 };
  void *v[N];
  for (int i = 0; i < N; i++)
    assert_ok(gca_host_alloc(&v[i], sizes[i % GCA_ARRAY_SIZE(sizes)]));
  for (int i = 0; i < N; i++)
    assert_ok(gca_host_free(v[i]));
  size_t cached = 0, per_class[GCA_ARRAY_SIZE(sizes)] = {0};
  for (int i = 0; i < N; i++) {
    gca__host_rec_t *r = gca__host_rec_find(v[i]);
    if (r) {
      assert_int_equal(atomic_load(&r->state), GCA__HREC_CACHED);
      cached += r->jsize;
      per_class[i % GCA_ARRAY_SIZE(sizes)]++;
    }
  }
  print_message("front cache kept %zu bytes of %d blocks\n", cached, N);
  assert_true(cached > 0);
  assert_true(cached <= 4 * MIB);
  for (size_t c = 0; c < GCA_ARRAY_SIZE(sizes); c++)
    assert_true(per_class[c] <= (sizes[c] > 512 * KIB ? 1u : 2u));
  expect_empty_after_empty_cache();
}

/* GCA_TEST_NO_JEMALLOC: the library cannot be loaded (or, =symbols, is not
 * jemalloc); every call says why. */
/* Every byte of the arena's extents is gca's memory (gca__host_owns, which
 * the preload shim asks before it hands a refused cudaFreeHost on), live or
 * freed; foreign memory is not; once empty_cache gave the extents back,
 * nothing is. */
static void the_arena_is_gcas_memory_until_given_back(void **state) {
  (void)state;
  uint8_t *a = NULL, *b = NULL;
  assert_ok(gca_host_alloc((void **)&a, 100));
  assert_ok(gca_host_alloc((void **)&b, 3 * MIB));
  assert_true(gca__host_owns(a) && gca__host_owns(a + 99));
  assert_true(gca__host_owns(b) && gca__host_owns(b + 3 * MIB - 1));
  assert_ok(gca_host_free(a));
  assert_true(gca__host_owns(a)); /* cached: still pinned by gca */
  assert_status(gca_host_free(a), GCA_ERR_INVALID_POINTER, "not a live block");
  int local;
  uint8_t *heap = malloc(64);
  assert_non_null(heap);
  assert_false(gca__host_owns(&local) || gca__host_owns(heap) || gca__host_owns(NULL));
  free(heap);
  assert_ok(gca_host_free(b));
  expect_empty_after_empty_cache();
  assert_false(gca__host_owns(a) || gca__host_owns(b));
}

static void without_jemalloc_every_call_says_why(void **state) {
  (void)state;
  void *p = (void *)1;
  if (strcmp(getenv("GCA_TEST_NO_JEMALLOC"), "symbols") == 0) {
    assert_status(gca_host_alloc(&p, 64), GCA_ERR_NOT_SUPPORTED,
                  "has no mallocx: not a jemalloc 5");
    return;
  }
  assert_status(gca_host_alloc(&p, 64), GCA_ERR_NOT_SUPPORTED, "jemalloc could not be loaded");
  assert_null(p);
  assert_status(gca_host_free((void *)8), GCA_ERR_NOT_SUPPORTED, "libjemalloc.so.2");
  assert_status(gca_host_empty_cache(), GCA_ERR_NOT_SUPPORTED, "GCA_JEMALLOC_LIBRARY");
  assert_false(gca__host_owns((void *)8));
}

int main(void) {
  if (getenv("GCA_TEST_NO_JEMALLOC")) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(without_jemalloc_every_call_says_why)};
    return cmocka_run_group_tests(tests, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_block_in_use_by_a_gated_copy_is_not_reused_until_it_ran),
      cmocka_unit_test(jemalloc_arena_is_the_source_and_the_cache),
      cmocka_unit_test(empty_cache_races_allocating_threads_safely),
      cmocka_unit_test(empty_cache_with_live_blocks_keeps_them),
      cmocka_unit_test(the_configured_pinning_call_makes_the_extents),
      cmocka_unit_test(device_faults_fail_cleanly_and_leak_nothing),
      cmocka_unit_test(host_memory_failures_fail_cleanly),
      cmocka_unit_test(bookkeeping_growth_failures_fail_cleanly),
      cmocka_unit_test(bad_input_is_refused_and_changes_nothing),
      cmocka_unit_test(the_snapshot_lists_live_and_pending_blocks),
      cmocka_unit_test(a_free_on_another_thread_is_checked_and_a_second_refused),
      cmocka_unit_test(a_thread_front_cache_goes_back_when_it_exits),
      cmocka_unit_test(the_front_cache_keeps_at_most_its_bound),
      cmocka_unit_test(the_arena_is_gcas_memory_until_given_back),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
