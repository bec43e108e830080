/* SPDX-License-Identifier: Apache-2.0 */
/* expandable.h - the allocator's virtual-memory floor: the driver steps of
 * mapped segments (vmm.c), expandable segments and their handle moves
 * (expandable.c), and the move horizons that say which free ranges queued
 * work no longer uses (horizon.c). Internal to the allocator. */
#ifndef GCA_EXPANDABLE_H
#define GCA_EXPANDABLE_H

#include "alloc_core.h"

/* ---- vmm.c ---- */

/* Counts n driver calls in d's statistics; atomically, as release batches
 * make theirs with no lock held. */
static inline void gca__count_calls(gca__devalloc_t *d, int64_t n) {
  __atomic_fetch_add(&d->stats.num_driver_calls, n, __ATOMIC_RELAXED);
}

/* The device's allocation granularity, queried once (mem_granularity) and
 * checked: a power of two and a multiple of GCA__MIN_BLOCK_SIZE, else
 * GCA_ERR_DRIVER (nothing cached then). */
gca_status_t gca__vmm_granularity(gca__devalloc_t *d, size_t *out);
/* The devices that get access to new mappings: d's own, then its peers;
 * devs holds GCA__MAX_DEVICES + 1. Returns their count. */
int gca__vmm_access_list(const gca__devalloc_t *d, int *devs);
/* Creates a handle of len bytes, maps it at ptr (reserved) and opens it to the
 * access list; on failure nothing stays created or mapped. */
gca_status_t gca__vmm_map_new(gca__devalloc_t *d, gca_devptr_t ptr, size_t len,
                              gca_memhandle_t *out);
/* Unmaps [ptr, + len) and releases its handle h. *unmapped says whether the
 * unmap happened (a failed unmap changes nothing; a failed release leaves the
 * range unmapped and the handle lost; the status says which failed). */
/* The steps of gca__vmm_map_new, for mappings made one handle at a time and
 * opened together (expandable segments): mem_map of existing handle h whole
 * at ptr; mem_create + mem_map (the handle released again on failure); one
 * mem_set_access over a range of mappings (counted in stats.grown_bytes). */
gca_status_t gca__vmm_map_only(gca__devalloc_t *d, gca_devptr_t ptr, size_t len, gca_memhandle_t h);
gca_status_t gca__vmm_create_map(gca__devalloc_t *d, gca_devptr_t ptr, size_t len,
                                 gca_memhandle_t *out);
gca_status_t gca__vmm_set_access(gca__devalloc_t *d, gca_devptr_t ptr, size_t len);
/* Unmaps [ptr, +len) and keeps its handle (to be mapped elsewhere). */
gca_status_t gca__vmm_unmap_keep(gca__devalloc_t *d, gca_devptr_t ptr, size_t len);
/* Releases handle h, logging a failure. */
void gca__vmm_release_handle(gca__devalloc_t *d, gca_memhandle_t h);
gca_status_t gca__vmm_unmap(gca__devalloc_t *d, gca_devptr_t ptr, size_t len, gca_memhandle_t h,
                            bool *unmapped);
/* Unmaps and releases every mapping and frees the reservation, whatever
 * fails (teardown; failures are logged). */
void gca__vmm_destroy(gca__devalloc_t *d, gca_devptr_t base, size_t reserved,
                      const gca__mapping_t *maps, size_t nmaps);

/* ---- expandable.c ---- */

/* Serves `rounded` bytes from the expandable segment of (pool, stream),
 * creating it on first use: a free block followed by unmapped space (or an
 * unmapped hole) is mapped just enough, growing by at least `step` bytes
 * where room allows. Returns the block free and outside the tree.
 * GCA_ERR_OUT_OF_MEMORY when the limit or the driver refuses; every driver
 * failure is undone and names its operation. */
gca_status_t gca__expand_alloc(gca__devalloc_t *d, gca__pool_t *pool, gca_stream_t stream,
                               size_t rounded, size_t step, gca__block_t **out);
/* Handle moves (Note [Expandable segments]): when serving `rounded` bytes from (pool, stream)'s
 * expandable segment would map new memory while free ranges in it or the device's other segments
 * hold whole mappings, takes them into bt (up to what the growth lacks), their handles parked
 * when bt runs; nothing during a capture. `oom`: out of memory (moves whatever expandable_moves
 * says). *held, nothing taken: held frees may be donors (flush them, call again). */
gca_status_t gca__expand_take_donors(gca__devalloc_t *d, gca__relbatch_t *bt, gca__pool_t *pool,
                                     gca_stream_t stream, size_t rounded, bool oom, bool *held);
