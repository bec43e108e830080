/* SPDX-License-Identifier: Apache-2.0 */
/* test_coll_host_sweep.c - every host allocation the collectives layer makes
 * in a realistic step, failed in turn (tests/sweep.h): two sim ranks (as
 * threads, created from one thread), registrations, a comm pool that
 * allocations are routed to, grouped collectives, a bucketer per rank (add,
 * finalize, run) and its cross-rank check (each rank on a thread of its own;
 * only rank 0's thread is armed, so k stays deterministic). The scenario
 * counts its allocations once (n); then for each k in 1..n the k-th fails:
 * the scenario must fail with GCA_ERR_OUT_OF_MEMORY (or a status whose detail
 * says host memory) and a detail, tear down completely, and leave nothing
 * allocated and the allocator sound. ASan builds check nothing leaked. */
#include "support.h"
#include "sweep.h"

#define NR    2
#define COUNT 64

typedef struct check_job {
  gca_bucketer_t *b;
  gca_stream_t s;
  int device;
  bool armed;
  gca_status_t st;
  char detail[512];
} check_job_t;

static void *check_rank(void *arg) {
  check_job_t *j = arg;
  sweep_arm(j->armed);
  j->st = gca_set_device(j->device);
  if (j->st == GCA_OK)
    j->st = gca_bucketer_check(j->b, j->s);
  snprintf(j->detail, sizeof(j->detail), "%s", gca_last_error());
  sweep_arm(false);
  return NULL;
}

