/* SPDX-License-Identifier: Apache-2.0 */
/* test_bench_procs.c - gca-bench's process ceiling (tools/bench_procs.h) with
 * shell scripts for partners (GCA_BENCH_PARTNER) and fake operations for the
 * partner's side: a round with partners that answer in turn gives their
 * figures; every way a partner can fail - not there, ended, silent, an answer
 * out of turn, too long, cut short, an error of its own - and every libc call
 * that can fail while partners start (Note [Tool fail points]) fails the
 * figure with a reason that says which, and leaves no partner running, no
 * child unreaped and no descriptor open. The partner's side answers its
 * protocol on a pipe and refuses what is not it.
 *
 * The scripts ignore the "--partner" argument; each reads a line with the
 * shell's own `read` so that killing it leaves nothing behind, except where a
 * case needs `sleep`. */
#include <fcntl.h>
#include <sys/stat.h>

#include "support.h"
#include "bench_procs.h"
#include "util.h"

/* A window's length for the rounds; the scripts do not time anything. */
#define SECONDS 0.01
/* The grace for partners that answer: far past any shell's start. */
#define GRACE_MS 10000

static char dir[64]; /* the scripts' directory */

/* Nothing left: no child of this process (running or unreaped) and as many
 * open descriptors as `fds`. */
static void assert_nothing_left(int fds) {
  errno = 0;
  pid_t pid = waitpid(-1, NULL, WNOHANG);
  if (pid != -1 || errno != ECHILD)
    fail_msg("a child is left: waitpid(-1) = %d (%s)", (int)pid, strerror(errno));
  int now = test_fd_count();
  if (now != fds)
    fail_msg("%d descriptors open, %d before", now, fds);
}

/* Writes `body` as an executable /bin/sh script `name` in the directory and
 * makes it the partner; returns its path. */
static const char *partner(const char *name, const char *body) {
  static char path[128];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  fprintf(f, "#!/bin/sh\n%s", body);
  assert_int_equal(fclose(f), 0);
  assert_int_equal(setenv("GCA_BENCH_PARTNER", path, 1), 0);
  return path;
}

/* Answers each "run S" with "ready" and the "go" after it with "ns S". */
static const char *const good = "while read -r line; do\n"
                                "  case \"$line\" in\n"
                                "  run\\ *) s=${line#run }; echo ready ;;\n"
                                "  go) echo \"ns $s\" ;;\n"
                                "  *) echo \"error unexpected '$line'\"; exit 1 ;;\n"
                                "  esac\n"
                                "done\n";

static int group_setup(void **state) {
  (void)state;
  snprintf(dir, sizeof(dir), "/tmp/gca-bench-procs-XXXXXX");
  return mkdtemp(dir) != NULL ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  DIR *d = opendir(dir);
  if (d != NULL) {
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
      char path[320];
      snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
      if (e->d_name[0] != '.')
        unlink(path);
    }
    closedir(d);
  }
  rmdir(dir);
  unsetenv("GCA_BENCH_PARTNER");
  return 0;
}

static void round_with_answering_partners_gives_their_figures(void **state) {
  (void)state;
  int fds = test_fd_count();
  partner("good", good);
  bench_procs_t bp;
  assert_true(bench_procs_start(&bp, "sim"));
  assert_int_equal(bp.n, BENCH_PROCS);
  assert_int_equal(bp.grace_ms, BENCH_PROCS_GRACE_MS);
  bp.grace_ms = GRACE_MS;
  for (double s = 0.25; s <= 0.5; s *= 2) { /* a round after a round */
    double alone = 0, both[BENCH_PROCS] = {0};
    if (!bench_procs_round(&bp, s, &alone, both))
      fail_msg("round of %g s: %s", s, bp.why);
    assert_true(alone == s);
    for (int i = 0; i < BENCH_PROCS; i++)
      assert_true(both[i] == s);
  }
  assert_string_equal(bp.why, "");
  bench_procs_stop(&bp);
  bench_procs_stop(&bp); /* idempotent */
  assert_nothing_left(fds);
}

