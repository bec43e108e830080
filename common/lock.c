/* SPDX-License-Identifier: Apache-2.0 */
/* lock.c - the contended paths of gca__mutex_t (see lock.h): a short spin,
 * then sleeping on a futex until the holder's unlock wakes one sleeper. */
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lock.h"

#ifdef GCA_DEBUG_CHECKS
_Thread_local int gca__lock_depth;
#endif

_Thread_local char gca__lock_anchor;
uint32_t gca__mutex_bias_after = UINT32_MAX;

/* ---- asymmetric fences ---- */

/* A thread sanitizer cannot see the fence membarrier puts on other threads,
 * and would report every biased hold as a race. */
#if defined(__SANITIZE_THREAD__)
#define ASYM_BUILD 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ASYM_BUILD 0
#endif
#endif
#ifndef ASYM_BUILD
#define ASYM_BUILD 1
#endif

static pthread_once_t g_asym_once = PTHREAD_ONCE_INIT;
static bool g_asym;

static void asym_once(void) {
  const char *off = gca__getenv("GCA_NO_MEMBARRIER");
  g_asym = ASYM_BUILD && !(off != NULL && off[0] != '\0' && strcmp(off, "0") != 0) &&
           syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  if (g_asym)
    gca__mutex_bias_after = GCA__MUTEX_BIAS_AFTER;
}

bool gca__membarrier_ok(void) {
  pthread_once(&g_asym_once, asym_once);
  return g_asym;
}

/* The fence on every thread. A process whose registration did not survive
 * (a child of fork() may not inherit it) registers again and fences; if that
 * fails too, no lock-free hold can be made safe, and it stops. Fail points
 * let tests take both ways: "membarrier" fails the fence once,
 * "membarrier_lost" the fence and the second try. */
void gca__membarrier(void) {
  bool lost = GCA_FAILPOINT("membarrier_lost");
  if (GCA_LIKELY(!lost && !GCA_FAILPOINT("membarrier") &&
                 syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0))
    return;
  if (lost || syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0 ||
      syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
    GCA_ASSERT(!"membarrier failed after the process registered for it");
}

void gca__assert_no_lock(const char *op) {
#ifdef GCA_DEBUG_CHECKS
  if (gca__lock_depth > 0) {
    GCA_LOG_ERR("%s waits with %d device lock(s) held by this thread (Note [No waits under the "
                "device lock])",
                op, gca__lock_depth);
    abort();
  }
#else
  (void)op;
#endif
}

/* Note [Spin backoff]. A waiter looks at `locked` SPINS times, pausing
 * twice as long after each look (up to MAX_PAUSES pauses, about 960 in all:
 * some microseconds), before it yields. Each look takes the lock's cache
 * line from the holder, whose next write to it (the lock, its streak, the
 * unlock) must then take it back: with a look every pause, two threads
 * sharing the device lock (mixed sizes, whose thread caches park) spent
 * more than a quarter of their time in sched_yield and the scheduler, and
 * the holder ran slower for the looks. With the backoff they spend a fifth
 * of that and move more pairs (README, mixed sizes on two threads). */
#define SPINS      20
#define MAX_PAUSES 64
#define YIELDS     64
/* The longest a sleeper sleeps before it looks at the lock again (lock.h). */
#define GCA__MUTEX_NAP_NS 1000000

void gca__mutex_lock_slow(gca__mutex_t *m) {
  for (int i = 0; i < SPINS; i++) {
    unsigned c = atomic_load_explicit(&m->locked, memory_order_relaxed);
    if (c == 0 && atomic_compare_exchange_weak_explicit(&m->locked, &c, 1, memory_order_acquire,
                                                        memory_order_relaxed))
      return;
    for (int k = 0, n = i < 6 ? 1 << i : MAX_PAUSES; k < n; k++) /* Note [Spin backoff] */
      gca__cpu_relax();
  }
  /* The holder may have been preempted or be in a long device call: let it
   * run before going to sleep, since waking a sleeper costs the holder a
   * system call on every unlock until the sleeper is back. */
  for (int i = 0; i < YIELDS; i++) {
    sched_yield();
    unsigned c = atomic_load_explicit(&m->locked, memory_order_relaxed);
    if (c == 0 && atomic_compare_exchange_weak_explicit(&m->locked, &c, 1, memory_order_acquire,
                                                        memory_order_relaxed))
      return;
  }
  /* Announce a sleeper before the last try, so an unlock after it wakes us;
   * one that looked just before may not, hence the nap (lock.h). */
  atomic_fetch_add_explicit(&m->sleepers, 1, memory_order_seq_cst);
  while (atomic_exchange_explicit(&m->locked, 1, memory_order_seq_cst) != 0) {
    struct timespec nap = {0, GCA__MUTEX_NAP_NS};
    syscall(SYS_futex, &m->locked, FUTEX_WAIT_PRIVATE, 1, &nap, NULL, 0);
  }
  atomic_fetch_sub_explicit(&m->sleepers, 1, memory_order_relaxed);
}

void gca__mutex_wake(gca__mutex_t *m) {
  syscall(SYS_futex, &m->locked, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* ---- bias (Note [Biased device lock]) ---- */

#define INACTIVE_SPINS  128
#define INACTIVE_NAP_NS 20000

void gca__wait_inactive(atomic_uint *active) {
  for (unsigned i = 0; atomic_load_explicit(active, memory_order_acquire); i++) {
    if (i < INACTIVE_SPINS) {
      gca__cpu_relax();
    } else {
      struct timespec nap = {0, INACTIVE_NAP_NS};
      nanosleep(&nap, NULL);
    }
  }
}

bool gca__mutex_after_lock(gca__mutex_t *m, bool wait) {
  uint64_t me = gca__lock_me();
  uint64_t b = atomic_load_explicit(&m->bias, memory_order_relaxed);
  if (b == me) /* its entry met a revocation that was given up: the bias stays */
    return true;
  if (b != GCA__MUTEX_NO_BIAS) { /* biased to another thread: revoke */
    atomic_store_explicit(&m->bias, GCA__MUTEX_REVOKING, memory_order_relaxed);
    gca__membarrier();
    if (!wait && atomic_load_explicit(&m->active, memory_order_acquire)) {
      /* held by its bias now: a trylock gives up, and the holder's next
       * entry (which may have met the revocation) finds the bias as it was */
      atomic_store_explicit(&m->bias, b, memory_order_release);
      atomic_store_explicit(&m->locked, 0, memory_order_release);
      if (GCA_UNLIKELY(atomic_load_explicit(&m->sleepers, memory_order_relaxed) != 0))
        gca__mutex_wake(m);
      return false;
    }
    gca__wait_inactive(&m->active);
    atomic_store_explicit(&m->bias, GCA__MUTEX_NO_BIAS, memory_order_release);
    m->revocations++;
    m->last = me;
    m->streak = 1;
    return true;
  }
  if (m->last != me) {
    m->last = me;
    m->streak = 1;
  } else if (gca__mutex_bias_after == UINT32_MAX) {
    m->streak = 0; /* no bias here: the count only wraps */
  } else if (m->streak >= gca__mutex_bias_after) {
    /* from this thread's next acquisition on; published by its unlock */
    atomic_store_explicit(&m->bias, me, memory_order_relaxed);
  }
  return true;
}
