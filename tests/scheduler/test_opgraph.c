/* SPDX-License-Identifier: Apache-2.0 */
/* test_opgraph.c - op graphs: loading and validation (every error names the
 * op or buffer), the memory estimator on hand-made graphs whose peaks are
 * worked out in the comments, the time model, and the order checker catching
 * each rule's violation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gca.h"
#include "support.h"

#define MB 1048576ll

static gca_opgraph_t *load(const char *json) {
  gca_opgraph_t *g = NULL;
  gca_status_t st = gca_opgraph_load_json(json, strlen(json), &g);
  if (st != GCA_OK)
    fail_msg("loading failed: %s: %s\n%s", gca_status_name(st), gca_last_error(), json);
  return g;
}

static void expect_load_error(const char *json, gca_status_t want, const char *needle) {
  gca_opgraph_t *g = NULL;
  gca_clear_last_error();
  gca_status_t st = gca_opgraph_load_json(json, strlen(json), &g);
  if (st != want)
    fail_msg("wanted %s, got %s (%s) for:\n%s", gca_status_name(want), gca_status_name(st),
             gca_last_error(), json);
  if (!strstr(gca_last_error(), needle))
    fail_msg("error '%s' does not mention '%s'", gca_last_error(), needle);
  assert_null(g);
}

static gca_schedule_figures_t program_figures(gca_opgraph_t *g, int64_t *live) {
  size_t n = gca_opgraph_op_count(g);
  size_t *order = malloc((n + 1) * sizeof(size_t));
  assert_non_null(order);
  assert_ok(gca_opgraph_program_order(g, order));
  gca_schedule_figures_t f = {.size = sizeof(f)};
  assert_ok(gca_opgraph_estimate(g, order, n, &f, live));
  free(order);
  return f;
}

#define HDR "{\"format\": \"gca-opgraph/1\", \"comms\": [\"dp\"], "

/* ---- the estimator ---- */

/* in (input, 1 MB) is live throughout. a (4 MB) written by op0, read through
 * its view a_v by op1, which writes b (2 MB); a dies after op1; op2 reads b.
 * live after allocations: op0 1+4=5, op1 5+2=7 (a still live: op1 uses it),
 * op2 1+2=3. Peak 7 MB at step 1. */
static void views_keep_their_storage_alive(void **state) {
  (void)state;
  gca_opgraph_t *g =
      load(HDR "\"buffers\": [{\"name\": \"in\", \"bytes\": 1048576, \"kind\": \"input\"},"
               "{\"name\": \"a\", \"bytes\": 4194304}, {\"name\": \"a_v\", \"alias_of\": \"a\"},"
               "{\"name\": \"b\", \"bytes\": 2097152}, {\"name\": \"out\", \"bytes\": 0, \"kind\": "
               "\"output\"}],"
               "\"ops\": [{\"name\": \"op0\", \"kind\": \"compute\", \"us\": 1, \"reads\": "
               "[\"in\"], \"writes\": [\"a\"]},"
               "{\"name\": \"op1\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"a_v\"], "
               "\"writes\": [\"b\"]},"
               "{\"name\": \"op2\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"b\"], "
               "\"writes\": [\"out\"]}]}");
  int64_t live[3];
  gca_schedule_figures_t f = program_figures(g, live);
  assert_int_equal(live[0], 5 * MB);
  assert_int_equal(live[1], 7 * MB);
  assert_int_equal(live[2], 3 * MB);
  assert_int_equal(f.peak_bytes, 7 * MB);
  assert_int_equal(f.peak_step, 1);
  gca_opgraph_destroy(g);
}

/* h0 (8 MB) written by mk; m1 mutates h0 -> h1, m2 mutates h1 -> h2 (renames,
 * no bytes); use reads h2 and writes r (1 MB). h0's storage is live from mk
 * until use: live mk 8, m1 8, m2 8, use 9. Peak 9 MB. */
