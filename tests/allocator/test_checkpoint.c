/* SPDX-License-Identifier: Apache-2.0 */
/* test_checkpoint.c - checkpoint and restore of a private pool's layout: a
 * seeded property test (random allocations and frees, checkpoint, more of
 * them, restore: the layout equals the checkpoint's and the reported pointer
 * sets are exactly the difference), the trim that gives back memory mapped
 * since the checkpoint in expandable segments, and every refusal leaving the
 * pool as it was. GCA_TEST_SEED fixes the seed; it is printed either way. */
#include <inttypes.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "alloc_fixture.h"
#include "gca.h"
#include "support.h"

#define MAX_BLOCKS 4096
#define MAX_SEGS   256
#define MAX_LIVE   512
#define MAX_MAPS   256

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

/* The pool's expandable mappings (absolute ranges, by address), read from
 * the allocator's records: the test is single-threaded here. */
typedef struct maps_view {
  size_t n;
  gca_devptr_t lo[MAX_MAPS], hi[MAX_MAPS];
} maps_view_t;

static void maps_of(gca_pool_t *pool, maps_view_t *mv) {
  uint64_t id[2];
  gca__devalloc_t *d = gca__devalloc_peek(0);
  assert_ok(gca_pool_id(pool, id));
  assert_non_null(d);
  memset(mv, 0, sizeof(*mv));
  for (gca__pool_t *p = &d->small; p != NULL; p = gca__pool_next(d, p)) {
    if (p->id[0] != id[0] || p->id[1] != id[1])
      continue;
    for (gca__segment_t *seg = p->segments; seg != NULL; seg = seg->next) {
      for (size_t i = 0; seg->expandable && i < seg->nmaps; i++) {
        assert_true(mv->n < MAX_MAPS);
        mv->lo[mv->n] = seg->base + seg->maps[i].offset;
        mv->hi[mv->n++] = seg->base + seg->maps[i].offset + seg->maps[i].size;
      }
    }
  }
  for (size_t i = 1; i < mv->n; i++) /* insertion sort by address */
    for (size_t k = i; k > 0 && mv->lo[k - 1] > mv->lo[k]; k--) {
      gca_devptr_t lo = mv->lo[k], hi = mv->hi[k];
      mv->lo[k] = mv->lo[k - 1];
      mv->hi[k] = mv->hi[k - 1];
      mv->lo[k - 1] = lo;
      mv->hi[k - 1] = hi;
    }
}

static bool has_map(const maps_view_t *mv, gca_devptr_t lo, gca_devptr_t hi) {
  for (size_t i = 0; i < mv->n; i++)
    if (mv->lo[i] == lo && mv->hi[i] == hi)
      return true;
  return false;
}

/* Whether every mapping of `now` not in `then` lies wholly outside the mapped
 * space of the checkpoint (no saved block touches it): the restore then gives
 * all of them back and the layout is exact, mapped extent included. */
static bool new_maps_outside(const maps_view_t *then, const maps_view_t *now,
                             const pool_view_t *saved) {
  for (size_t i = 0; i < now->n; i++) {
    if (has_map(then, now->lo[i], now->hi[i]))
      continue;
    for (size_t k = 0; k < saved->nblocks; k++) {
      const wblock_t *b = &saved->blocks[k];
      if (b->addr < now->hi[i] && now->lo[i] < b->addr + b->size)
        return false;
    }
  }
  return true;
}

static void assert_same_maps(const maps_view_t *a, const maps_view_t *b) {
  assert_int_equal(a->n, b->n);
  assert_memory_equal(a->lo, b->lo, a->n * sizeof(a->lo[0]));
  assert_memory_equal(a->hi, b->hi, a->n * sizeof(a->hi[0]));
}

/* Expandable segments where a mapping straddles the checkpoint's mapped
 * space: its outside part stays mapped and free, so the live blocks are those
 * saved and every saved free block lies in a free one. */
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

/* after equals the checkpointed view on the saved segments; segments made
 * since are one free block each (classic segments). */
