/* SPDX-License-Identifier: Apache-2.0 */
/* test_alloc_stats.c - every statistic (PyTorch's names and meaning) after
 * scripted sequences: current, peak, allocated and freed per pool, the event
 * counters, resets of peaks and of accumulated values; active and
 * active_bytes while frees are pending (Note [Active statistics]), scripted
 * and against a model of PyTorch's eager counting on random scripts. */
#include <sched.h>
#include <stdatomic.h>

#include "alloc_fixture.h"

#define expect_stat(st, cur, pk, al, fr)                                                       \
  do {                                                                                         \
    gca_stat_t s_ = (st);                                                                      \
    if (s_.current != (cur) || s_.peak != (pk) || s_.allocated != (al) || s_.freed != (fr))    \
      fail_msg(                                                                                \
          "%s = {cur %lld, peak %lld, alloc %lld, freed %lld}, want {%lld, %lld, %lld, %lld}", \
          #st, (long long)s_.current, (long long)s_.peak, (long long)s_.allocated,             \
          (long long)s_.freed, (long long)(cur), (long long)(pk), (long long)(al),             \
          (long long)(fr));                                                                    \
  } while (0)

enum { ALL = GCA_STAT_ALL, SMALL = GCA_STAT_SMALL, LARGE = GCA_STAT_LARGE };

static void scripted_sequence_counts_every_stat(void **state) {
  (void)state;
  const int64_t k = 1024, m = 1 << 20;
  /* PyTorch's placement and merges: the recycle bins, which keep small frees
   * unmerged, are tested on their own (test_recycle_bins.c) */
  assert_ok(gca_set_config("recycle_bins:False"));
  void *a = alloc_on(1000, NULL);
  gca_stats_t s = stats();
  expect_stat(s.allocation[SMALL], 1, 1, 1, 0);
  expect_stat(s.allocation[LARGE], 0, 0, 0, 0);
  expect_stat(s.segment[SMALL], 1, 1, 1, 0);
  expect_stat(s.active[SMALL], 1, 1, 1, 0);
  expect_stat(s.inactive_split[SMALL], 1, 1, 1, 0);
  expect_stat(s.allocated_bytes[SMALL], k, k, k, 0);
  expect_stat(s.reserved_bytes[SMALL], 2 * m, 2 * m, 2 * m, 0);
  expect_stat(s.active_bytes[SMALL], k, k, k, 0);
  expect_stat(s.inactive_split_bytes[SMALL], 2 * m - k, 2 * m - k, 2 * m - k, 0);
  expect_stat(s.requested_bytes[SMALL], 1000, 1000, 1000, 0);
  assert_int_equal(s.num_device_alloc, 1);
  assert_int_equal(s.num_device_free, 0);

  void *b = alloc_on(5 * MiB, NULL);
  s = stats();
  expect_stat(s.allocation[LARGE], 1, 1, 1, 0);
  expect_stat(s.allocation[ALL], 2, 2, 2, 0);
  expect_stat(s.segment[ALL], 2, 2, 2, 0);
  expect_stat(s.reserved_bytes[LARGE], 20 * m, 20 * m, 20 * m, 0);
  expect_stat(s.reserved_bytes[ALL], 22 * m, 22 * m, 22 * m, 0);
  expect_stat(s.inactive_split[ALL], 2, 2, 2, 0);
  expect_stat(s.inactive_split_bytes[LARGE], 15 * m, 15 * m, 15 * m, 0);
  expect_stat(s.allocated_bytes[ALL], 5 * m + k, 5 * m + k, 5 * m + k, 0);
  expect_stat(s.requested_bytes[ALL], 5 * m + 1000, 5 * m + 1000, 5 * m + 1000, 0);
  assert_int_equal(s.num_device_alloc, 2);

  free_ok(a);
  s = stats();
  expect_stat(s.allocation[SMALL], 0, 1, 1, 1);
  expect_stat(s.active[SMALL], 0, 1, 1, 1);
  expect_stat(s.active_bytes[SMALL], 0, k, k, k);
  /* the remainder merged back: one whole block, not an inactive split */
  expect_stat(s.inactive_split[SMALL], 0, 1, 1, 1);
  expect_stat(s.inactive_split_bytes[SMALL], 0, 2 * m - k, 2 * m - k, 2 * m - k);
  expect_stat(s.requested_bytes[SMALL], 0, 1000, 1000, 1000);
  expect_stat(s.segment[SMALL], 1, 1, 1, 0);

  void *c = alloc_on(3 * MiB, NULL); /* from b's remainder: 15 -> 12 MiB, still split */
  s = stats();
  expect_stat(s.inactive_split[LARGE], 1, 1, 1, 0);
  expect_stat(s.inactive_split_bytes[LARGE], 12 * m, 15 * m, 15 * m, 3 * m);
  expect_stat(s.segment[LARGE], 1, 1, 1, 0);

  assert_ok(gca_reset_peak_stats(0));
  s = stats();
  expect_stat(s.allocation[ALL], 2, 2, 3, 1);
  expect_stat(s.inactive_split_bytes[LARGE], 12 * m, 12 * m, 15 * m, 3 * m);
  expect_stat(s.reserved_bytes[ALL], 22 * m, 22 * m, 22 * m, 0);

  free_ok(b);
  free_ok(c);
  assert_ok(gca_empty_cache());
  check();
  s = stats();
  expect_stat(s.segment[ALL], 0, 2, 2, 2);
  expect_stat(s.reserved_bytes[ALL], 0, 22 * m, 22 * m, 22 * m);
  expect_stat(s.allocated_bytes[LARGE], 0, 8 * m, 8 * m, 8 * m);
  expect_stat(s.inactive_split[ALL], 0, 2, 3, 3);
  assert_int_equal(s.num_device_alloc, 2);
  assert_int_equal(s.num_device_free, 2);
  assert_int_equal(s.num_alloc_retries, 0);
  assert_int_equal(s.num_ooms, 0);
  assert_int_equal(s.num_sync_all_streams, 1); /* empty_cache waits for pending frees */

  assert_ok(gca_reset_accumulated_stats(0));
  s = stats();
  expect_stat(s.segment[ALL], 0, 2, 0, 0);
  expect_stat(s.reserved_bytes[ALL], 0, 22 * m, 0, 0);
  expect_stat(s.allocation[ALL], 0, 2, 0, 0);
  assert_int_equal(s.num_device_alloc, 0);
  assert_int_equal(s.num_device_free, 0);
  assert_int_equal(s.num_sync_all_streams, 0);
  assert_ok(gca_reset_peak_stats(0));
  s = stats();
  expect_stat(s.reserved_bytes[ALL], 0, 0, 0, 0);
}

