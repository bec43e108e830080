/* SPDX-License-Identifier: Apache-2.0 */
/* introspect.h - a read-only walk over an allocator's segments and blocks, the
 * one view that snapshots, the invariant walker's tests and tools share; and
 * whether an address lies in memory gca holds at all (device segments, the
 * pinned host arena), which the preload shim asks before it hands a free gca
 * refused to the CUDA library.
 *
 * gca__allocator_walk() holds the device allocator's lock while it calls `fn`
 * once per segment, in address order, with the segment's blocks in address
 * order; `fn` must not call back into the allocator.
 */
#ifndef GCA_ALLOC_INTROSPECT_H
#define GCA_ALLOC_INTROSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gca/device.h"

typedef enum gca_block_state {
  GCA_BLOCK_ACTIVE_ALLOCATED = 0,    /* "active_allocated" */
  GCA_BLOCK_ACTIVE_PENDING_FREE = 1, /* "active_pending_free": freed, waiting on stream events */
  GCA_BLOCK_INACTIVE = 2,            /* "inactive": cached, free */
} gca_block_state_t;

typedef struct gca_block_info {
  gca_devptr_t address;
  size_t size;
  size_t requested_size; /* 0 when inactive */
  gca_block_state_t state;
} gca_block_info_t;

typedef struct gca_segment_info {
  int device;
  gca_devptr_t address;
  size_t total_size;     /* mapped/reserved bytes of the segment */
  size_t allocated_size; /* sum of active_allocated block sizes */
  size_t active_size;    /* allocated + pending free */
  size_t requested_size;
  gca_stream_t stream;
  bool is_large; /* segment_type "large" / "small" */
  bool is_expandable;
  uint64_t pool_id[2]; /* segment_pool_id; {0,0} for the default pools */
} gca_segment_info_t;

typedef void (*gca_walk_fn)(const gca_segment_info_t *seg, const gca_block_info_t *blocks,
                            size_t nblocks, void *ctx);

/* ---- check.c ---- */

/* Walks the device's allocator; GCA_OK without calls when it has none yet. */
gca_status_t gca__allocator_walk(int device, gca_walk_fn fn, void *ctx);
/* Validates every pool, segment and block of every device; on failure returns
 * GCA_ERR_INTERNAL with the first broken invariant in the detail. */
gca_status_t gca__allocator_check(void);

/* ---- uses.c ---- */

/* Whether addr lies in a segment of any device's allocator: live, cached or
 * free memory of any pool, a classic segment's range or an expandable one's
 * whole reservation; *device (when not NULL) is its device. Takes each
 * device's lock in turn and walks its segments: for error paths (a free gca
 * refused), not for every call. */
bool gca__allocator_owns(gca_devptr_t addr, int *device);

/* ---- host_extent.c (host_none.c without jemalloc) ---- */

/* Whether ptr lies in an extent of the pinned host allocator's arena (a live
 * block, a cached one or free memory); false while it holds none. */
bool gca__host_owns(const void *ptr);

/* ---- allocator.c ---- */

/* Number of devices that have an allocator (walk 0..n-1). */
int gca__allocator_device_count(void);
/* Copies the process-wide allocator settings in force. */
struct gca_alloc_config;
void gca__allocator_get_config(struct gca_alloc_config *out);
/* Tests: frees every allocator (all memory back to the driver, live blocks
 * included) and forgets the configuration, as if the process had just started. */
void gca__allocator_reset(void);

#endif