static void a_chain_of_mutations_is_one_storage(void **state) {
  (void)state;
  gca_opgraph_t *g = load(
      HDR "\"buffers\": [{\"name\": \"h0\", \"bytes\": 8388608}, {\"name\": \"h1\", \"alias_of\": "
          "\"h0\"},"
          "{\"name\": \"h2\", \"alias_of\": \"h1\"}, {\"name\": \"r\", \"bytes\": 1048576, "
          "\"kind\": \"output\"}],"
          "\"ops\": [{\"name\": \"mk\", \"kind\": \"compute\", \"us\": 1, \"writes\": [\"h0\"]},"
          "{\"name\": \"m1\", \"kind\": \"compute\", \"us\": 1, \"mutates\": {\"h0\": \"h1\"}},"
          "{\"name\": \"m2\", \"kind\": \"compute\", \"us\": 1, \"mutates\": {\"h1\": \"h2\"}},"
          "{\"name\": \"use\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"h2\"], \"writes\": "
          "[\"r\"]}]}");
  int64_t live[4];
  gca_schedule_figures_t f = program_figures(g, live);
  assert_int_equal(live[0], 8 * MB);
  assert_int_equal(live[1], 8 * MB);
  assert_int_equal(live[2], 8 * MB);
  assert_int_equal(live[3], 9 * MB);
  assert_int_equal(f.peak_bytes, 9 * MB);
  /* the mutation must follow the readers of the old version */
  size_t order[4] = {0, 2, 1, 3};
  assert_status(gca_opgraph_check_order(g, order, 4), GCA_ERR_INVALID_ARGUMENT, "'m2'");
  gca_opgraph_destroy(g);
}

/* One 16 MB buffer viewed as two halves q0 and q1 (views), each mutated by
 * its own op into q0b, q1b; then both read by fin (writes out, 2 MB, output).
 * One storage: 16 MB from mk to fin. live: 16, 16, 16, 18; peak 18 MB. */
static void non_overlapping_views_all_mutated_share_one_storage(void **state) {
  (void)state;
  gca_opgraph_t *g = load(
      HDR "\"buffers\": [{\"name\": \"big\", \"bytes\": 16777216},"
          "{\"name\": \"q0\", \"alias_of\": \"big\"}, {\"name\": \"q1\", \"alias_of\": \"big\"},"
          "{\"name\": \"q0b\", \"alias_of\": \"q0\"}, {\"name\": \"q1b\", \"alias_of\": \"q1\"},"
          "{\"name\": \"out\", \"bytes\": 2097152, \"kind\": \"output\"}],"
          "\"ops\": [{\"name\": \"mk\", \"kind\": \"compute\", \"us\": 1, \"writes\": [\"big\"]},"
          "{\"name\": \"mu0\", \"kind\": \"compute\", \"us\": 1, \"mutates\": {\"q0\": \"q0b\"}},"
          "{\"name\": \"mu1\", \"kind\": \"compute\", \"us\": 1, \"mutates\": {\"q1\": \"q1b\"}},"
          "{\"name\": \"fin\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"q0b\", \"q1b\"], "
          "\"writes\": [\"out\"]}]}");
  int64_t live[4];
  gca_schedule_figures_t f = program_figures(g, live);
  assert_int_equal(live[0], 16 * MB);
  assert_int_equal(live[1], 16 * MB);
  assert_int_equal(live[2], 16 * MB);
  assert_int_equal(live[3], 18 * MB);
  assert_int_equal(f.peak_bytes, 18 * MB);
  gca_opgraph_destroy(g);
}

/* split writes two outputs at once (3 MB and 5 MB); a reads the first (writes
 * x 1 MB), b the second (writes y 1 MB); the halves die after their readers.
 * live: split 8, a 9, b 1+... : after a, the 3 MB half dies -> 6 live, b adds
 * 1 -> 7. Peak 9 MB. */
static void multi_output_ops_allocate_every_output(void **state) {
  (void)state;
  gca_opgraph_t *g = load(
      HDR
      "\"buffers\": [{\"name\": \"p\", \"bytes\": 3145728}, {\"name\": \"q\", \"bytes\": 5242880},"
      "{\"name\": \"x\", \"bytes\": 1048576, \"kind\": \"output\"},"
      "{\"name\": \"y\", \"bytes\": 1048576, \"kind\": \"output\"}],"
      "\"ops\": [{\"name\": \"split\", \"kind\": \"compute\", \"us\": 1, \"writes\": [\"p\", "
      "\"q\"]},"
      "{\"name\": \"a\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"p\"], \"writes\": "
      "[\"x\"]},"
      "{\"name\": \"b\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"q\"], \"writes\": "
      "[\"y\"]}]}");
  int64_t live[3];
  gca_schedule_figures_t f = program_figures(g, live);
  assert_int_equal(live[0], 8 * MB);
  assert_int_equal(live[1], 9 * MB);
  assert_int_equal(live[2], 7 * MB);
  assert_int_equal(f.peak_bytes, 9 * MB);
  gca_opgraph_destroy(g);
}

