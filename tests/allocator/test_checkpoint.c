/* test_checkpoint.c - checkpoint and restore of a private pool's layout: a
 * seeded property test (random allocations and frees, checkpoint, more of
 * them, restore: the layout equals the checkpoint's and the reported pointer
 * sets are exactly the difference), and every refusal leaving the pool as it
 * was. GCA_TEST_SEED fixes the seed; it is printed either way. */
#include <inttypes.h>
#include <time.h>

#include "alloc_fixture.h"

#define MAX_BLOCKS 4096
#define MAX_SEGS   256
#define MAX_LIVE   512

static bool expandable_mode; /* the property test runs with expandable segments */

typedef struct wblock {
  gca_devptr_t addr;
  size_t size;
  gca_block_state_t state;
} wblock_t;

/* The pool's segments and blocks, in address order. */
typedef struct pool_view {
  uint64_t id[2];
  size_t nsegs, nblocks;
  gca_devptr_t seg_addr[MAX_SEGS];
  size_t seg_first[MAX_SEGS], seg_n[MAX_SEGS];
  wblock_t blocks[MAX_BLOCKS];
} pool_view_t;

static void view_fn(const gca_segment_info_t *seg, const gca_block_info_t *blocks, size_t n,
                    void *ctx) {
  pool_view_t *v = ctx;
  if (seg->pool_id[0] != v->id[0] || seg->pool_id[1] != v->id[1])
    return;
  assert_true(v->nsegs < MAX_SEGS && v->nblocks + n <= MAX_BLOCKS);
  v->seg_addr[v->nsegs] = seg->address;
  v->seg_first[v->nsegs] = v->nblocks;
  v->seg_n[v->nsegs++] = n;
  for (size_t i = 0; i < n; i++)
    v->blocks[v->nblocks++] = (wblock_t){blocks[i].address, blocks[i].size, blocks[i].state};
}

static pool_view_t *view_of(gca_pool_t *pool) {
  static pool_view_t views[4];
  static int next;
  pool_view_t *v = &views[next++ % 4];
  memset(v, 0, sizeof(*v));
  assert_ok(gca_pool_id(pool, v->id));
  assert_ok(gca__allocator_walk(0, view_fn, v));
  return v;
}

static void assert_same_view(const pool_view_t *a, const pool_view_t *b) {
  assert_int_equal(a->nsegs, b->nsegs);
  assert_int_equal(a->nblocks, b->nblocks);
  assert_memory_equal(a->seg_addr, b->seg_addr, a->nsegs * sizeof(a->seg_addr[0]));
  assert_memory_equal(a->seg_n, b->seg_n, a->nsegs * sizeof(a->seg_n[0]));
  assert_memory_equal(a->blocks, b->blocks, a->nblocks * sizeof(a->blocks[0]));
}

/* after equals the checkpointed view on the saved segments; segments made
 * since are one free block each. */
/* Expandable segments: space mapped since the checkpoint is free, so the
 * live blocks are those saved and every saved free block lies in a free one. */
static void assert_restored_expandable(const pool_view_t *saved, const pool_view_t *after) {
  size_t live_saved = 0, live_after = 0;
  for (size_t i = 0; i < after->nblocks; i++)
    live_after += after->blocks[i].state != GCA_BLOCK_INACTIVE;
  for (size_t i = 0; i < saved->nblocks; i++) {
    const wblock_t *s = &saved->blocks[i];
    bool found = false;
    live_saved += s->state != GCA_BLOCK_INACTIVE;
    for (size_t k = 0; k < after->nblocks && !found; k++) {
      const wblock_t *a = &after->blocks[k];
      if (s->state == GCA_BLOCK_INACTIVE)
        found = a->state == GCA_BLOCK_INACTIVE && a->addr <= s->addr &&
                s->addr + s->size <= a->addr + a->size;
      else
        found = a->addr == s->addr && a->size == s->size && a->state == s->state;
    }
    if (!found)
      fail_msg("saved block 0x%" PRIx64 " (%zu bytes, state %d) not restored", s->addr, s->size,
               (int)s->state);
  }
  assert_int_equal(live_saved, live_after);
}

