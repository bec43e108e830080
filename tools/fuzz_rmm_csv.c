/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_rmm_csv.c - fuzz target for the RMM CSV reader, with its seeds and
 * alphabet for the standalone driver (fuzz_driver.h).
 *
 * The one idea: the same input read through the memory reader and through the
 * stdio reader (a different buffering path) must give the same events and the
 * same verdict, and every failure must name a line. Built with
 * -fsanitize=fuzzer it is a libFuzzer target; linked with fuzz_driver.c it
 * runs in the default test suite, under the sanitizers too.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_driver.h"
#include "rmm_csv.h"

static void die(const char *what, uint64_t line) {
  fprintf(stderr, "fuzz_rmm_csv: %s (line %llu): %s\n", what, (unsigned long long)line,
          tool_last_error());
  abort();
}

/* Reads every event; returns the final status and fills events[0, *n) up to cap. */
static gca_status_t read_all(gca_rmm_reader_t *r, gca_rmm_event_t *events, size_t cap, size_t *n) {
  uint64_t last_line = 1;
  *n = 0;
  for (;;) {
    gca_rmm_event_t ev;
    bool eof = false;
    gca_status_t st = gca__rmm_next(r, &ev, &eof);
    if (st != GCA_OK) {
      if (st != GCA_ERR_PARSE && st != GCA_ERR_IO)
        die("unexpected status", gca__rmm_line(r));
      if (!strstr(tool_last_error(), "line "))
        die("error detail names no line", gca__rmm_line(r));
      if (gca__rmm_next(r, &ev, &eof) == GCA_OK)
        die("reader went on after an error", gca__rmm_line(r));
      return st;
    }
    if (eof)
      return GCA_OK;
    if (ev.line <= last_line || ev.line != gca__rmm_line(r))
      die("line numbers out of order", ev.line);
    if (ev.action != GCA_RMM_ALLOCATE && ev.action != GCA_RMM_FREE &&
        ev.action != GCA_RMM_ALLOCATE_FAILURE)
      die("bad action", ev.line);
    last_line = ev.line;
    if (*n < cap)
      events[*n] = ev;
    (*n)++;
  }
}

#define CMP_EVENTS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gca_rmm_event_t a[CMP_EVENTS], b[CMP_EVENTS];
  size_t na = 0, nb = 0;
  gca_rmm_reader_t *r = NULL;
  gca_status_t sa = gca__rmm_open_memory(data, size, "fuzz", &r);
  if (sa == GCA_OK) {
    sa = read_all(r, a, CMP_EVENTS, &na);
    gca__rmm_close(r);
  } else if (!strstr(tool_last_error(), "line 1")) {
    die("open error names no line", 1);
  }
  if (size == 0)
    return 0;
  FILE *f = fmemopen((void *)data, size, "rb");
  if (!f)
    return 0;
  gca_status_t sb = gca__rmm_open_stdio(f, "fuzz", true, &r);
  if (sb == GCA_OK) {
    sb = read_all(r, b, CMP_EVENTS, &nb);
    gca__rmm_close(r);
  } else {
    fclose(f);
  }
  if (sa != sb || na != nb)
    die("memory and stdio readers disagree", 0);
  for (size_t i = 0; i < na && i < CMP_EVENTS; i++) {
    if (a[i].line != b[i].line || a[i].thread != b[i].thread || a[i].time_ns != b[i].time_ns ||
        a[i].pointer != b[i].pointer || a[i].size != b[i].size || a[i].stream != b[i].stream ||
        a[i].action != b[i].action)
      die("memory and stdio readers parsed different events", a[i].line);
  }
  return 0;
}

static const char *const builtin_seeds[] = {
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "1,00:00:00.000000,allocate,0xb08200000,8519680,0x0\n"
    "1,00:00:00.000000,allocate,0xb08a20000,8519680,0x0\n"
    "1,00:00:00.000000,allocate,0xb09240000,2359296,0x0\n"
    "1,00:00:00.000000,allocate,0xb0cc00000,31457280,0x0\n"
    "1,00:00:00.001520,free,0xb09240000,2359296,0x0\n"
    "1,00:00:00.001600,allocate failure,0x0,99999999999,0x7f00\n"
    "1,00:00:00.248181,free,0xb0ebffe00,4,0x0\n",
    "Thread,Time,Action,Pointer,Size,Stream\r\n"
    "140202898593536,13:56:46:538456,allocate,0x7f8374000000,256,0x5555deadbeef\r\n"
    "140202898593536,13:56:46:538460,free,0x7f8374000000,256,0x5555deadbeef\r\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0xzz,1,0x0\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0x10,-4,0x0\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,alloc,0x10,4,0x0\n",
    "Thread,Time,Action,Pointer,Size\n1,00:00:00.0,allocate,0x10,4\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,free,0x10\n\n\n",
    "Thread,Time,Action,Pointer,Size,Stream\n1,xx:00:00.0,free,0x10,1,0x0,extra\n",
};

const fuzz_target_t fuzz_target = {
    .name = "fuzz_rmm_csv",
    .seeds = builtin_seeds,
    .nseeds = TOOL_ARRAY_SIZE(builtin_seeds),
    .max_input = 16u << 10,
    .alphabet = ",\n\r-x0f9: .aA\t",
    .max_run = 64,
    .max_copies = 1,
    .long_run = "7", /* over-long fields and lines */
    .max_long_run = 1200,
};
