/* SPDX-License-Identifier: Apache-2.0 */
/* test_stress.c - gca-stress: its size distributions, the per-block stamp and
 * its checker (in process, on the sim device), and the tool itself run as a
 * command: a seeded single-thread run is reproducible, the checker catches an
 * injected overwrite-after-free and names the seed and the block, injected
 * allocation faults are counted rather than fatal, bad usage exits 2.
 * The workload parts of --all check what they compute; and (the stress
 * suite's sweep) a fault injected at the n-th call of any device op, n = 1..5,
 * ends a short --all run cleanly.
 *
 * Usage: test_stress GCA_STRESS_BINARY [sweep]
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gca.h"
#include "support.h"
#include "tool_assert.h"
#include "stress_sizes.h"
#include "stress_stamp.h"

static const char *tool_path;

/* The integer after "\"key\": " in a --json report. */
static long long json_field(const char *out, const char *key) {
  char pat[64];
  snprintf(pat, sizeof(pat), "\"%s\": ", key);
  const char *p = strstr(out, pat);
  if (!p)
    fail_msg("no '%s' in the report:\n%s", key, out);
  return strtoll(p + strlen(pat), NULL, 0);
}

static char *json_string_field(const char *out, const char *key, char *buf, size_t len) {
  char pat[64];
  snprintf(pat, sizeof(pat), "\"%s\": \"", key);
  const char *p = strstr(out, pat);
  if (!p)
    fail_msg("no '%s' in the report:\n%s", key, out);
  p += strlen(pat);
  size_t n = strcspn(p, "\"");
  snprintf(buf, len, "%.*s", (int)n, p);
  return buf;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* ---- distributions ---- */

static void size_ranges_parse_and_bad_text_is_rejected(void **state) {
  (void)state;
  stress_sizes_t s;
  assert_ok(gca__stress_sizes_parse("uniform:1:10", &s));
  assert_int_equal(s.kind, STRESS_SIZES_UNIFORM);
  assert_int_equal(s.min, 1);
  assert_int_equal(s.max, 10);
  assert_ok(gca__stress_sizes_parse("loguniform:256:16MiB", &s));
  assert_int_equal(s.kind, STRESS_SIZES_LOGUNIFORM);
  assert_int_equal(s.max, 16u << 20);
  static const struct {
    const char *text, *needle;
  } bad[] = {
      {"uniform:0:5", "0 < MIN <= MAX"},   {"uniform:9:3", "0 < MIN <= MAX"},
      {"gauss:1:2", "expected uniform"},   {"uniform:1", "expected KIND:MIN:MAX"},
      {"uniform:1:lots", "must be sizes"}, {"trace:", "expected uniform"},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(bad); i++) {
    stress_sizes_t untouched = {.min = 77};
    assert_tool_status(gca__stress_sizes_parse(bad[i].text, &untouched), GCA_ERR_PARSE,
                       bad[i].needle);
    assert_int_equal(untouched.min, 77);
  }
  assert_tool_status(gca__stress_sizes_parse("trace:/nonexistent/t.csv", &s), GCA_ERR_IO,
                     "/nonexistent/t.csv");
}

static void trace_sizes_are_the_allocate_rows(void **state) {
  (void)state;
  char path[] = "/tmp/gca-stress-trace-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  write_file(path, "Thread,Time,Action,Pointer,Size,Stream\n"
                   "1,00:00:00.000001,allocate,0x1000,100,0x0\n"
                   "1,00:00:00.000002,allocate failure,0x0,999999,0x0\n"
                   "1,00:00:00.000003,free,0x1000,100,0x0\n"
                   "1,00:00:00.000004,allocate,0x2000,300,0x0\n");
  char spec[64];
  snprintf(spec, sizeof(spec), "trace:%s", path);
  stress_sizes_t s;
  assert_ok(gca__stress_sizes_parse(spec, &s));
  assert_int_equal(s.count, 2);
  assert_int_equal(s.min, 100);
  assert_int_equal(s.max, 300);
  stress_rng_t rng = {1};
  bool seen100 = false, seen300 = false;
  for (int i = 0; i < 200; i++) {
    uint64_t v = gca__stress_sizes_sample(&s, &rng);
    assert_true(v == 100 || v == 300);
    seen100 |= v == 100;
    seen300 |= v == 300;
  }
  assert_true(seen100 && seen300);
  gca__stress_sizes_free(&s);

  write_file(path,
             "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000003,free,0x1000,100,0x0\n");
  assert_tool_status(gca__stress_sizes_parse(spec, &s), GCA_ERR_PARSE, "no allocate rows");
  write_file(path, "Pointer,Size\n0x1,2\n");
  assert_tool_status(gca__stress_sizes_parse(spec, &s), GCA_ERR_PARSE, "sizes: ");
  write_file(path,
             "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x1000,xx,0x0\n");
  assert_tool_status(gca__stress_sizes_parse(spec, &s), GCA_ERR_PARSE, "line 2");
  unlink(path);
}

