/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_streams.c - Note [Stream-ordered reuse]: a block used on another
 * stream (gca_record_stream) is not handed out again until the work queued
 * there before the free has finished; events are pooled; nothing touches the
 * device when nothing is pending; running out of memory waits for pending
 * frees; with caching off, frees wait for the recorded streams and return the
 * memory; a stream of another device gets its event on that device, and a
 * recorded NULL stream is the legacy stream of the recording thread's device;
 * faults on those paths fail cleanly. Runs with two sim devices. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "alloc_fixture.h"

#define SLEEP_NS (150ull * 1000 * 1000)

static gca_stream_t mk_stream(void) {
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  return s;
}

/* A stream held by hold_stream stays busy until the test opens the gate, so
 * "still pending" never depends on how long a sleep kernel takes. */
static atomic_int gate = 1;

static void hold_stream(void *arg) {
  (void)arg;
  while (atomic_load(&gate) == 0)
    sched_yield();
}

static void hold(gca_stream_t s) {
  atomic_store(&gate, 0);
  assert_ok(gca_launch_host_func(s, hold_stream, NULL));
}

static int streams_teardown(void **state) {
  atomic_store(&gate, 1); /* a failed test must not leave a stream held */
  return alloc_teardown(state);
}

static void block_waits_for_recorded_stream_before_reuse(void **state) {
  (void)state;
  gca_stream_t a = mk_stream(), b = mk_stream();
  const size_t n = 4096 / 4;
  uint32_t *p = alloc_on(4096, a);
  assert_ok(gca_record_stream(p, b));
  hold(b);
  assert_ok(gca_kernel_fill_u32(p, 0xabc00000u, 1, n, b));
  free_ok(p);
  /* pending: same-size requests on the block's own stream get other memory */
  void *q = alloc_on(4096, a);
  assert_ptr_not_equal(q, p);
  gca_stats_t s = stats();
  assert_int_equal(s.allocation[GCA_STAT_ALL].current, 1);
  assert_int_equal(s.active[GCA_STAT_ALL].current, 2); /* the pending block is still active */
  free_ok(q);
  atomic_store(&gate, 1);
  assert_ok(gca_stream_synchronize(b)); /* the fill and the recorded event are done */
  void *r = alloc_on(4096, a);          /* processing finds the event complete */
  assert_ptr_equal(r, p);
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0xabc00000u + (uint32_t)i)
      fail_msg("stamp %zu is 0x%x: the block was handed out before the fill finished", i, p[i]);
  free_ok(r);
  assert_ok(gca_stream_synchronize(b));
  assert_ok(gca_stream_destroy(a));
  assert_ok(gca_stream_destroy(b));
}

/* The free block at addr of the default small pool, from the records (the
 * test is single-threaded here), or NULL. */
static gca__block_t *free_block_at(void *addr) {
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_non_null(d);
  for (gca__segment_t *seg = d->small.segments; seg != NULL; seg = seg->next)
    for (gca__block_t *b = seg->head; b != NULL; b = b->next)
      if (b->in_tree && b->addr <= (gca_devptr_t)(uintptr_t)addr &&
          (gca_devptr_t)(uintptr_t)addr < b->addr + b->size)
        return b;
  return NULL;
}

/* Note [Record lines]: a block whose free waited for its recorded streams
 * holds no uses array once free (a merge gives a free neighbour's record
 * back without looking at one), and the walker reports one left there. */
