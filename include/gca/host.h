/* SPDX-License-Identifier: Apache-2.0 */
/* gca/host.h - pinned host memory: a caching host allocator.
 *
 * Behaviour follows PyTorch's CachingHostAllocator: blocks of page-locked
 * host memory for fast, truly asynchronous copies; a block used by work on a
 * stream (gca_host_record_stream) is reused only after an event recorded on
 * that stream when the block was freed has completed. The memory comes from a
 * dedicated jemalloc arena whose extents are pinned (cuMemHostAlloc, or mmap +
 * cuMemHostRegister with pinned_use_cuda_host_register:True), so size classes
 * and per-thread caches are jemalloc's. The settings are read from
 * GCA_ALLOC_CONF (else PYTORCH_CUDA_ALLOC_CONF): pinned_use_cuda_host_register,
 * pinned_num_register_threads. jemalloc (libjemalloc.so.2, or the library
 * GCA_JEMALLOC_LIBRARY names) is loaded at run time; without it every call
 * fails with GCA_ERR_NOT_SUPPORTED saying why.
 */
#ifndef GCA_HOST_H
#define GCA_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "gca/allocator.h"
#include "gca/device.h"
#include "gca/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates `size` bytes of pinned host memory. size 0 yields *ptr == NULL
 * and GCA_OK (PyTorch's empty allocation). */
GCA_API gca_status_t gca_host_alloc(void **ptr, size_t size);
/* Frees a block gca_host_alloc returned (NULL: nothing). A block recorded on
 * streams is reused once the events recorded on them now have completed.
 * Foreign pointers (device memory, malloc's) and double frees are
 * GCA_ERR_INVALID_POINTER naming the pointer; nothing changes. */
GCA_API gca_status_t gca_host_free(void *ptr);
/* Marks the live block at `ptr` as used by work on `stream`. */
GCA_API gca_status_t gca_host_record_stream(void *ptr, gca_stream_t stream);
/* Completes deferred frees whose events have completed, returns the cached
 * blocks of every thread cache to the arena and gives pinned extents back to
 * the driver: all of them when no block is live (Note [Emptying the pinned
 * arena]). */
GCA_API gca_status_t gca_host_empty_cache(void);

/* Page-locks [ptr, ptr+size) of memory the caller owns (cudaHostRegister,
 * portable) / undoes it (ptr: the registered base). Pinned memory is copied
 * truly asynchronously; GCA_ERR_INVALID_STATE when part of it is pinned
 * already. These need no jemalloc. */
GCA_API gca_status_t gca_host_register(void *ptr, size_t size);
GCA_API gca_status_t gca_host_unregister(void *ptr);

/* PyTorch's HostStats (at::HostStats): counts and bytes as gca_stat_t,
 * driver call durations in microseconds. */
typedef struct gca_host_duration_stat {
  int64_t total;
  int64_t max;
  int64_t count;
} gca_host_duration_stat_t;

typedef struct gca_host_stats {
  gca_stat_t allocation;      /* blocks handed out (current: live or waiting for events) */
  gca_stat_t allocated_bytes; /* bytes of those blocks as requested */
  gca_stat_t segment;         /* pinned extents held */
  gca_stat_t reserved_bytes;  /* bytes of those extents */
  int64_t num_host_alloc;     /* cuMemHostAlloc / cuMemHostRegister calls */
  int64_t num_host_free;      /* cuMemFreeHost / cuMemHostUnregister calls */
  gca_host_duration_stat_t host_alloc_time;
  gca_host_duration_stat_t host_free_time;
  int64_t pending_frees; /* gca's own: freed blocks waiting for their events */
} gca_host_stats_t;

GCA_API gca_status_t gca_host_get_stats(gca_host_stats_t *stats);
/* Resets peaks to current values and the accumulated counts. */
GCA_API void gca_host_reset_peak_stats(void);
/* The live and pending blocks as JSON, in the shape of the snapshot's blocks:
 * [{"address":N,"size":N,"state":"active_allocated"|"active_pending_free",
 *   "streams":N},...] (streams: recorded uses, or events still pending).
 * *json is malloc'd; release it with gca_string_free. */
GCA_API gca_status_t gca_host_snapshot_json(char **json);

#ifdef __cplusplus
}
#endif

#endif