static void loguniform_samples_span_the_range_and_follow_the_seed(void **state) {
  (void)state;
  stress_sizes_t s;
  assert_ok(gca__stress_sizes_parse("loguniform:256:16MiB", &s));
  stress_rng_t a = {42}, b = {42};
  int small = 0, large = 0;
  for (int i = 0; i < 4000; i++) {
    uint64_t v = gca__stress_sizes_sample(&s, &a);
    assert_int_equal(v, gca__stress_sizes_sample(&s, &b));
    assert_true(v >= 256 && v <= (16u << 20));
    small += v < 4096;
    large += v > (1u << 20);
  }
  /* each of those log-ranges holds about a quarter of the draws */
  assert_true(small > 500 && large > 500);
}

/* ---- stamps ---- */

static void stamp_regions_lie_inside_the_block(void **state) {
  (void)state;
  static const uint64_t sizes[] = {0, 3, 4, 100, 255, 1000, 1024, 4096, (1u << 20) + 3, 1ull << 33};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(sizes); i++) {
    stress_stamp_t st;
    gca__stress_stamp_layout(sizes[i], 1234 + i, &st);
    uint64_t nwords = sizes[i] / 4, total = 0;
    assert_true(st.step & 1);
    if (nwords == 0) {
      assert_int_equal(st.nregions, 0);
      continue;
    }
    assert_int_equal(st.regions[0].word, 0);
    bool last_word = false;
    for (int r = 0; r < st.nregions; r++) {
      assert_true(st.regions[r].count >= 1);
      assert_true(st.regions[r].word + st.regions[r].count <= nwords);
      last_word |= st.regions[r].word + st.regions[r].count == nwords;
      total += st.regions[r].count;
    }
    assert_true(last_word);
    assert_true(total <= STRESS_STAMP_MAX_WORDS);
    assert_true(gca__stress_stamp_covers(&st, 0));
    assert_true(gca__stress_stamp_covers(&st, nwords * 4 - 1));
    assert_false(gca__stress_stamp_covers(&st, nwords * 4));
  }
}

static void stamp_check_reports_the_lowest_wrong_offset(void **state) {
  (void)state;
  stress_stamp_t st;
  gca__stress_stamp_layout(1 << 20, 99, &st);
  uint32_t host[STRESS_STAMP_MAX_WORDS];
  size_t at = 0;
  for (int r = 0; r < st.nregions; r++)
    for (uint32_t j = 0; j < st.regions[r].count; j++)
      host[at++] = gca__stress_stamp_expected(&st, st.regions[r].word + j);
  stress_mismatch_t mm;
  assert_true(gca__stress_stamp_check(&st, host, &mm));
  host[at - 1] ^= 1;    /* the tail's last word (region 1) */
  host[5] = 0xdeadbeef; /* head word 5 */
  assert_false(gca__stress_stamp_check(&st, host, &mm));
  assert_int_equal(mm.offset, 20);
  assert_int_equal(mm.found, 0xdeadbeef);
  assert_int_equal(mm.expected, gca__stress_stamp_expected(&st, 5));
}

static void stamp_round_trip_on_the_sim_catches_a_stray_write(void **state) {
  (void)state;
  assert_ok(gca_device_init());
  gca_stream_t s;
  void *mem = NULL;
  assert_ok(gca_stream_create(&s, GCA_STREAM_NON_BLOCKING));
  assert_ok(gca_malloc(&mem, 1 << 20, s));
  gca_devptr_t p = (gca_devptr_t)(uintptr_t)mem;
  stress_stamp_t st;
  gca__stress_stamp_layout(1 << 20, 7, &st);
  uint32_t host[STRESS_STAMP_MAX_WORDS];
  stress_mismatch_t mm;
  assert_ok(gca__stress_stamp_write(p, &st, 0, st.nregions, s));
  assert_ok(gca__stress_stamp_read(p, &st, host, s));
  assert_true(gca__stress_stamp_check(&st, host, &mm));

  uint64_t word = st.regions[2].word + 1; /* inside the first sample */
  assert_ok(gca_kernel_fill_u32((char *)mem + word * 4, 0x5a5a5a5a, 0, 1, s));
  assert_ok(gca__stress_stamp_read(p, &st, host, s));
  assert_false(gca__stress_stamp_check(&st, host, &mm));
  assert_int_equal(mm.offset, word * 4);
  assert_int_equal(mm.found, 0x5a5a5a5a);

  /* a failed read-back leaves no copy queued behind it */
  assert_ok(gca_sim_fault_set("memcpy_async:nth=3"));
  memset(host, 0, sizeof(host));
  assert_status(gca__stress_stamp_read(p, &st, host, s), GCA_ERR_DRIVER, "memcpy_async");
  gca_sim_fault_clear();
  assert_ok(gca_stream_synchronize(s));
  assert_int_equal(host[0], gca__stress_stamp_expected(&st, 0));
  assert_int_equal(host[STRESS_STAMP_HEAD_WORDS + STRESS_STAMP_TAIL_WORDS], 0);

  assert_ok(gca__stress_stamp_write(p, &st, 0, st.nregions, s));
  assert_ok(gca__stress_stamp_read(p, &st, host, s));
  assert_true(gca__stress_stamp_check(&st, host, &mm));
  assert_ok(gca_free(mem));
  assert_ok(gca_stream_destroy(s));
  assert_ok(gca_empty_cache());
}

