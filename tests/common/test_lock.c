/* SPDX-License-Identifier: Apache-2.0 */
/* test_lock.c - the device lock's bias (Note [Biased device lock], lock.h):
 * a thread's streak biases the lock to it, another thread's lock revokes the
 * bias after the holder lets go, a trylock gives a revocation up instead of
 * waiting, and biased and plain holds exclude each other under load. Every
 * ordering is by a gate (a flag the other thread sets), never by a sleep. In
 * a build or on a kernel without membarrier no lock is ever biased, and the
 * tests check that instead. GCA_TEST_SEED repeats a run of the last test. */
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gca.h"
#include "lock.h"
#include "support.h"

static gca__mutex_t mu;

static bool biasing(void) {
  return gca__mutex_bias_after != UINT32_MAX;
}

/* The calling thread takes and lets go mu until it is biased to it: after
 * GCA__MUTEX_BIAS_AFTER acquisitions. */
static void bias_to_me(void) {
  uint32_t n = 0;
  while (atomic_load(&mu.bias) != gca__lock_me()) {
    gca__mutex_lock(&mu);
    gca__mutex_unlock(&mu);
    assert_true(++n <= GCA__MUTEX_BIAS_AFTER + 1);
  }
  assert_true(n >= GCA__MUTEX_BIAS_AFTER);
}

/* A streak of GCA__MUTEX_BIAS_AFTER acquisitions biases the lock: then a
 * lock and a trylock hold it with `locked` left 0, and an unlock lets it go. */
static void a_thread_that_keeps_the_lock_gets_it_biased(void **state) {
  (void)state;
  gca__mutex_init(&mu);
  if (!biasing()) {
    print_message("no membarrier in this build or on this kernel: never biased\n");
    for (int i = 0; i < 2 * GCA__MUTEX_BIAS_AFTER; i++) {
      gca__mutex_lock(&mu);
      assert_int_equal(atomic_load(&mu.locked), 1);
      gca__mutex_unlock(&mu);
    }
    assert_true(atomic_load(&mu.bias) == GCA__MUTEX_NO_BIAS);
    return;
  }
  assert_int_equal(gca__mutex_bias_after, GCA__MUTEX_BIAS_AFTER);
  bias_to_me();
  gca__mutex_lock(&mu);
  assert_int_equal(atomic_load(&mu.locked), 0);
  assert_int_equal(atomic_load(&mu.active), 1);
  gca__mutex_unlock(&mu);
  assert_int_equal(atomic_load(&mu.active), 0);
  assert_true(gca__mutex_trylock(&mu));
  assert_int_equal(atomic_load(&mu.locked), 0);
  gca__mutex_unlock(&mu);
  assert_int_equal(atomic_load(&mu.active), 0);
}

typedef struct other {
  bool try_only, got;
  atomic_bool done;
} other_t;

static void *other_main(void *arg) {
  other_t *o = arg;
  if (o->try_only) {
    o->got = gca__mutex_trylock(&mu);
  } else {
    gca__mutex_lock(&mu);
    o->got = true;
  }
  if (o->got)
    gca__mutex_unlock(&mu);
  atomic_store(&o->done, true);
  return NULL;
}

/* Another thread's lock while the holder by bias is inside waits (it marked
 * the revocation, and cannot pass the holder's `active`); the holder's
 * unlock lets it through, the bias is gone, and the holder takes `locked`
 * next. */
static void another_thread_revokes_the_bias_after_the_holder_lets_go(void **state) {
  (void)state;
  gca__mutex_init(&mu);
  if (!biasing())
    skip();
  bias_to_me();
  gca__mutex_lock(&mu); /* held by the bias */
  other_t o = {0};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_main, &o), 0);
  while (atomic_load(&mu.bias) != GCA__MUTEX_REVOKING) /* the gate: it took `locked`, revokes */
    sched_yield();
  assert_false(atomic_load(&o.done));
  gca__mutex_unlock(&mu);
  pthread_join(t, NULL);
  assert_true(o.got);
  assert_true(atomic_load(&mu.bias) == GCA__MUTEX_NO_BIAS);
  assert_int_equal(mu.revocations, 1);
  gca__mutex_lock(&mu); /* a plain hold now */
  assert_int_equal(atomic_load(&mu.locked), 1);
  assert_int_equal(atomic_load(&mu.active), 0);
  gca__mutex_unlock(&mu);
  assert_int_equal(atomic_load(&mu.locked), 0);
}

/* A trylock while the holder by bias is inside fails at once and leaves the
 * bias; once the holder has let go, a trylock revokes it and succeeds. */