static void assert_restored(const pool_view_t *saved, const pool_view_t *after) {
  size_t k = 0;
  if (expandable_mode) {
    assert_restored_expandable(saved, after);
    return;
  }
  for (size_t i = 0; i < after->nsegs; i++) {
    const wblock_t *ab = &after->blocks[after->seg_first[i]];
    if (k < saved->nsegs && saved->seg_addr[k] == after->seg_addr[i]) {
      assert_int_equal(after->seg_n[i], saved->seg_n[k]);
      assert_memory_equal(ab, &saved->blocks[saved->seg_first[k]], saved->seg_n[k] * sizeof(*ab));
      k++;
    } else {
      assert_int_equal(after->seg_n[i], 1);
      assert_int_equal(ab->state, GCA_BLOCK_INACTIVE);
    }
  }
  assert_int_equal(k, saved->nsegs);
}

typedef struct live {
  void *p[MAX_LIVE];
  size_t size[MAX_LIVE];
  size_t n;
} live_t;

static uint64_t rng_state;

static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static size_t random_size(void) {
  switch (rnd() % 4) {
  case 0:
  case 1:
    return 1 + rnd() % (64 * KiB);
  case 2:
    return 64 * KiB + rnd() % MiB;
  default:
    return MiB + rnd() % (12 * MiB);
  }
}

static void random_ops(gca_pool_t *pool, gca_stream_t *streams, live_t *l, int count) {
  assert_ok(gca_pool_use_begin(pool));
  for (int i = 0; i < count; i++) {
    if (l->n < MAX_LIVE && (l->n == 0 || rnd() % 100 < 60)) {
      void *p = NULL;
      assert_ok(gca_malloc(&p, random_size(), streams[rnd() % 2]));
      l->p[l->n] = p;
      l->size[l->n++] = block_size_of(p);
    } else {
      size_t k = rnd() % l->n;
      assert_ok(gca_free(l->p[k]));
      l->p[k] = l->p[--l->n];
      l->size[k] = l->size[l->n];
    }
  }
  assert_ok(gca_pool_use_end(pool));
  check();
}

static bool has(const live_t *l, void *p, size_t size) {
  for (size_t i = 0; i < l->n; i++)
    if (l->p[i] == p && l->size[i] == size)
      return true;
  return false;
}

static int ptr_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Sorted pointers of `a` not in `b` (same address and size). */
static size_t difference(const live_t *a, const live_t *b, void **out) {
  size_t n = 0;
  for (size_t i = 0; i < a->n; i++)
    if (!has(b, a->p[i], a->size[i]))
      out[n++] = a->p[i];
  qsort(out, n, sizeof(void *), ptr_cmp);
  return n;
}

static void restore_and_compare(gca_pool_t *pool, const gca_pool_state_t *st,
                                const pool_view_t *saved, const live_t *then, live_t *now) {
  static void *want_freed[MAX_LIVE], *want_alloc[MAX_LIVE];
  size_t nf = difference(now, then, want_freed), na = difference(then, now, want_alloc);
  gca_pool_changes_t ch;
  assert_ok(gca_pool_restore(pool, st, &ch));
  check();
  printf("  restore: %zu freed, %zu allocated, %zu live\n", ch.nfreed, ch.nallocated, then->n);
  assert_restored(saved, view_of(pool));
  assert_int_equal(ch.nfreed, nf);
  assert_int_equal(ch.nallocated, na);
  if (nf > 0)
    assert_memory_equal(ch.freed, want_freed, nf * sizeof(void *));
  if (na > 0)
    assert_memory_equal(ch.allocated, want_alloc, na * sizeof(void *));
  for (size_t i = 0; i < nf; i++) {
    bool live_again = false; /* the same address may be live with another size */
    for (size_t k = 0; k < then->n; k++)
      live_again |= then->p[k] == want_freed[i];
    if (!live_again)
      assert_status(gca_free(want_freed[i]), GCA_ERR_INVALID_POINTER, "free");
  }
  gca_pool_changes_free(&ch);
  assert_null(ch.freed);
  *now = *then;
  for (size_t i = 0; i < now->n; i++)
    assert_int_equal(block_size_of(now->p[i]), now->size[i]);
  check();
}