/* ---- the command ---- */

static void seeded_single_thread_run_is_reproducible(void **state) {
  (void)state;
  char *a = NULL, *b = NULL, *c = NULL;
  char *run1[] = {(char *)tool_path,
                  "--threads",
                  "1",
                  "--streams",
                  "3",
                  "--ops",
                  "3000",
                  "--seed",
                  "42",
                  "--empty-cache-every",
                  "500",
                  "--json",
                  NULL};
  assert_int_equal(test_run_capture(run1, &a), 0);
  assert_int_equal(test_run_capture(run1, &b), 0);
  char da[32], db[32], dc[32];
  assert_string_equal(json_string_field(a, "digest", da, sizeof(da)),
                      json_string_field(b, "digest", db, sizeof(db)));
  static const char *same[] = {
      "ops",         "allocs",     "frees", "cross_stream_frees", "bytes_requested",
      "empty_cache", "allocations"};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(same); i++)
    if (json_field(a, same[i]) != json_field(b, same[i]))
      fail_msg("'%s' differs between two runs with seed 42:\n%s\n%s", same[i], a, b);
  assert_int_equal(json_field(a, "ops"), 3000);
  assert_true(json_field(a, "allocs") > 1000);
  assert_int_equal(json_field(a, "allocs"), json_field(a, "allocations"));
  assert_true(json_field(a, "cross_stream_frees") > 0);
  assert_int_equal(json_field(a, "verified_blocks"), json_field(a, "frees"));
  assert_non_null(strstr(a, "\"ok\": true"));
  assert_non_null(strstr(a, "\"seed\": 42"));

  char *run2[] = {(char *)tool_path, "--threads", "1",      "--streams", "3", "--ops", "3000",
                  "--seed",          "43",        "--json", NULL};
  assert_int_equal(test_run_capture(run2, &c), 0);
  assert_string_not_equal(da, json_string_field(c, "digest", dc, sizeof(dc)));
  free(a);
  free(b);
  free(c);
}

static void without_cross_stream_frees_allocator_stats_repeat_too(void **state) {
  (void)state;
  char *a = NULL, *b = NULL;
  char *run[] = {(char *)tool_path,
                 "--threads",
                 "1",
                 "--streams",
                 "3",
                 "--ops",
                 "3000",
                 "--seed",
                 "42",
                 "--cross-stream-frees",
                 "0",
                 "--empty-cache-every",
                 "700",
                 "--json",
                 NULL};
  assert_int_equal(test_run_capture(run, &a), 0);
  assert_int_equal(test_run_capture(run, &b), 0);
  static const char *same[] = {
      "allocations",      "allocated_bytes_total", "allocated_bytes_peak", "reserved_bytes_peak",
      "num_device_alloc", "num_device_free",       "num_alloc_retries",    "num_ooms"};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(same); i++)
    if (json_field(a, same[i]) != json_field(b, same[i]))
      fail_msg("'%s' differs between two runs with seed 42:\n%s\n%s", same[i], a, b);
  assert_int_equal(json_field(a, "cross_stream_frees"), 0);
  free(a);
  free(b);
}

static void overwrite_after_free_is_caught_with_seed_and_block(void **state) {
  (void)state;
  char *out = NULL;
  char *argv[] = {
      (char *)tool_path,      "--threads", "1", "--ops", "5000", "--seed", "3", "--inject-bug",
      "overwrite-after-free", NULL};
  assert_int_equal(test_run_capture(argv, &out), 1);
  const char *msg = strstr(out, "FAILED (seed 3): CORRUPTION in block #");
  if (!msg)
    fail_msg("no corruption report:\n%s", out);
  assert_non_null(strstr(msg, " at 0x"));
  assert_non_null(strstr(msg, "(size "));
  assert_non_null(strstr(msg, "offset "));
  assert_non_null(strstr(msg, "found 0xdeadbeef"));
  assert_non_null(strstr(out, "gca-stress: seed 3\n"));
  assert_non_null(strstr(out, "reproduce with --seed 3"));
  free(out);

  char *threaded[] = {
      (char *)tool_path,      "--threads", "3", "--ops", "20000", "--seed", "11", "--inject-bug",
      "overwrite-after-free", "--json",    NULL};
  assert_int_equal(test_run_capture(threaded, &out), 1);
  assert_non_null(strstr(out, "\"ok\": false"));
  assert_non_null(strstr(out, "CORRUPTION in block #"));
  free(out);
}