static void a_free_block_holds_no_uses_array(void **state) {
  (void)state;
  gca_stream_t a = mk_stream(), b = mk_stream(), c = mk_stream();
  void *keep = alloc_on(4096, a); /* the segment stays split: p's block is a part */
  void *p = alloc_on(4096, a);
  assert_ok(gca_record_stream(p, b));
  assert_ok(gca_record_stream(p, c));
  free_ok(p); /* pending on both streams' events */
  assert_ok(gca_stream_synchronize(b));
  assert_ok(gca_stream_synchronize(c));
  void *q = alloc_on(2 * MiB, a); /* the large pool; processing completes the free */
  check();
  gca__block_t *fb = free_block_at(p);
  assert_non_null(fb);
  assert_null(fb->uses);
  assert_int_equal(fb->cap_uses, 0);
  fb->uses = calloc(1, sizeof(*fb->uses)); /* planted: the walker must say so */
  assert_non_null(fb->uses);
  fb->cap_uses = 1;
  assert_int_equal(gca__allocator_check(), GCA_ERR_INTERNAL);
  assert_non_null(strstr(gca_last_error(), "in the free tree with a uses array"));
  free(fb->uses);
  fb->uses = NULL;
  fb->cap_uses = 0;
  check();
  /* a live block's array and its room must agree as well */
  void *r = alloc_on(4096, a);
  assert_ok(gca_record_stream(r, b));
  gca__block_t *rb = gca__ptrmap_find(&gca__devalloc_peek(0)->ptrs, (gca_devptr_t)(uintptr_t)r);
  assert_non_null(rb);
  assert_non_null(rb->uses);
  uint32_t cap = rb->cap_uses;
  rb->cap_uses = 0;
  assert_int_equal(gca__allocator_check(), GCA_ERR_INTERNAL);
  assert_non_null(strstr(gca_last_error(), "uses in the array"));
  rb->cap_uses = cap;
  check();
  free_ok(r);
  assert_ok(gca_stream_synchronize(b));
  free_ok(q);
  free_ok(keep);
  assert_ok(gca_stream_destroy(a));
  assert_ok(gca_stream_destroy(b));
  assert_ok(gca_stream_destroy(c));
}

static void pending_block_shows_as_pending_free(void **state) {
  (void)state;
  gca_stream_t b = mk_stream();
  void *p = alloc_on(8192, NULL);
  assert_ok(gca_record_stream(p, b));
  assert_ok(gca_kernel_sleep(SLEEP_NS, b));
  free_ok(p);
  layout_t l = layout();
  assert_int_equal(l.nsegs, 1);
  assert_int_equal(l.nfree[0], 1); /* only the remainder */
  gca_stats_t s = stats();
  assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.active_bytes[GCA_STAT_ALL].current, 8192);
  assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 8192);
  assert_ok(gca_stream_synchronize(b));
  void *q = alloc_on(8192, NULL); /* processing finds the event complete */
  assert_ptr_equal(p, q);
  free_ok(q);
  s = stats();
  assert_int_equal(s.active[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.requested_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(b));
}

static void cached_pair_makes_no_device_call(void **state) {
  (void)state;
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  void *big = alloc_on(64 * MiB, NULL);
  free_ok(big);
  gca_sim_counters_reset();
  for (int i = 0; i < 1000; i++) {
    void *x, *y;
    assert_ok(gca_malloc(&x, 4096, NULL));
    assert_ok(gca_malloc(&y, 64 * MiB, NULL));
    assert_ok(gca_free(x));
    assert_ok(gca_free(y));
  }
  check();
  for (int op = 0; op < gca_sim_op_count(); op++) {
    int64_t c = gca_sim_call_count(gca_sim_op_name(op));
    if (c != 0)
      fail_msg("the cached pairs called %s %lld times", gca_sim_op_name(op), (long long)c);
  }
}

static void record_on_own_stream_is_a_no_op(void **state) {
  (void)state;
  gca_stream_t a = mk_stream();
  void *p = alloc_on(4096, a);
  assert_ok(gca_record_stream(p, a));
  gca_sim_counters_reset();
  free_ok(p);
  assert_int_equal(gca_sim_call_count("event_record"), 0);
  assert_ptr_equal(alloc_on(4096, a), p);
  free_ok(p);
  assert_ok(gca_stream_destroy(a));
}

static void events_are_pooled(void **state) {
  (void)state;
  gca_stream_t b = mk_stream(), c = mk_stream();
  gca_sim_counters_reset();
  for (int i = 0; i < 50; i++) {
    void *p = alloc_on(4096, NULL);
    assert_ok(gca_record_stream(p, b));
    assert_ok(gca_record_stream(p, c));
    assert_ok(gca_record_stream(p, b)); /* recorded twice, one event */
    free_ok(p);
    assert_ok(gca_stream_synchronize(b));
    assert_ok(gca_stream_synchronize(c));
  }
  void *q = alloc_on(4096, NULL); /* retires the last events */
  free_ok(q);
  assert_int_equal(gca_sim_call_count("event_record"), 100);
  assert_true(gca_sim_call_count("event_create") <= 4);
  assert_int_equal(gca_sim_call_count("event_destroy"), 0);
  assert_int_equal(gca_sim_call_count("event_synchronize"), 0); /* never blocked */
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(b));
  assert_ok(gca_stream_destroy(c));
}