static gca_status_t scenario(bool armed) {
  gca_status_t st = GCA_OK;
  gca_comm_t *comm[NR] = {NULL};
  gca_stream_t s[NR] = {NULL};
  void *send[NR] = {NULL}, *recv[NR] = {NULL}, *pooled[NR] = {NULL}, *reg[NR] = {NULL};
  gca_pool_t *pool[NR] = {NULL};
  gca_bucketer_t *b[NR] = {NULL};
  int devs[NR];
  detail[0] = '\0';
  for (int i = 0; i < NR; i++)
    devs[i] = i;
  const size_t bytes = (size_t)NR * COUNT * sizeof(float);

  gca_comm_options_t co = GCA_COMM_OPTIONS_INIT;
  co.timeout_s = 0.25; /* a rank whose peer gave up waits no longer */
  SWEEP_STEP(gca_comm_create_all(NR, devs, &co, comm));
  for (int i = 0; i < NR; i++) {
    SWEEP_STEP(gca_set_device(i));
    SWEEP_STEP(gca_stream_create(&s[i], GCA_STREAM_NON_BLOCKING));
    SWEEP_STEP(gca_malloc_device(i, &send[i], bytes, s[i]));
    SWEEP_STEP(gca_malloc_device(i, &recv[i], bytes, s[i]));
    SWEEP_STEP(gca_memset_d8(send[i], i + 1, bytes));
    SWEEP_STEP(gca_comm_register(comm[i], send[i], bytes, &reg[i]));
    SWEEP_STEP(gca_comm_pool_create(comm[i], NULL, &pool[i]));
    SWEEP_STEP(gca_pool_use_begin(pool[i]));
    st = gca_malloc(&pooled[i], bytes, s[i]);
    GCA_CHECK_IGNORE(gca_pool_use_end(pool[i]));
    SWEEP_STEP(st);
    /* a failed registration of the pool's segment failed the segment; the
     * allocator's retry made (and registered) another: the memory handed
     * out is registered whichever way it went */
    gca_comm_stats_t cs = {.size = sizeof(cs)};
    SWEEP_STEP(gca_comm_stats(comm[i], &cs));
    assert_int_equal(cs.registrations, 2); /* send and the pool's one segment */
  }
  SWEEP_STEP(gca_group_start());
  for (int i = 0; i < NR && st == GCA_OK; i++)
    st = gca_all_reduce(send[i], pooled[i], COUNT, GCA_DTYPE_F32, GCA_REDUCE_SUM, comm[i], s[i]);
  gca_status_t gst = gca_group_end();
  SWEEP_STEP(st);
  SWEEP_STEP(gst);
  for (int i = 0; i < NR; i++)
    SWEEP_STEP(gca_all_gather(send[i], recv[i], COUNT, GCA_DTYPE_F32, comm[i], s[i]));

  for (int i = 0; i < NR; i++) {
    SWEEP_STEP(gca_set_device(i));
    gca_bucketer_options_t bo = GCA_BUCKETER_OPTIONS_INIT;
    SWEEP_STEP(gca_bucketer_create(&bo, &b[i]));
    char *sd = send[i], *rv = recv[i];
    size_t idx[4], dep = 0;
    SWEEP_STEP(gca_bucketer_add(b[i], comm[i], GCA_COLL_ALL_REDUCE, sd, rv, 16, GCA_DTYPE_F32,
                                GCA_REDUCE_SUM, NULL, 0, &idx[0]));
    SWEEP_STEP(gca_bucketer_add(b[i], comm[i], GCA_COLL_ALL_REDUCE, sd + 64, rv + 64, 16,
                                GCA_DTYPE_F32, GCA_REDUCE_SUM, NULL, 0, &idx[1]));
    dep = idx[0];
    SWEEP_STEP(gca_bucketer_add(b[i], comm[i], GCA_COLL_ALL_REDUCE, rv, sd + 128, 16, GCA_DTYPE_F32,
                                GCA_REDUCE_SUM, &dep, 1, &idx[2]));
    SWEEP_STEP(gca_bucketer_add(b[i], comm[i], GCA_COLL_ALL_GATHER, sd + 256, rv + 256, 8,
                                GCA_DTYPE_F32, GCA_REDUCE_SUM, NULL, 0, &idx[3]));
    st = gca_bucketer_finalize(b[i], s[i]);
    if (st != GCA_OK) {
      snprintf(detail, sizeof(detail), "gca_bucketer_finalize: %s", gca_last_error());
      /* a finalize that failed gave back what it made and can be tried again */
      bool was = sweep_armed;
      sweep_arm(false);
      size_t reserved = 0, live = 0;
      assert_int_equal(gca_bucketer_memory(b[i], &reserved, &live), GCA_ERR_INVALID_STATE);
      assert_ok(gca_bucketer_finalize(b[i], s[i]));
      size_t nb = 0;
      assert_ok(gca_bucketer_bucket_count(b[i], &nb));
      assert_int_equal(nb, 3); /* the first two all-reduces share one */
      sweep_arm(was);
      goto out;
    }
  }
  for (int run = 0; run < 2; run++)
    for (int i = 0; i < NR; i++)
      SWEEP_STEP(gca_bucketer_run(b[i], s[i]));
  for (int i = 0; i < NR; i++) {
    SWEEP_STEP(gca_stream_synchronize(s[i]));
    SWEEP_STEP(gca_comm_async_error(comm[i]));
  }
  check_job_t jobs[NR];
  pthread_t th[NR];
  for (int i = 0; i < NR; i++) {
    jobs[i] = (check_job_t){.b = b[i], .s = s[i], .device = i, .armed = armed && i == 0};
    assert_int_equal(pthread_create(&th[i], NULL, check_rank, &jobs[i]), 0);
  }
  for (int i = 0; i < NR; i++)
    assert_int_equal(pthread_join(th[i], NULL), 0);
  for (int i = 0; i < NR; i++)
    if (jobs[i].st != GCA_OK) {
      st = jobs[i].st;
      snprintf(detail, sizeof(detail), "bucketer_check on rank %d: %s", i, jobs[i].detail);
      goto out;
    }
  SWEEP_STEP(gca_set_device(0));

out:
  for (int i = 0; i < NR; i++)
    if (s[i])
      GCA_CHECK_IGNORE(gca_stream_synchronize(s[i]));
  for (int i = 0; i < NR; i++) {
    gca_bucketer_destroy(b[i]);
    if (pooled[i])
      GCA_CHECK_IGNORE(gca_free(pooled[i]));
    if (pool[i])
      GCA_CHECK_IGNORE(gca_pool_release(pool[i]));
    if (reg[i])
      GCA_CHECK_IGNORE(gca_comm_deregister(comm[i], reg[i]));
    if (comm[i])
      GCA_CHECK_IGNORE(gca_comm_destroy(comm[i]));
    if (send[i])
      GCA_CHECK_IGNORE(gca_free(send[i]));
    if (recv[i])
      GCA_CHECK_IGNORE(gca_free(recv[i]));
    if (s[i])
      GCA_CHECK_IGNORE(gca_stream_destroy(s[i]));
  }
  GCA_CHECK_IGNORE(gca_set_device(0));
  return st;
}

