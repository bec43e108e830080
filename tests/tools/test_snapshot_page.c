/* SPDX-License-Identifier: Apache-2.0 */
/* test_snapshot_page.c - gca-snapshot's page in headless Chromium: it draws
 * its plots; the wheel zooms the timeline about the pointer, a drag and the
 * keys pan and zoom and the reset button shows everything again; hovering a
 * block or the timeline shows that block's or event's details; a click on a
 * segment lists exactly its blocks; two snapshots (a JSON and a pickle) are
 * drawn side by side, each as it is drawn alone, on one time axis; and a
 * screenshot of that page is kept as an artifact.
 *
 * The page plays pointer and keyboard input itself when its URL carries
 * #gca-selftest=STEPS (Note [Self-test hook] in tools/snapshot_page.js):
 * synthetic events dispatched to what is on the screen at computed points,
 * through the page's own handlers. The test reads the outcome from the DOM
 * Chromium dumps (--dump-dom), with the page's script and style cut out so
 * that a search meets only what the page shows.
 *
 * Usage: test_snapshot_page SNAPSHOT.json GCA_SNAPSHOT_BINARY ARTIFACT_DIR.
 * Without Chromium (or GCA_CHROMIUM naming one) it exits 77: skipped.
 */
#include <inttypes.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gca.h"
#include "support.h"
#include "snapshot_model.h"

static const char *snapshot_path; /* the hand-written snapshot (JSON) */
static const char *tool_path;
static const char *artifact_dir;
static const char *chromium;

/* Set up once for the group: the hand-written snapshot's page (A), a live
 * allocator's snapshot written as PyTorch's pickle and its page (B), the page
 * of both (A B), and both models for the expected figures. */
static char dir[64], page_a[128], page_b[128], page_ab[128], pickle_b[128];
static snapshot_t model_a, model_b;

static const char *find_chromium(void) {
  static const char *names[] = {"chromium", "chromium-browser", "google-chrome",
                                "google-chrome-stable"};
  static char path[4096];
  const char *env = getenv("GCA_CHROMIUM");
  if (env && *env)
    return env;
  const char *pathvar = getenv("PATH");
  for (size_t i = 0; pathvar && i < GCA_ARRAY_SIZE(names); i++) {
    const char *p = pathvar;
    while (*p) {
      size_t n = strcspn(p, ":");
      snprintf(path, sizeof(path), "%.*s/%s", (int)n, p, names[i]);
      if (access(path, X_OK) == 0)
        return path;
      p += n + (p[n] == ':');
    }
  }
  return NULL;
}

/* Runs gca-snapshot A [B] -o page and asserts it succeeded. */
static void write_page(const char *page, const char *a, const char *b) {
  char *args[6] = {(char *)tool_path, (char *)a};
  size_t n = 2;
  if (b)
    args[n++] = (char *)b;
  args[n++] = "-o";
  args[n++] = (char *)page;
  args[n] = NULL;
  char *out = NULL;
  int rc = test_run_capture(args, &out);
  if (rc != 0)
    fail_msg("gca-snapshot exited %d: %s", rc, out);
  free(out);
}

/* Cuts every <script>...</script> and <style>...</style> out of text. */
static void cut_elements(char *text, const char *open, const char *close) {
  char *p;
  while ((p = strstr(text, open)) != NULL) {
    char *end = strstr(p, close);
    assert_non_null(end);
    end += strlen(close);
    memmove(p, end, strlen(end) + 1);
  }
}

static char *chromium_run(const char *page, const char *fragment, const char *action) {
  char url[512], profile[160];
  snprintf(url, sizeof(url), "file://%s%s%s", page, fragment ? "#gca-selftest=" : "",
           fragment ? fragment : "");
  snprintf(profile, sizeof(profile), "--user-data-dir=%s/profile", dir);
  char *out = NULL;
  char *args[] = {(char *)chromium,
                  "--headless",
                  "--disable-gpu",
                  "--no-sandbox",
                  "--no-first-run",
                  profile,
                  "--window-size=1440,1400",
                  (char *)action,
                  url,
                  NULL};
  int rc = test_run_capture(args, &out);
  if (rc != 0)
    fail_msg("chromium exited %d: %.2000s", rc, out);
  return out;
}

/* The page at `page` (with #gca-selftest=fragment when not NULL) as headless
 * Chromium leaves it, scripts and styles cut out; asserts that the page drew
 * and that the self-test, if any, ran to its end. */
static char *dump_dom(const char *page, const char *fragment) {
  char *dom = chromium_run(page, fragment, "--dump-dom");
  cut_elements(dom, "<script", "</script>");
  cut_elements(dom, "<style", "</style>");
  if (!strstr(dom, "data-gca-drawn=\"1\""))
    fail_msg("the page did not finish drawing: %.3000s", dom);
  if (fragment && !strstr(dom, "data-gca-selftest=\"ok\"")) {
    const char *why = strstr(dom, "data-gca-selftest=");
    fail_msg("self-test '%s' did not pass: %.200s", fragment, why ? why : "(did not run)");
  }
  return dom;
}

/* The number in the `nth` (0-based) attribute `name="..."` of text. */
static double attr_number(const char *text, const char *name, int nth) {
  char key[96];
  snprintf(key, sizeof(key), "%s=\"", name);
  const char *p = text;
  for (int i = 0; i <= nth; i++) {
    p = strstr(p, key);
    if (!p)
      fail_msg("no %s #%d in the page", key, nth);
    p += strlen(key);
  }
  char *end;
  double v = strtod(p, &end);
  if (end == p || *end != '"')
    fail_msg("%s%.40s is not a number", key, p);
  return v;
}

/* The visible range of the `nth` timeline, from its attributes. */
static void view_of(const char *dom, int nth, double *start, double *end) {
  *start = attr_number(dom, "data-gca-view-start", nth);
  *end = attr_number(dom, "data-gca-view-end", nth);
}

/* The self-test log's "key=a,b" (b may be absent: then *b is untouched). */
static void log_values(const char *dom, const char *key, double *a, double *b) {
  const char *log = strstr(dom, "id=\"gca-selftest-log\">");
  assert_non_null(log);
  char needle[64];
  snprintf(needle, sizeof(needle), "%s=", key);
  const char *p = log;
  do {
    p = strstr(p + 1, needle);
    if (!p)
      fail_msg("the self-test log has no '%s'", key);
  } while (p[-1] != '>' && p[-1] != '\n');
  char *end;
  *a = strtod(p + strlen(needle), &end);
  if (b) {
    assert_int_equal(*end, ',');
    *b = strtod(end + 1, NULL);
  }
}

/* What the `log` line `key` says (up to the end of its line), malloc'd. */
static char *log_text(const char *dom, const char *key) {
  char needle[64];
  snprintf(needle, sizeof(needle), "\n%s=", key);
  const char *p = strstr(dom, needle);
  if (!p) {
    snprintf(needle, sizeof(needle), "log\">%s=", key);
    p = strstr(dom, needle);
  }
  if (!p)
    fail_msg("the self-test log has no '%s'", key);
  p += strlen(needle);
  return strndup(p, strcspn(p, "\n<"));
}

/* The text from `start` to the first `end` after it, both included (malloc'd). */
static char *region(const char *text, const char *start, const char *end) {
  const char *a = strstr(text, start);
  if (!a)
    fail_msg("the page has no '%s'", start);
  const char *b = strstr(a, end);
  if (!b)
    fail_msg("nothing ends '%s' with '%s'", start, end);
  return strndup(a, (size_t)(b - a) + strlen(end));
}

static void assert_contains(const char *text, const char *needle) {
  if (!strstr(text, needle))
    fail_msg("'%s' is not in: %.3000s", needle, text);
}

static size_t count_of(const char *text, const char *needle) {
  size_t n = 0;
  for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
    n++;
  return n;
}

/* Timeline points the page draws for a model: one before the first event and
 * one after each, for every device with a history. */
static size_t expected_points(const snapshot_t *s) {
  size_t n = 0;
  for (size_t i = 0; i < s->ntraces; i++)
    n += s->traces[i].nevents ? s->traces[i].nevents + 1 : 0;
  return n;
}

static bool close_to(double a, double b) {
  return fabs(a - b) <= 1e-9 * fmax(1.0, fmax(fabs(a), fabs(b)));
}

/* ---- fixtures ---- */

/* B: a live allocator's snapshot with history and stacks, as the pickle
 * gca_snapshot_pickle writes (PyTorch's fields). */
