/* SPDX-License-Identifier: Apache-2.0 */
/* support.h - the one place tests reach the library's internals from, and
 * what every test file shares: cmocka, the device table under test
 * (GCA_TEST_BACKEND=sim|cuda; cuda skips with exit 77 and a message when no
 * driver or device is present), small assertions on gca statuses, and the
 * gate that orders a stream's work against the test without timing.
 *
 * A test includes "gca.h" for the public API and this header for anything
 * else: the internal headers below are included here and nowhere else under
 * tests/, so what tests depend on beyond the public API is listed in one place.
 */
#ifndef GCA_TEST_SUPPORT_H
#define GCA_TEST_SUPPORT_H

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gca.h"

/* Internals the tests use: error helpers and the environment/clock seams
 * (common.h), the device operation table (device.h), the sim's own header
 * (sim.h), the allocator's structures, walker and reset (alloc_core.h,
 * introspect.h), configuration parsing (config.h), history (history.h) and the
 * JSON reader (json.h). */
#include "alloc_core.h"
#include "common.h"
#include "config.h"
#include "device.h"
#include "history.h"
#include "introspect.h"
#include "json.h"
#include "sim.h"

/* Asserts a call returned GCA_OK, printing the detail otherwise. */
#define assert_ok(call)                                                          \
  do {                                                                           \
    gca_status_t t_st_ = (call);                                                 \
    if (t_st_ != GCA_OK)                                                         \
      fail_msg("%s -> %s: %s", #call, gca_status_name(t_st_), gca_last_error()); \
  } while (0)

/* Asserts a call returned `expected` and that the detail contains `needle`. */
#define assert_status(call, expected, needle)                                    \
  do {                                                                           \
    gca_clear_last_error();                                                      \
    gca_status_t t_st_ = (call);                                                 \
    if (t_st_ != (expected))                                                     \
      fail_msg("%s -> %s (wanted %s): %s", #call, gca_status_name(t_st_),        \
               gca_status_name(expected), gca_last_error());                     \
    if ((needle) != NULL && strstr(gca_last_error(), (needle)) == NULL)          \
      fail_msg("%s: detail '%s' does not mention '%s'", #call, gca_last_error(), \
               (const char *)(needle));                                          \
  } while (0)

/* The backend named by GCA_TEST_BACKEND (default sim), initialized. For cuda
 * without a usable GPU the process exits 77 (meson: skipped) with a message. */
/* GCA_TEST_FILTER=pattern runs only the tests whose names match (cmocka's
 * wildcards): one contract at a time on a real device. */
static inline void test_filter_from_env(void) {
  const char *f = getenv("GCA_TEST_FILTER");
  if (f && *f)
    cmocka_set_test_filter(f);
}

static inline const gca_device_ops_t *test_backend(void) {
  const char *b = getenv("GCA_TEST_BACKEND");
  const gca_device_ops_t *ops = (b && strcmp(b, "cuda") == 0) ? gca__cuda_ops() : gca__sim_ops();
  gca_status_t st = ops->init();
  int n = 0;
  if (st == GCA_OK)
    st = ops->device_count(&n);
  if (st != GCA_OK || n == 0) {
    if (ops == gca__cuda_ops()) {
      printf("SKIP: no usable GPU for the cuda backend: %s\n", gca_last_error());
      exit(77);
    }
    fprintf(stderr, "sim backend failed to initialize: %s\n", gca_last_error());
    exit(1);
  }
  gca__device_override(ops);
  return ops;
}

/* A gate holds a stream back without timing: test_gate_pass, launched as a
 * host function, blocks the stream until the test calls test_gate_open, so
 * "not yet run" is asserted while the gate is shut and the result once it is
 * open. Both take void * so that either can be a host function or a hook. */
typedef struct test_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;
} test_gate_t;

#define TEST_GATE_INIT \
  { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false }

static inline void test_gate_init(test_gate_t *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = false;
}

static inline void test_gate_fini(test_gate_t *g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

static inline void test_gate_open(void *gate) {
  test_gate_t *g = gate;
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static inline void test_gate_pass(void *gate) {
  test_gate_t *g = gate;
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

/* As test_gate_pass, but gives up after `seconds`: true once the gate is open,
 * false when the time passed first. The limit turns a deadlock into a failure;
 * it never orders anything. */
static inline bool test_gate_pass_within(test_gate_t *g, int seconds) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += seconds;
  pthread_mutex_lock(&g->mu);
  int rc = 0;
  while (!g->open && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&g->cv, &g->mu, &until);
  bool open = g->open;
  pthread_mutex_unlock(&g->mu);
  return open;
}

/* Number of file descriptors the process has open (for leak checks). */
static inline int test_fd_count(void) {
  DIR *d = opendir("/proc/self/fd");
  assert_non_null(d);
  int n = 0;
  while (readdir(d) != NULL)
    n++;
  closedir(d);
  return n;
}

/* Exit status of a child whose read faulted under ASan, which handles SIGSEGV
 * itself unless the child installs its own handler (test_read_faults does). */
#define TEST_FAULT_EXIT 97

static inline void test_fault_exit(int sig) {
  (void)sig;
  _exit(TEST_FAULT_EXIT);
}

/* Whether reading a word at `p` faults (SIGSEGV or SIGBUS), tried in a forked
 * child so that the test process survives the fault. */
static inline bool test_read_faults(const void *p) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    struct sigaction sa = {0};
    sa.sa_handler = test_fault_exit;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    volatile uint32_t v = *(volatile const uint32_t *)p;
    (void)v;
    _exit(0);
  }
  int ws = 0;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  if (WIFSIGNALED(ws)) {
    assert_true(WTERMSIG(ws) == SIGSEGV || WTERMSIG(ws) == SIGBUS);
    return true;
  }
  assert_true(WIFEXITED(ws));
  assert_true(WEXITSTATUS(ws) == TEST_FAULT_EXIT || WEXITSTATUS(ws) == 0);
  return WEXITSTATUS(ws) == TEST_FAULT_EXIT;
}

/* Runs argv (searched in PATH when it has no slash) with stdout and stderr
 * into a malloc'd *out; returns the exit status, or -1 when the child did not
 * exit normally. */
static inline int test_run_capture(char *const argv[], char **out) {
  char tmpl[] = "/tmp/gca-test-XXXXXX";
  int fd = mkstemp(tmpl);
  assert_true(fd >= 0);
  unlink(tmpl);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    execvp(argv[0], argv);
    _exit(127);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  off_t len = lseek(fd, 0, SEEK_END);
  *out = calloc(1, (size_t)len + 1);
  assert_non_null(*out);
  assert_int_equal(pread(fd, *out, (size_t)len, 0), len);
  close(fd);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif
