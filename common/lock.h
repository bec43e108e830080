/* SPDX-License-Identifier: Apache-2.0 */
/* lock.h - gca__mutex_t, the lock of a device allocator.
 *
 * Critical sections under it are a few hundred instructions, and the cached
 * alloc/free pair takes it twice, so its uncontended cost matters: here a
 * lock and an unlock are one atomic instruction each, against a few dozen for
 * a general-purpose pthread mutex. Contended, it spins briefly (the holder is
 * usually about to leave) and then sleeps on a futex. `locked` is 0 or 1;
 * `sleepers` counts threads that may be asleep on it, so an unlock makes the
 * futex wake call only when one may be (with a single 0/1/2 word, every unlock
 * after any contention would pay that system call). The unlock is a plain
 * release store and a relaxed load of `sleepers`, no locked instruction: a
 * sequentially consistent store there (an xchg on x86) cost as much as the
 * rest of an uncontended unlock, twice per cached pair. Without a fence
 * between them the load may be served before the store is seen, so an unlock
 * can miss a sleeper that counted itself just then; a sleeper therefore
 * sleeps at most GCA__MUTEX_NAP_NS at a time (lock.c) and looks again, which
 * bounds the cost of that race (and it is rare: the sleeper's own exchange
 * and system call come between). Acquire and release are C11 atomics on
 * `locked`, so ThreadSanitizer sees the ordering the lock provides. No
 * recursion, no fairness. */
#ifndef GCA_LOCK_H
#define GCA_LOCK_H

#include <stdatomic.h>

#include "common.h"

typedef struct gca__mutex {
  atomic_uint locked;
  atomic_uint sleepers;
} gca__mutex_t;

/* Note [No waits under the device lock] (the rule: alloc_core.h). In
 * GCA_DEBUG_CHECKS builds every thread counts the device locks it holds, and
 * the device layer's waiting operations call gca__assert_no_lock, which aborts
 * when the count is not zero. */
#ifdef GCA_DEBUG_CHECKS
extern _Thread_local int gca__lock_depth;
#define GCA__LOCK_DEPTH_ADD(n) (gca__lock_depth += (n))
#else
#define GCA__LOCK_DEPTH_ADD(n) ((void)0)
#endif

/* ---- lock.c ---- */

/* The contended paths. */
void gca__mutex_lock_slow(gca__mutex_t *m);
void gca__mutex_wake(gca__mutex_t *m);
/* Aborts naming `op` when the calling thread holds a device lock (debug
 * builds; a no-op otherwise). For the device layer's waiting operations. */
void gca__assert_no_lock(const char *op);

static inline void gca__mutex_init(gca__mutex_t *m) {
  atomic_init(&m->locked, 0);
  atomic_init(&m->sleepers, 0);
}

static inline void gca__mutex_lock(gca__mutex_t *m) {
  unsigned expected = 0;
  if (GCA_LIKELY(atomic_compare_exchange_strong_explicit(
          &m->locked, &expected, 1, memory_order_acquire, memory_order_relaxed))) {
    GCA__LOCK_DEPTH_ADD(1);
    return;
  }
  gca__mutex_lock_slow(m);
  GCA__LOCK_DEPTH_ADD(1);
}

/* Takes the lock if it is free; false (nothing done) if it is held. */
static inline bool gca__mutex_trylock(gca__mutex_t *m) {
  unsigned expected = 0;
  bool ok = atomic_compare_exchange_strong_explicit(&m->locked, &expected, 1, memory_order_acquire,
                                                    memory_order_relaxed);
  if (ok)
    GCA__LOCK_DEPTH_ADD(1);
  return ok;
}

static inline void gca__mutex_unlock(gca__mutex_t *m) {
  GCA__LOCK_DEPTH_ADD(-1);
  atomic_store_explicit(&m->locked, 0, memory_order_release);
  if (GCA_UNLIKELY(atomic_load_explicit(&m->sleepers, memory_order_relaxed) != 0))
    gca__mutex_wake(m);
}

#endif
