/* SPDX-License-Identifier: Apache-2.0 */
/* test_coll_procs.c - sim ranks as separate processes (Note [Sim ranks as
 * processes]): two forked processes, each with its own sim device, form a
 * communicator through the id's socket and run every collective, dtype and
 * reduce op (in-place forms too) with the exact expected results, on counts
 * that fit one staging round and on counts that take several; a rank that
 * never issues, a process that exits, an abort and bad joins end in errors
 * naming the collective or the rank, never in a hang.
 *
 * Every failure of joining is forced (fail points, or the process's own
 * limits where the kernel can be made to refuse; a stand-in rank 0 or peer
 * speaking the join's wire format where the other side must misbehave): each
 * rank ends with the status and a message naming what failed, well within
 * its timeout; no descriptor is left open; and the same id then forms a group.
 *
 * The parent never starts the library (forking a process that has sim
 * threads would copy them half-way); each child reports through its exit
 * status and a text in memory shared with the parent. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_ref.h"
#include "device/child.h"

#define CHUNK ((size_t)64 << 10) /* the smallest staging round: big counts take several */

static report_t *reports; /* one per child, shared with the parent */
static int *gates;        /* GATES counters shared by the children of a test */
static gca_comm_id_t id;

#define GATES 4

typedef int (*rank_fn)(report_t *r, int rank);

/* A child's run of fn: a crash ends the child with its signal instead of
 * reaching cmocka's handlers, which would go on with the parent's tests. */
static int in_child(rank_fn fn, report_t *r, int rank) {
  static const int crashes[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGSYS};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(crashes); i++)
    signal(crashes[i], SIG_DFL);
  return fn(r, rank);
}

/* Runs fn(rank) in one forked child per entry of ranks[] (at once), and
 * fails the test with the first child's text that fails. */
static void run_ranks(const int *ranks, int n, rank_fn fn) {
  pid_t pid[8];
  memset(reports, 0, 8 * sizeof(report_t));
  memset(gates, 0, GATES * sizeof(int));
  fflush(NULL);
  for (int i = 0; i < n; i++) {
    pid[i] = fork();
    assert_true(pid[i] >= 0);
    if (pid[i] == 0)
      _exit(in_child(fn, &reports[i], ranks[i]));
  }
  char why[8192] = "";
  for (int i = 0; i < n; i++) {
    int wst = 0;
    assert_int_equal(waitpid(pid[i], &wst, 0), pid[i]);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != CHILD_PASS)
      snprintf(why + strlen(why), sizeof(why) - strlen(why), "[child %d, rank %d, %s %d] %s ", i,
               ranks[i], WIFEXITED(wst) ? "exit" : "signal",
               WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst), reports[i].text);
  }
  if (why[0])
    fail_msg("%s", why);
}

static void new_id(void) {
  assert_int_equal(getrandom(id.bytes, sizeof(id.bytes), 0), 128);
}

static gca_comm_options_t options(double timeout_s) {
  gca_comm_options_t o = GCA_COMM_OPTIONS_INIT;
  o.sim_processes = true;
  o.sim_chunk_bytes = CHUNK;
  o.timeout_s = timeout_s;
  return o;
}

/* ---- every collective, dtype and op ---- */

typedef enum { AG, RS, AR } kind_t;

/* One collective on this rank of n, its output checked against the
 * reference for every element. */
static int one_case(report_t *rep, gca_comm_t *c, gca_stream_t s, int rank, int n, size_t cnt,
                    kind_t k, gca_dtype_t t, gca_reduce_op_t op, bool inplace, void *send,
                    void *recv, unsigned char *host, unsigned char *want) {
  size_t es = gca_dtype_size(t), in_n = k == RS ? (size_t)n * cnt : cnt,
         out_n = k == AG ? (size_t)n * cnt : cnt;
  for (size_t e = 0; e < in_n; e++)
    store(t, host, e, value(t, rank, e, op));
  void *in = send, *out = recv;
  if (inplace) {
    in = k == AG ? (char *)recv + (size_t)rank * cnt * es : recv;
    if (k == RS)
      out = (char *)recv + (size_t)rank * cnt * es;
  }
  EXPECT_OK(rep, gca_memcpy(in, host, in_n * es));
  gca_status_t st = k == AG   ? gca_all_gather(in, out, cnt, t, c, s)
                    : k == RS ? gca_reduce_scatter(in, out, cnt, t, op, c, s)
                              : gca_all_reduce(in, out, cnt, t, op, c, s);
  EXPECT_OK(rep, st);
  EXPECT_OK(rep, gca_stream_synchronize(s));
  EXPECT_OK(rep, gca_comm_async_error(c));
  EXPECT_OK(rep, gca_memcpy(host, out, out_n * es));
  for (size_t e = 0; e < out_n; e++) {
    if (k == AG)
      store(t, want, e, value(t, (int)(e / cnt), e % cnt, op));
    else
      expect_reduced(t, op, n, k == RS ? (size_t)rank * cnt + e : e, want, e);
    if (memcmp(host + e * es, want + e * es, es) != 0)
      return failf(rep, "%zu elements, kind %d dtype %d op %d%s: element %zu differs", cnt, (int)k,
                   (int)t, (int)op, inplace ? " in place" : "", e);
  }
  return CHILD_PASS;
}

