/* SPDX-License-Identifier: Apache-2.0 */
/* gca/pool.h - private memory pools: allocations routed away from a device's
 * default pools, kept apart for the lifetime of the pool, and the checkpoint
 * and restore of a pool's block layout (DESIGN.md "Note [Checkpoints]").
 *
 * A pool belongs to one device. While it is active for a stream (a filter
 * callback), for the calling thread (a use scope) or for a stream capture,
 * allocations on that device come from the pool's own segments instead of the
 * default pools; freed blocks return to the pool and are reused by it only.
 * A pool lives while its use count is positive (creation counts one,
 * gca_pool_retain adds one, gca_pool_release drops one); when the count
 * reaches zero the handle is dead at once, and the pool's memory goes back to
 * the driver as soon as every block allocated from it is freed. A dead handle
 * is never reused: any later call with it fails with GCA_ERR_INVALID_HANDLE.
 * This mirrors PyTorch's MemPool / beginAllocateToPool / releasePool.
 */
#ifndef GCA_POOL_H
#define GCA_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gca/device.h"
#include "gca/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gca_pool gca_pool_t;             /* opaque; never dereferenced by callers */
typedef struct gca_pool_state gca_pool_state_t; /* a saved block layout */

/* Note [Segment observers]: what a private pool's observer is told of the
 * physical memory under it, one physical allocation at a time: a classic
 * segment when it is created and before it is released; for expandable
 * segments each handle's range once mapped and before it is unmapped. A
 * CREATED or MAPPED event comes before any block of the range is handed out,
 * and a failure returned there fails that allocation (the memory is given
 * back, the status and detail are the observer's); RELEASING and UNMAPPING
 * come while the memory is still there, and what they return is only
 * logged. Callbacks may run with the device's allocator lock held: they must
 * not call into gca's allocator. A pool with an observer cannot be suspended
 * (its registered memory would go away under the observer). */
typedef enum gca_segment_event {
  GCA_SEGMENT_CREATED = 0,
  GCA_SEGMENT_RELEASING = 1,
  GCA_SEGMENT_MAPPED = 2,
  GCA_SEGMENT_UNMAPPING = 3,
} gca_segment_event_t;

typedef gca_status_t (*gca_segment_observer_fn)(gca_segment_event_t event, int device, void *base,
                                                size_t bytes, void *ctx);

typedef struct gca_pool_options {
  size_t size;     /* sizeof(gca_pool_options_t), so fields can be added later */
  bool use_on_oom; /* serve default-pool requests from this pool's free blocks on OOM */
  bool no_split;   /* never split a block: each allocation gets a block of its own */
  gca_segment_observer_fn segment_observer; /* NULL: none (Note [Segment observers]) */
  void *observer_ctx;
  /* called once with observer_ctx when the pool is gone with all its
   * memory (no event follows); NULL: nothing to do */
  void (*observer_done)(void *ctx);
} gca_pool_options_t;

#define GCA_POOL_OPTIONS_INIT \
  { sizeof(gca_pool_options_t), false, false, NULL, NULL, NULL }

/* Decides whether an allocation on `stream` goes to the pool. Called with the
 * device allocator's lock held: it must not call into gca. */
typedef bool (*gca_stream_filter_t)(gca_stream_t stream, void *ctx);

/* Creates a pool on `device` with use count 1. opts may be NULL (defaults). */
GCA_API gca_status_t gca_pool_create(int device, const gca_pool_options_t *opts, gca_pool_t **pool);
GCA_API gca_status_t gca_pool_retain(gca_pool_t *pool);
/* Drops one use; at zero the handle dies (see above). */
GCA_API gca_status_t gca_pool_release(gca_pool_t *pool);
GCA_API gca_status_t gca_pool_use_count(gca_pool_t *pool, int *count);
/* The pool's id as snapshots report it (segment_pool_id). */
GCA_API gca_status_t gca_pool_id(gca_pool_t *pool, uint64_t id[2]);
/* Bytes of the pool's segments, and of its allocated blocks. */
GCA_API gca_status_t gca_pool_memory(gca_pool_t *pool, size_t *reserved, size_t *allocated);