static void answer_of_319_bytes_is_read_whole(void **state) {
  (void)state;
  int fds = test_fd_count();
  partner("long_ok", "while read -r line; do\n"
                     "  case \"$line\" in run*) echo ready ;; go) printf 'ns %0316d\\n' 5 ;; esac\n"
                     "done\n");
  bench_procs_t bp;
  assert_true(bench_procs_start(&bp, "sim"));
  bp.grace_ms = GRACE_MS;
  double alone = 0, both[BENCH_PROCS] = {0};
  if (!bench_procs_round(&bp, SECONDS, &alone, both))
    fail_msg("%s", bp.why);
  assert_true(alone == 5 && both[0] == 5 && both[1] == 5);
  bench_procs_stop(&bp);
  assert_nothing_left(fds);
}

/* With standard input and error closed the partners' sockets would land on
 * 0 and 2; the child's end is moved clear of them, and with the move failing
 * nothing is left open. */
static void partners_start_with_standard_streams_closed(void **state) {
  (void)state;
  int fds = test_fd_count();
  partner("good", good);
  for (int forced = 0; forced <= 1; forced++) {
    int in = dup(STDIN_FILENO), err = dup(STDERR_FILENO);
    assert_true(in >= 0 && err >= 0);
    close(STDIN_FILENO);
    close(STDERR_FILENO);
    if (forced)
      assert_int_equal(tool_failpoint_arm("bench_procs_dupfd", 1), GCA_OK);
    bench_procs_t bp;
    bool started = bench_procs_start(&bp, "sim");
    bp.grace_ms = GRACE_MS;
    double alone = 0, both[BENCH_PROCS] = {0};
    bool ran = started && bench_procs_round(&bp, SECONDS, &alone, both);
    bench_procs_stop(&bp);
    tool_failpoint_clear();
    /* the assertions only once standard error is back */
    assert_int_equal(dup2(in, STDIN_FILENO), STDIN_FILENO);
    assert_int_equal(dup2(err, STDERR_FILENO), STDERR_FILENO);
    close(in);
    close(err);
    if (!forced) {
      if (!ran)
        fail_msg("%s", bp.why);
      assert_true(alone == SECONDS && both[0] == SECONDS && both[1] == SECONDS);
    } else {
      char why[256];
      snprintf(why, sizeof(why), "cannot start partner 0 ('%s/good --partner'): %s", dir,
               strerror(EMFILE));
      assert_false(started);
      assert_string_equal(bp.why, why);
    }
    assert_nothing_left(fds);
  }
}

static void partners_get_the_chosen_backend(void **state) {
  (void)state;
  int fds = test_fd_count();
  assert_int_equal(setenv("GCA_DEVICE", "sim", 1), 0);
  partner("device", "read -r line\necho \"error GCA_DEVICE=$GCA_DEVICE\"\n");
  bench_procs_t bp;
  assert_true(bench_procs_start(&bp, "other"));
  bp.grace_ms = GRACE_MS;
  double alone, both[BENCH_PROCS];
  assert_false(bench_procs_round(&bp, SECONDS, &alone, both));
  assert_string_equal(bp.why, "partner 0: GCA_DEVICE=other");
  assert_nothing_left(fds);
}

/* ---- partners that cannot start ---- */

/* Starts, expecting the failure `why` (a format with the partner's path for
 * %s); the round after it fails and keeps the reason. */
static void start_fails(const char *path, const char *why_fmt) {
  char why[512];
  snprintf(why, sizeof(why), why_fmt, path);
  bench_procs_t bp;
  assert_false(bench_procs_start(&bp, "sim"));
  assert_string_equal(bp.why, why);
  assert_int_equal(bp.n, 0);
  double alone, both[BENCH_PROCS];
  assert_false(bench_procs_round(&bp, SECONDS, &alone, both));
  assert_string_equal(bp.why, why);
  bench_procs_stop(&bp);
}

static void missing_partner_program_fails_the_start(void **state) {
  (void)state;
  int fds = test_fd_count();
  char path[128];
  snprintf(path, sizeof(path), "%s/missing", dir);
  assert_int_equal(setenv("GCA_BENCH_PARTNER", path, 1), 0);
  start_fails(path, "cannot start partner 0 ('%s --partner'): No such file or directory");
  assert_nothing_left(fds);
}