static void injected_faults_are_counted_not_fatal(void **state) {
  (void)state;
  char *out = NULL;
  /* segment allocations fail once 200 MiB were created: later requests that the
   * cache cannot serve fail with GCA_ERR_OUT_OF_MEMORY, and the tool's own copies
   * and fills fail now and then */
  char *argv[] = {(char *)tool_path,
                  "--threads",
                  "2",
                  "--ops",
                  "4000",
                  "--seed",
                  "5",
                  "--faults",
                  "mem_alloc:after_bytes=209715200,memcpy_async:every=97,kernel_fill_u32:every=89",
                  "--empty-cache-every",
                  "300",
                  "--check-every",
                  "100",
                  "--json",
                  NULL};
  int rc = test_run_capture(argv, &out);
  if (rc != 0)
    fail_msg("exit %d:\n%s", rc, out);
  assert_true(json_field(out, "alloc_failures_oom") > 0);
  assert_true(json_field(out, "num_ooms") > 0);
  assert_true(json_field(out, "tool_op_faults") > 0);
  assert_true(json_field(out, "unverified_blocks") > 0);
  assert_true(json_field(out, "verified_blocks") > 0);
  assert_true(json_field(out, "checks") > 0);
  assert_int_equal(json_field(out, "reserved_bytes_end"), 0);
  free(out);

  /* every 4th segment allocation fails: the allocator frees its cache and retries */
  char *retry[] = {
      (char *)tool_path,   "--threads",           "2",  "--ops",  "3000", "--seed", "6", "--faults",
      "mem_alloc:every=4", "--empty-cache-every", "50", "--json", NULL};
  rc = test_run_capture(retry, &out);
  if (rc != 0)
    fail_msg("exit %d:\n%s", rc, out);
  assert_true(json_field(out, "num_alloc_retries") > 0);
  assert_int_equal(json_field(out, "reserved_bytes_end"), 0);
  free(out);
}

/* record_stream asks the device layer for the stream's device (stream_get_device):
 * failing every 7th call makes record_stream fail after the other stream's
 * write was queued. The tool waits for that stream before the free, so the
 * run reports no corruption and counts the failures. */
static void failed_record_stream_is_counted_without_false_corruption(void **state) {
  (void)state;
  static const char *const seeds[] = {"11", "12", "13"};
  for (size_t k = 0; k < GCA_ARRAY_SIZE(seeds); k++) {
    char *out = NULL;
    char *argv[] = {(char *)tool_path,
                    "--threads",
                    "2",
                    "--streams",
                    "4",
                    "--ops",
                    "3000",
                    "--seed",
                    (char *)seeds[k],
                    "--cross-stream-frees",
                    "0.5",
                    "--faults",
                    "stream_get_device:every=7",
                    "--check-every",
                    "200",
                    "--json",
                    NULL};
    int rc = test_run_capture(argv, &out);
    if (rc != 0 || strstr(out, "CORRUPTION"))
      fail_msg("seed %s: exit %d:\n%s", seeds[k], rc, out);
    assert_true(json_field(out, "record_stream_failures_injected") > 0);
    assert_true(json_field(out, "cross_stream_frees") > 0);
    assert_true(json_field(out, "verified_blocks") > 0);
    assert_int_equal(json_field(out, "reserved_bytes_end"), 0);
    free(out);
  }
}

static void small_device_runs_out_of_memory_without_failing(void **state) {
  (void)state;
  char *out = NULL;
  char *argv[] = {(char *)tool_path,
                  "--threads",
                  "2",
                  "--ops",
                  "3000",
                  "--seed",
                  "8",
                  "--device-memory",
                  "64MiB",
                  "--sizes",
                  "uniform:1MiB:8MiB",
                  "--json",
                  NULL};
  int rc = test_run_capture(argv, &out);
  if (rc != 0)
    fail_msg("exit %d:\n%s", rc, out);
  assert_true(json_field(out, "alloc_failures_oom") > 0);
  assert_true(json_field(out, "allocs") > 0);
  free(out);
}

/* Captures on a device that is full: a capture cannot release cached memory,
 * so its allocations may run out of memory; the episode winds down and is
 * counted (capture_aborted), as a plain allocation's OOM is, and the run
 * passes with everything given back. */
static void captures_on_a_full_device_wind_down(void **state) {
  (void)state;
  char *out = NULL;
  char *argv[] = {(char *)tool_path,
                  "--threads",
                  "2",
                  "--ops",
                  "3000",
                  "--seed",
                  "8",
                  "--device-memory",
                  "64MiB",
                  "--sizes",
                  "uniform:1MiB:8MiB",
                  "--capture-every",
                  "20",
                  "--config",
                  "expandable_segments:True",
                  "--json",
                  NULL};
  int rc = test_run_capture(argv, &out);
  if (rc != 0)
    fail_msg("exit %d:\n%s", rc, out);
  assert_true(json_field(out, "capture_aborted") > 0);
  assert_true(json_field(out, "captures") > 0);
  assert_int_equal(json_field(out, "reserved_bytes_end"), 0);
  free(out);
}

