/* SPDX-License-Identifier: Apache-2.0 */
/* test_rmm_csv.c - the RMM log CSV reader: valid traces parse field by field,
 * each kind of malformed input fails with GCA_ERR_PARSE naming its line, and
 * the file reader (buffer refills) agrees with the memory reader. */
#include "gca.h"
#include "support.h"
#include "tool_assert.h"

#include <unistd.h>

#include "rmm_csv.h"

#define HEADER GCA_RMM_HEADER "\n"

/* Reads all of `text`; returns the final status, events in ev[0, *n). */
static gca_status_t read_text(const char *text, gca_rmm_event_t *ev, size_t cap, size_t *n) {
  gca_rmm_reader_t *r = NULL;
  *n = 0;
  gca_status_t st = gca__rmm_open_memory(text, strlen(text), "t.csv", &r);
  if (st != GCA_OK)
    return st;
  for (;;) {
    gca_rmm_event_t e;
    bool eof = false;
    st = gca__rmm_next(r, &e, &eof);
    if (st != GCA_OK || eof)
      break;
    if (*n < cap)
      ev[*n] = e;
    (*n)++;
  }
  gca__rmm_close(r);
  return st;
}

static void valid_rows_parse_exactly(void **state) {
  const char *text = HEADER "7,01:02:03.000456,allocate,0xb08200000,8519680,0x0\n"
                            "140202898593536,13:56:46:5,free,0xB08200000,8519680,0x7fA0\n"
                            "3,00:00:00.123456789,allocate failure,0x0,18446744073709551615,"
                            "0xffffffffffffffff\n";
  gca_rmm_event_t ev[4];
  size_t n = 0;
  assert_ok(read_text(text, ev, 4, &n));
  assert_int_equal(n, 3);
  assert_int_equal(ev[0].line, 2);
  assert_int_equal(ev[0].thread, 7);
  assert_int_equal(ev[0].time_ns, (3600ull + 120 + 3) * 1000000000ull + 456000ull);
  assert_int_equal(ev[0].action, GCA_RMM_ALLOCATE);
  assert_int_equal(ev[0].pointer, 0xb08200000ull);
  assert_int_equal(ev[0].size, 8519680);
  assert_int_equal(ev[0].stream, 0);
  assert_int_equal(ev[1].line, 3);
  assert_int_equal(ev[1].thread, 140202898593536ull);
  assert_int_equal(ev[1].time_ns, (13 * 3600ull + 56 * 60 + 46) * 1000000000ull + 500000000ull);
  assert_int_equal(ev[1].action, GCA_RMM_FREE);
  assert_int_equal(ev[1].pointer, 0xb08200000ull);
  assert_int_equal(ev[1].stream, 0x7fa0);
  assert_int_equal(ev[2].action, GCA_RMM_ALLOCATE_FAILURE);
  assert_int_equal(ev[2].time_ns, 123456789ull);
  assert_true(ev[2].size == UINT64_MAX);
  assert_true(ev[2].stream == UINT64_MAX);
  assert_string_equal(gca__rmm_action_name(ev[2].action), "allocate failure");
}

static void crlf_blank_lines_spaces_and_missing_final_newline_are_accepted(void **state) {
  const char *text = GCA_RMM_HEADER "\r\n\r\n"
                                    "1, 00:00:01.5 ,allocate, 0x10 ,4096,0x0\r\n"
                                    "   \n"
                                    "1,00:00:02,free,10,4096,0";
  gca_rmm_event_t ev[4];
  size_t n = 0;
  assert_ok(read_text(text, ev, 4, &n));
  assert_int_equal(n, 2);
  assert_int_equal(ev[0].line, 3);
  assert_int_equal(ev[0].time_ns, 1500000000ull);
  assert_int_equal(ev[0].pointer, 0x10);
  assert_int_equal(ev[1].line, 5);
  assert_int_equal(ev[1].pointer, 0x10);
  assert_int_equal(ev[1].time_ns, 2000000000ull);
}

static void header_only_is_an_empty_trace(void **state) {
  gca_rmm_event_t ev[1];
  size_t n = 7;
  assert_ok(read_text(HEADER, ev, 1, &n));
  assert_int_equal(n, 0);
  assert_ok(read_text("\xef\xbb\xbf" GCA_RMM_HEADER, ev, 1, &n));
  assert_int_equal(n, 0);
}

static void bad_header_fails_on_line_1(void **state) {
  gca_rmm_event_t ev[1];
  size_t n;
  assert_tool_status(read_text("Thread,Time,Action,Pointer,Size\n1,0:0:0,free,0x1,1\n", ev, 1, &n),
                     GCA_ERR_PARSE, "line 1: bad header 'Thread,Time,Action,Pointer,Size'");
  assert_tool_status(read_text("", ev, 1, &n), GCA_ERR_PARSE, "line 1: bad header");
  assert_tool_status(read_text("1,00:00:00.0,allocate,0x1,1,0x0\n", ev, 1, &n), GCA_ERR_PARSE,
                     "t.csv line 1: bad header");
}

static void missing_column_names_line_and_column(void **state) {
  gca_rmm_event_t ev[2];
  size_t n;
  assert_tool_status(
      read_text(HEADER "1,00:00:00.0,allocate,0x1,1,0x0\n1,00:00:00.0,free,0x1\n", ev, 2, &n),
      GCA_ERR_PARSE, "line 3: missing column Size (found 4 of 6");
  assert_int_equal(n, 1);
  assert_tool_status(read_text(HEADER "1\n", ev, 2, &n), GCA_ERR_PARSE,
                     "line 2: missing column Time");
}

static void extra_column_fails(void **state) {
  gca_rmm_event_t ev[1];
  size_t n;
  assert_tool_status(read_text(HEADER "1,00:00:00.0,free,0x1,1,0x0,9\n", ev, 1, &n), GCA_ERR_PARSE,
                     "line 2: more than 6 columns");
}

static void non_hex_pointer_fails(void **state) {
  gca_rmm_event_t ev[1];
  size_t n;
  assert_tool_status(read_text(HEADER "\n1,00:00:00.0,allocate,0xb08g00000,1,0x0\n", ev, 1, &n),
                     GCA_ERR_PARSE, "line 3: Pointer '0xb08g00000' is not a hex number");
  assert_tool_status(read_text(HEADER "1,00:00:00.0,allocate,0x,1,0x0\n", ev, 1, &n), GCA_ERR_PARSE,
                     "line 2: Pointer '0x' is not a hex number");
  assert_tool_status(
      read_text(HEADER "1,00:00:00.0,allocate,0x11112222333344445,1,0x0\n", ev, 1, &n),
      GCA_ERR_PARSE, "does not fit in 64 bits");
  assert_tool_status(read_text(HEADER "1,00:00:00.0,allocate,0x1,1,stream0\n", ev, 1, &n),
                     GCA_ERR_PARSE, "line 2: Stream 'stream0' is not a hex number");
}

static void negative_or_non_numeric_size_fails(void **state) {
  gca_rmm_event_t ev[1];
  size_t n;
  assert_tool_status(read_text(HEADER "1,00:00:00.0,allocate,0x1,-512,0x0\n", ev, 1, &n),
                     GCA_ERR_PARSE, "line 2: Size '-512' is negative");
  assert_tool_status(read_text(HEADER "1,00:00:00.0,allocate,0x1,12ab,0x0\n", ev, 1, &n),
                     GCA_ERR_PARSE, "line 2: Size '12ab' is not a decimal number");
  assert_tool_status(read_text(HEADER "1,00:00:00.0,allocate,0x1,,0x0\n", ev, 1, &n), GCA_ERR_PARSE,
                     "line 2: Size is empty");
  assert_tool_status(
      read_text(HEADER "1,00:00:00.0,allocate,0x1,18446744073709551616,0x0\n", ev, 1, &n),
      GCA_ERR_PARSE, "does not fit in 64 bits");
}

static void unknown_action_fails(void **state) {
  gca_rmm_event_t ev[1];
  size_t n;
  assert_tool_status(read_text(HEADER "1,00:00:00.0,allocate,0x1,1,0x0\n\n1,00:00:00.0,"
                                      "deallocate,0x1,1,0x0\n",
                               ev, 1, &n),
                     GCA_ERR_PARSE, "line 4: unknown action 'deallocate'");
  assert_int_equal(n, 1);
}

static void bad_time_or_thread_fails(void **state) {
  gca_rmm_event_t ev[1];
  size_t n;
  assert_tool_status(read_text(HEADER "1,00:61:00.0,free,0x1,1,0x0\n", ev, 1, &n), GCA_ERR_PARSE,
                     "line 2: Time '00:61:00.0' is not HH:MM:SS.ffffff");
  assert_tool_status(read_text(HEADER "1,00:00:00.,free,0x1,1,0x0\n", ev, 1, &n), GCA_ERR_PARSE,
                     "line 2: Time");
  assert_tool_status(read_text(HEADER "x1,00:00:00.0,free,0x1,1,0x0\n", ev, 1, &n), GCA_ERR_PARSE,
                     "line 2: Thread 'x1' is not a decimal number");
}