static void a_trylock_gives_a_revocation_up_while_the_holder_is_inside(void **state) {
  (void)state;
  gca__mutex_init(&mu);
  if (!biasing())
    skip();
  bias_to_me();
  uint64_t me = gca__lock_me();
  gca__mutex_lock(&mu);
  other_t o = {.try_only = true};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_main, &o), 0);
  pthread_join(t, NULL); /* it did not wait for this thread */
  assert_false(o.got);
  assert_int_equal(atomic_load(&mu.bias), me); /* restored, no revocation under way */
  assert_int_equal(atomic_load(&mu.locked), 0);
  assert_int_equal(mu.revocations, 0); /* given up: not counted */
  gca__mutex_unlock(&mu);
  o = (other_t){.try_only = true};
  assert_int_equal(pthread_create(&t, NULL, other_main, &o), 0);
  pthread_join(t, NULL);
  assert_true(o.got);
  assert_true(atomic_load(&mu.bias) == GCA__MUTEX_NO_BIAS);
  assert_int_equal(mu.revocations, 1);
}

/* A child of fork() inherits the bias of the thread that forked; a thread
 * of the child revokes it (the fence works there, registered again if the
 * registration was not inherited), and the lock works on. */
static void a_child_of_fork_revokes_the_bias(void **state) {
  (void)state;
  gca__mutex_init(&mu);
  if (!biasing())
    skip();
  bias_to_me();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    other_t o = {0};
    pthread_t t;
    if (pthread_create(&t, NULL, other_main, &o) != 0)
      _exit(2);
    pthread_join(t, NULL);
    if (!o.got || atomic_load(&mu.bias) != GCA__MUTEX_NO_BIAS)
      _exit(3);
    gca__mutex_lock(&mu);
    gca__mutex_unlock(&mu);
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(atomic_load(&mu.bias), gca__lock_me()); /* the parent's is untouched */
}

/* A revocation whose fence fails (fail point "membarrier": as in a process
 * whose registration was lost) registers again, fences, and the lock goes
 * on; when the second try fails too ("membarrier_lost"), the process
 * stops rather than trust a hold it cannot fence: a child that tries dies of
 * SIGABRT with the reason on stderr. */
static void a_failed_fence_registers_again_or_stops(void **state) {
  (void)state;
  gca__mutex_init(&mu);
  if (!biasing())
    skip();
  bias_to_me();
  assert_ok(gca__failpoint_arm("membarrier", 1));
  other_t o = {0};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_main, &o), 0);
  pthread_join(t, NULL);
  assert_true(o.got);
  assert_false(gca__failpoint_hit("membarrier")); /* spent by the revocation */
  assert_true(atomic_load(&mu.bias) == GCA__MUTEX_NO_BIAS);
  assert_int_equal(mu.revocations, 1);
  gca__failpoint_clear();
  gca__mutex_lock(&mu);
  assert_int_equal(atomic_load(&mu.locked), 1);
  gca__mutex_unlock(&mu);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (freopen("/dev/null", "w", stderr) == NULL)
      _exit(2);
    if (gca__failpoint_arm("membarrier_lost", 1) != GCA_OK)
      _exit(3);
    gca__membarrier();
    _exit(0); /* not reached */
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGABRT);
}

/* Mutual exclusion under load: three threads add to a plain counter under
 * the lock in bursts of random length, so the lock is biased (after 8 in a
 * row here), revoked, and taken by trylock and lock in every order; no
 * increment is lost. */
#define EX_THREADS 3
#define EX_OPS     60000

static long ex_counter;
static unsigned ex_seed;

static unsigned test_seed(void) {
  const char *env = getenv("GCA_TEST_SEED");
  unsigned seed = env != NULL ? (unsigned)strtoul(env, NULL, 0) : (unsigned)time(NULL);
  print_message("lock exclusion: GCA_TEST_SEED=%u\n", seed);
  return seed;
}

static void *ex_main(void *arg) {
  unsigned r = ex_seed * 7919u + (unsigned)(uintptr_t)arg;
  long done = 0;
  while (done < EX_OPS) {
    r = r * 1103515245u + 12345u;
    long burst = 1 + (long)((r >> 8) % 64);
    for (long i = 0; i < burst && done < EX_OPS; i++, done++) {
      if ((r >> 20) & 1) {
        while (!gca__mutex_trylock(&mu))
          sched_yield();
      } else {
        gca__mutex_lock(&mu);
      }
      long v = ex_counter;
      __asm__ __volatile__("" ::: "memory");
      ex_counter = v + 1;
      gca__mutex_unlock(&mu);
    }
  }
  return NULL;
}

