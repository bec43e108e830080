/* SPDX-License-Identifier: Apache-2.0 */
/* test_coll_procs.c - sim ranks as separate processes (Note [Sim ranks as
 * processes]): two forked processes, each with its own sim device, form a
 * communicator through the id's socket and run every collective, dtype and
 * reduce op (in-place forms too) with the exact expected results, on counts
 * that fit one staging round and on counts that take several; a rank that
 * never issues, a process that exits, an abort and bad joins end in errors
 * naming the collective or the rank, never in a hang.
 *
 * The parent never starts the library (forking a process that has sim
 * threads would copy them half-way); each child reports through its exit
 * status and a text in memory shared with the parent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_ref.h"
#include "device/child.h"

#define CHUNK ((size_t)64 << 10) /* the smallest staging round: big counts take several */

static report_t *reports; /* one per child, shared with the parent */
static gca_comm_id_t id;

typedef int (*rank_fn)(report_t *r, int rank);

/* Runs fn(rank) in one forked child per entry of ranks[] (at once), and
 * fails the test with the first child's text that fails. */
static void run_ranks(const int *ranks, int n, rank_fn fn) {
  pid_t pid[8];
  memset(reports, 0, 8 * sizeof(report_t));
  fflush(NULL);
  for (int i = 0; i < n; i++) {
    pid[i] = fork();
    assert_true(pid[i] >= 0);
    if (pid[i] == 0)
      _exit(fn(&reports[i], ranks[i]));
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
    _exit(fn(&reports[slot], rank));
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

/* Rank 0 without memory for the shared meeting place: a clear error, its
 * socket given back (the next create of the id works), nothing left over. */
static int no_shared_memory(report_t *rep, int rank) {
  (void)rank;
  gca_comm_options_t o = options(1.0);
  gca_comm_t *c = NULL;
  EXPECT_OK(rep, gca__failpoint_arm("sim_comm_shared", 1));
  EXPECT(rep, gca_comm_create(&id, 1, 0, 0, &o, &c), GCA_ERR_OUT_OF_MEMORY,
         "comm_create: memfd_create: Cannot allocate memory");
  CHECK(rep, c == NULL);
  gca__failpoint_clear();
  EXPECT_OK(rep, gca_comm_create(&id, 1, 0, 0, &o, &c));
  EXPECT_OK(rep, gca_comm_destroy(c));
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
  new_id();
  run_ranks((int[]){0}, 1, no_shared_memory);
}

int main(void) {
  reports =
      mmap(NULL, 8 * sizeof(report_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (reports == MAP_FAILED)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_collective_dtype_and_op_is_exact_on_two_processes),
      cmocka_unit_test(a_rank_whose_process_left_times_out_naming_it),
      cmocka_unit_test(an_abort_in_one_process_fails_the_other),
      cmocka_unit_test(sequences_that_differ_between_processes_are_reported),
      cmocka_unit_test(bad_joins_are_refused_with_the_reason),
      cmocka_unit_test(missing_ranks_are_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