/* Note [Destroyed streams]: streams created and destroyed while other threads
 * capture leave expandable segments that cannot be given back then (nothing
 * is waited for during a capture); they must come back once the captures
 * end, or each dead stream keeps its reservation (1.125 times the device's
 * memory) and the address space runs out: before, this run warned of it 8 or
 * 9 times and fell back to classic segments. No capture may be invalidated by
 * the waits that give them back (Note [Capture gate]). */
static void churned_streams_give_back_their_address_space_between_captures(void **state) {
  (void)state;
  char *out = NULL;
  char *argv[] = {(char *)tool_path,
                  "--device-memory",
                  "140GiB",
                  "--threads",
                  "6",
                  "--streams",
                  "4",
                  "--ops",
                  "24000",
                  "--seed",
                  "22",
                  "--config",
                  "expandable_segments:True",
                  "--stream-churn",
                  "20",
                  "--capture-every",
                  "30",
                  "--json",
                  NULL};
  int rc = test_run_capture(argv, &out);
  if (rc != 0)
    fail_msg("exit %d:\n%s", rc, out);
  if (strstr(out, "no address space left") != NULL || strstr(out, "warn") != NULL)
    fail_msg("the run warned:\n%s", out);
  assert_true(json_field(out, "churns") >= 1000);
  assert_true(json_field(out, "captures") > 0);
  assert_int_equal(json_field(out, "reserved_bytes_end"), 0);
  free(out);
}

static void trace_sizes_drive_a_run(void **state) {
  (void)state;
  char path[] = "/tmp/gca-stress-trace-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  write_file(path, "Thread,Time,Action,Pointer,Size,Stream\n"
                   "1,00:00:00.000001,allocate,0x1000,512,0x0\n"
                   "1,00:00:00.000004,allocate,0x2000,3145728,0x0\n");
  char spec[64];
  snprintf(spec, sizeof(spec), "trace:%s", path);
  char *out = NULL;
  char *argv[] = {(char *)tool_path, "--threads", "2",      "--ops", "2000", "--seed", "4",
                  "--sizes",         spec,        "--json", NULL};
  assert_int_equal(test_run_capture(argv, &out), 0);
  long long allocs = json_field(out, "allocs");
  long long bytes = json_field(out, "bytes_requested");
  assert_true(allocs > 0);
  assert_true(bytes >= allocs * 512 && bytes <= allocs * 3145728);
  free(out);
  unlink(path);
}

static void bad_usage_exits_2_with_a_message(void **state) {
  (void)state;
  static const struct {
    const char *a, *b, *needle;
  } cases[] = {
      {"--threads", "0", "--threads '0'"},
      {"--sizes", "normal:1:2", "expected uniform"},
      {"--cross-stream-frees", "1.5", "probability"},
      {"--config", "no_such_key:1", "no_such_key"},
      {"--faults", "no_such_op:nth=1", "no_such_op"},
      {"--device-memory", "lots", "lots"},
      {"--inject-bug", "use-after-free", "overwrite-after-free"},
      {"--bogus", NULL, "unknown"},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(cases); i++) {
    char *out = NULL;
    char *argv[] = {(char *)tool_path, (char *)cases[i].a, (char *)cases[i].b, NULL};
    int rc = test_run_capture(argv, &out);
    if (rc != 2 || !strstr(out, cases[i].needle))
      fail_msg("%s %s: exit %d, output:\n%s", cases[i].a, cases[i].b ? cases[i].b : "", rc, out);
    free(out);
  }
  char *out = NULL;
  char *both[] = {(char *)tool_path, "--seconds", "1", "--ops", "5", NULL};
  assert_int_equal(test_run_capture(both, &out), 2);
  assert_non_null(strstr(out, "exclude each other"));
  free(out);
}

/* ---- --all ---- */

/* Every part runs and checks its results; with expandable segments IPC and
 * suspend work, with classic cuMemAlloc segments they are refused and
 * counted; the run reaches the device ops listed. */