static void over_long_line_fails_in_memory_and_file(void **state) {
  size_t len = strlen(HEADER) + 3 * GCA_RMM_MAX_LINE;
  char *text = malloc(len + 1);
  assert_non_null(text);
  strcpy(text, HEADER "1,00:00:00.0,allocate,0x1,1,0x0\n1,00:00:00.0,allocate,0x2,");
  size_t used = strlen(text);
  memset(text + used, '9', len - used);
  text[len] = '\0';
  gca_rmm_event_t ev[2];
  size_t n;
  assert_tool_status(read_text(text, ev, 2, &n), GCA_ERR_PARSE, "line 3: longer than 1024 bytes");
  assert_int_equal(n, 1);
  FILE *f = fmemopen(text, len, "rb");
  assert_non_null(f);
  gca_rmm_reader_t *r = NULL;
  assert_ok(gca__rmm_open_stdio(f, "f.csv", true, &r));
  gca_rmm_event_t e;
  bool eof = false;
  assert_ok(gca__rmm_next(r, &e, &eof));
  assert_tool_status(gca__rmm_next(r, &e, &eof), GCA_ERR_PARSE, "f.csv line 3: longer than");
  gca__rmm_close(r);
  free(text);
}

static void reader_stays_failed_after_an_error(void **state) {
  const char *text = HEADER "1,00:00:00.0,alloc,0x1,1,0x0\n1,00:00:00.0,free,0x1,1,0x0\n";
  gca_rmm_reader_t *r = NULL;
  assert_ok(gca__rmm_open_memory(text, strlen(text), "t.csv", &r));
  gca_rmm_event_t e;
  bool eof = false;
  assert_tool_status(gca__rmm_next(r, &e, &eof), GCA_ERR_PARSE, "line 2: unknown action");
  assert_tool_status(gca__rmm_next(r, &e, &eof), GCA_ERR_PARSE, "reading past an error at line 2");
  gca__rmm_close(r);
}

static void missing_file_is_an_io_error_naming_the_path(void **state) {
  gca_rmm_reader_t *r = NULL;
  assert_tool_status(gca__rmm_open_file("/nonexistent/trace.csv", &r), GCA_ERR_IO,
                     "cannot open /nonexistent/trace.csv");
  assert_null(r);
}

/* A trace larger than the file buffer: every row comes back exactly and an
 * error deep in the file reports its exact line. */
static void file_reader_crosses_buffer_refills(void **state) {
  char path[] = "/tmp/gca-rmm-csv-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  const size_t rows = 20000, bad = 17777;
  fputs(HEADER, f);
  for (size_t i = 0; i < rows; i++) {
    if (i + 2 == bad)
      fputs("1,00:00:00.0,allocate,0xnothex,1,0x0\n", f);
    else
      fprintf(f, "%zu,00:00:%02zu.%06zu,%s,0x%zx,%zu,0x%zx\n", i % 5, i % 60, i,
              i % 2 ? "free" : "allocate", 0x1000 + i / 2 * 512, i * 3, i % 3);
  }
  fclose(f);
  gca_rmm_reader_t *r = NULL;
  assert_ok(gca__rmm_open_file(path, &r));
  size_t i = 0;
  gca_status_t st;
  for (;; i++) {
    gca_rmm_event_t e;
    bool eof = false;
    st = gca__rmm_next(r, &e, &eof);
    if (st != GCA_OK || eof)
      break;
    assert_int_equal(e.line, i + 2);
    assert_int_equal(e.thread, i % 5);
    assert_int_equal(e.time_ns, (i % 60) * 1000000000ull + i * 1000ull);
    assert_int_equal(e.action, i % 2 ? GCA_RMM_FREE : GCA_RMM_ALLOCATE);
    assert_int_equal(e.pointer, 0x1000 + i / 2 * 512);
    assert_int_equal(e.size, i * 3);
    assert_int_equal(e.stream, i % 3);
  }
  assert_int_equal(st, GCA_ERR_PARSE);
  assert_non_null(strstr(tool_last_error(), "line 17777: Pointer '0xnothex'"));
  assert_int_equal(i, bad - 2);
  gca__rmm_close(r);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(valid_rows_parse_exactly),
      cmocka_unit_test(crlf_blank_lines_spaces_and_missing_final_newline_are_accepted),
      cmocka_unit_test(header_only_is_an_empty_trace),
      cmocka_unit_test(bad_header_fails_on_line_1),
      cmocka_unit_test(missing_column_names_line_and_column),
      cmocka_unit_test(extra_column_fails),
      cmocka_unit_test(non_hex_pointer_fails),
      cmocka_unit_test(negative_or_non_numeric_size_fails),
      cmocka_unit_test(unknown_action_fails),
      cmocka_unit_test(bad_time_or_thread_fails),
      cmocka_unit_test(over_long_line_fails_in_memory_and_file),
      cmocka_unit_test(reader_stays_failed_after_an_error),
      cmocka_unit_test(missing_file_is_an_io_error_naming_the_path),
      cmocka_unit_test(file_reader_crosses_buffer_refills),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
