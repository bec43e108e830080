/* SPDX-License-Identifier: Apache-2.0 */
/* host_internal.h - the pinned host allocator's floors, top first:
 *   host.c         the caching host allocator (gca/host.h): deferred frees,
 *                  thread caches and their sections, statistics, empty_cache
 *   host_blocks.c  the table of live blocks and their stream uses
 *   host_extent.c  the jemalloc arena whose extents are pinned (extent hooks)
 *   host_je.c      jemalloc loaded at run time (Note [Loading jemalloc])
 */
#ifndef GCA_HOST_INTERNAL_H
#define GCA_HOST_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "json.h"
#include "gca/device.h"

/* ---- host_je.c ---- */

/* jemalloc's entry points (its non-standard API, unprefixed as Debian builds it). */
typedef struct gca__je {
  void *(*mallocx)(size_t size, int flags);
  void (*dallocx)(void *ptr, int flags);
  void (*sdallocx)(void *ptr, size_t size, int flags);
  size_t (*nallocx)(size_t size, int flags);
  size_t (*sallocx)(const void *ptr, int flags);
  int (*mallctl)(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
} gca__je_t;

/* Loads jemalloc once; the table, or NULL with GCA_ERR_NOT_SUPPORTED set
 * (detail prefixed with `fn`) saying what is missing and how to provide it. */
const gca__je_t *gca__je_get(const char *fn);

/* ---- host_blocks.c ---- */

/* Defers the free of a block used by streams; called under the block's lock. */
typedef gca_status_t (*gca__host_park_fn)(void *ctx, void *ptr, size_t size,
                                          const gca_stream_t *uses, uint32_t nuses);
typedef void (*gca__host_block_fn)(void *ctx, const void *ptr, size_t size, uint32_t nuses);

/* Adds a live block; false when the table cannot grow (no host memory). */
bool gca__host_blocks_insert(void *ptr, size_t size);
/* Takes a live block out of the table: GCA_ERR_INVALID_POINTER naming fn and
 * ptr when it is not one. A block with stream uses is first handed to park,
 * whose failure leaves it live. *size: its size; *parked: whether park took it. */
gca_status_t gca__host_blocks_remove(const char *fn, void *ptr, gca__host_park_fn park, void *ctx,
                                     size_t *size, bool *parked);
/* Adds stream to a live block's uses (GCA_ERR_INVALID_POINTER if not live). */
gca_status_t gca__host_blocks_record(const char *fn, void *ptr, gca_stream_t stream);
/* fn for every live block, each under its shard's lock (fn must not call back). */
void gca__host_blocks_walk(gca__host_block_fn fn, void *ctx);

/* ---- host_extent.c ---- */

/* Counters of the extent hooks (Note [Pinned extents]). */
typedef struct gca__host_extent_stats {
  int64_t hook_alloc, hook_dalloc, hook_destroy, hook_decommit, hook_split, hook_merge;
  int64_t segments, segments_peak, segments_allocated, segments_freed;
  int64_t reserved_bytes, reserved_bytes_peak, reserved_bytes_allocated, reserved_bytes_freed;
  int64_t num_host_alloc, num_host_free;
  int64_t alloc_us_total, alloc_us_max, free_us_total, free_us_max;
} gca__host_extent_stats_t;

/* Creates a jemalloc arena whose extents are pinned by the device layer:
 * host_alloc, or mmap + host_register when `use_register` (pages touched by
 * `register_threads` threads first). Never-decaying dirty pages: the arena is
 * the cache. */
gca_status_t gca__host_arena_create(const gca__je_t *je, bool use_register,
                                    unsigned register_threads, unsigned *arena);
/* arena.<i>.destroy: every extent goes back to the device layer. */
gca_status_t gca__host_arena_destroy(const gca__je_t *je, unsigned arena);
/* arena.<i>.purge: extents jemalloc no longer uses go back where they can. */
gca_status_t gca__host_arena_purge(const gca__je_t *je, unsigned arena);
/* Retries giving back extents whose unpinning failed before (orphans). */
void gca__host_extent_retry_orphans(void);
/* The detail of the last device failure inside a hook on this thread ("" if none),
 * cleared by the call. */
void gca__host_extent_take_error(char *buf, size_t len);
void gca__host_extent_stats(gca__host_extent_stats_t *out);
void gca__host_extent_reset_peaks(void);
/* Whether [p, p+len) lies in one pinned extent of the arena. */
bool gca__host_extent_contains(const void *p, size_t len);

/* host.c (host_none.c without jemalloc): the live and pending pinned blocks
 * as a JSON array, for gca_snapshot_json's "host_blocks"; empty while the
 * host allocator was never used (the snapshot does not start it). */
void gca__host_snapshot_write(gca_json_writer_t *w);

#endif