static void partner_program_not_executable_fails_the_start(void **state) {
  (void)state;
  int fds = test_fd_count();
  const char *path = partner("plain", good);
  assert_int_equal(chmod(path, 0644), 0);
  start_fails(path, "cannot start partner 0 ('%s --partner'): Permission denied");
  assert_nothing_left(fds);
}

/* Each libc call of the start failed once, at each pass where it can: the
 * first partner's, or the second's with the first one running. */
static void libc_failures_fail_the_start_and_leave_nothing(void **state) {
  (void)state;
  static const struct {
    const char *point;
    unsigned nth;
    const char *why; /* %s: the partner's path */
  } cases[] = {
      {"bench_procs_env", 1, "no host memory for the partners' environment"},
      {"bench_procs_socketpair", 1, "cannot start partner 0 ('%s --partner'): Too many open files"},
      {"bench_procs_socketpair", 2, "cannot start partner 1 ('%s --partner'): Too many open files"},
      {"bench_procs_actions", 1, "cannot start partner 0 ('%s --partner'): Cannot allocate memory"},
      {"bench_procs_actions", 2, "cannot start partner 1 ('%s --partner'): Cannot allocate memory"},
      {"bench_procs_adddup2", 1, "cannot start partner 0 ('%s --partner'): Cannot allocate memory"},
      {"bench_procs_adddup2", 2, "cannot start partner 0 ('%s --partner'): Cannot allocate memory"},
      {"bench_procs_adddup2", 4, "cannot start partner 1 ('%s --partner'): Cannot allocate memory"},
      {"bench_procs_spawn", 1,
       "cannot start partner 0 ('%s --partner'): Resource temporarily unavailable"},
      {"bench_procs_spawn", 2,
       "cannot start partner 1 ('%s --partner'): Resource temporarily unavailable"},
  };
  int fds = test_fd_count();
  const char *path = partner("good", good);
  for (size_t c = 0; c < TOOL_ARRAY_SIZE(cases); c++) {
    print_message("%s, pass %u\n", cases[c].point, cases[c].nth);
    assert_int_equal(tool_failpoint_arm(cases[c].point, cases[c].nth), GCA_OK);
    start_fails(path, cases[c].why);
    assert_int_equal(__atomic_load_n(&tool_failpoints_armed, __ATOMIC_RELAXED), 0); /* it hit */
    assert_nothing_left(fds);
  }
  /* and once disarmed the same partners start */
  bench_procs_t bp;
  assert_true(bench_procs_start(&bp, "sim"));
  bench_procs_stop(&bp);
  assert_nothing_left(fds);
}

/* ---- partners that fail in the round ---- */

/* Starts partners running `body`, expecting the round to fail with `why`. */
static void round_fails(const char *name, const char *body, int grace_ms, const char *why) {
  int fds = test_fd_count();
  partner(name, body);
  bench_procs_t bp;
  assert_true(bench_procs_start(&bp, "sim"));
  bp.grace_ms = grace_ms;
  double alone = 0, both[BENCH_PROCS] = {0};
  assert_false(bench_procs_round(&bp, SECONDS, &alone, both));
  assert_string_equal(bp.why, why);
  assert_int_equal(bp.n, 0); /* stopped */
  assert_false(bench_procs_round(&bp, SECONDS, &alone, both));
  bench_procs_stop(&bp);
  assert_nothing_left(fds);
}

static void partner_that_ends_fails_the_round(void **state) {
  (void)state;
  round_fails("ends", "read -r line\n", GRACE_MS, "partner 0 ended without an answer");
}

static void partner_answering_bogus_fails_the_round(void **state) {
  (void)state;
  round_fails("bogus", "read -r line\necho bogus\nread -r line\n", GRACE_MS,
              "partner 0 answered 'bogus', not 'ready'");
}

static void partner_error_is_the_reason(void **state) {
  (void)state;
  round_fails("refuses", "read -r line\necho 'error no device here'\n", GRACE_MS,
              "partner 0: no device here");
}

