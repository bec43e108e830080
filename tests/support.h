/* support.h - the one place tests reach the library's internals from, and
 * what every test file shares: cmocka, the device table under test
 * (GCA_TEST_BACKEND=sim|cuda; cuda skips with exit 77 and a message when no
 * driver or device is present), and small assertions on gca statuses.
 *
 * A test includes "gca.h" for the public API and this header for anything
 * else: the internal headers below are included here and nowhere else under
 * tests/, so what tests depend on beyond the public API is listed in one place.
 */
#ifndef GCA_TEST_SUPPORT_H
#define GCA_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
