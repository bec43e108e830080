/* test_stress.c - gca-stress: its size distributions, the per-block stamp and
 * its checker (in process, on the sim device), and the tool itself run as a
 * command: a seeded single-thread run is reproducible, the checker catches an
 * injected overwrite-after-free and names the seed and the block, injected
 * allocation faults are counted rather than fatal, bad usage exits 2.
 *
 * Usage: test_stress GCA_STRESS_BINARY
 */
#include <fcntl.h>
#include <sys/wait.h>
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

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s GCA_STRESS_BINARY\n", argv[0]);
    return 1;
  }
  tool_path = argv[1];
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
      cmocka_unit_test(trace_sizes_drive_a_run),
      cmocka_unit_test(bad_usage_exits_2_with_a_message),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
