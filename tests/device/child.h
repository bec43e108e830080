/* SPDX-License-Identifier: Apache-2.0 */
/* child.h - running a check in a forked child, for tests of state that is
 * set once per process (backend selection, the cuda backend's one-time
 * initialization): the child sets its environment, runs the check, and
 * reports through its exit status (pass, fail, skip) and a text. */
#ifndef GCA_TEST_CHILD_H
#define GCA_TEST_CHILD_H

#include <stdarg.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gca.h"
#include "support.h"

#define CHILD_PASS 0
#define CHILD_FAIL 1
#define CHILD_SKIP 77

typedef struct report {
  char text[4096];
} report_t;

typedef int (*child_fn)(report_t *r);

GCA_PRINTF(2, 3) static inline int failf(report_t *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->text, sizeof(r->text), fmt, ap);
  va_end(ap);
  return CHILD_FAIL;
}

static inline void child_read_all(FILE *f, char *buf, size_t len) {
  rewind(f);
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* Runs fn in a child after setting the environment from `env`: name, value
 * pairs ending with a NULL name (a NULL value unsets the name). When `err` is
 * not NULL the child's stderr is returned there. A child that fails, dies or
 * skips (CHILD_SKIP) fails or skips the calling test with its text. */
static inline void run_child(const char *const *env, child_fn fn, char *err, size_t errlen) {
  FILE *out = tmpfile();
  FILE *errf = err ? tmpfile() : NULL;
  assert_non_null(out);
  assert_true(err == NULL || errf != NULL);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    report_t r = {{0}};
    int code = CHILD_PASS;
    if (errf && dup2(fileno(errf), STDERR_FILENO) < 0)
      code = failf(&r, "cannot redirect stderr");
    for (size_t i = 0; code == CHILD_PASS && env && env[i]; i += 2)
      if ((env[i + 1] ? setenv(env[i], env[i + 1], 1) : unsetenv(env[i])) != 0)
        code = failf(&r, "cannot set %s", env[i]);
    if (code == CHILD_PASS)
      code = fn(&r);
    fputs(r.text, out);
    fflush(NULL);
    _exit(code);
  }
  int wst = 0;
  assert_int_equal(waitpid(pid, &wst, 0), pid);
  char text[4096];
  char none[1] = "";
  child_read_all(out, text, sizeof(text));
  if (errf)
    child_read_all(errf, err, errlen);
  const char *stderr_text = err ? err : none;
  if (!WIFEXITED(wst))
    fail_msg("child died (signal %d): %s; stderr: %s", WIFSIGNALED(wst) ? WTERMSIG(wst) : 0, text,
             stderr_text);
  if (WEXITSTATUS(wst) == CHILD_SKIP) {
    printf("SKIP: %s\n", text);
    skip();
  }
  if (WEXITSTATUS(wst) != CHILD_PASS)
    fail_msg("%s; stderr: %s", text, stderr_text);
}

/* ---- checks inside a child: each returns the child's verdict on failure ---- */

static inline bool mentions(const char *detail, const char *needle) {
  return needle == NULL || strstr(detail, needle) != NULL;
}

/* A needle for a message: never NULL (a format's %s of NULL is undefined). */
static inline const char *needle_text(const char *needle) {
  return needle ? needle : "";
}

/* Fails the child with the call text and detail unless call returns `want`
 * with a detail containing `needle` (NULL: anything). */
#define EXPECT(r, call, want, needle)                                                      \
  do {                                                                                     \
    gca_clear_last_error();                                                                \
    gca_status_t e_st_ = (call);                                                           \
    if (e_st_ != (want))                                                                   \
      return failf((r), "line %d: %s -> %s (wanted %s): %s", __LINE__, #call,              \
                   gca_status_name(e_st_), gca_status_name(want), gca_last_error());       \
    if (!mentions(gca_last_error(), (needle)))                                             \
      return failf((r), "line %d: %s: detail '%s' does not mention '%s'", __LINE__, #call, \
                   gca_last_error(), needle_text(needle));                                 \
  } while (0)
#define EXPECT_OK(r, call) EXPECT(r, call, GCA_OK, NULL)
#define CHECK(r, cond)                                                 \
  do {                                                                 \
    if (!(cond))                                                       \
      return failf((r), "line %d: %s does not hold", __LINE__, #cond); \
  } while (0)

#endif