/* ag reads in (2 MB temp, written by ci) and writes full (8 MB); its inputs
 * and outputs stay live until ag_wait, even though nothing else reads in.
 * c1 (between ag and its wait) writes t (4 MB, read by c2). live: ci 2,
 * ag 10, c1 14, ag_wait 14, use 8+1=... in dies at ag_wait: use 8+1 = 9.
 * Time: ci 1 us, ag starts at 1 and runs 50 us (ends 51), c1 runs 10 us (to
 * 11), the wait stalls 40 us, use 5 us: makespan 56, exposed 40. */
static void a_collective_holds_its_buffers_until_its_wait(void **state) {
  (void)state;
  gca_opgraph_t *g = load(
      HDR "\"buffers\": [{\"name\": \"in\", \"bytes\": 2097152}, {\"name\": \"full\", \"bytes\": "
          "8388608},"
          "{\"name\": \"t\", \"bytes\": 4194304}, {\"name\": \"o\", \"bytes\": 1048576, \"kind\": "
          "\"output\"}],"
          "\"ops\": [{\"name\": \"ci\", \"kind\": \"compute\", \"us\": 1, \"writes\": [\"in\"]},"
          "{\"name\": \"ag\", \"kind\": \"collective\", \"collective\": \"all_gather\", \"comm\": "
          "\"dp\", \"us\": 50, \"reads\": [\"in\"], \"writes\": [\"full\"]},"
          "{\"name\": \"c1\", \"kind\": \"compute\", \"us\": 10, \"writes\": [\"t\"]},"
          "{\"name\": \"ag_wait\", \"kind\": \"wait\", \"waits\": \"ag\"},"
          "{\"name\": \"use\", \"kind\": \"compute\", \"us\": 5, \"reads\": [\"full\", \"t\"], "
          "\"writes\": [\"o\"]}]}");
  int64_t live[5];
  gca_schedule_figures_t f = program_figures(g, live);
  assert_int_equal(live[0], 2 * MB);
  assert_int_equal(live[1], 10 * MB);
  assert_int_equal(live[2], 14 * MB);
  assert_int_equal(live[3], 14 * MB);
  assert_int_equal(live[4], 13 * MB); /* in died at the wait: full 8 + t 4 + o 1 */
  assert_int_equal(f.peak_bytes, 14 * MB);
  assert_true(f.makespan_us > 55.999 && f.makespan_us < 56.001);
  assert_true(f.exposed_comm_us > 39.999 && f.exposed_comm_us < 40.001);
  assert_int_equal(f.collectives_total, 1);
  assert_int_equal(f.collectives_hidden, 0);
  gca_opgraph_destroy(g);
}

/* ---- the checker ---- */

static void checker_reports_each_broken_rule_by_name(void **state) {
  (void)state;
  gca_opgraph_t *g = load(
      HDR
      "\"buffers\": [{\"name\": \"in\", \"bytes\": 1, \"kind\": \"input\"}, {\"name\": \"ci_out\", "
      "\"bytes\": 1},"
      "{\"name\": \"full\", \"bytes\": 4}, {\"name\": \"y\", \"bytes\": 1, \"kind\": \"output\"}],"
      "\"ops\": [{\"name\": \"ci\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"in\"], "
      "\"writes\": [\"ci_out\"]},"
      "{\"name\": \"ag\", \"kind\": \"collective\", \"collective\": \"all_gather\", \"comm\": "
      "\"dp\", \"us\": 5, \"reads\": [\"ci_out\"], \"writes\": [\"full\"]},"
      "{\"name\": \"w\", \"kind\": \"wait\", \"waits\": \"ag\"},"
      "{\"name\": \"z\", \"kind\": \"compute\", \"us\": 1},"
      "{\"name\": \"use\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"full\"], \"writes\": "
      "[\"y\"]}],"
      "\"groups\": [[\"ci\", \"ag\"]], \"order_after\": [[\"z\", \"w\"]]}");
  size_t ok[5] = {0, 1, 2, 3, 4};
  assert_ok(gca_opgraph_check_order(g, ok, 5));
  size_t use_early[5] = {0, 1, 4, 2, 3};
  assert_status(gca_opgraph_check_order(g, use_early, 5), GCA_ERR_INVALID_ARGUMENT,
                "op 'use' (step 2) reads 'full' before 'w'");
  size_t wait_first[5] = {2, 0, 1, 3, 4};
  assert_status(gca_opgraph_check_order(g, wait_first, 5), GCA_ERR_INVALID_ARGUMENT,
                "wait 'w' (step 0) comes before 'ag'");
  size_t split[5] = {0, 3, 1, 2, 4};
  assert_status(gca_opgraph_check_order(g, split, 5), GCA_ERR_INVALID_ARGUMENT, "not contiguous");
  size_t after[5] = {3, 0, 1, 2, 4};
  assert_status(gca_opgraph_check_order(g, after, 5), GCA_ERR_INVALID_ARGUMENT, "order_after");
  size_t dup[5] = {0, 1, 2, 2, 4};
  assert_status(gca_opgraph_check_order(g, dup, 5), GCA_ERR_INVALID_ARGUMENT, "appears twice");
  size_t range[5] = {0, 1, 2, 3, 9};
  assert_status(gca_opgraph_check_order(g, range, 5), GCA_ERR_INVALID_ARGUMENT, "op 9");
  assert_status(gca_opgraph_check_order(g, ok, 4), GCA_ERR_INVALID_ARGUMENT, "4 entries");
  gca_opgraph_destroy(g);
}

