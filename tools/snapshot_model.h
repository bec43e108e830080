/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot_model.h - gca-snapshot's in-memory view of a snapshot JSON
 * (PyTorch's fields: segments with their blocks, device_traces, frames) and
 * the figures both renderers print.
 *
 * The loader validates once and copies what the renderers need into flat
 * arrays, so the text and HTML renderers never see JSON and never fail on a
 * missing field. The timeline is computed backwards from the snapshot's own
 * state: the history ring may have dropped its oldest events, but the bytes
 * allocated and reserved at the moment of the snapshot are known exactly, so
 * each earlier point is the next one minus the event between them. As in
 * PyTorch's traces, alloc and free_requested events carry the requested size,
 * so "allocated" on the timeline counts requested bytes of live blocks.
 */
#ifndef GCA_TOOLS_SNAPSHOT_MODEL_H
#define GCA_TOOLS_SNAPSHOT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util.h"

typedef enum snap_state {
  SNAP_ACTIVE_ALLOCATED = 0,
  SNAP_ACTIVE_PENDING_FREE = 1,
  SNAP_INACTIVE = 2,
  SNAP_STATES = 3,
} snap_state_t;

typedef struct snap_frame {
  char *name;     /* function, or "" */
  char *filename; /* or "" */
  int64_t line;   /* 0 when unknown */
} snap_frame_t;

typedef struct snap_block {
  uint64_t address;
  uint64_t size;
  uint64_t requested_size; /* absent in the JSON: size for live blocks, 0 for inactive */
  snap_state_t state;
  size_t segment;       /* index into snapshot.segments */
  snap_frame_t *frames; /* the block's own, else its latest alloc event's */
  size_t nframes;
} snap_block_t;

/* Invariant: blocks[first_block, first_block + nblocks) are this segment's,
 * in the document's order. */
typedef struct snap_segment {
  int64_t device;
  uint64_t address;
  uint64_t total_size;
  uint64_t stream;
  bool is_large;
  bool is_expandable;
  size_t first_block;
  size_t nblocks;
} snap_segment_t;

typedef enum snap_action {
  SNAP_EV_ALLOC,
  SNAP_EV_FREE_REQUESTED,
  SNAP_EV_FREE_COMPLETED,
  SNAP_EV_SEGMENT_ALLOC,
  SNAP_EV_SEGMENT_FREE,
  SNAP_EV_SEGMENT_MAP,
  SNAP_EV_SEGMENT_UNMAP,
  SNAP_EV_SNAPSHOT, /* this and what follows: no change in bytes */
  SNAP_EV_OOM,
  SNAP_EV_OTHER, /* an action the loader does not know */
  SNAP_ACTIONS,
} snap_action_t;

/* One history event with the totals after it (filled by the loader). */
typedef struct snap_event {
  snap_action_t action;
  uint64_t addr;
  uint64_t size;
  uint64_t stream; /* 0 when absent */
  double time_us;  /* event index when the trace carries no times */
  int64_t allocated_after;
  int64_t reserved_after;
  snap_frame_t *frames; /* as recorded with the event; NULL when none */
  size_t nframes;
} snap_event_t;

/* A device's history. Invariant: allocated_before/reserved_before plus every
 * event's change gives the device's totals at snapshot time. */
typedef struct snap_trace {
  int64_t device;
  snap_event_t *events;
  size_t nevents;
  int64_t allocated_before;
  int64_t reserved_before;
  int64_t peak_allocated; /* requested bytes; over before and every event */
  int64_t peak_reserved;
  bool has_times;
} snap_trace_t;

typedef struct snapshot {
  snap_segment_t *segments;
  size_t nsegments;
  snap_block_t *blocks;
  size_t nblocks;
  snap_trace_t *traces;
  size_t ntraces;
  uint64_t reserved;              /* sum of segment total_size */
  uint64_t by_state[SNAP_STATES]; /* sum of block sizes per state */
  uint64_t count_by_state[SNAP_STATES];
  uint64_t requested; /* sum of requested_size of active_allocated blocks */
  size_t ndevices;    /* distinct devices among segments */
} snapshot_t;

/* ---- snapshot_model.c ---- */

/* Parses and validates snapshot JSON text into *out. GCA_ERR_PARSE with the
 * parser's line/column for malformed JSON, or naming the missing or mistyped
 * field and where it is ("segments[2].blocks[0]: missing 'size'"). */
gca_status_t gca__snapshot_load(const char *text, size_t len, snapshot_t *out);
/* Reads a whole file (GCA_ERR_IO naming it) and loads it. */
gca_status_t gca__snapshot_load_file(const char *path, snapshot_t *out);
void gca__snapshot_free(snapshot_t *s);
/* "active_allocated", "active_pending_free", "inactive". */
const char *gca__snapshot_state_name(snap_state_t state);
/* PyTorch's name of the action ("alloc", "segment_map", "oom", ...); "other"
 * for SNAP_EV_OTHER. */
const char *gca__snapshot_action_name(snap_action_t action);
/* Indices of the `max` largest active_allocated blocks, largest first (ties:
 * lower address first), into idx[]; returns how many. */
size_t gca__snapshot_largest(const snapshot_t *s, size_t *idx, size_t max);

/* ---- snapshot_text.c ---- */

/* The plain summary: totals by state, segments, the `top` largest live blocks
 * with their frames, and each device's history figures. */
void gca__snapshot_write_text(const snapshot_t *s, size_t top, FILE *f);

/* ---- snapshot_html.c ---- */

/* A self-contained page (inline CSS, JS and SVG; no fetches) showing, for
 * each of the n snapshots side by side, the timeline, the segment map and the
 * `top` largest live blocks, explorable (zoom and pan, hover details, a
 * clicked segment's blocks). titles[i] names snaps[i]. GCA_ERR_IO when
 * writing fails; GCA_ERR_OUT_OF_MEMORY when the page's stack table does not
 * fit. */
gca_status_t gca__snapshot_write_html(const snapshot_t *snaps, const char *const *titles, size_t n,
                                      size_t top, FILE *f);

#endif
