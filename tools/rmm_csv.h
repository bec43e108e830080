/* SPDX-License-Identifier: Apache-2.0 */
/* rmm_csv.h - a streaming reader for RMM's allocation log CSV, the trace format
 * gca records (GCA_TRACE) and gca-replay reads.
 *
 * The file is a header `Thread,Time,Action,Pointer,Size,Stream` and one event a
 * line: a decimal thread id, a time of day (HH:MM:SS.ffffff), an action
 * (`allocate`, `free`, `allocate failure`), a hex pointer, a decimal size and a
 * hex stream. The reader holds one bounded buffer and hands out one event at a
 * time, so a trace of any length is read in constant memory. Every malformed
 * line is GCA_ERR_PARSE with a detail that names the line number and what was
 * wrong; the reader then stays failed.
 */
#ifndef GCA_TOOLS_RMM_CSV_H
#define GCA_TOOLS_RMM_CSV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util.h"

#define GCA_RMM_HEADER "Thread,Time,Action,Pointer,Size,Stream"
/* Longest accepted line in bytes, line terminator excluded. */
#define GCA_RMM_MAX_LINE 1024

typedef enum gca_rmm_action {
  GCA_RMM_ALLOCATE = 0,
  GCA_RMM_FREE = 1,
  GCA_RMM_ALLOCATE_FAILURE = 2,
} gca_rmm_action_t;

typedef struct gca_rmm_event {
  uint64_t line;    /* 1-based line number in the input; the header is line 1 */
  uint64_t thread;  /* Thread column, decimal */
  uint64_t time_ns; /* Time column as nanoseconds since midnight */
  uint64_t pointer;
  uint64_t size;
  uint64_t stream;
  gca_rmm_action_t action;
} gca_rmm_event_t;

/* A reader over a file, a stdio stream or a memory range. */
typedef struct gca_rmm_reader gca_rmm_reader_t;

/* ---- rmm_csv.c ---- */

/* Opens `path` ("-" is stdin) and checks the header. GCA_ERR_IO naming the path
 * when it cannot be read; GCA_ERR_PARSE when the header is wrong. */
gca_status_t gca__rmm_open_file(const char *path, gca_rmm_reader_t **out);
/* Reads from an open stdio stream; with close_file the reader fcloses it when
 * closed. On failure the caller still owns f. */
gca_status_t gca__rmm_open_stdio(FILE *f, const char *name, bool close_file,
                                 gca_rmm_reader_t **out);
/* Reads from `data[0, len)` (not NUL-terminated, not copied: it must outlive the
 * reader); `name` labels error details. Checks the header as open_file does. */
gca_status_t gca__rmm_open_memory(const void *data, size_t len, const char *name,
                                  gca_rmm_reader_t **out);
/* Reads the next event into *ev. At the end of input returns GCA_OK with *eof
 * set and *ev untouched. Blank lines are skipped. */
gca_status_t gca__rmm_next(gca_rmm_reader_t *r, gca_rmm_event_t *ev, bool *eof);
/* Line number of the last line read (0 before the header). */
uint64_t gca__rmm_line(const gca_rmm_reader_t *r);
/* Closes the file when the reader owns it and frees the reader; NULL is a no-op. */
void gca__rmm_close(gca_rmm_reader_t *r);

/* Parses one data line s[0, len) (no terminator) numbered `line`; `name`
 * labels the detail. GCA_ERR_PARSE on any malformed field. */
gca_status_t gca__rmm_parse_line(const char *s, size_t len, uint64_t line, const char *name,
                                 gca_rmm_event_t *ev);
/* "allocate", "free", "allocate failure". */
const char *gca__rmm_action_name(gca_rmm_action_t action);

#endif