static void multiple_streams_all_must_finish(void **state) {
  (void)state;
  gca_stream_t b = mk_stream(), c = mk_stream();
  void *p = alloc_on(4096, NULL);
  assert_ok(gca_record_stream(p, b));
  assert_ok(gca_record_stream(p, c));
  assert_ok(gca_kernel_sleep(SLEEP_NS / 3, b));
  hold(c);
  free_ok(p);
  assert_ok(gca_stream_synchronize(b));
  void *q = alloc_on(4096, NULL);
  assert_ptr_not_equal(p, q); /* c has not finished */
  free_ok(q);
  atomic_store(&gate, 1);
  assert_ok(gca_stream_synchronize(c));
  q = alloc_on(4096, NULL);
  assert_ptr_equal(p, q);
  free_ok(q);
  assert_ok(gca_stream_destroy(b));
  assert_ok(gca_stream_destroy(c));
}

static void empty_cache_waits_for_pending_frees(void **state) {
  (void)state;
  gca_stream_t b = mk_stream();
  void *p = alloc_on(4096, NULL);
  assert_ok(gca_record_stream(p, b));
  assert_ok(gca_kernel_sleep(SLEEP_NS / 3, b));
  free_ok(p);
  int64_t syncs = stats().num_sync_all_streams;
  assert_ok(gca_empty_cache());
  check();
  gca_stats_t s = stats();
  assert_int_equal(s.num_sync_all_streams, syncs + 1);
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
  assert_ok(gca_stream_destroy(b));
}

static void no_caching_returns_memory_after_recorded_work(void **state) {
  (void)state;
  gca_stream_t b = mk_stream();
  assert_ok(gca_set_caching(false));
  uint32_t *p = alloc_on(4096, NULL);
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 4096);
  assert_ok(gca_record_stream(p, b));
  assert_ok(gca_kernel_sleep(SLEEP_NS / 3, b));
  assert_ok(gca_kernel_fill_u32(p, 7, 0, 1024, b));
  free_ok(p);
  gca_stats_t s = stats();
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.num_device_free, 1);
  assert_int_equal(gca_sim_used_bytes(0), 0);
  void *q = alloc_on(4096, NULL);
  free_ok(q);
  assert_int_equal(stats().num_device_alloc, 2);
  assert_ok(gca_set_caching(true));
  assert_ok(gca_stream_destroy(b));
}

static void caching_off_empties_the_cache(void **state) {
  (void)state;
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 2 * MiB);
  assert_ok(gca_set_caching(false));
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_set_caching(true));
}

static const char *no_caching_env(const char *name, void *ctx) {
  (void)ctx;
  if (strcmp(name, "GCA_NO_CACHING") == 0)
    return "1";
  return getenv(name);
}

static void no_caching_env_frees_to_the_driver(void **state) {
  (void)state;
  assert_nothing_leaked();
  gca__allocator_reset();
  gca__env_set_hook(no_caching_env, NULL);
  void *p = alloc_on(4096, NULL);
  void *q = alloc_on(5 * MiB, NULL);
  free_ok(p);
  free_ok(q);
  gca_stats_t s = stats();
  assert_int_equal(s.num_device_alloc, 2);
  assert_int_equal(s.num_device_free, 2);
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 0);
  gca__env_set_hook(NULL, NULL);
}

/* ---- streams of another device ---- */

static bool two_devices(void) {
  int n = 0;
  assert_ok(gca_device_count(&n));
  if (n < 2)
    printf("SKIP: needs two sim devices (found %d)\n", n);
  return n >= 2;
}

typedef struct {
  uint32_t *p;
  size_t n;
} stamp_t;

/* Holds its stream until the gate opens, then writes stamps into the block. */
static void hold_then_stamp(void *arg) {
  const stamp_t *s = arg;
  while (atomic_load(&gate) == 0)
    sched_yield();
  for (size_t i = 0; i < s->n; i++)
    s->p[i] = 0x5a000000u + (uint32_t)i;
}

