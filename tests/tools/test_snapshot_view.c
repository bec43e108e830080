/* SPDX-License-Identifier: Apache-2.0 */
/* test_snapshot_view.c - gca-snapshot: loading a snapshot JSON into the model
 * (exact totals, the timeline rebuilt backwards from the snapshot's state,
 * events with their streams and frames, errors that name the missing field),
 * the text summary of a hand-written snapshot, a snapshot of a live allocator
 * against its statistics, the HTML page's data island (for one snapshot and
 * for two), and the command's exit statuses. The page in a browser:
 * test_snapshot_page.c.
 *
 * Usage: test_snapshot_view SNAPSHOT.json GCA_SNAPSHOT_BINARY
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gca.h"
#include "support.h"
#include "snapshot_model.h"
#include "tool_assert.h"

static const char *snapshot_path;
static const char *tool_path;

static gca_status_t load_text(const char *json, snapshot_t *s) {
  return gca__snapshot_load(json, strlen(json), s);
}

static void handwritten_snapshot_totals_are_exact(void **state) {
  (void)state;
  snapshot_t s;
  assert_ok(gca__snapshot_load_file(snapshot_path, &s));
  assert_int_equal(s.nsegments, 2);
  assert_int_equal(s.nblocks, 5);
  assert_int_equal(s.ndevices, 1);
  assert_int_equal(s.reserved, 23068672);
  assert_int_equal(s.by_state[SNAP_ACTIVE_ALLOCATED], 9437184);
  assert_int_equal(s.by_state[SNAP_ACTIVE_PENDING_FREE], 524288);
  assert_int_equal(s.by_state[SNAP_INACTIVE], 13107200);
  assert_int_equal(s.count_by_state[SNAP_INACTIVE], 2);
  assert_int_equal(s.requested, 9000000);
  assert_int_equal(s.segments[1].address, 0x7f0000200000ull);
  assert_int_equal(s.segments[1].stream, 1);
  assert_true(s.segments[1].is_expandable);
  assert_false(s.segments[0].is_large);
  assert_int_equal(s.blocks[0].nframes, 2);
  assert_string_equal(s.blocks[0].frames[0].name, "make_buffer");
  assert_int_equal(s.blocks[0].frames[0].line, 42);
  /* a block recorded without frames takes those of its alloc event */
  assert_int_equal(s.blocks[3].nframes, 1);
  assert_string_equal(s.blocks[3].frames[0].name, "load_weights");
  gca__snapshot_free(&s);
}

static void timeline_is_rebuilt_backwards_from_the_snapshot_state(void **state) {
  (void)state;
  snapshot_t s;
  assert_ok(gca__snapshot_load_file(snapshot_path, &s));
  assert_int_equal(s.ntraces, 1);
  const snap_trace_t *t = &s.traces[0];
  assert_int_equal(t->nevents, 10);
  assert_true(t->has_times);
  assert_int_equal(t->allocated_before, 0);
  assert_int_equal(t->reserved_before, 0);
  /* alloc and free_requested carry requested sizes, as PyTorch's traces do */
  assert_int_equal(t->peak_allocated, 22107200);
  assert_int_equal(t->peak_reserved, 23068672);
  assert_int_equal(t->events[5].allocated_after, 22107200);
  assert_int_equal(t->events[7].allocated_after, 9524288); /* free_completed changes nothing */
  assert_int_equal(t->events[9].allocated_after, 9000000);
  assert_int_equal(t->events[9].reserved_after, 23068672);
  assert_true(t->events[9].time_us == 190.0);
  gca__snapshot_free(&s);
}