static void assert_restored(const pool_view_t *saved, const pool_view_t *after) {
  size_t k = 0;
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

static size_t exact_restores; /* expandable restores checked for the exact layout */

/* The checkpoint's layout and mappings (expandable_mode). */
typedef struct saved_state {
  pool_view_t view;
  maps_view_t maps;
  size_t reserved;
} saved_state_t;

static void save_state(gca_pool_t *pool, saved_state_t *s) {
  s->view = *view_of(pool);
  maps_of(pool, &s->maps);
  assert_ok(gca_pool_memory(pool, &s->reserved, NULL));
}

static void restore_and_compare(gca_pool_t *pool, const gca_pool_state_t *st,
                                const saved_state_t *saved, const live_t *then, live_t *now) {
  static void *want_freed[MAX_LIVE], *want_alloc[MAX_LIVE];
  static maps_view_t before, after;
  size_t nf = difference(now, then, want_freed), na = difference(then, now, want_alloc);
  maps_of(pool, &before);
  bool exact = !expandable_mode || new_maps_outside(&saved->maps, &before, &saved->view);
  gca_pool_changes_t ch;
  assert_ok(gca_pool_restore(pool, st, &ch));
  check();
  printf("  restore: %zu freed, %zu allocated, %zu live%s\n", ch.nfreed, ch.nallocated, then->n,
         expandable_mode ? (exact ? ", exact extent" : ", straddling mapping") : "");
  if (!expandable_mode) {
    assert_restored(&saved->view, view_of(pool));
  } else if (exact) {
    size_t reserved = 0;
    exact_restores++;
    assert_same_view(&saved->view, view_of(pool));
    maps_of(pool, &after);
    assert_same_maps(&saved->maps, &after);
    assert_ok(gca_pool_memory(pool, &reserved, NULL));
    assert_int_equal(reserved, saved->reserved);
  } else {
    assert_restored_expandable(&saved->view, view_of(pool));
  }
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
  exact_restores = 0;
  if (expandable)
    assert_ok(gca_set_config("expandable_segments:True"));
  gca_stream_t streams[2];
  assert_ok(gca_stream_create(&streams[0], GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_stream_create(&streams[1], GCA_STREAM_NON_BLOCKING));
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
    static saved_state_t saved;
    save_state(pool, &saved);
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
  assert_ok(gca_stream_destroy(streams[0]));
  assert_ok(gca_stream_destroy(streams[1]));
  if (expandable)
    printf("  %zu of 18 restores checked with the exact mapped extent\n", exact_restores);
}

static void restore_rebuilds_the_checkpointed_layout_exactly(void **state) {
  (void)state;
  property_test(false);
}

/* Mappings made since the checkpoint in space it had unmapped are given
 * back: the layout and the mapped extent are the checkpoint's exactly. */
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
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  void *x = pool_alloc(pool, 4096);
  gca_pool_state_t *st = NULL;
  assert_ok(gca_pool_checkpoint(pool, &st));
  free_ok(x);
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(gca_pool_begin_capture(pool, s));
  void *y = alloc_on(8192, s);
  pool_view_t before = *view_of(pool);
  assert_status(gca_pool_restore(pool, st, NULL), GCA_ERR_INVALID_STATE, "capture");
  assert_same_view(&before, view_of(pool));
  assert_ok(gca_stream_end_capture(s, &graph));
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
  assert_ok(gca_graph_destroy(graph));
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(s));
}