static void all_parts_run_and_check_their_results(void **state) {
  (void)state;
  static const char *const configs[] = {"expandable_segments:True",
                                        "expandable_segments:True,expandable_moves:True",
                                        "ipc_handles:True", "expandable_segments:False"};
  setenv("GCA_SIM_FABRIC", "1", 1); /* IPC then takes fabric handles every other export */
  for (size_t k = 0; k < GCA_ARRAY_SIZE(configs); k++) {
    char *out = NULL;
    char *argv[] = {(char *)tool_path,
                    "--all",
                    "--stream-churn",
                    "0",
                    "--threads",
                    "2",
                    "--ops",
                    "600",
                    "--seed",
                    "21",
                    "--config",
                    (char *)configs[k],
                    "--live",
                    "32",
                    "--empty-cache-every",
                    "100",
                    "--json",
                    NULL};
    int rc = test_run_capture(argv, &out);
    if (rc != 0)
      fail_msg("%s: exit %d:\n%s", configs[k], rc, out);
    assert_true(json_field(out, "captures") > 0);
    assert_true(json_field(out, "replays_checked") >= json_field(out, "captures"));
    assert_true(json_field(out, "restores_checked") > 0);
    assert_true(json_field(out, "misc_rounds") > 0);
    bool exportable = k < 3, expandable = k < 2;
    assert_int_equal(json_field(out, "ipc_checked") > 0, exportable);
    assert_int_equal(json_field(out, "ipc_not_supported") > 0, !exportable);
    assert_int_equal(json_field(out, "suspends_checked") > 0, expandable);
    assert_int_equal(json_field(out, "ops_total"), gca_sim_op_count());
    assert_true(json_field(out, "ops_reached") >= 36);
    assert_int_equal(json_field(out, "mem_export_fd") > 0, exportable);
    assert_int_equal(json_field(out, "mem_alloc") > 0, k == 3);
    assert_true(json_field(out, "stream_begin_capture") > 0);
    assert_true(json_field(out, "event_elapsed") > 0);
    assert_int_equal(json_field(out, "ipc_fabric_checked") > 0, exportable);
    assert_int_equal(json_field(out, "mem_import_fabric") > 0, exportable);
    assert_int_equal(json_field(out, "ipc_fabric_not_supported"), 0);
    assert_true(json_field(out, "tree_rounds") > 0);
    assert_true(json_field(out, "tree_steps_checked") >= 5 * json_field(out, "tree_rounds"));
    assert_int_equal(json_field(out, "tree_updates"), json_field(out, "tree_rounds"));
    assert_true(json_field(out, "graph_exec_update") > 0);
    assert_true(json_field(out, "kernel_philox_u32") > 0);
    assert_true(json_field(out, "kernel_gemm_f32") > 0);
    assert_true(json_field(out, "kernel_ew_f32") > 0);
    assert_true(json_field(out, "kernel_dot_f32") > 0);
    assert_true(json_field(out, "graph_upload") > 0);
    assert_true(json_field(out, "graph_node_count") > 0);
    assert_int_equal(json_field(out, "reserved_bytes_end"), 0);
    free(out);
  }
  unsetenv("GCA_SIM_FABRIC");
}

/* On a device the workers keep full (16 MiB), the workload parts' own
 * requests run out of memory too: each such episode is counted as aborted
 * (host_aborted here, as the workers count their failed requests), and the
 * run ends cleanly with nothing reserved. */
static void a_full_device_aborts_the_parts_it_cannot_serve(void **state) {
  (void)state;
  char *out = NULL;
  char *argv[] = {(char *)tool_path, "--all", "--threads",       "1",     "--ops",  "2000",
                  "--seed",          "1",     "--device-memory", "16MiB", "--json", NULL};
  int rc = test_run_capture(argv, &out);
  if (rc != 0)
    fail_msg("exit %d:\n%s", rc, out);
  assert_true(json_field(out, "num_ooms") > 0);
  assert_true(json_field(out, "host_aborted") > 0);
  assert_int_equal(json_field(out, "reserved_bytes_end"), 0);
  free(out);
}

/* ---- the fault sweep (suite 'stress') ----
 *
 * For every device op and n = 1..5, one short gca-stress --all run with
 * --faults op:nth=n (armed before the device is initialized), at most two at
 * a time. A case passes when the run ends cleanly:
 *   - it exits on its own within SWEEP_TIMEOUT_S (no hang, no signal);
 *   - its output holds no sanitizer report and no CORRUPTION;
 *   - either it exits 0 with "ok": true (every injected failure was counted
 *     and wound down, the allocator check passed at the end, and after
 *     freeing every block and gca_empty_cache nothing is allocated and nothing
 *     reserved: reserved_bytes_end is 0), or it exits 1 having failed to set
 *     up, with the injected op named ("<op>: injected fault") before any
 *     allocation was made (the device's init, whose first result is final).
 * The seed is fixed and printed; GCA_STRESS_SWEEP_SEED changes it. */

#define SWEEP_NTH       5
#define SWEEP_PARALLEL  2
#define SWEEP_TIMEOUT_S 60.0

/* Cases (op, nth) skipped for a known defect, each named; empty now (the
 * sentinel keeps the array valid C). Add an entry only with the defect's
 * description and a reproducing command, and remove it with the fix. */
static const struct {
  const char *op;
  int nth; /* 0: every nth */
  const char *defect;
} sweep_skips[] = {
    {NULL, 0, NULL},
};

typedef struct sweep_case {
  const char *op;
  int nth;
  const char *config;
  char spec[96];
  pid_t pid;
  int fd;
  double start;
} sweep_case_t;

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* classic cuMemAlloc segments for the ops only they call; else expandable
 * segments and classic VMM segments (ipc_handles:True) in turn */
static const char *sweep_config(const char *op, int nth) {
  if (strcmp(op, "mem_alloc") == 0 || strcmp(op, "mem_free") == 0)
    return "expandable_segments:False";
  return nth % 2 ? "expandable_segments:True,expandable_moves:True" : "ipc_handles:True";
}