static void property_test(bool expandable) {
  const char *env = getenv("GCA_TEST_SEED");
  uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
  printf("checkpoint property test (%s segments): GCA_TEST_SEED=%" PRIu64 "\n",
         expandable ? "expandable" : "classic", seed);
  expandable_mode = expandable;
  if (expandable)
    assert_ok(gca_set_config("expandable_segments:True"));
  gca_stream_t streams[2];
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &streams[0]));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &streams[1]));
  for (uint64_t round = 0; round < 6; round++) {
    rng_state = (seed + round) * 0x9e3779b97f4a7c15ull | 1;
    gca_pool_t *pool = NULL;
    assert_ok(gca_pool_create(0, NULL, &pool));
    static live_t now, then;
    memset(&now, 0, sizeof(now));
    random_ops(pool, streams, &now, 150);
    gca_pool_state_t *st = NULL;
    assert_ok(gca_pool_checkpoint(pool, &st));
    then = now;
    static pool_view_t saved;
    saved = *view_of(pool);
    random_ops(pool, streams, &now, 150);
    restore_and_compare(pool, st, &saved, &then, &now);
    random_ops(pool, streams, &now, 100); /* the state can be applied again */
    restore_and_compare(pool, st, &saved, &then, &now);
    restore_and_compare(pool, st, &saved, &then, &now); /* a no-op restore changes nothing */
    for (size_t i = 0; i < now.n; i++)
      assert_ok(gca_free(now.p[i]));
    gca_pool_state_free(st);
    assert_ok(gca_pool_release(pool));
    check();
    assert_int_equal(gca_sim_used_bytes(0), 0);
  }
  assert_ok(ops->stream_destroy(streams[0]));
  assert_ok(ops->stream_destroy(streams[1]));
}

static void restore_rebuilds_the_checkpointed_layout_exactly(void **state) {
  (void)state;
  property_test(false);
}

/* Space mapped since the checkpoint comes back free; the rest is exact. */
static void restore_rebuilds_expandable_segments_too(void **state) {
  (void)state;
  property_test(true);
}

static void *pool_alloc(gca_pool_t *pool, size_t size) {
  assert_ok(gca_pool_use_begin(pool));
  void *p = alloc_on(size, NULL);
  assert_ok(gca_pool_use_end(pool));
  return p;
}

static void restore_of_a_foreign_state_is_refused(void **state) {
  (void)state;
  gca_pool_t *a = NULL, *b = NULL;
  assert_ok(gca_pool_create(0, NULL, &a));
  assert_ok(gca_pool_create(0, NULL, &b));
  void *x = pool_alloc(a, 4096), *y = pool_alloc(b, 4096);
  gca_pool_state_t *sa = NULL;
  assert_ok(gca_pool_checkpoint(a, &sa));
  pool_view_t before = *view_of(b);
  gca_pool_changes_t ch = {.nfreed = 99};
  assert_status(gca_pool_restore(b, sa, &ch), GCA_ERR_INVALID_ARGUMENT, "not from pool");
  assert_int_equal(ch.nfreed, 0);
  assert_same_view(&before, view_of(b));
  check();
  assert_status(gca_pool_restore(b, NULL, &ch), GCA_ERR_INVALID_ARGUMENT, "state is NULL");
  assert_status(gca_pool_checkpoint(a, NULL), GCA_ERR_INVALID_ARGUMENT, "output");
  free_ok(x);
  free_ok(y);
  assert_ok(gca_pool_release(a));
  assert_status(gca_pool_restore(a, sa, &ch), GCA_ERR_INVALID_HANDLE, "pool_restore");
  gca_pool_state_t *none = sa;
  assert_status(gca_pool_checkpoint(a, &none), GCA_ERR_INVALID_HANDLE, "pool_checkpoint");
  assert_null(none);
  gca_pool_state_free(sa);
  assert_ok(gca_pool_release(b));
}

static void restore_of_a_stale_state_is_refused(void **state) {
  (void)state;
  gca_pool_t *pool = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  void *small = pool_alloc(pool, 4096), *big = pool_alloc(pool, 3 * MiB);
  gca_pool_state_t *st = NULL;
  assert_ok(gca_pool_checkpoint(pool, &st));
  assert_ok(gca_set_caching(false));
  free_ok(big); /* its segment goes back to the driver */
  assert_ok(gca_set_caching(true));
  void *more = pool_alloc(pool, 8192);
  pool_view_t before = *view_of(pool);
  assert_status(gca_pool_restore(pool, st, NULL), GCA_ERR_INVALID_STATE, "stale");
  assert_same_view(&before, view_of(pool));
  check();
  free_ok(small);
  free_ok(more);
  gca_pool_state_free(st);
  assert_ok(gca_pool_release(pool));
}