static void restore_waits_for_pending_frees_of_the_pool(void **state) {
  (void)state;
  gca_stream_t user;
  assert_ok(gca_stream_create(&user, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  gca_pool_state_t *st = NULL;
  void *a = pool_alloc(pool, 4096);
  assert_ok(gca_pool_checkpoint(pool, &st));
  void *b = pool_alloc(pool, 4096);
  assert_ok(gca_record_stream(b, user));
  assert_ok(gca_kernel_sleep(5000000, user));
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
  assert_ok(gca_stream_destroy(user));
}

static void restore_sync_failure_leaves_the_pool_as_it_was(void **state) {
  (void)state;
  gca_stream_t user;
  assert_ok(gca_stream_create(&user, GCA_STREAM_NON_BLOCKING));
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
  assert_ok(gca_stream_destroy(user));
}

/* ---- stream uses across a restore (Note [Checkpoints and stream uses]) ---- */

static atomic_int uses_gate = 1;

/* Host function holding a stream until *arg becomes nonzero. */
static void hold_until(void *arg) {
  while (atomic_load((atomic_int *)arg) == 0)
    sched_yield();
}

static int uses_teardown(void **state) {
  atomic_store(&uses_gate, 1); /* a failed test must not leave a stream held */
  return alloc_teardown(state);
}

static int64_t pending_blocks(void) {
  gca_stats_t s = stats();
  return s.active[GCA_STAT_ALL].current - s.allocation[GCA_STAT_ALL].current;
}

static void restore_keeps_stream_uses_of_live_blocks(void **state) {
  (void)state;
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  void *keep = pool_alloc(pool, 64 * KiB);
  assert_ok(gca_record_stream(keep, s2));
  gca_pool_state_t *st = NULL;
  assert_ok(gca_pool_checkpoint(pool, &st)); /* keep live, the rest free */
  void *used = pool_alloc(pool, 64 * KiB);
  assert_ok(gca_record_stream(used, s2));
  /* s2 overwrites both blocks once the gate opens */
  atomic_store(&uses_gate, 0);
  assert_ok(gca_launch_host_func(s2, hold_until, &uses_gate));
  assert_ok(gca_memset_d32_async(used, 0xdeadbeef, 64 * KiB / 4, s2));
  assert_ok(gca_memset_d32_async(keep, 0xdeadbeef, 64 * KiB / 4, s2));

  gca_pool_changes_t ch;
  assert_ok(gca_pool_restore(pool, st, &ch));
  assert_int_equal(ch.nfreed, 1);
  assert_ptr_equal(ch.freed[0], used);
  assert_int_equal(ch.nallocated, 0);
  gca_pool_changes_free(&ch);
  check();
  /* the freed block's memory waits for s2: a request of its size gets other memory */
  void *next = pool_alloc(pool, 64 * KiB);
  assert_ptr_not_equal(next, used);
  stamp_fill(next, 64 * KiB, 0x5eed);
  /* the block that stayed live kept its use: its free waits for s2 too */
  int64_t pend = pending_blocks(), records = gca_sim_call_count("event_record");
  free_ok(keep);
  assert_int_equal(pending_blocks(), pend + 1);
  assert_int_equal(gca_sim_call_count("event_record"), records + 1);

  atomic_store(&uses_gate, 1);
  assert_ok(gca_stream_synchronize(s2));
  assert_int_equal(stamp_mismatch(next, 64 * KiB, 0x5eed), -1);
  free_ok(next);
  void *again = pool_alloc(pool, 64 * KiB); /* completes the pending frees */
  assert_int_equal(pending_blocks(), 0);
  free_ok(again);
  gca_pool_state_free(st);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(s2));
}

static void restore_keeps_memory_parked_when_recording_its_events_fails(void **state) {
  (void)state;
  gca_stream_t s2;
  assert_ok(gca_stream_create(&s2, GCA_STREAM_NON_BLOCKING));
  gca_pool_t *pool = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  gca_pool_state_t *st = NULL;
  assert_ok(gca_pool_checkpoint(pool, &st)); /* nothing live */
  void *used = pool_alloc(pool, 64 * KiB);
  assert_ok(gca_record_stream(used, s2));
  atomic_store(&uses_gate, 0);
  assert_ok(gca_launch_host_func(s2, hold_until, &uses_gate));
  assert_ok(gca_memset_d32_async(used, 0xdeadbeef, 64 * KiB / 4, s2));

  assert_ok(gca_sim_fault_set("event_record:nth=1"));
  gca_pool_changes_t ch;
  assert_ok(gca_pool_restore(pool, st, &ch)); /* applied; the events wait */
  gca_sim_fault_clear();
  assert_int_equal(ch.nfreed, 1);
  gca_pool_changes_free(&ch);
  check();
  assert_int_equal(pending_blocks(), 1);
  int64_t records = gca_sim_call_count("event_record");
  void *next = pool_alloc(pool, 64 * KiB); /* records the parked block's event */
  assert_int_equal(gca_sim_call_count("event_record"), records + 1);
  assert_ptr_not_equal(next, used);
  stamp_fill(next, 64 * KiB, 0xfeed);
  atomic_store(&uses_gate, 1);
  assert_ok(gca_stream_synchronize(s2));
  assert_int_equal(stamp_mismatch(next, 64 * KiB, 0xfeed), -1);
  free_ok(next);
  void *again = pool_alloc(pool, 64 * KiB);
  assert_int_equal(pending_blocks(), 0);
  free_ok(again);
  gca_pool_state_free(st);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(s2));
}