static void stream_of_another_device_gets_its_event_there(void **state) {
  (void)state;
  if (!two_devices())
    skip();
  gca_stream_t a = mk_stream(), b1;
  assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &b1));
  gca_sim_counters_reset();
  for (int round = 0; round < 2; round++) {
    uint32_t *p = alloc_on(4096, a);
    stamp_t st = {p, 4096 / 4};
    assert_ok(gca_record_stream(p, b1));
    atomic_store(&gate, 0);
    assert_ok(gca_launch_host_func(b1, hold_then_stamp, &st));
    free_ok(p); /* an event from device 1's pool, recorded on b1 */
    void *q = alloc_on(4096, a);
    assert_ptr_not_equal(q, p);
    gca_stats_t s = stats();
    assert_int_equal(s.allocation[GCA_STAT_ALL].current, 1);
    assert_int_equal(s.active[GCA_STAT_ALL].current, 2);
    free_ok(q);
    atomic_store(&gate, 1);
    assert_ok(gca_stream_synchronize(b1));
    void *r = alloc_on(4096, a); /* the event completed: p is free again */
    assert_ptr_equal(r, p);
    for (size_t i = 0; i < st.n; i++)
      if (p[i] != 0x5a000000u + (uint32_t)i)
        fail_msg("stamp %zu is 0x%x: the block was reused before device 1's work", i, p[i]);
    free_ok(r);
  }
  assert_int_equal(gca_sim_call_count("event_create"), 1); /* one event, pooled on device 1 */
  assert_int_equal(gca_sim_call_count("event_record"), 2);
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(a));
  assert_ok(gca_stream_destroy(b1));
}

typedef struct {
  void *p;
  gca_status_t st;
  char detail[256];
} null_rec_t;

/* On device 1: records p's use on the NULL stream (device 1's legacy stream)
 * and holds that stream. */
static void *record_null_on_device_1(void *arg) {
  null_rec_t *r = arg;
  r->st = gca_set_device(1);
  if (r->st == GCA_OK)
    r->st = gca_record_stream(r->p, NULL);
  if (r->st == GCA_OK) {
    atomic_store(&gate, 0);
    r->st = gca_launch_host_func(NULL, hold_stream, NULL);
  }
  if (r->st != GCA_OK)
    snprintf(r->detail, sizeof(r->detail), "%s", gca_last_error());
  return NULL;
}

/* A block of device 0 whose use a device-1 thread recorded on the NULL
 * stream, which that thread holds until the gate opens. */
static void *alloc_null_recorded_on_device_1(void) {
  null_rec_t r = {.p = alloc_on(4096, NULL)};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, record_null_on_device_1, &r), 0);
  pthread_join(t, NULL);
  if (r.st != GCA_OK)
    fail_msg("device-1 thread: %s: %s", gca_status_name(r.st), r.detail);
  return r.p;
}

static void recorded_null_stream_is_the_recording_threads_device(void **state) {
  (void)state;
  if (!two_devices())
    skip();
  void *p = alloc_null_recorded_on_device_1();
  free_ok(p); /* on device 0's thread: the event goes to device 1's legacy stream */
  int dev = -1;
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 0);                /* and this thread's device is put back */
  assert_ok(gca_stream_synchronize(NULL)); /* device 0's legacy stream: not the one recorded */
  void *q = alloc_on(4096, NULL);
  assert_ptr_not_equal(q, p); /* device 1's legacy stream is held */
  free_ok(q);
  atomic_store(&gate, 1);
  assert_ok(ops->ctx_set_device(1));
  assert_ok(gca_stream_synchronize(NULL));
  assert_ok(ops->ctx_set_device(0));
  q = alloc_on(4096, NULL);
  assert_ptr_equal(q, p);
  free_ok(q);
}

/* Making device 1 current for its legacy stream fails: the free fails, p
 * stays live and recorded, this thread's device is unchanged. */
