/* SPDX-License-Identifier: Apache-2.0 */
/* bench_procs.c - gca-bench's process ceiling: partners started with
 * posix_spawn, one socket each, spoken to a line at a time (bench_procs.h).
 * No sleeps and no timing windows order anything: the partners start their
 * windows when told "go" and answer when done; a partner whose answer is not
 * all there within a minute (BENCH_PROCS_GRACE_MS) past four of its windows is
 * taken as failed, so that a hung partner cannot hang the benchmark. The libc
 * calls no partner can make fail have fail points (Note [Tool fail points]).
 */
#include "bench_procs.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

extern char **environ;

#define LINE_MAX_LEN 320

/* Sends one line; false (errno set) when the other end is gone. A partner
 * run by hand on a pipe writes instead of sending. */
static bool send_line(int fd, const char *fmt, ...) TOOL_PRINTF(2, 3);
static bool send_line(int fd, const char *fmt, ...) {
  char buf[LINE_MAX_LEN];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return false;
  if ((size_t)n > sizeof(buf) - 2)
    n = (int)sizeof(buf) - 2; /* a long error text, cut */
  buf[n++] = '\n';
  for (int off = 0; off < n;) {
    ssize_t w = send(fd, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
    if (w < 0 && errno == ENOTSOCK)
      w = write(fd, buf + off, (size_t)(n - off));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return false;
    off += (int)w;
  }
  return true;
}

/* Reads one line into buf (without its newline): 1, or 0 at end of input,
 * or -1 with errno (ETIMEDOUT: the whole line not there within timeout_ms, -1
 * waits for ever; EMSGSIZE: a line longer than buf; EPROTO: input ended
 * within a line). A byte at a time: the lines are few. The time is for the
 * line, not for each byte, so that one trickling bytes cannot stretch it. */
static int recv_line(int fd, char *buf, size_t len, int timeout_ms) {
  uint64_t deadline = tool_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
  size_t n = 0;
  for (;;) {
    int wait_ms = -1;
    if (timeout_ms >= 0) {
      uint64_t now = tool_now_ns();
      wait_ms = now >= deadline ? 0 : (int)((deadline - now + 999999u) / 1000000u);
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, wait_ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -1;
    if (r == 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    char c;
    ssize_t got = read(fd, &c, 1);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return -1;
    if (got == 0) {
      if (n == 0)
        return 0;
      errno = EPROTO; /* a line cut short */
      return -1;
    }
    if (c == '\n') {
      buf[n] = '\0';
      return 1;
    }
    if (n + 1 >= len) {
      errno = EMSGSIZE;
      return -1;
    }
    buf[n++] = c;
  }
}

/* ---- the benchmark's side ---- */

static bool fail(bench_procs_t *bp, const char *fmt, ...) TOOL_PRINTF(2, 3);
static bool fail(bench_procs_t *bp, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(bp->why, sizeof(bp->why), fmt, ap);
  va_end(ap);
  bench_procs_stop(bp);
  return false;
}

/* The environment with GCA_DEVICE=backend in place of any GCA_DEVICE: the
 * partners use the backend the benchmark chose, without choosing again
 * (which would print the choice once more). NULL without memory. */
static char **partner_env(const char *backend, char *device_var, size_t len) {
  size_t n = 0;
  while (environ[n] != NULL)
    n++;
  char **env = TOOL_FAILPOINT("bench_procs_env") ? NULL : calloc(n + 2, sizeof(*env));
  if (env == NULL)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "GCA_DEVICE=", 11) != 0)
      env[k++] = environ[i];
  if (backend != NULL) {
    snprintf(device_var, len, "GCA_DEVICE=%s", backend);
    env[k++] = device_var;
  }
  env[k] = NULL;
  return env;
}

/* Starts partner i on a new socket: 0, or an errno value. */
static int spawn_partner(bench_procs_t *bp, int i, const char *prog, char **env) {
  int sv[2];
  if ((TOOL_FAILPOINT("bench_procs_socketpair")
           ? (errno = EMFILE, -1)
           : socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) != 0)
    return errno;
  if (sv[1] <= STDERR_FILENO) { /* with a standard stream closed: keep clear of 0 and 1 */
    int moved = TOOL_FAILPOINT("bench_procs_dupfd")
                    ? (errno = EMFILE, -1)
                    : fcntl(sv[1], F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    int e = errno;
    close(sv[1]);
    if (moved < 0) {
      close(sv[0]);
      return e;
    }
    sv[1] = moved;
  }
  posix_spawn_file_actions_t fa;
  int rc = TOOL_FAILPOINT("bench_procs_actions") ? ENOMEM : posix_spawn_file_actions_init(&fa);
  if (rc == 0) {
    for (int to = STDIN_FILENO; rc == 0 && to <= STDOUT_FILENO; to++)
      rc = TOOL_FAILPOINT("bench_procs_adddup2") ? ENOMEM
                                                 : posix_spawn_file_actions_adddup2(&fa, sv[1], to);
    if (rc == 0) {
      char *argv[] = {(char *)prog, "--partner", NULL};
      fflush(NULL);
      rc = TOOL_FAILPOINT("bench_procs_spawn")
               ? EAGAIN
               : posix_spawn(&bp->pid[i], prog, &fa, NULL, argv, env);
    }
    posix_spawn_file_actions_destroy(&fa);
  }
  close(sv[1]);
  if (rc != 0) {
    close(sv[0]);
    return rc;
  }
  bp->fd[i] = sv[0];
  bp->n = i + 1;
  return 0;
}

bool bench_procs_start(bench_procs_t *bp, const char *backend) {
  memset(bp, 0, sizeof(*bp));
  bp->grace_ms = BENCH_PROCS_GRACE_MS;
  const char *prog = getenv("GCA_BENCH_PARTNER");
  if (prog == NULL || prog[0] == '\0')
    prog = "/proc/self/exe";
  char device_var[64];
  char **env = partner_env(backend, device_var, sizeof(device_var));
  if (env == NULL)
    return fail(bp, "no host memory for the partners' environment");
  for (int i = 0; i < BENCH_PROCS; i++) {
    int rc = spawn_partner(bp, i, prog, env);
    if (rc != 0) {
      free(env);
      return fail(bp, "cannot start partner %d ('%s --partner'): %s", i, prog, strerror(rc));
    }
  }
  free(env);
  return true;
}

/* Sends partner i a line, or fails the figure. */
static bool tell(bench_procs_t *bp, int i, const char *what, double seconds) {
  bool ok = seconds > 0 ? send_line(bp->fd[i], "%s %.17g", what, seconds)
                        : send_line(bp->fd[i], "%s", what);
  return ok || fail(bp, "partner %d is gone (sending '%s': %s)", i, what, strerror(errno));
}

/* Waits for partner i's answer: "ready", or with ns != NULL "ns X". */
static bool hear(bench_procs_t *bp, int i, double seconds, double *ns) {
  char line[LINE_MAX_LEN];
  int timeout_ms = (int)(seconds * 4e3) + bp->grace_ms;
  int r = recv_line(bp->fd[i], line, sizeof(line), timeout_ms);
  if (r == 0)
    return fail(bp, "partner %d ended without an answer", i);
  if (r < 0 && errno == ETIMEDOUT)
    return fail(bp, "no answer from partner %d within %d ms", i, timeout_ms);
  if (r < 0 && errno == EMSGSIZE)
    return fail(bp, "partner %d answered a line longer than %d bytes", i, LINE_MAX_LEN - 1);
  if (r < 0 && errno == EPROTO)
    return fail(bp, "partner %d ended within a line", i);
  if (r < 0)
    return fail(bp, "no answer from partner %d: %s", i, strerror(errno));
  if (strncmp(line, "error ", 6) == 0)
    return fail(bp, "partner %d: %s", i, line + 6);
  if (ns == NULL) {
    if (strcmp(line, "ready") == 0)
      return true;
  } else if (strncmp(line, "ns ", 3) == 0) {
    char *end = NULL;
    *ns = strtod(line + 3, &end);
    if (end != line + 3 && *end == '\0' && *ns > 0)
      return true;
  }
  return fail(bp, "partner %d answered '%s', not '%s'", i, line, ns ? "ns X" : "ready");
}

bool bench_procs_round(bench_procs_t *bp, double seconds, double *alone_ns,
                       double both_ns[BENCH_PROCS]) {
  if (bp->n < BENCH_PROCS)
    return false; /* not started, or failed: bp->why says why */
  if (!tell(bp, 0, "run", seconds) || !hear(bp, 0, seconds, NULL) || !tell(bp, 0, "go", 0) ||
      !hear(bp, 0, seconds, alone_ns))
    return false;
  /* all warm up, then all start as one: their windows overlap but for the
   * microseconds between two sends */
  for (int i = 0; i < bp->n; i++)
    if (!tell(bp, i, "run", seconds))
      return false;
  for (int i = 0; i < bp->n; i++)
    if (!hear(bp, i, seconds, NULL))
      return false;
  for (int i = 0; i < bp->n; i++)
    if (!tell(bp, i, "go", 0))
      return false;
  for (int i = 0; i < bp->n; i++)
    if (!hear(bp, i, seconds, &both_ns[i]))
      return false;
  return true;
}

void bench_procs_stop(bench_procs_t *bp) {
  for (int i = 0; i < bp->n; i++) {
    close(bp->fd[i]); /* its end of input: a partner between windows exits */
    if (bp->why[0] != '\0')
      kill(bp->pid[i], SIGKILL); /* one that failed may be anywhere */
    while (waitpid(bp->pid[i], NULL, 0) < 0 && errno == EINTR) {
    }
  }
  bp->n = 0;
}

/* ---- a partner's side ---- */

int bench_partner_serve(const bench_partner_ops_t *ops, void *ctx) {
  char line[LINE_MAX_LEN];
  for (;;) {
    int r = recv_line(STDIN_FILENO, line, sizeof(line), -1);
    if (r <= 0)
      return r == 0 ? 0 : 1;
    char *end = NULL;
    double seconds = strncmp(line, "run ", 4) == 0 ? strtod(line + 4, &end) : 0;
    if (end == NULL || end == line + 4 || *end != '\0' || !(seconds > 0 && seconds <= 60)) {
      send_line(STDOUT_FILENO, "error expected 'run S', S in (0, 60], got '%.200s'", line);
      return 1;
    }
    double ns = 0;
    gca_status_t st = ops->prepare(ctx, seconds);
    if (st == GCA_OK && !send_line(STDOUT_FILENO, "ready"))
      return 1;
    if (st == GCA_OK) {
      r = recv_line(STDIN_FILENO, line, sizeof(line), -1);
      if (r <= 0)
        return r == 0 ? 0 : 1;
      if (strcmp(line, "go") != 0) {
        send_line(STDOUT_FILENO, "error expected 'go', got '%.200s'", line);
        return 1;
      }
      st = ops->window(ctx, seconds, &ns);
    }
    if (st != GCA_OK) {
      send_line(STDOUT_FILENO, "error %s", tool_last_error());
      return 1;
    }
    if (!send_line(STDOUT_FILENO, "ns %.17g", ns))
      return 1;
  }
}
