/* SPDX-License-Identifier: Apache-2.0 */
/* sweep.h - the host allocation sweep (Note [Host allocation sweep] in
 * tests/meson.build): the runtime layers a sweep test links are copies whose
 * malloc, calloc, realloc and strdup are the gca_sweep_* functions below. A
 * thread counts their calls while it is armed (sweep_arm); the k-th counted
 * call fails with ENOMEM. Only armed threads count, so the sim's stream
 * threads, which run collectives when their streams reach them, leave the
 * count alone and k names the same allocation in every run.
 *
 * A scenario is run once to warm up, once armed to count its allocations
 * (n), then once for each k in 1..n with the k-th failing. Include this
 * header from one file of a test executable. */
#ifndef GCA_TEST_SWEEP_H
#define GCA_TEST_SWEEP_H

#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *gca_sweep_malloc(size_t n);
void *gca_sweep_calloc(size_t n, size_t size);
void *gca_sweep_realloc(void *p, size_t n);
char *gca_sweep_strdup(const char *s);

static _Thread_local bool sweep_armed;
static _Atomic bool sweep_everywhere;       /* every thread counts (sweep_arm_everywhere) */
static _Atomic unsigned long sweep_calls;   /* counted calls since sweep_reset */
static _Atomic unsigned long sweep_fail_at; /* the call that fails; 0: none */
static _Atomic unsigned long sweep_failed;  /* how many calls failed (0 or 1) */
static void *_Atomic sweep_failed_site;     /* the caller of the failed call */

static inline void sweep_reset(unsigned long fail_at) {
  atomic_store(&sweep_calls, 0);
  atomic_store(&sweep_failed, 0);
  atomic_store(&sweep_failed_site, NULL);
  atomic_store(&sweep_fail_at, fail_at);
}

/* Counts this thread's calls from now on (or stops counting). */
static inline void sweep_arm(bool on) {
  sweep_armed = on;
}

/* Every thread counts, the device's stream threads too: for the
 * allocations made where a stream reaches its work, when the caller can tell
 * the outcome apart whichever thread gets the k-th call. */
static inline void sweep_arm_everywhere(bool on) {
  atomic_store(&sweep_everywhere, on);
}

static inline bool sweep_fails(void *site) {
  if (!sweep_armed && !atomic_load(&sweep_everywhere))
    return false;
  unsigned long k = atomic_fetch_add(&sweep_calls, 1) + 1;
  if (k != atomic_load(&sweep_fail_at))
    return false;
  atomic_fetch_add(&sweep_failed, 1);
  atomic_store(&sweep_failed_site, site);
  errno = ENOMEM;
  return true;
}

void *gca_sweep_malloc(size_t n) {
  return sweep_fails(__builtin_return_address(0)) ? NULL : malloc(n);
}

void *gca_sweep_calloc(size_t n, size_t size) {
  return sweep_fails(__builtin_return_address(0)) ? NULL : calloc(n, size);
}

void *gca_sweep_realloc(void *p, size_t n) {
  return sweep_fails(__builtin_return_address(0)) ? NULL : realloc(p, n);
}

char *gca_sweep_strdup(const char *s) {
  return sweep_fails(__builtin_return_address(0)) ? NULL : strdup(s);
}

/* The failed call's site as an offset in its object, for addr2line -e. */
static inline unsigned long sweep_site_offset(void) {
  void *site = atomic_load(&sweep_failed_site);
  Dl_info info;
  if (site && dladdr(site, &info) && info.dli_fbase)
    return (unsigned long)((char *)site - (char *)info.dli_fbase);
  return (unsigned long)(uintptr_t)site;
}

/* The scenario's first failure, taken where it happened (cleanup may set
 * another), and the step that records it: SWEEP_STEP(call) in a scenario
 * with a gca_status_t st and a label out. */
static char detail[1024];

#define SWEEP_STEP(call)                                                   \
  do {                                                                     \
    st = (call);                                                           \
    if (st != GCA_OK) {                                                    \
      snprintf(detail, sizeof(detail), "%s: %s", #call, gca_last_error()); \
      goto out;                                                            \
    }                                                                      \
  } while (0)

/* Whether a failure's detail says it is about host memory. */
static inline bool sweep_says_host_memory(const char *detail) {
  return strstr(detail, "host memory") || strstr(detail, "out of memory") ||
         strstr(detail, "Cannot allocate memory");
}

/* The sweep of one scenario (the header comment): scenario(false) warms up,
 * scenario(true) runs armed. A failed run must leave in `detail` (the
 * scenario's copy of its first error) a text that says host memory; a run
 * that succeeds had a fallback. `sound` checks the state after every run.
 * Needs cmocka (fail_msg, print_message). */
static inline void sweep_every_allocation(const char *name, gca_status_t (*scenario)(bool armed),
                                          const char *detail, void (*sound)(void)) {
  assert_int_equal(scenario(false), GCA_OK); /* warm: one-time allocations of lower layers */
  sound();
  sweep_reset(0);
  sweep_arm(true);
  gca_status_t st = scenario(true);
  sweep_arm(false);
  if (st != GCA_OK)
    fail_msg("the %s scenario fails unswept: %s", name, detail);
  unsigned long n = atomic_load(&sweep_calls);
  print_message("%s scenario: %lu host allocations swept\n", name, n);
  assert_true(n > 0); /* the renamed calls do reach the sweep */
  sound();
  unsigned long fallbacks = 0;
  for (unsigned long k = 1; k <= n; k++) {
    sweep_reset(k);
    sweep_arm(true);
    gca_clear_last_error();
    st = scenario(true);
    sweep_arm(false);
    assert_int_equal(atomic_load(&sweep_failed), 1);
    unsigned long site = sweep_site_offset();
    if (st == GCA_OK) {
      fallbacks++;
      print_message("k=%lu (site 0x%lx): the failure had a fallback\n", k, site);
    } else {
      if (!sweep_says_host_memory(detail))
        fail_msg("k=%lu (site 0x%lx): %s: '%s'", k, site, gca_status_name(st), detail);
      if (st != GCA_ERR_OUT_OF_MEMORY || getenv("GCA_SWEEP_VERBOSE"))
        print_message("k=%lu (site 0x%lx): %s: %s\n", k, site, gca_status_name(st), detail);
    }
    sound();
  }
  print_message("%s scenario: %lu k values run, %lu with a fallback\n", name, n, fallbacks);
}

#endif
