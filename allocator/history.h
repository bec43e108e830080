/* SPDX-License-Identifier: Apache-2.0 */
/* history.h - what the allocator tells the recorders beside it: the bounded
 * history ring behind snapshots' device_traces, the RMM-CSV trace file
 * (GCA_TRACE=path.csv) and the public trace observers.
 *
 * The allocator calls gca__history_event() for every action below, with the
 * device's lock held; it returns at once when no recorder is on (one relaxed
 * atomic load), so the hot path pays nothing when history, tracing and
 * observers are off.
 */
#ifndef GCA_ALLOC_HISTORY_H
#define GCA_ALLOC_HISTORY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gca/device.h"

/* PyTorch's trace-entry actions, in snapshot spelling. */
#define GCA_HISTORY_ACTION_MAP(X)     \
  X(ALLOC, "alloc")                   \
  X(FREE_REQUESTED, "free_requested") \
  X(FREE_COMPLETED, "free_completed") \
  X(SEGMENT_ALLOC, "segment_alloc")   \
  X(SEGMENT_FREE, "segment_free")     \
  X(SEGMENT_MAP, "segment_map")       \
  X(SEGMENT_UNMAP, "segment_unmap")   \
  X(SNAPSHOT, "snapshot")             \
  X(OOM, "oom")

typedef enum gca_history_action {
#define GCA__HA_ENUM(name, str) GCA_HA_##name,
  GCA_HISTORY_ACTION_MAP(GCA__HA_ENUM)
#undef GCA__HA_ENUM
      GCA_HA_COUNT
} gca_history_action_t;

#define GCA_HISTORY_MAX_FRAMES 16
/* The most entries a device's ring may hold (2^24: some 3 GiB of host memory
 * per device at ~176 bytes an entry); gca_record_history refuses more. */
#define GCA_HISTORY_MAX_ENTRIES ((size_t)1 << 24)

typedef struct gca_history_entry {
  gca_history_action_t action;
  int device;
  gca_devptr_t addr;
  uint64_t size;
  gca_stream_t stream;
  uint64_t time_ns; /* gca__now_ns() */
  int nframes;      /* 0 unless stacks were requested */
  void *frames[GCA_HISTORY_MAX_FRAMES];
} gca_history_entry_t;

/* ---- history.c ---- */

/* Which recorders are on (0: none); read once per event on the hot path. */
extern atomic_uint gca__history_recorders;
void gca__history_event_slow(gca_history_action_t action, int device, gca_devptr_t addr,
                             uint64_t size, gca_stream_t stream);

/* Records one event into the device's ring and, for ALLOC and FREE_REQUESTED
 * (the user-visible allocate/free), into the GCA_TRACE file. Thread-safe. */
static inline void gca__history_event(gca_history_action_t action, int device, gca_devptr_t addr,
                                      uint64_t size, gca_stream_t stream) {
  if (GCA_UNLIKELY(atomic_load_explicit(&gca__history_recorders, memory_order_relaxed) != 0))
    gca__history_event_slow(action, device, addr, size, stream);
}
/* Notes a failed allocation request ("allocate failure" in the trace). */
void gca__history_alloc_failure(int device, uint64_t size, gca_stream_t stream);
/* Backs gca_record_history(). GCA_ERR_INVALID_ARGUMENT when enabled with
 * max_entries 0 or above GCA_HISTORY_MAX_ENTRIES; GCA_ERR_OUT_OF_MEMORY when
 * the host cannot hold the rings, the previous history then kept as it was. */
gca_status_t gca__history_configure(bool enabled, size_t max_entries, bool stacks);
/* Tests: the allocation behind the rings (NULL: malloc). */
void gca__history_set_alloc(void *(*fn)(size_t));
/* Copies the device's ring (oldest first) into a malloc'd array. */
gca_status_t gca__history_copy(int device, gca_history_entry_t **entries, size_t *count);
const char *gca__history_action_name(gca_history_action_t action);
/* 1 + the highest device that has recorded an event since start (0 if none). */
int gca__history_device_count(void);
/* Opens the GCA_TRACE file if the variable is set (called once at allocator init). */
gca_status_t gca__trace_open_from_env(void);
/* Flushes and closes the trace (atexit and tests). */
void gca__trace_close(void);

#endif
