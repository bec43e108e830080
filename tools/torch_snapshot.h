/* SPDX-License-Identifier: Apache-2.0 */
/* torch_snapshot.h - a PyTorch memory snapshot pickle as one device's
 * allocation events (Note [Replaying a PyTorch snapshot]). */
#ifndef GCA_TOOLS_TORCH_SNAPSHOT_H
#define GCA_TOOLS_TORCH_SNAPSHOT_H

#include "pickle.h"
#include "rmm_csv.h"

typedef struct torch_events {
  gca_rmm_event_t *events; /* malloc'd; line = the trace entry's 1-based index (0: live before) */
  size_t n;
  size_t ndevices;         /* device traces in the snapshot */
  uint64_t torch_reserved; /* the device's segments' total_size: PyTorch's reserved bytes */
  size_t live_before;      /* blocks allocated first (live before the recording) */
  size_t untouched_live;   /* ... of them, active blocks the trace never touched */
  size_t skipped;          /* allocator-side entries (segment_*, snapshot, oom) */
} torch_events_t;

gca_status_t torch_snapshot_events(const py_value_t *root, const char *name, int device,
                                   torch_events_t *out);

#endif