static void write_live_pickle(const char *path) {
  const gca_device_ops_t *dev = test_backend();
  gca_stream_t stream;
  assert_ok(dev->stream_create(0, GCA_STREAM_NON_BLOCKING, 0, &stream));
  assert_ok(gca_record_history(true, 10000, true));
  void *small = NULL, *large = NULL, *gone = NULL;
  assert_ok(gca_malloc(&small, 1000, stream));
  assert_ok(gca_malloc(&large, 5u << 20, stream));
  assert_ok(gca_malloc(&gone, 3u << 20, stream));
  assert_ok(gca_free(gone));
  char *pk = NULL;
  size_t len = 0;
  assert_ok(gca_snapshot_pickle(&pk, &len));
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(pk, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
  gca_string_free(pk);
  assert_ok(gca_record_history(false, 0, false));
  assert_ok(gca_free(small));
  assert_ok(gca_free(large));
  assert_ok(gca_empty_cache());
  assert_ok(dev->stream_destroy(stream));
}

static int group_setup(void **state) {
  (void)state;
  snprintf(dir, sizeof(dir), "/tmp/gca-snapshot-page-XXXXXX");
  if (!mkdtemp(dir))
    return -1;
  snprintf(page_a, sizeof(page_a), "%s/a.html", dir);
  snprintf(page_b, sizeof(page_b), "%s/b.html", dir);
  snprintf(page_ab, sizeof(page_ab), "%s/ab.html", dir);
  snprintf(pickle_b, sizeof(pickle_b), "%s/b.pickle", dir);
  write_live_pickle(pickle_b);
  write_page(page_a, snapshot_path, NULL);
  write_page(page_b, pickle_b, NULL);
  write_page(page_ab, snapshot_path, pickle_b);
  if (gca__snapshot_load_file(snapshot_path, &model_a) != GCA_OK ||
      gca__snapshot_load_file(pickle_b, &model_b) != GCA_OK) {
    fprintf(stderr, "loading the models failed: %s\n", tool_last_error());
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  gca__snapshot_free(&model_a);
  gca__snapshot_free(&model_b);
  char *out = NULL;
  char *rm[] = {"rm", "-rf", dir, NULL};
  int rc = test_run_capture(rm, &out);
  free(out);
  return rc;
}

/* ---- tests ---- */

static void page_draws_its_plots_in_headless_chromium(void **state) {
  (void)state;
  char *dom = dump_dom(page_a, NULL);
  assert_contains(dom, "data-gca-timeline-points=\"11\"");
  assert_contains(dom, "data-gca-segment-rects=\"5\"");
  assert_contains(dom, "class=\"allocated\"");
  assert_contains(dom, "class=\"reserved\"");
  assert_contains(dom, "make_buffer (model.c:42)");
  assert_contains(dom, "load_weights (weights.c:3)");
  /* the whole history in view: 100..190 us, from the first event */
  double a, b;
  view_of(dom, 0, &a, &b);
  assert_true(a == 0 && b == 90);
  assert_contains(dom, "data-gca-visible-points=\"11\"");
  assert_null(strstr(dom, "id=\"gca-selftest-log\""));
  free(dom);
}

/* One wheel step towards zooming in, at 30% and at 80% of the plot's width:
 * the new range lies strictly inside the old one, and the time under the
 * pointer stays where it was on the screen (same fraction of the range). */
static void wheel_zoom_narrows_the_range_about_the_pointer(void **state) {
  (void)state;
  static const double fractions[] = {0.3, 0.8};
  for (size_t i = 0; i < GCA_ARRAY_SIZE(fractions); i++) {
    char frag[32];
    snprintf(frag, sizeof(frag), "zoom:%g", fractions[i]);
    char *dom = dump_dom(page_a, frag);
    double a0, b0, c, a1, b1;
    log_values(dom, "zoom.before", &a0, &b0);
    log_values(dom, "zoom.cursor", &c, NULL);
    view_of(dom, 0, &a1, &b1);
    assert_true(a0 == 0 && b0 == 90);
    assert_true(close_to(c, a0 + fractions[i] * (b0 - a0)));
    if (!(a0 < a1 && a1 < c && c < b1 && b1 < b0))
      fail_msg("zoom at %g: [%g, %g] -> [%g, %g] is not strictly inside about %g", fractions[i], a0,
               b0, a1, b1, c);
    if (!close_to((c - a1) / (b1 - a1), fractions[i]))
      fail_msg("zoom at %g: the pointer's time %g moved to fraction %g", fractions[i], c,
               (c - a1) / (b1 - a1));
    assert_true(attr_number(dom, "data-gca-visible-points", 0) < 11);
    char *hit = log_text(dom, "zoom.hit");
    assert_non_null(strstr(hit, " in svg.timeline"));
    free(hit);
    free(dom);
  }
}

/* After a zoom: a drag of 100 pixels to the left moves the range right by
 * 100 pixels' worth of time; + and - zoom by 1.5 about the middle, the arrows
 * move by a tenth of the width, and Reset zoom shows the whole history. */
static void drag_and_keys_pan_and_zoom_and_reset_shows_all(void **state) {
  (void)state;
  char *dom = dump_dom(page_a, "zoom:0.5,pan:-100,keys");
  double a, b, pa, pb, w;
  log_values(dom, "pan.before", &a, &b);
  log_values(dom, "pan.after", &pa, &pb);
  w = b - a;
  assert_true(w < 90);
  double plot_px = attr_number(dom, "data-gca-plot-width", 0);
  assert_true(close_to(pb - pa, w));
  assert_true(close_to(pa, a + 100 * w / plot_px));
  double k0, k1, x0, x1;
  log_values(dom, "keys.before", &k0, &k1);
  assert_true(close_to(k0, pa) && close_to(k1, pb));
  log_values(dom, "keys.+", &x0, &x1);
  assert_true(close_to(x1 - x0, w / 1.5) && close_to(x0 + x1, k0 + k1));
  log_values(dom, "keys.ArrowRight", &k0, &k1);
  assert_true(close_to(k0, x0 + (x1 - x0) / 10) && close_to(k1, x1 + (x1 - x0) / 10));
  log_values(dom, "keys.-", &x0, &x1);
  assert_true(close_to(x1 - x0, (k1 - k0) * 1.5) && close_to(x0 + x1, k0 + k1));
  log_values(dom, "keys.ArrowLeft", &k0, &k1);
  assert_true(close_to(k0, x0 - (x1 - x0) / 10) && close_to(k1, x1 - (x1 - x0) / 10));
  log_values(dom, "keys.reset", &k0, &k1);
  assert_true(k0 == 0 && k1 == 90);
  view_of(dom, 0, &k0, &k1);
  assert_true(k0 == 0 && k1 == 90);
  free(dom);
}

/* The detail panel after hovering the block at `addr`: that block's figures
 * (from the model) and its frames, and no other block's frames. */
static void check_block_detail(const snapshot_t *s, const char *page, uint64_t addr, size_t snap,
                               const char *frames, const char *not_frames) {
  char frag[64], want[256];
  snprintf(frag, sizeof(frag), "hover-block:0x%" PRIx64 "@%zu", addr, snap);
  char *dom = dump_dom(page, frag);
  char *hit = log_text(dom, "hover-block.hit");
  assert_int_equal(strncmp(hit, "rect.block.", 11), 0);
  assert_non_null(strstr(hit, " in svg.segments"));
  free(hit);
  char *panel = region(dom, "<div id=\"gca-detail\"", "</div>");
  assert_contains(panel, "data-gca-detail=\"block\"");
  const snap_block_t *b = NULL;
  for (size_t i = 0; i < s->nblocks; i++)
    if (s->blocks[i].address == addr)
      b = &s->blocks[i];
  assert_non_null(b);
  snprintf(want, sizeof(want), "<th>size</th><td>%" PRIu64 " (", b->size);
  assert_contains(panel, want);
  snprintf(want, sizeof(want), "<th>requested</th><td>%" PRIu64 " (", b->requested_size);
  assert_contains(panel, want);
  snprintf(want, sizeof(want), "<th>address</th><td>0x%" PRIx64 "</td>", addr);
  assert_contains(panel, want);
  snprintf(want, sizeof(want), "<th>stream</th><td>0x%" PRIx64 "</td>",
           s->segments[b->segment].stream);
  assert_contains(panel, want);
  snprintf(want, sizeof(want), "<th>block</th><td>%s</td>", gca__snapshot_state_name(b->state));
  assert_contains(panel, want);
  assert_contains(panel, frames);
  if (not_frames)
    assert_null(strstr(panel, not_frames));
  free(panel);
  free(dom);
}

static void hovering_a_block_shows_its_size_address_stream_and_frames(void **state) {
  (void)state;
  check_block_detail(&model_a, page_a, 0x7f0000000000ull, 0,
                     "<pre>make_buffer (model.c:42)\nmain (main.c:7)</pre>", "load_weights");
  check_block_detail(&model_a, page_a, 0x7f0000200000ull, 0,
                     "<pre>load_weights (weights.c:3)</pre>", "make_buffer");
  check_block_detail(&model_a, page_a, 0x7f0000100000ull, 0, "(no frames recorded)", "make_buffer");
}

/* Hovering the timeline at an event's time, after a zoom (so the pointer's
 * position goes through the zoomed range), shows that event. */
static void hovering_the_timeline_shows_the_event_under_the_pointer(void **state) {
  (void)state;
  char *dom = dump_dom(page_a, "zoom:0.3,hover-event:4");
  char *panel = region(dom, "<div id=\"gca-detail\"", "</div>");
  assert_contains(panel, "data-gca-detail=\"event\"");
  assert_contains(panel, "<th>event</th><td>alloc (#4 on device 0)</td>");
  assert_contains(panel, "<th>time</th><td>0.040 ms from the first event (time_us 140)</td>");
  assert_contains(panel, "<th>size</th><td>8000000 (7.63 MiB)</td>");
  assert_contains(panel, "<th>address</th><td>0x7f0000200000</td>");
  assert_contains(panel, "<th>stream</th><td>0x1</td>");
  assert_contains(panel, "<th>allocated after</th><td>9524288 (");
  assert_contains(panel, "<pre>load_weights (weights.c:3)</pre>");
  assert_contains(dom, "visibility=\"visible\" class=\"marker\"");
  free(panel);
  free(dom);
  dom = dump_dom(page_a, "hover-event:6");
  panel = region(dom, "<div id=\"gca-detail\"", "</div>");
  assert_contains(panel, "<th>event</th><td>free_requested (#6 on device 0)</td>");
  assert_contains(panel, "<th>size</th><td>12582912 (12.00 MiB)</td>");
  assert_contains(panel, "<th>address</th><td>0x7f0000a00000</td>");
  assert_contains(panel, "(no frames recorded)");
  free(panel);
  free(dom);
}

/* The list after a click on segment `seg` of s in snapshot `snap`: exactly
 * its blocks, in order, each with address, size, state and stream. */
static void check_segment_list(const snapshot_t *s, const char *page, size_t snap, size_t seg) {
  const snap_segment_t *sg = &s->segments[seg];
  char frag[64], want[320];
  snprintf(frag, sizeof(frag), "click-segment:0x%" PRIx64 "@%zu", sg->address, snap);
  char *dom = dump_dom(page, frag);
  snprintf(want, sizeof(want), "<div class=\"seglist\" data-gca-segment=\"0x%" PRIx64 "\"",
           sg->address);
  char *list = region(dom, want, "</div>");
  snprintf(want, sizeof(want), "data-gca-blocks=\"%zu\"", sg->nblocks);
  assert_contains(list, want);
  assert_int_equal(count_of(list, "<tr class=\"block-row\">"), sg->nblocks);
  const char *at = list;
  for (size_t j = 0; j < sg->nblocks; j++) {
    const snap_block_t *b = &s->blocks[sg->first_block + j];
    snprintf(want, sizeof(want),
             "<tr class=\"block-row\"><td>0x%" PRIx64 "</td><td class=\"n\">%" PRIu64 " (",
             b->address, b->size);
    const char *row = strstr(at, want);
    if (!row)
      fail_msg("block %zu of segment 0x%" PRIx64 " is not listed in order: %s", j, sg->address,
               list);
    snprintf(want, sizeof(want), "</td><td>%s</td><td>0x%" PRIx64 "</td></tr>",
             gca__snapshot_state_name(b->state), sg->stream);
    const char *tail = strstr(row, want);
    assert_non_null(tail);
    assert_true(tail < row + 200);
    at = tail;
  }
  /* only the clicked segment is selected */
  assert_int_equal(count_of(dom, "class=\"segment selected\""), 1);
  free(list);
  free(dom);
}

static void clicking_a_segment_lists_exactly_its_blocks(void **state) {
  (void)state;
  for (size_t i = 0; i < model_a.nsegments; i++)
    check_segment_list(&model_a, page_a, 0, i);
}

/* A (JSON) and B (a pickle) side by side: each section draws what the page
 * of that snapshot alone draws, which is what its model holds; the body
 * counts both; a zoom on A's timeline zooms B's to the same range; hover and
 * click reach B's section. A screenshot is kept as a test artifact. */
static void two_snapshots_are_drawn_side_by_side_on_one_time_axis(void **state) {
  (void)state;
  const snapshot_t *models[2] = {&model_a, &model_b};
  const char *pages[2] = {page_a, page_b};
  char *ab = dump_dom(page_ab, NULL);
  assert_contains(ab, "data-gca-snapshots=\"2\"");
  double total_points = 0, total_rects = 0;
  for (int i = 0; i < 2; i++) {
    char *alone = dump_dom(pages[i], NULL);
    double points = attr_number(alone, "data-gca-timeline-points", 0);
    double rects = attr_number(alone, "data-gca-segment-rects", 0);
    assert_true(points == (double)expected_points(models[i]));
    assert_true(rects == (double)models[i]->nblocks);
    char start[64];
    snprintf(start, sizeof(start), "<section class=\"snapshot\" data-index=\"%d\"", i);
    char *sec = region(ab, start, ">");
    if (attr_number(sec, "data-gca-timeline-points", 0) != points ||
        attr_number(sec, "data-gca-segment-rects", 0) != rects)
      fail_msg("snapshot %d: side by side %s, alone %g points and %g rects", i, sec, points, rects);
    total_points += points;
    total_rects += rects;
    free(sec);
    free(alone);
  }
  /* <body> counts both; the body's attributes come first in the dump */
  assert_true(attr_number(ab, "data-gca-timeline-points", 0) == total_points);
  assert_true(attr_number(ab, "data-gca-segment-rects", 0) == total_rects);
  assert_int_equal(count_of(ab, "class=\"timeline\""), 2);
  assert_true(model_b.ntraces >= 1 && model_b.traces[0].nevents >= 5);
  free(ab);

  /* one time axis: zooming A's timeline zooms B's to the same range */
  ab = dump_dom(page_ab, "zoom:0.3");
  double a0, b0, a1, b1, c0, d0;
  log_values(ab, "zoom.before", &c0, &d0);
  view_of(ab, 0, &a0, &b0);
  view_of(ab, 1, &a1, &b1);
  assert_true(a0 == a1 && b0 == b1);
  assert_true(c0 < a0 && a0 < b0 && b0 < d0);
  free(ab);

  /* B's largest block, hovered in B's section, and a segment of B clicked */
  size_t idx[1];
  assert_int_equal(gca__snapshot_largest(&model_b, idx, 1), 1);
  const snap_block_t *big = &model_b.blocks[idx[0]];
  assert_true(big->nframes > 0);
  check_block_detail(&model_b, page_ab, big->address, 1, "<pre>", NULL);
  check_segment_list(&model_b, page_ab, 1, big->segment);

  char png[512], arg[600], frag[160];
  snprintf(png, sizeof(png), "%s/snapshot_view_side_by_side.png", artifact_dir);
  snprintf(arg, sizeof(arg), "--screenshot=%s", png);
  snprintf(frag, sizeof(frag), "zoom:0.3,click-segment:0x7f0000000000,hover-block:0x%" PRIx64 "@1",
           big->address);
  unlink(png);
  free(chromium_run(page_ab, frag, arg));
  struct stat st;
  if (stat(png, &st) != 0)
    fail_msg("no screenshot at %s", png);
  FILE *f = fopen(png, "rb");
  assert_non_null(f);
  unsigned char sig[8];
  assert_int_equal(fread(sig, 1, sizeof(sig), f), sizeof(sig));
  fclose(f);
  assert_memory_equal(sig, "\x89PNG\r\n\x1a\n", 8);
  assert_true(st.st_size > 20000);
  printf("screenshot of the side-by-side page: %s (%lld bytes)\n", png, (long long)st.st_size);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s SNAPSHOT.json GCA_SNAPSHOT_BINARY ARTIFACT_DIR\n", argv[0]);
    return 1;
  }
  snapshot_path = argv[1];
  tool_path = argv[2];
  artifact_dir = argv[3];
  chromium = find_chromium();
  if (!chromium) {
    printf("SKIP: chromium is not installed (apt-get install chromium, or set GCA_CHROMIUM)\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(page_draws_its_plots_in_headless_chromium),
      cmocka_unit_test(wheel_zoom_narrows_the_range_about_the_pointer),
      cmocka_unit_test(drag_and_keys_pan_and_zoom_and_reset_shows_all),
      cmocka_unit_test(hovering_a_block_shows_its_size_address_stream_and_frames),
      cmocka_unit_test(hovering_the_timeline_shows_the_event_under_the_pointer),
      cmocka_unit_test(clicking_a_segment_lists_exactly_its_blocks),
      cmocka_unit_test(two_snapshots_are_drawn_side_by_side_on_one_time_axis),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