static void truncated_history_still_ends_at_the_snapshot_totals(void **state) {
  (void)state;
  const char *json =
      "{\"segments\": [{\"address\": 4096, \"total_size\": 2097152, \"blocks\": ["
      "{\"address\": 4096, \"size\": 1048576, \"state\": \"active_allocated\"},"
      "{\"address\": 1052672, \"size\": 1048576, \"state\": \"inactive\"}]}],"
      "\"device_traces\": [[{\"action\": \"free_requested\", \"addr\": 1052672, \"size\": 1048576},"
      "{\"action\": \"segment_unmap\", \"addr\": 8192, \"size\": 2097152}]]}";
  snapshot_t s;
  assert_ok(load_text(json, &s));
  const snap_trace_t *t = &s.traces[0];
  assert_false(t->has_times);
  assert_true(t->events[1].time_us == 1.0);
  assert_int_equal(t->allocated_before, 2097152);
  assert_int_equal(t->reserved_before, 4194304);
  assert_int_equal(t->events[1].allocated_after, 1048576);
  assert_int_equal(t->events[1].reserved_after, 2097152);
  assert_int_equal(t->peak_reserved, 4194304);
  gca__snapshot_free(&s);
}

static void history_events_keep_their_stream_frames_and_action(void **state) {
  (void)state;
  snapshot_t s;
  assert_ok(gca__snapshot_load_file(snapshot_path, &s));
  const snap_trace_t *t = &s.traces[0];
  assert_int_equal(t->events[4].action, SNAP_EV_ALLOC);
  assert_int_equal(t->events[4].stream, 1);
  assert_int_equal(t->events[4].nframes, 1);
  assert_string_equal(t->events[4].frames[0].name, "load_weights");
  assert_string_equal(t->events[4].frames[0].filename, "weights.c");
  assert_int_equal(t->events[4].frames[0].line, 3);
  assert_int_equal(t->events[0].stream, 0);
  assert_int_equal(t->events[0].nframes, 0);
  assert_null(t->events[0].frames);
  assert_int_equal(t->events[9].action, SNAP_EV_SNAPSHOT);
  gca__snapshot_free(&s);
  const char *json = "{\"segments\": [], \"device_traces\": [[{\"action\": \"oom\", \"size\": 1, "
                     "\"stream\": \"0x10\", \"frames\": [\"f\", {\"name\": \"g\"}]},"
                     "{\"action\": \"bogus\"}]]}";
  assert_ok(load_text(json, &s));
  t = &s.traces[0];
  assert_int_equal(t->events[0].action, SNAP_EV_OOM);
  assert_int_equal(t->events[0].stream, 16);
  assert_int_equal(t->events[0].nframes, 2);
  assert_string_equal(t->events[0].frames[1].name, "g");
  assert_int_equal(t->events[1].action, SNAP_EV_OTHER);
  assert_string_equal(gca__snapshot_action_name(SNAP_EV_OOM), "oom");
  assert_string_equal(gca__snapshot_action_name(SNAP_EV_SEGMENT_UNMAP), "segment_unmap");
  assert_string_equal(gca__snapshot_action_name(SNAP_EV_OTHER), "other");
  gca__snapshot_free(&s);
  assert_tool_status(load_text("{\"segments\": [], \"device_traces\": [[{\"action\": \"alloc\", "
                               "\"size\": 1, \"frames\": {}}]]}",
                               &s),
                     GCA_ERR_PARSE, "device_traces[0][0]: 'frames' is not an array");
}