static void device_switch_fault_fails_the_free_cleanly(void **state) {
  (void)state;
  if (!two_devices())
    skip();
  void *p = alloc_null_recorded_on_device_1();
  atomic_store(&gate, 1); /* nothing needs the held legacy stream here */
  assert_ok(gca_sim_fault_set("ctx_set_device:nth=1"));
  assert_status(gca_free(p), GCA_ERR_DRIVER, "ctx_set_device");
  gca_sim_fault_clear();
  check();
  int dev = -1;
  assert_ok(ops->ctx_get_device(&dev));
  assert_int_equal(dev, 0);
  assert_ok(gca_pointer_info(p, NULL, NULL));
  free_ok(p);
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 1); /* waits for device 1's legacy */
  assert_ok(ops->ctx_set_device(1));
  assert_ok(gca_stream_synchronize(NULL));
  assert_ok(ops->ctx_set_device(0));
  assert_ok(gca_empty_cache());
  check();
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 0);
}

static void faults_on_another_devices_stream_fail_cleanly(void **state) {
  (void)state;
  if (!two_devices())
    skip();
  gca_stream_t b1;
  assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &b1));
  void *p = alloc_on(4096, NULL);
  /* the stream's device cannot be found: nothing is recorded */
  assert_ok(gca_sim_fault_set("stream_get_device:nth=1"));
  assert_status(gca_record_stream(p, b1), GCA_ERR_DRIVER, "record_stream: 0x");
  gca_sim_fault_clear();
  check();
  assert_ok(gca_record_stream(p, b1));
  /* no event can be made on device 1: the free fails and p stays live */
  gca_stats_t before = stats();
  assert_ok(gca_sim_fault_set("event_create:nth=1"));
  assert_status(gca_free(p), GCA_ERR_DRIVER, "event_create");
  gca_sim_fault_clear();
  check();
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current,
                   before.allocation[GCA_STAT_ALL].current);
  assert_ok(gca_pointer_info(p, NULL, NULL));
  assert_ok(gca_sim_fault_set("event_record:nth=1"));
  assert_status(gca_free(p), GCA_ERR_DRIVER, "event_record");
  gca_sim_fault_clear();
  check();
  assert_ok(gca_pointer_info(p, NULL, NULL));
  free_ok(p); /* still recorded on b1 */
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 1);
  assert_ok(gca_stream_synchronize(b1));
  assert_ok(gca_empty_cache());
  check();
  gca_stats_t s = stats();
  assert_int_equal(s.active[GCA_STAT_ALL].current, 0);
  assert_int_equal(s.reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(b1));
}

/* ---- Note [Per-thread stream keys] ---- */

typedef struct ptds_other {
  void *got;
  gca_status_t st;
  size_t size;
} ptds_other_t;

/* Another thread's request on its own per-thread stream; the block is stamped
 * by the host and kept (the test's thread checks and frees it). */
static void *alloc_on_own_ptds(void *arg) {
  ptds_other_t *o = arg;
  o->st = gca_malloc(&o->got, o->size, GCA_STREAM_PER_THREAD);
  if (o->st == GCA_OK)
    stamp_fill(o->got, o->size, 0x7d5);
  return NULL;
}

static void per_thread_stream_blocks_are_not_shared_between_threads(void **state) {
  (void)state;
  const size_t size = 64 * KiB;
  void *p = alloc_on(size, GCA_STREAM_PER_THREAD);
  hold(GCA_STREAM_PER_THREAD); /* this thread's per-thread stream */
  assert_ok(gca_kernel_fill_u32(p, 0xabc00000u, 1, size / 4, GCA_STREAM_PER_THREAD));
  free_ok(p);
  /* the same thread reuses it at once: its work queues behind the fill */
  void *q = alloc_on(size, GCA_STREAM_PER_THREAD);
  assert_ptr_equal(q, p);
  free_ok(q);
  /* another thread's per-thread stream is another stream */
  ptds_other_t o = {.size = size};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, alloc_on_own_ptds, &o), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_ok(o.st);
  assert_ptr_not_equal(o.got, p);
  check();
  atomic_store(&gate, 1);
  assert_ok(gca_stream_synchronize(GCA_STREAM_PER_THREAD));
  assert_int_equal(stamp_mismatch(o.got, size, 0x7d5), -1);
  free_ok(o.got);               /* back under the other thread's key */
  assert_ok(gca_empty_cache()); /* its segment's release waits for the device */
  check();
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
}

