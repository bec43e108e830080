/* SPDX-License-Identifier: Apache-2.0 */
/* host_internal.h - the pinned host allocator's floors, top first:
 *   host.c         the caching host allocator (gca/host.h): thread caches
 *                  (front caches, sections), deferred frees, statistics,
 *                  empty_cache
 *   host_blocks.c  the block records, their stream uses, and the table from
 *                  a block's address to its record
 *   host_extent.c  the jemalloc arena whose extents are pinned (extent hooks)
 *   host_je.c      jemalloc loaded at run time (Note [Loading jemalloc])
 */
#ifndef GCA_HOST_INTERNAL_H
#define GCA_HOST_INTERNAL_H

#include <stdatomic.h>
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

/* Note [Host block records] for the states and who may change them. */
enum {
  GCA__HREC_SPARE,  /* on the spare list: no block */
  GCA__HREC_LIVE,   /* handed out by gca_host_alloc */
  GCA__HREC_BUSY,   /* claimed from LIVE by a free or a record_stream */
  GCA__HREC_CACHED, /* freed into a thread's front cache (Note [Host front cache]) */
};

#define GCA__HOST_NOBIN UINT32_MAX

/* A block gca_host_alloc handed out and jemalloc has not had back since: live,
 * claimed or cached. Records are never freed (a stale pointer to one is safe
 * to read); a record's block changes only while it is spare. size and nuses
 * are atomics for the snapshot, which reads live records without claiming.
 * A cache line each: blocks of different threads share none. */
typedef struct gca__host_rec {
  _Alignas(64) _Atomic uintptr_t ptr; /* the block; 0 while spare */
  _Atomic uint32_t state;             /* GCA__HREC_* */
  uint32_t bin;                       /* front cache bin, or GCA__HOST_NOBIN */
  size_t jsize;                       /* the size jemalloc was asked for (sdallocx's) */
  _Atomic size_t size;                /* the size requested, while live */
  struct gca__host_rec *next;         /* in a front cache bin, or the spare list */
  _Atomic uint32_t nuses;             /* distinct streams recorded while live */
  uint32_t capuses;
  gca_stream_t *uses; /* NULL until the first record_stream */
} gca__host_rec_t;

/* The free's claim of r for ptr (LIVE -> BUSY) with a load and a store, no
 * read-modify-write (Note [Host block records]): false when r is not live or
 * (a stale pointer to a recycled record) is another block's now. */
static inline bool gca__host_rec_take(gca__host_rec_t *r, const void *ptr) {
  if (atomic_load_explicit(&r->state, memory_order_acquire) != GCA__HREC_LIVE ||
      atomic_load_explicit(&r->ptr, memory_order_relaxed) != (uintptr_t)ptr)
    return false;
  atomic_store_explicit(&r->state, GCA__HREC_BUSY, memory_order_relaxed);
  return true;
}

/* Ends a claim that leaves the block live (BUSY -> LIVE). */
static inline void gca__host_rec_unclaim(gca__host_rec_t *r) {
  atomic_store_explicit(&r->state, GCA__HREC_LIVE, memory_order_release);
}

typedef void (*gca__host_block_fn)(void *ctx, const void *ptr, size_t size, uint32_t nuses);

/* A live record for a block jemalloc just handed out, in the table; NULL when
 * no host memory is left to track it. */
gca__host_rec_t *gca__host_rec_add(void *ptr, size_t jsize, uint32_t bin, size_t size);
/* The record of the block at ptr, live, claimed or cached; NULL if none. */
gca__host_rec_t *gca__host_rec_find(const void *ptr);
/* Claims the live block at ptr with a compare-and-swap, waiting out
 * another claim; through `hint` when it is ptr's record, else the table.
 * GCA_ERR_INVALID_POINTER naming fn and ptr when it is not live. */
gca_status_t gca__host_rec_claim(const char *fn, void *ptr, gca__host_rec_t *hint,
                                 gca__host_rec_t **out);
/* Takes a claimed or cached record off the table before its block goes back
 * to jemalloc; the record becomes spare. */
void gca__host_rec_drop(gca__host_rec_t *r);
/* Adds stream to a claimed record's uses (GCA_ERR_OUT_OF_MEMORY naming fn). */
gca_status_t gca__host_rec_add_use(const char *fn, gca__host_rec_t *r, gca_stream_t stream);
/* fn for every live or claimed block, read as it is (sizes and stream
 * counts of blocks changing meanwhile may be either). fn must not call back. */
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