static void text_summary_of_handwritten_snapshot_is_exact(void **state) {
  (void)state;
  snapshot_t s;
  assert_ok(gca__snapshot_load_file(snapshot_path, &s));
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  gca__snapshot_write_text(&s, 10, f);
  fclose(f);
  const char *expected =
      "snapshot: 2 segments, 5 blocks on 1 device; 10 history events\n"
      "totals:\n"
      "  reserved                   23068672  22.00 MiB     2 segments\n"
      "  active_allocated            9437184  9.00 MiB      2 blocks\n"
      "  active_pending_free          524288  512.00 KiB    1 block\n"
      "  inactive                   13107200  12.50 MiB     2 blocks\n"
      "  requested                   9000000  8.58 MiB\n"
      "segments:\n"
      "  device address                     total      allocated type   stream     blocks\n"
      "  0      0x7f0000000000            2097152        1048576 small  0x0        3\n"
      "  0      0x7f0000200000           20971520        8388608 large  0x1        2 (expandable)\n"
      "largest live blocks:\n"
      "  0x7f0000200000            8388608 bytes (requested 8000000) in segment 0x7f0000200000\n"
      "      at load_weights (weights.c:3)\n"
      "  0x7f0000000000            1048576 bytes (requested 1000000) in segment 0x7f0000000000\n"
      "      at make_buffer (model.c:42)\n"
      "      at main (main.c:7)\n"
      "history device 0: 10 events, peak allocated 22107200, peak reserved 23068672, before the "
      "first event allocated 0 reserved 0\n";
  assert_string_equal(text, expected);
  free(text);
  gca__snapshot_free(&s);
}

static void largest_blocks_are_ordered_and_capped(void **state) {
  (void)state;
  snapshot_t s;
  assert_ok(gca__snapshot_load_file(snapshot_path, &s));
  size_t idx[4];
  assert_int_equal(gca__snapshot_largest(&s, idx, 4), 2);
  assert_int_equal(s.blocks[idx[0]].size, 8388608);
  assert_int_equal(s.blocks[idx[1]].size, 1048576);
  assert_int_equal(gca__snapshot_largest(&s, idx, 1), 1);
  assert_int_equal(s.blocks[idx[0]].size, 8388608);
  assert_int_equal(gca__snapshot_largest(&s, idx, 0), 0);
  gca__snapshot_free(&s);
}

static void malformed_or_incomplete_snapshots_name_the_problem(void **state) {
  (void)state;
  static const struct {
    const char *json;
    const char *needle;
  } cases[] = {
      {"{\"segments\": [", "line 1 column"},
      {"[]", "not an object"},
      {"{\"device_traces\": []}", "missing 'segments'"},
      {"{\"segments\": []}", "missing 'device_traces'"},
      {"{\"segments\": {}, \"device_traces\": []}", "'segments' is not an array"},
      {"{\"segments\": [{\"address\": 1, \"total_size\": 2}], \"device_traces\": []}",
       "segments[0]: missing 'blocks'"},
      {"{\"segments\": [{\"total_size\": 2, \"blocks\": []}], \"device_traces\": []}",
       "segments[0]: missing 'address'"},
      {"{\"segments\": [{\"address\": 1, \"total_size\": 2, \"blocks\": [{\"address\": 1, "
       "\"state\": \"inactive\"}]}], \"device_traces\": []}",
       "segments[0].blocks[0]: missing 'size'"},
      {"{\"segments\": [{\"address\": 1, \"total_size\": 2, \"blocks\": [{\"address\": 1, "
       "\"size\": 2, \"state\": \"bogus\"}]}], \"device_traces\": []}",
       "not 'bogus'"},
      {"{\"segments\": [{\"address\": -1, \"total_size\": 2, \"blocks\": []}], "
       "\"device_traces\": []}",
       "segments[0]: 'address' is negative"},
      {"{\"segments\": [], \"device_traces\": [[{\"size\": 1}]]}",
       "device_traces[0][0]: missing 'action'"},
      {"{\"segments\": [], \"device_traces\": [[{\"action\": \"alloc\"}]]}",
       "device_traces[0][0]: missing 'size'"},
      {"{\"segments\": [], \"device_traces\": [{}]}", "device_traces[0] is not an array"},
  };
  for (size_t i = 0; i < GCA_ARRAY_SIZE(cases); i++) {
    snapshot_t s = {0};
    assert_tool_status(load_text(cases[i].json, &s), GCA_ERR_PARSE, cases[i].needle);
    assert_null(s.segments);
  }
  snapshot_t s;
  assert_tool_status(gca__snapshot_load_file("/nonexistent/snap.json", &s), GCA_ERR_IO,
                     "/nonexistent/snap.json");
}