static int every_case(report_t *rep, int rank) {
  gca_comm_options_t o = options(30.0);
  gca_comm_t *c = NULL;
  EXPECT_OK(rep, gca_comm_create(&id, 2, rank, 0, &o, &c));
  int nr = 0, me = -1;
  EXPECT_OK(rep, gca_comm_count(c, &nr));
  EXPECT_OK(rep, gca_comm_rank(c, &me));
  CHECK(rep, nr == 2 && me == rank);
  gca_stream_t s = NULL;
  EXPECT_OK(rep, gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  /* 37: one round; 20011: a reduce-scatter of f64 moves 2 x 20011 x 8 bytes
   * a rank, several 64 KiB rounds, with a short last one */
  static const size_t counts[] = {37, 20011};
  size_t biggest = 2 * 20011 * 8;
  void *send = NULL, *recv = NULL;
  unsigned char *host = malloc(biggest), *want = malloc(biggest);
  CHECK(rep, host && want);
  EXPECT_OK(rep, gca_malloc(&send, biggest, s));
  EXPECT_OK(rep, gca_malloc(&recv, biggest, s));
  int cases = 0;
  for (size_t z = 0; z < 2; z++)
    for (int t = GCA_DTYPE_F32; t <= GCA_DTYPE_U8; t++)
      for (int inplace = 0; inplace < 2; inplace++)
        for (int k = AG; k <= AR; k++)
          for (int op = GCA_REDUCE_SUM; op <= (k == AG ? GCA_REDUCE_SUM : GCA_REDUCE_AVG); op++) {
            if (op == GCA_REDUCE_AVG && t > GCA_DTYPE_F64)
              continue;
            int v = one_case(rep, c, s, rank, 2, counts[z], (kind_t)k, (gca_dtype_t)t,
                             (gca_reduce_op_t)op, inplace, send, recv, host, want);
            if (v != CHILD_PASS)
              return v;
            cases++;
          }
  gca_comm_stats_t st = {.size = sizeof(st)};
  EXPECT_OK(rep, gca_comm_stats(c, &st));
  CHECK(rep, st.completed == (uint64_t)cases && st.collectives == (uint64_t)cases);
  EXPECT_OK(rep, gca_free(send));
  EXPECT_OK(rep, gca_free(recv));
  EXPECT_OK(rep, gca_stream_destroy(s));
  EXPECT_OK(rep, gca_comm_destroy(c));
  free(host);
  free(want);
  return CHILD_PASS;
}

static void every_collective_dtype_and_op_is_exact_on_two_processes(void **state) {
  (void)state;
  new_id();
  run_ranks((int[]){0, 1}, 2, every_case);
}

/* ---- failures ---- */

/* Rank 1 joins, then leaves the process without issuing anything; rank 0's
 * all-reduce times out naming rank 1. */
static int issue_alone(report_t *rep, int rank) {
  gca_comm_options_t o = options(rank == 0 ? 0.3 : 30.0);
  gca_comm_t *c = NULL;
  EXPECT_OK(rep, gca_comm_create(&id, 2, rank, 0, &o, &c));
  if (rank == 1)
    _exit(CHILD_PASS); /* gone: no destroy, no collective */
  gca_stream_t s = NULL;
  void *buf = NULL;
  EXPECT_OK(rep, gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  EXPECT_OK(rep, gca_malloc(&buf, 4096, s));
  EXPECT_OK(rep, gca_memset_d8(buf, 0x5a, 4096));
  EXPECT_OK(rep, gca_all_reduce(buf, buf, 1024, GCA_DTYPE_F32, GCA_REDUCE_SUM, c, s));
  EXPECT_OK(rep, gca_stream_synchronize(s)); /* returns: the wait timed out */
  EXPECT(rep, gca_comm_async_error(c), GCA_ERR_INVALID_STATE,
         "all_reduce #0 on rank 0 of 2: all_reduce #0: timed out after 0.3 s waiting for rank(s) "
         "1");
  unsigned char host[4096];
  EXPECT_OK(rep, gca_memcpy(host, buf, sizeof(host)));
  for (size_t i = 0; i < sizeof(host); i++)
    CHECK(rep, host[i] == 0x5a); /* no output written */
  EXPECT(rep, gca_all_reduce(buf, buf, 1024, GCA_DTYPE_F32, GCA_REDUCE_SUM, c, s),
         GCA_ERR_INVALID_STATE, "failed earlier");
  EXPECT_OK(rep, gca_free(buf));
  EXPECT_OK(rep, gca_stream_destroy(s));
  EXPECT_OK(rep, gca_comm_destroy(c));
  return CHILD_PASS;
}

static void a_rank_whose_process_left_times_out_naming_it(void **state) {
  (void)state;
  new_id();
  run_ranks((int[]){0, 1}, 2, issue_alone);
}

/* Rank 1 aborts; rank 0's collective (waiting or not yet issued) fails
 * with the reason, long before its 30 s timeout. */
static int abort_case(report_t *rep, int rank) {
  gca_comm_options_t o = options(30.0);
  gca_comm_t *c = NULL;
  EXPECT_OK(rep, gca_comm_create(&id, 2, rank, 0, &o, &c));
  if (rank == 1) {
    EXPECT_OK(rep, gca_comm_abort(c));
    return CHILD_PASS;
  }
  gca_stream_t s = NULL;
  void *buf = NULL;
  EXPECT_OK(rep, gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  EXPECT_OK(rep, gca_malloc(&buf, 4096, s));
  EXPECT_OK(rep, gca_all_gather(buf, buf, 256, GCA_DTYPE_I32, c, s));
  EXPECT_OK(rep, gca_stream_synchronize(s));
  EXPECT(rep, gca_comm_async_error(c), GCA_ERR_INVALID_STATE,
         "all_gather #0 on rank 0 of 2: rank 1 aborted the communicator");
  EXPECT_OK(rep, gca_free(buf));
  EXPECT_OK(rep, gca_stream_destroy(s));
  EXPECT_OK(rep, gca_comm_destroy(c));
  return CHILD_PASS;
}

static void an_abort_in_one_process_fails_the_other(void **state) {
  (void)state;
  new_id();
  run_ranks((int[]){0, 1}, 2, abort_case);
}

/* Ranks issue different collectives: both report the first difference. */
static int differ_case(report_t *rep, int rank) {
  gca_comm_options_t o = options(30.0);
  gca_comm_t *c = NULL;
  EXPECT_OK(rep, gca_comm_create(&id, 2, rank, 0, &o, &c));
  gca_stream_t s = NULL;
  void *buf = NULL;
  EXPECT_OK(rep, gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  EXPECT_OK(rep, gca_malloc(&buf, 4096, s));
  EXPECT_OK(rep, gca_all_reduce(buf, buf, 100 + (size_t)rank, GCA_DTYPE_I32, GCA_REDUCE_SUM, c, s));
  EXPECT_OK(rep, gca_stream_synchronize(s));
  EXPECT(rep, gca_comm_async_error(c), GCA_ERR_INVALID_STATE,
         "collective #0 differs between ranks (count): rank 0 issued all_reduce of 100 elements");
  EXPECT_OK(rep, gca_free(buf));
  EXPECT_OK(rep, gca_stream_destroy(s));
  EXPECT_OK(rep, gca_comm_destroy(c));
  return CHILD_PASS;
}

static void sequences_that_differ_between_processes_are_reported(void **state) {
  (void)state;
  new_id();
  run_ranks((int[]){0, 1}, 2, differ_case);
}

/* ---- joining ---- */

static pid_t spawn(rank_fn fn, int slot, int rank) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    _exit(in_child(fn, &reports[slot], rank));
  return pid;
}

static int reap(pid_t pid) {
  int wst = 0;
  assert_int_equal(waitpid(pid, &wst, 0), pid);
  assert_true(WIFEXITED(wst));
  return WEXITSTATUS(wst);
}

#define REFUSED 3 /* a child's exit status: its join was refused as expected */

/* A group of three (rank 0 cannot complete without rank 2, so both rank 1s
 * reach it): the second rank 1 is refused with the reason; then rank 2
 * comes and the group forms. */
static int group_of_three(report_t *rep, int rank) {
  gca_comm_options_t o = options(30.0);
  gca_comm_t *c = NULL;
  gca_status_t st = gca_comm_create(&id, 3, rank, 0, &o, &c);
  if (st != GCA_OK) {
    CHECK(rep, rank == 1 && st == GCA_ERR_INVALID_ARGUMENT);
    CHECK(rep, mentions(gca_last_error(), "rank 0 refused: rank 1 of this id has joined already"));
    return REFUSED;
  }
  EXPECT_OK(rep, gca_comm_destroy(c));
  return CHILD_PASS;
}

/* Rank 1 of a group it thinks has three ranks, where rank 0 made two. */
static int wrong_size(report_t *rep, int rank) {
  gca_comm_options_t o = options(30.0);
  gca_comm_t *c = NULL;
  EXPECT(rep, gca_comm_create(&id, 3, rank, 0, &o, &c), GCA_ERR_INVALID_ARGUMENT,
         "rank 0 refused: nranks 3, but rank 0 made a communicator of 2 ranks");
  return REFUSED;
}

static int group_of_two(report_t *rep, int rank) {
  gca_comm_options_t o = options(30.0);
  gca_comm_t *c = NULL;
  EXPECT_OK(rep, gca_comm_create(&id, 2, rank, 0, &o, &c));
  EXPECT_OK(rep, gca_comm_destroy(c));
  return CHILD_PASS;
}

/* The first child of pids[] to end, its exit status in *code. */
static int first_to_end(const pid_t *pids, int n, int *code) {
  int wst = 0;
  pid_t p = wait(&wst);
  assert_true(p > 0 && WIFEXITED(wst));
  *code = WEXITSTATUS(wst);
  for (int i = 0; i < n; i++)
    if (pids[i] == p)
      return i;
  fail_msg("a child that is not ours ended");
  return -1;
}

static void bad_joins_are_refused_with_the_reason(void **state) {
  (void)state;
  memset(reports, 0, 8 * sizeof(report_t));
  /* a rank twice: the gate is the refused one's end (nothing else can end
   * before rank 2 joins) */
  new_id();
  pid_t p[3] = {spawn(group_of_three, 0, 0), spawn(group_of_three, 1, 1),
                spawn(group_of_three, 2, 1)};
  int code = 0, who = first_to_end(p, 3, &code);
  if (code != REFUSED)
    fail_msg("child %d ended first with %d: %s", who, code, reports[who].text);
  assert_true(who == 1 || who == 2);
  pid_t r2 = spawn(group_of_three, 3, 2);
  for (int i = 0; i < 3; i++)
    if (i != who && reap(p[i]) != CHILD_PASS)
      fail_msg("child %d: %s", i, reports[i].text);
  if (reap(r2) != CHILD_PASS)
    fail_msg("rank 2: %s", reports[3].text);
  /* a size that differs: refused; the right rank 1 then completes the group */
  new_id();
  pid_t r0 = spawn(group_of_two, 0, 0), bad = spawn(wrong_size, 1, 1);
  if (reap(bad) != REFUSED)
    fail_msg("the rank of the wrong size: %s", reports[1].text);
  pid_t good = spawn(group_of_two, 2, 1);
  if (reap(good) != CHILD_PASS || reap(r0) != CHILD_PASS)
    fail_msg("rank 1: %s; rank 0: %s", reports[2].text, reports[0].text);
}

static int lonely_rank0(report_t *rep, int rank) {
  (void)rank;
  gca_comm_options_t o = options(0.2);
  gca_comm_t *c = NULL;
  EXPECT(rep, gca_comm_create(&id, 3, 0, 0, &o, &c), GCA_ERR_INVALID_STATE,
         "rank 0 of 3: rank(s) 1, 2 did not join within 0.2 s");
  CHECK(rep, c == NULL);
  /* the socket is free again: a new rank 0 of the same id may listen */
  o.timeout_s = 0.05;
  EXPECT(rep, gca_comm_create(&id, 2, 0, 0, &o, &c), GCA_ERR_INVALID_STATE, "did not join");
  return CHILD_PASS;
}

static int lonely_rank1(report_t *rep, int rank) {
  (void)rank;
  gca_comm_options_t o = options(0.1);
  gca_comm_t *c = NULL;
  EXPECT(rep, gca_comm_create(&id, 2, 1, 0, &o, &c), GCA_ERR_INVALID_STATE,
         "rank 1 of 2: rank 0 is not listening");
  o.sim_chunk_bytes = 1000;
  EXPECT(rep, gca_comm_create(&id, 2, 1, 0, &o, &c), GCA_ERR_INVALID_ARGUMENT,
         "sim_chunk_bytes 1000 is not 64 KiB");
  int devs[2] = {0, 0};
  gca_comm_t *all[2];
  o = options(1.0);
  EXPECT(rep, gca_comm_create_all(2, devs, &o, all), GCA_ERR_INVALID_ARGUMENT,
         "ranks as processes each call gca_comm_create");
  return CHILD_PASS;
}

static void missing_ranks_are_named(void **state) {
  (void)state;
  new_id();
  run_ranks((int[]){0}, 1, lonely_rank0);
  new_id();
  run_ranks((int[]){1}, 1, lonely_rank1);
}

/* ---- every failure of joining, forced ---- */

/* Counts this child in at gate g and waits until n children have come
 * (false after 10 s: a child that failed before its gate). */
static bool pass_gate(int g, int n) {
  __atomic_add_fetch(&gates[g], 1, __ATOMIC_SEQ_CST);
  for (int waited = 0; __atomic_load_n(&gates[g], __ATOMIC_SEQ_CST) < n; waited++) {
    if (waited == 10000)
      return false;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  return true;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Whether detail holds the parts of pattern (separated by '*') in order. */
static bool matches(const char *detail, const char *pattern) {
  const char *at = detail;
  for (const char *p = pattern;;) {
    const char *star = strchr(p, '*');
    size_t n = star ? (size_t)(star - p) : strlen(p);
    char part[256];
    snprintf(part, sizeof(part), "%.*s", (int)n, p);
    const char *hit = strstr(at, part);
    if (!hit)
      return false;
    if (!star)
      return true;
    at = hit + n;
    p = star + 1;
  }
}

/* The descriptors open, the allocator's cache given back first (the sim's
 * device memory is descriptors too). */
static int open_fds(void) {
  return gca_empty_cache() == GCA_OK ? test_fd_count() : -1;
}

/* open_fds() once the sim has started (descriptors of its own that live as
 * long as the process). */
static int settled_fds(void) {
  gca_stream_t s = NULL;
  void *p = NULL;
  if (gca_stream_create(&s, GCA_STREAM_NON_BLOCKING) != GCA_OK)
    return -1;
  bool ok = gca_malloc(&p, 4096, s) == GCA_OK && gca_free(p) == GCA_OK;
  return gca_stream_destroy(s) == GCA_OK && ok ? open_fds() : -1;
}

/* The first collective on c fails with a detail matching `says`. */
static int first_collective_fails(report_t *rep, gca_comm_t *c, const char *says) {
  gca_stream_t s = NULL;
  void *buf = NULL;
  EXPECT_OK(rep, gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  EXPECT_OK(rep, gca_malloc(&buf, 4096, s));
  EXPECT_OK(rep, gca_all_reduce(buf, buf, 1024, GCA_DTYPE_F32, GCA_REDUCE_SUM, c, s));
  EXPECT_OK(rep, gca_stream_synchronize(s));
  gca_status_t st = gca_comm_async_error(c);
  if (st != GCA_ERR_INVALID_STATE || !matches(gca_last_error(), says))
    return failf(rep, "first collective: %s '%s', wanted '%s'", gca_status_name(st),
                 gca_last_error(), says);
  EXPECT_OK(rep, gca_free(buf));
  EXPECT_OK(rep, gca_stream_destroy(s));
  EXPECT_OK(rep, gca_comm_destroy(c));
  return CHILD_PASS;
}

/* A group of n on the id the failure happened on: its socket is free again
 * and the library works; nothing is left open afterwards. */
static int then_the_group_forms(report_t *rep, int rank, int n, int fds) {
  gca_comm_options_t o = options(10.0);
  gca_comm_t *c = NULL;
  EXPECT_OK(rep, gca_comm_create(&id, n, rank, 0, &o, &c));
  EXPECT_OK(rep, gca_comm_destroy(c));
  int now = open_fds();
  if (now != fds)
    return failf(rep, "%d descriptors open after the group, %d before", now, fds);
  return CHILD_PASS;
}

typedef enum { BY_POINT, BY_FILE_SIZE, BY_DESCRIPTORS } force_t;

/* How a failure is forced in one process, and how to undo it. */
typedef struct forced {
  force_t by;
  struct rlimit saved;
  int taken[64], ntaken;
} forced_t;

static bool force(forced_t *f, force_t by, const char *point, unsigned nth) {
  *f = (forced_t){.by = by};
  if (by == BY_POINT)
    return gca__failpoint_arm(point, nth) == GCA_OK;
  if (by == BY_FILE_SIZE) { /* ftruncate past the limit fails with EFBIG */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit low = {4096, 0};
    if (getrlimit(RLIMIT_FSIZE, &f->saved) != 0)
      return false;
    low.rlim_max = f->saved.rlim_max;
    return setrlimit(RLIMIT_FSIZE, &low) == 0;
  }
  /* every descriptor below a lowered limit taken: the next one is EMFILE */
  struct rlimit low = {64, 0};
  if (getrlimit(RLIMIT_NOFILE, &f->saved) != 0)
    return false;
  low.rlim_max = f->saved.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &low) != 0)
    return false;
  for (int d; f->ntaken < 64 && (d = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;)
    f->taken[f->ntaken++] = d;
  return errno == EMFILE;
}

static void unforce(forced_t *f) {
  gca__failpoint_clear();
  if (f->by == BY_FILE_SIZE)
    setrlimit(RLIMIT_FSIZE, &f->saved);
  if (f->by == BY_DESCRIPTORS) {
    for (int i = 0; i < f->ntaken; i++)
      close(f->taken[i]);
    setrlimit(RLIMIT_NOFILE, &f->saved);
  }
}

/* A failure forced in one rank of two while they join: the status and
 * message of that rank's create, and what the other rank sees (its create
 * fails, or it joins and its first collective fails), within its timeout. */
typedef struct join_fault {
  const char *what;
  int rank;
  force_t by;
  const char *point;
  unsigned nth;
  gca_status_t st;
  const char *says;
  double other_timeout;
  gca_status_t other_st; /* GCA_OK: the other joins; its first collective fails */
  const char *other_says, *other_or;
} join_fault_t;

static const join_fault_t *fault; /* the case the children run */

static int join_fault_rank(report_t *rep, int rank) {
  const join_fault_t *f = fault;
  int fds = settled_fds();
  CHECK(rep, fds > 0);
  gca_comm_t *c = NULL;
  char detail[1024];
  if (rank == f->rank) {
    gca_comm_options_t o = options(10.0);
    forced_t fz;
    CHECK(rep, force(&fz, f->by, f->point, f->nth));
    gca_clear_last_error();
    gca_status_t st = gca_comm_create(&id, 2, rank, 0, &o, &c);
    snprintf(detail, sizeof(detail), "%s", gca_last_error());
    unforce(&fz);
    if (st != f->st || !matches(detail, f->says) || c != NULL)
      return failf(rep, "%s: rank %d: %s '%s', wanted %s '%s'", f->what, rank, gca_status_name(st),
                   detail, gca_status_name(f->st), f->says);
  } else {
    gca_comm_options_t o = options(f->other_timeout);
    double t0 = now_s();
    gca_clear_last_error();
    gca_status_t st = gca_comm_create(&id, 2, rank, 0, &o, &c);
    snprintf(detail, sizeof(detail), "%s", gca_last_error());
    if (f->other_st == GCA_OK && st == GCA_OK) {
      int v = first_collective_fails(rep, c, f->other_says);
      if (v != CHILD_PASS)
        return failf(rep, "%s: rank %d: %s", f->what, rank, rep->text);
    } else if (st != f->other_st ||
               !(matches(detail, f->other_says) || (f->other_or && matches(detail, f->other_or))))
      return failf(rep, "%s: rank %d: %s '%s', wanted %s '%s'", f->what, rank, gca_status_name(st),
                   detail, gca_status_name(f->other_st), f->other_says);
    double took = now_s() - t0;
    if (took > f->other_timeout + 5.0)
      return failf(rep, "%s: rank %d took %.1f s to fail, its timeout %.1f s", f->what, rank, took,
                   f->other_timeout);
  }
  int now = open_fds();
  if (now != fds)
    return failf(rep, "%s: rank %d: %d descriptors open after the failure, %d before", f->what,
                 rank, now, fds);
  CHECK(rep, pass_gate(0, 2));
  return then_the_group_forms(rep, rank, 2, fds);
}

#define NOT_LISTENING "rank 1 of 2: rank 0 is not listening (Connection refused) after 0.5 s"
#define HUNG_UP       "rank 1 of 2: rank 0 closed the connection without answering"

static void a_failure_in_rank_0_while_joining_reaches_every_rank(void **state) {
  (void)state;
  static const join_fault_t cases[] = {
      {"socket", 0, BY_DESCRIPTORS, NULL, 0, GCA_ERR_INVALID_STATE,
       "comm_create: rank 0 of 2: socket: Too many open files", 0.5, GCA_ERR_INVALID_STATE,
       NOT_LISTENING, NULL},
      {"bind", 0, BY_POINT, "sim_comm_bind", 1, GCA_ERR_INVALID_STATE,
       "comm_create: rank 0 of this id cannot listen (binding its socket: Cannot allocate memory)",
       0.5, GCA_ERR_INVALID_STATE, NOT_LISTENING, NULL},
      {"listen", 0, BY_POINT, "sim_comm_listen", 1, GCA_ERR_INVALID_STATE,
       "comm_create: rank 0 of 2: listen: No buffer space available", 0.5, GCA_ERR_INVALID_STATE,
       NOT_LISTENING, NULL},
      {"table of ranks", 0, BY_POINT, "sim_comm_peers", 1, GCA_ERR_OUT_OF_MEMORY,
       "comm_create: no host memory for rank 0's table of 2 ranks", 0.5, GCA_ERR_INVALID_STATE,
       NOT_LISTENING, HUNG_UP},
      {"memfd", 0, BY_POINT, "sim_comm_shared", 1, GCA_ERR_OUT_OF_MEMORY,
       "comm_create: memfd_create: Cannot allocate memory", 0.5, GCA_ERR_INVALID_STATE,
       NOT_LISTENING, HUNG_UP},
      {"sizing", 0, BY_FILE_SIZE, NULL, 0, GCA_ERR_OUT_OF_MEMORY,
       "comm_create: sizing * bytes of shared memory: File too large", 0.5, GCA_ERR_INVALID_STATE,
       NOT_LISTENING, HUNG_UP},
      {"header mapping", 0, BY_POINT, "sim_comm_map", 1, GCA_ERR_OUT_OF_MEMORY,
       "comm_create: mapping the header of the shared memory: Cannot allocate memory", 0.5,
       GCA_ERR_INVALID_STATE, NOT_LISTENING, HUNG_UP},
      /* after every rank joined: the others are told why */
      {"mapping", 0, BY_POINT, "sim_comm_map", 2, GCA_ERR_OUT_OF_MEMORY,
       "comm_create: mapping * bytes of shared memory: Cannot allocate memory", 10.0,
       GCA_ERR_OUT_OF_MEMORY,
       "rank 1 of 2: rank 0 refused: mapping * bytes of shared memory: Cannot allocate memory",
       NULL},
      {"view", 0, BY_POINT, "sim_comm_proc", 1, GCA_ERR_OUT_OF_MEMORY,
       "comm_create: no host memory for a view of the shared memory", 10.0, GCA_ERR_OUT_OF_MEMORY,
       "rank 1 of 2: rank 0 refused: no host memory for a view of the shared memory", NULL},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(cases); i++) {
    fault = &cases[i];
    new_id();
    run_ranks((int[]){0, 1}, 2, join_fault_rank);
  }
}

#define RANK_1_MISSING \
  "all_reduce #0 on rank 0 of 2: all_reduce #0: timed out after 1 s waiting for rank(s) 1"

static void a_failure_in_a_peer_while_joining_reaches_every_rank(void **state) {
  (void)state;
  static const join_fault_t cases[] = {
      {"socket", 1, BY_DESCRIPTORS, NULL, 0, GCA_ERR_INVALID_STATE,
       "comm_create: rank 1 of 2: socket: Too many open files", 0.5, GCA_ERR_INVALID_STATE,
       "comm_create: rank 0 of 2: rank(s) 1 did not join within 0.5 s", NULL},
      /* after rank 0 answered: it learns at its first collective */
      {"mapping", 1, BY_POINT, "sim_comm_map", 1, GCA_ERR_OUT_OF_MEMORY,
       "comm_create: mapping * bytes of shared memory: Cannot allocate memory", 1.0, GCA_OK,
       RANK_1_MISSING, NULL},
      {"view", 1, BY_POINT, "sim_comm_proc", 1, GCA_ERR_OUT_OF_MEMORY,
       "comm_create: no host memory for a view of the shared memory", 1.0, GCA_OK, RANK_1_MISSING,
       NULL},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(cases); i++) {
    fault = &cases[i];
    new_id();
    run_ranks((int[]){0, 1}, 2, join_fault_rank);
  }
}

/* ---- stand-ins that speak the join's wire format (sim_proc.c) ---- */

typedef struct wire_hello {
  uint32_t magic;
  int32_t nranks, rank;
  uint32_t pad;
  uint64_t chunk;
} wire_hello_t;

typedef struct wire_reply {
  int32_t status;
  uint32_t pad;
  uint64_t bytes;
  char why[384];
} wire_reply_t;

#define WIRE_HELLO_MAGIC 0x67636831u

/* The id's abstract socket address ("gca-comm-" and 16 bytes in hex). */
static socklen_t id_address(struct sockaddr_un *sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  int at = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "gca-comm-");
  for (int i = 0; i < 16; i++)
    at +=
        snprintf(sa->sun_path + 1 + at, sizeof(sa->sun_path) - 1 - (size_t)at, "%02x", id.bytes[i]);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)at);
}

/* Connects to the id's rank 0 (retrying until it listens, up to 10 s). */
static int connect_to_rank0(void) {
  struct sockaddr_un sa;
  socklen_t len = id_address(&sa);
  for (int tries = 0; tries < 5000; tries++) {
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
      return -1;
    if (connect(s, (struct sockaddr *)&sa, len) == 0)
      return s;
    close(s);
    struct timespec ms = {0, 2000000};
    nanosleep(&ms, NULL);
  }
  return -1;
}

static bool send_answer(int s, const wire_reply_t *r, size_t len, int fd) {
  struct iovec iov = {(void *)r, len};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof(ctl));
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  return sendmsg(s, &msg, MSG_NOSIGNAL) == (ssize_t)len;
}

/* How a stand-in rank 0 answers rank 1's greeting, and what rank 1 says. */
typedef enum { HANG_UP, CUT_SHORT, SILENCE, NO_MEMFD, FOREIGN_MEMFD, EMPTY_MEMFD } lie_t;

typedef struct false_answer {
  lie_t lie;
  double timeout;
  const char *says;
} false_answer_t;

static const false_answer_t *answer; /* the case the children run */

static int false_rank0(report_t *rep) {
  struct sockaddr_un sa;
  socklen_t len = id_address(&sa);
  int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(rep, ls >= 0 && bind(ls, (struct sockaddr *)&sa, len) == 0 && listen(ls, 4) == 0);
  int s = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
  close(ls); /* rank 1's group after the gate meets the real rank 0 */
  wire_hello_t h;
  CHECK(rep, s >= 0 && recv(s, &h, sizeof(h), MSG_WAITALL) == (ssize_t)sizeof(h));
  CHECK(rep, h.magic == WIRE_HELLO_MAGIC && h.nranks == 2 && h.rank == 1);
  wire_reply_t r = {.status = GCA_OK, .bytes = 4096};
  int mfd = -1;
  switch (answer->lie) {
  case HANG_UP:
    break;
  case CUT_SHORT:
    CHECK(rep, send_answer(s, &r, 8, -1));
    break;
  case SILENCE: /* the connection stays open until rank 1 gave up */
    CHECK(rep, pass_gate(0, 2));
    break;
  case NO_MEMFD:
    CHECK(rep, send_answer(s, &r, sizeof(r), -1));
    break;
  case FOREIGN_MEMFD:
  case EMPTY_MEMFD:
    mfd = memfd_create("not-a-group", MFD_CLOEXEC);
    CHECK(rep, mfd >= 0);
    CHECK(rep, answer->lie == EMPTY_MEMFD || ftruncate(mfd, 4096) == 0);
    CHECK(rep, send_answer(s, &r, sizeof(r), mfd));
    close(mfd);
    break;
  }
  close(s);
  if (answer->lie != SILENCE)
    CHECK(rep, pass_gate(0, 2));
  return then_the_group_forms(rep, 0, 2, settled_fds());
}

static int answered_falsely(report_t *rep, int rank) {
  if (rank == 0)
    return false_rank0(rep);
  int fds = settled_fds();
  CHECK(rep, fds > 0);
  gca_comm_options_t o = options(answer->timeout);
  gca_comm_t *c = NULL;
  double t0 = now_s();
  EXPECT(rep, gca_comm_create(&id, 2, 1, 0, &o, &c), GCA_ERR_INVALID_STATE, answer->says);
  CHECK(rep, c == NULL && now_s() - t0 < answer->timeout + 5.0);
  int now = open_fds();
  if (now != fds)
    return failf(rep, "%d descriptors open after the failure, %d before", now, fds);
  CHECK(rep, pass_gate(0, 2));
  return then_the_group_forms(rep, 1, 2, fds);
}

static void a_lost_short_or_false_answer_from_rank_0_is_named(void **state) {
  (void)state;
  static const false_answer_t cases[] = {
      {HANG_UP, 10.0,
       "rank 1 of 2: rank 0 closed the connection without answering (end of stream)"},
      {CUT_SHORT, 10.0, "rank 1 of 2: rank 0's answer was cut short (8 of 400 bytes)"},
      {SILENCE, 0.3, "rank 1 of 2: no answer from rank 0 within 0.3 s"},
      {NO_MEMFD, 10.0, "rank 1 of 2: rank 0 sent no shared memory"},
      {FOREIGN_MEMFD, 10.0,
       "comm_create: the shared memory is not a group's (it does not start with a group's "
       "header)"},
      /* mapped unchecked, its first touch would be SIGBUS */
      {EMPTY_MEMFD, 10.0,
       "comm_create: the shared memory is not a group's (4096 bytes announced, 0 in it)"},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(cases); i++) {
    answer = &cases[i];
    new_id();
    run_ranks((int[]){0, 1}, 2, answered_falsely);
  }
}

/* Rank 0 of two; the other child first greets it with garbage (refused with
 * the reason, the group still waits), then tries to be a second rank 0 and a
 * rank 1 of another chunk size (both refused), then joins as rank 1. */
static int stranger_then_rank1(report_t *rep, int rank) {
  int fds = settled_fds();
  CHECK(rep, fds > 0);
  gca_comm_options_t o = options(10.0);
  gca_comm_t *c = NULL;
  if (rank == 0) {
    EXPECT_OK(rep, gca_comm_create(&id, 2, 0, 0, &o, &c));
    EXPECT_OK(rep, gca_comm_destroy(c));
    CHECK(rep, open_fds() == fds);
    return CHILD_PASS;
  }
  int s = connect_to_rank0();
  CHECK(rep, s >= 0);
  unsigned char garbage[sizeof(wire_hello_t)];
  memset(garbage, 0xab, sizeof(garbage));
  wire_reply_t r;
  CHECK(rep, send(s, garbage, sizeof(garbage), MSG_NOSIGNAL) == (ssize_t)sizeof(garbage));
  CHECK(rep, recv(s, &r, sizeof(r), MSG_WAITALL) == (ssize_t)sizeof(r));
  close(s);
  CHECK(rep, r.status == GCA_ERR_INVALID_ARGUMENT &&
                 strcmp(r.why, "rank 0 got no greeting it understands") == 0);
  EXPECT(rep, gca_comm_create(&id, 2, 0, 0, &o, &c), GCA_ERR_INVALID_ARGUMENT,
         "comm_create: rank 0 of this id has joined already (binding its socket: Address already "
         "in use)");
  o.sim_chunk_bytes = 2 * CHUNK;
  EXPECT(rep, gca_comm_create(&id, 2, 1, 0, &o, &c), GCA_ERR_INVALID_ARGUMENT,
         "rank 1 of 2: rank 0 refused: sim_chunk_bytes 131072, but rank 0 has 65536");
  CHECK(rep, c == NULL && open_fds() == fds);
  return then_the_group_forms(rep, 1, 2, fds);
}

static void a_stranger_a_second_rank_0_and_another_chunk_are_refused(void **state) {
  (void)state;
  new_id();
  run_ranks((int[]){0, 1}, 2, stranger_then_rank1);
}

static int leaver; /* the rank of three that greets rank 0 and leaves */

/* Rank 0 answers rank 1 before rank 2: a leaving rank 2 breaks the meeting
 * rank 1 was answered into, a leaving rank 1 gets rank 2 refused. */
static int one_leaves(report_t *rep, int rank) {
  int fds = settled_fds();
  CHECK(rep, fds > 0);
  gca_comm_options_t o = options(30.0); /* none of the failures below is a timeout */
  gca_comm_t *c = NULL;
  char says[160];
  double t0 = now_s();
  if (rank == leaver) {
    int s = connect_to_rank0();
    wire_hello_t h = {WIRE_HELLO_MAGIC, 3, rank, 0, CHUNK};
    CHECK(rep, s >= 0 && send(s, &h, sizeof(h), MSG_NOSIGNAL) == (ssize_t)sizeof(h));
    close(s);
    CHECK(rep, pass_gate(0, 2)); /* gone before the last rank comes */
  } else if (rank == 0) {
    snprintf(says, sizeof(says), "comm_create: rank %d left before the group formed", leaver);
    EXPECT(rep, gca_comm_create(&id, 3, 0, 0, &o, &c), GCA_ERR_INVALID_STATE, says);
    CHECK(rep, c == NULL);
  } else {
    CHECK(rep, pass_gate(0, 2));
    if (rank == 1) {
      EXPECT_OK(rep, gca_comm_create(&id, 3, 1, 0, &o, &c));
      int v = first_collective_fails(
          rep, c, "all_reduce #0 on rank 1 of 3: rank 2 left before the group formed");
      if (v != CHILD_PASS)
        return v;
    } else {
      EXPECT(rep, gca_comm_create(&id, 3, 2, 0, &o, &c), GCA_ERR_INVALID_STATE,
             "rank 2 of 3: rank 0 refused: rank 1 left before the group formed");
    }
  }
  CHECK(rep, now_s() - t0 < 10.0);
  CHECK(rep, open_fds() == fds);
  CHECK(rep, pass_gate(1, 3));
  return then_the_group_forms(rep, rank, 3, fds);
}

static void a_rank_that_leaves_before_its_answer_fails_the_group(void **state) {
  (void)state;
  for (leaver = 2; leaver >= 1; leaver--) {
    new_id();
    run_ranks((int[]){0, 1, 2}, 3, one_leaves);
  }
}

int main(void) {
  reports =
      mmap(NULL, 8 * sizeof(report_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  gates =
      mmap(NULL, GATES * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (reports == MAP_FAILED || gates == MAP_FAILED)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_collective_dtype_and_op_is_exact_on_two_processes),
      cmocka_unit_test(a_rank_whose_process_left_times_out_naming_it),
      cmocka_unit_test(an_abort_in_one_process_fails_the_other),
      cmocka_unit_test(sequences_that_differ_between_processes_are_reported),
      cmocka_unit_test(bad_joins_are_refused_with_the_reason),
      cmocka_unit_test(missing_ranks_are_named),
      cmocka_unit_test(a_failure_in_rank_0_while_joining_reaches_every_rank),
      cmocka_unit_test(a_failure_in_a_peer_while_joining_reaches_every_rank),
      cmocka_unit_test(a_lost_short_or_false_answer_from_rank_0_is_named),
      cmocka_unit_test(a_stranger_a_second_rank_0_and_another_chunk_are_refused),
      cmocka_unit_test(a_rank_that_leaves_before_its_answer_fails_the_group),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