static void restore_during_a_capture_of_the_pool_is_refused(void **state) {
  (void)state;
  gca_stream_t s;
  gca_graph_t graph = NULL;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s));
  gca_pool_t *pool = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  void *x = pool_alloc(pool, 4096);
  gca_pool_state_t *st = NULL;
  assert_ok(gca_pool_checkpoint(pool, &st));
  free_ok(x);
  assert_ok(ops->stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_pool_begin_capture(pool, s));
  void *y = alloc_on(8192, s);
  pool_view_t before = *view_of(pool);
  assert_status(gca_pool_restore(pool, st, NULL), GCA_ERR_INVALID_STATE, "capture");
  assert_same_view(&before, view_of(pool));
  assert_ok(ops->stream_end_capture(s, &graph));
  assert_non_null(graph);
  assert_ok(gca_pool_end_capture(pool, s));
  gca_pool_changes_t ch;
  assert_ok(gca_pool_restore(pool, st, &ch)); /* y freed, x live again */
  assert_int_equal(ch.nfreed, 1);
  assert_ptr_equal(ch.freed[0], y);
  assert_int_equal(ch.nallocated, 1);
  assert_ptr_equal(ch.allocated[0], x);
  gca_pool_changes_free(&ch);
  check();
  free_ok(x);
  gca_pool_state_free(st);
  assert_ok(ops->graph_destroy(graph));
  assert_ok(gca_pool_release(pool));
  assert_ok(ops->stream_destroy(s));
}

static void restore_waits_for_pending_frees_of_the_pool(void **state) {
  (void)state;
  gca_stream_t user;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &user));
  gca_pool_t *pool = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  gca_pool_state_t *st = NULL;
  void *a = pool_alloc(pool, 4096);
  assert_ok(gca_pool_checkpoint(pool, &st));
  void *b = pool_alloc(pool, 4096);
  assert_ok(gca_record_stream(b, user));
  assert_ok(ops->kernel_sleep(5000000, user));
  free_ok(b); /* pending on user's event */
  int64_t syncs = stats().num_sync_all_streams;
  gca_pool_changes_t ch;
  assert_ok(gca_pool_restore(pool, st, &ch));
  assert_int_equal(stats().num_sync_all_streams, syncs + 1);
  assert_int_equal(ch.nfreed, 0);
  assert_int_equal(ch.nallocated, 0);
  gca_pool_changes_free(&ch);
  check();
  free_ok(a);
  gca_pool_state_free(st);
  assert_ok(gca_pool_release(pool));
  assert_ok(ops->stream_destroy(user));
}

static void restore_sync_failure_leaves_the_pool_as_it_was(void **state) {
  (void)state;
  gca_stream_t user;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &user));
  gca_pool_t *pool = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  gca_pool_state_t *st = NULL;
  void *a = pool_alloc(pool, 4096);
  assert_ok(gca_pool_checkpoint(pool, &st));
  void *b = pool_alloc(pool, 4096);
  assert_ok(gca_record_stream(b, user));
  free_ok(b); /* pending on user's event */
  pool_view_t before = *view_of(pool);
  assert_ok(gca_sim_fault_set("event_synchronize:nth=1"));
  gca_pool_changes_t ch = {.nfreed = 99, .nallocated = 99};
  assert_status(gca_pool_restore(pool, st, &ch), GCA_ERR_DRIVER, "event_synchronize");
  gca_sim_fault_clear();
  assert_int_equal(ch.nfreed, 0);
  assert_int_equal(ch.nallocated, 0);
  assert_same_view(&before, view_of(pool));
  check();
  assert_ok(gca_pool_restore(pool, st, &ch)); /* the retry waits and applies the state */
  assert_int_equal(ch.nfreed, 0);
  assert_int_equal(ch.nallocated, 0);
  gca_pool_changes_free(&ch);
  check();
  free_ok(a);
  gca_pool_state_free(st);
  assert_ok(gca_pool_release(pool));
  assert_ok(ops->stream_destroy(user));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(restore_rebuilds_the_checkpointed_layout_exactly, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_rebuilds_expandable_segments_too, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_of_a_foreign_state_is_refused, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_of_a_stale_state_is_refused, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_during_a_capture_of_the_pool_is_refused, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_waits_for_pending_frees_of_the_pool, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_sync_failure_leaves_the_pool_as_it_was, alloc_setup,
                                      alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