static void html_page_is_self_contained_and_escapes_its_data(void **state) {
  (void)state;
  const char *json =
      "{\"segments\": [{\"address\": 4096, \"total_size\": 4096, \"blocks\": ["
      "{\"address\": 4096, \"size\": 4096, \"state\": \"active_allocated\", "
      "\"frames\": [{\"name\": \"</script><b>x\", \"filename\": \"a.c\", \"line\": 1}]}]}],"
      "\"device_traces\": [[]]}";
  snapshot_t s;
  assert_ok(load_text(json, &s));
  char *page = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&page, &len);
  assert_ok(gca__snapshot_write_html(&s, (const char *const[]){"t<1>.json"}, 1, 10, f));
  fclose(f);
  assert_non_null(strstr(page, "<title>gca snapshot: t&lt;1&gt;.json</title>"));
  assert_non_null(strstr(page, "\\u003c/script>\\u003cb>x"));
  const char *island = strstr(page, "id=\"gca-data\">");
  assert_non_null(island);
  const char *end = strstr(island, "</script>");
  assert_non_null(end);
  assert_null(memchr(island + 14, '<', (size_t)(end - island - 14)));
  static const char *fetches[] = {"src=", "href=",  "<link",          "@import",
                                  "url(", "fetch(", "XMLHttpRequest", "https://"};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(fetches); i++)
    if (strstr(page, fetches[i]))
      fail_msg("the page fetches something: '%s'", fetches[i]);
  free(page);
  gca__snapshot_free(&s);
}

static size_t occurrences(const char *text, const char *needle) {
  size_t n = 0;
  for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
    n++;
  return n;
}

/* Two snapshots make one page with a section each and one data island holding
 * both; a stack both use is written once (Note [Stack table]). */
static void html_page_for_two_snapshots_holds_both_and_writes_each_stack_once(void **state) {
  (void)state;
  snapshot_t s[2];
  assert_ok(gca__snapshot_load_file(snapshot_path, &s[0]));
  assert_ok(gca__snapshot_load_file(snapshot_path, &s[1]));
  char *page = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&page, &len);
  const char *titles[] = {"a.json", "b<1>.pickle"};
  assert_ok(gca__snapshot_write_html(s, titles, 2, 10, f));
  fclose(f);
  assert_non_null(strstr(page, "<title>gca snapshot: a.json vs b&lt;1&gt;.pickle</title>"));
  assert_non_null(strstr(page, "<body data-gca-snapshots=\"2\">"));
  assert_int_equal(occurrences(page, "<section class=\"snapshot\""), 2);
  assert_non_null(strstr(page, "<section class=\"snapshot\" data-index=\"1\">\n<h2>b&lt;1&gt;"));
  assert_non_null(strstr(page, "{\"snapshots\":[{\"title\":\"a.json\",\"traces\":[{"));
  assert_non_null(strstr(page, "},{\"title\":\"b\\u003c1>.pickle\",\"traces\":[{"));
  /* block 0 and the largest list of each snapshot use make_buffer's stack;
   * load_weights' is event 4's, and block 3's and its largest entry's */
  assert_int_equal(occurrences(page, "\"make_buffer (model.c:42)\",\"main (main.c:7)\""), 1);
  assert_int_equal(occurrences(page, "\"load_weights (weights.c:3)\""), 1);
  assert_non_null(strstr(page, "\"stacks\":[["));
  free(page);
  gca__snapshot_free(&s[0]);
  gca__snapshot_free(&s[1]);
}