static void partner_answering_no_number_fails_the_round(void **state) {
  (void)state;
  round_fails("late", "read -r line\necho ready\nread -r line\necho 'ns nan-ish'\nread -r line\n",
              GRACE_MS, "partner 0 answered 'ns nan-ish', not 'ns X'");
  round_fails("zero", "read -r line\necho ready\nread -r line\necho 'ns 0'\nread -r line\n",
              GRACE_MS, "partner 0 answered 'ns 0', not 'ns X'");
}

static void silent_partner_fails_the_round_past_its_grace(void **state) {
  (void)state;
  uint64_t t0 = tool_now_ns();
  round_fails("silent", "read -r line\nread -r line\n", 100,
              "no answer from partner 0 within 140 ms");
  double s = (double)(tool_now_ns() - t0) / 1e9;
  assert_true(s >= 0.14);
}

/* A byte every 50 ms: the time is the line's, not each byte's. */
static void trickling_partner_fails_the_round_in_time(void **state) {
  (void)state;
  uint64_t t0 = tool_now_ns();
  round_fails("trickles",
              "read -r line\n"
              "for c in r e a d y r e a d y r e a d y r e a d y r e a d y; do\n"
              "  printf %s $c; sleep 0.05\n"
              "done\n"
              "echo\n",
              100, "no answer from partner 0 within 140 ms");
  double s = (double)(tool_now_ns() - t0) / 1e9;
  if (s >= 1.2)
    fail_msg("the round took %.3f s, the whole trickle", s);
}

static void answer_longer_than_the_buffer_fails_the_round(void **state) {
  (void)state;
  round_fails("long", "read -r line\nprintf '%0400d\\n' 0\nread -r line\n", GRACE_MS,
              "partner 0 answered a line longer than 319 bytes");
  round_fails("long_ns",
              "read -r line\necho ready\nread -r line\nprintf 'ns %0317d\\n' 5\nread -r line\n",
              GRACE_MS, "partner 0 answered a line longer than 319 bytes");
}

static void answer_cut_short_fails_the_round(void **state) {
  (void)state;
  round_fails("cut", "read -r line\nprintf rea\n", GRACE_MS, "partner 0 ended within a line");
}

/* Partner 0 ends without reading: the first line to it finds no one. */
static void partner_gone_before_a_line_fails_the_round(void **state) {
  (void)state;
  int fds = test_fd_count();
  partner("gone", "exit 0\n");
  bench_procs_t bp;
  assert_true(bench_procs_start(&bp, "sim"));
  bp.grace_ms = GRACE_MS;
  for (int i = 0; i < bp.n; i++) { /* ended, left unreaped for stop */
    siginfo_t info;
    assert_int_equal(waitid(P_PID, (id_t)bp.pid[i], &info, WEXITED | WNOWAIT), 0);
  }
  double alone, both[BENCH_PROCS];
  assert_false(bench_procs_round(&bp, SECONDS, &alone, both));
  assert_string_equal(bp.why, "partner 0 is gone (sending 'run': Broken pipe)");
  assert_nothing_left(fds);
}

/* Partner 0 fails its second warm-up, with partner 1 warm and waiting for
 * "go": both end. */
static void first_partner_failing_together_stops_both(void **state) {
  (void)state;
  round_fails("second_run",
              "n=0\n"
              "while read -r line; do\n"
              "  case \"$line\" in\n"
              "  run*) n=$((n + 1))\n"
              "    if [ $n -eq 2 ]; then echo 'error no second window'; exit 1; fi\n"
              "    echo ready ;;\n"
              "  go) echo 'ns 5' ;;\n"
              "  esac\n"
              "done\n",
              GRACE_MS, "partner 0: no second window");
}

/* Partner 0's window alone leaves a mark; the one who sees it on its first
 * "go" is partner 1, which refuses after partner 0 has answered together. */
static void second_partner_failing_together_fails_the_round(void **state) {
  (void)state;
  char body[512];
  snprintf(body, sizeof(body),
           "n=0\n"
           "while read -r line; do\n"
           "  case \"$line\" in\n"
           "  run*) n=$((n + 1)); echo ready ;;\n"
           "  go) if [ $n -eq 1 ] && [ -e '%s/alone' ]; then echo 'error not me'; exit 1; fi\n"
           "    : > '%s/alone'; echo 'ns 5' ;;\n"
           "  esac\n"
           "done\n",
           dir, dir);
  round_fails("second_partner", body, GRACE_MS, "partner 1: not me");
}

