/* SPDX-License-Identifier: Apache-2.0 */
/* gca/allocator.h - the stream-ordered caching allocator.
 *
 * Behaviour follows PyTorch's CUDA caching allocator (configuration keys,
 * statistics names, snapshot fields); see DESIGN.md "The allocator". Each
 * device has its own allocator, created on first use. gca_malloc() uses the
 * calling thread's current device (gca_set_device, default 0).
 */
#ifndef GCA_ALLOCATOR_H
#define GCA_ALLOCATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gca/device.h"
#include "gca/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates `size` bytes usable on `stream` (stream-ordered: the block may be
 * reused by later work on the same stream as soon as it is freed). size 0
 * yields *ptr == NULL and GCA_OK, as cudaMalloc does. */
GCA_API gca_status_t gca_malloc(void **ptr, size_t size, gca_stream_t stream);
GCA_API gca_status_t gca_malloc_device(int device, void **ptr, size_t size, gca_stream_t stream);
/* Frees a pointer returned by gca_malloc*. Double free, foreign or interior
 * pointers are GCA_ERR_INVALID_POINTER naming the pointer; state is unchanged. */
GCA_API gca_status_t gca_free(void *ptr);
/* Marks `ptr` as used on `stream` too: on free, the block becomes reusable only
 * after the work queued on `stream` before the free has completed. `stream` may
 * belong to another device (the event is recorded there); NULL is the legacy
 * stream of the calling thread's current device at the time of this call. */
GCA_API gca_status_t gca_record_stream(void *ptr, gca_stream_t stream);
/* Size of the block behind a live pointer (the rounded size) and its device. */
GCA_API gca_status_t gca_pointer_info(const void *ptr, size_t *block_size, int *device);

GCA_API gca_status_t gca_set_device(int device);
GCA_API gca_status_t gca_get_device(int *device);

/* Releases every cached, unused segment of every device to the driver. */
GCA_API gca_status_t gca_empty_cache(void);
/* Caps the device's reserved memory at fraction * total (0 < fraction <= 1). */
GCA_API gca_status_t gca_set_memory_fraction(int device, double fraction);
/* Caps the device's reserved memory at `bytes` (0 removes the cap). */
GCA_API gca_status_t gca_set_memory_limit(int device, uint64_t bytes);
/* Gives device `peer` read-write access to `device`'s memory: its classic
 * allocations (peer access from peer's context, already enabled counting as
 * done) and its expandable segments, every range mapped now and every one
 * mapped later (expandable_segments).
 * GCA_ERR_NOT_SUPPORTED when the driver says peer cannot access device. */
GCA_API gca_status_t gca_enable_peer_access(int device, int peer);

/* Applies a configuration string with GCA_ALLOC_CONF's syntax
 * ("max_split_size_mb:256,garbage_collection_threshold:0.8"). On error nothing
 * changes and the detail quotes the offending text. */
GCA_API gca_status_t gca_set_config(const char *conf);
/* Writes the settings in force as a configuration string. */
GCA_API gca_status_t gca_get_config(char *buf, size_t len);
/* Disables (false) or re-enables caching: with caching off every free returns
 * the memory to the driver (GCA_NO_CACHING=1 at start). */
GCA_API gca_status_t gca_set_caching(bool enabled);

/* Validates every pool, segment and block of every device against the
 * allocator's invariants (the walker debug builds run after each change);
 * GCA_ERR_INTERNAL with the first broken invariant in the detail. It takes
 * each device's lock in turn, so it may run while other threads allocate. */
GCA_API gca_status_t gca_allocator_check(void);

/* ---- statistics (PyTorch's names and shape) ---- */

typedef struct gca_stat {
  int64_t current;
  int64_t peak;
  int64_t allocated;
  int64_t freed;
} gca_stat_t;

/* Index into the per-pool arrays: all, small pool, large pool. */
enum { GCA_STAT_ALL = 0, GCA_STAT_SMALL = 1, GCA_STAT_LARGE = 2, GCA_STAT_TYPES = 3 };

