/* SPDX-License-Identifier: Apache-2.0 */
/* test_sim_graph_replay.c - how the sim replays a graph (Note [Concurrent
 * replay]): independent branches run at the same time, as on a GPU, so a race
 * between branches shows on the sim; every dependency is still honoured, and
 * the launch as a whole stays ordered on its stream.
 *
 * The branches here are host-function nodes that block on gates: this pins
 * the sim's replay, not a driver rule (the driver may run host functions on
 * one thread), so it is a sim test and not a contract test. A gate waits at
 * most GATE_LIMIT_S seconds so that a serialized replay fails the test rather
 * than hanging it; the limit is a deadlock detector, never an ordering device.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "support.h"

#define GATE_LIMIT_S 10

static const gca_device_ops_t *ops;

static int setup(void **state) {
  (void)state;
  ops = test_backend();
  return 0;
}

/* A branch opens the other's gate, then waits on its own: two such branches
 * complete only when they run at the same time. */
typedef struct branch {
  test_gate_t *mine, *other;
  atomic_int passed, runs;
} branch_t;

static void branch_fn(void *arg) {
  branch_t *b = arg;
  test_gate_open(b->other);
  if (test_gate_pass_within(b->mine, GATE_LIMIT_S))
    atomic_fetch_add(&b->passed, 1);
  atomic_fetch_add(&b->runs, 1);
}

/* The order in which nodes ran. */
typedef struct trace {
  pthread_mutex_t mu;
  int seq[16];
  int n;
} trace_t;

typedef struct step {
  trace_t *t;
  int id;
} step_t;

static void step_fn(void *arg) {
  step_t *s = arg;
  pthread_mutex_lock(&s->t->mu);
  if (s->t->n < 16)
    s->t->seq[s->t->n++] = s->id;
  pthread_mutex_unlock(&s->t->mu);
}

static int position(const trace_t *t, int id) {
  for (int i = 0; i < t->n; i++)
    if (t->seq[i] == id)
      return i;
  return -1;
}

static gca_event_t mkevent(void) {
  gca_event_t e;
  assert_ok(ops->event_create(0, GCA_EVENT_DISABLE_TIMING, &e));
  return e;
}

static void independent_branches_of_a_replay_run_concurrently(void **state) {
  (void)state;
  gca_stream_t s1, s2;
  gca_event_t fork = mkevent(), join = mkevent();
  test_gate_t ga, gb;
  test_gate_init(&ga);
  test_gate_init(&gb);
  branch_t a = {.mine = &ga, .other = &gb}, b = {.mine = &gb, .other = &ga};
  gca_graph_t g;
  gca_graph_exec_t x;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s1));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s2));
  assert_ok(ops->stream_begin_capture(s1, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->event_record(fork, s1));
  assert_ok(ops->stream_wait_event(s2, fork));
  assert_ok(ops->launch_host_func(s1, branch_fn, &a));
  assert_ok(ops->launch_host_func(s2, branch_fn, &b));
  assert_ok(ops->event_record(join, s2));
  assert_ok(ops->stream_wait_event(s1, join));
  assert_ok(ops->stream_end_capture(s1, &g));
  assert_ok(ops->graph_instantiate(g, &x));
  for (int launch = 1; launch <= 3; launch++) {
    ga.open = gb.open = false; /* no launch in flight */
    assert_ok(ops->graph_launch(x, s1));
    assert_ok(ops->stream_synchronize(s1));
    assert_int_equal(atomic_load(&a.runs), launch);
    assert_int_equal(atomic_load(&b.runs), launch);
    if (atomic_load(&a.passed) != launch || atomic_load(&b.passed) != launch)
      fail_msg("launch %d: the two branches did not run concurrently", launch);
  }
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->event_destroy(fork));
  assert_ok(ops->event_destroy(join));
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->stream_destroy(s2));
  test_gate_fini(&ga);
  test_gate_fini(&gb);
}

/* Graph: 0 -> 1 -> 2 on s1, 0 -> 3 -> 4 on s2, joined by 5 on s1; launched
 * between a host function before (id 10) and one after (id 11) on the stream. */
static void replay_honours_dependencies_and_stream_order(void **state) {
  (void)state;
  trace_t t = {.n = 0};
  pthread_mutex_init(&t.mu, NULL);
  step_t steps[12];
  for (int i = 0; i < 12; i++)
    steps[i] = (step_t){&t, i};
  gca_stream_t s1, s2;
  gca_event_t fork = mkevent(), join = mkevent();
  gca_graph_t g;
  gca_graph_exec_t x;
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s1));
  assert_ok(ops->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &s2));
  assert_ok(ops->stream_begin_capture(s1, GCA_CAPTURE_MODE_GLOBAL));
  assert_ok(ops->launch_host_func(s1, step_fn, &steps[0]));
  assert_ok(ops->event_record(fork, s1));
  assert_ok(ops->stream_wait_event(s2, fork));
  assert_ok(ops->launch_host_func(s1, step_fn, &steps[1]));
  assert_ok(ops->launch_host_func(s1, step_fn, &steps[2]));
  assert_ok(ops->launch_host_func(s2, step_fn, &steps[3]));
  assert_ok(ops->launch_host_func(s2, step_fn, &steps[4]));
  assert_ok(ops->event_record(join, s2));
  assert_ok(ops->stream_wait_event(s1, join));
  assert_ok(ops->launch_host_func(s1, step_fn, &steps[5]));
  assert_ok(ops->stream_end_capture(s1, &g));
  assert_ok(ops->graph_instantiate(g, &x));
  for (int launch = 0; launch < 20; launch++) {
    t.n = 0;
    assert_ok(ops->launch_host_func(s1, step_fn, &steps[10]));
    assert_ok(ops->graph_launch(x, s1));
    assert_ok(ops->launch_host_func(s1, step_fn, &steps[11]));
    assert_ok(ops->stream_synchronize(s1));
    assert_int_equal(t.n, 8);
    int p[12];
    for (int i = 0; i < 12; i++)
      p[i] = position(&t, i);
    assert_int_equal(p[10], 0);
    assert_int_equal(p[11], 7);
    assert_true(p[0] > p[10]);
    assert_true(p[1] > p[0] && p[2] > p[1]);
    assert_true(p[3] > p[0] && p[4] > p[3]);
    assert_true(p[5] > p[2] && p[5] > p[4]);
  }
  assert_ok(ops->graph_exec_destroy(x));
  assert_ok(ops->graph_destroy(g));
  assert_ok(ops->event_destroy(fork));
  assert_ok(ops->event_destroy(join));
  assert_ok(ops->stream_destroy(s1));
  assert_ok(ops->stream_destroy(s2));
  pthread_mutex_destroy(&t.mu);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(independent_branches_of_a_replay_run_concurrently),
      cmocka_unit_test(replay_honours_dependencies_and_stream_order),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