/* After bt ran: moves handles parked in the pool's other segments to (pool, stream)'s;
 * after the growth: releases what the pool's segments parked and did not map. */
void gca__expand_gather(gca__pool_t *pool, gca_stream_t stream);
void gca__expand_unpark(gca__devalloc_t *d, gca__pool_t *pool);
/* The expandable segment of (pool, stream) when it has no hole for `rounded`
 * but would have one once its lent ranges are unmapped (Note [Lent address
 * space], release.c); else NULL. */
gca__segment_t *gca__expand_lent_in_way(gca__pool_t *pool, gca_stream_t stream, size_t rounded);
/* Release batches: seg's free blocks holding a whole mapping, releasing, into bt. */
gca_status_t gca__expand_take(gca__devalloc_t *d, gca__relbatch_t *bt, gca__segment_t *seg);
/* The same within [lo, hi) (offsets into seg): each entry covers its block's
 * part inside the range, and the segment is kept even when nothing stays
 * mapped (a checkpoint's trim). */
gca_status_t gca__expand_take_range(gca__devalloc_t *d, gca__relbatch_t *bt, gca__segment_t *seg,
                                    size_t lo, size_t hi);
/* Unmaps, without waiting (the stream was synchronized, or no queued work
 * uses the range), the mappings inside [lo, hi) of seg that lie wholly
 * inside a free block; `lend`: leaves them mapped in the driver as lent
 * ranges instead, stamped `stamp` (Note [Lent granules]). Removes the segment when nothing
 * stays mapped, nothing is lent and `remove`. */
gca_status_t gca__expand_release_synced(gca__devalloc_t *d, gca__segment_t *seg, size_t lo,
                                        size_t hi, size_t *released, bool remove, bool lend,
                                        uint64_t stamp);
/* Unmaps, releases and unreserves everything of an expandable segment regardless
 * of its blocks (allocator reset); the caller frees the record itself. */
void gca__expand_destroy(gca__devalloc_t *d, gca__segment_t *seg);
/* Gives `peer` access to every mapping of d's expandable segments and to
 * every later one. The caller holds d->lock. */
gca_status_t gca__expand_add_peer(gca__devalloc_t *d, int peer);
/* Checks a segment's expandable invariants (mappings vs blocks). */
gca_status_t gca__expand_check(const gca__devalloc_t *d, const gca__segment_t *seg);

/* ---- horizon.c (Note [Move horizons]) ---- */

typedef struct gca__horizons gca__horizons_t;
/* The stamp below which seg's free blocks are no longer used by work queued
 * on its stream (0: none known): polls seg's horizons and, while a block
 * stamped `need` is not covered, asks whether the stream is idle or records
 * a horizon. Never waits; nothing while a capture runs. */
uint64_t gca__hz_covered(gca__devalloc_t *d, gca__segment_t *seg, uint64_t need);
/* Whether seg's granules may be lent (Note [Lent granules]): its stream is
 * reachable from here for horizons. */
bool gca__hz_lendable(const gca__segment_t *seg);
/* Room for `more` lent ranges of seg (host memory). */
gca_status_t gca__hz_alias_room(gca__segment_t *seg, size_t more);
/* Records lent block r of seg, freed at `stamp` (room made). */
void gca__hz_alias_add(gca__segment_t *seg, gca__block_t *r, uint64_t stamp);
/* How many lent ranges seg has. */
size_t gca__hz_aliases(const gca__segment_t *seg);
/* Unmaps seg's lent ranges that no queued work uses any more: `waited` (not
 * 0) says a wait for the stream covered stamps below it; else polls. */
void gca__hz_retire(gca__devalloc_t *d, gca__segment_t *seg, uint64_t waited);
/* Unmaps seg's lent ranges and destroys its horizon events (segment
 * removal, teardown). */
void gca__hz_destroy(gca__devalloc_t *d, gca__segment_t *seg);
/* Whether b is a lent range: unmapped for the allocator, still mapped in the
 * driver (Note [Lent granules]). */
static inline bool gca__block_lent(const gca__block_t *b) {
  return b->unmapped && b->releasing;
}
/* A lent range r whose driver mapping is gone: an unmapped block like any
 * other, merged with its unmapped neighbours (expandable.c). */
void gca__expand_unlend(gca__devalloc_t *d, gca__block_t *r);
/* The mapped bytes of expandable segment seg wholly inside [lo, hi) (offsets
 * into seg): what a release of that range could give back. */
size_t gca__expand_mapped_inside(const gca__segment_t *seg, size_t lo, size_t hi);

#endif