static void expect_sound(void) {
  for (int d = 0; d < NR; d++) {
    gca_stats_t s;
    assert_ok(gca_get_stats(d, &s));
    assert_int_equal(s.allocated_bytes[GCA_STAT_ALL].current, 0);
  }
  assert_ok(gca__allocator_check());
  assert_ok(gca_empty_cache());
  for (int d = 0; d < NR; d++)
    assert_int_equal(gca_sim_used_bytes(d), 0);
}

/* The process's first communicator: the registry of live handles is grown
 * then and only then, so each of creation's allocations, that one included,
 * is failed here before anything else made a communicator. */
static void the_first_communicators_allocations_fail_cleanly(void **state) {
  (void)state;
  int devs[NR];
  for (int i = 0; i < NR; i++)
    devs[i] = i;
  gca_comm_options_t co = GCA_COMM_OPTIONS_INIT;
  co.timeout_s = 0.25;
  unsigned long k = 1;
  for (;; k++) {
    gca_comm_t *comm[NR] = {NULL};
    sweep_reset(k);
    sweep_arm(true);
    gca_clear_last_error();
    gca_status_t st = gca_comm_create_all(NR, devs, &co, comm);
    sweep_arm(false);
    if (st == GCA_OK) {
      assert_int_equal(atomic_load(&sweep_failed), 0);
      for (int i = 0; i < NR; i++)
        assert_ok(gca_comm_destroy(comm[i]));
      break;
    }
    assert_int_equal(atomic_load(&sweep_failed), 1);
    if (st != GCA_ERR_OUT_OF_MEMORY || !strstr(gca_last_error(), "no host memory"))
      fail_msg("k=%lu (site 0x%lx): %s: '%s'", k, sweep_site_offset(), gca_status_name(st),
               gca_last_error());
    for (int i = 0; i < NR; i++)
      assert_null(comm[i]);
    if (getenv("GCA_SWEEP_VERBOSE"))
      print_message("k=%lu (site 0x%lx): %s\n", k, sweep_site_offset(), gca_last_error());
  }
  print_message("first communicator: %lu host allocations swept\n", k - 1);
  assert_true(k > 2);
  expect_sound();
}

/* The sim stages a collective's input when its stream reaches it, on the
 * stream's thread: with every thread counting, the k-th allocation of an
 * all-reduce on two ranks is either the issue's (that rank's call fails, the
 * peer's collective times out) or a stage's (the collective fails on both
 * ranks, each saying that there was no host memory to stage). Which rank's
 * stream thread gets there first does not matter. */