/* ---- bad input ---- */

#define B1   "\"buffers\": [{\"name\": \"a\", \"bytes\": 4}],"
#define OP_A "{\"name\": \"w\", \"kind\": \"compute\", \"us\": 1, \"writes\": [\"a\"]}"

static void bad_graphs_are_refused_naming_what_is_wrong(void **state) {
  (void)state;
  expect_load_error("{\"format\": \"gca-opgraph/1\", ", GCA_ERR_PARSE, "offset");
  expect_load_error("[1, 2", GCA_ERR_PARSE, "expected ',' or ']'");
  expect_load_error("{\"format\": \"gca-opgraph/2\", \"buffers\": [], \"ops\": []}",
                    GCA_ERR_INVALID_ARGUMENT, "gca-opgraph/1");
  expect_load_error(HDR B1 "\"ops\": [], \"extra\": 1}", GCA_ERR_INVALID_ARGUMENT,
                    "unknown top-level field 'extra'");
  expect_load_error(HDR "\"buffers\": [{\"name\": \"a\", \"bytes\": 4, \"size\": 2}], \"ops\": []}",
                    GCA_ERR_INVALID_ARGUMENT, "buffer 'a': unknown field 'size'");
  expect_load_error(HDR B1 "\"ops\": [{\"name\": \"w\", \"kind\": \"compute\", \"us\": 1, "
                           "\"writes\": [\"a\"], \"flops\": 3}]}",
                    GCA_ERR_INVALID_ARGUMENT, "op 'w': unknown field 'flops'");
  expect_load_error(HDR "\"buffers\": [{\"name\": \"a\", \"bytes\": -4}], \"ops\": []}",
                    GCA_ERR_INVALID_ARGUMENT, "buffer 'a' has a negative size");
  expect_load_error(HDR "\"buffers\": [{\"name\": \"a\", \"bytes\": 4}, {\"name\": \"a\", "
                        "\"bytes\": 4}], \"ops\": []}",
                    GCA_ERR_INVALID_ARGUMENT, "buffer 'a' is declared twice");
  expect_load_error(HDR "\"buffers\": [{\"name\": \"v\", \"alias_of\": \"u\"}, {\"name\": \"u\", "
                        "\"alias_of\": \"v\"}], \"ops\": []}",
                    GCA_ERR_INVALID_ARGUMENT, "cycle");
  expect_load_error(HDR "\"buffers\": [{\"name\": \"v\", \"alias_of\": \"nope\"}], \"ops\": []}",
                    GCA_ERR_INVALID_ARGUMENT, "view of unknown buffer 'nope'");
  expect_load_error(
      HDR B1 "\"ops\": [{\"name\": \"r\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"b\"]}]}",
      GCA_ERR_INVALID_ARGUMENT, "op 'r' reads unknown buffer 'b'");
  expect_load_error(
      HDR B1 "\"ops\": [{\"name\": \"r\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"a\"]}]}",
      GCA_ERR_INVALID_ARGUMENT, "op 'r' reads 'a', which nothing writes");
  expect_load_error(HDR B1 "\"ops\": [" OP_A
                           ", {\"name\": \"ww\", \"kind\": \"wait\", \"waits\": \"w\"}]}",
                    GCA_ERR_INVALID_ARGUMENT, "wait 'ww' waits for 'w', which is not a collective");
  expect_load_error(HDR B1
                    "\"ops\": [{\"name\": \"ww\", \"kind\": \"wait\", \"waits\": \"ghost\"}]}",
                    GCA_ERR_INVALID_ARGUMENT, "wait 'ww' waits for unknown op 'ghost'");
  expect_load_error(
      HDR B1
      "\"ops\": [{\"name\": \"c\", \"kind\": \"collective\", \"collective\": \"all_reduce\", "
      "\"comm\": \"dp\", \"us\": 1, \"writes\": [\"a\"]}]}",
      GCA_ERR_INVALID_ARGUMENT, "collective 'c' has no wait");
  expect_load_error(
      HDR B1
      "\"ops\": [{\"name\": \"c\", \"kind\": \"collective\", \"collective\": \"all_reduce\", "
      "\"comm\": \"tp\", \"us\": 1, \"writes\": [\"a\"]}, "
      "{\"name\": \"cw\", \"kind\": \"wait\", \"waits\": \"c\"}]}",
      GCA_ERR_INVALID_ARGUMENT, "unknown communicator 'tp'");
  expect_load_error(HDR B1 "\"ops\": [" OP_A ", " OP_A "]}", GCA_ERR_INVALID_ARGUMENT,
                    "op 'w' is declared twice");
  /* a dependency cycle: x reads what y writes and y reads what x writes */
  expect_load_error(
      HDR "\"buffers\": [{\"name\": \"p\", \"bytes\": 1}, {\"name\": \"q\", \"bytes\": 1}],"
          "\"ops\": [{\"name\": \"x\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"q\"], "
          "\"writes\": [\"p\"]},"
          "{\"name\": \"y\", \"kind\": \"compute\", \"us\": 1, \"reads\": [\"p\"], \"writes\": "
          "[\"q\"]}]}",
      GCA_ERR_INVALID_ARGUMENT, "op 'x' (step 0) reads 'q' before 'y' (step 1)");
  expect_load_error(HDR B1 "\"ops\": [" OP_A "], \"groups\": [[\"w\", \"nope\"]]}",
                    GCA_ERR_INVALID_ARGUMENT, "group 0 names unknown op 'nope'");
  expect_load_error(HDR B1 "\"ops\": [" OP_A "], \"order_after\": [[\"w\"]]}",
                    GCA_ERR_INVALID_ARGUMENT, "[later, earlier]");
  expect_load_error(
      HDR "\"buffers\": [{\"name\": \"in\", \"bytes\": 1, \"kind\": \"input\"}],"
          "\"ops\": [{\"name\": \"w\", \"kind\": \"compute\", \"us\": 1, \"writes\": [\"in\"]}]}",
      GCA_ERR_INVALID_ARGUMENT, "inputs are never written");
  expect_load_error(
      HDR B1
      "\"ops\": [{\"name\": \"w\", \"kind\": \"compute\", \"us\": -1, \"writes\": [\"a\"]}]}",
      GCA_ERR_INVALID_ARGUMENT, "bad duration");
  expect_load_error(
      HDR "\"buffers\": [{\"name\": \"a\", \"bytes\": 4}, {\"name\": \"b\", \"bytes\": 4}],"
          "\"ops\": [" OP_A
          ", {\"name\": \"m\", \"kind\": \"compute\", \"us\": 1, \"mutates\": {\"a\": \"b\"}}]}",
      GCA_ERR_INVALID_ARGUMENT, "not another name of its storage");
}