static void sweep_start(sweep_case_t *c, const char *seed) {
  char tmpl[] = "/tmp/gca-sweep-XXXXXX";
  c->fd = mkstemp(tmpl);
  assert_true(c->fd >= 0);
  unlink(tmpl);
  snprintf(c->spec, sizeof(c->spec), "%s:nth=%d", c->op, c->nth);
  char *argv[] = {(char *)tool_path,
                  "--all",
                  "--threads",
                  "2",
                  "--streams",
                  "3",
                  "--ops",
                  "300",
                  "--live",
                  "32",
                  "--seed",
                  (char *)seed,
                  "--config",
                  (char *)c->config,
                  "--empty-cache-every",
                  "50",
                  "--check-every",
                  "50",
                  "--faults",
                  c->spec,
                  "--json",
                  NULL};
  c->start = mono_s();
  c->pid = fork();
  assert_true(c->pid >= 0);
  if (c->pid == 0) {
    dup2(c->fd, 1);
    dup2(c->fd, 2);
    execv(argv[0], argv);
    _exit(127);
  }
}

static char *read_all(int fd) {
  off_t len = lseek(fd, 0, SEEK_END);
  char *out = calloc(1, (size_t)len + 1);
  assert_non_null(out);
  assert_int_equal(pread(fd, out, (size_t)len, 0), len);
  close(fd);
  return out;
}