static void biased_and_plain_holds_exclude_each_other(void **state) {
  (void)state;
  ex_seed = test_seed();
  uint32_t saved = gca__mutex_bias_after;
  gca__mutex_init(&mu);
  if (biasing())
    gca__mutex_bias_after = 8;
  ex_counter = 0;
  pthread_t t[EX_THREADS];
  for (uintptr_t i = 0; i < EX_THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, ex_main, (void *)i), 0);
  for (int i = 0; i < EX_THREADS; i++)
    pthread_join(t[i], NULL);
  gca__mutex_bias_after = saved;
  assert_int_equal(ex_counter, (long)EX_THREADS * EX_OPS);
  assert_int_equal(atomic_load(&mu.active), 0);
  assert_int_equal(atomic_load(&mu.locked), 0);
  assert_true(atomic_load(&mu.bias) != GCA__MUTEX_REVOKING);
}

/* Note [Biased device lock]: a thread's identity is its thread pointer, so
 * a thread made after a biased holder exited may be given the holder's (the
 * C library reuses a joined thread's stack and control block) and with it
 * the bias. A first thread biases the lock to itself and exits; a second,
 * made after, and the test's thread then take the lock: whichever identity
 * the second got, it holds the lock (by the inherited bias, or after a
 * revocation), and the test's thread waits for its hold (a gate) and
 * revokes. */
typedef struct heir {
  uint64_t me;
  atomic_bool inside, leave;
  bool biased; /* it held the lock by a bias */
} heir_t;

static void *biaser_main(void *arg) {
  heir_t *h = arg;
  h->me = gca__lock_me();
  for (int i = 0; i <= GCA__MUTEX_BIAS_AFTER; i++) {
    gca__mutex_lock(&mu);
    gca__mutex_unlock(&mu);
  }
  return NULL;
}

static void *heir_main(void *arg) {
  heir_t *h = arg;
  h->me = gca__lock_me();
  gca__mutex_lock(&mu);
  h->biased = atomic_load(&mu.locked) == 0;
  atomic_store(&h->inside, true);
  while (!atomic_load(&h->leave)) /* the gate: the test's thread says when */
    sched_yield();
  gca__mutex_unlock(&mu);
  return NULL;
}

static void a_thread_given_an_exited_holders_pointer_takes_its_bias(void **state) {
  (void)state;
  gca__mutex_init(&mu);
  if (!biasing())
    skip();
  heir_t first = {0}, second = {0};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, biaser_main, &first), 0);
  pthread_join(t, NULL);
  assert_true(atomic_load(&mu.bias) == first.me); /* the exited thread's */
  assert_int_equal(atomic_load(&mu.active), 0);
  assert_int_equal(pthread_create(&t, NULL, heir_main, &second), 0);
  while (!atomic_load(&second.inside))
    sched_yield();
  bool same = second.me == first.me;
  print_message("the second thread %s the first's thread pointer\n",
                same ? "was given" : "got other than");
  /* the inherited bias holds the lock with `locked` 0; a revoker took `locked` */
  assert_int_equal(second.biased, same);
  assert_int_equal(mu.revocations, same ? 0u : 1u);
  other_t o = {0};
  pthread_t t2;
  assert_int_equal(pthread_create(&t2, NULL, other_main, &o), 0);
  if (same) /* the gate: it took `locked` and revokes the inherited bias */
    while (atomic_load(&mu.bias) != GCA__MUTEX_REVOKING)
      sched_yield();
  assert_false(atomic_load(&o.done)); /* it cannot pass the second thread's hold */
  atomic_store(&second.leave, true);
  pthread_join(t, NULL);
  pthread_join(t2, NULL);
  assert_true(o.got);
  assert_true(atomic_load(&mu.bias) == GCA__MUTEX_NO_BIAS);
  assert_int_equal(atomic_load(&mu.locked), 0);
  assert_int_equal(atomic_load(&mu.active), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_thread_that_keeps_the_lock_gets_it_biased),
      cmocka_unit_test(another_thread_revokes_the_bias_after_the_holder_lets_go),
      cmocka_unit_test(a_trylock_gives_a_revocation_up_while_the_holder_is_inside),
      cmocka_unit_test(a_thread_given_an_exited_holders_pointer_takes_its_bias),
      cmocka_unit_test(a_child_of_fork_revokes_the_bias),
      cmocka_unit_test(a_failed_fence_registers_again_or_stops),
      cmocka_unit_test(biased_and_plain_holds_exclude_each_other),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