static void legacy_handle_is_the_null_stream(void **state) {
  (void)state;
  void *p = alloc_on(4096, NULL);
  free_ok(p);
  void *q = alloc_on(4096, GCA_STREAM_LEGACY);
  assert_ptr_equal(q, p);
  assert_ok(gca_record_stream(q, NULL)); /* its own stream: no use */
  assert_ok(gca_record_stream(q, GCA_STREAM_LEGACY));
  int64_t records = gca_sim_call_count("event_record");
  free_ok(q);
  assert_int_equal(gca_sim_call_count("event_record"), records);
  assert_ptr_equal(alloc_on(4096, NULL), p);
  free_ok(p);
}

/* A block recorded on another thread's per-thread stream: its free cannot
 * reach that stream, so it waits for the device (with the lock released)
 * and the block is free at once after it. The opener opens the gate once
 * the free has begun to wait (the sim counts ctx_synchronize at its entry) or
 * once the free has returned and the block was read, so a free that does not
 * wait sees the work unfinished. */
static atomic_int free_returned;
static int64_t ctx_syncs_before;

static void *open_when_waited(void *arg) {
  (void)arg;
  while (gca_sim_call_count("ctx_synchronize") <= ctx_syncs_before &&
         atomic_load(&free_returned) == 0)
    sched_yield();
  atomic_store(&gate, 1);
  return NULL;
}

typedef struct ptds_use {
  void *p;
  size_t size;
  gca_status_t st[3];
} ptds_use_t;

static void *use_on_own_ptds(void *arg) {
  ptds_use_t *u = arg;
  u->st[0] = gca_record_stream(u->p, GCA_STREAM_PER_THREAD);
  atomic_store(&gate, 0);
  u->st[1] = gca_launch_host_func(GCA_STREAM_PER_THREAD, hold_stream, NULL);
  u->st[2] = gca_kernel_fill_u32(u->p, 0x5a000000u, 1, u->size / 4, GCA_STREAM_PER_THREAD);
  return NULL;
}

static void free_of_a_block_used_on_another_threads_per_thread_stream_waits(void **state) {
  (void)state;
  gca_stream_t s = mk_stream();
  ptds_use_t u = {.size = 4096};
  u.p = alloc_on(u.size, s);
  pthread_t t, opener;
  assert_int_equal(pthread_create(&t, NULL, use_on_own_ptds, &u), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  for (int i = 0; i < 3; i++)
    assert_ok(u.st[i]);
  atomic_store(&free_returned, 0);
  ctx_syncs_before = gca_sim_call_count("ctx_synchronize");
  assert_int_equal(pthread_create(&opener, NULL, open_when_waited, NULL), 0);
  gca_status_t st = gca_free(u.p);
  uint32_t first = *(volatile uint32_t *)u.p; /* the fill, if the free waited for it */
  atomic_store(&free_returned, 1);
  assert_int_equal(pthread_join(opener, NULL), 0);
  assert_ok(st);
  assert_int_equal(first, 0x5a000000u);
  assert_int_equal(gca_sim_call_count("ctx_synchronize"), ctx_syncs_before + 1);
  check();
  /* nothing pending: the same stream gets the block back */
  assert_ptr_equal(alloc_on(u.size, s), u.p);
  free_ok(u.p);
  assert_ok(gca_device_synchronize());
  assert_ok(gca_stream_destroy(s));
}

/* A block used on destroyed streams of two devices, freed during a capture:
 * deferred, then once the capture is over each device is waited for once (a
 * use counted done by one wait is dropped, so the flush after the next wait
 * does not meet it again), and the free completes. */
static void uses_on_destroyed_streams_of_two_devices_wait_for_each_once(void **state) {
  (void)state;
  if (!two_devices())
    skip();
  gca_stream_t s = mk_stream(), a = mk_stream(), a2 = mk_stream(), b1;
  assert_ok(ops->stream_create(1, GCA_STREAM_NON_BLOCKING, 0, &b1));
  void *p = alloc_on(4096, a);
  assert_ok(gca_record_stream(p, a2));
  assert_ok(gca_record_stream(p, b1));
  assert_ok(gca_stream_destroy(a2));
  assert_ok(gca_stream_destroy(b1));
  int64_t before = gca_sim_call_count("ctx_synchronize");
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  free_ok(p); /* deferred */
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_graph_destroy(g));
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 1);
  void *q = alloc_on(4096, a); /* waits for both devices on the way out */
  free_ok(q);
  assert_int_equal(gca_sim_call_count("ctx_synchronize"), before + 2);
  gca_stats_t st = stats();
  assert_int_equal(st.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(st.active[GCA_STAT_ALL].current, 0);
  check();
  q = alloc_on(4096, a); /* complete: the same stream gets it back */
  assert_ptr_equal(q, p);
  free_ok(q);
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(a));
}