static void oversize_stats_follow_max_split_size(void **state) {
  (void)state;
  assert_ok(gca_set_config("max_split_size_mb:32"));
  void *a = alloc_on(40 * MiB, NULL);
  void *b = alloc_on(8 * MiB, NULL);
  gca_stats_t s = stats();
  expect_stat(s.oversize_allocations, 1, 1, 1, 0);
  expect_stat(s.oversize_segments, 1, 1, 1, 0);
  assert_int_equal(s.max_split_size, 32 * MiB);
  free_ok(a);
  free_ok(b);
  assert_ok(gca_empty_cache());
  s = stats();
  expect_stat(s.oversize_allocations, 0, 1, 1, 1);
  expect_stat(s.oversize_segments, 0, 1, 1, 1);
}

static void peaks_track_high_water_marks(void **state) {
  (void)state;
  void *p[8];
  for (int i = 0; i < 8; i++)
    p[i] = alloc_on(64 * KiB, NULL);
  for (int i = 0; i < 8; i++)
    free_ok(p[i]);
  for (int i = 0; i < 3; i++)
    p[i] = alloc_on(64 * KiB, NULL);
  gca_stats_t s = stats();
  expect_stat(s.allocation[ALL], 3, 8, 11, 8);
  expect_stat(s.allocated_bytes[ALL], 3 * 64 * 1024, 8 * 64 * 1024, 11 * 64 * 1024, 8 * 64 * 1024);
  assert_int_equal(s.segment[ALL].current, 1);
  for (int i = 0; i < 3; i++)
    free_ok(p[i]);
}

static void stats_of_unused_device_are_zero(void **state) {
  (void)state;
  gca_stats_t s = stats();
  expect_stat(s.allocation[ALL], 0, 0, 0, 0);
  expect_stat(s.reserved_bytes[ALL], 0, 0, 0, 0);
  assert_int_equal(s.num_device_alloc, 0);
  assert_status(gca_get_stats(0, NULL), GCA_ERR_INVALID_ARGUMENT, "get_stats");
  assert_status(gca_get_stats(9999, &s), GCA_ERR_INVALID_ARGUMENT, "device 9999");
}

