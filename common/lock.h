/* SPDX-License-Identifier: Apache-2.0 */
/* lock.h - gca__mutex_t, the lock of a device allocator, and the
 * asymmetric fence it shares with the thread caches.
 *
 * Critical sections under it are a few hundred instructions, and the cached
 * alloc/free pair takes it twice, so its uncontended cost matters: here a
 * lock and an unlock are one atomic instruction each, against a few dozen for
 * a general-purpose pthread mutex. Contended, it spins briefly with a
 * growing pause between looks (the holder is usually about to leave; Note
 * [Spin backoff], lock.c) and then sleeps on a futex. `locked` is 0 or 1;
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
 * recursion, no fairness.
 *
 * Note [Biased device lock]. A program that uses a device from one thread
 * (the common case: one thread drives the GPU) still pays the compare-and-swap
 * twice per cached pair, a third of it. So a thread that takes the lock
 * GCA__MUTEX_BIAS_AFTER times in a row, with no other thread between, gets
 * the lock biased to it: from then on it holds the lock by a plain store of
 * `active`, a compiler barrier and a second look at `bias`, and lets go
 * with a release store of `active`; `locked` stays 0. Another thread takes
 * `locked` as before and then revokes the bias: it sets `bias` to
 * GCA__MUTEX_REVOKING, runs membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED),
 * which puts a full fence on every core running a thread of the process,
 * and waits until `active` is 0 (spinning, then naps that give a preempted
 * holder the core). That is Dekker's exchange with the holder's fence
 * supplied by the revoker: either the holder's second look sees the bias
 * gone (it lets `active` go and takes `locked`, waiting behind the
 * revoker), or the revoker's look after the fence sees `active` and waits.
 * The revoker then clears `bias`, and the lock is a plain one until some
 * thread's streak biases it again. (One word for the bias and the
 * revocation: the entry's second look is one load and one compare.) A
 * revocation costs microseconds and happens once per bias, which needs
 * GCA__MUTEX_BIAS_AFTER acquisitions by one thread first, so a lock that
 * threads share stays plain and pays nothing but a counter. A trylock does
 * not wait: if the holder by bias is inside, it gives the revocation up and
 * fails, and the bias stays. Without membarrier (an old kernel, or
 * GCA_NO_MEMBARRIER=1) or in a build a thread sanitizer checks (it cannot
 * see the fence) no lock is ever biased. */
#ifndef GCA_LOCK_H
#define GCA_LOCK_H

#include <stdatomic.h>

#include "common.h"

typedef struct gca__mutex {
  atomic_uint locked;
  atomic_uint sleepers;
  /* Note [Biased device lock]: the thread the lock is biased to
   * (GCA__MUTEX_NO_BIAS: none; GCA__MUTEX_REVOKING: a revocation under way,
   * written by the revoker under `locked`), and whether it holds the lock by
   * its bias now; `last` and `streak` (under `locked`) count the holder's
   * acquisitions in a row. */
  _Atomic uint64_t bias;
  atomic_uint active;
  uint32_t streak;
  uint64_t last;
  uint64_t revocations; /* biases revoked (under `locked`) */
} gca__mutex_t;

#define GCA__MUTEX_NO_BIAS  UINT64_MAX
#define GCA__MUTEX_REVOKING (UINT64_MAX - 1) /* no thread's identity either */
/* The calling thread's lock identity: its thread pointer (the TLS ABI's
 * self-pointer at %fs:0 on x86-64, tpidr_el0 on AArch64), which no two live
 * threads share, read in one instruction where a thread-local variable of a
 * shared library takes two; elsewhere the address of a thread-local
 * variable. A thread given an exited thread's pointer inherits its bias,
 * which is harmless: the exited thread holds nothing, and every other
 * thread still revokes. Never 0, GCA__MUTEX_NO_BIAS or GCA__MUTEX_REVOKING. */
extern _Thread_local char gca__lock_anchor;
static inline uint64_t gca__lock_me(void) {
  uint64_t tp;
#if defined(__x86_64__)
  __asm__("mov %%fs:0, %0" : "=r"(tp));
#elif defined(__aarch64__)
  __asm__("mrs %0, tpidr_el0" : "=r"(tp));
#else
  tp = (uint64_t)(uintptr_t)&gca__lock_anchor;
#endif
  return tp;
}
/* Acquisitions in a row by one thread that bias the lock to it:
 * GCA__MUTEX_BIAS_AFTER, or UINT32_MAX (never) without asymmetric fences
 * (gca__membarrier_ok). */
extern uint32_t gca__mutex_bias_after;
#define GCA__MUTEX_BIAS_AFTER 4096

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
/* After `locked` was taken: a bias to another thread is revoked, or the
 * calling thread's streak counted (and the lock biased to it at
 * gca__mutex_bias_after). A holder by bias is waited out, or with `wait`
 * false the revocation is given up: `locked` let go, and false returned. */