/* Note [Capture gate] (device.c): while a capture runs in global mode, a
 * device wait invalidates it. A free that needs one (a use on a destroyed
 * stream, or on another thread's per-thread stream) is then deferred (Note
 * [Gone streams of deferred frees]): the capture stays active, the block stays
 * active (pending) and out of reach until a call after the capture waits for
 * the device. */
static void *record_on_own_ptds(void *arg) {
  ptds_use_t *u = arg;
  u->st[0] = gca_record_stream(u->p, GCA_STREAM_PER_THREAD);
  return NULL;
}

static void free_needing_a_device_wait_is_deferred_during_a_capture(bool foreign) {
  gca_stream_t s = mk_stream(), a = mk_stream(), gone = mk_stream();
  ptds_use_t u = {.size = 4096};
  u.p = alloc_on(u.size, a);
  if (foreign) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, record_on_own_ptds, &u), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_ok(u.st[0]);
  } else {
    assert_ok(gca_record_stream(u.p, gone));
  }
  assert_ok(gca_stream_destroy(gone));
  int64_t before = gca_sim_call_count("ctx_synchronize");
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  free_ok(u.p);
  assert_int_equal(gca_sim_call_count("ctx_synchronize"), before);
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  assert_ok(gca_stream_capture_status(s, &cs));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_ACTIVE);
  gca_stats_t st = stats();
  assert_int_equal(st.allocation[GCA_STAT_ALL].current, 0);
  assert_int_equal(st.active[GCA_STAT_ALL].current, 1); /* deferred */
  void *q = alloc_on(u.size, a);                        /* not handed out again yet */
  assert_ptr_not_equal(q, u.p);
  free_ok(q);
  check();
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_graph_destroy(g));
  q = alloc_on(u.size, a); /* waits for the device on the way out */
  free_ok(q);
  assert_int_equal(gca_sim_call_count("ctx_synchronize"), before + 1);
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 0);
  check();
  assert_ok(gca_empty_cache());
  assert_int_equal(stats().reserved_bytes[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(a));
}

/* The deferral needs host memory for its list: without it the free fails
 * with the message, the block stays live and allocated (its pointer valid),
 * the capture goes on, and after it the same free succeeds. */
static void a_deferral_out_of_host_memory_fails_the_free_cleanly(void **state) {
  (void)state;
  gca_stream_t s = mk_stream(), a = mk_stream(), gone = mk_stream();
  void *p = alloc_on(4096, a);
  assert_ok(gca_record_stream(p, gone));
  assert_ok(gca_stream_destroy(gone));
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca__failpoint_arm("defer_free", 1));
  assert_status(gca_free(p), GCA_ERR_OUT_OF_MEMORY, "host out of memory deferring the free");
  gca__failpoint_clear();
  check();
  gca_capture_status_t cs = GCA_CAPTURE_STATUS_NONE;
  assert_ok(gca_stream_capture_status(s, &cs));
  assert_int_equal(cs, GCA_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(stats().allocation[GCA_STAT_ALL].current, 1);
  size_t sz = 0;
  int dev = -1;
  assert_ok(gca_pointer_info(p, &sz, &dev)); /* still live */
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(s, &g));
  assert_ok(gca_graph_destroy(g));
  free_ok(p);
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 0);
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_stream_destroy(a));
}

static void free_of_a_destroyed_streams_block_is_deferred_during_a_capture(void **state) {
  (void)state;
  free_needing_a_device_wait_is_deferred_during_a_capture(false);
}

static void free_of_another_threads_ptds_block_is_deferred_during_a_capture(void **state) {
  (void)state;
  free_needing_a_device_wait_is_deferred_during_a_capture(true);
}