static void a_collective_without_host_memory_to_stage_fails_on_every_rank(void **state) {
  (void)state;
  int devs[NR];
  for (int i = 0; i < NR; i++)
    devs[i] = i;
  gca_comm_options_t co = GCA_COMM_OPTIONS_INIT;
  co.timeout_s = 0.25;
  unsigned long n = 0;
  for (unsigned long k = 0; k == 0 || k <= n; k++) {
    gca_comm_t *comm[NR] = {NULL};
    gca_stream_t s[NR] = {NULL};
    void *buf[NR] = {NULL};
    assert_ok(gca_comm_create_all(NR, devs, &co, comm));
    for (int i = 0; i < NR; i++) {
      assert_ok(gca_set_device(i));
      assert_ok(gca_stream_create(&s[i], GCA_STREAM_NON_BLOCKING));
      assert_ok(gca_malloc_device(i, &buf[i], COUNT * sizeof(float), s[i]));
      assert_ok(gca_memset_d8(buf[i], 0, COUNT * sizeof(float)));
    }
    gca_status_t issued[NR], ran[NR];
    char why[NR][512];
    sweep_reset(k);
    sweep_arm_everywhere(true);
    for (int i = 0; i < NR; i++) {
      gca_clear_last_error();
      issued[i] =
          gca_all_reduce(buf[i], buf[i], COUNT, GCA_DTYPE_F32, GCA_REDUCE_SUM, comm[i], s[i]);
      snprintf(why[i], sizeof(why[i]), "%s", gca_last_error());
    }
    for (int i = 0; i < NR; i++)
      GCA_CHECK_IGNORE(gca_stream_synchronize(s[i]));
    sweep_arm_everywhere(false);
    for (int i = 0; i < NR; i++) {
      gca_clear_last_error();
      ran[i] = gca_comm_async_error(comm[i]);
      if (issued[i] == GCA_OK)
        snprintf(why[i], sizeof(why[i]), "%s", gca_last_error());
    }
    if (k == 0) {
      n = atomic_load(&sweep_calls);
      print_message("one all-reduce on %d ranks: %lu host allocations swept\n", NR, n);
      assert_true(n >= 2 * NR); /* the issues' and the stages' */
      for (int i = 0; i < NR; i++) {
        assert_ok(issued[i]);
        assert_ok(ran[i]);
      }
    } else {
      assert_int_equal(atomic_load(&sweep_failed), 1);
      int failed_issue = -1;
      for (int i = 0; i < NR; i++)
        if (issued[i] != GCA_OK) {
          assert_int_equal(issued[i], GCA_ERR_OUT_OF_MEMORY);
          if (!strstr(why[i], "no host memory"))
            fail_msg("k=%lu rank %d: '%s'", k, i, why[i]);
          failed_issue = i;
        }
      for (int i = 0; i < NR; i++) {
        if (i == failed_issue)
          continue;
        if (ran[i] == GCA_OK)
          fail_msg("k=%lu rank %d: the collective succeeded", k, i);
        if (failed_issue < 0 && !strstr(why[i], "no host memory to stage"))
          fail_msg("k=%lu rank %d: %s '%s'", k, i, gca_status_name(ran[i]), why[i]);
      }
      if (getenv("GCA_SWEEP_VERBOSE"))
        for (int i = 0; i < NR; i++)
          print_message("k=%lu rank %d: issued %s, ran %s: %s\n", k, i, gca_status_name(issued[i]),
                        gca_status_name(ran[i]), why[i]);
    }
    for (int i = 0; i < NR; i++) {
      assert_ok(gca_comm_destroy(comm[i]));
      assert_ok(gca_free(buf[i]));
      assert_ok(gca_stream_destroy(s[i]));
    }
    assert_ok(gca_set_device(0));
    expect_sound();
  }
}

static void every_collectives_host_allocation_failure_is_clean(void **state) {
  (void)state;
  sweep_every_allocation("collectives", scenario, detail, expect_sound);
}

int main(void) {
  test_backend();
  const struct CMUnitTest tests[] = {
      /* first: it needs a process where no communicator was made yet */
      cmocka_unit_test(the_first_communicators_allocations_fail_cleanly),
      cmocka_unit_test(every_collectives_host_allocation_failure_is_clean),
      cmocka_unit_test(a_collective_without_host_memory_to_stage_fails_on_every_rank),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