typedef struct gca_stats {
  gca_stat_t allocation[GCA_STAT_TYPES];
  gca_stat_t segment[GCA_STAT_TYPES];
  gca_stat_t active[GCA_STAT_TYPES];
  gca_stat_t inactive_split[GCA_STAT_TYPES];
  gca_stat_t allocated_bytes[GCA_STAT_TYPES];
  gca_stat_t reserved_bytes[GCA_STAT_TYPES];
  gca_stat_t active_bytes[GCA_STAT_TYPES];
  gca_stat_t inactive_split_bytes[GCA_STAT_TYPES];
  gca_stat_t requested_bytes[GCA_STAT_TYPES];
  int64_t num_alloc_retries;
  int64_t num_ooms;
  int64_t num_sync_all_streams;
  int64_t num_device_alloc;
  int64_t num_device_free;
  gca_stat_t oversize_allocations;
  gca_stat_t oversize_segments;
  int64_t max_split_size;
  /* The cost of growth: the driver calls made for device memory (mem_alloc,
   * mem_free; for expandable segments mem_create, mem_map, mem_set_access,
   * mem_unmap, mem_release), the bytes those calls made usable (new segments,
   * new or moved mappings), and the physical handles moved from a free range
   * to where a request needed them (Note [Expandable segments]). */
  int64_t num_driver_calls;
  int64_t grown_bytes;
  int64_t num_handle_moves;
  /* Address space held by ranges that moves lent (Note [Lent granules]):
   * their handles already serve a new place, their old mapping stays until
   * the stream's queued work has passed it; and the waits for a stream that
   * a growth made because they held the hole it needed (Note [Lent address
   * space]). */
  gca_stat_t lent_bytes;
  int64_t num_lent_waits;
  /* The cost of the lock-free paths, each a membarrier system call or a
   * thread cache given back: the device lock's bias taken back from the
   * thread that kept it (Note [Biased device lock]), visits to thread caches
   * whose owners ran without their locks (Note [Thread cache sections]), and
   * thread caches parked for wasting their blocks (Note [Thread cache waste]). */
  int64_t num_lock_revocations;
  int64_t num_cache_fences;
  int64_t num_cache_parks;
} gca_stats_t;

GCA_API gca_status_t gca_get_stats(int device, gca_stats_t *out);
GCA_API gca_status_t gca_reset_peak_stats(int device);
GCA_API gca_status_t gca_reset_accumulated_stats(int device);
/* The device's cached free memory: the bytes of every inactive block in its
 * segments and the largest such block (external fragmentation is
 * 1 - largest / free). Walks every segment under the device's lock: for tools
 * and reports, not for the hot path. Zeros for a device with no allocator yet. */
GCA_API gca_status_t gca_get_free_blocks(int device, uint64_t *free_bytes, uint64_t *largest_free);

/* ---- history and snapshots ---- */

/* Starts (enabled) or stops recording allocator events into a ring of
 * `max_entries` per device; with `stacks`, native frames are kept per event.
 * max_entries is 1 to 2^24 (16777216), else GCA_ERR_INVALID_ARGUMENT; when the
 * host cannot hold the rings, GCA_ERR_OUT_OF_MEMORY and the previous history
 * and settings are kept. */
GCA_API gca_status_t gca_record_history(bool enabled, size_t max_entries, bool stacks);
/* A JSON snapshot with PyTorch's fields (segments, device_traces,
 * allocator_settings). *json is malloc'd; release it with gca_string_free. */
GCA_API gca_status_t gca_snapshot_json(char **json, size_t *len);
/* The same snapshot as a Python pickle (protocol 4) of plain data with
 * PyTorch's fields, as torch.cuda.memory._dump_snapshot writes one: PyTorch's
 * memory viewer opens it. *pickle is malloc'd; release it with gca_string_free. */