/* A free of a block used on a stream that is capturing, with no pool routed
 * (the allocator was not told of the capture): an event recorded there would
 * be a node of the graph, not work the allocator can query (the query fails
 * while and after the capture), so the free waits, deferred, until the stream
 * no longer captures; the calls meanwhile do not fail. */
static void free_of_a_block_used_on_a_capturing_stream_waits_for_the_capture(void **state) {
  (void)state;
  gca_stream_t a = mk_stream(), y = mk_stream();
  void *x = alloc_on(4096, a);
  assert_ok(gca_record_stream(x, y));
  assert_ok(gca_stream_begin_capture(y, GCA_CAPTURE_MODE_RELAXED));
  free_ok(x);
  void *q = alloc_on(4096, a); /* not x: its free waits */
  assert_ptr_not_equal(q, x);
  free_ok(q);
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 1);
  gca_graph_t g;
  assert_ok(gca_stream_end_capture(y, &g));
  assert_ok(gca_graph_destroy(g));
  q = alloc_on(4096, a); /* the event is recorded now, on y's eager work */
  free_ok(q);
  assert_ok(gca_stream_synchronize(y));
  /* x is free once its event is seen done: the first request may take the
   * cached q (whether the event had run on y's worker when q was served
   * decides which block q was), the second finds x */
  void *q1 = alloc_on(4096, a), *q2 = alloc_on(4096, a);
  assert_true(q1 == x || q2 == x);
  free_ok(q1);
  free_ok(q2);
  assert_int_equal(stats().active[GCA_STAT_ALL].current, 0);
  check();
  assert_ok(gca_stream_destroy(a));
  assert_ok(gca_stream_destroy(y));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(block_waits_for_recorded_stream_before_reuse, alloc_setup,
                                      streams_teardown),
      cmocka_unit_test_setup_teardown(pending_block_shows_as_pending_free, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(cached_pair_makes_no_device_call, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(record_on_own_stream_is_a_no_op, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(events_are_pooled, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(multiple_streams_all_must_finish, alloc_setup,
                                      streams_teardown),
      cmocka_unit_test_setup_teardown(empty_cache_waits_for_pending_frees, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(no_caching_returns_memory_after_recorded_work, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(caching_off_empties_the_cache, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(stream_of_another_device_gets_its_event_there, alloc_setup,
                                      streams_teardown),
      cmocka_unit_test_setup_teardown(uses_on_destroyed_streams_of_two_devices_wait_for_each_once,
                                      alloc_setup, streams_teardown),
      cmocka_unit_test_setup_teardown(
          free_of_a_block_used_on_a_capturing_stream_waits_for_the_capture, alloc_setup,
          streams_teardown),
      cmocka_unit_test_setup_teardown(
          free_of_a_destroyed_streams_block_is_deferred_during_a_capture, alloc_setup,
          streams_teardown),
      cmocka_unit_test_setup_teardown(a_deferral_out_of_host_memory_fails_the_free_cleanly,
                                      alloc_setup, streams_teardown),
      cmocka_unit_test_setup_teardown(
          free_of_another_threads_ptds_block_is_deferred_during_a_capture, alloc_setup,
          streams_teardown),
      cmocka_unit_test_setup_teardown(recorded_null_stream_is_the_recording_threads_device,
                                      alloc_setup, streams_teardown),
      cmocka_unit_test_setup_teardown(faults_on_another_devices_stream_fail_cleanly, alloc_setup,
                                      streams_teardown),
      cmocka_unit_test_setup_teardown(device_switch_fault_fails_the_free_cleanly, alloc_setup,
                                      streams_teardown),
      cmocka_unit_test_setup_teardown(per_thread_stream_blocks_are_not_shared_between_threads,
                                      alloc_setup, streams_teardown),
      cmocka_unit_test_setup_teardown(legacy_handle_is_the_null_stream, alloc_setup,
                                      streams_teardown),
      cmocka_unit_test_setup_teardown(
          free_of_a_block_used_on_another_threads_per_thread_stream_waits, alloc_setup,
          streams_teardown),
      cmocka_unit_test_setup_teardown(a_free_block_holds_no_uses_array, alloc_setup,
                                      streams_teardown),
      cmocka_unit_test_setup_teardown(no_caching_env_frees_to_the_driver, alloc_setup,
                                      alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