/* Routes allocations on streams the filter accepts to the pool until
 * gca_pool_end_allocate. The route holds one use of the pool. */
GCA_API gca_status_t gca_pool_begin_allocate(gca_pool_t *pool, gca_stream_filter_t filter,
                                             void *ctx);
/* Ends the filter routes of the pool (GCA_ERR_INVALID_STATE when none). */
GCA_API gca_status_t gca_pool_end_allocate(gca_pool_t *pool);
/* Routes the calling thread's allocations on the pool's device to the pool
 * (a use scope; scopes nest, innermost wins) until gca_pool_use_end. */
GCA_API gca_status_t gca_pool_use_begin(gca_pool_t *pool);
/* Ends the calling thread's innermost scope, which must be this pool's. */
GCA_API gca_status_t gca_pool_use_end(gca_pool_t *pool);

/* Routes the allocations of the capture under way on `stream` to the pool
 * (any stream that joined that capture included) until gca_pool_end_capture.
 * While any capture is under way on the device no stream event is queried,
 * and frees of blocks used on other streams wait for the capture's end. */
GCA_API gca_status_t gca_pool_begin_capture(gca_pool_t *pool, gca_stream_t stream);
GCA_API gca_status_t gca_pool_end_capture(gca_pool_t *pool, gca_stream_t stream);

/* ---- suspend and resume ---- */

#define GCA_POOL_SUSPEND_SAVE 0x1u /* keep the contents in host memory for the resume */

/* Releases the physical memory of the pool's segments while every address
 * stays reserved and every block keeps its state, so pointers and graphs
 * recorded against the pool stay valid. Needs expandable segments
 * (expandable_segments:True when the pool's memory was allocated): a classic
 * segment is GCA_ERR_NOT_SUPPORTED; a capture under way on the device is
 * GCA_ERR_INVALID_STATE; in both cases nothing changes. Waits for the
 * device's queued work. Allocations routed to a suspended pool fail with
 * GCA_ERR_INVALID_STATE. */
GCA_API gca_status_t gca_pool_suspend(gca_pool_t *pool, unsigned flags);
/* Maps fresh memory at the same addresses and, when the suspend saved them,
 * copies the contents back. On failure the pool stays suspended. */
GCA_API gca_status_t gca_pool_resume(gca_pool_t *pool);

/* ---- checkpoints (DESIGN.md "Note [Checkpoints]") ---- */

/* Pointers whose state a restore changed. Arrays are owned by the struct;
 * release them with gca_pool_changes_free. */
typedef struct gca_pool_changes {
  void **freed; /* live before the restore, free after */
  size_t nfreed;
  void **allocated; /* free before the restore, live after */
  size_t nallocated;
} gca_pool_changes_t;

/* Saves the pool's segments and blocks (exact offsets, sizes, live flags). */
GCA_API gca_status_t gca_pool_checkpoint(gca_pool_t *pool, gca_pool_state_t **state);
/* Makes the pool's layout equal to `state`: every block is freed, every saved
 * block re-created with its exact split, and those not live in the state are
 * free. Refused with nothing changed for a state of another pool, a state
 * whose segments the pool no longer has, or a pool with a capture under way.
 * With expandable segments, once the state is applied, every whole mapping
 * lying in space the checkpoint had unmapped (or in a segment made since) is
 * given back to the driver as gca_empty_cache would; a mapping partly mapped
 * at the checkpoint stays mapped, its other part free. This trim is best
 * effort: a failed unmap logs a warning and leaves that mapping mapped and
 * free (the next restore tries again), and the restore still returns GCA_OK
 * with its pointer sets; while a capture is under way on the device (of
 * another pool) the trim is skipped likewise.
 * changes may be NULL. */
GCA_API gca_status_t gca_pool_restore(gca_pool_t *pool, const gca_pool_state_t *state,
                                      gca_pool_changes_t *changes);
GCA_API void gca_pool_state_free(gca_pool_state_t *state);
GCA_API void gca_pool_changes_free(gca_pool_changes_t *changes);

#ifdef __cplusplus
}
#endif
#endif