static void snapshot_of_a_live_allocator_matches_its_statistics(void **state) {
  (void)state;
  const gca_device_ops_t *dev = test_backend();
  gca_stream_t stream;
  assert_ok(dev->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &stream));
  assert_ok(gca_record_history(true, 10000, true));
  void *small = NULL, *large = NULL, *gone = NULL;
  assert_ok(gca_malloc(&small, 1000, stream));
  assert_ok(gca_malloc(&large, 5u << 20, stream));
  assert_ok(gca_malloc(&gone, 3u << 20, stream));
  assert_ok(gca_free(gone));
  char *json = NULL;
  size_t len = 0;
  assert_ok(gca_snapshot_json(&json, &len));
  snapshot_t s;
  assert_ok(gca__snapshot_load(json, len, &s));
  gca_stats_t st;
  assert_ok(gca_get_stats(0, &st));
  assert_int_equal(s.reserved, st.reserved_bytes[GCA_STAT_ALL].current);
  assert_int_equal(s.by_state[SNAP_ACTIVE_ALLOCATED], st.allocated_bytes[GCA_STAT_ALL].current);
  assert_int_equal(s.count_by_state[SNAP_ACTIVE_ALLOCATED], 2);
  assert_int_equal(s.requested, 1000 + (5u << 20));
  assert_true(s.ntraces >= 1);
  const snap_trace_t *t = &s.traces[0];
  assert_true(t->nevents >= 5);
  assert_int_equal(t->allocated_before, 0);
  assert_int_equal(t->reserved_before, 0);
  assert_int_equal(t->peak_allocated, st.requested_bytes[GCA_STAT_ALL].peak);
  size_t idx[2];
  assert_int_equal(gca__snapshot_largest(&s, idx, 2), 2);
  assert_int_equal(s.blocks[idx[0]].address, (uint64_t)(uintptr_t)large);
  assert_true(s.blocks[idx[0]].nframes > 0);
  char *page = NULL;
  size_t plen = 0;
  FILE *f = open_memstream(&page, &plen);
  assert_ok(gca__snapshot_write_html(&s, (const char *const[]){"live"}, 1, 10, f));
  fclose(f);
  assert_non_null(strstr(page, "id=\"gca-data\""));
  free(page);
  gca__snapshot_free(&s);
  gca_string_free(json);
  assert_ok(gca_record_history(false, 0, false));
  assert_ok(gca_free(small));
  assert_ok(gca_free(large));
  assert_ok(gca_empty_cache());
  assert_ok(dev->stream_destroy(stream));
}

/* Sizes and addresses are kept as int64 on the timeline: a value beyond it or
 * negative, written as a number or as a string, is an error naming the field,
 * and so is one that takes a total beyond int64; no signed arithmetic
 * overflows on the way (the UBSan build checks). */