/* ---- active while frees are pending (Note [Active statistics]) ---- */

/* A stream held by hold() stays busy until release(), so a free recorded on
 * it stays pending for as long as the test wants. */
static atomic_int gate = 1;

static void hold_fn(void *arg) {
  (void)arg;
  while (atomic_load(&gate) == 0)
    sched_yield();
}

static gca_stream_t held_stream(void) {
  gca_stream_t s;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  atomic_store(&gate, 0);
  assert_ok(gca_launch_host_func(s, hold_fn, NULL));
  return s;
}

/* Lets the held stream finish and completes every pending free. */
static void release(gca_stream_t s) {
  atomic_store(&gate, 1);
  assert_ok(gca_stream_synchronize(s));
  assert_ok(gca_empty_cache()); /* waits for the pending events and frees their blocks */
  check();
}

static int pending_teardown(void **state) {
  atomic_store(&gate, 1); /* a failed test must not leave a stream held */
  return alloc_teardown(state);
}

/* Frees p after recording the held stream s on it: the block stays active. */
static void free_pending(void *p, gca_stream_t s) {
  assert_ok(gca_record_stream(p, s));
  free_ok(p);
}

static void active_counts_pending_frees(void **state) {
  (void)state;
  const int64_t k = 512, m = 1 << 20;
  gca_stream_t h = held_stream();
  void *a = alloc_on(512, NULL), *b = alloc_on(512, NULL);
  free_pending(a, h); /* allocation 1, active 2 */
  gca_stats_t s = stats();
  expect_stat(s.allocation[SMALL], 1, 2, 2, 1);
  expect_stat(s.active[SMALL], 2, 2, 2, 0);
  expect_stat(s.active_bytes[SMALL], 2 * k, 2 * k, 2 * k, 0);
  void *c = alloc_on(512, NULL); /* active rises above allocation's peak */
  void *big = alloc_on(4 * m, NULL);
  s = stats();
  expect_stat(s.allocation[SMALL], 2, 2, 3, 1);
  expect_stat(s.active[SMALL], 3, 3, 3, 0);
  expect_stat(s.active_bytes[SMALL], 3 * k, 3 * k, 3 * k, 0);
  expect_stat(s.active[LARGE], 1, 1, 1, 0);
  expect_stat(s.active[ALL], 4, 4, 4, 0);
  expect_stat(s.active_bytes[ALL], 3 * k + 4 * m, 3 * k + 4 * m, 3 * k + 4 * m, 0);
  free_pending(big, h);
  free_ok(c);
  assert_ok(gca_reset_peak_stats(0)); /* active's peak restarts at allocation + pending */
  assert_ok(gca_reset_accumulated_stats(0));
  s = stats();
  expect_stat(s.allocation[ALL], 1, 1, 0, 0);
  expect_stat(s.active[ALL], 3, 3, 0, 0);
  expect_stat(s.active[SMALL], 2, 2, 0, 0);
  expect_stat(s.active_bytes[LARGE], 4 * m, 4 * m, 0, 0);
  release(h); /* the two pending frees complete after the reset: they count as freed */
  s = stats();
  expect_stat(s.active[SMALL], 1, 2, 0, 1);
  expect_stat(s.active[LARGE], 0, 1, 0, 1);
  expect_stat(s.active[ALL], 1, 3, 0, 2);
  expect_stat(s.active_bytes[ALL], k, 2 * k + 4 * m, 0, k + 4 * m);
  free_ok(b);
  s = stats();
  expect_stat(s.active[ALL], 0, 3, 0, 3);
  expect_stat(s.allocation[ALL], 0, 1, 0, 1);
  assert_ok(gca_stream_destroy(h));
}

/* PyTorch's eager counting of one statistic, the model for the derived one. */
typedef struct {
  int64_t current, peak, allocated, freed;
} model_stat_t;

static void model_add(model_stat_t *m, int64_t n) {
  m->current += n;
  if (n > 0)
    m->allocated += n;
  else
    m->freed -= n;
  if (m->current > m->peak)
    m->peak = m->current;
}