/* ---- a partner's side, on a pipe ---- */

typedef struct fake {
  int prepares, windows;
  double seconds;            /* the last prepare's */
  const char *prepare_fails; /* its detail, or NULL */
  const char *window_fails;
} fake_t;

static gca_status_t fake_prepare(void *ctx, double seconds) {
  fake_t *f = ctx;
  f->prepares++;
  f->seconds = seconds;
  if (f->prepare_fails != NULL)
    return tool_error(GCA_ERR_NO_DEVICE, "%s", f->prepare_fails);
  return GCA_OK;
}

static gca_status_t fake_window(void *ctx, double seconds, double *ns) {
  fake_t *f = ctx;
  f->windows++;
  if (f->window_fails != NULL)
    return tool_error(GCA_ERR_DRIVER, "%s", f->window_fails);
  *ns = seconds * 1e3;
  return GCA_OK;
}

static const bench_partner_ops_t fake_ops = {fake_prepare, fake_window};

/* Serves `input` (then end of input) on standard input, its answers from
 * standard output into out; returns the exit status. */
static int serve(fake_t *f, const char *input, char *out, size_t len) {
  int in[2], to[2];
  assert_int_equal(pipe2(in, O_CLOEXEC), 0);
  assert_int_equal(pipe2(to, O_CLOEXEC), 0);
  size_t n = strlen(input); /* less than a pipe holds */
  assert_int_equal(write(in[1], input, n), (ssize_t)n);
  close(in[1]);
  fflush(stdout);
  int saved_in = dup(STDIN_FILENO), saved_out = dup(STDOUT_FILENO);
  assert_true(saved_in >= 0 && saved_out >= 0);
  dup2(in[0], STDIN_FILENO);
  dup2(to[1], STDOUT_FILENO);
  close(in[0]);
  close(to[1]);
  int rc = bench_partner_serve(&fake_ops, f);
  dup2(saved_in, STDIN_FILENO);
  dup2(saved_out, STDOUT_FILENO);
  close(saved_in);
  close(saved_out);
  size_t got = 0;
  for (ssize_t r; got + 1 < len && (r = read(to[0], out + got, len - 1 - got)) > 0;)
    got += (size_t)r;
  out[got] = '\0';
  close(to[0]);
  return rc;
}

static void partner_answers_each_run_and_exits_0_at_end_of_input(void **state) {
  (void)state;
  int fds = test_fd_count();
  fake_t f = {0};
  char out[512];
  assert_int_equal(serve(&f, "run 0.5\ngo\nrun 0.25\ngo\n", out, sizeof(out)), 0);
  assert_string_equal(out, "ready\nns 500\nready\nns 250\n");
  assert_int_equal(f.prepares, 2);
  assert_int_equal(f.windows, 2);
  assert_true(f.seconds == 0.25);
  f = (fake_t){0};
  assert_int_equal(serve(&f, "", out, sizeof(out)), 0);
  assert_string_equal(out, "");
  assert_int_equal(serve(&f, "run 1\n", out, sizeof(out)), 0); /* ended before "go" */
  assert_string_equal(out, "ready\n");
  assert_int_equal(f.windows, 0);
  assert_nothing_left(fds);
}

static void partner_refuses_what_is_not_run_s(void **state) {
  (void)state;
  static const char *const lines[] = {"hello",  "run 61", "run 0", "run -1",
                                      "run 2x", "run ",   "run"};
  int fds = test_fd_count();
  for (size_t i = 0; i < TOOL_ARRAY_SIZE(lines); i++) {
    fake_t f = {0};
    char input[64], want[128], out[512];
    snprintf(input, sizeof(input), "%s\nrun 1\n", lines[i]);
    snprintf(want, sizeof(want), "error expected 'run S', S in (0, 60], got '%s'\n", lines[i]);
    assert_int_equal(serve(&f, input, out, sizeof(out)), 1);
    assert_string_equal(out, want);
    assert_int_equal(f.prepares, 0);
  }
  assert_nothing_left(fds);
}