bool gca__mutex_after_lock(gca__mutex_t *m, bool wait);
/* Whether the process may use asymmetric fences (registered for membarrier,
 * and not a build a thread sanitizer checks); registers on the first call. */
bool gca__membarrier_ok(void);
/* A full fence on every core running a thread of the process (only after
 * gca__membarrier_ok returned true). */
void gca__membarrier(void);
/* The other side of an asymmetric fence: waits until *active reads 0
 * (acquire), spinning, then in naps that give a preempted holder the core
 * (a biased lock's holder, a quiet thread cache's owner). */
void gca__wait_inactive(atomic_uint *active);

static inline void gca__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}
/* Aborts naming `op` when the calling thread holds a device lock (debug
 * builds; a no-op otherwise). For the device layer's waiting operations. */
void gca__assert_no_lock(const char *op);

static inline void gca__mutex_init(gca__mutex_t *m) {
  (void)gca__membarrier_ok(); /* sets gca__mutex_bias_after, once */
  atomic_init(&m->locked, 0);
  atomic_init(&m->sleepers, 0);
  atomic_init(&m->bias, GCA__MUTEX_NO_BIAS);
  atomic_init(&m->active, 0);
  m->streak = 0;
  m->last = 0;
  m->revocations = 0;
}

/* The biased entry (Note [Biased device lock]): true when the calling
 * thread holds m by its bias now; a load, a plain store, a compiler barrier
 * and a second load. */
static inline bool gca__mutex_enter_biased(gca__mutex_t *m) {
  uint64_t me = gca__lock_me();
  if (GCA_LIKELY(atomic_load_explicit(&m->bias, memory_order_relaxed) != me))
    return false;
  atomic_store_explicit(&m->active, 1, memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst); /* a fence once a revoker runs membarrier */
  if (GCA_LIKELY(atomic_load_explicit(&m->bias, memory_order_acquire) == me))
    return true;
  atomic_store_explicit(&m->active, 0, memory_order_release);
  return false;
}

/* After `locked` was taken: nothing to do unless the lock is biased (to
 * another thread: revoke) or the holder's streak may bias it. */
static inline bool gca__mutex_locked(gca__mutex_t *m, bool wait) {
  if (GCA_UNLIKELY(atomic_load_explicit(&m->bias, memory_order_relaxed) != GCA__MUTEX_NO_BIAS ||
                   m->last != gca__lock_me() || ++m->streak >= gca__mutex_bias_after))
    return gca__mutex_after_lock(m, wait);
  return true;
}

static inline void gca__mutex_lock(gca__mutex_t *m) {
  GCA__LOCK_DEPTH_ADD(1);
  if (gca__mutex_enter_biased(m))
    return;
  unsigned expected = 0;
  if (GCA_UNLIKELY(!atomic_compare_exchange_strong_explicit(
          &m->locked, &expected, 1, memory_order_acquire, memory_order_relaxed)))
    gca__mutex_lock_slow(m);
  gca__mutex_locked(m, true);
}

/* Takes the lock if it is free; false (nothing done) if it is held, by
 * `locked` or by another thread's bias (Note [Biased device lock]). */
static inline bool gca__mutex_trylock(gca__mutex_t *m) {
  if (gca__mutex_enter_biased(m)) {
    GCA__LOCK_DEPTH_ADD(1);
    return true;
  }
  unsigned expected = 0;
  if (!atomic_compare_exchange_strong_explicit(&m->locked, &expected, 1, memory_order_acquire,
                                               memory_order_relaxed) ||
      !gca__mutex_locked(m, false))
    return false;
  GCA__LOCK_DEPTH_ADD(1);
  return true;
}

/* Lets go a hold made by gca__mutex_enter_biased (a release store). */
static inline void gca__mutex_exit_biased(gca__mutex_t *m) {
  atomic_store_explicit(&m->active, 0, memory_order_release);
}

static inline void gca__mutex_unlock(gca__mutex_t *m) {
  GCA__LOCK_DEPTH_ADD(-1);
  /* active is set only by the bias holder, inside its hold, or for a moment
   * by a holder's entry that then finds the bias gone: while another thread
   * holds `locked` after a revocation (bias cleared, or another's). Under
   * way (GCA__MUTEX_REVOKING) the revoker has not entered: the caller is the
   * holder by bias. */
  uint64_t bias = atomic_load_explicit(&m->bias, memory_order_relaxed);
  if (atomic_load_explicit(&m->active, memory_order_relaxed) &&
      (bias == gca__lock_me() || bias == GCA__MUTEX_REVOKING)) {
    gca__mutex_exit_biased(m);
    return;
  }
  atomic_store_explicit(&m->locked, 0, memory_order_release);
  if (GCA_UNLIKELY(atomic_load_explicit(&m->sleepers, memory_order_relaxed) != 0))
    gca__mutex_wake(m);
}

#endif
