/* SPDX-License-Identifier: Apache-2.0 */
/* lock.c - the contended paths of gca__mutex_t (see lock.h): a short spin,
 * then sleeping on a futex until the holder's unlock wakes one sleeper. */
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <stdlib.h>
#include <time.h>

#include "lock.h"

#ifdef GCA_DEBUG_CHECKS
_Thread_local int gca__lock_depth;
#endif

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

#define SPINS  64
#define YIELDS 64
/* The longest a sleeper sleeps before it looks at the lock again (lock.h). */
#define GCA__MUTEX_NAP_NS 1000000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void gca__mutex_lock_slow(gca__mutex_t *m) {
  for (int i = 0; i < SPINS; i++) {
    unsigned c = atomic_load_explicit(&m->locked, memory_order_relaxed);
    if (c == 0 && atomic_compare_exchange_weak_explicit(&m->locked, &c, 1, memory_order_acquire,
                                                        memory_order_relaxed))
      return;
    cpu_relax();
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