static void huge_or_negative_sizes_are_errors_naming_the_field(void **state) {
  (void)state;
#define SEG(extra) \
  "{\"address\": 4096, \"total_size\": 9223372036854775807, " extra "\"blocks\": []}"
  static const struct {
    const char *json;
    const char *needle;
  } cases[] = {
      /* two segments of INT64_MAX bytes each on one device */
      {"{\"segments\": [" SEG("") ", " SEG(
           "") "], "
               "\"device_traces\": [[{\"action\": \"segment_alloc\", \"size\": 1}]]}",
       "segments[1]: 'total_size' takes the reserved bytes beyond int64"},
      {"{\"segments\": [{\"address\": 1, \"total_size\": 2, \"blocks\": [{\"address\": 1, "
       "\"size\": \"0xffffffffffffffff\", \"state\": \"inactive\"}]}], \"device_traces\": []}",
       "segments[0].blocks[0]: 'size' is beyond int64 (0xffffffffffffffff)"},
      {"{\"segments\": [{\"address\": 1, \"total_size\": 2, \"blocks\": [{\"address\": 1, "
       "\"size\": \"99999999999999999999999\", \"state\": \"inactive\"}]}], "
       "\"device_traces\": []}",
       "segments[0].blocks[0]: 'size' is beyond int64"},
      {"{\"segments\": [{\"address\": 1, \"total_size\": 2, \"blocks\": [{\"address\": 1, "
       "\"size\": 18446744073709551615, \"state\": \"inactive\"}]}], \"device_traces\": []}",
       "'size' is beyond int64"},
      {"{\"segments\": [{\"address\": 1, \"total_size\": -2, \"blocks\": []}], "
       "\"device_traces\": []}",
       "segments[0]: 'total_size' is negative (-2)"},
      {"{\"segments\": [{\"address\": \"-0x10\", \"total_size\": 2, \"blocks\": []}], "
       "\"device_traces\": []}",
       "segments[0]: 'address' is negative"},
      /* an event of 2^63 bytes: its change cannot be negated in int64 */
      {"{\"segments\": [], \"device_traces\": [[{\"action\": \"free_requested\", "
       "\"size\": \"0x8000000000000000\"}]]}",
       "device_traces[0][0]: 'size' is beyond int64"},
      /* frees of 2^62 bytes each: the allocated bytes before them exceed int64 */
      {"{\"segments\": [], \"device_traces\": [[{\"action\": \"free_requested\", "
       "\"size\": 4611686018427387904}, {\"action\": \"free_requested\", "
       "\"size\": 4611686018427387904}]]}",
       "device_traces[0][0]: 'size' takes the allocated bytes beyond int64"},
      {"{\"segments\": [{\"address\": 1, \"total_size\": 2, \"blocks\": ["
       "{\"address\": 1, \"size\": 1, \"requested_size\": 9223372036854775807, "
       "\"state\": \"active_allocated\"}, "
       "{\"address\": 2, \"size\": 1, \"requested_size\": 9223372036854775807, "
       "\"state\": \"active_allocated\"}]}], \"device_traces\": []}",
       "segments[0].blocks[1]: 'requested_size' takes the requested bytes beyond int64"},
  };
#undef SEG
  for (size_t i = 0; i < GCA_ARRAY_SIZE(cases); i++) {
    snapshot_t s = {0};
    assert_tool_status(load_text(cases[i].json, &s), GCA_ERR_PARSE, cases[i].needle);
    assert_null(s.segments);
  }
}

static void command_exits_2_on_bad_input_and_0_on_text(void **state) {
  (void)state;
  char bad[] = "/tmp/gca-snapshot-bad-XXXXXX";
  int fd = mkstemp(bad);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "{\"segments\": [}", 15), 15);
  close(fd);
  char *out = NULL;
  char *args_bad[] = {(char *)tool_path, "--text", bad, NULL};
  assert_int_equal(test_run_capture(args_bad, &out), 2);
  assert_non_null(strstr(out, "gca-snapshot: "));
  assert_non_null(strstr(out, "json: line 1 column"));
  free(out);
  char *args_missing[] = {(char *)tool_path, "/nonexistent/x.json", NULL};
  assert_int_equal(test_run_capture(args_missing, &out), 2);
  assert_non_null(strstr(out, "cannot open"));
  free(out);
  char *args_usage[] = {(char *)tool_path, NULL};
  assert_int_equal(test_run_capture(args_usage, &out), 2);
  assert_non_null(strstr(out, "usage:"));
  free(out);
  char *args_text[] = {(char *)tool_path, "--text", (char *)snapshot_path, NULL};
  assert_int_equal(test_run_capture(args_text, &out), 0);
  assert_non_null(strstr(out, "  reserved                   23068672"));
  free(out);
  unlink(bad);
}

/* gca-snapshot A B: one page of both, either kind each (JSON, pickle); an
 * unreadable or malformed one is an error naming it, and no page is written;
 * --text and --pickle take one snapshot. */