GCA_API gca_status_t gca_snapshot_pickle(char **pickle, size_t *len);
/* A snapshot JSON document (len bytes) converted to that pickle. */
GCA_API gca_status_t gca_snapshot_json_to_pickle(const char *json, size_t len, char **pickle,
                                                 size_t *pickle_len);
GCA_API void gca_string_free(char *s);

/* ---- out of memory ---- */

/* Called, without allocator locks held, before an allocation fails with
 * GCA_ERR_OUT_OF_MEMORY. */
typedef void (*gca_oom_observer_t)(int device, size_t requested, size_t device_allocated,
                                   size_t device_free, void *ctx);
GCA_API gca_status_t gca_register_oom_observer(gca_oom_observer_t fn, void *ctx);

/* ---- trace observers ----
 *
 * In the spirit of PyTorch's attach_allocator_trace_tracker: an observer is
 * called for every event the allocator's history records, whether or not
 * history is recorded. The callback runs on the thread that caused the event,
 * with that device's allocator lock held: it must be short and must not call
 * back into the allocator (gca_trace_observer_add/remove from inside one is
 * refused with GCA_ERR_INVALID_STATE). With no observer attached the
 * allocator pays one relaxed atomic load per event. */

typedef enum gca_trace_action {
  GCA_TRACE_ALLOC = 0,          /* a block was handed out: address, requested size */
  GCA_TRACE_FREE_REQUESTED = 1, /* gca_free of a block: address, requested size */
  GCA_TRACE_FREE_COMPLETED = 2, /* the block became reusable (its streams passed the free) */
  GCA_TRACE_SEGMENT_ALLOC = 3,  /* a segment was obtained from the driver: base, size */
  GCA_TRACE_SEGMENT_FREE = 4,   /* a segment was returned to the driver: base, size */
  GCA_TRACE_SEGMENT_MAP = 5,    /* expandable segment: a range was mapped: address, size */
  GCA_TRACE_SEGMENT_UNMAP = 6,  /* expandable segment: a range was unmapped: address, size */
  GCA_TRACE_OOM = 7,            /* an allocation is failing: address = the device's free
                                   bytes, size = the bytes asked of the device */
} gca_trace_action_t;

typedef struct gca_trace_event {
  gca_trace_action_t action;
  int device;
  uint64_t address;
  uint64_t size;
  gca_stream_t stream;
  uint64_t reserved_bytes;  /* the device's reserved bytes after the event */
  uint64_t allocated_bytes; /* the device's allocated bytes after the event */
} gca_trace_event_t;

typedef void (*gca_trace_observer_fn)(const gca_trace_event_t *event, void *ctx);
/* Identifies an attached observer; never 0, never reused within a process. */
typedef uint64_t gca_trace_observer_handle_t;

/* Attaches `fn` (called with `ctx`); *handle identifies it for removal. The
 * same fn and ctx may be attached twice (two observers). GCA_ERR_INVALID_STATE
 * when all GCA_TRACE_OBSERVERS_MAX slots are taken. */
#define GCA_TRACE_OBSERVERS_MAX 16
GCA_API gca_status_t gca_trace_observer_add(gca_trace_observer_fn fn, void *ctx,
                                            gca_trace_observer_handle_t *handle);
/* Detaches an observer. When it returns, no call of it is running and none
 * will start. GCA_ERR_INVALID_HANDLE for a handle that is not attached. */
GCA_API gca_status_t gca_trace_observer_remove(gca_trace_observer_handle_t handle);

/* ---- PyTorch pluggable allocator entry points ----
 * torch.cuda.memory.CUDAPluggableAllocator("libgca.so", "gca_torch_malloc", "gca_torch_free")
 * gca_stream_t is cudaStream_t. Failures return NULL / log the detail. */
GCA_API void *gca_torch_malloc(ssize_t size, int device, gca_stream_t stream);
GCA_API void gca_torch_free(void *ptr, ssize_t size, int device, gca_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