/* ---- the trim of expandable segments ---- */

static int exp_setup(void **state) {
  alloc_setup(state);
  assert_ok(gca_set_config("expandable_segments:True"));
  return 0;
}

static int64_t reserved_now(void) {
  return stats().reserved_bytes[GCA_STAT_ALL].current;
}

/* The pool holds a (4 MiB, live) in its first 20 MiB mapping at the
 * checkpoint; b (30 MiB) then grows the segment by one 14 MiB mapping in space
 * the checkpoint had unmapped. */
typedef struct grown {
  gca_pool_t *pool;
  gca_pool_state_t *st;
  saved_state_t saved;
  void *a, *b;
} grown_t;

static void grow_after_checkpoint(grown_t *g) {
  assert_ok(gca_pool_create(0, NULL, &g->pool));
  g->a = pool_alloc(g->pool, 4 * MiB);
  assert_ok(gca_pool_checkpoint(g->pool, &g->st));
  save_state(g->pool, &g->saved);
  assert_int_equal(g->saved.maps.n, 1);
  assert_int_equal(g->saved.reserved, 20 * MiB);
  g->b = pool_alloc(g->pool, 30 * MiB);
  assert_int_equal(reserved_now(), 34 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 34 * MiB);
}

static void grown_done(grown_t *g) {
  free_ok(g->a);
  gca_pool_state_free(g->st);
  assert_ok(gca_pool_release(g->pool));
  check();
  assert_int_equal(reserved_now(), 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
}

static void restore_gives_back_a_mapping_made_since_the_checkpoint(void **state) {
  (void)state;
  static grown_t g;
  static maps_view_t after;
  assert_ok(gca_record_history(true, 64, false));
  grow_after_checkpoint(&g);
  gca_stats_t s0 = stats();
  int64_t unmaps = gca_sim_call_count("mem_unmap");
  gca_pool_changes_t ch;
  assert_ok(gca_pool_restore(g.pool, g.st, &ch));
  check();
  assert_int_equal(ch.nfreed, 1);
  assert_ptr_equal(ch.freed[0], g.b);
  assert_int_equal(ch.nallocated, 0);
  gca_pool_changes_free(&ch);
  assert_int_equal(gca_sim_call_count("mem_unmap"), unmaps + 1);
  assert_int_equal(reserved_now(), 20 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 20 * MiB);
  assert_int_equal(stats().num_device_free, s0.num_device_free + 1);
  assert_same_view(&g.saved.view, view_of(g.pool));
  maps_of(g.pool, &after);
  assert_same_maps(&g.saved.maps, &after);
  gca_history_entry_t *e = NULL;
  size_t n = 0, unmapped = 0;
  assert_ok(gca__history_copy(0, &e, &n));
  for (size_t i = 0; i < n; i++)
    unmapped += e[i].action == GCA_HA_SEGMENT_UNMAP && e[i].addr == (uintptr_t)g.a + 20 * MiB &&
                e[i].size == 14 * MiB;
  free(e);
  assert_int_equal(unmapped, 1);
  assert_ok(gca_record_history(false, 0, false));
  assert_status(gca_free(g.b), GCA_ERR_INVALID_POINTER, "free");
  grown_done(&g);
}

/* A failure during the trim (op:nth=1) keeps the mapping mapped and free; the
 * restore itself succeeds, and the next restore gives the mapping back. */
static void trim_fault_keeps_the_mapping(const char *fault) {
  static grown_t g;
  grow_after_checkpoint(&g);
  assert_ok(gca_sim_fault_set(fault));
  gca_pool_changes_t ch;
  assert_ok(gca_pool_restore(g.pool, g.st, &ch));
  gca_sim_fault_clear();
  check();
  assert_int_equal(ch.nfreed, 1);
  assert_ptr_equal(ch.freed[0], g.b);
  assert_int_equal(ch.nallocated, 0);
  gca_pool_changes_free(&ch);
  assert_int_equal(reserved_now(), 34 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 34 * MiB);
  size_t reserved = 0, allocated = 0;
  assert_ok(gca_pool_memory(g.pool, &reserved, &allocated));
  assert_int_equal(reserved, 34 * MiB);
  assert_int_equal(allocated, 4 * MiB);
  pool_view_t *v = view_of(g.pool); /* a, then one free block up to the end */
  assert_int_equal(v->nsegs, 1);
  assert_int_equal(v->nblocks, 2);
  assert_int_equal(v->blocks[0].state, GCA_BLOCK_ACTIVE_ALLOCATED);
  assert_int_equal(v->blocks[0].size, 4 * MiB);
  assert_int_equal(v->blocks[1].state, GCA_BLOCK_INACTIVE);
  assert_int_equal(v->blocks[1].size, 30 * MiB);
  int64_t unmaps = gca_sim_call_count("mem_unmap");
  assert_ok(gca_pool_restore(g.pool, g.st, &ch));
  check();
  assert_int_equal(ch.nfreed + ch.nallocated, 0);
  gca_pool_changes_free(&ch);
  assert_int_equal(gca_sim_call_count("mem_unmap"), unmaps + 1);
  assert_int_equal(reserved_now(), 20 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 20 * MiB);
  assert_same_view(&g.saved.view, view_of(g.pool));
  grown_done(&g);
}

static void restore_survives_an_unmap_failure_in_the_trim(void **state) {
  (void)state;
  trim_fault_keeps_the_mapping("mem_unmap:nth=1");
}

static void restore_survives_a_sync_failure_in_the_trim(void **state) {
  (void)state;
  trim_fault_keeps_the_mapping("stream_synchronize:nth=1");
}

/* Unmapping synchronizes a stream, so while another pool's capture is under
 * way the trim waits for a later restore. */
static void restore_during_another_capture_trims_nothing(void **state) {
  (void)state;
  static grown_t g;
  gca_stream_t s;
  gca_graph_t graph = NULL;
  gca_pool_t *other = NULL;
  grow_after_checkpoint(&g);
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_pool_create(0, NULL, &other));
  assert_ok(gca_stream_begin_capture(s, GCA_CAPTURE_MODE_RELAXED));
  assert_ok(gca_pool_begin_capture(other, s));
  int64_t unmaps = gca_sim_call_count("mem_unmap");
  int64_t syncs = gca_sim_call_count("stream_synchronize");
  assert_ok(gca_pool_restore(g.pool, g.st, NULL));
  check();
  assert_int_equal(gca_sim_call_count("mem_unmap"), unmaps);
  assert_int_equal(gca_sim_call_count("stream_synchronize"), syncs);
  assert_int_equal(reserved_now(), 34 * MiB);
  assert_ok(gca_stream_end_capture(s, &graph));
  assert_ok(gca_pool_end_capture(other, s));
  assert_ok(gca_pool_restore(g.pool, g.st, NULL));
  check();
  assert_int_equal(gca_sim_call_count("mem_unmap"), unmaps + 1);
  assert_int_equal(reserved_now(), 20 * MiB);
  assert_same_view(&g.saved.view, view_of(g.pool));
  if (graph != NULL)
    assert_ok(gca_graph_destroy(graph));
  assert_ok(gca_pool_release(other));
  assert_ok(gca_stream_destroy(s));
  grown_done(&g);
}