static void api_misuse_is_a_clear_status(void **state) {
  (void)state;
  gca_opgraph_t *g = NULL;
  assert_status(gca_opgraph_create(NULL), GCA_ERR_INVALID_ARGUMENT, "NULL");
  assert_ok(gca_opgraph_create(&g));
  size_t order[1] = {0};
  gca_schedule_figures_t f = {.size = sizeof(f)};
  assert_status(gca_opgraph_estimate(g, order, 0, &f, NULL), GCA_ERR_INVALID_STATE, "not finished");
  assert_status(gca_opgraph_add_buffer(g, "", 1, GCA_BUFFER_TEMP), GCA_ERR_INVALID_ARGUMENT,
                "no name");
  assert_status(gca_opgraph_add_op(g, NULL), GCA_ERR_INVALID_ARGUMENT, "desc");
  assert_ok(gca_opgraph_finish(g));
  assert_status(gca_opgraph_add_buffer(g, "a", 1, GCA_BUFFER_TEMP), GCA_ERR_INVALID_STATE,
                "finished");
  assert_ok(gca_opgraph_estimate(g, order, 0, &f, NULL));
  assert_int_equal(f.peak_bytes, 0);
  gca_opgraph_destroy(g);
}

/* mk writes a; c (all_reduce on dp) reads a into v, a view of "late"; c_wait. */
static gca_opgraph_t *three_ops(void) {
  gca_opgraph_t *g = NULL;
  static const char *const a[] = {"a"}, *const v[] = {"v"};
  assert_ok(gca_opgraph_create(&g));
  assert_ok(gca_opgraph_add_comm(g, "dp"));
  assert_ok(gca_opgraph_add_buffer(g, "a", 64, GCA_BUFFER_TEMP));
  assert_ok(gca_opgraph_add_view(g, "v", "late"));
  gca_op_desc_t d = GCA_OP_DESC_INIT;
  d.name = "mk";
  d.writes = a;
  d.nwrites = 1;
  assert_ok(gca_opgraph_add_op(g, &d));
  d = (gca_op_desc_t)GCA_OP_DESC_INIT;
  d.name = "c";
  d.kind = GCA_OP_COLLECTIVE;
  d.collective = "all_reduce";
  d.comm = "dp";
  d.reads = a;
  d.nreads = 1;
  d.writes = v;
  d.nwrites = 1;
  assert_ok(gca_opgraph_add_op(g, &d));
  d = (gca_op_desc_t)GCA_OP_DESC_INIT;
  d.name = "c_wait";
  d.kind = GCA_OP_WAIT;
  d.waits = "c";
  assert_ok(gca_opgraph_add_op(g, &d));
  return g;
}