static void command_with_two_snapshots_writes_one_page_or_names_the_bad_one(void **state) {
  (void)state;
  char dir[] = "/tmp/gca-snapshot-pair-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char a[128], sub[128], b[128], bad[128], out_page[128], dflt[128];
  snprintf(a, sizeof(a), "%s/a.json", dir);
  snprintf(sub, sizeof(sub), "%s/sub", dir);
  snprintf(b, sizeof(b), "%s/sub/b.pickle", dir);
  snprintf(bad, sizeof(bad), "%s/bad.json", dir);
  snprintf(out_page, sizeof(out_page), "%s/out.html", dir);
  snprintf(dflt, sizeof(dflt), "%s/a-vs-b.pickle.html", dir);
  assert_int_equal(mkdir(sub, 0700), 0);
  char *out = NULL;
  char *cp[] = {"cp", (char *)snapshot_path, a, NULL};
  assert_int_equal(test_run_capture(cp, &out), 0);
  free(out);
  char *to_pickle[] = {(char *)tool_path, a, "--pickle", b, NULL};
  assert_int_equal(test_run_capture(to_pickle, &out), 0);
  free(out);
  FILE *f = fopen(bad, "w");
  assert_non_null(f);
  fputs("{\"segments\": [}", f);
  fclose(f);

  char *missing[] = {(char *)tool_path, a, "/nonexistent/b.json", "-o", out_page, NULL};
  assert_int_equal(test_run_capture(missing, &out), 2);
  assert_non_null(strstr(out, "cannot open /nonexistent/b.json"));
  free(out);
  char *malformed[] = {(char *)tool_path, bad, a, "-o", out_page, NULL};
  assert_int_equal(test_run_capture(malformed, &out), 2);
  assert_non_null(strstr(out, bad));
  assert_non_null(strstr(out, "json: line 1 column"));
  free(out);
  assert_int_equal(access(out_page, F_OK), -1);
  char *text[] = {(char *)tool_path, "--text", a, b, NULL};
  assert_int_equal(test_run_capture(text, &out), 2);
  assert_non_null(strstr(out, "--text takes one snapshot"));
  free(out);
  char *three[] = {(char *)tool_path, a, b, a, NULL};
  assert_int_equal(test_run_capture(three, &out), 2);
  assert_non_null(strstr(out, "usage:"));
  free(out);

  char *pair[] = {(char *)tool_path, a, b, NULL};
  assert_int_equal(test_run_capture(pair, &out), 0);
  assert_non_null(strstr(out, dflt));
  free(out);
  char *page = NULL;
  size_t len = 0;
  assert_ok(tool_read_file(dflt, &page, &len));
  assert_non_null(strstr(page, "data-gca-snapshots=\"2\""));
  assert_non_null(strstr(page, "/sub/b.pickle\",\"traces\":[{"));
  free(page);
  char *rm[] = {"rm", "-rf", dir, NULL};
  assert_int_equal(test_run_capture(rm, &out), 0);
  free(out);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s SNAPSHOT.json GCA_SNAPSHOT_BINARY\n", argv[0]);
    return 1;
  }
  snapshot_path = argv[1];
  tool_path = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(handwritten_snapshot_totals_are_exact),
      cmocka_unit_test(timeline_is_rebuilt_backwards_from_the_snapshot_state),
      cmocka_unit_test(history_events_keep_their_stream_frames_and_action),
      cmocka_unit_test(truncated_history_still_ends_at_the_snapshot_totals),
      cmocka_unit_test(text_summary_of_handwritten_snapshot_is_exact),
      cmocka_unit_test(largest_blocks_are_ordered_and_capped),
      cmocka_unit_test(malformed_or_incomplete_snapshots_name_the_problem),
      cmocka_unit_test(huge_or_negative_sizes_are_errors_naming_the_field),
      cmocka_unit_test(html_page_is_self_contained_and_escapes_its_data),
      cmocka_unit_test(html_page_for_two_snapshots_holds_both_and_writes_each_stack_once),
      cmocka_unit_test(snapshot_of_a_live_allocator_matches_its_statistics),
      cmocka_unit_test(command_exits_2_on_bad_input_and_0_on_text),
      cmocka_unit_test(command_with_two_snapshots_writes_one_page_or_names_the_bad_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