/* A segment made since the checkpoint (another stream) is given back whole,
 * its reservation included. */
static void restore_gives_back_a_segment_made_since_the_checkpoint(void **state) {
  (void)state;
  gca_stream_t s;
  gca_pool_t *pool = NULL;
  gca_pool_state_t *st = NULL;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_pool_create(0, NULL, &pool));
  void *a = pool_alloc(pool, 4 * MiB);
  assert_ok(gca_pool_checkpoint(pool, &st));
  assert_ok(gca_pool_use_begin(pool));
  void *b = alloc_on(4 * MiB, s);
  assert_ok(gca_pool_use_end(pool));
  int64_t frees = gca_sim_call_count("mem_address_free");
  assert_int_equal(reserved_now(), 40 * MiB);
  assert_ok(gca_pool_restore(pool, st, NULL));
  check();
  assert_int_equal(reserved_now(), 20 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 20 * MiB);
  assert_int_equal(gca_sim_call_count("mem_address_free"), frees + 1);
  assert_status(gca_free(b), GCA_ERR_INVALID_POINTER, "free");
  assert_ok(gca_pool_restore(pool, st, NULL)); /* the state still applies */
  check();
  free_ok(a);
  gca_pool_state_free(st);
  assert_ok(gca_pool_release(pool));
  assert_ok(gca_stream_destroy(s));
}