static void expect_model(const char *what, int t, gca_stat_t got, const model_stat_t *want) {
  if (got.current != want->current || got.peak != want->peak || got.allocated != want->allocated ||
      got.freed != want->freed)
    fail_msg("%s[%d] = {%lld, %lld, %lld, %lld}, model {%lld, %lld, %lld, %lld}", what, t,
             (long long)got.current, (long long)got.peak, (long long)got.allocated,
             (long long)got.freed, (long long)want->current, (long long)want->peak,
             (long long)want->allocated, (long long)want->freed);
}

#define MODEL_SLOTS 24

static void active_matches_eager_model_on_random_scripts(void **state) {
  (void)state;
  static const size_t sizes[] = {512, 3000, 64 * 1024, 1 << 20, 3 << 20, 12 << 20};
  for (unsigned seed = 1; seed <= 4; seed++) {
    srand(seed);
    model_stat_t act[GCA_STAT_TYPES] = {{0}}, actb[GCA_STAT_TYPES] = {{0}};
    void *live[MODEL_SLOTS] = {0};
    int64_t live_size[MODEL_SLOTS] = {0};
    int pend_t[64];
    int64_t pend_size[64];
    int npend = 0;
    gca_stream_t h = held_stream();
    for (int step = 0; step < 600; step++) {
      int r = rand() % 100, i = rand() % MODEL_SLOTS;
      if (r < 2) { /* pending frees complete */
        release(h);
        for (int j = 0; j < npend; j++) {
          model_add(&act[pend_t[j]], -1);
          model_add(&act[ALL], -1);
          model_add(&actb[pend_t[j]], -pend_size[j]);
          model_add(&actb[ALL], -pend_size[j]);
        }
        npend = 0;
        assert_ok(gca_stream_destroy(h));
        h = held_stream();
      } else if (r < 4) {
        assert_ok(gca_reset_peak_stats(0));
        for (int t = 0; t < GCA_STAT_TYPES; t++) {
          act[t].peak = act[t].current;
          actb[t].peak = actb[t].current;
        }
      } else if (r < 6) {
        assert_ok(gca_reset_accumulated_stats(0));
        for (int t = 0; t < GCA_STAT_TYPES; t++)
          act[t].allocated = act[t].freed = actb[t].allocated = actb[t].freed = 0;
      } else if (live[i] == NULL) {
        live[i] = alloc_on(sizes[rand() % GCA_ARRAY_SIZE(sizes)], NULL);
        live_size[i] = (int64_t)block_size_of(live[i]);
        int t = live_size[i] <= (int64_t)MiB ? SMALL : LARGE;
        model_add(&act[t], 1);
        model_add(&act[ALL], 1);
        model_add(&actb[t], live_size[i]);
        model_add(&actb[ALL], live_size[i]);
      } else {
        int t = live_size[i] <= (int64_t)MiB ? SMALL : LARGE;
        if (r < 50 && npend < 64) {
          free_pending(live[i], h);
          pend_t[npend] = t;
          pend_size[npend++] = live_size[i];
        } else {
          free_ok(live[i]);
          model_add(&act[t], -1);
          model_add(&act[ALL], -1);
          model_add(&actb[t], -live_size[i]);
          model_add(&actb[ALL], -live_size[i]);
        }
        live[i] = NULL;
      }
      gca_stats_t s = stats();
      for (int t = 0; t < GCA_STAT_TYPES; t++) {
        expect_model("active", t, s.active[t], &act[t]);
        expect_model("active_bytes", t, s.active_bytes[t], &actb[t]);
      }
    }
    for (int i = 0; i < MODEL_SLOTS; i++)
      if (live[i] != NULL)
        free_ok(live[i]);
    release(h);
    assert_ok(gca_stream_destroy(h));
    gca_stats_t s = stats();
    assert_int_equal(s.active[ALL].current, 0);
    assert_int_equal(s.active_bytes[ALL].current, 0);
    assert_nothing_leaked();
    gca__allocator_reset();
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(scripted_sequence_counts_every_stat, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(oversize_stats_follow_max_split_size, alloc_setup,
                                      alloc_teardown),
      cmocka_unit_test_setup_teardown(peaks_track_high_water_marks, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(stats_of_unused_device_are_zero, alloc_setup, alloc_teardown),
      cmocka_unit_test_setup_teardown(active_counts_pending_frees, alloc_setup, pending_teardown),
      cmocka_unit_test_setup_teardown(active_matches_eager_model_on_random_scripts, alloc_setup,
                                      pending_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