/* Calls of `op` in the report's op_calls, or -1 when there is none. */
static long long op_calls(const char *out, const char *op) {
  const char *calls = strstr(out, "\"op_calls\": {");
  if (!calls)
    return -1;
  char pat[64];
  snprintf(pat, sizeof(pat), "\"%s\": ", op);
  const char *p = strstr(calls, pat);
  return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* NULL when the case ended cleanly, else why not (static storage). */
static const char *sweep_verdict(const sweep_case_t *c, int status, bool timed_out,
                                 const char *out) {
  static char why[256];
  char injected[96];
  snprintf(injected, sizeof(injected), "%s: injected fault", c->op);
  static const char *const never[] = {"AddressSanitizer", "runtime error:", "ThreadSanitizer",
                                      "LeakSanitizer", "CORRUPTION"};
  if (timed_out)
    return "did not finish in time (hang?)";
  if (!WIFEXITED(status)) {
    snprintf(why, sizeof(why), "killed by signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return why;
  }
  for (size_t i = 0; i < GCA_ARRAY_SIZE(never); i++)
    if (strstr(out, never[i])) {
      snprintf(why, sizeof(why), "output holds '%s'", never[i]);
      return why;
    }
  int rc = WEXITSTATUS(status);
  if (rc == 0) {
    if (!strstr(out, "\"ok\": true"))
      return "exit 0 without \"ok\": true";
    const char *p = strstr(out, "\"reserved_bytes_end\": ");
    if (!p || strtoll(p + strlen("\"reserved_bytes_end\": "), NULL, 10) != 0)
      return "memory still reserved at the end";
    return NULL;
  }
  if (rc == 1 && strstr(out, "gca-stress: device init failed") && strstr(out, injected))
    return NULL;
  snprintf(why, sizeof(why), "exit %d", rc);
  return why;
}

static bool sweep_skipped(const char *op, int nth) {
  for (size_t i = 0; i < GCA_ARRAY_SIZE(sweep_skips); i++)
    if (sweep_skips[i].op && strcmp(sweep_skips[i].op, op) == 0 &&
        (sweep_skips[i].nth == 0 || sweep_skips[i].nth == nth))
      return true;
  return false;
}

static sweep_case_t *sweep_find(sweep_case_t *cases, size_t n, pid_t pid) {
  for (size_t i = 0; i < n; i++)
    if (cases[i].pid == pid)
      return &cases[i];
  return NULL;
}

static void fault_at_any_call_of_any_op_ends_the_run_cleanly(void **state) {
  (void)state;
  const char *seed = getenv("GCA_STRESS_SWEEP_SEED");
  if (!seed || !*seed)
    seed = "7";
  /* a second device, so that enabling peer access reaches device_can_access_peer;
   * fabric handles, so that IPC reaches the fabric export and import */
  setenv("GCA_SIM_DEVICES", "2", 1);
  setenv("GCA_SIM_FABRIC", "1", 1);
  int nops = gca_sim_op_count();
  assert_true(nops > 0);
  size_t ncases = (size_t)nops * SWEEP_NTH, next = 0, running = 0, skipped = 0, bad = 0;
  sweep_case_t *cases = calloc(ncases, sizeof(*cases));
  int *fired = calloc((size_t)nops, sizeof(*fired)); /* highest nth that fired */
  assert_true(cases && fired);
  for (int op = 0; op < nops; op++)
    for (int n = 1; n <= SWEEP_NTH; n++) {
      sweep_case_t *c = &cases[(size_t)op * SWEEP_NTH + (size_t)(n - 1)];
      c->op = gca_sim_op_name(op);
      c->nth = n;
      c->config = sweep_config(c->op, n);
      c->pid = -1;
    }
  print_message("fault sweep: %d ops x nth=1..%d, seed %s (GCA_STRESS_SWEEP_SEED)\n", nops,
                SWEEP_NTH, seed);
  double t0 = mono_s();
  size_t done = 0;
  while (done < ncases) {
    while (running < SWEEP_PARALLEL && next < ncases) {
      sweep_case_t *c = &cases[next++];
      if (sweep_skipped(c->op, c->nth)) {
        skipped++;
        done++;
        continue;
      }
      sweep_start(c, seed);
      running++;
    }
    if (running == 0)
      continue;
    int status = 0;
    bool timed_out = false;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    sweep_case_t *c = pid > 0 ? sweep_find(cases, next, pid) : NULL;
    if (pid <= 0) {
      /* a watchdog for hung runs, not an ordering device */
      double now = mono_s();
      for (size_t i = 0; i < next && !c; i++)
        if (cases[i].pid > 0 && now - cases[i].start > SWEEP_TIMEOUT_S)
          c = &cases[i];
      if (!c) {
        struct timespec nap = {0, 2 * 1000 * 1000};
        nanosleep(&nap, NULL);
        continue;
      }
      kill(c->pid, SIGKILL);
      assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
      timed_out = true;
    }
    assert_non_null(c);
    c->pid = 0;
    running--;
    done++;
    char *out = read_all(c->fd);
    const char *why = sweep_verdict(c, status, timed_out, out);
    int op = (int)((size_t)(c - cases) / SWEEP_NTH);
    if (op_calls(out, c->op) >= c->nth || (why == NULL && strstr(out, "device init failed")))
      fired[op] = c->nth > fired[op] ? c->nth : fired[op];
    if (why) {
      bad++;
      print_error("fault sweep: --faults %s --config %s --seed %s: %s\n%s\n", c->spec, c->config,
                  seed, why, out);
    }
    free(out);
  }
  int reached = 0;
  char unreached[2048] = "";
  for (int op = 0; op < nops; op++) {
    reached += fired[op] > 0;
    if (!fired[op]) {
      size_t l = strlen(unreached);
      snprintf(unreached + l, sizeof(unreached) - l, " %s", gca_sim_op_name(op));
    }
  }
  print_message("fault sweep: %zu cases in %.1f s, %zu skipped for known defects; injected "
                "faults fired in %d of %d ops; never in:%s\n",
                ncases, mono_s() - t0, skipped, reached, nops, unreached);
  /* host_alloc and host_free are reached through the pinned host allocator,
   * which a build or a process without jemalloc does not have */
  void *probe = NULL;
  gca_status_t host_st = gca_host_alloc(&probe, 64);
  if (host_st == GCA_OK)
    assert_ok(gca_host_free(probe));
  for (int op = 0; op < nops; op++) {
    const char *name = gca_sim_op_name(op);
    if (host_st == GCA_ERR_NOT_SUPPORTED &&
        (strcmp(name, "host_alloc") == 0 || strcmp(name, "host_free") == 0))
      continue;
    if (!fired[op] && !sweep_skipped(name, 1))
      fail_msg("fault sweep: no injected fault of '%s' fired (seed %s): every device op must be "
               "reached by gca-stress --all",
               name, seed);
  }
  free(cases);
  free(fired);
  if (bad)
    fail_msg("fault sweep: %zu of %zu cases did not end cleanly (seed %s; see above)", bad, ncases,
             seed);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s GCA_STRESS_BINARY [sweep]\n", argv[0]);
    return 1;
  }
  tool_path = argv[1];
  if (argc > 2 && strcmp(argv[2], "sweep") == 0) {
    const struct CMUnitTest sweep[] = {
        cmocka_unit_test(fault_at_any_call_of_any_op_ends_the_run_cleanly),
    };
    return cmocka_run_group_tests(sweep, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(size_ranges_parse_and_bad_text_is_rejected),
      cmocka_unit_test(trace_sizes_are_the_allocate_rows),
      cmocka_unit_test(loguniform_samples_span_the_range_and_follow_the_seed),
      cmocka_unit_test(stamp_regions_lie_inside_the_block),
      cmocka_unit_test(stamp_check_reports_the_lowest_wrong_offset),
      cmocka_unit_test(stamp_round_trip_on_the_sim_catches_a_stray_write),
      cmocka_unit_test(seeded_single_thread_run_is_reproducible),
      cmocka_unit_test(without_cross_stream_frees_allocator_stats_repeat_too),
      cmocka_unit_test(overwrite_after_free_is_caught_with_seed_and_block),
      cmocka_unit_test(injected_faults_are_counted_not_fatal),
      cmocka_unit_test(failed_record_stream_is_counted_without_false_corruption),
      cmocka_unit_test(small_device_runs_out_of_memory_without_failing),
      cmocka_unit_test(captures_on_a_full_device_wind_down),
      cmocka_unit_test(trace_sizes_drive_a_run),
      cmocka_unit_test(churned_streams_give_back_their_address_space_between_captures),
      cmocka_unit_test(bad_usage_exits_2_with_a_message),
      cmocka_unit_test(all_parts_run_and_check_their_results),
      cmocka_unit_test(a_full_device_aborts_the_parts_it_cannot_serve),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