/* A mapping made since the checkpoint that covers space mapped then and space
 * unmapped then stays mapped; its outside part is free. Such a mapping needs
 * the checkpoint's mapped space unmapped in between: an older state's restore
 * does that. */
static void restore_keeps_a_mapping_that_straddles_the_checkpoint(void **state) {
  (void)state;
  gca_pool_t *pool = NULL;
  gca_pool_state_t *s0 = NULL, *s1 = NULL;
  assert_ok(gca_pool_create(0, NULL, &pool));
  void *a = pool_alloc(pool, 4 * MiB); /* mapping [+0, +20 MiB) */
  assert_ok(gca_pool_checkpoint(pool, &s0));
  void *b = pool_alloc(pool, 30 * MiB); /* [+4, +34 MiB), mapping [+20, +34 MiB) */
  assert_ok(gca_pool_checkpoint(pool, &s1));
  assert_ok(gca_pool_restore(pool, s0, NULL)); /* b freed, [+20, +34 MiB) unmapped */
  check();
  assert_int_equal(reserved_now(), 20 * MiB);
  void *d = pool_alloc(pool, 40 * MiB); /* mapping [+20, +44 MiB) */
  assert_ptr_equal(d, b);
  assert_int_equal(reserved_now(), 44 * MiB);
  int64_t unmaps = gca_sim_call_count("mem_unmap");
  gca_pool_changes_t ch;
  assert_ok(gca_pool_restore(pool, s1, &ch));
  check();
  assert_int_equal(ch.nfreed, 1); /* d, and b at the same address with another size */
  assert_ptr_equal(ch.freed[0], d);
  assert_int_equal(ch.nallocated, 1);
  assert_ptr_equal(ch.allocated[0], b);
  gca_pool_changes_free(&ch);
  assert_int_equal(gca_sim_call_count("mem_unmap"), unmaps);
  assert_int_equal(reserved_now(), 44 * MiB);
  assert_int_equal(gca_sim_used_bytes(0), 44 * MiB);
  assert_int_equal(block_size_of(b), 30 * MiB);
  pool_view_t *v = view_of(pool);
  assert_int_equal(v->nsegs, 1);
  assert_int_equal(v->nblocks, 3);
  assert_int_equal(v->blocks[2].state, GCA_BLOCK_INACTIVE);
  assert_int_equal(v->blocks[2].addr, (uintptr_t)a + 34 * MiB);
  assert_int_equal(v->blocks[2].size, 10 * MiB);
  free_ok(a);
  free_ok(b);
  gca_pool_state_free(s0);
  gca_pool_state_free(s1);
  assert_ok(gca_pool_release(pool));
  check();
  assert_int_equal(reserved_now(), 0);
  assert_int_equal(gca_sim_used_bytes(0), 0);
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
      cmocka_unit_test_setup_teardown(restore_keeps_stream_uses_of_live_blocks, alloc_setup,
                                      uses_teardown),
      cmocka_unit_test_setup_teardown(restore_keeps_memory_parked_when_recording_its_events_fails,
                                      alloc_setup, uses_teardown),
      cmocka_unit_test_setup_teardown(restore_gives_back_a_mapping_made_since_the_checkpoint,
                                      exp_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_survives_an_unmap_failure_in_the_trim, exp_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_survives_a_sync_failure_in_the_trim, exp_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_during_another_capture_trims_nothing, exp_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_gives_back_a_segment_made_since_the_checkpoint,
                                      exp_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(restore_keeps_a_mapping_that_straddles_the_checkpoint,
                                      exp_setup, alloc_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