static void partner_refuses_what_is_not_go(void **state) {
  (void)state;
  fake_t f = {0};
  char out[512];
  assert_int_equal(serve(&f, "run 0.002\nstop\ngo\n", out, sizeof(out)), 1);
  assert_string_equal(out, "ready\nerror expected 'go', got 'stop'\n");
  assert_int_equal(f.windows, 0);
}

static void partner_reports_failed_operations(void **state) {
  (void)state;
  fake_t f = {.prepare_fails = "bench partner: stream_create: no device"};
  char out[512];
  assert_int_equal(serve(&f, "run 1\ngo\n", out, sizeof(out)), 1);
  assert_string_equal(out, "error bench partner: stream_create: no device\n");
  assert_int_equal(f.windows, 0);
  f = (fake_t){.window_fails = "the window broke"};
  assert_int_equal(serve(&f, "run 1\ngo\n", out, sizeof(out)), 1);
  assert_string_equal(out, "ready\nerror the window broke\n");
}

/* An error text longer than a line is cut to one: 318 bytes and a newline. */
static void partner_cuts_a_long_error_to_a_line(void **state) {
  (void)state;
  char detail[600], want[400];
  memset(detail, 'x', sizeof(detail) - 1);
  detail[sizeof(detail) - 1] = '\0';
  snprintf(want, sizeof(want), "error %.*s\n", 318 - 6, detail);
  fake_t f = {.prepare_fails = detail};
  char out[1024];
  assert_int_equal(serve(&f, "run 1\n", out, sizeof(out)), 1);
  assert_string_equal(out, want);
}

/* A line longer than the buffer, or one cut short by the end of input, ends
 * the partner with status 1 and no answer. */
static void partner_exits_1_on_a_broken_line(void **state) {
  (void)state;
  char input[400];
  memset(input, '1', sizeof(input) - 2);
  memcpy(input, "run ", 4);
  input[sizeof(input) - 2] = '\n';
  input[sizeof(input) - 1] = '\0';
  fake_t f = {0};
  char out[512];
  assert_int_equal(serve(&f, input, out, sizeof(out)), 1);
  assert_string_equal(out, "");
  assert_int_equal(serve(&f, "run 1", out, sizeof(out)), 1);
  assert_string_equal(out, "");
  assert_int_equal(f.prepares, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_with_answering_partners_gives_their_figures),
      cmocka_unit_test(answer_of_319_bytes_is_read_whole),
      cmocka_unit_test(partners_start_with_standard_streams_closed),
      cmocka_unit_test(partners_get_the_chosen_backend),
      cmocka_unit_test(missing_partner_program_fails_the_start),
      cmocka_unit_test(partner_program_not_executable_fails_the_start),
      cmocka_unit_test(libc_failures_fail_the_start_and_leave_nothing),
      cmocka_unit_test(partner_that_ends_fails_the_round),
      cmocka_unit_test(partner_answering_bogus_fails_the_round),
      cmocka_unit_test(partner_error_is_the_reason),
      cmocka_unit_test(partner_answering_no_number_fails_the_round),
      cmocka_unit_test(silent_partner_fails_the_round_past_its_grace),
      cmocka_unit_test(trickling_partner_fails_the_round_in_time),
      cmocka_unit_test(answer_longer_than_the_buffer_fails_the_round),
      cmocka_unit_test(answer_cut_short_fails_the_round),
      cmocka_unit_test(partner_gone_before_a_line_fails_the_round),
      cmocka_unit_test(first_partner_failing_together_stops_both),
      cmocka_unit_test(second_partner_failing_together_fails_the_round),
      cmocka_unit_test(partner_answers_each_run_and_exits_0_at_end_of_input),
      cmocka_unit_test(partner_refuses_what_is_not_run_s),
      cmocka_unit_test(partner_refuses_what_is_not_go),
      cmocka_unit_test(partner_reports_failed_operations),
      cmocka_unit_test(partner_cuts_a_long_error_to_a_line),
      cmocka_unit_test(partner_exits_1_on_a_broken_line),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