/* A finish that fails leaves the graph as added: once the caller adds what
 * was missing it finishes, with each wait and maker found once (not "two
 * waits"), and groups added after a failed finish are the graph's own. */
static void a_failed_finish_can_be_finished_again(void **state) {
  (void)state;
  static const char *const split[] = {"mk", "c_wait"}, *const pair[] = {"c", "c_wait"};
  gca_opgraph_t *g = three_ops();
  assert_status(gca_opgraph_finish(g), GCA_ERR_INVALID_ARGUMENT, "unknown buffer 'late'");
  assert_ok(gca_opgraph_add_buffer(g, "late", 64, GCA_BUFFER_TEMP));
  assert_ok(gca_opgraph_add_group(g, split, 2)); /* c lies between them */
  assert_status(gca_opgraph_finish(g), GCA_ERR_INVALID_ARGUMENT, "not a valid schedule");
  assert_ok(gca_opgraph_add_group(g, pair, 2));
  gca_opgraph_destroy(g); /* every group freed once, none read past the end */

  g = three_ops();
  assert_status(gca_opgraph_finish(g), GCA_ERR_INVALID_ARGUMENT, "unknown buffer 'late'");
  assert_ok(gca_opgraph_add_buffer(g, "late", 64, GCA_BUFFER_TEMP));
  assert_ok(gca_opgraph_add_group(g, pair, 2));
  assert_ok(gca_opgraph_finish(g));
  size_t order[3] = {0, 1, 2};
  assert_ok(gca_opgraph_check_order(g, order, 3));
  gca_schedule_figures_t f = {.size = sizeof(f)};
  assert_ok(gca_opgraph_estimate(g, order, 3, &f, NULL));
  assert_int_equal(f.peak_bytes, 128);
  gca_opgraph_destroy(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(views_keep_their_storage_alive),
      cmocka_unit_test(a_chain_of_mutations_is_one_storage),
      cmocka_unit_test(non_overlapping_views_all_mutated_share_one_storage),
      cmocka_unit_test(multi_output_ops_allocate_every_output),
      cmocka_unit_test(a_collective_holds_its_buffers_until_its_wait),
      cmocka_unit_test(checker_reports_each_broken_rule_by_name),
      cmocka_unit_test(bad_graphs_are_refused_naming_what_is_wrong),
      cmocka_unit_test(api_misuse_is_a_clear_status),
      cmocka_unit_test(a_failed_finish_can_be_finished_again),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
